//! The objects the operator keeps in memory, reduced to what copying needs:
//! objects, namespaces, and copies indexed by rule, interned where they
//! repeat. Plain data structures, no I/O.

pub mod index;
pub mod intern;
pub mod views;
