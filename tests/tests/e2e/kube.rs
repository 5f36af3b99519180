//! The Kubernetes source against a stand-in API server (see
//! tests/src/kubeapi.rs: no kube-apiserver can be installed here).
use std::time::Duration;

use anyhow::Result;
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    kubeapi::KubeApi,
    nodes::flannel_node,
    topo::{Cluster, node_name, pod_ip, subnet},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::KERNEL_MAC;

/// A node as kubelet registers it, before any network agent annotates it.
fn bare_node(i: u8) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": subnet(i), "podCIDRs": [subnet(i)]},
        "status": {"conditions": [{"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated"}]},
    })
}

fn kube_args(kubeconfig: &str) -> Vec<&str> {
    vec!["--kube", "--kubeconfig", kubeconfig]
}

/// The stand-in API inside node1's namespace, knowing node1 as kubelet
/// registered it; returns it and the kubeconfig path for the agent.
fn api_for_node1(c: &mut Cluster) -> Result<(KubeApi, String)> {
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    api.put_node(bare_node(1));
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    c.host_mut(1).mount_bpffs()?;
    Ok((api, kc.to_string_lossy().into_owned()))
}

#[test]
fn kube_source_publishes_like_flanneld_and_follows_nodes() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let (api, kc) = api_for_node1(&mut c)?;
    let mut agent = Agent::start_with(c.host(1), &kube_args(&kc))?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();

    // the exact patches flanneld sends: annotations, then the condition
    let patches = api.wait_patches(Duration::from_secs(10), |p| p.len() >= 2)?;
    let first = &patches[0];
    assert_eq!(first.method, "PATCH");
    assert_eq!(first.path, "/api/v1/nodes/node1/status");
    assert_eq!(first.content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        first.body,
        json!({"metadata": {"annotations": {
            "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": "198.18.0.1",
        }}})
    );
    let cond = &patches[1].body["status"]["conditions"][0];
    assert_eq!(
        (cond["type"].as_str(), cond["status"].as_str(), cond["reason"].as_str()),
        (Some("NetworkUnavailable"), Some("False"), Some("FlannelIsUp"))
    );
    assert!(first.user_agent.starts_with("edgevx/"), "user agent {:?}", first.user_agent);

    // peers appear, change and go as Nodes are added, changed and deleted
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    api.put_node(flannel_node(2, Some(KERNEL_MAC)));
    wait_status(&agent, Duration::from_secs(5), "node2 added", |s| {
        peers(s) == vec![("node2".into(), KERNEL_MAC.into())]
    })?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?, (5, 5));

    let new_mac = "02:00:00:00:02:77";
    api.put_node(flannel_node(2, Some(new_mac)));
    wait_status(&agent, Duration::from_secs(5), "node2 changed", |s| {
        peers(s) == vec![("node2".into(), new_mac.into())]
    })?;

    // the watch expires (410 Gone): the agent lists again and misses nothing
    let lists = api.lists();
    api.expire_watches();
    api.put_node(flannel_node(3, Some("02:00:00:00:03:01")));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api.lists() == lists && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(api.lists() > lists, "no re-list after 410 Gone");
    wait_status(&agent, Duration::from_secs(10), "node3 added", |s| peers(s).len() == 2)?;

    api.delete_node("node2");
    wait_status(&agent, Duration::from_secs(5), "node2 deleted", |s| {
        peers(s) == vec![("node3".into(), "02:00:00:00:03:01".into())]
    })?;
    assert!(!c.host(1).ns.ip(&["route"])?.contains("10.244.2.0/24"));

    // a restart with nothing changed patches nothing
    let before = api.patches().len();
    agent.stop()?;
    // the own Node now carries the MAC: it wins over the state dir
    std::fs::remove_file(c.host(1).state_dir().join("vtep-mac"))?;
    let agent = Agent::start_with(c.host(1), &kube_args(&kc))?;
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str(), "MAC not restored from the node annotation");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(api.patches().len(), before, "patched although nothing changed: {:#?}", &api.patches()[before..]);
    Ok(())
}

#[test]
fn kube_offline_start_uses_the_cache_and_reconciles_when_the_api_returns() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let (api, kc) = api_for_node1(&mut c)?;
    for i in [2u8, 3] {
        api.put_node(flannel_node(i, Some(KERNEL_MAC)));
        c.host(i).kernel_vtep(KERNEL_MAC)?;
    }
    let mut agent = Agent::start_with(c.host(1), &kube_args(&kc))?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    for i in [2u8, 3] {
        c.host(i).kernel_add_peer(1, &mac)?;
    }
    wait_status(&agent, Duration::from_secs(5), "two peers", |s| peers(s).len() == 2)?;
    agent.stop()?;

    // reboot with the API unreachable: the cached view brings the dataplane back
    c.reboot(1)?;
    let api = KubeApi::start_in(&c.host(1).ns.name)?; // the old listener died with the namespace
    api.set_down(true);
    api.put_node(bare_node(1));
    api.put_node(flannel_node(2, Some(KERNEL_MAC)));
    // node3 was deleted while the node was cut off
    api.kubeconfig(&c.dir.join("kubeconfig"))?;
    c.host_mut(1).mount_bpffs()?;
    let agent = Agent::start_with(c.host(1), &kube_args(&kc))?;
    assert!(agent.log_text().contains("restoring the dataplane from the cached view"), "{}", agent.log_text());
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str());
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 10)?;
    assert_eq!(peers(&agent.status()?).len(), 2, "peers removed while the API was down");

    api.set_down(false);
    wait_status(&agent, Duration::from_secs(20), "node3 removed", |s| {
        peers(s) == vec![("node2".into(), KERNEL_MAC.into())]
    })?;
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 5, "0.05")?, (5, 5));
    Ok(())
}

#[test]
fn kube_flannel_yml_args_run_edgevx_unchanged() -> Result<()> {
    // kube-flannel.yml's container args (flannel HEAD), nothing added but
    // edgevx's own paths: no --iface (the default route's interface), and
    // flanneld's healthz port serving edgevx's probes. The stand-in API is
    // plain http, not an in-cluster service account, so the kubeconfig comes
    // as flanneld's own variable, not as a flag
    let mut c = Cluster::new(1)?;
    let (_api, kc) = api_for_node1(&mut c)?;
    let h = c.host(1);
    h.ns.ip(&["route", "add", "default", "via", "198.18.0.254", "dev", "eth0"])?;
    let env = format!("FLANNELD_KUBECONFIG_FILE={kc}");
    let args = ["--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"];
    let mut agent = Agent::spawn_choosing_iface_via(h, &["env", &env], &args)?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let s = agent.status()?;
    assert_eq!(s["iface"], "eth0", "{s}");
    assert_eq!(s["ip_masq"], true, "{s}");
    let ready = crate::metrics::until("/readyz on the healthz port", Duration::from_secs(20), || {
        let r = crate::metrics::get_at(&h.ns, "198.18.0.1:8081", "/readyz");
        Ok(r.ok().filter(|r| r.status == 200))
    })?;
    assert_eq!(ready.body, "ready\n");
    assert_eq!(crate::metrics::get_at(&h.ns, "198.18.0.1:8081", "/healthz")?.status, 200);
    Ok(())
}
