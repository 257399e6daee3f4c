//! The Nexmark benchmark's data for weir: the canonical event generator (Person, Auction
//! and Bid events, deterministic for a configuration) and [`NexmarkSource`], a parallel,
//! checkpointed weir source over it.
//!
//! ```
//! use weir_nexmark::{Event, NexmarkConfig, events};
//! let config = NexmarkConfig { num_events: 100, ..Default::default() };
//! let all: Vec<Event> = events(&config).collect();
//! assert_eq!(all.len(), 100);
//! assert!(matches!(&all[0], Event::Person(p) if p.id == 1000));
//! ```

mod config;
mod generator;
mod model;
mod rng;
mod source;

pub use config::{BASE_TIME, NexmarkConfig};
pub use generator::{GeneratorConfig, events, splits};
pub use model::{Auction, Bid, Event, Person};
pub use rng::JavaRandom;
pub use source::NexmarkSource;
