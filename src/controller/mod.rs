//! The operator's loop: the views the watches keep, the queue and its
//! workers, a rule's pass (plan, write, status, Events), the finalizer, and
//! the copy watches of the kinds rules name.

pub(crate) mod cluster_pass;
pub(crate) mod consumers;
pub(crate) mod finalizer;
pub(crate) mod fleet;
pub(crate) mod kinds;
pub(crate) mod member_pass;
pub(crate) mod members;
pub(crate) mod protection;
pub(crate) mod queue;
pub(crate) mod reconcile;
pub(crate) mod rollout;
pub(crate) mod site;
pub(crate) mod state;
#[cfg(test)]
pub(crate) mod test_support;
pub(crate) mod versions;
pub(crate) mod watches;
pub(crate) mod workers;
