//! A tenant of a multi-tenant cluster, as the attacks of tests/suite/attacks.rs
//! act: a ServiceAccount bound to the built-in `admin` ClusterRole in its
//! own namespace, and nothing else, with a client that speaks with its
//! token. `admin` there includes CopyratorRules, as a platform that lets
//! its tenants write rules aggregates them into it.

use std::path::PathBuf;

use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

use super::rbac::{Binding, bind_as, service_account_may};
use super::{
    TIMEOUT, TestNs, create_service_account, err_msg, members::client_of_file,
    service_account_kubeconfig, service_account_token, wait_until,
};

pub struct Tenant {
    /// The namespace it administers, where its ServiceAccount is.
    pub namespace: String,
    /// Its user name (`system:serviceaccount:<namespace>:<account>`).
    pub user: String,
    pub client: Client,
    /// A token of its own (as its client speaks with).
    pub token: String,
}

// Its rules are made by the tests of `tests/cluster_wide`, by trust.rs's
// adoption test and by attacks.rs's restart-value attack.
impl Tenant {
    /// Creates the rule `name` in its namespace, as itself.
    pub async fn create_rule(&self, name: &str, body: serde_json::Value) {
        let mut body = body;
        body["apiVersion"] = json!("flant.com/v1");
        body["kind"] = json!("CopyratorRule");
        body["metadata"]["name"] = json!(name);
        let rule: DynamicObject = serde_json::from_value(body).expect("a rule");
        Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &super::rule_resource(),
        )
        .create(&PostParams::default(), &rule)
        .await
        .unwrap_or_else(|e| panic!("the tenant creates its rule {name}: {}", err_msg(&e)));
    }

    /// Creates the object `body` (kind, name and all) of `resource` in
    /// its namespace, as itself.
    pub async fn create(&self, resource: &kube::core::ApiResource, body: serde_json::Value) {
        let object: DynamicObject = serde_json::from_value(body).expect("an object");
        let name = object.metadata.name.clone().unwrap_or_default();
        Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.namespace, resource)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the tenant creates its {} {name}: {}",
                    resource.kind,
                    err_msg(&e)
                )
            });
    }

    /// A JSON merge patch of its rule `name`, as itself.
    pub async fn patch_rule(&self, name: &str, patch: serde_json::Value) {
        Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &super::rule_resource(),
        )
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("the tenant patches its rule {name}: {}", err_msg(&e)));
    }
}

/// A ClusterRole aggregated into `admin` that lets a namespace's admins
/// write CopyratorRules there, as a platform that lets tenants write rules
/// grants (made once, kept: it grants only on the rule kind).
const RULES_TO_ADMIN: &str = "copyrator-tests-rules-to-admin";

async fn let_admins_write_rules(client: &Client) {
    let role: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": RULES_TO_ADMIN,
                     "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
        "rules": [{"apiGroups": ["flant.com"], "resources": ["copyrators"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    }))
    .expect("a ClusterRole");
    let resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
        "clusterroles",
    );
    match Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &role)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("the ClusterRole {RULES_TO_ADMIN}: {}", err_msg(&e)),
    }
}

/// Binds the ServiceAccount `account_namespace/account` to the
/// ClusterRole `role` in `namespace`.
async fn bind(t: &TestNs, namespace: &str, role: &str, account_namespace: &str, account: &str) {
    let name = format!("{account}-{role}");
    bind_named(
        &t.client,
        namespace,
        &name,
        role,
        account_namespace,
        account,
    )
    .await;
}

/// [`bind`], with the RoleBinding's name and the client given.
async fn bind_named(
    client: &Client,
    namespace: &str,
    name: &str,
    role: &str,
    account_namespace: &str,
    account: &str,
) {
    let binding = Binding {
        role_kind: "ClusterRole",
        role,
        account_namespace,
        account,
    };
    bind_as(client, namespace, name, binding).await;
}

/// The ServiceAccount a tenant rule writes as unless it names another
/// (the operator's --default-service-account).
pub const COPIER: &str = "copyrator";

/// The ServiceAccount [`COPIER`] of `namespace`, where tenant rules live,
/// made by the test's admin if it is not there yet, and bound to the
/// built-in `edit` ClusterRole in each of `namespaces` (its own, to read
/// its sources; those it copies into or pulls from): what a platform
/// grants a tenant's rules. Returns once the API server lets it create
/// ConfigMaps in each.
pub async fn copier_may_edit(t: &TestNs, namespace: &str, namespaces: &[&str]) {
    match Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(t.client.clone(), namespace)
        .get_opt(COPIER)
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => create_service_account(&t.client, namespace, COPIER).await,
        Err(e) => panic!(
            "reading ServiceAccount {namespace}/{COPIER}: {}",
            err_msg(&e)
        ),
    }
    let user = format!("system:serviceaccount:{namespace}:{COPIER}");
    for target in namespaces {
        bind_copier(&t.client, target, namespace).await;
    }
    wait_until(
        format!("{user} to edit {namespaces:?}"),
        TIMEOUT,
        async || {
            for target in namespaces {
                let attributes = json!({"group": "", "resource": "configmaps",
                                        "verb": "create", "namespace": target});
                if !service_account_may(&t.client, &user, namespace, attributes).await? {
                    return Err(format!("may not create ConfigMaps in {target} yet"));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// Binds the ServiceAccount [`COPIER`] of `account_namespace` to `edit`
/// in `namespace`, with `client` (the admin's, at home or in a member
/// cluster: a member knows the account by its name alone).
pub async fn bind_copier(client: &Client, namespace: &str, account_namespace: &str) {
    let name = format!("{COPIER}-edit-{account_namespace}");
    bind_named(client, namespace, &name, "edit", account_namespace, COPIER).await;
}

impl Tenant {
    /// The ServiceAccount `namespace/account`, admin of `namespace` (a
    /// RoleBinding to the ClusterRole `admin`), once its rights are in
    /// effect.
    pub async fn admin_of(t: &TestNs, namespace: &str, account: &str) -> Tenant {
        let_admins_write_rules(&t.client).await;
        create_service_account(&t.client, namespace, account).await;
        bind(t, namespace, "admin", namespace, account).await;
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{}-{namespace}-{account}.kubeconfig", t.prefix));
        let (ns, sa, file) = (namespace.to_owned(), account.to_owned(), path.clone());
        // `kubectl create token` blocks: not on the runtime's threads.
        tokio::task::spawn_blocking(move || service_account_kubeconfig(&ns, &sa, &file))
            .await
            .expect("writing the tenant's kubeconfig");
        let (ns, sa) = (namespace.to_owned(), account.to_owned());
        let token = tokio::task::spawn_blocking(move || service_account_token(&ns, &sa))
            .await
            .expect("the tenant's token");
        let client = client_of_file(&path)
            .await
            .unwrap_or_else(|e| panic!("the tenant's client: {e}"));
        let user = format!("system:serviceaccount:{namespace}:{account}");
        wait_until(
            format!("{user} to be admin of {namespace}"),
            TIMEOUT,
            async || {
                for (group, resource) in [("", "configmaps"), ("flant.com", "copyrators")] {
                    let attributes = json!({"group": group, "resource": resource,
                                            "verb": "patch", "namespace": namespace});
                    if !service_account_may(&t.client, &user, namespace, attributes).await? {
                        return Err(format!("may not patch {resource} yet"));
                    }
                }
                Ok(())
            },
        )
        .await;
        Tenant {
            namespace: namespace.to_owned(),
            user,
            client,
            token,
        }
    }

    /// Binds it to the ClusterRole `role` (`admin`, `view`) in `namespace`
    /// as well, and waits until it may `verb` `resource` (of `group`) there.
    pub async fn bind_in(
        &self,
        t: &TestNs,
        namespace: &str,
        role: &str,
        (group, resource, verb): (&str, &str, &str),
    ) {
        let account = self.user.rsplit(':').next().unwrap_or_default();
        bind(t, namespace, role, &self.namespace, account).await;
        wait_until(
            format!("{} to be {role} of {namespace}", self.user),
            TIMEOUT,
            async || {
                let attributes = json!({"group": group, "resource": resource,
                                        "verb": verb, "namespace": namespace});
                match service_account_may(&t.client, &self.user, &self.namespace, attributes)
                    .await?
                {
                    true => Ok(()),
                    false => Err(format!("may not {verb} {resource} yet")),
                }
            },
        )
        .await;
    }
}
