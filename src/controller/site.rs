//! A site: one cluster where copies live, the home cluster or a member.
//! Its API server's unit (`cluster::context::Cluster`: views, watches,
//! writer), the passes queued for it, and what each rule's passes there
//! remember (tally, conflicts, backoffs). Each site has its own queue and
//! workers, so that a member that is down, slow or refusing never delays
//! the passes of another site.
//!
//! Its locks take the places of the controller's `memory` and `backoffs`
//! in the lock order (`controller::state::Shared`); no two sites' locks
//! are ever held at once. What a rule remembers once, whatever the sites,
//! is `Shared::notes` ([`RuleNotes`]).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::api::rule::{ConflictEntry, RuleKey};
use crate::cluster::context::Cluster;
use crate::controller::queue::Queue;
use crate::core::backoff::Backoffs;
use crate::ops::metrics::Metrics;

/// Which cluster a site is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SiteName {
    /// The cluster the operator runs in, which holds the rules and sources.
    Home,
    /// A member cluster of the inventory, by its name there.
    Member(String),
}

impl SiteName {
    pub(crate) fn member(&self) -> Option<&str> {
        match self {
            SiteName::Home => None,
            SiteName::Member(name) => Some(name),
        }
    }
}

impl fmt::Display for SiteName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SiteName::Home => f.write_str("home"),
            SiteName::Member(name) => f.write_str(name),
        }
    }
}

/// What a rule's passes remember in one site (the home cluster or a
/// member) between passes: the same fields wherever they run.
#[derive(Default)]
pub(crate) struct RuleMemory {
    /// Targets that hold a foreign object of the copy's name.
    pub(crate) known_conflicts: crate::core::foreign::KnownConflicts,
    /// Consecutive failed passes here, for the retry backoff.
    pub(crate) failures: u32,
    /// A pass found the rule too costly to plan
    /// ([`crate::core::plan::Plan::too_costly`]); until a pass over
    /// everything plans it within the budget, every pass says so.
    pub(crate) too_costly: bool,
    /// What the rule's passes left unsettled, place by place.
    pub(crate) tally: crate::core::tally::Tally,
    /// Restarting the rule's consumers was refused, and said so.
    pub(crate) restart_refused: bool,
    /// For `rollout.restartConsumers`: the data keys' digests of each
    /// source (`namespace/name`) and content (payload hash) its copies
    /// held when last written or seen in place.
    pub(crate) consumed: HashMap<(String, u64), Arc<crate::core::consumers::KeyDigests>>,
    /// For `rollout.stages`: how far each source's new content has gone,
    /// and what was last seen of each stage's consumers' availability
    /// (by source name and stage: the content, and the workloads not available).
    pub(crate) rollouts: crate::core::rollout::Rollouts,
    pub(crate) availability: HashMap<(String, usize), (u64, Vec<String>)>,
    /// Changed copies (by namespace) whose consumers are tried again.
    pub(crate) pending_restarts: Vec<(String, crate::core::consumers::Entry)>,
    /// Passes in a row that left consumers to try again.
    pub(crate) restart_attempts: u32,
}

/// What a rule remembers once, at home, of what it said: for its status,
/// its Events, its log line and the home cluster's gauges.
#[derive(Default)]
pub(crate) struct RuleNotes {
    /// Conflicts (in every cluster) already announced by an Event.
    pub(crate) announced: HashSet<ConflictEntry>,
    /// Sources refused for their type, already announced by an Event.
    pub(crate) announced_refusals: HashSet<ConflictEntry>,
    /// When a status that only brings new counts is written.
    pub(crate) counts_due: Option<tokio::time::Instant>,
    /// Since when the rule waits for its source watches to list.
    pub(crate) waiting_since: Option<tokio::time::Instant>,
    /// What the rule's last failure line said, so that an unchanged
    /// failure is not logged on every pass.
    pub(crate) failure_log: Option<crate::core::pass_log::FailureLog>,
    /// The rule's share of `copyrator_copies_managed` and
    /// `copyrator_conflicts_skipped` (the home cluster's).
    pub(crate) copies: i64,
    pub(crate) conflicts: i64,
}

pub(crate) struct Site {
    pub(crate) name: SiteName,
    pub(crate) cluster: Cluster,
    pub(crate) queue: Queue,
    pub(crate) memory: Mutex<HashMap<RuleKey, RuleMemory>>,
    pub(crate) backoffs: Mutex<Backoffs>,
    /// When each workload (`Kind namespace/name`) was last rolled by a
    /// restart of its consumers, for `--min-restart-interval`.
    pub(crate) rolled_at: Mutex<HashMap<String, tokio::time::Instant>>,
}

impl Site {
    pub(crate) fn new(name: SiteName, cluster: Cluster, metrics: Arc<Metrics>) -> Self {
        Self {
            name,
            cluster,
            queue: Queue::new(metrics),
            memory: Mutex::default(),
            backoffs: Mutex::default(),
            rolled_at: Mutex::default(),
        }
    }
}
