//! The chart's member side (`memberSide.enabled`), for a member cluster:
//! it renders the ServiceAccount, ClusterRole, binding and token Secret the
//! operator of the home cluster works in a member with, and none of the
//! operator's own objects; its ClusterRole is enough for the whole job in a
//! member (the release installed in member `a` with helm, the operator at
//! home keeping copies there with the release's token), and every verb it
//! grants is needed (the job once per verb, without that verb, as
//! tests/suite/chart.rs does for the operator's own role).
//!
//! A home control plane and the members `hack/test` starts (see
//! tests/common/members.rs). The members keep no audit log: what a
//! member's API server refused is read in its own words from the rules'
//! statuses (a write) and from the operator's log (a list or a watch).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::helm::{Release, chart_dir, documents, find, render, run};
use crate::common::members::{Member, OUTAGE, client_of_yaml, member};
use crate::common::prometheus::{wait_copy_protection, wait_protection_off_event};
use crate::common::rbac::{CASES_AT_ONCE, ClusterScoped, Grant, Identity, grants_of, run_cases};
use crate::common::steps::{Steps, Stopped};
use crate::common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;
const SOURCE_CLUSTER: &str = "copyrator.flant.com/source-cluster";
const MEMBER_SIDE: [&str; 2] = ["--set", "memberSide.enabled=true"];
/// The operator logs each write that failed at debug: with this, every
/// request a member refused is in its log or in a rule's status.
const LOG_LEVEL: &str = "info,copyrator=debug";

// ===========================================================================
// What the member side renders

/// (kind, name) of each object.
fn objects(docs: &[Value]) -> BTreeSet<(String, String)> {
    docs.iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap_or_default().to_string(),
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn object_set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs
        .iter()
        .map(|(kind, name)| (kind.to_string(), name.to_string()))
        .collect()
}

/// What the member side of release `name` holds by default.
fn member_side_objects(name: &str) -> BTreeSet<(String, String)> {
    let token = format!("{name}-token");
    let mut objects = object_set(&[
        ("ServiceAccount", name),
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
        ("Secret", &token),
    ]);
    objects.extend(protection_objects(name));
    objects
}

/// The member's copy protection of release `name`: the policy, its
/// binding, and the acting-for extra granted to the member side's account.
fn protection_objects(name: &str) -> BTreeSet<(String, String)> {
    let read_only = format!("{name}-copies-read-only");
    let acting_for = format!("{name}-acting-for");
    let followed = format!("{name}-copy-protection");
    object_set(&[
        ("ValidatingAdmissionPolicy", &read_only),
        ("ValidatingAdmissionPolicyBinding", &read_only),
        ("ClusterRole", &acting_for),
        ("ClusterRoleBinding", &acting_for),
        ("ClusterRole", &followed),
        ("ClusterRoleBinding", &followed),
    ])
}

/// What the member side's account may do with its own ClusterRole and
/// Roles (the acting-for extra, granted apart, lets it do nothing alone;
/// reading the copy protection by name, granted apart too, is proved
/// enough by the install test).
fn member_grants(docs: &[Value]) -> BTreeSet<Grant> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .filter(|d| {
            !d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-acting-for") || n.ends_with("-copy-protection"))
        })
        .flat_map(grants_of)
        .collect()
}

fn with_member_side<'a>(args: &[&'a str]) -> Vec<&'a str> {
    MEMBER_SIDE.iter().chain(args).copied().collect()
}

/// `memberSide.enabled` renders the ServiceAccount, a ClusterRole, its
/// binding and a token Secret, whatever else is on, and nothing of the
/// operator's own (no Deployment, Service, operator RBAC, monitoring or
/// test Pod; the CRD is `--skip-crds`'s, see the install test). The
/// ClusterRole grants what the operator's own grants on namespaces and on
/// the kinds of `kinds`, nothing else (each verb is proved needed by
/// [`each_verb_the_member_side_grants_is_needed`]); the other values shape
/// it as they shape the operator's objects.
#[test]
fn member_side_renders_what_a_member_holds_and_nothing_of_the_operator() {
    let docs = render(&MEMBER_SIDE);
    assert_eq!(objects(&docs), member_side_objects("copyrator"));

    // Every optional part of the operator on: still none of it.
    let everything = render(&with_member_side(&[
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "memberClusters.enabled=true",
        "--set",
        "rbacCopy.bind=true",
        "--set",
        "rbacCopy.escalate=true",
        "--set",
        "extraKinds[0].apiGroup=rbac.authorization.k8s.io",
        "--set",
        "extraKinds[0].kind=RoleBinding",
        "--set",
        "extraKinds[0].resource=rolebindings",
    ]));
    assert_eq!(objects(&everything), member_side_objects("copyrator"));
    let grants = member_grants(&docs);
    assert_eq!(
        member_grants(&everything),
        grants,
        "members receive ConfigMaps and Secrets only: extraKinds and rbacCopy grant nothing there"
    );

    // The operator's own grants on namespaces and the copied kinds.
    let operator = member_grants(&render(&[]));
    let wildcards: Vec<&Grant> = grants.iter().filter(|g| g.has_wildcard()).collect();
    assert!(wildcards.is_empty(), "wildcards granted: {wildcards:?}");
    let theirs: BTreeSet<Grant> = operator
        .iter()
        .filter(|g| {
            g.group.is_empty() && ["namespaces", "configmaps", "secrets"].contains(&&*g.resource)
        })
        .cloned()
        .collect();
    assert_eq!(grants, theirs, "the member side's grants");

    // Bound to the ServiceAccount of the release's namespace; the token
    // Secret is that ServiceAccount's.
    let binding = find(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "copyrator", "namespace": "copyrator"}])
    );
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "copyrator"})
    );
    let secret = find(&docs, "Secret");
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(secret["metadata"]["namespace"], "copyrator");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "copyrator"
    );

    // `kinds`: an operator limited to one kind gets no verb on the other
    // there either; a release from a chart without `kinds` keeps both.
    for (kinds, enabled, disabled) in [
        ("kinds={configmap}", "configmaps", "secrets"),
        ("kinds={secret}", "secrets", "configmaps"),
    ] {
        let grants = member_grants(&render(&with_member_side(&["--set", kinds])));
        assert!(
            grants.iter().all(|g| g.resource != disabled),
            "with {kinds} the member side grants {grants:?}"
        );
        assert!(
            grants.iter().any(|g| g.resource == enabled),
            "with {kinds} the member side grants nothing on {enabled}"
        );
    }
    assert_eq!(
        member_grants(&render(&with_member_side(&["--set", "kinds=null"]))),
        grants
    );

    // The token Secret, the ServiceAccount and the RBAC each follow their value.
    let docs = render(&with_member_side(&[
        "--set",
        "memberSide.tokenSecret=false",
    ]));
    let mut without_token = object_set(&[
        ("ServiceAccount", "copyrator"),
        ("ClusterRole", "copyrator"),
        ("ClusterRoleBinding", "copyrator"),
    ]);
    without_token.extend(protection_objects("copyrator"));
    assert_eq!(objects(&docs), without_token);
    let docs = render(&with_member_side(&[
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=existing",
    ]));
    let mut existing_account = object_set(&[
        ("ClusterRole", "copyrator"),
        ("ClusterRoleBinding", "copyrator"),
        ("Secret", "copyrator-token"),
    ]);
    existing_account.extend(protection_objects("copyrator"));
    assert_eq!(objects(&docs), existing_account);
    assert_eq!(
        find(&docs, "ClusterRoleBinding")["subjects"][0]["name"],
        "existing"
    );
    assert_eq!(
        find(&docs, "Secret")["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "existing"
    );
    // Without RBAC, the policy stays (it is no RBAC).
    let docs = render(&with_member_side(&["--set", "rbac.create=false"]));
    assert_eq!(
        objects(&docs),
        object_set(&[
            ("ServiceAccount", "copyrator"),
            ("Secret", "copyrator-token"),
            ("ValidatingAdmissionPolicy", "copyrator-copies-read-only"),
            (
                "ValidatingAdmissionPolicyBinding",
                "copyrator-copies-read-only"
            ),
        ])
    );

    // By default (and from a chart without the value) the operator, not this.
    for args in [&[][..], &["--set", "memberSide=null"][..]] {
        let docs = render(args);
        find(&docs, "Deployment");
        assert!(
            docs.iter().all(|d| d["kind"] != "Secret"),
            "{args:?} renders a Secret"
        );
    }
}

// ===========================================================================
// The job in a member

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

/// The value the job gives every source before its rule is widened.
const CHANGED: &str = "changed";

/// The labels Kyverno's clone rule leaves on what it generated (besides
/// the source's own), which adoption removes.
const LEFT_BY_KYVERNO: [(&str, &str); 2] = [
    ("app.kubernetes.io/managed-by", "kyverno"),
    ("generate.kyverno.io/policy-name", "sync-settings"),
];

fn rule_of(kind: Kind) -> &'static str {
    RULES.iter().find(|(_, k)| *k == kind).unwrap().0
}

/// What the job works on, made before the operator starts: at home the
/// operator's namespace `op` (rules, sources, and the member's kubeconfig
/// Secret, with the credentials under test); in the member a target `t1`,
/// a namespace `u3` that holds foreign objects of the sources' names and a
/// namespace `u4` that holds what another copying tool left there, the
/// sources' payload (as the job changes it) under their names (both
/// targets once the rules are widened); a source of each kind, and a rule
/// for each that keeps copies in the member only (`local: false`).
struct Stage<'a> {
    t: &'a TestNs,
    member: &'a Member,
    op: String,
    t1: String,
    u3: String,
    u4: String,
    /// What another tool left in `u4`, as it left it: a ConfigMap, a Secret.
    left: [Obj; 2],
    /// Rule name → uid.
    uids: BTreeMap<&'static str, String>,
}

impl<'a> Stage<'a> {
    async fn new(t: &'a TestNs, member: &'a Member, kubeconfig: &str) -> Stage<'a> {
        let op = t.ns("op").await;
        member
            .register_kubeconfig(&t.client, &op, &[], kubeconfig)
            .await;
        let t1 = member.ns(t, "t1").await;
        let u3 = member.ns(t, "u3").await;
        let u4 = member.ns(t, "u4").await;
        let mut left = Vec::new();
        for (_, kind) in RULES {
            let name = source_name(kind);
            t.create_source(kind, &op, name, &[], &[payload(kind)])
                .await;
            member
                .create_plain(kind, &u3, name, &[], &[("mine", "1")])
                .await;
            let (key, _) = payload(kind);
            left.push(
                member
                    .create_plain(kind, &u4, name, &LEFT_BY_KYVERNO, &[(key, CHANGED)])
                    .await,
            );
        }
        let left = left.try_into().expect("one object left of each kind");
        let mut uids = BTreeMap::new();
        for (name, kind) in RULES {
            let spec = with(
                rule_spec(kind, t.selector(), &[t.glob("t")]),
                "/spec/targets/clusters",
                json!({"names": [member.name], "local": false}),
            );
            let rule = t.create_rule(&op, name, spec).await;
            uids.insert(name, rule["metadata"]["uid"].as_str().unwrap().to_string());
        }
        Stage {
            t,
            member,
            op,
            t1,
            u3,
            u4,
            left,
            uids,
        }
    }

    fn left(&self, kind: Kind) -> &Obj {
        match kind {
            Kind::ConfigMap => &self.left[0],
            Kind::Secret => &self.left[1],
        }
    }

    /// `copyrator run --member-clusters` in `op`, as the home cluster's
    /// admin (only the member's credentials are under test).
    fn start_operator(&self) -> Operator {
        self.start_operator_with(&[])
    }

    /// [`Stage::start_operator`] with more arguments.
    fn start_operator_with(&self, more: &[&str]) -> Operator {
        let args: Vec<&str> = ["--member-clusters", "--log-level", LOG_LEVEL]
            .into_iter()
            .chain(more.iter().copied())
            .collect();
        Operator::start(self.t, &self.op, &args)
    }
}

/// The operator's whole job in a member, step by step (see [`Job::run`]).
struct Job<'a> {
    s: &'a Stage<'a>,
    steps: Steps,
}

impl<'a> Job<'a> {
    fn new(s: &'a Stage<'a>, budget: Duration) -> Job<'a> {
        Job {
            s,
            steps: Steps::new(budget),
        }
    }

    fn t2(&self) -> String {
        self.s.t.name("t2")
    }

    async fn step(
        &self,
        name: impl Into<String>,
        check: impl AsyncFnMut() -> Result<(), String>,
    ) -> Result<(), Stopped> {
        self.steps.step(name, check).await
    }

    async fn rule(&self, name: &str) -> Result<Value, String> {
        self.s
            .t
            .try_get_rule(&self.s.op, name)
            .await?
            .ok_or_else(|| format!("rule {name} does not exist"))
    }

    /// What the clusters and the log said when the evidence was not
    /// there, so that a failure can be told apart from a slow start: each
    /// rule's Ready condition and the operator's last INFO+ lines.
    async fn diagnosis(&self, log: &str) -> String {
        let mut said = Vec::new();
        for (rule, _) in RULES {
            let ready = match self.rule(rule).await {
                Ok(r) => r["status"]["conditions"]
                    .as_array()
                    .and_then(|all| all.iter().find(|c| c["type"] == "Ready"))
                    .map_or("no Ready condition".to_string(), |c| {
                        format!("{} {}: {}", c["status"], c["reason"], c["message"])
                    }),
                Err(e) => e,
            };
            said.push(format!("rule {rule} Ready {ready}"));
        }
        let lines = common::logs::parse_text(log);
        let notable: Vec<String> = lines
            .iter()
            .filter(|l| l.level != "DEBUG" && l.level != "TRACE")
            .map(ToString::to_string)
            .collect();
        let last = &notable[notable.len().saturating_sub(12)..];
        said.push(format!(
            "the log's last INFO+ lines:\n    {}",
            last.join("\n    ")
        ));
        said.join("\n  ")
    }

    /// The rule's `status.clusters` entry of the member.
    async fn entry(&self, rule: &str) -> Result<Value, String> {
        let r = self.rule(rule).await?;
        r["status"]["clusters"]
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|c| c["name"] == self.s.member.name.as_str())
            })
            .cloned()
            .ok_or_else(|| format!("rule {rule} lists no member entry: {}", r["status"]))
    }

    /// `ns/name` in the member is a copy of the source of that name, as the
    /// source is now, by `rule`, naming the home cluster.
    async fn copy_of(&self, kind: Kind, ns: &str, name: &str, rule: &str) -> Result<(), String> {
        let s = self.s;
        let source =
            s.t.try_get(kind, &s.op, name)
                .await?
                .ok_or_else(|| format!("no source {kind:?} {}/{name}", s.op))?;
        let copy = s
            .member
            .try_get(kind, ns, name)
            .await?
            .ok_or_else(|| format!("no {kind:?} {ns}/{name} in member {}", s.member.name))?;
        check_copy(&copy, &source, &s.op, rule, &s.uids[rule])?;
        match copy.annotation(SOURCE_CLUSTER) {
            Some("home") => Ok(()),
            other => Err(format!("{ns}/{name}: {SOURCE_CLUSTER} is {other:?}")),
        }
    }

    /// What another tool left in u4 of the member is now the rule's copy:
    /// the same object, its data unchanged (see [`Job::copy_of`]), and the
    /// tool's marks gone.
    async fn adopted(&self, kind: Kind, rule: &str) -> Result<(), String> {
        let left = self.s.left(kind);
        self.copy_of(kind, &self.s.u4, &left.name, rule).await?;
        let now = self
            .s
            .member
            .try_get(kind, &self.s.u4, &left.name)
            .await?
            .ok_or("the adopted object is gone")?;
        if now.uid != left.uid {
            return Err(format!(
                "{kind:?} {}/{} was replaced",
                now.namespace, now.name
            ));
        }
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

    /// The copy the rule adopted in u4 of the member is handed over to its
    /// namespace: the same object, its data unchanged, labelled CreateOnly.
    async fn handed_over(&self, kind: Kind) -> Result<(), String> {
        let left = self.s.left(kind);
        let now = self
            .s
            .member
            .try_get(kind, &self.s.u4, &left.name)
            .await?
            .ok_or_else(|| format!("no {kind:?} {}/{} in the member", self.s.u4, left.name))?;
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
        match self.s.member.try_get(kind, ns, name).await? {
            None => Ok(()),
            Some(o) => Err(format!(
                "{kind:?} {ns}/{name} is still in member {} (labels {:?})",
                self.s.member.name, o.labels
            )),
        }
    }

    /// The whole job in the member: copies of both kinds, the member synced
    /// in the rules' statuses, a new namespace filled (the namespace watch),
    /// changed sources carried to their copies (update), edited copies
    /// repaired (the copy watch, update), what another tool left adopted
    /// (`adopt: true`: a get, then a patch), a name taken by a foreign
    /// object (get, conflict reported), copies pruned when their source is
    /// deleted (delete), the adopted copies handed over to their namespace
    /// when it stops being a target (`deletionPolicy` `targetLeft: Orphan`:
    /// a patch), and the rules deleted (their finalizer deletes the copies
    /// in the member, then lets them go).
    async fn run(&self) -> Result<(), Stopped> {
        let (t, s, m) = (self.s.t, self.s, self.s.member);
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} copied"), async || {
                self.copy_of(kind, &s.t1, source_name(kind), rule).await
            })
            .await?;
        }
        self.step("member synced", async || {
            for (rule, _) in RULES {
                let entry = self.entry(rule).await?;
                if entry["ready"] != true || entry["reason"] != "Synced" || entry["copies"] != 1 {
                    return Err(format!("rule {rule}: {entry}"));
                }
            }
            Ok(())
        })
        .await?;

        let t2 = m.ns(t, "t2").await;
        self.step("new namespace filled", async || {
            for (rule, kind) in RULES {
                self.copy_of(kind, &t2, source_name(kind), rule).await?;
            }
            Ok(())
        })
        .await?;

        for (rule, kind) in RULES {
            let (key, _) = payload(kind);
            t.set_data(kind, &s.op, source_name(kind), &[(key, Some(CHANGED))])
                .await;
            self.step(format!("{kind:?} copy updated"), async || {
                for ns in [&s.t1, &t2] {
                    self.copy_of(kind, ns, source_name(kind), rule).await?;
                }
                Ok(())
            })
            .await?;
        }

        for (rule, kind) in RULES {
            let (key, _) = payload(kind);
            m.set_data(kind, &s.t1, source_name(kind), &[(key, Some("edited"))])
                .await;
            self.step(format!("{kind:?} copy repaired"), async || {
                self.copy_of(kind, &s.t1, source_name(kind), rule).await
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
        // First the adoptions: while one fails, the member's entry is not
        // ready, which the conflict steps check.
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} adopted"), async || {
                self.adopted(kind, rule).await
            })
            .await?;
        }
        for (rule, kind) in RULES {
            self.step(format!("{kind:?} conflict reported"), async || {
                let entry = self.entry(rule).await?;
                if entry["ready"] != true || entry["conflicts"] != 1 {
                    return Err(format!("rule {rule}: {entry}"));
                }
                let foreign = m
                    .try_get(kind, &s.u3, source_name(kind))
                    .await?
                    .ok_or("the foreign object is gone")?;
                if foreign.is_copy() || foreign.data_is(&[("mine", "1")]).is_err() {
                    return Err(format!("the foreign object was written: {foreign:?}"));
                }
                Ok(())
            })
            .await?;
        }

        let targets = [s.t1.clone(), t2.clone(), s.u3.clone()];
        for (_, kind) in RULES {
            t.create_source(kind, &s.op, "extra", &[], &[payload(kind)])
                .await;
        }
        self.step("extra sources copied", async || {
            for (rule, kind) in RULES {
                for ns in &targets {
                    self.copy_of(kind, ns, "extra", rule).await?;
                }
            }
            Ok(())
        })
        .await?;
        for (_, kind) in RULES {
            t.delete(kind, &s.op, "extra").await;
        }
        for (_, kind) in RULES {
            self.step(format!("{kind:?} pruned"), async || {
                for ns in &targets {
                    self.gone(kind, ns, "extra").await?;
                }
                Ok(())
            })
            .await?;
        }

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

    /// What the clusters show, once the job has stopped, that `evidence`
    /// says they must; `removed` is the verb the operator lacks in the
    /// member, and `log` the operator's log.
    async fn evidence(
        &self,
        evidence: Evidence,
        removed: &Grant,
        log: &str,
    ) -> Result<String, String> {
        let s = self.s;
        let words = refusal_words(removed);
        let said = || match lines_saying(log, &words) {
            0 => Err(format!("the operator's log never says '{words}'")),
            n => Ok(format!("the log says '{words}' ({n} lines)")),
        };
        match evidence {
            Evidence::Unlisted => {
                for (rule, _) in RULES {
                    let entry = self.entry(rule).await?;
                    if entry["ready"] != false || entry["reason"] != "Progressing" {
                        return Err(format!("rule {rule}: {entry}"));
                    }
                }
                for (_, kind) in RULES {
                    if s.member
                        .try_get(kind, &s.t1, source_name(kind))
                        .await?
                        .is_some()
                    {
                        return Err(format!("a {kind:?} was copied"));
                    }
                }
                Ok(format!(
                    "nothing copied, both rules list the member as Progressing (never listed); {}",
                    said()?
                ))
            }
            Evidence::NamespaceUnseen => {
                for (_, kind) in RULES {
                    if s.member
                        .try_get(kind, &self.t2(), source_name(kind))
                        .await?
                        .is_some()
                    {
                        return Err(format!("a {kind:?} was copied into t2"));
                    }
                }
                let entry = self.entry("cms").await?;
                if entry["targetNamespaces"] != 1 {
                    return Err(format!("rule cms: {entry}"));
                }
                Ok(format!(
                    "no copy in t2; rule cms counts 1 target namespace there; {}",
                    said()?
                ))
            }
            Evidence::EditUnseen(kind) => {
                let rule = rule_of(kind);
                let (key, _) = payload(kind);
                let copy = s
                    .member
                    .try_get(kind, &s.t1, source_name(kind))
                    .await?
                    .ok_or("the copy is gone")?;
                if copy.data.get(key).map(String::as_str) != Some("edited") {
                    return Err(format!("the copy is not edited: {:?}", copy.data));
                }
                let entry = self.entry(rule).await?;
                if entry["ready"] != true {
                    return Err(format!("rule {rule}: {entry}"));
                }
                Ok(format!(
                    "the {kind:?} copy in t1 keeps the edit while rule {rule} is synced there; {}",
                    said()?
                ))
            }
            Evidence::Refused(kind) => {
                let rule = rule_of(kind);
                let entry = self.entry(rule).await?;
                let message = entry["message"].as_str().unwrap_or_default();
                if entry["ready"] == false
                    && entry["reason"] == "SyncFailed"
                    && message.contains(&words)
                {
                    Ok(format!(
                        "rule {rule} lists the member: not ready, SyncFailed, \"... {words} ...\""
                    ))
                } else {
                    Err(format!("rule {rule} does not report '{words}': {entry}"))
                }
            }
        }
    }
}

/// The API server's words when it refuses `grant`'s verb.
fn refusal_words(grant: &Grant) -> String {
    format!(
        "cannot {} resource \"{}\"",
        grant.verb,
        grant.base_resource()
    )
}

/// How many lines of `log` say `words` (quotes escaped or not).
fn lines_saying(log: &str, words: &str) -> usize {
    log.lines()
        .filter(|line| line.replace('\\', "").contains(words))
        .count()
}

/// The lines of `log` that tell of a request refused (403).
fn refusals(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.to_ascii_lowercase().contains("forbidden"))
        .collect()
}

/// The operator, at home, keeps copies in member `a` as the ServiceAccount
/// of the member side (`helm install --skip-crds --set
/// memberSide.enabled=true` in the member), with the release's token in
/// the kubeconfig Secret: its whole job there (see [`Job::run`]), and no
/// request refused (its log, at debug, names every failed write and
/// watch). The release holds the member side alone and no CRD, and its
/// uninstall takes the cluster-scoped RBAC with it.
#[tokio::test]
async fn operator_as_the_member_sides_service_account_does_its_whole_job() {
    let t = TestNs::new("member-side").await;
    let _up = OUTAGE.read().await;
    let a = member("a").await;
    let ns = a.ns(&t, "copyrator").await;
    let release = format!("copyrator-member-{}", random5());
    let guard = Release {
        name: release.clone(),
        namespace: ns.clone(),
        kubeconfig: Some(a.kubeconfig_path.clone()),
    };
    // Its copy protection covers this test's labelled namespace alone: the
    // job below edits copies as the member's admin to see them restored.
    let protect = format!(
        "copyProtection.namespaceSelector.matchLabels.copyrator-test-protect={}",
        t.prefix
    );
    let mut install = guard.helm();
    install.args([
        "install",
        &release,
        &chart_dir(),
        "--namespace",
        &ns,
        "--skip-crds",
        "--set",
        "memberSide.enabled=true",
        "--set",
        &protect,
    ]);
    run(install, "helm install (the member side)");
    let mut manifest = guard.helm();
    manifest.args(["get", "manifest", &release, "--namespace", &ns]);
    let docs = documents(&run(manifest, "helm get manifest"), "the release");
    assert_eq!(objects(&docs), member_side_objects(&release));
    let crd = Api::<CustomResourceDefinition>::all(a.client.clone())
        .get_opt(CRD_NAME)
        .await
        .expect("reading the CRDs of member a");
    assert!(
        crd.is_none(),
        "--skip-crds left the CRD out, yet member a has it"
    );

    // The token that does not expire, which the member's
    // kube-controller-manager writes into the release's Secret, with the CA
    // that signs the member's API server certificate (as docs/clusters.md
    // builds the kubeconfig from them).
    let secret_name = format!("{release}-token");
    let secrets = Api::<Secret>::namespaced(a.client.clone(), &ns);
    let (token, ca) = wait_until(
        format!("the token in {ns}/{secret_name} of member a"),
        TIMEOUT,
        async || {
            let secret = secrets.get(&secret_name).await.map_err(|e| err_msg(&e))?;
            let data = secret.data.unwrap_or_default();
            match (data.get("token"), data.get("ca.crt")) {
                (Some(token), Some(ca)) if !token.0.is_empty() => Ok((
                    String::from_utf8(token.0.clone()).expect("a token is text"),
                    ca.0.clone(),
                )),
                _ => Err(format!("data keys {:?}", data.keys().collect::<Vec<_>>())),
            }
        },
    )
    .await;
    let (server, admin_ca) = a.server_and_ca();
    assert_eq!(
        b64(&ca),
        admin_ca,
        "the token Secret's ca.crt is not the CA of {server}"
    );
    let kubeconfig = a.kubeconfig_with_token(&token);

    // The token is the ServiceAccount's: what the role leaves out is refused.
    let as_member_side = client_of_yaml(&kubeconfig)
        .await
        .expect("a client of the token");
    let pods = Api::<Pod>::all(as_member_side.clone())
        .list(&ListParams::default().limit(1))
        .await;
    assert!(
        matches!(&pods, Err(kube::Error::Api(s)) if s.code == 403),
        "listing Pods with the member side's token: {pods:?}"
    );
    Api::<ConfigMap>::all(as_member_side.clone())
        .list(&ListParams::default().labels(LABEL_RULE_UID).limit(1))
        .await
        .expect("listing copies with the member side's token");

    member_copies_are_read_only_but_to_the_member_side(&t, &a, &as_member_side).await;

    let stage = Stage::new(&t, &a, &kubeconfig).await;
    let protection = format!("{release}-copies-read-only");
    let mut operator = stage.start_operator_with(&["--member-copy-protection", &protection]);
    let job = Job::new(&stage, TIMEOUT);
    if let Err(stopped) = job.run().await {
        panic!(
            "the job stopped at \"{}\" after {}: {}",
            stopped.step,
            job.steps.durations(),
            stopped.last
        );
    }
    println!("the job's steps: {}", job.steps.durations());
    let upgrade = || {
        let mut upgrade = guard.helm();
        upgrade.args([
            "upgrade",
            &release,
            &chart_dir(),
            "--namespace",
            &ns,
            "--reuse-values",
        ]);
        run(upgrade, "helm upgrade (the member side)");
    };
    members_protection_is_followed(&stage, &operator, &protection, upgrade).await;
    operator.assert_running();
    let log = operator.logs();
    let refused = refusals(&log);
    assert!(
        refused.is_empty(),
        "member a refused {} requests of the member side's ServiceAccount:\n{}",
        refused.len(),
        refused.join("\n")
    );
    drop(operator);

    // Uninstalled, the ClusterRole and its binding are gone from the member.
    drop(guard);
    let roles = Api::<ClusterRole>::all(a.client.clone());
    let bindings = Api::<ClusterRoleBinding>::all(a.client.clone());
    assert!(
        roles
            .get_opt(&release)
            .await
            .expect("a ClusterRole")
            .is_none(),
        "the ClusterRole {release} is left in member a after helm uninstall"
    );
    assert!(
        bindings
            .get_opt(&release)
            .await
            .expect("a ClusterRoleBinding")
            .is_none(),
        "the ClusterRoleBinding {release} is left in member a after helm uninstall"
    );
}

/// The operator follows member `a`'s copy protection `protection` (read as
/// the member side's account, by name): in force, reported off within 30 s
/// of its binding's deletion, with a Warning Event on the member's entry in
/// the inventory at home, and in force again once `upgrade` (the member
/// side's `helm upgrade`) puts the binding back.
async fn members_protection_is_followed(
    stage: &Stage<'_>,
    operator: &Operator,
    protection: &str,
    upgrade: impl FnOnce(),
) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let a = stage.member;
    wait_copy_protection(operator.port, &a.name, 1.0).await;
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(a.client.clone());
    let deleted = Instant::now();
    bindings
        .delete(protection, &kube::api::DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting member a's binding: {}", err_msg(&e)));
    wait_copy_protection(operator.port, &a.name, 0.0).await;
    let entry = a.secret_name();
    // Said within 30 s of the deletion: the Event's deadline.
    let deadline = Duration::from_secs(30).saturating_sub(deleted.elapsed());
    let event = wait_protection_off_event(stage.t, (&stage.op, &entry), deadline).await;
    let took = deleted.elapsed();
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("copies in cluster {}", a.name))
            && note.contains(&format!(
                "the ValidatingAdmissionPolicyBinding {protection} is missing"
            )),
        "{note}"
    );
    upgrade();
    wait_copy_protection(operator.port, &a.name, 1.0).await;
    println!(
        "member protection: the binding's deletion said within {} ms",
        took.as_millis()
    );
}

/// In a namespace of member `a` the release protects, a live copy (as the
/// operator's copies are labelled and annotated) refuses the member's
/// admin, naming its source and rule, and lets the member side's account,
/// which the operator writes as there, change it (dry runs both).
async fn member_copies_are_read_only_but_to_the_member_side(
    t: &TestNs,
    a: &crate::common::members::Member,
    as_member_side: &kube::Client,
) {
    use kube::api::{Patch, PatchParams, PostParams};
    let protected = a
        .ns_labelled(t, "protected", &[("copyrator-test-protect", &t.prefix)])
        .await;
    let copy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "pull", "namespace": protected,
                     "labels": {LABEL_RULE_UID: "0a1b2c3d"},
                     "annotations": {"copyrator.flant.com/source": "platform/pull",
                                     "copyrator.flant.com/rule": "platform/registry"}},
        "data": {"k": "v"},
    }))
    .expect("a copy");
    Api::<ConfigMap>::namespaced(a.client.clone(), &protected)
        .create(&PostParams::default(), &copy)
        .await
        .unwrap_or_else(|e| panic!("a copy in member a: {}", err_msg(&e)));
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let edit = json!({"data": {"k": "edited"}});
    let said = "copy of platform/pull, kept by rule platform/registry";
    let as_admin = Api::<ConfigMap>::namespaced(a.client.clone(), &protected);
    wait_until("member a's admin refused", TIMEOUT, async || match as_admin
        .patch("pull", &dry_run, &Patch::Merge(&edit))
        .await
    {
        Err(e) if err_msg(&e).contains(said) => Ok(()),
        other => Err(format!(
            "{:?}",
            other.map(|_| "let through").map_err(|e| err_msg(&e))
        )),
    })
    .await;
    Api::<ConfigMap>::namespaced(as_member_side.clone(), &protected)
        .patch("pull", &dry_run, &Patch::Merge(&edit))
        .await
        .unwrap_or_else(|e| panic!("the member side's account refused: {}", err_msg(&e)));
}

// ===========================================================================
// Every verb is needed

/// What the clusters show when the operator lacks a verb in the member,
/// besides the member's refusal of that very verb in its own words (in a
/// rule's status or in the operator's log, in every case).
#[derive(Clone, Copy, Debug)]
enum Evidence {
    /// The member's namespaces or copies are never listed, so no pass runs
    /// there: nothing is copied, both rules list the member as Progressing.
    Unlisted,
    /// The new namespace t2 is never filled: rule cms counts one target
    /// namespace in the member.
    NamespaceUnseen,
    /// The copy of this kind in t1 keeps an edit while its rule is synced
    /// in the member: the edit was never seen.
    EditUnseen(Kind),
    /// The rule of this kind lists the member not ready, SyncFailed, in the
    /// API server's words.
    Refused(Kind),
}

/// For each verb the member side grants (default values): the first step
/// of the job that fails without it, and what the clusters then show.
fn expectations() -> BTreeMap<Grant, (String, Evidence)> {
    use Evidence::*;
    let mut out = BTreeMap::new();
    let mut expect = |resource: &str, verb: &str, step: &str, evidence| {
        out.insert(Grant::new("", resource, verb), (step.to_string(), evidence));
    };
    // No pass runs in a member before its namespaces and copies of every
    // kind are listed, so the first step fails.
    expect("namespaces", "list", "ConfigMap copied", Unlisted);
    expect(
        "namespaces",
        "watch",
        "new namespace filled",
        NamespaceUnseen,
    );
    for (kind, resource) in [(CM, "configmaps"), (SECRET, "secrets")] {
        let step = |what: &str| format!("{kind:?} {what}");
        // A rule that adopts reads a place before it writes there: first
        // where the rules, widened, adopt.
        expect(resource, "get", &step("adopted"), Refused(kind));
        expect(resource, "list", "ConfigMap copied", Unlisted);
        expect(resource, "watch", &step("copy repaired"), EditUnseen(kind));
        expect(resource, "create", &step("copied"), Refused(kind));
        // The first update: a changed source; the copy watch is not needed
        // for it (the pass holds the version it wrote).
        expect(resource, "update", &step("copy updated"), Refused(kind));
        expect(resource, "delete", &step("pruned"), Refused(kind));
        // Adoption is the first metadata patch of a copy; a hand-over the
        // next.
        expect(resource, "patch", &step("adopted"), Refused(kind));
    }
    out
}

/// How long a step of a case may take. The control does the whole job in
/// the same conditions (every case at once), each step well within it.
const STEP_BUDGET: Duration = Duration::from_secs(20);

/// One run of the job, with the member side's ClusterRole minus `removed`.
struct Case {
    removed: Option<Grant>,
    outcome: Result<(), Stopped>,
    /// The steps that happened, with when (since the job started).
    passed: Vec<(String, Duration)>,
    /// What the clusters showed when the job stopped (with a verb removed).
    evidence: Result<String, String>,
    /// The lines of the operator's log that tell of a refusal.
    refused: Vec<String>,
    took: Duration,
    log: std::path::PathBuf,
    t: TestNs,
}

async fn run_case(
    removed: Option<&Grant>,
    granted: &BTreeSet<Grant>,
    member: &Member,
    cluster: &ClusterScoped,
    evidence: Option<Evidence>,
) -> Case {
    let start = Instant::now();
    let t = TestNs::new("member-verbs").await;
    let grants: BTreeSet<Grant> = granted
        .iter()
        .filter(|g| Some(*g) != removed)
        .cloned()
        .collect();
    let home_of_id = member.ns(&t, "id").await;
    let id =
        Identity::create_in_member(&t, member, cluster, &home_of_id, "copyrator", &grants).await;
    let denied: BTreeSet<Grant> = removed.cloned().into_iter().collect();
    id.wait_effective(&member.client, &home_of_id, &grants, &denied)
        .await;
    let kubeconfig = std::fs::read_to_string(&id.kubeconfig).expect("the identity's kubeconfig");
    let stage = Stage::new(&t, member, &kubeconfig).await;
    let operator = stage.start_operator();
    let job = Job::new(&stage, STEP_BUDGET);
    let outcome = job.run().await;
    let log = operator.logs();
    let evidence = match (removed, evidence, &outcome) {
        (Some(removed), Some(evidence), Err(_)) => {
            match job.evidence(evidence, removed, &log).await {
                Err(missing) => Err(format!("{missing}\n  {}", job.diagnosis(&log).await)),
                found => found,
            }
        }
        _ => Ok("-".to_string()),
    };
    let passed = job.steps.passed();
    let log_path = operator.log_path.clone();
    drop(operator);
    Case {
        removed: removed.cloned(),
        outcome,
        passed,
        evidence,
        refused: refusals(&log).into_iter().map(str::to_string).collect(),
        took: start.elapsed(),
        log: log_path,
        t,
    }
}

/// Every verb the member side's ClusterRole grants (default values) is
/// needed: the job runs in member `a` once with exactly the rendered role
/// (the control, which must do all of it with no request refused), and
/// once per granted verb with the rendered role minus that verb, each case
/// as a ServiceAccount of its own in the member, with its own namespaces
/// and operator, [`CASES_AT_ONCE`](crate::common::rbac::CASES_AT_ONCE) at
/// a time (the whole job, each step within [`STEP_BUDGET`]). Without a verb, the job must stop at the step that uses it, the
/// clusters must show why (see [`Evidence`]), and the member's refusal of
/// that very verb must be there in its words. A verb whose removal changes
/// nothing fails the test: the member side must not grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_verb_the_member_side_grants_is_needed() {
    let _up = OUTAGE.read().await;
    let a = member("a").await;
    let granted = member_grants(&render(&MEMBER_SIDE));
    let expected = expectations();
    let unexpected: Vec<String> = granted
        .iter()
        .filter(|g| !expected.contains_key(*g))
        .map(ToString::to_string)
        .collect();
    assert!(
        unexpected.is_empty(),
        "the member side grants {unexpected:?}, and this test does not say what removing it \
         breaks: add it to expectations() (it fails, saying so, if nothing breaks)"
    );
    let stale: Vec<String> = expected
        .keys()
        .filter(|g| !granted.contains(*g))
        .map(ToString::to_string)
        .collect();
    assert!(
        stale.is_empty(),
        "expectations() lists {stale:?}, which the member side no longer grants"
    );

    let cluster = ClusterScoped::in_cluster_of(a.kubeconfig_path.clone());
    let started = Instant::now();
    let runs: Vec<Option<&Grant>> = std::iter::once(None)
        .chain(granted.iter().map(Some))
        .collect();
    let cases = run_cases(&runs, |removed| {
        run_case(
            *removed,
            &granted,
            &a,
            &cluster,
            removed.map(|g| expected[g].1),
        )
    })
    .await;
    let took = started.elapsed();

    let mut problems = Vec::new();
    let mut table = Vec::new();
    for case in &cases {
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
                    Ok(()) if !case.refused.is_empty() => Some(format!(
                        "the control's requests were refused:\n{}",
                        case.refused.join("\n")
                    )),
                    Ok(()) => None,
                };
                (format!("{stopped}, no request refused"), problem)
            }
            Some(grant) => {
                let (step, _) = &expected[grant];
                let mut problem = match &case.outcome {
                    Ok(()) => Some(format!(
                        "removing {grant} changed nothing: the operator does not need it in a \
                         member, so the member side must not grant it"
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
                let evidence = case.evidence.as_deref().unwrap_or("?");
                (format!("{stopped}; {evidence}"), problem)
            }
        };
        table.push(format!(
            "  {what:<22} {row} [{} steps, {:.1?}]",
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
        "verb removed in member {} → what failed ({} cases, {CASES_AT_ONCE} at a time, {took:.1?}):\n{}",
        a.name,
        cases.len(),
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
