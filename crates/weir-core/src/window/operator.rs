//! The window operator: per-(key, window) accumulators in keyed state, event-time timers
//! at each window's end, allowed lateness, and a side output for late records.
//!
//! Firing follows Flink's event-time trigger: a window fires when the watermark reaches
//! its max timestamp; a record that arrives after that but within the allowed lateness
//! updates the window and fires it again at once; state is dropped when the watermark
//! passes max timestamp + allowed lateness; records for windows already dropped are late.

use super::{TimeWindow, WindowAssigner};
use crate::checkpoint::KeyGroupBlobs;
use crate::data::{Data, Key};
use crate::error::{Error, Result};
use crate::ops::{OpInfo, guard};
use crate::output::{Collector, Control, Output};
use crate::state::{StateTableInfo, decode_key_groups, encode_by_key_group};
use crate::time::{MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

/// What a window computes: an accumulator per window and the output it produces.
pub(crate) trait WindowFn<K, T, O>: 'static {
    type Acc: Data;
    fn create(&self) -> Self::Acc;
    fn add(&self, acc: &mut Self::Acc, value: T);
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    fn emit(
        &self,
        key: &K,
        window: &TimeWindow,
        acc: &Self::Acc,
        out: &mut Collector<O>,
    ) -> Result<()>;
}

/// The open windows of a non-merging assigner, ordered by max timestamp: every key of a
/// window fires at the same watermark, so the window (not each key) carries the timers.
pub(crate) struct FixedWindows<K, A> {
    windows: BTreeMap<(Timestamp, Timestamp), WindowKeys<K, A>>,
}

/// One window's keys. Normally every key of a window fires together: `fired` says whether
/// the window has. A window restored at another parallelism may merge keys from subtasks
/// whose watermarks differed (idle inputs, at-least-once checkpoints): some of its keys
/// fired there and the others did not. Then `fired` is false and `fired_keys` holds the
/// keys that did, so the window fires for the others only.
struct WindowKeys<K, A> {
    fired: bool,
    keys: FxHashMap<K, A>,
    /// Keys that fired although the window has not (empty unless restored as above).
    fired_keys: FxHashSet<K>,
}

impl<K: Key, A> WindowKeys<K, A> {
    fn new(fired: bool) -> Self {
        WindowKeys {
            fired,
            keys: FxHashMap::default(),
            fired_keys: FxHashSet::default(),
        }
    }

    /// Whether `key`'s result for this window has been emitted.
    fn has_fired(&self, key: &K) -> bool {
        self.fired || self.fired_keys.contains(key)
    }

    /// Adds a restored key with its own fired flag.
    fn restore(&mut self, key: K, fired: bool, acc: A) {
        if fired != self.fired {
            if self.fired {
                // The first key that has not fired: the window has not, for it.
                self.fired_keys.extend(self.keys.keys().cloned());
                self.fired = false;
            }
            if fired {
                self.fired_keys.insert(key.clone());
            }
        }
        self.keys.insert(key, acc);
    }
}

/// One snapshotted entry of a fixed window: (max timestamp, start, fired, accumulator).
type FixedEntry<A> = (Timestamp, Timestamp, bool, A);

impl<K: Key, A: Data> StateTableInfo for RefCell<FixedWindows<K, A>> {
    fn entries(&self) -> usize {
        self.borrow().windows.values().map(|w| w.keys.len()).sum()
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        let t = self.borrow();
        let items = t.windows.iter().flat_map(|(&(max_ts, start), w)| {
            w.keys
                .iter()
                .map(move |(k, a)| (k, (max_ts, start, w.has_fired(k), a)))
        });
        encode_by_key_group(max_parallelism, items)
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.borrow_mut();
        for (k, (max_ts, start, fired, acc)) in decode_key_groups::<K, FixedEntry<A>>(blobs)? {
            t.windows
                .entry((max_ts, start))
                .or_insert_with(|| WindowKeys::new(fired))
                .restore(k, fired, acc);
        }
        Ok(())
    }
}

use super::stored::{self, PaneTable, SessionTable, WindowTimers};

enum Contents<K, A> {
    /// Non-merging windows on the heap: one accumulator per (window, key), fired per window.
    Fixed(Rc<RefCell<FixedWindows<K, A>>>),
    /// Non-merging windows in the store: one pane per (key, window), fired by its timers.
    Panes(PaneTable<K, A>),
    /// Session windows: the open sessions of each key.
    Sessions(SessionTable<K, A>),
}

/// The window operator over a keyed stream.
pub(crate) struct WindowOperator<K, T, O, F: WindowFn<K, T, O>> {
    pub(crate) key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
    pub(crate) assigner: WindowAssigner,
    pub(crate) lateness: Timestamp,
    pub(crate) f: F,
    contents: Contents<K, F::Acc>,
    timers: WindowTimers<K>,
    watermark: Timestamp,
    buf: Collector<O>,
    windows: Vec<TimeWindow>,
    out: Box<dyn Output<O>>,
    late: Option<Box<dyn Output<T>>>,
    info: OpInfo,
}

impl<K: Key, T: Clone, O, F: WindowFn<K, T, O>> WindowOperator<K, T, O, F> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
        assigner: WindowAssigner,
        lateness: Timestamp,
        f: F,
        state: &mut crate::state::StateContext<K>,
        out: Box<dyn Output<O>>,
        late: Option<Box<dyn Output<T>>>,
        info: OpInfo,
    ) -> Result<Self> {
        // Fixed windows on the heap fire per window and need no timers; in the store every
        // pane has its own.
        let timers = stored::timers(state, assigner.is_merging() || state.is_persistent())?;
        let contents = if assigner.is_merging() {
            Contents::Sessions(SessionTable::new(state)?)
        } else if let Some(panes) = stored::panes(state)? {
            let heap = stored::HeapPanes {
                panes: panes.clone(),
                timers: timers.clone(),
                lateness,
            };
            state.register_table("window-contents", Rc::new(heap))?;
            Contents::Panes(panes)
        } else {
            let t = Rc::new(RefCell::new(FixedWindows {
                windows: BTreeMap::new(),
            }));
            state.register_table("window-contents", t.clone())?;
            Contents::Fixed(t)
        };
        Ok(WindowOperator {
            key_fn,
            assigner,
            lateness,
            f,
            contents,
            timers,
            watermark: MIN_WATERMARK,
            buf: Collector::new(),
            windows: Vec::new(),
            out,
            late,
            info,
        })
    }

    fn cleanup_time(&self, w: &TimeWindow) -> Timestamp {
        w.max_timestamp().saturating_add(self.lateness)
    }

    fn is_dropped(&self, w: &TimeWindow) -> bool {
        self.cleanup_time(w) <= self.watermark
    }

    /// Registers the window's cleanup timer and, unless it is already due, its fire timer.
    fn register(&mut self, key: &K, w: TimeWindow) {
        if w.max_timestamp() > self.watermark {
            self.timers
                .borrow_mut()
                .register(w.max_timestamp(), key.clone(), w);
        }
        if self.lateness > 0 {
            self.timers
                .borrow_mut()
                .register(self.cleanup_time(&w), key.clone(), w);
        }
    }

    fn emit(&mut self, key: &K, w: &TimeWindow, acc: &F::Acc) -> Result<()> {
        let WindowOperator { f, buf, info, .. } = self;
        guard(info, || f.emit(key, w, acc, buf))?;
        self.buf.drain_into(&mut *self.out, w.max_timestamp())
    }

    fn add_fixed(&mut self, key: K, value: T) -> Result<bool> {
        let Contents::Fixed(table) = &self.contents else {
            unreachable!()
        };
        let table = table.clone();
        let mut accepted = false;
        let windows = std::mem::take(&mut self.windows);
        let n = windows.len();
        let mut value = Some(value);
        for (i, w) in windows.iter().enumerate() {
            if self.is_dropped(w) {
                continue;
            }
            accepted = true;
            let v = if i + 1 == n {
                value.take().expect("last window takes the value")
            } else {
                value.clone().expect("value kept until the last window")
            };
            let mut t = table.borrow_mut();
            // A window created by a record within the allowed lateness is already due.
            let due = w.max_timestamp() <= self.watermark;
            let win = t
                .windows
                .entry((w.max_timestamp(), w.start))
                .or_insert_with(|| WindowKeys::new(due));
            let fired = win.has_fired(&key);
            match win.keys.get_mut(&key) {
                Some(acc) => self.f.add(acc, v),
                None => {
                    let mut acc = self.f.create();
                    self.f.add(&mut acc, v);
                    win.keys.insert(key.clone(), acc);
                }
            }
            if fired {
                // Within the allowed lateness after the window fired: fire again for this key.
                let acc = win.keys.get(&key).cloned();
                drop(t);
                if let Some(acc) = acc {
                    self.emit(&key, w, &acc)?;
                }
            }
        }
        self.windows = windows;
        Ok(accepted)
    }

    fn fire_fixed(
        &mut self,
        table: Rc<RefCell<FixedWindows<K, F::Acc>>>,
        wm: Timestamp,
    ) -> Result<()> {
        loop {
            let mut t = table.borrow_mut();
            let Some((&(max_ts, start), win)) = t.windows.iter_mut().find(|(_, w)| !w.fired) else {
                break;
            };
            if max_ts > wm {
                break;
            }
            let w = TimeWindow::new(start, max_ts + 1);
            // Keys that fired before a restore at another parallelism are not emitted again.
            let (keys, already) = if self.cleanup_time(&w) <= wm {
                t.windows
                    .remove(&(max_ts, start))
                    .map(|w| (w.keys, w.fired_keys))
                    .unwrap_or_default()
            } else {
                win.fired = true;
                (win.keys.clone(), std::mem::take(&mut win.fired_keys))
            };
            drop(t);
            for (key, acc) in &keys {
                if !already.contains(key) {
                    self.emit(key, &w, acc)?;
                }
            }
        }
        // Drop fired windows whose allowed lateness has passed.
        let mut t = table.borrow_mut();
        while let Some((&(max_ts, start), _)) = t.windows.first_key_value() {
            if max_ts.saturating_add(self.lateness) > wm {
                break;
            }
            t.windows.remove(&(max_ts, start));
        }
        Ok(())
    }

    fn add_session(&mut self, key: K, value: T) -> Result<bool> {
        let Contents::Sessions(table) = &self.contents else {
            unreachable!()
        };
        let table = table.clone();
        let Some(&w) = self.windows.first() else {
            return Ok(false);
        };
        let sessions = table.take(&key)?;
        // Absorb every session that touches the growing window (a merge can make it reach
        // sessions it did not touch before), then fold them in window order.
        let mut merged = w;
        let mut absorbed = Vec::new();
        let mut kept = sessions;
        loop {
            let (hit, rest): (Vec<_>, Vec<_>) =
                kept.into_iter().partition(|(sw, _)| sw.intersects(&merged));
            kept = rest;
            if hit.is_empty() {
                break;
            }
            for (sw, _) in &hit {
                merged = merged.cover(sw);
            }
            absorbed.extend(hit);
        }
        // As in Flink, a record is late only if the session it ends up in is late: a record
        // whose own window is over still joins an open session that it touches.
        if self.is_dropped(&merged) {
            kept.extend(absorbed);
            kept.sort_by_key(|(sw, _)| *sw);
            table.put(key, kept)?;
            return Ok(false);
        }
        absorbed.sort_by_key(|(sw, _)| *sw);
        let mut acc = self.f.create();
        for (sw, sacc) in absorbed {
            self.f.merge(&mut acc, sacc);
            self.timers
                .borrow_mut()
                .delete(sw.max_timestamp(), key.clone(), sw);
            if self.lateness > 0 {
                self.timers
                    .borrow_mut()
                    .delete(self.cleanup_time(&sw), key.clone(), sw);
            }
        }
        self.f.add(&mut acc, value);
        let fire_now = merged.max_timestamp() <= self.watermark;
        if fire_now {
            self.emit(&key, &merged, &acc)?;
        }
        if !fire_now || self.lateness > 0 {
            self.register(&key, merged);
            kept.push((merged, acc));
        }
        kept.sort_by_key(|(w, _)| *w);
        table.put(key, kept)?;
        Ok(true)
    }

    fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.watermark = wm;
        if let Contents::Fixed(table) = &self.contents {
            return self.fire_fixed(table.clone(), wm);
        }
        loop {
            let Some((ts, due)) = self.timers.borrow_mut().pop_due(wm)? else {
                break;
            };
            for (key, w) in due {
                match &self.contents {
                    Contents::Fixed(_) => unreachable!("fixed windows fire without per-key timers"),
                    Contents::Panes(panes) => {
                        let panes = panes.clone();
                        self.fire_pane(&panes, key, w, ts, wm)?;
                    }
                    Contents::Sessions(_) => self.fire_session(key, w, ts)?,
                }
            }
        }
        Ok(())
    }

    /// A session's timer: its end fires it, its cleanup time drops it.
    fn fire_session(&mut self, key: K, w: TimeWindow, ts: Timestamp) -> Result<()> {
        let Contents::Sessions(table) = &self.contents else {
            unreachable!()
        };
        let fire = ts == w.max_timestamp();
        let cleanup = ts == self.cleanup_time(&w);
        let mut sessions = table.take(&key)?;
        let Some(pos) = sessions.iter().position(|(sw, _)| *sw == w) else {
            return table.put(key, sessions);
        };
        let acc = if cleanup {
            sessions.remove(pos).1
        } else {
            sessions[pos].1.clone()
        };
        table.put(key.clone(), sessions)?;
        if fire {
            self.emit(&key, &w, &acc)?;
        }
        Ok(())
    }

    /// A pane's timer (in the store): its window's end fires it unless it fired, and it is
    /// dropped once the watermark has passed its cleanup time.
    fn fire_pane(
        &mut self,
        panes: &PaneTable<K, F::Acc>,
        key: K,
        w: TimeWindow,
        ts: Timestamp,
        wm: Timestamp,
    ) -> Result<()> {
        let pane = (key, w);
        let mut t = panes.borrow_mut();
        let Some((fired, acc)) = t.get(&pane)? else {
            return Ok(());
        };
        let fire = ts == w.max_timestamp() && !fired;
        if self.cleanup_time(&w) <= wm {
            t.put(&pane, None)?;
        } else if fire {
            t.put(&pane, Some((true, acc.clone())))?;
        }
        drop(t);
        if fire {
            self.emit(&pane.0, &w, &acc)?;
        }
        Ok(())
    }

    /// Adds a record to its windows' panes in the store (fixed windows, RocksDB backend).
    fn add_pane(&mut self, key: K, value: T) -> Result<bool> {
        let Contents::Panes(panes) = &self.contents else {
            unreachable!()
        };
        let panes = panes.clone();
        let windows = std::mem::take(&mut self.windows);
        let mut accepted = false;
        let mut value = Some(value);
        let n = windows.len();
        for (i, w) in windows.iter().enumerate() {
            if self.is_dropped(w) {
                continue;
            }
            accepted = true;
            let v = if i + 1 == n {
                value.take().expect("last window takes the value")
            } else {
                value.clone().expect("value kept until the last window")
            };
            // A window created by a record within the allowed lateness is already due.
            let due = w.max_timestamp() <= self.watermark;
            let f = &self.f;
            let (created, again) = panes.borrow_mut().modify(&(key.clone(), *w), |pane| {
                let created = pane.is_none();
                let (fired, acc) = pane.get_or_insert_with(|| (due, f.create()));
                f.add(acc, v);
                (created, fired.then(|| acc.clone()))
            })?;
            if created {
                self.register(&key, *w);
            }
            if let Some(acc) = again {
                // Within the allowed lateness after the window fired: fire again for this key.
                self.emit(&key, w, &acc)?;
            }
        }
        self.windows = windows;
        Ok(accepted)
    }
}

impl<K: Key, T: Clone, O, F: WindowFn<K, T, O>> Output<T> for WindowOperator<K, T, O, F> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        if ts == NO_TIMESTAMP {
            return Err(Error::Config(
                "a window received a record without a timestamp; assign event time with \
                 `.with_watermarks(WatermarkStrategy::..)` or use a source that sets timestamps"
                    .into(),
            )
            .at(|| self.info.location()));
        }
        let key_fn = &self.key_fn;
        let key = guard(&self.info, || Ok(key_fn(&value)))?;
        let mut windows = std::mem::take(&mut self.windows);
        self.assigner.assign_into(ts, &mut windows);
        self.windows = windows;
        let late_copy = self.late.as_ref().map(|_| value.clone());
        let accepted = match self.contents {
            Contents::Fixed(_) => self.add_fixed(key, value)?,
            Contents::Panes(_) => self.add_pane(key, value)?,
            Contents::Sessions(_) => self.add_session(key, value)?,
        };
        if !accepted && let (Some(late), Some(v)) = (self.late.as_mut(), late_copy) {
            late.record(v, ts)?;
        }
        Ok(())
    }

    fn control(&mut self, event: Control) -> Result<()> {
        if let Control::Watermark(w) = event {
            self.on_watermark(w)?;
        }
        if let Some(late) = self.late.as_mut() {
            late.control(event)?;
        }
        self.out.control(event)
    }
}

#[cfg(test)]
#[path = "operator_tests.rs"]
mod tests;
