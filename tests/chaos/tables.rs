//! Tables through crashes: `table_totals` (account upserts and deletes as a table, summed
//! per region with retractions, the changelog of the totals into the exactly-once file
//! sink) is killed with SIGKILL at random moments and resumed. At parallelism 1 the
//! committed changelog must be exactly the one a plain-Rust model of the totals gives,
//! every change once and in order; resumed at parallelism 1, 2 and 3 in turn, every
//! region's changes must chain (each starts from the total the previous one left) to the
//! model's final totals.

use crate::harness::{ExampleRun, Rng, kill_at_random, soak_factor, stderr_of, wait_within};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `n` lines over `accounts` accounts and five regions: mostly upserts (few accounts, so regions empty and refill) (an account
/// changes its amount, or moves), some deletes.
fn input(n: usize, accounts: u64, seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let regions = ["eu", "us", "apac", "latam", "mena"];
    (0..n)
        .map(|_| {
            let account = format!("acc-{}", rng.below(accounts));
            if rng.below(5) == 0 {
                format!("delete,{account}\n")
            } else {
                let region = regions[rng.below(regions.len() as u64) as usize];
                format!("upsert,{account},{region},{}\n", 1 + rng.below(1000))
            }
        })
        .collect()
}

/// The changelog of the region totals, computed the plain way, line by line: a region's
/// first account inserts it, a change of its total updates it (a change that leaves the
/// total as it was emits nothing), its last account leaving deletes it. An account that
/// moves leaves its old region first.
fn model(text: &str) -> Vec<String> {
    let mut rows: BTreeMap<&str, (&str, i64)> = BTreeMap::new();
    // region -> (total, accounts)
    let mut totals: BTreeMap<&str, (i64, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    let apply = |out: &mut Vec<String>,
                 region: &str,
                 before: Option<(i64, u64)>,
                 after: (i64, u64)| {
        match (before, after) {
            (None, (t, _)) => out.push(format!("insert,{region},{t}")),
            (Some((old, _)), (_, 0)) => out.push(format!("delete,{region},{old}")),
            (Some((old, _)), (new, _)) if old != new => {
                out.push(format!("update,{region},{old},{new}"))
            }
            _ => {}
        }
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        let new = (f[0] == "upsert").then(|| (f[2], f[3].parse::<i64>().unwrap()));
        let old = match new {
            Some(row) => rows.insert(f[1], row),
            None => rows.remove(f[1]),
        };
        match (old, new) {
            (Some((r1, a1)), Some((r2, a2))) if r1 == r2 => {
                let before = totals[r1];
                let after = (before.0 - a1 + a2, before.1);
                totals.insert(r1, after);
                apply(&mut out, r1, Some(before), after);
            }
            (old, new) => {
                if let Some((r, a)) = old {
                    let before = totals[r];
                    let after = (before.0 - a, before.1 - 1);
                    if after.1 == 0 {
                        totals.remove(r);
                    } else {
                        totals.insert(r, after);
                    }
                    apply(&mut out, r, Some(before), after);
                }
                if let Some((r, a)) = new {
                    let before = totals.get(r).copied();
                    let after = before.map_or((a, 1), |(t, n)| (t + a, n + 1));
                    totals.insert(r, after);
                    apply(&mut out, r, before, after);
                }
            }
        }
    }
    out
}

/// An input file with output and checkpoint directories for `table_totals`.
struct Run(ExampleRun);

impl std::ops::Deref for Run {
    type Target = ExampleRun;
    fn deref(&self) -> &ExampleRun {
        &self.0
    }
}

impl Run {
    fn new(text: &str) -> Run {
        Run(ExampleRun::new(
            "table_totals",
            env!("CARGO_BIN_EXE_table_totals"),
            "accounts.csv",
            text,
            &["--state", "memory"],
        ))
    }

    /// Runs killed with SIGKILL after 50–300 ms, at the parallelisms given in turn, until
    /// one reads its whole input; returns how many kills landed.
    fn kill_repeatedly(&self, parallelisms: &[usize], seed: u64) -> usize {
        kill_at_random("table_totals", 16 * soak_factor(), seed, 250, |i| {
            self.command(parallelisms[i % parallelisms.len()], Some(1_500))
        })
    }

    /// The committed changelog: part files in checkpoint order (then subtask), each
    /// file's lines in order. After a completed run no uncommitted file may be left.
    fn committed(&self) -> Vec<String> {
        committed_in_order(&self.output)
    }
}

fn committed_in_order(dir: &Path) -> Vec<String> {
    let mut parts: Vec<((u64, u64), PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).expect("output dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            assert!(
                name.starts_with(".weir-owner-"),
                "an uncommitted file is left after a completed run: {name}"
            );
            continue;
        }
        let (subtask, id) = name
            .strip_prefix("part-")
            .and_then(|r| r.split_once('-'))
            .unwrap_or_else(|| panic!("unexpected output file {name}"));
        parts.push((
            (id.parse().unwrap(), subtask.parse().unwrap()),
            entry.path(),
        ));
    }
    parts.sort();
    parts
        .iter()
        .flat_map(|(_, p)| {
            std::fs::read_to_string(p)
                .expect("read part file")
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The first line where `got` and `want` differ, for a readable failure.
fn first_difference(got: &[String], want: &[String]) -> String {
    let i = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    format!(
        "{} lines committed, {} expected; first difference at line {i}: got {:?}, want {:?}",
        got.len(),
        want.len(),
        got.get(i),
        want.get(i)
    )
}

#[test]
fn killed_and_resumed_the_totals_changelog_is_exactly_the_models() {
    let text = input(2_400, 8, 0x7AB1E);
    let want = model(&text);
    // The input exercises what is at stake: moves between regions and emptied regions.
    let emptied = want.iter().filter(|l| l.starts_with("delete")).count();
    assert!(emptied > 20, "only {emptied} regions emptied");

    let chaos = Run::new(&text);
    let landed = chaos.kill_repeatedly(&[1], 0x5EED);
    eprintln!("tables: {landed} kills landed before a run read the whole input");
    assert!(
        landed >= 5,
        "only {landed} kills landed while the job was running"
    );
    chaos.run_to_end(1);
    let got = chaos.committed();
    assert!(got == want, "{}", first_difference(&got, &want));
}

#[test]
fn resumed_at_other_parallelisms_every_region_chains_to_the_models_final_total() {
    let text = input(2_400, 8, 0xC4A1);
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for line in model(&text) {
        let f: Vec<&str> = line.split(',').collect();
        match f[0] {
            "delete" => want.remove(f[1]),
            _ => want.insert(f[1].to_string(), f.last().unwrap().parse().unwrap()),
        };
    }

    let chaos = Run::new(&text);
    let landed = chaos.kill_repeatedly(&[2, 3, 1], 0xFACE);
    assert!(
        landed >= 5,
        "only {landed} kills landed while the job was running"
    );
    chaos.run_to_end(2);
    let mut now: BTreeMap<String, i64> = BTreeMap::new();
    for line in chaos.committed() {
        let f: Vec<&str> = line.split(',').collect();
        let region = f[1].to_string();
        let before = now.get(&region).copied();
        let (old, new) = match f[0] {
            "insert" => (None, Some(f[2].parse().unwrap())),
            "update" => (Some(f[2].parse().unwrap()), Some(f[3].parse().unwrap())),
            "delete" => (Some(f[2].parse().unwrap()), None),
            other => panic!("unexpected change {other} in {line:?}"),
        };
        assert_eq!(
            old, before,
            "{line:?} does not follow {region}'s {before:?}"
        );
        match new {
            Some(t) => now.insert(region, t),
            None => now.remove(&region),
        };
    }
    assert_eq!(now, want);
}

#[test]
fn a_malformed_line_fails_the_job_quoting_it() {
    let run = Run::new("upsert,a1,eu,10\nupsert,a2,eu,ten\n");
    let mut child = run.command(1, None).spawn().expect("start");
    let status = wait_within(&mut child, Duration::from_secs(60));
    let err = stderr_of(&mut child);
    assert!(
        !status.success(),
        "a malformed line must fail the job\n{err}"
    );
    assert!(
        err.contains(
            "amount \"ten\" is not an i64 (invalid digit found in string) in line \
             \"upsert,a2,eu,ten\"; expected `upsert,<account>,<region>,<amount>` or \
             `delete,<account>`"
        ),
        "{err}"
    );
}
