//! The documentation against the code, tried as a new user reads it: every Rust snippet in
//! the README and the guides compiles in a project that depends on `weir` with its
//! default features (as a user's project does), and the defaults the configuration
//! reference states are the ones the code has.
//!
//! A snippet that needs a feature says so on the line before its fence:
//! `<!-- weir features: rocksdb -->`. It is then left to the workspace's doc tests (which
//! build every feature), and the feature must exist and must not be on by default.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use weir::prelude::*;
use weir::{ExponentialDelay, RestartStrategy};

/// The documents whose Rust snippets a user copies.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/getting-started.md",
    "docs/checkpoints.md",
    "docs/cluster.md",
    "docs/operations.md",
];

/// The line before a fence that names the features its snippet needs.
const FEATURES_MARK: &str = "<!-- weir features:";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

/// A Rust snippet of a document.
struct Snippet {
    /// `document:line` of its opening fence.
    origin: String,
    /// The code as rustdoc compiles it (hidden `# ` lines shown).
    code: String,
    /// The features it says it needs.
    features: Vec<String>,
}

fn snippets(document: &str) -> Vec<Snippet> {
    let text = std::fs::read_to_string(repo().join(document)).expect("read document");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let info = lines[i].trim_start().strip_prefix("```");
        let Some(info) = info else {
            i += 1;
            continue;
        };
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_start().starts_with("```"))
            .unwrap_or_else(|| panic!("{document}:{}: the fence is never closed", i + 1));
        i = end + 1;
        let words: Vec<&str> = info.split(',').map(str::trim).collect();
        if words.first() != Some(&"rust") || words.contains(&"ignore") {
            continue;
        }
        let features = start
            .checked_sub(1)
            .and_then(|p| lines[p].trim().strip_prefix(FEATURES_MARK))
            .map(|rest| {
                rest.trim_end_matches("-->")
                    .split(',')
                    .map(|f| f.trim().to_string())
                    .filter(|f| !f.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let code = lines[start + 1..end]
            .iter()
            .map(|l| {
                let t = l.trim_start();
                if t == "#" {
                    ""
                } else if let Some(rest) = t.strip_prefix("# ") {
                    rest
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        out.push(Snippet {
            origin: format!("{document}:{}", start + 1),
            code,
            features,
        });
    }
    out
}

/// A snippet as a program: as is when it has a `main`, otherwise inside one (as rustdoc
/// does; a snippet ending in `Ok::<(), weir::Error>(())` may use `?`).
fn program(s: &Snippet) -> String {
    if s.code.contains("fn main") {
        format!("// {}\n{}\n", s.origin, s.code)
    } else {
        format!(
            "// {}\nfn main() {{\n    let _result = (|| {{\n{}\n    }})();\n}}\n",
            s.origin, s.code
        )
    }
}

/// The features of the `weir` crate: (name, on by default).
fn weir_features() -> Vec<(String, bool)> {
    let manifest =
        std::fs::read_to_string(repo().join("crates/weir/Cargo.toml")).expect("weir manifest");
    let section = manifest
        .split("[features]")
        .nth(1)
        .map(|rest| rest.split("\n[").next().unwrap_or(""))
        .unwrap_or("");
    let mut defaults: Vec<String> = Vec::new();
    let mut names = Vec::new();
    for line in section.lines().map(str::trim) {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let name = name.trim();
        if line.starts_with('#') {
            continue;
        }
        if name == "default" {
            defaults = value
                .trim()
                .trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|f| f.trim().trim_matches('"').to_string())
                .filter(|f| !f.is_empty())
                .collect();
        } else {
            names.push(name.to_string());
        }
    }
    names
        .into_iter()
        .map(|n| {
            let on = defaults.contains(&n);
            (n, on)
        })
        .collect()
}

/// The target directory this test binary was built in (`<target>/debug/deps/end_to_end-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .expect("the target directory")
        .to_path_buf()
}

#[test]
fn every_snippet_compiles_with_the_default_features_a_user_has() {
    let features = weir_features();
    let project = tempfile::tempdir().expect("temp dir");
    let bin = project.path().join("src/bin");
    std::fs::create_dir_all(&bin).expect("create project");
    let mut checked = Vec::new();
    for document in DOCUMENTS {
        for (n, s) in snippets(document).into_iter().enumerate() {
            for f in &s.features {
                match features.iter().find(|(name, _)| name == f) {
                    None => panic!(
                        "{} says it needs the weir feature '{f}', which crates/weir/Cargo.toml does not have",
                        s.origin
                    ),
                    Some((_, true)) => panic!(
                        "{} says it needs the weir feature '{f}', but that feature is on by default: drop the mark",
                        s.origin
                    ),
                    Some(_) => {}
                }
            }
            if !s.features.is_empty() {
                continue;
            }
            let name = format!(
                "{}_{n}",
                document.replace(['/', '.', '-'], "_").to_lowercase()
            );
            std::fs::write(bin.join(format!("{name}.rs")), program(&s)).expect("write snippet");
            checked.push((name, s.origin));
        }
    }
    // The control: a snippet naming the RocksDB backend without the feature must fail, or
    // this check could not catch a guide that assumes it.
    std::fs::write(
        bin.join("control_rocksdb.rs"),
        "fn main() { let _ = weir::RocksDbConfig::default(); }\n",
    )
    .expect("write control");
    assert!(
        checked.len() >= 10,
        "only {} snippets found: did the fences change?",
        checked.len()
    );

    let weir = repo().join("crates/weir");
    let serde = "serde = { version = \"1.0\", features = [\"derive\"] }";
    // A project that calls services from async I/O has an async runtime's crate too: the
    // guide's async snippets sleep on tokio's timer.
    let tokio = "tokio = { version = \"1\", features = [\"time\"] }";
    std::fs::write(
        project.path().join("Cargo.toml"),
        format!(
            "[package]\nname = \"a-users-project\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\nweir = {{ path = {weir:?} }}\n{serde}\n{tokio}\n\n[workspace]\n"
        ),
    )
    .expect("write manifest");
    // The workspace's lock file: the same dependency versions, nothing to download.
    std::fs::copy(repo().join("Cargo.lock"), project.path().join("Cargo.lock"))
        .expect("copy Cargo.lock");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "check",
            "--bins",
            "--offline",
            "--keep-going",
            "--message-format=short",
        ])
        .arg("--target-dir")
        .arg(target_dir().join("doc-check"))
        .current_dir(project.path())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .output()
        .expect("run cargo check");
    let log = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(": error")).collect();
    let mut report = String::new();
    for (name, origin) in &checked {
        let file = format!("src/bin/{name}.rs");
        for e in errors.iter().filter(|e| e.contains(&file)) {
            let _ = writeln!(report, "{origin}: {e}");
        }
    }
    assert!(
        report.is_empty(),
        "snippets that do not compile with weir's default features:\n{report}\n\
         (if a snippet needs a feature, put `{FEATURES_MARK} NAME -->` on the line before its fence and say so in the text)\n\nfull log:\n{log}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("control_rocksdb.rs") && e.contains("RocksDbConfig")),
        "the control snippet compiled without the rocksdb feature, so this check proves nothing:\n{log}"
    );
}

fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0".to_string(),
        ms if ms % 60_000 == 0 => format!("{} min", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}

/// The configuration reference's table (`docs/checkpoints.md`, section 12): field name to
/// the default it states.
fn documented_defaults() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(repo().join("docs/checkpoints.md")).expect("read checkpoints.md");
    let section = text
        .split("## 12. Configuration reference")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("checkpoints.md has a section 12, the configuration reference");
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let field = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((field.to_string(), cells.get(1)?.to_string()))
        })
        .collect()
}

#[test]
fn the_configuration_reference_states_the_defaults_the_code_has() {
    let c = CheckpointConfig::new("ck");
    let restart = match RestartStrategy::default() {
        RestartStrategy::ExponentialDelay(ExponentialDelay {
            initial_backoff,
            max_backoff,
            multiplier,
            reset_threshold,
            max_attempts,
            ..
        }) => format!(
            "exponential delay: {} ×{multiplier} up to {}, reset after {}, {}",
            duration(initial_backoff),
            duration(max_backoff),
            duration(reset_threshold),
            match max_attempts {
                None => "unlimited".to_string(),
                Some(n) => format!("at most {n} in a row"),
            }
        ),
        other => panic!(
            "the default restart strategy changed to {other:?}: update this test and the docs"
        ),
    };
    let want: Vec<(&str, String)> = vec![
        ("dir", "(required)".to_string()),
        ("interval", duration(c.interval)),
        ("min_pause", duration(c.min_pause)),
        ("timeout", duration(c.timeout)),
        (
            "tolerable_timeouts",
            format!("`{:?}`", c.tolerable_timeouts),
        ),
        ("retain", c.retain.to_string()),
        ("exactly_once", format!("`{}`", c.exactly_once)),
        ("restore_from", format!("`{:?}`", c.restore_from)),
        (
            "start_fresh_if_unusable",
            format!("`{}`", c.start_fresh_if_unusable),
        ),
        ("lease", duration(c.lease)),
        (
            "verify_before_restore",
            format!("`{}`", c.verify_before_restore),
        ),
        ("restart", restart),
        (
            "in_flight_target",
            JobConfig::default()
                .in_flight_target
                .map_or("`None`".to_string(), duration),
        ),
        (
            "cancellation_timeout",
            duration(JobConfig::default().cancellation_timeout),
        ),
    ];
    let have = documented_defaults();
    let mut wrong = String::new();
    for (field, default) in &want {
        match have.iter().find(|(f, _)| f == field) {
            None => {
                let _ = writeln!(
                    wrong,
                    "`{field}` is missing (the code's default: {default})"
                );
            }
            Some((_, doc)) if doc != default => {
                let _ = writeln!(
                    wrong,
                    "`{field}`: the docs say {doc:?}, the code has {default:?}"
                );
            }
            Some(_) => {}
        }
    }
    for (field, _) in &have {
        if !want.iter().any(|(f, _)| f == field) {
            let _ = writeln!(
                wrong,
                "`{field}` is documented but not checked here: add it to this test"
            );
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/checkpoints.md section 12 disagrees with CheckpointConfig::new:\n{wrong}"
    );
}
