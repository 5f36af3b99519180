//! Resource exhaustion never reaches the dataplane (issue 18, item 4): a
//! flood of idle connections to the metrics port, under containerd 2's
//! default open-files limit (1,024 soft), costs the agent a bounded number
//! of descriptors; it never reads the shortage as "the device is gone", and
//! it keeps applying what its source says.
use std::{
    process::{Child, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, wait_status},
    nodes::{flannel_node, node_list, write},
    patience,
    topo::{Cluster, pod_ip, underlay_ip},
    traffic::{BackgroundPing, wait_reachable},
};

use crate::KERNEL_MAC;

/// Opens N non-blocking TCP connections to ADDR:PORT and holds them for
/// HOLD seconds (its own open-files limit raised first).
const FLOOD: &str = r#"
import resource, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
addr, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
held = []
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((addr, port))
    except BlockingIOError:
        pass
    held.append(s)
print('open', flush=True)
time.sleep(hold)
"#;

/// The agent's cap on metrics connections (`metrics::server::MAX_CONNECTIONS`).
const METRICS_MAX_CONNECTIONS: usize = 256;

/// Connections the review held: more than the 1,024 soft limit.
const FLOODED: u32 = 1100;

struct Flood(Child);
impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd")).context("the agent's fds")?.count())
}

#[test]
fn a_connection_flood_on_the_metrics_port_leaves_the_agent_applying_its_view() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    // node3 is only an entry in the source: the test is what node1 programs
    let node = |i: u8| flannel_node(i, Some(&format!("02:00:00:00:00:0{i}")));
    write(&nodes, &node_list((1..=3).map(node).collect()))?;
    let metrics = format!("{}:9117", underlay_ip(1));
    // containerd 2's limits: 1,024 soft, a higher hard limit
    let wrapper = ["prlimit", "--nofile=1024:4096", "--"];
    let mut agent = Agent::spawn_via(
        c.host(1),
        &wrapper,
        &["--nodes-file", nodes.to_str().context("path")?, "--metrics-addr", &metrics],
    )?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let pid = agent.pid().context("pid")?;
    wait_status(&agent, Duration::from_secs(5), "both peers", |s| s["peers"].as_array().is_some_and(|p| p.len() == 2))?;
    let before = open_fds(pid)?;

    // the flood, from another node, held for as long as the test needs
    let hold = patience(Duration::from_secs(60)).as_secs().to_string();
    let mut child = c
        .host(2)
        .ns
        .cmd("python3")
        .args(["-c", FLOOD, &underlay_ip(1).to_string(), "9117", &FLOODED.to_string(), &hold])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the flood")?;
    let out = child.stdout.take().context("the flood's stdout")?;
    let flood = Flood(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)?;
    ensure!(line.trim() == "open", "the flood did not start: {line:?}");
    // let the agent accept what it will, and pass a check or two
    std::thread::sleep(Duration::from_secs(2));

    // while it holds: a peer leaves the source, and the agent applies it
    write(&nodes, &node_list((1..=2).map(node).collect()))?;
    wait_status(&agent, Duration::from_secs(15), "node3 removed under the flood", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 1)
    })?;
    let during = open_fds(pid)?;
    let cap = METRICS_MAX_CONNECTIONS;
    ensure!(
        during <= before + cap + 8,
        "the flood took {} descriptors (before {before}, now {during}); at most {cap} connections should be open",
        during - before
    );
    drop(flood);
    let log = agent.log_text();
    ensure!(!log.contains("gone; rebuilding"), "the shortage was read as a device gone:\n{log}");
    ensure!(agent.status()?["dataplane_attached"] == true, "the dataplane is marked down");
    // and it raised its soft limit to the hard one at start
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits.lines().find(|l| l.starts_with("Max open files")).context("no open-files line")?;
    ensure!(line.split_whitespace().nth(3) == Some("4096"), "the soft limit was not raised to the hard one: {line}");
    Ok(())
}

/// Sets the open-files limit of process `pid` (`prlimit --pid`).
fn set_nofile(pid: u32, soft: usize, hard: usize) -> Result<()> {
    let st = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:{hard}")])
        .status()
        .context("cannot run prlimit")?;
    ensure!(st.success(), "prlimit --pid {pid} failed: {st}");
    Ok(())
}

/// The agent out of descriptors altogether (its limit lowered below what
/// it holds, so every open, socket and lookup fails with EMFILE) across a
/// resync and its checks: the dataplane is left as it is and forwards
/// throughout; nothing is read as "gone" or rebuilt; and when descriptors
/// come back, the view that changed meanwhile is applied.
#[test]
fn out_of_descriptors_the_agent_leaves_the_dataplane_forwarding_and_catches_up() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    let node3 = flannel_node(3, Some("02:00:00:00:00:03"));
    let list = |with3: bool| {
        let mut l = vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))];
        l.extend(with3.then(|| node3.clone()));
        node_list(l)
    };
    write(&nodes, &list(true))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10).context("pod1 -> pod2")?;
    let pid = agent.pid().context("pid")?;

    // 15 s of 20 ms pings, across more than one 10 s resync and its checks
    let ping = BackgroundPing::start(&c.host(1).pod, pod_ip(2), 750, "0.02")?;
    std::thread::sleep(Duration::from_millis(300));
    // 3: no new descriptor at all (the limit is on the number, and a lower
    // number freed meanwhile would otherwise be handed out again)
    set_nofile(pid, 3, 4096)?;
    // meanwhile a peer leaves the source (which cannot even open the file now)
    write(&nodes, &list(false))?;
    std::thread::sleep(Duration::from_secs(12));
    let starved = agent.log_text();
    set_nofile(pid, 4096, 4096)?;
    ping.expect_no_loss().context("pod1 -> pod2 while the agent had no descriptors")?;

    ensure!(!starved.contains("gone; rebuilding"), "the shortage was read as a device gone:\n{starved}");
    ensure!(
        starved.contains("cannot check the VTEP device and the attached programs"),
        "the agent never met the shortage in its checks (the test did not make the fault):\n{starved}"
    );
    wait_status(&agent, Duration::from_secs(20), "node3 removed once descriptors are back", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 1) && s["dataplane_attached"] == true
    })?;
    ensure!(!agent.log_text().contains("gone; rebuilding"), "rebuilt after:\n{}", agent.log_text());
    Ok(())
}
