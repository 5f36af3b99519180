//! `cargo xtask bench --xdp`: the XDP judge against TC alone, on node 1 of
//! the usual two-node namespace topology (its underlay `eth0` is a veth on
//! the switch). Prints figures and ratios; asserts nothing.
//!
//! The flood: a stranger's IPv4 VXLAN (198.18.0.66 to node 1, 64-byte
//! inner frame) sent by `edgevx_tests::xdpgen` from the switch's port
//! `sw1` with live-frame BPF_PROG_RUN, straight onto `eth0`'s receive ring
//! (no skb at the sender). `eth0` has GRO on in both setups: a veth needs
//! NAPI to take `ndo_xdp_xmit` frames without an XDP program of its own.
//! - XDP: `--xdp-judge=on`, the judge drops the flood in `eth0`'s NAPI;
//! - TC: `--xdp-judge=off`, the frames become skbs and decap drops them.
//!
//! Measured: (1) frames dropped per second with the generator pinned to
//! CPU 0 (the veth's NAPI runs on the CPU that sent, so generation and
//! drop share that core: a per-core figure of both); (2) TCP goodput pod 2
//! to pod 1 (through `eth0`) with iperf3 while the flood runs at rising rates.
use std::{
    process::Stdio,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use edgevx_tests::{
    agent::Agent,
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
    xdpgen::{self, Flood},
};
use serde_json::Value;

use crate::{
    build,
    deps::{packages, toolchain},
    exec,
};

#[derive(Clone, Copy, PartialEq)]
enum Judge {
    Tc,
    Xdp,
}

impl Judge {
    fn name(self) -> &'static str {
        match self {
            Judge::Tc => "TC decap alone (--xdp-judge=off)",
            Judge::Xdp => "XDP judge, native on veth (--xdp-judge=on)",
        }
    }
}

/// Flood rates for the goodput run, frames per second (0: none).
const RATES: [u64; 4] = [0, 100_000, 300_000, u64::MAX];

fn bring_up(judge: Judge) -> Result<(Cluster, Vec<Agent>)> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.json");
    write(
        &nodes,
        &node_list(vec![flannel_node(1, Some("02:11:00:00:00:01")), flannel_node(2, Some("02:22:00:00:00:02"))]),
    )?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    // NAPI on the veth either way, so the generator can reach it
    c.host(1).ns.run(&["ethtool", "-K", "eth0", "gro", "on"])?;
    let flag = if judge == Judge::Xdp { "--xdp-judge=on" } else { "--xdp-judge=off" };
    let a1 = Agent::start(c.host(1), &nodes, &[flag])?;
    let a2 = Agent::start(c.host(2), &nodes, &[])?;
    wait_reachable(&c.host(2).pod, pod_ip(1), 20)?;
    if judge == Judge::Xdp {
        let deadline = Instant::now() + Duration::from_secs(20);
        while a1.status()?["xdp_judge"]["attached"] != true {
            if Instant::now() > deadline {
                bail!("the XDP judge did not attach:\n{}", a1.log_text());
            }
            sleep(Duration::from_millis(100));
        }
    }
    Ok((c, vec![a1, a2]))
}

fn dropped(a: &Agent) -> Result<u64> {
    let s = a.status()?;
    let n = |k: &str| s["counters"][k].as_u64().unwrap_or(0);
    Ok(n("xdp_drop_unknown_peer") + n("drop_unknown_peer"))
}

/// Floods node 1 from the switch for `run` at `pps` (u64::MAX: flat out)
/// in a thread pinned to CPU 0; returns the frames handed to the kernel.
fn flood(switch: &str, run: Duration, pps: u64) -> std::thread::JoinHandle<Result<u64>> {
    let switch = switch.to_string();
    std::thread::spawn(move || {
        edgevx_tests::netns::enter(&switch)?;
        xdpgen::pin_to(0)?;
        let ifindex = xdpgen::ifindex("sw1")?;
        let frame = xdpgen::vxlan4([0x02, 0, 0xc6, 0x12, 0, 0x01], [198, 18, 0, 66], [198, 18, 0, 1]);
        let f = Flood::new(ifindex, frame)?;
        f.flood_for(run, if pps == u64::MAX { 0 } else { pps })
    })
}

/// Drops per second while flooding flat out for `seconds`.
fn drop_rate(c: &Cluster, a1: &Agent, seconds: u32) -> Result<(f64, f64)> {
    let before = dropped(a1)?;
    let t = Instant::now();
    let sent = flood(&c.switch.name, Duration::from_secs(seconds.into()), u64::MAX)
        .join()
        .map_err(|_| anyhow::anyhow!("the generator panicked"))??;
    let secs = t.elapsed().as_secs_f64();
    sleep(Duration::from_millis(200));
    let got = dropped(a1)? - before;
    Ok((sent as f64 / secs, got as f64 / secs))
}

fn iperf(client: &Netns, server: &Netns, seconds: u32) -> Result<f64> {
    let mut srv = server.cmd("iperf3").args(["-s", "-1"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.run(&["ss", "-Hltn", "sport", "=", ":5201"]).is_ok_and(|l| !l.trim().is_empty()) {
        if Instant::now() > deadline {
            let _ = srv.kill();
            let _ = srv.wait();
            bail!("the iperf3 server did not listen within 30 s");
        }
        sleep(Duration::from_millis(50));
    }
    let out = client.run(&["iperf3", "-J", "-c", &pod_ip(1).to_string(), "-t", &seconds.to_string()]);
    let _ = srv.kill();
    let _ = srv.wait();
    let v: Value = serde_json::from_str(&out?).context("iperf3 JSON")?;
    crate::bench::tcp_gbps(&v)
}

/// Goodput pod 2 -> pod 1 while node 1 is flooded at `pps`.
fn goodput_under(c: &Cluster, pps: u64, seconds: u32) -> Result<(f64, f64)> {
    let gen_run = Duration::from_secs(seconds as u64 + 2);
    let handle = (pps > 0).then(|| flood(&c.switch.name, gen_run, pps));
    // the flood first, then the transfer inside it
    sleep(Duration::from_millis(500));
    let t = Instant::now();
    let gbps = iperf(&c.host(2).pod, &c.host(1).pod, seconds);
    let elapsed = t.elapsed().as_secs_f64() + 0.5;
    let offered = match handle {
        Some(h) => h.join().map_err(|_| anyhow::anyhow!("the generator panicked"))?? as f64 / (elapsed + 1.5),
        None => 0.0,
    };
    Ok((gbps?, offered))
}

pub fn run(seconds: u32) -> Result<()> {
    packages::ensure()?;
    let tools = toolchain::ensure()?;
    build::agent(&tools)?;
    let root = exec::workspace_root();
    // SAFETY: single-threaded here; the harness reads it.
    unsafe { std::env::set_var("EDGEVX_BIN", root.join("target/release/edgevx")) };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load.trim());
    let mut capacity = Vec::new();
    let mut goodput = Vec::new();
    for judge in [Judge::Tc, Judge::Xdp] {
        eprintln!("bench --xdp: {} ...", judge.name());
        let (c, agents) = bring_up(judge)?;
        capacity.push(drop_rate(&c, &agents[0], seconds)?);
        let mut row = Vec::new();
        for pps in RATES {
            row.push(goodput_under(&c, pps, seconds)?);
        }
        goodput.push(row);
        drop(agents);
        drop(c);
    }
    println!(
        "\nDrop capacity: a stranger's IPv4 VXLAN flooded flat out for {seconds} s, generator and drop on CPU 0\n"
    );
    println!("| setup | offered Mpps | dropped Mpps | vs TC |");
    println!("|---|---:|---:|---:|");
    for (judge, (offered, got)) in [Judge::Tc, Judge::Xdp].iter().zip(&capacity) {
        println!("| {} | {:.2} | {:.2} | {:.2}x |", judge.name(), offered / 1e6, got / 1e6, got / capacity[0].1);
    }
    println!("\nTCP goodput pod 2 -> pod 1 (iperf3, {seconds} s) while node 1 is flooded\n");
    println!("| flood (target) | offered kpps TC | TC Gbit/s | offered kpps XDP | XDP Gbit/s | XDP vs TC |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, pps) in RATES.iter().enumerate() {
        let (tc, xdp) = (goodput[0][i], goodput[1][i]);
        let target = match *pps {
            0 => "none".to_string(),
            u64::MAX => "flat out".to_string(),
            p => format!("{} kpps", p / 1000),
        };
        println!(
            "| {target} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2}x |",
            tc.1 / 1e3,
            tc.0,
            xdp.1 / 1e3,
            xdp.0,
            xdp.0 / tc.0
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nload average after: {} (2 cores shared with other work: figures are indicative)", load.trim());
    Ok(())
}
