//! q8, monitor new users: the persons who registered and opened an auction in the same
//! 10-second window.
//!
//! ```sql
//! SELECT P.id, P.name, P.starttime
//! FROM (
//!     SELECT id, name, window_start AS starttime, window_end AS endtime
//!     FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!     GROUP BY id, name, window_start, window_end
//! ) P
//! JOIN (
//!     SELECT seller, window_start AS starttime, window_end AS endtime
//!     FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!     GROUP BY seller, window_start, window_end
//! ) A
//! ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime;
//! ```
//!
//! Both sides are first grouped per key and window (so a seller with several auctions in a
//! window counts once); each group leaves its window stamped with the window's last
//! millisecond and the two are joined in the same tumbling window, keyed by person id.

use super::{auctions, persons};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// Window length.
pub const SIZE_MS: i64 = 10_000;

/// A q8 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub id: i64,
    pub name: String,
    pub start_time: i64,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    let new_persons = persons(events)
        .map(|p| (p.id, p.name))
        .key_by(|p| p.clone())
        .window(WindowAssigner::tumbling(SIZE_MS))
        .aggregate_with_window(Count, |(id, name), w, _n| (*id, name.clone(), w.start))
        .name("q8-persons");
    let sellers = auctions(events)
        .map(|a| a.seller)
        .key_by(|s| *s)
        .window(WindowAssigner::tumbling(SIZE_MS))
        .aggregate_with_window(Count, |seller, _w, _n| *seller)
        .name("q8-sellers");
    new_persons
        .key_by(|p| p.0)
        .join(&sellers.key_by(|s| *s))
        .window(WindowAssigner::tumbling(SIZE_MS))
        .apply(|(id, name, start_time), _seller| Row {
            id,
            name,
            start_time,
        })
        .name("q8-join")
}
