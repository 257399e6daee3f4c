//! A source task's loop: polls its source, ticks, injects the barriers the coordinator
//! triggers, and at the end of its input waits for the final checkpoint.

use super::*;

pub(super) fn run_source(
    job: &JobShared,
    mut src: Box<dyn SourceTask>,
    cells: Option<&crate::status::NodeCells>,
    mut aligner: Option<crate::alignment::SourceAligner>,
    ck: &mut Checkpoints<'_>,
) -> Result<u64> {
    let checkpointing = job.cfg.checkpoint.is_some();
    // Tick once before the first record, so that operators know the processing time from
    // the start (KeyedContext::current_processing_time would read 0 until the first tick).
    let mut last_tick = now_ms();
    src.control(Control::Tick(last_tick))?;
    let mut finished = false;
    let mut markers = job
        .cfg
        .latency_tracking_interval
        .map(|interval| crate::latency::Emitter::new(job, ck.spec.head, ck.spec.subtask, interval));
    // After the input ended: the first barrier injected then, whose completion ends us.
    let mut final_barrier: Option<CheckpointId> = None;
    loop {
        if cancelled(ck) {
            return Err(Error::Cancelled);
        }
        // Watermark alignment: a source too far ahead waits here, answering commands.
        let paused = aligner
            .as_mut()
            .filter(|_| !finished)
            .and_then(|a| a.paused(Instant::now()).then(|| a.wait(Instant::now())));
        let cmd = if finished || paused.is_some() {
            let _idle = IdleTimer::start(&ck.spec.metrics);
            let wait = paused.unwrap_or(Duration::from_millis(10));
            match ck.spec.commands.recv_timeout(wait) {
                Ok(c) => Some(c),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Cancelled);
                }
            }
        } else if !weir_core::exchange::output_available() {
            // The output has no room: a poll now would wait in a send, deaf to checkpoint
            // triggers. Wait for room here instead, taking commands.
            let waiting = Instant::now();
            let r = ck.spec.commands.recv_timeout(OUTPUT_WAIT);
            ck.spec
                .metrics
                .backpressured_ns
                .fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match r {
                Ok(c) => Some(c),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Cancelled);
                }
            }
        } else {
            ck.spec.commands.try_recv().ok()
        };
        if let Some(cmd) = cmd {
            if let TaskCommand::Trigger(id, is_final) = cmd {
                barrier_trace(format_args!("source {} trigger {id}", ck.spec.index));
                ck.snapshot(id, Duration::ZERO, None)?;
                if unaligned_mode(job) && !is_final {
                    // Ahead of the records queued in the channels.
                    weir_core::exchange::with_unaligned_barriers(|| {
                        src.control(Control::Barrier(id))
                    })?;
                } else {
                    // After the end of its input (the final checkpoint among them) a
                    // source's barriers never go on a priority lane.
                    end_of_time::send_barrier(mode_of(job), finished || is_final, || {
                        src.control(Control::Barrier(id))
                    })?;
                }
                // Only the final checkpoint (requested once every source finished) ends a
                // finished source: earlier ones still need every source to acknowledge.
                if finished && is_final {
                    final_barrier = Some(id);
                }
            }
            ck.on_command(cmd)?;
            if let (Some(f), Some(c)) = (final_barrier, ck.last_complete)
                && c >= f
            {
                break;
            }
            continue;
        }
        if finished {
            continue;
        }
        if paused.is_some() {
            let now = now_ms();
            if now != last_tick {
                last_tick = now;
                src.control(Control::Tick(now))?;
            }
            continue;
        }
        let status = src.poll()?;
        ck.spec.progress.store(src.emitted(), Ordering::Relaxed);
        if let Some(c) = cells {
            c.records_out[0].store(src.emitted(), Ordering::Relaxed);
            if let Some(w) = src.watermark() {
                c.watermark_out.store(w, Ordering::Relaxed);
            }
        }
        let now = now_ms();
        if now != last_tick {
            last_tick = now;
            src.control(Control::Tick(now))?;
        }
        // A marker waits while the output has no room (sending it would wait too).
        if let Some(m) = markers
            .as_mut()
            .filter(|_| weir_core::exchange::output_available())
            .and_then(crate::latency::Emitter::due)
        {
            src.control(Control::LatencyMarker(m))?;
        }
        match status {
            SourceStatus::More => {}
            SourceStatus::Idle(ms) => {
                // No record joins a partly filled batch while the source sleeps.
                src.control(Control::Flush)?;
                let _idle = IdleTimer::start(&ck.spec.metrics);
                std::thread::sleep(Duration::from_millis(ms.clamp(1, 50)))
            }
            SourceStatus::Finished => {
                src.control(Control::Watermark(MAX_WATERMARK))?;
                if let Some(c) = cells {
                    c.watermark_out.store(MAX_WATERMARK, Ordering::Relaxed);
                }
                if let Some(a) = aligner.as_mut() {
                    a.finished();
                }
                if !checkpointing {
                    break;
                }
                finished = true;
                let _ = ck.spec.events.send(TaskEvent::SourceFinished {
                    task: ck.spec.index,
                });
            }
        }
    }
    src.control(Control::End)?;
    Ok(src.emitted())
}
