//! Stateless one-input operators: map, filter, flat_map, inspect.

use super::{OpInfo, guard};
use crate::error::Result;
use crate::output::{Control, Output};
use crate::time::Timestamp;
use std::sync::Arc;

/// Applies a fallible function to each record.
pub struct Map<I, O> {
    pub(crate) f: Arc<dyn Fn(I) -> Result<O> + Send + Sync>,
    pub(crate) out: Box<dyn Output<O>>,
    pub(crate) info: OpInfo,
}

impl<I, O> Output<I> for Map<I, O> {
    #[inline]
    fn record(&mut self, value: I, ts: Timestamp) -> Result<()> {
        let f = &self.f;
        let o = guard(&self.info, || f(value))?;
        self.out.record(o, ts)
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.control(event)
    }
}

/// Keeps the records for which a predicate holds.
pub struct Filter<T> {
    pub(crate) f: Arc<dyn Fn(&T) -> bool + Send + Sync>,
    pub(crate) out: Box<dyn Output<T>>,
    pub(crate) info: OpInfo,
}

impl<T> Output<T> for Filter<T> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        let f = &self.f;
        if guard(&self.info, || Ok(f(&value)))? {
            self.out.record(value, ts)?;
        }
        Ok(())
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.control(event)
    }
}

/// Turns each record into zero or more records.
pub struct FlatMap<I, O> {
    pub(crate) f: Arc<dyn Fn(I) -> Result<Vec<O>> + Send + Sync>,
    pub(crate) out: Box<dyn Output<O>>,
    pub(crate) info: OpInfo,
}

impl<I, O> Output<I> for FlatMap<I, O> {
    fn record(&mut self, value: I, ts: Timestamp) -> Result<()> {
        let f = &self.f;
        for o in guard(&self.info, || f(value))? {
            self.out.record(o, ts)?;
        }
        Ok(())
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.control(event)
    }
}
