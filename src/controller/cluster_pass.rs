//! A rule's pass in one cluster, the same at home and in every member:
//! plan from the site's views, carry the plan out within each copy's
//! backoff (and the rule's stages), roll the consumers of what changed,
//! and report what the cluster then holds ([`ClusterReport`]). What the
//! rule says of all clusters together is `reconcile`'s. [`preview_plan`]
//! plans the same way for `copyrator plan` and writes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::ListParams;
use tokio::time::Instant;

use crate::Error;
use crate::api::kinds::Kind;
use crate::api::rule::{ConflictEntry, ContestedEntry, CopyratorRule};
use crate::cache::index::{Object, ObjectKey};
use crate::cluster::writer::Outcome;
use crate::controller::consumers::{ChangedCopy, Restarts, restart_consumers};
use crate::controller::finalizer::write_through;
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::backoff::{Admission, CopyKey, Failure, Waiting};
use crate::core::plan::{self, Action, Claim, DeleteReason, DesiredCopies, Inputs, Occupied, Plan};
use crate::core::preview::{PlannedChange, Preview, Skip};
use crate::core::report::{self, ClusterReport};
use crate::core::resolve::{ClusterOf, ResolvedRule};
use crate::core::scope::{Scope, Touch};
use crate::core::tally::{Basis, Unsettled};
use crate::sync::{lock, read};

/// What a rule's pass did, for its status, its log line and its requeue.
#[derive(Default)]
pub(crate) struct Pass {
    pub(crate) plan: Plan,
    /// Every conflict of the rule, from this pass and the earlier ones
    /// whose places it did not look at.
    pub(crate) conflicts: Vec<ConflictEntry>,
    /// Copies of the rule in place after this pass, wherever they are.
    pub(crate) copies: u32,
    pub(crate) created: u32,
    pub(crate) updated: u32,
    pub(crate) pruned: u32,
    pub(crate) deleted: u32,
    /// Copies orphaned: handed over to their namespaces (`deletionPolicy`).
    pub(crate) handed_over: u32,
    /// Objects the rule did not write, holding its copies' payload, taken
    /// over by a metadata patch (`spec.adopt`).
    pub(crate) adopted: u32,
    /// Not written because this process does not lead.
    pub(crate) not_leader: u32,
    /// Writes that failed in this pass: `(what, failure)`.
    pub(crate) failed: Vec<(String, Failure)>,
    /// Writes waiting out the backoff of an earlier failure.
    pub(crate) deferred: Vec<(String, Failure)>,
    /// Restores of contested copies waiting out their backoff.
    pub(crate) contest_waits: u32,
    /// When the earliest copy in backoff may be written.
    pub(crate) retry_at: Option<Instant>,
    /// What the rule's stages held back and where its rollouts stand.
    pub(crate) rollout: Option<crate::core::rollout::Gated>,
    /// Copies whose data this pass's writes changed (kept only for a rule
    /// with `rollout.restartConsumers`).
    pub(crate) changed: Vec<ChangedCopy>,
    /// The workloads rolled after the writes.
    pub(crate) restarts: Restarts,
}

impl Pass {
    fn retry_no_later_than(&mut self, at: Instant) {
        self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
    }

    /// Every copy that is not written because of a failure, this pass or before.
    pub(crate) fn failing(&self) -> impl Iterator<Item = &(String, Failure)> {
        self.failed.iter().chain(&self.deferred)
    }
}

/// What a pass found in its cluster (home or a member), counted the same
/// way in each; the problem is only that of its failed writes.
fn report_of(site: &Site, resolved: &ResolvedRule, pass: &Pass) -> ClusterReport {
    let contested = lock(&site.backoffs)
        .contested(&resolved.key)
        .into_iter()
        .map(|c| ContestedEntry {
            cluster: None,
            namespace: c.namespace,
            name: c.name,
            writer: c.writer,
        })
        .collect();
    let copies = read(site.cluster.views.copies(resolved.copy_kind));
    ClusterReport {
        target_namespaces: pass.plan.target_namespaces,
        copies: pass.copies,
        create_only_copies: copies.count_create_only(&resolved.uid) as u32,
        adopted_copies: copies.count_adopted(&resolved.uid) as u32,
        conflicts: pass.conflicts.clone(),
        contested,
        problem: report::sync_failed(pass.failing()),
        rolled_out: pass
            .rollout
            .as_ref()
            .map(|gated| crate::core::rollout::rolled_out_for_status(&gated.rolled_out)),
        rollout: pass.rollout.as_ref().map(|gated| gated.facts.clone()),
        held: pass.rollout.as_ref().map_or(0, |gated| gated.held),
    }
}

/// Name lookups in flight at once while a preview checks its creates.
const LOOKUPS_IN_FLIGHT: usize = 8;

/// The plan of a pass over everything in `site`, as a preview: what it
/// would write and what it would leave out there.
pub(crate) async fn preview_plan(
    shared: &Arc<Shared>,
    site: &Site,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    labels: &BTreeMap<String, String>,
) -> Result<Preview, Error> {
    let key = &resolved.key;
    let rule_name = key.to_string();
    let cluster = shared.cluster_name(&site.name);
    // A fresh process knows no conflict yet: the lookup below finds them.
    let everything = Scope::everything();
    let desired = plan::desired_copies(resolved, sources, &everything);
    let (mut plan, other_kind_deletions) = plan_pass(
        shared,
        site,
        resolved,
        sources,
        &desired,
        &everything,
        &HashMap::new(),
    );
    let actions = take_over_or_skip(
        site,
        resolved,
        std::mem::take(&mut plan.actions),
        &mut plan.conflicts,
    )
    .await?;
    let staged = staged_preview(shared, site, resolved, labels);
    let changes = actions
        .iter()
        .map(|action| (resolved.copy_kind, action))
        .chain(other_kind_deletions.iter().map(|(kind, a)| (*kind, a)))
        .map(|(kind, action)| {
            let change =
                PlannedChange::of(cluster, &rule_name, kind, action).sent_as(&resolved.identity);
            match &staged {
                Some(staged) => {
                    let (stage, held) = staged(action);
                    change.in_stage(&stage, held)
                }
                None => change,
            }
        })
        .collect();
    let mut skipped: Vec<Skip> = plan
        .conflicts
        .iter()
        .chain(&plan.shadowed)
        .map(|conflict| Skip::copy(cluster, &rule_name, resolved.copy_kind, conflict))
        .chain(
            plan.refused_sources
                .iter()
                .map(|(source, why)| Skip::source(cluster, &rule_name, resolved.kind, source, why)),
        )
        .collect();
    skipped.extend(
        plan::left_out_namespaces(resolved, &read(&site.cluster.views.namespaces))
            .into_iter()
            .map(|(namespace, exclusion)| Skip::namespace(cluster, key, namespace, exclusion)),
    );
    Ok(Preview::Planned { changes, skipped })
}

/// For a staged rule, what a preview says of each write in `site`: the
/// stage of its place, and whether it brings new content into a stage
/// the recorded rollout has not opened yet.
#[allow(clippy::type_complexity)]
fn staged_preview<'a>(
    shared: &Shared,
    site: &'a Site,
    resolved: &'a ResolvedRule,
    labels: &'a BTreeMap<String, String>,
) -> Option<Box<dyn Fn(&Action) -> (String, bool) + 'a>> {
    let stages = resolved.stages.clone()?;
    let recorded = read(&shared.rules)
        .get(&resolved.key)
        .and_then(|rule| rule.status.as_ref())
        .map(|status| crate::core::fleet_rollout::from_status(&status.rollouts, &stages))
        .unwrap_or_default();
    Some(Box::new(move |action: &Action| {
        let cluster = match site.name.member() {
            Some(name) => ClusterOf::Member(name, labels),
            None => ClusterOf::Home,
        };
        let (namespace, _) = action.target();
        let namespaces = read(&site.cluster.views.namespaces);
        let ns_labels = namespaces
            .get(namespace)
            .map(|ns| ns.labels.clone())
            .unwrap_or_default();
        let stage = stages.stage_of(cluster, namespace, &ns_labels);
        // A create, or an update of new content over a copy that holds
        // what Copyrator wrote (an edited one is restored at once).
        let written = match action {
            Action::Create { desired, .. } => Some(desired),
            Action::Update { desired, current } | Action::Recreate { desired, current }
                if current.intact && current.payload_hash != desired.payload_hash =>
            {
                Some(desired)
            }
            _ => None,
        };
        // A plan holds no mark key: a recorded rollout of the copy name
        // holds a write of new content, as the operator would.
        let held = written.is_some_and(|desired| {
            recorded
                .get(&desired.name)
                .is_some_and(|t| t.open().through.is_none_or(|open| stage > open))
        });
        (stages.name(stage).to_owned(), held)
    }))
}

/// The creates of a plan as the writer would end up carrying them out:
/// where an object the copy cache does not hold already has the name, the
/// create becomes a conflict, a take-over (update or recreate) or nothing
/// (the cache was behind), as [`plan::occupied`] decides. One list per
/// name, across namespaces, so the cost follows the sources, not the targets.
async fn take_over_or_skip(
    site: &Site,
    resolved: &ResolvedRule,
    actions: Vec<Action>,
    conflicts: &mut Vec<ConflictEntry>,
) -> Result<Vec<Action>, Error> {
    let names: BTreeSet<String> = actions
        .iter()
        .filter_map(|action| match action {
            Action::Create { desired, .. } => Some(desired.name.clone()),
            _ => None,
        })
        .collect();
    if names.is_empty() {
        return Ok(actions);
    }
    let kind = resolved.copy_kind;
    let api = site.cluster.reader.of(&kind.api_resource(), None);
    let mut lists = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let params = ListParams::default().fields(&format!("metadata.name={name}"));
                (name, api.list(&params).await)
            }
        })
        .buffer_unordered(LOOKUPS_IN_FLIGHT);
    let mut holders: HashMap<ObjectKey, Object> = HashMap::new();
    while let Some((name, listed)) = lists.next().await {
        let listed = listed.map_err(|source| Error::Lookup {
            what: format!("the {kind}s named {name}"),
            source,
        })?;
        // Compact at once: a Secret's data is not kept.
        for object in listed.items {
            let object = Object::from_dynamic(kind, object).into_compact();
            holders.insert(object.key(), object);
        }
    }
    let rule_name = resolved.key.to_string();
    let mut out = Vec::with_capacity(actions.len());
    for action in actions {
        let Action::Create { desired, namespace } = &action else {
            out.push(action);
            continue;
        };
        let Some(existing) = holders.remove(&(namespace.clone(), desired.name.clone())) else {
            out.push(action);
            continue;
        };
        let current = Arc::new(existing);
        let claim = Claim::in_namespace(
            resolved,
            namespace,
            read(&site.cluster.views.namespaces).get(namespace),
        );
        match plan::occupied(desired, &current, claim, &rule_name) {
            Occupied::Ours => {}
            Occupied::Conflict(reason) => conflicts.push(ConflictEntry {
                cluster: None,
                namespace: namespace.clone(),
                name: desired.name.clone(),
                reason,
            }),
            Occupied::Recreate => out.push(Action::Recreate {
                desired: desired.clone(),
                current,
            }),
            Occupied::Update => out.push(Action::Update {
                desired: desired.clone(),
                current,
            }),
            Occupied::Adopt => out.push(Action::Adopt {
                desired: desired.clone(),
                current,
            }),
        }
    }
    conflicts.sort();
    conflicts.dedup();
    Ok(out)
}

/// `Kind namespace/name` of an action's target, for messages.
fn describe_target(kind: Kind, action: &Action) -> String {
    let (namespace, name) = action.target();
    format!("{kind} {namespace}/{name}")
}

/// What an action would write, for the backoff: a different copy (the
/// source or the rule changed) may be tried at once.
fn wanted_hash(action: &Action) -> u64 {
    match action {
        Action::Create { desired, .. }
        | Action::Update { desired, .. }
        | Action::Recreate { desired, .. }
        | Action::Adopt { desired, .. } => desired.content_hash,
        Action::Delete { .. } | Action::HandOver { .. } => 0,
    }
}

/// The writer that changed a copy back, when this action restores one.
fn changed_back_by(action: &Action) -> Option<String> {
    match action {
        Action::Update { desired, current } | Action::Recreate { desired, current }
            if desired.is_changed_back(current) =>
        {
            Some(
                current
                    .other_writer
                    .as_deref()
                    .unwrap_or("an unknown writer")
                    .to_owned(),
            )
        }
        _ => None,
    }
}

/// What a pass over `scope` plans for a rule, from the views and the
/// copies its sources want (`desired`, computed before: the views' locks
/// are held here only for work that grows with the places the rule
/// looks at, never with what its sources hold): its plan, and the
/// deletions of its copies of another kind (its type changed).
fn plan_pass(
    shared: &Shared,
    site: &Site,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    desired: &DesiredCopies,
    scope: &Scope,
    known_conflicts: &HashMap<ObjectKey, String>,
) -> (Plan, Vec<(Kind, Action)>) {
    let namespaces = read(&site.cluster.views.namespaces);
    let plan = {
        let copies = read(site.cluster.views.copies(resolved.copy_kind));
        let roles = read(&site.cluster.views.roles);
        let live = |uid: &str| shared.is_live_rule(uid);
        let inputs = Inputs {
            rule: resolved,
            namespaces: &namespaces,
            sources,
            copies: &copies,
            live_rule_uids: &live,
            known_conflicts,
            scope,
            roles: &roles,
        };
        plan::plan_with(&inputs, desired)
    };
    let mut other_kind_deletions = Vec::new();
    if resolved.prune {
        for kind in
            Kind::all().filter(|k| *k != resolved.copy_kind && resolved.policy.kinds.copies(*k))
        {
            // The rule no longer copies this kind: as if its sources were gone.
            for action in plan::cleanup(
                &resolved.uid,
                DeleteReason::SourceGone,
                resolved.deletion.source_gone,
                resolved.tenant.then_some(&*resolved.key.namespace),
                &namespaces,
                &read(site.cluster.views.copies(kind)),
            ) {
                other_kind_deletions.push((kind, action));
            }
        }
    }
    (plan, other_kind_deletions)
}

/// A rule's pass in one cluster, the same at home and in every member:
/// plan, write, roll the consumers of what changed (and say so); and what
/// the cluster then holds.
pub(crate) async fn cluster_pass(
    shared: &Arc<Shared>,
    site: &Site,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    scope: Scope,
) -> (Pass, ClusterReport) {
    let pass = carry_out(shared, site, rule, resolved, sources, scope).await;
    crate::controller::consumers::announce(shared, site, rule, &pass.restarts).await;
    let report = report_of(site, resolved, &pass);
    (pass, report)
}

/// The copies a pass over `scope` wants, its plan and its deletions of
/// another kind. Planning is bounded but may take a while: off the threads
/// that serve watches, the Lease and the probes. The copies the sources
/// want are computed first, holding no lock; the plan and the consumers
/// share them.
fn plan_off_the_runtime(
    shared: &Shared,
    site: &Site,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    scope: &Scope,
    known_conflicts: &HashMap<ObjectKey, String>,
) -> (DesiredCopies, Plan, Vec<(Kind, Action)>) {
    tokio::task::block_in_place(|| {
        let desired = plan::desired_copies(resolved, sources, scope);
        let (plan, other_kind_deletions) = plan_pass(
            shared,
            site,
            resolved,
            sources,
            &desired,
            scope,
            known_conflicts,
        );
        (desired, plan, other_kind_deletions)
    })
}

/// A rule's pass: plan what its scope concerns, then write what each
/// copy's backoff admits, and take the outcomes into the rule's tally.
async fn carry_out(
    shared: &Arc<Shared>,
    site: &Site,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    scope: Scope,
) -> Pass {
    let basis = Basis {
        uid: resolved.uid.clone(),
        generation: rule.metadata.generation,
    };
    // A staged rule is planned whole on every pass: where a source's
    // content stands is judged over every place, never from part of them.
    let staged = resolved.stages.is_some();
    let asked_everything = scope.is_everything();
    let scope = if staged { Scope::everything() } else { scope };
    let (scope, known_conflicts) = pass_scope(site, resolved, &basis, scope);
    // Consumers are rechecked on the passes over everything that were asked for.
    let recheck_consumers = if staged {
        asked_everything
    } else {
        scope.is_everything()
    };
    let (desired, mut plan, mut other_kind_deletions) =
        plan_off_the_runtime(shared, site, resolved, sources, &scope, &known_conflicts);
    shared
        .metrics
        .copies_examined
        .inc_by(u64::from(plan.examined));
    {
        let mut memory = lock(&site.memory);
        let memory = memory.entry(resolved.key.clone()).or_default();
        if plan.too_costly {
            // Nothing of a rule too costly to follow is written or
            // deleted, and what its plan counted before it stopped is no
            // count of the rule's.
            other_kind_deletions.clear();
            memory.too_costly = true;
        } else {
            if scope.is_everything() {
                memory.too_costly = false;
            }
            // What this pass looked at replaces what the rule's tally held there.
            memory.tally.record(&basis, &scope, &plan);
        }
        if memory.too_costly {
            // Until a pass over everything fits, none writes or deletes.
            plan.actions.clear();
            other_kind_deletions.clear();
        }
        plan.too_costly = memory.too_costly;
    }
    let mut pass = Pass::default();
    // The tally took the plan whole: writes the stages hold back stay owed.
    if let Some(stages) = &resolved.stages {
        let gated = stage_here(shared, site, rule, resolved, stages, &mut plan, &desired).await;
        if let Some(wait) = gated.recheck_in {
            pass.retry_no_later_than(Instant::now() + wait);
        }
        pass.rollout = Some(gated);
    }
    let actions: Vec<(Kind, Action)> = std::mem::take(&mut plan.actions)
        .into_iter()
        .map(|a| (resolved.copy_kind, a))
        .chain(other_kind_deletions)
        .collect();
    let admitted = admit(site, resolved, actions, &mut pass);
    defer_failed_elsewhere(site, resolved, &scope, &mut pass);
    let new_conflicts = write_admitted(site, resolved, admitted, &mut pass).await;
    if pass.rollout.is_some() && pass.created + pass.updated > 0 {
        // A stage's writes may have settled it: look again at once.
        pass.retry_no_later_than(Instant::now() + crate::core::rollout::AFTER_WRITES);
    }
    for (namespace, name) in after_writes(site, rule, resolved, new_conflicts, &mut pass, plan) {
        // What the write met may have gone unseen: look again.
        site.queue
            .add(resolved.key.clone(), Touch::Copy(namespace, name));
    }
    let changed = std::mem::take(&mut pass.changed);
    // A rule too costly to plan wrote nothing, and rolls nothing.
    if !pass.plan.too_costly {
        pass.restarts =
            restart_consumers(shared, site, resolved, &desired, recheck_consumers, changed).await;
    }
    if let Some(delay) = pass.restarts.retry_in {
        pass.retry_no_later_than(Instant::now() + delay);
    }
    pass
}

/// Stage `plan` in `site` as the rule's status records its rollouts.
async fn stage_here(
    shared: &Shared,
    site: &Site,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    stages: &crate::core::rollout::Stages,
    plan: &mut Plan,
    desired: &DesiredCopies,
) -> crate::core::rollout::Gated {
    let kept = rolled_out_kept(rule, site.name.member());
    let recorded = crate::core::fleet_rollout::from_status(
        rule.status.as_ref().map_or(&[][..], |s| &s.rollouts[..]),
        stages,
    );
    let labels = site
        .name
        .member()
        .and_then(|name| shared.members.get(name))
        .map(|member| read(&member.labels).clone())
        .unwrap_or_default();
    let cluster = match site.name.member() {
        Some(name) => ClusterOf::Member(name, &labels),
        None => ClusterOf::Home,
    };
    let at = crate::controller::rollout::StageInputs {
        cluster,
        kept: kept.as_ref(),
        recorded: &recorded,
    };
    crate::controller::rollout::stage(site, resolved, stages, plan, desired, &at).await
}

/// What the rule's status keeps of what it rolled out in a site: its own
/// `rolledOut` at home, its member entry's in a member; `None` when the
/// status keeps no record of the rollouts at all (wiped, or never
/// written): the copies' marks are taken instead.
fn rolled_out_kept(rule: &CopyratorRule, member: Option<&str>) -> Option<BTreeMap<String, String>> {
    let status = rule.status.as_ref()?;
    let kept = match member {
        None => Some(status.rolled_out.clone()).filter(|kept| !kept.is_empty()),
        Some(member) => status
            .clusters
            .iter()
            .flatten()
            .find(|c| c.name == member)
            .and_then(|c| c.rolled_out.clone()),
    };
    // Rollouts recorded without their content (by an earlier version) are
    // no record either.
    let rollouts_recorded = status.rollouts.iter().any(|r| r.content.is_some());
    match kept {
        None if !rollouts_recorded => None,
        kept => Some(kept.unwrap_or_default()),
    }
}

/// What a pass looks at, and the conflicts the rule knows of. Counts kept
/// from another generation's passes describe targets the rule may no
/// longer have: such a pass looks at everything; a pass that retries
/// looks again at every place left unsettled.
fn pass_scope(
    site: &Site,
    resolved: &ResolvedRule,
    basis: &Basis,
    scope: Scope,
) -> (Scope, HashMap<ObjectKey, String>) {
    let mut memory = lock(&site.memory);
    let fresh = !memory.contains_key(&resolved.key);
    // Even a rule's first pass in a site follows the places it finds held
    // (the foreign watch tells it when one is freed).
    let memory = memory.entry(resolved.key.clone()).or_default();
    memory
        .known_conflicts
        .pass_begins(&resolved.key.to_string(), resolved.copy_kind);
    memory.known_conflicts.set_adopts(resolved.adopt);
    let mut scope = if fresh {
        Scope::everything()
    } else {
        memory
            .tally
            .scope_for(basis, scope.named_by(&resolved.transform.naming))
    };
    if scope.retries() {
        for (namespace, name) in memory.tally.places() {
            scope.add(Touch::Copy(namespace.to_owned(), name.to_owned()));
        }
    }
    (scope, memory.known_conflicts.held().clone())
}

/// A write admitted into this pass: the copy, its kind, the action.
type Admitted = (CopyKey, Kind, Action);

/// Each copy's backoff decides whether it is written in this pass; of the
/// copies behind the rule's refusal gate, one may probe.
fn admit(
    site: &Site,
    resolved: &ResolvedRule,
    actions: Vec<(Kind, Action)>,
    pass: &mut Pass,
) -> Vec<Admitted> {
    let now = Instant::now();
    let mut admitted = Vec::with_capacity(actions.len());
    let mut refused = Vec::new();
    let mut backoffs = lock(&site.backoffs);
    for (kind, action) in actions {
        let (namespace, name) = action.target();
        let copy: CopyKey = (kind, namespace.to_owned(), name.to_owned());
        let restore = changed_back_by(&action).or_else(|| {
            (matches!(action, Action::Create { .. })
                && backoffs.was_deleted_by_others(&copy, wanted_hash(&action)))
            .then(|| "whoever deleted it".to_owned())
        });
        match backoffs.admit(
            &copy,
            &resolved.key,
            wanted_hash(&action),
            restore.as_deref(),
            now,
        ) {
            Admission::Go => admitted.push((copy, kind, action)),
            // Behind the rule's refusal gate: one of them may probe.
            Admission::Wait {
                why: Waiting::Refused(failure),
                ..
            } => refused.push((copy, kind, action, failure)),
            Admission::Wait { until, why } => {
                pass.retry_no_later_than(until);
                match why {
                    Waiting::Failed(failure) | Waiting::Refused(failure) => pass
                        .deferred
                        .push((describe_target(kind, &action), failure)),
                    Waiting::Contested { .. } => pass.contest_waits += 1,
                }
            }
        }
    }
    if !refused.is_empty() {
        let keys: Vec<CopyKey> = refused.iter().map(|(copy, ..)| copy.clone()).collect();
        let probe = backoffs.pick_probe(&resolved.key, &keys, now);
        for (copy, kind, action, failure) in refused {
            if probe.as_ref() == Some(&copy) {
                admitted.push((copy, kind, action));
            } else {
                pass.deferred
                    .push((describe_target(kind, &action), failure));
            }
        }
        if let Some(at) = backoffs.next_probe(&resolved.key) {
            pass.retry_no_later_than(at);
        }
    }
    admitted
}

/// Copies that failed before, where this pass did not look: they still
/// wait, and the status says so as a pass over everything would.
fn defer_failed_elsewhere(site: &Site, resolved: &ResolvedRule, scope: &Scope, pass: &mut Pass) {
    if scope.is_everything() {
        return;
    }
    let memory = lock(&site.memory);
    let Some(tally) = memory
        .get(&resolved.key)
        .map(|m| &m.tally)
        .filter(|t| t.has_unwritten())
    else {
        return;
    };
    // `memory` comes before `backoffs` in the lock order.
    let failed_before = lock(&site.backoffs).failures(&resolved.key);
    for ((kind, namespace, name), failure, retry_at) in failed_before {
        if kind == resolved.copy_kind
            && !scope.covers(&namespace, &name)
            && tally.is_unwritten(&namespace, &name)
        {
            pass.retry_no_later_than(retry_at);
            pass.deferred
                .push((format!("{kind} {namespace}/{name}"), failure));
        }
    }
}

/// Outcomes taken together, each lock once for all of them: as many as
/// are ready at once, up to this many.
const OUTCOMES_PER_TAKE: usize = 256;

/// A write's outcome, with what was written.
type Written = (CopyKey, Kind, Action, Outcome);

/// Write the admitted copies, `--write-concurrency` at a time, taking
/// the outcomes as they come (a pass of 100,000 writes never holds them all
/// at once); returns the conflicts the writes met.
async fn write_admitted(
    site: &Site,
    resolved: &ResolvedRule,
    admitted: Vec<Admitted>,
    pass: &mut Pass,
) -> Vec<(ObjectKey, String)> {
    let rule_name = resolved.key.to_string();
    let concurrency = site.cluster.writer.concurrency();
    let mut results = futures::stream::iter(admitted)
        .map(|(copy, kind, action)| {
            let rule_name = rule_name.clone();
            let claim = claim_in(site, resolved, action.target().0);
            async move {
                let outcome = site
                    .cluster
                    .writer
                    .execute(kind, &action, claim, &rule_name, &resolved.identity)
                    .await;
                (copy, kind, action, outcome)
            }
        })
        .buffer_unordered(concurrency)
        .ready_chunks(OUTCOMES_PER_TAKE);
    let mut new_conflicts = Vec::new();
    while let Some(outcomes) = results.next().await {
        new_conflicts.extend(take_outcomes(site, resolved, pass, outcomes));
    }
    new_conflicts
}

/// The rule's claim in `namespace`: only a tenant rule that adopts needs
/// the namespace's word on adoption.
fn claim_in(site: &Site, resolved: &ResolvedRule, namespace: &str) -> Claim {
    if resolved.tenant && resolved.adopt {
        Claim::in_namespace(
            resolved,
            namespace,
            read(&site.cluster.views.namespaces).get(namespace),
        )
    } else {
        Claim::from(resolved)
    }
}

/// Outcomes into the rule's tally and the copies' backoffs (each lock
/// taken once for them all), then into the view of copies (write-through)
/// and the pass's counts; returns the conflicts met.
fn take_outcomes(
    site: &Site,
    resolved: &ResolvedRule,
    pass: &mut Pass,
    outcomes: Vec<Written>,
) -> Vec<(ObjectKey, String)> {
    {
        let mut memory = lock(&site.memory);
        let tally = &mut memory.entry(resolved.key.clone()).or_default().tally;
        for (_, kind, action, outcome) in &outcomes {
            if *kind == resolved.copy_kind
                && matches!(
                    outcome,
                    Outcome::Written(_) | Outcome::Adopted(_) | Outcome::Ignored(_)
                )
                && !adopted_behind(action, outcome)
            {
                let (namespace, name) = action.target();
                tally.settle(namespace, name);
            }
        }
    }
    let now = Instant::now();
    {
        let mut backoffs = lock(&site.backoffs);
        for (copy, _, action, outcome) in &outcomes {
            match outcome {
                // A refusal lifted: the rule's other refused copies go in
                // the next pass, at once.
                Outcome::Written(_) | Outcome::Adopted(_) if backoffs.succeeded(copy, now) => {
                    pass.retry_no_later_than(now);
                }
                // No write is owed there any more: an earlier failure is moot.
                Outcome::Conflict(_) => backoffs.no_longer_owed(copy),
                Outcome::Failed(failure) => {
                    let at = backoffs.failed(
                        copy,
                        &resolved.key,
                        wanted_hash(action),
                        failure.clone(),
                        now,
                    );
                    pass.retry_no_later_than(at);
                }
                _ => {}
            }
        }
    }
    let mut conflicts = Vec::new();
    for (_, kind, action, outcome) in outcomes {
        let (namespace, name) = action.target();
        match outcome {
            Outcome::Written(object) => {
                // Write-through: the next pass sees our write even before its watch event.
                write_through(site, kind, &action, object);
                if resolved.restart_consumers && kind == resolved.copy_kind {
                    note_changed(pass, namespace, &action);
                }
                match action {
                    Action::Create { .. } => pass.created += 1,
                    Action::Update { .. } | Action::Recreate { .. } => pass.updated += 1,
                    Action::Delete { reason, .. } if reason.is_prune() => pass.pruned += 1,
                    Action::Delete { .. } => pass.deleted += 1,
                    Action::HandOver { .. } => pass.handed_over += 1,
                    Action::Adopt { .. } => pass.adopted += 1,
                }
            }
            // Taken as it is: no payload written, no consumer to roll.
            Outcome::Adopted(object) => {
                let behind = adopted_behind(&action, &Outcome::Adopted(object.clone()));
                write_through(site, kind, &action, Some(object));
                pass.adopted += 1;
                if behind {
                    // Taken back behind its source: the next pass updates it.
                    site.queue.add(
                        resolved.key.clone(),
                        Touch::Copy(namespace.to_owned(), name.to_owned()),
                    );
                }
            }
            Outcome::Conflict(reason) => {
                conflicts.push(((namespace.to_owned(), name.to_owned()), reason));
            }
            Outcome::Failed(failure) => {
                pass.failed.push((describe_target(kind, &action), failure));
            }
            Outcome::NotLeader => pass.not_leader += 1,
            Outcome::Ignored(_) => {}
        }
    }
    conflicts
}

/// Whether `outcome` of `action` adopted a copy that does not hold the
/// source's content yet (one a rule of this name handed over before the
/// source changed): its write is still owed.
fn adopted_behind(action: &Action, outcome: &Outcome) -> bool {
    match (action, outcome) {
        (Action::Adopt { desired, .. }, Outcome::Adopted(object)) => {
            object.payload_hash != desired.payload_hash
        }
        _ => false,
    }
}

/// A written copy whose data changed (or that was created), for
/// `rollout.restartConsumers`.
fn note_changed(pass: &mut Pass, namespace: &str, action: &Action) {
    let (desired, before) = match action {
        Action::Create { desired, .. } => (desired, None),
        Action::Update { desired, current } | Action::Recreate { desired, current }
            if desired.payload_hash != current.payload_hash =>
        {
            (desired, Some(current.payload_hash))
        }
        _ => return,
    };
    pass.changed.push(ChangedCopy {
        namespace: namespace.to_owned(),
        desired: desired.clone(),
        created: before.is_none(),
        before,
    });
}

/// After the writes, in one hold of the rule's memory: the conflicts the
/// writes met join its tally (a target that is ours now is no conflict
/// any more), and the pass takes its counts and conflicts from the tally,
/// exact whatever part of the rule it looked at. Returns the places whose
/// conflict is not believed (what the write met went, or may have gone
/// unseen, meanwhile): their writes stay owed.
fn after_writes(
    site: &Site,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    new_conflicts: Vec<(ObjectKey, String)>,
    pass: &mut Pass,
    plan: Plan,
) -> Vec<ObjectKey> {
    let mut memory = lock(&site.memory);
    let memory = memory.entry(resolved.key.clone()).or_default();
    let mut doubted = Vec::new();
    for (key, reason) in new_conflicts {
        if memory.known_conflicts.met(key.clone(), reason.clone()) {
            memory
                .tally
                .set(&key.0, &key.1, Unsettled::Conflict(reason));
        } else {
            doubted.push(key);
        }
    }
    {
        let copies = read(site.cluster.views.copies(resolved.copy_kind));
        memory.known_conflicts.retain(|(ns, name)| {
            copies
                .get(ns, name)
                .is_none_or(|c| c.rule_uid() != rule.uid())
        });
    }
    let counts = memory.tally.counts(&plan);
    pass.copies = counts.copies;
    pass.conflicts = counts.conflicts;
    pass.plan = plan;
    doubted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fake_objects::{FakeObjects, api_error, config_map};
    use crate::controller::test_support;
    use serde_json::{Value, json};

    /// The home site over objects in memory, with namespaces `ops`, `t1`
    /// and `t2`; the rule `ops/r` copying labelled ConfigMaps into `t*`,
    /// and its source `ops/ca`.
    struct Stage {
        shared: Arc<Shared>,
        store: Arc<FakeObjects>,
        rule: CopyratorRule,
        resolved: ResolvedRule,
        sources: Vec<Arc<Object>>,
    }

    fn stage() -> Stage {
        let (shared, store) = test_support::home();
        test_support::add_namespaces(&shared.home, &["ops", "t1", "t2"]);
        let rule = test_support::rule("rule-1", json!({"targets": {"include": ["t*"]}}));
        let resolved = test_support::resolved(&rule);
        let source = config_map("ops", "ca", json!({"copy": "yes"}), json!({"ca": "GOOD"}));
        let sources = vec![Arc::new(Object::from_dynamic(Kind::ConfigMap, source))];
        Stage {
            shared,
            store,
            rule,
            resolved,
            sources,
        }
    }

    impl Stage {
        async fn pass(&self) -> (Pass, ClusterReport) {
            cluster_pass(
                &self.shared,
                &self.shared.home,
                &self.rule,
                &self.resolved,
                &self.sources,
                Scope::everything(),
            )
            .await
        }

        fn data(&self, namespace: &str) -> Option<Value> {
            self.store
                .stored(namespace, "ca")
                .map(|o| o.data["data"].clone())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pass_writes_each_target_and_reports_what_the_cluster_holds() {
        let stage = stage();
        let (pass, report) = stage.pass().await;
        assert_eq!(pass.created, 2);
        assert_eq!(stage.data("t1"), Some(json!({"ca": "GOOD"})));
        assert_eq!(stage.data("t2"), Some(json!({"ca": "GOOD"})));
        assert_eq!(
            report,
            ClusterReport {
                target_namespaces: 2,
                copies: 2,
                ..ClusterReport::default()
            }
        );
        // A second pass finds everything in place and writes nothing.
        let requests = stage.store.requests().len();
        let (pass, again) = stage.pass().await;
        assert_eq!((pass.created, pass.updated), (0, 0));
        assert_eq!(again, report);
        assert_eq!(stage.store.requests().len(), requests);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_place_held_by_someone_else_is_a_conflict_and_a_refused_write_the_problem() {
        let stage = stage();
        stage.store.put(
            "t1",
            "kubectl",
            config_map(
                "t1",
                "ca",
                json!({"owner": "team"}),
                json!({"ca": "THEIRS"}),
            ),
        );
        stage.store.fail_next(
            "create",
            "t2",
            api_error(403, "configmaps are frozen in t2", "Forbidden"),
        );
        let (_, report) = stage.pass().await;
        assert_eq!(stage.data("t1"), Some(json!({"ca": "THEIRS"})));
        let conflicts: Vec<(&str, &str)> = report
            .conflicts
            .iter()
            .map(|c| (c.namespace.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(conflicts, [("t1", "ca")]);
        assert_eq!(report.copies, 0);
        let (reason, message) = report.problem.expect("the refused write is the problem");
        assert_eq!(reason, "SyncFailed");
        assert!(
            message.starts_with("1 copies could not be written; first: ConfigMap t2/ca: ")
                && message.contains("frozen in t2"),
            "{message}"
        );
        // The foreign object goes, as its watch says: the next pass fills
        // the place; the refused write waits out its backoff, still said.
        let held = stage.store.stored("t1", "ca").expect("held");
        let (uid, version) = (
            held.metadata.uid.unwrap_or_default(),
            held.metadata.resource_version.unwrap_or_default(),
        );
        stage
            .store
            .delete("t1", "ca", &uid, &version)
            .expect("freed");
        stage.shared.foreign_changed(
            &stage.shared.home,
            Kind::ConfigMap,
            crate::cluster::foreign::ForeignEvent::Gone {
                namespace: "t1".into(),
                name: "ca".into(),
            },
        );
        let key = stage.resolved.key.clone();
        let queued = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            stage.shared.home.queue.next(),
        )
        .await
        .expect("the rule is queued");
        assert_eq!(queued.0, key, "the freed place brings its rule back");
        let (_, report) = stage.pass().await;
        assert_eq!(stage.data("t1"), Some(json!({"ca": "GOOD"})));
        assert_eq!((report.copies, report.conflicts.len()), (1, 0));
        assert!(stage.data("t2").is_none());
        let (reason, message) = report.problem.expect("still said while it waits");
        assert_eq!(reason, "SyncFailed");
        assert!(message.contains("frozen in t2"), "{message}");
    }

    #[tokio::test]
    async fn a_rules_first_pass_in_a_site_follows_the_places_it_finds_held() {
        let shared = crate::controller::state::test_shared();
        let rule: CopyratorRule = serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "ops", "uid": "rule-1", "generation": 1},
            "ruleType": "configmap",
            "selector": {"copy": "yes"},
        }))
        .expect("a rule");
        let resolved = rule.resolve(&shared.trust).expect("a valid rule");
        let basis = Basis {
            uid: resolved.uid.clone(),
            generation: Some(1),
        };
        assert!(!lock(&shared.home.memory).contains_key(&resolved.key));
        let (scope, known) = pass_scope(&shared.home, &resolved, &basis, Scope::everything());
        assert!(scope.is_everything() && known.is_empty());
        let memory = lock(&shared.home.memory);
        assert!(
            memory[&resolved.key]
                .known_conflicts
                .follows(Kind::ConfigMap),
            "the foreign watch of ConfigMaps tells the rule of a place freed after its first pass"
        );
    }
}
