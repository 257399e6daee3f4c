//! Killing a real job process again and again, and watching what its checkpoints say,
//! shared by the chaos tests of every example (`tests/chaos`, `tests/kafka`).

use crate::Rng;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Starts a job again and again on its checkpoints (`start(i)` gives run i's command,
/// spawned with piped stderr or with its output going to a file) and kills each run with
/// SIGKILL after a random 50 to 50 + `spread_ms` ms, until a run ends by itself (it read all
/// of its input and committed it) or `rounds` runs are over. A run that ended by itself must
/// have succeeded. Returns how many kills landed while the job was running.
pub fn kill_at_random(
    name: &str,
    rounds: usize,
    seed: u64,
    spread_ms: u64,
    mut start: impl FnMut(usize) -> Command,
) -> usize {
    use std::os::unix::process::ExitStatusExt;
    let mut rng = Rng::new(seed);
    let mut landed = 0;
    for i in 0..rounds {
        let mut child = start(i)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        std::thread::sleep(std::time::Duration::from_millis(50 + rng.below(spread_ms)));
        if child.try_wait().expect("poll the job").is_none() {
            child.kill().expect("SIGKILL the job");
        }
        let status = child.wait().expect("reap the job");
        if status.signal() == Some(9) {
            landed += 1;
            continue;
        }
        let err = crate::stderr_of(&mut child);
        assert!(status.success(), "{name} failed: {status}\n{err}");
        break;
    }
    landed
}

/// The statistics of every complete checkpoint a job wrote, as its checkpoint directory
/// showed them while the job ran: [`Checkpoints::record`] reads the manifests there now (a
/// job keeps only its newest few, so call it before every restart and at the end).
#[derive(Default)]
pub struct Checkpoints {
    /// The `stats` of each checkpoint's manifest (`_metadata`), by checkpoint id.
    pub stats: BTreeMap<u64, serde_json::Value>,
}

impl Checkpoints {
    /// Reads the manifest of every complete checkpoint in `dir` not seen before.
    pub fn record(&mut self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("chk-")
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if self.stats.contains_key(&id) {
                continue;
            }
            // A manifest being replaced or removed by the job is read at the next call.
            let Ok(bytes) = std::fs::read(entry.path().join("_metadata")) else {
                continue;
            };
            let Ok(manifest) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                continue;
            };
            self.stats.insert(id, manifest["stats"].clone());
        }
    }

    /// The newest checkpoint recorded.
    pub fn newest(&self) -> Option<u64> {
        self.stats.keys().next_back().copied()
    }

    /// Asserts what the checkpoints of runs under backpressure (`--sink-rate` well below
    /// the source's pace) in checkpoint mode `mode` must show: that checkpoints completed
    /// while the channels were full, each with its duration and size; in mode `aligned`,
    /// that none was taken unaligned or stored in-flight records.
    pub fn assert_taken_under_backpressure(&self, mode: &str) {
        assert!(
            !self.stats.is_empty(),
            "no checkpoint completed under backpressure in mode {mode}"
        );
        for (id, stats) in &self.stats {
            assert!(
                stats["duration_ms"].is_u64() && stats["bytes"].is_u64(),
                "checkpoint {id} (mode {mode}) has no duration or size in its manifest: {stats}"
            );
            let unaligned = stats["unaligned"].as_bool().unwrap_or(false);
            let channel = stats["channel_state_bytes"].as_u64().unwrap_or(0);
            if mode == "aligned" {
                assert!(
                    !unaligned && channel == 0,
                    "aligned checkpoint {id} was taken unaligned or stored channel state: {stats}"
                );
            }
        }
    }

    /// Asserts that checkpoints taken in mode `unaligned` under backpressure were taken
    /// unaligned and that at least one stored in-flight records (channel state).
    pub fn assert_stored_channel_state(&self, mode: &str) {
        if mode == "unaligned" {
            let with_channel_state = self
                .stats
                .values()
                .filter(|s| s["channel_state_bytes"].as_u64().unwrap_or(0) > 0)
                .count();
            assert!(
                with_channel_state > 0,
                "none of {} unaligned checkpoints under backpressure stored in-flight records: {:?}",
                self.stats.len(),
                self.stats
            );
            assert!(
                self.stats
                    .values()
                    .any(|s| s["unaligned"].as_bool() == Some(true)),
                "no checkpoint was taken unaligned: {:?}",
                self.stats
            );
        }
    }
}

/// A schedule of SIGKILLs that waits for checkpoints taken under backpressure: see
/// [`KillPlan::after_channel_state`].
pub struct KillPlan<'a> {
    /// The job, for messages.
    pub name: &'a str,
    /// At most this many runs are killed.
    pub rounds: usize,
    /// The seed of the random kill moments.
    pub seed: u64,
    /// A run is killed a random 0..`spread_ms` ms after its first checkpoint holding
    /// in-flight records.
    pub spread_ms: u64,
    /// How long a run may take to show that checkpoint.
    pub limit: std::time::Duration,
}

impl KillPlan<'_> {
    /// Starts a job again and again on its checkpoint directory `dir` (`start(i)` gives run
    /// i's command) and kills run i with SIGKILL once it has completed a checkpoint that
    /// stored in-flight records (`channel_state_bytes` > 0 in its manifest), a random
    /// moment (0..`spread_ms` ms) later. So every killed run leaves a recent checkpoint taken
    /// under backpressure and the next run restores from held channel state, however long
    /// the job's start-up (a Kafka consumer's, a cluster's) takes. A run that shows no such
    /// checkpoint within `limit` fails the test; a run that ends by itself must have
    /// succeeded and ends the kills. Every manifest seen goes into `seen`. Returns how many
    /// kills landed while the job ran.
    pub fn after_channel_state(
        &self,
        dir: &Path,
        seen: &mut Checkpoints,
        mut start: impl FnMut(usize) -> Command,
    ) -> usize {
        let KillPlan {
            name,
            rounds,
            seed,
            spread_ms,
            limit,
        } = *self;
        use std::os::unix::process::ExitStatusExt;
        use std::time::{Duration, Instant};
        let mut rng = Rng::new(seed);
        let mut landed = 0;
        for i in 0..rounds {
            seen.record(dir);
            let before = seen.with_channel_state();
            let mut child = start(i)
                .spawn()
                .unwrap_or_else(|e| panic!("start {name}: {e}"));
            let deadline = Instant::now() + limit;
            let mut kill_at = None;
            let status = loop {
                if let Some(status) = child.try_wait().expect("poll the job") {
                    break status;
                }
                seen.record(dir);
                let now = Instant::now();
                match kill_at {
                    None if seen.with_channel_state().len() > before.len() => {
                        kill_at = Some(now + Duration::from_millis(rng.below(spread_ms.max(1))));
                    }
                    Some(t) if now >= t => {
                        child.kill().expect("SIGKILL the job");
                        break child.wait().expect("reap the job");
                    }
                    None if now > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!(
                            "run {i} of {name} completed no checkpoint holding in-flight records \
                             within {limit:?}; checkpoints seen: {:?}",
                            seen.stats
                        );
                    }
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            seen.record(dir);
            if status.signal() == Some(9) {
                landed += 1;
                continue;
            }
            let err = crate::stderr_of(&mut child);
            assert!(status.success(), "{name} failed: {status}\n{err}");
            break;
        }
        landed
    }
}

impl Checkpoints {
    /// The checkpoints recorded that stored in-flight records, oldest first.
    pub fn with_channel_state(&self) -> Vec<u64> {
        self.stats
            .iter()
            .filter(|(_, s)| s["channel_state_bytes"].as_u64().unwrap_or(0) > 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The in-flight bytes checkpoint `id` stored (0 if it stored none), failing the test
    /// if its manifest was never seen.
    pub fn channel_state_bytes(&self, id: u64) -> u64 {
        let stats = self
            .stats
            .get(&id)
            .unwrap_or_else(|| panic!("checkpoint {id} was never seen: {:?}", self.stats));
        stats["channel_state_bytes"].as_u64().unwrap_or(0)
    }
}

/// The checkpoint a run's log (weir's `resuming from checkpoint N (PATH)` line) says it
/// resumed from.
pub fn resumed_from(log: &str) -> Option<u64> {
    let at = log.find("resuming from checkpoint ")? + "resuming from checkpoint ".len();
    log[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// What a task logs when it replays the in-flight records of the unaligned checkpoint it
/// restored, before any new input.
pub const REPLAYED: &str = "replayed the in-flight records of the restored unaligned checkpoint";
