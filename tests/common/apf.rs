//! API Priority and Fairness for a test: a priority level with one seat that
//! rejects what does not fit, and a FlowSchema that puts every request of one
//! ServiceAccount in it (or only its reads of one resource within
//! namespaces). [`one_seat_for`] creates both with the test's guard for
//! cluster-scoped objects and waits until the API server has taken the
//! FlowSchema in.

use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};

use super::cluster_objects::{ClusterObjects, ar};
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

/// Which requests of a ServiceAccount a FlowSchema of [`flow_schema_for`]
/// sends to its priority level.
#[derive(Clone, Copy)]
pub enum Throttled<'a> {
    /// Every request.
    All,
    /// The LIST and WATCH requests for this resource (core group) within a
    /// namespace (any, but not across all of them); its other requests go
    /// where they would go anyway.
    NamespacedReads(&'a str),
}

/// A FlowSchema named `level` that sends the `requests` of the
/// ServiceAccount `namespace/account` to the priority level `level`.
pub fn flow_schema_for(level: &str, namespace: &str, account: &str, requests: Throttled) -> Value {
    let mut rule = json!({
        "subjects": [{"kind": "ServiceAccount",
                      "serviceAccount": {"name": account, "namespace": namespace}}],
    });
    match requests {
        Throttled::All => {
            rule["resourceRules"] = json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                            "namespaces": ["*"], "clusterScope": true}]);
            rule["nonResourceRules"] = json!([{"verbs": ["*"], "nonResourceURLs": ["*"]}]);
        }
        Throttled::NamespacedReads(resource) => {
            rule["resourceRules"] = json!([{"verbs": ["list", "watch"], "apiGroups": [""],
                                            "resources": [resource], "namespaces": ["*"]}]);
        }
    }
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": level},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [rule],
        },
    })
}

/// A priority level named `level` with one seat that rejects what does not
/// fit ([`one_seat_level`]), and a FlowSchema of the same name that puts
/// the `requests` of the ServiceAccount `namespace/account` in it, both
/// made with `cluster` (deleted when it drops); returns once the API
/// server has taken the FlowSchema in.
pub async fn one_seat_for(
    client: &Client,
    cluster: &ClusterObjects,
    level: &str,
    namespace: &str,
    account: &str,
    requests: Throttled<'_>,
) {
    cluster
        .create(
            client,
            &ar::<PriorityLevelConfiguration>(),
            one_seat_level(level),
        )
        .await;
    cluster
        .create(
            client,
            &ar::<FlowSchema>(),
            flow_schema_for(level, namespace, account, requests),
        )
        .await;
    wait_flow_schema_taken(client, level).await;
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
