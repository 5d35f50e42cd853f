//! API Priority and Fairness for a test: a priority level with one seat that
//! rejects what does not fit, and a FlowSchema that puts every request of one
//! ServiceAccount in it (or only its reads of one resource within
//! namespaces). The caller creates both with its own guard for
//! cluster-scoped objects, then waits until the API server has taken the
//! FlowSchema in.

use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};

use super::{TIMEOUT, err_msg, wait_until};

/// A PriorityLevelConfiguration named `level`: one seat, nothing lent,
/// requests that do not fit are rejected with 429.
pub fn one_seat_level(level: &str) -> Value {
    rejecting_level(level, 1)
}

/// A PriorityLevelConfiguration named `level` of `shares` nominal
/// concurrency shares (seats in proportion to the other levels' shares),
/// nothing lent, requests that do not fit rejected with 429.
pub fn rejecting_level(level: &str, shares: u32) -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": level},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares,
            "lendablePercent": 0,
            "limitResponse": {"type": "Reject"},
        }},
    })
}

/// A FlowSchema named `level` that sends every request of the ServiceAccount
/// `namespace/account` to the priority level `level`.
pub fn flow_schema_for(level: &str, namespace: &str, account: &str) -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": level},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount",
                              "serviceAccount": {"name": account, "namespace": namespace}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "namespaces": ["*"], "clusterScope": true}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    })
}

/// A FlowSchema named `level` that sends the LIST and WATCH requests of
/// the ServiceAccount `namespace/account` for `resource` (core group)
/// within a namespace (any, but not across all of them) to the priority
/// level `level`; its other requests go where they would go anyway.
pub fn flow_schema_for_namespaced_reads(
    level: &str,
    namespace: &str,
    account: &str,
    resource: &str,
) -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": level},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount",
                              "serviceAccount": {"name": account, "namespace": namespace}}],
                "resourceRules": [{"verbs": ["list", "watch"], "apiGroups": [""],
                                   "resources": [resource], "namespaces": ["*"]}],
            }],
        },
    })
}

/// Waits until the API server has taken the FlowSchema `name` in (it sets
/// its condition Dangling to False).
pub async fn wait_flow_schema_taken(client: &Client, name: &str) {
    let schemas: Api<FlowSchema> = Api::all(client.clone());
    wait_until(
        "the FlowSchema to be taken in (Dangling False)",
        TIMEOUT,
        async || {
            let fs = schemas.get(name).await.map_err(|e| err_msg(&e))?;
            let taken = fs
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Dangling" && c.status.as_deref() == Some("False"))
                });
            if taken {
                Ok(())
            } else {
                Err(format!("{:?}", fs.status))
            }
        },
    )
    .await;
}
