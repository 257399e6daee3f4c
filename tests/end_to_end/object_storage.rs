//! Checkpoints on a real S3-compatible server, tried as a user would: a job resumes from
//! its checkpoints there, `weir checkpoints list` and `weir savepoint` work on the URL, and
//! wrong settings fail with a message saying what to fix (and never the secret).

use std::path::Path;
use std::process::{Command, Output};
use weir_tests::s3;

fn input(dir: &Path, lines: usize) -> std::path::PathBuf {
    let path = dir.join("in.csv");
    let text: String = (0..lines)
        .map(|i| format!("k{},{}\n", i % 7, i % 13))
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn file_sum(args: &[&str], env: &[(String, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_file_sum"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_BACKTRACE", "0")
        .env_remove("RUST_LOG")
        .env_remove("WEIR_LOG_FORMAT")
        .output()
        .expect("run file_sum")
}

/// The sums per key of the committed output files.
fn committed(out: &Path) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut got = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for e in std::fs::read_dir(out).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let (k, v) = line.split_once(',').unwrap();
            got.entry(k.into()).or_default().push(v.parse().unwrap());
        }
    }
    for v in got.values_mut() {
        v.sort_unstable();
    }
    got
}

#[test]
fn a_job_checkpoints_to_s3_and_the_tools_read_it() {
    let server = s3::shared();
    let tmp = tempfile::tempdir().unwrap();
    let inp = input(tmp.path(), 5_000);
    let ck = s3::url("e2e-tools");
    let out = tmp.path().join("out");
    let args = [
        "--input",
        inp.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--checkpoint-dir",
        &ck,
        "--checkpoint-interval-ms",
        "100",
        "--max-rate",
        "20000",
    ];
    let run = file_sum(&args, &server.env());
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut want = std::collections::BTreeMap::<String, Vec<i64>>::new();
    let mut sums = std::collections::BTreeMap::<String, i64>::new();
    for i in 0..5_000 {
        let k = format!("k{}", i % 7);
        let s = sums.entry(k.clone()).or_default();
        *s += (i % 13) as i64;
        want.entry(k).or_default().push(*s);
    }
    for v in want.values_mut() {
        v.sort_unstable();
    }
    assert_eq!(committed(&out), want);
    // `weir checkpoints list` on the URL shows the final checkpoint, complete.
    let list = Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .args(["checkpoints", "list", &ck])
        .envs(server.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let finals: Vec<&str> = text.lines().filter(|l| l.contains(" final ")).collect();
    assert_eq!(finals.len(), 1, "{text}");
    assert!(
        finals[0].contains("complete") && finals[0].contains(&format!("{ck}/chk-")),
        "{text}"
    );
    // Started again, the job says it had finished and writes nothing more.
    let again = file_sum(&args, &server.env());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{err}");
    assert!(err.contains("had already finished"), "{err}");
    assert_eq!(committed(&out), want);
}

#[test]
fn wrong_object_storage_settings_fail_with_what_to_fix_and_no_secret() {
    let server = s3::shared();
    let tmp = tempfile::tempdir().unwrap();
    let inp = input(tmp.path(), 10);
    let run = |ck: &str, env: &[(String, String)]| {
        let out = tmp.path().join("out");
        let o = file_sum(
            &[
                "--input",
                inp.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--checkpoint-dir",
                ck,
            ],
            env,
        );
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let env = server.env();
    let secret = env
        .iter()
        .find(|(k, _)| k == "AWS_SECRET_ACCESS_KEY")
        .unwrap()
        .1
        .clone();

    let missing = run("s3://no-such-bucket-weir/ck", &env);
    assert!(missing.contains("s3://no-such-bucket-weir/ck"), "{missing}");
    assert!(
        missing.contains("the bucket does not exist: create it, or fix the URL"),
        "{missing}"
    );

    let mut wrong = env.clone();
    wrong.retain(|(k, _)| k != "AWS_SECRET_ACCESS_KEY");
    wrong.push(("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into()));
    let refused = run(&s3::url("wrong-secret"), &wrong);
    assert!(
        refused.contains("the server refused the credentials"),
        "{refused}"
    );
    assert!(!refused.contains("not-the-secret"), "{refused}");

    let mut away = env.clone();
    away.retain(|(k, _)| k != "AWS_ENDPOINT_URL");
    away.push(("AWS_ENDPOINT_URL".into(), "http://127.0.0.1:1".into()));
    away.push(("WEIR_OBJECT_STORE_RETRY_SECS".into(), "0.5".into()));
    let err = run(&s3::url("unreachable"), &away);
    assert!(err.contains("the endpoint cannot be reached"), "{err}");

    // Input that is not there.
    let out = tmp.path().join("out-missing-input");
    let ck = tmp.path().join("ck-missing-input");
    let no_input = file_sum(
        &[
            "--input",
            "s3://weir-tests/no/such/input.csv",
            "--output",
            out.to_str().unwrap(),
            "--checkpoint-dir",
            ck.to_str().unwrap(),
        ],
        &env,
    );
    assert!(!no_input.status.success());
    let no_input = String::from_utf8_lossy(&no_input.stderr).to_string();
    assert!(
        no_input
            .contains("input s3://weir-tests/no/such/input.csv does not exist (no such object)"),
        "{no_input}"
    );

    let no_bucket = run("s3:///no-bucket", &env);
    assert!(no_bucket.contains("no bucket"), "{no_bucket}");
    // The real secret is in the environment of every run above; no message shows it.
    for e in [&missing, &refused, &err, &no_input, &no_bucket] {
        assert!(!e.contains(&secret), "{e}");
    }
}
