//! What a rule's passes left unsettled: the copies not written yet and
//! the conflicts, by place. A pass that looks at part of a rule replaces
//! only that part, so the rule's counts stay exact without a walk over
//! every copy. Pure data, no I/O.

use std::collections::HashMap;

use crate::api::rule::ConflictEntry;
use crate::core::plan::{Action, Plan};
use crate::core::scope::Scope;

/// A rule's counts for its status, as a pass leaves them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Copies in place, of every place the rule reaches.
    pub(crate) copies: u32,
    pub(crate) conflicts: Vec<ConflictEntry>,
}

/// Why a place that should hold a copy does not (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unsettled {
    /// Something else is there; the copy is skipped.
    Conflict(String),
    /// The copy is to be created or updated and has not been.
    Unwritten,
    /// The copy is to be deleted and has not been.
    UnwrittenDelete,
}

/// `(namespace, name)` of a copy.
type Place = (String, String);

/// The rule a tally describes: its UID and the generation its last pass
/// over everything planned. Places a partial pass did not look at were
/// judged by that generation's targets, so they say nothing of another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Basis {
    pub(crate) uid: String,
    pub(crate) generation: Option<i64>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    basis: Option<Basis>,
    places: HashMap<Place, Unsettled>,
    conflicts: usize,
    unwritten: usize,
    unwritten_deletes: usize,
}

impl Tally {
    /// The scope a pass of the rule as `basis` describes it must look at:
    /// `scope` when this tally was built for that rule and generation,
    /// everything otherwise (a new rule, a changed spec that reached this
    /// pass without its own full pass), so that no count survives from
    /// targets the rule no longer has.
    pub(crate) fn scope_for(&self, basis: &Basis, scope: Scope) -> Scope {
        if self.basis.as_ref() == Some(basis) {
            scope
        } else {
            Scope::everything()
        }
    }

    /// Forget what `scope` covers: the pass that looks at it says anew.
    pub(crate) fn clear(&mut self, scope: &Scope) {
        if scope.is_everything() {
            *self = Self::default();
            return;
        }
        self.places
            .retain(|(namespace, name), _| !scope.covers(namespace, name));
        self.recount();
    }

    /// Take what a pass over `scope` planned: its conflicts and its writes
    /// replace whatever was held for the places it looked at.
    /// `basis` is the rule the pass planned for; a pass over everything
    /// makes it this tally's.
    pub(crate) fn record(&mut self, basis: &Basis, scope: &Scope, plan: &Plan) {
        self.clear(scope);
        if scope.is_everything() {
            self.basis = Some(basis.clone());
        }
        for conflict in &plan.conflicts {
            self.set(
                &conflict.namespace,
                &conflict.name,
                Unsettled::Conflict(conflict.reason.clone()),
            );
        }
        for action in &plan.actions {
            let (namespace, name) = action.target();
            let state = match action {
                Action::Delete { .. } | Action::HandOver { .. } => Unsettled::UnwrittenDelete,
                _ => Unsettled::Unwritten,
            };
            self.set(namespace, name, state);
        }
    }

    pub(crate) fn set(&mut self, namespace: &str, name: &str, state: Unsettled) {
        self.count(&state, 1);
        if let Some(previous) = self
            .places
            .insert((namespace.to_owned(), name.to_owned()), state)
        {
            self.count(&previous, -1);
        }
    }

    /// The copy at this place is right now.
    pub(crate) fn settle(&mut self, namespace: &str, name: &str) {
        if let Some(previous) = self.places.remove(&(namespace.to_owned(), name.to_owned())) {
            self.count(&previous, -1);
        }
    }

    /// What the rule's status counts after a pass that planned `plan`:
    /// the copies in place wherever the rule reaches, and every conflict
    /// (those held here and the sources `plan` found shadowed), sorted.
    pub(crate) fn counts(&self, plan: &Plan) -> Counts {
        let mut conflicts: Vec<ConflictEntry> = self
            .conflicts()
            .map(|(namespace, name, reason)| ConflictEntry {
                cluster: None,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: reason.to_owned(),
            })
            .chain(plan.shadowed.iter().cloned())
            .collect();
        conflicts.sort();
        conflicts.dedup();
        Counts {
            copies: self.in_place(plan.places),
            conflicts,
        }
    }

    /// Places with a conflict, and its reason.
    pub(crate) fn conflicts(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.places
            .iter()
            .filter_map(|((ns, name), state)| match state {
                Unsettled::Conflict(reason) => Some((ns.as_str(), name.as_str(), reason.as_str())),
                _ => None,
            })
    }

    /// Every unsettled place (for a pass that retries them).
    pub(crate) fn places(&self) -> impl Iterator<Item = (&str, &str)> {
        self.places
            .keys()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
    }

    /// Whether a write at `(namespace, name)` is still to be made.
    pub(crate) fn is_unwritten(&self, namespace: &str, name: &str) -> bool {
        matches!(
            self.places.get(&(namespace.to_owned(), name.to_owned())),
            Some(Unsettled::Unwritten | Unsettled::UnwrittenDelete)
        )
    }

    #[cfg(test)]
    /// Whether `(namespace, name)` is a conflict of this rule.
    pub(crate) fn is_conflict(&self, namespace: &str, name: &str) -> bool {
        self.conflicts > 0
            && matches!(
                self.places.get(&(namespace.to_owned(), name.to_owned())),
                Some(Unsettled::Conflict(_))
            )
    }

    /// Whether anything is held at `(namespace, name)`: a conflict, or a
    /// write still to be made. A change of the object there may change
    /// either (another rule's copy that appears where a create is still to
    /// be made is a conflict now).
    pub(crate) fn is_unsettled(&self, namespace: &str, name: &str) -> bool {
        !self.places.is_empty()
            && self
                .places
                .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// Whether any write is still to be made.
    pub(crate) fn has_unwritten(&self) -> bool {
        self.unwritten + self.unwritten_deletes > 0
    }

    #[cfg(test)]
    pub(crate) fn conflict_count(&self) -> usize {
        self.conflicts
    }

    #[cfg(test)]
    /// Copies to create or update that are not written yet.
    pub(crate) fn unwritten_count(&self) -> usize {
        self.unwritten
    }

    /// How many copies are in place, of `places` that should hold one
    /// (conflicts included).
    pub(crate) fn in_place(&self, places: u32) -> u32 {
        (places as usize).saturating_sub(self.conflicts + self.unwritten) as u32
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    fn count(&mut self, state: &Unsettled, by: isize) {
        let counter = match state {
            Unsettled::Conflict(_) => &mut self.conflicts,
            Unsettled::Unwritten => &mut self.unwritten,
            Unsettled::UnwrittenDelete => &mut self.unwritten_deletes,
        };
        *counter = counter.saturating_add_signed(by);
    }

    fn recount(&mut self) {
        let (mut conflicts, mut unwritten, mut deletes) = (0, 0, 0);
        for state in self.places.values() {
            match state {
                Unsettled::Conflict(_) => conflicts += 1,
                Unsettled::Unwritten => unwritten += 1,
                Unsettled::UnwrittenDelete => deletes += 1,
            }
        }
        self.conflicts = conflicts;
        self.unwritten = unwritten;
        self.unwritten_deletes = deletes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scope::Touch;

    #[test]
    fn a_partial_pass_replaces_only_what_it_covers() {
        let mut tally = Tally::default();
        tally.set("a", "cm", Unsettled::Unwritten);
        tally.set("b", "cm", Unsettled::Conflict("foreign".into()));
        tally.set("c", "old", Unsettled::UnwrittenDelete);
        assert_eq!((tally.unwritten_count(), tally.conflict_count()), (1, 1));
        assert_eq!(tally.in_place(10), 8, "a pending delete is no missing copy");
        let mut scope = Scope::default();
        scope.add(Touch::Namespace("a".into()));
        tally.clear(&scope);
        assert_eq!((tally.unwritten_count(), tally.conflict_count()), (0, 1));
        assert_eq!(tally.places().count(), 2, "b and c stay");
        tally.set("b", "cm", Unsettled::Unwritten);
        assert_eq!((tally.unwritten_count(), tally.conflict_count()), (1, 0));
        assert!(tally.is_unwritten("b", "cm") && !tally.is_conflict("b", "cm"));
        tally.settle("b", "cm");
        tally.settle("b", "cm");
        assert_eq!(tally.unwritten_count(), 0, "settled once");
        assert!(tally.has_unwritten(), "c's delete is still to be made");
        tally.set("c", "old", Unsettled::Conflict("taken".into()));
        assert!(tally.is_conflict("c", "old") && !tally.is_unwritten("c", "old"));
        assert!(!tally.has_unwritten());
        tally.clear(&Scope::everything());
        assert!(tally.is_empty());
    }

    /// A change at a place where a write is still owed or a conflict is
    /// held concerns the rule; one at a settled place does not.
    #[test]
    fn owed_writes_and_conflicts_are_unsettled_places() {
        let mut tally = Tally::default();
        assert!(!tally.is_unsettled("a", "cm"));
        tally.set("a", "cm", Unsettled::Unwritten);
        tally.set("b", "cm", Unsettled::Conflict("another rule's copy".into()));
        tally.set("c", "old", Unsettled::UnwrittenDelete);
        assert!(tally.is_unsettled("a", "cm") && tally.is_unsettled("b", "cm"));
        assert!(tally.is_unsettled("c", "old"));
        assert!(!tally.is_unsettled("b", "other"));
        tally.settle("a", "cm");
        assert!(!tally.is_unsettled("a", "cm"), "written now");
    }

    /// The status bug this pins: a rule whose targets changed (generation
    /// 2) reached a status-only pass without a pass over everything; the
    /// tally, holding only generation 1's places, had no conflict in the new
    /// target, and the status counted the foreign object there as a copy.
    #[test]
    fn a_pass_for_another_generation_or_rule_looks_at_everything() {
        let basis = |uid: &str, generation| Basis {
            uid: uid.into(),
            generation: Some(generation),
        };
        let mut touched = Scope::default();
        touched.add(Touch::Nothing);
        let mut tally = Tally::default();
        assert!(
            tally
                .scope_for(&basis("u", 1), touched.clone())
                .is_everything(),
            "a tally no pass over everything has built says nothing"
        );
        tally.record(&basis("u", 1), &Scope::everything(), &Plan::default());
        assert_eq!(
            tally.scope_for(&basis("u", 1), touched.clone()),
            touched,
            "the same rule and generation: the partial pass stands"
        );
        assert!(
            tally
                .scope_for(&basis("u", 2), touched.clone())
                .is_everything(),
            "a changed spec"
        );
        assert!(
            tally
                .scope_for(&basis("v", 1), touched.clone())
                .is_everything(),
            "a rule recreated under the same name"
        );
        // A partial pass does not make a tally describe a new generation.
        tally.record(&basis("u", 2), &touched, &Plan::default());
        assert!(tally.scope_for(&basis("u", 2), touched).is_everything());
    }
}
