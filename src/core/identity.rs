//! Whom a rule's writes are sent as: the operator itself, or a
//! ServiceAccount of the rule's own namespace that the operator
//! impersonates, so that the API server, not Copyrator's code, decides
//! what the rule may write.

use std::fmt;
use std::sync::Arc;

/// How rules outside the operator's namespace (tenant rules) act
/// (`--tenant-identity`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TenantIdentity {
    /// With the operator's own identity: what keeps a tenant inside its
    /// rights is Copyrator's consent checks alone.
    #[default]
    Operator,
    /// As a ServiceAccount of the rule's namespace (`spec.serviceAccountName`,
    /// else `--default-service-account`), impersonated: the API server
    /// refuses what that ServiceAccount may not do.
    ServiceAccount,
}

/// Whom a request is sent as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Identity {
    /// The operator's own identity.
    #[default]
    Operator,
    /// The ServiceAccount `namespace/name`, impersonated.
    ServiceAccount { namespace: Arc<str>, name: Arc<str> },
}

impl Identity {
    /// The user name the API server knows the identity by, when it is
    /// impersonated (the `Impersonate-User` header's value).
    pub(crate) fn impersonated_user(&self) -> Option<String> {
        match self {
            Identity::Operator => None,
            Identity::ServiceAccount { namespace, name } => {
                Some(format!("system:serviceaccount:{namespace}:{name}"))
            }
        }
    }

    /// Whom a rule of `rule_namespace` writes as: the ServiceAccount it
    /// names; else, for a tenant rule under
    /// [`TenantIdentity::ServiceAccount`], the default one; else the
    /// operator.
    pub(crate) fn of_rule(
        rule_namespace: &str,
        named: Option<&str>,
        tenant: bool,
        mode: TenantIdentity,
        default_account: &str,
    ) -> Identity {
        let account = match named {
            Some(name) => name,
            None if tenant && mode == TenantIdentity::ServiceAccount => default_account,
            None => return Identity::Operator,
        };
        Identity::ServiceAccount {
            namespace: rule_namespace.into(),
            name: account.into(),
        }
    }
}

/// As `status.identity` says it: `operator`, or the ServiceAccount's user name.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.impersonated_user() {
            Some(user) => f.write_str(&user),
            None => f.write_str("operator"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(named: Option<&str>, tenant: bool, mode: TenantIdentity) -> String {
        Identity::of_rule("team-a", named, tenant, mode, "copyrator").to_string()
    }

    #[test]
    fn a_tenant_rule_acts_as_its_namespaces_service_account_when_asked() {
        assert_eq!(
            of(None, true, TenantIdentity::ServiceAccount),
            "system:serviceaccount:team-a:copyrator"
        );
        assert_eq!(
            of(Some("writer"), true, TenantIdentity::ServiceAccount),
            "system:serviceaccount:team-a:writer"
        );
        // Opted out: tenant rules act as the operator.
        assert_eq!(of(None, true, TenantIdentity::Operator), "operator");
    }

    #[test]
    fn a_named_service_account_is_always_the_one_written_as() {
        // An admin rule (not a tenant's) acts as the operator unless it
        // names an account; a name is honoured whatever the mode, since
        // it can only narrow what the rule may do.
        assert_eq!(of(None, false, TenantIdentity::ServiceAccount), "operator");
        assert_eq!(
            of(Some("writer"), false, TenantIdentity::Operator),
            "system:serviceaccount:team-a:writer"
        );
        assert_eq!(
            of(Some("writer"), true, TenantIdentity::Operator),
            "system:serviceaccount:team-a:writer"
        );
    }
}
