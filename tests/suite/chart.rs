//! The Helm chart: its RBAC is enough for the whole job (the operator runs
//! as the chart's ServiceAccount against the real API server), every verb
//! it grants is needed (the job runs once per verb, with that verb removed,
//! and fails where that verb is used), it follows the `kinds` value (an
//! operator limited to ConfigMaps gets, and uses, no verb on Secrets), and
//! install, upgrade and uninstall work.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::audit::{Audit, AuditEvent, Query, WRITE_VERBS, service_account_user};
use crate::common::helm::{
    Release, chart_dir, create_chart_policy, find, find_named, helm, render, render_hooks, run,
};
use crate::common::prometheus::wait_copy_protection;
use crate::common::rbac::{CASES_AT_ONCE, ClusterScoped, Grant, Identity, grants_of, run_cases};
use crate::common::steps::{Steps, Stopped};
use crate::common::*;
use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::{Value, json};
const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

#[test]
fn deployment_runs_locked_down_with_probes() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert_eq!(
        container["image"], "copyrator:0.1.0",
        "the tag defaults to appVersion"
    );
    let env = container["env"].as_array().expect("env");
    let namespace = env
        .iter()
        .find(|e| e["name"] == "NAMESPACE")
        .expect("NAMESPACE env");
    assert_eq!(
        namespace["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let leader = env
        .iter()
        .find(|e| e["name"] == "LEADER_ELECTION")
        .expect("LEADER_ELECTION env");
    assert_eq!(
        leader["value"], "true",
        "leader election is on by default in the chart"
    );
}

/// The value of an env var of the rendered Deployment's container.
fn deployment_env(docs: &[Value], name: &str) -> String {
    find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("the Deployment sets no {name}"))
        .to_string()
}

/// The operator's ClusterRole's and Role's grants together (not those of
/// the ClusterRoles it makes for others to bind: for scrapers of /metrics,
/// for a namespace that lets it impersonate, for namespace admins).
/// `copyProtection.mode` chooses the binding's action, or (Off) no policy;
/// writes for rules acting as ServiceAccounts carry the acting-for extra,
/// and the operator is granted it, only where protection is on and some
/// rules act so.
#[test]
fn rendered_copy_protection_follows_its_mode() {
    const NAME: &str = "copyrator-copies-read-only";
    let named = |docs: &[Value], name: &str| docs.iter().any(|d| d["metadata"]["name"] == name);
    for mode in ["Deny", "Warn", "Audit"] {
        let docs = render(&["--set", &format!("copyProtection.mode={mode}")]);
        let binding = find_named(&docs, "ValidatingAdmissionPolicyBinding", NAME);
        assert_eq!(binding["spec"]["validationActions"], json!([mode]));
        assert_eq!(binding["spec"]["policyName"], NAME);
        // Copies alone (by their mark, not handed over), in every
        // namespace by default.
        assert_eq!(
            binding["spec"]["matchResources"],
            json!({"objectSelector": {"matchExpressions": [
                {"key": "copyrator.flant.com/rule-uid", "operator": "Exists"},
                {"key": "copyrator.flant.com/sync-policy", "operator": "NotIn",
                 "values": ["CreateOnly"]}]}})
        );
    }
    let docs = render(&["--set", "kinds={configmap}"]);
    let policy = find_named(&docs, "ValidatingAdmissionPolicy", NAME);
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE", "DELETE"], "resources": ["configmaps"]}]),
        "the kinds the operator copies"
    );
    // One condition, whose first test is the user name: what Copyrator's
    // own writes stop at.
    let conditions = policy["spec"]["matchConditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    let exempt = conditions[0]["expression"].as_str().unwrap_or_default();
    assert!(
        exempt.starts_with(
            "!(request.userInfo.username in [\"system:serviceaccount:copyrator:copyrator\",\
             \"system:serviceaccount:kube-system:namespace-controller\",\
             \"system:serviceaccount:kube-system:generic-garbage-collector\",\
             \"system:kube-controller-manager\"])"
        ),
        "exact names: {exempt}"
    );
    assert_eq!(deployment_env(&docs, "ACTING_FOR_EXTRA"), "false");
    assert!(
        !named(&docs, "copyrator-acting-for"),
        "no rule acts as an account"
    );
    // The operator follows the policy and binding, reading them by name.
    assert_eq!(deployment_env(&docs, "COPY_PROTECTION"), NAME);
    let reads_by_name = json!([{"apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        "resourceNames": [NAME], "verbs": ["list", "watch"]}]);
    assert_eq!(
        find_named(&docs, "ClusterRole", "copyrator-copy-protection")["rules"],
        reads_by_name
    );
    // And, with members, each member's, under the member side's name.
    let members = render(&["--set", "memberClusters.enabled=true"]);
    assert_eq!(
        deployment_env(&members, "MEMBER_COPY_PROTECTION"),
        "copyrator-member-copies-read-only"
    );

    let tenants = render(&["--set", "operator.allNamespaces=true"]);
    assert_eq!(deployment_env(&tenants, "ACTING_FOR_EXTRA"), "true");
    assert_eq!(
        find_named(&tenants, "ClusterRole", "copyrator-acting-for")["rules"],
        json!([{"apiGroups": ["authentication.k8s.io"],
                "resources": ["userextras/copyrator.flant.com/acting-for"],
                "resourceNames": ["copyrator"], "verbs": ["impersonate"]}])
    );
    assert_eq!(
        find_named(&tenants, "ClusterRoleBinding", "copyrator-acting-for")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "copyrator", "namespace": "copyrator"}])
    );
    let off = render(&[
        "--set",
        "operator.allNamespaces=true",
        "--set",
        "copyProtection.mode=Off",
    ]);
    assert!(!named(&off, NAME) && !named(&off, "copyrator-acting-for"));
    assert_eq!(deployment_env(&off, "ACTING_FOR_EXTRA"), "false");
    // The member side protects the copies in its member, where the
    // operator writes as the member side's account.
    let member = render(&["--set", "memberSide.enabled=true"]);
    let exempt = find_named(&member, "ValidatingAdmissionPolicy", NAME)["spec"]["matchConditions"]
        [0]["expression"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        exempt.contains("\"system:serviceaccount:copyrator:copyrator\""),
        "{exempt}"
    );
    assert!(named(&member, "copyrator-acting-for"));
    // Whose account the home operator reads it with, by name.
    assert_eq!(
        find_named(&member, "ClusterRole", "copyrator-copy-protection")["rules"],
        reads_by_name
    );
    assert_eq!(
        find_named(&member, "ClusterRoleBinding", "copyrator-copy-protection")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "copyrator", "namespace": "copyrator"}])
    );
}

/// `memberClusters.credentialPlugins`: the providers become the ConfigMap
/// the operator reads as its provider file (mounted read-only where
/// CLUSTERPROFILE_PROVIDER_FILE says), the plugin image is mounted by an
/// init container's copy or as an image volume, and a federated token is
/// projected with its audience; none of it without providers or members.
#[test]
fn rendered_credential_plugins_follow_their_values() {
    let providers = r#"[{"name":"eks","execConfig":{"apiVersion":"client.authentication.k8s.io/v1","command":"/plugins/eks"}}]"#;
    let providers_value = format!("memberClusters.credentialPlugins.providers={providers}");
    let pod = |docs: &[Value]| find(docs, "Deployment")["spec"]["template"]["spec"].clone();
    let mounts = |pod: &Value| -> BTreeMap<String, Value> {
        pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| (m["name"].as_str().unwrap_or_default().to_owned(), m.clone()))
            .collect()
    };
    let volume = |pod: &Value, name: &str| {
        pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no volume {name}: {}", pod["volumes"]))
    };
    for off in [
        vec!["--set", "memberClusters.enabled=true"],
        vec!["--set-json", providers_value.as_str()],
    ] {
        let docs = render(&off);
        assert!(
            docs.iter()
                .all(|d| d["metadata"]["name"] != "copyrator-providers"),
            "{off:?}"
        );
        assert!(pod(&docs)["volumes"].is_null(), "{off:?}");
    }

    let docs = render(&[
        "--set",
        "memberClusters.enabled=true",
        "--set-json",
        &providers_value,
    ]);
    let file = find_named(&docs, "ConfigMap", "copyrator-providers")["data"]["providers.json"]
        .as_str()
        .map(|text| serde_json::from_str::<Value>(text).expect("JSON"));
    assert_eq!(
        file,
        Some(json!({"providers": serde_json::from_str::<Value>(providers).expect("JSON")}))
    );
    let path = deployment_env(&docs, "CLUSTERPROFILE_PROVIDER_FILE");
    let pod_spec = pod(&docs);
    let mount = &mounts(&pod_spec)["providers"];
    assert!(
        path.starts_with(mount["mountPath"].as_str().unwrap_or("?")),
        "{path}"
    );
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        volume(&pod_spec, "providers")["configMap"]["name"],
        "copyrator-providers"
    );
    assert!(pod_spec["initContainers"].is_null(), "no image, no copy");

    let with_image = |mount: &str| {
        pod(&render(&[
            "--set",
            "memberClusters.enabled=true",
            "--set-json",
            &providers_value,
            "--set",
            "memberClusters.credentialPlugins.image.repository=registry.example/plugins",
            "--set-string",
            "memberClusters.credentialPlugins.image.tag=1.2",
            "--set",
            &format!("memberClusters.credentialPlugins.image.mount={mount}"),
            "--set",
            "memberClusters.credentialPlugins.federatedToken.audience=members.example",
            "--set",
            "memberClusters.credentialPlugins.allowKubeconfigPlugins=true",
        ]))
    };
    let copied = with_image("initContainer");
    let init = &copied["initContainers"][0];
    assert_eq!(init["image"], "registry.example/plugins:1.2");
    assert_eq!(
        init["command"],
        json!(["cp", "-R", "/plugins/.", "/copied/"])
    );
    assert_eq!(volume(&copied, "plugins")["emptyDir"], json!({}));
    assert_eq!(mounts(&copied)["plugins"]["readOnly"], true);
    let token = volume(&copied, "federated-token");
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "members.example"
    );
    assert_eq!(
        mounts(&copied)["federated-token"]["mountPath"],
        "/var/run/secrets/copyrator/federated"
    );
    let image_volume = with_image("imageVolume");
    assert!(image_volume["initContainers"].is_null());
    assert_eq!(
        volume(&image_volume, "plugins")["image"]["reference"],
        "registry.example/plugins:1.2"
    );
    let docs = render(&[
        "--set",
        "memberClusters.enabled=true",
        "--set-json",
        &providers_value,
        "--set",
        "memberClusters.credentialPlugins.allowKubeconfigPlugins=true",
    ]);
    assert_eq!(deployment_env(&docs, "ALLOW_KUBECONFIG_PLUGINS"), "true");
}

/// The chart values that docs/clusters.md shows for credential plugins
/// render: the schema takes them, and the provider file holds each
/// provider with an absolute command.
#[test]
fn the_documented_credential_plugin_values_render() {
    let page = include_str!("../../docs/clusters.md");
    let blocks: Vec<&str> = page
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .filter(|block| block.starts_with("memberClusters:") && block.contains("credentialPlugins"))
        .collect();
    assert_eq!(blocks.len(), 2, "the EKS and the federated-token examples");
    for (i, block) in blocks.iter().enumerate() {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("documented-plugins-{i}.yaml"));
        std::fs::write(&path, block).expect("the values file");
        let docs = render(&["-f", &path.to_string_lossy()]);
        let file = find_named(&docs, "ConfigMap", "copyrator-providers")["data"]["providers.json"]
            .as_str()
            .map(|text| serde_json::from_str::<Value>(text).expect("JSON"))
            .expect("the provider file");
        let providers = file["providers"].as_array().cloned().unwrap_or_default();
        assert!(!providers.is_empty(), "{block}");
        for provider in providers {
            let command = provider["execConfig"]["command"]
                .as_str()
                .unwrap_or_default();
            assert!(command.starts_with('/'), "{provider}");
        }
        assert_eq!(
            deployment_env(&docs, "CLUSTERPROFILE_PROVIDER_FILE"),
            "/etc/copyrator/providers/providers.json"
        );
    }
}

fn all_grants(docs: &[Value]) -> BTreeSet<Grant> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .filter(|d| {
            !d["metadata"]["name"].as_str().is_some_and(|n| {
                ["-metrics-reader", "-impersonate", "-rules-edit"]
                    .iter()
                    .any(|suffix| n.ends_with(suffix))
            })
        })
        .flat_map(grants_of)
        .collect()
}

/// RBAC follows the values: no wildcard; verbs on a kind only when the
/// kind is enabled (the same verbs as when both are); no Role without
/// leader election. The verbs themselves are proved needed, one by one, by
/// [`each_verb_the_chart_grants_is_needed`].
#[test]
fn rendered_rbac_follows_kinds_and_leader_election() {
    let docs = render(&[]);
    let all = all_grants(&docs);
    let wildcards: Vec<String> = all
        .iter()
        .filter(|g| g.has_wildcard())
        .map(ToString::to_string)
        .collect();
    assert!(wildcards.is_empty(), "wildcards granted: {wildcards:?}");
    assert_eq!(deployment_env(&docs, "KINDS"), "configmap,secret");
    let verbs_on = |grants: &BTreeSet<Grant>, resource: &str| -> BTreeSet<String> {
        grants
            .iter()
            .filter(|g| g.group.is_empty() && g.resource == resource)
            .map(|g| g.verb.clone())
            .collect()
    };
    let on_configmaps = verbs_on(&all, "configmaps");
    assert!(!on_configmaps.is_empty(), "no verb on configmaps: {all:?}");
    assert_eq!(
        verbs_on(&all, "secrets"),
        on_configmaps,
        "both kinds are copied alike"
    );
    let role = find(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "copyrator");
    assert!(
        grants_of(role).iter().all(|g| g.resource == "leases"),
        "the Role is for the Lease only (the ClusterRole's verbs on Secrets reach the mark key): {role}"
    );
    // Without verbs on Secrets, the Role grants the mark key's: its get,
    // update (the proof) and delete (a key it did not make) by name, and
    // create.
    let docs = render(&["--set", "kinds={configmap}"]);
    let own = grants_of(find(&docs, "Role"));
    assert!(
        mark_key_grants(&docs).is_subset(&own),
        "{own:?} lacks {:?}",
        mark_key_grants(&docs)
    );

    for (kinds, enabled, disabled) in [
        ("kinds={configmap}", "configmaps", "secrets"),
        ("kinds={secret}", "secrets", "configmaps"),
    ] {
        let docs = render(&["--set", kinds]);
        let grants = all_grants(&docs);
        let leaked: Vec<String> = grants
            .iter()
            .filter(|g| g.base_resource() == disabled && !mark_key_grants(&docs).contains(g))
            .map(ToString::to_string)
            .collect();
        assert!(
            leaked.is_empty(),
            "with {kinds} the chart still grants {leaked:?}"
        );
        assert_eq!(verbs_on(&grants, enabled), on_configmaps, "with {kinds}");
        assert_eq!(
            deployment_env(&docs, "KINDS"),
            kinds.trim_start_matches("kinds={").trim_end_matches('}')
        );
    }

    // A release upgraded with --reuse-values from a chart that had no
    // `kinds` value has none: it keeps copying both kinds.
    let docs = render(&["--set", "kinds=null"]);
    assert_eq!(all_grants(&docs), all);
    assert_eq!(deployment_env(&docs, "KINDS"), "configmap,secret");

    // Without leader election there is no Lease to grant.
    let docs = render(&["--set", "leaderElection.enabled=false"]);
    assert!(docs.iter().all(|d| d["kind"] != "Role"));
    let docs = render(&[
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "kinds={configmap}",
    ]);
    assert_eq!(grants_of(find(&docs, "Role")), mark_key_grants(&docs));
}

/// What the operator needs of its mark key Secret (named as the chart's
/// Deployment says), for a release whose ClusterRole grants nothing on
/// Secrets.
fn mark_key_grants(docs: &[Value]) -> BTreeSet<Grant> {
    let name = deployment_env(docs, "MARK_KEY_SECRET");
    BTreeSet::from([
        Grant::named("", "secrets", "get", &name),
        Grant::named("", "secrets", "update", &name),
        Grant::named("", "secrets", "delete", &name),
        Grant::new("", "secrets", "create"),
    ])
}

/// The uninstall hook: a pre-delete Job of the operator's image runs
/// `copyrator release` as the operator's ServiceAccount, stopping the
/// operator's Deployment first; its Role grants that Deployment (by name)
/// and listing Pods, nothing else. `uninstall.copies` reaches the command;
/// `uninstall.release: false` renders no hook. What the Job does is proved
/// on a node by `make e2e`, and `copyrator release` itself by
/// tests/suite/deletion_policy.rs.
#[test]
fn the_uninstall_hook_releases_the_rules_with_least_privilege() {
    let hooks = render_hooks(&[]);
    let job = find(&hooks, "Job");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "copyrator");
    assert_eq!(
        pod["containers"][0]["args"],
        json!(["release", "--copies=keep", "--stop-deployment=copyrator"])
    );
    let deployment = render(&[]);
    assert_eq!(
        pod["containers"][0]["image"],
        find(&deployment, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"],
        "the operator's own image"
    );
    let role = find(&hooks, "Role");
    assert_eq!(
        grants_of(role),
        [
            Grant::named("apps", "deployments", "get", "copyrator"),
            Grant::named("apps", "deployments", "patch", "copyrator"),
            Grant::new("", "pods", "list"),
        ]
        .into_iter()
        .collect::<BTreeSet<_>>()
    );
    assert_eq!(role["rules"][0]["resourceNames"], json!(["copyrator"]));
    let binding = find(&hooks, "RoleBinding");
    assert_eq!(binding["subjects"][0]["name"], "copyrator");
    // Hooks come before the release goes: the Role and its binding first.
    let weight = |doc: &Value| -> i64 {
        doc["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .expect("a hook weight")
    };
    assert!(weight(role) < weight(job) && weight(binding) < weight(job));

    let deleting = render_hooks(&["--set", "uninstall.copies=delete"]);
    assert_eq!(
        find(&deleting, "Job")["spec"]["template"]["spec"]["containers"][0]["args"][1],
        "--copies=delete"
    );
    // An older release upgraded with --reuse-values has no `uninstall`: the hook runs, keeping copies.
    let reused = render_hooks(&["--set", "uninstall=null"]);
    assert_eq!(
        find(&reused, "Job")["spec"]["template"]["spec"]["containers"][0]["args"][1],
        "--copies=keep"
    );
    let off = render_hooks(&["--set", "uninstall.release=false"]);
    assert!(
        off.iter()
            .all(|d| d["kind"] != "Job" && d["kind"] != "Role"),
        "{off:?}"
    );
}

/// `rollout.restartConsumers` adds list and patch on the three workload
/// kinds of `apps`, to the operator's ClusterRole and to the member side's,
/// and nothing else; off by default, and off for a release upgraded with
/// --reuse-values from a chart without the value.
#[test]
fn rendered_rbac_follows_restart_consumers() {
    let apps = |docs: &[Value]| -> BTreeSet<Grant> {
        all_grants(docs)
            .into_iter()
            .filter(|g| g.group == "apps")
            .collect()
    };
    let want: BTreeSet<Grant> = ["deployments", "statefulsets", "daemonsets"]
        .into_iter()
        .flat_map(|r| ["list", "patch"].map(|v| Grant::new("apps", r, v)))
        .collect();
    for side in [&[][..], &["--set", "memberSide.enabled=true"][..]] {
        let off = render(side);
        assert!(apps(&off).is_empty(), "{side:?}: granted by default");
        let on_args: Vec<&str> = side
            .iter()
            .copied()
            .chain(["--set", "rollout.restartConsumers=true"])
            .collect();
        let on = render(&on_args);
        assert_eq!(apps(&on), want, "{side:?}");
        let others = |docs: &[Value]| -> BTreeSet<Grant> {
            all_grants(docs)
                .into_iter()
                .filter(|g| g.group != "apps")
                .collect()
        };
        assert_eq!(others(&on), others(&off), "{side:?}: nothing else changes");
        let reused: Vec<&str> = side
            .iter()
            .copied()
            .chain(["--set", "rollout=null"])
            .collect();
        assert!(apps(&render(&reused)).is_empty());
    }
}

/// `operator.tenantIdentity=serviceAccount` sets TENANT_IDENTITY, grants
/// creating SubjectAccessReviews, getting ServiceAccounts and listing and
/// watching RBAC and nothing else, and makes a ClusterRole that allows impersonating only the named
/// ServiceAccounts, bound by the chart only under
/// `impersonation.scope=clusterWide`. `rbac.writeCopies=false` leaves the
/// operator no write verb on any copied kind (the mark key then by name in
/// its namespace); `operator.allNamespaces` lets namespace admins and
/// editors manage rules, not their status.
#[test]
fn rendered_rbac_follows_tenant_identity() {
    let named = |docs: &[Value], kind: &str, suffix: &str| -> Option<Value> {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with(suffix))
            })
            .cloned()
    };
    // One namespace's rules only: no tenant rule, nothing to grant.
    let home_only = render(&[]);
    assert_eq!(
        deployment_env(&home_only, "TENANT_IDENTITY"),
        "service-account"
    );
    assert!(named(&home_only, "ClusterRole", "-impersonate").is_none());
    let off = render(&[
        "--set",
        "operator.allNamespaces=true",
        "--set",
        "operator.tenantIdentity=operator",
    ]);
    assert_eq!(deployment_env(&off, "TENANT_IDENTITY"), "operator");
    assert!(named(&off, "ClusterRole", "-impersonate").is_none());
    assert_eq!(all_grants(&home_only), all_grants(&off));
    // The default: tenant rules write as their ServiceAccounts.
    let tenants = [
        "--set",
        "operator.allNamespaces=true",
        "--set",
        "impersonation.serviceAccountNames={writer}",
    ];
    let on = render(&tenants);
    assert_eq!(deployment_env(&on, "TENANT_IDENTITY"), "service-account");
    assert_eq!(deployment_env(&on, "DEFAULT_SERVICE_ACCOUNT"), "copyrator");
    let added: BTreeSet<Grant> = all_grants(&on)
        .difference(&all_grants(&off))
        .cloned()
        .collect();
    let mut want: BTreeSet<Grant> = [
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
    ]
    .into_iter()
    .flat_map(|r| ["list", "watch"].map(|v| Grant::new("rbac.authorization.k8s.io", r, v)))
    .collect();
    want.insert(Grant::new(
        "authorization.k8s.io",
        "subjectaccessreviews",
        "create",
    ));
    want.insert(Grant::new("", "serviceaccounts", "get"));
    // Their writes say the operator acts for them (copy protection is on
    // by default).
    want.insert(Grant::named(
        "authentication.k8s.io",
        "userextras/copyrator.flant.com/acting-for",
        "impersonate",
        "copyrator",
    ));
    assert_eq!(added, want);
    let impersonate = named(&on, "ClusterRole", "-impersonate").expect("the impersonation role");
    assert_eq!(
        impersonate["rules"],
        json!([{"apiGroups": [""], "resources": ["serviceaccounts"],
                "resourceNames": ["copyrator", "writer"], "verbs": ["impersonate"]}])
    );
    assert!(
        named(&on, "ClusterRoleBinding", "-impersonate").is_none(),
        "bound only where a namespace opts in"
    );
    let everywhere: Vec<&str> = tenants
        .iter()
        .copied()
        .chain(["--set", "impersonation.scope=clusterWide"])
        .collect();
    let bound = named(&render(&everywhere), "ClusterRoleBinding", "-impersonate")
        .expect("bound everywhere");
    assert_eq!(bound["roleRef"]["name"], impersonate["metadata"]["name"]);

    // Cluster-wide it reads copies only; in its own namespace it makes and
    // keeps its mark key alone.
    let read_only = render(&["--set", "rbac.writeCopies=false"]);
    for grant in grants_of(find(&read_only, "ClusterRole")) {
        if grant.group.is_empty() && ["configmaps", "secrets"].contains(&grant.base_resource()) {
            assert!(
                ["get", "list", "watch"].contains(&grant.verb.as_str()),
                "the operator writes copies itself: {grant}"
            );
        }
    }
    assert!(
        mark_key_grants(&read_only).is_subset(&all_grants(&read_only)),
        "the mark key"
    );

    let tenants_rules = render(&["--set", "operator.allNamespaces=true"]);
    let edit = named(&tenants_rules, "ClusterRole", "-rules-edit").expect("aggregated");
    for role in ["admin", "edit"] {
        assert_eq!(
            edit["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")],
            "true"
        );
    }
    assert!(
        grants_of(&edit).iter().all(|g| g.resource == "copyrators"),
        "only the rules, never their status: {:?}",
        grants_of(&edit)
    );
    assert!(named(&home_only, "ClusterRole", "-rules-edit").is_none());
}

/// `metrics.authentication` sets METRICS_AUTH, grants creating
/// TokenReviews and SubjectAccessReviews and nothing else, makes a
/// ClusterRole that may get /metrics, and has the ServiceMonitor send its
/// token; off (the default) it does none of this.
#[test]
fn rendered_metrics_authentication() {
    let reviews = BTreeSet::from([
        Grant::new("authentication.k8s.io", "tokenreviews", "create"),
        Grant::new("authorization.k8s.io", "subjectaccessreviews", "create"),
    ]);
    let off = render(&["--set", "serviceMonitor.enabled=true"]);
    let on = render(&[
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "metrics.authentication=true",
    ]);
    let env = |docs: &[Value]| {
        find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == "METRICS_AUTH"))
            .map(|e| e["value"].clone())
    };
    assert_eq!(env(&off), None);
    assert_eq!(env(&on), Some(Value::from("true")));
    let added: BTreeSet<Grant> = all_grants(&on)
        .difference(&all_grants(&off))
        .cloned()
        .collect();
    assert_eq!(added, reviews);
    let reader = |docs: &[Value]| {
        docs.iter()
            .find(|d| {
                d["kind"] == "ClusterRole"
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-metrics-reader"))
            })
            .cloned()
    };
    assert!(reader(&off).is_none());
    let reader = reader(&on).expect("the metrics-reader ClusterRole");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let token_file = |docs: &[Value]| {
        docs.iter()
            .find(|d| d["kind"] == "ServiceMonitor")
            .map(|d| d["spec"]["endpoints"][0]["bearerTokenFile"].clone())
    };
    assert_eq!(token_file(&off), Some(Value::Null));
    assert_eq!(
        token_file(&on),
        Some(Value::from(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        ))
    );
}

/// `extraKinds` adds each kind to KINDS (`Kind.group`, a bare `Kind` for
/// the core group) and the verbs ConfigMaps get on its resource, nothing else (but
/// list and watch on roles with RoleBindings, judged by the Roles they
/// bind);
/// `rbacCopy` grants `bind` / `escalate` on roles and clusterroles only when
/// asked; `operator.deniedKinds` is DENIED_KINDS. By default none of these
/// adds a grant, so [`each_verb_the_chart_grants_is_needed`] still covers
/// every one.
#[test]
fn rendered_rbac_follows_extra_kinds_and_rbac_copy() {
    let defaults = render(&[]);
    let base = all_grants(&defaults);
    // One default deny-list: the chart's is the binary's own.
    assert_eq!(
        deployment_env(&defaults, "DENIED_KINDS"),
        copyrator::api::kinds::DENIED_KINDS
    );
    assert!(
        !base
            .iter()
            .any(|g| g.verb == "bind" || g.verb == "escalate"),
        "bind or escalate granted by default: {base:?}"
    );

    let docs = render(&[
        "--set",
        "extraKinds[0].apiGroup=rbac.authorization.k8s.io",
        "--set",
        "extraKinds[0].kind=RoleBinding",
        "--set",
        "extraKinds[0].resource=rolebindings",
        "--set-string",
        "extraKinds[1].apiGroup=",
        "--set",
        "extraKinds[1].kind=ServiceAccount",
        "--set",
        "extraKinds[1].resource=serviceaccounts",
        "--set",
        "operator.deniedKinds={Pod,Job.batch}",
    ]);
    assert_eq!(
        deployment_env(&docs, "KINDS"),
        "configmap,secret,RoleBinding.rbac.authorization.k8s.io,ServiceAccount"
    );
    assert_eq!(deployment_env(&docs, "DENIED_KINDS"), "Pod,Job.batch");
    // Each kind gets the verbs ConfigMaps get (each proved needed by
    // each_verb_the_chart_grants_is_needed): a copy of any kind is created,
    // updated, deleted, adopted and handed over alike.
    let copy_verbs: BTreeSet<&str> = base
        .iter()
        .filter(|g| g.group.is_empty() && g.resource == "configmaps")
        .map(|g| g.verb.as_str())
        .collect();
    assert_eq!(
        copy_verbs,
        BTreeSet::from([
            "create", "delete", "get", "list", "patch", "update", "watch"
        ])
    );
    let added: BTreeSet<Grant> = all_grants(&docs).difference(&base).cloned().collect();
    let want: BTreeSet<Grant> = [
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("", "serviceaccounts"),
    ]
    .iter()
    .flat_map(|(group, resource)| {
        copy_verbs
            .iter()
            .map(|verb| Grant::new(group, resource, verb))
    })
    // RoleBinding copies are judged by the Roles they bind.
    .chain(["list", "watch"].map(|verb| Grant::new("rbac.authorization.k8s.io", "roles", verb)))
    .collect();
    assert_eq!(added, want, "what extraKinds adds to the chart's RBAC");
    assert!(
        base.is_subset(&all_grants(&docs)),
        "extraKinds takes nothing away"
    );

    for (set, verbs) in [
        (vec!["rbacCopy.bind=true"], vec!["bind"]),
        (vec!["rbacCopy.escalate=true"], vec!["escalate"]),
        (
            vec!["rbacCopy.bind=true", "rbacCopy.escalate=true"],
            vec!["bind", "escalate"],
        ),
    ] {
        let args: Vec<&str> = set.iter().flat_map(|s| ["--set", *s]).collect();
        let added: BTreeSet<Grant> = all_grants(&render(&args))
            .difference(&base)
            .cloned()
            .collect();
        let want: BTreeSet<Grant> = ["roles", "clusterroles"]
            .iter()
            .flat_map(|resource| {
                verbs
                    .iter()
                    .map(|verb| Grant::new("rbac.authorization.k8s.io", resource, verb))
            })
            .collect();
        assert_eq!(added, want, "with {set:?}");
    }

    // A release upgraded with --reuse-values from a chart without these
    // values: no extra grant, and the operator's own default deny-list.
    let docs = render(&[
        "--set",
        "extraKinds=null",
        "--set",
        "rbacCopy=null",
        "--set",
        "operator.deniedKinds=null",
    ]);
    assert_eq!(all_grants(&docs), base);
    assert_eq!(deployment_env(&docs, "KINDS"), "configmap,secret");
    let env = &find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .expect("env")
            .iter()
            .all(|e| e["name"] != "DENIED_KINDS"),
        "DENIED_KINDS set without operator.deniedKinds: {env}"
    );
}

// ===========================================================================
// The job: what the operator must be able to do with the chart's RBAC

/// The rules of the job, with their kind.
const RULES: [(&str, Kind); 2] = [("cms", CM), ("secrets", SECRET)];

fn source_name(kind: Kind) -> &'static str {
    match kind {
        Kind::ConfigMap => "settings",
        Kind::Secret => "token",
    }
}

/// The data key and value of every source of this kind.
fn payload(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::ConfigMap => ("k", "v"),
        Kind::Secret => ("password", "p"),
    }
}

/// The labels Kyverno's clone rule leaves on what it generated (besides
/// the source's own), which adoption removes.
const LEFT_BY_KYVERNO: [(&str, &str); 2] = [
    ("app.kubernetes.io/managed-by", "kyverno"),
    ("generate.kyverno.io/policy-name", "sync-settings"),
];

/// What the job works on, made before the operator starts: the operator's
/// namespace `op` (rules, sources, the Lease), a target `t1`, a namespace
/// `u3` that holds foreign objects of the sources' names and a namespace
/// `u4` that holds what another copying tool left there, the sources'
/// payload under their names (both targets once the rules are widened), a
/// source of each kind and a rule for each.
struct Stage {
    op: String,
    t1: String,
    u3: String,
    u4: String,
    lease: String,
    cm: Obj,
    secret: Obj,
    /// What another tool left in `u4`, as it left it: a ConfigMap, a Secret.
    left: [Obj; 2],
    /// Rule name → uid.
    uids: BTreeMap<&'static str, String>,
}

impl Stage {
    async fn new(t: &TestNs, op: String, lease: &str) -> Stage {
        let t1 = t.ns("t1").await;
        let u3 = t.ns("u3").await;
        let u4 = t.ns("u4").await;
        let mut sources = Vec::new();
        let mut left = Vec::new();
        for (_, kind) in RULES {
            let name = source_name(kind);
            sources.push(
                t.create_source(kind, &op, name, &[], &[payload(kind)])
                    .await,
            );
            t.create_plain(kind, &u3, name, &[], &[("mine", "1")]).await;
            left.push(
                t.create_plain(kind, &u4, name, &LEFT_BY_KYVERNO, &[payload(kind)])
                    .await,
            );
        }
        let left = left.try_into().expect("one object left of each kind");
        let mut uids = BTreeMap::new();
        for (name, kind) in RULES {
            let rule = t
                .create_rule(&op, name, rule_spec(kind, t.selector(), &[t.glob("t")]))
                .await;
            uids.insert(name, rule["metadata"]["uid"].as_str().unwrap().to_string());
        }
        let secret = sources.pop().unwrap();
        let cm = sources.pop().unwrap();
        Stage {
            op,
            t1,
            u3,
            u4,
            lease: lease.to_string(),
            cm,
            secret,
            left,
            uids,
        }
    }

    fn source(&self, kind: Kind) -> &Obj {
        match kind {
            Kind::ConfigMap => &self.cm,
            Kind::Secret => &self.secret,
        }
    }

    fn left(&self, kind: Kind) -> &Obj {
        match kind {
            Kind::ConfigMap => &self.left[0],
            Kind::Secret => &self.left[1],
        }
    }

    /// `copyrator run` in `op`, electing a leader on the stage's Lease.
    fn operator_args(&self) -> Vec<String> {
        [
            "run",
            "--namespace",
            &self.op,
            "--leader-election",
            "--lease-name",
            &self.lease,
            "--lease-duration",
            "5",
        ]
        .map(String::from)
        .to_vec()
    }
}

/// The operator's whole job, step by step, each step within a budget; it
/// stops at the first step that does not happen.
struct Job<'a> {
    t: &'a TestNs,
    s: &'a Stage,
    /// The operator's process id (its Lease identity ends with it) and port.
    pid: u32,
    port: u16,
    steps: Steps,
}

impl<'a> Job<'a> {
    fn new(t: &'a TestNs, s: &'a Stage, operator: &Operator, budget: Duration) -> Job<'a> {
        Job {
            t,
            s,
            pid: operator.pid().expect("the operator runs"),
            port: operator.port,
            steps: Steps::new(budget),
        }
    }

    fn t2(&self) -> String {
        self.t.name("t2")
    }

    async fn step(
        &self,
        name: impl Into<String>,
        check: impl AsyncFnMut() -> Result<(), String>,
    ) -> Result<(), Stopped> {
        self.steps.step(name, check).await
    }

    async fn rule(&self, name: &str) -> Result<Value, String> {
        self.t
            .try_get_rule(&self.s.op, name)
            .await?
            .ok_or_else(|| format!("rule {name} does not exist"))
    }

    async fn copy_of(&self, kind: Kind, ns: &str, source: &Obj, rule: &str) -> Result<(), String> {
        match self.t.try_get(kind, ns, &source.name).await? {
            None => Err(format!("no {kind:?} {ns}/{}", source.name)),
            Some(copy) => check_copy(&copy, source, &self.s.op, rule, &self.s.uids[rule]),
        }
    }

    /// What another tool left in u4 is now the rule's copy: the same
    /// object, its data unchanged, carrying the rule's labels, annotations
    /// and field manager, and the tool's marks gone.
    async fn adopted(&self, kind: Kind, rule: &str) -> Result<(), String> {
        let left = self.s.left(kind);
        let now = self
            .t
            .try_get(kind, &self.s.u4, &left.name)
            .await?
            .ok_or_else(|| format!("no {kind:?} {}/{}", self.s.u4, left.name))?;
        if now.uid != left.uid {
            return Err(format!(
                "{kind:?} {}/{} was replaced",
                now.namespace, now.name
            ));
        }
        check_copy(
            &now,
            self.s.source(kind),
            &self.s.op,
            rule,
            &self.s.uids[rule],
        )?;
        let marks: Vec<&String> = now
            .labels
            .keys()
            .filter(|k| k.starts_with("generate.kyverno.io/"))
            .collect();
        if !marks.is_empty() {
            return Err(format!("Kyverno's marks stay: {marks:?}"));
        }
        match now
            .annotations
            .get(ANNOTATION_ADOPTED_FROM)
            .map(String::as_str)
        {
            Some("Kyverno") => Ok(()),
            other => Err(format!("{ANNOTATION_ADOPTED_FROM}: {other:?}")),
        }
    }

    /// The copy the rule adopted in u4 is handed over to its namespace:
    /// the same object, its data unchanged, labelled CreateOnly.
    async fn handed_over(&self, kind: Kind) -> Result<(), String> {
        let left = self.s.left(kind);
        let now = self
            .t
            .try_get(kind, &self.s.u4, &left.name)
            .await?
            .ok_or_else(|| format!("no {kind:?} {}/{}", self.s.u4, left.name))?;
        if now.uid != left.uid || now.data != left.data {
            return Err(format!(
                "{kind:?} {}/{} was replaced or rewritten",
                now.namespace, now.name
            ));
        }
        match now.labels.get(LABEL_SYNC_POLICY).map(String::as_str) {
            Some("CreateOnly") => Ok(()),
            other => Err(format!("{LABEL_SYNC_POLICY}: {other:?}")),
        }
    }

    async fn gone(&self, kind: Kind, ns: &str, name: &str) -> Result<(), String> {
        match self.t.try_get(kind, ns, name).await? {
            None => Ok(()),
            Some(o) => Err(format!(
                "{kind:?} {ns}/{name} is still there (labels {:?})",
                o.labels
            )),
        }
    }

    async fn lease(&self) -> Result<Option<Lease>, String> {
        Api::<Lease>::namespaced(self.t.client.clone(), &self.s.op)
            .get_opt(&self.s.lease)
            .await
            .map_err(|e| err_msg(&e))
    }

    /// (holder, acquired, renewed) of the Lease, when it is held by this
    /// job's operator.
    async fn lease_of_ours(&self) -> Result<(String, String, String), String> {
        let lease = self.lease().await?.ok_or("there is no Lease")?;
        let spec = lease.spec.unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        if !holder.ends_with(&format!("-{}", self.pid)) {
            return Err(format!("the Lease is held by {holder:?}"));
        }
        let time = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
            t.map(|t| t.0.to_string()).unwrap_or_default()
        };
        Ok((holder, time(spec.acquire_time), time(spec.renew_time)))
    }

    async fn pruned_events(&self, rule: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        self.t
            .events_regarding(&self.s.op, rule)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Pruned"))
            .collect()
    }

    /// The whole job: ready, leading, copies of both kinds, status, a new
    /// namespace filled, edited copies repaired (update), a name taken by a
    /// foreign object (get, conflict reported), what another tool left
    /// adopted (`adopt: true`: a patch), sources unlabelled twice (prune:
    /// delete; a repeated Event: patch), the adopted copies handed over to
    /// their namespace when it stops being a target (`deletionPolicy`
    /// `targetLeft: Orphan`: a patch), the rules deleted (their finalizer
    /// deletes the copies, then lets them go).
    async fn run(&self) -> Result<(), Stopped> {
        let (t, s) = (self.t, self.s);
        self.step("ready", async || {
            match http_get(self.port, "/readyz").await {
                Ok((200, _)) => Ok(()),
                Ok((code, body)) => Err(format!("/readyz answers {code} {body}")),
                Err(e) => Err(format!("/readyz: {e}")),
            }
        })
        .await?;
        self.step("leading", async || {
            let (_, acquired, renewed) = self.lease_of_ours().await?;
            if renewed > acquired {
                Ok(())
            } else {
                Err(format!("acquired at {acquired}, never renewed"))
            }
        })
        .await?;
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} copied"), async || {
                self.copy_of(kind, &s.t1, s.source(kind), rule).await
            })
            .await?;
        }
        self.step("status written", async || {
            for (rule, _) in RULES {
                is_ready(&self.rule(rule).await?).map_err(|e| format!("rule {rule}: {e}"))?;
            }
            Ok(())
        })
        .await?;

        let t2 = t.ns("t2").await;
        self.step("new namespace filled", async || {
            for (rule, kind) in RULES {
                self.copy_of(kind, &t2, s.source(kind), rule).await?;
            }
            Ok(())
        })
        .await?;

        for (rule, kind) in RULES {
            let (key, _) = payload(kind);
            t.set_data(kind, &s.t1, source_name(kind), &[(key, Some("edited"))])
                .await;
            self.step(format!("{kind:?} copy repaired"), async || {
                self.copy_of(kind, &s.t1, s.source(kind), rule).await
            })
            .await?;
        }

        for (rule, _) in RULES {
            t.patch_rule(
                &s.op,
                rule,
                json!({"spec": {
                    "targets": {"include": [t.glob("t"), t.glob("u")]},
                    "adopt": true,
                    "deletionPolicy": {"targetLeft": "Orphan"},
                }}),
            )
            .await;
        }
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} conflict reported"), async || {
                let r = self.rule(rule).await?;
                let listed = r
                    .pointer("/status/conflicts")
                    .and_then(Value::as_array)
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c["namespace"] == s.u3.as_str() && c["name"] == source_name(kind)
                        })
                    });
                if listed {
                    Ok(())
                } else {
                    Err(short_status(&r))
                }
            })
            .await?;
        }
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} adopted"), async || {
                self.adopted(kind, rule).await
            })
            .await?;
        }

        // Two rounds of prunes with the same note: the second Event of a
        // rule is a repeat, which patches the first into a series.
        let targets = [s.t1.clone(), t2.clone(), s.u3.clone()];
        for round in 0..2 {
            let name = format!("extra-{round}");
            let mut extras = Vec::new();
            for (_, kind) in RULES {
                extras.push(
                    t.create_source(kind, &s.op, &name, &[], &[payload(kind)])
                        .await,
                );
            }
            self.step(
                format!("extra sources copied (round {round})"),
                async || {
                    for ((rule, kind), extra) in RULES.iter().zip(&extras) {
                        for ns in &targets {
                            self.copy_of(*kind, ns, extra, rule).await?;
                        }
                    }
                    Ok(())
                },
            )
            .await?;
            for (_, kind) in RULES {
                t.set_labels(kind, &s.op, &name, &[(TEST_LABEL, None)])
                    .await;
            }
            for (_, kind) in RULES {
                self.step(format!("{kind:?} pruned (round {round})"), async || {
                    for ns in &targets {
                        self.gone(kind, ns, &name).await?;
                    }
                    Ok(())
                })
                .await?;
            }
        }
        self.step("event recorded", async || {
            for (rule, _) in RULES {
                if self.pruned_events(rule).await.is_empty() {
                    return Err(format!("no Pruned event on rule {rule}"));
                }
            }
            Ok(())
        })
        .await?;
        self.step("event repeated", async || {
            for (rule, _) in RULES {
                let events = self.pruned_events(rule).await;
                if !events
                    .iter()
                    .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 2))
                {
                    return Err(format!(
                        "{} Pruned events on rule {rule}, none with a series",
                        events.len()
                    ));
                }
            }
            Ok(())
        })
        .await?;

        for (rule, _) in RULES {
            t.patch_rule(
                &s.op,
                rule,
                json!({"spec": {"targets": {"include": [t.glob("t")]}}}),
            )
            .await;
        }
        for (_, kind) in RULES {
            self.step(format!("{kind:?} handed over"), async || {
                self.handed_over(kind).await
            })
            .await?;
        }

        for (rule, _) in RULES {
            t.delete_rule(&s.op, rule).await;
        }
        for (rule, kind) in RULES {
            self.step(
                format!("{kind:?} rule deleted with its copies"),
                async || {
                    for ns in [&s.t1, &t2] {
                        self.gone(kind, ns, source_name(kind)).await?;
                    }
                    // What was handed over stays.
                    self.handed_over(kind).await?;
                    match t.try_get_rule(&s.op, rule).await? {
                        None => Ok(()),
                        Some(r) => Err(format!("rule {rule} is still there: {}", short_status(&r))),
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// What the cluster shows, once the job has stopped, that `evidence`
    /// says it must; `removed` is the verb the operator lacks.
    async fn evidence(&self, evidence: Evidence, removed: &Grant) -> Result<String, String> {
        let s = self.s;
        let no_finalizer_no_status = async || -> Result<(), String> {
            for (rule, _) in RULES {
                let r = self.rule(rule).await?;
                if r.pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty())
                {
                    return Err(format!("rule {rule} has a finalizer: {}", short_status(&r)));
                }
                if r.get("status").is_some_and(|s| !s.is_null()) {
                    return Err(format!("rule {rule} has a status: {}", short_status(&r)));
                }
            }
            Ok(())
        };
        match evidence {
            Evidence::NothingDone => {
                if let Ok((200, _)) = http_get(self.port, "/readyz").await {
                    return Err("the operator is ready".into());
                }
                no_finalizer_no_status().await?;
                Ok(
                    "never ready (a cache never listed); the rules have no finalizer, no status"
                        .into(),
                )
            }
            Evidence::NoFinalizer => {
                no_finalizer_no_status().await?;
                if self.t.try_get(CM, &s.t1, source_name(CM)).await?.is_some() {
                    return Err("a ConfigMap was copied".into());
                }
                Ok("the rules have no finalizer, no status; nothing copied".into())
            }
            Evidence::RuleChangeUnseen => {
                let mut seen = Vec::new();
                for (rule, _) in RULES {
                    let r = self.rule(rule).await?;
                    let generation = r.pointer("/metadata/generation").and_then(Value::as_i64);
                    let observed = r
                        .pointer("/status/observedGeneration")
                        .and_then(Value::as_i64);
                    match (generation, observed) {
                        (Some(g), Some(o)) if o < g => {
                            return Ok(format!(
                                "rule {rule} changed to generation {g}; its status still observes {o}"
                            ));
                        }
                        _ => seen.push(short_status(&r)),
                    }
                }
                Err(format!("every change was seen: {}", seen.join("; ")))
            }
            Evidence::NoStatus => {
                for (rule, _) in RULES {
                    let r = self.rule(rule).await?;
                    if r.get("status").is_some_and(|s| !s.is_null()) {
                        return Err(format!("rule {rule} has a status: {}", short_status(&r)));
                    }
                }
                self.copy_of(CM, &s.t1, &s.cm, "cms").await?;
                self.copy_of(SECRET, &s.t1, &s.secret, "secrets").await?;
                Ok("copies made, but neither rule has a status".into())
            }
            Evidence::Refused(kind) => {
                let rule = RULES.iter().find(|(_, k)| *k == kind).unwrap().0;
                let r = self.rule(rule).await?;
                let ready = ready_condition(&r).cloned().unwrap_or_default();
                let words = format!(
                    "cannot {} resource \"{}\"",
                    removed.verb,
                    removed.base_resource()
                );
                let message = ready["message"].as_str().unwrap_or_default();
                if ready["status"] == "False"
                    && ready["reason"] == "SyncFailed"
                    && message.contains(&words)
                {
                    Ok(format!(
                        "rule {rule}: Ready False, SyncFailed, \"... {words} ...\""
                    ))
                } else {
                    Err(format!(
                        "rule {rule} does not report \"{words}\": {}",
                        short_status(&r)
                    ))
                }
            }
            Evidence::EditUnseen(kind) => {
                let rule = RULES.iter().find(|(_, k)| *k == kind).unwrap().0;
                let (key, _) = payload(kind);
                let copy = self
                    .t
                    .try_get(kind, &s.t1, source_name(kind))
                    .await?
                    .ok_or("the copy is gone")?;
                if copy.data.get(key).map(String::as_str) != Some("edited") {
                    return Err(format!("the copy is not edited: {:?}", copy.data));
                }
                let r = self.rule(rule).await?;
                is_ready(&r).map_err(|e| format!("rule {rule} is not Ready: {e}"))?;
                Ok(format!(
                    "the {kind:?} copy in t1 keeps the edit while rule {rule} is Ready True (the edit was never seen)"
                ))
            }
            Evidence::NamespaceUnseen => {
                let t2 = self.t2();
                for (_, kind) in RULES {
                    if self
                        .t
                        .try_get(kind, &t2, source_name(kind))
                        .await?
                        .is_some()
                    {
                        return Err(format!("a {kind:?} was copied into t2"));
                    }
                }
                let r = self.rule("cms").await?;
                match status_u64(&r, "targetNamespaces") {
                    Some(1) => {
                        Ok("no copy in t2; rule cms counts 1 target namespace (t1 alone)".into())
                    }
                    other => Err(format!("rule cms counts {other:?} target namespaces")),
                }
            }
            Evidence::NoEvent => {
                for (rule, _) in RULES {
                    let events = self.t.events_regarding(&s.op, rule).await;
                    if !events.is_empty() {
                        return Err(format!("{} events on rule {rule}", events.len()));
                    }
                }
                Ok("no Event on either rule".into())
            }
            Evidence::EventNotRepeated => {
                let events = self.pruned_events("cms").await;
                if events.is_empty() {
                    return Err("no Pruned event on rule cms".into());
                }
                if events.iter().any(|e| e.series.is_some()) {
                    return Err("a Pruned event has a series".into());
                }
                Ok(format!(
                    "{} Pruned event(s) on rule cms, none with a series",
                    events.len()
                ))
            }
            Evidence::NoLease => match self.lease().await? {
                None => Ok("no Lease exists".into()),
                Some(lease) => Err(format!("a Lease exists: {:?}", lease.spec)),
            },
            Evidence::LeaseNotRenewed => {
                let (holder, acquired, renewed) = self.lease_of_ours().await?;
                if renewed == acquired {
                    Ok(format!(
                        "the Lease was taken by {holder} at {acquired} and never renewed"
                    ))
                } else {
                    Err(format!("the Lease was renewed at {renewed}"))
                }
            }
        }
    }
}

/// What the cluster shows when the operator lacks a verb, besides the API
/// server's 403 for that verb (read from the audit log in every case).
#[derive(Clone, Copy, Debug)]
enum Evidence {
    /// Never ready (a cache never lists), so nothing is done: the rules get
    /// no finalizer and no status.
    NothingDone,
    /// The rules get no finalizer (hence no copy, no status).
    NoFinalizer,
    /// A rule's change is never seen: its status observes an older
    /// generation.
    RuleChangeUnseen,
    /// Copies are made, but no rule has a status.
    NoStatus,
    /// The rule of this kind reports the refusal: Ready False, SyncFailed,
    /// in the API server's words.
    Refused(Kind),
    /// The copy of this kind in t1 keeps an edit while its rule is Ready
    /// True: the edit was never seen.
    EditUnseen(Kind),
    /// The new namespace t2 is never filled: the rule counts one target.
    NamespaceUnseen,
    /// No Event on the rules.
    NoEvent,
    /// The Pruned Event of rule cms has no series.
    EventNotRepeated,
    /// No Lease: no process ever leads.
    NoLease,
    /// The Lease is taken once and never renewed.
    LeaseNotRenewed,
}

/// For each verb the chart grants (default values): the first step of the
/// job that fails without it, and what the cluster then shows.
fn expectations() -> BTreeMap<Grant, (String, Evidence)> {
    use Evidence::*;
    let mut out = BTreeMap::new();
    let mut expect = |group: &str, resource: &str, verb: &str, step: &str, evidence| {
        out.insert(
            Grant::new(group, resource, verb),
            (step.to_string(), evidence),
        );
    };
    expect("flant.com", "copyrators", "list", "ready", NothingDone);
    // A rule change reaches the operator without its watch only through
    // the answer to a status write that happens to follow it: the job stops
    // at the first change (a rule's new targets, or its deletion) that no
    // such answer carried, whichever that is.
    expect(
        "flant.com",
        "copyrators",
        "watch",
        "ConfigMap conflict reported|Secret conflict reported|\
         ConfigMap handed over|Secret handed over|\
         ConfigMap rule deleted with its copies|Secret rule deleted with its copies",
        RuleChangeUnseen,
    );
    expect(
        "flant.com",
        "copyrators",
        "patch",
        "ConfigMap copied",
        NoFinalizer,
    );
    expect(
        "flant.com",
        "copyrators/status",
        "patch",
        "status written",
        NoStatus,
    );
    expect("", "namespaces", "list", "ready", NothingDone);
    expect(
        "",
        "namespaces",
        "watch",
        "new namespace filled",
        NamespaceUnseen,
    );
    for (kind, resource) in [(CM, "configmaps"), (SECRET, "secrets")] {
        let step = |what: &str| format!("{kind:?} {what}");
        if kind == SECRET {
            // The mark key is read (and made where missing, then updated
            // with the proof that the operator made it) before anything
            // else, with the verbs the ClusterRole grants on Secrets.
            expect("", resource, "get", "ready", NothingDone);
            expect("", resource, "create", "ready", NothingDone);
            expect("", resource, "update", "ready", NothingDone);
        } else {
            expect(
                "",
                resource,
                "get",
                &step("conflict reported"),
                Refused(kind),
            );
            expect("", resource, "create", &step("copied"), Refused(kind));
        }
        expect("", resource, "list", "ready", NothingDone);
        expect(
            "",
            resource,
            "watch",
            &step("copy repaired"),
            EditUnseen(kind),
        );
        if kind != SECRET {
            expect(
                "",
                resource,
                "update",
                &step("copy repaired"),
                Refused(kind),
            );
        }
        expect(
            "",
            resource,
            "delete",
            &step("pruned (round 0)"),
            Refused(kind),
        );
        // Adoption is the first metadata patch of a copy; a hand-over the
        // next.
        expect("", resource, "patch", &step("adopted"), Refused(kind));
    }
    expect(
        "events.k8s.io",
        "events",
        "create",
        "event recorded",
        NoEvent,
    );
    expect(
        "events.k8s.io",
        "events",
        "patch",
        "event repeated",
        EventNotRepeated,
    );
    expect("coordination.k8s.io", "leases", "get", "leading", NoLease);
    expect(
        "coordination.k8s.io",
        "leases",
        "create",
        "leading",
        NoLease,
    );
    expect(
        "coordination.k8s.io",
        "leases",
        "update",
        "leading",
        LeaseNotRenewed,
    );
    out
}

/// How long a step of a case may take. The control does the whole job in
/// the same conditions (every case at once), each step well within it.
const STEP_BUDGET: Duration = Duration::from_secs(20);

/// One run of the job, with the chart's RBAC minus `removed`.
struct Case {
    removed: Option<Grant>,
    user: String,
    outcome: Result<(), Stopped>,
    /// The steps that happened, with when (since the job started).
    passed: Vec<(String, Duration)>,
    /// What the cluster showed when the job stopped (with a verb removed).
    evidence: Result<String, String>,
    took: Duration,
    log: PathBuf,
    t: TestNs,
}

async fn run_case(
    removed: Option<&Grant>,
    cluster_grants: &BTreeSet<Grant>,
    lease_grants: &BTreeSet<Grant>,
    kinds: &str,
    cluster: &ClusterScoped,
    evidence: Option<Evidence>,
) -> Case {
    let start = Instant::now();
    let t = TestNs::new("chart-verbs").await;
    let op = t.ns("op").await;
    let minus = |grants: &BTreeSet<Grant>| -> BTreeSet<Grant> {
        grants
            .iter()
            .filter(|g| Some(*g) != removed)
            .cloned()
            .collect()
    };
    let (cluster_grants, lease_grants) = (minus(cluster_grants), minus(lease_grants));
    let id = Identity::create(
        &t,
        cluster,
        &op,
        "copyrator",
        &cluster_grants,
        &lease_grants,
    )
    .await;
    let allowed: BTreeSet<Grant> = cluster_grants.union(&lease_grants).cloned().collect();
    let denied: BTreeSet<Grant> = removed.cloned().into_iter().collect();
    id.wait_effective(&t.client, &op, &allowed, &denied).await;
    let stage = Stage::new(&t, op, "copyrator").await;
    let operator = Operator::start_with_env(
        &t,
        stage.operator_args(),
        &[("KUBECONFIG", &id.kubeconfig), ("KINDS", kinds)],
    );
    let job = Job::new(&t, &stage, &operator, STEP_BUDGET);
    let outcome = job.run().await;
    let evidence = match (removed, evidence, &outcome) {
        (Some(removed), Some(evidence), Err(_)) => job.evidence(evidence, removed).await,
        _ => Ok("-".to_string()),
    };
    let passed = job.steps.passed();
    let log = operator.log_path.clone();
    drop(operator);
    Case {
        removed: removed.cloned(),
        user: id.user,
        outcome,
        passed,
        evidence,
        took: start.elapsed(),
        log,
        t,
    }
}

/// Every verb the chart's ClusterRole and Role grant (default values) is
/// needed: the job runs once with exactly the rendered RBAC (the control,
/// which must do all of it with no request refused), and once per granted
/// verb with exactly the rendered RBAC minus that verb, each case as a
/// ServiceAccount of its own, in namespaces of its own, on a Lease of its
/// own, [`CASES_AT_ONCE`](crate::common::rbac::CASES_AT_ONCE) at a time. Without a verb, the job must stop at the step that
/// uses it, the cluster must show why (see [`Evidence`]), and the API
/// server's audit log must hold its 403 for that very verb. A verb whose
/// removal changes nothing fails the test: the chart must not grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_verb_the_chart_grants_is_needed() {
    let docs = render(&[]);
    let cluster_grants = grants_of(find_named(&docs, "ClusterRole", "copyrator"));
    let lease_grants = grants_of(find(&docs, "Role"));
    let kinds = deployment_env(&docs, "KINDS");
    let granted: BTreeSet<Grant> = cluster_grants.union(&lease_grants).cloned().collect();
    let wildcards: Vec<&Grant> = granted.iter().filter(|g| g.has_wildcard()).collect();
    assert!(wildcards.is_empty(), "wildcards granted: {wildcards:?}");
    let expected = expectations();
    let unexpected: Vec<String> = granted
        .iter()
        .filter(|g| !expected.contains_key(*g))
        .map(ToString::to_string)
        .collect();
    assert!(
        unexpected.is_empty(),
        "the chart grants {unexpected:?}, and this test does not say what removing it breaks: \
         add it to expectations() (it fails, saying so, if nothing breaks)"
    );
    let stale: Vec<String> = expected
        .keys()
        .filter(|g| !granted.contains(*g))
        .map(ToString::to_string)
        .collect();
    assert!(
        stale.is_empty(),
        "expectations() lists {stale:?}, which the chart no longer grants"
    );

    let audit = Audit::start();
    let cluster = ClusterScoped::new();
    let started = Utc::now();
    let runs: Vec<Option<&Grant>> = std::iter::once(None)
        .chain(granted.iter().map(Some))
        .collect();
    let cases = run_cases(&runs, |removed| {
        run_case(
            *removed,
            &cluster_grants,
            &lease_grants,
            &kinds,
            &cluster,
            removed.map(|g| expected[g].1),
        )
    })
    .await;
    let end = Utc::now();
    audit.settle(&cases[0].t.client, end).await;

    let mut problems = Vec::new();
    let mut table = Vec::new();
    for case in &cases {
        let refused: Vec<AuditEvent> =
            audit.matching(&Query::user(&case.user).code(403).between(started, end));
        let what = case
            .removed
            .as_ref()
            .map_or("(nothing: the control)".to_string(), ToString::to_string);
        let stopped = match &case.outcome {
            Ok(()) => "the whole job".to_string(),
            Err(s) => format!("stopped at \"{}\"", s.step),
        };
        let (row, problem) = match &case.removed {
            None => {
                let problem = match &case.outcome {
                    Err(s) => Some(format!("the control stopped at \"{}\": {}", s.step, s.last)),
                    Ok(()) if !refused.is_empty() => Some(format!(
                        "the control's requests were refused: {}",
                        refused
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; ")
                    )),
                    Ok(()) => None,
                };
                (format!("{stopped}, no request refused"), problem)
            }
            Some(grant) => {
                let (step, _) = &expected[grant];
                let for_it = refused
                    .iter()
                    .filter(|e| {
                        e.verb == grant.verb
                            && e.resource.as_deref() == Some(grant.base_resource())
                            && e.subresource.as_deref() == grant.subresource()
                    })
                    .count();
                let mut problem = match &case.outcome {
                    Ok(()) => Some(format!(
                        "removing {grant} changed nothing: the operator does not need it, \
                         so the chart must not grant it"
                    )),
                    Err(s) if !step.split('|').any(|one| one == s.step) => Some(format!(
                        "without {grant} the job stopped at \"{}\" ({}), expected at \"{step}\"",
                        s.step, s.last
                    )),
                    Err(_) => None,
                };
                if problem.is_none()
                    && let Err(e) = &case.evidence
                {
                    problem = Some(format!("without {grant}: {e}"));
                }
                if problem.is_none() && for_it == 0 {
                    problem = Some(format!(
                        "without {grant} the audit log holds no 403 for it (refused: {})",
                        refused
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; ")
                    ));
                }
                let evidence = case.evidence.as_deref().unwrap_or("?");
                (
                    format!("{stopped}; {evidence}; {for_it} requests refused (403) for it"),
                    problem,
                )
            }
        };
        table.push(format!(
            "  {what:<35} {row} [{} steps, {:.1?}]",
            case.passed.len(),
            case.took
        ));
        if let Some(problem) = problem {
            problems.push(format!("{problem} (log: {})", case.log.display()));
        }
    }
    let mut previous = Duration::ZERO;
    let control_steps: Vec<String> = cases[0]
        .passed
        .iter()
        .map(|(step, at)| {
            let took = at.saturating_sub(previous);
            previous = *at;
            format!("{step} {took:.1?}")
        })
        .collect();
    println!("the control's steps: {}", control_steps.join(", "));
    println!(
        "verb removed → what failed ({} cases, {CASES_AT_ONCE} at a time, {:.1?}):\n{}",
        cases.len(),
        (end - started).to_std().unwrap_or_default(),
        table.join("\n")
    );

    // Namespaces and RBAC go first, in parallel; then the verdict.
    drop(cluster);
    std::thread::scope(|scope| {
        for case in cases {
            scope.spawn(move || drop(case.t));
        }
    });
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The operator, running outside the cluster as the chart's ServiceAccount
/// (RBAC on), does its whole job (see [`Job::run`]). A request of the
/// ServiceAccount that the API server answered 403 (its audit log) fails
/// the test too, so a verb missing from the chart cannot go unnoticed even
/// where the operator copes with the refusal.
#[tokio::test]
async fn operator_as_the_charts_service_account_does_its_whole_job() {
    let t = TestNs::new("chart-rbac").await;
    let op = t.ns("op").await;
    let release = format!("copyrator-{}", random5());
    let mut install = helm();
    install.args([
        "install",
        &release,
        &chart_dir(),
        "--namespace",
        &op,
        "--set",
        "replicaCount=1",
        // The job edits copies as the test's admin to see them restored.
        "--set",
        "copyProtection.mode=Off",
    ]);
    run(install, "helm install");
    let _release = Release {
        name: release.clone(),
        namespace: op.clone(),
        kubeconfig: None,
    };
    // No kubelet runs here, so the Deployment exists but no pod starts.
    let mut get = Command::new("kubectl");
    get.args([
        "get",
        "deployment",
        &release,
        "--namespace",
        &op,
        "-o",
        "json",
    ]);
    let deployment: Value =
        serde_json::from_str(&run(get, "kubectl get deployment")).expect("deployment JSON");
    let kinds = deployment_env(&[deployment], "KINDS");

    let kubeconfig =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{release}.kubeconfig"));
    service_account_kubeconfig(&op, &release, &kubeconfig);
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let user = service_account_user(&op, &release);
    let stage = Stage::new(&t, op, &release).await;
    let audit = Audit::start();
    let started = Utc::now();
    let mut operator = Operator::start_with_env(
        &t,
        stage.operator_args(),
        &[("KUBECONFIG", &kubeconfig), ("KINDS", &kinds)],
    );
    let job = Job::new(&t, &stage, &operator, TIMEOUT);
    if let Err(stopped) = job.run().await {
        panic!(
            "the job stopped at \"{}\" after {:?}: {}",
            stopped.step,
            job.steps.passed(),
            stopped.last
        );
    }
    operator.assert_running();

    // Every request the ServiceAccount sent meanwhile, as the API server
    // answered it: none refused with 403.
    let end = Utc::now();
    audit.settle(&t.client, end).await;
    let sent = Query::user(&user).between(started, end);
    let writes = audit.by_verb(&sent.clone().verbs(WRITE_VERBS));
    println!(
        "requests of {user}: by code {:?}, writes by verb {writes:?}",
        audit.by_code(&sent)
    );
    // The query sees the operator's requests (else "no 403" proves nothing).
    for verb in ["create", "update", "delete", "patch"] {
        assert!(
            writes.get(verb).is_some_and(|n| *n > 0),
            "no {verb} request of {user} in the audit log: {writes:?}"
        );
    }
    // Adoption and hand-over patched copies of both kinds (one patch each,
    // more where a patch met a newer version and was sent again).
    for resource in ["configmaps", "secrets"] {
        let patches = audit.count(&sent.clone().verbs(&["patch"]).resource(resource));
        assert!(
            patches >= 2,
            "{patches} patches of {resource} by {user}: an adoption and a hand-over each send one"
        );
    }
    let refused = audit.matching(&sent.code(403));
    assert!(
        refused.is_empty(),
        "the API server refused {} requests of the chart's ServiceAccount (403):\n{}",
        refused.len(),
        refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `kinds: [configmap]`: the chart grants no verb on Secrets, and an
/// operator started with `--kinds configmap`, as a ServiceAccount with
/// exactly that rendered RBAC, copies ConfigMaps, refuses a Secret rule
/// (Ready False), and sends not one request on Secrets (the audit log),
/// nor any request the API server refuses.
#[tokio::test]
async fn operator_limited_to_configmaps_never_touches_secrets() {
    let docs = render(&["--set", "kinds={configmap}"]);
    assert_eq!(deployment_env(&docs, "KINDS"), "configmap");
    let cluster_grants = grants_of(find_named(&docs, "ClusterRole", "copyrator"));
    let lease_grants = grants_of(find(&docs, "Role"));
    let on_secrets: Vec<String> = cluster_grants
        .iter()
        .chain(&lease_grants)
        .filter(|g| g.base_resource() == "secrets" && !mark_key_grants(&docs).contains(g))
        .map(ToString::to_string)
        .collect();
    assert!(
        on_secrets.is_empty(),
        "with kinds=[configmap] the chart grants {on_secrets:?}"
    );
    let key = deployment_env(&docs, "MARK_KEY_SECRET");

    let t = TestNs::new("chart-kinds").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let cluster = ClusterScoped::new();
    let id = Identity::create(
        &t,
        &cluster,
        &op,
        "copyrator",
        &cluster_grants,
        &lease_grants,
    )
    .await;
    let allowed: BTreeSet<Grant> = cluster_grants.union(&lease_grants).cloned().collect();
    let denied: BTreeSet<Grant> = ["get", "list", "watch"]
        .iter()
        .map(|verb| Grant::new("", "secrets", verb))
        .collect();
    id.wait_effective(&t.client, &op, &allowed, &denied).await;

    let cm = t
        .create_source(CM, &op, "settings", &[], &[("k", "v")])
        .await;
    t.create_source(SECRET, &op, "token", &[], &[("password", "p")])
        .await;
    t.create_rule(&op, "cms", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(
        &op,
        "secrets",
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
    )
    .await;

    let audit = Audit::start();
    let started = Utc::now();
    let mut operator = Operator::start_with_env(
        &t,
        [
            "run",
            "--namespace",
            &op,
            "--kinds",
            "configmap",
            "--leader-election",
            "--lease-name",
            "copyrator",
            "--lease-duration",
            "5",
        ]
        .map(String::from)
        .to_vec(),
        &[("KUBECONFIG", &id.kubeconfig), ("MARK_KEY_SECRET", &key)],
    );
    t.wait_copy(CM, &t1, &cm, &op, "cms").await;
    t.wait_rule_ready(&op, "cms").await;
    let secrets_rule = t
        .wait_rule(&op, "secrets", "Ready False, InvalidRule", |r| {
            not_ready_because(r, "InvalidRule")
        })
        .await;
    println!(
        "rule secrets: {}",
        ready_condition(&secrets_rule).unwrap()["message"]
    );
    // A new namespace is filled too (the namespace watch works).
    let t2 = t.ns("t2").await;
    t.wait_copy(CM, &t2, &cm, &op, "cms").await;
    t.assert_absent(SECRET, &t1, "token", "Secrets are not copied")
        .await;
    operator.assert_running();

    let end = Utc::now();
    audit.settle(&t.client, end).await;
    let sent = Query::user(&id.user).between(started, end);
    println!(
        "requests of {}: by verb {:?}, on configmaps {:?}",
        id.user,
        audit.by_verb(&sent),
        audit.by_verb(&sent.clone().resource("configmaps"))
    );
    // The query sees the operator (else "none on secrets" proves nothing).
    let on_configmaps = audit.by_verb(&sent.clone().resource("configmaps"));
    for verb in ["list", "watch", "create"] {
        assert!(
            on_configmaps.get(verb).is_some_and(|n| *n > 0),
            "no {verb} configmaps request of {} in the audit log: {on_configmaps:?}",
            id.user
        );
    }
    let show = |events: Vec<AuditEvent>| {
        events
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Its mark key, in its own namespace, is the one Secret it reads (and
    // made, there being none, and proved).
    let (of_key, on_secrets): (Vec<AuditEvent>, Vec<AuditEvent>) = audit
        .matching(&sent.clone().resource("secrets"))
        .into_iter()
        .partition(|e| {
            e.namespace.as_deref() == Some(op.as_str())
                && e.name.as_deref() == Some(key.as_str())
                && ["get", "create", "update"].contains(&e.verb.as_str())
        });
    assert!(
        of_key.iter().any(|e| e.verb == "get"),
        "the mark key is never read"
    );
    assert!(
        on_secrets.is_empty(),
        "an operator limited to ConfigMaps sent {} requests on Secrets:\n{}",
        on_secrets.len(),
        show(on_secrets)
    );
    let refused = audit.matching(&sent.code(403));
    assert!(
        refused.is_empty(),
        "the API server refused {} requests of the ConfigMap-only operator (403):\n{}",
        refused.len(),
        show(refused)
    );
}
/// `helm upgrade` changes the Deployment; `helm uninstall` removes what
/// the release made and keeps the CRD (Helm never deletes `crds/`), so
/// rules and copies survive an uninstall. The release's Pod cannot run on
/// this control plane (it has no node): an operator of the test's own, in
/// the release's namespace, makes the copy and is stopped with the
/// uninstall, as the release's Pod would be.
#[tokio::test]
async fn helm_upgrade_and_uninstall() {
    let t = TestNs::new("chart-upgrade").await;
    let op = t.ns("op").await;
    // The release's copy protection covers this test's t1 alone.
    let t1 = t
        .ns_labelled("t1", &[("copyrator-test-protect", &t.prefix)])
        .await;
    let release = format!("copyrator-{}", random5());
    let protect = format!(
        "copyProtection.namespaceSelector.matchLabels.copyrator-test-protect={}",
        t.prefix
    );
    let mut install = helm();
    install.args([
        "install",
        &release,
        &chart_dir(),
        "--namespace",
        &op,
        "--set",
        &protect,
    ]);
    run(install, "helm install");
    let guard = Release {
        name: release.clone(),
        namespace: op.clone(),
        kubeconfig: None,
    };
    let rule = t
        .create_rule(&op, "cms", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let protection = format!("{release}-copies-read-only");
    let mut operator = Operator::start(&t, &op, &["--copy-protection", &protection]);
    let copy = t.wait_copy(CM, &t1, &source, &op, "cms").await;
    let said = format!("copy of {op}/cfg, kept by rule {op}/cms");
    wait_admin_refused(&t, (&t1, "cfg"), &said).await;

    let upgrade = |more: &[&str], what: &str| {
        let mut upgrade = helm();
        upgrade
            .args(["upgrade", &release, &chart_dir(), "--namespace", &op])
            .arg("--reuse-values")
            .args(more);
        run(upgrade, what);
    };
    upgrade(
        &[
            "--set",
            "operator.logLevel=debug",
            "--set",
            "replicaCount=3",
        ],
        "helm upgrade",
    );
    let mut get = Command::new("kubectl");
    get.args([
        "get",
        "deployment",
        &release,
        "--namespace",
        &op,
        "-o",
        "json",
    ]);
    let deployment: Value =
        serde_json::from_str(&run(get, "kubectl get deployment")).expect("deployment JSON");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e["name"] == "LOG_LEVEL" && e["value"] == "debug"),
        "the upgrade did not reach the Deployment: {env:?}"
    );
    let mut history = helm();
    history.args(["history", &release, "--namespace", &op, "-o", "json"]);
    let revisions: Value =
        serde_json::from_str(&run(history, "helm history")).expect("history JSON");
    assert_eq!(revisions.as_array().map(Vec::len), Some(2));
    // The upgrade left no moment without protection: its names stayed.
    let edited = admin_edit(&t, &t1, "cfg").await;
    assert!(
        edited.as_ref().is_err_and(|e| e.contains(&said)),
        "right after the upgrade: {edited:?}"
    );
    // Its binding deleted, protection is off and said so; the next
    // `helm upgrade` puts it back.
    wait_copy_protection(operator.port, "home", 1.0).await;
    let bindings = Api::<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    >::all(t.client.clone());
    bindings
        .delete(&protection, &kube::api::DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the binding: {}", err_msg(&e)));
    wait_copy_protection(operator.port, "home", 0.0).await;
    upgrade(&[], "helm upgrade (the binding deleted)");
    wait_copy_protection(operator.port, "home", 1.0).await;
    wait_admin_refused(&t, (&t1, "cfg"), &said).await;

    drop(guard);
    operator.stop();
    for (kind, name) in [
        ("deployment", release.clone()),
        ("serviceaccount", release.clone()),
        ("clusterrole", release.clone()),
        ("clusterrolebinding", release.clone()),
        (
            "validatingadmissionpolicy",
            format!("{release}-copies-read-only"),
        ),
        (
            "validatingadmissionpolicybinding",
            format!("{release}-copies-read-only"),
        ),
    ] {
        let mut get = Command::new("kubectl");
        get.args([
            "get",
            kind,
            &name,
            "--namespace",
            &op,
            "--ignore-not-found",
            "-o",
            "name",
        ]);
        assert_eq!(
            run(get, "kubectl get").trim(),
            "",
            "{kind} {name} is left after uninstall"
        );
    }
    let mut crd = Command::new("kubectl");
    crd.args(["get", "crd", CRD_NAME, "-o", "name"]);
    assert_eq!(
        run(crd, "kubectl get crd").trim(),
        format!("customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}"),
        "helm uninstall must keep the CRD"
    );
    // Kept, and not being deleted (with no operator left, a deleted rule
    // would linger on its finalizer).
    let kept = t.try_get_rule(&op, "cms").await;
    let kept_rule = kept.as_ref().ok().and_then(Option::as_ref);
    assert!(
        kept_rule.is_some_and(|r| r["metadata"]["uid"] == rule["metadata"]["uid"]
            && r["metadata"]["deletionTimestamp"].is_null()),
        "the rule did not survive helm uninstall: {kept:?}"
    );
    let kept_copy = t.get(CM, &t1, "cfg").await;
    assert_eq!(
        kept_copy.as_ref().map(|c| &c.resource_version),
        Some(&copy.resource_version),
        "the copy {t1}/cfg did not survive helm uninstall untouched: {kept_copy:?}"
    );
    // No longer kept, it is editable.
    wait_until("the kept copy to be editable", TIMEOUT, async || {
        admin_edit(&t, &t1, "cfg").await
    })
    .await;
}

/// Wait until the copy protection refuses the test's admin an edit of the
/// ConfigMap `namespace/name`, saying `said`.
async fn wait_admin_refused(t: &TestNs, (namespace, name): (&str, &str), said: &str) {
    wait_until(
        format!("the copy {namespace}/{name} protected"),
        TIMEOUT,
        async || match admin_edit(t, namespace, name).await {
            Err(e) if e.contains(said) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

/// A dry run of an edit of the ConfigMap `namespace/name` by the test's
/// admin: whether it would be let through.
async fn admin_edit(t: &TestNs, namespace: &str, name: &str) -> Result<(), String> {
    use kube::api::{Patch, PatchParams};
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(t.client.clone(), namespace)
        .patch(
            name,
            &params,
            &Patch::Merge(json!({"data": {"k": "edited"}})),
        )
        .await
        .map(|_| ())
        .map_err(|e| err_msg(&e))
}

/// The metric names in PromQL text: `copyrator_` and what follows of
/// letters, digits and underscores.
fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = promql;
    while let Some(at) = rest.find("copyrator_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// Every query of the chart's alerts and dashboard, with where it is.
fn chart_queries() -> Vec<(String, String)> {
    let docs = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
    ]);
    let mut queries = Vec::new();
    let rule = find(&docs, "PrometheusRule");
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for alert in group["rules"].as_array().expect("rules") {
            queries.push((
                format!("alert {}", alert["alert"]),
                alert["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "copyrator-dashboard")
        .expect("the dashboard ConfigMap");
    let json: Value = serde_json::from_str(
        dashboard["data"]["copyrator.json"]
            .as_str()
            .expect("copyrator.json"),
    )
    .expect("the dashboard is JSON");
    for panel in json["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    for variable in json["templating"]["list"].as_array().expect("variables") {
        // A "datasource" variable's query is a data source type, not PromQL.
        if variable["type"] == "query"
            && let Some(query) = variable["query"].as_str()
        {
            queries.push((format!("variable {}", variable["name"]), query.to_string()));
        }
    }
    queries
}

/// The chart's alerts and dashboard ask only for series a running operator
/// exports: every metric name in their queries is a sample name in a
/// scrape of an operator with a rule (histograms by their `_bucket`).
#[tokio::test]
async fn alerts_and_dashboard_use_only_metrics_the_operator_exports() {
    let queries = chart_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let t = TestNs::new("chart-metrics").await;
    let op = t.ns("op").await;
    let target = t.ns("t1").await;
    t.create_rule(
        &op,
        "r",
        rule_spec(Kind::ConfigMap, t.selector(), &[&target]),
    )
    .await;
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    t.wait_rule_ready(&op, "r").await;
    let exported: BTreeSet<String> =
        wait_until("a scrape with the rule's readiness", TIMEOUT, async || {
            let (code, text) = http_get(operator.port, "/metrics").await?;
            if code != 200 {
                return Err(format!("/metrics answered {code}"));
            }
            let names: BTreeSet<String> = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split(['{', ' ']).next())
                .map(str::to_string)
                .collect();
            if names.contains("copyrator_rule_ready") {
                Ok(names)
            } else {
                Err(format!("no copyrator_rule_ready sample yet:\n{text}"))
            }
        })
        .await;
    let mut unknown = Vec::new();
    for (place, query) in &queries {
        let names = metric_names(query);
        assert!(
            !names.is_empty(),
            "{place} asks for no copyrator metric: {query}"
        );
        for name in names {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the operator does not export: {unknown:?}\nexported: {exported:?}"
    );
    operator.assert_running();
}

/// With `rollout.restartConsumers` the chart grants patch on every
/// workload; its ValidatingAdmissionPolicy lets the operator's patches
/// change only the restart annotations of a pod template. Run against the
/// API server as a ServiceAccount with the operator's grants on
/// Deployments: a restart annotation goes through; a new image, another
/// annotation, new labels or replicas are denied.
#[tokio::test]
async fn the_chart_limits_the_operators_workload_patches_to_restart_annotations() {
    use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::ApiResource;
    let t = TestNs::new("chart-vap").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let apps = ["get", "patch"].map(|v| Grant::new("apps", "deployments", v));
    let id = Identity::create(
        &t,
        &cluster,
        &op,
        "operator",
        &apps.into_iter().collect(),
        &BTreeSet::new(),
    )
    .await;
    let docs = render(&["--set", "rollout.restartConsumers=true"]);
    let name = format!("{}-restarts-only", t.prefix);
    let mut policy = find_named(
        &docs,
        "ValidatingAdmissionPolicy",
        "copyrator-restarts-only",
    )
    .clone();
    // The uninstall hook, as the same account, scales the operator's own
    // Deployment: that one is left out.
    assert_eq!(
        policy["spec"]["matchConditions"][1]["expression"],
        "!(request.resource.resource == 'deployments' && request.namespace == 'copyrator' \
         && request.name == 'copyrator')"
    );
    // The policy as the chart renders it, for the test's ServiceAccount.
    policy["spec"]["matchConditions"] = json!([{"name": "the-operator",
        "expression": format!("request.userInfo.username == '{}'", id.user)}]);
    let binding = find_named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "copyrator-restarts-only",
    )
    .clone();
    create_chart_policy(&t.client, &cluster, policy, binding, &name).await;
    let resource = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let deployment: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app", "namespace": t1},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "app"}},
                 "template": {"metadata": {"labels": {"app": "app"},
                                           "annotations": {"team": "a"}},
                              "spec": {"containers": [{"name": "c", "image": "copyrator"}]}}},
    }))
    .expect("a Deployment");
    Api::<DynamicObject>::namespaced_with(t.client.clone(), &t1, &resource)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap_or_else(|e| panic!("the Deployment: {}", err_msg(&e)));
    let as_operator = client_of(std::path::Path::new(&id.kubeconfig)).await;
    let deployments = Api::<DynamicObject>::namespaced_with(as_operator, &t1, &resource);
    let dry_run = PatchParams {
        dry_run: true,
        field_manager: Some("copyrator".into()),
        ..PatchParams::default()
    };
    let patch = |body: Value| {
        let deployments = deployments.clone();
        let dry_run = dry_run.clone();
        async move {
            deployments
                .patch("app", &dry_run, &Patch::Merge(&body))
                .await
                .map(|_| ())
                .map_err(|e| err_msg(&e))
        }
    };
    let template = |meta: Value| json!({"spec": {"template": {"metadata": meta}}});
    let image = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "attacker/miner"}]}}}});
    // The policy takes effect through a cache: wait for the first denial.
    wait_until(
        "the policy to deny a new image",
        TIMEOUT,
        async || match patch(image.clone()).await {
            Err(e) if e.contains("not the pod spec") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let restart =
        template(json!({"annotations": {"copyrator.flant.com/restart-0123456789abcdef": "f00d"}}));
    patch(restart)
        .await
        .unwrap_or_else(|e| panic!("a restart annotation was denied: {e}"));
    for (what, body) in [
        (
            "another annotation",
            template(json!({"annotations": {"team": "b"}})),
        ),
        (
            "new pod labels",
            template(json!({"labels": {"app": "app", "x": "y"}})),
        ),
        ("replicas", json!({"spec": {"replicas": 5}})),
        (
            "workload annotations",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        ("paused", json!({"spec": {"paused": true}})),
        (
            "the strategy",
            json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}}),
        ),
        (
            "an owner",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}]}}),
        ),
        (
            "workload labels",
            json!({"metadata": {"labels": {"x": "y"}}}),
        ),
    ] {
        let denied = patch(body).await;
        assert!(
            denied
                .as_ref()
                .is_err_and(|e| e.contains("only its restart annotations")),
            "{what}: {denied:?}"
        );
    }
    // Others' patches are not its business.
    Api::<DynamicObject>::namespaced_with(t.client.clone(), &t1, &resource)
        .patch(
            "app",
            &PatchParams {
                dry_run: true,
                ..PatchParams::default()
            },
            &Patch::Merge(&image),
        )
        .await
        .unwrap_or_else(|e| panic!("an admin's patch was denied: {}", err_msg(&e)));
}

/// `networkPolicy.enabled` makes a NetworkPolicy that selects the
/// operator's pods and lets only `metricsFrom` reach its port; the API
/// server takes it as rendered. Off (the default), there is none.
#[tokio::test]
async fn the_chart_can_fence_the_operators_port() {
    use kube::api::{DynamicObject, PostParams};
    use kube::core::ApiResource;
    assert!(
        render(&[]).iter().all(|d| d["kind"] != "NetworkPolicy"),
        "a NetworkPolicy by default"
    );
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
    ]);
    let policy = find(&docs, "NetworkPolicy").clone();
    let pod_labels = &find(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"];
    let selected = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("a podSelector");
    assert!(
        selected.iter().all(|(k, v)| &pod_labels[k] == v),
        "{selected:?} does not select the pods {pod_labels}"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
                "ports": [{"port": "http", "protocol": "TCP"}]}])
    );
    let t = TestNs::new("chart-netpol").await;
    let ns = t.ns("op").await;
    let mut object: DynamicObject = serde_json::from_value(policy).expect("a NetworkPolicy");
    object.metadata.namespace = Some(ns.clone());
    let resource = ApiResource::erase::<k8s_openapi::api::networking::v1::NetworkPolicy>(&());
    Api::<DynamicObject>::namespaced_with(t.client.clone(), &ns, &resource)
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &object,
        )
        .await
        .unwrap_or_else(|e| panic!("the API server refused the NetworkPolicy: {}", err_msg(&e)));
}
