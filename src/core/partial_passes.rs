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
use crate::core::plan::tests::{World, rule, verbs};
use crate::core::plan::{Action, Desired, Occupied, Plan, concerns_namespace, occupied};
use crate::core::resolve::ResolvedRule;
use crate::core::scope::{Scope, Touch};
use crate::core::tally::{Basis, Counts, Tally, Unsettled};
use crate::{
    ANNOTATION_RULE, ANNOTATION_SOURCE, CREATE_ONLY, LABEL_MANAGED_BY, LABEL_RULE_UID,
    LABEL_SYNC_POLICY,
};

/// The rule's own namespace, where its sources are.
const SOURCE_NAMESPACE: &str = "src";
/// Namespaces that may exist besides it; the last one only appears later.
const NAMESPACES: [&str; 5] = ["team-a", "team-b", "team-c", "ops-d", "ops-e"];
const SOURCE_NAMES: [&str; 3] = ["cm1", "cm2", "cm3"];
/// UID of another rule, whose copies this rule never takes.
const OTHER_RULE_UID: &str = "rule-2";
/// How many specs [`spec`] knows.
const SPECS: usize = 7;

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
        _ => json!({"syncPolicy": "CreateOnly"}),
    };
    json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": spec})
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
    /// A source appears, or its data changes.
    SourceWritten {
        name: usize,
        data: u8,
    },
    SourceGoes {
        name: usize,
    },
    /// The source's label changes: it matches the rule's selector or not.
    SourceLabelled {
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

/// The cluster, the rule, and what Copyrator keeps of the rule between
/// passes (its tally and its known conflicts; a plan reads the world's
/// copy of the latter).
struct ModelCluster {
    world: World,
    /// Objects without the rule-UID label: the copy watch does not see
    /// them, the foreign watch does; a write meets them.
    foreign: BTreeMap<ObjectKey, Arc<Object>>,
    rule: ResolvedRule,
    generation: i64,
    tally: Tally,
    conflicts: KnownConflicts,
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

impl ModelCluster {
    /// Four of the namespaces, two matching sources, the rule at generation 1.
    fn new(spec_variant: usize) -> Self {
        let mut world = World::new(&[SOURCE_NAMESPACE]);
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
        let mut cluster = Self {
            world,
            foreign: BTreeMap::new(),
            rule: rule(spec(spec_variant)),
            generation: 1,
            tally: Tally::default(),
            conflicts: KnownConflicts::default(),
            versions: 0,
        };
        for name in 0..2 {
            cluster.change(&ModelChange::SourceWritten { name, data: 0 });
        }
        cluster
    }

    fn basis(&self) -> Basis {
        Basis {
            uid: self.rule.uid.clone(),
            generation: Some(self.generation),
        }
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

    /// The copy of this rule at `place`, as the copy cache holds it.
    fn own_copy(&self, (namespace, name): &ObjectKey) -> Option<Arc<Object>> {
        self.world
            .copies
            .get(namespace, name)
            .filter(|copy| copy.rule_uid() == Some(self.rule.uid.as_str()))
            .cloned()
    }

    /// The touch a copy event at `place` brings this rule, as the copy
    /// watch hands it out: to the rule that owned the object before or
    /// after, and (`Shared::copy_place_changed`) to a rule whose tally
    /// holds the place unsettled.
    fn copy_event(
        &self,
        (namespace, name): &ObjectKey,
        owner_before: Option<&str>,
        owner_after: Option<&str>,
    ) -> Option<Touch> {
        let ours = Some(self.rule.uid.as_str());
        (owner_before == ours || owner_after == ours || self.tally.is_unsettled(namespace, name))
            .then(|| Touch::Copy(namespace.clone(), name.clone()))
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

    /// ModelChange the namespace `namespace` with `edit`; the touch of its event.
    fn edit_namespace(
        &mut self,
        namespace: usize,
        edit: impl FnOnce(&mut NamespaceInfo),
    ) -> Option<Touch> {
        let namespace = NAMESPACES[namespace];
        let info = self.world.namespaces.get_mut(namespace)?;
        let before = info.clone();
        edit(info);
        let after = info.clone();
        self.namespace_event(namespace, Some(&before), Some(&after))
    }

    fn source(&self, name: usize) -> Option<&Arc<Object>> {
        self.world
            .sources
            .iter()
            .find(|source| &*source.name == SOURCE_NAMES[name])
    }

    /// The touch a source event brings this rule: its source watch holds
    /// only what matches the rule's selector, before or after.
    fn source_event(
        &self,
        name: usize,
        before: Option<&Object>,
        after: Option<&Object>,
    ) -> Option<Touch> {
        let matches = |source: Option<&Object>| {
            source.is_some_and(|s| s.labels.get("copy").is_some_and(|v| v == "yes"))
        };
        (matches(before) || matches(after)).then(|| Touch::Source(SOURCE_NAMES[name].to_owned()))
    }

    /// Put `source` in place of the source of its name.
    fn put_source(&mut self, name: usize, source: Option<Object>) -> Option<Touch> {
        let before = self.source(name).cloned();
        self.world
            .sources
            .retain(|s| &*s.name != SOURCE_NAMES[name]);
        let after = source.map(Arc::new);
        if let Some(after) = &after {
            self.world.sources.push(after.clone());
        }
        self.source_event(name, before.as_deref(), after.as_deref())
    }

    /// Make `change` (each kind by the method of its name); the touches its
    /// watch events bring this rule.
    fn change(&mut self, change: &ModelChange) -> Vec<Touch> {
        let touch = match *change {
            ModelChange::NamespaceAppears { namespace, env } => {
                self.namespace_appears(namespace, env)
            }
            ModelChange::NamespaceLabelled { namespace, env } => {
                self.edit_namespace(namespace, |info| info.labels = env_labels(env))
            }
            ModelChange::NamespaceTerminates { namespace } => {
                self.edit_namespace(namespace, |info| info.terminating = true)
            }
            ModelChange::NamespaceGoes { namespace } => return self.namespace_goes(namespace),
            ModelChange::SourceWritten { name, data } => self.source_written(name, data),
            ModelChange::SourceGoes { name } => self.put_source(name, None),
            ModelChange::SourceLabelled { name, matches } => self.source_labelled(name, matches),
            ModelChange::ForeignAppears { namespace, name } => {
                self.foreign_appears(place(namespace, name))
            }
            ModelChange::ForeignGoes { namespace, name } => {
                self.foreign_goes(place(namespace, name))
            }
            ModelChange::ForeignRelabelled {
                namespace,
                name,
                names_the_rule,
            } => self.foreign_relabelled(place(namespace, name), names_the_rule),
            ModelChange::ForeignLabelledAsCopy { namespace, name } => {
                return self.foreign_labelled_as_copy(place(namespace, name));
            }
            ModelChange::ForgedCopyUnlabelled { namespace, name } => {
                return self.forged_copy_unlabelled(place(namespace, name));
            }
            ModelChange::ForeignGoesUnseen { namespace, name } => {
                self.foreign.remove(&place(namespace, name));
                return self.foreign_watch_restarted();
            }
            ModelChange::ForeignWatchRestarted => return self.foreign_watch_restarted(),
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
                return self.copy_unlabelled(place(namespace, name));
            }
            ModelChange::CopyTakenOver { namespace, name } => {
                return self.copy_taken_over(place(namespace, name));
            }
            ModelChange::RuleChanged {
                spec: variant,
                delivered,
            } => self.rule_changed(variant, delivered),
            ModelChange::Resync => {
                self.conflicts.clear();
                Some(Touch::All)
            }
            ModelChange::Retry => Some(Touch::Retry),
            ModelChange::StatusWritten => Some(Touch::Nothing),
            ModelChange::CopyWritten { namespace, name } => {
                let (namespace, name) = place(namespace, name);
                Some(Touch::Copy(namespace, name))
            }
        };
        touch.into_iter().collect()
    }

    fn namespace_appears(&mut self, namespace: usize, env: Option<&str>) -> Option<Touch> {
        let name = NAMESPACES[namespace];
        if self.world.namespaces.contains_key(name) {
            return None;
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
    fn namespace_goes(&mut self, namespace: usize) -> Vec<Touch> {
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

    /// The source `name` appears (matching the rule's selector), or its
    /// data becomes `data`.
    fn source_written(&mut self, name: usize, data: u8) -> Option<Touch> {
        let version = self.next_version();
        let before = self.source(name).cloned();
        let (uid, labels) = match &before {
            Some(source) => (source.uid.clone(), source.labels.clone()),
            None => (
                format!("source-{version}"),
                BTreeMap::from([("copy".to_owned(), "yes".to_owned())]),
            ),
        };
        let source = Object::new(
            SOURCE_NAMESPACE,
            SOURCE_NAMES[name],
            uid,
            version.to_string(),
            labels,
            BTreeMap::new(),
            BTreeMap::from([("data".to_owned(), json!({ "k": data.to_string() }))]),
        );
        self.put_source(name, Some(source))
    }

    fn source_labelled(&mut self, name: usize, matches: bool) -> Option<Touch> {
        let before = self.source(name).cloned()?;
        let mut source = (*before).clone();
        source.resource_version = self.next_version().to_string();
        source
            .labels
            .insert("copy".into(), if matches { "yes" } else { "no" }.into());
        source.rehash();
        self.put_source(name, Some(source))
    }

    /// Whether an object can be created at `place`: its namespace is open
    /// and nothing holds the name.
    fn can_create(&self, place: &ObjectKey) -> bool {
        self.is_open(&place.0) && self.is_free(place)
    }

    fn foreign_appears(&mut self, at: ObjectKey) -> Option<Touch> {
        if !self.can_create(&at) {
            return None;
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

    fn foreign_goes(&mut self, at: ObjectKey) -> Option<Touch> {
        self.foreign.remove(&at)?;
        self.foreign_event(&at, None)
    }

    /// The foreign watch starts again: the rule looks again at every place
    /// it believed held.
    fn foreign_watch_restarted(&mut self) -> Vec<Touch> {
        self.conflicts
            .forget_all()
            .into_iter()
            .map(|(namespace, name)| Touch::Copy(namespace, name))
            .collect()
    }

    /// The foreign watch's event at `at` (`Some`: the object there now, as
    /// created or changed; `None`: gone), as `Shared::foreign_changed`
    /// hands it out: the rule's belief there brought up to date, and a
    /// touch when the rule must look at the place again.
    fn foreign_event(&mut self, at: &ObjectKey, now: Option<&Object>) -> Option<Touch> {
        let change = match now {
            Some(object) => ForeignChange::Applied(object),
            None => ForeignChange::Gone,
        };
        self.conflicts
            .foreign_changed(&self.tally, at, change)
            .then(|| Touch::Copy(at.0.clone(), at.1.clone()))
    }

    fn foreign_relabelled(&mut self, at: ObjectKey, names_the_rule: bool) -> Option<Touch> {
        let before = self.foreign.get(&at)?;
        let mut changed = (**before).clone();
        changed.resource_version = self.next_version().to_string();
        changed
            .labels
            .insert("team".into(), format!("t{}", self.versions));
        if names_the_rule {
            changed
                .annotations
                .insert(ANNOTATION_RULE.into(), self.rule.key.to_string());
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

    fn foreign_labelled_as_copy(&mut self, at: ObjectKey) -> Vec<Touch> {
        let Some(before) = self.foreign.remove(&at) else {
            return Vec::new();
        };
        let mut touches: Vec<Touch> = self.foreign_event(&at, None).into_iter().collect();
        let mut forged = (*before).clone();
        forged.resource_version = self.next_version().to_string();
        forged
            .labels
            .insert(LABEL_RULE_UID.to_owned(), self.rule.uid.clone());
        forged.rehash();
        // As the copy watch reads it: managedFields name another writer.
        forged.authored = false;
        forged.rule_uid = None;
        forged.set_owned(|_, _| false);
        self.world.copies.upsert(Arc::new(forged.into_compact()));
        touches.extend(self.copy_event(&at, None, None));
        touches
    }

    fn forged_copy_unlabelled(&mut self, at: ObjectKey) -> Vec<Touch> {
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
        let mut touches: Vec<Touch> = self.copy_event(&at, None, None).into_iter().collect();
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

    fn other_rules_copy_appears(&mut self, at: ObjectKey) -> Option<Touch> {
        if !self.can_create(&at) {
            return None;
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

    fn forged_copy_appears(&mut self, at: ObjectKey) -> Option<Touch> {
        if !self.can_create(&at) {
            return None;
        }
        let version = self.next_version();
        let mut forged = Object::new(
            &at.0,
            &at.1,
            format!("forged-{version}"),
            version.to_string(),
            BTreeMap::from([
                (LABEL_RULE_UID.to_owned(), self.rule.uid.clone()),
                (LABEL_MANAGED_BY.to_owned(), "copyrator".to_owned()),
            ]),
            BTreeMap::from([(ANNOTATION_RULE.to_owned(), self.rule.key.to_string())]),
            BTreeMap::from([("data".to_owned(), json!({"k": "forged"}))]),
        );
        // As the copy watch reads it: managedFields name another writer.
        forged.authored = false;
        forged.rule_uid = None;
        forged.set_owned(|_, _| false);
        self.world.copies.upsert(Arc::new(forged.into_compact()));
        self.copy_event(&at, None, None)
    }

    fn labelled_foreign_goes(&mut self, at: &ObjectKey) -> Option<Touch> {
        let object = self
            .world
            .copies
            .get(&at.0, &at.1)
            .filter(|object| object.rule_uid() != Some(self.rule.uid.as_str()))
            .cloned()?;
        self.leaves_copy_watch(&object);
        self.copy_event(at, object.rule_uid(), None)
    }

    fn copy_edited(&mut self, at: &ObjectKey) -> Option<Touch> {
        let copy = self.own_copy(at)?;
        // A new version by another writer: its data differs, and it is no
        // answer to a write of ours.
        let mut edited = (*copy).clone();
        edited.payload_hash = edited.payload_hash.wrapping_add(1);
        edited.resource_version = self.next_version().to_string();
        edited.written_for = None;
        edited.settled = false;
        self.world.copies.upsert(Arc::new(edited));
        let ours = Some(self.rule.uid.as_str());
        self.copy_event(at, ours, ours)
    }

    fn copy_deleted(&mut self, at: &ObjectKey) -> Option<Touch> {
        let copy = self.own_copy(at)?;
        self.leaves_copy_watch(&copy);
        self.copy_event(at, Some(self.rule.uid.as_str()), None)
    }

    fn copy_unlabelled(&mut self, at: ObjectKey) -> Vec<Touch> {
        let Some(copy) = self.own_copy(&at) else {
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
        self.left_for_the_foreign_watch(at, unlabelled)
    }

    /// One of the rule's copies leaves the copy watch and comes to the
    /// foreign watch as `now`: the touches of both events.
    fn left_for_the_foreign_watch(&mut self, at: ObjectKey, now: Object) -> Vec<Touch> {
        let now = Arc::new(now);
        self.foreign.insert(at.clone(), now.clone());
        let mut touches: Vec<Touch> = self
            .copy_event(&at, Some(self.rule.uid.as_str()), None)
            .into_iter()
            .collect();
        touches.extend(self.foreign_event(&at, Some(&now)));
        touches
    }

    fn copy_taken_over(&mut self, at: ObjectKey) -> Vec<Touch> {
        let Some(copy) = self.own_copy(&at) else {
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
        self.left_for_the_foreign_watch(at, foreign)
    }

    /// The rule's next generation, of the spec `variant`.
    fn rule_changed(&mut self, variant: usize, delivered: Delivered) -> Option<Touch> {
        self.rule = rule(spec(variant));
        self.generation += 1;
        Some(match delivered {
            Delivered::AsChangedSpec => Touch::All,
            Delivered::ThroughStatusPass => Touch::Nothing,
        })
    }

    /// `object` leaves what the copy watch selects (deleted, or its
    /// rule-UID label removed): the watch reports it deleted.
    fn leaves_copy_watch(&mut self, object: &Object) {
        self.world
            .copies
            .deleted(&object.namespace, &object.name, &object.uid);
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

    /// Carry out `action` as the writer does: a create that finds the name
    /// taken by an object the cache does not hold resolves it with
    /// [`occupied`] (a conflict, or a take-over under `Overwrite`).
    fn write(&mut self, action: &Action) -> WriteOutcome {
        match action {
            Action::Create { desired, namespace } => {
                let at = (namespace.clone(), desired.name.clone());
                // The plan saw the copy cache: only an object it does not
                // hold can take the name.
                let mut uid = None;
                if let Some(existing) = self.foreign.get(&at).cloned() {
                    let rule_name = self.rule.key.to_string();
                    match occupied(desired, &existing, self.rule.conflict_policy, &rule_name) {
                        Occupied::Ours => return WriteOutcome::Written,
                        Occupied::Conflict(reason) => return WriteOutcome::Conflict(reason),
                        Occupied::Update => uid = Some(existing.uid.clone()),
                        Occupied::Recreate => {}
                    }
                    self.foreign.remove(&at);
                }
                self.put_copy(namespace, desired, uid);
            }
            Action::Update { desired, current } => {
                self.put_copy(&current.namespace, desired, Some(current.uid.clone()));
            }
            Action::Recreate { desired, current } => {
                self.leaves_copy_watch(current);
                self.put_copy(&current.namespace, desired, None);
            }
            Action::Delete { current, .. } => {
                self.world
                    .copies
                    .remove(&current.namespace, &current.name, &current.uid);
            }
            Action::HandOver { current, .. } => {
                let mut handed = (**current).clone();
                handed.create_only = true;
                handed.resource_version = self.next_version().to_string();
                self.world.copies.upsert_written(Arc::new(handed));
            }
        }
        WriteOutcome::Written
    }

    /// One pass over what `touches` changed, as `reconcile::carry_out` and
    /// `finish` make it; its n-th write (in place order) fails when bit n
    /// of `failing` is set. Checks the pass against a pass over everything.
    fn pass(&mut self, touches: Vec<Touch>, failing: u32) -> Result<(), TestCaseError> {
        let basis = self.basis();
        let mut touched = Scope::default();
        for touch in touches {
            touched.add(touch);
        }
        self.conflicts
            .pass_begins(&self.rule.key.to_string(), self.rule.kind);
        self.world.known_conflicts = self.conflicts.held().clone();
        let mut scope = self.tally.scope_for(&basis, touched);
        if scope.retries() {
            let unsettled: Vec<ObjectKey> = self
                .tally
                .places()
                .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                .collect();
            for (namespace, name) in unsettled {
                scope.add(Touch::Copy(namespace, name));
            }
        }
        let plan = self.world.plan_within(&self.rule, &scope);
        self.tally.record(&basis, &scope, &plan);

        // Each write of the pass is one a pass over everything makes, and
        // what that pass makes besides is still owed from earlier passes.
        let full = self.world.plan(&self.rule);
        let full_verbs = verbs(&full);
        for write in verbs(&plan) {
            prop_assert!(
                full_verbs.contains(&write),
                "{write:?} is no write of a pass over everything: {full_verbs:?}"
            );
        }
        self.check_owed(&full, "before the writes")?;

        let mut new_conflicts = Vec::new();
        for (index, action) in plan.actions.iter().enumerate() {
            // A failed write, or one waiting out its backoff: still owed.
            if failing & (1 << (index % 32)) != 0 {
                continue;
            }
            let (namespace, name) = action.target();
            match self.write(action) {
                WriteOutcome::Written => self.tally.settle(namespace, name),
                WriteOutcome::Conflict(reason) => {
                    new_conflicts.push(((namespace.to_owned(), name.to_owned()), reason));
                }
            }
        }
        for ((namespace, name), reason) in new_conflicts {
            if self
                .conflicts
                .met((namespace.clone(), name.clone()), reason.clone())
            {
                self.tally
                    .set(&namespace, &name, Unsettled::Conflict(reason));
            }
        }
        let rule_uid = self.rule.uid.clone();
        let copies = &self.world.copies;
        self.conflicts.retain(|(namespace, name)| {
            copies
                .get(namespace, name)
                .is_none_or(|copy| copy.rule_uid() != Some(rule_uid.as_str()))
        });

        let truth = self.truth();
        prop_assert_eq!(
            self.tally.counts(&plan),
            counts_of(&truth),
            "the status counts"
        );
        self.check_owed(&truth, "after the writes")?;
        Ok(())
    }

    /// What a pass over everything from the cluster as it is finds, each
    /// of its creates tried: a create meets the foreign object at its
    /// place (a conflict, or one `Overwrite` takes over). Not what the
    /// rule believes: a place it believes held by an object that went is
    /// free here. A place where the tally still owes a write (it failed)
    /// is left to that write, which meets what is there.
    fn truth(&mut self) -> Plan {
        let believed = std::mem::take(&mut self.world.known_conflicts);
        let blind = self.world.plan(&self.rule);
        let rule_name = self.rule.key.to_string();
        let mut met = HashMap::new();
        for action in &blind.actions {
            let Action::Create { desired, namespace } = action else {
                continue;
            };
            let at = (namespace.clone(), desired.name.clone());
            if self.tally.is_unwritten(&at.0, &at.1) {
                continue;
            }
            if let Some(existing) = self.foreign.get(&at)
                && let Occupied::Conflict(reason) =
                    occupied(desired, existing, self.rule.conflict_policy, &rule_name)
            {
                met.insert(at, reason);
            }
        }
        self.world.known_conflicts = met;
        let truth = self.world.plan(&self.rule);
        self.world.known_conflicts = believed;
        truth
    }

    /// Every write of `full`, a plan over everything, is still owed, so a
    /// retry makes it. The tally may owe more, but only deletions (the
    /// counts, checked apart, would show an owed copy): one in a namespace
    /// that started terminating, say, which no pass was told of; a retry
    /// finds nothing to do there.
    fn check_owed(&self, full: &Plan, when: &str) -> Result<(), TestCaseError> {
        let owed = owed_places(&self.tally);
        let written = written_places(full);
        let forgotten: Vec<&ObjectKey> = written.difference(&owed).collect();
        prop_assert!(
            forgotten.is_empty(),
            "{when}: writes a pass over everything makes that no pass owes: {forgotten:?}"
        );
        Ok(())
    }
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
        (source_name(), 0..3u8).prop_map(|(name, data)| ModelChange::SourceWritten { name, data }),
        source_name().prop_map(|name| ModelChange::SourceGoes { name }),
        (source_name(), any::<bool>())
            .prop_map(|(name, matches)| ModelChange::SourceLabelled { name, matches }),
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
        (0..SPECS, delivered)
            .prop_map(|(spec, delivered)| ModelChange::RuleChanged { spec, delivered }),
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
    /// leaves the rule's status as a pass over everything would.
    #[test]
    fn passes_over_what_changed_count_what_a_pass_over_everything_counts(
        first_spec in 0..SPECS,
        first_failing in failing(),
        steps in prop::collection::vec((change(), failing()), 1..40),
    ) {
        let mut cluster = ModelCluster::new(first_spec);
        cluster.pass(vec![Touch::All], first_failing)?;
        for (change, failing) in &steps {
            let touches = cluster.change(change);
            // A change no watch reports brings no pass.
            if !touches.is_empty() {
                cluster.pass(touches, *failing)?;
            }
        }
    }
}

/// The cluster once the rule's first pass (over everything) made every write.
fn started(spec_variant: usize) -> ModelCluster {
    let mut cluster = ModelCluster::new(spec_variant);
    cluster
        .pass(vec![Touch::All], 0)
        .unwrap_or_else(|failed| panic!("the first pass: {failed}"));
    cluster
}

/// Run `cluster` through `changes`, each followed by its pass, every write
/// made; panics with the check that failed.
fn replay(cluster: &mut ModelCluster, changes: &[ModelChange]) {
    for change in changes {
        let touches = cluster.change(change);
        if !touches.is_empty() {
            cluster
                .pass(touches, 0)
                .unwrap_or_else(|failed| panic!("after {change:?}: {failed}"));
        }
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
        .pass(vec![Touch::All], 1 << 2)
        .expect("the first pass counts as a pass over everything");
    assert!(cluster.tally.is_unwritten("team-a", "cm1"));
    let appears = ModelChange::OtherRulesCopyAppears {
        namespace: 0,
        name: 0,
    };
    assert_eq!(
        cluster.change(&appears),
        vec![Touch::Copy("team-a".into(), "cm1".into())],
        "the rule hears of the place it owes a write"
    );
    cluster
        .pass(vec![Touch::Copy("team-a".into(), "cm1".into())], 0)
        .expect("the pass over the place counts the conflict");
    replay(&mut cluster, &[ModelChange::StatusWritten]);
    assert!(cluster.tally.is_conflict("team-a", "cm1"));
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
                spec: 4,
                delivered: Delivered::AsChangedSpec,
            },
        ],
    );
    assert!(cluster.own_copy(&place(0, 0)).is_some());
    assert!(cluster.world.plan(&cluster.rule).actions.is_empty());
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
                spec: 0,
                delivered: Delivered::ThroughStatusPass,
            },
        ],
    );
    assert!(cluster.tally.is_conflict("ops-d", "cm1"));
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
        .pass(vec![Touch::All], 0)
        .expect("the first pass meets the foreign object");
    assert!(cluster.tally.is_conflict("team-a", "cm1"));

    let freed = cluster.change(&ModelChange::ForeignGoes {
        namespace: 0,
        name: 0,
    });
    assert_eq!(freed, vec![Touch::Copy("team-a".into(), "cm1".into())]);
    cluster
        .pass(freed, 0)
        .expect("the pass over the freed place writes the copy");
    assert!(cluster.own_copy(&place(0, 0)).is_some());
    assert!(!cluster.tally.is_conflict("team-a", "cm1"));
}
