//! The operator's loop: the views the watches keep, the queue and its
//! workers, a rule's pass (plan, write, status, Events), the finalizer, and
//! the copy watches of the kinds rules name.

pub mod consumers;
pub mod finalizer;
pub mod fleet;
pub mod kinds;
pub mod member_pass;
pub mod members;
pub mod queue;
pub mod reconcile;
pub mod rollout;
pub mod site;
pub mod state;
pub mod watches;
pub mod workers;
