//! `weir checkpoints list DIR`: one line per checkpoint and savepoint directory.
//!
//! Reads directory listings and `_metadata` manifests without verifying state files (that is
//! `inspect`'s job), so listing a large directory stays cheap. Never writes checkpoint data.

use crate::{storage, time};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use weir_checkpoint::{CheckpointInfo, Manifest};

/// The manifest's file name in a checkpoint directory.
const METADATA: &str = "_metadata";

/// One line of the listing.
struct Row {
    id: String,
    kind: String,
    status: &'static str,
    size: String,
    created: String,
    path: String,
}

/// Lists the checkpoints and savepoints in `dir`, sorted by id, as an aligned table with a
/// header; prints `no checkpoints in DIR` when there are none.
pub fn run(dir: &Path, out: &mut dyn Write) -> Result<()> {
    let opened = storage::open_existing(dir)?;
    let infos = opened
        .storage
        .list()
        .with_context(|| format!("cannot list checkpoint directory {}", dir.display()))?;
    if infos.is_empty() {
        writeln!(out, "no checkpoints in {}", dir.display())?;
        return Ok(());
    }
    let rows: Vec<Row> = infos.iter().map(row).collect();
    write_table(&rows, out)
}

fn row(info: &CheckpointInfo) -> Row {
    let path = info.path.display().to_string();
    let manifest = if info.complete {
        match read_manifest(&info.path) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("warning: {e:#}");
                None
            }
        }
    } else {
        None
    };
    match manifest {
        Some(m) => Row {
            id: info.id.to_string(),
            kind: m.kind.to_string(),
            status: "complete",
            size: m.files().map(|f| f.size).sum::<u64>().to_string(),
            created: time::format_unix_ms(m.created_unix_ms),
            path,
        },
        None => Row {
            id: info.id.to_string(),
            kind: info.kind.to_string(),
            status: if info.complete {
                "unreadable"
            } else {
                "incomplete"
            },
            // Without a manifest, the size is what lies in the directory.
            size: dir_size(&info.path).map_or_else(|| "?".to_string(), |s| s.to_string()),
            created: "-".to_string(),
            path,
        },
    }
}

/// Reads `_metadata`, checking its own checksum, without verifying the files it references.
fn read_manifest(dir: &Path) -> Result<Manifest> {
    Manifest::read(&dir.join(METADATA)).map_err(|e| {
        anyhow::anyhow!(
            "{e} (run `weir checkpoints inspect {}` for details)",
            dir.display()
        )
    })
}

/// The total size of the regular files directly in `dir`, if it can be read.
fn dir_size(dir: &Path) -> Option<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).ok()? {
        let meta = entry.ok()?.metadata().ok()?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Some(total)
}

fn write_table(rows: &[Row], out: &mut dyn Write) -> Result<()> {
    let header = Row {
        id: "ID".into(),
        kind: "KIND".into(),
        status: "STATUS",
        size: "SIZE".into(),
        created: "CREATED".into(),
        path: "PATH".into(),
    };
    let all = || std::iter::once(&header).chain(rows);
    let width = |f: fn(&Row) -> usize| all().map(f).max().unwrap_or(0);
    let id_w = width(|r| r.id.len());
    let kind_w = width(|r| r.kind.len());
    let status_w = width(|r| r.status.len());
    let size_w = width(|r| r.size.len());
    let created_w = width(|r| r.created.len());
    for r in all() {
        writeln!(
            out,
            "{:>id_w$}  {:<kind_w$}  {:<status_w$}  {:>size_w$}  {:<created_w$}  {}",
            r.id, r.kind, r.status, r.size, r.created, r.path
        )?;
    }
    Ok(())
}
