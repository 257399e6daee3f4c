//! Iterators over the current key's list or map that read the backend in batches
//! ([`super::ListAccess::read_from`], [`super::MapAccess::entries_after`]), so that a
//! collection larger than memory can be walked.

use super::{ListAccess, MapAccess};
use crate::error::Result;
use std::collections::VecDeque;

/// Elements or entries an iterator reads from the backend at a time.
pub const ITER_BATCH: usize = 1024;

/// The elements of the current key's list, read in batches ([`super::ListState::iter`]).
pub struct ListIter<'a, V> {
    inner: &'a dyn ListAccess<V>,
    buf: VecDeque<V>,
    next: usize,
    done: bool,
}

impl<'a, V> ListIter<'a, V> {
    pub(super) fn new(inner: &'a dyn ListAccess<V>) -> Self {
        ListIter {
            inner,
            buf: VecDeque::new(),
            next: 0,
            done: false,
        }
    }
}

impl<V> Iterator for ListIter<'_, V> {
    type Item = Result<V>;

    fn next(&mut self) -> Option<Result<V>> {
        while self.buf.is_empty() && !self.done {
            match self.inner.read_from(self.next, ITER_BATCH) {
                Ok((batch, next)) => {
                    self.done = next <= self.next;
                    self.next = next;
                    self.buf.extend(batch);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        self.buf.pop_front().map(Ok)
    }
}

/// The entries of the current key's map, read in batches ([`super::MapState::iter`]).
pub struct MapIter<'a, UK, UV> {
    inner: &'a dyn MapAccess<UK, UV>,
    buf: VecDeque<(UK, UV)>,
    /// The user key of the last entry read from the backend.
    last: Option<UK>,
    done: bool,
}

impl<'a, UK, UV> MapIter<'a, UK, UV> {
    pub(super) fn new(inner: &'a dyn MapAccess<UK, UV>) -> Self {
        MapIter {
            inner,
            buf: VecDeque::new(),
            last: None,
            done: false,
        }
    }
}

impl<UK: Clone, UV> Iterator for MapIter<'_, UK, UV> {
    type Item = Result<(UK, UV)>;

    fn next(&mut self) -> Option<Result<(UK, UV)>> {
        if self.buf.is_empty() && !self.done {
            match self.inner.entries_after(self.last.as_ref(), ITER_BATCH) {
                Ok(batch) => {
                    self.done = batch.is_empty();
                    self.last = batch.last().map(|(k, _)| k.clone());
                    self.buf.extend(batch);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        self.buf.pop_front().map(Ok)
    }
}
