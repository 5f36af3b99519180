//! `edgevx status`: what is programmed, read from the pins and the state
//! dir, so it works with the agent running or stopped. Whether the agent
//! runs is the kernel's answer: who holds the lock of this network
//! namespace (`run::netns_lock`), never a recorded pid.
use std::path::Path;

use anyhow::Result;
use aya::programs::TcAttachType;
use serde_json::{Value, json};

use crate::{
    cli::StatusArgs,
    dataplane::{bpffs::PinDir, clsact, loader, maps::Maps, order::Place, routes},
    metrics::startup::STARTUP_FILE,
    reconcile::{CAPACITY_FILE, Fill},
    run::netns_lock,
    state::StateDir,
};

/// The agent of this state dir, if one runs: the holder of this network
/// namespace's lock, when it runs `edgevx run` on this state dir (a holder
/// that wrote no record yet counts). `None` when none runs.
fn running_agent(state_dir: &Path) -> Result<Option<netns_lock::Holder>> {
    let Some(h) = netns_lock::holder()? else { return Ok(None) };
    let same_dir = |r: &netns_lock::Record| {
        r.state_dir == state_dir
            || std::fs::canonicalize(&r.state_dir)
                .ok()
                .zip(std::fs::canonicalize(state_dir).ok())
                .is_some_and(|(a, b)| a == b)
    };
    let ours = h.record.as_ref().is_none_or(|r| r.role == netns_lock::Role::Run && same_dir(r));
    Ok(ours.then_some(h))
}

/// What `status` says of the agent itself: running or not, its pid (as
/// this pid namespace sees it) and what it is doing.
fn agent_json(agent: Option<&netns_lock::Holder>) -> (bool, Value, Value) {
    let pid = agent.and_then(|h| h.pid).map_or(Value::Null, |p| json!(p));
    let phase = agent.and_then(|h| h.record.as_ref()).map_or(Value::Null, |r| json!(r.phase));
    (agent.is_some(), pid, phase)
}

pub fn collect(paths: &crate::cli::Paths) -> Result<Value> {
    let state = StateDir(paths.state_dir.clone());
    let agent = running_agent(&paths.state_dir)?;
    let (agent_running, agent_pid, agent_phase) = agent_json(agent.as_ref());
    let Some(rec) = state.load_agent()? else {
        // an agent waiting for the host has brought nothing up yet
        if agent_running {
            return Ok(json!({
                "node": null,
                "agent_running": true,
                "agent_pid": agent_pid,
                "agent_phase": agent_phase,
                "dataplane_attached": false,
                "peers": [],
            }));
        }
        anyhow::bail!("no edgevx state in {} (has `edgevx run` ever started here?)", paths.state_dir.display());
    };
    let peers = state.load_peers()?;
    let pins = PinDir::new(&paths.bpffs);
    let maps = Maps::open(&pins).ok();
    // the kernel's word, not the pins': which programs run where, and in what order
    let place = |name: &str, iface: &str, kind: TcAttachType| match rec.attach {
        loader::AttachMode::Tcx => loader::tcx_place(&pins, name, iface, kind).ok(),
        loader::AttachMode::Clsact => clsact::place_blocking(iface, kind),
    };
    let on = |name: &str, iface: &str, kind: TcAttachType| place(name, iface, kind).is_some_and(|p| p != Place::Absent);
    // IPv6-only: no IPv4 VTEP, so no encap program and no VTEP guard
    let encap_on = rec.v4.as_ref().is_none_or(|v4| {
        on(loader::ENCAP, &v4.vtep_device, TcAttachType::Egress)
            && on(loader::VTEP_GUARD, &v4.vtep_device, TcAttachType::Ingress)
    });
    let decap = place(loader::DECAP, &rec.iface, TcAttachType::Ingress);
    let guard6_on = rec.v6.as_ref().is_none_or(|v6| on(loader::VTEP_GUARD6, &v6.device, TcAttachType::Ingress));
    let dataplane_attached = encap_on && guard6_on && decap.as_ref().is_some_and(|p| *p != Place::Absent);
    // what runs ahead of decap on the underlay: a program that ends the chain there skips its judging
    let ahead_of_decap: Vec<String> =
        decap.as_ref().map(|p| p.ahead().iter().map(ToString::to_string).collect()).unwrap_or_default();
    let bridge_attached = on(loader::BRIDGE, &rec.pod_bridge, TcAttachType::Egress);
    let counters = match &maps {
        Some(m) => serde_json::to_value(m.global_stats()?)?,
        None => Value::Null,
    };
    let programmed = maps.as_ref().map(|m| m.subnets()).transpose()?.unwrap_or_default();
    let accepted = maps.as_ref().map(|m| m.accepted()).transpose()?.unwrap_or_default();
    let direct = rec.v4.as_ref().map(|v4| routes::direct_routes_blocking(&rec.iface, v4.network)).unwrap_or_default();
    let accepted6 = maps.as_ref().and_then(|m| m.accept6_entries().ok()).unwrap_or_default();
    // what the agent's last pass found; the capacity itself is read from the maps
    // records.rs: the newer of the state dir's copy and the one under /run
    let fill: Option<Fill> = state.load_record(CAPACITY_FILE).ok().flatten();
    let capacity = maps.as_ref().map(|m| m.peer_capacity() as usize).or(fill.map(|f| f.capacity));
    let peers: Vec<Value> = peers
        .iter()
        .map(|p| {
            let Some(p4) = p.v4 else {
                // IPv6-only: the IPv6 half (its entries are the kernel's, on flannel-v6.<VNI>)
                let v6 = p.v6.as_ref();
                return json!({
                    "node": p.node,
                    "subnet": v6.map(|v6| v6.subnet.to_string()),
                    "public_ip": v6.map(|v6| v6.public_ip.to_string()),
                    "vtep_mac": v6.map(|v6| v6.vtep_mac.to_string()),
                    "in_dataplane": v6.is_some_and(|v6| accepted6.contains_key(&v6.public_ip)),
                    "route": "ipv6",
                });
            };
            let (node, p) = (&p.node, p4);
            let s = maps.as_ref().and_then(|m| m.peer_stats(p.public_ip)).unwrap_or_default();
            json!({
                "node": node,
                "subnet": p.subnet.to_string(),
                "public_ip": p.public_ip.to_string(),
                "vtep_mac": p.vtep_mac.to_string(),
                // read from the kernel: the LPM entry and the accepted address
                "in_dataplane": programmed.iter().any(|(net, e)| *net == p.subnet
                    && e.vtep_mac == p.vtep_mac.0
                    && e.public_ip == p.public_ip.octets())
                    && accepted.contains_key(&p.public_ip),
                // DirectRouting: a plain route through the underlay, read from the kernel
                "route": if direct.get(&p.subnet) == Some(&p.public_ip) { "direct" } else { "vxlan" },
                "tx_packets": s.tx_packets,
                "tx_bytes": s.tx_bytes,
                "rx_packets": s.rx_packets,
                "rx_bytes": s.rx_bytes,
                "tx_errors": s.tx_errors,
            })
        })
        .collect();
    Ok(json!({
        "node": rec.node,
        "agent_running": agent_running,
        "agent_pid": agent_pid,
        "agent_phase": agent_phase,
        "dataplane_attached": dataplane_attached,
        // null when the kernel could not be asked, or decap is not attached
        "decap_first": decap.as_ref().filter(|p| **p != Place::Absent).map(|p| *p == Place::First),
        "ahead_of_decap": ahead_of_decap,
        "bridge_attached": bridge_attached,
        "attach": rec.attach.name(),
        "iface": rec.iface,
        // null in an IPv6-only network
        "vtep_device": rec.v4.as_ref().map(|v4| v4.vtep_device.clone()),
        "vtep_mac": rec.v4.as_ref().map(|v4| v4.vtep_mac.to_string()),
        "vni": rec.vni,
        "port": rec.port,
        "public_ip": rec.v4.as_ref().map(|v4| v4.public_ip.to_string()),
        "subnet": rec.v4.as_ref().map(|v4| v4.subnet.to_string()),
        "network": rec.v4.as_ref().map(|v4| v4.network.to_string()),
        "mtu": rec.mtu,
        "delivery": if rec.bypass_netfilter { "bypass-netfilter" } else { "host-stack" },
        "ip_masq": rec.ip_masq,
        // "on", or why not; the per-reason counts are in counters (fast_path_*)
        "fast_path": if rec.fast_path.is_empty() { None } else { Some(rec.fast_path.clone()) },
        "local_pods": maps.as_ref().map(|m| m.local_pods().len()).unwrap_or(0),
        // the limit: peers the maps hold (their max_entries)
        "peer_capacity": capacity,
        // the agent's last pass: peers its view had, and how many of them did not fit
        "peers_in_view": fill.map(|f| f.wanted),
        "peers_not_programmed": fill.map_or(0, |f| f.not_programmed),
        // the agent's first bring-up: ms from process start to each step reached
        "startup": state.load_record::<Value>(STARTUP_FILE).ok().flatten(),
        "xdp_judge": crate::dataplane::xdp::status_json(&state, &pins, &rec.iface, rec.xdp_judge),
        "counters": counters,
        "peers": peers,
        // flannel-v6.<VNI> (null when IPv6 is off)
        "vtep6": rec.v6.as_ref().map(|v6| json!({
            "device": v6.device,
            "mac": v6.mac.to_string(),
            "public_ip": v6.public_ip.to_string(),
            "subnet": v6.subnet.to_string(),
            "network": v6.network.to_string(),
            "mtu": v6.mtu,
        })),
    }))
}

pub fn run(args: StatusArgs) -> Result<()> {
    let v = collect(&args.paths)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let s = |k: &str| v[k].as_str().map(str::to_string).unwrap_or_else(|| v[k].to_string());
    let agent = match (&v["agent_running"], v["agent_pid"].as_u64(), v["agent_phase"].as_str()) {
        (Value::Bool(true), pid, phase) => format!(
            "running{}{}",
            pid.map_or(String::new(), |p| format!(" (pid {p})")),
            phase.map_or(String::new(), |p| format!(": {p};"))
        ),
        _ => "stopped".to_string(),
    };
    if v["iface"].is_null() {
        println!("agent {agent} nothing brought up yet (no agent record in the state dir)");
        return Ok(());
    }
    println!(
        "node {}  agent {agent}  dataplane {}",
        s("node"),
        if v["dataplane_attached"] == true { "attached" } else { "NOT attached" }
    );
    if let Some(ahead) = v["ahead_of_decap"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<&str> = ahead.iter().filter_map(Value::as_str).collect();
        println!(
            "NOT first on {}'s ingress: {} run ahead of edgevx's decap (the agent puts it back first at its next \
             check; meanwhile VXLAN they pass on unjudged is dropped on the VTEP)",
            s("iface"),
            names.join("; ")
        );
    }
    if v["vtep_device"].is_null() {
        // IPv6-only: the IPv6 VTEP below is the only one
        println!("vni {} port {} mtu {} (IPv6-only)", s("vni"), s("port"), s("mtu"));
    } else {
        println!(
            "vtep {} mac {} vni {} port {} public-ip {} subnet {} mtu {} delivery {}",
            s("vtep_device"),
            s("vtep_mac"),
            s("vni"),
            s("port"),
            s("public_ip"),
            s("subnet"),
            s("mtu"),
            s("delivery")
        );
    }
    if let Some(v6) = v["vtep6"].as_object() {
        let f = |k: &str| v6.get(k).map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string()));
        println!(
            "vtep {} mac {} public-ip {} subnet {} mtu {} (IPv6)",
            f("device").unwrap_or_default(),
            f("mac").unwrap_or_default(),
            f("public_ip").unwrap_or_default(),
            f("subnet").unwrap_or_default(),
            f("mtu").unwrap_or_default()
        );
    }
    if let Some(t) = v["startup"].as_object() {
        let step = |k: &str| t.get(k).and_then(Value::as_f64).map_or("-".to_string(), |ms| format!("{ms:.0} ms"));
        println!(
            "started: subnet.env {}, VTEP up {}, attached {}, first peer {}, all peers {} (from process start)",
            step("subnet_env_ms"),
            step("vtep_up_ms"),
            step("attached_ms"),
            step("first_peer_ms"),
            step("all_peers_ms")
        );
    }
    if let Some(x) = v["xdp_judge"].as_object() {
        match (x.get("attached"), x.get("reason").and_then(Value::as_str)) {
            (Some(Value::Bool(true)), _) => println!("xdp judge on {} (native)", s("iface")),
            (_, Some(why)) => println!("xdp judge not attached: {why}"),
            _ => println!("xdp judge not attached"),
        }
    }
    let programmed = v["peers"].as_array().map_or(0, |p| p.len());
    println!("peers {programmed}  capacity {}", s("peer_capacity"));
    if let Some(n) = v["peers_not_programmed"].as_u64().filter(|n| *n > 0) {
        println!(
            "{n} of the {} peers in the view NOT programmed: beyond the capacity (see the agent's log)",
            s("peers_in_view")
        );
    }
    println!(
        "\n{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
        "PEER", "SUBNET", "PUBLIC IP", "VTEP MAC", "ROUTE", "TX PKTS", "RX PKTS"
    );
    for p in v["peers"].as_array().into_iter().flatten() {
        let f = |k: &str| p[k].as_str().map(str::to_string).unwrap_or_else(|| p[k].to_string());
        println!(
            "{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
            f("node"),
            f("subnet"),
            f("public_ip"),
            f("vtep_mac"),
            f("route"),
            f("tx_packets"),
            f("rx_packets")
        );
    }
    if let Some(c) = v["counters"].as_object() {
        println!();
        for (k, n) in c {
            println!("{k:<20} {n}");
        }
    }
    Ok(())
}
