// Connecting keyed streams whose key types differ: a keyed connect routes both inputs by
// one key, so both must be keyed by the same type.
use weir_core::prelude::*;

fn main() {
    let p = Pipeline::new();
    let orders = p.from_collection(vec![(7u32, 100i64)]).key_by(|o| o.0);
    let customers = p
        .from_collection(vec![("7".to_string(), "Ada".to_string())])
        .key_by(|c| c.0.clone());
    let _ = orders.connect(&customers);
}
