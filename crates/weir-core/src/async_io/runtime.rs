//! The one tokio runtime of a process on which async I/O requests run.
//!
//! Owns the process-wide runtime handle: started on first use (a small multi-threaded
//! runtime, threads named `weir-async-io`), or the application's own runtime when it
//! calls [`install`] first. Every `map_async` subtask of every job in the process spawns
//! its requests here; none owns a runtime of its own. See
//! docs/decisions/0033-async-io-runtime-and-checkpoints.md.

use std::sync::OnceLock;
use tokio::runtime::{Handle, Runtime};

static HANDLE: OnceLock<Handle> = OnceLock::new();
static OWNED: OnceLock<Runtime> = OnceLock::new();

/// Worker threads of the runtime weir starts itself: the machine's cores, at most 4
/// (the requests wait on I/O; the threads only poll them).
fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 4)
}

/// The handle of the process's async I/O runtime, starting it on first use.
///
/// # Panics
/// When the operating system refuses to start the runtime's threads.
pub fn handle() -> Handle {
    HANDLE
        .get_or_init(|| {
            let rt = OWNED.get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads())
                    .thread_name("weir-async-io")
                    .enable_all()
                    .build()
                    .expect("cannot start the async I/O runtime's threads")
            });
            rt.handle().clone()
        })
        .clone()
}

/// Runs async I/O requests on `handle` (an application's own tokio runtime) instead of a
/// runtime weir starts. Call it before the first job with `map_async` starts; the
/// runtime must stay alive as long as jobs run.
///
/// # Errors
/// Gives `handle` back when the process already chose its runtime (a job already ran
/// requests, or `install` was called before).
///
/// ```
/// let app = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
/// // The first choice stands: a second install is refused.
/// let first = weir_core::async_io::install(app.handle().clone());
/// assert!(weir_core::async_io::install(app.handle().clone()).is_err());
/// # let _ = first;
/// # std::mem::forget(app);
/// ```
pub fn install(handle: Handle) -> Result<(), Handle> {
    let mut given = Some(handle);
    HANDLE.get_or_init(|| given.take().expect("taken once"));
    match given {
        None => Ok(()),
        Some(h) => Err(h),
    }
}
