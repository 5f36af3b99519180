//! What edgevx needs from the kernel, checked on this one (the version
//! check itself is unit-tested in agent/src/run/kernel.rs, since a test
//! cannot swap the kernel): kernel BTF is not among it.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    scenario::KERNEL_MAC,
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

/// Runs the command that follows in a private mount namespace in which
/// `/sys/kernel/btf/vmlinux` reads as empty, as on a kernel built without
/// CONFIG_DEBUG_INFO_BTF.
const WITHOUT_BTF: [&str; 8] = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    "mount --bind /dev/null /sys/kernel/btf/vmlinux && exec \"$@\"",
    "sh",
];

#[test]
fn the_dataplane_comes_up_and_forwards_without_kernel_btf() -> Result<()> {
    let mut c = Cluster::new(2)?;
    // the hiding works, or this test would prove nothing
    let mut probe = WITHOUT_BTF.to_vec();
    probe.extend(["wc", "-c", "/sys/kernel/btf/vmlinux"]);
    let size = c.host(1).ns.run(&probe)?;
    ensure!(size.trim_start().starts_with("0 "), "kernel BTF still readable: {size}");

    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let nodes = nodes.to_string_lossy().into_owned();
    let mut agent = Agent::spawn_via(c.host(1), &WITHOUT_BTF, &["--nodes-file", &nodes])?;
    // loading and attaching succeeded
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let mac = agent.status()?["vtep_mac"].as_str().context("status has no vtep_mac")?.to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20).with_context(|| agent.log_text())?;
    ensure!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")? == (5, 5), "node2 -> node1:\n{}", agent.log_text());
    ensure!(agent.status()?["counters"]["tx_packets"].as_u64() > Some(0), "the programs did not carry the traffic");
    Ok(())
}

/// The agent's probes agree with what upstream has on this kernel: BPF
/// atomics with fetch (5.12, the outer IP ID's shared counter) and
/// `bpf_check_mtu` decide between the full and the compat encap, and the
/// agent says which it loaded.
#[test]
fn the_agent_loads_the_encap_this_kernel_takes_and_says_why() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let log = agent.log_text();
    let probed = log.lines().find(|l| l.contains("kernel features probed")).context("no probe line")?;
    let atomic = !crate::features::before(5, 12);
    ensure!(probed.contains(&format!("atomic_fetch={atomic}")), "atomic_fetch should be {atomic}: {probed}");
    ensure!(probed.contains(&format!("check_mtu={}", crate::features::check_mtu())), "{probed}");
    let compat = log.contains("variant=\"edgevx_encap_compat\"");
    ensure!(compat != crate::features::full_encap(), "the encap loaded is not the one this kernel takes:\n{log}");
    Ok(())
}
