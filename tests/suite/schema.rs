//! Invalid rules are refused at admission by the CRD schema, with a message
//! that names the field. No operator runs here: the API server alone decides.

use crate::common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn schema_refuses_an_unknown_rule_type() {
    let t = TestNs::new("schema-ruletype").await;
    let ns = t.ns("op").await;
    let sel = json!({"copyrator": "true"});
    refused(
        &t,
        &ns,
        "top",
        json!({"ruleType": "deployment", "selector": sel}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "spec",
        json!({"spec": {"ruleType": "Deployment", "selector": sel}}),
        &["spec.ruleType"],
    )
    .await;
    // The kinds are lower case, as in the original.
    refused(
        &t,
        &ns,
        "case",
        json!({"spec": {"ruleType": "ConfigMap", "selector": sel}}),
        &["ruleType"],
    )
    .await;
}

#[tokio::test]
async fn schema_refuses_a_missing_rule_type_or_selector() {
    let t = TestNs::new("schema-required").await;
    let ns = t.ns("op").await;
    refused(
        &t,
        &ns,
        "no-type",
        json!({"selector": {"copyrator": "true"}}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-type-spec",
        json!({"spec": {"selector": {"copyrator": "true"}}}),
        &["ruleType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-selector",
        json!({"ruleType": "configmap"}),
        &["selector"],
    )
    .await;
    refused(
        &t,
        &ns,
        "no-selector-spec",
        json!({"spec": {"ruleType": "secret"}}),
        &["selector"],
    )
    .await;
}

/// `{}` is refused by the schema (`minProperties`); shapes the structural
/// schema cannot express (`{matchLabels: {}}`, a non-string label value) are
/// the operator's to report: see `safety.rs`.
#[tokio::test]
async fn schema_refuses_an_empty_selector() {
    let t = TestNs::new("schema-selector").await;
    let ns = t.ns("op").await;
    refused(
        &t,
        &ns,
        "top",
        json!({"ruleType": "configmap", "selector": {}}),
        &["selector"],
    )
    .await;
    refused(
        &t,
        &ns,
        "spec",
        json!({"spec": {"ruleType": "configmap", "selector": {}}}),
        &["spec.selector"],
    )
    .await;
}

#[tokio::test]
async fn schema_refuses_a_bad_conflict_policy() {
    let t = TestNs::new("schema-conflict").await;
    let ns = t.ns("op").await;
    let body = json!({"spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}, "conflictPolicy": "Maybe"}});
    refused(&t, &ns, "policy", body, &["conflictPolicy"]).await;
}

#[tokio::test]
async fn schema_refuses_mistyped_fields() {
    let t = TestNs::new("schema-types").await;
    let ns = t.ns("op").await;
    let sel = json!({"copyrator": "true"});
    let base = |extra: serde_json::Value| {
        let mut spec = json!({"ruleType": "configmap", "selector": sel});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({ "spec": spec })
    };
    refused(
        &t,
        &ns,
        "prune",
        base(json!({"prune": "yes"})),
        &["spec.prune"],
    )
    .await;
    refused(
        &t,
        &ns,
        "include",
        base(json!({"targets": {"include": "team-*"}})),
        &["spec.targets.include"],
    )
    .await;
    refused(
        &t,
        &ns,
        "add-labels",
        base(json!({"transform": {"addLabels": {"a": 1}}})),
        &["spec.transform.addLabels"],
    )
    .await;
}

#[tokio::test]
async fn schema_accepts_both_published_forms() {
    let t = TestNs::new("schema-accepts").await;
    let ns = t.ns("op").await;
    let original = json!({
        "metadata": {"labels": {"module": "copyrator"}},
        "ruleType": "configmap",
        "selector": {"copyrator": "true"},
        "namespace": "default",
    });
    let full = json!({"spec": {
        "ruleType": "secret",
        "selector": {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "Exists"}]},
        "namespace": ["x", "y"],
        "targets": {"namespaceSelector": {"matchLabels": {"env": "prod"}}, "include": ["team-*"], "exclude": ["team-?x"]},
        "prune": false,
        "conflictPolicy": "Overwrite",
        "transform": {"addLabels": {"a": "b"}, "addAnnotations": {"c": "d"}, "stripLabels": ["e/*"], "stripAnnotations": ["f"]},
    }});
    for (name, body) in [("original", original), ("full", full)] {
        t.try_create_rule(&ns, name, body.clone())
            .await
            .unwrap_or_else(|e| panic!("the valid rule {body} was refused: {}", err_msg(&e)));
    }
}

/// A rule whose spec is `ruleType`, `selector` and this `transform`.
fn with_transform(transform: Value) -> Value {
    json!({"spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}, "transform": transform}})
}

/// `n` labels or annotations `k0`, `k1`, ... with empty values.
fn entries(n: usize) -> serde_json::Map<String, Value> {
    (0..n).map(|i| (format!("k{i}"), json!(""))).collect()
}

/// Every copy carries the rule's `addAnnotations`, and the API server refuses
/// an object whose annotations total more than 256 KiB: such a rule could
/// never write a copy, so it is refused itself.
#[tokio::test]
async fn schema_refuses_annotations_the_api_server_would_refuse() {
    let t = TestNs::new("schema-annotations").await;
    let ns = t.ns("op").await;
    let kib = |n: usize| "x".repeat(n * 1024);
    refused(
        &t,
        &ns,
        "one-value",
        with_transform(json!({"addAnnotations": {"note": kib(300)}})),
        &["spec.transform.addAnnotations", "262144"],
    )
    .await;
    // Each value alone fits; together they do not.
    refused(
        &t,
        &ns,
        "total",
        with_transform(json!({"addAnnotations": {"a": kib(150), "b": kib(150)}})),
        &["spec.transform.addAnnotations", "262144 bytes"],
    )
    .await;
    // Bytes count, as the API server counts them, not characters: here 262145
    // bytes in 131073 characters.
    refused(
        &t,
        &ns,
        "bytes",
        with_transform(json!({"addAnnotations": {"a": "é".repeat(128 * 1024)}})),
        &["spec.transform.addAnnotations", "262144 bytes"],
    )
    .await;
    refused(
        &t,
        &ns,
        "key",
        with_transform(json!({"addAnnotations": {"bad key": "x"}})),
        &["spec.transform.addAnnotations", "annotation key"],
    )
    .await;
    refused(
        &t,
        &ns,
        "count",
        with_transform(json!({"addAnnotations": entries(65)})),
        &["spec.transform.addAnnotations", "64"],
    )
    .await;
}

#[tokio::test]
async fn schema_refuses_labels_the_api_server_would_refuse() {
    let t = TestNs::new("schema-labels").await;
    let ns = t.ns("op").await;
    let prefix_254 = format!("{}.example.com", "a".repeat(254 - ".example.com".len()));
    let bad_keys = [
        ("space", "bad key".to_owned()),
        ("slashes", "a/b/c".to_owned()),
        ("dash-end", "name-".to_owned()),
        ("name-64", "n".repeat(64)),
        ("prefix-254", format!("{prefix_254}/name")),
        ("prefix-upper", "Example.com/name".to_owned()),
    ];
    for (name, key) in bad_keys {
        refused(
            &t,
            &ns,
            &format!("key-{name}"),
            with_transform(json!({"addLabels": {key: "x"}})),
            &["spec.transform.addLabels", "label key", "253", "1-63"],
        )
        .await;
    }
    for (name, value) in [("dash", "-bad-"), ("space", "a b"), ("slash", "a/b")] {
        refused(
            &t,
            &ns,
            &format!("value-{name}"),
            with_transform(json!({"addLabels": {"a": value}})),
            &["spec.transform.addLabels", "label value", "63"],
        )
        .await;
    }
    refused(
        &t,
        &ns,
        "value-64",
        with_transform(json!({"addLabels": {"a": "v".repeat(64)}})),
        &["spec.transform.addLabels", "63"],
    )
    .await;
    refused(
        &t,
        &ns,
        "count",
        with_transform(json!({"addLabels": entries(65)})),
        &["spec.transform.addLabels", "64"],
    )
    .await;
}

/// Right at every limit, a rule is taken: the checks are not stricter than
/// the API server's own.
#[tokio::test]
async fn schema_accepts_a_rule_at_the_limits() {
    let t = TestNs::new("schema-limits").await;
    let ns = t.ns("op").await;
    let prefix_253 = format!("{}.example.com", "a".repeat(253 - ".example.com".len()));
    let longest_key = format!("{prefix_253}/{}", "n".repeat(63));

    let mut labels = entries(62);
    labels.insert(longest_key.clone(), json!("v".repeat(63)));
    labels.insert("x_y.z-1".into(), json!("A.b_c-9"));

    // 64 annotations of exactly 262144 bytes in all, one with an upper-case
    // prefix (the API server lowercases annotation keys to check them) and
    // one with two-byte characters.
    let mut annotations = entries(61);
    annotations.insert("Example.COM/Note".into(), json!("é".repeat(1000)));
    annotations.insert(longest_key.clone(), json!(""));
    let used: usize = annotations
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum::<usize>()
        + "fill".len();
    annotations.insert("fill".into(), json!("x".repeat(262_144 - used)));
    let total: usize = annotations
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    assert_eq!((annotations.len(), labels.len(), total), (64, 64, 262_144));

    let body = with_transform(json!({"addLabels": labels, "addAnnotations": annotations}));
    t.try_create_rule(&ns, "limits", body)
        .await
        .unwrap_or_else(|e| panic!("the rule at the limits was refused: {}", err_msg(&e)));
}

/// `n` items made by `item`, as a JSON list.
fn list_of(n: usize, item: impl Fn(usize) -> String) -> Value {
    (0..n).map(|i| json!(item(i))).collect()
}

/// `n` entries made by `entry`, as a JSON object.
fn map_of(n: usize, entry: impl Fn(usize) -> (String, String)) -> Value {
    Value::Object((0..n).map(entry).map(|(k, v)| (k, json!(v))).collect())
}

/// A bounded field of a rule: where it is, how a refusal names it, and `n`
/// entries of it.
struct Bounded {
    /// The name of the rules that try it.
    name: &'static str,
    path: &'static str,
    field: &'static str,
    entries: fn(usize) -> Value,
}

/// Every list and map of a rule that the operator matches against every
/// namespace, key or source is bounded by the schema: 64 entries are
/// taken, 65 are refused at admission with a message that names the field
/// and the limit.
#[tokio::test]
async fn schema_refuses_65_entries_where_64_is_the_limit() {
    let t = TestNs::new("schema-64").await;
    let ns = t.ns("op").await;
    let cases = [
        Bounded {
            name: "include",
            path: "/spec/targets/include",
            field: "spec.targets.include",
            entries: |n| list_of(n, |i| format!("team-{i}-*")),
        },
        Bounded {
            name: "exclude",
            path: "/spec/targets/exclude",
            field: "spec.targets.exclude",
            entries: |n| list_of(n, |i| format!("team-{i}-?")),
        },
        Bounded {
            name: "strip-labels",
            path: "/spec/transform/stripLabels",
            field: "spec.transform.stripLabels",
            entries: |n| list_of(n, |i| format!("l{i}.example.com/*")),
        },
        Bounded {
            name: "strip-annotations",
            path: "/spec/transform/stripAnnotations",
            field: "spec.transform.stripAnnotations",
            entries: |n| list_of(n, |i| format!("a{i}.example.com/*")),
        },
        Bounded {
            name: "keys-include",
            path: "/spec/transform/keys/include",
            field: "spec.transform.keys.include",
            entries: |n| list_of(n, |i| format!("k{i}.*")),
        },
        Bounded {
            name: "keys-exclude",
            path: "/spec/transform/keys/exclude",
            field: "spec.transform.keys.exclude",
            entries: |n| list_of(n, |i| format!("x{i}.*")),
        },
        Bounded {
            name: "keys-rename",
            path: "/spec/transform/keys/rename",
            field: "spec.transform.keys.rename",
            entries: |n| map_of(n, |i| (format!("k{i}"), format!("renamed-{i}"))),
        },
        Bounded {
            name: "spec-selector",
            path: "/spec/selector",
            field: "spec.selector",
            entries: |n| map_of(n, |i| (format!("l{i}"), "v".into())),
        },
        // The original form, at the top level.
        Bounded {
            name: "top-selector",
            path: "/selector",
            field: "selector",
            entries: |n| map_of(n, |i| (format!("l{i}"), "v".into())),
        },
    ];
    for Bounded {
        name,
        path,
        field,
        entries,
    } in cases
    {
        let rule = |n: usize| {
            let base = json!({"ruleType": "configmap", "selector": {"copyrator": "true"}});
            let base = if path.starts_with("/spec/") {
                json!({ "spec": base })
            } else {
                base
            };
            with(base, path, entries(n))
        };
        t.try_create_rule(&ns, &format!("{name}-64"), rule(64))
            .await
            .unwrap_or_else(|e| panic!("{field} with 64 entries was refused: {}", err_msg(&e)));
        refused(&t, &ns, &format!("{name}-65"), rule(65), &[field, "64"]).await;
    }
}

/// Every glob of a rule is bounded by the schema: at most 8 `*`, and no
/// longer than what it is matched against (63 characters for namespace
/// names, 253 for data keys, 317 for label and annotation keys). A glob at
/// the limits is taken; one past a limit is refused at admission, the
/// message naming the field and the limit.
#[tokio::test]
async fn schema_refuses_globs_too_long_or_too_wild() {
    let t = TestNs::new("schema-globs").await;
    let ns = t.ns("op").await;
    // `n` characters, `stars` of them `*`.
    let glob = |n: usize, stars: usize| {
        let mut glob = "a*".repeat(stars);
        glob.push_str(&"a".repeat(n - 2 * stars));
        glob
    };
    let cases = [
        (
            "include",
            "/spec/targets/include",
            "spec.targets.include[0]",
            63,
        ),
        (
            "exclude",
            "/spec/targets/exclude",
            "spec.targets.exclude[0]",
            63,
        ),
        (
            "stage",
            "/spec/rollout/stages",
            "spec.rollout.stages[0].include[0]",
            63,
        ),
        (
            "strip-labels",
            "/spec/transform/stripLabels",
            "spec.transform.stripLabels[0]",
            317,
        ),
        (
            "strip-annotations",
            "/spec/transform/stripAnnotations",
            "spec.transform.stripAnnotations[0]",
            317,
        ),
        (
            "keys-include",
            "/spec/transform/keys/include",
            "spec.transform.keys.include[0]",
            253,
        ),
        (
            "keys-exclude",
            "/spec/transform/keys/exclude",
            "spec.transform.keys.exclude[0]",
            253,
        ),
    ];
    for (name, path, field, longest) in cases {
        let rule = |pattern: String| {
            let value = if path == "/spec/rollout/stages" {
                json!([{"name": "canary", "include": [pattern]}])
            } else {
                json!([pattern])
            };
            with(
                json!({"spec": {"ruleType": "configmap", "selector": {"copyrator": "true"}}}),
                path,
                value,
            )
        };
        t.try_create_rule(&ns, &format!("{name}-limits"), rule(glob(longest, 8)))
            .await
            .unwrap_or_else(|e| {
                panic!("{field}: a glob at the limits was refused: {}", err_msg(&e))
            });
        refused(
            &t,
            &ns,
            &format!("{name}-stars"),
            rule(glob(longest, 9)),
            &[field, "a glob holds at most 8 '*'"],
        )
        .await;
        refused(
            &t,
            &ns,
            &format!("{name}-long"),
            rule(glob(longest + 1, 1)),
            &[field, &longest.to_string()],
        )
        .await;
    }
}

/// A rule whose spec holds `targets.clusters: clusters`.
fn with_clusters(clusters: Value) -> Value {
    json!({"spec": {
        "ruleType": "secret",
        "selector": {"copyrator": "true"},
        "targets": {"include": ["team-*"], "clusters": clusters},
    }})
}

/// `targets.clusters.names` are member names, DNS-1123 labels as the API
/// server takes for names, at most 100 of them; `local: false` needs a
/// member named or selected, or the rule would keep its copies nowhere
/// (and prune every copy it has: refused before it can).
#[tokio::test]
async fn schema_refuses_target_clusters_that_name_nothing_valid() {
    let t = TestNs::new("schema-clusters").await;
    let ns = t.ns("op").await;
    let bad_names = [
        ("upper", "East".to_owned()),
        ("underscore", "eu_west".to_owned()),
        ("dot", "eu.west".to_owned()),
        ("dash-start", "-east".to_owned()),
        ("dash-end", "east-".to_owned()),
        ("space", "east 1".to_owned()),
        ("empty", String::new()),
    ];
    for (name, bad) in bad_names {
        refused(
            &t,
            &ns,
            &format!("name-{name}"),
            with_clusters(json!({"names": ["ok", bad]})),
            &["spec.targets.clusters.names[1]", "DNS-1123 label"],
        )
        .await;
    }
    refused(
        &t,
        &ns,
        "name-64",
        with_clusters(json!({"names": ["x".repeat(64)]})),
        &["spec.targets.clusters.names[0]", "63"],
    )
    .await;
    refused(
        &t,
        &ns,
        "names-101",
        with_clusters(json!({ "names": list_of(101, |i| format!("member-{i}")) })),
        &["spec.targets.clusters.names", "100"],
    )
    .await;
    for (name, clusters) in [
        ("nowhere", json!({"local": false})),
        ("nowhere-empty", json!({"local": false, "names": []})),
    ] {
        refused(
            &t,
            &ns,
            name,
            with_clusters(clusters),
            &[
                "spec.targets.clusters",
                "local: false needs names or a selector",
            ],
        )
        .await;
    }
    for (name, clusters, field) in [
        (
            "names-string",
            json!({"names": "east"}),
            "spec.targets.clusters.names",
        ),
        (
            "local-string",
            json!({"local": "no"}),
            "spec.targets.clusters.local",
        ),
        (
            "selector-value",
            json!({"selector": {"matchLabels": {"region": 1}}}),
            "spec.targets.clusters.selector.matchLabels",
        ),
        (
            "selector-expressions",
            json!({"selector": {"matchExpressions": {"key": "region"}}}),
            "spec.targets.clusters.selector.matchExpressions",
        ),
    ] {
        refused(&t, &ns, name, with_clusters(clusters), &[field]).await;
    }
}

/// What `targets.clusters` takes: names at their limits, a label selector,
/// both together, `local: false` beside a member, and an empty object.
#[tokio::test]
async fn schema_accepts_target_clusters_at_the_limits() {
    let t = TestNs::new("schema-clusters-ok").await;
    let ns = t.ns("op").await;
    let mut names = list_of(99, |i| format!("member-{i}"));
    if let Value::Array(names) = &mut names {
        names.push(json!(format!("a{}9", "-".repeat(61))));
    }
    let selector = json!({
        "matchLabels": {"region": "eu"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}],
    });
    for (name, clusters) in [
        ("names-100", json!({ "names": names })),
        ("single-letter", json!({"names": ["a", "0"]})),
        ("selector", json!({ "selector": selector })),
        (
            "union",
            json!({"names": ["east"], "selector": selector, "local": true}),
        ),
        ("away-by-name", json!({"names": ["east"], "local": false})),
        ("away-every-member", json!({"selector": {}, "local": false})),
        ("home", json!({"local": true})),
        ("empty", json!({})),
    ] {
        t.try_create_rule(&ns, name, with_clusters(clusters.clone()))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the valid clusters {clusters} were refused: {}",
                    err_msg(&e)
                )
            });
    }
}

/// `transform.name` that could name no copy validly is refused at
/// admission; what can is taken, up to the limits.
#[tokio::test]
async fn schema_refuses_copy_names_that_could_not_be_names() {
    let t = TestNs::new("schema-names").await;
    let ns = t.ns("op").await;
    let name = |n: Value| with_transform(json!({"name": n}));
    let cases = [
        (
            "empty",
            json!({}),
            "a prefix and/or a suffix, or a template",
        ),
        (
            "both",
            json!({"prefix": "p-", "template": "{name}"}),
            "not both",
        ),
        ("upper", json!({"prefix": "Platform-"}), "a prefix holds"),
        ("dash-start", json!({"prefix": "-p"}), "a prefix holds"),
        ("dot-dash", json!({"prefix": "p.-"}), "a prefix holds"),
        ("dash-end", json!({"suffix": "-"}), "a suffix holds"),
        ("dot-end", json!({"suffix": ".x."}), "a suffix holds"),
        (
            "twice",
            json!({"template": "{name}-{name}"}),
            "at most once",
        ),
        ("fixed-dash", json!({"template": "copy-"}), "at most once"),
        (
            "fixed-254",
            json!({"template": "x".repeat(254)}),
            "at most once",
        ),
        (
            "affixes-253",
            json!({"prefix": "p".repeat(200), "suffix": "s".repeat(53)}),
            "at most 252",
        ),
    ];
    for (case, value, mention) in cases {
        refused(
            &t,
            &ns,
            &format!("name-{case}"),
            name(value),
            &["spec.transform.name", mention],
        )
        .await;
    }
    for (case, value) in [
        ("prefix", json!({"prefix": "platform-"})),
        ("dotted", json!({"prefix": "a.b.", "suffix": "-x.v1"})),
        ("template", json!({"template": "team.{name}.v1"})),
        ("fixed", json!({"template": "x".repeat(253)})),
        (
            "affixes-252",
            json!({"prefix": "p".repeat(200), "suffix": "s".repeat(52)}),
        ),
    ] {
        t.try_create_rule(&ns, &format!("ok-{case}"), name(value.clone()))
            .await
            .unwrap_or_else(|e| panic!("{value} refused: {}", err_msg(&e)));
    }
}

/// `transform.toKind: ConfigMap` names the keys a ConfigMap may hold, or
/// the API server refuses the rule; a rule of ConfigMaps, which cannot be
/// made ConfigMaps of, is reported invalid.
#[tokio::test]
async fn schema_refuses_a_config_map_copy_that_names_no_keys() {
    let t = TestNs::new("schema-tokind").await;
    let ns = t.ns("op").await;
    let secret_rule = |transform: Value| json!({"spec": {"ruleType": "secret", "selector": {"copyrator": "true"}, "transform": transform}});
    for (case, transform) in [
        ("no-keys", json!({"toKind": "ConfigMap"})),
        (
            "no-include",
            json!({"toKind": "ConfigMap", "keys": {"exclude": ["tls.key"]}}),
        ),
        (
            "empty-include",
            json!({"toKind": "ConfigMap", "keys": {"include": []}}),
        ),
    ] {
        refused(
            &t,
            &ns,
            &format!("tokind-{case}"),
            secret_rule(transform),
            &["spec.transform", "toKind: ConfigMap needs keys.include"],
        )
        .await;
    }
    refused(
        &t,
        &ns,
        "tokind-secret",
        secret_rule(json!({"toKind": "Secret", "keys": {"include": ["ca.crt"]}})),
        &["spec.transform.toKind", "ConfigMap"],
    )
    .await;
    t.try_create_rule(
        &ns,
        "tokind-ok",
        secret_rule(json!({"toKind": "ConfigMap", "keys": {"include": ["ca.crt"]}})),
    )
    .await
    .unwrap_or_else(|e| panic!("refused: {}", err_msg(&e)));
}
