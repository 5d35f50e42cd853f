//! Staged rollouts (`spec.rollout.stages`): which stage each namespace is
//! in, and how far a source's new content may go now. Pure: the plan of a
//! pass (made as if there were no stages), the rule's copies, the clock and
//! what the controller last saw of the consumers' availability come in; the
//! writes that may not happen yet are taken out of the plan, and creates in
//! stages not yet reached get the content rolled out before (read by the
//! controller from one copy that holds it: the copy views keep no payload).
//!
//! A source's content moves one stage at a time. The first stage gets it
//! at once; a stage settles when every copy there holds it (and, with
//! `restartConsumers`, the workloads that use it are available again);
//! the next stage opens a pause after that. A stage that has not settled
//! within the settle timeout halts the rollout there: later stages keep
//! the content they had until it settles, or the source changes again.
//! Namespaces that no stage selects make the last stage. A source with no
//! copy at other content past the first stage (a new source, or a change
//! back to what later stages hold) is not staged: nothing there to keep.
//!
//! Only content the rule rolled out counts as content a stage holds: a
//! copy's mark proves that Copyrator wrote its payload there once, not
//! that it was the last thing written. The rule keeps, by copy name, the
//! digests of the contents its copies may hold ([`RolledOut`]: the current
//! content, and while a rollout is under way the contents it replaces),
//! and its status carries them over a restart. A copy at any other content
//! (an older one put back) is restored at once, like an edited one, and is
//! never handed on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::cache::index::{CopyIndex, NamespaceInfo, Object};
use crate::core::plan::{Action, Desired, DesiredCopies, Plan};
pub(crate) use crate::core::resolve::Stages;

/// How soon a pass that wrote a stage's copies is followed by another,
/// which finds the stage settled (its writes went through) or not.
pub(crate) const AFTER_WRITES: Duration = Duration::from_millis(100);
/// How often a stage still settling is looked at again.
pub(crate) const SETTLE_RECHECK: Duration = Duration::from_secs(2);
/// How often a halted stage is looked at again.
pub(crate) const HALTED_RECHECK: Duration = Duration::from_secs(10);
/// How far one source's content has gone.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Track {
    /// The payload hash being rolled out.
    pub(crate) payload: u64,
    /// The last stage open to it.
    pub(crate) open: usize,
    /// When that stage opened.
    pub(crate) opened_at: Instant,
    /// When that stage settled, if it has.
    pub(crate) settled_at: Option<Instant>,
    /// The content rolled out before, once read: its hash and payload.
    pub(crate) earlier: Option<(u64, Arc<BTreeMap<String, Value>>)>,
    /// Where it stood after the last pass that looked at it, and its
    /// source (`namespace/name`), for passes that look at other sources.
    pub(crate) phase: Phase,
    pub(crate) source: String,
}

/// A rule's rollouts under way, by source name (kept between passes).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Rollouts {
    pub(crate) by_name: BTreeMap<String, Track>,
    /// What the rule's copies may hold as rolled out; `None` until it is
    /// read from the rule's status (the first pass after a start).
    pub(crate) rolled_out: Option<RolledOut>,
}

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
    /// The open stage did not settle in time: why (the workloads not
    /// available, or the copies not written).
    Halted(Vec<String>),
}

/// One source's rollout, for the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    pub(crate) source: String,
    /// Index and name of the last stage open to the new content.
    pub(crate) stage: usize,
    pub(crate) stage_name: String,
    pub(crate) stages: usize,
    pub(crate) phase: Phase,
}

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

/// What the stages did to a plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Gated {
    /// Writes of new content held back for a later stage.
    pub(crate) held: u32,
    /// Each source whose rollout is under way, by name.
    pub(crate) progress: Vec<Progress>,
    /// When to look again (a pause ends, a stage may have settled).
    pub(crate) recheck_at: Option<Instant>,
    pub(crate) checks: Vec<AvailabilityCheck>,
    /// Copies whose payload the controller should read into the source's
    /// [`Track::earlier`]: the content rolled out before, which creates in
    /// stages not reached yet need.
    pub(crate) reads: Vec<EarlierRead>,
    /// What the rule's copies may hold as rolled out after this pass, for
    /// its status.
    pub(crate) rolled_out: RolledOut,
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

impl Gated {
    fn recheck_no_later_than(&mut self, at: Instant) {
        self.recheck_at = Some(self.recheck_at.map_or(at, |r| r.min(at)));
    }
}

/// What the controller last saw of a stage's consumers, for a content:
/// `Some(not available)` (empty: all available), `None` if not looked at.
pub(crate) type Availability<'a> = &'a dyn Fn(&str, usize, u64) -> Option<Vec<String>>;

/// What a pass needs to stage its plan.
pub(crate) struct Inputs<'a> {
    pub(crate) stages: &'a Stages,
    pub(crate) rule_uid: &'a str,
    pub(crate) namespaces: &'a BTreeMap<String, NamespaceInfo>,
    pub(crate) copies: &'a CopyIndex,
    /// Settled means the consumers are available too (`restartConsumers`).
    pub(crate) consumers: bool,
    pub(crate) availability: Availability<'a>,
    pub(crate) now: Instant,
    /// Every copy the sources want now (a pass over a staged rule looks at
    /// everything).
    pub(crate) desired: &'a DesiredCopies,
    /// The digest of a content (its payload hash) for a copy name, as the
    /// status keeps it; `None` where none can be made (no key).
    pub(crate) digest: &'a dyn Fn(&str, u64) -> Option<String>,
}

/// Stage `plan` (made for everything, as if there were no stages): take
/// out the writes of new content into stages not open yet, and make creates
/// there with the content rolled out before; advance `rollouts`.
pub(crate) fn gate(plan: &mut Plan, inputs: &Inputs<'_>, rollouts: &mut Rollouts) -> Gated {
    let stages = inputs.stages;
    let Rollouts {
        by_name: tracks,
        rolled_out,
    } = rollouts;
    let rolled_out = rolled_out.get_or_insert_with(RolledOut::new);
    let recorded = |name: &str, payload: u64| {
        (inputs.digest)(name, payload)
            .is_some_and(|digest| rolled_out.get(name).is_some_and(|d| d.contains(&digest)))
    };
    let stage_of = |namespace: &str| {
        let labels = inputs.namespaces.get(namespace).map(|ns| &ns.labels);
        stages.stage_of(namespace, labels.unwrap_or(&BTreeMap::new()))
    };
    // Per source name: its new content, the stages with writes of it
    // still owed, and the copy at other content in the latest stage past
    // the first (what later stages hold: the content rolled out before).
    let mut owed: HashMap<String, Owed> = HashMap::new();
    for action in &plan.actions {
        let Some((desired, namespace, new_content)) = write_of(action, &recorded) else {
            continue;
        };
        if !new_content {
            continue;
        }
        let stage = stage_of(namespace);
        let entry = owed.entry(desired.name.clone()).or_insert_with(|| Owed {
            desired: desired.clone(),
            stages: BTreeSet::new(),
            held_later: false,
            earlier: None,
        });
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
    let mut gated = Gated::default();
    let mut open_through: HashMap<String, (usize, Option<Arc<Desired>>)> = HashMap::new();
    for (name, owed) in &owed {
        let desired = &owed.desired;
        // Nothing held elsewhere and no rollout under way: a new source,
        // or a change back to what later stages hold (not staged).
        if !owed.held_later && !tracks.contains_key(name) {
            continue;
        }
        let track = tracks
            .entry(name.clone())
            .and_modify(|t| {
                if t.payload != desired.payload_hash {
                    *t = Track::start(desired.payload_hash, inputs.now);
                }
            })
            .or_insert_with(|| Track::start(desired.payload_hash, inputs.now));
        let phase = advance(track, stages, owed, inputs, &mut gated);
        track.phase = phase.clone();
        track.source = desired.source.clone();
        let earlier = earlier_content(track, owed, &mut gated);
        open_through.insert(name.clone(), (track.open, earlier));
        gated.progress.push(Progress {
            source: desired.source.clone(),
            stage: track.open,
            stage_name: stages.name(track.open).to_owned(),
            stages: stages.count(),
            phase,
        });
    }
    // Passes over a staged rule look at everything: a source with nothing
    // owed has rolled out everywhere.
    tracks.retain(|name, _| open_through.contains_key(name));
    gated.progress.sort_by(|a, b| a.source.cmp(&b.source));
    let actions = std::mem::take(&mut plan.actions);
    for action in actions {
        match held_back(action, &open_through, &stage_of, &recorded) {
            Ok(action) => plan.actions.push(action),
            Err(()) => gated.held += 1,
        }
    }
    gated.rolled_out = record_rolled_out(rolled_out, plan.too_costly, inputs, &open_through);
    gated
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
    under_way: &HashMap<String, (usize, Option<Arc<Desired>>)>,
) -> RolledOut {
    if !too_costly {
        *record = next_rolled_out(record, inputs, under_way);
    }
    record.clone()
}

fn next_rolled_out(
    before: &mut RolledOut,
    inputs: &Inputs<'_>,
    under_way: &HashMap<String, (usize, Option<Arc<Desired>>)>,
) -> RolledOut {
    let mut names: Vec<&Arc<Desired>> = inputs.desired.values().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut next = RolledOut::new();
    for desired in names.into_iter().take(MAX_ROLLED_OUT_SOURCES) {
        let Some(current) = (inputs.digest)(&desired.name, desired.payload_hash) else {
            continue;
        };
        let mut digests = if under_way.contains_key(&desired.name) {
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
fn earlier_content(track: &Track, owed: &Owed, gated: &mut Gated) -> Option<Arc<Desired>> {
    match (&track.earlier, &owed.earlier) {
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
    stages: BTreeSet<usize>,
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

impl Track {
    fn start(payload: u64, now: Instant) -> Self {
        Self {
            payload,
            open: 0,
            opened_at: now,
            settled_at: None,
            earlier: None,
            phase: Phase::Settling,
            source: String::new(),
        }
    }
}

/// Open as many stages as have settled and paused; say where it stands.
fn advance(
    track: &mut Track,
    stages: &Stages,
    owed: &Owed,
    inputs: &Inputs<'_>,
    gated: &mut Gated,
) -> Phase {
    let now = inputs.now;
    let name = owed.desired.name.as_str();
    loop {
        let stage = track.open;
        if stage + 1 >= stages.count() {
            // The last stage is open: nothing is held any more.
            gated.recheck_no_later_than(now + SETTLE_RECHECK);
            return Phase::Settling;
        }
        let written = !owed.stages.contains(&stage);
        let not_available = if !written {
            Some(vec![format!(
                "copies in stage {} not written yet",
                stages.name(stage)
            )])
        } else if inputs.consumers {
            let seen = (inputs.availability)(name, stage, track.payload);
            if seen.as_ref().is_none_or(|waiting| !waiting.is_empty()) {
                // Not known to be available: look (again).
                gated.checks.push(AvailabilityCheck {
                    name: name.to_owned(),
                    stage,
                    payload: track.payload,
                    namespaces: namespaces_in(inputs, name, stage, stages),
                    desired: owed.desired.clone(),
                });
            }
            match seen {
                Some(waiting) if waiting.is_empty() => None,
                Some(waiting) => Some(waiting),
                None => Some(vec!["consumers not looked at yet".to_owned()]),
            }
        } else {
            None
        };
        match not_available {
            None => {
                let settled = *track.settled_at.get_or_insert(now);
                let opens_at = settled + stages.pause(stage);
                if now < opens_at {
                    gated.recheck_no_later_than(opens_at);
                    return Phase::Pausing;
                }
                track.open += 1;
                track.opened_at = now;
                track.settled_at = None;
            }
            Some(why) => {
                track.settled_at = None;
                if now >= track.opened_at + stages.settle_timeout {
                    gated.recheck_no_later_than(now + HALTED_RECHECK);
                    return Phase::Halted(why);
                }
                gated.recheck_no_later_than(now + SETTLE_RECHECK);
                return Phase::Settling;
            }
        }
    }
}

/// The namespaces of `stage` that hold a copy of `name`.
fn namespaces_in(inputs: &Inputs<'_>, name: &str, stage: usize, stages: &Stages) -> Vec<String> {
    let mut out: Vec<String> = inputs
        .copies
        .owned_by(inputs.rule_uid)
        .filter(|c| &*c.name == name)
        .filter(|c| {
            let labels = inputs.namespaces.get(&*c.namespace).map(|ns| &ns.labels);
            stages.stage_of(&c.namespace, labels.unwrap_or(&BTreeMap::new())) == stage
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
    open_through: &HashMap<String, (usize, Option<Arc<Desired>>)>,
    stage_of: &dyn Fn(&str) -> usize,
    recorded: &dyn Fn(&str, u64) -> bool,
) -> Result<Action, ()> {
    let Some((desired, namespace, new_content)) = write_of(&action, recorded) else {
        return Ok(action);
    };
    let Some((open, earlier)) = open_through.get(&desired.name) else {
        return Ok(action);
    };
    if stage_of(namespace) <= *open || !new_content {
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
    use crate::core::plan::tests::{World, rule, verbs};
    use crate::core::resolve::{REST, Stage, TargetSelector};
    use serde_json::json;

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
    fn rolled_out_at(value: &str) -> Rollouts {
        rolled_out_named("cm", value)
    }

    /// [`rolled_out_at`], for the copies named `name`.
    fn rolled_out_named(name: &str, value: &str) -> Rollouts {
        Rollouts {
            rolled_out: Some(RolledOut::from([(
                name.to_owned(),
                vec![digest_named(name, value)],
            )])),
            ..Rollouts::default()
        }
    }

    /// Stage the plan of `w` at `now`, with the consumers' availability
    /// `available` (when they count).
    fn staged(
        w: &World,
        rollouts: &mut Rollouts,
        now: Instant,
        consumers: Option<Availability<'_>>,
    ) -> (Plan, Gated) {
        staged_of(&simple(), w, rollouts, now, consumers)
    }

    /// [`staged`], the plan of `rule`.
    fn staged_of(
        rule: &crate::core::resolve::ResolvedRule,
        w: &World,
        rollouts: &mut Rollouts,
        now: Instant,
        consumers: Option<Availability<'_>>,
    ) -> (Plan, Gated) {
        let stages = canary_then_rest();
        let mut plan = w.plan(rule);
        let none = |_: &str, _: usize, _: u64| None;
        let desired = crate::core::plan::desired_copies(
            rule,
            &w.sources,
            &crate::core::scope::Scope::everything(),
        );
        let inputs = Inputs {
            stages: &stages,
            rule_uid: "rule-1",
            namespaces: &w.namespaces,
            copies: &w.copies,
            consumers: consumers.is_some(),
            availability: consumers.unwrap_or(&none),
            now,
            desired: &desired,
            digest: &digest,
        };
        let gated = gate(&mut plan, &inputs, rollouts);
        (plan, gated)
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
        rollouts.by_name.get_mut("cm").unwrap().earlier = Some((v1_hash, Arc::new(v1)));
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
        let mut rollouts = Rollouts {
            rolled_out: Some(rolled_out_from_status(&status)),
            ..Rollouts::default()
        };
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
        let mut rollouts = Rollouts {
            rolled_out: Some(gated.rolled_out.clone()),
            ..Rollouts::default()
        };
        let (plan, gated) = staged(&w, &mut rollouts, t0, None);
        assert_eq!(places(&plan), ["update r1"], "v0 restored at once");
        let read: Vec<&str> = gated.reads.iter().map(|r| r.namespace.as_str()).collect();
        assert_eq!(read, ["r2"], "v1 is read from r2 alone");
        assert_eq!(gated.held, 2, "r2 keeps v1; r3 waits for it");
        assert_nothing_written_holds(&plan, "v0");
    }

    #[test]
    fn no_record_after_a_restart_holds_nothing_back() {
        // A staged rule whose status kept nothing (written by a version
        // before the record, or the key changed): no copy at other content
        // is taken as rolled out, and every copy gets the new content.
        let mut w = changed_world();
        restarted(&mut w);
        let mut rollouts = Rollouts::default();
        let (plan, gated) = staged(&w, &mut rollouts, Instant::now(), None);
        assert_eq!(places(&plan), ["update c1", "update r1", "update r2"]);
        assert!(gated.progress.is_empty() && gated.held == 0);
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
    fn a_new_source_is_not_staged() {
        let mut w = World::new(&["src", "c1", "r1"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v1"}));
        let mut rollouts = Rollouts::default();
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
        assert_eq!(stages.stage_of("c1", &none), 0);
        assert_eq!(stages.stage_of("r1", &none), 1);
        assert_eq!(stages.name(1), REST);
        assert_eq!(stages.count(), 2);
    }
}
