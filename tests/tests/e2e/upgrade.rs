//! Upgrades with long-lived flows (Cilium's conn-disrupt practice): TCP
//! streams both ways between pods on three nodes (two edgevx nodes and a
//! kernel flannel node) survive each edgevx node's upgrade from the
//! previous release to this one and its downgrade back, and a restart into
//! the clsact fallback and back to TCX. No reset, no record lost, and every
//! way of every connection moves again within a liveness bound after each
//! step; the longest stall each step caused is measured and printed.
//!
//! The previous release's agent comes from `cargo xtask test` (built once
//! from its commit, xtask/src/build/previous.rs) in `EDGEVX_PREV_BIN`.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::Agent,
    flows::{Flows, NOTICED_GAP, Spec},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    sh,
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
};

use crate::KERNEL_MAC;

/// The previous release's agent (xtask/src/build/previous.rs sets it).
const PREV_BIN_ENV: &str = "EDGEVX_PREV_BIN";

/// Every way moves again this soon after the new agent is up: a liveness
/// bound (a flow that never comes back), not a claim about speed.
const MOVES_AGAIN: Duration = Duration::from_secs(10);

/// The previous agent; `None` (the test is skipped, saying how to run it)
/// outside CI. Under CI (`CI=true`) a missing one fails the test.
fn previous_agent() -> Result<Option<PathBuf>> {
    let how = format!(
        "{PREV_BIN_ENV} is not set: `cargo xtask test upgrade` builds the previous release's agent once \
         (target/previous/<commit>/edgevx) and sets it; or point {PREV_BIN_ENV} at an edgevx binary of that release"
    );
    match std::env::var_os(PREV_BIN_ENV).map(PathBuf::from) {
        Some(bin) if bin.is_file() => Ok(Some(bin)),
        Some(bin) => bail!("{PREV_BIN_ENV}={} is not a file", bin.display()),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => bail!("{how} (CI=true: not skipped)"),
        None => {
            eprintln!("SKIPPED: {how}");
            Ok(None)
        }
    }
}

/// Which agent a node runs, and how the one before it ends.
#[derive(Clone, Copy)]
enum Build {
    Previous,
    This,
}

#[derive(Clone, Copy)]
enum Ending {
    /// `systemctl stop`, or the kubelet ending the old pod: SIGTERM, waited for.
    Stop,
    /// The old pod's process killed outright.
    Kill,
}

struct Step {
    what: &'static str,
    node: u8,
    ending: Ending,
    to: Build,
    flags: &'static [&'static str],
    /// What the new agent's log must say (it took over, or switched).
    logs: &'static str,
}

#[test]
fn long_lived_flows_survive_upgrade_downgrade_and_a_switch_to_clsact_and_back() -> Result<()> {
    let Some(prev) = previous_agent()? else { return Ok(()) };
    let version = |bin: &std::path::Path| sh(&[&bin.to_string_lossy(), "--version"]);
    let (old, new) = (version(&prev)?, version(&edgevx_tests::edgevx_bin())?);
    ensure!(old != new, "{PREV_BIN_ENV} is this very build ({new}): nothing would be upgraded");
    eprintln!("previous: {}, this: {}", old.trim(), new.trim());
    let mut c = Cluster::new(3)?;
    let (m1, m2) = ("02:11:00:00:00:01", "02:22:00:00:00:02");
    let nodes = c.dir.join("nodes.json");
    write(
        &nodes,
        &node_list(vec![flannel_node(1, Some(m1)), flannel_node(2, Some(m2)), flannel_node(3, Some(KERNEL_MAC))]),
    )?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    // both edgevx nodes start on the previous release
    let mut agents =
        [Agent::start_bin(&prev, c.host(1), &nodes, &[])?, Agent::start_bin(&prev, c.host(2), &nodes, &[])?];
    let h3 = c.host(3);
    h3.kernel_vtep(KERNEL_MAC)?;
    h3.kernel_add_peer(1, m1)?;
    h3.kernel_add_peer(2, m2)?;
    for (from, to) in [(1, 2), (2, 1), (1, 3), (3, 1), (2, 3), (3, 2)] {
        wait_reachable(&c.host(from).pod, pod_ip(to), 20).with_context(|| format!("pod{from} -> pod{to}"))?;
    }

    // two connections each way between every pair of nodes, each streaming both ways
    let pairs = [(1u8, 2u8), (2, 1), (1, 3), (3, 1), (2, 3), (3, 2)];
    let specs: Vec<Spec> = pairs
        .iter()
        .enumerate()
        .map(|(k, &(from, to))| Spec {
            client: &c.host(from).pod,
            server: &c.host(to).pod,
            ip: pod_ip(to).into(),
            port: 7100 + k as u16,
            connections: 2,
        })
        .collect();
    let flows = Flows::start(&specs)?;
    flows.wait_all_moved(&vec![0; flows.ways().len()], MOVES_AGAIN).context("before any step")?;
    eprintln!("{} connections, {} ways, streaming", flows.ways().len() / 2, flows.ways().len());

    // the quiet flows' own longest gap, to read the steps' against
    let quiet = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let baseline = flows.longest_stall(quiet, Instant::now());

    let mut measured = Vec::new();
    for step in steps() {
        let i = step.node as usize - 1;
        let began = Instant::now();
        match step.ending {
            Ending::Stop => agents[i].stop().with_context(|| format!("{}: stopping the old agent", step.what))?,
            Ending::Kill => agents[i].kill9(),
        }
        let host = c.host(step.node);
        agents[i] = match step.to {
            Build::This => Agent::start(host, &nodes, step.flags),
            Build::Previous => Agent::start_bin(&prev, host, &nodes, step.flags),
        }
        .with_context(|| format!("{}: the new agent did not come up", step.what))?;
        let up = began.elapsed();
        let log = agents[i].log_text();
        ensure!(log.contains(step.logs), "{}: the new agent's log has no {:?}:\n{log}", step.what, step.logs);
        let since = flows.bytes();
        flows.wait_all_moved(&since, MOVES_AGAIN).with_context(|| format!("after: {}", step.what))?;
        // whatever the step stalled has moved again; a little longer, so
        // the way that resumed last is measured against a fresh read
        std::thread::sleep(Duration::from_millis(500));
        let errors = flows.errors();
        ensure!(errors.is_empty(), "{}: {} errors on the flows:\n  {}", step.what, errors.len(), errors.join("\n  "));
        let stall = flows.longest_stall(began, Instant::now());
        eprintln!("{}: agent up in {up:.0?}, longest stall {:.0?} {}", step.what, stall.longest, stall.way);
        measured.push((step.what, up, stall.longest));
    }
    let bytes = flows.stop().context("at the end")?;
    eprintln!("every way ended cleanly: {} MiB checked record by record", bytes >> 20);
    eprintln!("longest gap between two reads of any way (under {NOTICED_GAP:?}: 0), by step:");
    eprintln!("  {:<52} {:>8}", "no step (2 s of quiet flows)", format!("{:.0?}", baseline.longest));
    for (what, up, stall) in measured {
        eprintln!("  {what:<52} {:>8}   (agent up in {up:.0?})", format!("{stall:.0?}"));
    }
    Ok(())
}

/// The steps, in order: each edgevx node upgraded, node1 into the clsact
/// fallback and back (where the kernel has TCX), each downgraded again.
/// Every step's new agent must say it took the running dataplane over.
fn steps() -> Vec<Step> {
    let adopted = crate::features::adopted_in_place(crate::features::default_attach());
    let step = |what, node, ending, to, flags, logs| Step { what, node, ending, to, flags, logs };
    let mut steps = vec![
        step("upgrade node1, previous -> this", 1, Ending::Stop, Build::This, &[][..], adopted),
        step("upgrade node2, previous -> this (killed)", 2, Ending::Kill, Build::This, &[], adopted),
    ];
    if crate::features::attach_modes().contains(&"tcx") {
        let clsact = &["--tc-attach", "clsact"][..];
        let tcx = &["--tc-attach", "tcx"][..];
        steps.extend([
            step(
                "node1 into the clsact fallback",
                1,
                Ending::Stop,
                Build::This,
                clsact,
                "detached the TCX link of an earlier run",
            ),
            step("node1 back to TCX", 1, Ending::Stop, Build::This, tcx, "removed the clsact filter of an earlier run"),
        ]);
    } else {
        eprintln!("no TCX on this kernel (before 6.6): both agents run the clsact fallback, no switch to make");
    }
    steps.extend([
        step("downgrade node2, this -> previous", 2, Ending::Stop, Build::Previous, &[], adopted),
        step("downgrade node1, this -> previous", 1, Ending::Stop, Build::Previous, &[], adopted),
    ]);
    steps
}

/// The tool itself can fail: a path cut for a second is a stall of about
/// a second and no error; a reset is an error, named by its way.
#[test]
fn the_flow_tool_measures_a_stall_and_reports_a_reset() -> Result<()> {
    let tag = edgevx_tests::unique("fl");
    let (a, b) = (Netns::new(&format!("{tag}a"))?, Netns::new(&format!("{tag}b"))?);
    sh(&["ip", "link", "add", "eth0", "netns", &a.name, "type", "veth", "peer", "name", "eth0", "netns", &b.name])?;
    for (ns, ip) in [(&a, "10.99.0.1/24"), (&b, "10.99.0.2/24")] {
        ns.ip(&["addr", "add", ip, "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
    }
    let ip = |last: u8| std::net::IpAddr::from([10, 99, 0, last]);
    let specs = [
        Spec { client: &a, server: &b, ip: ip(2), port: 7001, connections: 1 },
        Spec { client: &b, server: &a, ip: ip(1), port: 7002, connections: 1 },
    ];
    let flows = Flows::start(&specs)?;
    flows.wait_all_moved(&[0; 4], MOVES_AGAIN)?;

    // the path goes for a second: every way stalls about that long, and resumes
    let cut = Instant::now();
    a.ip(&["link", "set", "eth0", "down"])?;
    std::thread::sleep(Duration::from_secs(1));
    a.ip(&["link", "set", "eth0", "up"])?;
    let since = flows.bytes();
    flows.wait_all_moved(&since, MOVES_AGAIN)?;
    let stall = flows.longest_stall(cut, Instant::now());
    ensure!(stall.longest >= Duration::from_millis(900), "a 1 s cut measured as {stall:?}");
    ensure!(flows.errors().is_empty(), "a cut is no error: {:?}", flows.errors());

    // every segment b receives is answered with a reset
    b.run(&["iptables", "-I", "INPUT", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])?;
    let deadline = Instant::now() + edgevx_tests::patience(Duration::from_secs(10));
    while flows.errors().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let errors = flows.errors();
    ensure!(errors.iter().any(|e| e.contains("reset")), "no reset reported: {errors:?}");
    // (dropped: the sockets are shut down; b's never learn of the resets,
    // so waiting for their end would only take the drain's bound)
    drop(flows);
    Ok(())
}
