//! `spec.rollout.restartConsumers`: after a pass's writes, the
//! Deployments, StatefulSets and DaemonSets in the namespaces of the copies
//! whose data changed are listed, and those that use a changed copy get the
//! pod-template annotation [`crate::core::consumers`] computes, by a merge
//! patch, so that exactly they roll.
//!
//! Lists are made on demand, never watched: namespace by namespace for a
//! few namespaces, across the cluster a page at a time for more. A pass
//! over the whole rule also finishes rolls cut short (the operator stopped
//! between a copy's write and its consumers' patch): a workload that
//! carries a copy's annotation with a value that no longer matches is
//! patched; one that never carried it is not, so turning the field on
//! rolls nothing by itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{debug, info, warn};

use crate::api::kinds::Kind;
use crate::api::rule::CopyratorRule;
use crate::cluster::writer::Sent;
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::consumers::{
    CopyContent, Entry, KeyDigests, Trigger, Workload, key_digests, restarts_due,
};
use crate::core::identity::Identity;
use crate::core::plan::{Desired, DesiredCopies};
use crate::core::resolve::ResolvedRule;
use crate::error::describe;
use crate::sync::{lock, read};

/// A copy whose data a pass's write changed: its namespace, and what was written.
pub(crate) struct ChangedCopy {
    pub(crate) namespace: String,
    pub(crate) desired: Arc<Desired>,
    /// Created, not changed: its content is remembered, nothing rolls.
    pub(crate) created: bool,
    /// The payload hash the copy held before (an update or recreate): a
    /// staged rollout changes copies of one source from different contents.
    pub(crate) before: Option<u64>,
}

/// What the restarts of one pass came to.
#[derive(Default)]
pub(crate) struct Restarts {
    /// `Kind namespace/name` of the workloads patched.
    pub(crate) restarted: Vec<String>,
    /// The API server refused to list or patch workloads: its message.
    pub(crate) refused: Option<String>,
    /// Other failures: `what: message`.
    pub(crate) failed: Vec<String>,
    /// Workloads were looked for (a refusal is known to last or to have lifted).
    pub(crate) tried: bool,
    /// Some consumers wait for another try, this long from now.
    pub(crate) retry_in: Option<std::time::Duration>,
    /// Namespaces with a workload rolled too recently to roll again
    /// (`--min-restart-interval`), and the soonest it may be.
    pub(crate) too_soon: Vec<String>,
    pub(crate) too_soon_for: Option<std::time::Duration>,
}

/// Up to this many namespaces, workloads are listed namespace by
/// namespace; past it, across the cluster.
const PER_NAMESPACE_UP_TO: usize = 8;
/// Workloads per page of a list.
const PAGE: u32 = 500;
/// Workloads an Event names at most.
const NAMED_IN_EVENT: usize = 10;

fn workload_kinds() -> [(&'static str, ApiResource); 3] {
    [
        ("Deployment", ApiResource::erase::<Deployment>(&())),
        ("StatefulSet", ApiResource::erase::<StatefulSet>(&())),
        ("DaemonSet", ApiResource::erase::<DaemonSet>(&())),
    ]
}

type Copies = HashMap<String, Vec<Entry>>;

/// What a copy holds: its source and payload hash.
type Content = (String, u64);

/// What `desired` holds.
fn content(desired: &Desired) -> Content {
    (desired.source.clone(), desired.payload_hash)
}

/// The [`KeyDigests`] of what the copies [`copies_to_check`] looks at hold
/// (those `changed`, and on a pass over everything every one of
/// `desired`) that the rule's memory in `site` does not hold yet. They
/// grow with the copies' data: computed with no lock held, so that no
/// other rule's pass waits for them (the memory is looked at only to skip
/// what it holds; the rule's passes in a site come one at a time, so
/// nothing else adds to it meanwhile).
fn new_digests(
    site: &Site,
    resolved: &ResolvedRule,
    desired: &DesiredCopies,
    everything: bool,
    changed: &[ChangedCopy],
) -> HashMap<Content, Arc<KeyDigests>> {
    let mut wanted: HashMap<Content, &Arc<Desired>> = HashMap::new();
    for copy in changed {
        let held = &copy.desired;
        wanted.entry(content(held)).or_insert(held);
    }
    if everything {
        for d in desired.values() {
            wanted.entry(content(d)).or_insert(d);
        }
    }
    let known: HashSet<Content> = lock(&site.memory)
        .get(&resolved.key)
        .map(|memory| {
            wanted
                .keys()
                .filter(|content| memory.consumed.contains_key(*content))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    wanted
        .iter()
        .filter(|(content, _)| !known.contains(*content))
        .map(|(content, desired)| {
            let digests = key_digests(desired.kind, &desired.payload);
            (content.clone(), Arc::new(digests))
        })
        .collect()
}

/// The copies to look at, by namespace: those `changed`, and on a pass
/// over everything the rule's other copies in place (for a recheck),
/// against `desired`, the copies the pass's plan computed. Nothing here
/// computes a copy, and the digests of what they hold are computed before
/// the locks are taken.
fn copies_to_check(
    site: &Site,
    resolved: &ResolvedRule,
    desired: &DesiredCopies,
    everything: bool,
    changed: Vec<ChangedCopy>,
) -> Copies {
    let digests = new_digests(site, resolved, desired, everything, &changed);
    let mut by_namespace: Copies = HashMap::new();
    let mut seen = HashSet::new();
    // The memory before the views, as the lock order in state.rs says.
    let mut memory = lock(&site.memory);
    let copies = read(site.cluster.views.copies(resolved.copy_kind));
    let rule_memory = memory.entry(resolved.key.clone()).or_default();
    let mut pending: HashMap<(String, String), Entry> =
        std::mem::take(&mut rule_memory.pending_restarts)
            .into_iter()
            .map(|(ns, entry)| ((ns, entry.0.name.clone()), entry))
            .collect();
    let consumed = &mut rule_memory.consumed;
    let mut now_held: HashMap<String, Arc<Desired>> = HashMap::new();
    for copy in changed {
        now_held
            .entry(copy.desired.source.clone())
            .or_insert_with(|| copy.desired.clone());
        seen.insert((copy.namespace.clone(), copy.desired.name.clone()));
        if copy.created {
            continue;
        }
        // A change after one whose consumers wait: they still hold what
        // was there before that one.
        let before = match pending.remove(&(copy.namespace.clone(), copy.desired.name.clone())) {
            Some((_, _, before)) => before,
            None => copy
                .before
                .and_then(|hash| consumed.get(&(copy.desired.source.clone(), hash)))
                .cloned(),
        };
        by_namespace.entry(copy.namespace).or_default().push((
            copy.desired,
            Trigger::Changed,
            before,
        ));
    }
    // A content whose digests are not new is in the memory already.
    let remember = |consumed: &mut HashMap<Content, Arc<KeyDigests>>, desired: &Desired| {
        let content = content(desired);
        if let Some(digests) = digests.get(&content) {
            consumed.insert(content, digests.clone());
        }
    };
    for desired in now_held.values() {
        remember(consumed, desired);
    }
    for ((ns, name), entry) in pending {
        seen.insert((ns.clone(), name));
        by_namespace.entry(ns).or_default().push(entry);
    }
    if !everything || desired.too_costly {
        return by_namespace;
    }
    for copy in copies.owned_by(&resolved.uid) {
        let Some(wanted) = desired.get(&copy.name) else {
            continue;
        };
        let in_place = !copy.create_only
            && copy.payload_hash == wanted.payload_hash
            && copy.source_ref.as_deref() == Some(wanted.source.as_str());
        if in_place && !seen.contains(&(copy.namespace.to_string(), copy.name.to_string())) {
            by_namespace
                .entry(copy.namespace.to_string())
                .or_default()
                .push((wanted.clone(), Trigger::Recheck, None));
        }
    }
    // A pass over everything: no memory of sources gone, nor of contents
    // no copy holds (a source's copies hold one content, or two while a
    // staged rollout is under way).
    let held: HashSet<(&str, u64)> = copies
        .owned_by(&resolved.uid)
        .filter_map(|c| Some((c.source_ref.as_deref()?, c.payload_hash)))
        .collect();
    let sources: HashSet<&str> = desired.values().map(|d| d.source.as_str()).collect();
    consumed.retain(|(source, hash), _| {
        sources.contains(source.as_str()) && held.contains(&(source.as_str(), *hash))
    });
    for wanted in desired.values() {
        remember(consumed, wanted);
    }
    by_namespace
}

/// Roll the consumers of the copies a pass changed (and, on a pass over
/// everything, finish rolls cut short), in `site`'s cluster; `desired`
/// are the copies the pass's plan computed (every one, on a pass over
/// everything). Only the leader looks; a refusal stops the rest of the
/// pass's restarts.
pub(crate) async fn restart_consumers(
    shared: &Shared,
    site: &Site,
    resolved: &ResolvedRule,
    desired: &DesiredCopies,
    everything: bool,
    changed: Vec<ChangedCopy>,
) -> Restarts {
    let mut restarts = Restarts::default();
    let kind = resolved.copy_kind;
    if !resolved.restart_consumers
        || !(kind == Kind::ConfigMap || kind == Kind::Secret)
        || !site.cluster.writer.leads()
    {
        return restarts;
    }
    // Digests of the copies' data are computed here: off the threads that
    // serve watches, the Lease and the probes, as planning is.
    let copies = tokio::task::block_in_place(|| {
        copies_to_check(site, resolved, desired, everything, changed)
    });
    if copies.is_empty() {
        return restarts;
    }
    restarts.tried = true;
    let mut failed_in = Vec::new();
    list_and_roll(
        shared,
        site,
        &copies,
        &resolved.identity,
        &mut restarts,
        &mut failed_in,
    )
    .await;
    keep_pending(site, resolved, copies, &failed_in, &mut restarts);
    restarts
}

/// Changed copies whose consumers could not all be looked at or patched
/// (not for a refusal): tried again in the rule's next pass, after
/// [`retry_delay`].
fn keep_pending(
    site: &Site,
    resolved: &ResolvedRule,
    copies: Copies,
    failed_in: &[Option<String>],
    restarts: &mut Restarts,
) {
    let everywhere = failed_in.iter().any(Option::is_none);
    let pending: Vec<(String, Entry)> = if restarts.refused.is_some() {
        Vec::new()
    } else {
        copies
            .into_iter()
            .filter(|(ns, _)| {
                everywhere
                    || failed_in.iter().any(|f| f.as_ref() == Some(ns))
                    || restarts.too_soon.contains(ns)
            })
            .flat_map(|(ns, entries)| {
                // A roll put off for the interval is kept whatever its
                // trigger: nothing else would bring it back soon.
                let put_off = restarts.too_soon.contains(&ns);
                entries
                    .into_iter()
                    .filter(move |(_, trigger, _)| put_off || *trigger == Trigger::Changed)
                    .map(move |entry| (ns.clone(), entry))
            })
            .collect()
    };
    let mut memory = lock(&site.memory);
    let memory = memory.entry(resolved.key.clone()).or_default();
    if pending.is_empty() || failed_in.is_empty() {
        memory.restart_attempts = 0;
    } else {
        memory.restart_attempts = memory.restart_attempts.saturating_add(1);
        restarts.retry_in = Some(retry_delay(memory.restart_attempts));
    }
    if let Some(wait) = restarts.too_soon_for.filter(|_| !pending.is_empty()) {
        restarts.retry_in = Some(restarts.retry_in.map_or(wait, |r| r.min(wait)));
    }
    memory.pending_restarts = pending;
}

/// How long `workload` must still wait before it may roll again, if it
/// rolled less than `interval` ago.
fn too_soon(
    site: &Site,
    workload: &str,
    interval: std::time::Duration,
) -> Option<std::time::Duration> {
    let at = *lock(&site.rolled_at).get(workload)?;
    interval.checked_sub(at.elapsed()).filter(|w| !w.is_zero())
}

/// Remember that `workload` rolled now (and forget those whose interval
/// is over, so that the memory stays as large as the rolls of a minute).
fn rolled(site: &Site, workload: &str, interval: std::time::Duration) {
    let mut rolled_at = lock(&site.rolled_at);
    rolled_at.retain(|_, at| at.elapsed() < interval);
    if !interval.is_zero() {
        rolled_at.insert(workload.to_owned(), tokio::time::Instant::now());
    }
}

/// 10 s after the first failure, doubling, at most 5 minutes.
fn retry_delay(attempts: u32) -> std::time::Duration {
    let seconds = 10u64.saturating_mul(1 << attempts.saturating_sub(1).min(5));
    std::time::Duration::from_secs(seconds.min(300))
}

/// List the workloads of the namespaces of `copies` and roll those due;
/// where a list or a patch failed goes into `failed_in` (`None`: the
/// list across the cluster).
async fn list_and_roll(
    shared: &Shared,
    site: &Site,
    copies: &Copies,
    identity: &Identity,
    restarts: &mut Restarts,
    failed_in: &mut Vec<Option<String>>,
) {
    let mut namespaces: Vec<&String> = copies.keys().collect();
    namespaces.sort();
    for (workload_kind, resource) in workload_kinds() {
        let lists: Vec<Option<&str>> = if namespaces.len() <= PER_NAMESPACE_UP_TO {
            namespaces.iter().map(|n| Some(n.as_str())).collect()
        } else {
            vec![None]
        };
        for namespace in lists {
            let api = site.cluster.reader.of(&resource, namespace);
            let mut token: Option<String> = None;
            loop {
                let mut params = ListParams::default().limit(PAGE);
                if let Some(token) = token.take() {
                    params = params.continue_token(&token);
                }
                let page = match api.list(&params).await {
                    Ok(page) => page,
                    Err(e) => {
                        let message = describe(&e);
                        if matches!(&e, kube::Error::Api(s) if s.code == 403) {
                            restarts.refused = Some(message);
                            return;
                        }
                        restarts
                            .failed
                            .push(format!("listing {workload_kind}s: {message}"));
                        failed_in.push(namespace.map(str::to_owned));
                        break;
                    }
                };
                for object in page.items {
                    let ns = object.metadata.namespace.clone().unwrap_or_default();
                    let Some(ns_copies) = copies.get(&ns) else {
                        continue;
                    };
                    let failures = restarts.failed.len();
                    let rolled = roll(
                        shared,
                        site,
                        (workload_kind, &resource),
                        &object,
                        ns_copies,
                        identity,
                        restarts,
                    )
                    .await;
                    if rolled.is_err() {
                        return;
                    }
                    if restarts.failed.len() > failures {
                        failed_in.push(Some(ns));
                    }
                }
                match page.metadata.continue_ {
                    Some(next) if !next.is_empty() => token = Some(next),
                    _ => break,
                }
            }
        }
    }
}

/// The restart annotations `object` (a workload of `workload_kind`)
/// should get for the `copies` of its namespace: empty when none is due.
fn due_on(
    workload_kind: &str,
    object: &DynamicObject,
    copies: &[Entry],
) -> BTreeMap<String, String> {
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    let Some(template) = object
        .data
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| serde_json::from_value::<PodTemplateSpec>(t.clone()).ok())
    else {
        return BTreeMap::new();
    };
    let Some(spec) = &template.spec else {
        return BTreeMap::new();
    };
    let contents: Vec<CopyContent<'_>> = copies
        .iter()
        .map(|(desired, trigger, before)| CopyContent {
            kind: desired.kind,
            namespace,
            name: &desired.name,
            payload: &desired.payload,
            trigger: *trigger,
            before: before.as_deref(),
        })
        .collect();
    restarts_due(
        &Workload {
            kind: workload_kind,
            namespace,
            name: object.metadata.name.as_deref().unwrap_or_default(),
            annotations: object.metadata.annotations.as_ref(),
            template_annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.as_ref()),
            spec,
        },
        &contents,
    )
}

/// Patch one workload if any copy it uses wants a new annotation value;
/// `Err` when the patch was refused (the caller stops).
async fn roll(
    shared: &Shared,
    site: &Site,
    (workload_kind, resource): (&'static str, &ApiResource),
    object: &DynamicObject,
    copies: &[Entry],
    identity: &Identity,
    restarts: &mut Restarts,
) -> Result<(), ()> {
    let due = due_on(workload_kind, object, copies);
    if due.is_empty() {
        return Ok(());
    }
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let what = format!("{workload_kind} {namespace}/{name}");
    if let Some(wait) = too_soon(site, &what, shared.options.min_restart_interval) {
        // Rolled a moment ago: the last content rolls when the time is up.
        restarts.too_soon.push(namespace.to_owned());
        restarts.too_soon_for = Some(restarts.too_soon_for.map_or(wait, |w| w.min(wait)));
        return Ok(());
    }
    let patch = json!({"spec": {"template": {"metadata": {"annotations": due}}}});
    match site
        .cluster
        .writer
        .patch_workload(resource, workload_kind, (namespace, name), &patch, identity)
        .await
    {
        Ok(Sent::NotLeader) => Err(()),
        Ok(Sent::Answered(())) => {
            debug!(workload = what.as_str(), "rolled a consumer");
            rolled(site, &what, shared.options.min_restart_interval);
            shared
                .metrics
                .consumer_restarts
                .get_or_create(&crate::ops::metrics::WorkloadLabels {
                    kind: workload_kind,
                })
                .inc();
            restarts.restarted.push(what);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            let message = describe(&e);
            if matches!(&e, kube::Error::Api(s) if s.code == 403) {
                restarts.refused = Some(format!("patching {what}: {message}"));
                return Err(());
            }
            restarts.failed.push(format!("{what}: {message}"));
            Ok(())
        }
    }
}

/// The Events and log lines for a pass's restarts: the workloads rolled
/// (a capped list), a refusal once until it lifts, the first failure.
pub(crate) async fn announce(
    shared: &Arc<Shared>,
    site: &Site,
    rule: &CopyratorRule,
    restarts: &Restarts,
) {
    let key = rule.key();
    let place = match site.name.member() {
        Some(member) => format!(" in cluster {member}"),
        None => String::new(),
    };
    if !restarts.restarted.is_empty() {
        let count = restarts.restarted.len();
        let mut named: Vec<&str> = restarts
            .restarted
            .iter()
            .take(NAMED_IN_EVENT)
            .map(String::as_str)
            .collect();
        named.sort_unstable();
        let more = count.saturating_sub(NAMED_IN_EVENT);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        info!(rule = %key, restarted = count, first = named.first().copied().unwrap_or_default(), "restarted consumers{place}");
        let note = format!(
            "restarted {count} workloads that use a changed copy{place}: {}{tail}",
            named.join(", ")
        );
        shared
            .event(
                rule,
                EventType::Normal,
                "ConsumersRestarted",
                "Restart",
                note,
            )
            .await;
    }
    if !restarts.tried {
        return;
    }
    let newly_refused = {
        let mut memory = lock(&site.memory);
        let memory = memory.entry(key.clone()).or_default();
        let was = memory.restart_refused;
        memory.restart_refused = restarts.refused.is_some();
        restarts.refused.is_some() && !was
    };
    if let Some(message) = &restarts.refused {
        if newly_refused {
            warn!(rule = %key, error = message.as_str(), "restarting consumers refused{place}");
            let note = format!(
                "consumers of changed copies are not restarted{place}: {message}; grant get, list and patch on deployments, statefulsets and daemonsets (chart value rollout.restartConsumers: true)"
            );
            shared
                .event(rule, EventType::Warning, "RestartRefused", "Restart", note)
                .await;
        } else {
            debug!(rule = %key, error = message.as_str(), "restarting consumers still refused{place}");
        }
    }
    if let Some(first) = restarts.failed.first() {
        warn!(rule = %key, failed = restarts.failed.len(), first = first.as_str(), "restarting consumers failed{place}");
        let note = format!(
            "{} consumers could not be restarted{place}; first: {first}",
            restarts.failed.len()
        );
        shared
            .event(rule, EventType::Warning, "RestartFailed", "Restart", note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::{home, resolved, rule, source};
    use crate::core::consumers::Trigger;
    use crate::core::plan::desired_copy;
    use serde_json::{Value, json};
    use std::time::Duration;

    fn deployment(volume_config_map: &str, annotations: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "t1", "annotations": annotations},
            "spec": {"template": {"metadata": {}, "spec": {
                "containers": [{"name": "app", "image": "app"}],
                "volumes": [{"name": "cfg", "configMap": {"name": volume_config_map}}],
            }}},
        }))
        .expect("a Deployment")
    }

    /// The copy of the source `ops/ca` that changed in t1.
    fn changed(trigger: Trigger) -> Vec<Entry> {
        let desired = desired_copy(&resolved(&rule("rule-1", json!({}))), &source("ca"));
        vec![(Arc::new(desired), trigger, None)]
    }

    #[test]
    fn a_workload_mounting_a_changed_copy_is_due_and_one_that_does_not_is_not() {
        let due = due_on(
            "Deployment",
            &deployment("ca", json!({})),
            &changed(Trigger::Changed),
        );
        assert_eq!(due.len(), 1, "{due:?}");
        let (key, _) = due.iter().next().expect("one annotation");
        assert!(key.starts_with(crate::ANNOTATION_RESTART_PREFIX), "{key}");
        assert!(
            due_on(
                "Deployment",
                &deployment("other", json!({})),
                &changed(Trigger::Changed)
            )
            .is_empty()
        );
    }

    #[test]
    fn a_workload_that_opted_out_or_was_never_rolled_on_a_recheck_is_not_due() {
        let opted_out = deployment("ca", json!({crate::ANNOTATION_RESTART: "false"}));
        assert!(due_on("Deployment", &opted_out, &changed(Trigger::Changed)).is_empty());
        // A recheck rolls only a workload that carries another value.
        assert!(
            due_on(
                "Deployment",
                &deployment("ca", json!({})),
                &changed(Trigger::Recheck)
            )
            .is_empty()
        );
    }

    #[test]
    fn consumers_are_tried_again_after_10_s_doubling_to_5_minutes() {
        let delays: Vec<u64> = (1..=7).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_workload_rolled_waits_out_the_minimum_interval() {
        let (shared, _) = home();
        let site = &shared.home;
        let interval = Duration::from_secs(30);
        assert_eq!(too_soon(site, "Deployment t1/web", interval), None);
        rolled(site, "Deployment t1/web", interval);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            too_soon(site, "Deployment t1/web", interval),
            Some(Duration::from_secs(20))
        );
        tokio::time::advance(Duration::from_secs(21)).await;
        assert_eq!(too_soon(site, "Deployment t1/web", interval), None);
        // Without an interval nothing is remembered.
        rolled(site, "Deployment t1/api", Duration::ZERO);
        assert!(!lock(&site.rolled_at).contains_key("Deployment t1/api"));
    }
}
