//! Certificates for the etcd TLS tests, made in the test with rcgen (the
//! rustls project's certificate generator): a CA that signs the server and
//! a good client, a CA nobody trusts with its own client, and a client
//! certificate of the right CA that has expired.
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Pki {
    /// The CA etcd trusts for clients and that signed etcd's certificate.
    pub ca: PathBuf,
    pub server: CertFiles,
    pub client: CertFiles,
    /// A CA that signed neither etcd's nor the good client's certificate.
    pub other_ca: PathBuf,
    /// A client certificate signed by `other_ca`.
    pub stranger: CertFiles,
    /// A client certificate signed by `ca` that expired in 2020.
    pub expired: CertFiles,
}

fn ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.distinguished_name.push(DnType::CommonName, name);
    Ok(CertifiedIssuer::self_signed(p, KeyPair::generate()?)?)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// A leaf certificate for `cn`, signed by `issuer`.
fn leaf(
    dir: &Path,
    name: &str,
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    usage: ExtendedKeyUsagePurpose,
    ip: Option<IpAddr>,
    expired: bool,
) -> Result<CertFiles> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, cn);
    p.subject_alt_names = ip.map(SanType::IpAddress).into_iter().collect();
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages = vec![usage];
    if expired {
        p.not_before = date_time_ymd(2019, 1, 1);
        p.not_after = date_time_ymd(2020, 1, 1);
    }
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, issuer)?;
    Ok(CertFiles {
        cert: write(dir, &format!("{name}.pem"), &cert.pem())?,
        key: write(dir, &format!("{name}-key.pem"), &key.serialize_pem())?,
    })
}

impl Pki {
    /// Makes every certificate in `dir`; etcd's names `server_ip`.
    pub fn make(dir: &Path, server_ip: IpAddr) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (good, other) = (ca("edgevx test CA")?, ca("a CA nobody trusts")?);
        let client = ExtendedKeyUsagePurpose::ClientAuth;
        Ok(Pki {
            ca: write(dir, "ca.pem", &good.pem())?,
            server: leaf(dir, "server", &good, "etcd", ExtendedKeyUsagePurpose::ServerAuth, Some(server_ip), false)?,
            client: leaf(dir, "client", &good, "edgevx", client.clone(), None, false)?,
            other_ca: write(dir, "other-ca.pem", &other.pem())?,
            stranger: leaf(dir, "stranger", &other, "edgevx", client.clone(), None, false)?,
            expired: leaf(dir, "expired", &good, "edgevx", client, None, true)?,
        })
    }
}
