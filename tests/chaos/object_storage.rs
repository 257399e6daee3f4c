//! Checkpoints on a real S3-compatible server (S3Proxy, started by scripts/s3.sh):
//! `file_sum --checkpoint-dir s3://…` killed with SIGKILL at random moments, and the server
//! itself killed and restarted under a running job.

use crate::harness::{Rng, Scenario, newest_committed_output, stderr_of, wait_for};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_tests::s3;

/// The complete checkpoints under `prefix` of the test bucket, as the server stores them
/// (not through weir): their ids.
pub(super) fn complete_on_server(server: &s3::Server, prefix: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = server
        .files(s3::BUCKET, prefix)
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "_metadata"))
        .filter_map(|f| {
            f.parent()?
                .file_name()?
                .to_str()?
                .strip_prefix("chk-")?
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The key prefix of an `s3://bucket/prefix` URL.
pub(super) fn prefix_of(url: &Path) -> String {
    let url = url.to_str().unwrap();
    url.strip_prefix(&format!("s3://{}/", s3::BUCKET))
        .unwrap()
        .to_string()
}

#[test]
fn sigkill_at_random_moments_with_checkpoints_on_s3() {
    let server = s3::shared();
    let mut s = Scenario::new(30_000, 30, 21);
    s.checkpoints = PathBuf::from(s3::url("chaos-kills"));
    let prefix = prefix_of(&s.checkpoints);
    let env = server.env();
    let mut rng = Rng::new(77);
    let landed = s
        .kill_at_random_moments(2, 12, (100, 400), &mut rng, &env)
        .len();
    assert!(
        landed >= 10,
        "only {landed} of 12 kills landed while the job ran"
    );
    assert!(
        !complete_on_server(server, &prefix).is_empty(),
        "no checkpoint reached the server before the last run"
    );
    let out = s
        .command(2, None, 100)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run file_sum");
    assert!(
        out.status.success(),
        "file_sum failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    s.check();
    // Retention kept the default 3 checkpoints; the final one is among them.
    let kept = complete_on_server(server, &prefix);
    assert!(kept.len() <= 3, "{kept:?}");
    // The credentials never reach the log.
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("weir-secret-key"), "{log}");
}

/// Collects a child's standard error lines as they come.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let err = child.stderr.take().expect("stderr piped");
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

#[test]
fn an_s3_server_restart_fails_checkpoints_then_they_succeed_again_with_nothing_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let server = s3::Server::dedicated(&tmp.path().join("s3"));
    let mut s = Scenario::new(40_000, 20, 5);
    s.checkpoints = PathBuf::from(format!("s3://{}/restart/ck", s3::BUCKET));
    let mut child = s
        .command(2, Some(2_500), 200)
        .envs(server.env())
        // Requests give up after 2 s instead of 30: checkpoints fail while the server is away.
        .env("WEIR_OBJECT_STORE_RETRY_SECS", "2")
        .spawn()
        .expect("start file_sum");
    let log = collect_stderr(&mut child);
    let running = |child: &mut Child| child.try_wait().unwrap().is_none();
    wait_for(
        "a first checkpoint on the server",
        Duration::from_secs(60),
        || !complete_on_server(&server, "restart/ck").is_empty(),
    );
    server.kill();
    let before = *complete_on_server(&server, "restart/ck").last().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !log.lock().unwrap().iter().any(|l| l.contains("aborted")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint failed within 60 s of the server going down:\n{}",
            log.lock().unwrap().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        running(&mut child),
        "the job stopped: {:?}",
        log.lock().unwrap()
    );
    server.restart();
    wait_for(
        "a checkpoint to complete again",
        Duration::from_secs(60),
        || {
            complete_on_server(&server, "restart/ck")
                .last()
                .is_some_and(|&id| id > before)
        },
    );
    let status = weir_tests::wait_within(&mut child, Duration::from_secs(120));
    let log = log.lock().unwrap().join("\n");
    assert!(status.success(), "file_sum failed: {status}\n{log}");
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("aborted")).collect();
    assert!(
        !failed.is_empty(),
        "no checkpoint failed while the server was down:\n{log}"
    );
    s.check();
}

/// `weir` with the S3 environment.
fn weir_cli(server: &s3::Server, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .args(args)
        .envs(server.env())
        .output()
        .expect("run weir")
}

/// What an operator does with a job on S3, end to end: `weir savepoint stop s3://…` stops
/// the running job with a savepoint (and prints where), `weir checkpoints inspect` reads it,
/// the job resumes from it at another parallelism into a new checkpoint prefix (restore
/// elsewhere, rescale), a damaged newest checkpoint there makes a later restart fall back to
/// the one before, and the committed output holds every running sum exactly once.
#[test]
fn savepoint_stop_inspect_restore_elsewhere_rescaled_and_fall_back_on_s3() {
    let server = s3::shared();
    let mut s = Scenario::new(30_000, 30, 44);
    s.checkpoints = PathBuf::from(s3::url("operator-first"));
    let first = s.checkpoints.to_str().unwrap().to_string();
    let mut child = s
        .command(2, Some(5_000), 100)
        .envs(server.env())
        .spawn()
        .expect("start file_sum");
    let prefix = prefix_of(&s.checkpoints);
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        !complete_on_server(server, &prefix).is_empty()
    });
    let stop = weir_cli(server, &["savepoint", "stop", &first, "--timeout-s", "60"]);
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let savepoint = String::from_utf8_lossy(&stop.stdout).trim().to_string();
    assert!(
        savepoint.starts_with(&format!("{first}/sp-")),
        "{savepoint}"
    );
    let status = weir_tests::wait_within(&mut child, Duration::from_secs(60));
    assert!(status.success(), "{}", stderr_of(&mut child));

    let inspect = weir_cli(server, &["checkpoints", "inspect", &savepoint]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert!(text.contains("kind:            savepoint"), "{text}");
    assert!(
        text.contains(&format!("path:            {savepoint}\n")),
        "{text}"
    );
    assert!(text.contains("all present with their sizes"), "{text}");

    // Restore elsewhere, at parallelism 3, stopped part-way by a kill. The newest
    // checkpoint is damaged below, so a restart must fall back past it: that replays only
    // output nobody committed yet, so the kill lands right after the run's third checkpoint
    // is complete and before any sink hears of it (fail point `checkpoint.after_metadata`).
    s.checkpoints = PathBuf::from(s3::url("operator-second"));
    let second = prefix_of(&s.checkpoints);
    let out = s
        .command(3, Some(5_000), 100)
        .arg("--from-savepoint")
        .arg(&savepoint)
        .envs(server.env())
        .env("WEIR_FAILPOINTS", "checkpoint.after_metadata=3*kill")
        .output()
        .expect("resume file_sum");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "the fail point did not kill file_sum:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let newest = *complete_on_server(server, &second)
        .last()
        .expect("checkpoints in the new prefix");
    assert!(
        newest_committed_output(&s.output).is_none_or(|c| c < newest),
        "checkpoint {newest}'s output was committed before the kill"
    );
    // Damage the newest checkpoint's state object on the server (truncated to nothing).
    let state = server
        .files(s3::BUCKET, &format!("{second}/chk-{newest:020}"))
        .into_iter()
        .find(|f| f.extension().is_some_and(|e| e == "state"))
        .expect("a state object");
    std::fs::write(&state, b"").unwrap();
    let out = s
        .command(3, None, 100)
        .envs(server.env())
        .output()
        .expect("run file_sum");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "skipping corrupt checkpoint {}/chk-{newest:020}",
            s.checkpoints.display()
        )),
        "{log}"
    );
    s.check();
}
