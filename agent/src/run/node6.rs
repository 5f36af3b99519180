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

use super::{check::Checked, config};
use crate::{
    dataplane::{
        device::{self, Underlay},
        maps::{Accept6, Maps},
        peers6::{self, Devices6, Tables6},
        routes,
        vtep::{self, VtepSpec},
    },
    netconf::NetConf,
    netfilter,
    peer::{OwnNode, Peer},
    reconcile::OnLink,
    source::LocalVtepV6,
    state::{Record6, StateDir},
    vtep_mac,
};

/// The IPv6 VTEP once it is up.
pub(super) struct Side6 {
    pub(super) index: u32,
    pub(super) record: Record6,
    firewall: netfilter::Firewall,
    /// What the last pass left in the kernel when every write went through
    /// (dropped with the IPv4 side's `observed`).
    pub(super) observed: Option<Tables6>,
    /// Which public IPv6 addresses are on-link, read with `observed` and
    /// dropped with it (DirectRouting only).
    on_link: Option<OnLink<Ipv6Net>>,
    /// The nodes whose IPv6 half was last skipped, to warn once per change.
    skipped: Vec<peers6::Skipped6>,
}

/// What the IPv6 VTEP will be, decided before anything is created: the
/// programs must know our public IPv6 (and so judge IPv6 VXLAN) before a
/// socket for it exists.
pub(super) struct Plan6 {
    spec: VtepSpec<Ipv6Net>,
    subnet: Ipv6Net,
    network: Ipv6Net,
}

impl Plan6 {
    pub(super) fn public_ip(&self) -> Ipv6Addr {
        self.spec.local
    }

    pub(super) fn mtu(&self) -> u32 {
        self.spec.mtu
    }

    /// The network and subnet subnet.env gives the CNI.
    pub(super) fn subnet_env(&self) -> (Ipv6Net, Ipv6Net) {
        (self.network, self.subnet)
    }
}

/// The IPv6 VTEP's settings when the network is dual-stack (`None` when it
/// is not); `underlay` as it is now (a global IPv6 address may have come
/// since the start, SLAAC or DAD). Chooses and saves its MAC.
pub(super) fn prepare6(
    c: &Checked,
    conf: &NetConf,
    own: &OwnNode,
    state: &StateDir,
    underlay: &Underlay,
) -> Result<Option<Plan6>> {
    let Some(v6) = &conf.ipv6 else { return Ok(None) };
    let subnet = own
        .subnet6
        .context("IPv6 is on (EnableIPv6), but this node has no IPv6 pod CIDR (spec.podCIDRs, or the etcd lease)")?;
    let (mac, _) = vtep_mac::choose::<Ipv6Net>(own.published_mac6, state)?;
    let public_ip =
        config::public_ip::<Ipv6Net>(c.args.public_ipv6, own.node_public_ipv6, underlay).with_context(|| {
            format!(
                "IPv6 is on (EnableIPv6), but {} has no usable global IPv6 address: add one, or give \
             --public-ipv6 (or the node-public-ipv6 annotation)",
                c.iface
            )
        })?;
    let spec = VtepSpec {
        name: vtep::vtep_name::<Ipv6Net>(conf.vni),
        vni: conf.vni,
        port: conf.port,
        local: public_ip,
        underlay_index: c.underlay.index,
        mac,
        mtu: config::vtep_mtu::<Ipv6Net>(conf, underlay.mtu),
    };
    Ok(Some(Plan6 { spec, subnet, network: v6.network }))
}

/// Brings up `flannel-v6.<VNI>` as `plan` says, with its address and the
/// ip6tables chains.
pub(super) async fn bring_up6(c: &Checked, conf: &NetConf, plan: Plan6, handle: &Handle) -> Result<Side6> {
    let (ip_masq, forward) = (c.args.ip_masq, c.args.iptables_forward_rules);
    let Plan6 { spec, subnet, network } = plan;
    let (mac, public_ip) = (spec.mac, spec.local);
    let index = vtep::ensure_vtep(handle, &spec).await?;
    vtep::ensure_address(handle, index, subnet, network).await?;
    let firewall = netfilter::Firewall::new::<Ipv6Net>()?;
    firewall
        .apply(&netfilter::plan(network, subnet, conf.port, ip_masq, forward))
        .context("cannot install the IPv6 firewall rules")?;
    info!(device = %spec.name, %mac, %public_ip, %subnet, mtu = spec.mtu, "IPv6 VTEP ready");
    let record = Record6 { device: spec.name, mac, public_ip, subnet, network, mtu: spec.mtu };
    Ok(Side6 { index, record, firewall, observed: None, on_link: None, skipped: Vec::new() })
}

/// With IPv6 off: a `flannel-v6.<VNI>` left by an earlier dual-stack run
/// (ours or flanneld's) would take IPv6 VXLAN that nothing judges, so it
/// goes, and our ip6tables chains with it.
pub(super) async fn remove_leftovers(handle: &Handle, vni: u32) -> Result<()> {
    remove_family(handle, &vtep::vtep_name::<Ipv6Net>(vni), netfilter::Firewall::new::<Ipv6Net>(), "IPv6", "ip6tables")
        .await
}

/// What an earlier run left for a `family` the network config now has off:
/// its VTEP `device`, and our chains in `firewall` (written with `tool`).
pub(super) async fn remove_family(
    handle: &Handle,
    device: &str,
    firewall: Result<netfilter::Firewall>,
    family: &str,
    tool: &str,
) -> Result<()> {
    if device::delete_link(handle, device).await? {
        warn!(device, "{family} is off in the network config: deleted the {family} VTEP an earlier run left");
    }
    if let Ok(fw) = firewall {
        if fw.remove_all().with_context(|| format!("cannot remove the {family} firewall rules"))? {
            info!("{family} is off: removed edgevx's {tool} chains");
        }
    }
    Ok(())
}

/// The IPv6 accept map (`have`, read back every pass, written where it
/// differs): each peer's public IPv6 (never `own`, ours), its inner sources
/// bound to its IPv6 subnet. Added before the routes that make replies go
/// there; removed with them. The addresses no peer has go first, always,
/// as on the IPv4 side: a full map needs their room, and a peer gone from
/// the view is never left accepted because an add failed. Every write is
/// tried; the first error is returned after.
fn sync_accept6(maps: &mut Maps, have: &BTreeMap<Ipv6Addr, Accept6>, peers: &[Peer], own: Ipv6Addr) -> Result<()> {
    let want: BTreeMap<Ipv6Addr, Accept6> = peers
        .iter()
        .filter_map(|p| {
            let v6 = p.v6.filter(|v6| v6.public_ip != own)?;
            Some((v6.public_ip, Accept6 { subnet: v6.subnet, any_inner_source: p.any_inner_source }))
        })
        .collect();
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

impl Side6 {
    /// What this node publishes about its IPv6 VTEP.
    pub(super) fn local(&self) -> LocalVtepV6 {
        LocalVtepV6 { mac: self.record.mac, public_ip: self.record.public_ip, subnet: self.record.subnet }
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
        let at = Devices6 { vtep: self.index, underlay };
        // before it changes: it says which direct routes are ours
        let accepted = match maps.accept6_entries() {
            Ok(a) => a,
            Err(e) => {
                warn!("cannot read the IPv6 peers the programs accept: {e:#}");
                return false;
            }
        };
        let (have, on_link) = match (self.observed.take(), self.on_link.take()) {
            (Some(have), on_link) if !direct_routing || on_link.is_some() => (have, on_link.unwrap_or_default()),
            _ => match self.read_back(handle, at, &accepted, direct_routing).await {
                Ok(read) => read,
                Err(e) => {
                    warn!("cannot read back the IPv6 VTEP's entries and routes: {e:#}");
                    return false;
                }
            },
        };
        let (want, skipped) = peers6::plan6(peers, self.record.public_ip, &on_link);
        if skipped != self.skipped {
            for s in &skipped {
                warn!(node = %s.node, "IPv6 half not programmed: {}", s.reason);
            }
            self.skipped = skipped;
        }
        let accept_ok = match sync_accept6(maps, &accepted, peers, self.record.public_ip) {
            Ok(()) => true,
            Err(e) => {
                warn!("cannot update the IPv6 peers the programs accept, retrying: {e:#}");
                false
            }
        };
        match peers6::apply6(handle, at, &have, &want).await {
            Ok(done) => {
                if done != peers6::Applied6::default() {
                    tracing::debug!(written = done.written, removed = done.removed, "IPv6 VTEP entries updated");
                }
                self.observed = Some(want);
                self.on_link = direct_routing.then_some(on_link);
                accept_ok
            }
            Err(e) => {
                warn!("cannot program the IPv6 VTEP, retrying: {e:#}");
                false
            }
        }
    }

    /// What the kernel holds for the IPv6 peers, and with `direct_routing`
    /// which public IPv6 addresses are on-link, from one read of the main
    /// table.
    async fn read_back(
        &self,
        handle: &Handle,
        at: Devices6,
        accepted: &BTreeMap<Ipv6Addr, Accept6>,
        direct_routing: bool,
    ) -> Result<(Tables6, OnLink<Ipv6Net>)> {
        let network = self.record.network;
        let table = routes::MainTable::<Ipv6Net>::read(handle).await?;
        let have = peers6::observe6(handle, at, &table, network, accepted).await?;
        let on_link = if direct_routing { OnLink::new(table.hops(at.underlay), network) } else { OnLink::default() };
        Ok((have, on_link))
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
    pub(super) fn enforce_rules(&self, port: u16, ip_masq: bool, forward: bool) {
        let r = &self.record;
        if let Err(e) = self.firewall.apply(&netfilter::plan(r.network, r.subnet, port, ip_masq, forward)) {
            warn!("cannot restore the IPv6 firewall rules: {e:#}");
        }
    }
}
