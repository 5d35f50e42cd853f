//! Staged rollouts (`spec.rollout.stages`) in one cluster: which stage
//! each place is in, what a pass there owes each stage, and which of its
//! writes the rule's rollouts let through. Pure: the plan of a pass (made
//! as if there were no stages), the rule's copies there, and where each
//! rollout stands across every cluster ([`crate::core::fleet_rollout`],
//! as recorded in the rule's status) come in; the writes that may not
//! happen yet are taken out of the plan, creates in stages not yet reached
//! get the content rolled out before (read by the controller from one copy
//! that holds it: the copy views keep no payload), and what the pass found
//! goes out as [`SiteFacts`], from which the rollouts move on.
//!
//! Only content the rule rolled out counts as content a stage holds: a
//! copy's mark proves that Copyrator wrote its payload there once, not
//! that it was the last thing written. The rule keeps, by copy name, the
//! digests of the contents its copies may hold ([`RolledOut`]: the current
//! content, and while a rollout is under way the contents it replaces),
//! and its status carries them over a restart. A copy at any other content
//! (an older one put back) is restored at once, like an edited one, and is
//! never handed on. With no record at all (a status wiped), what the
//! copies' marks prove is taken as rolled out, once: the rollout is built
//! again from them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::cache::index::{CopyIndex, NamespaceInfo, Object};
use crate::core::plan::{Action, Desired, DesiredCopies, Plan};
pub(crate) use crate::core::resolve::{ClusterOf, Stages};

/// How soon a pass that wrote a stage's copies is followed by another,
/// which finds the stage settled (its writes went through) or not.
pub(crate) const AFTER_WRITES: Duration = Duration::from_millis(100);
/// How often a stage still settling is looked at again.
pub(crate) const SETTLE_RECHECK: Duration = Duration::from_secs(2);
/// How often a halted stage is looked at again.
pub(crate) const HALTED_RECHECK: Duration = Duration::from_secs(10);

/// What a rule's passes in one cluster remember of its rollouts.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Rollouts {
    /// By copy name, the content rolled out before (its payload hash and
    /// payload), once read: what creates in stages not reached yet get.
    pub(crate) earlier: Earlier,
    /// What the rule's copies here may hold as rolled out; `None` until
    /// it is read from the rule's status (the first pass after a start).
    pub(crate) rolled_out: Option<RolledOut>,
    /// The status kept no record at all: on the next pass, contents the
    /// copies' marks prove Copyrator wrote are taken as rolled out.
    pub(crate) rebuild: bool,
}

/// By copy name, the content rolled out before: its payload hash and payload.
pub(crate) type Earlier = HashMap<String, (u64, Arc<BTreeMap<String, Value>>)>;

/// By copy name, the digests of the contents ([`Inputs::digest`]) that its
/// copies may hold as rolled out, the newest last: the source's current
/// content, and while a rollout is under way the contents it replaces.
pub(crate) type RolledOut = BTreeMap<String, Vec<String>>;

/// At most this many contents are kept for one copy name: a source that
/// changes again and again while its rollout is under way hands on only
/// its latest contents.
pub(crate) const MAX_ROLLED_OUT_CONTENTS: usize = 8;

/// At most this many copy names are kept (the first by name): the status
/// of a rule with a thousand sources stays far below an object's limit.
/// A copy of a source past them is held at other content by no stage
/// after a restart: it is written at once.
pub(crate) const MAX_ROLLED_OUT_SOURCES: usize = 2_000;

/// [`RolledOut`] as the rule's status keeps it: digests space-separated.
pub(crate) fn rolled_out_for_status(rolled_out: &RolledOut) -> BTreeMap<String, String> {
    rolled_out
        .iter()
        .map(|(name, digests)| (name.clone(), digests.join(" ")))
        .collect()
}

/// [`RolledOut`] from the rule's status; anything malformed is no digest
/// (it matches no content, so a copy at it is restored, never handed on).
pub(crate) fn rolled_out_from_status(status: &BTreeMap<String, String>) -> RolledOut {
    status
        .iter()
        .take(MAX_ROLLED_OUT_SOURCES)
        .map(|(name, digests)| {
            let digests: Vec<String> = digests
                .split_whitespace()
                .filter(|d| d.len() == crate::cache::mark::ROLLED_OUT_DIGITS)
                .map(str::to_owned)
                .collect();
            let skip = digests.len().saturating_sub(MAX_ROLLED_OUT_CONTENTS);
            (name.clone(), digests.into_iter().skip(skip).collect())
        })
        .collect()
}

/// Where one source's rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The open stage is being written, or its consumers are rolling.
    Settling,
    /// The open stage settled; the next opens after its pause.
    Pausing,
    /// The next stage waits for an approval of this content.
    AwaitingApproval,
    /// The open stage did not settle in time: why (the workloads not
    /// available, the copies not written, the clusters not reachable).
    Halted(Vec<String>),
}

impl Phase {
    /// The word the status says it with.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Phase::Settling => "Settling",
            Phase::Pausing => "Pausing",
            Phase::AwaitingApproval => "AwaitingApproval",
            Phase::Halted(_) => "Halted",
        }
    }
}

/// One source's rollout, for the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    pub(crate) source: String,
    /// The copies' name, and the new content's digest.
    pub(crate) name: String,
    pub(crate) content: String,
    /// Index and name of the last stage reached by the new content.
    pub(crate) stage: usize,
    pub(crate) stage_name: String,
    pub(crate) stages: usize,
    pub(crate) phase: Phase,
    /// RFC 3339: when the stage opened (or was reached, awaiting an
    /// approval), and when it settled.
    pub(crate) opened_at: String,
    pub(crate) settled_at: Option<String>,
    /// Each cluster the rule targets (by name) and its phase word.
    pub(crate) clusters: Vec<(String, &'static str)>,
}

/// How far the rule's rollout of one content is open, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Open {
    /// The last stage whose places may get the content (`None`: none yet,
    /// the first stage awaits an approval).
    pub(crate) through: Option<usize>,
}

/// What one cluster's pass found of one source's new content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SourceFacts {
    pub(crate) source: String,
    /// The new content's digest.
    pub(crate) content: String,
    /// Stages whose places here do not hold the new content yet: a write
    /// of it (new content, or a restore) is still to be made.
    pub(crate) owed: BTreeSet<usize>,
    /// Stages where a copy of it is here.
    pub(crate) present: BTreeSet<usize>,
    /// A copy here past the first stage holds content rolled out before:
    /// the new content is staged.
    pub(crate) held_later: bool,
    /// By stage looked at: the consumers here not available at the new
    /// content (empty: all are).
    pub(crate) waiting: BTreeMap<usize, Vec<String>>,
}

/// What one cluster's pass found, by copy name: only sources with a copy
/// or a write owed here.
pub(crate) type SiteFacts = BTreeMap<String, SourceFacts>;

/// Consumers whose availability the controller should look at: those of
/// the copies of `name` in `namespaces` (one stage), for `payload`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AvailabilityCheck {
    pub(crate) name: String,
    pub(crate) stage: usize,
    pub(crate) payload: u64,
    pub(crate) namespaces: Vec<String>,
    /// The new content, whose restart annotation the workloads should carry.
    pub(crate) desired: Arc<Desired>,
}

/// What the stages did to a plan in one cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Gated {
    /// Writes of new content held back for a later stage.
    pub(crate) held: u32,
    /// When this cluster should be looked at again (its consumers).
    pub(crate) recheck_in: Option<Duration>,
    pub(crate) checks: Vec<AvailabilityCheck>,
    /// Copies whose payload the controller should read into
    /// [`Rollouts::earlier`]: the content rolled out before, which creates
    /// in stages not reached yet need.
    pub(crate) reads: Vec<EarlierRead>,
    /// What the rule's copies here may hold as rolled out after this pass,
    /// for its status.
    pub(crate) rolled_out: RolledOut,
    /// What this pass found of each source's new content.
    pub(crate) facts: SiteFacts,
}

/// A copy that holds the content rolled out before, as Copyrator wrote it
/// ([`Object::intact`]), to be read whole. What is read is kept only if
/// its payload is still that one and still intact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EarlierRead {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) payload_hash: u64,
}

/// What the controller last saw of a stage's consumers, for a content:
/// `Some(not available)` (empty: all available), `None` if not looked at.
pub(crate) type Availability<'a> = &'a dyn Fn(&str, usize, u64) -> Option<Vec<String>>;

/// What a pass needs to stage its plan.
pub(crate) struct Inputs<'a> {
    pub(crate) stages: &'a Stages,
    pub(crate) rule_uid: &'a str,
    /// The cluster of the pass.
    pub(crate) cluster: ClusterOf<'a>,
    pub(crate) namespaces: &'a BTreeMap<String, NamespaceInfo>,
    pub(crate) copies: &'a CopyIndex,
    /// Settled means the consumers are available too (`restartConsumers`).
    pub(crate) consumers: bool,
    pub(crate) availability: Availability<'a>,
    /// Every copy the sources want now (a pass over a staged rule looks at
    /// everything).
    pub(crate) desired: &'a DesiredCopies,
    /// The digest of a content (its payload hash) for a copy name, as the
    /// status keeps it; `None` where none can be made (no key).
    pub(crate) digest: &'a dyn Fn(&str, u64) -> Option<String>,
    /// How far the recorded rollout of a content (copy name, digest) is
    /// open; `None`: no rollout of it is recorded.
    pub(crate) open: &'a dyn Fn(&str, &str) -> Option<Open>,
}

/// Stage `plan` (made for everything, as if there were no stages): take
/// out the writes of new content into stages not open to it, and make
/// creates there with the content rolled out before; say what was found.
pub(crate) fn gate(plan: &mut Plan, inputs: &Inputs<'_>, rollouts: &mut Rollouts) -> Gated {
    let stages = inputs.stages;
    let rebuild = std::mem::take(&mut rollouts.rebuild);
    let record = rollouts.rolled_out.get_or_insert_with(RolledOut::new);
    if rebuild {
        // No record: what the marks prove Copyrator wrote is taken as
        // rolled out (once; the record holds it from now on).
        for action in &plan.actions {
            if let Action::Update { desired, current } | Action::Recreate { desired, current } =
                action
                && current.intact
                && let Some(digest) = (inputs.digest)(&desired.name, current.payload_hash)
            {
                let digests = record.entry(desired.name.clone()).or_default();
                if !digests.contains(&digest) {
                    digests.insert(0, digest);
                }
            }
        }
    }
    let recorded = |name: &str, payload: u64| {
        (inputs.digest)(name, payload)
            .is_some_and(|digest| record.get(name).is_some_and(|d| d.contains(&digest)))
    };
    let stage_of = |namespace: &str| {
        let labels = inputs.namespaces.get(namespace).map(|ns| &ns.labels);
        stages.stage_of(
            inputs.cluster,
            namespace,
            labels.unwrap_or(&BTreeMap::new()),
        )
    };
    let owed = owed_of(plan, &recorded, &stage_of);
    let mut gated = Gated::default();
    let mut open_through: HashMap<String, (Option<usize>, Option<Arc<Desired>>)> = HashMap::new();
    for (name, owed) in owed.iter().filter(|(_, o)| !o.stages.is_empty()) {
        let desired = &owed.desired;
        let Some(content) = (inputs.digest)(name, desired.payload_hash) else {
            continue;
        };
        let open = (inputs.open)(name, &content);
        // Nothing held here and no rollout of it recorded: a new source,
        // or a change back to what later stages hold (not staged here).
        if !owed.held_later && open.is_none() {
            continue;
        }
        // Held here, its start not recorded yet: nothing of it is written
        // until it is.
        let through = open.and_then(|o| o.through);
        let earlier = earlier_content(&rollouts.earlier, owed, &mut gated);
        open_through.insert(name.clone(), (through, earlier));
    }
    let actions = std::mem::take(&mut plan.actions);
    for action in actions {
        match held_back(action, &open_through, &stage_of, &recorded) {
            Ok(action) => plan.actions.push(action),
            Err(()) => gated.held += 1,
        }
    }
    gated.facts = facts_of(&owed, inputs, &stage_of, &mut gated);
    let under_way: BTreeSet<&str> = open_through.keys().map(String::as_str).collect();
    let record = rollouts.rolled_out.get_or_insert_with(RolledOut::new);
    gated.rolled_out = record_rolled_out(record, plan.too_costly, inputs, &under_way);
    gated
}

/// Per source name, what `plan` owes its new content.
fn owed_of(
    plan: &Plan,
    recorded: &dyn Fn(&str, u64) -> bool,
    stage_of: &dyn Fn(&str) -> usize,
) -> BTreeMap<String, Owed> {
    let mut owed: BTreeMap<String, Owed> = BTreeMap::new();
    for action in &plan.actions {
        let Some((desired, namespace, new_content)) = write_of(action, recorded) else {
            continue;
        };
        let stage = stage_of(namespace);
        let entry = owed.entry(desired.name.clone()).or_insert_with(|| Owed {
            desired: desired.clone(),
            stages: BTreeSet::new(),
            unwritten: BTreeSet::new(),
            held_later: false,
            earlier: None,
        });
        // An adopted copy holds the payload already; any other write,
        // new content or a restore, leaves its place not holding it yet.
        if !matches!(action, Action::Adopt { .. }) {
            entry.unwritten.insert(stage);
        }
        if !new_content {
            continue;
        }
        entry.stages.insert(stage);
        if let Action::Update { current, .. } | Action::Recreate { current, .. } = action
            && stage > 0
        {
            entry.held_later = true;
            // Content is handed on only from a copy whose mark proves it
            // Copyrator's write there, unchanged since (labels and field
            // managers can be forged; the mark cannot).
            if current.intact && entry.earlier.as_ref().is_none_or(|(s, _)| *s < stage) {
                entry.earlier = Some((stage, current.clone()));
            }
        }
    }
    owed
}

/// What this pass found of each source with a copy or a write owed here,
/// and the availability checks its open stage needs.
fn facts_of(
    owed: &BTreeMap<String, Owed>,
    inputs: &Inputs<'_>,
    stage_of: &dyn Fn(&str) -> usize,
    gated: &mut Gated,
) -> SiteFacts {
    let mut facts = SiteFacts::new();
    for copy in inputs.copies.owned_by(inputs.rule_uid) {
        let Some(desired) = inputs.desired.get(&copy.name) else {
            continue;
        };
        let Some(content) = (inputs.digest)(&desired.name, desired.payload_hash) else {
            continue;
        };
        let entry = facts
            .entry(desired.name.clone())
            .or_insert_with(|| SourceFacts {
                source: desired.source.clone(),
                content,
                ..SourceFacts::default()
            });
        entry.present.insert(stage_of(&copy.namespace));
    }
    for (name, owed) in owed {
        let Some(content) = (inputs.digest)(name, owed.desired.payload_hash) else {
            continue;
        };
        let entry = facts.entry(name.clone()).or_insert_with(|| SourceFacts {
            source: owed.desired.source.clone(),
            content,
            ..SourceFacts::default()
        });
        entry.owed.clone_from(&owed.unwritten);
        entry.held_later = owed.held_later;
    }
    if inputs.consumers {
        for (name, entry) in &mut facts {
            look_at_consumers(name, entry, inputs, gated);
        }
    }
    facts
}

/// The consumers of the open stage, where this cluster's copies of it are
/// written: what was last seen of them, and a check when not known to be
/// available.
fn look_at_consumers(name: &str, entry: &mut SourceFacts, inputs: &Inputs<'_>, gated: &mut Gated) {
    let Some(stage) = (inputs.open)(name, &entry.content).and_then(|o| o.through) else {
        return;
    };
    if entry.owed.contains(&stage) || stage + 1 >= inputs.stages.count() {
        return;
    }
    if !entry.present.contains(&stage) {
        entry.waiting.insert(stage, Vec::new());
        return;
    }
    let Some(desired) = inputs.desired.get(name) else {
        return;
    };
    let seen = (inputs.availability)(name, stage, desired.payload_hash);
    if seen.as_ref().is_none_or(|waiting| !waiting.is_empty()) {
        gated.checks.push(AvailabilityCheck {
            name: name.to_owned(),
            stage,
            payload: desired.payload_hash,
            namespaces: namespaces_in(inputs, name, stage),
            desired: desired.clone(),
        });
        gated.recheck_in = Some(SETTLE_RECHECK);
    }
    if let Some(waiting) = seen {
        entry.waiting.insert(stage, waiting);
    }
}

/// Record what the copies may hold as rolled out after a pass, and return
/// it: for each source, its current content; while its rollout is under
/// way, also what was recorded before (what its stages not open yet hold).
/// A plan that stopped short (`too_costly`) knows not every source's
/// content: what was recorded stays as it was.
fn record_rolled_out(
    record: &mut RolledOut,
    too_costly: bool,
    inputs: &Inputs<'_>,
    under_way: &BTreeSet<&str>,
) -> RolledOut {
    if !too_costly {
        *record = next_rolled_out(record, inputs, under_way);
    }
    record.clone()
}

fn next_rolled_out(
    before: &mut RolledOut,
    inputs: &Inputs<'_>,
    under_way: &BTreeSet<&str>,
) -> RolledOut {
    let mut names: Vec<&Arc<Desired>> = inputs.desired.values().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut next = RolledOut::new();
    for desired in names.into_iter().take(MAX_ROLLED_OUT_SOURCES) {
        let Some(current) = (inputs.digest)(&desired.name, desired.payload_hash) else {
            continue;
        };
        let mut digests = if under_way.contains(desired.name.as_str()) {
            before.remove(&desired.name).unwrap_or_default()
        } else {
            Vec::new()
        };
        digests.retain(|d| *d != current);
        digests.push(current);
        let skip = digests.len().saturating_sub(MAX_ROLLED_OUT_CONTENTS);
        next.insert(
            desired.name.clone(),
            digests.into_iter().skip(skip).collect(),
        );
    }
    next
}

/// The copy a create in a stage not open yet gets: the source's copy with
/// the content rolled out before, once read (asked for in `gated.reads`).
fn earlier_content(earlier: &Earlier, owed: &Owed, gated: &mut Gated) -> Option<Arc<Desired>> {
    match (earlier.get(&owed.desired.name), &owed.earlier) {
        (Some((hash, payload)), Some((_, before))) if *hash == before.payload_hash => {
            Some(Arc::new(owed.desired.with_payload((**payload).clone())))
        }
        (_, Some((_, before))) => {
            gated.reads.push(EarlierRead {
                namespace: before.namespace.to_string(),
                name: before.name.to_string(),
                payload_hash: before.payload_hash,
            });
            None
        }
        // No copy at the earlier content left in a later stage: creates
        // there wait for their stage.
        (_, None) => None,
    }
}

/// What a plan owes one source.
struct Owed {
    desired: Arc<Desired>,
    /// Stages with writes of new content.
    stages: BTreeSet<usize>,
    /// Stages with any write of the copy still to make (new content, or a
    /// restore): not holding it yet.
    unwritten: BTreeSet<usize>,
    /// A copy past the first stage holds other content: staged.
    held_later: bool,
    /// Of those, the copy in the latest stage that provably holds what
    /// Copyrator wrote: where creates not reached yet take their content.
    earlier: Option<(usize, Arc<Object>)>,
}

/// The desired copy, its namespace, and whether it brings new content
/// there, of a write; `None` for a delete or hand-over. A copy whose payload
/// is not provably Copyrator's write ([`Object::intact`]: someone edited it)
/// or not content the rule rolled out (`recorded`: an older copy put back)
/// gets no new content but a restore: it is written at once, as without
/// stages, and what it holds is never handed on.
fn write_of<'a>(
    action: &'a Action,
    recorded: &dyn Fn(&str, u64) -> bool,
) -> Option<(&'a Arc<Desired>, &'a str, bool)> {
    match action {
        Action::Create { desired, namespace } => Some((desired, namespace, true)),
        Action::Update { desired, current } | Action::Recreate { desired, current } => Some((
            desired,
            &current.namespace,
            current.intact
                && current.payload_hash != desired.payload_hash
                && recorded(&desired.name, current.payload_hash),
        )),
        // Adopted as it is: it holds the desired payload already.
        Action::Adopt { desired, current } => Some((desired, &current.namespace, false)),
        Action::Delete { .. } | Action::HandOver { .. } => None,
    }
}

/// The namespaces of `stage` here that hold a copy of `name`.
fn namespaces_in(inputs: &Inputs<'_>, name: &str, stage: usize) -> Vec<String> {
    let mut out: Vec<String> = inputs
        .copies
        .owned_by(inputs.rule_uid)
        .filter(|c| &*c.name == name)
        .filter(|c| {
            let labels = inputs.namespaces.get(&*c.namespace).map(|ns| &ns.labels);
            inputs.stages.stage_of(
                inputs.cluster,
                &c.namespace,
                labels.unwrap_or(&BTreeMap::new()),
            ) == stage
        })
        .map(|c| c.namespace.to_string())
        .collect();
    out.sort();
    out
}

/// `action` as the stages let it happen: unchanged in an open stage (or
/// for a source not staged); in a stage not open yet, a create is made with
/// the content rolled out before (held back, `Err`, until that is read),
/// and an update or recreate of new content is held back: a copy there
/// keeps what it holds until its stage opens.
fn held_back(
    action: Action,
    open_through: &HashMap<String, (Option<usize>, Option<Arc<Desired>>)>,
    stage_of: &dyn Fn(&str) -> usize,
    recorded: &dyn Fn(&str, u64) -> bool,
) -> Result<Action, ()> {
    let Some((desired, namespace, new_content)) = write_of(&action, recorded) else {
        return Ok(action);
    };
    let Some((through, earlier)) = open_through.get(&desired.name) else {
        return Ok(action);
    };
    if !new_content || through.is_some_and(|open| stage_of(namespace) <= open) {
        return Ok(action);
    }
    match (action, earlier) {
        (Action::Create { namespace, .. }, Some(earlier)) => Ok(Action::Create {
            desired: earlier.clone(),
            namespace,
        }),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::Glob;
    use crate::core::fleet_rollout::{SiteView, Step, Tracks, advance, progress};
    use crate::core::plan::tests::{World, rule, verbs};
    use crate::core::resolve::{REST, Stage, TargetSelector};
    use serde_json::json;
    use tokio::time::Instant;

    /// A staged rule's rollouts in tests of the home cluster alone: what
    /// its passes there remember, and where its rollouts stand as
    /// recorded in its status.
    #[derive(Default)]
    struct Harness {
        site: Rollouts,
        by_name: Tracks,
    }

    impl Harness {
        /// What a rule starts from with `rolled_out` in its status.
        fn recorded(rolled_out: RolledOut) -> Self {
            Self {
                site: Rollouts {
                    rolled_out: Some(rolled_out),
                    ..Rollouts::default()
                },
                by_name: Tracks::new(),
            }
        }
    }

    /// What one pass came to: the stages' effect on the plan at home, and
    /// where the rollouts stand after it.
    #[derive(Debug)]
    struct Staged {
        held: u32,
        progress: Vec<Progress>,
        recheck_at: Option<Instant>,
        checks: Vec<AvailabilityCheck>,
        reads: Vec<EarlierRead>,
        rolled_out: RolledOut,
        facts: SiteFacts,
    }

    /// The wall clock of a test instant.
    fn wall(at: Instant) -> chrono::DateTime<chrono::Utc> {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let base = *BASE.get_or_init(|| {
            Instant::now()
                .checked_sub(Duration::from_secs(86_400))
                .expect("a day since boot")
        });
        let since = at.duration_since(base);
        chrono::DateTime::UNIX_EPOCH + chrono::Duration::from_std(since).expect("a test's time")
    }

    const PAUSE: Duration = Duration::from_secs(60);
    const TIMEOUT: Duration = Duration::from_secs(300);

    /// `canary` (namespaces `c*`, a pause of a minute), then the rest.
    fn canary_then_rest() -> Stages {
        Stages {
            stages: vec![Stage {
                name: "canary".into(),
                selector: TargetSelector {
                    namespace_selector: None,
                    include: vec![Glob::new("c*").unwrap()],
                    exclude: Vec::new(),
                },
                pause: PAUSE,
                clusters: None,
                manual: false,
                max_unavailable: 0,
            }],
            settle_timeout: TIMEOUT,
        }
    }

    /// A world with copies of `src/cm` at `{"k": "v1"}` in c1, r1 and r2,
    /// and the source changed to `{"k": "v2"}`.
    fn changed_world() -> World {
        changed_world_of(&simple())
    }

    /// [`changed_world`], its copies made by `rule`.
    fn changed_world_of(rule: &crate::core::resolve::ResolvedRule) -> World {
        let mut w = World::new(&["src", "c1", "r1", "r2"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v1"}));
        let p = w.plan(rule);
        w.apply(&p);
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        w
    }

    fn simple() -> crate::core::resolve::ResolvedRule {
        rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"}}))
    }

    fn digest(name: &str, payload: u64) -> Option<String> {
        crate::cache::mark::rolled_out_digest("rule-1", name, payload)
    }

    /// The digest of `{"k": value}` for the copies of `cm`.
    fn digest_of(value: &str) -> String {
        digest_named("cm", value)
    }

    /// The digest of `{"k": value}` for the copies named `name`.
    fn digest_named(name: &str, value: &str) -> String {
        let payload = BTreeMap::from([("data".to_owned(), json!({"k": value}))]);
        digest(name, crate::cache::index::payload_hash(&payload)).expect("a test key")
    }

    /// What a rule remembers once `{"k": value}` rolled out everywhere.
    fn rolled_out_at(value: &str) -> Harness {
        rolled_out_named("cm", value)
    }

    /// [`rolled_out_at`], for the copies named `name`.
    fn rolled_out_named(name: &str, value: &str) -> Harness {
        Harness::recorded(RolledOut::from([(
            name.to_owned(),
            vec![digest_named(name, value)],
        )]))
    }

    /// Stage the plan of `w` at `now`, with the consumers' availability
    /// `available` (when they count).
    fn staged(
        w: &World,
        rollouts: &mut Harness,
        now: Instant,
        consumers: Option<Availability<'_>>,
    ) -> (Plan, Staged) {
        staged_of(&simple(), w, rollouts, now, consumers)
    }

    /// [`staged`], the plan of `rule`: its pass at home finds where the
    /// rollouts stand, they move on and are recorded, and the plan is
    /// staged as recorded (as the pass after the record would).
    fn staged_of(
        rule: &crate::core::resolve::ResolvedRule,
        w: &World,
        h: &mut Harness,
        now: Instant,
        consumers: Option<Availability<'_>>,
    ) -> (Plan, Staged) {
        let stages = canary_then_rest();
        let none = |_: &str, _: usize, _: u64| None;
        let desired = crate::core::plan::desired_copies(
            rule,
            &w.sources,
            &crate::core::scope::Scope::everything(),
        );
        let pass = |h: &mut Harness| {
            let mut plan = w.plan(rule);
            let open = |name: &str, content: &str| {
                h.by_name
                    .get(name)
                    .filter(|t| t.content == content)
                    .map(crate::core::fleet_rollout::Track::open)
            };
            let inputs = Inputs {
                stages: &stages,
                rule_uid: "rule-1",
                cluster: ClusterOf::Home,
                namespaces: &w.namespaces,
                copies: &w.copies,
                consumers: consumers.is_some(),
                availability: consumers.unwrap_or(&none),
                desired: &desired,
                digest: &digest,
                open: &open,
            };
            let mut site = std::mem::take(&mut h.site);
            let gated = gate(&mut plan, &inputs, &mut site);
            h.site = site;
            (plan, gated)
        };
        let (_, found) = pass(h);
        let planned = rolled_out_for_status(&found.rolled_out);
        let sites = [SiteView {
            name: "home",
            cluster: ClusterOf::Home,
            reachable: true,
            facts: Some(&found.facts),
            planned: Some(&planned),
        }];
        let current = |name: &str| {
            let content = found.rolled_out.get(name)?.last()?.clone();
            Some((desired.get(name)?.source.clone(), content))
        };
        let step = Step {
            stages: &stages,
            sites: &sites,
            now: wall(now),
            current: &current,
            approved: &|_: &str, _: &str| false,
            consumers: consumers.is_some(),
        };
        let advanced = advance(&h.by_name, &step);
        h.by_name = advanced.tracks;
        let (plan, gated) = pass(h);
        let recheck = [advanced.recheck_in, gated.recheck_in]
            .into_iter()
            .flatten()
            .min();
        let staged = Staged {
            held: gated.held,
            progress: progress(&h.by_name, &stages),
            recheck_at: recheck.map(|wait| now + wait),
            checks: gated.checks,
            reads: gated.reads,
            rolled_out: gated.rolled_out,
            facts: gated.facts,
        };
        (plan, staged)
    }

    fn places(plan: &Plan) -> Vec<String> {
        verbs(plan)
            .into_iter()
            .map(|(ns, _, verb)| format!("{verb} {ns}"))
            .collect()
    }

    #[test]
    fn a_change_reaches_the_next_stage_only_after_the_first_settled_and_paused() {
        let mut w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        assert_eq!(places(&plan), ["update c1"]);
        assert_eq!(gated.held, 2, "r1 and r2 keep v1");
        assert_eq!(gated.progress[0].stage_name, "canary");
        assert_eq!(gated.progress[0].phase, Phase::Settling);
        w.apply(&plan);

        // Canary written: it settles, and the rest waits out the pause.
        let t1 = t0 + Duration::from_secs(1);
        let (plan, gated) = staged(&w, &mut rollouts, t1, None);
        assert!(plan.actions.is_empty(), "{:?}", places(&plan));
        assert_eq!(gated.progress[0].phase, Phase::Pausing);
        assert_eq!(gated.recheck_at, Some(t1 + PAUSE));
        let (plan, _) = staged(&w, &mut rollouts, t1 + PAUSE / 2, None);
        assert!(plan.actions.is_empty(), "still pausing");

        // The pause is over: the rest gets v2.
        let (plan, gated) = staged(&w, &mut rollouts, t1 + PAUSE, None);
        assert_eq!(places(&plan), ["update r1", "update r2"]);
        assert_eq!(gated.progress[0].stage_name, REST);
        w.apply(&plan);
        let (plan, gated) = staged(&w, &mut rollouts, t1 + PAUSE * 2, None);
        assert!(plan.actions.is_empty());
        assert!(gated.progress.is_empty(), "rolled out");
        assert!(rollouts.by_name.is_empty());
    }

    #[test]
    fn a_renamed_copy_rolls_out_stage_by_stage_under_its_name() {
        let renamed = rule(json!({
            "ruleType": "configmap",
            "selector": {"copy": "yes"},
            "spec": {"transform": {"name": {"prefix": "p-"}}},
        }));
        let mut w = changed_world_of(&renamed);
        let mut rollouts = rolled_out_named("p-cm", "v1");
        let t0 = Instant::now();
        let (plan, gated) = staged_of(&renamed, &w, &mut rollouts, t0, None);
        assert_eq!(verbs(&plan), [("c1".into(), "p-cm".into(), "update")]);
        assert_eq!(gated.held, 2, "r1 and r2 keep v1");
        w.apply(&plan);
        let t1 = t0 + Duration::from_secs(1);
        let (plan, _) = staged_of(&renamed, &w, &mut rollouts, t1, None);
        assert!(plan.actions.is_empty(), "pausing: {:?}", verbs(&plan));
        let (plan, _) = staged_of(&renamed, &w, &mut rollouts, t1 + PAUSE, None);
        assert_eq!(
            verbs(&plan),
            [
                ("r1".into(), "p-cm".into(), "update"),
                ("r2".into(), "p-cm".into(), "update")
            ]
        );
    }

    #[test]
    fn a_stage_that_does_not_settle_halts_and_later_stages_keep_their_content() {
        let w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        // The canary's write never lands (refused, say).
        staged(&w, &mut rollouts, t0, None);
        let (plan, gated) = staged(&w, &mut rollouts, t0 + TIMEOUT / 2, None);
        assert_eq!(gated.progress[0].phase, Phase::Settling);
        assert_eq!(places(&plan), ["update c1"], "the canary is tried again");
        let (plan, gated) = staged(&w, &mut rollouts, t0 + TIMEOUT, None);
        let Phase::Halted(why) = &gated.progress[0].phase else {
            panic!("{gated:?}")
        };
        assert_eq!(why, &["copies in stage canary not written yet"]);
        assert_eq!(gated.held, 2);
        assert_eq!(places(&plan), ["update c1"]);
    }

    #[test]
    fn with_consumers_a_stage_settles_when_they_are_available() {
        let mut w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let unknown = |_: &str, _: usize, _: u64| None;
        let (plan, _) = staged(&w, &mut rollouts, t0, Some(&unknown));
        w.apply(&plan);
        // Written: the controller is asked to look at the canary's consumers.
        let (_, gated) = staged(&w, &mut rollouts, t0, Some(&unknown));
        assert_eq!(gated.checks.len(), 1);
        assert_eq!(gated.checks[0].namespaces, ["c1"]);
        assert_eq!(gated.progress[0].phase, Phase::Settling);
        // Not available past the timeout: halted, naming the workload.
        let web = |_: &str, _: usize, _: u64| Some(vec!["Deployment c1/web".to_owned()]);
        let (plan, gated) = staged(&w, &mut rollouts, t0 + TIMEOUT, Some(&web));
        assert_eq!(
            gated.progress[0].phase,
            Phase::Halted(vec!["Deployment c1/web".into()])
        );
        assert!(plan.actions.is_empty());
        assert_eq!(gated.held, 2);
        // Available again: it settles, and the rest opens after the pause.
        let ready = |_: &str, _: usize, _: u64| Some(Vec::new());
        let later = t0 + TIMEOUT * 2;
        let (_, gated) = staged(&w, &mut rollouts, later, Some(&ready));
        assert_eq!(gated.progress[0].phase, Phase::Pausing);
        let (plan, _) = staged(&w, &mut rollouts, later + PAUSE, Some(&ready));
        assert_eq!(places(&plan), ["update r1", "update r2"]);
    }

    #[test]
    fn a_new_namespace_in_a_stage_not_reached_gets_the_content_rolled_out_before() {
        let mut w = changed_world();
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        // The content before is not known yet: read from one copy first.
        assert_eq!(places(&plan), ["update c1"]);
        let v1 = BTreeMap::from([("data".to_owned(), json!({"k": "v1"}))]);
        let v1_hash = crate::cache::index::payload_hash(&v1);
        assert_eq!(
            gated.reads,
            [EarlierRead {
                namespace: "r1".to_owned(),
                name: "cm".to_owned(),
                payload_hash: v1_hash,
            }]
        );
        assert_eq!(w.copies.get("r1", "cm").unwrap().payload_hash, v1_hash);
        rollouts
            .site
            .earlier
            .insert("cm".to_owned(), (v1_hash, Arc::new(v1)));
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        assert!(gated.reads.is_empty());
        assert_eq!(places(&plan), ["update c1", "create r3"]);
        let Action::Create { desired, .. } = &plan.actions[1] else {
            panic!("{plan:?}")
        };
        assert_eq!(
            desired.payload_hash, v1_hash,
            "r3 gets v1, as r1 and r2 hold"
        );
    }

    #[test]
    fn a_change_back_to_what_later_stages_hold_reaches_the_canary_and_ends() {
        let mut w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let (plan, _) = staged(&w, &mut rollouts, t0, None);
        w.apply(&plan);
        // v2 was bad: back to v1, which the rest still holds.
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v1"}));
        let t1 = t0 + Duration::from_secs(1);
        let (plan, gated) = staged(&w, &mut rollouts, t1, None);
        assert_eq!(places(&plan), ["update c1"]);
        assert_eq!(gated.held, 0);
        w.apply(&plan);
        let (plan, gated) = staged(&w, &mut rollouts, t1, None);
        assert!(plan.actions.is_empty());
        assert!(gated.progress.is_empty() && rollouts.by_name.is_empty());
    }

    /// No create or update of `plan` writes `{"k": value}`.
    fn assert_nothing_written_holds(plan: &Plan, value: &str) {
        let held = crate::cache::index::payload_hash(&BTreeMap::from([(
            "data".to_owned(),
            json!({"k": value}),
        )]));
        assert!(plan.actions.iter().all(|a| match a {
            Action::Create { desired, .. } | Action::Update { desired, .. } =>
                desired.payload_hash != held,
            _ => true,
        }));
    }

    /// The copy in `namespace` of `w`, edited by someone to `{"k": value}`
    /// (as the copy watch reports it: not intact).
    fn edit_copy(w: &mut World, namespace: &str, value: &str) {
        let copy = w.copies.get(namespace, "cm").expect("a copy");
        let mut edited = (**copy).clone();
        edited.payload = BTreeMap::from([("data".to_owned(), json!({"k": value}))]);
        edited.rehash();
        edited.intact = false;
        w.copies.upsert(Arc::new(edited));
    }

    /// The copy in `namespace` of `w` deleted and made again by someone
    /// under Copyrator's field manager, with its labels, annotations and
    /// mark, holding `{"k": value}`: the copy watch reports it as the
    /// rule's copy (the mark's identity holds) but not intact (its content
    /// tag does not).
    fn forge_copy(w: &mut World, namespace: &str, value: &str) {
        let copy = w.copies.get(namespace, "cm").expect("a copy").clone();
        let mut forged = (*copy).clone();
        forged.uid = format!("forged-{namespace}");
        forged.payload = BTreeMap::from([("data".to_owned(), json!({"k": value}))]);
        forged.written_for = None;
        forged.settled = false;
        forged.rehash();
        forged.intact = false;
        w.copies.remove(&copy);
        w.copies.upsert(Arc::new(forged));
    }

    #[test]
    fn a_forged_copy_is_never_where_new_namespaces_take_their_content() {
        let mut w = changed_world();
        forge_copy(&mut w, "r1", "EVIL");
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = rolled_out_at("v1");
        let (_, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        let read: Vec<&str> = gated.reads.iter().map(|r| r.namespace.as_str()).collect();
        assert_eq!(read, ["r2"], "only the copy whose content is marked");
        // Every copy past the canary forged: each is restored as an edited
        // copy would be, and nothing carries EVIL anywhere.
        forge_copy(&mut w, "r2", "EVIL");
        let mut rollouts = rolled_out_at("v1");
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert!(gated.reads.is_empty(), "{gated:?}");
        assert_eq!(
            places(&plan),
            ["update c1", "update r1", "update r2", "create r3"]
        );
        assert_nothing_written_holds(&plan, "EVIL");
    }

    /// After a restart nothing is remembered of Copyrator's writes but
    /// what the rule's status kept: a copy whose mark proves its content,
    /// content the rule rolled out, still hands it on.
    #[test]
    fn after_a_restart_marked_content_is_still_handed_on() {
        let mut w = changed_world();
        let mut restarted = CopyIndex::default();
        for namespace in ["c1", "r1", "r2"] {
            let mut copy = (**w.copies.get(namespace, "cm").expect("a copy")).clone();
            copy.written_for = None;
            copy.settled = false;
            restarted.upsert(Arc::new(copy));
        }
        w.copies = restarted;
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = rolled_out_at("v1");
        let (_, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        let read: Vec<&str> = gated.reads.iter().map(|r| r.namespace.as_str()).collect();
        assert!(
            matches!(read[..], ["r1" | "r2"]),
            "one marked copy of the latest stage: {read:?}"
        );
    }

    #[test]
    fn an_edited_copy_in_a_later_stage_is_restored_at_once_and_starts_no_rollout() {
        let mut w = World::new(&["src", "c1", "r1", "r2"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v1"}));
        let p = w.plan(&simple());
        w.apply(&p);
        edit_copy(&mut w, "r1", "EVIL");
        let mut rollouts = rolled_out_at("v1");
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update r1"], "restored as without stages");
        assert_eq!(gated.held, 0, "the source did not change");
        assert!(gated.progress.is_empty() && gated.reads.is_empty());
        assert!(rollouts.by_name.is_empty());
    }

    #[test]
    fn what_an_edited_copy_holds_never_reaches_another_namespace() {
        // The source changed (v1 to v2) while r1's copy was edited: r2's
        // intact copy holds what the rest had, and only it may be read.
        let mut w = changed_world();
        edit_copy(&mut w, "r1", "EVIL");
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = rolled_out_at("v1");
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update c1", "update r1"]);
        let read: Vec<&str> = gated.reads.iter().map(|r| r.namespace.as_str()).collect();
        assert_eq!(read, ["r2"], "the earlier content is read from r2 only");
        assert_eq!(gated.held, 2, "r2 keeps v1, r3 waits for it to be read");

        // Every copy past the canary edited: nothing to hand on, and a new
        // namespace of the rest waits for its stage rather than take EVIL.
        let mut w = changed_world();
        edit_copy(&mut w, "r1", "EVIL");
        edit_copy(&mut w, "r2", "EVIL");
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = rolled_out_at("v1");
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(
            places(&plan),
            ["update c1", "update r1", "update r2", "create r3"]
        );
        assert!(
            gated.reads.is_empty() && gated.progress.is_empty(),
            "{gated:?}"
        );
        assert_nothing_written_holds(&plan, "EVIL");
    }

    /// Copies as the copy watch lists them after a restart: each whose
    /// mark proves its content is intact, whatever was written since.
    fn restarted(w: &mut World) {
        let mut listed = CopyIndex::default();
        for copy in w.copies.owned_by("rule-1") {
            let mut copy = (**copy).clone();
            copy.written_for = None;
            copy.settled = false;
            copy.intact = true;
            listed.upsert(Arc::new(copy));
        }
        w.copies = listed;
    }

    /// The copy in `namespace` of `w` put back as it was saved at
    /// `{"k": value}`, its mark with it: Copyrator wrote it there once.
    fn put_back(w: &mut World, namespace: &str, value: &str) {
        edit_copy(w, namespace, value);
    }

    #[test]
    fn after_a_restart_an_older_copy_put_back_is_restored_at_once_and_starts_no_rollout() {
        // v1 was rolled out everywhere, then v2; r1's tenant saved its v1
        // copy and puts it back while the operator is down.
        let mut w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let (plan, _) = staged(&w, &mut rollouts, t0, None);
        w.apply(&plan);
        let t1 = t0 + Duration::from_secs(1);
        staged(&w, &mut rollouts, t1, None);
        let (plan, _) = staged(&w, &mut rollouts, t1 + PAUSE, None);
        w.apply(&plan);
        let (plan, gated) = staged(&w, &mut rollouts, t1 + PAUSE * 2, None);
        assert!(plan.actions.is_empty() && gated.progress.is_empty());
        assert_eq!(
            gated.rolled_out,
            RolledOut::from([("cm".to_owned(), vec![digest_of("v2")])]),
            "once rolled out, v1 is no content a copy may hold"
        );
        put_back(&mut w, "r1", "v1");
        restarted(&mut w);
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        // What the status kept is all the restarted operator knows.
        let status = rolled_out_for_status(&gated.rolled_out);
        let mut rollouts = Harness::recorded(rolled_out_from_status(&status));
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update r1", "create r3"]);
        assert!(gated.progress.is_empty() && gated.reads.is_empty() && gated.held == 0);
        assert_nothing_written_holds(&plan, "v1");
        assert!(rollouts.by_name.is_empty(), "no rollout started");
    }

    #[test]
    fn during_a_rollout_only_what_it_replaces_is_held_and_handed_on() {
        // v0, then v1 rolled out everywhere; the source is at v2, the
        // canary written. r1's tenant puts back its v0 copy.
        let mut w = World::new(&["src", "c1", "r1", "r2"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v0"}));
        let p = w.plan(&simple());
        w.apply(&p);
        let v0 = (**w.copies.get("r1", "cm").expect("a copy")).clone();
        let mut w = changed_world();
        let mut rollouts = rolled_out_at("v1");
        let t0 = Instant::now();
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        w.apply(&plan);
        assert_eq!(
            gated.rolled_out["cm"],
            [digest_of("v1"), digest_of("v2")],
            "under way: what it replaces, and the new content"
        );
        w.copies.upsert(Arc::new(Object {
            resource_version: "999".into(),
            ..v0
        }));
        restarted(&mut w);
        w.namespaces.insert("r3".into(), NamespaceInfo::default());
        let mut rollouts = Harness::recorded(gated.rolled_out.clone());
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        assert_eq!(places(&plan), ["update r1"], "v0 restored at once");
        let read: Vec<&str> = gated.reads.iter().map(|r| r.namespace.as_str()).collect();
        assert_eq!(read, ["r2"], "v1 is read from r2 alone");
        assert_eq!(gated.held, 2, "r2 keeps v1; r3 waits for it");
        assert_nothing_written_holds(&plan, "v0");
    }

    #[test]
    fn with_no_record_after_a_restart_the_marks_hold_the_rest_back() {
        // A staged rule whose status kept nothing (wiped): what the copies'
        // marks prove Copyrator wrote is taken as rolled out, and the
        // rollout is built again from them.
        let mut w = changed_world();
        restarted(&mut w);
        let mut rollouts = Harness {
            site: Rollouts {
                rebuild: true,
                ..Rollouts::default()
            },
            ..Harness::default()
        };
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update c1"]);
        assert_eq!(gated.held, 2, "r1 and r2 keep v1");
        assert_eq!(gated.progress[0].stage_name, "canary");
        assert_eq!(gated.rolled_out["cm"], [digest_of("v1"), digest_of("v2")]);
        // Without the rebuild, nothing would be held.
        let mut forgetting = Harness::default();
        let (plan, _) = staged(&w, &mut forgetting, Instant::now(), None);
        assert_eq!(places(&plan), ["update c1", "update r1", "update r2"]);
    }

    #[test]
    fn the_record_in_the_status_is_bounded_and_malformed_digests_match_nothing() {
        let many: BTreeMap<String, String> = (0..MAX_ROLLED_OUT_SOURCES + 10)
            .map(|i| {
                let digests: Vec<String> = (0..MAX_ROLLED_OUT_CONTENTS + 2)
                    .map(|j| format!("{:016x}", i * 100 + j))
                    .collect();
                (format!("cm-{i:05}"), digests.join(" "))
            })
            .collect();
        let read = rolled_out_from_status(&many);
        assert_eq!(read.len(), MAX_ROLLED_OUT_SOURCES);
        let first = &read["cm-00000"];
        assert_eq!(first.len(), MAX_ROLLED_OUT_CONTENTS, "the newest kept");
        assert_eq!(first.last().map(String::as_str), Some("0000000000000009"));
        let malformed = BTreeMap::from([("cm".to_owned(), "xyz 0123456789abcdef0".to_owned())]);
        assert_eq!(
            rolled_out_from_status(&malformed)["cm"],
            Vec::<String>::new()
        );
        let round = RolledOut::from([("cm".to_owned(), vec![digest_of("v1"), digest_of("v2")])]);
        assert_eq!(
            rolled_out_from_status(&rolled_out_for_status(&round)),
            round
        );
    }

    #[test]
    fn a_place_whose_restore_is_still_to_write_does_not_hold_the_content_yet() {
        // Nothing recorded: every copy at v1 is restored at once, unstaged,
        // and each place is owed the content until that write is made.
        let w = changed_world();
        let mut rollouts = Harness::recorded(RolledOut::new());
        let (plan, staged) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update c1", "update r1", "update r2"]);
        let facts = &staged.facts["cm"];
        assert_eq!(facts.owed, BTreeSet::from([0, 1]));
        assert!(!facts.held_later);
        assert!(staged.progress.is_empty());
    }

    #[test]
    fn a_new_source_is_not_staged() {
        let mut w = World::new(&["src", "c1", "r1"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v1"}));
        let mut rollouts = Harness::default();
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["create c1", "create r1"]);
        assert_eq!(gated.held, 0);
        assert!(gated.progress.is_empty() && gated.reads.is_empty());
        assert_eq!(
            gated.rolled_out,
            RolledOut::from([("cm".to_owned(), vec![digest_of("v1")])])
        );
    }

    #[test]
    fn a_namespace_is_in_the_first_stage_that_selects_it() {
        let stages = canary_then_rest();
        let none = BTreeMap::new();
        assert_eq!(stages.stage_of(ClusterOf::Home, "c1", &none), 0);
        assert_eq!(stages.stage_of(ClusterOf::Home, "r1", &none), 1);
        assert_eq!(stages.name(1), REST);
        assert_eq!(stages.count(), 2);
    }
}
