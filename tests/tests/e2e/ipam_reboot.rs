//! The offline reboot, end to end: two edgevx nodes whose pods come from
//! the real `bridge` plugin with `edgevx-ipam` through the flannel-style
//! delegate built from subnet.env. Node 1 loses power: its namespaces,
//! links, pins and pods go with no CNI DEL; its files (state, subnet.env,
//! the IPAM store) stay. The kubelet then recreates the same pods under new
//! sandbox IDs; each gets its old address back, and a pod on node 2 reaches
//! the old addresses again, as its kube-proxy still believes in them.
use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, wait_status},
    ipam_pod::{IpamPod, flannel_delegate_with_ipam},
    real_node::{INTERNET_IP, NodeKind, RealCluster, at, tcp_exchange},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::MIB;

/// Node `i`'s pods: (namespace, name).
const NODE1_PODS: [(&str, &str); 3] =
    [("default", "web-0"), ("default", "web-1"), ("kube-system", "coredns-7db6d8ff4d-x2x9q")];

fn delegate(rc: &RealCluster, i: u8) -> Result<Value> {
    // the conflist's flannel entry carries `"ipam": {"type": "edgevx-ipam", ...}`
    let data_dir = rc.node(i).dir.join("cni-networks");
    Ok(flannel_delegate_with_ipam(&rc.subnet_env(i)?, &json!({"type": "edgevx-ipam", "dataDir": data_dir})))
}

fn node1_pods(rc: &RealCluster, generation: u32) -> Result<Vec<IpamPod>> {
    let config = delegate(rc, 1)?;
    let node = &rc.node(1).ns;
    NODE1_PODS
        .iter()
        .enumerate()
        .map(|(k, (ns, name))| {
            let netns = format!("{}q{k}g{generation}", node.name);
            IpamPod::add(node, &netns, &format!("sandbox-{generation}-{k}"), ns, name, &config)
        })
        .collect()
}

#[test]
fn ipam_pods_keep_their_addresses_across_an_offline_reboot() -> Result<()> {
    let mut rc = RealCluster::start(&[NodeKind::Edgevx(&[]), NodeKind::Edgevx(&[])], 0)?;
    let client = IpamPod::add(
        &rc.node(2).ns,
        &format!("{}cl", rc.node(2).ns.name),
        "client-1",
        "default",
        "client",
        &delegate(&rc, 2)?,
    )?;
    let before = node1_pods(&rc, 1)?;
    let old: BTreeMap<String, Ipv4Addr> =
        before.iter().map(|p| (format!("{}/{}", p.namespace, p.name), p.ip)).collect();
    let client_ns = client.netns.as_ref().context("client sandbox")?;
    for ip in old.values() {
        wait_reachable(client_ns, *ip, 20)?;
    }

    // power loss on node 1: no DEL, nothing cleaned up; files stay
    rc.agents[0] = None;
    before.into_iter().for_each(IpamPod::vanish);
    rc.cluster.reboot(1)?;
    {
        // Cluster::reboot gives the node a hand-made pod and cni0; a node
        // of real parts has neither until the bridge plugin runs
        let host = rc.node(1);
        host.ns.ip(&["link", "del", "veth1"])?;
        host.ns.ip(&["link", "del", "cni0"])?;
        host.ns.ip(&["route", "add", "default", "via", &INTERNET_IP.to_string()])?;
    }
    rc.cluster.host_mut(1).mount_bpffs()?;
    let nodes_file = rc.cluster.dir.join("nodes.json");
    rc.agents[0] = Some(Agent::start(rc.node(1), &nodes_file, &[])?);

    // the kubelet recreates the same pods under new sandbox IDs
    let after = node1_pods(&rc, 2)?;
    for p in &after {
        let key = format!("{}/{}", p.namespace, p.name);
        ensure!(
            old.get(&key) == Some(&p.ip),
            "{key} came back as {} (sandbox {}), was {:?}",
            p.ip,
            p.container_id,
            old.get(&key)
        );
    }
    for ip in old.values() {
        wait_reachable(client_ns, *ip, 20)?;
    }
    // the new agent learns the pods from their neighbour entries, as on any start
    let agent = rc.agents[0].as_ref().context("node 1's agent")?;
    wait_status(agent, Duration::from_secs(10), "node 1's pods learned", |s| s["local_pods"].as_u64() >= Some(3))?;
    rc.check(|_| {
        for ip in old.values() {
            let (sent, got) = ping(client_ns, *ip, 3, "0.2")?;
            ensure!(got == sent, "{got} of {sent} pings to {ip} came back");
        }
        let server = after[0].netns.as_ref().context("web-0 sandbox")?;
        tcp_exchange(client_ns, at(after[0].ip, 8080), server, 8080, MIB)?;
        Ok(())
    })
}
