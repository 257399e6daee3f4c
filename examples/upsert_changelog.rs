//! The changelog both upsert examples (`upsert_totals`, `kafka_upsert_totals`) write: a
//! running total per account, as a table that changes. Included by them with `#[path]`;
//! not an example of its own.
//!
//! Input lines are `account,amount` (amount an i64) or `account,close`. An amount inserts
//! the account's row (total, number of updates) or updates it; `close` deletes it (a later
//! amount opens it again from zero).

use weir::prelude::*;

/// An account's row: (total, number of amounts since it was opened).
pub type Total = (i64, i64);

/// `account,amount` → (account, Some(amount)); `account,close` → (account, None).
pub fn parse(line: &str) -> weir::Result<(String, Option<i64>)> {
    let bad = |why: &str| {
        Error::Malformed(format!(
            "line {line:?}: {why}; expected account,amount or account,close"
        ))
    };
    let (account, what) = line.split_once(',').ok_or_else(|| bad("no comma"))?;
    let account = account.trim();
    if account.is_empty() {
        return Err(bad("empty account"));
    }
    let what = what.trim();
    if what == "close" {
        return Ok((account.to_string(), None));
    }
    let amount = what.parse().map_err(|_| bad("amount is not an integer"))?;
    Ok((account.to_string(), Some(amount)))
}

/// Keeps each account's row in keyed state and emits what happened to it.
struct RunningTotals {
    row: ValueState<Total>,
}

impl KeyedProcessFunction<String, (String, Option<i64>), Change<String, Total>> for RunningTotals {
    fn process(
        &mut self,
        (_, amount): (String, Option<i64>),
        ctx: &mut KeyedContext<'_, String, Change<String, Total>>,
    ) -> weir::Result<()> {
        let key = ctx.key().clone();
        let old = self.row.get()?;
        match (amount, old) {
            (Some(a), None) => {
                let value = (a, 1);
                self.row.set(value)?;
                ctx.emit(Change::Insert { key, value });
            }
            (Some(a), Some(old)) => {
                let new = (old.0 + a, old.1 + 1);
                self.row.set(new)?;
                ctx.emit(Change::Update { key, old, new });
            }
            (None, Some(old)) => {
                self.row.clear()?;
                ctx.emit(Change::Delete { key, old });
            }
            (None, None) => {} // closing an account that is not open changes nothing
        }
        Ok(())
    }
}

/// The changelog of the running totals of `lines` (read at parallelism 1: the order of the
/// lines of one account is the order of its changes).
pub fn totals_changelog(lines: Stream<String>) -> Stream<Change<String, Total>> {
    lines
        .try_map(|line| parse(&line))
        .name("parse")
        .uid("parse")
        // Chained to the reader: a parser per subtask behind a round-robin would let a
        // later line of an account overtake an earlier one on the way to its state.
        .parallelism(1)
        .key_by(|(account, _): &(String, Option<i64>)| account.clone())
        .process_with_state(|state| {
            Ok(RunningTotals {
                row: state.value_state("row")?,
            })
        })
        .name("running-totals")
        .uid("running-totals")
}
