//! `upsert_totals` as a child process, killed with SIGKILL — right after a batch's database
//! commit, and at random moments, also changing its parallelism between runs — then
//! restarted until it finishes. The table must hold exactly the final running total of
//! every open account, and no closed account.

use crate::support::{Schema, expect_fail_point_kill, url};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use weir_tests::Rng;
use weir_tests::{stderr_of, wait_within};

/// Lines `account,amount` and `account,close` over `accounts` accounts, and the table they
/// must leave: account → (total, amounts since opened).
pub struct Totals {
    pub dir: tempfile::TempDir,
    pub input: PathBuf,
    pub want: BTreeMap<String, (i64, i64)>,
    /// The table after each prefix of the lines (index i: after i lines).
    pub prefixes: Vec<BTreeMap<String, (i64, i64)>>,
}

impl Totals {
    pub fn new(lines: usize, accounts: u64, seed: u64) -> Totals {
        let mut rng = Rng::new(seed | 1);
        let mut text = String::new();
        let mut want: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        let mut prefixes = vec![want.clone()];
        for _ in 0..lines {
            let account = format!("acct-{}", rng.below(accounts));
            if rng.below(25) == 0 {
                text.push_str(&format!("{account},close\n"));
                want.remove(&account);
            } else {
                let amount = rng.below(2000) as i64 - 500;
                text.push_str(&format!("{account},{amount}\n"));
                let row = want.entry(account).or_insert((0, 0));
                row.0 += amount;
                row.1 += 1;
            }
            prefixes.push(want.clone());
        }
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("lines.csv");
        std::fs::write(&input, text).unwrap();
        Totals {
            dir,
            input,
            want,
            prefixes,
        }
    }
}

struct Job {
    totals: Totals,
    schema: Schema,
}

impl Job {
    fn new(lines: usize, seed: u64) -> Job {
        Job {
            totals: Totals::new(lines, 40, seed),
            schema: Schema::bare("upsert_chaos"),
        }
    }

    fn table(&self) -> String {
        format!("{}.account_totals", self.schema.name)
    }

    fn rows(db: &mut weir_postgres::postgres::Client, table: &str) -> BTreeMap<String, (i64, i64)> {
        db.query(&format!("SELECT account, total, updates FROM {table}"), &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    }

    fn start(&self, parallelism: usize, max_rate: u64, failpoint: Option<&str>) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_upsert_totals"));
        cmd.args([
            "--postgres",
            url(),
            "--table",
            &self.table(),
            "--create-table",
        ])
        .arg("--input")
        .arg(&self.totals.input)
        .arg("--checkpoint-dir")
        .arg(self.totals.dir.path().join("ck"))
        .args(["--checkpoint-interval-ms", "100"])
        .args(["--parallelism", &parallelism.to_string()])
        .args(["--max-rate", &max_rate.to_string()])
        .env_remove("WEIR_FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        if let Some(f) = failpoint {
            cmd.env("WEIR_FAILPOINTS", f);
        }
        cmd.spawn().expect("start upsert_totals")
    }

    /// Runs to the end and returns its log.
    fn run_to_end(&self, parallelism: usize) -> String {
        let mut child = self.start(parallelism, 1_000_000, None);
        let status = wait_within(&mut child, Duration::from_secs(120));
        let err = stderr_of(&mut child);
        assert!(status.success(), "upsert_totals failed: {status}\n{err}");
        err
    }

    /// The table holds exactly the expected rows, and every batch key is DONE.
    fn check(&mut self) {
        let t = self.table();
        let rows = Job::rows(&mut self.schema.db, &t);
        assert_eq!(rows, self.totals.want, "account → (total, updates)");
        let states: Vec<String> = self
            .schema
            .db
            .query(
                &format!(
                    "SELECT DISTINCT state FROM {}.processed_messages",
                    self.schema.name
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(states, vec!["DONE".to_string()]);
    }
}

#[test]
fn upsert_totals_killed_right_after_a_batch_commit_writes_every_change_once() {
    let mut job = Job::new(1500, 3);
    for _ in 0..3 {
        let mut child = job.start(1, 1500, Some("postgres.after_commit=kill"));
        expect_fail_point_kill(&mut child, "postgres.after_commit");
    }
    // The checkpoint the last run restores had its batch committed just before the kill:
    // the restore finds the batch's key DONE and writes nothing twice.
    let log = job.run_to_end(1);
    assert!(
        log.contains("batch was applied before the restore; skipped"),
        "{log}"
    );
    job.check();
}

#[test]
fn upsert_totals_killed_at_random_moments_and_rescaled_ends_with_the_exact_table() {
    // 5000 lines at 1000 per second: every kill below lands while the job still runs.
    let mut job = Job::new(5000, 17);
    let mut rng = Rng::new(99);
    for parallelism in [2usize, 1, 3, 2] {
        let mut child = job.start(parallelism, 1000, None);
        std::thread::sleep(Duration::from_millis(250 + rng.below(500)));
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "upsert_totals ended before the kill: {exited:?}\n{}",
            stderr_of(&mut child)
        );
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    job.run_to_end(3);
    job.check();
}

#[test]
fn readers_of_the_table_never_see_it_go_back_across_kills() {
    // At parallelism 1 every committed state of the table is the table after some prefix
    // of the input, and exactly-once never commits an older prefix after a newer one —
    // at-least-once would, while a restored job replays changes the table already has.
    let mut job = Job::new(4000, 29);
    let table = job.table();
    // The table exists before the reader starts (the job would create it too).
    job.schema
        .db
        .batch_execute(&format!(
            "CREATE TABLE {table} (account TEXT PRIMARY KEY, total BIGINT NOT NULL, updates BIGINT NOT NULL)"
        ))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, table) = (stop.clone(), table.clone());
        std::thread::spawn(move || {
            let mut db = crate::support::connect();
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rows = Job::rows(&mut db, &table);
                if seen.last() != Some(&rows) {
                    seen.push(rows);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            seen
        })
    };
    let mut rng = Rng::new(7);
    for _ in 0..3 {
        let mut child = job.start(1, 1000, None);
        std::thread::sleep(Duration::from_millis(300 + rng.below(500)));
        assert!(child.try_wait().unwrap().is_none(), "ended before the kill");
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    job.run_to_end(1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.join().unwrap();
    // Each state seen is the table after some prefix, and the prefixes never go back.
    let mut at = 0;
    for (i, rows) in seen.iter().enumerate() {
        let next = (at..job.totals.prefixes.len()).find(|&p| &job.totals.prefixes[p] == rows);
        match next {
            Some(p) => at = p,
            None => {
                let earlier = (0..at).find(|&p| &job.totals.prefixes[p] == rows);
                panic!(
                    "state {i} of {} seen by the reader is {}: {rows:?}",
                    seen.len(),
                    match earlier {
                        Some(p) => format!(
                            "the table after {p} lines, older than one seen before ({at} lines)"
                        ),
                        None => "not the table after any prefix of the input".to_string(),
                    }
                );
            }
        }
    }
    assert!(
        seen.len() > 3,
        "the reader saw too few states: {}",
        seen.len()
    );
    job.check();
}
