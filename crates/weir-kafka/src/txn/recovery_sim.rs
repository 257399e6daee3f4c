//! A model of the sink's whole life against a modelled marker log: runs write epochs with
//! [`TxnBook`], barriers pre-commit them (a marker in an open transaction), checkpoint
//! completions commit them, savepoints and failed checkpoints do not, and crashes restore
//! any stored checkpoint — the newest or an older one (a rollback), at another parallelism,
//! under another prefix, after the marker topic was trimmed by retention or deleted and
//! created again, and with a crash in the middle of the restore's re-produce. Each restore
//! uses [`Restore`] as the sink does; the model knows the truth (which transactions
//! committed, which tokens each checkpoint covers) and checks that:
//!
//! - a pending epoch counts as committed only if it committed, is re-produced only if it
//!   did not, and after every restore each of the checkpoint's pending epochs is committed
//!   exactly once (no transaction is ever committed twice: nothing is written twice);
//! - a restore is refused exactly when the log holds committed output of the same lineage
//!   that the checkpoint does not cover, and accepted output is reported.

use super::*;
use std::collections::BTreeMap;

/// One record of a modelled marker topic (one partition).
#[derive(Debug, Clone)]
struct LogMarker {
    key: String,
    value: MarkerValue,
    committed: bool,
    /// The fresh start whose lineage wrote it (the model's truth, not the sink's tokens).
    generation: u32,
}

#[derive(Debug, Default, Clone)]
struct Log {
    /// Offset of `records[0]`.
    low: i64,
    records: Vec<LogMarker>,
}

impl Log {
    fn high(&self) -> i64 {
        self.low + self.records.len() as i64
    }
    fn at(&self, o: i64) -> Option<&LogMarker> {
        (o >= self.low).then(|| self.records.get((o - self.low) as usize))?
    }
}

#[derive(Debug, Clone)]
struct Stored {
    id: u64,
    snaps: Vec<SinkSnapshot>,
    /// Tokens of every epoch pre-committed in this checkpoint's history.
    covered: BTreeSet<u64>,
    generation: u32,
}

struct Run {
    books: Vec<TxnBook>,
    parallelism: u32,
    identity: SinkIdentity,
    next_id: u64,
    covered: BTreeSet<u64>,
    generation: u32,
    /// The newest checkpoint (not savepoint) of this run, for notifications.
    to_notify: Option<u64>,
}

struct Model {
    logs: BTreeMap<String, Log>,
    stored: Vec<Stored>,
    /// Committed markers per token.
    commits: BTreeMap<u64, u32>,
    run: Run,
    runs: u64,
    generations: u32,
    restores: u32,
    refusals: u32,
    /// Copies of markers restores wrote (their ids).
    copies: u64,
    asked_output: u32,
}

#[derive(Debug, Clone)]
enum Op {
    Write { subtask: u32, records: u8 },
    Barrier { kind: u8 },
    Notify { mask: u8 },
    Crash(Crash),
}

#[derive(Debug, Clone)]
struct Crash {
    /// 0: newest stored; otherwise an older one (a rollback), if any.
    back: u8,
    parallelism: u32,
    rename: bool,
    accept_newer: bool,
    /// 0: nothing, 1: trim the marker topics to their end, 2: delete and create them again.
    damage: u8,
    crash_in_replay: bool,
    fresh: bool,
}

fn op() -> impl Strategy<Value = Op> {
    let crash = (
        0u8..3,
        1u32..4,
        prop::bool::weighted(0.3),
        any::<bool>(),
        prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(back, parallelism, rename, accept_newer, damage, crash_in_replay, fresh)| Crash {
                back,
                parallelism,
                rename,
                accept_newer,
                damage,
                crash_in_replay,
                fresh,
            },
        );
    prop_oneof![
        6 => (0u32..3, 1u8..3).prop_map(|(subtask, records)| Op::Write { subtask, records }),
        4 => (0u8..3).prop_map(|kind| Op::Barrier { kind }),
        3 => any::<u8>().prop_map(|mask| Op::Notify { mask }),
        2 => crash.prop_map(Op::Crash),
    ]
}

fn identity(prefix: &str) -> SinkIdentity {
    SinkIdentity {
        prefix: prefix.into(),
        marker_topic: format!("m.{prefix}"),
        topic: "out".into(),
    }
}

impl Model {
    fn new() -> Self {
        let mut m = Model {
            logs: BTreeMap::new(),
            stored: Vec::new(),
            commits: BTreeMap::new(),
            run: Run {
                books: Vec::new(),
                parallelism: 1,
                identity: identity("p0"),
                next_id: 1,
                covered: BTreeSet::new(),
                generation: 0,
                to_notify: None,
            },
            runs: 0,
            generations: 0,
            restores: 0,
            refusals: 0,
            copies: 0,
            asked_output: 0,
        };
        m.fresh_start(2, identity("p0"));
        m
    }

    fn book(
        &mut self,
        subtask: u32,
        identity: &SinkIdentity,
        lineage: u64,
        tokens: &[u64],
    ) -> TxnBook {
        self.runs += 1;
        TxnBook::new(subtask, 2)
            .with_run_id(self.runs << 32 | u64::from(subtask) << 20)
            .with_max_pool(2 + 2)
            .with_identity(identity.clone(), lineage, tokens)
    }

    fn fresh_start(&mut self, parallelism: u32, identity: SinkIdentity) {
        self.generations += 1;
        let g = self.generations;
        let books = (0..parallelism)
            .map(|s| {
                let t = u64::from(g) * 1000 + u64::from(s) + 1;
                self.book(s, &identity, t, &[])
            })
            .collect();
        self.run = Run {
            books,
            parallelism,
            identity,
            next_id: 1,
            covered: BTreeSet::new(),
            generation: g,
            to_notify: None,
        };
    }

    fn append(&mut self, topic: &str, m: LogMarker) -> i64 {
        let log = self.logs.entry(topic.to_string()).or_default();
        log.records.push(m);
        log.high() - 1
    }

    fn commit_marker(&mut self, topic: &str, offset: i64, token: u64) {
        let log = self.logs.get_mut(topic).expect("marker topic");
        let i = (offset - log.low) as usize;
        assert!(!log.records[i].committed);
        log.records[i].committed = true;
        *self.commits.entry(token).or_default() += 1;
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write { subtask, records } => {
                let p = self.run.parallelism;
                let book = &mut self.run.books[(subtask % p) as usize];
                if book.begin().is_err() {
                    // pool exhausted: the job fails; model it as no write
                    return Ok(());
                }
                for _ in 0..*records {
                    book.next_seq().unwrap();
                }
                book.delivered(0, 0);
            }
            Op::Barrier { kind } => {
                let id = self.run.next_id;
                self.run.next_id += 1;
                let topic = self.run.identity.marker_topic.clone();
                for s in 0..self.run.books.len() {
                    let b = &self.run.books[s];
                    let (Some(token), true) = (b.open_token(), b.open_records() > 0) else {
                        continue;
                    };
                    let value = MarkerValue::Closes {
                        lineage: b.lineage_token(),
                        subtask: s as u32,
                        epoch: id,
                        token,
                        copy: 0,
                    };
                    let key = self.run.identity.marker_key(s as u32);
                    let g = self.run.generation;
                    let o = self.append(
                        &topic,
                        LogMarker {
                            key,
                            value,
                            committed: false,
                            generation: g,
                        },
                    );
                    self.run.books[s].precommit(id, (0, o)).unwrap();
                    self.run.covered.insert(token);
                }
                // 0: checkpoint, 1: savepoint (never notified), 2: failed (not stored)
                if *kind < 2 {
                    let snaps = self
                        .run
                        .books
                        .iter()
                        .map(|b| b.snapshot(self.run.parallelism))
                        .collect();
                    self.stored.push(Stored {
                        id,
                        snaps,
                        covered: self.run.covered.clone(),
                        generation: self.run.generation,
                    });
                }
                if *kind == 0 {
                    self.run.to_notify = Some(id);
                }
            }
            Op::Notify { mask } => {
                let Some(id) = self.run.to_notify else {
                    return Ok(());
                };
                let topic = self.run.identity.marker_topic.clone();
                for s in 0..self.run.books.len() {
                    if mask & (1 << s) == 0 {
                        continue;
                    }
                    for (_, e) in self.run.books[s].complete(id) {
                        let p = self.run.books[s]
                            .pending()
                            .find(|p| p.epoch == e)
                            .cloned()
                            .unwrap();
                        self.commit_marker(&topic, p.marker.1, p.token);
                        self.run.books[s].committed(e).unwrap();
                    }
                }
            }
            Op::Crash(c) => self.crash(c)?,
        }
        Ok(())
    }

    fn crash(&mut self, c: &Crash) -> Result<(), TestCaseError> {
        // Open and pre-committed transactions of the crashed run stay uncommitted: the
        // restore fences them (aborted).
        let identity = if c.rename {
            let next = if self.run.identity.prefix == "p0" {
                "p1"
            } else {
                "p0"
            };
            identity(next)
        } else {
            self.run.identity.clone()
        };
        let newest = self.stored.len();
        if c.fresh || newest == 0 {
            self.fresh_start(c.parallelism, identity);
            return Ok(());
        }
        let pick = newest - 1 - (c.back as usize).min(newest - 1);
        let ck = self.stored[pick].clone();
        match c.damage {
            1 => {
                for log in self.logs.values_mut() {
                    log.low += log.records.len() as i64;
                    log.records.clear();
                }
            }
            2 => {
                for log in self.logs.values_mut() {
                    *log = Log::default();
                }
            }
            _ => {}
        }
        let mut accept = c.accept_newer;
        let mut crash_in_replay = c.crash_in_replay;
        loop {
            match self.restore(&ck, c.parallelism, &identity, accept, crash_in_replay)? {
                Restored::Refused => {
                    self.refusals += 1;
                    // the user accepts the duplicates, or restores the newest checkpoint
                    accept = true;
                }
                Restored::CrashedInReplay => crash_in_replay = false,
                Restored::Done(books, accepted) => {
                    self.restores += 1;
                    // the run goes on from the checkpoint, and the output it accepted to
                    // write again counts as its past
                    let mut covered = ck.covered.clone();
                    covered.extend(accepted);
                    self.run = Run {
                        books,
                        parallelism: c.parallelism,
                        identity,
                        // a new checkpoint directory: ids start over above the restored one
                        next_id: ck.id + 1,
                        covered,
                        generation: ck.generation,
                        to_notify: None,
                    };
                    break;
                }
            }
        }
        // every pending epoch of the checkpoint is committed exactly once now
        for s in &ck.snaps {
            for p in &s.pending {
                prop_assert_eq!(
                    self.commits.get(&p.token).copied(),
                    Some(1),
                    "epoch {}",
                    p.epoch
                );
            }
        }
        Ok(())
    }

    fn restore(
        &mut self,
        ck: &Stored,
        parallelism: u32,
        current: &SinkIdentity,
        accept: bool,
        crash_in_replay: bool,
    ) -> Result<Restored, TestCaseError> {
        // What the log holds of the lineage that the checkpoint does not cover, in the
        // partitions the restore reads.
        let read = Restore::new(current.clone(), &ck.snaps, 0, 1, ck.id).marker_topics();
        let uncovered: Vec<u64> = read
            .iter()
            .filter_map(|t| self.logs.get(t))
            .flat_map(|l| l.records.iter())
            .filter(|m| m.committed && m.generation == ck.generation)
            .filter_map(|m| match m.value {
                MarkerValue::Closes { token, .. } if !ck.covered.contains(&token) => Some(token),
                _ => None,
            })
            .collect();
        let mut decisions = Vec::new();
        let mut refused = false;
        for s in 0..parallelism {
            let r = Restore::new(current.clone(), &ck.snaps, s, parallelism, ck.id);
            let mut scanned = BTreeMap::new();
            let partitions = r
                .marker_topics()
                .into_iter()
                .filter(|t| self.logs.contains_key(t))
                .map(|t| (t, vec![0]))
                .collect();
            for ((topic, p), newest) in r.marker_partitions(&partitions) {
                let log = self.logs.get(&topic);
                let exists = log.is_some();
                let log = log.cloned().unwrap_or_default();
                let at = newest
                    .as_ref()
                    .and_then(|n| log.at(n.offset))
                    .map(|m| (m.key.clone().into_bytes(), m.value.encode().into_bytes()));
                let inc = Restore::incarnation(
                    newest.as_ref(),
                    exists,
                    log.low,
                    log.high(),
                    at.as_ref().map(|(k, v)| (&k[..], &v[..])),
                );
                let markers = match r.scan_start(&(topic.clone(), p), inc, log.low) {
                    Some(from) => (from.max(log.low)..log.high())
                        .filter_map(|o| {
                            let m = log.at(o)?;
                            m.committed.then(|| ScannedMarker {
                                offset: o,
                                key: m.key.clone(),
                                value: m.value,
                            })
                        })
                        .collect(),
                    None => Vec::new(),
                };
                scanned.insert(
                    (topic, p),
                    Scanned {
                        incarnation: inc,
                        low: log.low,
                        markers,
                    },
                );
            }
            match r.decide(&scanned, accept) {
                Err(e) => {
                    prop_assert!(!accept);
                    prop_assert!(
                        uncovered.contains(&self.token_at(&e.marker)),
                        "refused {e} but that output is covered (uncovered: {uncovered:?})"
                    );
                    refused = true;
                }
                Ok(d) => {
                    for n in &d.accepted_newer {
                        prop_assert!(uncovered.contains(&self.token_at(&n.marker)));
                    }
                    decisions.push((r, scanned, d));
                }
            }
        }
        let reported: usize = decisions
            .iter()
            .map(|(_, _, d)| d.accepted_newer.len())
            .sum();
        if refused {
            return Ok(Restored::Refused);
        }
        // every uncovered commit is seen by exactly one subtask (its writer's share)
        prop_assert_eq!(reported, if accept { uncovered.len() } else { 0 });
        prop_assert!(
            accept || uncovered.is_empty(),
            "not refused: {:?}",
            uncovered
        );
        let mut books = Vec::new();
        for (r, scanned, d) in decisions {
            let mut replayed = Vec::new();
            for (w, wd) in r.writers.iter().zip(&d.writers) {
                let mut replay = wd.replay.clone();
                for e in &wd.committed {
                    let t = w.pending.iter().find(|p| p.epoch == *e).unwrap().token;
                    prop_assert!(self.commits.contains_key(&t), "epoch {} did not commit", e);
                }
                for e in &replay {
                    prop_assert!(
                        !self.commits.contains_key(&e.token),
                        "epoch {} committed",
                        e.epoch
                    );
                }
                for (e, _) in &wd.ask_output {
                    self.asked_output += 1;
                    // the output's records carry the token: the model's truth
                    if !self.commits.contains_key(&e.token) {
                        replay.push(e.clone());
                    }
                }
                replay.sort_by_key(|e| e.epoch);
                for e in replay {
                    self.copies += 1;
                    let copy = self.copies;
                    let value = MarkerValue::Closes {
                        lineage: w.lineage_token,
                        subtask: w.subtask,
                        epoch: e.epoch,
                        token: e.token,
                        copy,
                    };
                    let topic = w.identity.marker_topic.clone();
                    let o = self.append(
                        &topic,
                        LogMarker {
                            key: w.identity.marker_key(w.subtask),
                            value,
                            committed: false,
                            generation: ck.generation,
                        },
                    );
                    if crash_in_replay {
                        return Ok(Restored::CrashedInReplay);
                    }
                    self.commit_marker(&topic, o, e.token);
                    replayed.push(KnownMarker {
                        topic,
                        partition: 0,
                        key: w.identity.marker_key(w.subtask),
                        subtask: w.subtask,
                        offset: o,
                        token: Some(e.token),
                        copy,
                    });
                }
            }
            let carry = r.carry(&scanned, &d, replayed);
            let lineage = r.lineage_token(9999);
            let mut b = self.book(r.subtask, current, lineage, &r.lineage_tokens);
            b = b.carry(carry);
            books.push(b);
        }
        Ok(Restored::Done(
            books,
            if accept { uncovered } else { vec![] },
        ))
    }

    fn token_at(&self, (topic, _, offset): &(String, i32, i64)) -> u64 {
        match self.logs[topic].at(*offset).map(|m| m.value) {
            Some(MarkerValue::Closes { token, .. }) => token,
            other => panic!("no marker at {topic}/{offset}: {other:?}"),
        }
    }
}

enum Restored {
    Refused,
    CrashedInReplay,
    Done(Vec<TxnBook>, Vec<u64>),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn lifecycles_commit_every_epoch_once_and_refuse_exactly_uncovered_output(
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut m = Model::new();
        for op in &ops {
            m.apply(op)?;
        }
        // no transaction was ever committed twice
        for (token, n) in &m.commits {
            prop_assert_eq!(*n, 1, "token {} committed {} times", token, n);
        }
    }
}

/// The simulation reaches the interesting cases (a check that the generator is not
/// degenerate): rollbacks refused, markers gone so that the output decides, restores
/// after all of it.
#[test]
fn the_simulation_reaches_refusals_lost_markers_and_restores() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut restores, mut refusals, mut asked) = (0, 0, 0);
    for _ in 0..200 {
        let ops = prop::collection::vec(op(), 1..120)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let mut m = Model::new();
        for op in &ops {
            m.apply(op).unwrap();
        }
        restores += m.restores;
        refusals += m.refusals;
        asked += m.asked_output;
    }
    assert!(restores > 200, "{restores} restores");
    assert!(refusals > 20, "{refusals} refusals");
    assert!(asked > 20, "{asked} epochs decided by the output");
}
