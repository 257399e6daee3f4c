//! Watermark alignment at run time: resolves the alignment groups of a job's graph to the
//! source tasks that take part ([`Groups`], built once per job), and gives each source
//! subtask its [`SourceAligner`], which publishes the group's limit every update interval
//! and tells the task loop when to stop polling.
//!
//! The members of a group are the subtasks of its sources in this process: each reports the
//! watermark its source emits (observed on the output of the node that asked for alignment:
//! the source, or the `with_watermarks` chained to it) and whether it is idle or finished. The group's minimum is computed from those reports by whichever
//! member's update interval is due, without a thread of its own. In a cluster, each worker
//! sends its members' reports with every heartbeat and the coordinator answers with every
//! member's ([`MemberReport`]), so a group spans workers, one heartbeat late at most. Owns no task loop code: `task::run_source` asks [`SourceAligner::paused`].

use crate::plan::Plan;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_core::graph::{Graph, NodeKind};
use weir_core::time::{MAX_WATERMARK, MIN_WATERMARK};
use weir_core::watermark::{
    AlignmentHandle, AlignmentMember, MemberStatus, WatermarkAlignment, group_minimum, max_allowed,
};
use weir_core::{Error, Result};

/// One aligned source: its configuration, its subtasks' members and its whole group's.
struct AlignedSource {
    cfg: WatermarkAlignment,
    members: Vec<AlignmentMember>,
    /// Which members' tasks run in this process (the others report through the cluster).
    local: Vec<AtomicBool>,
    group: Arc<[AlignmentMember]>,
}

/// One member's report as it crosses processes (cluster mode): the source's task head and
/// subtask, its watermark and status (0 active, 1 idle, 2 finished).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MemberReport {
    pub head: u32,
    pub subtask: u32,
    pub watermark: i64,
    pub status: u8,
}

fn status_code(s: MemberStatus) -> u8 {
    match s {
        MemberStatus::Active => 0,
        MemberStatus::Idle => 1,
        MemberStatus::Finished => 2,
    }
}

fn status_of(code: u8) -> MemberStatus {
    match code {
        0 => MemberStatus::Active,
        1 => MemberStatus::Idle,
        _ => MemberStatus::Finished,
    }
}

/// The alignment groups of a job, by the task head (a source node) that takes part.
#[derive(Default)]
pub(crate) struct Groups {
    sources: HashMap<usize, AlignedSource>,
}

impl Groups {
    /// Resolves the groups of `graph`: every node that asks for alignment must run in a
    /// source's task, at most one per task, with a valid configuration.
    ///
    /// # Errors
    /// [`Error::Config`] naming the group and the operator when one does not.
    pub(crate) fn new(graph: &Graph, plan: &Plan) -> Result<Groups> {
        let mut configs: HashMap<usize, (WatermarkAlignment, &str)> = HashMap::new();
        for node in &graph.nodes {
            let Some(cfg) = &node.watermark_alignment else {
                continue;
            };
            cfg.validate()?;
            let head = plan.head_of[node.id.0];
            let source = &graph.nodes[head];
            if source.kind != NodeKind::Source {
                return Err(Error::Config(format!(
                    "watermark alignment group '{}' is set on '{}', which runs in the task of \
                     '{}', not in a source's task: apply the aligned watermark strategy right \
                     after the source, at the source's parallelism, with no key_by, rebalance \
                     or operator of another parallelism in between",
                    cfg.group(),
                    node.name,
                    source.name
                )));
            }
            if let Some((other, by)) = configs.get(&head)
                && (other != cfg || *by != node.name)
            {
                return Err(Error::Config(format!(
                    "source '{}' has two watermark alignments ('{}' on '{by}' and '{}' on '{}'); \
                     give it one",
                    source.name,
                    other.group(),
                    cfg.group(),
                    node.name
                )));
            }
            configs.insert(head, (cfg.clone(), &node.name));
        }
        let mut by_group: HashMap<String, Vec<(usize, Vec<AlignmentMember>)>> = HashMap::new();
        for (&head, (cfg, _)) in &configs {
            // Active without a watermark until it reports: a subtask of another worker
            // holds the group back until its first report arrives.
            let members: Vec<AlignmentMember> = (0..plan.parallelism[head])
                .map(|_| AlignmentMember::new())
                .collect();
            by_group
                .entry(cfg.group().to_string())
                .or_default()
                .push((head, members));
        }
        let mut sources = HashMap::new();
        for (_, heads) in by_group {
            let group: Arc<[AlignmentMember]> =
                heads.iter().flat_map(|(_, m)| m.iter().cloned()).collect();
            for (head, members) in heads {
                let cfg = configs[&head].0.clone();
                sources.insert(
                    head,
                    AlignedSource {
                        cfg,
                        local: members.iter().map(|_| AtomicBool::new(false)).collect(),
                        members,
                        group: group.clone(),
                    },
                );
            }
        }
        Ok(Groups { sources })
    }

    /// The aligner of subtask `subtask` of the task headed by `head`, when that is an
    /// aligned source. Its member starts over (active, no watermark): called once per
    /// attempt as the task builds, before any source of the attempt polls.
    pub(crate) fn source(
        &self,
        head: usize,
        subtask: usize,
        paused_ns: Option<Arc<AtomicU64>>,
    ) -> Option<SourceAligner> {
        let s = self.sources.get(&head)?;
        let member = s.members.get(subtask)?.clone();
        s.local[subtask].store(true, Ordering::Relaxed);
        member.reset();
        Some(SourceAligner {
            handle: AlignmentHandle::new(s.cfg.group()),
            cfg: s.cfg.clone(),
            member,
            group: s.group.clone(),
            next_update: None,
            paused_since: None,
            paused_ns: paused_ns.unwrap_or_default(),
        })
    }
}

impl Groups {
    fn reports(&self, local_only: bool) -> Vec<MemberReport> {
        let mut out = Vec::new();
        for (&head, s) in &self.sources {
            for (i, m) in s.members.iter().enumerate() {
                if local_only && !s.local[i].load(Ordering::Relaxed) {
                    continue;
                }
                let (watermark, status) = m.report();
                out.push(MemberReport {
                    head: head as u32,
                    subtask: i as u32,
                    watermark,
                    status: status_code(status),
                });
            }
        }
        out
    }

    /// A worker: the reports of the members whose tasks run here, to send with a
    /// heartbeat (`None`: the job has no alignment group).
    pub(crate) fn local_reports(&self) -> Option<Vec<MemberReport>> {
        (!self.sources.is_empty()).then(|| self.reports(true))
    }

    /// The coordinator: every member's last report.
    pub(crate) fn all_reports(&self) -> Vec<MemberReport> {
        self.reports(false)
    }

    /// Takes the reports of members that run in other processes (those of this
    /// process's own tasks are left alone).
    pub(crate) fn import(&self, reports: &[MemberReport]) {
        for r in reports {
            let Some(s) = self.sources.get(&(r.head as usize)) else {
                continue;
            };
            let i = r.subtask as usize;
            if let (Some(m), Some(local)) = (s.members.get(i), s.local.get(i))
                && !local.load(Ordering::Relaxed)
            {
                m.set_report(r.watermark, status_of(r.status));
            }
        }
    }
}

/// One source subtask's view of its alignment group (owned by the task's thread).
pub(crate) struct SourceAligner {
    cfg: WatermarkAlignment,
    member: AlignmentMember,
    group: Arc<[AlignmentMember]>,
    handle: AlignmentHandle,
    next_update: Option<Instant>,
    paused_since: Option<Instant>,
    /// Time spent paused, for the REST API and `/metrics`.
    paused_ns: Arc<AtomicU64>,
}

impl SourceAligner {
    /// The limit the source itself reads (split-level alignment).
    pub(crate) fn handle(&self) -> &AlignmentHandle {
        &self.handle
    }

    /// The member the output of the node that asked for alignment reports to.
    pub(crate) fn member(&self) -> AlignmentMember {
        self.member.clone()
    }

    /// The source read all of its input: it no longer holds the group back.
    pub(crate) fn finished(&mut self) {
        self.member.finish();
        self.resume(Instant::now());
    }

    /// Publishes the group's limit when the update interval is due.
    fn refresh(&mut self, now: Instant) {
        if self.next_update.is_some_and(|t| now < t) {
            return;
        }
        let min = group_minimum(self.group.iter().map(AlignmentMember::report));
        self.handle
            .publish(max_allowed(min, self.cfg.max_drift_ms()));
        self.next_update = Some(now + self.cfg.update_interval());
    }

    /// True while the source must not poll: its watermark is beyond the group's minimum
    /// plus the maximum drift, as last published.
    pub(crate) fn paused(&mut self, now: Instant) -> bool {
        self.refresh(now);
        let (wm, status) = self.member.report();
        let paused = status != MemberStatus::Finished
            && wm != MIN_WATERMARK
            && wm != MAX_WATERMARK
            && !self.handle.allows(wm);
        if paused {
            if self.paused_since.is_none() {
                tracing::debug!(
                    group = self.cfg.group(),
                    watermark = wm,
                    limit = self.handle.max_allowed_watermark(),
                    "source paused by watermark alignment"
                );
                self.paused_since = Some(now);
            } else {
                // Still paused: count the time so far, so the figures grow while it lasts.
                self.resume(now);
                self.paused_since = Some(now);
            }
        } else {
            self.resume(now);
        }
        paused
    }

    /// How long a paused source waits for commands before it looks again.
    pub(crate) fn wait(&self, now: Instant) -> Duration {
        self.next_update
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
            .clamp(Duration::from_millis(1), Duration::from_millis(10))
    }

    fn resume(&mut self, now: Instant) {
        if let Some(since) = self.paused_since.take() {
            let d = now.saturating_duration_since(since);
            self.paused_ns
                .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

impl Drop for SourceAligner {
    fn drop(&mut self) {
        // However the task ends, it no longer holds the group back.
        self.member.finish();
        self.resume(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligner(group: &[AlignmentMember], me: usize, drift: u64) -> SourceAligner {
        let cfg =
            WatermarkAlignment::new("g", Duration::from_millis(drift), Duration::from_millis(50));
        group[me].reset();
        SourceAligner {
            handle: AlignmentHandle::new("g"),
            cfg,
            member: group[me].clone(),
            group: group.to_vec().into(),
            next_update: None,
            paused_since: None,
            paused_ns: Arc::default(),
        }
    }

    #[test]
    fn a_source_ahead_pauses_until_the_published_minimum_catches_up() {
        let group = vec![AlignmentMember::new(), AlignmentMember::new()];
        let mut fast = aligner(&group, 0, 100);
        let mut slow = aligner(&group, 1, 100);
        let t0 = Instant::now();
        group[0].report_watermark(1_000);
        // The slow one has no watermark yet: it holds the fast one back.
        assert!(fast.paused(t0));
        assert!(!slow.paused(t0));
        group[1].report_watermark(950);
        // Not republished before the interval is due.
        assert!(fast.paused(t0 + Duration::from_millis(10)));
        assert!(!fast.paused(t0 + Duration::from_millis(50)));
        assert_eq!(fast.handle().max_allowed_watermark(), 1_050);
        group[0].report_watermark(1_051);
        assert!(fast.paused(t0 + Duration::from_millis(60)));
        // The slow source becomes idle: the fast one reads again at the next update.
        group[1].set_idle(true);
        assert!(!fast.paused(t0 + Duration::from_millis(100)));
        assert!(fast.paused_ns.load(Ordering::Relaxed) >= 80_000_000);
        slow.finished();
        drop(fast);
        assert_eq!(group[0].report().1, MemberStatus::Finished);
    }
}
