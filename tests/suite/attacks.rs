//! Attacks on a multi-tenant cluster, each as written in the trust review:
//! a tenant acts only through a ServiceAccount token bound to the built-in
//! `admin` ClusterRole in its own namespace ([`common::tenant::Tenant`]),
//! and each test asserts what every other user is promised (docs/trust.md).
//! A test whose operator runs with `--all-namespaces` takes
//! [`CLUSTER_WIDE`] for writing; every other test takes it for reading.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::dynamic::*;
use common::helm::{find, render};
use common::rbac::{ClusterScoped, Grant, Identity, grants_of};
use common::tenant::Tenant;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
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
    // Deleted and made again under Copyrator's field manager, with the
    // copy's own labels and annotations (its mark too): the mark proves a
    // copy of this rule belongs here, not that EVIL-CA is Copyrator's
    // content, so it is restored like any edited copy, and no new
    // namespace ever takes EVIL-CA.
    let taken = t.must_get(CM, &team_a, "trust-bundle").await;
    assert!(
        taken.annotations.contains_key("copyrator.flant.com/mark"),
        "a copy carries Copyrator's mark: {:?}",
        taken.annotations
    );
    own_copy
        .delete("trust-bundle", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("the tenant deletes its copy: {}", err_msg(&e)));
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "trust-bundle", "labels": taken.labels, "annotations": taken.annotations},
        "data": {"ca.crt": "EVIL-CA"},
    }))
    .expect("a ConfigMap");
    own_copy
        .create(
            &kube::api::PostParams {
                field_manager: Some("copyrator".to_owned()),
                ..Default::default()
            },
            &forged,
        )
        .await
        .unwrap_or_else(|e| panic!("the tenant forges its copy: {}", err_msg(&e)));
    let latest = t.ns("team-d").await;
    for ns in [&latest, &team_a] {
        t.wait_copy(CM, ns, &source, &platform, "r").await;
    }
    let rule = t.wait_rule_ready(&platform, "r").await;
    assert!(
        rule["status"]["rollouts"].is_null(),
        "the forged copy started a rollout: {}",
        rule["status"]
    );
    assert_for("no copy holds the tenant's content", QUIET, async || {
        for ns in [&canary, &team_b, &team_a, &latest] {
            let copy = t.must_get(CM, ns, "trust-bundle").await;
            copy.data_is(&[("ca.crt", "GOOD-CA")])?;
        }
        Ok(())
    })
    .await;
}

/// Copyrator's marks cannot be forged. The tenant of `team-a` writes, under
/// Copyrator's field manager, objects that carry its rule's labels and
/// annotations as copies do (one without a mark, one with the mark of
/// its real copy), named as no source is: each stays what it is, never
/// pruned as a stale copy, while the rule's real copy follows its source.
/// Where a copy belongs, an unmarked object holding other content is a
/// conflict, not a copy; holding the source's content again, it is taken
/// back and marked.
#[tokio::test]
async fn an_object_forged_under_copyrators_name_is_no_copy() {
    let _shared = CLUSTER_WIDE.read().await;
    let t = TestNs::new("atk-forge").await;
    let platform = t.ns("platform").await;
    let team_a = t.ns("team-a").await;
    t.create_rule(
        &platform,
        "r",
        rule_spec(CM, t.selector(), &[t.glob("team-")]),
    )
    .await;
    let _operator = Operator::start(&t, &platform, &[]);
    let source = t
        .create_source(CM, &platform, "settings", &[], &[("k", "v1")])
        .await;
    t.wait_copy(CM, &team_a, &source, &platform, "r").await;
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let own: Api<ConfigMap> = Api::namespaced(attacker.client.clone(), &team_a);
    let copy = t.must_get(CM, &team_a, "settings").await;
    let as_copyrator = kube::api::PostParams {
        field_manager: Some("copyrator".to_owned()),
        ..Default::default()
    };
    let forge = |name: &str, keep_mark: bool, value: &str| {
        let mut annotations = copy.annotations.clone();
        if !keep_mark {
            annotations.remove("copyrator.flant.com/mark");
        }
        annotations.insert(
            "copyrator.flant.com/source".to_owned(),
            format!("{platform}/{name}"),
        );
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": {"name": name, "labels": copy.labels, "annotations": annotations},
            "data": {"k": value},
        }))
        .expect("a ConfigMap")
    };
    for (name, keep_mark) in [("unmarked", false), ("moved-mark", true)] {
        own.create(&as_copyrator, &forge(name, keep_mark, "v1"))
            .await
            .unwrap_or_else(|e| panic!("the tenant forges {name}: {}", err_msg(&e)));
    }
    // A pass of the rule after the forgeries: its copy follows a change.
    let source = t
        .set_data(CM, &platform, "settings", &[("k", Some("v2"))])
        .await;
    t.wait_copy(CM, &team_a, &source, &platform, "r").await;
    assert_for("the forged objects stay", QUIET, async || {
        for name in ["unmarked", "moved-mark"] {
            t.get(CM, &team_a, name)
                .await
                .ok_or_else(|| format!("{name} was pruned as a copy"))?;
        }
        Ok(())
    })
    .await;

    // Where the copy belongs: its mark taken off and its content changed
    // under Copyrator's field manager, it is no copy any more (a
    // conflict, left as it is).
    own.patch(
        "settings",
        &PatchParams {
            field_manager: Some("copyrator".to_owned()),
            ..Default::default()
        },
        &Patch::Merge(
            json!({"metadata": {"annotations": {"copyrator.flant.com/mark": null}},
                             "data": {"k": "EVIL"}}),
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("the tenant unmarks its copy: {}", err_msg(&e)));
    let rule = t
        .wait_rule(
            &platform,
            "r",
            "a conflict in team-a",
            |r| match r["status"]["conflictCount"].as_u64() {
                Some(1) => Ok(()),
                other => Err(format!("conflictCount {other:?}")),
            },
        )
        .await;
    println!("status: {}", rule["status"]);
    let held = t.must_get(CM, &team_a, "settings").await;
    held.data_is(&[("k", "EVIL")])
        .unwrap_or_else(|e| panic!("the object was taken as a copy: {e}"));

    // Holding the source's content again (as a copy written before marks
    // existed does), it is taken back: marked by Copyrator, no conflict.
    own.patch(
        "settings",
        &PatchParams {
            field_manager: Some("copyrator".to_owned()),
            ..Default::default()
        },
        &Patch::Merge(json!({"data": {"k": "v2"}})),
    )
    .await
    .unwrap_or_else(|e| panic!("the tenant restores the content: {}", err_msg(&e)));
    t.wait_rule(
        &platform,
        "r",
        "no conflict",
        |r| match r["status"]["conflictCount"].as_u64() {
            Some(0) => Ok(()),
            other => Err(format!("conflictCount {other:?}")),
        },
    )
    .await;
    wait_until("the copy to be marked again", TIMEOUT, async || {
        let copy = t.must_get(CM, &team_a, "settings").await;
        match copy.annotations.contains_key("copyrator.flant.com/mark") {
            true => Ok(()),
            false => Err(format!("{:?}", copy.annotations)),
        }
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
    let changed = std::time::Instant::now();
    let source = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &target, &source, &op, "admin").await;
    let followed = changed.elapsed();

    let mut slowest = Duration::ZERO;
    assert_for(
        "/healthz answers 200 for twice --stuck-after",
        Duration::from_secs(10),
        async || {
            let asked = std::time::Instant::now();
            let answer = http_get(operator.port, "/healthz").await?;
            slowest = slowest.max(asked.elapsed());
            match answer {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code}: {body}")),
            }
        },
    )
    .await;
    println!("the admin copy followed in {followed:?}; slowest /healthz {slowest:?}");
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

/// Consent before fetch. The tenant of `team-a` pulls from `platform` with
/// a selector that matches everything there: 30 ConfigMaps of 900 KB that
/// never consented, and one that consents to `team-a`. The consenting one
/// is copied; the operator's memory grows by far less than what did not
/// consent (it watches that namespace's metadata and reads whole only what
/// consents).
#[tokio::test]
async fn what_never_consented_is_neither_fetched_nor_held() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-fetch").await;
    let op = t.ns("op").await;
    let platform = t.ns("platform").await;
    let team_a = t.ns("team-a").await;
    let big = "x".repeat(900 * 1024);
    for i in 0..30 {
        t.create_source(
            CM,
            &platform,
            &format!("private-{i}"),
            &[],
            &[("blob", &big)],
        )
        .await;
    }
    let shared = t
        .create_json(
            CM,
            &platform,
            "shared",
            json!({"metadata": {"labels": {TEST_LABEL: t.prefix},
                                "annotations": {"copyrator.flant.com/allow-to": team_a.as_str()}},
                   "data": {"k": "v"}}),
        )
        .await;
    let operator = Operator::start(&t, &op, &["--all-namespaces"]);
    let pid = operator.pid().expect("the operator runs");
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let before = rss_kib(pid).unwrap_or_else(|e| panic!("the operator's memory: {e}"));
    attacker
        .create_rule(
            "pull",
            json!({"spec": {"ruleType": "configmap", "selector": {"matchExpressions": [
                {"key": "nothing-has-it", "operator": "DoesNotExist"}]},
                "namespace": [platform.as_str()]}}),
        )
        .await;
    t.wait_obj(
        CM,
        &team_a,
        &shared.name,
        "the consenting source's copy",
        |o| o.data_is(&[("k", "v")]),
    )
    .await;
    let rule = t
        .wait_rule(&team_a, "pull", "one source", |r| {
            match status_u64(r, "sources") {
                Some(1) => Ok(()),
                other => Err(format!("sources {other:?}: {}", short_status(r))),
            }
        })
        .await;
    let after = rss_kib(pid).unwrap_or_else(|e| panic!("the operator's memory: {e}"));
    let grown_mib = after.saturating_sub(before) as f64 / 1024.0;
    println!(
        "{}; the operator grew by {grown_mib:.1} MiB with 27 MiB that did not consent",
        short_status(&rule)
    );
    assert!(
        grown_mib < 10.0,
        "the operator grew by {grown_mib:.1} MiB: what did not consent was fetched and held"
    );
}

/// Past the watch budget, no list of every Secret. The tenant of `team-a`
/// pulls Secrets from nine namespaces (past the eight watches of the
/// budget) and edits its selector five times, while a rule of the
/// operator's namespace copies Secrets by another selector: the operator
/// never lists Secrets across the cluster without a rule's selector
/// (audit log).
#[tokio::test]
async fn a_tenant_past_the_watch_budget_never_makes_the_operator_list_every_secret() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-budget").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let mut sources = Vec::new();
    for i in 0..9 {
        sources.push(t.ns(&format!("src{i}")).await);
    }
    // The operator's own rule copies Secrets too, by another selector.
    let target = t.ns("t1").await;
    t.create_rule(
        &op,
        "admin",
        rule_spec(Kind::Secret, t.selector(), &[&target]),
    )
    .await;
    let user = operator_user(&t);
    let kubeconfig = operator_kubeconfig(&t, None, Some(&user));
    let audit = common::audit::Audit::start();
    let _operator = Operator::start_with_env(
        &t,
        vec![
            "run".into(),
            "--namespace".into(),
            op.clone(),
            "--all-namespaces".into(),
        ],
        &[("KUBECONFIG", &kubeconfig.display().to_string())],
    );
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let rule = |label: &str| {
        json!({"spec": {"ruleType": "secret", "selector": {label: "yes"},
                        "namespace": sources.clone()}})
    };
    attacker.create_rule("pull", rule("edit-0")).await;
    for edit in 1..=5 {
        let patch = json!({"spec": {"selector": {format!("edit-{}", edit - 1): null, format!("edit-{edit}"): "yes"}}});
        attacker.patch_rule("pull", patch).await;
        t.wait_rule_observed(&team_a, "pull", "the edit taken")
            .await;
    }
    let every_secret = |e: &common::audit::AuditEvent| {
        let uri = percent_decode(&e.request_uri);
        let selector = uri
            .split(['?', '&'])
            .find_map(|part| part.strip_prefix("labelSelector="))
            .unwrap_or("");
        e.namespace.is_none()
            && !uri.contains("limit=1&")
            && !uri.ends_with("limit=1")
            && selector
                .split(',')
                .all(|r| r.is_empty() || r.starts_with('!'))
    };
    let lists = audit
        .matching(
            &common::audit::Query::user(&user)
                .verbs(&["list"])
                .resource("secrets"),
        )
        .into_iter()
        .filter(every_secret)
        .map(|e| e.request_uri)
        .collect::<Vec<_>>();
    assert!(lists.is_empty(), "lists of every Secret: {lists:#?}");
}

/// `%2F` and friends in a request URI, decoded.
fn percent_decode(uri: &str) -> String {
    let bytes = uri.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = uri
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Least exposure. The tenant of `team-a`, who may not list namespaces,
/// probes for a namespace's name and labels with a rule's targets (a glob
/// and a namespace selector): its status reads the same whether such a
/// namespace exists or not.
#[tokio::test]
async fn a_tenant_learns_nothing_of_namespaces_it_may_not_see() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-probe").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let hidden = t.ns_labelled("acquisition-x", &[("deal", "secret")]).await;
    t.create_source(CM, &team_a, "cfg", &[], &[("k", "v")])
        .await;
    let _operator = Operator::start(&t, &op, &["--all-namespaces"]);
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let may_list = common::rbac::service_account_may(
        &t.client,
        &attacker.user,
        &team_a,
        json!({"resource": "namespaces", "verb": "list"}),
    )
    .await
    .unwrap_or_else(|e| panic!("a SubjectAccessReview: {e}"));
    assert!(!may_list, "the tenant may list namespaces");
    let counts = |r: &serde_json::Value| {
        [
            "targetNamespaces",
            "notAcceptingNamespaces",
            "protectedNamespaces",
        ]
        .map(|field| status_u64(r, field).unwrap_or(0))
    };
    let mut seen = Vec::new();
    for (name, glob) in [("hit", format!("{hidden}*")), ("miss", t.name("nothing-*"))] {
        attacker
            .create_rule(
                name,
                json!({"spec": {"ruleType": "configmap", "selector": t.selector(),
                                "targets": {"include": [glob],
                                            "namespaceSelector": {"matchLabels": {"deal": "secret"}}}}}),
            )
            .await;
        let rule = t.wait_rule_observed(&team_a, name, "a pass").await;
        seen.push((
            counts(&rule),
            ready_condition(&rule).map(|c| c["reason"].clone()),
        ));
    }
    println!("probing {hidden}: {seen:?}");
    assert_eq!(seen[0], seen[1], "the status tells whether {hidden} exists");
}

/// Least exposure: with `--metrics-auth`, /metrics (which names every
/// rule and member) answers only callers the API server lets get it: no
/// token is 401, a tenant's token 403, a scraper bound to a ClusterRole
/// that may get /metrics reads them; /healthz stays open to the kubelet.
#[tokio::test]
async fn metrics_are_read_only_by_whom_the_api_server_lets() {
    let _shared = CLUSTER_WIDE.read().await;
    let t = TestNs::new("atk-metrics").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let operator = Operator::start(&t, &op, &["--metrics-auth"]);
    let tenant = Tenant::admin_of(&t, &team_a, "attacker").await;
    create_service_account(&t.client, &op, "scraper").await;
    let cluster = common::cluster_objects::ClusterObjects::new();
    let reader = format!("{}-metrics-reader", t.prefix);
    cluster
        .create(
            &t.client,
            &common::rbac::rbac("ClusterRole", "clusterroles"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": reader},
                   "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        )
        .await;
    cluster
        .create(
            &t.client,
            &common::rbac::rbac("ClusterRoleBinding", "clusterrolebindings"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": reader},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
                   "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": op}]}),
        )
        .await;
    let (ns, sa) = (op.clone(), "scraper");
    let scraper = tokio::task::spawn_blocking(move || service_account_token(&ns, sa))
        .await
        .expect("the scraper's token");
    let get = |token: Option<String>| {
        let port = operator.port;
        async move {
            let bearer = token.map(|t| format!("Bearer {t}"));
            let headers: Vec<(&str, &str)> = bearer
                .as_deref()
                .map(|b| vec![("Authorization", b)])
                .unwrap_or_default();
            http_get_with(port, "/metrics", &headers)
                .await
                .unwrap_or_else(|e| panic!("/metrics: {e}"))
        }
    };
    assert_eq!(get(None).await.0, 401, "no token");
    assert_eq!(
        get(Some("made-up".into())).await.0,
        401,
        "a token nobody issued"
    );
    assert_eq!(
        get(Some(tenant.token.clone())).await.0,
        403,
        "a tenant's token"
    );
    // RBAC takes effect through a cache: the scraper may need a moment.
    wait_until("the scraper to read /metrics", TIMEOUT, async || {
        let (code, body) = get(Some(scraper.clone())).await;
        match code == 200 && body.contains("copyrator_source_watches") {
            true => Ok(()),
            false => Err(format!("{code}")),
        }
    })
    .await;
    let (code, _) = http_get(operator.port, "/healthz")
        .await
        .unwrap_or_else(|e| panic!("/healthz: {e}"));
    assert_eq!(code, 200, "/healthz needs no token");
}

/// A copy grants in its target only what its source granted in its own
/// namespace. An admin rule copies the labelled RoleBindings of `shared`,
/// a namespace the tenant administers, into `team-b` (it trusts the
/// sources' writers, as a rule must to copy RoleBindings at all; the same
/// rule without saying so copies nothing). The operator runs with the
/// chart's RBAC for RoleBindings, `rbacCopy` off. `team-b` keeps its
/// database password in a Secret that its own Role `secret-reader` lets
/// read. The tenant, admin of `shared` alone, makes an empty Role
/// `secret-reader` there and binds its ServiceAccount to it, labelled:
/// `team-b` gets no binding of it (the rule's status and an Event say
/// why), and the tenant's token still may not read the password, while a
/// binding whose Role grants the same in both namespaces is copied.
#[tokio::test]
async fn a_tenants_role_binding_binds_nothing_else_in_another_namespace() {
    let _shared = CLUSTER_WIDE.read().await;
    let stage = RbacStage::new().await;
    let (t, op) = (&stage.t, &stage.op);
    let (_operator, _its_rbac) = operator_as_the_chart_copying_role_bindings(t, op).await;
    t.wait_dyn_copy(&stage.bindings, &stage.team_b, &stage.legit, op, "r")
        .await;
    t.wait_rule_ready(op, "r").await;

    let attacker = Tenant::admin_of(t, &stage.shared, "attacker").await;
    stage.bind_to_an_empty_secret_reader(&attacker).await;
    let secrets = Api::<Secret>::namespaced(attacker.client.clone(), &stage.team_b);
    let reason = match stage.what_the_rule_made_of_steal().await {
        Some(reason) => reason,
        None => panic!(
            "team-b holds a copy of the tenant's binding steal to its own secret-reader; \
             the tenant's get of team-b's Secret db: {}",
            stage.read_by(&secrets).await
        ),
    };
    assert!(
        reason.contains("the Role secret-reader it binds grants other rules in")
            && reason.contains("a copy grants in its target only what its source grants"),
        "{reason}"
    );
    let steal = format!("{}/steal", stage.team_b);
    let event = wait_until(
        "a ConflictSkipped Event naming steal",
        TIMEOUT,
        async || {
            let events = t.events_regarding(op, "r").await;
            events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("ConflictSkipped"))
                .filter_map(|e| e.note.clone())
                .find(|note| note.contains(&steal))
                .ok_or_else(|| format!("{} events", events.len()))
        },
    )
    .await;
    println!("refused: {event}");
    assert_for(
        "no binding of the tenant's in team-b, and no read of its Secret",
        QUIET,
        async || {
            if t.try_get_dyn(&stage.bindings, &stage.team_b, "steal")
                .await?
                .is_some()
            {
                return Err("team-b holds a copy of the tenant's binding".into());
            }
            match secrets.get("db").await {
                Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
                other => Err(format!(
                    "the tenant's get of team-b's Secret: {:?}",
                    other.map(|_| "read")
                )),
            }
        },
    )
    .await;
    let legit_copy = t
        .must_get_dyn(&stage.bindings, &stage.team_b, "config-readers")
        .await;
    assert_eq!(
        legit_copy.payload(),
        stage.legit.payload(),
        "the copy stays"
    );
    t.wait_rule(op, "untrusting", "RBACSourcesNotTrusted", |r| {
        not_ready_because(r, "RBACSourcesNotTrusted")
    })
    .await;
    t.assert_dyn_absent(
        &stage.bindings,
        &stage.team_c,
        "config-readers",
        "a rule that does not trust its sources copies nothing",
    )
    .await;
}

/// The cluster of [`a_tenants_role_binding_binds_nothing_else_in_another_namespace`]
/// before the tenant acts: `team-b`'s Secret `db` and its Role
/// `secret-reader`, the Role `config-reader` granting the same in `shared`
/// and `team-b`, the labelled binding `config-readers` to it in `shared`,
/// and the rules in `op`: `r` into `team-b`, trusting its sources, and
/// `untrusting` into `team-c`.
struct RbacStage {
    t: TestNs,
    op: String,
    shared: String,
    team_b: String,
    team_c: String,
    roles: ApiResource,
    bindings: ApiResource,
    legit: DynObj,
    password: String,
}

impl RbacStage {
    async fn new() -> RbacStage {
        let t = TestNs::new("atk-rbac").await;
        let (op, shared) = (t.ns("op").await, t.ns("shared").await);
        let (team_b, team_c) = (t.ns("team-b").await, t.ns("team-c").await);
        let roles = ApiResource::erase::<Role>(&());
        let bindings = ApiResource::erase::<RoleBinding>(&());
        let password = format!("db-password-{}", random5());
        t.create_json(
            Kind::Secret,
            &team_b,
            "db",
            json!({"stringData": {"password": password}}),
        )
        .await;
        let reads_secrets = json!({"rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]});
        t.create_dyn(&roles, &team_b, "secret-reader", reads_secrets)
            .await;
        // The same rules in both namespaces, written in another order (and
        // within the operator's own grants).
        let maps =
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]});
        let names = json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]});
        t.create_dyn(
            &roles,
            &shared,
            "config-reader",
            json!({"rules": [maps, names]}),
        )
        .await;
        let maps =
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get"]});
        t.create_dyn(
            &roles,
            &team_b,
            "config-reader",
            json!({"rules": [names, maps]}),
        )
        .await;
        let readers =
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "readers"});
        let legit = t
            .create_dyn_source(
                &bindings,
                &shared,
                "config-readers",
                &[],
                &[],
                binding_to_role("config-reader", readers),
            )
            .await;
        let rule = |target: &str| {
            with(
                object_rule_spec(&bindings, t.selector(), &[target]),
                "/spec/namespace",
                json!(shared),
            )
        };
        let trusting = with(rule(&team_b), "/spec/rbacSourcesTrusted", json!(true));
        t.create_rule(&op, "r", trusting).await;
        t.create_rule(&op, "untrusting", rule(&team_c)).await;
        RbacStage {
            t,
            op,
            shared,
            team_b,
            team_c,
            roles,
            bindings,
            legit,
            password,
        }
    }

    /// As the tenant, in `shared`: an empty Role `secret-reader`, and a
    /// binding `steal` of its ServiceAccount to it, labelled for the rule.
    async fn bind_to_an_empty_secret_reader(&self, attacker: &Tenant) {
        let itself =
            json!({"kind": "ServiceAccount", "name": "attacker", "namespace": self.shared});
        for (ar, name, body) in [
            (&self.roles, "secret-reader", json!({"rules": []})),
            (
                &self.bindings,
                "steal",
                binding_to_role("secret-reader", itself),
            ),
        ] {
            let mut body = body;
            body["apiVersion"] = json!(ar.api_version);
            body["kind"] = json!(ar.kind);
            body["metadata"] = json!({"name": name, "labels": self.t.selector()});
            let object: DynamicObject = serde_json::from_value(body).expect("an object");
            Api::<DynamicObject>::namespaced_with(attacker.client.clone(), &self.shared, ar)
                .create(&Default::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("the tenant creates its {}: {}", ar.kind, err_msg(&e)));
        }
    }

    /// Why the rule `r` lists `team-b/steal` as not written; `None` once
    /// `team-b` holds a copy of `steal` instead.
    async fn what_the_rule_made_of_steal(&self) -> Option<String> {
        let (t, team_b) = (&self.t, self.team_b.as_str());
        wait_until(
            "the tenant's binding refused for team-b, or copied there",
            TIMEOUT,
            async || {
                if t.try_get_dyn(&self.bindings, team_b, "steal")
                    .await?
                    .is_some()
                {
                    return Ok(None);
                }
                let rule = t.get_rule(&self.op, "r").await;
                let conflicts = rule["status"]["conflicts"].as_array().cloned();
                conflicts
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c["namespace"] == team_b && c["name"] == "steal")
                    .map(|c| Some(c["reason"].as_str().unwrap_or_default().to_owned()))
                    .ok_or_else(|| short_status(&rule))
            },
        )
        .await
    }

    /// What a get of `team-b`'s Secret `db` through `secrets` (the
    /// tenant's) gives within a few seconds (RBAC takes effect through a
    /// cache): refused, or read, and whether it held the password.
    async fn read_by(&self, secrets: &Api<Secret>) -> String {
        for _ in 0..20 {
            if let Ok(secret) = secrets.get("db").await {
                let value = secret.data.and_then(|d| d.get("password").cloned());
                let same = value.is_some_and(|v| v.0 == self.password.as_bytes());
                return format!("read, and it holds team-b's password: {same}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        "refused".to_owned()
    }
}

/// A RoleBinding's payload: `subject` bound to the Role `role`.
fn binding_to_role(role: &str, subject: serde_json::Value) -> serde_json::Value {
    json!({
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [subject],
    })
}

/// An operator of `op` as the chart's ServiceAccount is with
/// `extraKinds: [RoleBinding]` (`rbacCopy` off: no `bind`, no `escalate`),
/// copying RoleBindings; and the guard of its ClusterRole and binding,
/// which go when it drops.
async fn operator_as_the_chart_copying_role_bindings(
    t: &TestNs,
    op: &str,
) -> (Operator, ClusterScoped) {
    let chart = render(&[
        "--set",
        "extraKinds[0].apiGroup=rbac.authorization.k8s.io",
        "--set",
        "extraKinds[0].kind=RoleBinding",
        "--set",
        "extraKinds[0].resource=rolebindings",
    ]);
    let grants = grants_of(find(&chart, "ClusterRole"));
    let cluster = ClusterScoped::new();
    let id = Identity::create(t, &cluster, op, "copyrator", &grants, &BTreeSet::new()).await;
    let no_bind = [Grant::new("rbac.authorization.k8s.io", "roles", "bind")]
        .into_iter()
        .collect();
    id.wait_effective(&t.client, op, &grants, &no_bind).await;
    let args = [
        "run",
        "--namespace",
        op,
        "--kinds",
        "configmap,secret,RoleBinding.rbac.authorization.k8s.io",
    ];
    let operator = Operator::start_with_env(
        t,
        args.map(String::from).to_vec(),
        &[("KUBECONFIG", &id.kubeconfig)],
    );
    (operator, cluster)
}

/// A tenant's rules together cost the tenant, not the operator. The tenant
/// of `team-a` writes five rules, each pulling Secrets by a selector of its
/// own from 16 namespaces (the most one rule may name): 80 watches. The
/// operator opens at most 64 for the namespace's rules together (plus the
/// operator's own rule's one); the fifth rule, last by name, says it is
/// not watched, and is watched once another of the tenant's rules goes.
#[tokio::test]
async fn a_tenants_many_rules_take_a_bounded_number_of_watches() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-watches").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let mut sources = Vec::new();
    for i in 0..16 {
        sources.push(t.ns(&format!("s{i}")).await);
    }
    let target = t.ns("t1").await;
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let operator = Operator::start(&t, &op, &["--all-namespaces"]);
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    for i in 0..5 {
        attacker
            .create_rule(
                &format!("r{i}"),
                json!({"spec": {"ruleType": "secret", "selector": {format!("pull-{i}"): "yes"},
                                "namespace": sources.clone()}}),
            )
            .await;
    }
    let message = |rule: &serde_json::Value| -> String {
        ready_condition(rule)
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let waiting = t
        .wait_rule(&team_a, "r4", "r4 not watched", |r| {
            let said = message(r);
            if said.contains("not watched") && said.contains("64 source watches") {
                Ok(())
            } else {
                Err(said)
            }
        })
        .await;
    println!("r4: {}", message(&waiting));
    for i in 0..4 {
        t.wait_rule_ready(&team_a, &format!("r{i}")).await;
    }
    let watches = || async {
        let (code, body) = http_get(operator.port, "/metrics").await?;
        if code != 200 {
            return Err(format!("/metrics answered {code}"));
        }
        body.lines()
            .find_map(|l| l.strip_prefix("copyrator_source_watches "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| "no copyrator_source_watches".to_owned())
    };
    assert_for(
        "at most 64 watches for team-a, 1 for the admin rule",
        QUIET,
        async || match watches().await? {
            n if n <= 65.0 => Ok(()),
            n => Err(format!("{n} source watches")),
        },
    )
    .await;
    // One of the tenant's rules goes: the fifth is watched.
    t.delete_rule(&team_a, "r0").await;
    t.wait_rule_ready(&team_a, "r4").await;
    println!(
        "after r0 went, r4 is watched: {} source watches",
        watches().await.unwrap_or(-1.0)
    );
}
