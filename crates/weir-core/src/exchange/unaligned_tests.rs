//! Channel state of unaligned checkpoints, per channel kind: what a consumer captures
//! between its snapshot and each channel's unaligned barrier is exactly the records sent
//! before the barrier and not yet taken, and it replays in original order per channel,
//! also at another parallelism and across a byte link (a cluster's TCP exchange).

use super::*;
use crate::data::key_group_range;
use std::collections::BTreeMap;
use std::rc::Rc;

const MAXP: usize = 128;

fn cfg() -> ExchangeConfig {
    ExchangeConfig {
        batch_size: 4,
        channel_capacity: 64,
        flush_interval_ms: 1_000,
        max_parallelism: MAXP,
        in_flight_target: None,
    }
}

type Seen = Rc<RefCell<Vec<i64>>>;

/// An operator input that keeps the values it is given.
struct Collect(Seen);

impl Output<i64> for Collect {
    fn record(&mut self, value: i64, _ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push(value);
        Ok(())
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

fn gate(exchange: &TypedExchange<i64>, readers: Box<dyn Any + Send>) -> (Box<dyn InputGate>, Seen) {
    let seen = Seen::default();
    let input: Box<dyn Output<i64>> = Box::new(Collect(seen.clone()));
    let g = exchange.bind(readers, Box::new(input)).unwrap();
    (g, seen)
}

fn writer(set: &mut ChannelSet) -> Vec<Box<dyn Output<i64> + Send>> {
    std::mem::take(&mut set.writers)
        .into_iter()
        .map(|w| *w.downcast::<Box<dyn Output<i64> + Send>>().unwrap())
        .collect()
}

/// Producer `p` writes `p * 1000 + i` for i < 10 (the last two stay in its buffer), then
/// an unaligned barrier 1, then `p * 1000 + 500 + i` for i < 10, then the end.
fn produce(writers: &mut [Box<dyn Output<i64> + Send>]) {
    for (p, w) in writers.iter_mut().enumerate() {
        for i in 0..10 {
            w.record(p as i64 * 1000 + i, 0).unwrap();
        }
        with_unaligned_barriers(|| w.control(Control::Barrier(CheckpointId(1)))).unwrap();
    }
    for (p, w) in writers.iter_mut().enumerate() {
        for i in 0..10 {
            w.record(p as i64 * 1000 + 500 + i, 0).unwrap();
        }
        w.control(Control::End).unwrap();
    }
}

/// The consumer takes one message of its first channel, snapshots, then collects every
/// channel's state up to its barrier; returns the state and the records taken before.
fn capture(
    g: &dyn InputGate,
    seen: &Seen,
    subtask: usize,
    parallelism: usize,
) -> (Vec<(u32, Vec<u8>)>, Vec<i64>) {
    let mut sel = crossbeam_channel::Select::new();
    g.select(&mut sel, 0);
    let op = sel.select();
    // The barrier is already on the priority lane: it comes first, the message waits.
    let first = g.complete(0, op).unwrap();
    assert!(
        matches!(first, GateEvent::Priority(CheckpointId(1), _)),
        "{first:?}"
    );
    assert!(matches!(g.resume(0).unwrap(), Some(GateEvent::Records(_))));
    let before = seen.borrow().clone();
    let mut uptos = vec![first];
    for ch in 0..g.len() {
        g.capture(ch, None).unwrap();
        if ch > 0 {
            uptos.push(g.poll_priority(ch).expect("a priority barrier"));
        }
    }
    for (ch, p) in uptos.into_iter().enumerate() {
        let GateEvent::Priority(_, upto) = p else {
            unreachable!()
        };
        // Two full batches and the held one were written before each barrier.
        g.capture(ch, Some(upto)).unwrap();
        g.drain(ch).unwrap();
        assert!(
            g.capture_done(ch),
            "channel {ch}: everything before its barrier is in"
        );
    }
    let blobs = (0..g.len())
        .filter_map(|ch| g.channel_state(ch, 0, subtask, parallelism).unwrap())
        .collect();
    // What was drained is still delivered afterwards, before anything newer.
    for ch in 0..g.len() {
        while g.resume(ch).unwrap().is_some() {}
    }
    (blobs, before)
}

fn replay(
    exchange: &TypedExchange<i64>,
    blobs: &[(u32, Vec<u8>)],
    subtask: usize,
    parallelism: usize,
) -> Vec<i64> {
    let set = exchange.channels(1, parallelism, cfg());
    let mut readers = set.readers;
    let (g, seen) = gate(exchange, readers.swap_remove(subtask));
    let n = g.replay(blobs, 0, subtask, parallelism, MAXP).unwrap();
    let out = seen.borrow().clone();
    assert_eq!(n, out.len());
    out
}

/// Runs the scenario for `producers` → `consumers` and restores each consumer's state at
/// `restore_p`; returns, per new subtask, what it replays, and the old consumers' view.
fn scenario(
    partitioning: Partitioning<i64>,
    producers: usize,
    consumers: usize,
    restore_p: usize,
) -> (BTreeMap<usize, Vec<i64>>, Vec<Vec<i64>>) {
    let exchange = TypedExchange { partitioning };
    let mut set = exchange.channels(producers, consumers, cfg());
    let mut writers = writer(&mut set);
    produce(&mut writers);
    let mut all_blobs = Vec::new();
    let mut taken_before = Vec::new();
    for (c, r) in std::mem::take(&mut set.readers).into_iter().enumerate() {
        let (g, seen) = gate(&exchange, r);
        let (blobs, before) = capture(&*g, &seen, c, consumers);
        all_blobs.extend(blobs);
        taken_before.push(before);
    }
    let replayed = (0..restore_p)
        .map(|s| (s, replay(&exchange, &all_blobs, s, restore_p)))
        .collect();
    (replayed, taken_before)
}

fn before(p: i64) -> Vec<i64> {
    (0..10).map(|i| p * 1000 + i).collect()
}

#[test]
fn forward_channel_state_replays_in_order_on_the_same_subtask() {
    let (replayed, taken) = scenario(Partitioning::Forward, 2, 2, 2);
    for s in 0..2 {
        // The first batch (4 records) was processed before the snapshot.
        assert_eq!(taken[s], before(s as i64)[..4]);
        assert_eq!(replayed[&s], before(s as i64)[4..]);
    }
}

#[test]
fn rebalance_channel_state_replays_each_channel_in_order() {
    let (replayed, taken) = scenario(Partitioning::Rebalance, 1, 2, 2);
    // Round robin from producer 0: even records to consumer 0, odd ones to consumer 1.
    let to = |c: i64| (0..10).filter(|i| i % 2 == c).collect::<Vec<i64>>();
    for c in 0..2 {
        assert_eq!(taken[c as usize], to(c)[..4]);
        assert_eq!(replayed[&(c as usize)], to(c)[4..]);
    }
    // At parallelism 1 the one subtask replays both old channels, each in order.
    let (merged, _) = scenario(Partitioning::Rebalance, 1, 2, 1);
    let mut want = to(0)[4..].to_vec();
    want.extend(&to(1)[4..]);
    assert_eq!(merged[&0], want);
}

#[test]
fn broadcast_channel_state_replays_every_subtasks_copy() {
    let (replayed, taken) = scenario(Partitioning::Broadcast, 2, 2, 2);
    let mut want = before(0)[..].to_vec();
    want.extend(before(1));
    for s in 0..2 {
        // Channel 0 (from producer 0) gave its first batch before the snapshot.
        assert_eq!(taken[s], before(0)[..4]);
        assert_eq!(replayed[&s], want[4..]);
    }
    // After a rescale every new subtask takes old subtask 0's copy.
    let (rescaled, _) = scenario(Partitioning::Broadcast, 2, 2, 3);
    for s in 0..3 {
        assert_eq!(rescaled[&s], want[4..]);
    }
}

fn key(v: i64) -> i64 {
    v % 7
}

fn hashed() -> Partitioning<i64> {
    Partitioning::Hash(hash_partitioner(Arc::new(|v: &i64| key(*v))))
}

fn owner(v: i64, p: usize) -> usize {
    let kg = (crate::data::key_hash(&key(v)) % MAXP as u64) as u32;
    (0..p)
        .find(|s| key_group_range(*s, MAXP, p).contains(&kg))
        .unwrap()
}

#[test]
fn keyed_channel_state_replays_in_order_on_the_same_subtasks() {
    let (replayed, taken) = scenario(hashed(), 2, 2, 2);
    for s in 0..2 {
        let mut want: Vec<i64> = Vec::new();
        for p in 0..2 {
            want.extend(before(p).into_iter().filter(|v| owner(*v, 2) == s));
        }
        // Minus what the subtask processed before its snapshot (its first message).
        let rest: Vec<i64> = want
            .iter()
            .copied()
            .filter(|v| !taken[s].contains(v))
            .collect();
        assert!(!taken[s].is_empty());
        assert_eq!(replayed[&s], rest);
    }
}

#[test]
fn keyed_channel_state_restored_at_another_parallelism_gives_every_key_once_in_order() {
    for restore_p in [1, 3, 4] {
        let (replayed, taken) = scenario(hashed(), 2, 2, restore_p);
        let taken: Vec<i64> = taken.concat();
        let mut all: Vec<i64> = Vec::new();
        for (s, values) in &replayed {
            for v in values {
                assert_eq!(
                    owner(*v, restore_p),
                    *s,
                    "{v} replays where its key group is now"
                );
            }
            all.extend(values);
        }
        // Every record not processed before the snapshot, exactly once.
        let mut want: Vec<i64> = (0..2)
            .flat_map(before)
            .filter(|v| !taken.contains(v))
            .collect();
        want.sort();
        let mut got = all.clone();
        got.sort();
        assert_eq!(got, want, "restored at parallelism {restore_p}");
        // In order per key (and producer): the original order of the channel.
        for values in replayed.values() {
            let mut per_key: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
            for v in values {
                per_key.entry((v / 1000, key(*v))).or_default().push(*v);
            }
            for seq in per_key.values() {
                assert!(seq.windows(2).all(|w| w[0] < w[1]), "{seq:?}");
            }
        }
    }
}

/// The scenario across a byte link, as a cluster carries it: the producer's end is read
/// and encoded, the consumer's end is a second set of channels fed from the frames.
#[test]
fn channel_state_over_a_link_replays_in_order_and_the_barrier_goes_first() {
    let exchange = TypedExchange {
        partitioning: hashed(),
    };
    let mut producer_side = exchange.linked_channels(2, 2, cfg());
    let mut consumer_side = exchange.linked_channels(2, 2, cfg());
    let mut writers = writer(&mut producer_side);
    produce(&mut writers);
    drop(writers);
    let mut inlets: BTreeMap<(usize, usize), (Box<dyn LinkWriter>, PriorityInlet)> =
        BTreeMap::new();
    for l in std::mem::take(&mut consumer_side.links) {
        inlets.insert((l.producer, l.consumer), (l.writer, l.priority));
    }
    for mut l in std::mem::take(&mut producer_side.links) {
        let (w, inlet) = inlets.get_mut(&(l.producer, l.consumer)).unwrap();
        let mut first = true;
        loop {
            let mut buf = Vec::new();
            match l
                .reader
                .next(std::time::Duration::from_millis(100), &mut buf)
                .unwrap()
            {
                LinkRead::Priority => {
                    assert!(is_priority(&buf));
                    assert!(inlet.deliver(&buf).unwrap());
                }
                LinkRead::Msg { end } => {
                    // Every message was written before this reader started: the priority
                    // message, waiting on its lane, overtakes all of them.
                    assert!(!first, "the unaligned barrier is read before any data");
                    w.write(&buf).unwrap();
                    if end {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
            first = false;
        }
    }
    drop(producer_side);
    let mut blobs = Vec::new();
    let mut taken = Vec::new();
    for (c, r) in std::mem::take(&mut consumer_side.readers)
        .into_iter()
        .enumerate()
    {
        let (g, seen) = gate(&exchange, r);
        let (b, before) = capture(&*g, &seen, c, 2);
        blobs.extend(b);
        taken.extend(before);
    }
    for s in 0..2 {
        let mut want: Vec<i64> = Vec::new();
        for p in 0..2 {
            want.extend(
                before(p)
                    .into_iter()
                    .filter(|v| owner(*v, 2) == s && !taken.contains(v)),
            );
        }
        assert_eq!(replay(&exchange, &blobs, s, 2), want);
    }
}

/// Aligned with a timeout: an in-band barrier that waits on a full channel longer than
/// the timeout also goes on the priority lane, counting itself as before it, so the
/// consumer need not wait for the backlog in front of it.
#[test]
fn an_in_band_barrier_stuck_behind_a_full_channel_also_takes_the_priority_lane() {
    let exchange = TypedExchange::<i64> {
        partitioning: Partitioning::Forward,
    };
    let cfg = ExchangeConfig {
        channel_capacity: 1,
        ..cfg()
    };
    let mut set = exchange.channels(1, 1, cfg);
    let mut w = writer(&mut set).pop().unwrap();
    let producer = std::thread::spawn(move || {
        set_barrier_timeout(Some(std::time::Duration::from_millis(20)));
        for i in 0..4 {
            w.record(i, 0).unwrap();
        }
        // The batch fills the channel; the barrier waits behind it.
        w.control(Control::Barrier(CheckpointId(7))).unwrap();
        w.control(Control::End).unwrap();
    });
    let (g, seen) = gate(&exchange, set.readers.pop().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let p = loop {
        if let Some(p) = g.poll_priority(0) {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "no priority barrier");
        std::thread::yield_now();
    };
    // Message 1 is the batch, message 2 the barrier itself.
    assert_eq!(p, GateEvent::Priority(CheckpointId(7), 2));
    assert!(
        seen.borrow().is_empty(),
        "nothing was read while the barrier overtook"
    );
    let mut events = Vec::new();
    while events.last() != Some(&GateEvent::End) {
        let mut sel = crossbeam_channel::Select::new();
        g.select(&mut sel, 0);
        let op = sel.select();
        events.push(g.complete(0, op).unwrap());
    }
    assert_eq!(
        events,
        vec![
            GateEvent::Records(4),
            GateEvent::Barrier(CheckpointId(7)),
            GateEvent::End
        ]
    );
    producer.join().unwrap();
}
