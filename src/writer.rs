//! Carries out a plan's actions against the API server: paced, bounded,
//! only while this process may write, and with each outcome classified.
//!
//! Copies are written whole (create, or update with the resourceVersion the
//! plan saw as a precondition) rather than by server-side apply: apply
//! cannot drop a field another manager added to a copy, so an edited copy
//! would never converge. Writes happen only when the cached copy differs,
//! which makes this as idempotent as apply.

use std::sync::Arc;

use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::index::Object;
use crate::kinds::Kind;
use crate::leader::LeaderGate;
use crate::metrics::Metrics;
use crate::plan::{Action, Desired};
use crate::ratelimit::RateLimiter;
use crate::rule::ConflictPolicy;
use crate::{ANNOTATION_RULE, Error, FIELD_MANAGER};

/// What became of one action.
#[derive(Debug)]
pub enum Outcome {
    /// Written; the object as the API server returned it (None after a delete).
    Written(Option<Arc<Object>>),
    /// A foreign object holds the name and the policy leaves it alone.
    Conflict(String),
    /// The cluster moved under us (a newer version, a concurrent delete): plan again.
    Retry(String),
    /// Nothing to do after all (the namespace is going away, the object is gone).
    Ignored(&'static str),
    Failed(Error),
}

pub struct Writer {
    client: Client,
    limiter: RateLimiter,
    permits: Semaphore,
    metrics: Arc<Metrics>,
    leader: LeaderGate,
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

fn is_namespace_terminating(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status)
        if status.code == 403 && status.message.contains("being terminated"))
}

fn to_dynamic(
    desired: &Desired,
    namespace: &str,
    resource_version: Option<String>,
) -> DynamicObject {
    let mut object =
        DynamicObject::new(&desired.name, &desired.kind.api_resource()).within(namespace);
    object.metadata.labels = Some(desired.labels.clone());
    object.metadata.annotations = Some(desired.annotations.clone());
    object.metadata.resource_version = resource_version;
    object.data = Value::Object(desired.payload.clone().into_iter().collect());
    object
}

/// Every write names the operator as its field manager.
fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// A copy as the cache keeps it.
fn compact(kind: Kind, object: DynamicObject) -> Arc<Object> {
    Arc::new(Object::from_dynamic(kind, object).into_compact())
}

fn write_error(
    verb: &'static str,
    kind: Kind,
    namespace: &str,
    name: &str,
    source: kube::Error,
) -> Outcome {
    Outcome::Failed(Error::Write {
        verb,
        kind: kind.name(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source: Box::new(source),
    })
}

impl Writer {
    pub fn new(
        client: Client,
        limiter: RateLimiter,
        concurrency: u32,
        metrics: Arc<Metrics>,
        leader: LeaderGate,
    ) -> Self {
        Self {
            client,
            limiter,
            permits: Semaphore::new(concurrency as usize),
            metrics,
            leader,
        }
    }

    fn api(&self, desired_kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &desired_kind.api_resource())
    }

    /// Wait for a rate token, for requests that are not copy writes (status, events, finalizers).
    pub async fn pace(&self) {
        self.limiter.acquire().await;
    }

    /// Wait for a write slot and a rate token; refuse when not the leader,
    /// before waiting as well as after, so that a process that stopped
    /// leading (or is shutting down) drains its backlog at once.
    async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        if !self.leader.is_leader() {
            return None;
        }
        let permit = self.permits.acquire().await.ok()?;
        if !self.leader.is_leader() {
            return None;
        }
        self.limiter.acquire().await;
        self.leader.is_leader().then_some(permit)
    }

    pub async fn execute(
        &self,
        kind: Kind,
        action: &Action,
        policy: ConflictPolicy,
        rule: &str,
    ) -> Outcome {
        let Some(_permit) = self.slot().await else {
            return Outcome::Retry("this process is not the leader".into());
        };
        let outcome = match action {
            Action::Create { desired, namespace } => {
                self.create(desired, namespace, policy, rule).await
            }
            Action::Update { desired, current } => self.update(desired, current).await,
            Action::Recreate { desired, current } => match self.delete(desired.kind, current).await
            {
                Outcome::Written(_) | Outcome::Ignored(_) => {
                    self.limiter.acquire().await;
                    self.create(desired, &current.namespace, policy, rule).await
                }
                other => other,
            },
            Action::Delete { current, .. } => self.delete(kind, current).await,
        };
        let (namespace, name) = action.target();
        let source = action.source();
        match &outcome {
            Outcome::Written(_) => {
                info!(rule, action = action.verb(), kind = %kind, source, namespace, name, "wrote copy")
            }
            Outcome::Conflict(reason) => {
                info!(rule, namespace, name, reason = reason.as_str(), "conflict")
            }
            Outcome::Retry(reason) => debug!(
                rule,
                namespace,
                name,
                reason = reason.as_str(),
                "will retry"
            ),
            Outcome::Ignored(reason) => debug!(rule, namespace, name, reason, "nothing to write"),
            Outcome::Failed(error) => info!(rule, namespace, name, error = %error, "write failed"),
        }
        outcome
    }

    async fn create(
        &self,
        desired: &Desired,
        namespace: &str,
        policy: ConflictPolicy,
        rule: &str,
    ) -> Outcome {
        let api = self.api(desired.kind, namespace);
        let params = write_params();
        self.metrics.write("create", desired.kind.name());
        match api
            .create(&params, &to_dynamic(desired, namespace, None))
            .await
        {
            Ok(created) => Outcome::Written(Some(compact(desired.kind, created))),
            Err(e) if is_status(&e, 409) => {
                self.resolve_existing(desired, namespace, policy, rule)
                    .await
            }
            Err(e) if is_namespace_terminating(&e) || is_status(&e, 404) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(source) => write_error("create", desired.kind, namespace, &desired.name, source),
        }
    }

    /// A create found the name taken: ours (the cache is behind), another
    /// rule's, or a foreign object that the policy may take over.
    async fn resolve_existing(
        &self,
        desired: &Desired,
        namespace: &str,
        policy: ConflictPolicy,
        rule: &str,
    ) -> Outcome {
        let api = self.api(desired.kind, namespace);
        self.limiter.acquire().await;
        let existing = match api.get_opt(&desired.name).await {
            Ok(Some(existing)) => existing,
            Ok(None) => return Outcome::Retry("deleted while being created".into()),
            Err(source) => {
                return write_error("get", desired.kind, namespace, &desired.name, source);
            }
        };
        let our_uid = desired.labels.get(crate::LABEL_RULE_UID);
        if let Some(uid) = existing.labels().get(crate::LABEL_RULE_UID) {
            if Some(uid) == our_uid {
                return Outcome::Written(Some(compact(desired.kind, existing)));
            }
            let owner = existing
                .annotations()
                .get(ANNOTATION_RULE)
                .cloned()
                .unwrap_or_else(|| "another rule".into());
            if owner != rule {
                return Outcome::Conflict(format!("a copy made by rule {owner} is there"));
            }
        }
        let foreign = format!("a {} not made by Copyrator is there", desired.kind);
        if policy == ConflictPolicy::Skip && !existing.labels().contains_key(crate::LABEL_RULE_UID)
        {
            return Outcome::Conflict(foreign);
        }
        let current = Object::from_dynamic(desired.kind, existing);
        if desired.needs_recreate(&current) {
            return match self.delete(desired.kind, &current).await {
                Outcome::Written(_) | Outcome::Ignored(_) => {
                    self.limiter.acquire().await;
                    Box::pin(self.create(desired, namespace, policy, rule)).await
                }
                other => other,
            };
        }
        self.update(desired, &current).await
    }

    async fn update(&self, desired: &Desired, current: &Object) -> Outcome {
        let api = self.api(desired.kind, &current.namespace);
        let params = write_params();
        self.metrics.write("update", desired.kind.name());
        let object = to_dynamic(
            desired,
            &current.namespace,
            Some(current.resource_version.clone()),
        );
        match api.replace(&desired.name, &params, &object).await {
            Ok(updated) => Outcome::Written(Some(compact(desired.kind, updated))),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => {
                Outcome::Retry("the copy changed meanwhile".into())
            }
            Err(e) if is_status(&e, 422) && current.is_immutable() => {
                Outcome::Retry("the copy became immutable meanwhile".into())
            }
            Err(e) if is_namespace_terminating(&e) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(source) => write_error(
                "update",
                desired.kind,
                &current.namespace,
                &desired.name,
                source,
            ),
        }
    }

    /// Delete exactly the version the plan saw.
    pub async fn delete(&self, kind: Kind, current: &Object) -> Outcome {
        let api = self.api(kind, &current.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(current.uid.clone()),
                resource_version: Some(current.resource_version.clone()),
            }),
            ..Default::default()
        };
        self.metrics.write("delete", kind.name());
        match api.delete(&current.name, &params).await {
            Ok(_) => Outcome::Written(None),
            Err(e) if is_status(&e, 404) => Outcome::Ignored("already gone"),
            Err(e) if is_status(&e, 409) => Outcome::Retry("the copy changed meanwhile".into()),
            Err(source) => write_error("delete", kind, &current.namespace, &current.name, source),
        }
    }
}
