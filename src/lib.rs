//! Copyrator: keeps copies of ConfigMaps and Secrets in the namespaces that
//! `CopyratorRule` resources target.
//!
//! The source is in layers, one folder each, and a folder uses only the
//! ones below it: `api` (the rule resource and its CRD), `ops` (health,
//! metrics, logging), `cache` (the in-memory views), `core` (the pure
//! decisions: resolve, plan, backoff, status, tally), `cluster` (all that
//! talks to one API server), `controller` (the queue, the workers and a
//! rule's pass) and `cli` (settings, `run`, `plan`, `probe`).
//! ARCHITECTURE.md at the repository's root tells more.
#![forbid(unsafe_code)]
// Only `cli::entry` (for main.rs) and what the integration tests name are
// public: the compiler reports what nothing in the crate uses.
#![warn(unreachable_pub)]
#![warn(clippy::too_many_lines)]

pub mod api;
pub(crate) mod cache;
pub mod cli;
pub(crate) mod cluster;
pub(crate) mod controller;
pub mod core;
pub(crate) mod error;
pub(crate) mod ops;
pub(crate) mod sync;
pub(crate) mod yaml;

pub(crate) use error::{Error, Result};

/// Field manager of every write the operator makes.
pub(crate) const FIELD_MANAGER: &str = "copyrator";
/// Finalizer that lets a deleted rule remove its copies first.
pub(crate) const FINALIZER: &str = "copyrator.flant.com/cleanup";
/// Label on every copy; `managed-by` is the convention other tools read.
pub(crate) const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// On a Secret in the operator's namespace that holds a member cluster's
/// kubeconfig (Cluster API's layout): the member's name.
pub(crate) const LABEL_CLUSTER: &str = "copyrator.flant.com/cluster";
/// On a Secret in the operator's namespace that holds the token of a
/// ClusterProfile's member: the profile's name. The Secret's writer ties it
/// to the profile; the profile never names it.
pub(crate) const LABEL_CLUSTER_PROFILE: &str = "copyrator.flant.com/cluster-profile";
/// Ties a copy to the rule that made it (the rule's UID).
pub(crate) const LABEL_RULE_UID: &str = "copyrator.flant.com/rule-uid";
/// On a copy created under `syncPolicy: CreateOnly`, with the value
/// [`CREATE_ONLY`]: the copy belongs to its namespace, and Copyrator never
/// writes or deletes it again.
pub(crate) const LABEL_SYNC_POLICY: &str = "copyrator.flant.com/sync-policy";
/// The value of [`LABEL_SYNC_POLICY`] that hands a copy over.
pub(crate) const CREATE_ONLY: &str = "CreateOnly";
/// On the copies of a rule with `deletionPolicy.ruleDeleted: Orphan`, with
/// the value [`ORPHAN`]: they are handed over, not deleted, when their rule
/// is gone, even when it went without its finalizer.
pub(crate) const LABEL_ON_RULE_DELETED: &str = "copyrator.flant.com/on-rule-deleted";
/// The value of [`LABEL_ON_RULE_DELETED`] that keeps copies.
pub(crate) const ORPHAN: &str = "Orphan";
/// `namespace/name` of the rule that made a copy.
pub(crate) const ANNOTATION_RULE: &str = "copyrator.flant.com/rule";
/// `namespace/name` of a copy's source.
pub(crate) const ANNOTATION_SOURCE: &str = "copyrator.flant.com/source";
/// On every copy: Copyrator's mark, two tags under the installation's key
/// (see `cache::mark`). Without it an object is no copy of Copyrator's.
pub(crate) const ANNOTATION_MARK: &str = "copyrator.flant.com/mark";
/// On the mark key Secret: a tag of the Secret's uid under the key it
/// holds, written by the operator that made it (see `cache::mark::key_proof`).
pub(crate) const ANNOTATION_MARK_KEY_PROOF: &str = "copyrator.flant.com/mark-key-proof";
/// On a copy that a rule adopted (`spec.adopt`): what made the object
/// before, the other tool's name or `an earlier rule`.
pub(crate) const ANNOTATION_ADOPTED_FROM: &str = "copyrator.flant.com/adopted-from";
/// UID of a copy's source.
pub(crate) const ANNOTATION_SOURCE_UID: &str = "copyrator.flant.com/source-uid";
/// On a copy in a member cluster: the name of the cluster its source is in
/// (`--cluster-name`).
pub(crate) const ANNOTATION_SOURCE_CLUSTER: &str = "copyrator.flant.com/source-cluster";
/// On a source object: namespaces (names or globs, comma-separated) whose
/// tenant rules may pull it into their own namespace.
pub(crate) const ANNOTATION_ALLOW_TO: &str = "copyrator.flant.com/allow-to";
/// On a namespace: the namespaces (names or globs, comma-separated) whose
/// tenant rules may write copies into it.
pub(crate) const ANNOTATION_ACCEPT_FROM: &str = "copyrator.flant.com/accept-from";
/// On a namespace: the namespaces (names or globs, comma-separated) whose
/// tenant rules may adopt objects here (`spec.adopt`) that no copying
/// tool's mark says came from the rule's namespace, and delete what they
/// adopted when it no longer belongs.
pub(crate) const ANNOTATION_ADOPT_FROM: &str = "copyrator.flant.com/adopt-from";
/// On a Deployment, StatefulSet or DaemonSet: `"false"` keeps rules with
/// `rollout.restartConsumers` from rolling it.
pub(crate) const ANNOTATION_RESTART: &str = "copyrator.flant.com/restart";
/// Start of the pod-template annotation that rolls a workload using a
/// copy: `copyrator.flant.com/restart-` and 16 hex digits of the SHA-256
/// of `Kind/name` of the copy; its value is a tag of what the workload
/// uses of the copy, and where (`cache::mark::restart_value`).
pub(crate) const ANNOTATION_RESTART_PREFIX: &str = "copyrator.flant.com/restart-";
