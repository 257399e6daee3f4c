//! The runtime that runs `object_store`'s futures for blocking callers.

use std::future::Future;
use std::sync::OnceLock;

/// One small multi-threaded runtime per process, started on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_name("weir-objstore")
            .enable_all()
            .build()
            .expect("cannot start the object storage runtime")
    })
}

/// A future running on the runtime.
pub(crate) struct Task<T> {
    done: std::sync::mpsc::Receiver<T>,
    handle: tokio::task::AbortHandle,
}

impl<T> Task<T> {
    /// Waits for the future's output.
    ///
    /// # Panics
    /// When the future panicked or was aborted.
    pub(crate) fn wait(self) -> T {
        self.done
            .recv()
            .expect("an object storage request panicked or was aborted")
    }

    /// Stops the future (dropping it: an unfinished multipart upload is aborted).
    pub(crate) fn abort(self) {
        self.handle.abort();
    }
}

/// Runs `f` on the runtime; the caller waits with [`Task::wait`]. Works from any thread,
/// also one of another tokio runtime (the caller's thread only waits on a channel).
pub(crate) fn spawn<F>(f: F) -> Task<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    Task {
        done: rx,
        handle: handle.abort_handle(),
    }
}

/// Runs `f` on the runtime and waits for its output.
pub(crate) fn block_on<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    spawn(f).wait()
}
