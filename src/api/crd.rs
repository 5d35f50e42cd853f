//! The CustomResourceDefinition of `CopyratorRule`, generated from the Rust
//! types in [`crate::api::rule`]. `copyrator crd` prints it; `crd/` holds that output.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema, json_schema};
use serde_json::{Value, json};

use crate::api::rule::{
    GROUP, KIND, MAX_ANNOTATION_BYTES, MAX_TRANSFORM_ENTRIES, PLURAL, RuleSpec, RuleStatus,
    RuleType, SyncPolicy, VERSION,
};
use crate::api::selector::MAX_DATA_KEY;
use crate::{Error, Result};

pub const CRD_NAME: &str = "copyrators.flant.com";

const SELECTOR_DESCRIPTION: &str = "Labels a source must carry, all of them (`{copyrator: \"true\"}`), or a label selector with `matchLabels` and `matchExpressions`.";

/// Schema of `selector`: a plain map of labels or a full label selector.
/// Structural schemas cannot say "map of strings, or these two properties",
/// and CEL cannot look into an open object, so the schema refuses an empty
/// selector and the operator checks the rest (reported in the rule's status).
pub fn selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": SELECTOR_DESCRIPTION,
        "type": "object",
        "minProperties": 1,
        "maxProperties": 64,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of `namespace`: a namespace name or a list of them. A structural
/// schema cannot say "string or list"; the operator checks it.
pub fn namespace_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Source namespace: one name or a list of names. Default: the rule's own namespace.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of `spec.objectType`: both parts required, each in the form the
/// API server gives them, so that a typo is refused at once.
pub fn object_type_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Any namespaced kind to copy, instead of ruleType: its apiVersion (group/version, or v1 for the core group) and kind, as in an object's own header, such as rbac.authorization.k8s.io/v1 and RoleBinding. The kind is resolved by API discovery; an unknown, cluster-scoped or denied kind, or one --kinds leaves out, is reported in the status.",
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {
            "apiVersion": {
                "description": "group/version, or v1 for the core group.",
                "type": "string",
                "maxLength": 317,
                "x-kubernetes-validations": [{
                    "rule": "self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]+$')",
                    "message": "apiVersion must be group/version (such as rbac.authorization.k8s.io/v1), or v1 for the core group"
                }]
            },
            "kind": {
                "description": "The kind, such as RoleBinding or NetworkPolicy.",
                "type": "string",
                "maxLength": 63,
                "x-kubernetes-validations": [{
                    "rule": "self.matches('^[A-Za-z][A-Za-z0-9]*$')",
                    "message": "kind must be a kind name such as RoleBinding: letters and digits, starting with a letter"
                }]
            }
        }
    })
}

/// A qualified name (label and annotation keys), as the API server checks
/// it: an optional DNS-subdomain prefix and `/`, then a name of 1-63
/// characters. The prefix's length is checked apart (`indexOf`).
const QUALIFIED_NAME_RE: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
const KEY_RULE: &str = "an optional prefix (a DNS subdomain of at most 253 characters: lowercase letters, digits, '-' and '.') and '/', then a name of 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit";
/// A label value; its length (at most 63) is the schema's `maxLength`.
const LABEL_VALUE_RE: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// Schema of `transform.addLabels`: what the API server would refuse on
/// every copy is refused on the rule. Keys are a map's, which only CEL on
/// the map itself can check.
pub fn add_labels_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Labels set on every copy.",
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_TRANSFORM_ENTRIES,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "x-kubernetes-validations": [{
                "rule": format!("self.matches('{LABEL_VALUE_RE}')"),
                "message": "a label value must be empty or at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            }]
        },
        "x-kubernetes-validations": [{
            "rule": format!("self.all(k, k.indexOf('/') <= 253 && k.matches('{QUALIFIED_NAME_RE}'))"),
            "message": format!("every key must be a label key: {KEY_RULE}")
        }]
    })
}

/// Schema of `transform.addAnnotations`. The total is the API server's own
/// limit for all annotations of an object, counted in bytes as it counts
/// them. The `maxLength` of a value (no value can exceed the total alone)
/// bounds the CEL cost estimate, which the API server checks against its
/// budget when the CRD is applied.
pub fn add_annotations_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Annotations set on every copy.",
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_TRANSFORM_ENTRIES,
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_ANNOTATION_BYTES
        },
        "x-kubernetes-validations": [
            {
                // The API server lowercases annotation keys before it checks them.
                "rule": format!("self.all(k, k.indexOf('/') <= 253 && k.lowerAscii().matches('{QUALIFIED_NAME_RE}'))"),
                "message": format!("every key must be an annotation key: {KEY_RULE}")
            },
            {
                "rule": format!("self.map(k, size(bytes(k)) + size(bytes(self[k]))).sum() <= {MAX_ANNOTATION_BYTES}"),
                "message": format!("keys and values together must not exceed {MAX_ANNOTATION_BYTES} bytes (256 KiB), the API server's limit for all annotations of an object")
            }
        ]
    })
}

/// A data key of a ConfigMap or Secret; the API server's other rules
/// (not `.` or `..`) are the operator's to check.
const DATA_KEY_RE: &str = "^[-._a-zA-Z0-9]+$";
/// A glob on data keys.
const DATA_KEY_GLOB_RE: &str = "^[-._a-zA-Z0-9*?]+$";

/// Schema of `transform.keys.include` and `.exclude`.
pub fn data_key_globs_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "nullable": true,
        "maxItems": MAX_TRANSFORM_ENTRIES,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_DATA_KEY,
            "pattern": DATA_KEY_GLOB_RE
        }
    })
}

/// Schema of `transform.keys.rename`: keys and values are data keys, and no
/// two keys are renamed to one. Whether a key is renamed onto one that
/// copies keep needs the globs of include and exclude: the operator checks it.
pub fn rename_keys_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_TRANSFORM_ENTRIES,
        "additionalProperties": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_DATA_KEY,
            "pattern": DATA_KEY_RE
        },
        "x-kubernetes-validations": [
            {
                "rule": format!("self.all(k, size(k) <= {MAX_DATA_KEY} && k.matches('{DATA_KEY_RE}'))"),
                "message": format!("every key must be a data key: 1-{MAX_DATA_KEY} letters, digits, '-', '_' or '.'")
            },
            {
                // Values alone are compared: their maxLength bounds the
                // cost estimate, where keys of a map have no bound.
                "rule": "self.all(k, self.exists_one(j, self[j] == self[k]))",
                "message": "two keys may not be renamed to the same key: a copy holds each key once"
            }
        ]
    })
}

fn generator() -> SchemaGenerator {
    SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .into_generator()
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

pub fn crd() -> Result<CustomResourceDefinition> {
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
                        "Copies skipped because something else holds the name",
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
                ]),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    })
}

/// The CRD as YAML, exactly what `crd/` holds.
pub fn crd_yaml() -> Result<String> {
    let crd = crd()?;
    let value = serde_json::to_value(&crd).map_err(|source| Error::Serialize {
        what: "the CRD",
        source,
    })?;
    serde_yaml::to_string(&value)
        .map_err(|e| Error::Config(format!("rendering the CRD as YAML: {e}")))
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
}
