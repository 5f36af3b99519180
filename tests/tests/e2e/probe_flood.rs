//! Probes are answered whatever idle or slow clients do (issue 33, finding
//! 2). With the metrics port on all addresses, as the DaemonSet has it,
//! 1,000 idle connections and 50 clients sending a request head a byte at
//! a time come from another node on the underlay, and as many from the
//! node itself (as `nobody`); each reopens what the agent closes. Every
//! `/healthz` and `/readyz` probe is then answered within the DaemonSet's
//! `timeoutSeconds` (a contract, not a speed claim; the latencies are
//! printed), the agent's descriptors stay bounded, and pods keep talking.
use std::{
    io::BufRead,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    netns::Netns,
    patience,
    scenario::edgevx_and_flannel,
    topo::{pod_ip, underlay_ip},
    traffic::BackgroundPing,
};
use serde::Deserialize;
use serde_json::Value;

use crate::metrics::get_at;

/// Keeps IDLE silent connections and SLOW ones sending a request head a
/// byte every 200 ms open to ADDR:PORT for HOLD seconds, opening a new one
/// for each the agent closes.
const FLOOD: &str = r#"
import resource, selectors, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
addr, port, idle, slow, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
head = b'GET /metrics HTTP/1.1\r\nHost: agent\r\nX-Slow: ' + b'a' * 200 + b'\r\n\r\n'
sel = selectors.DefaultSelector()
opened = [0]
def connect(kind):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((addr, port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        return
    sel.register(s, selectors.EVENT_READ, [kind, 0])
    opened[0] += 1
for _ in range(idle):
    connect('idle')
for _ in range(slow):
    connect('slow')
print('open', flush=True)
end = time.time() + hold
next_byte = 0.0
while time.time() < end:
    for key, _ in sel.select(timeout=0.05):
        try:
            data = key.fileobj.recv(65536)
        except OSError:
            data = b''
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            connect(key.data[0])
    if time.time() >= next_byte:
        next_byte = time.time() + 0.2
        for key in list(sel.get_map().values()):
            if key.data[0] == 'slow' and key.data[1] < len(head):
                try:
                    key.fileobj.send(head[key.data[1]:key.data[1] + 1])
                    key.data[1] += 1
                except OSError:
                    pass
"#;

const IDLE: u32 = 1000;
const SLOW: u32 = 50;

struct Flood(Child);

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn flood(ns: &Netns, wrapper: &[&str], addr: &str, hold: &str) -> Result<Flood> {
    let mut cmd = ns.cmd(wrapper.first().copied().unwrap_or("/usr/bin/python3"));
    if !wrapper.is_empty() {
        cmd.args(&wrapper[1..]).arg("/usr/bin/python3");
    }
    let mut child = cmd
        .args(["-c", FLOOD, addr, "9117", &IDLE.to_string(), &SLOW.to_string(), hold])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the flood")?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let flood = Flood(child);
    ensure!(line.trim() == "open", "the flood did not start: {line:?}");
    Ok(flood)
}

/// The DaemonSet's agent container.
fn daemonset_agent() -> Result<Value> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/daemonset.yaml");
    let ds = Value::deserialize(serde_yaml_ng::Deserializer::from_str(&std::fs::read_to_string(&path)?))?;
    Ok(ds["spec"]["template"]["spec"]["containers"][0].clone())
}

/// The address the DaemonSet has the agent listen on (EDGEVX_METRICS_ADDR).
pub(crate) fn daemonset_metrics_addr() -> Result<std::net::SocketAddr> {
    let agent = daemonset_agent()?;
    let env = agent["env"].as_array().into_iter().flatten();
    let addr = env.into_iter().find(|e| e["name"] == "EDGEVX_METRICS_ADDR").context("no EDGEVX_METRICS_ADDR")?;
    Ok(addr["value"].as_str().context("no value")?.parse()?)
}

/// The DaemonSet's probes: (path, timeoutSeconds), Kubernetes' default 1 s where unset.
pub(crate) fn probes() -> Result<Vec<(String, Duration)>> {
    let agent = daemonset_agent()?;
    ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| {
            let probe = &agent[*p];
            let at = probe["httpGet"]["path"].as_str().with_context(|| format!("{p} has no httpGet.path"))?;
            Ok((at.to_string(), Duration::from_secs(probe["timeoutSeconds"].as_u64().unwrap_or(1))))
        })
        .collect()
}

fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd")).context("the agent's fds")?.count())
}

#[test]
fn probes_are_answered_under_a_thousand_idle_and_slow_connections() -> Result<()> {
    let probes = probes()?;
    let metrics = daemonset_metrics_addr()?.to_string();
    let s = edgevx_and_flannel(&["--metrics-addr", &metrics])?;
    let node = &s.cluster.host(1).ns;
    let at = format!("{}:9117", underlay_ip(1));
    // ready before the flood
    crate::metrics::until("/readyz 200", patience(Duration::from_secs(20)), || {
        Ok(get_at(node, &at, "/readyz").ok().filter(|r| r.status == 200))
    })?;
    let pid = s.agent.pid().context("pid")?;
    let before = open_fds(pid)?;

    let hold = patience(Duration::from_secs(120)).as_secs().to_string();
    let ping = BackgroundPing::start(&s.cluster.host(1).pod, pod_ip(2), 300, "0.1")?;
    // from another node on the underlay, and from the node itself as nobody
    let _remote = flood(&s.cluster.host(2).ns, &[], &underlay_ip(1).to_string(), &hold)?;
    let _local = flood(node, &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], "127.0.0.1", &hold)?;
    // the floods hold their connections
    std::thread::sleep(Duration::from_secs(3));
    let established = node.run(&["ss", "-Htn", "state", "established", "( sport = :9117 )"])?.lines().count();
    eprintln!("connections to :9117 under the flood: {established}");

    for (path, timeout) in &probes {
        let mut took = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let r = get_at(node, &at, path).with_context(|| format!("{path} under the flood"))?;
            let dt = t.elapsed();
            ensure!(r.status == 200, "{path} answered {} under the flood: {}", r.status, r.body);
            ensure!(dt <= *timeout, "{path} took {dt:?}, beyond the probe's timeoutSeconds {timeout:?}");
            took.push(dt);
            std::thread::sleep(Duration::from_millis(100));
        }
        took.sort();
        eprintln!(
            "{path} under the flood: 20 of 20 answered; median {:?}, max {:?} (timeoutSeconds {timeout:?})",
            took[took.len() / 2],
            took[took.len() - 1]
        );
    }
    let during = open_fds(pid)?;
    let cap = 256;
    ensure!(
        during <= before + cap + 16,
        "the flood took {} descriptors (before {before}, now {during}); at most {cap} connections should be open",
        during.saturating_sub(before)
    );
    ping.expect_no_loss().context("pod1 -> pod2 under the flood")?;
    ensure!(s.agent.status()?["dataplane_attached"] == true, "the dataplane is marked down");
    Ok(())
}
