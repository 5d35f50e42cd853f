//! The schemas of the rule's fields that need more than their Rust types
//! say (`#[schemars(schema_with = ...)]` on the types in [`crate::api::rule`]),
//! and the limits they enforce: the API server refuses a rule over a limit
//! before the operator sees it.

use schemars::generate::SchemaGenerator;
use schemars::{Schema, json_schema};

use crate::api::selector::{MAX_DATA_KEY, MAX_GLOB_STARS, MAX_META_KEY_GLOB, MAX_NAMESPACE_GLOB};

/// Entries allowed in `transform.addLabels` and in `transform.addAnnotations`.
pub(crate) const MAX_TRANSFORM_ENTRIES: usize = 64;
/// The API server's own limit on all annotations of one object: keys plus
/// values, in bytes. A rule that adds more could never write a copy.
pub(crate) const MAX_ANNOTATION_BYTES: usize = 256 * 1024;
/// Source namespaces one rule may name: each is a watch of its own.
pub(crate) const MAX_SOURCE_NAMESPACES: usize = 1000;

/// Member clusters one rule may name in `targets.clusters.names`.
pub(crate) const MAX_CLUSTER_NAMES: usize = 100;

pub(crate) const SELECTOR_DESCRIPTION: &str = "Labels a source must carry, all of them (`{copyrator: \"true\"}`), or a label selector with `matchLabels` and `matchExpressions`.";

/// Schema of `selector`: a plain map of labels or a full label selector.
/// Structural schemas cannot say "map of strings, or these two properties",
/// and CEL cannot look into an open object, so the schema refuses an empty
/// selector and the operator checks the rest (reported in the rule's status).
pub(crate) fn selector_schema(_: &mut SchemaGenerator) -> Schema {
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
pub(crate) fn namespace_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Source namespace: one name or a list of names. Default: the rule's own namespace.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of `spec.objectType`: both parts required, each in the form the
/// API server gives them, so that a typo is refused at once.
pub(crate) fn object_type_schema(_: &mut SchemaGenerator) -> Schema {
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
pub(crate) fn add_labels_schema(_: &mut SchemaGenerator) -> Schema {
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

/// What may come before a source's name so that the copy's name is a DNS
/// subdomain whatever the source's (it is one itself): whole labels each
/// followed by a dot, then the start of a label.
const NAME_PREFIX_RE: &str = "([a-z0-9]([-a-z0-9]*[a-z0-9])?[.])*([a-z0-9][-a-z0-9]*)?";
/// What may come after it: the end of a label, then whole labels each
/// after a dot.
const NAME_SUFFIX_RE: &str = "([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
/// The longest name of a ConfigMap or a Secret, a DNS subdomain; the
/// source's name takes at least one character of it.
pub(crate) const MAX_OBJECT_NAME: usize = 253;
const MAX_NAME_AFFIXES: usize = MAX_OBJECT_NAME - 1;

/// Schema of `transform.name`: whatever the source's name, the copy's is
/// a DNS subdomain but for its length (a source whose copy's name would be
/// longer than 253 characters is refused in the rule's status).
pub(crate) fn copy_name_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The copies' name, from their source's: a prefix and/or a suffix, or a template in which {name} stands for the source's name (\"platform-{name}\"; without {name}, one name for every copy, for a rule of one source). Default: the source's own name. A source whose copy's name would be longer than 253 characters is not copied (the status says so); where two sources would land on one name, neither is copied there.",
        "type": "object",
        "properties": {
            "prefix": {
                "description": "Put before the source's name: lowercase letters, digits, '-' and '.', starting with a letter or digit (\"platform-\").",
                "type": "string",
                "maxLength": MAX_NAME_AFFIXES,
                "x-kubernetes-validations": [{
                    "rule": format!("self.matches('^{NAME_PREFIX_RE}$')"),
                    "message": "a prefix holds lowercase letters, digits, '-' and '.', starts with a letter or digit, and has a letter or digit on each side of a dot"
                }]
            },
            "suffix": {
                "description": "Put after the source's name: lowercase letters, digits, '-' and '.', ending with a letter or digit (\"-copy\").",
                "type": "string",
                "maxLength": MAX_NAME_AFFIXES,
                "x-kubernetes-validations": [{
                    "rule": format!("self.matches('^{NAME_SUFFIX_RE}$')"),
                    "message": "a suffix holds lowercase letters, digits, '-' and '.', ends with a letter or digit, and has a letter or digit on each side of a dot"
                }]
            },
            "template": {
                "description": "The copy's name, {name} (at most once) standing for the source's (\"team.{name}.v1\").",
                "type": "string",
                "maxLength": MAX_NAME_AFFIXES + "{name}".len(),
                "x-kubernetes-validations": [{
                    "rule": format!("self.contains('{{name}}') ? self.matches('^{NAME_PREFIX_RE}[{{]name[}}]{NAME_SUFFIX_RE}$') : (size(self) <= {MAX_OBJECT_NAME} && self.matches('^{NAME_PREFIX_RE}[a-z0-9]{NAME_SUFFIX_RE}$'))"),
                    "message": "a template holds {name} at most once, and around it what a prefix and a suffix may hold; without {name} it is a name: lowercase letters, digits, '-' and '.', a letter or digit at the start, at the end and on each side of a dot"
                }]
            }
        },
        "x-kubernetes-validations": [
            {
                "rule": "has(self.prefix) || has(self.suffix) || has(self.template)",
                "message": "give a prefix and/or a suffix, or a template"
            },
            {
                "rule": "!has(self.template) || !(has(self.prefix) || has(self.suffix))",
                "message": "give a prefix and/or a suffix, or a template, not both"
            },
            {
                "rule": format!("(has(self.prefix) ? size(self.prefix) : 0) + (has(self.suffix) ? size(self.suffix) : 0) <= {MAX_NAME_AFFIXES}"),
                "message": format!("a prefix and a suffix together hold at most {MAX_NAME_AFFIXES} characters: a name holds at most {MAX_OBJECT_NAME}")
            }
        ]
    })
}

/// Schema of `transform.addAnnotations`. The total is the API server's own
/// limit for all annotations of an object, counted in bytes as it counts
/// them. The `maxLength` of a value (no value can exceed the total alone)
/// bounds the CEL cost estimate, which the API server checks against its
/// budget when the CRD is applied.
pub(crate) fn add_annotations_schema(_: &mut SchemaGenerator) -> Schema {
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

/// A list of at most [`MAX_TRANSFORM_ENTRIES`] globs, each of 1-`max_len`
/// characters with at most [`MAX_GLOB_STARS`] `*` (and, if given, only the
/// characters `chars` allows). The operator matches each against every
/// namespace name or key it meets: the API server refuses one too long or
/// too wild before the operator sees it.
fn glob_list_schema(max_len: usize, chars: Option<&str>) -> Schema {
    let mut item = json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": max_len,
        "x-kubernetes-validations": [{
            "rule": format!("self.matches('^[^*]*([*][^*]*){{0,{MAX_GLOB_STARS}}}$')"),
            "message": format!("a glob holds at most {MAX_GLOB_STARS} '*'")
        }]
    });
    if let Some(chars) = chars {
        item.insert("pattern".into(), chars.into());
    }
    json_schema!({
        "type": "array",
        "nullable": true,
        "maxItems": MAX_TRANSFORM_ENTRIES,
        "items": item
    })
}

/// Schema of `transform.keys.include` and `.exclude`.
pub(crate) fn data_key_globs_schema(_: &mut SchemaGenerator) -> Schema {
    glob_list_schema(MAX_DATA_KEY, Some(DATA_KEY_GLOB_RE))
}

/// Schema of `transform.stripLabels` and `.stripAnnotations`.
pub(crate) fn meta_key_globs_schema(_: &mut SchemaGenerator) -> Schema {
    glob_list_schema(MAX_META_KEY_GLOB, None)
}

/// Schema of `targets.include`, `.exclude` and a stage's `include`. The
/// characters are the operator's to check (it says which one is wrong).
pub(crate) fn namespace_globs_schema(_: &mut SchemaGenerator) -> Schema {
    glob_list_schema(MAX_NAMESPACE_GLOB, None)
}

/// Schema of `transform.keys.rename`: keys and values are data keys, and no
/// two keys are renamed to one. Whether a key is renamed onto one that
/// copies keep needs the globs of include and exclude: the operator checks it.
pub(crate) fn rename_keys_schema(_: &mut SchemaGenerator) -> Schema {
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

/// A DNS-1123 label, the form of a member cluster's name (and of a
/// namespace's); its length (at most 63) is the schema's `maxLength`.
const DNS_LABEL_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Schema of `targets.clusters.names`: member names as the operator knows
/// its members, each a DNS-1123 label, so that a typo is refused at once.
pub(crate) fn cluster_names_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": format!("Member clusters by name (DNS-1123 labels). At most {MAX_CLUSTER_NAMES}."),
        "type": "array",
        "nullable": true,
        "maxItems": MAX_CLUSTER_NAMES,
        "items": {
            "type": "string",
            "maxLength": 63,
            "x-kubernetes-validations": [{
                "rule": format!("self.matches('{DNS_LABEL_RE}')"),
                "message": "a member cluster name must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"
            }]
        }
    })
}

/// A DNS-1123 subdomain, the form of a ServiceAccount's name; its length
/// (at most 253) is the schema's `maxLength`.
pub(crate) const DNS_SUBDOMAIN_RE: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Schema of `spec.serviceAccountName`: a ServiceAccount's name, so that a
/// typo is refused at once rather than found by a refused write.
pub(crate) fn service_account_name_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A ServiceAccount of the rule's own namespace that the rule's writes are sent as (impersonated), so that the API server decides what the rule may write. Default for a rule outside the operator's namespace (with --tenant-identity service-account): the operator's --default-service-account, copyrator. A rule of the operator's namespace that names none writes as the operator.",
        "type": "string",
        "minLength": 1,
        "maxLength": 253,
        "x-kubernetes-validations": [{
            "rule": format!("self.matches('{DNS_SUBDOMAIN_RE}')"),
            "message": "a ServiceAccount name must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        }]
    })
}

/// Schema of a count kept as `u32`: an `int64` that fits one, the format
/// the API server knows (it warns of `uint32`).
pub(crate) fn count_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int64",
        "minimum": 0,
        "maximum": u32::MAX
    })
}
