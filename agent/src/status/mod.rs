//! `edgevx status`: what is programmed, read from the pins and the state
//! dir, so it works with the agent running or stopped. Whether the agent
//! runs is the kernel's answer: who holds the lock of this network
//! namespace (`run::netns_lock`), never a recorded pid. The document is
//! versioned ([`SCHEMA`]) and documented field by field in the book
//! (docs/src/operations/status.md); [`verdict`] turns it into the exit code
//! and the node-level metrics.
mod agent;
mod kernel;
mod peers;
mod text;
mod verdict;

#[cfg(test)]
mod tests;

pub use verdict::{NodeState, pinned};

use anyhow::Result;
use serde_json::{Value, json};

use kernel::Kernel;

use crate::{
    cli::StatusArgs,
    dataplane::{bpffs::PinDir, order::Place},
    metrics::startup::STARTUP_FILE,
    peer::Peer,
    reconcile::{CAPACITY_FILE, Fill},
    state::{AgentRecord, StateDir},
};

/// The version of the document `status --json` prints: raised when a
/// field changes meaning or goes; new fields do not raise it.
pub const SCHEMA: u32 = 1;

/// `doc`'s fields after `agent`'s, in one document.
fn with_agent(agent: serde_json::Map<String, Value>, doc: Value) -> Value {
    let mut out = agent;
    if let Value::Object(m) = doc {
        out.extend(m);
    }
    Value::Object(out)
}

/// What the state dir says of a node that was brought up.
struct Records {
    /// What the agent configured.
    rec: AgentRecord,
    /// The peers of its last pass.
    peers: Vec<Peer>,
    /// What its last pass found of the capacity (records.rs: the newer of
    /// the state dir's copy and the one under /run).
    fill: Option<Fill>,
    /// Its first bring-up: ms from process start to each step reached.
    startup: Option<Value>,
}

impl Records {
    fn load(state: &StateDir, rec: AgentRecord) -> Result<Self> {
        Ok(Records {
            rec,
            peers: state.load_peers()?,
            fill: state.load_record(CAPACITY_FILE).ok().flatten(),
            startup: state.load_record(STARTUP_FILE).ok().flatten(),
        })
    }
}

/// The document: read from the lock, the state dir, the pins and the
/// kernel, then put together.
pub fn collect(paths: &crate::cli::Paths) -> Result<Value> {
    let state = StateDir(paths.state_dir.clone());
    let agent = agent::running(&paths.state_dir)?;
    let agent_doc = agent::section(agent.as_ref(), agent::unix_now());
    let pins = PinDir::new(&paths.bpffs);
    let pinned = verdict::pinned(&pins);
    let Some(rec) = state.load_agent()? else {
        // an agent waiting for the host has brought nothing up yet; with no
        // agent and no record, what is pinned (a state dir removed under a
        // dataplane) is still the kernel's and still runs
        anyhow::ensure!(
            agent.is_some() || !pinned.is_empty(),
            "no edgevx state in {} (has `edgevx run` ever started here?)",
            paths.state_dir.display()
        );
        return Ok(unrecorded(agent_doc, pinned));
    };
    let records = Records::load(&state, rec)?;
    let kernel = kernel::read(&state, &pins, &records.rec, &records.peers)?;
    Ok(brought_up(agent_doc, pinned, &records, &kernel))
}

/// The document before the first bring-up (no agent record): the agent,
/// and what is pinned.
fn unrecorded(agent: serde_json::Map<String, Value>, pinned: Vec<String>) -> Value {
    verdict::judged(with_agent(
        agent,
        json!({
            "node": null,
            "dataplane_attached": false,
            "pinned": pinned,
            "peers": [],
        }),
    ))
}

/// The document of a node that was brought up: what its records say, as
/// the kernel holds it.
fn brought_up(agent: serde_json::Map<String, Value>, pinned: Vec<String>, records: &Records, kernel: &Kernel) -> Value {
    let rec = &records.rec;
    let decap = kernel.decap.as_ref();
    let dataplane_attached = kernel.vtep4_on && kernel.vtep6_on && decap.is_some_and(|p| *p != Place::Absent);
    // what runs ahead of decap on the underlay: a program that ends the chain there skips its judging
    let ahead_of_decap: Vec<String> =
        decap.map(|p| p.ahead().iter().map(ToString::to_string).collect()).unwrap_or_default();
    let fill = records.fill;
    // what the agent's last pass found; the capacity itself is read from the maps
    let capacity = kernel.peer_capacity.map(|c| c as usize).or(fill.map(|f| f.capacity));
    let peers: Vec<Value> = records.peers.iter().map(|p| peers::json(p, &kernel.peers)).collect();
    verdict::judged(with_agent(
        agent,
        json!({
            "node": rec.node,
            "dataplane_attached": dataplane_attached,
            // what is pinned under --bpffs (links and programs), read from the bpffs
            "pinned": pinned,
            // null when the kernel could not be asked, or decap is not attached
            "decap_first": decap.filter(|p| **p != Place::Absent).map(|p| *p == Place::First),
            "ahead_of_decap": ahead_of_decap,
            "bridge_attached": kernel.bridge_attached,
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
            "local_pods": kernel.local_pods,
            // the limit: peers the maps hold (their max_entries)
            "peer_capacity": capacity,
            // the agent's last pass: peers its view had, and how many of them did not fit
            "peers_in_view": fill.map(|f| f.wanted),
            "peers_not_programmed": fill.map_or(0, |f| f.not_programmed),
            // the agent's first bring-up: ms from process start to each step reached
            "startup": records.startup,
            "xdp_judge": kernel.xdp_judge,
            "counters": kernel.counters,
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
    ))
}

/// The document as `--json` prints it.
fn json_text(doc: &Value) -> Result<String> {
    Ok(serde_json::to_string_pretty(doc)? + "\n")
}

pub fn run(args: StatusArgs) -> Result<()> {
    let v = collect(&args.paths)?;
    if args.prometheus {
        print!("{}", verdict::prometheus(&v)?);
    } else if args.json {
        print!("{}", json_text(&v)?);
    } else {
        print!("{}", text::render(&v)?);
    }
    verdict::exit(&v)
}
