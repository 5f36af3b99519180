//! The setup most tests, the demo and the bench start from: node1 runs
//! edgevx from a nodes file, node2 is an unmodified flannel node (the
//! kernel's VXLAN device with flanneld's arp, fdb and route entries).
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
};

/// The kernel VTEP MAC of the flannel-style node.
pub const KERNEL_MAC: &str = "02:00:00:00:02:01";

pub struct EdgevxAndFlannel {
    pub cluster: Cluster,
    pub nodes_file: PathBuf,
    pub agent: Agent,
    /// node1's VTEP MAC (generated: node1 publishes none in the file)
    pub mac: String,
}

/// Brings the pair up (agent flags `extra`) and waits until pods can talk.
pub fn edgevx_and_flannel(extra: &[&str]) -> Result<EdgevxAndFlannel> {
    let mut cluster = Cluster::new(2)?;
    cluster.host_mut(1).mount_bpffs()?;
    let nodes_file = cluster.dir.join("nodes.json");
    write(&nodes_file, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let agent = Agent::start(cluster.host(1), &nodes_file, extra)?;
    let mac = agent.status()?["vtep_mac"].as_str().context("status has no vtep_mac")?.to_string();
    cluster.host(2).kernel_vtep(KERNEL_MAC)?;
    cluster.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&cluster.host(1).pod, pod_ip(2), 20)?;
    wait_reachable(&cluster.host(2).pod, pod_ip(1), 20)?;
    Ok(EdgevxAndFlannel { cluster, nodes_file, agent, mac })
}
