//! The Prometheus text exposition (the operator's and the API server's
//! `/metrics`), read one sample line at a time.

use std::collections::BTreeMap;

/// A sample line: its metric name, its labels and its value as written;
/// None for a blank or `#` line.
pub type Sample<'a> = (&'a str, BTreeMap<String, String>, &'a str);

/// Reads one line of a text exposition (see [`Sample`]).
pub fn sample(line: &str) -> Result<Option<Sample<'_>>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let (series, value) = line
        .rsplit_once(' ')
        .ok_or_else(|| format!("not a sample line: {line:?}"))?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
        None => (series, BTreeMap::new()),
    };
    Ok(Some((name, labels, value)))
}

/// The labels of a sample, `a="x",b="y"` (values unescaped).
fn labels(mut s: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        let Some((key, rest)) = s.split_once('=') else {
            return labels;
        };
        let rest = rest.strip_prefix('"').unwrap_or(rest);
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim().to_string(), value);
        s = &rest[end..];
    }
}

/// The sum of the operator's samples of `metric` whose labels include
/// `labels`, from one scrape of its `/metrics` (on `port`); `None` when no
/// series matches.
pub async fn operator_metric(
    port: u16,
    metric: &str,
    labels: &[(&str, &str)],
) -> Result<Option<f64>, String> {
    let (code, body) = super::http_get(port, "/metrics").await?;
    if code != 200 {
        return Err(format!("GET /metrics answered {code}"));
    }
    let mut sum = None;
    for line in body.lines() {
        let Some((name, series, value)) = sample(line)? else {
            continue;
        };
        let wanted = labels
            .iter()
            .all(|(k, v)| series.get(*k).map(String::as_str) == Some(*v));
        if name == metric && wanted {
            let value: f64 = value.parse().map_err(|e| format!("{line:?}: {e}"))?;
            sum = Some(sum.unwrap_or(0.0) + value);
        }
    }
    Ok(sum)
}

/// Wait, within `deadline`, for the Warning Event `CopyProtectionOff`
/// on the object `name` in namespace `ns`, where the operator says a copy
/// protection is not in force.
pub async fn wait_protection_off_event(
    t: &super::TestNs,
    (ns, name): (&str, &str),
    deadline: std::time::Duration,
) -> k8s_openapi::api::events::v1::Event {
    super::wait_until(
        format!("a Warning Event CopyProtectionOff on {ns}/{name}"),
        deadline,
        async || {
            t.events_regarding(ns, name)
                .await
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("CopyProtectionOff")
                        && e.type_.as_deref() == Some("Warning")
                })
                .ok_or("none yet".to_owned())
        },
    )
    .await
}

/// Wait until the operator on `port` says, in
/// `copyrator_copy_protection_in_force`, that the copy protection of
/// `cluster` ("home", or a member's name) is in force (`want` 1) or not (0).
pub async fn wait_copy_protection(port: u16, cluster: &str, want: f64) {
    let series = [("cluster", cluster)];
    super::wait_until(
        format!("copyrator_copy_protection_in_force of {cluster} at {want}"),
        super::TIMEOUT,
        async || match operator_metric(port, "copyrator_copy_protection_in_force", &series).await? {
            Some(value) if value == want => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}
