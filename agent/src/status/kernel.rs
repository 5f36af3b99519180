//! What the kernel holds for a node that was brought up, read once for a
//! `status` document: where the programs sit (the kernel's word, not the
//! pins'), what the maps hold, and the routes DirectRouting made.
use std::collections::BTreeMap;

use super::{document::XdpJudge, peers};
use crate::{
    dataplane::{bpffs::PinDir, clsact, loader, maps::Maps, order::Place, routes},
    peer::Peer,
    state::{AgentRecord, StateDir},
};
use anyhow::{Context, Result};
use aya::programs::TcAttachType;

/// The kernel's answers for one document.
pub(super) struct Kernel {
    /// The encap on `flannel.<VNI>`'s egress and the VTEP guard on its
    /// ingress (true in an IPv6-only network: no IPv4 VTEP to put them on).
    pub vtep4_on: bool,
    /// The VTEP guard on `flannel-v6.<VNI>` (true when IPv6 is off).
    pub vtep6_on: bool,
    /// Decap's place on the underlay's ingress; `None` when the kernel
    /// could not be asked.
    pub decap: Option<Place>,
    /// The bridge program on the pod bridge's egress.
    pub bridge_attached: bool,
    /// The global counters, summed over CPUs; `None` without the maps.
    pub counters: Option<BTreeMap<&'static str, u64>>,
    /// Pods the bridge program has learned (0 without the maps).
    pub local_pods: usize,
    /// Peers the maps hold (their `max_entries`); `None` without the maps.
    pub peer_capacity: Option<u32>,
    /// What the kernel holds of each peer.
    pub peers: peers::Seen,
    /// The XDP judge, as its module says it.
    pub xdp_judge: XdpJudge,
}

/// Reads what the kernel holds for the node `rec` describes and its `peers`.
pub(super) fn read(state: &StateDir, pins: &PinDir, rec: &AgentRecord, peers: &[Peer]) -> Result<Kernel> {
    let attached = Attached { pins, rec };
    let maps = Maps::open(pins).ok();
    let counters = maps.as_ref().map(Maps::global_stats).transpose()?;
    let xdp_judge = crate::dataplane::xdp::status_json(state, pins, &rec.iface, rec.xdp_judge);
    // dataplane::xdp says it as JSON; tests.rs holds that to XdpJudge's shape
    let xdp_judge = serde_json::from_value(xdp_judge)
        .context("cannot read dataplane::xdp's status of the judge as the document's XdpJudge")?;
    let mut seen = match &maps {
        Some(m) => peers_in_maps(m, peers)?,
        None => peers::Seen::default(),
    };
    seen.direct = rec.v4.as_ref().map(|v4| routes::direct_routes_blocking(&rec.iface, v4.network)).unwrap_or_default();
    Ok(Kernel {
        // IPv6-only: no IPv4 VTEP, so no encap program and no VTEP guard
        vtep4_on: rec.v4.as_ref().is_none_or(|v4| {
            attached.on(loader::ENCAP, &v4.vtep_device, TcAttachType::Egress)
                && attached.on(loader::VTEP_GUARD, &v4.vtep_device, TcAttachType::Ingress)
        }),
        vtep6_on: rec.v6.as_ref().is_none_or(|v6| attached.on(loader::VTEP_GUARD6, &v6.device, TcAttachType::Ingress)),
        decap: attached.place(loader::DECAP, &rec.iface, TcAttachType::Ingress),
        bridge_attached: attached.on(loader::BRIDGE, &rec.pod_bridge, TcAttachType::Egress),
        counters,
        local_pods: maps.as_ref().map_or(0, |m| m.local_pods().len()),
        peer_capacity: maps.as_ref().map(Maps::peer_capacity),
        peers: seen,
        xdp_judge,
    })
}

/// Where the programs sit, in the attach mode the agent recorded.
struct Attached<'a> {
    pins: &'a PinDir,
    rec: &'a AgentRecord,
}

impl Attached<'_> {
    /// Where program `name` sits on `iface`'s hook `kind`; `None` when the
    /// kernel could not be asked.
    fn place(&self, name: &str, iface: &str, kind: TcAttachType) -> Option<Place> {
        match self.rec.attach {
            loader::AttachMode::Tcx => loader::tcx_place(self.pins, name, iface, kind).ok(),
            loader::AttachMode::Clsact => clsact::place_blocking(iface, kind),
        }
    }

    /// Whether program `name` runs on `iface`'s hook `kind`.
    fn on(&self, name: &str, iface: &str, kind: TcAttachType) -> bool {
        self.place(name, iface, kind).is_some_and(|p| p != Place::Absent)
    }
}

/// What the maps hold of the peers: the IPv4 LPM and accept entries, the
/// IPv6 accept entries, and each IPv4 peer's counters.
fn peers_in_maps(maps: &Maps, peers: &[Peer]) -> Result<peers::Seen> {
    let stats = peers.iter().filter_map(|p| p.v4).filter_map(|h| Some((h.public_ip, maps.peer_stats(h.public_ip)?)));
    Ok(peers::Seen {
        programmed: maps.subnets()?,
        accepted: maps.accepted::<ipnet::Ipv4Net>()?,
        accepted6: maps.accepted::<ipnet::Ipv6Net>().unwrap_or_default(),
        direct: BTreeMap::new(),
        stats: stats.collect(),
    })
}
