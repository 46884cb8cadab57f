//! cirro-engine
