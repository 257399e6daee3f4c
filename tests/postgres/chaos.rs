//! `payments_apply_once` as a child process, killed with SIGKILL — at a fail point between a
//! database commit and the next checkpoint, and at random moments — then restarted until it
//! finishes. Every payment must have exactly one effect.

use crate::support::{Schema, expect_fail_point_kill, url};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use weir_tests::Rng;
use weir_tests::wait_within;

/// Payments for orders 1..=orders, each sent 1–3 times, shuffled; plus `poison` payments
/// with amount 0 for orders orders+1..=orders+poison (the ledger refuses them).
pub(crate) struct Payments {
    pub(crate) dir: tempfile::TempDir,
    input: PathBuf,
    schema: Schema,
    orders: i64,
    valid: BTreeMap<String, (i64, i64)>,
    poison: BTreeSet<String>,
}

impl Payments {
    pub(crate) fn new(orders: i64, poison: i64, seed: u64) -> Payments {
        let mut rng = Rng::new(seed | 1);
        let mut lines = Vec::new();
        let mut valid = BTreeMap::new();
        for order in 1..=orders {
            let id = format!("pay-{order}");
            let amount = 1 + rng.below(1000) as i64;
            for _ in 0..=rng.below(3) {
                lines.push(format!("{id},{order},{amount}"));
            }
            valid.insert(id, (order, amount));
        }
        let mut bad = BTreeSet::new();
        for order in orders + 1..=orders + poison {
            let id = format!("bad-{order}");
            lines.push(format!("{id},{order},0"));
            bad.insert(id);
        }
        for i in (1..lines.len()).rev() {
            lines.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("payments.csv");
        std::fs::write(&input, lines.join("\n") + "\n").unwrap();
        Payments {
            dir,
            input,
            schema: Schema::bare("payments"),
            orders: orders + poison,
            valid,
            poison: bad,
        }
    }

    /// The job's checkpoint directory.
    pub(crate) fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("ck")
    }

    fn start(&self, parallelism: usize, max_rate: u64, failpoint: Option<&str>) -> Child {
        let mut cmd = self.command(parallelism, max_rate);
        if let Some(f) = failpoint {
            cmd.env("WEIR_FAILPOINTS", f);
        }
        cmd.spawn().expect("start payments_apply_once")
    }

    /// `payments_apply_once` on this input and schema, without fail points, its standard
    /// error piped.
    pub(crate) fn command(&self, parallelism: usize, max_rate: u64) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_payments_apply_once"));
        cmd.args(["--postgres", url(), "--schema", &self.schema.name])
            .arg("--input")
            .arg(&self.input)
            .arg("--checkpoint-dir")
            .arg(self.checkpoints())
            .args(["--create-orders", &self.orders.to_string()])
            .args(["--checkpoint-interval-ms", "200"])
            .args(["--parallelism", &parallelism.to_string()])
            .args(["--max-rate", &max_rate.to_string()])
            .env_remove("WEIR_FAILPOINTS")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn run_to_end(&self, parallelism: usize) {
        self.run_to_end_with(parallelism, &[]);
    }

    /// Runs the job to its end with `extra` arguments, asserts exit 0, returns its
    /// standard error (kept in a file while it runs: a full pipe would stall the job).
    pub(crate) fn run_to_end_with(&self, parallelism: usize, extra: &[&str]) -> String {
        let log = self.dir.path().join("run-to-end.log");
        let file = std::fs::File::create(&log).expect("create the run's log");
        let mut child = self
            .command(parallelism, 100_000)
            .args(extra)
            .stderr(file)
            .spawn()
            .expect("start payments_apply_once");
        let status = wait_within(&mut child, Duration::from_secs(120));
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            status.success(),
            "payments_apply_once failed: {status}\n{err}"
        );
        err
    }

    /// Every valid payment paid its order exactly once; poison payments are only in the
    /// dead letters, with their keys.
    pub(crate) fn check(&mut self) {
        let s = self.schema.name.clone();
        let ledger: BTreeMap<String, (i64, i64, i64)> = self
            .schema
            .db
            .query(
                &format!(
                    "SELECT payment_id, min(order_id), min(amount), count(*) FROM {s}.ledger GROUP BY 1"
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
            .collect();
        let want: BTreeMap<String, (i64, i64, i64)> = self
            .valid
            .iter()
            .map(|(id, (o, a))| (id.clone(), (*o, *a, 1)))
            .collect();
        assert_eq!(
            ledger, want,
            "ledger rows per payment (order, amount, count)"
        );
        let orders: BTreeMap<i64, (String, Option<String>)> = self
            .schema
            .db
            .query(
                &format!("SELECT id, status, payment_id FROM {s}.orders"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        for (id, (o, _)) in &self.valid {
            assert_eq!(
                orders[o],
                ("paid".to_string(), Some(id.clone())),
                "order {o}"
            );
        }
        let pending = orders.values().filter(|(st, _)| st == "pending").count();
        assert_eq!(pending, self.poison.len());
        let keys: BTreeMap<String, (String, serde_json::Value)> = self
            .schema
            .db
            .query(
                &format!("SELECT idempotency_key, state, response FROM {s}.processed_messages"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        assert_eq!(keys.len(), self.valid.len());
        for (id, (o, _)) in &self.valid {
            assert_eq!(
                keys[id],
                (
                    "DONE".to_string(),
                    serde_json::json!({"order_id": o, "status": "paid"})
                )
            );
        }
        let letters = weir::dlq::read_dir(self.dir.path().join("ck/dead-letters")).unwrap();
        let dead: BTreeSet<String> = letters.iter().map(|l| l.idempotency_key.clone()).collect();
        assert_eq!(dead, self.poison);
    }
}

fn soak_factor() -> u64 {
    std::env::var("WEIR_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

#[test]
fn sigkill_between_the_database_commit_and_the_checkpoint_leaves_one_effect_per_payment() {
    let mut p = Payments::new(120, 2, 11);
    for _ in 0..3 {
        let mut child = p.start(1, 400, Some("postgres.after_commit=kill"));
        expect_fail_point_kill(&mut child, "postgres.after_commit");
    }
    p.run_to_end(1);
    p.check();
}

#[test]
fn payments_killed_at_random_moments_pay_every_order_once() {
    for (parallelism, seed) in [(1usize, 5u64), (2, 7)] {
        let mut p = Payments::new(300 * soak_factor() as i64, 3, seed);
        let mut rng = Rng::new(seed * 31 + 1);
        for _ in 0..(4 * soak_factor()) {
            let mut child = p.start(parallelism, 600, None);
            std::thread::sleep(Duration::from_millis(150 + rng.below(600)));
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
        p.run_to_end(parallelism);
        p.check();
    }
}
