//! The IPv6 peer table's reconciliation, the same three steps as the IPv4
//! one (`ipv4_maps.rs`) over what holds an IPv6 peer: flannel's kernel
//! entries on `flannel-v6.<VNI>` (the kernel encapsulates) and the two IPv6
//! maps decap judges IPv6 VXLAN by. The entries the peers need ([`plan`],
//! pure), the difference from what the kernel holds ([`diff`], pure), and
//! the writes in the order they must run ([`apply`]) through an
//! [`Ipv6EntryWriter`]: netlink and the maps in production
//! (`dataplane/ipv6_table.rs`), a fake in the tests.
//!
//! Per peer, flannel's form (its vxlan backend's `handleSubnetEvents`, IPv6
//! half):
//! - `ip -6 neigh replace <base> lladdr <v6 VtepMAC> dev flannel-v6.1 nud permanent`
//! - `bridge fdb replace <v6 VtepMAC> dev flannel-v6.1 dst <PublicIPv6> self permanent`
//! - `ip -6 route replace <v6 subnet> via <base> dev flannel-v6.1 onlink`
//!
//! where `<base>` is the subnet's first address; or, with DirectRouting and
//! the peer's PublicIPv6 on-link, only
//! - `ip -6 route replace <v6 subnet> via <PublicIPv6> dev eth0`.
//!
//! What no peer wants is deleted (flannel never deletes a stale entry,
//! flannel#2554).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv6Addr,
};

use ipnet::Ipv6Net;
use tracing::{debug, warn};

use super::{
    accept_by_public_ip, first_to_appear,
    ipv4_maps::{Accept, diff_map},
    on_link::OnLink,
    outcome::{Outcome, Tally},
};
use crate::{
    mac::VtepMac,
    peer::{Half, Peer, Rejection},
};

/// What holds the IPv6 peers (or should): the IPv6 VTEP's three tables,
/// the underlay's direct routes, and the two IPv6 maps of the programs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipv6Entries {
    /// Permanent neighbours: peer subnet base → its v6 VtepMAC.
    pub neigh: BTreeMap<Ipv6Addr, VtepMac>,
    /// fdb entries: (v6 VtepMAC, peer's public IPv6).
    pub fdb: BTreeSet<(VtepMac, Ipv6Addr)>,
    /// Routes through the device: peer v6 subnet → gateway (its base).
    pub routes: BTreeMap<Ipv6Net, Ipv6Addr>,
    /// DirectRouting's routes through the underlay: peer v6 subnet → its
    /// public IPv6. What counts as one is in
    /// [`crate::dataplane::routes::MainTable::direct`], and a read of the
    /// table keeps those of programmed peers.
    pub direct: BTreeMap<Ipv6Net, Ipv6Addr>,
    /// The IPv6 accept map: each peer's public IPv6, its inner sources
    /// bound to its IPv6 subnet.
    pub accept: BTreeMap<Ipv6Addr, Accept<Ipv6Net>>,
    /// The IPv6 owner map: each peer's IPv6 pod CIDR → its public IPv6.
    /// Every peer's half is there, overlapping ones too: decap takes the
    /// owner of the longest prefix, as the kernel's routes do.
    pub owners: BTreeMap<Ipv6Net, Ipv6Addr>,
}

/// The entries `peers` need. Both maps hold every peer's IPv6 half but one
/// claiming `own`, our public IPv6 (its frames would come back to us; it is
/// skipped with a reason). A peer whose public IPv6 `on_link` reaches gets
/// a direct route and nothing on the device (flannel's `v6DirectRoutingOK`);
/// `on_link` is empty when DirectRouting is off. One v6 VtepMAC has one fdb
/// entry, so peers through the device that share a MAC at different public
/// IPv6 addresses cannot all be reached: the one whose entry appeared first
/// keeps it (none when that is unknown), the others are skipped with a
/// reason, whatever their order (the IPv4 table keys by subnet and has no
/// such clash). Peers sharing a MAC and a public IPv6 (subnets behind one
/// VTEP) all stay.
pub fn plan(peers: &[Peer], own: Ipv6Addr, on_link: &OnLink<Ipv6Net>) -> (Ipv6Entries, Vec<Rejection>) {
    let halves = || peers.iter().filter_map(|p| Some((p.v6.filter(|v6| v6.public_ip != own)?, p.any_inner_source)));
    let mut skipped: Vec<Rejection> = peers
        .iter()
        .filter(|p| p.v6.is_some_and(|v6| v6.public_ip == own))
        .map(|p| Rejection { node: p.node.clone(), reason: format!("its public-ipv6 {own} is this node's") })
        .collect();
    let mut t = Ipv6Entries {
        accept: accept_by_public_ip(halves().map(|(v6, any)| (v6.public_ip, v6.subnet, any))),
        owners: halves().map(|(v6, _)| (v6.subnet, v6.public_ip)).collect(),
        ..Ipv6Entries::default()
    };
    // the peers through the device, and their IPv6 halves
    let (mut device, mut on_device): (Vec<&Peer>, Vec<Half<Ipv6Net>>) = (Vec::new(), Vec::new());
    for p in peers {
        let Some(v6) = p.v6.filter(|v6| v6.public_ip != own) else { continue };
        match on_link.reaches(v6.public_ip) {
            true => _ = t.direct.insert(v6.subnet, v6.public_ip),
            false => {
                device.push(p);
                on_device.push(v6);
            }
        }
    }
    let out = mac_clashes(&device, &on_device, &mut skipped);
    for (v6, _) in on_device.iter().zip(&out).filter(|(_, o)| !**o) {
        let base = v6.subnet.network();
        t.neigh.insert(base, v6.vtep_mac);
        t.fdb.insert((v6.vtep_mac, v6.public_ip));
        t.routes.insert(v6.subnet, base);
    }
    skipped.sort_by(|a, b| (&a.node, &a.reason).cmp(&(&b.node, &b.reason)));
    (t, skipped)
}

/// Whether `have` already holds `p`: its public IPv6 is in the IPv6 accept
/// map. Over the capacity (an IPv6-only network), such a peer stays ahead
/// of one not in yet.
pub fn holds(have: &Ipv6Entries, p: &Peer) -> bool {
    p.v6.is_some_and(|v6| have.accept.contains_key(&v6.public_ip))
}

/// Which of the peers through the device lose their v6 VtepMAC to another
/// peer's at a different address (`true` at their index), each skipped
/// with its reason into `skipped`.
fn mac_clashes(device: &[&Peer], halves: &[Half<Ipv6Net>], skipped: &mut Vec<Rejection>) -> Vec<bool> {
    let mut by_mac: BTreeMap<VtepMac, Vec<usize>> = BTreeMap::new();
    for (i, v6) in halves.iter().enumerate() {
        by_mac.entry(v6.vtep_mac).or_default().push(i);
    }
    let mut out = vec![false; device.len()];
    for (mac, group) in &by_mac {
        let ips: BTreeSet<Ipv6Addr> = group.iter().map(|&i| halves[i].public_ip).collect();
        if ips.len() < 2 {
            continue;
        }
        let winner = first_to_appear(device, group).map(|w| halves[w].public_ip);
        for &i in group.iter().filter(|&&i| Some(halves[i].public_ip) != winner) {
            out[i] = true;
            let mut others: Vec<&str> = group
                .iter()
                .filter(|&&o| halves[o].public_ip != halves[i].public_ip)
                .map(|&o| device[o].node.as_str())
                .collect();
            others.sort_unstable();
            let reason = match winner {
                Some(_) => {
                    format!("its IPv6 VtepMAC {mac} is also {}'s, whose entry appeared first", others.join(", "))
                }
                None => format!(
                    "its IPv6 VtepMAC {mac} is also {}'s at another address, and which entry appeared first is not \
                     known: none is programmed",
                    others.join(", ")
                ),
            };
            skipped.push(Rejection { node: device[i].node.clone(), reason });
        }
    }
    out
}

/// A route through the device to write, after the direct route it takes
/// over from goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToDevice {
    pub subnet: Ipv6Net,
    pub gateway: Ipv6Addr,
    /// The direct route to the same subnet (through this public IPv6) that
    /// goes first: the kernel refuses an onlink gateway that a route
    /// through another device reaches, and the base lies in that subnet.
    pub direct_first: Option<Ipv6Addr>,
    /// Whether the route itself is missing or different.
    pub write: bool,
}

/// The writes that turn `have` into `want`, in the order [`apply`] runs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryChanges {
    pub del_owners: Vec<Ipv6Net>,
    pub del_accept: Vec<Ipv6Addr>,
    pub put_owners: Vec<(Ipv6Net, Ipv6Addr)>,
    pub put_accept: Vec<(Ipv6Addr, Accept<Ipv6Net>)>,
    pub put_neigh: Vec<(Ipv6Addr, VtepMac)>,
    pub put_fdb: Vec<(VtepMac, Ipv6Addr)>,
    pub to_device: Vec<ToDevice>,
    pub put_direct: Vec<(Ipv6Net, Ipv6Addr)>,
    pub del_direct: Vec<(Ipv6Net, Ipv6Addr)>,
    pub del_routes: Vec<(Ipv6Net, Ipv6Addr)>,
    pub del_fdb: Vec<(VtepMac, Ipv6Addr)>,
    pub del_neigh: Vec<Ipv6Addr>,
}

/// Key by key, as the IPv4 diff: a changed value is overwritten in place.
/// A direct route to a subnet now through the device is the route's to
/// remove ([`ToDevice::direct_first`]), not a delete of its own.
pub fn diff(want: &Ipv6Entries, have: &Ipv6Entries) -> EntryChanges {
    let (put_owners, del_owners) = diff_map(&want.owners, &have.owners);
    let (put_accept, del_accept) = diff_map(&want.accept, &have.accept);
    let (put_neigh, del_neigh) = diff_map(&want.neigh, &have.neigh);
    let (_, del_routes) = diff_map(&want.routes, &have.routes);
    let (put_direct, del_direct) = diff_map(&want.direct, &have.direct);
    let to_device = want
        .routes
        .iter()
        .map(|(net, gw)| ToDevice {
            subnet: *net,
            gateway: *gw,
            direct_first: have.direct.get(net).copied(),
            write: have.routes.get(net) != Some(gw),
        })
        .filter(|t| t.write || t.direct_first.is_some())
        .collect();
    EntryChanges {
        del_owners: del_owners.into_iter().map(|(k, _)| k).collect(),
        del_accept: del_accept.into_iter().map(|(k, _)| k).collect(),
        put_owners,
        put_accept,
        put_neigh,
        put_fdb: want.fdb.difference(&have.fdb).copied().collect(),
        to_device,
        put_direct,
        // (those now through the device go with their route)
        del_direct: del_direct.into_iter().filter(|(net, _)| !want.routes.contains_key(net)).collect(),
        del_routes,
        del_fdb: have.fdb.difference(&want.fdb).copied().collect(),
        del_neigh: del_neigh.into_iter().map(|(k, _)| k).collect(),
    }
}

/// Where IPv6 peers are written, entry by entry: netlink and the IPv6 maps
/// in production, a fake in the tests. Every write is idempotent (a put
/// replaces, a delete of something already gone succeeds).
#[allow(async_fn_in_trait)]
pub trait Ipv6EntryWriter {
    async fn put_owner(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> anyhow::Result<()>;
    async fn del_owner(&mut self, subnet: Ipv6Net) -> anyhow::Result<()>;
    async fn put_accept(&mut self, ip: Ipv6Addr, accept: Accept<Ipv6Net>) -> anyhow::Result<()>;
    async fn del_accept(&mut self, ip: Ipv6Addr) -> anyhow::Result<()>;
    async fn put_neigh(&mut self, base: Ipv6Addr, mac: VtepMac) -> anyhow::Result<()>;
    async fn del_neigh(&mut self, base: Ipv6Addr) -> anyhow::Result<()>;
    async fn put_fdb(&mut self, mac: VtepMac, public_ip: Ipv6Addr) -> anyhow::Result<()>;
    async fn del_fdb(&mut self, mac: VtepMac, public_ip: Ipv6Addr) -> anyhow::Result<()>;
    async fn put_route(&mut self, subnet: Ipv6Net, gateway: Ipv6Addr) -> anyhow::Result<()>;
    async fn del_route(&mut self, subnet: Ipv6Net, gateway: Ipv6Addr) -> anyhow::Result<()>;
    async fn put_direct(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> anyhow::Result<()>;
    async fn del_direct(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> anyhow::Result<()>;
}

/// Runs `c` against `w`, every write tried (a failed one is retried on the
/// next pass; the others still run):
/// 1. map entries no peer wants go first, always, as on the IPv4 side: a
///    full map needs their room, and a peer gone from the view is never
///    left accepted because an add failed. Then the adds to both maps:
///    a peer is judged by its subnet's owner before its routes make
///    replies go there.
/// 2. Neighbour, fdb entry, then route for what is missing or different, so
///    the route never leads to an unresolved gateway. A peer that turns
///    direct keeps a route all along: the kernel replaces an IPv6 route of
///    the same destination and metric in place, whatever its device. The
///    way back cannot ([`ToDevice::direct_first`]: flannel, which only
///    replaces, fails there).
/// 3. The direct routes wanted, then what no peer wants: direct route,
///    route, fdb entry, then neighbour.
pub async fn apply<W: Ipv6EntryWriter>(w: &mut W, c: &EntryChanges) -> Outcome {
    let mut t = Tally::default();
    for net in &c.del_owners {
        t.note("no longer judging by the owner of", net, w.del_owner(*net).await);
    }
    for ip in &c.del_accept {
        t.note("no longer accepting IPv6 VXLAN from", ip, w.del_accept(*ip).await);
    }
    for (net, ip) in &c.put_owners {
        t.note("judging by the owner of", net, w.put_owner(*net, *ip).await);
    }
    for (ip, a) in &c.put_accept {
        t.note("accepting IPv6 VXLAN from", ip, w.put_accept(*ip, *a).await);
    }
    for (ip, mac) in &c.put_neigh {
        t.note("adding the neighbour", ip, w.put_neigh(*ip, *mac).await);
    }
    for (mac, ip) in &c.put_fdb {
        t.note("adding the fdb entry for", ip, w.put_fdb(*mac, *ip).await);
    }
    for d in &c.to_device {
        if let Some(ip) = d.direct_first {
            t.note("deleting the direct route to", &d.subnet, w.del_direct(d.subnet, ip).await);
        }
        if d.write {
            t.note("adding the route to", &d.subnet, w.put_route(d.subnet, d.gateway).await);
        }
    }
    for (net, ip) in &c.put_direct {
        t.note("adding the direct route to", net, w.put_direct(*net, *ip).await);
    }
    for (net, ip) in &c.del_direct {
        t.note("deleting the direct route to", net, w.del_direct(*net, *ip).await);
    }
    for (net, gw) in &c.del_routes {
        t.note("deleting the route to", net, w.del_route(*net, *gw).await);
    }
    for (mac, ip) in &c.del_fdb {
        t.note("deleting the fdb entry for", ip, w.del_fdb(*mac, *ip).await);
    }
    for ip in &c.del_neigh {
        t.note("deleting the neighbour", ip, w.del_neigh(*ip).await);
    }
    if let Some(first) = &t.first_error {
        warn!(failed = t.out.failed, "cannot program the IPv6 VTEP and its maps, retrying; the first failure: {first}");
    } else if t.out.written > 0 {
        debug!(written = t.out.written, "IPv6 VTEP entries updated");
    }
    t.out
}

#[cfg(test)]
#[path = "ipv6_entries_tests.rs"]
mod tests;
