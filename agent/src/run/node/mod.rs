//! The dataplane of a running agent: brought up once (`bring_up.rs`), one
//! side per family (`side.rs`), then kept equal to the desired view by
//! passes (`pass.rs`: peers; `pods.rs`: local pods) and checked against the
//! kernel (here: intact, rules, readdress).
mod bring_up;
mod keep_mac;
mod mtu;
mod off_underlay;
mod pass;
mod pods;
mod side;
mod xdp;

pub(super) use bring_up::bring_up;

use std::time::Instant;

use anyhow::{Context, Result};
use aya::programs::TcAttachType;
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::info;

use side::{Side, SideFamily, Sides};

use crate::{
    dataplane::{
        bpffs, device, loader,
        maps::Maps,
        order::{Foreign, Place},
        own_addrs,
    },
    netfilter,
    peer::{OwnNode, Peer},
    reconcile::{Fill, Nag},
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
    /// One side per family the network config has on: its VTEP, firewall
    /// chains and peer table.
    sides: Sides,
    /// What both families' firewall rules are planned with.
    rules: netfilter::Settings,
    pins: bpffs::PinDir,
    handle: Handle,
    maps: Maps,
    underlay_index: u32,
    own: OwnNode,
    record: AgentRecord,
    /// The peers the last pass chose (for the metrics and the peer list).
    accepted: Vec<Peer>,
    /// Whether `accepted` is saved for `edgevx status` (else the next pass tries again).
    peers_saved: bool,
    /// `drop_vxlan_off_underlay` when last looked at (`warn_off_underlay`).
    off_underlay_seen: Option<u64>,
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
        self.sides.is_vtep(index)
    }

    /// Whether `index` is a VTEP whose neighbours are ours too (the IPv6
    /// one: its peer table is the kernel's entries).
    pub(in crate::run) fn holds_entries(&self, index: u32) -> bool {
        self.sides.holds_entries(index)
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
        self.sides.forget();
    }
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
        self.attach_to_vtep::<Ipv4Net>(&mut ebpf, Ipv4Net::ENCAP, TcAttachType::Egress)?;
        self.attach_to_vtep::<Ipv6Net>(&mut ebpf, Ipv6Net::ENCAP, TcAttachType::Egress)?;
        let (mode, r) = (self.record.attach, &self.record);
        // IPv6-only too: it judges the IPv6 VXLAN flannel-v6.<VNI> takes in
        loader::attach_as(mode, &mut ebpf, &self.pins, loader::DECAP, &r.iface, TcAttachType::Ingress)?;
        for old in self.pins.other_versions() {
            if let Err(e) = loader::retire(&old) {
                // the pinned links (or filters) keep the programs; the pinned maps keep their state
                self.loaded = Some(ebpf);
                return Err(e);
            }
        }
        // After decap, which marks what it judged: from here on the VTEP takes
        // nothing else. And after an older layout's guard is retired: of two
        // guards in a row the first clears the mark and the second drops.
        // Not attached (retire failed): `intact` finds it missing and rebuilds.
        let guards = match self.attach_to_vtep::<Ipv4Net>(&mut ebpf, Some(Ipv4Net::GUARD), TcAttachType::Ingress) {
            Ok(()) => self.attach_to_vtep::<Ipv6Net>(&mut ebpf, Some(Ipv6Net::GUARD), TcAttachType::Ingress),
            Err(e) => Err(e),
        };
        self.loaded = Some(ebpf);
        guards?;
        self.quiet_vtep::<Ipv4Net>().await?;
        self.quiet_vtep::<Ipv6Net>().await?;
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

    /// Attaches `program` (if any) to the family's VTEP, when it is on.
    fn attach_to_vtep<N: SideFamily>(
        &self,
        ebpf: &mut crate::dataplane::loaded::Loaded,
        program: Option<&str>,
        kind: TcAttachType,
    ) -> Result<()> {
        let (Some(program), Some(vtep)) = (program, N::vtep(&self.record)) else { return Ok(()) };
        loader::attach_as(self.record.attach, ebpf, &self.pins, program, vtep.device, kind)
    }

    /// The family's VTEP sends no arp and keeps no static neighbour when
    /// the programs encapsulate for it (the IPv6 VTEP's entries are its
    /// peer table's).
    async fn quiet_vtep<N: SideFamily>(&self) -> Result<()> {
        let Some(side) = N::side(&self.sides).filter(|_| N::ENCAP.is_some()) else { return Ok(()) };
        device::set_noarp(&self.handle, side.index).await?;
        match device::flush_static_neighbours(&self.handle, side.index).await? {
            0 => {}
            n => info!(entries = n, "removed arp/fdb entries left on the VTEP (adopted from flanneld)"),
        }
        Ok(())
    }

    /// What this node publishes about itself (annotations, etcd lease).
    pub(super) fn local_vtep(&self) -> LocalVtep {
        let r = &self.record;
        LocalVtep {
            vni: r.vni,
            v4: Ipv4Net::vtep(r).map(|v| Side::local(&v)),
            v6: Ipv6Net::vtep(r).map(|v| Side::local(&v)),
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
        if !self.side_intact::<Ipv4Net>().await? || !self.side_intact::<Ipv6Net>().await? {
            return Ok(false);
        }
        let (mode, r) = (self.record.attach, &self.record);
        loader::attached_as(mode, &self.handle, &self.pins, loader::DECAP, &r.iface, TcAttachType::Ingress).await
    }

    /// [`intact`](Self::intact) for one family's side (a family that is off is).
    async fn side_intact<N: SideFamily>(&self) -> Result<bool> {
        let (Some(side), Some(vtep)) = (N::side(&self.sides), N::vtep(&self.record)) else { return Ok(true) };
        side.intact(&self.handle, &vtep, self.record.attach, &self.pins).await
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

    /// Re-asserts both families' firewall chains (someone may have flushed them).
    pub(super) fn enforce_rules(&self) {
        self.enforce_side_rules::<Ipv4Net>();
        self.enforce_side_rules::<Ipv6Net>();
    }

    fn enforce_side_rules<N: SideFamily>(&self) {
        if let (Some(side), Some(vtep)) = (N::side(&self.sides), N::vtep(&self.record)) {
            side.enforce_rules(&vtep, &self.rules);
        }
    }

    /// Gives the family's VTEP `subnet`, our new pod CIDR of the family,
    /// when it differs from the recorded one.
    async fn readdress_side<N: SideFamily>(&mut self, subnet: Option<N>) -> Result<()> {
        let (Some(side), Some(vtep), Some(subnet)) = (N::side(&self.sides), N::vtep(&self.record), subnet) else {
            return Ok(());
        };
        if vtep.subnet != subnet {
            side.readdress(&self.handle, &vtep, subnet, &self.rules).await?;
            N::set_subnet(&mut self.record, subnet);
        }
        Ok(())
    }
}

/// Our pod CIDRs changed: each family's VTEP and firewall take the new one,
/// then subnet.env and the record.
pub(super) async fn readdress(n: &mut Node, own: &OwnNode, state: &StateDir) -> Result<()> {
    n.readdress_side::<Ipv4Net>(own.subnet).await?;
    n.readdress_side::<Ipv6Net>(own.subnet6).await?;
    write_subnet_env(&n.record)?;
    n.own = own.clone();
    state.save_agent(&n.record);
    Ok(())
}
