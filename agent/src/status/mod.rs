//! `edgevx status`: what is programmed, read from the pins and the state
//! dir, so it works with the agent running or stopped. Whether the agent
//! runs is the kernel's answer: who holds the lock of this network
//! namespace (`run::netns_lock`), never a recorded pid. The document is
//! versioned ([`SCHEMA`]), typed in [`document`] and documented field by
//! field in the book (docs/src/operations/status.md); `verdict` turns it
//! into the exit code and the node-level metrics. `collect` reads (the
//! lock, the state dir's records, the kernel), then puts the document
//! together without touching the host, which tests.rs holds to snapshots.
mod agent;
pub mod document;
mod kernel;
mod peers;
mod text;
mod verdict;

#[cfg(test)]
mod tests;

pub use document::{NodeState, Status};
pub use verdict::pinned;

use anyhow::{Context, Result};

use document::{Agent, BroughtUp, Capacity, Delivery, Node, Startup, Vtep4, Vtep6};
use kernel::Kernel;

use crate::{
    cli::StatusArgs,
    dataplane::{bpffs::PinDir, order::Place},
    metrics::startup::STARTUP_FILE,
    peer::Peer,
    reconcile::{CAPACITY_FILE, Fill},
    state::{AgentRecord, Record4, Record6, StateDir},
};

/// The version of the document `status --json` prints: raised when a
/// field changes meaning or goes; new fields do not raise it.
pub const SCHEMA: u32 = 1;

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
    startup: Option<Startup>,
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
pub fn collect(paths: &crate::cli::Paths) -> Result<Status> {
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
fn unrecorded(agent: Agent, pinned: Vec<String>) -> Status {
    let node = Node { node: None, dataplane_attached: false, pinned, brought_up: None, peers: Vec::new() };
    verdict::judged(agent, node)
}

/// The document of a node that was brought up: what its records say, as
/// the kernel holds it.
fn brought_up(agent: Agent, pinned: Vec<String>, records: &Records, kernel: &Kernel) -> Status {
    let decap_on = kernel.decap.as_ref().is_some_and(|p| *p != Place::Absent);
    let node = Node {
        node: Some(records.rec.node.clone()),
        dataplane_attached: kernel.vtep4_on && kernel.vtep6_on && decap_on,
        pinned,
        brought_up: Some(configured(records, kernel)),
        peers: records.peers.iter().map(|p| peers::status(p, &kernel.peers)).collect(),
    };
    verdict::judged(agent, node)
}

/// What the agent record says the node was brought up with, and where the
/// kernel has its programs.
fn configured(records: &Records, kernel: &Kernel) -> BroughtUp {
    let rec = &records.rec;
    let decap = kernel.decap.as_ref();
    let fill = records.fill;
    BroughtUp {
        decap_first: decap.filter(|p| **p != Place::Absent).map(|p| *p == Place::First),
        // a program that ends the chain there skips decap's judging
        ahead_of_decap: decap.map(|p| p.ahead().iter().map(ToString::to_string).collect()).unwrap_or_default(),
        bridge_attached: kernel.bridge_attached,
        attach: rec.attach,
        iface: rec.iface.clone(),
        vtep: Vtep4::from(rec.v4.as_ref()),
        vni: rec.vni,
        port: rec.port,
        mtu: rec.mtu,
        delivery: if rec.bypass_netfilter { Delivery::BypassNetfilter } else { Delivery::HostStack },
        ip_masq: rec.ip_masq,
        fast_path: Some(rec.fast_path.clone()).filter(|f| !f.is_empty()),
        xdp_judge: kernel.xdp_judge.clone(),
        local_pods: kernel.local_pods,
        capacity: Capacity {
            // read from the maps; the last pass's figure without them
            peer_capacity: kernel.peer_capacity.map(|c| c as usize).or(fill.map(|f| f.capacity)),
            peers_in_view: fill.map(|f| f.wanted),
            peers_not_programmed: fill.map_or(0, |f| f.not_programmed),
        },
        startup: records.startup.clone(),
        counters: kernel.counters.clone(),
        vtep6: rec.v6.as_ref().map(Vtep6::from),
    }
}

/// The IPv4 VTEP the agent recorded (every field null in an IPv6-only network).
impl From<Option<&Record4>> for Vtep4 {
    fn from(v4: Option<&Record4>) -> Self {
        Vtep4 {
            vtep_device: v4.map(|v4| v4.vtep_device.clone()),
            vtep_mac: v4.map(|v4| v4.vtep_mac),
            public_ip: v4.map(|v4| v4.public_ip),
            subnet: v4.map(|v4| v4.subnet),
            network: v4.map(|v4| v4.network),
        }
    }
}

/// The IPv6 VTEP the agent recorded.
impl From<&Record6> for Vtep6 {
    fn from(v6: &Record6) -> Self {
        Vtep6 {
            device: v6.device.clone(),
            mac: v6.mac,
            public_ip: v6.public_ip,
            subnet: v6.subnet,
            network: v6.network,
            mtu: v6.mtu,
        }
    }
}

/// The document as `--json` prints it. Through a `serde_json::Value`,
/// whose objects sort their keys (no `preserve_order` here): the order of
/// every earlier version, which the flattened sections could not give
/// (document.rs).
fn json_text(doc: &Status) -> Result<String> {
    let v = serde_json::to_value(doc).context("cannot put the status document into JSON")?;
    Ok(serde_json::to_string_pretty(&v)? + "\n")
}

pub fn run(args: StatusArgs) -> Result<()> {
    let doc = collect(&args.paths)?;
    if args.prometheus {
        print!("{}", verdict::prometheus(&doc)?);
    } else if args.json {
        print!("{}", json_text(&doc)?);
    } else {
        print!("{}", text::render(&doc)?);
    }
    verdict::exit(&doc)
}
