//! Random spread for retries, so that many waiting copies, rules or
//! watches do not all come back in the same instant.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};

/// A fraction in [0, 1), different on each call (a fresh random hasher
/// keyed by `seed`); no random-number crate is needed for a spread.
pub(crate) fn fraction(seed: &impl Hash) -> f64 {
    (RandomState::new().hash_one(seed) % 10_000) as f64 / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_stay_in_range_and_differ() {
        let values: Vec<f64> = (0..200).map(|_| fraction(&7_u32)).collect();
        assert!(values.iter().all(|f| (0.0..1.0).contains(f)));
        let first = values[0];
        assert!(
            values.iter().any(|f| (*f - first).abs() > f64::EPSILON),
            "one seed must not give one value"
        );
    }
}
