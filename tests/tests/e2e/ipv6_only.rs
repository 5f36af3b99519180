//! IPv6-only (`EnableIPv4: false`, Kubernetes subnet manager): edgevx
//! against a kernel IPv6-only flannel node. Node 1 runs edgevx against the
//! API stand-in with no IPv4 address on its underlay at all; node 2 has
//! flanneld's `flannel-v6.1` only, with exactly the entries flanneld
//! installs for node 1.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, cleanup, peers, wait_status},
    dual::{NETWORK6, add_ipv6, kernel_add_peer6, kernel_vtep6, pod_ip6, subnet6, underlay_ip6},
    kubeapi::KubeApi,
    topo::{Cluster, node_name},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::{
    MIB,
    metrics::{get_at, until},
    probe_flood::{daemonset_metrics_addr, probes},
    testpeer,
};

const KERNEL_MAC6: &str = "02:00:00:00:06:02";
const P: &str = "flannel.alpha.coreos.com";

fn net_conf_v6_only() -> String {
    format!(r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"{NETWORK6}","Backend":{{"Type":"vxlan"}}}}"#)
}

/// A Node of an IPv6-only cluster: one IPv6 pod CIDR; with `mac`, the
/// annotations flannel's AcquireLease writes there (no IPv4 ones).
fn node_v6_only(i: u8, mac6: Option<&str>) -> Value {
    let mut ann = json!({});
    if let Some(mac6) = mac6 {
        ann = json!({
            format!("{P}/kube-subnet-manager"): "true",
            format!("{P}/backend-type"): "vxlan",
            format!("{P}/backend-v6-data"): format!("{{\"VNI\":1,\"VtepMAC\":\"{mac6}\"}}"),
            format!("{P}/public-ipv6"): underlay_ip6(i).to_string(),
        });
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "annotations": ann},
        "spec": {"podCIDR": subnet6(i), "podCIDRs": [subnet6(i)]},
    })
}

/// The API stand-in in node 1 with node 1's IPv6-only Node, node 1's
/// bpffs, and the `--kube` flags with an IPv6-only net-conf.
fn kube_v6_only(c: &mut Cluster) -> Result<(KubeApi, [String; 5])> {
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    api.put_node(node_v6_only(1, None));
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    std::fs::write(&conf, net_conf_v6_only())?;
    let (kc, conf) = (kc.to_string_lossy().into_owned(), conf.to_string_lossy().into_owned());
    Ok((api, ["--kube".into(), "--kubeconfig".into(), kc, "--net-conf".into(), conf]))
}

/// The kubelet probes a hostNetwork pod at the node's address: on an
/// IPv6-only node, an IPv6 one. The agent listens where the DaemonSet says
/// (EDGEVX_METRICS_ADDR), and the DaemonSet's /healthz and /readyz answer
/// there over IPv6, and over IPv4 on the same socket. The node has
/// net.ipv6.bindv6only=1 (a per-namespace sysctl), so IPv4 gets through only
/// because the agent turns IPV6_V6ONLY off itself.
#[test]
fn ipv6_only_node_answers_the_daemonsets_probes_over_ipv6_and_ipv4() -> Result<()> {
    let (addr, probes) = (daemonset_metrics_addr()?, probes()?);
    let mut c = Cluster::new(1)?;
    add_ipv6(c.host(1))?;
    let h1 = c.host(1);
    h1.ns.ip(&["-4", "addr", "flush", "dev", "eth0"])?;
    h1.ns.ip(&["-6", "route", "add", "default", "dev", "eth0"])?;
    h1.ns.sysctl("net.ipv6.bindv6only", "1")?;
    let (_api, kube) = kube_v6_only(&mut c)?;
    let metrics = addr.to_string();
    let mut args: Vec<&str> = kube.iter().map(String::as_str).collect();
    args.extend(["--metrics-addr", &metrics]);
    let h1 = c.host(1);
    let mut agent = Agent::spawn_choosing_iface(h1, &args)?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let over_v6 = std::net::SocketAddr::new(underlay_ip6(1).into(), addr.port()).to_string();
    let over_v4 = format!("127.0.0.1:{}", addr.port());
    for at in [&over_v6, &over_v4] {
        for (path, timeout) in &probes {
            let r = until(&format!("{path} at {at}"), Duration::from_secs(20), || {
                Ok(get_at(&h1.ns, at, path).ok().filter(|r| r.status == 200))
            })
            .with_context(|| agent.log_text())?;
            eprintln!("{path} at {at}: {} {}", r.status, r.body.trim());
            // and again within the probe's timeoutSeconds, as the kubelet asks
            let t = std::time::Instant::now();
            ensure!(get_at(&h1.ns, at, path)?.status == 200 && t.elapsed() <= *timeout, "{path} at {at}");
        }
    }
    agent.stop()?;
    let out = cleanup(h1, &[])?;
    ensure!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

#[test]
fn ipv6_only_interoperates_with_a_kernel_ipv6_only_flannel_node() -> Result<()> {
    let mut c = Cluster::new(2)?;
    for i in 1..=2 {
        add_ipv6(c.host(i))?;
    }
    let h1 = c.host(1);
    // an IPv6-only underlay: no IPv4 address, the interface is the IPv6 default route's
    h1.ns.ip(&["-4", "addr", "flush", "dev", "eth0"])?;
    h1.ns.ip(&["-6", "route", "add", "default", "dev", "eth0"])?;
    // what an earlier IPv4 run left: it must not route the pods' IPv4 network
    h1.kernel_vtep("02:00:00:00:04:01")?;
    let (api, kube) = kube_v6_only(&mut c)?;
    let args: Vec<&str> = kube.iter().map(String::as_str).collect();
    let (h1, h2) = (c.host(1), c.host(2));
    let mut agent = Agent::spawn_choosing_iface(h1, &args)?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;

    let s = agent.status()?;
    ensure!(s["vtep_device"].is_null() && s["public_ip"].is_null(), "an IPv4 VTEP in the status: {s:#}");
    ensure!(s["dataplane_attached"] == true && s["iface"] == "eth0", "{s:#}");
    let mac6 = s["vtep6"]["mac"].as_str().with_context(|| format!("no vtep6 in the status: {s:#}"))?.to_string();
    // flannel's AcquireLease in an IPv6-only network: the IPv6 pair only
    let patches = api.wait_patches(Duration::from_secs(10), |p| !p.is_empty())?;
    assert_eq!(
        patches[0].body,
        json!({"metadata": {"annotations": {
            format!("{P}/backend-v6-data"): format!("{{\"VNI\":1,\"VtepMAC\":\"{mac6}\"}}"),
            format!("{P}/backend-type"): "vxlan",
            format!("{P}/kube-subnet-manager"): "true",
            format!("{P}/public-ipv6"): underlay_ip6(1).to_string(),
        }}})
    );
    // no IPv4 VTEP, no IPv4 chains; flannel-v6.1 as flannel builds it
    let links = h1.ns.run(&["ip", "-d", "link", "show"])?;
    ensure!(!links.contains("flannel.1"), "the IPv4 VTEP is there in an IPv6-only network:\n{links}");
    let link = h1.ns.run(&["ip", "-d", "link", "show", "flannel-v6.1"])?;
    for want in [format!("local {}", underlay_ip6(1)), "vxlan id 1".into(), "mtu 1430".into(), mac6.clone()] {
        ensure!(link.contains(&want), "flannel-v6.1 lacks {want:?}:\n{link}");
    }
    let v4_rules = h1.ns.run(&["iptables-save"])?;
    ensure!(!v4_rules.contains("EDGEVX"), "IPv4 chains in an IPv6-only network:\n{v4_rules}");
    ensure!(h1.ns.run(&["ip6tables-save"])?.contains("EDGEVX"), "no IPv6 chains");
    // flannel's WriteSubnetFile: only the IPv6 lines; the pods' MTU is flannel-v6's
    let env = std::fs::read_to_string(h1.subnet_file())?;
    assert_eq!(
        env,
        format!(
            "FLANNEL_IPV6_NETWORK={NETWORK6}\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\nFLANNEL_MTU=1430\n\
             FLANNEL_IPMASQ=false\n"
        )
    );

    // a kernel IPv6-only flannel peer, and a Node with only IPv4 annotations (rejected by name)
    kernel_vtep6(h2, KERNEL_MAC6)?;
    kernel_add_peer6(h2, 1, &mac6)?;
    api.put_node(node_v6_only(2, Some(KERNEL_MAC6)));
    api.put_node(edgevx_tests::nodes::flannel_node(3, Some("02:00:00:00:03:01")));
    wait_status(&agent, Duration::from_secs(10), "node2 added", |s| {
        peers(s) == [("node2".to_string(), KERNEL_MAC6.to_string())] && s["peers"][0]["in_dataplane"] == true
    })?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !agent.log_text().lines().any(|l| l.contains("node3") && l.contains("public-ipv6")) {
        ensure!(
            std::time::Instant::now() < deadline,
            "node3 (no IPv6 half) is not rejected with its reason:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (p1, p2) = (&h1.pod, &h2.pod);
    for (from, to) in [(p1, 2), (p2, 1)] {
        wait_reachable(from, pod_ip6(to), 20)?;
    }
    assert_eq!(ping(p1, pod_ip6(2), 10, "0.05")?, (10, 10), "ICMPv6 edgevx -> kernel");
    assert_eq!(ping(p2, pod_ip6(1), 10, "0.05")?, (10, 10), "ICMPv6 kernel -> edgevx");
    let peer = testpeer();
    peer.tcp_transfer(p1, p2, pod_ip6(2), 32 * MIB)?;
    peer.tcp_transfer(p2, p1, pod_ip6(1), 32 * MIB)?;
    assert_eq!(peer.udp_datagrams(p1, p2, pod_ip6(2), 300, 1200)?, 300, "UDP edgevx -> kernel");
    assert_eq!(peer.udp_datagrams(p2, p1, pod_ip6(1), 300, 1200)?, 300, "UDP kernel -> edgevx");
    // the IPv6 VXLAN arrived through the judge on the underlay
    let counters = &agent.status()?["counters"];
    ensure!(counters["drop_unknown_peer"] == 0, "{counters:#}");

    // cleanup leaves nothing
    agent.stop()?;
    let out = cleanup(h1, &[])?;
    ensure!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    ensure!(!h1.ns.run(&["ip", "link", "show"])?.contains("flannel-v6.1"), "flannel-v6.1 left behind");
    ensure!(!h1.subnet_file().exists(), "subnet.env left behind");
    ensure!(!h1.ns.run(&["ip6tables-save"])?.contains("EDGEVX"), "IPv6 chains left behind");
    Ok(())
}

#[test]
fn ipv6_only_names_what_it_cannot_do() -> Result<()> {
    let mut c = Cluster::new(1)?;
    add_ipv6(c.host(1))?;
    let (_api, kube) = kube_v6_only(&mut c)?;
    let with = |extra: [&'static str; 2]| -> Vec<&str> { kube.iter().map(String::as_str).chain(extra).collect() };
    // --iface-can-reach takes an IPv4 address: no IPv4 route to follow here
    let args = with(["--iface-can-reach", "198.18.0.2"]);
    let mut agent = Agent::spawn_choosing_iface(c.host(1), &args)?;
    assert_eq!(agent.wait_exit(Duration::from_secs(10))?, Some(2));
    let log = agent.log_text();
    ensure!(log.contains("--iface-can-reach 198.18.0.2") && log.contains("IPv6-only"), "{log}");
    // an interface without a global IPv6 address does not qualify (yet:
    // the address may still come, so the agent waits, saying why)
    let args = with(["--iface", "cni0"]);
    c.host(1).ns.ip(&["-6", "addr", "flush", "dev", "cni0", "scope", "global"])?;
    let mut agent = Agent::spawn_choosing_iface(c.host(1), &args)?;
    agent.wait_log("not ready to bring up the dataplane", Duration::from_secs(10))?;
    agent.stop()?;
    let log = agent.log_text();
    ensure!(log.contains("--iface cni0") && log.contains("global IPv6 address"), "{log}");
    Ok(())
}
