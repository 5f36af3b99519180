//! Issue 34 item 5's "done when": `edgevx monitor` shows a spoofed VXLAN
//! packet from an attacker on the underlay, with its source and the reason
//! it was dropped; and `edgevx bugtool` writes an archive with what a report
//! needs and no key material.
use std::{
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use aya::maps::{Map, MapData, PerCpuArray};
use edgevx::dataplane::bpffs::PinDir;
use edgevx_common::monitor::{MON_BUDGET, MonitorBudget};
use edgevx_tests::{
    agent::Agent,
    edgevx_bin,
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
    unique,
};
use serde_json::Value;

use crate::injection::{ATTACKER, CLIENT, M1, M2, SEND};

/// `edgevx monitor --json` in a node, its lines arriving on a channel.
pub(crate) struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Monitor {
    pub(crate) fn start(ns: &Netns, a: &Agent) -> Result<Monitor> {
        let mut child = ns
            .cmd(&edgevx_bin().to_string_lossy())
            .args(["monitor", "--json", "--type", "drop", "--state-dir"])
            .arg(&a.state_dir)
            .arg("--bpffs")
            .arg(&a.bpffs)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start edgevx monitor")?;
        let forward = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            rx
        };
        let lines = forward(Box::new(child.stdout.take().context("stdout")?));
        let stderr = forward(Box::new(child.stderr.take().context("stderr")?));
        let m = Monitor { child, lines, stderr };
        // the banner comes once the watch is set (after any start-up log
        // line: a raised open-files limit, say)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut said = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = m.stderr.recv_timeout(left) else { break };
            if line.contains("showing drops") {
                return Ok(m);
            }
            said.push(line);
        }
        bail!("no banner from edgevx monitor in 10 s; it said {said:#?}")
    }

    /// The first event `want` accepts, within `secs`.
    pub(crate) fn wait(&self, secs: u64, want: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else { break };
            let v: Value = serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
            if want(&v) {
                return Ok(v);
            }
            seen.push(line);
        }
        bail!("no such event in {secs} s; saw {seen:#?}")
    }

    /// SIGINT, as Ctrl-C; what it says last.
    pub(crate) fn stop(mut self) -> Result<String> {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        ensure!(status.success(), "edgevx monitor exited with {status}");
        // to the end of its stderr: the forwarding thread ends there
        let said: Vec<String> = self.stderr.iter().collect();
        said.last().cloned().context("edgevx monitor said nothing at the end")
    }
}

/// A test that fails before `stop` leaves no monitor running.
impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Events the programs of `a`'s node have written, summed over CPUs.
fn events_sent(a: &Agent) -> Result<u64> {
    let path = PinDir::new(&a.bpffs).map(MON_BUDGET);
    let map = MapData::from_pin(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let budget: PerCpuArray<_, MonitorBudget> = PerCpuArray::try_from(Map::PerCpuArray(map))?;
    Ok(budget.get(&0, 0)?.iter().map(|b| b.sent).sum())
}

#[test]
fn monitor_shows_a_spoofed_vxlan_packet_with_its_source_and_reason() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.yaml");
    write(&nodes, &node_list(vec![flannel_node(1, Some(M1)), flannel_node(2, Some(M2))]))?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    let a1 = Agent::start(c.host(1), &nodes, &[])?;
    let _a2 = Agent::start(c.host(2), &nodes, &[])?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    let attacker = Netns::new(&unique("atk"))?;
    c.plug(&attacker, "swatk")?;
    attacker.ip(&["addr", "add", &format!("{ATTACKER}/24"), "dev", "eth0"])?;
    attacker.ip(&["link", "set", "eth0", "up"])?;

    let monitor = Monitor::start(&c.host(1).ns, &a1)?;
    let pod = pod_ip(1).to_string();
    // a stranger's VXLAN carrying a client's packet to node 1's pod
    attacker.run(&["python3", "-c", SEND, ATTACKER, "198.18.0.1", "udp", CLIENT, &pod, M1, "eth0"])?;
    let ev = monitor.wait(10, |v| v["reason"] == "drop_unknown_peer")?;
    assert_eq!(ev["type"], "drop", "{ev}");
    assert_eq!(ev["program"], "decap", "{ev}");
    assert_eq!(ev["direction"], "ingress", "{ev}");
    assert_eq!(ev["iface"], "eth0", "{ev}");
    assert_eq!(ev["outer"]["proto"], "udp", "{ev}");
    assert_eq!(ev["outer"]["src"], ATTACKER, "{ev}");
    assert_eq!(ev["outer"]["dst"], "198.18.0.1", "{ev}");
    assert_eq!(ev["outer"]["dport"], 8472, "{ev}");
    assert_eq!(ev["vni"], 1, "{ev}");
    assert_eq!(ev["inner"]["src"], CLIENT, "{ev}");
    assert_eq!(ev["inner"]["dst"], pod.as_str(), "{ev}");
    assert_eq!(ev["inner"]["dport"], 9999, "{ev}");
    assert_eq!(ev["peer"], Value::Null, "{ev}");
    let last = monitor.stop()?;
    assert!(last.contains("lost 0 to the rate limit"), "{last}");

    // nobody watches any more (the monitor ended its watch as it left):
    // the next one is counted, not written
    let b = a1.status()?["counters"]["drop_unknown_peer"].as_u64().unwrap_or(0);
    let sent = events_sent(&a1)?;
    attacker.run(&["python3", "-c", SEND, ATTACKER, "198.18.0.1", "udp", CLIENT, &pod, M1, "eth0"])?;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a1.status()?["counters"]["drop_unknown_peer"].as_u64().unwrap_or(0), b + 1);
    assert_eq!(events_sent(&a1)?, sent, "an event was written after the monitor left");
    Ok(())
}

#[test]
fn monitor_without_pins_asks_whether_edgevx_runs() -> Result<()> {
    let dir = std::env::temp_dir().join(unique("nopins"));
    let out = std::process::Command::new(edgevx_bin())
        .args(["monitor", "--bpffs"])
        .arg(&dir)
        .arg("--state-dir")
        .arg(&dir)
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is edgevx running here?") && err.contains("--bpffs"), "{err}");
    Ok(())
}

#[test]
fn bugtool_archives_what_a_report_needs_and_no_key() -> Result<()> {
    let ns = Netns::new(&unique("bug"))?;
    let dir = std::env::temp_dir().join(unique("bugtool"));
    std::fs::create_dir_all(&dir)?;
    // a log that holds a key, as a careless debug line might
    let log = dir.join("agent.log");
    std::fs::write(
        &log,
        "line 1\n-----BEGIN PRIVATE KEY-----\nSECRETKEYBYTES\n-----END PRIVATE KEY-----\nauthorization token: abc.SECRETTOKEN\n",
    )?;
    let out_file = dir.join("report.tar.gz");
    let out = ns
        .cmd(&edgevx_bin().to_string_lossy())
        .args(["bugtool", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--bpffs")
        .arg(dir.join("bpffs"))
        .arg("--log")
        .arg(&log)
        .arg("-o")
        .arg(&out_file)
        .output()?;
    ensure!(out.status.success(), "bugtool: {}", String::from_utf8_lossy(&out.stderr));
    let list = std::process::Command::new("tar").arg("-tzf").arg(&out_file).output()?;
    let list = String::from_utf8_lossy(&list.stdout);
    for member in [
        "report/version.txt",
        "report/status.json",
        "report/status.txt",
        "report/uname.txt",
        "report/kernel-features.txt",
        "report/ip-d-link.txt",
        "report/ip-route.txt",
        "report/agent.log",
    ] {
        assert!(list.lines().any(|l| l == member), "{member} missing from\n{list}");
    }
    let extract = dir.join("x");
    std::fs::create_dir_all(&extract)?;
    let x = std::process::Command::new("tar").arg("-xzf").arg(&out_file).arg("-C").arg(&extract).status()?;
    ensure!(x.success(), "tar -x failed");
    let all = std::process::Command::new("grep").args(["-rl", "SECRET"]).arg(&extract).output()?;
    assert!(all.stdout.is_empty(), "key material in {}", String::from_utf8_lossy(&all.stdout));
    let agent_log = std::fs::read_to_string(extract.join("report/agent.log"))?;
    assert!(agent_log.starts_with("line 1\n[private key removed"), "{agent_log}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
