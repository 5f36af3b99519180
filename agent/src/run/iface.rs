//! Which interface carries VXLAN (the underlay), chosen by flanneld's rules
//! (flannel `main.go`, "Work out which interface to use", and
//! `pkg/ipmatch/match.go` `LookupExtIface`) for a network with IPv4 on
//! (IPv4 or dual-stack; an IPv6-only network's is `iface6.rs`):
//!
//! 1. `--iface` values, in order: an IPv4 address names the interface that
//!    owns it, anything else is an interface name; the first that exists
//!    and has an IPv4 address wins.
//! 2. then `--iface-regex` values, in order: the first interface with an
//!    IPv4 address the regex matches, else the first whose name it matches.
//! 3. then `--iface-can-reach`: the interface of `ip route get ADDR`.
//! 4. with none of those flags: the interface that owns the public IP
//!    (`node-public-ip`, else `--public-ip`) when one does, else the
//!    interface of the IPv4 default route.
//!
//! Interfaces are tried in ifindex order, as Go's `net.Interfaces()` lists them.
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use regex::Regex;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        address::{AddressAttribute, AddressFlags},
        link::LinkAttribute,
        route::RouteAttribute,
    },
};

use crate::dataplane::{device, routes};

/// What the flags ask for.
#[derive(Clone, Debug, Default)]
pub struct Wanted<'a> {
    /// `--iface`, each a name or an IPv4 address.
    pub ifaces: &'a [String],
    /// `--iface-regex`.
    pub regexes: &'a [String],
    /// `--iface-can-reach`.
    pub can_reach: Option<Ipv4Addr>,
    /// The public IP in force: `node-public-ip`, else `--public-ip`.
    pub public_ip: Option<Ipv4Addr>,
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
    pub ipv6: Vec<std::net::Ipv6Addr>,
}

/// The chosen underlay and its address (flannel's `IfaceAddr`: the default
/// public IP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub name: String,
    pub address: Ipv4Addr,
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
    #[error("no --iface, --iface-regex or --iface-can-reach and no IPv4 default route to take the interface from")]
    NoDefaultRoute,
    #[error(
        "no interface matches {tried} (interfaces: {available}); in an IPv6-only network (EnableIPv4 false) an interface qualifies only with a global IPv6 address"
    )]
    NoMatch6 { tried: String, available: String },
    #[error(
        "--iface-can-reach {0}: the network is IPv6-only (EnableIPv4 false), so there is no IPv4 route to follow; choose the underlay with --iface or --iface-regex"
    )]
    CanReachIpv6Only(Ipv4Addr),
    #[error(
        "no --iface or --iface-regex and no IPv6 default route to take the interface from (the network is IPv6-only)"
    )]
    NoDefaultRoute6,
    #[error("cannot read the interfaces: {0:#}")]
    Netlink(anyhow::Error),
}

/// The interface owning `ip` (flannel `ip.GetInterfaceByIP`).
fn owner_of(links: &[Link], ip: Ipv4Addr) -> Option<Chosen> {
    links.iter().find(|l| l.ipv4.contains(&ip)).map(|l| Chosen { name: l.name.clone(), address: ip })
}

/// `l` with its best address, or nothing if it has none (flannel:
/// "failed to find IPv4 address for interface").
fn with_first_address(l: &Link) -> Option<Chosen> {
    l.ipv4.first().map(|a| Chosen { name: l.name.clone(), address: *a })
}

/// One `--iface` value: `LookupExtIface(ifname, "", "")`, an IP
/// (`ip.GetInterfaceByIP`) or a name (`net.InterfaceByName`).
pub fn by_name_or_address(links: &[Link], value: &str) -> Result<Option<Chosen>, IfaceError> {
    match value.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Ok(owner_of(links, ip)),
        Ok(IpAddr::V6(_)) => Err(IfaceError::Ipv6(value.to_string())),
        Err(_) => Ok(links.iter().find(|l| l.name == value).and_then(with_first_address)),
    }
}

/// One `--iface-regex`: `LookupExtIface("", regex, "")` matches the
/// addresses of every interface first (`matchIP`), then the names.
pub fn by_regex(links: &[Link], re: &Regex) -> Option<Chosen> {
    let by_address = links.iter().find_map(|l| {
        l.ipv4.iter().find(|a| re.is_match(&a.to_string())).map(|a| Chosen { name: l.name.clone(), address: *a })
    });
    by_address.or_else(|| links.iter().find(|l| re.is_match(&l.name)).and_then(with_first_address))
}

/// The explicit flags in flannel's order: every `--iface`, then every
/// `--iface-regex`, then `--iface-can-reach` (whose route the caller looked
/// up: the interface index and preferred source). `None` when no flag matched.
pub fn by_flags(
    links: &[Link],
    want: &Wanted,
    reach: Option<(u32, Option<Ipv4Addr>)>,
) -> Result<Option<Chosen>, IfaceError> {
    for value in want.ifaces {
        if let Some(c) = by_name_or_address(links, value)? {
            return Ok(Some(c));
        }
    }
    for r in want.regexes {
        let re = Regex::new(r).map_err(|e| IfaceError::BadRegex { regex: r.clone(), reason: e.to_string() })?;
        if let Some(c) = by_regex(links, &re) {
            return Ok(Some(c));
        }
    }
    // GetInterfaceBySpecificIPRouting: the route's interface and its source address
    Ok(reach.and_then(|(index, src)| {
        let l = links.iter().find(|l| l.index == index)?;
        match src {
            Some(a) => Some(Chosen { name: l.name.clone(), address: a }),
            None => with_first_address(l),
        }
    }))
}

fn no_match(links: &[Link], want: &Wanted) -> IfaceError {
    let mut tried: Vec<String> = want.ifaces.iter().map(|i| format!("--iface {i}")).collect();
    tried.extend(want.regexes.iter().map(|r| format!("--iface-regex {r}")));
    tried.extend(want.can_reach.iter().map(|a| format!("--iface-can-reach {a}")));
    let available = links
        .iter()
        .map(|l| format!("{}:{:?}", l.name, l.ipv4.iter().map(ToString::to_string).collect::<Vec<_>>()))
        .collect::<Vec<_>>()
        .join(", ");
    IfaceError::NoMatch { tried: tried.join(", "), available }
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

/// Chooses the underlay by flanneld's rules (see the module doc).
pub async fn choose(handle: &Handle, want: &Wanted<'_>) -> Result<Chosen, IfaceError> {
    let links = links(handle).await.map_err(IfaceError::Netlink)?;
    if !want.ifaces.is_empty() || !want.regexes.is_empty() || want.can_reach.is_some() {
        let reach = match want.can_reach {
            Some(ip) => Some(route_get(handle, ip).await.ok_or(IfaceError::Unreachable(ip))?),
            None => None,
        };
        return by_flags(&links, want, reach)?.ok_or_else(|| no_match(&links, want));
    }
    if let Some(c) = want.public_ip.and_then(|ip| owner_of(&links, ip)) {
        return Ok(c);
    }
    // flanneld exits when no interface owns the public IP; edgevx keeps the
    // default route's interface, for a public IP that is NATed in front of the node
    let name = routes::default_route_iface::<ipnet::Ipv4Net>(handle)
        .await
        .map_err(IfaceError::Netlink)?
        .ok_or(IfaceError::NoDefaultRoute)?;
    links
        .iter()
        .find(|l| l.name == name)
        .and_then(with_first_address)
        .ok_or_else(|| IfaceError::NoMatch { tried: format!("the default route's {name}"), available: name.clone() })
}

/// This Node's `node-public-ip` and `node-public-ipv6` annotations as
/// flanneld reads them before it picks the interface (flannel
/// `GetStoredPublicIP`: the kube subnet manager reads the Node, the etcd one
/// has none). The nodes file is read like the API; an API that does not
/// answer in time gives the cached view's.
pub async fn stored_public_ip(
    source: &super::check::Source,
    node: &str,
    names: &crate::annotations::AnnotationNames,
    state: &crate::state::StateDir,
) -> (Option<Ipv4Addr>, Option<std::net::Ipv6Addr>) {
    use super::check::Source;
    let annotated = |n: &serde_json::Value| {
        let a = &n["metadata"]["annotations"];
        (
            a[names.node_public_ip.as_str()].as_str().and_then(|s| s.parse().ok()),
            a[names.node_public_ipv6.as_str()].as_str().and_then(|s| s.parse().ok()),
        )
    };
    match source {
        Source::Etcd(_) => (None, None),
        Source::File(path) => {
            let Ok(nodes) = crate::source::nodes_file::read(path) else { return (None, None) };
            nodes.iter().find(|n| n["metadata"]["name"] == node).map(annotated).unwrap_or_default()
        }
        Source::Kube(client) => {
            let api: ::kube::Api<k8s_openapi::api::core::v1::Node> = ::kube::Api::all(client.clone());
            match tokio::time::timeout(std::time::Duration::from_secs(2), api.get(node)).await {
                Ok(Ok(n)) => serde_json::to_value(&n).ok().as_ref().map(annotated).unwrap_or_default(),
                _ => match state.load_view().ok().flatten().and_then(|d| d.view.own) {
                    Some(o) => (o.node_public_ip, o.node_public_ipv6),
                    None => (None, None),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn node() -> Vec<Link> {
        vec![
            Link { name: "lo".into(), index: 1, ipv4: vec![], ipv6: vec![] },
            Link { name: "eth0".into(), index: 2, ipv4: vec![a("198.18.0.1")], ipv6: vec![] },
            Link { name: "eth1".into(), index: 3, ipv4: vec![a("198.19.0.1"), a("198.19.0.11")], ipv6: vec![] },
            Link { name: "bond0".into(), index: 4, ipv4: vec![], ipv6: vec![] },
        ]
    }

    fn chosen(name: &str, address: &str) -> Option<Chosen> {
        Some(Chosen { name: name.into(), address: a(address) })
    }

    #[test]
    fn iface_by_name_takes_the_first_address() {
        assert_eq!(by_name_or_address(&node(), "eth1").unwrap(), chosen("eth1", "198.19.0.1"));
        assert_eq!(by_name_or_address(&node(), "nosuch0").unwrap(), None);
        assert_eq!(by_name_or_address(&node(), "bond0").unwrap(), None, "no IPv4 address: not usable");
    }

    #[test]
    fn iface_by_address_takes_that_address() {
        assert_eq!(by_name_or_address(&node(), "198.19.0.11").unwrap(), chosen("eth1", "198.19.0.11"));
        assert_eq!(by_name_or_address(&node(), "198.19.0.99").unwrap(), None);
        assert!(matches!(by_name_or_address(&node(), "fd00::1"), Err(IfaceError::Ipv6(_))));
    }

    #[test]
    fn repeated_iface_first_that_matches_wins() {
        let ifaces = ["nosuch0".to_string(), "bond0".into(), "eth1".into(), "eth0".into()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags(&node(), &want, None).unwrap(), chosen("eth1", "198.19.0.1"));
    }

    #[test]
    fn regex_matches_addresses_before_names() {
        // "eth0" would match by name, but an address of eth1 matches first
        let re = Regex::new(r"eth0|^198\.19\.").unwrap();
        assert_eq!(by_regex(&node(), &re), chosen("eth1", "198.19.0.1"));
        assert_eq!(by_regex(&node(), &Regex::new("^eth").unwrap()), chosen("eth0", "198.18.0.1"));
        assert_eq!(by_regex(&node(), &Regex::new("^wlan").unwrap()), None);
    }

    #[test]
    fn ifaces_then_regexes_then_can_reach() {
        let ifaces = ["nosuch0".to_string()];
        let regexes = ["^wlan".to_string(), "eth1".into()];
        let want = Wanted { ifaces: &ifaces, regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags(&node(), &want, Some((2, None))).unwrap(), chosen("eth1", "198.19.0.1"));
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags(&node(), &want, Some((2, None))).unwrap(), chosen("eth0", "198.18.0.1"));
        assert_eq!(by_flags(&node(), &want, Some((3, Some(a("198.19.0.11"))))).unwrap(), chosen("eth1", "198.19.0.11"));
        assert_eq!(by_flags(&node(), &want, None).unwrap(), None);
        let bad = ["(".to_string()];
        let want = Wanted { regexes: &bad, ..Default::default() };
        assert!(matches!(by_flags(&node(), &want, None), Err(IfaceError::BadRegex { .. })));
    }

    #[test]
    fn the_public_ip_names_its_owner() {
        assert_eq!(owner_of(&node(), a("198.19.0.11")), chosen("eth1", "198.19.0.11"));
        assert_eq!(owner_of(&node(), a("203.0.113.1")), None);
    }

    #[test]
    fn no_match_lists_what_was_tried_and_what_is_there() {
        let ifaces = ["nosuch0".to_string()];
        let e = no_match(&node(), &Wanted { ifaces: &ifaces, ..Default::default() }).to_string();
        assert!(e.contains("--iface nosuch0") && e.contains("eth1:[\"198.19.0.1\""), "{e}");
    }
}
