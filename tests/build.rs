//! Copies the section "Writing tables out: upserts" of docs/getting-started.md for this
//! package's doc tests. Its snippets need weir-postgres and weir-kafka, which the examples
//! package (that compiles the rest of the guide) does not build, so they are marked
//! `ignore` there and compiled here, as `no_run` (they need a server).

fn main() {
    let guide = "../docs/getting-started.md";
    println!("cargo:rerun-if-changed={guide}");
    let text = std::fs::read_to_string(guide).expect("read docs/getting-started.md");
    let start = text
        .find("## Writing tables out: upserts")
        .expect("docs/getting-started.md has the section 'Writing tables out: upserts'");
    let rest = &text[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    let section = rest[..end].replace("```rust,ignore", "```rust,no_run");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("upserts.md"), section).expect("write upserts.md");
}
