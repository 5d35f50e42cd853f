//! The rule's finalizer: added before the first copy is written, removed
//! once every copy of a deleted rule is gone.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::events::EventType;
use tracing::info;

use crate::api::kinds::Kind;
use crate::api::rule::Disposal;
use crate::api::rule::{ConflictPolicy, CopyratorRule, RuleKey};
use crate::cluster::writer::{Outcome, Sent};
use crate::controller::members::MEMBER_CLEANUP_GIVES_UP_AFTER;
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::identity::Identity;
use crate::core::plan::{self, Action, DeleteReason};
use crate::core::preview::PlannedChange;
use crate::core::scope::Touch;
use crate::sync::{read, write};
use crate::{Error, FINALIZER};

/// Add or remove our finalizer, as a compare-and-swap on the rule's version.
pub(crate) async fn set_finalizer(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    present: bool,
) -> Result<(), Error> {
    let key = rule.key();
    let mut finalizers: Vec<String> = rule
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.into());
    }
    match shared
        .home
        .cluster
        .writer
        .rule_finalizers(rule, finalizers)
        .await
    {
        Ok(Sent::Answered(updated)) => {
            // Taken only if not older than what the watch has delivered meanwhile.
            shared.set_rule(key, Arc::new(updated));
            Ok(())
        }
        Ok(Sent::NotLeader) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Finalizer {
            rule: key.to_string(),
            source,
        }),
    }
}

/// Carry out deletions, as many at once as writes may be in flight.
pub(crate) async fn delete_all(
    site: &Site,
    kind: Kind,
    actions: Vec<Action>,
    rule: &str,
    identity: &Identity,
) -> Vec<(Action, Outcome)> {
    futures::stream::iter(actions)
        .map(|action| async move {
            let outcome = site
                .cluster
                .writer
                .execute(kind, &action, ConflictPolicy::Skip, rule, identity)
                .await;
            (action, outcome)
        })
        .buffer_unordered(site.cluster.writer.concurrency())
        .collect()
        .await
}

/// What a cleanup's writes came to.
#[derive(Default)]
pub(crate) struct Cleared {
    /// Copies deleted or handed over (or found gone already).
    pub(crate) done: usize,
    /// Some were not written: this process does not lead (or a name was taken).
    pub(crate) retry: bool,
    /// `Kind namespace/name: why` of each write that failed.
    pub(crate) failed: Vec<String>,
}

impl Cleared {
    /// Carry out a cleanup's `actions` on the copies of `kind` in `site`,
    /// each written through to the site's copy view.
    pub(crate) async fn carry_out(
        &mut self,
        site: &Site,
        kind: Kind,
        actions: Vec<Action>,
        rule: &str,
        identity: &Identity,
    ) {
        for (action, outcome) in delete_all(site, kind, actions, rule, identity).await {
            let (namespace, name) = action.target();
            match outcome {
                Outcome::Written(object) => {
                    write_through(site, kind, &action, object);
                    self.done += 1;
                }
                // A cleanup deletes and hands over only: nothing is adopted.
                Outcome::Adopted(object) => write_through(site, kind, &action, Some(object)),
                Outcome::Ignored(_) => {
                    write_through(site, kind, &action, None);
                    self.done += 1;
                }
                Outcome::NotLeader | Outcome::Conflict(_) => self.retry = true,
                Outcome::Failed(failure) => self
                    .failed
                    .push(format!("{kind} {namespace}/{name}: {}", failure.message)),
            }
        }
    }
}

/// The deletions (or hand-overs, `disposal`) of the copies of `kind` that
/// the rule of `uid` holds in a site it withdraws from, for `why` (deleted,
/// or no longer targeting the site); copies handed over before stay.
pub(crate) fn withdrawals(
    site: &Site,
    uid: &str,
    kind: Kind,
    why: DeleteReason,
    disposal: Disposal,
    tenant: Option<&str>,
) -> Vec<Action> {
    let namespaces = read(&site.cluster.views.namespaces);
    let copies = read(site.cluster.views.copies(kind));
    plan::cleanup(uid, why, disposal, tenant, &namespaces, &copies)
}

/// Withdraw the rule of `uid` from a site (home at its deletion, or a
/// member it deleted or no longer selects): [`withdrawals`] of every kind,
/// carried out.
pub(crate) async fn withdraw(
    site: &Site,
    uid: &str,
    why: DeleteReason,
    disposal: Disposal,
    rule: &str,
    tenant: Option<&str>,
    identity: &Identity,
) -> Cleared {
    let mut cleared = Cleared::default();
    for kind in Kind::all() {
        let actions = withdrawals(site, uid, kind, why, disposal, tenant);
        cleared.carry_out(site, kind, actions, rule, identity).await;
    }
    cleared
}

/// What withdrawing the rule of `uid` from `site` would change, for
/// `copyrator plan`.
pub(crate) fn preview_withdrawal(
    shared: &Shared,
    site: &Site,
    rule: &str,
    uid: &str,
    why: DeleteReason,
    disposal: Disposal,
    identity: &Identity,
) -> Vec<PlannedChange> {
    let cluster = shared.cluster_name(&site.name);
    let rule_namespace = rule
        .split_once('/')
        .map_or(rule, |(namespace, _)| namespace);
    let tenant = shared.trust.tenant_namespace(rule_namespace);
    Kind::all()
        .flat_map(|kind| {
            withdrawals(site, uid, kind, why, disposal, tenant)
                .into_iter()
                .map(move |action| {
                    PlannedChange::of(cluster, rule, kind, &action).sent_as(identity)
                })
        })
        .collect()
}

/// The copies of the rule of `uid` in `site` that a withdrawal deletes or
/// hands over: those it holds but those handed over before.
pub(crate) fn copies_to_withdraw(site: &Site, uid: &str) -> usize {
    Kind::all()
        .map(|kind| {
            let copies = read(site.cluster.views.copies(kind));
            copies.count_owned_by(uid) - copies.count_create_only(uid)
        })
        .sum()
}

/// Take a cleanup's write into the site's copy view at once, so that the
/// copies it deleted or handed over no longer count as the rule's before
/// their watch events arrive: `object` as written, or none.
pub(crate) fn write_through(
    site: &Site,
    kind: Kind,
    action: &Action,
    object: Option<Arc<crate::cache::index::Object>>,
) {
    let mut copies = write(site.cluster.views.copies(kind));
    match (object, action) {
        (Some(object), _) => {
            copies.upsert_written(object);
        }
        // Gone (or going with its namespace) either way: no copy of the rule's any more.
        (None, Action::Delete { current, .. } | Action::HandOver { current, .. }) => {
            copies.remove(current);
        }
        (None, _) => {}
    }
}

/// The deletions of the copies of `kind` whose rule is gone without its
/// finalizer having run, among the rules this operator follows (see
/// `plan::orphans`).
pub(crate) fn orphans(shared: &Shared, kind: Kind) -> Vec<Action> {
    orphans_in(shared, &shared.home, kind)
}

/// [`orphans`] in one site (home, or a member cluster).
pub(crate) fn orphans_in(shared: &Shared, site: &Site, kind: Kind) -> Vec<Action> {
    let responsible = |rule: &str| {
        let Some((namespace, name)) = rule.split_once('/') else {
            return false;
        };
        let watched_namespace =
            shared.trust.all_namespaces || namespace == shared.trust.operator_namespace;
        let watched_name = shared
            .options
            .rule_name
            .as_deref()
            .is_none_or(|only| only == name);
        let key = crate::api::rule::RuleKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        watched_namespace && watched_name && !read(&shared.rules).contains_key(&key)
    };
    let namespaces = read(&site.cluster.views.namespaces);
    let live = |uid: &str| shared.is_live_rule(uid);
    plan::orphans(
        &read(site.cluster.views.copies(kind)),
        &namespaces,
        &live,
        &responsible,
    )
}

/// Delete the copies of rules that are gone without their finalizer having
/// run (see [`orphans`]); returns how many were deleted. `cause` (start,
/// interval, leading, a kind listed) is said in the log line.
pub(crate) async fn collect_orphans(shared: &Arc<Shared>, cause: &'static str) -> usize {
    let mut deleted = collect_orphans_in(shared, &shared.home, cause).await;
    for member in shared.members.all() {
        if member.is_reachable() {
            deleted += collect_orphans_in(shared, &member.site, cause).await;
        }
    }
    deleted
}

/// [`collect_orphans`] in one site.
pub(crate) async fn collect_orphans_in(shared: &Shared, site: &Site, cause: &'static str) -> usize {
    // A standby's deletes would all come back NotLeader: none is planned.
    if !site.cluster.writer.leads() || !site.cluster.views.synced.all() {
        return 0;
    }
    let mut deleted = 0;
    let mut failed = 0;
    for kind in Kind::all() {
        let actions = orphans_in(shared, site, kind);
        // The rule is gone, and whom it wrote as with it: the copies it
        // left, each proved the operator's by its mark, go as the operator.
        let outcomes = delete_all(site, kind, actions, "(rule gone)", &Identity::Operator).await;
        for (action, outcome) in outcomes {
            match (outcome, &action) {
                (Outcome::Written(_) | Outcome::Ignored(_), Action::Delete { current, .. }) => {
                    write(site.cluster.views.copies(kind)).remove(current);
                    deleted += 1;
                }
                (Outcome::Failed(_), _) => failed += 1,
                _ => {}
            }
        }
    }
    if deleted + failed > 0 {
        info!(
            deleted,
            failed,
            cause,
            cluster = %site.name,
            "collected the copies of rules that are gone"
        );
    }
    deleted
}

/// A deleted rule's copies in member clusters: the members that still hold
/// some get their passes (which delete them); returns the names of those
/// the rule still waits for, and of those given up (unreachable for
/// longer than [`MEMBER_CLEANUP_GIVES_UP_AFTER`]).
fn members_holding(shared: &Shared, key: &RuleKey, uid: &str) -> (Vec<String>, Vec<String>) {
    let mut waiting = Vec::new();
    let mut given_up = Vec::new();
    for member in shared.members.all() {
        if copies_to_withdraw(&member.site, uid) == 0 {
            continue;
        }
        if member.unreachable_for() > MEMBER_CLEANUP_GIVES_UP_AFTER {
            given_up.push(member.name().to_owned());
        } else {
            member.site.queue.add(key.clone(), Touch::All);
            waiting.push(member.name().to_owned());
        }
    }
    (waiting, given_up)
}

/// Whether a deleted rule still waits for members to delete its copies
/// (and when to look again); members given up are said in an Event.
async fn wait_for_members(
    shared: &Shared,
    rule: &CopyratorRule,
    key: &RuleKey,
    uid: &str,
) -> Option<Duration> {
    let (waiting, given_up) = members_holding(shared, key, uid);
    if !waiting.is_empty() {
        info!(rule = %key, members = ?waiting, "rule deleted; waiting for member clusters to delete its copies");
        return Some(Duration::from_secs(2));
    }
    if !given_up.is_empty() {
        shared
            .event(
                rule,
                EventType::Warning,
                "ClusterUnreachable",
                "Delete",
                format!(
                    "the rule is being deleted; member clusters unreachable for more than {} minutes still hold its copies, which are deleted when they answer again: {}",
                    MEMBER_CLEANUP_GIVES_UP_AFTER.as_secs() / 60,
                    given_up.join(", ")
                ),
            )
            .await;
    }
    None
}

/// What a deleted rule's cleanup did, for its Event: `done` copies deleted
/// or handed over under `disposal`, and `left` handed over before.
fn deletion_note(disposal: Disposal, done: usize, left: usize) -> String {
    let done = match disposal {
        Disposal::Delete => format!("the rule is being deleted: deleted its {done} copies"),
        Disposal::Orphan => format!(
            "the rule is being deleted: handed its {done} copies over to their namespaces (deletionPolicy.ruleDeleted Orphan)"
        ),
    };
    if left == 0 {
        done
    } else {
        format!(
            "{done}; left the {left} it had handed over before (syncPolicy CreateOnly or Orphan) to their namespaces"
        )
    }
}

/// A deleted rule: delete (or hand over) every copy it made, here and in every member,
/// then let the rule go; returns when to look again while members still
/// hold copies.
pub(crate) async fn cleanup(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    uid: &str,
) -> Result<Option<Duration>, Error> {
    let key = rule.key();
    let disposal = rule.on_deletion();
    // Copies handed over to their namespaces before (syncPolicy CreateOnly) stay.
    let left: usize = Kind::all()
        .map(|kind| read(shared.copies(kind)).count_create_only(uid))
        .sum();
    let why = DeleteReason::RuleDeleted;
    let tenant = shared.trust.tenant_namespace(&key.namespace);
    let identity = rule.identity(&shared.trust);
    let cleared = withdraw(
        &shared.home,
        uid,
        why,
        disposal,
        &key.to_string(),
        tenant,
        &identity,
    )
    .await;
    let Cleared {
        done: deleted,
        retry,
        failed: errors,
    } = cleared;
    if retry {
        // Not the leader: the next leader finishes the cleanup.
        return Ok(None);
    }
    if let Some(first) = errors.first() {
        shared
            .event(
                rule,
                EventType::Warning,
                "CleanupFailed",
                "Delete",
                format!(
                    "{} copies could not be deleted; first: {first}",
                    errors.len()
                ),
            )
            .await;
        return Err(Error::Cleanup {
            rule: key.to_string(),
            count: errors.len(),
            first: first.clone(),
        });
    }
    if let Some(again) = wait_for_members(shared, rule, &key, uid).await {
        return Ok(Some(again));
    }
    shared
        .event(
            rule,
            EventType::Normal,
            "CopiesDeleted",
            "Delete",
            deletion_note(disposal, deleted, left),
        )
        .await;
    match disposal {
        Disposal::Delete => {
            info!(rule = %key, deleted, left, "rule deleted; its copies are cleaned up")
        }
        Disposal::Orphan => {
            info!(rule = %key, handed_over = deleted, left, "rule deleted; its copies are handed over to their namespaces")
        }
    }
    set_finalizer(shared, rule, false).await.map(|()| None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fake_objects::api_error;
    use crate::controller::test_support::{copy, home, label, resolved, rule};
    use serde_json::json;

    /// r's copies in t1 and t2, one it handed over (CreateOnly) in t3, and
    /// a copy of another rule in t1.
    async fn stage(shared: &Shared) {
        let site = &shared.home;
        let r = resolved(&rule("rule-1", json!({})));
        copy(site, &r, "t1", "ca").await;
        copy(site, &r, "t2", "ca").await;
        let handed = resolved(&rule("rule-1", json!({"syncPolicy": "CreateOnly"})));
        copy(site, &handed, "t3", "ca").await;
        copy(site, &resolved(&rule("rule-2", json!({}))), "t1", "other").await;
        assert_eq!(copies_to_withdraw(site, "rule-1"), 2);
    }

    async fn withdraw_r(shared: &Shared, why: DeleteReason, disposal: Disposal) -> Cleared {
        withdraw(
            &shared.home,
            "rule-1",
            why,
            disposal,
            "ops/r",
            None,
            &Identity::Operator,
        )
        .await
    }

    #[tokio::test]
    async fn a_withdrawal_deletes_the_rules_copies_and_nothing_else() {
        let (shared, store) = home();
        stage(&shared).await;
        let cleared = withdraw_r(&shared, DeleteReason::RuleDeleted, Disposal::Delete).await;
        assert_eq!((cleared.done, cleared.retry), (2, false));
        assert!(cleared.failed.is_empty(), "{:?}", cleared.failed);
        assert!(store.stored("t1", "ca").is_none() && store.stored("t2", "ca").is_none());
        assert!(
            store.stored("t3", "ca").is_some(),
            "handed over before: stays"
        );
        assert!(
            store.stored("t1", "other").is_some(),
            "another rule's: stays"
        );
        assert_eq!(
            copies_to_withdraw(&shared.home, "rule-1"),
            0,
            "the view knows at once"
        );
    }

    #[tokio::test]
    async fn a_withdrawal_under_orphan_hands_the_copies_over_with_their_data() {
        let (shared, store) = home();
        stage(&shared).await;
        let cleared = withdraw_r(&shared, DeleteReason::TargetLeft, Disposal::Orphan).await;
        assert_eq!(cleared.done, 2);
        for namespace in ["t1", "t2"] {
            assert_eq!(
                label(&store, namespace, "ca", crate::LABEL_SYNC_POLICY).as_deref(),
                Some(crate::CREATE_ONLY)
            );
            let data = store
                .stored(namespace, "ca")
                .map(|o| o.data["data"].clone());
            assert_eq!(data, Some(json!({"k": "v"})));
        }
        assert_eq!(copies_to_withdraw(&shared.home, "rule-1"), 0);
    }

    #[tokio::test]
    async fn a_refused_delete_is_said_and_its_copy_still_counts() {
        let (shared, store) = home();
        stage(&shared).await;
        store.fail_next(
            "delete",
            "t1",
            api_error(403, "configmaps \"ca\" is forbidden: frozen", "Forbidden"),
        );
        let cleared = withdraw_r(&shared, DeleteReason::RuleDeleted, Disposal::Delete).await;
        assert_eq!(cleared.done, 1);
        assert_eq!(cleared.failed.len(), 1);
        let said: &str = &cleared.failed[0];
        assert!(
            said.starts_with("ConfigMap t") && said.contains("frozen"),
            "{said}"
        );
        assert_eq!(copies_to_withdraw(&shared.home, "rule-1"), 1);
    }

    #[test]
    fn the_deletion_event_says_what_was_deleted_and_what_was_left() {
        assert_eq!(
            deletion_note(Disposal::Delete, 3, 0),
            "the rule is being deleted: deleted its 3 copies"
        );
        let orphaned = deletion_note(Disposal::Orphan, 2, 1);
        assert!(orphaned.starts_with("the rule is being deleted: handed its 2 copies over"));
        assert!(orphaned.ends_with("left the 1 it had handed over before (syncPolicy CreateOnly or Orphan) to their namespaces"));
    }
}
