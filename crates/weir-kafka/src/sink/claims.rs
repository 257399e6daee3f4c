//! Which exactly-once sink of this process uses which transactional-id prefix.
//!
//! Two sinks with one prefix would initialise the same transactional ids and fence each
//! other's transactions, and their markers would share keys. Subtask `i` of every operator
//! of a job runs in one process (one slot holds a subtask of every operator, in cluster
//! mode too), so the second sink to open finds the first one's claim here and is refused
//! before it writes anything.

use crate::{KafkaError, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The claims of this process: (brokers, prefix) → (operator id, display name, subtasks open).
type Claims = Mutex<HashMap<(String, String), (String, String, usize)>>;

fn claims() -> &'static Claims {
    static CLAIMS: OnceLock<Claims> = OnceLock::new();
    CLAIMS.get_or_init(Claims::default)
}

/// A subtask's claim on a prefix; released when dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    key: (String, String),
}

/// Claims `prefix` on `brokers` for the sink operator `operator_id` (named `name`). Fails,
/// naming both sinks, when another operator holds it.
pub(crate) fn claim(brokers: &str, prefix: &str, operator_id: &str, name: &str) -> Result<Claim> {
    let key = (brokers.to_string(), prefix.to_string());
    let mut all = claims().lock().unwrap_or_else(|p| p.into_inner());
    let entry = all
        .entry(key.clone())
        .or_insert_with(|| (operator_id.to_string(), name.to_string(), 0));
    if entry.0 != operator_id {
        return Err(KafkaError::Config(format!(
            "two Kafka sinks use the transactional-id prefix '{prefix}' on {brokers}: sink '{}' \
             (operator id '{}') and sink '{name}' (operator id '{operator_id}'). Their \
             transactions would fence each other and their commit markers would mix; give \
             each sink its own prefix (the third argument of KafkaSink::new)",
            entry.1, entry.0
        )));
    }
    entry.2 += 1;
    Ok(Claim { key })
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut all = claims().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = all.get_mut(&self.key) {
            e.2 -= 1;
            if e.2 == 0 {
                all.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operator_is_refused_until_the_first_releases_the_prefix() {
        let a0 = claim("b:1", "claims-test", "3-out", "out").unwrap();
        let a1 = claim("b:1", "claims-test", "3-out", "out").unwrap();
        let e = claim("b:1", "claims-test", "5-copy", "copy").unwrap_err();
        assert!(
            e.to_string().contains(
                "two Kafka sinks use the transactional-id prefix 'claims-test' on b:1: sink \
                 'out' (operator id '3-out') and sink 'copy' (operator id '5-copy')"
            ),
            "{e}"
        );
        // another broker, or another prefix, is another claim
        let _other = claim("b:2", "claims-test", "5-copy", "copy").unwrap();
        let _other = claim("b:1", "claims-test-2", "5-copy", "copy").unwrap();
        drop(a0);
        assert!(claim("b:1", "claims-test", "5-copy", "copy").is_err());
        drop(a1);
        let _b = claim("b:1", "claims-test", "5-copy", "copy").unwrap();
    }
}
