//! Issue 33, finding 3: one hostile or buggy node must not cut off or
//! hijack another's pods on a node that starts fresh, and must not exempt
//! itself from the inner-source check. Three nodes, each attack sent for
//! real: node 1 runs edgevx, node 2 is the victim (flanneld's kernel
//! VXLAN, pod 10.244.2.2) and node 3 (198.18.0.3) the attacker, named
//! `aaa-attacker` so that it sorts first by name, with the younger entry.
//! - (a) The attacker claims the victim's public IP: both entries stay, as
//!   flannel keeps both fdb entries; the victim's pods stay reachable after
//!   a fresh start and after a reboot restored from the cache offline.
//! - (b) The attacker claims 10.244.2.0/23 over the victim's /24: longest
//!   prefix wins, as routing does; none of the victim's traffic reaches the
//!   attacker, which cannot send as the victim's pods either. In etcd such a
//!   lease (`10.244.2.0-23`, which sorts first) is refused by name: it is
//!   not a `SubnetLen` block.
//! - (c) The attacker annotates its own Node `edgevx.io/any-inner-source`:
//!   its forged inner sources are still dropped and counted, and the agent
//!   names it; the operator's `--any-inner-source` does exempt it.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    etcd::{Etcd, PREFIX},
    kubeapi::KubeApi,
    netns::Netns,
    nodes::{node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::{
    KERNEL_MAC,
    etcd::{CONFIG, etcd_args, lease, previous_subnet},
    injection::SEND,
};

const P: &str = "flannel.alpha.coreos.com";
const M1: &str = "02:11:00:00:00:01";
const M3: &str = "02:33:00:00:00:03";
const VICTIM_IP: &str = "198.18.0.2";
const ATTACKER_IP: &str = "198.18.0.3";
const ATTACKER: &str = "aaa-attacker";
/// When the victim's Node appeared; the attacker's came later.
const EARLY: &str = "2026-01-05T08:00:00Z";
const LATER: &str = "2026-06-01T12:00:00Z";
/// A client's address, in no pod CIDR.
const CLIENT: &str = "203.0.113.7";

/// A Node as the API server holds it, with flannel's annotations.
fn node(name: &str, cidr: &str, public_ip: &str, mac: Option<&str>, created: &str) -> Value {
    let mut ann = json!({
        format!("{P}/kube-subnet-manager"): "true",
        format!("{P}/backend-type"): "vxlan",
        format!("{P}/public-ip"): public_ip,
    });
    if let Some(mac) = mac {
        ann[format!("{P}/backend-data")] = json!(format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"));
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": created, "annotations": ann},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
    })
}

fn own() -> Value {
    node("node1", "10.244.1.0/24", "198.18.0.1", Some(M1), EARLY)
}

fn victim() -> Value {
    node("victim", "10.244.2.0/24", VICTIM_IP, Some(KERNEL_MAC), EARLY)
}

/// The victim's kernel VTEP, knowing node 1 at `mac`.
fn victim_vtep(c: &Cluster, mac: &str) -> Result<()> {
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, mac)
}

/// Counts, on the attacker, every VXLAN datagram that reaches it.
fn count_vxlan_at_attacker(c: &Cluster) -> Result<()> {
    c.host(3).ns.run(&["iptables", "-I", "INPUT", "-p", "udp", "--dport", "8472"]).map(|_| ())
}

fn vxlan_at_attacker(c: &Cluster) -> Result<u64> {
    let listing = c.host(3).ns.run(&["iptables", "-L", "INPUT", "-v", "-x", "-n"])?;
    let line = listing.lines().find(|l| l.contains("dpt:8472")).with_context(|| format!("no rule:\n{listing}"))?;
    Ok(line.split_whitespace().next().context("empty rule line")?.parse()?)
}

/// The victim's pod answers node 1's, and node 1's the victim's, with none
/// of it at the attacker.
fn victim_reachable_and_attacker_gets_nothing(c: &Cluster) -> Result<()> {
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    let before = vxlan_at_attacker(c)?;
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 10, "0.05")?, (10, 10), "node 1's pod to the victim's");
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 10, "0.05")?, (10, 10), "the victim's pod to node 1's");
    assert_eq!(vxlan_at_attacker(c)?, before, "the victim's traffic reached the attacker");
    Ok(())
}

fn counter(agent: &Agent, name: &str) -> Result<u64> {
    Ok(agent.status()?["counters"][name].as_u64().unwrap_or(0))
}

/// UDP datagrams node 1's pod saw for a port nobody listens on.
fn pod1_no_ports(c: &Cluster) -> Result<u64> {
    let snmp = c.host(1).pod.run(&["cat", "/proc/net/snmp"])?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().context("Udp header")?, udp.next().context("Udp values")?);
    let at = names.split_whitespace().position(|n| n == "NoPorts").context("NoPorts")?;
    Ok(values.split_whitespace().nth(at).context("NoPorts value")?.parse()?)
}

/// Polls `done` until it holds (true) or a generous bound passes (false).
fn wait_for(done: impl Fn() -> Result<bool>) -> Result<bool> {
    for _ in 0..250 {
        if done()? {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(false)
}

/// The attacker, from its own address, sends node 1's pod a UDP datagram
/// with `inner_src` inside VXLAN to node 1's VTEP (`mac`).
fn forge(attacker: &Netns, mac: &str, inner_src: &str) -> Result<()> {
    let pod1 = pod_ip(1).to_string();
    attacker.run(&["python3", "-c", SEND, ATTACKER_IP, "198.18.0.1", "udp", inner_src, &pod1, mac]).map(|_| ())
}

/// A forged frame from the attacker is dropped before the pod and counted
/// as `drop_spoofed_source`.
fn forged_is_dropped(c: &Cluster, agent: &Agent, mac: &str, inner_src: &str) -> Result<()> {
    let (before, seen) = (counter(agent, "drop_spoofed_source")?, pod1_no_ports(c)?);
    forge(&c.host(3).ns, mac, inner_src)?;
    let counted = wait_for(|| Ok(counter(agent, "drop_spoofed_source")? > before || pod1_no_ports(c)? > seen))?;
    assert_eq!(pod1_no_ports(c)?, seen, "inner source {inner_src} from the attacker reached the pod");
    assert!(counted, "inner source {inner_src}: drop_spoofed_source did not move");
    assert_eq!(counter(agent, "drop_spoofed_source")?, before + 1, "inner source {inner_src}");
    Ok(())
}

/// A frame from the attacker reaches node 1's pod.
fn forged_is_delivered(c: &Cluster, mac: &str, inner_src: &str) -> Result<()> {
    let seen = pod1_no_ports(c)?;
    forge(&c.host(3).ns, mac, inner_src)?;
    ensure!(wait_for(|| Ok(pod1_no_ports(c)? > seen))?, "inner source {inner_src} did not reach the pod");
    Ok(())
}

/// Node 1 with its bpffs and no reverse-path filter (a client source on
/// flannel.1 would meet it whatever edgevx does), the attacker counting
/// the VXLAN it gets.
fn cluster() -> Result<Cluster> {
    let mut c = Cluster::new(3)?;
    c.host_mut(1).mount_bpffs()?;
    for key in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"] {
        c.host(1).ns.sysctl(key, "0")?;
    }
    count_vxlan_at_attacker(&c)?;
    Ok(c)
}

fn names(status: &Value) -> Vec<String> {
    let mut n: Vec<String> = peers(status).into_iter().map(|(name, _)| name).collect();
    n.sort();
    n
}

#[test]
fn a_node_claiming_the_victims_public_ip_cuts_nobody_off_fresh_or_from_the_cache() -> Result<()> {
    let mut c = cluster()?;
    let api = KubeApi::start_in(&c.host(1).ns.name)?;
    let kc = c.dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    let kc = kc.to_string_lossy().into_owned();
    let attacker = node(ATTACKER, "10.244.3.0/24", VICTIM_IP, Some(M3), LATER);
    for n in [own(), attacker.clone(), victim()] {
        api.put_node(n);
    }
    let args = ["--kube", "--kubeconfig", &kc];
    let agent = Agent::start_with(c.host(1), &args)?;
    let mac = agent.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    victim_vtep(&c, &mac)?;
    let both = vec![ATTACKER.to_string(), "victim".to_string()];
    wait_status(&agent, Duration::from_secs(10), "both entries behind 198.18.0.2", |s| names(s) == both)?;
    victim_reachable_and_attacker_gets_nothing(&c)?;
    let mut agent = agent;
    agent.stop()?;

    // reboot with the API unreachable: the cached view decides the same
    c.reboot(1)?;
    c.host_mut(1).mount_bpffs()?;
    for key in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"] {
        c.host(1).ns.sysctl(key, "0")?;
    }
    let api = KubeApi::start_in(&c.host(1).ns.name)?; // the old listener died with the namespace
    api.set_down(true);
    api.kubeconfig(&c.dir.join("kubeconfig"))?;
    let agent = Agent::start_with(c.host(1), &args)?;
    let log = agent.log_text();
    ensure!(log.contains("restoring the dataplane from the cached view"), "not restored from the cache:\n{log}");
    ensure!(agent.status()?["vtep_mac"] == json!(mac), "the VTEP MAC changed across the reboot");
    wait_status(&agent, Duration::from_secs(10), "both entries from the cache", |s| names(s) == both)?;
    victim_reachable_and_attacker_gets_nothing(&c)
}

#[test]
fn a_superset_subnet_takes_none_of_the_victims_traffic_nor_its_sources() -> Result<()> {
    let c = cluster()?;
    let nodes = c.dir.join("nodes.json");
    // the attacker first, by name and in the list
    let attacker = node(ATTACKER, "10.244.2.0/23", ATTACKER_IP, Some(M3), LATER);
    write(&nodes, &node_list(vec![attacker, own(), victim()]))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    victim_vtep(&c, &mac)?;
    let both = vec![ATTACKER.to_string(), "victim".to_string()];
    wait_status(&agent, Duration::from_secs(10), "both subnets programmed", |s| names(s) == both)?;
    victim_reachable_and_attacker_gets_nothing(&c)?;
    // the /23's holder cannot send as the /24's pods, nor as a client...
    forged_is_dropped(&c, &agent, &mac, &pod_ip(2).to_string())?;
    forged_is_dropped(&c, &agent, &mac, CLIENT)?;
    // ...only as the pods of its /23's other half, where its prefix is the longest
    forged_is_delivered(&c, &mac, "10.244.3.7")?;
    // a fresh start (cleanup, then start again) decides the same
    let mut agent = agent;
    agent.stop()?;
    let out = edgevx_tests::agent::cleanup(c.host(1), &[])?;
    ensure!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    wait_status(&agent, Duration::from_secs(10), "both subnets again", |s| names(s) == both)?;
    victim_reachable_and_attacker_gets_nothing(&c)?;
    forged_is_dropped(&c, &agent, &mac, &pod_ip(2).to_string())
}

#[test]
fn an_etcd_lease_wider_than_subnet_len_is_refused_by_name() -> Result<()> {
    let c = cluster()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    etcd.put(&format!("{PREFIX}/subnets/10.244.2.0-24"), &lease(VICTIM_IP, KERNEL_MAC))?;
    // written after the victim's, and sorting before it
    etcd.put(&format!("{PREFIX}/subnets/10.244.2.0-23"), &lease(ATTACKER_IP, M3))?;
    previous_subnet(c.host(1))?;
    let mut agent = Agent::start_with(c.host(1), &etcd_args(&[]))?;
    agent
        .wait_log("subnet 10.244.2.0/23 is a /23, but the network config's SubnetLen is 24", Duration::from_secs(10))?;
    let log = agent.log_text();
    let line = log.lines().find(|l| l.contains("is a /23")).context("no refusal")?;
    ensure!(line.contains("10.244.2.0-23"), "the refusal does not name the lease: {line}");
    let mac = agent.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    victim_vtep(&c, &mac)?;
    wait_status(&agent, Duration::from_secs(10), "the victim alone", |s| {
        names(s) == vec!["10.244.2.0-24".to_string()]
    })?;
    victim_reachable_and_attacker_gets_nothing(&c)?;
    // nothing of the refused lease is accepted: its VXLAN is a stranger's
    let before = counter(&agent, "drop_unknown_peer")?;
    forge(&c.host(3).ns, &mac, "10.244.3.7")?;
    ensure!(
        wait_for(|| Ok(counter(&agent, "drop_unknown_peer")? > before))?,
        "the refused lease's VXLAN was not refused"
    );
    Ok(())
}

#[test]
fn a_nodes_own_exemption_annotation_exempts_nothing_and_the_operators_flag_does() -> Result<()> {
    let c = cluster()?;
    let nodes = c.dir.join("nodes.json");
    let mut attacker = node(ATTACKER, "10.244.3.0/24", ATTACKER_IP, Some(M3), LATER);
    attacker["metadata"]["annotations"]["edgevx.io/any-inner-source"] = json!("true");
    write(&nodes, &node_list(vec![attacker, own(), victim()]))?;
    let mut agent = Agent::start(c.host(1), &nodes, &[])?;
    agent.wait_log("not exempting a node from the inner-source check", Duration::from_secs(10))?;
    let log = agent.log_text();
    let line = log.lines().find(|l| l.contains("not exempting a node")).context("no warning")?;
    ensure!(line.contains(ATTACKER) && line.contains("--any-inner-source"), "the warning: {line}");
    let mac = agent.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    victim_vtep(&c, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    // as another node's pod, and as a client: dropped and counted
    forged_is_dropped(&c, &agent, &mac, &pod_ip(2).to_string())?;
    forged_is_dropped(&c, &agent, &mac, CLIENT)?;
    // warned once, not at every pass
    std::thread::sleep(Duration::from_secs(11)); // past a resync
    let warnings = agent.log_text().matches("not exempting a node from the inner-source check").count();
    ensure!(warnings == 1, "warned {warnings} times:\n{}", agent.log_text());
    drop(agent);

    // the operator exempts it, by name or by its pod CIDR, from the flag or its variable
    for (flag, env) in [(Some(format!("--any-inner-source={ATTACKER}")), None), (None, Some("10.244.3.0/24"))] {
        let args: Vec<&str> = flag.iter().map(String::as_str).collect();
        let agent = match env {
            None => Agent::start(c.host(1), &nodes, &args)?,
            Some(v) => {
                let nodes = nodes.to_str().context("path")?;
                let env = format!("EDGEVX_ANY_INNER_SOURCE=10.244.9.0/24,{v}");
                let mut a = Agent::spawn_via(c.host(1), &["env", &env], &["--nodes-file", nodes])?;
                a.wait_log("dataplane up", Duration::from_secs(20))?;
                a
            }
        };
        wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
        forged_is_delivered(&c, &mac, CLIENT)?;
        drop(agent);
    }
    Ok(())
}
