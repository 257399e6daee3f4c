use super::*;
use std::time::{Duration, Instant};
use weir_core::checkpoint::LocalFile;
use weir_core::ids::{NodeId, SubtaskIndex};

/// One stateful operator "sum" at parallelism 1.
fn names() -> OperatorNames {
    OperatorNames(HashMap::from([(
        "sum".to_string(),
        (0, "sum".to_string(), 1),
    )]))
}

fn stats() -> weir_checkpoint::CheckpointStats {
    weir_checkpoint::CheckpointStats {
        triggered_at: Instant::now(),
        duration: Duration::ZERO,
        bytes: 0,
        max_alignment: Duration::ZERO,
        max_sync: Duration::ZERO,
        max_async: Duration::ZERO,
        tasks: Vec::new(),
    }
}

/// Writes checkpoint `id` of the operator, whose backend holds the given SST files.
fn write(
    storage: &CheckpointStorage,
    id: u64,
    kind: CheckpointKind,
    ssts: &[&Path],
) -> Result<PathBuf> {
    let snap = OperatorSnapshot {
        description: Some(format!("as of {id}")),
        files: ssts
            .iter()
            .map(|p| LocalFile {
                path: p.to_path_buf(),
                name: format!("inst-{}", p.file_name().unwrap().to_string_lossy()),
                shared: true,
            })
            .collect(),
        ..OperatorSnapshot::default()
    };
    let task = TaskKey {
        node: NodeId(0),
        subtask: SubtaskIndex(0),
    };
    let acks = vec![(task, BTreeMap::from([("sum".to_string(), snap)]))];
    write_checkpoint(
        storage,
        "job",
        &names(),
        128,
        CheckpointId(id),
        kind,
        false,
        acks,
        &stats(),
        &Default::default(),
    )
    .map(|(path, _)| path)
}

/// Loads a checkpoint and reads every file it lists, as a restore does.
fn restore_files(storage: &CheckpointStorage, path: &Path) -> Vec<(String, Vec<u8>)> {
    let manifest = storage.load(path).expect("the checkpoint verifies");
    manifest
        .files()
        .map(|f| (f.name.clone(), storage.read_file(path, f).unwrap()))
        .collect()
}

/// A `.state` file keeps the layout it had before snapshots carried a watermark.
#[test]
fn parallel_map_keeps_the_items_order_and_each_result() {
    let mut items: Vec<u64> = (0..50).collect();
    let out = parallel_map(&mut items, 8, |x| {
        *x += 1;
        if *x % 7 == 0 {
            Err(Error::Config(format!("{x} is a multiple of 7")))
        } else {
            Ok(*x * 10)
        }
    });
    assert_eq!(items, (1..=50).collect::<Vec<u64>>());
    for (i, r) in out.into_iter().enumerate() {
        let x = i as u64 + 1;
        match r {
            Ok(v) => assert_eq!(v, x * 10),
            Err(e) => assert_eq!(
                e.to_string(),
                format!("invalid configuration: {x} is a multiple of 7")
            ),
        }
    }
}

#[test]
fn state_files_keep_their_layout() {
    #[derive(serde::Serialize)]
    struct Before {
        keyed: BTreeMap<String, weir_core::checkpoint::KeyGroupBlobs>,
        operator: Option<Vec<u8>>,
        description: Option<String>,
        files: Vec<LocalFile>,
    }
    let before = Before {
        keyed: BTreeMap::from([("t".to_string(), vec![(3, vec![1, 2])])]),
        operator: Some(vec![9]),
        description: Some("d".into()),
        files: vec![],
    };
    let old = codec::encode(&before).unwrap();
    let snap = decode_state_file(&old).unwrap();
    assert_eq!(snap.operator, Some(vec![9]));
    assert_eq!(snap.watermark, None);
    let again = OperatorSnapshot {
        watermark: Some(7),
        ..snap
    };
    assert_eq!(encode_state_file(&again).unwrap(), old);
}

#[test]
fn a_shared_file_retention_deleted_is_stored_again_when_needed() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path().join("ck")).unwrap();
    let sst = tmp.path().join("000012.sst");
    std::fs::write(&sst, b"sst twelve").unwrap();
    let ck = CheckpointKind::Checkpoint;

    // Checkpoint 1 stores the SST file in shared/; 2 and 3 do not need it, and
    // retention (keeping 1) deletes it. A savepoint stores its own copy.
    write(&storage, 1, ck, &[&sst]).unwrap();
    write(&storage, 2, ck, &[]).unwrap();
    let sp = write(&storage, 3, CheckpointKind::Savepoint, &[&sst]).unwrap();
    write(&storage, 4, ck, &[]).unwrap();
    let report = storage.retain(1).unwrap();
    assert_eq!(report.deleted_shared, ["inst-000012.sst"]);

    // Checkpoint 5 needs the file again: it must not be taken as stored.
    let p5 = write(&storage, 5, ck, &[&sst]).expect("checkpoint 5 is written");
    let files = restore_files(&storage, &p5);
    assert!(
        files.contains(&("inst-000012.sst".to_string(), b"sst twelve".to_vec())),
        "{files:?}"
    );
    // And the next checkpoint reuses it from storage, still verifiable.
    let p6 = write(&storage, 6, ck, &[&sst]).unwrap();
    assert_eq!(restore_files(&storage, &p6).len(), 2);
    restore_files(&storage, &sp);
}

/// A worker stores its task's snapshot itself (checkpoints on object storage) and the
/// coordinator writes the manifest from the references: the checkpoint restores as if
/// the coordinator had written it, a savepoint from them is self-contained, and the
/// coordinator's storage handle wrote only manifests.
#[test]
fn snapshots_stored_by_workers_are_referenced_by_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let url = "memory://runtime-workers/ck";
    let coordinator = CheckpointStorage::open(url).unwrap();
    let worker = CheckpointStorage::open(url).unwrap();
    let sst = tmp.path().join("000007.sst");
    std::fs::write(&sst, b"sst seven").unwrap();
    let task = TaskKey {
        node: NodeId(0),
        subtask: SubtaskIndex(0),
    };
    let ack = |id: u64| {
        let snap = OperatorSnapshot {
            keyed: BTreeMap::from([("t".to_string(), vec![(3, vec![id as u8])])]),
            description: Some(format!("as of {id}")),
            watermark: Some(40),
            files: vec![LocalFile {
                path: sst.clone(),
                name: "inst-000007.sst".into(),
                shared: true,
            }],
            ..OperatorSnapshot::default()
        };
        let mut snaps = BTreeMap::from([("sum".to_string(), snap)]);
        store_task_snapshots(&worker, &names(), CheckpointId(id), 0, &mut snaps).unwrap();
        let stored = snaps["sum"].stored.clone().unwrap();
        assert!(snaps["sum"].keyed.is_empty() && snaps["sum"].files.is_empty());
        assert_eq!(stored.files.len(), 2);
        vec![(task, snaps)]
    };
    for (id, kind) in [
        (1, CheckpointKind::Checkpoint),
        (2, CheckpointKind::Savepoint),
    ] {
        let (path, _) = write_checkpoint(
            &coordinator,
            "job",
            &names(),
            128,
            CheckpointId(id),
            kind,
            false,
            ack(id),
            &stats(),
            &Default::default(),
        )
        .unwrap();
        let m = coordinator.load(&path).unwrap();
        let sub = &m.operators[0].subtasks[0];
        assert_eq!(sub.watermark, Some(40));
        assert_eq!(
            sub.operator_state,
            Some(serde_json::json!(format!("as of {id}")))
        );
        assert_eq!(sub.files[0].name, "op0-0.state");
        assert_eq!(
            kind.is_savepoint(),
            sub.files.iter().all(|f| f.objects.is_none())
        );
        let graph_free = restore_files(&coordinator, &path);
        assert!(
            graph_free.contains(&("inst-000007.sst".to_string(), b"sst seven".to_vec())),
            "{graph_free:?}"
        );
        let state = decode_state_file(&graph_free[0].1).unwrap();
        assert_eq!(state.keyed["t"], vec![(3, vec![id as u8])]);
    }
    // The workers' objects of the savepoint's id were removed once it was written.
    let store = weir_objstore::Store::open(url).unwrap();
    let left: Vec<String> = store
        .list("")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert!(
        !left
            .iter()
            .any(|n| n.starts_with("chk-00000000000000000002/")),
        "{left:?}"
    );
}
