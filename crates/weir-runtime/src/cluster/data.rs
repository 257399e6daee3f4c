//! Worker-to-worker data exchange: the channels of the graph that cross processes.
//!
//! Each worker listens for data connections. For an attempt, the producing worker opens
//! one connection to every worker it sends to, greets it with the attempt number, and
//! carries each channel's messages (record batches, watermarks, barriers, end of input)
//! as frames tagged with the channel's [`LinkKey`]. The receiving worker refuses greetings
//! of any other attempt than the one it runs, so data of an old attempt never reaches the
//! tasks of a new one.
//!
//! Flow control is credit-based per channel, in records, under the receiving channel's
//! in-flight budget (see `credit.rs`): the receiver grants credit only for the room its
//! channel has. A slow consumer so stalls only its own channel; the connection, shared by
//! many channels, keeps flowing.
//!
//! Unaligned checkpoint barriers take no credit: the sender sends them as soon as they
//! are on the channel's priority lane (also while a message waits for a credit), and the
//! receiving connection hands them to the consumer's priority lane as the frame arrives,
//! ahead of the data frames still queued for delivery.

use super::credit::{self, Credit, Grants};
use super::wire::{self, Body, Wire};
use crate::task::LinkKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;
use weir_core::exchange::{Link, LinkRead};
use weir_core::{Error, Result};

/// A data frame's body (its message starts at [`wire::DATA_HEADER`]) and where to send
/// the credit back.
type Delivery = (Vec<u8>, UnboundedSender<Vec<u8>>);

/// The receiving ends of the current attempt's incoming channels.
#[derive(Default)]
struct Inbound {
    attempt: u64,
    queues: HashMap<LinkKey, crossbeam_channel::Sender<Delivery>>,
    /// The priority lanes of the same channels (unaligned barriers).
    priority: HashMap<LinkKey, weir_core::exchange::PriorityInlet>,
}

/// A channel of the current attempt that crosses to another worker.
pub(crate) struct RemoteLink {
    pub key: LinkKey,
    pub link: Link,
    /// This worker produces (true) or consumes (false).
    pub outgoing: bool,
    /// The other worker.
    pub peer: u32,
}

/// A worker's data listener and the state of its current attempt.
pub(crate) struct DataPlane {
    rt: tokio::runtime::Handle,
    port: u16,
    inbound: Arc<Mutex<Inbound>>,
    attempt: watch::Sender<u64>,
    /// The job's secret and TLS settings, used on every data connection both ways.
    credentials: super::worker::Credentials,
}

impl DataPlane {
    /// Binds the data listener on `bind` (`host:port`; port 0 picks one).
    pub(crate) fn start(
        rt: &tokio::runtime::Runtime,
        bind: &str,
        credentials: super::worker::Credentials,
    ) -> Result<DataPlane> {
        let listener = rt.block_on(TcpListener::bind(bind)).map_err(|e| {
            Error::Config(format!("a worker cannot listen for data on {bind}: {e}"))
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("the data listener", e))?
            .port();
        let inbound = Arc::new(Mutex::new(Inbound::default()));
        let (attempt, attempt_rx) = watch::channel(0u64);
        rt.spawn(accept(
            listener,
            inbound.clone(),
            attempt_rx,
            credentials.clone(),
        ));
        Ok(DataPlane {
            rt: rt.handle().clone(),
            port,
            inbound,
            attempt,
            credentials,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Carries attempt `attempt`'s crossing channels: registers the incoming ones, then
    /// connects to the workers this one sends to. Returns the bridge threads, which end
    /// with their channel or when `cancel` is set.
    pub(crate) fn wire_attempt(
        &self,
        attempt: u64,
        me: u32,
        addresses: &HashMap<u32, String>,
        links: Vec<RemoteLink>,
        cancel: &Arc<AtomicBool>,
        exchange: &weir_core::exchange::ExchangeConfig,
    ) -> Result<Vec<std::thread::JoinHandle<()>>> {
        let credits = credit::initial(exchange);
        let batch = exchange.batch_size;
        let mut threads = Vec::new();
        let mut outgoing: HashMap<u32, Vec<(LinkKey, Link)>> = HashMap::new();
        {
            let mut inbound = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
            inbound.attempt = attempt;
            inbound.queues.clear();
            inbound.priority.clear();
            for l in links {
                if l.outgoing {
                    outgoing.entry(l.peer).or_default().push((l.key, l.link));
                    continue;
                }
                let (tx, rx) = crossbeam_channel::unbounded();
                inbound.queues.insert(l.key, tx);
                inbound.priority.insert(l.key, l.link.priority.clone());
                let cancel = cancel.clone();
                let (key, mut writer) = (l.key, l.link.writer);
                threads.push(spawn("in", key, move || {
                    let grants = Grants::new(credits, batch);
                    deliver(key, &mut *writer, rx, grants, &cancel)
                })?);
            }
        }
        self.attempt.send_replace(attempt);
        for (peer, links) in outgoing {
            let address = addresses.get(&peer).ok_or_else(|| {
                Error::Config(format!("internal: no data address of worker {peer}"))
            })?;
            let (tx, table) = self.rt.block_on(connect(
                address,
                attempt,
                me,
                &links,
                credits,
                &self.credentials,
            ))?;
            for (key, link) in links {
                let credit = table[&key].clone();
                let (tx, cancel) = (tx.clone(), cancel.clone());
                let mut reader = link.reader;
                threads.push(spawn("out", key, move || {
                    send(key, &mut *reader, &credit, &tx, &cancel)
                })?);
            }
        }
        Ok(threads)
    }

    /// No attempt runs here any more: data connections of older attempts close.
    pub(crate) fn clear(&self, attempt: u64) {
        let mut inbound = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
        inbound.attempt = attempt;
        inbound.queues.clear();
        inbound.priority.clear();
        drop(inbound);
        self.attempt.send_replace(attempt);
    }
}

fn spawn(
    dir: &str,
    key: LinkKey,
    f: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!(
            "weir-{dir}-{}.{}-{}-{}",
            key.node, key.gate, key.producer, key.consumer
        ))
        .spawn(f)
        .map_err(|e| Error::io("spawning a channel bridge thread", e))
}

/// Producer side: reads the local channel and sends each message when a credit allows.
fn send(
    key: LinkKey,
    reader: &mut dyn weir_core::exchange::LinkReader,
    credit: &Credit,
    tx: &UnboundedSender<Vec<u8>>,
    cancel: &AtomicBool,
) {
    let mut buf = Vec::new();
    while !cancel.load(Ordering::Relaxed) {
        // The frame's body: the link, then the message appended as the exchange encodes it.
        wire::data_header(&key, &mut buf);
        match reader.next(Duration::from_millis(10), &mut buf) {
            Ok(LinkRead::Priority) => {
                if tx.send(std::mem::take(&mut buf)).is_err() {
                    return;
                }
            }
            Ok(LinkRead::Msg { end }) => {
                let mut gone = false;
                let waiting = credit.take(credit::cost(reader.last_records()), cancel, || {
                    let mut p = Vec::new();
                    wire::data_header(&key, &mut p);
                    if reader.next_priority(&mut p) {
                        gone |= tx.send(p).is_err();
                    }
                });
                if !waiting || gone {
                    return;
                }
                if tx.send(std::mem::take(&mut buf)).is_err() || end {
                    return;
                }
            }
            Ok(LinkRead::Timeout) => {}
            Ok(LinkRead::Disconnected) | Err(_) => return,
        }
    }
}

/// Consumer side: hands each received message to the local channel, and grants credit
/// for the room the channel's budget has (also as the consuming task frees room).
fn deliver(
    key: LinkKey,
    writer: &mut dyn weir_core::exchange::LinkWriter,
    rx: crossbeam_channel::Receiver<Delivery>,
    mut grants: Grants,
    cancel: &AtomicBool,
) {
    let budget = writer.budget();
    let mut reply: Option<UnboundedSender<Vec<u8>>> = None;
    loop {
        let mut waited = false;
        if let Some(to) = &reply {
            let n = match &budget {
                Some(b) => grants.grant(b.link_room(), b.policy().link_limit(b.limit())),
                // No budget to follow: give back what arrived.
                None => grants.grant(u64::MAX / 4, u64::MAX / 4),
            };
            if n > 0 {
                let _ = to.send(wire::encode(&Wire::Credit { link: key, n }));
            }
            // A sender without credit sends nothing until a grant: wait for the consuming
            // task to free room instead (it wakes us), then grant.
            if let Some(b) = &budget
                && let Some(needed) = grants.starved(b.policy().link_limit(b.limit()))
            {
                b.wait_for_link_room(needed, Duration::from_millis(10));
                if cancel.load(Ordering::Relaxed) || b.is_closed() {
                    return;
                }
                waited = true;
            }
        }
        let next = if waited {
            match rx.try_recv() {
                Ok(d) => Ok(d),
                Err(crossbeam_channel::TryRecvError::Empty) => continue,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected)
                }
            }
        } else {
            rx.recv_timeout(Duration::from_millis(10))
        };
        match next {
            Ok((body, to)) => match writer.write(&body[wire::DATA_HEADER..]) {
                Ok(end) => {
                    grants.received(writer.last_records());
                    reply = Some(to);
                    if end {
                        return;
                    }
                }
                Err(e) => {
                    if !cancel.load(Ordering::Relaxed) {
                        tracing::warn!(error = %e, "delivering a message from another worker failed");
                    }
                    return;
                }
            },
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if cancel.load(Ordering::Relaxed) {
                    return;
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Opens the data connection to a peer for an attempt; returns its sending queue and the
/// credits of the links it carries.
async fn connect(
    address: &str,
    attempt: u64,
    me: u32,
    links: &[(LinkKey, Link)],
    credits: u32,
    credentials: &super::worker::Credentials,
) -> Result<(UnboundedSender<Vec<u8>>, HashMap<LinkKey, Arc<Credit>>)> {
    let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address))
        .await
        .map_err(|_| Error::Remote {
            message: format!("connecting to the worker at {address} timed out"),
            deterministic: false,
            secondary: false,
        })?
        .map_err(|e| Error::Remote {
            message: format!("cannot connect to the worker at {address}: {e}"),
            deterministic: false,
            secondary: false,
        })?;
    let peer = format!("the worker at {address}");
    let remote = |e: Error| Error::Remote {
        message: e.to_string(),
        deterministic: false,
        secondary: false,
    };
    let (mut r, mut w) = super::transport::client(stream, credentials.tls.as_ref(), &peer)
        .await
        .map_err(remote)?;
    tokio::time::timeout(
        Duration::from_secs(10),
        super::auth::client(&mut r, &mut w, credentials.secret.as_ref(), &peer),
    )
    .await
    .map_err(|_| Error::Remote {
        message: format!("{peer} did not complete the authentication within 10 s"),
        deterministic: false,
        secondary: false,
    })?
    .map_err(|e| Error::Remote {
        message: e.to_string(),
        deterministic: false,
        secondary: false,
    })?;
    wire::write_frame(
        &mut w,
        &wire::encode(&Wire::DataHello { attempt, from: me }),
    )
    .await
    .map_err(|e| Error::io(address, e))?;
    let table: HashMap<LinkKey, Arc<Credit>> = links
        .iter()
        .map(|(k, _)| (*k, Arc::new(Credit::new(credits))))
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let _ = wire::pump(w, &mut rx).await;
    });
    let credit_table = table.clone();
    tokio::spawn(async move {
        while let Ok(Some(body)) = wire::read_frame(&mut r).await {
            if let Ok(Body::Wire(Wire::Credit { link, n })) = wire::decode(&body)
                && let Some(c) = credit_table.get(&link)
            {
                c.add(n);
            }
        }
    });
    Ok((tx, table))
}

async fn accept(
    listener: TcpListener,
    inbound: Arc<Mutex<Inbound>>,
    attempt: watch::Receiver<u64>,
    credentials: super::worker::Credentials,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(serve(
                    stream,
                    peer,
                    inbound.clone(),
                    attempt.clone(),
                    credentials.clone(),
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a data connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One incoming data connection, for one attempt.
async fn serve(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    inbound: Arc<Mutex<Inbound>>,
    mut current: watch::Receiver<u64>,
    credentials: super::worker::Credentials,
) {
    let (mut r, mut w) =
        match super::transport::server(stream, credentials.tls.as_ref(), "data").await {
            Ok(halves) => halves,
            Err(Some(reason)) => {
                tracing::warn!(%peer, %reason, "refused a data connection from {peer}: {reason}");
                return;
            }
            Err(None) => return,
        };
    let first_frame = async |r: &mut super::transport::Reader| match tokio::time::timeout(
        Duration::from_secs(10),
        wire::read_frame(r),
    )
    .await
    {
        Ok(Ok(Some(f))) => Some(f),
        _ => None,
    };
    let Some(first) = first_frame(&mut r).await else {
        return;
    };
    let hello =
        match super::auth::server(&mut r, &mut w, credentials.secret.as_ref(), first, "data").await
        {
            Ok(super::auth::Admitted::Open(first)) => first,
            Ok(super::auth::Admitted::Authenticated) => match first_frame(&mut r).await {
                Some(f) => f,
                None => return,
            },
            Err(reason) => {
                tracing::warn!(%peer, %reason, "refused a data connection from {peer}: {reason}");
                return;
            }
        };
    let Ok(Body::Wire(Wire::DataHello { attempt, from })) = wire::decode(&hello) else {
        return;
    };
    // The sender may be ahead of us: wait (a while) until this worker runs that attempt.
    let _ =
        tokio::time::timeout(Duration::from_secs(30), current.wait_for(|a| *a >= attempt)).await;
    if *current.borrow() != attempt {
        tracing::debug!(
            attempt,
            from,
            "refused a data connection of another attempt"
        );
        return;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let _ = wire::pump(w, &mut rx).await;
    });
    loop {
        tokio::select! {
            frame = wire::read_frame(&mut r) => {
                let Ok(Some(body)) = frame else { break };
                let Some(link) = wire::data_link(&body) else { break };
                if weir_core::exchange::is_priority(&body[wire::DATA_HEADER..]) {
                    // An unaligned barrier overtakes the data queued for delivery.
                    let inlet = {
                        let inbound = inbound.lock().unwrap_or_else(|p| p.into_inner());
                        (inbound.attempt == attempt).then(|| inbound.priority.get(&link).cloned()).flatten()
                    };
                    let Some(inlet) = inlet else { break };
                    let _ = inlet.deliver(&body[wire::DATA_HEADER..]);
                    continue;
                }
                let queue = {
                    let inbound = inbound.lock().unwrap_or_else(|p| p.into_inner());
                    (inbound.attempt == attempt).then(|| inbound.queues.get(&link).cloned()).flatten()
                };
                let Some(queue) = queue else { break };
                if queue.send((body, tx.clone())).is_err() {
                    break;
                }
            }
            changed = current.changed() => {
                if changed.is_err() || *current.borrow() != attempt {
                    break;
                }
            }
        }
    }
    writer.abort();
}

#[cfg(test)]
#[path = "data_tests.rs"]
mod tests;
