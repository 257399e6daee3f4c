//! A real broker for the Kafka tests, and independent clients to feed and check it.
//!
//! The input is produced and the output read with plain rdkafka clients, not with weir's
//! source or sink, so the check does not share code with what it checks.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The broker's transaction.max.timeout.ms when the tests start their own broker.
pub const TXN_MAX_TIMEOUT_MS: u64 = 300_000;

/// The bootstrap address of the test broker: `WEIR_KAFKA_BROKERS` if set, otherwise a
/// broker started once with `scripts/kafka.sh start` (state under the target directory;
/// `scripts/kafka.sh start` is idempotent, so later test runs reuse it).
pub fn broker() -> &'static str {
    static B: OnceLock<String> = OnceLock::new();
    B.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kafka");
        weir_tests::service_address(
            "WEIR_KAFKA_BROKERS",
            "kafka.sh",
            &[
                ("WEIR_KAFKA_DIR", dir.into()),
                (
                    "WEIR_KAFKA_TXN_MAX_TIMEOUT_MS",
                    TXN_MAX_TIMEOUT_MS.to_string().into(),
                ),
            ],
        )
    })
}

/// A topic name no other test uses.
pub use weir_tests::unique;

/// Creates a topic with `partitions` partitions.
pub fn create_topic(name: &str, partitions: i32) {
    weir_kafka::admin::ensure_topic(broker(), name, partitions, &[]).expect("create topic");
}

/// Produces `records` (key, value as decimal text) with a plain idempotent producer, in
/// order, partitioned by key as the Java client would, and waits for every acknowledgement.
pub fn produce(topic: &str, records: &[(String, i64)]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    send_all(&p, topic, records);
}

/// A record's optional key and optional value, as raw bytes.
pub type RawRecord<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Produces raw key/value bytes (for malformed input).
pub fn produce_raw(topic: &str, records: &[RawRecord<'_>]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    for (k, v) in records {
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(k) = k {
            r = r.key(*k);
        }
        if let Some(v) = v {
            r = r.payload(*v);
        }
        p.send(r).map_err(|(e, _)| e).expect("send");
    }
    p.flush(Duration::from_secs(60)).expect("flush input");
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Read {
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }
}

/// Everything in `topic` visible to a reader with `isolation` (`read_committed` or
/// `read_uncommitted`), partition by partition in offset order, read up to the end offsets
/// at the time of the call. Waits (up to a minute) while an open transaction holds the
/// last stable offset back.
pub fn read_all(topic: &str, isolation: &str) -> Vec<Read> {
    read_up_to(topic, isolation, false)
}

/// What a `read_committed` reader sees now: every partition read up to its last stable
/// offset, without waiting for open transactions.
#[allow(dead_code)]
pub fn read_committed_now(topic: &str) -> Vec<Read> {
    read_up_to(topic, "read_committed", true)
}

fn read_up_to(topic: &str, isolation: &str, stable: bool) -> Vec<Read> {
    use rdkafka::message::Headers;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("group.id", unique("checker"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    let parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        // The end of the log, not the last stable offset (which a read_committed client
        // would be told): a reader must wait for open transactions, not stop before them —
        // unless it asked for what is committed now (`stable`).
        let (_, high) = if stable {
            weir_kafka::admin::stable_watermarks(broker(), topic, *p)
        } else {
            weir_kafka::admin::watermarks(broker(), topic, *p)
        }
        .expect("watermarks");
        if high > 0 {
            ends.insert(*p, high);
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .expect("tpl");
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return out;
    }
    c.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic} ({isolation}) did not reach the end offsets {ends:?}"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Read {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                });
                if ends
                    .get(&m.partition())
                    .is_some_and(|e| m.offset() + 1 >= *e)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(RdError::PartitionEOF(p))) => {
                let pos = c.position().expect("position");
                if let Some(e) = pos.find_partition(topic, p)
                    && let Offset::Offset(o) = e.offset()
                    && ends.get(&p).is_some_and(|end| o >= *end)
                {
                    ends.remove(&p);
                }
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    out
}

/// The output of a running-sum job as committed: per key, the sums in log order.
pub fn committed_sums(topic: &str) -> BTreeMap<String, Vec<i64>> {
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in read_all(topic, "read_committed") {
        let v: i64 = r
            .value_str()
            .parse()
            .unwrap_or_else(|e| panic!("output value {:?} is not an i64: {e}", r.value_str()));
        by_key.entry(r.key_str()).or_default().push(v);
    }
    by_key
}

/// Per key, the prefix sums of its values in input order.
pub fn prefix_sums(input: &[(String, i64)]) -> BTreeMap<String, Vec<i64>> {
    let mut sums: BTreeMap<String, i64> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, v) in input {
        let s = sums.entry(k.clone()).or_default();
        *s += v;
        out.entry(k.clone()).or_default().push(*s);
    }
    out
}

/// Asserts that every key's committed sums are exactly its prefix sums, naming the first
/// lost or duplicated value when not.
pub fn assert_exactly_once(
    expected: &BTreeMap<String, Vec<i64>>,
    got: &BTreeMap<String, Vec<i64>>,
) {
    let total_expected: usize = expected.values().map(Vec::len).sum();
    let total_got: usize = got.values().map(Vec::len).sum();
    for (k, want) in expected {
        let have = got.get(k).cloned().unwrap_or_default();
        if &have != want {
            let at = want
                .iter()
                .zip(&have)
                .position(|(a, b)| a != b)
                .unwrap_or(want.len().min(have.len()));
            panic!(
                "key {k}: {} sums expected, {} committed; first difference at #{at}: expected \
                 {:?}, committed {:?} (total expected {total_expected}, committed {total_got})",
                want.len(),
                have.len(),
                want.get(at),
                have.get(at)
            );
        }
    }
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "keys never in the input were committed: {extra:?}"
    );
    assert_eq!(total_got, total_expected);
}

/// Random `key-N` records with values 1..=1000 (so every key's prefix sums are strictly
/// increasing: a duplicate shows as a repeated sum, a loss as a missing one).
pub fn random_input(n: usize, keys: u64, seed: u64) -> Vec<(String, i64)> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..n)
        .map(|_| {
            let k = format!("key-{}", next() % keys);
            let v = 1 + (next() % 1000) as i64;
            (k, v)
        })
        .collect()
}

/// The `kafka_sum` command, reading `input` and writing `output`.
pub fn kafka_sum(input: &str, output: &str, checkpoints: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kafka_sum"));
    c.arg("--brokers")
        .arg(broker())
        .arg("--input-topic")
        .arg(input)
        .arg("--output-topic")
        .arg(output)
        .arg("--checkpoint-dir")
        .arg(checkpoints)
        .arg("--transactional-id-prefix")
        .arg(format!("{output}-sum"));
    c
}

/// The ids of the complete checkpoints (`chk-…` directories with a `_metadata`) in `dir`,
/// oldest first.
#[allow(dead_code)]
pub fn complete_checkpoints(dir: &std::path::Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("_metadata").exists())
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("chk-")
                        .and_then(|n| n.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    ids
}

/// The directory of checkpoint `id` in `dir` (`chk-<id as 20 digits>`).
#[allow(dead_code)]
pub fn checkpoint_path(dir: &std::path::Path, id: u64) -> PathBuf {
    dir.join(format!("chk-{id:020}"))
}

pub use weir_tests::wait_for;

/// A started child process whose standard error is collected line by line on a thread (so
/// a chatty child never blocks on a full pipe, and the test can watch it while it runs).
#[allow(dead_code)]
pub struct Running {
    pub child: std::process::Child,
    started: Instant,
    lines: std::sync::Arc<std::sync::Mutex<Vec<(Duration, String)>>>,
    stderr: Option<std::thread::JoinHandle<()>>,
}

#[allow(dead_code)]
impl Running {
    /// Starts `cmd` with standard error captured.
    pub fn start(cmd: &mut Command) -> Running {
        let started = Instant::now();
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the child process");
        let err = child.stderr.take().expect("piped stderr");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push((started.elapsed(), line));
            }
        });
        Running {
            child,
            started,
            lines,
            stderr: Some(stderr),
        }
    }

    /// When (since the start) the first stderr line containing `text` arrived, if it has.
    pub fn seen(&self, text: &str) -> Option<Duration> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains(text))
            .map(|(t, _)| *t)
    }

    /// Time since the process was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("poll the child").is_none()
    }

    fn stderr(&mut self) -> String {
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let lines = self.lines.lock().unwrap();
        let mut s = String::new();
        for (_, l) in lines.iter() {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// Sends SIGKILL; fails the test if the process had already exited (the kill must land
    /// while it runs). Returns its standard error.
    pub fn kill(mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        if let Some(status) = self.child.try_wait().expect("poll the child") {
            let err = self.stderr();
            panic!("the process ended ({status}) before it could be killed:\n{err}");
        }
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("reap the child");
        assert_eq!(status.signal(), Some(9), "not ended by SIGKILL: {status}");
        self.stderr()
    }

    /// Waits for the process to exit, killing it and failing the test after `limit`.
    /// Returns its exit status and standard error.
    pub fn wait_within(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the child") {
                return (status, self.stderr());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = self.stderr();
                panic!("the process did not exit within {limit:?}; its stderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A transactional producer (plain rdkafka) with `transactional.id` `id`, initialised.
#[allow(dead_code)]
pub fn txn_producer(id: &str) -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("transactional.id", id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .create()
        .expect("transactional producer");
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    p
}

/// Sends `records` (key, value as decimal text) with `p` (inside its open transaction, if
/// any) and flushes.
pub fn send_all(p: &BaseProducer, topic: &str, records: &[(String, i64)]) {
    for (k, v) in records {
        let value = v.to_string();
        let mut r = BaseRecord::to(topic)
            .key(k.as_bytes())
            .payload(value.as_bytes());
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    r = back;
                    p.poll(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// The high watermark (end offset) of every partition of `topic`.
#[allow(dead_code)]
pub fn end_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let parts = weir_kafka::admin::partitions(broker(), topic).expect("partitions");
    parts
        .into_iter()
        .map(|p| {
            let (_, high) = weir_kafka::admin::watermarks(broker(), topic, p).expect("watermarks");
            (p, high)
        })
        .collect()
}

/// Partitions of `topic` with a transaction open: `(partition, last stable offset, high
/// watermark)` for each whose last stable offset (what a `read_committed` reader can reach)
/// is behind its high watermark.
#[allow(dead_code)]
pub fn open_transactions(topic: &str) -> Vec<(i32, i64, i64)> {
    let client = |isolation: &str| -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", broker())
            .set("group.id", unique("lso-checker"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()
            .expect("consumer")
    };
    // librdkafka's watermark query uses the consumer's isolation level: a read_committed
    // consumer gets the last stable offset as its "high" watermark.
    let committed = client("read_committed");
    let uncommitted = client("read_uncommitted");
    let md = uncommitted
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    let mut open = Vec::new();
    for p in md.topics()[0].partitions().iter().map(|p| p.id()) {
        let (_, high) = uncommitted
            .fetch_watermarks(topic, p, Duration::from_secs(30))
            .expect("high watermark");
        let (_, stable) = committed
            .fetch_watermarks(topic, p, Duration::from_secs(30))
            .expect("last stable offset");
        if stable < high {
            open.push((p, stable, high));
        }
    }
    open
}

fn admin() -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", broker())
        .create()
        .expect("admin client")
}

/// Deletes `topic` and waits (with a deadline) until the broker no longer lists it.
#[allow(dead_code)]
pub fn delete_topic(topic: &str) {
    let opts = rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let res = futures_executor::block_on(admin().delete_topics(&[topic], &opts)).expect("delete");
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("deleting topic {t}: {e}"));
    }
    wait_for(
        &format!("topic {topic} to be deleted"),
        Duration::from_secs(30),
        || !weir_kafka::admin::topic_exists(broker(), topic).expect("metadata"),
    );
}

/// Deletes every record of `topic`/`partition` (what retention does, deterministically):
/// the partition then starts at its end offset. Returns that offset.
#[allow(dead_code)]
pub fn delete_all_records(topic: &str, partition: i32) -> i64 {
    let (_, high) = weir_kafka::admin::watermarks(broker(), topic, partition).expect("watermarks");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(high))
        .expect("tpl");
    let opts = rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let res =
        futures_executor::block_on(admin().delete_records(&tpl, &opts)).expect("delete records");
    for e in res.elements() {
        if let Err(err) = e.error() {
            panic!("deleting records of {topic}/{partition}: {err}");
        }
    }
    wait_for(
        &format!("{topic}/{partition} to start at {high}"),
        Duration::from_secs(30),
        || {
            weir_kafka::admin::watermarks(broker(), topic, partition)
                .expect("watermarks")
                .0
                >= high
        },
    );
    high
}

/// The newest complete savepoint (`sp-…` directory with a `_metadata`) in `dir`.
#[allow(dead_code)]
pub fn newest_savepoint(dir: &std::path::Path) -> Option<PathBuf> {
    let mut sps: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sp-"))
                && p.join("_metadata").exists()
        })
        .collect();
    sps.sort();
    sps.pop()
}

/// Copies a directory tree (a savepoint moved elsewhere).
#[allow(unused_imports)]
pub use weir_tests::operator::copy_dir;

/// Asks the job running on checkpoint directory `dir` to stop with a savepoint (what
/// `weir savepoint stop DIR` does).
#[allow(dead_code)]
pub fn request_stop(dir: &std::path::Path) {
    weir_tests::operator::request_savepoint(dir, "stop");
}
