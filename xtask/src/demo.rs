//! `cargo xtask demo`: build everything, then two nodes in network
//! namespaces, one edgevx and one kernel-VXLAN flannel node, pod traffic
//! between them, `edgevx status`, and a full teardown.
use std::process::Command;

use anyhow::{Context, Result};
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{Peer, ping, wait_reachable},
};

use crate::{build, exec, packages, toolchain};

const KERNEL_MAC: &str = "02:00:00:00:02:01";

fn step(text: &str) {
    eprintln!("\n==> {text}");
}

pub fn run() -> Result<()> {
    packages::ensure()?;
    let tools = toolchain::ensure()?;
    build::agent(&tools)?;
    build::testpeer()?;
    let root = exec::workspace_root();
    let bin = root.join("target/release/edgevx");
    // SAFETY: single-threaded at this point; the harness reads it.
    unsafe { std::env::set_var("EDGEVX_BIN", &bin) };

    step("two nodes on a veth underlay (198.18.0.0/24), one pod each (10.244.1.2, 10.244.2.2)");
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    eprintln!("nodes file {} (a NodeList with flannel's annotations)", nodes.display());

    step("node1: edgevx run (TC encap on flannel.1, decap on eth0; no fdb, no arp)");
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().context("no MAC")?.to_string();
    eprintln!("node1 VTEP MAC {mac} (saved in {})", c.host(1).state_dir().display());

    step("node2: unmodified flannel-style kernel VXLAN (flannel.1 + arp + fdb + route, as flanneld sets them)");
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    eprint!("{}", c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?);

    step("pod traffic");
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    let (tx, rx) = ping(&c.host(1).pod, pod_ip(2), 5, "0.2")?;
    eprintln!("ping pod1 -> pod2: {rx}/{tx} replies");
    let (tx, rx) = ping(&c.host(2).pod, pod_ip(1), 5, "0.2")?;
    eprintln!("ping pod2 -> pod1: {rx}/{tx} replies");
    let peer = Peer::new(root.join("target/release/edgevx-testpeer"));
    let digest = peer.tcp_transfer(&c.host(1).pod, &c.host(2).pod, pod_ip(2), 64 << 20)?;
    eprintln!("TCP 64 MiB pod1 -> pod2, digests equal: {digest}");

    step("edgevx status (reads the pinned maps)");
    exec::run(
        Command::new(&bin)
            .args(["status", "--state-dir"])
            .arg(c.host(1).state_dir())
            .arg("--bpffs")
            .arg(c.host(1).bpffs_dir()),
    )?;

    step("teardown: stop the agent, edgevx cleanup, delete the namespaces");
    drop(agent);
    exec::run(
        c.host(1)
            .ns
            .cmd(bin.to_str().context("path")?)
            .args(["cleanup", "--state-dir"])
            .arg(c.host(1).state_dir())
            .arg("--bpffs")
            .arg(c.host(1).bpffs_dir()),
    )?;
    drop(c);
    eprintln!("\ndemo finished; nothing is left behind");
    Ok(())
}
