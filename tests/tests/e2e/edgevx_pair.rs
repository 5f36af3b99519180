//! Two edgevx nodes: both ends are ours.
use anyhow::Result;
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::{MIB, testpeer};

#[test]
fn edgevx_to_edgevx_carries_icmp_tcp_udp() -> Result<()> {
    let mut c = Cluster::new(2)?;
    // both nodes publish fixed MACs through backend-data (precedence 1)
    let (m1, m2) = ("02:11:00:00:00:01", "02:22:00:00:00:02");
    let nodes = c.dir.join("nodes.yaml");
    write(&nodes, &node_list(vec![flannel_node(1, Some(m1)), flannel_node(2, Some(m2))]))?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    // with the inner-source check on: real pod traffic is never mistaken for spoofing
    let a1 = Agent::start(c.host(1), &nodes, &["--strict-inner-source"])?;
    let a2 = Agent::start(c.host(2), &nodes, &["--strict-inner-source"])?;
    assert_eq!(a1.status()?["vtep_mac"], m1);
    assert_eq!(a2.status()?["vtep_mac"], m2);
    // flannel's newVXLANDevice: no router advertisements on the VTEP
    let accept_ra = c.host(1).ns.run(&["cat", "/proc/sys/net/ipv6/conf/flannel.1/accept_ra"])?;
    assert_eq!(accept_ra.trim(), "0");

    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    wait_reachable(p1, pod_ip(2), 20)?;
    assert_eq!(ping(p1, pod_ip(2), 10, "0.05")?, (10, 10));
    assert_eq!(ping(p2, pod_ip(1), 10, "0.05")?, (10, 10));
    let peer = testpeer();
    peer.tcp_transfer(p1, p2, pod_ip(2), 64 * MIB)?;
    peer.tcp_transfer(p2, p1, pod_ip(1), 64 * MIB)?;
    assert_eq!(peer.udp_datagrams(p1, p2, pod_ip(2), 300, 1400)?, 300);
    assert_eq!(peer.udp_datagrams(p2, p1, pod_ip(1), 300, 1400)?, 300);
    for a in [&a1, &a2] {
        let s = a.status()?;
        assert!(s["counters"]["tx_packets"].as_u64() > Some(1000), "{s:#}");
        assert_eq!(s["counters"]["drop_spoofed_source"], 0, "{s:#}");
        // no fdb and no permanent neighbour entries on our VTEP
        let ns = if std::ptr::eq(a, &a1) { &c.host(1).ns } else { &c.host(2).ns };
        assert_eq!(
            ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?.lines().filter(|l| l.contains("dst")).count(),
            0
        );
        assert!(!ns.ip(&["neigh", "show", "dev", "flannel.1"])?.contains("PERMANENT"));
    }
    Ok(())
}
