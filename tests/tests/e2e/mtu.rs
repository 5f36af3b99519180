//! An underlay MTU below what the VTEP MTU assumes (flannel's MTU - 50):
//! the LTE or VPN hop of an edge node. Frames that no longer fit once
//! encapsulated are answered or counted, never lost unseen.
use std::process::Output;

use anyhow::Result;
use edgevx_tests::{
    agent::Agent,
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::{MIB, testpeer};

/// The underlay MTU node 1 gets; the VTEP still assumes 1500.
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
    c.host(1).ns.ip(&["link", "set", "eth0", "mtu", UNDERLAY_MTU])?;
    Ok((c, a1, a2))
}

fn counter(a: &Agent, name: &str) -> Result<u64> {
    Ok(a.status()?["counters"][name].as_u64().unwrap_or(0))
}

/// One ping of `size` payload bytes with DF set (`do`) or clear (`dont`).
fn ping_once(from: &Netns, size: u32, df: &str) -> Result<Output> {
    from.output(&["ping", "-n", "-c", "1", "-W", "2", "-M", df, "-s", &size.to_string(), &pod_ip(2).to_string()])
}

#[test]
fn df_frames_too_big_for_the_underlay_get_frag_needed_with_the_mtu_that_fits() -> Result<()> {
    let (c, a1, _a2) = pair()?;
    let p1 = &c.host(1).pod;
    let out = ping_once(p1, 1300, "do")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("mtu = {FITS}")), "no frag-needed reached the pod: {text}");
    assert_eq!(counter(&a1, "drop_frag_needed")?, 1);
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
fn df_clear_frames_too_big_for_the_underlay_are_counted() -> Result<()> {
    let (c, a1, _a2) = pair()?;
    let p1 = &c.host(1).pod;
    // not fragmented (see the report): dropped, and the drop is counted
    assert!(!ping_once(p1, 1300, "dont")?.status.success());
    assert_eq!(counter(&a1, "drop_too_big")?, 1);
    assert_eq!(counter(&a1, "drop_frag_needed")?, 0);
    assert_eq!(ping(p1, pod_ip(2), 3, "0.05")?, (3, 3), "small frames still pass");
    Ok(())
}
