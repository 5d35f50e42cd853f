//! The kinds of object a rule can copy: ConfigMaps and Secrets, known
//! here with their rules, and any namespaced kind a rule names by
//! `objectType`, registered once API discovery has resolved it. Kinds are
//! never unregistered, and at most [`MAX_KINDS`] exist, so that a [`Kind`]
//! is a small copyable handle and its [`KindInfo`] lives for the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use kube::core::{ApiResource, GroupVersionKind};
use serde::{Serialize, Serializer};

/// Kinds one process copies at most: each costs a watch and an index.
pub(crate) const MAX_KINDS: usize = 64;

/// A kind of object that rules copy: a handle into the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(u8);

/// Which top-level fields make up the content of an object of a kind.
#[derive(Debug)]
pub(crate) enum Payload {
    /// These, and no others (the fields the API server adds are left out).
    Fields(&'static [&'static str]),
    /// Every top-level field but `apiVersion`, `kind`, `metadata` and `status`.
    AllButMetadataAndStatus,
}

/// What the operator needs to know about a kind.
#[derive(Debug)]
pub(crate) struct KindInfo {
    /// The value of `ruleType` that selects this kind (`configmap`), or
    /// `Kind.group` for a kind named by `objectType`.
    pub(crate) rule_type: &'static str,
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) api_kind: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) payload: Payload,
    /// Payload fields that map data keys to values (`transform.keys` selects
    /// and renames their keys).
    pub(crate) data_fields: &'static [&'static str],
    /// Payload fields the API server never lets change on an existing object.
    pub(crate) immutable_fields: &'static [&'static str],
    /// `type` values of objects of this kind that are never copied, and why.
    pub(crate) never_copied_types: &'static [(&'static str, &'static str)],
    /// Named by `objectType`: a source owned by a controller is not copied.
    pub(crate) generic: bool,
}

static BUILTIN: [KindInfo; 2] = [
    KindInfo {
        rule_type: "configmap",
        group: "",
        version: "v1",
        api_kind: "ConfigMap",
        plural: "configmaps",
        payload: Payload::Fields(&["data", "binaryData", "immutable"]),
        data_fields: &["data", "binaryData"],
        immutable_fields: &[],
        never_copied_types: &[],
        generic: false,
    },
    KindInfo {
        rule_type: "secret",
        group: "",
        version: "v1",
        api_kind: "Secret",
        plural: "secrets",
        // The API server folds `stringData` into `data`; it never comes back.
        payload: Payload::Fields(&["data", "type", "immutable"]),
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
        generic: false,
    },
];

/// Fields of well-known kinds that the API server never lets change.
const KNOWN_IMMUTABLE: &[(&str, &str, &[&str])] = &[(RBAC_GROUP, "RoleBinding", &["roleRef"])];

/// The registry of kinds beyond the built-in ones, in registration order.
struct Registry {
    extra: [OnceLock<KindInfo>; MAX_KINDS - 2],
    count: AtomicUsize,
    adding: Mutex<()>,
}

/// Process-wide on purpose: a [`Kind`] is an index into it, copied freely
/// into every cache; each slot is written once and never changed, so it is
/// a table that grows, not state that changes under a reader.
static REGISTRY: Registry = Registry {
    extra: [const { OnceLock::new() }; MAX_KINDS - 2],
    count: AtomicUsize::new(2),
    adding: Mutex::new(()),
};

/// A kind discovery resolved: what registering it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Discovered {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) kind: String,
    pub(crate) plural: String,
}

/// Why a kind cannot be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("this operator copies at most {MAX_KINDS} kinds, and as many are known already")]
pub(crate) struct TooManyKinds;

#[allow(non_upper_case_globals)]
impl Kind {
    pub(crate) const ConfigMap: Kind = Kind(0);
    pub const Secret: Kind = Kind(1);

    pub(crate) fn info(self) -> &'static KindInfo {
        match self.0 {
            0 | 1 => &BUILTIN[usize::from(self.0)],
            n => REGISTRY.extra[usize::from(n) - 2]
                .get()
                .expect("a Kind is made only once its entry is set"),
        }
    }

    /// Its position among the kinds: `0..MAX_KINDS`.
    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// Every kind known so far, built-in ones first.
    pub(crate) fn all() -> impl Iterator<Item = Kind> {
        let count = REGISTRY.count.load(Ordering::Acquire);
        (0..count).filter_map(|n| u8::try_from(n).ok().map(Kind))
    }

    /// The ConfigMap and Secret kinds, known without discovery.
    pub(crate) fn builtin() -> impl Iterator<Item = Kind> {
        [Kind::ConfigMap, Kind::Secret].into_iter()
    }

    pub(crate) fn from_rule_type(rule_type: &str) -> Option<Kind> {
        Kind::builtin().find(|kind| kind.info().rule_type == rule_type)
    }

    /// The known kind `kind` of API group `group`, whatever its version.
    pub(crate) fn find(group: &str, kind: &str) -> Option<Kind> {
        Kind::all().find(|k| {
            let info = k.info();
            info.group == group && info.api_kind == kind
        })
    }

    /// Register a kind discovery resolved; a kind already known (in any
    /// version: one version per kind, the first) is returned as it is.
    pub(crate) fn register(found: &Discovered) -> Result<Kind, TooManyKinds> {
        let _adding = crate::sync::lock(&REGISTRY.adding);
        if let Some(known) = Kind::find(&found.group, &found.kind) {
            return Ok(known);
        }
        let n = REGISTRY.count.load(Ordering::Acquire);
        if n >= MAX_KINDS {
            return Err(TooManyKinds);
        }
        let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
        let immutable_fields = KNOWN_IMMUTABLE
            .iter()
            .find(|(group, kind, _)| *group == found.group && *kind == found.kind)
            .map_or(&[][..], |(_, _, fields)| *fields);
        let info = KindInfo {
            rule_type: leak(&kind_name(&found.group, &found.kind)),
            group: leak(&found.group),
            version: leak(&found.version),
            api_kind: leak(&found.kind),
            plural: leak(&found.plural),
            payload: Payload::AllButMetadataAndStatus,
            data_fields: &[],
            immutable_fields,
            never_copied_types: &[],
            generic: true,
        };
        // Set before it is counted: `all` and `info` see only set entries.
        let _ = REGISTRY.extra[n - 2].set(info);
        REGISTRY.count.store(n + 1, Ordering::Release);
        u8::try_from(n).map(Kind).map_err(|_| TooManyKinds)
    }

    pub(crate) fn api_resource(self) -> ApiResource {
        let info = self.info();
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(info.group, info.version, info.api_kind),
            info.plural,
        )
    }

    /// Whether `field`, a top-level field of an object of this kind, is
    /// part of its content.
    pub(crate) fn is_payload_field(self, field: &str) -> bool {
        match self.info().payload {
            Payload::Fields(fields) => fields.contains(&field),
            Payload::AllButMetadataAndStatus => {
                !matches!(field, "apiVersion" | "kind" | "metadata" | "status")
            }
        }
    }

    /// Server-side field selector that leaves out the types never copied.
    pub(crate) fn source_field_selector(self) -> Option<String> {
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
    pub(crate) fn never_copied_reason(self, object_type: Option<&str>) -> Option<&'static str> {
        let object_type = object_type?;
        self.info()
            .never_copied_types
            .iter()
            .find(|(t, _)| *t == object_type)
            .map(|(_, why)| *why)
    }

    pub(crate) fn name(self) -> &'static str {
        self.info().api_kind
    }

    /// Whether this is `rbac.authorization.k8s.io` RoleBinding: a copy
    /// grants what the role it binds grants in the copy's own namespace.
    pub(crate) fn is_role_binding(self) -> bool {
        let info = self.info();
        info.group == RBAC_GROUP && info.api_kind == "RoleBinding"
    }
}

/// The API group of Roles and RoleBindings.
pub(crate) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Whether the kind `kind` of API group `group` holds or grants
/// permissions in its namespace: a Role or a RoleBinding.
pub(crate) fn is_rbac_kind(group: &str, kind: &str) -> bool {
    group == RBAC_GROUP && matches!(kind, "Role" | "RoleBinding")
}

/// Whether a payload field decides that a copy must be recreated rather
/// than updated: compact copies keep these.
pub(crate) fn decides_recreate(field: &str) -> bool {
    field == "type"
        || field == "immutable"
        || Kind::all().any(|kind| kind.info().immutable_fields.contains(&field))
}

/// `Kind.group`, or `Kind` for the core group: how settings and statuses
/// name a kind.
pub(crate) fn kind_name(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// A kind as settings name it: `Kind.group`, or `Kind` alone.
#[derive(Clone, Debug, PartialEq, Eq)]
struct KindPattern {
    kind: String,
    /// `None`: the bare `Kind`.
    group: Option<String>,
}

impl KindPattern {
    fn parse(entry: &str) -> Result<Self, String> {
        let (kind, group) = match entry.split_once('.') {
            Some((kind, group)) => (kind, Some(group.to_ascii_lowercase())),
            None => (entry, None),
        };
        if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!(
                "{entry:?} is not a kind (Kind or Kind.group, such as RoleBinding.rbac.authorization.k8s.io)"
            ));
        }
        Ok(Self {
            kind: kind.to_owned(),
            group,
        })
    }

    fn matches_kind(&self, kind: &str) -> bool {
        self.kind.eq_ignore_ascii_case(kind)
    }
}

/// The kinds an operator copies (`--kinds`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EnabledKinds {
    builtin: Vec<Kind>,
    named: Vec<KindPattern>,
    /// `*`: every kind not denied.
    any: bool,
}

impl EnabledKinds {
    /// Entries: `configmap`, `secret`, `Kind.group`, `Kind` (core group), `*`.
    pub(crate) fn parse(entries: &[String]) -> Result<Self, String> {
        let mut enabled = Self {
            builtin: Vec::new(),
            named: Vec::new(),
            any: false,
        };
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if entry == "*" {
                enabled.any = true;
                continue;
            }
            let pattern = KindPattern::parse(entry)?;
            let builtin = Kind::builtin().find(|k| {
                let info = k.info();
                pattern.matches_kind(info.api_kind)
                    && pattern.group.as_deref().unwrap_or_default() == info.group
            });
            match builtin {
                Some(kind) if !enabled.builtin.contains(&kind) => enabled.builtin.push(kind),
                Some(_) => {}
                // `configmaps` is no kind: kinds are named as in `kind:`.
                None if !pattern.kind.starts_with(|c: char| c.is_ascii_uppercase()) => {
                    return Err(format!(
                        "{entry:?} is not a kind: configmap, secret, or a kind as objects name it (RoleBinding.rbac.authorization.k8s.io, ServiceAccount)"
                    ));
                }
                None => enabled.named.push(pattern),
            }
        }
        if enabled.any {
            enabled.builtin = Kind::builtin().collect();
        }
        if enabled.builtin.is_empty() && enabled.named.is_empty() {
            return Err(
                "--kinds must name at least one kind (configmap, secret, Kind.group or *)".into(),
            );
        }
        Ok(enabled)
    }

    /// Leave out the built-in kinds `denied` denies: `--denied-kinds`
    /// holds whatever `--kinds` says.
    pub(crate) fn without_denied(mut self, denied: &DeniedKinds) -> Self {
        self.builtin
            .retain(|kind| !denied.denies(kind.info().group, kind.info().api_kind));
        self
    }

    /// The kinds named beyond ConfigMap and Secret: `(group, kind)`.
    pub(crate) fn named_kinds(&self) -> impl Iterator<Item = (&str, &str)> {
        self.named
            .iter()
            .map(|p| (p.group.as_deref().unwrap_or_default(), p.kind.as_str()))
    }

    /// Only these built-in kinds.
    pub(crate) fn builtin_only(kinds: &[Kind]) -> Self {
        Self {
            builtin: kinds.to_vec(),
            named: Vec::new(),
            any: false,
        }
    }

    /// Whether the built-in `kind` is copied (its watches start at start).
    pub(crate) fn has_builtin(&self, kind: Kind) -> bool {
        self.builtin.contains(&kind)
    }

    /// Whether kind `kind` of API group `group` is copied.
    pub(crate) fn enables(&self, group: &str, kind: &str) -> bool {
        if let Some(builtin) =
            Kind::builtin().find(|k| k.info().group == group && k.info().api_kind == kind)
        {
            return self.has_builtin(builtin);
        }
        self.any
            || self
                .named
                .iter()
                .any(|p| p.matches_kind(kind) && p.group.as_deref().unwrap_or_default() == group)
    }

    /// Whether copies of `kind` may exist under this setting.
    pub(crate) fn copies(&self, kind: Kind) -> bool {
        let info = kind.info();
        self.enables(info.group, info.api_kind)
    }
}

/// The kinds never copied (`--denied-kinds`), and `CopyratorRule` always.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeniedKinds(Vec<KindPattern>);

/// `--denied-kinds` by default: objects that belong to a controller or a
/// node, that make no sense twice, or whose fields the cluster allocates
/// (a Service's cluster IP, a claim's volume).
pub const DENIED_KINDS: &str = "Pod,Event,Endpoints,EndpointSlice,Lease,ReplicaSet,\
     ControllerRevision,Job,Service,PersistentVolumeClaim";

impl DeniedKinds {
    /// Entries: `Kind` (in every group) or `Kind.group`.
    pub(crate) fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(KindPattern::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub(crate) fn defaults() -> Self {
        let entries: Vec<String> = DENIED_KINDS.split(',').map(str::to_owned).collect();
        Self::parse(&entries).unwrap_or(Self(Vec::new()))
    }

    pub(crate) fn denies(&self, group: &str, kind: &str) -> bool {
        (group == crate::api::GROUP && kind == crate::api::KIND)
            || self
                .0
                .iter()
                .any(|p| p.matches_kind(kind) && p.group.as_deref().is_none_or(|g| g == group))
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
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
    }

    #[test]
    fn a_discovered_kind_is_registered_once_and_carries_all_but_metadata_and_status() {
        let found = Discovered {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            kind: "RoleBinding".into(),
            plural: "rolebindings".into(),
        };
        let kind = Kind::register(&found).expect("room for a kind");
        assert_eq!(Kind::register(&found), Ok(kind), "registered twice");
        let other_version = Discovered {
            version: "v1beta1".into(),
            ..found
        };
        assert_eq!(
            Kind::register(&other_version),
            Ok(kind),
            "one version per kind"
        );
        assert_eq!(
            Kind::find("rbac.authorization.k8s.io", "RoleBinding"),
            Some(kind)
        );
        assert_eq!(Kind::find("", "RoleBinding"), None);
        assert!(Kind::all().any(|k| k == kind));
        let info = kind.info();
        assert_eq!(info.rule_type, "RoleBinding.rbac.authorization.k8s.io");
        assert_eq!(info.immutable_fields, &["roleRef"]);
        assert!(kind.is_role_binding() && !Kind::ConfigMap.is_role_binding());
        assert!(is_rbac_kind("rbac.authorization.k8s.io", "Role"));
        assert!(!is_rbac_kind("rbac.authorization.k8s.io", "ClusterRole"));
        assert!(!is_rbac_kind("example.com", "RoleBinding"));
        assert!(info.generic);
        for field in ["subjects", "roleRef", "spec", "rules"] {
            assert!(kind.is_payload_field(field), "{field}");
        }
        for field in ["apiVersion", "kind", "metadata", "status"] {
            assert!(!kind.is_payload_field(field), "{field}");
        }
        assert!(!Kind::ConfigMap.is_payload_field("spec"));
        assert_eq!(
            kind.api_resource().api_version,
            "rbac.authorization.k8s.io/v1"
        );
        assert_eq!(
            Kind::find("", "ConfigMap"),
            Some(Kind::ConfigMap),
            "objectType v1 ConfigMap is the built-in kind"
        );
    }

    fn entries(list: &str) -> Vec<String> {
        list.split(',').map(str::to_owned).collect()
    }

    #[test]
    fn kinds_setting_names_builtin_kinds_kinds_by_group_or_any() {
        let enabled = EnabledKinds::parse(&entries(
            "configmap, RoleBinding.rbac.authorization.k8s.io,ServiceAccount",
        ))
        .expect("valid");
        assert!(enabled.has_builtin(Kind::ConfigMap));
        assert!(!enabled.has_builtin(Kind::Secret));
        assert!(!enabled.enables("", "Secret"));
        assert!(enabled.enables("", "ConfigMap"));
        assert!(enabled.enables("rbac.authorization.k8s.io", "RoleBinding"));
        assert!(
            !enabled.enables("", "RoleBinding"),
            "a bare kind is the core group"
        );
        assert!(enabled.enables("", "ServiceAccount"));
        assert!(!enabled.enables("networking.k8s.io", "NetworkPolicy"));
        let any = EnabledKinds::parse(&entries("*")).expect("valid");
        assert!(any.has_builtin(Kind::Secret));
        assert!(any.enables("example.com", "Widget"));
        assert!(EnabledKinds::parse(&entries("")).is_err());
        assert!(EnabledKinds::parse(&entries("Role/binding")).is_err());
        assert!(
            EnabledKinds::parse(&entries("configmaps")).is_err(),
            "a plural is no kind"
        );
        let without_secrets = EnabledKinds::parse(&entries("configmap,secret"))
            .expect("valid")
            .without_denied(&DeniedKinds::parse(&entries("Secret")).expect("valid"));
        assert!(without_secrets.has_builtin(Kind::ConfigMap));
        assert!(!without_secrets.has_builtin(Kind::Secret));
        assert!(!without_secrets.enables("", "Secret"));
    }

    /// `*` with a named kind: every kind not denied, and that one watched
    /// from the start (so its orphans are collected after a restart).
    #[test]
    fn any_kind_and_a_named_one_together() {
        let enabled = EnabledKinds::parse(&entries("*,Widget.example.com")).expect("valid");
        assert!(enabled.enables("rbac.authorization.k8s.io", "RoleBinding"));
        assert_eq!(
            enabled.named_kinds().collect::<Vec<_>>(),
            vec![("example.com", "Widget")]
        );
    }

    #[test]
    fn denied_kinds_match_a_bare_kind_in_every_group_and_always_the_rules() {
        let denied = DeniedKinds::defaults();
        assert!(denied.denies("", "Pod"));
        assert!(denied.denies("events.k8s.io", "Event"));
        assert!(denied.denies("batch", "Job"));
        assert!(denied.denies("coordination.k8s.io", "Lease"));
        // Fields the cluster allocates (a cluster IP, a bound volume).
        assert!(denied.denies("", "Service"));
        assert!(denied.denies("", "PersistentVolumeClaim"));
        assert!(!denied.denies("rbac.authorization.k8s.io", "RoleBinding"));
        let none = DeniedKinds::parse(&[]).expect("valid");
        assert!(
            none.denies("flant.com", "CopyratorRule"),
            "whatever the setting"
        );
        assert!(!none.denies("", "Pod"));
        let grouped = DeniedKinds::parse(&entries("Widget.example.com")).expect("valid");
        assert!(grouped.denies("example.com", "Widget"));
        assert!(!grouped.denies("other.example.com", "Widget"));
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
