//! Shared values for the caches: the copies of one source in 2,000
//! namespaces carry the same name, rule UID, rule and source references and
//! the same set of metadata hashes, and every copy in a namespace the same
//! namespace name. Each is held once and referenced, so a copy costs a few
//! pointers instead of a dozen small allocations.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

/// A set of shared values; [`Interner::sweep`] lets go of those nobody
/// else holds any more, so names of deleted namespaces do not accumulate.
pub(crate) struct Interner<T: ?Sized> {
    values: Mutex<HashSet<Arc<T>>>,
}

impl<T: ?Sized + Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Self {
            values: Mutex::default(),
        }
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// The shared value equal to `value`.
    pub(crate) fn get<Q>(&self, value: &Q) -> Arc<T>
    where
        Arc<T>: Borrow<Q> + for<'a> From<&'a Q>,
        Q: ?Sized + Hash + Eq,
    {
        let mut values = crate::sync::lock(&self.values);
        if let Some(held) = values.get(value) {
            return held.clone();
        }
        let shared: Arc<T> = Arc::from(value);
        values.insert(shared.clone());
        shared
    }

    /// Drop the values only this set holds; returns how many remain.
    pub(crate) fn sweep(&self) -> usize {
        let mut values = crate::sync::lock(&self.values);
        values.retain(|v| Arc::strong_count(v) > 1);
        values.shrink_to_fit();
        values.len()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        crate::sync::lock(&self.values).len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Process-wide on purpose: a value interned by one cluster's views is the
/// same value in another's, and nothing here is state a decision reads (an
/// interned string equals the string it stands for).
static STRINGS: LazyLock<Interner<str>> = LazyLock::new(Interner::default);
static HASH_SETS: LazyLock<Interner<[u64]>> = LazyLock::new(Interner::default);

/// The shared copy of a string (a name, a namespace, a reference).
pub(crate) fn string(value: &str) -> Arc<str> {
    STRINGS.get(value)
}

/// The shared copy of a sorted list of hashes.
pub(crate) fn hashes(value: &[u64]) -> Arc<[u64]> {
    HASH_SETS.get(value)
}

/// Let go of every shared value that no cache holds any more.
pub(crate) fn sweep() {
    STRINGS.sweep();
    HASH_SETS.sweep();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_held_once_and_freed_when_unused() {
        let interner: Interner<str> = Interner::default();
        let a = interner.get("team-a");
        let b = interner.get(&String::from("team-a"));
        assert!(Arc::ptr_eq(&a, &b));
        let other = interner.get("team-b");
        assert_eq!(interner.len(), 2);
        drop(other);
        assert_eq!(interner.sweep(), 1, "team-b is held by nobody");
        drop((a, b));
        assert_eq!(interner.sweep(), 0);
        assert!(interner.is_empty());
    }

    #[test]
    fn hash_lists_are_shared() {
        let interner: Interner<[u64]> = Interner::default();
        let a = interner.get(&[1u64, 2, 3][..]);
        let b = interner.get(&vec![1u64, 2, 3][..]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &interner.get(&[1u64, 2][..])));
    }
}
