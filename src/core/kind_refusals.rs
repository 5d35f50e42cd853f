//! Refusals of kinds a rule names (unknown, cluster-scoped, not allowed),
//! remembered for their retry interval: a namespace event queues every
//! unresolved rule, and each must not cost an API discovery lookup.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::core::resolve::InvalidRule;

/// How long a refusal without a retry interval of its own stands.
const REFUSAL_STANDS: Duration = Duration::from_secs(60);
/// Refusals remembered at most: beyond, the oldest are forgotten.
const MAX_REFUSALS: usize = 1024;

/// A refusal: until when it stands, what it says, its retry interval.
type Refusal = (Instant, InvalidRule, Option<Duration>);

/// Refusals by `group/version/kind`, until they stand no more.
#[derive(Default)]
pub(crate) struct KindRefusals(BTreeMap<String, Refusal>);

impl KindRefusals {
    /// The refusal standing for `key` at `now`, with the time left of its
    /// retry interval (`None`: it names no retry).
    pub(crate) fn standing(
        &self,
        key: &str,
        now: Instant,
    ) -> Option<(InvalidRule, Option<Duration>)> {
        let (until, invalid, again) = self.0.get(key)?;
        (now < *until).then(|| {
            (
                invalid.clone(),
                again.map(|_| until.saturating_duration_since(now)),
            )
        })
    }

    pub(crate) fn remember(
        &mut self,
        key: String,
        invalid: &InvalidRule,
        again: Option<Duration>,
        now: Instant,
    ) {
        self.0.retain(|_, (until, _, _)| *until > now);
        if self.0.len() >= MAX_REFUSALS {
            self.0.clear();
        }
        self.0.insert(
            key,
            (
                now + again.unwrap_or(REFUSAL_STANDS),
                invalid.clone(),
                again,
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stands_for_its_retry_interval_and_no_longer() {
        let unknown = InvalidRule {
            reason: "UnknownKind",
            message: "the API server serves no kind Nope".into(),
        };
        let retry = Duration::from_secs(30);
        let start = Instant::now();
        let mut refusals = KindRefusals::default();
        refusals.remember("example.com/v1/Nope".into(), &unknown, Some(retry), start);
        let later = start + Duration::from_secs(10);
        assert_eq!(
            refusals.standing("example.com/v1/Nope", later),
            Some((unknown.clone(), Some(Duration::from_secs(20))))
        );
        assert_eq!(
            refusals.standing("example.com/v1/Nope", start + retry),
            None
        );
        assert_eq!(refusals.standing("example.com/v2/Nope", later), None);
        // A retry interval of nothing: looked at again at once.
        refusals.remember(
            "example.com/v1/Gone".into(),
            &unknown,
            Some(Duration::ZERO),
            start,
        );
        assert_eq!(refusals.standing("example.com/v1/Gone", start), None);
        // No retry interval of its own: it stands a while, and says no retry.
        let cluster_role = "rbac.authorization.k8s.io/v1/ClusterRole";
        refusals.remember(cluster_role.into(), &unknown, None, start);
        assert_eq!(
            refusals.standing(cluster_role, start + Duration::from_secs(59)),
            Some((unknown.clone(), None))
        );
        assert_eq!(
            refusals.standing(cluster_role, start + REFUSAL_STANDS),
            None
        );
    }

    #[test]
    fn too_many_refusals_are_forgotten_rather_than_kept() {
        let refused = InvalidRule::invalid("no");
        let now = Instant::now();
        let mut refusals = KindRefusals::default();
        for n in 0..=MAX_REFUSALS {
            refusals.remember(format!("g/v1/K{n}"), &refused, None, now);
        }
        assert!(refusals.0.len() <= MAX_REFUSALS);
        assert!(
            refusals
                .standing(&format!("g/v1/K{MAX_REFUSALS}"), now)
                .is_some()
        );
    }
}
