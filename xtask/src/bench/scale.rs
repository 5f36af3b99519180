//! `cargo xtask bench --scale N`: N peers from a nodes file. Measures start
//! to all-programmed (and reports the agent's own startup figures: subnet.env,
//! VTEP up, attached, first and all peers), edit (100 more) to programmed, the agent's RSS, and
//! the kernel state it leaves (routes, neighbours, fdb entries on the VTEP,
//! after traffic to every peer subnet); then the same kernel state the way
//! flanneld writes it (one arp, one fdb and one route per peer, installed
//! with `ip -batch`/`bridge -batch`), as the reference. Asserts nothing.
use std::{
    fs,
    path::Path,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use edgevx_tests::{
    agent::Agent,
    dual,
    netns::Netns,
    nodes::{WIDE_NET_CONF, WIDE_NET_CONF_DUAL, flannel_node, node_list, synthetic_peers, synthetic_peers_dual, write},
    topo::{Cluster, subnet},
};

use crate::{
    build,
    deps::{packages, toolchain},
    exec,
};

const EDIT: u32 = 100;

fn count_lines(ns: &Netns, args: &[&str], needle: &str) -> Result<usize> {
    Ok(ns.run(args)?.lines().filter(|l| l.contains(needle)).count())
}

struct KernelState {
    routes: usize,
    neighbours: usize,
    fdb: usize,
}

/// One UDP datagram to a host in each of `n` peer subnets (makes whatever
/// neighbour entries the routes lead to), then the counts on flannel.1.
fn kernel_state(ns: &Netns, n: u32) -> Result<KernelState> {
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         for k in range({n}):\n  \
           try: s.sendto(b'x',('10.%d.%d.9'%(1+k//256,k%256),9))\n  \
           except OSError: pass\n"
    );
    ns.run(&["python3", "-c", &script])?;
    Ok(KernelState {
        routes: count_lines(ns, &["ip", "route", "show", "dev", "flannel.1"], "")?,
        // `nud all`: NOARP entries (what a NOARP device's routes make) too
        neighbours: count_lines(ns, &["ip", "neigh", "show", "nud", "all", "dev", "flannel.1"], "")?,
        fdb: count_lines(ns, &["bridge", "fdb", "show", "dev", "flannel.1"], "dst")?,
    })
}

fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

/// Waits until the agent's log has `n` "peer entries written" lines.
fn wait_updates(agent: &Agent, n: usize, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if agent.log_text().matches("peer entries written").count() >= n {
            return Ok(start.elapsed());
        }
        sleep(Duration::from_millis(5));
    }
    bail!("no dataplane update #{n} within {timeout:?}:\n{}", agent.log_text())
}

/// `n` synthetic peers, dual-stack ones with `dual`.
fn peers(n: u32, first: u32, dual: bool) -> Vec<serde_json::Value> {
    if dual { synthetic_peers_dual(n, first) } else { synthetic_peers(n, first) }
}

fn edgevx(n: u32, dual: bool) -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    let own = if dual {
        dual::add_ipv6(c.host(1))?;
        fs::write(&conf, WIDE_NET_CONF_DUAL)?;
        // its IPv6 pod CIDR in the wide IPv6 Network, clear of the synthetic peers'
        let mut own = flannel_node(1, None);
        own["spec"]["podCIDRs"] = serde_json::json!([subnet(1), "fd00:10:0:1::/64"]);
        own
    } else {
        fs::write(&conf, WIDE_NET_CONF)?;
        flannel_node(1, None)
    };
    let nodes = c.dir.join("nodes.json");
    let mut list = vec![own];
    list.extend(peers(n, 0, dual));
    write(&nodes, &node_list(list.clone()))?;
    let size = fs::metadata(&nodes)?.len();
    let t = Instant::now();
    let agent = Agent::spawn(c.host(1), &["--nodes-file", path(&nodes)?, "--net-conf", path(&conf)?])?;
    wait_updates(&agent, 1, Duration::from_secs(120))?;
    let start = t.elapsed();
    // the agent's own figures (restore first): ms from its process start to each step
    let deadline = Instant::now() + Duration::from_secs(30);
    let startup = loop {
        let s = agent.status()?;
        if s["startup"]["all_peers_ms"].is_number() || Instant::now() > deadline {
            break s["startup"].clone();
        }
        sleep(Duration::from_millis(20));
    };
    sleep(Duration::from_millis(500));
    list.extend(peers(EDIT, n, dual));
    // the new list is serialised beforehand: the clock starts at the rename
    let next = c.dir.join("next.json");
    write(&next, &node_list(list))?;
    let t = Instant::now();
    fs::rename(&next, &nodes)?;
    wait_updates(&agent, 2, Duration::from_secs(60))?;
    let edit = t.elapsed();
    if std::env::var_os("EDGEVX_BENCH_LOG").is_some() {
        eprintln!("{}", agent.log_text());
    }
    sleep(Duration::from_millis(500));
    let (rss, peak) = rss_kib(agent.pid().context("agent pid")?)?;
    let k = kernel_state(&c.host(1).ns, n + EDIT)?;
    let family = if dual { "dual-stack" } else { "IPv4" };
    println!("edgevx, {n} {family} peers (nodes file {:.1} MB):", size as f64 / 1e6);
    println!("  start to all programmed     {:>8.0} ms", start.as_secs_f64() * 1e3);
    println!("  the agent's startup figures (ms from its process start, `edgevx status`):");
    for (key, what) in [
        ("subnet_env_ms", "subnet.env written"),
        ("vtep_up_ms", "VTEP up"),
        ("attached_ms", "programs attached"),
        ("first_peer_ms", "first peer programmed"),
        ("all_peers_ms", "all peers programmed"),
    ] {
        match startup[key].as_f64() {
            Some(ms) => println!("    {what:<24}{ms:>8.1} ms"),
            None => println!("    {what:<24}     n/a"),
        }
    }
    println!("  edit (+{EDIT}) to programmed  {:>8.0} ms", edit.as_secs_f64() * 1e3);
    println!("  agent RSS                   {:>8.1} MiB (peak {:.1} MiB)", rss as f64 / 1024.0, peak as f64 / 1024.0);
    println!("  kernel: routes {}, neighbours {}, fdb entries {} on flannel.1", k.routes, k.neighbours, k.fdb);
    Ok(())
}

/// The same peers in a nodes file padded to ~100 MB with what real Nodes
/// carry (`status.images`): the agent's peak and settled RSS against the
/// file's size.
fn huge_file(n: u32) -> Result<()> {
    const TARGET: usize = 100_000_000;
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let conf = c.dir.join("net-conf.json");
    fs::write(&conf, WIDE_NET_CONF)?;
    let per_node = TARGET / (n as usize + 1);
    let image = "x".repeat(200);
    let images: Vec<serde_json::Value> = (0..per_node / 230)
        .map(|i| serde_json::json!({"names": [format!("registry.example/{image}:{i}")], "sizeBytes": 1}))
        .collect();
    let mut list = vec![flannel_node(1, None)];
    list.extend(synthetic_peers(n, 0));
    for node in &mut list {
        node["status"] = serde_json::json!({"images": images});
    }
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(list))?;
    let size = fs::metadata(&nodes)?.len();
    let agent = Agent::spawn(c.host(1), &["--nodes-file", path(&nodes)?, "--net-conf", path(&conf)?])?;
    wait_updates(&agent, 1, Duration::from_secs(300))?;
    sleep(Duration::from_secs(2));
    let (rss, peak) = rss_kib(agent.pid().context("agent pid")?)?;
    let mb = size as f64 / 1e6;
    println!("edgevx, the same {n} peers in a nodes file padded to {mb:.0} MB:");
    println!(
        "  peak RSS {:.1} MiB ({:.2}x the file), settled RSS {:.1} MiB",
        peak as f64 / 1024.0,
        peak as f64 * 1024.0 / size as f64,
        rss as f64 / 1024.0
    );
    Ok(())
}

fn flannel_reference(n: u32) -> Result<()> {
    let c = Cluster::new(1)?;
    let ns = &c.host(1).ns;
    c.host(1).kernel_vtep("02:11:00:00:00:01")?;
    let (mut ip, mut fdb) = (String::new(), String::new());
    for k in 0..n {
        let (hi, lo) = (k / 256, k % 256);
        let mac = format!("02:5c:{:02x}:{:02x}:{:02x}:01", (k >> 16) & 0xff, hi & 0xff, lo);
        let gw = format!("10.{}.{lo}.0", 1 + hi);
        ip.push_str(&format!("neigh replace {gw} lladdr {mac} dev flannel.1 nud permanent\n"));
        ip.push_str(&format!("route replace {gw}/24 via {gw} dev flannel.1 onlink\n"));
        fdb.push_str(&format!("fdb append {mac} dev flannel.1 dst 198.19.{hi}.{lo} self permanent\n"));
    }
    let (ip_file, fdb_file) = (c.dir.join("ip.batch"), c.dir.join("fdb.batch"));
    fs::write(&ip_file, ip)?;
    fs::write(&fdb_file, fdb)?;
    let t = Instant::now();
    ns.run(&["ip", "-batch", path(&ip_file)?])?;
    ns.run(&["bridge", "-batch", path(&fdb_file)?])?;
    let took = t.elapsed();
    let k = kernel_state(ns, n)?;
    println!("flannel-style kernel state, {n} peers (reference):");
    println!("  ip -batch + bridge -batch   {:>8.0} ms", took.as_secs_f64() * 1e3);
    println!("  kernel: routes {}, neighbours {}, fdb entries {} on flannel.1", k.routes, k.neighbours, k.fdb);
    Ok(())
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

pub fn run(n: u32, dual: bool, kernel: Option<&str>) -> Result<()> {
    if n == 0 || n > 60_000 {
        bail!("--scale {n}: use 1 to 60000 peers");
    }
    // inside a matrix guest the host has built and installed everything
    let in_guest = std::env::var_os(crate::test::vm::PREPARED_ENV).is_some();
    if !in_guest {
        packages::ensure()?;
        let tools = toolchain::ensure()?;
        build::agent(&tools)?;
        if let Some(kernel) = kernel {
            return in_vm(n, dual, kernel, &tools);
        }
    }
    let root = exec::workspace_root();
    // SAFETY: single-threaded here; the harness reads it.
    unsafe { std::env::set_var("EDGEVX_BIN", root.join("target/release/edgevx")) };
    edgevx(n, dual)?;
    if dual || in_guest {
        // the reference and the big file are IPv4's, and host figures: the
        // dual-stack and the guest's runs are for the agent's own figures
        return Ok(());
    }
    flannel_reference(n)?;
    huge_file(n)
}

/// The agent's figures for `n` peers inside a guest booting a matrix kernel
/// (`test/vm.rs`), where the verifier, the map writes and netlink are that
/// kernel's. Under TCG the figures are slow in absolute terms; what they
/// show is where the time goes on that kernel.
fn in_vm(n: u32, dual: bool, kernel: &str, tools: &toolchain::Tools) -> Result<()> {
    packages::ensure_vm()?;
    let me = std::env::current_exe().context("cannot find the xtask binary")?;
    let mut command = vec![me.display().to_string(), "bench".into(), "--scale".into(), n.to_string()];
    if dual {
        command.push("--dual-stack".into());
    }
    crate::test::vm::run(&crate::test::vm::Run {
        kernel,
        command,
        env: vec![(crate::test::vm::PREPARED_ENV.into(), "1".into())],
        path_env: tools.path_env(),
        job: "bench",
        patience: crate::test::vm::GUEST_PATIENCE,
        hot: Vec::new(),
        part: None,
    })
}
