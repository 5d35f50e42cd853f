//! Integration tests that need the control plane to themselves: each runs
//! an operator that serves every namespace and every rule name
//! (`--all-namespaces`, no `--rule-name`), which would take every other
//! test's rules as tenants' rules. Cargo runs test binaries one at a
//! time (this one before `suite`, never beside it), and its tests take
//! `common::CLUSTER_WIDE` for writing, one at a time. `common::Operator`
//! refuses such an operator anywhere else.

#[path = "../common/mod.rs"]
// This binary uses a part of the shared helpers; `suite` uses them all
// and reports those that nobody uses.
#[allow(dead_code)]
mod common;

mod attacks;
