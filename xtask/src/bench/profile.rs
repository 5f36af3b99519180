//! `cargo xtask bench --profile`: where the cycles of one TCP stream, and
//! of a 64-byte UDP flood, go, per setup, so the gap between the host stack path, the fast path (the
//! default) and plain routing is read from a profile rather than guessed. For each of those
//! setups (the bench's own topology and rules) it runs one iperf3 TCP
//! stream from node1's pod to node2's, then the bench's UDP flood, and,
//! meanwhile, `perf record -a -g` on every
//! CPU; then it prints the hottest kernel symbols and a sum by area
//! (netfilter, conntrack, routing, the bridge, VXLAN, BPF, TCP, the copy to
//! user space, ...). Both nodes and both pods share the one kernel, so the
//! profile is of the whole path, sender and receiver together. Asserts
//! nothing; the profiles stay in target/bench/ for `perf report`.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::{Setup, Share, UDP_WARMUP_SECS, bring_up, fast_share, iperf, tcp_gbps, udp_flood_args, udp_kpps},
    build,
    deps::{packages, toolchain},
    exec,
};

/// The areas a kernel symbol is summed under, by name; the first that
/// matches wins. Rough by nature: they say where to look, not to the
/// percent.
const AREAS: &[(&str, &[&str])] = &[
    (
        "conntrack",
        &[
            "nf_conntrack",
            "nf_ct_",
            "tcp_in_window",
            "tcp_packet",
            "hash_conntrack",
            "nf_confirm",
            "bpf_skb_ct",
            "bpf_ct_",
        ],
    ),
    ("NAT", &["nf_nat", "nf_xfrm", "masquerade"]),
    ("netfilter rules", &["ipt_do_table", "nft_do_chain", "nf_hook", "ip6t_do_table", "xt_", "nft_", "ebt_"]),
    ("bridge", &["br_", "nbp_"]),
    (
        "VXLAN and UDP tunnel",
        &["vxlan", "udp_tunnel", "udp_gro", "udp4_lib", "udp_queue", "udp_rcv", "udp4_", "udp_unicast"],
    ),
    ("BPF programs and helpers", &["bpf_", "tcx_", "sch_handle", "tc_run", "cls_bpf", "skb_do_redirect"]),
    (
        "routing and forwarding",
        &[
            "fib_",
            "ip_route",
            "ip_forward",
            "ip_rcv",
            "ip_output",
            "ip_finish",
            "ip_local",
            "ip_sublist",
            "ip_list_rcv",
            "ip_protocol",
            "neigh_",
            "dst_",
            "rt_dst",
            "ipv4_",
        ],
    ),
    (
        "device, GRO/GSO, softirq",
        &[
            "netif_",
            "napi_",
            "gro_",
            "dev_",
            "veth_",
            "skb_gso",
            "inet_gro",
            "inet_gso",
            "tcp_gro",
            "tcp4_gro",
            "tcp_gso",
            "tcp4_gso",
            "net_rx_action",
            "process_backlog",
            "do_softirq",
            "eth_type_trans",
            "validate_xmit",
            "skb_segment",
            "sch_direct",
            "qdisc",
        ],
    ),
    ("TCP", &["tcp_", "tcp4_", "inet_"]),
    ("copies and checksums", &["copy_", "memcpy", "csum", "skb_datagram_iter", "skb_copy"]),
    (
        "memory (skb, pages, slab)",
        &[
            "kmem_",
            "kfree",
            "kmalloc",
            "skb_release",
            "alloc_skb",
            "skb_free",
            "page_",
            "free_unref",
            "slab",
            "consume_skb",
            "skb_attempt_defer",
            "napi_skb_cache",
            "build_skb",
        ],
    ),
];

/// The area of kernel symbol `symbol` (leading underscores ignored).
fn area(symbol: &str) -> &'static str {
    let s = symbol.trim_start_matches('_');
    AREAS.iter().find(|(_, prefixes)| prefixes.iter().any(|p| s.starts_with(p))).map_or("other", |(name, _)| name)
}

/// A flat profile: (percent of samples, symbol), hottest first.
type Flat = Vec<(f64, String)>;

/// `perf report`'s flat profile of `data`.
fn flat(data: &Path) -> Result<Flat> {
    let out = Command::new("perf")
        .arg("report")
        .arg("-i")
        .arg(data)
        .args(["--stdio", "--no-children", "--sort", "sym", "-g", "none", "--percent-limit", "0.05"])
        .stderr(Stdio::null())
        .output()
        .context("cannot run perf report")?;
    if !out.status.success() {
        bail!("perf report on {} failed", data.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // "    12.34%  [k] nf_hook_slow"
    Ok(text
        .lines()
        .filter_map(|l| {
            let (pct, rest) = l.trim().split_once('%')?;
            let pct: f64 = pct.trim().parse().ok()?;
            let sym = rest.trim().split_once("] ").map_or(rest.trim(), |(_, s)| s).trim().to_string();
            Some((pct, sym))
        })
        .collect())
}

/// What a profile runs: the bench's single TCP stream, or its UDP flood of
/// 64-byte datagrams (the packet rate, the figure furthest from plain
/// routing).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    Tcp,
    Udp64,
}

impl Load {
    fn slug(self) -> &'static str {
        match self {
            Load::Tcp => "tcp",
            Load::Udp64 => "udp64",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Load::Tcp => "one TCP stream",
            Load::Udp64 => "a 64-byte UDP flood",
        }
    }

    /// Seconds the load runs before perf samples it.
    fn warmup(self) -> u32 {
        match self {
            Load::Tcp => 0,
            Load::Udp64 => UDP_WARMUP_SECS,
        }
    }

    fn iperf_args(self, seconds: u32) -> Vec<String> {
        let t = seconds.to_string();
        match self {
            Load::Tcp => vec!["-t".into(), t],
            Load::Udp64 => udp_flood_args(seconds),
        }
    }

    /// What the iperf3 run carried, as the bench states it.
    fn rate(self, result: &serde_json::Value, seconds: u32) -> String {
        match self {
            Load::Tcp => format!("{:.2} Gbit/s", tcp_gbps(result).unwrap_or(0.0)),
            Load::Udp64 => format!("{:.1} kpps received", udp_kpps(result, seconds)),
        }
    }
}

/// `load` for `seconds` under `perf record -a -g` into `data`.
fn record(setup: Setup, load: Load, seconds: u32, data: &Path) -> Result<Option<Share>> {
    let (c, agents) = bring_up(setup)?;
    let warmup = load.warmup();
    let mut perf = Command::new("perf");
    perf.args(["record", "-a", "-g", "-F", "999"]);
    // perf refuses -D 0
    if warmup > 0 {
        perf.args(["-D", &(warmup * 1000).to_string()]);
    }
    let mut perf = perf
        .arg("-o")
        .arg(data)
        .args(["--", "sleep", &(warmup + seconds.saturating_sub(1).max(1)).to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start perf record")?;
    // perf record sets up before it samples; the load outlasts it
    sleep(Duration::from_millis(300));
    let (p1, p2) = (&c.host(1).pod, &c.host(2).pod);
    let args = load.iperf_args(seconds);
    let result = iperf(p1, p2, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let status = perf.wait().context("perf record")?;
    let rate = load.rate(&result?, seconds);
    if !status.success() {
        bail!("perf record failed ({status}); is perf allowed here (kernel.perf_event_paranoid)?");
    }
    let share = fast_share(&agents)?;
    eprintln!(
        "bench --profile: {}, {}: {rate}{}",
        setup.name(),
        load.title(),
        share
            .map(|s| format!(
                ", the fast path carried {:.0}% of node2's received packets and {:.0}% of node1's sent",
                s.received * 100.0,
                s.sent * 100.0
            ))
            .unwrap_or_default()
    );
    Ok(share)
}

pub fn run(seconds: u32) -> Result<()> {
    packages::ensure_profile()?;
    let tools = toolchain::ensure()?;
    build::agent(&tools)?;
    let root = exec::workspace_root();
    // SAFETY: single-threaded here; the harness reads it.
    unsafe { std::env::set_var("EDGEVX_BIN", root.join("target/release/edgevx")) };
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let setups = [
        (Setup::EdgevxHostStack, "host-stack"),
        (Setup::EdgevxDefault, "fast-path"),
        (Setup::KernelVxlan, "kernel-vxlan"),
        (Setup::PlainRouting, "plain"),
    ];
    for load in [Load::Tcp, Load::Udp64] {
        let mut profiles: Vec<(Setup, PathBuf, Flat)> = Vec::new();
        for (setup, slug) in setups {
            let data = dir.join(format!("perf-{}-{slug}.data", load.slug()));
            record(setup, load, seconds, &data)?;
            profiles.push((setup, data.clone(), flat(&data)?));
        }
        print_areas(load, seconds, &profiles);
    }
    Ok(())
}

/// The sums by area, side by side, then each setup's hottest symbols.
fn print_areas(load: Load, seconds: u32, profiles: &[(Setup, PathBuf, Flat)]) {
    println!("\nWhere {}'s cycles go (perf record -a -g, {seconds} s, % of all samples):\n", load.title());
    let mut names: Vec<&str> = AREAS.iter().map(|(n, _)| *n).collect();
    names.push("other");
    print!("| area |");
    for (s, _, _) in profiles {
        print!(" {} |", s.name());
    }
    println!();
    println!("|---|{}", "---:|".repeat(profiles.len()));
    for name in &names {
        print!("| {name} |");
        for (_, _, flat) in profiles {
            let sum: f64 = flat.iter().filter(|(_, s)| area(s) == *name).map(|(p, _)| p).sum();
            // an empty f64 sum is -0.0; adding 0.0 prints it as 0.0
            print!(" {:.1}% |", sum + 0.0);
        }
        println!();
    }
    for (s, data, flat) in profiles {
        println!("\n{}, {} ({}): the 15 hottest symbols", s.name(), load.title(), data.display());
        for (pct, sym) in flat.iter().take(15) {
            println!("  {pct:6.2}%  {sym}  [{}]", area(sym));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::area;

    #[test]
    fn symbols_fall_into_their_areas() {
        for (sym, want) in [
            ("nf_conntrack_in", "conntrack"),
            ("nf_hook_slow", "netfilter rules"),
            ("ipt_do_table", "netfilter rules"),
            ("br_handle_frame", "bridge"),
            ("vxlan_rcv", "VXLAN and UDP tunnel"),
            ("bpf_prog_1a2b3c_edgevx_decap", "BPF programs and helpers"),
            ("fib_table_lookup", "routing and forwarding"),
            ("tcp_ack", "TCP"),
            ("_copy_to_iter", "copies and checksums"),
            ("kmem_cache_free", "memory (skb, pages, slab)"),
            ("__nf_conntrack_find_get", "conntrack"),
            ("skb_ext_add", "other"),
            ("native_queued_spin_lock_slowpath", "other"),
        ] {
            assert_eq!(area(sym), want, "{sym}");
        }
    }
}
