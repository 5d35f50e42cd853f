//! What is read from an API server as the operator itself: lists, lookups,
//! reviews, and what the watches follow. Nothing here writes: every write
//! goes through the writer, which checks the Lease and carries the
//! identity. Outside `cluster/`, requests are made only through these two.

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SubjectAccessReview};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectList, PostParams};
use kube::core::{NamespaceResourceScope, PartialObjectMeta};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Reads from one API server.
#[derive(Clone)]
pub(crate) struct Reader {
    client: Client,
}

/// Objects of one kind, of one namespace or of all: what may be listed,
/// looked up or followed by a watch ([`crate::cluster::watch::follow`]).
#[derive(Clone)]
pub(crate) struct Objects<K> {
    api: Api<K>,
}

impl Reader {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    /// Objects of a kind the crate knows, in every namespace (or of a
    /// kind without namespaces).
    pub(crate) fn everywhere<K>(&self) -> Objects<K>
    where
        K: Resource<DynamicType = ()>,
    {
        Objects {
            api: Api::all(self.client.clone()),
        }
    }

    /// Objects of a kind the crate knows, in `namespace`.
    pub(crate) fn within<K>(&self, namespace: &str) -> Objects<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Objects {
            api: Api::namespaced(self.client.clone(), namespace),
        }
    }

    /// [`Reader::within`] `namespace` where one is given, else everywhere.
    pub(crate) fn within_or_everywhere<K>(&self, namespace: Option<&str>) -> Objects<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match namespace {
            Some(namespace) => self.within(namespace),
            None => self.everywhere(),
        }
    }

    /// Objects of `resource`, in `namespace` where one is given, else in
    /// every namespace.
    pub(crate) fn of(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
    ) -> Objects<DynamicObject> {
        let api = match namespace {
            Some(namespace) => Api::namespaced_with(self.client.clone(), namespace, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        Objects { api }
    }

    /// The API server's version.
    pub(crate) async fn version(
        &self,
    ) -> kube::Result<k8s_openapi::apimachinery::pkg::version::Info> {
        self.client.apiserver_version().await
    }

    /// The resource that serves `gvk`, by API discovery.
    pub(crate) async fn discover_kind(
        &self,
        gvk: &kube::api::GroupVersionKind,
    ) -> kube::Result<(ApiResource, kube::discovery::ApiCapabilities)> {
        kube::discovery::pinned_kind(&self.client, gvk).await
    }

    /// What API group `group` serves, by API discovery.
    pub(crate) async fn discover_group(
        &self,
        group: &str,
    ) -> kube::Result<kube::discovery::ApiGroup> {
        kube::discovery::group(&self.client, group).await
    }

    /// What the operator itself may do, as the API server answers.
    pub(crate) async fn self_review(
        &self,
        review: &SelfSubjectAccessReview,
    ) -> kube::Result<SelfSubjectAccessReview> {
        Api::all(self.client.clone())
            .create(&PostParams::default(), review)
            .await
    }

    /// What another subject may do.
    pub(crate) async fn subject_review(
        &self,
        review: &SubjectAccessReview,
    ) -> kube::Result<SubjectAccessReview> {
        Api::all(self.client.clone())
            .create(&PostParams::default(), review)
            .await
    }

    /// Whom a bearer token belongs to.
    pub(crate) async fn token_review(&self, review: &TokenReview) -> kube::Result<TokenReview> {
        Api::all(self.client.clone())
            .create(&PostParams::default(), review)
            .await
    }
}

impl<K> Objects<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    pub(crate) async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<K>> {
        self.api.list(params).await
    }

    /// Their metadata alone.
    pub(crate) async fn list_metadata(
        &self,
        params: &ListParams,
    ) -> kube::Result<ObjectList<PartialObjectMeta<K>>> {
        self.api.list_metadata(params).await
    }

    pub(crate) async fn get_opt(&self, name: &str) -> kube::Result<Option<K>> {
        self.api.get_opt(name).await
    }

    /// For the watch that follows them.
    pub(super) fn api(&self) -> Api<K> {
        self.api.clone()
    }
}
