//! Process-wide metrics: counters and gauges with labels, readable by name and rendered in
//! the Prometheus text format.
//!
//! Operators register their series when they are built (labelled with the operator and
//! the subtask) and update them lock-free; [`render`] and [`value`] read them. Series are
//! process-wide: a job started twice in one process with the same operator names updates
//! the same series, as a Prometheus counter of a restarted task would.
//!
//! ```
//! use weir_core::metrics;
//! let c = metrics::counter(
//!     "doc_events_total",
//!     "Events seen by the doc example.",
//!     &[("operator", "example")],
//! );
//! c.add(2);
//! assert_eq!(metrics::value("doc_events_total", &[("operator", "example")]), Some(2.0));
//! assert!(metrics::render().contains("doc_events_total{operator=\"example\"} 2\n"));
//! ```

use crate::state::now_ms;
pub use histogram::{DURATION_BUCKETS, Histogram, LATENCY_BUCKETS, SIZE_BUCKETS};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod histogram;

/// A monotonically increasing count.
#[derive(Clone, Debug)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone, Debug)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down and has a fractional part (a ratio, a rate): an `f64`
/// stored as its bits, read and written lock-free.
#[derive(Clone, Debug)]
pub struct FloatGauge(Arc<AtomicU64>);

impl FloatGauge {
    /// Sets the value.
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// The age of something, in seconds when read: set it to the moment (Unix milliseconds)
/// the thing appeared, or clear it when there is nothing.
#[derive(Clone, Debug)]
pub struct AgeGauge(Arc<AtomicI64>);

/// Stored in an [`AgeGauge`] when there is nothing to age.
const NO_AGE: i64 = i64::MIN;

impl AgeGauge {
    /// Sets the moment (Unix milliseconds) the aged thing appeared.
    pub fn set_since(&self, unix_ms: i64) {
        self.0.store(unix_ms, Ordering::Relaxed);
    }
    /// Nothing to age: reads as 0.
    pub fn clear(&self) {
        self.0.store(NO_AGE, Ordering::Relaxed);
    }
    /// The age in seconds at `now_ms` (0 when cleared).
    pub fn seconds_at(&self, now_ms: i64) -> f64 {
        match self.0.load(Ordering::Relaxed) {
            NO_AGE => 0.0,
            since => (now_ms.saturating_sub(since)).max(0) as f64 / 1000.0,
        }
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Arc<AtomicU64>),
    Gauge(Arc<AtomicI64>),
    Float(Arc<AtomicU64>),
    Age(Arc<AtomicI64>),
    Histogram(Arc<histogram::Cells>),
}

impl Cell {
    fn kind(&self) -> &'static str {
        match self {
            Cell::Counter(_) => "counter",
            Cell::Gauge(_) | Cell::Float(_) | Cell::Age(_) => "gauge",
            Cell::Histogram(_) => "histogram",
        }
    }
    fn read(&self, now_ms: i64) -> f64 {
        match self {
            Cell::Counter(c) => c.load(Ordering::Relaxed) as f64,
            Cell::Gauge(g) => g.load(Ordering::Relaxed) as f64,
            Cell::Float(f) => f64::from_bits(f.load(Ordering::Relaxed)),
            Cell::Age(a) => AgeGauge(a.clone()).seconds_at(now_ms),
            // A histogram reads as its count of observations.
            Cell::Histogram(h) => h.count.load(Ordering::Relaxed) as f64,
        }
    }
}

type Labels = Vec<(String, String)>;

struct Family {
    help: String,
    series: BTreeMap<Labels, Cell>,
}

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<String, Family>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<String, Family>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn labels(l: &[(&str, &str)]) -> Labels {
    let mut v: Labels = l
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

/// The series `name{labels}`, registered with `make` if it is new.
///
/// # Panics
/// When `name{labels}` was registered as a different kind of metric (a bug in the
/// caller). Integer, float and age gauges all render as `gauge` but are different kinds
/// here: the cells hold different things.
fn series(name: &str, help: &str, l: &[(&str, &str)], make: impl Fn() -> Cell) -> Cell {
    let mut r = registry();
    let family = r.entry(name.to_string()).or_insert_with(|| Family {
        help: help.to_string(),
        series: BTreeMap::new(),
    });
    let cell = family.series.entry(labels(l)).or_insert_with(&make).clone();
    assert!(
        std::mem::discriminant(&cell) == std::mem::discriminant(&make()),
        "metric '{name}' registered as two kinds"
    );
    cell
}

/// The counter `name{labels}` (created at 0 if new).
pub fn counter(name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
    match series(name, help, labels, || Cell::Counter(Default::default())) {
        Cell::Counter(c) => Counter(c),
        _ => unreachable!("checked in series"),
    }
}

/// The gauge `name{labels}` (created at 0 if new).
pub fn gauge(name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
    match series(name, help, labels, || Cell::Gauge(Default::default())) {
        Cell::Gauge(g) => Gauge(g),
        _ => unreachable!("checked in series"),
    }
}

/// The float gauge `name{labels}` (created at 0.0 if new). It renders as a Prometheus
/// `gauge` and [`value`] reads it like any other series.
///
/// ```
/// use weir_core::metrics;
/// let g = metrics::float_gauge(
///     "doc_hit_ratio",
///     "Share of lookups the doc example answered from its cache.",
///     &[("operator", "example")],
/// );
/// g.set(0.25);
/// assert_eq!(g.get(), 0.25);
/// assert_eq!(metrics::value("doc_hit_ratio", &[("operator", "example")]), Some(0.25));
/// let text = metrics::render();
/// assert!(text.contains("# TYPE doc_hit_ratio gauge\n"));
/// assert!(text.contains("doc_hit_ratio{operator=\"example\"} 0.25\n"));
/// ```
pub fn float_gauge(name: &str, help: &str, labels: &[(&str, &str)]) -> FloatGauge {
    match series(name, help, labels, || Cell::Float(Default::default())) {
        Cell::Float(f) => FloatGauge(f),
        _ => unreachable!("checked in series"),
    }
}

/// The age gauge `name{labels}`, read in seconds (created cleared if new).
pub fn age_gauge(name: &str, help: &str, labels: &[(&str, &str)]) -> AgeGauge {
    match series(name, help, labels, || {
        Cell::Age(Arc::new(AtomicI64::new(NO_AGE)))
    }) {
        Cell::Age(a) => AgeGauge(a),
        _ => unreachable!("checked in series"),
    }
}

/// The histogram `name{labels}` with buckets bounded by `bounds` (ascending; `+Inf` is
/// added), created empty if new. A series registered again keeps the bounds it was
/// created with. See [`Histogram`].
pub fn histogram(name: &str, help: &str, labels: &[(&str, &str)], bounds: &[f64]) -> Histogram {
    match series(name, help, labels, || {
        Cell::Histogram(Arc::new(histogram::Cells::new(bounds)))
    }) {
        Cell::Histogram(h) => Histogram(h),
        _ => unreachable!("checked in series"),
    }
}

/// The current value of `name{labels}` (a histogram's is its count) (labels in any order), if registered.
pub fn value(name: &str, l: &[(&str, &str)]) -> Option<f64> {
    let r = registry();
    let cell = r.get(name)?.series.get(&labels(l))?.clone();
    drop(r);
    Some(cell.read(now_ms()))
}

/// One series found by [`series_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The metric's name.
    pub name: String,
    /// Its labels other than the ones searched for, sorted.
    pub labels: Vec<(String, String)>,
    /// Its current value.
    pub value: f64,
}

/// Every series whose labels include all of `l`, sorted by name and labels: what an
/// operator subtask registered, for example.
///
/// ```
/// use weir_core::metrics::{self, Series};
/// metrics::counter("doc_seen_total", "Seen.", &[("operator", "o"), ("subtask", "1")]).add(4);
/// let found = metrics::series_with(&[("operator", "o"), ("subtask", "1")]);
/// let want = Series { name: "doc_seen_total".into(), labels: vec![], value: 4.0 };
/// assert_eq!(found, vec![want]);
/// ```
pub fn series_with(l: &[(&str, &str)]) -> Vec<Series> {
    let want = labels(l);
    let now = now_ms();
    let cells: Vec<(String, Labels, Cell)> = {
        let r = registry();
        r.iter()
            .flat_map(|(name, f)| {
                f.series
                    .iter()
                    .filter(|(ls, _)| want.iter().all(|w| ls.contains(w)))
                    .map(move |(ls, c)| (name.clone(), ls.clone(), c.clone()))
            })
            .collect()
    };
    cells
        .into_iter()
        .map(|(name, ls, c)| Series {
            name,
            labels: ls.into_iter().filter(|x| !want.contains(x)).collect(),
            value: c.read(now),
        })
        .collect()
}

/// The sum of `name` over every series whose labels include `l`.
pub fn sum(name: &str, l: &[(&str, &str)]) -> f64 {
    let want = labels(l);
    let now = now_ms();
    let r = registry();
    r.get(name)
        .map(|f| {
            f.series
                .iter()
                .filter(|(ls, _)| want.iter().all(|w| ls.contains(w)))
                .map(|(_, c)| c.read(now))
                .sum()
        })
        .unwrap_or(0.0)
}

/// A sample value as the exposition format spells it: Rust prints infinities as `inf`,
/// Prometheus wants `+Inf` and `-Inf` (`NaN` is spelled the same by both).
fn sample(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".to_string()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        v.to_string()
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every series in the Prometheus text exposition format (version 0.0.4), sorted by name.
pub fn render() -> String {
    use std::fmt::Write;
    let now = now_ms();
    let r = registry();
    let mut s = String::new();
    for (name, f) in r.iter() {
        let kind = f.series.values().next().map(Cell::kind).unwrap_or("gauge");
        let _ = writeln!(s, "# HELP {name} {}", f.help.replace('\n', " "));
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (ls, cell) in &f.series {
            let labels: Vec<String> = ls
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            if let Cell::Histogram(h) = cell {
                render_histogram(&mut s, name, &labels, h);
                continue;
            }
            let v = sample(cell.read(now));
            if labels.is_empty() {
                let _ = writeln!(s, "{name} {v}");
            } else {
                let _ = writeln!(s, "{name}{{{}}} {v}", labels.join(","));
            }
        }
    }
    s
}

/// One sample of a family written by [`write_family`]: its labels and value.
pub type Sample<'a> = (Vec<(&'a str, String)>, f64);

/// Appends one metric family in the exposition format to `out`: what [`render`] writes for
/// a registered series, for figures kept elsewhere and read when scraped (a job's
/// per-subtask figures). `kind` is `counter` or `gauge`; nothing is written without
/// samples.
///
/// ```
/// let mut out = String::new();
/// weir_core::metrics::write_family(
///     &mut out,
///     "doc_records_total",
///     "Records.",
///     "counter",
///     &[(vec![("operator", "map".to_string())], 3.0)],
/// );
/// assert_eq!(
///     out,
///     "# HELP doc_records_total Records.\n# TYPE doc_records_total counter\n\
///      doc_records_total{operator=\"map\"} 3\n"
/// );
/// ```
pub fn write_family(out: &mut String, name: &str, help: &str, kind: &str, samples: &[Sample<'_>]) {
    use std::fmt::Write;
    if samples.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {}", help.replace('\n', " "));
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (ls, v) in samples {
        let labels: Vec<String> = ls
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {}", sample(*v));
        } else {
            let _ = writeln!(out, "{name}{{{}}} {}", labels.join(","), sample(*v));
        }
    }
}

/// Appends a histogram's bucket, sum and count lines.
fn render_histogram(s: &mut String, name: &str, labels: &[String], h: &histogram::Cells) {
    use std::fmt::Write;
    let with = |extra: Option<String>| -> String {
        let all: Vec<&str> = labels
            .iter()
            .map(String::as_str)
            .chain(extra.as_deref())
            .collect();
        if all.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", all.join(","))
        }
    };
    let cumulative = h.cumulative();
    let les = h.bounds.iter().copied().chain([f64::INFINITY]);
    for (le, n) in les.zip(&cumulative) {
        let l = with(Some(format!("le=\"{}\"", sample(le))));
        let _ = writeln!(s, "{name}_bucket{l} {n}");
    }
    let count = cumulative.last().copied().unwrap_or(0);
    let _ = writeln!(s, "{name}_sum{} {}", with(None), sample(h.sum()));
    let _ = writeln!(s, "{name}_count{} {count}", with(None));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_ages_render_with_sorted_labels() {
        let c = counter("t_requests_total", "Requests.", &[("b", "2"), ("a", "1")]);
        c.inc();
        c.add(4);
        let g = gauge("t_size", "Size.", &[("op", "x\"y")]);
        g.set(-3);
        let a = age_gauge("t_oldest_seconds", "Oldest.", &[("op", "x")]);
        let text = render();
        assert!(text.contains("# TYPE t_requests_total counter\n"), "{text}");
        assert!(
            text.contains("t_requests_total{a=\"1\",b=\"2\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP t_size Size.\n# TYPE t_size gauge\n"),
            "{text}"
        );
        assert!(text.contains("t_size{op=\"x\\\"y\"} -3\n"), "{text}");
        assert!(text.contains("t_oldest_seconds{op=\"x\"} 0\n"), "{text}");
        assert_eq!(
            value("t_requests_total", &[("a", "1"), ("b", "2")]),
            Some(5.0)
        );
        assert_eq!(sum("t_requests_total", &[("a", "1")]), 5.0);
        assert_eq!(value("t_requests_total", &[("a", "1")]), None);
        a.set_since(1_000);
        assert_eq!(a.seconds_at(3_500), 2.5);
        a.clear();
        assert_eq!(a.seconds_at(3_500), 0.0);
        // The same series again is the same cell.
        counter("t_requests_total", "Requests.", &[("a", "1"), ("b", "2")]).inc();
        assert_eq!(c.get(), 6);
    }

    #[test]
    fn float_gauges_hold_fractions_and_render_as_gauges() {
        let f = float_gauge("t_ratio", "Ratio.", &[("op", "r"), ("subtask", "0")]);
        assert_eq!(f.get(), 0.0);
        f.set(0.125);
        assert_eq!(f.get(), 0.125);
        assert_eq!(
            value("t_ratio", &[("subtask", "0"), ("op", "r")]),
            Some(0.125)
        );
        // The same series again is the same cell.
        float_gauge("t_ratio", "Ratio.", &[("subtask", "0"), ("op", "r")]).set(-2.5);
        assert_eq!(f.get(), -2.5);
        let text = render();
        assert!(
            text.contains("# HELP t_ratio Ratio.\n# TYPE t_ratio gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("t_ratio{op=\"r\",subtask=\"0\"} -2.5\n"),
            "{text}"
        );
        let inf = float_gauge("t_ratio_inf", "Infinite.", &[]);
        inf.set(f64::INFINITY);
        assert!(render().contains("\nt_ratio_inf +Inf\n"));
        inf.set(f64::NEG_INFINITY);
        assert!(render().contains("\nt_ratio_inf -Inf\n"));
        inf.set(f64::NAN);
        assert!(render().contains("\nt_ratio_inf NaN\n"));
        assert!(value("t_ratio_inf", &[]).is_some_and(f64::is_nan));
    }

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let h = histogram(
            "t_latency_seconds",
            "Latency.",
            &[("sink", "s"), ("job", "j")],
            &[1.0, 0.25, 0.5],
        );
        assert_eq!(h.bounds(), &[0.25, 0.5, 1.0]);
        for v in [0.25, 0.3, 0.75, 2.0, 0.0] {
            h.observe(v);
        }
        let text = render();
        let want = "# HELP t_latency_seconds Latency.\n\
                    # TYPE t_latency_seconds histogram\n\
                    t_latency_seconds_bucket{job=\"j\",sink=\"s\",le=\"0.25\"} 2\n\
                    t_latency_seconds_bucket{job=\"j\",sink=\"s\",le=\"0.5\"} 3\n\
                    t_latency_seconds_bucket{job=\"j\",sink=\"s\",le=\"1\"} 4\n\
                    t_latency_seconds_bucket{job=\"j\",sink=\"s\",le=\"+Inf\"} 5\n\
                    t_latency_seconds_sum{job=\"j\",sink=\"s\"} 3.3\n\
                    t_latency_seconds_count{job=\"j\",sink=\"s\"} 5\n";
        assert!(text.contains(want), "{text}");
        assert_eq!(
            value("t_latency_seconds", &[("job", "j"), ("sink", "s")]),
            Some(5.0)
        );
        // Registered again with other bounds: the same cells, the first bounds.
        let again = histogram(
            "t_latency_seconds",
            "Latency.",
            &[("job", "j"), ("sink", "s")],
            &[9.0],
        );
        assert_eq!(again.bounds(), &[0.25, 0.5, 1.0]);
        again.observe(f64::NAN);
        assert_eq!(h.count(), 6);
        assert!(h.sum().is_nan());
        assert!(
            render().contains("t_latency_seconds_bucket{job=\"j\",sink=\"s\",le=\"+Inf\"} 6\n")
        );
    }

    #[test]
    fn an_unlabelled_empty_histogram_renders_zeros() {
        histogram("t_empty_seconds", "Nothing yet.", &[], &[0.5]);
        let text = render();
        assert!(
            text.contains(
                "# TYPE t_empty_seconds histogram\n\
                 t_empty_seconds_bucket{le=\"0.5\"} 0\n\
                 t_empty_seconds_bucket{le=\"+Inf\"} 0\n\
                 t_empty_seconds_sum 0\n\
                 t_empty_seconds_count 0\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn families_written_from_outside_escape_their_labels() {
        let mut out = String::new();
        write_family(
            &mut out,
            "t_outside",
            "Two\nlines.",
            "gauge",
            &[(vec![("op", "a\"b".into())], 1.5), (vec![], f64::INFINITY)],
        );
        assert_eq!(
            out,
            "# HELP t_outside Two lines.\n# TYPE t_outside gauge\nt_outside{op=\"a\\\"b\"} 1.5\nt_outside +Inf\n"
        );
        let mut none = String::new();
        write_family(&mut none, "t_none", "x", "gauge", &[]);
        assert_eq!(none, "");
    }

    #[test]
    #[should_panic(expected = "registered as two kinds")]
    fn a_histogram_cannot_become_a_counter() {
        histogram("t_kind_hist", "x", &[], &[1.0]);
        counter("t_kind_hist", "x", &[]);
    }

    #[test]
    #[should_panic(expected = "registered as two kinds")]
    fn an_integer_gauge_cannot_become_a_float_gauge() {
        gauge("t_kind_gauge", "x", &[]);
        float_gauge("t_kind_gauge", "x", &[]);
    }

    #[test]
    #[should_panic(expected = "registered as two kinds")]
    fn one_name_cannot_be_two_kinds() {
        counter("t_kind", "x", &[]);
        gauge("t_kind", "x", &[]);
    }
}
