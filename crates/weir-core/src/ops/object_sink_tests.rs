use super::*;
use std::time::Duration;

type Sink = ExactlyOnceObjectSink<String>;

fn ctx(subtask: usize, parallelism: usize) -> SinkContext {
    SinkContext {
        subtask,
        parallelism,
        checkpointing: true,
        checkpoint_timing: None,
        name: "sink".into(),
        operator_id: "0-sink".into(),
    }
}

fn url(test: &str) -> String {
    format!("memory://object-sink-tests/{test}")
}

/// A sink of subtask `subtask` of `parallelism` below `url`, with parts of 4 bytes, opened
/// (after restoring `restore` when given).
fn sink(url: &str, subtask: usize, parallelism: usize, restore: Option<(u64, &[Vec<u8>])>) -> Sink {
    let mut s = Sink::new(url.to_string(), Arc::new(|s: &String| s.clone())).with_part_size(4);
    if let Some((c, states)) = restore {
        s.restore(CheckpointId(c), states, &ctx(subtask, parallelism))
            .unwrap();
    }
    s.open(&ctx(subtask, parallelism)).unwrap();
    s
}

fn write(s: &mut Sink, lines: &[&str]) {
    for l in lines {
        s.invoke(l.to_string(), 0).unwrap();
    }
}

fn snapshot(s: &mut Sink, c: u64) -> Vec<u8> {
    s.snapshot(CheckpointId(c)).unwrap().unwrap().0
}

/// The committed objects and their contents.
fn committed(url: &str) -> Vec<(String, String)> {
    let store = Store::open(url).unwrap();
    store
        .list("part-")
        .unwrap()
        .into_iter()
        .map(|o| {
            let text = String::from_utf8(store.get(&o.name).unwrap().unwrap()).unwrap();
            (o.name, text)
        })
        .collect()
}

fn markers(url: &str) -> Vec<String> {
    let store = Store::open(url).unwrap();
    store
        .list(MARKERS)
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect()
}

fn part(writer: usize, counter: u64, text: &str) -> (String, String) {
    (committed_name(writer, counter), text.to_string())
}

#[test]
fn names_round_trip() {
    assert_eq!(
        parse_marker(&marker_name(3, 17, &new_token())),
        Some((3, 17))
    );
    assert_eq!(parse_committed(&committed_name(2, 9), ""), Some((2, 9)));
    assert_eq!(parse_committed("_uploads/0-1-x", ""), None);
    assert_eq!(parse_marker("part-0-00000000000000000001"), None);
}

/// Objects appear whole, in several parts, only when their checkpoint completes; one object
/// per checkpoint with records, none for a checkpoint without.
#[test]
fn objects_appear_when_their_checkpoint_completes() {
    let url = url("commit");
    let mut s = sink(&url, 0, 1, None);
    write(&mut s, &["alpha", "b", "c"]); // "alpha\n" fills a part at once
    assert_eq!(markers(&url).len(), 1, "the upload started with its marker");
    snapshot(&mut s, 1);
    write(&mut s, &["d"]);
    snapshot(&mut s, 2);
    snapshot(&mut s, 3); // no records: no object
    assert_eq!(committed(&url), vec![]);
    s.notify_complete(CheckpointId(1)).unwrap();
    assert_eq!(committed(&url), vec![part(0, 0, "alpha\nb\nc\n")]);
    assert_eq!(
        markers(&url).len(),
        1,
        "checkpoint 2's upload is still pending"
    );
    s.notify_complete(CheckpointId(3)).unwrap();
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "alpha\nb\nc\n"), part(0, 1, "d\n")]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
    s.finish().unwrap();
}

/// A crash after the checkpoint completed but before its notification: the restore
/// completes the uploads it recorded, and doing that again (a second crash) is no error.
#[test]
fn a_restore_completes_the_uploads_its_checkpoint_recorded() {
    let url = url("restore-completes");
    let mut s = sink(&url, 0, 1, None);
    write(&mut s, &["a", "b"]);
    let state = snapshot(&mut s, 1);
    drop(s); // crash before notify_complete
    assert_eq!(committed(&url), vec![]);

    let mut s = sink(&url, 0, 1, Some((1, std::slice::from_ref(&state))));
    assert_eq!(committed(&url), vec![part(0, 0, "a\nb\n")]);
    assert_eq!(markers(&url), Vec::<String>::new());
    write(&mut s, &["c"]);
    drop(s); // crash again, before any new checkpoint

    let mut s = sink(&url, 0, 1, Some((1, &[state])));
    write(&mut s, &["c"]);
    snapshot(&mut s, 2);
    s.notify_complete(CheckpointId(2)).unwrap();
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "a\nb\n"), part(0, 1, "c\n")]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
}

/// A failed attempt leaves an upload in progress and one pre-committed for a checkpoint
/// that never completed: the restore aborts both (they cannot be completed any more) and
/// deletes their markers; the replay writes the records again, once.
#[test]
fn a_restore_aborts_what_a_failed_attempt_left() {
    let url = url("restore-aborts");
    let store = Store::open(&url).unwrap();
    let mut s = sink(&url, 0, 1, None);
    write(&mut s, &["a"]);
    let state = snapshot(&mut s, 1);
    s.notify_complete(CheckpointId(1)).unwrap();
    write(&mut s, &["b"]);
    snapshot(&mut s, 2); // pre-committed, never completed
    write(&mut s, &["lost"]); // a part uploaded, the upload in progress
    let left = [
        s.pending[0].clone(),
        s.current.as_ref().unwrap().upload.clone().unwrap(),
    ];
    drop(s);
    assert_eq!(markers(&url).len(), 2);

    let mut s = sink(&url, 0, 1, Some((1, &[state])));
    assert_eq!(markers(&url), Vec::<String>::new());
    for up in &left {
        let name = committed_name(0, up.counter);
        let e = store
            .complete_upload(&name, &up.id, up.parts.clone())
            .unwrap_err();
        assert!(e.to_string().contains(&name), "{e}");
    }
    write(&mut s, &["b", "c"]);
    snapshot(&mut s, 2);
    s.notify_complete(CheckpointId(2)).unwrap();
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "a\n"), part(0, 1, "b\nc\n")]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
}

/// Committed objects newer than the restored checkpoint would be duplicated by the replay:
/// the restore refuses, names them, and aborts nothing. A fresh start into a prefix with
/// committed output refuses too.
#[test]
fn committed_objects_newer_than_the_restored_checkpoint_are_refused() {
    let url = url("refuses-newer");
    let mut s = sink(&url, 0, 1, None);
    write(&mut s, &["a"]);
    let old = snapshot(&mut s, 1);
    s.notify_complete(CheckpointId(1)).unwrap();
    write(&mut s, &["b"]);
    snapshot(&mut s, 2);
    s.notify_complete(CheckpointId(2)).unwrap();
    write(&mut s, &["in-flight"]);
    drop(s);

    let mut again = Sink::new(url.clone(), Arc::new(|s: &String| s.clone()));
    let e = again
        .restore(CheckpointId(1), &[old], &ctx(0, 1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("newer than the checkpoint being restored (1)")
            && e.contains("part-0-00000000000000000001")
            && !e.contains("part-0-00000000000000000000"),
        "{e}"
    );
    assert_eq!(markers(&url).len(), 1, "nothing was aborted");

    let mut fresh = Sink::new(url.clone(), Arc::new(|s: &String| s.clone()));
    let e = fresh.open(&ctx(0, 1)).unwrap_err().to_string();
    assert!(
        e.contains("already holds committed output of an earlier run")
            && e.contains("part-0-00000000000000000000"),
        "{e}"
    );
    assert_eq!(committed(&url), vec![part(0, 0, "a\n"), part(0, 1, "b\n")]);
}

/// Runs of a subtask cut off from their cluster (zombies) go on while the subtask runs
/// again from the last checkpoint. The restore aborted the upload one zombie had in flight,
/// so it can never appear; another zombie, which started its upload after the restore,
/// cannot replace the object the new run committed under the same name; the new run's
/// committed output holds only its own records.
#[test]
fn a_cut_off_run_cannot_touch_the_objects_of_the_run_that_replaced_it() {
    let url = url("zombie");
    let mut old = sink(&url, 0, 1, None);
    write(&mut old, &["a"]);
    let state = snapshot(&mut old, 1);
    old.notify_complete(CheckpointId(1)).unwrap();
    write(&mut old, &["zombie"]); // a part uploaded: its upload is in flight
    let mut late = sink(&url, 0, 1, Some((1, std::slice::from_ref(&state))));
    write(&mut late, &["b"]); // buffered only: no upload yet

    let mut new = sink(&url, 0, 1, Some((1, &[state])));
    assert!(new.token != old.token && new.token != late.token);
    write(&mut new, &["b"]);
    write(&mut old, &["b"]); // buffered; its pre-commit uploads it into the aborted upload
    let e = old.snapshot(CheckpointId(2)).unwrap_err().to_string();
    assert!(e.contains("part-0-00000000000000000001"), "{e}");
    snapshot(&mut late, 2);
    write(&mut new, &["c"]);
    snapshot(&mut new, 2);
    new.notify_complete(CheckpointId(2)).unwrap();
    let e = late
        .notify_complete(CheckpointId(2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("refusing to complete") && e.contains("part-0-00000000000000000001"),
        "{e}"
    );
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "a\n"), part(0, 1, "b\nc\n")]
    );
}

/// Two writers rescaled to one and back to two: the restore completes both writers'
/// pending uploads, and the counters go on from the largest, so writer 1 of the later run
/// never reuses a name writer 1 of the first run committed.
#[test]
fn rescaling_keeps_every_name_unique() {
    let url = url("rescale");
    let mut w0 = sink(&url, 0, 2, None);
    let mut w1 = sink(&url, 1, 2, None);
    write(&mut w0, &["0a"]);
    write(&mut w1, &["1a", "1b"]);
    let s0 = snapshot(&mut w0, 1);
    write(&mut w1, &["1c"]);
    let s1 = snapshot(&mut w1, 1);
    w1.notify_complete(CheckpointId(1)).unwrap(); // w0 crashes before its notification
    drop((w0, w1));

    let mut one = sink(&url, 0, 1, Some((1, &[s0, s1])));
    write(&mut one, &["x"]);
    let s = snapshot(&mut one, 2);
    one.notify_complete(CheckpointId(2)).unwrap();
    drop(one);

    let mut w0 = sink(&url, 0, 2, Some((2, std::slice::from_ref(&s))));
    let mut w1 = sink(&url, 1, 2, Some((2, &[s])));
    write(&mut w0, &["y"]);
    write(&mut w1, &["z"]);
    snapshot(&mut w0, 3);
    snapshot(&mut w1, 3);
    w0.notify_complete(CheckpointId(3)).unwrap();
    w1.notify_complete(CheckpointId(3)).unwrap();
    assert_eq!(
        committed(&url),
        vec![
            part(0, 0, "0a\n"),
            part(0, 1, "x\n"),
            part(0, 2, "y\n"),
            part(1, 0, "1a\n1b\n1c\n"),
            part(1, 2, "z\n"),
        ]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
}

/// Without checkpoints the object is completed at end of input.
#[test]
fn without_checkpoints_the_object_is_completed_at_the_end() {
    let url = url("no-checkpoints");
    let mut s = Sink::new(url.clone(), Arc::new(|s: &String| s.clone()));
    let c = SinkContext {
        checkpointing: false,
        ..ctx(0, 1)
    };
    s.open(&c).unwrap();
    write(&mut s, &["a", "b"]);
    assert_eq!(committed(&url), vec![]);
    s.finish().unwrap();
    assert_eq!(committed(&url), vec![part(0, 0, "a\nb\n")]);
    assert_eq!(markers(&url), Vec::<String>::new());
}

/// Rolling after 2 records (parts of 4 bytes): one checkpoint covers three objects, which
/// stay invisible until it completes and then appear with consecutive counters; the next
/// checkpoint's objects go on counting.
#[test]
fn rolling_closes_several_objects_per_checkpoint() {
    let url = url("rolling");
    let mut s = sink(&url, 0, 1, None).with_rolling(Rolling::default().max_rows(2));
    write(&mut s, &["a", "bb", "ccc", "d", "e"]);
    assert_eq!(s.closed.len(), 2, "two objects closed by the limit");
    assert_eq!(
        markers(&url).len(),
        2,
        "their uploads; the open one has no part yet"
    );
    let state = snapshot(&mut s, 1);
    assert_eq!(committed(&url), vec![]);
    let st: SinkState = codec::decode(&state).unwrap();
    assert_eq!(
        st.pending.iter().map(|u| u.counter).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(st.next, 3);
    s.notify_complete(CheckpointId(1)).unwrap();
    assert_eq!(
        committed(&url),
        vec![
            part(0, 0, "a\nbb\n"),
            part(0, 1, "ccc\nd\n"),
            part(0, 2, "e\n")
        ]
    );
    write(&mut s, &["f", "g"]);
    snapshot(&mut s, 2);
    s.notify_complete(CheckpointId(2)).unwrap();
    assert_eq!(committed(&url)[3], part(0, 3, "f\ng\n"));
    assert_eq!(markers(&url), Vec::<String>::new());
}

/// Rolling by bytes and by age: the record that reaches the limit is the last of its object.
#[test]
fn rolling_by_bytes_and_by_age() {
    let url = url("rolling-bytes");
    let mut s = sink(&url, 0, 1, None).with_rolling(Rolling::default().max_bytes(5));
    write(&mut s, &["ab", "c", "defgh", "i"]);
    snapshot(&mut s, 1);
    s.notify_complete(CheckpointId(1)).unwrap();
    assert_eq!(
        committed(&url),
        vec![
            part(0, 0, "ab\nc\n"),
            part(0, 1, "defgh\n"),
            part(0, 2, "i\n")
        ]
    );

    let url2 = super::tests::url("rolling-age");
    let mut s = sink(&url2, 0, 1, None).with_rolling(Rolling::default().max_age(Duration::ZERO));
    write(&mut s, &["x", "y"]);
    snapshot(&mut s, 1);
    s.notify_complete(CheckpointId(1)).unwrap();
    assert_eq!(committed(&url2), vec![part(0, 0, "x\n"), part(0, 1, "y\n")]);
}

/// A crash after checkpoint 1 (three rolled objects, not yet completed) with more objects
/// rolled and one open: the restore completes exactly the three, aborts the rest, and the
/// replay's objects take the next names.
#[test]
fn a_restore_after_rolling_completes_the_recorded_objects_and_aborts_the_rest() {
    let url = url("rolling-restore");
    let rolling = Rolling::default().max_rows(1);
    let mut s = sink(&url, 0, 1, None).with_rolling(rolling);
    write(&mut s, &["a", "b", "c"]);
    let state = snapshot(&mut s, 1);
    write(&mut s, &["d", "e"]);
    drop(s);
    assert_eq!(committed(&url), vec![]);
    assert_eq!(markers(&url).len(), 5);

    let mut s = sink(&url, 0, 1, Some((1, &[state]))).with_rolling(rolling);
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "a\n"), part(0, 1, "b\n"), part(0, 2, "c\n")]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
    write(&mut s, &["d", "e"]);
    snapshot(&mut s, 2);
    s.notify_complete(CheckpointId(2)).unwrap();
    assert_eq!(committed(&url)[3..], [part(0, 3, "d\n"), part(0, 4, "e\n")]);
}

/// Without checkpoints, rolled objects are completed at end of input.
#[test]
fn without_checkpoints_rolled_objects_are_completed_at_the_end() {
    let url = url("rolling-no-checkpoints");
    let mut s = Sink::new(url.clone(), Arc::new(|s: &String| s.clone()))
        .with_rolling(Rolling::default().max_rows(2));
    s.open(&SinkContext {
        checkpointing: false,
        ..ctx(0, 1)
    })
    .unwrap();
    write(&mut s, &["a", "b", "c"]);
    assert_eq!(committed(&url), vec![]);
    s.finish().unwrap();
    assert_eq!(
        committed(&url),
        vec![part(0, 0, "a\nb\n"), part(0, 1, "c\n")]
    );
    assert_eq!(markers(&url), Vec::<String>::new());
}
