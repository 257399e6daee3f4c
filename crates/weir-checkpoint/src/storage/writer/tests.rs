use super::super::tests::{manifest, storage};
use super::*;
use crate::FileProblem;
use std::fs;

fn assert_send_sync<T: Send + Sync + Clone>() {}

#[test]
fn writer_is_shareable() {
    assert_send_sync::<CheckpointWriter>();
}

#[test]
fn concurrent_writes_from_several_threads() {
    let (_tmp, s) = storage();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                let mut files = Vec::new();
                for i in 0..10 {
                    let body = vec![t as u8; 1000 + i];
                    files.push(w.write_file(&format!("t{t}-{i}"), &body).unwrap());
                    // every thread also "reuses" the same shared files
                    files.push(
                        w.write_shared(&format!("sst-{i}"), format!("sst {i}").as_bytes())
                            .unwrap(),
                    );
                }
                files
            })
        })
        .collect();
    let files: Vec<FileEntry> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let path = w
        .finish(manifest(1, CheckpointKind::Checkpoint, files))
        .unwrap();
    let m = s.load(&path).unwrap();
    assert_eq!(m.files().count(), 160);
    for f in m.files() {
        let bytes = s.read_file(&path, f).unwrap();
        assert_eq!(bytes.len() as u64, f.size);
    }
    let leftovers: Vec<_> = fs::read_dir(s.dir().join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        10,
        "no temporary files left: {leftovers:?}"
    );
}

#[test]
fn duplicate_names_are_rejected() {
    let (_tmp, s) = storage();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_file("a", b"1").unwrap();
    let e = w.write_file("a", b"2").unwrap_err();
    assert!(matches!(e, Error::DuplicateFile { .. }), "{e}");
    assert!(
        e.to_string().contains("prefix them with the operator uid"),
        "{e}"
    );
    assert!(matches!(
        w.write_shared("a", b"1"),
        Err(Error::DuplicateFile { .. })
    ));
    w.write_shared("s", b"1").unwrap();
    assert!(matches!(
        w.write_file("s", b"1"),
        Err(Error::DuplicateFile { .. })
    ));
    assert!(matches!(
        w.write_file("_metadata", b"{}"),
        Err(Error::InvalidName { .. })
    ));
}

#[test]
fn existing_shared_file_is_not_rewritten() {
    let (_tmp, s) = storage();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let first = w.write_shared("sst-1", b"immutable").unwrap();
    assert_eq!(
        first,
        FileEntry {
            name: "sst-1".into(),
            size: 9,
            crc32: crc32fast::hash(b"immutable"),
            shared: true,
            objects: None,
        }
    );
    let path = s.dir().join("shared/sst-1");
    let before = fs::metadata(&path).unwrap().modified().unwrap();
    let w2 = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    // make a rewrite detectable: set the file read-only
    let mut perms = fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    fs::set_permissions(&path, perms).unwrap();
    assert_eq!(w2.write_shared("sst-1", b"immutable").unwrap(), first);
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);
    let e = w2.write_shared("sst-1", b"different").unwrap_err();
    assert!(
        matches!(
            e,
            Error::SharedConflict {
                existing_size: 9,
                new_size: 9,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("shared/sst-1"), "{e}");
}

#[test]
fn linked_shared_files_match_what_writing_them_would_record() {
    let (tmp, s) = storage();
    let source = tmp.path().join("000042.sst");
    fs::write(&source, b"immutable sst").unwrap();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let e = w.link_shared("op1-0-000042.sst", &source).unwrap();
    assert_eq!(
        e,
        FileEntry {
            name: "op1-0-000042.sst".into(),
            size: 13,
            crc32: crc32fast::hash(b"immutable sst"),
            shared: true,
            objects: None,
        }
    );
    let stored = s.dir().join("shared/op1-0-000042.sst");
    assert_eq!(fs::read(&stored).unwrap(), b"immutable sst");
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            fs::metadata(&stored).unwrap().ino(),
            fs::metadata(&source).unwrap().ino(),
            "on one file system the file is linked, not copied"
        );
    }
    // The source going away (RocksDB deleting a compacted file) keeps the stored one.
    fs::remove_file(&source).unwrap();
    assert_eq!(fs::read(&stored).unwrap(), b"immutable sst");
    // Another file under the same name is a conflict, as for write_shared.
    let other = tmp.path().join("other.sst");
    fs::write(&other, b"different sst").unwrap();
    let w2 = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    let e = w2.link_shared("op1-0-000042.sst", &other).unwrap_err();
    assert!(matches!(e, Error::SharedConflict { .. }), "{e}");
    // A missing source is an error naming it.
    let e = w2
        .link_shared("gone.sst", &tmp.path().join("gone.sst"))
        .unwrap_err();
    assert!(e.to_string().contains("gone.sst"), "{e}");
}

#[test]
fn savepoints_copy_shared_files_into_themselves() {
    let (_tmp, s) = storage();
    let w = s.savepoint(CheckpointId(5), "copy").unwrap();
    let e = w.write_shared("sst-1", b"data").unwrap();
    assert!(!e.shared);
    assert_eq!(
        w.write_shared("sst-1", b"data").unwrap(),
        e,
        "repeat is deduplicated"
    );
    assert!(w.path().join("sst-1").is_file());
    assert!(!s.dir().join("shared/sst-1").exists());
    let path = w
        .finish(manifest(5, CheckpointKind::Savepoint, vec![e]))
        .unwrap();
    assert_eq!(s.load(&path).unwrap().kind, CheckpointKind::Savepoint);
}

#[test]
fn finish_checks_the_manifest() {
    let (_tmp, s) = storage();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let f = w.write_file("a", b"abc").unwrap();
    let wrong_id = w
        .clone()
        .finish(manifest(2, CheckpointKind::Checkpoint, vec![f.clone()]));
    assert!(
        wrong_id
            .unwrap_err()
            .to_string()
            .contains("manifest is for checkpoint 2")
    );
    let wrong_kind = w
        .clone()
        .finish(manifest(1, CheckpointKind::Savepoint, vec![f.clone()]));
    assert!(
        wrong_kind
            .unwrap_err()
            .to_string()
            .contains("says savepoint")
    );
    let ghost = FileEntry {
        name: "never-written".into(),
        ..f.clone()
    };
    let e = w
        .clone()
        .finish(manifest(1, CheckpointKind::Checkpoint, vec![ghost]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Corrupt {
                problem: FileProblem::Missing,
                ..
            }
        ),
        "{e}"
    );
    let wrong_size = FileEntry {
        size: 4,
        ..f.clone()
    };
    assert!(
        w.clone()
            .finish(manifest(1, CheckpointKind::Checkpoint, vec![wrong_size]))
            .is_err()
    );
    assert!(
        !w.path().join("_metadata").exists(),
        "nothing was published"
    );
    // final checkpoints go through a checkpoint writer
    w.clone()
        .finish(manifest(1, CheckpointKind::Final, vec![f]))
        .unwrap();
    assert!(matches!(
        w.write_file("late", b"x"),
        Err(Error::WriterFinished { .. })
    ));
    let again = w.finish(manifest(1, CheckpointKind::Final, vec![]));
    assert!(matches!(again, Err(Error::WriterFinished { .. })));
}

#[test]
fn registry_tracks_live_writers() {
    let (_tmp, s) = storage();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_shared("x", b"x").unwrap();
    let clone = w.clone();
    drop(w);
    assert_eq!(
        s.registry.lock().writers.len(),
        1,
        "a clone keeps the writer alive"
    );
    assert!(
        s.registry
            .lock()
            .writers
            .values()
            .all(|f| f.shared.contains("x"))
    );
    drop(clone);
    assert!(s.registry.lock().writers.is_empty());
}
