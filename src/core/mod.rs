//! The decisions, pure: a rule resolved under the trust policy, the plan of
//! copies, what a copy may grant where it lands, staged rollouts, backoff,
//! the status, what a change concerns, and the tally of what is unsettled.
//! No client, no task, no clock but what is passed in.

pub(crate) mod backoff;
pub mod consumers;
pub(crate) mod fleet_rollout;
pub(crate) mod foreign;
pub(crate) mod grants;
pub(crate) mod identity;
pub(crate) mod import;
pub(crate) mod jitter;
pub(crate) mod kind_refusals;
pub(crate) mod naming;
#[cfg(test)]
mod partial_passes;
pub(crate) mod pass_log;
pub(crate) mod plan;
pub(crate) mod preview;
pub(crate) mod protection;
pub(crate) mod report;
pub(crate) mod resolve;
pub(crate) mod rollout;
pub(crate) mod scope;
pub(crate) mod status;
pub(crate) mod tally;
pub(crate) mod text_copy;
pub(crate) mod tracking;
pub mod versions;
pub(crate) mod whereabouts;
