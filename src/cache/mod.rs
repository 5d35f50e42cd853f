//! The objects the operator keeps in memory, reduced to what copying needs:
//! objects, namespaces, copies indexed by rule, interned where they
//! repeat, and Roles reduced to what they grant. Plain data structures, no
//! I/O.

pub mod index;
pub mod intern;
pub mod roles;
pub mod views;
