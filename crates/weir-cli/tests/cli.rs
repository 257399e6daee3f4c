//! End-to-end tests of the `weir` binary against checkpoint directories written with
//! `weir_checkpoint`'s storage API in temporary directories.
//!
//! `weir savepoint` is tested against a simulated job: a thread that waits for the request
//! file, consumes it like the runtime does, and writes a savepoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};
use weir_checkpoint::{
    CheckpointId, CheckpointKind, CheckpointStorage, FileEntry, Manifest, ManifestStats,
    OperatorManifest, SubtaskManifest,
};

/// 2024-05-01T12:00:00.123Z
const CREATED: u64 = 1_714_564_800_123;
const REQUEST_FILE: &str = weir_runtime::SAVEPOINT_REQUEST_FILE;

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .expect("run the weir binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A manifest with a source (inline positions, no files) and a keyed sum (files).
fn manifest(id: u64, kind: CheckpointKind, sum_files: Vec<Vec<FileEntry>>) -> Manifest {
    let mut m = Manifest::new("balances", CheckpointId(id), kind, 128);
    m.created_unix_ms = CREATED + (id - 1) * 60_000;
    m.stats = ManifestStats {
        duration_ms: 1500,
        bytes: 32,
        full_bytes: 32,
        alignment_ms: 7,
        channel_state_bytes: 0,
        unaligned: false,
    };
    m.operators.push(OperatorManifest {
        uid: "src".into(),
        name: "kafka source".into(),
        parallelism: 2,
        subtasks: (0..2)
            .map(|i| SubtaskManifest {
                subtask: i,
                files: vec![],
                operator_state: Some(serde_json::json!({ format!("payments/{i}"): 40 + i })),
                // Subtask 0 had reached event time 1000; subtask 1 none yet.
                watermark: (i == 0).then_some(1_000),
            })
            .collect(),
    });
    m.operators.push(OperatorManifest {
        uid: "sum".into(),
        name: "running sum".into(),
        parallelism: sum_files.len(),
        subtasks: sum_files
            .into_iter()
            .enumerate()
            .map(|(i, files)| SubtaskManifest {
                subtask: i,
                files,
                operator_state: None,
                watermark: None,
            })
            .collect(),
    });
    m
}

/// A checkpoint directory with checkpoint 1, an incomplete checkpoint 2, savepoint 3 and the
/// final checkpoint 4.
struct Fixture {
    _tmp: tempfile::TempDir,
    storage: CheckpointStorage,
    chk1: PathBuf,
    chk1_manifest: Manifest,
    chk2: PathBuf,
    sp3: PathBuf,
    fin4: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path().join("cp")).unwrap();

    let w = storage
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let a = w.write_file("sum-0.state", b"account-1=42").unwrap();
    let b = w.write_file("sum-1.state", b"account-2=7").unwrap();
    let sst = w.write_shared("sst-000001", b"immutable").unwrap();
    let chk1_manifest = manifest(1, CheckpointKind::Checkpoint, vec![vec![a], vec![b, sst]]);
    let chk1 = w.finish(chk1_manifest.clone()).unwrap();

    let w = storage
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_file("sum-0.state", b"partial").unwrap();
    let chk2 = w.path().to_path_buf();
    drop(w);

    let w = storage
        .savepoint(CheckpointId(3), "before-upgrade")
        .unwrap();
    let a = w.write_file("sum-0.state", b"account-1=42").unwrap();
    let sst = w.write_shared("sst-000001", b"immutable").unwrap();
    let sp3 = w
        .finish(manifest(3, CheckpointKind::Savepoint, vec![vec![a, sst]]))
        .unwrap();

    let w = storage
        .begin(CheckpointId(4), CheckpointKind::Final)
        .unwrap();
    let fin4 = w
        .finish(manifest(4, CheckpointKind::Final, vec![vec![]]))
        .unwrap();

    Fixture {
        _tmp: tmp,
        storage,
        chk1,
        chk1_manifest,
        chk2,
        sp3,
        fin4,
    }
}

#[test]
fn list_shows_every_checkpoint_sorted_by_id() {
    let f = fixture();
    let out = weir(&["checkpoints", "list", s(f.storage.dir())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = [
        "ID  KIND        STATUS      SIZE  CREATED               PATH".to_string(),
        format!(
            " 1  checkpoint  complete      32  2024-05-01T12:00:00Z  {}",
            f.chk1.display()
        ),
        format!(
            " 2  checkpoint  incomplete     7  -                     {}",
            f.chk2.display()
        ),
        format!(
            " 3  savepoint   complete      21  2024-05-01T12:02:00Z  {}",
            f.sp3.display()
        ),
        format!(
            " 4  final       complete       0  2024-05-01T12:03:00Z  {}",
            f.fin4.display()
        ),
    ];
    assert_eq!(stdout(&out).lines().collect::<Vec<_>>(), expected);
    assert_eq!(stderr(&out), "");
}

#[test]
fn list_of_an_empty_directory_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = weir(&["checkpoints", "list", s(tmp.path())]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("no checkpoints in {}\n", tmp.path().display())
    );
}

#[test]
fn list_of_a_missing_directory_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = weir(&["checkpoints", "list", s(&missing)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        format!(
            "error: checkpoint directory {} does not exist\n",
            missing.display()
        )
    );
    assert!(!missing.exists(), "listing must not create the directory");
}

#[test]
fn list_flags_a_manifest_that_fails_its_own_checksum() {
    let f = fixture();
    let meta = f.fin4.join("_metadata");
    // Valid JSON still, but not what was written: the job's name changed.
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"balances\"", "\"balanced\"")).unwrap();
    let out = weir(&["checkpoints", "list", s(f.storage.dir())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let last = stdout(&out).lines().last().unwrap().to_string();
    assert!(last.starts_with(" 4  checkpoint  unreadable"), "{last}");
    assert!(
        stderr(&out).starts_with(&format!(
            "warning: checkpoint {} is corrupt: {}: the file's crc32 is",
            f.fin4.display(),
            meta.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn list_flags_an_unreadable_manifest() {
    let f = fixture();
    std::fs::write(f.fin4.join("_metadata"), b"{not json").unwrap();
    let out = weir(&["checkpoints", "list", s(f.storage.dir())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let last = stdout(&out).lines().last().unwrap().to_string();
    assert_eq!(
        last,
        format!(
            " 4  checkpoint  unreadable     9  -                     {}",
            f.fin4.display()
        )
    );
    assert!(
        stderr(&out).starts_with(&format!(
            "warning: cannot parse checkpoint manifest {}",
            f.fin4.join("_metadata").display()
        )),
        "{}",
        stderr(&out)
    );
}

fn crc(f: &Manifest, name: &str) -> String {
    let e = f.files().find(|e| e.name == name).unwrap();
    format!("{:#010x}", e.crc32)
}

#[test]
fn inspect_shows_the_verified_manifest() {
    let f = fixture();
    let m = &f.chk1_manifest;
    let expected = [
        "job:             balances".to_string(),
        "id:              1".to_string(),
        "kind:            checkpoint".to_string(),
        format!("path:            {}", f.chk1.display()),
        "created:         2024-05-01T12:00:00.123Z (unix ms 1714564800123)".to_string(),
        "format version:  2".to_string(),
        "max parallelism: 128".to_string(),
        "stats:           duration 1500 ms, 32 bytes written (32 bytes in all), max alignment 7 ms"
            .to_string(),
        "files:           3 (32 bytes, 1 in shared/), all verified".to_string(),
        "operators:       2".to_string(),
        String::new(),
        "operator src (kafka source)".to_string(),
        "  parallelism: 2".to_string(),
        "  subtask 0".to_string(),
        "    watermark: 1000".to_string(),
        "    operator state: {\"payments/0\":40}".to_string(),
        "  subtask 1".to_string(),
        "    operator state: {\"payments/1\":41}".to_string(),
        String::new(),
        "operator sum (running sum)".to_string(),
        "  parallelism: 2".to_string(),
        "  subtask 0".to_string(),
        format!(
            "    file sum-0.state  12 bytes  crc32 {}",
            crc(m, "sum-0.state")
        ),
        "  subtask 1".to_string(),
        format!(
            "    file sum-1.state  11 bytes  crc32 {}",
            crc(m, "sum-1.state")
        ),
        format!(
            "    file sst-000001    9 bytes  crc32 {}  shared",
            crc(m, "sst-000001")
        ),
    ];
    for target in [f.chk1.clone(), f.chk1.join("_metadata")] {
        let out = weir(&["checkpoints", "inspect", s(&target)]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out).lines().collect::<Vec<_>>(), expected);
    }
}

#[test]
fn inspect_pretty_prints_large_operator_state_and_empty_subtasks() {
    let f = fixture();
    let out = weir(&["checkpoints", "inspect", s(&f.fin4)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("kind:            final\n"), "{text}");
    assert!(
        text.ends_with("  subtask 0\n    no files, no operator state\n"),
        "{text}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path()).unwrap();
    let w = storage.savepoint(CheckpointId(1), "big").unwrap();
    let mut m = Manifest::new("files", CheckpointId(1), CheckpointKind::Savepoint, 8);
    let pending: Vec<String> = (0..4)
        .map(|i| format!("part-0-{i:04}.inprogress"))
        .collect();
    m.operators.push(OperatorManifest {
        uid: "sink".into(),
        name: "file sink".into(),
        parallelism: 1,
        subtasks: vec![SubtaskManifest {
            subtask: 0,
            files: vec![],
            operator_state: Some(serde_json::json!({ "pending": pending })),
            watermark: None,
        }],
    });
    let path = w.finish(m).unwrap();
    let out = weir(&["checkpoints", "inspect", s(&path)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = "operator sink (file sink)\n  parallelism: 1\n  subtask 0\n    \
                    operator state:\n      {\n        \"pending\": [\n          \
                    \"part-0-0000.inprogress\",\n          \"part-0-0001.inprogress\",\n          \
                    \"part-0-0002.inprogress\",\n          \"part-0-0003.inprogress\"\n        \
                    ]\n      }\n";
    assert!(stdout(&out).ends_with(expected), "{}", stdout(&out));
}

#[test]
fn inspect_json_round_trips_to_the_manifest() {
    let f = fixture();
    let out = weir(&["checkpoints", "inspect", "--json", s(&f.chk1)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let parsed: Manifest = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(parsed, f.chk1_manifest);
    assert_eq!(
        stdout(&out),
        serde_json::to_string_pretty(&f.chk1_manifest).unwrap() + "\n"
    );
}

#[test]
fn inspect_of_a_corrupt_checkpoint_fails_naming_the_file() {
    let f = fixture();
    let damaged = f.chk1.join("sum-1.state");
    std::fs::write(&damaged, b"account-2=8").unwrap(); // same size, other bytes
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec!["checkpoints", "inspect"];
        args.extend_from_slice(extra);
        args.push(s(&f.chk1));
        let out = weir(&args);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(stdout(&out), "", "nothing printed for a corrupt checkpoint");
        let err = stderr(&out);
        assert!(err.starts_with("error: cannot inspect "), "{err}");
        assert!(
            err.contains(&format!("{}: the file's crc32 is", damaged.display())),
            "{err}"
        );
    }

    std::fs::remove_file(f.sp3.join("sum-0.state")).unwrap();
    let out = weir(&["checkpoints", "inspect", s(&f.sp3)]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let file = f.sp3.join("sum-0.state");
    assert!(
        err.contains(&format!("{}: the file is missing", file.display())),
        "{err}"
    );
}

#[test]
fn inspect_of_a_missing_or_incomplete_checkpoint_names_it() {
    let f = fixture();
    let missing = f.storage.dir().join("chk-00000000000000000009");
    let out = weir(&["checkpoints", "inspect", s(&missing)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("cannot inspect {}", missing.display())),
        "{}",
        stderr(&out)
    );
    let out = weir(&["checkpoints", "inspect", s(&f.chk2)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "{} is not a complete checkpoint",
            f.chk2.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_with_2_and_help_describes_the_commands() {
    for args in [
        &["checkpoints"][..],
        &["checkpoints", "list"],
        &["bogus"],
        &["savepoint", "trigger", "/x", "--timeout-s", "soon"],
    ] {
        let out = weir(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let out = weir(&["savepoint", "stop", "--help"]);
    assert!(out.status.success());
    let help = stdout(&out);
    for needle in [
        "--timeout-s <SECONDS>",
        "[default: 60]",
        "_savepoint_request",
    ] {
        assert!(help.contains(needle), "{needle} in {help}");
    }
}

/// Simulates a running job: waits for the request file, consumes it like the runtime, writes
/// a savepoint and returns its path and the request's content.
fn fake_job(dir: PathBuf) -> thread::JoinHandle<(String, PathBuf)> {
    thread::spawn(move || {
        let request = dir.join(REQUEST_FILE);
        let deadline = Instant::now() + Duration::from_secs(30);
        let content = loop {
            if let Ok(c) = std::fs::read_to_string(&request) {
                break c;
            }
            assert!(Instant::now() < deadline, "no request file appeared");
            thread::sleep(Duration::from_millis(10));
        };
        std::fs::remove_file(&request).unwrap();
        let storage = CheckpointStorage::open(&dir).unwrap();
        let id = storage.next_id().unwrap();
        let w = storage.savepoint(id, "1714564800123").unwrap();
        let file = w.write_file("sum-0.state", b"account-1=43").unwrap();
        let path = w
            .finish(manifest(id.0, CheckpointKind::Savepoint, vec![vec![file]]))
            .unwrap();
        (content, path)
    })
}

#[test]
fn savepoint_trigger_and_stop_print_the_new_savepoint() {
    let f = fixture();
    let dir = f.storage.dir().to_path_buf();
    for (command, request) in [("trigger", "savepoint"), ("stop", "stop")] {
        let job = fake_job(dir.clone());
        let out = weir(&["savepoint", command, s(&dir), "--timeout-s", "30"]);
        let (content, path) = job.join().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(content.trim(), request);
        assert_ne!(path, f.sp3, "an older savepoint does not count");
        assert_eq!(stdout(&out), format!("{}\n", path.display()));
        assert!(!dir.join(REQUEST_FILE).exists());
    }
}

#[test]
fn savepoint_without_a_job_times_out_and_withdraws_the_request() {
    let f = fixture();
    let dir = f.storage.dir();
    let before: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let out = weir(&["savepoint", "trigger", s(dir), "--timeout-s", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    let err = stderr(&out);
    assert!(
        err.contains("the job may not be running, or checkpointing is not configured"),
        "{err}"
    );
    assert!(err.contains("the request was withdrawn"), "{err}");
    assert!(!dir.join(REQUEST_FILE).exists());
    let after: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        after.len(),
        before.len(),
        "no temporary file left: {after:?}"
    );
}

#[test]
fn savepoint_of_a_missing_directory_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = weir(&["savepoint", "stop", s(&missing)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!(
            "error: checkpoint directory {} does not exist\n",
            missing.display()
        )
    );
    assert!(!missing.exists());
}
