//! One attempt of a running job: the loop that watches its tasks, triggers checkpoints and
//! savepoints, takes their acknowledgements, and ends the attempt.

use super::*;

pub(super) fn run_attempt(
    name: &str,
    job: &Arc<JobShared>,
    storage: Option<&CheckpointStorage>,
    launched: Launched,
    first_id: CheckpointId,
    started: Instant,
    verification: Option<&verify::BackgroundVerify>,
) -> Result<Attempt> {
    let Launched {
        running,
        events: events_rx,
        cancel,
        on_cancel,
        threads,
    } = launched;
    let mut cancel_sent = false;
    let requests = storage.map(requests::Requests::new);
    let mut coordinator = match &job.cfg.checkpoint {
        Some(c) => {
            let sources = running.iter().filter(|t| t.is_source).map(|t| t.key);
            let others = running.iter().filter(|t| !t.is_source).map(|t| t.key);
            let cc = CoordinatorConfig {
                interval: c.interval,
                min_pause: c.min_pause,
                timeout: c.timeout,
                max_concurrent: 1,
                tolerable_timeouts: c.tolerable_timeouts,
            };
            Some(
                Coordinator::<Snapshots>::new(
                    cc,
                    CoordParticipants::new(sources, others),
                    first_id,
                )
                .map_err(|e| Error::Config(e.to_string()))?,
            )
        }
        None => None,
    };
    if let Some(c) = coordinator.as_mut() {
        // The first tick starts the interval clock.
        let first = c.tick(Instant::now());
        debug_assert!(first.is_empty(), "the first tick triggers nothing");
    }
    let by_key: HashMap<TaskKey, usize> = running
        .iter()
        .enumerate()
        .map(|(i, t)| (t.key, i))
        .collect();
    let progress = job.cfg.progress_interval;
    let mut next_progress = progress.map(|p| Instant::now() + p);
    let mut stats: Vec<Option<u64>> = vec![None; running.len()];
    let mut first_error: Option<Error> = None;
    let mut secondary: Option<Error> = None;
    let mut remaining = running.len();
    // Tasks that reported their end; when the tasks still running after a cancellation
    // are given up on, and whether they were left behind.
    let mut ended = vec![false; running.len()];
    let mut give_up_at: Option<Instant> = None;
    let mut abandoned = false;
    let mut sources_left: usize = running.iter().filter(|t| t.is_source).count();
    let mut completed: Option<CheckpointId> = None;
    let mut completed_count = 0u64;
    let mut savepoints = Vec::new();
    let mut stop_after: Option<CheckpointId> = None;
    let mut stopped = false;
    let mut finished_sources = std::collections::HashSet::new();
    // While the restored checkpoint's checksums are being read, checkpoints that complete
    // wait here before they are written: none commits until the restore is known sound.
    let mut verdict_rx = verification.map_or_else(crossbeam_channel::never, |v| v.verdict());
    // Some(true): the restored checkpoint verified; Some(false): it did not.
    let mut verdict: Option<bool> = None;
    let mut held: Vec<Action<Snapshots>> = Vec::new();
    // Checkpoints are written (files copied to storage, then the manifest) on a writer
    // thread, in the order they completed, so this loop keeps handling acknowledgements,
    // failures and progress while a large checkpoint uploads; the writer reports back on
    // `written_rx`.
    let (written_tx, written_rx) = crossbeam_channel::unbounded::<Written>();
    // Each checkpoint's span, from its trigger until it completes or is aborted.
    let mut spans: HashMap<CheckpointId, tracing::Span> = HashMap::new();
    let span_of = |spans: &HashMap<CheckpointId, tracing::Span>, id: &CheckpointId| {
        spans.get(id).cloned().unwrap_or_else(tracing::Span::none)
    };
    let ck_metrics = CheckpointMetrics::new(name);
    let writer = match storage {
        Some(storage) => Some(CheckpointWriter::start(
            storage.clone(),
            name,
            checkpoints::OperatorNames::new(&job.graph, &job.plan),
            job.cfg.max_parallelism,
            written_tx,
        )?),
        None => None,
    };
    while remaining > 0 {
        let now = Instant::now();
        let mut wake = now + Duration::from_millis(50);
        if let Some(t) = next_progress {
            wake = wake.min(t);
        }
        if let Some(d) = coordinator.as_ref().and_then(|c| c.next_deadline()) {
            wake = wake.min(d);
        }
        if let Some(d) = give_up_at {
            wake = wake.min(d);
        }
        let mut actions = Vec::new();
        let received = crossbeam_channel::select! {
            recv(events_rx) -> m => m.map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
            recv(written_rx) -> w => {
                if let (Ok(w), Some(c)) = (w, coordinator.as_mut()) {
                    let _span = span_of(&spans, &w.id).entered();
                    actions.extend(on_written(name, w, c, &mut savepoints, &ck_metrics, &job.status));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            }
            recv(verdict_rx) -> v => {
                verdict_rx = crossbeam_channel::never();
                if let (Ok(v), Some(verification)) = (v, verification) {
                    match v {
                        Ok(true) => {
                            verdict = Some(true);
                            actions.append(&mut held);
                        }
                        Ok(false) => {}
                        Err(e) => {
                            // The job goes back to an older checkpoint (run_with): stop this
                            // attempt, with the bad file as the reason.
                            verify::report_bad(name, verification.id, &verification.path, &e);
                            cancel.store(true, Ordering::SeqCst);
                            first_error = Some(checkpoints::storage_err(e));
                            verdict = Some(false);
                        }
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            }
            default(wake.saturating_duration_since(now)) => Err(crossbeam_channel::RecvTimeoutError::Timeout),
        };
        match received {
            Ok(TaskEvent::Ack {
                task,
                id,
                snapshot,
                alignment,
                sync,
            }) => {
                if let Some(c) = coordinator.as_mut() {
                    let _span = span_of(&spans, &id).entered();
                    let bytes = snapshot.values().map(|s| s.bytes() as u64).sum();
                    // Taken unaligned: the in-flight records stored with it.
                    let channel_state = snapshot
                        .values()
                        .filter_map(|s| s.keyed.get(weir_core::exchange::CHANNEL_STATE_TABLE))
                        .map(|t| t.iter().map(|(_, b)| b.len() as u64).sum::<u64>())
                        .reduce(|a, b| a + b);
                    if let Some(b) = channel_state {
                        job.status.checkpoint_channel_state(id, b);
                    }
                    let t = &running[task];
                    job.status.checkpoint_acked(
                        id,
                        t.key.node.0,
                        t.subtask,
                        bytes,
                        alignment,
                        sync,
                    );
                    let st = AckStats {
                        bytes,
                        alignment,
                        sync,
                        async_: Duration::ZERO,
                    };
                    actions.extend(c.ack(Instant::now(), running[task].key, id, snapshot, st));
                }
            }
            Ok(TaskEvent::SourceFinished { task }) => {
                if finished_sources.insert(task) {
                    sources_left = sources_left.saturating_sub(1);
                }
                if sources_left == 0
                    && let Some(c) = coordinator.as_mut()
                {
                    actions.extend(c.trigger_now(Instant::now(), CheckpointKind::Final));
                }
            }
            Ok(TaskEvent::Done { task, result }) => {
                remaining -= 1;
                ended[task] = true;
                let t = &running[task];
                match result {
                    Ok(Ok(n)) => stats[task] = Some(n),
                    Ok(Err(e)) if e.is_secondary() => {
                        secondary.get_or_insert(e);
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(job = name, operator = %t.name, subtask = t.subtask, error = %e, "job '{name}': a task ended with an error: {e}");
                        job.status.exception(&t.name, t.subtask, &e);
                        cancel.store(true, Ordering::SeqCst);
                        first_error.get_or_insert(e);
                    }
                    Err(panic) => {
                        let e = Error::from_panic(panic).at(|| weir_core::error::Location {
                            operator: t.name.clone(),
                            subtask: t.subtask,
                            parallelism: t.parallelism,
                        });
                        job.status.exception(&t.name, t.subtask, &e);
                        cancel.store(true, Ordering::SeqCst);
                        first_error.get_or_insert(e);
                    }
                }
                if stats[task].is_none()
                    && let Some(c) = coordinator.as_mut()
                {
                    actions.extend(c.task_failed(Instant::now(), t.key));
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        if job.cancel.load(Ordering::SeqCst) {
            cancel.store(true, Ordering::SeqCst);
        }
        if let Some(e) = crate::owner::lost(storage) {
            // Another run took the directories over: stop, with that as the reason.
            cancel.store(true, Ordering::SeqCst);
            first_error = Some(e);
        }
        if cancel.load(Ordering::SeqCst) && !cancel_sent {
            cancel_sent = true;
            give_up_at = cancellation_deadline(job, Instant::now());
            on_cancel();
        }
        if let Some(d) = give_up_at
            && Instant::now() >= d
        {
            leave_stuck_tasks(name, job, &running, &ended);
            abandoned = true;
            break;
        }
        if let (Some(c), Some(_)) = (coordinator.as_mut(), storage) {
            // Requests from JobHandle or from `weir savepoint` (a request file in the directory).
            let mut request = job.savepoint_request.swap(0, Ordering::SeqCst);
            if let Some(r) = &requests {
                request = request.max(r.take());
            }
            if request > 0 && stop_after.is_none() && !cancel.load(Ordering::SeqCst) {
                tracing::info!(
                    job = name,
                    stop = request == 2,
                    "job '{name}': taking a savepoint{}",
                    if request == 2 { " and stopping" } else { "" }
                );
                let before = c.next_id();
                actions.extend(c.trigger_now(Instant::now(), CheckpointKind::Savepoint));
                if request == 2 {
                    stop_after = Some(before);
                }
            }
        }
        if let (Some(p), Some(t)) = (progress, next_progress)
            && Instant::now() >= t
        {
            print_progress(name, &running, started);
            next_progress = Some(Instant::now() + p);
        }
        let Some(c) = coordinator.as_mut() else {
            continue;
        };
        if !cancel.load(Ordering::SeqCst) {
            actions.extend(c.tick(Instant::now()));
        }
        let mut queue: std::collections::VecDeque<_> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Trigger { id, sources, kind } => {
                    crate::task::barrier_trace(format_args!("coordinator trigger {id}"));
                    let span = tracing::info_span!("checkpoint", id = id.0, kind = %kind);
                    span.in_scope(|| {
                        tracing::debug!(job = name, "job '{name}': {} {id} triggered", noun(kind))
                    });
                    spans.insert(id, span);
                    job.status.checkpoint_triggered(id, kind);
                    let is_final = kind == CheckpointKind::Final;
                    if is_final {
                        // The final checkpoint is aligned in every mode (the sinks commit
                        // everything at it): operator tasks hear of it before its barrier.
                        for t in running.iter().filter(|t| !t.is_source) {
                            t.commands.send(TaskCommand::Trigger(id, true));
                        }
                    }
                    for k in sources {
                        running[by_key[&k]]
                            .commands
                            .send(TaskCommand::Trigger(id, is_final));
                    }
                }
                Action::Complete { .. } if verification.is_some() && verdict != Some(true) => {
                    if held.is_empty() {
                        tracing::info!(
                            job = name,
                            "job '{name}': checkpoint waits until the restored checkpoint's files are verified"
                        );
                    }
                    held.push(action);
                }
                Action::Complete {
                    id,
                    kind,
                    acks,
                    stats,
                } => {
                    let span = span_of(&spans, &id);
                    let _span = span.clone().entered();
                    job.status.checkpoint_acknowledged(id, &stats);
                    let writer = writer.as_ref().expect("checkpointing has a writer");
                    let stops_job =
                        kind == CheckpointKind::Savepoint && stop_after.is_some_and(|s| id >= s);
                    if let Err(e) = writer.write(id, kind, stops_job, acks, stats, span) {
                        queue.extend(c.completion_failed(Instant::now(), id, e));
                    }
                }
                Action::Notify { id, kind } => {
                    let _span = spans.remove(&id).map(tracing::Span::entered);
                    // Sinks commit on this notification: only while this run owns the
                    // directories.
                    if let Err(e) = crate::owner::verify(storage) {
                        cancel.store(true, Ordering::SeqCst);
                        first_error = Some(e);
                        continue;
                    }
                    completed_count += 1;
                    let stops =
                        kind == CheckpointKind::Savepoint && stop_after.is_some_and(|s| id >= s);
                    // An intermediate savepoint commits nothing (decision 0017): its epoch is
                    // committed by the next checkpoint, so a crash after it resumes from the
                    // last checkpoint without output that no checkpoint covers. A savepoint
                    // that stops the job commits, and is a recovery point of its directory.
                    if kind != CheckpointKind::Savepoint || stops {
                        completed = Some(id);
                        for t in &running {
                            t.commands.send(TaskCommand::Complete(id));
                        }
                    }
                    if stops {
                        // Tasks handle commands in order: they commit, then stop.
                        stopped = true;
                        for t in &running {
                            t.commands.send(TaskCommand::Stop);
                        }
                    }
                    if let Some(cfg) = &job.cfg.checkpoint
                        && let Err(e) = storage.expect("storage").retain(cfg.retain)
                    {
                        tracing::warn!(error = %e, "removing old checkpoints failed");
                    }
                }
                Action::Abort { id, reason, kind } => {
                    let _span = spans.remove(&id).map(tracing::Span::entered);
                    tracing::info!(job = name, checkpoint = id.0, %reason, "job '{name}': {} {id} aborted: {reason}", noun(kind));
                    job.status.checkpoint_failed(id, reason.to_string());
                    ck_metrics.failed.inc();
                    if kind == CheckpointKind::Final && !cancel.load(Ordering::SeqCst) {
                        // The job cannot end without its final checkpoint: try again.
                        tracing::warn!(
                            job = name,
                            checkpoint = id.0,
                            "job '{name}': final checkpoint {id} aborted ({reason}); retrying"
                        );
                        queue.extend(c.trigger_now(Instant::now(), CheckpointKind::Final));
                    }
                    if let Some(storage) = storage
                        && let Err(e) = storage.discard(id)
                    {
                        tracing::warn!(checkpoint = %id, error = %e, "removing an aborted checkpoint failed");
                    }
                    for t in &running {
                        t.commands.send(TaskCommand::Abort(id));
                    }
                }
                Action::Fail { id, reason } => {
                    let _span = spans.remove(&id).map(tracing::Span::entered);
                    let message = format!(
                        "checkpoint {id} timed out: {reason}. A task, its state backend or the \
                         checkpoint storage stopped answering: the job stops its tasks and \
                         restarts from its latest completed checkpoint. If checkpoints are \
                         slow rather than stuck, raise the checkpoint timeout or \
                         tolerable_timeouts"
                    );
                    tracing::error!(job = name, checkpoint = id.0, "job '{name}': {message}");
                    if reason.writing {
                        // Still pending (being written): no abort reported it.
                        job.status.checkpoint_failed(id, reason.to_string());
                        ck_metrics.failed.inc();
                    }
                    cancel.store(true, Ordering::SeqCst);
                    first_error.get_or_insert(Error::User(message));
                }
            }
        }
    }
    for t in threads {
        // A stuck task's thread is left behind (leave_stuck_tasks said which).
        if !abandoned || t.is_finished() {
            let _ = t.join();
        }
    }
    // A checkpoint still being written when the job ended is finished (or fails) before
    // the job returns, so nothing writes to the checkpoint directory afterwards. When
    // tasks were left behind, the writer may be waiting for one of them: it is told to
    // write no metadata any more, and left behind too if it is still busy.
    if let Some(w) = writer {
        if abandoned {
            w.abandon();
        } else {
            w.finish();
        }
    }
    if let Some(e) = crate::owner::lost(storage) {
        first_error = Some(e);
    }
    let result = if stopped && first_error.is_none() {
        Ok(())
    } else if let Some(e) = first_error.or(secondary) {
        Err(e)
    } else {
        if progress.is_some() {
            print_progress(name, &running, started);
        }
        Ok(())
    };
    let stopped = stopped && result.is_ok();
    let tasks = running
        .into_iter()
        .zip(stats)
        .map(|(t, n)| TaskStats {
            name: t.name,
            subtask: t.subtask,
            records: n.unwrap_or(0),
            is_source: t.is_source,
        })
        .collect();
    Ok(Attempt {
        result: result.map(|()| tasks),
        completed,
        savepoints,
        stopped,
        completed_count,
        verdict,
    })
}

fn print_progress(name: &str, running: &[Running], started: Instant) {
    let read: u64 = running
        .iter()
        .filter(|t| t.is_source)
        .map(|t| t.progress.load(Ordering::Relaxed))
        .sum();
    let processed: u64 = running
        .iter()
        .filter(|t| !t.is_source)
        .map(|t| t.progress.load(Ordering::Relaxed))
        .sum();
    let secs = started.elapsed().as_secs_f64();
    tracing::info!(
        job = name,
        records_read = read,
        records_received = processed,
        "job '{name}': {read} records read, {processed} records received by downstream tasks, {secs:.1}s ({:.0} records/s)",
        read as f64 / secs.max(1e-9)
    );
}

/// When the tasks of an attempt cancelled at `at` are given up on, if ever
/// ([`JobConfig::cancellation_timeout`](crate::JobConfig::cancellation_timeout)).
fn cancellation_deadline(job: &JobShared, at: Instant) -> Option<Instant> {
    let timeout = job.cfg.cancellation_timeout;
    (!timeout.is_zero()).then(|| at + timeout)
}

/// Says which tasks did not stop within the cancellation timeout; the attempt then ends
/// without them.
fn leave_stuck_tasks(name: &str, job: &JobShared, running: &[Running], ended: &[bool]) {
    let stuck: Vec<String> = running
        .iter()
        .zip(ended)
        .filter(|(_, ended)| !**ended)
        .map(|(t, _)| format!("'{}' (subtask {}/{})", t.name, t.subtask + 1, t.parallelism))
        .collect();
    let timeout = job.cfg.cancellation_timeout;
    tracing::error!(
        job = name,
        tasks = stuck.len(),
        "job '{name}': {} did not stop within {timeout:?} of being cancelled: stuck in a \
         call that does not return, and left behind (a thread keeps what it holds until its \
         call returns). JobConfig::cancellation_timeout sets the wait",
        stuck.join(", ")
    );
}
