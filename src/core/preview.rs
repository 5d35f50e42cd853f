//! What a pass over one rule would do now, as `copyrator plan` reports it:
//! the writes it would make and what it would leave out, and why, each in
//! the cluster it concerns (the home cluster or a member).

use serde::Serialize;

use crate::api::kinds::Kind;
use crate::api::rule::{ConflictEntry, RuleKey};
use crate::core::identity::Identity;
use crate::core::plan::{Action, Exclusion};

/// One write a pass would make.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct PlannedChange {
    /// The cluster written: the home cluster's name (`--cluster-name`) or
    /// a member's name in the inventory.
    pub(crate) cluster: String,
    /// `create`, `update`, `recreate` or `delete`.
    pub(crate) action: &'static str,
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `namespace/name` of the rule.
    pub(crate) rule: String,
    /// `namespace/name` of the copy's source, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    /// Whom the write would be sent as, when not the operator: the
    /// ServiceAccount the rule acts as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<String>,
    /// For a staged rule: the stage of the place (`rest` for the places no
    /// stage selects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stage: Option<String>,
    /// The write brings new content into a stage its rollout has not
    /// opened yet, as the rule's status records it: held until it opens.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) held: bool,
}

impl PlannedChange {
    pub(crate) fn of(cluster: &str, rule: &str, kind: Kind, action: &Action) -> Self {
        let (namespace, name) = action.target();
        let source = action.source();
        Self {
            cluster: cluster.to_owned(),
            action: action.verb(),
            kind: kind.to_string(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            rule: rule.to_owned(),
            source: (!source.is_empty()).then(|| source.to_owned()),
            identity: None,
            stage: None,
            held: false,
        }
    }

    /// The change in `stage`, held until it opens when `held`.
    pub(crate) fn in_stage(self, stage: &str, held: bool) -> Self {
        Self {
            stage: Some(stage.to_owned()),
            held,
            ..self
        }
    }

    /// The change as `identity` would write it.
    pub(crate) fn sent_as(self, identity: &Identity) -> Self {
        Self {
            identity: identity.impersonated_user(),
            ..self
        }
    }

    pub(crate) fn order(&self) -> (&str, &str, &str, &str, &str, &str) {
        (
            &self.cluster,
            &self.rule,
            &self.kind,
            &self.namespace,
            &self.name,
            self.action,
        )
    }
}

/// Something a pass would leave out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Skip {
    /// The cluster it concerns, as in [`PlannedChange::cluster`].
    pub(crate) cluster: String,
    /// The kind copied, or `Namespace` for a target namespace left out.
    pub(crate) kind: String,
    /// Absent for a namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) rule: String,
    pub(crate) reason: String,
}

impl Skip {
    /// A copy not written: another object holds its name, or another
    /// source of the name wins.
    pub(crate) fn copy(cluster: &str, rule: &str, kind: Kind, conflict: &ConflictEntry) -> Self {
        Self {
            cluster: cluster.to_owned(),
            kind: kind.to_string(),
            namespace: Some(conflict.namespace.clone()),
            name: conflict.name.clone(),
            rule: rule.to_owned(),
            reason: conflict.reason.clone(),
        }
    }

    /// A source not copied for its type; `source` is `namespace/name`.
    pub(crate) fn source(cluster: &str, rule: &str, kind: Kind, source: &str, why: &str) -> Self {
        let (namespace, name) = source.split_once('/').unwrap_or(("", source));
        Self {
            cluster: cluster.to_owned(),
            kind: kind.to_string(),
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            rule: rule.to_owned(),
            reason: format!("not copied as a source: {why}"),
        }
    }

    /// A namespace the rule's targets match that receives nothing.
    pub(crate) fn namespace(
        cluster: &str,
        rule: &RuleKey,
        namespace: &str,
        exclusion: Exclusion,
    ) -> Self {
        let reason = match exclusion {
            Exclusion::Protected => {
                "protected: only its exact name in targets.include reaches it".to_owned()
            }
            Exclusion::NotAccepting => format!(
                "does not accept copies from namespace {}: its annotation {} does not name it",
                rule.namespace,
                crate::ANNOTATION_ACCEPT_FROM
            ),
        };
        Self {
            cluster: cluster.to_owned(),
            kind: "Namespace".into(),
            namespace: None,
            name: namespace.to_owned(),
            rule: rule.to_string(),
            reason,
        }
    }

    /// A member the rule selects that cannot hold its copies: members
    /// receive ConfigMaps and Secrets only.
    pub(crate) fn member(cluster: &str, rule: &str, why: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            kind: "Cluster".into(),
            namespace: None,
            name: cluster.to_owned(),
            rule: rule.to_owned(),
            reason: why.to_owned(),
        }
    }

    pub(crate) fn order(&self) -> (&str, &str, &str, &str, &str, &str) {
        (
            &self.cluster,
            &self.rule,
            &self.kind,
            self.namespace.as_deref().unwrap_or_default(),
            &self.name,
            &self.reason,
        )
    }
}

/// What a pass over one rule would do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Preview {
    /// Its sources are still being listed: ask again.
    WaitingForSources,
    /// Refused, with the reason and message its status would show; it
    /// changes nothing.
    Refused { reason: String, message: String },
    Planned {
        changes: Vec<PlannedChange>,
        skipped: Vec<Skip>,
    },
}
