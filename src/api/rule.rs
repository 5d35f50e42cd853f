//! The `CopyratorRule` resource (flant.com/v1): its types as the API
//! server stores them (`core::resolve` validates them).
//!
//! The resource keeps the original Python Copyrator's shape, with `ruleType`,
//! `selector` and `namespace` at the top level, and also takes them under
//! `spec` (which wins where both are set).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as K8sLabelSelector, ObjectMeta,
};
use kube::core::{NamespaceResourceScope, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::kinds::{Kind, kind_name};

use crate::api::{GROUP, KIND, PLURAL, VERSION};

/// A CopyratorRule as stored by the API server.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CopyratorRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    /// Original form: `configmap` or `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rule_type: Option<RuleType>,
    /// Original form: labels a source must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) selector: Option<serde_json::Map<String, Value>>,
    /// Original form: source namespace, a name or a list of names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<Value>,
    /// Original form: `Sync` or `CreateOnly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sync_policy: Option<SyncPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<RuleSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<RuleStatus>,
}

impl Resource for CopyratorRule {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The kind of object a rule copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum RuleType {
    #[serde(rename = "configmap")]
    ConfigMap,
    #[serde(rename = "secret")]
    Secret,
}

impl RuleType {
    pub(crate) fn kind(self) -> Kind {
        match self {
            RuleType::ConfigMap => Kind::ConfigMap,
            RuleType::Secret => Kind::Secret,
        }
    }
}

/// A kind named by its API version and kind, as in an object's own header.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObjectType {
    /// `group/version`, or `v1` for the core group.
    pub(crate) api_version: String,
    /// The kind, such as `RoleBinding` or `NetworkPolicy`.
    pub(crate) kind: String,
}

impl ObjectType {
    /// `(group, version)`; `None` when `apiVersion` is not one.
    pub(crate) fn group_version(&self) -> Option<(&str, &str)> {
        match self.api_version.split_once('/') {
            Some((group, version)) if !group.is_empty() && !version.is_empty() => {
                Some((group, version))
            }
            None if !self.api_version.is_empty() => Some(("", self.api_version.as_str())),
            _ => None,
        }
    }

    /// `Kind.group`, as settings and statuses name it.
    pub(crate) fn name(&self) -> String {
        let group = self.group_version().map_or("", |(g, _)| g);
        kind_name(group, &self.kind)
    }
}

/// What to copy, from where, and into which namespaces.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RuleSpec {
    /// Kind of the objects to copy: `configmap` or `secret`. Wins over the top-level `ruleType`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rule_type: Option<RuleType>,
    /// Any namespaced kind to copy, instead of `ruleType`: its `apiVersion`
    /// and `kind`, such as `rbac.authorization.k8s.io/v1` and `RoleBinding`.
    /// Resolved by API discovery; an unknown, cluster-scoped or denied kind,
    /// or one `--kinds` leaves out, is reported in the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::object_type_schema")]
    pub(crate) object_type: Option<ObjectType>,
    /// Labels a source must carry, all of them (`{copyrator: "true"}`), or a
    /// label selector with `matchLabels` and `matchExpressions`. Wins over the
    /// top-level `selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::selector_schema")]
    pub(crate) selector: Option<serde_json::Map<String, Value>>,
    /// Source namespace, one name or a list of names. Defaults to the rule's
    /// own namespace. Wins over the top-level `namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::namespace_schema")]
    pub(crate) namespace: Option<Value>,
    /// Namespaces that receive copies. Defaults to every namespace but the source's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) targets: Option<Targets>,
    /// Delete copies whose source is gone or no longer matches, and copies in
    /// namespaces that no longer match the targets. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prune: Option<bool>,
    /// What to do when a target namespace already holds an object of the same
    /// name that Copyrator did not make: `Skip` leaves it alone and reports
    /// it, `Overwrite` replaces it with the copy. Default Skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) conflict_policy: Option<ConflictPolicy>,
    /// Take over an object already at a copy's place whose payload is what
    /// the rule would write (made by another tool, or handed over by an
    /// earlier rule of this namespace and name): one metadata patch, no
    /// payload write, no consumer restart; the other tool's marks are
    /// removed. An object whose payload differs is left to
    /// `conflictPolicy`. Default false: such an object is a conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) adopt: Option<bool>,
    /// Whether copies are kept true or only created: `Sync` or `CreateOnly`.
    /// Default Sync. Wins over the top-level `syncPolicy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sync_policy: Option<SyncPolicy>,
    /// Labels and annotations to add to or strip from copies, and the data
    /// keys they carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) transform: Option<Transform>,
    /// What becomes of a copy that no longer belongs: deleted, or orphaned
    /// (handed over to its namespace, as `syncPolicy: CreateOnly` copies
    /// are, and never written again). Default: deleted in every case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deletion_policy: Option<DeletionPolicy>,
    /// What follows a change of a copy's content: `restartConsumers` rolls
    /// the workloads that use the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rollout: Option<Rollout>,
    /// Required to copy Roles or RoleBindings (`objectType` in
    /// `rbac.authorization.k8s.io`): says that whoever may write Roles and
    /// RoleBindings in the source namespaces is trusted to grant what they
    /// write there in every target namespace. Without it such a rule copies
    /// nothing and reads `RBACSourcesNotTrusted`. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rbac_sources_trusted: Option<bool>,
    /// A ServiceAccount of the rule's own namespace that the rule's writes
    /// are sent as (impersonated): the API server then decides, under that
    /// identity, what the rule may write. Default for a rule outside the
    /// operator's namespace under `--tenant-identity service-account`: the
    /// operator's `--default-service-account` (`copyrator`); a rule of the
    /// operator's namespace that names none writes as the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::service_account_name_schema")]
    pub(crate) service_account_name: Option<String>,
}

/// What becomes of copies when their rule is deleted, when their source
/// goes or stops matching, and when their namespace leaves the targets.
/// Each is `Delete` (the default) or `Orphan`. `prune: false` keeps such
/// copies as they are instead (still the rule's, deleted with it), and
/// cannot be combined with `sourceGone` or `targetLeft`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeletionPolicy {
    /// When the rule is deleted. Default Delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rule_deleted: Option<Disposal>,
    /// When a copy's source is deleted or stops matching the rule. Default Delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) source_gone: Option<Disposal>,
    /// When a copy's namespace (or cluster) leaves the rule's targets. Default Delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target_left: Option<Disposal>,
}

/// What becomes of a copy that no longer belongs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum Disposal {
    /// The copy is deleted.
    #[default]
    Delete,
    /// The copy stays, handed over to its namespace: it gets the label
    /// `copyrator.flant.com/sync-policy: CreateOnly` and is never written
    /// or deleted by Copyrator again.
    Orphan,
}

/// What follows a change of a copy's content in its namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rollout {
    /// When a write changes a ConfigMap or Secret copy's data, roll the
    /// Deployments, StatefulSets and DaemonSets in its namespace whose pods
    /// use it (volumes, projected volumes, `envFrom`, `env[].valueFrom`):
    /// their pod template gets the annotation
    /// `copyrator.flant.com/restart-<hash of kind and name>` with a hash of
    /// the keys they use. A workload that names keys rolls only when one of
    /// them changes; the annotation `copyrator.flant.com/restart: "false"`
    /// on a workload leaves it alone. Needs the chart value
    /// `rollout.restartConsumers`. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) restart_consumers: Option<bool>,
    /// Roll a source's new content out in stages: each stage is a
    /// selection of target namespaces, reached only once the stage before
    /// has settled (every copy there holds the new content and, with
    /// `restartConsumers`, the workloads that use it are available again)
    /// and its pause is over. Namespaces no stage selects come last. A stage
    /// not settled within `settleTimeoutSeconds` halts the rollout: later
    /// stages keep their content. At most 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 10))]
    pub(crate) stages: Option<Vec<RolloutStage>>,
    /// How long a stage may take to settle before the rollout halts there.
    /// Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub(crate) settle_timeout_seconds: Option<u32>,
}

/// One stage of a rollout: the target namespaces it selects (both fields
/// when both are given; neither selects every namespace not selected
/// before), and the pause after it settles.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RolloutStage {
    /// A name for the status, e.g. `canary`.
    #[schemars(length(min = 1, max = 63))]
    pub(crate) name: String,
    /// Label selector on the target namespaces of this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace_selector: Option<K8sLabelSelector>,
    /// Glob patterns (`*`, `?`) on namespace names; a namespace of this
    /// stage matches one. At most 64, each of at most 63 characters and
    /// 8 `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::namespace_globs_schema")]
    pub(crate) include: Option<Vec<String>>,
    /// Seconds to wait after this stage settled before the next one opens. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86400))]
    pub(crate) pause_seconds: Option<u32>,
    /// The clusters of this stage: its places are the target namespaces
    /// it selects in these clusters. Default: every cluster the rule
    /// targets (home and members).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clusters: Option<StageClusters>,
    /// `Manual`: the stage opens only once the rule carries the annotation
    /// `copyrator.flant.com/approve` naming this stage and the content
    /// (`STAGE=CONTENT`, as `status.rollouts[].content` says it; several
    /// space-separated). Default `Automatic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) approval: Option<StageApproval>,
    /// How many member clusters of this stage may be unreachable while it
    /// settles: past that, the stage does not settle, and halts naming
    /// them. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1000))]
    pub(crate) max_unavailable_clusters: Option<u32>,
}

/// The clusters a stage covers: members by name or label, and the home
/// cluster. Given, a cluster none of its fields names is not in the stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StageClusters {
    /// Member clusters by name (DNS-1123 labels). At most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::cluster_names_schema")]
    pub(crate) names: Option<Vec<String>>,
    /// Label selector on member clusters; `{}` selects every member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) selector: Option<K8sLabelSelector>,
    /// The home cluster is in this stage. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) home: Option<bool>,
}

/// How a stage opens once the stage before it settled and paused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum StageApproval {
    /// At once.
    #[default]
    Automatic,
    /// Once approved for this content (the rule's annotation
    /// `copyrator.flant.com/approve`).
    Manual,
}

/// Which namespaces receive copies. A namespace is a target when it matches
/// the selector, matches one `include` pattern (if any are given) and no
/// `exclude` pattern.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Targets {
    /// Label selector on target namespaces. Default: all namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace_selector: Option<K8sLabelSelector>,
    /// Glob patterns (`*`, `?`) on namespace names; a target must match one.
    /// At most 64, each of at most 63 characters and 8 `*`. Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::namespace_globs_schema")]
    pub(crate) include: Option<Vec<String>>,
    /// Glob patterns (`*`, `?`) on namespace names that never receive
    /// copies. Exclude wins over include. At most 64, each of at most 63
    /// characters and 8 `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::namespace_globs_schema")]
    pub(crate) exclude: Option<Vec<String>>,
    /// Clusters that receive copies: this (home) cluster, and member
    /// clusters by name or label. Default: this cluster alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clusters: Option<TargetClusters>,
}

/// Which clusters receive copies, in the namespaces the other target
/// fields select there. Sources are always read in this (home) cluster.
/// A member is a target when `names` lists it or `selector` matches its
/// labels (the union of both).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.local) || self.local || (has(self.names) && size(self.names) > 0) || has(self.selector)",
    "message": "local: false needs names or a selector: a rule must keep its copies somewhere"
}]))]
pub(crate) struct TargetClusters {
    /// Member clusters by name (DNS-1123 labels). At most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::cluster_names_schema")]
    pub(crate) names: Option<Vec<String>>,
    /// Label selector on member clusters (`matchLabels`, `matchExpressions`);
    /// `{}` selects every member. Default: none by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) selector: Option<K8sLabelSelector>,
    /// This (home) cluster receives copies too. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) local: Option<bool>,
}

/// What a rule does when a target already has a foreign object of the same name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum ConflictPolicy {
    /// Leave the foreign object alone and report the conflict.
    #[default]
    Skip,
    /// Replace the foreign object with the copy.
    Overwrite,
}

/// Whether the rule keeps its copies true or only creates them: `Sync` or
/// `CreateOnly`. Default Sync. Under `spec` it wins over the top-level
/// `syncPolicy`.
///
/// `Sync`: copies follow their source: updated when it changes, restored
/// when edited, pruned when they no longer belong (see `prune`), deleted
/// with the rule. `CreateOnly`: a copy is created where it is missing and
/// then belongs to its namespace: Copyrator never updates, restores or
/// deletes it again, not when the source changes or goes, not when the
/// namespace leaves the targets, not when the rule is deleted or changed.
/// Such copies carry the label `copyrator.flant.com/sync-policy:
/// CreateOnly`; remove it from a copy to have its rule write it again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum SyncPolicy {
    /// Keep every copy true for as long as the rule exists.
    #[default]
    Sync,
    /// Create a copy where it is missing, then leave it to its namespace.
    CreateOnly,
}

/// Changes applied to the labels and annotations of every copy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.toKind) || (has(self.keys) && has(self.keys.include) && size(self.keys.include) > 0)",
    "message": "toKind: ConfigMap needs keys.include: the Secret's keys a ConfigMap may hold, named (a Secret's other keys, its private key among them, never travel)"
}]))]
pub(crate) struct Transform {
    /// Labels set on every copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::add_labels_schema")]
    pub(crate) add_labels: Option<BTreeMap<String, String>>,
    /// Annotations set on every copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::add_annotations_schema")]
    pub(crate) add_annotations: Option<BTreeMap<String, String>>,
    /// Source labels not carried to copies: keys or glob patterns
    /// (`example.com/*`). At most 64, each of at most 317 characters and 8 `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::meta_key_globs_schema")]
    pub(crate) strip_labels: Option<Vec<String>>,
    /// Source annotations not carried to copies: keys or glob patterns. At
    /// most 64, each of at most 317 characters and 8 `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::meta_key_globs_schema")]
    pub(crate) strip_annotations: Option<Vec<String>>,
    /// The data keys copies carry, and under which names: of a ConfigMap's
    /// `data` and `binaryData`, of a Secret's `data`. Default: every key,
    /// under its own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) keys: Option<KeyTransform>,
    /// The copies' name, from their source's: `prefix` and/or `suffix`, or
    /// a `template` holding `{name}` once. Default: the source's own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::copy_name_schema")]
    pub(crate) name: Option<CopyName>,
    /// The kind copies are: `ConfigMap`, for a rule copying Secrets, holds
    /// the keys `keys.include` selects as text (a Secret's public half,
    /// such as a CA). Default: the source's kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) to_kind: Option<ToKind>,
}

/// The kind a rule's copies are, when not its sources' (`transform.toKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum ToKind {
    /// A ConfigMap holding chosen keys of a Secret as text.
    ConfigMap,
}

/// How a copy is named from its source's name (`transform.name`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CopyName {
    /// Put before the source's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prefix: Option<String>,
    /// Put after the source's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) suffix: Option<String>,
    /// The copy's name, with `{name}` standing for the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) template: Option<String>,
}

/// Which data keys copies carry, and under which names. A copy whose
/// source has none of the selected keys is still made, with no data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeyTransform {
    /// Glob patterns (`*`, `?`) on the source's data keys; copies carry only
    /// the keys that match one. At most 64, each of at most 253 characters
    /// and 8 `*`. Default: every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::data_key_globs_schema")]
    pub(crate) include: Option<Vec<String>>,
    /// Glob patterns (`*`, `?`) on the source's data keys that copies never
    /// carry; exclude wins over include. At most 64, each of at most 253
    /// characters and 8 `*`. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::data_key_globs_schema")]
    pub(crate) exclude: Option<Vec<String>>,
    /// Data keys renamed on copies: source key to the key on copies, for the
    /// keys that include and exclude select. No two keys may get one name,
    /// and no key may be renamed onto a key that copies keep as it is
    /// (exclude that key, or rename it too). At most 64. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::rename_keys_schema")]
    pub(crate) rename: Option<BTreeMap<String, String>>,
}

/// What the operator last saw and did for a rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RuleStatus {
    /// The rule generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) observed_generation: Option<i64>,
    /// The kind the rule copies, resolved from `ruleType` or `spec.ruleType`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rule_type: Option<String>,
    /// Whom the rule's writes are sent as: `operator`, or the user name of
    /// the ServiceAccount the operator impersonates for it
    /// (`system:serviceaccount:<namespace>:<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<String>,
    /// `Ready` tells whether every copy the rule asks for is in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) conditions: Vec<Condition>,
    /// Objects that match the rule's selector in its source namespaces.
    #[serde(default)]
    pub(crate) sources: i64,
    /// Namespaces that receive copies.
    #[serde(default)]
    pub(crate) target_namespaces: i64,
    /// Copies in place and up to date.
    #[serde(default)]
    pub(crate) copies: i64,
    /// Copies this rule created under `syncPolicy: CreateOnly`, which now
    /// belong to their namespaces: Copyrator never updates or deletes them
    /// again, wherever they are (those of current sources in target
    /// namespaces count in `copies` too).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) create_only_copies: i64,
    /// Of the rule's copies, how many it adopted (`spec.adopt`): objects
    /// another tool or an earlier rule made, taken over without a payload
    /// write (left out while there are none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) adopted_copies: i64,
    /// Number of copies not made because of a conflict (another object
    /// holds the name, or the copy would grant there what its source does
    /// not).
    #[serde(default)]
    pub(crate) conflict_count: i64,
    /// Copies not made because of a conflict, each with why (at most 20
    /// listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) conflicts: Vec<ConflictEntry>,
    /// Namespaces the targets would reach but for their protection (only
    /// an exact name in `targets.include` reaches a protected namespace).
    #[serde(default)]
    pub(crate) protected_namespaces: i64,
    /// For a rule outside the operator's namespace: namespaces its targets
    /// would reach but that do not accept copies from it (their annotation
    /// `copyrator.flant.com/accept-from` does not list its namespace).
    #[serde(default)]
    pub(crate) not_accepting_namespaces: i64,
    /// Number of sources not copied because of their type.
    #[serde(default)]
    pub(crate) refused_source_count: i64,
    /// Sources not copied because of their type, and why (at most 20 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) refused_sources: Vec<ConflictEntry>,
    /// Number of copies that another writer keeps changing back; writes to
    /// them back off (about 1 s doubling to 5 min).
    #[serde(default)]
    pub(crate) contested_count: i64,
    /// Contested copies and the field manager that changes them (at most 20 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) contested: Vec<ContestedEntry>,
    /// When the operator last changed a copy or this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_sync_time: Option<String>,
    /// For a rule whose `targets.clusters` names member clusters: each
    /// member it targets, and how its copies there stand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clusters: Option<Vec<ClusterStatus>>,
    /// For a rule whose `targets.clusters` names member clusters: the
    /// targeted members that are ready, of all targeted (`2/3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clusters_ready: Option<String>,
    /// For a rule with `rollout.stages`: each source whose new content is
    /// still on its way through the stages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) rollouts: Vec<RolloutStatus>,
    /// For a rule with `rollout.stages`: by copy name, the contents its
    /// copies may hold as rolled out (space-separated keyed digests, which
    /// tell nothing of the content; the newest last). What a restart keeps
    /// of the rollouts: a copy at any other content, even one Copyrator
    /// once wrote there, is restored at once and starts no rollout. Kept
    /// for at most 2,000 sources. Written by the operator alone.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) rolled_out: BTreeMap<String, String>,
}

/// Where one source's new content stands in a staged rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RolloutStatus {
    /// The source, `namespace/name`.
    pub(crate) source: String,
    /// The last stage the new content has reached (`rest` for the
    /// namespaces no stage selects).
    pub(crate) stage: String,
    /// Its place in the order, from 1, and how many stages there are.
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) stage_number: u32,
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) stages: u32,
    /// `Settling` (being written, or its consumers rolling), `Pausing`
    /// (settled; the next stage opens after its pause) or `Halted` (not
    /// settled within the settle timeout: later stages keep their content).
    pub(crate) phase: String,
    /// Why a halted stage has not settled: the workloads not available, or
    /// the copies not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
    /// The copies' name (the source's, unless `transform.name` renames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// The new content: a keyed digest (16 hex digits) that tells nothing
    /// of it; what an approval names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
    /// When the stage opened (or, awaiting approval, was reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) opened_at: Option<String>,
    /// When the stage settled; the next opens `pauseSeconds` after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) settled_at: Option<String>,
    /// Each cluster the rule targets, and how its places stand in this
    /// rollout (at most 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) clusters: Vec<RolloutCluster>,
}

/// One cluster in a rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RolloutCluster {
    /// The member's name, or the home cluster's (`--cluster-name`).
    pub(crate) name: String,
    /// `Done` (its places hold the new content), `Settling` (in the open
    /// stage, not settled), `Settled` (in the open stage, settled),
    /// `Waiting` (its places are in later stages), `Unreachable`.
    pub(crate) phase: String,
}

/// How a rule's copies stand in one member cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterStatus {
    /// The member cluster's name.
    pub(crate) name: String,
    /// Whether every copy the rule asks for there is in place.
    pub(crate) ready: bool,
    /// One word for why it is not ready (or how it is), as the `Ready`
    /// condition's reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// What happened there, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
    /// Namespaces there that receive copies.
    #[serde(default)]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) target_namespaces: u32,
    /// Copies there in place and up to date.
    #[serde(default)]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) copies: u32,
    /// Copies there not made because of a conflict.
    #[serde(default)]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) conflicts: u32,
    /// Copies there handed over under `syncPolicy: CreateOnly` (left out
    /// while there are none).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) create_only_copies: u32,
    /// Copies there that the rule adopted (left out while there are none).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) adopted_copies: u32,
    /// Copies there that another writer keeps changing back (left out
    /// while there are none).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(schema_with = "crate::api::schema::count_schema")]
    pub(crate) contested: u32,
    /// For a rule with `rollout.stages`: what its copies there may hold as
    /// rolled out, as the rule's own `rolledOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rolled_out: Option<BTreeMap<String, String>>,
}

/// A count left out of the status while it is zero (serde passes a reference).
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero<N: Default + PartialEq>(n: &N) -> bool {
    *n == N::default()
}

/// A status condition, after the Kubernetes API conventions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Condition {
    /// `Ready`: every copy the rule wants is in place.
    #[serde(rename = "type")]
    pub(crate) type_: String,
    /// `True`, `False` or `Unknown`.
    pub(crate) status: String,
    /// One word for why: `Synced`, `SyncFailed`, `InvalidRule`,
    /// `Forbidden`, `WaitingForSources`, ...
    pub(crate) reason: String,
    /// What happened, for people.
    pub(crate) message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_transition_time: Option<String>,
    /// The rule's `metadata.generation` this condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) observed_generation: Option<i64>,
}

/// A copy that another writer keeps changing back.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContestedEntry {
    /// The member cluster the copy is in; none in the home cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cluster: Option<String>,
    /// Namespace of the copy.
    pub(crate) namespace: String,
    /// Name of the copy.
    pub(crate) name: String,
    /// The field manager (from `managedFields`) that last changed it.
    pub(crate) writer: String,
}

/// A copy that was not made because the target holds something else, or
/// because it would grant there what its source does not.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConflictEntry {
    /// The member cluster the place is in; none in the home cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cluster: Option<String>,
    /// Namespace of the place (or of the source refused).
    pub(crate) namespace: String,
    /// Name of the object.
    pub(crate) name: String,
    /// Why it was skipped.
    pub(crate) reason: String,
}

/// `namespace/name` of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RuleKey {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl RuleKey {
    pub(crate) fn of(rule: &CopyratorRule) -> Self {
        Self {
            namespace: rule.metadata.namespace.clone().unwrap_or_default(),
            name: rule.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for RuleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl CopyratorRule {
    pub(crate) fn key(&self) -> RuleKey {
        RuleKey::of(self)
    }

    pub(crate) fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    pub(crate) fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// What becomes of the rule's copies when it is deleted
    /// (`deletionPolicy.ruleDeleted`), read without resolving the rule: a
    /// rule that no longer resolves is still cleaned up after.
    pub(crate) fn on_deletion(&self) -> Disposal {
        self.spec
            .as_ref()
            .and_then(|spec| spec.deletion_policy.as_ref())
            .and_then(|policy| policy.rule_deleted)
            .unwrap_or_default()
    }

    /// Whether the rule's status says Ready=True (for the generation it
    /// describes; a newer spec not yet looked at still shows the last
    /// result, as `kubectl get` does).
    pub(crate) fn is_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }

    pub(crate) fn has_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == crate::FINALIZER)
    }

    /// `spec.objectType`, if the rule names its kind that way.
    pub(crate) fn object_type(&self) -> Option<&ObjectType> {
        self.spec.as_ref().and_then(|s| s.object_type.as_ref())
    }

    /// How the status names the rule's kind: `configmap`, `secret`, or
    /// `Kind.group`; even when the rule is invalid.
    pub(crate) fn kind_name(&self) -> Option<String> {
        match (self.effective_rule_type(), self.object_type()) {
            (Some(rule_type), _) => Some(rule_type.kind().info().rule_type.to_owned()),
            (None, Some(object_type)) => Some(match object_type.group_version() {
                Some((group, _)) => match Kind::find(group, &object_type.kind) {
                    Some(kind) => kind.info().rule_type.to_owned(),
                    None => object_type.name(),
                },
                None => object_type.name(),
            }),
            (None, None) => None,
        }
    }

    /// The rule type as written (spec wins), for status even when the rule is invalid.
    pub(crate) fn effective_rule_type(&self) -> Option<RuleType> {
        self.spec
            .as_ref()
            .and_then(|s| s.rule_type)
            .or(self.rule_type)
    }
}
