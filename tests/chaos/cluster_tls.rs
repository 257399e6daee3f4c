//! A cluster of real `file_sum` processes run the way a security-minded operator runs it:
//! every process with the cluster's TLS directory and the job's secret. A worker is
//! SIGKILLed mid-run and replaced, and the committed output is still exact; a stranger
//! with a certificate of another CA, one with an expired certificate of the right CA,
//! and one without TLS are each refused, say why, and leave the job untouched; the
//! coordinator's REST API answers `weir cluster status` over https only.

use crate::cluster::{
    Cluster, expect_success, read, start_workers, wait_checkpoint_after, wait_log,
    weir_cluster_output,
};
use crate::harness::Scenario;
use std::process::Command;
use weir_tests::certs::Ca;

/// Runs a worker that must be refused: it exits non-zero, and its stderr is returned.
fn refused_worker(cl: &Cluster<'_>, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_file_sum"))
        .args(["--cluster", "worker", "--coordinator", &cl.address])
        .args(["--join-timeout-ms", "5000"])
        .args(args)
        .env_remove("WEIR_SECRET_FILE")
        .env_remove("WEIR_TLS_DIR")
        .output()
        .expect("run a worker");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "a stranger joined: {err}");
    err
}

#[test]
fn a_tls_cluster_with_a_secret_survives_a_worker_kill_and_refuses_strangers() {
    let s = Scenario::new(40_000, 40, 55);
    let mut cl = Cluster::new(&s);
    let certs = s.output.with_file_name("certs");
    let ca = Ca::new("weir chaos CA");
    let tls = ca.issue(&certs, "cluster", false);
    let secret = certs.join("secret");
    std::fs::write(&secret, "chaos-secret-0123456789abcdef\n").expect("write the secret");
    cl.tls = Some(tls.clone());
    cl.secret = Some(secret.clone());
    let secret_arg = secret.to_str().unwrap();

    let (mut coord, coord_log) = cl.coordinator();
    let mut workers = start_workers(&mut cl, &coord_log);
    wait_checkpoint_after(&s, 2);

    // Strangers: another CA; the right CA but expired; no TLS at all.
    let other = Ca::new("another CA").issue(&certs, "stranger", false);
    let err = refused_worker(
        &cl,
        &[
            "--tls-dir",
            other.to_str().unwrap(),
            "--secret-file",
            secret_arg,
        ],
    );
    assert!(err.contains("UnknownIssuer"), "{err}");
    let expired = ca.issue(&certs, "expired", true);
    let err = refused_worker(
        &cl,
        &[
            "--tls-dir",
            expired.to_str().unwrap(),
            "--secret-file",
            secret_arg,
        ],
    );
    assert!(err.contains("refused the TLS connection"), "{err}");
    let err = refused_worker(&cl, &["--secret-file", secret_arg]);
    assert!(err.contains("this port requires TLS"), "{err}");
    let log = read(&coord_log);
    assert!(log.matches("TLS handshake failed").count() >= 2, "{log}");
    assert!(log.contains("a client without TLS was refused"), "{log}");

    // The REST API: https with the CA, and only then.
    let ca_file = tls.join("ca.crt");
    let out = weir_cluster_output(&cl.web, &["status", "--ca-file", ca_file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("workers:         3 (4 slots)"), "{text}");
    let out = weir_cluster_output(&cl.web, &["status"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("it serves https"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A worker killed mid-run is replaced; the output is exact.
    let (mut victim, _) = workers.remove(2);
    victim.kill().expect("SIGKILL a worker");
    victim.wait().expect("reap the worker");
    wait_log(&coord_log, "waiting for 1 worker(s) and 4 slot(s)", 1);
    let (mut replacement, replacement_log) = cl.worker(1);
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    expect_success(&mut replacement, &replacement_log, "the replacement worker");
    assert!(read(&coord_log).contains("resuming from checkpoint"));
    s.check();
}
