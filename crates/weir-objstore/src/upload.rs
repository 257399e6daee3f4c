//! Writing objects from files (streamed multipart uploads) and multipart uploads that
//! outlive a process (the exactly-once sinks keep their ids in checkpoints).

use crate::{Error, PART_SIZE, PARTS_IN_FLIGHT, Result, Store, runtime, stats};
use bytes::Bytes;
use object_store::multipart::PartId;
use object_store::{PutPayload, WriteMultipart};
use std::io::Read;
use std::path::Path;
use std::time::Instant;

impl Store {
    /// Uploads the local file `path` as object `name`, reading it once, streamed: one PUT up to
    /// [`PART_SIZE`], a multipart upload with parts in parallel beyond. Returns its size and
    /// CRC-32 as read. Readers see the whole object or none of it.
    pub fn put_file(&self, name: &str, path: &Path) -> Result<(u64, u32)> {
        let io = |e: std::io::Error| Error::Io {
            op: "read",
            path: path.display().to_string(),
            source: e,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let started = Instant::now();
        if len <= PART_SIZE as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(io)?;
            let crc = crc32fast::hash(&bytes);
            let n = bytes.len() as u64;
            self.put(name, bytes)?;
            return Ok((n, crc));
        }
        let store = self.inner.store.clone();
        let key = self.key(name);
        let (chunks_tx, mut chunks_rx) = tokio::sync::mpsc::channel::<Bytes>(PARTS_IN_FLIGHT);
        // The upload runs on the runtime; this thread reads the file and hands it over in
        // parts, so at most a few parts are in memory at once.
        let upload = runtime::spawn(async move {
            let upload = store.put_multipart(&key).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            while let Some(chunk) = chunks_rx.recv().await {
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(chunk);
            }
            writer.finish().await.map(|_| ())
        });
        let mut crc = crc32fast::Hasher::new();
        let mut size = 0u64;
        let mut read_error = None;
        loop {
            let mut buf = vec![0u8; PART_SIZE];
            let n = match read_full(&mut file, &mut buf) {
                Ok(n) => n,
                Err(e) => {
                    read_error = Some(e);
                    break;
                }
            };
            if n == 0 {
                break;
            }
            buf.truncate(n);
            crc.update(&buf);
            size += n as u64;
            if chunks_tx.blocking_send(Bytes::from(buf)).is_err() {
                break; // the upload failed: its error is reported below
            }
        }
        if let Some(e) = read_error {
            // Dropping the upload future aborts the multipart upload.
            upload.abort();
            return Err(io(e));
        }
        drop(chunks_tx);
        upload.wait().map_err(|e| self.failed("upload", name, e))?;
        stats::wrote(size, started.elapsed());
        Ok((size, crc.finalize()))
    }

    /// Starts a multipart upload of object `name`; returns its upload id, which
    /// [`put_part`](Self::put_part), [`complete_upload`](Self::complete_upload) and
    /// [`abort_upload`](Self::abort_upload) take, also from another process. Nothing is
    /// visible under `name` until the upload is completed.
    pub fn create_upload(&self, name: &str) -> Result<String> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        runtime::block_on(async move { mp.create_multipart(&key).await })
            .map_err(|e| self.failed("start an upload of", name, e))
    }

    /// Uploads part `index` (from 0; every part but the last at least 5 MiB on S3) of upload
    /// `upload` of object `name`; returns the part's id for
    /// [`complete_upload`](Self::complete_upload).
    pub fn put_part(
        &self,
        name: &str,
        upload: &str,
        index: usize,
        bytes: Vec<u8>,
    ) -> Result<String> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        let n = bytes.len() as u64;
        let started = Instant::now();
        let part = runtime::block_on(async move {
            mp.put_part(&key, &id, index, PutPayload::from(bytes)).await
        })
        .map_err(|e| self.failed("upload a part of", name, e))?;
        stats::wrote(n, started.elapsed());
        Ok(part.content_id)
    }

    /// Completes upload `upload` of object `name` from its parts' ids, in order: the object
    /// appears whole.
    pub fn complete_upload(&self, name: &str, upload: &str, parts: Vec<String>) -> Result<()> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        let parts = parts
            .into_iter()
            .map(|content_id| PartId { content_id })
            .collect();
        runtime::block_on(async move { mp.complete_multipart(&key, &id, parts).await.map(|_| ()) })
            .map_err(|e| self.failed("complete the upload of", name, e))
    }

    /// Aborts upload `upload` of object `name`, deleting its parts; an upload the server no
    /// longer knows is no error.
    pub fn abort_upload(&self, name: &str, upload: &str) -> Result<()> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        runtime::block_on(async move {
            match mp.abort_multipart(&key, &id).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) if unknown_upload(&e) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("abort the upload of", name, e))
    }
}

/// True when `e` says the upload is unknown in a store that does not report it as
/// `NotFound` (the in-memory store), so that aborting a finished upload is no error there
/// either, as on S3.
pub(crate) fn unknown_upload(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { store: "InMemory", source }
        if source.to_string().starts_with("MultipartUpload not found"))
}

/// Reads until `buf` is full or the file ends; returns how much was read.
pub(crate) fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
