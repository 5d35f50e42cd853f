//! The Kubernetes releases Copyrator supports, and what a cluster's
//! `/version` answer says about it. Plain data, no I/O.
//!
//! The floor is the oldest release whose API types Copyrator builds
//! against (Cargo feature `kubernetes-floor`) and whose control plane the
//! CI runs the floor suite on; the newest is the default build's and the
//! main suite's. README.md, the chart's `kubeVersion`, Cargo.toml and
//! `hack/lib/common.sh` say the same (checked by `tests/suite/supported_range.rs`).

use std::fmt;

use k8s_openapi::apimachinery::pkg::version::Info;

/// A Kubernetes minor release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The oldest supported release.
pub const FLOOR: Release = Release {
    major: 1,
    minor: 33,
};

/// The newest release tested.
pub const NEWEST: Release = Release {
    major: 1,
    minor: 37,
};

/// Where a cluster's release stands against the supported range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Support {
    /// Within the range.
    Supported(Release),
    /// Older than the floor: Copyrator keeps working, untested.
    BelowFloor(Release),
    /// Newer than the newest tested: expected to work, untested.
    AboveNewest(Release),
    /// The answer names no release this reads (a distribution's own scheme).
    Unknown,
}

impl Support {
    pub(crate) fn below_floor(&self) -> bool {
        matches!(self, Support::BelowFloor(_))
    }
}

/// The release a `/version` answer names: its `major` and `minor` fields
/// (managed offerings add a `+`, as in `33+`), else its `gitVersion`
/// (`v1.33.5-eks-…`).
pub(crate) fn release_of(info: &Info) -> Option<Release> {
    let number = |field: &str| -> Option<u32> {
        let digits: String = field.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if let (Some(major), Some(minor)) = (number(&info.major), number(&info.minor)) {
        return Some(Release { major, minor });
    }
    let version = info.git_version.strip_prefix('v')?;
    let mut parts = version.split('.');
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    Some(Release { major, minor })
}

/// Where the cluster that gave `info` stands.
pub(crate) fn support_of(info: &Info) -> Support {
    match release_of(info) {
        Some(release) if release < FLOOR => Support::BelowFloor(release),
        Some(release) if release > NEWEST => Support::AboveNewest(release),
        Some(release) => Support::Supported(release),
        None => Support::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git_version: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git_version.into(),
            ..Info::default()
        }
    }

    #[test]
    fn a_release_is_read_from_major_and_minor_or_else_from_the_git_version() {
        let floor = info("1", "33", "v1.33.13");
        assert_eq!(release_of(&floor), Some(FLOOR));
        let managed = info("1", "31+", "v1.31.4-eks-2d5f260");
        assert_eq!(
            release_of(&managed),
            Some(Release {
                major: 1,
                minor: 31
            })
        );
        let only_git = info("", "", "v1.36.2-gke.1000");
        assert_eq!(
            release_of(&only_git),
            Some(Release {
                major: 1,
                minor: 36
            })
        );
        assert_eq!(release_of(&info("", "", "unknown")), None);
    }

    #[test]
    fn a_cluster_older_than_the_floor_is_below_it_and_the_range_is_inclusive() {
        let older = Release {
            major: 1,
            minor: FLOOR.minor - 1,
        };
        assert_eq!(
            support_of(&info("1", &older.minor.to_string(), "v1.32.9")),
            Support::BelowFloor(older)
        );
        assert!(support_of(&info("1", "32+", "v1.32.9-eks-1")).below_floor());
        assert_eq!(
            support_of(&info("1", "33", "v1.33.13")),
            Support::Supported(FLOOR)
        );
        assert_eq!(
            support_of(&info("1", "37", "v1.37.2")),
            Support::Supported(NEWEST)
        );
        let newer = Release {
            major: 1,
            minor: NEWEST.minor + 1,
        };
        assert_eq!(
            support_of(&info("1", "38", "v1.38.0")),
            Support::AboveNewest(newer)
        );
        assert_eq!(support_of(&info("", "", "custom")), Support::Unknown);
        assert!(!support_of(&info("", "", "custom")).below_floor());
    }
}
