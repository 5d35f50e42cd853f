//! The kinds of object a rule can copy. Adding a kind is an entry in
//! [`KINDS`] and a variant of [`Kind`], nothing more.

use kube::core::{ApiResource, GroupVersionKind};
use serde::{Deserialize, Serialize};

/// A kind of object that rules copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    ConfigMap,
    Secret,
}

/// What the operator needs to know about a kind.
#[derive(Debug)]
pub struct KindInfo {
    pub kind: Kind,
    /// The value of `ruleType` that selects this kind.
    pub rule_type: &'static str,
    pub api_kind: &'static str,
    pub plural: &'static str,
    /// Top-level fields that make up the content of an object of this kind.
    pub payload_fields: &'static [&'static str],
    /// Payload fields that map data keys to values (`transform.keys` selects
    /// and renames their keys).
    pub data_fields: &'static [&'static str],
    /// Payload fields the API server never lets change on an existing object.
    pub immutable_fields: &'static [&'static str],
    /// `type` values of objects of this kind that are never copied, and why.
    pub never_copied_types: &'static [(&'static str, &'static str)],
}

pub static KINDS: [KindInfo; 2] = [
    KindInfo {
        kind: Kind::ConfigMap,
        rule_type: "configmap",
        api_kind: "ConfigMap",
        plural: "configmaps",
        payload_fields: &["data", "binaryData", "immutable"],
        data_fields: &["data", "binaryData"],
        immutable_fields: &[],
        never_copied_types: &[],
    },
    KindInfo {
        kind: Kind::Secret,
        rule_type: "secret",
        api_kind: "Secret",
        plural: "secrets",
        // The API server folds `stringData` into `data`; it never comes back.
        payload_fields: &["data", "type", "immutable"],
        data_fields: &["data"],
        immutable_fields: &["type"],
        never_copied_types: &[
            (
                "kubernetes.io/service-account-token",
                "bound to a ServiceAccount of its own namespace",
            ),
            (
                "helm.sh/release.v1",
                "a copy would make Helm see a release that is not there",
            ),
        ],
    },
];

impl Kind {
    pub fn info(self) -> &'static KindInfo {
        match self {
            Kind::ConfigMap => &KINDS[0],
            Kind::Secret => &KINDS[1],
        }
    }

    pub fn all() -> impl Iterator<Item = Kind> {
        KINDS.iter().map(|info| info.kind)
    }

    pub fn from_rule_type(rule_type: &str) -> Option<Kind> {
        KINDS
            .iter()
            .find(|info| info.rule_type == rule_type)
            .map(|info| info.kind)
    }

    pub fn api_resource(self) -> ApiResource {
        let info = self.info();
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", info.api_kind),
            info.plural,
        )
    }

    /// Server-side field selector that leaves out the types never copied.
    pub fn source_field_selector(self) -> Option<String> {
        let types = self.info().never_copied_types;
        if types.is_empty() {
            return None;
        }
        Some(
            types
                .iter()
                .map(|(t, _)| format!("type!={t}"))
                .collect::<Vec<_>>()
                .join(","),
        )
    }

    /// Why an object of this kind with this `type` is never copied, if it is not.
    pub fn never_copied_reason(self, object_type: Option<&str>) -> Option<&'static str> {
        let object_type = object_type?;
        self.info()
            .never_copied_types
            .iter()
            .find(|(t, _)| *t == object_type)
            .map(|(_, why)| *why)
    }

    pub fn name(self) -> &'static str {
        self.info().api_kind
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_types_map_to_kinds() {
        assert_eq!(Kind::from_rule_type("configmap"), Some(Kind::ConfigMap));
        assert_eq!(Kind::from_rule_type("secret"), Some(Kind::Secret));
        assert_eq!(Kind::from_rule_type("Secret"), None);
        for kind in Kind::all() {
            assert_eq!(kind.info().kind, kind, "KINDS entry out of order");
        }
    }

    #[test]
    fn secrets_exclude_token_and_helm_types() {
        assert_eq!(
            Kind::Secret.source_field_selector().as_deref(),
            Some("type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1")
        );
        assert!(
            Kind::Secret
                .never_copied_reason(Some("helm.sh/release.v1"))
                .is_some()
        );
        assert!(Kind::Secret.never_copied_reason(Some("Opaque")).is_none());
        assert_eq!(Kind::ConfigMap.source_field_selector(), None);
    }
}
