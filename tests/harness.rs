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
