//! What a rule knows of the foreign objects at its places: those its
//! writes met (a conflict, left alone), kept true by what the foreign
//! watch (`cluster::foreign`) says of them as they change or go. Pure.
//!
//! A known conflict is the rule's belief that an object it did not make
//! holds a place; a pass plans no write there while it lasts. The belief
//! ends when the object goes, stops being a conflict, or the watch that
//! would have said so was broken (then every belief is checked again by a
//! write). A write that met an object which went while the pass was still
//! under way is not believed: the pass the departure queued writes there.

use std::collections::{HashMap, HashSet};

use crate::api::kinds::Kind;
use crate::cache::index::{Object, ObjectKey};
use crate::core::plan::foreign_reason;
use crate::core::tally::Tally;

/// A change the foreign watch saw at a place.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ForeignChange<'a> {
    /// An object without the rule-UID label was created or changed there
    /// (its metadata).
    Applied(&'a Object),
    /// Such an object went, or gained the rule-UID label (the copy watch
    /// holds it now).
    Gone,
}

/// A rule's known conflicts in one cluster.
#[derive(Clone, Debug, Default)]
pub(crate) struct KnownConflicts {
    /// The rule (`namespace/name`) and the kind it copied at its last
    /// pass: the foreign watch of that kind speaks of its places.
    rule: String,
    kind: Option<Kind>,
    /// Places a foreign object holds, with why the rule leaves it there.
    held: HashMap<ObjectKey, String>,
    /// Places whose foreign object changed or went since the rule's
    /// current pass began.
    moved: HashSet<ObjectKey>,
    /// The foreign watch started again since the rule's current pass
    /// began: what its writes met may have gone unseen.
    restarted: bool,
    /// The rule adopts objects that hold what it would write: a change
    /// of a foreign object may make it one (its metadata alone cannot say).
    adopts: bool,
}

impl KnownConflicts {
    /// The places believed held, with why (what a plan reads).
    pub(crate) fn held(&self) -> &HashMap<ObjectKey, String> {
        &self.held
    }

    /// A pass of the rule `rule` (`namespace/name`), copying `kind`,
    /// begins: moves from now on are this pass's. Beliefs about another
    /// kind's objects (the rule changed its kind) are dropped.
    pub(crate) fn pass_begins(&mut self, rule: &str, kind: Kind) {
        if self.kind != Some(kind) {
            self.held.clear();
            self.kind = Some(kind);
        }
        if self.rule != rule {
            rule.clone_into(&mut self.rule);
        }
        self.moved.clear();
        self.restarted = false;
    }

    /// Whether the rule adopts what holds its copies' payload (`spec.adopt`).
    pub(crate) fn set_adopts(&mut self, adopts: bool) {
        self.adopts = adopts;
    }

    /// Whether the foreign watch of `kind` speaks of this rule's places.
    pub(crate) fn follows(&self, kind: Kind) -> bool {
        self.kind == Some(kind)
    }

    /// A write of the current pass met a foreign object at `place`, left
    /// alone for `reason`. Believed (true) unless an object moved there
    /// since the pass began, or the foreign watch started again meanwhile:
    /// then the write stays owed, and the caller looks at the place again.
    pub(crate) fn met(&mut self, place: ObjectKey, reason: String) -> bool {
        if self.restarted || self.moved.contains(&place) {
            return false;
        }
        self.held.insert(place, reason);
        true
    }

    /// Keep only the places `keep` accepts (a place the rule's own copy
    /// holds now is no conflict).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&ObjectKey) -> bool) {
        self.held.retain(|place, _| keep(place));
    }

    /// Forget every belief (the periodic resync checks them by writing).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
    }

    /// The foreign watch of the rule's kind started again, so changes may
    /// have been missed: every place believed held is forgotten, to be
    /// looked at again (returned).
    pub(crate) fn forget_all(&mut self) -> Vec<ObjectKey> {
        self.restarted = true;
        self.held.drain().map(|(place, _)| place).collect()
    }

    /// The foreign watch of the rule's kind saw `change` at `place`; the
    /// rule's passes left `tally`. Brings the belief there up to date;
    /// true when the rule must look at the place again (its status or its
    /// writes change).
    pub(crate) fn foreign_changed(
        &mut self,
        tally: &Tally,
        place: &ObjectKey,
        change: ForeignChange<'_>,
    ) -> bool {
        let (namespace, name) = place;
        let believed = self.held.get(place);
        let Some(kind) = self.kind else {
            return false;
        };
        if believed.is_none() && !tally.is_unsettled(namespace, name) {
            // A place the rule holds, or none of its places.
            return false;
        }
        let now = match change {
            ForeignChange::Gone => None,
            // Copyrator's copy, its rule-UID label removed: the pass takes it back.
            ForeignChange::Applied(object) if object.is_unlabelled_copy_of(&self.rule) => None,
            // It may hold the copy's payload now: the pass looks at it.
            ForeignChange::Applied(_) if self.adopts => None,
            ForeignChange::Applied(object) => Some(foreign_reason(kind, object)),
        };
        match now {
            None => {
                self.held.remove(place);
                self.moved.insert(place.clone());
                true
            }
            Some(reason) if believed == Some(&reason) => false,
            // Newly there (the rule owes a write there, which would meet
            // it), or there for another reason now.
            Some(reason) => {
                self.held.insert(place.clone(), reason);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::core::tally::Unsettled;
    use crate::{ANNOTATION_RULE, LABEL_MANAGED_BY};

    const RULE: &str = "ops/r";

    fn at(namespace: &str) -> ObjectKey {
        (namespace.to_owned(), "cfg".to_owned())
    }

    fn foreign(annotations: &[(&str, &str)]) -> Object {
        Object::new(
            "team-a",
            "cfg",
            "uid-foreign".into(),
            "3".into(),
            BTreeMap::new(),
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            BTreeMap::from([("data".to_owned(), json!({"k": "theirs"}))]),
        )
    }

    fn tally_with(place: &ObjectKey, state: Unsettled) -> Tally {
        let mut tally = Tally::default();
        tally.set(&place.0, &place.1, state);
        tally
    }

    #[test]
    fn a_rule_that_adopts_looks_again_at_a_conflict_whose_object_changed() {
        let place = at("team-a");
        let object = foreign(&[]);
        let reason = foreign_reason(Kind::ConfigMap, &object);
        let tally = tally_with(&place, Unsettled::Conflict(reason.clone()));
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        assert!(known.met(place.clone(), reason.clone()));
        let changed = ForeignChange::Applied(&object);
        assert!(
            !known.foreign_changed(&tally, &place, changed),
            "a rule that does not adopt has nothing to look at: the reason stands"
        );
        known.set_adopts(true);
        assert!(
            known.foreign_changed(&tally, &place, changed),
            "it may hold the copy's payload now"
        );
        assert!(known.held().is_empty(), "the pass finds out, by looking");
    }

    #[test]
    fn a_conflict_whose_object_goes_is_forgotten_and_looked_at_again() {
        let place = at("team-a");
        let reason = "a ConfigMap not made by Copyrator is there".to_owned();
        let tally = tally_with(&place, Unsettled::Conflict(reason.clone()));
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        assert!(known.met(place.clone(), reason));
        assert!(known.held().contains_key(&place));

        let again = known.foreign_changed(&tally, &place, ForeignChange::Gone);
        assert!(again, "the rule looks at the freed place");
        assert!(known.held().is_empty(), "the conflict is forgotten");
    }

    #[test]
    fn a_departure_elsewhere_or_at_a_place_in_order_changes_nothing() {
        let place = at("team-a");
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        // Settled places (the rule's copy is there, or none of its places).
        let tally = Tally::default();
        assert!(!known.foreign_changed(&tally, &place, ForeignChange::Gone));
        let object = foreign(&[]);
        assert!(!known.foreign_changed(&tally, &place, ForeignChange::Applied(&object)));
        assert!(known.held().is_empty());
    }

    #[test]
    fn a_foreign_object_where_a_write_is_owed_is_a_conflict_without_a_write() {
        let place = at("team-a");
        let tally = tally_with(&place, Unsettled::Unwritten);
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        let object = foreign(&[]);
        assert!(known.foreign_changed(&tally, &place, ForeignChange::Applied(&object)));
        assert_eq!(
            known.held().get(&place).map(String::as_str),
            Some("a ConfigMap not made by Copyrator is there")
        );
    }

    #[test]
    fn a_change_that_keeps_the_conflict_as_it_was_asks_for_nothing() {
        let place = at("team-a");
        let reason = "a ConfigMap not made by Copyrator is there".to_owned();
        let tally = tally_with(&place, Unsettled::Conflict(reason.clone()));
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        known.met(place.clone(), reason.clone());
        let relabelled = foreign(&[("team", "a")]);
        assert!(!known.foreign_changed(&tally, &place, ForeignChange::Applied(&relabelled)));
        // Annotated with a rule's name by someone else: still foreign, said otherwise.
        let mut annotated = foreign(&[(ANNOTATION_RULE, RULE)]);
        annotated.authored = false;
        assert!(known.foreign_changed(&tally, &place, ForeignChange::Applied(&annotated)));
        assert!(known.held()[&place].contains("set by another writer"));
    }

    #[test]
    fn a_copy_of_the_rule_that_lost_its_label_is_taken_back() {
        let place = at("team-a");
        let reason = "a ConfigMap not made by Copyrator is there".to_owned();
        let tally = tally_with(&place, Unsettled::Conflict(reason.clone()));
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        known.met(place.clone(), reason);
        // Written by Copyrator (every key counts as its own), its rule-UID label gone.
        let unlabelled = Object::new(
            "team-a",
            "cfg",
            "uid-copy".into(),
            "4".into(),
            BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), "copyrator".to_owned())]),
            BTreeMap::from([(ANNOTATION_RULE.to_owned(), RULE.to_owned())]),
            BTreeMap::new(),
        );
        assert!(unlabelled.is_unlabelled_copy_of(RULE));
        assert!(known.foreign_changed(&tally, &place, ForeignChange::Applied(&unlabelled)));
        assert!(known.held().is_empty());
    }

    /// The race between a write and a departure: the write met the object,
    /// the object went, and only then does the pass take in what its
    /// writes met. The departure wins: the place is not believed held.
    #[test]
    fn an_object_that_went_while_the_pass_wrote_is_not_believed_there() {
        let place = at("team-a");
        let reason = "a ConfigMap not made by Copyrator is there".to_owned();
        // The pass planned a create there: owed.
        let tally = tally_with(&place, Unsettled::Unwritten);
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        // Its create met the object; before the pass takes that in, it goes.
        assert!(known.foreign_changed(&tally, &place, ForeignChange::Gone));
        assert!(!known.met(place.clone(), reason.clone()), "not believed");
        assert!(known.held().is_empty());
        // The next pass begins afresh: a write that meets an object then is believed.
        known.pass_begins(RULE, Kind::ConfigMap);
        assert!(known.met(place.clone(), reason));
    }

    #[test]
    fn a_broken_watch_has_every_belief_checked_again() {
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        known.met(at("team-a"), "r".into());
        known.met(at("team-b"), "r".into());
        let mut again = known.forget_all();
        again.sort();
        assert_eq!(again, vec![at("team-a"), at("team-b")]);
        assert!(known.held().is_empty());
        // A pass under way meanwhile does not believe what it met there.
        assert!(!known.met(at("team-a"), "r".into()));
    }

    /// The race between a write and a broken watch: the write met an
    /// object the rule did not believe held yet; the watch broke, the
    /// object went unseen, the watch started again. The pass does not
    /// believe what its write met.
    #[test]
    fn a_conflict_met_while_the_watch_restarted_is_not_believed() {
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        assert!(known.forget_all().is_empty());
        assert!(!known.met(at("team-a"), "r".into()));
        known.pass_begins(RULE, Kind::ConfigMap);
        assert!(known.met(at("team-a"), "r".into()));
    }

    #[test]
    fn beliefs_about_another_kind_are_dropped_when_the_rule_changes_kind() {
        let mut known = KnownConflicts::default();
        known.pass_begins(RULE, Kind::ConfigMap);
        known.met(at("team-a"), "r".into());
        assert!(known.follows(Kind::ConfigMap));
        known.pass_begins(RULE, Kind::Secret);
        assert!(known.held().is_empty());
        assert!(known.follows(Kind::Secret) && !known.follows(Kind::ConfigMap));
    }
}
