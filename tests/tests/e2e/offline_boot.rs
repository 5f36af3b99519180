//! An edge node that boots with no default route (its WAN, LTE or VPN not
//! up yet), run as kube-flannel.yml runs flanneld: no interface flag, so the
//! underlay would come from the default route.
//! - After an earlier bring-up, the interface that carries the recorded
//!   public IP is taken, and the node forwards from its cached view with its
//!   MAC; a default route that appears later (through another interface)
//!   changes nothing.
//! - A brand-new node waits, `/readyz` 503 saying why, and comes up by
//!   itself once a default route appears.
use std::time::Duration;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    etcd::{Etcd, PREFIX},
    sh,
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
};

use crate::{
    KERNEL_MAC,
    etcd::{CONFIG, etcd_args, lease, previous_subnet},
    metrics,
};

/// The log line of rule 5 (interface selection after a restart).
const TAKEN_FROM_RECORD: &str =
    "no default route: taking the interface that carries the public IP of the last bring-up";

/// A second uplink on node 1 (`wan1`, 198.19.0.1/24 on the switch), which
/// the default route takes once it "comes up".
fn second_uplink(c: &Cluster) -> Result<()> {
    let (ns, sw) = (c.host(1).ns.name.clone(), c.switch.name.clone());
    sh(&["ip", "link", "add", "wan1", "netns", &ns, "type", "veth", "peer", "name", "sw1w", "netns", &sw])?;
    c.switch.ip(&["link", "set", "sw1w", "master", "br0", "up"])?;
    let n = &c.host(1).ns;
    n.ip(&["addr", "add", "198.19.0.1/24", "dev", "wan1"])?;
    n.ip(&["link", "set", "wan1", "up"])?;
    Ok(())
}

/// Node 1 with its bpffs, node 2 a kernel flannel node whose lease is in
/// etcd; the etcd must live as long as the test.
fn etcd_and_a_kernel_peer() -> Result<(Cluster, Etcd)> {
    let mut c = Cluster::new(2)?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    etcd.put(&format!("{PREFIX}/subnets/10.244.2.0-24"), &lease("198.18.0.2", KERNEL_MAC))?;
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host_mut(1).mount_bpffs()?;
    Ok((c, etcd))
}

#[test]
fn an_offline_boot_without_a_default_route_forwards_on_the_recorded_underlay() -> Result<()> {
    let (mut c, _etcd) = etcd_and_a_kernel_peer()?;
    previous_subnet(c.host(1))?;
    // the first boot: online, the underlay from the default route
    c.host(1).ns.ip(&["route", "add", "default", "via", "198.18.0.254", "dev", "eth0"])?;
    let mut agent = Agent::spawn_choosing_iface(c.host(1), &etcd_args(&[]))?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let first = agent.status()?;
    assert_eq!(first["iface"], "eth0", "{first}");
    let mac = first["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_status(&agent, Duration::from_secs(5), "one peer", |s| peers(s).len() == 1)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    drop(agent);

    // power loss; the node boots with its WAN down: no default route, etcd unreachable
    c.reboot(1)?;
    c.host_mut(1).mount_bpffs()?;
    second_uplink(&c)?;
    c.host(1).ns.run(&["nft", "add", "table", "inet", "wan"])?;
    c.host(1).ns.run(&["nft", "add", "chain", "inet", "wan", "out", "{ type filter hook output priority 0; }"])?;
    c.host(1).ns.run(&["nft", "add", "rule", "inet", "wan", "out", "tcp", "dport", "2379", "drop"])?;
    assert!(!c.host(1).ns.ip(&["route"])?.contains("default"), "the rebooted node has a default route");
    let mut agent = Agent::spawn_choosing_iface(c.host(1), &etcd_args(&[]))?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let log = agent.log_text();
    assert!(log.contains(TAKEN_FROM_RECORD) && log.contains("restoring the dataplane from the cached view"), "{log}");
    let s = agent.status()?;
    assert_eq!((s["iface"].as_str(), s["vtep_mac"].as_str()), (Some("eth0"), Some(mac.as_str())), "{s}");
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    metrics::wait_status(&c.host(1).ns, "/readyz", 200)?;

    // the WAN comes up on the other uplink: the agent stays where it is
    let pid = agent.pid();
    c.host(1).ns.ip(&["route", "add", "default", "via", "198.19.0.254", "dev", "wan1"])?;
    c.host(1).ns.run(&["nft", "delete", "table", "inet", "wan"])?;
    // past a resync (10 s), which re-checks the underlay
    std::thread::sleep(Duration::from_secs(12));
    let s = agent.status()?;
    assert_eq!(agent.pid(), pid, "the agent restarted");
    assert_eq!((s["iface"].as_str(), s["vtep_mac"].as_str()), (Some("eth0"), Some(mac.as_str())), "{s}");
    assert!(c.host(1).ns.ip(&["-d", "link", "show", "flannel.1"])?.contains("dev eth0 "), "flannel.1 moved");
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    Ok(())
}

#[test]
fn a_new_node_without_a_default_route_waits_and_comes_up_when_one_appears() -> Result<()> {
    let (c, _etcd) = etcd_and_a_kernel_peer()?;
    // systemd's notify socket, as a Type=notify unit gets it
    let socket_path = c.dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path)?;
    socket.set_read_timeout(Some(Duration::from_secs(60)))?;
    let notify_env = format!("NOTIFY_SOCKET={}", socket_path.display());
    let mut agent = Agent::spawn_choosing_iface_via(c.host(1), &["env", &notify_env], &etcd_args(&[]))?;
    let waiting =
        "not ready to bring up the dataplane: no --iface, --iface-regex or --iface-can-reach, no IPv4 default route";
    agent.wait_log(waiting, Duration::from_secs(20))?;
    let r = metrics::wait_status(&c.host(1).ns, "/readyz", 503)?;
    assert!(r.body.contains("waiting for the host: no --iface"), "{}", r.body);
    assert_eq!(metrics::get(&c.host(1).ns, "/healthz")?.status, 200, "a waiting agent is alive");
    // said again while it waits, not once and then silence
    until_count(&agent, waiting, 2)?;
    assert!(c.host(1).ns.ip(&["link", "show", "flannel.1"]).is_err(), "a device was created while waiting");
    assert!(!c.host(1).subnet_file().exists(), "subnet.env was written while waiting");
    let first = notification(&socket)?;
    assert!(first.contains("STATUS=waiting for the host: no --iface") && !first.contains("READY=1"), "{first:?}");

    c.host(1).ns.ip(&["route", "add", "default", "via", "198.18.0.254", "dev", "eth0"])?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    assert!(agent.log_text().contains("the host has what the agent waited for"), "{}", agent.log_text());
    assert!(!agent.log_text().contains(TAKEN_FROM_RECORD), "a new node has no record");
    let s = agent.status()?;
    assert_eq!(s["iface"], "eth0", "{s}");
    let mac = s["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    metrics::wait_status(&c.host(1).ns, "/readyz", 200)?;
    // READY=1 once it forwards, after however many waiting statuses
    let ready = loop {
        let n = notification(&socket)?;
        if !n.starts_with("STATUS=waiting") {
            break n;
        }
    };
    assert!(ready.contains("READY=1") && ready.contains("STATUS=forwarding"), "{ready:?}");
    Ok(())
}

/// The next message on systemd's notify socket.
fn notification(socket: &std::os::unix::net::UnixDatagram) -> Result<String> {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).context("no notification from the agent")?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Waits until the agent's log holds `needle` at least `n` times.
fn until_count(agent: &Agent, needle: &str, n: usize) -> Result<()> {
    let deadline = std::time::Instant::now() + edgevx_tests::patience(Duration::from_secs(20));
    while agent.log_text().matches(needle).count() < n {
        anyhow::ensure!(std::time::Instant::now() < deadline, "{needle:?} not logged {n} times:\n{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}
