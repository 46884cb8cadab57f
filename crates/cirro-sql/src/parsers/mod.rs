//! One parser per Cirro statement kind. Each takes the statement's tokens
//! (whitespace and comments dropped, no trailing semicolon) and returns None
//! when the statement is not of its kind, an error when it is but is
//! malformed.

pub(crate) mod access;
pub(crate) mod copy;
pub(crate) mod deallocate;
pub(crate) mod distribution;
pub(crate) mod maintenance;
pub(crate) mod setting;
pub(crate) mod transaction;
