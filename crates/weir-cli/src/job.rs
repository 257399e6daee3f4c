//! `weir job status|savepoint|cancel --web HOST:PORT`: a running job's REST API (a job
//! started with `--web`, or a cluster's coordinator started with it; docs/operations.md).
//!
//! A minimal HTTP/1.1 client over a plain TCP connection (one request per connection, as
//! the server answers), so the tool needs no HTTP library. `weir cluster` uses it too.

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What to ask.
pub enum Request {
    Status { json: bool },
    Savepoint { stop: bool },
    Cancel,
}

/// A job's REST API: its address, how long to wait, and the job's secret for actions.
pub struct Api {
    pub web: String,
    pub timeout: Duration,
    pub secret: Option<weir_runtime::Secret>,
    /// TLS to the API, trusting this CA (`--ca-file`); `None`: plain HTTP.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// A TLS client configuration that trusts the CA certificates in `path` (PEM).
pub fn tls_trusting(path: &std::path::Path) -> Result<std::sync::Arc<rustls::ClientConfig>> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read the CA file {}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.with_context(|| format!("{} is not PEM certificates", path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("a certificate in {} is not usable", path.display()))?;
    }
    if roots.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    #[allow(deprecated)] // ring: see weir_runtime::Tls
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// Reads a whole response: over TLS an end without close_notify after the answer is
/// taken as the end, as HTTP/1 with `Connection: close` allows.
fn read_all(r: &mut dyn Read, into: &mut Vec<u8>) -> std::io::Result<()> {
    match r.read_to_end(into) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !into.is_empty() => Ok(()),
        other => other.map(|_| ()),
    }
}

impl Api {
    /// Sends `method path` with `body`; the status code and the JSON answer.
    pub fn call(&self, method: &str, path: &str, body: &str) -> Result<(u16, serde_json::Value)> {
        self.call_within(method, path, body, self.timeout)
    }

    fn call_within(
        &self,
        method: &str,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<(u16, serde_json::Value)> {
        let web = &self.web;
        let address = web
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {web}; give the job's --web HOST:PORT"))?
            .next()
            .with_context(|| format!("{web} resolves to no address"))?;
        let mut c = TcpStream::connect_timeout(&address, timeout).with_context(|| {
            format!(
                "cannot reach the job's REST API at {web}: is the job running with --web {web}?"
            )
        })?;
        c.set_read_timeout(Some(timeout))?;
        c.set_write_timeout(Some(timeout))?;
        let auth = match &self.secret {
            Some(s) => format!("Authorization: Bearer {}\r\n", s.expose()),
            None => String::new(),
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {web}\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\n{auth}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let mut response = Vec::new();
        match &self.tls {
            None => {
                c.write_all(request.as_bytes())?;
                read_all(&mut c, &mut response)
            }
            Some(config) => {
                let host = web.rsplit_once(':').map_or(web.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .with_context(|| format!("{host} is not a host name for TLS"))?;
                let conn =
                    rustls::ClientConnection::new(config.clone(), name).context("starting TLS")?;
                let mut tls = rustls::StreamOwned::new(conn, c);
                tls.write_all(request.as_bytes())
                    .with_context(|| format!("TLS with {web} failed (does it serve https?)"))?;
                read_all(&mut tls, &mut response)
            }
        }
        .with_context(|| format!("no answer from {web} within {}s", timeout.as_secs()))?;
        if self.tls.is_none() && matches!(response.first(), Some(0x15 | 0x16)) {
            bail!(
                "{web} answered with TLS: it serves https; give the CA that signed its \
                 certificate with --ca-file PATH (or WEIR_CA_FILE)"
            );
        }
        if response.is_empty() {
            bail!(
                "{web} closed the connection without an answer: if it serves https, give the \
                 CA that signed its certificate with --ca-file PATH"
            );
        }
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response.split_once("\r\n\r\n").with_context(|| {
            let start: String = response.chars().take(200).collect();
            format!("{web} did not answer HTTP: {start:?}")
        })?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{web} answered without a status: {head}"))?;
        let json = serde_json::from_str(body)
            .with_context(|| format!("{web} answered {status} without JSON: {body}"))?;
        Ok((status, json))
    }

    /// Fails with the API's error message unless `status` is one of `ok`; a refused
    /// action says how to give the secret.
    pub fn expect(&self, status: u16, answer: &serde_json::Value, ok: &[u16]) -> Result<()> {
        if ok.contains(&status) {
            return Ok(());
        }
        let message = answer["error"]
            .as_str()
            .map_or_else(|| answer.to_string(), str::to_string);
        if status == 401 && self.secret.is_none() {
            bail!(
                "the job at {} answered 401: {message}; give its secret with --secret-file PATH \
                 (or the environment variable WEIR_SECRET_FILE)",
                self.web
            );
        }
        bail!("the job at {} answered {status}: {message}", self.web)
    }

    /// `POST /v1/job/cancel`.
    pub fn cancel(&self, out: &mut dyn Write) -> Result<()> {
        let (status, answer) = self.call("POST", "/v1/job/cancel", "")?;
        self.expect(status, &answer, &[202])?;
        writeln!(out, "cancelling the job at {}", self.web)?;
        Ok(())
    }

    /// `POST /v1/savepoints`, waiting for the savepoint; prints its path.
    pub fn savepoint(&self, stop: bool, out: &mut dyn Write) -> Result<()> {
        // The server waits for the savepoint; give it the time the answer may take.
        let wait_ms = self.timeout.as_millis() as u64;
        let body = serde_json::json!({ "stop": stop, "timeout_ms": wait_ms }).to_string();
        eprintln!(
            "requested a savepoint{} from the job at {}; waiting up to {}s",
            if stop { " and a stop" } else { "" },
            self.web,
            self.timeout.as_secs()
        );
        let (status, answer) = self.call_within(
            "POST",
            "/v1/savepoints",
            &body,
            self.timeout + Duration::from_secs(5),
        )?;
        self.expect(status, &answer, &[200])?;
        let path = answer["savepoint"]["path"]
            .as_str()
            .context("the answer names no savepoint path")?;
        writeln!(out, "{path}")?;
        Ok(())
    }

    /// `GET path`, which must answer 200.
    pub fn get(&self, path: &str) -> Result<serde_json::Value> {
        let (status, answer) = self.call("GET", path, "")?;
        self.expect(status, &answer, &[200])?;
        Ok(answer)
    }
}

/// Sends the request and prints the answer.
pub fn run(api: &Api, request: Request, out: &mut dyn Write) -> Result<()> {
    match request {
        Request::Status { json } => {
            let job = api.get("/v1/job")?;
            let ops = api.get("/v1/operators")?;
            let ck = api.get("/v1/checkpoints")?;
            if json {
                let all = serde_json::json!({ "job": job, "operators": ops, "checkpoints": ck });
                writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                write_status(&job, &ops, &ck, out)?;
            }
            Ok(())
        }
        Request::Savepoint { stop } => api.savepoint(stop, out),
        Request::Cancel => api.cancel(out),
    }
}

pub fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Number(n) if n.is_f64() => format!("{:.2}", n.as_f64().unwrap_or(0.0)),
        other => other.to_string(),
    }
}

/// The `last checkpoint:` line of a status, from a `/v1/checkpoints` answer.
pub fn write_last_checkpoint(ck: &serde_json::Value, out: &mut dyn Write) -> Result<()> {
    match ck["latest_completed"].as_object() {
        Some(c) => writeln!(
            out,
            "last checkpoint: {} {} ({})",
            text(&c["kind"]),
            text(&c["id"]),
            text(&c["path"])
        )?,
        None => writeln!(out, "last checkpoint: none")?,
    }
    Ok(())
}

fn write_status(
    job: &serde_json::Value,
    ops: &serde_json::Value,
    ck: &serde_json::Value,
    out: &mut dyn Write,
) -> Result<()> {
    writeln!(out, "job:             {}", text(&job["name"]))?;
    writeln!(out, "state:           {}", text(&job["state"]))?;
    writeln!(
        out,
        "attempt:         {} ({} restarts)",
        text(&job["attempt"]),
        text(&job["restarts"])
    )?;
    let uptime = job["uptime_ms"].as_u64().unwrap_or(0);
    writeln!(out, "uptime:          {:.1}s", uptime as f64 / 1000.0)?;
    if let Some(w) = job["cluster"]["workers"].as_array() {
        writeln!(
            out,
            "workers:         {} ({} slots)",
            w.len(),
            text(&job["cluster"]["slots"])
        )?;
    }
    write_last_checkpoint(ck, out)?;
    writeln!(
        out,
        "\n{:<24} {:>4} {:>12} {:>12} {:>10} {:>6} {:>6}",
        "operator", "par", "records in", "records out", "out/s", "busy", "bp"
    )?;
    for o in ops["operators"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "{:<24} {:>4} {:>12} {:>12} {:>10} {:>6} {:>6}",
            text(&o["name"]),
            text(&o["parallelism"]),
            text(&o["records_in"]),
            text(&o["records_out"]),
            o["records_out_per_second"]
                .as_f64()
                .map_or("-".into(), |r| format!("{r:.0}")),
            text(&o["busy_ratio"]),
            text(&o["backpressured_ratio"]),
        )?;
    }
    Ok(())
}
