//! The rule API: the `CopyratorRule` types, their CRD schema, the kinds a
//! rule can copy, and label selectors. No I/O; everything else builds on it.

/// The rule API's group, version, kind and plural, as the original
/// Copyrator named them.
pub const GROUP: &str = "flant.com";
pub const VERSION: &str = "v1";
pub const KIND: &str = "CopyratorRule";
pub const PLURAL: &str = "copyrators";

pub mod crd;
pub mod kinds;
pub mod rule;
pub mod schema;
pub mod selector;
