//! The binary's other faces: `plan` (of the live rules, or of rules in a
//! file) says what `run` would do and changes nothing, `run` stops cleanly
//! on SIGTERM and serves its probes, and every setting's environment
//! variable is one the tests clear from an operator's environment.

use crate::common;

use std::collections::BTreeSet;

use crate::common::*;
use serde_json::{Value, json};

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

    let plan = copyrator_plan(&["--namespace", &op, "-o", "json"], None).await;
    plan.assert_exit(2);
    let rule = format!("{op}/r");
    let from = format!("{op}/planned-source");
    assert_eq!(
        plan.changes_in(&[&t1, &t2]),
        [
            change("create", CM, &t1, "planned-source", &rule, Some(&from)),
            change("create", CM, &t2, "planned-source", &rule, Some(&from)),
        ],
        "{}",
        plan.stdout
    );

    for ns in [&t1, &t2] {
        assert!(
            t.get(CM, ns, "planned-source").await.is_none(),
            "plan created a copy in {ns}"
        );
    }
    assert_rule_untouched(&t, &op, "r", &rule_before).await;
    let rule = t.get_rule(&op, "r").await;
    assert!(rule.get("status").is_none_or(Value::is_null));
    let now = t.must_get(CM, &op, "planned-source").await;
    assert_eq!(
        now.resource_version, source.resource_version,
        "plan wrote the source"
    );
}

/// The rule's resourceVersion is the one seen before.
async fn assert_rule_untouched(t: &TestNs, ns: &str, name: &str, before: &Value) {
    let rule = t.get_rule(ns, name).await;
    assert_eq!(
        rule["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"],
        "plan wrote the rule {ns}/{name}: {}",
        short_status(&rule)
    );
}

/// Two new rules in one file, one in the spec form without a namespace
/// (it takes `--namespace`) and one in the original top-level form: the
/// plan lists their creates in order, a foreign object of a copy's name
/// as a skip, exits 2, and writes nothing: no copy, no rule.
#[tokio::test]
async fn plan_of_new_rules_from_a_file_lists_their_creates_and_writes_nothing() {
    let t = TestNs::new("plan-new").await;
    let op = t.ns("op").await;
    let (t1, t2, t3) = (t.ns("t1").await, t.ns("t2").await, t.ns("t3").await);
    t.create_source(CM, &op, "cfg", &[("set", "one")], &[("k", "v")])
        .await;
    t.create_source(CM, &op, "other-cfg", &[("set", "two")], &[("k", "v")])
        .await;
    let foreign = t
        .create_plain(CM, &t3, "cfg", &[], &[("mine", "yes")])
        .await;
    let selector = |set: &str| json!({TEST_LABEL: t.prefix, "set": set});
    let new_rule = rule_spec(CM, selector("one"), &[t.glob("t")]);
    let original_form = json!({
        "ruleType": "configmap",
        "selector": selector("two"),
        "namespace": op,
        "spec": {"targets": {"include": [t.glob("t")]}},
    });
    let file = t.rule_file(
        "new",
        &[
            TestNs::rule_manifest(None, "new", &new_rule),
            TestNs::rule_manifest(Some(&op), "second", &original_form),
        ],
    );

    let plan = copyrator_plan(&["--namespace", &op, "-f", &file, "-o", "json"], None).await;
    plan.assert_exit(2);
    let (new, second) = (format!("{op}/new"), format!("{op}/second"));
    let (cfg, other) = (format!("{op}/cfg"), format!("{op}/other-cfg"));
    assert_eq!(
        plan.changes(),
        [
            change("create", CM, &t1, "cfg", &new, Some(&cfg)),
            change("create", CM, &t2, "cfg", &new, Some(&cfg)),
            change("create", CM, &t1, "other-cfg", &second, Some(&other)),
            change("create", CM, &t2, "other-cfg", &second, Some(&other)),
            change("create", CM, &t3, "other-cfg", &second, Some(&other)),
        ],
        "{}",
        plan.stdout
    );
    let document = plan.json();
    assert_eq!(
        document["skipped"],
        json!([{"cluster": "home", "kind": "ConfigMap", "namespace": t3, "name": "cfg", "rule": new,
                "reason": "a ConfigMap not made by Copyrator is there"}]),
        "{}",
        plan.stdout
    );
    assert_eq!(
        document["rules"],
        json!([{"rule": new, "valid": true}, {"rule": second, "valid": true}])
    );

    for ns in [&t1, &t2, &t3] {
        assert!(
            t.get(CM, ns, "other-cfg").await.is_none(),
            "plan created a copy in {ns}"
        );
    }
    for ns in [&t1, &t2] {
        assert!(
            t.get(CM, ns, "cfg").await.is_none(),
            "plan created a copy in {ns}"
        );
    }
    let still = t.must_get(CM, &t3, "cfg").await;
    assert_eq!(
        still.resource_version, foreign.resource_version,
        "plan wrote the foreign object"
    );
    for name in ["new", "second"] {
        assert_eq!(
            t.try_get_rule(&op, name).await,
            Ok(None),
            "plan created rule {name}"
        );
    }
}

/// A live rule whose targets a file narrows: the plan (the file read from
/// standard input) shows the deletes the edit causes, the copies that stay
/// are no change, and nothing is deleted yet.
#[tokio::test]
async fn plan_of_an_edited_rule_shows_the_copies_it_would_prune() {
    let t = TestNs::new("plan-edit").await;
    let op = t.ns("op").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let live = rule_spec(CM, t.selector(), &[t.glob("t")]);
    t.create_rule(&op, "r", live).await;
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let mut operator = Operator::start(&t, &op, &[]);
    t.wait_copy(CM, &t1, &source, &op, "r").await;
    let pruned = t.wait_copy(CM, &t2, &source, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;
    operator.stop();
    let rule_before = t.get_rule(&op, "r").await;

    let narrowed = rule_spec(CM, t.selector(), &[t.name("t1")]);
    let manifest = serde_yaml::to_string(&TestNs::rule_manifest(Some(&op), "r", &narrowed))
        .expect("the rule renders as YAML");
    let plan = copyrator_plan(
        &["--namespace", &op, "-f", "-", "--output", "json"],
        Some(&manifest),
    )
    .await;
    plan.assert_exit(2);
    assert_eq!(
        plan.changes(),
        [change(
            "delete",
            CM,
            &t2,
            "cfg",
            &format!("{op}/r"),
            Some(&format!("{op}/cfg"))
        )],
        "{}",
        plan.stdout
    );
    assert_eq!(
        plan.json()["rules"],
        json!([{"rule": format!("{op}/r"), "valid": true}])
    );

    let still = t.must_get(CM, &t2, "cfg").await;
    assert_eq!(
        still.resource_version, pruned.resource_version,
        "plan deleted or wrote the copy"
    );
    assert_rule_untouched(&t, &op, "r", &rule_before).await;
}

/// A file holding a live rule as it is: `no changes` and exit 0, in text
/// and in JSON.
#[tokio::test]
async fn plan_of_a_rule_with_nothing_to_do_says_no_changes() {
    let t = TestNs::new("plan-same").await;
    let op = t.ns("op").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let body = rule_spec(CM, t.selector(), &[t.glob("t")]);
    t.create_rule(&op, "r", body.clone()).await;
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let mut operator = Operator::start(&t, &op, &[]);
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
    t.wait_rule_ready(&op, "r").await;
    operator.stop();
    let file = t.rule_file("same", &[TestNs::rule_manifest(None, "r", &body)]);

    let text = copyrator_plan(&["--namespace", &op, "-f", &file], None).await;
    text.assert_exit(0);
    assert_eq!(text.stdout, "no changes\n", "{}", text.stderr);

    let json = copyrator_plan(&["--namespace", &op, "-f", &file, "-o", "json"], None).await;
    json.assert_exit(0);
    assert_eq!(
        json.json(),
        json!({"changes": [], "skipped": [], "rules": [{"rule": format!("{op}/r"), "valid": true}]})
    );
}

/// A rule the operator refuses (a target pattern that is no namespace
/// glob): the plan exits 1 and says, for the live rule and for a new rule
/// alike, the reason and message that the operator put into the live
/// rule's status, and both are docs/plan.md's words for such a pattern.
#[tokio::test]
async fn plan_of_an_invalid_rule_fails_with_its_status_message() {
    let t = TestNs::new("plan-invalid").await;
    let op = t.ns("op").await;
    let bad = rule_spec(CM, t.selector(), &["Not-A-Namespace*"]);
    // As docs/plan.md's example words a pattern with capitals.
    let message = "targets.include: pattern \"Not-A-Namespace*\" may only hold lowercase letters, \
                   digits, '-', '.', '*' and '?'";
    t.create_rule(&op, "bad", bad.clone()).await;
    let mut operator = Operator::start(&t, &op, &[]);
    let refused = t
        .wait_rule(&op, "bad", "Ready False, InvalidRule", |r| {
            not_ready_because(r, "InvalidRule")
        })
        .await;
    operator.stop();
    assert_eq!(
        ready_condition(&refused).expect("a Ready condition")["message"].as_str(),
        Some(message),
        "the live rule's status: {}",
        short_status(&refused)
    );
    let file = t.rule_file(
        "invalid",
        &[
            TestNs::rule_manifest(Some(&op), "bad", &bad),
            TestNs::rule_manifest(Some(&op), "bad-too", &bad),
        ],
    );

    let plan = copyrator_plan(&["--namespace", &op, "-f", &file, "-o", "json"], None).await;
    plan.assert_exit(1);
    let verdict = |name: &str| json!({"rule": format!("{op}/{name}"), "valid": false, "reason": "InvalidRule", "message": message});
    let document = plan.json();
    assert_eq!(
        document["rules"],
        json!([verdict("bad"), verdict("bad-too")])
    );
    assert_eq!(
        document["changes"],
        json!([]),
        "an invalid rule changes nothing"
    );
    let stderr: Vec<&str> = plan.stderr.lines().collect();
    for name in ["bad", "bad-too"] {
        let said = format!("error: rule {op}/{name} is refused: InvalidRule: {message}");
        assert!(
            stderr.contains(&said.as_str()),
            "standard error lacks the line {said:?}:\n{}",
            plan.stderr
        );
    }
    assert_eq!(
        t.try_get_rule(&op, "bad-too").await,
        Ok(None),
        "plan created a rule"
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

/// A rule from a file that names another kind by `objectType`: the plan
/// resolves the kind, lists the copies it would create, exits 2 and
/// writes nothing; an operator whose `--kinds` leaves the kind out
/// refuses the rule (exit 1) with the status's reason.
#[tokio::test]
async fn plan_of_an_object_type_rule_lists_its_creates() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::core::ApiResource;
    let t = TestNs::new("plan-kind").await;
    let op = t.ns("op").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let policies = ApiResource::erase::<NetworkPolicy>(&());
    t.create_dyn_source(
        &policies,
        &op,
        "deny",
        &[],
        &[],
        json!({"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
    )
    .await;
    let rule = common::dynamic::object_rule_spec(&policies, t.selector(), &[t.glob("t")]);
    let file = t.rule_file("kind", &[TestNs::rule_manifest(None, "np", &rule)]);

    let kinds = "configmap,secret,NetworkPolicy.networking.k8s.io";
    let plan = copyrator_plan(
        &[
            "--namespace",
            &op,
            "--kinds",
            kinds,
            "-f",
            &file,
            "-o",
            "json",
        ],
        None,
    )
    .await;
    plan.assert_exit(2);
    let (rule_name, source) = (format!("{op}/np"), format!("{op}/deny"));
    let create = |ns: &str| {
        (
            "create".to_owned(),
            "NetworkPolicy".to_owned(),
            ns.to_owned(),
            "deny".to_owned(),
            rule_name.clone(),
            Some(source.clone()),
        )
    };
    assert_eq!(
        plan.changes(),
        [create(&t1), create(&t2)],
        "{}",
        plan.stdout
    );
    for ns in [&t1, &t2] {
        assert!(
            matches!(t.try_get_dyn(&policies, ns, "deny").await, Ok(None)),
            "plan created a copy in {ns}"
        );
    }

    let refused = copyrator_plan(&["--namespace", &op, "-f", &file, "-o", "json"], None).await;
    refused.assert_exit(1);
    assert_eq!(
        refused.json()["rules"],
        json!([{"rule": rule_name, "valid": false, "reason": "KindNotEnabled",
                "message": "this operator does not copy NetworkPolicy.networking.k8s.io: add it to --kinds (the chart's extraKinds, which also grants the RBAC)"}]),
        "{}",
        refused.stdout
    );
}

/// The environment variables a `copyrator --help` text names, as clap
/// shows them: `[env: NAMESPACE=]`, or `[env: NAMESPACE=value]` when set.
fn env_names_in_help(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_owned)
        .collect()
}

/// Every environment variable a setting of the binary reads is one that
/// the tests clear from an operator's environment (`OPERATOR_ENV`): a
/// variable left out would let the shell that runs the tests change what
/// a test's operator does, behind the flags the test passes.
#[test]
fn every_settings_environment_variable_is_cleared_for_tested_operators() {
    let mut named = BTreeSet::new();
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["plan", "--help"],
        &["probe", "--help"],
        &["crd", "--help"],
    ] {
        let out = std::process::Command::new(bin())
            .args(args)
            .env_clear()
            .output()
            .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", bin()));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}): {}",
            bin(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        named.extend(env_names_in_help(&help));
    }
    // Read from the help text: without the variables it is known to name,
    // the comparison below would prove nothing.
    for known in ["NAMESPACE", "LOG_LEVEL"] {
        assert!(
            named.contains(known),
            "`copyrator --help` names no {known}: the help text's form changed? {named:?}"
        );
    }
    let missing: Vec<&String> = named
        .iter()
        .filter(|name| !OPERATOR_ENV.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the binary reads {missing:?}, which tests/common/mod.rs OPERATOR_ENV does not clear"
    );
}
