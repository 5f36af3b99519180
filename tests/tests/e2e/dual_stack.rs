//! Dual-stack (`EnableIPv6`): edgevx against a kernel dual-stack flannel
//! node. Node 1 runs edgevx from a nodes file; node 2 has flanneld's
//! `flannel.1` and `flannel-v6.1` with exactly the entries flanneld
//! installs for node 1. IPv6 pods talk over an IPv6 underlay, IPv4 pods
//! over the IPv4 one, both ways.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, cleanup, wait_status},
    dual::{add_ipv6, base6, flannel_node6, kernel_add_peer6, kernel_vtep6, net_conf, pod_ip6, subnet6, underlay_ip6},
    netns::Netns,
    nodes::{node_list, write},
    operator,
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::{KERNEL_MAC, MIB, testpeer};

const KERNEL_MAC6: &str = "02:00:00:00:06:02";

struct Pair {
    c: Cluster,
    agent: Agent,
    nodes_file: PathBuf,
    conf: PathBuf,
    /// node 1's VTEP MACs (IPv4, IPv6), as its status reports them
    macs: (String, String),
}

/// Brings up node 1 (edgevx, dual-stack) and node 2 (kernel flannel,
/// dual-stack), and waits until the pods reach each other in both families.
fn pair() -> Result<Pair> {
    let mut c = Cluster::new(2)?;
    for i in 1..=2 {
        add_ipv6(c.host(i))?;
    }
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf())?;
    let nodes_file = c.dir.join("nodes.json");
    write(&nodes_file, &node_list(vec![flannel_node6(1, None), flannel_node6(2, Some((KERNEL_MAC, KERNEL_MAC6)))]))?;
    let agent = Agent::start(c.host(1), &nodes_file, &["--net-conf", conf.to_str().context("path")?])?;
    let s = agent.status()?;
    let mac = s["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    let mac6 = s["vtep6"]["mac"].as_str().with_context(|| format!("no vtep6 in the status: {s:#}"))?.to_string();
    ensure!(mac != mac6, "the two VTEPs share a MAC ({mac}); flannel gives each its own");
    let h2 = c.host(2);
    h2.kernel_vtep(KERNEL_MAC)?;
    h2.kernel_add_peer(1, &mac)?;
    kernel_vtep6(h2, KERNEL_MAC6)?;
    kernel_add_peer6(h2, 1, &mac6)?;
    for (from, to) in [(1, 2), (2, 1)] {
        wait_reachable(&c.host(from).pod, pod_ip(to), 20)?;
        wait_reachable(&c.host(from).pod, pod_ip6(to), 20)?;
    }
    Ok(Pair { c, agent, nodes_file, conf, macs: (mac, mac6) })
}

/// `ip -6 neigh`, `bridge fdb` and `ip -6 route` of node 1's flannel-v6.1.
fn v6_entries(ns: &Netns) -> Result<(String, String, String)> {
    Ok((
        ns.run(&["ip", "-6", "neigh", "show", "dev", "flannel-v6.1", "nud", "permanent"])?,
        ns.run(&["bridge", "fdb", "show", "dev", "flannel-v6.1"])?,
        ns.run(&["ip", "-6", "route", "show", "dev", "flannel-v6.1"])?,
    ))
}

#[test]
fn dual_stack_interoperates_with_a_kernel_flannel_node_both_ways() -> Result<()> {
    let p = pair()?;
    let (h1, h2) = (p.c.host(1), p.c.host(2));
    let (p1, p2) = (&h1.pod, &h2.pod);

    // flannel's device, as flannel builds it
    let link = h1.ns.run(&["ip", "-d", "link", "show", "flannel-v6.1"])?;
    for want in [
        "vxlan id 1".to_string(),
        format!("local {}", underlay_ip6(1)),
        "dstport 8472".into(),
        "nolearning".into(),
        "mtu 1430".into(),
        "noudp6zerocsumtx noudp6zerocsumrx".into(),
        p.macs.1.clone(),
    ] {
        ensure!(link.contains(&want), "flannel-v6.1 lacks {want:?}:\n{link}");
    }
    ensure!(!link.contains("NOARP"), "flannel-v6.1 must resolve through its neighbours, as flannel's does:\n{link}");
    let addrs = h1.ns.run(&["ip", "-6", "addr", "show", "dev", "flannel-v6.1", "scope", "global"])?;
    ensure!(addrs.contains(&format!("{}/128", base6(1))), "{addrs}");
    let ra = h1.ns.run(&["sysctl", "-n", "net.ipv6.conf.flannel-v6/1.accept_ra"])?;
    ensure!(ra.trim() == "0", "accept_ra is {ra}");
    // flannel's three entries for node 2
    let (neigh, fdb, routes) = v6_entries(&h1.ns)?;
    ensure!(neigh.contains(&format!("{} lladdr {KERNEL_MAC6} PERMANENT", base6(2))), "{neigh}");
    ensure!(fdb.contains(&format!("{KERNEL_MAC6} dst {} self permanent", underlay_ip6(2))), "{fdb}");
    ensure!(routes.contains(&format!("{} via {} metric 1024 onlink", subnet6(2), base6(2))), "{routes}");

    assert_eq!(ping(p1, pod_ip6(2), 10, "0.05")?, (10, 10), "ICMPv6 edgevx -> kernel");
    assert_eq!(ping(p2, pod_ip6(1), 10, "0.05")?, (10, 10), "ICMPv6 kernel -> edgevx");
    let peer = testpeer();
    peer.tcp_transfer(p1, p2, pod_ip6(2), 64 * MIB)?;
    peer.tcp_transfer(p2, p1, pod_ip6(1), 64 * MIB)?;
    // 1200 bytes: below flannel-v6's 1430 (the pods' MTU, 1450, is the IPv4 VTEP's, as with flannel)
    assert_eq!(peer.udp_datagrams(p1, p2, pod_ip6(2), 300, 1200)?, 300, "UDP over IPv6 edgevx -> kernel");
    assert_eq!(peer.udp_datagrams(p2, p1, pod_ip6(1), 300, 1200)?, 300, "UDP over IPv6 kernel -> edgevx");
    // the IPv4 half still works beside it
    assert_eq!(ping(p1, pod_ip(2), 5, "0.05")?, (5, 5), "ICMP edgevx -> kernel");
    peer.tcp_transfer(p2, p1, pod_ip(1), 16 * MIB)?;
    // a frame the IPv6 VTEP cannot carry whole: the kernel answers "packet
    // too big" and the pod's next try fits (flannel's MTU gap, inherited)
    let big =
        p1.output(&["ping", "-6", "-c", "3", "-i", "0.3", "-s", "1402", "-M", "want", &pod_ip6(2).to_string()])?;
    let text = String::from_utf8_lossy(&big.stdout);
    ensure!(!text.contains(" 0 received"), "no 1450-byte ICMPv6 echo got through after the PTB:\n{text}");
    // the underlay really carries IPv6 VXLAN with a UDP checksum the kernel peer verified
    let snmp = h2.ns.run(&["cat", "/proc/net/snmp6"])?;
    let csum_errors = snmp.lines().find(|l| l.starts_with("Udp6InCsumErrors")).context("no Udp6InCsumErrors")?;
    ensure!(csum_errors.split_whitespace().nth(1) == Some("0"), "{csum_errors}");
    Ok(())
}

#[test]
fn dual_stack_entries_follow_the_view_and_are_repaired() -> Result<()> {
    let mut p = pair()?;
    let h1 = p.c.host(1);
    // a route deleted by hand comes back
    h1.ns.run(&["ip", "-6", "route", "del", &subnet6(2), "dev", "flannel-v6.1"])?;
    wait_until(Duration::from_secs(15), "the deleted IPv6 route restored", || {
        Ok(v6_entries(&h1.ns)?.2.contains(&subnet6(2)))
    })?;
    // a stale entry nobody wants goes
    h1.ns.run(&[
        "ip",
        "-6",
        "neigh",
        "replace",
        &base6(9),
        "lladdr",
        "02:00:00:00:09:09",
        "dev",
        "flannel-v6.1",
        "nud",
        "permanent",
    ])?;
    h1.ns.run(&["ip", "-6", "route", "replace", &subnet6(9), "via", &base6(9), "dev", "flannel-v6.1", "onlink"])?;
    h1.ns.run(&[
        "bridge",
        "fdb",
        "append",
        "02:00:00:00:09:09",
        "dev",
        "flannel-v6.1",
        "dst",
        "fd00:198:18::9",
        "self",
        "permanent",
    ])?;
    wait_until(Duration::from_secs(15), "the stale IPv6 entries removed", || {
        let (neigh, fdb, routes) = v6_entries(&h1.ns)?;
        Ok(!neigh.contains(&base6(9)) && !routes.contains(&subnet6(9)) && !fdb.contains("fd00:198:18::9"))
    })?;
    // and the wanted fdb entry stays
    ensure!(v6_entries(&h1.ns)?.1.contains(&format!("{KERNEL_MAC6} dst {}", underlay_ip6(2))));
    // node 2 leaves the view: its three entries go
    write(&p.nodes_file, &node_list(vec![flannel_node6(1, None)]))?;
    wait_until(Duration::from_secs(15), "node 2's IPv6 entries removed", || {
        let (neigh, fdb, routes) = v6_entries(&h1.ns)?;
        Ok(neigh.trim().is_empty() && !fdb.contains(" dst ") && routes.lines().all(|l| !l.contains(" via ")))
    })?;
    // and come back with it
    write(&p.nodes_file, &node_list(vec![flannel_node6(1, None), flannel_node6(2, Some((KERNEL_MAC, KERNEL_MAC6)))]))?;
    wait_reachable(&h1.pod, pod_ip6(2), 20)?;
    // a MAC changed by hand is put back (it flushes the neighbours, which come back too)
    let mac = || h1.ns.run(&["cat", "/sys/class/net/flannel-v6.1/address"]).map(|m| m.trim().to_string());
    let before = mac()?;
    h1.ns.ip(&["link", "set", "flannel-v6.1", "address", "02:66:66:66:66:06"])?;
    wait_until(Duration::from_secs(15), "the IPv6 VTEP's MAC put back", || Ok(mac()? == before))?;
    wait_reachable(&h1.pod, pod_ip6(2), 20)?;
    p.agent.stop()?;
    Ok(())
}

#[test]
fn the_ipv6_vtep_keeps_its_mac_across_a_restart_and_cleanup_removes_it() -> Result<()> {
    let mut p = pair()?;
    p.agent.stop()?;
    let h1 = p.c.host(1);
    // a reboot loses the device; the state dir keeps the MAC
    h1.ns.run(&["ip", "link", "del", "flannel-v6.1"])?;
    let conf = p.conf.to_str().context("path")?.to_string();
    let mut agent = Agent::start(h1, &p.nodes_file, &["--net-conf", &conf])?;
    let s = agent.status()?;
    assert_eq!(s["vtep6"]["mac"].as_str(), Some(p.macs.1.as_str()), "{s:#}");
    wait_reachable(&h1.pod, pod_ip6(2), 20)?;
    agent.stop()?;
    // IPv6 switched off: the IPv6 VTEP would take IPv6 VXLAN that nothing judges, so it goes
    let v4_only = p.c.dir.join("net-conf-v4.json");
    std::fs::write(&v4_only, r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#)?;
    let mut agent = Agent::start(h1, &p.nodes_file, &["--net-conf", v4_only.to_str().context("path")?])?;
    ensure!(h1.ns.ip(&["link", "show", "flannel-v6.1"]).is_err(), "flannel-v6.1 stayed with IPv6 off");
    ensure!(!h1.ns.run(&["ip6tables", "-S"])?.contains("EDGEVX"), "our ip6tables chains stayed with IPv6 off");
    ensure!(agent.status()?["vtep6"].is_null());
    wait_reachable(&h1.pod, pod_ip(2), 20)?;
    agent.stop()?;
    let out = cleanup(h1, &[])?;
    ensure!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    let links = h1.ns.run(&["ip", "link", "show"])?;
    ensure!(!links.contains("flannel-v6.1") && !links.contains("flannel.1"), "{links}");
    let rules = h1.ns.run(&["ip6tables", "-S"])?;
    ensure!(!rules.contains("EDGEVX"), "{rules}");
    Ok(())
}

#[test]
fn dual_stack_without_an_ipv6_address_on_the_underlay_names_the_fix() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf())?;
    let nodes_file = c.dir.join("nodes.json");
    write(&nodes_file, &node_list(vec![flannel_node6(1, None)]))?;
    let mut agent = Agent::spawn(
        c.host(1),
        &["--nodes-file", nodes_file.to_str().context("path")?, "--net-conf", conf.to_str().context("path")?],
    )?;
    agent.wait_log("has no usable global IPv6 address: add one, or give --public-ipv6", Duration::from_secs(20))?;
    ensure!(!agent.log_text().contains("dataplane up"), "came up without an IPv6 source");
    Ok(())
}

fn wait_until(timeout: Duration, what: &str, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if ok()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("timed out waiting for {what}")
}

/// The Kubernetes source, dual-stack: edgevx publishes both VTEPs in one
/// patch (kernel flannel peers skip a dual-stack node whole without its
/// IPv6 half), takes the IPv6 MAC back from `backend-v6-data` after a
/// reboot, and skips a peer without an IPv6 half whole, as flannel does;
/// a peer whose IPv6 half parses but is unusable (a link-local
/// `public-ipv6`, which flannel would program) keeps its IPv4 half.
#[test]
fn kube_dual_stack_publishes_both_vteps_and_skips_half_nodes_whole() -> Result<()> {
    use edgevx_tests::{agent::peers, kubeapi::KubeApi, topo::node_name};
    use serde_json::json;

    let mut c = Cluster::new(3)?;
    for i in 1..=2 {
        add_ipv6(c.host(i))?;
    }
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    let me = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(1), "annotations": {}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", subnet6(1)]},
    });
    api.put_node(me);
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf())?;
    let (kc, conf) = (kc.to_string_lossy().into_owned(), conf.to_string_lossy().into_owned());
    let args = ["--kube", "--kubeconfig", kc.as_str(), "--net-conf", conf.as_str()];
    let mut agent = Agent::start_with(c.host(1), &args)?;
    let s = agent.status()?;
    let (mac, mac6) = (s["vtep_mac"].as_str().unwrap_or_default(), s["vtep6"]["mac"].as_str().unwrap_or_default());
    let patches = api.wait_patches(Duration::from_secs(10), |p| !p.is_empty())?;
    assert_eq!(
        patches[0].body,
        json!({"metadata": {"annotations": {
            "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"),
            "flannel.alpha.coreos.com/backend-v6-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{mac6}\"}}"),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": "198.18.0.1",
            "flannel.alpha.coreos.com/public-ipv6": "fd00:198:18::1",
        }}})
    );

    // a dual-stack kernel flannel peer, and one that publishes no IPv6 half
    let h2 = c.host(2);
    h2.kernel_vtep(KERNEL_MAC)?;
    h2.kernel_add_peer(1, mac)?;
    kernel_vtep6(h2, KERNEL_MAC6)?;
    kernel_add_peer6(h2, 1, mac6)?;
    api.put_node(flannel_node6(2, Some((KERNEL_MAC, KERNEL_MAC6))));
    api.put_node(edgevx_tests::nodes::flannel_node(3, Some("02:00:00:00:03:01")));
    let mut node4 = flannel_node6(4, Some(("02:00:00:00:04:01", "02:00:00:00:04:06")));
    node4["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ipv6"] = json!("fe80::4");
    api.put_node(node4);
    wait_status(&agent, Duration::from_secs(5), "node2 and node4 added", |s| {
        let mut p = peers(s);
        p.sort();
        p == vec![("node2".into(), KERNEL_MAC.into()), ("node4".into(), "02:00:00:00:04:01".into())]
    })?;
    wait_reachable(&c.host(1).pod, pod_ip6(2), 20)?;
    wait_reachable(&c.host(2).pod, pod_ip6(1), 20)?;
    let log = agent.log_text();
    ensure!(
        log.lines().any(|l| l.contains("node3") && l.contains("no flannel.alpha.coreos.com/public-ipv6 annotation")),
        "node3's rejection is not logged with its reason:\n{log}"
    );
    ensure!(!c.host(1).ns.run(&["ip", "route"])?.contains("10.244.3.0/24"), "node3's IPv4 half was programmed");
    ensure!(
        log.lines().any(|l| l.contains("node4") && l.contains("IPv4 half kept") && l.contains("link-local")),
        "node4's dropped IPv6 half is not logged with its reason:\n{log}"
    );
    let v6_entries = c.host(1).ns.run(&["bridge", "fdb", "show", "dev", "flannel-v6.1"])?;
    ensure!(!v6_entries.contains("02:00:00:00:04:06"), "node4's unusable IPv6 half was programmed:\n{v6_entries}");

    // a reboot: the device and the state dir's IPv6 MAC are gone, the annotation brings it back
    agent.stop()?;
    c.host(1).ns.run(&["ip", "link", "del", "flannel-v6.1"])?;
    std::fs::remove_file(c.host(1).state_dir().join("vtep-mac6"))?;
    let before = api.patches().len();
    let agent = Agent::start_with(c.host(1), &args)?;
    assert_eq!(agent.status()?["vtep6"]["mac"], mac6, "IPv6 MAC not restored from backend-v6-data");
    wait_reachable(&c.host(2).pod, pod_ip6(1), 20)?;
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(api.patches().len(), before, "patched although nothing changed: {:#?}", &api.patches()[before..]);
    Ok(())
}

/// What the agent programs on its own: with the pair up, an attacker on
/// the switch sends IPv6 VXLAN to node 1 as a stranger, and as node 2
/// (whose address it also holds) with a forged and then a good inner
/// source. Only the last reaches `flannel-v6.1`.
#[test]
fn only_ipv6_peers_get_in_and_only_with_their_own_pod_sources() -> Result<()> {
    let p = pair()?;
    let h1 = p.c.host(1);
    let attacker = Netns::new(&format!("{}atk", p.c.tag))?;
    p.c.plug(&attacker, "swatk")?;
    attacker.ip(&["link", "set", "eth0", "up"])?;
    let stranger = "fd00:198:18::66";
    for a in [stranger.to_string(), underlay_ip6(2).to_string()] {
        attacker.ip(&["-6", "addr", "add", &format!("{a}/64"), "dev", "eth0", "nodad"])?;
    }
    let rx = || flannel_v6_rx(&h1.ns);
    let counter = |name: &str| -> Result<u64> {
        p.agent.status()?["counters"][name].as_u64().with_context(|| format!("no counter {name}"))
    };
    let node1 = underlay_ip6(1).to_string();
    let send = |src: &str, inner_src: &str| {
        attacker.run(&["python3", "-c", crate::underlay_v6::SEND, src, &node1, &p.macs.1, "eth0", inner_src])
    };
    let inside = "fd00:10:244:2::9"; // in node 2's IPv6 pod subnet
    for (what, src, inner, counter_name) in [
        ("a stranger", stranger, inside, "drop_unknown_peer"),
        ("node 2 with a client's inner source", &underlay_ip6(2).to_string()[..], "2001:db8::7", "drop_spoofed_source"),
    ] {
        let (before, rx_before) = (counter(counter_name)?, rx()?);
        send(src, inner)?;
        wait_until(Duration::from_secs(5), &format!("{what}: {counter_name} counted"), || {
            Ok(counter(counter_name)? > before)
        })?;
        assert_eq!(rx()?, rx_before, "{what}: flannel-v6.1 received it");
    }
    let rx_before = rx()?;
    send(&underlay_ip6(2).to_string(), inside)?;
    wait_until(Duration::from_secs(5), "node 2's own frame reaching flannel-v6.1", || Ok(rx()? > rx_before))?;
    Ok(())
}

/// A pod cannot send IPv6 VXLAN, to a peer or to its own node, bare or
/// behind an extension header: dropped on the pod bridge's ingress.
#[test]
fn a_pod_cannot_send_ipv6_vxlan() -> Result<()> {
    let p = pair()?;
    let (h1, h2) = (p.c.host(1), p.c.host(2));
    let counter = |name: &str| -> Result<u64> {
        p.agent.status()?["counters"][name].as_u64().with_context(|| format!("no counter {name}"))
    };
    let rx2 = || -> Result<u64> {
        let v = h2.ns.run(&["cat", "/sys/class/net/flannel-v6.1/statistics/rx_packets"])?;
        v.trim().parse().context("rx_packets")
    };
    let pod = pod_ip6(1).to_string();
    for (what, dst, ext) in [
        ("to the peer", underlay_ip6(2).to_string(), ""),
        ("to its own node", underlay_ip6(1).to_string(), ""),
        ("to the peer behind destination options", underlay_ip6(2).to_string(), "dstopts"),
    ] {
        let (before, rx_before) = (counter("drop_pod_vxlan")?, rx2()?);
        let mut args = vec!["python3", "-c", crate::underlay_v6::SEND, &pod, &dst, KERNEL_MAC6, "eth0", &pod];
        if !ext.is_empty() {
            args.push(ext);
        }
        h1.pod.run(&args)?;
        wait_until(Duration::from_secs(5), &format!("{what}: drop_pod_vxlan counted"), || {
            Ok(counter("drop_pod_vxlan")? > before)
        })?;
        assert_eq!(rx2()?, rx_before, "{what}: node 2's flannel-v6.1 received it");
    }
    Ok(())
}

/// IPv6 multicast reaches a bound socket without a socket lookup, so the
/// guard never sees it; off the underlay decap does not either. A
/// stranger's IPv6 VXLAN to ff02::1 on a second interface is dropped by
/// EDGEVX-INPUT's ip6tables twin, bare and behind an extension header, with
/// an operator's accept rules in front of it.
#[test]
fn ipv6_multicast_vxlan_on_a_second_interface_is_dropped_by_the_firewall() -> Result<()> {
    let p = pair()?;
    let h1 = p.c.host(1);
    let attacker = on_a_second_interface(&p, "atm")?;
    let rx = || flannel_v6_rx(&h1.ns);
    // the packets ip6tables' EDGEVX-INPUT dropped
    let dropped = || -> Result<u64> {
        let out = h1.ns.run(&["ip6tables", "-L", "EDGEVX-INPUT", "-v", "-x", "-n"])?;
        let line = out.lines().find(|l| l.contains("DROP")).with_context(|| format!("no DROP rule:\n{out}"))?;
        line.split_whitespace().next().context("no count")?.parse().context("count")
    };
    // with an operator's accept rules in front (put behind ours within a resync)
    operator::accept_vxlan_first(&h1.ns, "ip6tables")?;
    operator::wait_jump_first(&h1.ns, "ip6tables")?;
    for ext in ["", "dstopts"] {
        let (before, rx_before) = (dropped()?, rx()?);
        let mut args = vec![
            "python3",
            "-c",
            crate::underlay_v6::SEND,
            "fd00:198:19::66",
            "ff02::1%eth0",
            &p.macs.1,
            "eth0",
            "fd00:10:244:2::9",
        ];
        if !ext.is_empty() {
            args.push(ext);
        }
        attacker.run(&args)?;
        wait_until(Duration::from_secs(5), "the multicast VXLAN dropped by ip6tables", || Ok(dropped()? > before))?;
        assert_eq!(rx()?, rx_before, "{ext:?}: flannel-v6.1 received it");
    }
    Ok(())
}

/// An attacker on a second interface of node 1 (`eth1`, fd00:198:19::1),
/// its own end `eth0` holding fd00:198:19::66.
fn on_a_second_interface(p: &Pair, tag: &str) -> Result<Netns> {
    let h1 = p.c.host(1);
    let attacker = Netns::new(&format!("{}{tag}", p.c.tag))?;
    h1.ns.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", &attacker.name])?;
    h1.ns.ip(&["-6", "addr", "add", "fd00:198:19::1/64", "dev", "eth1", "nodad"])?;
    h1.ns.ip(&["link", "set", "eth1", "up"])?;
    attacker.ip(&["-6", "addr", "add", "fd00:198:19::66/64", "dev", "eth0", "nodad"])?;
    attacker.ip(&["link", "set", "eth0", "up"])?;
    Ok(attacker)
}

/// Frames node 1's `flannel-v6.1` received.
fn flannel_v6_rx(node1: &Netns) -> Result<u64> {
    let v = node1.run(&["cat", "/sys/class/net/flannel-v6.1/statistics/rx_packets"])?;
    v.trim().parse().context("rx_packets")
}

/// A peer's IPv6 VXLAN arriving anywhere but on the underlay is refused
/// whole, as the IPv4 injection test shows for IPv4: by the socket-lookup
/// guard (`drop_vxlan_off_underlay`), or before Linux 5.17, where the
/// guard cannot read `ingress_ifindex`, by the rule at the end of
/// ip6tables' `EDGEVX-INPUT` that drops VXLAN off the underlay.
#[test]
fn a_peers_ipv6_vxlan_on_a_second_interface_is_refused() -> Result<()> {
    let p = pair()?;
    let h1 = p.c.host(1);
    let attacker = on_a_second_interface(&p, "ats")?;
    // the attacker sends as node 2, whose address it holds too
    let peer = underlay_ip6(2).to_string();
    attacker.ip(&["-6", "addr", "add", &format!("{peer}/128"), "dev", "eth0", "nodad"])?;
    let refused = || -> Result<u64> {
        if crate::features::full_guard() {
            let name = "drop_vxlan_off_underlay";
            return p.agent.status()?["counters"][name].as_u64().with_context(|| format!("no counter {name}"));
        }
        let out = h1.ns.run(&["ip6tables", "-L", "EDGEVX-INPUT", "-v", "-x", "-n"])?;
        let line = out.lines().find(|l| l.contains("!eth0")).with_context(|| format!("no rule for !eth0:\n{out}"))?;
        line.split_whitespace().next().context("no count")?.parse().context("count")
    };
    let (before, rx_before) = (refused()?, flannel_v6_rx(&h1.ns)?);
    let inside = "fd00:10:244:2::9"; // in node 2's IPv6 pod subnet: judged as good on the underlay
    attacker.run(&["python3", "-c", crate::underlay_v6::SEND, &peer, "fd00:198:19::1", &p.macs.1, "eth0", inside])?;
    wait_until(Duration::from_secs(5), "node 2's IPv6 VXLAN off the underlay refused", || Ok(refused()? > before))?;
    assert_eq!(refused()?, before + 1, "counted once");
    assert_eq!(flannel_v6_rx(&h1.ns)?, rx_before, "flannel-v6.1 received it");
    Ok(())
}
