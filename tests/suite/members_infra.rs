//! The member clusters of the multi-cluster tests (`common::members`), as
//! `hack/test` starts them (`COPYRATOR_MEMBER=1 hack/cluster up`):
//!
//! * both answer, each is a cluster of its own (a namespace made in member
//!   a is seen neither in the home cluster nor in member b), and each runs
//!   a controller manager (ServiceAccounts appear, a namespace deleted goes);
//! * the kubeconfig Secret that registers a member in the home cluster
//!   holds a kubeconfig that reaches the member from its content alone;
//! * a member's API server stopped is unreachable while the other member
//!   answers, and started again answers with its data kept.

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams};

use crate::common::members::{self, KUBECONFIG_KEY, LABEL_CLUSTER, Member, OUTAGE};
use crate::common::*;

/// The server URL of a kubeconfig's first cluster.
fn server_of(yaml: &str) -> String {
    let config: serde_yaml::Value = serde_yaml::from_str(yaml).expect("a YAML kubeconfig");
    config["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("a server URL")
        .to_string()
}

/// The UID of `kube-system`: one per cluster, a cluster's identity.
async fn cluster_uid(client: &Client, which: &str) -> String {
    Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap_or_else(|e| panic!("{which}: reading kube-system: {}", err_msg(&e)))
        .metadata
        .uid
        .unwrap_or_else(|| panic!("{which}: kube-system has no UID"))
}

/// Whether the namespace `name` exists in the cluster of `client`.
async fn namespace_exists(client: &Client, name: &str) -> Result<bool, String> {
    Api::<Namespace>::all(client.clone())
        .get_opt(name)
        .await
        .map(|ns| ns.is_some())
        .map_err(|e| err_msg(&e))
}

async fn members_a_and_b() -> (Member, Member) {
    let all = members::members().await;
    let names: Vec<String> = all.iter().map(|m| m.name.clone()).collect();
    let pick = |name: &str| {
        all.iter()
            .find(|m| m.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("the members are {names:?}; these tests need a and b"))
    };
    (pick("a"), pick("b"))
}

#[tokio::test]
async fn members_answer_and_are_clusters_of_their_own() {
    let _up = OUTAGE.read().await;
    let (a, b) = members_a_and_b().await;
    let t = TestNs::new("members-distinct").await;
    a.answers().await.unwrap();
    b.answers().await.unwrap();

    // Three clusters, three identities and three API servers.
    let home_uid = cluster_uid(&t.client, "home").await;
    let a_uid = cluster_uid(&a.client, "member a").await;
    let b_uid = cluster_uid(&b.client, "member b").await;
    assert!(
        home_uid != a_uid && home_uid != b_uid && a_uid != b_uid,
        "kube-system UIDs: home {home_uid}, a {a_uid}, b {b_uid}"
    );
    let home_kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG is set");
    let home_server = server_of(&std::fs::read_to_string(&home_kubeconfig).unwrap());
    let (a_server, b_server) = (
        server_of(&a.kubeconfig_yaml()),
        server_of(&b.kubeconfig_yaml()),
    );
    for server in [&a_server, &b_server] {
        assert!(
            server.starts_with("https://127.0.0.1:"),
            "a member's server is {server}"
        );
    }
    assert!(
        home_server != a_server && home_server != b_server && a_server != b_server,
        "servers: home {home_server}, a {a_server}, b {b_server}"
    );

    // A namespace of member a is in member a only.
    let only_a = a.ns(&t, "only-a").await;
    assert_eq!(namespace_exists(&a.client, &only_a).await, Ok(true));
    assert_eq!(
        namespace_exists(&t.client, &only_a).await,
        Ok(false),
        "member a's namespace {only_a} is in the home cluster"
    );
    assert_eq!(
        namespace_exists(&b.client, &only_a).await,
        Ok(false),
        "member a's namespace {only_a} is in member b"
    );

    // Each member's controller manager works: the ServiceAccount
    // controller makes `default` in a new namespace, the namespace
    // controller finishes a deletion.
    for m in [&a, &b] {
        let ns = m.ns(&t, &format!("kcm-{}", m.name)).await;
        let accounts: Api<ServiceAccount> = Api::namespaced(m.client.clone(), &ns);
        wait_until(
            format!("the ServiceAccount default in {ns} of member {}", m.name),
            TIMEOUT,
            async || match accounts.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("not there".into()),
                Err(e) => Err(err_msg(&e)),
            },
        )
        .await;
        Api::<Namespace>::all(m.client.clone())
            .delete(&ns, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {ns} in member {}: {}", m.name, err_msg(&e)));
        wait_until(
            format!("the namespace {ns} of member {} to be gone", m.name),
            TIMEOUT,
            async || match namespace_exists(&m.client, &ns).await? {
                false => Ok(()),
                true => Err("still there".into()),
            },
        )
        .await;
    }
}

#[tokio::test]
async fn a_registered_members_secret_reaches_the_member() {
    let _up = OUTAGE.read().await;
    let (a, _) = members_a_and_b().await;
    let t = TestNs::new("members-register").await;
    let home_ns = t.ns("home").await;
    let in_a = a.ns(&t, "in-a").await;

    let yaml = a.kubeconfig_yaml();
    for by_path in [
        "certificate-authority:",
        "client-certificate:",
        "client-key:",
    ] {
        assert!(
            !yaml.contains(by_path),
            "the kubeconfig names a file ({by_path}):\n{yaml}"
        );
    }

    a.register(&t.client, &home_ns, &[("tier", "one")]).await;
    let secrets: Api<Secret> = Api::namespaced(t.client.clone(), &home_ns);
    let secret = secrets.get("cluster-a").await.unwrap();
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_CLUSTER).map(String::as_str), Some("a"));
    assert_eq!(labels.get("tier").map(String::as_str), Some("one"));
    let data = secret.data.clone().unwrap_or_default();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        vec![KUBECONFIG_KEY],
        "the Secret's data keys"
    );
    let stored = String::from_utf8(data[KUBECONFIG_KEY].0.clone()).expect("a UTF-8 kubeconfig");
    assert_eq!(stored, yaml);

    // From the Secret alone, a client of member a: it sees a's namespace.
    let via_secret = members::client_of_yaml(&stored).await.unwrap();
    assert_eq!(namespace_exists(&via_secret, &in_a).await, Ok(true));

    // Registered again: replaced, not added to.
    a.register(&t.client, &home_ns, &[("tier", "two")]).await;
    let secret = secrets.get("cluster-a").await.unwrap();
    let labels = secret.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels,
        map(&[(LABEL_CLUSTER, "a"), ("tier", "two")]),
        "the labels after a second register"
    );

    a.unregister(&t.client, &home_ns).await;
    assert!(secrets.get_opt("cluster-a").await.unwrap().is_none());
    // Unregistered twice is fine.
    a.unregister(&t.client, &home_ns).await;
}

#[tokio::test]
async fn a_members_api_server_stops_and_starts_again() {
    // No other test of this binary may need member a meanwhile.
    let _outage = OUTAGE.write().await;
    let (a, b) = members_a_and_b().await;
    let t = TestNs::new("members-outage").await;
    let kept = a.ns(&t, "kept").await;
    // Dropped before `t`: member a is up again for its cleanup.
    let _restart = a.start_api_server_on_drop();

    a.stop_api_server();
    wait_until("member a to be unreachable", TIMEOUT, async || {
        match a.answers().await {
            Ok(()) => Err("member a still answers".to_string()),
            Err(e) => Ok(e),
        }
    })
    .await;
    b.answers()
        .await
        .expect("member b answers while member a is down");
    members::answers(&t.client)
        .await
        .expect("the home cluster answers while member a is down");

    a.start_api_server();
    wait_until("member a to answer again", TIMEOUT, async || {
        a.answers().await
    })
    .await;
    // Its etcd kept running: the data is there.
    assert_eq!(
        namespace_exists(&a.client, &kept).await,
        Ok(true),
        "member a's namespace {kept} after the restart"
    );
}
