//! `cargo xtask demo`: build everything, then two nodes in network
//! namespaces, one edgevx and one kernel-VXLAN flannel node, pod traffic
//! between them, `edgevx status`, and a full teardown.

use anyhow::{Context, Result};
use edgevx_tests::{
    scenario::{EdgevxAndFlannel, edgevx_and_flannel},
    topo::pod_ip,
    traffic::{Peer, ping},
};

use crate::{
    build,
    deps::{packages, toolchain},
    exec,
};

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
    eprintln!("node1: edgevx run from a nodes file (a NodeList with flannel's annotations)");
    eprintln!(
        "node2: an unmodified flannel-style node: kernel VXLAN flannel.1 plus flanneld's arp, fdb and route entries"
    );
    let EdgevxAndFlannel { cluster: c, agent, mac, nodes_file } = edgevx_and_flannel(&[])?;
    eprintln!("nodes file: {}", nodes_file.display());
    eprintln!(
        "node1 VTEP MAC {mac} (saved in {}); on node1 no fdb and no arp entries:",
        c.host(1).state_dir().display()
    );
    eprint!("{}", c.host(1).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?);
    eprintln!("node2's fdb entry for node1, as flanneld would write it:");
    eprint!("{}", c.host(2).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?);

    step("pod traffic");
    let (tx, rx) = ping(&c.host(1).pod, pod_ip(2), 5, "0.2")?;
    eprintln!("ping pod1 -> pod2: {rx}/{tx} replies");
    let (tx, rx) = ping(&c.host(2).pod, pod_ip(1), 5, "0.2")?;
    eprintln!("ping pod2 -> pod1: {rx}/{tx} replies");
    let peer = Peer::new(root.join("target/release/edgevx-testpeer"));
    let digest = peer.tcp_transfer(&c.host(1).pod, &c.host(2).pod, pod_ip(2), 64 << 20)?;
    eprintln!("TCP 64 MiB pod1 -> pod2, digests equal: {digest}");

    // in node1's namespace, where its agent runs: from anywhere else status
    // finds the programs but no agent, and says so with exit 3
    step("edgevx status in node1 (reads the pinned maps and the kernel; exit 0: forwarding)");
    exec::run(
        c.host(1)
            .ns
            .cmd(bin.to_str().context("path")?)
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
