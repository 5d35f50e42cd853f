//! The CustomResourceDefinition of `CopyratorRule`, generated from the Rust
//! types in [`crate::api::rule`]. `copyrator crd` prints it; `crd/` holds that output.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Value, json};

use crate::api::rule::{RuleSpec, RuleStatus, RuleType, SyncPolicy};
use crate::api::schema::{SELECTOR_DESCRIPTION, namespace_schema, selector_schema};
use crate::api::{GROUP, KIND, PLURAL, VERSION};
use crate::{Error, Result};

pub(crate) const CRD_NAME: &str = "copyrators.flant.com";

fn generator() -> SchemaGenerator {
    SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .with_transform(ServedIntegerFormats)
        .into_generator()
}

/// The API server knows the integer formats `int32` and `int64` and warns
/// of any other on every apply (`unrecognized format "uint32"`): Rust's
/// unsigned and small integers are written as `int64`, their range kept
/// by `minimum` and `maximum`.
#[derive(Clone, Copy, Debug)]
struct ServedIntegerFormats;

impl schemars::transform::Transform for ServedIntegerFormats {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        if let Some(object) = schema.as_object_mut()
            && object.get("type").and_then(Value::as_str) == Some("integer")
            && object
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|format| !matches!(format, "int32" | "int64"))
        {
            object.insert("format".into(), json!("int64"));
        }
        schemars::transform::transform_subschemas(self, schema);
    }
}

fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    let mut value = generator.root_schema_for::<T>().to_value();
    if let Value::Object(map) = &mut value {
        map.remove("title");
    }
    value
}

/// The root schema: the original top-level fields beside `spec` and `status`.
fn root_schema() -> Value {
    let mut generator = generator();
    let mut rule_type = schema_of::<RuleType>(&mut generator);
    rule_type["description"] = json!(
        "Kind of the objects to copy: `configmap` or `secret` (original form; `spec.ruleType` wins)."
    );
    let sync_policy = schema_of::<SyncPolicy>(&mut generator);
    let mut spec = schema_of::<RuleSpec>(&mut generator);
    spec["description"] =
        json!("The rule. Fields set here win over the same fields at the top level.");
    let mut status = schema_of::<RuleStatus>(&mut generator);
    status["description"] = json!("What the operator last saw and did for this rule.");
    let mut selector = selector_schema(&mut generator).to_value();
    selector["description"] = json!(format!(
        "{SELECTOR_DESCRIPTION} Original form; `spec.selector` wins."
    ));
    json!({
        "description": "Copies ConfigMaps, Secrets or objects of any namespaced kind that match a selector into other namespaces and keeps the copies true.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "ruleType": rule_type,
            "selector": selector,
            "namespace": namespace_schema(&mut generator).to_value(),
            "syncPolicy": sync_policy,
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            {
                "rule": "has(self.ruleType) || (has(self.spec) && (has(self.spec.ruleType) || has(self.spec.objectType)))",
                "message": "ruleType is required: set ruleType (or spec.ruleType) to configmap or secret, or spec.objectType to any namespaced kind"
            },
            {
                "rule": "!(has(self.spec) && has(self.spec.objectType) && (has(self.ruleType) || has(self.spec.ruleType)))",
                "message": "ruleType and spec.objectType are mutually exclusive: name the kind one way"
            },
            {
                "rule": "has(self.selector) || (has(self.spec) && has(self.spec.selector))",
                "message": "selector is required: set selector (or spec.selector) to the labels a source must carry"
            },
            {
                "rule": "!(has(self.spec) && has(self.spec.prune) && !self.spec.prune && has(self.spec.deletionPolicy) && (has(self.spec.deletionPolicy.sourceGone) || has(self.spec.deletionPolicy.targetLeft)))",
                "message": "prune: false keeps copies that no longer belong, and deletionPolicy.sourceGone or targetLeft says what becomes of them: set one or the other"
            }
        ]
    })
}

fn column(
    name: &str,
    type_: &str,
    path: &str,
    description: &str,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.into(),
        type_: type_.into(),
        json_path: path.into(),
        description: Some(description.into()),
        ..Default::default()
    }
}

/// A column `kubectl get -o wide` adds.
fn wide_column(
    name: &str,
    type_: &str,
    path: &str,
    description: &str,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        priority: Some(1),
        ..column(name, type_, path, description)
    }
}

/// The CustomResourceDefinition, from the Rust types.
#[expect(
    clippy::too_many_lines,
    reason = "one literal document: the CRD as the API server reads it, field by field; split, it would no longer read as the YAML it prints"
)]
pub(crate) fn crd() -> Result<CustomResourceDefinition> {
    let schema: JSONSchemaProps =
        serde_json::from_value(root_schema()).map_err(|source| Error::Serialize {
            what: "the CRD schema",
            source,
        })?;
    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(CRD_NAME.into()),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: GROUP.into(),
            names: CustomResourceDefinitionNames {
                kind: KIND.into(),
                list_kind: Some(format!("{KIND}List")),
                plural: PLURAL.into(),
                singular: Some("copyrator".into()),
                // The kind's own name, singular and plural, besides the
                // original API's plural (`copyrators`) and singular.
                short_names: Some(vec![
                    "copyr".into(),
                    "copyratorrule".into(),
                    "copyratorrules".into(),
                ]),
                categories: None,
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: VERSION.into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                subresources: Some(CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(json!({}))),
                    scale: None,
                }),
                additional_printer_columns: Some(vec![
                    column(
                        "Type",
                        "string",
                        ".status.ruleType",
                        "Kind of the objects copied",
                    ),
                    column(
                        "Sources",
                        "integer",
                        ".status.sources",
                        "Objects that match the selector",
                    ),
                    column("Copies", "integer", ".status.copies", "Copies in place"),
                    column(
                        "Protected",
                        "integer",
                        ".status.protectedNamespaces",
                        "Namespaces left out as protected",
                    ),
                    column(
                        "Ready",
                        "string",
                        ".status.conditions[?(@.type==\"Ready\")].status",
                        "Whether every copy is in place",
                    ),
                    column(
                        "Age",
                        "date",
                        ".metadata.creationTimestamp",
                        "Age of the rule",
                    ),
                    wide_column(
                        "Targets",
                        "integer",
                        ".status.targetNamespaces",
                        "Namespaces that receive copies",
                    ),
                    wide_column(
                        "Conflicts",
                        "integer",
                        ".status.conflictCount",
                        "Copies skipped: something else holds the name, or the copy would grant what its source does not",
                    ),
                    wide_column(
                        "Contested",
                        "integer",
                        ".status.contestedCount",
                        "Copies another writer keeps changing back",
                    ),
                    wide_column(
                        "Reason",
                        "string",
                        ".status.conditions[?(@.type==\"Ready\")].reason",
                        "Why the rule is or is not ready",
                    ),
                    wide_column(
                        "Clusters",
                        "string",
                        ".status.clustersReady",
                        "Member clusters ready, of those targeted (empty for a rule of this cluster alone)",
                    ),
                ]),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    })
}

/// The CRD as YAML, exactly what `crd/` holds.
pub(crate) fn crd_yaml() -> Result<String> {
    let crd = crd()?;
    let value = serde_json::to_value(&crd).map_err(|source| Error::Serialize {
        what: "the CRD",
        source,
    })?;
    Ok(crate::yaml::to_string(&value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_types() {
        let committed = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crd/copyrator.yaml"
        ))
        .expect(
            "crd/copyrator.yaml exists; regenerate it with `cargo run -- crd > crd/copyrator.yaml`",
        );
        assert!(
            committed == crd_yaml().unwrap(),
            "crd/copyrator.yaml differs from `copyrator crd`; regenerate it with `cargo run -- crd > crd/copyrator.yaml`"
        );
    }

    #[test]
    fn chart_crd_matches_the_types() {
        let chart = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/chart/crds/copyrator.yaml"))
            .expect("chart/crds/copyrator.yaml exists; regenerate it with `cargo run -- crd > chart/crds/copyrator.yaml`");
        assert!(
            chart == crd_yaml().unwrap(),
            "chart/crds/copyrator.yaml differs from `copyrator crd`; regenerate it with `cargo run -- crd > chart/crds/copyrator.yaml`"
        );
    }

    #[test]
    fn schema_keeps_the_original_top_level_fields() {
        let schema = root_schema();
        for field in [
            "ruleType",
            "selector",
            "namespace",
            "syncPolicy",
            "spec",
            "status",
        ] {
            assert!(schema["properties"][field].is_object(), "{field} missing");
        }
        assert_eq!(
            schema["properties"]["ruleType"]["enum"],
            json!(["configmap", "secret"])
        );
        assert_eq!(
            schema["properties"]["spec"]["properties"]["conflictPolicy"]["enum"],
            json!(["Skip", "Overwrite"])
        );
        let keys = &schema["properties"]["spec"]["properties"]["transform"]["properties"]["keys"];
        for list in ["include", "exclude"] {
            assert_eq!(keys["properties"][list]["maxItems"], json!(64), "{list}");
            assert_eq!(keys["properties"][list]["items"]["maxLength"], json!(253));
        }
        let rename = &keys["properties"]["rename"];
        assert_eq!(rename["maxProperties"], json!(64));
        assert_eq!(
            rename["x-kubernetes-validations"].as_array().map(Vec::len),
            Some(2),
            "data keys, and no two keys renamed to one"
        );
        for sync_policy in [
            &schema["properties"]["syncPolicy"],
            &schema["properties"]["spec"]["properties"]["syncPolicy"],
        ] {
            assert_eq!(sync_policy["enum"], json!(["Sync", "CreateOnly"]));
            let description = sync_policy["description"].as_str().unwrap_or_default();
            assert!(
                description.contains("CreateOnly") && description.contains("Default Sync"),
                "{description}"
            );
        }
    }

    #[test]
    fn every_integer_has_a_format_the_api_server_knows() {
        let crd = serde_json::to_value(crd().expect("the CRD")).expect("JSON");
        let mut formats = Vec::new();
        collect_integer_formats(&crd, "", &mut formats);
        assert!(!formats.is_empty(), "the schema has integers");
        let unknown: Vec<&(String, String)> = formats
            .iter()
            .filter(|(_, format)| !matches!(format.as_str(), "int32" | "int64"))
            .collect();
        assert!(
            unknown.is_empty(),
            "formats the API server warns of: {unknown:?}"
        );
    }

    /// Every integer's format under `value`, with its path.
    fn collect_integer_formats(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                if map.get("type").and_then(Value::as_str) == Some("integer") {
                    let format = map.get("format").and_then(Value::as_str).unwrap_or("int64");
                    out.push((path.to_owned(), format.to_owned()));
                }
                for (key, child) in map {
                    collect_integer_formats(child, &format!("{path}/{key}"), out);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    collect_integer_formats(child, &format!("{path}/{index}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn target_clusters_are_bounded_and_shown_wide() {
        let schema = root_schema();
        let clusters =
            &schema["properties"]["spec"]["properties"]["targets"]["properties"]["clusters"];
        let names = &clusters["properties"]["names"];
        assert_eq!(names["maxItems"], json!(100));
        assert_eq!(names["items"]["maxLength"], json!(63));
        assert_eq!(
            names["items"]["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(1),
            "a DNS-1123 label"
        );
        assert_eq!(clusters["properties"]["local"]["type"], json!("boolean"));
        assert!(
            clusters["properties"]["selector"]["properties"]["matchExpressions"].is_object(),
            "a label selector"
        );
        assert_eq!(
            clusters["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(1),
            "local: false needs a member"
        );
        let status = &schema["properties"]["status"]["properties"];
        assert_eq!(status["clustersReady"]["type"], json!("string"));
        let cluster = &status["clusters"]["items"];
        assert_eq!(cluster["required"], json!(["name", "ready"]));
        for count in ["targetNamespaces", "copies", "conflicts"] {
            assert_eq!(
                cluster["properties"][count]["format"],
                json!("int64"),
                "{count}"
            );
        }
        let crd = crd().unwrap();
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let column = columns
            .iter()
            .find(|c| c.name == "Clusters")
            .expect("a Clusters column");
        assert_eq!(
            (column.json_path.as_str(), column.priority),
            (".status.clustersReady", Some(1))
        );
    }
}
