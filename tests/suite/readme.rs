//! The documentation's examples, applied as they are written: each example
//! marked `<!-- tests/suite/readme.rs applies this example: NAME -->` is read from
//! README.md or the page of `docs/` that holds it, its namespace names are
//! made the test's own (nothing else changes), and it is applied to a real
//! control plane with the real binary, then checked to do what the page
//! says. The `kubectl` commands the pages show that name a rule run as
//! written.

use crate::common::members::{OUTAGE, members};
use crate::common::*;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

/// `--kinds` for the examples of other kinds, as docs/kinds.md starts the
/// operator for them.
const KINDS: &str =
    "configmap,secret,RoleBinding.rbac.authorization.k8s.io,NetworkPolicy.networking.k8s.io";

fn role_bindings() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding"),
        "rolebindings",
    )
}

fn network_policies() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.k8s.io", "v1", "NetworkPolicy"),
        "networkpolicies",
    )
}

fn objects(t: &TestNs, resource: &ApiResource, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(t.client.clone(), ns, resource)
}

/// Creates the example document `doc` (an object of `resource`, in the
/// namespace its metadata names) as it is.
async fn create_object(t: &TestNs, resource: &ApiResource, doc: &Value) -> DynamicObject {
    let ns = doc["metadata"]["namespace"]
        .as_str()
        .expect("the example names its namespace");
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    objects(t, resource, ns)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {} in {ns}: {}", resource.kind, err_msg(&e)))
}

/// Waits until `ns/name` of `resource` exists and `check` accepts it.
async fn wait_object(
    t: &TestNs,
    resource: &ApiResource,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> Result<(), String>,
) -> DynamicObject {
    let api = objects(t, resource, ns);
    wait_until(
        format!("{} {ns}/{name}: {what}", resource.kind),
        TIMEOUT,
        async || match api.get_opt(name).await.map_err(|e| err_msg(&e))? {
            None => Err("it does not exist".into()),
            Some(o) => check(&o).map(|()| o),
        },
    )
    .await
}

/// JSON merge patch, as someone editing the object by hand.
async fn patch_object(
    t: &TestNs,
    resource: &ApiResource,
    ns: &str,
    name: &str,
    patch: &Value,
) -> DynamicObject {
    objects(t, resource, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("patching {} {ns}/{name}: {}", resource.kind, err_msg(&e)))
}

/// `copy` carries `fields` of `source` as they are, and names its rule
/// (`uid`) and its source.
fn copy_of(
    copy: &DynamicObject,
    source: &DynamicObject,
    fields: &[&str],
    uid: &str,
) -> Result<(), String> {
    let at = format!(
        "{}/{}",
        copy.metadata.namespace.as_deref().unwrap_or_default(),
        copy.metadata.name.as_deref().unwrap_or_default()
    );
    for field in fields {
        if copy.data[field] != source.data[field] {
            return Err(format!(
                "{at}: {field} is {}, the source's is {}",
                copy.data[field], source.data[field]
            ));
        }
    }
    let label = |k: &str| {
        copy.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .cloned()
    };
    let annotation = |k: &str| {
        copy.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
    };
    if label(LABEL_RULE_UID).as_deref() != Some(uid) {
        return Err(format!("{at}: labels {:?}", copy.metadata.labels));
    }
    let source_ref = format!(
        "{}/{}",
        source.metadata.namespace.as_deref().unwrap_or_default(),
        source.metadata.name.as_deref().unwrap_or_default()
    );
    if annotation(ANNOTATION_SOURCE).as_deref() != Some(source_ref.as_str()) {
        return Err(format!("{at}: annotations {:?}", copy.metadata.annotations));
    }
    for (k, v) in source.metadata.labels.iter().flatten() {
        if label(k).as_ref() != Some(v) {
            return Err(format!(
                "{at}: the source's label {k}={v:?} is missing: {:?}",
                copy.metadata.labels
            ));
        }
    }
    Ok(())
}

/// The marker that precedes an example this file applies.
const MARKER: &str = "<!-- tests/suite/readme.rs applies this example: ";

/// The examples this file applies, by the name their marker gives.
const APPLIED: &[&str] = &[
    "create-only",
    "deletion-policy",
    "data-keys",
    "copy-name",
    "public-half",
    "pull-ca",
    "tenant-account",
    "rolebinding-teams",
    "networkpolicy-default-deny",
    "pull-secret-to-members",
    "restart-consumers",
    "staged-rollout",
    "fleet-rollout",
];

/// The documentation: README.md and every Markdown page of `docs/`, each
/// with its path relative to the repository, in a stable order.
fn doc_pages() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec!["README.md".to_owned()];
    let mut pages: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|entry| entry.expect("an entry of docs/").file_name())
        .filter_map(|name| name.to_str().map(str::to_owned))
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    paths.extend(pages);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path))
                .unwrap_or_else(|e| panic!("reading {path}: {e}"));
            (path, text)
        })
        .collect()
}

/// Every marked example of the documentation: its name, the page that
/// holds it and the text after its marker.
fn marked_examples() -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for (path, text) in doc_pages() {
        for (at, _) in text.match_indices(MARKER) {
            let rest = &text[at + MARKER.len()..];
            let (name, after) = rest
                .split_once(" -->")
                .unwrap_or_else(|| panic!("{path}: an example marker is not closed by \" -->\""));
            found.push((name.trim().to_owned(), path.clone(), after.to_owned()));
        }
    }
    found
}

/// The YAML documents of the example `name`, wherever in the documentation
/// it is, with each namespace name of `renames` replaced by the test's own.
fn example(name: &str, renames: &[(&str, &str)]) -> Vec<Value> {
    let examples = marked_examples();
    let holding: Vec<&(String, String, String)> =
        examples.iter().filter(|(n, _, _)| n == name).collect();
    let (_, path, after) = match holding.as_slice() {
        [one] => *one,
        [] => panic!("no page of README.md and docs/*.md marks an example {name:?}"),
        many => panic!(
            "the example {name:?} is marked {} times, in {}: names must be unique",
            many.len(),
            many.iter()
                .map(|(_, path, _)| path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let block = after
        .trim_start()
        .strip_prefix("```yaml\n")
        .and_then(|rest| rest.split_once("\n```"))
        .unwrap_or_else(|| panic!("{path}: example {name:?} is not followed by a ```yaml block"))
        .0;
    let mut text = block.to_owned();
    for (from, to) in renames {
        text = text.replace(from, to);
    }
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: example {name:?}: {e}"))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Each example this file applies is marked exactly once in README.md and
/// docs/*.md, and every marked example is one this file applies: a marked
/// example that no test applies would promise what nothing checks. Needs
/// no cluster.
#[test]
fn every_marked_example_is_applied_and_marked_once() {
    let examples = marked_examples();
    let mut problems = Vec::new();
    for name in APPLIED {
        let pages: Vec<&str> = examples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, path, _)| path.as_str())
            .collect();
        match pages.len() {
            1 => {}
            0 => problems.push(format!(
                "the example {name:?} is marked in no page of README.md and docs/*.md"
            )),
            n => problems.push(format!(
                "the example {name:?} is marked {n} times, in {}: names must be unique",
                pages.join(", ")
            )),
        }
    }
    for (name, path, _) in &examples {
        if !APPLIED.contains(&name.as_str()) {
            problems.push(format!(
                "{path}: the example {name:?} is marked, but tests/suite/readme.rs applies no such \
                 example (APPLIED)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The one document of `docs` of this kind.
fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the example"))
}

/// docs/rules.md, "Copies made once": the rule creates each missing copy and
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

/// docs/rules.md, "Restarting consumers": a change of the key the
/// Deployment uses rolls it (its pod template gets the annotation); a
/// change of another key does not.
#[tokio::test]
async fn the_restart_consumers_example_rolls_the_deployment() {
    let t = TestNs::new("readme-restart").await;
    let op = t.ns("op").await;
    let shop = t.ns("shop").await;
    let docs = example(
        "restart-consumers",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("shop", &shop),
        ],
    );
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    let deployments = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    );
    let deployment = of_kind(&docs, "Deployment");
    let deployment_name = deployment["metadata"]["name"].as_str().expect("a name");
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_plain(
            CM,
            &op,
            "app-settings",
            &[("settings", "true")],
            &[("currency", "EUR"), ("motd", "hello")],
        )
        .await;
    t.wait_copy(CM, &shop, &source, &op, name).await;
    create_object(&t, &deployments, deployment).await;
    let restarts = async || -> Result<usize, String> {
        let d = objects(&t, &deployments, &shop)
            .get(deployment_name)
            .await
            .map_err(|e| err_msg(&e))?;
        Ok(d.data["spec"]["template"]["metadata"]["annotations"]
            .as_object()
            .map_or(0, |a| {
                a.keys()
                    .filter(|k| k.starts_with("copyrator.flant.com/restart-"))
                    .count()
            }))
    };
    let source = t
        .set_data(CM, &op, "app-settings", &[("motd", Some("hi"))])
        .await;
    t.wait_copy(CM, &shop, &source, &op, name).await;
    assert_for(
        "no roll for a key the Deployment does not use",
        std::time::Duration::from_secs(3),
        async || match restarts().await? {
            0 => Ok(()),
            n => Err(format!("{n} restart annotations")),
        },
    )
    .await;
    let source = t
        .set_data(CM, &op, "app-settings", &[("currency", Some("USD"))])
        .await;
    t.wait_copy(CM, &shop, &source, &op, name).await;
    wait_until("the Deployment rolled", TIMEOUT, async || {
        match restarts().await? {
            1 => Ok(()),
            n => Err(format!("{n} restart annotations")),
        }
    })
    .await;
    wait_until("an Event naming the Deployment", TIMEOUT, async || {
        let said: Vec<String> = t
            .events_regarding(&op, name)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ConsumersRestarted"))
            .filter_map(|e| e.note)
            .collect();
        match said.as_slice() {
            [one] if one.contains("restarted 1 workloads") && one.contains(deployment_name) => {
                Ok(())
            }
            _ => Err(format!("one roll, for the currency: {said:?}")),
        }
    })
    .await;
}

/// docs/rules.md, "Deletion you choose": a namespace that leaves the mesh
/// keeps its copy (handed over), a deleted source's copies go, and the
/// rule's deletion hands its copies over.
#[tokio::test]
async fn the_deletion_policy_example_orphans_and_deletes_as_it_says() {
    let t = TestNs::new("readme-deletion").await;
    let op = t.ns("op").await;
    let mesh = [("mesh", "enabled")];
    let kept = t.ns_labelled("kept", &mesh).await;
    let leaving = t.ns_labelled("leaving", &mesh).await;
    let docs = example(
        "deletion-policy",
        &[("namespace: copyrator", &format!("namespace: {op}"))],
    );
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let ca = t
        .create_plain(CM, &op, "ca", &[("trust", "ca")], &[("ca.crt", "CA1")])
        .await;
    let retired = t
        .create_plain(CM, &op, "old-ca", &[("trust", "ca")], &[("ca.crt", "CA0")])
        .await;
    let handed_over = |o: &Obj| match o.label(LABEL_SYNC_POLICY) {
        Some("CreateOnly") => o.data_is(&[("ca.crt", "CA1")]),
        other => Err(format!("{LABEL_SYNC_POLICY}={other:?}")),
    };
    for ns in [&kept, &leaving] {
        for source in [&ca, &retired] {
            t.wait_obj(CM, ns, &source.name, "a copy", |o| {
                (o.label(LABEL_RULE_UID).is_some() && o.data == source.data)
                    .then_some(())
                    .ok_or_else(|| format!("{:?} {:?}", o.labels, o.data))
            })
            .await;
        }
    }
    t.namespaces()
        .patch(
            &leaving,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"mesh": null}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("taking {leaving} out of the mesh: {}", err_msg(&e)));
    t.wait_obj(CM, &leaving, "ca", "targetLeft: Orphan", handed_over)
        .await;
    t.delete(CM, &op, "old-ca").await;
    t.wait_gone(CM, &kept, "old-ca", "sourceGone: Delete").await;
    t.delete_rule(&op, name).await;
    t.wait_rule_gone(&op, name, "its finalizer hands its copies over")
        .await;
    t.wait_obj(CM, &kept, "ca", "ruleDeleted: Orphan", handed_over)
        .await;
}

/// docs/rules.md, "Changes in stages": a change of the bundle reaches the
/// canary namespace first and the others only after its pause.
#[tokio::test]
async fn the_staged_rollout_example_reaches_the_canary_first() {
    let t = TestNs::new("readme-stages").await;
    let op = t.ns("op").await;
    let canary = t.ns_labelled("canary", &[("rollout", "canary")]).await;
    let other = t.ns("other").await;
    let docs = example(
        "staged-rollout",
        &[("namespace: copyrator", &format!("namespace: {op}"))],
    );
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    // The example targets every namespace; the test keeps to its own.
    let body = with(
        json!({"spec": rule["spec"]}),
        "/spec/targets",
        json!({"include": [t.glob("")]}),
    );
    t.create_rule(&op, name, body).await;
    let _operator = Operator::start(&t, &op, &[]);
    let v1 = t
        .create_plain(
            CM,
            &op,
            "bundle",
            &[("trust", "bundle")],
            &[("ca.crt", "CA1")],
        )
        .await;
    let has = |value: &'static str| move |o: &Obj| o.data_is(&[("ca.crt", value)]);
    t.wait_obj(CM, &canary, &v1.name, "CA1", has("CA1")).await;
    let before = t.wait_obj(CM, &other, &v1.name, "CA1", has("CA1")).await;
    t.set_data(CM, &op, "bundle", &[("ca.crt", Some("CA2"))])
        .await;
    t.wait_obj(CM, &canary, "bundle", "CA2 in the canary", has("CA2"))
        .await;
    // The canary has no consumers: it settles, and the pause (60 s) holds
    // the other namespace on CA1.
    t.wait_rule(&op, name, "the canary pausing", |r| {
        let phase = &r["status"]["rollouts"][0]["phase"];
        (phase == "Pausing")
            .then_some(())
            .ok_or_else(|| short_status(r))
    })
    .await;
    t.assert_unchanged(
        CM,
        &other,
        "bundle",
        &before.resource_version,
        "the other namespace waits for the canary's pause",
    )
    .await;
}

/// docs/rules.md, "Changes in stages", across clusters: a change reaches
/// the member named `staging` first; the members labelled `region=eu`
/// then wait for an approval of this content, unwritten, and the home
/// cluster with them.
#[tokio::test]
async fn the_fleet_rollout_example_reaches_staging_first_and_waits_for_approval() {
    use crate::common::members::Member;
    let t = TestNs::new("readme-fleet").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    let home_t1 = t.ns("t1").await;
    a.register(&t.client, &op, &[]).await;
    b.register(&t.client, &op, &[("region", "eu")]).await;
    let docs = example(
        "fleet-rollout",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("names: [staging]", &format!("names: [{}]", a.name)),
            ("pauseSeconds: 300", "pauseSeconds: 1"),
        ],
    );
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    // The example selects every member; the test keeps to its own
    // namespaces, and to its two members.
    let mut spec = rule["spec"].clone();
    spec["targets"]["include"] = json!([t.glob("t")]);
    spec["targets"]["clusters"] = json!({"names": [a.name, b.name]});
    t.create_rule(&op, name, json!({"spec": spec})).await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_plain(
        CM,
        &op,
        "flags",
        &[("app", "feature-flags")],
        &[("f", "off")],
    )
    .await;
    let at = async |client: &kube::Client, ns: &str, value: &str| {
        wait_config_map_at(client, (ns, "flags"), ("f", value), TIMEOUT).await
    };
    at(&a.client, &a_t1, "off").await;
    let b_before = at(&b.client, &b_t1, "off").await;
    let home_before = at(&t.client, &home_t1, "off").await;
    t.set_data(CM, &op, "flags", &[("f", Some("on"))]).await;
    at(&a.client, &a_t1, "on").await;
    t.wait_rule(&op, name, "eu awaits its approval", |r| {
        let first = &r["status"]["rollouts"][0];
        (first["stage"] == "eu" && first["phase"] == "AwaitingApproval")
            .then_some(())
            .ok_or_else(|| short_status(r))
    })
    .await;
    assert_for("eu and the rest keep f=off", QUIET, async || {
        let b_now = config_map_in(&b.client, &b_t1, "flags").await?;
        let home_now = config_map_in(&t.client, &home_t1, "flags").await?;
        if b_now.metadata.resource_version != b_before.metadata.resource_version
            || home_now.metadata.resource_version != home_before.metadata.resource_version
        {
            return Err("written before eu was approved".to_owned());
        }
        Ok(())
    })
    .await;
}

/// docs/rules.md, "Choosing data keys": the copy carries the selected keys under
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

/// docs/rules.md, "Copies under another name": the example, its source
/// namespace the test's, copies its Secret under the prefixed name.
#[tokio::test]
async fn the_copy_name_example_copies_under_the_new_name() {
    let t = TestNs::new("readme-name").await;
    let op = t.ns("op").await;
    let infra = t.ns("infra").await;
    let t1 = t.ns("t1").await;
    let docs = example(
        "copy-name",
        &[("namespace: infra", &format!("namespace: {infra}"))],
    );
    let body = with(
        json!({"spec": docs[0]["spec"]}),
        "/spec/targets",
        json!({"include": [t.glob("t")]}),
    );
    t.create_rule(&op, "registry-pull", body).await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_plain(
            SECRET,
            &infra,
            "registry-pull",
            &[("copyrator", "true")],
            &[("k", "v")],
        )
        .await;
    t.wait_obj(
        SECRET,
        &t1,
        &format!("platform-{}", source.name),
        "the copy under its new name",
        |o| o.data_is(&[("k", "v")]),
    )
    .await;
    t.assert_absent(SECRET, &t1, &source.name, "copies take the new name")
        .await;
}

/// docs/rules.md, "A Secret's public half as a ConfigMap": the example,
/// its source namespace the test's, copies `ca.crt` alone into a ConfigMap.
#[tokio::test]
async fn the_public_half_example_copies_the_ca_as_a_config_map() {
    let t = TestNs::new("readme-public").await;
    let op = t.ns("op").await;
    let certs = t.ns("certs").await;
    let t1 = t.ns("t1").await;
    let docs = example(
        "public-half",
        &[("namespace: certs", &format!("namespace: {certs}"))],
    );
    let body = with(
        json!({"spec": docs[0]["spec"]}),
        "/spec/targets",
        json!({"include": [t.glob("t")]}),
    );
    t.create_rule(&op, "internal-ca", body).await;
    let _operator = Operator::start(&t, &op, &[]);
    t.create_plain(
        SECRET,
        &certs,
        "internal-ca",
        &[("copyrator", "true")],
        &[("ca.crt", "CA"), ("tls.crt", "CERT")],
    )
    .await;
    t.wait_obj(
        Kind::ConfigMap,
        &t1,
        "internal-ca",
        "the CA as a ConfigMap",
        |o| o.data_is(&[("ca.crt", "CA")]),
    )
    .await;
    t.assert_absent(SECRET, &t1, "internal-ca", "no Secret travels")
        .await;
}

/// docs/trust.md, "Trust": a tenant sets up its ServiceAccount as "Whom a
/// rule acts as" shows, and pulls a CA bundle that consents to its
/// namespace (by annotation, and by a Role the platform team grants its
/// account), into its own namespace, everything applied as printed.
#[tokio::test]
async fn the_pull_example_brings_the_ca_bundle_home() {
    let t = TestNs::new("readme-pull").await;
    let op = t.ns("op").await;
    let platform = t.ns("platform").await;
    let team = t.ns("team-a").await;
    let team_glob = t.glob("team-");
    let renames = [
        ("namespace: platform", format!("namespace: {platform}")),
        ("namespace: team-a", format!("namespace: {team}")),
        ("team-*", team_glob),
    ];
    let renames: Vec<(&str, &str)> = renames.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let account = example("tenant-account", &renames);
    let docs = example("pull-ca", &renames);
    let bundle = of_kind(&docs, "ConfigMap");
    let bundle_name = bundle["metadata"]["name"].as_str().expect("a name");
    let rule = of_kind(&docs, "CopyratorRule");
    let rule_name = rule["metadata"]["name"].as_str().expect("a name");
    assert_eq!(rule["metadata"]["namespace"], json!(team));
    apply_as_printed(&t, account.iter().chain(&docs)).await;
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

/// `kubectl apply` of `docs` (a test's own temporary file).
async fn apply_as_printed(t: &TestNs, docs: impl Iterator<Item = &Value>) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs.collect::<Vec<_>>()});
    let file = std::env::temp_dir().join(format!("{}-example.json", t.prefix));
    std::fs::write(&file, list.to_string()).expect("the example written");
    let path = file.to_str().expect("a UTF-8 path").to_owned();
    tokio::task::spawn_blocking(move || kubectl(&["apply", "-f", &path]))
        .await
        .expect("kubectl");
    let _ = std::fs::remove_file(&file);
}

/// docs/kinds.md, "Copying RBAC objects": the RoleBinding lands, with the same
/// roleRef and subjects, in every namespace labelled `team: "true"`, and
/// not in one without the label.
#[tokio::test]
async fn the_rolebinding_example_reaches_the_labelled_namespaces() {
    let t = TestNs::new("readme-rolebinding").await;
    let op = t.ns("op").await;
    let platform = t.ns("platform").await;
    let team_a = t.ns_labelled("team-a", &[("team", "true")]).await;
    let team_b = t.ns_labelled("team-b", &[("team", "true")]).await;
    let other = t.ns("other").await;
    let docs = example(
        "rolebinding-teams",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("namespace: platform", &format!("namespace: {platform}")),
        ],
    );
    let binding = of_kind(&docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], json!(platform));
    let source = create_object(&t, &role_bindings(), binding).await;
    let source_name = source.metadata.name.clone().expect("a name");
    let rule = of_kind(&docs, "CopyratorRule");
    assert_eq!(rule["metadata"]["namespace"], json!(op));
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    // As written: no other test labels a namespace team=true.
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    // The test's client, which the operator uses too, holds every
    // permission, so the API server lets it bind `view`.
    let _operator = Operator::start(&t, &op, &["--kinds", KINDS]);
    let uid = t.rule_uid(&op, name).await;
    for ns in [&team_a, &team_b] {
        wait_object(
            &t,
            &role_bindings(),
            ns,
            &source_name,
            "a copy with the source's roleRef and subjects",
            |o| copy_of(o, &source, &["roleRef", "subjects"], &uid),
        )
        .await;
    }
    t.wait_rule(&op, name, "Ready, two copies", |r| {
        is_ready(r)?;
        match status_u64(r, "copies") {
            Some(2) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    let api = objects(&t, &role_bindings(), &other);
    assert_for(
        format!("no RoleBinding {other}/{source_name} (the namespace has no team label)"),
        QUIET,
        async || match api.get_opt(&source_name).await.map_err(|e| err_msg(&e))? {
            None => Ok(()),
            Some(o) => Err(format!("it exists: {:?}", o.metadata.labels)),
        },
    )
    .await;
}

/// docs/kinds.md, "Any namespaced kind": the NetworkPolicy is copied once into
/// the team namespace and handed over; the team's edit of it stays. A
/// `Sync` rule over the same source, whose copy gets the same edit and has
/// it undone, shows that the operator saw the edit.
#[tokio::test]
async fn the_networkpolicy_example_hands_its_copy_over() {
    let t = TestNs::new("readme-netpol").await;
    let op = t.ns("op").await;
    let templates = t.ns("templates").await;
    let team = t.ns("team-a").await;
    let synced = t.ns("sync1").await;
    let team_glob = t.glob("team-");
    let docs = example(
        "networkpolicy-default-deny",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("namespace: templates", &format!("namespace: {templates}")),
            ("team-*", &team_glob),
        ],
    );
    let policy = of_kind(&docs, "NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], json!(templates));
    let source = create_object(&t, &network_policies(), policy).await;
    let source_name = source.metadata.name.clone().expect("a name");
    let rule = of_kind(&docs, "CopyratorRule");
    assert_eq!(rule["spec"]["syncPolicy"], "CreateOnly");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    let witness = with(
        with(
            json!({"spec": rule["spec"]}),
            "/spec/syncPolicy",
            json!("Sync"),
        ),
        "/spec/targets",
        json!({"include": [t.glob("sync")]}),
    );
    t.create_rule(&op, "witness", witness).await;
    let _operator = Operator::start(&t, &op, &["--kinds", KINDS]);
    let uid = t.rule_uid(&op, name).await;
    let witness_uid = t.rule_uid(&op, "witness").await;
    wait_object(
        &t,
        &network_policies(),
        &team,
        &source_name,
        "a copy handed over (CreateOnly)",
        |o| {
            copy_of(o, &source, &["spec"], &uid)?;
            let policy = o
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SYNC_POLICY));
            match policy.map(String::as_str) {
                Some("CreateOnly") => Ok(()),
                other => Err(format!("label {LABEL_SYNC_POLICY}={other:?}")),
            }
        },
    )
    .await;
    wait_object(
        &t,
        &network_policies(),
        &synced,
        &source_name,
        "the witness's copy",
        |o| copy_of(o, &source, &["spec"], &witness_uid),
    )
    .await;

    // The team denies egress too; someone makes the same edit to the
    // witness's copy.
    let edit = json!({"spec": {"policyTypes": ["Ingress", "Egress"]}});
    let edited = patch_object(&t, &network_policies(), &team, &source_name, &edit).await;
    patch_object(&t, &network_policies(), &synced, &source_name, &edit).await;
    wait_object(
        &t,
        &network_policies(),
        &synced,
        &source_name,
        "the witness's copy put back (Sync)",
        |o| copy_of(o, &source, &["spec"], &witness_uid),
    )
    .await;
    let rv = edited.metadata.resource_version.clone().expect("a version");
    let api = objects(&t, &network_policies(), &team);
    assert_for(
        format!("{team}/{source_name} as the team left it (CreateOnly)"),
        QUIET,
        async || match api.get_opt(&source_name).await.map_err(|e| err_msg(&e))? {
            None => Err("it was deleted".into()),
            Some(o) if o.metadata.resource_version.as_deref() != Some(rv.as_str()) => {
                Err(format!("changed: spec {}", o.data["spec"]))
            }
            Some(_) => Ok(()),
        },
    )
    .await;
}

/// The rule's resource names, as kubectl resolves them: its plural and
/// singular (the original API's), its short names and the kind's own names.
const RULE_NAMES: &[&str] = &[
    "copyrators",
    "copyrator",
    "copyr",
    "copyratorrules",
    "copyratorrule",
];

/// Every `kubectl` command that README.md and docs/*.md show, in code
/// spans and code blocks (a span may wrap over lines), with its words.
fn documented_kubectl_commands() -> Vec<String> {
    doc_pages()
        .iter()
        .flat_map(|(_, text)| kubectl_commands(text))
        .collect()
}

/// Every `kubectl` command one Markdown page shows.
fn kubectl_commands(page: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut prose = String::new();
    let mut block_command: Option<String> = None;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            let line = line.trim();
            match block_command.take() {
                Some(mut command) => {
                    command.push(' ');
                    command.push_str(line.trim_end_matches('\\').trim());
                    if line.ends_with('\\') {
                        block_command = Some(command);
                    } else {
                        commands.push(command);
                    }
                }
                None if line.starts_with("kubectl ") => {
                    let command = line.trim_end_matches('\\').trim().to_owned();
                    if line.ends_with('\\') {
                        block_command = Some(command);
                    } else {
                        commands.push(command);
                    }
                }
                None => {}
            }
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Inline code: every other piece between backticks.
    for span in prose.split('`').skip(1).step_by(2) {
        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
        if span.starts_with("kubectl ") {
            commands.push(span);
        }
    }
    commands
}

/// The resource a kubectl command names: its first word after the verb
/// that is neither a flag nor a flag's value; for `explain`, the part
/// before the first dot.
fn resource_named(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let with_value = [
        "-n",
        "--namespace",
        "-o",
        "--type",
        "-p",
        "-l",
        "-f",
        "--selector",
    ];
    let mut positional = Vec::new();
    let mut i = 1;
    while i < words.len() {
        let word = words[i];
        if with_value.contains(&word) {
            i += 2;
            continue;
        }
        if !word.starts_with('-') {
            positional.push(word);
        }
        i += 1;
    }
    let resource = positional.get(1)?;
    Some(resource.split('.').next().unwrap_or(resource).to_owned())
}

/// Each documented command that names the rule's resource runs as written
/// (`NS` and `NAME` stand for a rule's namespace and name), from a kubeconfig
/// whose namespace is the rule's, and its output names the rule (or, for
/// `explain`, the fields it documents). A name kubectl does not resolve
/// fails with "the server doesn't have a resource type".
#[tokio::test]
async fn every_documented_command_that_names_a_rule_works_as_written() {
    let t = TestNs::new("readme-kubectl").await;
    let ns = t.ns("rules").await;
    t.create_rule(&ns, "r1", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let commands: Vec<String> = documented_kubectl_commands()
        .into_iter()
        .filter(|c| resource_named(c).is_some_and(|r| RULE_NAMES.contains(&r.as_str())))
        .collect();
    for name in RULE_NAMES {
        assert!(
            commands
                .iter()
                .any(|c| resource_named(c).as_deref() == Some(*name)),
            "README.md and docs/*.md show no kubectl command naming {name:?}: {commands:#?}"
        );
    }
    assert!(
        commands.iter().any(|c| c.starts_with("kubectl explain ")),
        "README.md and docs/*.md show no kubectl explain: {commands:#?}"
    );
    let kubeconfig = operator_kubeconfig(&t, None, None);
    // A discovery cache of its own: names cached by an earlier run against
    // another CRD must not answer for this one.
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kubectl-cache-{}", t.prefix));
    let set_namespace = std::process::Command::new("kubectl")
        .args(["config", "set-context", "--current", "--namespace", &ns])
        .env("KUBECONFIG", &kubeconfig)
        .env("KUBECACHEDIR", &cache)
        .output()
        .expect("kubectl config set-context runs");
    assert!(set_namespace.status.success(), "{set_namespace:?}");
    let mut failures = Vec::new();
    for command in &commands {
        let written = command.replace("NS", &ns).replace("NAME", "r1");
        let words = shell_words(&written);
        let out = std::process::Command::new(&words[0])
            .args(&words[1..])
            .env("KUBECONFIG", &kubeconfig)
            .env("KUBECACHEDIR", &cache)
            .output()
            .unwrap_or_else(|e| panic!("{written}: cannot run: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let expected = if command.starts_with("kubectl explain ") {
            "FIELDS:"
        } else {
            "r1"
        };
        if !out.status.success() || !stdout.contains(expected) {
            failures.push(format!(
                "{written}: {} (expected {expected:?} in its output)\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The words of a command line as a POSIX shell splits them (single
/// quotes only: the documented commands use no other quoting).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut started = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// README.md, "Many clusters": the member's Secret (with a real kubeconfig
/// in place of the placeholder) and the rule; a labelled pull secret
/// reaches the teams' namespaces here and in the member its labels select.
#[tokio::test]
async fn the_member_clusters_example_reaches_the_member() {
    let t = TestNs::new("readme-members").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let team = t.ns("team-a").await;
    let member = members().await.into_iter().next().expect("a member");
    let member_team = member.ns(&t, "team-a").await;
    let team_glob = t.glob("team-");
    let docs = example(
        "pull-secret-to-members",
        &[
            ("namespace: copyrator", &format!("namespace: {op}")),
            ("team-*", &team_glob),
        ],
    );
    let mut inventory = of_kind(&docs, "Secret").clone();
    inventory["stringData"]["value"] = Value::String(member.kubeconfig_yaml());
    let inventory: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(inventory).expect("the example's Secret");
    t.secrets(&op)
        .create(&PostParams::default(), &inventory)
        .await
        .unwrap_or_else(|e| panic!("creating the member's Secret: {}", err_msg(&e)));
    let rule = of_kind(&docs, "CopyratorRule");
    let name = rule["metadata"]["name"].as_str().expect("the rule's name");
    t.create_rule(&op, name, json!({"spec": rule["spec"]}))
        .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    let source = t
        .create_plain(
            SECRET,
            &op,
            "registry",
            &[("pull-secret", "true")],
            &[("token", "s3cret")],
        )
        .await;
    t.wait_copy(SECRET, &team, &source, &op, name).await;
    let copies: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(member.client.clone(), &member_team);
    wait_until(
        format!("the copy in {member_team} of member {}", member.name),
        TIMEOUT,
        async || {
            let copy = copies
                .get_opt(&source.name)
                .await
                .map_err(|e| err_msg(&e))?
                .ok_or("not there yet")?;
            let cluster = copy
                .metadata
                .annotations
                .unwrap_or_default()
                .remove("copyrator.flant.com/source-cluster");
            match cluster.as_deref() {
                Some("home") => Ok(()),
                other => Err(format!("source-cluster {other:?}")),
            }
        },
    )
    .await;
    t.wait_rule(
        &op,
        name,
        "the member listed, ready",
        |r| match r["status"]["clustersReady"].as_str() {
            Some("1/1") => Ok(()),
            _ => Err(format!("{}", r["status"])),
        },
    )
    .await;
}

/// Every YAML document of README.md, docs/*.md and examples/*.yaml that
/// is a Kubernetes object (`apiVersion` and `kind`), each with the page
/// that holds it.
fn documented_objects() -> Vec<(String, Value)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources: Vec<(String, String)> = doc_pages()
        .into_iter()
        .flat_map(|(path, text)| {
            let mut blocks = Vec::new();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("```yaml\n") {
                let after = &rest[at + "```yaml\n".len()..];
                let Some((block, next)) = after.split_once("\n```") else {
                    break;
                };
                blocks.push((path.clone(), block.to_owned()));
                rest = next;
            }
            blocks
        })
        .collect();
    let mut example_files: Vec<String> = std::fs::read_dir(root.join("examples"))
        .expect("reading examples/")
        .filter_map(|entry| entry.ok()?.file_name().to_str().map(str::to_owned))
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .collect();
    example_files.sort();
    for name in example_files {
        let path = format!("examples/{name}");
        let text = std::fs::read_to_string(root.join(&path))
            .unwrap_or_else(|e| panic!("reading {path}: {e}"));
        sources.push((path, text));
    }
    let mut objects = Vec::new();
    for (path, text) in sources {
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let doc = Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
            if doc["apiVersion"].is_string() && doc["kind"].is_string() {
                objects.push((path.clone(), doc));
            }
        }
    }
    objects
}

/// `kubectl create --dry-run=server` of `doc` (on standard input), with
/// `extra` flags: the API server's warnings (kubectl prints each as a line
/// `Warning: ...` on standard error), or why it failed. A create, not an
/// apply: kubectl's own notes on objects it did not apply before are no
/// warnings of the API server. kubectl keeps its discovery in `cache`, the
/// test's own: tests beside this one add and remove API groups.
fn dry_run_create(doc: &Value, extra: &[&str], cache: &std::path::Path) -> Result<String, String> {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .args(["create", "--dry-run=server", "-f", "-"])
        .args(extra)
        .env("KUBECACHEDIR", cache)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running kubectl: {e}"))?;
    let mut pipe = child.stdin.take().ok_or("no stdin for kubectl")?;
    pipe.write_all(doc.to_string().as_bytes())
        .map_err(|e| format!("writing to kubectl: {e}"))?;
    drop(pipe);
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for kubectl: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|line| line.starts_with("Warning: "))
            .collect();
        Ok(warnings.join("\n"))
    } else {
        Err(format!("kubectl failed ({}): {stderr}", out.status))
    }
}

/// The CRDs of `crd/` (and so of the chart, which holds the same) and
/// every object the documentation shows are created on a real API server
/// without a single warning (an unrecognized format, an unknown field, a
/// deprecated API): kubectl prints each warning header of the API
/// server's answer on standard error as a line `Warning: ...`, and must
/// print none.
/// Server-side dry runs: nothing is stored. Each CRD is created as a new
/// one (its group under the test's own prefix), as a first install sees it.
#[tokio::test]
async fn the_crd_and_every_documented_object_apply_without_a_warning() {
    let t = TestNs::new("no-warnings").await;
    let ns = t.ns("ex").await;
    let cache =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-kube-cache", t.prefix));
    let mut warned = Vec::new();
    let crd_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crd");
    let mut crd_files: Vec<std::path::PathBuf> = std::fs::read_dir(&crd_dir)
        .expect("reading crd/")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    crd_files.sort();
    assert!(!crd_files.is_empty(), "no CRD in crd/");
    for path in crd_files {
        let text = std::fs::read_to_string(&path).expect("a CRD file");
        let mut crd: Value = serde_yaml::from_str(&text).expect("a CRD");
        let group = format!(
            "{}.{}",
            t.prefix,
            crd["spec"]["group"].as_str().expect("its group")
        );
        let plural = crd["spec"]["names"]["plural"]
            .as_str()
            .expect("its plural")
            .to_owned();
        crd["metadata"]["name"] = json!(format!("{plural}.{group}"));
        crd["spec"]["group"] = json!(group);
        match dry_run_create(&crd, &[], &cache) {
            Ok(stderr) if stderr.is_empty() => {}
            Ok(stderr) => warned.push(format!("{}: {stderr}", path.display())),
            Err(e) => warned.push(format!("{}: {e}", path.display())),
        }
    }
    // The documentation shows a ClusterProfile: its kind must be served.
    let profiles: Value = serde_yaml::from_str(include_str!(
        "../../crd/clusterprofile.multicluster.x-k8s.io.yaml"
    ))
    .expect("the ClusterProfile CRD");
    let profiles_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    );
    apply_crd(t.client.clone(), &profiles, &profiles_resource).await;
    let objects = documented_objects();
    assert!(
        objects.len() >= 10,
        "the documentation shows only {} objects",
        objects.len()
    );
    for (path, mut doc) in objects {
        let what = format!(
            "{path}: {} {}",
            doc["kind"].as_str().unwrap_or_default(),
            doc["metadata"]["name"].as_str().unwrap_or_default()
        );
        // Into the test's namespace: the example's own may not exist here.
        if doc["metadata"]["namespace"].is_string() {
            doc["metadata"]["namespace"] = json!(ns);
        }
        match dry_run_create(&doc, &["--namespace", &ns], &cache) {
            Ok(stderr) if stderr.is_empty() => {}
            Ok(stderr) => warned.push(format!("{what}: {stderr}")),
            Err(e) => warned.push(format!("{what}: {e}")),
        }
    }
    assert!(warned.is_empty(), "{}", warned.join("\n"));
}
