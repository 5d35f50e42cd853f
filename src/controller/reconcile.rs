//! What a rule says, once per rule at home: its cleanup when deleted, its
//! finalizer, its sources; then the pass in the home cluster
//! ([`cluster_pass`](crate::controller::cluster_pass), the same as in every
//! member), every cluster's report folded into the rule's status, its
//! Events and one summary log line. [`preview`] says what a pass would do,
//! for `copyrator plan`, and writes nothing.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::Error;
use crate::api::kinds::Kind;
use crate::api::rule::{ConflictEntry, CopyratorRule, RuleKey, RuleStatus};
use crate::cache::index::Object;
use crate::cluster::sources::Sources;
use crate::cluster::writer::Sent;
use crate::controller::cluster_pass::{Pass, cluster_pass, preview_plan};
use crate::controller::finalizer::{cleanup, set_finalizer};
use crate::controller::kinds::KindReadiness;
use crate::controller::state::Shared;
use crate::core::identity::Identity;
use crate::core::pass_log::{self, Line, Written};
use crate::core::plan::{self, DeleteReason};
use crate::core::preview::{Preview, Skip};
use crate::core::report::{self, ClusterReport, retry_note};
use crate::core::resolve::{InvalidRule, ResolvedRule};
use crate::core::scope::Scope;
use crate::core::status::{self, Observed};
use crate::sync::{lock, read, write};

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
    let mut resolved = resolved;
    let (sources, unreadable) = match ask_access(shared, &mut resolved, sources).await {
        Ok(readable) => readable,
        Err(unknown) => {
            // Not knowing what the identity may read (or with no account
            // to act as), nothing is copied or pruned: the rule looks
            // again shortly.
            shared.home.queue.carry(key, scope);
            let observed = Observed {
                generation: rule.metadata.generation,
                rule_type: Some(resolved.kind.info().rule_type.to_string()),
                identity: Some(resolved.identity.to_string()),
                copies: read(shared.copies(resolved.copy_kind)).count_owned_by(&uid) as u32,
                problem: Some((unknown.reason().to_owned(), unknown.to_string())),
                ..Default::default()
            };
            publish_status(shared, &rule, &observed).await?;
            return Ok(Some(ACCESS_REVIEW_AGAIN));
        }
    };
    let started = Instant::now();
    let (pass, home) = cluster_pass(shared, &shared.home, &rule, &resolved, &sources, scope).await;
    let failing = pass.failing().count();
    let mut observed = observed_after(shared, &rule, &resolved, &pass, &home);
    say_unreadable(&resolved, &unreadable, &mut observed);
    say_missing_account(shared, &resolved, &mut observed).await;
    // A staged rule's rollouts move on across its clusters; where they
    // stand is recorded before any cluster acts on it.
    let fleet = resolved.stages.as_ref().map(|stages| {
        crate::controller::rollout::advance_fleet(shared, &rule, &resolved, stages, &home)
    });
    if let Some(fleet) = &fleet {
        observed.rollouts.clone_from(&fleet.progress);
        observed.held = fleet.held;
    }
    let precondition = fleet.as_ref().is_some_and(|f| f.changed);
    let published = publish_status_with(shared, &rule, &observed, precondition).await?;
    if published == Published::Written && fleet.as_ref().is_some_and(|f| f.widened) {
        // A stage opened, and is recorded: every cluster writes it now.
        shared.queue_everywhere(key, crate::core::scope::Touch::All);
    }
    log_pass(shared, key, &pass, failing, started.elapsed());
    announce(shared, &rule, &resolved, &pass, &home, &observed).await;
    shared
        .metrics
        .copies_contested
        .set(lock(&shared.home.backoffs).contested_total() as i64);
    let retry = pass
        .retry_at
        .map(|at| at.saturating_duration_since(Instant::now()));
    let retry = sooner(retry, fleet.and_then(|f| f.recheck_in));
    Ok(sooner(retry, published.again_in()))
}

/// The Ready reason of a rule whose identity's reads could not be reviewed.
const ACCESS_REVIEW_FAILED: &str = "AccessReviewFailed";
/// When a rule whose reviews failed looks again.
const ACCESS_REVIEW_AGAIN: Duration = Duration::from_secs(10);
/// The Ready reason of a rule with sources its identity may not `get`.
const SOURCE_NOT_READABLE: &str = "SourceNotReadable";

/// Of `sources`, those the rule's identity may `get` (a rule that writes
/// as the operator reads everything the watches hold), and the others:
/// those are left out of its plan, so a copy of one is pruned as a
/// source gone.
async fn readable(
    shared: &Shared,
    resolved: &ResolvedRule,
    sources: Vec<Arc<Object>>,
) -> Result<(Vec<Arc<Object>>, Vec<Arc<Object>>), crate::cluster::access::ReviewFailed> {
    if resolved.identity == Identity::Operator {
        return Ok((sources, Vec::new()));
    }
    let access = &shared.home.cluster.access;
    let (mut readable, mut unreadable) = (Vec::new(), Vec::new());
    for source in sources {
        let may = access
            .may_get(
                &resolved.identity,
                resolved.kind,
                &source.namespace,
                &source.name,
            )
            .await?;
        if may {
            readable.push(source);
        } else {
            unreadable.push(source);
        }
    }
    Ok((readable, unreadable))
}

/// What the API server says the rule's identity may do, before its pass:
/// where it may write (see [`granted_targets`], kept in `resolved`), and
/// which of `sources` it may read and which not (see [`readable`]).
async fn ask_access(
    shared: &Shared,
    resolved: &mut ResolvedRule,
    sources: Vec<Arc<Object>>,
) -> Result<(Vec<Arc<Object>>, Vec<Arc<Object>>), AccessUnknown> {
    resolved.granted_targets = granted_targets(shared, resolved).await?;
    let (readable, unreadable) = readable(shared, resolved, sources).await?;
    // Refused because the account does not exist: its copies would be
    // pruned (as that account, which is refused too). Asked only after a
    // refusal, so that a pass the reviews allow costs no request more; not
    // knowing (the operator may not read ServiceAccounts) goes on.
    let refused = !unreadable.is_empty()
        || resolved
            .granted_targets
            .as_ref()
            .is_some_and(|granted| granted.is_empty());
    if refused && account_missing(shared, &resolved.identity).await {
        return Err(AccessUnknown::AccountMissing(resolved.identity.to_string()));
    }
    Ok((readable, unreadable))
}

/// Whether the ServiceAccount `identity` names is known not to exist (not
/// knowing, as when the operator may not read ServiceAccounts, is not).
async fn account_missing(shared: &Shared, identity: &Identity) -> bool {
    matches!(
        shared.home.cluster.access.account_exists(identity).await,
        Ok(false)
    )
}

/// Why a rule's pass cannot know what its identity may do.
#[derive(Debug, thiserror::Error)]
enum AccessUnknown {
    #[error(transparent)]
    ReviewFailed(#[from] crate::cluster::access::ReviewFailed),
    #[error(
        "the rule writes as {0}, and that ServiceAccount does not exist: create it, or name \
         another in spec.serviceAccountName; nothing is copied or pruned meanwhile"
    )]
    AccountMissing(String),
}

impl AccessUnknown {
    /// Its Ready reason.
    fn reason(&self) -> &'static str {
        match self {
            Self::ReviewFailed(_) => ACCESS_REVIEW_FAILED,
            Self::AccountMissing(_) => SERVICE_ACCOUNT_MISSING,
        }
    }
}

/// For a rule whose consent is its identity's rights: the namespaces its
/// targets match, not accepting it by annotation, where its ServiceAccount
/// may create the kind (`None` for any other rule).
async fn granted_targets(
    shared: &Shared,
    resolved: &ResolvedRule,
) -> Result<Option<Arc<BTreeSet<String>>>, crate::cluster::access::ReviewFailed> {
    if !resolved.consent_by_rights {
        return Ok(None);
    }
    let candidates: Vec<String> = {
        let namespaces = read(&shared.home.cluster.views.namespaces);
        plan::targets_to_ask(resolved, &namespaces)
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let access = &shared.home.cluster.access;
    let mut granted = BTreeSet::new();
    for namespace in candidates {
        if access
            .may_create_in(&resolved.identity, resolved.copy_kind, &namespace)
            .await?
        {
            granted.insert(namespace);
        }
    }
    Ok(Some(Arc::new(granted)))
}

/// A rule whose writes as a ServiceAccount were refused: if that account
/// does not exist, its status says so rather than the refusals it led to
/// (refused reads were asked about before the pass: [`ask_access`]).
async fn say_missing_account(shared: &Shared, resolved: &ResolvedRule, observed: &mut Observed) {
    let failed = observed.problem.as_ref().is_some_and(|(reason, _)| {
        ["SyncFailed", report::IMPERSONATION_REFUSED].contains(&reason.as_str())
    });
    if !failed || resolved.identity == Identity::Operator {
        return;
    }
    if account_missing(shared, &resolved.identity).await {
        observed.problem = Some((
            SERVICE_ACCOUNT_MISSING.to_owned(),
            format!(
                "the rule writes as {}, and that ServiceAccount does not exist: create it, \
                 or name another in spec.serviceAccountName",
                resolved.identity
            ),
        ));
    }
}

/// The Ready reason of a rule whose ServiceAccount does not exist.
const SERVICE_ACCOUNT_MISSING: &str = "ServiceAccountMissing";

/// The sources the rule's identity may not read, in its status: each
/// among the refused sources, and the Ready condition's reason unless a
/// failure comes first.
fn say_unreadable(resolved: &ResolvedRule, unreadable: &[Arc<Object>], observed: &mut Observed) {
    let Some(first) = unreadable.first() else {
        return;
    };
    let why = format!("{} may not get it", resolved.identity);
    observed
        .refused_sources
        .extend(unreadable.iter().map(|source| ConflictEntry {
            cluster: None,
            namespace: source.namespace.to_string(),
            name: source.name.to_string(),
            reason: why.clone(),
        }));
    if observed.problem.is_none() {
        observed.problem = Some((
            SOURCE_NOT_READABLE.to_owned(),
            format!(
                "{} may not get {} of the sources; first: {} {}/{}: not copied until a Role grants it get",
                resolved.identity,
                unreadable.len(),
                resolved.kind,
                first.namespace,
                first.name
            ),
        ));
    }
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
        let mut notes = lock(&shared.notes);
        let memory = notes.entry(key.clone()).or_default();
        match sources {
            Sources::Listed(_) | Sources::TooLarge(_) => {
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
        // Nothing is done for the rule: its copies stay as they are, and
        // its status says why. Its watch queues it again once they fit.
        Sources::TooLarge(why) => {
            let observed = Observed {
                generation: rule.metadata.generation,
                rule_type: Some(resolved.kind.info().rule_type.to_string()),
                identity: Some(resolved.identity.to_string()),
                copies: read(shared.copies(resolved.copy_kind)).count_owned_by(uid) as u32,
                problem: Some((SOURCES_TOO_LARGE.to_string(), why)),
                ..Default::default()
            };
            shared.home.queue.carry(key, scope);
            let published = publish_status(shared, rule, &observed).await?;
            return Ok(SourcesWait::Again(published.again_in()));
        }
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
                identity: Some(resolved.identity.to_string()),
                copies: read(shared.copies(resolved.copy_kind)).count_owned_by(uid) as u32,
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

/// The Ready reason of a tenant rule whose namespace's sources are past
/// what the operator holds for it (`--max-tenant-source-mib`).
const SOURCES_TOO_LARGE: &str = "SourcesTooLarge";

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
                "matching the sources' keys (labels and annotations by transform.stripLabels, \
                 transform.stripAnnotations and --strip-keys; data keys by \
                 transform.keys.include and .exclude) takes more than the {} glob steps a \
                 pass may spend; nothing is written or deleted: use fewer or simpler \
                 patterns, or sources with fewer or shorter keys",
                plan::GLOB_STEPS_PER_PASS
            ),
        )
    });
    members_off
        .or(too_costly)
        .or_else(|| report::sync_failed(pass.failing()))
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
        identity: Some(resolved.identity.to_string()),
        sources: pass.plan.sources,
        target_namespaces: total.target_namespaces,
        copies: total.copies,
        create_only_copies: total.create_only_copies,
        adopted_copies: total.adopted_copies,
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
        rollouts: Vec::new(),
        held: pass.rollout.as_ref().map_or(0, |g| g.held),
        staged: Some(resolved.stages.is_some()),
        rolled_out: home.rolled_out.clone(),
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
        adopted_copies: Kind::all()
            .map(|kind| read(shared.copies(kind)).count_adopted(uid) as u32)
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
        } => {
            let mut resolved = resolved;
            let (sources, unreadable) = match ask_access(shared, &mut resolved, sources).await {
                Ok(readable) => readable,
                Err(unknown) => {
                    return Ok(Preview::Refused {
                        reason: unknown.reason().to_owned(),
                        message: unknown.to_string(),
                    });
                }
            };
            let mut preview = preview_plan(
                shared,
                &shared.home,
                &resolved,
                &sources,
                &Default::default(),
            )
            .await?;
            if let Preview::Planned { skipped, .. } = &mut preview {
                let rule = resolved.key.to_string();
                let cluster = &shared.options.cluster_name;
                let why = format!("{} may not get it", resolved.identity);
                skipped.extend(unreadable.iter().map(|source| {
                    let source = format!("{}/{}", source.namespace, source.name);
                    Skip::source(cluster, &rule, resolved.kind, &source, &why)
                }));
            }
            Ok(preview)
        }
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
            &rule.identity(&shared.trust),
        )
    } else {
        Vec::new()
    };
    Preview::Planned {
        changes,
        skipped: Vec::new(),
    }
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
        let mut notes = lock(&shared.notes);
        let memory = notes.entry(key.clone()).or_default();
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
    // An admin rule that adopts gives whoever writes its sources outside
    // the operator's namespace the objects it adopts (docs/trust.md).
    let adopting_for: Vec<String> = if resolved.tenant {
        Vec::new()
    } else {
        resolved
            .source_namespaces
            .iter()
            .filter(|ns| **ns != shared.trust.operator_namespace)
            .cloned()
            .collect()
    };
    let said = Said {
        kind: resolved.copy_kind,
        source_kind: resolved.kind,
        adopting_for,
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
    let mut notes = lock(&shared.notes);
    let memory = notes.entry(key.clone()).or_default();
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
    /// The kind of the rule's copies, and of its sources.
    kind: Kind,
    source_kind: Kind,
    /// The source namespaces outside the operator's own of an admin rule:
    /// their writers choose what its adoptions take over.
    adopting_for: Vec<String>,
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
                .map(|r| {
                    let source_kind = self.source_kind;
                    format!("{source_kind} {}/{} ({})", r.namespace, r.name, r.reason)
                })
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
        if pass.adopted > 0 {
            let note = format!(
                "adopted {} objects that already held what the rule writes (spec.adopt): one metadata patch each, no payload written",
                pass.adopted
            );
            events.push((EventType::Normal, "Adopted", "Adopt", note));
            if !self.adopting_for.is_empty() {
                let note = format!(
                    "whoever may write sources in {} chose what these adoptions took over, and can now rewrite or delete it through them; keep spec.adopt only while migrating, over sources only the platform team writes",
                    self.adopting_for.join(", ")
                );
                events.push((EventType::Warning, "AdoptedForSourceWriters", "Adopt", note));
            }
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

/// Publish the status if its content changed; returns whether it did.
pub(crate) async fn publish_status(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    observed: &Observed,
) -> Result<Published, Error> {
    publish_status_with(shared, rule, observed, false).await
}

/// [`publish_status`], with the rule's `resourceVersion` as a
/// precondition when `precondition`: a status that records where rollouts
/// stand goes out only over the rule it was judged from.
async fn publish_status_with(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    observed: &Observed,
    precondition: bool,
) -> Result<Published, Error> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let next = status::compute(rule.status.as_ref(), observed, &now);
    let key = rule.key();
    let current = rule.status.as_ref();
    let unchanged = current.is_some_and(|s| status::same_content(s, &next));
    let counts_only = current.is_some_and(|s| status::counts_only(s, &next));
    let timing = status_timing(
        &mut lock(&shared.notes),
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
    let sent = shared
        .home
        .cluster
        .writer
        .rule_status(rule, &next, precondition)
        .await
        .map_err(|source| Error::Status {
            rule: key.to_string(),
            source,
        })?;
    let Sent::Answered(updated) = sent else {
        // Not ours to say: a standby.
        return Ok(Published::Unchanged);
    };
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
    memory: &mut HashMap<RuleKey, crate::controller::site::RuleNotes>,
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
            source_kind: Kind::ConfigMap,
            adopting_for: Vec::new(),
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
    #[test]
    fn an_admin_rule_adopting_over_others_sources_warns_whose_choice_it_was() {
        let pass = Pass {
            adopted: 3,
            ..Pass::default()
        };
        let said = |adopting_for: Vec<String>| Said {
            kind: Kind::Secret,
            source_kind: Kind::Secret,
            adopting_for,
            new_conflicts: Vec::new(),
            new_refusals: Vec::new(),
            contests: Vec::new(),
        };
        let reasons = |events: Vec<EventNote>| -> Vec<&'static str> {
            events.iter().map(|(_, reason, ..)| *reason).collect()
        };
        assert_eq!(reasons(said(Vec::new()).events(&pass)), ["Adopted"]);
        let events = said(vec!["team-a".into()]).events(&pass);
        assert_eq!(events[1].0, EventType::Warning);
        assert_eq!(
            reasons(events.clone()),
            ["Adopted", "AdoptedForSourceWriters"]
        );
        assert!(events[1].3.contains("team-a"), "{}", events[1].3);
        assert_eq!(
            reasons(said(vec!["team-a".into()]).events(&Pass::default())),
            Vec::<&str>::new(),
            "nothing adopted, nothing to say"
        );
    }

    use serde_json::{Value, json};

    #[test]
    fn new_counts_wait_a_moment_and_anything_else_goes_at_once() {
        let mut memory: HashMap<RuleKey, crate::controller::site::RuleNotes> = HashMap::new();
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

#[cfg(test)]
mod passes;
