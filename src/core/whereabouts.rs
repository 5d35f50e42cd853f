//! `copyrator where`: the state of one place that a source's copy should
//! hold, or does hold, under one rule. Pure: the copy's content is judged
//! against [`desired_copy`](crate::core::plan::desired_copy) with the same
//! comparison a pass makes, so "stale" means exactly "a pass would write".

use std::collections::{BTreeMap, HashSet};

use crate::api::kinds::Kind;
use crate::api::rule::RuleStatus;
use crate::cache::index::{NamespaceInfo, Object};
use crate::core::plan::{Claim, Desired, Occupied, desired_copy, occupied, target_namespaces};
use crate::core::resolve::ResolvedRule;

/// How one copy of a source stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CopyState {
    /// The copy is what the rule would write now.
    InPlace,
    /// Created under `syncPolicy: CreateOnly` and handed over to its
    /// namespace: never written again, so its content is not judged.
    CreateOnly,
    /// The copy differs from what the rule would write now (the source, the
    /// rule or the copy changed since the last write).
    Stale,
    /// A target namespace without the copy.
    Missing,
    /// An object the rule did not write holds the copy's payload, and the
    /// rule adopts such objects (`spec.adopt`): a pass takes it over.
    Adoptable,
    /// Another writer keeps changing the copy back (the rule's status
    /// names it).
    Contested { writer: String },
    /// Another object holds the name and is left alone.
    Conflict { reason: String },
    /// The API server refuses the rule's writes (its status says why), and
    /// this copy is one still owed.
    Refused { reason: String },
    /// A copy of this source that the rule no longer targets (or whose rule
    /// is gone): a pass deletes it.
    Unwanted { reason: String },
    /// A staged rollout has not reached this namespace's stage yet: the
    /// copy keeps the content it holds (why: its stage, and where the
    /// rollout is).
    Held { reason: String },
    /// A copy made by a rule the command's flags do not follow (why, and
    /// the flags that would): a question asked of the wrong rules, not a
    /// copy out of place.
    NotFollowed { reason: String },
}

impl CopyState {
    /// Whether the copy is as it should be: in place, or handed over.
    pub(crate) fn is_current(&self) -> bool {
        matches!(self, CopyState::InPlace | CopyState::CreateOnly)
    }

    /// One word (two for "in place") for the state, as printed.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            CopyState::InPlace => "in place",
            CopyState::CreateOnly => "create-only",
            CopyState::Stale => "stale",
            CopyState::Missing => "missing",
            CopyState::Adoptable => "adoptable",
            CopyState::Contested { .. } => "contested",
            CopyState::Conflict { .. } => "conflict",
            CopyState::Refused { .. } => "refused",
            CopyState::Unwanted { .. } => "unwanted",
            CopyState::Held { .. } => "held",
            CopyState::NotFollowed { .. } => "not followed",
        }
    }

    /// Who or what the state is about: the other writer, or why.
    pub(crate) fn detail(&self) -> Option<&str> {
        match self {
            CopyState::Contested { writer } => Some(writer),
            CopyState::Conflict { reason }
            | CopyState::Refused { reason }
            | CopyState::Unwanted { reason }
            | CopyState::Held { reason }
            | CopyState::NotFollowed { reason } => Some(reason),
            _ => None,
        }
    }
}

/// What a rule's status says of one place: its entries name a namespace
/// and name (contested copies with their writer, conflicts with why), and
/// its Ready condition says when writes are refused. A member's places
/// have no entries of their own in the status (it counts them only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StatusFacts {
    /// The other writer, when the place is listed as contested.
    pub(crate) contested_by: Option<String>,
    /// Why, when the place is listed as a conflict.
    pub(crate) conflict: Option<String>,
    /// The Ready condition's message, when its reason is `SyncFailed`.
    pub(crate) writes_refused: Option<String>,
    /// The source's staged rollout, when one is under way: the number of
    /// the last stage it reached (from 1), and how it stands there.
    pub(crate) rollout: Option<(u32, String)>,
}

impl StatusFacts {
    /// What `status` says of the place `namespace/name` of the source
    /// `source` (`namespace/name`) in the home cluster (the status lists
    /// members' conflicts and contested copies too, each naming its
    /// cluster).
    pub(crate) fn of(
        status: Option<&RuleStatus>,
        namespace: &str,
        name: &str,
        source: &str,
    ) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        let at = |cluster: &Option<String>, ns: &str, n: &str| {
            cluster.is_none() && ns == namespace && n == name
        };
        Self {
            contested_by: status
                .contested
                .iter()
                .find(|c| at(&c.cluster, &c.namespace, &c.name))
                .map(|c| c.writer.clone()),
            conflict: status
                .conflicts
                .iter()
                .find(|c| at(&c.cluster, &c.namespace, &c.name))
                .map(|c| c.reason.clone()),
            writes_refused: status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "SyncFailed")
                .map(|c| c.message.clone()),
            rollout: status
                .rollouts
                .iter()
                .find(|r| r.source == source)
                .map(|r| {
                    let phase = match &r.message {
                        Some(why) => format!("{}: {why}", r.phase),
                        None => r.phase.clone(),
                    };
                    // A stage that awaits its approval is not open yet.
                    let open = if r.phase == "AwaitingApproval" {
                        r.stage_number.saturating_sub(1)
                    } else {
                        r.stage_number
                    };
                    (
                        open,
                        format!("the rollout is at stage {} ({phase})", r.stage),
                    )
                }),
        }
    }
}

/// The rule a place is judged under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Judge<'a> {
    /// `namespace/name` of the rule.
    pub(crate) rule: &'a str,
    pub(crate) uid: &'a str,
    pub(crate) claim: Claim,
}

/// The state of a target place of `desired` (the copy the rule would write
/// now), holding `current` (absent: nothing of that name is there).
pub(crate) fn target_state(
    judge: Judge<'_>,
    desired: &Desired,
    current: Option<&Object>,
    facts: &StatusFacts,
) -> CopyState {
    let Some(current) = current else {
        return owed(CopyState::Missing, facts);
    };
    let ours = current.rule_uid() == Some(judge.uid) || current.is_unlabelled_copy_of(judge.rule);
    if ours && current.create_only {
        return CopyState::CreateOnly;
    }
    if ours && current.source_ref.as_deref() != Some(desired.source.as_str()) {
        // Two sources of one name: the other one wins this place.
        let other = current.source_ref.as_deref().unwrap_or("another source");
        return CopyState::Conflict {
            reason: facts
                .conflict
                .clone()
                .unwrap_or_else(|| format!("the copy of {other} holds the name")),
        };
    }
    if let Some(writer) = &facts.contested_by {
        return CopyState::Contested {
            writer: writer.clone(),
        };
    }
    match occupied(desired, current, judge.claim, judge.rule) {
        Occupied::Ours => CopyState::InPlace,
        Occupied::Conflict(reason) => CopyState::Conflict { reason },
        // Another tool's object holding the copy's payload: a pass takes it.
        Occupied::Adopt => owed(CopyState::Adoptable, facts),
        // Ours but different, or a foreign object `Overwrite` takes over.
        Occupied::Update | Occupied::Recreate => owed(CopyState::Stale, facts),
    }
}

/// The state of a copy of the source at a place the rule does not target
/// (or whose rule is gone): handed over copies stay, others are deleted.
pub(crate) fn leftover_state(current: &Object, why: &str) -> CopyState {
    if current.create_only {
        CopyState::CreateOnly
    } else {
        CopyState::Unwanted {
            reason: why.to_owned(),
        }
    }
}

/// What is known of the rule a copy names, when no rule followed here
/// judges its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CopyRule {
    /// It exists and is followed: it no longer copies the source there.
    Live,
    /// It exists, or may, but the flags do not follow it: why, and what
    /// to pass.
    NotFollowed(String),
    /// It is gone.
    Gone,
}

/// One place of one cluster that holds, or should hold, a copy of the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// What the copy there holds: its payload hash, when there is a copy.
    pub(crate) content: Option<u64>,
    /// `namespace/name` of the rule the copy is judged under (or that the
    /// copy names).
    pub(crate) rule: Option<String>,
    pub(crate) state: CopyState,
    /// What made the object before a rule adopted it, for a copy that was
    /// adopted (`spec.adopt`).
    pub(crate) adopted_from: Option<String>,
}

/// A stale copy in a namespace whose stage a staged rollout has not
/// reached yet is held, not stale; any other state stands.
fn held_back(
    state: CopyState,
    rule: &ResolvedRule,
    facts: &StatusFacts,
    (cluster, namespace): (crate::core::resolve::ClusterOf<'_>, &str),
    info: &NamespaceInfo,
) -> CopyState {
    if let (CopyState::Stale, Some(stages), Some((reached, how))) =
        (&state, &rule.stages, &facts.rollout)
    {
        let stage = stages.stage_of(cluster, namespace, &info.labels);
        if stage + 1 > *reached as usize {
            return CopyState::Held {
                reason: format!("its stage {} is not reached yet; {how}", stages.name(stage)),
            };
        }
    }
    state
}

/// A rule that selects the source, as it is followed in one cluster (for a
/// member, as a member's pass follows it), with its status
/// entries where they speak of this cluster.
pub(crate) struct Follower<'a> {
    pub(crate) rule: &'a ResolvedRule,
    pub(crate) status: Option<&'a RuleStatus>,
    /// The cluster it is followed in (its stages may cover some alone).
    pub(crate) cluster: crate::core::resolve::ClusterOf<'a>,
}

/// Every place of one cluster where a copy of `source` is or should be:
/// each target namespace of each rule in `followers` (a terminating one
/// only where something is there), then every other object there that is
/// a copy of `source` (`copies`: the objects of every name a copy of the
/// source takes, by `(namespace, name)`; see [`copy_names`]). `rule_of` tells what is known of the rule a copy names
/// (see [`CopyRule`]), so that a copy whose rule is gone, or is not
/// followed by the command, says so.
pub(crate) fn places(
    source: &Object,
    followers: &[Follower<'_>],
    namespaces: &BTreeMap<String, NamespaceInfo>,
    copies: &BTreeMap<PlaceOf, Object>,
    rule_of: &dyn Fn(&Object) -> CopyRule,
) -> Vec<Place> {
    let mut out = Vec::new();
    let mut judged: HashSet<PlaceOf> = HashSet::new();
    for follower in followers {
        let rule = follower.rule;
        let desired = desired_copy(rule, source);
        let rule_name = rule.key.to_string();
        let judge = Judge {
            rule: &rule_name,
            uid: &rule.uid,
            claim: rule.into(),
        };
        let (targets, _) = target_namespaces(rule, namespaces);
        for (namespace, info) in targets {
            let place = (rule.copy_kind, namespace.clone(), desired.name.clone());
            if holds_sources(rule, namespace) || judged.contains(&place) {
                continue;
            }
            let current = copies.get(&place);
            if current.is_none() && info.terminating {
                continue;
            }
            let facts = StatusFacts::of(follower.status, namespace, &desired.name, &desired.source);
            judged.insert(place);
            let state = held_back(
                target_state(judge, &desired, current, &facts),
                rule,
                &facts,
                (follower.cluster, namespace),
                info,
            );
            // A foreign object's content says nothing of the copies.
            let content = current
                .filter(|_| !matches!(state, CopyState::Conflict { .. }))
                .map(|c| c.payload_hash);
            let adopted_from = current
                .filter(|_| content.is_some())
                .and_then(|c| c.adopted_from.as_deref().map(str::to_owned));
            out.push(Place {
                namespace: namespace.clone(),
                name: desired.name.clone(),
                content,
                rule: Some(rule_name.clone()),
                state,
                adopted_from,
            });
        }
    }
    let source_ref = format!("{}/{}", source.namespace, source.name);
    for (place, copy) in copies {
        let namespace = &place.1;
        let is_copy = copy.rule_uid().is_some() || copy.create_only;
        if judged.contains(place)
            || !is_copy
            || copy.source_ref.as_deref() != Some(source_ref.as_str())
        {
            continue;
        }
        let judged_here = copy
            .rule_uid()
            .is_some_and(|uid| followers.iter().any(|f| f.rule.uid == uid));
        let state = if judged_here {
            leftover_state(
                copy,
                "the rule does not target this namespace; its next pass deletes the copy (unless prune is off)",
            )
        } else {
            unjudged_state(copy, rule_of(copy))
        };
        out.push(Place {
            namespace: namespace.clone(),
            name: copy.name.to_string(),
            content: Some(copy.payload_hash),
            rule: copy.rule_ref.as_deref().map(str::to_owned),
            state,
            adopted_from: copy.adopted_from.as_deref().map(str::to_owned),
        });
    }
    out.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    out
}

/// Whether the places of `rule`'s copies in `namespace` hold its sources:
/// a source namespace receives nothing of its own, but a copy under
/// another name (`transform.name`) or of another kind (`transform.toKind`).
fn holds_sources(rule: &ResolvedRule, namespace: &str) -> bool {
    rule.transform.naming.is_same()
        && rule.copy_kind == rule.kind
        && rule.source_namespaces.iter().any(|ns| ns == namespace)
}

/// A place of a copy: the copy's kind, namespace and name.
pub(crate) type PlaceOf = (Kind, String, String);

/// The kinds and names a copy of the source `name` of kind `kind` takes
/// under the rules of `followers`, its own first, each once: what `places`
/// must be given.
pub(crate) fn copy_names(
    kind: Kind,
    name: &str,
    followers: &[Follower<'_>],
) -> Vec<(Kind, String)> {
    let mut names = vec![(kind, name.to_owned())];
    for follower in followers {
        let rule = follower.rule;
        let copy = (
            rule.copy_kind,
            rule.transform.naming.name_unchecked(name).into_owned(),
        );
        if !names.contains(&copy) {
            names.push(copy);
        }
    }
    names
}

/// The state of a copy of the source that no rule followed here judges,
/// by what is known of the rule it names.
fn unjudged_state(copy: &Object, rule_of_copy: CopyRule) -> CopyState {
    let rule = copy.rule_ref.as_deref().unwrap_or("(unknown)");
    match rule_of_copy {
        CopyRule::NotFollowed(reason) => CopyState::NotFollowed { reason },
        CopyRule::Live => leftover_state(
            copy,
            &format!(
                "rule {rule} no longer copies the source; its next pass deletes the copy (unless prune is off)"
            ),
        ),
        CopyRule::Gone => leftover_state(
            copy,
            &format!(
                "its rule {rule} is gone; the operator deletes the copy at start and on resync"
            ),
        ),
    }
}

/// A write still owed is refused when the rule's writes are.
fn owed(state: CopyState, facts: &StatusFacts) -> CopyState {
    match &facts.writes_refused {
        Some(reason) => CopyState::Refused {
            reason: reason.clone(),
        },
        None => state,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::api::rule::{Condition, ConflictEntry, ConflictPolicy, ContestedEntry};

    const RULE: &str = "ops/r";
    const UID: &str = "uid-r";

    fn judge(policy: ConflictPolicy) -> Judge<'static> {
        Judge {
            rule: RULE,
            uid: UID,
            claim: policy.into(),
        }
    }

    fn source(value: &str) -> Object {
        Object::new(
            "shared",
            "cfg",
            "uid-source".into(),
            "1".into(),
            [("copy".to_owned(), "true".to_owned())].into(),
            BTreeMap::new(),
            [("data".to_owned(), json!({"k": value}))].into(),
        )
    }

    /// The rule `ops/r` copying ConfigMaps labelled `copy: true` from
    /// `shared`, with `spec` where given, resolved.
    fn resolved_rule(spec: Option<crate::api::rule::RuleSpec>) -> ResolvedRule {
        let mut rule = crate::api::rule::CopyratorRule::default();
        rule.metadata.namespace = Some("ops".into());
        rule.metadata.name = Some("r".into());
        rule.metadata.uid = Some(UID.into());
        rule.rule_type = Some(crate::api::rule::RuleType::ConfigMap);
        rule.selector = Some(serde_json::from_value(json!({"copy": "true"})).expect("a map"));
        rule.namespace = Some(json!("shared"));
        rule.spec = spec;
        let trust = crate::core::resolve::Trust::new("ops", false);
        rule.resolve(&trust).expect("a valid rule")
    }

    fn desired(value: &str) -> Desired {
        crate::core::plan::desired_copy(&resolved_rule(None), &source(value))
    }

    /// The copy a pass writes for `desired`, in namespace `ns`.
    fn copy_of(desired: &Desired, ns: &str) -> Object {
        Object::new(
            ns,
            &desired.name,
            "uid-copy".into(),
            "7".into(),
            desired.labels.clone(),
            desired.annotations.clone(),
            desired.payload.clone(),
        )
    }

    fn foreign(ns: &str) -> Object {
        Object::new(
            ns,
            "cfg",
            "uid-foreign".into(),
            "3".into(),
            BTreeMap::new(),
            BTreeMap::new(),
            [("data".to_owned(), json!({"k": "mine"}))].into(),
        )
    }

    fn none() -> StatusFacts {
        StatusFacts::default()
    }

    #[test]
    fn a_copy_as_the_rule_writes_it_is_in_place_and_one_of_older_content_is_stale() {
        let now = desired("v2");
        let fresh = copy_of(&now, "t1");
        let state = target_state(judge(ConflictPolicy::Skip), &now, Some(&fresh), &none());
        assert_eq!(state, CopyState::InPlace);
        assert!(state.is_current());
        let old = copy_of(&desired("v1"), "t1");
        let state = target_state(judge(ConflictPolicy::Skip), &now, Some(&old), &none());
        assert_eq!(state, CopyState::Stale);
        assert!(!state.is_current());
        // A label another tool added does not make it stale.
        let mut labelled = copy_of(&now, "t1");
        labelled.labels.insert("team".into(), "x".into());
        labelled.set_owned(|_, key| key != "team");
        assert_eq!(
            target_state(judge(ConflictPolicy::Skip), &now, Some(&labelled), &none()),
            CopyState::InPlace
        );
    }

    #[test]
    fn nothing_there_is_missing_and_refused_when_the_status_says_writes_are() {
        let now = desired("v");
        assert_eq!(
            target_state(judge(ConflictPolicy::Skip), &now, None, &none()),
            CopyState::Missing
        );
        let refused = StatusFacts {
            writes_refused: Some("1 write refused: quota exceeded".into()),
            ..none()
        };
        let state = target_state(judge(ConflictPolicy::Skip), &now, None, &refused);
        assert_eq!(state.word(), "refused");
        assert_eq!(state.detail(), Some("1 write refused: quota exceeded"));
        // A copy in place is in place whatever else is refused.
        let fresh = copy_of(&now, "t1");
        assert_eq!(
            target_state(judge(ConflictPolicy::Skip), &now, Some(&fresh), &refused),
            CopyState::InPlace
        );
    }

    #[test]
    fn a_foreign_object_is_a_conflict_unless_overwrite_takes_it() {
        let now = desired("v");
        let state = target_state(
            judge(ConflictPolicy::Skip),
            &now,
            Some(&foreign("t1")),
            &none(),
        );
        assert_eq!(
            state,
            CopyState::Conflict {
                reason: "a ConfigMap not made by Copyrator is there".into()
            }
        );
        assert_eq!(
            target_state(
                judge(ConflictPolicy::Overwrite),
                &now,
                Some(&foreign("t1")),
                &none()
            ),
            CopyState::Stale
        );
        // Another rule's copy is never taken.
        let mut other = copy_of(&now, "t1");
        other
            .labels
            .insert(crate::LABEL_RULE_UID.into(), "uid-other".into());
        other
            .annotations
            .insert(crate::ANNOTATION_RULE.into(), "ops/other".into());
        other.rehash();
        let state = target_state(
            judge(ConflictPolicy::Overwrite),
            &now,
            Some(&other),
            &none(),
        );
        assert_eq!(state.word(), "conflict");
        assert!(state.detail().is_some_and(|d| d.contains("ops/other")));
    }

    #[test]
    fn a_create_only_copy_is_shown_as_such_whatever_its_content() {
        let mut old = copy_of(&desired("v1"), "t1");
        old.labels
            .insert(crate::LABEL_SYNC_POLICY.into(), crate::CREATE_ONLY.into());
        old.rehash();
        let state = target_state(
            judge(ConflictPolicy::Skip),
            &desired("v2"),
            Some(&old),
            &none(),
        );
        assert_eq!(state, CopyState::CreateOnly);
        assert!(state.is_current());
        assert_eq!(leftover_state(&old, "not targeted"), CopyState::CreateOnly);
        let plain = copy_of(&desired("v1"), "t9");
        assert_eq!(
            leftover_state(&plain, "not targeted"),
            CopyState::Unwanted {
                reason: "not targeted".into()
            }
        );
    }

    #[test]
    fn the_status_names_the_other_writer_of_a_contested_copy_and_why_of_a_conflict() {
        let now = desired("v");
        let status = RuleStatus {
            contested: vec![ContestedEntry {
                cluster: None,
                namespace: "t1".into(),
                name: "cfg".into(),
                writer: "kubectl-edit".into(),
            }],
            conflicts: vec![ConflictEntry {
                cluster: None,
                namespace: "t2".into(),
                name: "cfg".into(),
                reason: "shadowed by shared2/cfg".into(),
            }],
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "CopiesContested".into(),
                ..Condition::default()
            }],
            ..RuleStatus::default()
        };
        let t1 = StatusFacts::of(Some(&status), "t1", "cfg", "shared/cfg");
        assert_eq!(t1.contested_by.as_deref(), Some("kubectl-edit"));
        assert_eq!(t1.writes_refused, None, "contested is no refusal");
        let stale = copy_of(&desired("v0"), "t1");
        assert_eq!(
            target_state(judge(ConflictPolicy::Skip), &now, Some(&stale), &t1),
            CopyState::Contested {
                writer: "kubectl-edit".into()
            }
        );
        // The copy of another source of the same name holds t2/cfg.
        let mut shadow = copy_of(&now, "t2");
        shadow
            .annotations
            .insert(crate::ANNOTATION_SOURCE.into(), "shared2/cfg".into());
        shadow.rehash();
        let t2 = StatusFacts::of(Some(&status), "t2", "cfg", "shared/cfg");
        assert_eq!(
            target_state(judge(ConflictPolicy::Skip), &now, Some(&shadow), &t2),
            CopyState::Conflict {
                reason: "shadowed by shared2/cfg".into()
            }
        );
        assert_eq!(StatusFacts::of(None, "t1", "cfg", "shared/cfg"), none());
        // What a member holds at the same place says nothing of home's.
        let mut in_member = status.clone();
        for c in &mut in_member.contested {
            c.cluster = Some("a".into());
        }
        for c in &mut in_member.conflicts {
            c.cluster = Some("a".into());
        }
        let t1 = StatusFacts::of(Some(&in_member), "t1", "cfg", "shared/cfg");
        assert_eq!(t1.contested_by, None);
        let t2 = StatusFacts::of(Some(&in_member), "t2", "cfg", "shared/cfg");
        assert_eq!(t2.conflict, None);
    }

    fn namespaces(names: &[&str]) -> BTreeMap<String, NamespaceInfo> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), NamespaceInfo::default()))
            .collect()
    }

    #[test]
    fn places_lists_each_target_then_the_copies_no_rule_targets() {
        let resolved = resolved_rule(Some(crate::api::rule::RuleSpec {
            targets: Some(crate::api::rule::Targets {
                include: Some(vec!["t*".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }));
        let now = desired("v2");
        let at = |ns: &str| (Kind::ConfigMap, ns.to_owned(), "cfg".to_owned());
        let copies = BTreeMap::from([
            (at("t1"), copy_of(&now, "t1")),
            (at("t2"), copy_of(&desired("v1"), "t2")),
            (at("t3"), foreign("t3")),
            // Left in a namespace the rule no longer targets.
            (at("x1"), copy_of(&now, "x1")),
            // Someone else's object of that name, elsewhere: not listed.
            (at("x2"), foreign("x2")),
        ]);
        let followers = [Follower {
            cluster: crate::core::resolve::ClusterOf::Home,
            rule: &resolved,
            status: None,
        }];
        let found = places(
            &source("v2"),
            &followers,
            &namespaces(&["shared", "t1", "t2", "t3", "t4", "x1", "x2"]),
            &copies,
            &|copy| match copy.rule_uid() {
                Some(UID) => CopyRule::Live,
                _ => CopyRule::Gone,
            },
        );
        let states: Vec<(&str, &str)> = found
            .iter()
            .map(|p| (p.namespace.as_str(), p.state.word()))
            .collect();
        assert_eq!(
            states,
            [
                ("t1", "in place"),
                ("t2", "stale"),
                ("t3", "conflict"),
                ("t4", "missing"),
                ("x1", "unwanted")
            ]
        );
        assert!(found.iter().all(|p| p.rule.as_deref() == Some(RULE)));
        // Copies whose rule is gone say so; foreign objects stay out.
        let gone = places(&source("v2"), &[], &namespaces(&["x1"]), &copies, &|_| {
            CopyRule::Gone
        });
        let where_gone: Vec<&str> = gone.iter().map(|p| p.namespace.as_str()).collect();
        assert_eq!(where_gone, ["t1", "t2", "x1"]);
        assert!(
            gone.iter()
                .all(|p| p.state.detail().is_some_and(|d| d.contains("is gone"))),
            "{gone:?}"
        );
        // Copies of a rule the command does not follow say so, and why.
        let why =
            "made by rule ops/r, which --namespace default does not follow: pass --namespace ops";
        let elsewhere = places(&source("v2"), &[], &namespaces(&["x1"]), &copies, &|_| {
            CopyRule::NotFollowed(why.into())
        });
        assert_eq!(elsewhere.len(), 3);
        assert!(
            elsewhere
                .iter()
                .all(|p| p.state == CopyState::NotFollowed { reason: why.into() }
                    && !p.state.is_current()),
            "{elsewhere:?}"
        );
    }

    #[test]
    fn a_renamed_copy_is_found_under_its_name_and_beside_its_source() {
        let resolved = resolved_rule(Some(crate::api::rule::RuleSpec {
            transform: Some(crate::api::rule::Transform {
                name: Some(crate::api::rule::CopyName {
                    prefix: Some("platform-".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }));
        let followers = [Follower {
            cluster: crate::core::resolve::ClusterOf::Home,
            rule: &resolved,
            status: None,
        }];
        assert_eq!(
            copy_names(Kind::ConfigMap, "cfg", &followers),
            [
                (Kind::ConfigMap, "cfg".to_owned()),
                (Kind::ConfigMap, "platform-cfg".to_owned())
            ]
        );
        let now = crate::core::plan::desired_copy(&resolved, &source("v"));
        assert_eq!(now.name, "platform-cfg");
        let mut copies = BTreeMap::new();
        copies.insert(
            (Kind::ConfigMap, "t1".to_owned(), "platform-cfg".to_owned()),
            copy_of(&now, "t1"),
        );
        // An object of the source's own name is no copy of this rule's.
        copies.insert(
            (Kind::ConfigMap, "t2".to_owned(), "cfg".to_owned()),
            foreign("t2"),
        );
        let found = places(
            &source("v"),
            &followers,
            &namespaces(&["shared", "t1", "t2"]),
            &copies,
            &|_| CopyRule::Live,
        );
        let states: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|p| (p.namespace.as_str(), p.name.as_str(), p.state.word()))
            .collect();
        assert_eq!(
            states,
            [
                ("shared", "platform-cfg", "missing"),
                ("t1", "platform-cfg", "in place"),
                ("t2", "platform-cfg", "missing"),
            ]
        );
    }
}
