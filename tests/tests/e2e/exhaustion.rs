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
    topo::{Cluster, underlay_ip},
};

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
const METRICS_MAX_CONNECTIONS: usize = 64;

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
    let mut agent =
        Agent::spawn_via(c.host(1), &wrapper, &["--nodes-file", nodes.to_str().context("path")?, "--metrics-addr", &metrics])?;
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
