//! `edgevx status` says whether the agent runs from the kernel's truth,
//! the holder of the node's lock, not from a recorded pid (issue 33,
//! finding 7): a record naming a live process that is not the agent (pid
//! 1, as a containerised agent records itself, or a reused pid) is "not
//! running"; an agent stuck waiting for its interface is "running", with
//! its pid and what it waits for.
use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{self, Agent},
    edgevx_bin,
    scenario::edgevx_and_flannel,
};
use serde_json::Value;

/// Rewrites the agent record's pid, as another pid namespace or pid reuse leaves it.
fn record_pid(state_dir: &Path, pid: u32) -> Result<()> {
    let path = state_dir.join("agent.json");
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&path)?).context("agent.json")?;
    rec["pid"] = pid.into();
    std::fs::write(&path, serde_json::to_vec(&rec)?)?;
    Ok(())
}

struct Sleeper(std::process::Child);
impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn status_says_running_from_the_locks_holder_not_a_recorded_pid() -> Result<()> {
    let mut s = edgevx_and_flannel(&[])?;
    let pid = s.agent.pid().context("pid")?;
    let st = agent::wait_status(&s.agent, Duration::from_secs(10), "forwarding", |v| v["agent_phase"] == "forwarding")?;
    ensure!(st["agent_running"] == true && st["agent_pid"] == pid, "{st:#}");
    s.agent.stop()?;
    let h = s.cluster.host(1);
    let st = agent::status(&h.ns, &h.state_dir(), &h.bpffs_dir())?;
    ensure!(st["agent_running"] == false && st["agent_pid"].is_null(), "stopped: {st:#}");

    // the record names a live process that is no agent: init (pid 1 is what a
    // containerised agent records) and an unrelated process on a reused pid
    let sleeper = Sleeper(Command::new("sleep").arg("60").spawn()?);
    for other in [1, sleeper.0.id()] {
        record_pid(&h.state_dir(), other)?;
        let st = agent::status(&h.ns, &h.state_dir(), &h.bpffs_dir())?;
        ensure!(st["agent_running"] == false, "pid {other} in the record reads as a running agent: {st:#}");
        let text =
            h.ns.cmd(&edgevx_bin().to_string_lossy())
                .args(["status", "--state-dir"])
                .arg(h.state_dir())
                .arg("--bpffs")
                .arg(h.bpffs_dir())
                .output()?;
        let text = String::from_utf8_lossy(&text.stdout);
        ensure!(text.contains("agent stopped"), "{text}");
    }

    // an agent stuck before its bring-up (its interface is not there): running,
    // saying what it waits for, although the record is its predecessor's
    let mut stuck =
        Agent::spawn_choosing_iface(h, &["--iface", "eth9", "--nodes-file", s.nodes_file.to_str().context("path")?])?;
    stuck.wait_log("not ready to bring up the dataplane", Duration::from_secs(20))?;
    let spid = stuck.pid().context("pid")?;
    let st = agent::wait_status(&stuck, Duration::from_secs(10), "waiting", |v| {
        v["agent_phase"].as_str().is_some_and(|p| p.starts_with("waiting for the host"))
    })?;
    ensure!(st["agent_running"] == true && st["agent_pid"] == spid, "stuck: {st:#}");
    ensure!(st["agent_phase"].as_str().is_some_and(|p| p.contains("eth9")), "{st:#}");

    // and with no record at all (a new node): running, nothing brought up yet
    stuck.stop()?;
    let fresh = s.cluster.dir.join("fresh-state");
    let mut new =
        h.ns.cmd(&edgevx_bin().to_string_lossy())
            .args(["run", "--node-name", "node1", "--iface", "eth9", "--nodes-file"])
            .arg(&s.nodes_file)
            .arg("--state-dir")
            .arg(&fresh)
            .arg("--bpffs")
            .arg(h.bpffs_dir())
            .arg("--subnet-file")
            .arg(s.cluster.dir.join("fresh-subnet.env"))
            .stderr(std::process::Stdio::null())
            .spawn()?;
    let new_pid = new.id();
    let result = (|| -> Result<()> {
        let st = edgevx_tests::patience(Duration::from_secs(20));
        let deadline = std::time::Instant::now() + st;
        loop {
            let v = agent::status(&h.ns, &fresh, &h.bpffs_dir());
            if let Ok(v) = &v
                && v["agent_running"] == true
                && v["agent_phase"].as_str().is_some_and(|p| p.starts_with("waiting for the host"))
            {
                ensure!(v["agent_pid"] == new_pid && v["node"].is_null(), "{v:#}");
                return Ok(());
            }
            ensure!(std::time::Instant::now() < deadline, "a new node's waiting agent: {v:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    })();
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(new_pid as i32, libc::SIGTERM) };
    let _ = new.wait();
    result
}
