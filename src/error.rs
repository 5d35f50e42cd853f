//! The operator's errors, and the one place where user-facing text is
//! rendered from an API error ([`describe`]): logs, statuses and Events
//! all say an API server's refusal in its own words. A member cluster's
//! client has already put a Status of its own (the status code only) in
//! place of any error answer that is not a Kubernetes Status
//! (`cluster::client::ApiServer::Member`), and an answer that cannot be
//! read is said by where it broke, never by what it held.

use thiserror::Error;

/// Everything that can go wrong in the operator, with the context a user needs.
#[derive(Debug, Error)]
pub(crate) enum Error {
    #[error("updating the status of rule {rule}: {}", describe(.source))]
    Status {
        rule: String,
        #[source]
        source: kube::Error,
    },

    #[error("updating the finalizer of rule {rule}: {}", describe(.source))]
    Finalizer {
        rule: String,
        #[source]
        source: kube::Error,
    },

    #[error("deleting the copies of rule {rule}: {count} could not be deleted; first: {first}")]
    Cleanup {
        rule: String,
        count: usize,
        first: String,
    },

    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("the HTTP server cannot listen on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },

    #[error("looking up {what}: {}", describe(.source))]
    Lookup {
        what: String,
        #[source]
        source: kube::Error,
    },

    #[error("invalid setting: {0}")]
    Config(String),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// How the API server words a refusal by RBAC's escalation prevention.
const RBAC_ESCALATION: &str = "is attempting to grant RBAC permissions not currently held";

/// An API error in the API server's own words ("configmaps are frozen in
/// this namespace (Forbidden, 403)"), never a debug dump.
pub(crate) fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status)
            if status.code == 403 && status.message.contains(RBAC_ESCALATION) =>
        {
            // The API server lists every permission missing, which can be
            // hundreds of lines: the first sentence says enough.
            let refused = status
                .message
                .split_once(RBAC_ESCALATION)
                .map_or(status.message.as_str(), |(before, _)| before);
            format!(
                "RBAC escalation: {refused}{RBAC_ESCALATION} (Forbidden, 403); the operator may grant \
                 only what it holds: give its ServiceAccount the permissions of the role, or `bind` \
                 (RoleBindings) / `escalate` (Roles) on roles (the chart's rbacCopy)"
            )
        }
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() {
                "the API server refused the request"
            } else {
                status.message.as_str()
            };
            match (status.reason.is_empty(), status.code) {
                (false, 0) => format!("{message} ({})", status.reason),
                (false, code) => format!("{message} ({}, {code})", status.reason),
                (true, 0) => message.to_owned(),
                (true, code) => format!("{message} (HTTP {code})"),
            }
        }
        // serde's words can quote the answer (a value of an unexpected
        // type: a Secret's data, or a page of whatever answered).
        kube::Error::SerdeError(err) => {
            let fault = match err.classify() {
                serde_json::error::Category::Io => "could not be read",
                serde_json::error::Category::Syntax => "is not JSON",
                serde_json::error::Category::Data => "is not of the shape expected",
                serde_json::error::Category::Eof => "ends too soon",
            };
            format!(
                "the API server's answer {fault} (line {}, column {}); the parser's words are \
                 withheld, as they may quote the answer",
                err.line(),
                err.column()
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn an_rbac_escalation_refusal_says_so_in_one_line() {
        let err = refusal(
            403,
            "rolebindings.rbac.authorization.k8s.io \"view\" is forbidden: user \"op\" (groups=[]) \
             is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], \
             Resources:[\"pods\"], Verbs:[\"get\"]}",
        );
        let said = describe(&err);
        assert!(said.starts_with("RBAC escalation: "), "{said}");
        assert!(
            !said.contains("APIGroups"),
            "the permission list is left out: {said}"
        );
        assert!(said.contains("`bind`"), "{said}");
        // Any other refusal is said in the API server's words.
        let other = describe(&refusal(403, "configmaps are frozen"));
        assert_eq!(other, "configmaps are frozen (Forbidden, 403)");
    }

    #[test]
    fn an_answer_that_cannot_be_read_is_said_without_quoting_it() {
        let err = serde_json::from_str::<Vec<u32>>(r#"[1, "c2VjcmV0LXZhbHVl"]"#)
            .expect_err("not numbers");
        assert!(
            err.to_string().contains("c2VjcmV0LXZhbHVl"),
            "serde quotes it"
        );
        let said = describe(&kube::Error::SerdeError(err));
        assert!(!said.contains("c2VjcmV0LXZhbHVl"), "{said}");
        assert!(said.contains("line 1, column"), "{said}");
        assert!(said.contains("not of the shape expected"), "{said}");
    }
}
