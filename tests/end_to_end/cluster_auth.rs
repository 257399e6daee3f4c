//! A cluster whose processes hold a shared secret, tried as an operator would: a worker
//! without the secret, with another one, or a stray client on a data port is refused with
//! a message that says what to fix, and counted; workers with the secret run the job to
//! the same output as without one.

use crate::cluster::{
    endless, free_address, spawn_windowed_workers, windowed_expected, windowed_output,
    windowed_sums,
};
use std::io::{Read, Write};
use std::time::Duration;
use weir::cluster::{ClusterConfig, Credentials, join, join_with};
use weir::prelude::*;
use weir::{Secret, metrics};
use weir_tests::{join_within, rest, wait_for};

fn secret() -> Secret {
    Secret::new("cluster-secret-0123456789abcdef").unwrap()
}

fn secret_only(secret: Secret) -> Credentials {
    Credentials {
        secret: Some(secret),
        tls: None,
    }
}

fn refused(port: &str, reason: &str) -> f64 {
    metrics::value(
        "cluster_connections_refused_total",
        &[("port", port), ("reason", reason)],
    )
    .unwrap_or(0.0)
}

/// Sends one frame (`body`, length-prefixed) and reads the answer frame.
fn exchange(address: &str, body: &[u8]) -> Vec<u8> {
    let mut c = std::net::TcpStream::connect(address).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut len = [0u8; 4];
    c.read_exact(&mut len).expect("an answer");
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    c.read_exact(&mut answer).expect("the answer's body");
    answer
}

#[test]
fn workers_without_the_secret_are_refused_and_workers_with_it_run_the_job() {
    let address = free_address();
    let coordinator =
        Env::new()
            .parallelism(2)
            .secret(secret())
            .cluster(ClusterConfig::coordinator(
                &address,
                2,
                vec!["windowed".into()],
            ));
    let _ = windowed_sums(&coordinator);
    let coordinator = coordinator
        .execute_async("windowed")
        .expect("start the coordinator");
    let (none, wrong) = (
        refused("coordinator", "no secret"),
        refused("coordinator", "wrong secret"),
    );

    let e = join(&address, 1, Duration::from_secs(10)).expect_err("no secret");
    let msg = e.to_string();
    assert!(msg.contains("refused this worker"), "{msg}");
    assert!(
        msg.contains("this cluster requires authentication"),
        "{msg}"
    );
    assert!(msg.contains("--secret-file"), "{msg}");
    let other = Secret::new("another-secret-0123456789abcdef").unwrap();
    let e = join_with(&address, 1, Duration::from_secs(10), secret_only(other))
        .expect_err("a wrong secret");
    assert!(
        e.to_string().contains("does not hold this job's secret"),
        "{e}"
    );
    // A client of the cluster protocol that skips the authentication gets the reason.
    let answer = exchange(&address, b"Bhello");
    assert_eq!(&answer[..2], b"A0");
    assert!(
        String::from_utf8_lossy(&answer).contains("requires authentication"),
        "{answer:?}"
    );
    wait_for("the refusals counted", Duration::from_secs(10), || {
        refused("coordinator", "no secret") - none == 2.0
            && refused("coordinator", "wrong secret") - wrong == 1.0
    });

    let workers =
        spawn_windowed_workers(&address, vec![secret_only(secret()), secret_only(secret())]);
    join_within(coordinator, Duration::from_secs(60)).expect("the cluster job");
    // The windows' subtasks run on different workers: their records crossed an
    // authenticated data connection.
    assert_eq!(windowed_output(workers).0, windowed_expected());
}

#[test]
fn a_worker_with_a_secret_is_refused_by_a_coordinator_without_one() {
    let address = free_address();
    let coordinator = Env::new()
        .parallelism(1)
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    endless(&coordinator);
    let coordinator = coordinator.execute_async("job").expect("start");
    let e = join_with(&address, 1, Duration::from_secs(10), secret_only(secret()))
        .expect_err("the coordinator has no secret");
    assert!(
        e.to_string()
            .contains("this process has no secret but the connecting one has"),
        "{e}"
    );
    assert!(refused("coordinator", "unexpected secret") >= 1.0);
    coordinator.cancel();
    let e = join_within(coordinator, Duration::from_secs(30)).expect_err("cancelled");
    assert!(matches!(e, weir::Error::Cancelled), "{e}");
}

#[test]
fn a_workers_data_port_refuses_a_client_without_the_secret() {
    let address = free_address();
    let coordinator = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .secret(secret())
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    endless(&coordinator);
    let coordinator = coordinator.execute_async("job").expect("start");
    let web = coordinator.web_address().expect("the API");
    let joined =
        join_with(&address, 1, Duration::from_secs(30), secret_only(secret())).expect("join");
    let env = Env::new()
        .parallelism(1)
        .cluster(ClusterConfig::worker(joined));
    endless(&env);
    let worker = env.execute_async("job").expect("start the worker");
    let mut data = String::new();
    wait_for("the worker's tasks", Duration::from_secs(30), || {
        let cluster = rest::get(web, "/v1/job")["cluster"].clone();
        data = cluster["workers"][0]["data_address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        cluster["phase"] == "running" && !data.is_empty()
    });
    let before = refused("data", "no secret");
    // What a worker of the previous version, or anyone else, sends first.
    let answer = exchange(&data, b"Bdata");
    assert_eq!(&answer[..2], b"A0", "{answer:?}");
    assert!(
        String::from_utf8_lossy(&answer).contains("requires authentication"),
        "{answer:?}"
    );
    assert_eq!(refused("data", "no secret") - before, 1.0);
    coordinator.cancel();
    let e = join_within(coordinator, Duration::from_secs(30)).expect_err("cancelled");
    assert!(matches!(e, weir::Error::Cancelled), "{e}");
    let _ = join_within(worker, Duration::from_secs(30));
}
