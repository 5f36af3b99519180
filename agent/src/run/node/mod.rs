//! The dataplane of a running agent: brought up once (`bring_up.rs`), then
//! kept equal to the desired view by passes (`pass.rs`: peers; `pods.rs`:
//! local pods) and checked against the kernel (here: intact, rules,
//! readdress).
mod bring_up;
mod keep_mac;
mod mtu;
mod off_underlay;
mod pass;
mod pods;
mod xdp;

pub(super) use bring_up::bring_up;

use std::time::Instant;

use anyhow::{Context, Result};
use aya::programs::TcAttachType;
use ipnet::Ipv4Net;
use rtnetlink::Handle;
use tracing::{info, warn};

use crate::{
    dataplane::{
        bpffs, device, loader,
        maps::Maps,
        order::{Foreign, Place},
        own_addrs, vtep,
    },
    netfilter,
    peer::{OwnNode, Peer},
    reconcile::{self, Fill, Nag},
    source::LocalVtep,
    state::{AgentRecord, StateDir},
    subnet_env,
};

/// The dataplane once it is up.
pub(super) struct Node {
    /// The loaded programs until they are attached: only after the maps
    /// hold every peer, so taking over from flanneld (or from an older
    /// edgevx) never sends a packet to an empty table.
    pending: Option<crate::dataplane::loaded::Loaded>,
    /// The loaded programs once attached: the bridge program is attached
    /// later, whenever the pod bridge (re)appears.
    loaded: Option<crate::dataplane::loaded::Loaded>,
    /// The fast path's keeper and promotion loop while it is on.
    _fast_path: Option<crate::run::fast_path::FastPathTasks>,
    /// The pod bridge's ifindex while our program is attached to it.
    bridge: Option<u32>,
    /// The IPv4 firewall chains (`None` in an IPv6-only network).
    firewall: Option<netfilter::Firewall>,
    /// What both families' firewall rules are planned with.
    rules: netfilter::Settings,
    pins: bpffs::PinDir,
    handle: Handle,
    maps: Maps,
    /// `flannel.<VNI>`'s ifindex (`None` in an IPv6-only network).
    vtep_index: Option<u32>,
    underlay_index: u32,
    own: OwnNode,
    record: AgentRecord,
    /// The peers the last pass chose (for the metrics and the peer list).
    accepted: Vec<Peer>,
    /// Whether `accepted` is saved for `edgevx status` (else the next pass tries again).
    peers_saved: bool,
    /// What the last IPv4 pass left in the kernel. A new view is diffed
    /// against it, so an edit costs no read back of 10,000 map entries; a
    /// resync, a route event or a failed write drops it, and the next pass
    /// reads the kernel again.
    known: reconcile::Known<reconcile::Contents, Ipv4Net>,
    /// `drop_vxlan_off_underlay` when last looked at (`warn_off_underlay`).
    off_underlay_seen: Option<u64>,
    /// `flannel-v6.<VNI>` when IPv6 is on.
    v6: Option<super::node6::Side6>,
    /// The capacity and what the last pass left out, as last saved for
    /// `edgevx status` (`None` until the first pass saves it).
    fill: Option<Fill>,
    /// When a view beyond the capacity is logged again.
    nag: Nag,
    /// This node's addresses, read with the kernel's contents (no peer may claim one).
    own_addrs: own_addrs::OwnAddrs,
    /// When the first peer's entries went in (or a pass found them in already).
    first_peer_at: Option<Instant>,
}

impl Node {
    /// Whether `index` is either family's VTEP.
    pub(in crate::run) fn is_vtep(&self, index: u32) -> bool {
        Some(index) == self.vtep_index || self.is_vtep6(index)
    }

    /// Whether `index` is the IPv6 VTEP, whose neighbours are ours too.
    pub(in crate::run) fn is_vtep6(&self, index: u32) -> bool {
        self.v6.as_ref().is_some_and(|v6| v6.index == index)
    }

    /// What the cluster said about this node when it came up.
    pub(in crate::run) fn own(&self) -> &OwnNode {
        &self.own
    }

    /// What this node was set up with.
    pub(in crate::run) fn record(&self) -> &AgentRecord {
        &self.record
    }

    /// The peers the last pass chose.
    pub(in crate::run) fn accepted(&self) -> &[Peer] {
        &self.accepted
    }

    /// Whether the programs are attached yet.
    pub(in crate::run) fn attached(&self) -> bool {
        self.pending.is_none()
    }

    /// When the first peer's entries went in.
    pub(in crate::run) fn first_peer_at(&self) -> Option<Instant> {
        self.first_peer_at
    }

    /// A route or neighbour event, or the resync: the next pass reads both
    /// families' tables back from the kernel.
    pub(in crate::run) fn forget_kernel(&mut self) {
        self.known.forget();
        if let Some(v6) = &mut self.v6 {
            v6.known.forget();
        }
    }
}

/// `selected` cut to `capacity` (see [`reconcile::fit`]), and the figures.
fn fit(selected: Vec<Peer>, capacity: usize, established: impl Fn(&Peer) -> bool) -> (Vec<Peer>, Fill) {
    let wanted = selected.len();
    let (kept, left_out) = reconcile::fit(selected, capacity, established);
    (kept, Fill { capacity, wanted, not_programmed: left_out.len() })
}

/// subnet.env as `r` says: both families' lines, or one family's.
pub(super) fn write_subnet_env(r: &AgentRecord) -> Result<()> {
    let v4 = r.v4.as_ref().map(|v4| (v4.network, v4.subnet));
    let v6 = r.v6.as_ref().map(|v6| (v6.network, v6.subnet));
    subnet_env::write(&r.subnet_file, v4, v6, r.mtu, r.ip_masq)
        .with_context(|| format!("cannot write {}", r.subnet_file.display()))
}

impl Node {
    /// Attaches (or swaps in) the programs, then drops what flanneld left on
    /// the VTEP: per-peer arp and fdb entries, now unused.
    pub(super) async fn attach(&mut self) -> Result<()> {
        let Some(mut ebpf) = self.pending.take() else { return Ok(()) };
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        if let Some(v4) = &r.v4 {
            loader::attach_as(mode, &mut ebpf, pins, loader::ENCAP, &v4.vtep_device, TcAttachType::Egress)?;
        }
        // IPv6-only too: it judges the IPv6 VXLAN flannel-v6.<VNI> takes in
        loader::attach_as(mode, &mut ebpf, pins, loader::DECAP, &r.iface, TcAttachType::Ingress)?;
        self.loaded = Some(ebpf); // the pinned links (or filters) keep the programs; the pinned maps keep their state
        for old in self.pins.other_versions() {
            loader::retire(&old)?;
        }
        // After decap, which marks what it judged: from here on the VTEP takes
        // nothing else. And after an older layout's guard is retired: of two
        // guards in a row the first clears the mark and the second drops.
        // Not attached (retire failed): `intact` finds it missing and rebuilds.
        let ebpf = self.loaded.as_mut().context("the loaded programs are gone")?;
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        if let Some(v4) = &r.v4 {
            loader::attach_as(mode, ebpf, pins, loader::VTEP_GUARD, &v4.vtep_device, TcAttachType::Ingress)?;
        }
        if let Some(v6) = &self.v6 {
            let device = &v6.record.device;
            loader::attach_as(mode, ebpf, pins, loader::VTEP_GUARD6, device, TcAttachType::Ingress)?;
        }
        if let Some(index) = self.vtep_index {
            device::set_noarp(&self.handle, index).await?;
            match device::flush_static_neighbours(&self.handle, index).await? {
                0 => {}
                n => info!(entries = n, "removed arp/fdb entries left on the VTEP (adopted from flanneld)"),
            }
        }
        let r = &self.record;
        match &r.v4 {
            Some(v4) => {
                info!(device = %v4.vtep_device, iface = %r.iface, mac = %v4.vtep_mac, public_ip = %v4.public_ip,
                subnet = %v4.subnet, bypass_netfilter = r.bypass_netfilter, attach = r.attach.name(), "dataplane up")
            }
            None => info!(device = r.v6.as_ref().map(|v6| v6.device.as_str()), iface = %r.iface,
                attach = r.attach.name(), "dataplane up (IPv6-only)"),
        }
        Ok(())
    }

    /// What this node publishes about itself (annotations, etcd lease).
    pub(super) fn local_vtep(&self) -> LocalVtep {
        let r = &self.record;
        LocalVtep {
            vni: r.vni,
            v4: r.v4.as_ref().map(|v4| crate::peer::Half {
                vtep_mac: v4.vtep_mac,
                public_ip: v4.public_ip,
                subnet: v4.subnet,
            }),
            v6: self.v6.as_ref().map(|s| s.local()),
        }
    }

    /// Whether the VTEP devices and the attached programs are still there:
    /// `Ok(false)` when the kernel says one is gone. An error means the
    /// kernel could not be asked (the agent out of descriptors or memory):
    /// that says nothing about the dataplane, which stays as it is.
    pub(super) async fn intact(&self) -> Result<bool> {
        if self.pending.is_some() {
            return Ok(true); // not attached yet
        }
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        if let (Some(v4), Some(index)) = (&r.v4, self.vtep_index) {
            let vtep = device::link_by_name(&self.handle, &v4.vtep_device).await?;
            let on = |name, kind| loader::attached_as(mode, &self.handle, pins, name, &v4.vtep_device, kind);
            if vtep.is_none_or(|l| l.header.index != index)
                || !on(loader::ENCAP, TcAttachType::Egress).await?
                || !on(loader::VTEP_GUARD, TcAttachType::Ingress).await?
            {
                return Ok(false);
            }
        }
        if let Some(v6) = &self.v6 {
            let (guard6, device) = (loader::VTEP_GUARD6, &v6.record.device);
            if !v6.intact(&self.handle).await?
                || !loader::attached_as(mode, &self.handle, pins, guard6, device, TcAttachType::Ingress).await?
            {
                return Ok(false);
            }
        }
        loader::attached_as(mode, &self.handle, pins, loader::DECAP, &r.iface, TcAttachType::Ingress).await
    }

    /// Whether decap runs first on the underlay's ingress, as the kernel
    /// says; if something got ahead of it, decap is put back first. Returns
    /// what was found ahead (empty: decap was first, or is not attached,
    /// which [`intact`](Self::intact) finds). An error: the kernel could not
    /// be asked, or decap could not be put back.
    pub(super) async fn keep_decap_first(&mut self) -> Result<Vec<Foreign>> {
        if self.pending.is_some() {
            return Ok(Vec::new()); // not attached yet
        }
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        let place = loader::place_as(mode, &self.handle, pins, loader::DECAP, &r.iface, TcAttachType::Ingress).await?;
        let Place::Behind(ahead) = place else { return Ok(Vec::new()) };
        let ebpf = self.loaded.as_mut().context("the loaded programs are gone")?;
        loader::put_first(mode, ebpf, pins, loader::DECAP, &r.iface, TcAttachType::Ingress)
            .with_context(|| format!("cannot put edgevx's decap back first on {}", r.iface))?;
        Ok(ahead)
    }

    /// Re-asserts our firewall chains (someone may have flushed them).
    pub(super) fn enforce_rules(&self) {
        let r = &self.record;
        if let (Some(fw), Some(v4)) = (&self.firewall, &r.v4)
            && let Err(e) = fw.apply(&netfilter::plan(v4.network, v4.subnet, &self.rules))
        {
            warn!("cannot restore the firewall rules: {e:#}");
        }
        if let Some(v6) = &self.v6 {
            v6.enforce_rules(&self.rules);
        }
    }
}

pub(super) async fn readdress(n: &mut Node, own: &OwnNode, state: &StateDir) -> Result<()> {
    if let (Some(index), Some(v4), Some(subnet)) = (n.vtep_index, n.record.v4.as_mut(), own.subnet) {
        vtep::ensure_address(&n.handle, index, subnet, v4.network).await?;
        if let Some(fw) = &n.firewall {
            fw.apply(&netfilter::plan(v4.network, subnet, &n.rules)).context("cannot update the firewall rules")?;
        }
        v4.subnet = subnet;
    }
    if let (Some(v6), Some(subnet6)) = (&mut n.v6, own.subnet6)
        && v6.record.subnet != subnet6
    {
        vtep::ensure_address(&n.handle, v6.index, subnet6, v6.record.network).await?;
        v6.record.subnet = subnet6;
        n.record.v6 = Some(v6.record.clone());
    }
    write_subnet_env(&n.record)?;
    n.own = own.clone();
    state.save_agent(&n.record);
    Ok(())
}
