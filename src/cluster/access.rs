//! What a rule's ServiceAccount may read, as the API server says it (a
//! SubjectAccessReview): the shared watches hold every source as the
//! operator reads it, and a rule that writes as a ServiceAccount uses only
//! the sources that account may `get` itself.
//!
//! Answers are all forgotten at once when RBAC changes ([`Access::forget`],
//! called on every event of the RBAC watch): a Role granted or revoked
//! counts from the next pass. They are kept briefly ([`KEPT_FOR`]) until
//! that watch has listed, and when asked just after a change (the API
//! server's authorizer follows RBAC apart from our watch, and may answer
//! from before it for a moment); otherwise for [`KEPT_WHILE_FOLLOWED`],
//! since a change would have forgotten them: a rule's resyncs and the
//! passes a source update starts ask nothing again. A
//! namespace-wide question is asked first, since one grant usually covers
//! a namespace; only where it is refused is each object asked by name
//! (a Role may grant by `resourceNames`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use thiserror::Error;
use tokio::time::Instant;

use crate::api::kinds::Kind;
use crate::core::identity::Identity;
use crate::sync::lock;

/// How long an answer is kept while RBAC is not followed, or when it was
/// asked within [`AUTHORIZER_SETTLES`] of a change; and how long an
/// account is known to exist.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(30);
/// How long an answer is kept while the RBAC watch follows every change
/// (which forgets it): a bound for what no RBAC event tells, such as
/// changes the watch missed while it failed.
pub(crate) const KEPT_WHILE_FOLLOWED: Duration = Duration::from_secs(600);
/// After an RBAC change, how long answers are taken as possibly of the
/// rules before it.
const AUTHORIZER_SETTLES: Duration = Duration::from_secs(5);
/// Answers kept at most; past it, those expired are dropped first.
const KEPT_AT_MOST: usize = 100_000;

/// A review the API server did not answer.
#[derive(Debug, Error)]
#[error("could not ask the API server what {user} may read: {message}")]
pub(crate) struct ReviewFailed {
    pub(crate) user: String,
    pub(crate) message: String,
}

/// One question: may `user` (a ServiceAccount of `account_namespace`)
/// `verb` objects of `resource` in `namespace` (`name`, or every one)?
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Question {
    verb: &'static str,
    user: String,
    account_namespace: String,
    group: String,
    resource: String,
    namespace: String,
    name: Option<String>,
}

impl Question {
    /// The question for a ServiceAccount; none for the operator.
    fn of(identity: &Identity, verb: &'static str, kind: Kind, namespace: &str) -> Option<Self> {
        let Identity::ServiceAccount {
            namespace: account_namespace,
            ..
        } = identity
        else {
            return None;
        };
        let resource = kind.api_resource();
        Some(Question {
            verb,
            user: identity.impersonated_user()?,
            account_namespace: account_namespace.to_string(),
            group: resource.group,
            resource: resource.plural,
            namespace: namespace.to_owned(),
            name: None,
        })
    }
}

/// Unit tests only: what answers instead of the API server (`None`: no
/// answer).
#[cfg(test)]
type FakeAnswer = Box<dyn Fn(&Question) -> Option<bool> + Send + Sync>;

/// The watches of RBAC, by the names they report to the health check.
const RBAC_WATCHES: [&str; 4] = [
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
];

pub(crate) struct Access {
    client: kube::Client,
    /// Whether the RBAC watches work now (a failing one sees no change).
    health: std::sync::Arc<crate::ops::http::Health>,
    #[cfg(test)]
    fake: Option<FakeAnswer>,
    /// Answers, and until when each is kept.
    kept: Mutex<HashMap<Question, (bool, Instant)>>,
    /// When RBAC last changed; whether the RBAC watch has listed.
    changed_at: Mutex<Option<Instant>>,
    followed: std::sync::atomic::AtomicBool,
    /// ServiceAccounts seen to exist, and when (kept [`KEPT_FOR`], and
    /// forgotten with the answers; one missing is asked again each time,
    /// so that it counts once made).
    accounts: Mutex<HashMap<Identity, Instant>>,
    /// Bumped whenever RBAC changes: an answer asked before is not kept.
    epoch: AtomicU64,
    /// Reviews asked of the API server, for the tests and the metrics.
    asked: AtomicU64,
    /// Set by the first review asked: only then is RBAC followed (an
    /// operator whose rules all write as itself watches none of it).
    wanted: tokio::sync::watch::Sender<bool>,
}

impl Access {
    pub(crate) fn new(
        client: kube::Client,
        health: std::sync::Arc<crate::ops::http::Health>,
    ) -> Self {
        Self {
            client,
            health,
            #[cfg(test)]
            fake: None,
            kept: Mutex::new(HashMap::new()),
            changed_at: Mutex::new(None),
            followed: std::sync::atomic::AtomicBool::new(false),
            accounts: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            asked: AtomicU64::new(0),
            wanted: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Returns once some rule has asked what its ServiceAccount may do.
    pub(crate) async fn until_wanted(&self) {
        // The sender is held by `self`: the wait ends only when it is set.
        let _ = self.wanted.subscribe().wait_for(|wanted| *wanted).await;
    }

    /// The RBAC watch has listed every kind it follows: from now on a
    /// change is seen, and answers are kept longer.
    pub(crate) fn followed(&self) {
        self.followed.store(true, Ordering::SeqCst);
    }

    /// RBAC changed: every answer kept may be wrong now.
    pub(crate) fn forget(&self) {
        *lock(&self.changed_at) = Some(Instant::now());
        self.epoch.fetch_add(1, Ordering::SeqCst);
        lock(&self.kept).clear();
        // An account is often deleted with its RoleBindings.
        lock(&self.accounts).clear();
    }

    /// Whether `identity` may `get` the object `namespace/name` of `kind`.
    /// The operator itself reads everything it watches.
    pub(crate) async fn may_get(
        &self,
        identity: &Identity,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<bool, ReviewFailed> {
        let Some(mut question) = Question::of(identity, "get", kind, namespace) else {
            return Ok(true);
        };
        if self.answer(&question).await? {
            return Ok(true);
        }
        question.name = Some(name.to_owned());
        self.answer(&question).await
    }

    /// Whether `identity` may create objects of `kind` in `namespace`
    /// (where a rule whose consent is its rights may write). The operator
    /// is not asked about: its rules take the consent annotations.
    pub(crate) async fn may_create_in(
        &self,
        identity: &Identity,
        kind: Kind,
        namespace: &str,
    ) -> Result<bool, ReviewFailed> {
        match Question::of(identity, "create", kind, namespace) {
            Some(question) => self.answer(&question).await,
            None => Ok(false),
        }
    }

    /// Whether the ServiceAccount `identity` names exists (the operator
    /// itself always does); asked when a rule's writes as it fail, to say
    /// why plainly.
    pub(crate) async fn account_exists(&self, identity: &Identity) -> Result<bool, ReviewFailed> {
        let Identity::ServiceAccount { namespace, name } = identity else {
            return Ok(true);
        };
        #[cfg(test)]
        if self.fake.is_some() {
            return Ok(true);
        }
        let now = Instant::now();
        if lock(&self.accounts)
            .get(identity)
            .is_some_and(|at| now.duration_since(*at) < KEPT_FOR)
        {
            return Ok(true);
        }
        let exists = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
            self.client.clone(),
            namespace,
        )
        .get_metadata_opt(name)
        .await
        .map(|found| found.is_some())
        .map_err(|e| ReviewFailed {
            user: identity.to_string(),
            message: crate::error::describe(&e),
        })?;
        let mut accounts = lock(&self.accounts);
        if exists {
            if accounts.len() >= KEPT_AT_MOST {
                accounts.retain(|_, at| now.duration_since(*at) < KEPT_FOR);
            }
            accounts.insert(identity.clone(), now);
        } else {
            accounts.remove(identity);
        }
        Ok(exists)
    }

    /// The answer kept, or the API server's.
    async fn answer(&self, question: &Question) -> Result<bool, ReviewFailed> {
        let now = Instant::now();
        if let Some((allowed, until)) = lock(&self.kept).get(question)
            && now < *until
        {
            return Ok(*allowed);
        }
        self.wanted
            .send_if_modified(|wanted| !std::mem::replace(wanted, true));
        let epoch = self.epoch.load(Ordering::SeqCst);
        self.asked.fetch_add(1, Ordering::Relaxed);
        let allowed = self.ask(question).await?;
        let settled = lock(&self.changed_at).is_none_or(|at| now >= at + AUTHORIZER_SETTLES);
        let followed = self.followed.load(Ordering::SeqCst)
            && !RBAC_WATCHES.iter().any(|w| self.health.is_failing(w));
        let kept_for = if settled && followed {
            KEPT_WHILE_FOLLOWED
        } else {
            KEPT_FOR
        };
        let mut kept = lock(&self.kept);
        // Asked while RBAC changed: the answer may be of the old rules.
        if self.epoch.load(Ordering::SeqCst) == epoch {
            if kept.len() >= KEPT_AT_MOST {
                kept.retain(|_, (_, until)| now < *until);
            }
            // Still full: the answer that would expire first goes.
            if kept.len() >= KEPT_AT_MOST
                && let Some(first) = kept
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(q, _)| q.clone())
            {
                kept.remove(&first);
            }
            kept.insert(question.clone(), (allowed, now + kept_for));
        }
        Ok(allowed)
    }

    async fn ask(&self, question: &Question) -> Result<bool, ReviewFailed> {
        #[cfg(test)]
        if let Some(answer) = &self.fake {
            return answer(question).ok_or_else(|| ReviewFailed {
                user: question.user.clone(),
                message: "no answer".into(),
            });
        }
        // The groups the API server gives every token of a ServiceAccount:
        // a grant to them counts, as it would for the account itself.
        let groups = vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{}", question.account_namespace),
            "system:authenticated".to_owned(),
        ];
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(question.user.clone()),
                groups: Some(groups),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(question.group.clone()),
                    resource: Some(question.resource.clone()),
                    namespace: Some(question.namespace.clone()),
                    name: question.name.clone(),
                    verb: Some(question.verb.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewFailed {
                user: question.user.clone(),
                message: crate::error::describe(&e),
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    #[cfg(test)]
    fn answered_by(fake: FakeAnswer) -> Self {
        Self {
            fake: Some(fake),
            ..Self::new(
                crate::cluster::fake_objects::never_asked_client(),
                std::sync::Arc::new(crate::ops::http::Health::default()),
            )
        }
    }

    #[cfg(test)]
    fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }
}

/// Follow Roles, RoleBindings, ClusterRoles and ClusterRoleBindings as
/// metadata (nothing of them is kept) and call `changed` on every event:
/// whatever the change, a kept answer may be wrong now, and a write the
/// API server refused may be allowed. `listed` is called once all four
/// have listed (from then on every change is seen).
pub(crate) async fn follow_rbac(
    reader: &crate::cluster::reader::Reader,
    health: &std::sync::Arc<crate::ops::http::Health>,
    pause: &crate::core::backoff::ReadPause,
    changed: impl Fn() + Sync,
    listed: impl Fn() + Sync,
) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kube::core::PartialObjectMeta;
    use std::sync::atomic::AtomicBool;

    use crate::cluster::watch::{Change, Watching, follow, watch_config};

    let watching = |name| Watching {
        name,
        health,
        pause,
        stop_if_unserved: false,
    };
    let has_listed: [AtomicBool; 4] = Default::default();
    let (changed, listed, has_listed) = (&changed, &listed, &has_listed);
    let on_event = |which: usize| {
        move |change: Change<()>| {
            changed();
            if matches!(change, Change::Listed(_))
                && !has_listed[which].swap(true, Ordering::SeqCst)
                && has_listed.iter().all(|l| l.load(Ordering::SeqCst))
            {
                listed();
            }
        }
    };
    futures::join!(
        follow(
            reader.everywhere::<PartialObjectMeta<Role>>(),
            watch_config(),
            watching(RBAC_WATCHES[0]),
            |_| (),
            on_event(0),
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<RoleBinding>>(),
            watch_config(),
            watching(RBAC_WATCHES[1]),
            |_| (),
            on_event(1),
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<ClusterRole>>(),
            watch_config(),
            watching(RBAC_WATCHES[2]),
            |_| (),
            on_event(2),
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<ClusterRoleBinding>>(),
            watch_config(),
            watching(RBAC_WATCHES[3]),
            |_| (),
            on_event(3),
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    fn tenant() -> Identity {
        Identity::ServiceAccount {
            namespace: "team-a".into(),
            name: "copyrator".into(),
        }
    }

    /// The account may read every Secret of `team-a`, and in `shared` only
    /// the one named `ca` (while `granted` holds).
    fn access(granted: Arc<AtomicBool>) -> Access {
        Access::answered_by(Box::new(move |q| {
            assert_eq!(q.user, "system:serviceaccount:team-a:copyrator");
            assert_eq!((q.group.as_str(), q.resource.as_str()), ("", "secrets"));
            Some(match (q.verb, q.namespace.as_str(), q.name.as_deref()) {
                ("get", "team-a", _) => true,
                ("get", "shared", Some("ca")) => granted.load(Ordering::SeqCst),
                ("create", "team-b", None) => true,
                _ => false,
            })
        }))
    }

    #[tokio::test]
    async fn a_namespace_wide_grant_answers_for_every_object_there_with_one_review() {
        let access = access(Arc::new(AtomicBool::new(true)));
        for name in ["a", "b", "c"] {
            assert!(
                access
                    .may_get(&tenant(), Kind::Secret, "team-a", name)
                    .await
                    .expect("answered")
            );
        }
        assert_eq!(access.asked(), 1);
    }

    #[tokio::test]
    async fn rbac_is_wanted_only_once_a_service_account_is_asked_about() {
        let access = access(Arc::new(AtomicBool::new(true)));
        let wait = std::time::Duration::from_millis(50);
        // The operator reads without asking: nothing to follow.
        access
            .may_get(&Identity::Operator, Kind::Secret, "team-a", "ca")
            .await
            .expect("answered");
        assert!(
            tokio::time::timeout(wait, access.until_wanted())
                .await
                .is_err()
        );
        access
            .may_get(&tenant(), Kind::Secret, "team-a", "ca")
            .await
            .expect("answered");
        tokio::time::timeout(wait, access.until_wanted())
            .await
            .expect("wanted once a ServiceAccount's rights were asked");
    }

    #[tokio::test]
    async fn a_grant_by_name_is_asked_by_name_and_nothing_else_is_let_through() {
        let access = access(Arc::new(AtomicBool::new(true)));
        let who = tenant();
        let may = |name: &'static str| access.may_get(&who, Kind::Secret, "shared", name);
        assert!(may("ca").await.expect("answered"));
        assert!(!may("key").await.expect("answered"));
        // The namespace-wide refusal is kept; each name is asked once.
        assert_eq!(access.asked(), 3);
        assert!(!may("key").await.expect("answered"));
        assert_eq!(access.asked(), 3);
    }

    #[tokio::test]
    async fn a_change_of_rbac_is_seen_at_once_and_the_operator_reads_without_asking() {
        let granted = Arc::new(AtomicBool::new(true));
        let access = access(granted.clone());
        let who = tenant();
        let may = || access.may_get(&who, Kind::Secret, "shared", "ca");
        assert!(may().await.expect("answered"));
        granted.store(false, Ordering::SeqCst);
        assert!(may().await.expect("answered"), "kept a while");
        access.forget();
        assert!(
            !may().await.expect("answered"),
            "revoked, once RBAC changed"
        );
        let asked = access.asked();
        assert!(
            access
                .may_get(&Identity::Operator, Kind::Secret, "anywhere", "x")
                .await
                .expect("answered")
        );
        assert_eq!(access.asked(), asked);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_kept_long_only_while_rbac_is_followed_and_settled() {
        let access = access(Arc::new(AtomicBool::new(true)));
        let who = tenant();
        let may = || access.may_get(&who, Kind::Secret, "team-a", "ca");
        may().await.expect("answered");
        tokio::time::advance(KEPT_FOR).await;
        may().await.expect("answered");
        assert_eq!(
            access.asked(),
            2,
            "not followed: asked again after {KEPT_FOR:?}"
        );
        // Followed, its first lists forget what was kept; asked at once
        // after them, an answer is kept briefly still.
        access.followed();
        access.forget();
        may().await.expect("answered");
        tokio::time::advance(KEPT_FOR).await;
        may().await.expect("answered");
        assert_eq!(access.asked(), 4, "asked just after a change: kept briefly");
        tokio::time::advance(KEPT_WHILE_FOLLOWED - Duration::from_secs(1)).await;
        may().await.expect("answered");
        assert_eq!(access.asked(), 4, "followed and settled: kept");
        tokio::time::advance(Duration::from_secs(1)).await;
        may().await.expect("answered");
        assert_eq!(access.asked(), 5, "not past {KEPT_WHILE_FOLLOWED:?}");
        access.forget();
        may().await.expect("answered");
        assert_eq!(access.asked(), 6, "a change forgets it at once");
        // While an RBAC watch fails, a change could go unseen: kept briefly.
        tokio::time::advance(AUTHORIZER_SETTLES).await;
        access.health.watch_failed("rolebindings");
        access.forget();
        tokio::time::advance(AUTHORIZER_SETTLES).await;
        may().await.expect("answered");
        tokio::time::advance(KEPT_FOR).await;
        may().await.expect("answered");
        assert_eq!(access.asked(), 8, "a failing RBAC watch: kept {KEPT_FOR:?}");
        // Working again: the next answer is kept long.
        access.health.watch_ok("rolebindings");
        tokio::time::advance(KEPT_FOR).await;
        may().await.expect("answered");
        tokio::time::advance(KEPT_FOR).await;
        may().await.expect("answered");
        assert_eq!(access.asked(), 9, "working again: kept long");
    }

    #[tokio::test]
    async fn where_the_account_may_create_is_asked_of_the_namespace() {
        let access = access(Arc::new(AtomicBool::new(true)));
        let who = tenant();
        let may = |namespace: &'static str| access.may_create_in(&who, Kind::Secret, namespace);
        assert!(may("team-b").await.expect("answered"));
        assert!(!may("team-c").await.expect("answered"));
        assert!(
            !access
                .may_create_in(&Identity::Operator, Kind::Secret, "team-b")
                .await
                .expect("answered"),
            "the operator's rules take the annotations"
        );
    }

    #[tokio::test]
    async fn an_unanswered_review_is_an_error_not_a_refusal() {
        let access = Access::answered_by(Box::new(|_| None));
        assert!(
            access
                .may_get(&tenant(), Kind::Secret, "team-a", "x")
                .await
                .is_err()
        );
    }
}
