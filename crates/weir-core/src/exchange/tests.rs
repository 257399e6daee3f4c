use super::link::{decode_msg, encode_msg};
use super::*;

fn cfg() -> ExchangeConfig {
    ExchangeConfig {
        batch_size: 100,
        channel_capacity: 16,
        flush_interval_ms: 1_000,
        max_parallelism: 128,
        in_flight_target: None,
    }
}

fn marker(created_us: i64) -> LatencyMarker {
    LatencyMarker {
        created_us,
        source: 3,
        subtask: 1,
    }
}

/// Everything waiting on one consumer's channels, in order.
fn drain(readers: &dyn Any) -> Vec<String> {
    let receivers = readers
        .downcast_ref::<Vec<ChannelEnd<i64>>>()
        .expect("receivers of i64");
    receivers
        .iter()
        .flat_map(|r| r.data().try_iter())
        .map(|m| format!("{m:?}"))
        .collect()
}

#[test]
fn latency_markers_go_to_one_channel_in_turn_behind_its_records() {
    let exchange = TypedExchange::<i64> {
        partitioning: Partitioning::Rebalance,
    };
    let mut set = exchange.channels(1, 3, cfg());
    let writer = set.writers.remove(0);
    let mut w = *writer
        .downcast::<Box<dyn Output<i64> + Send>>()
        .expect("a writer of i64");
    w.record(7, 70).unwrap();
    for t in 1..=4 {
        w.control(Control::LatencyMarker(marker(t))).unwrap();
    }
    let m = |t: i64| format!("{:?}", Msg::<i64>::LatencyMarker(marker(t)));
    assert_eq!(
        drain(&*set.readers[0]),
        vec![format!("{:?}", Msg::Batch(vec![(7i64, 70)])), m(1), m(4)]
    );
    assert_eq!(drain(&*set.readers[1]), vec![m(2)]);
    assert_eq!(drain(&*set.readers[2]), vec![m(3)]);
    // Watermarks still go to every channel.
    w.control(Control::Watermark(5)).unwrap();
    for r in &set.readers {
        assert_eq!(drain(&**r), vec!["Watermark(5)".to_string()]);
    }
}

#[test]
fn a_latency_marker_crosses_a_link_unchanged() {
    let m = marker(1_733_000_000_123_456);
    let mut buf = Vec::new();
    encode_msg(&Msg::<i64>::LatencyMarker(m), &mut buf).unwrap();
    assert_eq!(buf.len(), 17);
    match decode_msg::<i64>(&buf).unwrap() {
        Msg::LatencyMarker(back) => assert_eq!(back, m),
        other => panic!("decoded {other:?}"),
    }
    let err = decode_msg::<i64>(&buf[..16]).unwrap_err().to_string();
    assert!(
        err.contains("malformed channel message of 16 bytes"),
        "{err}"
    );
}

#[test]
fn a_gate_reports_a_latency_marker_without_delivering_a_record() {
    struct Count(usize);
    impl Output<i64> for Count {
        fn record(&mut self, _: i64, _: Timestamp) -> Result<()> {
            self.0 += 1;
            Ok(())
        }
        fn control(&mut self, _: Control) -> Result<()> {
            Ok(())
        }
    }
    let exchange = TypedExchange::<i64> {
        partitioning: Partitioning::Forward,
    };
    let mut set = exchange.channels(1, 1, cfg());
    let mut w = *set
        .writers
        .remove(0)
        .downcast::<Box<dyn Output<i64> + Send>>()
        .expect("a writer of i64");
    w.control(Control::LatencyMarker(marker(9))).unwrap();
    let input: Box<dyn Output<i64>> = Box::new(Count(0));
    let gate = exchange
        .bind(set.readers.remove(0), Box::new(input))
        .unwrap();
    let mut sel = crossbeam_channel::Select::new();
    gate.select(&mut sel, 0);
    let op = sel.select();
    assert_eq!(
        gate.complete(0, op).unwrap(),
        GateEvent::LatencyMarker(marker(9))
    );
}

#[test]
fn flush_sends_every_partly_filled_batch_and_a_tick_waits_for_the_interval() {
    let exchange = TypedExchange::<i64> {
        partitioning: Partitioning::Rebalance,
    };
    let mut set = exchange.channels(1, 2, cfg());
    let mut w = *set
        .writers
        .remove(0)
        .downcast::<Box<dyn Output<i64> + Send>>()
        .expect("a writer of i64");
    for v in 1..=3 {
        w.record(v, v * 10).unwrap();
    }
    let batch = |b: Vec<(i64, i64)>| format!("{:?}", Msg::Batch(b));
    // A tick a whole interval (1 s) after the last flush sends the partly filled batches.
    w.control(Control::Tick(5_000)).unwrap();
    assert_eq!(drain(&*set.readers[0]), vec![batch(vec![(1, 10), (3, 30)])]);
    assert_eq!(drain(&*set.readers[1]), vec![batch(vec![(2, 20)])]);
    // Within the interval they wait.
    w.record(4, 40).unwrap();
    w.record(5, 50).unwrap();
    w.control(Control::Tick(5_999)).unwrap();
    assert!(drain(&*set.readers[0]).is_empty());
    assert!(drain(&*set.readers[1]).is_empty());
    // Flush: every partly filled batch now, whatever the interval.
    w.control(Control::Flush).unwrap();
    assert_eq!(drain(&*set.readers[0]), vec![batch(vec![(5, 50)])]);
    assert_eq!(drain(&*set.readers[1]), vec![batch(vec![(4, 40)])]);
    // Nothing buffered: neither a flush nor a due tick sends an empty batch.
    w.control(Control::Flush).unwrap();
    w.control(Control::Tick(7_000)).unwrap();
    assert!(drain(&*set.readers[0]).is_empty());
    assert!(drain(&*set.readers[1]).is_empty());
}
