//! On restore, by identity rather than by checkpoint id: which transactional ids to fence;
//! which pending epochs committed (a committed marker closing the epoch's transaction
//! token), which must be written again, and which only the output itself can tell; and
//! whether the log holds output of the sink's lineage that the restored checkpoint does not
//! cover (restoring it would write that output twice).
//!
//! The sink does the reading (`sink/recovery.rs`): for every marker partition it reports
//! the watermarks and the record at the newest recorded offset ([`Restore::incarnation`]),
//! then the committed markers from [`Restore::scan_start`] to the end; [`Restore::decide`]
//! does the rest.

use super::marker::MarkerValue;
use super::snapshot::{KnownMarker, PendingEpoch, Registered, SinkIdentity, SinkSnapshot};
use super::transactional_id;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A partition of a marker topic.
pub type MarkerPartition = (String, i32);

/// A restored subtask (writer) whose pending epochs this subtask finishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterRecovery {
    /// Its subtask index in the restored run (its marker key and record headers name it).
    pub subtask: u32,
    /// The sink that wrote it.
    pub identity: SinkIdentity,
    /// The lineage token its markers carry (0 for a version-1 snapshot).
    pub lineage_token: u64,
    /// From a version-1 snapshot: its markers name only checkpoint ids.
    pub legacy: bool,
    /// Its pending epochs, oldest first.
    pub pending: Vec<PendingEpoch>,
}

/// What the record at a recorded marker offset must be for the partition to be the one
/// the checkpoint saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The offset.
    pub offset: i64,
    /// The marker key.
    pub key: String,
    /// The transaction the marker closes (`None`: version 1, the key must match).
    pub token: Option<u64>,
    /// Which copy of the marker it is (0: the epoch's own).
    pub copy: u64,
    /// For a version-1 pending epoch: the checkpoint id its legacy marker names.
    pub legacy_epoch: Option<u64>,
}

impl Recorded {
    /// True when `key`/`value`, read at [`Recorded::offset`], is this marker.
    pub fn matches(&self, key: &[u8], value: &[u8]) -> bool {
        if key != self.key.as_bytes() {
            return false;
        }
        match (MarkerValue::parse(value), self.token, self.legacy_epoch) {
            (_, None, None) => true,
            (Some(MarkerValue::Legacy { epoch }), _, Some(e)) => epoch == e,
            (Some(MarkerValue::Closes { token, copy, .. }), Some(t), _) => {
                token == t && copy == self.copy
            }
            _ => false,
        }
    }
}

/// What became of a marker partition since the checkpoint recorded markers in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incarnation {
    /// The newest recorded marker is in place: offsets compare, nothing after it is missing.
    Intact,
    /// Retention removed every recorded marker (the partition starts after them): offsets
    /// still compare, but the epochs' own markers are gone.
    Trimmed,
    /// The newest recorded marker is not there (the topic was deleted and created again):
    /// offsets do not compare.
    Replaced,
    /// The partition does not exist.
    Missing,
    /// The checkpoint recorded no marker in it.
    Unrecorded,
}

/// Committed markers read from one partition, with what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// See [`Restore::incarnation`].
    pub incarnation: Incarnation,
    /// Where the partition starts now.
    pub low: i64,
    /// Committed markers from [`Restore::scan_start`] on, in offset order (unreadable
    /// values left out).
    pub markers: Vec<ScannedMarker>,
}

/// One committed marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedMarker {
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: MarkerValue,
}

/// What a restore does with one writer's pending epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterDecision {
    /// The writer.
    pub subtask: u32,
    /// Epochs a committed marker closes: nothing to do.
    pub committed: Vec<u64>,
    /// The newest committed marker closing each of them (a re-produced epoch's marker is
    /// after its own): the new run knows them.
    pub closed_by: Vec<KnownMarker>,
    /// Epochs that did not commit: write these again, in this order.
    pub replay: Vec<PendingEpoch>,
    /// Epochs the markers cannot tell about, and why: ask the output (its records carry
    /// the token) whether they committed.
    pub ask_output: Vec<(PendingEpoch, String)>,
}

/// The decision of a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Per writer taken over, in writer order.
    pub writers: Vec<WriterDecision>,
    /// Output the checkpoint does not cover, accepted by configuration (empty otherwise).
    pub accepted_newer: Vec<NewerCommit>,
}

/// The log holds output of the sink's lineage committed after the restored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerCommit {
    /// The subtask that committed it.
    pub subtask: u32,
    /// The checkpoint its marker names.
    pub epoch: u64,
    /// Where its marker is.
    pub marker: (String, i32, i64),
    /// The marker's key.
    pub key: String,
    /// The transaction it closes (`None`: a legacy marker).
    pub token: Option<u64>,
    /// Which copy of the marker it is.
    pub copy: u64,
    /// The checkpoint being restored.
    pub checkpoint: u64,
}

impl fmt::Display for NewerCommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (topic, p, o) = &self.marker;
        write!(
            f,
            "the Kafka sink's commit markers show that subtask {} already committed the output \
             of checkpoint {} (marker {topic}/{p} at offset {o}), which checkpoint {} being \
             restored does not cover: a newer checkpoint was lost or deleted, or an older \
             savepoint or checkpoint is being restored. Resuming would write that output \
             twice. Restore the newest checkpoint, or accept the duplicates explicitly with the \
             sink's accept_newer_commits_on_restore()",
            self.subtask, self.epoch, self.checkpoint
        )
    }
}

impl std::error::Error for NewerCommit {}

/// A restore of one sink subtask from the snapshots of every subtask of the restored run.
#[derive(Debug, Clone)]
pub struct Restore {
    /// The checkpoint restored.
    pub checkpoint: u64,
    /// This subtask.
    pub subtask: u32,
    /// This run's parallelism.
    pub parallelism: u32,
    /// This run's sink.
    pub current: SinkIdentity,
    /// Every lineage token of the restored sink (sorted).
    pub lineage_tokens: Vec<u64>,
    /// The writers this subtask takes over (`writer % parallelism == subtask`).
    pub writers: Vec<WriterRecovery>,
    /// Per marker partition, the markers the checkpoint recorded (known and pending).
    recorded: BTreeMap<MarkerPartition, Vec<Recorded>>,
    /// Per marker partition and key, the newest recorded offset.
    newest: BTreeMap<(MarkerPartition, String), i64>,
    /// Every known marker of every snapshot.
    known: Vec<KnownMarker>,
    /// The marker topics of this run and of every snapshot's sink.
    topics: BTreeSet<String>,
    /// Tokens of every pending epoch of every snapshot.
    pending_tokens: BTreeSet<u64>,
    /// Prefixes of version-1 snapshots (their legacy markers are checked as before).
    legacy_prefixes: BTreeSet<String>,
    /// Per prefix of a snapshot: the largest parallelism and pool of its runs.
    runs: BTreeMap<String, Registered>,
}

impl Restore {
    /// The restore of `subtask` of `parallelism` (sink `current`) from checkpoint
    /// `checkpoint`'s `snapshots`.
    pub fn new(
        current: SinkIdentity,
        snapshots: &[SinkSnapshot],
        subtask: u32,
        parallelism: u32,
        checkpoint: u64,
    ) -> Self {
        let parallelism = parallelism.max(1);
        let mut r = Restore {
            checkpoint,
            subtask,
            parallelism,
            current,
            lineage_tokens: Vec::new(),
            writers: Vec::new(),
            recorded: BTreeMap::new(),
            newest: BTreeMap::new(),
            known: Vec::new(),
            topics: BTreeSet::new(),
            pending_tokens: BTreeSet::new(),
            legacy_prefixes: BTreeSet::new(),
            runs: BTreeMap::new(),
        };
        let mut writers: BTreeMap<(String, u32), WriterRecovery> = BTreeMap::new();
        r.topics.insert(r.current.marker_topic.clone());
        for s in snapshots {
            r.topics.insert(s.identity.marker_topic.clone());
            let legacy = s.version == 1;
            if legacy {
                r.legacy_prefixes.insert(s.identity.prefix.clone());
            }
            r.lineage_tokens.extend(s.lineage_tokens.iter().copied());
            let run = r.runs.entry(s.identity.prefix.clone()).or_default();
            *run = run.max(Registered {
                parallelism: s.parallelism,
                pool: s.pool,
            });
            for k in &s.known {
                r.record(
                    (k.topic.clone(), k.partition),
                    Recorded {
                        offset: k.offset,
                        key: k.key.clone(),
                        token: k.token,
                        copy: k.copy,
                        legacy_epoch: None,
                    },
                );
                r.known.push(k.clone());
            }
            let key = s.identity.marker_key(s.subtask);
            for p in &s.pending {
                r.pending_tokens.insert(p.token);
                r.record(
                    (s.identity.marker_topic.clone(), p.marker.0),
                    Recorded {
                        offset: p.marker.1,
                        key: key.clone(),
                        token: (!legacy).then_some(p.token),
                        copy: 0,
                        legacy_epoch: legacy.then_some(p.epoch),
                    },
                );
            }
            if s.subtask % parallelism != subtask {
                continue;
            }
            let w = writers
                .entry((s.identity.prefix.clone(), s.subtask))
                .or_insert_with(|| WriterRecovery {
                    subtask: s.subtask,
                    identity: s.identity.clone(),
                    lineage_token: s.lineage_token,
                    legacy,
                    pending: Vec::new(),
                });
            w.pending.extend(s.pending.iter().cloned());
            w.pending.sort_by_key(|p| p.epoch);
            w.pending.dedup_by_key(|p| p.token);
        }
        r.lineage_tokens.sort_unstable();
        r.lineage_tokens.dedup();
        r.writers = writers.into_values().collect();
        r.writers.sort_by_key(|w| w.subtask);
        r
    }

    fn record(&mut self, tp: MarkerPartition, rec: Recorded) {
        let newest = self
            .newest
            .entry((tp.clone(), rec.key.clone()))
            .or_insert(rec.offset);
        *newest = (*newest).max(rec.offset);
        self.topics.insert(tp.0.clone());
        self.recorded.entry(tp).or_default().push(rec);
    }

    /// The marker topics to read: this run's, and those of every sink and marker the
    /// snapshots name (markers of the lineage written under another name after the
    /// checkpoint are there).
    pub fn marker_topics(&self) -> Vec<String> {
        self.topics.iter().cloned().collect()
    }

    /// The lineage token this subtask's markers carry from now on: the restored sink's
    /// (the smallest of its tokens, the same in every subtask), or `fresh` when the
    /// snapshots have none (version 1).
    pub fn lineage_token(&self, fresh: u64) -> u64 {
        self.lineage_tokens.first().copied().unwrap_or(fresh)
    }

    /// The sinks whose registries (largest parallelism and pool ever announced) bound what
    /// to fence: `(prefix, marker topic)` of this run and of every snapshot.
    pub fn registries(&self, snapshots: &[SinkSnapshot]) -> Vec<(String, String)> {
        let mut out = vec![(
            self.current.prefix.clone(),
            self.current.marker_topic.clone(),
        )];
        for s in snapshots {
            let id = (s.identity.prefix.clone(), s.identity.marker_topic.clone());
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }

    /// The transactional ids to fence (initialise and drop), this subtask's own included:
    /// per prefix (this run's first, then those of the snapshots), every slot up to the
    /// largest pool of the subtasks that map here (`l % parallelism == subtask`) up to the
    /// largest parallelism any run of that prefix had. `pool` is this run's largest pool;
    /// `registered` what each registry (by prefix) says.
    pub fn fence(&self, pool: u32, registered: &BTreeMap<String, Registered>) -> Vec<String> {
        let mut groups: Vec<(String, Registered)> = vec![(
            self.current.prefix.clone(),
            Registered {
                parallelism: self.parallelism,
                pool,
            },
        )];
        for (prefix, run) in &self.runs {
            match groups.iter_mut().find(|(p, _)| p == prefix) {
                Some((_, g)) => *g = g.max(*run),
                None => groups.push((prefix.clone(), *run)),
            }
        }
        for (prefix, g) in &mut groups {
            if let Some(r) = registered.get(prefix) {
                *g = g.max(*r);
            }
        }
        let mut ids = Vec::new();
        for (prefix, g) in &groups {
            let slots = g.pool.max(1);
            for l in (0..g.parallelism).filter(|l| l % self.parallelism == self.subtask) {
                for s in 0..slots {
                    let id = transactional_id(prefix, l, s);
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        ids
    }

    /// Every marker partition to read, with the newest marker the checkpoint recorded in
    /// it: those where it recorded markers, and the `partitions` (that exist now) of every
    /// topic of [`Restore::marker_topics`].
    pub fn marker_partitions(
        &self,
        partitions: &BTreeMap<String, Vec<i32>>,
    ) -> Vec<(MarkerPartition, Option<Recorded>)> {
        let mut out: BTreeMap<MarkerPartition, Option<Recorded>> = self
            .recorded
            .iter()
            .map(|(tp, recs)| (tp.clone(), recs.iter().max_by_key(|r| r.offset).cloned()))
            .collect();
        for (topic, ps) in partitions {
            for &p in ps {
                out.entry((topic.clone(), p)).or_insert(None);
            }
        }
        out.into_iter().collect()
    }

    /// What became of a partition: `newest` is the newest marker the checkpoint recorded
    /// in it, `exists` whether it exists, `low`/`high` its watermarks, `at_newest` the key
    /// and value of the record at `newest`'s offset (read `read_uncommitted`; `None` when
    /// no record is there).
    pub fn incarnation(
        newest: Option<&Recorded>,
        exists: bool,
        low: i64,
        high: i64,
        at_newest: Option<(&[u8], &[u8])>,
    ) -> Incarnation {
        let Some(n) = newest else {
            return if exists {
                Incarnation::Unrecorded
            } else {
                Incarnation::Missing
            };
        };
        if !exists {
            return Incarnation::Missing;
        }
        if n.offset < low {
            return Incarnation::Trimmed;
        }
        if n.offset >= high {
            return Incarnation::Replaced;
        }
        match at_newest {
            Some((k, v)) if n.matches(k, v) => Incarnation::Intact,
            _ => Incarnation::Replaced,
        }
    }

    /// Where to start reading committed markers of a partition (`None`: do not read it):
    /// from the oldest marker the checkpoint recorded there when offsets compare, else
    /// from where the partition starts now.
    pub fn scan_start(&self, tp: &MarkerPartition, inc: Incarnation, low: i64) -> Option<i64> {
        match inc {
            Incarnation::Missing => None,
            Incarnation::Replaced | Incarnation::Unrecorded => Some(low),
            Incarnation::Intact | Incarnation::Trimmed => {
                let oldest = self
                    .recorded
                    .get(tp)
                    .and_then(|r| r.iter().map(|r| r.offset).min())
                    .unwrap_or(low);
                Some(oldest.max(low))
            }
        }
    }

    /// Decides, from the committed markers read, which pending epochs committed and which
    /// to write again, and refuses (unless `accept_newer`) when markers of the sink's
    /// lineage show output the checkpoint does not cover.
    pub fn decide(
        &self,
        scanned: &BTreeMap<MarkerPartition, Scanned>,
        accept_newer: bool,
    ) -> Result<Decision, NewerCommit> {
        let newer = self.newer_commits(scanned);
        if let Some(n) = newer.iter().max_by_key(|n| n.epoch)
            && !accept_newer
        {
            return Err(n.clone());
        }
        let writers = self
            .writers
            .iter()
            .map(|w| self.decide_writer(w, scanned))
            .collect();
        Ok(Decision {
            writers,
            accepted_newer: newer,
        })
    }

    fn decide_writer(
        &self,
        w: &WriterRecovery,
        scanned: &BTreeMap<MarkerPartition, Scanned>,
    ) -> WriterDecision {
        let key = w.identity.marker_key(w.subtask);
        let mut d = WriterDecision {
            subtask: w.subtask,
            committed: Vec::new(),
            closed_by: Vec::new(),
            replay: Vec::new(),
            ask_output: Vec::new(),
        };
        for e in &w.pending {
            let (p, o) = e.marker;
            let topic = &w.identity.marker_topic;
            let Some(sc) = scanned.get(&(topic.clone(), p)) else {
                let why = format!("the marker partition {topic}/{p} was not read");
                d.ask_output.push((e.clone(), why));
                continue;
            };
            let comparable = matches!(sc.incarnation, Incarnation::Intact | Incarnation::Trimmed);
            let closed = sc.markers.iter().rev().find(|m| {
                m.key == key
                    && match m.value {
                        MarkerValue::Closes { token, .. } => token == e.token,
                        MarkerValue::Legacy { epoch } => {
                            w.legacy && comparable && epoch == e.epoch && m.offset >= o
                        }
                    }
            });
            if let Some(m) = closed {
                d.committed.push(e.epoch);
                d.closed_by.push(KnownMarker {
                    topic: topic.clone(),
                    partition: p,
                    key: key.clone(),
                    subtask: w.subtask,
                    offset: m.offset,
                    token: Some(e.token),
                    copy: match m.value {
                        MarkerValue::Closes { copy, .. } => copy,
                        MarkerValue::Legacy { .. } => 0,
                    },
                });
                continue;
            }
            let why = match sc.incarnation {
                Incarnation::Intact if o >= sc.low => {
                    d.replay.push(e.clone());
                    continue;
                }
                Incarnation::Intact | Incarnation::Trimmed => format!(
                    "its commit marker at {topic}/{p} offset {o} was removed by retention (the \
                     partition now starts at {})",
                    sc.low
                ),
                Incarnation::Missing => format!("the marker partition {topic}/{p} does not exist"),
                Incarnation::Replaced | Incarnation::Unrecorded => format!(
                    "its commit marker at {topic}/{p} offset {o} is not there (was the marker \
                     topic deleted and created again?)"
                ),
            };
            d.ask_output.push((e.clone(), why));
        }
        d
    }

    /// Committed markers of the sink's lineage, written by subtasks that map here, that the
    /// checkpoint does not cover: after the newest marker it knows of their writer (or of
    /// a writer it does not know at all, or in a partition whose offsets do not compare),
    /// and not closing an epoch it holds as pending.
    fn newer_commits(&self, scanned: &BTreeMap<MarkerPartition, Scanned>) -> Vec<NewerCommit> {
        let mut out = Vec::new();
        for (tp, sc) in scanned {
            let comparable = matches!(sc.incarnation, Incarnation::Intact | Incarnation::Trimmed);
            for m in &sc.markers {
                let after_known = || {
                    !comparable
                        || self
                            .newest
                            .get(&(tp.clone(), m.key.clone()))
                            .is_none_or(|&o| m.offset > o)
                };
                let writer = match m.value {
                    MarkerValue::Closes {
                        lineage,
                        subtask,
                        token,
                        ..
                    } => {
                        if self.pending_tokens.contains(&token)
                            || self.lineage_tokens.binary_search(&lineage).is_err()
                        {
                            continue;
                        }
                        subtask
                    }
                    MarkerValue::Legacy { epoch } => {
                        // Checkpoints of weir before sink identities: as then, a marker
                        // naming a later checkpoint id.
                        let Some(w) = self.legacy_prefixes.iter().find_map(|p| {
                            m.key
                                .strip_prefix(p.as_str())?
                                .strip_prefix('/')?
                                .parse::<u32>()
                                .ok()
                        }) else {
                            continue;
                        };
                        if !comparable || epoch <= self.checkpoint {
                            continue;
                        }
                        w
                    }
                };
                if writer % self.parallelism == self.subtask && after_known() {
                    out.push(NewerCommit {
                        subtask: writer,
                        epoch: m.value.epoch(),
                        marker: (tp.0.clone(), tp.1, m.offset),
                        key: m.key.clone(),
                        token: match m.value {
                            MarkerValue::Closes { token, .. } => Some(token),
                            MarkerValue::Legacy { .. } => None,
                        },
                        copy: match m.value {
                            MarkerValue::Closes { copy, .. } => copy,
                            MarkerValue::Legacy { .. } => 0,
                        },
                        checkpoint: self.checkpoint,
                    });
                }
            }
        }
        out
    }

    /// The markers the new run keeps in its snapshots until it writes newer ones: the known
    /// and pending markers of the writers that map here, the markers that closed their
    /// pending epochs and the newer output accepted (`decision`: a later restore of the new
    /// run does not refuse what this one accepted), and those the restore wrote
    /// (`replayed`), newest per key and partition. Recorded markers of partitions whose
    /// offsets no longer compare are dropped; those read or written now are in the
    /// partition as it is.
    pub fn carry(
        &self,
        scanned: &BTreeMap<MarkerPartition, Scanned>,
        decision: &Decision,
        replayed: Vec<KnownMarker>,
    ) -> Vec<KnownMarker> {
        let stale = |tp: &MarkerPartition| {
            scanned.get(tp).is_none_or(|s| {
                !matches!(s.incarnation, Incarnation::Intact | Incarnation::Trimmed)
            })
        };
        let mut all: Vec<KnownMarker> = self
            .known
            .iter()
            .filter(|k| k.subtask % self.parallelism == self.subtask)
            .cloned()
            .collect();
        for w in &self.writers {
            for e in &w.pending {
                all.push(KnownMarker {
                    topic: w.identity.marker_topic.clone(),
                    partition: e.marker.0,
                    key: w.identity.marker_key(w.subtask),
                    subtask: w.subtask,
                    offset: e.marker.1,
                    token: (!w.legacy).then_some(e.token),
                    copy: 0,
                });
            }
        }
        all.retain(|k| !stale(&(k.topic.clone(), k.partition)));
        all.extend(
            decision
                .writers
                .iter()
                .flat_map(|d| d.closed_by.iter().cloned()),
        );
        all.extend(decision.accepted_newer.iter().map(|n| KnownMarker {
            topic: n.marker.0.clone(),
            partition: n.marker.1,
            key: n.key.clone(),
            subtask: n.subtask,
            offset: n.marker.2,
            token: n.token,
            copy: n.copy,
        }));
        all.extend(replayed);
        let mut newest: BTreeMap<(String, i32, String), KnownMarker> = BTreeMap::new();
        for k in all {
            let slot = newest
                .entry((k.topic.clone(), k.partition, k.key.clone()))
                .or_insert_with(|| k.clone());
            if k.offset >= slot.offset {
                *slot = k;
            }
        }
        newest.into_values().collect()
    }
}
