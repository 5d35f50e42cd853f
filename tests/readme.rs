//! The README's examples, applied as they are written: each example marked
//! `<!-- tests/readme.rs applies this example: NAME -->` is read from
//! README.md, its namespace names are made the test's own (nothing else
//! changes), and it is applied to a real control plane with the real
//! binary, then checked to do what the README says.

mod common;

use common::*;
use serde::Deserialize;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

/// The YAML documents of the README example `name`, with each namespace
/// name of `renames` replaced by the test's own.
fn example(name: &str, renames: &[(&str, &str)]) -> Vec<Value> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let marker = format!("<!-- tests/readme.rs applies this example: {name} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no example {name:?}"))
        .1;
    let block = after
        .trim_start()
        .strip_prefix("```yaml\n")
        .and_then(|rest| rest.split_once("\n```"))
        .unwrap_or_else(|| panic!("example {name:?} is not followed by a ```yaml block"))
        .0;
    let mut text = block.to_owned();
    for (from, to) in renames {
        text = text.replace(from, to);
    }
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("example {name:?}: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The one document of `docs` of this kind.
fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the example"))
}

/// `README: Copies made once`: the rule creates each missing copy and
/// hands it over (the `sync-policy` label).
#[tokio::test]
async fn the_create_only_example_hands_its_copies_over() {
    let t = TestNs::new("readme-once").await;
    let op = t.ns("op").await;
    let team = t.ns("team-a").await;
    let team_glob = t.glob("team-");
    let docs = example(
        "create-only",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("team-*", &team_glob),
        ],
    );
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_plain(CM, &op, "limits", &[("starter", "true")], &[("cpu", "1")])
        .await;
    let copy = t
        .wait_obj(CM, &team, &source.name, "a copy handed over", |o| {
            o.data_is(&[("cpu", "1")])?;
            match o.label("copyrator.flant.com/sync-policy") {
                Some("CreateOnly") => Ok(()),
                other => Err(format!("sync-policy label {other:?}")),
            }
        })
        .await;
    assert!(
        copy.label(LABEL_RULE_UID).is_some(),
        "the copy names its rule"
    );
    t.wait_rule(&op, name, "one copy handed over", |r| {
        match status_u64(r, "createOnlyCopies") {
            Some(1) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
}

/// `README: Choosing data keys`: the copy carries the selected keys under
/// their new names and nothing else.
#[tokio::test]
async fn the_data_keys_example_selects_and_renames() {
    let t = TestNs::new("readme-keys").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let docs = example("data-keys", &[]);
    // The example is a spec alone; its targets are narrowed to the test's
    // namespaces so that the rule does not write across the cluster.
    let body = with(
        json!({"spec": docs[0]["spec"]}),
        "/spec/targets",
        json!({"include": [t.glob("t")]}),
    );
    t.create_rule(&op, "tls", body).await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_plain(
            SECRET,
            &op,
            "site",
            &[("copyrator", "true")],
            &[
                ("tls.crt", "CERT"),
                ("tls.key", "KEY"),
                ("tls.old", "OLD"),
                ("ca.crt", "CA"),
                ("password", "P"),
            ],
        )
        .await;
    t.wait_obj(
        SECRET,
        &t1,
        &source.name,
        "the selected keys, renamed",
        |o| o.data_is(&[("cert.pem", "CERT"), ("key.pem", "KEY"), ("ca.crt", "CA")]),
    )
    .await;
}

/// `README: Trust`: a tenant pulls a CA bundle that consents to its
/// namespace, into its own namespace.
#[tokio::test]
async fn the_pull_example_brings_the_ca_bundle_home() {
    let t = TestNs::new("readme-pull").await;
    let op = t.ns("op").await;
    let platform = t.ns("platform").await;
    let team = t.ns("team-a").await;
    let team_glob = t.glob("team-");
    let docs = example(
        "pull-ca",
        &[
            ("namespace: platform", &format!("namespace: {platform}")),
            ("namespace: team-a", &format!("namespace: {team}")),
            ("team-*", &team_glob),
        ],
    );
    let bundle = of_kind(&docs, "ConfigMap");
    let bundle_name = bundle["metadata"]["name"].as_str().expect("a name");
    t.create_json(CM, &platform, bundle_name, bundle.clone())
        .await;
    let rule = of_kind(&docs, "CopyratorRule");
    let rule_name = rule["metadata"]["name"].as_str().expect("a name");
    assert_eq!(rule["metadata"]["namespace"], json!(team));
    t.create_rule(&team, rule_name, json!({"spec": rule["spec"]}))
        .await;
    // The rule is a tenant's: the operator lives elsewhere and honours it
    // only with --all-namespaces (and, in a shared test cluster, by name).
    let _operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", rule_name]);
    let want: Vec<(String, String)> = bundle["data"]
        .as_object()
        .expect("the bundle's data")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    let want: Vec<(&str, &str)> = want.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    t.wait_obj(CM, &team, bundle_name, "the pulled CA bundle", |o| {
        o.data_is(&want)
    })
    .await;
    t.wait_rule(&team, rule_name, "one source, one copy", |r| {
        match (status_u64(r, "sources"), status_u64(r, "copies")) {
            (Some(1), Some(1)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
}
