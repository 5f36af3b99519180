//! Replacing flanneld on a live node: edgevx adopts flannel.1 with the MAC
//! flanneld published, takes over without losing a packet, and leaves the
//! kernel peer untouched.
use anyhow::{Context, Result};
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{BackgroundPing, wait_reachable},
};

use crate::{MIB, testpeer};

#[test]
fn edgevx_takes_over_a_flannel_node_without_losing_a_packet() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let (m1, m2) = ("02:f1:00:00:00:01", "02:f2:00:00:00:02");
    // both nodes start as flanneld left them
    c.host(1).kernel_vtep(m1)?;
    c.host(1).kernel_add_peer(2, m2)?;
    c.host(2).kernel_vtep(m2)?;
    c.host(2).kernel_add_peer(1, m1)?;
    wait_reachable(&c.host(2).pod, pod_ip(1), 10)?;
    let kernel_peer = c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?;

    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, Some(m1)), flannel_node(2, Some(m2))]))?;
    c.host_mut(1).mount_bpffs()?;
    let pingers = [(2u8, 1u8), (1, 2)]
        .into_iter()
        .map(|(from, to)| BackgroundPing::start(&c.host(from).pod, pod_ip(to), 300, "0.01"))
        .collect::<Result<Vec<_>>>()?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    for p in pingers {
        p.expect_no_loss().with_context(|| {
            format!(
                "the takeover lost packets:
{:#}
{}",
                agent.status().map(|s| s["counters"].clone()).unwrap_or_default(),
                agent.log_text()
            )
        })?;
    }
    assert_eq!(agent.status()?["vtep_mac"], m1, "the MAC flanneld published must stay");
    assert!(agent.log_text().contains("removed arp/fdb entries"), "{}", agent.log_text());
    let n1 = &c.host(1).ns;
    assert!(!n1.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?.contains("dst"), "flanneld's fdb entries remain");
    assert!(!n1.ip(&["neigh", "show", "dev", "flannel.1"])?.contains("PERMANENT"), "flanneld's arp entries remain");
    assert_eq!(c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?, kernel_peer);
    assert!(agent.status()?["counters"]["tx_packets"].as_u64() > Some(0));
    testpeer().tcp_transfer(&c.host(1).pod, &c.host(2).pod, pod_ip(2), 16 * MIB)?;
    testpeer().tcp_transfer(&c.host(2).pod, &c.host(1).pod, pod_ip(1), 16 * MIB)?;
    Ok(())
}
