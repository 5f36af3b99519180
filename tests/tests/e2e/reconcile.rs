//! The kernel is the truth: edits that swap, rename or shift nodes in one
//! go keep every pod reachable, drift made by hand is repaired, one agent
//! per node, and a view equal to the last one does nothing.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, LpmTrie, Map, MapData, lpm_trie::Key};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, pod_ip, underlay_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::KERNEL_MAC;

const P: &str = "flannel.alpha.coreos.com";

fn named(mut node: Value, name: &str) -> Value {
    node["metadata"]["name"] = json!(name);
    node
}

fn with_public_ip(mut node: Value, ip: &str) -> Value {
    node["metadata"]["annotations"][format!("{P}/public-ip")] = json!(ip);
    node
}

/// Pod 1 reaches every listed pod, and each of them reaches pod 1 back
/// (both directions: encap with the LPM entry, decap with the accept list).
fn all_reachable(c: &Cluster, pods: &[u8]) -> Result<()> {
    for &j in pods {
        wait_reachable(&c.host(1).pod, pod_ip(j), 10).with_context(|| format!("pod1 -> pod{j}"))?;
        let (sent, got) = ping(&c.host(j).pod, pod_ip(1), 3, "0.05")?;
        if got != sent {
            bail!("pod{j} -> pod1: {got}/{sent}");
        }
    }
    Ok(())
}

/// A kernel flannel node `i` that moves to underlay address `ip`: its NIC
/// address and its `flannel.1` source change, as after a DHCP renumbering.
fn renumber_kernel_node(h: &Host, ip: &str, agent_mac: &str) -> Result<()> {
    h.ns.ip(&["addr", "flush", "dev", "eth0"])?;
    h.ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
    h.ns.ip(&["link", "del", "flannel.1"])?;
    h.kernel_vtep_at(KERNEL_MAC, ip)?;
    h.kernel_add_peer(1, agent_mac)
}

fn start(c: &mut Cluster, nodes: &Path, kernel: &[u8]) -> Result<(Agent, String)> {
    c.host_mut(1).mount_bpffs()?;
    let mut list = vec![flannel_node(1, None)];
    list.extend(kernel.iter().map(|&i| flannel_node(i, Some(KERNEL_MAC))));
    write(nodes, &node_list(list))?;
    let agent = Agent::start(c.host(1), nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    for &i in kernel {
        c.host(i).kernel_vtep(KERNEL_MAC)?;
        c.host(i).kernel_add_peer(1, &mac)?;
    }
    Ok((agent, mac))
}

fn all_in_dataplane(s: &Value, n: usize) -> bool {
    let list = s["peers"].as_array().cloned().unwrap_or_default();
    list.len() == n && list.iter().all(|p| p["in_dataplane"] == json!(true))
}

#[test]
fn swaps_renames_and_chain_shifts_keep_every_pod_reachable() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let nodes = c.dir.join("nodes.json");
    let (agent, mac) = start(&mut c, &nodes, &[2, 3])?;
    wait_status(&agent, Duration::from_secs(5), "two peers", |s| all_in_dataplane(s, 2))?;
    all_reachable(&c, &[2, 3])?;

    // 1. node2 and node3 swap names in one edit: every pod stays where it was
    let n2 = flannel_node(2, Some(KERNEL_MAC));
    let n3 = flannel_node(3, Some(KERNEL_MAC));
    write(&nodes, &node_list(vec![flannel_node(1, None), named(n2.clone(), "node3"), named(n3.clone(), "node2")]))?;
    wait_status(&agent, Duration::from_secs(5), "names swapped", |s| {
        all_in_dataplane(s, 2) && peers(s).iter().any(|(n, _)| n == "node3")
    })?;
    all_reachable(&c, &[2, 3])?;

    // 2. node3 deleted and re-added as node9 with the same subnet, in one edit
    write(&nodes, &node_list(vec![flannel_node(1, None), n2.clone(), named(n3.clone(), "node9")]))?;
    wait_status(&agent, Duration::from_secs(5), "node3 renamed node9", |s| {
        all_in_dataplane(s, 2) && peers(s).iter().any(|(n, _)| n == "node9")
    })?;
    all_reachable(&c, &[2, 3])?;

    // 3. public IPs shift along a chain: node3 .3 -> .4, then node2 .2 -> .3
    let ip3 = "198.18.0.4";
    let ip2 = underlay_ip(3).to_string();
    renumber_kernel_node(c.host(3), ip3, &mac)?;
    renumber_kernel_node(c.host(2), &ip2, &mac)?;
    write(
        &nodes,
        &node_list(vec![flannel_node(1, None), with_public_ip(n2, &ip2), with_public_ip(named(n3, "node9"), ip3)]),
    )?;
    wait_status(&agent, Duration::from_secs(5), "chain shift", |s| {
        all_in_dataplane(s, 2) && s["peers"].as_array().is_some_and(|l| l.iter().any(|p| p["public_ip"] == ip3))
    })?;
    all_reachable(&c, &[2, 3])?;
    // the kernel holds one route for the Network, whatever the peers
    let routes = c.host(1).ns.ip(&["route", "show", "dev", "flannel.1"])?;
    assert_eq!(routes.lines().count(), 1, "{routes}");
    assert!(routes.contains("10.244.0.0/16 via 169.254.1.1"), "{routes}");
    Ok(())
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what}: not within {timeout:?}")
}

#[test]
fn drift_made_by_hand_is_repaired() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    let (agent, _) = start(&mut c, &nodes, &[2])?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| all_in_dataplane(s, 1))?;
    all_reachable(&c, &[2])?;
    let h1 = c.host(1);
    let route = || h1.ns.ip(&["route", "show", "dev", "flannel.1"]);
    // the resync period is 10 s; route events usually make it sooner
    let within = Duration::from_secs(12);

    h1.ns.ip(&["route", "del", "10.244.0.0/16", "dev", "flannel.1"])?;
    wait_until("deleted route restored", within, || Ok(route()?.contains("10.244.0.0/16 via 169.254.1.1")))?;

    h1.ns.ip(&["route", "replace", "10.244.0.0/16", "dev", "flannel.1"])?;
    wait_until("changed route restored", within, || Ok(route()?.contains("10.244.0.0/16 via 169.254.1.1")))?;

    // a stray per-peer route (flanneld's style) through the VTEP is removed
    h1.ns.ip(&["route", "add", "10.244.7.0/24", "via", "10.244.7.0", "dev", "flannel.1", "onlink"])?;
    wait_until("stray route removed", within, || Ok(!route()?.contains("10.244.7.0/24")))?;

    // map entries deleted under the agent: the LPM entry and the accepted address
    let lpm_pin = h1.map_pin(edgevx_common::maps::PEER_SUBNETS)?;
    let mut lpm: LpmTrie<MapData, [u8; 4], edgevx_common::maps::Peer> =
        LpmTrie::try_from(Map::LpmTrie(MapData::from_pin(&lpm_pin)?))?;
    lpm.remove(&Key::new(24, [10, 244, 2, 0]))?;
    let accept_pin = h1.map_pin(edgevx_common::maps::PEER_ACCEPT)?;
    let mut accept: HashMap<MapData, [u8; 4], edgevx_common::maps::PeerAccept> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&accept_pin)?))?;
    accept.remove(&underlay_ip(2).octets())?;
    wait_until("map entries restored", within, || {
        Ok(lpm.get(&Key::new(24, [10, 244, 2, 0]), 0).is_ok() && accept.get(&underlay_ip(2).octets(), 0).is_ok())
    })?;
    all_reachable(&c, &[2])?;
    Ok(())
}

/// One agent per node, whatever its flags: a second one, on the same state
/// dir or on directories of its own (another state dir, bpffs and
/// subnet.env), exits 2 naming the first before it touches anything; the
/// VTEP keeps its MAC and every peer stays reachable.
#[test]
fn a_second_agent_on_the_node_exits_2_whatever_its_directories_and_changes_nothing() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    let (agent, _) = start(&mut c, &nodes, &[2])?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| all_in_dataplane(s, 1))?;
    // the second one is fed a view without node2
    let other = c.dir.join("other.json");
    write(&other, &node_list(vec![flannel_node(1, None)]))?;
    let pid = agent.pid().context("pid")?;
    let h = c.host(1);
    let mac = || h.ns.run(&["cat", "/sys/class/net/flannel.1/address"]);
    let before = mac()?;
    let own_bpffs = edgevx_tests::topo::Bpffs::mount(&c.dir.join("bpffs-b"))?;
    let dirs = [
        (h.state_dir(), h.bpffs_dir(), h.subnet_file()),
        (c.dir.join("state-b"), own_bpffs.path.clone(), c.dir.join("subnet-b.env")),
    ];
    for (state, bpffs, subnet) in dirs {
        let out =
            h.ns.cmd(&edgevx_tests::edgevx_bin().to_string_lossy())
                .args(["run", "--node-name", "node1", "--iface", "eth0", "--nodes-file"])
                .arg(&other)
                .arg("--state-dir")
                .arg(&state)
                .arg("--bpffs")
                .arg(&bpffs)
                .arg("--subnet-file")
                .arg(&subnet)
                .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", state.display());
        assert!(err.contains(&format!("edgevx pid {pid}")) && err.contains("still running"), "{err}");
        assert!(!subnet.exists() || subnet == h.subnet_file(), "{}: it wrote {}", state.display(), subnet.display());
        assert!(!state.join("vtep-mac").exists() || state == h.state_dir(), "it chose a MAC in {}", state.display());
    }
    assert_eq!(mac()?, before, "the VTEP's MAC changed");
    let s = agent.status()?;
    assert!(all_in_dataplane(&s, 1), "{s}");
    all_reachable(&c, &[2])?;
    Ok(())
}

/// A VTEP MAC changed by hand is put back: peers hold the old one in their
/// arp and fdb entries, and cut off from the cloud they cannot learn another.
#[test]
fn a_vtep_mac_changed_by_hand_is_put_back() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    let (mut agent, _) = start(&mut c, &nodes, &[2])?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| all_in_dataplane(s, 1))?;
    let h = c.host(1);
    let mac = || h.ns.run(&["cat", "/sys/class/net/flannel.1/address"]).map(|m| m.trim().to_string());
    let before = mac()?;
    h.ns.ip(&["link", "set", "flannel.1", "address", "02:66:66:66:66:66"])?;
    wait_until("the MAC put back", edgevx_tests::patience(Duration::from_secs(5)), || Ok(mac()? == before))?;
    agent.wait_log("put back the one peers know", Duration::from_secs(5))?;
    all_reachable(&c, &[2])?;
    Ok(())
}

#[test]
fn identical_views_write_nothing_and_warn_once() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    let mut bad = flannel_node(5, None);
    bad["metadata"]["annotations"][format!("{P}/backend-data")] = json!("{{{");
    c.host_mut(1).mount_bpffs()?;
    let list = node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC)), bad]);
    write(&nodes, &list)?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| all_in_dataplane(s, 1))?;
    let files = ["peers.json", "agent.json"];
    let mtimes = |dir: &Path| -> Vec<Option<std::time::SystemTime>> {
        files.iter().map(|f| std::fs::metadata(dir.join(f)).and_then(|m| m.modified()).ok()).collect()
    };
    let before = mtimes(&c.host(1).state_dir());
    let warnings = |a: &Agent| a.log_text().matches("skipping malformed node").count();
    assert_eq!(warnings(&agent), 1);
    // 20 rewrites of the same content (as a source re-sending heartbeats would)
    for _ in 0..20 {
        write(&nodes, &list)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(mtimes(&c.host(1).state_dir()), before, "a state file was rewritten");
    assert_eq!(warnings(&agent), 1, "the malformed node was warned about again");
    assert_eq!(agent.log_text().matches("peer entries written").count(), 1, "{}", agent.log_text());
    Ok(())
}

#[test]
fn ten_thousand_peers_from_a_nodes_file_are_programmed_with_one_route() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, edgevx_tests::nodes::WIDE_NET_CONF)?;
    let nodes = c.dir.join("nodes.json");
    let mut list = vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))];
    list.extend(edgevx_tests::nodes::synthetic_peers(10_000, 0));
    write(&nodes, &node_list(list))?;
    let agent = Agent::start(c.host(1), &nodes, &["--net-conf", conf.to_str().context("path")?])?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    // generous: scale figures are the bench's business, not a test's
    wait_status(&agent, Duration::from_secs(60), "10,001 peers", |s| all_in_dataplane(s, 10_001))?;
    all_reachable(&c, &[2])?;
    let ns = &c.host(1).ns;
    assert_eq!(ns.ip(&["route", "show", "dev", "flannel.1"])?.lines().count(), 1);
    assert_eq!(ns.ip(&["neigh", "show", "dev", "flannel.1"])?.lines().filter(|l| l.contains("PERMANENT")).count(), 0);
    assert_eq!(
        ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?.lines().filter(|l| l.contains("dst")).count(),
        0
    );
    Ok(())
}

/// The underlay changes under traffic. Its MTU is followed in place; a new
/// address or a re-created NIC makes the agent exit non-zero at once (it
/// never keeps running on a stale underlay), the dataplane stays in place
/// meanwhile, and the agent its supervisor starts again follows the new
/// underlay.
#[test]
fn underlay_changes_are_followed_in_place_or_by_a_restart() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    let (mut agent, mac) = start(&mut c, &nodes, &[2])?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| all_in_dataplane(s, 1))?;
    all_reachable(&c, &[2])?;
    let h1 = c.host(1);
    let restart = |what: &str, agent: &mut Agent| -> Result<Agent> {
        let code = agent.wait_exit(Duration::from_secs(5)).with_context(|| what.to_string())?;
        assert_eq!(code, Some(1), "{what}: {}", agent.log_text());
        assert!(agent.log_text().contains("the underlay eth0 changed"), "{what}: {}", agent.log_text());
        Agent::start(h1, &nodes, &[])
    };

    // 1. the MTU is lowered: the VTEP follows (underlay - 50) in place, no restart
    h1.ns.ip(&["link", "set", "eth0", "mtu", "1400"])?;
    wait_status(&agent, Duration::from_secs(5), "VTEP MTU 1350", |s| s["mtu"] == json!(1350))?;
    assert!(h1.ns.ip(&["link", "show", "flannel.1"])?.contains("mtu 1350"));
    all_reachable(&c, &[2])?;
    assert!(!agent.log_text().contains("the underlay eth0 changed"), "{}", agent.log_text());

    // 2. the address is renumbered: the outer source and the peers' view follow
    h1.ns.ip(&["addr", "flush", "dev", "eth0"])?;
    h1.ns.ip(&["addr", "add", "198.18.0.11/24", "dev", "eth0"])?;
    agent = restart("address renumbered", &mut agent)?;
    wait_status(&agent, Duration::from_secs(5), "new public IP", |s| s["public_ip"] == json!("198.18.0.11"))?;
    // node2 learns the new address as flanneld would
    c.host(2).ns.run(&[
        "bridge",
        "fdb",
        "replace",
        &mac,
        "dev",
        "flannel.1",
        "dst",
        "198.18.0.11",
        "self",
        "permanent",
    ])?;
    all_reachable(&c, &[2])?;

    // 3. the NIC is re-created (a driver reload, a USB NIC replugged)
    h1.ns.ip(&["link", "del", "eth0"])?;
    c.plug(&h1.ns, "sw1b")?;
    h1.ns.ip(&["addr", "add", "198.18.0.11/24", "dev", "eth0"])?;
    h1.ns.ip(&["link", "set", "eth0", "up"])?;
    agent = restart("NIC re-created", &mut agent)?;
    wait_status(&agent, Duration::from_secs(5), "peer programmed", |s| all_in_dataplane(s, 1))?;
    all_reachable(&c, &[2])?;
    drop(agent);
    Ok(())
}

/// etcd's `Backend.MTU` sizes the VTEP (less the VXLAN overhead, as
/// flanneld does) and goes to subnet.env.
#[test]
fn an_etcd_backend_mtu_sizes_the_vtep() -> Result<()> {
    use edgevx_tests::etcd::{ENDPOINT, Etcd, PREFIX};
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","MTU":1400}}"#)?;
    let _agent = Agent::start_with(c.host(1), &["--etcd-endpoints", ENDPOINT])?;
    let h = c.host(1);
    assert!(h.ns.ip(&["link", "show", "flannel.1"])?.contains("mtu 1350"));
    let env = std::fs::read_to_string(h.subnet_file())?;
    assert!(env.contains("FLANNEL_MTU=1350"), "{env}");
    Ok(())
}

/// No peer may claim an address of this node as its public IP (issue 18,
/// item 8): VXLAN "from" it would be accepted from whoever spoofs this
/// node. The underlay's broadcast address is refused from the start; an
/// address added to `lo` while the agent runs takes the peer that claimed
/// it out at the next resync (the kernel is the truth), with the reason.
#[test]
fn a_peer_claiming_an_address_of_this_node_is_left_out() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    let brd = with_public_ip(named(flannel_node(7, Some("02:00:00:00:00:07")), "claims-brd"), "198.18.0.255");
    let lo = with_public_ip(named(flannel_node(8, Some("02:00:00:00:00:08")), "claims-lo"), "198.51.100.7");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC)), brd, lo]))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let names = |s: &Value| -> Vec<String> {
        let list = s["peers"].as_array().cloned().unwrap_or_default();
        let mut n: Vec<String> = list.iter().map(|p| p["node"].as_str().unwrap_or_default().to_string()).collect();
        n.sort();
        n
    };
    let s = wait_status(&agent, Duration::from_secs(10), "node2 and claims-lo", |s| all_in_dataplane(s, 2))?;
    assert_eq!(names(&s), ["claims-lo", "node2"]);
    let log = agent.log_text();
    let said = "public IP 198.18.0.255 is this node's own (the broadcast address of eth0)";
    assert!(log.contains(said), "{said:?} not in:\n{log}");

    // the address appears on the node: the claim is refused at the next resync
    c.host(1).ns.ip(&["addr", "add", "198.51.100.7/32", "dev", "lo"])?;
    let s = wait_status(&agent, Duration::from_secs(25), "claims-lo left out", |s| all_in_dataplane(s, 1))?;
    assert_eq!(names(&s), ["node2"]);
    let said = "public IP 198.51.100.7 is this node's own (on lo)";
    assert!(agent.log_text().contains(said), "{said:?} not in:\n{}", agent.log_text());
    let accept: HashMap<MapData, [u8; 4], edgevx_common::maps::PeerAccept> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(c.host(1).map_pin(edgevx_common::maps::PEER_ACCEPT)?)?))?;
    for ip in [[198, 18, 0, 255], [198, 51, 100, 7]] {
        assert!(accept.get(&ip, 0).is_err(), "VXLAN from {ip:?} is accepted");
    }
    assert!(accept.get(&underlay_ip(2).octets(), 0).is_ok(), "node2 is not accepted");
    Ok(())
}
