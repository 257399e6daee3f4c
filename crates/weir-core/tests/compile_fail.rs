//! Compile-fail tests: the mistakes a pipeline author is most likely to make must not
//! compile, and the compiler must say what to do instead. Each file in `tests/ui` is
//! compiled on its own; its expected messages are in the `.stderr` file beside it
//! (they depend on the compiler version: regenerate with `TRYBUILD=overwrite` after a
//! toolchain update, and read the diff).

#[test]
fn mistakes_fail_to_compile_with_readable_messages() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
