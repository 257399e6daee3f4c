//! What the benchmark tests share.

use serde_json::Value;
use std::process::Command;

/// Runs `weir-bench` with `args`, asserts it succeeded, and returns its one JSON line.
pub fn bench(args: &[&str]) -> Value {
    bench_with(args, &[])
}

/// Like [`bench`], with `env` added to the environment of `weir-bench` (and so of the
/// processes it starts).
#[allow(dead_code)] // Not every benchmark test sets one.
pub fn bench_with(args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("weir-bench starts");
    assert!(
        out.status.success(),
        "weir-bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line, got {stdout:?}");
    serde_json::from_str(lines[0]).expect("a JSON line")
}
