//! What a rule's passes left unsettled: the copies not written yet and
//! the conflicts, by place. A pass that looks at part of a rule replaces
//! only that part, so the rule's counts stay exact without a walk over
//! every copy. Pure data, no I/O.

use std::collections::HashMap;

use crate::plan::{Action, Plan};
use crate::scope::Scope;

/// Why a place that should hold a copy does not (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsettled {
    /// Something else is there; the copy is skipped.
    Conflict(String),
    /// The copy is to be created or updated and has not been.
    Unwritten,
    /// The copy is to be deleted and has not been.
    UnwrittenDelete,
}

/// `(namespace, name)` of a copy.
type Place = (String, String);

#[derive(Clone, Debug, Default)]
pub struct Tally {
    places: HashMap<Place, Unsettled>,
    conflicts: usize,
    unwritten: usize,
    unwritten_deletes: usize,
}

impl Tally {
    /// Forget what `scope` covers: the pass that looks at it says anew.
    pub fn clear(&mut self, scope: &Scope) {
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
    pub fn record(&mut self, scope: &Scope, plan: &Plan) {
        self.clear(scope);
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
                Action::Delete { .. } => Unsettled::UnwrittenDelete,
                _ => Unsettled::Unwritten,
            };
            self.set(namespace, name, state);
        }
    }

    pub fn set(&mut self, namespace: &str, name: &str, state: Unsettled) {
        self.count(&state, 1);
        if let Some(previous) = self
            .places
            .insert((namespace.to_owned(), name.to_owned()), state)
        {
            self.count(&previous, -1);
        }
    }

    /// The copy at this place is right now.
    pub fn settle(&mut self, namespace: &str, name: &str) {
        if let Some(previous) = self.places.remove(&(namespace.to_owned(), name.to_owned())) {
            self.count(&previous, -1);
        }
    }

    /// Places with a conflict, and its reason.
    pub fn conflicts(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.places
            .iter()
            .filter_map(|((ns, name), state)| match state {
                Unsettled::Conflict(reason) => Some((ns.as_str(), name.as_str(), reason.as_str())),
                _ => None,
            })
    }

    /// Every unsettled place (for a pass that retries them).
    pub fn places(&self) -> impl Iterator<Item = (&str, &str)> {
        self.places
            .keys()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
    }

    /// Whether a write at `(namespace, name)` is still to be made.
    pub fn is_unwritten(&self, namespace: &str, name: &str) -> bool {
        matches!(
            self.places.get(&(namespace.to_owned(), name.to_owned())),
            Some(Unsettled::Unwritten | Unsettled::UnwrittenDelete)
        )
    }

    /// Whether `(namespace, name)` is a conflict of this rule.
    pub fn is_conflict(&self, namespace: &str, name: &str) -> bool {
        self.conflicts > 0
            && matches!(
                self.places.get(&(namespace.to_owned(), name.to_owned())),
                Some(Unsettled::Conflict(_))
            )
    }

    /// Whether any write is still to be made.
    pub fn has_unwritten(&self) -> bool {
        self.unwritten + self.unwritten_deletes > 0
    }

    pub fn conflict_count(&self) -> usize {
        self.conflicts
    }

    /// Copies to create or update that are not written yet.
    pub fn unwritten_count(&self) -> usize {
        self.unwritten
    }

    /// How many copies are in place, of `places` that should hold one
    /// (conflicts included).
    pub fn in_place(&self, places: u32) -> u32 {
        (places as usize).saturating_sub(self.conflicts + self.unwritten) as u32
    }

    pub fn is_empty(&self) -> bool {
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
    use crate::scope::Touch;

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
}
