//! The etcd source against a real etcd: flannel's layout, allocation,
//! renewal, reservations for external VTEPs, an etcd restart, and the
//! dual-stack lease (one key for both families).
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    edgevx_bin,
    etcd::{ENDPOINT, Etcd, PREFIX},
    topo::{Cluster, Host, pod_ip},
    traffic::{BackgroundPing, ping, wait_reachable},
};
use serde_json::Value;

use crate::{KERNEL_MAC, MIB, testpeer};

pub const CONFIG: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#;

pub fn etcd_args(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["--etcd-endpoints", ENDPOINT];
    v.extend_from_slice(extra);
    v
}

/// Leaves the node's previous subnet in subnet.env, as flanneld would have.
pub fn previous_subnet(h: &Host) -> Result<()> {
    let i = h.i;
    std::fs::write(
        h.subnet_file(),
        format!(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.{i}.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
        ),
    )?;
    Ok(())
}

pub fn lease(public_ip: &str, mac: &str) -> String {
    format!(
        r#"{{"PublicIP":"{public_ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac}"}}}}"#
    )
}

fn lease_of(e: &Etcd, subnet_key: &str) -> Result<Option<Value>> {
    let all = e.get_prefix(&format!("{PREFIX}/subnets/"))?;
    Ok(all.into_iter().find(|(k, _)| k.ends_with(subnet_key)).and_then(|(_, v)| serde_json::from_str(&v).ok()))
}

#[test]
fn etcd_agents_coordinate_renew_reuse_and_survive_an_etcd_restart() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let mut etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    let short_ttl = ["--subnet-lease-ttl", "4", "--subnet-lease-renew-margin-secs", "2"];
    let mut agents = Vec::new();
    for i in [1, 2] {
        c.host_mut(i).mount_bpffs()?;
        previous_subnet(c.host(i))?;
        agents.push(Agent::start_with(c.host(i), &etcd_args(&short_ttl))?);
    }
    // each node's lease, as flanneld would write it, with the MAC it uses
    for (i, a) in agents.iter().enumerate() {
        let n = i + 1;
        let l = lease_of(&etcd, &format!("10.244.{n}.0-24"))?.with_context(|| format!("no lease for node{n}"))?;
        assert_eq!(l["PublicIP"], format!("198.18.0.{n}"));
        assert_eq!(l["BackendType"], "vxlan");
        assert_eq!(l["PublicIPv6"], Value::Null);
        assert_eq!(l["BackendData"]["VNI"], 1);
        assert_eq!(l["BackendData"]["VtepMAC"], a.status()?["vtep_mac"]);
    }
    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    wait_reachable(p1, pod_ip(2), 20)?;
    assert_eq!(ping(p2, pod_ip(1), 5, "0.05")?, (5, 5));
    testpeer().tcp_transfer(p1, p2, pod_ip(2), 16 * MIB)?;

    // leases of 4 s outlive 10 s because they are renewed
    std::thread::sleep(Duration::from_secs(10));
    assert!(lease_of(&etcd, "10.244.1.0-24")?.is_some() && lease_of(&etcd, "10.244.2.0-24")?.is_some());
    assert!(agents[0].log_text().contains("lease renewed"));

    // etcd goes away and comes back: no ping is lost meanwhile
    // as long as the waits below may take (30 s for the cut, the rest after)
    let pinger = BackgroundPing::start(p1, pod_ip(2), 2000, "0.02")?;
    std::thread::sleep(Duration::from_millis(500));
    etcd.stop();
    // the agent says it is cut off (status's source, edgevx_source_watching:
    // what EdgevxViewStale reads), and forwards all the same
    let cut = |s: &Value| s["source"]["watching"] == false && s["source"]["name"] == "etcd";
    wait_status(&agents[0], Duration::from_secs(30), "the source cut off from etcd", cut)?;
    etcd.resume()?;
    pinger.expect_no_loss().context("across the etcd restart")?;
    let back = |s: &Value| s["source"]["watching"] == true && s["source"]["connected"] == true;
    wait_status(&agents[0], Duration::from_secs(30), "the source watching etcd again", back)?;
    std::thread::sleep(Duration::from_secs(6));
    assert!(lease_of(&etcd, "10.244.1.0-24")?.is_some(), "lease not kept after the etcd restart");

    // a restarted agent reuses its lease (matched by PublicIP)
    agents[0].stop()?;
    std::fs::remove_file(c.host(1).subnet_file())?;
    let mut a = Agent::start_with(c.host(1), &etcd_args(&short_ttl))?;
    // restore first: the dataplane comes back from the cached view, then etcd is asked
    assert!(a.log_text().contains("restoring the dataplane from the cached view first"), "{}", a.log_text());
    a.wait_log("reusing our lease", Duration::from_secs(10))?;
    assert_eq!(a.status()?["subnet"], "10.244.1.0/24");
    Ok(())
}

#[test]
fn etcd_allocation_races_and_reservations_for_an_external_vtep() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let etcd = Etcd::start(&c)?;
    // room for exactly three /24s, one of them reserved for an external VTEP on node3
    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.3.0","Backend":{"Type":"vxlan"}}"#,
    )?;
    etcd.put(&format!("{PREFIX}/subnets/10.244.3.0-24"), &lease("198.18.0.3", KERNEL_MAC))?;

    // two nodes with no history start at once and race for the two free subnets
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    let mut a1 = Agent::spawn(c.host(1), &etcd_args(&[]))?;
    let mut a2 = Agent::spawn(c.host(2), &etcd_args(&[]))?;
    a1.wait_log("dataplane up", Duration::from_secs(20))?;
    a2.wait_log("dataplane up", Duration::from_secs(20))?;
    let s1 = a1.status()?["subnet"].as_str().unwrap_or_default().to_string();
    let s2 = a2.status()?["subnet"].as_str().unwrap_or_default().to_string();
    let mut got = vec![s1.clone(), s2.clone()];
    got.sort();
    assert_eq!(got, vec!["10.244.1.0/24", "10.244.2.0/24"], "both free subnets, each once, reservation untouched");
    let reserved = lease_of(&etcd, "10.244.3.0-24")?.context("reservation vanished")?;
    assert_eq!(reserved["PublicIP"], "198.18.0.3");

    // the reservation is a peer on every edgevx node, with no per-node work
    for a in [&a1, &a2] {
        wait_status(a, Duration::from_secs(5), "the reserved VTEP as a peer", |s| {
            peers(s).contains(&("10.244.3.0-24".to_string(), KERNEL_MAC.to_string()))
        })?;
    }
    // and traffic reaches the pod behind it (node1's pod numbered into node1's subnet)
    let j: u8 = if s1 == "10.244.1.0/24" { 1 } else { 2 };
    if j != 1 {
        c.host(1).renumber_pod(j)?;
    }
    let ext = c.host(3);
    ext.kernel_vtep(KERNEL_MAC)?;
    let mac = a1.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    ext.kernel_add_lease(j, 1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 10)?;
    assert_eq!(ping(&ext.pod, pod_ip(j), 5, "0.05")?, (5, 5));
    testpeer().tcp_transfer(&c.host(1).pod, &ext.pod, pod_ip(3), 16 * MIB)?;
    Ok(())
}

/// A dual-stack etcd config: flannel's CheckNetworkConfig gives /64s from
/// fd00:10:244:1:: to fd00:10:244:ff::.
const CONFIG6: &str =
    r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;

#[test]
fn etcd_dual_stack_needs_a_public_ipv6_and_changes_nothing_without_one() -> Result<()> {
    // the node's underlay has no global IPv6 address: flanneld cannot find
    // one either, and a lease with "PublicIPv6":null would make kernel
    // flannel peers program an fdb entry without a destination
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG6)?;
    let h = c.host(1);
    let out =
        h.ns.cmd(&edgevx_bin().to_string_lossy())
            .args(["run", "--node-name", "node1", "--iface", "eth0", "--etcd-endpoints", ENDPOINT, "--state-dir"])
            .arg(h.state_dir())
            .arg("--bpffs")
            .arg(h.bpffs_dir())
            .arg("--subnet-file")
            .arg(h.subnet_file())
            .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no public IPv6 address") && err.contains(&format!("{PREFIX}/config")), "{err}");
    assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "a device was created");
    assert!(!h.subnet_file().exists(), "subnet.env was written");
    assert!(etcd.get_prefix(&format!("{PREFIX}/subnets/"))?.is_empty(), "a lease was taken");
    Ok(())
}

/// At boot the underlay's global IPv6 address may still be in duplicate
/// address detection when edgevx starts: it waits for the address instead
/// of refusing the config (exit 2 would keep systemd from restarting it),
/// and the lease and the IPv6 VTEP then use that address.
#[test]
fn etcd_dual_stack_waits_for_a_tentative_public_ipv6() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG6)?;
    let h = c.host(1);
    // one DAD probe, answered after 4 s: the address stays tentative that long
    h.ns.sysctl("net.ipv6.conf.eth0.dad_transmits", "1")?;
    h.ns.sysctl("net.ipv6.neigh.eth0.retrans_time_ms", "4000")?;
    h.ns.ip(&["-6", "addr", "add", "fd00:198:18::1/64", "dev", "eth0"])?;
    let tentative = h.ns.ip(&["-6", "addr", "show", "dev", "eth0", "tentative"])?;
    ensure!(tentative.contains("fd00:198:18::1"), "the address is not tentative: {tentative}");
    let a = Agent::start_with(h, &etcd_args(&[]))?;
    let log = a.log_text();
    ensure!(log.contains("still tentative"), "edgevx did not wait for the tentative address:\n{log}");
    let all = etcd.get_prefix(&format!("{PREFIX}/subnets/"))?;
    ensure!(all.len() == 1 && all[0].1.contains(r#""PublicIPv6":"fd00:198:18::1""#), "{all:?}");
    let local6 = h.ns.ip(&["-d", "link", "show", "flannel-v6.1"])?;
    ensure!(local6.contains("local fd00:198:18::1"), "{local6}");
    Ok(())
}

#[test]
fn etcd_dual_stack_lease_is_flannels_key_and_value() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG6)?;
    let h = c.host(1);
    h.ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    // nodad: a tentative address cannot be a VXLAN source
    h.ns.ip(&["-6", "addr", "add", "fd00:198:18::1/64", "dev", "eth0", "nodad"])?;
    // an older edgevx's IPv4-only lease of ours: flannel deletes a lease that
    // does not fit the IPv6 config (isIPv6SubnetConfigCompat); its MAC stays ours
    let old_mac = "02:ee:00:00:00:01";
    etcd.put(&format!("{PREFIX}/subnets/10.244.1.0-24"), &lease("198.18.0.1", old_mac))?;
    // subnet.env names the IPv6 subnet we had, as flanneld wrote it
    std::fs::write(
        h.subnet_file(),
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
         FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:5::1/64\n\
         FLANNEL_MTU=1234\nFLANNEL_IPMASQ=false\n",
    )?;
    let a = Agent::start_with(h, &etcd_args(&[]))?;
    assert!(a.log_text().contains("does not fit the network config's IPv6 settings"), "{}", a.log_text());

    let all = etcd.get_prefix(&format!("{PREFIX}/subnets/"))?;
    let keys: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    // flannel's MakeSubnetKey: the previous subnets of both families, one key
    assert_eq!(keys, [format!("{PREFIX}/subnets/10.244.1.0-24&fd00:10:244:5::-64")], "{all:?}");
    assert_eq!(a.status()?["vtep_mac"], old_mac);
    let mac6 = std::fs::read_to_string(h.state_dir().join("vtep-mac6"))?.trim().to_string();
    assert_ne!(mac6, old_mac, "the IPv6 VTEP has a MAC of its own");
    // byte for byte what Go's json.Marshal of flannel's LeaseAttrs gives
    assert_eq!(
        all[0].1,
        format!(
            r#"{{"PublicIP":"198.18.0.1","PublicIPv6":"fd00:198:18::1","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{old_mac}"}},"BackendV6Data":{{"VNI":1,"VtepMAC":"{mac6}"}}}}"#
        )
    );
    // the IPv6 VTEP is up with that subnet, and subnet.env says so in flannel's order
    let s = a.status()?;
    assert_eq!(
        (s["vtep6"]["mac"].as_str(), s["vtep6"]["subnet"].as_str()),
        (Some(mac6.as_str()), Some("fd00:10:244:5::/64")),
        "{s:#}"
    );
    let env = std::fs::read_to_string(h.subnet_file())?;
    assert!(!env.contains("FLANNEL_MTU=1234"), "subnet.env was not rewritten: {env}");
    assert!(env.starts_with("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:5::1/64\nFLANNEL_MTU="), "{env}");
    Ok(())
}
