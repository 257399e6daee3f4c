//! A cluster over TLS, tried as an operator would: certificates of the cluster's CA let a
//! coordinator and its workers run the job (records crossing between workers over TLS),
//! the REST API answers https to `weir job --ca-file`; a worker with a certificate of
//! another CA, an expired certificate, no TLS at all, or TLS against a plain coordinator
//! is refused, with a message on the worker's side and a count on the coordinator's.

use crate::cluster::{
    endless, free_address, spawn_windowed_workers, windowed_expected, windowed_output,
    windowed_sums,
};
use std::path::Path;
use std::time::Duration;
use weir::cluster::{ClusterConfig, Credentials, join, join_with};
use weir::prelude::*;
use weir::{Tls, metrics};
use weir_tests::certs::Ca;
use weir_tests::{join_within, wait_for};

fn tls_only(dir: &Path) -> Credentials {
    Credentials {
        secret: None,
        tls: Some(Tls::from_dir(dir).expect("TLS settings")),
    }
}

fn refused_tls() -> f64 {
    metrics::value(
        "cluster_connections_refused_total",
        &[("port", "coordinator"), ("reason", "tls")],
    )
    .unwrap_or(0.0)
}

#[test]
fn a_cluster_over_tls_runs_the_job_and_its_api_answers_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("weir test CA");
    let coordinator_dir = ca.issue(dir.path(), "coordinator", false);
    let address = free_address();
    let coordinator = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .tls(Tls::from_dir(&coordinator_dir).unwrap())
        .cluster(ClusterConfig::coordinator(
            &address,
            2,
            vec!["windowed".into()],
        ));
    let _ = windowed_sums(&coordinator);
    let coordinator = coordinator.execute_async("windowed").expect("start");
    let web = coordinator.web_address().unwrap().to_string();

    // The API answers https only, to a client that trusts the CA.
    let weir = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir-cli"))
            .args(args)
            .env_remove("WEIR_CA_FILE")
            .output()
            .expect("run weir")
    };
    let ca_file = coordinator_dir.join("ca.crt");
    let ca_arg = ca_file.to_str().unwrap();
    let out = weir(&[
        "job",
        "status",
        "--web",
        &web,
        "--ca-file",
        ca_arg,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["job"]["name"], "windowed");
    let out = weir(&["job", "status", "--web", &web]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--ca-file"), "{err}");
    let other_ca = Ca::new("another CA");
    let other = other_ca.issue(dir.path(), "other", false);
    let out = weir(&[
        "job",
        "status",
        "--web",
        &web,
        "--ca-file",
        other.join("ca.crt").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("UnknownIssuer"), "{err}");

    let credentials = (1..=2)
        .map(|i| tls_only(&ca.issue(dir.path(), &format!("worker-{i}"), false)))
        .collect();
    let workers = spawn_windowed_workers(&address, credentials);
    join_within(coordinator, Duration::from_secs(60)).expect("the cluster job");
    assert_eq!(windowed_output(workers).0, windowed_expected());
}

/// Every way to get TLS wrong, one after the other against one coordinator (the refusal
/// count is exact), then TLS against a coordinator without it.
#[test]
fn wrong_expired_or_missing_certificates_are_refused_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("weir test CA");
    let address = free_address();
    let coordinator = Env::new()
        .parallelism(1)
        .tls(Tls::from_dir(ca.issue(dir.path(), "coordinator", false)).unwrap())
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    endless(&coordinator);
    let coordinator = coordinator.execute_async("job").expect("start");
    let wait = Duration::from_secs(10);
    let before = refused_tls();
    let mut refusals = 0.0;

    // A certificate of another CA, which also trusts only that CA: the worker refuses the
    // coordinator's certificate.
    let other_ca = Ca::new("another CA");
    let e = join_with(
        &address,
        1,
        wait,
        tls_only(&other_ca.issue(dir.path(), "stranger", false)),
    )
    .expect_err("another CA");
    let msg = e.to_string();
    assert!(msg.contains("TLS with the coordinator at"), "{msg}");
    assert!(msg.contains("UnknownIssuer"), "{msg}");
    refusals += 1.0;

    // A certificate of another CA that trusts the cluster's CA: the coordinator refuses it.
    let impostor = other_ca.issue(dir.path(), "impostor", false);
    std::fs::write(impostor.join("ca.crt"), ca.pem()).unwrap();
    let e = join_with(&address, 1, wait, tls_only(&impostor)).expect_err("an unknown client");
    let msg = e.to_string();
    assert!(
        msg.contains("TLS with the coordinator at") || msg.contains("refused"),
        "{msg}"
    );
    refusals += 1.0;

    // An expired certificate of the right CA.
    let e = join_with(
        &address,
        1,
        wait,
        tls_only(&ca.issue(dir.path(), "expired", true)),
    )
    .expect_err("an expired certificate");
    let msg = e.to_string();
    assert!(
        msg.contains("TLS with the coordinator at") || msg.contains("refused"),
        "{msg}"
    );
    refusals += 1.0;

    // A TCP liveness probe (connect, close) is no one to refuse: not counted.
    drop(std::net::TcpStream::connect(&address).expect("a probe connects"));

    // No TLS at all: the coordinator says TLS is required.
    let e = join(&address, 1, wait).expect_err("plain text");
    let msg = e.to_string();
    assert!(msg.contains("this port requires TLS"), "{msg}");
    assert!(msg.contains("--tls-dir"), "{msg}");
    refusals += 1.0;

    wait_for("the refusals counted", Duration::from_secs(10), || {
        refused_tls() - before == refusals
    });
    coordinator.cancel();
    let e = join_within(coordinator, Duration::from_secs(30)).expect_err("cancelled");
    assert!(matches!(e, weir::Error::Cancelled), "{e}");

    // TLS against a coordinator without it.
    let address = free_address();
    let plain = Env::new()
        .parallelism(1)
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    endless(&plain);
    let plain = plain.execute_async("job").expect("start");
    let e = join_with(
        &address,
        1,
        wait,
        tls_only(&ca.issue(dir.path(), "tls-worker", false)),
    )
    .expect_err("TLS against plain");
    assert!(e.to_string().contains("TLS with the coordinator at"), "{e}");
    plain.cancel();
    let _ = join_within(plain, Duration::from_secs(30));
}
