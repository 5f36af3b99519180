//! The IPv6 half of a dual-stack node (`EnableIPv6`): `flannel-v6.<VNI>`
//! brought up beside `flannel.<VNI>` and kept equal to the IPv6 halves of
//! the peers the IPv4 pass chose, flannel's way (neighbour, fdb, route per
//! peer, or with DirectRouting a plain route to an on-link peer; the kernel
//! carries the packets), plus the `ip6tables` twins of the firewall chains.
use std::{collections::BTreeMap, net::Ipv6Addr};

use anyhow::{Context, Result};
use ipnet::Ipv6Net;
use rtnetlink::Handle;
use tracing::{info, warn};

use super::{config, vtep_plan::Plan};
use crate::{
    dataplane::{
        device,
        maps::Maps,
        peers6::{self, Devices6, Tables6},
        vtep,
    },
    netconf::NetConf,
    netfilter,
    peer::{Peer, Rejection},
    reconcile::{Accept, Known, PeerTable},
    state::Record6,
};

/// The IPv6 VTEP once it is up.
pub(super) struct Side6 {
    pub(super) index: u32,
    pub(super) record: Record6,
    firewall: netfilter::Firewall,
    /// What the last pass left in the kernel (forgotten with the IPv4
    /// side's).
    pub(super) known: Known<Tables6, Ipv6Net>,
    /// The nodes whose IPv6 half was last skipped, to warn once per change.
    skipped: Vec<Rejection>,
}

/// Brings up `flannel-v6.<VNI>` as `plan` says, with its address and the
/// ip6tables chains. A twin of the IPv4 [`bring_up`](super::node::bring_up)
/// only in name: the IPv6 VTEP is flannel's kernel device with kernel
/// entries, with no programs, maps or pods of its own, and the IPv4
/// bring-up calls this one after its own VTEP.
pub(super) async fn bring_up6(plan: Plan<Ipv6Net>, rules: &netfilter::Settings, handle: &Handle) -> Result<Side6> {
    let Plan { spec, subnet, network } = plan;
    let (mac, public_ip) = (spec.mac, spec.local);
    let index = vtep::ensure_vtep(handle, &spec).await?;
    vtep::ensure_address(handle, index, subnet, network).await?;
    let firewall = netfilter::Firewall::new::<Ipv6Net>()?;
    firewall.apply(&netfilter::plan(network, subnet, rules)).context("cannot install the IPv6 firewall rules")?;
    info!(device = %spec.name, %mac, %public_ip, %subnet, mtu = spec.mtu, "IPv6 VTEP ready");
    let record = Record6 { device: spec.name, mac, public_ip, subnet, network, mtu: spec.mtu };
    Ok(Side6 { index, record, firewall, known: Known::default(), skipped: Vec::new() })
}

/// The IPv6 accept map (`have`, read back every pass, written where it
/// differs): each peer's public IPv6 (never `own`, ours), its inner sources
/// bound to its IPv6 subnet. Added before the routes that make replies go
/// there; removed with them. The addresses no peer has go first, always,
/// as on the IPv4 side: a full map needs their room, and a peer gone from
/// the view is never left accepted because an add failed. Every write is
/// tried; the first error is returned after.
fn sync_accept6(
    maps: &mut Maps,
    have: &BTreeMap<Ipv6Addr, Accept<Ipv6Net>>,
    peers: &[Peer],
    own: Ipv6Addr,
) -> Result<()> {
    let want: BTreeMap<Ipv6Addr, Accept<Ipv6Net>> =
        crate::reconcile::accept_by_public_ip(peers.iter().filter_map(|p| {
            let v6 = p.v6.filter(|v6| v6.public_ip != own)?;
            Some((v6.public_ip, v6.subnet, p.any_inner_source))
        }));
    let mut first_err = None;
    for ip in have.keys().filter(|ip| !want.contains_key(ip)) {
        if let Err(e) = maps.accept6_del(*ip) {
            first_err.get_or_insert(e);
        }
    }
    for (ip, a) in want.iter().filter(|(ip, a)| have.get(ip) != Some(a)) {
        if let Err(e) = maps.accept6_put(*ip, a) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The IPv6 owner map: each peer's IPv6 pod CIDR → its public IPv6 (never
/// `own`), read back and written where it differs, as [`sync_accept6`].
/// Every peer's half is there, overlapping ones too: the judge takes the
/// owner of the longest prefix, as the kernel's routes do.
fn sync_subnets6(maps: &mut Maps, peers: &[Peer], own: Ipv6Addr) -> Result<()> {
    let want: BTreeMap<Ipv6Net, Ipv6Addr> = peers
        .iter()
        .filter_map(|p| p.v6.filter(|v6| v6.public_ip != own))
        .map(|v6| (v6.subnet, v6.public_ip))
        .collect();
    let have = maps.subnets6_entries()?;
    let mut first_err = None;
    for net in have.keys().filter(|n| !want.contains_key(n)) {
        if let Err(e) = maps.subnet6_del(*net) {
            first_err.get_or_insert(e);
        }
    }
    for (net, owner) in want.iter().filter(|(n, o)| have.get(n) != Some(o)) {
        if let Err(e) = maps.subnet6_put(*net, *owner) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Side6 {
    /// What this node publishes about its IPv6 VTEP.
    pub(super) fn local(&self) -> crate::peer::Half<Ipv6Net> {
        crate::peer::Half { vtep_mac: self.record.mac, public_ip: self.record.public_ip, subnet: self.record.subnet }
    }

    /// Brings the IPv6 accept map, the device's neighbour, fdb and route
    /// entries and, with `direct_routing`, the direct routes out of the
    /// `underlay` in line with the IPv6 halves of `peers`; returns whether
    /// every write went through.
    pub(super) async fn reconcile(
        &mut self,
        handle: &Handle,
        maps: &mut Maps,
        peers: &[Peer],
        direct_routing: bool,
        underlay: u32,
    ) -> bool {
        // before it changes: it says which direct routes are ours
        let accepted = match maps.accept6_entries() {
            Ok(a) => a,
            Err(e) => {
                warn!("cannot read the IPv6 peers the programs accept: {e:#}");
                return false;
            }
        };
        let r = &self.record;
        let mut table = peers6::Table6 {
            handle,
            at: Devices6 { vtep: self.index, underlay },
            network: r.network,
            own: r.public_ip,
            accepted: &accepted,
        };
        let (have, on_link) = match self.known.take_or_read(&mut table, direct_routing).await {
            Ok(read) => read,
            Err(e) => {
                warn!("cannot read back the IPv6 VTEP's entries and routes: {e:#}");
                return false;
            }
        };
        let (want, skipped) = table.plan(peers, &on_link);
        if skipped != self.skipped {
            for s in &skipped {
                warn!(node = %s.node, "IPv6 half not programmed: {}", s.reason);
            }
            self.skipped = skipped;
        }
        let owners_ok = match sync_subnets6(maps, peers, self.record.public_ip) {
            Ok(()) => true,
            Err(e) => {
                warn!("cannot update whose IPv6 pod CIDRs the programs judge by, retrying: {e:#}");
                false
            }
        };
        let accept_ok = match sync_accept6(maps, &accepted, peers, self.record.public_ip) {
            Ok(()) => true,
            Err(e) => {
                warn!("cannot update the IPv6 peers the programs accept, retrying: {e:#}");
                false
            }
        };
        let written = table.write(&have, &want).await.ok();
        self.known.keep(want, on_link, direct_routing, written);
        written && accept_ok && owners_ok
    }

    /// Whether `flannel-v6.<VNI>` is still the device we set up.
    /// Whether the device is still there (an error: the kernel could not be asked).
    pub(super) async fn intact(&self, handle: &Handle) -> Result<bool> {
        Ok(device::link_by_name(handle, &self.record.device).await?.is_some_and(|l| l.header.index == self.index))
    }

    /// Keeps the device's MTU at what the underlay's now allows.
    pub(super) async fn follow_mtu(&mut self, handle: &Handle, conf: &NetConf, underlay_mtu: u32) -> Result<()> {
        let want = config::vtep_mtu::<Ipv6Net>(conf, underlay_mtu);
        let link = device::link_by_name(handle, &self.record.device).await?;
        if link.as_ref().and_then(device::link_mtu) != Some(want) {
            device::set_mtu(handle, self.index, want).await?;
            info!(device = %self.record.device, mtu = want, "IPv6 VTEP MTU follows the underlay");
        }
        self.record.mtu = want;
        Ok(())
    }

    /// Re-asserts the IPv6 firewall chains.
    pub(super) fn enforce_rules(&self, rules: &netfilter::Settings) {
        let r = &self.record;
        if let Err(e) = self.firewall.apply(&netfilter::plan(r.network, r.subnet, rules)) {
            warn!("cannot restore the IPv6 firewall rules: {e:#}");
        }
    }
}
