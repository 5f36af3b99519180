//! edgevx against an unmodified flannel node: the kernel's own VXLAN device
//! with exactly the arp, fdb and route entries flanneld installs.
use std::time::Duration;

use anyhow::Result;
use edgevx_tests::{
    agent::{Agent, wait_status},
    scenario::edgevx_and_flannel,
    topo::{Cluster, pod_ip},
    traffic::ping,
};

use crate::{MIB, testpeer};

/// Node 1 runs edgevx (with `extra` flags), node 2 is a kernel flannel node.
fn edgevx_and_kernel(extra: &[&str]) -> Result<(Cluster, Agent)> {
    let s = edgevx_and_flannel(extra)?;
    Ok((s.cluster, s.agent))
}

/// An nftables FORWARD rule on a node, as a policy-enforcing cluster has.
fn forward_drop(ns: &edgevx_tests::netns::Netns, rule: &str) -> Result<()> {
    ns.run(&["nft", "add", "table", "inet", "evx"])?;
    ns.run(&["nft", "add", "chain", "inet", "evx", "edgevxtest", "{ type filter hook forward priority 0; }"])?;
    let mut args = vec!["nft", "add", "rule", "inet", "evx", "edgevxtest"];
    args.extend(rule.split_whitespace());
    ns.run(&args).map(|_| ())
}

fn exchange_all_traffic(c: &Cluster) -> Result<()> {
    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    assert_eq!(ping(p1, pod_ip(2), 10, "0.05")?, (10, 10), "ICMP edgevx -> kernel");
    assert_eq!(ping(p2, pod_ip(1), 10, "0.05")?, (10, 10), "ICMP kernel -> edgevx");
    let peer = testpeer();
    peer.tcp_transfer(p1, p2, pod_ip(2), 64 * MIB)?;
    peer.tcp_transfer(p2, p1, pod_ip(1), 64 * MIB)?;
    assert_eq!(peer.udp_datagrams(p1, p2, pod_ip(2), 300, 1400)?, 300, "UDP edgevx -> kernel");
    assert_eq!(peer.udp_datagrams(p2, p1, pod_ip(1), 300, 1400)?, 300, "UDP kernel -> edgevx");
    Ok(())
}

/// Waits until node 1's agent has learned its pod (once the host talked to it).
fn pod_learned(agent: &Agent) -> Result<()> {
    wait_status(agent, Duration::from_secs(5), "a learned local pod", |s| s["local_pods"].as_u64() >= Some(1))
        .map(|_| ())
}

#[test]
fn default_mode_interoperates_with_kernel_flannel_both_ways() -> Result<()> {
    interoperates_both_ways(&[], crate::features::default_attach())
}

/// The same on a kernel without TCX: filters on a clsact qdisc, forced here.
#[test]
fn clsact_fallback_interoperates_with_kernel_flannel_both_ways() -> Result<()> {
    interoperates_both_ways(&["--tc-attach", "clsact"], "clsact")
}

/// What a 5.10 to 5.12 kernel runs: clsact filters, and the encap without
/// the ENCAP_L2_ETH flag (both forced here; the kernel chooses them there).
#[test]
fn a_pre_5_13_style_node_interoperates_with_kernel_flannel_both_ways() -> Result<()> {
    interoperates_both_ways(&["--tc-attach", "clsact", "--legacy-encap"], "clsact")
}

fn interoperates_both_ways(extra: &[&str], attach: &str) -> Result<()> {
    let (c, agent) = edgevx_and_kernel(extra)?;
    pod_learned(&agent)?;
    exchange_all_traffic(&c)?;
    let s = agent.status()?;
    assert_eq!(s["delivery"], "host-stack");
    assert_eq!(
        (&s["attach"], &s["dataplane_attached"], &s["bridge_attached"]),
        (&attach.into(), &true.into(), &true.into()),
        "{s:#}"
    );
    let peer = &s["peers"][0];
    assert!(peer["tx_packets"].as_u64() > Some(1000) && peer["rx_packets"].as_u64() > Some(1000), "{s:#}");
    let counters = &s["counters"];
    assert!(counters["rx_stack_packets"].as_u64() > Some(1000), "TC decap into the host stack unused: {s:#}");
    assert!(counters["bridge_to_port"].as_u64() > Some(1000), "the pod bridge program unused: {s:#}");
    assert_eq!(counters["rx_fast_packets"], 0, "the default never bypasses the host: {s:#}");
    assert_eq!(counters["drop_unknown_peer"], 0);
    Ok(())
}

#[test]
fn default_mode_keeps_forward_rules() -> Result<()> {
    let (c, agent) = edgevx_and_kernel(&[])?;
    pod_learned(&agent)?;
    // a FORWARD rule on the edgevx node decides, as it would with flannel
    let n1 = &c.host(1).ns;
    forward_drop(n1, "ip saddr 10.244.2.2 ip daddr 10.244.1.2 icmp type echo-request drop")?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?.1, 0, "FORWARD drop rule was bypassed");
    n1.run(&["nft", "delete table inet evx"])?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?.1, 5);
    let s = agent.status()?;
    assert!(s["counters"]["rx_stack_packets"].as_u64() >= Some(10), "the TC decap path was not the one tested: {s:#}");
    Ok(())
}

#[test]
fn host_routing_flag_still_means_the_default() -> Result<()> {
    let (c, agent) = edgevx_and_kernel(&["--host-routing"])?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?, (5, 5));
    assert_eq!(agent.status()?["delivery"], "host-stack");
    Ok(())
}

#[test]
fn bypass_netfilter_skips_forward_rules_as_documented() -> Result<()> {
    let (c, agent) = edgevx_and_kernel(&["--bypass-netfilter"])?;
    pod_learned(&agent)?;
    forward_drop(&c.host(1).ns, "ip daddr 10.244.1.2 icmp type echo-request drop")?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?.1, 5, "the bypass should not traverse FORWARD");
    let s = agent.status()?;
    assert_eq!(s["delivery"], "bypass-netfilter");
    assert!(s["counters"]["rx_fast_packets"].as_u64() >= Some(5), "{s:#}");
    Ok(())
}
