//! Configuration from the environment alone, as the DaemonSet gives it:
//! EDGEVX_* variables, NODE_NAME, and KUBERNETES_SERVICE_HOST choosing the
//! Kubernetes source.
use std::{
    fs::File,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use edgevx_tests::{agent::status, edgevx_bin, kubeapi::KubeApi, nodes::flannel_node, topo::Cluster};
use serde_json::json;

#[test]
fn every_setting_can_come_from_the_environment() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}, "spec": {"podCIDR": "10.244.1.0/24"}}));
    api.put_node(flannel_node(2, Some(crate::KERNEL_MAC)));
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let log = h.dir.join("env-agent.log");
    let mut child =
        h.ns.cmd(&edgevx_bin().to_string_lossy())
            .arg("run")
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1") // as in a pod: no source flag needed
            .env("NODE_NAME", "node1")
            .env("EDGEVX_KUBECONFIG", &kc)
            .env("EDGEVX_IFACE", "eth0")
            .env("EDGEVX_STATE_DIR", h.state_dir())
            .env("EDGEVX_BPFFS", h.bpffs_dir())
            .env("EDGEVX_SUBNET_FILE", h.subnet_file())
            .env("EDGEVX_BYPASS_NETFILTER", "true")
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let result = (|| -> Result<()> {
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("dataplane up") {
                assert!(text.contains("source=\"Kubernetes API\""), "{text}");
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("no dataplane from the environment alone:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })();
    let s = status(&h.ns, &h.state_dir(), &h.bpffs_dir());
    let _ = child.kill();
    let _ = child.wait();
    result?;
    let s = s?;
    assert_eq!(s["node"], "node1");
    assert_eq!(s["delivery"], "bypass-netfilter");
    assert_eq!(s["subnet"], "10.244.1.0/24");
    assert!(std::fs::read_to_string(h.subnet_file())?.contains("FLANNEL_SUBNET=10.244.1.1/24"));
    Ok(())
}
