//! Quickstart: page views per page, per minute of event time, and running totals per page.
//!
//! Run it from the repository root (no broker, no set-up, in-memory state):
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! What it shows:
//! - a parallel source ([`SourceFunction`]) that generates 400,000 deterministic page views
//!   with event timestamps up to two seconds out of order;
//! - watermarks that tolerate that disorder ([`WatermarkStrategy::bounded_out_of_orderness`]);
//! - `key_by` + one-minute tumbling event-time windows counting views per page;
//! - a [`KeyedProcessFunction`] with keyed [`ValueState`] keeping a running total per page;
//! - progress lines while the job runs, a readable summary at the end, and a check of every
//!   result against the same computation in plain Rust. It prints `results verified`, or
//!   exits with an error naming the first difference.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use weir::prelude::*;

/// Number of page views the source generates.
const EVENTS: u64 = 400_000;
/// Average distance between two views in event time: 400,000 views span 100 minutes.
const MS_PER_EVENT: u64 = 15;
/// How far out of order a view can be (its timestamp lags by up to this much).
const MAX_DELAY_MS: i64 = 2_000;
/// Tumbling window length: one minute of event time.
const WINDOW_MS: i64 = 60_000;

const PAGES: [&str; 12] = [
    "/",
    "/search",
    "/cart",
    "/checkout",
    "/login",
    "/help",
    "/product/1",
    "/product/2",
    "/product/3",
    "/product/4",
    "/product/5",
    "/about",
];

/// One page view: which page, when (event time, ms) and how many bytes were served.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PageView {
    page: String,
    at_ms: i64,
    bytes: u64,
}

/// The `i`-th page view. A pure function of `i`, so the check at the end can recompute
/// every view without sharing anything with the pipeline.
fn page_view(i: u64) -> PageView {
    // splitmix64: a tiny, well-mixed deterministic hash.
    let mut h = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    // Skewed popularity: page k is picked with probability proportional to 1 / (k + 1).
    let weights: u64 = (1..=PAGES.len() as u64).map(|k| 27_720 / k).sum();
    let mut pick = h % weights;
    let mut page = 0;
    while pick >= 27_720 / (page as u64 + 1) {
        pick -= 27_720 / (page as u64 + 1);
        page += 1;
    }
    PageView {
        page: PAGES[page].to_string(),
        at_ms: (i * MS_PER_EVENT) as i64 + ((h >> 40) % MAX_DELAY_MS as u64) as i64,
        bytes: 500 + (h >> 44) % 20_000,
    }
}

/// The source: subtask `r` of `P` emits views `r, r + P, r + 2P, ...`, so all subtasks
/// advance through event time together.
struct PageViews {
    next: u64,
    step: u64,
}

impl SourceFunction<PageView> for PageViews {
    fn poll(&mut self, out: &mut SourceOutput<'_, PageView>) -> weir::Result<SourceStatus> {
        while self.next < EVENTS && out.emitted() < 1024 {
            let view = page_view(self.next);
            let ts = view.at_ms;
            out.emit_at(view, ts)?;
            self.next += self.step;
        }
        Ok(if self.next >= EVENTS {
            SourceStatus::Finished
        } else {
            SourceStatus::More
        })
    }
}

/// Running totals per page: after each view, emits (page, views so far, bytes so far).
struct RunningTotals {
    totals: ValueState<(u64, u64)>,
}

impl RunningTotals {
    fn new(state: &mut StateContext<String>) -> weir::Result<Self> {
        Ok(RunningTotals {
            totals: state.value_state("totals")?,
        })
    }
}

impl KeyedProcessFunction<String, PageView, (String, u64, u64)> for RunningTotals {
    fn process(
        &mut self,
        view: PageView,
        ctx: &mut KeyedContext<'_, String, (String, u64, u64)>,
    ) -> weir::Result<()> {
        let (views, bytes) = self
            .totals
            .update(|t| t.map_or((1, view.bytes), |(v, b)| (v + 1, b + view.bytes)))?;
        ctx.emit((view.page, views, bytes));
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    // Every core of this machine, in-memory state, a progress line every 50 ms.
    let env = Env::new().progress(Duration::from_millis(50));

    let views = env
        .source("page-views", |ctx: SourceContext| PageViews {
            next: ctx.subtask as u64,
            step: ctx.parallelism as u64,
        })
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(MAX_DELAY_MS));

    // Views per page per minute of event time: (page, window start in ms, views).
    let per_minute = views
        .key_by(|v: &PageView| v.page.clone())
        .window(WindowAssigner::tumbling(WINDOW_MS))
        .aggregate_with_window(Count, |page: &String, w: &TimeWindow, n: u64| {
            (page.clone(), w.start, n)
        })
        .collect();

    // A running total per page in keyed state, updated on every view.
    let running = views
        .key_by(|v: &PageView| v.page.clone())
        .process_with_state(RunningTotals::new)
        .collect();

    let job = env.execute("quickstart")?;
    println!(
        "job '{}' read {} page views in {:.2?} ({} window results, {} running totals)\n",
        job.name,
        job.records_read(),
        job.elapsed,
        per_minute.len(),
        running.len()
    );

    let per_minute = per_minute.take();
    let running = running.take();
    print_summary(&per_minute, &running);
    verify(&per_minute, &running)?;
    println!("\nresults verified: every window count and running total matches plain Rust");
    Ok(())
}

/// Final (views, bytes) per page: the largest running total emitted for it.
fn final_totals(running: &[(String, u64, u64)]) -> BTreeMap<String, (u64, u64)> {
    let mut last: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (page, views, bytes) in running {
        let e = last.entry(page.clone()).or_default();
        if *views > e.0 {
            *e = (*views, *bytes);
        }
    }
    last
}

fn print_summary(per_minute: &[(String, i64, u64)], running: &[(String, u64, u64)]) {
    let mut totals: Vec<(String, (u64, u64))> = final_totals(running).into_iter().collect();
    totals.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    println!("top pages (running totals from keyed state):");
    println!("  {:<12} {:>8} {:>12}", "page", "views", "MB served");
    for (page, (views, bytes)) in totals.iter().take(5) {
        let mb = *bytes as f64 / 1e6;
        println!("  {page:<12} {views:>8} {mb:>12.1}");
    }

    if let Some((page, start, n)) = per_minute
        .iter()
        .max_by(|a, b| a.2.cmp(&b.2).then(b.1.cmp(&a.1)))
    {
        println!(
            "\nbusiest page-minute (tumbling windows): {page} had {n} views in minute {} \
             (event time {start}..{} ms)",
            start / WINDOW_MS,
            start + WINDOW_MS
        );
    }
    let top = &totals[0].0;
    let mut first: Vec<_> = per_minute.iter().filter(|(p, _, _)| p == top).collect();
    first.sort_by_key(|(_, start, _)| *start);
    let shown: Vec<String> = first
        .iter()
        .take(5)
        .map(|(_, start, n)| format!("minute {}: {n}", start / WINDOW_MS))
        .collect();
    println!("first minutes of {top}: {}", shown.join(", "));
}

/// Recomputes everything in plain Rust and compares it with what the job produced.
fn verify(per_minute: &[(String, i64, u64)], running: &[(String, u64, u64)]) -> anyhow::Result<()> {
    let mut want_windows: HashMap<(String, i64), u64> = HashMap::new();
    let mut want_totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..EVENTS {
        let v = page_view(i);
        let start = v.at_ms - v.at_ms.rem_euclid(WINDOW_MS);
        *want_windows.entry((v.page.clone(), start)).or_default() += 1;
        let t = want_totals.entry(v.page).or_default();
        t.0 += 1;
        t.1 += v.bytes;
    }

    // Windows: one result per (page, minute), each with the right count.
    let mut got_windows: HashMap<(String, i64), u64> = HashMap::new();
    for (page, start, n) in per_minute {
        if got_windows.insert((page.clone(), *start), *n).is_some() {
            anyhow::bail!("window ({page}, {start}) was emitted twice");
        }
    }
    if got_windows != want_windows {
        let missing = want_windows
            .iter()
            .find(|(k, n)| got_windows.get(*k) != Some(*n));
        anyhow::bail!(
            "window counts differ: {} results, expected {}; first difference: {missing:?}",
            got_windows.len(),
            want_windows.len()
        );
    }
    let window_sum: u64 = per_minute.iter().map(|(_, _, n)| n).sum();
    if window_sum != EVENTS {
        anyhow::bail!("window counts add up to {window_sum}, expected {EVENTS}");
    }

    // Running totals: per page, the emitted counts are exactly 1, 2, ..., n (a lost view
    // would leave a gap, a duplicate a repeat) and the final totals match.
    let mut counts: HashMap<&str, Vec<u64>> = HashMap::new();
    for (page, views, _) in running {
        counts.entry(page).or_default().push(*views);
    }
    for (page, mut seen) in counts {
        seen.sort_unstable();
        if seen.iter().zip(1..).any(|(got, want)| *got != want) {
            anyhow::bail!("running counts of {page} are not 1..={}", seen.len());
        }
    }
    let got_totals = final_totals(running);
    if got_totals != want_totals {
        anyhow::bail!("final totals differ:\n  got  {got_totals:?}\n  want {want_totals:?}");
    }
    Ok(())
}
