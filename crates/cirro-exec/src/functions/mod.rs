//! Cirro's own scalar functions that planning rules put into plans.

pub mod checked;
pub mod numeric;
