//! Offline autonomy: a node that starts cut off from its control plane
//! brings its dataplane back from the cached view, and reconciles when the
//! control plane returns, without disturbing peers that did not change.
use std::time::Duration;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    etcd::{Etcd, PREFIX},
    netns::Netns,
    topo::{Cluster, pod_ip},
    traffic::{BackgroundPing, wait_reachable},
};

use crate::{
    KERNEL_MAC,
    etcd::{CONFIG, etcd_args, lease, previous_subnet},
};

/// Cuts the node off from etcd (198.18.0.254:2379) with a firewall rule.
fn partition(ns: &Netns, on: bool) -> Result<()> {
    if on {
        ns.run(&["nft", "add", "table", "inet", "partition"])?;
        ns.run(&["nft", "add", "chain", "inet", "partition", "out", "{ type filter hook output priority 0; }"])?;
        ns.run(&[
            "nft",
            "add",
            "rule",
            "inet",
            "partition",
            "out",
            "ip",
            "daddr",
            "198.18.0.254",
            "tcp",
            "dport",
            "2379",
            "drop",
        ])?;
    } else {
        ns.run(&["nft", "delete", "table", "inet", "partition"])?;
    }
    Ok(())
}

/// The startup figures `edgevx status` gives (ms from process start), in
/// the order restore-first reaches them; the figures themselves are the
/// bench's business, not a test's.
fn startup_in_order(s: &serde_json::Value) -> Result<()> {
    let ms = |k: &str| s["startup"][k].as_f64().with_context(|| format!("no startup.{k} in {}", s["startup"]));
    let (env, vtep, attached) = (ms("subnet_env_ms")?, ms("vtep_up_ms")?, ms("attached_ms")?);
    let (first, all) = (ms("first_peer_ms")?, ms("all_peers_ms")?);
    anyhow::ensure!(
        env <= vtep && vtep <= attached && attached <= all && first <= all,
        "startup steps out of order: {}",
        s["startup"]
    );
    Ok(())
}

#[test]
fn offline_start_restores_from_cache_then_reconciles_when_etcd_returns() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    // node2 and node3 are kernel VTEPs known to etcd through reservations
    for i in [2u8, 3] {
        etcd.put(&format!("{PREFIX}/subnets/10.244.{i}.0-24"), &lease(&format!("198.18.0.{i}"), KERNEL_MAC))?;
        c.host(i).kernel_vtep(KERNEL_MAC)?;
    }
    c.host_mut(1).mount_bpffs()?;
    previous_subnet(c.host(1))?;
    let agent = Agent::start_with(c.host(1), &etcd_args(&[]))?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    for i in [2u8, 3] {
        c.host(i).kernel_add_peer(1, &mac)?;
    }
    wait_status(&agent, Duration::from_secs(5), "two peers", |s| peers(s).len() == 2)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 10)?;
    assert!(c.host(1).state_dir().join("last-view.json").exists(), "no cached view");
    drop(agent);

    // reboot while cut off from etcd: all kernel state gone, state dir kept
    c.reboot(1)?;
    c.host_mut(1).mount_bpffs()?;
    partition(&c.host(1).ns, true)?;
    let agent = Agent::start_with(c.host(1), &etcd_args(&[]))?;
    let log = agent.log_text();
    assert!(log.contains("restoring the dataplane from the cached view"), "{log}");
    // this run's (the state dir keeps the last run's until this one's first pass)
    let pid = agent.pid();
    let s = wait_status(&agent, Duration::from_secs(10), "this run's startup figures", |s| {
        s["startup"]["pid"].as_u64() == pid.map(u64::from) && s["startup"]["all_peers_ms"].is_number()
    })?;
    startup_in_order(&s)?;
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str());
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 10)?;
    // a long outage never removes peers
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(peers(&agent.status()?).len(), 2);

    // meanwhile node3 leaves the cluster; then the partition heals
    etcd.ctl(&["del", &format!("{PREFIX}/subnets/10.244.3.0-24")])?;
    let pinger = BackgroundPing::start(&c.host(1).pod, pod_ip(2), 600, "0.02")?;
    partition(&c.host(1).ns, false)?;
    wait_status(&agent, Duration::from_secs(25), "node3 removed after reconnecting", |s| {
        peers(s) == vec![("10.244.2.0-24".to_string(), KERNEL_MAC.to_string())]
    })?;
    assert!(agent.log_text().contains("control plane reachable again"));
    pinger.expect_no_loss().context("node2 was disturbed by the reconcile")?;
    assert!(!c.host(1).ns.ip(&["route"])?.contains("10.244.3.0/24"));
    Ok(())
}
