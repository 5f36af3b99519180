//! The DaemonSet grants CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON and nothing
//! else (deploy/base/daemonset.yaml). This runs the agent with exactly that
//! bounding set and no new privileges, and checks that it works. CAP_PERFMON:
//! before Linux 6.18 the verifier holds a loader without it to its Spectre
//! and pointer-leak rules, which refuse edgevx's programs on 5.10, 6.1 and
//! 6.12 (found by loading them there with only the other two); run this in
//! the kernel matrix to see it on those kernels.
use std::time::Duration;

use anyhow::Result;
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::KERNEL_MAC;

/// Whether this kernel charges BPF maps to RLIMIT_MEMLOCK (before 5.11).
fn memlock_charged() -> Result<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    Ok((major, minor) < (5, 11))
}

#[test]
fn agent_runs_with_only_cap_bpf_cap_net_admin_and_cap_perfmon() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?; // the host's bpffs, as the DaemonSet's hostPath gives it
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let caps = "-all,+bpf,+net_admin,+perfmon";
    let setpriv = ["setpriv", "--bounding-set", caps, "--inh-caps", caps, "--ambient-caps", caps, "--no-new-privs"];
    // before 5.11 maps are charged to the locked-memory limit, which the agent
    // cannot raise without CAP_SYS_RESOURCE: give it what a unit
    // (LimitMEMLOCK=infinity) or a runtime gives (from 5.11 memcg accounts them)
    let wrapper: Vec<&str> = if memlock_charged()? {
        ["prlimit", "--memlock=unlimited"].into_iter().chain(setpriv).collect()
    } else {
        setpriv.to_vec()
    };
    let nodes_s = nodes.to_string_lossy().into_owned();
    let mut agent = Agent::spawn_via(c.host(1), &wrapper, &["--nodes-file", &nodes_s])?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let pid_caps = std::fs::read_to_string(format!("/proc/{}/status", agent.pid().unwrap_or(0)))?;
    let eff = pid_caps.lines().find(|l| l.starts_with("CapEff:")).unwrap_or_default().to_string();
    // CAP_NET_ADMIN is bit 12, CAP_PERFMON bit 38, CAP_BPF bit 39
    assert_eq!(eff.split_whitespace().nth(1), Some("000000c000001000"), "{eff}");
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    assert_eq!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")?, (5, 5));
    // and it restarts with the same privileges, taking over what it attached:
    // its pinned TCX links (6.6 and later), or its clsact filters in place
    agent.stop()?;
    let mut agent = Agent::spawn_via(c.host(1), &wrapper, &["--nodes-file", &nodes_s])?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let log = agent.log_text();
    let taken_over =
        if log.contains(r#"attach="clsact""#) { "replaced the clsact filter in place" } else { "adopted pinned link" };
    assert!(log.contains(taken_over), "{log}");
    Ok(())
}
