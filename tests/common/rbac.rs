//! RBAC for the operator in a test: the grants of a rendered (Cluster)Role
//! as (apiGroup, resource, verb) triples, rules made back from a set of
//! them, and a ServiceAccount of its own bound to exactly those rules, with
//! a kubeconfig to run the operator as it.
//!
//! ```ignore
//! let cluster = ClusterScoped::new();
//! let id = Identity::create(&t, &cluster, &op, "copyrator", &grants_of(&role), &BTreeSet::new()).await;
//! id.wait_effective(&t.client, &op, &granted, &removed).await;
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use super::audit::service_account_user;
use super::helm::{find_named, render};
use super::members::Member;
use super::{
    Operator, TIMEOUT, TestNs, create_service_account, err_msg, service_account_kubeconfig,
    wait_until,
};

/// One verb on one resource of one API group, as a Role grants it, on
/// every object or only on the one `name` (a rule's `resourceNames`).
/// `resource` may name a subresource (`copyrators/status`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Grant {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

impl Grant {
    pub fn new(group: &str, resource: &str, verb: &str) -> Grant {
        Grant {
            group: group.to_string(),
            resource: resource.to_string(),
            verb: verb.to_string(),
            name: None,
        }
    }

    /// `verb` on the one object `name` of `resource`.
    pub fn named(group: &str, resource: &str, verb: &str, name: &str) -> Grant {
        Grant {
            name: Some(name.to_string()),
            ..Grant::new(group, resource, verb)
        }
    }

    /// The resource without its subresource (`copyrators` for `copyrators/status`).
    pub fn base_resource(&self) -> &str {
        self.resource.split('/').next().unwrap_or_default()
    }

    pub fn subresource(&self) -> Option<&str> {
        self.resource.split_once('/').map(|(_, sub)| sub)
    }

    pub fn has_wildcard(&self) -> bool {
        self.group.contains('*') || self.resource.contains('*') || self.verb.contains('*')
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        match &self.name {
            Some(name) => write!(f, " {name}"),
            None => Ok(()),
        }
    }
}

/// Every (apiGroup, resource, verb) a Role or ClusterRole object grants.
pub fn grants_of(role: &Value) -> BTreeSet<Grant> {
    let strings = |v: &Value, field: &str| -> Vec<String> {
        v[field]
            .as_array()
            .unwrap_or_else(|| panic!("a rule without {field}: {v}"))
            .iter()
            .map(|s| s.as_str().unwrap_or_default().to_string())
            .collect()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        let names: Vec<Option<String>> = match rule.get("resourceNames") {
            Some(_) => strings(rule, "resourceNames")
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None],
        };
        for group in strings(rule, "apiGroups") {
            for resource in strings(rule, "resources") {
                for verb in strings(rule, "verbs") {
                    for name in &names {
                        out.insert(Grant {
                            name: name.clone(),
                            ..Grant::new(&group, &resource, &verb)
                        });
                    }
                }
            }
        }
    }
    out
}

/// Role rules granting exactly `grants`: one rule per (group, resource,
/// name).
pub fn rules_of(grants: &BTreeSet<Grant>) -> Value {
    let mut by_resource: BTreeMap<(&str, &str, Option<&str>), Vec<&str>> = BTreeMap::new();
    for g in grants {
        by_resource
            .entry((&g.group, &g.resource, g.name.as_deref()))
            .or_default()
            .push(&g.verb);
    }
    Value::Array(
        by_resource
            .into_iter()
            .map(|((group, resource, name), verbs)| {
                let mut rule =
                    json!({"apiGroups": [group], "resources": [resource], "verbs": verbs});
                if let Some(name) = name {
                    rule["resourceNames"] = json!([name]);
                }
                rule
            })
            .collect(),
    )
}

/// Everything the operator uses (the chart's ClusterRole and Lease Role,
/// plus the verbs a newer operator may use: patch on copies, get and
/// update on rules, namespaces get), as the `rules` of a ClusterRole.
pub fn operator_rules() -> Value {
    json!([
        {"apiGroups": [""], "resources": ["configmaps", "secrets"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["flant.com"], "resources": ["copyrators"],
         "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["flant.com"], "resources": ["copyrators/status"], "verbs": ["patch", "update"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
    ])
}

/// Cluster-scoped objects a test made; deleted when the guard drops (also
/// on panic).
pub use super::cluster_objects::ClusterObjects as ClusterScoped;

/// How many cases of a "each verb is needed" test run at once. Each case
/// is an operator of its own: all of them at once, beside the rest of the
/// suite on two cores, made single steps take longer than a step's
/// budget, so that a case could stop at a step other than the one its
/// missing verb breaks.
pub const CASES_AT_ONCE: usize = 8;

/// Run `case` for every entry of `runs`, [`CASES_AT_ONCE`] at a time,
/// keeping their order.
pub async fn run_cases<T, C, F>(runs: &[T], case: C) -> Vec<F::Output>
where
    C: FnMut(&T) -> F,
    F: std::future::Future,
{
    use futures::StreamExt;
    futures::stream::iter(runs.iter().map(case))
        .buffered(CASES_AT_ONCE)
        .collect()
        .await
}

pub fn rbac(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create(client: &Client, ar: &ApiResource, namespace: Option<&str>, body: Value) {
    let object: DynamicObject = serde_json::from_value(body.clone()).expect("a Kubernetes object");
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, ar),
        None => Api::<DynamicObject>::all_with(client.clone(), ar),
    };
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {} {body}: {}", ar.kind, err_msg(&e)));
}

/// A ServiceAccount the operator runs as.
pub struct Identity {
    pub namespace: String,
    pub account: String,
    /// Its user name in the audit log.
    pub user: String,
    /// A kubeconfig with a token of the ServiceAccount.
    pub kubeconfig: String,
}

impl Identity {
    /// `copyrator run --namespace <namespace>` as this identity (the
    /// operator of the chart, when made by [`as_the_chart`]).
    pub fn run_operator(&self, t: &TestNs) -> Operator {
        Operator::start_with_env(
            t,
            vec!["run".into(), "--namespace".into(), self.namespace.clone()],
            &[("KUBECONFIG", &self.kubeconfig)],
        )
    }

    /// The ServiceAccount `namespace/account`, bound to a ClusterRole of its
    /// own with exactly `cluster_grants` and to a Role in `namespace` with
    /// exactly `namespaced_grants` (none made when empty).
    pub async fn create(
        t: &TestNs,
        cluster: &ClusterScoped,
        namespace: &str,
        account: &str,
        cluster_grants: &BTreeSet<Grant>,
        namespaced_grants: &BTreeSet<Grant>,
    ) -> Identity {
        bind(
            t,
            &t.client,
            cluster,
            namespace,
            account,
            cluster_grants,
            namespaced_grants,
        )
        .await;
        let role = format!("{}-{account}", t.prefix);
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{role}.kubeconfig"));
        // `kubectl create token` blocks: not on the runtime's threads.
        let (ns, sa, file) = (namespace.to_string(), account.to_string(), path.clone());
        tokio::task::spawn_blocking(move || service_account_kubeconfig(&ns, &sa, &file))
            .await
            .expect("writing the ServiceAccount's kubeconfig");
        Identity {
            namespace: namespace.to_string(),
            account: account.to_string(),
            user: service_account_user(namespace, account),
            kubeconfig: path.to_string_lossy().into_owned(),
        }
    }

    /// As [`Identity::create`], in the member cluster `member`, bound to a
    /// ClusterRole with exactly `cluster_grants` (`cluster` must be
    /// [`ClusterScoped::in_cluster_of`] the member's kubeconfig). Its
    /// kubeconfig is self-contained, a token inline, as the inventory's
    /// kubeconfig Secret holds it ([`Member::register_kubeconfig`]).
    pub async fn create_in_member(
        t: &TestNs,
        member: &Member,
        cluster: &ClusterScoped,
        namespace: &str,
        account: &str,
        cluster_grants: &BTreeSet<Grant>,
    ) -> Identity {
        bind(
            t,
            &member.client,
            cluster,
            namespace,
            account,
            cluster_grants,
            &BTreeSet::new(),
        )
        .await;
        let token = member.token(namespace, account).await;
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{}-{account}-{}.kubeconfig", t.prefix, member.name));
        std::fs::write(&path, member.kubeconfig_with_token(&token))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        Identity {
            namespace: namespace.to_string(),
            account: account.to_string(),
            user: service_account_user(namespace, account),
            kubeconfig: path.to_string_lossy().into_owned(),
        }
    }

    /// Whether the API server lets this ServiceAccount do `grant` in
    /// `namespace` (None: in every namespace), by a SubjectAccessReview.
    pub async fn may(
        &self,
        client: &Client,
        grant: &Grant,
        namespace: Option<&str>,
    ) -> Result<bool, String> {
        let mut attributes = json!({
            "group": grant.group,
            "resource": grant.base_resource(),
            "subresource": grant.subresource(),
            "verb": grant.verb,
            "namespace": namespace,
        });
        if let Some(name) = &grant.name {
            attributes["name"] = json!(name);
        }
        service_account_may(client, &self.user, &self.namespace, attributes).await
    }

    /// Waits until the API server's authorizer allows every grant of
    /// `allowed` and none of `denied` (RBAC takes effect through a cache);
    /// a grant is asked in `namespace`, so that Role grants count.
    pub async fn wait_effective(
        &self,
        client: &Client,
        namespace: &str,
        allowed: &BTreeSet<Grant>,
        denied: &BTreeSet<Grant>,
    ) {
        wait_until(
            format!("the RBAC of {} to take effect", self.user),
            TIMEOUT,
            async || {
                for (grants, want) in [(allowed, true), (denied, false)] {
                    for grant in grants {
                        let got = self.may(client, grant, Some(namespace)).await?;
                        if got != want {
                            return Err(format!("{grant} allowed: {got}, want {want}"));
                        }
                    }
                }
                Ok(())
            },
        )
        .await;
    }
}

/// The operator's ServiceAccount `namespace/copyrator` as the chart makes it
/// with `values`: bound to exactly its rendered ClusterRole, and its
/// rendered Role made in `namespace`, both in effect. An operator started
/// with `KUBECONFIG` set to its kubeconfig runs as a release of the chart
/// in `namespace` does.
pub async fn as_the_chart(
    t: &TestNs,
    cluster: &ClusterScoped,
    namespace: &str,
    values: &[&str],
) -> Identity {
    let docs = render(values);
    let cluster_grants = grants_of(find_named(&docs, "ClusterRole", "copyrator"));
    let namespaced_grants: BTreeSet<Grant> = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .flat_map(grants_of)
        .collect();
    let id = Identity::create(
        t,
        cluster,
        namespace,
        "copyrator",
        &cluster_grants,
        &namespaced_grants,
    )
    .await;
    let granted: BTreeSet<Grant> = cluster_grants.union(&namespaced_grants).cloned().collect();
    id.wait_effective(&t.client, namespace, &granted, &BTreeSet::new())
        .await;
    id
}

/// The ServiceAccount `namespace/account` in the cluster of `client`, bound
/// to a ClusterRole `<prefix>-<account>` with exactly `cluster_grants` (in
/// `cluster`, deleted when it drops) and to a Role in `namespace` with
/// exactly `namespaced_grants` (none made when empty).
async fn bind(
    t: &TestNs,
    client: &Client,
    cluster: &ClusterScoped,
    namespace: &str,
    account: &str,
    cluster_grants: &BTreeSet<Grant>,
    namespaced_grants: &BTreeSet<Grant>,
) {
    create_service_account(client, namespace, account).await;
    let subjects = json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    let role = format!("{}-{account}", t.prefix);
    cluster
        .create(
            client,
            &rbac("ClusterRole", "clusterroles"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role}, "rules": rules_of(cluster_grants),
            }),
        )
        .await;
    cluster
            .create(
                client,
                &rbac("ClusterRoleBinding", "clusterrolebindings"),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": subjects,
                }),
            )
            .await;
    if !namespaced_grants.is_empty() {
        create(
            client,
            &rbac("Role", "roles"),
            Some(namespace),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": account, "namespace": namespace},
                "rules": rules_of(namespaced_grants),
            }),
        )
        .await;
        create(
                client,
                &rbac("RoleBinding", "rolebindings"),
                Some(namespace),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": account, "namespace": namespace},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
                    "subjects": subjects,
                }),
            )
            .await;
    }
}

/// Whether the API server lets the ServiceAccount whose user name is `user`
/// (of the namespace `namespace`) do what `attributes` (the
/// `resourceAttributes` of a SubjectAccessReview) say, by a
/// SubjectAccessReview.
pub async fn service_account_may(
    client: &Client,
    user: &str,
    namespace: &str,
    attributes: Value,
) -> Result<bool, String> {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            "resourceAttributes": attributes,
        }
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| err_msg(&e))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Who a RoleBinding binds to what: the role's kind and name, and the
/// ServiceAccount's namespace and name.
pub struct Binding<'a> {
    pub role_kind: &'a str,
    pub role: &'a str,
    pub account_namespace: &'a str,
    pub account: &'a str,
}

/// The RoleBinding `name` in `namespace`, made with `client`.
pub async fn bind_as(client: &kube::Client, namespace: &str, name: &str, binding: Binding<'_>) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": binding.role_kind,
                    "name": binding.role},
        "subjects": [{"kind": "ServiceAccount", "name": binding.account,
                      "namespace": binding.account_namespace}],
    }))
    .expect("a RoleBinding");
    Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &rbac("RoleBinding", "rolebindings"),
    )
    .create(&PostParams::default(), &object)
    .await
    .unwrap_or_else(|e| panic!("binding {} in {namespace}: {}", binding.role, err_msg(&e)));
}

/// The chart's impersonation ClusterRole for `values`, named `name`, made
/// in the cluster (deleted with `cluster`).
pub async fn chart_impersonation_role(
    t: &TestNs,
    cluster: &ClusterScoped,
    values: &[&str],
    name: &str,
) -> Value {
    let mut role = render(values)
        .into_iter()
        .find(|d| {
            d["kind"] == "ClusterRole"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-impersonate"))
        })
        .expect("the chart renders an -impersonate ClusterRole");
    role["metadata"] = json!({"name": name});
    cluster
        .create(
            &t.client,
            &rbac("ClusterRole", "clusterroles"),
            role.clone(),
        )
        .await;
    role
}
