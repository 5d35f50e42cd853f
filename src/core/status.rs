//! A rule's status from what its reconcile saw and did (pure).

use std::collections::BTreeMap;

use crate::api::rule::{
    ClusterStatus, Condition, ConflictEntry, ContestedEntry, RolloutStatus, RuleStatus,
};
use crate::core::report::ClusterReport;
use crate::core::rollout::{Phase, Progress};

/// Conflicts listed in the status; the count says how many there are in all.
pub(crate) const MAX_LISTED_CONFLICTS: usize = 20;

/// What one reconcile of a rule found.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Observed {
    /// Whether the rule has stages (`None`: not known, a refused rule):
    /// what it rolled out is kept while it has, and dropped once not.
    pub(crate) staged: Option<bool>,
    pub(crate) generation: Option<i64>,
    pub(crate) rule_type: Option<String>,
    /// Whom the rule's writes are sent as, once it resolved.
    pub(crate) identity: Option<String>,
    pub(crate) sources: u32,
    pub(crate) target_namespaces: u32,
    pub(crate) copies: u32,
    /// Copies handed over to their namespaces (`syncPolicy: CreateOnly`).
    pub(crate) create_only_copies: u32,
    /// Copies the rule adopted (`spec.adopt`).
    pub(crate) adopted_copies: u32,
    pub(crate) conflicts: Vec<ConflictEntry>,
    /// `(reason, message)` when the rule is not fully synced.
    pub(crate) problem: Option<(String, String)>,
    /// Copies still to be written (requeued for another pass).
    pub(crate) pending: u32,
    /// Copies another writer keeps changing back.
    pub(crate) contested: Vec<ContestedEntry>,
    /// Namespaces left out as protected.
    pub(crate) protected_namespaces: u32,
    /// Namespaces left out because they do not accept the tenant rule.
    pub(crate) not_accepting_namespaces: u32,
    /// Sources not copied for their type (`namespace`, `name`, `reason`).
    pub(crate) refused_sources: Vec<ConflictEntry>,
    /// The sources are still being listed: `(namespaces listed, of)`.
    pub(crate) waiting_for_sources: Option<(usize, usize)>,
    /// What is wrong while the sources are not listed: "the last try
    /// failed: …", or why the rule is not watched.
    pub(crate) sources_failing: Option<String>,
    /// How the rule stands in each member cluster it targets (none for a
    /// rule of this cluster alone).
    pub(crate) clusters: Vec<ClusterStatus>,
    /// The sources whose new content is on its way through the rule's
    /// stages, and how many writes the stages hold back.
    pub(crate) rollouts: Vec<Progress>,
    pub(crate) held: u32,
    /// What a staged rule's pass at home found it rolled out (`None`: no
    /// pass found it; the status keeps what it held).
    pub(crate) rolled_out: Option<BTreeMap<String, String>>,
}

/// The status to publish, keeping transition times when nothing transitioned.
pub(crate) fn compute(previous: Option<&RuleStatus>, observed: &Observed, now: &str) -> RuleStatus {
    let (status, reason, message) = readiness(observed);
    let previous_ready = previous.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let last_transition_time = match previous_ready {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Some(now.to_string()),
    };
    let (conflicts, conflict_count) = listed(&observed.conflicts);
    let (contested, contested_count) = listed(&observed.contested);
    let (refused_sources, refused_source_count) = listed(&observed.refused_sources);
    let mut next = RuleStatus {
        observed_generation: observed.generation,
        rule_type: observed.rule_type.clone(),
        identity: observed.identity.clone(),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason,
            message,
            last_transition_time,
            observed_generation: observed.generation,
        }],
        sources: i64::from(observed.sources),
        target_namespaces: i64::from(observed.target_namespaces),
        copies: i64::from(observed.copies),
        create_only_copies: i64::from(observed.create_only_copies),
        adopted_copies: i64::from(observed.adopted_copies),
        conflict_count,
        conflicts,
        contested_count,
        contested,
        protected_namespaces: i64::from(observed.protected_namespaces),
        not_accepting_namespaces: i64::from(observed.not_accepting_namespaces),
        refused_source_count,
        refused_sources,
        last_sync_time: previous.and_then(|s| s.last_sync_time.clone()),
        clusters: (!observed.clusters.is_empty()).then(|| observed.clusters.clone()),
        clusters_ready: (!observed.clusters.is_empty()).then(|| {
            let ready = observed.clusters.iter().filter(|c| c.ready).count();
            format!("{ready}/{}", observed.clusters.len())
        }),
        // Every rollout under way is recorded (a replica that takes the
        // Lease goes on from here), up to a bound far below an object's
        // limit; past the first few, without their clusters.
        rollouts: observed
            .rollouts
            .iter()
            .take(MAX_RECORDED_ROLLOUTS)
            .enumerate()
            .map(|(i, progress)| {
                let mut status = rollout_status(progress);
                if i >= MAX_LISTED_CONFLICTS {
                    status.clusters.clear();
                }
                status
            })
            .collect(),
        rolled_out: BTreeMap::new(),
    };
    keep_rolled_out(previous, observed, &mut next);
    if previous.is_none_or(|p| !same_content(p, &next)) {
        next.last_sync_time = Some(now.to_string());
    }
    next
}

/// What the rule rolled out, at home and in each member: as its passes
/// found it where they report it, else as the status kept it (a status
/// written without a pass, or a member that did not report); nothing once
/// the rule has no stages.
fn keep_rolled_out(previous: Option<&RuleStatus>, observed: &Observed, next: &mut RuleStatus) {
    if observed.staged.is_none() {
        // Not a pass: where the rollouts stand is kept as recorded.
        next.rollouts = previous.map(|p| p.rollouts.clone()).unwrap_or_default();
    }
    if observed.staged == Some(false) {
        for cluster in next.clusters.iter_mut().flatten() {
            cluster.rolled_out = None;
        }
        return;
    }
    next.rolled_out = match (&observed.rolled_out, previous) {
        (Some(found), _) => found.clone(),
        (None, Some(previous)) => previous.rolled_out.clone(),
        (None, None) => BTreeMap::new(),
    };
    for cluster in next.clusters.iter_mut().flatten() {
        if cluster.rolled_out.is_none() {
            cluster.rolled_out = previous
                .and_then(|p| p.clusters.as_ref())
                .and_then(|clusters| clusters.iter().find(|c| c.name == cluster.name))
                .and_then(|c| c.rolled_out.clone());
        }
    }
}

/// The Ready condition's `(status, reason, message)`, from the first that
/// holds of: a problem, the sources still being listed, writes still owed,
/// copies contested, conflicts; else the rule is synced.
fn readiness(observed: &Observed) -> (&'static str, String, String) {
    if let Some(halted) = rollout_halted(observed) {
        return halted;
    }
    if let Some((reason, message)) = &observed.problem {
        return ("False", reason.clone(), message.clone());
    }
    if let Some(reason) = members_not_ready(&observed.clusters) {
        return reason;
    }
    if let Some(awaiting) = rollout_awaiting(observed) {
        return awaiting;
    }
    if let Some(progressing) = rollout_progressing(observed) {
        return progressing;
    }
    if let Some((listed, of)) = observed.waiting_for_sources {
        let mut message = format!("listing the sources: {listed} of {of} source namespaces listed");
        if let Some(failing) = &observed.sources_failing {
            message.push_str("; ");
            message.push_str(failing);
        }
        return ("Unknown", "WaitingForSources".to_string(), message);
    }
    if observed.pending > 0 {
        return (
            "False",
            "Progressing".to_string(),
            format!("{} copies still to be written", observed.pending),
        );
    }
    if let Some((reason, message)) = contested_problem(&observed.contested) {
        return ("False", reason, message);
    }
    if !observed.conflicts.is_empty() {
        return (
            "True",
            "SyncedWithConflicts".to_string(),
            format!(
                "{} copies in place in {} namespaces; {} skipped: another object holds the name, or the copy would grant there what its source does not (conflicts says which)",
                observed.copies,
                observed.target_namespaces,
                observed.conflicts.len()
            ),
        );
    }
    (
        "True",
        "Synced".to_string(),
        format!(
            "{} copies of {} sources in place in {} namespaces",
            observed.copies, observed.sources, observed.target_namespaces
        ),
    )
}

/// Why a rule is not ready while other writers keep changing its copies
/// back (at home, or in a member: the same words in its entry), if they do.
pub(crate) fn contested_problem(contested: &[ContestedEntry]) -> Option<(String, String)> {
    let first = contested.first()?;
    let place = match &first.cluster {
        Some(member) => format!(" in member cluster {member}"),
        None => String::new(),
    };
    Some((
        "CopiesContested".to_string(),
        format!(
            "{} copies are changed back by another writer (first: {}/{}{place} by {}); Copyrator restores them with growing delays",
            contested.len(),
            first.namespace,
            first.name,
            first.writer
        ),
    ))
}

/// Whether a member's API server answers, as its entry in a rule's status
/// says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reachability<'a> {
    /// Not asked yet, or its first answer is on its way.
    Connecting,
    Reachable,
    /// Its last probe failed: in what words, and why.
    Unreachable {
        message: &'a str,
        why: Unanswered,
    },
}

/// Why a member's last probe failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// No answer, or one that is no Kubernetes answer.
    NoAnswer,
    /// It answered, refusing the credentials (401 or 403).
    CredentialsRefused,
    /// The credential plugin that gives its token gave none: nothing was
    /// sent.
    NoCredentials,
}

impl Reachability<'_> {
    /// The reason a rule's status gives for a member in this state.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Reachability::Unreachable { why, .. } => match why {
                Unanswered::NoAnswer => "ClusterUnreachable",
                Unanswered::CredentialsRefused => "CredentialsRefused",
                Unanswered::NoCredentials => "CredentialPluginFailed",
            },
            Reachability::Connecting => "Progressing",
            Reachability::Reachable => "Synced",
        }
    }
}

/// A member's entry that is not ready, for `reason`.
pub(crate) fn not_ready(name: &str, reason: &str, message: String) -> ClusterStatus {
    ClusterStatus {
        name: name.to_owned(),
        ready: false,
        reason: Some(reason.to_owned()),
        message: Some(message),
        ..ClusterStatus::default()
    }
}

/// A member's entry in a rule's status: how it answers, and what the
/// rule's latest pass there reported, in the words of the rule's own
/// `Ready` condition (a failed write, contested copies, conflicts).
pub(crate) fn cluster_entry(
    name: &str,
    reach: &Reachability<'_>,
    report: Option<&ClusterReport>,
) -> ClusterStatus {
    let counts = |status: ClusterStatus, report: &ClusterReport| ClusterStatus {
        target_namespaces: report.target_namespaces,
        copies: report.copies,
        conflicts: report.conflicts.len() as u32,
        create_only_copies: report.create_only_copies,
        adopted_copies: report.adopted_copies,
        contested: report.contested.len() as u32,
        rolled_out: report.rolled_out.clone(),
        ..status
    };
    if let Reachability::Unreachable { message, why } = *reach {
        let status = unanswered(name, message, why);
        // Its counts are the last it reported.
        return match report {
            Some(report) => counts(status, report),
            None => status,
        };
    }
    let Some(report) = report else {
        let message = if *reach == Reachability::Connecting {
            "connecting; its namespaces and copies are being listed"
        } else {
            "it answers; its namespaces and copies are being listed, or the rule's first pass there runs"
        };
        return not_ready(name, "Progressing", message.to_owned());
    };
    if *reach == Reachability::Connecting {
        // Its report counts in the rule's totals: so in its entry.
        let status = not_ready(
            name,
            "Progressing",
            "connecting; its namespaces and copies are being listed".to_owned(),
        );
        return counts(status, report);
    }
    let problem = report
        .problem
        .clone()
        .or_else(|| contested_problem(&report.contested));
    let status = match problem {
        Some((reason, message)) => not_ready(name, &reason, message),
        None => ClusterStatus {
            name: name.to_owned(),
            ready: true,
            reason: Some(
                if report.conflicts.is_empty() {
                    "Synced"
                } else {
                    "SyncedWithConflicts"
                }
                .to_owned(),
            ),
            message: Some(format!(
                "{} copies in place in {} namespaces",
                report.copies, report.target_namespaces
            )),
            ..ClusterStatus::default()
        },
    };
    counts(status, report)
}

fn unanswered(name: &str, message: &str, why: Unanswered) -> ClusterStatus {
    let said = match why {
        Unanswered::NoAnswer => "its API server does not answer",
        Unanswered::CredentialsRefused => "its API server refuses the operator's credentials",
        Unanswered::NoCredentials => "no credentials to reach it",
    };
    let reach = Reachability::Unreachable { message, why };
    not_ready(name, reach.reason(), format!("{said}: {message}"))
}

/// The Ready condition of a staged rollout that halted: `RolloutHalted`,
/// naming the stage and why it has not settled (it comes first: a refused
/// write that keeps a stage from settling says its own message below it).
fn rollout_halted(observed: &Observed) -> Option<(&'static str, String, String)> {
    observed.rollouts.iter().find_map(|p| match &p.phase {
        Phase::Halted(why) => Some((
            "False",
            "RolloutHalted".to_owned(),
            format!(
                "the rollout of {} halted at stage {} ({} of {}): {}; later stages keep their content ({} copies held back)",
                p.source,
                p.stage_name,
                p.stage + 1,
                p.stages,
                why_not_settled(why),
                observed.held
            ),
        )),
        _ => None,
    })
}

/// The Ready condition of a staged rollout that waits for an approval:
/// `RolloutAwaitingApproval`, naming the stage and the annotation to set.
fn rollout_awaiting(observed: &Observed) -> Option<(&'static str, String, String)> {
    observed.rollouts.iter().find_map(|p| match &p.phase {
        Phase::AwaitingApproval => Some((
            "False",
            "RolloutAwaitingApproval".to_owned(),
            format!(
                "the rollout of {} waits to open stage {} ({} of {}): set the rule's annotation {} to {}={}",
                p.source,
                p.stage_name,
                p.stage + 1,
                p.stages,
                crate::core::fleet_rollout::APPROVE_ANNOTATION,
                p.stage_name,
                p.content
            ),
        )),
        _ => None,
    })
}

/// The Ready condition while a staged rollout is under way:
/// `RolloutProgressing`, with the stage and the copies held back.
fn rollout_progressing(observed: &Observed) -> Option<(&'static str, String, String)> {
    let first = observed.rollouts.first()?;
    Some((
        "False",
        "RolloutProgressing".to_owned(),
        format!(
            "{} sources rolling out; {} at stage {} ({} of {}); {} copies held back for later stages",
            observed.rollouts.len(),
            first.source,
            first.stage_name,
            first.stage + 1,
            first.stages,
            observed.held
        ),
    ))
}

/// Rollouts recorded in a status, at most: past them, a rollout is built
/// again from the copies' marks after a restart.
pub(crate) const MAX_RECORDED_ROLLOUTS: usize = 1_000;

/// One source's rollout as the status says it.
/// Workloads named in a halted stage's message, at most.
const MAX_NAMED_NOT_SETTLED: usize = 5;

/// Why a stage has not settled: the first few workloads (or copies), and
/// how many more.
fn why_not_settled(why: &[String]) -> String {
    let named = why
        .iter()
        .take(MAX_NAMED_NOT_SETTLED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match why.len().saturating_sub(MAX_NAMED_NOT_SETTLED) {
        0 => named,
        more => format!("{named} and {more} more"),
    }
}

fn rollout_status(progress: &Progress) -> RolloutStatus {
    let message = match &progress.phase {
        Phase::Halted(why) => Some(why_not_settled(why)),
        Phase::AwaitingApproval => Some(format!(
            "stage {} waits for the rule's annotation {}: {}={}",
            progress.stage_name,
            crate::core::fleet_rollout::APPROVE_ANNOTATION,
            progress.stage_name,
            progress.content
        )),
        Phase::Settling | Phase::Pausing => None,
    };
    RolloutStatus {
        source: progress.source.clone(),
        stage: progress.stage_name.clone(),
        stage_number: progress.stage as u32 + 1,
        stages: progress.stages as u32,
        phase: progress.phase.word().to_owned(),
        message,
        name: Some(progress.name.clone()),
        content: Some(progress.content.clone()),
        opened_at: Some(progress.opened_at.clone()),
        settled_at: progress.settled_at.clone(),
        clusters: progress
            .clusters
            .iter()
            .map(|(name, phase)| crate::core::fleet_rollout::rollout_cluster(name, phase))
            .collect(),
    }
}

/// The Ready condition when member clusters are not ready: unreachable
/// ones first (`ClusterUnreachable`, naming them), else the first other
/// reason, naming the members it holds for.
fn members_not_ready(clusters: &[ClusterStatus]) -> Option<(&'static str, String, String)> {
    let not_ready: Vec<&ClusterStatus> = clusters.iter().filter(|c| !c.ready).collect();
    let first = not_ready.first()?;
    let unreachable: Vec<&str> = not_ready
        .iter()
        .filter(|c| c.reason.as_deref() == Some("ClusterUnreachable"))
        .map(|c| c.name.as_str())
        .collect();
    if !unreachable.is_empty() {
        return Some((
            "False",
            "ClusterUnreachable".to_owned(),
            format!(
                "member clusters unreachable: {}; their copies are written when they answer again",
                unreachable.join(", ")
            ),
        ));
    }
    let reason = first
        .reason
        .clone()
        .unwrap_or_else(|| "ClusterNotReady".to_owned());
    let names: Vec<&str> = not_ready
        .iter()
        .filter(|c| c.reason == first.reason)
        .map(|c| c.name.as_str())
        .collect();
    Some((
        "False",
        reason,
        format!(
            "member clusters not ready: {} ({})",
            names.join(", "),
            first.message.as_deref().unwrap_or_default()
        ),
    ))
}

/// The first [`MAX_LISTED_CONFLICTS`] of `entries` in order, and how many
/// there are in all: a status stays small however many there are.
fn listed<T: Clone + Ord>(entries: &[T]) -> (Vec<T>, i64) {
    let mut listed = entries.to_vec();
    listed.sort();
    let count = listed.len() as i64;
    listed.truncate(MAX_LISTED_CONFLICTS);
    (listed, count)
}

/// Equal but for timestamps: nothing worth a write.
pub(crate) fn same_content(a: &RuleStatus, b: &RuleStatus) -> bool {
    let strip = |s: &RuleStatus| {
        let mut s = s.clone();
        s.last_sync_time = None;
        for c in &mut s.conditions {
            c.last_transition_time = None;
        }
        s
    };
    strip(a) == strip(b)
}

/// Equal but for timestamps and the counts (and the Ready message, which
/// states them): the rule's state is the same, only how much of it there
/// is changed. Such a write may wait a moment and carry a burst of changes.
pub(crate) fn counts_only(a: &RuleStatus, b: &RuleStatus) -> bool {
    let strip = |s: &RuleStatus| {
        let mut s = s.clone();
        s.last_sync_time = None;
        s.sources = 0;
        s.target_namespaces = 0;
        s.copies = 0;
        s.create_only_copies = 0;
        s.protected_namespaces = 0;
        s.not_accepting_namespaces = 0;
        for c in &mut s.conditions {
            c.last_transition_time = None;
            c.message = String::new();
        }
        s
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed() -> Observed {
        Observed {
            generation: Some(2),
            rule_type: Some("configmap".into()),
            sources: 2,
            target_namespaces: 3,
            copies: 6,
            ..Default::default()
        }
    }

    #[test]
    fn a_rollout_awaiting_its_approval_says_which_annotation_opens_it() {
        let o = Observed {
            rollouts: vec![Progress {
                source: "src/cm".into(),
                name: "cm".into(),
                content: "0123456789abcdef".into(),
                stage: 1,
                stage_name: "eu".into(),
                stages: 3,
                phase: Phase::AwaitingApproval,
                opened_at: "2026-11-29T00:00:00.000Z".into(),
                settled_at: None,
                clusters: Vec::new(),
            }],
            staged: Some(true),
            ..Observed::default()
        };
        let s = compute(None, &o, "now");
        let ready = &s.conditions[0];
        assert_eq!(ready.reason, "RolloutAwaitingApproval");
        assert!(
            ready
                .message
                .ends_with("copyrator.flant.com/approve to eu=0123456789abcdef"),
            "{}",
            ready.message
        );
        assert_eq!(s.rollouts[0].phase, "AwaitingApproval");
        assert_eq!(s.rollouts[0].content.as_deref(), Some("0123456789abcdef"));
    }

    #[test]
    fn the_rollouts_listed_and_the_workloads_named_are_bounded() {
        let o = Observed {
            rollouts: (0..100)
                .map(|i| Progress {
                    source: format!("src/cm-{i:03}"),
                    name: format!("cm-{i:03}"),
                    content: "0123456789abcdef".into(),
                    stage: 0,
                    stage_name: "canary".into(),
                    stages: 2,
                    phase: Phase::Halted((0..50).map(|w| format!("Deployment c/w{w}")).collect()),
                    opened_at: "2026-11-29T00:00:00.000Z".into(),
                    settled_at: None,
                    clusters: vec![("home".into(), "Settling"), ("a".into(), "Waiting")],
                })
                .collect(),
            staged: Some(true),
            ..Observed::default()
        };
        let s = compute(None, &o, "now");
        assert_eq!(s.rollouts.len(), 100, "every rollout is recorded");
        assert_eq!(s.rollouts[MAX_LISTED_CONFLICTS - 1].clusters.len(), 2);
        assert!(
            s.rollouts[MAX_LISTED_CONFLICTS].clusters.is_empty(),
            "the clusters of the first few alone"
        );
        let message = s.rollouts[0].message.clone().unwrap_or_default();
        assert_eq!(
            message,
            "Deployment c/w0, Deployment c/w1, Deployment c/w2, Deployment c/w3, Deployment c/w4 and 45 more"
        );
        assert!(s.conditions[0].message.contains("and 45 more"));
    }

    #[test]
    fn count_changes_are_told_apart_from_state_changes() {
        let before = compute(None, &observed(), "t1");
        let more = compute(
            Some(&before),
            &Observed {
                copies: 9,
                target_namespaces: 4,
                ..observed()
            },
            "t2",
        );
        assert!(!same_content(&before, &more));
        assert!(counts_only(&before, &more));
        let failing = compute(
            Some(&before),
            &Observed {
                problem: Some(("SyncFailed".into(), "refused".into())),
                ..observed()
            },
            "t2",
        );
        assert!(!counts_only(&before, &failing), "readiness changed");
        let newer = compute(
            Some(&before),
            &Observed {
                generation: Some(3),
                ..observed()
            },
            "t2",
        );
        assert!(!counts_only(&before, &newer), "another generation");
    }

    #[test]
    fn synced_rule_is_ready() {
        let s = compute(None, &observed(), "t1");
        let ready = &s.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Synced")
        );
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.last_sync_time.as_deref(), Some("t1"));
        assert_eq!(ready.last_transition_time.as_deref(), Some("t1"));
    }

    #[test]
    fn unchanged_status_keeps_its_times_so_nothing_is_written() {
        let first = compute(None, &observed(), "t1");
        let second = compute(Some(&first), &observed(), "t2");
        assert_eq!(first, second);
        let mut more = observed();
        more.copies = 7;
        let third = compute(Some(&second), &more, "t3");
        assert_eq!(third.last_sync_time.as_deref(), Some("t3"));
        assert_eq!(
            third.conditions[0].last_transition_time.as_deref(),
            Some("t1"),
            "still True"
        );
        assert!(!same_content(&second, &third));
    }

    #[test]
    fn a_rule_whose_sources_are_listed_says_so() {
        let mut o = observed();
        o.waiting_for_sources = Some((1, 5000));
        let s = compute(None, &o, "t");
        let ready = &s.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("Unknown", "WaitingForSources")
        );
        assert_eq!(
            ready.message,
            "listing the sources: 1 of 5000 source namespaces listed"
        );
    }

    #[test]
    fn problems_and_conflicts() {
        let mut o = observed();
        o.problem = Some(("InvalidRule".into(), "selector is required".into()));
        let s = compute(None, &o, "t");
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].message, "selector is required");
        let mut o = observed();
        o.conflicts = (0..30)
            .map(|i| ConflictEntry {
                cluster: None,
                namespace: format!("ns{i:02}"),
                name: "x".into(),
                reason: "foreign".into(),
            })
            .collect();
        let s = compute(None, &o, "t");
        assert_eq!(s.conflict_count, 30);
        assert_eq!(s.conflicts.len(), MAX_LISTED_CONFLICTS);
        assert_eq!(s.conditions[0].reason, "SyncedWithConflicts");
    }

    #[test]
    fn contested_copies_are_counted_listed_and_named() {
        let mut o = observed();
        o.contested = vec![ContestedEntry {
            cluster: None,
            namespace: "t1".into(),
            name: "cm".into(),
            writer: "data-fighter".into(),
        }];
        let s = compute(None, &o, "t");
        assert_eq!(s.contested_count, 1);
        assert_eq!(s.contested[0].writer, "data-fighter");
        let ready = &s.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CopiesContested")
        );
        assert!(
            ready.message.contains("t1/cm by data-fighter"),
            "{}",
            ready.message
        );
    }

    fn member_report() -> ClusterReport {
        ClusterReport {
            target_namespaces: 3,
            copies: 2,
            create_only_copies: 1,
            adopted_copies: 2,
            conflicts: vec![ConflictEntry {
                namespace: "t1".into(),
                name: "ca".into(),
                reason: "held".into(),
                ..ConflictEntry::default()
            }],
            contested: Vec::new(),
            problem: None,
            rollout: None,
            held: 0,
            rolled_out: None,
        }
    }

    #[test]
    fn what_a_staged_rule_rolled_out_is_kept_until_a_pass_says_otherwise() {
        let digests = |d: &str| BTreeMap::from([("ca".to_owned(), d.to_owned())]);
        let member = |rolled_out: Option<BTreeMap<String, String>>| ClusterStatus {
            name: "a".into(),
            rolled_out,
            ..ClusterStatus::default()
        };
        let previous = RuleStatus {
            rolled_out: digests("0000000000000001"),
            clusters: Some(vec![member(Some(digests("0000000000000002")))]),
            ..RuleStatus::default()
        };
        // A status written without a pass (the sources still listed) and
        // a member that did not report keep what was there.
        let waiting = Observed {
            staged: Some(true),
            clusters: vec![member(None)],
            ..observed()
        };
        let next = compute(Some(&previous), &waiting, "now");
        assert_eq!(next.rolled_out, previous.rolled_out);
        assert_eq!(next.clusters, previous.clusters);
        // A refused rule's status says nothing of members: home's is kept.
        let refused = compute(Some(&previous), &observed(), "now");
        assert_eq!(refused.rolled_out, previous.rolled_out);
        // A pass replaces it where it reports.
        let passed = Observed {
            staged: Some(true),
            rolled_out: Some(digests("0000000000000003")),
            clusters: vec![member(Some(BTreeMap::new()))],
            ..observed()
        };
        let next = compute(Some(&previous), &passed, "now");
        assert_eq!(next.rolled_out, digests("0000000000000003"));
        assert_eq!(next.clusters, Some(vec![member(Some(BTreeMap::new()))]));
        // Without stages nothing is kept.
        let unstaged = Observed {
            staged: Some(false),
            clusters: vec![member(None)],
            ..observed()
        };
        let next = compute(Some(&previous), &unstaged, "now");
        assert!(next.rolled_out.is_empty());
        assert_eq!(next.clusters, Some(vec![member(None)]));
    }

    #[test]
    fn a_reachable_members_entry_counts_as_its_report_does() {
        let entry = cluster_entry("a", &Reachability::Reachable, Some(&member_report()));
        assert!(entry.ready);
        assert_eq!(entry.reason.as_deref(), Some("SyncedWithConflicts"));
        assert_eq!(
            (
                entry.target_namespaces,
                entry.copies,
                entry.conflicts,
                entry.create_only_copies,
                entry.adopted_copies
            ),
            (3, 2, 1, 1, 2)
        );
    }

    #[test]
    fn contested_copies_in_a_member_are_said_as_at_home() {
        let mut contested = member_report();
        contested.contested = vec![ContestedEntry {
            namespace: "t1".into(),
            name: "ca".into(),
            writer: "kubectl-edit".into(),
            ..ContestedEntry::default()
        }];
        let entry = cluster_entry("a", &Reachability::Reachable, Some(&contested));
        assert!(!entry.ready);
        assert_eq!(entry.reason.as_deref(), Some("CopiesContested"));
        assert_eq!(entry.contested, 1);
        let (_, home_words) = contested_problem(&contested.contested).expect("contested");
        assert_eq!(entry.message, Some(home_words));
    }

    #[test]
    fn a_failed_write_in_a_member_comes_before_its_contested_copies() {
        let mut failing = member_report();
        failing.problem = Some(("SyncFailed".into(), "1 copies could not be written".into()));
        failing.contested = vec![ContestedEntry::default()];
        let entry = cluster_entry("a", &Reachability::Reachable, Some(&failing));
        assert_eq!(entry.reason.as_deref(), Some("SyncFailed"));
    }

    #[test]
    fn an_unanswering_member_keeps_its_last_counts() {
        let down = Reachability::Unreachable {
            message: "connection refused",
            why: Unanswered::NoAnswer,
        };
        let entry = cluster_entry("a", &down, Some(&member_report()));
        assert!(!entry.ready);
        assert_eq!(entry.reason.as_deref(), Some("ClusterUnreachable"));
        assert_eq!(
            entry.message.as_deref(),
            Some("its API server does not answer: connection refused")
        );
        assert_eq!(entry.copies, 2);
        let refused = Reachability::Unreachable {
            message: "Unauthorized",
            why: Unanswered::CredentialsRefused,
        };
        let entry = cluster_entry("a", &refused, None);
        assert_eq!(entry.reason.as_deref(), Some("CredentialsRefused"));
        assert_eq!(entry.copies, 0);
        let no_token = Reachability::Unreachable {
            message: "the credential plugin of provider \"eks\" failed (exit code 1)",
            why: Unanswered::NoCredentials,
        };
        let entry = cluster_entry("a", &no_token, None);
        assert_eq!(entry.reason.as_deref(), Some("CredentialPluginFailed"));
        assert_eq!(
            entry.message.as_deref(),
            Some(
                "no credentials to reach it: the credential plugin of provider \"eks\" failed \
                 (exit code 1)"
            )
        );
    }

    #[test]
    fn a_member_without_a_report_is_still_being_listed() {
        let said = [
            (
                Reachability::Connecting,
                "connecting; its namespaces and copies are being listed",
            ),
            (
                Reachability::Reachable,
                "it answers; its namespaces and copies are being listed, or the rule's first pass there runs",
            ),
        ];
        for (reach, message) in said {
            let entry = cluster_entry("a", &reach, None);
            assert_eq!(entry.reason.as_deref(), Some("Progressing"));
            assert_eq!(entry.message.as_deref(), Some(message));
            assert!(!entry.ready);
        }
        let connecting = cluster_entry("a", &Reachability::Connecting, Some(&member_report()));
        assert_eq!(connecting.reason.as_deref(), Some("Progressing"));
        assert_eq!(
            connecting.copies, 2,
            "counted as the rule's totals count it"
        );
    }
}
