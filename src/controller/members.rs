//! Member clusters: a site per member of the inventory, started when the
//! member appears, restarted when its credentials change, and kept after
//! it leaves the inventory until the copies it holds are deleted.
//!
//! Each member runs on its own: its own clients (one HTTP/2 connection for
//! watches and reads, its share of the write connections), its own
//! namespace and copy watches, queue, workers, backoffs and request
//! deadlines, and a probe that tells whether its API server answers. A
//! member that is down, slow or refusing holds up only its own passes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::info;

use crate::api::kinds::Kind;
use crate::api::rule::{ClusterStatus, RuleKey};
use crate::controller::site::Site;
use crate::core::report::ClusterReport;
use crate::core::resolve::ResolvedRule;
use crate::core::status::{Reachability, Unanswered, cluster_entry, not_ready};
use crate::ops::metrics::Metrics;
use crate::sync::{lock, read, write};

/// How long the deletion of copies waits for an unreachable member: a
/// deleted rule then lets go and leaves that member's copies to its
/// collection of orphans (which runs when the member answers again), and a
/// member that left the inventory is disconnected with its copies left
/// there.
pub(crate) const MEMBER_CLEANUP_GIVES_UP_AFTER: std::time::Duration =
    std::time::Duration::from_secs(600);

/// Whether a member's API server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Not asked yet, or its first answer is on its way.
    Connecting,
    Reachable,
    /// Its last probe failed: in what words, since when it has not
    /// answered, and why.
    Unreachable {
        message: String,
        since: Instant,
        why: Unanswered,
    },
}

impl Reach {
    /// As a rule's status speaks of it.
    pub(crate) fn reachability(&self) -> Reachability<'_> {
        match self {
            Reach::Connecting => Reachability::Connecting,
            Reach::Reachable => Reachability::Reachable,
            Reach::Unreachable { message, why, .. } => {
                Reachability::Unreachable { message, why: *why }
            }
        }
    }

    /// The reason a rule's status gives for a member in this state.
    pub(crate) fn reason(&self) -> &'static str {
        self.reachability().reason()
    }
}

pub(crate) struct Member {
    pub(crate) site: Arc<Site>,
    /// The member's labels in the inventory, for rules' cluster selectors.
    pub(crate) labels: RwLock<BTreeMap<String, String>>,
    /// What identifies its credentials: a change restarts the member.
    pub(crate) fingerprint: u64,
    pub(crate) reach: Mutex<Reach>,
    pub(crate) reports: Mutex<HashMap<RuleKey, ClusterReport>>,
    /// Where its reports' totals are said (`copyrator_member_copies`).
    pub(crate) metrics: Arc<Metrics>,
    /// Gone from the inventory: its copies are deleted, then it goes too.
    pub(crate) leaving: AtomicBool,
    /// Its watches, workers and probe, aborted when it goes.
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Where its credentials come from a plugin: that plugin's.
    pub(crate) plugin: Option<Arc<crate::cluster::credential_plugin::PluginCredentials>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

impl Member {
    pub(crate) fn name(&self) -> &str {
        self.site.name.member().unwrap_or_default()
    }

    pub(crate) fn is_reachable(&self) -> bool {
        *lock(&self.reach) == Reach::Reachable
    }

    /// How long it has not answered (zero while it does, or is connecting).
    pub(crate) fn unreachable_for(&self) -> std::time::Duration {
        match &*lock(&self.reach) {
            Reach::Unreachable { since, .. } => since.elapsed(),
            _ => std::time::Duration::ZERO,
        }
    }

    /// Its last probe failed (no answer, or its credentials refused).
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(*lock(&self.reach), Reach::Unreachable { .. })
    }

    pub(crate) fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    /// Whether the member holds copies of the rule of `uid`, of any kind.
    pub(crate) fn holds_copies_of(&self, uid: &str) -> bool {
        Kind::all().any(|kind| read(self.site.cluster.views.copies(kind)).count_owned_by(uid) > 0)
    }

    /// Whether its namespaces and copies are listed: before that, no pass
    /// runs there (a pass on a half-listed view would prune what it has
    /// not seen).
    pub(crate) fn is_synced(&self) -> bool {
        self.site.cluster.views.synced.all()
    }

    /// Take a rule's report; returns whether it changed. The member's
    /// gauges of copies and conflicts follow, set under the same lock, so
    /// that two passes at once cannot leave an older total behind.
    pub(crate) fn report(&self, key: &RuleKey, report: Option<ClusterReport>) -> bool {
        let mut reports = lock(&self.reports);
        let changed = match report {
            Some(report) => reports.insert(key.clone(), report.clone()) != Some(report),
            None => reports.remove(key).is_some(),
        };
        if changed {
            let (copies, conflicts) = reports.values().fold((0, 0), |(copies, conflicts), r| {
                (
                    copies + u64::from(r.copies),
                    conflicts + r.conflicts.len() as u64,
                )
            });
            self.metrics.member_counts(self.name(), copies, conflicts);
        }
        changed
    }
}

/// An entry of the inventory that cannot be used: its labels (rules may
/// select it) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnusableMember {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) reason: String,
    pub(crate) message: String,
}

/// The inventory as last read: the members started, and the entries that
/// cannot be used (with why), by name.
#[derive(Default)]
pub(crate) struct Members {
    pub(crate) started: RwLock<BTreeMap<String, Arc<Member>>>,
    pub(crate) unusable: RwLock<BTreeMap<String, UnusableMember>>,
}

impl Members {
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Member>> {
        read(&self.started).get(name).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Arc<Member>> {
        read(&self.started).values().cloned().collect()
    }

    /// A member gone from the inventory stays until it holds no copy of a
    /// rule (`live_rule_uids`); then it goes. One that has not answered for
    /// longer than `give_up_after` goes too: its copies stay there, and a
    /// warning says so. Returns the names of those that went.
    pub(crate) fn retire_left(
        &self,
        live_rule_uids: &[String],
        give_up_after: std::time::Duration,
    ) -> Vec<String> {
        let mut gone = Vec::new();
        write(&self.started).retain(|name, member| {
            if !member.is_leaving() {
                return true;
            }
            if !live_rule_uids.iter().any(|uid| member.holds_copies_of(uid)) {
                info!(
                    member = name.as_str(),
                    "member cluster left the inventory and holds no copies: disconnected"
                );
                gone.push(name.clone());
                return false;
            }
            let unreachable_for = member.unreachable_for();
            if unreachable_for > give_up_after {
                tracing::warn!(
                    member = name.as_str(),
                    unreachable_seconds = unreachable_for.as_secs(),
                    "member cluster left the inventory and has not answered since: disconnected, its copies there stay"
                );
                gone.push(name.clone());
                return false;
            }
            true
        });
        gone
    }

    /// Stop every member (shutdown): their tasks are aborted as they go.
    pub(crate) fn stop_all(&self) {
        write(&self.started).clear();
    }
}

/// How a rule stands in each member its targets select, for its status:
/// the members started (with their latest reports, which the status adds
/// up), the inventory's entries that cannot be used, and names found
/// nowhere in the inventory.
pub(crate) fn statuses(
    members: &Members,
    resolved: &ResolvedRule,
) -> Vec<(ClusterStatus, Option<ClusterReport>)> {
    let targets = &resolved.clusters;
    let mut statuses = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for member in members.all() {
        if member.is_leaving() || !targets.selects(member.name(), &read(&member.labels)) {
            continue;
        }
        seen.insert(member.name().to_owned());
        let report = lock(&member.reports).get(&resolved.key).cloned();
        let status = cluster_entry(
            member.name(),
            &lock(&member.reach).reachability(),
            report.as_ref(),
        );
        statuses.push((status, report));
    }
    for (name, entry) in read(&members.unusable).iter() {
        if targets.selects(name, &entry.labels) && seen.insert(name.clone()) {
            statuses.push((not_ready(name, &entry.reason, entry.message.clone()), None));
        }
    }
    for name in &targets.names {
        if seen.insert(name.clone()) {
            statuses.push((
                not_ready(
                name,
                "ClusterNotFound",
                format!(
                    "no cluster Secret or ClusterProfile in the operator's namespace names the member {name:?}"
                ),
                ),
                None,
            ));
        }
    }
    statuses.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    statuses
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::{copy, home, member, resolved, rule};
    use serde_json::json;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_member_that_left_stays_while_it_holds_copies_unless_it_stopped_answering() {
        let (shared, _) = home();
        let rule = resolved(&rule("uid-1", json!({})));
        let (holding, _) = member(&shared, "a", &["team-a"]);
        copy(&holding.site, &rule, "team-a", "settings").await;
        let (empty, _) = member(&shared, "b", &["team-a"]);
        let (staying, _) = member(&shared, "c", &["team-a"]);
        for m in [&holding, &empty] {
            m.leaving.store(true, Ordering::Release);
        }
        let live = ["uid-1".to_owned()];
        let give_up = Duration::from_secs(600);
        assert_eq!(shared.members.retire_left(&live, give_up), ["b"]);
        assert_eq!(
            shared.members.retire_left(&live, give_up),
            Vec::<String>::new()
        );
        // Its copies belong to no live rule any more: it goes.
        assert_eq!(shared.members.retire_left(&[], give_up), ["a"]);
        let (silent, _) = member(&shared, "d", &["team-a"]);
        copy(&silent.site, &rule, "team-a", "settings").await;
        silent.leaving.store(true, Ordering::Release);
        *lock(&silent.reach) = Reach::Unreachable {
            message: "connection refused".to_owned(),
            since: Instant::now(),
            why: Unanswered::NoAnswer,
        };
        assert_eq!(
            shared.members.retire_left(&live, give_up),
            Vec::<String>::new()
        );
        tokio::time::advance(Duration::from_secs(601)).await;
        assert_eq!(shared.members.retire_left(&live, give_up), ["d"]);
        let left: Vec<String> = read(&shared.members.started).keys().cloned().collect();
        assert_eq!(left, ["c"]);
        assert!(!staying.is_leaving());
    }

    #[tokio::test]
    async fn a_rule_hears_of_every_member_it_selects_found_or_not() {
        let (shared, _) = home();
        let (a, _) = member(&shared, "a", &[]);
        *lock(&a.reach) = Reach::Connecting;
        member(&shared, "b", &[]);
        member(&shared, "unselected", &[]);
        write(&shared.members.unusable).insert(
            "c".to_owned(),
            UnusableMember {
                labels: BTreeMap::new(),
                reason: "InsecureConnection".to_owned(),
                message: "its server is http://".to_owned(),
            },
        );
        let names = json!(["c", "b", "a", "nowhere"]);
        let rule = resolved(&rule(
            "uid-1",
            json!({
                "targets": {"clusters": {"names": names, "local": false}}
            }),
        ));
        let said: Vec<(String, String)> = statuses(&shared.members, &rule)
            .into_iter()
            .map(|(status, _)| {
                let message = status.message.unwrap_or_default();
                (
                    status.name,
                    format!("{}: {message}", status.reason.unwrap_or_default()),
                )
            })
            .collect();
        let reason = |name: &str| {
            said.iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.as_str())
        };
        let order: Vec<&str> = said.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(order, ["a", "b", "c", "nowhere"]);
        let reason = |name: &str| reason(name).unwrap_or_default();
        assert!(reason("a").contains("connecting"), "{}", reason("a"));
        assert!(!reason("b").contains("connecting"), "{}", reason("b"));
        assert_eq!(reason("c"), "InsecureConnection: its server is http://");
        assert!(
            reason("nowhere").starts_with("ClusterNotFound: "),
            "{}",
            reason("nowhere")
        );
    }
}
