//! Copying annotations that cert-manager puts on the Secrets it writes: a
//! Certificate's `spec.secretTemplate.annotations`, or an Ingress's
//! `cert-manager.io/secret-template` annotation (JSON with `annotations`)
//! for the Secret of each `spec.tls[].secretName`. reflector's README
//! documents this, and teams do the same with replicator's and
//! config-syncer's annotations. Each is converted as that Secret would be,
//! unless the Secret itself was read (its own annotations are converted
//! then). The same annotations on a Certificate's own metadata do nothing:
//! cert-manager puts only its template on the Secret, and it is said.

use serde_json::Value;

use super::shared::{Context, Conversion, Named, annotation, str_at};
use super::{kubed, reflector, replicator};

/// The tools whose annotations on a Secret copy it, by what their keys
/// start with.
const TOOLS: [(&str, &str); 3] = [
    (reflector::PREFIX, reflector::TOOL),
    (replicator::PREFIX, replicator::TOOL),
    (kubed::PREFIX, kubed::TOOL),
];

/// The copying tool whose annotations `annotations` (an object) holds.
fn copying_tool(annotations: &Value) -> Option<&'static str> {
    let keys = annotations.as_object()?;
    TOOLS
        .iter()
        .find(|(prefix, _)| keys.keys().any(|k| k.starts_with(prefix)))
        .map(|(_, tool)| *tool)
}

pub(super) fn convert(object: &Value, context: &Context) -> Vec<Conversion> {
    let kind = str_at(object, &["kind"]).unwrap_or_default();
    let api_version = str_at(object, &["apiVersion"]).unwrap_or_default();
    let certificate = api_version.starts_with("cert-manager.io/") && kind == "Certificate";
    let ingress = api_version.starts_with("networking.k8s.io/") && kind == "Ingress";
    let namespace = str_at(object, &["metadata", "namespace"]).unwrap_or("default");
    let name = str_at(object, &["metadata", "name"]).unwrap_or_default();
    let (template, secrets): (Option<Value>, Vec<&str>) = if certificate {
        (
            object.pointer("/spec/secretTemplate/annotations").cloned(),
            str_at(object, &["spec", "secretName"])
                .into_iter()
                .collect(),
        )
    } else if ingress {
        let template = annotation(object, "cert-manager.io/secret-template")
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .and_then(|t| t.get("annotations").cloned());
        let secrets = object
            .pointer("/spec/tls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|tls| tls.get("secretName").and_then(Value::as_str))
            .collect();
        (template, secrets)
    } else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if certificate
        && let Some(tool) = object
            .pointer("/metadata/annotations")
            .and_then(copying_tool)
        && let Some(named) = Named::of(object)
    {
        let mut report = named.report(tool);
        report.exact(format!(
            "its {tool} annotations are on the Certificate itself, where neither cert-manager nor {tool} reads them (cert-manager puts only spec.secretTemplate on its Secret): it copies nothing, and no rule is made; put them in spec.secretTemplate.annotations to copy the Secret"
        ));
        out.push(report.alone());
    }
    let Some(annotations) = template.filter(|a| copying_tool(a).is_some()) else {
        return out;
    };
    let how = if certificate {
        "spec.secretTemplate.annotations"
    } else {
        "its cert-manager.io/secret-template annotation"
    };
    for secret in secrets {
        if context.find("Secret", namespace, secret).is_some() {
            continue;
        }
        let made = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace, "annotations": annotations},
        });
        let converted = [
            reflector::convert(&made, context),
            replicator::convert(&made, context),
            kubed::convert(&made, context),
        ];
        for mut conversion in converted.into_iter().flatten() {
            let tool = conversion.report.tool.clone();
            conversion.report.source =
                format!("{kind} {namespace}/{name}: its Secret {namespace}/{secret}");
            conversion.report.exact.insert(
                0,
                format!("cert-manager puts the {kind}'s {tool} annotations ({how}) on the Secret {secret}: they are read as that Secret's"),
            );
            out.push(conversion);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::shared::tests::{converted, says};

    fn certificate(
        metadata_annotations: serde_json::Value,
        template: serde_json::Value,
    ) -> serde_json::Value {
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "wildcard", "namespace": "certs", "annotations": metadata_annotations},
            "spec": {"secretName": "wildcard-tls", "secretTemplate": {"annotations": template},
                     "issuerRef": {"name": "ca"}, "dnsNames": ["*.example.com"]}
        })
    }

    #[test]
    fn replicator_and_config_syncer_annotations_in_a_secret_template_are_read_as_their_secrets() {
        for (template, tool) in [
            (
                json!({"replicator.v1.mittwald.de/replicate-to-matching": "copy-wild-cert=main"}),
                "kubernetes-replicator",
            ),
            (
                json!({"kubed.appscode.com/sync": "cert-manager-tls=wildcard"}),
                "config-syncer",
            ),
        ] {
            let imported = converted(&[certificate(json!({}), template)]);
            assert_eq!(imported.rules.len(), 1, "{tool}: {:#?}", imported.reports);
            let report = &imported.reports[0];
            assert_eq!(report.tool, tool);
            assert_eq!(
                report.source,
                "Certificate certs/wildcard: its Secret certs/wildcard-tls"
            );
            assert!(
                report.exact[0].starts_with("cert-manager puts"),
                "{report:#?}"
            );
            assert_eq!(imported.source_labels[0].name, "wildcard-tls");
            assert!(
                imported.rules[0]["spec"]["targets"]["namespaceSelector"].is_object(),
                "{tool}: {}",
                imported.rules[0]
            );
        }
    }

    #[test]
    fn copying_annotations_on_a_certificates_own_metadata_are_said_to_copy_nothing() {
        let own = json!({"reflector.v1.k8s.emberstack.com/reflection-allowed": "true",
                         "reflector.v1.k8s.emberstack.com/reflection-auto-enabled": "true"});
        let imported = converted(&[certificate(own, json!(null))]);
        assert!(imported.rules.is_empty(), "{:#?}", imported.rules);
        assert_eq!(imported.reports.len(), 1, "{:#?}", imported.reports);
        let report = &imported.reports[0];
        assert_eq!(report.source, "Certificate certs/wildcard");
        assert!(says(&report.exact, "it copies nothing"), "{report:#?}");
        // A Certificate without such annotations is no configuration.
        assert!(
            converted(&[certificate(json!({}), json!(null))])
                .reports
                .is_empty()
        );
    }
}
