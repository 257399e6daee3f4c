//! The job's metrics endpoint: `GET /metrics` answers with every series of the process
//! registry ([`weir_core::metrics::render`]) in the Prometheus text format.
//!
//! A small blocking server on its own thread: one connection at a time, one request per
//! connection, which is how Prometheus scrapes. It stops when the job ends.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_core::{Error, Result};

/// A running metrics endpoint; dropping it (or [`MetricsServer::stop`]) ends it.
pub(crate) struct MetricsServer {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `address` and starts serving.
    pub(crate) fn start(address: &str) -> Result<Self> {
        let listener = TcpListener::bind(address).map_err(|e| {
            Error::Config(format!(
                "cannot serve metrics on {address}: {e}; choose another address or port \
                 (port 0 picks a free one)"
            ))
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::io(format!("metrics address {address}"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(c) = conn {
                        let _ = serve(c);
                    }
                }
            })
            .map_err(|e| Error::io("spawning the metrics thread", e))?;
        Ok(MetricsServer {
            address: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving and waits for the thread.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept; it then sees the flag.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(mut c: TcpStream) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(c.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers: nothing in them changes the answer.
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            weir_core::metrics::render(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "weir serves its metrics at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET /metrics is served\n".to_string(),
        ),
    };
    write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    c.flush()
}
