//! A transactional sink that is slow per record, behind a backlog of queued records, with
//! short checkpoint intervals: each checkpoint's completion reaches the sink promptly (the
//! batch it is writing pauses for it), so the transactions it holds pre-committed and
//! waiting for their checkpoint to complete stay few. A Kafka sink holds a transactional
//! producer for each of them from a pool of five; it must never run out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::ids::CheckpointId;
use weir::prelude::*;
use weir_tests::join_within;

const KEYS: u64 = 8;

/// A pre-committed transaction: its checkpoint, its records, and how many records the sink
/// had written when it was taken.
type Txn = (u64, Vec<(u64, i64)>, usize);

/// Emits `(record number % KEYS, 1)` for record numbers below `n`, a few per poll.
struct Numbers {
    next: u64,
    n: u64,
}

impl SourceFunction<(u64, i64)> for Numbers {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        for _ in 0..16 {
            if self.next >= self.n {
                return Ok(SourceStatus::Finished);
            }
            out.emit((self.next % KEYS, 1))?;
            self.next += 1;
        }
        Ok(SourceStatus::More)
    }
}

/// What the sink saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// Committed records in commit order.
    committed: Vec<(u64, i64)>,
    /// Per snapshot: the checkpoint and how many transactions were pre-committed and not
    /// yet committed right after it (its own included).
    holding: Vec<(u64, usize)>,
    /// Per completion notification: the checkpoint and how many records the sink had
    /// written since that checkpoint's snapshot (how far into later batches it came).
    completed_after: Vec<(u64, usize)>,
}

/// A two-phase sink sleeping `delay` per record: the records since the last snapshot are
/// pre-committed at a checkpoint and committed when it completes.
struct SlowTransactions {
    seen: Arc<Mutex<Seen>>,
    delay: Duration,
    open: Vec<(u64, i64)>,
    pre: Vec<Txn>,
    written: usize,
}

impl SinkFunction<(u64, i64)> for SlowTransactions {
    fn invoke(&mut self, value: (u64, i64), _ts: Timestamp) -> weir::Result<()> {
        std::thread::sleep(self.delay);
        self.open.push(value);
        self.written += 1;
        Ok(())
    }
    fn snapshot(&mut self, checkpoint: CheckpointId) -> weir::Result<Option<(Vec<u8>, String)>> {
        self.pre
            .push((checkpoint.0, std::mem::take(&mut self.open), self.written));
        let mut seen = self.seen.lock().unwrap();
        seen.holding.push((checkpoint.0, self.pre.len()));
        Ok(None)
    }
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> weir::Result<()> {
        let mut seen = self.seen.lock().unwrap();
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pre)
            .into_iter()
            .partition(|(id, _, _)| *id <= checkpoint.0);
        for (id, records, written) in done {
            if id == checkpoint.0 {
                seen.completed_after.push((id, self.written - written));
            }
            seen.committed.extend(records);
        }
        self.pre = keep;
        Ok(())
    }
}

/// `n` records through a keyed running sum (parallelism 2) into the slow sink
/// (parallelism 1), checkpointed every 20 ms in `mode`.
fn run(mode: CheckpointMode, n: u64) -> (Seen, JobResult) {
    let dir = tempfile::tempdir().unwrap();
    let mut ck = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(20))
        .mode(mode);
    ck.restart = weir::RestartStrategy::None;
    let env = Env::new().parallelism(2).checkpoints(ck);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    env.source("numbers", move |_| Numbers { next: 0, n })
        .uid("numbers")
        .parallelism(1)
        .key_by(|(k, _)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("sum")
        .sink("slow", move || SlowTransactions {
            seen: out.clone(),
            delay: Duration::from_micros(200),
            open: Vec::new(),
            pre: Vec::new(),
            written: 0,
        })
        .uid("slow")
        .parallelism(1);
    let result = join_within(
        env.execute_async("slow-transactions").unwrap(),
        Duration::from_secs(120),
    )
    .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (seen, result)
}

/// Every key's running sums 1..=n/KEYS, each once, in order; and at no snapshot did the
/// sink hold more than two transactions waiting for their checkpoints (the checkpoint
/// before it may complete while its barrier travels; the one before that never).
fn check(mode: CheckpointMode) {
    let n = 12_000;
    let (seen, result) = run(mode, n);
    let mut per_key: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for (k, v) in &seen.committed {
        per_key.entry(*k).or_default().push(*v);
    }
    assert_eq!(per_key.len() as u64, KEYS);
    for (k, sums) in per_key {
        let want: Vec<i64> = (1..=(n / KEYS) as i64).collect();
        assert_eq!(
            sums, want,
            "{mode:?}: key {k}: running sums, each committed once"
        );
    }
    // The sink takes ~2.4 s for its records: many checkpoints ran while it had a backlog.
    assert!(
        result.checkpoints_completed >= 10,
        "{mode:?}: only {} checkpoints completed",
        result.checkpoints_completed
    );
    let most = seen.holding.iter().map(|(_, h)| *h).max().unwrap_or(0);
    eprintln!(
        "{mode:?}: {} checkpoints; the sink held at most {most} transactions at a snapshot",
        result.checkpoints_completed
    );
    assert!(
        most <= 2,
        "{mode:?}: the sink held up to {most} transactions waiting for completed checkpoints \
         (checkpoint, held): {:?}; records it wrote between each snapshot and its \
         completion: {:?}",
        seen.holding,
        seen.completed_after
    );
}

#[test]
fn unaligned_checkpoint_completions_reach_a_slow_sink_between_its_records() {
    check(CheckpointMode::Unaligned);
}
