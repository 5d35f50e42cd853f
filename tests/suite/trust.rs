//! Trust: who may create rules decides who may write.
//!
//! An operator with `--all-namespaces` would honour the rules of every test
//! that runs at the same time: its test names all its rules alike and passes
//! `--rule-name` as well (`rule_name_limits_the_operator_to_one_rule` proves
//! that filter).

use crate::common::rule_versions::RuleVersions;
use crate::common::tenant::{Tenant, copier_may_edit};
use crate::common::*;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

fn has_finalizer(rule: &Value) -> bool {
    rule["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.contains(&json!(FINALIZER)))
}

#[tokio::test]
async fn rule_outside_the_operator_namespace_is_ignored_by_default() {
    let t = TestNs::new("foreign-rule").await;
    let op = t.ns("op").await;
    let other = t.ns("other").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&other, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let honoured = t.create_source(CM, &op, "in-op", &[], &[("k", "v")]).await;
    t.create_source(CM, &other, "in-other", &[], &[("k", "v")])
        .await;
    t.wait_copy(CM, &t1, &honoured, &op, "r").await;
    t.assert_absent(
        CM,
        &t1,
        "in-other",
        "the rule is outside the operator's namespace",
    )
    .await;
    let ignored = t.get_rule(&other, "r").await;
    assert!(
        !has_finalizer(&ignored),
        "the ignored rule got a finalizer: {}",
        short_status(&ignored)
    );
    assert!(
        ignored.get("status").is_none_or(Value::is_null),
        "the ignored rule got a status: {}",
        short_status(&ignored)
    );
}

/// All four rules share one name, unique to the test, and the operator runs
/// with `--rule-name` too: an `--all-namespaces` operator must not adopt the
/// rules of whatever else lives in the cluster.
#[tokio::test]
async fn all_namespaces_lets_a_foreign_rule_pull_only_what_consents_into_its_own_namespace() {
    let t = TestNs::new("all-namespaces").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let reach_ns = t.ns("o1").await;
    let list_ns = t.ns("o2").await;
    let own_ns = t.ns("o3").await;
    let src = t.ns("src").await;
    let t1 = t.ns("t1").await;
    let which = |w: &str| json!({TEST_LABEL: t.prefix, "which": w});
    // Outside the operator's namespace, naming another source namespace: it
    // pulls from there only what consents, and only into its own namespace.
    let reach = with(
        rule_spec(CM, which("reach"), &[t.glob("t"), reach_ns.clone()]),
        "/spec/namespace",
        json!(src),
    );
    t.create_rule(&reach_ns, &rule, reach).await;
    // The same with the original top-level form and a list.
    let reach_list = json!({
        "ruleType": "configmap",
        "selector": which("reach"),
        "namespace": [list_ns, src],
        "spec": {"targets": {"include": [t.glob("t")]}},
    });
    t.create_rule(&list_ns, &rule, reach_list).await;
    // Outside the operator's namespace, copying from its own namespace: fine.
    t.create_rule(&own_ns, &rule, rule_spec(CM, which("own"), &[t.glob("t")]))
        .await;
    // In the operator's namespace, copying from anywhere: fine.
    let from_src = with(
        rule_spec(CM, which("op"), &[t.glob("t")]),
        "/spec/namespace",
        json!(src),
    );
    t.create_rule(&op, &rule, from_src).await;

    // A tenant rule writes only where it is accepted (t1 accepts the
    // pulling rules too: a pulled source still lands only at home).
    t.accept_from(&t1, &format!("{own_ns},{reach_ns},{list_ns}"))
        .await;
    // Each tenant rule writes as its namespace's ServiceAccount, which may
    // edit where the test lets it: the pulling rules may read `src`, so
    // what keeps them out is the source's consent alone.
    copier_may_edit(&t, &own_ns, &[&own_ns, &t1]).await;
    copier_may_edit(&t, &reach_ns, &[&reach_ns, &src]).await;
    copier_may_edit(&t, &list_ns, &[&list_ns, &src]).await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let labels = |w: &'static str| [(TEST_LABEL, t.prefix.as_str()), ("which", w)];
    let stolen = t
        .create_plain(CM, &src, "stolen", &labels("reach"), &[("k", "v")])
        .await;
    let own = t
        .create_plain(CM, &own_ns, "own", &labels("own"), &[("k", "v")])
        .await;
    let shared = t
        .create_plain(CM, &src, "shared", &labels("op"), &[("k", "v")])
        .await;
    t.wait_copy(CM, &t1, &own, &own_ns, &rule).await;
    t.wait_copy(CM, &t1, &shared, &op, &rule).await;

    // Without the source's consent the pulling rules find nothing: valid,
    // ready, no source, no copy.
    for ns in [&reach_ns, &list_ns] {
        let r = t
            .wait_rule(ns, &rule, "Ready True with no source", |r| {
                is_ready(r)?;
                match status_u64(r, "sources") {
                    Some(0) => Ok(()),
                    _ => Err(short_status(r)),
                }
            })
            .await;
        let uid = r["metadata"]["uid"].as_str().unwrap();
        assert!(
            t.list_labelled(CM, LABEL_RULE_UID, uid).await.is_empty(),
            "rule {ns}/{rule} made copies without consent"
        );
    }
    for ns in [&t1, &op, &own_ns, &reach_ns, &list_ns] {
        assert!(
            t.get(CM, ns, "stolen").await.is_none(),
            "stolen copied into {ns} without its consent"
        );
    }

    // The source consents to reach_ns (by a glob): pulled into reach_ns
    // alone, not into t1, and not by the rule of list_ns.
    let allow_to =
        |to: &str| json!({"metadata": {"annotations": {"copyrator.flant.com/allow-to": to}}});
    // A list with a glob that matches reach_ns ("...-o1") and not list_ns.
    let glob = format!("nobody, *{}", &reach_ns[reach_ns.len() - 3..]);
    t.cms(&src)
        .patch(
            &stolen.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(allow_to(&glob)),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating the source: {}", err_msg(&e)));
    // The consent itself does not travel (Copyrator's own annotations never do).
    let reach_uid = t.rule_uid(&reach_ns, &rule).await;
    let pulled = t
        .wait_obj(CM, &reach_ns, &stolen.name, "the pulled copy", |o| {
            o.data_is(&[("k", "v")])?;
            if o.label(LABEL_RULE_UID) != Some(reach_uid.as_str()) {
                return Err(format!("rule uid {:?}", o.label(LABEL_RULE_UID)));
            }
            Ok(())
        })
        .await;
    assert_eq!(pulled.annotation("copyrator.flant.com/allow-to"), None);
    t.wait_rule(&reach_ns, &rule, "one source, one copy", |r| {
        match (status_u64(r, "sources"), status_u64(r, "copies")) {
            (Some(1), Some(1)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    for ns in [&t1, &list_ns] {
        assert!(
            t.get(CM, ns, "stolen").await.is_none(),
            "a pulled source landed in {ns}"
        );
    }

    // Consent withdrawn: the pulled copy goes.
    t.cms(&src)
        .patch(
            &stolen.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(allow_to("nobody")),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating the source: {}", err_msg(&e)));
    t.wait_gone(CM, &reach_ns, "stolen", "the source no longer consents")
        .await;
    operator.assert_running();
}

#[tokio::test]
async fn rule_name_limits_the_operator_to_one_rule() {
    let t = TestNs::new("rule-name").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let which = |w: &str| json!({TEST_LABEL: t.prefix, "which": w});
    t.create_rule(
        &op,
        "chosen",
        rule_spec(CM, which("chosen"), &[t.glob("t")]),
    )
    .await;
    t.create_rule(&op, "other", rule_spec(CM, which("other"), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &["--rule-name", "chosen"]);
    let a = t
        .create_plain(
            CM,
            &op,
            "a",
            &[(TEST_LABEL, &t.prefix), ("which", "chosen")],
            &[("k", "v")],
        )
        .await;
    t.create_plain(
        CM,
        &op,
        "b",
        &[(TEST_LABEL, &t.prefix), ("which", "other")],
        &[("k", "v")],
    )
    .await;
    t.wait_copy(CM, &t1, &a, &op, "chosen").await;
    t.assert_absent(CM, &t1, "b", "--rule-name names another rule")
        .await;
    let other = t.get_rule(&op, "other").await;
    assert!(
        !has_finalizer(&other),
        "the other rule got a finalizer: {}",
        short_status(&other)
    );
    assert!(
        other.get("status").is_none_or(Value::is_null),
        "the other rule got a status: {}",
        short_status(&other)
    );
}

/// With `--all-namespaces`, a rule outside the operator's namespace (a
/// tenant rule) writes only into namespaces whose `accept-from` annotation
/// names its namespace (or a glob matching it); the others are not even
/// counted in its status. Consent given later fills the namespace. A tenant rule may
/// not use `conflictPolicy: Overwrite`.
#[tokio::test]
async fn a_tenant_rule_writes_only_where_accepted_and_never_overwrites() {
    let t = TestNs::new("consent").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let tenant = t.ns("ta").await;
    let greedy = t.ns("greedy").await;
    let (t1, t2, t3, t4) = (
        t.ns("t1").await,
        t.ns("t2").await,
        t.ns("t3").await,
        t.ns("t4").await,
    );
    t.accept_from(&t1, &format!("other, {tenant}")).await;
    t.accept_from(&t2, "other").await;
    t.accept_from(&t3, &format!("{}-t*", t.prefix)).await;
    t.create_rule(&tenant, &rule, rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(
        &greedy,
        &rule,
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/conflictPolicy",
            json!("Overwrite"),
        ),
    )
    .await;
    // Its ServiceAccount may edit in every target: the annotations alone
    // decide where it writes (--consent-by-rights is off).
    copier_may_edit(&t, &tenant, &[&tenant, &t1, &t2, &t3, &t4]).await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let src = t
        .create_source(CM, &tenant, "cfg", &[], &[("k", "v")])
        .await;
    for ns in [&t1, &t3] {
        t.wait_copy(CM, ns, &src, &tenant, &rule).await;
    }
    let status = t
        .wait_rule(
            &tenant,
            &rule,
            "two target namespaces",
            |r| match status_u64(r, "targetNamespaces") {
                Some(2) => Ok(()),
                other => Err(format!("targetNamespaces {other:?}; {}", short_status(r))),
            },
        )
        .await;
    println!("consent: {}", status["status"]);
    // The namespaces that do not accept it are not even counted: a count
    // would tell the tenant of namespaces it may not see.
    assert_eq!(
        status_u64(&status, "notAcceptingNamespaces").unwrap_or(0),
        0,
        "{}",
        status["status"]
    );
    for ns in [&t2, &t4] {
        t.assert_absent(CM, ns, "cfg", "the namespace does not accept the tenant")
            .await;
    }
    // Consent given later: the namespace is filled.
    t.accept_from(&t4, &tenant).await;
    t.wait_copy(CM, &t4, &src, &tenant, &rule).await;

    let refused = t
        .wait_rule(&greedy, &rule, "Overwrite refused as Forbidden", |r| {
            let c = ready_condition(r).ok_or_else(|| short_status(r))?;
            if c["status"] == "False" && c["reason"] == "Forbidden" {
                Ok(())
            } else {
                Err(short_status(r))
            }
        })
        .await;
    println!("overwrite: {}", ready_condition(&refused).unwrap());
    operator.assert_running();
}

/// A tenant rule pushes into two namespaces, one of which does not accept
/// it, and pulls from a namespace where only one object consents. What does
/// not consent is never named in the rule's status, in any version of it:
/// the namespace that does not accept it (which holds an object that would
/// be a conflict), and the objects that do not allow it (one that would be
/// a refused source, one that would share a name with a source). The
/// namespace is not counted either (`notAcceptingNamespaces` stays 0: a
/// count would tell of namespaces the tenant may not see), nor are the
/// objects. The same things where consent is given are named: a
/// conflict in the accepting namespace, a refused source at home.
#[tokio::test]
async fn what_does_not_consent_is_never_named_in_a_tenant_rules_status() {
    let t = TestNs::new("unnamed").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let home = t.ns("home").await;
    let elsewhere = t.ns("sx").await;
    let open = t.ns("t-open").await;
    let closed = t.ns("t-closed").await;
    t.accept_from(&open, &home).await;

    let labels = json!({TEST_LABEL: t.prefix});
    let secret = |type_: &str, annotations: Value| {
        json!({"metadata": {"labels": labels, "annotations": annotations},
               "type": type_, "stringData": {"k": "v"}})
    };
    let token = "bootstrap.kubernetes.io/token";
    let consents = json!({"copyrator.flant.com/allow-to": home});
    // At home: copied, in conflict where an object holds its name, refused
    // for its type.
    let cfg = t
        .create_json(SECRET, &home, "cfg", secret("Opaque", json!({})))
        .await;
    t.create_json(SECRET, &home, "clash", secret("Opaque", json!({})))
        .await;
    t.create_json(SECRET, &home, "home-token", secret(token, json!({})))
        .await;
    for ns in [&open, &closed] {
        t.create_plain(SECRET, ns, "clash", &[], &[("k", "theirs")])
            .await;
    }
    // Elsewhere: one object consents; one shares a name with a source at
    // home and one is of a type never copied, and neither consents.
    let pulled = t
        .create_json(SECRET, &elsewhere, "pulled", secret("Opaque", consents))
        .await;
    t.create_json(SECRET, &elsewhere, "cfg", secret("Opaque", json!({})))
        .await;
    t.create_json(SECRET, &elsewhere, "hidden-token", secret(token, json!({})))
        .await;

    let versions = RuleVersions::start(&t, &home, &rule).await;
    t.create_rule(
        &home,
        &rule,
        json!({"spec": {
            "ruleType": "secret",
            "selector": t.selector(),
            "namespace": [home, elsewhere],
            "targets": {"include": [t.glob("t-"), home]},
        }}),
    )
    .await;
    // Its ServiceAccount may edit everywhere the rule looks: consent (and
    // this test) is about the annotations.
    copier_may_edit(&t, &home, &[&home, &elsewhere, &open, &closed]).await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    t.wait_copy(SECRET, &open, &cfg, &home, &rule).await;
    // (The consent itself does not travel: no full check of the copy.)
    let rule_uid = t.rule_uid(&home, &rule).await;
    t.wait_obj(SECRET, &home, &pulled.name, "the pulled copy", |o| {
        o.data_is(&[("k", "v")])?;
        match o.label(LABEL_RULE_UID) {
            Some(uid) if uid == rule_uid => Ok(()),
            other => Err(format!("rule uid {other:?}")),
        }
    })
    .await;
    let named = |r: &Value, list: &str| -> Vec<String> {
        r["status"][list]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        format!(
                            "{}/{}",
                            e["namespace"].as_str().unwrap_or_default(),
                            e["name"].as_str().unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let status = t
        .wait_rule(&home, &rule, "what consents counted and named", |r| {
            let generation = r.pointer("/metadata/generation");
            let counts = [
                "sources",
                "copies",
                "conflictCount",
                "refusedSourceCount",
                "notAcceptingNamespaces",
            ]
            .map(|field| status_u64(r, field).unwrap_or(0));
            let seen = (counts, named(r, "conflicts"), named(r, "refusedSources"));
            // home's cfg and clash, and the object that consents; cfg in
            // the open namespace and the pulled one at home; the namespace
            // that does not accept it not even counted.
            let want = (
                [3, 2, 1, 1, 0],
                vec![format!("{open}/clash")],
                vec![format!("{home}/home-token")],
            );
            if generation.is_some()
                && generation == r.pointer("/status/observedGeneration")
                && seen == want
            {
                Ok(())
            } else {
                Err(format!("{seen:?}, want {want:?}: {}", short_status(r)))
            }
        })
        .await;
    println!("unnamed: {}", status["status"]);

    // Nothing else happens in the namespace that does not accept the rule.
    t.assert_absent(
        SECRET,
        &closed,
        "cfg",
        "the namespace does not accept the rule",
    )
    .await;
    let theirs = t.must_get(SECRET, &closed, "clash").await;
    assert!(!theirs.is_copy(), "the object in {closed} was taken over");

    let never_named = [closed.as_str(), elsewhere.as_str(), "hidden-token"];
    let versions = versions.seen().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        versions.iter().any(|r| r.get("status").is_some()),
        "no version of the rule with a status was seen"
    );
    for version in &versions {
        let said = version
            .get("status")
            .map(Value::to_string)
            .unwrap_or_default();
        for name in never_named {
            assert!(
                !said.contains(name),
                "the status names {name}, which does not consent: {said}"
            );
        }
    }
    println!("unnamed: {} versions of the rule seen", versions.len());
    operator.assert_running();
}

/// A tenant rule adopts only where it may write: of two namespaces holding
/// an object with the copy's content, both letting the tenant adopt, the
/// one that accepts the tenant's copies has it adopted (same uid, now the
/// rule's copy); the one that does not is left exactly as it was, and its
/// object is not counted.
#[tokio::test]
async fn a_tenant_rule_adopts_only_where_it_is_accepted() {
    let t = TestNs::new("consent-adopt").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let tenant = t.ns("ta").await;
    let (accepting, refusing) = (t.ns("t1").await, t.ns("t2").await);
    t.accept_from(&accepting, &tenant).await;
    // Adopting what no tool's mark says came from the tenant's namespace
    // needs the namespace's word as well.
    t.adopt_from(&accepting, &tenant).await;
    t.adopt_from(&refusing, &tenant).await;
    let mut before = Vec::new();
    for ns in [&accepting, &refusing] {
        let made = t
            .create_plain(CM, ns, "cfg", &[("owner", "another-tool")], &[("k", "v")])
            .await;
        before.push(made);
    }
    // The tenant: a ServiceAccount with the built-in admin role in its
    // namespace, making its rule as itself.
    let attacker = Tenant::admin_of(&t, &tenant, "tenant").await;
    attacker
        .create_rule(
            &rule,
            with(
                rule_spec(CM, t.selector(), &[t.glob("t")]),
                "/spec/adopt",
                json!(true),
            ),
        )
        .await;
    copier_may_edit(&t, &tenant, &[&tenant, &accepting, &refusing]).await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    t.create_source(CM, &tenant, "cfg", &[], &[("k", "v")])
        .await;
    let status = t
        .wait_rule(&tenant, &rule, "one adopted, no conflict", |r| {
            match (
                status_u64(r, "adoptedCopies"),
                status_u64(r, "conflictCount"),
                status_u64(r, "targetNamespaces"),
            ) {
                (Some(1), Some(0), Some(1)) => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("status: {}", status["status"]);
    let adopted = t.must_get(CM, &accepting, "cfg").await;
    assert_eq!(adopted.uid, before[0].uid, "the same object");
    assert!(adopted.is_copy(), "{:?}", adopted.labels);
    let left = t.must_get(CM, &refusing, "cfg").await;
    assert_eq!(
        (&left.uid, &left.resource_version, &left.labels),
        (
            &before[1].uid,
            &before[1].resource_version,
            &before[1].labels
        ),
        "the object where the tenant may not write was touched"
    );
    operator.assert_running();
}

/// Adoption tells a tenant nothing of objects it did not make, and takes
/// none it may not have. Namespace `victim` accepts copies from the
/// tenants `ta` and `tb` but lets neither adopt; each has a rule with
/// `adopt: true` over a Secret `pin`, `ta` with the victim's PIN, `tb`
/// with another: both rules report the same conflict, and the victim's
/// Secret is untouched. In namespace `marked`, an object that another
/// tool's mark says came from `ta` is adopted by `ta`'s rule, and stays,
/// handed over, when that rule is deleted (the namespace never let `ta`
/// delete what it adopted).
#[tokio::test]
async fn a_tenants_adoption_reveals_and_takes_nothing_it_was_not_given() {
    let t = TestNs::new("adopt-oracle").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let (ta, tb) = (t.ns("ta").await, t.ns("tb").await);
    let victim = t.ns("victim").await;
    let marked = t.ns("marked").await;
    t.accept_from(&victim, &format!("{ta},{tb}")).await;
    t.accept_from(&marked, &ta).await;
    let pin = t
        .create_plain(
            Kind::Secret,
            &victim,
            "pin",
            &[("team", "victim")],
            &[("pin", "4821")],
        )
        .await;
    let tool_made = t
        .create_plain(
            Kind::Secret,
            &marked,
            "pin",
            &[("generate.kyverno.io/source-namespace", ta.as_str())],
            &[("pin", "4821")],
        )
        .await;
    for (ns, guess) in [(&ta, "4821"), (&tb, "0000")] {
        t.create_source(Kind::Secret, ns, "pin", &[], &[("pin", guess)])
            .await;
        let tenant = Tenant::admin_of(&t, ns, "tenant").await;
        tenant
            .create_rule(
                &rule,
                json!({"spec": {"ruleType": "secret", "selector": t.selector(),
                                "targets": {"include": [victim, marked]}, "adopt": true}}),
            )
            .await;
        copier_may_edit(&t, ns, &[ns, &victim, &marked]).await;
    }
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let mut reasons = Vec::new();
    for (ns, adopted) in [(&ta, 1), (&tb, 0)] {
        let status = t
            .wait_rule(ns, &rule, "one conflict at the victim's", |r| {
                match (
                    status_u64(r, "conflictCount"),
                    status_u64(r, "adoptedCopies").unwrap_or(0),
                ) {
                    (Some(1), a) if a == adopted => Ok(()),
                    _ => Err(short_status(r)),
                }
            })
            .await;
        let conflicts = status["status"]["conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(conflicts.len(), 1, "{}", status["status"]);
        assert_eq!(conflicts[0]["namespace"], json!(victim));
        reasons.push(conflicts[0]["reason"].clone());
    }
    assert_eq!(
        reasons[0], reasons[1],
        "the right guess and a wrong one are told apart"
    );
    let left = t.must_get(Kind::Secret, &victim, "pin").await;
    assert_eq!(
        (&left.uid, &left.resource_version, &left.labels),
        (&pin.uid, &pin.resource_version, &pin.labels),
        "the victim's Secret was touched"
    );
    let taken = t.must_get(Kind::Secret, &marked, "pin").await;
    assert_eq!(taken.uid, tool_made.uid, "adopted, the same object");
    assert!(taken.is_copy(), "{:?}", taken.labels);

    t.delete_rule(&ta, &rule).await;
    t.wait_rule_gone(&ta, &rule, "its finalizer done").await;
    let kept = t.must_get(Kind::Secret, &marked, "pin").await;
    assert_eq!(
        kept.uid, tool_made.uid,
        "what it adopted was deleted with it"
    );
    kept.data_is(&[("pin", "4821")])
        .unwrap_or_else(|e| panic!("the object it adopted: {e}"));
    operator.assert_running();
}
