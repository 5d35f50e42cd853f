//! The writer's requests beside copies: a rule's status and finalizers,
//! the Events on a rule, and consumer restarts. Each takes a write slot
//! and a rate token like a copy write, and each is sent only while this
//! process leads (the Lease is checked in [`Writer::slot`], nowhere else).

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
    /// Server-side apply `status` as the rule's status (Copyrator's field
    /// manager owns all of it); the rule as the API server answered.
    pub(crate) async fn rule_status(
        &self,
        rule: &CopyratorRule,
        status: &RuleStatus,
    ) -> kube::Result<Sent<CopyratorRule>> {
        let Some(_permit) = self.slot().await else {
            return Ok(Sent::NotLeader);
        };
        self.metrics.write("patch", crate::api::KIND);
        let (namespace, name) = rule_place(rule);
        let answer = match self.store(&Identity::Operator) {
            Store::Api(client, _) => {
                let body = json!({
                    "apiVersion": format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
                    "kind": crate::api::KIND,
                    "status": status,
                });
                Api::<CopyratorRule>::namespaced((*client).clone(), namespace)
                    .patch_status(
                        name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&body),
                    )
                    .await?
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.rule_write("status", rule, |answer| {
                    answer.status = Some(status.clone());
                })?
            }
        };
        Ok(Sent::Answered(answer))
    }

    /// Set the rule's finalizers to `finalizers`, as a compare-and-swap on
    /// the version of `rule` (whoever changed the list meanwhile wins, and
    /// the pass that sees it decides again).
    pub(crate) async fn rule_finalizers(
        &self,
        rule: &CopyratorRule,
        finalizers: Vec<String>,
    ) -> kube::Result<Sent<CopyratorRule>> {
        let Some(_permit) = self.slot().await else {
            return Ok(Sent::NotLeader);
        };
        self.metrics.write("patch", crate::api::KIND);
        let (namespace, name) = rule_place(rule);
        let answer = match self.store(&Identity::Operator) {
            Store::Api(client, _) => {
                let patch = json!({"metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": rule.metadata.resource_version,
                }});
                Api::<CopyratorRule>::namespaced((*client).clone(), namespace)
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.rule_write("finalizers", rule, |answer| {
                    answer.metadata.finalizers = Some(finalizers);
                })?
            }
        };
        Ok(Sent::Answered(answer))
    }

    /// Publish `event` on `rule`; a failure is the caller's to log.
    pub(crate) async fn rule_event(
        &self,
        rule: &CopyratorRule,
        event: &Event,
    ) -> kube::Result<Sent<()>> {
        let Some(_permit) = self.slot().await else {
            return Ok(Sent::NotLeader);
        };
        self.metrics.write("create", "Event");
        match self.store(&Identity::Operator) {
            Store::Api(..) => {
                let reference = kube::Resource::object_ref(rule, &());
                self.recorder.publish(event, &reference).await?;
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.event(rule, &event.reason)?;
            }
        }
        Ok(Sent::Answered(()))
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
        let Some(_permit) = self.slot().await else {
            return Ok(Sent::NotLeader);
        };
        self.metrics.write("patch", workload_kind);
        match self.store(identity) {
            Store::Api(client, identity) => {
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                crate::cluster::impersonation::Requests::new(client, resource, namespace, identity)
                    .patch(name, &params, &Patch::Merge(patch))
                    .await?;
            }
            #[cfg(test)]
            Store::Fake(fake, identity) => {
                fake.sent_as(identity);
                fake.merge_patch(namespace, name, patch)?;
            }
        }
        Ok(Sent::Answered(()))
    }
}

fn rule_place(rule: &CopyratorRule) -> (&str, &str) {
    (
        rule.metadata.namespace.as_deref().unwrap_or_default(),
        rule.metadata.name.as_deref().unwrap_or_default(),
    )
}
