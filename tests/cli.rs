//! The binary's other faces: `plan` changes nothing, `run` stops cleanly on
//! SIGTERM and serves its probes.

mod common;

use common::*;
use serde_json::Value;

const CM: Kind = Kind::ConfigMap;

#[tokio::test]
async fn plan_says_what_run_would_do_and_changes_nothing() {
    let t = TestNs::new("plan").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let source = t
        .create_source(CM, &op, "planned-source", &[], &[("k", "v")])
        .await;
    let rule_before = t.get_rule(&op, "r").await;

    let out = std::process::Command::new(bin())
        .args(["plan", "--namespace", &op])
        .output()
        .expect("running copyrator plan");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "copyrator plan failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    for word in [&t1, &t2, "planned-source"] {
        assert!(
            stdout.contains(word),
            "the plan does not mention {word}:\n{stdout}\n{stderr}"
        );
    }

    for ns in [&t1, &t2] {
        assert!(
            t.get(CM, ns, "planned-source").await.is_none(),
            "plan created a copy in {ns}"
        );
    }
    let rule = t.get_rule(&op, "r").await;
    assert_eq!(
        rule["metadata"]["resourceVersion"],
        rule_before["metadata"]["resourceVersion"],
        "plan wrote the rule: {}",
        short_status(&rule)
    );
    assert!(rule.get("status").is_none_or(Value::is_null));
    let now = t.must_get(CM, &op, "planned-source").await;
    assert_eq!(
        now.resource_version, source.resource_version,
        "plan wrote the source"
    );
}

#[tokio::test]
async fn run_serves_probes_and_stops_cleanly_on_sigterm() {
    let t = TestNs::new("sigterm").await;
    let op = t.ns("op").await;
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    let (code, _) = http_get(operator.port, "/healthz")
        .await
        .expect("GET /healthz");
    assert_eq!(code, 200, "/healthz");
    let (code, body) = http_get(operator.port, "/metrics")
        .await
        .expect("GET /metrics");
    assert_eq!(code, 200, "/metrics");
    assert!(
        body.contains("# TYPE"),
        "/metrics is not Prometheus text:\n{body}"
    );
    let status = operator.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "copyrator run did not exit 0 within 10 s of SIGTERM: {status:?}\n{}",
        operator.logs()
    );
}
