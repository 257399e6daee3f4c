//! The RocksDB memory budget, seen from outside: a job whose state is more than ten times
//! its budget runs to the end in its own process, and that process's peak resident memory
//! (`VmHWM` in `/proc/PID/status`) stays within the budget plus weir's documented fixed
//! overhead (docs/checkpoints.md, "Sizing memory"): keyed state, and windows whose panes
//! and timers are in RocksDB.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Memory a weir process takes besides the RocksDB budget: code, threads, channels,
/// allocator slack (docs/checkpoints.md, "Sizing memory"). Measured: about 61 MiB peak in
/// all at a 16 MiB budget in a debug build (45 MiB over it: 29 MiB of this binary's code
/// pages, 14 MiB of heap before any state, the rest allocator slack); the margin is for a
/// loaded machine.
const FIXED_OVERHEAD_KIB: u64 = 64 << 10;

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn command(dir: &std::path::Path, keys: u64, value_bytes: usize, budget_mib: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memory_budget"));
    c.args(["--keys", &keys.to_string()])
        .args(["--value-bytes", &value_bytes.to_string()])
        .args(["--budget-mib", &budget_mib.to_string()])
        .arg("--checkpoint-dir")
        .arg(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `job` of the memory_budget binary (`keyed` or `windows`) with `keys` keys of
/// `value_bytes` at a 16 MiB budget; checks that it verified all `expected` of `what`
/// (keys or windows), that its state was at least ten times the budget and that its peak
/// RSS stayed within the budget plus the fixed overhead.
#[cfg(target_os = "linux")]
fn runs_within_the_budget(job: &str, keys: u64, value_bytes: usize, what: &str, expected: u64) {
    let budget_mib = 16u64;
    let logical = expected * (value_bytes as u64 + 8);
    assert!(
        logical >= 10 * (budget_mib << 20),
        "the state must be >= 10x the budget"
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut child = command(tmp.path(), keys, value_bytes, budget_mib)
        .args(["--job", job])
        .spawn()
        .expect("start memory_budget");
    let pid = child.id();
    // Sample the peak while the process runs (VmHWM only grows), until it exits.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut sampled = 0;
    let status = loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            sampled = sampled.max(kib);
        }
        if let Some(status) = child.try_wait().expect("poll memory_budget") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "memory_budget did not finish in 15 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "memory_budget failed: {status}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        lines[0],
        format!("verified {expected} of {expected} {what}")
    );
    assert_eq!(lines[1], format!("logical state {logical} bytes"));
    let checkpoints: u64 = lines[2]
        .strip_prefix("checkpoints ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(checkpoints >= 1, "{out}");
    let peak: u64 = lines[3]
        .strip_prefix("peak RSS ")
        .and_then(|s| s.strip_suffix(" KiB"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(sampled > 0, "no VmHWM read from /proc/{pid}/status");
    // The process read its own peak just before it ended; sampling saw its last moments too.
    let peak = peak.max(sampled);
    let limit = (budget_mib << 10) + FIXED_OVERHEAD_KIB;
    assert!(
        peak <= limit,
        "{job}: peak RSS {peak} KiB exceeds the budget of {budget_mib} MiB plus {FIXED_OVERHEAD_KIB} KiB"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_job_with_state_ten_times_its_memory_budget_stays_within_it() {
    runs_within_the_budget("keyed", 42_000, 4000, "keys", 42_000);
}

/// Windows in RocksDB: 21,000 keys with two open windows each, every window's accumulator
/// 4,000 bytes, all open until the input ends (168 MB of panes for a 16 MiB budget).
#[cfg(target_os = "linux")]
#[test]
fn windows_with_contents_ten_times_the_memory_budget_stay_within_it() {
    runs_within_the_budget("windows", 21_000, 4000, "windows", 42_000);
}

#[test]
fn a_budget_too_small_for_the_job_stops_it_with_what_to_change() {
    let tmp = tempfile::tempdir().unwrap();
    let out = command(tmp.path(), 10, 100, 8)
        .output()
        .expect("run memory_budget");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "the RocksDB memory budget of 8.0 MiB is too small: it gives each of its 1 slot(s) \
             8.0 MiB; it needs at least 16 MiB per slot (16 MiB for this job)"
        ),
        "{err}"
    );
}
