//! Attacks on a multi-tenant cluster whose operator serves every namespace
//! (`--all-namespaces`, any rule name), each as written in the trust review:
//! a tenant acts only through a ServiceAccount token bound to the built-in
//! `admin` ClusterRole in its own namespace ([`common::tenant::Tenant`]),
//! and each test asserts what every other user is promised (docs/trust.md).
//! Each takes [`CLUSTER_WIDE`] for writing: one at a time.

use crate::common;

use std::time::Duration;

use crate::common::tenant::{Tenant, copier_may_edit};
use crate::common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const CM: Kind = Kind::ConfigMap;

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
    // Its rules write as its namespace's ServiceAccount, which may edit
    // where the test needs it to.
    copier_may_edit(&t, &team_a, &[&team_a, &team_a_too]).await;
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
    // Its rules write as its namespace's ServiceAccount, which may edit
    // where the test needs it to.
    copier_may_edit(&t, &team_a, &[&team_a, &platform]).await;
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

/// A tenant's rules together cost the tenant, not the operator. The tenant
/// of `team-a` writes five rules, each pulling by a selector of its own
/// from 16 namespaces (the most one rule may name), Secrets or ConfigMaps:
/// 72 kinds and namespaces among 40 namespaces, a watch each. The operator
/// opens at most 64 for the namespace's rules together (plus the
/// operator's own rule's one); the fifth rule, last by name, says it is
/// not watched, and is watched once another of the tenant's rules goes.
#[tokio::test]
async fn a_tenants_many_rules_take_a_bounded_number_of_watches() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-watches").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let mut sources = Vec::new();
    for i in 0..40 {
        sources.push(t.ns(&format!("s{i}")).await);
    }
    let target = t.ns("t1").await;
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let operator = Operator::start(&t, &op, &["--all-namespaces"]);
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    // Its rules act as its namespace's ServiceAccount.
    copier_may_edit(&t, &team_a, &[&team_a]).await;
    // (kind, first namespace): Secrets and ConfigMaps of s0-s15 and
    // s16-s31 take 64 watches; Secrets of s24-s39 would add 8 more.
    let rules = [
        ("secret", 0),
        ("configmap", 0),
        ("secret", 16),
        ("configmap", 16),
        ("secret", 24),
    ];
    for (i, (kind, first)) in rules.into_iter().enumerate() {
        attacker
            .create_rule(
                &format!("r{i}"),
                json!({"spec": {"ruleType": kind, "selector": {format!("pull-{i}"): "yes"},
                                "namespace": sources[first..first + 16].to_vec()}}),
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

/// The operator's peak resident memory in KiB, sampled twice a second
/// until [`PeakMemory::finish`].
struct PeakMemory {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Result<u64, String>>,
}

impl PeakMemory {
    fn start(pid: u32) -> PeakMemory {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = rss_kib(pid)?.max(peak);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(peak.max(rss_kib(pid)?))
        });
        PeakMemory { stop, task }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task
            .await
            .expect("the memory sampler")
            .unwrap_or_else(|e| panic!("the operator's memory: {e}"))
    }
}

/// The chart's memory limit, in KiB.
const CHART_MEMORY_LIMIT_KIB: u64 = 128 * 1024;

/// A tenant's rules hold its sources once. The tenant of `team-a` writes
/// 40 rules whose selectors differ only by a `DoesNotExist` on a made-up
/// key, over four ConfigMaps of 900 KiB in its namespace (each rule a
/// watch, and a store of all four, before). The operator's memory stays
/// under the chart's limit of 128 MiB while the rules exist (sampled twice
/// a second), each rule counts its four sources, and an admin rule's copy
/// follows its source.
#[tokio::test]
async fn a_tenants_many_rules_over_the_same_sources_hold_them_once() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-memory").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let target = t.ns("t1").await;
    let blob = "x".repeat(900 * 1024);
    for i in 0..4 {
        t.create_source(CM, &team_a, &format!("big-{i}"), &[], &[("blob", &blob)])
            .await;
    }
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let operator = Operator::start(&t, &op, &["--all-namespaces"]);
    let pid = operator.pid().expect("the operator runs");
    let admin_source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &target, &admin_source, &op, "admin").await;
    let before = rss_kib(pid).unwrap_or_else(|e| panic!("the operator's memory: {e}"));
    let peak = PeakMemory::start(pid);

    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    // Its rules write as its namespace's ServiceAccount, which may edit
    // where the test needs it to.
    copier_may_edit(&t, &team_a, &[&team_a]).await;
    const RULES: usize = 40;
    for i in 0..RULES {
        attacker
            .create_rule(
                &format!("r{i:02}"),
                json!({"spec": {"ruleType": "configmap", "selector": {
                    "matchLabels": {TEST_LABEL: t.prefix},
                    "matchExpressions": [{"key": format!("made-up-{i}"), "operator": "DoesNotExist"}]}}}),
            )
            .await;
    }
    for i in 0..RULES {
        t.wait_rule(&team_a, &format!("r{i:02}"), "its four sources", |r| {
            let observed = r["status"]["observedGeneration"] == r["metadata"]["generation"];
            match status_u64(r, "sources") {
                Some(4) if observed => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    }
    // The admin rule follows while the tenant's rules stand.
    let admin_source = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &target, &admin_source, &op, "admin").await;
    let peak = peak.finish().await;
    let after = rss_kib(pid).unwrap_or_else(|e| panic!("the operator's memory: {e}"));
    println!(
        "{RULES} tenant rules over 4 ConfigMaps of 900 KiB: RSS {} MiB before, peak {} MiB, \
         {} MiB after",
        before / 1024,
        peak / 1024,
        after / 1024
    );
    assert!(
        peak < CHART_MEMORY_LIMIT_KIB,
        "the operator reached {} MiB, past the chart's limit of 128 MiB",
        peak / 1024
    );
}

/// A tenant's sources are bounded. Under `--max-tenant-source-mib 2`, the
/// tenant of `team-a` selects three ConfigMaps of 900 KiB in its
/// namespace: its rule reads `Ready=False`, reason `SourcesTooLarge`,
/// naming the flag, while an admin rule's copy follows its source; once
/// the tenant deletes one of them, the rest fit, and the rule counts two
/// sources.
#[tokio::test]
async fn past_its_bound_a_tenants_rule_says_so_and_fits_again() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-bound").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let target = t.ns("t1").await;
    let blob = "x".repeat(900 * 1024);
    for i in 0..3 {
        t.create_source(CM, &team_a, &format!("big-{i}"), &[], &[("blob", &blob)])
            .await;
    }
    t.create_rule(&op, "admin", rule_spec(CM, t.selector(), &[&target]))
        .await;
    let _operator = Operator::start(
        &t,
        &op,
        &["--all-namespaces", "--max-tenant-source-mib", "2"],
    );
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    // Its rules write as its namespace's ServiceAccount, which may edit
    // where the test needs it to.
    copier_may_edit(&t, &team_a, &[&team_a]).await;
    attacker
        .create_rule(
            "big",
            json!({"spec": {"ruleType": "configmap", "selector": t.selector()}}),
        )
        .await;
    let refused = t
        .wait_rule(&team_a, "big", "SourcesTooLarge", |r| {
            not_ready_because(r, "SourcesTooLarge")
        })
        .await;
    let message = ready_condition(&refused)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    println!("past the bound: {message}");
    assert!(
        message.contains("--max-tenant-source-mib") && message.contains(team_a.as_str()),
        "{message}"
    );
    let admin_source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &target, &admin_source, &op, "admin").await;

    t.delete(CM, &team_a, "big-2").await;
    let fits = t
        .wait_rule(&team_a, "big", "two sources once they fit", |r| {
            is_ready(r)?;
            match status_u64(r, "sources") {
                Some(2) => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("after one went: {}", short_status(&fits));
}

/// A tenant's data-key globs cost the tenant, not the operator. The
/// tenant of `team-a` copies two ConfigMaps of 1 MiB (4,000 keys of 250
/// characters) into a namespace of its own that accepts it, with
/// `rollout.restartConsumers` and 64 `transform.keys.include` globs (the most it may)
/// within the schema's caps (253 characters, one `*`) that backtrack from
/// every letter of every key. The rule reads `TransformTooCostly` and
/// writes nothing. While it stands and the tenant keeps changing its
/// sources, `/healthz` answers every probe (twenty a second) with 200 within
/// 100 ms, and an admin rule's copy follows its source within 0.5 s, as
/// a watch on the copy sees it (figures printed, before and during).
#[tokio::test]
async fn a_tenant_rule_whose_data_key_globs_cost_too_much_stalls_nobody_else() {
    const BIG: [&str; 2] = ["big-0", "big-1"];
    const ROUNDS: usize = 8;
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("atk-keys").await;
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
    let admin_source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &target, &admin_source, &op, "admin").await;
    // The same figures before the tenant's rule, on the same machine.
    let probes = HealthProbes::start(operator.port);
    let mut before = Vec::new();
    for round in 0..ROUNDS {
        before.push(copy_lag(&t, &op, &target, &format!("before-{round}")).await);
    }
    let health_before = probes.stop().await;

    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    // Its rules write as its namespace's ServiceAccount, which may edit
    // where the test needs it to.
    copier_may_edit(&t, &team_a, &[&team_a, &team_a_too]).await;
    let tenant_sources = Api::<ConfigMap>::namespaced(attacker.client.clone(), &team_a);
    let key = |i: usize| format!("{}{i:04}", "a".repeat(246));
    for name in BIG {
        let data: serde_json::Map<String, serde_json::Value> =
            (0..4000).map(|i| (key(i), json!("v"))).collect();
        let source: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {TEST_LABEL: t.prefix}}, "data": data}))
        .expect("a ConfigMap");
        tenant_sources
            .create(&Default::default(), &source)
            .await
            .unwrap_or_else(|e| panic!("the tenant's source {name}: {}", err_msg(&e)));
    }
    let globs: Vec<String> = (0..64)
        .map(|i| format!("*{}b{i:02}", "a".repeat(249)))
        .collect();
    let probes = HealthProbes::start(operator.port);
    attacker
        .create_rule(
            "keys",
            json!({"spec": {"ruleType": "configmap", "selector": t.selector(),
                            "targets": {"include": [team_a_too.as_str()]},
                            "transform": {"keys": {"include": globs}},
                            "rollout": {"restartConsumers": true}}}),
        )
        .await;
    // Each change of a source plans the tenant's rule again.
    let mut lags = Vec::new();
    for round in 0..ROUNDS {
        tenant_sources
            .patch(
                BIG[round % 2],
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {key(0): format!("v{round}")}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the tenant changes its source: {}", err_msg(&e)));
        lags.push(copy_lag(&t, &op, &target, &format!("round-{round}")).await);
    }
    let health = probes.stop().await;
    let slowest = |answers: &[(Duration, Result<u16, String>)]| {
        answers
            .iter()
            .map(|(took, _)| *took)
            .max()
            .unwrap_or_default()
    };
    let failed: Vec<&(Duration, Result<u16, String>)> = health
        .iter()
        .filter(|(_, answer)| *answer != Ok(200))
        .collect();
    println!(
        "before the tenant's rule: the admin copy followed in {before:?}; /healthz: {} probes, \
         slowest {:?}",
        health_before.len(),
        slowest(&health_before)
    );
    println!(
        "beside it: the admin copy followed in {lags:?}; /healthz: {} probes, {} failed, \
         slowest {:?}",
        health.len(),
        failed.len(),
        slowest(&health)
    );

    let costly = t
        .wait_rule(&team_a, "keys", "TransformTooCostly", |r| {
            not_ready_because(r, "TransformTooCostly")
        })
        .await;
    let message = ready_condition(&costly)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("transform.keys.include"), "{message}");
    for name in BIG {
        t.assert_absent(CM, &team_a_too, name, "a rule too costly writes nothing")
            .await;
    }
    // Bounds far from what a healthy operator takes (12 ms and 85 ms in a
    // release build) and far below what the unbounded matcher cost (probes
    // timing out after 5 s, the admin copy 15 s behind): the figures are
    // printed above, and a loaded debug build must not fail this test.
    assert!(failed.is_empty(), "/healthz failed: {failed:?}");
    assert!(
        slowest(&health) < Duration::from_secs(1),
        "/healthz took {:?}",
        slowest(&health)
    );
    let slowest_lag = lags.iter().max().copied().unwrap_or_default();
    assert!(
        slowest_lag < Duration::from_secs(3),
        "the admin copy followed in {lags:?}"
    );
    operator.assert_running();
}

/// How long the copy `target/cfg` takes to hold `value` under `k` after
/// its source `op/cfg` is given it, as a watch on the copy sees it; a
/// minute or more when it never does.
async fn copy_lag(t: &TestNs, op: &str, target: &str, value: &str) -> Duration {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{ListParams, WatchEvent, WatchParams};
    const FOLLOW_WITHIN: Duration = Duration::from_secs(60);
    let copies = t.cms(target);
    let by_name = "metadata.name=cfg";
    let version = copies
        .list(&ListParams::default().fields(by_name))
        .await
        .unwrap_or_else(|e| panic!("listing the copy: {}", err_msg(&e)))
        .metadata
        .resource_version
        .expect("a list has a resourceVersion");
    let mut events = copies
        .watch(
            &WatchParams::default().fields(by_name).timeout(70),
            &version,
        )
        .await
        .unwrap_or_else(|e| panic!("watching the copy: {}", err_msg(&e)))
        .boxed();
    let changed = std::time::Instant::now();
    t.set_data(CM, op, "cfg", &[("k", Some(value))]).await;
    let holds = |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("k"))
            .is_some_and(|v| v == value)
    };
    let followed = tokio::time::timeout(FOLLOW_WITHIN, async {
        while let Some(event) = events.try_next().await.ok().flatten() {
            if let WatchEvent::Added(cm) | WatchEvent::Modified(cm) = event
                && holds(&cm)
            {
                return;
            }
        }
        // The watch ended first: wait out the minute, a lag past it.
        std::future::pending::<()>().await;
    })
    .await;
    match followed {
        Ok(()) => changed.elapsed(),
        Err(_) => FOLLOW_WITHIN.max(changed.elapsed()),
    }
}

/// `/healthz` asked twenty times a second in the background, each answer
/// with how long it took (an error for none within 5 s).
struct HealthProbes {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(Duration, Result<u16, String>)>>,
}

impl HealthProbes {
    fn start(port: u16) -> HealthProbes {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let asked = std::time::Instant::now();
                let answer = http_get(port, "/healthz").await.map(|(code, _)| code);
                answers.push((asked.elapsed(), answer));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answers
        });
        HealthProbes { stop, task }
    }

    /// Every answer so far, once the probing stopped.
    async fn stop(self) -> Vec<(Duration, Result<u16, String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the probes ran")
    }
}
