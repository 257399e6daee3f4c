//! Broadcast state: the maps every parallel instance of a broadcast operator holds in
//! identical copies ([`BroadcastStateDescriptor`] names one), the read-only view the data
//! side gets ([`ReadOnlyBroadcastState`]) and the writable one of the broadcast side
//! ([`BroadcastState`]), and how the copies go into a checkpoint (once per operator) and
//! come back (into every subtask, at any parallelism).
//!
//! Owns nothing keyed: keyed state and timers stay with the keyed state backend.

use crate::codec;
use crate::data::Key;
use crate::error::{Error, Result};
use serde::{Serialize, de::DeserializeOwned};
use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// Names a broadcast state and its types (Flink's `MapStateDescriptor` given to
/// `broadcast(..)`): a map from `K` to `V` that every parallel instance of the operator
/// holds in full. Pass it to [`crate::dsl::Stream::broadcast_state`] and to the contexts'
/// `broadcast_state` to read or write the map. Cloning is cheap.
///
/// ```
/// use weir_core::prelude::*;
/// let thresholds = BroadcastStateDescriptor::<String, i64>::new("thresholds");
/// assert_eq!(thresholds.name(), "thresholds");
/// ```
pub struct BroadcastStateDescriptor<K, V> {
    name: Arc<str>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for BroadcastStateDescriptor<K, V> {
    fn clone(&self) -> Self {
        BroadcastStateDescriptor {
            name: self.name.clone(),
            _types: PhantomData,
        }
    }
}

impl<K: Key, V: Clone + Serialize + DeserializeOwned + 'static> BroadcastStateDescriptor<K, V> {
    /// A descriptor for the broadcast state `name` (unique among the operator's
    /// broadcast states).
    pub fn new(name: &str) -> Self {
        BroadcastStateDescriptor {
            name: Arc::from(name),
            _types: PhantomData,
        }
    }

    /// The state's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the operator creates this state's empty table.
    pub(crate) fn declaration(&self) -> Declaration {
        Declaration {
            name: self.name.clone(),
            make: || Box::new(Table::<K, V>(BTreeMap::new())),
        }
    }
}

/// A broadcast state declared on a broadcast stream: its name and an empty table maker.
#[derive(Clone)]
pub(crate) struct Declaration {
    pub(crate) name: Arc<str>,
    make: fn() -> Box<dyn AnyTable>,
}

/// A typed map behind a type-erased table.
trait AnyTable {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn encode(&self) -> Result<Vec<u8>>;
    fn load(&mut self, bytes: &[u8]) -> Result<()>;
    fn len(&self) -> usize;
}

struct Table<K, V>(BTreeMap<K, V>);

impl<K: Key, V: Serialize + DeserializeOwned + 'static> AnyTable for Table<K, V> {
    fn as_any(&self) -> &dyn Any {
        &self.0
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        &mut self.0
    }
    fn encode(&self) -> Result<Vec<u8>> {
        codec::encode(&self.0.iter().collect::<Vec<_>>())
    }
    fn load(&mut self, bytes: &[u8]) -> Result<()> {
        let entries: Vec<(K, V)> = codec::decode(bytes)?;
        self.0 = entries.into_iter().collect();
        Ok(())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The broadcast states of one operator subtask, in declaration order.
pub(crate) struct BroadcastStates {
    tables: Vec<(Arc<str>, Box<dyn AnyTable>)>,
    /// States the restored checkpoint held that this operator does not declare, as they
    /// were stored: kept in every checkpoint, unused, for a job version that declares
    /// them again (a rollback).
    undeclared: Stored,
}

/// How broadcast state is stored in a checkpoint: (name, encoded entries) per state.
type Stored = Vec<(String, Vec<u8>)>;

impl BroadcastStates {
    /// Empty tables for the declared states.
    ///
    /// # Errors
    /// [`Error::Config`] when two declarations share a name.
    pub(crate) fn new(decls: &[Declaration]) -> Result<Self> {
        let mut tables: Vec<(Arc<str>, Box<dyn AnyTable>)> = Vec::with_capacity(decls.len());
        for d in decls {
            if tables.iter().any(|(n, _)| *n == d.name) {
                return Err(Error::Config(format!(
                    "broadcast state '{}' is declared twice on the same broadcast stream; give \
                     each BroadcastStateDescriptor its own name",
                    d.name
                )));
            }
            tables.push((d.name.clone(), (d.make)()));
        }
        Ok(BroadcastStates {
            tables,
            undeclared: Stored::new(),
        })
    }

    fn find(&self, name: &str) -> Result<usize> {
        self.tables
            .iter()
            .position(|(n, _)| &**n == name)
            .ok_or_else(|| {
                let declared: Vec<&str> = self.tables.iter().map(|(n, _)| &**n).collect();
                Error::Config(format!(
                    "the function used broadcast state '{name}', which the broadcast stream does \
                     not declare (declared: {declared:?}); pass its descriptor to \
                     .broadcast_state(&descriptor) (or .with_state(&descriptor))"
                ))
            })
    }

    fn type_error<K, V>(name: &str) -> Error {
        Error::Config(format!(
            "broadcast state '{name}' was declared with other types than the descriptor used \
             to read it (<{}, {}>); use the same BroadcastStateDescriptor on both sides",
            std::any::type_name::<K>(),
            std::any::type_name::<V>()
        ))
    }

    /// The map of `desc`, to read.
    pub(crate) fn map<K: 'static, V: 'static>(
        &self,
        desc: &BroadcastStateDescriptor<K, V>,
    ) -> Result<&BTreeMap<K, V>> {
        let i = self.find(&desc.name)?;
        self.tables[i]
            .1
            .as_any()
            .downcast_ref()
            .ok_or_else(|| Self::type_error::<K, V>(&desc.name))
    }

    /// The map of `desc`, to write.
    pub(crate) fn map_mut<K: 'static, V: 'static>(
        &mut self,
        desc: &BroadcastStateDescriptor<K, V>,
    ) -> Result<&mut BTreeMap<K, V>> {
        let i = self.find(&desc.name)?;
        self.tables[i]
            .1
            .as_any_mut()
            .downcast_mut()
            .ok_or_else(|| Self::type_error::<K, V>(&desc.name))
    }

    /// Total entries over all states.
    pub(crate) fn entries(&self) -> usize {
        self.tables.iter().map(|(_, t)| t.len()).sum()
    }

    /// Encodes every state for a checkpoint.
    pub(crate) fn snapshot(&self) -> Result<Vec<u8>> {
        let stored: Stored = self
            .tables
            .iter()
            .map(|(n, t)| Ok((n.to_string(), t.encode()?)))
            .chain(self.undeclared.iter().map(|kept| Ok(kept.clone())))
            .collect::<Result<_>>()?;
        codec::encode(&stored)
    }

    /// What `weir checkpoints inspect` shows of the states.
    pub(crate) fn describe(&self) -> String {
        let parts: Vec<String> = self
            .tables
            .iter()
            .map(|(n, t)| format!("{n}: {} entries", t.len()))
            .chain(
                self.undeclared
                    .iter()
                    .map(|(n, _)| format!("{n}: not declared, kept")),
            )
            .collect();
        format!("broadcast state ({})", parts.join(", "))
    }

    /// Loads states written by [`BroadcastStates::snapshot`]. A state the checkpoint holds
    /// but this operator no longer declares is kept as it was stored, and written into
    /// every checkpoint again, with a warning; a declared state the checkpoint lacks starts
    /// empty.
    ///
    /// # Errors
    /// [`Error::Config`] naming the state when its entries do not decode as the declared
    /// types.
    pub(crate) fn restore(&mut self, bytes: &[u8], operator: &str) -> Result<()> {
        let stored: Stored = codec::decode(bytes).map_err(|e| {
            Error::Config(format!(
                "operator '{operator}': the checkpoint's broadcast state does not decode: {e}"
            ))
        })?;
        for (name, entries) in stored {
            let Some((_, table)) = self.tables.iter_mut().find(|(n, _)| **n == *name) else {
                tracing::warn!(operator, state = %name, "the checkpoint holds broadcast state this operator does not declare (renamed, or no longer used): it is kept in every checkpoint as it was, unused, and a job version that declares it again finds it");
                self.undeclared.push((name, entries));
                continue;
            };
            table.load(&entries).map_err(|e| {
                Error::Config(format!(
                    "operator '{operator}': broadcast state '{name}' in the checkpoint does not \
                     decode as the descriptor's types ({e}); the key or value type changed"
                ))
            })?;
        }
        Ok(())
    }
}

/// The read-only view of a broadcast state that `process_element` and `on_timer` get:
/// one record of one key must not change what every other instance sees, so only the
/// broadcast side ([`BroadcastState`]) writes. Iteration is in key order.
///
/// ```compile_fail
/// use weir_core::prelude::*;
/// fn on_data(ctx: &mut ReadOnlyContext<'_, String, String>) -> weir_core::Result<()> {
///     let desc = BroadcastStateDescriptor::<String, i64>::new("thresholds");
///     ctx.broadcast_state(&desc)?.put("a".into(), 1); // read-only here
///     Ok(())
/// }
/// ```
pub struct ReadOnlyBroadcastState<'a, K, V> {
    map: &'a BTreeMap<K, V>,
}

impl<'a, K: Ord, V> ReadOnlyBroadcastState<'a, K, V> {
    pub(crate) fn new(map: &'a BTreeMap<K, V>) -> Self {
        ReadOnlyBroadcastState { map }
    }
    /// The value of `key`, if any.
    pub fn get(&self, key: &K) -> Option<&'a V> {
        self.map.get(key)
    }
    /// True when `key` has a value.
    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }
    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a K, &'a V)> + 'a {
        self.map.iter()
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True when the state is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// Not available: the data side cannot write broadcast state. Present only so that
    /// the compiler explains why (see [`WritableBroadcastState`]).
    #[doc(hidden)]
    pub fn put(&mut self, key: K, value: V) -> Option<V>
    where
        Self: WritableBroadcastState,
    {
        let _ = (key, value);
        unreachable!("ReadOnlyBroadcastState never implements WritableBroadcastState")
    }
    /// Not available: the data side cannot write broadcast state.
    #[doc(hidden)]
    pub fn remove(&mut self, key: &K) -> Option<V>
    where
        Self: WritableBroadcastState,
    {
        let _ = key;
        unreachable!("ReadOnlyBroadcastState never implements WritableBroadcastState")
    }
    /// Not available: the data side cannot write broadcast state.
    #[doc(hidden)]
    pub fn clear(&mut self)
    where
        Self: WritableBroadcastState,
    {
        unreachable!("ReadOnlyBroadcastState never implements WritableBroadcastState")
    }
}

/// Marks the views of broadcast state that may be written: only [`BroadcastState`], the
/// view of `process_broadcast_element`. It exists so that writing through the data side's
/// [`ReadOnlyBroadcastState`] fails to compile with a message that says where to write.
#[diagnostic::on_unimplemented(
    message = "broadcast state is read-only in `process_element` and `on_timer`",
    label = "this view of the broadcast state cannot be written",
    note = "write broadcast state in `process_broadcast_element` (its `BroadcastContext` gives a writable `BroadcastState`): every parallel instance receives each broadcast record and applies the same update, so the copies stay identical"
)]
pub trait WritableBroadcastState {}

impl<K, V> WritableBroadcastState for BroadcastState<'_, K, V> {}

/// The writable view of a broadcast state that `process_broadcast_element` gets. Every
/// parallel instance receives each broadcast record and must apply the same update, so
/// that all copies stay identical (the checkpoint stores one). Iteration is in key order.
pub struct BroadcastState<'a, K, V> {
    map: &'a mut BTreeMap<K, V>,
}

impl<'a, K: Ord, V> BroadcastState<'a, K, V> {
    pub(crate) fn new(map: &'a mut BTreeMap<K, V>) -> Self {
        BroadcastState { map }
    }
    /// The value of `key`, if any.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }
    /// True when `key` has a value.
    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }
    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True when the state is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// Sets `key` to `value`; returns the previous value.
    pub fn put(&mut self, key: K, value: V) -> Option<V> {
        self.map.insert(key, value)
    }
    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key)
    }
    /// Removes every entry.
    pub fn clear(&mut self) {
        self.map.clear()
    }
}
