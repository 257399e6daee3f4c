//! kafka_sum end to end without failures.

use crate::support::*;

/// A bounded run at parallelism 2 over 3 input partitions commits exactly the prefix sums.
#[test]
fn kafka_sum_bounded_run_commits_every_prefix_sum_once() {
    let input = unique("in");
    let output = unique("out");
    create_topic(&input, 3);
    create_topic(&output, 3);
    let records = random_input(5_000, 40, 7);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let out = kafka_sum(&input, &output, ck.path())
        .args([
            "--bounded",
            "--parallelism",
            "2",
            "--checkpoint-interval-ms",
            "200",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_exactly_once(&prefix_sums(&records), &committed_sums(&output));
}
