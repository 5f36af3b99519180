//! `edgevx status`: what is programmed, read from the pins and the state
//! dir, so it works with the agent running or stopped. Whether the agent
//! runs is the kernel's answer: who holds the lock of this network
//! namespace (`run::netns_lock`), never a recorded pid. The document is
//! versioned ([`SCHEMA`]) and documented field by field in the book
//! (docs/src/operations/status.md); [`verdict`] turns it into the exit code
//! and the node-level metrics.
mod peers;
mod text;
mod verdict;

pub use verdict::{NodeState, pinned};

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

/// The version of the document `status --json` prints: raised when a
/// field changes meaning or goes; new fields do not raise it.
pub const SCHEMA: u32 = 1;

/// What `status` says of the agent itself, the same in every document:
/// running or not, its pid (as this pid namespace sees it), what it is
/// doing, its release, and how its control plane stands.
fn agent_json(agent: Option<&netns_lock::Holder>) -> serde_json::Map<String, Value> {
    let record = agent.and_then(|h| h.record.as_ref());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let source = record.and_then(|r| r.source.as_ref()).map(|s| {
        json!({
            "name": s.name,
            // in touch with the control plane now: read in full, its watch open
            "watching": s.watching,
            // the view in use came from the source, not the cache
            "connected": s.connected,
            // how long `watching` has had its value: in touch for, or cut off for
            "since_seconds": now.saturating_sub(s.since),
            "view_age_seconds": s.view_at.map(|at| now.saturating_sub(at)),
        })
    });
    let doc = json!({
        "status_schema": SCHEMA,
        "version": env!("CARGO_PKG_VERSION"),
        "agent_running": agent.is_some(),
        "agent_pid": agent.and_then(|h| h.pid),
        "agent_phase": record.map(|r| r.phase.clone()),
        // empty in the records of agents older than 0.2
        "agent_version": record.map(|r| r.version.clone()).filter(|v| !v.is_empty()),
        "source": source,
    });
    match doc {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// `doc`'s fields after `agent`'s, in one document.
fn with_agent(agent: serde_json::Map<String, Value>, doc: Value) -> Value {
    let mut out = agent;
    if let Value::Object(m) = doc {
        out.extend(m);
    }
    Value::Object(out)
}

pub fn collect(paths: &crate::cli::Paths) -> Result<Value> {
    let state = StateDir(paths.state_dir.clone());
    let agent = running_agent(&paths.state_dir)?;
    let agent_running = agent.is_some();
    let agent_doc = agent_json(agent.as_ref());
    let pins = PinDir::new(&paths.bpffs);
    let pinned = verdict::pinned(&pins);
    let Some(rec) = state.load_agent()? else {
        // an agent waiting for the host has brought nothing up yet; with no
        // agent and no record, what is pinned (a state dir removed under a
        // dataplane) is still the kernel's and still runs
        if agent_running || !pinned.is_empty() {
            return Ok(verdict::judged(with_agent(
                agent_doc,
                json!({
                    "node": null,
                    "dataplane_attached": false,
                    "pinned": pinned,
                    "peers": [],
                }),
            )));
        }
        anyhow::bail!("no edgevx state in {} (has `edgevx run` ever started here?)", paths.state_dir.display());
    };
    let peers = state.load_peers()?;
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
    let accepted = maps.as_ref().map(|m| m.accepted::<ipnet::Ipv4Net>()).transpose()?.unwrap_or_default();
    let direct = rec.v4.as_ref().map(|v4| routes::direct_routes_blocking(&rec.iface, v4.network)).unwrap_or_default();
    let accepted6 = maps.as_ref().and_then(|m| m.accepted::<ipnet::Ipv6Net>().ok()).unwrap_or_default();
    // what the agent's last pass found; the capacity itself is read from the maps
    // records.rs: the newer of the state dir's copy and the one under /run
    let fill: Option<Fill> = state.load_record(CAPACITY_FILE).ok().flatten();
    let capacity = maps.as_ref().map(|m| m.peer_capacity() as usize).or(fill.map(|f| f.capacity));
    let seen = peers::Seen { programmed: &programmed, accepted: &accepted, accepted6: &accepted6, direct: &direct };
    let peers: Vec<Value> = peers.iter().map(|p| peers::json(p, &seen, maps.as_ref())).collect();
    Ok(verdict::judged(with_agent(
        agent_doc,
        json!({
            "node": rec.node,
            "dataplane_attached": dataplane_attached,
            // what is pinned under --bpffs (links and programs), read from the bpffs
            "pinned": pinned,
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
        }),
    )))
}

pub fn run(args: StatusArgs) -> Result<()> {
    let v = collect(&args.paths)?;
    if args.prometheus {
        print!("{}", verdict::prometheus(&v)?);
    } else if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        text::print(&v);
    }
    verdict::exit(&v)
}
