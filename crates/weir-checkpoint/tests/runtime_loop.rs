//! The coordinator and the storage driven together the way the runtime drives them: tasks on
//! threads write their files through clones of one writer and acknowledge over a channel; the
//! coordinator thread writes the manifest, confirms completion and applies retention. Then a
//! "crash": the newest checkpoint is damaged, and restore falls back and resumes numbering.

use serde_json::json;
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use weir_checkpoint::{
    AckStats, Action, CheckpointId, CheckpointKind, CheckpointStorage, Coordinator,
    CoordinatorConfig, FileEntry, Manifest, ManifestStats, OperatorManifest, Participants,
    SubtaskManifest, TaskKey,
};

/// What a task hands to the coordinator with its ack.
#[derive(Debug)]
struct Snapshot {
    files: Vec<FileEntry>,
    operator_state: Option<serde_json::Value>,
}

const SOURCES: [TaskKey; 2] = [task(0, 0), task(0, 1)];
const SUMS: [TaskKey; 2] = [task(1, 0), task(1, 1)];

const fn task(node: usize, subtask: usize) -> TaskKey {
    TaskKey {
        node: weir_core::ids::NodeId(node),
        subtask: weir_core::ids::SubtaskIndex(subtask),
    }
}

fn coordinator(first_id: CheckpointId) -> Coordinator<Snapshot> {
    let config = CoordinatorConfig::every(Duration::from_millis(100));
    Coordinator::new(config, Participants::new(SOURCES, SUMS), first_id).unwrap()
}

/// Runs until `checkpoints` checkpoints completed; returns the completed ids.
fn run(storage: &CheckpointStorage, c: &mut Coordinator<Snapshot>, checkpoints: usize) -> Vec<u64> {
    let (ack_tx, ack_rx) = mpsc::channel::<(TaskKey, CheckpointId, Snapshot, AckStats)>();
    let mut now = Instant::now();
    let mut completed = Vec::new();
    let mut writers = HashMap::new();
    let mut actions = c.tick(now);
    loop {
        for action in std::mem::take(&mut actions) {
            match action {
                Action::Trigger { id, kind, .. } => {
                    let writer = storage.begin(id, kind).unwrap();
                    writers.insert(id, writer.clone());
                    // barriers reach every task; each snapshots on its own thread
                    for t in SOURCES.into_iter().chain(SUMS) {
                        let (writer, ack_tx) = (writer.clone(), ack_tx.clone());
                        std::thread::spawn(move || {
                            let snapshot = if t.node.0 == 0 {
                                Snapshot {
                                    files: vec![],
                                    operator_state: Some(json!({ "offset": id.0 * 10 })),
                                }
                            } else {
                                let own = writer
                                    .write_file(&format!("sum-{}-{}", t.subtask, id), b"sums")
                                    .unwrap();
                                let sst = writer
                                    .write_shared(
                                        &format!("sst-{}-{}", t.subtask, id.0 / 2),
                                        b"sst",
                                    )
                                    .unwrap();
                                Snapshot {
                                    files: vec![own, sst],
                                    operator_state: None,
                                }
                            };
                            let stats = AckStats {
                                bytes: 7,
                                alignment: Duration::from_millis(t.subtask.0 as u64),
                                ..AckStats::default()
                            };
                            ack_tx.send((t, id, snapshot, stats)).unwrap();
                        });
                    }
                }
                Action::Complete {
                    id,
                    kind,
                    acks,
                    stats,
                } => {
                    let mut manifest = Manifest::new("it", id, kind, 128);
                    manifest.stats = ManifestStats::from(&stats);
                    for (node, name) in [(0, "source"), (1, "sum")] {
                        let subtasks = acks
                            .iter()
                            .filter(|(t, _)| t.node.0 == node)
                            .map(|(t, s)| SubtaskManifest {
                                subtask: t.subtask.0,
                                files: s.files.clone(),
                                operator_state: s.operator_state.clone(),
                                watermark: None,
                            })
                            .collect();
                        manifest.operators.push(OperatorManifest {
                            uid: name.into(),
                            name: name.into(),
                            parallelism: 2,
                            subtasks,
                        });
                    }
                    assert_eq!(manifest.stats.bytes, 28);
                    assert_eq!(manifest.stats.alignment_ms, 1);
                    let writer = writers.remove(&id).unwrap();
                    assert!(
                        storage.load(writer.path()).is_err(),
                        "not complete before finish"
                    );
                    writer.finish(manifest).unwrap();
                    actions.extend(c.completed(now, id));
                    completed.push(id.0);
                }
                Action::Notify { .. } => {
                    storage.retain(2).unwrap();
                }
                Action::Abort { id, reason, .. } => panic!("checkpoint {id} aborted: {reason}"),
                Action::Fail { id, reason } => panic!("checkpoint {id} failed the job: {reason}"),
            }
        }
        if completed.len() >= checkpoints {
            if actions.is_empty() {
                return completed;
            }
            continue;
        }
        if let Ok((t, id, snapshot, stats)) = ack_rx.recv_timeout(Duration::from_millis(10)) {
            actions.extend(c.ack(now, t, id, snapshot, stats));
        } else {
            now += Duration::from_millis(50);
            actions.extend(c.tick(now));
        }
    }
}

#[test]
fn checkpoints_restore_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path()).unwrap();
    let mut c = coordinator(storage.next_id().unwrap());
    assert_eq!(run(&storage, &mut c, 5), [1, 2, 3, 4, 5]);

    let list = storage.list().unwrap();
    assert_eq!(
        list.iter().map(|i| i.id.0).collect::<Vec<_>>(),
        [4, 5],
        "retain(2)"
    );
    let latest = storage.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(latest.manifest.checkpoint_id, CheckpointId(5));
    let source = latest.manifest.operator("source").unwrap();
    assert_eq!(
        source.subtasks[1].operator_state,
        Some(json!({ "offset": 50 }))
    );

    // checkpoints 4 and 5 share their SST files; 3's were deleted with it
    let shared: Vec<String> = std::fs::read_dir(storage.dir().join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(shared.len(), 2, "{shared:?}");

    // crash; a file of the newest checkpoint is damaged on disk
    drop(c);
    let own = latest.manifest.files().find(|f| !f.shared).unwrap();
    std::fs::write(latest.path.join(&own.name), b"xxxx").unwrap();
    let restored = storage.latest_complete().unwrap();
    assert_eq!(restored.skipped.len(), 1);
    assert!(restored.skipped[0].error.to_string().contains(&own.name));
    let fallback = restored.checkpoint.expect("checkpoint 4 still verifies");
    assert_eq!(fallback.manifest.checkpoint_id, CheckpointId(4));
    for f in fallback.manifest.files() {
        storage.read_file(&fallback.path, f).unwrap();
    }

    // numbering resumes after every existing directory, not after the restored one
    let mut c = coordinator(storage.next_id().unwrap());
    assert_eq!(c.next_id(), CheckpointId(6));
    assert_eq!(run(&storage, &mut c, 1), [6]);
    let sp = c.trigger_now(Instant::now(), CheckpointKind::Savepoint);
    assert!(matches!(
        &sp[..],
        [Action::Trigger {
            id: CheckpointId(7),
            kind: CheckpointKind::Savepoint,
            ..
        }]
    ));
}
