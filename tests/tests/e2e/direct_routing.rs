//! `Backend.DirectRouting: true` against kernel flannel nodes configured the
//! same way. node1 runs edgevx; node2 is a kernel flannel node on the same
//! switch (on-link both ways: plain routes, as flanneld with DirectRouting
//! installs them); node3 is a kernel flannel node on another segment,
//! 198.18.1.0/24, behind a router (encapsulated both ways). What is VXLAN
//! and what is not is read on the switch, outside every node.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::{self, Agent, wait_status},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    router::{Router, WireCounters, far_ip, kernel_add_lease_at},
    topo::{Cluster, Host, pod_ip, underlay_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::{MIB, testpeer};

const MAC2: &str = "02:00:00:00:02:01";
const MAC3: &str = "02:00:00:00:03:01";

fn net_conf(direct_routing: bool) -> String {
    json!({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan", "DirectRouting": direct_routing}}).to_string()
}

struct Site {
    // dropped first: the agent goes before its namespaces
    agent: Agent,
    _router: Router,
    cluster: Cluster,
    nodes_file: PathBuf,
    conf: PathBuf,
}

fn nodes(with_node2: bool) -> Value {
    let mut far = flannel_node(3, Some(MAC3));
    far["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ip"] = json!(far_ip(3).to_string());
    let mut list = vec![flannel_node(1, None), far];
    if with_node2 {
        list.push(flannel_node(2, Some(MAC2)));
    }
    node_list(list)
}

/// The three nodes, each pod reaching the others' through edgevx's node.
fn site() -> Result<Site> {
    let mut cluster = Cluster::new(3)?;
    cluster.host_mut(1).mount_bpffs()?;
    let router = Router::behind(&cluster, 3)?;
    for i in [1, 2] {
        router.route_far_segment(cluster.host(i))?;
    }
    let nodes_file = cluster.dir.join("nodes.json");
    write(&nodes_file, &nodes(true))?;
    let conf = cluster.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf(true))?;
    let agent = Agent::start(cluster.host(1), &nodes_file, &["--net-conf", conf.to_str().context("path")?])?;
    let mac1 = agent.status()?["vtep_mac"].as_str().context("status has no vtep_mac")?.to_string();
    // node2, flanneld with DirectRouting: node1 is on-link, node3 is not
    let (h2, h3) = (cluster.host(2), cluster.host(3));
    h2.kernel_vtep(MAC2)?;
    h2.plain_route(1)?;
    kernel_add_lease_at(h2, 3, far_ip(3), MAC3)?;
    // node3, the same: neither peer is on its segment
    h3.kernel_vtep_at(MAC3, &far_ip(3).to_string())?;
    kernel_add_lease_at(h3, 1, underlay_ip(1), &mac1)?;
    kernel_add_lease_at(h3, 2, underlay_ip(2), MAC2)?;
    for j in [2, 3] {
        wait_reachable(&cluster.host(1).pod, pod_ip(j), 20).with_context(|| format!("pod1 -> pod{j}"))?;
        wait_reachable(&cluster.host(j).pod, pod_ip(1), 20).with_context(|| format!("pod{j} -> pod1"))?;
    }
    Ok(Site { agent, _router: router, cluster, nodes_file, conf })
}

/// `ip -o route show table main exact DST` in `ns`, trimmed.
fn route(ns: &Netns, dst: &str) -> Result<String> {
    Ok(ns.ip(&["-o", "route", "show", "table", "main", "exact", dst])?.trim().to_string())
}

/// Polls `route` until `check` holds (the agent acts on route events and
/// every 10 s resync), failing with the last value after `within`.
fn wait_route(agent: &Agent, ns: &Netns, dst: &str, within: Duration, check: impl Fn(&str) -> bool) -> Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let r = route(ns, dst)?;
        if check(&r) {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!("route {dst} is {r:?} after {within:?}; agent log:\n{}", agent.log_text());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn peer<'a>(status: &'a Value, node: &str) -> Result<&'a Value> {
    status["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["node"] == node)
        .with_context(|| format!("no peer {node} in {status:#}"))
}

const DIRECT_ROUTE: &str = "10.244.2.0/24 via 198.18.0.2 dev eth0";

#[test]
fn direct_routing_routes_on_link_peers_plainly_and_encapsulates_the_rest() -> Result<()> {
    let s = site()?;
    let c = &s.cluster;
    let n1 = &c.host(1).ns;
    // exactly flannel's direct route for the on-link peer, nothing for the far one
    assert_eq!(route(n1, "10.244.2.0/24")?, DIRECT_ROUTE);
    assert_eq!(route(n1, "10.244.3.0/24")?, "", "the far peer has no route of its own");
    assert!(n1.ip(&["route", "get", "10.244.3.2"])?.contains("dev flannel.1"), "the far peer goes through the VTEP");

    let wire = WireCounters::new(c)?;
    wire.count("vxlan_1_to_2", "ip saddr 198.18.0.1 ip daddr 198.18.0.2 udp dport 8472")?;
    wire.count("vxlan_2_to_1", "ip saddr 198.18.0.2 ip daddr 198.18.0.1 udp dport 8472")?;
    wire.count("plain_1_to_2", "ip saddr 10.244.1.2 ip daddr 10.244.2.2")?;
    wire.count("plain_2_to_1", "ip saddr 10.244.2.2 ip daddr 10.244.1.2")?;
    wire.count("vxlan_1_to_3", "ip saddr 198.18.0.1 ip daddr 198.18.1.3 udp dport 8472")?;
    wire.count("vxlan_3_to_1", "ip saddr 198.18.1.3 ip daddr 198.18.0.1 udp dport 8472")?;

    let peer_bin = testpeer();
    for j in [2, 3] {
        let (p1, pj) = (&c.host(1).pod, &c.host(j).pod);
        assert_eq!(ping(p1, pod_ip(j), 10, "0.05")?, (10, 10), "ICMP pod1 -> pod{j}");
        assert_eq!(ping(pj, pod_ip(1), 10, "0.05")?, (10, 10), "ICMP pod{j} -> pod1");
        peer_bin.tcp_transfer(p1, pj, pod_ip(j), 16 * MIB).with_context(|| format!("TCP pod1 -> pod{j}"))?;
        peer_bin.tcp_transfer(pj, p1, pod_ip(1), 16 * MIB).with_context(|| format!("TCP pod{j} -> pod1"))?;
    }

    // the on-link peer: plain IP on the wire both ways, not one VXLAN packet
    assert_eq!(wire.packets("vxlan_1_to_2")?, 0, "edgevx encapsulated to the on-link peer");
    assert_eq!(wire.packets("vxlan_2_to_1")?, 0);
    // (at least the pings; TCP's segments are counted as the GSO packets they are)
    let plain = (wire.packets("plain_1_to_2")?, wire.packets("plain_2_to_1")?);
    assert!(plain.0 >= 10 && plain.1 >= 10, "plain pod packets on the wire: {plain:?}");
    // the peer behind the router: VXLAN both ways
    let vxlan = (wire.packets("vxlan_1_to_3")?, wire.packets("vxlan_3_to_1")?);
    assert!(vxlan.0 >= 10 && vxlan.1 >= 10, "VXLAN packets to and from the far peer: {vxlan:?}");

    let st = s.agent.status()?;
    let (near, far) = (peer(&st, "node2")?, peer(&st, "node3")?);
    assert_eq!((&near["route"], &far["route"]), (&json!("direct"), &json!("vxlan")), "{st:#}");
    assert_eq!((&near["tx_packets"], &near["rx_packets"]), (&json!(0), &json!(0)), "{st:#}");
    assert!(far["tx_packets"].as_u64() >= Some(10) && far["rx_packets"].as_u64() >= Some(10), "{st:#}");
    assert_eq!(st["counters"]["drop_unknown_peer"], 0, "{st:#}");
    Ok(())
}

#[test]
fn direct_routes_are_repaired_removed_with_their_peer_and_replaced_when_direct_routing_goes() -> Result<()> {
    let mut s = site()?;
    let n1 = &s.cluster.host(1).ns;
    // routes that are not DirectRouting's: no gateway, or outside the Network
    n1.ip(&["route", "add", "10.244.77.0/24", "dev", "eth0"])?;
    n1.ip(&["route", "add", "192.0.2.0/24", "via", "198.18.0.2"])?;

    // deleted by hand: back at the route event
    n1.ip(&["route", "del", "10.244.2.0/24", "via", "198.18.0.2", "dev", "eth0"])?;
    wait_route(&s.agent, n1, "10.244.2.0/24", Duration::from_secs(15), |r| r == DIRECT_ROUTE)?;
    assert_eq!(ping(&s.cluster.host(1).pod, pod_ip(2), 3, "0.05")?, (3, 3));

    // the peer leaves the cluster: its direct route goes, nothing else does
    write(&s.nodes_file, &nodes(false))?;
    wait_route(&s.agent, n1, "10.244.2.0/24", Duration::from_secs(15), str::is_empty)?;
    assert_eq!(route(n1, "10.244.77.0/24")?, "10.244.77.0/24 dev eth0 scope link");
    assert_eq!(route(n1, "192.0.2.0/24")?, "192.0.2.0/24 via 198.18.0.2 dev eth0");
    wait_status(&s.agent, Duration::from_secs(5), "node2 gone", |st| peer(st, "node2").is_err())?;

    // back, then DirectRouting switched off at a restart: the Network route carries it
    write(&s.nodes_file, &nodes(true))?;
    wait_route(&s.agent, n1, "10.244.2.0/24", Duration::from_secs(15), |r| r == DIRECT_ROUTE)?;
    s.agent.stop()?;
    std::fs::write(&s.conf, net_conf(false))?;
    let nodes_file = s.nodes_file.clone();
    s.agent = Agent::start(s.cluster.host(1), &nodes_file, &["--net-conf", s.conf.to_str().context("path")?])?;
    let n1 = &s.cluster.host(1).ns;
    wait_route(&s.agent, n1, "10.244.2.0/24", Duration::from_secs(15), str::is_empty)?;
    assert!(n1.ip(&["route", "get", "10.244.2.2"])?.contains("dev flannel.1"));
    // node2 (DirectRouting on) still routes plainly to us; we encapsulate to it
    let (p1, p2) = (&s.cluster.host(1).pod, &s.cluster.host(2).pod);
    wait_reachable(p1, pod_ip(2), 10)?;
    assert_eq!(ping(p2, pod_ip(1), 5, "0.05")?, (5, 5));
    let st = s.agent.status()?;
    let near = peer(&st, "node2")?;
    assert_eq!(near["route"], "vxlan", "{st:#}");
    assert!(near["tx_packets"].as_u64() > Some(0), "{st:#}");
    assert_eq!(route(n1, "10.244.77.0/24")?, "10.244.77.0/24 dev eth0 scope link");
    Ok(())
}

/// `edgevx cleanup` on node `h` with `extra` flags; fails with its output.
fn cleanup(h: &Host, extra: &[&str]) -> Result<()> {
    let out = agent::cleanup(h, extra)?;
    ensure!(out.status.success(), "cleanup {extra:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Handing the node back to a flanneld with DirectRouting: the direct route
/// stays as it is, and only the far peer gets flanneld's arp, fdb and route.
#[test]
fn hand_over_keeps_direct_routes_and_gives_the_far_peer_flanneld_entries() -> Result<()> {
    let mut s = site()?;
    s.agent.stop()?;
    let h1 = s.cluster.host(1);
    cleanup(h1, &["--keep-vtep"])?;
    assert_eq!(route(&h1.ns, "10.244.2.0/24")?, DIRECT_ROUTE);
    assert_eq!(route(&h1.ns, "10.244.3.0/24")?, "10.244.3.0/24 via 10.244.3.0 dev flannel.1 onlink");
    let arp = h1.ns.ip(&["neigh", "show", "dev", "flannel.1"])?;
    assert!(arp.contains(&format!("10.244.3.0 lladdr {MAC3} PERMANENT")), "{arp}");
    assert!(!arp.contains("10.244.2.0"), "the on-link peer got an arp entry: {arp}");
    let fdb = h1.ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?;
    assert!(fdb.contains(&format!("{MAC3} dst {}", far_ip(3))), "{fdb}");
    assert!(!fdb.contains(MAC2), "the on-link peer got an fdb entry: {fdb}");
    // the kernel alone now forwards both ways to both peers
    for j in [2, 3] {
        assert_eq!(ping(&h1.pod, pod_ip(j), 3, "0.05")?, (3, 3), "pod1 -> pod{j}");
        assert_eq!(ping(&s.cluster.host(j).pod, pod_ip(1), 3, "0.05")?, (3, 3), "pod{j} -> pod1");
    }
    Ok(())
}

/// A full cleanup takes the direct routes with it, and only them.
#[test]
fn cleanup_removes_the_direct_routes() -> Result<()> {
    let mut s = site()?;
    let h1 = s.cluster.host(1);
    h1.ns.ip(&["route", "add", "10.244.77.0/24", "dev", "eth0"])?;
    s.agent.stop()?;
    cleanup(h1, &[])?;
    assert_eq!(route(&h1.ns, "10.244.2.0/24")?, "");
    assert_eq!(route(&h1.ns, "10.244.77.0/24")?, "10.244.77.0/24 dev eth0 scope link");
    assert!(h1.ns.ip(&["link", "show", "flannel.1"]).is_err(), "flannel.1 is still there");
    Ok(())
}

/// With the fast path taking node1's flows (conntrack on, as kube-proxy's
/// INVALID drop turns it on), the on-link peer's traffic still leaves
/// plain: a flow's proof that the stack carried it is written by the encap
/// on `flannel.1`, which a direct-routed flow never reaches, and the send
/// side encapsulates only what the kernel's FIB routes into `flannel.1`
/// (a route that changes under a recorded flow: prog_test_run_fast_send).
/// The far peer's flows are fast-pathed (where the kernel offers the
/// kfuncs), so the send side was on.
#[test]
fn the_fast_paths_send_side_leaves_an_on_link_peers_flows_to_direct_routing() -> Result<()> {
    // conntrack's module loaded before the agent starts, as kube-proxy has it on a node
    edgevx_tests::ct_kfuncs::like_a_node()?;
    let s = site()?;
    let c = &s.cluster;
    let n1 = &c.host(1).ns;
    n1.run(&["iptables", "-w", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"])?;
    let wire = WireCounters::new(c)?;
    wire.count("vxlan_1_to_2", "ip saddr 198.18.0.1 ip daddr 198.18.0.2 udp dport 8472")?;
    wire.count("plain_1_to_2", "ip saddr 10.244.1.2 ip daddr 10.244.2.2")?;
    let peer_bin = testpeer();
    for j in [2, 3] {
        let (p1, pj) = (&c.host(1).pod, &c.host(j).pod);
        peer_bin.tcp_transfer(p1, pj, pod_ip(j), 16 * MIB).with_context(|| format!("TCP pod1 -> pod{j}"))?;
        peer_bin.tcp_transfer(pj, p1, pod_ip(1), 16 * MIB).with_context(|| format!("TCP pod{j} -> pod1"))?;
    }
    let st = s.agent.status()?;
    let sent = st["counters"]["fast_path_sent_packets"].as_u64().context("no fast_path_sent_packets")?;
    ensure!(wire.packets("vxlan_1_to_2")? == 0, "the fast path encapsulated to the on-link peer ({sent} sent fast)");
    ensure!(wire.packets("plain_1_to_2")? > 0, "no plain packet to the on-link peer");
    if st["fast_path"] == "on" {
        ensure!(sent > 0, "the fast path is on but sent nothing to the far peer: {:#}", st["counters"]);
    } else {
        ensure!(
            !edgevx_tests::ct_kfuncs::offered(),
            "the kernel offers the kfuncs, yet fast_path is {}",
            st["fast_path"]
        );
    }
    Ok(())
}
