//! All that talks to one API server: the clients and their pacing, the
//! writer, the Lease, and the shared source watches; and the inventory of
//! member clusters, read into what their clients are built from.

pub(crate) mod access;
pub(crate) mod client;
pub(crate) mod context;
#[cfg(test)]
pub(crate) mod fake_objects;
pub(crate) mod foreign;
pub(crate) mod impersonation;
pub(crate) mod inventory;
pub(crate) mod leader;
pub(crate) mod mark_key;
pub(crate) mod ratelimit;
pub(crate) mod sources;
pub(crate) mod watch;
pub(crate) mod write_limit;
pub(crate) mod writer;
