//! q4, average winning price per category.
//!
//! ```sql
//! SELECT Q.category, AVG(Q.final)
//! FROM (
//!     SELECT MAX(B.price) AS final, A.category
//!     FROM auction A, bid B
//!     WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
//!     GROUP BY A.id, A.category
//! ) Q
//! GROUP BY Q.category;
//! ```
//!
//! The plan is event-time driven ([`winning_bids`]): the join is keyed by auction id and an
//! auction is kept until the watermark passes its `expires`; then its highest qualifying
//! bid is final and goes on. Flink plans a regular join that keeps every auction and bid
//! forever; the final result is the same. The final prices are then averaged per category
//! (sum / count, truncated, as SQL `AVG` over BIGINT): an updating result, one row per
//! category.

use super::Change;
use super::winning::{FLINK, winning_bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q4 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub category: i64,
    pub avg_final: i64,
}

/// The query over the event stream: a changelog of [`Row`]s.
pub fn query(events: &Stream<Event>) -> Stream<Change<Row>> {
    winning_bids(events, FLINK, |a| a.category, |_| ())
        .map(|w| (w.auction, w.price))
        .key_by(|(category, _)| *category)
        .process(AveragePerCategory::default)
        .name("q4-average")
}

/// Per category: the sum and count of final prices; emits the updated average.
#[derive(Default)]
struct AveragePerCategory {
    acc: Option<ValueState<(i64, i64)>>,
}

impl KeyedProcessFunction<i64, (i64, i64), Change<Row>> for AveragePerCategory {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.acc = Some(state.value_state("sum-count")?);
        Ok(())
    }

    fn process(
        &mut self,
        (category, price): (i64, i64),
        ctx: &mut KeyedContext<'_, i64, Change<Row>>,
    ) -> weir::Result<()> {
        let acc = self.acc.as_mut().expect("opened");
        let (sum, count) = acc.get()?.unwrap_or((0, 0));
        if count > 0 {
            ctx.emit(Change::Delete(Row {
                category,
                avg_final: sum / count,
            }));
        }
        let (sum, count) = (sum + price, count + 1);
        ctx.emit(Change::Insert(Row {
            category,
            avg_final: sum / count,
        }));
        acc.set((sum, count))
    }
}
