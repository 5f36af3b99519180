//! An underlay MTU below what the VTEP MTU assumes (underlay - 50): the LTE
//! or VPN hop of an edge node, or an operator lowering the NIC's MTU. The
//! agent follows the underlay's MTU in place, so from then on the kernel's
//! own forwarding meets the smaller VTEP MTU first: it fragments a DF-clear
//! frame before encapsulation and answers a DF frame itself. In the moments
//! before the agent reacts (made as long as a test needs by freezing it),
//! the encap program answers DF frames and counts what it must drop.
use std::{
    process::Output,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use edgevx_tests::{
    agent::{Agent, wait_status},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip, underlay_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::json;

use crate::{MIB, monitor::Monitor, testpeer};

/// The underlay MTU node 1 gets; the VTEP was sized for 1500.
const UNDERLAY_MTU: &str = "1200";
/// What fits through it once encapsulated.
const FITS: u32 = 1200 - 50;

fn pair() -> Result<(Cluster, Agent, Agent)> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.yaml");
    let (m1, m2) = ("02:11:00:00:00:01", "02:22:00:00:00:02");
    write(&nodes, &node_list(vec![flannel_node(1, Some(m1)), flannel_node(2, Some(m2))]))?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    let a1 = Agent::start(c.host(1), &nodes, &[])?;
    let a2 = Agent::start(c.host(2), &nodes, &[])?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    Ok((c, a1, a2))
}

/// Lowers node 1's underlay MTU with its agent frozen: the VTEP still has
/// the old MTU, so only the encap program stands between big frames and
/// the smaller underlay. The agent thaws when the guard goes.
fn lower_with_agent_frozen<'a>(c: &Cluster, a1: &'a Agent) -> Result<Thaw<'a>> {
    a1.pause();
    let thaw = Thaw(a1);
    c.host(1).ns.ip(&["link", "set", "eth0", "mtu", UNDERLAY_MTU])?;
    Ok(thaw)
}

struct Thaw<'a>(&'a Agent);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

fn counter(a: &Agent, name: &str) -> Result<u64> {
    Ok(a.status()?["counters"][name].as_u64().unwrap_or(0))
}

/// flannel.1's MTU in node 1, as the kernel has it.
fn vtep_mtu(ns: &Netns) -> Result<u32> {
    let link = ns.ip(&["-j", "link", "show", "flannel.1"])?;
    let v: serde_json::Value = serde_json::from_str(&link)?;
    v[0]["mtu"].as_u64().map(|m| m as u32).context("no mtu in ip -j link show")
}

/// Polls until flannel.1's MTU is `want` (a generous bound, not a timing claim).
fn wait_vtep_mtu(ns: &Netns, want: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let have = vtep_mtu(ns)?;
        if have == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("flannel.1 MTU is {have}, not {want}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One ping of `size` payload bytes with DF set (`do`) or clear (`dont`).
fn ping_once(from: &Netns, size: u32, df: &str) -> Result<Output> {
    from.output(&["ping", "-n", "-c", "1", "-W", "2", "-M", df, "-s", &size.to_string(), &pod_ip(2).to_string()])
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn before_the_agent_follows_df_frames_get_frag_needed_from_the_encap_program() -> Result<()> {
    let (c, a1, _a2) = pair()?;
    let _thaw = lower_with_agent_frozen(&c, &a1)?;
    // the monitor reads the pins: it works with the agent frozen
    let monitor = Monitor::start(&c.host(1).ns, &a1)?;
    let p1 = &c.host(1).pod;
    let out = ping_once(p1, 1300, "do")?;
    if !crate::features::full_encap() {
        return without_check_mtu(&c, &a1, &out);
    }
    assert!(text(&out).contains(&format!("mtu = {FITS}")), "no frag-needed reached the pod: {}", text(&out));
    assert_eq!(counter(&a1, "drop_frag_needed")?, 1);
    // the operator's view of it: the pods, the peer, the reason
    let ev = monitor.wait(10, |v| v["reason"] == "drop_frag_needed")?;
    assert_eq!(
        (&ev["program"], &ev["direction"], &ev["iface"]),
        (&json!("encap"), &json!("egress"), &json!("flannel.1")),
        "{ev}"
    );
    assert_eq!((&ev["inner"]["proto"], &ev["inner"]["src"]), (&json!("icmp"), &json!(pod_ip(1).to_string())), "{ev}");
    assert_eq!(ev["inner"]["dst"], pod_ip(2).to_string(), "{ev}");
    assert_eq!(ev["peer"]["ip"], underlay_ip(2).to_string(), "{ev}");
    monitor.stop()?;
    assert_eq!(counter(&a1, "drop_too_big")?, 0);
    // the pod's kernel took the MTU: path MTU discovery works end to end
    let route = p1.ip(&["route", "get", &pod_ip(2).to_string()])?;
    assert!(route.contains(&format!("mtu {FITS}")), "{route}");
    assert!(ping_once(p1, FITS - 28, "do")?.status.success(), "what fits goes through");
    // TCP (GSO, DF) finds the path MTU by itself and delivers every byte
    testpeer().tcp_transfer(p1, &c.host(2).pod, pod_ip(2), 8 * MIB)?;
    assert!(counter(&a1, "drop_frag_needed")? >= 1);
    Ok(())
}

#[test]
fn before_the_agent_follows_df_clear_frames_too_big_are_counted_drops() -> Result<()> {
    let (c, a1, _a2) = pair()?;
    let _thaw = lower_with_agent_frozen(&c, &a1)?;
    let p1 = &c.host(1).pod;
    // the encap program cannot fragment the outer packet: dropped, counted
    let out = ping_once(p1, 1300, "dont")?;
    assert!(!out.status.success());
    if !crate::features::full_encap() {
        return without_check_mtu(&c, &a1, &out);
    }
    assert_eq!(counter(&a1, "drop_too_big")?, 1);
    assert_eq!(counter(&a1, "drop_frag_needed")?, 0);
    assert_eq!(ping(p1, pod_ip(2), 3, "0.05")?, (3, 3), "small frames still pass");
    Ok(())
}

/// A kernel without `bpf_check_mtu` (before 5.12) runs the compat encap,
/// which does not judge the underlay MTU: in the moment between an MTU drop
/// and the agent's reaction, a frame too big for the underlay is dropped by
/// the kernel after the redirect, unanswered and uncounted by edgevx (the
/// the kernel table in docs/src/kernels.md says so). Small frames still pass.
fn without_check_mtu(c: &Cluster, a1: &Agent, out: &Output) -> Result<()> {
    assert!(crate::features::before(5, 12), "bpf_check_mtu is missing on a kernel that has it upstream");
    assert!(!out.status.success(), "a frame too big for the underlay got through: {}", text(out));
    assert!(!text(out).contains("mtu = "), "something answered frag-needed: {}", text(out));
    assert_eq!((counter(a1, "drop_frag_needed")?, counter(a1, "drop_too_big")?), (0, 0));
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 3, "0.05")?, (3, 3), "small frames still pass");
    Ok(())
}

/// The agent follows the underlay's MTU in place (no restart): from then on
/// no frame is dropped for its size. A DF-clear frame is fragmented by the
/// kernel before the VTEP, a DF frame is answered by the kernel's
/// forwarding, and the MTU goes back up with the underlay's.
#[test]
fn once_the_agent_follows_the_underlay_mtu_no_frame_is_lost_for_its_size() -> Result<()> {
    let (c, a1, _a2) = pair()?;
    let (n1, p1) = (&c.host(1).ns, &c.host(1).pod);
    // the smaller hop is on the path both ways (the echo replies are as big)
    for h in [1, 2] {
        c.host(h).ns.ip(&["link", "set", "eth0", "mtu", UNDERLAY_MTU])?;
    }
    for h in [1, 2] {
        wait_vtep_mtu(&c.host(h).ns, FITS)?;
    }
    wait_status(&a1, Duration::from_secs(5), "status MTU", |s| s["mtu"] == json!(FITS))?;
    let env = std::fs::read_to_string(c.host(1).subnet_file())?;
    assert!(env.contains(&format!("FLANNEL_MTU={FITS}")), "{env}");

    let out = ping_once(p1, 1300, "dont")?;
    assert!(out.status.success(), "a DF-clear frame bigger than the path was lost: {}", text(&out));
    let out = ping_once(p1, 1300, "do")?;
    assert!(text(&out).contains(&format!("mtu = {FITS}")), "no frag-needed reached the pod: {}", text(&out));
    testpeer().tcp_transfer(p1, &c.host(2).pod, pod_ip(2), 8 * MIB)?;
    assert_eq!(counter(&a1, "drop_too_big")?, 0, "the encap program never met a frame too big");
    assert_eq!(counter(&a1, "drop_frag_needed")?, 0, "the kernel answered, not the encap program");
    assert!(a1.log_text().contains("VTEP MTU set"), "{}", a1.log_text());

    // and back up
    for h in [1, 2] {
        c.host(h).ns.ip(&["link", "set", "eth0", "mtu", "1500"])?;
    }
    for h in [1, 2] {
        wait_vtep_mtu(&c.host(h).ns, 1450)?;
    }
    // (the pod remembers the smaller path MTU for a while; the host does not)
    assert!(ping_once(n1, 1400, "do")?.status.success(), "the full MTU is back");
    Ok(())
}

/// A VTEP MTU set by hand is put back, like any other drift.
#[test]
fn a_vtep_mtu_changed_by_hand_is_put_back() -> Result<()> {
    let (c, _a1, _a2) = pair()?;
    let n1 = &c.host(1).ns;
    n1.ip(&["link", "set", "flannel.1", "mtu", "1300"])?;
    wait_vtep_mtu(n1, 1450)?;
    Ok(())
}
