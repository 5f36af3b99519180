//! `cargo xtask bench`: the same two-node topology, measured in one run as
//! edgevx (default: the conntrack-verified fast path where the kernel
//! allows it), edgevx with every packet through the host stack
//! (`--fast-path=off`), edgevx --bypass-netfilter, flannel-style kernel
//! VXLAN, and plain routing with no overlay. Prints ratios, and how much of
//! the receiving node's traffic the fast path carried; asserts nothing.
//!
//! Every setup carries what a kube-flannel node carries: kube-proxy's rules
//! (iptables mode: Service DNAT, the masquerade mark, KUBE-FORWARD's
//! ctstate INVALID drop) and flannel's --ip-masq and forward rules (edgevx's
//! own with `--ip-masq`, flanneld's written by hand elsewhere), so conntrack
//! is live in every setup and the comparison is fair. The exception is
//! `--bypass-netfilter`, which cannot pass KUBE-FORWARD's INVALID drop at
//! all; it runs where it is documented as safe, without kube-proxy's rules.
pub mod ipam;
pub mod profile;
pub mod scale;
pub mod xdp;
use std::{process::Stdio, thread::sleep, time::Duration};

use anyhow::{Context, Result, bail};
use edgevx_tests::{
    agent::Agent,
    kube_proxy::{self, KubeProxy, Mode, Proto, Service},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    real_node::flannel_iptables_rules,
    topo::subnet,
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
};
use serde_json::Value;

use crate::{
    build,
    deps::{packages, toolchain},
    exec,
};

#[derive(Clone, Copy)]
pub(crate) enum Setup {
    EdgevxDefault,
    EdgevxHostStack,
    EdgevxBypass,
    KernelVxlan,
    PlainRouting,
}

impl Setup {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Setup::EdgevxDefault => "edgevx (default: fast path where the kernel allows)",
            Setup::EdgevxHostStack => "edgevx --fast-path=off (host stack)",
            Setup::EdgevxBypass => "edgevx --bypass-netfilter (no kube-proxy rules)",
            Setup::KernelVxlan => "kernel VXLAN (flannel)",
            Setup::PlainRouting => "plain routing, no overlay",
        }
    }
}

struct Result3 {
    tcp_gbps: f64,
    tcp8_gbps: f64,
    udp_kpps: f64,
    rtt_us: f64,
    /// sockperf's TCP ping-pong latency (half a request/response round
    /// trip), 64-byte messages: TCP_RR, which conntrack's kfuncs do see
    /// (ping's ICMP they do not).
    rr_us: f64,
}

/// The fast path's share of a measurement (every measurement sends from
/// node1's pod to node2's), from the agents' counters: of the packets node2
/// decapsulated for its pod, how many its receive side carried past the
/// stack; of the packets node1 encapsulated, how many its send side did.
/// `None` where no agents run.
pub(crate) fn fast_share(agents: &[Agent]) -> Result<Option<Share>> {
    let [node1, node2, ..] = agents else { return Ok(None) };
    let ratio = |agent: &Agent, part: &str, whole: &str| -> Result<f64> {
        let c = &agent.status()?["counters"];
        let (part, whole) = (c[part].as_f64().unwrap_or(0.0), c[whole].as_f64().unwrap_or(0.0));
        Ok(if whole > 0.0 { (part / whole).min(1.0) } else { 0.0 })
    };
    // in packets: each pair counts the same skbs, where the bytes are not
    // measured alike (the decap counts the inner frame, the fast path its
    // IP packet: a 64-byte flood's byte share cannot reach 100%)
    Ok(Some(Share {
        received: ratio(node2, "fast_path_packets", "rx_stack_packets")?,
        sent: ratio(node1, "fast_path_sent_packets", "tx_packets")?,
    }))
}

/// Why the fast path left packets to the stack, both nodes summed: the
/// `fast_path_stack_*` counters that are not zero; `None` where no agents
/// run or the fast path is off.
fn stack_reasons(agents: &[Agent]) -> Result<Option<String>> {
    if agents.is_empty() {
        return Ok(None);
    }
    let mut sums: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for agent in agents {
        let status = agent.status()?;
        if status["fast_path"].as_str() != Some("on") {
            return Ok(None);
        }
        for (name, v) in status["counters"].as_object().into_iter().flatten() {
            if let (Some(reason), Some(v)) = (name.strip_prefix("fast_path_stack_"), v.as_u64()) {
                *sums.entry(reason.to_string()).or_default() += v;
            }
        }
    }
    let parts: Vec<String> = sums.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k}={v}")).collect();
    Ok(Some(if parts.is_empty() { String::from("none") } else { parts.join(" ") }))
}

/// See [`fast_share`].
#[derive(Clone, Copy)]
pub(crate) struct Share {
    pub received: f64,
    pub sent: f64,
}

/// Brings up `setup` on a fresh cluster; returns it and the agents keeping it alive.
pub(crate) fn bring_up(setup: Setup) -> Result<(Cluster, Vec<Agent>)> {
    let mut c = Cluster::new(2)?;
    let mut agents = Vec::new();
    match setup {
        Setup::EdgevxDefault | Setup::EdgevxHostStack | Setup::EdgevxBypass => {
            let nodes = c.dir.join("nodes.json");
            write(
                &nodes,
                &node_list(vec![
                    flannel_node(1, Some("02:11:00:00:00:01")),
                    flannel_node(2, Some("02:22:00:00:00:02")),
                ]),
            )?;
            let extra: &[&str] = match setup {
                Setup::EdgevxBypass => &["--ip-masq", "--bypass-netfilter", "--fast-path=off"],
                Setup::EdgevxHostStack => &["--ip-masq", "--fast-path=off"],
                _ => &["--ip-masq"],
            };
            for i in [1, 2] {
                c.host_mut(i).mount_bpffs()?;
                agents.push(Agent::start(c.host(i), &nodes, extra)?);
            }
        }
        Setup::KernelVxlan => {
            let macs = ["02:11:00:00:00:01", "02:22:00:00:00:02"];
            for (i, peer) in [(1u8, 2u8), (2, 1)] {
                c.host(i).kernel_vtep(macs[i as usize - 1])?;
                c.host(i).kernel_add_peer(peer, macs[peer as usize - 1])?;
            }
        }
        Setup::PlainRouting => {
            c.host(1).plain_route(2)?;
            c.host(2).plain_route(1)?;
        }
    }
    if matches!(setup, Setup::KernelVxlan | Setup::PlainRouting) {
        for i in [1, 2] {
            kube_proxy::feed(&c.host(i).ns, &["iptables-restore", "--noflush"], &flannel_iptables_rules(&subnet(i)))?;
        }
    }
    // a DNS-style Service and a TCP Service, both backed by node2's pod
    let services = [
        Service {
            cluster_ip: "10.96.0.10".parse()?,
            port: 53,
            proto: Proto::Udp,
            node_port: None,
            backend: (pod_ip(2), 53),
        },
        Service {
            cluster_ip: "10.96.0.20".parse()?,
            port: 80,
            proto: Proto::Tcp,
            node_port: Some(30080),
            backend: (pod_ip(2), 8080),
        },
    ];
    // the bypass hides half of each flow from conntrack, so KUBE-FORWARD's
    // INVALID drop stops it cold: it is measured where it is meant to run
    if !matches!(setup, Setup::EdgevxBypass) {
        for i in [1, 2] {
            KubeProxy::install(&c.host(i).ns, Mode::Iptables, &services)?;
        }
    }
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;
    wait_reachable(&c.host(2).pod, pod_ip(1), 10)?;
    Ok((c, agents))
}

/// Waits until `srv` (the `what` server in `server`) listens on TCP `port`:
/// a fixed pause before the client dials is too short in a TCG guest. A
/// server that does not listen within 30 s is stopped.
fn wait_listening(server: &Netns, srv: &mut std::process::Child, what: &str, port: u16) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let sport = format!(":{port}");
    while !server.run(&["ss", "-Hltn", "sport", "=", &sport]).is_ok_and(|l| !l.trim().is_empty()) {
        if std::time::Instant::now() > deadline {
            let _ = srv.kill();
            let _ = srv.wait();
            bail!("the {what} server in {} did not listen within 30 s", server.name);
        }
        sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub(crate) fn iperf(client: &Netns, server: &Netns, args: &[&str]) -> Result<Value> {
    let mut srv = server.cmd("iperf3").args(["-s", "-1"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    wait_listening(server, &mut srv, "iperf3", 5201)?;
    let mut all = vec!["iperf3", "-J", "-c"];
    let target = pod_ip(2).to_string();
    all.push(&target);
    all.extend_from_slice(args);
    let out = client.run(&all);
    let _ = srv.kill();
    let _ = srv.wait();
    let v: Value = serde_json::from_str(&out?).context("iperf3 JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3 {}: {e}", args.join(" "));
    }
    Ok(v)
}

/// sockperf's TCP ping-pong from `client` to a server in `server` for
/// `seconds`: its "Latency is X usec" (half the round trip).
fn tcp_rr(client: &Netns, server: &Netns, seconds: u32) -> Result<f64> {
    let ip = pod_ip(2).to_string();
    let mut srv = server
        .cmd("sockperf")
        .args(["server", "--tcp", "-i", &ip, "-p", "11111"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_listening(server, &mut srv, "sockperf", 11111)?;
    let t = seconds.to_string();
    let out = client.run(&["sockperf", "ping-pong", "--tcp", "-i", &ip, "-p", "11111", "-t", &t, "--msg-size", "64"]);
    let _ = srv.kill();
    let _ = srv.wait();
    let out = out?;
    out.lines()
        .find_map(|l| l.split("Latency is ").nth(1)?.split_whitespace().next()?.parse::<f64>().ok())
        .with_context(|| format!("no latency in sockperf's output:\n{out}"))
}

/// Seconds a UDP flood runs before it is measured. Conntrack assures a UDP
/// flow only once it has seen a reply and is still active 2 s after it was
/// created (nf_conntrack_proto_udp.c, `stream_ts`), and the fast path takes only
/// assured flows; a flood measured from its first packet would mix 2 s
/// of the stack path into every setup's figure. TCP needs no warm-up: its
/// flows are assured at the handshake and made liberal within
/// milliseconds.
pub(crate) const UDP_WARMUP_SECS: u32 = 3;

/// iperf3's arguments for `seconds` of 64-byte UDP at full rate, measured
/// after [`UDP_WARMUP_SECS`] (`-O`: those seconds are left out of the sums).
pub(crate) fn udp_flood_args(seconds: u32) -> Vec<String> {
    let (t, omit) = ((seconds + UDP_WARMUP_SECS).to_string(), UDP_WARMUP_SECS.to_string());
    ["-u", "-b", "0", "-l", "64", "-t", &t, "-O", &omit].map(String::from).to_vec()
}

/// An iperf3 TCP run's received rate, in Gbit/s.
pub(crate) fn tcp_gbps(result: &Value) -> Result<f64> {
    result["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .context("no received rate in iperf3's result")
}

/// An iperf3 UDP run's datagrams received per second, in thousands, over
/// the seconds it measured (`seconds` if it says none).
pub(crate) fn udp_kpps(result: &Value, seconds: u32) -> f64 {
    let sum = &result["end"]["sum"];
    let received = sum["packets"].as_f64().unwrap_or(0.0) - sum["lost_packets"].as_f64().unwrap_or(0.0);
    received / sum["seconds"].as_f64().filter(|s| *s > 0.0).unwrap_or(f64::from(seconds)) / 1e3
}

fn measure(c: &Cluster, seconds: u32) -> Result<Result3> {
    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    let t = seconds.to_string();
    let tcp = tcp_gbps(&iperf(p1, p2, &["-t", &t])?).context("tcp result")?;
    let tcp8 = tcp_gbps(&iperf(p1, p2, &["-t", &t, "-P", "8"])?).context("tcp -P 8 result")?;
    let udp = iperf(p1, p2, &udp_flood_args(seconds).iter().map(String::as_str).collect::<Vec<_>>())?;
    let udp = udp_kpps(&udp, seconds);
    let ping = p1.run(&["ping", "-n", "-q", "-c", "500", "-i", "0.002", &pod_ip(2).to_string()])?;
    let line = ping.lines().find(|l| l.contains("min/avg/max")).context("ping summary")?;
    let avg_ms: f64 = line
        .split('=')
        .nth(1)
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .context("ping avg")?;
    let rr_us = tcp_rr(p1, p2, seconds)?;
    Ok(Result3 { tcp_gbps: tcp, tcp8_gbps: tcp8, udp_kpps: udp, rtt_us: avg_ms * 1000.0, rr_us })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The same bench inside a guest booting a matrix kernel (`test/vm.rs`): this
/// xtask binary runs in it, on the host's build. Under TCG the absolute
/// figures mean nothing; the ratios are what the run is for.
fn in_vm(seconds: u32, rounds: u32, kernel: &str, tools: &toolchain::Tools) -> Result<()> {
    packages::ensure_vm()?;
    let me = std::env::current_exe().context("cannot find the xtask binary")?;
    crate::test::vm::run(&crate::test::vm::Run {
        kernel,
        command: vec![
            me.display().to_string(),
            "bench".into(),
            "--seconds".into(),
            seconds.to_string(),
            "--rounds".into(),
            rounds.to_string(),
        ],
        env: vec![(crate::test::vm::PREPARED_ENV.into(), "1".into())],
        path_env: tools.path_env(),
        job: "bench",
        patience: crate::test::vm::GUEST_PATIENCE,
        hot: Vec::new(),
        part: None,
    })
}

pub fn run(seconds: u32, rounds: u32, kernel: Option<&str>) -> Result<()> {
    // inside a matrix guest the host has built and installed everything
    if std::env::var_os(crate::test::vm::PREPARED_ENV).is_none() {
        packages::ensure()?;
        let tools = toolchain::ensure()?;
        build::agent(&tools)?;
        if let Some(kernel) = kernel {
            return in_vm(seconds, rounds, kernel, &tools);
        }
    }
    let root = exec::workspace_root();
    // SAFETY: single-threaded here; the harness reads it.
    unsafe { std::env::set_var("EDGEVX_BIN", root.join("target/release/edgevx")) };
    let setups =
        [Setup::EdgevxDefault, Setup::EdgevxHostStack, Setup::EdgevxBypass, Setup::KernelVxlan, Setup::PlainRouting];
    // rounds interleave the setups, so drift on the machine hits all of them alike
    let mut samples: Vec<Vec<Result3>> = setups.iter().map(|_| Vec::new()).collect();
    let mut shares: Vec<Vec<Share>> = setups.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds.max(1) {
        for (i, s) in setups.iter().enumerate() {
            eprintln!("bench: round {round}: {} ...", s.name());
            let (c, agents) = bring_up(*s)?;
            samples[i].push(measure(&c, seconds)?);
            shares[i].extend(fast_share(&agents)?);
            if let Some(reasons) = stack_reasons(&agents)? {
                eprintln!("bench: round {round}: {}: the packets it left to the stack, by reason: {reasons}", s.name());
            }
            drop(agents);
            drop(c);
        }
    }
    let results: Vec<Result3> = samples
        .iter()
        .map(|v| Result3 {
            tcp_gbps: median(v.iter().map(|r| r.tcp_gbps).collect()),
            tcp8_gbps: median(v.iter().map(|r| r.tcp8_gbps).collect()),
            udp_kpps: median(v.iter().map(|r| r.udp_kpps).collect()),
            rtt_us: median(v.iter().map(|r| r.rtt_us).collect()),
            rr_us: median(v.iter().map(|r| r.rr_us).collect()),
        })
        .collect();
    let kernel = &results[setups.len() - 2];
    let plain = &results[setups.len() - 1];
    if kernel.tcp_gbps <= 0.0 || plain.tcp_gbps <= 0.0 {
        bail!("a baseline measured zero");
    }
    println!(
        "\nTCP 1 and 8 streams, UDP 64-byte packets/s, TCP request/response latency (sockperf ping-pong, 64 B), \
         ping RTT; pod to pod across two namespaced nodes with kube-proxy's and flannel's rules; {seconds} s \
         each, median of {rounds} interleaved rounds\n"
    );
    println!(
        "| setup | TCP Gbit/s | TCP x8 Gbit/s | UDP 64B kpps | TCP RR us | ping RTT us | TCP vs plain | TCP x8 vs plain | pps vs plain | TCP RR vs plain | RTT vs plain | TCP vs kernel | TCP x8 vs kernel | pps vs kernel | TCP RR vs kernel |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (s, r) in setups.iter().zip(&results) {
        println!(
            "| {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
            s.name(),
            r.tcp_gbps,
            r.tcp8_gbps,
            r.udp_kpps,
            r.rr_us,
            r.rtt_us,
            r.tcp_gbps / plain.tcp_gbps,
            r.tcp8_gbps / plain.tcp8_gbps,
            r.udp_kpps / plain.udp_kpps,
            r.rr_us / plain.rr_us,
            r.rtt_us / plain.rtt_us,
            r.tcp_gbps / kernel.tcp_gbps,
            r.tcp8_gbps / kernel.tcp8_gbps,
            r.udp_kpps / kernel.udp_kpps,
            r.rr_us / kernel.rr_us,
        );
    }
    println!(
        "\n(latency ratios below 1.00x are better; throughput ratios above 1.00x are better; ping's ICMP is \
         outside the conntrack kfuncs, so the fast path cannot carry it: information only)"
    );
    for (s, share) in setups.iter().zip(&shares) {
        if matches!(s, Setup::EdgevxDefault) && !share.is_empty() {
            let mean = |f: fn(&Share) -> f64| share.iter().map(f).sum::<f64>() / share.len() as f64 * 100.0;
            println!(
                "{}: the fast path carried {:.0}% of the receiving node's packets and {:.0}% of the sending node's \
                 (mean of {} rounds; 0% where the kernel keeps it off)",
                s.name(),
                mean(|s| s.received),
                mean(|s| s.sent),
                share.len()
            );
        }
    }
    Ok(())
}
