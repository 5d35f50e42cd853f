//! One pass over one rule in one member cluster: the same plan and writes
//! as at home (`reconcile::carry_out`), with the home cluster's sources
//! and the member's namespaces and copies; or, where the rule no longer
//! selects the member (or is deleted, or the member leaves the
//! inventory), the deletion of its copies there. What the pass found is
//! the member's report, which the rule's status at home lists.
//! [`member_preview`] decides the same way for `copyrator plan`, and
//! writes nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::rule::{CopyratorRule, Disposal, RuleKey};
use crate::cluster::sources::Sources;
use crate::controller::cluster_pass::{cluster_pass, preview_plan};
use crate::controller::finalizer::{
    Cleared, copies_to_withdraw, preview_withdrawal, withdraw as withdraw_copies,
};
use crate::controller::members::Member;
use crate::controller::reconcile::sources_of;
use crate::controller::state::Shared;
use crate::core::plan::DeleteReason;
use crate::core::preview::{Preview, Skip};
use crate::core::report::ClusterReport;
use crate::core::resolve::ResolvedRule;
use crate::core::scope::{Scope, Touch};
use crate::sync::{lock, read};
use crate::{ANNOTATION_SOURCE_CLUSTER, Error};

/// How soon a pass that waits (for the member's first lists, for the
/// rule's sources) looks again.
const WAIT_AGAIN: Duration = Duration::from_secs(1);

pub(crate) async fn member_pass(
    shared: &Arc<Shared>,
    member: &Arc<Member>,
    key: &RuleKey,
    scope: Scope,
) -> Result<Option<Duration>, Error> {
    let site = &member.site;
    if member.is_unreachable() {
        // Its writes would only fail: the pass runs when the probe finds
        // the member answering again (which queues every rule there).
        site.queue.carry(key, scope);
        return Ok(None);
    }
    if !member.is_synced() {
        // A pass on a half-listed view would prune what it has not seen.
        site.queue.carry(key, scope);
        return Ok(Some(WAIT_AGAIN));
    }
    let Some(rule) = read(&shared.rules).get(key).cloned() else {
        tell(shared, member, key, None);
        return Ok(None);
    };
    let resolved = match asks_of(shared, member, &rule) {
        Asks::Nothing => return Ok(None),
        Asks::Withdraw {
            prune,
            why,
            disposal,
        } => {
            let how = prune.then_some((why, disposal));
            return withdraw(shared, member, &rule, how).await;
        }
        Asks::KindNotCopied(message) => {
            let problem = ("KindNotCopiedToMembers".to_owned(), message);
            tell(
                shared,
                member,
                key,
                Some(ClusterReport {
                    problem: Some(problem),
                    ..ClusterReport::default()
                }),
            );
            return Ok(None);
        }
        Asks::Copies(resolved) => resolved,
    };
    let Sources::Listed(sources) = sources_of(shared, &resolved) else {
        site.queue.carry(key, scope);
        return Ok(Some(WAIT_AGAIN));
    };
    let here = in_member(&resolved, &shared.options.cluster_name);
    let (pass, report) = cluster_pass(shared, site, &rule, &here, &sources, scope).await;
    tell(shared, member, key, Some(report));
    Ok(pass
        .retry_at
        .map(|at| at.saturating_duration_since(Instant::now())))
}

/// What a rule asks of a member, as its passes there and its preview
/// (`copyrator plan`) both decide it.
enum Asks {
    /// Invalid: it changes nothing, here as at home.
    Nothing,
    /// Deleted, or its targets do not select the member (or the member
    /// left the inventory): its copies there are deleted or handed over
    /// (`disposal`, for `why`), unless `prune` is off.
    Withdraw {
        prune: bool,
        why: DeleteReason,
        disposal: Disposal,
    },
    /// The member is selected, but the rule copies a kind members do not
    /// receive: why.
    KindNotCopied(String),
    /// Copies there, as the rule resolves.
    Copies(Box<ResolvedRule>),
}

fn asks_of(shared: &Shared, member: &Member, rule: &CopyratorRule) -> Asks {
    let resolved = if rule.is_deleting() {
        None
    } else {
        match rule.resolve(&shared.trust) {
            Ok(resolved) => Some(resolved),
            Err(_) => return Asks::Nothing,
        }
    };
    let selected = !member.is_leaving()
        && resolved.as_ref().is_some_and(|resolved| {
            resolved
                .clusters
                .selects(member.name(), &read(&member.labels))
        });
    match resolved {
        Some(resolved) if selected => {
            if resolved.kind.info().generic {
                Asks::KindNotCopied(format!(
                    "member clusters receive ConfigMaps and Secrets; this rule copies {}",
                    resolved.kind.info().rule_type
                ))
            } else {
                Asks::Copies(Box::new(resolved))
            }
        }
        Some(resolved) => Asks::Withdraw {
            // A member that leaves the inventory is let go clean.
            prune: resolved.prune || member.is_leaving(),
            why: DeleteReason::TargetLeft,
            disposal: resolved.deletion.target_left,
        },
        None => Asks::Withdraw {
            prune: true,
            why: DeleteReason::RuleDeleted,
            disposal: rule.on_deletion(),
        },
    }
}

/// What a pass over `rule` would write and leave out now in `member`, for
/// `copyrator plan`: the plan of a pass there (or of its withdrawal), from
/// the member's views and the home cluster's sources. Writes nothing.
pub(crate) async fn member_preview(
    shared: &Arc<Shared>,
    member: &Member,
    rule: &CopyratorRule,
) -> Result<Preview, Error> {
    let site = &member.site;
    let cluster = member.name();
    let rule_name = rule.key().to_string();
    let mut changes = Vec::new();
    let mut skipped = Vec::new();
    match asks_of(shared, member, rule) {
        Asks::Nothing | Asks::Withdraw { prune: false, .. } => {}
        Asks::Withdraw {
            prune: true,
            why,
            disposal,
        } => {
            let uid = rule.uid().unwrap_or_default();
            let identity = rule.identity(&shared.trust);
            changes = preview_withdrawal(shared, site, &rule_name, uid, why, disposal, &identity);
        }
        Asks::KindNotCopied(why) => skipped.push(Skip::member(cluster, &rule_name, &why)),
        Asks::Copies(resolved) => {
            let Sources::Listed(sources) = sources_of(shared, &resolved) else {
                return Ok(Preview::WaitingForSources);
            };
            let here = in_member(&resolved, &shared.options.cluster_name);
            let labels = read(&member.labels).clone();
            return preview_plan(shared, site, &here, &sources, &labels).await;
        }
    }
    Ok(Preview::Planned { changes, skipped })
}

/// The rule as a member's pass follows it: every target is in the member
/// (`local` speaks of the home cluster), and each copy names the cluster
/// its source is in.
pub(crate) fn in_member(resolved: &ResolvedRule, home_name: &str) -> ResolvedRule {
    let mut here = resolved.clone();
    here.clusters.local = true;
    here.in_own_cluster = false;
    // What the account may write was asked of the home cluster: a member
    // takes the consent annotations.
    here.granted_targets = None;
    here.transform
        .add_annotations
        .insert(ANNOTATION_SOURCE_CLUSTER.to_owned(), home_name.to_owned());
    here
}

/// A rule's report from a member; a changed one is said in the rule's
/// status at home.
fn tell(shared: &Shared, member: &Member, key: &RuleKey, report: Option<ClusterReport>) {
    if member.report(key, report) {
        shared.home.queue.add(key.clone(), Touch::Nothing);
    }
}

/// The rule no longer has copies in the member: deleted, its targets no
/// longer select the member, or the member left the inventory. Its copies
/// there are deleted or handed over (`how`: why, and what becomes of them;
/// none when `prune` is off); copies handed over before stay, as at home.
async fn withdraw(
    shared: &Arc<Shared>,
    member: &Arc<Member>,
    rule: &CopyratorRule,
    how: Option<(DeleteReason, Disposal)>,
) -> Result<Option<Duration>, Error> {
    let site = &member.site;
    let key = rule.key();
    let uid = rule.uid().unwrap_or_default().to_owned();
    let cleared = match how {
        Some((why, disposal)) => {
            let tenant = shared.trust.tenant_namespace(&key.namespace);
            let identity = rule.identity(&shared.trust);
            withdraw_copies(
                site,
                &uid,
                why,
                disposal,
                &key.to_string(),
                tenant,
                &identity,
            )
            .await
        }
        None => Cleared::default(),
    };
    let Cleared { retry, failed, .. } = cleared;
    let left = copies_to_withdraw(site, &uid) as u32;
    if left == 0 || how.is_none() {
        lock(&site.memory).remove(&key);
        lock(&site.backoffs).forget_rule(&key);
        tell(shared, member, &key, None);
        if member.is_leaving() {
            shared.retire_left_members();
        }
        return Ok(None);
    }
    let problem = failed.first().map(|first| {
        (
            "CleanupFailed".to_owned(),
            format!(
                "{} copies could not be deleted; first: {first}",
                failed.len()
            ),
        )
    });
    tell(
        shared,
        member,
        &key,
        Some(ClusterReport {
            copies: left,
            problem,
            ..ClusterReport::default()
        }),
    );
    let again = if retry {
        WAIT_AGAIN
    } else {
        Duration::from_secs(5)
    };
    Ok(Some(again))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kinds::Kind;
    use crate::cluster::fake_objects::{FakeObjects, api_error};
    use crate::controller::test_support::{
        copy, home, key, label, member, report_of, resolved, rule,
    };
    use serde_json::{Value, json};

    /// The rule `ops/r` (`spec` added) at home, and its copies in t1 and t2
    /// of member `a`.
    async fn stage(spec: Value) -> (Arc<Shared>, Arc<Member>, Arc<FakeObjects>) {
        let (shared, _) = home();
        let (a, store) = member(&shared, "a", &["t1", "t2"]);
        let rule = rule("rule-1", spec);
        for namespace in ["t1", "t2"] {
            copy(&a.site, &resolved(&rule), namespace, "ca").await;
        }
        shared.set_rule(key(), Arc::new(rule));
        (shared, a, store)
    }

    fn targets(names: &[&str]) -> Value {
        json!({"targets": {"clusters": {"names": names, "local": false}}})
    }

    async fn pass(shared: &Arc<Shared>, a: &Arc<Member>) -> Option<Duration> {
        member_pass(shared, a, &key(), Scope::everything())
            .await
            .expect("a member pass")
    }

    #[tokio::test]
    async fn a_rule_that_no_longer_selects_the_member_deletes_its_copies_there() {
        let (shared, a, store) = stage(targets(&["b"])).await;
        assert_eq!(pass(&shared, &a).await, None);
        assert!(store.stored("t1", "ca").is_none() && store.stored("t2", "ca").is_none());
        assert_eq!(report_of(&a), None, "nothing of the rule is said for a");
    }

    #[tokio::test]
    async fn under_target_left_orphan_its_copies_there_are_handed_over() {
        let mut spec = targets(&["b"]);
        spec["deletionPolicy"] = json!({"targetLeft": "Orphan"});
        let (shared, a, store) = stage(spec).await;
        pass(&shared, &a).await;
        for namespace in ["t1", "t2"] {
            assert_eq!(
                label(&store, namespace, "ca", crate::LABEL_SYNC_POLICY).as_deref(),
                Some(crate::CREATE_ONLY),
                "{namespace}"
            );
        }
    }

    #[tokio::test]
    async fn a_deleted_rules_copies_in_the_member_are_deleted() {
        let mut spec = targets(&["a"]);
        spec["metadata"] = json!({"name": "r", "namespace": "ops", "uid": "rule-1",
            "generation": 1, "finalizers": [crate::FINALIZER],
            "deletionTimestamp": "2026-01-01T00:00:00Z"});
        let (shared, a, store) = stage(spec).await;
        assert!(
            read(&shared.rules)
                .get(&key())
                .is_some_and(|r| r.is_deleting())
        );
        pass(&shared, &a).await;
        assert!(store.stored("t1", "ca").is_none() && store.stored("t2", "ca").is_none());
    }

    #[tokio::test]
    async fn a_refused_delete_is_reported_with_the_copies_left() {
        let (shared, a, store) = stage(targets(&["b"])).await;
        store.fail_next(
            "delete",
            "t2",
            api_error(403, "configmaps are frozen in t2", "Forbidden"),
        );
        let again = pass(&shared, &a).await;
        assert!(again.is_some(), "it looks again");
        let report = report_of(&a).expect("a report");
        assert_eq!(report.copies, 1);
        let (reason, message) = report.problem.expect("a problem");
        assert_eq!(reason, "CleanupFailed");
        assert!(
            message.starts_with("1 copies could not be deleted; first: ConfigMap t2/ca")
                && message.contains("frozen in t2"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn nothing_is_written_in_a_member_that_does_not_answer_or_is_not_listed() {
        let (shared, a, store) = stage(targets(&["b"])).await;
        let before = store.requests().len();
        *lock(&a.reach) = crate::controller::members::Reach::Unreachable {
            message: "connection refused".into(),
            since: Instant::now(),
            why: crate::core::status::Unanswered::NoAnswer,
        };
        assert_eq!(pass(&shared, &a).await, None);
        *lock(&a.reach) = crate::controller::members::Reach::Reachable;
        a.site
            .cluster
            .views
            .synced
            .set_copies_of(Kind::ConfigMap, false);
        assert_eq!(pass(&shared, &a).await, Some(WAIT_AGAIN));
        assert_eq!(store.requests().len(), before, "no request made");
        assert!(store.stored("t1", "ca").is_some());
    }
}
