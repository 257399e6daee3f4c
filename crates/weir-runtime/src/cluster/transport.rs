//! A cluster connection's byte stream: plain TCP, or TLS when the job has TLS settings
//! (docs/cluster.md). Both ends see boxed halves, so the protocol code is the same.
//!
//! A port with TLS answers a plain client with an `A0` refusal frame (which a weir process
//! reads and reports); a port without TLS recognises a TLS client by its first byte and
//! refuses it. Either refusal is counted in `cluster_connections_refused_total{reason="tls"}`.

use crate::Tls;
use rustls::pki_types::ServerName;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use weir_core::{Error, Result};

pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

fn plain(stream: TcpStream) -> (Reader, Writer) {
    let (r, w) = stream.into_split();
    (Box::new(r), Box::new(w))
}

/// The client side of a new connection to `peer`.
pub(crate) async fn client(
    stream: TcpStream,
    tls: Option<&Tls>,
    peer: &str,
) -> Result<(Reader, Writer)> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(plain(stream));
    };
    let connector = tokio_rustls::TlsConnector::from(tls.cluster_client.clone());
    // Cluster certificates are checked against the cluster's CA, not by name.
    let name = ServerName::try_from("weir-cluster").expect("a valid DNS name");
    let stream = tokio::time::timeout(HANDSHAKE_WITHIN, connector.connect(name, stream))
        .await
        .map_err(|_| {
            Error::Config(format!(
                "{peer} did not complete the TLS handshake within {} s",
                HANDSHAKE_WITHIN.as_secs()
            ))
        })?
        .map_err(|e| {
            Error::Config(format!(
                "TLS with {peer} failed: {e}; every process of the job needs TLS settings \
                 (--tls-dir) with a certificate of the same CA"
            ))
        })?;
    let (r, w) = tokio::io::split(stream);
    Ok((Box::new(r), Box::new(w)))
}

fn refused(port: &str) {
    weir_core::metrics::counter(
        "cluster_connections_refused_total",
        "Connections to a cluster port refused: without the job's secret or TLS, or with wrong ones.",
        &[("port", port), ("reason", "tls")],
    )
    .inc();
}

/// The server side of an accepted connection. `Err(Some(reason))`: refused (counted, and
/// told to a plain client); `Err(None)`: the peer closed or sent nothing within the time,
/// as a TCP liveness probe does, which is no one to refuse.
pub(crate) async fn server(
    stream: TcpStream,
    tls: Option<&Tls>,
    port: &str,
) -> std::result::Result<(Reader, Writer), Option<String>> {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    let looks_tls = match tokio::time::timeout(HANDSHAKE_WITHIN, stream.peek(&mut first)).await {
        Ok(Ok(1)) => first[0] == TLS_HANDSHAKE,
        _ => return Err(None),
    };
    match (tls, looks_tls) {
        (None, false) => Ok(plain(stream)),
        (None, true) => {
            refused(port);
            Err(Some(
                "a TLS client connected, but this process has no TLS settings: give every \
                 process of the job the same TLS settings (--tls-dir), or none"
                    .into(),
            ))
        }
        (Some(_), false) => {
            refused(port);
            let reason = "this port requires TLS: start the process with the cluster's TLS \
                          settings (--tls-dir DIR or WEIR_TLS_DIR)";
            let mut stream = stream;
            let mut body = b"A0".to_vec();
            body.extend_from_slice(reason.as_bytes());
            let _ = super::wire::write_frame(&mut stream, &body).await;
            linger(stream).await;
            Err(Some(format!("a client without TLS was refused ({reason})")))
        }
        (Some(tls), true) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.cluster_server.clone());
            let accept = acceptor.accept(stream).into_fallible();
            match tokio::time::timeout(HANDSHAKE_WITHIN, accept).await {
                Ok(Ok(s)) => {
                    let (r, w) = tokio::io::split(s);
                    Ok((Box::new(r) as Reader, Box::new(w) as Writer))
                }
                Ok(Err((e, stream))) => {
                    refused(port);
                    linger(stream).await;
                    Err(Some(format!("TLS handshake failed: {e}")))
                }
                Err(_) => {
                    refused(port);
                    Err(Some("the TLS handshake did not complete".into()))
                }
            }
        }
    }
}

/// Closes a refused connection so that the client reads why: stop sending, then read
/// and drop what the client had already sent (closing with unread data would reset the
/// connection and discard the reason on its way), for up to a second.
async fn linger(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// An I/O error on a connection to `peer`, with a TLS refusal said as one: in TLS 1.3 a
/// server refuses a client's certificate after the client's handshake has finished, so the
/// client learns it from its first read or write.
pub(crate) fn io_error(peer: &str, e: std::io::Error) -> Error {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match tls {
        Some(t) => Error::Config(format!(
            "{peer} refused the TLS connection: {t}; every process of the job needs a \
             certificate of the cluster's CA that has not expired (--tls-dir)"
        )),
        None => Error::io(peer.to_string(), e),
    }
}
