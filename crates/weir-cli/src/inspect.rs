//! `weir checkpoints inspect PATH`: verify one checkpoint or savepoint and show its manifest.
//!
//! Verification (every file's size and CRC-32) is `CheckpointStorage::load`'s; this module
//! only formats the verified manifest as text or JSON. Never writes checkpoint data.

use crate::{storage, time};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use weir_checkpoint::{Manifest, OperatorManifest, SubtaskManifest};

/// Operator state whose compact JSON is longer than this is pretty-printed on its own lines.
const INLINE_STATE_MAX: usize = 80;

/// Loads and verifies the checkpoint at `path` (a `chk-`/`sp-` directory or its `_metadata`
/// file) and prints its manifest as text, or as pretty JSON when `json` is set.
pub fn run(path: &Path, json: bool, out: &mut dyn Write) -> Result<()> {
    let manifest = load(path)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &manifest)
            .context("cannot write the manifest as JSON")?;
        writeln!(out)?;
        return Ok(());
    }
    // Show the checkpoint's directory, also when given its `_metadata` file.
    let dir = match path.parent() {
        Some(parent) if path.is_file() && parent.as_os_str().is_empty() => Path::new("."),
        Some(parent) if path.is_file() => parent,
        _ => path,
    };
    let remote = path.to_str().is_some_and(weir_objstore::is_url);
    let shown = if remote {
        // An object-storage URL is shown as given (it is no path to resolve).
        path.to_str()
            .map(|p| p.trim_end_matches('/').trim_end_matches("/_metadata"))
            .map_or_else(|| path.to_path_buf(), std::path::PathBuf::from)
    } else {
        std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
    };
    // On object storage a load checks every file's size; checksums are checked on restore.
    let checked = if remote {
        "all present with their sizes"
    } else {
        "all verified"
    };
    write_text(&manifest, &shown, checked, out)
}

/// Reads `_metadata` and verifies every file it references.
fn load(path: &Path) -> Result<Manifest> {
    // Not a storage opened next to `path`: inspecting a savepoint copied to a backup folder
    // must create nothing there.
    let (_scratch, storage) = storage::scratch()?;
    storage
        .load(path)
        .with_context(|| format!("cannot inspect {}", path.display()))
}

fn write_text(m: &Manifest, path: &Path, checked: &str, out: &mut dyn Write) -> Result<()> {
    let files: Vec<_> = m.files().collect();
    let total: u64 = files.iter().map(|f| f.size).sum();
    let shared = files.iter().filter(|f| f.shared).count();
    writeln!(out, "job:             {}", m.job)?;
    writeln!(out, "id:              {}", m.checkpoint_id)?;
    writeln!(out, "kind:            {}", m.kind)?;
    writeln!(out, "path:            {}", path.display())?;
    writeln!(
        out,
        "created:         {} (unix ms {})",
        time::format_unix_ms_precise(m.created_unix_ms),
        m.created_unix_ms
    )?;
    writeln!(out, "format version:  {}", m.format_version)?;
    writeln!(out, "max parallelism: {}", m.max_parallelism)?;
    writeln!(
        out,
        "stats:           duration {} ms, {} bytes written ({} bytes in all), max alignment {} ms",
        m.stats.duration_ms, m.stats.bytes, m.stats.full_bytes, m.stats.alignment_ms
    )?;
    if m.stats.unaligned {
        writeln!(
            out,
            "unaligned:       {} bytes of in-flight records (channel state)",
            m.stats.channel_state_bytes
        )?;
    }
    writeln!(
        out,
        "files:           {} ({} bytes, {} in shared/), {checked}",
        files.len(),
        total,
        shared
    )?;
    writeln!(out, "operators:       {}", m.operators.len())?;
    for op in &m.operators {
        writeln!(out)?;
        write_operator(op, out)?;
    }
    Ok(())
}

fn write_operator(op: &OperatorManifest, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "operator {} ({})", op.uid, op.name)?;
    writeln!(out, "  parallelism: {}", op.parallelism)?;
    if op.subtasks.is_empty() {
        writeln!(out, "  no state")?;
    }
    for st in &op.subtasks {
        write_subtask(st, out)?;
    }
    Ok(())
}

fn write_subtask(st: &SubtaskManifest, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "  subtask {}", st.subtask)?;
    // The event time this subtask had reached; a resumed job starts from the minimum.
    match st.watermark {
        Some(i64::MAX) => writeln!(out, "    watermark: end of input")?,
        Some(w) => writeln!(out, "    watermark: {w}")?,
        None => {}
    }
    let name_w = st.files.iter().map(|f| f.name.len()).max().unwrap_or(0);
    let size_w = st
        .files
        .iter()
        .map(|f| f.size.to_string().len())
        .max()
        .unwrap_or(0);
    for f in &st.files {
        let shared = if f.shared { "  shared" } else { "" };
        writeln!(
            out,
            "    file {:<name_w$}  {:>size_w$} bytes  crc32 {:#010x}{shared}",
            f.name, f.size, f.crc32
        )?;
    }
    match &st.operator_state {
        None if st.files.is_empty() => writeln!(out, "    no files, no operator state")?,
        None => {}
        Some(state) => {
            let compact = state.to_string();
            if compact.len() <= INLINE_STATE_MAX {
                writeln!(out, "    operator state: {compact}")?;
            } else {
                writeln!(out, "    operator state:")?;
                let pretty = serde_json::to_string_pretty(state)?;
                for line in pretty.lines() {
                    writeln!(out, "      {line}")?;
                }
            }
        }
    }
    Ok(())
}
