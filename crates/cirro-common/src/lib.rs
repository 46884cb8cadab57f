//! cirro-common
