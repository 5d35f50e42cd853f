//! config-syncer (kubed): a source's `kubed.appscode.com/sync` (into the
//! namespaces of this cluster) and `kubed.appscode.com/sync-contexts`
//! (into other clusters). The annotations are their namespace's
//! configuration: its rule is a tenant rule there (see `shared::Owner`).

use serde_json::Value;

use super::SourceReport;
use super::patterns::Selector;
use super::shared::{
    Context, Conversion, Draft, Named, Owner, Source, Targets, annotation, spec_of, str_at,
};

pub(super) const TOOL: &str = "config-syncer";
/// What config-syncer's annotations start with.
pub(super) const PREFIX: &str = "kubed.appscode.com/";
const SYNC: &str = "kubed.appscode.com/sync";
const SYNC_CONTEXTS: &str = "kubed.appscode.com/sync-contexts";

pub(super) fn convert(object: &Value, context: &Context) -> Option<Conversion> {
    if str_at(object, &["apiVersion"]) != Some("v1")
        || !matches!(str_at(object, &["kind"]), Some("Secret" | "ConfigMap"))
    {
        return None;
    }
    let sync = annotation(object, SYNC);
    let contexts = annotation(object, SYNC_CONTEXTS);
    if sync.is_none() && contexts.is_none() {
        return None;
    }
    let named = Named::of(object)?;
    let mut report = named.report(TOOL);
    let mut drafts = Vec::new();
    if let Some(sync) = sync {
        match in_cluster(&named, sync, context, &mut report) {
            Ok(draft) => {
                untravelled_keys(object, &mut report);
                drafts.push(draft);
            }
            Err(why) => report.unmapped(why),
        }
    }
    if let Some(contexts) = contexts {
        let owner = Owner::of_namespace(&named.namespace, context.options);
        report.unmapped(into_contexts(&named, contexts, &owner));
    }
    Some(report.with(drafts))
}

/// The source's labels and annotations that config-syncer copies and
/// Copyrator never does (tools' tracking keys: a copy carrying them is
/// taken for the tool's own object), each said as a difference.
fn untravelled_keys(object: &Value, report: &mut SourceReport) {
    for (field, what) in [("labels", "label"), ("annotations", "annotation")] {
        for key in object
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys())
        {
            if crate::core::tracking::copier_mark(key).is_some() {
                continue;
            }
            if let Some(why) = crate::core::tracking::never_travels(key) {
                report.differs(format!(
                    "the source's {what} {key} goes onto config-syncer's copies, never onto Copyrator's: {why}"
                ));
            }
        }
    }
}

/// The rule that copies a source into the namespaces `sync` selects here.
fn in_cluster(
    named: &Named,
    sync: &str,
    context: &Context,
    report: &mut SourceReport,
) -> Result<Draft, String> {
    let owner = Owner::of_namespace(&named.namespace, context.options);
    let targets = if sync == "true" {
        report.exact("sync: \"true\": every namespace gets a copy");
        Targets::default()
    } else {
        match Selector::parse(sync) {
            Ok(None) => {
                report.exact(
                    "sync is empty, an empty namespace selector: every namespace gets a copy",
                );
                Targets::default()
            }
            Ok(Some(selector)) => {
                report.exact(format!(
                    "sync {sync:?} is a namespace selector: the rule's targets.namespaceSelector is {}",
                    selector.text()
                ));
                Targets {
                    selector: Some(selector),
                    ..Targets::default()
                }
            }
            Err(e) => {
                return Err(format!(
                    "sync {sync:?} is no namespace selector a rule can hold ({e}); config-syncer lists namespaces by it, and copies nowhere if the API server refuses it"
                ));
            }
        }
    };
    report.exact(format!(
        "copies go into {}: the rule copies there",
        targets.describe()
    ));
    report.exact("the source's labels and annotations are copied, except config-syncer's own keys, which Copyrator never copies either");
    report.exact("copies go when the source is deleted or the annotation removed: the rule deletes them when their source goes or the rule is deleted (deletionPolicy: Delete)");
    report.differs("config-syncer rewrites an edited copy only at its source's next sync, and keeps a copy in a namespace that stopped matching until then; the rule restores the one and deletes the other at once");
    report.differs(format!("config-syncer takes over an object of that name that it did not make; the rule adopts one holding the same content and skips one holding other content (conflictPolicy: Skip); {}", owner.overwrite_note()));
    if let Some(note) = targets.protected_note(TOOL, context.options) {
        report.differs(note);
    }
    let entries: Vec<(&str, Value)> = targets
        .to_json()
        .map(|t| ("targets", t))
        .into_iter()
        .collect();
    Ok(Draft {
        name: named.rule_name("kubed"),
        owner,
        api_version: named.api_version.clone(),
        kind: named.kind.clone(),
        source: Source::Named {
            namespace: named.namespace.clone(),
            name: named.name.clone(),
        },
        spec: spec_of(&entries),
        naming: None,
    })
}

/// Why copies into other clusters' contexts are not converted, and the
/// closest rule.
fn into_contexts(named: &Named, contexts: &str, owner: &Owner) -> String {
    let names: Vec<&str> = contexts
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let tenant = match owner {
        Owner::Admin => "",
        Owner::Tenant(_) => {
            " (a tenant rule, as this is its namespace's configuration: the operator follows one that names members only with --allow-tenant-clusters)"
        }
    };
    format!(
        "sync-contexts {}: config-syncer copies into one namespace of each context's cluster, the namespace its kubeconfig context names, or {} when it names none. Copyrator never copies into a namespace named like the source's in a member, and the contexts' namespaces are not known here. The closest is a rule{tenant} with targets.clusters.names: [{}] (as Copyrator's inventory names those members: the names must match), targets.clusters.local: false and targets.include naming each context's namespace",
        names.join(", "),
        named.namespace,
        names.join(", ")
    )
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::super::Imported;
    use super::super::kyverno::tests::yaml;
    use super::super::shared::import_label_key;
    use super::super::shared::tests::{converted, says};

    // CS docs/examples/config-syncer/demo-0.yaml
    const OMNI: &str = r"
apiVersion: v1
kind: ConfigMap
metadata:
  name: omni
  namespace: demo
data:
  you: only
  leave: once
";

    /// `omni` annotated as CS docs/guides/config-syncer/intra-cluster.md
    /// (`kubectl annotate configmap omni kubed.appscode.com/sync="" -n demo`,
    /// then `="app=kubed"`) and inter-cluster.md (`sync-contexts="context-1,context-2"`) do.
    fn omni(annotations: Value) -> Value {
        let mut object = yaml(OMNI);
        object["metadata"]["annotations"] = annotations;
        object
    }

    pub(crate) fn documented() -> Vec<Value> {
        vec![omni(json!({"kubed.appscode.com/sync": "app=kubed"}))]
    }

    /// A source Argo CD and Helm deployed: config-syncer copies their
    /// tracking keys, Copyrator never does, and the report says so.
    #[test]
    fn tracking_keys_config_syncer_copies_are_said_as_differences() {
        let mut object = omni(json!({"kubed.appscode.com/sync": "",
            "argocd.argoproj.io/tracking-id": "app:/ConfigMap:demo/omni"}));
        object["metadata"]["labels"] = json!({"app.kubernetes.io/instance": "demo", "tier": "web"});
        let imported = converted(&[object]);
        assert_eq!(imported.rules.len(), 1);
        let report = &imported.reports[0];
        for key in [
            "label app.kubernetes.io/instance",
            "annotation argocd.argoproj.io/tracking-id",
        ] {
            assert!(
                report.differs.iter().any(|l| l.contains(&format!(
                    "the source's {key} goes onto config-syncer's copies"
                ))),
                "{key}: {report:#?}"
            );
        }
        assert!(!report.differs.iter().any(|l| l.contains("tier")));
        assert!(
            !report
                .differs
                .iter()
                .any(|l| l.contains("kubed.appscode.com/sync "))
        );
    }

    #[test]
    fn an_empty_sync_copies_into_every_namespace() {
        let imported = converted(&[omni(json!({"kubed.appscode.com/sync": ""}))]);
        let name = "kubed-configmap-demo-omni";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "demo"},
                "spec": {
                    "ruleType": "configmap",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "demo",
                    "adopt": true
                }
            })]
        );
        assert_eq!(imported.source_labels[0].kind, "ConfigMap");
        assert_eq!(imported.source_labels[0].name, "omni");
        let report = &imported.reports[0];
        assert_eq!(
            (report.tool.as_str(), report.source.as_str()),
            ("config-syncer", "ConfigMap demo/omni")
        );
        assert!(
            says(&report.exact, "every namespace gets a copy"),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "the rule is demo's, a tenant rule"),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "copyrator.flant.com/accept-from lists demo: config-syncer's copies in the others are neither adopted nor touched"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "it adopts config-syncer's copies only where their marks say they came from demo"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "a tenant rule may not use conflictPolicy: Overwrite"
            ),
            "{report:#?}"
        );
        assert!(report.unmapped.is_empty());
        let all = imported_sync("true");
        assert_eq!(all.rules[0]["spec"].get("targets"), None);
    }

    fn imported_sync(sync: &str) -> Imported {
        converted(&[omni(json!({"kubed.appscode.com/sync": sync}))])
    }

    #[test]
    fn the_operators_namespace_configuration_is_an_admin_rule() {
        let mut object = omni(json!({"kubed.appscode.com/sync": ""}));
        object["metadata"]["namespace"] = json!("copyrator");
        let imported = converted(&[object]);
        assert_eq!(imported.rules[0]["metadata"]["namespace"], "copyrator");
        let report = &imported.reports[0];
        assert!(!says(&report.differs, "tenant rule"), "{report:#?}");
        assert!(
            says(&report.differs, "the closest is conflictPolicy: Overwrite"),
            "{report:#?}"
        );
    }

    #[test]
    fn any_other_sync_is_a_namespace_selector() {
        let imported = imported_sync("app=kubed");
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"namespaceSelector": {"matchLabels": {"app": "kubed"}}})
        );
        assert!(says(
            &imported.reports[0].exact,
            "targets.namespaceSelector is app=kubed"
        ));
        let bad = imported_sync("app=kubed)");
        assert!(bad.rules.is_empty());
        assert!(
            says(&bad.reports[0].unmapped, "is no namespace selector"),
            "{:#?}",
            bad.reports
        );
    }

    #[test]
    fn contexts_are_unmapped_with_the_closest_rule() {
        let imported = converted(&[omni(json!({
            "kubed.appscode.com/sync": "",
            "kubed.appscode.com/sync-contexts": "context-1,context-2"
        }))]);
        assert_eq!(imported.rules.len(), 1, "the copies in this cluster");
        let report = &imported.reports[0];
        assert!(
            says(
                &report.unmapped,
                "targets.clusters.names: [context-1, context-2]"
            ),
            "{report:#?}"
        );
        assert!(
            says(&report.unmapped, "the names must match"),
            "{report:#?}"
        );
        assert!(
            says(&report.unmapped, "only with --allow-tenant-clusters"),
            "{report:#?}"
        );
        let only = converted(&[omni(
            json!({"kubed.appscode.com/sync-contexts": "context-1"}),
        )]);
        assert!(only.rules.is_empty());
        assert_eq!(only.reports.len(), 1);
    }
}
