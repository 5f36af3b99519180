//! `Backend.DirectRouting: true` on a dual-stack node: node 1 runs edgevx;
//! node 2 is a kernel flannel node on the same switch, so on-link in both
//! families, with the plain routes back to node 1's pod subnets that
//! flanneld with DirectRouting installs. Node 1 must route to node 2's IPv6
//! pods plainly, as flannel does (`fd00:10:244:2::/64 via fd00:198:18::2
//! dev eth0`, nothing on `flannel-v6.1`), and go back to flannel's three
//! entries when DirectRouting is switched off. What is VXLAN and what is
//! not is read on the switch, outside both nodes.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::{self, Agent},
    dual::{add_ipv6, base6, flannel_node6, kernel_vtep6, net_conf_direct_routing, pod_ip6, subnet6, underlay_ip6},
    netns::Netns,
    nodes::{node_list, write},
    router::WireCounters,
    topo::{Cluster, Host, pod_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::Value;

use crate::{KERNEL_MAC, MIB, testpeer};

const KERNEL_MAC6: &str = "02:00:00:00:06:02";

struct Site {
    // dropped first: the agent goes before its namespaces
    agent: Agent,
    c: Cluster,
    nodes_file: PathBuf,
    conf: PathBuf,
}

fn nodes(with_node2: bool) -> Value {
    let mut list = vec![flannel_node6(1, None)];
    if with_node2 {
        list.push(flannel_node6(2, Some((KERNEL_MAC, KERNEL_MAC6))));
    }
    node_list(list)
}

/// Node 1 (edgevx, dual-stack, DirectRouting) and node 2 (kernel flannel
/// with DirectRouting: its devices, and plain routes to node 1's pods in
/// both families), the pods reaching each other both ways.
fn site() -> Result<Site> {
    let mut c = Cluster::new(2)?;
    for i in 1..=2 {
        add_ipv6(c.host(i))?;
    }
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf_direct_routing(true))?;
    let nodes_file = c.dir.join("nodes.json");
    write(&nodes_file, &nodes(true))?;
    let agent = Agent::start(c.host(1), &nodes_file, &["--net-conf", conf.to_str().context("path")?])?;
    let h2 = c.host(2);
    h2.kernel_vtep(KERNEL_MAC)?;
    kernel_vtep6(h2, KERNEL_MAC6)?;
    h2.plain_route(1)?;
    h2.ns.ip(&["-6", "route", "replace", &subnet6(1), "via", &underlay_ip6(1).to_string()])?;
    for (from, to) in [(1, 2), (2, 1)] {
        wait_reachable(&c.host(from).pod, pod_ip(to), 20).with_context(|| format!("pod{from} -> pod{to}"))?;
        wait_reachable(&c.host(from).pod, pod_ip6(to), 20).with_context(|| format!("pod{from} -> pod{to} (IPv6)"))?;
    }
    Ok(Site { agent, c, nodes_file, conf })
}

/// `ip -6 -o route show table main exact DST` in `ns`, trimmed.
fn route6(ns: &Netns, dst: &str) -> Result<String> {
    Ok(ns.ip(&["-6", "-o", "route", "show", "table", "main", "exact", dst])?.trim().to_string())
}

/// flannel's direct route to node 2's IPv6 pods, as `ip -6 route` prints it.
fn direct6() -> String {
    format!("{} via {} dev eth0 ", subnet6(2), underlay_ip6(2))
}

/// flannel's route to node 2's IPv6 pods through the VTEP.
fn vtep6_route() -> String {
    format!("{} via {} dev flannel-v6.1 ", subnet6(2), base6(2))
}

/// Polls `check` on `route6(dst)` (the agent acts on route events and every
/// 10 s resync), failing with the last value and the agent's log.
fn wait_route6(agent: &Agent, ns: &Netns, dst: &str, check: impl Fn(&str) -> bool) -> Result<String> {
    let mut last = String::new();
    wait_for(agent, &format!("route {dst}"), || {
        last = route6(ns, dst)?;
        Ok(check(&last))
    })
    .with_context(|| format!("route {dst} is {last:?}"))?;
    Ok(last)
}

/// Polls `ok` for 15 s, failing with the agent's log.
fn wait_for(agent: &Agent, what: &str, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}; agent log:\n{}", agent.log_text());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The permanent neighbours and the fdb entries of node 1's `flannel-v6.1`.
fn vtep6_entries(ns: &Netns) -> Result<(String, String)> {
    Ok((
        ns.run(&["ip", "-6", "neigh", "show", "dev", "flannel-v6.1", "nud", "permanent"])?,
        ns.run(&["bridge", "fdb", "show", "dev", "flannel-v6.1"])?,
    ))
}

/// Node 2 has no entry of its own on node 1's `flannel-v6.1`.
fn no_vtep6_entries(ns: &Netns) -> Result<()> {
    let (neigh, fdb) = vtep6_entries(ns)?;
    ensure!(!neigh.contains(&base6(2)), "node 2 has a flannel-v6.1 neighbour: {neigh}");
    ensure!(!fdb.contains(KERNEL_MAC6), "node 2 has a flannel-v6.1 fdb entry: {fdb}");
    Ok(())
}

#[test]
fn ipv6_direct_routing_routes_the_on_link_peer_plainly_both_ways() -> Result<()> {
    let s = site()?;
    let (h1, h2) = (s.c.host(1), s.c.host(2));
    // exactly flannel's direct route, in both families, and nothing on flannel-v6.1
    let r = route6(&h1.ns, &subnet6(2))?;
    ensure!(r.starts_with(&direct6()) && r.lines().count() == 1, "node 2's IPv6 pods: {r}");
    no_vtep6_entries(&h1.ns)?;
    let v4 = h1.ns.ip(&["-o", "route", "show", "table", "main", "exact", "10.244.2.0/24"])?;
    ensure!(v4.trim() == "10.244.2.0/24 via 198.18.0.2 dev eth0", "{v4}");

    let wire = WireCounters::new(&s.c)?;
    let (u1, u2, p1, p2) = (underlay_ip6(1), underlay_ip6(2), pod_ip6(1), pod_ip6(2));
    wire.count("vxlan6_1_to_2", &format!("ip6 saddr {u1} ip6 daddr {u2} udp dport 8472"))?;
    wire.count("vxlan6_2_to_1", &format!("ip6 saddr {u2} ip6 daddr {u1} udp dport 8472"))?;
    wire.count("plain6_1_to_2", &format!("ip6 saddr {p1} ip6 daddr {p2}"))?;
    wire.count("plain6_2_to_1", &format!("ip6 saddr {p2} ip6 daddr {p1}"))?;
    let tx6 = || -> Result<u64> {
        let v = h1.ns.run(&["cat", "/sys/class/net/flannel-v6.1/statistics/tx_packets"])?;
        v.trim().parse().context("tx_packets")
    };
    let tx6_before = tx6()?;

    let (pod1, pod2) = (&h1.pod, &h2.pod);
    assert_eq!(ping(pod1, p2, 10, "0.05")?, (10, 10), "ICMPv6 pod1 -> pod2");
    assert_eq!(ping(pod2, p1, 10, "0.05")?, (10, 10), "ICMPv6 pod2 -> pod1");
    let peer = testpeer();
    peer.tcp_transfer(pod1, pod2, p2, 16 * MIB).context("TCP over IPv6 pod1 -> pod2")?;
    peer.tcp_transfer(pod2, pod1, p1, 16 * MIB).context("TCP over IPv6 pod2 -> pod1")?;

    // plain IPv6 on the wire both ways, not one IPv6 VXLAN packet
    assert_eq!(wire.packets("vxlan6_1_to_2")?, 0, "node 1 encapsulated to the on-link peer");
    assert_eq!(wire.packets("vxlan6_2_to_1")?, 0);
    // (at least the pings; TCP's segments are counted as the GSO packets they are)
    let plain = (wire.packets("plain6_1_to_2")?, wire.packets("plain6_2_to_1")?);
    assert!(plain.0 >= 10 && plain.1 >= 10, "plain IPv6 pod packets on the wire: {plain:?}");
    let sent = tx6()? - tx6_before;
    assert!(sent < 10, "flannel-v6.1 sent {sent} packets during the transfers");
    ensure!(s.agent.log_text().lines().all(|l| !l.contains("cannot program the IPv6 VTEP")), "{}", s.agent.log_text());
    Ok(())
}

#[test]
fn ipv6_direct_routes_are_repaired_leave_with_their_peer_and_give_way_when_direct_routing_goes() -> Result<()> {
    let mut s = site()?;
    let n1 = &s.c.host(1).ns;
    // routes into the IPv6 Network out of the underlay that are not a peer's: an appliance's, and one without a gateway
    let appliance = format!("{} via {} dev eth0 ", subnet6(0x77), "fd00:198:18::9");
    n1.ip(&["-6", "route", "add", &subnet6(0x77), "via", "fd00:198:18::9", "dev", "eth0"])?;
    n1.ip(&["-6", "route", "add", &subnet6(0x78), "dev", "eth0"])?;
    let untouched = |n1: &Netns| -> Result<()> {
        let r = route6(n1, &subnet6(0x77))?;
        ensure!(r.starts_with(&appliance), "the appliance's route: {r:?}");
        ensure!(route6(n1, &subnet6(0x78))?.starts_with(&format!("{} dev eth0 ", subnet6(0x78))));
        Ok(())
    };

    // deleted by hand: back at the route event
    n1.ip(&["-6", "route", "del", &subnet6(2), "via", &underlay_ip6(2).to_string(), "dev", "eth0"])?;
    wait_route6(&s.agent, n1, &subnet6(2), |r| r.starts_with(&direct6()))?;
    assert_eq!(ping(&s.c.host(1).pod, pod_ip6(2), 3, "0.05")?, (3, 3));

    // the peer leaves: its direct route goes, nothing else does
    write(&s.nodes_file, &nodes(false))?;
    wait_route6(&s.agent, n1, &subnet6(2), str::is_empty)?;
    untouched(n1)?;

    // back, then DirectRouting switched off at a restart: flannel's three entries replace the route
    write(&s.nodes_file, &nodes(true))?;
    wait_route6(&s.agent, n1, &subnet6(2), |r| r.starts_with(&direct6()))?;
    s.agent.stop()?;
    std::fs::write(&s.conf, net_conf_direct_routing(false))?;
    let (nodes_file, conf) = (s.nodes_file.clone(), s.conf.to_str().context("path")?.to_string());
    s.agent = Agent::start(s.c.host(1), &nodes_file, &["--net-conf", &conf])?;
    let n1 = &s.c.host(1).ns;
    let r = wait_route6(&s.agent, n1, &subnet6(2), |r| r.starts_with(&vtep6_route()))?;
    ensure!(r.lines().count() == 1 && r.contains("onlink"), "{r}");
    let (neigh, fdb) = vtep6_entries(n1)?;
    ensure!(neigh.contains(&format!("{} lladdr {KERNEL_MAC6} PERMANENT", base6(2))), "{neigh}");
    ensure!(fdb.contains(&format!("{KERNEL_MAC6} dst {} self permanent", underlay_ip6(2))), "{fdb}");
    untouched(n1)?;
    // node 2 (DirectRouting on) still routes plainly to us; we encapsulate to it
    let (pod1, pod2) = (&s.c.host(1).pod, &s.c.host(2).pod);
    wait_reachable(pod1, pod_ip6(2), 10)?;
    assert_eq!(ping(pod2, pod_ip6(1), 5, "0.05")?, (5, 5));

    // and on again: the direct route is back, the three entries go
    s.agent.stop()?;
    std::fs::write(&s.conf, net_conf_direct_routing(true))?;
    s.agent = Agent::start(s.c.host(1), &nodes_file, &["--net-conf", &conf])?;
    let n1 = &s.c.host(1).ns;
    wait_route6(&s.agent, n1, &subnet6(2), |r| r.starts_with(&direct6()))?;
    wait_for(&s.agent, "node 2's flannel-v6.1 entries gone", || Ok(no_vtep6_entries(n1).is_ok()))
        .with_context(|| format!("{:?}", vtep6_entries(n1)))?;

    // a full cleanup takes our direct routes with it, and only them
    s.agent.stop()?;
    cleanup(s.c.host(1), &[])?;
    let n1 = &s.c.host(1).ns;
    assert_eq!(route6(n1, &subnet6(2))?, "");
    assert_eq!(n1.ip(&["-o", "route", "show", "table", "main", "exact", "10.244.2.0/24"])?.trim(), "");
    untouched(n1)?;
    Ok(())
}

/// `edgevx cleanup` on node `h` with `extra` flags; fails with its output.
fn cleanup(h: &Host, extra: &[&str]) -> Result<()> {
    let out = agent::cleanup(h, extra)?;
    ensure!(out.status.success(), "cleanup {extra:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Handing the node back to a flanneld with DirectRouting keeps the IPv6
/// direct route, and the kernel alone carries the pods' IPv6 both ways.
#[test]
fn hand_over_keeps_the_ipv6_direct_route() -> Result<()> {
    let mut s = site()?;
    s.agent.stop()?;
    let h1 = s.c.host(1);
    cleanup(h1, &["--keep-vtep"])?;
    let r = route6(&h1.ns, &subnet6(2))?;
    ensure!(r.starts_with(&direct6()), "{r}");
    no_vtep6_entries(&h1.ns)?;
    assert_eq!(ping(&h1.pod, pod_ip6(2), 3, "0.05")?, (3, 3), "pod1 -> pod2");
    assert_eq!(ping(&s.c.host(2).pod, pod_ip6(1), 3, "0.05")?, (3, 3), "pod2 -> pod1");
    Ok(())
}
