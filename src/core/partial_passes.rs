//! A rule's counts, kept pass by pass over what changed, checked against a
//! pass over everything: after any sequence of changes, each followed by
//! the pass its watch events ask for (carried out as `reconcile` carries it
//! out, writes that fail included), the rule's status says what a pass over
//! everything would say, each write of the pass is one a pass over
//! everything makes, and every other write such a pass makes is still owed
//! (a retry makes it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::api::rule::ConflictEntry;
use crate::cache::index::{NamespaceInfo, Object, ObjectKey};
use crate::core::foreign::{ForeignChange, KnownConflicts};
use crate::core::plan::tests::{World, rule, simple_rule, verbs};
use crate::core::plan::{Action, Desired, Occupied, Plan, concerns_namespace, occupied};
use crate::core::resolve::ResolvedRule;
use crate::core::scope::{Scope, Touch};
use crate::core::tally::{Basis, Counts, Tally, Unsettled};
use crate::{
    ANNOTATION_RULE, ANNOTATION_SOURCE, CREATE_ONLY, LABEL_MANAGED_BY, LABEL_RULE_UID,
    LABEL_SYNC_POLICY,
};

/// The rules' source namespaces: the first rule's own, where its sources
/// are, and the second rule's (its sources have the same names, so the two
/// want the same places).
const SOURCE_NAMESPACES: [&str; 2] = ["src", "src2"];
/// Namespaces that may exist besides it; the last one only appears later.
const NAMESPACES: [&str; 5] = ["team-a", "team-b", "team-c", "ops-d", "ops-e"];
const SOURCE_NAMES: [&str; 3] = ["cm1", "cm2", "cm3"];
/// UID of another rule, not modelled, whose copies no rule here takes.
const OTHER_RULE_UID: &str = "rule-2";
/// UID of the second modelled rule.
const SECOND_RULE_UID: &str = "rule-3";
/// How many specs [`spec`] knows.
const SPECS: usize = 9;

/// The rule's spec at one generation: its targets, by name globs or by
/// namespace labels, and the policies that change what a target holds.
fn spec(variant: usize) -> Value {
    let spec = match variant {
        0 => json!({}),
        1 => json!({"targets": {"include": ["team-*"]}}),
        2 => json!({"targets": {"exclude": ["team-b"]}}),
        3 => json!({"targets": {"namespaceSelector": {"matchLabels": {"env": "dev"}}}}),
        4 => json!({"conflictPolicy": "Overwrite"}),
        5 => json!({"prune": false}),
        6 => json!({"syncPolicy": "CreateOnly"}),
        // Copies under another name; under one name, which the sources meet on.
        7 => json!({"transform": {"name": {"prefix": "p-"}}}),
        _ => json!({"transform": {"name": {"template": "one"}}}),
    };
    json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": spec})
}

/// The modelled rule `index` at the spec `variant`: the first is `src/r`,
/// copying from `src`; the second `src/r2`, copying from `src2`.
fn model_rule(index: usize, variant: usize) -> ResolvedRule {
    if index == 0 {
        return rule(spec(variant));
    }
    let mut value = spec(variant);
    value["namespace"] = json!(SOURCE_NAMESPACES[1]);
    value["metadata"] = json!({"name": "r2", "namespace": "src", "uid": SECOND_RULE_UID});
    let second: crate::api::rule::CopyratorRule =
        serde_json::from_value(value).expect("the second rule");
    second
        .resolve(&crate::core::resolve::Trust::new("src", false))
        .expect("the second rule resolves")
}

/// How a new generation of the rule reaches its next pass.
#[derive(Clone, Copy, Debug)]
enum Delivered {
    /// As the rule watch delivers a changed spec: a pass over everything.
    AsChangedSpec,
    /// Through a pass queued for its status alone, which reads the rule as
    /// it is by then (a spec changed while a status write was under way).
    ThroughStatusPass,
}

/// One change to the cluster.
#[derive(Clone, Debug)]
enum ModelChange {
    NamespaceAppears {
        namespace: usize,
        env: Option<&'static str>,
    },
    NamespaceLabelled {
        namespace: usize,
        env: Option<&'static str>,
    },
    NamespaceTerminates {
        namespace: usize,
    },
    /// The namespace and everything in it.
    NamespaceGoes {
        namespace: usize,
    },
    /// A source of rule `rule` appears, or its data changes.
    SourceWritten {
        rule: usize,
        name: usize,
        data: u8,
    },
    SourceGoes {
        rule: usize,
        name: usize,
    },
    /// The source's label changes: it matches the rules' selector or not.
    SourceLabelled {
        rule: usize,
        name: usize,
        matches: bool,
    },
    /// An object Copyrator did not make appears where no object is.
    ForeignAppears {
        namespace: usize,
        name: usize,
    },
    ForeignGoes {
        namespace: usize,
        name: usize,
    },
    /// Someone else changes the labels or annotations of a foreign object:
    /// with `names_the_rule`, it carries the rule's annotation (set by
    /// them, so it stays foreign), else none of Copyrator's.
    ForeignRelabelled {
        namespace: usize,
        name: usize,
        names_the_rule: bool,
    },
    /// Someone else puts the rule's UID label on a foreign object: the
    /// foreign watch sees it go, the copy watch sees it come, and it is
    /// no copy.
    ForeignLabelledAsCopy {
        namespace: usize,
        name: usize,
    },
    /// Someone else takes the rule-UID label off an object that carried it
    /// without Copyrator having written it: the copy watch sees it go, the
    /// foreign watch sees it come.
    ForgedCopyUnlabelled {
        namespace: usize,
        name: usize,
    },
    /// The foreign watch broke and started again from the current version:
    /// what happened meanwhile is not known.
    ForeignWatchRestarted,
    /// A foreign object goes while the foreign watch is broken; the watch
    /// then starts again from the current version, which says nothing of it.
    ForeignGoesUnseen {
        namespace: usize,
        name: usize,
    },
    /// Another rule's copy appears where no object is.
    OtherRulesCopyAppears {
        namespace: usize,
        name: usize,
    },
    /// An object carrying this rule's labels that someone else wrote
    /// appears where no object is: the copy watch sees it, and it is no copy.
    ForgedCopyAppears {
        namespace: usize,
        name: usize,
    },
    /// An object the copy watch sees that is no copy of this rule (another
    /// rule's copy, a forged one) goes.
    LabelledForeignGoes {
        namespace: usize,
        name: usize,
    },
    /// Someone else changes the data of one of the rule's copies.
    CopyEdited {
        namespace: usize,
        name: usize,
    },
    /// Someone else deletes one of the rule's copies.
    CopyDeleted {
        namespace: usize,
        name: usize,
    },
    /// Someone else removes the rule-UID label of one of the rule's copies
    /// and leaves the rest: Copyrator still wrote it, and the copy watch
    /// reports it deleted.
    CopyUnlabelled {
        namespace: usize,
        name: usize,
    },
    /// Someone else takes every Copyrator label and annotation off one of
    /// the rule's copies: it stays, as a foreign object.
    CopyTakenOver {
        namespace: usize,
        name: usize,
    },
    RuleChanged {
        rule: usize,
        spec: usize,
        delivered: Delivered,
    },
    /// The periodic resync: known conflicts forgotten, a pass over everything.
    Resync,
    /// A backoff ran out.
    Retry,
    /// The rule's status changed (the echo of its own status write).
    StatusWritten,
    /// A copy event that changes nothing (the echo of the rule's own write).
    CopyWritten {
        namespace: usize,
        name: usize,
    },
}

/// What became of a write the API server accepted to try.
enum WriteOutcome {
    Written,
    /// A foreign object holds the name and the rule leaves it alone.
    Conflict(String),
}

/// A modelled rule, and what Copyrator keeps of it between passes (its
/// tally and its known conflicts; a plan reads the world's copy of the
/// latter).
struct ModelRule {
    rule: ResolvedRule,
    generation: i64,
    tally: Tally,
    conflicts: KnownConflicts,
}

/// The touches watch events bring, each to a rule (by its index).
type Touches = Vec<(usize, Touch)>;

/// The cluster and its rules (one, or two that want the same places).
struct ModelCluster {
    world: World,
    /// Objects without the rule-UID label: the copy watch does not see
    /// them, the foreign watch does; a write meets them.
    foreign: BTreeMap<ObjectKey, Arc<Object>>,
    rules: Vec<ModelRule>,
    /// Resource versions and UIDs, ever increasing.
    versions: u64,
}

fn place(namespace: usize, name: usize) -> ObjectKey {
    (
        NAMESPACES[namespace].to_owned(),
        SOURCE_NAMES[name].to_owned(),
    )
}

fn env_labels(env: Option<&str>) -> BTreeMap<String, String> {
    env.map(|env| BTreeMap::from([("env".to_owned(), env.to_owned())]))
        .unwrap_or_default()
}

/// The counts a pass over everything that planned `full` reports.
fn counts_of(full: &Plan) -> Counts {
    let mut conflicts: Vec<ConflictEntry> = full
        .conflicts
        .iter()
        .chain(&full.shadowed)
        .cloned()
        .collect();
    conflicts.sort();
    conflicts.dedup();
    Counts {
        copies: full.in_place,
        conflicts,
    }
}

/// The places `plan` writes.
fn written_places(plan: &Plan) -> BTreeSet<ObjectKey> {
    plan.actions
        .iter()
        .map(|action| {
            let (namespace, name) = action.target();
            (namespace.to_owned(), name.to_owned())
        })
        .collect()
}

/// The places where `tally` still owes a write.
fn owed_places(tally: &Tally) -> BTreeSet<ObjectKey> {
    tally
        .places()
        .filter(|(namespace, name)| tally.is_unwritten(namespace, name))
        .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
        .collect()
}

impl ModelRule {
    fn new(index: usize, variant: usize) -> Self {
        Self {
            rule: model_rule(index, variant),
            generation: 1,
            tally: Tally::default(),
            conflicts: KnownConflicts::default(),
        }
    }

    fn basis(&self) -> Basis {
        Basis {
            uid: self.rule.uid.clone(),
            generation: Some(self.generation),
        }
    }

    /// Whether a copy event at `place` reaches this rule, as the copy
    /// watch hands it out: to the rule that owned the object before or
    /// after, and (`Shared::copy_place_changed`) to a rule whose tally
    /// holds the place unsettled.
    fn hears_of_copy(
        &self,
        (namespace, name): &ObjectKey,
        owner_before: Option<&str>,
        owner_after: Option<&str>,
    ) -> bool {
        let ours = Some(self.rule.uid.as_str());
        owner_before == ours || owner_after == ours || self.tally.is_unsettled(namespace, name)
    }

    /// The touch a namespace event brings this rule, as
    /// `Shared::namespace_changed` hands it out.
    fn namespace_event(
        &self,
        namespace: &str,
        before: Option<&NamespaceInfo>,
        after: Option<&NamespaceInfo>,
    ) -> Option<Touch> {
        if before == after {
            return None;
        }
        if self.rule.source_namespaces.iter().any(|ns| ns == namespace) {
            return Some(Touch::All);
        }
        concerns_namespace(&self.rule, namespace, before, after)
            .then(|| Touch::Namespace(namespace.to_owned()))
    }

    /// The foreign watch's event at `at`, as `Shared::foreign_changed`
    /// hands it out: the rule's belief there brought up to date; true
    /// when the rule must look at the place again.
    fn foreign_event(&mut self, at: &ObjectKey, change: ForeignChange<'_>) -> bool {
        self.conflicts.foreign_changed(&self.tally, at, change)
    }
}

impl ModelCluster {
    /// Four of the namespaces, two matching sources of the first rule, its
    /// spec `spec_variant`, at generation 1; with `second`, a second rule
    /// of that spec, copying from another namespace sources of the same
    /// names (none yet).
    fn new_with(spec_variant: usize, second: Option<usize>) -> Self {
        // The second rule's source namespace is left out of the namespaces:
        // no rule targets it, so its sources are never a place.
        let mut world = World::new(&SOURCE_NAMESPACES[..1]);
        for (namespace, env) in
            NAMESPACES[..4]
                .iter()
                .zip([Some("dev"), Some("prod"), None, Some("dev")])
        {
            world.namespaces.insert(
                (*namespace).to_owned(),
                NamespaceInfo {
                    labels: env_labels(env),
                    ..NamespaceInfo::default()
                },
            );
        }
        let mut rules = vec![ModelRule::new(0, spec_variant)];
        rules.extend(second.map(|variant| ModelRule::new(1, variant)));
        let mut cluster = Self {
            world,
            foreign: BTreeMap::new(),
            rules,
            versions: 0,
        };
        for name in 0..2 {
            cluster.change(&ModelChange::SourceWritten {
                rule: 0,
                name,
                data: 0,
            });
        }
        cluster
    }

    /// The first rule alone.
    fn new(spec_variant: usize) -> Self {
        Self::new_with(spec_variant, None)
    }

    /// The first rule's tally.
    fn tally(&self) -> &Tally {
        &self.rules[0].tally
    }

    fn next_version(&mut self) -> u64 {
        self.versions += 1;
        self.versions
    }

    /// Whether nothing, watched or not, holds `place`.
    fn is_free(&self, place: &ObjectKey) -> bool {
        self.world.copies.get(&place.0, &place.1).is_none() && !self.foreign.contains_key(place)
    }

    /// Whether objects can be created in `namespace`.
    fn is_open(&self, namespace: &str) -> bool {
        self.world
            .namespaces
            .get(namespace)
            .is_some_and(|info| !info.terminating)
    }

    /// The copy of the first rule at `place`, as the copy cache holds it.
    fn own_copy(&self, place: &ObjectKey) -> Option<Arc<Object>> {
        self.copy_of_a_rule(place)
            .filter(|(index, _)| *index == 0)
            .map(|(_, copy)| copy)
    }

    /// The copy of a modelled rule at `place`, with the rule's index.
    fn copy_of_a_rule(&self, (namespace, name): &ObjectKey) -> Option<(usize, Arc<Object>)> {
        let copy = self.world.copies.get(namespace, name)?;
        let index = self
            .rules
            .iter()
            .position(|r| copy.rule_uid() == Some(r.rule.uid.as_str()))?;
        Some((index, copy.clone()))
    }

    /// The touches a copy event at `place` brings the rules.
    fn copy_event(
        &self,
        place: &ObjectKey,
        owner_before: Option<&str>,
        owner_after: Option<&str>,
    ) -> Touches {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.hears_of_copy(place, owner_before, owner_after))
            .map(|(index, _)| (index, Touch::Copy(place.0.clone(), place.1.clone())))
            .collect()
    }

    /// The touches a namespace event brings the rules.
    fn namespace_event(
        &self,
        namespace: &str,
        before: Option<&NamespaceInfo>,
        after: Option<&NamespaceInfo>,
    ) -> Touches {
        self.rules
            .iter()
            .enumerate()
            .filter_map(|(index, r)| Some((index, r.namespace_event(namespace, before, after)?)))
            .collect()
    }

    /// The foreign watch's event at `at` (`Some`: the object there now, as
    /// created or changed; `None`: gone): the touches it brings the rules.
    fn foreign_event(&mut self, at: &ObjectKey, now: Option<&Object>) -> Touches {
        let change = match now {
            Some(object) => ForeignChange::Applied(object),
            None => ForeignChange::Gone,
        };
        self.rules
            .iter_mut()
            .enumerate()
            .filter_map(|(index, r)| {
                r.foreign_event(at, change)
                    .then(|| (index, Touch::Copy(at.0.clone(), at.1.clone())))
            })
            .collect()
    }

    /// The same touch for every rule.
    fn to_all(&self, touch: &Touch) -> Touches {
        (0..self.rules.len()).map(|i| (i, touch.clone())).collect()
    }

    /// ModelChange the namespace `namespace` with `edit`; the touches of its event.
    fn edit_namespace(
        &mut self,
        namespace: usize,
        edit: impl FnOnce(&mut NamespaceInfo),
    ) -> Touches {
        let namespace = NAMESPACES[namespace];
        let Some(info) = self.world.namespaces.get_mut(namespace) else {
            return Vec::new();
        };
        let before = info.clone();
        edit(info);
        let after = info.clone();
        self.namespace_event(namespace, Some(&before), Some(&after))
    }

    fn source(&self, rule: usize, name: usize) -> Option<&Arc<Object>> {
        self.world.sources.iter().find(|source| {
            &*source.namespace == SOURCE_NAMESPACES[rule] && &*source.name == SOURCE_NAMES[name]
        })
    }

    /// Put `source` in place of the source of rule `rule` of its name: the
    /// touch to that rule, whose source watch holds only what matches its
    /// selector, before or after.
    fn put_source(&mut self, rule: usize, name: usize, source: Option<Object>) -> Touches {
        let before = self.source(rule, name).cloned();
        self.world.sources.retain(|s| {
            !(&*s.namespace == SOURCE_NAMESPACES[rule] && &*s.name == SOURCE_NAMES[name])
        });
        let after = source.map(Arc::new);
        if let Some(after) = &after {
            self.world.sources.push(after.clone());
        }
        let matches = |source: Option<&Arc<Object>>| {
            source.is_some_and(|s| s.labels.get("copy").is_some_and(|v| v == "yes"))
        };
        if rule < self.rules.len() && (matches(before.as_ref()) || matches(after.as_ref())) {
            vec![(rule, Touch::Source(SOURCE_NAMES[name].to_owned()))]
        } else {
            Vec::new()
        }
    }

    /// Make `change` (each kind by the method of its name); the touches its
    /// watch events bring the rules.
    fn change(&mut self, change: &ModelChange) -> Touches {
        match *change {
            ModelChange::NamespaceAppears { namespace, env } => {
                self.namespace_appears(namespace, env)
            }
            ModelChange::NamespaceLabelled { namespace, env } => {
                self.edit_namespace(namespace, |info| info.labels = env_labels(env))
            }
            ModelChange::NamespaceTerminates { namespace } => {
                self.edit_namespace(namespace, |info| info.terminating = true)
            }
            ModelChange::NamespaceGoes { namespace } => self.namespace_goes(namespace),
            ModelChange::SourceWritten { rule, name, data } => {
                self.source_written(rule, name, data)
            }
            ModelChange::SourceGoes { rule, name } => self.put_source(rule, name, None),
            ModelChange::SourceLabelled {
                rule,
                name,
                matches,
            } => self.source_labelled(rule, name, matches),
            ModelChange::RuleChanged {
                rule,
                spec: variant,
                delivered,
            } => self.rule_changed(rule, variant, delivered),
            ModelChange::Resync => {
                for r in &mut self.rules {
                    r.conflicts.clear();
                }
                self.to_all(&Touch::All)
            }
            ModelChange::Retry => self.to_all(&Touch::Retry),
            ModelChange::StatusWritten => self.to_all(&Touch::Nothing),
            ModelChange::CopyWritten { namespace, name } => {
                let at = place(namespace, name);
                let owner = self
                    .world
                    .copies
                    .get(&at.0, &at.1)
                    .and_then(|copy| copy.rule_uid().map(str::to_owned));
                self.copy_event(&at, owner.as_deref(), owner.as_deref())
            }
            _ => self.object_changed(change),
        }
    }

    /// [`ModelChange`]s of one object at a place.
    fn object_changed(&mut self, change: &ModelChange) -> Touches {
        match *change {
            ModelChange::ForeignAppears { namespace, name } => {
                self.foreign_appears(place(namespace, name))
            }
            ModelChange::ForeignGoes { namespace, name } => {
                let at = place(namespace, name);
                match self.foreign.remove(&at) {
                    Some(_) => self.foreign_event(&at, None),
                    None => Vec::new(),
                }
            }
            ModelChange::ForeignRelabelled {
                namespace,
                name,
                names_the_rule,
            } => self.foreign_relabelled(place(namespace, name), names_the_rule),
            ModelChange::ForeignLabelledAsCopy { namespace, name } => {
                self.foreign_labelled_as_copy(place(namespace, name))
            }
            ModelChange::ForgedCopyUnlabelled { namespace, name } => {
                self.forged_copy_unlabelled(place(namespace, name))
            }
            ModelChange::ForeignGoesUnseen { namespace, name } => {
                self.foreign.remove(&place(namespace, name));
                self.foreign_watch_restarted()
            }
            ModelChange::ForeignWatchRestarted => self.foreign_watch_restarted(),
            ModelChange::OtherRulesCopyAppears { namespace, name } => {
                self.other_rules_copy_appears(place(namespace, name))
            }
            ModelChange::ForgedCopyAppears { namespace, name } => {
                self.forged_copy_appears(place(namespace, name))
            }
            ModelChange::LabelledForeignGoes { namespace, name } => {
                self.labelled_foreign_goes(&place(namespace, name))
            }
            ModelChange::CopyEdited { namespace, name } => {
                self.copy_edited(&place(namespace, name))
            }
            ModelChange::CopyDeleted { namespace, name } => {
                self.copy_deleted(&place(namespace, name))
            }
            ModelChange::CopyUnlabelled { namespace, name } => {
                self.copy_unlabelled(place(namespace, name))
            }
            ModelChange::CopyTakenOver { namespace, name } => {
                self.copy_taken_over(place(namespace, name))
            }
            _ => unreachable!("not a change of one object: {change:?}"),
        }
    }

    fn namespace_appears(&mut self, namespace: usize, env: Option<&str>) -> Touches {
        let name = NAMESPACES[namespace];
        if self.world.namespaces.contains_key(name) {
            return Vec::new();
        }
        let info = NamespaceInfo {
            labels: env_labels(env),
            ..NamespaceInfo::default()
        };
        self.world.namespaces.insert(name.to_owned(), info.clone());
        self.namespace_event(name, None, Some(&info))
    }

    /// The namespace goes, and each object in it with its own watch event
    /// first.
    fn namespace_goes(&mut self, namespace: usize) -> Touches {
        let name = NAMESPACES[namespace];
        let Some(before) = self.world.namespaces.get(name).cloned() else {
            return Vec::new();
        };
        let held: Vec<Arc<Object>> = self
            .world
            .copies
            .in_namespace(name)
            .map(|copies| copies.values().cloned().collect())
            .unwrap_or_default();
        let mut touches = Vec::new();
        for copy in held {
            self.leaves_copy_watch(&copy);
            touches.extend(self.copy_event(&copy.key(), copy.rule_uid(), None));
        }
        let foreign: Vec<ObjectKey> = self
            .foreign
            .keys()
            .filter(|(ns, _)| ns == name)
            .cloned()
            .collect();
        for at in foreign {
            self.foreign.remove(&at);
            touches.extend(self.foreign_event(&at, None));
        }
        self.world.namespaces.remove(name);
        touches.extend(self.namespace_event(name, Some(&before), None));
        touches
    }

    /// The source `name` of rule `rule` appears (matching the rules'
    /// selector), or its data becomes `data`.
    fn source_written(&mut self, rule: usize, name: usize, data: u8) -> Touches {
        let version = self.next_version();
        let before = self.source(rule, name).cloned();
        let (uid, labels) = match &before {
            Some(source) => (source.uid.clone(), source.labels.clone()),
            None => (
                format!("source-{version}"),
                BTreeMap::from([("copy".to_owned(), "yes".to_owned())]),
            ),
        };
        let source = Object::new(
            SOURCE_NAMESPACES[rule],
            SOURCE_NAMES[name],
            uid,
            version.to_string(),
            labels,
            BTreeMap::new(),
            BTreeMap::from([("data".to_owned(), json!({ "k": data.to_string() }))]),
        );
        self.put_source(rule, name, Some(source))
    }

    fn source_labelled(&mut self, rule: usize, name: usize, matches: bool) -> Touches {
        let Some(before) = self.source(rule, name).cloned() else {
            return Vec::new();
        };
        let mut source = (*before).clone();
        source.resource_version = self.next_version().to_string();
        source
            .labels
            .insert("copy".into(), if matches { "yes" } else { "no" }.into());
        source.rehash();
        self.put_source(rule, name, Some(source))
    }

    /// Whether an object can be created at `place`: its namespace is open
    /// and nothing holds the name.
    fn can_create(&self, place: &ObjectKey) -> bool {
        self.is_open(&place.0) && self.is_free(place)
    }

    fn foreign_appears(&mut self, at: ObjectKey) -> Touches {
        if !self.can_create(&at) {
            return Vec::new();
        }
        let version = self.next_version();
        let foreign = Object::new(
            &at.0,
            &at.1,
            format!("foreign-{version}"),
            version.to_string(),
            BTreeMap::new(),
            BTreeMap::new(),
            BTreeMap::from([("data".to_owned(), json!({"k": "foreign"}))]),
        );
        let foreign = Arc::new(foreign);
        self.foreign.insert(at.clone(), foreign.clone());
        self.foreign_event(&at, Some(&foreign))
    }

    /// The foreign watch starts again: each rule looks again at every
    /// place it believed held.
    fn foreign_watch_restarted(&mut self) -> Touches {
        let mut touches = Vec::new();
        for (index, r) in self.rules.iter_mut().enumerate() {
            touches.extend(
                r.conflicts
                    .forget_all()
                    .into_iter()
                    .map(|(namespace, name)| (index, Touch::Copy(namespace, name))),
            );
        }
        touches
    }

    fn foreign_relabelled(&mut self, at: ObjectKey, names_the_rule: bool) -> Touches {
        let Some(before) = self.foreign.get(&at) else {
            return Vec::new();
        };
        let mut changed = (**before).clone();
        changed.resource_version = self.next_version().to_string();
        changed
            .labels
            .insert("team".into(), format!("t{}", self.versions));
        if names_the_rule {
            changed
                .annotations
                .insert(ANNOTATION_RULE.into(), self.rules[0].rule.key.to_string());
        } else {
            changed.annotations.remove(ANNOTATION_RULE);
        }
        changed.rehash();
        // Its keys are another writer's.
        changed.authored = false;
        changed.set_owned(|_, _| false);
        let changed = Arc::new(changed);
        self.foreign.insert(at.clone(), changed.clone());
        self.foreign_event(&at, Some(&changed))
    }

    fn foreign_labelled_as_copy(&mut self, at: ObjectKey) -> Touches {
        let Some(before) = self.foreign.remove(&at) else {
            return Vec::new();
        };
        let mut touches = self.foreign_event(&at, None);
        let mut forged = (*before).clone();
        forged.resource_version = self.next_version().to_string();
        forged
            .labels
            .insert(LABEL_RULE_UID.to_owned(), self.rules[0].rule.uid.clone());
        forged.rehash();
        // As the copy watch reads it: managedFields name another writer.
        forged.authored = false;
        forged.rule_uid = None;
        forged.set_owned(|_, _| false);
        self.world.copies.upsert(Arc::new(forged.into_compact()));
        touches.extend(self.copy_event(&at, None, None));
        touches
    }

    fn forged_copy_unlabelled(&mut self, at: ObjectKey) -> Touches {
        let Some(forged) = self
            .world
            .copies
            .get(&at.0, &at.1)
            .filter(|object| !object.authored)
            .cloned()
        else {
            return Vec::new();
        };
        self.leaves_copy_watch(&forged);
        let mut touches = self.copy_event(&at, None, None);
        let mut unlabelled = Object::new(
            &at.0,
            &at.1,
            forged.uid.clone(),
            self.next_version().to_string(),
            BTreeMap::new(),
            forged
                .rule_ref
                .as_deref()
                .map(|rule| BTreeMap::from([(ANNOTATION_RULE.to_owned(), rule.to_owned())]))
                .unwrap_or_default(),
            forged.payload.clone(),
        );
        unlabelled.authored = false;
        unlabelled.set_owned(|_, _| false);
        let unlabelled = Arc::new(unlabelled);
        self.foreign.insert(at.clone(), unlabelled.clone());
        touches.extend(self.foreign_event(&at, Some(&unlabelled)));
        touches
    }

    fn other_rules_copy_appears(&mut self, at: ObjectKey) -> Touches {
        if !self.can_create(&at) {
            return Vec::new();
        }
        let version = self.next_version();
        let copy = Object::new(
            &at.0,
            &at.1,
            format!("other-{version}"),
            version.to_string(),
            BTreeMap::from([
                (LABEL_RULE_UID.to_owned(), OTHER_RULE_UID.to_owned()),
                (LABEL_MANAGED_BY.to_owned(), "copyrator".to_owned()),
            ]),
            BTreeMap::from([(ANNOTATION_RULE.to_owned(), "src/other".to_owned())]),
            BTreeMap::new(),
        )
        .into_compact();
        self.world.copies.upsert(Arc::new(copy));
        self.copy_event(&at, None, Some(OTHER_RULE_UID))
    }

    fn forged_copy_appears(&mut self, at: ObjectKey) -> Touches {
        if !self.can_create(&at) {
            return Vec::new();
        }
        let version = self.next_version();
        let first = &self.rules[0].rule;
        let mut forged = Object::new(
            &at.0,
            &at.1,
            format!("forged-{version}"),
            version.to_string(),
            BTreeMap::from([
                (LABEL_RULE_UID.to_owned(), first.uid.clone()),
                (LABEL_MANAGED_BY.to_owned(), "copyrator".to_owned()),
            ]),
            BTreeMap::from([(ANNOTATION_RULE.to_owned(), first.key.to_string())]),
            BTreeMap::from([("data".to_owned(), json!({"k": "forged"}))]),
        );
        // As the copy watch reads it: managedFields name another writer.
        forged.authored = false;
        forged.rule_uid = None;
        forged.set_owned(|_, _| false);
        self.world.copies.upsert(Arc::new(forged.into_compact()));
        self.copy_event(&at, None, None)
    }

    /// An object the copy watch sees that is no modelled rule's copy
    /// (another rule's copy, a forged one) goes.
    fn labelled_foreign_goes(&mut self, at: &ObjectKey) -> Touches {
        let Some(object) = self.world.copies.get(&at.0, &at.1).cloned() else {
            return Vec::new();
        };
        if self.copy_of_a_rule(at).is_some() {
            return Vec::new();
        }
        self.leaves_copy_watch(&object);
        self.copy_event(at, object.rule_uid(), None)
    }

    fn copy_edited(&mut self, at: &ObjectKey) -> Touches {
        let Some((index, copy)) = self.copy_of_a_rule(at) else {
            return Vec::new();
        };
        // A new version by another writer: its data differs, and it is no
        // answer to a write of ours.
        let mut edited = (*copy).clone();
        edited.payload_hash = edited.payload_hash.wrapping_add(1);
        edited.resource_version = self.next_version().to_string();
        edited.written_for = None;
        edited.settled = false;
        self.world.copies.upsert(Arc::new(edited));
        let owner = self.rules[index].rule.uid.clone();
        self.copy_event(at, Some(&owner), Some(&owner))
    }

    fn copy_deleted(&mut self, at: &ObjectKey) -> Touches {
        let Some((index, copy)) = self.copy_of_a_rule(at) else {
            return Vec::new();
        };
        self.leaves_copy_watch(&copy);
        let owner = self.rules[index].rule.uid.clone();
        self.copy_event(at, Some(&owner), None)
    }

    fn copy_unlabelled(&mut self, at: ObjectKey) -> Touches {
        let Some((index, copy)) = self.copy_of_a_rule(&at) else {
            return Vec::new();
        };
        self.leaves_copy_watch(&copy);
        let version = self.next_version();
        // What stays is Copyrator's: the other labels, the annotations.
        let mut labels = BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), "copyrator".to_owned())]);
        if copy.create_only {
            labels.insert(LABEL_SYNC_POLICY.to_owned(), CREATE_ONLY.to_owned());
        }
        let annotations = [
            (ANNOTATION_RULE, &copy.rule_ref),
            (ANNOTATION_SOURCE, &copy.source_ref),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), value.as_deref()?.to_owned())))
        .collect();
        let unlabelled = Object::new(
            &at.0,
            &at.1,
            copy.uid.clone(),
            version.to_string(),
            labels,
            annotations,
            copy.payload.clone(),
        );
        self.left_for_the_foreign_watch(index, at, unlabelled)
    }

    /// A copy of rule `index` leaves the copy watch and comes to the
    /// foreign watch as `now`: the touches of both events.
    fn left_for_the_foreign_watch(&mut self, index: usize, at: ObjectKey, now: Object) -> Touches {
        let now = Arc::new(now);
        self.foreign.insert(at.clone(), now.clone());
        let owner = self.rules[index].rule.uid.clone();
        let mut touches = self.copy_event(&at, Some(&owner), None);
        touches.extend(self.foreign_event(&at, Some(&now)));
        touches
    }

    fn copy_taken_over(&mut self, at: ObjectKey) -> Touches {
        let Some((index, copy)) = self.copy_of_a_rule(&at) else {
            return Vec::new();
        };
        // The copy watch selects by label: to it, the copy is deleted.
        self.leaves_copy_watch(&copy);
        let version = self.next_version();
        let foreign = Object::new(
            &at.0,
            &at.1,
            copy.uid.clone(),
            version.to_string(),
            BTreeMap::new(),
            BTreeMap::new(),
            BTreeMap::from([("data".to_owned(), json!({"k": "taken"}))]),
        );
        self.left_for_the_foreign_watch(index, at, foreign)
    }

    /// Rule `index`'s next generation, of the spec `variant`.
    fn rule_changed(&mut self, index: usize, variant: usize, delivered: Delivered) -> Touches {
        let Some(changed) = self.rules.get_mut(index) else {
            return Vec::new();
        };
        changed.rule = model_rule(index, variant);
        changed.generation += 1;
        vec![(
            index,
            match delivered {
                Delivered::AsChangedSpec => Touch::All,
                Delivered::ThroughStatusPass => Touch::Nothing,
            },
        )]
    }

    /// `object` leaves what the copy watch selects (deleted, or its
    /// rule-UID label removed): the watch reports it deleted.
    fn leaves_copy_watch(&mut self, object: &Object) {
        self.world.copies.deleted(object);
    }

    /// Write `desired` at `namespace` as the API server answers a write of
    /// ours: into the copy cache (`uid` kept for an update).
    fn put_copy(&mut self, namespace: &str, desired: &Desired, uid: Option<String>) {
        let version = self.next_version();
        let mut copy = Object::new(
            namespace,
            &desired.name,
            uid.unwrap_or_else(|| format!("copy-{version}")),
            version.to_string(),
            desired.labels.clone(),
            desired.annotations.clone(),
            desired.payload.clone(),
        )
        .into_compact();
        copy.written_for = Some(desired.content_hash);
        copy.settled = desired.matches(&copy, false);
        self.world.copies.upsert_written(Arc::new(copy));
    }

    /// Carry out `action` of rule `index` as the writer does: a create that
    /// finds the name taken by an object the cache does not hold resolves
    /// it with [`occupied`] (a conflict, or a take-over under
    /// `Overwrite`). The touches its watch events bring the other rules
    /// come with it (the rule's own echo brings nothing).
    fn write(&mut self, index: usize, action: &Action) -> (WriteOutcome, Touches) {
        let writer = self.rules[index].rule.uid.clone();
        let mut touches = Vec::new();
        match action {
            Action::Create { desired, namespace } => {
                let at = (namespace.clone(), desired.name.clone());
                // The plan saw the copy cache: only an object it does not
                // hold can take the name.
                let mut uid = None;
                if let Some(existing) = self.foreign.get(&at).cloned() {
                    let rule = &self.rules[index].rule;
                    match occupied(desired, &existing, rule, &rule.key.to_string()) {
                        Occupied::Ours => return (WriteOutcome::Written, touches),
                        Occupied::Conflict(reason) => {
                            return (WriteOutcome::Conflict(reason), touches);
                        }
                        Occupied::Update | Occupied::Adopt => uid = Some(existing.uid.clone()),
                        Occupied::Recreate => {}
                    }
                    // Taken over: it leaves the foreign watch.
                    self.foreign.remove(&at);
                    touches.extend(self.foreign_event(&at, None));
                }
                self.put_copy(namespace, desired, uid);
                touches.extend(self.copy_event(&at, None, Some(&writer)));
            }
            Action::Update { desired, current } | Action::Adopt { desired, current } => {
                self.put_copy(&current.namespace, desired, Some(current.uid.clone()));
                touches.extend(self.copy_event(&current.key(), Some(&writer), Some(&writer)));
            }
            Action::Recreate { desired, current } => {
                self.leaves_copy_watch(current);
                self.put_copy(&current.namespace, desired, None);
                touches.extend(self.copy_event(&current.key(), Some(&writer), Some(&writer)));
            }
            Action::Delete { current, .. } => {
                self.world.copies.remove(current);
                touches.extend(self.copy_event(&current.key(), Some(&writer), None));
            }
            Action::HandOver { current, .. } => {
                let mut handed = (**current).clone();
                handed.create_only = true;
                handed.resource_version = self.next_version().to_string();
                self.world.copies.upsert_written(Arc::new(handed));
                touches.extend(self.copy_event(&current.key(), Some(&writer), Some(&writer)));
            }
        }
        touches.retain(|(to, _)| *to != index);
        (WriteOutcome::Written, touches)
    }

    /// The plan of rule `index` over `scope`, from what it believes held.
    fn plan_of(&mut self, index: usize, scope: &Scope) -> Plan {
        self.world.known_conflicts = self.rules[index].conflicts.held().clone();
        self.world.plan_within(&self.rules[index].rule, scope)
    }

    /// One pass of rule `index` over what `touches` changed, as
    /// `reconcile::carry_out` and `finish` make it; its n-th write (in
    /// place order) fails when bit n of `failing` is set. Checks the pass
    /// against a pass over everything; the touches its writes bring the
    /// other rules.
    fn pass(
        &mut self,
        index: usize,
        touches: Vec<Touch>,
        failing: u32,
    ) -> Result<Touches, TestCaseError> {
        let basis = self.rules[index].basis();
        let mut touched = Scope::default();
        for touch in touches {
            touched.add(touch);
        }
        let r = &mut self.rules[index];
        r.conflicts
            .pass_begins(&r.rule.key.to_string(), r.rule.kind);
        let mut scope = r
            .tally
            .scope_for(&basis, touched.named_by(&r.rule.transform.naming));
        if scope.retries() {
            let unsettled: Vec<ObjectKey> = r
                .tally
                .places()
                .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                .collect();
            for (namespace, name) in unsettled {
                scope.add(Touch::Copy(namespace, name));
            }
        }
        let plan = self.plan_of(index, &scope);
        self.rules[index].tally.record(&basis, &scope, &plan);

        // Each write of the pass is one a pass over everything makes, and
        // what that pass makes besides is still owed from earlier passes.
        let full = self.plan_of(index, &Scope::everything());
        let full_verbs = verbs(&full);
        for write in verbs(&plan) {
            prop_assert!(
                full_verbs.contains(&write),
                "{write:?} is no write of a pass over everything: {full_verbs:?}"
            );
        }
        check_owed(&self.rules[index].tally, &full, "before the writes")?;

        let mut new_conflicts = Vec::new();
        let mut others = Vec::new();
        for (position, action) in plan.actions.iter().enumerate() {
            // A failed write, or one waiting out its backoff: still owed.
            if failing & (1 << (position % 32)) != 0 {
                continue;
            }
            let (namespace, name) = action.target();
            let (outcome, touches) = self.write(index, action);
            others.extend(touches);
            match outcome {
                WriteOutcome::Written => self.rules[index].tally.settle(namespace, name),
                WriteOutcome::Conflict(reason) => {
                    new_conflicts.push(((namespace.to_owned(), name.to_owned()), reason));
                }
            }
        }
        let r = &mut self.rules[index];
        for ((namespace, name), reason) in new_conflicts {
            if r.conflicts
                .met((namespace.clone(), name.clone()), reason.clone())
            {
                r.tally.set(&namespace, &name, Unsettled::Conflict(reason));
            }
        }
        let rule_uid = r.rule.uid.clone();
        let copies = &self.world.copies;
        r.conflicts.retain(|(namespace, name)| {
            copies
                .get(namespace, name)
                .is_none_or(|copy| copy.rule_uid() != Some(rule_uid.as_str()))
        });

        let truth = self.truth(index);
        prop_assert_eq!(
            self.rules[index].tally.counts(&plan),
            counts_of(&truth),
            "the status counts of rule {}",
            index
        );
        check_owed(&self.rules[index].tally, &truth, "after the writes")?;
        Ok(others)
    }

    /// What a pass of rule `index` over everything from the cluster as it
    /// is finds, each of its creates tried: a create meets the foreign
    /// object at its place (a conflict, or one `Overwrite` takes over).
    /// Not what the rule believes: a place it believes held by an object
    /// that went is free here. A place where the tally still owes a write
    /// (it failed) is left to that write, which meets what is there.
    fn truth(&mut self, index: usize) -> Plan {
        self.world.known_conflicts = HashMap::new();
        let rule = &self.rules[index].rule;
        let blind = self.world.plan(rule);
        let rule_name = rule.key.to_string();
        let mut met = HashMap::new();
        for action in &blind.actions {
            let Action::Create { desired, namespace } = action else {
                continue;
            };
            let at = (namespace.clone(), desired.name.clone());
            if self.rules[index].tally.is_unwritten(&at.0, &at.1) {
                continue;
            }
            if let Some(existing) = self.foreign.get(&at)
                && let Occupied::Conflict(reason) =
                    occupied(desired, existing, rule.conflict_policy, &rule_name)
            {
                met.insert(at, reason);
            }
        }
        self.world.known_conflicts = met;
        self.world.plan(&self.rules[index].rule)
    }

    /// Run the passes `touches` ask for, rule by rule, and those that the
    /// writes of each bring the others, until no rule is touched.
    fn passes(&mut self, mut touches: Touches, failing: u32) -> Result<(), TestCaseError> {
        let mut rounds = 0;
        while !touches.is_empty() {
            rounds += 1;
            prop_assert!(
                rounds <= 8,
                "the rules' writes keep touching each other: {touches:?}"
            );
            let mut next = Vec::new();
            for index in 0..self.rules.len() {
                let mine: Vec<Touch> = touches
                    .iter()
                    .filter(|(to, _)| *to == index)
                    .map(|(_, touch)| touch.clone())
                    .collect();
                if !mine.is_empty() {
                    next.extend(self.pass(index, mine, failing)?);
                }
            }
            touches = next;
        }
        Ok(())
    }
}

/// Every write of `full`, a plan over everything, is still owed in
/// `tally`, so a retry makes it. The tally may owe more, but only
/// deletions (the counts, checked apart, would show an owed copy): one in
/// a namespace that started terminating, say, which no pass was told of;
/// a retry finds nothing to do there.
fn check_owed(tally: &Tally, full: &Plan, when: &str) -> Result<(), TestCaseError> {
    let owed = owed_places(tally);
    let written = written_places(full);
    let forgotten: Vec<&ObjectKey> = written.difference(&owed).collect();
    prop_assert!(
        forgotten.is_empty(),
        "{when}: writes a pass over everything makes that no pass owes: {forgotten:?}"
    );
    Ok(())
}

fn namespace() -> impl Strategy<Value = usize> {
    0..NAMESPACES.len()
}

fn source_name() -> impl Strategy<Value = usize> {
    0..SOURCE_NAMES.len()
}

fn env() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![Just(None), Just(Some("dev")), Just(Some("prod"))]
}

/// Which writes of a pass fail: mostly none.
fn failing() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(0), 1 => any::<u32>()]
}

fn change() -> impl Strategy<Value = ModelChange> {
    let delivered = prop_oneof![
        Just(Delivered::AsChangedSpec),
        Just(Delivered::ThroughStatusPass)
    ];
    prop_oneof![
        (namespace(), env())
            .prop_map(|(namespace, env)| ModelChange::NamespaceAppears { namespace, env }),
        (namespace(), env())
            .prop_map(|(namespace, env)| ModelChange::NamespaceLabelled { namespace, env }),
        namespace().prop_map(|namespace| ModelChange::NamespaceTerminates { namespace }),
        namespace().prop_map(|namespace| ModelChange::NamespaceGoes { namespace }),
        (0..2usize, source_name(), 0..3u8)
            .prop_map(|(rule, name, data)| ModelChange::SourceWritten { rule, name, data }),
        (0..2usize, source_name()).prop_map(|(rule, name)| ModelChange::SourceGoes { rule, name }),
        (0..2usize, source_name(), any::<bool>()).prop_map(|(rule, name, matches)| {
            ModelChange::SourceLabelled {
                rule,
                name,
                matches,
            }
        }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForeignAppears { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForeignGoes { namespace, name }),
        (namespace(), source_name(), any::<bool>()).prop_map(
            |(namespace, name, names_the_rule)| {
                ModelChange::ForeignRelabelled {
                    namespace,
                    name,
                    names_the_rule,
                }
            }
        ),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForeignLabelledAsCopy { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForgedCopyUnlabelled { namespace, name }),
        Just(ModelChange::ForeignWatchRestarted),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForeignGoesUnseen { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::OtherRulesCopyAppears { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::ForgedCopyAppears { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::LabelledForeignGoes { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::CopyEdited { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::CopyDeleted { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::CopyUnlabelled { namespace, name }),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::CopyTakenOver { namespace, name }),
        (0..2usize, 0..SPECS, delivered).prop_map(|(rule, spec, delivered)| {
            ModelChange::RuleChanged {
                rule,
                spec,
                delivered,
            }
        }),
        Just(ModelChange::Resync),
        Just(ModelChange::Retry),
        Just(ModelChange::StatusWritten),
        (namespace(), source_name())
            .prop_map(|(namespace, name)| ModelChange::CopyWritten { namespace, name }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Whatever happens, in whatever order, each pass over what changed
    /// leaves the rule's status as a pass over everything would; with a
    /// second rule that wants the same places (its sources have the same
    /// names), each rule's.
    #[test]
    fn passes_over_what_changed_count_what_a_pass_over_everything_counts(
        first_spec in 0..SPECS,
        second_spec in prop::option::of(0..SPECS),
        first_failing in failing(),
        steps in prop::collection::vec((change(), failing()), 1..40),
    ) {
        let mut cluster = ModelCluster::new_with(first_spec, second_spec);
        let first = cluster.to_all(&Touch::All);
        cluster.passes(first, first_failing)?;
        for (change, failing) in &steps {
            // A change no watch reports brings no pass.
            let touches = cluster.change(change);
            cluster.passes(touches, *failing)?;
        }
    }
}

/// The cluster once the rule's first pass (over everything) made every write.
fn started(spec_variant: usize) -> ModelCluster {
    let mut cluster = ModelCluster::new(spec_variant);
    cluster
        .passes(vec![(0, Touch::All)], 0)
        .unwrap_or_else(|failed| panic!("the first pass: {failed}"));
    cluster
}

/// Run `cluster` through `changes`, each followed by its passes, every
/// write made; panics with the check that failed.
fn replay(cluster: &mut ModelCluster, changes: &[ModelChange]) {
    for change in changes {
        let touches = cluster.change(change);
        cluster
            .passes(touches, 0)
            .unwrap_or_else(|failed| panic!("after {change:?}: {failed}"));
    }
}

/// Another rule's copy that appears where this rule still owes a create
/// (its create failed) is a conflict from then on: the copy watch's event
/// reaches the rule, whose status names the conflict at once, not only
/// after the failed create's backoff.
#[test]
fn another_rules_copy_where_a_create_is_owed_is_a_conflict_at_once() {
    let mut cluster = ModelCluster::new(0);
    // Writes go in place order: ops-d's two, then team-a/cm1.
    cluster
        .passes(vec![(0, Touch::All)], 1 << 2)
        .expect("the first pass counts as a pass over everything");
    assert!(cluster.tally().is_unwritten("team-a", "cm1"));
    let appears = ModelChange::OtherRulesCopyAppears {
        namespace: 0,
        name: 0,
    };
    let touches = cluster.change(&appears);
    assert_eq!(
        touches,
        vec![(0, Touch::Copy("team-a".into(), "cm1".into()))],
        "the rule hears of the place it owes a write"
    );
    cluster
        .passes(touches, 0)
        .expect("the pass over the place counts the conflict");
    replay(&mut cluster, &[ModelChange::StatusWritten]);
    assert!(cluster.tally().is_conflict("team-a", "cm1"));
}

/// A copy whose labels someone removed is a foreign object to the copy
/// watch (reported deleted); taken back under `Overwrite`, it is the same
/// object again, held by the copy cache and counted as in place, and a
/// pass over everything has nothing to write.
#[test]
fn a_copy_taken_back_under_overwrite_is_held_and_counted() {
    let mut cluster = started(0);
    replay(
        &mut cluster,
        &[
            ModelChange::CopyTakenOver {
                namespace: 0,
                name: 0,
            },
            ModelChange::RuleChanged {
                rule: 0,
                spec: 4,
                delivered: Delivered::AsChangedSpec,
            },
        ],
    );
    assert!(cluster.own_copy(&place(0, 0)).is_some());
    assert!(cluster.plan_of(0, &Scope::everything()).actions.is_empty());
}

/// The race behind a status that counted a foreign object as a copy: a
/// new generation whose targets reach a namespace with another rule's
/// copy arrives through a pass queued for the status alone. That pass
/// looks at everything, so the status names the conflict and owes the
/// new copies.
#[test]
fn new_targets_reaching_a_status_pass_are_looked_at() {
    let mut cluster = started(1);
    replay(
        &mut cluster,
        &[
            ModelChange::OtherRulesCopyAppears {
                namespace: 3,
                name: 0,
            },
            ModelChange::RuleChanged {
                rule: 0,
                spec: 0,
                delivered: Delivered::ThroughStatusPass,
            },
        ],
    );
    assert!(cluster.tally().is_conflict("ops-d", "cm1"));
    assert!(cluster.own_copy(&place(3, 1)).is_some());
}

/// A foreign object holds a place and the status names the conflict; the
/// object goes: the foreign watch's event brings a pass over that place,
/// which writes the copy, and the status names no conflict.
#[test]
fn a_place_freed_by_its_foreign_object_is_filled_at_once() {
    let mut cluster = ModelCluster::new(0);
    let held = ModelChange::ForeignAppears {
        namespace: 0,
        name: 0,
    };
    // Before the rule's first pass: nothing of the rule's is there yet.
    assert!(cluster.change(&held).is_empty());
    cluster
        .passes(vec![(0, Touch::All)], 0)
        .expect("the first pass meets the foreign object");
    assert!(cluster.tally().is_conflict("team-a", "cm1"));

    let freed = cluster.change(&ModelChange::ForeignGoes {
        namespace: 0,
        name: 0,
    });
    assert_eq!(freed, vec![(0, Touch::Copy("team-a".into(), "cm1".into()))]);
    cluster
        .passes(freed, 0)
        .expect("the pass over the freed place writes the copy");
    assert!(cluster.own_copy(&place(0, 0)).is_some());
    assert!(!cluster.tally().is_conflict("team-a", "cm1"));
}

/// Two rules want one place, which a foreign object holds: both name the
/// conflict. The object goes: both hear of it, the first writes its copy,
/// and the second, told of that copy by the copy watch, names the first
/// rule's copy as its conflict. When the first rule's source goes, its
/// copy goes and the second rule writes its own.
#[test]
fn a_place_two_rules_want_goes_to_one_and_then_to_the_other() {
    let mut cluster = ModelCluster::new_with(0, Some(0));
    let setup = [
        ModelChange::SourceWritten {
            rule: 1,
            name: 0,
            data: 1,
        },
        ModelChange::ForeignAppears {
            namespace: 0,
            name: 0,
        },
    ];
    for change in &setup {
        cluster.change(change);
    }
    let first = cluster.to_all(&Touch::All);
    cluster.passes(first, 0).expect("the first passes");
    for index in 0..2 {
        assert!(
            cluster.rules[index].tally.is_conflict("team-a", "cm1"),
            "rule {index} names the foreign object"
        );
    }
    let freed = cluster.change(&ModelChange::ForeignGoes {
        namespace: 0,
        name: 0,
    });
    let place = Touch::Copy("team-a".into(), "cm1".into());
    assert_eq!(
        freed,
        vec![(0, place.clone()), (1, place)],
        "both hear of it"
    );
    cluster
        .passes(freed, 0)
        .expect("the passes over the freed place");
    assert!(cluster.own_copy(&self::place(0, 0)).is_some());
    // The first rule's copies came first everywhere else too.
    let mut conflicts = cluster.rules[1]
        .tally
        .conflicts()
        .map(|(ns, name, why)| format!("{ns}/{name}: {why}"))
        .collect::<Vec<_>>();
    conflicts.sort();
    assert_eq!(
        conflicts,
        ["ops-d", "team-a", "team-b", "team-c"]
            .map(|ns| format!("{ns}/cm1: a copy made by rule src/r is there")),
        "the second rule names the first rule's copies"
    );
    replay(
        &mut cluster,
        &[ModelChange::SourceGoes { rule: 0, name: 0 }],
    );
    let (owner, _) = cluster
        .copy_of_a_rule(&self::place(0, 0))
        .expect("a copy at team-a/cm1");
    assert_eq!(owner, 1, "the second rule's copy is there now");
}

/// A pass over what a change touched plans exactly the writes a pass
/// over everything would, and the tally it leaves gives the counts a
/// pass over everything would.
#[test]
fn a_pass_over_what_changed_plans_what_a_full_pass_would() {
    let mut w = World::new(&["src", "a", "b", "c", "d"]);
    w.source("src", "cm1", &[("copy", "yes")], json!({"k": "1"}));
    w.source("src", "cm2", &[("copy", "yes")], json!({"k": "2"}));
    // Another rule's copy at d/cm2: a conflict from the start.
    let mut other =
        crate::cache::index::tests::object("d", "cm2", "x", 1, &[(LABEL_RULE_UID, "rule-2")]);
    other.rehash();
    w.copies.upsert(Arc::new(other));
    let r = simple_rule();
    let basis = Basis {
        uid: r.uid.clone(),
        generation: Some(1),
    };
    let mut tally = Tally::default();
    let first = w.plan(&r);
    tally.record(&basis, &Scope::everything(), &first);
    apply_and_settle(&mut w, &mut tally, &first);
    let full = w.plan(&r);
    assert_eq!(tally.in_place(full.places), full.in_place);
    assert_eq!(full.in_place, 7, "4 targets × 2 sources, one place taken");

    for (what, change, touch) in watched_changes() {
        // Left untouched: an edit nobody reported must not be seen by
        // the scoped pass (it is what the tally does not cover either).
        change(&mut w);
        check_a_pass_over(touch, what, &mut w, &r, &mut tally, &basis);
    }
    assert_eq!(w.plan(&r).in_place, 4, "cm1 in a, b, d and e");
}

/// A change to the world, what it is, and the touch its watch reports.
type WatchedChange = (&'static str, Box<dyn Fn(&mut World)>, Touch);

/// One change of each sort a watch reports, in an order each can follow
/// the one before.
fn watched_changes() -> Vec<WatchedChange> {
    vec![
        (
            "a new namespace",
            Box::new(|w| {
                w.namespaces.insert("e".into(), NamespaceInfo::default());
            }),
            Touch::Namespace("e".into()),
        ),
        (
            "a source's data",
            Box::new(|w| {
                w.sources.retain(|s| &*s.name != "cm1");
                w.source("src", "cm1", &[("copy", "yes")], json!({"k": "new"}));
            }),
            Touch::Source("cm1".into()),
        ),
        (
            "a copy edited by others",
            Box::new(|w| {
                let mut copy = (**w.copies.get("b", "cm2").unwrap()).clone();
                copy.payload.insert("data".into(), json!({"k": "edited"}));
                copy.rehash();
                copy.resource_version = "999".into();
                w.copies.upsert(Arc::new(copy));
            }),
            Touch::Copy("b".into(), "cm2".into()),
        ),
        (
            "a namespace that goes",
            Box::new(|w| {
                w.namespaces.remove("c");
            }),
            Touch::Namespace("c".into()),
        ),
        (
            "a source that goes",
            Box::new(|w| {
                w.sources.retain(|s| &*s.name != "cm2");
            }),
            Touch::Source("cm2".into()),
        ),
    ]
}

/// Carry out `plan`'s writes, and settle them in `tally` as their
/// watch events would.
fn apply_and_settle(w: &mut World, tally: &mut Tally, plan: &Plan) {
    w.apply(plan);
    for (namespace, name) in plan.actions.iter().map(Action::target) {
        tally.settle(namespace, name);
    }
}

/// After the change `what`, a pass over `touch` plans the writes of a
/// pass over everything, for less, and leaves `tally` with its counts,
/// before its writes and after them.
fn check_a_pass_over(
    touch: Touch,
    what: &str,
    w: &mut World,
    r: &ResolvedRule,
    tally: &mut Tally,
    basis: &Basis,
) {
    let mut scope = Scope::default();
    scope.add(touch);
    let scoped = w.plan_within(r, &scope);
    let full = w.plan(r);
    assert_eq!(verbs(&scoped), verbs(&full), "{what}: the same writes");
    assert!(
        scoped.examined < full.examined,
        "{what}: the scoped pass looked at less ({} of {})",
        scoped.examined,
        full.examined
    );
    let scope = tally.scope_for(basis, scope);
    assert!(
        !scope.is_everything(),
        "{what}: the tally describes this rule"
    );
    tally.record(basis, &scope, &scoped);
    assert_eq!(
        tally.in_place(scoped.places),
        full.in_place,
        "{what}: counts before the writes"
    );
    assert_eq!(tally.conflict_count(), full.conflicts.len(), "{what}");
    apply_and_settle(w, tally, &scoped);
    let after = w.plan(r);
    assert!(after.actions.is_empty(), "{what}: converged");
    assert_eq!(
        tally.in_place(after.places),
        after.in_place,
        "{what}: counts after"
    );
}
