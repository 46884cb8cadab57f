//! cirro-catalog
