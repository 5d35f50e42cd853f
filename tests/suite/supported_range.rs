//! The supported range of Kubernetes releases is stated in six places, and
//! they agree: the operator's own constants (`core::versions`), README.md and
//! docs/install.md, the chart's `kubeVersion`, Cargo.toml's version features
//! and the releases `hack/lib/common.sh` builds and `hack/test` runs.

use copyrator::core::versions::{FLOOR, NEWEST};

fn read(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("reading {}: {e}", full.display()))
}

/// The value of `NAME=value` at the start of a line of a shell file.
fn shell_setting(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .map(str::to_owned)
}

#[test]
fn the_supported_range_is_the_same_in_the_docs_the_chart_the_build_and_ci() {
    let mut disagree = Vec::new();
    let statement = format!(
        "Supported: Kubernetes {FLOOR}–{NEWEST}; tested on every change: the floor and the newest"
    );
    for page in ["README.md", "docs/install.md"] {
        if !read(page).contains(&statement) {
            disagree.push(format!("{page} does not say {statement:?}"));
        }
    }
    let chart = read("chart/Chart.yaml");
    let kube_version = format!("kubeVersion: \">={FLOOR}.0-0\"");
    if !chart.lines().any(|l| l.trim() == kube_version) {
        disagree.push(format!("chart/Chart.yaml has no line {kube_version}"));
    }
    let cargo = read("Cargo.toml");
    for (feature, release) in [("kubernetes-floor", FLOOR), ("kubernetes-newest", NEWEST)] {
        let line = format!(
            "{feature} = [\"k8s-openapi/v{}_{}\"]",
            release.major, release.minor
        );
        if !cargo.lines().any(|l| l.trim() == line) {
            disagree.push(format!("Cargo.toml has no line {line}"));
        }
    }
    let common = read("hack/lib/common.sh");
    let mut built = Vec::new();
    for (setting, release) in [("K8S_FLOOR", FLOOR), ("K8S_NEWEST", NEWEST)] {
        let value = shell_setting(&common, setting).unwrap_or_default();
        if !value.starts_with(&format!("{release}.")) {
            disagree.push(format!(
                "hack/lib/common.sh {setting}={value:?} is not a {release} release"
            ));
        }
        built.push(value);
    }
    // The patch releases the tests run are the ones the docs name.
    let install = read("docs/install.md");
    for version in &built {
        if !install.contains(&format!("({version})")) {
            disagree.push(format!(
                "docs/install.md does not name the release tested, {version}"
            ));
        }
    }
    let test = read("hack/test");
    for needed in [
        "--no-default-features --features kubernetes-floor",
        "COPYRATOR_K8S_VERSION=\"$k8s_floor\" hack/cluster build",
        "k8s_floor=$(sed -n 's/^K8S_FLOOR=//p' hack/lib/common.sh)",
    ] {
        if !test.contains(needed) {
            disagree.push(format!("hack/test does not run the floor: no {needed:?}"));
        }
    }
    assert!(
        disagree.is_empty(),
        "the supported range disagrees:\n  {}",
        disagree.join("\n  ")
    );
}
