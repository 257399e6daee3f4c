//! `weir-bench async-io`: the throughput of async I/O against a service with a fixed
//! latency, next to what the capacity allows (capacity ÷ latency per subtask).
//!
//! generator → `map_async` (capacity N, ordered unless `--unordered`) → counting sink.
//! The service answers `2 × value` after `--latency-ms`: in this process on a clock thread of
//! its own (`--service local`, the default, so the figure is the operator's and not an HTTP
//! stack's), or over HTTP on loopback (`--service http`: an axum server and a
//! reqwest client with a connection pool, both on the same runtime).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use weir::async_io::AsyncOptions;
use weir::prelude::*;
use weir_bench::Counting;

/// Which service the operator calls.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// An async function that answers after the latency (woken by the service's clock).
    Local,
    /// An HTTP server on 127.0.0.1 that answers after the latency.
    Http,
}

/// The service's clock: one thread keeps the pending answers by deadline and wakes each
/// within about 0.1 ms of it, as a remote service with a fixed latency answers. The async
/// runtime's own timer has millisecond ticks and fires 1 to 2 ms late, which would make a
/// 10 ms service an 11.5 ms one and measure the timer instead of the operator.
struct Clock {
    requests: Mutex<mpsc::Sender<(Instant, oneshot::Sender<()>)>>,
}

impl Clock {
    fn start() -> Clock {
        let (tx, rx) = mpsc::channel::<(Instant, oneshot::Sender<()>)>();
        let spawned = std::thread::Builder::new()
            .name("bench-service-clock".into())
            .spawn(move || {
                let mut due: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
                let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
                let mut next_id = 0u64;
                loop {
                    let now = Instant::now();
                    while let Some(Reverse((at, id))) = due.peek().copied() {
                        if at > now {
                            break;
                        }
                        due.pop();
                        if let Some(wake) = waiting.remove(&id) {
                            let _ = wake.send(());
                        }
                    }
                    let got = match due.peek() {
                        Some(Reverse((at, _))) => {
                            rx.recv_timeout(at.saturating_duration_since(Instant::now()))
                        }
                        None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                    };
                    match got {
                        Ok((at, wake)) => {
                            due.push(Reverse((at, next_id)));
                            waiting.insert(next_id, wake);
                            next_id += 1;
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            });
        if let Err(e) = spawned {
            panic!("cannot start the service's clock thread: {e}");
        }
        Clock {
            requests: Mutex::new(tx),
        }
    }

    /// Waits until `at`.
    async fn until(&self, at: Instant) {
        let (wake, woken) = oneshot::channel();
        let sent = self
            .requests
            .lock()
            .map(|tx| tx.send((at, wake)).is_ok())
            .unwrap_or(false);
        if sent {
            let _ = woken.await;
        }
    }
}

/// The service's figures.
struct Figures {
    clock: Clock,
    now: AtomicUsize,
    max: AtomicUsize,
    /// Microseconds the requests spent in the service, summed.
    busy_us: AtomicU64,
    requests: AtomicU64,
}

impl Figures {
    async fn answer(&self, value: i64, latency: Duration) -> i64 {
        let started = Instant::now();
        let inside = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.max.fetch_max(inside, Ordering::Relaxed);
        self.clock.until(started + latency).await;
        self.now.fetch_sub(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.busy_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        2 * value
    }
}

#[derive(serde::Deserialize)]
struct Query {
    value: i64,
}

/// Starts the HTTP service on the async runtime; returns its URL.
fn http_service(figures: Arc<Figures>, latency: Duration) -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let rt = weir::async_io::handle();
    let listener = {
        let _inside = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let app = axum::Router::new().route(
        "/double",
        axum::routing::get(
            move |axum::extract::Query(q): axum::extract::Query<Query>| {
                let figures = figures.clone();
                async move { figures.answer(q.value, latency).await.to_string() }
            },
        ),
    );
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{address}/double"))
}

/// Runs the job; returns its JSON line.
pub fn run(
    records: u64,
    capacity: usize,
    latency_ms: u64,
    parallelism: usize,
    unordered: bool,
    service: Service,
) -> anyhow::Result<serde_json::Value> {
    let latency = Duration::from_millis(latency_ms);
    let figures = Arc::new(Figures {
        clock: Clock::start(),
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
        busy_us: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    });
    let env = Env::new().parallelism(parallelism);
    let mut opts = AsyncOptions::new(capacity, latency + Duration::from_secs(30));
    if unordered {
        opts = opts.unordered();
    }
    let source = env.generator(records, 1000).map(|(_, v)| v);
    let answers = match service {
        Service::Local => {
            let figures = figures.clone();
            source.map_async(opts, move |v: i64| {
                let figures = figures.clone();
                async move { figures.answer(v, latency).await }
            })
        }
        Service::Http => {
            let url = http_service(figures.clone(), latency)?;
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(capacity * parallelism)
                .build()?;
            source.try_map_async(opts, move |v: i64| {
                let request = client.get(&url).query(&[("value", v)]);
                async move {
                    let text = request.send().await?.error_for_status()?.text().await?;
                    Ok::<i64, reqwest::Error>(text.trim().parse().unwrap_or(i64::MIN))
                }
            })
        }
    };
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    answers
        .name("async-io")
        .sink("count", move || Counting::new(counter.clone(), |_: &i64| 1));
    let cpu_before = weir_bench::nexmark::run::process_cpu_seconds();
    let result = env.execute("async-io")?;
    let cpu_s = match (cpu_before, weir_bench::nexmark::run::process_cpu_seconds()) {
        (Some(a), Some(b)) => Some(((b - a) * 100.0).round() / 100.0),
        _ => None,
    };
    let results = total.load(Ordering::SeqCst);
    anyhow::ensure!(
        results == records,
        "the sink counted {results} answers for {records} records"
    );
    let elapsed = result.elapsed.as_secs_f64();
    let per_sec = records as f64 / elapsed;
    let bound = (capacity * parallelism) as f64 / latency.as_secs_f64();
    let requests = figures.requests.load(Ordering::Relaxed).max(1);
    let service_latency_s = figures.busy_us.load(Ordering::Relaxed) as f64 / requests as f64 / 1e6;
    // The bound at the latency the service really had (its clock wakes an answer a little
    // late, later on a busy machine): how close the operator keeps its capacity busy.
    let measured_bound = (capacity * parallelism) as f64 / service_latency_s;
    Ok(serde_json::json!({
        "job": "async-io",
        "service": format!("{service:?}").to_lowercase(),
        "records": records,
        "capacity": capacity,
        "latency_ms": latency_ms,
        "parallelism": parallelism,
        "order": if unordered { "unordered" } else { "ordered" },
        "elapsed_s": (elapsed * 1000.0).round() / 1000.0,
        "records_per_sec": per_sec.round() as u64,
        "capacity_bound_per_sec": bound.round() as u64,
        "share_of_bound": (per_sec / bound * 1000.0).round() / 1000.0,
        "max_in_flight": figures.max.load(Ordering::Relaxed),
        "service_latency_ms": (service_latency_s * 1e5).round() / 100.0,
        "share_of_measured_bound": (per_sec / measured_bound * 1000.0).round() / 1000.0,
        "results": results,
        "cpu_s": cpu_s,
    }))
}
