//! `spec.rollout.stages` in a pass: the plan is staged by
//! [`crate::core::rollout`], then what the stages need from the cluster is
//! read: the content rolled out before (from one copy that holds it, for
//! creates in stages not reached yet) and, with `restartConsumers`, whether
//! the workloads that use a stage's copies are available again. Both are
//! kept in the rule's memory of the site for the next pass, which comes
//! at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use tokio::time::Instant;

use crate::cache::index::Object;
use crate::controller::site::{RuleMemory, Site};
use crate::core::consumers::{opted_out, use_of};
use crate::core::plan::Plan;
use crate::core::resolve::ResolvedRule;
use crate::core::rollout::{AvailabilityCheck, Gated, Inputs, Stages, gate};
use crate::error::describe;
use crate::sync::{lock, read};

/// Stage `plan` for the rule's stages in `site`, and read what the next
/// pass needs; `Gated::recheck_at` says when that pass should come.
pub(crate) async fn stage(
    site: &Site,
    resolved: &ResolvedRule,
    stages: &Stages,
    plan: &mut Plan,
) -> Gated {
    let mut gated = {
        let namespaces = read(&site.cluster.views.namespaces);
        let copies = read(site.cluster.views.copies(resolved.kind));
        let mut memory = lock(&site.memory);
        let RuleMemory {
            rollouts,
            availability,
            ..
        } = memory.entry(resolved.key.clone()).or_default();
        let seen = |name: &str, stage: usize, payload: u64| {
            availability
                .get(&(name.to_owned(), stage))
                .filter(|(content, _)| *content == payload)
                .map(|(_, waiting)| waiting.clone())
        };
        let inputs = Inputs {
            stages,
            rule_uid: &resolved.uid,
            namespaces: &namespaces,
            copies: &copies,
            consumers: resolved.restart_consumers,
            availability: &seen,
            now: Instant::now(),
        };
        gate(plan, &inputs, rollouts)
    };
    // What was read is used by the next pass: at once when it is news.
    let mut news = !gated.reads.is_empty();
    for (namespace, name) in std::mem::take(&mut gated.reads) {
        read_earlier(site, resolved, &namespace, &name).await;
    }
    for check in std::mem::take(&mut gated.checks) {
        let waiting = not_available(site, resolved, &check).await;
        let seen = (check.payload, waiting);
        let before = lock(&site.memory)
            .entry(resolved.key.clone())
            .or_default()
            .availability
            .insert((check.name, check.stage), seen.clone());
        news |= before.as_ref() != Some(&seen);
    }
    if news {
        gated.recheck_at = Some(Instant::now());
    }
    gated
}

/// Read the copy `namespace/name` whole and keep its payload as the
/// content its source rolled out before.
async fn read_earlier(site: &Site, resolved: &ResolvedRule, namespace: &str, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        site.cluster.client.clone(),
        namespace,
        &resolved.kind.api_resource(),
    );
    let object = match api.get_opt(name).await {
        Ok(Some(object)) => Object::from_dynamic(resolved.kind, object),
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(rule = %resolved.key, namespace, name, error = describe(&e), "reading the content rolled out before");
            return;
        }
    };
    let mut memory = lock(&site.memory);
    let memory = memory.entry(resolved.key.clone()).or_default();
    if let Some(track) = memory.rollouts.by_name.get_mut(name) {
        track.earlier = Some((object.payload_hash, Arc::new(object.payload)));
    }
}

/// A workload as far as settling goes.
struct Rolling {
    kind: &'static str,
    name: String,
    /// Uses the copy, and is not opted out.
    uses: bool,
    /// Its status describes its newest generation.
    current: bool,
    want: i32,
    updated: i32,
    available: i32,
    /// Pods of every revision: an old one still running (and available)
    /// means the new revision is not there yet.
    total: i32,
}

impl Rolling {
    fn settled(&self) -> bool {
        self.current
            && self.updated >= self.want
            && self.available >= self.want
            && self.total <= self.want
    }
}

/// The workloads in `check.namespaces` that use the copy `check.name` and
/// are not available at their newest generation: `Kind namespace/name
/// (why)`; a list that fails is named as such.
async fn not_available(
    site: &Site,
    resolved: &ResolvedRule,
    check: &AvailabilityCheck,
) -> Vec<String> {
    let uses = |template: Option<&PodSpec>, annotations: &Option<BTreeMap<String, String>>| {
        template.is_some_and(|spec| use_of(spec, resolved.kind, &check.name).is_some())
            && !opted_out(annotations.as_ref())
    };
    let mut waiting = Vec::new();
    for namespace in &check.namespaces {
        let client = &site.cluster.client;
        let mut rolling = Vec::new();
        let listed = [
            list::<Deployment>(client, namespace).await.map(|items| {
                for d in items {
                    let spec = &d.spec;
                    let status = d.status.clone().unwrap_or_default();
                    rolling.push(Rolling {
                        kind: "Deployment",
                        total: status.replicas.unwrap_or(0),
                        uses: uses(spec.template.spec.as_ref(), &d.metadata.annotations),
                        current: status.observed_generation >= d.metadata.generation,
                        want: spec.replicas.unwrap_or(1),
                        updated: status.updated_replicas.unwrap_or(0),
                        available: status.available_replicas.unwrap_or(0),
                        name: d.metadata.name.unwrap_or_default(),
                    });
                }
            }),
            list::<StatefulSet>(client, namespace).await.map(|items| {
                for s in items {
                    let spec = &s.spec;
                    let status = s.status.clone().unwrap_or_default();
                    rolling.push(Rolling {
                        kind: "StatefulSet",
                        total: status.replicas,
                        uses: uses(spec.template.spec.as_ref(), &s.metadata.annotations),
                        current: status.observed_generation >= s.metadata.generation,
                        want: spec.replicas.unwrap_or(1),
                        updated: status.updated_replicas.unwrap_or(0),
                        available: status.available_replicas.unwrap_or(0),
                        name: s.metadata.name.unwrap_or_default(),
                    });
                }
            }),
            list::<DaemonSet>(client, namespace).await.map(|items| {
                for d in items {
                    let spec = &d.spec;
                    let status = d.status.clone().unwrap_or_default();
                    rolling.push(Rolling {
                        kind: "DaemonSet",
                        total: status.current_number_scheduled,
                        uses: uses(spec.template.spec.as_ref(), &d.metadata.annotations),
                        current: status.observed_generation >= d.metadata.generation,
                        want: status.desired_number_scheduled,
                        updated: status.updated_number_scheduled.unwrap_or(0),
                        available: status.number_available.unwrap_or(0),
                        name: d.metadata.name.unwrap_or_default(),
                    });
                }
            }),
        ];
        waiting.extend(listed.into_iter().filter_map(Result::err));
        waiting.extend(rolling.iter().filter(|w| w.uses && !w.settled()).map(|w| {
            format!(
                "{} {namespace}/{} ({} of {} available, {} updated, {} in all)",
                w.kind, w.name, w.available, w.want, w.updated, w.total
            )
        }));
    }
    waiting
}

/// The workloads of kind `K` in `namespace`, or why they were not listed.
async fn list<K>(client: &kube::Client, namespace: &str) -> Result<Vec<K>, String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| {
            let kind = K::kind(&K::DynamicType::default()).to_string();
            format!("{kind}s in {namespace} not listed: {}", describe(&e))
        })
}
