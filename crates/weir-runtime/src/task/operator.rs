//! An operator task's loop: selects over its input channels and its command channel,
//! tracks watermarks per channel, aligns barriers (or takes an unaligned checkpoint's
//! snapshot on the first barrier), forwards control events to its chain, and at the end
//! stays until its last snapshot is known complete.

use super::align::{Aligned, Aligner};
use super::*;
use crossbeam_channel::Select;
use weir_core::exchange::GateEvent;
use weir_core::graph::ControlSink;
use weir_core::time::MIN_WATERMARK;
use weir_core::watermark::WatermarkTracker;

/// True when checkpoint `id` is the final one: handles the commands waiting first, since
/// the job thread names the final checkpoint to operator tasks before its barrier leaves
/// the sources.
fn final_or_told(
    commands: &Receiver<TaskCommand>,
    final_checkpoint: &mut Option<CheckpointId>,
    ck: &mut Checkpoints<'_>,
    id: CheckpointId,
) -> Result<bool> {
    while let Ok(cmd) = commands.try_recv() {
        if let TaskCommand::Trigger(f, true) = cmd {
            *final_checkpoint = Some(f);
        }
        ck.on_command(cmd)?;
    }
    Ok(final_checkpoint.is_some_and(|f| f == id))
}

enum ControlTarget<'a> {
    Gate(&'a dyn InputGate),
    Sink(Box<dyn ControlSink>),
}

impl ControlTarget<'_> {
    fn send(&mut self, event: Control) -> Result<()> {
        match self {
            ControlTarget::Gate(g) => g.control(event),
            ControlTarget::Sink(s) => s.control(event),
        }
    }
}

/// A control target that keeps the last watermark forwarded to the operator (its
/// watermark in, for the REST API).
struct Watched<'a> {
    target: ControlTarget<'a>,
    watermark: Option<Arc<std::sync::atomic::AtomicI64>>,
}

impl Watched<'_> {
    fn send(&mut self, event: Control) -> Result<()> {
        if let (Control::Watermark(w), Some(cell)) = (event, &self.watermark) {
            cell.store(w, Ordering::Relaxed);
        }
        self.target.send(event)
    }
}

pub(super) fn run_operator(
    job: &JobShared,
    gates: Vec<Box<dyn InputGate>>,
    control: Option<Box<dyn ControlSink>>,
    cells: Option<&crate::status::NodeCells>,
    ck: &mut Checkpoints<'_>,
    channel_state: &[(u32, Vec<u8>)],
) -> Result<u64> {
    let exactly_once = job.cfg.checkpoint.as_ref().is_none_or(|c| c.exactly_once);
    let mut target = Watched {
        target: match control {
            Some(c) => ControlTarget::Sink(c),
            None => ControlTarget::Gate(&*gates[0]),
        },
        watermark: cells.map(|c| c.watermark_in.clone()),
    };
    // Flat channel index -> (gate, channel within the gate).
    let channels: Vec<(usize, usize)> = gates
        .iter()
        .enumerate()
        .flat_map(|(g, gate)| (0..gate.len()).map(move |c| (g, c)))
        .collect();
    let mut tracker = WatermarkTracker::new(channels.len());
    // Resuming: the chain's operators had reached this event time at the checkpoint. It is
    // re-established before any record (a window must not reopen a window it purged, a
    // record late before the crash stays late), and the inputs' watermarks, which start
    // over, do not move it back.
    let restored = ck
        .spec
        .restore
        .values()
        .filter_map(|r| r.watermark)
        .min()
        .filter(|w| *w > MIN_WATERMARK);
    if let Some(w) = restored {
        tracker.resume_at(w);
    }
    let mut aligner = Aligner::new(channels.len(), exactly_once);
    let mode = mode_of(job);
    let mut end_of_time = end_of_time::EndOfTime::new(channels.len());
    let mut unaligned = unaligned::Unaligned::default();
    let head_operator = job.graph.nodes[ck.spec.head].operator_id();
    let parallelism = job.plan.parallelism[ck.spec.head];
    let mut ended = vec![false; channels.len()];
    // Channels whose producer let go of the priority lane.
    let mut no_priority = vec![false; channels.len()];
    let mut open = channels.len();
    let mut idle = false;
    let mut records = 0u64;
    // As in run_source: the processing time is known before the first record.
    let mut last_tick = now_ms();
    target.send(Control::Tick(last_tick))?;
    if let Some(w) = restored {
        target.send(Control::Watermark(w))?;
    }
    // The records that were in flight at an unaligned checkpoint come before any new one.
    let replayed = unaligned::replay(
        &gates,
        channel_state,
        ck.spec.subtask,
        parallelism,
        job.cfg.max_parallelism,
    )?;
    if replayed > 0 {
        tracing::info!(
            records = replayed,
            "replayed the in-flight records of the restored unaligned checkpoint"
        );
        records += replayed as u64;
    }
    let commands = ck.spec.commands.clone();
    enum Got {
        Gate(usize, GateEvent),
        Command(TaskCommand),
    }
    let mut events: Vec<(usize, GateEvent)> = Vec::new();
    let mut gots: Vec<Got> = Vec::new();
    // The final checkpoint, once the job thread said which it is.
    let mut final_checkpoint: Option<CheckpointId> = None;
    while open > 0 {
        if cancelled(ck) {
            return Err(Error::Cancelled);
        }
        // With no room on the output, no record is delivered (it would wait in a send,
        // deaf to barriers): only barriers and commands are taken until there is room.
        let out_ok = weir_core::exchange::output_available();
        // Unaligned barriers first, then the messages taken when one was seen.
        events.clear();
        if mode != crate::CheckpointMode::Aligned {
            for (flat, &(g, c)) in channels.iter().enumerate() {
                if ended[flat] {
                    continue;
                }
                while let Some(e) = gates[g].poll_priority(c) {
                    events.push((flat, e));
                }
            }
        }
        // Commands that wait go before any record (the rest of a batch paused for them
        // included): a completed checkpoint's transactions are committed now, not after a
        // backlog that a slow sink takes long to write. A barrier just seen came after the
        // completions of the checkpoints before it, so its snapshot finds them committed.
        while let Ok(cmd) = commands.try_recv() {
            gots.push(Got::Command(cmd));
        }
        // Messages kept back (or the rest of a batch whose delivery paused) go after the
        // barriers just seen are handled, before anything read later.
        for (flat, &(g, c)) in channels.iter().enumerate() {
            if out_ok
                && events.is_empty()
                && gots.is_empty()
                && !ended[flat]
                && !aligner.blocked(flat)
                && let Some(e) = gates[g].resume(c)?
            {
                events.push((flat, e));
            }
        }
        let mut got_command = None;
        if events.is_empty() && gots.is_empty() {
            let mut sel = Select::new();
            let mut index = Vec::with_capacity(channels.len());
            for (flat, &(g, c)) in channels.iter().enumerate() {
                if out_ok && !ended[flat] && !aligner.blocked(flat) {
                    gates[g].select(&mut sel, c);
                    index.push((flat, false));
                }
            }
            if mode != crate::CheckpointMode::Aligned {
                for (flat, &(g, c)) in channels.iter().enumerate() {
                    if !ended[flat] && !no_priority[flat] {
                        gates[g].select_priority(&mut sel, c);
                        index.push((flat, true));
                    }
                }
            }
            let cmd_index = sel.recv(&commands);
            let selected = match sel.try_select() {
                Ok(op) => Some(op),
                Err(_) if !out_ok => {
                    let waiting = Instant::now();
                    let op = sel.select_timeout(OUTPUT_WAIT).ok();
                    ck.spec
                        .metrics
                        .backpressured_ns
                        .fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    op
                }
                Err(_) => {
                    // Nothing to read: what the chain buffered goes out now, not at the
                    // next flush interval (no record would join it while the task waits).
                    target.send(Control::Flush)?;
                    let _waited = IdleTimer::start(&ck.spec.metrics);
                    sel.select_timeout(Duration::from_millis(10)).ok()
                }
            };
            match selected {
                Some(op) if op.index() == cmd_index => match op.recv(&commands) {
                    Ok(cmd) => got_command = Some(Got::Command(cmd)),
                    Err(_) => return Err(Error::Cancelled),
                },
                Some(op) => {
                    let (flat, priority) = index[op.index()];
                    let (g, c) = channels[flat];
                    if priority {
                        match gates[g].complete_priority(c, op) {
                            Some(e) => events.push((flat, e)),
                            None => no_priority[flat] = true,
                        }
                    } else {
                        events.push((flat, gates[g].complete(c, op)?));
                    }
                }
                None => {}
            }
        }
        let mut aligned = Aligned::Wait;
        // (After the commands taken above.)
        gots.extend(events.drain(..).map(|(f, e)| Got::Gate(f, e)));
        gots.extend(got_command);
        for got in gots.drain(..) {
            match got {
                Got::Command(cmd) => {
                    if let TaskCommand::Trigger(id, true) = cmd {
                        final_checkpoint = Some(id);
                    }
                    if let TaskCommand::Abort(id) = cmd {
                        aligner.on_abort(id);
                        if unaligned.collecting.as_ref().is_some_and(|c| c.id == id) {
                            let inputs = unaligned::Inputs {
                                gates: &gates,
                                channels: &channels,
                                ended: &ended,
                                subtask: ck.spec.subtask,
                                parallelism,
                            };
                            unaligned.cancel(&inputs);
                        }
                    }
                    ck.on_command(cmd)?;
                }
                Got::Gate(flat, event) => {
                    // An unaligned barrier: its checkpoint, and the data messages before it
                    // (None for one that came in band).
                    let mut barrier: Option<(CheckpointId, Option<u64>)> = None;
                    match event {
                        GateEvent::Records(n) => {
                            records += n as u64;
                            ck.spec.progress.store(records, Ordering::Relaxed);
                            if let Some(c) = cells {
                                c.records_in[channels[flat].0]
                                    .fetch_add(n as u64, Ordering::Relaxed);
                            }
                            tracker.on_record(flat);
                        }
                        GateEvent::Watermark(w) => {
                            end_of_time.on_watermark(flat, w);
                            if let Some(wm) = tracker.on_watermark(flat, w) {
                                target.send(Control::Watermark(wm))?;
                            }
                        }
                        GateEvent::Idle(i) => {
                            if let Some(wm) = tracker.on_idle(flat, i) {
                                target.send(Control::Watermark(wm))?;
                            }
                        }
                        // (A writer's copy of the final checkpoint's in-band barrier is
                        // ignored: that checkpoint stays aligned.)
                        GateEvent::Priority(id, upto) => {
                            barrier_trace(format_args!(
                                "op {} prio {id} ch {flat} upto {upto}",
                                ck.spec.index
                            ));
                            if mode == crate::CheckpointMode::Unaligned
                                || !final_or_told(&commands, &mut final_checkpoint, ck, id)?
                            {
                                barrier = Some((id, Some(upto)))
                            }
                        }
                        // In band: an aligned barrier (the final checkpoint's, in the
                        // unaligned mode), or one of a checkpoint that went on unaligned.
                        GateEvent::Barrier(id)
                            if unaligned.collecting.as_ref().is_some_and(|c| c.id == id) =>
                        {
                            barrier = Some((id, None))
                        }
                        GateEvent::Barrier(id) => {
                            if !unaligned.is_stale(id) {
                                aligned = aligner.on_barrier(flat, id, &ended)
                            }
                        }
                        // Passed on as it came: no watermark, alignment or record count.
                        GateEvent::LatencyMarker(m) => target.send(Control::LatencyMarker(m))?,
                        GateEvent::End => {
                            ended[flat] = true;
                            open -= 1;
                            if let Some(wm) = tracker.on_end(flat) {
                                target.send(Control::Watermark(wm))?;
                            }
                            aligned = aligner.check(&ended);
                        }
                        GateEvent::Disconnected => {
                            return Err(Error::ChannelClosed(
                                "an upstream subtask stopped without finishing".into(),
                            ));
                        }
                    }
                    let inputs = unaligned::Inputs {
                        gates: &gates,
                        channels: &channels,
                        ended: &ended,
                        subtask: ck.spec.subtask,
                        parallelism,
                    };
                    if let Some((id, upto)) = barrier {
                        let current = unaligned.collecting.as_ref().is_some_and(|c| c.id == id);
                        let stale = unaligned.is_stale(id) || aligner.last.is_some_and(|l| id <= l);
                        if !current && !stale {
                            // The first barrier of `id` at this task: snapshot now, and
                            // send the barrier on ahead of the queued records.
                            let arrived = aligner.switch(id);
                            let in_band = mode != crate::CheckpointMode::Unaligned;
                            unaligned.start(
                                ck,
                                &inputs,
                                id,
                                tracker.current(),
                                &arrived,
                                in_band,
                            )?;
                            weir_core::exchange::with_unaligned_barriers(|| {
                                target.send(Control::Barrier(id))
                            })?;
                        }
                        if current || !stale {
                            unaligned.barrier(&inputs, flat, upto)?;
                        }
                    }
                    unaligned.drain(&inputs)?;
                    unaligned.finish_if_done(ck, &inputs, &head_operator, tracker.current())?;
                    let now_idle = tracker.all_idle();
                    if now_idle != idle {
                        idle = now_idle;
                        target.send(Control::Idle(idle))?;
                    }
                }
            }
        }
        if let Aligned::Complete(id, alignment) = aligned {
            ck.snapshot(id, alignment, Some(tracker.current()))?;
            let after_end = tracker.current() == MAX_WATERMARK;
            end_of_time::send_barrier(mode, after_end, || target.send(Control::Barrier(id)))?;
        }
        // Aligned with a timeout: an alignment that has taken too long goes on unaligned
        // (not the final checkpoint's: the sinks commit everything at it; see end_of_time).
        if let crate::CheckpointMode::AlignedTimeout(limit) = mode
            && let Some((id, started)) = aligner.pending()
            && started.elapsed() >= limit
            && !end_of_time.all_arrived_reached(aligner.arrived())
            && !final_or_told(&commands, &mut final_checkpoint, ck, id)?
        {
            tracing::debug!(checkpoint = %id, "alignment timed out: the checkpoint goes on unaligned");
            let inputs = unaligned::Inputs {
                gates: &gates,
                channels: &channels,
                ended: &ended,
                subtask: ck.spec.subtask,
                parallelism,
            };
            let arrived = aligner.switch(id);
            unaligned.start(ck, &inputs, id, tracker.current(), &arrived, true)?;
            weir_core::exchange::with_unaligned_barriers(|| target.send(Control::Barrier(id)))?;
            unaligned.drain(&inputs)?;
            unaligned.finish_if_done(ck, &inputs, &head_operator, tracker.current())?;
        }
        // A tick may flush the chain's buffers: not while the output has no room.
        let now = now_ms();
        if now != last_tick && weir_core::exchange::output_available() {
            last_tick = now;
            target.send(Control::Tick(now))?;
            ck.measure_state(job, false);
        }
    }
    // Sinks commit on completion: stay until the last snapshot is known complete.
    while ck.awaiting_completion() {
        if cancelled(ck) {
            return Err(Error::Cancelled);
        }
        let _idle = IdleTimer::start(&ck.spec.metrics);
        match commands.recv_timeout(Duration::from_millis(10)) {
            Ok(cmd) => ck.on_command(cmd)?,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(Error::Cancelled),
        }
    }
    // The state at the end, after the last snapshot.
    ck.measure_state(job, true);
    if tracker.current() < MAX_WATERMARK {
        target.send(Control::Watermark(MAX_WATERMARK))?;
    }
    target.send(Control::End)?;
    Ok(records)
}
