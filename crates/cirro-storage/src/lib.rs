//! cirro-storage
