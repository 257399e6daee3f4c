//! The job's HTTP server: the web dashboard at `/` ([`dashboard`]), the REST API under
//! `/v1/` (JSON; docs/openapi.json) and `GET /metrics`, every series of the process
//! registry ([`weir_core::metrics::render`]) and the job's operator and task figures in
//! the Prometheus text format.
//!
//! axum on hyper's HTTP/1, on a small tokio runtime the server owns (one worker thread):
//! one request per connection (the response closes it), header names in title case as
//! the hand-written server before it sent them. A background tick samples the job's
//! figures once a second for the rates and time fractions of `/v1/operators`.

use crate::status::JobStatus;
use crate::task::JobShared;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir_core::{Error, Result};

pub mod dashboard;

/// Every route the server answers, as (method, path): the OpenAPI file documents exactly
/// these (a test checks it).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/metrics"),
    ("GET", "/v1"),
    ("GET", "/v1/job"),
    ("GET", "/v1/operators"),
    ("GET", "/v1/checkpoints"),
    ("GET", "/v1/exceptions"),
    ("POST", "/v1/savepoints"),
    ("POST", "/v1/job/cancel"),
];

/// A running server; dropping it (or [`WebServer::stop`]) ends it.
pub(crate) struct WebServer {
    address: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    /// Closing it stops accepting connections.
    closing: Option<tokio::sync::oneshot::Sender<()>>,
    /// Connections being served.
    active: Arc<std::sync::atomic::AtomicUsize>,
}

/// How long a stopping server waits for the answers it is writing (a savepoint request
/// that waits for its savepoint answers as soon as the job has ended).
const DRAIN: Duration = Duration::from_secs(2);

/// Counts a connection as active while it lives.
struct Active(Arc<std::sync::atomic::AtomicUsize>);

impl Active {
    fn new(n: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Active(n.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WebServer {
    /// Binds `address` and starts serving `job`. `what` names the server in the error.
    pub(crate) fn start(address: &str, what: &str, job: Arc<JobShared>) -> Result<Self> {
        let listener = std::net::TcpListener::bind(address).map_err(|e| {
            Error::Config(format!(
                "cannot serve {what} on {address}: {e}; choose another address or port \
                 (port 0 picks a free one)"
            ))
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::io(format!("web address {address}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("web address {address}"), e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-web")
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the web server's runtime", e))?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::io(format!("web address {address}"), e))?
        };
        if !bound.ip().is_loopback() && job.cfg.tls.is_none() {
            tracing::warn!(
                "the REST API on {bound} is plain HTTP on a non-loopback \
                 address: give the job TLS settings (--tls-dir) to encrypt it"
            );
        }
        if !bound.ip().is_loopback() && job.cfg.secret.is_none() {
            tracing::warn!(
                "the REST API on {bound} takes savepoints, stops and cancels \
                 the job for anyone who reaches it; give the job a secret (--secret-file) or \
                 bind it to 127.0.0.1"
            );
        }
        let status = job.status.clone();
        let tls = job
            .cfg
            .tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.web_server.clone()));
        let app = router(job);
        let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = active.clone();
        let (closing, mut closed) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = &mut closed => break,
                    a = listener.accept() => a,
                };
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let app = app.clone();
                let active = Active::new(&counting);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let _active = active;
                    match tls {
                        None => serve_connection(stream, app).await,
                        Some(acceptor) => {
                            // A client that does not speak TLS, or fails its handshake,
                            // gets nothing: there is no HTTP to answer it with.
                            let handshake = tokio::time::timeout(
                                Duration::from_secs(5),
                                acceptor.accept(stream),
                            );
                            if let Ok(Ok(stream)) = handshake.await {
                                serve_connection(stream, app).await;
                            }
                        }
                    }
                });
            }
        });
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                status.sample();
            }
        });
        Ok(WebServer {
            address: bound,
            runtime: Some(runtime),
            closing: Some(closing),
            active,
        })
    }

    /// Where it listens.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving: the listener closes, answers being written get up to [`DRAIN`] to
    /// finish, then open connections are dropped.
    pub(crate) fn stop(&mut self) {
        if let Some(c) = self.closing.take() {
            let _ = c.send(());
        }
        let deadline = std::time::Instant::now() + DRAIN;
        while self.active.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(rt) = self.runtime.take() {
            // On a thread of its own: a runtime cannot be shut down from inside another
            // one's async context (a user may join a job from there).
            let _ = std::thread::Builder::new()
                .name("weir-web-stop".into())
                .spawn(move || rt.shutdown_timeout(Duration::from_secs(1)))
                .map(|t| t.join());
        }
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one connection (one request: the answer closes it).
async fn serve_connection<I>(io: I, app: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let _ = hyper::server::conn::http1::Builder::new()
        .title_case_headers(true)
        .keep_alive(false)
        .header_read_timeout(Duration::from_secs(5))
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
}

fn router(job: Arc<JobShared>) -> Router {
    let mut router = Router::new();
    for a in dashboard::ASSETS {
        router = router.route(a.path, get(move || page(a)));
    }
    router
        .route("/metrics", get(metrics))
        .route("/v1", get(index))
        .route(
            "/v1/job",
            get(|s: State<Arc<JobShared>>| view(s, JobStatus::job_view)),
        )
        .route(
            "/v1/operators",
            get(|s: State<Arc<JobShared>>| view(s, JobStatus::operators_view)),
        )
        .route(
            "/v1/checkpoints",
            get(|s: State<Arc<JobShared>>| view(s, JobStatus::checkpoints_view)),
        )
        .route(
            "/v1/exceptions",
            get(|s: State<Arc<JobShared>>| view(s, JobStatus::exceptions_view)),
        )
        .route("/v1/savepoints", post(savepoint))
        .route("/v1/job/cancel", post(cancel))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(job)
}

/// A JSON error body: `{"status": 409, "error": "..."}`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "status": status.as_u16(), "error": message.into() });
    (status, axum::Json(body)).into_response()
}

/// A file of the dashboard. `no-cache`: a browser revalidates, so a newer weir's page is
/// never mixed with an older one's scripts.
async fn page(a: &'static dashboard::Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, a.content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        a.body,
    )
        .into_response()
}

/// The process registry, then the job's operator and task figures (`status::prometheus`).
async fn metrics(State(job): State<Arc<JobShared>>) -> Response {
    let mut text = weir_core::metrics::render();
    text.push_str(&job.status.prometheus());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn index() -> Response {
    let routes: Vec<_> = ROUTES
        .iter()
        .map(|(m, p)| serde_json::json!({ "method": m, "path": p }))
        .collect();
    axum::Json(serde_json::json!({ "version": "v1", "routes": routes })).into_response()
}

async fn view(
    State(job): State<Arc<JobShared>>,
    f: fn(&JobStatus) -> serde_json::Value,
) -> Response {
    axum::Json(f(&job.status)).into_response()
}

async fn not_found(uri: Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no such resource: {}; weir serves its dashboard at /, its REST API under /v1 (GET /v1 lists it) and its metrics at /metrics",
            uri.path()
        ),
    )
}

async fn method_not_allowed(uri: Uri) -> Response {
    let allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|(_, p)| *p == uri.path())
        .map(|(m, _)| *m)
        .collect();
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} answers only {}", uri.path(), allowed.join(", ")),
    )
}

/// Refuses an action without the job's secret (when it has one): `401` with a message
/// that says what to send, counted in `web_actions_refused_total{reason}`.
fn unauthorized(job: &JobShared, headers: &HeaderMap) -> Option<Response> {
    let secret = job.cfg.secret.as_ref()?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let reason = match given {
        Some(token) if secret.matches(token.trim()) => return None,
        Some(_) => "wrong secret",
        None => "no secret",
    };
    weir_core::metrics::counter(
        "web_actions_refused_total",
        "REST API actions refused because the request did not carry the job's secret.",
        &[("reason", reason)],
    )
    .inc();
    let message = match given {
        Some(_) => "the secret in the Authorization header is not this job's secret",
        None => {
            "this job's actions need its secret: send the header 'Authorization: Bearer SECRET' \
             (weir job|cluster … --secret-file PATH does)"
        }
    };
    let mut r = error(StatusCode::UNAUTHORIZED, message);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"weir\""),
    );
    Some(r)
}

/// Refuses an action on a job that has ended.
fn ended(job: &JobShared) -> Option<Response> {
    if job.status.is_running() {
        return None;
    }
    let state = job.status.job_view()["state"].clone();
    Some(error(
        StatusCode::CONFLICT,
        format!(
            "the job has ended ({}); there is nothing to act on",
            state.as_str().unwrap_or("")
        ),
    ))
}

/// The body of `POST /v1/savepoints`: `{"stop": bool, "timeout_ms": N}`, both optional.
fn savepoint_request(body: &[u8]) -> Option<(bool, Option<u64>)> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some((false, None));
    }
    let serde_json::Value::Object(o) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    if !o.keys().all(|k| k == "stop" || k == "timeout_ms") {
        return None;
    }
    let stop = match o.get("stop") {
        None => false,
        Some(v) => v.as_bool()?,
    };
    let timeout = match o.get("timeout_ms") {
        None => None,
        Some(v) => Some(v.as_u64()?),
    };
    Some((stop, timeout))
}

/// `POST /v1/savepoints` with an optional body `{"stop": true}`: the same request as
/// `JobHandle::trigger_savepoint` / `stop_with_savepoint` and `weir savepoint trigger|stop`.
/// With `"timeout_ms": N` the answer waits up to N ms for the savepoint and carries it.
async fn savepoint(State(job): State<Arc<JobShared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = unauthorized(&job, &headers) {
        return r;
    }
    let Some((stop, timeout)) = savepoint_request(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body must be empty or a JSON object {\"stop\": true|false, \"timeout_ms\": N}",
        );
    };
    if let Some(r) = ended(&job) {
        return r;
    }
    if job.cfg.checkpoint.is_none() {
        return error(
            StatusCode::CONFLICT,
            "the job takes no checkpoints, so it cannot take a savepoint: run it with checkpoints configured",
        );
    }
    let latest = job.status.checkpoints_view()["history"][0]["id"].as_u64();
    let request = if stop { 2 } else { 1 };
    job.savepoint_request.fetch_max(request, Ordering::SeqCst);
    if let Some(ms) = timeout {
        return wait_for_savepoint(&job, latest, request, Duration::from_millis(ms)).await;
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({
            "accepted": true,
            "action": if stop { "stop-with-savepoint" } else { "savepoint" },
            "after_checkpoint_id": latest,
        })),
    )
        .into_response()
}

/// Waits for the first savepoint with an id above `after` to complete or fail, the job to
/// end, or `timeout`; withdraws the request on timeout if the job has not taken it.
async fn wait_for_savepoint(
    job: &JobShared,
    after: Option<u64>,
    request: u8,
    timeout: Duration,
) -> Response {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let ended = !job.status.is_running();
        let view = job.status.checkpoints_view();
        let found = view["history"].as_array().and_then(|h| {
            h.iter()
                .rev()
                .find(|c| {
                    c["kind"] == "savepoint"
                        && c["id"].as_u64() > after
                        && c["status"] != "IN_PROGRESS"
                })
                .cloned()
        });
        match found {
            Some(c) if c["status"] == "COMPLETED" => {
                let body = serde_json::json!({
                    "accepted": true,
                    "action": if request == 2 { "stop-with-savepoint" } else { "savepoint" },
                    "after_checkpoint_id": after,
                    "savepoint": c,
                });
                return (StatusCode::OK, axum::Json(body)).into_response();
            }
            Some(c) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "savepoint {} failed: {}",
                        c["id"],
                        c["failure"].as_str().unwrap_or("unknown reason")
                    ),
                );
            }
            None if ended => {
                return error(
                    StatusCode::CONFLICT,
                    "the job ended before it took the savepoint",
                );
            }
            None => {}
        }
        if tokio::time::Instant::now() >= deadline {
            let withdrawn = job
                .savepoint_request
                .compare_exchange(request, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
            let message = if withdrawn {
                format!(
                    "no savepoint within {} ms; the job had not taken the request, which is withdrawn",
                    timeout.as_millis()
                )
            } else {
                format!(
                    "no savepoint completed within {} ms; the job is taking it (watch /v1/checkpoints)",
                    timeout.as_millis()
                )
            };
            return error(StatusCode::GATEWAY_TIMEOUT, message);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `POST /v1/job/cancel`: the same as `JobHandle::cancel`.
async fn cancel(State(job): State<Arc<JobShared>>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorized(&job, &headers) {
        return r;
    }
    if let Some(r) = ended(&job) {
        return r;
    }
    job.cancel.store(true, Ordering::SeqCst);
    job.status.cancelling();
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({ "accepted": true, "action": "cancel" })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::ROUTES;

    /// The OpenAPI file documents exactly the routes the server answers.
    #[test]
    fn the_openapi_file_documents_every_route() {
        let text = include_str!("../../../docs/openapi.json");
        let doc: serde_json::Value = serde_json::from_str(text).expect("docs/openapi.json parses");
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
        let paths = doc["paths"].as_object().expect("paths");
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, ops) in paths {
            for method in ops.as_object().expect("operations").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    documented.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        documented.sort();
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        served.sort();
        assert_eq!(
            documented, served,
            "docs/openapi.json and the server's routes differ"
        );
        // Every $ref resolves.
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for r in text.split("\"$ref\": \"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').expect("a closing quote")];
            assert!(schemas.contains_key(name), "unresolved $ref {name}");
        }
    }
}
