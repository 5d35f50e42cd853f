//! What changed for a rule since its last pass, so that the pass looks only
//! at the copies the change concerns: a new namespace costs the copies in
//! it, a changed source the copies of its name, a changed copy itself; never
//! a walk over every copy of the rule. Pure data, no I/O.

use crate::core::naming::Naming;
use std::collections::{HashMap, HashSet};

/// One change, as the watches see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Touch {
    /// The rule itself, a relist, a resync: everything.
    All,
    /// A namespace was created, deleted or changed its labels or consent.
    Namespace(String),
    /// A source of this name changed, appeared or went (in any source namespace).
    Source(String),
    /// The copy at `(namespace, name)` changed or went.
    Copy(String, String),
    /// A backoff ran out: the copies the rule's passes left unwritten.
    Retry,
    /// The rule's status changed, or its status is due: no copy to look at.
    Nothing,
}

/// Past this many entries a pass over everything is cheaper to keep track of.
const MOST_ENTRIES: usize = 512;

/// The part of a rule a pass must look at.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Scope {
    all: bool,
    namespaces: HashSet<String>,
    names: HashSet<String>,
    /// Namespace → copy names.
    copies: HashMap<String, HashSet<String>>,
    entries: usize,
    /// The copies left unwritten by earlier passes are in scope too.
    retry: bool,
}

impl Scope {
    pub(crate) fn everything() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    pub(crate) fn is_everything(&self) -> bool {
        self.all
    }

    /// Nothing touched (a pass with this scope has nothing to look at).
    pub(crate) fn is_empty(&self) -> bool {
        !self.all && !self.retry && self.entries == 0
    }

    /// Whether the copies left unwritten by earlier passes are in scope.
    pub(crate) fn retries(&self) -> bool {
        self.retry
    }

    pub(crate) fn add(&mut self, touch: Touch) {
        if self.all {
            return;
        }
        let added = match touch {
            Touch::All => {
                self.all = true;
                false
            }
            Touch::Namespace(namespace) => self.namespaces.insert(namespace),
            Touch::Source(name) => self.names.insert(name),
            Touch::Copy(namespace, name) => self.copies.entry(namespace).or_default().insert(name),
            Touch::Retry => {
                self.retry = true;
                false
            }
            Touch::Nothing => false,
        };
        if added {
            self.entries += 1;
        }
        if self.entries > MOST_ENTRIES {
            self.all = true;
        }
        if self.all {
            self.namespaces = HashSet::new();
            self.names = HashSet::new();
            self.copies = HashMap::new();
            self.entries = 0;
            self.retry = false;
        }
    }

    /// Whether every copy in `namespace` is in scope.
    pub(crate) fn covers_namespace(&self, namespace: &str) -> bool {
        self.all || self.namespaces.contains(namespace)
    }

    /// Whether the copy `(namespace, name)` is in scope.
    pub(crate) fn covers(&self, namespace: &str, name: &str) -> bool {
        self.all
            || self.namespaces.contains(namespace)
            || self.names.contains(name)
            || self
                .copies
                .get(namespace)
                .is_some_and(|names| names.contains(name))
    }

    /// Namespaces touched as a whole.
    pub(crate) fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.iter().map(String::as_str)
    }

    /// Names touched in every namespace: the copies' names of the sources
    /// touched (by their own names until [`Scope::named_by`] says which
    /// names their copies take).
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// This scope with the names of the sources touched turned into the
    /// names of their copies under `naming`: what a rule's pass and its
    /// tally look at is places, named as its copies are.
    pub(crate) fn named_by(mut self, naming: &Naming) -> Self {
        if !naming.is_same() {
            self.names = self
                .names
                .iter()
                .map(|source| naming.name_unchecked(source).into_owned())
                .collect();
        }
        self
    }

    /// Copies touched one by one: `(namespace, name)`.
    pub(crate) fn copies(&self) -> impl Iterator<Item = (&str, &str)> {
        self.copies
            .iter()
            .flat_map(|(ns, names)| names.iter().map(move |n| (ns.as_str(), n.as_str())))
    }

    /// Names touched in `namespace` one by one (besides [`Scope::names`]).
    pub(crate) fn copies_in(&self, namespace: &str) -> impl Iterator<Item = &str> {
        self.copies
            .get(namespace)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    pub(crate) fn merge(&mut self, other: Scope) {
        if other.all {
            self.add(Touch::All);
        }
        if other.retry {
            self.add(Touch::Retry);
        }
        for namespace in other.namespaces {
            self.add(Touch::Namespace(namespace));
        }
        for name in other.names {
            self.add(Touch::Source(name));
        }
        for (namespace, names) in other.copies {
            for name in names {
                self.add(Touch::Copy(namespace.clone(), name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_add_up_and_everything_absorbs_them() {
        let mut scope = Scope::default();
        assert!(scope.is_empty());
        scope.add(Touch::Namespace("a".into()));
        scope.add(Touch::Source("cm".into()));
        scope.add(Touch::Copy("b".into(), "other".into()));
        assert!(scope.covers("a", "anything"), "the whole namespace a");
        assert!(scope.covers("z", "cm"), "source cm everywhere");
        assert!(scope.covers("b", "other"));
        assert!(!scope.covers("b", "third"));
        assert!(scope.covers_namespace("a") && !scope.covers_namespace("b"));
        scope.add(Touch::All);
        assert!(scope.is_everything() && scope.covers("q", "r"));
        assert_eq!(
            scope.namespaces().count(),
            0,
            "nothing kept beside everything"
        );
    }

    #[test]
    fn too_many_touches_become_everything() {
        let mut scope = Scope::default();
        for i in 0..=MOST_ENTRIES {
            scope.add(Touch::Copy("ns".into(), format!("c{i}")));
        }
        assert!(scope.is_everything());
    }

    #[test]
    fn a_retry_is_something_to_do_and_everything_covers_it() {
        let mut scope = Scope::default();
        scope.add(Touch::Retry);
        assert!(!scope.is_empty() && scope.retries());
        assert!(!scope.covers("a", "b"), "a retry names no copy by itself");
        scope.add(Touch::All);
        assert!(!scope.retries() && scope.is_everything());
    }

    #[test]
    fn merging_keeps_both() {
        let mut a = Scope::default();
        a.add(Touch::Source("x".into()));
        let mut b = Scope::default();
        b.add(Touch::Copy("n".into(), "y".into()));
        a.merge(b);
        assert!(a.covers("any", "x") && a.covers("n", "y") && !a.covers("n", "z"));
        let mut c = Scope::default();
        c.merge(Scope::everything());
        assert!(c.is_everything());
    }
}
