//! The task specifications of an attempt: which operators each task chains, its channels,
//! its restore, and the commands it takes.

use super::*;

pub(super) fn task_specs(
    job: &JobShared,
    cancel: &Arc<AtomicBool>,
    events: &Sender<TaskEvent>,
    restore: &mut RestoreMap,
    mut subset: Option<Subset<'_>>,
) -> Result<Vec<(TaskSpec, Sender<TaskCommand>)>> {
    let (graph, plan, cfg) = (&job.graph, &job.plan, &job.cfg);
    let xcfg: ExchangeConfig = cfg.exchange_config();
    let local_set = subset.as_ref().map(|x| x.local);
    let is_local = |head: usize, s: usize| local_set.is_none_or(|l| l.contains(&(head, s)));
    let mut specs: HashMap<(usize, usize), (TaskSpec, Sender<TaskCommand>)> = HashMap::new();
    let start = match &subset {
        Some(x) => x.start.clone(),
        None => {
            let tasks: usize = plan.heads.iter().map(|&h| plan.parallelism[h]).sum();
            Arc::new(task::StartGate::new(tasks))
        }
    };
    for &h in &plan.heads {
        for s in 0..plan.parallelism[h] {
            if !is_local(h, s) {
                continue;
            }
            let (ctx, crx) = crossbeam_channel::unbounded();
            // The restored state of every node of this task's chain, for this subtask.
            let mut chain_restore = HashMap::new();
            for n in 0..graph.nodes.len() {
                if plan.head_of[n] == h
                    && let Some(per) = restore.get_mut(&n)
                    && s < per.len()
                {
                    chain_restore.insert(n, std::mem::take(&mut per[s]));
                }
            }
            specs.insert(
                (h, s),
                (
                    TaskSpec {
                        index: 0,
                        head: h,
                        subtask: s,
                        writers: HashMap::new(),
                        readers: (0..graph.nodes[h].inputs.len()).map(|_| None).collect(),
                        progress: Arc::new(AtomicU64::new(0)),
                        commands: crx,
                        events: events.clone(),
                        cancel: cancel.clone(),
                        restore: chain_restore,
                        start: start.clone(),
                        metrics: job.status.task(graph, plan, h, s),
                    },
                    ctx,
                ),
            );
        }
    }
    for node in &graph.nodes {
        let c = node.id.0;
        if plan.chained[c] {
            continue;
        }
        for (gate, edge) in node.inputs.iter().enumerate() {
            let f = edge.from.0;
            let (producers, consumers) = (plan.parallelism[f], plan.parallelism[c]);
            let mut set = match &subset {
                Some(_) => edge.exchange.linked_channels(producers, consumers, xcfg),
                None => edge.exchange.channels(producers, consumers, xcfg),
            };
            if let Some(x) = subset.as_mut() {
                // A channel between two tasks of this process stays a plain channel; one
                // that crosses to another process is bridged over the network; one between
                // two other processes is none of this process's business.
                for link in std::mem::take(&mut set.links) {
                    let from_here = is_local(plan.head_of[f], link.producer);
                    let to_here = is_local(c, link.consumer);
                    if from_here != to_here {
                        let key = task::LinkKey {
                            node: c as u32,
                            gate: gate as u32,
                            producer: link.producer as u32,
                            consumer: link.consumer as u32,
                        };
                        (x.links)(key, link);
                    }
                }
            }
            for (p, w) in set.writers.into_iter().enumerate() {
                let key: WriterKey = (f, edge.port, c, gate);
                if let Some((spec, _)) = specs.get_mut(&(plan.head_of[f], p)) {
                    spec.writers.insert(key, w);
                } else if subset.is_none() {
                    return Err(Error::Config("internal: no task".into()));
                }
            }
            for (s, r) in set.readers.into_iter().enumerate() {
                if let Some((spec, _)) = specs.get_mut(&(c, s)) {
                    spec.readers[gate] = Some(r);
                } else if subset.is_none() {
                    return Err(Error::Config("internal: no task".into()));
                }
            }
        }
    }
    let mut out: Vec<(TaskSpec, Sender<TaskCommand>)> = specs.into_values().collect();
    out.sort_by_key(|(s, _)| (s.head, s.subtask));
    for (i, (s, _)) in out.iter_mut().enumerate() {
        s.index = i;
    }
    Ok(out)
}
