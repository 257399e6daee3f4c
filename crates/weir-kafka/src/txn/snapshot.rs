//! What a sink subtask keeps in a checkpoint: which sink wrote it (its identity and
//! lineage), the epochs waiting for their checkpoint, and the newest commit markers it knows
//! of. Version 1 (before sink identities) is still read.

use super::marker_key;
use serde::{Deserialize, Serialize};

/// A partition of a topic and an offset in it.
pub type PartitionOffset = (i32, i64);

/// An epoch that was pre-committed at its barrier and is waiting for its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEpoch {
    /// The checkpoint whose barrier closed the epoch.
    pub epoch: u64,
    /// The producer slot whose transaction holds it.
    pub slot: u32,
    /// The transaction's token: the records carry it in their
    /// [`TXN_HEADER`](super::TXN_HEADER) and the commit marker names it, so a restore can
    /// find both (random per run, unlike checkpoint ids, which are no identity).
    pub token: u64,
    /// Data records written (their sequence numbers are `0..records`).
    pub records: u64,
    /// Per output partition, the offset of the epoch's first record there.
    pub first_offsets: Vec<PartitionOffset>,
    /// Where the epoch's commit marker went in the marker topic of the snapshot's
    /// [`SinkIdentity`].
    pub marker: PartitionOffset,
}

/// Which sink wrote a snapshot: where its transactions, commit markers and records are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkIdentity {
    /// The transactional-id prefix: ids `{prefix}-{subtask}-{slot}`, marker keys
    /// `{prefix}/{subtask}`.
    pub prefix: String,
    /// The topic of commit markers.
    pub marker_topic: String,
    /// The output topic.
    pub topic: String,
}

impl SinkIdentity {
    /// The commit-marker key of `subtask`.
    pub fn marker_key(&self, subtask: u32) -> String {
        marker_key(&self.prefix, subtask)
    }
}

/// The newest commit marker a checkpoint knows of one writer (a marker key) in one partition
/// of a marker topic. Markers of the same lineage after it, unless they close an epoch the
/// checkpoint holds as pending, are output the checkpoint does not cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownMarker {
    /// The marker topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The marker key (`{prefix}/{subtask}`).
    pub key: String,
    /// The subtask that wrote it (its index in that run).
    pub subtask: u32,
    /// The marker's offset.
    pub offset: i64,
    /// The transaction token the marker closes; `None` for a marker recorded by a version-1
    /// snapshot (its value was a checkpoint id, and the snapshot did not keep the token).
    pub token: Option<u64>,
    /// 0 for an epoch's own marker, else the id of the copy a restore wrote
    /// ([`MarkerValue::Closes`](super::MarkerValue::Closes)).
    pub copy: u64,
}

/// What a sink subtask keeps in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkSnapshot {
    /// Format version of this structure ([`SNAPSHOT_VERSION`]).
    pub version: u32,
    /// The sink that wrote it.
    pub identity: SinkIdentity,
    /// The subtask that wrote it.
    pub subtask: u32,
    /// The parallelism of the run that wrote it.
    pub parallelism: u32,
    /// How many transactional ids per subtask that run may have used (its pool, grown).
    pub pool: u32,
    /// The lineage token this subtask's commit markers carry.
    pub lineage_token: u64,
    /// Every lineage token of the sink's history (sorted): made when a sink starts without
    /// restored state, kept across restores, rescales and renames.
    pub lineage_tokens: Vec<u64>,
    /// Pre-committed epochs not known to be committed, oldest first.
    pub pending: Vec<PendingEpoch>,
    /// The newest commit marker known per writer and marker partition (this subtask's own,
    /// and those of the subtasks it took over on restore).
    pub known: Vec<KnownMarker>,
}

/// Current [`SinkSnapshot::version`].
pub const SNAPSHOT_VERSION: u32 = 2;

/// The snapshot of weir versions before sink identities.
#[derive(Deserialize)]
struct SnapshotV1 {
    #[allow(dead_code)]
    version: u32,
    lineage: u32,
    parallelism: u32,
    pool: u32,
    pending: Vec<PendingEpoch>,
    last_committed_marker: Option<PartitionOffset>,
}

/// Encodes a snapshot for the checkpoint.
pub fn encode_snapshot(s: &SinkSnapshot) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(s, bincode::config::standard()).map_err(|e| e.to_string())
}

/// Decodes a snapshot of version 1 or 2. Version 1 did not record which sink wrote it: it is
/// taken to be `current` (the prefix and topics configured now), with no lineage tokens.
///
/// ```
/// use weir_kafka::txn::{decode_snapshot, encode_snapshot, SinkIdentity, SinkSnapshot, SNAPSHOT_VERSION};
/// let s = SinkSnapshot {
///     version: SNAPSHOT_VERSION, identity: SinkIdentity::default(), subtask: 1, parallelism: 2,
///     pool: 3, lineage_token: 7, lineage_tokens: vec![7], pending: vec![], known: vec![],
/// };
/// let bytes = encode_snapshot(&s).unwrap();
/// assert_eq!(decode_snapshot(&bytes, &SinkIdentity::default()).unwrap(), s);
/// assert!(decode_snapshot(b"", &SinkIdentity::default()).is_err());
/// ```
pub fn decode_snapshot(bytes: &[u8], current: &SinkIdentity) -> Result<SinkSnapshot, String> {
    let cfg = bincode::config::standard();
    let (version, _): (u32, usize) = bincode::serde::decode_from_slice(bytes, cfg)
        .map_err(|e| format!("the sink's checkpoint state is unreadable: {e}"))?;
    match version {
        1 => {
            let (v1, _): (SnapshotV1, usize) = bincode::serde::decode_from_slice(bytes, cfg)
                .map_err(|e| format!("the sink's version-1 checkpoint state is unreadable: {e}"))?;
            let known = v1
                .last_committed_marker
                .map(|(partition, offset)| KnownMarker {
                    topic: current.marker_topic.clone(),
                    partition,
                    key: current.marker_key(v1.lineage),
                    subtask: v1.lineage,
                    offset,
                    token: None,
                    copy: 0,
                })
                .into_iter()
                .collect();
            Ok(SinkSnapshot {
                version: 1,
                identity: current.clone(),
                subtask: v1.lineage,
                parallelism: v1.parallelism,
                pool: v1.pool,
                lineage_token: 0,
                lineage_tokens: Vec::new(),
                pending: v1.pending,
                known,
            })
        }
        SNAPSHOT_VERSION => {
            let (s, _): (SinkSnapshot, usize) = bincode::serde::decode_from_slice(bytes, cfg)
                .map_err(|e| format!("the sink's checkpoint state is unreadable: {e}"))?;
            Ok(s)
        }
        v => Err(format!(
            "the sink's checkpoint state has version {v}, this weir reads versions 1 and \
             {SNAPSHOT_VERSION}"
        )),
    }
}

/// The largest parallelism and pool size any run of the sink announced before it wrote
/// (kept outside checkpoints, so it also covers runs that crashed before their first
/// checkpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    /// The largest parallelism.
    pub parallelism: u32,
    /// The largest pool size.
    pub pool: u32,
}

impl Registered {
    /// The text kept in the registry (`parallelism=P,pool=N`).
    ///
    /// ```
    /// use weir_kafka::txn::Registered;
    /// let r = Registered { parallelism: 3, pool: 2 };
    /// assert_eq!(Registered::parse(&r.to_text()), r);
    /// assert_eq!(Registered::parse(""), Registered::default());
    /// ```
    pub fn to_text(&self) -> String {
        format!("parallelism={},pool={}", self.parallelism, self.pool)
    }

    /// Reads [`Registered::to_text`]; anything else counts as nothing registered.
    pub fn parse(text: &str) -> Self {
        let mut r = Registered::default();
        for part in text.split(',') {
            match part.split_once('=') {
                Some(("parallelism", v)) => r.parallelism = v.parse().unwrap_or(0),
                Some(("pool", v)) => r.pool = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        r
    }

    /// The larger of both, field by field.
    pub fn max(self, other: Registered) -> Registered {
        Registered {
            parallelism: self.parallelism.max(other.parallelism),
            pool: self.pool.max(other.pool),
        }
    }
}
