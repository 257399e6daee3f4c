//! The APPLY protocol on its own: repeated, concurrent, mismatched and abandoned applies.

use crate::support::{Schema, connect};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;
use weir_postgres::postgres::Transaction;
use weir_postgres::{Applied, ApplyError, EffectError, Store};

const LEASE: Duration = Duration::from_secs(60);

/// Credits `amount` to `account` and writes a ledger row under `key`; the response does
/// not depend on the order of applies, so two runs can be compared.
fn credit(
    schema: &str,
    key: &str,
    account: &str,
    amount: i64,
) -> impl FnMut(&mut Transaction<'_>) -> Result<Value, EffectError> {
    let (schema, key, account) = (schema.to_string(), key.to_string(), account.to_string());
    move |tx| {
        tx.execute(
            &format!(
                "INSERT INTO {schema}.accounts (id, balance) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance"
            ),
            &[&account, &amount],
        )?;
        tx.execute(
            &format!("INSERT INTO {schema}.ledger (key, account, amount) VALUES ($1, $2, $3)"),
            &[&key, &account, &amount],
        )?;
        Ok(json!({ "account": account, "credited": amount }))
    }
}

fn store(s: &Schema) -> Store {
    let st = Store::new(&s.keys_table(), LEASE).unwrap();
    st.ensure_schema(&mut connect()).unwrap();
    st
}

/// (key, account, amount): distinct keys, payload fixed per key.
fn payments() -> impl Strategy<Value = Vec<(String, String, i64)>> {
    prop::collection::btree_map("[a-z]{1,6}", (0u8..4, 1i64..1000), 1..25).prop_map(|m| {
        m.into_iter()
            .map(|(k, (a, v))| (k, format!("acct-{a}"), v))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Applying S, and S with every element repeated 1–3 times in a random order, leaves the
    /// same balances and ledger and gives every key the same response.
    #[test]
    fn duplicates_in_any_order_change_nothing(
        set in payments(),
        copies in prop::collection::vec(1usize..=3, 25),
        order_seed in any::<u64>(),
    ) {
        let mut once = Schema::new("apply_once");
        let mut dup = Schema::new("apply_dup");
        let (st1, st2) = (store(&once), store(&dup));
        let mut c = connect();

        let mut first: BTreeMap<String, Value> = BTreeMap::new();
        for (k, a, v) in &set {
            let r = st1.apply(&mut c, "credits", k, &format!("{a}/{v}"), &mut credit(&once.name, k, a, *v)).unwrap();
            prop_assert!(matches!(r, Applied::Fresh(_)));
            first.insert(k.clone(), r.response().clone());
        }

        let mut repeated: Vec<&(String, String, i64)> = set
            .iter()
            .zip(&copies)
            .flat_map(|(p, n)| std::iter::repeat_n(p, *n))
            .collect();
        // Fisher–Yates with a fixed generator.
        let mut x = order_seed | 1;
        for i in (1..repeated.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            repeated.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut fresh = 0;
        for (k, a, v) in repeated {
            let r = st2.apply(&mut c, "credits", k, &format!("{a}/{v}"), &mut credit(&dup.name, k, a, *v)).unwrap();
            if matches!(r, Applied::Fresh(_)) { fresh += 1; }
            prop_assert_eq!(r.response(), &first[k]);
        }
        prop_assert_eq!(fresh, set.len());
        prop_assert_eq!(once.balances(), dup.balances());
        let ledger = dup.ledger_counts();
        prop_assert_eq!(&once.ledger_counts(), &ledger);
        prop_assert!(ledger.values().all(|n| *n == 1));
    }
}

#[test]
fn a_concurrent_apply_of_the_same_key_gets_a_conflict_at_once() {
    let s = Schema::new("apply_conc");
    let st = store(&s);
    let (inside_tx, inside_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let name = s.name.clone();
    let st_a = st.clone();
    let a = std::thread::spawn(move || {
        let mut c = connect();
        let mut inner = credit(&name, "k1", "acct", 5);
        st_a.apply(&mut c, "credits", "k1", "h", &mut |tx| {
            let r = inner(tx);
            inside_tx.send(()).unwrap();
            // Hold the transaction open until the other apply has answered.
            go_rx.recv_timeout(Duration::from_secs(30)).unwrap();
            r
        })
    });
    inside_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let mut c = connect();
    let mut ran = false;
    let second = st.apply(&mut c, "credits", "k1", "h", &mut |_tx| {
        ran = true;
        Ok(Value::Null)
    });
    assert!(matches!(second, Err(ApplyError::Conflict)), "{second:?}");
    assert!(!ran);
    go_tx.send(()).unwrap();
    let first = a.join().unwrap().unwrap();
    assert_eq!(
        first,
        Applied::Fresh(json!({"account": "acct", "credited": 5}))
    );
    // The retry after the first committed finds the key DONE with its response.
    let again = st
        .apply(&mut c, "credits", "k1", "h", &mut |_tx| {
            panic!("must not run")
        })
        .unwrap();
    assert_eq!(
        again,
        Applied::Duplicate(json!({"account": "acct", "credited": 5}))
    );
    let mut s = s;
    assert_eq!(s.ledger_counts(), BTreeMap::from([("k1".to_string(), 1)]));
}

#[test]
fn the_same_key_with_another_payload_is_rejected() {
    let mut s = Schema::new("apply_reuse");
    let st = store(&s);
    let mut c = connect();
    st.apply(
        &mut c,
        "credits",
        "k",
        "hash-1",
        &mut credit(&s.name, "k", "a", 3),
    )
    .unwrap();
    let e = st
        .apply(
            &mut c,
            "credits",
            "k",
            "hash-2",
            &mut credit(&s.name, "k", "a", 4),
        )
        .unwrap_err();
    assert!(
        matches!(&e, ApplyError::KeyReuse { key } if key == "k"),
        "{e:?}"
    );
    assert!(e.to_string().contains("idempotency_error"), "{e}");
    assert_eq!(s.balances(), BTreeMap::from([("a".to_string(), 3)]));
    // The same key under another handler is another key.
    st.apply(
        &mut c,
        "refunds",
        "k",
        "hash-2",
        &mut credit(&s.name, "k", "a", 4),
    )
    .unwrap();
    assert_eq!(s.balances(), BTreeMap::from([("a".to_string(), 7)]));
}

#[test]
fn an_expired_lease_is_taken_over_and_a_live_one_is_a_conflict() {
    let mut s = Schema::new("apply_lease");
    let st = store(&s);
    let t = s.keys_table();
    // Rows a two-step worker left behind when it died (expired) or while it works (live).
    s.db.execute(
        &format!(
            "INSERT INTO {t} (handler, idempotency_key, state, payload_hash, lease_until) VALUES
             ('credits', 'dead', 'IN_PROGRESS', 'h', now() - interval '1 second'),
             ('credits', 'busy', 'IN_PROGRESS', 'h', now() + interval '1 hour')"
        ),
        &[],
    )
    .unwrap();
    let mut c = connect();
    let r = st
        .apply(
            &mut c,
            "credits",
            "dead",
            "h",
            &mut credit(&s.name, "dead", "a", 2),
        )
        .unwrap();
    assert_eq!(
        r,
        Applied::TakenOver(json!({"account": "a", "credited": 2}))
    );
    let row =
        s.db.query_one(
            &format!("SELECT state, lease_until IS NULL FROM {t} WHERE idempotency_key = 'dead'"),
            &[],
        )
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, bool>(1)),
        ("DONE".into(), true)
    );
    let e = st
        .apply(
            &mut c,
            "credits",
            "busy",
            "h",
            &mut credit(&s.name, "busy", "a", 9),
        )
        .unwrap_err();
    assert!(matches!(e, ApplyError::Conflict), "{e:?}");
    assert_eq!(s.ledger_counts(), BTreeMap::from([("dead".to_string(), 1)]));
}

#[test]
fn a_failed_effect_rolls_the_key_back() {
    let mut s = Schema::new("apply_fail");
    let st = store(&s);
    let mut c = connect();
    // Amount 0 breaks the ledger's check constraint.
    let e = st
        .apply(
            &mut c,
            "credits",
            "k",
            "h0",
            &mut credit(&s.name, "k", "a", 0),
        )
        .unwrap_err();
    assert!(matches!(e, ApplyError::Effect(_)), "{e:?}");
    assert!(e.to_string().contains("positive"), "{e}");
    let keys: i64 =
        s.db.query_one(&format!("SELECT count(*) FROM {}", s.keys_table()), &[])
            .unwrap()
            .get(0);
    assert_eq!(keys, 0);
    assert!(s.balances().is_empty());
    // The key is free: a corrected record applies.
    let r = st
        .apply(
            &mut c,
            "credits",
            "k",
            "h0",
            &mut credit(&s.name, "k", "a", 1),
        )
        .unwrap();
    assert!(matches!(r, Applied::Fresh(_)));
}

#[test]
fn cleanup_deletes_only_keys_past_the_retention() {
    let mut s = Schema::new("apply_clean");
    let st = store(&s);
    let t = s.keys_table();
    s.db.execute(
        &format!(
            "INSERT INTO {t} (handler, idempotency_key, state, created_at) VALUES
             ('credits', 'old-1', 'DONE', now() - interval '8 days'),
             ('credits', 'old-2', 'DONE', now() - interval '7 days 1 minute'),
             ('credits', 'new', 'DONE', now() - interval '6 days'),
             ('other', 'old-3', 'DONE', now() - interval '9 days')"
        ),
        &[],
    )
    .unwrap();
    let mut c = connect();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(st.cleanup(&mut c, "credits", week, 1).unwrap(), 2);
    assert_eq!(s.keys(), ["new", "old-3"]);
    let (n, age) = st.size(&mut c, "credits").unwrap();
    assert_eq!(n, 1);
    assert!(
        (6.0 * 86400.0..6.0 * 86400.0 + 60.0).contains(&age),
        "{age}"
    );
}
