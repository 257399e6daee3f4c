//! `map_async`, `try_map_async` and `process_async` on [`Stream`] and [`KeyedStream`]:
//! a request to an external service per record, many in flight at once (see
//! [`crate::async_io`] for the semantics).

use super::{KeyedStream, Stream};
use crate::async_io::{
    AsyncFunction, AsyncOp, AsyncOptions, Erased, Fallible, Infallible, KeyHash, Route,
};
use crate::data::{Data, Key};
use crate::exchange::{Partitioning, hash_partitioner};
use std::future::Future;
use std::sync::Arc;

impl<T: Data> Stream<T> {
    /// Calls an async function for every record, with up to `opts.capacity` calls in
    /// flight per subtask, and emits each call's result (in input order unless
    /// [`AsyncOptions::unordered`]). The function gets the record and returns a future,
    /// which runs on the process's async runtime: an `async move` block or an `async fn`.
    ///
    /// A call that takes longer than `opts.timeout` fails the job (use
    /// [`Stream::process_async`] with [`AsyncFunction::on_timeout`] to emit a fallback
    /// instead). Records in flight at a checkpoint are stored in it and their calls are
    /// made again on restore, so every result is emitted exactly once. Metrics:
    /// `async_requests_in_flight` and `async_timeouts_total`, labelled with the operator's
    /// name and subtask.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::async_io::AsyncOptions;
    /// use weir_core::prelude::*;
    ///
    /// async fn lookup(user: u64) -> (u64, String) {
    ///     tokio::time::sleep(Duration::from_millis(5)).await; // an HTTP call, say
    ///     (user, format!("user-{user}"))
    /// }
    ///
    /// let p = Pipeline::new();
    /// let names = p
    ///     .from_collection(vec![1u64, 2, 3])
    ///     .map_async(AsyncOptions::new(100, Duration::from_secs(1)), lookup)
    ///     .collect();
    /// # let _ = names;
    /// ```
    pub fn map_async<O, F, Fut>(&self, opts: AsyncOptions, f: F) -> Stream<O>
    where
        O: Data,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = O> + Send + 'static,
    {
        self.async_node("map_async", opts, Erased::new(Infallible(f)), None)
    }

    /// Like [`Stream::map_async`], for calls that may fail: the future returns a
    /// `Result`. A failed call is retried under [`AsyncOptions::retry`] (backoff with
    /// jitter, attempt limit, retry budget); one that is given up — or any failure without
    /// retries — fails the job with the call's error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::async_io::AsyncOptions;
    /// use weir_core::prelude::*;
    /// use weir_core::retry::RetryPolicy;
    ///
    /// let p = Pipeline::new();
    /// let opts = AsyncOptions::new(100, Duration::from_secs(1)).retry(RetryPolicy::default());
    /// let checked = p
    ///     .from_collection(vec![4i64, 9])
    ///     .try_map_async(opts, |n: i64| async move {
    ///         if n >= 0 { Ok((n, (n as f64).sqrt())) } else { Err(format!("{n} is negative")) }
    ///     })
    ///     .collect();
    /// # let _ = checked;
    /// ```
    pub fn try_map_async<O, E, F, Fut>(&self, opts: AsyncOptions, f: F) -> Stream<O>
    where
        O: Data,
        E: std::fmt::Display + Send + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, E>> + Send + 'static,
    {
        self.async_node("try_map_async", opts, Erased::new(Fallible(f)), None)
    }

    /// Like [`Stream::try_map_async`], with the full [`AsyncFunction`] interface: a
    /// timeout handler that may emit a fallback, and the sorting of errors into retryable
    /// and permanent ones.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::time::Duration;
    /// use weir_core::prelude::*;
    ///
    /// /// Looks a country up by code; a slow lookup gives "unknown".
    /// struct Country;
    /// impl AsyncFunction<String, (String, String)> for Country {
    ///     type Error = String;
    ///     fn call(&self, code: String) -> impl Future<Output = Result<(String, String), String>> + Send + 'static {
    ///         async move { let name = format!("country {code}"); Ok((code, name)) }
    ///     }
    ///     fn on_timeout(&self, code: &String, _: Duration) -> weir_core::Result<Option<(String, String)>> {
    ///         Ok(Some((code.clone(), "unknown".into())))
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let named = p
    ///     .from_collection(vec!["NL".to_string(), "FR".to_string()])
    ///     .process_async(AsyncOptions::new(20, Duration::from_millis(500)), Country)
    ///     .collect();
    /// # let _ = named;
    /// ```
    pub fn process_async<O: Data>(
        &self,
        opts: AsyncOptions,
        function: impl AsyncFunction<T, O>,
    ) -> Stream<O> {
        self.async_node("process_async", opts, Erased::new(function), None)
    }

    /// Adds the async I/O operator; on a keyed stream, `keyed` holds its partitioning and
    /// the key hash that routes stored records by key group.
    ///
    /// # Panics
    /// When `opts` is invalid (the message says what to change), at the call site.
    pub(crate) fn async_node<O: Data>(
        &self,
        name: &str,
        opts: AsyncOptions,
        function: Arc<Erased<T, O>>,
        keyed: Option<(Partitioning<T>, KeyHash<T>)>,
    ) -> Stream<O> {
        if let Err(e) = opts.validate() {
            panic!("{e}");
        }
        let (partitioning, groups) = match keyed {
            Some((p, g)) => (p, Some(g)),
            None => (self.partitioning.clone(), None),
        };
        self.unary(
            name,
            false,
            partitioning,
            move |ctx, out, _| {
                let route = match &groups {
                    Some(g) => Route::KeyGroup(g.clone()),
                    None => Route::Spread,
                };
                Ok(Box::new(AsyncOp::new(
                    ctx,
                    &opts,
                    function.clone(),
                    route,
                    out,
                )?))
            },
            vec![],
        )
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// [`Stream::map_async`] on a keyed stream: records of one key go to one subtask (so
    /// in [`crate::async_io::OutputOrder::Ordered`] mode each key's results keep their
    /// order), and on a restore at another parallelism the records in flight at the
    /// checkpoint are re-issued by the subtask that now owns their key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::async_io::AsyncOptions;
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let scored = p
    ///     .from_collection(vec![("alice".to_string(), 3i64), ("bob".to_string(), 5)])
    ///     .key_by(|(user, _)| user.clone())
    ///     .map_async(AsyncOptions::new(50, Duration::from_secs(1)), |(user, n)| async move {
    ///         (user, n * 10)
    ///     })
    ///     .collect();
    /// # let _ = scored;
    /// ```
    pub fn map_async<O, F, Fut>(&self, opts: AsyncOptions, f: F) -> Stream<O>
    where
        O: Data,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = O> + Send + 'static,
    {
        self.async_keyed("map_async", opts, Erased::new(Infallible(f)))
    }

    /// [`Stream::try_map_async`] on a keyed stream (see [`KeyedStream::map_async`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::prelude::*;
    /// use weir_core::retry::RetryPolicy;
    ///
    /// let p = Pipeline::new();
    /// let opts = AsyncOptions::new(10, Duration::from_secs(1)).unordered().retry(RetryPolicy::default());
    /// let limits = p
    ///     .from_collection(vec![("acct-1".to_string(), 50i64), ("acct-2".to_string(), -5)])
    ///     .key_by(|(acct, _)| acct.clone())
    ///     .try_map_async(opts, |(acct, amount)| async move {
    ///         if amount < 0 { Err(format!("{acct}: negative amount")) } else { Ok((acct, amount <= 100)) }
    ///     })
    ///     .collect();
    /// # let _ = limits;
    /// ```
    pub fn try_map_async<O, E, F, Fut>(&self, opts: AsyncOptions, f: F) -> Stream<O>
    where
        O: Data,
        E: std::fmt::Display + Send + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, E>> + Send + 'static,
    {
        self.async_keyed("try_map_async", opts, Erased::new(Fallible(f)))
    }

    /// [`Stream::process_async`] on a keyed stream (see [`KeyedStream::map_async`]).
    ///
    /// ```
    /// use std::future::Future;
    /// use std::time::Duration;
    /// use weir_core::prelude::*;
    ///
    /// struct Score;
    /// impl AsyncFunction<(u32, i64), (u32, i64)> for Score {
    ///     type Error = std::convert::Infallible;
    ///     fn call(&self, (user, n): (u32, i64)) -> impl Future<Output = Result<(u32, i64), Self::Error>> + Send + 'static {
    ///         async move { Ok((user, n * n)) }
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let scores = p
    ///     .from_collection(vec![(1u32, 3i64), (2, 4), (1, 5)])
    ///     .key_by(|(user, _)| *user)
    ///     .process_async(AsyncOptions::new(8, Duration::from_secs(1)), Score)
    ///     .collect();
    /// # let _ = scores;
    /// ```
    pub fn process_async<O: Data>(
        &self,
        opts: AsyncOptions,
        function: impl AsyncFunction<T, O>,
    ) -> Stream<O> {
        self.async_keyed("process_async", opts, Erased::new(function))
    }

    fn async_keyed<O: Data>(
        &self,
        name: &str,
        opts: AsyncOptions,
        function: Arc<Erased<T, O>>,
    ) -> Stream<O> {
        let groups = hash_partitioner(self.key_fn.clone());
        self.stream
            .async_node(name, opts, function, Some((self.partitioning(), groups)))
    }
}
