//! The decisions, pure: a rule resolved under the trust policy, the plan of
//! copies, what a copy may grant where it lands, staged rollouts, backoff,
//! the status, what a change concerns, and the tally of what is unsettled.
//! No client, no task, no clock but what is passed in.

pub mod backoff;
pub mod consumers;
pub mod foreign;
pub mod grants;
pub mod jitter;
pub mod kind_refusals;
#[cfg(test)]
mod partial_passes;
pub mod pass_log;
pub mod plan;
pub mod preview;
pub mod report;
pub mod resolve;
pub mod rollout;
pub mod scope;
pub mod status;
pub mod tally;
pub mod tracking;
pub mod whereabouts;
