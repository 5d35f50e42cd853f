//! Rule options against a real control plane and the real binary:
//! `syncPolicy: CreateOnly` (copies made once and handed over to their
//! namespaces) and `transform.keys` (which data keys copies carry, and
//! under which names).
//!
//! "Nothing happens" to a copy handed over is checked for [`QUIET`] only
//! after a positive signal: a `Sync` rule copying the same source into
//! other namespaces has acted on the same change.

use crate::common::*;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

/// A rule of `kind` over the test's sources into the namespaces `include`
/// matches, with `syncPolicy: CreateOnly`.
fn create_only_spec<S: AsRef<str>>(t: &TestNs, kind: Kind, include: &[S]) -> Value {
    with(
        rule_spec(kind, t.selector(), include),
        "/spec/syncPolicy",
        json!("CreateOnly"),
    )
}

/// A copy made under `syncPolicy: CreateOnly`: a copy of `source` like any
/// other, and the label that hands it over to its namespace.
fn handed_over(
    copy: &Obj,
    source: &Obj,
    rule_ns: &str,
    rule: &str,
    uid: &str,
) -> Result<(), String> {
    check_copy(copy, source, rule_ns, rule, uid)?;
    match copy.label(LABEL_SYNC_POLICY) {
        Some("CreateOnly") => Ok(()),
        other => Err(format!(
            "{}/{}: label {LABEL_SYNC_POLICY}={other:?}, want CreateOnly",
            copy.namespace, copy.name
        )),
    }
}

/// Waits for the copy of `source` in `ns` that the CreateOnly rule
/// `rule_ns/rule` made.
async fn wait_handed_over(
    t: &TestNs,
    kind: Kind,
    ns: &str,
    source: &Obj,
    rule_ns: &str,
    rule: &str,
) -> Obj {
    let uid = t.rule_uid(rule_ns, rule).await;
    t.wait_obj(
        kind,
        ns,
        &source.name,
        "a copy handed over (CreateOnly)",
        |o| handed_over(o, source, rule_ns, rule, &uid),
    )
    .await
}

/// The status counts of a rule: `(copies, createOnlyCopies)`, with Ready True.
fn counts(rule: &Value, copies: u64, create_only: u64) -> Result<(), String> {
    is_ready(rule)?;
    let seen = (
        status_u64(rule, "copies").unwrap_or(0),
        status_u64(rule, "createOnlyCopies").unwrap_or(0),
    );
    if seen == (copies, create_only) {
        Ok(())
    } else {
        Err(format!(
            "copies and createOnlyCopies {seen:?}, want {:?}: {}",
            (copies, create_only),
            short_status(rule)
        ))
    }
}

/// Ready False with `reason` and a message that mentions every one of `words`.
fn not_ready(rule: &Value, reason: &str, words: &[&str]) -> Result<(), String> {
    let ready = ready_condition(rule).ok_or_else(|| short_status(rule))?;
    let message = ready["message"].as_str().unwrap_or_default();
    if ready["status"] == "False"
        && ready["reason"] == reason
        && words.iter().all(|w| message.contains(w))
    {
        Ok(())
    } else {
        Err(short_status(rule))
    }
}

// --- syncPolicy: CreateOnly ------------------------------------------------------

/// The operator's namespace, a namespace `once1` that rule `once` fills
/// with `CreateOnly`, and `sync1` that rule `sync` fills with `Sync` from
/// the same sources (a witness that each change was seen).
async fn once_and_sync_rules(t: &TestNs) -> (String, String, String) {
    let op = t.ns("op").await;
    let once = t.ns("once1").await;
    let synced = t.ns("sync1").await;
    t.create_rule(&op, "once", create_only_spec(t, CM, &[t.glob("once")]))
        .await;
    t.create_rule(&op, "sync", rule_spec(CM, t.selector(), &[t.glob("sync")]))
        .await;
    (op, once, synced)
}

/// A copy made once is never updated: not when someone edits it, not when
/// the source changes; and it stays when the source is deleted. A `Sync`
/// rule over the same source shows each change was seen.
#[tokio::test]
async fn create_only_copies_survive_edits_source_changes_and_source_deletion() {
    let t = TestNs::new("once-edits").await;
    let (op, once, synced) = once_and_sync_rules(&t).await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_source(CM, &op, "cfg", &[], &[("k", "v"), ("other", "1")])
        .await;
    wait_handed_over(&t, CM, &once, &source, &op, "once").await;
    let sync_copy = t.wait_copy(CM, &synced, &source, &op, "sync").await;
    assert_eq!(
        sync_copy.label(LABEL_SYNC_POLICY),
        None,
        "a Sync copy is not handed over"
    );
    t.wait_rule(&op, "once", "copies 1, createOnlyCopies 1", |r| {
        counts(r, 1, 1)
    })
    .await;

    // Both copies edited: the Sync copy is put back, the other stays as edited.
    let edited = t
        .set_data(
            CM,
            &once,
            "cfg",
            &[("k", Some("team's own")), ("other", None)],
        )
        .await;
    t.set_data(CM, &synced, "cfg", &[("k", Some("edited"))])
        .await;
    t.wait_obj(CM, &synced, "cfg", "the Sync copy put back", |o| {
        o.data_is(&[("k", "v"), ("other", "1")])
    })
    .await;
    t.assert_unchanged(
        CM,
        &once,
        "cfg",
        &edited.resource_version,
        "a copy handed over is not restored",
    )
    .await;

    // The source changes: the Sync copy follows, the other does not.
    let source = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &synced, &source, &op, "sync").await;
    t.assert_unchanged(
        CM,
        &once,
        "cfg",
        &edited.resource_version,
        "a copy handed over is not updated",
    )
    .await;
    edited.data_is(&[("k", "team's own")]).unwrap();

    // The source is deleted: the Sync copy is pruned, the other stays.
    t.delete(CM, &op, "cfg").await;
    t.wait_gone(CM, &synced, "cfg", "its source is gone").await;
    t.assert_unchanged(
        CM,
        &once,
        "cfg",
        &edited.resource_version,
        "a copy handed over is never pruned",
    )
    .await;
    t.wait_rule(&op, "once", "no source, still one copy handed over", |r| {
        counts(r, 0, 1)
    })
    .await;

    // Deleted by someone, with the source back: created again, once.
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v3")]).await;
    t.delete(CM, &once, "cfg").await;
    wait_handed_over(&t, CM, &once, &source, &op, "once").await;
}

/// A namespace that leaves the targets keeps its copy; a deleted rule's
/// finalizer leaves its copies, says so in its Event, and a later rule of
/// the same name takes none of them.
#[tokio::test]
async fn create_only_copies_survive_leaving_the_targets_and_rule_deletion() {
    let t = TestNs::new("once-rule-deleted").await;
    let op = t.ns("op").await;
    let once1 = t.ns_labelled("once1", &[("team", "a")]).await;
    let once2 = t.ns_labelled("once2", &[("team", "a")]).await;
    let synced = t.ns_labelled("sync1", &[("team", "a")]).await;
    let team_a = json!({"matchLabels": {"team": "a"}});
    t.create_rule(
        &op,
        "once",
        with(
            create_only_spec(&t, SECRET, &[t.glob("once")]),
            "/spec/targets/namespaceSelector",
            team_a.clone(),
        ),
    )
    .await;
    t.create_rule(
        &op,
        "sync",
        with(
            rule_spec(SECRET, t.selector(), &[t.glob("sync")]),
            "/spec/targets/namespaceSelector",
            team_a,
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_source(SECRET, &op, "token", &[], &[("token", "t0k3n")])
        .await;
    let mut handed = Vec::new();
    for ns in [&once1, &once2] {
        handed.push(wait_handed_over(&t, SECRET, ns, &source, &op, "once").await);
    }
    t.wait_copy(SECRET, &synced, &source, &op, "sync").await;
    let uid = t.rule_uid(&op, "once").await;

    // once1 and sync1 leave the targets.
    for ns in [&once1, &synced] {
        t.namespaces()
            .patch(
                ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": null}}})),
            )
            .await
            .unwrap_or_else(|e| panic!("unlabelling namespace {ns}: {}", err_msg(&e)));
    }
    t.wait_gone(SECRET, &synced, "token", "its namespace left the targets")
        .await;
    t.assert_unchanged(
        SECRET,
        &once1,
        "token",
        &handed[0].resource_version,
        "a copy handed over stays when its namespace leaves the targets",
    )
    .await;

    // The rule is deleted: its finalizer lets it go and leaves both copies.
    t.delete_rule(&op, "once").await;
    t.wait_rule_gone(&op, "once", "its finalizer leaves the copies handed over")
        .await;
    for (ns, copy) in [&once1, &once2].into_iter().zip(&handed) {
        let now = t.must_get(SECRET, ns, "token").await;
        assert_eq!(
            now.resource_version, copy.resource_version,
            "the copy in {ns} was written by the cleanup"
        );
    }
    wait_until(
        "a CopiesDeleted Event that counts the 2 copies left",
        TIMEOUT,
        async || {
            let notes: Vec<String> = t
                .events_regarding(&op, "once")
                .await
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("CopiesDeleted"))
                .filter_map(|e| e.note)
                .collect();
            if notes.iter().any(|n| n.contains("left the 2")) {
                Ok(())
            } else {
                Err(format!("{notes:?}"))
            }
        },
    )
    .await;

    // A later rule of the same name, Sync, finds the copy in once2 (still a
    // target) and reports it, not taking it.
    t.create_rule(
        &op,
        "once",
        with(
            rule_spec(SECRET, t.selector(), &[t.glob("once")]),
            "/spec/targets/namespaceSelector",
            json!({"matchLabels": {"team": "a"}}),
        ),
    )
    .await;
    t.wait_rule(
        &op,
        "once",
        "the copy handed over reported as a conflict",
        |r| {
            let conflicts = r
                .pointer("/status/conflicts")
                .cloned()
                .unwrap_or(Value::Null);
            if status_u64(r, "conflictCount") == Some(1)
                && conflicts.to_string().contains("CreateOnly")
            {
                Ok(())
            } else {
                Err(short_status(r))
            }
        },
    )
    .await;
    for (ns, copy) in [&once1, &once2].into_iter().zip(&handed) {
        t.assert_unchanged(
            SECRET,
            ns,
            "token",
            &copy.resource_version,
            "no rule takes a copy handed over",
        )
        .await;
        assert_eq!(
            t.must_get(SECRET, ns, "token").await.label(LABEL_RULE_UID),
            Some(uid.as_str())
        );
    }
}

/// A rule that vanished without its finalizer: its Sync copies are
/// collected at the next start, the copies it handed over are not.
#[tokio::test]
async fn copies_handed_over_are_not_collected_as_orphans() {
    let t = TestNs::new("once-orphans").await;
    let (op, once, synced) = once_and_sync_rules(&t).await;
    let mut operator = Operator::start(&t, &op, &[]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let copy = wait_handed_over(&t, CM, &once, &source, &op, "once").await;
    t.wait_copy(CM, &synced, &source, &op, "sync").await;
    let once_uid = t.rule_uid(&op, "once").await;
    let sync_uid = t.rule_uid(&op, "sync").await;
    operator.crash();

    // Both rules force-deleted while no operator runs.
    for rule in ["once", "sync"] {
        t.patch_rule(&op, rule, json!({"metadata": {"finalizers": null}}))
            .await;
        t.delete_rule(&op, rule).await;
        t.wait_rule_gone(&op, rule, "force-deleted").await;
    }

    let _operator = Operator::start(&t, &op, &[]);
    wait_until(
        "the Sync copies of the force-deleted rule to be collected",
        TIMEOUT,
        async || match t.list_labelled(CM, LABEL_RULE_UID, &sync_uid).await.len() {
            0 => Ok(()),
            n => Err(format!("{n} copies left")),
        },
    )
    .await;
    t.assert_unchanged(
        CM,
        &once,
        "cfg",
        &copy.resource_version,
        "a copy handed over is no orphan",
    )
    .await;
    assert_eq!(
        t.list_labelled(CM, LABEL_RULE_UID, &once_uid).await.len(),
        1
    );
}

// --- transform.keys -----------------------------------------------------------

#[tokio::test]
async fn configmap_keys_are_selected_and_renamed() {
    let t = TestNs::new("keys-cm").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/transform/keys",
        json!({
            "include": ["*.crt", "tls.*"],
            "exclude": ["tls.key"],
            "rename": {"ca.crt": "root.pem", "blob.crt": "blob.pem"}
        }),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    t.create_json(
        CM,
        &op,
        "certs",
        json!({
            "metadata": {"labels": {TEST_LABEL: t.prefix}},
            "data": {"ca.crt": "C", "tls.crt": "T", "tls.key": "K", "notes": "N"},
            "binaryData": {"blob.crt": b64(&[0, 1]), "raw": b64(&[2])},
        }),
    )
    .await;
    let uid = t.rule_uid(&op, "r").await;
    let selected = |o: &Obj| -> Result<(), String> {
        o.data_is(&[("root.pem", "C"), ("tls.crt", "T")])?;
        let want = std::collections::BTreeMap::from([("blob.pem".to_string(), vec![0u8, 1])]);
        if o.binary_data != want {
            return Err(format!("binaryData {:?}, want {want:?}", o.binary_data));
        }
        match o.label(LABEL_RULE_UID) {
            Some(u) if u == uid => Ok(()),
            other => Err(format!("label {LABEL_RULE_UID}={other:?}")),
        }
    };
    t.wait_obj(CM, &t1, "certs", "the selected keys, renamed", selected)
        .await;

    // A key the rule leaves out, added to the copy, is taken out again.
    t.set_data(CM, &t1, "certs", &[("tls.key", Some("K"))])
        .await;
    t.wait_obj(CM, &t1, "certs", "the left-out key removed again", selected)
        .await;

    // A source with none of the selected keys still gets its copy, empty.
    t.create_source(CM, &op, "plain", &[], &[("notes", "N")])
        .await;
    t.wait_obj(CM, &t1, "plain", "a copy with no data", |o| {
        if o.data.is_empty() && o.binary_data.is_empty() && o.is_copy() {
            Ok(())
        } else {
            Err(format!("data {:?} binaryData {:?}", o.data, o.binary_data))
        }
    })
    .await;
    t.wait_rule(&op, "r", "Ready with both copies", |r| counts(r, 2, 0))
        .await;
}

#[tokio::test]
async fn secret_keys_are_selected_and_renamed_and_their_values_stay_out_of_the_status() {
    let t = TestNs::new("keys-secret").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
        "/spec/transform/keys",
        json!({"exclude": ["host", "db-password"], "rename": {"password": "db-password"}}),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    let password = format!("pw-{}-{}", t.prefix, random5());
    t.create_source(
        SECRET,
        &op,
        "db",
        &[],
        &[
            ("username", "app"),
            ("password", password.as_str()),
            ("host", "db.internal"),
        ],
    )
    .await;
    let copy = t
        .wait_obj(
            SECRET,
            &t1,
            "db",
            "username, and password as db-password",
            |o| o.data_is(&[("username", "app"), ("db-password", password.as_str())]),
        )
        .await;
    assert_eq!(copy.type_.as_deref(), Some("Opaque"));

    let rule = t
        .wait_rule(&op, "r", "Ready with one copy", |r| counts(r, 1, 0))
        .await;
    let events = t.events_regarding(&op, "r").await;
    let said = format!(
        "{rule} {:?}",
        events.iter().map(|e| &e.note).collect::<Vec<_>>()
    );
    for form in secret_forms(&password) {
        assert!(
            !said.contains(&form),
            "a Secret value reached the status or an Event (as {form})"
        );
    }
}

#[tokio::test]
async fn invalid_sync_policies_and_key_renames_are_refused_at_admission() {
    let t = TestNs::new("options-schema").await;
    let ns = t.ns("op").await;
    let base = rule_spec(CM, json!({"copyrator": "true"}), &[t.glob("t")]);
    let cases = [
        (
            "spec-policy",
            with(base.clone(), "/spec/syncPolicy", json!("Always")),
            "spec.syncPolicy",
        ),
        (
            "top-policy",
            json!({"ruleType": "configmap", "selector": {"copyrator": "true"}, "syncPolicy": "createonly"}),
            "syncPolicy",
        ),
        (
            "two-to-one",
            with(
                base.clone(),
                "/spec/transform/keys/rename",
                json!({"a": "c", "b": "c"}),
            ),
            "renamed to the same key",
        ),
        (
            "bad-name",
            with(
                base.clone(),
                "/spec/transform/keys/rename",
                json!({"a": "x/y"}),
            ),
            "spec.transform.keys.rename",
        ),
        (
            "bad-glob",
            with(base.clone(), "/spec/transform/keys/include", json!(["a/*"])),
            "spec.transform.keys.include",
        ),
    ];
    for (name, body, mention) in cases {
        match t.try_create_rule(&ns, name, body.clone()).await {
            Ok(r) => panic!("the API server accepted the invalid rule {body}: {r}"),
            Err(e) => {
                let message = err_msg(&e);
                assert!(
                    matches!(&e, kube::Error::Api(s) if s.code == 422),
                    "expected 422 Invalid for {body}, got {message}"
                );
                assert!(
                    message.contains(mention),
                    "the refusal of {body} does not mention {mention:?}: {message}"
                );
            }
        }
    }
    // The valid values are taken, at the top level and under spec.
    for (name, body) in [
        (
            "top-ok",
            json!({"ruleType": "configmap", "selector": {"copyrator": "true"}, "syncPolicy": "CreateOnly"}),
        ),
        ("spec-ok", with(base, "/spec/syncPolicy", json!("Sync"))),
    ] {
        t.try_create_rule(&ns, name, body.clone())
            .await
            .unwrap_or_else(|e| panic!("{body} refused: {}", err_msg(&e)));
    }
}

/// A key renamed onto one that copies keep is what the schema cannot see:
/// the rule is reported invalid and changes nothing until it is fixed.
#[tokio::test]
async fn a_rename_onto_a_kept_key_is_reported_in_the_status() {
    let t = TestNs::new("keys-collision").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
        "/spec/transform/keys/rename",
        json!({"password": "db-password"}),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    t.create_source(
        SECRET,
        &op,
        "db",
        &[],
        &[("password", "p"), ("db-password", "q")],
    )
    .await;
    t.wait_rule(&op, "r", "Ready False, InvalidRule naming both keys", |r| {
        not_ready(
            r,
            "InvalidRule",
            &["transform.keys.rename", "\"password\"", "\"db-password\""],
        )
    })
    .await;
    t.assert_absent(SECRET, &t1, "db", "an invalid rule writes nothing")
        .await;

    // Fixed: the other key left out, the copy is made.
    t.patch_rule(
        &op,
        "r",
        json!({"spec": {"transform": {"keys": {"exclude": ["db-password"]}}}}),
    )
    .await;
    t.wait_obj(SECRET, &t1, "db", "the renamed key alone", |o| {
        o.data_is(&[("db-password", "p")])
    })
    .await;
    t.wait_rule_ready(&op, "r").await;
}
