//! All that talks to one API server: the clients and their pacing, the
//! writer, the Lease, and the shared source watches; and the inventory of
//! member clusters, read into what their clients are built from.

pub mod client;
pub mod context;
pub mod foreign;
pub mod inventory;
pub mod leader;
pub mod mark_key;
pub mod ratelimit;
pub mod sources;
pub mod watch;
pub mod write_limit;
pub mod writer;
