//! Users, their SCRAM-SHA-256 verifiers and table privileges.
//!
//! A password is never stored: `CREATE USER … PASSWORD 'p'` keeps the verifier
//! PostgreSQL keeps (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`,
//! RFC 5802/7677). A login proves knowledge of the password against it; the
//! verifier alone cannot be used to log in.

use std::collections::BTreeSet;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use cirro_common::{CirroError, Result, SqlState};
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};

/// PBKDF2 rounds for new verifiers (PostgreSQL's default).
pub const SCRAM_ITERATIONS: u32 = 4096;
const SALT_LEN: usize = 16;
const KEY_LEN: usize = 32;

/// One user of a data location.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UserEntry {
    /// The SCRAM-SHA-256 verifier, in PostgreSQL's text form.
    pub verifier: String,
    /// A superuser passes every privilege check and manages users.
    #[serde(default)]
    pub superuser: bool,
    pub created_ms: i64,
    /// The user's session defaults (`ALTER USER name SET setting = value`):
    /// `memory_limit`, `priority`, `statement_timeout`, …
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub settings: std::collections::BTreeMap<String, String>,
    /// The predefined roles granted to the user ([`PREDEFINED_ROLES`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub roles: BTreeSet<String>,
}

/// Sees the text of every session's statements (as PostgreSQL's role of
/// that name), with literals shown as `$n` in statements naming tables the
/// user may not SELECT.
pub const READ_ALL_STATS: &str = "pg_read_all_stats";

/// The roles `GRANT role TO user` accepts.
pub const PREDEFINED_ROLES: &[&str] = &[READ_ALL_STATS];

pub use cirro_common::Privilege;

/// The privileges granted on one table, per user.
pub type Grants = std::collections::BTreeMap<String, BTreeSet<Privilege>>;

/// A SCRAM-SHA-256 verifier: what the server keeps instead of a password.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScramVerifier(..)")
    }
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

fn sha256(data: &[u8]) -> Vec<u8> {
    digest::digest(&digest::SHA256, data).as_ref().to_vec()
}

impl ScramVerifier {
    /// A verifier for `password` with a fresh random salt.
    pub fn new(password: &str) -> Self {
        let salt: [u8; SALT_LEN] = rand::random();
        Self::with_salt(password, &salt, SCRAM_ITERATIONS)
    }

    pub fn with_salt(password: &str, salt: &[u8], iterations: u32) -> Self {
        // SASLprep as PostgreSQL does: a password it cannot normalise is used
        // as given.
        let prepared = stringprep::saslprep(password)
            .map(|p| p.into_owned())
            .unwrap_or_else(|_| password.to_string());
        let mut salted = [0u8; KEY_LEN];
        pbkdf2::derive(
            pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(iterations.max(1)).unwrap_or(std::num::NonZeroU32::MIN),
            salt,
            prepared.as_bytes(),
            &mut salted,
        );
        let client_key = hmac_sha256(&salted, b"Client Key");
        Self {
            iterations,
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: hmac_sha256(&salted, b"Server Key"),
        }
    }

    /// Read PostgreSQL's text form.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || CirroError::internal("a stored SCRAM verifier is malformed");
        let rest = text.strip_prefix("SCRAM-SHA-256$").ok_or_else(bad)?;
        let (params, keys) = rest.split_once('$').ok_or_else(bad)?;
        let (iterations, salt) = params.split_once(':').ok_or_else(bad)?;
        let (stored, server) = keys.split_once(':').ok_or_else(bad)?;
        let decode = |s: &str| STANDARD.decode(s).map_err(|_| bad());
        let verifier = Self {
            iterations: iterations.parse().map_err(|_| bad())?,
            salt: decode(salt)?,
            stored_key: decode(stored)?,
            server_key: decode(server)?,
        };
        if verifier.stored_key.len() != KEY_LEN || verifier.server_key.len() != KEY_LEN {
            return Err(bad());
        }
        Ok(verifier)
    }

    /// Whether `proof` (the client's ClientProof) shows knowledge of the
    /// password for this `auth_message` (RFC 5802, section 3).
    pub fn verify(&self, auth_message: &[u8], proof: &[u8]) -> bool {
        if proof.len() != KEY_LEN {
            return false;
        }
        let signature = hmac_sha256(&self.stored_key, auth_message);
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.is_stored_key(&sha256(&client_key))
    }

    /// Whether `password` is the one this verifier was made from (for
    /// logins that send the password itself, such as Flight SQL's basic
    /// authentication over TLS).
    pub fn matches_password(&self, password: &str) -> bool {
        let candidate = Self::with_salt(password, &self.salt, self.iterations);
        self.is_stored_key(&candidate.stored_key)
    }

    /// Compare with the StoredKey in constant time: every byte is looked at.
    fn is_stored_key(&self, candidate: &[u8]) -> bool {
        candidate.len() == self.stored_key.len()
            && candidate
                .iter()
                .zip(&self.stored_key)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The ServerSignature that proves to the client that the server knows
    /// the verifier.
    pub fn server_signature(&self, auth_message: &[u8]) -> Vec<u8> {
        hmac_sha256(&self.server_key, auth_message)
    }
}

impl fmt::Display for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(&self.stored_key),
            STANDARD.encode(&self.server_key)
        )
    }
}

/// 42704 for a user that does not exist.
pub fn undefined_user(name: &str) -> CirroError {
    CirroError::new(
        SqlState::UNDEFINED_OBJECT,
        format!("role \"{name}\" does not exist"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_user_entry_of_the_previous_release_reads_without_settings() {
        let old =
            r#"{"verifier":"SCRAM-SHA-256$4096:c2FsdA==$a:b","superuser":true,"created_ms":1}"#;
        let entry: UserEntry = serde_json::from_str(old).expect("old entry");
        assert!(entry.settings.is_empty());
        // Written back without the new field while it is empty.
        assert_eq!(serde_json::to_string(&entry).expect("json"), old);
    }

    use super::*;

    #[test]
    fn verifier_round_trips_and_checks_proofs() {
        let verifier = ScramVerifier::with_salt("secret", b"0123456789abcdef", 4096);
        let text = verifier.to_string();
        assert!(text.starts_with("SCRAM-SHA-256$4096:"));
        assert!(!text.contains("secret"));
        let parsed = ScramVerifier::parse(&text).expect("parse");
        assert_eq!(parsed, verifier);

        // A client that knows the password computes the proof like this.
        let message = b"n=u,r=abc,r=abcdef,s=xyz,i=4096,c=biws,r=abcdef";
        let proof = |password: &str| {
            let mut salted = [0u8; KEY_LEN];
            pbkdf2::derive(
                pbkdf2::PBKDF2_HMAC_SHA256,
                std::num::NonZeroU32::new(4096).expect("nonzero"),
                b"0123456789abcdef",
                password.as_bytes(),
                &mut salted,
            );
            let client_key = hmac_sha256(&salted, b"Client Key");
            let signature = hmac_sha256(&sha256(&client_key), message);
            client_key
                .iter()
                .zip(&signature)
                .map(|(a, b)| a ^ b)
                .collect::<Vec<u8>>()
        };
        assert!(parsed.verify(message, &proof("secret")));
        assert!(!parsed.verify(message, &proof("Secret")));
        assert!(!parsed.verify(b"another message", &proof("secret")));
        assert!(ScramVerifier::parse("md5abc").is_err());
        assert!(parsed.matches_password("secret"));
        assert!(!parsed.matches_password("Secret"));
        assert!(!parsed.matches_password(""));
    }

    #[test]
    fn new_verifiers_have_distinct_salts() {
        let a = ScramVerifier::new("pw");
        let b = ScramVerifier::new("pw");
        assert_ne!(a.salt, b.salt);
        assert_ne!(a.to_string(), b.to_string());
    }
}
