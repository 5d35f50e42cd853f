//! The objects the operator keeps in memory, reduced to what copying needs:
//! objects, namespaces, copies indexed by rule, interned where they
//! repeat, Roles reduced to what they grant, and the marks by which a copy
//! is known. Plain data structures, no I/O.

pub(crate) mod index;
pub(crate) mod intern;
pub(crate) mod mark;
pub(crate) mod roles;
pub(crate) mod views;
