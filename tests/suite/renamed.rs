//! Copies under another name (`transform.name`) against a real control
//! plane: every place is the copy's name's, beside the source too; sources
//! that would meet on one name are copied nowhere there and named; `where`
//! and `plan` name both names; in a member as at home.

use crate::common::members::{Member, OUTAGE, members};
use crate::common::*;
use crate::members::{member_rule, wait_member_copy};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const NAMESPACES: usize = 100;

fn renamed(spec: Value, name: Value) -> Value {
    with(spec, "/spec/transform/name", name)
}

/// `ns/name` is the rule's copy of `source`, with `data`, under its name.
fn renamed_copy(o: &Obj, source: &str, uid: &str, data: &[(&str, &str)]) -> Result<(), String> {
    o.data_is(data)?;
    match (
        o.label(LABEL_RULE_UID),
        o.annotations.get(ANNOTATION_SOURCE).map(String::as_str),
    ) {
        (Some(u), Some(s)) if u == uid && s == source => Ok(()),
        other => Err(format!("rule UID and source {other:?}")),
    }
}

/// The ConfigMaps named `name` in `namespaces`, by namespace: one list.
async fn named_in(
    t: &TestNs,
    namespaces: &[String],
    name: &str,
) -> Result<BTreeMap<String, ConfigMap>, String> {
    let listed = Api::<ConfigMap>::all(t.client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(|e| err_msg(&e))?;
    Ok(listed
        .items
        .into_iter()
        .filter_map(|cm| Some((cm.metadata.namespace.clone()?, cm)))
        .filter(|(ns, _)| namespaces.contains(ns))
        .collect())
}

/// Every one of `namespaces` holds the copy `name` of `source` (rule UID
/// `uid`) with `data`.
async fn wait_all(
    t: &TestNs,
    namespaces: &[String],
    name: &str,
    (source, uid): (&str, &str),
    data: &[(&str, &str)],
) {
    let want = map(data);
    wait_until(
        format!(
            "{} copies {name} of {source} with {want:?}",
            namespaces.len()
        ),
        TIMEOUT,
        async || {
            let found = named_in(t, namespaces, name).await?;
            for ns in namespaces {
                let Some(copy) = found.get(ns) else {
                    return Err(format!("none in {ns}"));
                };
                let labels = copy.metadata.labels.clone().unwrap_or_default();
                let annotations = copy.metadata.annotations.clone().unwrap_or_default();
                let right = labels.get(LABEL_RULE_UID).map(String::as_str) == Some(uid)
                    && annotations.get(ANNOTATION_SOURCE).map(String::as_str) == Some(source)
                    && copy.data.clone().unwrap_or_default() == want;
                if !right {
                    return Err(format!("{ns}: {:?} {annotations:?}", copy.data));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// A rule copying `pull` as `platform-pull` into 100 namespaces and the
/// source's own: named by `plan` with both names, then filled, updated,
/// restored after an edit and a delete, named by `where`, and pruned when
/// the source stops matching.
#[tokio::test]
async fn a_renamed_copy_is_kept_like_any_copy_and_beside_its_source() {
    let t = TestNs::new("renamed").await;
    let op = t.ns("op").await;
    let platform = t.ns("platform").await;
    let mut targets = Vec::with_capacity(NAMESPACES + 2);
    for i in 0..NAMESPACES {
        targets.push(t.ns(&format!("t{i:03}")).await);
    }
    let source = t
        .create_source(CM, &platform, "pull", &[], &[("k", "v1")])
        .await;
    let spec = with(
        rule_spec(CM, t.selector(), &[t.glob("t"), platform.clone()]),
        "/spec/namespace",
        json!(platform),
    );
    t.create_rule(&op, "r", renamed(spec, json!({"prefix": "platform-"})))
        .await;
    let (from, rule) = (format!("{platform}/pull"), format!("{op}/r"));
    // `plan` names both names, beside the source too.
    let planned = copyrator_plan(&["--namespace", &op, "-o", "json"], None).await;
    assert_eq!(
        planned.changes_in(&[&targets[0], &platform]),
        [&platform, &targets[0]].map(|ns| change(
            "create",
            CM,
            ns,
            "platform-pull",
            &rule,
            Some(&from)
        )),
        "{}",
        planned.stdout
    );

    let _operator = Operator::start(&t, &op, &[]);
    let uid = t.rule_uid(&op, "r").await;
    // The source's own namespace gets the copy too: it has another name.
    targets.push(platform.clone());
    wait_all(&t, &targets, "platform-pull", (&from, &uid), &[("k", "v1")]).await;
    let own_name = named_in(&t, &targets[..NAMESPACES], "pull").await;
    assert_eq!(
        own_name.map(|found| found.len()),
        Ok(0),
        "copies take the new name only"
    );
    let status = t.wait_rule_ready(&op, "r").await;
    assert_eq!(
        status_u64(&status, "copies"),
        Some(NAMESPACES as u64 + 1),
        "{}",
        short_status(&status)
    );
    let source_now = t.must_get(CM, &platform, "pull").await;
    assert_eq!(
        source_now.resource_version, source.resource_version,
        "the source itself was written"
    );

    // A source change reaches every copy.
    t.set_data(CM, &platform, "pull", &[("k", Some("v2"))])
        .await;
    wait_all(&t, &targets, "platform-pull", (&from, &uid), &[("k", "v2")]).await;

    // An edited copy and a deleted one are put back, under the new name.
    let (edited, deleted) = (&targets[3], &targets[7]);
    t.set_data(CM, edited, "platform-pull", &[("k", Some("mine"))])
        .await;
    t.delete(CM, deleted, "platform-pull").await;
    wait_all(
        &t,
        &[edited.clone(), deleted.clone()],
        "platform-pull",
        (&from, &uid),
        &[("k", "v2")],
    )
    .await;
    // A namespace made later is filled.
    let late = t.ns("t-late").await;
    wait_all(
        &t,
        std::slice::from_ref(&late),
        "platform-pull",
        (&from, &uid),
        &[("k", "v2")],
    )
    .await;
    targets.push(late);

    // `where` names the copy's name at each place.
    let found = crate::whereabouts::copyrator_where(&[&from, "--namespace", &op]).await;
    found.assert_exit(0);
    for ns in [&targets[0], &platform] {
        let line = format!("home: {ns}/platform-pull in place (rule {rule})");
        assert!(
            found.stdout.lines().any(|l| l.starts_with(&line)),
            "no line {line:?} in\n{}",
            found.stdout
        );
    }

    // The source stops matching: every copy goes, the source stays.
    t.set_labels(CM, &platform, "pull", &[(TEST_LABEL, None)])
        .await;
    wait_until("every copy pruned", TIMEOUT, async || {
        match named_in(&t, &targets, "platform-pull").await?.keys().next() {
            None => Ok(()),
            Some(ns) => Err(format!("still in {ns}")),
        }
    })
    .await;
    assert!(
        t.get(CM, &platform, "pull").await.is_some(),
        "the source itself was pruned"
    );
}

/// Two sources whose copies would take one name: neither is written
/// there, the status names both, and the one left is copied once the
/// other goes. A fixed name serves a rule of one source.
#[tokio::test]
async fn sources_that_would_meet_on_one_name_are_copied_nowhere_and_named() {
    let t = TestNs::new("renamed-meet").await;
    let op = t.ns("op").await;
    let (a, b) = (t.ns("a").await, t.ns("b").await);
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/namespace",
        json!([a, b]),
    );
    t.create_rule(&op, "r", renamed(spec, json!({"suffix": "-copy"})))
        .await;
    t.create_source(CM, &a, "ca", &[], &[("k", "from-a")]).await;
    t.create_source(CM, &b, "ca", &[], &[("k", "from-b")]).await;
    t.create_source(CM, &a, "other", &[], &[("k", "o")]).await;
    let _operator = Operator::start(&t, &op, &[]);
    let uid = t.rule_uid(&op, "r").await;
    t.wait_obj(CM, &t1, "other-copy", "the source alone on its name", |o| {
        renamed_copy(o, &format!("{a}/other"), &uid, &[("k", "o")])
    })
    .await;
    let reason = format!(
        "sources {a}/ca, {b}/ca would all be copied as ca-copy (transform.name): none is copied here"
    );
    t.wait_rule(&op, "r", "the meeting sources named at t1/ca-copy", |r| {
        let named = r["status"]["conflicts"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["namespace"] == t1.as_str() && c["name"] == "ca-copy" && c["reason"] == reason
            })
        });
        match named {
            true => Ok(()),
            false => Err(short_status(r)),
        }
    })
    .await;
    t.assert_absent(CM, &t1, "ca-copy", "two sources meet on that name")
        .await;

    // One of them goes: the other is copied.
    t.delete(CM, &b, "ca").await;
    t.wait_obj(
        CM,
        &t1,
        "ca-copy",
        "the source left alone on its name",
        |o| renamed_copy(o, &format!("{a}/ca"), &uid, &[("k", "from-a")]),
    )
    .await;

    // A fixed name: the copy of one source takes it.
    let fixed = with(
        rule_spec(
            CM,
            json!({TEST_LABEL: t.prefix, "pick": "one"}),
            &[t.glob("t")],
        ),
        "/spec/namespace",
        json!(a),
    );
    t.create_rule(&op, "fixed", renamed(fixed, json!({"template": "replica"})))
        .await;
    t.set_labels(CM, &a, "other", &[("pick", Some("one"))])
        .await;
    let fixed_uid = t.rule_uid(&op, "fixed").await;
    t.wait_obj(CM, &t1, "replica", "the copy under the fixed name", |o| {
        renamed_copy(o, &format!("{a}/other"), &fixed_uid, &[("k", "o")])
    })
    .await;
}

/// A renamed rule into a member: the copy takes its new name there, and
/// follows its source.
#[tokio::test]
async fn a_renamed_copy_reaches_a_member_under_its_name() {
    let t = TestNs::new("renamed-member").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    t.create_rule(
        &op,
        "r",
        renamed(
            member_rule(&t, json!({"names": [a.name]})),
            json!({"template": "team.{name}.v1"}),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    wait_member_copy(&a, &a_t1, "team.cfg.v1", &[("k", "v1")]).await;
    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_member_copy(&a, &a_t1, "team.cfg.v1", &[("k", "v2")]).await;
    let absent = a.kubectl(&[
        "get",
        "configmap",
        "-n",
        &a_t1,
        "cfg",
        "--ignore-not-found",
        "-o",
        "name",
    ]);
    assert_eq!(
        absent.trim(),
        "",
        "a copy under the source's name in the member"
    );
}
