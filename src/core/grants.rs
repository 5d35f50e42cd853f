//! A copy grants in its target only what its source granted in its own
//! namespace. A RoleBinding grants the rules of the role it binds: a
//! ClusterRole's are the same in every namespace, but a Role's are those of
//! the Role of that name in the binding's own namespace. A RoleBinding copy
//! that binds a Role is therefore written only where that namespace's Role
//! of that name grants exactly what the source namespace's does. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::kinds::{Kind, RBAC_GROUP};
use crate::cache::roles::RoleIndex;

/// What every refusal ends with: the principle it upholds.
const PRINCIPLE: &str =
    "a copy grants in its target only what its source grants in its own namespace";

/// Why a copy of `kind` with `payload`, whose source is in
/// `source_namespace`, may not be written into `target_namespace`, judged
/// by the cluster's `roles`; `None` where it grants there what the source
/// grants in its own namespace (always, but for a RoleBinding to a Role).
pub(crate) fn refusal(
    kind: Kind,
    payload: &BTreeMap<String, Value>,
    source_namespace: &str,
    target_namespace: &str,
    roles: &RoleIndex,
) -> Option<String> {
    if !kind.is_role_binding() {
        return None;
    }
    let role_ref = payload.get("roleRef");
    let field = |name: &str| role_ref.and_then(|r| r.get(name)).and_then(Value::as_str);
    let (Some(RBAC_GROUP), Some(role_kind), Some(name)) =
        (field("apiGroup"), field("kind"), field("name"))
    else {
        return Some(format!(
            "its roleRef names no Role or ClusterRole of {RBAC_GROUP}; {PRINCIPLE}"
        ));
    };
    match role_kind {
        // The same rules wherever it is bound.
        "ClusterRole" => None,
        "Role" => role_refusal(name, source_namespace, target_namespace, roles),
        _ => Some(format!(
            "its roleRef names a {role_kind}, not a Role or ClusterRole; {PRINCIPLE}"
        )),
    }
}

/// [`refusal`] of a RoleBinding to the Role `name`.
fn role_refusal(
    name: &str,
    source_namespace: &str,
    target_namespace: &str,
    roles: &RoleIndex,
) -> Option<String> {
    let Some(granted) = roles.get(source_namespace, name) else {
        return Some(format!(
            "the Role {name} it binds does not exist in {source_namespace}, so its source grants nothing; {PRINCIPLE}"
        ));
    };
    match roles.get(target_namespace, name) {
        Some(there) if there == granted => None,
        // A Role of that name made there later would grant through the copy.
        None => Some(format!(
            "the Role {name} it binds does not exist in {target_namespace}; {PRINCIPLE}"
        )),
        Some(_) => Some(format!(
            "the Role {name} it binds grants other rules in {target_namespace} than in {source_namespace}; {PRINCIPLE}"
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::kinds::Discovered;
    use crate::cache::roles::tests::role;
    use serde_json::json;

    pub(crate) fn role_binding_kind() -> Kind {
        Kind::register(&Discovered {
            group: RBAC_GROUP.into(),
            version: "v1".into(),
            kind: "RoleBinding".into(),
            plural: "rolebindings".into(),
        })
        .expect("RoleBinding registered")
    }

    pub(crate) fn binding_to(role_kind: &str, name: &str) -> BTreeMap<String, Value> {
        BTreeMap::from([
            (
                "roleRef".to_owned(),
                json!({"apiGroup": RBAC_GROUP, "kind": role_kind, "name": name}),
            ),
            (
                "subjects".to_owned(),
                json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "src"}]),
            ),
        ])
    }

    fn secret_reader() -> Value {
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    }

    #[test]
    fn a_binding_to_a_role_that_grants_the_same_in_both_namespaces_is_written() {
        let mut roles = RoleIndex::default();
        roles.upsert(role("src", "reader", secret_reader()));
        roles.upsert(role(
            "team",
            "reader",
            json!([{"verbs": ["get", "get"], "resources": ["secrets"], "apiGroups": [""]}]),
        ));
        let payload = binding_to("Role", "reader");
        assert_eq!(
            refusal(role_binding_kind(), &payload, "src", "team", &roles),
            None
        );
    }

    #[test]
    fn a_binding_to_a_role_that_differs_or_is_missing_is_refused() {
        let kind = role_binding_kind();
        let payload = binding_to("Role", "reader");
        let mut roles = RoleIndex::default();
        // The attack: an empty Role in the source, a real one in the target.
        roles.upsert(role("src", "reader", json!([])));
        roles.upsert(role("team", "reader", secret_reader()));
        let why = refusal(kind, &payload, "src", "team", &roles).expect("refused");
        assert!(
            why.starts_with("the Role reader it binds grants other rules in team than in src;"),
            "{why}"
        );
        assert!(why.ends_with(PRINCIPLE), "{why}");

        let why = refusal(kind, &payload, "src", "elsewhere", &roles).expect("refused");
        assert!(why.contains("does not exist in elsewhere"), "{why}");

        roles.remove("src", "reader");
        let why = refusal(kind, &payload, "src", "team", &roles).expect("refused");
        assert!(
            why.contains("does not exist in src, so its source grants nothing"),
            "{why}"
        );
    }

    #[test]
    fn a_binding_to_a_cluster_role_and_other_kinds_are_not_judged() {
        let roles = RoleIndex::default();
        let kind = role_binding_kind();
        assert_eq!(
            refusal(
                kind,
                &binding_to("ClusterRole", "view"),
                "src",
                "team",
                &roles
            ),
            None,
            "a ClusterRole grants the same everywhere"
        );
        assert_eq!(
            refusal(
                Kind::ConfigMap,
                &binding_to("Role", "reader"),
                "src",
                "team",
                &roles
            ),
            None
        );
        for role_ref in [
            json!(null),
            json!({"apiGroup": RBAC_GROUP, "kind": "Group", "name": "x"}),
            json!({"apiGroup": "example.com", "kind": "ClusterRole", "name": "view"}),
            json!({"apiGroup": RBAC_GROUP, "kind": "Role"}),
        ] {
            let payload = BTreeMap::from([("roleRef".to_owned(), role_ref.clone())]);
            assert!(
                refusal(kind, &payload, "src", "team", &roles).is_some(),
                "{role_ref}"
            );
        }
    }
}
