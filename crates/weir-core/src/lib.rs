//! weir-core: the vocabulary of weir.
//!
//! The typed DSL ([`dsl`]), the logical graph ([`graph`]), operators ([`ops`], [`window`]),
//! keyed state handles ([`state`]), event time ([`time`], [`watermark`], [`timer`]) and the
//! in-process data exchange ([`exchange`]). No RocksDB, no Kafka here: the runtime crate
//! executes what this crate describes. The one async runtime is the process's runtime for
//! async I/O requests ([`async_io`]), which only runs the futures of `map_async` calls.
#![deny(missing_docs)]

pub mod async_io;
pub mod changelog;
pub mod checkpoint;
pub mod codec;
pub mod data;
pub mod dlq;
pub mod dsl;
pub mod error;
pub mod exchange;
pub mod failpoint;
pub mod graph;
pub mod ids;
pub mod metrics;
pub mod ops;
pub mod output;
pub mod retry;
pub mod scratch;
pub mod state;
pub mod time;
pub mod timer;
pub mod watermark;
pub mod window;

pub use error::{Error, Result};

/// Everything a pipeline author needs, in one import.
pub mod prelude {
    pub use crate::async_io::{AsyncFunction, AsyncOptions, OutputOrder};
    pub use crate::changelog::Change;
    pub use crate::data::{Data, Key};
    pub use crate::dsl::{
        BroadcastConnectedStreams, BroadcastStream, KeyedBroadcastConnectedStreams,
    };
    pub use crate::dsl::{
        ConnectedStreams, GeneratorSource, IntervalJoin, IntervalJoined, JoinedStreams,
        KeyedConnectedStreams, KeyedStream, OutputTag, Pipeline, SourceContext, SourceFunction,
        SourceOutput, Stream, TemporalJoin, WindowedJoin, WindowedStream,
    };
    pub use crate::dsl::{GroupedTable, Table, TableJoin};
    pub use crate::error::{Error, Result};
    pub use crate::graph::SourceStatus;
    pub use crate::ops::broadcast::{
        BroadcastContext, BroadcastProcessFunction, BroadcastState, BroadcastStateDescriptor,
        ReadOnlyBroadcastState, ReadOnlyContext,
    };
    pub use crate::ops::co::{CoContext, CoProcessFunction};
    pub use crate::ops::dedup::IdempotencyError;
    pub use crate::ops::interval_join::{JoinContext, ProcessJoinFunction};
    pub use crate::ops::keyed::{AggregateFunction, Count, KeyedContext, KeyedProcessFunction};
    pub use crate::ops::process::{ProcessContext, ProcessFunction};
    pub use crate::ops::sink::{Collected, SinkContext, SinkFunction};
    pub use crate::ops::table_agg::{TableAggregate, TableSum};
    pub use crate::output::Collector;
    pub use crate::state::{ListState, MapState, ReducingState, StateContext, ValueState};
    pub use crate::time::{MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
    pub use crate::timer::TimeDomain;
    pub use crate::watermark::{
        BoundedOutOfOrderness, WatermarkGenerator, WatermarkOutput, WatermarkStrategy,
    };
    pub use crate::window::{TimeWindow, WindowAssigner};
}
