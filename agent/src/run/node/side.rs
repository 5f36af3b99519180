//! One family's side of the node, the same path for both families: its
//! VTEP device, its firewall chains and its peer table, brought up from the
//! family's [`Plan`], kept by the same checks and synced by the same pass
//! ([`reconcile::sync`]). What differs per family is data on
//! [`SideFamily`], each with its reason; what the side was set up with is in
//! the node's one [`AgentRecord`], read through [`Vtep`].
use anyhow::{Context, Result};
use aya::programs::TcAttachType;
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::{info, warn};

use crate::{
    dataplane::{
        bpffs::PinDir,
        device,
        ipv4_table::Ipv4MapTable,
        ipv6_table::Ipv6EntryTable,
        loader::{self, AttachMode},
        maps::Maps,
        vtep,
    },
    mac::VtepMac,
    netconf::NetConf,
    netfilter,
    peer::{Half, Peer, PeerHalf, Rejection},
    reconcile::{self, Ipv4Maps, Ipv6Entries, Known, PeerTable, Synced},
    run::vtep_plan::{Plan, StackFamily},
    state::AgentRecord,
};

/// A family's VTEP as the agent record holds it.
pub(super) struct Vtep<'r, N: SideFamily> {
    pub(super) device: &'r str,
    pub(super) mac: VtepMac,
    pub(super) public_ip: N::Addr,
    pub(super) subnet: N,
    pub(super) network: N,
}

/// What a pass's table is given, whichever the family.
pub(super) struct TableAt<'a> {
    pub(super) handle: &'a Handle,
    pub(super) maps: &'a mut Maps,
    /// The family's VTEP.
    pub(super) vtep: u32,
    /// The underlay, where DirectRouting's routes go out.
    pub(super) underlay: u32,
    /// The programs are not attached yet (see [`Ipv4MapTable::hold_deletes`]).
    pub(super) hold_deletes: bool,
}

/// Where the two families' sides differ.
pub(super) trait SideFamily: StackFamily + PeerHalf {
    /// What the family's peer table holds.
    type Contents;
    /// The family's peer table for one pass.
    type Table<'a>: PeerTable<Family = Self, Contents = Self::Contents>;
    /// The program that encapsulates on the VTEP's egress. The IPv4 VTEP's
    /// packets are the programs' (its arp and fdb are not used); the IPv6
    /// VTEP is flannel's kernel device, which encapsulates by the entries
    /// its table writes: none.
    const ENCAP: Option<&'static str>;
    /// The guard on the VTEP's ingress: it drops what decap did not judge.
    /// One per family because each parses its own outer header.
    const GUARD: &'static str;
    /// The family's VTEP in `r` (`None`: the family is off).
    fn vtep(r: &AgentRecord) -> Option<Vtep<'_, Self>>;
    /// Records a new pod CIDR.
    fn set_subnet(r: &mut AgentRecord, subnet: Self);
    /// Records the VTEP's MTU. The IPv4 VTEP's is the record's `mtu`, the
    /// one subnet.env says, so there is nothing of its own to record.
    fn set_mtu(r: &mut AgentRecord, mtu: u32);
    /// The family's table, written for `vtep`.
    fn table<'a>(at: TableAt<'a>, vtep: &Vtep<'_, Self>) -> Self::Table<'a>;
    /// The family's side of `sides`.
    fn side(sides: &Sides) -> Option<&Side<Self>>;
    fn side_mut(sides: &mut Sides) -> Option<&mut Side<Self>>;
}

impl SideFamily for Ipv4Net {
    type Contents = Ipv4Maps;
    type Table<'a> = Ipv4MapTable<'a>;
    const ENCAP: Option<&'static str> = Some(loader::ENCAP);
    const GUARD: &'static str = loader::VTEP_GUARD;
    fn vtep(r: &AgentRecord) -> Option<Vtep<'_, Self>> {
        let v4 = r.v4.as_ref()?;
        Some(Vtep {
            device: &v4.vtep_device,
            mac: v4.vtep_mac,
            public_ip: v4.public_ip,
            subnet: v4.subnet,
            network: v4.network,
        })
    }
    fn set_subnet(r: &mut AgentRecord, subnet: Self) {
        if let Some(v4) = &mut r.v4 {
            v4.subnet = subnet;
        }
    }
    fn set_mtu(_: &mut AgentRecord, _: u32) {}
    fn table<'a>(at: TableAt<'a>, vtep: &Vtep<'_, Self>) -> Ipv4MapTable<'a> {
        Ipv4MapTable {
            maps: at.maps,
            handle: at.handle,
            vtep_index: at.vtep,
            underlay_index: at.underlay,
            network: vtep.network,
            hold_deletes: at.hold_deletes,
        }
    }
    fn side(sides: &Sides) -> Option<&Side<Self>> {
        sides.v4.as_ref()
    }
    fn side_mut(sides: &mut Sides) -> Option<&mut Side<Self>> {
        sides.v4.as_mut()
    }
}

impl SideFamily for Ipv6Net {
    type Contents = Ipv6Entries;
    type Table<'a> = Ipv6EntryTable<'a>;
    const ENCAP: Option<&'static str> = None;
    const GUARD: &'static str = loader::VTEP_GUARD6;
    fn vtep(r: &AgentRecord) -> Option<Vtep<'_, Self>> {
        let v6 = r.v6.as_ref()?;
        Some(Vtep { device: &v6.device, mac: v6.mac, public_ip: v6.public_ip, subnet: v6.subnet, network: v6.network })
    }
    fn set_subnet(r: &mut AgentRecord, subnet: Self) {
        if let Some(v6) = &mut r.v6 {
            v6.subnet = subnet;
        }
    }
    fn set_mtu(r: &mut AgentRecord, mtu: u32) {
        if let Some(v6) = &mut r.v6 {
            v6.mtu = mtu;
        }
    }
    /// (Deletes are never held: the kernel carries the IPv6 peers' packets
    /// by these entries whether or not the programs are attached.)
    fn table<'a>(at: TableAt<'a>, vtep: &Vtep<'_, Self>) -> Ipv6EntryTable<'a> {
        Ipv6EntryTable {
            handle: at.handle,
            maps: at.maps,
            vtep: at.vtep,
            underlay: at.underlay,
            network: vtep.network,
            own: vtep.public_ip,
        }
    }
    fn side(sides: &Sides) -> Option<&Side<Self>> {
        sides.v6.as_ref()
    }
    fn side_mut(sides: &mut Sides) -> Option<&mut Side<Self>> {
        sides.v6.as_mut()
    }
}

/// The node's sides: one per family the network config has on.
pub(super) struct Sides {
    pub(super) v4: Option<Side<Ipv4Net>>,
    pub(super) v6: Option<Side<Ipv6Net>>,
}

impl Sides {
    /// Whether `index` is either family's VTEP.
    pub(super) fn is_vtep(&self, index: u32) -> bool {
        self.v4.as_ref().is_some_and(|s| s.index == index) || self.v6.as_ref().is_some_and(|s| s.index == index)
    }

    /// Whether `index` is a VTEP whose neighbour and fdb entries are the
    /// peer table's (the family without an encap program: the kernel's
    /// entries carry its packets).
    pub(super) fn holds_entries(&self, index: u32) -> bool {
        let on = |encap: Option<&str>, side: Option<u32>| encap.is_none() && side == Some(index);
        on(<Ipv4Net as SideFamily>::ENCAP, self.v4.as_ref().map(|s| s.index))
            || on(<Ipv6Net as SideFamily>::ENCAP, self.v6.as_ref().map(|s| s.index))
    }

    /// The next pass reads both families' tables back from the kernel.
    pub(super) fn forget(&mut self) {
        if let Some(s) = &mut self.v4 {
            s.known.forget();
        }
        if let Some(s) = &mut self.v6 {
            s.known.forget();
        }
    }

    /// Whether the side that chooses the peers (IPv4's, else IPv6's)
    /// knows what its table holds.
    pub(super) fn lead_known(&self) -> bool {
        match (&self.v4, &self.v6) {
            (Some(s), _) => s.known.is_known(),
            (None, Some(s)) => s.known.is_known(),
            (None, None) => false,
        }
    }
}

/// One family's VTEP once it is up.
pub(super) struct Side<N: SideFamily> {
    /// The VTEP's ifindex.
    pub(super) index: u32,
    firewall: netfilter::Firewall,
    /// What the last pass left in the family's table.
    known: Known<N::Contents, N>,
    /// The peers whose half of this family the last plan left out, to
    /// warn once per change.
    skipped: Vec<Rejection>,
}

impl<N: SideFamily> Side<N> {
    /// The side of the family's VTEP, up at `index` as `plan` says, with its
    /// firewall chains installed (always: the broadcast and multicast VXLAN
    /// guard is in the rule set whatever the flags).
    pub(super) fn new(index: u32, plan: &Plan<N>, rules: &netfilter::Settings) -> Result<Self> {
        let firewall = netfilter::Firewall::new::<N>()?;
        firewall
            .apply(&netfilter::plan(plan.network, plan.subnet, rules))
            .with_context(|| format!("cannot install the {} firewall rules", N::NAME))?;
        Ok(Side { index, firewall, known: Known::default(), skipped: Vec::new() })
    }

    /// Re-asserts the family's firewall chains (someone may have flushed them).
    pub(super) fn enforce_rules(&self, vtep: &Vtep<'_, N>, rules: &netfilter::Settings) {
        if let Err(e) = self.firewall.apply(&netfilter::plan(vtep.network, vtep.subnet, rules)) {
            warn!("cannot restore the {} firewall rules: {e:#}", N::NAME);
        }
    }

    /// Whether the VTEP is still the device we set up, with the family's
    /// programs on it (an error: the kernel could not be asked).
    pub(super) async fn intact(
        &self,
        handle: &Handle,
        vtep: &Vtep<'_, N>,
        mode: AttachMode,
        pins: &PinDir,
    ) -> Result<bool> {
        let link = device::link_by_name(handle, vtep.device).await?;
        if link.is_none_or(|l| l.header.index != self.index) {
            return Ok(false);
        }
        if let Some(encap) = N::ENCAP
            && !loader::attached_as(mode, handle, pins, encap, vtep.device, TcAttachType::Egress).await?
        {
            return Ok(false);
        }
        loader::attached_as(mode, handle, pins, N::GUARD, vtep.device, TcAttachType::Ingress).await
    }

    /// Gives the VTEP `subnet`'s address and plans the firewall with it.
    pub(super) async fn readdress(
        &self,
        handle: &Handle,
        vtep: &Vtep<'_, N>,
        subnet: N,
        rules: &netfilter::Settings,
    ) -> Result<()> {
        vtep::ensure_address(handle, self.index, subnet, vtep.network).await?;
        self.firewall
            .apply(&netfilter::plan(vtep.network, subnet, rules))
            .with_context(|| format!("cannot update the {} firewall rules", N::NAME))?;
        Ok(())
    }

    /// Sets the VTEP's MTU to what the underlay now carries once
    /// encapsulated, when the kernel holds another; returns it.
    pub(super) async fn follow_mtu(
        &self,
        handle: &Handle,
        vtep: &Vtep<'_, N>,
        conf: &NetConf,
        underlay_mtu: u32,
    ) -> Result<u32> {
        let want = crate::run::config::vtep_mtu::<N>(conf, underlay_mtu);
        let link =
            device::link_by_name(handle, vtep.device).await?.with_context(|| format!("{} is gone", vtep.device))?;
        let have = device::link_mtu(&link);
        if have != Some(want) {
            super::mtu::warn_if_capped(conf, underlay_mtu, want);
            device::set_mtu(handle, self.index, want).await?;
            info!(device = %vtep.device, underlay_mtu, was = ?have, mtu = want,
                "VTEP MTU set to what the underlay carries once encapsulated");
        }
        Ok(want)
    }

    /// Brings the family's table in line with `chosen` (see
    /// [`reconcile::sync`]); `None` when it could not be read back.
    pub(super) async fn sync(
        &mut self,
        at: TableAt<'_>,
        vtep: &Vtep<'_, N>,
        chosen: Vec<Peer>,
        capacity: usize,
        direct_routing: bool,
    ) -> Option<Synced> {
        let mut table = N::table(at, vtep);
        match reconcile::sync(&mut table, &mut self.known, chosen, capacity, direct_routing).await {
            Ok(synced) => {
                if synced.skipped != self.skipped {
                    for s in &synced.skipped {
                        warn!(node = %s.node, "{} half not programmed: {}", N::NAME, s.reason);
                    }
                    self.skipped = synced.skipped.clone();
                }
                Some(synced)
            }
            Err(e) => {
                warn!("cannot read back the {} peer table (maps, entries and routes): {e:#}", N::NAME);
                None
            }
        }
    }

    /// What this node publishes about the family's VTEP.
    pub(super) fn local(vtep: &Vtep<'_, N>) -> Half<N> {
        Half { vtep_mac: vtep.mac, public_ip: vtep.public_ip, subnet: vtep.subnet }
    }
}
