//! cirro
