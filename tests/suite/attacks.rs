//! Attacks on a multi-tenant cluster, each as written in the trust review:
//! a tenant acts only through a ServiceAccount token bound to the built-in
//! `admin` ClusterRole in its own namespace ([`common::tenant::Tenant`]),
//! and each test asserts what every other user is promised (docs/trust.md).
//! The attacks whose operator serves every namespace (`--all-namespaces`,
//! any rule name) are in `tests/cluster_wide/attacks.rs`: such an operator
//! takes every other test's rules for tenants' rules.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::dynamic::*;
use crate::common::faults::signal;
use crate::common::helm::{find, render};
use crate::common::rbac::{ClusterScoped, Grant, Identity, grants_of};
use crate::common::tenant::{Tenant, copier_may_edit};
use crate::common::*;
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
    let operator = Operator::start(&t, &platform, &[]);
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
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "trust-bundle", "labels": taken.labels, "annotations": taken.annotations},
        "data": {"ca.crt": "EVIL-CA"},
    }))
    .expect("a ConfigMap");
    let as_copyrator = kube::api::PostParams {
        field_manager: Some("copyrator".to_owned()),
        ..Default::default()
    };
    // The operator would make the deleted copy again at once: it is paused
    // while the tenant deletes and forges, and sees both when it resumes.
    signal(&operator, "STOP");
    own_copy
        .delete("trust-bundle", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("the tenant deletes its copy: {}", err_msg(&e)));
    own_copy
        .create(&as_copyrator, &forged)
        .await
        .unwrap_or_else(|e| panic!("the tenant forges its copy: {}", err_msg(&e)));
    signal(&operator, "CONT");
    let latest = t.ns("team-d").await;
    restored_with_no_rollout(
        &t,
        (&platform, &source),
        &[&latest, &team_a],
        &[&canary, &team_b],
        "GOOD-CA",
    )
    .await;
}

/// The copies of `source` (of rule `r` in `platform`) in `restored` hold
/// its content again, the rule is ready with no rollout started, and for
/// a while every copy there and in `others` holds `ca.crt` = `content`.
async fn restored_with_no_rollout(
    t: &TestNs,
    (platform, source): (&str, &Obj),
    restored: &[&String],
    others: &[&String],
    content: &str,
) {
    for ns in restored {
        t.wait_copy(CM, ns, source, platform, "r").await;
    }
    let rule = t.wait_rule_ready(platform, "r").await;
    assert!(
        rule["status"]["rollouts"].is_null(),
        "a copy Copyrator did not last write started a rollout: {}",
        rule["status"]
    );
    assert_for("every copy holds the source's content", QUIET, async || {
        for ns in restored.iter().chain(others) {
            let copy = t.must_get(CM, ns, "trust-bundle").await;
            copy.data_is(&[("ca.crt", content)])?;
        }
        Ok(())
    })
    .await;
}

/// A copy's mark proves that Copyrator wrote its content there once, not
/// last. An admin rule copies `platform/trust-bundle` into every team in
/// two stages. The tenant of `team-a`, in the rest, saves its copy (data,
/// labels, annotations and mark) at OLD-CA; the source moves to NEW-CA,
/// which rolls out everywhere; the rule's pause is then made ten minutes,
/// so a rollout once started would hold the rest that long. While the
/// operator is down the tenant puts its saved copy back, `team-b`'s owner
/// deletes its copy to refresh it and a new namespace of the rest comes.
/// After the restart the old copy is restored at once, nothing starts a
/// rollout, and no namespace gets OLD-CA.
#[tokio::test]
async fn an_older_copy_put_back_while_the_operator_is_down_is_restored_at_once() {
    let t = TestNs::new("atk-putback").await;
    let platform = t.ns("platform").await;
    let canary = t.ns_labelled("canary", &[("stage", "canary")]).await;
    let team_a = t.ns("team-a").await;
    let team_b = t.ns("team-b").await;
    let rollout = |pause: u64| {
        json!({
            "stages": [{"name": "canary", "namespaceSelector": {"matchLabels": {"stage": "canary"}},
                        "pauseSeconds": pause}],
            "settleTimeoutSeconds": 600,
        })
    };
    t.create_rule(
        &platform,
        "r",
        with(
            rule_spec(CM, t.selector(), &[t.glob("")]),
            "/spec/rollout",
            rollout(1),
        ),
    )
    .await;
    // As the chart's ServiceAccount: the record goes through the status
    // writes the chart grants.
    let cluster = ClusterScoped::new();
    let id = common::rbac::as_the_chart(&t, &cluster, &platform, &[]).await;
    let mut operator = id.run_operator(&t);
    let source = t
        .create_source(CM, &platform, "trust-bundle", &[], &[("ca.crt", "OLD-CA")])
        .await;
    for ns in [&canary, &team_a, &team_b] {
        t.wait_copy(CM, ns, &source, &platform, "r").await;
    }
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let own_copy: Api<ConfigMap> = Api::namespaced(attacker.client.clone(), &team_a);
    let saved = own_copy
        .get("trust-bundle")
        .await
        .unwrap_or_else(|e| panic!("the tenant saves its copy: {}", err_msg(&e)));
    assert!(
        saved
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("copyrator.flant.com/mark")),
        "the saved copy carries its mark"
    );

    let source = t
        .set_data(CM, &platform, "trust-bundle", &[("ca.crt", Some("NEW-CA"))])
        .await;
    for ns in [&canary, &team_a, &team_b] {
        t.wait_copy(CM, ns, &source, &platform, "r").await;
    }
    let rule = t
        .wait_rule(&platform, "r", "NEW-CA rolled out everywhere", |rule| {
            is_ready(rule)?;
            match rule["status"]["rollouts"].is_null() {
                true => Ok(()),
                false => Err(format!("still rolling: {}", rule["status"]["rollouts"])),
            }
        })
        .await;
    assert!(
        rule["status"]["rolledOut"]["trust-bundle"].is_string(),
        "what was rolled out is kept where a restart finds it: {}",
        rule["status"]
    );
    t.patch_rule(&platform, "r", json!({"spec": {"rollout": rollout(600)}}))
        .await;
    t.wait_rule_observed(&platform, "r", "the ten-minute pause")
        .await;

    operator.crash();
    let mut put_back = own_copy
        .get("trust-bundle")
        .await
        .unwrap_or_else(|e| panic!("the tenant reads its copy: {}", err_msg(&e)));
    put_back.data = saved.data.clone();
    put_back.metadata.labels = saved.metadata.labels.clone();
    put_back.metadata.annotations = saved.metadata.annotations.clone();
    own_copy
        .replace("trust-bundle", &Default::default(), &put_back)
        .await
        .unwrap_or_else(|e| panic!("the tenant puts its old copy back: {}", err_msg(&e)));
    t.delete(CM, &team_b, "trust-bundle").await;
    let team_c = t.ns("team-c").await;
    let _operator = id.run_operator(&t);

    restored_with_no_rollout(
        &t,
        (&platform, &source),
        &[&team_a, &team_b, &team_c],
        &[&canary],
        "NEW-CA",
    )
    .await;
}

/// Which rule a copy belongs to is what its mark proves, not its
/// rule-UID label. An admin rule copies `op/trust-bundle` into every team
/// in two stages (a canary, then the rest after a pause of ten minutes).
/// The tenant of `team-a` takes the admin copy in its namespace for a rule
/// of its own (it removes the copy's mark and writes its own content,
/// which its rule, pulling from the tenant's other namespace, adopts),
/// then labels that copy with the admin rule's UID. The admin rule takes
/// it for no copy of its own: when its source changes and a new namespace
/// of the rest comes while the canary pauses, that namespace gets the
/// content the rest held before (team-b's), never the tenant's.
#[tokio::test]
async fn a_copy_relabelled_with_an_admin_rules_uid_is_not_that_rules() {
    let t = TestNs::new("atk-owner").await;
    // One name for the admin rule and the tenant's, so that one operator
    // with `--all-namespaces` serves both and no other test's rules.
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let canary = t.ns_labelled("team-canary", &[("stage", "canary")]).await;
    let team_a = t.ns("team-a").await;
    let team_b = t.ns("team-b").await;
    let tenant_src = t.ns("tenant-src").await;
    t.create_rule(
        &op,
        &rule,
        with(
            rule_spec(CM, t.selector(), &[t.glob("team-")]),
            "/spec/rollout",
            json!({
                "stages": [{"name": "canary", "namespaceSelector": {"matchLabels": {"stage": "canary"}},
                            "pauseSeconds": 600}],
                "settleTimeoutSeconds": 600,
            }),
        ),
    )
    .await;
    let admin_uid = t.rule_uid(&op, &rule).await;
    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let source = t
        .create_source(CM, &op, "trust-bundle", &[], &[("ca.crt", "GOOD-CA")])
        .await;
    for ns in [&canary, &team_a, &team_b] {
        t.wait_copy(CM, ns, &source, &op, &rule).await;
    }
    t.wait_rule_ready(&op, &rule).await;

    // The tenant owns team-a and tenant-src; team-a accepts tenant-src's
    // rules, and lets them adopt.
    t.accept_from(&team_a, &tenant_src).await;
    t.adopt_from(&team_a, &tenant_src).await;
    let in_team_a = Tenant::admin_of(&t, &team_a, "attacker").await;
    let in_src = Tenant::admin_of(&t, &tenant_src, "attacker").await;
    // Its rules write as tenant-src's ServiceAccount, which team-a lets edit.
    copier_may_edit(&t, &tenant_src, &[&tenant_src, &team_a]).await;
    let tenant_source: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "trust-bundle", "labels": t.selector()},
        "data": {"ca.crt": "EVIL-CA"},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(in_src.client.clone(), &tenant_src)
        .create(&Default::default(), &tenant_source)
        .await
        .unwrap_or_else(|e| panic!("the tenant creates its source: {}", err_msg(&e)));
    in_src
        .create_rule(
            &rule,
            with(
                rule_spec(CM, t.selector(), &[team_a.as_str()]),
                "/spec/adopt",
                json!(true),
            ),
        )
        .await;
    let own_copy: Api<ConfigMap> = Api::namespaced(in_team_a.client.clone(), &team_a);
    own_copy
        .patch(
            "trust-bundle",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"copyrator.flant.com/mark": null}},
                "data": {"ca.crt": "EVIL-CA"},
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("the tenant takes the admin copy: {}", err_msg(&e)));
    let tenants_rule = format!("{tenant_src}/{rule}");
    t.wait_obj(
        CM,
        &team_a,
        "trust-bundle",
        "adopted by the tenant's rule",
        |o| match o.annotations.get("copyrator.flant.com/rule") {
            Some(owner) if *owner == tenants_rule => Ok(()),
            owner => Err(format!("its rule annotation: {owner:?}")),
        },
    )
    .await;
    own_copy
        .patch(
            "trust-bundle",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"copyrator.flant.com/rule-uid": admin_uid}}}),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("the tenant relabels its copy: {}", err_msg(&e)));

    // The source changes: the canary takes it and pauses; a namespace of
    // the rest made meanwhile gets what the rest held before.
    t.set_data(CM, &op, "trust-bundle", &[("ca.crt", Some("GOOD-CA-2"))])
        .await;
    t.wait_obj(CM, &canary, "trust-bundle", "the new content", |o| {
        o.data_is(&[("ca.crt", "GOOD-CA-2")])
    })
    .await;
    let late = t.ns("team-c").await;
    let made = t
        .wait_obj(
            CM,
            &late,
            "trust-bundle",
            "made while the canary pauses",
            |_| Ok(()),
        )
        .await;
    made.data_is(&[("ca.crt", "GOOD-CA")])
        .unwrap_or_else(|e| panic!("the new namespace's copy: {e}"));
    let kept = t.must_get(CM, &team_b, "trust-bundle").await;
    kept.data_is(&[("ca.crt", "GOOD-CA")])
        .unwrap_or_else(|e| panic!("team-b's copy, held for its stage: {e}"));
    // The tenant's object stays the tenant's: a conflict for the admin rule.
    t.wait_rule(&op, &rule, "team-a's object a conflict", |r| {
        let conflicts = r["status"]["conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if conflicts.iter().any(|c| c["namespace"] == json!(team_a)) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    operator.assert_running();
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

/// The mark key Secret as a tenant can have it created in the operator's
/// namespace before the operator's first start (through a copying tool
/// that writes where a source's owner says, say): a key the tenant chose,
/// labelled and written under Copyrator's own field manager as the
/// operator's own would be.
async fn plant_mark_key(t: &TestNs, namespace: &str, key: &[u8]) -> Secret {
    let planted: Secret = serde_json::from_value(json!({
        "metadata": {"name": "copyrator-mark-key",
                     "labels": {"app.kubernetes.io/managed-by": "copyrator"}},
        "data": {"key": k8s_openapi::ByteString(key.to_vec())},
    }))
    .expect("a Secret");
    let as_copyrator = kube::api::PostParams {
        field_manager: Some("copyrator".to_owned()),
        ..Default::default()
    };
    t.secrets(namespace)
        .create(&as_copyrator, &planted)
        .await
        .unwrap_or_else(|e| panic!("planting the mark key: {}", err_msg(&e)))
}

/// Waits until the mark key Secret of `namespace` is one the operator
/// made in place of `planted`: another Secret (uid), another key, and a
/// proof of its own uid under its own key. Returns its key.
async fn mark_key_replaced(t: &TestNs, namespace: &str, planted: &Secret) -> Vec<u8> {
    wait_until("the planted mark key to be replaced", TIMEOUT, async || {
        let secret = t
            .secrets(namespace)
            .get_opt("copyrator-mark-key")
            .await
            .map_err(|e| err_msg(&e))?
            .ok_or("no mark key Secret")?;
        if secret.metadata.uid == planted.metadata.uid {
            return Err("the planted Secret is still there".into());
        }
        let key = secret
            .data
            .as_ref()
            .and_then(|d| d.get("key"))
            .map(|k| k.0.clone())
            .ok_or("no key")?;
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let proof = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MARK_KEY_PROOF))
            .ok_or("no proof yet")?;
        match *proof == mark_key_proof(&key, &uid) {
            true => Ok(key),
            false => Err(format!("its proof {proof} is not of its uid under its key")),
        }
    })
    .await
}

/// The warning that reports a refused mark key Secret, with its reason.
async fn refused_mark_key_reported(operator: &Operator) -> String {
    let line = operator
        .wait_log_line("the refused mark key", TIMEOUT, |l| {
            l.level == "WARN"
                && l.message
                    == "the mark key Secret was not made by this operator; it is replaced by \
                        a new key (every copy is marked again)"
        })
        .await;
    line.str("reason").unwrap_or_default().to_owned()
}

/// Only the operator's own mark key counts. Before the operator's first
/// start, a Secret `copyrator-mark-key` holding a key the tenant of
/// `team-a` chose is in the operator's namespace, labelled and written as
/// the operator's own would be. The operator reports it (a warning with
/// its reason, `copyrator_mark_key_refused_total` 1) and makes its own
/// key in its place; the tenant, who kept the planted key, forges the mark
/// of a copy of the rule in its namespace (a name no source has): it is no
/// copy, never pruned, while the rule's real copy follows its source.
#[tokio::test]
async fn a_mark_key_planted_before_the_first_start_is_not_used() {
    let t = TestNs::new("atk-markkey").await;
    let platform = t.ns("platform").await;
    let team_a = t.ns("team-a").await;
    let planted_key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    let planted = plant_mark_key(&t, &platform, &planted_key).await;
    t.create_rule(
        &platform,
        "r",
        rule_spec(CM, t.selector(), &[t.glob("team-")]),
    )
    .await;
    let mut operator = Operator::start(&t, &platform, &["--log-format", "json"]);
    let reason = refused_mark_key_reported(&operator).await;
    assert_eq!(
        reason,
        "it carries no copyrator.flant.com/mark-key-proof (the operator writes one on the \
         Secret it made)"
    );
    let key = mark_key_replaced(&t, &platform, &planted).await;
    assert_ne!(key, planted_key);
    operator.wait_ready().await;
    let (_, metrics) = http_get(operator.port, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("/metrics: {e}"));
    assert_eq!(
        metric_family(&metrics, "copyrator_mark_key_refused_total"),
        Some(1.0)
    );

    let source = t
        .create_source(CM, &platform, "settings", &[], &[("k", "v1")])
        .await;
    t.wait_copy(CM, &team_a, &source, &platform, "r").await;
    let copy = t.must_get(CM, &team_a, "settings").await;
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    let rule = format!("{platform}/r");
    let mut annotations = copy.annotations.clone();
    annotations.insert(
        "copyrator.flant.com/source".to_owned(),
        format!("{platform}/forged"),
    );
    annotations.insert(
        "copyrator.flant.com/mark".to_owned(),
        format!(
            "{}.{}",
            copy_identity_tag(&planted_key, "ConfigMap", &team_a, "forged", &rule),
            "0".repeat(32)
        ),
    );
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "forged", "labels": copy.labels, "annotations": annotations},
        "data": {"k": "v1"},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(attacker.client.clone(), &team_a)
        .create(
            &kube::api::PostParams {
                field_manager: Some("copyrator".to_owned()),
                ..Default::default()
            },
            &forged,
        )
        .await
        .unwrap_or_else(|e| panic!("the tenant forges a copy: {}", err_msg(&e)));
    // A pass of the rule after the forgery: its copy follows a change.
    let source = t
        .set_data(CM, &platform, "settings", &[("k", Some("v2"))])
        .await;
    t.wait_copy(CM, &team_a, &source, &platform, "r").await;
    assert_for(
        "the object marked under the planted key stays",
        QUIET,
        async || match t.get(CM, &team_a, "forged").await {
            Some(_) => Ok(()),
            None => Err("it was pruned as a copy of the rule".into()),
        },
    )
    .await;
    operator.assert_running();
}

/// A mark key Secret that holds no usable key (5 bytes) is reported and
/// replaced; the operator starts, rather than exit and be restarted over
/// and over.
#[tokio::test]
async fn a_malformed_mark_key_is_reported_and_replaced_not_fatal() {
    let t = TestNs::new("atk-markkey-bad").await;
    let op = t.ns("op").await;
    let planted = plant_mark_key(&t, &op, b"short").await;
    let mut operator = Operator::start(&t, &op, &["--log-format", "json"]);
    let reason = refused_mark_key_reported(&operator).await;
    assert_eq!(
        reason,
        "it holds no usable key under data.key: the mark key has 5 bytes; at least 32 are needed"
    );
    mark_key_replaced(&t, &op, &planted).await;
    operator.wait_ready().await;
    operator.assert_running();
}

/// A ServiceAccount `scraper` in `namespace`, bound to a ClusterRole that
/// may get /metrics (gone with the returned objects), and its token.
async fn metrics_scraper(
    t: &TestNs,
    namespace: &str,
) -> (common::cluster_objects::ClusterObjects, String) {
    create_service_account(&t.client, namespace, "scraper").await;
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
                   "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]}),
        )
        .await;
    let ns = namespace.to_owned();
    let token = tokio::task::spawn_blocking(move || service_account_token(&ns, "scraper"))
        .await
        .expect("the scraper's token");
    (cluster, token)
}

/// GET /metrics with this bearer token, if any.
async fn get_metrics(port: u16, token: Option<&str>) -> (u16, String) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    http_get_with(port, "/metrics", &headers)
        .await
        .unwrap_or_else(|e| panic!("/metrics: {e}"))
}

/// Least exposure: with `--metrics-auth`, /metrics (which names every
/// rule and member) answers only callers the API server lets get it: no
/// token is 401, a tenant's token 403, a scraper bound to a ClusterRole
/// that may get /metrics reads them; /healthz stays open to the kubelet.
#[tokio::test]
async fn metrics_are_read_only_by_whom_the_api_server_lets() {
    let t = TestNs::new("atk-metrics").await;
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let operator = Operator::start(&t, &op, &["--metrics-auth"]);
    let tenant = Tenant::admin_of(&t, &team_a, "attacker").await;
    let (_reader, scraper) = metrics_scraper(&t, &op).await;
    let port = operator.port;
    assert_eq!(get_metrics(port, None).await.0, 401, "no token");
    assert_eq!(
        get_metrics(port, Some("made-up")).await.0,
        401,
        "a token nobody issued"
    );
    assert_eq!(
        get_metrics(port, Some(&tenant.token)).await.0,
        403,
        "a tenant's token"
    );
    // RBAC takes effect through a cache: the scraper may need a moment.
    wait_until("the scraper to read /metrics", TIMEOUT, async || {
        let (code, body) = get_metrics(port, Some(&scraper)).await;
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

/// A restart value is bound to its place. An admin rule copies the Secret
/// `db` into `team-b` and rolls its consumers; `team-b`'s Deployment `app`
/// reads the PIN in it. The tenant of `team-a` may view `team-b` (its
/// Deployments, not its Secrets) and writes a rule of its own with
/// `restartConsumers`, copying its Secrets into `team-a-apps` (which
/// accepts `team-a`, and which it administers too): one PIN guess each,
/// read as the victim reads it by a Deployment of its own, the right guess
/// named as the victim's copy and Deployment are. When the PINs change,
/// the operator writes a restart value on every consumer: none of the
/// tenant's equals the victim's, though one copy holds the very PIN. The
/// victim's value planted on that Deployment of the tenant's is not taken
/// for its own: a pass over the tenant's rule writes its own value back.
#[tokio::test]
async fn a_tenants_restart_values_never_match_another_workloads() {
    use crate::restart_consumers::{pod, restarts_as, workload_as, workload_resource};
    const SECRET: Kind = Kind::Secret;
    const PIN: &str = "4821";
    // (copy, Deployment, PIN): the right guess at the victim's names.
    const GUESSES: [(&str, &str, &str); 3] = [
        ("db", "app", PIN),
        ("db-1234", "app-1234", "1234"),
        ("db-9999", "app-9999", "9999"),
    ];
    let t = TestNs::new("atk-restart").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let team_b = t.ns("team-b").await;
    let team_a = t.ns("team-a").await;
    let apps = t.ns("team-a-apps").await;
    t.accept_from(&apps, &team_a).await;
    let restarting = |target: &str| {
        with(
            rule_spec(SECRET, t.selector(), &[target]),
            "/spec/rollout",
            json!({"restartConsumers": true}),
        )
    };
    t.create_rule(&op, &rule, restarting(&team_b)).await;
    let attacker = Tenant::admin_of(&t, &team_a, "attacker").await;
    attacker
        .bind_in(&t, &apps, "admin", ("apps", "deployments", "create"))
        .await;
    attacker
        .bind_in(&t, &team_b, "view", ("apps", "deployments", "get"))
        .await;
    attacker.create_rule(&rule, restarting(&apps)).await;
    // Its rule writes (and restarts) as team-a's ServiceAccount, which
    // team-a-apps lets edit; it holds nothing in team-b.
    copier_may_edit(&t, &team_a, &[&team_a, &apps]).await;
    let _operator = Operator::start(
        &t,
        &op,
        &[
            "--all-namespaces",
            "--rule-name",
            &rule,
            "--min-restart-interval",
            "0",
        ],
    );
    let uses_pin = |copy: &str| {
        pod(
            json!({"env": [{"name": "PIN",
                "valueFrom": {"secretKeyRef": {"name": copy, "key": "pin"}}}]}),
            json!([]),
        )
    };
    let victim = t
        .create_source(SECRET, &op, "db", &[], &[("pin", "0000")])
        .await;
    t.wait_copy(SECRET, &team_b, &victim, &op, &rule).await;
    workload_as(
        &t.client,
        "Deployment",
        &team_b,
        "app",
        uses_pin("db"),
        json!({}),
    )
    .await;
    let labels = [(TEST_LABEL, t.prefix.as_str())];
    for (copy, deployment, _) in GUESSES {
        let source = create_obj(
            &attacker.client,
            SECRET,
            &team_a,
            copy,
            plain_body(SECRET, &labels, &[("pin", "0000")]),
        )
        .await;
        t.wait_copy(SECRET, &apps, &source, &team_a, &rule).await;
        workload_as(
            &attacker.client,
            "Deployment",
            &apps,
            deployment,
            uses_pin(copy),
            json!({}),
        )
        .await;
    }

    // The PINs change: the victim's to PIN, each of the tenant's to its guess.
    let victim = t.set_data(SECRET, &op, "db", &[("pin", Some(PIN))]).await;
    t.wait_copy(SECRET, &team_b, &victim, &op, &rule).await;
    for (copy, _, guess) in GUESSES {
        let patch = data_patch(SECRET, &[("pin", Some(guess))]);
        let source = patch_obj(&attacker.client, SECRET, &team_a, copy, patch).await;
        t.wait_copy(SECRET, &apps, &source, &team_a, &rule).await;
    }
    let restart_value = async |ns: &str, deployment: &str| {
        let (annotations, _) = restarts_as(&attacker.client, "Deployment", ns, deployment).await;
        match annotations.into_iter().next() {
            Some(annotation) => Ok(annotation),
            None => Err(format!("{ns}/{deployment} carries no restart annotation")),
        }
    };
    let (victim_key, victim_value) = wait_until(
        "the victim's Deployment rolled, as the tenant reads it",
        TIMEOUT,
        async || restart_value(&team_b, "app").await,
    )
    .await;
    let mut found = Vec::new();
    for (copy, deployment, guess) in GUESSES {
        let (key, value) = wait_until(
            format!("the tenant's {deployment} rolled"),
            TIMEOUT,
            async || restart_value(&apps, deployment).await,
        )
        .await;
        println!("{deployment} (PIN {guess}, copy {copy}): {key}={value}");
        if value == victim_value {
            found.push(guess);
        }
    }
    let theirs = t.must_get(SECRET, &team_b, "db").await;
    let ours = t.must_get(SECRET, &apps, "db").await;
    assert_eq!(
        ours.data, theirs.data,
        "the tenant's copy db holds what the victim's does"
    );
    println!("the victim's team-b/app: {victim_key}={victim_value}");
    assert!(
        found.is_empty(),
        "the tenant's Deployments carry the victim's restart value for the PINs {found:?}: \
         the PIN is {PIN}"
    );

    // The victim's value planted on the tenant's Deployment that reads the
    // very PIN: a pass over the tenant's rule writes its own value back.
    let (_, own_value) = restart_value(&apps, "app")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let plant = json!({"spec": {"template": {"metadata": {"annotations": {
        victim_key.as_str(): victim_value.as_str()}}}}});
    Api::<DynamicObject>::namespaced_with(
        attacker.client.clone(),
        &apps,
        &workload_resource("Deployment"),
    )
    .patch("app", &PatchParams::default(), &Patch::Merge(&plant))
    .await
    .unwrap_or_else(|e| panic!("the tenant plants the victim's value: {}", err_msg(&e)));
    attacker
        .patch_rule(
            &rule,
            json!({"spec": {"targets": {"exclude": ["no-such-namespace"]}}}),
        )
        .await;
    wait_until(
        "the planted value replaced by the Deployment's own",
        TIMEOUT,
        async || match restart_value(&apps, "app").await? {
            (key, value) if key == victim_key && value == own_value => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

/// The answer /metrics gives a caller turned away unreviewed because
/// `--max-metrics-reviews` reviews are in flight (503).
const REVIEWS_BUSY: &str = "too many callers are being reviewed; try again\n";

/// The most requests of `events` the API server held at once (each from
/// when it received it to when it answered).
fn most_at_once(events: &[common::audit::AuditEvent]) -> usize {
    let mut edges: Vec<(chrono::DateTime<chrono::Utc>, i32)> = events
        .iter()
        .flat_map(|e| [(e.received, 1), (e.stage_timestamp, -1)])
        .collect();
    // An answer at the instant another arrives frees its place first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// `--metrics-auth` costs whoever reaches the port a bounded number of
/// reviews. An operator runs as a user of its own (so that the API
/// server's audit log tells its TokenReviews from everyone's) with the
/// default `--max-metrics-reviews` (4). A scraper reads /metrics; then
/// 4,000 requests, each with a new made-up token, 200 at a time: each is
/// answered 401 (one TokenReview) or 503 unreviewed, the audit log holds
/// exactly one TokenReview per 401, never more than 4 at once, and the 503s
/// cost nothing. Then 100 concurrent requests with one new token cost one
/// review; and the scraper's answer was kept through the flood (made-up
/// tokens never push out a caller the API server knows, and no answer is
/// dropped but the oldest), so its next read costs none.
#[tokio::test]
async fn made_up_tokens_cost_the_api_server_a_bounded_number_of_reviews() {
    use crate::common::audit::{Audit, Query};
    const FLOOD: usize = 4_000;
    const AT_ONCE: usize = 200;
    const MAX_REVIEWS: usize = 4;
    let t = TestNs::new("atk-metrics-flood").await;
    let op = t.ns("op").await;
    let user = operator_user(&t);
    let kubeconfig = operator_kubeconfig(&t, None, Some(&user));
    let mut operator = Operator::start_with_env(
        &t,
        vec![
            "run".into(),
            "--namespace".into(),
            op.clone(),
            "--metrics-auth".into(),
        ],
        &[("KUBECONFIG", &kubeconfig.to_string_lossy())],
    );
    operator.wait_ready().await;
    let port = operator.port;
    let (_reader, scraper) = metrics_scraper(&t, &op).await;
    wait_until(
        "the scraper to read /metrics",
        TIMEOUT,
        async || match get_metrics(port, Some(&scraper)).await.0 {
            200 => Ok(()),
            code => Err(format!("{code}")),
        },
    )
    .await;
    let audit = Audit::start();
    let reviews = |from, to| {
        Query::user(&user)
            .verbs(&["create"])
            .resource("tokenreviews")
            .between(from, to)
    };

    // The flood.
    let flood_start = chrono::Utc::now();
    let run = random5();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let requests: Vec<_> = (0..FLOOD)
        .map(|n| {
            let slots = slots.clone();
            let token = format!("made-up-{run}-{n}");
            tokio::spawn(async move {
                let _slot = slots
                    .acquire_owned()
                    .await
                    .expect("the semaphore stays open");
                get_metrics(port, Some(&token)).await
            })
        })
        .collect();
    let (mut unauthenticated, mut busy) = (0usize, 0usize);
    for request in requests {
        match request.await.expect("a request task") {
            (401, _) => unauthenticated += 1,
            (503, body) if body == REVIEWS_BUSY => busy += 1,
            (code, body) => panic!("a made-up token was answered {code}: {body}"),
        }
    }
    let flood_end = chrono::Utc::now();

    // One new token, 100 requests at once.
    let shared = format!("made-up-{run}-shared");
    let together: Vec<_> = (0..100)
        .map(|_| {
            let token = shared.clone();
            tokio::spawn(async move { get_metrics(port, Some(&token)).await.0 })
        })
        .collect();
    for request in together {
        assert_eq!(request.await.expect("a request task"), 401);
    }
    let shared_end = chrono::Utc::now();

    // The scraper again, after the flood.
    let (code, _) = get_metrics(port, Some(&scraper)).await;
    assert_eq!(code, 200, "the scraper reads /metrics after the flood");
    let end = chrono::Utc::now();
    audit.settle(&t.client, end).await;

    let flood_reviews = audit.matching(&reviews(flood_start, flood_end));
    println!(
        "{FLOOD} made-up tokens, {AT_ONCE} at a time: {unauthenticated} answered 401, {busy} \
         answered 503 unreviewed; {} TokenReviews, at most {} at once",
        flood_reviews.len(),
        most_at_once(&flood_reviews)
    );
    assert!(
        busy > 0,
        "past {MAX_REVIEWS} reviews in flight, a new token gets 503"
    );
    assert_eq!(
        flood_reviews.len(),
        unauthenticated,
        "one TokenReview per 401, none per 503"
    );
    assert!(
        most_at_once(&flood_reviews) <= MAX_REVIEWS,
        "at most {MAX_REVIEWS} TokenReviews at once: {}",
        most_at_once(&flood_reviews)
    );
    let shared_reviews = audit.count(&reviews(flood_end, shared_end));
    assert_eq!(shared_reviews, 1, "100 requests with one token: one review");
    let scraper_reviews = audit.count(&reviews(shared_end, end));
    assert_eq!(
        scraper_reviews, 0,
        "the scraper's answer outlived {FLOOD} made-up tokens"
    );
    operator.assert_running();
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
