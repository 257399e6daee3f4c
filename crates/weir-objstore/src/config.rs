//! How stores are configured and opened once per bucket: retries, timeouts, options given in
//! code, and the in-process `memory://` stores.

use crate::{Error, RETRY_TIMEOUT, Result, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub(crate) fn retry_config() -> object_store::RetryConfig {
    let configured = options()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| k == "weir_object_store_retry_secs")
        .map(|(_, v)| v.clone());
    let timeout = configured
        .or_else(|| std::env::var("WEIR_OBJECT_STORE_RETRY_SECS").ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(RETRY_TIMEOUT);
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 20,
        retry_timeout: timeout,
    }
}

/// A connection that is not up within this long counts as failed (and is retried), so a
/// stopped server is noticed quickly.
pub(crate) const CONNECT_TIMEOUT: &str = "5s";

/// Settings given in code ([`set_options`]), applied over the environment's.
pub(crate) fn options() -> &'static Mutex<Vec<(String, String)>> {
    static OPTIONS: OnceLock<Mutex<Vec<(String, String)>>> = OnceLock::new();
    OPTIONS.get_or_init(Default::default)
}

/// Sets options for every store opened afterwards in this process, over what the environment
/// says: keys as `object_store` names them, the same as the environment variables in lower
/// case (`aws_endpoint_url`, `aws_access_key_id`, `aws_secret_access_key`, `aws_region`,
/// `aws_allow_http`, `google_service_account`, `azure_storage_account_name`, …), and
/// `weir_object_store_retry_secs` for how long requests are retried. A key that
/// does not belong to a store's kind is ignored by it; an unknown key fails
/// [`Store::open`].
///
/// For programs that take credentials from their own configuration rather than the
/// environment; a later call replaces the options of an earlier one.
///
/// ```
/// weir_objstore::set_options([("aws_region", "eu-west-1")]);
/// assert!(weir_objstore::Store::open("s3://bucket/prefix").is_ok());
/// weir_objstore::set_options([("aws_no_such_key", "x")]);
/// let e = weir_objstore::Store::open("s3://bucket/prefix").unwrap_err();
/// assert!(e.to_string().contains("aws_no_such_key"), "{e}");
/// weir_objstore::set_options(Vec::<(String, String)>::new());
/// ```
pub fn set_options<K: Into<String>, V: Into<String>>(options: impl IntoIterator<Item = (K, V)>) {
    let new: Vec<(String, String)> = options
        .into_iter()
        .map(|(k, v)| (k.into().to_ascii_lowercase(), v.into()))
        .collect();
    *self::options().lock().unwrap_or_else(|p| p.into_inner()) = new;
    roots().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The options of [`set_options`] whose keys start with one of `prefixes`, parsed as `C`.
pub(crate) fn configured<C: std::str::FromStr>(
    prefixes: &[&str],
    url: &str,
) -> Result<Vec<(C, String)>>
where
    C::Err: std::fmt::Display,
{
    let all = options().lock().unwrap_or_else(|p| p.into_inner()).clone();
    all.into_iter()
        .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| {
            k.parse::<C>().map(|c| (c, v)).map_err(|e| Error::Config {
                url: url.to_string(),
                message: format!("option '{k}': {e}"),
            })
        })
        .collect()
}

/// Opened buckets, by `scheme://bucket` (emptied by [`set_options`]).
pub(crate) fn roots() -> &'static Mutex<HashMap<String, Store>> {
    static ROOTS: OnceLock<Mutex<HashMap<String, Store>>> = OnceLock::new();
    ROOTS.get_or_init(Default::default)
}

/// The in-process stores of `memory://` URLs, by name.
pub(crate) fn memory_store(name: &str) -> Arc<object_store::memory::InMemory> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<object_store::memory::InMemory>>>> =
        OnceLock::new();
    let mut all = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(name.to_string())
        .or_insert_with(|| Arc::new(object_store::memory::InMemory::new()))
        .clone()
}
