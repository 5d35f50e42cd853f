//! The writer's requests beside copies: a rule's status and finalizers,
//! the Events on a rule, and consumer restarts. Each takes a write slot
//! and a rate token like a copy write, and each is sent only while this
//! process leads, and dropped once the Lease could pass on, as a copy
//! write is ([`Writer::slot`], `leading_until`).

use std::future::Future;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::Event;
use serde_json::{Value, json};

use super::{Store, Writer};
use crate::FIELD_MANAGER;
use crate::api::rule::{CopyratorRule, RuleStatus};
use crate::core::identity::Identity;

/// A write that only the leader sends.
#[derive(Debug)]
pub(crate) enum Sent<T> {
    /// Sent; the API server's answer.
    Answered(T),
    /// Not sent: this process does not lead.
    NotLeader,
}

impl Writer {
    /// `work` with a write slot and a rate token, counted as a `verb` of
    /// `kind`; not sent by a process that does not lead, and dropped once
    /// the Lease could pass on (as a copy write is).
    async fn while_leading<T>(
        &self,
        verb: &'static str,
        kind: &'static str,
        work: impl Future<Output = kube::Result<T>>,
    ) -> kube::Result<Sent<T>> {
        let Some(_permit) = self.slot().await else {
            return Ok(Sent::NotLeader);
        };
        self.metrics.write(verb, kind);
        match self.leader.leading_until() {
            Some(until) => match tokio::time::timeout_at(until, work).await {
                Ok(answer) => answer.map(Sent::Answered),
                Err(_) => Ok(Sent::NotLeader),
            },
            None => work.await.map(Sent::Answered),
        }
    }

    /// Server-side apply `status` as the rule's status (Copyrator's field
    /// manager owns all of it); the rule as the API server answered.
    /// With `precondition`, only over the rule's version as `rule` has it
    /// (409 Conflict otherwise).
    pub(crate) async fn rule_status(
        &self,
        rule: &CopyratorRule,
        status: &RuleStatus,
        precondition: bool,
    ) -> kube::Result<Sent<CopyratorRule>> {
        let (namespace, name) = rule_place(rule);
        let store = self.store(&Identity::Operator);
        let work = async move {
            match store {
                Store::Api((client, _), _) => {
                    let mut body = json!({
                        "apiVersion": format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
                        "kind": crate::api::KIND,
                        "status": status,
                    });
                    if precondition {
                        body["metadata"] =
                            json!({"resourceVersion": rule.metadata.resource_version});
                    }
                    Api::<CopyratorRule>::namespaced(client.clone(), namespace)
                        .patch_status(
                            name,
                            &PatchParams::apply(FIELD_MANAGER).force(),
                            &Patch::Apply(&body),
                        )
                        .await
                }
                #[cfg(test)]
                Store::Fake(fake, identity) => {
                    fake.sent_as(identity);
                    fake.rule_write("status", rule, |answer| {
                        answer.status = Some(status.clone());
                    })
                }
            }
        };
        self.while_leading("patch", crate::api::KIND, work).await
    }

    /// Set the rule's finalizers to `finalizers`, as a compare-and-swap on
    /// the version of `rule` (whoever changed the list meanwhile wins, and
    /// the pass that sees it decides again).
    pub(crate) async fn rule_finalizers(
        &self,
        rule: &CopyratorRule,
        finalizers: Vec<String>,
    ) -> kube::Result<Sent<CopyratorRule>> {
        let (namespace, name) = rule_place(rule);
        let store = self.store(&Identity::Operator);
        let work = async move {
            match store {
                Store::Api((client, _), _) => {
                    let patch = json!({"metadata": {
                        "finalizers": finalizers,
                        "resourceVersion": rule.metadata.resource_version,
                    }});
                    Api::<CopyratorRule>::namespaced(client.clone(), namespace)
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                }
                #[cfg(test)]
                Store::Fake(fake, identity) => {
                    fake.sent_as(identity);
                    fake.rule_write("finalizers", rule, |answer| {
                        answer.metadata.finalizers = Some(finalizers);
                    })
                }
            }
        };
        self.while_leading("patch", crate::api::KIND, work).await
    }

    /// Publish `event` on `rule`; a failure is the caller's to log.
    pub(crate) async fn rule_event(
        &self,
        rule: &CopyratorRule,
        event: &Event,
    ) -> kube::Result<Sent<()>> {
        let store = self.store(&Identity::Operator);
        let work = async move {
            match store {
                Store::Api(..) => {
                    let reference = kube::Resource::object_ref(rule, &());
                    self.recorder.publish(event, &reference).await
                }
                #[cfg(test)]
                Store::Fake(fake, identity) => {
                    fake.sent_as(identity);
                    fake.event(rule, &event.reason)
                }
            }
        };
        self.while_leading("create", "Event", work).await
    }

    /// Publish `event` on the object `reference` names (one that is not a
    /// rule: the copy protection's policy).
    pub(crate) async fn event_on(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        event: &Event,
    ) -> kube::Result<Sent<()>> {
        let store = self.store(&Identity::Operator);
        let work = async move {
            match store {
                Store::Api(..) => self.recorder.publish(event, reference).await,
                #[cfg(test)]
                Store::Fake(..) => Ok(()),
            }
        };
        self.while_leading("create", "Event", work).await
    }

    /// A merge patch of a workload's pod template annotations (a consumer
    /// restart), as `identity`, under the field manager of every write;
    /// `workload_kind` names it in the write metrics.
    pub(crate) async fn patch_workload(
        &self,
        resource: &kube::core::ApiResource,
        workload_kind: &'static str,
        (namespace, name): (&str, &str),
        patch: &Value,
        identity: &Identity,
    ) -> kube::Result<Sent<()>> {
        let store = self.store(identity);
        let work = async move {
            match store {
                Store::Api((client, acting_for), identity) => {
                    let params = PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    crate::cluster::impersonation::Requests::new(
                        client, resource, namespace, identity,
                    )
                    .acting_for(acting_for)
                    .patch(name, &params, &Patch::Merge(patch))
                    .await
                    .map(|_| ())
                }
                #[cfg(test)]
                Store::Fake(fake, identity) => {
                    fake.sent_as(identity);
                    fake.merge_patch(namespace, name, patch).map(|_| ())
                }
            }
        };
        self.while_leading("patch", workload_kind, work).await
    }
}

fn rule_place(rule: &CopyratorRule) -> (&str, &str) {
    (
        rule.metadata.namespace.as_deref().unwrap_or_default(),
        rule.metadata.name.as_deref().unwrap_or_default(),
    )
}
