//! etcd mode with Kubernetes credentials: flannel's annotations on our own
//! Node, for F5 CIS, with subnets still from etcd and NetworkUnavailable
//! left alone (etcd is the subnet manager).
use std::time::Duration;

use anyhow::Result;
use edgevx_tests::{
    agent::Agent,
    etcd::{ENDPOINT, Etcd, PREFIX},
    kubeapi::KubeApi,
    topo::{Cluster, node_name},
};
use serde_json::json;

use crate::etcd::CONFIG;

#[test]
fn etcd_mode_publishes_annotations_for_cis_once_the_api_answers() -> Result<()> {
    let mut c = Cluster::new(1)?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    // as kubelet registers it, without a podCIDR: etcd hands out subnets
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(1), "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "status": {"conditions": [{"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated"}]},
    }));
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    let kc = kc.to_string_lossy().into_owned();
    c.host_mut(1).mount_bpffs()?;

    // the API is down at boot: the dataplane comes up from etcd all the same
    api.set_down(true);
    let mut agent = Agent::start_with(c.host(1), &["--etcd-endpoints", ENDPOINT, "--kubeconfig", &kc])?;
    let status = agent.status()?;
    let mac = status["vtep_mac"].as_str().unwrap_or_default().to_string();
    let subnet = status["subnet"].as_str().unwrap_or_default().to_string();
    assert!(subnet.starts_with("10.244."), "subnet from etcd: {status:#}");
    assert!(api.patches().is_empty(), "nothing can land while the API is down");

    // it answers again: the same patch the Kubernetes source sends, and no condition
    api.set_down(false);
    let patches = api.wait_patches(Duration::from_secs(40), |p| !p.is_empty())?;
    assert_eq!(patches[0].path, "/api/v1/nodes/node1/status");
    assert_eq!(patches[0].content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        patches[0].body,
        json!({"metadata": {"annotations": {
            "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": "198.18.0.1",
        }}})
    );
    agent.stop()?;
    let node = api.node("node1").unwrap_or_default();
    assert_eq!(node["status"]["conditions"][0]["status"], "True", "NetworkUnavailable untouched: {node:#}");
    assert!(api.patches().iter().all(|p| p.body.get("status").is_none()), "{:#?}", api.patches());

    // a restart with the same VTEP: the annotations are current, nothing is patched
    let sent = api.patches().len();
    let mut agent = Agent::start_with(c.host(1), &["--etcd-endpoints", ENDPOINT, "--kubeconfig", &kc])?;
    agent.wait_log("VTEP annotations already up to date", Duration::from_secs(20))?;
    assert_eq!(api.patches().len(), sent, "{:#?}", api.patches());
    agent.stop()?;
    Ok(())
}
