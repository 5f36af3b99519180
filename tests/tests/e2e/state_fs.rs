//! A full or read-only state filesystem never stops forwarding (issue 33,
//! finding 5). The state dir is a tmpfs in a private mount namespace of
//! the node's (so is /run, where the agent keeps what the state dir cannot
//! take), filled up or remounted read-only between two runs, as a disk
//! fills or ext4 turns read-only after errors on an SD card. The agent
//! comes up, forwards, and `edgevx status` lists a peer added meanwhile.
use std::{
    fs,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, pod_ip},
    traffic::wait_reachable,
};

use crate::KERNEL_MAC;

/// A mount namespace of node `host`'s own, kept by a sleeping process:
/// mounts made in it are seen by what runs through [`PrivateMounts::via`]
/// and by nothing else, and go when the process does.
struct PrivateMounts {
    holder: Child,
    pid: String,
}

impl PrivateMounts {
    fn new(host: &Host) -> Result<Self> {
        // `ip netns exec` (the node's /sys) then unshare: both exec, so the pid is sleep's
        let holder = host
            .ns
            .cmd("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start the mount namespace's holder")?;
        let pid = holder.id().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() != "sleep" {
            ensure!(Instant::now() < deadline, "the holder never became sleep");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(PrivateMounts { holder, pid })
    }

    /// The wrapper that runs a command in this mount namespace (inside the node).
    fn via(&self) -> Vec<String> {
        ["nsenter", "-t", &self.pid, "-m", "--"].iter().map(|s| s.to_string()).collect()
    }

    /// `sh -c script` in this mount namespace, inside the node; its output.
    fn sh(&self, host: &Host, script: &str) -> Result<String> {
        let out = host.ns.cmd("nsenter").args(["-t", &self.pid, "-m", "--", "sh", "-c", script]).output()?;
        if !out.status.success() {
            bail!(
                "{script:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

impl Drop for PrivateMounts {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
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
    ensure!(
        log.matches("cannot write a record for edgevx status").count() <= 4,
        "said more than once a record:\n{log}"
    );
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
