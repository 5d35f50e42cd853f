//! A `CopyratorRule` resolved into a validated [`ResolvedRule`] under the
//! operator's trust policy: which rules it honours, which kinds, Secret
//! types and namespaces they may copy, and what a rule's fields mean once
//! both of the resource's shapes are merged and defaults applied.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::api::kinds::{DeniedKinds, EnabledKinds, Kind, is_rbac_kind};
use crate::api::rule::*;
use crate::api::schema::{
    MAX_ANNOTATION_BYTES, MAX_CLUSTER_NAMES, MAX_SOURCE_NAMESPACES, MAX_TRANSFORM_ENTRIES,
};
use crate::api::selector::{Glob, KeyGlob, LabelSelector, is_dns_label, validate_data_key};
use crate::core::identity::{Identity, TenantIdentity};
use crate::core::naming::Naming;

/// Which rules this operator honours, and where they may copy from.
#[derive(Clone, Debug)]
pub(crate) struct Trust {
    /// The operator's own namespace.
    pub(crate) operator_namespace: String,
    /// Honour rules in every namespace (those of other namespaces as tenants).
    pub(crate) all_namespaces: bool,
    /// What the settings allow every rule.
    pub(crate) policy: Arc<CopyPolicy>,
    /// Let tenant rules keep copies in member clusters
    /// (`--allow-tenant-clusters`); without it, a tenant rule that names
    /// members is `Forbidden`.
    pub(crate) allow_tenant_clusters: bool,
    /// Whom tenant rules act as (`--tenant-identity`).
    pub(crate) tenant_identity: TenantIdentity,
    /// The ServiceAccount a tenant rule that names none acts as
    /// (`--default-service-account`).
    pub(crate) default_service_account: String,
    /// Whether a tenant rule that acts as a ServiceAccount needs the
    /// consent annotations as well as that account's rights
    /// (`--require-consent-annotations`).
    pub(crate) consent_annotations: bool,
}

impl Trust {
    /// `namespace`, if a rule there is a tenant's: outside the operator's
    /// namespace.
    pub(crate) fn tenant_namespace<'a>(&self, namespace: &'a str) -> Option<&'a str> {
        (namespace != self.operator_namespace).then_some(namespace)
    }

    #[cfg(test)]
    /// The defaults: protected namespaces, tracking keys and Secret types
    /// as shipped; tenant rules keep to the home cluster.
    pub(crate) fn new(operator_namespace: &str, all_namespaces: bool) -> Self {
        Self {
            operator_namespace: operator_namespace.to_owned(),
            all_namespaces,
            policy: Arc::new(CopyPolicy::defaults(operator_namespace)),
            allow_tenant_clusters: false,
            tenant_identity: TenantIdentity::ServiceAccount,
            default_service_account: DEFAULT_SERVICE_ACCOUNT.to_owned(),
            consent_annotations: true,
        }
    }
}

/// The ServiceAccount a tenant rule acts as when it names none, unless
/// `--default-service-account` says another.
pub(crate) const DEFAULT_SERVICE_ACCOUNT: &str = "copyrator";

/// Namespaces that only an exact name in `targets.include` reaches, by default.
pub(crate) const PROTECTED_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

/// Secret types copied by default; `--secret-types` adds more.
pub(crate) const SECRET_TYPES: &[&str] = &[
    "Opaque",
    "kubernetes.io/tls",
    "kubernetes.io/dockerconfigjson",
    "kubernetes.io/dockercfg",
    "kubernetes.io/basic-auth",
    "kubernetes.io/ssh-auth",
];

/// What the operator's settings allow every rule: which namespaces only an
/// exact name reaches, which metadata never travels, which Secret types
/// are copied.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CopyPolicy {
    /// Reached by no glob, selector or default: only by an exact
    /// `targets.include` entry. Always holds the operator's own namespace.
    pub(crate) protected_namespaces: Vec<Glob>,
    /// Labels and annotations never carried to copies, beyond the built-in
    /// tracking keys of other tools.
    pub(crate) strip_keys: Vec<KeyGlob>,
    /// Secret types that are copied.
    pub(crate) secret_types: Vec<String>,
    /// Kinds the operator copies (`--kinds`); a rule of another is refused.
    pub(crate) kinds: EnabledKinds,
    /// Kinds never copied, whatever `--kinds` says (`--denied-kinds`).
    pub(crate) denied_kinds: DeniedKinds,
}

impl CopyPolicy {
    pub(crate) fn defaults(operator_namespace: &str) -> Self {
        Self::new(
            operator_namespace,
            &PROTECTED_NAMESPACES
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
            &[],
            &[],
        )
        .unwrap_or_else(|_| Self {
            protected_namespaces: Vec::new(),
            strip_keys: Vec::new(),
            secret_types: SECRET_TYPES.iter().map(|s| s.to_string()).collect(),
            kinds: EnabledKinds::builtin_only(&Kind::builtin().collect::<Vec<_>>()),
            denied_kinds: DeniedKinds::defaults(),
        })
    }

    /// From the settings: the protected namespaces (globs; the operator's
    /// own is always added), extra keys never carried, extra Secret types.
    pub(crate) fn new(
        operator_namespace: &str,
        protected: &[String],
        strip_keys: &[String],
        extra_secret_types: &[String],
    ) -> Result<Self, String> {
        let mut protected_namespaces = protected
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| Glob::new(p).map_err(|e| format!("protected namespace {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        protected_namespaces
            .push(Glob::new(operator_namespace).map_err(|e| format!("--namespace: {e}"))?);
        let strip_keys = strip_keys
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| KeyGlob::new(p).map_err(|e| format!("strip key {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut secret_types: Vec<String> = SECRET_TYPES.iter().map(|s| s.to_string()).collect();
        for extra in extra_secret_types.iter().filter(|t| !t.is_empty()) {
            if let Some(why) = Kind::Secret.never_copied_reason(Some(extra)) {
                return Err(format!(
                    "Secret type {extra:?} is never copied ({why}), whatever the settings"
                ));
            }
            if !secret_types.contains(extra) {
                secret_types.push(extra.clone());
            }
        }
        Ok(Self {
            protected_namespaces,
            strip_keys,
            secret_types,
            kinds: EnabledKinds::builtin_only(&Kind::builtin().collect::<Vec<_>>()),
            denied_kinds: DeniedKinds::defaults(),
        })
    }

    pub(crate) fn is_protected(&self, namespace: &str) -> bool {
        self.protected_namespaces
            .iter()
            .any(|g| g.matches(namespace))
    }

    /// Why `source`, an object of `kind`, is not copied, if it is not: its
    /// `type`, or (of a kind named by `objectType`) its controller.
    pub(crate) fn refuses_source(
        &self,
        kind: Kind,
        source: &crate::cache::index::Object,
    ) -> Option<String> {
        if let Some(controller) = &source.controller {
            return Some(format!(
                "it belongs to its controller {controller}, which keeps it"
            ));
        }
        self.refuses_type(kind, source.object_type())
    }

    /// Why an object of `kind` with this `type` is not copied, if it is not.
    pub(crate) fn refuses_type(&self, kind: Kind, object_type: Option<&str>) -> Option<String> {
        if let Some(why) = kind.never_copied_reason(object_type) {
            return Some(why.to_owned());
        }
        match (kind, object_type) {
            (Kind::Secret, Some(t)) if !self.secret_types.iter().any(|s| s == t) => Some(format!(
                "Secret type {t:?} is not copied (copied: {}; --secret-types adds more)",
                self.secret_types.join(", ")
            )),
            _ => None,
        }
    }
}

/// Target namespaces of a rule, validated.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TargetSelector {
    pub(crate) namespace_selector: Option<LabelSelector>,
    pub(crate) include: Vec<Glob>,
    pub(crate) exclude: Vec<Glob>,
}

impl TargetSelector {
    pub(crate) fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| g.matches(name)))
            && !self.exclude.iter().any(|g| g.matches(name))
            && self
                .namespace_selector
                .as_ref()
                .is_none_or(|s| s.matches(labels))
    }

    /// `targets` with its globs and its namespace selector parsed.
    fn resolve(targets: Targets) -> Result<Self, InvalidRule> {
        let globs = |field: &str,
                     patterns: Option<Vec<String>>|
         -> Result<Vec<Glob>, InvalidRule> {
            patterns
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    Glob::new(p).map_err(|e| InvalidRule::invalid(format!("targets.{field}: {e}")))
                })
                .collect()
        };
        Ok(Self {
            namespace_selector: match targets.namespace_selector {
                Some(s) => Some(LabelSelector::from_k8s(&s).map_err(|e| {
                    InvalidRule::invalid(format!("targets.namespaceSelector: {e}"))
                })?),
                None => None,
            },
            include: globs("include", targets.include)?,
            exclude: globs("exclude", targets.exclude)?,
        })
    }

    /// Whether `targets.include` names `name` exactly (no wildcard).
    pub(crate) fn names_exactly(&self, name: &str) -> bool {
        self.include.iter().any(|g| g.is_exactly(name))
    }
}

/// The clusters a rule keeps copies in, validated: its home cluster (the
/// one it lives in, where its sources are read) when `local`, and the
/// member clusters that `names` lists or `selector` matches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ClusterTargets {
    /// Members by name.
    pub(crate) names: BTreeSet<String>,
    /// Members by label; an empty selector matches every member.
    pub(crate) selector: Option<LabelSelector>,
    /// The home cluster receives copies too.
    pub(crate) local: bool,
}

impl Default for ClusterTargets {
    fn default() -> Self {
        Self::home_only()
    }
}

impl ClusterTargets {
    /// The home cluster alone: a rule without `targets.clusters`.
    pub(crate) fn home_only() -> Self {
        Self {
            names: BTreeSet::new(),
            selector: None,
            local: true,
        }
    }

    /// Whether the member `member_name`, with these labels, is a target:
    /// `names` lists it or `selector` matches it. Says nothing of the home
    /// cluster, which `local` decides.
    pub(crate) fn selects(
        &self,
        member_name: &str,
        member_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.names.contains(member_name)
            || self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(member_labels))
    }

    /// Whether any member can be a target: the rule names members or
    /// selects them by label.
    pub(crate) fn names_members(&self) -> bool {
        !self.names.is_empty() || self.selector.is_some()
    }

    /// `targets.clusters`, its names and selector checked; absent, the
    /// home cluster alone.
    fn resolve(clusters: Option<TargetClusters>) -> Result<Self, InvalidRule> {
        let Some(clusters) = clusters else {
            return Ok(Self::home_only());
        };
        let names = clusters.names.unwrap_or_default();
        if names.len() > MAX_CLUSTER_NAMES {
            return Err(InvalidRule::invalid(format!(
                "targets.clusters.names: the list holds {} names; at most {MAX_CLUSTER_NAMES} are allowed",
                names.len()
            )));
        }
        if let Some(bad) = names.iter().find(|name| !is_dns_label(name)) {
            return Err(InvalidRule::invalid(format!(
                "targets.clusters.names: {bad:?} is not a member cluster name (a DNS-1123 label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
            )));
        }
        let selector = match clusters.selector {
            Some(s) => Some(
                LabelSelector::from_k8s(&s)
                    .map_err(|e| InvalidRule::invalid(format!("targets.clusters.selector: {e}")))?,
            ),
            None => None,
        };
        let resolved = Self {
            names: names.into_iter().collect(),
            selector,
            local: clusters.local.unwrap_or(true),
        };
        if !resolved.local && !resolved.names_members() {
            return Err(InvalidRule::invalid(
                "targets.clusters: local is false and no member is named or selected: the rule would keep its copies nowhere",
            ));
        }
        Ok(resolved)
    }
}

/// Label, annotation and data key changes, validated.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ResolvedTransform {
    pub(crate) add_labels: BTreeMap<String, String>,
    pub(crate) add_annotations: BTreeMap<String, String>,
    pub(crate) strip_labels: Vec<KeyGlob>,
    pub(crate) strip_annotations: Vec<KeyGlob>,
    pub(crate) keys: ResolvedKeys,
    /// How copies are named from their sources' names.
    pub(crate) naming: Naming,
    /// `toKind: ConfigMap`: a rule copying Secrets writes ConfigMaps of
    /// their selected keys as text (see `core::text_copy`).
    pub(crate) to_config_map: bool,
    /// The keys `keys.include` names exactly (no `*` or `?`): those alone
    /// go into a ConfigMap when they look like a private key.
    pub(crate) exact_keys: BTreeSet<String>,
}

impl ResolvedTransform {
    /// `transform` validated for a rule of `kind`: only what the API server
    /// accepts on every copy, and nothing Copyrator sets itself.
    fn resolve(transform: Transform, kind: Kind, policy: &CopyPolicy) -> Result<Self, InvalidRule> {
        let key_globs =
            |field: &str, patterns: Option<Vec<String>>| -> Result<Vec<KeyGlob>, InvalidRule> {
                patterns
                    .unwrap_or_default()
                    .iter()
                    .map(|p| {
                        KeyGlob::new(p)
                            .map_err(|e| InvalidRule::invalid(format!("transform.{field}: {e}")))
                    })
                    .collect()
            };
        let add_labels = transform.add_labels.unwrap_or_default();
        check_labels(&add_labels)?;
        let add_annotations = transform.add_annotations.unwrap_or_default();
        check_annotations(&add_annotations)?;
        for (field, keys) in [
            ("addLabels", add_labels.keys()),
            ("addAnnotations", add_annotations.keys()),
        ] {
            check_added_keys(field, keys)?;
        }
        let to_config_map = transform.to_kind == Some(ToKind::ConfigMap);
        let exact_keys: BTreeSet<String> = transform
            .keys
            .as_ref()
            .and_then(|keys| keys.include.as_ref())
            .into_iter()
            .flatten()
            .filter(|pattern| !pattern.contains(['*', '?']))
            .cloned()
            .collect();
        if to_config_map {
            if kind != Kind::Secret {
                return Err(InvalidRule::invalid(format!(
                    "transform.toKind: ConfigMap copies a Secret's keys as text; this rule copies {}",
                    kind.info().rule_type
                )));
            }
            if !policy.kinds.copies(Kind::ConfigMap) {
                return Err(InvalidRule {
                    reason: "KindNotEnabled",
                    message: "transform.toKind: ConfigMap writes ConfigMaps, which this operator \
                              does not copy: add ConfigMap to --kinds"
                        .to_owned(),
                });
            }
            let included = transform.keys.as_ref().and_then(|k| k.include.as_ref());
            if included.is_none_or(Vec::is_empty) {
                return Err(InvalidRule::invalid(
                    "transform.toKind: ConfigMap needs transform.keys.include: the Secret's keys \
                     a ConfigMap may hold, named"
                        .to_owned(),
                ));
            }
        }
        if transform.keys.is_some() && kind.info().data_fields.is_empty() {
            return Err(InvalidRule::invalid(format!(
                "transform.keys selects ConfigMap and Secret data keys; {} has none",
                kind.info().rule_type
            )));
        }
        Ok(Self {
            add_labels,
            add_annotations,
            strip_labels: key_globs("stripLabels", transform.strip_labels)?,
            strip_annotations: key_globs("stripAnnotations", transform.strip_annotations)?,
            keys: ResolvedKeys::resolve(transform.keys.unwrap_or_default())?,
            naming: Naming::new(transform.name.as_ref())
                .map_err(|e| InvalidRule::invalid(e.to_string()))?,
            to_config_map,
            exact_keys,
        })
    }
}

/// The tracking keys of other tools, which copies never carry, may not be
/// added either: a copy made to look like another tool's would be pruned
/// or rewritten by it.
fn check_added_keys<'a>(
    field: &str,
    keys: impl Iterator<Item = &'a String>,
) -> Result<(), InvalidRule> {
    for key in keys {
        if let Some(why) = crate::core::tracking::never_travels(key) {
            return Err(InvalidRule::invalid(format!(
                "transform.{field}: {key:?} never travels to a copy: {why}"
            )));
        }
    }
    Ok(())
}

/// The glob steps the check of `transform.keys.rename` against include
/// and exclude may take (a few milliseconds; an ordinary rule takes a few
/// thousand): it runs on every pass's resolution of the rule.
const RENAME_CHECK_STEPS: u64 = 4_000_000;

/// Which data keys copies carry, under which names, validated: no two
/// keys a copy carries share a name.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ResolvedKeys {
    pub(crate) include: Vec<KeyGlob>,
    pub(crate) exclude: Vec<KeyGlob>,
    pub(crate) rename: BTreeMap<String, String>,
}

impl ResolvedKeys {
    /// Every key under its own name: copies carry the source's payload as it is.
    pub(crate) fn is_identity(&self) -> bool {
        self.include.is_empty()
            && self.exclude.is_empty()
            && self.rename.iter().all(|(from, to)| from == to)
    }

    /// Whether copies carry the source key `key` (under some name), taking
    /// one of `steps` per glob step; `None` when they ran out.
    fn selects_within(&self, key: &str, steps: &mut u64) -> Option<bool> {
        let mut included = self.include.is_empty();
        for glob in &self.include {
            if glob.matches_within(key, steps)? {
                included = true;
                break;
            }
        }
        if !included {
            return Some(false);
        }
        for glob in &self.exclude {
            if glob.matches_within(key, steps)? {
                return Some(false);
            }
        }
        Some(true)
    }

    /// The name the source key `key` has on copies, if they carry it,
    /// taking one of `steps` per glob step; `None` when they ran out.
    pub(crate) fn name_on_copies_within<'a>(
        &'a self,
        key: &'a str,
        steps: &mut u64,
    ) -> Option<Option<&'a str>> {
        let selected = self.selects_within(key, steps)?;
        Some(selected.then(|| self.rename.get(key).map_or(key, String::as_str)))
    }

    fn resolve(keys: KeyTransform) -> Result<Self, InvalidRule> {
        let globs = |field: &str, patterns: Option<Vec<String>>| {
            let patterns = patterns.unwrap_or_default();
            check_transform_entries(&format!("keys.{field}"), patterns.len())?;
            patterns
                .iter()
                .map(|p| {
                    KeyGlob::data_key(p)
                        .map_err(|e| InvalidRule::invalid(format!("transform.keys.{field}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let resolved = Self {
            include: globs("include", keys.include)?,
            exclude: globs("exclude", keys.exclude)?,
            rename: keys.rename.unwrap_or_default(),
        };
        check_transform_entries("keys.rename", resolved.rename.len())?;
        let invalid = |e: String| InvalidRule::invalid(format!("transform.keys.rename: {e}"));
        let mut renamed_to: BTreeMap<&str, &str> = BTreeMap::new();
        for (from, to) in &resolved.rename {
            validate_data_key(from).map_err(invalid)?;
            validate_data_key(to).map_err(invalid)?;
            if let Some(other) = renamed_to.insert(to, from) {
                return Err(invalid(format!(
                    "{other:?} and {from:?} are both renamed to {to:?}; a copy holds each key once"
                )));
            }
        }
        // A key renamed onto one that copies keep as it is would hold two
        // values whenever a source has both. The globs are a tenant's to
        // choose: the check is bounded, as a pass's matching is.
        let mut steps = RENAME_CHECK_STEPS;
        let mut selects = |key: &str| {
            resolved.selects_within(key, &mut steps).ok_or_else(|| {
                invalid(format!(
                    "checking the renamed keys against transform.keys.include and .exclude takes more than {RENAME_CHECK_STEPS} glob steps; use fewer or simpler patterns"
                ))
            })
        };
        for (from, to) in &resolved.rename {
            if from != to && selects(from)? && selects(to)? && !resolved.rename.contains_key(to) {
                return Err(invalid(format!(
                    "{from:?} is renamed to {to:?}, a key that copies keep as it is; exclude {to:?} or rename it too"
                )));
            }
        }
        Ok(resolved)
    }
}

/// A rule with both shapes merged, defaults applied, and everything checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ResolvedRule {
    pub(crate) key: RuleKey,
    pub(crate) uid: String,
    /// The kind of its sources.
    pub(crate) kind: Kind,
    /// The kind of its copies: its sources', or a ConfigMap
    /// (`transform.toKind`).
    pub(crate) copy_kind: Kind,
    pub(crate) selector: LabelSelector,
    /// Sorted; the first source namespace wins when two sources share a name.
    pub(crate) source_namespaces: Vec<String>,
    pub(crate) targets: TargetSelector,
    /// The clusters that receive copies, in the namespaces `targets` selects.
    pub(crate) clusters: ClusterTargets,
    pub(crate) prune: bool,
    pub(crate) conflict_policy: ConflictPolicy,
    /// Objects at its places holding what it would write are taken over
    /// by a metadata patch (`spec.adopt`).
    pub(crate) adopt: bool,
    pub(crate) sync_policy: SyncPolicy,
    pub(crate) transform: ResolvedTransform,
    pub(crate) deletion: Deletion,
    /// The operator-wide settings the rule is followed under.
    pub(crate) policy: Arc<CopyPolicy>,
    /// A rule outside the operator's namespace under `--all-namespaces`:
    /// it writes only into namespaces that accept its namespace.
    pub(crate) tenant: bool,
    /// The cluster planned is the rule's own (home): its namespace there
    /// is the tenant's. In a member, a namespace of the same name belongs
    /// to whoever runs that cluster, and is written only where it accepts.
    pub(crate) in_own_cluster: bool,
    /// `spec.rollout.restartConsumers`: roll the workloads that use a copy
    /// whose data a write changed.
    pub(crate) restart_consumers: bool,
    /// `rollout.stages`, when the rule rolls changes out in stages.
    pub(crate) stages: Option<Arc<Stages>>,
    /// Whom its writes are sent as.
    pub(crate) identity: Identity,
    /// A tenant rule whose consent is its identity's rights alone (acting
    /// as a ServiceAccount, without `--require-consent-annotations`): a
    /// source elsewhere needs no `allow-to`, and a target is welcome
    /// where it accepts the rule's namespace or is in `granted_targets`.
    pub(crate) consent_by_rights: bool,
    /// For such a rule, the namespaces of this cluster where its
    /// ServiceAccount may create the kind, as asked before its pass.
    pub(crate) granted_targets: Option<Arc<std::collections::BTreeSet<String>>>,
}

/// What becomes of copies that no longer belong (`spec.deletionPolicy`,
/// defaults applied).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deletion {
    pub(crate) rule_deleted: Disposal,
    pub(crate) source_gone: Disposal,
    pub(crate) target_left: Disposal,
}

impl Deletion {
    /// `spec.deletionPolicy` with its defaults, refused where it says
    /// the opposite of `prune: false` (which keeps such copies as they are).
    fn resolve(policy: Option<&DeletionPolicy>, prune: bool) -> Result<Self, InvalidRule> {
        let Some(policy) = policy else {
            return Ok(Self::default());
        };
        if !prune && (policy.source_gone.is_some() || policy.target_left.is_some()) {
            return Err(InvalidRule::invalid(
                "prune: false keeps copies that no longer belong, and deletionPolicy.sourceGone or targetLeft says what becomes of them: set one or the other",
            ));
        }
        Ok(Self {
            rule_deleted: policy.rule_deleted.unwrap_or_default(),
            source_gone: policy.source_gone.unwrap_or_default(),
            target_left: policy.target_left.unwrap_or_default(),
        })
    }
}

/// For `rollout.stages` (see `core::rollout`): the name of the stage that namespaces no stage selects make.
pub(crate) const REST: &str = "rest";

/// One stage: the clusters and namespaces it selects, the pause after it
/// settles, whether it waits for an approval, and how many of its members
/// may be unreachable while it settles.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stage {
    pub(crate) name: String,
    pub(crate) selector: TargetSelector,
    pub(crate) pause: Duration,
    /// `None`: every cluster.
    pub(crate) clusters: Option<ClusterTargets>,
    pub(crate) manual: bool,
    pub(crate) max_unavailable: usize,
}

/// A cluster as stages see it: the home cluster, or a member by name and
/// labels.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClusterOf<'a> {
    Home,
    Member(&'a str, &'a BTreeMap<String, String>),
}

impl Stage {
    /// Whether `cluster` is one of this stage's clusters.
    pub(crate) fn covers(&self, cluster: ClusterOf<'_>) -> bool {
        match (&self.clusters, cluster) {
            (None, _) => true,
            (Some(c), ClusterOf::Home) => c.local,
            (Some(c), ClusterOf::Member(name, labels)) => c.selects(name, labels),
        }
    }
}

/// A rule's stages, in order; the namespaces none selects come last.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stages {
    pub(crate) stages: Vec<Stage>,
    /// A stage not settled this long after it opened halts the rollout.
    pub(crate) settle_timeout: Duration,
}

impl Stages {
    /// The stage of the namespace `name` in `cluster`: the first that
    /// covers the cluster and selects the namespace, else the last (the
    /// rest).
    pub(crate) fn stage_of(
        &self,
        cluster: ClusterOf<'_>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> usize {
        self.stages
            .iter()
            .position(|s| s.covers(cluster) && s.selector.matches(name, labels))
            .unwrap_or(self.stages.len())
    }

    /// Whether `cluster` may hold places of `stage` (the rest covers
    /// every cluster).
    pub(crate) fn covers(&self, stage: usize, cluster: ClusterOf<'_>) -> bool {
        self.stages.get(stage).is_none_or(|s| s.covers(cluster))
    }

    /// Whether `stage` opens only once approved.
    pub(crate) fn manual(&self, stage: usize) -> bool {
        self.stages.get(stage).is_some_and(|s| s.manual)
    }

    /// How many of `stage`'s clusters may be unreachable while it settles.
    pub(crate) fn max_unavailable(&self, stage: usize) -> usize {
        self.stages.get(stage).map_or(0, |s| s.max_unavailable)
    }

    /// How many stages there are, the rest included.
    pub(crate) fn count(&self) -> usize {
        self.stages.len() + 1
    }

    pub(crate) fn name(&self, stage: usize) -> &str {
        self.stages.get(stage).map_or(REST, |s| s.name.as_str())
    }

    pub(crate) fn pause(&self, stage: usize) -> Duration {
        self.stages.get(stage).map_or(Duration::ZERO, |s| s.pause)
    }
}

/// A settle timeout when the rule gives none.
const SETTLE_TIMEOUT: u32 = 600;

/// `rollout.stages` parsed: `None` without stages; each stage's selector
/// and globs checked, and no two stages of one name.
fn resolve_stages(rollout: Option<&Rollout>) -> Result<Option<Arc<Stages>>, InvalidRule> {
    let Some(rollout) = rollout else {
        return Ok(None);
    };
    let Some(stages) = rollout.stages.as_ref().filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let mut names = BTreeSet::new();
    let mut resolved = Vec::with_capacity(stages.len());
    for stage in stages {
        if !names.insert(stage.name.as_str()) || stage.name == REST {
            return Err(InvalidRule::invalid(format!(
                "rollout.stages: the stage name {:?} is taken (by another stage, or by `rest`, the namespaces no stage selects)",
                stage.name
            )));
        }
        let selector = TargetSelector::resolve(Targets {
            namespace_selector: stage.namespace_selector.clone(),
            include: stage.include.clone(),
            ..Targets::default()
        })
        .map_err(|e| {
            InvalidRule::invalid(format!("rollout.stages[{}]: {}", stage.name, e.message))
        })?;
        let clusters = match &stage.clusters {
            None => None,
            Some(c) => Some(
                ClusterTargets::resolve(Some(TargetClusters {
                    names: c.names.clone(),
                    selector: c.selector.clone(),
                    local: Some(c.home.unwrap_or(false)),
                }))
                .or_else(|e| {
                    // A stage of no cluster at all is allowed: it is empty.
                    if c.home != Some(true)
                        && c.names.as_ref().is_none_or(Vec::is_empty)
                        && c.selector.is_none()
                    {
                        Ok(ClusterTargets {
                            names: BTreeSet::new(),
                            selector: None,
                            local: false,
                        })
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| {
                    InvalidRule::invalid(format!(
                        "rollout.stages[{}].clusters: {}",
                        stage.name,
                        e.message.trim_start_matches("targets.clusters.")
                    ))
                })?,
            ),
        };
        resolved.push(Stage {
            name: stage.name.clone(),
            selector,
            pause: Duration::from_secs(u64::from(stage.pause_seconds.unwrap_or(0))),
            clusters,
            manual: stage.approval == Some(StageApproval::Manual),
            max_unavailable: stage.max_unavailable_clusters.unwrap_or(0) as usize,
        });
    }
    Ok(Some(Arc::new(Stages {
        stages: resolved,
        settle_timeout: Duration::from_secs(u64::from(
            rollout.settle_timeout_seconds.unwrap_or(SETTLE_TIMEOUT),
        )),
    })))
}

/// The longest selector a rule may have, as the label query its source
/// watch sends (`app in (a,b),tier=web`), in bytes.
pub(crate) const MAX_SELECTOR_QUERY: usize = 4096;

/// The source namespaces a tenant rule may name: each is a watch of the
/// operator's that no budget shares (see `cluster::sources::plan_watches`).
pub(crate) const MAX_TENANT_SOURCE_NAMESPACES: usize = 16;

/// Why a rule cannot be followed; shown in its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InvalidRule {
    /// `InvalidRule`, `Forbidden`, `RBACSourcesNotTrusted`, or why its kind
    /// is not copied: `DeniedKind`, `KindNotEnabled`, `UnknownKind`,
    /// `ClusterScopedKind`.
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl InvalidRule {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self {
            reason: "InvalidRule",
            message: message.into(),
        }
    }
}

/// Why a tenant rule may not name a kind beyond ConfigMaps and Secrets:
/// consent is given per namespace, not per kind, and a Role, a RoleBinding
/// or a workload copied where a namespace accepted ConfigMaps would grant
/// or run what that namespace never agreed to.
pub(crate) fn tenant_kind_refusal(trust: &Trust) -> InvalidRule {
    InvalidRule {
        reason: "Forbidden",
        message: format!(
            "a rule outside the operator's namespace {:?} may copy only ConfigMaps and Secrets",
            trust.operator_namespace
        ),
    }
}

/// What a tenant rule may not ask for, beyond what no rule may: a kind
/// beyond ConfigMaps and Secrets (see [`tenant_kind_refusal`]), or to take
/// over objects of the namespaces that accept it.
fn check_tenant_spec(kind: Kind, spec: &RuleSpec, trust: &Trust) -> Result<(), InvalidRule> {
    if kind.info().generic {
        return Err(tenant_kind_refusal(trust));
    }
    if spec.conflict_policy == Some(ConflictPolicy::Overwrite) {
        return Err(InvalidRule {
            reason: "Forbidden",
            message: format!(
                "a rule outside the operator's namespace {:?} may not use conflictPolicy Overwrite",
                trust.operator_namespace
            ),
        });
    }
    Ok(())
}

/// Why a tenant rule may not keep copies in member clusters unless the
/// operator allows it (`--allow-tenant-clusters`): consent is given by
/// the namespaces of the home cluster, and a member's owners gave none.
fn check_tenant_clusters(clusters: &ClusterTargets, trust: &Trust) -> Result<(), InvalidRule> {
    if clusters.names_members() && !trust.allow_tenant_clusters {
        return Err(InvalidRule {
            reason: "Forbidden",
            message: format!(
                "a rule outside the operator's namespace {:?} may not copy into member clusters (targets.clusters.names or .selector); the operator's --allow-tenant-clusters setting allows it",
                trust.operator_namespace
            ),
        });
    }
    Ok(())
}

/// The kind `objectType` names, once discovery has registered it.
fn object_type_kind(object_type: &ObjectType, policy: &CopyPolicy) -> Result<Kind, InvalidRule> {
    if let Some(refusal) = object_type.refusal(policy) {
        return Err(refusal);
    }
    let group = object_type.group_version().map_or("", |(g, _)| g);
    Kind::find(group, &object_type.kind).ok_or_else(|| InvalidRule {
        reason: "UnknownKind",
        message: format!(
            "the API server serves no kind {} ({})",
            object_type.kind, object_type.api_version
        ),
    })
}

impl CopyratorRule {
    /// A rule outside the operator's namespace under `--all-namespaces`.
    pub(crate) fn is_tenant(&self, trust: &Trust) -> bool {
        trust.all_namespaces && self.key().namespace != trust.operator_namespace
    }

    /// Whom the rule's writes are sent as (see [`Identity::of_rule`]); known
    /// of a rule that does not resolve too, for the cleanup of its copies.
    pub(crate) fn identity(&self, trust: &Trust) -> Identity {
        let named = self
            .spec
            .as_ref()
            .and_then(|spec| spec.service_account_name.as_deref());
        Identity::of_rule(
            &self.key().namespace,
            named,
            self.is_tenant(trust),
            trust.tenant_identity,
            &trust.default_service_account,
        )
    }

    /// Merge both shapes, apply defaults, validate, and apply the trust rules.
    pub(crate) fn resolve(&self, trust: &Trust) -> Result<ResolvedRule, InvalidRule> {
        let key = self.key();
        let spec = self.spec.clone().unwrap_or_default();
        let kind = self.resolve_kind(&spec, trust)?;
        let raw_selector = spec
            .selector
            .as_ref()
            .or(self.selector.as_ref())
            .ok_or_else(|| InvalidRule::invalid("selector is required"))?;
        let selector =
            LabelSelector::from_rule_selector(raw_selector).map_err(InvalidRule::invalid)?;
        // The API server filters the sources' watch by the selector, in its
        // URL: a long one is a request that fails before it is sent.
        let query = selector.to_query().len();
        if query > MAX_SELECTOR_QUERY {
            return Err(InvalidRule::invalid(format!(
                "selector: as a query it is {query} bytes long, more than {MAX_SELECTOR_QUERY}"
            )));
        }

        let source_namespaces = match spec.namespace.as_ref().or(self.namespace.as_ref()) {
            None | Some(Value::Null) => vec![key.namespace.clone()],
            Some(value) => parse_namespaces(value).map_err(InvalidRule::invalid)?,
        };
        // A tenant rule may name other source namespaces: what it finds
        // there is copied only with the source's consent, and only into
        // its own namespace (see `plan::is_pulled`).
        let tenant = self.is_tenant(trust);
        if tenant {
            check_tenant_spec(kind, &spec, trust)?;
            if source_namespaces.len() > MAX_TENANT_SOURCE_NAMESPACES {
                return Err(InvalidRule::invalid(format!(
                    "namespace: a rule outside the operator's namespace may name at most \
                     {MAX_TENANT_SOURCE_NAMESPACES} source namespaces, not {}",
                    source_namespaces.len()
                )));
            }
        }
        if let Some(refusal) = self.untrusted_rbac_sources() {
            return Err(refusal);
        }
        let mut targets = spec.targets.unwrap_or_default();
        let clusters = ClusterTargets::resolve(targets.clusters.take())?;
        if tenant {
            check_tenant_clusters(&clusters, trust)?;
        }
        let targets = TargetSelector::resolve(targets)?;
        let transform =
            ResolvedTransform::resolve(spec.transform.unwrap_or_default(), kind, &trust.policy)?;
        let prune = spec.prune.unwrap_or(true);
        let deletion = Deletion::resolve(spec.deletion_policy.as_ref(), prune)?;

        let copy_kind = if transform.to_config_map {
            Kind::ConfigMap
        } else {
            kind
        };
        Ok(ResolvedRule {
            uid: self.metadata.uid.clone().unwrap_or_default(),
            key,
            kind,
            copy_kind,
            selector,
            source_namespaces,
            targets,
            clusters,
            prune,
            conflict_policy: spec.conflict_policy.unwrap_or_default(),
            adopt: spec.adopt.unwrap_or(false),
            sync_policy: spec.sync_policy.or(self.sync_policy).unwrap_or_default(),
            transform,
            deletion,
            policy: trust.policy.clone(),
            tenant,
            in_own_cluster: true,
            restart_consumers: spec
                .rollout
                .as_ref()
                .and_then(|r| r.restart_consumers)
                .unwrap_or(false),
            stages: resolve_stages(spec.rollout.as_ref())?,
            identity: self.identity(trust),
            consent_by_rights: tenant
                && !trust.consent_annotations
                && self.identity(trust) != Identity::Operator,
            granted_targets: None,
        })
    }

    /// Why the rule may not copy the Roles or RoleBindings it names by
    /// `objectType`, if it names them without `rbacSourcesTrusted: true`:
    /// each copy would grant in its target what the writers of its source
    /// grant, and the operator cannot know who they are.
    pub(crate) fn untrusted_rbac_sources(&self) -> Option<InvalidRule> {
        let spec = self.spec.as_ref()?;
        let object_type = spec.object_type.as_ref()?;
        let (group, _) = object_type.group_version()?;
        if !is_rbac_kind(group, &object_type.kind) || spec.rbac_sources_trusted == Some(true) {
            return None;
        }
        Some(InvalidRule {
            reason: "RBACSourcesNotTrusted",
            message: format!(
                "copying {kind}s carries permissions: whoever may write {kind}s in the source \
                 namespaces would grant in every target namespace what they write there; set \
                 spec.rbacSourcesTrusted: true if they are trusted with that",
                kind = object_type.kind
            ),
        })
    }

    /// The kind the rule copies, named by `ruleType` (either shape) or by
    /// `spec.objectType`, never both, and one the operator copies.
    fn resolve_kind(&self, spec: &RuleSpec, trust: &Trust) -> Result<Kind, InvalidRule> {
        match (self.effective_rule_type(), spec.object_type.as_ref()) {
            (Some(_), Some(_)) => Err(InvalidRule::invalid(
                "ruleType and objectType are mutually exclusive",
            )),
            (Some(rule_type), None) => {
                let kind = rule_type.kind();
                if !trust.policy.kinds.has_builtin(kind) {
                    return Err(InvalidRule::invalid(format!(
                        "this operator does not copy {kind}s (its --kinds setting leaves them out, or --denied-kinds denies them)"
                    )));
                }
                Ok(kind)
            }
            (None, Some(object_type)) => object_type_kind(object_type, &trust.policy),
            (None, None) => Err(InvalidRule::invalid(
                "ruleType is required (configmap or secret), or spec.objectType",
            )),
        }
    }
}

impl ObjectType {
    /// Why this kind is not copied whatever the API server serves, if it
    /// is not: a malformed name, the deny-list, `--kinds`.
    pub(crate) fn refusal(&self, policy: &CopyPolicy) -> Option<InvalidRule> {
        let Some((group, _)) = self.group_version() else {
            return Some(InvalidRule::invalid(format!(
                "objectType.apiVersion {:?} is not group/version or v1",
                self.api_version
            )));
        };
        if policy.denied_kinds.denies(group, &self.kind) {
            return Some(InvalidRule {
                reason: "DeniedKind",
                message: format!(
                    "{} is never copied: it is on the deny-list (--denied-kinds; CopyratorRules always are)",
                    self.name()
                ),
            });
        }
        if !policy.kinds.enables(group, &self.kind) {
            return Some(InvalidRule {
                reason: "KindNotEnabled",
                message: format!(
                    "this operator does not copy {}: add it to --kinds (the chart's extraKinds, which also grants the RBAC)",
                    self.name()
                ),
            });
        }
        None
    }
}

fn is_reserved_key(key: &str) -> bool {
    key == crate::LABEL_MANAGED_BY || key.starts_with("copyrator.flant.com/")
}

fn check_transform_entries(field: &str, entries: usize) -> Result<(), InvalidRule> {
    if entries > MAX_TRANSFORM_ENTRIES {
        return Err(InvalidRule::invalid(format!(
            "transform.{field}: {entries} entries; at most {MAX_TRANSFORM_ENTRIES} are allowed"
        )));
    }
    Ok(())
}

/// The checks the API server applies to the labels of every copy, so that
/// a rule that could never be written is reported as invalid instead; the
/// labels Copyrator sets are its own.
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), InvalidRule> {
    check_transform_entries("addLabels", labels.len())?;
    for (label, value) in labels {
        crate::api::selector::validate_label_key(label)
            .and_then(|()| {
                crate::api::selector::validate_label_value(value)
                    .map_err(|e| format!("label {label:?}: value {value:?} {e}"))
            })
            .map_err(|e| InvalidRule::invalid(format!("transform.addLabels: {e}")))?;
        if is_reserved_key(label) {
            return Err(InvalidRule::invalid(format!(
                "transform.addLabels: {label:?} is set by Copyrator itself"
            )));
        }
    }
    Ok(())
}

/// The checks the API server applies to the annotations of every copy, so
/// that a rule that could never be written is reported as invalid instead.
fn check_annotations(annotations: &BTreeMap<String, String>) -> Result<(), InvalidRule> {
    check_transform_entries("addAnnotations", annotations.len())?;
    let mut bytes = 0;
    for (key, value) in annotations {
        // The API server lowercases annotation keys before it checks them.
        crate::api::selector::validate_qualified_name(&key.to_ascii_lowercase()).map_err(|e| {
            InvalidRule::invalid(format!(
                "transform.addAnnotations: annotation key {key:?}: {e}"
            ))
        })?;
        if is_reserved_key(key) {
            return Err(InvalidRule::invalid(format!(
                "transform.addAnnotations: {key:?} is set by Copyrator itself"
            )));
        }
        bytes += key.len() + value.len();
    }
    if bytes > MAX_ANNOTATION_BYTES {
        return Err(InvalidRule::invalid(format!(
            "transform.addAnnotations: keys and values total {bytes} bytes; at most {MAX_ANNOTATION_BYTES} (256 KiB) are allowed"
        )));
    }
    Ok(())
}

fn parse_namespaces(value: &Value) -> Result<Vec<String>, String> {
    let names: Vec<String> = match value {
        Value::String(name) => vec![name.clone()],
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(name) => Ok(name.clone()),
                other => Err(format!("namespace: {other} is not a namespace name")),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(format!(
                "namespace must be a name or a list of names, not {other}"
            ));
        }
    };
    if names.is_empty() {
        return Err(
            "namespace: the list is empty; omit it to copy from the rule's own namespace".into(),
        );
    }
    if names.len() > MAX_SOURCE_NAMESPACES {
        return Err(format!(
            "namespace: the list holds {} names; at most {MAX_SOURCE_NAMESPACES} are allowed",
            names.len()
        ));
    }
    if let Some(name) = names.iter().find(|name| !is_dns_label(name)) {
        return Err(format!("namespace: {name:?} is not a valid namespace name"));
    }
    let mut names = names;
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trust() -> Trust {
        Trust::new("copyrator", false)
    }

    fn rule(value: Value) -> CopyratorRule {
        serde_json::from_value(value).expect("test rule parses")
    }

    #[test]
    fn original_example_resolves() {
        let r = rule(json!({
            "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
            "metadata": {"name": "main-rule", "namespace": "copyrator", "uid": "u1", "labels": {"module": "copyrator"}},
            "ruleType": "configmap",
            "selector": {"copyrator": "true"},
            "namespace": "default"
        }));
        let resolved = r.resolve(&trust()).unwrap();
        assert_eq!(resolved.kind, Kind::ConfigMap);
        assert_eq!(resolved.source_namespaces, vec!["default"]);
        assert_eq!(resolved.selector.to_query(), "copyrator=true");
        assert!(resolved.prune);
        assert_eq!(resolved.conflict_policy, ConflictPolicy::Skip);
        assert_eq!(resolved.uid, "u1");
    }

    #[test]
    fn a_selector_longer_than_a_watch_may_ask_is_invalid() {
        let selector_of = |values: usize| {
            let values: Vec<String> = (0..values).map(|i| format!("{i:061}")).collect();
            rule(json!({
                "metadata": {"name": "r", "namespace": "team-a"},
                "spec": {"ruleType": "configmap", "selector": {"matchExpressions": [
                    {"key": "app", "operator": "In", "values": values}]}}
            }))
        };
        // 63 values of 61 characters: 3,909 bytes as a query.
        assert!(selector_of(63).resolve(&trust()).is_ok());
        let refused = selector_of(1100).resolve(&trust()).unwrap_err();
        assert_eq!(refused.reason, "InvalidRule");
        assert!(
            refused.message.starts_with("selector: as a query it is 68"),
            "{}",
            refused.message
        );
        assert!(refused.message.len() < 120, "the selector is not quoted");
    }

    #[test]
    fn a_tenant_rule_names_few_source_namespaces() {
        let names =
            |count: usize| -> Vec<String> { (0..count).map(|i| format!("src-{i}")).collect() };
        let tenant_rule = |count: usize| {
            rule(json!({
                "metadata": {"name": "r", "namespace": "team-a"},
                "spec": {"ruleType": "configmap", "selector": {"a": "b"}, "namespace": names(count),
                         "targets": {"include": ["team-a"]}}
            }))
        };
        let trust = Trust::new("copyrator", true);
        assert!(
            tenant_rule(MAX_TENANT_SOURCE_NAMESPACES)
                .resolve(&trust)
                .is_ok()
        );
        let refused = tenant_rule(MAX_TENANT_SOURCE_NAMESPACES + 1)
            .resolve(&trust)
            .unwrap_err();
        assert_eq!(refused.reason, "InvalidRule");
        assert!(
            refused.message.contains("at most 16"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_rule_adds_no_tracking_key_of_another_tool() {
        let adding = |field: &str, key: &str| {
            rule(json!({
                "metadata": {"name": "r", "namespace": "copyrator"},
                "spec": {"ruleType": "configmap", "selector": {"a": "b"},
                         "transform": {field: {key: "x"}}}
            }))
            .resolve(&trust())
        };
        for (field, key, says) in [
            (
                "addLabels",
                "copyrator.flant.com/sync-policy",
                "set by Copyrator itself",
            ),
            ("addLabels", "app.kubernetes.io/instance", "never travels"),
            (
                "addAnnotations",
                "copyrator.flant.com/source",
                "set by Copyrator itself",
            ),
            (
                "addAnnotations",
                "argocd.argoproj.io/tracking-id",
                "never travels",
            ),
        ] {
            let refused = adding(field, key).unwrap_err();
            assert!(
                refused.message.contains(says),
                "{field} {key}: {}",
                refused.message
            );
        }
        assert!(adding("addLabels", "team").is_ok());
        assert!(adding("addAnnotations", "argocd.argoproj.io/secret-type").is_ok());
    }

    #[test]
    fn spec_wins_over_top_level_and_lists_work() {
        let r = rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "ruleType": "configmap",
            "selector": {"a": "b"},
            "namespace": ["x", "y"],
            "spec": {
                "ruleType": "secret",
                "namespace": ["z", "a", "z"],
                "prune": false,
                "conflictPolicy": "Overwrite",
                "targets": {"include": ["team-*"], "exclude": ["team-x"]}
            }
        }));
        let resolved = r.resolve(&trust()).unwrap();
        assert_eq!(resolved.kind, Kind::Secret);
        assert_eq!(resolved.source_namespaces, vec!["a", "z"]);
        assert_eq!(
            resolved.selector.to_query(),
            "a=b",
            "top-level selector used when spec has none"
        );
        assert!(!resolved.prune);
        assert_eq!(resolved.conflict_policy, ConflictPolicy::Overwrite);
        let empty = BTreeMap::new();
        assert!(resolved.targets.matches("team-a", &empty));
        assert!(!resolved.targets.matches("team-x", &empty), "exclude wins");
        assert!(!resolved.targets.matches("other", &empty));
    }

    #[test]
    fn prune_false_and_a_deletion_policy_for_what_it_keeps_are_refused() {
        let both = |policy: Value| -> CopyratorRule {
            serde_json::from_value(json!({
                "metadata": {"name": "r", "namespace": "ops"},
                "ruleType": "configmap",
                "selector": {"a": "b"},
                "spec": {"prune": false, "deletionPolicy": policy},
            }))
            .unwrap()
        };
        let trust = Trust::new("ops", false);
        for field in ["sourceGone", "targetLeft"] {
            let err = both(json!({field: "Orphan"})).resolve(&trust).unwrap_err();
            assert!(err.message.contains("prune: false"), "{err:?}");
        }
        // What happens when the rule is deleted is another question.
        let ok = both(json!({"ruleDeleted": "Orphan"}))
            .resolve(&trust)
            .unwrap();
        assert_eq!(ok.deletion.rule_deleted, Disposal::Orphan);
        assert_eq!(ok.deletion.source_gone, Disposal::Delete);
    }

    #[test]
    fn sync_policy_defaults_to_sync_and_spec_wins() {
        let with = |top: Option<&str>, spec: Option<&str>| {
            let mut body = json!({
                "metadata": {"name": "r", "namespace": "copyrator"},
                "ruleType": "configmap", "selector": {"a": "b"}, "spec": {}
            });
            if let Some(top) = top {
                body["syncPolicy"] = json!(top);
            }
            if let Some(spec) = spec {
                body["spec"]["syncPolicy"] = json!(spec);
            }
            rule(body).resolve(&trust()).unwrap().sync_policy
        };
        assert_eq!(with(None, None), SyncPolicy::Sync);
        assert_eq!(with(Some("CreateOnly"), None), SyncPolicy::CreateOnly);
        assert_eq!(with(None, Some("CreateOnly")), SyncPolicy::CreateOnly);
        assert_eq!(with(Some("CreateOnly"), Some("Sync")), SyncPolicy::Sync);
        assert_eq!(
            with(Some("Sync"), Some("CreateOnly")),
            SyncPolicy::CreateOnly
        );
        // Only the two values exist (the CRD's enum refuses others first).
        for bad in ["createOnly", "Always", ""] {
            let parsed = serde_json::from_value::<CopyratorRule>(json!({
                "ruleType": "configmap", "selector": {"a": "b"}, "spec": {"syncPolicy": bad}
            }));
            assert!(parsed.is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn namespace_defaults_to_the_rules_own() {
        let r = rule(
            json!({"metadata": {"name": "r", "namespace": "copyrator"}, "spec": {"ruleType": "secret", "selector": {"a": "b"}}}),
        );
        assert_eq!(
            r.resolve(&trust()).unwrap().source_namespaces,
            vec!["copyrator"]
        );
    }

    #[test]
    fn an_object_type_is_refused_for_its_kind_before_any_discovery() {
        let with_kinds = |kinds: &str| {
            let mut trust = trust();
            let entries: Vec<String> = kinds.split(',').map(str::to_owned).collect();
            let policy = Arc::make_mut(&mut trust.policy);
            policy.kinds = EnabledKinds::parse(&entries).expect("valid kinds");
            trust
        };
        let named = |api_version: &str, kind: &str| {
            rule(json!({
                "metadata": {"name": "r", "namespace": "copyrator"},
                "spec": {"objectType": {"apiVersion": api_version, "kind": kind}, "selector": {"a": "b"}}
            }))
        };
        let reason =
            |r: &CopyratorRule, trust: &Trust| r.resolve(trust).map(|_| ()).unwrap_err().reason;
        assert_eq!(reason(&named("v1", "Pod"), &with_kinds("*")), "DeniedKind");
        assert_eq!(
            reason(&named("flant.com/v1", "CopyratorRule"), &with_kinds("*")),
            "DeniedKind"
        );
        assert_eq!(
            reason(&named("networking.k8s.io/v1", "NetworkPolicy"), &trust()),
            "KindNotEnabled"
        );
        assert_eq!(
            reason(&named("example.com/v1", "Unregistered"), &with_kinds("*")),
            "UnknownKind"
        );
        assert_eq!(
            reason(&named("", "Widget"), &with_kinds("*")),
            "InvalidRule"
        );
        let both = rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "ruleType": "configmap",
            "spec": {"objectType": {"apiVersion": "v1", "kind": "ConfigMap"}, "selector": {"a": "b"}}
        }));
        let err = both.resolve(&with_kinds("*")).unwrap_err();
        assert!(
            err.message.contains("mutually exclusive"),
            "{}",
            err.message
        );
        // The built-in kinds by objectType: the same kind, the same rules.
        let secret = named("v1", "Secret").resolve(&trust()).expect("resolves");
        assert_eq!(secret.kind, Kind::Secret);
        assert_eq!(named("v1", "Secret").kind_name().as_deref(), Some("secret"));
        let widget = Kind::register(&crate::api::kinds::Discovered {
            group: "example.com".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        })
        .expect("room for a kind");
        let resolved = named("example.com/v1", "Widget")
            .resolve(&with_kinds("Widget.example.com"))
            .expect("resolves once registered");
        assert_eq!(resolved.kind, widget);
        // A tenant (a rule elsewhere under --all-namespaces) copies only
        // ConfigMaps and Secrets.
        let mut tenants = with_kinds("*");
        tenants.all_namespaces = true;
        let mut tenant_rule = named("example.com/v1", "Widget");
        tenant_rule.metadata.namespace = Some("team-a".into());
        assert_eq!(reason(&tenant_rule, &tenants), "Forbidden");
        let mut tenant_secret = named("v1", "Secret");
        tenant_secret.metadata.namespace = Some("team-a".into());
        assert!(
            tenant_secret.resolve(&tenants).is_ok(),
            "a tenant's Secret rule"
        );
        let mut keyed = named("example.com/v1", "Widget");
        if let Some(spec) = keyed.spec.as_mut() {
            spec.transform = serde_json::from_value(json!({"keys": {"include": ["a"]}})).ok();
        }
        let err = keyed
            .resolve(&with_kinds("Widget.example.com"))
            .unwrap_err();
        assert!(err.message.contains("transform.keys"), "{}", err.message);
    }

    /// Roles and RoleBindings are copied only by a rule that says whoever
    /// writes them in its source namespaces is trusted; other kinds, and
    /// ClusterRoles (refused for their scope), need nothing.
    #[test]
    fn rbac_kinds_are_copied_only_from_sources_the_rule_trusts() {
        let mut trust = trust();
        let entries = vec!["*".to_owned()];
        Arc::make_mut(&mut trust.policy).kinds = EnabledKinds::parse(&entries).expect("valid");
        let binding = crate::core::grants::tests::role_binding_kind();
        let named = |kind: &str, trusted: Option<bool>| {
            let mut spec = json!({
                "objectType": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind},
                "selector": {"a": "b"}, "namespace": "shared"
            });
            if let Some(trusted) = trusted {
                spec["rbacSourcesTrusted"] = json!(trusted);
            }
            rule(json!({"metadata": {"name": "r", "namespace": "copyrator"}, "spec": spec}))
        };
        for kind in ["Role", "RoleBinding"] {
            for trusted in [None, Some(false)] {
                let refusal = named(kind, trusted)
                    .untrusted_rbac_sources()
                    .expect("refused");
                assert_eq!(refusal.reason, "RBACSourcesNotTrusted");
                assert!(
                    refusal
                        .message
                        .contains(&format!("whoever may write {kind}s"))
                        && refusal.message.contains("spec.rbacSourcesTrusted: true"),
                    "{}",
                    refusal.message
                );
            }
            assert_eq!(named(kind, Some(true)).untrusted_rbac_sources(), None);
        }
        let refused = named("RoleBinding", None).resolve(&trust).unwrap_err();
        assert_eq!(refused.reason, "RBACSourcesNotTrusted");
        let resolved = named("RoleBinding", Some(true))
            .resolve(&trust)
            .expect("trusted");
        assert_eq!(resolved.kind, binding);
        assert_eq!(named("ClusterRole", None).untrusted_rbac_sources(), None);
        let config_maps = rule(json!({"metadata": {"name": "r", "namespace": "copyrator"},
                                      "spec": {"ruleType": "configmap", "selector": {"a": "b"}}}));
        assert_eq!(config_maps.untrusted_rbac_sources(), None);
    }

    #[test]
    fn invalid_rules_say_why() {
        let cases = [
            (json!({"selector": {"a": "b"}}), "ruleType is required"),
            (json!({"ruleType": "secret"}), "selector is required"),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "namespace": 3}),
                "namespace must be",
            ),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "namespace": []}),
                "empty",
            ),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "namespace": "Bad_NS"}),
                "not a valid namespace",
            ),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "spec": {"targets": {"include": ["A*"]}}}),
                "targets.include",
            ),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "spec": {"transform": {"addLabels": {"copyrator.flant.com/rule-uid": "x"}}}}),
                "set by Copyrator",
            ),
            (
                json!({"ruleType": "secret", "selector": {"a": "b"}, "spec": {"targets": {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}}}),
                "targets.namespaceSelector",
            ),
        ];
        for (body, expected) in cases {
            let mut value = body.clone();
            value["metadata"] = json!({"name": "r", "namespace": "copyrator"});
            let err = rule(value).resolve(&trust()).unwrap_err();
            assert!(
                err.message.contains(expected),
                "{body}: {} lacks {expected:?}",
                err.message
            );
            assert_eq!(err.reason, "InvalidRule");
        }
    }

    fn with_transform(transform: Value) -> CopyratorRule {
        rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "spec": {"ruleType": "configmap", "selector": {"a": "b"}, "transform": transform}
        }))
    }

    fn refusal(r: &CopyratorRule) -> String {
        let err = r.resolve(&trust()).expect_err("the rule is refused");
        assert_eq!(err.reason, "InvalidRule");
        err.message
    }

    #[test]
    fn added_labels_must_be_labels_the_api_server_takes() {
        let prefix = format!("{}.example.com", "a".repeat(253 - ".example.com".len()));
        let longest_key = format!("{prefix}/{}", "n".repeat(63));
        let longest_value = "v".repeat(63);
        let at_limit: serde_json::Map<String, Value> = (1..MAX_TRANSFORM_ENTRIES)
            .map(|i| (format!("k{i}"), json!("")))
            .chain([(longest_key.clone(), json!(longest_value))])
            .collect();
        assert_eq!(at_limit.len(), MAX_TRANSFORM_ENTRIES);
        let resolved = with_transform(json!({"addLabels": at_limit}))
            .resolve(&trust())
            .expect("labels at the limits are taken");
        assert_eq!(resolved.transform.add_labels[&longest_key], longest_value);

        let cases = [
            (json!({"bad key!": "x"}), "label key \"bad key!\""),
            (json!({"a": "-bad-"}), "value \"-bad-\""),
            (json!({"a": "v".repeat(64)}), "1-63 characters"),
            (json!({"n".repeat(64): "x"}), "1-63 characters"),
            (
                json!({format!("a{prefix}/n"): "x"}),
                "at most 253 characters",
            ),
            (json!({"Example.com/n": "x"}), "prefix must be"),
        ];
        for (labels, expected) in cases {
            let message = refusal(&with_transform(json!({"addLabels": labels})));
            assert!(
                message.starts_with("transform.addLabels: ") && message.contains(expected),
                "{labels}: {message} lacks {expected:?}"
            );
        }
        let too_many: serde_json::Map<String, Value> = (0..=MAX_TRANSFORM_ENTRIES)
            .map(|i| (format!("k{i}"), json!("")))
            .collect();
        let message = refusal(&with_transform(json!({"addLabels": too_many})));
        assert!(message.contains("at most 64"), "{message}");
    }

    #[test]
    fn added_annotations_must_fit_what_the_api_server_takes() {
        // One key of 8 bytes and a value that fills the rest, to the byte.
        let at_limit = json!({"note/abc": "x".repeat(MAX_ANNOTATION_BYTES - 8)});
        assert!(
            with_transform(json!({"addAnnotations": at_limit}))
                .resolve(&trust())
                .is_ok(),
            "annotations of exactly 256 KiB are taken"
        );
        // Bytes count, not characters: 'é' is two.
        let over = json!({"note/abc": "é".repeat((MAX_ANNOTATION_BYTES - 8) / 2 + 1)});
        let message = refusal(&with_transform(json!({"addAnnotations": over})));
        assert!(
            message.starts_with("transform.addAnnotations: ")
                && message.contains("262146 bytes")
                && message.contains("at most 262144"),
            "{message}"
        );
        let split = json!({"a": "x".repeat(MAX_ANNOTATION_BYTES / 2), "b": "x".repeat(MAX_ANNOTATION_BYTES / 2)});
        let message = refusal(&with_transform(json!({"addAnnotations": split})));
        assert!(message.contains("at most 262144"), "{message}");

        // The API server lowercases annotation keys before checking them.
        assert!(
            with_transform(json!({"addAnnotations": {"Example.COM/Note": "x"}}))
                .resolve(&trust())
                .is_ok()
        );
        let message = refusal(&with_transform(json!({"addAnnotations": {"bad key": "x"}})));
        assert!(message.contains("annotation key \"bad key\""), "{message}");
        let message = refusal(&with_transform(
            json!({"addAnnotations": {"copyrator.flant.com/rule": "x"}}),
        ));
        assert!(message.contains("set by Copyrator"), "{message}");
        let too_many: serde_json::Map<String, Value> = (0..=MAX_TRANSFORM_ENTRIES)
            .map(|i| (format!("k{i}"), json!("")))
            .collect();
        let message = refusal(&with_transform(json!({"addAnnotations": too_many})));
        assert!(message.contains("at most 64"), "{message}");
    }

    #[test]
    fn key_selection_and_renames_resolve() {
        let resolved = with_transform(json!({"keys": {
            "include": ["*.crt", "tls.*"], "exclude": ["tls.key"],
            "rename": {"ca.crt": "root.pem", "tls.crt": "ca.crt", "same": "same"}
        }}))
        .resolve(&trust())
        .expect("a rename chain and an identity are no collision");
        let keys = &resolved.transform.keys;
        assert!(!keys.is_identity());
        let name_on_copies = |key| {
            let mut unlimited = u64::MAX;
            keys.name_on_copies_within(key, &mut unlimited)
                .expect("u64::MAX steps are never used up")
        };
        assert_eq!(name_on_copies("ca.crt"), Some("root.pem"));
        assert_eq!(name_on_copies("tls.crt"), Some("ca.crt"));
        assert_eq!(name_on_copies("tls.key"), None, "exclude wins");
        assert_eq!(name_on_copies("notes"), None, "not included");
        let plain = with_transform(json!({"keys": {"rename": {"a": "a"}}}))
            .resolve(&trust())
            .unwrap();
        assert!(plain.transform.keys.is_identity());
        assert!(
            with_transform(json!({"keys": {"rename": {"a": "b"}, "exclude": ["b"]}}))
                .resolve(&trust())
                .is_ok(),
            "renamed onto a key copies never keep"
        );
    }

    #[test]
    fn rename_collisions_and_bad_keys_are_refused() {
        let cases = [
            (
                json!({"rename": {"a": "c", "b": "c"}}),
                "\"a\" and \"b\" are both renamed to \"c\"",
            ),
            (
                json!({"rename": {"a": "a", "b": "a"}}),
                "both renamed to \"a\"",
            ),
            (
                json!({"rename": {"a": "b"}}),
                "\"a\" is renamed to \"b\", a key that copies keep as it is",
            ),
            (
                json!({"include": ["a", "b"], "rename": {"a": "b"}}),
                "keep as it is",
            ),
            (json!({"rename": {"a": "x/y"}}), "not a data key"),
            (json!({"rename": {"..": "x"}}), "not a data key"),
            (json!({"include": ["a/*"]}), "transform.keys.include"),
            (json!({"exclude": [""]}), "transform.keys.exclude"),
            (
                json!({"include": ["a*b*c*d*e*f*g*h*i*j"]}),
                "a glob holds at most 8",
            ),
            (
                json!({"exclude": ["k".repeat(254)]}),
                "must be 1-253 characters",
            ),
        ];
        for (keys, expected) in cases {
            let message = refusal(&with_transform(json!({ "keys": keys })));
            assert!(
                message.starts_with("transform.keys.") && message.contains(expected),
                "{keys}: {message} lacks {expected:?}"
            );
        }
        let too_many: serde_json::Map<String, Value> = (0..=MAX_TRANSFORM_ENTRIES)
            .map(|i| (format!("k{i}"), json!(format!("n{i}"))))
            .collect();
        let message = refusal(&with_transform(
            json!({"keys": {"rename": too_many, "exclude": ["n*"]}}),
        ));
        assert!(message.contains("at most 64"), "{message}");
    }

    /// The check of renames against include and exclude matches tenant
    /// globs against tenant keys on every pass: past its budget the rule
    /// is refused, never checked at length.
    #[test]
    fn a_rename_check_too_costly_is_refused() {
        // Each glob backtracks from every letter of each long key; the
        // keys renamed to are excluded by the first.
        let globs: Vec<String> = std::iter::once("n*".to_owned())
            .chain((1..64).map(|i| format!("*{}b{i}", "a".repeat(240))))
            .collect();
        let rename: serde_json::Map<String, Value> = (0..64)
            .map(|i| {
                let from = format!("{}{i:02}", "a".repeat(250));
                (from, json!(format!("n{i}")))
            })
            .collect();
        let message = refusal(&with_transform(
            json!({"keys": {"exclude": globs, "rename": rename}}),
        ));
        assert!(
            message.starts_with("transform.keys.rename: ")
                && message.contains(&format!("more than {RENAME_CHECK_STEPS} glob steps")),
            "{message}"
        );
        // The same renames against literal patterns are checked at once.
        let plain: Vec<String> = std::iter::once("n*".to_owned())
            .chain((1..64).map(|i| format!("x{i}.*")))
            .collect();
        let rename: serde_json::Map<String, Value> = (0..64)
            .map(|i| (format!("{}{i:02}", "a".repeat(250)), json!(format!("n{i}"))))
            .collect();
        assert!(
            with_transform(json!({"keys": {"exclude": plain, "rename": rename}}))
                .resolve(&trust())
                .is_ok()
        );
    }

    #[test]
    fn source_namespaces_are_bounded() {
        let names = |n: usize| -> Vec<String> { (0..n).map(|i| format!("ns-{i}")).collect() };
        let at_limit = rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "ruleType": "secret", "selector": {"a": "b"},
            "namespace": names(MAX_SOURCE_NAMESPACES)
        }));
        assert_eq!(
            at_limit.resolve(&trust()).unwrap().source_namespaces.len(),
            MAX_SOURCE_NAMESPACES
        );
        let over = rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "spec": {"ruleType": "secret", "selector": {"a": "b"}, "namespace": names(MAX_SOURCE_NAMESPACES + 1)}
        }));
        assert_eq!(
            refusal(&over),
            "namespace: the list holds 1001 names; at most 1000 are allowed"
        );
    }

    #[test]
    fn rules_elsewhere_may_name_other_source_namespaces_as_tenants() {
        let all = Trust::new("copyrator", true);
        let foreign = rule(
            json!({"metadata": {"name": "r", "namespace": "team-a"}, "ruleType": "secret", "selector": {"a": "b"}, "namespace": "kube-system"}),
        );
        // Valid: what it finds there needs the source's consent (plan.rs).
        let pulling = foreign.resolve(&all).unwrap();
        assert!(pulling.tenant);
        assert_eq!(pulling.source_namespaces, vec!["kube-system"]);
        let own = rule(
            json!({"metadata": {"name": "r", "namespace": "team-a"}, "ruleType": "secret", "selector": {"a": "b"}}),
        );
        assert_eq!(own.resolve(&all).unwrap().source_namespaces, vec!["team-a"]);
        let operator_rule = rule(
            json!({"metadata": {"name": "r", "namespace": "copyrator"}, "ruleType": "secret", "selector": {"a": "b"}, "namespace": "kube-system"}),
        );
        assert!(
            operator_rule.resolve(&all).is_ok(),
            "the operator's namespace may copy from anywhere"
        );
    }

    /// A rule in `namespace` whose spec holds `targets.clusters: clusters`.
    fn with_clusters(namespace: &str, clusters: Value) -> CopyratorRule {
        rule(json!({
            "metadata": {"name": "r", "namespace": namespace},
            "spec": {"ruleType": "secret", "selector": {"a": "b"}, "targets": {"include": ["team-*"], "clusters": clusters}}
        }))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn without_clusters_a_rule_keeps_to_its_home_cluster() {
        let r = rule(json!({
            "metadata": {"name": "r", "namespace": "copyrator"},
            "ruleType": "secret", "selector": {"a": "b"}
        }));
        let resolved = r.resolve(&trust()).unwrap();
        assert_eq!(resolved.clusters, ClusterTargets::home_only());
        assert_eq!(ClusterTargets::default(), ClusterTargets::home_only());
        assert!(resolved.clusters.local);
        assert!(!resolved.clusters.names_members());
        assert!(
            !resolved
                .clusters
                .selects("east", &labels(&[("region", "eu")]))
        );
        // An empty clusters object, or one that only says local, is the same.
        for clusters in [json!({}), json!({"local": true}), json!({"names": []})] {
            let resolved = with_clusters("copyrator", clusters.clone())
                .resolve(&trust())
                .unwrap();
            assert_eq!(resolved.clusters, ClusterTargets::home_only(), "{clusters}");
            assert_eq!(
                resolved.targets.include.len(),
                1,
                "the namespace targets stay"
            );
        }
    }

    #[test]
    fn clusters_by_name_and_by_label_are_a_union() {
        let resolved = with_clusters(
            "copyrator",
            json!({
                "names": ["west", "east", "west"],
                "selector": {"matchLabels": {"region": "eu"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}]}
            }),
        )
        .resolve(&trust())
        .unwrap();
        let clusters = &resolved.clusters;
        assert_eq!(
            clusters.names.iter().collect::<Vec<_>>(),
            ["east", "west"],
            "sorted, once each"
        );
        assert!(clusters.local, "local defaults to true");
        assert!(clusters.names_members());
        let none = labels(&[]);
        assert!(
            clusters.selects("west", &none),
            "by name, whatever its labels"
        );
        assert!(clusters.selects("north", &labels(&[("region", "eu")])));
        assert!(!clusters.selects("north", &labels(&[("region", "eu"), ("tier", "test")])));
        assert!(!clusters.selects("south", &labels(&[("region", "us")])));
        // `{}` selects every member; a selector alone names members.
        let every = with_clusters("copyrator", json!({"selector": {}, "local": false}))
            .resolve(&trust())
            .unwrap()
            .clusters;
        assert!(every.names_members() && !every.local);
        assert!(every.selects("any", &none));
    }

    #[test]
    fn bad_clusters_are_invalid() {
        let too_many: Vec<String> = (0..=MAX_CLUSTER_NAMES).map(|i| format!("m{i}")).collect();
        let cases = [
            (
                json!({"names": ["Bad_Name"]}),
                "targets.clusters.names: \"Bad_Name\" is not a member cluster name",
            ),
            (json!({"names": [""]}), "is not a member cluster name"),
            (
                json!({"names": ["x".repeat(64)]}),
                "is not a member cluster name",
            ),
            (
                json!({"names": too_many}),
                "the list holds 101 names; at most 100",
            ),
            (
                json!({"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                "targets.clusters.selector: matchExpressions",
            ),
            (
                json!({"selector": {"matchLabels": {"bad key": "x"}}}),
                "targets.clusters.selector",
            ),
            (json!({"local": false}), "keep its copies nowhere"),
            (
                json!({"local": false, "names": []}),
                "keep its copies nowhere",
            ),
        ];
        for (clusters, expected) in cases {
            let err = with_clusters("copyrator", clusters.clone())
                .resolve(&trust())
                .unwrap_err();
            assert_eq!(err.reason, "InvalidRule", "{clusters}");
            assert!(
                err.message.contains(expected),
                "{clusters}: {} lacks {expected:?}",
                err.message
            );
        }
        let at_limit: Vec<String> = (0..MAX_CLUSTER_NAMES).map(|i| format!("m{i}")).collect();
        let resolved = with_clusters("copyrator", json!({"names": at_limit}))
            .resolve(&trust())
            .unwrap();
        assert_eq!(resolved.clusters.names.len(), MAX_CLUSTER_NAMES);
    }

    #[test]
    fn a_tenant_rule_reaches_member_clusters_only_when_allowed() {
        let tenants = Trust::new("copyrator", true);
        let mut allowing = tenants.clone();
        allowing.allow_tenant_clusters = true;
        let naming = [
            json!({"names": ["east"]}),
            json!({"selector": {"matchLabels": {"region": "eu"}}}),
            json!({"selector": {}, "local": false}),
        ];
        for clusters in &naming {
            let err = with_clusters("team-a", clusters.clone())
                .resolve(&tenants)
                .unwrap_err();
            assert_eq!(err.reason, "Forbidden", "{clusters}");
            assert!(
                err.message.contains("may not copy into member clusters")
                    && err.message.contains("--allow-tenant-clusters")
                    && err.message.contains("\"copyrator\""),
                "{}",
                err.message
            );
            let resolved = with_clusters("team-a", clusters.clone())
                .resolve(&allowing)
                .expect("allowed by the setting");
            assert!(resolved.tenant && resolved.clusters.names_members());
        }
        // Home alone is no member: a tenant may say so.
        for clusters in [json!({}), json!({"local": true})] {
            let resolved = with_clusters("team-a", clusters).resolve(&tenants).unwrap();
            assert_eq!(resolved.clusters, ClusterTargets::home_only());
        }
        // The operator's own namespace, or any rule without
        // --all-namespaces, is no tenant.
        for (namespace, trust) in [("copyrator", &tenants), ("team-a", &trust())] {
            assert!(
                with_clusters(namespace, naming[0].clone())
                    .resolve(trust)
                    .is_ok(),
                "{namespace}"
            );
        }
        // What is invalid is said before what is forbidden.
        let err = with_clusters("team-a", json!({"names": ["Bad"]}))
            .resolve(&tenants)
            .unwrap_err();
        assert_eq!(err.reason, "InvalidRule");
    }
}
