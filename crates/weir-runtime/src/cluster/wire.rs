//! The cluster's wire protocol: length-prefixed frames over TCP and the messages they
//! carry between the coordinator, the workers, and operators' command-line tools.
//!
//! A frame is a 4-byte big-endian length, then the body. The body's first byte says how
//! it is encoded: `B` for [`Wire`] in weir's binary codec (processes of one job), `D` for
//! a channel message between workers (the channel's [`LinkKey`] as four little-endian
//! `u32`s, then the message as the exchange encoded it, carried as is), and `J` for JSON
//! (what `weir cluster` tools of earlier versions sent; the coordinator answers it with a
//! pointer to its REST API, which is where administration happens now).

use crate::task::{LinkKey, TaskCommand};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weir_core::checkpoint::OperatorSnapshot;

/// Version of the protocol; a worker of another version is refused. 4: channel messages
/// may carry latency markers (a tag an older worker would reject as malformed), and a
/// worker's figures carry its Kafka sources' partitions. 5: an acknowledgement may carry
/// references to the files its worker stored itself (checkpoints on object storage)
/// instead of their contents. 6: a data link's credit counts records (under the receiving
/// channel's in-flight budget), not messages; unaligned barriers cross a link ahead of its
/// data (a priority frame); workers exchange their aligned sources' watermarks with the
/// coordinator in the heartbeat. 7: a task's failure says whether the checkpoint's state
/// cannot be restored (the coordinator then falls back to an older checkpoint).
pub(crate) const PROTOCOL: u32 = 7;

/// Largest frame accepted (a checkpoint acknowledgement carries the state files).
pub(crate) const MAX_FRAME: usize = 1 << 30;

const BINARY: u8 = b'B';
const JSON: u8 = b'J';
const DATA: u8 = b'D';

/// Bytes before the message in a data frame's body: the tag and the link.
pub(crate) const DATA_HEADER: usize = 17;

/// Starts a data frame's body for `link`; the channel message is appended to it.
pub(crate) fn data_header(link: &LinkKey, buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(DATA);
    for v in [link.node, link.gate, link.producer, link.consumer] {
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

/// The link of a data frame's body, if it is one; its message is `body[DATA_HEADER..]`.
pub(crate) fn data_link(body: &[u8]) -> Option<LinkKey> {
    if body.len() < DATA_HEADER || body[0] != DATA {
        return None;
    }
    let word =
        |i: usize| u32::from_le_bytes(body[1 + 4 * i..5 + 4 * i].try_into().expect("four bytes"));
    Some(LinkKey {
        node: word(0),
        gate: word(1),
        producer: word(2),
        consumer: word(3),
    })
}

/// Everything processes of one job say to each other.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Wire {
    // Worker → coordinator.
    /// First message of a worker: which protocol it speaks.
    Hello { protocol: u32 },
    /// The worker built the job's graph from the job arguments and offers its slots.
    Register {
        fingerprint: u64,
        slots: u32,
        data_port: u16,
    },
    /// Heartbeat; `nonce` is echoed in [`Wire::Pong`].
    Ping { nonce: u64 },
    /// A task of attempt `attempt` reports.
    Event {
        attempt: u64,
        head: u32,
        subtask: u32,
        event: WireEvent,
    },
    /// Every task of attempt `attempt` on this worker is built (restored and opened).
    Built { attempt: u64 },
    /// With every heartbeat: the figures of this worker's tasks of `attempt`, for the
    /// coordinator's REST API.
    Figures {
        attempt: u64,
        tasks: Vec<crate::status::TaskFigures>,
    },

    // Coordinator → worker.
    /// Answer to Hello: the job to build and the heartbeat settings.
    Welcome {
        job: String,
        args: Vec<String>,
        heartbeat_ms: u64,
        timeout_ms: u64,
    },
    /// Answer to Register.
    Accepted { worker: u32 },
    /// The worker cannot join; the reason is for its user.
    Refused { reason: String },
    /// Answer to Ping.
    Pong { nonce: u64 },
    /// Run your share of attempt `attempt`.
    Deploy(Deploy),
    /// Every worker built its tasks of `attempt`: let the sources run.
    Start { attempt: u64 },
    /// A checkpoint command for one task.
    Command {
        attempt: u64,
        head: u32,
        subtask: u32,
        command: TaskCommand,
    },
    /// Stop the tasks of `attempt`.
    Cancel { attempt: u64 },
    /// Staging the files of this task's last acknowledgement failed: send every file of
    /// its next one, also those of the latest completed checkpoint.
    Resend {
        attempt: u64,
        head: u32,
        subtask: u32,
    },
    /// The job is over (failed when `error` is set): exit.
    JobEnded { error: Option<String> },

    // Worker → worker.
    /// First message on a data connection.
    DataHello { attempt: u64, from: u32 },
    /// The receiver has room for `n` more records on `link` (a message without records
    /// costs one).
    Credit { link: LinkKey, n: u32 },

    // Both ways.
    /// Watermark alignment: a worker's source subtasks' reports (with every heartbeat), and
    /// the coordinator's answer with every member's it knows.
    Alignment {
        members: Vec<crate::alignment::MemberReport>,
    },
}

/// One attempt's placement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deploy {
    pub attempt: u64,
    /// The checkpoint to restore from (a path in the shared checkpoint storage).
    pub restore: Option<PathBuf>,
    /// (head node, subtask, worker) of every task.
    pub tasks: Vec<(u32, u32, u32)>,
    /// Data address of every worker that runs tasks.
    pub workers: Vec<(u32, String)>,
    /// Operators count their records in and out (the coordinator serves the REST API).
    pub count_records: bool,
}

/// A task's report, as sent over the network.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireEvent {
    Ack {
        id: u64,
        snapshot: BTreeMap<String, OperatorSnapshot>,
        /// Contents of the snapshot's local files, by name (the shared files of the task's
        /// acknowledgement of the latest completed checkpoint are left out).
        files: Vec<(String, Vec<u8>)>,
        /// The worker could not produce the files (why); the checkpoint must fail.
        failed: Option<String>,
        /// Checkpoints on object storage: what the worker stored itself, by operator id
        /// (the snapshot then holds only its description and watermark, and `files` is
        /// empty); the coordinator lists these in the manifest.
        stored: Vec<(String, weir_core::checkpoint::StoredSnapshot)>,
        alignment_us: u64,
        sync_us: u64,
    },
    SourceFinished,
    Done {
        records: u64,
        error: Option<WireError>,
    },
}

/// A task's failure, as sent over the network.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireError {
    pub message: String,
    pub deterministic: bool,
    pub secondary: bool,
    /// The checkpoint's state cannot be restored ([`weir_core::Error::is_unrestorable`]).
    pub unrestorable: bool,
}

impl WireError {
    pub(crate) fn from_error(e: &weir_core::Error) -> Self {
        WireError {
            message: e.to_string(),
            deterministic: e.is_deterministic(),
            secondary: e.is_secondary(),
            unrestorable: e.is_unrestorable(),
        }
    }

    pub(crate) fn into_error(self) -> weir_core::Error {
        if self.unrestorable {
            // The message already names the operator and subtask that failed.
            return weir_core::Error::Unrestorable(self.message);
        }
        weir_core::Error::Remote {
            message: self.message,
            deterministic: self.deterministic,
            secondary: self.secondary,
        }
    }
}

/// A decoded frame body.
pub(crate) enum Body {
    Wire(Wire),
    /// A JSON request: an administration tool of an earlier weir version.
    Json,
}

/// Encodes a message as a frame body.
pub(crate) fn encode(msg: &Wire) -> Vec<u8> {
    let mut body = vec![BINARY];
    weir_core::codec::encode_into(msg, &mut body).expect("wire messages always encode");
    body
}

/// Encodes a JSON value as a frame body.
pub(crate) fn encode_json(value: &serde_json::Value) -> Vec<u8> {
    let mut body = vec![JSON];
    body.extend_from_slice(value.to_string().as_bytes());
    body
}

/// Decodes a frame body.
pub(crate) fn decode(body: &[u8]) -> io::Result<Body> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
    match body.split_first() {
        Some((&BINARY, rest)) => weir_core::codec::decode(rest)
            .map(Body::Wire)
            .map_err(|e| bad(format!("undecodable message: {e}"))),
        Some((&JSON, rest)) => serde_json::from_slice(rest)
            .map(|_: serde_json::Value| Body::Json)
            .map_err(|e| bad(format!("not a JSON request: {e}"))),
        _ => Err(bad(
            "not a weir cluster frame (is something else talking to this port?)".into(),
        )),
    }
}

/// Reads one frame; `None` at a clean end of the stream.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is larger than the limit of {MAX_FRAME}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Writes every frame that `frames` yields to `w` until it closes, batching the frames
/// that are already queued into one write (one system call for many small frames).
pub(crate) async fn pump<W: AsyncWrite + Unpin>(
    w: W,
    frames: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()> {
    let mut w = tokio::io::BufWriter::with_capacity(256 << 10, w);
    while let Some(frame) = frames.recv().await {
        write_frame(&mut w, &frame).await?;
        while let Ok(frame) = frames.try_recv() {
            write_frame(&mut w, &frame).await?;
        }
        w.flush().await?;
    }
    w.shutdown().await
}

/// Writes one frame.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> io::Result<()> {
    w.write_all(&(body.len() as u32).to_be_bytes()).await?;
    w.write_all(body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_its_kind_across_the_network() {
        use weir_core::error::{Error, Location};
        let at = Location {
            operator: "sum".into(),
            subtask: 1,
            parallelism: 2,
        };
        let unrestorable = Error::Unrestorable("RocksDB open: Corruption".into()).at(|| at.clone());
        let config = Error::Config("no such topic".into()).at(|| at.clone());
        for (e, unrestorable, deterministic) in [(unrestorable, true, false), (config, false, true)]
        {
            let body = encode(&Wire::Event {
                attempt: 1,
                head: 2,
                subtask: 1,
                event: WireEvent::Done {
                    records: 0,
                    error: Some(WireError::from_error(&e)),
                },
            });
            let Ok(Body::Wire(Wire::Event {
                event: WireEvent::Done {
                    error: Some(got), ..
                },
                ..
            })) = decode(&body)
            else {
                panic!("not a task's end");
            };
            let got = got.into_error();
            assert_eq!(got.to_string(), e.to_string());
            assert_eq!(got.is_unrestorable(), unrestorable, "{got}");
            assert_eq!(got.is_deterministic(), deterministic, "{got}");
        }
    }

    #[tokio::test]
    async fn frames_round_trip_and_oversized_frames_are_refused() {
        let mut buf = Vec::new();
        let msg = Wire::Credit {
            link: LinkKey {
                node: 1,
                gate: 0,
                producer: 2,
                consumer: 3,
            },
            n: 7,
        };
        write_frame(&mut buf, &encode(&msg)).await.unwrap();
        write_frame(
            &mut buf,
            &encode_json(&serde_json::json!({"request": "status"})),
        )
        .await
        .unwrap();
        let mut r = &buf[..];
        match decode(&read_frame(&mut r).await.unwrap().unwrap()).unwrap() {
            Body::Wire(Wire::Credit { link, n }) => {
                assert_eq!((link.node, link.producer, link.consumer, n), (1, 2, 3, 7))
            }
            _ => panic!("wrong message"),
        }
        assert!(matches!(
            decode(&read_frame(&mut r).await.unwrap().unwrap()).unwrap(),
            Body::Json
        ));
        assert!(read_frame(&mut r).await.unwrap().is_none());

        let link = LinkKey {
            node: 4,
            gate: 1,
            producer: 0,
            consumer: 70_000,
        };
        let mut body = Vec::new();
        data_header(&link, &mut body);
        body.extend_from_slice(b"message");
        assert_eq!(data_link(&body), Some(link));
        assert_eq!(&body[DATA_HEADER..], b"message");
        assert_eq!(data_link(&encode(&Wire::Ping { nonce: 1 })), None);

        let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
        let e = read_frame(&mut &huge[..]).await.unwrap_err();
        assert!(e.to_string().contains("larger than the limit"), "{e}");
        let e = decode(b"GET / HTTP/1.1").err().unwrap();
        assert!(e.to_string().contains("not a weir cluster frame"), "{e}");
    }
}
