//! A job with a secret, tried as an operator would: anyone may read its views, but a
//! savepoint, a stop or a cancel needs the secret — from curl (`Authorization: Bearer`),
//! from `weir job … --secret-file`, or from the file `WEIR_SECRET_FILE` names. Refusals
//! are counted and leave the job running.

use crate::rest_api::weir_job_with as weir_job;
use std::time::Duration;
use weir::prelude::*;
use weir::{Secret, metrics};
use weir_tests::{JOB_DEADLINE, join_within, rest, wait_for};

const SECRET: &str = "s3cret-s3cret-s3cret-0123456789";

/// A POST with an `Authorization` header (when `token` is given): status and JSON body.
fn post_as(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: weir\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    c.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response}"));
    (status, response)
}

fn refused(reason: &str) -> f64 {
    metrics::value("web_actions_refused_total", &[("reason", reason)]).unwrap_or(0.0)
}

#[test]
fn actions_need_the_jobs_secret_and_views_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, "another-secret-0123456789abcdef").unwrap();
    let env = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .secret(Secret::from_file(&secret_file).unwrap())
        .checkpoints(
            CheckpointConfig::new(dir.path().join("ck")).interval(Duration::from_millis(50)),
        );
    env.from_iter(0u64..)
        .key_by(|x| x % 3)
        .reduce(|a, b| a.wrapping_add(b))
        .discard();
    let handle = env.execute_async("guarded").unwrap();
    let addr = handle.web_address().unwrap();
    let web = addr.to_string();
    wait_for("a complete checkpoint", JOB_DEADLINE, || {
        rest::get(addr, "/v1/checkpoints")["latest_completed"]["id"].is_u64()
    });
    let (none_before, wrong_before) = (refused("no secret"), refused("wrong secret"));

    // Views are open.
    assert_eq!(rest::get(addr, "/v1/job")["state"], "RUNNING");
    // No secret: 401, a challenge, a message that says what to send.
    let (status, response) = post_as(addr, "/v1/job/cancel", None);
    assert_eq!(status, 401, "{response}");
    assert!(
        response.contains("Www-Authenticate: Bearer realm=\"weir\""),
        "{response}"
    );
    assert!(
        response.contains("Authorization: Bearer SECRET"),
        "{response}"
    );
    // A wrong secret, on both actions.
    let (status, response) = post_as(
        addr,
        "/v1/savepoints",
        Some("another-secret-0123456789abcdef"),
    );
    assert_eq!(status, 401, "{response}");
    assert!(response.contains("is not this job's secret"), "{response}");
    let (status, _) = post_as(addr, "/v1/job/cancel", Some(&SECRET[1..]));
    assert_eq!(status, 401);
    assert_eq!(refused("no secret") - none_before, 1.0);
    assert_eq!(refused("wrong secret") - wrong_before, 2.0);

    // The CLI: without the secret it says how to give it; with a wrong one it says so.
    let (ok, _, err) = weir_job(&["savepoint", "--web", &web], &[]);
    assert!(!ok);
    assert!(err.contains("answered 401"), "{err}");
    assert!(err.contains("--secret-file PATH"), "{err}");
    let (ok, _, err) = weir_job(&["cancel", "--web", &web, "--secret-file"], &[]);
    assert!(!ok, "a flag without its value is refused: {err}");
    let (ok, _, err) = weir_job(
        &["cancel", "--web", &web],
        &[("WEIR_SECRET_FILE", wrong_file.as_path())],
    );
    assert!(!ok);
    assert!(err.contains("is not this job's secret"), "{err}");
    let (ok, _, err) = weir_job(
        &["cancel", "--web", &web, "--secret-file"],
        &[("WEIR_SECRET_FILE", dir.path().join("missing").as_path())],
    );
    assert!(!ok, "{err}");
    // Nothing refused stopped the job.
    assert_eq!(rest::get(addr, "/v1/job")["state"], "RUNNING");

    // With the secret (from the environment): a savepoint, then a cancel (from the flag).
    let (ok, out, err) = weir_job(
        &["savepoint", "--web", &web],
        &[("WEIR_SECRET_FILE", secret_file.as_path())],
    );
    assert!(ok, "{err}");
    assert!(
        std::path::Path::new(out.trim()).join("_metadata").exists(),
        "{out}"
    );
    let secret_arg = secret_file.to_str().unwrap();
    let (ok, out, err) = weir_job(&["cancel", "--web", &web, "--secret-file", secret_arg], &[]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("cancelling the job at {web}\n"));
    let err = join_within(handle, JOB_DEADLINE).unwrap_err();
    assert!(matches!(err, weir::Error::Cancelled), "{err}");
}

#[test]
fn a_short_or_unreadable_secret_file_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "abc\n").unwrap();
    let e = Secret::from_file(&short).unwrap_err().to_string();
    assert!(e.contains("3 bytes long; use at least 16"), "{e}");
    let e = Secret::from_file(dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read the secret file"), "{e}");
    // The CLI says the same before it sends anything.
    let (ok, _, err) = weir_job(
        &[
            "cancel",
            "--web",
            "127.0.0.1:9",
            "--secret-file",
            short.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("3 bytes long"), "{err}");
}
