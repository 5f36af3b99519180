//! The XDP judge on a real underlay: node 1's `eth0` is a veth, which has
//! native XDP. With `--xdp-judge=on` the agent attaches it in driver mode;
//! a stranger's VXLAN sent from an attacker's namespace is dropped there
//! (`xdp_drop_unknown_peer` rises, TC's `drop_unknown_peer` does not: no
//! skb ever reached TC), while pod traffic to and from the real peer still
//! flows. The link is adopted by a restarted agent and taken off by
//! `edgevx cleanup`. `--xdp-judge=auto` leaves a veth alone and says why.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::{self, Agent},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
    unique,
};
use serde_json::Value;

use crate::injection::SEND;

const M1: &str = "02:11:00:00:00:01";
const M2: &str = "02:22:00:00:00:02";
const ATTACKER: &str = "198.18.0.66";

fn two_nodes(xdp: &str) -> Result<(Cluster, Agent, Agent)> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.yaml");
    write(&nodes, &node_list(vec![flannel_node(1, Some(M1)), flannel_node(2, Some(M2))]))?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    let a1 = Agent::start(c.host(1), &nodes, &[&format!("--xdp-judge={xdp}")])?;
    let a2 = Agent::start(c.host(2), &nodes, &[])?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    Ok((c, a1, a2))
}

/// Node 1's status once the agent has decided about the XDP judge (it
/// does so right after the TC programs are attached).
fn xdp_status(a: &Agent) -> Result<Value> {
    let deadline = Instant::now() + edgevx_tests::patience(Duration::from_secs(20));
    loop {
        let s = a.status()?;
        let x = &s["xdp_judge"];
        if x["attached"] == true || x["reason"].is_string() {
            return Ok(x.clone());
        }
        if Instant::now() > deadline {
            bail!("no XDP judge decision in status: {s:#}\n{}", a.log_text());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ip link show eth0` in node 1 names an XDP program in driver mode.
fn native_xdp_on_eth0(c: &Cluster) -> Result<bool> {
    let link = c.host(1).ns.run(&["ip", "-d", "link", "show", "eth0"])?;
    // driver mode is `xdp`; generic would be `xdpgeneric`, offload `xdpoffload`
    Ok(link.split_whitespace().any(|w| w == "xdp") && !link.contains("xdpgeneric"))
}

fn counter(a: &Agent, name: &str) -> Result<u64> {
    a.status()?["counters"][name].as_u64().with_context(|| format!("no counter {name}"))
}

#[test]
fn xdp_judge_drops_a_strangers_vxlan_on_a_veth_underlay_and_the_peer_still_gets_through() -> Result<()> {
    let (c, mut a1, _a2) = two_nodes("on")?;
    let x = xdp_status(&a1)?;
    ensure!(x["attached"] == true && x["mode"] == "native", "XDP judge not attached natively: {x}\n{}", a1.log_text());
    ensure!(native_xdp_on_eth0(&c)?, "the kernel shows no native XDP on eth0");

    let attacker = Netns::new(&unique("atk"))?;
    c.plug(&attacker, "swatk")?;
    attacker.ip(&["addr", "add", &format!("{ATTACKER}/24"), "dev", "eth0"])?;
    attacker.ip(&["link", "set", "eth0", "up"])?;
    let (xdp_before, tc_before) = (counter(&a1, "xdp_drop_unknown_peer")?, counter(&a1, "drop_unknown_peer")?);
    let pod1 = pod_ip(1).to_string();
    for _ in 0..20 {
        attacker.run(&["python3", "-c", SEND, ATTACKER, "198.18.0.1", "raw", "10.244.2.2", &pod1, M1])?;
    }
    // the drops are counted before the frames could be anywhere else: poll a moment
    let deadline = Instant::now() + edgevx_tests::patience(Duration::from_secs(10));
    while counter(&a1, "xdp_drop_unknown_peer")? < xdp_before + 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let xdp_after = counter(&a1, "xdp_drop_unknown_peer")?;
    ensure!(xdp_after >= xdp_before + 20, "xdp_drop_unknown_peer {xdp_before} -> {xdp_after}");
    // no skb was built for them, so TC never saw them
    ensure!(counter(&a1, "drop_unknown_peer")? == tc_before, "TC saw frames XDP dropped");

    // the real peer's traffic, both ways, through the judge
    ensure!(ping(&c.host(1).pod, pod_ip(2), 10, "0.05")? == (10, 10), "pod1 -> pod2 with the XDP judge");
    ensure!(ping(&c.host(2).pod, pod_ip(1), 10, "0.05")? == (10, 10), "pod2 -> pod1 with the XDP judge");
    let peer = crate::testpeer();
    peer.tcp_transfer(&c.host(2).pod, &c.host(1).pod, pod_ip(1), 4 * crate::MIB)?;

    // a restarted agent adopts the pinned link: attached all along, the program swapped in place
    a1.stop()?;
    ensure!(native_xdp_on_eth0(&c)?, "the XDP judge went with the agent");
    let nodes = c.dir.join("nodes.yaml");
    let mut a1 = Agent::start(c.host(1), &nodes, &["--xdp-judge=on"])?;
    let x = xdp_status(&a1)?;
    ensure!(x["attached"] == true, "after a restart: {x}");
    ensure!(a1.log_text().contains("adopted pinned XDP link"), "not adopted:\n{}", a1.log_text());
    a1.stop()?;

    // cleanup takes it off with the TC programs
    let h = c.host(1);
    let out = agent::cleanup(h, &[])?;
    ensure!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    ensure!(!native_xdp_on_eth0(&c)?, "cleanup left the XDP judge on eth0");
    Ok(())
}

#[test]
fn xdp_judge_auto_leaves_a_veth_underlay_alone_and_says_why() -> Result<()> {
    let (c, a1, _a2) = two_nodes("auto")?;
    let x = xdp_status(&a1)?;
    ensure!(x["attached"] == false && x["mode"].is_null(), "{x}");
    ensure!(x["reason"].as_str().is_some_and(|r| r.contains("veth")), "{x}");
    ensure!(!native_xdp_on_eth0(&c)?, "auto attached XDP to a veth");
    Ok(())
}
