//! `spec.rollout.stages` in a pass: the plan is staged by
//! [`crate::core::rollout`], then what the stages need from the cluster is
//! read: the content rolled out before (from one copy that holds it, for
//! creates in stages not reached yet) and, with `restartConsumers`, whether
//! the workloads that use a stage's copies are available again. Both are
//! kept in the rule's memory of the site for the next pass, which comes
//! at once. What the rule rolled out is read from its status on the first
//! pass after a start, and goes back into it after each pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::ListParams;
use serde_json::Value;

use crate::api::kinds::Kind;
use crate::api::required;
use crate::cache::index::Object;
use crate::cache::mark::{Consumer, RestartForm, restart_form, rolled_out_digest};
use crate::cluster::reader::Reader;
use crate::controller::site::{RuleMemory, Site};
use crate::core::consumers::{opted_out, restart_key, restart_value, use_of};
use crate::core::fleet_rollout::{
    APPROVE_ANNOTATION, SiteView, Step, Track, Tracks, advance, approvals, from_status, progress,
};
use crate::core::plan::{DesiredCopies, Plan};
use crate::core::report::ClusterReport;
use crate::core::resolve::{ClusterOf, ResolvedRule};
use crate::core::rollout::{
    AvailabilityCheck, EarlierRead, Gated, Inputs, Stages, gate, rolled_out_from_status,
};
use crate::error::describe;
use crate::sync::{lock, read};

/// What a site's pass over a staged rule needs beyond its plan: the
/// cluster it is, what the rule's status keeps of what was rolled out
/// there (what the rule starts from when its memory holds nothing yet;
/// `None`: the status keeps no record at all, and the copies' marks are
/// taken instead), and where the rule's rollouts stand as recorded.
pub(crate) struct StageInputs<'a> {
    pub(crate) cluster: ClusterOf<'a>,
    pub(crate) kept: Option<&'a BTreeMap<String, String>>,
    pub(crate) recorded: &'a Tracks,
}

/// Stage `plan` for the rule's stages in `site`, and read what the next
/// pass needs; `Gated::recheck_in` says when that pass should come.
pub(crate) async fn stage(
    site: &Site,
    resolved: &ResolvedRule,
    stages: &Stages,
    plan: &mut Plan,
    desired: &DesiredCopies,
    at: &StageInputs<'_>,
) -> Gated {
    let mut gated = {
        // The memory before the views, as the lock order in state.rs says.
        let mut memory = lock(&site.memory);
        let namespaces = read(&site.cluster.views.namespaces);
        let copies = read(site.cluster.views.copies(resolved.copy_kind));
        let RuleMemory {
            rollouts,
            availability,
            ..
        } = memory.entry(resolved.key.clone()).or_default();
        if rollouts.rolled_out.is_none() {
            rollouts.rolled_out = Some(at.kept.map(rolled_out_from_status).unwrap_or_default());
            rollouts.rebuild = at.kept.is_none();
        }
        let digest = |name: &str, payload: u64| rolled_out_digest(&resolved.uid, name, payload);
        let seen = |name: &str, stage: usize, payload: u64| {
            availability
                .get(&(name.to_owned(), stage))
                .filter(|(content, _)| *content == payload)
                .map(|(_, waiting)| waiting.clone())
        };
        let open = |name: &str, content: &str| {
            at.recorded
                .get(name)
                .filter(|t| t.content == content)
                .map(crate::core::fleet_rollout::Track::open)
        };
        let inputs = Inputs {
            stages,
            rule_uid: &resolved.uid,
            cluster: at.cluster,
            namespaces: &namespaces,
            copies: &copies,
            consumers: resolved.restart_consumers,
            availability: &seen,
            desired,
            digest: &digest,
            open: &open,
        };
        let gated = gate(plan, &inputs, rollouts);
        // What was seen of a content no rollout is at any more is moot.
        availability.retain(|(name, _), (content, _)| {
            desired
                .get(name)
                .is_some_and(|d| d.payload_hash == *content && gated.facts.contains_key(name))
        });
        gated
    };
    // What was read is used by the next pass: at once when it is news.
    let mut news = !gated.reads.is_empty();
    let mut earlier = Vec::new();
    for read in std::mem::take(&mut gated.reads) {
        earlier.extend(read_earlier(site, resolved, &read).await);
    }
    let mut seen = Vec::new();
    for check in std::mem::take(&mut gated.checks) {
        let waiting = not_available(site, resolved, &check).await;
        seen.push((check, waiting));
    }
    // What the reads found goes into the rule's memory in one hold.
    let mut memory = lock(&site.memory);
    let memory = memory.entry(resolved.key.clone()).or_default();
    for (name, content) in earlier {
        memory.rollouts.earlier.insert(name, content);
    }
    for (check, mut waiting) in seen {
        if memory.restart_refused {
            // The consumers were never rolled: the stage has not settled.
            waiting.push("restarting the consumers is refused".to_owned());
        }
        waiting.extend(restarts_pending(&memory.pending_restarts, &check));
        news |= remember_availability(&mut memory.availability, check, waiting);
    }
    if news {
        gated.recheck_in = Some(std::time::Duration::ZERO);
    }
    gated
}

/// What a step of a staged rule's rollouts, across its clusters, came to.
pub(crate) struct FleetStep {
    /// Where each rollout stands now, for the status.
    pub(crate) progress: Vec<crate::core::rollout::Progress>,
    /// When to look again.
    pub(crate) recheck_in: Option<std::time::Duration>,
    /// A rollout moved on from what the status recorded: its status goes
    /// out with the rule's `resourceVersion` as a precondition, before any
    /// cluster acts on it.
    pub(crate) changed: bool,
    /// A stage opened to a content: every cluster looks again once that is
    /// recorded.
    pub(crate) widened: bool,
    /// Writes the stages hold back, in every cluster.
    pub(crate) held: u32,
}

/// A cluster the rule targets, as its rollouts see it.
struct Targeted {
    name: String,
    labels: BTreeMap<String, String>,
    home: bool,
    reachable: bool,
    report: Option<ClusterReport>,
}

/// Every cluster `resolved` targets, with its last report (home's: `home`).
fn targeted(
    shared: &crate::controller::state::Shared,
    resolved: &ResolvedRule,
    home: &ClusterReport,
) -> Vec<Targeted> {
    let mut clusters = Vec::new();
    if resolved.clusters.local {
        clusters.push(Targeted {
            name: shared.options.cluster_name.clone(),
            labels: BTreeMap::new(),
            home: true,
            reachable: true,
            report: Some(home.clone()),
        });
    }
    for (status, report) in crate::controller::members::statuses(&shared.members, resolved) {
        let member = shared.members.get(&status.name);
        clusters.push(Targeted {
            labels: member
                .as_ref()
                .map(|m| read(&m.labels).clone())
                .unwrap_or_default(),
            reachable: member.is_some_and(|m| m.is_reachable()),
            name: status.name,
            home: false,
            report,
        });
    }
    clusters
}

/// Move the rule's rollouts on from where its status recorded them, with
/// what each cluster's last pass found (home's: `home`, just now).
pub(crate) fn advance_fleet(
    shared: &crate::controller::state::Shared,
    rule: &crate::api::rule::CopyratorRule,
    resolved: &ResolvedRule,
    stages: &Stages,
    home: &ClusterReport,
) -> FleetStep {
    let recorded = from_status(
        rule.status.as_ref().map_or(&[][..], |s| &s.rollouts[..]),
        stages,
    );
    let clusters = targeted(shared, resolved, home);
    let sites: Vec<SiteView<'_>> = clusters
        .iter()
        .map(|c| SiteView {
            name: &c.name,
            cluster: if c.home {
                ClusterOf::Home
            } else {
                ClusterOf::Member(&c.name, &c.labels)
            },
            reachable: c.reachable,
            facts: c.report.as_ref().and_then(|r| r.rollout.as_ref()),
            planned: c.report.as_ref().and_then(|r| r.rolled_out.as_ref()),
        })
        .collect();
    let approvals = approvals(
        rule.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPROVE_ANNOTATION))
            .map(String::as_str),
    );
    let approved =
        |stage: &str, content: &str| approvals.contains(&(stage.to_owned(), content.to_owned()));
    let current = |name: &str| {
        let content = home
            .rolled_out
            .as_ref()?
            .get(name)?
            .split_whitespace()
            .last()?;
        let source = sites
            .iter()
            .find_map(|s| s.facts.and_then(|f| f.get(name)).map(|f| f.source.clone()))
            .or_else(|| recorded.get(name).map(|t| t.source.clone()))?;
        Some((source, content.to_owned()))
    };
    let advanced = advance(
        &recorded,
        &Step {
            stages,
            sites: &sites,
            now: chrono::Utc::now(),
            current: &current,
            approved: &approved,
            consumers: resolved.restart_consumers,
        },
    );
    FleetStep {
        progress: progress(&advanced.tracks, stages),
        recheck_in: advanced.recheck_in,
        changed: moved_on(&recorded, &advanced.tracks),
        widened: widened(&recorded, &advanced.tracks),
        held: clusters
            .iter()
            .filter_map(|c| c.report.as_ref())
            .map(|r| r.held)
            .sum(),
    }
}

/// Whether a stage opened to a content since `recorded`.
fn widened(recorded: &Tracks, now: &Tracks) -> bool {
    now.iter().any(|(name, track)| {
        let before = recorded
            .get(name)
            .filter(|t| t.content == track.content)
            .and_then(|t| t.open().through);
        track.open().through > before
    })
}

/// Whether any rollout stands elsewhere than `recorded` says.
fn moved_on(recorded: &Tracks, now: &Tracks) -> bool {
    // Halting is a transition too (the phase); the halt's reasons are not.
    let moved = |a: &Track, b: &Track| {
        let at = |t: &Track| {
            (
                t.content.clone(),
                t.stage,
                t.opened,
                t.opened_at,
                t.settled_at,
                t.phase.word(),
            )
        };
        at(a) != at(b)
    };
    now.len() != recorded.len()
        || now
            .iter()
            .any(|(name, t)| recorded.get(name).is_none_or(|r| moved(t, r)))
}

/// The copies of `check` whose consumers' roll is put off
/// (`--min-restart-interval`) or waits to be tried again: they run what
/// they ran before, healthy or not.
fn restarts_pending(
    pending: &[(String, crate::core::consumers::Entry)],
    check: &AvailabilityCheck,
) -> Vec<String> {
    pending
        .iter()
        .filter(|(namespace, (desired, _, _))| {
            desired.name == check.name && check.namespaces.contains(namespace)
        })
        .map(|(namespace, _)| {
            format!(
                "the consumers of {namespace}/{} not restarted yet",
                check.name
            )
        })
        .collect()
}

/// What a check found, by copy name and stage: the content it looked at
/// and the workloads still waiting. News is a stage that became settled
/// or unsettled (or a content not seen before), not a count.
fn remember_availability(
    availability: &mut HashMap<(String, usize), (u64, Vec<String>)>,
    check: AvailabilityCheck,
    waiting: Vec<String>,
) -> bool {
    let settled = waiting.is_empty();
    let before = availability.insert((check.name, check.stage), (check.payload, waiting));
    before.is_none_or(|(content, was)| content != check.payload || was.is_empty() != settled)
}

/// Read the copy of `read` whole: its name and payload, as the content its
/// source rolled out before, if it is still the payload Copyrator wrote
/// there (an edit since then makes it no content of the source's).
async fn read_earlier(
    site: &Site,
    resolved: &ResolvedRule,
    read: &EarlierRead,
) -> Option<(String, (u64, Arc<BTreeMap<String, Value>>))> {
    let (namespace, name) = (read.namespace.as_str(), read.name.as_str());
    let api = site
        .cluster
        .reader
        .of(&resolved.copy_kind.api_resource(), Some(namespace));
    let object = match api.get_opt(name).await {
        Ok(Some(object)) => Object::from_dynamic(resolved.copy_kind, object),
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!(rule = %resolved.key, namespace, name, error = describe(&e), "reading the content rolled out before");
            return None;
        }
    };
    // Only the rule's own copy, as its mark proves it, holding what
    // Copyrator wrote there for this rule.
    let the_rules = object.rule_uid() == Some(resolved.uid.as_str());
    if !the_rules || !object.intact || object.payload_hash != read.payload_hash {
        tracing::debug!(rule = %resolved.key, namespace, name, "the copy holding the content rolled out before was edited or is not the rule's: not taken");
        return None;
    }
    Some((
        name.to_owned(),
        (object.payload_hash, Arc::new(object.payload)),
    ))
}

/// A workload as far as settling goes.
struct Rolling {
    kind: &'static str,
    name: String,
    /// Uses the copy, and is not opted out.
    uses: bool,
    /// Carries the restart annotation of the new content, or none at all
    /// (never rolled: what it uses may not have changed).
    restarted: bool,
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
    /// `Kind namespace/name (why it has not settled)`.
    fn describe(&self, namespace: &str) -> String {
        let why = if self.restarted {
            format!(
                "{} of {} available, {} updated, {} in all",
                self.available, self.want, self.updated, self.total
            )
        } else {
            "not rolled to the new content yet".to_owned()
        };
        format!("{} {namespace}/{} ({why})", self.kind, self.name)
    }

    fn settled(&self) -> bool {
        self.restarted
            && self.current
            && self.updated >= self.want
            && self.available >= self.want
            && self.total <= self.want
    }
}

/// Judges the workloads of one check: whether each uses the copy and
/// carries the new content's restart annotation.
struct Judge<'a> {
    kind: Kind,
    check: &'a AvailabilityCheck,
    key: String,
}

impl Judge<'_> {
    /// A workload of `kind` named `name` in `namespace`, with its pod
    /// template and own annotations, and its rollout's figures `(current,
    /// want, updated, available, total)`.
    fn rolling(
        &self,
        (kind, namespace, name): (&'static str, &str, Option<String>),
        template: &PodTemplateSpec,
        annotations: &Option<BTreeMap<String, String>>,
        (current, want, updated, available, total): (bool, i32, i32, i32, i32),
    ) -> Rolling {
        let name = name.unwrap_or_default();
        let kind_of_copy = self.kind;
        let used = template
            .spec
            .as_ref()
            .and_then(|spec| use_of(spec, kind_of_copy, &self.check.name));
        let carried = template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(&self.key));
        let restarted = match (&used, carried) {
            // An earlier version's value is never compared (see
            // `RestartForm::Earlier`): as if it carried none, what it uses
            // may not have changed.
            (Some(used), Some(value)) if restart_form(value) != RestartForm::Earlier => {
                let consumer = Consumer {
                    copy_kind: kind_of_copy,
                    copy_namespace: namespace,
                    copy_name: &self.check.name,
                    workload_kind: kind,
                    workload_namespace: namespace,
                    workload_name: &name,
                };
                restart_value(&consumer, &self.check.desired.payload, used)
                    .is_some_and(|current| *value == current)
            }
            _ => true,
        };
        Rolling {
            kind,
            name,
            uses: used.is_some() && !opted_out(annotations.as_ref()),
            restarted,
            current,
            want,
            updated,
            available,
            total,
        }
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
    let judge = Judge {
        kind: resolved.copy_kind,
        check,
        key: restart_key(resolved.copy_kind, &check.name),
    };
    let mut waiting = Vec::new();
    for namespace in &check.namespaces {
        let (rolling, not_listed) = workloads_in(&site.cluster.reader, namespace, &judge).await;
        waiting.extend(not_listed);
        waiting.extend(
            rolling
                .iter()
                .filter(|w| w.uses && !w.settled())
                .map(|w| w.describe(namespace)),
        );
    }
    waiting
}

/// The Deployments, StatefulSets and DaemonSets of `namespace` as
/// `judge` sees them, and the kinds that could not be listed (why).
async fn workloads_in(
    reader: &Reader,
    namespace: &str,
    judge: &Judge<'_>,
) -> (Vec<Rolling>, Vec<String>) {
    let mut rolling = Vec::new();
    let listed = [
        list::<Deployment>(reader, namespace).await.map(|items| {
            rolling.extend(items.into_iter().map(|d| {
                let spec: DeploymentSpec = required(d.spec);
                let status = d.status.unwrap_or_default();
                let figures = (
                    status.observed_generation >= d.metadata.generation,
                    spec.replicas.unwrap_or(1),
                    status.updated_replicas.unwrap_or(0),
                    status.available_replicas.unwrap_or(0),
                    status.replicas.unwrap_or(0),
                );
                let m = d.metadata;
                judge.rolling(
                    ("Deployment", namespace, m.name),
                    &spec.template,
                    &m.annotations,
                    figures,
                )
            }));
        }),
        list::<StatefulSet>(reader, namespace).await.map(|items| {
            rolling.extend(items.into_iter().map(|s| {
                let spec: StatefulSetSpec = required(s.spec);
                let status = s.status.unwrap_or_default();
                let figures = (
                    status.observed_generation >= s.metadata.generation,
                    spec.replicas.unwrap_or(1),
                    status.updated_replicas.unwrap_or(0),
                    status.available_replicas.unwrap_or(0),
                    status.replicas,
                );
                let m = s.metadata;
                judge.rolling(
                    ("StatefulSet", namespace, m.name),
                    &spec.template,
                    &m.annotations,
                    figures,
                )
            }));
        }),
        list::<DaemonSet>(reader, namespace).await.map(|items| {
            rolling.extend(items.into_iter().map(|d| {
                let spec: DaemonSetSpec = required(d.spec);
                let status = d.status.unwrap_or_default();
                let figures = (
                    status.observed_generation >= d.metadata.generation,
                    status.desired_number_scheduled,
                    status.updated_number_scheduled.unwrap_or(0),
                    status.number_available.unwrap_or(0),
                    status.current_number_scheduled,
                );
                let m = d.metadata;
                judge.rolling(
                    ("DaemonSet", namespace, m.name),
                    &spec.template,
                    &m.annotations,
                    figures,
                )
            }));
        }),
    ];
    let not_listed = listed.into_iter().filter_map(Result::err).collect();
    (rolling, not_listed)
}

/// The workloads of kind `K` in `namespace`, or why they were not listed.
async fn list<K>(reader: &Reader, namespace: &str) -> Result<Vec<K>, String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    reader
        .within::<K>(namespace)
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| {
            let kind = K::kind(&()).to_string();
            format!("{kind}s in {namespace} not listed: {}", describe(&e))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::{resolved, rule, source};
    use crate::core::plan::desired_copy;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    fn check(waiting_in: &[&str]) -> AvailabilityCheck {
        let resolved = resolved(&rule("uid-1", json!({})));
        let desired = desired_copy(&resolved, &source("settings"));
        AvailabilityCheck {
            name: "settings".to_owned(),
            stage: 0,
            payload: desired.payload_hash,
            namespaces: waiting_in.iter().map(|n| (*n).to_owned()).collect(),
            desired: Arc::new(desired),
        }
    }

    /// A pod template that mounts the ConfigMap `name`, with `annotations`.
    fn template(name: &str, annotations: &[(&str, &str)]) -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"annotations": annotations.iter().copied().collect::<BTreeMap<_, _>>()},
            "spec": {
                "containers": [{"name": "app", "image": "app"}],
                "volumes": [{"name": "settings", "configMap": {"name": name}}]
            }
        }))
        .expect("a pod template")
    }

    fn judge(check: &AvailabilityCheck) -> Judge<'_> {
        Judge {
            kind: Kind::ConfigMap,
            check,
            key: restart_key(Kind::ConfigMap, &check.name),
        }
    }

    /// The restart value of the check's new content for `template`, as
    /// the Deployment `namespace/web`.
    fn new_value(check: &AvailabilityCheck, template: &PodTemplateSpec, namespace: &str) -> String {
        let spec: &PodSpec = template.spec.as_ref().expect("a pod spec");
        let used = use_of(spec, Kind::ConfigMap, &check.name).expect("uses the copy");
        let consumer = Consumer {
            copy_kind: Kind::ConfigMap,
            copy_namespace: namespace,
            copy_name: &check.name,
            workload_kind: "Deployment",
            workload_namespace: namespace,
            workload_name: "web",
        };
        restart_value(&consumer, &check.desired.payload, &used).expect("the test key")
    }

    #[test]
    fn a_roll_put_off_keeps_its_stage_from_settling() {
        let check = check(&["team-a"]);
        let pending = vec![(
            "team-a".to_owned(),
            (
                check.desired.clone(),
                crate::core::consumers::Trigger::Changed,
                None,
            ),
        )];
        assert_eq!(
            restarts_pending(&pending, &check),
            ["the consumers of team-a/settings not restarted yet"]
        );
        let elsewhere = vec![("team-b".to_owned(), pending[0].1.clone())];
        assert!(restarts_pending(&elsewhere, &check).is_empty());
    }

    #[test]
    fn a_workload_is_rolled_only_when_it_carries_the_new_contents_restart_value() {
        let check = check(&["team-a"]);
        let judge = judge(&check);
        let plain = template("settings", &[]);
        let value = new_value(&check, &plain, "team-a");
        let figures = (true, 2, 2, 2, 2);
        let rolled = template("settings", &[(&judge.key, &value)]);
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &rolled,
            &None,
            figures,
        );
        assert!(
            w.uses && w.restarted && w.settled(),
            "{}",
            w.describe("team-a")
        );
        let older = template("settings", &[(&judge.key, "an-older-content")]);
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &older,
            &None,
            figures,
        );
        assert!(w.uses && !w.restarted && !w.settled());
        assert_eq!(
            w.describe("team-a"),
            "Deployment team-a/web (not rolled to the new content yet)"
        );
        // Never rolled at all, or by an earlier version (whose value is
        // never compared): what it uses may not have changed.
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &plain,
            &None,
            figures,
        );
        assert!(w.restarted && w.settled());
        let earlier = template("settings", &[(&judge.key, &"0".repeat(32))]);
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &earlier,
            &None,
            figures,
        );
        assert!(w.restarted && w.settled());
        // The new content's value at another workload is not its own.
        let elsewhere = new_value(&check, &plain, "team-b");
        let planted = template("settings", &[(&judge.key, &elsewhere)]);
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &planted,
            &None,
            figures,
        );
        assert!(!w.restarted && !w.settled());
    }

    #[test]
    fn a_workload_that_does_not_use_the_copy_or_opted_out_is_not_waited_for() {
        let check = check(&["team-a"]);
        let judge = judge(&check);
        let figures = (true, 2, 0, 0, 2);
        let other = template("other", &[]);
        let w = judge.rolling(
            ("StatefulSet", "team-a", Some("db".into())),
            &other,
            &None,
            figures,
        );
        assert!(!w.uses);
        let opted_out: Option<BTreeMap<String, String>> =
            Some([(crate::ANNOTATION_RESTART.to_owned(), "false".to_owned())].into());
        let mounts = template("settings", &[]);
        let w = judge.rolling(
            ("StatefulSet", "team-a", Some("db".into())),
            &mounts,
            &opted_out,
            figures,
        );
        assert!(!w.uses);
        let w = judge.rolling(
            ("StatefulSet", "team-a", Some("db".into())),
            &mounts,
            &None,
            figures,
        );
        assert!(w.uses);
    }

    #[test]
    fn a_rolled_workload_settles_when_its_newest_generation_is_available_and_no_old_pod_runs() {
        let check = check(&["team-a"]);
        let judge = judge(&check);
        let plain = template("settings", &[]);
        let value = new_value(&check, &plain, "team-a");
        let rolled = template("settings", &[(&judge.key, &value)]);
        let settles = |figures| {
            judge
                .rolling(
                    ("Deployment", "team-a", Some("web".into())),
                    &rolled,
                    &None,
                    figures,
                )
                .settled()
        };
        // (current, want, updated, available, total)
        assert!(settles((true, 3, 3, 3, 3)));
        assert!(
            !settles((false, 3, 3, 3, 3)),
            "status of an older generation"
        );
        assert!(!settles((true, 3, 2, 3, 3)), "one pod not updated");
        assert!(!settles((true, 3, 3, 2, 3)), "one pod not available");
        assert!(!settles((true, 3, 3, 3, 4)), "an old pod still runs");
        let w = judge.rolling(
            ("Deployment", "team-a", Some("web".into())),
            &rolled,
            &None,
            (true, 3, 3, 2, 4),
        );
        assert_eq!(
            w.describe("team-a"),
            "Deployment team-a/web (2 of 3 available, 3 updated, 4 in all)"
        );
    }

    #[test]
    fn news_is_a_stage_that_settles_or_unsettles_not_a_count() {
        let mut seen = HashMap::new();
        let waiting = |n: usize| (0..n).map(|i| format!("Deployment team-a/w{i}")).collect();
        assert!(
            remember_availability(&mut seen, check(&[]), waiting(2)),
            "first look"
        );
        assert!(
            !remember_availability(&mut seen, check(&[]), waiting(1)),
            "a count"
        );
        assert!(
            remember_availability(&mut seen, check(&[]), waiting(0)),
            "settled"
        );
        assert!(
            !remember_availability(&mut seen, check(&[]), waiting(0)),
            "still settled"
        );
        assert!(
            remember_availability(&mut seen, check(&[]), waiting(1)),
            "unsettled"
        );
        let mut newer = check(&[]);
        newer.payload ^= 1;
        assert!(
            remember_availability(&mut seen, newer, waiting(1)),
            "another content"
        );
        assert_eq!(seen.len(), 1, "one entry per copy and stage");
    }
}
