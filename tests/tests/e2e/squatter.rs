//! An unprivileged process cannot keep the agent out (issue 33, finding 1).
//! A process running as `nobody` in the node's network namespace binds the
//! abstract socket `@edgevx/agent` (the lock until 0.2), holds the metrics
//! port, and loops trying to reach the new lock (the lock file and its
//! directories) while the agent is restarted. Its argv carries a newline
//! and a fake log line. The agent comes up all the same, forwards, applies
//! a change after a restart, answers its probes once the port is free, and
//! `edgevx cleanup` works; nothing the squatter wrote reaches the agent's
//! output.
use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{self, Agent, wait_status},
    nodes::{flannel_node, node_list, write},
    patience,
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::metrics::{get, until};

/// The squatter: binds `@edgevx/agent` and 127.0.0.1:9117, then tries the
/// new lock (opening, creating and locking the file, creating files or
/// directories next to it) every 2 ms; SIGUSR1 frees the port; on SIGTERM
/// it prints what it won.
const SQUAT: &str = r#"
import fcntl, os, signal, socket, sys, time
ino = os.stat('/proc/self/ns/net').st_ino
lock = '/run/edgevx/netns/%d.lock' % ino
won = []
name = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
name.bind('\0edgevx/agent')
port = socket.socket()
port.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
port.bind(('127.0.0.1', 9117))
port.listen(16)
def free_port(*_):
    port.close()
def done(*_):
    print('won %r' % won, flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, free_port)
signal.signal(signal.SIGTERM, done)
print('squatting uid %d' % os.getuid(), flush=True)
tries = 0
while True:
    for path in (lock, '/run/edgevx/netns/squat', '/run/edgevx/squat'):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            won.append(path)
        except OSError:
            won.append('opened ' + path)
    for d in ('/run/edgevx', '/run/edgevx/netns'):
        try:
            os.mkdir(d)
            won.append('mkdir ' + d)
        except OSError:
            pass
    tries += 1
    time.sleep(0.002)
"#;

/// What the squatter's argv carries: a newline and a log line of its own.
const INJECTED: &str = "INJECTED-by-the-squatter";

struct Squatter(Child);

impl Squatter {
    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }

    /// SIGTERM; what it says it won.
    fn finish(mut self) -> Result<String> {
        self.signal(libc::SIGTERM);
        let mut out = String::new();
        self.0.stdout.take().context("stdout")?.read_to_string(&mut out)?;
        let _ = self.0.wait();
        Ok(out)
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn squat(c: &Cluster) -> Result<Squatter> {
    let fake = format!("squat\n2026-11-28T00:00:00.000000Z ERROR edgevx: {INJECTED} the dataplane is gone");
    let mut child = c
        .host(1)
        .ns
        .cmd("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", SQUAT, &fake])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the squatter")?;
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
    let squatter = Squatter(child);
    ensure!(line.trim() == "squatting uid 65534", "the squatter did not start: {line:?}");
    // it holds the old name for real
    let unix = c.host(1).ns.run(&["cat", "/proc/net/unix"])?;
    ensure!(unix.contains("@edgevx/agent"), "the squatter holds no @edgevx/agent:\n{unix}");
    Ok(squatter)
}

fn no_injection(what: &str, text: &str) -> Result<()> {
    ensure!(!text.contains(INJECTED) && !text.contains("squat"), "{what} repeats the squatter's text:\n{text}");
    Ok(())
}

#[test]
fn a_process_of_nobody_cannot_keep_the_agent_out() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    let node = |i: u8| flannel_node(i, Some(&format!("02:00:00:00:00:0{i}")));
    write(&nodes, &node_list(vec![node(1), node(2)]))?;
    let _a2 = Agent::start(c.host(2), &nodes, &[])?;
    let squatter = squat(&c)?;
    let mut logs = String::new();

    // the agent comes up beside it, though its metrics port is taken, and forwards
    let mut a1 = Agent::start(c.host(1), &nodes, &[])?;
    ensure!(a1.log_text().contains("--metrics-addr 127.0.0.1:9117: cannot listen"), "{}", a1.log_text());
    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    wait_reachable(p1, pod_ip(2), 20)?;
    ensure!(ping(p1, pod_ip(2), 10, "0.05")? == (10, 10) && ping(p2, pod_ip(1), 10, "0.05")? == (10, 10));
    let pid = a1.pid().context("pid")?;
    let s = a1.status()?;
    ensure!(s["agent_running"] == true && s["agent_pid"] == pid, "{s:#}");

    // beside it, cleanup is refused naming the agent (the lock's holder), not the squatter
    let out = agent::cleanup(c.host(1), &[])?;
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    ensure!(out.status.code() == Some(2), "cleanup ran beside the agent: {err}");
    ensure!(err.contains(&format!("edgevx pid {pid} is still running")), "{err}");
    no_injection("the refusal", &err)?;

    // restarted, while the squatter loops: it comes back every time and applies a change
    for round in 0..3 {
        a1.stop()?;
        logs.push_str(&a1.log_text());
        a1 = Agent::start(c.host(1), &nodes, &[]).with_context(|| format!("restart {round}"))?;
    }
    write(&nodes, &node_list(vec![node(1), node(2), node(3)]))?;
    wait_status(&a1, Duration::from_secs(15), "node3 programmed after the restarts", |s| {
        s["peers"].as_array().is_some_and(|p| p.len() == 2 && p.iter().all(|p| p["in_dataplane"] == true))
    })?;
    ensure!(ping(p1, pod_ip(2), 10, "0.05")? == (10, 10));

    // the port freed: the probes answer, from the same agent
    squatter.signal(libc::SIGUSR1);
    until("/healthz once the port is free", patience(Duration::from_secs(15)), || {
        Ok(get(&c.host(1).ns, "/healthz").ok().filter(|r| r.status == 200))
    })?;

    // cleanup works once the agent is stopped, though the squatter still holds the old name
    a1.stop()?;
    logs.push_str(&a1.log_text());
    let unix = c.host(1).ns.run(&["cat", "/proc/net/unix"])?;
    ensure!(unix.contains("@edgevx/agent"), "the squatter let go of @edgevx/agent:\n{unix}");
    let out = agent::cleanup(c.host(1), &[])?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "cleanup failed: {text}");
    no_injection("cleanup", &text)?;

    let won = squatter.finish()?;
    ensure!(won.trim() == "won []", "the squatter reached the lock: {won}");
    no_injection("the agent's log", &logs)?;
    Ok(())
}
