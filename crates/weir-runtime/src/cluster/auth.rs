//! Mutual authentication of cluster connections with the job's shared secret: every
//! connection to a coordinator or a worker's data port starts with a challenge-response in
//! which each side proves it holds the secret without sending it.
//!
//! Frames (bodies start with `A`, so they never look like a cluster message):
//!
//! 1. client → server `A1` + client nonce (32 random bytes);
//! 2. server → client `A2` + server nonce + HMAC-SHA256(secret, "weir server" ‖ cn ‖ sn);
//! 3. client → server `A3` + HMAC-SHA256(secret, "weir client" ‖ cn ‖ sn);
//!
//! then the connection carries its usual messages. Either side that finds the other's
//! proof wrong, or the other side without a secret when it has one (or the reverse),
//! sends `A0` + a reason and closes; the server counts it in
//! `cluster_connections_refused_total{port,reason}`.

use crate::Secret;
use hmac::{KeyInit, Mac};
use tokio::io::{AsyncRead, AsyncWrite};
use weir_core::{Error, Result};

use super::wire;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

const NONCE: usize = 32;
const PROOF: usize = 32;
const TAG: u8 = b'A';

/// What a server does with a connection's first frame.
pub(crate) enum Admitted {
    /// Authenticated (or no secret on either side): the connection's first frame of its
    /// usual messages is still to be read.
    Authenticated,
    /// No secret on either side: this is the connection's first usual frame.
    Open(Vec<u8>),
}

fn proof(secret: &Secret, who: &[u8], cn: &[u8], sn: &[u8]) -> HmacSha256 {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(who);
    mac.update(cn);
    mac.update(sn);
    mac
}

fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n)
        .map_err(|e| Error::Config(format!("no random numbers for authentication: {e}")))?;
    Ok(n)
}

fn frame(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut body = vec![TAG, kind];
    for p in parts {
        body.extend_from_slice(p);
    }
    body
}

/// The reason in an `A0` frame, if `body` is one.
pub(crate) fn refusal(body: &[u8]) -> Option<String> {
    match body {
        [TAG, b'0', reason @ ..] => Some(String::from_utf8_lossy(reason).into_owned()),
        _ => None,
    }
}

fn refused(port: &str, reason: &str) {
    weir_core::metrics::counter(
        "cluster_connections_refused_total",
        "Connections to a cluster port refused: without the job's secret or TLS, or with wrong ones.",
        &[("port", port), ("reason", reason)],
    )
    .inc();
}

/// Authenticates the client side of a new connection to `peer` (when this process has a
/// secret). An error names the peer and what to fix.
pub(crate) async fn client<R, W>(
    r: &mut R,
    w: &mut W,
    secret: Option<&Secret>,
    peer: &str,
) -> Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Some(secret) = secret else {
        return Ok(());
    };
    let io = |e: std::io::Error| super::transport::io_error(peer, e);
    let cn = nonce()?;
    wire::write_frame(w, &frame(b'1', &[&cn]))
        .await
        .map_err(io)?;
    let answer = wire::read_frame(r).await.map_err(io)?.ok_or_else(|| {
        Error::Config(format!(
            "{peer} closed the connection during authentication: is it a weir process of the same version?"
        ))
    })?;
    if let Some(reason) = refusal(&answer) {
        return Err(Error::Config(format!(
            "{peer} refused the connection: {reason}"
        )));
    }
    let (sn, server_proof) = match answer.as_slice() {
        [TAG, b'2', rest @ ..] if rest.len() == NONCE + PROOF => rest.split_at(NONCE),
        _ => {
            return Err(Error::Config(format!(
                "{peer} did not answer the authentication: it runs without a secret, or is not a \
                 weir process of this version; give every process of the job the same secret"
            )));
        }
    };
    if proof(secret, b"weir server", &cn, sn)
        .verify_slice(server_proof)
        .is_err()
    {
        let reason = "the peer does not hold this process's secret";
        let _ = wire::write_frame(w, &frame(b'0', &[reason.as_bytes()])).await;
        return Err(Error::Config(format!(
            "{peer} does not hold this job's secret: give every process of the job the same secret"
        )));
    }
    let mine = proof(secret, b"weir client", &cn, sn)
        .finalize()
        .into_bytes();
    wire::write_frame(w, &frame(b'3', &[&mine]))
        .await
        .map_err(io)?;
    Ok(())
}

/// Authenticates the server side, given the connection's first frame. `Err` carries the
/// reason the connection was refused (already sent to the peer and counted).
pub(crate) async fn server<R, W>(
    r: &mut R,
    w: &mut W,
    secret: Option<&Secret>,
    first: Vec<u8>,
    port: &str,
) -> std::result::Result<Admitted, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let refuse = async |w: &mut W, reason: &str, why: &str| {
        refused(port, why);
        let _ = wire::write_frame(w, &frame(b'0', &[reason.as_bytes()])).await;
        reason.to_string()
    };
    let cn = match (secret, first.as_slice()) {
        (None, [TAG, ..]) => {
            return Err(refuse(
                w,
                "this process has no secret but the connecting one has: give every process of \
                 the job the same secret (--secret-file), or none",
                "unexpected secret",
            )
            .await);
        }
        (None, _) => return Ok(Admitted::Open(first)),
        (Some(_), [TAG, b'1', cn @ ..]) if cn.len() == NONCE => cn.to_vec(),
        (Some(_), _) => {
            return Err(refuse(
                w,
                "this cluster requires authentication: start the process with the job's secret \
                 (--secret-file PATH or WEIR_SECRET_FILE)",
                "no secret",
            )
            .await);
        }
    };
    let secret = secret.expect("matched above");
    let sn = nonce().map_err(|e| e.to_string())?;
    let mine = proof(secret, b"weir server", &cn, &sn)
        .finalize()
        .into_bytes();
    if wire::write_frame(w, &frame(b'2', &[&sn, &mine]))
        .await
        .is_err()
    {
        return Err("the peer went away during authentication".into());
    }
    let answer =
        match tokio::time::timeout(std::time::Duration::from_secs(10), wire::read_frame(r)).await {
            Ok(Ok(Some(a))) => a,
            _ => {
                refused(port, "no proof");
                return Err("the peer did not complete the authentication".into());
            }
        };
    if refusal(&answer).is_some() {
        refused(port, "wrong secret");
        return Err("the peer found this process's secret wrong".into());
    }
    let ok = match answer.as_slice() {
        [TAG, b'3', p @ ..] => proof(secret, b"weir client", &cn, &sn)
            .verify_slice(p)
            .is_ok(),
        _ => false,
    };
    if !ok {
        return Err(refuse(
            w,
            "wrong secret: this process and the connecting one hold different secrets",
            "wrong secret",
        )
        .await);
    }
    Ok(Admitted::Authenticated)
}
