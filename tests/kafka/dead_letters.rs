//! A Kafka topic as the dead-letter queue of an external sink, against the real broker.

use crate::support::{broker, create_topic, read_all, unique};
use weir::dlq::DeadLetter;
use weir::ops::sink::SinkContext;

fn ctx() -> SinkContext {
    SinkContext {
        subtask: 0,
        parallelism: 1,
        checkpointing: true,
        checkpoint_timing: None,
        name: "pay".into(),
        operator_id: "pay".into(),
    }
}

#[test]
fn dead_letters_land_in_the_topic_keyed_by_their_idempotency_key() {
    let topic = unique("dlq");
    create_topic(&topic, 1);
    let make = weir_kafka::dead_letters(broker(), &topic);
    let mut q = make("payments", &ctx()).unwrap();
    let a = DeadLetter::new(
        "payments",
        "pay-1",
        "check constraint",
        1,
        serde_json::json!({"amount": 0}),
    );
    let b = DeadLetter::new(
        "payments",
        "pay-9",
        "timed out (the attempt limit was reached)",
        5,
        serde_json::json!([9]),
    );
    q.send(&a).unwrap();
    q.send(&b).unwrap();
    q.flush().unwrap();
    let read = read_all(&topic, "read_committed");
    let keys: Vec<String> = read.iter().map(|r| r.key_str()).collect();
    assert_eq!(keys, ["pay-1", "pay-9"]);
    let letters: Vec<DeadLetter> = read
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(letters, vec![a, b]);
    let headers: Vec<(String, String)> = read[1]
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    assert_eq!(
        headers,
        [
            ("weir.handler".to_string(), "payments".to_string()),
            ("weir.attempts".to_string(), "5".to_string()),
            (
                "weir.error".to_string(),
                "timed out (the attempt limit was reached)".to_string()
            )
        ]
    );
}

#[test]
fn a_missing_dead_letter_topic_refuses_to_start_naming_it() {
    let topic = unique("no-such-dlq");
    let make = weir_kafka::dead_letters(broker(), &topic);
    let e = make("payments", &ctx())
        .err()
        .expect("a missing topic is an error")
        .to_string();
    assert!(
        e.contains(&format!("topic '{topic}' does not exist")),
        "{e}"
    );
}
