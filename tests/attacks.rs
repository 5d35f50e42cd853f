//! Attacks on a multi-tenant cluster, each as written in the trust review:
//! a tenant acts only through a ServiceAccount token bound to the built-in
//! `admin` ClusterRole in its own namespace ([`common::tenant::Tenant`]),
//! and each test asserts what every other user is promised (docs/trust.md).
//! A test whose operator runs with `--all-namespaces` takes
//! [`CLUSTER_WIDE`] for writing; every other test takes it for reading.

mod common;

use std::time::Duration;

use common::tenant::Tenant;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const CM: Kind = Kind::ConfigMap;

/// Content comes only from sources. An admin rule copies
/// `platform/trust-bundle` into every team in two stages (a canary, then
/// the rest, after a pause of ten minutes: a rollout once started would
/// hold the rest that long). The tenant of `team-a`, in the rest, edits its copy, first
/// under Copyrator's own field-manager name, then as `kubectl edit` would:
/// each time its copy is restored and no rollout starts; meanwhile a new
/// namespace of the rest and `team-b` (whose owner deleted its copy to
/// refresh it) get the source's content, never the tenant's.
#[tokio::test]
async fn a_tenants_edited_copy_reaches_no_other_namespace() {
    let _shared = CLUSTER_WIDE.read().await;
    let t = TestNs::new("atk-stage").await;
    let platform = t.ns("platform").await;
    let canary = t.ns_labelled("canary", &[("stage", "canary")]).await;
    let team_a = t.ns("team-a").await;
    let team_b = t.ns("team-b").await;
    t.create_rule(
        &platform,
        "r",
        with(
            rule_spec(CM, t.selector(), &[t.glob("")]),
            "/spec/rollout",
            json!({
                "stages": [{"name": "canary", "namespaceSelector": {"matchLabels": {"stage": "canary"}},
                            "pauseSeconds": 600}],
                "settleTimeoutSeconds": 600,
            }),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &platform, &[]);
    let source = t
        .create_source(CM, &platform, "trust-bundle", &[], &[("ca.crt", "GOOD-CA")])
        .await;
    for ns in [&canary, &team_a, &team_b] {
        t.wait_copy(CM, ns, &source, &platform, "r").await;
    }
    t.wait_rule_ready(&platform, "r").await;
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let own_copy: Api<ConfigMap> = Api::namespaced(attacker.client.clone(), &team_a);

    for manager in ["copyrator", "kubectl-edit"] {
        own_copy
            .patch(
                "trust-bundle",
                &PatchParams {
                    field_manager: Some(manager.to_owned()),
                    ..Default::default()
                },
                &Patch::Merge(json!({"data": {"ca.crt": "EVIL-CA"}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the tenant edits its copy: {}", err_msg(&e)));
        // The edit stands while a namespace of the rest comes and another
        // team refreshes its copy.
        let late = t.ns(&format!("team-c-{manager}")).await;
        Api::<ConfigMap>::namespaced(t.client.clone(), &team_b)
            .delete("trust-bundle", &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("team-b deletes its copy: {}", err_msg(&e)));
        for ns in [&late, &team_b, &team_a] {
            t.wait_copy(CM, ns, &source, &platform, "r").await;
        }
        let rule = t.wait_rule_ready(&platform, "r").await;
        assert!(
            rule["status"]["rollouts"].is_null(),
            "the source never changed, yet a rollout: {}",
            rule["status"]
        );
        println!(
            "edited by {manager}: restored; {} and {late} hold the source's content",
            team_b
        );
    }
    // Nothing of the tenant's stays anywhere for long.
    assert_for("no copy holds the tenant's content", QUIET, async || {
        for ns in [&canary, &team_a, &team_b] {
            let copy = t.must_get(CM, ns, "trust-bundle").await;
            copy.data_is(&[("ca.crt", "GOOD-CA")])?;
        }
        Ok(())
    })
    .await;
}

/// A tenant's rule costs the tenant, not the operator. The tenant of
/// `team-a` writes a rule whose selector lists 1,100 values of 61
/// characters (a 70 KB rule the API server accepts; its query would break
/// the watch's URL). Meanwhile an admin rule's copy follows its source,
/// `/healthz` answers 200 for twice `--stuck-after`, and no log line
/// carries the selector; the rule reads `InvalidRule`, saying why without
/// quoting the selector.
#[tokio::test]
async fn one_tenant_rule_with_a_huge_selector_harms_nobody_else() {
    // Its operator honours every namespace's rules: no other test runs.
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-huge").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let target = t.ns("t1").await;
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let mut operator = Operator::start(
        &t,
        &op,
        &[
            "--all-namespaces",
            "--stuck-after",
            "5",
            "--log-format",
            "json",
        ],
    );
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let values: Vec<String> = (0..1100).map(|i| format!("{i:061}")).collect();
    let huge = json!({"spec": {"ruleType": "configmap", "selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": values}]}}});
    let rule_bytes = huge.to_string().len();
    attacker.create_rule("huge", huge).await;
    // The admin rule's copy follows its source while the tenant rule exists.
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &target, &source, &op, "admin").await;
    let source = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &target, &source, &op, "admin").await;

    assert_for(
        "/healthz answers 200 for twice --stuck-after",
        Duration::from_secs(10),
        async || match http_get(operator.port, "/healthz").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        },
    )
    .await;
    let longest = operator.logs().lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest < 4096,
        "a log line of {longest} bytes (the rule is {rule_bytes})"
    );
    let refused = t
        .wait_rule(&team_a, "huge", "InvalidRule", |r| {
            not_ready_because(r, "InvalidRule")
        })
        .await;
    let message = ready_condition(&refused)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    println!("a {rule_bytes}-byte rule: {message}");
    assert!(
        message.starts_with("selector: as a query it is") && message.len() < 200,
        "{message}"
    );

    operator.assert_running();
}

/// A tenant's rule costs the tenant: its planning is bounded. The tenant
/// of `team-a` writes a rule with 64 `stripLabels` globs that backtrack
/// over every key, and a source with 1,000 label keys of 317 characters,
/// copied into a namespace of its own that accepts it. The rule reads
/// `TransformTooCostly` and writes nothing; meanwhile `/healthz` answers
/// 200 and an admin rule's copy follows its source (both timed, printed).
#[tokio::test]
async fn a_tenant_rule_too_costly_to_plan_stalls_nobody_else() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-globs").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let team_a_too = t.ns("team-a-too").await;
    let target = t.ns("t1").await;
    t.namespaces()
        .patch(
            &team_a_too,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "copyrator.flant.com/accept-from": team_a.as_str()}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("team-a-too accepts team-a: {}", err_msg(&e)));
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--log-format", "json"]);
    let admin_source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &target, &admin_source, &op, "admin").await;

    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let prefix = [
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(60),
    ]
    .join(".");
    let mut labels: serde_json::Map<String, serde_json::Value> = (0..1000)
        .map(|i| (format!("{prefix}/{}k{i:04}", "a".repeat(58)), json!("v")))
        .collect();
    labels.insert(TEST_LABEL.to_owned(), json!(t.prefix));
    let source: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "costly", "labels": labels}, "data": {"k": "v"}}))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(attacker.client.clone(), &team_a)
        .create(&Default::default(), &source)
        .await
        .unwrap_or_else(|e| panic!("the tenant's source: {}", err_msg(&e)));
    let globs: Vec<String> = (0..64)
        .map(|i| format!("*{}b{i}", "a".repeat(60)))
        .collect();
    attacker
        .create_rule(
            "costly",
            json!({"spec": {"ruleType": "configmap", "selector": t.selector(),
                            "targets": {"include": [team_a_too.as_str()]},
                            "transform": {"stripLabels": globs}}}),
        )
        .await;
    t.wait_rule(&team_a, "costly", "TransformTooCostly", |r| {
        not_ready_because(r, "TransformTooCostly")
    })
    .await;
    t.assert_absent(
        CM,
        &team_a_too,
        "costly",
        "a rule too costly writes nothing",
    )
    .await;

    // While it stands (each source change plans it again), the operator
    // answers and the admin rule follows.
    let mut slowest_health = Duration::ZERO;
    for round in 0..3 {
        Api::<ConfigMap>::namespaced(attacker.client.clone(), &team_a)
            .patch(
                "costly",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": format!("v{round}")}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the tenant changes its source: {}", err_msg(&e)));
        let changed = std::time::Instant::now();
        let value = format!("admin-{round}");
        let admin_source = t.set_data(CM, &op, "cfg", &[("k", Some(&value))]).await;
        for _ in 0..5 {
            let asked = std::time::Instant::now();
            let (code, body) = http_get(operator.port, "/healthz")
                .await
                .unwrap_or_else(|e| panic!("/healthz: {e}"));
            assert_eq!(code, 200, "/healthz: {body}");
            slowest_health = slowest_health.max(asked.elapsed());
        }
        t.wait_copy(CM, &target, &admin_source, &op, "admin").await;
        println!(
            "round {round}: the admin copy followed in {:?}; slowest /healthz so far {:?}",
            changed.elapsed(),
            slowest_health
        );
    }
    operator.assert_running();
}
