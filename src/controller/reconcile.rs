//! One pass over one rule: plan from the in-memory views, carry the plan
//! out within each copy's backoff, then publish the rule's status, its
//! Events and one summary log line. [`preview`] computes the same plan for
//! `copyrator plan` and writes nothing.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::kinds::Kind;
use crate::api::rule::{ConflictEntry, ContestedEntry, CopyratorRule, RuleKey, RuleStatus};
use crate::cache::index::{Object, ObjectKey};
use crate::cluster::sources::Sources;
use crate::cluster::writer::Outcome;
use crate::controller::consumers::{ChangedCopy, Restarts, restart_consumers};
use crate::controller::finalizer::{cleanup, set_finalizer, write_through};
use crate::controller::kinds::KindReadiness;
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::backoff::{Admission, CopyKey, Failure, Waiting};
use crate::core::pass_log::{self, Line, Written};
use crate::core::plan::{self, Action, DeleteReason, Inputs, Occupied, Plan};
use crate::core::preview::{PlannedChange, Preview, Skip};
use crate::core::report::{self, ClusterReport, retry_note};
use crate::core::resolve::{InvalidRule, ResolvedRule};
use crate::core::scope::{Scope, Touch};
use crate::core::status::{self, Observed};
use crate::core::tally::{Basis, Unsettled};
use crate::sync::{lock, read, write};
use crate::{Error, FIELD_MANAGER};

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

/// Reconcile one rule: its cleanup when deleted, its finalizer, its plan
/// for the copies `scope` covers, and its status. Returns when the rule
/// wants another pass (a copy waits out a backoff).
pub(crate) async fn reconcile(
    shared: &Arc<Shared>,
    key: &RuleKey,
    scope: Scope,
) -> Result<Option<Duration>, Error> {
    let Some(rule) = read(&shared.rules).get(key).cloned() else {
        lock(&shared.home.cluster.sources).remove(key);
        return Ok(None);
    };
    let uid = rule.uid().unwrap_or_default().to_owned();
    let (resolved, sources) = match prepare(shared, &rule, true).await? {
        Prepared::KindListing => {
            shared.home.queue.carry(key, scope);
            return Ok(None);
        }
        Prepared::Deleting => {
            if rule.has_finalizer() {
                return cleanup(shared, &rule, &uid).await;
            }
            return Ok(None);
        }
        Prepared::Refused { invalid, retry_in } => {
            ensure_finalizer(shared, &rule).await?;
            return report_invalid(shared, &rule, &uid, invalid, retry_in).await;
        }
        Prepared::Resolved { resolved, sources } => {
            ensure_finalizer(shared, &rule).await?;
            write(&shared.resolved).insert(key.clone(), Arc::new((*resolved).clone()));
            (*resolved, sources)
        }
    };
    let (sources, scope) =
        match wait_for_sources(shared, &rule, &resolved, sources, &uid, scope).await? {
            SourcesWait::Listed(sources, scope) => (sources, scope),
            SourcesWait::Again(again) => return Ok(again),
        };
    let started = Instant::now();
    let (pass, home) = cluster_pass(shared, &shared.home, &rule, &resolved, &sources, scope).await;
    let failing = pass.failing().count();
    let observed = observed_after(shared, &rule, &resolved, &pass, &home);
    let published = publish_status(shared, &rule, &observed).await?;
    log_pass(shared, key, &pass, failing, started.elapsed());
    announce(shared, &rule, &resolved, &pass, &home, &observed).await;
    shared
        .metrics
        .copies_contested
        .set(lock(&shared.home.backoffs).contested_total() as i64);
    let retry = pass
        .retry_at
        .map(|at| at.saturating_duration_since(Instant::now()));
    Ok(sooner(retry, published.again_in()))
}

/// The sooner of two times to look again, where there is one.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How far a rule gets through the steps that a pass and a preview share:
/// its kind prepared, the rule resolved under the trust policy, its
/// sources asked of the shared source watches.
enum Prepared {
    /// The copies of its kind are still being listed.
    KindListing,
    /// Deleted: what happens to its copies is the caller's.
    Deleting,
    /// Not followed (invalid, or its kind refused), and when to look again.
    Refused {
        invalid: InvalidRule,
        retry_in: Option<Duration>,
    },
    /// Followed; its sources as far as the watches have listed them.
    Resolved {
        resolved: Box<ResolvedRule>,
        sources: Sources,
    },
}

/// The steps a pass and a preview share: prepare the kind (for a rule of
/// the view, `in_view`, only while it is there; a deleted rule's copies
/// are found through its kind's watch), resolve, and ask for the sources.
async fn prepare(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    in_view: bool,
) -> Result<Prepared, Error> {
    let kind_refused = match crate::controller::kinds::prepare(shared, rule, in_view).await? {
        KindReadiness::Listing => return Ok(Prepared::KindListing),
        KindReadiness::Refused(invalid, again) => Some((invalid, again)),
        KindReadiness::Ready | KindReadiness::NothingToPrepare => None,
    };
    if rule.is_deleting() {
        return Ok(Prepared::Deleting);
    }
    let resolution = match kind_refused {
        Some((invalid, retry_in)) => Err((invalid, retry_in)),
        None => rule
            .resolve(&shared.trust)
            .map_err(|invalid| (invalid, None)),
    };
    Ok(match resolution {
        Ok(resolved) => {
            let sources = sources_of(shared, &resolved);
            Prepared::Resolved {
                resolved: Box::new(resolved),
                sources,
            }
        }
        Err((invalid, retry_in)) => Prepared::Refused { invalid, retry_in },
    })
}

/// Our finalizer goes on before the rule's first copy is written.
async fn ensure_finalizer(shared: &Arc<Shared>, rule: &CopyratorRule) -> Result<(), Error> {
    if rule.has_finalizer() {
        return Ok(());
    }
    set_finalizer(shared, rule, true).await
}

/// An invalid rule changes nothing (a typo must not prune copies
/// cluster-wide): its status and a Warning Event say why.
async fn report_invalid(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    uid: &str,
    invalid: InvalidRule,
    retry_in: Option<Duration>,
) -> Result<Option<Duration>, Error> {
    let key = rule.key();
    write(&shared.resolved).remove(&key);
    lock(&shared.home.cluster.sources).remove(&key);
    shared.metrics.reconciled("invalid");
    let observed = invalid_observed(shared, rule, uid, &invalid);
    let published = publish_status(shared, rule, &observed).await?;
    if published == Published::Written {
        shared
            .event(
                rule,
                EventType::Warning,
                invalid.reason,
                "Validate",
                invalid.message,
            )
            .await;
    }
    Ok(sooner(retry_in, published.again_in()))
}

/// Whether a pass can go on: its sources listed (with the scope it
/// carries on), or when to look again (the scope is carried by the queue).
enum SourcesWait {
    Listed(Vec<Arc<Object>>, Scope),
    Again(Option<Duration>),
}

/// Sources: the shared watches serve this rule once they have listed
/// what it needs; until then its status says how far the listing is.
async fn wait_for_sources(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    sources: Sources,
    uid: &str,
    scope: Scope,
) -> Result<SourcesWait, Error> {
    let key = &resolved.key;
    let waited = {
        let mut memory = lock(&shared.home.memory);
        let memory = memory.entry(key.clone()).or_default();
        match sources {
            Sources::Listed(_) => {
                memory.waiting_since = None;
                Duration::ZERO
            }
            _ => memory
                .waiting_since
                .get_or_insert_with(Instant::now)
                .elapsed(),
        }
    };
    let again = match sources {
        Sources::Listed(sources) => return Ok(SourcesWait::Listed(sources, scope)),
        // Most listings take a moment: a status write per rule for those
        // would be 1,000 writes when 1,000 rules start together.
        Sources::Waiting { .. } if waited < WAITING_STATUS_AFTER => {
            Some(WAITING_STATUS_AFTER - waited)
        }
        Sources::Waiting {
            listed,
            of,
            failing,
        } if waiting_worth_saying(rule) => {
            let observed = Observed {
                generation: rule.metadata.generation,
                rule_type: Some(resolved.kind.info().rule_type.to_string()),
                copies: read(shared.copies(resolved.kind)).count_owned_by(uid) as u32,
                waiting_for_sources: Some((listed, of)),
                sources_failing: failing,
                ..Default::default()
            };
            shared.home.queue.carry(key, scope);
            let published = publish_status(shared, rule, &observed).await?;
            // The watches queue the rule again once they have listed.
            return Ok(SourcesWait::Again(published.again_in()));
        }
        // Said a moment ago (the counts are not worth a write per watch),
        // or the status already describes this generation: a restarted
        // operator relisting a synced rule has nothing new to say.
        Sources::Waiting { .. } => Some(WAITING_STATUS_EVERY),
        Sources::Unknown => None,
    };
    shared.home.queue.carry(key, scope);
    Ok(SourcesWait::Again(again))
}

const MEMBERS_OFF: &str = "the rule targets member clusters (targets.clusters), and the operator runs without --member-clusters";

/// What keeps the rule from being followed after `pass`, if anything:
/// `(reason, message)` for its Ready condition.
fn pass_problem(shared: &Shared, resolved: &ResolvedRule, pass: &Pass) -> Option<(String, String)> {
    let members_off =
        (!shared.options.member_clusters && resolved.clusters.names_members()).then(|| {
            (
                "MemberClustersDisabled".to_string(),
                MEMBERS_OFF.to_string(),
            )
        });
    let too_costly = pass.plan.too_costly.then(|| {
        (
            "TransformTooCostly".to_string(),
            format!(
                "stripping the sources' labels and annotations (transform.stripLabels, \
                 transform.stripAnnotations, --strip-keys) takes more than the {} glob \
                 steps a pass may spend; nothing is written or deleted: use fewer or simpler \
                 patterns, or sources with fewer or shorter keys",
                plan::STRIP_STEPS_PER_PASS
            ),
        )
    });
    members_off
        .or(too_costly)
        .or_else(|| report::sync_failed(pass.failing()))
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
    ClusterReport {
        target_namespaces: pass.plan.target_namespaces,
        copies: pass.copies,
        create_only_copies: read(site.cluster.views.copies(resolved.kind))
            .count_create_only(&resolved.uid) as u32,
        conflicts: pass.conflicts.clone(),
        contested,
        problem: report::sync_failed(pass.failing()),
    }
}

/// What a pass saw and did, as its status says it.
fn observed_after(
    shared: &Shared,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    pass: &Pass,
    home: &ClusterReport,
) -> Observed {
    // The counts cover every cluster: home's, and each member's as its
    // last pass there reported.
    let members = crate::controller::members::statuses(&shared.members, resolved);
    let total = report::fold(
        home,
        members
            .iter()
            .filter_map(|(status, report)| Some((status.name.as_str(), report.as_ref()?))),
    );
    Observed {
        generation: rule.metadata.generation,
        rule_type: Some(resolved.kind.info().rule_type.to_string()),
        sources: pass.plan.sources,
        target_namespaces: total.target_namespaces,
        copies: total.copies,
        create_only_copies: total.create_only_copies,
        conflicts: total.conflicts,
        problem: pass_problem(shared, resolved, pass),
        pending: pass.not_leader,
        contested: total.contested,
        // What a tenant's targets would reach but may not tells of
        // namespaces the tenant may not see: never said to a tenant.
        protected_namespaces: if resolved.tenant {
            0
        } else {
            pass.plan.protected_namespaces
        },
        not_accepting_namespaces: if resolved.tenant {
            0
        } else {
            pass.plan.not_accepting_namespaces
        },
        refused_sources: pass
            .plan
            .refused_sources
            .iter()
            .map(|(source, why)| {
                let (namespace, name) = source.split_once('/').unwrap_or(("", source));
                ConflictEntry {
                    cluster: None,
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    reason: why.clone(),
                }
            })
            .collect(),
        waiting_for_sources: None,
        sources_failing: None,
        clusters: members.into_iter().map(|(status, _)| status).collect(),
        rollouts: pass
            .rollout
            .as_ref()
            .map(|g| g.progress.clone())
            .unwrap_or_default(),
        held: pass.rollout.as_ref().map_or(0, |g| g.held),
    }
}

/// What a refused rule's status says: the refusal, and the copies it
/// still has (an invalid rule changes nothing).
fn invalid_observed(
    shared: &Shared,
    rule: &CopyratorRule,
    uid: &str,
    invalid: &InvalidRule,
) -> Observed {
    Observed {
        generation: rule.metadata.generation,
        rule_type: rule.kind_name(),
        copies: Kind::all()
            .map(|kind| read(shared.copies(kind)).count_owned_by(uid) as u32)
            .sum(),
        create_only_copies: Kind::all()
            .map(|kind| read(shared.copies(kind)).count_create_only(uid) as u32)
            .sum(),
        problem: Some((invalid.reason.to_string(), invalid.message.clone())),
        ..Default::default()
    }
}

/// The rule's sources, once the shared watches have listed what it needs;
/// registering the need starts those watches.
pub(crate) fn sources_of(shared: &Shared, resolved: &ResolvedRule) -> Sources {
    let mut hub = lock(&shared.home.cluster.sources);
    hub.set(resolved);
    shared.metrics.source_watches.set(hub.watch_count() as i64);
    hub.sources(&resolved.key)
}

/// Name lookups in flight at once while a preview checks its creates.
const LOOKUPS_IN_FLIGHT: usize = 8;

/// What a pass over `rule` would write and leave out now in the home
/// cluster, for `copyrator plan`: computed from the views as a pass over
/// everything computes it, each create checked against whatever may
/// already hold its name (the copy cache holds copies only), a refusal as
/// the rule's status would word it. Writes nothing, not even the rule's
/// memory. What it would do in members is `member_pass::member_preview`'s.
pub(crate) async fn preview(shared: &Arc<Shared>, rule: &CopyratorRule) -> Result<Preview, Error> {
    let uid = rule.uid().unwrap_or_default();
    match prepare(shared, rule, false).await? {
        // Its copies are listed before anything is said of them.
        Prepared::KindListing => Ok(Preview::WaitingForSources),
        Prepared::Deleting => Ok(preview_deletion(shared, rule, uid)),
        Prepared::Refused { invalid, .. } => {
            let observed = invalid_observed(shared, rule, uid, &invalid);
            let said = status::compute(None, &observed, "")
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.reason, c.message));
            let (reason, message) =
                said.unwrap_or_else(|| (invalid.reason.to_owned(), invalid.message));
            Ok(Preview::Refused { reason, message })
        }
        Prepared::Resolved {
            sources: Sources::Listed(sources),
            resolved,
        } => preview_plan(shared, &shared.home, &resolved, &sources).await,
        Prepared::Resolved { .. } => Ok(Preview::WaitingForSources),
    }
}

/// Without our finalizer a deleted rule goes at once, and its copies are
/// left to the collection of orphans; with it, its copies are deleted.
fn preview_deletion(shared: &Shared, rule: &CopyratorRule, uid: &str) -> Preview {
    let changes = if rule.has_finalizer() {
        crate::controller::finalizer::preview_withdrawal(
            shared,
            &shared.home,
            &rule.key().to_string(),
            uid,
            DeleteReason::RuleDeleted,
            rule.on_deletion(),
        )
    } else {
        Vec::new()
    };
    Preview::Planned {
        changes,
        skipped: Vec::new(),
    }
}

/// The plan of a pass over everything in `site`, as a preview: what it
/// would write and what it would leave out there.
pub(crate) async fn preview_plan(
    shared: &Arc<Shared>,
    site: &Site,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
) -> Result<Preview, Error> {
    let key = &resolved.key;
    let rule_name = key.to_string();
    let cluster = shared.cluster_name(&site.name);
    // A fresh process knows no conflict yet: the lookup below finds them.
    let (mut plan, other_kind_deletions) = plan_pass(
        shared,
        site,
        resolved,
        sources,
        &Scope::everything(),
        &HashMap::new(),
    );
    let actions = take_over_or_skip(
        site,
        resolved,
        std::mem::take(&mut plan.actions),
        &mut plan.conflicts,
    )
    .await?;
    let changes = actions
        .iter()
        .map(|action| (resolved.kind, action))
        .chain(other_kind_deletions.iter().map(|(kind, a)| (*kind, a)))
        .map(|(kind, action)| PlannedChange::of(cluster, &rule_name, kind, action))
        .collect();
    let mut skipped: Vec<Skip> = plan
        .conflicts
        .iter()
        .chain(&plan.shadowed)
        .map(|conflict| Skip::copy(cluster, &rule_name, resolved.kind, conflict))
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
    let kind = resolved.kind;
    let api: Api<DynamicObject> = Api::all_with(site.cluster.client.clone(), &kind.api_resource());
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
        match plan::occupied(desired, &current, resolved.conflict_policy, &rule_name) {
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
        }
    }
    conflicts.sort();
    conflicts.dedup();
    Ok(out)
}

/// One line per pass that wrote or started failing; a failure that stays
/// the same once a minute, with the writes made meanwhile, and one line
/// when it ends ([`crate::core::pass_log`]).
fn log_pass(shared: &Shared, key: &RuleKey, pass: &Pass, failing: usize, took: Duration) {
    let first = pass.failing().next();
    let first_error = first
        .map(|(what, f)| format!("{what}: {}", f.message))
        .unwrap_or_default();
    let written = Written {
        created: pass.created,
        updated: pass.updated,
        deleted: pass.pruned + pass.deleted,
        orphaned: pass.handed_over,
    };
    let line = {
        let mut memory = lock(&shared.home.memory);
        let memory = memory.entry(key.clone()).or_default();
        pass_log::line(
            &mut memory.failure_log,
            first.map(|(_, f)| f.class.label()),
            written,
            Instant::now(),
        )
    };
    let contested = lock(&shared.home.backoffs).contested(key).len();
    let conflicts = pass.conflicts.len();
    let took_ms = took.as_millis() as u64;
    let (message, told) = match line {
        Line::Pass(told) | Line::Failing(told) => ("rule pass", told),
        Line::StillFailing(told) => ("rule still failing", told),
        Line::Recovered(told) => ("rule recovered", told),
        Line::Quiet => {
            debug!(
                rule = %key,
                in_place = pass.plan.in_place,
                deferred = pass.deferred.len() + pass.contest_waits as usize,
                failed = failing,
                contested,
                took_ms,
                "rule pass, nothing new to log"
            );
            return;
        }
    };
    info!(
        rule = %key,
        created = told.created,
        updated = told.updated,
        deleted = told.deleted,
        orphaned = told.orphaned,
        failed = failing,
        conflicts,
        contested,
        first_error = first_error.as_str(),
        took_ms,
        "{message}"
    );
}

/// Events for what changed: new conflicts, prunes, failures, contests.
async fn announce(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    pass: &Pass,
    home: &ClusterReport,
    observed: &Observed,
) {
    let (new_conflicts, new_refusals) = note_announced(shared, &resolved.key, home, observed);
    let contests = lock(&shared.home.backoffs).take_unannounced(&resolved.key);
    let said = Said {
        kind: resolved.kind,
        new_conflicts,
        new_refusals,
        contests: contests
            .into_iter()
            .take(5)
            .map(|c| (c.kind, c.namespace, c.name, c.writer))
            .collect(),
    };
    for (type_, reason, action, note) in said.events(pass) {
        shared.event(rule, type_, reason, action, note).await;
    }
}

/// What this pass has to say that earlier passes have not said, taken
/// into the rule's memory (with the home cluster's gauges of copies and
/// conflicts): the new conflicts, wherever they are, and the sources
/// newly refused for their type.
fn note_announced(
    shared: &Shared,
    key: &RuleKey,
    home: &ClusterReport,
    observed: &Observed,
) -> (Vec<ConflictEntry>, Vec<ConflictEntry>) {
    let mut memory = lock(&shared.home.memory);
    let memory = memory.entry(key.clone()).or_default();
    let current: HashSet<ConflictEntry> = observed.conflicts.iter().cloned().collect();
    let fresh = current.difference(&memory.announced).cloned().collect();
    memory.announced = current;
    let refused: HashSet<ConflictEntry> = observed.refused_sources.iter().cloned().collect();
    let fresh_refusals = refused
        .difference(&memory.announced_refusals)
        .cloned()
        .collect();
    memory.announced_refusals = refused;
    let copies = i64::from(home.copies);
    let conflicts = home.conflicts.len() as i64;
    shared.metrics.copies_managed.inc_by(copies - memory.copies);
    shared
        .metrics
        .conflicts_skipped
        .inc_by(conflicts - memory.conflicts);
    memory.copies = copies;
    memory.conflicts = conflicts;
    (fresh, fresh_refusals)
}

/// The news of a pass, for its Events.
struct Said {
    kind: Kind,
    new_conflicts: Vec<ConflictEntry>,
    new_refusals: Vec<ConflictEntry>,
    /// Copies newly contested: kind, namespace, name, and by whom.
    contests: Vec<(Kind, String, String, String)>,
}

/// An Event: its type, reason, action and note.
type EventNote = (EventType, &'static str, &'static str, String);

impl Said {
    /// The Events, in order: refused sources (one Event for all: the
    /// recorder folds Events of one reason into a series, which would keep
    /// only the last note), up to five conflicts, the prunes, the failed
    /// writes (only those tried in this pass: a copy waiting out its
    /// backoff was announced when it failed), up to five contests.
    fn events(mut self, pass: &Pass) -> Vec<EventNote> {
        let kind = self.kind;
        let mut events = Vec::new();
        if !self.new_refusals.is_empty() {
            self.new_refusals.sort();
            let listed: Vec<String> = self
                .new_refusals
                .iter()
                .take(5)
                .map(|r| format!("{kind} {}/{} ({})", r.namespace, r.name, r.reason))
                .collect();
            let note = format!(
                "{} sources are not copied: {}",
                self.new_refusals.len(),
                listed.join("; ")
            );
            events.push((EventType::Warning, "SourceRefused", "Copy", note));
        }
        for conflict in self.new_conflicts.iter().take(5) {
            let place = match &conflict.cluster {
                Some(member) => format!(" in member cluster {member}"),
                None => String::new(),
            };
            let note = format!(
                "{kind} {}/{}{place} not written: {}",
                conflict.namespace, conflict.name, conflict.reason
            );
            events.push((EventType::Warning, "ConflictSkipped", "Copy", note));
        }
        if pass.pruned > 0 {
            let note = format!("deleted {} copies that no longer belong", pass.pruned);
            events.push((EventType::Normal, "Pruned", "Delete", note));
        }
        if pass.handed_over > 0 {
            let note = format!(
                "handed {} copies that no longer belong over to their namespaces (deletionPolicy Orphan): they are never written again",
                pass.handed_over
            );
            events.push((EventType::Normal, "Orphaned", "Orphan", note));
        }
        if let Some((what, failure)) = pass.failed.first() {
            let note = format!(
                "{} writes failed; first: {what}: {}; {}",
                pass.failed.len(),
                failure.message,
                retry_note(failure.class)
            );
            events.push((EventType::Warning, "SyncFailed", "Copy", note));
        }
        for (kind, namespace, name, writer) in self.contests {
            let note = format!(
                "{kind} {namespace}/{name} keeps being changed back by {writer}; Copyrator restores it with growing delays (up to 5 min)"
            );
            events.push((EventType::Warning, "CopyContested", "Copy", note));
        }
        events
    }
}

/// How often the counts of a rule waiting for its sources are updated.
const WAITING_STATUS_EVERY: Duration = Duration::from_secs(5);

/// How long new counts wait before their status write.
const COUNTS_STATUS_AFTER: Duration = Duration::from_secs(1);

/// A rule says it waits for its sources only once it has waited this long.
const WAITING_STATUS_AFTER: Duration = Duration::from_millis(500);

/// Whether a WaitingForSources status is worth writing now: the rule has
/// no status for its current generation yet, or its status already says it
/// is waiting and was written at least [`WAITING_STATUS_EVERY`] ago. A
/// status that describes this generation otherwise (Synced after a
/// restart, say) stays as it is until the pass has something to say.
fn waiting_worth_saying(rule: &CopyratorRule) -> bool {
    let Some(status) = &rule.status else {
        return true;
    };
    let Some(ready) = status.conditions.iter().find(|c| c.type_ == "Ready") else {
        return true;
    };
    if ready.observed_generation != rule.metadata.generation {
        return true;
    }
    if ready.reason != "WaitingForSources" {
        return false;
    }
    let said_recently = status
        .last_sync_time
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|at| {
            (chrono::Utc::now() - at.with_timezone(&chrono::Utc))
                .to_std()
                .is_ok_and(|age| age < WAITING_STATUS_EVERY)
        });
    !said_recently
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
        | Action::Recreate { desired, .. } => desired.content_hash,
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

/// What a pass over `scope` plans for a rule, from the views: its plan,
/// and the deletions of its copies of another kind (its type changed).
fn plan_pass(
    shared: &Shared,
    site: &Site,
    resolved: &ResolvedRule,
    sources: &[Arc<Object>],
    scope: &Scope,
    known_conflicts: &HashMap<ObjectKey, String>,
) -> (Plan, Vec<(Kind, Action)>) {
    let namespaces = read(&site.cluster.views.namespaces);
    let plan = {
        let copies = read(site.cluster.views.copies(resolved.kind));
        let roles = read(&site.cluster.views.roles);
        let live = |uid: &str| shared.is_live_rule(uid);
        plan::plan(&Inputs {
            rule: resolved,
            namespaces: &namespaces,
            sources,
            copies: &copies,
            live_rule_uids: &live,
            known_conflicts,
            scope,
            roles: &roles,
        })
    };
    let mut other_kind_deletions = Vec::new();
    if resolved.prune {
        for kind in Kind::all().filter(|k| *k != resolved.kind && resolved.policy.kinds.copies(*k))
        {
            // The rule no longer copies this kind: as if its sources were gone.
            for action in plan::cleanup(
                &resolved.uid,
                DeleteReason::SourceGone,
                resolved.deletion.source_gone,
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
    // Planning is bounded but may take a while: off the threads that serve
    // watches, the Lease and the probes.
    let (mut plan, mut other_kind_deletions) = tokio::task::block_in_place(|| {
        plan_pass(shared, site, resolved, sources, &scope, &known_conflicts)
    });
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
        let gated = crate::controller::rollout::stage(site, resolved, stages, &mut plan).await;
        if let Some(at) = gated.recheck_at {
            pass.retry_no_later_than(at);
        }
        pass.rollout = Some(gated);
    }
    let actions: Vec<(Kind, Action)> = std::mem::take(&mut plan.actions)
        .into_iter()
        .map(|a| (resolved.kind, a))
        .chain(other_kind_deletions)
        .collect();
    let admitted = admit(site, resolved, actions, &mut pass);
    defer_failed_elsewhere(site, resolved, &scope, &mut pass);
    let new_conflicts = write_admitted(site, resolved, admitted, &mut pass).await;
    if pass.rollout.is_some() && pass.created + pass.updated > 0 {
        // A stage's writes may have settled it: look again at once.
        pass.retry_no_later_than(Instant::now() + crate::core::rollout::AFTER_WRITES);
    }
    for (namespace, name) in remember_conflicts(site, rule, resolved, new_conflicts) {
        // What the write met may have gone unseen: look again.
        site.queue
            .add(resolved.key.clone(), Touch::Copy(namespace, name));
    }
    finish(site, resolved, &mut pass, plan);
    let changed = std::mem::take(&mut pass.changed);
    // A rule too costly to plan wrote nothing, and rolls nothing.
    if !pass.plan.too_costly {
        pass.restarts =
            restart_consumers(shared, site, resolved, sources, recheck_consumers, changed).await;
    }
    if let Some(delay) = pass.restarts.retry_in {
        pass.retry_no_later_than(Instant::now() + delay);
    }
    pass
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
        .pass_begins(&resolved.key.to_string(), resolved.kind);
    let mut scope = if fresh {
        Scope::everything()
    } else {
        memory.tally.scope_for(basis, scope)
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
    let failed_before = if scope.is_everything()
        || !lock(&site.memory)
            .get(&resolved.key)
            .is_some_and(|m| m.tally.has_unwritten())
    {
        Vec::new()
    } else {
        lock(&site.backoffs).failures(&resolved.key)
    };
    if failed_before.is_empty() {
        return;
    }
    let memory = lock(&site.memory);
    let tally = memory.get(&resolved.key).map(|m| &m.tally);
    for ((kind, namespace, name), failure, retry_at) in failed_before {
        let still_unwritten = tally.is_some_and(|t| t.is_unwritten(&namespace, &name));
        if kind == resolved.kind && !scope.covers(&namespace, &name) && still_unwritten {
            pass.retry_no_later_than(retry_at);
            pass.deferred
                .push((format!("{kind} {namespace}/{name}"), failure));
        }
    }
}

/// Write the admitted copies, `--write-concurrency` at a time, taking
/// each outcome as it comes (a pass of 100,000 writes never holds them all
/// at once); returns the conflicts the writes met.
async fn write_admitted(
    site: &Site,
    resolved: &ResolvedRule,
    admitted: Vec<Admitted>,
    pass: &mut Pass,
) -> Vec<(ObjectKey, String)> {
    let rule_name = resolved.key.to_string();
    let policy = resolved.conflict_policy;
    let concurrency = site.cluster.writer.concurrency();
    let mut results = futures::stream::iter(admitted)
        .map(|(copy, kind, action)| {
            let rule_name = rule_name.clone();
            async move {
                let outcome = site
                    .cluster
                    .writer
                    .execute(kind, &action, policy, &rule_name)
                    .await;
                (copy, kind, action, outcome)
            }
        })
        .buffer_unordered(concurrency);
    let mut new_conflicts = Vec::new();
    while let Some((copy, kind, action, outcome)) = results.next().await {
        if let Some(conflict) = take_outcome(site, resolved, pass, (copy, kind, action), outcome) {
            new_conflicts.push(conflict);
        }
    }
    new_conflicts
}

/// One write's outcome into the rule's tally, the copy's backoff, the
/// view of copies (write-through) and the pass's counts; a conflict met
/// is returned.
fn take_outcome(
    site: &Site,
    resolved: &ResolvedRule,
    pass: &mut Pass,
    (copy, kind, action): Admitted,
    outcome: Outcome,
) -> Option<(ObjectKey, String)> {
    let (namespace, name) = action.target();
    let settles =
        kind == resolved.kind && matches!(outcome, Outcome::Written(_) | Outcome::Ignored(_));
    if settles {
        lock(&site.memory)
            .entry(resolved.key.clone())
            .or_default()
            .tally
            .settle(namespace, name);
    }
    match outcome {
        Outcome::Written(object) => {
            if lock(&site.backoffs).succeeded(&copy, Instant::now()) {
                // A refusal was lifted: the rule's other refused copies
                // go in the next pass, at once.
                pass.retry_no_later_than(Instant::now());
            }
            // Write-through: the next pass sees our write even before its watch event.
            write_through(site, kind, &action, object);
            if resolved.restart_consumers && kind == resolved.kind {
                note_changed(pass, namespace, &action);
            }
            match action {
                Action::Create { .. } => pass.created += 1,
                Action::Update { .. } | Action::Recreate { .. } => pass.updated += 1,
                Action::Delete { reason, .. } if reason.is_prune() => pass.pruned += 1,
                Action::Delete { .. } => pass.deleted += 1,
                Action::HandOver { .. } => pass.handed_over += 1,
            }
        }
        Outcome::Conflict(reason) => {
            // No write is owed there any more: an earlier failure is moot.
            lock(&site.backoffs).no_longer_owed(&copy);
            return Some(((namespace.to_owned(), name.to_owned()), reason));
        }
        Outcome::Failed(failure) => {
            let at = lock(&site.backoffs).failed(
                &copy,
                &resolved.key,
                wanted_hash(&action),
                failure.clone(),
                Instant::now(),
            );
            pass.retry_no_later_than(at);
            pass.failed.push((describe_target(kind, &action), failure));
        }
        Outcome::NotLeader => pass.not_leader += 1,
        Outcome::Ignored(_) => {}
    }
    None
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

/// The conflicts the writes met join the rule's tally and memory; a
/// target that is ours now is no conflict any more. Returns the places
/// whose conflict is not believed (what the write met went, or may have
/// gone unseen, meanwhile): their writes stay owed.
fn remember_conflicts(
    site: &Site,
    rule: &CopyratorRule,
    resolved: &ResolvedRule,
    new_conflicts: Vec<(ObjectKey, String)>,
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
    let copies = read(site.cluster.views.copies(resolved.kind));
    memory.known_conflicts.retain(|(ns, name)| {
        copies
            .get(ns, name)
            .is_none_or(|c| c.rule_uid() != rule.uid())
    });
    doubted
}

/// The rule's counts and conflicts after a pass, from its tally: exact
/// whatever part of the rule the pass looked at.
fn finish(site: &Site, resolved: &ResolvedRule, pass: &mut Pass, plan: Plan) {
    let counts = lock(&site.memory)
        .get(&resolved.key)
        .map(|m| m.tally.counts(&plan));
    if let Some(counts) = counts {
        pass.copies = counts.copies;
        pass.conflicts = counts.conflicts;
    } else {
        pass.conflicts = plan.shadowed.clone();
    }
    pass.plan = plan;
}

/// Publish the status if its content changed; returns whether it did.
pub(crate) async fn publish_status(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    observed: &Observed,
) -> Result<Published, Error> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let next = status::compute(rule.status.as_ref(), observed, &now);
    let key = rule.key();
    let current = rule.status.as_ref();
    let unchanged = current.is_some_and(|s| status::same_content(s, &next));
    let counts_only = current.is_some_and(|s| status::counts_only(s, &next));
    let timing = status_timing(
        &mut lock(&shared.home.memory),
        &key,
        unchanged,
        counts_only,
        Instant::now(),
    );
    match timing {
        StatusTiming::Unchanged => return Ok(Published::Unchanged),
        StatusTiming::Later(wait) => return Ok(Published::Later(wait)),
        StatusTiming::Now => {}
    }
    if !shared.leader.is_leader() {
        return Ok(Published::Unchanged);
    }
    let api: Api<CopyratorRule> =
        Api::namespaced(shared.home.cluster.write_client.clone(), &key.namespace);
    let body = json!({
        "apiVersion": format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
        "kind": crate::api::KIND,
        "status": next,
    });
    let _slot = shared.home.cluster.writer.other_slot().await;
    shared
        .metrics
        .write(&shared.options.cluster_name, "patch", "CopyratorRule");
    let updated = api
        .patch_status(
            &key.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::Status {
            rule: key.to_string(),
            source,
        })?;
    log_transition(&key, rule.status.as_ref(), &next);
    // The rule as it is now, so the next pass compares with what we wrote
    // (older than what the watch holds is ignored).
    shared.take_status_answer(key, Arc::new(updated));
    Ok(Published::Written)
}

/// When a rule's new status goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StatusTiming {
    /// Nothing new to say.
    Unchanged,
    Now,
    /// New counts alone: they wait this long more.
    Later(Duration),
}

/// New counts alone wait a moment, so that a burst of changes (a new
/// namespace that 1,000 rules copy into) costs one status write per rule,
/// after its copies, not one before each next rule's copies; anything else
/// new goes out at once. Keeps the rule's due time in its memory.
fn status_timing(
    memory: &mut HashMap<RuleKey, crate::controller::site::RuleMemory>,
    key: &RuleKey,
    unchanged: bool,
    counts_only: bool,
    now: Instant,
) -> StatusTiming {
    if counts_only && !unchanged {
        let due = *memory
            .entry(key.clone())
            .or_default()
            .counts_due
            .get_or_insert(now + COUNTS_STATUS_AFTER);
        let wait = due.saturating_duration_since(now);
        if !wait.is_zero() {
            return StatusTiming::Later(wait);
        }
    }
    if let Some(memory) = memory.get_mut(key) {
        memory.counts_due = None;
    }
    if unchanged {
        StatusTiming::Unchanged
    } else {
        StatusTiming::Now
    }
}

/// What became of a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Published {
    Written,
    /// Nothing new to say (or not ours to say: a standby, a plan).
    Unchanged,
    /// Only counts changed: written on a pass this much later.
    Later(Duration),
}

impl Published {
    /// When the rule wants another pass for its status.
    pub(crate) fn again_in(self) -> Option<Duration> {
        match self {
            Published::Later(wait) => Some(wait),
            _ => None,
        }
    }
}

/// One line when a rule's Ready condition changes status or reason: at
/// info when it comes to a verdict (True or False), at debug while it is
/// Unknown (a rule waiting a moment for its sources at start), so that
/// 1,000 rules starting log one verdict each, not two lines more.
fn log_transition(key: &RuleKey, previous: Option<&RuleStatus>, next: &RuleStatus) {
    let ready = |s: &RuleStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let Some((status, reason, message)) = ready(next) else {
        return;
    };
    let before = previous.and_then(ready);
    if before
        .as_ref()
        .is_some_and(|(s, r, _)| *s == status && *r == reason)
    {
        return;
    }
    let was = before.as_ref().map_or("", |(s, _, _)| s.as_str());
    if status == "Unknown" {
        debug!(rule = %key, ready = status.as_str(), reason = reason.as_str(), detail = message.as_str(), was, "rule readiness changed");
    } else {
        info!(rule = %key, ready = status.as_str(), reason = reason.as_str(), detail = message.as_str(), was, "rule readiness changed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn entry(n: usize) -> ConflictEntry {
        ConflictEntry {
            cluster: None,
            namespace: format!("t{n}"),
            name: "cfg".into(),
            reason: "another object holds the name".into(),
        }
    }

    #[test]
    fn a_pass_says_its_news_in_few_events_and_in_order() {
        let pass = Pass {
            pruned: 2,
            ..Pass::default()
        };
        let said = Said {
            kind: Kind::ConfigMap,
            new_conflicts: (0..7).map(entry).collect(),
            new_refusals: (0..7).rev().map(entry).collect(),
            contests: vec![(Kind::ConfigMap, "t1".into(), "cfg".into(), "kubectl".into())],
        };
        let events = said.events(&pass);
        let reasons: Vec<&str> = events.iter().map(|(_, reason, ..)| *reason).collect();
        assert_eq!(
            reasons,
            [
                "SourceRefused",
                "ConflictSkipped",
                "ConflictSkipped",
                "ConflictSkipped",
                "ConflictSkipped",
                "ConflictSkipped",
                "Pruned",
                "CopyContested"
            ],
            "seven refusals in one Event, five of seven conflicts, no failure to tell"
        );
        let refused = &events[0].3;
        assert!(
            refused.starts_with("7 sources are not copied: ConfigMap t0/cfg"),
            "{refused}"
        );
        assert_eq!(
            refused.matches("ConfigMap t").count(),
            5,
            "five named: {refused}"
        );
        assert_eq!(events[6].3, "deleted 2 copies that no longer belong");
    }
    use serde_json::{Value, json};

    #[test]
    fn new_counts_wait_a_moment_and_anything_else_goes_at_once() {
        let mut memory: HashMap<RuleKey, crate::controller::site::RuleMemory> = HashMap::new();
        let key = RuleKey {
            namespace: "ns".into(),
            name: "r".into(),
        };
        let start = Instant::now();
        // New counts alone wait; the wait runs from the first time asked.
        assert_eq!(
            status_timing(&mut memory, &key, false, true, start),
            StatusTiming::Later(COUNTS_STATUS_AFTER)
        );
        let half = COUNTS_STATUS_AFTER / 2;
        assert_eq!(
            status_timing(&mut memory, &key, false, true, start + half),
            StatusTiming::Later(COUNTS_STATUS_AFTER - half)
        );
        // Then they go, and the next counts wait afresh.
        let due = start + COUNTS_STATUS_AFTER;
        assert_eq!(
            status_timing(&mut memory, &key, false, true, due),
            StatusTiming::Now
        );
        assert_eq!(memory[&key].counts_due, None);
        assert_eq!(
            status_timing(&mut memory, &key, false, true, due),
            StatusTiming::Later(COUNTS_STATUS_AFTER)
        );
        // A change of readiness goes at once, and takes the waiting counts along.
        assert_eq!(
            status_timing(&mut memory, &key, false, false, due),
            StatusTiming::Now
        );
        assert_eq!(memory[&key].counts_due, None);
        // Nothing new: nothing written, nothing left waiting.
        status_timing(&mut memory, &key, false, true, due);
        assert_eq!(
            status_timing(&mut memory, &key, true, false, due),
            StatusTiming::Unchanged
        );
        assert_eq!(memory[&key].counts_due, None);
    }

    fn rule_with_ready(generation: i64, ready: Option<Value>, last_sync: &str) -> CopyratorRule {
        let mut body = json!({
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
            "metadata": {"name": "r", "namespace": "copyrator", "uid": "u1", "generation": generation},
            "ruleType": "configmap",
            "selector": {"copyrator": "true"},
            "namespace": "default"
        });
        if let Some(ready) = ready {
            body["status"] = json!({"conditions": [ready], "lastSyncTime": last_sync});
        }
        serde_json::from_value(body).expect("test rule parses")
    }

    fn ready(reason: &str, generation: i64) -> Value {
        json!({"type": "Ready", "status": "True", "reason": reason, "message": "m", "observedGeneration": generation})
    }

    fn ago(seconds: i64) -> String {
        (chrono::Utc::now() - chrono::Duration::seconds(seconds)).to_rfc3339()
    }

    #[test]
    fn a_new_rule_or_a_new_generation_hears_that_it_waits() {
        assert!(waiting_worth_saying(&rule_with_ready(1, None, "")));
        assert!(waiting_worth_saying(&rule_with_ready(
            2,
            Some(ready("Synced", 1)),
            &ago(1)
        )));
    }

    #[test]
    fn a_synced_status_of_this_generation_is_left_alone_while_sources_relist() {
        assert!(!waiting_worth_saying(&rule_with_ready(
            3,
            Some(ready("Synced", 3)),
            &ago(600)
        )));
        assert!(!waiting_worth_saying(&rule_with_ready(
            3,
            Some(ready("SyncFailed", 3)),
            &ago(600)
        )));
    }

    #[test]
    fn waiting_counts_are_refreshed_at_most_every_few_seconds() {
        assert!(!waiting_worth_saying(&rule_with_ready(
            1,
            Some(ready("WaitingForSources", 1)),
            &ago(1)
        )));
        assert!(waiting_worth_saying(&rule_with_ready(
            1,
            Some(ready("WaitingForSources", 1)),
            &ago(6)
        )));
    }
}
