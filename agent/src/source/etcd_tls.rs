//! TLS to etcd: the client options built from `--etcd-cafile`,
//! `--etcd-certfile` and `--etcd-keyfile`, and failed handshakes turned
//! into a message that names the file to fix. (That the flags go with
//! https:// endpoints only is checked with the other flags, in `run/check.rs`.)
use std::{
    error::Error as StdError,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use etcd_client::{Certificate, Identity, TlsOptions};
use rustls::{AlertDescription, CertificateError};

use super::etcd_settings::EtcdSettings;

/// The TLS options for `s`, or `None` for plain HTTP. The files are read
/// at every connection attempt, so renewed certificates are picked up.
pub fn options(s: &EtcdSettings) -> Result<Option<TlsOptions>> {
    if s.cafile.is_none() && s.certfile.is_none() {
        return Ok(None);
    }
    let mut tls = TlsOptions::new();
    if let Some(ca) = &s.cafile {
        let pem = std::fs::read(ca).with_context(|| format!("cannot read --etcd-cafile {}", ca.display()))?;
        tls = tls.ca_certificate(Certificate::from_pem(pem));
    }
    if let (Some(c), Some(k)) = (&s.certfile, &s.keyfile) {
        let cert = std::fs::read(c).with_context(|| format!("cannot read --etcd-certfile {}", c.display()))?;
        let key = std::fs::read(k).with_context(|| format!("cannot read --etcd-keyfile {}", k.display()))?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(Some(tls))
}

fn shown(p: &Option<PathBuf>) -> String {
    p.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_else(|| "(none: the system's roots)".into())
}

/// A TLS handshake with etcd that failed, and on whose side.
#[derive(Debug, thiserror::Error)]
pub enum TlsProblem {
    #[error("etcd's server certificate is not signed by the CA in --etcd-cafile {ca} ({detail})")]
    ServerNotTrusted { ca: String, detail: String },
    #[error("etcd's server certificate has expired or is not valid yet ({detail}); renew etcd's --cert-file")]
    ServerExpired { detail: String },
    #[error(
        "etcd's server certificate does not name the endpoint ({detail}); use the name or address it was issued for"
    )]
    ServerWrongName { detail: String },
    #[error("etcd refused our client certificate --etcd-certfile {cert}: it has expired or is not valid yet")]
    ClientExpired { cert: String, alert: AlertDescription },
    #[error(
        "etcd refused our client certificate --etcd-certfile {cert}, which --etcd-cafile {ca} did not sign \
         ({detail}); it must be signed by a CA in etcd's --trusted-ca-file"
    )]
    ClientNotSigned { cert: String, ca: String, detail: String },
    #[error(
        "etcd refused our client certificate --etcd-certfile {cert} (alert {alert:?}): it must be signed by a CA in \
         etcd's --trusted-ca-file"
    )]
    ClientRefused { cert: String, alert: AlertDescription },
    #[error("etcd requires a client certificate: give --etcd-certfile and --etcd-keyfile (alert {alert:?})")]
    ClientMissing { alert: AlertDescription },
}

/// Every cause of `e`, also those behind a gRPC status: tonic wraps
/// transport errors in hyper's and std::io's errors, inside a status that
/// etcd-client's error does not give as its source, so that link is
/// followed by hand.
fn causes(e: &anyhow::Error) -> Vec<&(dyn StdError + 'static)> {
    let mut causes: Vec<&(dyn StdError + 'static)> = Vec::new();
    for cause in e.chain() {
        causes.push(cause);
        if let Some(etcd_client::Error::GRpcStatus(status)) = cause.downcast_ref::<etcd_client::Error>() {
            let mut next = Some(status as &(dyn StdError + 'static));
            while let Some(c) = next {
                causes.push(c);
                next = c.source();
            }
        }
    }
    causes
}

/// The rustls error somewhere in `e`'s causes ([`causes`]), if any.
fn rustls_error(e: &anyhow::Error) -> Option<rustls::Error> {
    let causes = causes(e);
    causes.into_iter().find_map(|cause| {
        cause.downcast_ref::<rustls::Error>().cloned().or_else(|| {
            let inner: &(dyn StdError + 'static) = cause.downcast_ref::<std::io::Error>()?.get_ref()?;
            inner.downcast_ref::<rustls::Error>().cloned().or_else(|| alert_in_text(&inner.to_string()))
        })
    })
}

/// Alerts reach us as text: tokio-rustls hands hyper an io::Error made
/// from the rustls error's Display. Matched against that same Display of
/// each alert that concerns certificates, so nothing is parsed by hand.
fn alert_in_text(text: &str) -> Option<rustls::Error> {
    [
        AlertDescription::BadCertificate,
        AlertDescription::UnknownCA,
        AlertDescription::CertificateExpired,
        AlertDescription::CertificateUnknown,
        AlertDescription::CertificateRevoked,
        AlertDescription::CertificateRequired,
        AlertDescription::AccessDenied,
    ]
    .into_iter()
    .map(rustls::Error::AlertReceived)
    .find(|e| e.to_string() == text)
}

/// Why our own client certificate cannot be accepted, judged here: its
/// validity period, and whether `--etcd-cafile` signed it. etcd (Go's TLS)
/// answers every refused client certificate with the same alert, and
/// under TLS 1.3 that alert may be lost to a reset; this is what tells.
fn own_cert_problem(s: &EtcdSettings) -> Option<CertificateError> {
    use rustls::pki_types::{CertificateDer, UnixTime, pem::PemObject};
    let (ca, cert) = (s.cafile.as_ref()?, s.certfile.as_ref()?);
    let mut chain = CertificateDer::pem_file_iter(cert).ok()?.flatten();
    let leaf = chain.next()?;
    let intermediates: Vec<_> = chain.collect();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(CertificateDer::pem_file_iter(ca).ok()?.flatten());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider).build().ok()?;
    match verifier.verify_client_cert(&leaf, &intermediates, UnixTime::now()) {
        Err(rustls::Error::InvalidCertificate(e)) => Some(e),
        _ => None,
    }
}

/// Whether `e` is the kind of failure a refused client certificate causes:
/// an alert, or the connection reset or broken under us.
fn connection_broken(e: &anyhow::Error) -> bool {
    let causes = causes(e);
    causes.iter().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| matches!(io.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset))
    })
}

/// What a failed connection says about the certificates, in terms of the
/// flags; `None` when it was not a certificate problem.
pub fn explain(e: &anyhow::Error, s: &EtcdSettings) -> Option<TlsProblem> {
    let cert = shown(&s.certfile);
    let found = rustls_error(e);
    let server_side = matches!(found, Some(rustls::Error::InvalidCertificate(_)));
    if !server_side && (found.is_some() || connection_broken(e)) {
        match own_cert_problem(s) {
            Some(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => {
                return Some(TlsProblem::ClientExpired { cert, alert: AlertDescription::CertificateExpired });
            }
            Some(problem) if found.is_none() => {
                return Some(TlsProblem::ClientNotSigned {
                    cert,
                    ca: shown(&s.cafile),
                    detail: format!("{problem:?}"),
                });
            }
            _ => {}
        }
    }
    Some(match &found? {
        rustls::Error::InvalidCertificate(c) => {
            let detail = format!("{c:?}");
            match c {
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => TlsProblem::ServerExpired { detail },
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                    TlsProblem::ServerWrongName { detail }
                }
                _ => TlsProblem::ServerNotTrusted { ca: shown(&s.cafile), detail },
            }
        }
        rustls::Error::AlertReceived(alert) => match alert {
            AlertDescription::CertificateExpired => TlsProblem::ClientExpired { cert, alert: *alert },
            AlertDescription::CertificateRequired if s.certfile.is_none() => {
                TlsProblem::ClientMissing { alert: *alert }
            }
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateRequired
            | AlertDescription::AccessDenied => TlsProblem::ClientRefused { cert, alert: *alert },
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> EtcdSettings {
        EtcdSettings {
            endpoints: vec!["https://198.18.0.254:2379".into()],
            prefix: "/coreos.com/network".into(),
            cafile: Some("/etc/edgevx/ca.pem".into()),
            certfile: Some("/etc/edgevx/client.pem".into()),
            keyfile: Some("/etc/edgevx/client-key.pem".into()),
            user: None,
            lease_ttl: std::time::Duration::from_secs(60),
            renew_margin: std::time::Duration::from_secs(10),
        }
    }

    /// An error shaped as etcd-client returns it: a gRPC status whose
    /// source is the io::Error tokio-rustls made.
    fn failed(io: std::io::Error) -> anyhow::Error {
        let status = tonic::Status::from_error(Box::new(io));
        anyhow::Error::new(etcd_client::Error::GRpcStatus(status)).context("cannot read /coreos.com/network/config")
    }

    #[test]
    fn names_the_file_to_fix() {
        let s = settings();
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let e = explain(&failed(std::io::Error::new(std::io::ErrorKind::InvalidData, unknown)), &s).unwrap();
        assert!(e.to_string().contains("not signed by the CA in --etcd-cafile /etc/edgevx/ca.pem"), "{e}");
        // alerts arrive as text only
        for (alert, want) in [
            (AlertDescription::BadCertificate, "refused our client certificate --etcd-certfile /etc/edgevx/client.pem"),
            (AlertDescription::CertificateExpired, "/etc/edgevx/client.pem: it has expired"),
            (AlertDescription::UnknownCA, "refused our client certificate --etcd-certfile /etc/edgevx/client.pem"),
        ] {
            let text = rustls::Error::AlertReceived(alert).to_string();
            let e = explain(&failed(std::io::Error::new(std::io::ErrorKind::InvalidData, text)), &s).unwrap();
            assert!(e.to_string().contains(want), "{e}");
        }
        let other = failed(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        assert!(explain(&other, &s).is_none());
    }
}
