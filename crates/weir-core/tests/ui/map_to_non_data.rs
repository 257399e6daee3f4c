// A record type that cannot travel between subtasks or into state: it derives neither
// Serialize nor Deserialize.
use weir_core::prelude::*;

#[derive(Clone)]
struct Reading {
    sensor: String,
    value: i64,
}

fn main() {
    let p = Pipeline::new();
    let _ = p
        .from_collection(vec![("a".to_string(), 1i64)])
        .map(|(sensor, value)| Reading { sensor, value });
}
