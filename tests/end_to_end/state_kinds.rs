//! Reducing state and state with a time-to-live, as a keyed function uses them, on the
//! in-memory backend and on RocksDB.

use weir::prelude::*;
use weir_tests::run;

/// Per key: the maximum so far (reducing state), and every value kept in value, list, map
/// and reducing states twice — with a TTL of an hour (nothing expires during the test) and
/// a TTL of zero (everything is expired as soon as it is written).
#[derive(Default)]
struct Keep {
    max: Option<ReducingState<i64>>,
    live_value: Option<ValueState<i64>>,
    live_list: Option<ListState<i64>>,
    live_map: Option<MapState<i64, i64>>,
    live_sum: Option<ReducingState<i64>>,
    dead_value: Option<ValueState<i64>>,
    dead_list: Option<ListState<i64>>,
    dead_map: Option<MapState<i64, i64>>,
    dead_sum: Option<ReducingState<i64>>,
}

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
const ZERO: std::time::Duration = std::time::Duration::ZERO;

impl KeyedProcessFunction<String, (String, i64), String> for Keep {
    fn open(&mut self, s: &mut StateContext<String>) -> Result<()> {
        self.max = Some(s.reducing_state("max", |a: i64, b| a.max(b))?);
        self.live_value = Some(s.value_state_with_ttl("live-value", HOUR)?);
        self.live_list = Some(s.list_state_with_ttl("live-list", HOUR)?);
        self.live_map = Some(s.map_state_with_ttl("live-map", HOUR)?);
        self.live_sum = Some(s.reducing_state_with_ttl("live-sum", |a, b| a + b, HOUR)?);
        self.dead_value = Some(s.value_state_with_ttl("dead-value", ZERO)?);
        self.dead_list = Some(s.list_state_with_ttl("dead-list", ZERO)?);
        self.dead_map = Some(s.map_state_with_ttl("dead-map", ZERO)?);
        self.dead_sum = Some(s.reducing_state_with_ttl("dead-sum", |a, b| a + b, ZERO)?);
        Ok(())
    }

    fn process(
        &mut self,
        (key, v): (String, i64),
        ctx: &mut KeyedContext<'_, String, String>,
    ) -> Result<()> {
        let max = self.max.as_mut().unwrap();
        max.add(v)?;
        let (lv, ll, lm, ls) = (
            self.live_value.as_mut().unwrap(),
            self.live_list.as_mut().unwrap(),
            self.live_map.as_mut().unwrap(),
            self.live_sum.as_mut().unwrap(),
        );
        let before = lv.get()?;
        lv.set(v)?;
        ll.add(v)?;
        lm.put(v % 2, v)?;
        ls.add(v)?;
        let (dv, dl, dm, ds) = (
            self.dead_value.as_mut().unwrap(),
            self.dead_list.as_mut().unwrap(),
            self.dead_map.as_mut().unwrap(),
            self.dead_sum.as_mut().unwrap(),
        );
        dv.set(v)?;
        dl.add(v)?;
        dm.put(v % 2, v)?;
        dm.put(10, v)?;
        ds.add(v)?;
        ctx.emit(format!(
            "{key} max={:?} previous={before:?} list={:?} map={:?} sum={:?} | expired: \
             value={:?} list={:?} map={:?} removed={:?} sum={:?}",
            max.get()?,
            ll.get()?,
            lm.entries()?,
            ls.get()?,
            dv.get()?,
            dl.get()?,
            dm.entries()?,
            dm.remove(&10)?,
            ds.get()?,
        ));
        Ok(())
    }
}

fn run_on(backend: &str) -> Vec<String> {
    let env = Env::new()
        .parallelism(2)
        .state_backend(BackendKind::parse(backend).unwrap());
    let input = [("a", 3), ("b", 5), ("a", 9), ("a", 4), ("b", 1)]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
    let out = env
        .from_collection(input)
        .key_by(|(k, _)| k.clone())
        .process(Keep::default)
        .collect();
    run(&env).unwrap();
    out.sorted()
}

fn expected() -> Vec<String> {
    let dead = "| expired: value=None list=[] map=[] removed=None sum=None";
    let mut e: Vec<String> = [
        "a max=Some(3) previous=None list=[3] map=[(1, 3)] sum=Some(3)",
        "a max=Some(9) previous=Some(3) list=[3, 9] map=[(1, 9)] sum=Some(12)",
        "a max=Some(9) previous=Some(9) list=[3, 9, 4] map=[(0, 4), (1, 9)] sum=Some(16)",
        "b max=Some(5) previous=None list=[5] map=[(1, 5)] sum=Some(5)",
        "b max=Some(5) previous=Some(5) list=[5, 1] map=[(1, 1)] sum=Some(6)",
    ]
    .iter()
    .map(|l| format!("{l} {dead}"))
    .collect();
    e.sort();
    e
}

#[test]
fn reducing_and_ttl_states_on_the_memory_backend() {
    assert_eq!(run_on("memory"), expected());
}

#[test]
fn reducing_and_ttl_states_on_rocksdb() {
    assert_eq!(run_on("rocksdb"), expected());
}
