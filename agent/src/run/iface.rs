//! Which interface carries VXLAN (the underlay), chosen by flanneld's rules
//! (flannel `main.go`, "Work out which interface to use", and
//! `pkg/ipmatch/match.go` `LookupExtIface`), once over the family that
//! chooses it: IPv4 with IPv4 on (IPv4 or dual-stack), IPv6 in an
//! IPv6-only network (`EnableIPv4: false`, flannel's `ipv6Stack`):
//!
//! 1. `--iface` values, in order: an address of the family names the
//!    interface that owns it (`ip.GetInterfaceByIP`/`GetInterfaceByIP6`),
//!    anything else is an interface name (`net.InterfaceByName`); the first
//!    that exists and has an address of the family wins.
//! 2. then `--iface-regex` values, in order: the first interface with an
//!    address the regex matches (`matchIP`), else the first whose name it
//!    matches.
//! 3. then `--iface-can-reach` (IPv4 only): the interface of `ip route get
//!    ADDR`. It takes an IPv4 address, which an IPv6-only network has no
//!    route for, so it is refused there, by name.
//! 4. with none of those flags: the interface that owns the public IP
//!    (`node-public-ip(v6)`, else `--public-ip(v6)`) when one does, else the
//!    interface of the family's default route.
//! 5. edgevx only: with none of those flags and no default route (an edge
//!    node booting while its WAN, LTE or VPN is down), the interface that
//!    owns the public IP of the last bring-up recorded in the state dir, so
//!    the node restores and forwards as on any start. flanneld exits here.
//!
//! What cannot match yet (an interface, an address or a route not there
//! yet) is a [`IfaceError::fixes_itself`] state: `edgevx run` waits for it.
//! What no host state can fix (a bad regex, a flag of the wrong family) is
//! refused by [`validate`] before anything is looked up.
//!
//! Interfaces are tried in ifindex order, as Go's `net.Interfaces()` lists them.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::{Ipv4Net, Ipv6Net};
use regex::Regex;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        address::{AddressAttribute, AddressFlags},
        link::LinkAttribute,
        route::RouteAttribute,
    },
};

use crate::{
    dataplane::{device, routes},
    family::Family,
    state::AgentRecord,
};

/// What the flags ask for.
#[derive(Clone, Debug, Default)]
pub struct Wanted<'a> {
    /// `--iface`, each a name or an address.
    pub ifaces: &'a [String],
    /// `--iface-regex`.
    pub regexes: &'a [String],
    /// `--iface-can-reach`.
    pub can_reach: Option<Ipv4Addr>,
}

impl Wanted<'_> {
    fn any_flag(&self) -> bool {
        !self.ifaces.is_empty() || !self.regexes.is_empty() || self.can_reach.is_some()
    }
}

/// An interface as selection sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub index: u32,
    /// Usable IPv4 addresses, the best first (flannel `GetInterfaceIP4Addrs`).
    pub ipv4: Vec<Ipv4Addr>,
    /// Usable global IPv6 addresses, the best first (flannel
    /// `GetInterfaceIP6Addrs`; the order of [`device::underlay`]'s pick).
    pub ipv6: Vec<Ipv6Addr>,
}

/// The chosen underlay and its address (flannel's `IfaceAddr` or
/// `IfaceV6Addr`: the default public IP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen<A> {
    pub name: String,
    pub address: A,
}

#[derive(Debug, thiserror::Error)]
pub enum IfaceError {
    #[error("--iface-regex {regex:?} is not a valid regular expression: {reason}")]
    BadRegex { regex: String, reason: String },
    #[error(
        "--iface {0}: an IPv6 address names the underlay only in an IPv6-only network (EnableIPv4 false); with IPv4 on, give the underlay's IPv4 address or its name"
    )]
    Ipv6(String),
    #[error("no interface matches {tried} (interfaces: {available}); an interface qualifies only with an IPv4 address")]
    NoMatch { tried: String, available: String },
    #[error("--iface-can-reach {0}: no route to it")]
    Unreachable(Ipv4Addr),
    #[error(
        "no --iface, --iface-regex or --iface-can-reach, no IPv4 default route to take the interface from, and no interface with the public IP of an earlier bring-up"
    )]
    NoDefaultRoute,
    #[error(
        "no interface matches {tried} (interfaces: {available}); in an IPv6-only network (EnableIPv4 false) an interface qualifies only with a global IPv6 address"
    )]
    NoMatchIpv6Only { tried: String, available: String },
    #[error(
        "--iface-can-reach {0}: the network is IPv6-only (EnableIPv4 false), so there is no IPv4 route to follow; choose the underlay with --iface or --iface-regex"
    )]
    CanReachIpv6Only(Ipv4Addr),
    #[error(
        "no --iface or --iface-regex, no IPv6 default route to take the interface from (the network is IPv6-only), and no interface with the public IPv6 of an earlier bring-up"
    )]
    NoDefaultRouteIpv6Only,
    #[error("cannot read the interfaces: {0:#}")]
    Netlink(anyhow::Error),
}

impl IfaceError {
    /// Whether a change of the host alone can make selection succeed (an
    /// interface, address or route that is not there yet): waited for. The
    /// rest need the operator to change a flag: exit 2.
    pub fn fixes_itself(&self) -> bool {
        match self {
            IfaceError::BadRegex { .. } | IfaceError::Ipv6(_) | IfaceError::CanReachIpv6Only(_) => false,
            IfaceError::NoMatch { .. }
            | IfaceError::Unreachable(_)
            | IfaceError::NoDefaultRoute
            | IfaceError::NoMatchIpv6Only { .. }
            | IfaceError::NoDefaultRouteIpv6Only
            | IfaceError::Netlink(_) => true,
        }
    }
}

/// What selection does differently for the family that chooses the underlay.
pub trait ChoosingFamily: Family {
    /// The link's usable addresses of the family, the best first.
    fn addresses(l: &Link) -> &[Self::Addr];
    /// An `--iface` address of the other family. With IPv4 on, an IPv6
    /// address is refused: only an IPv6-only network is chosen by one. The
    /// IPv6 stack passes over an IPv4 address, as `GetInterfaceByIP6` finds
    /// no interface for it.
    fn other_family(value: &str) -> Result<(), IfaceError>;
    /// `--iface-can-reach`'s route (the interface index and preferred
    /// source), or why there is none.
    async fn reach(handle: &Handle, to: Ipv4Addr) -> Result<(u32, Option<Self::Addr>), IfaceError>;
    fn no_match(tried: String, available: String) -> IfaceError;
    fn no_default_route() -> IfaceError;
    /// Whether `--iface-can-reach` (an IPv4 route) can choose for the family.
    const CAN_REACH: bool;
    /// The public IP of the family that the last bring-up recorded.
    fn recorded(rec: &AgentRecord) -> Option<Self::Addr>;
}

impl ChoosingFamily for Ipv4Net {
    const CAN_REACH: bool = true;
    fn addresses(l: &Link) -> &[Ipv4Addr] {
        &l.ipv4
    }
    fn other_family(value: &str) -> Result<(), IfaceError> {
        Err(IfaceError::Ipv6(value.to_string()))
    }
    async fn reach(handle: &Handle, to: Ipv4Addr) -> Result<(u32, Option<Ipv4Addr>), IfaceError> {
        route_get(handle, to).await.ok_or(IfaceError::Unreachable(to))
    }
    fn no_match(tried: String, available: String) -> IfaceError {
        IfaceError::NoMatch { tried, available }
    }
    fn no_default_route() -> IfaceError {
        IfaceError::NoDefaultRoute
    }
    fn recorded(rec: &AgentRecord) -> Option<Ipv4Addr> {
        rec.v4.as_ref().map(|v4| v4.public_ip)
    }
}

impl ChoosingFamily for Ipv6Net {
    const CAN_REACH: bool = false;
    fn addresses(l: &Link) -> &[Ipv6Addr] {
        &l.ipv6
    }
    fn other_family(_: &str) -> Result<(), IfaceError> {
        Ok(())
    }
    async fn reach(_: &Handle, to: Ipv4Addr) -> Result<(u32, Option<Ipv6Addr>), IfaceError> {
        Err(IfaceError::CanReachIpv6Only(to))
    }
    fn no_match(tried: String, available: String) -> IfaceError {
        IfaceError::NoMatchIpv6Only { tried, available }
    }
    fn no_default_route() -> IfaceError {
        IfaceError::NoDefaultRouteIpv6Only
    }
    fn recorded(rec: &AgentRecord) -> Option<Ipv6Addr> {
        rec.v6.as_ref().map(|v6| v6.public_ip)
    }
}

/// The interface owning `ip` (flannel `ip.GetInterfaceByIP`).
fn owner_of<N: ChoosingFamily>(links: &[Link], ip: N::Addr) -> Option<Chosen<N::Addr>> {
    links.iter().find(|l| N::addresses(l).contains(&ip)).map(|l| Chosen { name: l.name.clone(), address: ip })
}

/// `l` with its best address, or nothing if it has none (flannel:
/// "failed to find IPv4 address for interface").
fn with_first_address<N: ChoosingFamily>(l: &Link) -> Option<Chosen<N::Addr>> {
    N::addresses(l).first().map(|a| Chosen { name: l.name.clone(), address: *a })
}

/// One `--iface` value: `LookupExtIface(ifname, "", "")`, an IP
/// (`ip.GetInterfaceByIP`) or a name (`net.InterfaceByName`).
pub fn by_name_or_address<N: ChoosingFamily>(
    links: &[Link],
    value: &str,
) -> Result<Option<Chosen<N::Addr>>, IfaceError> {
    match value.parse::<IpAddr>() {
        Ok(ip) => match N::of(ip) {
            Some(ip) => Ok(owner_of::<N>(links, ip)),
            None => N::other_family(value).map(|()| None),
        },
        Err(_) => Ok(links.iter().find(|l| l.name == value).and_then(with_first_address::<N>)),
    }
}

/// One `--iface-regex`: `LookupExtIface("", regex, "")` matches the
/// addresses of every interface first (`matchIP`), then the names.
pub fn by_regex<N: ChoosingFamily>(links: &[Link], re: &Regex) -> Option<Chosen<N::Addr>> {
    let by_address = links.iter().find_map(|l| {
        N::addresses(l)
            .iter()
            .find(|a| re.is_match(&a.to_string()))
            .map(|a| Chosen { name: l.name.clone(), address: *a })
    });
    by_address.or_else(|| links.iter().find(|l| re.is_match(&l.name)).and_then(with_first_address::<N>))
}

/// The explicit flags in flannel's order: every `--iface`, then every
/// `--iface-regex`, then `--iface-can-reach` (whose route the caller looked
/// up: the interface index and preferred source). `None` when no flag matched.
pub fn by_flags<N: ChoosingFamily>(
    links: &[Link],
    want: &Wanted,
    reach: Option<(u32, Option<N::Addr>)>,
) -> Result<Option<Chosen<N::Addr>>, IfaceError> {
    for value in want.ifaces {
        if let Some(c) = by_name_or_address::<N>(links, value)? {
            return Ok(Some(c));
        }
    }
    for r in want.regexes {
        let re = Regex::new(r).map_err(|e| IfaceError::BadRegex { regex: r.clone(), reason: e.to_string() })?;
        if let Some(c) = by_regex::<N>(links, &re) {
            return Ok(Some(c));
        }
    }
    // GetInterfaceBySpecificIPRouting: the route's interface and its source address
    Ok(reach.and_then(|(index, src)| {
        let l = links.iter().find(|l| l.index == index)?;
        match src {
            Some(a) => Some(Chosen { name: l.name.clone(), address: a }),
            None => with_first_address::<N>(l),
        }
    }))
}

/// What was tried, and every interface with its addresses of the family.
fn no_match<N: ChoosingFamily>(links: &[Link], tried: String) -> IfaceError {
    let available = links
        .iter()
        .map(|l| format!("{}:{:?}", l.name, N::addresses(l).iter().map(ToString::to_string).collect::<Vec<_>>()))
        .collect::<Vec<_>>()
        .join(", ");
    N::no_match(tried, available)
}

fn flags_tried(want: &Wanted) -> String {
    let mut tried: Vec<String> = want.ifaces.iter().map(|i| format!("--iface {i}")).collect();
    tried.extend(want.regexes.iter().map(|r| format!("--iface-regex {r}")));
    tried.extend(want.can_reach.iter().map(|a| format!("--iface-can-reach {a}")));
    tried.join(", ")
}

/// Go's `IsGlobalUnicast() || IsLinkLocalUnicast()` for IPv4.
fn usable(a: Ipv4Addr) -> bool {
    !(a.is_unspecified() || a.is_loopback() || a.is_multicast() || a.is_broadcast())
}

/// Every interface with its usable IPv4 addresses (flannel
/// `GetInterfaceIP4Addrs`: deprecated ones dropped, permanent before
/// dynamic, link-local last), in ifindex order.
pub async fn links(handle: &Handle) -> anyhow::Result<Vec<Link>> {
    use anyhow::Context;
    let mut out = Vec::new();
    let mut ls = handle.link().get().execute();
    while let Some(l) = ls.try_next().await.context("cannot list links")? {
        let name =
            l.attributes.iter().find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None });
        if let Some(name) = name {
            out.push(Link { name, index: l.header.index, ipv4: Vec::new(), ipv6: Vec::new() });
        }
    }
    // (link-local, not permanent, address) sorts into flannel's order
    let mut addrs: Vec<(bool, bool, u32, Ipv4Addr)> = Vec::new();
    let mut addrs6: Vec<(u8, u32, std::net::Ipv6Addr)> = Vec::new();
    let mut msgs = handle.address().get().execute();
    while let Some(m) = msgs.try_next().await.context("cannot list addresses")? {
        let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
        let mut local = None;
        let mut address = None;
        let mut address6 = None;
        for a in &m.attributes {
            match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => local = Some(*ip),
                AddressAttribute::Address(IpAddr::V4(ip)) => address = Some(*ip),
                AddressAttribute::Address(IpAddr::V6(ip)) => address6 = Some(*ip),
                AddressAttribute::Flags(f) => flags = *f,
                _ => {}
            }
        }
        let global = m.header.scope == rtnetlink::packet_route::address::AddressScope::Universe;
        if let Some((rank, ip)) = address6.filter(|_| global).and_then(|ip| Some((device::ipv6_rank(flags)?, ip))) {
            addrs6.push((rank, m.header.index, ip));
        }
        let Some(ip) = local.or(address) else { continue };
        if usable(ip) && !flags.contains(AddressFlags::Deprecated) {
            addrs.push((ip.is_link_local(), !flags.contains(AddressFlags::Permanent), m.header.index, ip));
        }
    }
    addrs.sort_by_key(|(ll, dynamic, _, _)| (*ll, *dynamic)); // stable: kernel order otherwise
    for (_, _, index, ip) in addrs {
        if let Some(l) = out.iter_mut().find(|l| l.index == index) {
            l.ipv4.push(ip);
        }
    }
    addrs6.sort_by_key(|(rank, _, _)| *rank); // stable: the first of a rank stays first
    for (_, index, ip) in addrs6 {
        if let Some(l) = out.iter_mut().find(|l| l.index == index) {
            l.ipv6.push(ip);
        }
    }
    out.sort_by_key(|l| l.index);
    Ok(out)
}

/// `ip route get ADDR`: the interface index and preferred source.
async fn route_get(handle: &Handle, to: Ipv4Addr) -> Option<(u32, Option<Ipv4Addr>)> {
    let msg = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(to, 32).build();
    let mut routes = handle.route().get(msg).execute();
    let r = routes.try_next().await.ok().flatten()?;
    let oif = r.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None })?;
    let src = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::PrefSource(rtnetlink::packet_route::route::RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    });
    Some((oif, src))
}

/// Refuses what no host state can make match: a regex that does not
/// compile, a flag of the wrong family. Checked before anything is looked up,
/// so only [`IfaceError::fixes_itself`] errors are left to [`choose`].
pub fn validate<N: ChoosingFamily>(want: &Wanted<'_>) -> Result<(), IfaceError> {
    for value in want.ifaces {
        if let Ok(ip) = value.parse::<IpAddr>()
            && N::of(ip).is_none()
        {
            N::other_family(value)?;
        }
    }
    for r in want.regexes {
        Regex::new(r).map_err(|e| IfaceError::BadRegex { regex: r.clone(), reason: e.to_string() })?;
    }
    match want.can_reach {
        Some(ip) if !N::CAN_REACH => Err(IfaceError::CanReachIpv6Only(ip)),
        _ => Ok(()),
    }
}

/// Chooses the underlay by flanneld's rules for the family `N` (see the
/// module doc); `public` is the public IP in force (`node-public-ip(v6)`,
/// else `--public-ip(v6)`), `recorded` the last bring-up's (rule 5).
pub async fn choose<N: ChoosingFamily>(
    handle: &Handle,
    want: &Wanted<'_>,
    public: Option<N::Addr>,
    recorded: Option<N::Addr>,
) -> Result<Chosen<N::Addr>, IfaceError> {
    let reach = match want.can_reach {
        Some(ip) => Some(N::reach(handle, ip).await?),
        None => None,
    };
    let links = links(handle).await.map_err(IfaceError::Netlink)?;
    if want.any_flag() {
        return by_flags::<N>(&links, want, reach)?.ok_or_else(|| no_match::<N>(&links, flags_tried(want)));
    }
    if let Some(c) = public.and_then(|ip| owner_of::<N>(&links, ip)) {
        return Ok(c);
    }
    // flanneld exits when no interface owns the public IP; edgevx keeps the
    // default route's interface, for a public IP that is NATed in front of the node
    let Some(name) = routes::default_route_iface::<N>(handle).await.map_err(IfaceError::Netlink)? else {
        return after_a_restart::<N>(&links, recorded).ok_or_else(N::no_default_route);
    };
    links
        .iter()
        .find(|l| l.name == name)
        .and_then(with_first_address::<N>)
        .ok_or_else(|| no_match::<N>(&links, format!("the default route's {name}")))
}

/// Rule 5: no flag and no default route, so the interface that carries the
/// public IP of the last bring-up, if one still does. Once chosen the
/// underlay is kept by name: a default route that appears later changes
/// nothing (no restart, no new MAC).
fn after_a_restart<N: ChoosingFamily>(links: &[Link], recorded: Option<N::Addr>) -> Option<Chosen<N::Addr>> {
    let c = owner_of::<N>(links, recorded?)?;
    tracing::info!(
        iface = %c.name,
        public_ip = %c.address,
        "no default route: taking the interface that carries the public IP of the last bring-up (the state dir's record)"
    );
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    type V4 = Ipv4Net;
    type V6 = Ipv6Net;

    /// An address of either family, by the type the test wants.
    fn ip<A: std::str::FromStr<Err = std::net::AddrParseError>>(s: &str) -> A {
        s.parse().unwrap()
    }

    fn node() -> Vec<Link> {
        vec![
            Link { name: "lo".into(), index: 1, ipv4: vec![], ipv6: vec![] },
            Link { name: "eth0".into(), index: 2, ipv4: vec![ip("198.18.0.1")], ipv6: vec![] },
            Link { name: "eth1".into(), index: 3, ipv4: vec![ip("198.19.0.1"), ip("198.19.0.11")], ipv6: vec![] },
            Link { name: "bond0".into(), index: 4, ipv4: vec![], ipv6: vec![] },
        ]
    }

    fn chosen<A: std::str::FromStr<Err = std::net::AddrParseError>>(name: &str, address: &str) -> Option<Chosen<A>> {
        Some(Chosen { name: name.into(), address: ip(address) })
    }

    #[test]
    fn iface_by_name_takes_the_first_address() {
        assert_eq!(by_name_or_address::<V4>(&node(), "eth1").unwrap(), chosen("eth1", "198.19.0.1"));
        assert_eq!(by_name_or_address::<V4>(&node(), "nosuch0").unwrap(), None);
        assert_eq!(by_name_or_address::<V4>(&node(), "bond0").unwrap(), None, "no IPv4 address: not usable");
    }

    #[test]
    fn iface_by_address_takes_that_address() {
        assert_eq!(by_name_or_address::<V4>(&node(), "198.19.0.11").unwrap(), chosen("eth1", "198.19.0.11"));
        assert_eq!(by_name_or_address::<V4>(&node(), "198.19.0.99").unwrap(), None);
        assert!(matches!(by_name_or_address::<V4>(&node(), "fd00::1"), Err(IfaceError::Ipv6(_))));
    }

    #[test]
    fn repeated_iface_first_that_matches_wins() {
        let ifaces = ["nosuch0".to_string(), "bond0".into(), "eth1".into(), "eth0".into()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags::<V4>(&node(), &want, None).unwrap(), chosen("eth1", "198.19.0.1"));
    }

    #[test]
    fn regex_matches_addresses_before_names() {
        // "eth0" would match by name, but an address of eth1 matches first
        let re = Regex::new(r"eth0|^198\.19\.").unwrap();
        assert_eq!(by_regex::<V4>(&node(), &re), chosen("eth1", "198.19.0.1"));
        assert_eq!(by_regex::<V4>(&node(), &Regex::new("^eth").unwrap()), chosen("eth0", "198.18.0.1"));
        assert_eq!(by_regex::<V4>(&node(), &Regex::new("^wlan").unwrap()), None);
    }

    #[test]
    fn ifaces_then_regexes_then_can_reach() {
        let ifaces = ["nosuch0".to_string()];
        let regexes = ["^wlan".to_string(), "eth1".into()];
        let want = Wanted { ifaces: &ifaces, regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags::<V4>(&node(), &want, Some((2, None))).unwrap(), chosen("eth1", "198.19.0.1"));
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags::<V4>(&node(), &want, Some((2, None))).unwrap(), chosen("eth0", "198.18.0.1"));
        assert_eq!(
            by_flags::<V4>(&node(), &want, Some((3, Some(ip("198.19.0.11"))))).unwrap(),
            chosen("eth1", "198.19.0.11")
        );
        assert_eq!(by_flags::<V4>(&node(), &want, None).unwrap(), None);
        let bad = ["(".to_string()];
        let want = Wanted { regexes: &bad, ..Default::default() };
        assert!(matches!(by_flags::<V4>(&node(), &want, None), Err(IfaceError::BadRegex { .. })));
    }

    #[test]
    fn the_public_ip_names_its_owner() {
        assert_eq!(owner_of::<V4>(&node(), ip("198.19.0.11")), chosen("eth1", "198.19.0.11"));
        assert_eq!(owner_of::<V4>(&node(), ip("203.0.113.1")), None);
    }

    #[test]
    fn no_match_lists_what_was_tried_and_what_is_there() {
        let ifaces = ["nosuch0".to_string()];
        let e = no_match::<V4>(&node(), flags_tried(&Wanted { ifaces: &ifaces, ..Default::default() })).to_string();
        assert!(e.contains("--iface nosuch0") && e.contains("eth1:[\"198.19.0.1\""), "{e}");
    }

    // the IPv6 stack: an IPv6-only network

    fn ipv6_only_node() -> Vec<Link> {
        let link = |name: &str, index, ipv6: Vec<Ipv6Addr>| Link { name: name.into(), index, ipv4: vec![], ipv6 };
        vec![
            link("lo", 1, vec![]),
            link("eth0", 2, vec![ip("fd00:198:18::1")]),
            link("eth1", 3, vec![ip("fd00:198:19::1"), ip("fd00:198:19::11")]),
            link("bond0", 4, vec![]),
        ]
    }

    #[test]
    fn v6_iface_by_name_or_ipv6_address_first_that_matches_wins() {
        let ifaces = ["nosuch0".to_string(), "bond0".into(), "198.18.0.1".into(), "eth1".into(), "eth0".into()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags::<V6>(&ipv6_only_node(), &want, None).unwrap(), chosen("eth1", "fd00:198:19::1"));
        let ifaces = ["fd00:198:19::11".to_string()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags::<V6>(&ipv6_only_node(), &want, None).unwrap(), chosen("eth1", "fd00:198:19::11"));
        let ifaces = ["fd00:198:19::99".to_string()];
        assert_eq!(
            by_flags::<V6>(&ipv6_only_node(), &Wanted { ifaces: &ifaces, ..Default::default() }, None).unwrap(),
            None
        );
    }

    #[test]
    fn v6_regex_matches_ipv6_addresses_before_names() {
        let regexes = [r"eth0|^fd00:198:19:".to_string()];
        let want = Wanted { regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags::<V6>(&ipv6_only_node(), &want, None).unwrap(), chosen("eth1", "fd00:198:19::1"));
        let regexes = ["^wlan".to_string(), "^eth".into()];
        let want = Wanted { regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags::<V6>(&ipv6_only_node(), &want, None).unwrap(), chosen("eth0", "fd00:198:18::1"));
        let bad = ["(".to_string()];
        assert!(matches!(
            by_flags::<V6>(&ipv6_only_node(), &Wanted { regexes: &bad, ..Default::default() }, None),
            Err(IfaceError::BadRegex { .. })
        ));
    }

    #[test]
    fn the_public_ipv6_names_its_owner() {
        assert_eq!(owner_of::<V6>(&ipv6_only_node(), ip("fd00:198:19::11")), chosen("eth1", "fd00:198:19::11"));
        assert_eq!(owner_of::<V6>(&ipv6_only_node(), ip("2001:db8::1")), None);
        let e = no_match::<V6>(&ipv6_only_node(), "--iface bond0".into()).to_string();
        assert!(e.contains("--iface bond0") && e.contains("eth1:[\"fd00:198:19::1\""), "{e}");
    }
}
