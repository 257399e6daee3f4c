//! Two-input operators: connect + CoProcessFunction (plain, with one input broadcast) and
//! keyed connect with shared per-key state. The functions are written so their output
//! does not depend on how the two inputs interleave, so outputs are exact.

use weir::prelude::*;
use weir_tests::run;

/// Maps each input to a string: a stateless co-map.
struct Describe;

impl CoProcessFunction<(), i64, String, String> for Describe {
    fn process1(&mut self, v: i64, ctx: &mut CoContext<'_, (), String>) -> Result<()> {
        ctx.emit(format!("int:{v}"));
        Ok(())
    }
    fn process2(&mut self, v: String, ctx: &mut CoContext<'_, (), String>) -> Result<()> {
        ctx.emit(format!("str:{}", v.to_uppercase()));
        Ok(())
    }
}

#[test]
fn connect_runs_a_co_process_function_over_both_inputs() {
    let env = Env::new().parallelism(2);
    let ints = env.from_collection(vec![1i64, 2, 3]);
    let strs = env.from_collection(vec!["a".to_string(), "b".into()]);
    let out = ints.connect(&strs).process(|| Describe).collect();
    run(&env).unwrap();
    assert_eq!(
        out.sorted(),
        vec!["int:1", "int:2", "int:3", "str:A", "str:B"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    );
}

/// Matches values against threshold rules, whichever arrives first: every (rule, value)
/// pair seen by this subtask is considered exactly once (a symmetric join over
/// per-subtask list state).
#[derive(Default)]
struct Thresholds {
    values: Option<ListState<i64>>,
    rules: Option<ListState<(String, i64)>>,
}

impl CoProcessFunction<(), i64, (String, i64), (String, i64)> for Thresholds {
    fn open(&mut self, state: &mut StateContext<()>) -> Result<()> {
        self.values = Some(state.list_state("values")?);
        self.rules = Some(state.list_state("rules")?);
        Ok(())
    }
    fn process1(&mut self, v: i64, ctx: &mut CoContext<'_, (), (String, i64)>) -> Result<()> {
        for (name, min) in self.rules.as_ref().unwrap().get()? {
            if v >= min {
                ctx.emit((name, v));
            }
        }
        self.values.as_mut().unwrap().add(v)
    }
    fn process2(
        &mut self,
        (name, min): (String, i64),
        ctx: &mut CoContext<'_, (), (String, i64)>,
    ) -> Result<()> {
        for v in self.values.as_ref().unwrap().get()? {
            if v >= min {
                ctx.emit((name.clone(), v));
            }
        }
        self.rules.as_mut().unwrap().add((name, min))
    }
}

#[test]
fn connect_with_a_broadcast_input_reaches_every_subtask() {
    let env = Env::new().parallelism(3);
    let values = env
        .from_collection((1..=12i64).collect::<Vec<_>>())
        .rebalance();
    let rules = env
        .from_collection(vec![("ge5".to_string(), 5i64), ("ge10".to_string(), 10)])
        .broadcast();
    let out = values
        .connect(&rules)
        .process(Thresholds::default)
        .collect();
    run(&env).unwrap();
    // Each value sits in exactly one of the 3 subtasks; each rule is in all of them, so
    // every matching pair comes out exactly once.
    let mut expected: Vec<(String, i64)> = (5..=12).map(|v| ("ge5".to_string(), v)).collect();
    expected.extend((10..=12).map(|v| ("ge10".to_string(), v)));
    expected.sort();
    assert_eq!(out.sorted(), expected);
}

/// Enriches orders with their customer's name, whichever arrives first: orders wait in
/// list state until the name (value state) is known.
#[derive(Default)]
struct Enrich {
    name: Option<ValueState<String>>,
    pending: Option<ListState<u32>>,
}

impl CoProcessFunction<u32, (u32, u32), (u32, String), (String, u32)> for Enrich {
    fn open(&mut self, state: &mut StateContext<u32>) -> Result<()> {
        self.name = Some(state.value_state("name")?);
        self.pending = Some(state.list_state("pending")?);
        Ok(())
    }
    fn process1(
        &mut self,
        (customer, order): (u32, u32),
        ctx: &mut CoContext<'_, u32, (String, u32)>,
    ) -> Result<()> {
        assert_eq!(*ctx.key(), customer);
        match self.name.as_ref().unwrap().get()? {
            Some(name) => ctx.emit((name, order)),
            None => self.pending.as_mut().unwrap().add(order)?,
        }
        Ok(())
    }
    fn process2(
        &mut self,
        (customer, name): (u32, String),
        ctx: &mut CoContext<'_, u32, (String, u32)>,
    ) -> Result<()> {
        assert_eq!(*ctx.key(), customer);
        let pending = self.pending.as_mut().unwrap();
        for order in pending.get()? {
            ctx.emit((name.clone(), order));
        }
        pending.clear()?;
        self.name.as_mut().unwrap().set(name)
    }
}

#[test]
fn keyed_connect_shares_state_per_key_across_both_inputs() {
    let env = Env::new().parallelism(3);
    let orders = env.from_collection(vec![(1u32, 100u32), (2, 200), (1, 101), (3, 300), (2, 201)]);
    let customers = env.from_collection(vec![
        (2u32, "bo".to_string()),
        (1, "ann".into()),
        (4, "dee".into()),
    ]);
    let out = orders
        .key_by(|o| o.0)
        .connect(&customers.key_by(|c| c.0))
        .process(Enrich::default)
        .name("enrich")
        .collect();
    run(&env).unwrap();
    // Customer 3 never arrives; customer 4 has no orders.
    let e = |n: &str, o| (n.to_string(), o);
    assert_eq!(
        out.sorted(),
        vec![e("ann", 100), e("ann", 101), e("bo", 200), e("bo", 201)]
    );
}
