//! The member clusters `copyrator plan` covers (`--member-clusters`): the
//! inventory read once, each member's views started (watches only: the
//! writer's gate is shut and no worker runs there) and listed within a
//! deadline, and each rule previewed there as a member's pass would plan
//! it. A member that cannot be used, reached, listed or looked up in is
//! reported as not planned, with why, and never fails the plan of the
//! other clusters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::api::kinds::Kind;
use crate::api::rule::CopyratorRule;
use crate::cli::report::{ClusterVerdict, PlanError};
use crate::controller::fleet;
use crate::controller::member_pass::member_preview;
use crate::controller::members::Member;
use crate::controller::state::Shared;
use crate::core::plan::Action;
use crate::core::preview::{PlannedChange, Preview, Skip};

/// The members of the inventory as a plan sees them: those whose views
/// are listed, and why each of the others is not planned.
pub(crate) struct PlanMembers {
    /// Listed, by name; their watches stop when they are dropped.
    listed: Vec<Arc<Member>>,
    /// Members not planned, by name, with why.
    failed: BTreeMap<String, String>,
}

impl PlanMembers {
    /// Read the inventory, start each member's views, and wait for them to
    /// list: up to `reach_within` for its API server's first answer, then
    /// up to `lists_within` for its namespaces and copies; every member at
    /// once. An inventory that cannot be read fails the plan: it is the
    /// home cluster's.
    pub(crate) async fn start(
        shared: &Arc<Shared>,
        reach_within: Duration,
        lists_within: Duration,
    ) -> Result<Self, crate::Error> {
        let inventory = fleet::list_inventory(shared).await?;
        let mut failed = BTreeMap::new();
        let mut started = Vec::new();
        for (name, access) in &inventory {
            let unusable = |reason: &str, message: String| PlanError::MemberUnusable {
                reason: reason.to_owned(),
                message,
            };
            let member = fleet::member_start(shared, access)
                .map_err(|(reason, message)| unusable(reason, message))
                .and_then(|start| {
                    fleet::member_views(shared, start)
                        .map_err(|message| unusable("ClientInvalid", message))
                });
            match member {
                Ok(member) => started.push(member),
                Err(why) => {
                    failed.insert(name.clone(), why.to_string());
                }
            }
        }
        let waits = started.into_iter().map(|member| async move {
            let listed = listed(&member, reach_within, lists_within).await;
            (member, listed)
        });
        let mut listed = Vec::new();
        for (member, answer) in futures::future::join_all(waits).await {
            match answer {
                Ok(()) => listed.push(member),
                Err(why) => {
                    failed.insert(member.name().to_owned(), why.to_string());
                }
            }
        }
        Ok(Self { listed, failed })
    }

    /// Every member of the inventory, planned or not (with why).
    pub(crate) fn verdicts(&self) -> Vec<ClusterVerdict> {
        let planned = self.planned().map(|m| ClusterVerdict::planned(m.name()));
        let failed = self
            .failed
            .iter()
            .map(|(name, why)| ClusterVerdict::not_planned(name, why.clone()));
        planned.chain(failed).collect()
    }

    /// The members planned so far.
    fn planned(&self) -> impl Iterator<Item = &Arc<Member>> {
        self.listed
            .iter()
            .filter(|m| !self.failed.contains_key(m.name()))
    }

    /// What `rule` would do in each member planned, appended to its
    /// preview at home; `WaitingForSources` while its sources are not
    /// listed. A member whose lookups fail is not planned any further (its
    /// entries are dropped by [`PlanMembers::keep_planned`]).
    pub(crate) async fn preview(
        &mut self,
        shared: &Arc<Shared>,
        rule: &CopyratorRule,
        mut changes: Vec<PlannedChange>,
        mut skipped: Vec<Skip>,
    ) -> Preview {
        let members: Vec<Arc<Member>> = self.planned().cloned().collect();
        for member in members {
            match member_preview(shared, &member, rule).await {
                Ok(Preview::Planned {
                    changes: more,
                    skipped: left_out,
                }) => {
                    changes.extend(more);
                    skipped.extend(left_out);
                }
                Ok(Preview::WaitingForSources) => return Preview::WaitingForSources,
                // Refused at home, refused everywhere: the home preview says so.
                Ok(Preview::Refused { .. }) => {}
                Err(e) => {
                    self.failed.insert(member.name().to_owned(), e.to_string());
                }
            }
        }
        Preview::Planned { changes, skipped }
    }

    /// The deletions of the copies of `kind` in the members planned whose
    /// rule is gone without its finalizer having run (`run` deletes them
    /// once it reaches the member).
    pub(crate) fn orphans(&self, shared: &Shared, kind: Kind) -> Vec<PlannedChange> {
        let mut changes = Vec::new();
        for member in self.planned() {
            for action in crate::controller::finalizer::orphans_in(shared, &member.site, kind) {
                if let Action::Delete { current, .. } = &action {
                    let rule = current.rule_ref.as_deref().unwrap_or_default();
                    changes.push(PlannedChange::of(member.name(), rule, kind, &action));
                }
            }
        }
        changes
    }

    /// Drop the entries of members that failed while being planned: what
    /// was planned there is incomplete, and they are reported instead.
    pub(crate) fn keep_planned(&self, changes: &mut Vec<PlannedChange>, skipped: &mut Vec<Skip>) {
        changes.retain(|c| !self.failed.contains_key(&c.cluster));
        skipped.retain(|s| !self.failed.contains_key(&s.cluster));
    }
}

/// Wait for a member's API server to answer, then for its views to list.
async fn listed(
    member: &Member,
    reach_within: Duration,
    lists_within: Duration,
) -> Result<(), PlanError> {
    let reader = member.site.cluster.reader.clone();
    match tokio::time::timeout(reach_within, reader.version()).await {
        Err(_) => {
            return Err(PlanError::MemberSilent {
                seconds: reach_within.as_secs(),
            });
        }
        Ok(Err(e)) => {
            return Err(PlanError::MemberUnreachable(crate::error::describe(&e)));
        }
        Ok(Ok(_)) => {}
    }
    let synced = &member.site.cluster.views.synced;
    // A plan on half-listed views would miss copies and prune nothing.
    if tokio::time::timeout(lists_within, synced.wait_all())
        .await
        .is_err()
    {
        return Err(PlanError::MemberNotListed {
            missing: synced.missing().join(", "),
            seconds: lists_within.as_secs(),
        });
    }
    Ok(())
}
