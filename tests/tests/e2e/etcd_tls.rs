//! The etcd source over TLS with client-certificate auth, against a real
//! etcd and certificates made in the test: good certificates work, and a
//! wrong CA, a client certificate etcd does not trust, and an expired one
//! each fail with a message that says which file is wrong.
use std::time::Duration;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::Agent,
    etcd::{ADDR, Etcd, PREFIX, TLS_ENDPOINT},
    pki::{CertFiles, Pki},
    topo::{Cluster, Host},
};

use crate::etcd::CONFIG;

fn tls_args(ca: &std::path::Path, client: &CertFiles) -> Vec<String> {
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    vec![
        "--etcd-endpoints".into(),
        TLS_ENDPOINT.into(),
        "--etcd-cafile".into(),
        s(ca),
        "--etcd-certfile".into(),
        s(&client.cert),
        "--etcd-keyfile".into(),
        s(&client.key),
    ]
}

fn spawn(h: &Host, args: &[String]) -> Result<Agent> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Agent::spawn(h, &args)
}

#[test]
fn etcd_tls_good_certificates_work_and_bad_ones_fail_clearly() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let pki = Pki::make(&c.dir.join("pki"), ADDR.parse()?)?;
    let etcd = Etcd::start_tls(&c, &pki)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;

    // the right CA and a client certificate it signed: a lease, as over HTTP
    let mut good = spawn(c.host(1), &tls_args(&pki.ca, &pki.client))?;
    good.wait_log("dataplane up", Duration::from_secs(20))?;
    let leases = etcd.get_prefix(&format!("{PREFIX}/subnets/"))?;
    assert!(leases.iter().any(|(_, v)| v.contains("\"PublicIP\":\"198.18.0.1\"")), "{leases:?}");

    // each bad certificate: a message naming the file to fix, and no lease
    let cases = [
        (tls_args(&pki.other_ca, &pki.client), pki.other_ca.display().to_string(), "not signed by"),
        (tls_args(&pki.ca, &pki.stranger), pki.stranger.cert.display().to_string(), "refused our client certificate"),
        (tls_args(&pki.ca, &pki.expired), pki.expired.cert.display().to_string(), "expired"),
    ];
    for (args, file, what) in cases {
        let mut a = spawn(c.host(2), &args)?;
        a.wait_log(what, Duration::from_secs(30)).with_context(|| format!("{file}: {}", a.log_text()))?;
        let log = a.log_text();
        let line = log.lines().find(|l| l.contains(what)).unwrap_or_default();
        assert!(line.contains("etcd is not usable") && line.contains(&file), "{file}: want it named in\n{line}");
        a.stop()?;
        let leases = etcd.get_prefix(&format!("{PREFIX}/subnets/"))?;
        assert!(!leases.iter().any(|(_, v)| v.contains("198.18.0.2")), "{file}: a lease was written: {leases:?}");
        assert!(c.host(2).ns.ip(&["link", "show", "flannel.1"]).is_err(), "{file}: a VTEP was created");
    }
    drop(good);
    Ok(())
}
