//! Label selectors and namespace-name globs: parsing, validation, matching,
//! and rendering as the query string the API server filters watches by.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde_json::Value;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A label selector: all requirements must hold. An empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub(crate) fn new(mut requirements: Vec<Requirement>) -> Self {
        // A stable order makes equal selectors render the same query.
        requirements.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        requirements.dedup();
        Self { requirements }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        })
    }

    /// The requirements every one of `selectors` makes: whatever any of
    /// them matches, this matches too (empty when they share none), so one
    /// watch filtered by it serves them all.
    pub(crate) fn common<'a>(selectors: impl IntoIterator<Item = &'a LabelSelector>) -> Self {
        let mut selectors = selectors.into_iter();
        let Some(first) = selectors.next() else {
            return Self::default();
        };
        let mut shared = first.requirements.clone();
        for selector in selectors {
            shared.retain(|r| selector.requirements.contains(r));
        }
        Self::new(shared)
    }

    /// The selector in the API server's `labelSelector` query syntax.
    pub(crate) fn to_query(&self) -> String {
        self.requirements
            .iter()
            .map(|r| match r {
                Requirement::In(key, values) if values.len() == 1 => format!("{key}={}", values[0]),
                Requirement::In(key, values) => format!("{key} in ({})", values.join(",")),
                Requirement::NotIn(key, values) => format!("{key} notin ({})", values.join(",")),
                Requirement::Exists(key) => key.clone(),
                Requirement::DoesNotExist(key) => format!("!{key}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A rule's `selector`: either a plain map of labels (the original form)
    /// or a label selector with `matchLabels` and `matchExpressions`.
    pub(crate) fn from_rule_selector(raw: &serde_json::Map<String, Value>) -> Result<Self, String> {
        let is_full = raw.contains_key("matchLabels") || raw.contains_key("matchExpressions");
        let selector = if is_full {
            if let Some(extra) = raw
                .keys()
                .find(|k| *k != "matchLabels" && *k != "matchExpressions")
            {
                return Err(format!(
                    "selector mixes matchLabels/matchExpressions with the plain label {extra:?}; put it under matchLabels"
                ));
            }
            let parsed: metav1::LabelSelector = serde_json::from_value(Value::Object(raw.clone()))
                .map_err(|e| format!("selector is not a valid label selector: {e}"))?;
            Self::from_k8s(&parsed).map_err(|e| format!("selector: {e}"))?
        } else {
            let mut requirements = Vec::new();
            for (key, value) in raw {
                let Value::String(value) = value else {
                    return Err(format!(
                        "selector: the value of label {key:?} must be a string"
                    ));
                };
                requirements.push(Requirement::In(key.clone(), vec![value.clone()]));
            }
            let selector = Self::new(requirements);
            selector.validate().map_err(|e| format!("selector: {e}"))?;
            selector
        };
        if selector.is_empty() {
            return Err("selector is empty: it must name at least one label".into());
        }
        Ok(selector)
    }

    /// A Kubernetes `LabelSelector`, validated.
    pub(crate) fn from_k8s(selector: &metav1::LabelSelector) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::In(key.clone(), vec![value.clone()]));
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.clone().unwrap_or_default();
            let key = expr.key.clone();
            let requirement = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "matchExpressions: operator {} on key {key:?} needs at least one value",
                        expr.operator
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "matchExpressions: operator {} on key {key:?} takes no values",
                        expr.operator
                    ));
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(format!(
                        "matchExpressions: unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)"
                    ));
                }
            };
            requirements.push(requirement);
        }
        let selector = Self::new(requirements);
        selector.validate()?;
        Ok(selector)
    }

    fn validate(&self) -> Result<(), String> {
        for requirement in &self.requirements {
            let (key, values): (&str, &[String]) = match requirement {
                Requirement::In(k, v) | Requirement::NotIn(k, v) => (k, v),
                Requirement::Exists(k) | Requirement::DoesNotExist(k) => (k, &[]),
            };
            validate_label_key(key)?;
            for value in values {
                validate_label_value(value)
                    .map_err(|e| format!("label {key:?}: value {value:?} {e}"))?;
            }
        }
        Ok(())
    }
}

fn is_name_segment(s: &str, max: usize) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= max
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS-1123 label: 1-63 lowercase letters, digits or `-`, starting and
/// ending with a letter or digit (a namespace's name, a member cluster's).
pub(crate) fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let bytes = part.as_bytes();
            !part.is_empty()
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of up to 63 characters.
pub(crate) fn validate_label_key(key: &str) -> Result<(), String> {
    validate_qualified_name(key).map_err(|e| format!("label key {key:?}: {e}"))
}

/// A qualified name, the form of label and annotation keys; the error does
/// not name the key, so that callers can say which kind of key it is.
pub(crate) fn validate_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(
            "the prefix must be a DNS subdomain of at most 253 characters: lowercase letters, digits, '-' and '.'"
                .into(),
        );
    }
    if !is_name_segment(name, 63) {
        return Err(
            "the name must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_segment(value, 63) {
        Ok(())
    } else {
        Err("must be empty or 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into())
    }
}

/// The most `*` a glob may hold, whatever it is matched against: enough
/// for any pattern a person writes (`*-prod`, `team-*-*`), and a bound
/// on what the matcher backtracks over.
pub(crate) const MAX_GLOB_STARS: usize = 8;

/// The longest glob on namespace names: a namespace name is at most 63
/// characters, and a longer glob says nothing a glob of 63 does not.
pub(crate) const MAX_NAMESPACE_GLOB: usize = 63;

/// The longest glob on label or annotation keys: the longest key (a
/// prefix of 253 characters, `/`, a name of 63).
pub(crate) const MAX_META_KEY_GLOB: usize = 317;

/// Why `pattern` is no glob of at most `max_len` characters and
/// [`MAX_GLOB_STARS`] `*`, if it is not (the characters are the caller's
/// to check).
fn glob_limits(pattern: &str, max_len: usize) -> Result<(), String> {
    if pattern.is_empty() || pattern.len() > max_len {
        return Err(format!(
            "pattern {pattern:?} must be 1-{max_len} characters"
        ));
    }
    let stars = pattern.bytes().filter(|b| *b == b'*').count();
    if stars > MAX_GLOB_STARS {
        return Err(format!(
            "pattern {pattern:?} holds {stars} '*'; a glob holds at most {MAX_GLOB_STARS}"
        ));
    }
    Ok(())
}

/// A glob on namespace names: `*` matches any run of characters, `?` one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Glob(String);

impl Glob {
    pub(crate) fn new(pattern: &str) -> Result<Self, String> {
        let valid = pattern.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'*' | b'?')
        });
        if !valid {
            return Err(format!(
                "pattern {pattern:?} may only hold lowercase letters, digits, '-', '.', '*' and '?'"
            ));
        }
        glob_limits(pattern, MAX_NAMESPACE_GLOB)?;
        Ok(Self(pattern.to_owned()))
    }

    pub(crate) fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }

    /// Whether this pattern is `name` itself, with no wildcard.
    pub(crate) fn is_exactly(&self, name: &str) -> bool {
        self.0 == name && !self.0.contains(['*', '?'])
    }
}

/// Iterative wildcard matching with backtracking to the last `*`: linear in practice.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let mut unlimited = u64::MAX;
    glob_match_within(pattern, text, &mut unlimited).unwrap_or(true)
}

/// [`glob_match`], taking one of `steps` per step (a glob of `n`
/// characters takes up to `n` times the text's length); `None`, with
/// `steps` at 0, when they run out first.
fn glob_match_within(pattern: &[u8], text: &[u8], steps: &mut u64) -> Option<bool> {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        *steps = steps.checked_sub(1)?;
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return Some(false);
        }
    }
    Some(pattern[p..].iter().all(|b| *b == b'*'))
}

/// A glob on keys: label or annotation keys (`transform.strip*`), or data
/// keys (`transform.keys`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyGlob(String);

impl KeyGlob {
    pub(crate) fn new(pattern: &str) -> Result<Self, String> {
        glob_limits(pattern, MAX_META_KEY_GLOB)?;
        Ok(Self(pattern.to_owned()))
    }

    pub(crate) fn matches(&self, key: &str) -> bool {
        glob_match(self.0.as_bytes(), key.as_bytes())
    }

    /// Whether `key` matches, taking from `steps` (see
    /// [`glob_match_within`]); `None` when they ran out.
    pub(crate) fn matches_within(&self, key: &str, steps: &mut u64) -> Option<bool> {
        glob_match_within(self.0.as_bytes(), key.as_bytes(), steps)
    }

    /// A glob on the data keys of ConfigMaps and Secrets: the characters of
    /// a data key, `*` and `?`.
    pub(crate) fn data_key(pattern: &str) -> Result<Self, String> {
        let valid = pattern
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*' | b'?'));
        if !valid {
            return Err(format!(
                "pattern {pattern:?} may only hold letters, digits, '-', '_', '.', '*' and '?'"
            ));
        }
        glob_limits(pattern, MAX_DATA_KEY)?;
        Ok(Self(pattern.to_owned()))
    }
}

/// The longest data key of a ConfigMap or Secret the API server takes.
pub(crate) const MAX_DATA_KEY: usize = 253;

/// A data key of a ConfigMap or Secret, as the API server checks it: 1-253
/// letters, digits, '-', '_' or '.', and not `.`, `..` or starting with `..`.
pub(crate) fn validate_data_key(key: &str) -> Result<(), String> {
    let valid = !key.is_empty()
        && key.len() <= MAX_DATA_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && key != "."
        && !key.starts_with("..");
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a data key: 1-{MAX_DATA_KEY} letters, digits, '-', '_' or '.', and not '.', '..' or starting with '..'"
        ))
    }
}

/// A comma-separated list of namespace names or globs, as consent
/// annotations hold it; entries that are no valid glob are ignored (they
/// match nothing).
pub(crate) fn glob_list(annotation: Option<&str>) -> Vec<Glob> {
    annotation
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter_map(|p| Glob::new(p).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rule_selector(value: Value) -> Result<LabelSelector, String> {
        match value {
            Value::Object(map) => LabelSelector::from_rule_selector(&map),
            _ => panic!("test selector must be an object"),
        }
    }

    #[test]
    fn the_common_selector_matches_whatever_any_of_them_matches() {
        let of = |value: Value| rule_selector(value).expect("a selector");
        let a = of(json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "made-up-1", "operator": "DoesNotExist"}]}));
        let b = of(json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "made-up-2", "operator": "DoesNotExist"}]}));
        let common = LabelSelector::common([&a, &b]);
        assert_eq!(common.to_query(), "app=web");
        for selector in [&a, &b] {
            for object in [
                labels(&[("app", "web")]),
                labels(&[("app", "web"), ("made-up-2", "x")]),
            ] {
                if selector.matches(&object) {
                    assert!(common.matches(&object));
                }
            }
        }
        let other = of(json!({"tier": "db"}));
        assert!(LabelSelector::common([&a, &other]).is_empty());
        assert_eq!(LabelSelector::common([&a]), a);
    }

    #[test]
    fn plain_map_requires_every_label() {
        let s = rule_selector(json!({"copyrator": "true", "team": "a"})).unwrap();
        assert!(s.matches(&labels(&[("copyrator", "true"), ("team", "a"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("copyrator", "true")])));
        assert!(!s.matches(&labels(&[("copyrator", "false"), ("team", "a")])));
        assert_eq!(s.to_query(), "copyrator=true,team=a");
    }

    #[test]
    fn match_expressions_cover_every_operator() {
        let s = rule_selector(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "copy", "operator": "Exists"},
                {"key": "skip", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        let good = labels(&[("app", "web"), ("tier", "b"), ("copy", "")]);
        assert!(s.matches(&good));
        let mut prod = good.clone();
        prod.insert("env".into(), "prod".into());
        assert!(!s.matches(&prod));
        let mut skipped = good.clone();
        skipped.insert("skip".into(), "1".into());
        assert!(!s.matches(&skipped));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("copy", "")])));
        let query = s.to_query();
        for part in [
            "app=web",
            "tier in (a,b)",
            "env notin (prod)",
            "copy",
            "!skip",
        ] {
            assert!(
                query.split(',').any(|p| p == part) || query.contains(part),
                "{query} lacks {part}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_refused_with_the_reason() {
        let err = rule_selector(json!({})).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = rule_selector(json!({"matchLabels": {}})).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = rule_selector(json!({"a": 1})).unwrap_err();
        assert!(err.contains("must be a string"), "{err}");
        let err = rule_selector(json!({"matchExpressions": [{"key": "a", "operator": "In"}]}))
            .unwrap_err();
        assert!(err.contains("at least one value"), "{err}");
        let err = rule_selector(
            json!({"matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]}),
        )
        .unwrap_err();
        assert!(err.contains("unknown operator"), "{err}");
        let err = rule_selector(json!({"bad key!": "x"})).unwrap_err();
        assert!(err.contains("label key"), "{err}");
        let err = rule_selector(json!({"k": "-bad-"})).unwrap_err();
        assert!(err.contains("value"), "{err}");
        let err = rule_selector(json!({"matchLabels": {"a": "b"}, "c": "d"})).unwrap_err();
        assert!(err.contains("mixes"), "{err}");
    }

    #[test]
    fn label_keys_with_prefixes() {
        assert!(validate_label_key("example.com/name").is_ok());
        assert!(validate_label_key("app.kubernetes.io/managed-by").is_ok());
        assert!(validate_label_key("Example.com/name").is_err());
        assert!(validate_label_key("/name").is_err());
        assert!(validate_label_key(&"a".repeat(64)).is_err());
    }

    #[test]
    fn globs_match_namespace_names() {
        let g = Glob::new("team-*").unwrap();
        assert!(g.matches("team-a"));
        assert!(g.matches("team-"));
        assert!(!g.matches("xteam-a"));
        let g = Glob::new("*-prod").unwrap();
        assert!(g.matches("a-prod"));
        assert!(!g.matches("a-prod-2"));
        let g = Glob::new("ns-?").unwrap();
        assert!(g.matches("ns-1"));
        assert!(!g.matches("ns-12"));
        let g = Glob::new("a*b*c").unwrap();
        assert!(g.matches("abc"));
        assert!(g.matches("axxbyyc"));
        assert!(!g.matches("axxbyy"));
        assert!(Glob::new("*").unwrap().matches("anything"));
        assert!(Glob::new("Bad").is_err());
        assert!(Glob::new("").is_err());
    }

    #[test]
    fn data_keys_and_their_globs() {
        for key in ["ca.crt", "tls_key", "A-1", ".env", "a..b"] {
            assert!(validate_data_key(key).is_ok(), "{key}");
        }
        for key in ["", ".", "..", "..x", "a/b", "a b", &"k".repeat(254)] {
            assert!(validate_data_key(key).is_err(), "{key:?}");
        }
        let g = KeyGlob::data_key("*.crt").unwrap();
        assert!(g.matches("ca.crt") && !g.matches("ca.key"));
        assert!(KeyGlob::data_key("tls.?ey").unwrap().matches("tls.key"));
        assert!(KeyGlob::data_key("a/*").is_err());
        assert!(KeyGlob::data_key("").is_err());
    }

    /// Every glob is at most as long as what it is matched against and
    /// holds at most 8 `*`.
    #[test]
    fn globs_are_bounded_in_length_and_stars() {
        let stars = |n: usize| {
            (0..=n)
                .map(|i| format!("a{i}"))
                .collect::<Vec<_>>()
                .join("*")
        };
        assert!(Glob::new(&stars(MAX_GLOB_STARS)).is_ok());
        assert!(KeyGlob::new(&stars(MAX_GLOB_STARS)).is_ok());
        assert!(KeyGlob::data_key(&stars(MAX_GLOB_STARS)).is_ok());
        for refused in [
            Glob::new(&stars(MAX_GLOB_STARS + 1)).map(|_| ()),
            KeyGlob::new(&stars(MAX_GLOB_STARS + 1)).map(|_| ()),
            KeyGlob::data_key(&stars(MAX_GLOB_STARS + 1)).map(|_| ()),
        ] {
            let message = refused.expect_err("9 stars");
            assert!(message.contains("at most 8"), "{message}");
        }
        assert!(Glob::new(&"a".repeat(MAX_NAMESPACE_GLOB)).is_ok());
        assert!(Glob::new(&"a".repeat(MAX_NAMESPACE_GLOB + 1)).is_err());
        assert!(KeyGlob::new(&"a".repeat(MAX_META_KEY_GLOB)).is_ok());
        assert!(KeyGlob::new(&"a".repeat(MAX_META_KEY_GLOB + 1)).is_err());
        assert!(KeyGlob::data_key(&"a".repeat(MAX_DATA_KEY)).is_ok());
        assert!(KeyGlob::data_key(&"a".repeat(MAX_DATA_KEY + 1)).is_err());
        // Consent annotations ignore what is no glob.
        let list = format!("team-*,{}", stars(MAX_GLOB_STARS + 1));
        assert_eq!(glob_list(Some(&list)).len(), 1);
    }

    #[test]
    fn key_globs_match_prefixes() {
        let g = KeyGlob::new("argocd.argoproj.io/*").unwrap();
        assert!(g.matches("argocd.argoproj.io/instance"));
        assert!(!g.matches("argocd.argoproj.io"));
    }

    #[test]
    fn dns_labels_are_what_the_api_server_takes_as_names() {
        for good in ["a", "team-a", "0", "a1-b2", &"x".repeat(63)] {
            assert!(is_dns_label(good), "{good:?}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}
