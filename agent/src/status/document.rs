//! The document `edgevx status --json` prints, one struct per section; each
//! field says what the book's "Every field of `--json`" table says of it
//! (docs/src/operations/status.md). The document is versioned
//! ([`super::SCHEMA`]): a field that changes meaning or goes raises it.
//!
//! Key order: serde_json is built here without `preserve_order`, so the
//! `json!` document these types replaced printed every object's keys
//! sorted. The sections are flattened into one top-level object, which no
//! declaration order could sort, so the document is printed through a
//! `serde_json::Value`, whose objects sort their keys (`super::json_text`).
//! Fields are declared in the order the book lists them, as far as the
//! sections allow; the snapshot tests (tests.rs) hold the printed bytes.
//!
//! Null or absent: a field that is `Option` without `skip_serializing_if`
//! prints `null`; the sections flattened as an `Option` (what a node that
//! was brought up adds, a peer's counters) are absent when `None`, as are
//! the milestones of [`Startup`] not reached.
//!
//! The readers (the table, the exit code, the textfile metrics) take these
//! types in the same process, so only what is read from a file or from
//! another module's JSON ([`Startup`], [`XdpJudge`]) is `Deserialize`.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::{
    dataplane::{loader::AttachMode, xdp::XdpChoice},
    mac::VtepMac,
};

/// The whole document: the agent, the node, and the state they add up to.
#[derive(Debug, Serialize)]
pub struct Status {
    /// The agent's fields, at the top level.
    #[serde(flatten)]
    pub agent: Agent,
    /// The node's state (the exit code says it too).
    pub state: NodeState,
    /// The state's one-line reason, for people.
    pub verdict: String,
    /// The node's fields, at the top level.
    #[serde(flatten)]
    pub node: Node,
}

/// What `status` says of the agent itself, the same in every document.
#[derive(Debug, Serialize)]
pub struct Agent {
    /// The document's version ([`super::SCHEMA`]).
    pub status_schema: u32,
    /// This `edgevx` binary's release.
    pub version: &'static str,
    /// The running agent's release (`None`: no agent, or one older than 0.2,
    /// whose lock record has none).
    pub agent_version: Option<String>,
    /// Whether an `edgevx run` on this state dir holds the node's lock
    /// (the kernel's answer: `fcntl(F_GETLK)`, never a recorded pid).
    pub agent_running: bool,
    /// Its pid as this pid namespace sees it (`None` when it runs in one
    /// this process cannot see, such as another container).
    pub agent_pid: Option<u32>,
    /// What it is doing: `starting`, `waiting for the host: …`, `bringing
    /// up the dataplane`, what `/readyz` says, `forwarding`, `stopping`.
    pub agent_phase: Option<String>,
    /// The running agent's control plane (`None` with no agent).
    pub source: Option<Source>,
}

/// The running agent's control plane, as its lock record says it.
#[derive(Debug, Serialize)]
pub struct Source {
    /// `kube`, `etcd` or `nodes file`.
    pub name: String,
    /// In touch now: read in full and its watch open (as
    /// `edgevx_source_watching`).
    pub watching: bool,
    /// How long `watching` has had its value: in touch for, or cut off for.
    pub since_seconds: u64,
    /// The view in use came from the source, not from the cache.
    pub connected: bool,
    /// The age of the view in use (`None`: no view yet); in etcd mode views
    /// come on lease changes, so a large age alone is not staleness.
    pub view_age_seconds: Option<u64>,
}

/// The node's state, from the kernel's answers in the document: the
/// book's table "The node's state and the exit code".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum NodeState {
    /// An agent runs and the programs are attached: exit 0.
    Forwarding,
    /// The programs are not attached (or nothing was brought up): exit 1.
    NotForwarding,
    /// Programs are attached or pinned and no agent runs: they forward
    /// and judge with whatever peers they last had, and nothing keeps them
    /// current. Exit 3.
    Unmanaged,
}

impl NodeState {
    /// Every state, in the order the textfile metrics print them.
    pub const ALL: [NodeState; 3] = [NodeState::Forwarding, NodeState::NotForwarding, NodeState::Unmanaged];

    /// As `state` and the `edgevx_node_state{state}` label say it.
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Forwarding => "forwarding",
            NodeState::NotForwarding => "not_forwarding",
            NodeState::Unmanaged => "unmanaged",
        }
    }

    /// `status`'s exit code (2 stays the usage error's).
    pub fn exit_code(self) -> u8 {
        match self {
            NodeState::Forwarding => 0,
            NodeState::NotForwarding => 1,
            NodeState::Unmanaged => 3,
        }
    }
}

impl From<NodeState> for &'static str {
    fn from(s: NodeState) -> Self {
        s.name()
    }
}

/// What is programmed on the node, read from the pins, the state dir and
/// the kernel.
#[derive(Debug, Serialize)]
pub struct Node {
    /// This node's name (`None` before the first bring-up).
    pub node: Option<String>,
    /// Encap, the VTEP guards and decap attached, as the kernel says.
    pub dataplane_attached: bool,
    /// The links and programs pinned under `--bpffs`, every layout version
    /// (`v7/links/edgevx_decap`).
    pub pinned: Vec<String>,
    /// What a node that was brought up adds (absent before the first
    /// bring-up: no agent record).
    #[serde(flatten)]
    pub brought_up: Option<BroughtUp>,
    /// Each peer of the agent's last pass.
    pub peers: Vec<PeerStatus>,
}

/// What the agent record and the kernel say of a node brought up.
#[derive(Debug, Serialize)]
pub struct BroughtUp {
    /// Whether decap runs first on the underlay's ingress (`None` when the
    /// kernel could not be asked, or decap is not attached).
    pub decap_first: Option<bool>,
    /// The programs that run before decap there, read from the kernel.
    pub ahead_of_decap: Vec<String>,
    /// The bridge program on the pod bridge.
    pub bridge_attached: bool,
    /// `tcx` or `clsact`.
    pub attach: AttachMode,
    /// The underlay interface.
    pub iface: String,
    /// The IPv4 VTEP's fields, at the top level.
    #[serde(flatten)]
    pub vtep: Vtep4,
    /// As in subnet.env.
    pub vni: u32,
    /// As in subnet.env.
    pub port: u16,
    /// As in subnet.env.
    pub mtu: u32,
    /// `host-stack` or `bypass-netfilter`.
    pub delivery: Delivery,
    /// `--ip-masq`.
    pub ip_masq: bool,
    /// `on`, or why not (`None` in the records of earlier versions); the
    /// per-reason counts are in `counters` (`fast_path_*`).
    pub fast_path: Option<String>,
    /// The XDP judge.
    pub xdp_judge: XdpJudge,
    /// Pods the bridge program has learned.
    pub local_pods: usize,
    /// The limit and the last pass's fill, at the top level.
    #[serde(flatten)]
    pub capacity: Capacity,
    /// The first bring-up's milestones (`None`: not saved yet).
    pub startup: Option<Startup>,
    /// The global counters, summed over CPUs (`None` when the maps could
    /// not be opened).
    pub counters: Option<BTreeMap<&'static str, u64>>,
    /// The IPv6 VTEP, `flannel-v6.<VNI>` (`None` when IPv6 is off).
    pub vtep6: Option<Vtep6>,
}

/// The IPv4 VTEP, `flannel.<VNI>`: every field `None` in an IPv6-only
/// network.
#[derive(Debug, Serialize)]
pub struct Vtep4 {
    /// The device, `flannel.<VNI>`.
    pub vtep_device: Option<String>,
    /// Its MAC, the one peers address.
    pub vtep_mac: Option<VtepMac>,
    /// This node's IPv4 underlay address, the VTEP's.
    pub public_ip: Option<Ipv4Addr>,
    /// This node's IPv4 pod subnet.
    pub subnet: Option<Ipv4Net>,
    /// The cluster's IPv4 network.
    pub network: Option<Ipv4Net>,
}

/// The IPv6 VTEP, `flannel-v6.<VNI>`. Twin of [`Vtep4`] because the
/// document's schema (version 1) has two shapes: the IPv4 VTEP's fields at
/// the top level under the names of the first release, the IPv6 VTEP an
/// object `vtep6` with its own names and its MTU. One type would change
/// the document.
#[derive(Debug, Serialize)]
pub struct Vtep6 {
    /// The device, `flannel-v6.<VNI>`.
    pub device: String,
    /// Its MAC, the one peers address.
    pub mac: VtepMac,
    /// This node's IPv6 underlay address, the VTEP's.
    pub public_ip: Ipv6Addr,
    /// This node's IPv6 pod subnet.
    pub subnet: Ipv6Net,
    /// The cluster's IPv6 network.
    pub network: Ipv6Net,
    /// The IPv6 VTEP's MTU.
    pub mtu: u32,
}

/// How decapsulated traffic reaches the pods (docs/src/concepts/delivery.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum Delivery {
    /// Through the host's stack, netfilter included.
    HostStack,
    /// `--bypass-netfilter`.
    BypassNetfilter,
}

impl Delivery {
    /// As `delivery` says it.
    pub fn name(self) -> &'static str {
        match self {
            Delivery::HostStack => "host-stack",
            Delivery::BypassNetfilter => "bypass-netfilter",
        }
    }
}

impl From<Delivery> for &'static str {
    fn from(d: Delivery) -> Self {
        d.name()
    }
}

/// The XDP judge on the underlay, as `dataplane::xdp::status_json` says it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct XdpJudge {
    /// `--xdp-judge`: `auto`, `on` or `off`.
    pub choice: XdpChoice,
    /// Our pinned link on the underlay, as the kernel says (`None` when the
    /// kernel could not be asked).
    pub attached: Option<bool>,
    /// `native` when attached (never generic mode); `None` otherwise.
    pub mode: Option<String>,
    /// Why it is not attached: the agent's record of its last decision.
    pub reason: Option<String>,
}

/// The limit, and the agent's last pass's fill.
#[derive(Debug, Serialize)]
pub struct Capacity {
    /// How many peers the maps hold (their `max_entries`, read from the
    /// kernel; the last pass's figure without the maps).
    pub peer_capacity: Option<usize>,
    /// Peers the agent's last pass had in its view (`None`: no pass saved).
    pub peers_in_view: Option<usize>,
    /// Of those, the peers that did not fit.
    pub peers_not_programmed: usize,
}

/// The agent's first bring-up: ms from process start to each milestone
/// reached (absent: not reached). Read from `startup.json` in the state
/// dir (`metrics::startup`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Startup {
    /// subnet.env written: the CNI can add pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_env_ms: Option<f64>,
    /// The VTEP device up with its MAC and address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep_up_ms: Option<f64>,
    /// The programs attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_ms: Option<f64>,
    /// The first peer's entries written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_peer_ms: Option<f64>,
    /// A pass that wrote every peer of the view, both families, attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_peers_ms: Option<f64>,
    /// The agent process these are of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// One peer: its IPv4 half at the top level (the layout of every earlier
/// version), its IPv6 half under `v6`; in an IPv6-only network the top
/// level is the IPv6 half.
#[derive(Debug, Serialize)]
pub struct PeerStatus {
    /// The peer's node name.
    pub node: String,
    /// Its pod subnet.
    pub subnet: Option<IpNet>,
    /// Its underlay address, its VTEP's.
    pub public_ip: Option<IpAddr>,
    /// Its VTEP's MAC.
    pub vtep_mac: Option<VtepMac>,
    /// Its LPM and accept entries are in the maps (the kernel's word); in
    /// an IPv6-only network, its address is in the IPv6 accept map.
    pub in_dataplane: bool,
    /// `vxlan`, `direct`, or `ipv6` in an IPv6-only network.
    pub route: Route,
    /// Its counters (absent in an IPv6-only network: they are kept by IPv4
    /// address).
    #[serde(flatten)]
    pub counters: Option<PeerCounters>,
    /// A dual-stack peer's IPv6 half (`None` otherwise).
    pub v6: Option<Ipv6HalfStatus>,
}

/// How a peer's pods are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum Route {
    /// Through the VTEP.
    Vxlan,
    /// DirectRouting: a plain route through the underlay, read from the kernel.
    Direct,
    /// An IPv6-only network's peer (`flannel-v6.<VNI>`).
    Ipv6,
}

impl Route {
    /// As `route` says it.
    pub fn name(self) -> &'static str {
        match self {
            Route::Vxlan => "vxlan",
            Route::Direct => "direct",
            Route::Ipv6 => "ipv6",
        }
    }
}

impl From<Route> for &'static str {
    fn from(r: Route) -> Self {
        r.name()
    }
}

/// A peer's counters, summed over CPUs.
#[derive(Debug, Serialize)]
pub struct PeerCounters {
    /// Packets encapsulated to it.
    pub tx_packets: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Packets decapsulated from it.
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames for this peer that could not be encapsulated.
    pub tx_errors: u64,
}

/// A dual-stack peer's IPv6 half.
#[derive(Debug, Serialize)]
pub struct Ipv6HalfStatus {
    /// Its IPv6 pod subnet.
    pub subnet: Ipv6Net,
    /// Its IPv6 underlay address, its IPv6 VTEP's.
    pub public_ip: Ipv6Addr,
    /// Its IPv6 VTEP's MAC.
    pub vtep_mac: VtepMac,
    /// Its address is in the IPv6 accept map.
    pub in_dataplane: bool,
}
