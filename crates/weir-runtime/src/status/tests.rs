use super::*;
use weir_core::dsl::Pipeline;

/// numbers (source, P1) → double (P2, rebalance) → discard (chained): heads 0 and 1.
pub(super) fn model() -> (Graph, Plan, JobStatus) {
    let p = Pipeline::new();
    p.from_collection(vec![1i64, 2, 3])
        .name("numbers")
        .parallelism(1)
        .map(|v| v * 2)
        .name("double")
        .parallelism(2)
        .discard();
    let graph = p.take_graph();
    let cfg = crate::JobConfig {
        parallelism: 2,
        ..crate::JobConfig::default()
    };
    let plan = Plan::new(&graph, &cfg).unwrap();
    let status = JobStatus::new("model", &graph, &plan, &cfg, true);
    (graph, plan, status)
}

#[test]
fn a_checkpoint_is_in_progress_then_completed_failed_or_abandoned() {
    let (_, _, s) = model();
    s.attempt_started(0);
    s.checkpoint_triggered(CheckpointId(1), CheckpointKind::Checkpoint);
    s.checkpoint_acked(
        CheckpointId(1),
        1,
        1,
        40,
        Duration::from_millis(3),
        Duration::ZERO,
    );
    let stats = weir_checkpoint::CheckpointStats {
        triggered_at: Instant::now(),
        duration: Duration::from_millis(12),
        bytes: 40,
        max_alignment: Duration::from_millis(3),
        max_sync: Duration::ZERO,
        max_async: Duration::ZERO,
        tasks: Vec::new(),
    };
    s.checkpoint_acknowledged(CheckpointId(1), &stats);
    // The checkpoint wrote more than the tasks acknowledged (a backend's files).
    s.checkpoint_completed(CheckpointId(1), std::path::Path::new("/ck/chk-1"), 4_096);
    s.checkpoint_triggered(CheckpointId(2), CheckpointKind::Savepoint);
    s.checkpoint_failed(CheckpointId(2), "timed out".into());
    s.checkpoint_triggered(CheckpointId(3), CheckpointKind::Checkpoint);
    s.attempt_ended();
    let v = s.checkpoints_view();
    assert_eq!(
        v["counts"],
        serde_json::json!({"completed": 1, "failed": 2, "in_progress": 0})
    );
    let ids: Vec<u64> = v["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [3, 2, 1]);
    assert_eq!(
        v["history"][0]["failure"],
        "the attempt ended before it completed"
    );
    assert_eq!(v["history"][1]["kind"], "savepoint");
    assert_eq!(v["history"][1]["failure"], "timed out");
    let latest = &v["latest_completed"];
    assert_eq!(latest["path"], "/ck/chk-1");
    assert_eq!(latest["duration_ms"], 12);
    assert_eq!(latest["alignment_ms"], 3);
    assert_eq!(latest["size_bytes"], 4_096, "what the checkpoint wrote");
    assert_eq!(latest["acks"][0]["operator"], "double");
    assert_eq!(latest["acks"][0]["subtask"], 1);
    assert_eq!(latest["acks"][0]["size_bytes"], 40);
}

#[test]
fn an_exception_names_the_failed_operator_and_its_root_cause() {
    let (_, _, s) = model();
    s.attempt_started(0);
    let e = weir_core::Error::user("disk full").at(|| weir_core::error::Location {
        operator: "discard".into(),
        subtask: 1,
        parallelism: 2,
    });
    s.exception("double", 1, &e);
    s.attempt_started(1);
    s.exception("double", 0, &weir_core::Error::Panic("boom".into()));
    let v = s.exceptions_view();
    let list = v["exceptions"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    // Newest first; without a location, the task's head names it.
    assert_eq!(list[0]["operator"], "double");
    assert_eq!(list[0]["subtask"], 0);
    assert_eq!(list[0]["attempt"], 2);
    assert_eq!(list[1]["operator"], "discard");
    assert_eq!(list[1]["subtask"], 1);
    assert_eq!(list[1]["attempt"], 1);
    assert_eq!(list[1]["root_cause"], "disk full");
    assert_eq!(
        list[1]["message"],
        "operator 'discard' (subtask 2/2) failed: disk full"
    );
    assert_eq!(s.job_view()["restarts"], 1);
}

#[test]
fn time_fractions_and_counts_come_from_the_reported_figures() {
    let (graph, plan, s) = model();
    s.attempt_started(0);
    // A cluster worker's report: one second of subtask 0 of 'double' (chained with
    // 'discard'), a quarter idle and half backpressured.
    let figures = TaskFigures {
        head: 1,
        subtask: 0,
        elapsed_ns: 1_000_000_000,
        ended: false,
        idle_ns: 250_000_000,
        backpressured_ns: 500_000_000,
        alignment_paused_ns: None,
        nodes: vec![
            NodeFigures {
                node: 1,
                records_in: vec![7],
                records_out: vec![7],
                watermark_in: 5,
                watermark_out: 5,
                bytes_in: None,
                in_flight: None,
                bytes_out: None,
                state_bytes: None,
                partitions: vec![],
            },
            NodeFigures {
                node: 2,
                records_in: vec![7],
                records_out: vec![],
                watermark_in: 5,
                watermark_out: MIN_WATERMARK,
                bytes_in: None,
                in_flight: None,
                bytes_out: None,
                state_bytes: None,
                partitions: vec![],
            },
        ],
    };
    s.remote_figures(&graph, &plan, vec![figures]);
    let v = s.operators_view();
    let double = &v["operators"][1];
    assert_eq!(double["name"], "double");
    let sub = &double["subtasks"][0];
    assert_eq!(sub["busy_ratio"], 0.25);
    assert_eq!(sub["idle_ratio"], 0.25);
    assert_eq!(sub["backpressured_ratio"], 0.5);
    assert_eq!(sub["busy_ms"], 250);
    assert_eq!(sub["backpressured_ms"], 500);
    assert_eq!(sub["records_in"], 7);
    assert_eq!(sub["records_in_per_second"], 7.0);
    assert_eq!(sub["watermark"], 5);
    assert_eq!(double["records_out"], 7);
    assert_eq!(double["backpressured_ratio"], 0.5);
    // The chained sink shares its upstream's cells.
    assert_eq!(v["operators"][2]["records_in"], 7);
    assert_eq!(v["operators"][2]["chained"], true);
    assert_eq!(v["operators"][2]["task"], 1);
    // Only the subtask that reported is listed.
    assert_eq!(double["subtasks"].as_array().unwrap().len(), 1);
    assert_eq!(v["edges"][0]["partitioning"], "REBALANCE");
}

#[test]
fn a_sources_partitions_reach_the_view_locally_and_through_a_workers_report() {
    let (graph, plan, worker) = model();
    worker.attempt_started(0);
    let task = worker.task(&graph, &plan, 0, 0);
    let gauge = |name: &str, v: i64| {
        let g = weir_core::metrics::gauge(name, "Test.", &[("test", "partitions")]);
        g.set(v);
        g
    };
    let figures = &task.node(0).unwrap().partitions;
    for (partition, position, high) in [(1, 7, -1), (0, 123, 150)] {
        figures.add_partition(weir_core::dsl::PartitionGauges {
            topic: "t".into(),
            partition,
            position: gauge(&format!("t_position_{partition}"), position),
            high_watermark: gauge(&format!("t_high_{partition}"), high),
        });
    }
    let want = serde_json::json!([
        {"subtask": 0, "topic": "t", "partition": 0, "position": 123, "high_watermark": 150, "lag": 27},
        {"subtask": 0, "topic": "t", "partition": 1, "position": 7, "high_watermark": null, "lag": null},
    ]);
    let v = worker.operators_view();
    assert_eq!(v["operators"][0]["partitions"], want);
    assert_eq!(v["operators"][1]["partitions"], serde_json::json!([]));

    // A coordinator gets them with the worker's figures, through the wire's codec.
    let (_, _, coordinator) = model();
    coordinator.attempt_started(0);
    let sent = weir_core::codec::encode(&worker.figures()).unwrap();
    let received: Vec<TaskFigures> = weir_core::codec::decode(&sent).unwrap();
    coordinator.remote_figures(&graph, &plan, received);
    assert_eq!(
        coordinator.operators_view()["operators"][0]["partitions"],
        want
    );
}
