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
    ipam_pod::{IpamPod, add_node_pods, flannel_delegate_with_ipam},
    real_node::{NodeKind, RealCluster, at, tcp_exchange},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::MIB;

fn delegate(rc: &RealCluster, i: u8) -> Result<Value> {
    // the conflist's flannel entry carries `"ipam": {"type": "edgevx-ipam", ...}`
    let data_dir = rc.node(i).dir.join("cni-networks");
    Ok(flannel_delegate_with_ipam(&rc.subnet_env(i)?, &json!({"type": "edgevx-ipam", "dataDir": data_dir})))
}

fn node1_pods(rc: &RealCluster, generation: u32) -> Result<Vec<IpamPod>> {
    add_node_pods(&rc.node(1).ns, &delegate(rc, 1)?, generation)
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
    before.into_iter().for_each(IpamPod::vanish);
    rc.power_loss(1)?;
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
