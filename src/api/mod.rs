//! The rule API: the `CopyratorRule` types, their CRD schema, the kinds a
//! rule can copy, and label selectors. No I/O; everything else builds on it.

/// The rule API's group, version, kind and plural, as the original
/// Copyrator named them.
pub(crate) const GROUP: &str = "flant.com";
pub(crate) const VERSION: &str = "v1";
pub(crate) const KIND: &str = "CopyratorRule";
pub(crate) const PLURAL: &str = "copyrators";

pub(crate) mod crd;
pub mod kinds;
pub(crate) mod rule;
pub(crate) mod schema;
pub(crate) mod selector;

/// A field of a Kubernetes API type that the newest supported release's
/// types require and the floor's leave optional (a Deployment's `spec`),
/// as its value, the default where absent: code written with it compiles
/// against either (`--features kubernetes-floor`).
pub(crate) fn required<T: Default>(field: impl Into<Option<T>>) -> T {
    field.into().unwrap_or_default()
}
