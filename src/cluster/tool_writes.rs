//! The writes of `copyrator release`, a command run apart from the
//! operator: sent as whoever runs it, with no Lease to hold (it stops the
//! operator first, so that nothing puts a finalizer back).

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use serde_json::json;

use crate::FIELD_MANAGER;
use crate::api::kinds::Kind;
use crate::api::rule::{CopyratorRule, RuleKey};
use crate::cache::index::Object;

pub(crate) struct ToolWrites {
    client: Client,
}

impl ToolWrites {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    /// Scale Deployment `namespace/name` to no replicas; as it is now.
    pub(crate) async fn scale_to_zero(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Deployment> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Api::<Deployment>::namespaced(self.client.clone(), namespace)
            .patch(
                name,
                &params,
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
    }

    /// Delete `copy`, that very object (its UID is a precondition);
    /// whether it went (it may have gone already).
    pub(crate) async fn delete_copy(&self, kind: Kind, copy: &Object) -> kube::Result<bool> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(copy.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &copy.namespace, &kind.api_resource());
        match api.delete(&copy.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Set the finalizers of rule `key` to `finalizers`, as a
    /// compare-and-swap on `resource_version`.
    pub(crate) async fn rule_finalizers(
        &self,
        key: &RuleKey,
        finalizers: &[&String],
        resource_version: Option<String>,
    ) -> kube::Result<CopyratorRule> {
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": resource_version,
        }});
        Api::<CopyratorRule>::namespaced(self.client.clone(), &key.namespace)
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    }
}
