//! What a rule's pass found in one cluster, counted the same way at home
//! and in every member, and how the rule's status adds the clusters up.

use crate::api::rule::{ConflictEntry, ContestedEntry};
use crate::core::backoff::{Failure, FailureClass};

/// A rule in one cluster after its latest pass there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterReport {
    /// Namespaces there that receive copies.
    pub(crate) target_namespaces: u32,
    /// Copies there in place and up to date.
    pub(crate) copies: u32,
    /// Copies there handed over under `syncPolicy: CreateOnly`.
    pub(crate) create_only_copies: u32,
    /// Copies there that the rule adopted (`spec.adopt`).
    pub(crate) adopted_copies: u32,
    /// Places there held by something else.
    pub(crate) conflicts: Vec<ConflictEntry>,
    /// Copies there another writer keeps changing back.
    pub(crate) contested: Vec<ContestedEntry>,
    /// `(reason, message)` when the rule is not synced there.
    pub(crate) problem: Option<(String, String)>,
    /// For a staged rule: what its copies there may hold as rolled out
    /// after the pass, as the status keeps it.
    pub(crate) rolled_out: Option<std::collections::BTreeMap<String, String>>,
    /// For a staged rule: what the pass found of each source's new content.
    pub(crate) rollout: Option<crate::core::rollout::SiteFacts>,
    /// For a staged rule: writes its stages held back there.
    pub(crate) held: u32,
}

/// The problem of a pass whose writes failed (this pass, or before and
/// still waiting out their backoff): how many, the first in the API
/// server's words, and when it is tried again.
pub(crate) fn sync_failed<'a>(
    mut failing: impl Iterator<Item = &'a (String, Failure)>,
) -> Option<(String, String)> {
    let (what, first) = failing.next()?;
    let reason = match first.class {
        FailureClass::ImpersonationRefused => IMPERSONATION_REFUSED,
        _ => "SyncFailed",
    };
    Some((
        reason.to_owned(),
        format!(
            "{} copies could not be written; first: {what}: {}; {}",
            1 + failing.count(),
            first.message,
            retry_note(first.class)
        ),
    ))
}

/// The Ready reason of a rule whose writes the operator may not send as
/// the ServiceAccount the rule names (or its namespace's default).
pub(crate) const IMPERSONATION_REFUSED: &str = "ImpersonationForbidden";

/// When a failed write is tried again, for status and Event messages.
pub(crate) fn retry_note(class: FailureClass) -> &'static str {
    match class {
        FailureClass::Invalid => {
            "not written again until the source or the rule changes (or after an hour)"
        }
        _ => "retrying with backoff",
    }
}

/// Every cluster's report added up, for the rule's status: each count
/// covers the home cluster and every member listed; each conflict and
/// contested copy in a member names it. The problem is the home cluster's
/// (the members' are said in `status.clusters`).
pub(crate) fn fold<'a>(
    home: &ClusterReport,
    members: impl IntoIterator<Item = (&'a str, &'a ClusterReport)>,
) -> ClusterReport {
    let mut total = home.clone();
    for (name, report) in members {
        total.target_namespaces += report.target_namespaces;
        total.copies += report.copies;
        total.create_only_copies += report.create_only_copies;
        total.adopted_copies += report.adopted_copies;
        total
            .conflicts
            .extend(report.conflicts.iter().map(|c| ConflictEntry {
                cluster: Some(name.to_owned()),
                ..c.clone()
            }));
        total
            .contested
            .extend(report.contested.iter().map(|c| ContestedEntry {
                cluster: Some(name.to_owned()),
                ..c.clone()
            }));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict(namespace: &str) -> ConflictEntry {
        ConflictEntry {
            cluster: None,
            namespace: namespace.to_owned(),
            name: "ca".to_owned(),
            reason: "held by something else".to_owned(),
        }
    }

    fn contested(namespace: &str) -> ContestedEntry {
        ContestedEntry {
            cluster: None,
            namespace: namespace.to_owned(),
            name: "ca".to_owned(),
            writer: "kubectl-edit".to_owned(),
        }
    }

    fn report(copies: u32, conflicts: &[&str], contest: &[&str]) -> ClusterReport {
        ClusterReport {
            target_namespaces: copies + conflicts.len() as u32,
            copies,
            create_only_copies: 1,
            adopted_copies: 2,
            conflicts: conflicts.iter().map(|ns| conflict(ns)).collect(),
            contested: contest.iter().map(|ns| contested(ns)).collect(),
            problem: None,
            rolled_out: None,
            rollout: None,
            held: 0,
        }
    }

    #[test]
    fn every_count_covers_home_and_each_member() {
        let home = report(3, &["a"], &[]);
        let a = report(2, &["b", "c"], &["d"]);
        let b = report(4, &[], &["e"]);
        let total = fold(&home, [("a", &a), ("b", &b)]);
        assert_eq!(total.copies, 9);
        assert_eq!(total.target_namespaces, 12);
        assert_eq!(total.create_only_copies, 3);
        assert_eq!(total.adopted_copies, 6);
        assert_eq!(total.conflicts.len(), 3);
        assert_eq!(total.contested.len(), 2);
    }

    #[test]
    fn what_is_in_a_member_names_it_and_home_names_none() {
        let home = report(1, &["x"], &["y"]);
        let a = report(1, &["x"], &["y"]);
        let total = fold(&home, [("a", &a)]);
        let clusters: Vec<Option<&str>> = total
            .conflicts
            .iter()
            .map(|c| c.cluster.as_deref())
            .collect();
        assert_eq!(clusters, [None, Some("a")]);
        assert_eq!(total.contested[1].cluster.as_deref(), Some("a"));
        assert_eq!(total.contested[0].cluster, None);
    }

    #[test]
    fn the_problem_is_the_home_clusters() {
        let home = report(1, &[], &[]);
        let mut a = report(0, &[], &[]);
        a.problem = Some(("SyncFailed".into(), "refused".into()));
        assert_eq!(fold(&home, [("a", &a)]).problem, None);
    }

    #[test]
    fn sync_failed_counts_every_failure_and_words_the_first() {
        let failure = |class, message: &str| Failure {
            class,
            message: message.to_owned(),
            retry_after: None,
        };
        let failing = [
            (
                "ConfigMap a/ca".to_owned(),
                failure(FailureClass::Refused, "forbidden"),
            ),
            (
                "ConfigMap b/ca".to_owned(),
                failure(FailureClass::Invalid, "too long"),
            ),
        ];
        let (reason, message) = sync_failed(failing.iter()).expect("a problem");
        assert_eq!(reason, "SyncFailed");
        assert_eq!(
            message,
            "2 copies could not be written; first: ConfigMap a/ca: forbidden; retrying with backoff"
        );
        assert_eq!(sync_failed(failing[1..].iter()).map(|p| p.1), Some(
            "1 copies could not be written; first: ConfigMap b/ca: too long; not written again until the source or the rule changes (or after an hour)".to_owned()
        ));
        assert_eq!(sync_failed(std::iter::empty()), None);
    }
}
