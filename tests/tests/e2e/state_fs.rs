//! A full or read-only state filesystem never stops forwarding (issue 33,
//! finding 5). The state dir is a tmpfs in a private mount namespace of
//! the node's (so is /run, where the agent keeps what the state dir cannot
//! take), filled up or remounted read-only between two runs, as a disk
//! fills or ext4 turns read-only after errors on an SD card. The agent
//! comes up, forwards, and `edgevx status` lists a peer added meanwhile.
use std::{fs, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    mount_ns::MountNs,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, pod_ip},
    traffic::wait_reachable,
};

use crate::KERNEL_MAC;

/// A mount namespace of node `host`'s own ([`MountNs`] inside the node).
struct PrivateMounts(MountNs);

impl PrivateMounts {
    fn new(host: &Host) -> Result<Self> {
        Ok(PrivateMounts(MountNs::new(host.ns.cmd("unshare"))?))
    }

    /// The wrapper that runs a command in this mount namespace (inside the node).
    fn via(&self) -> Vec<String> {
        self.0.via()
    }

    /// `sh -c script` in this mount namespace, inside the node; its output.
    fn sh(&self, host: &Host, script: &str) -> Result<String> {
        self.0.sh(host.ns.cmd("nsenter"), script)
    }

    /// Starts the agent of `host` in this mount namespace; `status` too.
    fn agent(&self, host: &Host, args: &[&str]) -> Result<Agent> {
        let via = self.via();
        let via: Vec<&str> = via.iter().map(String::as_str).collect();
        let mut a = Agent::spawn_via(host, &via, args)?;
        a.status_via = self.via();
        Ok(a)
    }
}

/// The state dir (and /run) as tmpfs in `m`.
fn tmpfs_state(m: &PrivateMounts, host: &Host) -> Result<()> {
    let state = host.state_dir();
    fs::create_dir_all(&state)?;
    m.sh(
        host,
        &format!(
            "mount -t tmpfs -o size=1m,mode=0700 evxstate {0} && mount -t tmpfs -o mode=0755 evxrun /run",
            state.display()
        ),
    )?;
    Ok(())
}

/// Fills the filesystem of `dir` (in `m`) until a write fails; proves it.
fn fill(m: &PrivateMounts, host: &Host, name: &str) -> Result<()> {
    let dir = host.state_dir();
    m.sh(host, &format!("dd if=/dev/zero of={}/{name} bs=4k 2>/dev/null; true", dir.display()))?;
    ensure!(m.sh(host, &format!("echo x > {}/probe", dir.display())).is_err(), "the state filesystem is not full");
    Ok(())
}

/// Nodes 1 (edgevx, its state on a tmpfs in a private mount namespace)
/// and 2 (kernel flannel), node 1's first run done on a writable state dir.
fn first_run(c: &mut Cluster) -> Result<(PrivateMounts, String, String)> {
    c.host_mut(1).mount_bpffs()?;
    let m = PrivateMounts::new(c.host(1))?;
    tmpfs_state(&m, c.host(1))?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let nodes = nodes.to_string_lossy().into_owned();
    let mut a = m.agent(c.host(1), &["--nodes-file", &nodes])?;
    a.wait_log("dataplane up", Duration::from_secs(20))?;
    let mac = a.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    a.stop()?;
    Ok((m, nodes, mac))
}

/// A third node joins while node 1 runs: status must list it.
fn third_node_joins(c: &Cluster, agent: &Agent, nodes: &str, mac: &str) -> Result<()> {
    c.host(3).kernel_vtep(KERNEL_MAC)?;
    c.host(3).kernel_add_peer(1, mac)?;
    let all = vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC)), flannel_node(3, Some(KERNEL_MAC))];
    write(std::path::Path::new(nodes), &node_list(all))?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 20).with_context(|| agent.log_text())?;
    wait_status(agent, Duration::from_secs(10), "node3 listed", |s| peers(s).iter().any(|(n, _)| n == "node3"))?;
    Ok(())
}

#[test]
fn a_full_state_filesystem_never_stops_forwarding() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let (m, nodes, mac) = first_run(&mut c)?;
    fill(&m, c.host(1), "fill")?;

    // the disk filled up while the node was down: it comes up from what the state dir holds
    let mut a = m.agent(c.host(1), &["--nodes-file", &nodes])?;
    a.wait_log("dataplane up", Duration::from_secs(20))?;
    ensure!(a.status()?["vtep_mac"] == mac.as_str(), "the saved MAC was not used:\n{}", a.log_text());
    wait_reachable(&c.host(1).pod, pod_ip(2), 20).with_context(|| a.log_text())?;
    third_node_joins(&c, &a, &nodes, &mac)?;
    let log = a.log_text();
    ensure!(log.contains("keeping it under /run"), "{log}");
    // one warning per record (agent, peers, capacity, startup, ...), not one per write
    let mut warned = std::collections::BTreeMap::<&str, usize>::new();
    for line in log.lines().filter(|l| l.contains("cannot write a record for edgevx status")) {
        let file = line.split(" file=").nth(1).and_then(|f| f.split(' ').next()).unwrap_or(line);
        *warned.entry(file).or_default() += 1;
    }
    ensure!(!warned.is_empty() && warned.values().all(|n| *n == 1), "said more than once a record {warned:?}:\n{log}");
    a.stop()?;

    // a new node whose disk is full: no MAC saved; it comes up and says so
    m.sh(c.host(1), &format!("cd {} && find . -mindepth 1 ! -name fill -delete", c.host(1).state_dir().display()))?;
    fill(&m, c.host(1), "fill2")?;
    let mut a = m.agent(c.host(1), &["--nodes-file", &nodes])?;
    a.wait_log("dataplane up", Duration::from_secs(20))?;
    let log = a.log_text();
    ensure!(log.contains("THE MAC WILL CHANGE AT THE NEXT BOOT"), "{log}");
    let new_mac = a.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    c.host(2).kernel_add_peer(1, &new_mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20).with_context(|| a.log_text())?;
    ensure!(peers(&a.status()?).len() == 2, "status lists the peers from /run");
    Ok(())
}

#[test]
fn a_read_only_state_filesystem_never_stops_forwarding() -> Result<()> {
    let mut c = Cluster::new(3)?;
    let (m, nodes, mac) = first_run(&mut c)?;
    // ext4 remounted read-only after errors
    m.sh(c.host(1), &format!("mount -o remount,ro {}", c.host(1).state_dir().display()))?;
    ensure!(m.sh(c.host(1), &format!("touch {}/probe", c.host(1).state_dir().display())).is_err(), "still writable");

    let mut a = m.agent(c.host(1), &["--nodes-file", &nodes])?;
    a.wait_log("dataplane up", Duration::from_secs(20))?;
    ensure!(a.status()?["vtep_mac"] == mac.as_str(), "the saved MAC was not used:\n{}", a.log_text());
    wait_reachable(&c.host(1).pod, pod_ip(2), 20).with_context(|| a.log_text())?;
    third_node_joins(&c, &a, &nodes, &mac)?;
    let log = a.log_text();
    ensure!(log.contains("keeping it under /run") && !log.contains("taking it under /run instead"), "{log}");
    a.stop()?;

    // no lock file on the read-only filesystem: the lock is taken under /run
    let state = c.host(1).state_dir();
    m.sh(
        c.host(1),
        &format!("mount -o remount,rw {0} && rm {0}/agent.lock && mount -o remount,ro {0}", state.display()),
    )?;
    let mut a = m.agent(c.host(1), &["--nodes-file", &nodes])?;
    a.wait_log("dataplane up", Duration::from_secs(20))?;
    ensure!(a.log_text().contains("taking it under /run instead"), "{}", a.log_text());
    wait_reachable(&c.host(1).pod, pod_ip(3), 20).with_context(|| a.log_text())?;
    ensure!(peers(&a.status()?).len() == 2, "status lists the peers");
    Ok(())
}
