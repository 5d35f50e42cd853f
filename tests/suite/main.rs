//! Copyrator's integration tests, one binary: each module is one area of
//! the product, run against the control planes `make test` starts (see
//! docs/development.md). One binary means the helpers (`tests/common`)
//! are compiled once, their locks (`common::members::OUTAGE`) hold across
//! every test of the run, and the test threads stay busy from the first
//! test to the last. Tests that need the control plane to themselves are
//! in `tests/cluster_wide`.
//!
//! The fault suites (`faults`, `member_faults`) are `#[ignore]`d here:
//! they stop API servers and etcd, so `make test` runs them with
//! `--ignored` on a control plane of their own. No other test is ignored.

#[path = "../common/mod.rs"]
mod common;

mod adoption;
mod attacks;
mod bounded;
mod chart;
mod cli;
mod copy_protection;
mod copy_rows;
mod deletion_policy;
mod docs_links;
mod faults;
mod fleet_rollouts;
mod kinds;
mod layers;
mod leader;
mod member_faults;
mod member_plugins;
mod member_side;
mod member_trust;
mod members;
mod members_infra;
mod migration;
mod neighbours;
mod operations;
mod public_half;
mod readme;
mod renamed;
mod restart;
mod restart_consumers;
mod rule_options;
mod safety;
mod scale;
mod schema;
mod stages;
mod supported_range;
mod tenant_identity;
mod trust;
mod whereabouts;
