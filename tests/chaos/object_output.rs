//! SIGKILL at random moments with the exactly-once output on S3 (S3Proxy, see tests/s3.rs)
//! and checkpoints in a local directory.

use crate::harness::{Rng, Scenario};
use std::path::PathBuf;
use std::time::Duration;
use weir_tests::s3;

/// Kills `file_sum --output s3://…` at 20 random moments (30–330 ms into each run), then
/// runs it to the end. The committed objects hold every running sum exactly once; no upload
/// marker is left; and the only files the server holds besides the committed objects are
/// uploads started in the instant before a kill, between the upload's start and its marker
/// (the window the module docs of the object sink name, left to a lifecycle rule): each
/// such file was written at most one second before a kill. The test has a bucket of its own,
/// so that S3Proxy's records of uploads in progress (kept at the bucket's top) are its own.
#[test]
fn sigkill_at_random_moments_with_output_on_s3() {
    let server = s3::shared();
    let bucket = weir_tests::unique("weir-chaos")
        .replace('_', "-")
        .to_ascii_lowercase();
    server.make_bucket(&bucket);
    let env = server.env();
    let mut s = Scenario::new(40_000, 40, 21);
    s.output = PathBuf::from(format!("s3://{bucket}/out"));
    let mut rng = Rng::new(0x53);
    let kills = s.kill_at_random_moments(2, 20, (30, 300), &mut rng, &env);
    assert!(kills.len() >= 16, "only {} kills landed", kills.len());
    let out = s
        .command(2, None, 100)
        .envs(env.iter().cloned())
        .output()
        .expect("run file_sum");
    assert!(
        out.status.success(),
        "file_sum failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for (k, v) in &env {
        if k == "AWS_SECRET_ACCESS_KEY" {
            assert!(
                !String::from_utf8_lossy(&out.stderr).contains(v.as_str()),
                "the secret key is in file_sum's log"
            );
        }
    }

    let store = weir_objstore::Store::open(&format!("s3://{bucket}/out")).unwrap();
    let objects = store.list("").unwrap();
    let mut parts = Vec::new();
    for o in objects
        .iter()
        .filter(|o| !o.name.starts_with(".weir-owners/"))
    {
        assert!(
            o.name.starts_with("part-"),
            "{} is left below the output prefix",
            o.name
        );
        let text = String::from_utf8(store.get(&o.name).unwrap().unwrap()).unwrap();
        parts.push((o.name.clone(), text));
    }
    s.check_parts(parts);

    let root = server.dir.join("data").join(&bucket);
    let mut leftovers = 0;
    for f in server.files(&bucket, "") {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // Committed objects, and the lease records of the runs (one owner at a time).
        if rel.starts_with("out/part-") || rel.starts_with("out/.weir-owners/") {
            continue;
        }
        let written = f.metadata().unwrap().modified().unwrap();
        assert!(
            kills.iter().any(|k| k
                .duration_since(written)
                .is_ok_and(|d| d < Duration::from_secs(1))),
            "{rel} is left on the server and was not written just before a kill"
        );
        eprintln!("left by a kill: {rel}");
        leftovers += 1;
    }
    eprintln!(
        "{} kills, {} objects, {leftovers} files of uploads started just before a kill",
        kills.len(),
        objects.len()
    );
}

/// `file_sum --output s3://…` against an endpoint nobody listens on: every attempt fails
/// with a message naming the URL and what failed, and no credentials; the job keeps
/// retrying (the server may come back), so the test stops it.
#[test]
fn an_unreachable_endpoint_is_reported_with_the_url() {
    use std::io::BufRead;
    let secret = "weir-test-secret-not-to-be-logged";
    let s = Scenario::new(100, 5, 22);
    let mut child = s
        .command(1, None, 100)
        .arg("--output")
        .arg("s3://weir-unreachable/out")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "weir")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .env("WEIR_OBJECT_STORE_RETRY_SECS", "0")
        .spawn()
        .expect("start file_sum");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let hit = line.contains("cannot list s3://weir-unreachable/out");
                seen.push(line.clone());
                if hit {
                    break Some(line);
                }
            }
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let line = found.unwrap_or_else(|| panic!("no error naming the URL:\n{}", seen.join("\n")));
    assert!(
        line.contains("127.0.0.1:9"),
        "the endpoint is not named: {line}"
    );
    assert!(
        !seen.iter().any(|l| l.contains(secret)),
        "the secret key is in the log:\n{}",
        seen.join("\n")
    );
}
