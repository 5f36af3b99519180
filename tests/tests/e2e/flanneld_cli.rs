//! flanneld's command line and FLANNELD_* environment run edgevx unchanged;
//! a flanneld flag with no edgevx meaning exits 2 naming it.
use std::process::Command;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::Agent,
    edgevx_bin,
    etcd::{ENDPOINT, Etcd, PREFIX},
};

use crate::etcd::CONFIG;

#[test]
fn flanneld_flags_without_meaning_exit_2_naming_them() -> Result<()> {
    for (args, env, culprit, advice) in [
        (vec!["--ip-blackhole-route"], None, "--ip-blackhole-route", "drop the flag"),
        (vec!["-kube-api-url=https://10.0.0.1:6443"], None, "--kube-api-url", "kubeconfig"),
        (vec!["--healthz-port=http"], None, "--healthz-port", "0 to 65535"),
        (vec!["--subnet-lease-renew-margin=1440"], None, "--subnet-lease-renew-margin", "1 to 1439"),
        (vec![], Some(("FLANNELD_KUBE_API_URL", "https://10.0.0.1:6443")), "FLANNELD_KUBE_API_URL", "kubeconfig"),
    ] {
        let mut cmd = Command::new(edgevx_bin());
        cmd.args(["run", "--node-name", "node1", "--nodes-file", "/nonexistent"]).args(&args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().context("cannot run edgevx")?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(culprit) && err.contains(advice), "{args:?}: {err}");
    }
    Ok(())
}

#[test]
fn a_flanneld_env_file_and_go_style_flags_run_the_agent() -> Result<()> {
    let mut c = edgevx_tests::topo::Cluster::new(1)?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    c.host_mut(1).mount_bpffs()?;
    let endpoints = format!("FLANNELD_ETCD_ENDPOINTS={ENDPOINT}");
    let prefix = format!("FLANNELD_ETCD_PREFIX={PREFIX}");
    let wrapper = ["env", endpoints.as_str(), prefix.as_str(), "FLANNELD_SUBNET_LEASE_RENEW_MARGIN=30"];
    let mut agent = Agent::spawn_via(c.host(1), &wrapper, &["-ip-masq=false", "--iptables-forward-rules=true"])?;
    agent.wait_log("dataplane up", std::time::Duration::from_secs(20))?;
    let leases = etcd.get_prefix(&format!("{PREFIX}/subnets/"))?;
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert!(leases[0].1.contains("\"PublicIP\":\"198.18.0.1\""), "{leases:?}");
    agent.stop()?;
    Ok(())
}

#[test]
fn etcd_username_and_password_from_flanneld_env_authenticate() -> Result<()> {
    let mut c = edgevx_tests::topo::Cluster::new(1)?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    etcd.ctl(&["user", "add", "root:rootpw"])?;
    etcd.ctl(&["user", "grant-role", "root", "root"])?;
    etcd.ctl(&["auth", "enable"])?;
    assert!(etcd.get_prefix(PREFIX).is_err(), "etcd must refuse a client without credentials now");
    c.host_mut(1).mount_bpffs()?;
    let endpoints = format!("FLANNELD_ETCD_ENDPOINTS={ENDPOINT}");
    let wrapper = ["env", endpoints.as_str(), "FLANNELD_ETCD_USERNAME=root", "FLANNELD_ETCD_PASSWORD=rootpw"];
    let mut agent = Agent::spawn_via(c.host(1), &wrapper, &[])?;
    agent.wait_log("dataplane up", std::time::Duration::from_secs(20))?;
    let leases = etcd.ctl(&["--user=root:rootpw", "get", "--prefix", &format!("{PREFIX}/subnets/")])?;
    assert!(leases.contains("\"PublicIP\":\"198.18.0.1\""), "{leases}");
    agent.stop()?;
    Ok(())
}
