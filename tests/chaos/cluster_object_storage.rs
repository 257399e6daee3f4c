//! Cluster mode without a shared file system: `file_sum` as a coordinator and two workers
//! with `--checkpoint-dir s3://…` (and `--input`, `--output` there too) on a real
//! S3-compatible server. The workers store their
//! tasks' checkpoint files themselves and the coordinator writes only the manifests; a
//! worker SIGKILLed mid-run is replaced, and a server killed and restarted under the job
//! fails checkpoints until it is back. Each time the committed output (exactly-once objects
//! on the same server, except for the savepoint test's local directory) holds every key's
//! prefix sums exactly once.

use super::cluster::{
    Cluster, expect_success, read, stopped_with_savepoint, wait_log, weir_cluster_output,
};
use super::object_storage::{complete_on_server, prefix_of};
use crate::harness::{Scenario, wait_for};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;
use weir_tests::s3;

/// The bytes a process says it wrote to object storage (its last line saying so).
fn bytes_written(log: &str) -> Option<u64> {
    log.lines()
        .rev()
        .filter_map(|l| l.split("object storage: ").nth(1))
        .find_map(|rest| rest.split(' ').next()?.parse().ok())
}

/// Starts `n` workers of `slots` slots one after the other (their ids follow).
fn start_workers(
    cl: &mut Cluster<'_>,
    coord_log: &Path,
    n: usize,
    slots: usize,
) -> Vec<(Child, PathBuf)> {
    (1..=n)
        .map(|i| {
            let w = cl.worker(slots);
            wait_log(coord_log, &format!("worker {i} joined"), 1);
            w
        })
        .collect()
}

/// Checks, on the server's own files, that the state of every complete checkpoint under
/// `prefix` was stored by workers: each of its own files is listed under a worker's token,
/// and nothing is stored under the token of the manifest's writer (the coordinator).
/// Returns the largest manifest's size.
fn state_stored_by_workers(server: &s3::Server, prefix: &str) -> u64 {
    let files = server.files(s3::BUCKET, prefix);
    let mut largest = 0;
    let manifests: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "_metadata"))
        .collect();
    assert!(
        !manifests.is_empty(),
        "no complete checkpoint under {prefix}"
    );
    for meta in manifests {
        let text = std::fs::read_to_string(meta).expect("read a manifest");
        largest = largest.max(text.len() as u64);
        let m: serde_json::Value = serde_json::from_str(&text).expect("a JSON manifest");
        let coordinator = m["objects"].as_str().expect("the manifest's writer token");
        let dir = meta.parent().expect("the checkpoint's directory");
        let mut own = 0;
        for f in files_of(&m) {
            if f["shared"].as_bool().unwrap_or(false) {
                continue;
            }
            own += 1;
            let token = f["objects"]
                .as_str()
                .unwrap_or_else(|| panic!("{} lists {f} without a worker's token", meta.display()));
            assert_ne!(token, coordinator, "{}: {f}", meta.display());
            let object = dir.join(token).join(f["name"].as_str().unwrap());
            assert!(
                object.is_file(),
                "{} is not on the server",
                object.display()
            );
        }
        assert!(own > 0, "{} lists no state file", meta.display());
        let coordinator_dir = dir.join(coordinator);
        assert!(
            !coordinator_dir.exists(),
            "the coordinator stored objects of its own: {}",
            coordinator_dir.display()
        );
    }
    largest
}

/// Checks the committed objects of the scenario's output on S3, read from the server's own
/// files (not through weir): every running sum exactly once, and no upload marker left.
fn check_output_on(server: &s3::Server, s: &Scenario) {
    let prefix = prefix_of(&s.output);
    let mut parts = Vec::new();
    for f in server.files(s3::BUCKET, &prefix) {
        let rel = f
            .strip_prefix(server.dir.join("data").join(s3::BUCKET).join(&prefix))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            !rel.starts_with("_uploads"),
            "an upload marker is left: {rel}"
        );
        if rel.starts_with("part-") {
            parts.push((rel, std::fs::read_to_string(&f).unwrap()));
        }
    }
    assert!(!parts.is_empty(), "no committed object below {prefix}");
    s.check_parts(parts);
}

/// Every file entry of a manifest read as JSON.
fn files_of(m: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    m["operators"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["subtasks"].as_array().unwrap())
        .flat_map(|s| s["files"].as_array().unwrap())
}

#[test]
fn workers_store_checkpoints_on_s3_and_a_killed_worker_is_replaced_with_exact_output() {
    let server = s3::shared();
    // Many keys: a checkpoint's state is much larger than its manifest.
    let mut s = Scenario::new(40_000, 2_000, 61);
    s.checkpoints = PathBuf::from(s3::url("cluster-workers"));
    s.output = PathBuf::from(s3::url("cluster-workers-out"));
    // The input too: nothing is shared between the processes but the S3 server.
    let input = s3::url("cluster-workers-in");
    weir_objstore::Store::open(&input)
        .unwrap()
        .put_file("input.csv", &s.input)
        .unwrap();
    s.input = PathBuf::from(format!("{input}/input.csv"));
    let prefix = prefix_of(&s.checkpoints);
    let mut cl = Cluster::new(&s);
    cl.env = server.env();
    cl.workers = 2;
    let (mut coord, coord_log) = cl.coordinator();
    let mut workers = start_workers(&mut cl, &coord_log, 2, 2);
    wait_for(
        "two checkpoints on the server",
        Duration::from_secs(60),
        || complete_on_server(server, &prefix).len() >= 2,
    );
    // Worker 2 runs two subtasks of the keyed sum and their sinks.
    let (mut victim, _) = workers.remove(1);
    victim.kill().expect("SIGKILL a worker");
    victim.wait().expect("reap the worker");
    wait_log(&coord_log, "worker 2 (", 1);
    wait_log(&coord_log, "waiting for 1 worker(s) and 4 slot(s)", 1);
    let replacement = cl.worker(2);
    expect_success(&mut coord, &coord_log, "the coordinator");
    let mut worker_bytes = 0;
    for (mut w, log) in workers.into_iter().chain([replacement]) {
        expect_success(&mut w, &log, "a worker");
        worker_bytes += bytes_written(&read(&log)).expect("a worker's object storage line");
    }
    let log = read(&coord_log);
    // Closed or reset, depending on what the worker's socket held when it died.
    assert!(
        log.lines()
            .any(|l| l.contains("worker 2 (") && l.contains("lost: ")),
        "{log}"
    );
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert!(log.contains("worker 3 joined"), "{log}");
    check_output_on(server, &s);

    // The workers stored the state; the coordinator wrote manifests (and its owner
    // records), nothing the size of state.
    let largest_manifest = state_stored_by_workers(server, &prefix);
    let coordinator_bytes = bytes_written(&log).expect("the coordinator's object storage line");
    let manifests = log.lines().filter(|l| l.contains(" complete (")).count() as u64;
    assert!(manifests >= 2, "{log}");
    eprintln!(
        "coordinator wrote {coordinator_bytes} bytes for {manifests} manifests (largest \
         {largest_manifest}); the workers {worker_bytes}"
    );
    assert!(
        coordinator_bytes <= manifests * largest_manifest + 64 * 1024,
        "the coordinator wrote {coordinator_bytes} bytes for {manifests} manifests of at most \
         {largest_manifest} bytes"
    );
    assert!(
        coordinator_bytes * 3 < worker_bytes,
        "coordinator {coordinator_bytes} bytes, workers {worker_bytes}"
    );
}

#[test]
fn a_cluster_survives_its_s3_server_restarting_checkpoints_fail_then_succeed_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let server = s3::Server::dedicated(&tmp.path().join("s3"));
    let mut s = Scenario::new(40_000, 200, 62);
    s.checkpoints = PathBuf::from(format!("s3://{}/cluster-restart/ck", s3::BUCKET));
    s.output = PathBuf::from(format!("s3://{}/cluster-restart/out", s3::BUCKET));
    let mut cl = Cluster::new(&s);
    cl.env = server.env();
    // Requests give up after 2 s instead of 30: checkpoints fail while the server is away.
    cl.env
        .push(("WEIR_OBJECT_STORE_RETRY_SECS".into(), "2".into()));
    cl.workers = 2;
    cl.max_rate = 2_500;
    let (mut coord, coord_log) = cl.coordinator();
    let workers = start_workers(&mut cl, &coord_log, 2, 2);
    wait_for(
        "a first checkpoint on the server",
        Duration::from_secs(60),
        || !complete_on_server(&server, "cluster-restart/ck").is_empty(),
    );
    server.kill();
    let before = *complete_on_server(&server, "cluster-restart/ck")
        .last()
        .unwrap();
    wait_log(&coord_log, "aborted", 1);
    assert!(
        coord.try_wait().unwrap().is_none(),
        "the coordinator stopped:\n{}",
        read(&coord_log)
    );
    server.restart();
    // Generous: after the restart the workers' requests back off, and on a loaded machine
    // (two cores running other test binaries) the next checkpoint took over a minute.
    let t0 = std::time::Instant::now();
    while complete_on_server(&server, "cluster-restart/ck")
        .last()
        .is_none_or(|&id| id <= before)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no checkpoint completed in 180 s after the server came back; the coordinator's \
             log:\n{}",
            read(&coord_log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    let log = read(&coord_log);
    assert!(log.contains("aborted"), "{log}");
    check_output_on(&server, &s);
    state_stored_by_workers(&server, "cluster-restart/ck");
}

#[test]
fn a_savepoint_of_a_cluster_on_s3_is_self_contained_and_resumes_exactly() {
    let server = s3::shared();
    let mut s = Scenario::new(30_000, 500, 63);
    s.checkpoints = PathBuf::from(s3::url("cluster-savepoint"));
    let prefix = prefix_of(&s.checkpoints);
    let mut cl = Cluster::new(&s);
    cl.env = server.env();
    cl.workers = 2;
    let (mut coord, coord_log) = cl.coordinator();
    let workers = start_workers(&mut cl, &coord_log, 2, 2);
    wait_for(
        "a checkpoint on the server",
        Duration::from_secs(60),
        || !complete_on_server(server, &prefix).is_empty(),
    );
    let said = weir_cluster_output(&cl.web, &["savepoint", "--stop"]);
    assert!(
        said.status.success(),
        "{}",
        String::from_utf8_lossy(&said.stderr)
    );
    let savepoint = stopped_with_savepoint(&mut coord, &coord_log, workers);
    // On the server: the savepoint's manifest lists only its own objects, all under its
    // prefix (copied there on the server), and the workers' objects of its id are gone.
    let name = savepoint.rsplit('/').next().unwrap().to_string();
    let id: u64 = name.split('-').nth(1).unwrap().parse().unwrap();
    let files = server.files(s3::BUCKET, &format!("{prefix}/{name}"));
    let meta = files
        .iter()
        .find(|f| f.file_name().is_some_and(|n| n == "_metadata"))
        .expect("the savepoint's manifest on the server");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta).unwrap()).unwrap();
    let token = m["objects"].as_str().unwrap();
    let mut listed = 0;
    for f in files_of(&m) {
        listed += 1;
        assert!(
            f.get("objects").is_none() && !f["shared"].as_bool().unwrap_or(false),
            "{f}"
        );
        let object = meta
            .parent()
            .unwrap()
            .join(token)
            .join(f["name"].as_str().unwrap());
        assert!(
            object.is_file(),
            "{} is not on the server",
            object.display()
        );
    }
    assert!(listed > 0);
    assert!(
        server
            .files(s3::BUCKET, &format!("{prefix}/chk-{id:020}"))
            .is_empty(),
        "the workers' objects of savepoint {id} are left"
    );

    // Resumed from the savepoint, the cluster finishes with exact output.
    let (mut coord, coord_log) = cl.coordinator_env(&["--from-savepoint", &savepoint], &[]);
    let workers = start_workers(&mut cl, &coord_log, 2, 2);
    wait_log(&coord_log, "resuming from savepoint", 1);
    expect_success(&mut coord, &coord_log, "the resumed coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}
