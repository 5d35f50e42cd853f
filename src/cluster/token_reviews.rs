//! Who a caller of /metrics is and whether it may read them (with
//! `--metrics-auth`): the TokenReview and SubjectAccessReview that
//! `ops::metrics_auth` asks, within its bounds, of the API server.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use crate::cluster::reader::Reader;
use crate::ops::metrics_auth::{Reviewer, Verdict};

/// The API server's TokenReview and SubjectAccessReview.
pub(crate) struct TokenReviewer {
    reader: Reader,
}

impl TokenReviewer {
    pub(crate) fn new(reader: Reader) -> Self {
        Self { reader }
    }
}

impl Reviewer for TokenReviewer {
    async fn review(&self, token: String) -> Verdict {
        // A String in the newest API types, optional in the floor's.
        #[allow(
            clippy::useless_conversion,
            reason = "needed with --features kubernetes-floor"
        )]
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.into(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answer = match self.reader.token_review(&review).await {
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
        match self.reader.subject_review(&access).await {
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
