//! q3, local item suggestion: who sells in category 10 from Oregon, Idaho or California,
//! and which auctions.
//!
//! ```sql
//! SELECT P.name, P.city, P.state, A.id
//! FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
//! WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
//! ```
//!
//! A regular (unwindowed) inner join, keyed by person id. Both sides are filtered first.
//! Person ids are unique, so the operator keeps one person per key and buffers an auction
//! only until its seller arrives (a seller may register after the auction): the result is
//! Flink's, with less state.

use super::{auctions, persons};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q3 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    pub city: String,
    pub state: String,
    pub id: i64,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    let sellers = persons(events)
        .filter(|p| matches!(p.state.as_str(), "OR" | "ID" | "CA"))
        .map(|p| (p.id, p.name, p.city, p.state));
    let auctions = auctions(events)
        .filter(|a| a.category == 10)
        .map(|a| (a.seller, a.id));
    sellers
        .key_by(|p| p.0)
        .connect(&auctions.key_by(|a| a.0))
        .process(LocalItems::default)
        .name("q3-join")
}

/// Per person id: the person (once seen) and the auctions waiting for them.
#[derive(Default)]
struct LocalItems {
    person: Option<ValueState<(String, String, String)>>,
    waiting: Option<ListState<i64>>,
}

type Seller = (i64, String, String, String);

impl CoProcessFunction<i64, Seller, (i64, i64), Row> for LocalItems {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.person = Some(state.value_state("person")?);
        self.waiting = Some(state.list_state("waiting-auctions")?);
        Ok(())
    }

    fn process1(
        &mut self,
        (_, name, city, state): Seller,
        ctx: &mut CoContext<'_, i64, Row>,
    ) -> weir::Result<()> {
        let waiting = self.waiting.as_mut().expect("opened");
        for id in waiting.get()? {
            ctx.emit(Row {
                name: name.clone(),
                city: city.clone(),
                state: state.clone(),
                id,
            });
        }
        waiting.clear()?;
        self.person
            .as_mut()
            .expect("opened")
            .set((name, city, state))
    }

    fn process2(
        &mut self,
        (_, id): (i64, i64),
        ctx: &mut CoContext<'_, i64, Row>,
    ) -> weir::Result<()> {
        match self.person.as_ref().expect("opened").get()? {
            Some((name, city, state)) => ctx.emit(Row {
                name,
                city,
                state,
                id,
            }),
            None => self.waiting.as_mut().expect("opened").add(id)?,
        }
        Ok(())
    }
}
