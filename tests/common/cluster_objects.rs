//! Cluster-scoped objects a test makes (RBAC, admission policies, flow
//! control), deleted when the test ends, and admission policies that refuse
//! the writes a test names.

use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use super::{TIMEOUT, TestNs, clean_up_apart, err_msg, wait_until};

/// Cluster-scoped objects a test made (RBAC, admission policies, flow
/// control); deleted in reverse order when the guard drops, also on panic.
pub struct ClusterObjects {
    items: Mutex<Vec<(ApiResource, String)>>,
    /// The kubeconfig of the cluster they are in; None: `$KUBECONFIG`.
    kubeconfig: Option<PathBuf>,
}

impl ClusterObjects {
    /// Objects of the home cluster (`$KUBECONFIG`).
    pub fn new() -> ClusterObjects {
        ClusterObjects {
            items: Mutex::new(Vec::new()),
            kubeconfig: None,
        }
    }

    /// Objects of the cluster of `kubeconfig` (a member's admin
    /// kubeconfig): pass [`ClusterObjects::create`] that cluster's client.
    pub fn in_cluster_of(kubeconfig: PathBuf) -> ClusterObjects {
        ClusterObjects {
            items: Mutex::new(Vec::new()),
            kubeconfig: Some(kubeconfig),
        }
    }

    /// Creates `body` (with apiVersion and kind) as a cluster-scoped object
    /// of resource `ar`, to be deleted when the guard drops.
    pub async fn create(&self, client: &Client, ar: &ApiResource, body: Value) -> DynamicObject {
        let name = body["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        let object: DynamicObject =
            serde_json::from_value(body.clone()).expect("a Kubernetes object");
        self.items.lock().unwrap().push((ar.clone(), name.clone()));
        Api::<DynamicObject>::all_with(client.clone(), ar)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {}\n{body}", ar.kind, err_msg(&e)))
    }

    /// Deletes one of the objects now (the guard forgets it).
    pub async fn delete(&self, client: &Client, ar: &ApiResource, name: &str) {
        self.items
            .lock()
            .unwrap()
            .retain(|(a, n)| !(a.kind == ar.kind && n == name));
        match Api::<DynamicObject>::all_with(client.clone(), ar)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deleting {} {name}: {}", ar.kind, err_msg(&e)),
        }
    }
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        let items = std::mem::take(&mut *self.items.lock().unwrap());
        if items.is_empty() {
            return;
        }
        let kubeconfig = self.kubeconfig.clone();
        clean_up_apart(move || async move {
            let client = match &kubeconfig {
                None => Client::try_default().await.map_err(|e| e.to_string()),
                Some(path) => super::members::client_of_file(path).await,
            };
            let Ok(client) = client else {
                return;
            };
            for (ar, name) in items.iter().rev() {
                let _ = Api::<DynamicObject>::all_with(client.clone(), ar)
                    .delete(name, &DeleteParams::default())
                    .await;
            }
        });
    }
}

pub fn ar<K: kube::Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// A ValidatingAdmissionPolicy (and its binding, both named `name`) that
/// refuses ConfigMap writes of `operations` in `namespace` with `message`
/// and the HTTP reason `reason` (`Forbidden`: 403, `Invalid`: 422); returns
/// once the API server refuses a dry-run create of the test's own there.
pub async fn refuse_configmap_writes(
    t: &TestNs,
    cluster: &ClusterObjects,
    name: &str,
    namespace: &str,
    operations: &[&str],
    reason: &str,
    message: &str,
) {
    refuse_configmap_writes_unless(
        t,
        cluster,
        name,
        &[namespace],
        operations,
        reason,
        message,
        "false",
    )
    .await;
}

/// As [`refuse_configmap_writes`], in each of `namespaces`, for every
/// ConfigMap but those for which the CEL expression `admitted` (on
/// `object`) is true; the dry-run create of the test's own (`probe`, no
/// data) must be refused.
#[allow(clippy::too_many_arguments)]
pub async fn refuse_configmap_writes_unless(
    t: &TestNs,
    cluster: &ClusterObjects,
    name: &str,
    namespaces: &[&str],
    operations: &[&str],
    reason: &str,
    message: &str,
    admitted: &str,
) {
    let spec = json!({
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": operations, "resources": ["configmaps"],
        }]},
        "validations": [{"expression": admitted, "message": message, "reason": reason}],
    });
    let where_bound = json!({"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": namespaces,
    }]}});
    // Only a create can be probed.
    let probed = if operations.contains(&"CREATE") {
        namespaces
    } else {
        &[]
    };
    deny_configmap_writes(
        t,
        cluster,
        name,
        spec,
        Some(where_bound),
        message,
        &t.client,
        probed,
    )
    .await;
}

/// A ValidatingAdmissionPolicy of `spec` and a binding of it that denies
/// (in what `match_resources` selects; without it, everywhere), both
/// named `name`; returns once the API server refuses a dry-run create of
/// `prober`'s in each of `probed` with a message that contains `message`.
#[allow(clippy::too_many_arguments)]
async fn deny_configmap_writes(
    t: &TestNs,
    cluster: &ClusterObjects,
    name: &str,
    spec: Value,
    match_resources: Option<Value>,
    message: &str,
    prober: &Client,
    probed: &[&str],
) {
    cluster
        .create(
            &t.client,
            &ar::<ValidatingAdmissionPolicy>(),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": spec,
            }),
        )
        .await;
    let mut binding = json!({"policyName": name, "validationActions": ["Deny"]});
    if let Some(match_resources) = match_resources {
        binding["matchResources"] = match_resources;
    }
    cluster
        .create(
            &t.client,
            &ar::<ValidatingAdmissionPolicyBinding>(),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": binding,
            }),
        )
        .await;
    // Policies become active a moment after they are made.
    for namespace in probed {
        wait_until(
            format!("the policy {name} to refuse a probe ConfigMap in {namespace}"),
            TIMEOUT,
            async || match dry_run_create(prober, namespace).await {
                Err(kube::Error::Api(s)) if s.message.contains(message) => Ok(()),
                other => Err(format!(
                    "{:?}",
                    other.map(|_| "accepted").map_err(|e| err_msg(&e))
                )),
            },
        )
        .await;
    }
}

/// A dry-run create of a ConfigMap `probe` (no data) by `client` in
/// `namespace`.
async fn dry_run_create(client: &Client, namespace: &str) -> Result<ConfigMap, kube::Error> {
    let probe: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "probe"}})).expect("a ConfigMap");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&dry_run, &probe)
        .await
}

/// Waits until the API server takes a dry-run create of a ConfigMap in
/// `namespace` again (the policies that refused it are gone).
pub async fn wait_admitted(t: &TestNs, namespace: &str) {
    wait_until(
        format!("a probe ConfigMap to be admitted in {namespace}"),
        TIMEOUT,
        async || {
            dry_run_create(&t.client, namespace)
                .await
                .map(|_| ())
                .map_err(|e| err_msg(&e))
        },
    )
    .await;
}

/// A ValidatingAdmissionPolicy (and its binding, both named `name`) that
/// refuses every ConfigMap write of `user` outside `namespaces` (403), and
/// nobody else's; returns once the API server refuses a dry-run create of
/// `user`'s (through `as_user`, a client acting as `user`) in
/// `refused_namespace`. An operator of a rule that reaches the whole
/// cluster then writes only where its test looks.
pub async fn confine_configmap_writes(
    t: &TestNs,
    cluster: &ClusterObjects,
    name: &str,
    user: &str,
    namespaces: &[&str],
    as_user: &Client,
    refused_namespace: &str,
) {
    let message = format!("{user} may write ConfigMaps only in {namespaces:?}");
    let spec = json!({
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["configmaps"],
        }]},
        // JSON strings and lists are CEL literals.
        "matchConditions": [{
            "name": "the-confined-user",
            "expression": format!("request.userInfo.username == {}", json!(user)),
        }],
        "validations": [{
            "expression": format!("request.namespace in {}", json!(namespaces)),
            "message": message,
            "reason": "Forbidden",
        }],
    });
    deny_configmap_writes(
        t,
        cluster,
        name,
        spec,
        None,
        &message,
        as_user,
        &[refused_namespace],
    )
    .await;
}

/// Deletes the policy and binding [`refuse_configmap_writes`] made.
pub async fn stop_refusing(t: &TestNs, cluster: &ClusterObjects, name: &str) {
    cluster
        .delete(&t.client, &ar::<ValidatingAdmissionPolicyBinding>(), name)
        .await;
    cluster
        .delete(&t.client, &ar::<ValidatingAdmissionPolicy>(), name)
        .await;
}
