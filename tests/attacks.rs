//! Attacks on a multi-tenant cluster, each as written in the trust review:
//! a tenant acts only through a ServiceAccount token bound to the built-in
//! `admin` ClusterRole in its own namespace ([`common::tenant::Tenant`]),
//! and each test asserts what every other user is promised (docs/trust.md).

mod common;

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
