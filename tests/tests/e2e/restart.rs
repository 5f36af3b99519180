//! The VTEP MAC survives restarts and reboots; the dataplane survives the
//! agent being killed.
use std::time::Duration;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::Agent,
    scenario::edgevx_and_flannel,
    topo::{Cluster, pod_ip},
    traffic::{BackgroundPing, ping, wait_reachable},
};

fn setup() -> Result<(Cluster, std::path::PathBuf, Agent, String)> {
    // our own node publishes no MAC in the file: it comes from the state dir
    let s = edgevx_and_flannel(&[])?;
    Ok((s.cluster, s.nodes_file, s.agent, s.mac))
}

#[test]
fn mac_is_kept_across_restart_and_reboot_with_the_kernel_peer_untouched() -> Result<()> {
    let (mut c, nodes, mut agent, mac) = setup()?;
    let kernel_state = c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?;

    agent.stop()?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str(), "restart changed the MAC");
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?, (5, 5));
    drop(agent);

    // reboot: namespaces, links and bpffs pins all gone; the state dir stays
    c.reboot(1)?;
    assert!(c.host(1).ns.ip(&["link", "show", "flannel.1"]).is_err(), "reboot left the device behind");
    c.host_mut(1).mount_bpffs()?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str(), "reboot changed the MAC");
    assert!(c.host(1).ns.ip(&["link", "show", "flannel.1"])?.contains(&mac), "flannel.1 lost the MAC");
    // node2 was never told anything, and it still reaches us
    assert_eq!(c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?, kernel_state);
    wait_reachable(&c.host(2).pod, pod_ip(1), 10)?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 10, "0.05")?, (10, 10));
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 10, "0.05")?, (10, 10));
    Ok(())
}

#[test]
fn no_ping_is_lost_across_kill_9_and_restart() -> Result<()> {
    no_ping_lost_across_kill_9_and_restart(&[], crate::features::adopted_in_place(crate::features::default_attach()))
}

/// The same on a kernel without TCX: filters on a clsact qdisc, forced here.
#[test]
fn no_ping_is_lost_across_kill_9_and_restart_with_clsact_filters() -> Result<()> {
    no_ping_lost_across_kill_9_and_restart(&["--tc-attach", "clsact"], crate::features::adopted_in_place("clsact"))
}

fn no_ping_lost_across_kill_9_and_restart(extra: &[&str], adopted: &str) -> Result<()> {
    let s = edgevx_and_flannel(extra)?;
    let (c, nodes, mut agent, mac) = (s.cluster, s.nodes_file, s.agent, s.mac);
    // 400 pings at 10 ms across the kill and the restart, both directions
    let pingers = [(2u8, 1u8), (1, 2)]
        .into_iter()
        .map(|(from, to)| BackgroundPing::start(&c.host(from).pod, pod_ip(to), 400, "0.01"))
        .collect::<Result<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(800));
    agent.kill9();
    // status reads the pins and the state dir: it works with the agent gone
    let s = agent.status()?;
    assert_eq!((s["agent_running"].as_bool(), s["dataplane_attached"].as_bool()), (Some(false), Some(true)), "{s:#}");
    assert_eq!(s["peers"][0]["node"], "node2");
    assert!(s["peers"][0]["tx_packets"].as_u64() > Some(0));
    std::thread::sleep(Duration::from_millis(800));
    // the dataplane keeps running with no agent at all
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 3, "0.05")?.1, 3);
    let agent = Agent::start(c.host(1), &nodes, extra)?;
    assert!(agent.log_text().contains(adopted), "restart did not take over in place:\n{}", agent.log_text());
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str());
    for p in pingers {
        p.expect_no_loss().context("across kill -9 and the restart")?;
    }
    Ok(())
}

#[test]
fn a_deleted_vtep_is_rebuilt_with_the_same_mac() -> Result<()> {
    let (c, _nodes, mut agent, mac) = setup()?;
    c.host(1).ns.ip(&["link", "del", "flannel.1"])?;
    agent.wait_log("rebuilding the dataplane", Duration::from_secs(5))?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?, (5, 5));
    assert!(c.host(1).ns.ip(&["link", "show", "flannel.1"])?.contains(&mac), "rebuilt with another MAC");
    assert!(c.host(1).ns.ip(&["route"])?.contains("10.244.0.0/16 via 169.254.1.1 dev flannel.1"));
    Ok(())
}

#[test]
fn an_upgrade_to_a_new_map_layout_retires_the_old_pins_without_loss() -> Result<()> {
    let (c, nodes, mut agent, _mac) = setup()?;
    agent.stop()?;
    // make the running dataplane look like one pinned by an older layout version
    let bpffs = c.host(1).bpffs_dir();
    let ours = std::fs::read_dir(&bpffs)?.flatten().map(|e| e.path()).find(|p| p.is_dir()).expect("a version dir");
    let older = bpffs.join("v0");
    std::fs::rename(&ours, &older)?;
    let pinger = BackgroundPing::start(&c.host(2).pod, pod_ip(1), 300, "0.01")?;
    std::thread::sleep(Duration::from_millis(500));
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    assert!(agent.log_text().contains("retired the pins of another edgevx version"), "{}", agent.log_text());
    assert!(!older.exists(), "the old pins are still there");
    pinger.expect_no_loss().context("across the upgrade")?;
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 5, "0.05")?, (5, 5));
    Ok(())
}
