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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use tracing::debug;

use crate::FIELD_MANAGER;
use crate::api::kinds::Kind;
use crate::cache::index::Object;
use crate::cache::mark::{self, Place};
use crate::cluster::impersonation::Requests;
use crate::cluster::leader::LeaderGate;
use crate::cluster::ratelimit::RateLimiter;
use crate::cluster::write_limit::{WriteLimit, WritePermit};
use crate::core::backoff::{Failure, FailureClass};
use crate::core::identity::Identity;
use crate::core::plan::{Action, Claim, Desired, Occupied, occupied};
use crate::ops::metrics::ClusterMetrics;

mod rule_writes;
pub(crate) use rule_writes::Sent;

/// What became of one action.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Written; the object as the API server returned it (None after a delete).
    Written(Option<Arc<Object>>),
    /// An object the rule did not write, holding its copy's payload, taken
    /// over by a metadata patch; as the API server returned it.
    Adopted(Arc<Object>),
    /// A foreign object holds the name and the policy leaves it alone.
    Conflict(String),
    /// The API server refused or did not answer; retried on a backoff.
    Failed(Failure),
    /// This process may not write now (it does not hold the Lease).
    NotLeader,
    /// Nothing to do after all (the namespace is going away, the object is gone).
    Ignored(&'static str),
}

/// Where the writer's requests go: the API server, as an identity, or (in
/// unit tests) an object store in memory that answers as the API server
/// does, and records whom each request was sent as.
enum Store<'a> {
    /// The client, whether requests as a ServiceAccount carry the
    /// acting-for extra, and whom they are sent as.
    Api((&'a Client, bool), &'a Identity),
    #[cfg(test)]
    Fake(&'a crate::cluster::fake_objects::FakeObjects, &'a Identity),
}

fn requests<'a>(
    (client, acting_for): (&'a Client, bool),
    identity: &'a Identity,
    kind: Kind,
    namespace: &str,
) -> Requests<'a> {
    Requests::new(client, &kind.api_resource(), namespace, identity).acting_for(acting_for)
}

impl Store<'_> {
    async fn create(
        &self,
        kind: Kind,
        namespace: &str,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        match self {
            Store::Api(client, identity) => {
                requests(*client, identity, kind, namespace)
                    .create(&write_params(), object)
                    .await
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.create(namespace, object)
            }
        }
    }

    async fn get_opt(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<DynamicObject>> {
        match self {
            Store::Api(client, identity) => {
                requests(*client, identity, kind, namespace)
                    .get_opt(name)
                    .await
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.get(namespace, name)
            }
        }
    }

    async fn replace(
        &self,
        kind: Kind,
        namespace: &str,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        match self {
            Store::Api(client, identity) => {
                let name = object.metadata.name.as_deref().unwrap_or_default();
                requests(*client, identity, kind, namespace)
                    .replace(name, &write_params(), object)
                    .await
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.replace(namespace, object)
            }
        }
    }

    /// A JSON merge patch (of the object's metadata).
    async fn merge_patch(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> kube::Result<DynamicObject> {
        match self {
            Store::Api(client, identity) => {
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                requests(*client, identity, kind, namespace)
                    .patch(name, &params, &Patch::Merge(patch))
                    .await
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.merge_patch(namespace, name, patch)
            }
        }
    }

    /// Delete exactly the object of this uid and version.
    async fn delete(&self, kind: Kind, current: &Object) -> kube::Result<()> {
        match self {
            Store::Api(client, identity) => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(current.uid.clone()),
                        resource_version: Some(current.resource_version.clone()),
                    }),
                    ..Default::default()
                };
                requests(*client, identity, kind, &current.namespace)
                    .delete(&current.name, &params)
                    .await
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.delete(
                    &current.namespace,
                    &current.name,
                    &current.uid,
                    &current.resource_version,
                )
            }
        }
    }
}

pub(crate) struct Writer {
    client: Client,
    /// Unit tests only: objects in memory that answer instead of the API server.
    #[cfg(test)]
    fake: std::sync::OnceLock<Arc<crate::cluster::fake_objects::FakeObjects>>,
    limiter: RateLimiter,
    /// The writes in flight: fewer while the API server throttles them.
    in_flight: WriteLimit,
    metrics: ClusterMetrics,
    leader: LeaderGate,
    /// Events on rules, sent through the same client.
    recorder: kube::runtime::events::Recorder,
    /// Writes as a ServiceAccount carry the acting-for extra
    /// (`--acting-for-extra`).
    acting_for_extra: bool,
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

/// Whether `err` is the API server's refusal to let the operator act as
/// `identity`, rather than the identity's refusal of the write: a 403
/// naming the ServiceAccount itself (impersonation as it was), or whose
/// reason is an `impersonate` verb the operator lacks (constrained
/// impersonation, `impersonate-on:serviceaccount:<verb>`, which names the
/// object written instead). A refusal of the write names the verb written.
fn impersonation_refused(err: &kube::Error, identity: &Identity) -> bool {
    let Identity::ServiceAccount { name, .. } = identity else {
        return false;
    };
    let kube::Error::Api(status) = err else {
        return false;
    };
    let names_the_account = status
        .details
        .as_ref()
        .is_some_and(|d| d.kind == "serviceaccounts" && d.group.is_empty() && d.name == **name);
    status.code == 403 && (names_the_account || status.message.contains("\" cannot impersonate"))
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
            rule_uid: desired
                .labels
                .get(crate::LABEL_RULE_UID)
                .map_or("", String::as_str),
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

/// The merge patch that adopts `current` as the copy `desired` (it holds
/// its payload already): Copyrator's labels and annotations and its mark
/// set, its other keys that `desired` does not carry removed (an earlier
/// rule's hand-over), the other copying tools' marks removed (so that
/// the tool, or its policy, later removed, neither deletes nor rewrites
/// it), and the version seen, which makes the patch conditional.
fn adoption_patch(desired: &Desired, current: &Object) -> Value {
    let marked = to_dynamic(desired, &current.namespace, None);
    let wanted_labels = marked.metadata.labels.unwrap_or_default();
    let mut wanted_annotations = marked.metadata.annotations.unwrap_or_default();
    wanted_annotations.insert(crate::ANNOTATION_ADOPTED_FROM.to_owned(), made_by(current));
    // A compact object lists no key Copyrator's field manager set: those
    // a hand-over adds are named here.
    let handed_over = [crate::LABEL_SYNC_POLICY, crate::LABEL_ON_RULE_DELETED];
    let labels = merged(
        current.labels.keys().map(String::as_str).chain(handed_over),
        wanted_labels,
    );
    let annotations = merged(
        current.annotations.keys().map(String::as_str),
        wanted_annotations,
    );
    serde_json::json!({"metadata": {
        "labels": labels,
        "annotations": annotations,
        "resourceVersion": current.resource_version,
    }})
}

/// What made `current`, which a rule adopts: the copying tool whose marks
/// it carries, the Copyrator rule that handed it over, or the last writer
/// `managedFields` name.
fn made_by(current: &Object) -> String {
    let tool = current
        .labels
        .keys()
        .chain(current.annotations.keys())
        .find_map(|key| crate::core::tracking::copier_mark(key));
    match (
        tool,
        current.rule_ref.as_deref(),
        current.other_writer.as_deref(),
    ) {
        (Some(tool), _, _) => tool.to_owned(),
        (None, Some(rule), _) => format!("Copyrator rule {rule}"),
        (None, None, Some(writer)) => writer.to_owned(),
        (None, None, None) => "unknown".to_owned(),
    }
}

/// A merge patch of one map of metadata: every `wanted` entry set, and
/// each of the `present` keys that is Copyrator's or another copying
/// tool's mark, and not wanted, removed.
fn merged<'a>(
    present: impl Iterator<Item = &'a str>,
    wanted: BTreeMap<String, String>,
) -> serde_json::Map<String, Value> {
    let mut out: serde_json::Map<String, Value> = present
        .filter(|key| {
            !wanted.contains_key(*key)
                && (key.starts_with(COPYRATOR_PREFIX)
                    || crate::core::tracking::copier_mark(key).is_some())
        })
        .map(|key| (key.to_owned(), Value::Null))
        .collect();
    out.extend(wanted.into_iter().map(|(k, v)| (k, Value::String(v))));
    out
}

/// What Copyrator's own labels and annotations start with.
const COPYRATOR_PREFIX: &str = "copyrator.flant.com/";

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
        limits: crate::cluster::limits::Limits,
        metrics: ClusterMetrics,
        leader: LeaderGate,
        health: Arc<crate::ops::http::Health>,
        concurrency_gauge: Option<Gauge>,
    ) -> Self {
        if let Some(gauge) = &concurrency_gauge {
            gauge.set(i64::from(limits.write_concurrency));
        }
        let reporter = kube::runtime::events::Reporter {
            controller: "copyrator".into(),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .ok(),
        };
        Self {
            recorder: kube::runtime::events::Recorder::new(client.clone(), reporter),
            client,
            #[cfg(test)]
            fake: std::sync::OnceLock::new(),
            limiter,
            in_flight: WriteLimit::new(limits.write_concurrency as usize),
            acting_for_extra: limits.acting_for_extra,
            metrics,
            leader,
            health,
            concurrency_gauge,
        }
    }

    fn failure(&self, err: &kube::Error, identity: &Identity) -> Failure {
        let mut failure = classify(err);
        if failure.class == FailureClass::Refused && impersonation_refused(err, identity) {
            failure.class = FailureClass::ImpersonationRefused;
        }
        self.metrics.write_failed(failure.class.label());
        failure
    }

    /// Writes allowed in flight now (the limit throttling moves).
    pub(crate) fn concurrency(&self) -> usize {
        self.in_flight.allowed()
    }

    /// Where requests as `identity` go.
    fn store<'a>(&'a self, identity: &'a Identity) -> Store<'a> {
        #[cfg(test)]
        if let Some(fake) = self.fake.get() {
            return Store::Fake(fake, identity);
        }
        Store::Api((&self.client, self.acting_for_extra), identity)
    }

    /// Wait for a rate token.
    async fn pace(&self) {
        self.limiter.acquire().await;
    }

    /// Whether writes would be sent now (this process leads): for work
    /// that only leads to writes (listing the workloads to restart).
    pub(crate) fn leads(&self) -> bool {
        self.leader.is_leader()
    }

    /// Wait for a write slot and a rate token; refuse when not the leader,
    /// before waiting as well as after, so that a process that stopped
    /// leading (or is shutting down) drains its backlog at once.
    async fn slot(&self) -> Option<WritePermit<'_>> {
        if !self.leads() {
            return None;
        }
        let permit = self.in_flight.acquire().await;
        if !self.leads() {
            return None;
        }
        self.pace().await;
        self.leads().then_some(permit)
    }

    pub(crate) async fn execute(
        &self,
        kind: Kind,
        action: &Action,
        claim: impl Into<Claim>,
        rule: &str,
        identity: &Identity,
    ) -> Outcome {
        let claim = claim.into();
        let Some(permit) = self.slot().await else {
            return Outcome::NotLeader;
        };
        let work = async {
            match action {
                // A rule that adopts looks before it creates: what holds
                // the place may be taken as it is, with no payload write.
                Action::Create { desired, namespace } if claim.adopt => {
                    self.resolve_existing(desired, namespace, claim, rule, identity)
                        .await
                }
                Action::Create { desired, namespace } => {
                    self.create(desired, namespace, claim, rule, identity).await
                }
                Action::Update { desired, current } => {
                    self.update(desired, current, identity).await
                }
                Action::Recreate { desired, current } => {
                    self.recreate(desired, current, claim, rule, identity).await
                }
                Action::Delete { current, .. } => self.delete(kind, current, identity).await,
                Action::HandOver { current, .. } => self.hand_over(kind, current, identity).await,
                Action::Adopt { desired, current } => self.adopt(desired, current, identity).await,
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
            Outcome::Written(_)
            | Outcome::Adopted(_)
            | Outcome::Conflict(_)
            | Outcome::Ignored(_) => permit.succeeded(),
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
            Outcome::Adopted(_) => {
                debug!(rule, kind = %kind, source, namespace, name, "adopted copy")
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
        claim: Claim,
        rule: &str,
        identity: &Identity,
    ) -> Outcome {
        match self.delete(desired.kind, current, identity).await {
            Outcome::Written(_) | Outcome::Ignored(_) => {
                self.pace().await;
                self.create(desired, &current.namespace, claim, rule, identity)
                    .await
            }
            other => other,
        }
    }

    async fn create(
        &self,
        desired: &Desired,
        namespace: &str,
        claim: Claim,
        rule: &str,
        identity: &Identity,
    ) -> Outcome {
        self.metrics.write("create", desired.kind.name());
        let object = to_dynamic(desired, namespace, None);
        match self
            .store(identity)
            .create(desired.kind, namespace, &object)
            .await
        {
            Ok(created) => written(desired, created),
            Err(e) if is_status(&e, 409) => {
                self.pace().await;
                Box::pin(self.resolve_existing(desired, namespace, claim, rule, identity)).await
            }
            Err(e) if is_namespace_terminating(&e) || is_status(&e, 404) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e, identity)),
        }
    }

    /// What holds the place of a create: ours (the cache is behind),
    /// another rule's, or a foreign object that the claim may take over.
    /// Asked after a create found the name taken, or (for a rule that
    /// adopts) before creating: then an empty place is created.
    async fn resolve_existing(
        &self,
        desired: &Desired,
        namespace: &str,
        claim: Claim,
        rule: &str,
        identity: &Identity,
    ) -> Outcome {
        let existing = match self
            .store(identity)
            .get_opt(desired.kind, namespace, &desired.name)
            .await
        {
            Ok(Some(existing)) => existing,
            Ok(None) if claim.adopt => {
                self.pace().await;
                return Box::pin(self.create(
                    desired,
                    namespace,
                    Claim {
                        adopt: false,
                        ..claim
                    },
                    rule,
                    identity,
                ))
                .await;
            }
            Ok(None) => {
                return Outcome::Failed(Failure {
                    class: FailureClass::Conflict,
                    message: "deleted while being created".into(),
                    retry_after: None,
                });
            }
            Err(e) if is_namespace_terminating(&e) => {
                return Outcome::Ignored("the namespace is going away");
            }
            Err(e) => return Outcome::Failed(self.failure(&e, identity)),
        };
        let current = Object::from_dynamic(desired.kind, existing).into_compact();
        self.pace().await;
        match occupied(desired, &current, claim, rule) {
            Occupied::Ours => Outcome::Written(Some(Arc::new(current))),
            Occupied::Conflict(reason) => Outcome::Conflict(reason),
            Occupied::Recreate => match self.delete(desired.kind, &current, identity).await {
                Outcome::Written(_) | Outcome::Ignored(_) => {
                    self.pace().await;
                    Box::pin(self.create(desired, namespace, claim, rule, identity)).await
                }
                other => other,
            },
            Occupied::Update => self.update(desired, &current, identity).await,
            Occupied::Adopt => self.adopt(desired, &current, identity).await,
        }
    }

    /// Take over `current`, which holds `desired`'s payload already: one
    /// merge patch of its labels and annotations (see [`adoption_patch`]),
    /// conditional on the version seen, so that nothing it holds changed
    /// since it was judged.
    pub(crate) async fn adopt(
        &self,
        desired: &Desired,
        current: &Object,
        identity: &Identity,
    ) -> Outcome {
        let patch = adoption_patch(desired, current);
        self.metrics.write("patch", desired.kind.name());
        match self
            .store(identity)
            .merge_patch(desired.kind, &current.namespace, &current.name, &patch)
            .await
        {
            Ok(patched) => match written(desired, patched) {
                Outcome::Written(Some(object)) => Outcome::Adopted(object),
                other => other,
            },
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Outcome::Failed(Failure {
                class: FailureClass::Conflict,
                message: "the object changed or went while being adopted".into(),
                retry_after: None,
            }),
            Err(e) if is_namespace_terminating(&e) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e, identity)),
        }
    }

    /// Replace the copy, conditional on the version the plan saw; labels
    /// and annotations that others own are kept.
    async fn update(&self, desired: &Desired, current: &Object, identity: &Identity) -> Outcome {
        self.metrics.write("update", desired.kind.name());
        let object = to_dynamic(desired, &current.namespace, Some(current));
        match self
            .store(identity)
            .replace(desired.kind, &current.namespace, &object)
            .await
        {
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
            Err(e) => Outcome::Failed(self.failure(&e, identity)),
        }
    }

    /// Orphan the copy: label exactly the version the plan saw as handed
    /// over to its namespace, leaving everything else of it as it is.
    pub(crate) async fn hand_over(
        &self,
        kind: Kind,
        current: &Object,
        identity: &Identity,
    ) -> Outcome {
        // The resourceVersion makes the merge patch conditional.
        let patch = serde_json::json!({"metadata": {
            "labels": {crate::LABEL_SYNC_POLICY: crate::CREATE_ONLY},
            "resourceVersion": current.resource_version,
        }});
        self.metrics.write("patch", kind.name());
        match self
            .store(identity)
            .merge_patch(kind, &current.namespace, &current.name, &patch)
            .await
        {
            Ok(patched) => Outcome::Written(Some(Arc::new(
                Object::from_dynamic(kind, patched).into_compact(),
            ))),
            Err(e) if is_status(&e, 404) => Outcome::Ignored("already gone"),
            Err(e) if is_namespace_terminating(&e) => {
                Outcome::Ignored("the namespace is going away")
            }
            Err(e) => Outcome::Failed(self.failure(&e, identity)),
        }
    }

    /// Delete exactly the version the plan saw.
    pub(crate) async fn delete(
        &self,
        kind: Kind,
        current: &Object,
        identity: &Identity,
    ) -> Outcome {
        self.metrics.write("delete", kind.name());
        match self.store(identity).delete(kind, current).await {
            Ok(()) => Outcome::Written(None),
            Err(e) if is_status(&e, 404) => Outcome::Ignored("already gone"),
            Err(e) => Outcome::Failed(self.failure(&e, identity)),
        }
    }
}

#[cfg(test)]
impl Writer {
    /// A writer over objects in memory, leading as `leader` says.
    pub(crate) fn over_fake(
        store: Arc<crate::cluster::fake_objects::FakeObjects>,
        leader: LeaderGate,
    ) -> Self {
        let writer = Self::new(
            crate::cluster::fake_objects::never_asked_client(),
            RateLimiter::new(0.0, 1),
            crate::cluster::limits::Limits::for_tests(),
            ClusterMetrics::new(Arc::new(crate::ops::metrics::Metrics::default()), "home"),
            leader,
            Arc::new(crate::ops::http::Health::new(Duration::from_secs(60))),
            None,
        );
        writer.answer_from(store);
        writer
    }

    /// From now on, objects in memory answer this writer's requests.
    pub(crate) fn answer_from(&self, store: Arc<crate::cluster::fake_objects::FakeObjects>) {
        // Set once per writer: a second store is a mistake in the test.
        assert!(
            self.fake.set(store).is_ok(),
            "the writer answers from one store"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rule::{ConflictPolicy, CopyratorRule};
    use crate::cluster::fake_objects::{FakeObjects, api_error, config_map};
    use crate::core::plan::{DeleteReason, desired_copy};
    use crate::core::resolve::{ResolvedRule, Trust};
    use serde_json::json;

    const RULE: &str = "ops/r";

    fn rule() -> ResolvedRule {
        let rule: CopyratorRule = serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "ops", "uid": "rule-1", "generation": 1},
            "ruleType": "configmap",
            "selector": {"copy": "yes"},
        }))
        .expect("a rule");
        rule.resolve(&Trust::new("ops", false))
            .expect("a valid rule")
    }

    /// The copy of `ops/ca` (data `ca: GOOD`) the rule wants anywhere.
    fn desired() -> Arc<Desired> {
        let source = Object::from_dynamic(
            Kind::ConfigMap,
            config_map("ops", "ca", json!({"copy": "yes"}), json!({"ca": "GOOD"})),
        );
        Arc::new(desired_copy(&rule(), &source))
    }

    fn setup() -> (Arc<FakeObjects>, Writer) {
        let store = Arc::new(FakeObjects::default());
        let (leader, _) = LeaderGate::always();
        (store.clone(), Writer::over_fake(store, leader))
    }

    fn create(namespace: &str) -> Action {
        Action::Create {
            desired: desired(),
            namespace: namespace.to_owned(),
        }
    }

    /// The stored object as the copy cache would hold it.
    fn held(store: &FakeObjects, namespace: &str, name: &str) -> Arc<Object> {
        let object = store.stored(namespace, name).expect("stored");
        Arc::new(Object::from_dynamic(Kind::ConfigMap, object))
    }

    /// Someone changes the data of the copy in t1 (a new version).
    fn someone_edits(store: &FakeObjects, data: Value) {
        let mut edited = store.stored("t1", "ca").expect("stored");
        edited.data["data"] = data;
        store.replace("t1", &edited).expect("edited");
    }

    fn data(store: &FakeObjects, namespace: &str) -> Value {
        store.stored(namespace, "ca").expect("stored").data["data"].clone()
    }

    async fn run(writer: &Writer, action: &Action, claim: impl Into<Claim>) -> Outcome {
        run_as(writer, action, claim, &Identity::Operator).await
    }

    async fn run_as(
        writer: &Writer,
        action: &Action,
        claim: impl Into<Claim>,
        identity: &Identity,
    ) -> Outcome {
        writer
            .execute(Kind::ConfigMap, action, claim, RULE, identity)
            .await
    }

    fn tenant_account() -> Identity {
        Identity::ServiceAccount {
            namespace: "team-a".into(),
            name: "copyrator".into(),
        }
    }

    const ADOPT: Claim = Claim {
        adopt_own_only: false,
        policy: ConflictPolicy::Skip,
        adopt: true,
    };

    /// What another tool left at t1: the copy's payload (or `data`), its
    /// own marks, and a label of the namespace's.
    fn made_by_kyverno(store: &FakeObjects, data: Value) {
        let mut object = config_map(
            "t1",
            "ca",
            json!({
                "owner": "team",
                "app.kubernetes.io/managed-by": "kyverno",
                "generate.kyverno.io/policy-name": "sync-ca",
            }),
            data,
        );
        object.metadata.annotations = Some(BTreeMap::from([(
            "kubed.appscode.com/origin".to_owned(),
            "{}".to_owned(),
        )]));
        store.put("t1", "kyverno", object);
    }

    fn verbs(store: &FakeObjects) -> Vec<&'static str> {
        store
            .requests()
            .into_iter()
            .map(|(verb, _, _)| verb)
            .collect()
    }

    #[tokio::test]
    async fn an_object_holding_the_payload_is_adopted_by_one_metadata_patch() {
        let (store, writer) = setup();
        made_by_kyverno(&store, json!({"ca": "GOOD"}));
        let uid = store.stored("t1", "ca").expect("stored").metadata.uid;
        let outcome = run(&writer, &create("t1"), ADOPT).await;
        let Outcome::Adopted(adopted) = outcome else {
            panic!("not adopted: {outcome:?}");
        };
        assert!(adopted.authored && adopted.intact);
        assert_eq!(verbs(&store), ["get", "patch"], "no payload written");
        let stored = store.stored("t1", "ca").expect("stored");
        assert_eq!(stored.metadata.uid, uid, "the same object");
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
        let labels = stored.metadata.labels.unwrap_or_default();
        let annotations = stored.metadata.annotations.unwrap_or_default();
        assert_eq!(labels.get("owner").map(String::as_str), Some("team"));
        assert_eq!(
            labels.get(crate::LABEL_MANAGED_BY).map(String::as_str),
            Some("copyrator")
        );
        assert_eq!(
            labels.get(crate::LABEL_RULE_UID).map(String::as_str),
            Some("rule-1")
        );
        assert!(
            !labels.contains_key("generate.kyverno.io/policy-name")
                && !annotations.contains_key("kubed.appscode.com/origin"),
            "the other tools' marks are gone: {labels:?} {annotations:?}"
        );
        assert_eq!(
            annotations
                .get(crate::ANNOTATION_ADOPTED_FROM)
                .map(String::as_str),
            Some("Kyverno")
        );
        let copy = held(&store, "t1", "ca");
        assert!(copy.authored && copy.intact, "its mark proves it");
        assert!(desired().is_satisfied_by(&copy), "nothing more to write");

        // Where it came from stays through later writes of the copy.
        let changed = Arc::new(
            desired().with_payload(BTreeMap::from([("data".to_owned(), json!({"ca": "NEW"}))])),
        );
        let current = Arc::new((*copy).clone().into_compact());
        let update = Action::Update {
            desired: changed,
            current,
        };
        let outcome = run(&writer, &update, ADOPT).await;
        assert!(matches!(outcome, Outcome::Written(Some(_))), "{outcome:?}");
        assert_eq!(data(&store, "t1"), json!({"ca": "NEW"}));
        let annotations = store
            .stored("t1", "ca")
            .expect("stored")
            .metadata
            .annotations
            .unwrap_or_default();
        assert_eq!(
            annotations
                .get(crate::ANNOTATION_ADOPTED_FROM)
                .map(String::as_str),
            Some("Kyverno")
        );
    }

    #[tokio::test]
    async fn an_object_holding_other_content_is_left_to_the_conflict_policy() {
        let (store, writer) = setup();
        made_by_kyverno(&store, json!({"ca": "OLD"}));
        let outcome = run(&writer, &create("t1"), ADOPT).await;
        assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
        assert_eq!(data(&store, "t1"), json!({"ca": "OLD"}));
        let overwrite = Claim {
            adopt_own_only: false,
            policy: ConflictPolicy::Overwrite,
            adopt: true,
        };
        let outcome = run(&writer, &create("t1"), overwrite).await;
        assert!(matches!(outcome, Outcome::Written(Some(_))), "{outcome:?}");
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
    }

    #[tokio::test]
    async fn without_adopt_an_object_holding_the_payload_stays_a_conflict() {
        let (store, writer) = setup();
        made_by_kyverno(&store, json!({"ca": "GOOD"}));
        let outcome = run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
        let labels = store.stored("t1", "ca").expect("stored").metadata.labels;
        assert!(
            labels
                .unwrap_or_default()
                .contains_key("generate.kyverno.io/policy-name"),
            "left as it was"
        );
    }

    #[tokio::test]
    async fn a_rule_that_adopts_creates_where_the_place_is_empty() {
        let (store, writer) = setup();
        let outcome = run(&writer, &create("t1"), ADOPT).await;
        assert!(matches!(outcome, Outcome::Written(Some(_))), "{outcome:?}");
        assert_eq!(verbs(&store), ["get", "create"]);
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
    }

    #[tokio::test]
    async fn a_created_copy_carries_the_payload_the_rules_labels_and_a_mark_that_proves_it() {
        let (store, writer) = setup();
        let Outcome::Written(Some(written)) =
            run(&writer, &create("t1"), ConflictPolicy::Skip).await
        else {
            panic!("not written");
        };
        assert!(written.authored && written.intact && written.settled);
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
        let copy = held(&store, "t1", "ca");
        assert!(
            copy.authored && copy.intact,
            "its mark proves place and content"
        );
        assert_eq!(
            copy.labels.get(crate::LABEL_RULE_UID).map(String::as_str),
            Some("rule-1")
        );
        assert!(desired().is_satisfied_by(&copy));
    }

    #[tokio::test]
    async fn a_foreign_object_at_the_place_is_left_alone_under_skip_and_taken_under_overwrite() {
        let (store, writer) = setup();
        store.put(
            "t1",
            "kubectl",
            config_map(
                "t1",
                "ca",
                json!({"owner": "team"}),
                json!({"ca": "THEIRS"}),
            ),
        );
        let outcome = run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
        assert_eq!(data(&store, "t1"), json!({"ca": "THEIRS"}));
        let outcome = run(&writer, &create("t1"), ConflictPolicy::Overwrite).await;
        assert!(matches!(outcome, Outcome::Written(Some(_))), "{outcome:?}");
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
        let taken = held(&store, "t1", "ca");
        assert!(taken.authored);
        assert_eq!(
            taken.labels.get("owner").map(String::as_str),
            Some("team"),
            "labels others own are written back as they were"
        );
    }

    #[tokio::test]
    async fn a_create_that_finds_its_own_copy_writes_nothing_more() {
        let (store, writer) = setup();
        run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        let before = store
            .stored("t1", "ca")
            .expect("stored")
            .metadata
            .resource_version;
        // The cache was behind: the plan creates it again.
        let outcome = run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        assert!(matches!(outcome, Outcome::Written(Some(_))), "{outcome:?}");
        let verbs: Vec<&str> = store.requests().iter().map(|r| r.0).collect();
        assert_eq!(verbs, ["create", "create", "get"]);
        assert_eq!(
            store
                .stored("t1", "ca")
                .expect("stored")
                .metadata
                .resource_version,
            before
        );
    }

    #[tokio::test]
    async fn an_update_of_a_version_that_changed_meanwhile_fails_as_a_conflict() {
        let (store, writer) = setup();
        run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        let seen = held(&store, "t1", "ca");
        // Someone edits the copy after the plan saw it.
        someone_edits(&store, json!({"ca": "EVIL"}));
        let update = Action::Update {
            desired: desired(),
            current: seen,
        };
        let Outcome::Failed(failure) = run(&writer, &update, ConflictPolicy::Skip).await else {
            panic!("written over a version the plan did not see");
        };
        assert_eq!(failure.class, FailureClass::Conflict);
        assert_eq!(data(&store, "t1"), json!({"ca": "EVIL"}));
        // From the version as it is now, the update restores it.
        let update = Action::Update {
            desired: desired(),
            current: held(&store, "t1", "ca"),
        };
        assert!(matches!(
            run(&writer, &update, ConflictPolicy::Skip).await,
            Outcome::Written(_)
        ));
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
    }

    #[tokio::test]
    async fn a_delete_takes_exactly_the_version_the_plan_saw() {
        let (store, writer) = setup();
        run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        let seen = held(&store, "t1", "ca");
        someone_edits(&store, json!({"ca": "NEWER"}));
        let delete = |current| Action::Delete {
            current,
            reason: DeleteReason::SourceGone,
        };
        let outcome = run(&writer, &delete(seen), ConflictPolicy::Skip).await;
        assert!(
            matches!(&outcome, Outcome::Failed(f) if f.class == FailureClass::Conflict),
            "{outcome:?}"
        );
        assert!(store.stored("t1", "ca").is_some());
        let now = held(&store, "t1", "ca");
        assert!(matches!(
            run(&writer, &delete(now.clone()), ConflictPolicy::Skip).await,
            Outcome::Written(None)
        ));
        assert!(store.stored("t1", "ca").is_none());
        assert!(matches!(
            run(&writer, &delete(now), ConflictPolicy::Skip).await,
            Outcome::Ignored("already gone")
        ));
    }

    #[tokio::test]
    async fn a_hand_over_labels_the_copy_and_changes_nothing_else() {
        let (store, writer) = setup();
        run(&writer, &create("t1"), ConflictPolicy::Skip).await;
        let hand_over = Action::HandOver {
            current: held(&store, "t1", "ca"),
            reason: DeleteReason::RuleDeleted,
        };
        let Outcome::Written(Some(handed)) = run(&writer, &hand_over, ConflictPolicy::Skip).await
        else {
            panic!("not handed over");
        };
        assert!(handed.create_only);
        assert_eq!(data(&store, "t1"), json!({"ca": "GOOD"}));
    }

    #[tokio::test]
    async fn nothing_is_written_into_a_namespace_going_away_nor_by_a_process_that_does_not_lead() {
        let (store, writer) = setup();
        store.terminate("t1");
        assert!(matches!(
            run(&writer, &create("t1"), ConflictPolicy::Skip).await,
            Outcome::Ignored(_)
        ));
        let (gate, leading) = LeaderGate::always();
        let follower = Writer::over_fake(store.clone(), gate);
        leading.send_replace(false);
        assert!(matches!(
            run(&follower, &create("t2"), ConflictPolicy::Skip).await,
            Outcome::NotLeader
        ));
        assert!(
            !store.requests().iter().any(|r| r.1 == "t2"),
            "no request made"
        );
    }

    #[tokio::test]
    async fn every_request_for_a_rule_is_sent_as_its_identity() {
        let (store, writer) = setup();
        let tenant = tenant_account();
        // Adoption looks first (a get), then creates; an update, a
        // hand-over and a delete follow: each is sent as the tenant.
        run_as(&writer, &create("t1"), ADOPT, &tenant).await;
        someone_edits(&store, json!({"ca": "EDITED"}));
        let update = Action::Update {
            desired: desired(),
            current: held(&store, "t1", "ca"),
        };
        assert!(matches!(
            run_as(&writer, &update, ConflictPolicy::Skip, &tenant).await,
            Outcome::Written(_)
        ));
        let hand_over = Action::HandOver {
            current: held(&store, "t1", "ca"),
            reason: DeleteReason::RuleDeleted,
        };
        run_as(&writer, &hand_over, ConflictPolicy::Skip, &tenant).await;
        let delete = Action::Delete {
            current: held(&store, "t1", "ca"),
            reason: DeleteReason::SourceGone,
        };
        run_as(&writer, &delete, ConflictPolicy::Skip, &tenant).await;
        // The second replace is the writer's; the first, someone's edit.
        assert_eq!(
            verbs(&store),
            ["get", "create", "replace", "replace", "patch", "delete"]
        );
        assert_eq!(
            store.identities(),
            vec!["system:serviceaccount:team-a:copyrator"; 5]
        );
        // The operator's own rule impersonates nobody.
        run(&writer, &create("t2"), ConflictPolicy::Skip).await;
        assert_eq!(
            store.identities().last().map(String::as_str),
            Some("operator")
        );
    }

    #[tokio::test]
    async fn a_refusal_to_let_the_operator_act_as_the_account_is_told_apart() {
        let (store, writer) = setup();
        let tenant = tenant_account();
        let refusal = |name: &str, kind: &str, message: &str| {
            let status: kube::core::Status = serde_json::from_value(json!({
                "status": "Failure", "message": message, "reason": "Forbidden",
                "code": 403, "details": {"name": name, "kind": kind},
            }))
            .expect("a Status");
            kube::Error::Api(Box::new(status))
        };
        for (error, class) in [
            // The impersonation itself: the API server names the account,
            (
                refusal(
                    "copyrator",
                    "serviceaccounts",
                    r#"serviceaccounts "copyrator" is forbidden: User "op" cannot impersonate resource "serviceaccounts""#,
                ),
                FailureClass::ImpersonationRefused,
            ),
            // or, with constrained impersonation, the verb it lacks.
            (
                refusal(
                    "ca",
                    "configmaps",
                    r#"configmaps is forbidden: User "op" cannot impersonate-on:serviceaccount:create resource "configmaps""#,
                ),
                FailureClass::ImpersonationRefused,
            ),
            // The account may not write the copy: its own refusal.
            (
                refusal(
                    "ca",
                    "configmaps",
                    r#"configmaps "ca" is forbidden: User "system:serviceaccount:team-a:copyrator" cannot create resource "configmaps""#,
                ),
                FailureClass::Refused,
            ),
        ] {
            store.fail_next("create", "t1", error);
            let Outcome::Failed(failure) =
                run_as(&writer, &create("t1"), ConflictPolicy::Skip, &tenant).await
            else {
                panic!("not failed");
            };
            assert_eq!(failure.class, class);
        }
        // Without impersonation, nothing is the impersonation's refusal.
        store.fail_next(
            "create",
            "t1",
            refusal(
                "copyrator",
                "serviceaccounts",
                "serviceaccounts \"copyrator\" is forbidden",
            ),
        );
        let Outcome::Failed(failure) = run(&writer, &create("t1"), ConflictPolicy::Skip).await
        else {
            panic!("not failed");
        };
        assert_eq!(failure.class, FailureClass::Refused);
    }

    #[tokio::test]
    async fn refusals_come_back_classified_in_the_api_servers_words() {
        let (store, writer) = setup();
        for (code, reason, class) in [
            (403, "Forbidden", FailureClass::Refused),
            (429, "TooManyRequests", FailureClass::Throttled),
            (500, "InternalError", FailureClass::Transient),
            (409, "Conflict", FailureClass::Conflict),
        ] {
            store.fail_next(
                "replace",
                "t1",
                api_error(code, &format!("said with {code}"), reason),
            );
            run(&writer, &create("t1"), ConflictPolicy::Skip).await;
            let update = Action::Update {
                desired: desired(),
                current: held(&store, "t1", "ca"),
            };
            let Outcome::Failed(failure) = run(&writer, &update, ConflictPolicy::Skip).await else {
                panic!("{code}: not failed");
            };
            assert_eq!(failure.class, class, "{code}");
            assert!(
                failure.message.contains(&format!("said with {code}")),
                "{}",
                failure.message
            );
        }
    }
}
