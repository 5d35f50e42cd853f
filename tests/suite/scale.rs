//! Scale: fifty rules whose selectors overlap, over twenty sources in the
//! operator's namespace, copying into six target namespaces; against a real
//! control plane and the real binary.
//!
//! The rules are data ([`Design`]): the test creates them from it and
//! computes from the same data, with a model of selectors and targets of its
//! own ([`expected_copies`]), which copy every rule must own. It then waits
//! until the target namespaces hold exactly those copies (none missing, none
//! extra, each equal to its source) and every rule's status counts them.
//!
//! Two rules that copy the same source into the same namespace would want
//! one name: whichever writes first keeps it, the other reports a conflict,
//! and which one that is depends on timing. So the rules are grouped in
//! families: within a family the rules select disjoint sources and share
//! target namespaces; across families they select overlapping sources (every
//! source is selected by five or six rules) but never share a target
//! namespace. [`expected_copies`] panics if a change to the design breaks
//! that.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;

/// Time to converge after a change: fifty rules and their copies, on a
/// shared machine of two cores.
const DEADLINE: Duration = Duration::from_secs(60);
/// Sources `s00`..`s19`; `s<i>` carries `a=i%5`, `b=i%4` (together one of
/// the 20 pairs) and, for every third, `c=edge`.
const SOURCES: usize = 20;
/// Target namespaces `t0`..`t5`.
const TARGETS: usize = 6;
/// Target namespace labels: `left` for `t0`..`t2`, `right` for `t3`..`t5`.
const SIDE: &str = "copyrator-test/side";
/// Target namespace label: the namespace's number.
const SLOT: &str = "copyrator-test/slot";
/// How many problems of each sort a failure message lists.
const LISTED: usize = 25;

// ---------------------------------------------------------------------------
// the model: label selectors and targets, as docs/rules.md defines them

#[derive(Clone, Debug)]
enum Req {
    In(&'static str, Vec<String>),
    NotIn(&'static str, Vec<String>),
    Exists(&'static str),
    DoesNotExist(&'static str),
}

impl Req {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Req::In(key, values) => labels.get(*key).is_some_and(|v| values.contains(v)),
            Req::NotIn(key, values) => labels.get(*key).is_none_or(|v| !values.contains(v)),
            Req::Exists(key) => labels.contains_key(*key),
            Req::DoesNotExist(key) => !labels.contains_key(*key),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Req::In(key, values) => json!({"key": key, "operator": "In", "values": values}),
            Req::NotIn(key, values) => json!({"key": key, "operator": "NotIn", "values": values}),
            Req::Exists(key) => json!({"key": key, "operator": "Exists"}),
            Req::DoesNotExist(key) => json!({"key": key, "operator": "DoesNotExist"}),
        }
    }
}

fn values(v: &[usize]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

/// A label selector: every label of `labels` and every requirement of `exprs`.
#[derive(Clone, Debug, Default)]
struct Selector {
    labels: BTreeMap<String, String>,
    exprs: Vec<Req>,
}

impl Selector {
    fn new(labels: &[(&str, String)], exprs: Vec<Req>) -> Selector {
        Selector {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            exprs,
        }
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exprs.iter().all(|r| r.matches(labels))
    }

    /// `{matchLabels, matchExpressions}`; with `plain` and no expressions,
    /// the original form, a plain map of labels.
    fn to_json(&self, plain: bool) -> Value {
        if plain && self.exprs.is_empty() {
            return json!(self.labels);
        }
        let mut v = json!({});
        if !self.labels.is_empty() {
            v["matchLabels"] = json!(self.labels);
        }
        if !self.exprs.is_empty() {
            v["matchExpressions"] = self.exprs.iter().map(Req::to_json).collect();
        }
        v
    }
}

/// `*` matches any run of characters, `?` one; the whole name must match.
fn glob_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((b'?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

#[derive(Clone, Debug, Default)]
struct Targets {
    namespace_selector: Option<Selector>,
    include: Vec<String>,
    exclude: Vec<String>,
}

impl Targets {
    fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| glob_matches(g, name)))
            && !self.exclude.iter().any(|g| glob_matches(g, name))
            && self
                .namespace_selector
                .as_ref()
                .is_none_or(|s| s.matches(labels))
    }
}

#[derive(Clone, Debug)]
struct RuleDef {
    name: String,
    selector: Selector,
    /// Written in the original form (a plain map of labels).
    plain: bool,
    targets: Targets,
}

impl RuleDef {
    fn body(&self) -> Value {
        let mut body = rule_spec(CM, self.selector.to_json(self.plain), &self.targets.include);
        if !self.targets.exclude.is_empty() {
            body = with(body, "/spec/targets/exclude", json!(self.targets.exclude));
        }
        if let Some(s) = &self.targets.namespace_selector {
            body = with(body, "/spec/targets/namespaceSelector", s.to_json(false));
        }
        body
    }
}

// ---------------------------------------------------------------------------
// the design

/// Everything the test creates, as data.
struct Design {
    /// The test's prefix: every namespace is `<prefix>-<suffix>`.
    prefix: String,
    /// The operator's namespace: the rules and the sources live there.
    op: String,
    /// Target namespace -> its labels.
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Source name -> its labels.
    sources: BTreeMap<String, BTreeMap<String, String>>,
    rules: Vec<RuleDef>,
}

fn source_name(i: usize) -> String {
    format!("s{i:02}")
}

fn target_suffix(k: usize) -> String {
    format!("t{k}")
}

impl Design {
    /// The world of a test whose namespaces start with `prefix` (see
    /// [`TestNs::name`]).
    fn new(prefix: &str) -> Design {
        let ns = |suffix: &str| format!("{prefix}-{suffix}");
        let namespaces = (0..TARGETS)
            .map(|k| {
                let side = if k < TARGETS / 2 { "left" } else { "right" };
                let labels = map(&[(SIDE, side), (SLOT, &k.to_string())]);
                (ns(&target_suffix(k)), labels)
            })
            .collect();
        let sources = (0..SOURCES)
            .map(|i| {
                let mut labels = map(&[
                    (TEST_LABEL, prefix),
                    ("a", &(i % 5).to_string()),
                    ("b", &(i % 4).to_string()),
                ]);
                if i % 3 == 0 {
                    labels.insert("c".into(), "edge".into());
                }
                (source_name(i), labels)
            })
            .collect();

        let test = || (TEST_LABEL, prefix.to_string());
        let n = |v: usize| v.to_string();
        let all = format!("{prefix}-t*");
        let mut rules = Vec::new();
        let mut rule = |name: String, selector: Selector, plain: bool, targets: Targets| {
            rules.push(RuleDef {
                name,
                selector,
                plain,
                targets,
            })
        };
        // Rows (5): a=x, in the original form; into t0 and t1 (the left side
        // but t2).
        for x in 0..5 {
            rule(
                format!("row-{x}"),
                Selector::new(&[test(), ("a", n(x))], vec![]),
                true,
                Targets {
                    namespace_selector: Some(Selector::new(&[(SIDE, "left".into())], vec![])),
                    include: vec![all.clone()],
                    exclude: vec![ns("t2")],
                },
            );
        }
        // Columns (4): b In [y]; into t2, by its name.
        for y in 0..4 {
            rule(
                format!("col-{y}"),
                Selector::new(&[test()], vec![Req::In("b", values(&[y]))]),
                false,
                Targets {
                    include: vec![ns("t2")],
                    ..Targets::default()
                },
            );
        }
        // Cells (20): a=x and b=y, one source each; into t3, by a `?` glob
        // and a namespace selector on its number.
        for x in 0..5 {
            for y in 0..4 {
                rule(
                    format!("cell-{x}-{y}"),
                    Selector::new(&[test(), ("a", n(x)), ("b", n(y))], vec![]),
                    false,
                    Targets {
                        namespace_selector: Some(Selector::new(
                            &[],
                            vec![Req::In(SLOT, values(&[3]))],
                        )),
                        include: vec![format!("{prefix}-t?")],
                        exclude: vec![],
                    },
                );
            }
        }
        // Halves of rows (10): a=x, and b In [0, 1] or NotIn [0, 1]; into t4.
        for x in 0..5 {
            for (half, req) in [
                ("lo", Req::In("b", values(&[0, 1]))),
                ("hi", Req::NotIn("b", values(&[0, 1]))),
            ] {
                rule(
                    format!("half-{x}-{half}"),
                    Selector::new(&[test(), ("a", n(x))], vec![req]),
                    false,
                    Targets {
                        include: vec![ns("t4")],
                        ..Targets::default()
                    },
                );
            }
        }
        // Edges and the rest (9): b=y with c, or a=x without it; into t5 (the
        // right side but t3 and t4).
        let t5 = || Targets {
            namespace_selector: Some(Selector::new(&[(SIDE, "right".into())], vec![])),
            include: vec![all.clone()],
            exclude: vec![ns("t3"), ns("t4")],
        };
        for y in 0..4 {
            rule(
                format!("edge-{y}"),
                Selector::new(&[test(), ("b", n(y))], vec![Req::Exists("c")]),
                false,
                t5(),
            );
        }
        for x in 0..5 {
            rule(
                format!("inner-{x}"),
                Selector::new(&[test(), ("a", n(x))], vec![Req::DoesNotExist("c")]),
                false,
                t5(),
            );
        }
        // Twelve sources but no target: every namespace it includes is
        // excluded too.
        rule(
            "nowhere".into(),
            Selector::new(&[test()], vec![Req::In("a", values(&[0, 1, 2]))]),
            false,
            Targets {
                include: vec![all.clone()],
                exclude: vec![all.clone()],
                ..Targets::default()
            },
        );
        // Every target but no source.
        rule(
            "nothing".into(),
            Selector::new(&[test(), ("a", n(9))], vec![]),
            true,
            Targets {
                include: vec![all.clone()],
                ..Targets::default()
            },
        );

        let design = Design {
            prefix: prefix.to_string(),
            op: ns("op"),
            namespaces,
            sources,
            rules,
        };
        // The operator sees every namespace of the cluster; the model sees
        // only the test's target namespaces. That is the same as long as no
        // rule reaches beyond them.
        for r in &design.rules {
            assert!(
                !r.targets.include.is_empty()
                    && r.targets
                        .include
                        .iter()
                        .all(|g| g.starts_with(&format!("{prefix}-t"))),
                "rule {} may reach namespaces of other tests: include {:?}",
                r.name,
                r.targets.include
            );
            assert!(
                r.selector.labels.get(TEST_LABEL).map(String::as_str) == Some(prefix),
                "rule {} may select objects other than this test's sources",
                r.name
            );
        }
        design
    }

    fn rule(&self, name: &str) -> &RuleDef {
        self.rules
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no rule {name} in the design"))
    }

    /// The sources `rule` selects, by name.
    fn selected<'a>(&'a self, rule: &'a RuleDef) -> impl Iterator<Item = &'a String> + 'a {
        self.sources
            .iter()
            .filter(|(_, labels)| rule.selector.matches(labels))
            .map(|(name, _)| name)
    }

    /// The target namespaces of `rule`.
    fn targets<'a>(&'a self, rule: &'a RuleDef) -> impl Iterator<Item = &'a String> + 'a {
        self.namespaces
            .iter()
            .filter(|(name, labels)| *name != &self.op && rule.targets.matches(name, labels))
            .map(|(name, _)| name)
    }

    /// The order the second test deletes the rules in: for each source in
    /// turn, the rules still there that copy it, so that rules whose copies
    /// overlap are deleted next to each other and each deletion leaves
    /// rules of other families copying the same sources; then the rules
    /// that copy nothing.
    fn deletion_order(&self) -> Vec<&RuleDef> {
        let mut order: Vec<&RuleDef> = Vec::new();
        for source in self.sources.keys() {
            for r in &self.rules {
                let copies_it = self.selected(r).any(|s| s == source);
                if copies_it && !order.iter().any(|o| o.name == r.name) {
                    order.push(r);
                }
            }
        }
        for r in &self.rules {
            if !order.iter().any(|o| o.name == r.name) {
                order.push(r);
            }
        }
        order
    }
}

/// A copy as the test compares them: (target namespace, name, rule).
type Copy = (String, String, String);

/// The copies that `rules` together must own in the target namespaces.
/// Panics when two of them would copy into one name (see the module
/// comment): the expectation would then depend on timing.
fn expected_copies(design: &Design, rules: &[&RuleDef]) -> BTreeSet<Copy> {
    let mut owner: BTreeMap<(String, String), &str> = BTreeMap::new();
    for r in rules {
        for ns in design.targets(r) {
            for name in design.selected(r) {
                if let Some(other) = owner.insert((ns.clone(), name.clone()), &r.name) {
                    panic!(
                        "the design is wrong: rules {other} and {} both copy {name} into {ns}",
                        r.name
                    );
                }
            }
        }
    }
    owner
        .into_iter()
        .map(|((ns, name), rule)| (ns, name, rule.to_string()))
        .collect()
}

/// What the status of `rule` must count: (sources, targetNamespaces, copies).
fn expected_counts(design: &Design, rule: &RuleDef) -> (u64, u64, u64) {
    let sources = design.selected(rule).count() as u64;
    let targets = design.targets(rule).count() as u64;
    (sources, targets, sources * targets)
}

// ---------------------------------------------------------------------------
// the world in the cluster

struct World {
    design: Design,
    /// Source name -> the source as created.
    sources: BTreeMap<String, Obj>,
    /// Rule uid -> rule name, of every rule created (deleted ones included).
    rules_by_uid: BTreeMap<String, String>,
    /// Rule name -> uid.
    uids: BTreeMap<String, String>,
    _operator: Operator,
}

/// Creates the design's namespaces, half the sources, the operator, the
/// rules and then the other half of the sources (so that both a rule
/// finding its sources and a source finding its rules are exercised).
async fn build(t: &TestNs) -> World {
    let design = Design::new(&t.prefix);
    let started = Instant::now();
    let op = t.ns("op").await;
    assert_eq!(op, design.op, "TestNs names namespaces <prefix>-<suffix>");
    for k in 0..TARGETS {
        let suffix = target_suffix(k);
        let labels = &design.namespaces[&t.name(&suffix)];
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        t.ns_labelled(&suffix, &labels).await;
    }
    let mut sources = BTreeMap::new();
    let create_sources = async |range: std::ops::Range<usize>,
                                sources: &mut BTreeMap<String, Obj>| {
        for i in range {
            let name = source_name(i);
            let labels: Vec<(&str, &str)> = design.sources[&name]
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let data = [
                ("i", i.to_string()),
                ("payload", format!("value of {name}")),
            ];
            let data: Vec<(&str, &str)> = data.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let source = t.create_plain(CM, &op, &name, &labels, &data).await;
            sources.insert(name, source);
        }
    };
    create_sources(0..SOURCES / 2, &mut sources).await;

    let mut operator = Operator::start(t, &op, &[]);
    operator.wait_ready().await;

    let mut rules_by_uid = BTreeMap::new();
    let mut uids = BTreeMap::new();
    for r in &design.rules {
        let created = t.create_rule(&op, &r.name, r.body()).await;
        let uid = created["metadata"]["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("rule {op}/{} was created without a uid", r.name))
            .to_string();
        rules_by_uid.insert(uid.clone(), r.name.clone());
        uids.insert(r.name.clone(), uid);
    }
    create_sources(SOURCES / 2..SOURCES, &mut sources).await;
    println!(
        "{}: {} target namespaces, {} sources, {} rules created in {:.1} s",
        t.prefix,
        TARGETS,
        SOURCES,
        design.rules.len(),
        started.elapsed().as_secs_f64()
    );
    World {
        design,
        sources,
        rules_by_uid,
        uids,
        _operator: operator,
    }
}

impl World {
    /// A namespace as messages show it: without the test's prefix.
    fn short<'a>(&self, ns: &'a str) -> &'a str {
        ns.strip_prefix(&self.design.prefix)
            .and_then(|s| s.strip_prefix('-'))
            .unwrap_or(ns)
    }

    fn show(&self, (ns, name, rule): &Copy) -> String {
        format!("{}/{name} by {rule}", self.short(ns))
    }

    /// Every copy (a ConfigMap with the rule-uid label) in the target
    /// namespaces that names a rule of this test's namespace, with the rule
    /// its label names. A copy of another test's rule is not counted: a
    /// rule without targets (tests/suite/safety.rs) writes into every
    /// namespace of the cluster.
    async fn copies(&self, t: &TestNs) -> Result<BTreeMap<Copy, Obj>, String> {
        let lp = ListParams::default().labels(LABEL_RULE_UID);
        let mut copies = BTreeMap::new();
        for ns in self.design.namespaces.keys() {
            let list = Api::<ConfigMap>::namespaced(t.client.clone(), ns)
                .list(&lp)
                .await
                .map_err(|e| format!("listing the copies in {ns}: {}", err_msg(&e)))?;
            for copy in list.items.into_iter().map(Obj::from_configmap) {
                let uid = copy.label(LABEL_RULE_UID).unwrap_or_default();
                let ours = copy
                    .annotation(ANNOTATION_RULE)
                    .is_some_and(|rule| rule.starts_with(&format!("{}/", self.design.op)));
                let rule = match self.rules_by_uid.get(uid) {
                    Some(name) => name.clone(),
                    // Another test's rule: not this test's to count.
                    None if !ours => continue,
                    None => format!("an unknown rule (uid {uid})"),
                };
                copies.insert((copy.namespace.clone(), copy.name.clone(), rule), copy);
            }
        }
        Ok(copies)
    }

    /// `Ok` when the target namespaces hold exactly `expected`, each copy
    /// right (data, tracking labels and annotations: [`check_copy`]);
    /// otherwise what is missing, extra and wrong.
    async fn compare(&self, t: &TestNs, expected: &BTreeSet<Copy>) -> Result<(), String> {
        let seen = self.copies(t).await?;
        let missing: Vec<&Copy> = expected.iter().filter(|c| !seen.contains_key(c)).collect();
        let extra: Vec<&Copy> = seen.keys().filter(|c| !expected.contains(c)).collect();
        let mut wrong = Vec::new();
        for (copy, obj) in &seen {
            if !expected.contains(copy) {
                continue;
            }
            let (_, name, rule) = copy;
            let source = &self.sources[name];
            if let Err(e) = check_copy(obj, source, &self.design.op, rule, &self.uids[rule]) {
                wrong.push(format!(
                    "{} by {rule}",
                    e.replace(&format!("{}-", self.design.prefix), "")
                ));
            }
        }
        if missing.is_empty() && extra.is_empty() && wrong.is_empty() {
            return Ok(());
        }
        let list = |items: Vec<String>| -> String {
            let more = items.len().saturating_sub(LISTED);
            let mut s: Vec<String> = items.into_iter().take(LISTED).collect();
            if more > 0 {
                s.push(format!("and {more} more"));
            }
            s.join(", ")
        };
        let mut out = format!(
            "{} copies expected, {} in the cluster: {} missing, {} extra, {} wrong (namespaces \
             without the prefix {}-)",
            expected.len(),
            seen.len(),
            missing.len(),
            extra.len(),
            wrong.len(),
            self.design.prefix,
        );
        if !missing.is_empty() {
            out += &format!(
                "\n  missing: {}",
                list(missing.iter().map(|c| self.show(c)).collect())
            );
        }
        if !extra.is_empty() {
            out += &format!(
                "\n  extra: {}",
                list(extra.iter().map(|c| self.show(c)).collect())
            );
        }
        if !wrong.is_empty() {
            out += &format!("\n  wrong: {}", list(wrong));
        }
        Err(out)
    }

    /// Waits until the target namespaces hold exactly the copies of `rules`.
    async fn wait_copies(&self, t: &TestNs, rules: &[&RuleDef], when: &str) -> Duration {
        let expected = expected_copies(&self.design, rules);
        let started = Instant::now();
        wait_until(
            format!(
                "{when}: exactly the {} expected copies of {} rules, each equal to its source",
                expected.len(),
                rules.len()
            ),
            DEADLINE,
            async || self.compare(t, &expected).await,
        )
        .await;
        started.elapsed()
    }

    /// Waits until the status of each of `rules` says Ready (Synced, no
    /// conflict) at its generation with the counts the design gives.
    async fn wait_statuses(&self, t: &TestNs, rules: &[&RuleDef], when: &str) {
        wait_until(
            format!(
                "{when}: {} rules Ready (Synced) with the expected sources, targetNamespaces and copies",
                rules.len()
            ),
            DEADLINE,
            async || {
                let listed = t
                    .rules(&self.design.op)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| format!("listing the rules: {}", err_msg(&e)))?;
                let by_name: BTreeMap<String, Value> = listed
                    .items
                    .into_iter()
                    .filter_map(|o| {
                        let name = o.metadata.name.clone()?;
                        Some((name, serde_json::to_value(o).ok()?))
                    })
                    .collect();
                let mut wrong = Vec::new();
                for r in rules {
                    let Some(rule) = by_name.get(&r.name) else {
                        wrong.push(format!("{}: not there", r.name));
                        continue;
                    };
                    let (sources, targets, copies) = expected_counts(&self.design, r);
                    let reason = ready_condition(rule).map(|c| c["reason"].clone());
                    let got = (
                        status_u64(rule, "sources"),
                        status_u64(rule, "targetNamespaces"),
                        status_u64(rule, "copies"),
                        status_u64(rule, "conflictCount").unwrap_or(0),
                    );
                    let want = (Some(sources), Some(targets), Some(copies), 0);
                    if is_ready(rule).is_err() || reason != Some(json!("Synced")) || got != want {
                        wrong.push(format!(
                            "{}: (sources, targetNamespaces, copies, conflictCount) = {got:?}, \
                             want {want:?}; {}",
                            r.name,
                            short_status(rule)
                        ));
                    }
                }
                if wrong.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} of {} rules not as expected; {}",
                        wrong.len(),
                        rules.len(),
                        wrong.join("\n  ")
                    ))
                }
            },
        )
        .await;
    }
}

// ---------------------------------------------------------------------------
// the tests

#[test]
fn the_design_is_as_described() {
    let d = Design::new("t-x-abcde");
    assert_eq!(d.rules.len(), 50, "fifty rules");
    let names: BTreeSet<&str> = d.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), d.rules.len(), "rule names are unique");
    let all: Vec<&RuleDef> = d.rules.iter().collect();
    let expected = expected_copies(&d, &all);
    // Each source: twice by its row, once each by its column, cell, half
    // and edge-or-inner rule.
    assert_eq!(expected.len(), SOURCES * TARGETS, "{expected:?}");
    for source in d.sources.keys() {
        let selecting = d
            .rules
            .iter()
            .filter(|r| d.selected(r).any(|s| s == source))
            .count();
        assert!(
            selecting >= 5,
            "{source} is selected by {selecting} rules only"
        );
    }
    for r in &d.rules {
        let (sources, targets, _) = expected_counts(&d, r);
        match r.name.as_str() {
            "nowhere" => assert_eq!((sources, targets), (12, 0)),
            "nothing" => assert_eq!((sources, targets), (0, TARGETS as u64)),
            other => assert!(sources > 0 && targets > 0, "{other} copies nothing"),
        }
    }
    let order = d.deletion_order();
    let ordered: BTreeSet<&str> = order.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(ordered, names, "the deletion order deletes every rule once");
    assert_eq!(order.len(), d.rules.len());
    assert_eq!(
        order
            .iter()
            .take(6)
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        [
            "row-0",
            "col-0",
            "cell-0-0",
            "half-0-lo",
            "edge-0",
            "nowhere"
        ],
        "the rules copying s00 go first"
    );
    assert!(
        d.rule("nothing").plain,
        "the original selector form is used"
    );
}

#[tokio::test]
async fn fifty_rules_over_overlapping_sources_converge_to_exactly_the_expected_copies() {
    let started = Instant::now();
    let t = TestNs::new("scale-converge").await;
    let w = build(&t).await;
    let all: Vec<&RuleDef> = w.design.rules.iter().collect();
    let took = w.wait_copies(&t, &all, "after creating the world").await;
    println!(
        "{}: {} copies of {} rules right {:.1} s after the last source was created",
        t.prefix,
        expected_copies(&w.design, &all).len(),
        all.len(),
        took.as_secs_f64()
    );
    w.wait_statuses(&t, &all, "after creating the world").await;
    // Exactly, and still: nothing more arrives once the statuses are done.
    let expected = expected_copies(&w.design, &all);
    assert_for("exactly the expected copies", QUIET, async || {
        w.compare(&t, &expected).await
    })
    .await;
    println!(
        "{}: test done in {:.1} s",
        t.prefix,
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn deleting_rules_one_by_one_leaves_exactly_the_others_copies() {
    let started = Instant::now();
    let t = TestNs::new("scale-delete").await;
    let w = build(&t).await;
    let mut remaining: Vec<&RuleDef> = w.design.rules.iter().collect();
    w.wait_copies(&t, &remaining, "after creating the world")
        .await;
    w.wait_statuses(&t, &remaining, "after creating the world")
        .await;

    let order = w.design.deletion_order();
    let mut slowest = (Duration::ZERO, String::new());
    for (k, r) in order.iter().enumerate() {
        t.delete_rule(&w.design.op, &r.name).await;
        remaining.retain(|o| o.name != r.name);
        let when = format!(
            "after deleting rule {} ({} of {})",
            r.name,
            k + 1,
            order.len()
        );
        let took = w.wait_copies(&t, &remaining, &when).await;
        t.wait_rule_gone(
            &w.design.op,
            &r.name,
            "its finalizer has removed its copies",
        )
        .await;
        if took > slowest.0 {
            slowest = (took, r.name.clone());
        }
        if k + 1 == order.len() / 2 {
            // Halfway, the others' statuses still count their copies.
            w.wait_statuses(&t, &remaining, &when).await;
        }
    }
    assert!(remaining.is_empty());
    // No copy left, and the sources untouched.
    w.compare(&t, &BTreeSet::new())
        .await
        .unwrap_or_else(|e| panic!("after deleting every rule: {e}"));
    for (name, source) in &w.sources {
        let now = t.must_get(CM, &w.design.op, name).await;
        assert_eq!(
            now.resource_version, source.resource_version,
            "source {name} was written"
        );
    }
    println!(
        "{}: {} rules deleted one by one; the slowest to converge: {} ({:.1} s); test done in {:.1} s",
        t.prefix,
        order.len(),
        slowest.1,
        slowest.0.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

async fn copies_examined(port: u16) -> f64 {
    let (code, text) = http_get(port, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(code, 200, "GET /metrics");
    metric_family(&text, "copyrator_copies_examined_total")
        .expect("copyrator_copies_examined_total")
}

/// A new namespace costs the copies that belong in it, and a changed
/// source the copies of its name: never a walk over every copy of the
/// rule (which `copyrator_copies_examined_total` would show).
#[tokio::test]
async fn a_change_costs_the_copies_it_concerns_not_every_copy_of_the_rule() {
    const NAMESPACES: usize = 30;
    const SOURCES_HERE: usize = 8;
    let t = TestNs::new("scale-scoped").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..NAMESPACES {
        targets.push(t.ns(&format!("t{i:02}")).await);
    }
    let mut sources = Vec::new();
    for i in 0..SOURCES_HERE {
        sources.push(
            t.create_source(CM, &op, &format!("s{i}"), &[], &[("k", "v")])
                .await,
        );
    }
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let operator = Operator::start(&t, &op, &[]);
    let all = (NAMESPACES * SOURCES_HERE) as u64;
    let copies_are = |n: u64| {
        move |rule: &Value| match rule.pointer("/status/copies").and_then(Value::as_u64) {
            Some(c) if c == n => Ok(()),
            other => Err(format!("status.copies {other:?}, want {n}")),
        }
    };
    t.wait_rule(&op, "r", "every copy counted", copies_are(all))
        .await;
    // Quiet: the statuses and the watch events of the first pass are done.
    let before = wait_until("the examined count to stand still", DEADLINE, async || {
        let first = copies_examined(operator.port).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let second = copies_examined(operator.port).await;
        if first == second {
            Ok(second)
        } else {
            Err(format!("{first} then {second}"))
        }
    })
    .await;
    assert!(before >= all as f64, "the first pass looked at every copy");

    let added = t.ns("t-new").await;
    for s in &sources {
        t.wait_copy(CM, &added, s, &op, "r").await;
    }
    t.wait_rule(
        &op,
        "r",
        "the new copies counted",
        copies_are(all + SOURCES_HERE as u64),
    )
    .await;
    let after_namespace = copies_examined(operator.port).await;
    let cost = after_namespace - before;
    println!("a new namespace: {cost} copies examined of {all}");
    // Each of its copies is looked at by the namespace's pass and again
    // when its watch event comes, each time as a place and as a copy.
    assert!(
        cost <= (4 * SOURCES_HERE) as f64,
        "a new namespace with {SOURCES_HERE} copies made the passes look at {cost} copies; \
         a walk over the rule is {all}"
    );

    // One source changes: its copies in every namespace, not the others.
    let changed = t.set_data(CM, &op, "s0", &[("k", Some("changed"))]).await;
    for namespace in targets.iter().chain([&added]) {
        t.wait_copy(CM, namespace, &changed, &op, "r").await;
    }
    let cost = copies_examined(operator.port).await - after_namespace;
    let of_that_source = (NAMESPACES + 1) as f64;
    println!("a changed source: {cost} copies examined; {of_that_source} are its copies");
    assert!(
        cost <= 4.0 * of_that_source && cost < (all + SOURCES_HERE as u64) as f64,
        "a changed source made the passes look at {cost} copies; its own are {of_that_source}, \
         the rule's {}",
        all + SOURCES_HERE as u64
    );
}
