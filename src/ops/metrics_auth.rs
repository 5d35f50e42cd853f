//! Who may read /metrics when `--metrics-auth` is on: a caller whose
//! bearer token the API server accepts (a TokenReview) and who may `get`
//! the non-resource URL `/metrics` (a SubjectAccessReview), as the API
//! server's own /metrics is guarded. The metrics name every rule and every
//! member cluster; tenants have no business reading them. Answers are
//! kept for a minute, by a digest of the token (the token itself is not
//! kept), so that a scrape every few seconds costs two reviews a minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use ring::digest::{SHA256, digest};
use tokio::time::Instant;

/// How long an answer is kept.
const KEPT_FOR: Duration = Duration::from_secs(60);
/// Answers kept at most (a flood of made-up tokens forgets, not grows).
const KEPT_AT_MOST: usize = 1024;

/// What a caller of /metrics is let do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// Authenticated, but may not get /metrics: 403.
    Forbidden,
    Allowed,
    /// The reviews could not be asked: 503, and nothing kept.
    Unavailable,
}

pub(crate) struct MetricsAuth {
    client: kube::Client,
    kept: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
}

impl MetricsAuth {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self {
            client,
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict for a request with this `Authorization` header.
    pub(crate) async fn judge(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Verdict::Unauthenticated;
        };
        let mut key = [0u8; 32];
        key.copy_from_slice(digest(&SHA256, token.as_bytes()).as_ref());
        let now = Instant::now();
        if let Some((at, verdict)) = crate::sync::lock(&self.kept).get(&key)
            && now.duration_since(*at) < KEPT_FOR
        {
            return *verdict;
        }
        let verdict = self.review(token).await;
        if verdict != Verdict::Unavailable {
            let mut kept = crate::sync::lock(&self.kept);
            kept.retain(|_, (at, _)| now.duration_since(*at) < KEPT_FOR);
            if kept.len() >= KEPT_AT_MOST {
                kept.clear();
            }
            kept.insert(key, (now, verdict));
        }
        verdict
    }

    async fn review(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answer = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(
                    error = crate::error::describe(&e),
                    "a TokenReview for /metrics failed"
                );
                return Verdict::Unavailable;
            }
        };
        let Some(user) = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
        else {
            return Verdict::Unauthenticated;
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
            Ok(_) => Verdict::Forbidden,
            Err(e) => {
                tracing::warn!(
                    error = crate::error::describe(&e),
                    "a SubjectAccessReview for /metrics failed"
                );
                Verdict::Unavailable
            }
        }
    }
}
