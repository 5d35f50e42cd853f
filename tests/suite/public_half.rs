//! A Secret's public half as a ConfigMap (`transform.toKind: ConfigMap`)
//! against a real control plane: only the keys the rule names travel, as
//! text; no target holds the private key; a renewal reaches every
//! ConfigMap; a key that looks private, or one that is not text, keeps its
//! source from being copied, with why; the consumers of the ConfigMap are
//! restarted; in a member as at home.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::common::members::{Member, OUTAGE, members};
use crate::common::tenant::copier_may_edit;
use crate::common::*;
use crate::members::member_rule;
use crate::restart_consumers::{pod, restarts_of, workload};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

const SECRET: Kind = Kind::Secret;
const TARGETS: usize = 20;
const KEY_PEM: &str =
    "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIExample\n-----END EC PRIVATE KEY-----\n";

fn ca(n: u32) -> String {
    format!("-----BEGIN CERTIFICATE-----\nCA{n}\n-----END CERTIFICATE-----\n")
}

/// A rule of Secrets from `from` into the test's `t*` namespaces, as
/// ConfigMaps of the keys `include`, with `transform` merged in.
fn public_half(t: &TestNs, from: &str, include: &[&str], transform: Value) -> Value {
    let mut spec = with(
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
        "/spec/namespace",
        json!(from),
    );
    let mut all = json!({"toKind": "ConfigMap", "keys": {"include": include}});
    if let (Some(all), Some(more)) = (all.as_object_mut(), transform.as_object()) {
        all.extend(more.clone());
    }
    spec["spec"]["transform"] = all;
    spec
}

/// A `kubernetes.io/tls` Secret as cert-manager writes one.
fn tls_secret(t: &TestNs, n: u32) -> Value {
    json!({
        "metadata": {"labels": {TEST_LABEL: t.prefix}},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": format!("CERT{n}"), "tls.key": KEY_PEM, "ca.crt": ca(n)},
    })
}

/// The ConfigMaps named `name` in `namespaces`, by namespace, and whether
/// any object of those namespaces (ConfigMap or Secret) holds `tls.key`,
/// but the sources of `source_namespace`.
async fn config_maps(
    t: &TestNs,
    namespaces: &[String],
    name: &str,
    source_namespace: &str,
) -> Result<(BTreeMap<String, ConfigMap>, bool), String> {
    let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
    let found: BTreeMap<String, ConfigMap> = Api::<ConfigMap>::all(t.client.clone())
        .list(&by_name)
        .await
        .map_err(|e| err_msg(&e))?
        .items
        .into_iter()
        .filter_map(|cm| Some((cm.metadata.namespace.clone()?, cm)))
        .filter(|(ns, _)| namespaces.contains(ns))
        .collect();
    let mut private = found
        .values()
        .any(|cm| cm.data.as_ref().is_some_and(|d| d.contains_key("tls.key")));
    for ns in namespaces.iter().filter(|ns| *ns != source_namespace) {
        let secrets = Api::<Secret>::namespaced(t.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| err_msg(&e))?;
        private |= secrets
            .items
            .iter()
            .any(|s| s.data.as_ref().is_some_and(|d| d.contains_key("tls.key")));
    }
    Ok((found, private))
}

/// Every one of `namespaces` holds the ConfigMap `name` with exactly `data`,
/// and none of them any object holding `tls.key` (but the sources of
/// `source_namespace`).
async fn wait_config_maps(
    t: &TestNs,
    (namespaces, source_namespace): (&[String], &str),
    name: &str,
    data: &[(&str, &str)],
) {
    let want = map(data);
    wait_until(
        format!(
            "{} ConfigMaps {name} holding {want:?} alone",
            namespaces.len()
        ),
        TIMEOUT,
        async || {
            let (found, private) = config_maps(t, namespaces, name, source_namespace).await?;
            assert!(!private, "an object of a target holds tls.key");
            for ns in namespaces {
                let data = found
                    .get(ns)
                    .ok_or_else(|| format!("none in {ns}"))?
                    .data
                    .clone()
                    .unwrap_or_default();
                if data != want {
                    return Err(format!("{ns}: {:?}", data.keys().collect::<Vec<_>>()));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// A cert-manager Secret's CA reaches 20 namespaces, and the source's own
/// beside it, as a ConfigMap holding `ca.crt` alone, as text; its renewal
/// reaches them all; the Deployment that mounts the ConfigMap is rolled.
#[tokio::test]
async fn a_secrets_ca_reaches_every_target_as_a_config_map_and_nothing_else_does() {
    let t = TestNs::new("public-half").await;
    let op = t.ns("op").await;
    let certs = t.ns("certs").await;
    let mut targets = Vec::with_capacity(TARGETS + 1);
    for i in 0..TARGETS {
        targets.push(t.ns(&format!("t{i:02}")).await);
    }
    let mut spec = public_half(&t, &certs, &["ca.crt"], json!({}));
    spec["spec"]["targets"]["include"] = json!([t.glob("t"), certs]);
    spec["spec"]["rollout"] = json!({"restartConsumers": true});
    t.create_rule(&op, "r", spec).await;
    t.create_json(SECRET, &certs, "site-tls", tls_secret(&t, 1))
        .await;
    workload(
        &t,
        "Deployment",
        &targets[0],
        "web",
        pod(
            json!({"volumeMounts": [{"name": "ca", "mountPath": "/ca"}]}),
            json!([{"name": "ca", "configMap": {"name": "site-tls"}}]),
        ),
        json!({}),
    )
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    // The ConfigMap lands beside its Secret too: another kind, no source.
    targets.push(certs.clone());
    let first = ca(1);
    wait_config_maps(&t, (&targets, &certs), "site-tls", &[("ca.crt", &first)]).await;
    let status = t.wait_rule_ready(&op, "r").await;
    assert_eq!(
        status_u64(&status, "copies"),
        Some(TARGETS as u64 + 1),
        "{}",
        short_status(&status)
    );
    let (before, _) = restarts_of(&t, "Deployment", &targets[0], "web").await;
    // `where` finds the ConfigMaps of the Secret.
    let found = crate::whereabouts::copyrator_where(&[
        "--kind",
        "secret",
        &format!("{certs}/site-tls"),
        "--namespace",
        &op,
    ])
    .await;
    found.assert_exit(0);
    let line = format!("home: {}/site-tls in place (rule {op}/r)", targets[0]);
    assert!(
        found.stdout.lines().any(|l| l.starts_with(&line)),
        "no line {line:?} in\n{}",
        found.stdout
    );

    // A renewal (cert-manager rewrites the Secret) reaches every ConfigMap.
    let renewed = Instant::now();
    t.patch(
        SECRET,
        &certs,
        "site-tls",
        json!({"stringData": {"tls.crt": "CERT2", "ca.crt": ca(2)}}),
    )
    .await;
    let second = ca(2);
    wait_config_maps(&t, (&targets, &certs), "site-tls", &[("ca.crt", &second)]).await;
    println!(
        "the renewal reached {} ConfigMaps in {} ms",
        targets.len(),
        renewed.elapsed().as_millis()
    );
    wait_until("the Deployment mounting it rolled", TIMEOUT, async || {
        let (now, _) = restarts_of(&t, "Deployment", &targets[0], "web").await;
        match !now.is_empty() && now != before {
            true => Ok(()),
            false => Err(format!("{now:?}")),
        }
    })
    .await;
}

/// A key that looks like a private key travels only named exactly; a
/// value that is not text never: the source is refused, with why, and no
/// ConfigMap holds anything of it.
#[tokio::test]
async fn a_private_key_or_a_value_that_is_not_text_keeps_its_source_from_being_copied() {
    let t = TestNs::new("public-refused").await;
    let op = t.ns("op").await;
    let certs = t.ns("certs").await;
    let t1 = t.ns("t1").await;
    t.create_rule(
        &op,
        "globbed",
        public_half(&t, &certs, &["*"], json!({"name": {"suffix": "-all"}})),
    )
    .await;
    t.create_rule(
        &op,
        "binary",
        public_half(&t, &certs, &["*.der"], json!({"name": {"suffix": "-der"}})),
    )
    .await;
    t.create_json(SECRET, &certs, "site-tls", tls_secret(&t, 1))
        .await;
    t.create_json(
        SECRET,
        &certs,
        "der",
        json!({"metadata": {"labels": {TEST_LABEL: t.prefix}},
               "data": {"ca.der": b64(&[0x30, 0x82, 0xff, 0xfe])}}),
    )
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    let refused = |rule: &str, source: &str, reason: &str| {
        let (rule, source, reason) = (rule.to_owned(), source.to_owned(), reason.to_owned());
        move |r: &Value| -> Result<(), String> {
            let listed = r["status"]["refusedSources"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|e| e["name"] == source.as_str() && e["reason"] == reason.as_str())
            });
            match listed {
                true => Ok(()),
                false => Err(format!("{rule}: {}", short_status(r))),
            }
        }
    };
    t.wait_rule(
        &op,
        "globbed",
        "site-tls refused for its private key",
        refused(
            "globbed",
            "site-tls",
            "its key \"tls.key\" looks like a private key (its name ends in .key): a ConfigMap copy carries it only when transform.keys.include names it exactly",
        ),
    )
    .await;
    t.wait_rule(
        &op,
        "binary",
        "der refused for its binary value",
        refused(
            "binary",
            "der",
            "its key \"ca.der\" is not UTF-8 text, and a ConfigMap holds text (transform.toKind: ConfigMap)",
        ),
    )
    .await;
    // What the globbed rule may copy (a Secret without a private key) it
    // does: the refusal is the source's, not the rule's.
    t.create_json(
        SECRET,
        &certs,
        "plain",
        json!({"metadata": {"labels": {TEST_LABEL: t.prefix}}, "stringData": {"ca.crt": "CA"}}),
    )
    .await;
    let t1 = std::slice::from_ref(&t1);
    wait_config_maps(&t, (t1, &certs), "plain-all", &[("ca.crt", "CA")]).await;
    let (found, private) = config_maps(&t, t1, "site-tls-all", &certs)
        .await
        .expect("listed");
    assert!(
        found.is_empty() && !private,
        "the refused source was copied"
    );
    let (found, _) = config_maps(&t, t1, "der-der", &certs)
        .await
        .expect("listed");
    assert!(found.is_empty(), "the binary source was copied");
}

/// A Secret's CA reaches a member as a ConfigMap.
#[tokio::test]
async fn a_secrets_ca_reaches_a_member_as_a_config_map() {
    let t = TestNs::new("public-member").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    let mut spec = member_rule(&t, json!({"names": [a.name]}));
    spec["spec"]["ruleType"] = json!("secret");
    spec["spec"]["transform"] = json!({"toKind": "ConfigMap", "keys": {"include": ["ca.crt"]}});
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_json(SECRET, &op, "site-tls", tls_secret(&t, 1))
        .await;
    let want = map(&[("ca.crt", &ca(1))]);
    wait_until("the CA as a ConfigMap in member a", TIMEOUT, async || {
        let cm = Api::<ConfigMap>::namespaced(a.client.clone(), &a_t1)
            .get_opt("site-tls")
            .await
            .map_err(|e| err_msg(&e))?
            .ok_or("not there yet")?;
        match cm.data.clone().unwrap_or_default() == want {
            true => Ok(()),
            false => Err(format!("{:?}", cm.data)),
        }
    })
    .await;
    let secret = Api::<Secret>::namespaced(a.client.clone(), &a_t1)
        .get_opt("site-tls")
        .await
        .expect("read the member");
    assert!(secret.is_none(), "a Secret reached the member");
}

/// A tenant's rule makes ConfigMaps of its own Secret's CA under the same
/// consent as any copy: only in the namespaces that accept its namespace
/// (or grant its account the right to write there), written as its
/// ServiceAccount.
#[tokio::test]
async fn a_tenant_rule_makes_config_maps_only_where_accepted_and_as_its_account() {
    let t = TestNs::new("public-tenant").await;
    let op = t.ns("op").await;
    let team = t.ns("team").await;
    let (accepting, refusing) = (t.ns("t1").await, t.ns("t2").await);
    t.accept_from(&accepting, &team).await;
    // Its account may write in the accepting namespace alone: the other
    // neither accepts the team nor grants its account anything.
    copier_may_edit(&t, &team, &[&team, &accepting]).await;
    let rule = t.prefix.clone();
    t.create_rule(
        &team,
        &rule,
        public_half(&t, &team, &["ca.crt"], json!({"name": {"suffix": "-ca"}})),
    )
    .await;
    t.create_json(SECRET, &team, "site-tls", tls_secret(&t, 1))
        .await;
    let _operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    // Its own namespace (a target too) gets the ConfigMap beside the Secret.
    let accepted = [accepting.clone(), team.clone()];
    wait_config_maps(&t, (&accepted, &team), "site-tls-ca", &[("ca.crt", &ca(1))]).await;
    t.wait_rule(&team, &rule, "written as the team's account", |r| {
        match r["status"]["identity"] == format!("system:serviceaccount:{team}:copyrator")
            && status_u64(r, "copies") == Some(2)
        {
            true => Ok(()),
            false => Err(short_status(r)),
        }
    })
    .await;
    t.assert_absent(
        Kind::ConfigMap,
        &refusing,
        "site-tls-ca",
        "it does not accept the team",
    )
    .await;
}
