//! What every tool's conversion uses: the objects read, drafts of rules
//! and how they become named CopyratorRules, targets, kinds, and reading
//! objects as JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::patterns::Selector;
use super::{Imported, Options, SourceLabel, SourceReport};
use crate::api::rule::CopyName;
use crate::api::selector::Glob;
use crate::core::naming::Naming;
use crate::core::resolve::PROTECTED_NAMESPACES;

/// The longest rule name: the source label's key, `import.` and the name,
/// must stay within a label key's 63 characters.
pub(super) const MAX_RULE_NAME: usize = 56;
/// The most globs `targets.include` or `targets.exclude` may hold.
pub(super) const MAX_GLOBS: usize = 64;

/// All a conversion may look at: every object read, and the options.
pub(super) struct Context<'a> {
    pub(super) objects: &'a [Value],
    pub(super) options: &'a Options,
}

impl Context<'_> {
    /// The object of this kind, namespace and name among those read.
    pub(super) fn find(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.iter().find(|o| {
            Named::of(o).is_some_and(|found| {
                found.kind == kind && found.namespace == namespace && found.name == name
            })
        })
    }
}

/// Where a rule's sources are, and how it selects them.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Source {
    /// The objects a label selector (JSON) selects in a namespace.
    Selected { namespace: String, selector: Value },
    /// One object by name: the rule selects the import label, to be put on it.
    Named { namespace: String, name: String },
    /// The objects of a namespace that the user puts the import label on.
    ToLabel { namespace: String },
}

/// Whose configuration a rule is made from, and so where the rule lives:
/// a rule has no more authority than whoever wrote what it is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// Cluster-scoped configuration (a ClusterPolicy, a GeneratingPolicy,
    /// a ClusterSecret), which only the cluster's admins write, or
    /// configuration in the operator's namespace: a rule there.
    Admin,
    /// The configuration of a namespace (annotations on its objects),
    /// written by whoever may edit objects there: a tenant rule in that
    /// namespace, which copies only under the consent of the namespaces
    /// it writes into and of the sources it takes from elsewhere.
    Tenant(String),
}

impl Owner {
    /// The owner of configuration that lives in `namespace`.
    pub(super) fn of_namespace(namespace: &str, options: &Options) -> Self {
        if namespace == options.rule_namespace {
            Self::Admin
        } else {
            Self::Tenant(namespace.to_owned())
        }
    }

    /// Why a tenant rule cannot copy this kind, if it cannot: consent is
    /// given per namespace, not per kind.
    pub(super) fn kind_refusal(&self, api_version: &str, kind: &str) -> Result<(), String> {
        match self {
            Self::Tenant(namespace) if !is_config_map_or_secret(api_version, kind) => Err(format!(
                "this is {namespace}'s configuration, so its rule would be {namespace}'s (a tenant rule), and a tenant rule copies ConfigMaps and Secrets only, not {kind} ({api_version}): no rule is made"
            )),
            _ => Ok(()),
        }
    }

    /// What a report says of `conflictPolicy: Overwrite` as the closest
    /// to a tool that took over objects it did not make.
    pub(super) fn overwrite_note(&self) -> &'static str {
        match self {
            Self::Admin => "the closest is conflictPolicy: Overwrite, which replaces it whole",
            Self::Tenant(_) => {
                "a tenant rule may not use conflictPolicy: Overwrite: such an object stays a conflict until its owner removes it"
            }
        }
    }
}

fn is_config_map_or_secret(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && matches!(kind, "ConfigMap" | "Secret")
}

/// A rule before it has its name.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Draft {
    /// The name wanted, made a valid and unique rule name later.
    pub(super) name: String,
    /// Whose configuration it is made from: the rule's namespace.
    pub(super) owner: Owner,
    pub(super) api_version: String,
    pub(super) kind: String,
    pub(super) source: Source,
    /// The rest of the spec: targets, syncPolicy, deletionPolicy, transform.
    pub(super) spec: Map<String, Value>,
    /// `transform.name`, where copies are named otherwise than their source.
    pub(super) naming: Option<CopyName>,
}

/// What one configuration became.
#[derive(Debug)]
pub(super) struct Conversion {
    pub(super) drafts: Vec<Draft>,
    pub(super) report: SourceReport,
}

impl SourceReport {
    pub(super) fn new(tool: &str, source: impl Into<String>) -> Self {
        Self {
            tool: tool.to_owned(),
            source: source.into(),
            ..Self::default()
        }
    }

    pub(super) fn exact(&mut self, line: impl Into<String>) {
        self.exact.push(line.into());
    }

    pub(super) fn differs(&mut self, line: impl Into<String>) {
        self.differs.push(line.into());
    }

    pub(super) fn unmapped(&mut self, line: impl Into<String>) {
        self.unmapped.push(line.into());
    }

    /// This report with no rule.
    pub(super) fn alone(self) -> Conversion {
        Conversion {
            drafts: Vec::new(),
            report: self,
        }
    }

    /// This report with these rules.
    pub(super) fn with(self, drafts: Vec<Draft>) -> Conversion {
        Conversion {
            drafts,
            report: self,
        }
    }
}

/// Every object once, Lists opened, in a stable order: an object read
/// twice (from the cluster and a file) counts once, the same one whatever
/// the order it came in. Each comes with how many different definitions
/// of it were read (1 but where the input defines one object twice,
/// differently: which one the cluster would hold depends on the order they
/// are applied in, so the report says so).
pub(super) fn distinct_objects(objects: &[Value]) -> Vec<(Value, usize)> {
    let mut by_identity: BTreeMap<(String, String, String, String), BTreeMap<String, Value>> =
        BTreeMap::new();
    let mut pending: Vec<&Value> = objects.iter().collect();
    while let Some(object) = pending.pop() {
        if let Some(items) = object.get("items").and_then(Value::as_array)
            && str_at(object, &["kind"]).is_some_and(|k| k.ends_with("List"))
        {
            pending.extend(items);
            continue;
        }
        let identity = (
            str_at(object, &["apiVersion"])
                .unwrap_or_default()
                .to_owned(),
            str_at(object, &["kind"]).unwrap_or_default().to_owned(),
            str_at(object, &["metadata", "namespace"])
                .unwrap_or_default()
                .to_owned(),
            str_at(object, &["metadata", "name"])
                .unwrap_or_default()
                .to_owned(),
        );
        by_identity
            .entry(identity)
            .or_default()
            .insert(object.to_string(), object.clone());
    }
    by_identity
        .into_values()
        .filter_map(|mut definitions| {
            let count = definitions.len();
            // The greatest text: the same one whatever the order.
            definitions.pop_last().map(|(_, object)| (object, count))
        })
        .collect()
}

/// The conversions as named rules, source labels and reports, each in a
/// stable order.
pub(super) fn assemble(mut conversions: Vec<Conversion>, options: &Options) -> Imported {
    conversions.sort_by(|a, b| {
        (&a.report.tool, &a.report.source).cmp(&(&b.report.tool, &b.report.source))
    });
    let mut taken = BTreeSet::new();
    let mut imported = Imported::default();
    for conversion in conversions {
        let mut report = conversion.report;
        let mut tenant = Vec::new();
        for (index, draft) in conversion.drafts.into_iter().enumerate() {
            let identity = format!("{}/{}/{index}", report.tool, report.source);
            let name = unique_name(&draft.name, &identity, &mut taken);
            if let Owner::Tenant(namespace) = &draft.owner {
                for line in tenant_lines(namespace, &name, &draft, &report.tool) {
                    if !tenant.contains(&line) {
                        tenant.push(line);
                    }
                }
            }
            let (rule, label) = build_rule(&name, draft, options);
            imported.rules.push(rule);
            imported.source_labels.extend(label);
            report.rules.push(name);
        }
        // First, as what a tenant rule asks of others is read first.
        report.differs.splice(0..0, tenant);
        imported.reports.push(report);
    }
    imported
        .rules
        .sort_by(|a, b| str_at(a, &["metadata", "name"]).cmp(&str_at(b, &["metadata", "name"])));
    imported.source_labels.sort_by(|a, b| {
        (&a.namespace, &a.kind, &a.name, &a.key).cmp(&(&b.namespace, &b.kind, &b.name, &b.key))
    });
    imported.source_labels.dedup();
    imported
}

/// What a tenant rule made from `namespace`'s configuration asks of
/// others, for its report. Nothing here tells anyone to change an object
/// outside `namespace`: only its owner may consent to its copying.
fn tenant_lines(namespace: &str, rule: &str, draft: &Draft, tool: &str) -> Vec<String> {
    let mut lines = vec![
        format!(
            "this is {namespace}'s configuration, written by whoever may edit objects there: the rule is {namespace}'s, a tenant rule, followed only when the operator runs with --all-namespaces, and never with conflictPolicy: Overwrite"
        ),
        format!(
            "the rule reads and writes as a ServiceAccount of {namespace} (copyrator, unless the operator's --default-service-account names another; not with --tenant-identity operator): until that account exists, may get the source and edit where the rule copies, and {namespace} lets the operator act as it, the rule copies and adopts nothing (docs/trust.md, Whom a rule acts as)"
        ),
    ];
    let source_namespace = match &draft.source {
        Source::Selected { namespace, .. }
        | Source::Named { namespace, .. }
        | Source::ToLabel { namespace } => namespace,
    };
    if source_namespace != namespace {
        if let Source::Named {
            namespace: from,
            name,
        } = &draft.source
        {
            lines.push(format!(
                "the rule takes {} {from}/{name} only while its owner consents: the annotation copyrator.flant.com/allow-to on it listing {namespace}, and the label {}=true, which only the owner of {from} may put on it (no command here touches an object outside {namespace})",
                draft.kind,
                import_label_key(rule)
            ));
        }
    } else if draft.spec.get("targets") != Some(&json!({"include": [namespace]})) {
        // Into its own namespace alone, a rule needs no one's consent.
        lines.push(format!(
            "the rule copies only into those of its targets whose annotation copyrator.flant.com/accept-from lists {namespace}: {tool}'s copies in the others are neither adopted nor touched"
        ));
        lines.push(format!(
            "of those, it adopts {tool}'s copies only where their marks say they came from {namespace} (reflector's, config-syncer's and Kyverno's do) or the namespace's annotation copyrator.flant.com/adopt-from lists {namespace}; elsewhere they are conflicts"
        ));
    }
    lines
}

/// `wanted` as a rule name no other rule of this import has.
fn unique_name(wanted: &str, identity: &str, taken: &mut BTreeSet<String>) -> String {
    let mut name = rule_name(wanted);
    if taken.contains(&name) {
        name = hashed_name(&rule_name(wanted), identity);
    }
    taken.insert(name.clone());
    name
}

/// `wanted` as a DNS-1123 label of at most [`MAX_RULE_NAME`] characters;
/// a longer one is cut and ends in a hash of the whole, so that two long
/// names that start alike stay apart.
pub(super) fn rule_name(wanted: &str) -> String {
    let name = sanitized(wanted);
    if name.is_empty() {
        return hashed_name("rule", wanted);
    }
    if name.len() <= MAX_RULE_NAME {
        return name;
    }
    hashed_name(&name, wanted)
}

/// Lowercase letters, digits and single `-`, neither first nor last;
/// empty when `wanted` has no letter or digit.
fn sanitized(wanted: &str) -> String {
    let mut name = String::new();
    for c in wanted.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            name.push(c);
        } else if !name.is_empty() && !name.ends_with('-') {
            name.push('-');
        }
    }
    name.trim_end_matches('-').to_owned()
}

/// `name` cut to leave room for `-` and 8 hex digits of `hashed`'s SHA-256.
fn hashed_name(name: &str, hashed: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, hashed.as_bytes());
    let hash: String = digest
        .as_ref()
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    let room = MAX_RULE_NAME - hash.len() - 1;
    let cut = name.get(..room.min(name.len())).unwrap_or(name);
    format!("{}-{hash}", cut.trim_end_matches('-'))
}

/// The label a rule of this name selects its one named source by. Keys
/// under `copyrator.flant.com/` never travel to copies.
pub(super) fn import_label_key(rule_name: &str) -> String {
    format!("copyrator.flant.com/import.{rule_name}")
}

/// The whole CopyratorRule of a draft, and the label to put on its source.
fn build_rule(name: &str, draft: Draft, options: &Options) -> (Value, Option<SourceLabel>) {
    let rule_namespace = match &draft.owner {
        Owner::Admin => options.rule_namespace.clone(),
        Owner::Tenant(namespace) => namespace.clone(),
    };
    let mut spec = Map::new();
    if is_config_map_or_secret(&draft.api_version, &draft.kind) {
        spec.insert("ruleType".into(), json!(draft.kind.to_ascii_lowercase()));
    } else {
        spec.insert(
            "objectType".into(),
            json!({"apiVersion": draft.api_version, "kind": draft.kind}),
        );
    }
    if is_rbac(&draft.api_version, &draft.kind) {
        spec.insert("rbacSourcesTrusted".into(), json!(true));
    }
    let key = import_label_key(name);
    let (namespace, selector, label) = match draft.source {
        Source::Selected {
            namespace,
            selector,
        } => (namespace, selector, None),
        Source::Named { namespace, name } => {
            // A tenant rule's source elsewhere is labelled by its owner
            // alone, with its consent (see `tenant_lines`).
            let label =
                (draft.owner == Owner::Admin || namespace == rule_namespace).then(|| SourceLabel {
                    kind: draft.kind.clone(),
                    api_version: draft.api_version.clone(),
                    namespace: namespace.clone(),
                    name,
                    key: key.clone(),
                    value: "true".into(),
                });
            (namespace, json!({ key: "true" }), label)
        }
        Source::ToLabel { namespace } => (namespace, json!({ key: "true" }), None),
    };
    spec.insert("selector".into(), selector);
    spec.insert("namespace".into(), json!(namespace));
    spec.insert("adopt".into(), json!(true));
    spec.extend(draft.spec);
    if let Some(naming) = draft.naming {
        let transform = spec
            .entry("transform")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(transform) = transform {
            transform.insert("name".into(), json!(naming));
        }
    }
    let rule = json!({
        "apiVersion": "flant.com/v1",
        "kind": "CopyratorRule",
        "metadata": {"name": name, "namespace": rule_namespace},
        "spec": spec,
    });
    (rule, label)
}

fn is_rbac(api_version: &str, kind: &str) -> bool {
    api_version.starts_with("rbac.authorization.k8s.io/") && matches!(kind, "Role" | "RoleBinding")
}

/// What the report says of copying this kind with Copyrator.
pub(super) fn kind_notes(api_version: &str, kind: &str, tool: &str) -> Vec<String> {
    if is_config_map_or_secret(api_version, kind) {
        return Vec::new();
    }
    let mut notes = vec![format!(
        "Copyrator copies {kind} ({api_version}) only when its --kinds setting enables it (the chart's extraKinds), and a copy carries every top-level field of its source but metadata and status"
    )];
    if is_rbac(api_version, kind) {
        notes.push(format!(
            "the rule sets rbacSourcesTrusted: true, as {tool} copied {kind}s with no such setting: whoever may write {kind}s in the source namespace grants what they write in every target; remove it if they are not trusted with that"
        ));
    }
    notes
}

/// The namespaces a rule copies into.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Targets {
    /// Globs; `None` is every namespace, an empty list none (such
    /// targets make no rule: a rule's empty list is every namespace).
    pub(super) include: Option<Vec<String>>,
    pub(super) exclude: Vec<String>,
    pub(super) selector: Option<Selector>,
}

impl Targets {
    pub(super) fn including(globs: Vec<String>) -> Self {
        Self {
            include: Some(globs),
            ..Self::default()
        }
    }

    /// No namespace matches an empty list of globs.
    pub(super) fn reaches_nothing(&self) -> bool {
        self.include.as_ref().is_some_and(Vec::is_empty)
    }

    /// Why these targets cannot be written as a rule's, if they cannot.
    pub(super) fn refusal(&self) -> Option<String> {
        let include = self.include.as_ref().map_or(0, Vec::len);
        if include > MAX_GLOBS || self.exclude.len() > MAX_GLOBS {
            return Some(format!(
                "a rule's targets.include and targets.exclude hold at most {MAX_GLOBS} globs each; these need {include} and {}",
                self.exclude.len()
            ));
        }
        None
    }

    /// `targets` of a rule's spec; `None` for every namespace.
    pub(super) fn to_json(&self) -> Option<Value> {
        let mut targets = Map::new();
        if let Some(include) = &self.include {
            targets.insert("include".into(), json!(include));
        }
        if !self.exclude.is_empty() {
            targets.insert("exclude".into(), json!(self.exclude));
        }
        if let Some(selector) = self.selector.as_ref().filter(|s| !s.is_empty()) {
            targets.insert("namespaceSelector".into(), selector.to_json());
        }
        (!targets.is_empty()).then_some(Value::Object(targets))
    }

    /// The targets in words, for reports.
    pub(super) fn describe(&self) -> String {
        let mut words = match &self.include {
            None => "every namespace".to_owned(),
            Some(include) => format!("the namespaces matching {}", include.join(", ")),
        };
        if !self.exclude.is_empty() {
            words.push_str(&format!(" but {}", self.exclude.join(", ")));
        }
        if let Some(selector) = self.selector.as_ref().filter(|s| !s.is_empty()) {
            words.push_str(&format!(" whose labels match {}", selector.text()));
        }
        words
    }

    /// The protected namespaces these targets reach only by a glob or a
    /// selector, which Copyrator does not copy into, while the tool may
    /// have (its own filters, such as Kyverno's resource filters, are not
    /// seen here).
    pub(super) fn protected_note(&self, tool: &str, options: &Options) -> Option<String> {
        let mut protected: Vec<&str> = PROTECTED_NAMESPACES.to_vec();
        protected.push(&options.rule_namespace);
        let globs = |patterns: &[String]| -> Vec<Glob> {
            patterns.iter().filter_map(|p| Glob::new(p).ok()).collect()
        };
        let include = self.include.as_deref().map(globs);
        let exclude = globs(&self.exclude);
        let reached: Vec<&str> = protected
            .into_iter()
            .filter(|ns| {
                let named = include
                    .as_ref()
                    .is_some_and(|i| i.iter().any(|g| g.is_exactly(ns)));
                let matched = include
                    .as_ref()
                    .is_none_or(|i| i.iter().any(|g| g.matches(ns)));
                matched && !named && !exclude.iter().any(|g| g.matches(ns))
            })
            .collect();
        if reached.is_empty() {
            return None;
        }
        let maybe = if self.selector.is_some() {
            " where their labels match"
        } else {
            ""
        };
        Some(format!(
            "the targets also match {}{maybe}, which Copyrator copies into only when targets.include names them exactly: add them there if {tool}'s copies there should stay",
            reached.join(", ")
        ))
    }
}

/// The string at `path` in `value`.
pub(super) fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
}

/// The value at `path` in `value`.
pub(super) fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

/// The boolean at `path`, `None` if there is none.
pub(super) fn bool_at(value: &Value, path: &[&str]) -> Option<bool> {
    at(value, path).and_then(Value::as_bool)
}

/// `apiVersion` split into group and version (`v1`: the core group).
pub(super) fn group_version(object: &Value) -> (&str, &str) {
    match str_at(object, &["apiVersion"])
        .unwrap_or_default()
        .split_once('/')
    {
        Some((group, version)) => (group, version),
        None => ("", str_at(object, &["apiVersion"]).unwrap_or_default()),
    }
}

/// An object's annotation.
pub(super) fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    at(object, &["metadata", "annotations", key]).and_then(Value::as_str)
}

/// A namespaced object's kind, namespace and name, as a report's source
/// says them; a missing namespace is `default`, as kubectl takes it, and
/// the report says so.
pub(super) struct Named {
    pub(super) api_version: String,
    pub(super) kind: String,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) namespace_given: bool,
}

impl Named {
    pub(super) fn of(object: &Value) -> Option<Self> {
        let namespace = str_at(object, &["metadata", "namespace"]).filter(|n| !n.is_empty());
        Some(Self {
            api_version: str_at(object, &["apiVersion"])?.to_owned(),
            kind: str_at(object, &["kind"])?.to_owned(),
            namespace: namespace.unwrap_or("default").to_owned(),
            name: str_at(object, &["metadata", "name"])?.to_owned(),
            namespace_given: namespace.is_some(),
        })
    }

    /// `Secret default/regcred`
    pub(super) fn text(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }

    /// A report on this object, saying where its namespace came from.
    pub(super) fn report(&self, tool: &str) -> SourceReport {
        let mut report = SourceReport::new(tool, self.text());
        if !self.namespace_given {
            report.differs(format!(
                "{} {} names no namespace: taken as default, as kubectl does",
                self.kind, self.name
            ));
        }
        report
    }

    /// `reflector-secret-default-regcred`
    pub(super) fn rule_name(&self, tool: &str) -> String {
        format!(
            "{tool}-{}-{}-{}",
            self.kind.to_ascii_lowercase(),
            self.namespace,
            self.name
        )
    }
}

/// `"namespace/name"` as a pull annotation says it.
pub(super) fn namespaced_name(text: &str) -> Option<(&str, &str)> {
    let (namespace, name) = text.trim().split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then_some((namespace, name))
}

/// The source `reference` (`namespace/name`, what `directive` of `target`
/// says) of an object that pulls it into its own namespace and name,
/// unless it names the object itself.
pub(super) fn pulled_source<'a>(
    target: &Named,
    reference: &'a str,
    directive: &str,
) -> Result<(&'a str, &'a str), String> {
    let (namespace, name) = namespaced_name(reference).ok_or_else(|| {
        format!("{directive} {reference:?} is not namespace/name: it names no source")
    })?;
    if namespace == target.namespace && name == target.name {
        return Err(format!(
            "{directive} names this object itself: it copies nothing, and no rule is made"
        ));
    }
    Ok((namespace, name))
}

/// How a rule of one source names its copy, and the report's line on it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Renaming {
    /// `transform.name`.
    pub(super) name: CopyName,
    /// What the report says of it: the copy's name, and how it is made.
    pub(super) line: String,
}

/// How a rule whose one source is named `source` names its copies `copy`:
/// none where the names are alike. With `affixes`, where `copy` holds
/// `source`, as the source's name with a prefix and/or a suffix;
/// otherwise as one fixed name (a template without `{name}`: the rule
/// selects its one source by its import label). `origin` says where the
/// other tool's name comes from ("the name the replica has"). An error
/// where `copy` can be no copy's name.
pub(super) fn renaming(
    source: &str,
    copy: &str,
    affixes: bool,
    origin: &str,
) -> Result<Option<Renaming>, String> {
    if copy == source {
        return Ok(None);
    }
    let gives = |name: &CopyName| {
        Naming::new(Some(name))
            .and_then(|naming| naming.copy_name(source))
            .map(|given| given == copy)
    };
    // The source's name as a whole part of the copy's, set off by '-' or
    // '.': "platform-ca", not "local-cache".
    let affixed = copy.match_indices(source).find_map(|(at, _)| {
        let (prefix, suffix) = (copy.get(..at)?, copy.get(at + source.len()..)?);
        let set_off = (prefix.is_empty() || prefix.ends_with(['-', '.']))
            && (suffix.is_empty() || suffix.starts_with(['-', '.']));
        set_off.then_some((prefix, suffix))
    });
    if affixes && let Some((prefix, suffix)) = affixed {
        let present = |text: &str| (!text.is_empty()).then(|| text.to_owned());
        let name = CopyName {
            prefix: present(prefix),
            suffix: present(suffix),
            template: None,
        };
        // Where affixes cannot give the name, a fixed name may.
        if gives(&name) == Ok(true) {
            let how = match (prefix.is_empty(), suffix.is_empty()) {
                (false, true) => format!("with {prefix:?} before it (transform.name.prefix)"),
                (true, false) => format!("with {suffix:?} after it (transform.name.suffix)"),
                _ => format!(
                    "with {prefix:?} before it and {suffix:?} after it (transform.name.prefix and suffix)"
                ),
            };
            return Ok(Some(Renaming {
                name,
                line: format!(
                    "copies are named {copy}, {origin}: the source's name {source} {how}"
                ),
            }));
        }
    }
    let name = CopyName {
        prefix: None,
        suffix: None,
        template: Some(copy.to_owned()),
    };
    match gives(&name) {
        Ok(true) => Ok(Some(Renaming {
            name,
            line: format!("copies are named {copy}, {origin} (transform.name.template)"),
        })),
        Ok(false) => Err(format!(
            "the copies' name {copy:?} is no name a rule's transform.name.template can give: no rule is made"
        )),
        Err(why) => Err(format!(
            "the copies' name {copy:?} cannot be given by a rule ({why}): no rule is made"
        )),
    }
}

/// `{"key": value}` as a spec entry map.
pub(super) fn spec_of(entries: &[(&str, Value)]) -> Map<String, Value> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// `transform` that carries none of the source's labels (when `labels`)
/// nor any of its annotations.
pub(super) fn strip_all(labels: bool) -> Value {
    if labels {
        json!({"stripLabels": ["*"], "stripAnnotations": ["*"]})
    } else {
        json!({"stripAnnotations": ["*"]})
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::api::rule::CopyratorRule;
    use crate::core::resolve::Trust;

    /// Every rule deserializes into a CopyratorRule and resolves under the
    /// default trust of an operator in `copyrator` that follows every
    /// namespace (so that a rule elsewhere is judged as a tenant rule),
    /// its kind enabled and known when it is not a ConfigMap or a Secret.
    pub(crate) fn assert_rules_resolve(imported: &Imported) {
        for rule in &imported.rules {
            let parsed: CopyratorRule =
                serde_json::from_value(rule.clone()).unwrap_or_else(|e| panic!("{rule}: {e}"));
            let mut trust = Trust::new("copyrator", true);
            if let Some(object_type) = parsed.object_type() {
                let (group, version) = object_type.group_version().unwrap_or(("", ""));
                crate::api::kinds::Kind::register(&crate::api::kinds::Discovered {
                    group: group.into(),
                    version: version.into(),
                    kind: object_type.kind.clone(),
                    plural: format!("{}s", object_type.kind.to_ascii_lowercase()),
                })
                .expect("room for a kind");
                std::sync::Arc::make_mut(&mut trust.policy).kinds =
                    crate::api::kinds::EnabledKinds::parse(&["*".to_owned()]).expect("valid");
            }
            if let Err(e) = parsed.resolve(&trust) {
                panic!("{rule} does not resolve: {}", e.message);
            }
            let name = parsed.metadata.name.clone().unwrap_or_default();
            assert!(crate::api::selector::is_dns_label(&name), "{name}");
            assert!(name.len() <= MAX_RULE_NAME, "{name}");
            crate::api::selector::validate_label_key(&import_label_key(&name))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.spec.as_ref().and_then(|s| s.adopt), Some(true));
        }
    }

    pub(crate) fn options() -> Options {
        Options {
            rule_namespace: "copyrator".into(),
        }
    }

    /// `objects` converted under [`options`], every rule made checked by
    /// [`assert_rules_resolve`].
    pub(crate) fn converted(objects: &[Value]) -> Imported {
        let imported = crate::core::import::import(objects, &options());
        assert_rules_resolve(&imported);
        imported
    }

    /// Whether one of a report's `lines` has `words` in it.
    pub(crate) fn says(lines: &[String], words: &str) -> bool {
        lines.iter().any(|l| l.contains(words))
    }

    /// The name of `rule`'s copy of a source named `source`, as the
    /// operator resolves the rule (a rule of ConfigMaps or Secrets).
    pub(crate) fn copy_name_of(rule: &Value, source: &str) -> String {
        let parsed: CopyratorRule =
            serde_json::from_value(rule.clone()).unwrap_or_else(|e| panic!("{rule}: {e}"));
        let resolved = parsed
            .resolve(&Trust::new("copyrator", true))
            .unwrap_or_else(|e| panic!("{rule} does not resolve: {}", e.message));
        resolved
            .transform
            .naming
            .copy_name(source)
            .unwrap_or_else(|e| panic!("{rule}: {e}"))
            .into_owned()
    }

    /// `transform.name` of a renaming, as JSON.
    fn naming_json(source: &str, copy: &str, affixes: bool) -> Option<Value> {
        renaming(source, copy, affixes, "the name it has")
            .expect("a valid name")
            .map(|r| json!(r.name))
    }

    #[test]
    fn a_copy_of_another_name_is_named_by_affixes_where_they_say_it_else_by_a_fixed_name() {
        assert_eq!(renaming("regcred", "regcred", true, "-"), Ok(None));
        let cases = [
            ("platform-regcred", json!({"prefix": "platform-"})),
            ("regcred-copy", json!({"suffix": "-copy"})),
            (
                "team.regcred.v1",
                json!({"prefix": "team.", "suffix": ".v1"}),
            ),
            // The source's name must stand whole, set off by '-' or '.'.
            ("regcredential", json!({"template": "regcredential"})),
            ("my-regcreds", json!({"template": "my-regcreds"})),
            ("other", json!({"template": "other"})),
        ];
        for (copy, expected) in cases {
            assert_eq!(naming_json("regcred", copy, true), Some(expected), "{copy}");
            assert_eq!(
                naming_json("regcred", copy, false),
                Some(json!({"template": copy})),
                "{copy}, a fixed name asked for"
            );
        }
        // The first place where the source's name stands whole.
        assert_eq!(
            naming_json("ca", "cat-ca", true),
            Some(json!({"prefix": "cat-"}))
        );
        let prefixed = renaming("regcred", "platform-regcred", true, "the name it has")
            .expect("valid")
            .expect("renamed");
        assert_eq!(
            prefixed.line,
            "copies are named platform-regcred, the name it has: the source's name regcred with \"platform-\" before it (transform.name.prefix)"
        );
        let fixed = renaming(
            "some-secret",
            "secret-replica",
            false,
            "the name the replica has",
        )
        .expect("valid")
        .expect("renamed");
        assert_eq!(
            fixed.line,
            "copies are named secret-replica, the name the replica has (transform.name.template)"
        );
        // What no rule can name a copy.
        for copy in ["Upper", "under_score", "{name}", "x".repeat(254).as_str()] {
            let refused = renaming("regcred", copy, true, "-");
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|why| why.ends_with("no rule is made")),
                "{copy}: {refused:?}"
            );
        }
    }

    #[test]
    fn names_are_dns_labels_and_long_ones_end_in_a_hash_of_the_whole() {
        assert_eq!(
            rule_name("Kyverno/Sync_Secrets--x-"),
            "kyverno-sync-secrets-x"
        );
        let long = "kyverno-sync-secret-with-multi-clone-sync-secret-configmap";
        let name = rule_name(long);
        assert_eq!(name.len(), MAX_RULE_NAME);
        assert!(
            name.starts_with("kyverno-sync-secret-with-multi-clone-sync-s"),
            "{name}"
        );
        let other = rule_name("kyverno-sync-secret-with-multi-clone-sync-secret-secret-x");
        assert_ne!(name, other, "the same start, different wholes");
        assert_eq!(rule_name(long), name, "stable");
        assert!(crate::api::selector::is_dns_label(&name));
        assert_eq!(rule_name("___"), hashed_name("rule", "___"));
    }

    #[test]
    fn a_name_taken_gets_the_hash_of_its_configuration() {
        let mut taken = BTreeSet::new();
        let first = unique_name(
            "kyverno-a-b-c",
            "Kyverno/ClusterPolicy a-b, rule c/0",
            &mut taken,
        );
        let second = unique_name(
            "kyverno-a-b-c",
            "Kyverno/ClusterPolicy a, rule b-c/0",
            &mut taken,
        );
        assert_eq!(first, "kyverno-a-b-c");
        assert_ne!(second, first);
        assert!(second.starts_with("kyverno-a-b-c-"), "{second}");
    }

    #[test]
    fn protected_namespaces_reached_by_a_glob_are_named() {
        let note = Targets::default()
            .protected_note("reflector", &options())
            .expect("every namespace reaches them");
        assert!(
            note.contains("kube-system, kube-public, kube-node-lease, copyrator"),
            "{note}"
        );
        let named = Targets::including(vec!["kube-system".into(), "team-*".into()]);
        assert_eq!(named.protected_note("reflector", &options()), None);
        let mut excluded = Targets::including(vec!["kube-*".into()]);
        excluded.exclude = vec!["kube-public".into(), "kube-node-lease".into()];
        let note = excluded
            .protected_note("reflector", &options())
            .expect("kube-system");
        assert!(note.contains("match kube-system,"), "{note}");
    }
}
