//! The Roles of one cluster, each reduced to a digest of what it grants:
//! a RoleBinding copy is written only where the Role it binds grants what
//! the source's Role grants in the source's namespace, and comparing two
//! digests says that without holding the Roles' rules.

use std::collections::HashMap;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role};

/// SHA-256 of a Role's rules in their canonical form (see [`RulesDigest::of`]).
/// A cryptographic digest, not a fast hash: whoever writes a source's Role
/// must not be able to make it pass for a target's Role with other rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RulesDigest([u8; 32]);

impl RulesDigest {
    /// The digest of `rules`, equal for two lists that grant the same by
    /// the same rules in any order: each rule's lists are sorted and
    /// deduplicated (a missing list is an empty one), then the rules are.
    /// Rules that grant the same but are split differently (one rule for
    /// two verbs, or two rules) digest differently: a difference is
    /// refused, never taken for the same.
    pub(crate) fn of(rules: &[PolicyRule]) -> Self {
        fn canonical(list: Option<&Vec<String>>) -> Vec<&str> {
            let mut list: Vec<&str> = list.into_iter().flatten().map(String::as_str).collect();
            list.sort_unstable();
            list.dedup();
            list
        }
        let mut normalized: Vec<[Vec<&str>; 5]> = rules
            .iter()
            .map(|rule| {
                [
                    canonical(rule.api_groups.as_ref()),
                    canonical(rule.resources.as_ref()),
                    canonical(rule.resource_names.as_ref()),
                    canonical(rule.non_resource_urls.as_ref()),
                    canonical(Some(&rule.verbs)),
                ]
            })
            .collect();
        normalized.sort_unstable();
        normalized.dedup();
        // Every count and length written before what it counts: no two
        // forms encode alike.
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(&(normalized.len() as u64).to_le_bytes());
        for rule in &normalized {
            for list in rule {
                context.update(&(list.len() as u64).to_le_bytes());
                for item in list {
                    context.update(&(item.len() as u64).to_le_bytes());
                    context.update(item.as_bytes());
                }
            }
        }
        let digest = context.finish();
        let mut out = [0; 32];
        out.copy_from_slice(digest.as_ref());
        Self(out)
    }
}

/// A Role as the index holds it: where it is, and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RoleRules {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) digest: RulesDigest,
}

impl RoleRules {
    pub(crate) fn of(role: &Role) -> Self {
        Self {
            namespace: role.metadata.namespace.clone().unwrap_or_default(),
            name: role.metadata.name.clone().unwrap_or_default(),
            digest: RulesDigest::of(role.rules.as_deref().unwrap_or_default()),
        }
    }
}

/// Every Role of a cluster, by namespace and name.
#[derive(Debug, Default)]
pub(crate) struct RoleIndex {
    by_namespace: HashMap<String, HashMap<String, RulesDigest>>,
}

impl RoleIndex {
    /// What the Role `namespace/name` grants, if there is one.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<RulesDigest> {
        self.by_namespace.get(namespace)?.get(name).copied()
    }

    /// Takes `role`; returns whether what it grants changed (it is new, or
    /// its rules are).
    pub(crate) fn upsert(&mut self, role: RoleRules) -> bool {
        let previous = self
            .by_namespace
            .entry(role.namespace)
            .or_default()
            .insert(role.name, role.digest);
        previous != Some(role.digest)
    }

    /// Forgets the Role `namespace/name`; returns whether there was one.
    pub(crate) fn remove(&mut self, namespace: &str, name: &str) -> bool {
        let Some(roles) = self.by_namespace.get_mut(namespace) else {
            return false;
        };
        let removed = roles.remove(name).is_some();
        if roles.is_empty() {
            self.by_namespace.remove(namespace);
        }
        removed
    }

    /// Replaces every Role with `listed`.
    pub(crate) fn replace_all(&mut self, listed: Vec<RoleRules>) {
        self.by_namespace.clear();
        for role in listed {
            self.upsert(role);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_namespace.values().map(HashMap::len).sum()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn rules(value: serde_json::Value) -> Vec<PolicyRule> {
        serde_json::from_value(value).expect("PolicyRules")
    }

    pub(crate) fn role(namespace: &str, name: &str, rules_json: serde_json::Value) -> RoleRules {
        RoleRules {
            namespace: namespace.into(),
            name: name.into(),
            digest: RulesDigest::of(&rules(rules_json)),
        }
    }

    #[test]
    fn the_same_rules_in_any_order_digest_alike() {
        let one = rules(json!([
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
        ]));
        let reordered = rules(json!([
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
            {"verbs": ["list", "get", "get"], "resources": ["configmaps", "secrets"], "apiGroups": [""]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
        ]));
        assert_eq!(RulesDigest::of(&one), RulesDigest::of(&reordered));
        assert_eq!(
            RulesDigest::of(&[]),
            RulesDigest::of(&rules(json!([]))),
            "no rules at all"
        );
    }

    #[test]
    fn any_difference_in_what_is_granted_digests_apart() {
        let base = json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]});
        let digest = |rule: serde_json::Value| RulesDigest::of(&rules(json!([rule])));
        let of_base = digest(base.clone());
        for other in [
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}),
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}),
            json!({"apiGroups": ["apps"], "resources": ["secrets"], "verbs": ["get"]}),
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                   "resourceNames": ["db"]}),
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}),
            // The same strings in other fields.
            json!({"apiGroups": ["secrets"], "resources": [""], "verbs": ["get"]}),
        ] {
            assert_ne!(digest(other.clone()), of_base, "{other}");
        }
        assert_ne!(
            RulesDigest::of(&[]),
            of_base,
            "an empty Role grants nothing"
        );
        // Joined strings are no other strings.
        assert_ne!(
            digest(json!({"apiGroups": [""], "resources": ["a", "b"], "verbs": ["get"]})),
            digest(json!({"apiGroups": [""], "resources": ["a\",\"b"], "verbs": ["get"]})),
        );
    }

    #[test]
    fn the_index_says_when_what_a_role_grants_changed() {
        let mut index = RoleIndex::default();
        let reader = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        assert!(index.upsert(role("a", "reader", reader.clone())), "new");
        assert!(
            !index.upsert(role("a", "reader", reader.clone())),
            "the same rules"
        );
        assert!(index.upsert(role("a", "reader", json!([]))), "emptied");
        assert_eq!(index.get("a", "reader"), Some(RulesDigest::of(&[])));
        assert_eq!(index.get("b", "reader"), None);
        index.upsert(role("b", "reader", reader.clone()));
        assert_eq!(index.len(), 2);
        assert!(index.remove("a", "reader"));
        assert!(!index.remove("a", "reader"));
        assert_eq!(index.get("a", "reader"), None);
        index.replace_all(vec![role("c", "x", reader)]);
        assert_eq!((index.len(), index.get("b", "reader")), (1, None));
        index.replace_all(Vec::new());
        assert!(index.is_empty());
    }
}
