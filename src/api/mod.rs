//! The rule API: the `CopyratorRule` types, their CRD schema, the kinds a
//! rule can copy, and label selectors. No I/O; everything else builds on it.

pub mod crd;
pub mod kinds;
pub mod rule;
pub mod selector;
