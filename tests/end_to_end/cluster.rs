//! Cluster mode inside one test process: a coordinator and workers, each with its own
//! pipeline built the same way, talking over real TCP on loopback. Records, watermarks
//! and end-of-input cross between workers; a worker with another graph, an unreachable
//! coordinator and invalid settings get clear errors. (Killing real processes is in the
//! chaos tests.)

use std::time::Duration;
use weir::cluster::{ClusterConfig, Credentials, join, join_with};
use weir::prelude::*;
use weir_tests::{Stamped, event_time, join_within, kv};

/// A free loopback address for a coordinator, below the ephemeral range (32768 and up on
/// Linux): an address picked by binding port 0 can be handed to another test's worker,
/// which binds its data port to port 0, before the coordinator binds it.
pub(crate) fn free_address() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = (std::process::id() % 800) * 15;
    loop {
        let port = (20_000 + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
}

fn at(k: &str, v: i64, ts: Timestamp) -> ((String, i64), Timestamp) {
    (kv(k, v), ts)
}

/// Tumbling event-time sums at parallelism 2; the window operator's subtasks run on
/// different workers, so watermarks must cross processes for any window to fire.
pub(crate) fn windowed_sums(env: &Env) -> Stamped<(String, i64)> {
    let input = vec![
        at("a", 1, 1),
        at("a", 2, 5),
        at("b", 10, 3),
        at("c", 7, 4),
        at("a", 3, 12),
        at("b", 20, 11),
        at("c", 8, 15),
        at("a", 5, 14),
        at("b", 30, 25),
        at("c", 9, 27),
    ];
    let sums = event_time(env, input, 2)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::tumbling(10))
        .reduce(|a, b| (a.0, a.1 + b.1));
    Stamped::attach(&sums)
}

/// The windows `windowed_sums` closes: what the cluster must produce, whichever worker
/// runs which subtask.
pub(crate) fn windowed_expected() -> Windowed {
    vec![
        (kv("a", 3), 9),
        (kv("a", 8), 19),
        (kv("b", 10), 9),
        (kv("b", 20), 19),
        (kv("b", 30), 29),
        (kv("c", 7), 9),
        (kv("c", 8), 19),
        (kv("c", 9), 29),
    ]
}

/// A window's output: (key, sum) and the window's end.
pub(crate) type Windowed = Vec<((String, i64), Timestamp)>;

type WorkerThread = std::thread::JoinHandle<(Windowed, JobResult)>;

/// One worker thread of one slot per entry of `credentials`, each joining the coordinator
/// of `windowed_sums` at `address` and running its share.
pub(crate) fn spawn_windowed_workers(
    address: &str,
    credentials: Vec<Credentials>,
) -> Vec<WorkerThread> {
    credentials
        .into_iter()
        .map(|c| {
            let address = address.to_string();
            std::thread::spawn(move || {
                let joined = join_with(&address, 1, Duration::from_secs(30), c).expect("join");
                assert_eq!(joined.args(), ["windowed".to_string()]);
                let env = Env::new()
                    .parallelism(2)
                    .cluster(ClusterConfig::worker(joined));
                let out = windowed_sums(&env);
                let result = env.execute("windowed").expect("the worker's share");
                (out.values(), result)
            })
        })
        .collect()
}

/// The workers' output, sorted, and how many non-source tasks they ran.
pub(crate) fn windowed_output(workers: Vec<WorkerThread>) -> (Windowed, usize) {
    let mut got = Vec::new();
    let mut sink_tasks = 0;
    for w in workers {
        let (values, result) = w.join().expect("worker thread");
        got.extend(values);
        sink_tasks += result.tasks.iter().filter(|t| !t.is_source).count();
    }
    got.sort();
    (got, sink_tasks)
}

#[test]
fn two_workers_run_windows_across_processes_with_the_same_output() {
    let address = free_address();
    let coordinator = Env::new()
        .parallelism(2)
        .cluster(ClusterConfig::coordinator(
            &address,
            2,
            vec!["windowed".into()],
        ));
    let _ = windowed_sums(&coordinator);
    let coordinator = coordinator
        .execute_async("windowed")
        .expect("start the coordinator");
    let workers = spawn_windowed_workers(&address, vec![Credentials::default(); 2]);
    join_within(coordinator, Duration::from_secs(60)).expect("the cluster job");
    let (got, sink_tasks) = windowed_output(workers);
    assert_eq!(got, windowed_expected());
    // Two window subtasks, one per worker.
    assert_eq!(sink_tasks, 2);
}

/// Starts a coordinator of job "job" (`build`'s pipeline, parallelism 1) that waits for
/// one worker, and joins it: the worker's environment, its pipeline still to build.
fn coordinator_and_worker(address: &str, build: impl Fn(&Env)) -> (JobHandle, Env) {
    let coordinator = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .cluster(ClusterConfig::coordinator(address, 1, vec![]));
    build(&coordinator);
    let handle = coordinator
        .execute_async("job")
        .expect("start the coordinator");
    let joined = join(address, 1, Duration::from_secs(30)).expect("join");
    let env = Env::new()
        .parallelism(1)
        .cluster(ClusterConfig::worker(joined));
    (handle, env)
}

/// A job that never ends on its own: running sums of an endless count.
pub(crate) fn endless(env: &Env) {
    env.from_iter(0u64..)
        .key_by(|x| x % 7)
        .reduce(|a, b| a.wrapping_add(b))
        .for_each(|| |_, _| Ok(()));
}

#[test]
fn a_cancelled_worker_leaves_and_the_coordinator_sees_it_lost() {
    let address = free_address();
    let (coordinator, env) = coordinator_and_worker(&address, endless);
    endless(&env);
    let worker = env.execute_async("job").expect("start the worker");
    // Cancel once the worker runs its tasks, as the coordinator's REST API shows them.
    let web = coordinator
        .web_address()
        .expect("the coordinator serves the API");
    weir_tests::wait_for("the worker's tasks", Duration::from_secs(30), || {
        let cluster = weir_tests::rest::get(web, "/v1/job")["cluster"].clone();
        cluster["phase"] == "running" && cluster["workers"][0]["tasks"].as_u64() > Some(0)
    });
    // An administration tool of an earlier version, which sent its requests to the
    // cluster port, is told where they go now.
    let answer = json_request(&address, &serde_json::json!({"request": "cancel"}));
    assert_eq!(answer["ok"], false);
    let message = answer["message"].as_str().expect("a message");
    assert!(
        message.contains("start it with --web HOST:PORT"),
        "{message}"
    );
    worker.cancel();
    let e = join_within(worker, Duration::from_secs(30)).expect_err("cancelled");
    assert!(matches!(e, weir::Error::Cancelled), "{e}");
    // Without checkpoints the job cannot restart: losing its only worker fails it.
    let e = join_within(coordinator, Duration::from_secs(30)).expect_err("the job lost its worker");
    assert!(e.to_string().contains("was lost"), "{e}");
}

#[test]
fn a_worker_that_builds_another_graph_is_refused() {
    let address = free_address();
    let (handle, env) = coordinator_and_worker(&address, |env| {
        let _ = windowed_sums(env);
    });
    env.from_collection(vec![1, 2, 3]).map(|x| x * 2).collect();
    let e = env
        .execute("job")
        .expect_err("a different graph must be refused");
    assert!(
        e.to_string()
            .contains("built a different job graph than the coordinator"),
        "{e}"
    );
    handle.cancel();
    let e = join_within(handle, Duration::from_secs(30)).expect_err("cancelled");
    assert!(matches!(e, weir::Error::Cancelled), "{e}");
}

#[test]
fn an_unreachable_coordinator_is_reported_with_its_address() {
    let address = free_address();
    let e = join(&address, 1, Duration::from_millis(200)).expect_err("nobody listens");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "cannot reach the coordinator at {address} within 200 ms"
        )),
        "{msg}"
    );
}

#[test]
fn a_port_that_accepts_but_never_answers_is_not_waited_on_forever() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let e = join(&address, 1, Duration::from_millis(200)).expect_err("no answer");
    assert!(
        e.to_string()
            .contains("accepted the connection but did not answer as a weir coordinator"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(silent);
}

#[test]
fn invalid_cluster_settings_are_refused() {
    let mut c = ClusterConfig::coordinator("127.0.0.1:0", 1, vec![]);
    c.heartbeat_timeout = c.heartbeat_interval;
    let env = Env::new().cluster(c);
    env.from_collection(vec![1]).collect();
    let e = env
        .execute("bad")
        .expect_err("timeout below twice the interval");
    assert!(
        e.to_string()
            .contains("must be at least twice the heartbeat interval"),
        "{e}"
    );

    let env = Env::new().cluster(ClusterConfig::coordinator("127.0.0.1:0", 0, vec![]));
    env.from_collection(vec![1]).collect();
    let e = env.execute("bad").expect_err("no workers");
    assert!(e.to_string().contains("at least 1 worker"), "{e}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let env = Env::new().cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    env.from_collection(vec![1]).collect();
    let e = env.execute("bad").expect_err("the port is taken");
    assert!(
        e.to_string()
            .contains(&format!("the coordinator cannot listen on {address}")),
        "{e}"
    );
}

/// Sends one JSON frame (`J` + JSON, length-prefixed) to a cluster port and reads the
/// JSON answer: what `weir cluster` sent before it moved to the REST API.
fn json_request(address: &str, request: &serde_json::Value) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(address).expect("connect to the cluster port");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut body = vec![b'J'];
    body.extend_from_slice(request.to_string().as_bytes());
    c.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    c.write_all(&body).unwrap();
    let mut len = [0u8; 4];
    c.read_exact(&mut len).expect("an answer");
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    c.read_exact(&mut answer).expect("the answer's body");
    assert_eq!(answer.first(), Some(&b'J'), "a JSON answer");
    serde_json::from_slice(&answer[1..]).expect("JSON")
}
