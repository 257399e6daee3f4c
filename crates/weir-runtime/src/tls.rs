//! TLS for a job's cluster connections (coordinator and workers' data ports) and its REST
//! API, with rustls on the `ring` provider.
//!
//! Every process holds a certificate and key signed by the cluster's CA, and trusts only
//! that CA: cluster connections are mutually authenticated (each side checks the other's
//! certificate chain and validity dates). Names are not matched on cluster connections:
//! workers reach each other by the IP address the coordinator saw, which a pod's
//! certificate cannot know in advance, so membership is "holds a certificate of this
//! CA" — give the cluster a CA of its own. The REST API presents the same certificate
//! and asks clients for none (its actions need the job's secret).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_core::{Error, Result};

/// The environment variable naming a directory with `tls.crt`, `tls.key` and `ca.crt`
/// (the layout of a Kubernetes TLS secret with its CA, as cert-manager writes it).
pub const TLS_DIR_VAR: &str = "WEIR_TLS_DIR";

/// A process's TLS settings: its certificate chain and key, and the cluster's CA.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let e = weir_runtime::Tls::from_dir(dir.path()).unwrap_err();
/// assert!(e.to_string().contains("tls.crt"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Tls {
    /// For cluster ports: clients must present a certificate of the CA.
    pub(crate) cluster_server: Arc<rustls::ServerConfig>,
    /// For connecting to cluster ports: presents this process's certificate.
    pub(crate) cluster_client: Arc<rustls::ClientConfig>,
    /// For the REST API: no client certificate asked.
    pub(crate) web_server: Arc<rustls::ServerConfig>,
    source: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({})", self.source)
    }
}

/// rustls on `ring`: it builds with a C compiler alone (aws-lc-rs, rustls' default,
/// needs cmake and takes minutes to build); it has no post-quantum key exchange.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn bad(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("TLS settings: {what}: {e}"))
}

impl Tls {
    /// Reads `tls.crt` (this process's certificate chain, PEM), `tls.key` (its private
    /// key, PEM) and `ca.crt` (the cluster's CA, PEM) from `dir`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Tls> {
        let dir = dir.as_ref();
        let read = |name: &str| -> Result<Vec<u8>> {
            let path: PathBuf = dir.join(name);
            std::fs::read(&path).map_err(|e| {
                Error::Config(format!(
                    "cannot read {}: {e}; a TLS directory holds tls.crt, tls.key and ca.crt",
                    path.display()
                ))
            })
        };
        let (cert, key, ca) = (read("tls.crt")?, read("tls.key")?, read("ca.crt")?);
        Tls::from_pem(&cert, &key, &ca)
            .map(|mut t| {
                t.source = dir.display().to_string();
                t
            })
            .map_err(|e| Error::Config(format!("{}: {e}", dir.display())))
    }

    /// The settings in the directory [`TLS_DIR_VAR`] (`WEIR_TLS_DIR`) names, `None`
    /// when it is not set.
    pub fn from_env() -> Result<Option<Tls>> {
        match std::env::var_os(TLS_DIR_VAR) {
            Some(dir) if !dir.is_empty() => Tls::from_dir(&dir)
                .map(Some)
                .map_err(|e| Error::Config(format!("{TLS_DIR_VAR}: {e}"))),
            _ => Ok(None),
        }
    }

    /// The settings in `dir` when one is given (a `--tls-dir` flag), else the ones
    /// [`Tls::from_env`] finds.
    pub fn from_dir_or_env(dir: Option<&Path>) -> Result<Option<Tls>> {
        match dir {
            Some(dir) => Tls::from_dir(dir).map(Some),
            None => Tls::from_env(),
        }
    }

    /// Settings from PEM text: certificate chain, private key, CA certificate(s).
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Tls> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad("the certificate (tls.crt)", e))?;
        if chain.is_empty() {
            return Err(bad("the certificate (tls.crt)", "no certificate in it"));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("the key (tls.key)", e))?;
        let mut roots = RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad("the CA (ca.crt)", e))?;
        if cas.is_empty() {
            return Err(bad("the CA (ca.crt)", "no certificate in it"));
        }
        for c in cas {
            roots.add(c).map_err(|e| bad("the CA (ca.crt)", e))?;
        }
        let roots = Arc::new(roots);
        let versions = rustls::DEFAULT_VERSIONS;
        let client_verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| bad("the CA (ca.crt)", e))?;
        let cluster_server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| bad("protocol versions", e))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| bad("the certificate and key", e))?;
        let web_server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| bad("protocol versions", e))?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| bad("the certificate and key", e))?;
        let server_verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| bad("the CA (ca.crt)", e))?;
        let cluster_client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| bad("protocol versions", e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyNameOfTheCa(server_verifier)))
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad("the certificate and key", e))?;
        Ok(Tls {
            cluster_server: Arc::new(cluster_server),
            cluster_client: Arc::new(cluster_client),
            web_server: Arc::new(web_server),
            source: "PEM".into(),
        })
    }
}

/// Checks a cluster peer's certificate chain and dates against the cluster's CA, and not
/// its names (see the module's documentation).
#[derive(Debug)]
struct AnyNameOfTheCa(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyNameOfTheCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        // The chain and the dates are checked before the name: a name error means the
        // rest held.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
