//! Probes and metrics (`--metrics-addr`): scraped from inside the node's
//! namespace, where each agent binds its own 127.0.0.1:9117, while pods
//! talk; /readyz before the node is ready and while it is rebuilt; a
//! malformed address as a usage error, and an address the host cannot give
//! yet as something that never stops the dataplane.
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    agent::Agent,
    edgevx_bin,
    netns::{Netns, in_netns},
    nodes::{flannel_node, node_list, write},
    scenario::edgevx_and_flannel,
    topo::{Cluster, pod_ip, underlay_ip},
    traffic::BackgroundPing,
};

const METRICS: &str = "127.0.0.1:9117";

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// `GET path` from inside `ns`, with a plain HTTP/1.1 request.
pub(crate) fn get(ns: &Netns, path: &str) -> Result<Reply> {
    get_at(ns, METRICS, path)
}

/// One GET of `path` from `at` (IP:PORT), inside `ns`.
pub(crate) fn get_at(ns: &Netns, at: &str, path: &str) -> Result<Reply> {
    let (path, at) = (path.to_string(), at.to_string());
    in_netns(ns, move || {
        let addr: SocketAddr = at.parse()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n")?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8(raw).context("the reply is not UTF-8")?;
        let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("no header end in {text:?}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in {head:?}"))?;
        Ok(Reply { status, body: body.to_string() })
    })
}

/// Polls `f` until it returns `Some`, for up to `timeout`.
pub(crate) fn until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {timeout:?} (last error: {last})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn wait_status(ns: &Netns, path: &str, status: u16) -> Result<Reply> {
    until(&format!("{path} answering {status}"), Duration::from_secs(30), || {
        let r = get(ns, path)?;
        Ok((r.status == status).then_some(r))
    })
}

/// One scrape: every sample as (name, labels) -> value.
struct Scrape(BTreeMap<(String, BTreeMap<String, String>), f64>);

impl Scrape {
    fn take(ns: &Netns) -> Result<Scrape> {
        let r = get(ns, "/metrics")?;
        ensure!(r.status == 200, "/metrics answered {}: {}", r.status, r.body);
        Scrape::parse(&r.body)
    }

    fn parse(text: &str) -> Result<Scrape> {
        let mut out = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').with_context(|| format!("bad sample {line:?}"))?;
            let value: f64 = value.parse().with_context(|| format!("bad value in {line:?}"))?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}').with_context(|| format!("bad labels {line:?}"))?),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').with_context(|| format!("bad label in {line:?}"))?;
                map.insert(k.to_string(), v.trim_matches('"').to_string());
            }
            out.insert((name.to_string(), map), value);
        }
        ensure!(text.ends_with("# EOF\n"), "the exposition is not complete:\n{text}");
        Ok(Scrape(out))
    }

    /// The sample with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let key: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.0.get(&(name.to_string(), key)).copied().with_context(|| {
            let have: Vec<String> =
                self.0.keys().filter(|(n, _)| n == name).map(|(n, l)| format!("{n}{l:?}")).collect();
            format!("no {name}{labels:?}; the scrape has {have:?}")
        })
    }

    /// The sum over every sample of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|((n, l), _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, v)| v)
            .sum()
    }
}

fn peer2(direction: &'static str) -> [(&'static str, &'static str); 3] {
    [("peer_node", "node2"), ("peer_ip", "198.18.0.2"), ("direction", direction)]
}

/// VXLAN with our VNI from an address that is no peer: node 2's pod.
fn send_foreign_vxlan(from: &Netns, count: usize) -> Result<()> {
    in_netns(from, move || {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        let mut frame = vec![0x08, 0, 0, 0, 0, 0, 1, 0]; // flags I, VNI 1
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00]);
        frame.extend_from_slice(&[0u8; 28]);
        for _ in 0..count {
            sock.send_to(&frame, (underlay_ip(1), 8472))?;
        }
        Ok(())
    })
}

#[test]
fn metrics_move_with_traffic_and_name_the_peer() -> Result<()> {
    let s = edgevx_and_flannel(&[])?;
    let ns = &s.cluster.host(1).ns;
    wait_status(ns, "/readyz", 200)?;
    let health = get(ns, "/healthz")?;
    assert_eq!(health.status, 200, "{}", health.body);

    let before = Scrape::take(ns)?;
    let (tx0, rx0) = (
        before.value("edgevx_peer_packets_total", &peer2("egress"))?,
        before.value("edgevx_peer_packets_total", &peer2("ingress"))?,
    );
    // pings both ways, scraped while they run: the peer's counters only grow
    let pings = [(2u8, 1u8), (1, 2)]
        .into_iter()
        .map(|(from, to)| BackgroundPing::start(&s.cluster.host(from).pod, pod_ip(to), 300, "0.01"))
        .collect::<Result<Vec<_>>>()?;
    let (mut tx, mut rx, mut scrapes) = (tx0, rx0, 0);
    until("the peer's counters to grow by 200", Duration::from_secs(60), || {
        let now = Scrape::take(ns)?;
        let (t, r) = (
            now.value("edgevx_peer_packets_total", &peer2("egress"))?,
            now.value("edgevx_peer_packets_total", &peer2("ingress"))?,
        );
        assert!(t >= tx && r >= rx, "a counter went back: tx {tx} -> {t}, rx {rx} -> {r}");
        (tx, rx, scrapes) = (t, r, scrapes + 1);
        Ok((t >= tx0 + 200.0 && r >= rx0 + 200.0).then_some(()))
    })?;
    for p in pings {
        p.expect_no_loss()?;
    }
    let after = Scrape::take(ns)?;
    // 300 echo requests and 300 replies each way cross the tunnel
    assert!(after.value("edgevx_peer_packets_total", &peer2("egress"))? >= tx0 + 600.0, "scrapes: {scrapes}");
    assert!(after.value("edgevx_peer_packets_total", &peer2("ingress"))? >= rx0 + 600.0);
    assert!(
        after.value("edgevx_peer_bytes_total", &peer2("egress"))?
            >= before.value("edgevx_peer_bytes_total", &peer2("egress"))? + 600.0 * 84.0,
        "an echo is at least 84 bytes of IPv4"
    );
    assert_eq!(after.value("edgevx_peer_tx_errors_total", &[("peer_node", "node2"), ("peer_ip", "198.18.0.2")])?, 0.0);
    let encap = [("direction", "egress"), ("path", "encap")];
    assert!(after.value("edgevx_packets_total", &encap)? >= before.value("edgevx_packets_total", &encap)? + 600.0);
    assert!(after.value("edgevx_bytes_total", &encap)? > before.value("edgevx_bytes_total", &encap)?);
    let ingress = [("direction", "ingress")];
    assert!(after.sum("edgevx_packets_total", &ingress) >= before.sum("edgevx_packets_total", &ingress) + 600.0);
    // only one peer: exactly its series, no aggregate
    assert_eq!(after.value("edgevx_peers", &[])?, 1.0);
    assert_eq!(after.0.keys().filter(|(n, _)| n == "edgevx_peer_packets_total").count(), 2);

    // a drop by reason: VXLAN from a source that is not a peer
    let unknown = [("reason", "unknown_peer"), ("direction", "ingress")];
    let d0 = after.value("edgevx_drops_total", &unknown)?;
    send_foreign_vxlan(&s.cluster.host(2).pod, 5)?;
    until("5 unknown_peer drops", Duration::from_secs(20), || {
        Ok((Scrape::take(ns)?.value("edgevx_drops_total", &unknown)? >= d0 + 5.0).then_some(()))
    })?;

    // the loop, the source and the maps
    let m = until("a learned local pod", Duration::from_secs(20), || {
        let m = Scrape::take(ns)?;
        Ok((m.value("edgevx_map_entries", &[("map", "local_pods")])? >= 1.0).then_some(m))
    })?;
    assert!(m.value("edgevx_reconcile_passes_total", &[])? >= 1.0);
    for stage in ["bring_up", "readdress", "peers", "attach"] {
        assert_eq!(m.value("edgevx_reconcile_errors_total", &[("stage", stage)])?, 0.0, "{stage}");
    }
    assert!(m.value("edgevx_reconcile_duration_seconds_count", &[])? >= 1.0);
    assert_eq!(m.value("edgevx_map_entries", &[("map", "peer_subnets")])?, 1.0);
    assert_eq!(m.value("edgevx_map_entries", &[("map", "peer_stats")])?, 1.0);
    assert_eq!(m.value("edgevx_map_fill_ratio", &[("map", "peer_subnets")])?, 1.0 / 16384.0);
    assert_eq!(m.value("edgevx_source_connected", &[("source", "nodes file")])?, 1.0);
    let age = m.value("edgevx_source_last_view_age_seconds", &[("source", "nodes file")])?;
    assert!((0.0..600.0).contains(&age), "view age {age}");
    assert_eq!(m.value("edgevx_ready", &[])?, 1.0);
    assert_eq!(m.value("edgevx_dataplane_maps_readable", &[])?, 1.0);
    assert_eq!(get(ns, "/nothing")?.status, 404);
    Ok(())
}

#[test]
fn readyz_is_503_until_the_dataplane_is_up_and_while_it_is_rebuilt() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    // a list that does not name this node yet: the agent runs but cannot bring anything up
    write(&nodes, &node_list(vec![flannel_node(2, Some("02:00:00:00:02:01"))]))?;
    // spawned, not started: the harness's start waits for the dataplane, which this test holds back
    let nodes_arg = nodes.to_str().context("nodes path")?;
    let agent = Agent::spawn(h, &["--nodes-file", nodes_arg])?;
    let live = wait_status(&h.ns, "/healthz", 200).with_context(|| agent.log_text())?;
    assert!(live.body.contains("ticked"), "{}", live.body);
    let not_yet = until("the agent to read the list", Duration::from_secs(30), || {
        Ok(agent.log_text().contains("waiting for the nodes file").then_some(()))
    });
    not_yet.with_context(|| agent.log_text())?;
    let r = get(&h.ns, "/readyz")?;
    assert_eq!(r.status, 503, "ready without its own pod CIDR: {}", r.body);
    assert!(r.body.contains("starting"), "{}", r.body);
    let m = Scrape::take(&h.ns)?;
    assert_eq!(m.value("edgevx_ready", &[])?, 0.0);
    assert_eq!(m.value("edgevx_dataplane_maps_readable", &[])?, 0.0);

    // now it is named: subnet.env, the programs and a pass make it ready
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some("02:00:00:00:02:01"))]))?;
    wait_status(&h.ns, "/readyz", 200).with_context(|| agent.log_text())?;
    assert!(h.subnet_file().is_file());

    // break it so that the rebuild cannot finish: subnet.env cannot be written
    std::fs::remove_file(h.subnet_file())?;
    std::fs::create_dir(h.subnet_file())?;
    h.ns.ip(&["link", "del", "flannel.1"])?;
    let r = wait_status(&h.ns, "/readyz", 503).with_context(|| agent.log_text())?;
    assert!(r.body.contains("rebuilt"), "{}", r.body);
    until("a failed bring-up to be counted", Duration::from_secs(30), || {
        let m = Scrape::take(&h.ns)?;
        Ok((m.value("edgevx_dataplane_rebuilds_total", &[])? >= 1.0
            && m.value("edgevx_reconcile_errors_total", &[("stage", "bring_up")])? >= 1.0)
            .then_some(()))
    })?;
    assert_eq!(get(&h.ns, "/healthz")?.status, 200, "the loop is alive while it retries");
    assert_eq!(get(&h.ns, "/readyz")?.status, 503, "ready while subnet.env cannot be written");

    // repaired, and a new view (one more peer) to act on at once: ready again
    std::fs::remove_dir(h.subnet_file())?;
    let peers = vec![
        flannel_node(1, None),
        flannel_node(2, Some("02:00:00:00:02:01")),
        flannel_node(3, Some("02:00:00:00:03:01")),
    ];
    write(&nodes, &node_list(peers))?;
    wait_status(&h.ns, "/readyz", 200).with_context(|| agent.log_text())?;
    assert!(h.subnet_file().is_file());
    Ok(())
}

#[test]
fn a_metrics_addr_the_host_cannot_give_yet_never_stops_the_dataplane() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let nodes = nodes.to_str().context("path")?;
    // malformed: the operator must change it, exit 2 before anything changes
    let out =
        h.ns.cmd(edgevx_bin().to_str().context("bin path")?)
            .args(["run", "--node-name", "node1", "--iface", "eth0", "--nodes-file", nodes])
            .args(["--metrics-addr", "not-an-address", "--state-dir"])
            .arg(h.state_dir())
            .arg("--bpffs")
            .arg(h.bpffs_dir())
            .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--metrics-addr"), "the error should name --metrics-addr: {err}");
    assert!(!h.state_dir().exists(), "the state dir was written");

    // an address not on the host yet: the dataplane comes up regardless, and says so
    let mut agent = Agent::spawn(h, &["--nodes-file", nodes, "--metrics-addr", "192.0.2.1:9117"])?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    let log = agent.log_text();
    assert!(log.contains("--metrics-addr 192.0.2.1:9117: cannot listen") && log.contains("does not wait"), "{log}");
    agent.stop()?;

    // the port held by another process: the same, and served once it is free
    let taken = in_netns(&h.ns, || TcpListener::bind(METRICS).context("cannot take the port"))?;
    let mut agent = Agent::spawn(h, &["--nodes-file", nodes, "--metrics-addr", METRICS])?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    assert!(agent.log_text().contains(&format!("--metrics-addr {METRICS}: cannot listen")), "{}", agent.log_text());
    drop(taken);
    wait_status(&h.ns, "/readyz", 200).with_context(|| agent.log_text())?;
    Ok(())
}

#[test]
fn the_daemonset_probes_the_endpoints_on_a_named_port() -> Result<()> {
    use serde::Deserialize;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/daemonset.yaml");
    let text = std::fs::read_to_string(&path)?;
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_json::Value::deserialize(d).context("daemonset.yaml"))
        .collect::<Result<Vec<_>>>()?;
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").context("no DaemonSet")?;
    let containers = ds["spec"]["template"]["spec"]["containers"].as_array().context("no containers")?;
    let agent = containers.iter().find(|c| c["name"] == "edgevx").context("no edgevx container")?;
    let env = agent["env"].as_array().context("no env")?;
    let addr = env.iter().find(|e| e["name"] == "EDGEVX_METRICS_ADDR").context("EDGEVX_METRICS_ADDR is not set")?;
    let addr: SocketAddr = addr["value"].as_str().context("no value")?.parse()?;
    // the kubelet probes the pod IP, the node's address under hostNetwork
    assert!(addr.ip().is_unspecified(), "{addr} cannot be reached at the pod IP");
    // [::], both families: an IPv6-only node's kubelet probes its IPv6 address
    assert!(addr.is_ipv6(), "{addr} is IPv4 only: the probes of an IPv6-only node cannot reach it");
    let port = agent["ports"].as_array().into_iter().flatten().find(|p| p["name"] == "metrics").context("no port")?;
    assert_eq!(port["containerPort"].as_u64(), Some(u64::from(addr.port())));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &agent[probe]["httpGet"];
        assert_eq!((get["path"].as_str(), get["port"].as_str()), (Some(path), Some("metrics")), "{probe}");
    }
    Ok(())
}

#[test]
fn the_scrape_parser_reads_what_it_is_given() -> Result<()> {
    let s = Scrape::parse("# TYPE a counter\na_total{x=\"1\",y=\"b\"} 3\nb 0.5\n# EOF\n")?;
    assert_eq!(s.value("a_total", &[("y", "b"), ("x", "1")])?, 3.0);
    assert!(s.value("a_total", &[("x", "1")]).is_err(), "labels must match exactly");
    assert_eq!(s.sum("a_total", &[("x", "1")]), 3.0);
    assert_eq!(s.value("b", &[])?, 0.5);
    assert!(Scrape::parse("b 1\n").is_err(), "a cut-off exposition is refused");
    Ok(())
}
