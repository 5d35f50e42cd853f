//! A copy's name from its source's (`transform.name`): the source's name
//! with a `prefix` and/or `suffix`, or a `template` in which `{name}`
//! stands for it, or a template without it: one name for every copy (for
//! a rule of one source, as a copy made by hand under a name of its own).
//! A prefix, a suffix or a template with `{name}` never names two source
//! names alike; two sources still meet on one copy's name where they share
//! a name in two source namespaces, or under a fixed name.

use std::borrow::Cow;

use crate::api::rule::CopyName;
use crate::api::schema::MAX_OBJECT_NAME;

const PLACEHOLDER: &str = "{name}";

/// How a rule names its copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Naming {
    /// The source's own name (no `transform.name`).
    #[default]
    Same,
    /// `prefix`, the source's name, `suffix` (a template with `{name}` is
    /// one too).
    Affixed { prefix: String, suffix: String },
    /// One name whatever the source's (a template without `{name}`).
    Fixed(String),
}

/// Why a naming, or a name it gives, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NamingError {
    #[error("transform.name: give a prefix and/or a suffix, or a template")]
    Nothing,
    #[error("transform.name: give a prefix and/or a suffix, or a template, not both")]
    Both,
    #[error("transform.name.template {0:?} holds {{name}} more than once")]
    Placeholders(String),
    #[error(
        "transform.name: {what} {value:?} would not make a valid name: {why} (lowercase letters, \
         digits, '-' and '.', a letter or digit at the start, at the end and on each side of a dot)"
    )]
    Invalid {
        what: &'static str,
        value: String,
        why: &'static str,
    },
    #[error(
        "its copy's name would be {length} characters long; a name holds at most {MAX_OBJECT_NAME}"
    )]
    TooLong { length: usize },
}

impl Naming {
    /// The naming `transform.name` says (none: the source's own name).
    pub(crate) fn new(name: Option<&CopyName>) -> Result<Self, NamingError> {
        let Some(name) = name else {
            return Ok(Naming::Same);
        };
        let (prefix, suffix) = match (&name.template, &name.prefix, &name.suffix) {
            (None, None, None) => return Err(NamingError::Nothing),
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => return Err(NamingError::Both),
            (Some(template), None, None) => {
                check("template", template, &template.replace(PLACEHOLDER, "x"))?;
                let Some((prefix, suffix)) = template.split_once(PLACEHOLDER) else {
                    if template.len() > MAX_OBJECT_NAME {
                        return Err(NamingError::TooLong {
                            length: template.len(),
                        });
                    }
                    return Ok(Naming::Fixed(template.clone()));
                };
                if suffix.contains(PLACEHOLDER) {
                    return Err(NamingError::Placeholders(template.clone()));
                }
                (prefix.to_owned(), suffix.to_owned())
            }
            (None, prefix, suffix) => {
                let (prefix, suffix) = (prefix.clone(), suffix.clone());
                let (prefix, suffix) = (prefix.unwrap_or_default(), suffix.unwrap_or_default());
                check("prefix", &prefix, &format!("{prefix}x"))?;
                check("suffix", &suffix, &format!("x{suffix}"))?;
                (prefix, suffix)
            }
        };
        if prefix.is_empty() && suffix.is_empty() {
            return Ok(Naming::Same);
        }
        Ok(Naming::Affixed { prefix, suffix })
    }

    /// Whether copies keep their source's name.
    pub(crate) fn is_same(&self) -> bool {
        *self == Naming::Same
    }

    /// The copy's name for a source named `source` (a valid name itself),
    /// or why it cannot be one.
    pub(crate) fn copy_name<'a>(&self, source: &'a str) -> Result<Cow<'a, str>, NamingError> {
        let name = self.name_unchecked(source);
        if name.len() > MAX_OBJECT_NAME {
            return Err(NamingError::TooLong { length: name.len() });
        }
        Ok(name)
    }

    /// The copy's name for a source named `source`, unchecked (for a source
    /// [`Naming::copy_name`] allowed).
    pub(crate) fn name_unchecked<'a>(&self, source: &'a str) -> Cow<'a, str> {
        match self {
            Naming::Same => Cow::Borrowed(source),
            Naming::Affixed { prefix, suffix } => Cow::Owned(format!("{prefix}{source}{suffix}")),
            Naming::Fixed(name) => Cow::Owned(name.clone()),
        }
    }
}

/// A prefix, suffix or template is valid when it names a one-letter
/// source validly: then every valid source name gives a valid name (but
/// for its length), since it starts and ends with a letter or digit.
fn check(what: &'static str, value: &str, applied: &str) -> Result<(), NamingError> {
    dns_subdomain(applied).map_err(|why| NamingError::Invalid {
        what,
        value: value.to_owned(),
        why,
    })
}

/// A DNS subdomain (its length apart): lowercase letters, digits, '-' and
/// '.', each dot-separated part starting and ending with a letter or digit.
fn dns_subdomain(name: &str) -> Result<(), &'static str> {
    for part in name.split('.') {
        let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let (Some(first), Some(last)) = (part.chars().next(), part.chars().last()) else {
            return Err("it has an empty part between dots");
        };
        if !part.chars().all(|c| alphanumeric(c) || c == '-') {
            return Err("it holds a character other than a-z, 0-9, '-' and '.'");
        }
        if !alphanumeric(first) || !alphanumeric(last) {
            return Err("a part starts or ends with another character than a letter or digit");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming(prefix: Option<&str>, suffix: Option<&str>, template: Option<&str>) -> Naming {
        try_naming(prefix, suffix, template).expect("a valid naming")
    }

    fn try_naming(
        prefix: Option<&str>,
        suffix: Option<&str>,
        template: Option<&str>,
    ) -> Result<Naming, NamingError> {
        Naming::new(Some(&CopyName {
            prefix: prefix.map(str::to_owned),
            suffix: suffix.map(str::to_owned),
            template: template.map(str::to_owned),
        }))
    }

    #[test]
    fn a_copy_is_named_by_its_prefix_suffix_or_template_and_tells_its_source() {
        assert_eq!(Naming::new(None), Ok(Naming::Same));
        assert_eq!(Naming::Same.copy_name("ca"), Ok("ca".into()));
        let prefixed = naming(Some("platform-"), None, None);
        assert_eq!(
            prefixed.copy_name("registry-pull"),
            Ok("platform-registry-pull".into())
        );
        let both = naming(Some("p-"), Some("-copy"), None);
        assert_eq!(both.copy_name("ca"), Ok("p-ca-copy".into()));
        let template = naming(None, None, Some("team.{name}.v1"));
        assert_eq!(template.copy_name("ca"), Ok("team.ca.v1".into()));
        let fixed = naming(None, None, Some("secret-replica"));
        assert_eq!(fixed.copy_name("some-secret"), Ok("secret-replica".into()));
        assert_eq!(fixed.copy_name("other"), Ok("secret-replica".into()));
        // A template that is the source's name alone is no renaming.
        assert_eq!(naming(None, None, Some("{name}")), Naming::Same);
    }

    #[test]
    fn a_naming_that_cannot_give_a_valid_name_is_refused() {
        assert_eq!(try_naming(None, None, None), Err(NamingError::Nothing));
        assert_eq!(
            try_naming(Some("p-"), None, Some("{name}")),
            Err(NamingError::Both)
        );
        assert!(matches!(
            try_naming(None, None, Some("{name}-{name}")),
            Err(NamingError::Placeholders(_))
        ));
        for template in ["copy-", "-copy", "a..b", "Copy"] {
            assert!(
                matches!(
                    try_naming(None, None, Some(template)),
                    Err(NamingError::Invalid {
                        what: "template",
                        ..
                    })
                ),
                "{template}"
            );
        }
        for prefix in ["Platform-", "p_", "p/", "-p", ".p", "p..", "p.-"] {
            assert!(
                matches!(
                    try_naming(Some(prefix), None, None),
                    Err(NamingError::Invalid { what: "prefix", .. })
                ),
                "{prefix}"
            );
        }
        for suffix in ["-", ".", "-x.", "x_"] {
            assert!(
                matches!(
                    try_naming(None, Some(suffix), None),
                    Err(NamingError::Invalid { what: "suffix", .. })
                ),
                "{suffix}"
            );
        }
        assert!(try_naming(None, None, Some("-{name}")).is_err());
        // What the schema allows, the operator does.
        for prefix in ["p-", "a.b.", "a.b-", "0"] {
            assert!(try_naming(Some(prefix), None, None).is_ok(), "{prefix}");
        }
    }

    #[test]
    fn a_name_longer_than_a_name_may_be_is_refused_for_its_source_alone() {
        let long = naming(None, Some(&"x".repeat(252)), None);
        assert_eq!(
            long.copy_name("ca"),
            Err(NamingError::TooLong { length: 254 })
        );
        assert_eq!(long.copy_name("a").map(|n| n.len()), Ok(253));
    }
}

/// How a rule that renames its copies is planned: every place is keyed by
/// the copy's name.
#[cfg(test)]
mod plan_tests {
    use serde_json::{Value, json};

    use crate::core::plan::tests::{World, rule, verbs};
    use crate::core::resolve::ResolvedRule;
    use crate::core::scope::{Scope, Touch};

    fn renamed(name: Value, namespaces: Value) -> ResolvedRule {
        rule(json!({
            "ruleType": "configmap",
            "selector": {"copy": "yes"},
            "namespace": namespaces,
            "spec": {"transform": {"name": name}},
        }))
    }

    /// The scope of one touch, as a pass of `r` looks at it.
    fn scope_of(r: &ResolvedRule, touch: Touch) -> Scope {
        let mut scope = Scope::default();
        scope.add(touch);
        scope.named_by(&r.transform.naming)
    }

    fn world() -> World {
        World::new(&["shared", "other", "t1", "t2"])
    }

    #[test]
    fn renamed_copies_land_beside_their_source_too_and_are_pruned_by_their_name() {
        let r = renamed(json!({"prefix": "platform-"}), json!("shared"));
        let mut w = world();
        w.source("shared", "pull", &[("copy", "yes")], json!({"k": "v"}));
        let plan = w.plan(&r);
        let created: Vec<_> = verbs(&plan);
        assert_eq!(
            created,
            [
                ("other".into(), "platform-pull".into(), "create"),
                ("shared".into(), "platform-pull".into(), "create"),
                ("t1".into(), "platform-pull".into(), "create"),
                ("t2".into(), "platform-pull".into(), "create"),
            ]
        );
        assert_eq!(plan.places, 4);
        w.apply(&plan);
        let again = w.plan(&r);
        assert!(again.actions.is_empty(), "{:?}", verbs(&again));
        assert_eq!(again.in_place, 4);
        // The source's change, told by its name, reaches the copies.
        w.sources.clear();
        w.source("shared", "pull", &[("copy", "yes")], json!({"k": "v2"}));
        let scope = scope_of(&r, Touch::Source("pull".into()));
        let updates = w.plan_within(&r, &scope);
        assert_eq!(updates.actions.len(), 4, "{:?}", verbs(&updates));
        assert!(updates.actions.iter().all(|a| a.verb() == "update"));
        w.apply(&updates);
        // The source gone: every copy is pruned, found by the source's name.
        let sources = std::mem::take(&mut w.sources);
        let pruned = w.plan_within(&r, &scope_of(&r, Touch::Source("pull".into())));
        assert_eq!(pruned.actions.len(), 4, "{:?}", verbs(&pruned));
        assert!(pruned.actions.iter().all(|a| a.verb() == "delete"));
        w.sources = sources;
        // A copy deleted is put back by a pass over its place.
        let (t1_copy, scope) = {
            let copy = w
                .copies
                .get("t1", "platform-pull")
                .expect("the copy")
                .clone();
            let scope = scope_of(&r, Touch::Copy("t1".into(), "platform-pull".into()));
            (copy, scope)
        };
        w.copies.remove(&t1_copy);
        assert_eq!(
            verbs(&w.plan_within(&r, &scope)),
            [("t1".into(), "platform-pull".into(), "create")]
        );
    }

    #[test]
    fn sources_that_meet_on_a_name_are_copied_nowhere_and_both_named() {
        // One name in two source namespaces, renamed: neither is copied.
        let r = renamed(json!({"suffix": "-copy"}), json!(["shared", "other"]));
        let mut w = world();
        w.source("shared", "ca", &[("copy", "yes")], json!({"k": "a"}));
        w.source("other", "ca", &[("copy", "yes")], json!({"k": "b"}));
        w.source("shared", "pull", &[("copy", "yes")], json!({"k": "p"}));
        let plan = w.plan(&r);
        assert!(
            plan.actions.iter().all(|a| a.target().1 == "pull-copy"),
            "{:?}",
            verbs(&plan)
        );
        let held: Vec<_> = plan
            .shadowed
            .iter()
            .filter(|c| c.namespace == "t1")
            .collect();
        assert_eq!(held.len(), 1, "{:?}", plan.shadowed);
        assert_eq!(held[0].name, "ca-copy");
        assert_eq!(
            held[0].reason,
            "sources other/ca, shared/ca would all be copied as ca-copy (transform.name): none is copied here"
        );
        // Without renaming the first source namespace wins, as always.
        let same = rule(json!({
            "ruleType": "configmap",
            "selector": {"copy": "yes"},
            "namespace": ["src", "other"],
        }));
        assert!(verbs(&w.plan(&same)).contains(&("t1".into(), "ca".into(), "create")));
        // A fixed name: one source is copied, two are not.
        let fixed = renamed(json!({"template": "replica"}), json!("shared"));
        let mut one = world();
        one.source("shared", "some", &[("copy", "yes")], json!({"k": "v"}));
        assert!(verbs(&one.plan(&fixed)).contains(&("t1".into(), "replica".into(), "create")));
        one.source("shared", "another", &[("copy", "yes")], json!({"k": "w"}));
        let two = one.plan(&fixed);
        assert!(two.actions.is_empty(), "{:?}", verbs(&two));
        assert!(two.shadowed.iter().any(|c| {
            c.namespace == "t1"
                && c.reason.starts_with(
                    "sources shared/another, shared/some would all be copied as replica",
                )
        }));
    }

    #[test]
    fn a_copy_never_takes_the_place_of_a_source_and_a_name_too_long_is_refused() {
        // `x` copied as `a-x` where `a-x` is a source itself: not there.
        let r = renamed(json!({"prefix": "a-"}), json!("shared"));
        let mut w = world();
        w.source("shared", "x", &[("copy", "yes")], json!({"k": "v"}));
        w.source("shared", "a-x", &[("copy", "yes")], json!({"k": "w"}));
        let plan = w.plan(&r);
        let in_src: Vec<_> = verbs(&plan)
            .into_iter()
            .filter(|(ns, _, _)| ns == "shared")
            .collect();
        assert_eq!(in_src, [("shared".into(), "a-a-x".into(), "create")]);
        // A name over 253 characters: that source alone is refused.
        let long = renamed(
            json!({"suffix": format!("-{}", "x".repeat(250))}),
            json!("shared"),
        );
        let mut w = world();
        w.source("shared", "ab", &[("copy", "yes")], json!({"k": "v"}));
        w.source("shared", "abcd", &[("copy", "yes")], json!({"k": "v"}));
        let plan = w.plan(&long);
        assert_eq!(plan.actions.len(), 4, "{:?}", verbs(&plan));
        assert_eq!(
            plan.refused_sources,
            [(
                "shared/abcd".to_owned(),
                "its copy's name would be 255 characters long; a name holds at most 253".to_owned()
            )]
        );
    }
}
