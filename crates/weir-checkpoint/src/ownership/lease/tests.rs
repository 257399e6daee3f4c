use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const LEASE: Duration = Duration::from_millis(300);

fn rec(token: &str, renewed_ms: u64) -> OwnerRecord {
    OwnerRecord {
        token: token.into(),
        job: "job".into(),
        host: "h".into(),
        machine: None,
        pid: 1,
        pid_start: None,
        since_ms: 0,
        renewed_ms,
        lease_ms: LEASE.as_millis() as u64,
        released: false,
        dirs: vec![],
    }
}

fn seen(seq: u64, r: OwnerRecord) -> Seen {
    Seen::Record { seq, record: r }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn an_empty_directory_is_taken_with_record_1() {
    let t = Instant::now();
    let mut l = Lease::new("me", LEASE);
    let next = l.observe(t, 0, &Seen::Nothing, Liveness::Unknown);
    assert_eq!(
        next,
        Next::Write {
            seq: 1,
            released: false
        }
    );
    assert_eq!(l.wrote(t, Outcome::Created { current: 1 }), Next::Held);
    assert_eq!(l.held(), Some(1));
}

#[test]
fn a_fresh_record_of_a_live_owner_is_refused_at_once() {
    let t = Instant::now();
    for live in [Liveness::Alive, Liveness::Unknown] {
        let mut l = Lease::new("me", LEASE);
        let next = l.observe(t, 1_100, &seen(4, rec("other", 1_000)), live);
        let Next::Refused(r) = next else {
            panic!("{next:?}")
        };
        assert_eq!(r.record.unwrap().token, "other");
        assert!(!r.renewed_while_watched);
    }
}

#[test]
fn released_or_gone_owners_are_taken_over_at_once() {
    let t = Instant::now();
    let mut released = rec("other", 1_000);
    released.released = true;
    let mut l = Lease::new("me", LEASE);
    assert!(matches!(
        l.observe(t, 1_000, &seen(4, released), Liveness::Alive),
        Next::Write { seq: 5, .. }
    ));
    let mut l = Lease::new("me", LEASE);
    assert!(matches!(
        l.observe(t, 1_000, &seen(4, rec("other", 1_000)), Liveness::Gone),
        Next::Write { seq: 5, .. }
    ));
}

#[test]
fn a_stale_record_is_watched_for_a_whole_lease_then_taken() {
    let t = Instant::now();
    let mut l = Lease::new("me", LEASE);
    let stale = seen(4, rec("other", 1_000));
    let Next::Look { until, started, .. } = l.observe(t, 5_000, &stale, Liveness::Alive) else {
        panic!()
    };
    assert!(started);
    assert_eq!(until, t + LEASE);
    let Next::Look { started, .. } = l.observe(t + ms(299), 5_299, &stale, Liveness::Alive) else {
        panic!()
    };
    assert!(!started);
    assert!(matches!(
        l.observe(t + ms(300), 5_300, &stale, Liveness::Alive),
        Next::Write { seq: 5, .. }
    ));
    assert_eq!(
        l.wrote(t + ms(301), Outcome::Created { current: 5 }),
        Next::Held
    );
}

#[test]
fn the_watch_uses_the_owners_lease_not_ours() {
    let t = Instant::now();
    let mut l = Lease::new("me", ms(100));
    let mut long = rec("other", 0);
    long.lease_ms = 10_000;
    let Next::Look { until, .. } = l.observe(t, 20_000, &seen(1, long), Liveness::Unknown) else {
        panic!()
    };
    assert_eq!(until, t + ms(10_000));
}

#[test]
fn an_owner_that_renews_while_watched_is_alive() {
    // Its clock is far behind ours: every record it writes looks stale.
    let t = Instant::now();
    let mut l = Lease::new("me", LEASE);
    l.observe(t, 90_000, &seen(4, rec("other", 1_000)), Liveness::Unknown);
    let next = l.observe(
        t + ms(100),
        90_100,
        &seen(5, rec("other", 1_100)),
        Liveness::Unknown,
    );
    let Next::Refused(r) = next else {
        panic!("{next:?}")
    };
    assert!(r.renewed_while_watched);
}

#[test]
fn a_half_written_record_is_judged_again_once_readable() {
    let t = Instant::now();
    let mut l = Lease::new("me", LEASE);
    assert!(matches!(
        l.observe(t, 1_000, &Seen::Unreadable { seq: 3 }, Liveness::Unknown),
        Next::Look { started: true, .. }
    ));
    assert!(matches!(
        l.observe(
            t + ms(10),
            1_010,
            &seen(3, rec("other", 1_000)),
            Liveness::Unknown
        ),
        Next::Refused(_)
    ));
    // A record that stays unreadable for a whole lease is taken over.
    let mut l = Lease::new("me", LEASE);
    l.observe(t, 0, &Seen::Unreadable { seq: 3 }, Liveness::Unknown);
    assert!(matches!(
        l.observe(
            t + LEASE,
            0,
            &Seen::Unreadable { seq: 3 },
            Liveness::Unknown
        ),
        Next::Write { seq: 4, .. }
    ));
}

#[test]
fn losing_the_race_to_write_means_looking_again() {
    let t = Instant::now();
    let mut l = Lease::new("me", LEASE);
    l.observe(t, 0, &Seen::Nothing, Liveness::Unknown);
    assert!(matches!(l.wrote(t, Outcome::Exists), Next::Look { .. }));
    // The winner's record is fresh.
    assert!(matches!(
        l.observe(t, 10, &seen(1, rec("winner", 5)), Liveness::Unknown),
        Next::Refused(_)
    ));
    // Created, but someone wrote a higher record meanwhile (deleted numbers reused).
    let mut l = Lease::new("me", LEASE);
    l.observe(t, 0, &Seen::Nothing, Liveness::Unknown);
    assert!(matches!(
        l.wrote(t, Outcome::Created { current: 9 }),
        Next::Look { .. }
    ));
}

fn holding(t: Instant, seq: u64) -> Lease {
    let mut l = Lease::new("me", LEASE);
    let mut prev = rec("other", 0);
    prev.released = true;
    l.observe(t, 0, &seen(seq - 1, prev), Liveness::Unknown);
    assert_eq!(l.wrote(t, Outcome::Created { current: seq }), Next::Held);
    l
}

#[test]
fn renewal_every_third_of_the_lease_and_loss_on_a_lost_race() {
    let t = Instant::now();
    let mut l = holding(t, 2);
    assert!(!l.renew_due(t + ms(99)));
    assert!(l.renew_due(t + ms(100)));
    assert!(matches!(
        l.renew(t + ms(100)),
        Next::Write {
            seq: 3,
            released: false
        }
    ));
    assert_eq!(
        l.wrote(t + ms(101), Outcome::Created { current: 3 }),
        Next::Held
    );
    assert!(
        !l.renew_due(t + ms(199)),
        "the lease counts from the renewal"
    );
    assert!(matches!(l.renew(t + ms(200)), Next::Write { seq: 4, .. }));
    assert_eq!(l.wrote(t + ms(200), Outcome::Exists), Next::Lost(None));
    assert_eq!(l.held(), None);
    assert!(matches!(
        l.verify(t + ms(201), &seen(4, rec("me", 0))),
        Next::Lost(_)
    ));
}

#[test]
fn verify_checks_the_current_record_and_renews_after_half_a_lease() {
    let t = Instant::now();
    let mut l = holding(t, 2);
    assert_eq!(l.verify(t + ms(10), &seen(2, rec("me", 0))), Next::Held);
    assert!(matches!(
        l.verify(t + ms(150), &seen(2, rec("me", 0))),
        Next::Write { seq: 3, .. }
    ));
    assert_eq!(
        l.wrote(t + ms(150), Outcome::Created { current: 3 }),
        Next::Held
    );
    // A thawed owner: someone took over after it went quiet.
    let next = l.verify(t + ms(5_000), &seen(4, rec("taker", 4_000)));
    let Next::Lost(Some(r)) = next else {
        panic!("{next:?}")
    };
    assert_eq!(r.token, "taker");
    // A record of ours that is not the current one also means lost.
    let mut l = holding(t, 2);
    assert!(matches!(l.verify(t, &seen(3, rec("me", 0))), Next::Lost(_)));
}

#[test]
fn release_writes_a_release_record() {
    let t = Instant::now();
    let mut l = holding(t, 2);
    assert_eq!(
        l.release(t),
        Next::Write {
            seq: 3,
            released: true
        }
    );
    assert_eq!(l.wrote(t, Outcome::Created { current: 3 }), Next::Released);
    assert_eq!(Lease::new("x", LEASE).release(t), Next::Released);
}

// ---- property: many processes against one model directory ----

#[derive(Debug, Clone)]
struct Proc {
    lease: Lease,
    token: String,
    machine: u8,
    skew_ms: i64,
    dead: bool,
    /// What the process must do when it runs next.
    next: Next,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Time passes.
    Sleep(u64),
    /// Process `p` runs one step.
    Run(usize),
    /// Process `p` dies (SIGKILL): it never runs again.
    Kill(usize),
    /// Process `p` gives the lease up if it holds it.
    Release(usize),
    /// Process `p` checks its lease before a durable act.
    Verify(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..400).prop_map(Op::Sleep),
        8 => (0usize..3).prop_map(Op::Run),
        1 => (0usize..3).prop_map(Op::Kill),
        1 => (0usize..3).prop_map(Op::Release),
        3 => (0usize..3).prop_map(Op::Verify),
    ]
}

struct Model {
    t0: Instant,
    now_ms: u64,
    dir: BTreeMap<u64, OwnerRecord>,
    procs: Vec<Proc>,
}

impl Model {
    fn current(&self) -> Seen {
        match self.dir.iter().next_back() {
            Some((seq, r)) => seen(*seq, r.clone()),
            None => Seen::Nothing,
        }
    }
    fn now(&self) -> Instant {
        self.t0 + ms(self.now_ms)
    }
    fn wall(&self, p: usize) -> u64 {
        (self.now_ms as i64 + 1_000_000 + self.procs[p].skew_ms) as u64
    }
    fn liveness(&self, p: usize, seen: &Seen) -> Liveness {
        let Some(r) = seen.record() else {
            return Liveness::Unknown;
        };
        let Some(owner) = self.procs.iter().find(|q| q.token == r.token) else {
            return Liveness::Unknown;
        };
        match (owner.machine == self.procs[p].machine, owner.dead) {
            (true, true) => Liveness::Gone,
            (true, false) => Liveness::Alive,
            (false, _) => Liveness::Unknown,
        }
    }
    /// Others that believe they hold the lease within its term (and run).
    fn sure_holders(&self, except: usize) -> Vec<String> {
        let now = self.now();
        self.procs
            .iter()
            .enumerate()
            .filter(|(i, q)| *i != except && !q.dead)
            .filter_map(|(_, q)| match q.lease.state {
                State::Held { renewed, .. } if now < renewed + LEASE => Some(q.token.clone()),
                _ => None,
            })
            .collect()
    }
    fn create(&mut self, p: usize, seq: u64, released: bool) -> Outcome {
        if self.dir.contains_key(&seq) {
            return Outcome::Exists;
        }
        let mut r = rec(&self.procs[p].token, self.wall(p));
        r.released = released;
        self.dir.insert(seq, r);
        // Owners delete records older than their previous one.
        self.dir.retain(|s, _| *s + 1 >= seq);
        Outcome::Created {
            current: *self.dir.keys().next_back().expect("just written"),
        }
    }
    fn step(&mut self, p: usize) -> Result<(), String> {
        let now = self.now();
        let next = self.procs[p].next.clone();
        let after = match next {
            Next::Write { seq, released } => {
                let outcome = self.create(p, seq, released);
                let took = !released
                    && outcome == (Outcome::Created { current: seq })
                    && !matches!(
                        self.procs[p].lease.state,
                        State::Writing {
                            purpose: Purpose::Renew,
                            ..
                        }
                    );
                if took {
                    let others = self.sure_holders(p);
                    if !others.is_empty() {
                        return Err(format!(
                            "{} took over while {others:?} still held the lease",
                            self.procs[p].token
                        ));
                    }
                }
                self.procs[p].lease.wrote(now, outcome)
            }
            Next::Look { at, .. } if now < at => return Ok(()),
            Next::Look { .. } => {
                let seen = self.current();
                let live = self.liveness(p, &seen);
                let wall = self.wall(p);
                self.procs[p].lease.observe(now, wall, &seen, live)
            }
            Next::Held if self.procs[p].lease.renew_due(now) => self.procs[p].lease.renew(now),
            other => other,
        };
        self.procs[p].next = after;
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever the schedule, freezes (a process not run for a while), kills and clock skew:
    /// nobody takes a directory over while another running process is within the term of
    /// its lease, and a process that verified is the owner of the current record.
    #[test]
    fn never_two_owners_within_a_term(
        ops in prop::collection::vec(op(), 1..300),
        skews in prop::collection::vec(-5_000i64..5_000, 3),
        machines in prop::collection::vec(0u8..2, 3),
    ) {
        let t0 = Instant::now();
        let procs = (0..3)
            .map(|i| {
                let token = format!("p{i}");
                Proc {
                    lease: Lease::new(&token, LEASE),
                    token,
                    machine: machines[i],
                    skew_ms: skews[i],
                    dead: false,
                    next: Next::Look { at: t0, until: t0, started: false },
                }
            })
            .collect();
        let mut m = Model { t0, now_ms: 0, dir: BTreeMap::new(), procs };
        let mut taken = 0;
        for op in ops {
            match op {
                Op::Sleep(d) => m.now_ms += d,
                Op::Run(p) if !m.procs[p].dead => {
                    m.step(p).map_err(TestCaseError::fail)?;
                }
                Op::Kill(p) => m.procs[p].dead = true,
                Op::Release(p) if !m.procs[p].dead && m.procs[p].next == Next::Held => {
                    let now = m.now();
                    m.procs[p].next = m.procs[p].lease.release(now);
                }
                Op::Verify(p) if !m.procs[p].dead && m.procs[p].next == Next::Held => {
                    let now = m.now();
                    let current = m.current();
                    let next = m.procs[p].lease.verify(now, &current);
                    if next == Next::Held {
                        taken += 1;
                        prop_assert_eq!(
                            current.record().map(|r| r.token.clone()),
                            Some(m.procs[p].token.clone()),
                            "a verified holder owns the current record"
                        );
                        let others = m.sure_holders(p);
                        prop_assert!(others.is_empty(), "{} and {:?} both hold", m.procs[p].token, others);
                    }
                    m.procs[p].next = next;
                }
                _ => {}
            }
        }
        let _ = taken;
    }
}

/// The property test's model is not vacuous: a frozen owner is taken over, and a live one
/// is not.
#[test]
fn the_model_takes_over_from_a_frozen_owner_only() {
    let t0 = Instant::now();
    let mk = |i: usize| Proc {
        lease: Lease::new(&format!("p{i}"), LEASE),
        token: format!("p{i}"),
        machine: i as u8,
        skew_ms: 0,
        dead: false,
        next: Next::Look {
            at: t0,
            until: t0,
            started: false,
        },
    };
    let mut m = Model {
        t0,
        now_ms: 0,
        dir: BTreeMap::new(),
        procs: vec![mk(0), mk(1)],
    };
    m.step(0).unwrap();
    m.step(0).unwrap();
    assert_eq!(m.procs[0].next, Next::Held);
    // p1 is refused while p0 renews.
    for _ in 0..10 {
        m.now_ms += 50;
        m.step(0).unwrap();
        m.step(0).unwrap();
        m.step(1).unwrap();
    }
    assert!(matches!(m.procs[1].next, Next::Refused(_)));
    // p0 freezes; a new p2 on another host watches, then takes over.
    m.procs.push(mk(2));
    m.now_ms += 400;
    for _ in 0..40 {
        m.now_ms += 20;
        m.step(2).unwrap();
    }
    assert_eq!(m.procs[2].next, Next::Held);
    // p0 thaws: its renewal fails.
    m.step(0).unwrap();
    m.step(0).unwrap();
    assert!(
        matches!(m.procs[0].next, Next::Lost(_)),
        "{:?}",
        m.procs[0].next
    );
}

#[test]
fn an_unreadable_record_is_trusted_only_for_half_a_lease_after_the_last_write() {
    let t = Instant::now();
    let l = Lease::new("me", LEASE);
    assert!(!l.held_without_reading(t), "not held yet");
    let mut l = holding(t, 2);
    assert!(l.held_without_reading(t + ms(149)));
    assert!(!l.held_without_reading(t + ms(150)));
    // A renewal counts from its write.
    assert!(matches!(l.renew(t + ms(140)), Next::Write { seq: 3, .. }));
    assert_eq!(
        l.wrote(t + ms(140), Outcome::Created { current: 3 }),
        Next::Held
    );
    assert!(l.held_without_reading(t + ms(289)));
    assert!(!l.held_without_reading(t + ms(290)));
    // Lost is lost.
    assert!(matches!(l.renew(t + ms(200)), Next::Write { seq: 4, .. }));
    assert_eq!(l.wrote(t + ms(200), Outcome::Exists), Next::Lost(None));
    assert!(!l.held_without_reading(t + ms(201)));
}
