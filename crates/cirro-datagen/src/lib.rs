//! cirro-datagen
