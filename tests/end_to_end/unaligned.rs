//! Unaligned checkpoints and aligned checkpoints with a timeout, as a user runs them: a
//! keyed job whose sink is slow, so every channel upstream of it is full. The barriers
//! overtake the queued records, which are stored with the checkpoint (channel state) and
//! replayed on restore; the sink commits exactly once through a failure.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::ids::CheckpointId;
use weir::prelude::*;
use weir_tests::join_within;

const KEYS: u64 = 8;

/// A record: (key, value).
type Rec = (u64, i64);
/// A pre-committed transaction: its checkpoint and records.
type Txn = (u64, Vec<Rec>);
/// Committed transactions by (sink subtask, checkpoint).
type Commits = BTreeMap<(usize, u64), Vec<Rec>>;

/// Emits `(key, 1)` for record numbers `subtask, subtask + parallelism, ...` below `n`,
/// a few per poll; its position is checkpointed.
struct Numbers {
    next: u64,
    n: u64,
    step: u64,
}

impl SourceFunction<(u64, i64)> for Numbers {
    fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> weir::Result<()> {
        // Parallelism 1 throughout these tests: the one position.
        assert_eq!(ctx.parallelism, 1);
        if let Some(s) = states.first() {
            self.next = u64::from_le_bytes(s[..8].try_into().unwrap());
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        for _ in 0..16 {
            if self.next >= self.n {
                return Ok(SourceStatus::Finished);
            }
            out.emit((self.next % KEYS, 1))?;
            self.next += self.step;
        }
        Ok(SourceStatus::More)
    }
    fn snapshot(&mut self) -> weir::Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            self.next.to_le_bytes().to_vec(),
            format!("next {}", self.next),
        )))
    }
}

/// What the transactional test sink committed, per (old subtask, checkpoint): committing
/// the same pre-commit twice (a restore after the notification) is a no-op.
#[derive(Clone, Default)]
struct Committed {
    by_txn: Arc<Mutex<Commits>>,
    /// Records the sink was given, over all attempts (the failure fires on this).
    invoked: Arc<AtomicU64>,
}

impl Committed {
    /// Everything committed, in commit order per key.
    fn per_key(&self) -> BTreeMap<u64, Vec<i64>> {
        let mut m: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for ((_, _), records) in self.by_txn.lock().unwrap().iter() {
            for (k, v) in records {
                m.entry(*k).or_default().push(*v);
            }
        }
        // Transactions of one subtask commit in checkpoint order (the map's order); the
        // sink runs with parallelism 1.
        m
    }
}

/// A two-phase sink: records of a checkpoint are pre-committed at its barrier (kept in
/// the snapshot) and committed when the checkpoint completes, or on restore. It sleeps
/// `delay` per record (a slow database) and fails once after `fail_after` records.
struct TwoPhase {
    out: Committed,
    subtask: usize,
    open: Vec<(u64, i64)>,
    pre: Vec<(u64, Vec<(u64, i64)>)>,
    delay: Duration,
    fail_after: Option<(u64, Arc<AtomicBool>)>,
}

impl TwoPhase {
    fn commit(&self, subtask: usize, id: u64, records: &[(u64, i64)]) {
        self.out
            .by_txn
            .lock()
            .unwrap()
            .entry((subtask, id))
            .or_insert_with(|| records.to_vec());
    }
}

impl SinkFunction<(u64, i64)> for TwoPhase {
    fn restore(
        &mut self,
        _checkpoint: CheckpointId,
        states: &[Vec<u8>],
        _ctx: &SinkContext,
    ) -> weir::Result<()> {
        for s in states {
            let (subtask, pre): (usize, Vec<Txn>) = weir::codec::decode(s)?;
            for (id, records) in pre {
                self.commit(subtask, id, &records);
            }
        }
        Ok(())
    }
    fn open(&mut self, ctx: &SinkContext) -> weir::Result<()> {
        self.subtask = ctx.subtask;
        Ok(())
    }
    fn invoke(&mut self, value: (u64, i64), _ts: Timestamp) -> weir::Result<()> {
        std::thread::sleep(self.delay);
        let seen = self.out.invoked.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((after, fired)) = &self.fail_after
            && seen >= *after
            && !fired.swap(true, Ordering::SeqCst)
        {
            return Err(weir::Error::User("injected failure".into()));
        }
        self.open.push(value);
        Ok(())
    }
    fn snapshot(&mut self, checkpoint: CheckpointId) -> weir::Result<Option<(Vec<u8>, String)>> {
        self.pre
            .push((checkpoint.0, std::mem::take(&mut self.open)));
        let bytes = weir::codec::encode(&(self.subtask, &self.pre))?;
        Ok(Some((bytes, format!("{} pre-committed", self.pre.len()))))
    }
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> weir::Result<()> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pre)
            .into_iter()
            .partition(|(id, _)| *id <= checkpoint.0);
        for (id, records) in done {
            self.commit(self.subtask, id, &records);
        }
        self.pre = keep;
        Ok(())
    }
}

/// The stats of every checkpoint kept in `dir`.
fn manifests(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path().join("_metadata");
        if let Ok(bytes) = std::fs::read(&p) {
            out.push(serde_json::from_slice(&bytes).unwrap());
        }
    }
    out
}

struct Run {
    committed: Committed,
    manifests: Vec<serde_json::Value>,
    result: JobResult,
}

/// The checkpoint configuration of these tests: every 30 ms, all checkpoints kept, a few
/// quick restarts.
fn checkpoints(dir: &std::path::Path, mode: CheckpointMode) -> CheckpointConfig {
    let mut ck = CheckpointConfig::new(dir)
        .interval(Duration::from_millis(30))
        .mode(mode);
    ck.retain = 10_000;
    ck.restart = weir::RestartStrategy::FixedDelay(weir::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(10),
    });
    ck
}

/// `n` records through a keyed running sum into the slow two-phase sink.
fn pipeline(env: &Env, n: u64, out: Committed, fail_after: Option<u64>) {
    let fired = Arc::new(AtomicBool::new(false));
    env.source("numbers", move |_| Numbers {
        next: 0,
        n,
        step: 1,
    })
    .uid("numbers")
    .parallelism(1)
    .key_by(|(k, _)| *k)
    .reduce(|a, b| (a.0, a.1 + b.1))
    .uid("sum")
    .sink("slow", move || TwoPhase {
        out: out.clone(),
        subtask: 0,
        open: Vec::new(),
        pre: Vec::new(),
        delay: Duration::from_micros(300),
        fail_after: fail_after.map(|f| (f, fired.clone())),
    })
    .uid("slow")
    .parallelism(1);
}

/// Runs `pipeline` with the sum at `parallelism` on checkpoints in `dir`.
fn run_in(
    dir: &std::path::Path,
    mode: CheckpointMode,
    n: u64,
    parallelism: usize,
    fail_after: Option<u64>,
    committed: &Committed,
) -> weir::Result<JobResult> {
    let env = Env::new()
        .parallelism(parallelism)
        .exchange(8, 4)
        .checkpoints(checkpoints(dir, mode));
    pipeline(&env, n, committed.clone(), fail_after);
    join_within(env.execute_async("unaligned")?, Duration::from_secs(120))
}

fn run(mode: CheckpointMode, n: u64, parallelism: usize, fail_after: Option<u64>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let result = run_in(dir.path(), mode, n, parallelism, fail_after, &committed).unwrap();
    Run {
        committed,
        manifests: manifests(dir.path()),
        result,
    }
}

/// Every key's running sums, 1 to n / KEYS, each exactly once and in order.
fn assert_exact(committed: &Committed, n: u64) {
    let per_key = committed.per_key();
    assert_eq!(per_key.len() as u64, KEYS);
    for (k, sums) in per_key {
        let want: Vec<i64> = (1..=(n / KEYS) as i64).collect();
        assert_eq!(sums, want, "key {k}: running sums, each exactly once");
    }
}

fn with_channel_state(manifests: &[serde_json::Value]) -> usize {
    manifests
        .iter()
        .filter(|m| m["stats"]["channel_state_bytes"].as_u64().unwrap_or(0) > 0)
        .count()
}

/// Under backpressure the barrier overtakes the records queued for the slow sink: the
/// checkpoints complete with those records as channel state, and the output is exact.
#[test]
fn unaligned_checkpoints_store_the_records_queued_before_a_slow_sink() {
    let n = 4_000;
    let r = run(CheckpointMode::Unaligned, n, 2, None);
    assert_exact(&r.committed, n);
    assert!(r.result.checkpoints_completed >= 2, "{:?}", r.result);
    assert!(
        with_channel_state(&r.manifests) >= 1,
        "some checkpoint holds in-flight records: {:?}",
        r.manifests.iter().map(|m| &m["stats"]).collect::<Vec<_>>()
    );
    assert!(
        r.manifests
            .iter()
            .all(|m| m["stats"]["unaligned"] == true || m["kind"] != "checkpoint"),
        "every checkpoint was taken unaligned"
    );
    // An aligned run keeps no in-flight records.
    let aligned = run(CheckpointMode::Aligned, 1_000, 2, None);
    assert_exact(&aligned.committed, 1_000);
    assert_eq!(with_channel_state(&aligned.manifests), 0);
}

/// The sink fails half-way; the job restarts from the last unaligned checkpoint, replays
/// its in-flight records before new input, and every key's running sums come out once.
#[test]
fn a_failure_restores_the_in_flight_records_exactly_once() {
    let n = 4_000;
    let r = run(CheckpointMode::Unaligned, n, 2, Some(n / 2));
    assert_eq!(r.result.restarts, 1);
    assert_exact(&r.committed, n);
    assert!(with_channel_state(&r.manifests) >= 1);
}

/// Aligned with a short timeout: alignment behind the slow sink takes longer, so the
/// checkpoints go on unaligned and store channel state; exactly once through a failure.
#[test]
fn an_alignment_that_times_out_goes_on_unaligned() {
    let n = 4_000;
    let r = run(
        CheckpointMode::AlignedTimeout(Duration::from_millis(1)),
        n,
        2,
        Some(n / 2),
    );
    assert_eq!(r.result.restarts, 1);
    assert_exact(&r.committed, n);
    assert!(
        r.manifests.iter().any(|m| m["stats"]["unaligned"] == true),
        "some alignment timed out"
    );
}

/// The job fails for good half-way (no restarts left), and a new run at parallelism 3
/// resumes from its last unaligned checkpoint: the in-flight records of the keyed exchange
/// go to the subtasks that own their key groups now, and every key's running sums still
/// come out exactly once, in order.
#[test]
fn in_flight_records_are_redistributed_by_key_group_when_resuming_at_another_parallelism() {
    let n = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let mut ck = checkpoints(dir.path(), CheckpointMode::Unaligned);
    ck.restart = weir::RestartStrategy::None;
    let env = Env::new().parallelism(2).exchange(8, 4).checkpoints(ck);
    pipeline(&env, n, committed.clone(), Some(n / 2));
    let e = join_within(
        env.execute_async("unaligned").unwrap(),
        Duration::from_secs(120),
    )
    .expect_err("the injected failure ends the first run");
    assert!(e.to_string().contains("injected failure"), "{e}");
    assert!(with_channel_state(&manifests(dir.path())) >= 1);
    let r = run_in(
        dir.path(),
        CheckpointMode::Unaligned,
        n,
        3,
        None,
        &committed,
    )
    .unwrap();
    assert_eq!(r.restarts, 0);
    assert_exact(&committed, n);
}

/// A two-input operator (a keyed connect of two sources) under unaligned checkpoints: the
/// channel state of both inputs is captured and replayed, exactly once through a failure.
#[test]
fn a_two_input_operator_restores_the_in_flight_records_of_both_inputs() {
    struct Both;
    impl CoProcessFunction<u64, (u64, i64), (u64, i64), (u64, i64)> for Both {
        fn open(&mut self, _state: &mut StateContext<u64>) -> weir::Result<()> {
            Ok(())
        }
        fn process1(
            &mut self,
            v: (u64, i64),
            ctx: &mut CoContext<'_, u64, (u64, i64)>,
        ) -> weir::Result<()> {
            ctx.emit(v);
            Ok(())
        }
        fn process2(
            &mut self,
            v: (u64, i64),
            ctx: &mut CoContext<'_, u64, (u64, i64)>,
        ) -> weir::Result<()> {
            ctx.emit((v.0 + KEYS, v.1));
            Ok(())
        }
    }
    let n = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let env = Env::new()
        .parallelism(2)
        .exchange(8, 4)
        .checkpoints(checkpoints(dir.path(), CheckpointMode::Unaligned));
    let numbers = |env: &Env, name: &str| {
        env.source(name, move |_| Numbers {
            next: 0,
            n,
            step: 1,
        })
        .uid(name)
        .parallelism(1)
    };
    let a = numbers(&env, "a").key_by(|(k, _)| *k);
    let b = numbers(&env, "b").key_by(|(k, _)| *k);
    let fired = Arc::new(AtomicBool::new(false));
    let out = committed.clone();
    a.connect(&b)
        .process(|| Both)
        .uid("both")
        .key_by(|(k, _)| *k)
        .reduce(|x, y| (x.0, x.1 + y.1))
        .uid("sum")
        .sink("slow", move || TwoPhase {
            out: out.clone(),
            subtask: 0,
            open: Vec::new(),
            pre: Vec::new(),
            delay: Duration::from_micros(300),
            fail_after: Some((n, fired.clone())),
        })
        .uid("slow")
        .parallelism(1);
    let r = join_within(
        env.execute_async("two-inputs").unwrap(),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(r.restarts, 1);
    let per_key = committed.per_key();
    assert_eq!(per_key.len() as u64, 2 * KEYS);
    for (k, sums) in per_key {
        let want: Vec<i64> = (1..=(n / KEYS) as i64).collect();
        assert_eq!(sums, want, "key {k}: running sums, each exactly once");
    }
    assert!(with_channel_state(&manifests(dir.path())) >= 1);
}

/// Two workers of a cluster run the slow keyed job with unaligned checkpoints: the sum's
/// subtasks and the sink run on different workers, so the barriers overtake records
/// queued on the TCP exchange, and the output is exact.
#[test]
fn a_cluster_takes_unaligned_checkpoints_across_the_tcp_exchange() {
    use weir::cluster::{ClusterConfig, join};
    let n = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let address = crate::cluster::free_address();
    let committed = Committed::default();
    let coordinator = Env::new()
        .parallelism(2)
        .exchange(8, 4)
        .checkpoints(checkpoints(dir.path(), CheckpointMode::Unaligned))
        .cluster(ClusterConfig::coordinator(&address, 2, vec![]));
    pipeline(&coordinator, n, committed.clone(), None);
    let coordinator = coordinator.execute_async("unaligned").unwrap();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (address, out, dir) = (address.clone(), committed.clone(), dir.path().to_owned());
            std::thread::spawn(move || {
                let joined = join(&address, 2, Duration::from_secs(30)).expect("join");
                let env = Env::new()
                    .parallelism(2)
                    .exchange(8, 4)
                    .checkpoints(checkpoints(&dir, CheckpointMode::Unaligned))
                    .cluster(ClusterConfig::worker(joined));
                pipeline(&env, n, out, None);
                env.execute("unaligned").expect("the worker's share")
            })
        })
        .collect();
    let r = join_within(coordinator, Duration::from_secs(120)).expect("the cluster job");
    for w in workers {
        w.join().expect("worker thread");
    }
    assert_exact(&committed, n);
    assert!(r.checkpoints_completed >= 2, "{r:?}");
    assert!(
        with_channel_state(&manifests(dir.path())) >= 1,
        "some checkpoint holds in-flight records"
    );
}

/// The exactly-once file sink behind a slow stage, with unaligned checkpoints and a
/// failure: its pre-commit runs at its (early) snapshot, the records it gets after it
/// belong to the next checkpoint, and the committed files hold every running sum once.
#[test]
fn the_exactly_once_file_sink_commits_every_record_once_with_unaligned_checkpoints() {
    let n = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let env = Env::new()
        .parallelism(2)
        .exchange(8, 4)
        .checkpoints(checkpoints(
            &dir.path().join("ck"),
            CheckpointMode::Unaligned,
        ));
    let seen = Arc::new(AtomicU64::new(0));
    let fired = Arc::new(AtomicBool::new(false));
    env.source("numbers", move |_| Numbers {
        next: 0,
        n,
        step: 1,
    })
    .uid("numbers")
    .parallelism(1)
    .key_by(|(k, _)| *k)
    .reduce(|a, b| (a.0, a.1 + b.1))
    .uid("sum")
    .try_map(move |(k, v)| {
        // A slow stage in front of the sink, which fails once half-way.
        std::thread::sleep(Duration::from_micros(300));
        if seen.fetch_add(1, Ordering::SeqCst) + 1 == n / 2 && !fired.swap(true, Ordering::SeqCst) {
            return Err(weir::Error::user("injected failure"));
        }
        Ok((k, v))
    })
    .parallelism(1)
    .write_text_exactly_once(&out, |(k, v)| format!("{k},{v}"))
    .uid("files");
    let r = join_within(
        env.execute_async("files").unwrap(),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(r.restarts, 1);
    let mut per_key: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for f in std::fs::read_dir(&out).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(f.path()).unwrap().lines() {
            let (k, v) = line.split_once(',').unwrap();
            per_key
                .entry(k.parse().unwrap())
                .or_default()
                .push(v.parse().unwrap());
        }
    }
    assert_eq!(per_key.len() as u64, KEYS);
    for (k, mut sums) in per_key {
        sums.sort();
        let want: Vec<i64> = (1..=(n / KEYS) as i64).collect();
        assert_eq!(sums, want, "key {k}: every running sum committed once");
    }
    assert!(with_channel_state(&manifests(&dir.path().join("ck"))) >= 1);
}

/// `GET /v1/checkpoints` shows which checkpoints were taken unaligned and the bytes of
/// in-flight records each stored, the same figure as its manifest.
#[test]
fn the_rest_api_shows_the_in_flight_bytes_of_each_unaligned_checkpoint() {
    let n = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new()
        .parallelism(2)
        .exchange(8, 4)
        .web_address("127.0.0.1:0")
        .checkpoints(checkpoints(dir.path(), CheckpointMode::Unaligned));
    pipeline(&env, n, Committed::default(), None);
    let handle = env.execute_async("rest").unwrap();
    let addr = handle.web_address().expect("the REST API");
    weir_tests::wait_for("the job to end", Duration::from_secs(120), || {
        handle.is_finished()
    });
    let history = weir_tests::rest::get(addr, "/v1/checkpoints")["history"].clone();
    join_within(handle, Duration::from_secs(30)).unwrap();
    let manifests: BTreeMap<u64, serde_json::Value> = manifests(dir.path())
        .into_iter()
        .map(|m| (m["checkpoint_id"].as_u64().unwrap(), m))
        .collect();
    let mut with_state = 0;
    for c in history.as_array().unwrap() {
        if c["status"] != "COMPLETED" {
            continue;
        }
        let id = c["id"].as_u64().unwrap();
        let m = &manifests[&id];
        assert_eq!(c["unaligned"], m["stats"]["unaligned"], "checkpoint {id}");
        assert_eq!(
            c["channel_state_bytes"], m["stats"]["channel_state_bytes"],
            "checkpoint {id}"
        );
        // The final checkpoint is aligned; the others were taken unaligned.
        assert_eq!(c["unaligned"], c["kind"] != "final", "checkpoint {id}: {c}");
        with_state += usize::from(c["channel_state_bytes"].as_u64().unwrap() > 0);
    }
    assert!(with_state >= 1, "{history}");
}
