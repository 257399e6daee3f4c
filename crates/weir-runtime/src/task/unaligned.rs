//! The unaligned side of an operator task's checkpoints: on the first barrier of a
//! checkpoint (unaligned, or an aligned one whose alignment timed out) the task snapshots
//! its operators at once, forwards the barrier on its writers' priority lanes, and collects
//! each input channel's records up to that channel's barrier as channel state. It
//! acknowledges once every open channel's barrier has come (see
//! docs/decisions/0038-unaligned-checkpoints.md).

use super::Checkpoints;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_core::Result;
use weir_core::checkpoint::OperatorSnapshot;
use weir_core::exchange::{CHANNEL_STATE_TABLE, InputGate};
use weir_core::ids::CheckpointId;
use weir_core::time::Timestamp;

/// A checkpoint whose channel state a task is collecting.
pub(super) struct Collecting {
    pub id: CheckpointId,
    snapshot: BTreeMap<String, OperatorSnapshot>,
    sync: Duration,
    /// Per flat channel: everything before the barrier has been taken.
    done: Vec<bool>,
}

/// Where a task stands with unaligned checkpoints.
#[derive(Default)]
pub(super) struct Unaligned {
    pub collecting: Option<Collecting>,
    /// The newest checkpoint this task snapshotted unaligned.
    pub last: Option<CheckpointId>,
}

/// The task's channels, as `run_operator` lists them.
pub(super) struct Inputs<'a> {
    pub gates: &'a [Box<dyn InputGate>],
    /// Flat channel index -> (gate, channel within the gate).
    pub channels: &'a [(usize, usize)],
    pub ended: &'a [bool],
    pub subtask: usize,
    pub parallelism: usize,
}

impl Unaligned {
    /// True when barrier `id` is older than one this task already took unaligned.
    pub fn is_stale(&self, id: CheckpointId) -> bool {
        self.last.is_some_and(|l| id <= l)
    }

    /// Starts checkpoint `id` unaligned: snapshots now and captures every open channel
    /// except `arrived` ones (their barrier already came in band); `in_band` when the
    /// others' barriers may come in band too (aligned with a timeout). The caller forwards
    /// the barrier downstream.
    pub fn start(
        &mut self,
        ck: &mut Checkpoints<'_>,
        inputs: &Inputs<'_>,
        id: CheckpointId,
        watermark: Timestamp,
        arrived: &[bool],
        in_band: bool,
    ) -> Result<()> {
        self.cancel(inputs);
        let (snapshot, sync) = ck.take_snapshot(id, Some(watermark))?;
        super::barrier_trace(format_args!(
            "op {} unaligned snapshot {id} sync {}us",
            ck.spec.index,
            sync.as_micros()
        ));
        let mut done = vec![false; inputs.channels.len()];
        for (flat, &(g, c)) in inputs.channels.iter().enumerate() {
            done[flat] = inputs.ended[flat] || arrived[flat];
            if !done[flat] {
                inputs.gates[g].capture(c, None)?;
                if in_band {
                    inputs.gates[g].capture_until_barrier(c, id);
                }
            }
        }
        self.last = Some(id);
        self.collecting = Some(Collecting {
            id,
            snapshot,
            sync,
            done,
        });
        Ok(())
    }

    /// Gives up the collection (a newer barrier, or an abort).
    pub fn cancel(&mut self, inputs: &Inputs<'_>) {
        if self.collecting.take().is_some() {
            for g in inputs.gates {
                g.cancel_captures();
            }
        }
    }

    /// Barrier `id` of the collection came on channel `flat`: on the priority lane after
    /// `upto` data messages, or in band (`None`: everything taken so far is before it).
    pub fn barrier(&mut self, inputs: &Inputs<'_>, flat: usize, upto: Option<u64>) -> Result<()> {
        let Some(c) = self.collecting.as_mut() else {
            return Ok(());
        };
        if c.done[flat] {
            return Ok(());
        }
        let (g, ch) = inputs.channels[flat];
        let gate = &inputs.gates[g];
        gate.capture(ch, Some(upto.unwrap_or_else(|| gate.taken(ch))))
    }

    /// Takes what the open channels already hold before their barriers (see
    /// [`InputGate::drain`]) and notes the channels that are complete.
    pub fn drain(&mut self, inputs: &Inputs<'_>) -> Result<()> {
        let Some(c) = self.collecting.as_mut() else {
            return Ok(());
        };
        for (flat, &(g, ch)) in inputs.channels.iter().enumerate() {
            if !c.done[flat] {
                inputs.gates[g].drain(ch)?;
                c.done[flat] = inputs.ended[flat] || inputs.gates[g].capture_done(ch);
            }
        }
        Ok(())
    }

    /// Acknowledges the collection when every channel's state is complete: the operators'
    /// snapshot plus the channel state, stored with the task's first operator.
    pub fn finish_if_done(
        &mut self,
        ck: &mut Checkpoints<'_>,
        inputs: &Inputs<'_>,
        head_operator: &str,
        watermark: Timestamp,
    ) -> Result<()> {
        let complete = self
            .collecting
            .as_ref()
            .is_some_and(|c| c.done.iter().all(|d| *d));
        if !complete {
            return Ok(());
        }
        let mut c = self.collecting.take().expect("collecting");
        let mut blobs = Vec::new();
        for &(g, ch) in inputs.channels {
            if let Some(b) =
                inputs.gates[g].channel_state(ch, g, inputs.subtask, inputs.parallelism)?
            {
                blobs.push(b);
            }
        }
        // Stored with the first operator; an empty table marks the checkpoint as taken
        // unaligned (checkpoint writing drops it).
        if !blobs.is_empty() || c.snapshot.contains_key(head_operator) {
            let e = c
                .snapshot
                .entry(head_operator.to_string())
                .or_insert_with(|| OperatorSnapshot {
                    watermark: Some(watermark),
                    ..OperatorSnapshot::default()
                });
            e.keyed.insert(CHANNEL_STATE_TABLE.to_string(), blobs);
        }
        ck.ack(c.id, c.snapshot, Duration::ZERO, c.sync);
        Ok(())
    }
}

/// Replays the channel state restored with the task's first operator into its gates,
/// before the task reads any channel.
pub(super) fn replay(
    gates: &[Box<dyn InputGate>],
    blobs: &[(u32, Vec<u8>)],
    subtask: usize,
    parallelism: usize,
    max_parallelism: usize,
) -> Result<usize> {
    let mut n = 0;
    if blobs.is_empty() {
        return Ok(0);
    }
    for (g, gate) in gates.iter().enumerate() {
        n += gate.replay(blobs, g, subtask, parallelism, max_parallelism)?;
    }
    Ok(n)
}
