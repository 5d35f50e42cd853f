//! Carries out a plan's actions against the API server: paced, bounded,
//! only while this process may write, and with each outcome classified.
//!
//! Copies are written whole (create, or update with the resourceVersion the
//! plan saw as a precondition) rather than by server-side apply: apply
//! cannot drop a data key another manager added to a copy, so an edited
//! copy would never converge. The labels and annotations that others own
//! are written back unchanged, so their keys survive and stay theirs. Writes
//! happen only when what Copyrator owns differs, which makes this as
//! idempotent as apply. Failures come back classified, in the API server's
//! own words, for the caller's backoff.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use tracing::debug;

use crate::FIELD_MANAGER;
use crate::api::kinds::Kind;
use crate::api::rule::ConflictPolicy;
use crate::cache::index::Object;
use crate::cache::mark::{self, Place};
use crate::cluster::leader::LeaderGate;
use crate::cluster::ratelimit::RateLimiter;
use crate::cluster::write_limit::{WriteLimit, WritePermit};
use crate::core::backoff::{Failure, FailureClass};
use crate::core::plan::{Action, Desired, Occupied, occupied};
use crate::ops::metrics::ClusterMetrics;

/// What became of one action.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Written; the object as the API server returned it (None after a delete).
    Written(Option<Arc<Object>>),
    /// A foreign object holds the name and the policy leaves it alone.
    Conflict(String),
    /// The API server refused or did not answer; retried on a backoff.
    Failed(Failure),
    /// This process may not write now (it does not hold the Lease).
    NotLeader,
    /// Nothing to do after all (the namespace is going away, the object is gone).
    Ignored(&'static str),
}

pub(crate) struct Writer {
    client: Client,
    limiter: RateLimiter,
    /// The writes in flight: fewer while the API server throttles them.
    in_flight: WriteLimit,
    metrics: ClusterMetrics,
    leader: LeaderGate,
    health: Arc<crate::ops::http::Health>,
    /// `copyrator_write_concurrency`: the home cluster's writer reports the
    /// writes it allows in flight; a member's writer reports nothing there.
    concurrency_gauge: Option<Gauge>,
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

fn is_namespace_terminating(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status)
        if status.code == 403 && status.message.contains("being terminated"))
}

use crate::error::describe;

/// Classify a failed request for the retry schedule.
pub(crate) fn classify(err: &kube::Error) -> Failure {
    let (class, retry_after) = match err {
        kube::Error::Api(status) => {
            let retry_after = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)));
            let class = match status.code {
                409 => FailureClass::Conflict,
                429 => FailureClass::Throttled,
                // Field validation names the field; an admission policy's
                // denial (also 422) does not, and may be lifted.
                422 if status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| !c.field.is_empty())) =>
                {
                    FailureClass::Invalid
                }
                code if code >= 500 => FailureClass::Transient,
                _ => FailureClass::Refused,
            };
            (class, retry_after)
        }
        _ => (FailureClass::Transient, None),
    };
    Failure {
        class,
        message: describe(err),
        retry_after,
    }
}

fn to_dynamic(desired: &Desired, namespace: &str, current: Option<&Object>) -> DynamicObject {
    let mut object =
        DynamicObject::new(&desired.name, &desired.kind.api_resource()).within(namespace);
    // Labels and annotations that others own are written back as they are.
    let mut labels = current.map(|c| c.labels.clone()).unwrap_or_default();
    labels.extend(desired.labels.clone());
    let mut annotations = current.map(|c| c.annotations.clone()).unwrap_or_default();
    annotations.extend(desired.annotations.clone());
    if let Some(rule) = desired.annotations.get(crate::ANNOTATION_RULE) {
        let place = Place {
            kind: desired.kind,
            namespace,
            name: &desired.name,
            rule,
        };
        if let Some(mark) = mark::sign(&place, &desired.payload) {
            annotations.insert(crate::ANNOTATION_MARK.to_owned(), mark);
        }
    }
    object.metadata.labels = Some(labels);
    object.metadata.annotations = Some(annotations);
    object.metadata.resource_version = current.map(|c| c.resource_version.clone());
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

/// Our own write of `desired`, as the API server answered it.
fn written(desired: &Desired, object: DynamicObject) -> Outcome {
    let mut copy = Object::from_dynamic(desired.kind, object).into_compact();
    copy.written_for = Some(desired.content_hash);
    // What it holds is what was written, whoever set a field to it before.
    copy.intact = copy.payload_hash == desired.payload_hash;
    // A webhook may have added keys; what we asked for is there.
    copy.settled = desired.matches(&copy, false);
    Outcome::Written(Some(Arc::new(copy)))
}

impl Writer {
    pub(crate) fn new(
        client: Client,
        limiter: RateLimiter,
        concurrency: u32,
        metrics: ClusterMetrics,
        leader: LeaderGate,
        health: Arc<crate::ops::http::Health>,
        concurrency_gauge: Option<Gauge>,
    ) -> Self {
        if let Some(gauge) = &concurrency_gauge {
            gauge.set(i64::from(concurrency));
        }
        Self {
            client,
            limiter,
            in_flight: WriteLimit::new(concurrency as usize),
            metrics,
            leader,
            health,
            concurrency_gauge,
        }
    }

    fn failure(&self, err: &kube::Error) -> Failure {
        let failure = classify(err);
        self.metrics.write_failed(failure.class.label());
        failure
    }

    /// Count a write request made beside the writer's own (in its cluster).
    pub(crate) fn count_write(&self, verb: &'static str, kind: &'static str) {
        self.metrics.write(verb, kind);
    }

    /// Writes allowed in flight now (the limit throttling moves).
    pub(crate) fn concurrency(&self) -> usize {
        self.in_flight.allowed()
    }

    fn api(&self, desired_kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &desired_kind.api_resource())
    }

    /// Wait for a rate token.
    async fn pace(&self) {
        self.limiter.acquire().await;
    }

    /// A write slot and a rate token for a request that is not a copy write
    /// (a status, an Event, a finalizer), held until it is answered: they
    /// count against `--write-concurrency` too, so the writes in flight,
    /// and the connections they take, stay bounded however many rules
    /// are reconciled at once.
    pub(crate) async fn other_slot(&self) -> WritePermit<'_> {
        let permit = self.in_flight.acquire().await;
        self.pace().await;
        permit
    }

    /// Wait for a write slot and a rate token; refuse when not the leader,
    /// before waiting as well as after, so that a process that stopped
    /// leading (or is shutting down) drains its backlog at once.
    async fn slot(&self) -> Option<WritePermit<'_>> {
        if !self.leader.is_leader() {
            return None;
        }
        let permit = self.in_flight.acquire().await;
        if !self.leader.is_leader() {
            return None;
        }
        self.pace().await;
        self.leader.is_leader().then_some(permit)
    }

    pub(crate) async fn execute(
        &self,
        kind: Kind,
        action: &Action,
        policy: ConflictPolicy,
        rule: &str,
    ) -> Outcome {
        let Some(permit) = self.slot().await else {
            return Outcome::NotLeader;
        };
        let work = async {
            match action {
                Action::Create { desired, namespace } => {
                    self.create(desired, namespace, policy, rule).await
                }
                Action::Update { desired, current } => self.update(desired, current).await,
                Action::Recreate { desired, current } => {
                    self.recreate(desired, current, policy, rule).await
                }
                Action::Delete { current, .. } => self.delete(kind, current).await,
                Action::HandOver { current, .. } => self.hand_over(kind, current).await,
            }
        };
        // A write must not outlive this process's leadership: one stuck on
        // a stalled connection is dropped when the Lease could pass on.
        let outcome = match self.leader.leading_until() {
            Some(until) => tokio::time::timeout_at(until, work)
                .await
                .unwrap_or(Outcome::NotLeader),
            None => work.await,
        };
        match &outcome {
            Outcome::Failed(failure) if failure.class == FailureClass::Throttled => {
                permit.throttled();
            }
            Outcome::Written(_) | Outcome::Conflict(_) | Outcome::Ignored(_) => permit.succeeded(),
            Outcome::Failed(_) | Outcome::NotLeader => {}
        }
        drop(permit);
        if let Some(gauge) = &self.concurrency_gauge {
            gauge.set(self.in_flight.allowed() as i64);
        }
        self.health.progressed();
        // Per copy at debug only: the rule's pass logs one summary line.
        let (namespace, name) = action.target();
        let source = action.source();
        match &outcome {
            Outcome::Written(_) => {
                debug!(rule, action = action.verb(), kind = %kind, source, namespace, name, "wrote copy")
            }
            Outcome::Conflict(reason) => {
                debug!(rule, namespace, name, reason = reason.as_str(), "conflict")
            }
            Outcome::NotLeader => debug!(rule, namespace, name, "not the leader; not written"),
            Outcome::Ignored(reason) => debug!(rule, namespace, name, reason, "nothing to write"),
            Outcome::Failed(failure) => debug!(
                rule,
                action = action.verb(),
                namespace,
                name,
                class = failure.class.label(),
                error = failure.message.as_str(),
                "write failed"
            ),
        }
        outcome
    }

    async fn recreate(
        &self,
        desired: &Desired,
        current: &Object,
        policy: ConflictPolicy,
        rule: &str,
    ) -> Outcome {
        match self.delete(desired.kind, current).await {
            Outcome::Written(_) | Outcome::Ignored(_) => {
                self.pace().await;
                self.create(desired, &current.namespace, policy, rule).await
            }
            other => other,
        }
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
            Ok(created) => written(desired, created),
            Err(e) if is_status(&e, 409) => {
                self.resolve_existing(desired, namespace, policy, rule)
                    .await
            }
            Err(e) if is_namespace_terminating(&e) || is_status(&e, 404) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e)),
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
        self.pace().await;
        let existing = match api.get_opt(&desired.name).await {
            Ok(Some(existing)) => existing,
            Ok(None) => {
                return Outcome::Failed(Failure {
                    class: FailureClass::Conflict,
                    message: "deleted while being created".into(),
                    retry_after: None,
                });
            }
            Err(e) => return Outcome::Failed(self.failure(&e)),
        };
        let current = Object::from_dynamic(desired.kind, existing).into_compact();
        match occupied(desired, &current, policy, rule) {
            Occupied::Ours => Outcome::Written(Some(Arc::new(current))),
            Occupied::Conflict(reason) => Outcome::Conflict(reason),
            Occupied::Recreate => match self.delete(desired.kind, &current).await {
                Outcome::Written(_) | Outcome::Ignored(_) => {
                    self.pace().await;
                    Box::pin(self.create(desired, namespace, policy, rule)).await
                }
                other => other,
            },
            Occupied::Update => self.update(desired, &current).await,
        }
    }

    /// Replace the copy, conditional on the version the plan saw; labels
    /// and annotations that others own are kept.
    async fn update(&self, desired: &Desired, current: &Object) -> Outcome {
        let api = self.api(desired.kind, &current.namespace);
        let params = write_params();
        self.metrics.write("update", desired.kind.name());
        let object = to_dynamic(desired, &current.namespace, Some(current));
        match api.replace(&desired.name, &params, &object).await {
            Ok(updated) => written(desired, updated),
            Err(e) if is_status(&e, 404) => Outcome::Failed(Failure {
                class: FailureClass::Conflict,
                message: "the copy was deleted meanwhile".into(),
                retry_after: None,
            }),
            Err(e) if is_status(&e, 422) && current.is_immutable() => Outcome::Failed(Failure {
                class: FailureClass::Conflict,
                message: "the copy became immutable meanwhile".into(),
                retry_after: None,
            }),
            Err(e) if is_namespace_terminating(&e) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e)),
        }
    }

    /// Orphan the copy: label exactly the version the plan saw as handed
    /// over to its namespace, leaving everything else of it as it is.
    pub(crate) async fn hand_over(&self, kind: Kind, current: &Object) -> Outcome {
        let api = self.api(kind, &current.namespace);
        // The resourceVersion makes the merge patch conditional.
        let patch = serde_json::json!({"metadata": {
            "labels": {crate::LABEL_SYNC_POLICY: crate::CREATE_ONLY},
            "resourceVersion": current.resource_version,
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.metrics.write("patch", kind.name());
        match api
            .patch(&current.name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => Outcome::Written(Some(Arc::new(
                Object::from_dynamic(kind, patched).into_compact(),
            ))),
            Err(e) if is_status(&e, 404) => Outcome::Ignored("already gone"),
            Err(e) if is_namespace_terminating(&e) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e)),
        }
    }

    /// Delete exactly the version the plan saw.
    pub(crate) async fn delete(&self, kind: Kind, current: &Object) -> Outcome {
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
            Err(e) => Outcome::Failed(self.failure(&e)),
        }
    }
}
