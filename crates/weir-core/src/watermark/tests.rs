use super::*;

/// What reached the output of a watermark operator.
#[derive(Clone, Default)]
struct Seen(Rc<std::cell::RefCell<Vec<String>>>);

impl Output<i64> for Seen {
    fn record(&mut self, value: i64, ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push(format!("r{value}@{ts}"));
        Ok(())
    }
    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => self.0.borrow_mut().push(format!("w{w}")),
            Control::Idle(i) => self.0.borrow_mut().push(format!("idle {i}")),
            _ => {}
        }
        Ok(())
    }
}

fn per_record() -> WatermarkStrategy<i64> {
    WatermarkStrategy::bounded_out_of_orderness(2)
        .with_timestamps(|v| *v)
        .with_per_record_watermarks()
}

#[test]
fn per_record_watermarks_follow_each_record_that_advances_them() {
    let seen = Seen::default();
    let mut op = per_record().operator(Box::new(seen.clone()));
    for v in [10, 8, 13, 12] {
        op.record(v, NO_TIMESTAMP).unwrap();
    }
    assert_eq!(
        *seen.0.borrow(),
        ["r10@10", "w7", "r8@8", "r13@13", "w10", "r12@12"]
    );
}

#[test]
fn a_restored_watermark_goes_out_first_and_is_never_undercut() {
    let seen = Seen::default();
    let mut op = per_record().operator(Box::new(seen.clone()));
    let mut hooks = op.hooks();
    op.restore(20);
    op.control(Control::Tick(1)).unwrap();
    // 15 - 2 - 1 = 12 < 20: no watermark; 30 advances it.
    op.record(15, NO_TIMESTAMP).unwrap();
    op.record(30, NO_TIMESTAMP).unwrap();
    assert_eq!(*seen.0.borrow(), ["w20", "r15@15", "r30@30", "w27"]);
    let snap = hooks.snapshot(CheckpointId(1)).unwrap();
    let state = snap.operator.unwrap();
    // Rescaled: the minimum over the old subtasks.
    let other = codec::encode(&25i64).unwrap();
    assert_eq!(restored_watermark(&[state, other]).unwrap(), Some(25));
    assert_eq!(restored_watermark(&[]).unwrap(), None);
}

#[test]
fn a_custom_generator_emits_on_events_and_periodically() {
    struct EveryOther(u32, Timestamp);
    impl WatermarkGenerator<i64> for EveryOther {
        fn on_event(&mut self, _: &i64, ts: Timestamp, out: &mut WatermarkOutput) {
            self.0 += 1;
            self.1 = self.1.max(ts);
            if self.0.is_multiple_of(2) {
                out.emit_watermark(ts - 1);
            }
        }
        fn on_periodic(&mut self, out: &mut WatermarkOutput) {
            out.emit_watermark(self.1);
        }
    }
    let seen = Seen::default();
    let mut op = WatermarkStrategy::for_generator(|| EveryOther(0, MIN_WATERMARK))
        .with_timestamps(|v: &i64| *v)
        .operator(Box::new(seen.clone()));
    op.record(5, NO_TIMESTAMP).unwrap();
    op.record(6, NO_TIMESTAMP).unwrap();
    op.control(Control::Tick(1_000)).unwrap();
    assert_eq!(*seen.0.borrow(), ["r5@5", "r6@6", "w5", "w6"]);
}

#[test]
fn min_over_channels() {
    let mut t = WatermarkTracker::new(3);
    assert_eq!(t.on_watermark(0, 5), None);
    assert_eq!(t.on_watermark(1, 3), None);
    assert_eq!(t.on_watermark(2, 4), Some(3));
    assert_eq!(t.on_watermark(1, 9), Some(4));
    assert_eq!(t.on_watermark(1, 2), None, "watermarks never go back");
    assert_eq!(t.on_end(2), Some(5));
    assert_eq!(t.on_end(0), Some(9));
    assert_eq!(t.on_end(1), Some(MAX_WATERMARK));
}

#[test]
fn idle_channels_do_not_hold_back() {
    let mut t = WatermarkTracker::new(2);
    t.on_watermark(0, 100);
    assert!(!t.all_idle());
    assert_eq!(t.on_idle(1, true), Some(100));
    assert_eq!(t.on_idle(0, true), None);
    assert!(t.all_idle());
    // a watermark from a previously idle channel makes it active again; channel 0 is
    // still idle, so channel 1 alone decides
    assert_eq!(t.on_watermark(1, 150), Some(150));
    assert!(!t.all_idle());
}

#[test]
fn only_a_watermark_assigners_own_snapshot_counts_as_watermark_only() {
    let mut hooks = WatermarkHooks {
        emitted: Rc::new(Cell::new(1_234)),
    };
    let snap = hooks.snapshot(CheckpointId(1)).unwrap();
    assert!(is_watermark_only(&snap));
    let mut with_state = snap.clone();
    with_state.keyed.insert("t".into(), Default::default());
    assert!(!is_watermark_only(&with_state));
    let mut other_bytes = snap.clone();
    other_bytes.description = Some("position 1234".into());
    assert!(!is_watermark_only(&other_bytes));
    assert!(!is_watermark_only(&OperatorSnapshot::default()));
}
