//! TLS, set up once for every front end: the certificate chain and key are
//! read and checked at start, then the PostgreSQL protocol and the console
//! use the rustls acceptor, Flight SQL (tonic) the same PEM.

use std::sync::Arc;

use cirro_common::{CirroError, Result, SqlState};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig as TlsConfig;

/// The node's TLS identity.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    /// The certificate chain's file (the console's peers trust it).
    pub(crate) cert_path: String,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

fn bad(what: &str, e: &dyn std::fmt::Display) -> CirroError {
    CirroError::new(
        SqlState::INVALID_PARAMETER_VALUE,
        format!("TLS {what}: {e}"),
    )
}

impl Tls {
    /// Read `cert` (a PEM chain) and `key` (a PEM private key): 22023 when
    /// either cannot be read or holds nothing usable.
    pub(crate) fn load(cert: &str, key: &str) -> Result<Tls> {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let cert_pem = std::fs::read(cert).map_err(|e| bad(&format!("certificate {cert}"), &e))?;
        let key_pem = std::fs::read(key).map_err(|e| bad(&format!("key {key}"), &e))?;
        let certs = rustls_pemfile::certs(&mut cert_pem.as_slice())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        if certs.is_empty() {
            return Err(bad("certificate", &format!("no certificate in {cert}")));
        }
        let private = rustls_pemfile::private_key(&mut key_pem.as_slice())
            .map_err(|e| bad("key", &e))?
            .ok_or_else(|| bad("key", &format!("no private key in {key}")))?;
        let config = TlsConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, private)
            .map_err(|e| bad("configuration", &e))?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert_path: cert.to_string(),
            cert_pem,
            key_pem,
        })
    }

    /// The same identity for tonic's server (Flight SQL).
    pub(crate) fn flight(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
            &self.cert_pem,
            &self.key_pem,
        ))
    }
}
