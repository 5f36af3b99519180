//! Rolling an edgevx node back to flanneld (docs/src/migrating.md, "Rolling
//! a node back to flanneld") under pings in both directions: the agent stops, flanneld
//! adopts flannel.1 with the MAC edgevx kept, `edgevx cleanup --keep-vtep`
//! hands the kernel every peer and removes the programs. What the path may
//! lose is stated in migrating.md as a count of pings: [`LOSS_BOUND`].
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent, edgevx_bin,
    scenario::{EdgevxAndFlannel, KERNEL_MAC, edgevx_and_flannel},
    topo::{pod_ip, underlay_ip},
    traffic::{BackgroundPing, ping},
};

/// Pings lost per direction, at most, across the documented rollback. The
/// path has no moment without a forwarding path: before the programs go the
/// kernel holds every peer's entries, and the device (its MAC, address and
/// routes) never changes. Measured: 0 in every run.
const LOSS_BOUND: u32 = 0;

/// Pings per direction, at 10 ms: the rollback happens in their middle.
const PINGS: u32 = 400;

fn pings_both_ways(s: &EdgevxAndFlannel) -> Result<Vec<BackgroundPing>> {
    let c = &s.cluster;
    let pingers = [(2u8, 1u8), (1, 2)]
        .into_iter()
        .map(|(from, to)| BackgroundPing::start(&c.host(from).pod, pod_ip(to), PINGS, "0.01"))
        .collect::<Result<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(pingers)
}

/// Waits for the pings and checks each direction against [`LOSS_BOUND`].
// the bound is 0 today, which makes `<=` look absurd to clippy; it is the documented figure
#[allow(clippy::absurd_extreme_comparisons)]
fn check_loss(pingers: Vec<BackgroundPing>, what: &str) -> Result<()> {
    for (p, dir) in pingers.into_iter().zip(["node2 -> node1", "node1 -> node2"]) {
        let lost = p.lost()?;
        eprintln!("{what}: {dir} lost {lost} of {PINGS} pings");
        ensure!(lost <= LOSS_BOUND, "{what}: {dir} lost {lost} of {PINGS} pings, more than the {LOSS_BOUND} stated");
    }
    Ok(())
}

/// The node is a kernel flannel node as flanneld leaves one: the VTEP with
/// the MAC peers know, answering ARP, flanneld's entries for node2, no
/// programs, no pins and no edgevx chains; pods talk both ways.
fn check_kernel_flannel_node(s: &EdgevxAndFlannel) -> Result<()> {
    let h = s.cluster.host(1);
    let link = h.ns.ip(&["-d", "link", "show", "flannel.1"])?;
    ensure!(link.contains(&s.mac), "flannel.1 lost the MAC {}: {link}", s.mac);
    ensure!(!link.contains("NOARP"), "flannel.1 is still NOARP: {link}");
    let fdb = h.ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?;
    ensure!(fdb.contains(&format!("{KERNEL_MAC} dst {}", underlay_ip(2))), "no fdb entry for node2: {fdb}");
    let arp = h.ns.ip(&["neigh", "show", "dev", "flannel.1"])?;
    ensure!(arp.contains(&format!("10.244.2.0 lladdr {KERNEL_MAC} PERMANENT")), "no arp entry for node2: {arp}");
    ensure!(
        h.ns.ip(&["route"])?.contains("10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink"),
        "node2's route is gone"
    );
    ensure!(h.subnet_file().exists(), "subnet.env was removed: pods created before flanneld rewrites it would fail");
    // (a fresh bpffs holds the kernel's maps.debug and progs.debug)
    let pins: Vec<_> =
        std::fs::read_dir(h.bpffs_dir())?.flatten().map(|e| e.path()).filter(|p| p.extension().is_none()).collect();
    ensure!(pins.is_empty(), "pins left behind: {pins:?}");
    let rules = h.ns.run(&["iptables-save"])?;
    ensure!(!rules.contains("EDGEVX"), "edgevx's chains are left: {rules}");
    ensure!(!h.state_dir().join("agent.json").exists(), "the agent record is left");
    // no programs: the kernel carries everything
    ensure!(ping(&h.pod, pod_ip(2), 10, "0.05")? == (10, 10), "node1 -> node2 after the rollback");
    ensure!(ping(&s.cluster.host(2).pod, pod_ip(1), 10, "0.05")? == (10, 10), "node2 -> node1 after the rollback");
    Ok(())
}

#[test]
fn rolling_back_to_flanneld_keeps_the_node_forwarding() -> Result<()> {
    // as the DaemonSet runs it, with every way of attaching the programs this kernel has
    for attach in crate::features::attach_modes() {
        roll_back(attach).with_context(|| format!("attached with {attach}"))?;
    }
    Ok(())
}

fn roll_back(attach: &str) -> Result<()> {
    let mut s = edgevx_and_flannel(&["--ip-masq", "--tc-attach", attach])?;
    let pingers = pings_both_ways(&s)?;

    // 1. the agent stops: the kubelet ends edgevx's pod when the label goes
    //    (or `systemctl stop edgevx`); the pinned dataplane keeps forwarding
    s.agent.stop()?;
    // 2. flanneld starts: flannel.1 exists and is compatible, so it keeps
    //    the device and its MAC, and writes its arp, fdb and route per lease
    s.cluster.host(1).kernel_add_peer(2, KERNEL_MAC)?;
    // 3. edgevx cleanup --keep-vtep: the programs go, the kernel carries on
    let out = agent::cleanup(s.cluster.host(1), &["--keep-vtep"])?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "cleanup --keep-vtep failed: {log}");
    ensure!(log.contains("kept, with its MAC"), "{log}");

    check_loss(pingers, "the rollback").with_context(|| log.clone())?;
    check_kernel_flannel_node(&s).with_context(|| log.clone())?;
    // the saved MAC stays for a later return to edgevx
    ensure!(s.cluster.host(1).state_dir().join("vtep-mac").exists(), "the saved MAC was removed");
    Ok(())
}

#[test]
fn cleanup_keep_vtep_alone_leaves_a_kernel_node_that_forwards() -> Result<()> {
    // the other order: the agent stops and cleanup runs before flanneld is
    // back (a slow image pull, a systemd host): the kernel must already
    // have node2's entries, written by cleanup from the agent's peer list
    let mut s = edgevx_and_flannel(&[])?;
    let pingers = pings_both_ways(&s)?;
    s.agent.stop()?;
    let out = agent::cleanup(s.cluster.host(1), &["--keep-vtep"])?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "cleanup --keep-vtep failed: {log}");
    ensure!(log.contains("arp_added=1") && log.contains("fdb_added=1"), "cleanup wrote no entries: {log}");
    check_loss(pingers, "cleanup before flanneld").with_context(|| log.clone())?;
    check_kernel_flannel_node(&s).with_context(|| log.clone())?;

    // flanneld arriving later rewrites the same entries; nothing changes
    s.cluster.host(1).kernel_add_peer(2, KERNEL_MAC)?;
    check_kernel_flannel_node(&s)
}

#[test]
fn cleanup_refuses_what_it_cannot_do_safely() -> Result<()> {
    // beside a running agent: it would detach the programs, and the agent
    // would attach them again within a second
    let mut s = edgevx_and_flannel(&[])?;
    for extra in [&[][..], &["--keep-vtep"]] {
        let out = agent::cleanup(s.cluster.host(1), extra)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.code() == Some(2), "cleanup {extra:?} ran beside the agent: {err}");
        ensure!(err.contains("still running") && err.contains("stop it first"), "{err}");
    }
    ensure!(s.agent.status()?["dataplane_attached"] == true, "the refused cleanup changed the dataplane");

    // --keep-vtep with a state dir that has no record: it could not hand the peers over
    s.agent.stop()?;
    let h = s.cluster.host(1);
    let empty = s.cluster.dir.join("empty-state");
    let out =
        h.ns.cmd(&edgevx_bin().to_string_lossy())
            .args(["cleanup", "--keep-vtep", "--state-dir"])
            .arg(&empty)
            .arg("--bpffs")
            .arg(h.bpffs_dir())
            .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(2) && err.contains("no agent record"), "{err}");
    ensure!(agent::status(&h.ns, &h.state_dir(), &h.bpffs_dir())?["dataplane_attached"] == true, "it detached anyway");
    ensure!(ping(&h.pod, pod_ip(2), 5, "0.05")? == (5, 5), "node1 -> node2 after the refusal");
    Ok(())
}

/// On a kernel without TCX the agent adds clsact qdiscs for its filters;
/// `edgevx cleanup` takes them with the filters, and keeps one that still
/// holds somebody else's filter, with that filter.
#[test]
fn cleanup_removes_the_clsact_qdiscs_it_added_and_keeps_anothers() -> Result<()> {
    let mut s = edgevx_and_flannel(&["--tc-attach", "clsact"])?;
    let h = s.cluster.host(1);
    // someone else's classic-BPF filter on the pod bridge
    h.ns.run(&["tc", "filter", "add", "dev", "cni0", "ingress", "prio", "7", "bpf", "bytecode", "1,6 0 0 0"])?;
    s.agent.stop()?;
    let out = agent::cleanup(h, &[])?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "cleanup failed: {log}");
    let eth0 = h.ns.run(&["tc", "qdisc", "show", "dev", "eth0"])?;
    ensure!(!eth0.contains("clsact"), "the underlay's clsact qdisc stayed: {eth0}\n{log}");
    let cni0 = h.ns.run(&["tc", "qdisc", "show", "dev", "cni0"])?;
    ensure!(cni0.contains("clsact"), "the pod bridge's qdisc went with someone else's filter: {cni0}");
    let filters = h.ns.run(&["tc", "filter", "show", "dev", "cni0", "ingress"])?;
    ensure!(filters.contains("bytecode") && !filters.contains("edgevx"), "{filters}");
    ensure!(log.contains("kept the clsact qdisc"), "{log}");
    Ok(())
}
