//! What a rule's ServiceAccount may read, as the API server says it (a
//! SubjectAccessReview): the shared watches hold every source as the
//! operator reads it, and a rule that writes as a ServiceAccount uses only
//! the sources that account may `get` itself.
//!
//! Answers are kept briefly ([`KEPT_FOR`]) and all forgotten at once when
//! RBAC changes ([`Access::forget`], called on every event of the RBAC
//! watch): a Role granted or revoked counts from the next pass. A
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

/// How long an answer is kept when RBAC does not change.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(30);
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

pub(crate) struct Access {
    client: kube::Client,
    #[cfg(test)]
    fake: Option<FakeAnswer>,
    kept: Mutex<HashMap<Question, (bool, Instant)>>,
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
    pub(crate) fn new(client: kube::Client) -> Self {
        Self {
            client,
            #[cfg(test)]
            fake: None,
            kept: Mutex::new(HashMap::new()),
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

    /// RBAC changed: every answer kept may be wrong now.
    pub(crate) fn forget(&self) {
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
        if let Some((allowed, at)) = lock(&self.kept).get(question)
            && now.duration_since(*at) < KEPT_FOR
        {
            return Ok(*allowed);
        }
        self.wanted
            .send_if_modified(|wanted| !std::mem::replace(wanted, true));
        let epoch = self.epoch.load(Ordering::SeqCst);
        self.asked.fetch_add(1, Ordering::Relaxed);
        let allowed = self.ask(question).await?;
        let mut kept = lock(&self.kept);
        // Asked while RBAC changed: the answer may be of the old rules.
        if self.epoch.load(Ordering::SeqCst) == epoch {
            if kept.len() >= KEPT_AT_MOST {
                kept.retain(|_, (_, at)| now.duration_since(*at) < KEPT_FOR);
            }
            if kept.len() < KEPT_AT_MOST {
                kept.insert(question.clone(), (allowed, now));
            }
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
            ..Self::new(crate::cluster::fake_objects::never_asked_client())
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
/// API server refused may be allowed.
pub(crate) async fn follow_rbac(
    reader: &crate::cluster::reader::Reader,
    health: &std::sync::Arc<crate::ops::http::Health>,
    pause: &crate::core::backoff::ReadPause,
    changed: impl Fn() + Sync,
) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kube::core::PartialObjectMeta;

    use crate::cluster::watch::{Watching, follow, watch_config};

    let watching = |name| Watching {
        name,
        health,
        pause,
        stop_if_unserved: false,
    };
    let changed = &changed;
    let on_event = |_: crate::cluster::watch::Change<()>| changed();
    futures::join!(
        follow(
            reader.everywhere::<PartialObjectMeta<Role>>(),
            watch_config(),
            watching("roles"),
            |_| (),
            on_event,
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<RoleBinding>>(),
            watch_config(),
            watching("rolebindings"),
            |_| (),
            on_event,
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<ClusterRole>>(),
            watch_config(),
            watching("clusterroles"),
            |_| (),
            on_event,
        ),
        follow(
            reader.everywhere::<PartialObjectMeta<ClusterRoleBinding>>(),
            watch_config(),
            watching("clusterrolebindings"),
            |_| (),
            on_event,
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
