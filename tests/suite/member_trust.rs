//! Credentials go only where their owner sent them. Whoever may write
//! ClusterProfiles in the operator's namespace, but may not read its
//! Secrets, cannot have the operator send a member's token to a server of
//! their choosing: a profile's token Secret is tied to it by the Secret's
//! writer, never named by the profile, and a plain `http://` server is
//! refused unless the operator allows it. What a server of someone's
//! choosing answers on an error reaches no status, Event or log.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::members::{Member, OUTAGE, client_of_file, member};
use crate::common::rbac::{ClusterScoped, Grant, Identity};
use crate::common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CM: Kind = Kind::ConfigMap;
/// The member's probe asks every 5 s: a token sent at all would have been
/// sent within this, after the inventory was read.
const PROBE_ROUNDS: Duration = Duration::from_secs(12);
const CLUSTER_PROFILE_LABEL: &str = "copyrator.flant.com/cluster-profile";

fn profiles_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    )
}

async fn install_profile_crd(t: &TestNs) {
    let crd: Value = serde_yaml::from_str(include_str!(
        "../../crd/clusterprofile.multicluster.x-k8s.io.yaml"
    ))
    .expect("the ClusterProfile CRD");
    apply_crd(t.client.clone(), &crd, &profiles_resource()).await;
}

/// Creates the ClusterProfile `name` in `namespace` and sets its access
/// provider to `cluster`, with `client` (whoever writes the inventory).
async fn write_profile(client: &kube::Client, namespace: &str, name: &str, cluster: Value) {
    let profiles: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &profiles_resource());
    let profile: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name},
        "spec": {"displayName": name, "clusterManager": {"name": "tests"}},
    }))
    .expect("a ClusterProfile");
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap_or_else(|e| panic!("creating the ClusterProfile {name}: {}", err_msg(&e)));
    profiles
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"accessProviders": [
                {"name": "secretreader", "cluster": cluster}
            ]}})),
        )
        .await
        .unwrap_or_else(|e| panic!("the access provider of {name}: {}", err_msg(&e)));
}

/// The cluster of an access provider at `server` whose secret-reader
/// extension names the Secret `secret` (KEP-5339's `clusterName`).
fn naming_secret(server: &str, secret: &str) -> Value {
    json!({
        "server": server,
        "extensions": [{
            "name": "client.authentication.k8s.io/exec",
            "extension": {"clusterName": secret},
        }],
    })
}

/// A TCP listener on 127.0.0.1, standing for a server of someone's
/// choosing: it keeps what each connection it accepts sends first (a
/// request's head, or a TLS ClientHello), and answers each with `answer`,
/// if any, then closes it.
struct Listener {
    port: u16,
    heard: Arc<Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    async fn start(answer: Option<String>) -> Listener {
        let socket = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback listener");
        let port = socket.local_addr().expect("its address").port();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let answer: Option<Arc<str>> = answer.map(Arc::from);
        let log = heard.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = socket.accept().await {
                let at = {
                    let mut log = log.lock().unwrap();
                    log.push(Vec::new());
                    log.len() - 1
                };
                let (log, answer) = (log.clone(), answer.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buffer = [0_u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buffer))
                            .await
                        {
                            Ok(Ok(read)) if read > 0 => head.extend_from_slice(&buffer[..read]),
                            _ => break,
                        }
                    }
                    log.lock().unwrap()[at] = head;
                    if let Some(answer) = answer {
                        let _ = stream.write_all(answer.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        Listener { port, heard, task }
    }

    fn connections(&self) -> usize {
        self.heard.lock().unwrap().len()
    }

    /// What it received, said without the token: how many connections, and
    /// how many carried `token` as a bearer.
    fn told(&self, token: &str) -> String {
        let heard = self.heard.lock().unwrap();
        let bearer = format!("Bearer {token}");
        let carrying = heard
            .iter()
            .filter(|head| String::from_utf8_lossy(head).contains(&bearer))
            .count();
        let first_lines: Vec<String> = heard
            .iter()
            .filter_map(|head| {
                let text = String::from_utf8_lossy(head);
                text.lines()
                    .next()
                    .filter(|line| line.is_ascii())
                    .map(str::to_owned)
            })
            .collect();
        format!(
            "{} connections accepted on 127.0.0.1:{}, {carrying} of them carrying member a's token \
             as `Authorization: Bearer`; request lines: {first_lines:?}",
            heard.len(),
            self.port
        )
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The rule's `status.clusters` entry of a member.
fn cluster_entry<'a>(rule: &'a Value, name: &str) -> Option<&'a Value> {
    rule["status"]["clusters"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// What a member's ServiceAccount needs to keep ConfigMap copies there
/// (the operator runs with `--kinds configmap`).
fn member_grants() -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for verb in ["list", "watch"] {
        grants.insert(Grant::new("", "namespaces", verb));
    }
    for verb in ["get", "list", "watch", "create", "update", "delete"] {
        grants.insert(Grant::new("", "configmaps", verb));
    }
    grants
}

/// An account that may create ClusterProfiles and write their status in
/// `op`, and has no verb on Secrets (its ClusterRole objects go with the
/// first value): a client acting as it.
async fn profile_writer(t: &TestNs, op: &str) -> (ClusterScoped, kube::Client) {
    let home = ClusterScoped::new();
    let may_write_profiles = BTreeSet::from([
        Grant::new("multicluster.x-k8s.io", "clusterprofiles", "create"),
        Grant::new("multicluster.x-k8s.io", "clusterprofiles/status", "patch"),
    ]);
    let may_not = BTreeSet::from([
        Grant::new("", "secrets", "get"),
        Grant::new("", "secrets", "list"),
        Grant::new("", "secrets", "watch"),
    ]);
    let writer = Identity::create(
        t,
        &home,
        op,
        "profile-writer",
        &BTreeSet::new(),
        &may_write_profiles,
    )
    .await;
    writer
        .wait_effective(&t.client, op, &may_write_profiles, &may_not)
        .await;
    assert!(
        !writer
            .may(&t.client, &Grant::new("", "secrets", "get"), Some(op))
            .await
            .expect("a SubjectAccessReview"),
        "the profile writer may get Secrets in {op}"
    );
    let as_writer = client_of_file(Path::new(&writer.kubeconfig))
        .await
        .expect("a client as the profile writer");
    (home, as_writer)
}

/// A Secret's name ties it to no profile. The operator's namespace holds
/// a Secret that is no profile's but has a data key `token` (a bot's, say),
/// unlabelled. An account that may only create ClusterProfiles and write
/// their status names a profile as that Secret, with its access provider
/// at an `https://` listener of its choosing. The profile is unusable,
/// `TokenMissing`, its message saying how a Secret is tied, and the
/// listener never sees a connection.
#[tokio::test]
async fn a_secret_is_tied_to_no_cluster_profile_by_its_name() {
    let t = TestNs::new("member-trust-name").await;
    let op = t.ns("op").await;
    install_profile_crd(&t).await;
    let bot = t.name("bot");
    let bots_token = format!("ghp-{}", random5());
    let bot_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": bot, "namespace": op},
        "stringData": {"token": bots_token},
    }))
    .expect("a Secret");
    t.secrets(&op)
        .create(&PostParams::default(), &bot_secret)
        .await
        .expect("the bot's Secret");
    let (_home, as_writer) = profile_writer(&t, &op).await;
    let listener = Listener::start(None).await;
    write_profile(
        &as_writer,
        &op,
        &bot,
        json!({"server": format!("https://127.0.0.1:{}", listener.port)}),
    )
    .await;
    t.create_rule(
        &op,
        "r",
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/targets/clusters",
            json!({"names": [bot], "local": false}),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters", "--kinds", "configmap"]);
    let rule = t
        .wait_rule(&op, "r", "the profile listed as unusable", |rule| {
            let entry = cluster_entry(rule, &bot)
                .ok_or_else(|| format!("no entry for {bot}: {}", short_status(rule)))?;
            match entry["ready"] == false && entry["reason"] == "TokenMissing" {
                true => Ok(()),
                false => Err(format!("{entry}; {}", listener.told(&bots_token))),
            }
        })
        .await;
    let message = cluster_entry(&rule, &bot).expect("an entry")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains(&format!(
            "must be labelled {CLUSTER_PROFILE_LABEL}={bot} (a Secret's name ties it to nothing)"
        )),
        "{message}"
    );
    assert_for(
        "no connection to the profile's server",
        PROBE_ROUNDS,
        async || match listener.connections() {
            0 => Ok(()),
            _ => Err(format!(
                "the profile's server was reached: {}",
                listener.told(&bots_token)
            )),
        },
    )
    .await;
}

/// An account that may only create ClusterProfiles and write their status
/// in the operator's namespace, and may not read its Secrets, writes two
/// profiles whose access provider's `clusterName` names member a's token
/// Secret: one at a plain `http://` listener of its choosing, one at an
/// `https://` one. Neither profile is usable, each for its own reason, and
/// neither listener ever sees a connection; member a, whose owner tied its
/// Secret to its profile, is kept as before.
#[tokio::test]
async fn a_cluster_profile_cannot_send_another_members_token_to_a_server_of_its_choosing() {
    let t = TestNs::new("member-trust-profile").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let a: Member = member("a").await;
    let a_t1 = a.ns(&t, "t1").await;
    install_profile_crd(&t).await;

    // Member a, as its owner registers it: a ClusterProfile, and a Secret
    // tied to it by the label, holding a token of a ServiceAccount of a.
    let in_a = ClusterScoped::in_cluster_of(a.kubeconfig_path.clone());
    Identity::create_in_member(&t, &a, &in_a, &a_t1, "copyrator", &member_grants()).await;
    let token = a.token(&a_t1, "copyrator").await;
    let (server, ca) = a.server_and_ca();
    let owned = t.name("a");
    let token_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": owned, "namespace": op,
                     "labels": {CLUSTER_PROFILE_LABEL: owned}},
        "stringData": {"token": token},
    }))
    .expect("a Secret");
    t.secrets(&op)
        .create(&PostParams::default(), &token_secret)
        .await
        .expect("member a's token Secret");
    write_profile(
        &t.client,
        &op,
        &owned,
        json!({"server": server, "certificate-authority-data": ca}),
    )
    .await;

    let (_home, as_writer) = profile_writer(&t, &op).await;
    let refused = Api::<Secret>::namespaced(as_writer.clone(), &op)
        .get(&owned)
        .await
        .expect_err("the profile writer reads no Secret");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 403),
        "{}",
        err_msg(&refused)
    );

    // Its two profiles, each naming member a's token Secret.
    let plain = Listener::start(None).await;
    let tls = Listener::start(None).await;
    let over_http = t.name("http");
    let over_https = t.name("https");
    write_profile(
        &as_writer,
        &op,
        &over_http,
        naming_secret(&format!("http://127.0.0.1:{}", plain.port), &owned),
    )
    .await;
    write_profile(
        &as_writer,
        &op,
        &over_https,
        naming_secret(&format!("https://127.0.0.1:{}", tls.port), &owned),
    )
    .await;

    t.create_rule(
        &op,
        "r",
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/targets/clusters",
            json!({"names": [owned, over_http, over_https], "local": false}),
        ),
    )
    .await;
    t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    let _operator = Operator::start(&t, &op, &["--member-clusters", "--kinds", "configmap"]);

    let no_connection = || {
        for (profile, listener) in [(&over_http, &plain), (&over_https, &tls)] {
            assert_eq!(
                listener.connections(),
                0,
                "the server of profile {profile} was reached: {}",
                listener.told(&token)
            );
        }
    };
    let rule = t
        .wait_rule(
            &op,
            "r",
            "each profile's member listed as it stands",
            |rule| {
                no_connection();
                let entry = |name: &str| {
                    cluster_entry(rule, name)
                        .cloned()
                        .ok_or_else(|| format!("no entry for {name}: {}", short_status(rule)))
                };
                let (owned, http, https) =
                    (entry(&owned)?, entry(&over_http)?, entry(&over_https)?);
                let wanted = [
                    (&owned, true, "Synced"),
                    (&http, false, "InsecureConnection"),
                    (&https, false, "TokenMissing"),
                ];
                for (entry, ready, reason) in wanted {
                    if entry["ready"] != ready || entry["reason"] != reason {
                        return Err(format!("{entry}"));
                    }
                }
                Ok(())
            },
        )
        .await;
    let message = |name: &str| {
        cluster_entry(&rule, name).expect("an entry")["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let refused_http = message(&over_http);
    assert!(
        refused_http.contains("http://") && refused_http.contains("--allow-insecure-members"),
        "{refused_http}"
    );
    // The message names the Secret that would be the profile's, and says
    // the name the profile gave is not read.
    let untied = message(&over_https);
    for said in [
        format!("{over_https:?}"),
        format!("{CLUSTER_PROFILE_LABEL}={over_https}"),
        format!("clusterName {owned:?}"),
        "is not read".to_owned(),
    ] {
        assert!(untied.contains(&said), "{said}: {untied}");
    }
    let copy = a.try_get(CM, &a_t1, "cfg").await.expect("reading member a");
    assert!(copy.is_some(), "member a keeps its copy");

    // Some rounds of the probe later, still no connection.
    tokio::time::sleep(PROBE_ROUNDS).await;
    no_connection();
}

/// A kubeconfig Secret names a plain `http://` server, and the operator
/// allows it (`--allow-insecure-members`): the server answers every
/// request with a 500 page. The rule's status and Events say the member
/// does not answer, with the status code, and no word of the page reaches
/// them or the log.
#[tokio::test]
async fn a_members_error_page_reaches_no_status_event_or_log() {
    let t = TestNs::new("member-trust-page").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let a: Member = member("a").await;
    let secret = format!("db-password-{}", random5());
    let page =
        format!("<html><head><title>Internal admin</title></head><body>{secret}</body></html>");
    let answer = format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{page}",
        page.len()
    );
    let listener = Listener::start(Some(answer)).await;
    let mut page_member = a.clone();
    page_member.name = "page".into();
    let kubeconfig = a.kubeconfig_with(
        &format!("http://127.0.0.1:{}", listener.port),
        "not-a-member-token",
    );
    t.create_rule(
        &op,
        "r",
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/targets/clusters",
            json!({"names": ["page"], "local": false}),
        ),
    )
    .await;
    let operator = Operator::start(&t, &op, &["--member-clusters", "--allow-insecure-members"]);
    // The member joins once the rule is known: the Event of its first
    // failure goes to the rules that name it then.
    t.wait_rule_observed(&op, "r", "a first status").await;
    page_member
        .register_kubeconfig(&t.client, &op, &[], &kubeconfig)
        .await;

    let rule = t
        .wait_rule(&op, "r", "member page listed as not answering", |rule| {
            let entry = cluster_entry(rule, "page").ok_or_else(|| short_status(rule))?;
            match entry["ready"] == false && entry["reason"] == "ClusterUnreachable" {
                true => Ok(()),
                false => Err(format!("{entry}")),
            }
        })
        .await;
    assert!(
        listener.connections() > 0,
        "the member's server was never asked: the test proves nothing"
    );
    let said = cluster_entry(&rule, "page").expect("an entry")["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        said.contains("HTTP 500") && said.contains("BodyWithheld"),
        "the status code is said: {said}"
    );
    for word in [secret.as_str(), "Internal admin", "<html"] {
        assert!(!said.contains(word), "the page reached the status: {said}");
    }

    let events = wait_until(
        "a ClusterUnreachable Event on the rule",
        TIMEOUT,
        async || {
            let events = t.events_regarding(&op, "r").await;
            match events
                .iter()
                .any(|e| e.reason.as_deref() == Some("ClusterUnreachable"))
            {
                true => Ok(events),
                false => Err(format!("{} Events, none ClusterUnreachable", events.len())),
            }
        },
    )
    .await;
    for event in &events {
        let note = event.note.as_deref().unwrap_or_default();
        assert!(!note.contains(&secret), "the page reached an Event: {note}");
    }
    let unreachable = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("ClusterUnreachable"))
        .and_then(|e| e.note.as_deref())
        .unwrap_or_default();
    assert!(unreachable.contains("HTTP 500"), "{unreachable}");

    // The member's watches asked too, and failed: give their failures time
    // to be logged before reading the log.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = operator.logs();
    assert!(
        log.contains("member cluster unreachable"),
        "the log says nothing of the member: the test proves nothing"
    );
    assert!(
        !log.contains(&secret) && !log.contains("Internal admin"),
        "the page reached the log"
    );
}
