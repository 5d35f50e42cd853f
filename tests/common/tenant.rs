//! A tenant of a multi-tenant cluster, as the attacks of tests/attacks.rs
//! act: a ServiceAccount bound to the built-in `admin` ClusterRole in its
//! own namespace, and nothing else, with a client that speaks with its
//! token.

use std::path::PathBuf;

use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

use super::rbac::service_account_may;
use super::{
    TIMEOUT, TestNs, create_service_account, err_msg, members::client_of_file,
    service_account_kubeconfig, wait_until,
};

pub struct Tenant {
    pub namespace: String,
    /// Its user name (`system:serviceaccount:<namespace>:<account>`).
    pub user: String,
    pub client: Client,
}

impl Tenant {
    /// The ServiceAccount `namespace/account`, admin of `namespace` (a
    /// RoleBinding to the ClusterRole `admin`), once its rights are in
    /// effect.
    pub async fn admin_of(t: &TestNs, namespace: &str, account: &str) -> Tenant {
        create_service_account(&t.client, namespace, account).await;
        let binding: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{account}-admin"), "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }))
        .expect("a RoleBinding");
        let resource = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding"),
            "rolebindings",
        );
        Api::<DynamicObject>::namespaced_with(t.client.clone(), namespace, &resource)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("binding {account} to admin: {}", err_msg(&e)));
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{}-{namespace}-{account}.kubeconfig", t.prefix));
        let (ns, sa, file) = (namespace.to_owned(), account.to_owned(), path.clone());
        // `kubectl create token` blocks: not on the runtime's threads.
        tokio::task::spawn_blocking(move || service_account_kubeconfig(&ns, &sa, &file))
            .await
            .expect("writing the tenant's kubeconfig");
        let client = client_of_file(&path)
            .await
            .unwrap_or_else(|e| panic!("the tenant's client: {e}"));
        let user = format!("system:serviceaccount:{namespace}:{account}");
        wait_until(
            format!("{user} to be admin of {namespace}"),
            TIMEOUT,
            async || {
                let attributes =
                    json!({"resource": "configmaps", "verb": "patch", "namespace": namespace});
                match service_account_may(&t.client, &user, namespace, attributes).await? {
                    true => Ok(()),
                    false => Err("not yet".to_owned()),
                }
            },
        )
        .await;
        Tenant {
            namespace: namespace.to_owned(),
            user,
            client,
        }
    }
}
