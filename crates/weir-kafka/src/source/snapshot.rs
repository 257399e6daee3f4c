//! The Kafka source's checkpoint state: each partition's position (version 1) and, since
//! version 2, each partition's event time.

use super::PartState;
use crate::KafkaError;
use serde::{Deserialize, Serialize};
use weir_core::time::Timestamp;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SourceSnapshot {
    pub(super) version: u32,
    pub(super) partitions: Vec<PartState>,
}

/// Version 2 appends, after the version-1 fields, each partition's largest record
/// timestamp, so per-partition watermarks continue where they were after a restore, also
/// when partitions move to other subtasks (a rescale). Version 1 snapshots still load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PartEventTime {
    pub(super) topic: String,
    pub(super) partition: i32,
    /// The largest record timestamp read from the partition before the checkpoint.
    pub(super) max_ts: Timestamp,
}

const SOURCE_SNAPSHOT_VERSION: u32 = 2;

/// Encodes a snapshot: the version-1 layout followed by the partitions' event time.
pub(super) fn encode_snapshot(
    partitions: Vec<PartState>,
    event_time: &[PartEventTime],
) -> weir_core::Result<Vec<u8>> {
    let cfg = bincode::config::standard();
    let snap = SourceSnapshot {
        version: SOURCE_SNAPSHOT_VERSION,
        partitions,
    };
    let mut bytes = bincode::serde::encode_to_vec(&snap, cfg)
        .map_err(|e| weir_core::Error::Codec(e.to_string()))?;
    bytes.extend(
        bincode::serde::encode_to_vec(event_time, cfg)
            .map_err(|e| weir_core::Error::Codec(e.to_string()))?,
    );
    Ok(bytes)
}

/// Decodes a snapshot of version 1 (positions only) or 2 (positions and event time).
pub(super) fn decode_snapshot(
    bytes: &[u8],
) -> weir_core::Result<(Vec<PartState>, Vec<PartEventTime>)> {
    let cfg = bincode::config::standard();
    let unreadable = |e: &dyn std::fmt::Display| {
        KafkaError::RecoveryRefused(format!(
            "the Kafka source's checkpoint state is unreadable: {e}"
        ))
    };
    let (snap, read): (SourceSnapshot, usize) =
        bincode::serde::decode_from_slice(bytes, cfg).map_err(|e| unreadable(&e))?;
    match snap.version {
        1 => Ok((snap.partitions, Vec::new())),
        2 => {
            let (event_time, _): (Vec<PartEventTime>, usize) =
                bincode::serde::decode_from_slice(&bytes[read..], cfg)
                    .map_err(|e| unreadable(&e))?;
            Ok((snap.partitions, event_time))
        }
        v => Err(KafkaError::Config(format!(
            "the Kafka source's checkpoint state has version {v}, this weir reads versions 1 and 2: restore with a newer weir"
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(partition: i32, next: i64) -> PartState {
        PartState {
            topic: "in".into(),
            partition,
            next,
            end: None,
        }
    }

    #[test]
    fn snapshots_keep_each_partitions_event_time() {
        let event_time = vec![PartEventTime {
            topic: "in".into(),
            partition: 1,
            max_ts: 41_000,
        }];
        let bytes = encode_snapshot(vec![part(0, 7), part(1, 9)], &event_time).unwrap();
        let (partitions, restored) = decode_snapshot(&bytes).unwrap();
        assert_eq!(partitions, vec![part(0, 7), part(1, 9)]);
        assert_eq!(restored, event_time);
    }

    #[test]
    fn version_1_snapshots_still_restore_without_event_time() {
        let v1 = SourceSnapshot {
            version: 1,
            partitions: vec![part(3, 12)],
        };
        let bytes = bincode::serde::encode_to_vec(&v1, bincode::config::standard()).unwrap();
        let (partitions, event_time) = decode_snapshot(&bytes).unwrap();
        assert_eq!(partitions, vec![part(3, 12)]);
        assert!(event_time.is_empty());
    }

    #[test]
    fn a_newer_snapshot_version_is_refused_with_what_to_do() {
        let v3 = SourceSnapshot {
            version: 3,
            partitions: vec![],
        };
        let bytes = bincode::serde::encode_to_vec(&v3, bincode::config::standard()).unwrap();
        let e = decode_snapshot(&bytes).unwrap_err().to_string();
        assert!(
            e.contains("has version 3") && e.contains("restore with a newer weir"),
            "{e}"
        );
    }
}
