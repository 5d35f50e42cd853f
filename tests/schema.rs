//! Invalid rules are refused at admission by the CRD schema, with a message
//! that names the field. No operator runs here: the API server alone decides.

mod common;

use common::*;
use serde_json::{Value, json};

/// Creates the rule and asserts the API server refuses it (422) with a
/// message that mentions every word of `mentions`.
async fn refused(t: &TestNs, ns: &str, name: &str, body: Value, mentions: &[&str]) {
    match t.try_create_rule(ns, name, body.clone()).await {
        Ok(r) => panic!("the API server accepted the invalid rule {body}: {r}"),
        Err(e) => {
            let msg = err_msg(&e);
            assert!(
                matches!(&e, kube::Error::Api(s) if s.code == 422),
                "expected 422 Invalid for {body}, got {msg}"
            );
            for word in mentions {
                assert!(
                    msg.contains(word),
                    "the refusal of {body} does not mention {word:?}: {msg}"
                );
            }
        }
    }
}

#[tokio::test]
async fn schema_refuses_an_unknown_rule_type() {
    let t = TestNs::new("schema-ruletype").await;
    let ns = t.ns("op").await;
    let sel = json!({"copyrator": "true"});
    refused(
        &t,
        &ns,
        "top",
        json!({"ruleType": "deployment", "selector": sel}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "spec",
        json!({"spec": {"ruleType": "Deployment", "selector": sel}}),
        &["spec.ruleType"],
    )
    .await;
    // The kinds are lower case, as in the original.
    refused(
        &t,
        &ns,
        "case",
        json!({"spec": {"ruleType": "ConfigMap", "selector": sel}}),
        &["ruleType"],
    )
    .await;
}

#[tokio::test]
async fn schema_refuses_a_missing_rule_type_or_selector() {
    let t = TestNs::new("schema-required").await;
    let ns = t.ns("op").await;
    refused(
        &t,
        &ns,
        "no-type",
        json!({"selector": {"copyrator": "true"}}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-type-spec",
        json!({"spec": {"selector": {"copyrator": "true"}}}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-selector",
        json!({"ruleType": "configmap"}),
        &["selector"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-selector-spec",
        json!({"spec": {"ruleType": "secret"}}),
        &["selector"],
    )
    .await;
}

/// `{}` is refused by the schema (`minProperties`); shapes the structural
/// schema cannot express (`{matchLabels: {}}`, a non-string label value) are
/// the operator's to report: see `safety.rs`.
#[tokio::test]
async fn schema_refuses_an_empty_selector() {
    let t = TestNs::new("schema-selector").await;
    let ns = t.ns("op").await;
    refused(
        &t,
        &ns,
        "top",
        json!({"ruleType": "configmap", "selector": {}}),
        &["selector"],
    )
    .await;
    refused(
        &t,
        &ns,
        "spec",
        json!({"spec": {"ruleType": "configmap", "selector": {}}}),
        &["spec.selector"],
    )
    .await;
}

#[tokio::test]
async fn schema_refuses_a_bad_conflict_policy() {
    let t = TestNs::new("schema-conflict").await;
    let ns = t.ns("op").await;
    let body = json!({"spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}, "conflictPolicy": "Maybe"}});
    refused(&t, &ns, "policy", body, &["conflictPolicy"]).await;
}

#[tokio::test]
async fn schema_refuses_mistyped_fields() {
    let t = TestNs::new("schema-types").await;
    let ns = t.ns("op").await;
    let sel = json!({"copyrator": "true"});
    let base = |extra: serde_json::Value| {
        let mut spec = json!({"ruleType": "configmap", "selector": sel});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({ "spec": spec })
    };
    refused(
        &t,
        &ns,
        "prune",
        base(json!({"prune": "yes"})),
        &["spec.prune"],
    )
    .await;
    refused(
        &t,
        &ns,
        "include",
        base(json!({"targets": {"include": "team-*"}})),
        &["spec.targets.include"],
    )
    .await;
    refused(
        &t,
        &ns,
        "add-labels",
        base(json!({"transform": {"addLabels": {"a": 1}}})),
        &["spec.transform.addLabels"],
    )
    .await;
}

#[tokio::test]
async fn schema_accepts_both_published_forms() {
    let t = TestNs::new("schema-accepts").await;
    let ns = t.ns("op").await;
    let original = json!({
        "metadata": {"labels": {"module": "copyrator"}},
        "ruleType": "configmap",
        "selector": {"copyrator": "true"},
        "namespace": "default",
    });
    let full = json!({"spec": {
        "ruleType": "secret",
        "selector": {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "Exists"}]},
        "namespace": ["x", "y"],
        "targets": {"namespaceSelector": {"matchLabels": {"env": "prod"}}, "include": ["team-*"], "exclude": ["team-?x"]},
        "prune": false,
        "conflictPolicy": "Overwrite",
        "transform": {"addLabels": {"a": "b"}, "addAnnotations": {"c": "d"}, "stripLabels": ["e/*"], "stripAnnotations": ["f"]},
    }});
    for (name, body) in [("original", original), ("full", full)] {
        t.try_create_rule(&ns, name, body.clone())
            .await
            .unwrap_or_else(|e| panic!("the valid rule {body} was refused: {}", err_msg(&e)));
    }
}
