//! Kyverno: the generate rules of ClusterPolicies that clone (`clone`,
//! `cloneList`), and GeneratingPolicies of the documented clone shape
//! (`generator.Apply` of `resource.Get` or `resource.List`): cluster-scoped
//! configuration, which only the cluster's admins write, made admin rules.
//! Namespaced policies (a Policy, a NamespacedGeneratingPolicy) are their
//! namespace's configuration: a Policy that clones a source of its
//! namespace beside it under another name (all Kyverno lets it clone) is
//! made a rule of that namespace; the rest are reported, never made rules.

use serde_json::{Map, Value, json};

use super::SourceReport;
use super::patterns::Selector;
use super::shared::{
    Context, Conversion, Draft, Owner, Source, Targets, at, bool_at, group_version, kind_notes,
    renaming, str_at,
};
use crate::api::selector::Glob;

const TOOL: &str = "Kyverno";

pub(super) fn convert(object: &Value, context: &Context) -> Vec<Conversion> {
    let (group, version) = group_version(object);
    match (group, version, str_at(object, &["kind"])) {
        ("kyverno.io", "v1" | "v2beta1", Some(kind @ ("ClusterPolicy" | "Policy"))) => {
            policy(object, kind, context)
        }
        ("policies.kyverno.io", "v1" | "v1beta1" | "v1alpha1", Some("GeneratingPolicy")) => {
            generating_policy(object, context).into_iter().collect()
        }
        ("policies.kyverno.io", _, Some("NamespacedGeneratingPolicy")) => {
            let Some(name) = str_at(object, &["metadata", "name"]) else {
                return Vec::new();
            };
            let namespace = str_at(object, &["metadata", "namespace"]).unwrap_or("default");
            let mut report = SourceReport::new(
                TOOL,
                format!("NamespacedGeneratingPolicy {namespace}/{name}"),
            );
            report.unmapped(format!("NamespacedGeneratingPolicies are not converted (it is {namespace}'s configuration: it is never made an admin rule)"));
            vec![report.alone()]
        }
        _ => Vec::new(),
    }
}

/// The policy a generate rule belongs to.
struct Policy<'a> {
    kind: &'a str,
    name: &'a str,
    /// A Policy's namespace; none for a ClusterPolicy.
    namespace: Option<&'a str>,
    /// The policy-wide `spec.generateExisting`, or the older
    /// `spec.generateExistingOnPolicyUpdate` (both deprecated; Kyverno
    /// takes either being true as the rules' default).
    generate_existing: Option<bool>,
}

fn policy(object: &Value, kind: &str, context: &Context) -> Vec<Conversion> {
    let Some(name) = str_at(object, &["metadata", "name"]) else {
        return Vec::new();
    };
    let namespace =
        (kind == "Policy").then(|| str_at(object, &["metadata", "namespace"]).unwrap_or("default"));
    let policy = Policy {
        kind,
        name,
        namespace,
        generate_existing: match (
            bool_at(object, &["spec", "generateExisting"]),
            bool_at(object, &["spec", "generateExistingOnPolicyUpdate"]),
        ) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (current, older) => current.or(older),
        },
    };
    at(object, &["spec", "rules"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|rule| rule.get("generate").is_some_and(Value::is_object))
        .map(|rule| policy.generate_rule(rule, context))
        .collect()
}

impl Policy<'_> {
    fn generate_rule(&self, rule: &Value, context: &Context) -> Conversion {
        let rule_name = str_at(rule, &["name"]).unwrap_or_default();
        let source = match self.namespace {
            None => format!("{} {}, rule {rule_name}", self.kind, self.name),
            Some(ns) => format!("{} {ns}/{}, rule {rule_name}", self.kind, self.name),
        };
        let mut report = SourceReport::new(TOOL, source);
        match self.drafts(rule, rule_name, context, &mut report) {
            Ok(drafts) => report.with(drafts),
            Err(why) => {
                report.unmapped(why);
                report.alone()
            }
        }
    }

    fn drafts(
        &self,
        rule: &Value,
        rule_name: &str,
        context: &Context,
        report: &mut SourceReport,
    ) -> Result<Vec<Draft>, String> {
        let generate = &rule["generate"];
        refuse_unconverted(rule, generate)?;
        let (targets, mut drafts) = match self.namespace {
            Some(namespace) => {
                self.within_namespace(namespace, rule, rule_name, context, report)?
            }
            None => self.across_namespaces(rule, rule_name, context, report)?,
        };
        let settings = Settings {
            synchronize: bool_at(generate, &["synchronize"]).unwrap_or(false),
            generate_existing: bool_at(generate, &["generateExisting"])
                .or(self.generate_existing)
                .unwrap_or(false),
            orphan: Orphan::Field(
                bool_at(generate, &["orphanDownstreamOnPolicyDelete"]).unwrap_or(false),
            ),
        };
        let spec = settings.spec(&targets, report);
        for draft in &mut drafts {
            draft.spec.clone_from(&spec);
        }
        Ok(drafts)
    }

    /// A ClusterPolicy's generate rule: its targets, and a rule for each
    /// kind it clones.
    fn across_namespaces(
        &self,
        rule: &Value,
        rule_name: &str,
        context: &Context,
        report: &mut SourceReport,
    ) -> Result<(Targets, Vec<Draft>), String> {
        let generate = &rule["generate"];
        let targets = namespace_trigger(rule, generate, report)?;
        if let Some(why) = targets.refusal() {
            return Err(why);
        }
        if targets.reaches_nothing() {
            return Err("the trigger matches no namespace".into());
        }
        let shape = Shape {
            name: format!("kyverno-{}-{rule_name}", self.name),
            targets: &targets,
        };
        // The sources first: a rule left out for them says nothing of
        // the settings it would have had.
        let drafts = if let Some(clone) = generate.get("clone").filter(|c| c.is_object()) {
            vec![shape.clone_draft(generate, clone, report)?]
        } else if let Some(list) = generate.get("cloneList").filter(|c| c.is_object()) {
            shape.clone_list_drafts(list, report)?
        } else {
            return Err(NOTHING_CLONED.into());
        };
        if let Some(note) = targets.protected_note(TOOL, context.options) {
            report.differs(note);
        }
        Ok((targets, drafts))
    }

    /// A namespaced Policy's generate rule. Kyverno lets a Policy clone
    /// only from its own namespace and generate only into it, both named
    /// as they are (it refuses a Policy that says otherwise: "a namespaced
    /// policy cannot clone resources from other namespaces", "... cannot
    /// generate resources in other namespaces"): a clone of a source of
    /// its namespace, beside it under another name. That is the rule of
    /// its namespace (see `Owner`); a Policy that reaches into another
    /// namespace is never made a rule that could, least of all an admin's.
    fn within_namespace(
        &self,
        namespace: &str,
        rule: &Value,
        rule_name: &str,
        context: &Context,
        report: &mut SourceReport,
    ) -> Result<(Targets, Vec<Draft>), String> {
        let generate = &rule["generate"];
        let Some((field, cloned)) = ["clone", "cloneList"]
            .into_iter()
            .find_map(|key| Some((key, generate.get(key).filter(|c| c.is_object())?)))
        else {
            return Err(NOTHING_CLONED.into());
        };
        match str_at(cloned, &["namespace"]) {
            Some(from) if from == namespace => {}
            Some(from) => {
                return Err(format!(
                    "it clones from {from:?}, not from its own namespace {namespace}: Kyverno refuses a namespaced Policy that clones from another namespace, so it never copied anything. A Policy is {namespace}'s configuration, and a rule made from it could take nothing from another namespace without the consent of its owner: no rule is made, and nothing is asked of {from:?}"
                ));
            }
            None => {
                return Err(format!(
                    "its {field} names no namespace: Kyverno refuses a namespaced Policy whose clone source names none, so it never copied anything: no rule is made"
                ));
            }
        }
        if field == "cloneList" {
            return Err(format!(
                "cloneList's copies keep their sources' names, and a Policy clones within its own namespace, {namespace}, into {namespace} (Kyverno allows it nothing else): each copy would be its source itself, which Copyrator never writes: no rule is made"
            ));
        }
        let target = str_at(generate, &["namespace"]).unwrap_or_default();
        if target != namespace {
            return Err(format!(
                "generate.namespace is {target:?}, not {namespace}: Kyverno refuses a namespaced Policy that names another namespace to generate into, even by a variable (\"a namespaced policy cannot generate resources in other namespaces\"), so it never copied anything: no rule is made"
            ));
        }
        let (Some(api_version), Some(kind)) = (
            str_at(generate, &["apiVersion"]),
            str_at(generate, &["kind"]),
        ) else {
            return Err("generate names no apiVersion and kind".into());
        };
        let owner = Owner::of_namespace(namespace, context.options);
        owner.kind_refusal(api_version, kind)?;
        let name = fixed(cloned, "name")?;
        let copy_name = generated_name(generate, name)?;
        let Some(renaming) = renaming(name, copy_name, true, GENERATED_NAME)? else {
            return Err(format!(
                "generate.name is clone.name, and a Policy generates into the namespace it clones from: the copy would be its source itself, {kind} {namespace}/{name}, which Copyrator never writes: no rule is made"
            ));
        };
        let kinds: Vec<&str> = block_filters(rule.get("match"), "match")?
            .into_iter()
            .flat_map(|f| strings(f, "kinds"))
            .collect();
        report.differs(format!(
            "the copy goes into {namespace}, the Policy's own namespace and its source's: Kyverno makes it once a {} it matches is created there; the rule keeps it there from the start",
            if kinds.is_empty() { "resource".to_owned() } else { kinds.join(" or ") }
        ));
        report.exact(format!(
            "the source, {kind} {namespace}/{name}, is selected by the rule's import label, to be put on it"
        ));
        report.exact(renaming.line);
        for note in kind_notes(api_version, kind, TOOL) {
            report.differs(note);
        }
        let draft = Draft {
            name: format!("kyverno-{}-{rule_name}", self.name),
            owner,
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            source: Source::Named {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            spec: Map::new(),
            naming: Some(renaming.name),
        };
        Ok((Targets::including(vec![namespace.to_owned()]), vec![draft]))
    }
}

const NOTHING_CLONED: &str = "generate has neither clone nor cloneList: it copies nothing";

/// What a report says the copies' other name is.
const GENERATED_NAME: &str = "the name generate.name gives them";

/// `generate.name`, the copies' name (the source's where it says none),
/// when it is fixed text.
fn generated_name<'a>(generate: &'a Value, source: &'a str) -> Result<&'a str, String> {
    let name = str_at(generate, &["name"]).unwrap_or(source);
    if name.contains("{{") {
        return Err(format!(
            "generate.name {name:?} is computed by Kyverno's variables, for each trigger: a rule's transform.name is fixed"
        ));
    }
    Ok(name)
}

/// What a rule cannot be converted for, whatever its trigger.
fn refuse_unconverted(rule: &Value, generate: &Value) -> Result<(), String> {
    if generate.get("data").is_some_and(|d| !d.is_null()) {
        return Err("generate.data makes the object from the policy itself, and Copyrator copies only objects that exist: create it as a source object and write a rule that copies it".into());
    }
    if generate.get("foreach").is_some_and(|f| !f.is_null()) {
        return Err("generate.foreach is not converted".into());
    }
    for key in ["preconditions", "celPreconditions"] {
        if rule.get(key).is_some_and(|p| !p.is_null()) {
            return Err(format!(
                "the rule's {key} pick triggers by conditions this import does not read: a rule without them would copy into namespaces they leave out"
            ));
        }
    }
    Ok(())
}

/// The name and targets of the rules a generate rule becomes.
struct Shape<'a> {
    name: String,
    targets: &'a Targets,
}

impl Shape<'_> {
    /// `clone`: one named source, copied under `generate.name`.
    fn clone_draft(
        &self,
        generate: &Value,
        clone: &Value,
        report: &mut SourceReport,
    ) -> Result<Draft, String> {
        let (Some(api_version), Some(kind)) = (
            str_at(generate, &["apiVersion"]),
            str_at(generate, &["kind"]),
        ) else {
            return Err("generate names no apiVersion and kind".into());
        };
        let namespace = fixed(clone, "namespace")?;
        let name = fixed(clone, "name")?;
        let renaming = renaming(name, generated_name(generate, name)?, true, GENERATED_NAME)?;
        // A copy of another name may stand beside its source.
        if renaming.is_none() {
            self.refuse_own_namespace(namespace)?;
        }
        report.exact(format!(
            "the source, {kind} {namespace}/{name}, is selected by the rule's import label, to be put on it"
        ));
        if let Some(renaming) = &renaming {
            report.exact(renaming.line.clone());
        }
        for note in kind_notes(api_version, kind, TOOL) {
            report.differs(note);
        }
        Ok(Draft {
            name: self.name.clone(),
            owner: Owner::Admin,
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            source: Source::Named {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            spec: Map::new(),
            naming: renaming.map(|r| r.name),
        })
    }

    /// `cloneList`: the objects of some kinds that a selector picks in a
    /// namespace, a rule for each kind.
    fn clone_list_drafts(
        &self,
        list: &Value,
        report: &mut SourceReport,
    ) -> Result<Vec<Draft>, String> {
        let namespace = fixed(list, "namespace")?;
        self.refuse_own_namespace(namespace)?;
        let source = match list.get("selector").filter(|s| !s.is_null()) {
            Some(selector) => selected(namespace, selector, report)?,
            None => {
                report.differs(format!(
                    "cloneList has no selector, so Kyverno clones every object of its kinds in {namespace}; Copyrator selects sources by label only: the rule selects its import label, to be put on each object in {namespace} to copy"
                ));
                Source::ToLabel {
                    namespace: namespace.to_owned(),
                }
            }
        };
        let mut drafts = Vec::new();
        for entry in at(list, &["kinds"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let entry = entry.as_str().unwrap_or_default();
            match listed_kind(entry) {
                Ok((api_version, kind)) => {
                    for note in kind_notes(&api_version, &kind, TOOL) {
                        report.differs(note);
                    }
                    drafts.push(Draft {
                        name: format!("{}-{}", self.name, kind.to_ascii_lowercase()),
                        owner: Owner::Admin,
                        api_version,
                        kind,
                        source: source.clone(),
                        spec: Map::new(),
                        naming: None,
                    });
                }
                Err(why) => report.unmapped(format!("cloneList kind {entry:?}: {why}")),
            }
        }
        if drafts.is_empty() {
            return Err("cloneList lists no kind that can be converted".into());
        }
        Ok(drafts)
    }

    /// A copy of its source's name into its source's own namespace: the
    /// source itself, which Copyrator never writes.
    fn refuse_own_namespace(&self, namespace: &str) -> Result<(), String> {
        if self.targets.include.as_deref() == Some(&[namespace.to_owned()]) {
            return Err(format!(
                "the source is in {namespace}, the namespace the copy goes into under the source's name: the copy would be the source itself, which Copyrator never writes"
            ));
        }
        Ok(())
    }
}

/// The sources a cloneList's selector picks.
fn selected(
    namespace: &str,
    selector: &Value,
    report: &mut SourceReport,
) -> Result<Source, String> {
    let parsed = Selector::from_json(selector).map_err(|e| {
        format!("cloneList.selector cannot be a rule's selector ({e}); Kyverno reads * and ? in labels as wildcards, Copyrator has none")
    })?;
    if parsed.is_empty() {
        report.differs(format!(
            "cloneList.selector is empty, so Kyverno clones every object of its kinds in {namespace}; Copyrator selects sources by label only: the rule selects its import label, to be put on each object in {namespace} to copy"
        ));
        return Ok(Source::ToLabel {
            namespace: namespace.to_owned(),
        });
    }
    report.exact(format!(
        "the sources are the objects in {namespace} whose labels match {} (selector)",
        parsed.text()
    ));
    Ok(Source::Selected {
        namespace: namespace.to_owned(),
        selector: parsed.to_json(),
    })
}

/// A field that must be fixed text, not computed by Kyverno's variables.
fn fixed<'a>(value: &'a Value, field: &str) -> Result<&'a str, String> {
    let text =
        str_at(value, &[field]).ok_or_else(|| format!("the clone source names no {field}"))?;
    if text.contains("{{") {
        return Err(format!(
            "the clone source's {field} {text:?} is computed by Kyverno's variables; a rule's source is fixed"
        ));
    }
    Ok(text)
}

/// `v1/Secret` as `("v1", "Secret")`, `apps/v1/Deployment` as `("apps/v1", "Deployment")`.
fn listed_kind(entry: &str) -> Result<(String, String), String> {
    if entry.contains(['*', '?']) {
        return Err("a wildcard kind names no one kind".into());
    }
    match entry.rsplit_once('/') {
        Some((api_version, kind)) if !api_version.is_empty() && !kind.is_empty() => {
            Ok((api_version.to_owned(), kind.to_owned()))
        }
        None if matches!(entry, "Secret" | "ConfigMap") => Ok(("v1".into(), entry.to_owned())),
        _ => Err("not apiVersion/Kind".into()),
    }
}

/// Whether a generated namespace is the trigger's name.
fn is_trigger_name(text: &str) -> bool {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    compact == "{{request.object.metadata.name}}"
}

fn is_namespace_kind(kind: &str) -> bool {
    matches!(kind, "Namespace" | "v1/Namespace")
}

/// A ClusterPolicy rule triggered by Namespaces and copying into each:
/// the namespaces its match and exclude select; or copying into one fixed
/// namespace, whatever triggers it: that namespace.
fn namespace_trigger(
    rule: &Value,
    generate: &Value,
    report: &mut SourceReport,
) -> Result<Targets, String> {
    let filters = block_filters(rule.get("match"), "match")?;
    let kinds: Vec<&str> = filters.iter().flat_map(|f| strings(f, "kinds")).collect();
    let target = str_at(generate, &["namespace"]).unwrap_or_default();
    if crate::api::selector::is_dns_label(target) {
        // One fixed namespace, whatever triggers it: Kyverno makes the
        // copy there once a trigger comes, the rule from the start.
        report.differs(format!(
            "the copies go into the one namespace {target:?}: Kyverno makes the copy there once a {} it matches is created; the rule keeps it there from the start",
            if kinds.is_empty() { "resource".to_owned() } else { kinds.join(" or ") }
        ));
        return Ok(Targets::including(vec![target.to_owned()]));
    }
    if kinds.is_empty() || !kinds.iter().any(|k| is_namespace_kind(k)) {
        return Err(format!(
            "the trigger is {}, not a Namespace: Kyverno copies when such an object is created, Copyrator copies into namespaces whatever they hold",
            kinds.join(", ")
        ));
    }
    if !is_trigger_name(target) {
        return Err(format!(
            "the copies go into {target:?}, not into the namespace that triggers the rule: Copyrator copies into the namespaces its targets select"
        ));
    }
    let filters = namespace_filters(filters, report)?;
    let mut targets = matched(&filters, report)?;
    excluded(rule.get("exclude"), &mut targets, report)?;
    report.exact(format!(
        "triggered by Namespaces and copying into each: the rule copies into {}",
        targets.describe()
    ));
    Ok(targets)
}

/// Of a Namespace-triggered rule's match filters (any of them fires), those
/// that match Namespaces. A filter of other kinds only fires for objects of
/// those kinds, whose own name Kyverno then takes as the namespace to copy
/// into: it makes a copy only where a namespace happens to share an object's
/// name, never into the namespaces the rule is about. It is left out, and
/// said; the rule stands on the rest. A filter that names Namespace among
/// other kinds keeps its Namespace part.
fn namespace_filters<'a>(
    filters: Vec<&'a Value>,
    report: &mut SourceReport,
) -> Result<Vec<&'a Value>, String> {
    let mut kept = Vec::new();
    for filter in filters {
        let kinds = strings(filter, "kinds");
        if kinds.is_empty() || kinds.iter().any(|k| is_namespace_kind(k)) {
            kept.push(filter);
            continue;
        }
        let names = strings(filter, "names");
        report.differs(format!(
            "the match filter on {}{} is left out: Kyverno copies into the namespace named like the {} that triggers it, so it copies only where a namespace shares such an object's name; the rule copies into the namespaces the other filters select",
            kinds.join(", "),
            if names.is_empty() {
                String::new()
            } else {
                format!(" named {}", names.join(", "))
            },
            kinds.join(" or "),
        ));
    }
    if kept.is_empty() {
        return Err("no match filter selects Namespaces".into());
    }
    Ok(kept)
}

/// The `resources` filters of a match or exclude block.
fn block_filters<'a>(block: Option<&'a Value>, what: &str) -> Result<Vec<&'a Value>, String> {
    let Some(block) = block.filter(|b| !b.is_null()) else {
        return Ok(Vec::new());
    };
    let entries: Vec<&Value> = match (block.get("any"), block.get("all")) {
        (Some(any), None) => any
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        (None, Some(all)) => {
            let all: Vec<&Value> = all
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if all.len() > 1 {
                return Err(format!("{what}.all with several filters is not converted"));
            }
            all
        }
        (None, None) => vec![block],
        (Some(_), Some(_)) => return Err(format!("{what} with both any and all is not converted")),
    };
    let mut filters = Vec::new();
    for entry in entries {
        for key in ["subjects", "roles", "clusterRoles"] {
            if entry
                .get(key)
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
            {
                return Err(format!(
                    "{what} names {key}: Kyverno's copies depend on who makes the namespace, Copyrator's do not"
                ));
            }
        }
        if let Some(resources) = entry.get("resources").filter(|r| r.is_object()) {
            filters.push(resources);
        }
    }
    Ok(filters)
}

/// The strings of a list field.
fn strings<'a>(value: &'a Value, field: &str) -> Vec<&'a str> {
    value
        .get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The names a filter matches Namespaces by: `names`, `name`, or
/// `namespaces` (Kyverno's match code takes a Namespace's own name as its
/// namespace). Kyverno's `*` and `?` are Copyrator's glob wildcards.
fn filter_names(
    filter: &Value,
    what: &str,
    report: &mut SourceReport,
) -> Result<Option<Vec<String>>, String> {
    let mut names: Vec<&str> = strings(filter, "names");
    names.extend(str_at(filter, &["name"]));
    let namespaces = strings(filter, "namespaces");
    let listed = match (names.is_empty(), namespaces.is_empty()) {
        (true, true) => return Ok(None),
        (false, true) => names,
        (true, false) => namespaces,
        (false, false) => {
            return Err(format!(
                "{what} filters Namespaces by both names and namespaces, which is not converted"
            ));
        }
    };
    let mut globs = Vec::new();
    for name in listed {
        if Glob::new(name).is_ok() {
            globs.push(name.to_owned());
        } else {
            report.exact(format!("{what} name {name:?} matches no namespace name"));
        }
    }
    Ok(Some(globs))
}

/// What one match filter on Namespaces selects.
fn filter_targets(filter: &Value, report: &mut SourceReport) -> Result<Targets, String> {
    if filter.get("annotations").is_some_and(|v| !v.is_null()) {
        return Err("match.annotations is not converted".into());
    }
    let operations = strings(filter, "operations");
    if !operations.is_empty() && !operations.contains(&"CREATE") {
        return Err(
            "the trigger leaves out CREATE: Kyverno copies only when a namespace changes".into(),
        );
    }
    let mut targets = Targets {
        include: filter_names(filter, "match", report)?,
        ..Targets::default()
    };
    if let Some(selector) = filter.get("selector").filter(|s| !s.is_null()) {
        let selector = Selector::from_json(selector)
            .map_err(|e| format!("match selector cannot be a namespaceSelector ({e}); Kyverno reads * and ? in labels as wildcards, Copyrator has none"))?;
        report.exact(format!(
            "the Namespace's labels must match {} (targets.namespaceSelector)",
            selector.text()
        ));
        targets.selector = Some(selector);
    }
    if let Some(selector) = filter.get("namespaceSelector").filter(|s| !s.is_null()) {
        let selector = Selector::from_json(selector)
            .map_err(|e| format!("match namespaceSelector cannot be a namespaceSelector ({e})"))?;
        report.differs(format!(
            "match namespaceSelector {} is taken as the namespace's own labels (targets.namespaceSelector); Kyverno appears to give a Namespace trigger no namespace labels to match (code reading, unconfirmed), in which case it made no copies: check that they exist",
            selector.text()
        ));
        targets.selector = Some(match targets.selector.take() {
            Some(known) => known.and(&selector),
            None => selector,
        });
    }
    Ok(targets)
}

/// The targets match's filters select together (any of them).
fn matched(filters: &[&Value], report: &mut SourceReport) -> Result<Targets, String> {
    let each = filters
        .iter()
        .map(|f| filter_targets(f, report))
        .collect::<Result<Vec<_>, _>>()?;
    if let [single] = each.as_slice() {
        return Ok(single.clone());
    }
    if each
        .iter()
        .any(|t| t.include.is_none() && t.selector.is_none())
    {
        return Ok(Targets::default());
    }
    if each.iter().any(|t| t.selector.is_some()) {
        return Err("match.any lists several filters with label selectors: a rule's targets cannot select one or the other".into());
    }
    let mut globs: Vec<String> = Vec::new();
    for glob in each.into_iter().flat_map(|t| t.include.unwrap_or_default()) {
        if !globs.contains(&glob) {
            globs.push(glob);
        }
    }
    Ok(Targets::including(globs))
}

/// The namespaces an exclude block takes out of `targets`.
fn excluded(
    block: Option<&Value>,
    targets: &mut Targets,
    report: &mut SourceReport,
) -> Result<(), String> {
    for filter in block_filters(block, "exclude")? {
        let kinds = strings(filter, "kinds");
        if !kinds.is_empty() && !kinds.iter().any(|k| is_namespace_kind(k)) {
            continue;
        }
        if filter
            .get("namespaceSelector")
            .is_some_and(|s| !s.is_null())
        {
            return Err("exclude namespaceSelector on a Namespace trigger is not converted: how Kyverno applies it there is unconfirmed".into());
        }
        // Leaving out less than the filter says would copy where Kyverno does not.
        if let Some(key) = filter.as_object().and_then(|f| {
            f.keys().find(|k| {
                !matches!(
                    k.as_str(),
                    "kinds" | "names" | "name" | "namespaces" | "selector"
                )
            })
        }) {
            return Err(format!("exclude by {key} is not converted"));
        }
        let names = filter_names(filter, "exclude", report)?;
        let selector = filter.get("selector").filter(|s| !s.is_null());
        match (names, selector) {
            (Some(names), None) => targets.exclude.extend(names),
            (None, Some(selector)) => {
                let negated = Selector::from_json(selector)
                    .ok()
                    .and_then(|s| s.negated())
                    .ok_or("exclude selector says more than one label requirement: a namespaceSelector cannot leave out what matches them all")?;
                targets.selector = Some(match targets.selector.take() {
                    Some(known) => known.and(&negated),
                    None => negated,
                });
            }
            (None, None) => return Err("an exclude filter leaves out every namespace".into()),
            (Some(_), Some(_)) => {
                return Err(
                    "an exclude filter with both names and a selector is not converted".into(),
                );
            }
        }
    }
    Ok(())
}

/// What becomes of copies when the policy goes.
#[derive(Clone, Copy)]
enum Orphan {
    /// A ClusterPolicy's `orphanDownstreamOnPolicyDelete`.
    Field(bool),
    /// A GeneratingPolicy's clone copies, which stay whatever it says.
    Kept,
}

/// A generate rule's settings for keeping copies.
struct Settings {
    synchronize: bool,
    generate_existing: bool,
    orphan: Orphan,
}

impl Settings {
    /// The spec's targets and policies, and the report's lines on them.
    fn spec(&self, targets: &Targets, report: &mut SourceReport) -> Map<String, Value> {
        let mut spec = Map::new();
        if let Some(targets) = targets.to_json() {
            spec.insert("targets".into(), targets);
        }
        if self.synchronize {
            spec.insert("syncPolicy".into(), json!("Sync"));
            report.exact("synchronize: true: copies follow their source, are restored when edited or deleted, and go when their namespace stops matching (syncPolicy: Sync)");
            report.exact("copies go when their source is deleted (deletionPolicy.sourceGone: Delete), as Kyverno's code and its docs' table say (the prose of its docs says they stay)");
        } else {
            spec.insert("syncPolicy".into(), json!("CreateOnly"));
            report.differs("synchronize is false: Kyverno creates each copy once and leaves it; a copy deleted stays deleted. The closest is syncPolicy: CreateOnly, which also never updates or deletes a copy, but creates a deleted copy again while its namespace is a target");
        }
        if self.generate_existing {
            report.exact(
                "generateExisting: true: namespaces that exist get copies too, as with every rule",
            );
        } else {
            report.differs("generateExisting is false: Kyverno copied only into namespaces made after the policy; the rule copies into every namespace it targets, those that exist too");
        }
        if self.synchronize {
            self.on_policy_deleted(&mut spec, report);
        }
        spec
    }

    fn on_policy_deleted(&self, spec: &mut Map<String, Value>, report: &mut SourceReport) {
        let orphan = json!({"ruleDeleted": "Orphan"});
        match self.orphan {
            Orphan::Field(true) => {
                spec.insert("deletionPolicy".into(), orphan);
                report.exact("orphanDownstreamOnPolicyDelete: true: copies stay when the rule is deleted (deletionPolicy.ruleDeleted: Orphan)");
            }
            // Seen in a run of Kyverno v1.19.0's background controller
            // (hack/migration-run kyverno); its docs say the copies stay.
            Orphan::Field(false) => report.exact("orphanDownstreamOnPolicyDelete is false: Kyverno v1.19.0 deletes the copies with the policy (its docs say they stay), and the rule deletes its copies when it is deleted (deletionPolicy.ruleDeleted: Delete): set Orphan to keep them"),
            Orphan::Kept => {
                spec.insert("deletionPolicy".into(), orphan);
                report.exact("clone copies stay when the policy is deleted, whatever orphanDownstreamOnPolicyDelete says (it concerns data copies): deletionPolicy.ruleDeleted: Orphan");
            }
        }
    }
}

/// A source a GeneratingPolicy clones.
#[derive(Debug, PartialEq)]
struct Cloned {
    kind: &'static str,
    namespace: String,
    /// One object (`resource.Get`), or all of the namespace (`resource.List`).
    name: Option<String>,
}

fn generating_policy(object: &Value, context: &Context) -> Option<Conversion> {
    let name = str_at(object, &["metadata", "name"])?;
    let mut report = SourceReport::new(TOOL, format!("GeneratingPolicy {name}"));
    let spec = object.get("spec").unwrap_or(&Value::Null);
    if let Err(why) = namespace_resource_rules(spec) {
        report.unmapped(why);
        return Some(report.alone());
    }
    let variables: Vec<(&str, &str)> = at(spec, &["variables"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| Some((str_at(v, &["name"])?, str_at(v, &["expression"])?)))
        .collect();
    let mut sources = Vec::new();
    for (index, item) in at(spec, &["generate"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        match cloned_by(item, &variables) {
            Ok(found) => sources.extend(found),
            Err(why) => report.unmapped(format!("generate[{index}]: {why}")),
        }
    }
    if sources.is_empty() {
        if report.unmapped.is_empty() {
            report.unmapped("generate lists nothing to convert");
        }
        return Some(report.alone());
    }
    let targets = Targets::default();
    report.exact("triggered by every Namespace and copying into it (generator.Apply into object.metadata.name): the rule copies into every namespace");
    if let Some(note) = targets.protected_note(TOOL, context.options) {
        report.differs(note);
    }
    let settings = Settings {
        synchronize: bool_at(spec, &["evaluation", "synchronize", "enabled"]).unwrap_or(false),
        generate_existing: bool_at(spec, &["evaluation", "generateExisting", "enabled"])
            .unwrap_or(false),
        orphan: Orphan::Kept,
    };
    let rule_spec = settings.spec(&targets, &mut report);
    let several = sources.len() > 1;
    let drafts = sources
        .into_iter()
        .enumerate()
        .map(|(index, cloned)| {
            let name = if several {
                format!("kyverno-{name}-{}", index + 1)
            } else {
                format!("kyverno-{name}")
            };
            cloned.draft(name, rule_spec.clone(), &mut report)
        })
        .collect();
    Some(report.with(drafts))
}

impl Cloned {
    fn draft(self, name: String, spec: Map<String, Value>, report: &mut SourceReport) -> Draft {
        let namespace = self.namespace;
        let source = match self.name {
            Some(source_name) => {
                report.exact(format!(
                    "resource.Get of {} {namespace}/{source_name}: the rule's source, selected by its import label, to be put on it",
                    self.kind
                ));
                Source::Named {
                    namespace,
                    name: source_name,
                }
            }
            None => {
                report.differs(format!(
                    "resource.List copies every {} in {namespace}; Copyrator selects sources by label only: the rule selects its import label, to be put on each one to copy",
                    self.kind
                ));
                Source::ToLabel { namespace }
            }
        };
        Draft {
            name,
            owner: Owner::Admin,
            api_version: "v1".into(),
            kind: self.kind.into(),
            source,
            spec,
            naming: None,
        }
    }
}

/// Whether a GeneratingPolicy is triggered by Namespaces being made, and
/// nothing narrows that.
fn namespace_resource_rules(spec: &Value) -> Result<(), String> {
    let constraints = spec.get("matchConstraints").unwrap_or(&Value::Null);
    if let Some(key) = constraints.as_object().and_then(|c| {
        c.keys()
            .find(|k| !matches!(k.as_str(), "resourceRules" | "matchPolicy"))
    }) {
        return Err(format!("matchConstraints.{key} is not converted"));
    }
    let rules = at(constraints, &["resourceRules"]).and_then(Value::as_array);
    let namespaces = rules.is_some_and(|rules| match rules.as_slice() {
        [rule] => {
            strings(rule, "apiGroups") == [""]
                && strings(rule, "resources") == ["namespaces"]
                && strings(rule, "operations")
                    .iter()
                    .any(|o| matches!(*o, "CREATE" | "*"))
        }
        _ => false,
    });
    if !namespaces {
        return Err("the trigger is not the making of Namespaces (matchConstraints.resourceRules): Copyrator copies into namespaces, whatever they hold".into());
    }
    let conditions: Vec<String> = at(spec, &["matchConditions"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| str_at(c, &["expression"]))
        .map(quoted)
        .collect();
    if !conditions.is_empty() {
        return Err(format!(
            "matchConditions {} pick namespaces by conditions this import does not read",
            conditions.join(", ")
        ));
    }
    if bool_at(spec, &["evaluation", "admission", "enabled"]) == Some(false) {
        return Err("evaluation.admission.enabled is false: Kyverno copies into no new namespace, Copyrator copies into every one".into());
    }
    Ok(())
}

/// A CEL expression as a report quotes it: one that builds objects may
/// hold data, and is not quoted.
fn quoted(expression: &str) -> String {
    let expression = expression.trim();
    if expression.contains(['{', '}']) || expression.len() > 200 {
        "(an expression that builds objects, not quoted: it may hold data)".to_owned()
    } else {
        format!("`{expression}`")
    }
}

/// The sources one generate entry clones: `generator.Apply(<trigger's
/// name>, [<resource.Get or resource.List>, ...])`.
fn cloned_by(item: &Value, variables: &[(&str, &str)]) -> Result<Vec<Cloned>, String> {
    if item.get("template").is_some() {
        return Err("a template is not converted".into());
    }
    let expression = str_at(item, &["expression"]).ok_or("no expression")?;
    let unconverted = || {
        format!(
            "{} is not the clone shape converted: generator.Apply(object.metadata.name, [resource.Get(...) or resource.List(...)])",
            quoted(expression)
        )
    };
    let arguments = call_arguments(expression, "generator.Apply").ok_or_else(unconverted)?;
    let [namespace, items] = arguments.as_slice() else {
        return Err(unconverted());
    };
    if resolved(namespace, variables) != "object.metadata.name" {
        return Err(unconverted());
    }
    let items = resolved(items, variables);
    let list = items
        .strip_prefix('[')
        .and_then(|i| i.strip_suffix(']'))
        .ok_or_else(unconverted)?;
    split_arguments(list)
        .iter()
        .map(|item| resource_call(&resolved(item, variables)).ok_or_else(unconverted))
        .collect()
}

/// An argument with the variable it names, if any, replaced by its expression.
fn resolved(argument: &str, variables: &[(&str, &str)]) -> String {
    let argument = argument.trim();
    argument
        .strip_prefix("variables.")
        .and_then(|name| variables.iter().find(|(n, _)| *n == name))
        .map_or(argument, |(_, expression)| expression.trim())
        .to_owned()
}

/// `resource.Get("v1", "secrets", "<ns>", "<name>")` or
/// `resource.List("v1", "secrets", "<ns>")`, of Secrets or ConfigMaps.
fn resource_call(expression: &str) -> Option<Cloned> {
    let (arguments, get) = match call_arguments(expression, "resource.Get") {
        Some(arguments) => (arguments, true),
        None => (call_arguments(expression, "resource.List")?, false),
    };
    let texts: Vec<String> = arguments
        .iter()
        .map(|a| string_literal(a))
        .collect::<Option<_>>()?;
    let kind = match (texts.first()?.as_str(), texts.get(1)?.as_str()) {
        ("v1", "secrets") => "Secret",
        ("v1", "configmaps") => "ConfigMap",
        _ => return None,
    };
    let namespace = texts.get(2)?.clone();
    match (get, texts.len()) {
        (true, 4) => Some(Cloned {
            kind,
            namespace,
            name: texts.get(3).cloned(),
        }),
        (false, 3) => Some(Cloned {
            kind,
            namespace,
            name: None,
        }),
        _ => None,
    }
}

/// The arguments of a call of `function` that is the whole expression.
fn call_arguments(expression: &str, function: &str) -> Option<Vec<String>> {
    let inner = expression
        .trim()
        .strip_prefix(function)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')?;
    Some(split_arguments(inner))
}

/// Split at the commas outside brackets, parentheses and strings.
fn split_arguments(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(std::mem::take(&mut current).trim().to_owned());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        parts.push(current.trim().to_owned());
    }
    parts
}

/// A CEL string literal's text, without escapes.
fn string_literal(text: &str) -> Option<String> {
    let text = text.trim();
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .or_else(|| text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')))?;
    (!inner.contains(['\\', '"', '\''])).then(|| inner.to_owned())
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::super::shared::tests::{converted, copy_name_of, says};
    use super::super::shared::{import_label_key, rule_name};
    use super::super::{Imported, SourceLabel, SourceReport};

    pub(crate) fn yaml(text: &str) -> Value {
        serde_yaml::from_str(text).expect("valid YAML")
    }

    // KYW src/content/docs/docs/policy-types/cluster-policy/generate.md,
    // §"Clone Examples" (also KYP other/sync-secrets/sync-secrets.yaml).
    const SYNC_SECRETS: &str = r"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: sync-secrets
spec:
  rules:
    - name: sync-image-pull-secret
      match:
        any:
          - resources:
              kinds:
                - Namespace
      generate:
        apiVersion: v1
        kind: Secret
        name: regcred
        namespace: '{{request.object.metadata.name}}'
        synchronize: true
        clone:
          namespace: default
          name: regcred
";

    // KYW, the same file, §"Cloning Multiple Resources".
    const MULTI_CLONE: &str = r"
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: sync-secret-with-multi-clone
spec:
  rules:
    - name: sync-secret
      match:
        any:
          - resources:
              kinds:
                - Namespace
      exclude:
        any:
          - resources:
              namespaces:
                - kube-system
                - default
                - kube-public
                - kyverno
      generate:
        namespace: '{{request.object.metadata.name}}'
        synchronize: true
        cloneList:
          namespace: staging
          kinds:
            - v1/Secret
            - v1/ConfigMap
          selector:
            matchLabels:
              allowedToBeCloned: 'true'
";

    // KYW src/content/docs/docs/policy-types/generating-policy.mdx,
    // §"Clone Single Resource".
    const GENERATE_SECRET: &str = r#"
apiVersion: policies.kyverno.io/v1
kind: GeneratingPolicy
metadata:
  name: generate-secret
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: ['']
        apiVersions: ['v1']
        operations: ['CREATE', 'UPDATE']
        resources: ['namespaces']
  variables:
    - name: nsName
      expression: 'object.metadata.name'
    - name: source
      expression: resource.Get("v1", "secrets", "default", "regcred")
  generate:
    - expression: generator.Apply(variables.nsName, [variables.source])
"#;

    // KYW, the same file, §"Generating for Existing Resources".
    const GENERATE_EXISTING: &str = r#"
apiVersion: policies.kyverno.io/v1
kind: GeneratingPolicy
metadata:
  name: generate-secrets
spec:
  evaluation:
    generateExisting:
      enabled: true
  matchConstraints:
    resourceRules:
      - apiGroups: ['']
        apiVersions: ['v1']
        operations: ['CREATE', 'UPDATE']
        resources: ['namespaces']
  variables:
    - name: nsName
      expression: 'object.metadata.name'
    - name: source
      expression: resource.Get("v1", "secrets", "default", "regcred")
  generate:
    - expression: generator.Apply(variables.nsName, [variables.source])
"#;

    pub(crate) fn documented() -> Vec<Value> {
        [
            SYNC_SECRETS,
            MULTI_CLONE,
            GENERATE_SECRET,
            GENERATE_EXISTING,
        ]
        .into_iter()
        .map(yaml)
        .collect()
    }

    fn only_report(imported: &Imported) -> &SourceReport {
        assert_eq!(imported.reports.len(), 1, "{:#?}", imported.reports);
        &imported.reports[0]
    }

    #[test]
    fn a_clone_into_every_namespace_is_a_rule_from_its_labelled_source() {
        let imported = converted(&[yaml(SYNC_SECRETS)]);
        let name = "kyverno-sync-secrets-sync-image-pull-secret";
        let key = import_label_key(name);
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "copyrator"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {key.as_str(): "true"},
                    "namespace": "default",
                    "adopt": true,
                    "syncPolicy": "Sync"
                }
            })]
        );
        assert_eq!(
            imported.source_labels,
            [SourceLabel {
                kind: "Secret".into(),
                api_version: "v1".into(),
                namespace: "default".into(),
                name: "regcred".into(),
                key,
                value: "true".into(),
            }]
        );
        let report = only_report(&imported);
        assert_eq!(report.tool, "Kyverno");
        assert_eq!(
            report.source,
            "ClusterPolicy sync-secrets, rule sync-image-pull-secret"
        );
        assert_eq!(report.rules, [name]);
        assert!(
            says(&report.exact, "the rule copies into every namespace"),
            "{report:#?}"
        );
        assert!(says(&report.exact, "syncPolicy: Sync"), "{report:#?}");
        assert!(
            says(&report.differs, "generateExisting is false"),
            "{report:#?}"
        );
        assert!(
            says(
                &report.exact,
                "Kyverno v1.19.0 deletes the copies with the policy"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "kube-system, kube-public, kube-node-lease, copyrator"
            ),
            "{report:#?}"
        );
        assert!(report.unmapped.is_empty(), "{report:#?}");
    }

    #[test]
    fn a_clone_list_is_a_rule_per_kind_that_keeps_its_selector() {
        let imported = converted(&[yaml(MULTI_CLONE)]);
        let configmaps = rule_name("kyverno-sync-secret-with-multi-clone-sync-secret-configmap");
        let secrets = "kyverno-sync-secret-with-multi-clone-sync-secret-secret";
        assert_eq!(configmaps.len(), 56, "cut, with a hash: {configmaps}");
        let names: Vec<&str> = imported
            .rules
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, [configmaps.as_str(), secrets]);
        for (rule, rule_type) in imported.rules.iter().zip(["configmap", "secret"]) {
            assert_eq!(
                rule["spec"],
                json!({
                    "ruleType": rule_type,
                    "selector": {"matchLabels": {"allowedToBeCloned": "true"}},
                    "namespace": "staging",
                    "adopt": true,
                    "targets": {"exclude": ["kube-system", "default", "kube-public", "kyverno"]},
                    "syncPolicy": "Sync"
                })
            );
        }
        assert!(imported.source_labels.is_empty(), "the selector is kept");
        let report = only_report(&imported);
        assert!(
            says(
                &report.exact,
                "but kube-system, default, kube-public, kyverno"
            ),
            "{report:#?}"
        );
        assert!(says(&report.exact, "allowedToBeCloned=true"), "{report:#?}");
        assert!(
            says(&report.differs, "also match kube-node-lease, copyrator,"),
            "{report:#?}"
        );
        assert!(report.unmapped.is_empty(), "{report:#?}");
    }

    fn policy(rule: Value) -> Value {
        json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
               "metadata": {"name": "p"}, "spec": {"rules": [rule]}})
    }

    fn clone_rule(generate_extra: Value) -> Value {
        let mut rule = yaml(SYNC_SECRETS)["spec"]["rules"][0].clone();
        for (key, value) in generate_extra.as_object().into_iter().flatten() {
            rule["generate"][key] = value.clone();
        }
        rule
    }

    #[test]
    fn without_synchronize_copies_are_created_once_and_the_difference_said() {
        let imported = converted(&[policy(clone_rule(json!({"synchronize": false})))]);
        assert_eq!(imported.rules[0]["spec"]["syncPolicy"], "CreateOnly");
        assert_eq!(imported.rules[0]["spec"].get("deletionPolicy"), None);
        let report = only_report(&imported);
        assert!(
            says(&report.differs, "a copy deleted stays deleted"),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "creates a deleted copy again"),
            "{report:#?}"
        );
    }

    #[test]
    fn orphaned_downstream_and_generate_existing_map_exactly() {
        let imported = converted(&[policy(clone_rule(
            json!({"orphanDownstreamOnPolicyDelete": true, "generateExisting": true}),
        ))]);
        assert_eq!(
            imported.rules[0]["spec"]["deletionPolicy"],
            json!({"ruleDeleted": "Orphan"})
        );
        let report = only_report(&imported);
        assert!(
            says(&report.exact, "deletionPolicy.ruleDeleted: Orphan"),
            "{report:#?}"
        );
        assert!(says(&report.exact, "generateExisting: true"), "{report:#?}");
        assert!(!says(&report.differs, "generateExisting"), "{report:#?}");
        // The policy-wide (deprecated) setting counts where the rule says none.
        let mut wide = policy(clone_rule(json!({})));
        wide["spec"]["generateExisting"] = json!(true);
        let imported = converted(&[wide]);
        assert!(says(
            &only_report(&imported).exact,
            "generateExisting: true"
        ));
        // So does its older name, which Kyverno still reads.
        let mut older = policy(clone_rule(json!({})));
        older["spec"]["generateExistingOnPolicyUpdate"] = json!(true);
        let report = only_report(&converted(&[older])).clone();
        assert!(says(&report.exact, "generateExisting: true"), "{report:#?}");
        assert!(!says(&report.differs, "generateExisting"), "{report:#?}");
    }

    #[test]
    fn names_and_selectors_of_the_trigger_become_targets() {
        let mut rule = clone_rule(json!({}));
        rule["match"] = json!({"any": [{"resources": {
            "kinds": ["Namespace"], "names": ["team-*", "shop"],
            "selector": {"matchLabels": {"pull": "yes"}}}}]});
        rule["exclude"] = json!({"any": [
            {"resources": {"names": ["team-sandbox"]}},
            {"resources": {"selector": {"matchLabels": {"frozen": "true"}}}},
            {"resources": {"kinds": ["Pod"], "names": ["ignored"]}}
        ]});
        let imported = converted(&[policy(rule)]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({
                "include": ["team-*", "shop"],
                "exclude": ["team-sandbox"],
                "namespaceSelector": {
                    "matchLabels": {"pull": "yes"},
                    "matchExpressions": [{"key": "frozen", "operator": "NotIn", "values": ["true"]}]
                }
            })
        );
        assert!(only_report(&imported).unmapped.is_empty());
    }

    #[test]
    fn a_namespace_selector_on_the_trigger_is_kept_and_flagged_unconfirmed() {
        let mut rule = clone_rule(json!({}));
        rule["match"] = json!({"any": [{"resources": {"kinds": ["Namespace"],
            "namespaceSelector": {"matchLabels": {"env": "prod"}}}}]});
        let imported = converted(&[policy(rule)]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"namespaceSelector": {"matchLabels": {"env": "prod"}}})
        );
        assert!(says(&only_report(&imported).differs, "unconfirmed"));
    }

    /// KYW's "clone into one namespace" form: `generate.namespace` a fixed
    /// name (here `test`, as a policy in Kyverno's own test suite has it).
    #[test]
    fn a_clone_into_one_fixed_namespace_targets_that_namespace() {
        for trigger in [
            json!({"any": [{"resources": {"kinds": ["Namespace"]}}]}),
            json!({"any": [{"resources": {"kinds": ["ConfigMap"], "names": ["trigger"]}}]}),
        ] {
            let mut rule = clone_rule(json!({"namespace": "test"}));
            rule["match"] = trigger;
            let imported = converted(&[policy(rule)]);
            assert_eq!(imported.rules.len(), 1, "{:#?}", imported.reports);
            assert_eq!(
                imported.rules[0]["spec"]["targets"],
                json!({"include": ["test"]})
            );
            let report = only_report(&imported);
            assert!(
                says(&report.differs, "the one namespace \"test\""),
                "{report:#?}"
            );
            assert!(report.unmapped.is_empty(), "{report:#?}");
        }
    }

    #[test]
    fn other_triggers_other_targets_and_wildcard_labels_are_unmapped() {
        let cases = [
            (
                json!({"any": [{"resources": {"kinds": ["Pod"]}}]}),
                json!("{{request.object.metadata.name}}"),
                "not a Namespace",
            ),
            (
                json!({"any": [{"resources": {"kinds": ["Namespace"]}}]}),
                json!("{{request.object.metadata.labels.team}}"),
                "not into the namespace that triggers",
            ),
            (
                json!({"any": [{"resources": {"kinds": ["Namespace"], "selector": {"matchLabels": {"team": "a*"}}}}]}),
                json!("{{request.object.metadata.name}}"),
                "wildcards",
            ),
            (
                json!({"any": [{"resources": {"kinds": ["Namespace"]}, "subjects": [{"kind": "User", "name": "x"}]}]}),
                json!("{{request.object.metadata.name}}"),
                "who makes the namespace",
            ),
        ];
        for (trigger, namespace, why) in cases {
            let mut rule = clone_rule(json!({"namespace": namespace}));
            rule["match"] = trigger;
            let imported = converted(&[policy(rule)]);
            assert!(imported.rules.is_empty(), "{why}");
            assert!(imported.source_labels.is_empty(), "{why}");
            assert!(
                says(&only_report(&imported).unmapped, why),
                "{why}: {:#?}",
                imported.reports
            );
        }
        let computed = converted(&[policy(clone_rule(
            json!({"name": "{{request.object.metadata.name}}-regcred"}),
        ))]);
        assert!(computed.rules.is_empty());
        assert!(says(
            &only_report(&computed).unmapped,
            "generate.name \"{{request.object.metadata.name}}-regcred\" is computed by Kyverno's variables"
        ));
        let mut by_operation = clone_rule(json!({}));
        by_operation["exclude"] = json!({"any": [{"resources": {"operations": ["UPDATE"]}}]});
        let by_operation = converted(&[policy(by_operation)]);
        assert!(by_operation.rules.is_empty());
        assert!(says(
            &only_report(&by_operation).unmapped,
            "exclude by operations is not converted"
        ));
        // A rule left out says nothing of the settings it would have had.
        assert!(!says(&only_report(&computed).exact, "syncPolicy"));
        let data = converted(&[policy(clone_rule(
            json!({"data": {"kind": "x"}, "clone": null}),
        ))]);
        assert!(says(&only_report(&data).unmapped, "generate.data"));
    }

    #[test]
    fn a_clone_under_another_name_is_a_rule_that_names_its_copies_so() {
        let imported = converted(&[policy(clone_rule(json!({"name": "platform-regcred"})))]);
        let name = "kyverno-p-sync-image-pull-secret";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "copyrator"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "default",
                    "adopt": true,
                    "syncPolicy": "Sync",
                    "transform": {"name": {"prefix": "platform-"}}
                }
            })]
        );
        assert_eq!(
            copy_name_of(&imported.rules[0], "regcred"),
            "platform-regcred"
        );
        // The one source, by its import label, as for a clone of its name.
        let [label] = imported.source_labels.as_slice() else {
            panic!("{:#?}", imported.source_labels);
        };
        assert_eq!(
            (label.namespace.as_str(), label.name.as_str()),
            ("default", "regcred")
        );
        let report = only_report(&imported);
        assert_eq!(
            report.exact[..3],
            [
                "triggered by Namespaces and copying into each: the rule copies into every namespace",
                "the source, Secret default/regcred, is selected by the rule's import label, to be put on it",
                "copies are named platform-regcred, the name generate.name gives them: the source's name regcred with \"platform-\" before it (transform.name.prefix)",
            ]
        );
        assert!(report.unmapped.is_empty(), "{report:#?}");
        for (copy, naming) in [
            ("regcred-copy", json!({"suffix": "-copy"})),
            (
                "team.regcred.v1",
                json!({"prefix": "team.", "suffix": ".v1"}),
            ),
            ("pull-secret", json!({"template": "pull-secret"})),
        ] {
            let imported = converted(&[policy(clone_rule(json!({"name": copy})))]);
            assert_eq!(
                imported.rules[0]["spec"]["transform"],
                json!({"name": naming}),
                "{copy}"
            );
            assert_eq!(copy_name_of(&imported.rules[0], "regcred"), copy);
            assert!(only_report(&imported).unmapped.is_empty(), "{copy}");
        }
        let fixed = converted(&[policy(clone_rule(json!({"name": "pull-secret"})))]);
        assert!(
            says(
                &only_report(&fixed).exact,
                "copies are named pull-secret, the name generate.name gives them (transform.name.template)"
            ),
            "{:#?}",
            fixed.reports
        );
    }

    #[test]
    fn a_clone_under_another_name_may_stand_beside_its_source_and_never_on_it() {
        let beside = converted(&[policy(clone_rule(
            json!({"namespace": "default", "name": "regcred-copy"}),
        ))]);
        assert_eq!(
            beside.rules[0]["spec"]["targets"],
            json!({"include": ["default"]})
        );
        assert_eq!(beside.rules[0]["spec"]["namespace"], "default");
        assert_eq!(copy_name_of(&beside.rules[0], "regcred"), "regcred-copy");
        assert!(only_report(&beside).unmapped.is_empty());
        let onto = converted(&[policy(clone_rule(json!({"namespace": "default"})))]);
        assert!(onto.rules.is_empty());
        assert_eq!(
            only_report(&onto).unmapped,
            [
                "the source is in default, the namespace the copy goes into under the source's name: the copy would be the source itself, which Copyrator never writes"
            ]
        );
        let invalid = converted(&[policy(clone_rule(json!({"name": "Pull_Secret"})))]);
        assert!(invalid.rules.is_empty());
        assert!(
            says(
                &only_report(&invalid).unmapped,
                "the copies' name \"Pull_Secret\" cannot be given by a rule"
            ),
            "{:#?}",
            invalid.reports
        );
    }

    #[test]
    fn a_match_filter_of_another_kind_beside_the_namespace_trigger_is_left_out_and_said() {
        let mut rule = clone_rule(json!({}));
        rule["match"] = json!({"any": [
            {"resources": {"kinds": ["Namespace"], "selector": {"matchLabels": {"team": "a"}}}},
            {"resources": {"kinds": ["Secret"], "names": ["regcred"], "namespaces": ["default"]}},
        ]});
        let imported = converted(&[policy(rule)]);
        let report = only_report(&imported);
        assert!(report.unmapped.is_empty(), "{report:#?}");
        assert_eq!(imported.rules.len(), 1, "{report:#?}");
        assert_eq!(
            imported.rules[0]["spec"]["targets"]["namespaceSelector"],
            json!({"matchLabels": {"team": "a"}}),
            "the Namespace filter alone selects the targets"
        );
        assert!(
            says(
                &report.differs,
                "match filter on Secret named regcred is left out"
            ),
            "{report:#?}"
        );
        // A filter of another kind alone is still no Namespace trigger.
        let mut alone = clone_rule(json!({}));
        alone["match"] = json!({"any": [{"resources": {"kinds": ["Secret"]}}]});
        let alone = converted(&[policy(alone)]);
        assert!(alone.rules.is_empty());
        assert!(says(&only_report(&alone).unmapped, "not a Namespace"));
    }

    /// A tenant's Policy in team-a: its generate rule `rule`.
    pub(crate) fn tenant_policy(rule: Value) -> Value {
        let mut object = policy(rule);
        object["kind"] = json!("Policy");
        object["metadata"]["namespace"] = json!("team-a");
        object
    }

    /// A rule of a Policy in team-a that clones `clone` (a clone or
    /// cloneList) into team-a as db-creds: Kyverno lets a Policy generate
    /// only into its own namespace, named as it is.
    pub(crate) fn policy_clone(field: &str, clone: Value) -> Value {
        json!({
            "name": "take",
            "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "generate": {"apiVersion": "v1", "kind": "Secret", "name": "db-creds",
                         "namespace": "team-a", "synchronize": true, field: clone}
        })
    }

    #[test]
    fn a_tenants_policy_cloning_another_namespace_is_unmapped_and_asks_nothing_of_it() {
        // Kyverno refuses such a Policy; an import that made it a rule
        // (an admin's, in the operator's namespace) would copy the
        // victim's Secret into team-a once the victim's Secret carried the
        // label it asked the admin to put there.
        for (field, clone) in [
            ("clone", json!({"namespace": "victim", "name": "db-creds"})),
            (
                "cloneList",
                json!({"namespace": "victim", "kinds": ["v1/Secret"],
                       "selector": {"matchLabels": {"app": "db"}}}),
            ),
        ] {
            let imported = converted(&[tenant_policy(policy_clone(field, clone))]);
            assert!(imported.rules.is_empty(), "{field}: {:#?}", imported.rules);
            assert!(imported.source_labels.is_empty(), "{field}");
            let report = only_report(&imported);
            assert_eq!(report.source, "Policy team-a/p, rule take");
            assert_eq!(
                report.unmapped,
                [
                    "it clones from \"victim\", not from its own namespace team-a: Kyverno refuses a namespaced Policy that clones from another namespace, so it never copied anything. A Policy is team-a's configuration, and a rule made from it could take nothing from another namespace without the consent of its owner: no rule is made, and nothing is asked of \"victim\""
                ],
                "{field}"
            );
            assert!(
                report.exact.is_empty() && report.differs.is_empty(),
                "{report:#?}"
            );
        }
        // A namespace computed by Kyverno's variables is not its own either.
        let computed = converted(&[tenant_policy(policy_clone(
            "clone",
            json!({"namespace": "{{request.object.metadata.labels.from}}", "name": "db-creds"}),
        ))]);
        assert!(computed.rules.is_empty());
        assert!(says(&only_report(&computed).unmapped, "Kyverno refuses"));
    }

    #[test]
    fn a_policy_cloning_within_its_namespace_under_another_name_is_a_rule_of_that_namespace() {
        let rule = policy_clone("clone", json!({"namespace": "team-a", "name": "settings"}));
        let imported = converted(&[tenant_policy(rule.clone())]);
        let name = "kyverno-p-take";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "team-a",
                    "adopt": true,
                    "targets": {"include": ["team-a"]},
                    "syncPolicy": "Sync",
                    "transform": {"name": {"template": "db-creds"}}
                }
            })]
        );
        assert_eq!(copy_name_of(&imported.rules[0], "settings"), "db-creds");
        // Its own namespace's object: the label is asked for.
        assert_eq!(
            imported.source_labels,
            [SourceLabel {
                kind: "Secret".into(),
                api_version: "v1".into(),
                namespace: "team-a".into(),
                name: "settings".into(),
                key: import_label_key(name),
                value: "true".into(),
            }]
        );
        let report = only_report(&imported);
        assert_eq!(report.source, "Policy team-a/p, rule take");
        assert_eq!(
            report.exact[..2],
            [
                "the source, Secret team-a/settings, is selected by the rule's import label, to be put on it",
                "copies are named db-creds, the name generate.name gives them (transform.name.template)",
            ]
        );
        assert!(
            says(
                &report.differs,
                "the copy goes into team-a, the Policy's own namespace and its source's: Kyverno makes it once a ConfigMap it matches is created there; the rule keeps it there from the start"
            ),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "the rule is team-a's, a tenant rule"),
            "{report:#?}"
        );
        // Into its own namespace alone, it asks no namespace's consent.
        assert!(!says(&report.differs, "accept-from"), "{report:#?}");
        assert!(!says(&report.differs, "allow-to"), "{report:#?}");
        assert!(report.unmapped.is_empty(), "{report:#?}");
        // The source's name with a suffix: an affix.
        let mut suffixed = rule.clone();
        suffixed["generate"]["name"] = json!("settings-copy");
        let suffixed = converted(&[tenant_policy(suffixed)]);
        assert_eq!(
            suffixed.rules[0]["spec"]["transform"],
            json!({"name": {"suffix": "-copy"}})
        );
        // A Policy of the operator's namespace makes a rule there.
        let mut admins = tenant_policy(rule.clone());
        admins["metadata"]["namespace"] = json!("copyrator");
        let mut admins_rule = rule.clone();
        admins_rule["generate"]["namespace"] = json!("copyrator");
        admins_rule["generate"]["clone"]["namespace"] = json!("copyrator");
        admins["spec"]["rules"] = json!([admins_rule]);
        let admins = converted(&[admins]);
        assert_eq!(admins.rules[0]["metadata"]["namespace"], "copyrator");
        assert!(!says(&only_report(&admins).differs, "tenant rule"));
    }

    #[test]
    fn a_policy_that_copies_nothing_or_what_kyverno_refuses_makes_no_rule() {
        let rule = policy_clone("clone", json!({"namespace": "team-a", "name": "settings"}));
        /// A change to the rule.
        type Edit = fn(&mut Value);
        let edited = |edit: Edit| {
            let mut rule = rule.clone();
            edit(&mut rule);
            converted(&[tenant_policy(rule)])
        };
        let cases: [(Edit, &str); 6] = [
            (
                |r| r["generate"]["name"] = json!("settings"),
                "generate.name is clone.name, and a Policy generates into the namespace it clones from: the copy would be its source itself, Secret team-a/settings, which Copyrator never writes: no rule is made",
            ),
            (
                |r| r["generate"]["namespace"] = json!("{{request.object.metadata.namespace}}"),
                "generate.namespace is \"{{request.object.metadata.namespace}}\", not team-a: Kyverno refuses a namespaced Policy that names another namespace to generate into, even by a variable (\"a namespaced policy cannot generate resources in other namespaces\"), so it never copied anything: no rule is made",
            ),
            (
                |r| {
                    r["generate"]["clone"] = Value::Null;
                    r["generate"]["cloneList"] =
                        json!({"namespace": "team-a", "kinds": ["v1/Secret"]});
                },
                "cloneList's copies keep their sources' names, and a Policy clones within its own namespace, team-a, into team-a (Kyverno allows it nothing else): each copy would be its source itself, which Copyrator never writes: no rule is made",
            ),
            (
                |r| r["generate"]["clone"] = json!({"name": "settings"}),
                "its clone names no namespace: Kyverno refuses a namespaced Policy whose clone source names none, so it never copied anything: no rule is made",
            ),
            (
                |r| r["generate"]["data"] = json!({"kind": "x"}),
                "generate.data makes the object from the policy itself",
            ),
            (
                |r| {
                    r["generate"]["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
                    r["generate"]["kind"] = json!("Role");
                },
                "a tenant rule copies ConfigMaps and Secrets only",
            ),
        ];
        for (edit, why) in cases {
            let imported = edited(edit);
            assert!(imported.rules.is_empty(), "{why}: {:#?}", imported.rules);
            assert!(imported.source_labels.is_empty(), "{why}");
            assert!(
                says(&only_report(&imported).unmapped, why),
                "{why}: {:#?}",
                imported.reports
            );
        }
    }

    #[test]
    fn a_clone_list_without_selector_selects_labelled_sources_and_odd_kinds_are_said() {
        let mut rule = yaml(MULTI_CLONE)["spec"]["rules"][0].clone();
        rule["generate"]["cloneList"] = json!({"namespace": "staging",
            "kinds": ["v1/Secret", "rbac.authorization.k8s.io/v1/RoleBinding", "*"]});
        let imported = converted(&[policy(rule)]);
        assert_eq!(imported.rules.len(), 2);
        let binding = &imported.rules[0];
        assert_eq!(
            binding["spec"]["objectType"],
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"})
        );
        assert_eq!(binding["spec"]["rbacSourcesTrusted"], true);
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(
            binding["spec"]["selector"],
            json!({import_label_key(name): "true"})
        );
        assert!(imported.source_labels.is_empty(), "no one object to name");
        let report = only_report(&imported);
        assert!(
            says(&report.differs, "put on each object in staging"),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "rbacSourcesTrusted: true"),
            "{report:#?}"
        );
        assert!(
            says(&report.unmapped, "cloneList kind \"*\""),
            "{report:#?}"
        );
    }

    #[test]
    fn the_documented_generating_policies_are_rules_from_a_labelled_source() {
        let imported = converted(&[yaml(GENERATE_SECRET), yaml(GENERATE_EXISTING)]);
        let names: Vec<&str> = imported
            .rules
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["kyverno-generate-secret", "kyverno-generate-secrets"]
        );
        assert_eq!(
            imported.rules[0]["spec"],
            json!({
                "ruleType": "secret",
                "selector": {import_label_key("kyverno-generate-secret"): "true"},
                "namespace": "default",
                "adopt": true,
                "syncPolicy": "CreateOnly"
            })
        );
        assert_eq!(imported.source_labels.len(), 2);
        assert!(
            imported
                .source_labels
                .iter()
                .all(|l| l.namespace == "default" && l.name == "regcred")
        );
        let [single, existing] = imported.reports.as_slice() else {
            panic!("{:#?}", imported.reports);
        };
        assert_eq!(single.source, "GeneratingPolicy generate-secret");
        assert!(
            says(&single.exact, "resource.Get of Secret default/regcred"),
            "{single:#?}"
        );
        assert!(says(&single.differs, "synchronize is false"), "{single:#?}");
        assert!(
            says(&single.differs, "generateExisting is false"),
            "{single:#?}"
        );
        assert!(
            says(&existing.exact, "generateExisting: true"),
            "{existing:#?}"
        );
        assert!(single.unmapped.is_empty() && existing.unmapped.is_empty());
    }

    #[test]
    fn a_generating_policy_listing_sources_selects_labelled_ones() {
        // KYW generating-policy.mdx §"Clone Multiple Resources": the same
        // shape with resource.List.
        let mut object = yaml(GENERATE_SECRET);
        object["spec"]["variables"][1] = json!({"name": "sources", "expression": "resource.List(\"v1\", \"secrets\", \"default\")"});
        object["spec"]["generate"][0]["expression"] =
            json!("generator.Apply(variables.nsName, [variables.sources])");
        object["spec"]["evaluation"] = json!({"synchronize": {"enabled": true}});
        let imported = converted(&[object]);
        let spec = &imported.rules[0]["spec"];
        assert_eq!(spec["syncPolicy"], "Sync");
        assert_eq!(spec["deletionPolicy"], json!({"ruleDeleted": "Orphan"}));
        assert!(imported.source_labels.is_empty());
        assert!(says(
            &only_report(&imported).differs,
            "resource.List copies every Secret in default"
        ));
    }

    #[test]
    fn a_namespaced_generating_policy_is_reported_unmapped() {
        let mut object = yaml(GENERATE_SECRET);
        object["kind"] = json!("NamespacedGeneratingPolicy");
        object["metadata"]["namespace"] = json!("team-a");
        let imported = converted(&[object]);
        assert!(imported.rules.is_empty());
        let report = only_report(&imported);
        assert_eq!(
            report.source,
            "NamespacedGeneratingPolicy team-a/generate-secret"
        );
        assert!(says(&report.unmapped, "not converted"), "{report:#?}");
    }

    #[test]
    fn other_generating_policies_are_unmapped_with_the_expression_quoted() {
        let mut object = yaml(GENERATE_SECRET);
        object["spec"]["generate"] = json!([
            {"expression": "generator.Apply(\"fixed\", [variables.source])"},
            {"template": {"value": {"kind": "Secret"}}}
        ]);
        let imported = converted(&[object]);
        assert!(imported.rules.is_empty());
        let report = only_report(&imported);
        assert!(
            says(
                &report.unmapped,
                "generate[0]: `generator.Apply(\"fixed\", [variables.source])` is not the clone shape"
            ),
            "{report:#?}"
        );
        assert!(
            says(&report.unmapped, "generate[1]: a template"),
            "{report:#?}"
        );
        let mut pods = yaml(GENERATE_SECRET);
        pods["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["pods"]);
        assert!(says(
            &only_report(&converted(&[pods])).unmapped,
            "not the making of Namespaces"
        ));
    }
}
