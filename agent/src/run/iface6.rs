//! The underlay of an IPv6-only network (`EnableIPv4: false`), chosen by
//! flanneld's rules for its IPv6 stack (flannel `main.go` and
//! `pkg/ipmatch/match.go` `LookupExtIface` with `ipv6Stack`):
//!
//! 1. `--iface` values, in order: an IPv6 address names the interface that
//!    owns it (`ip.GetInterfaceByIP6`), anything else is an interface name
//!    (`net.InterfaceByName`); the first that exists and has a global IPv6
//!    address wins.
//! 2. then `--iface-regex` values, in order: the first interface with an
//!    IPv6 address the regex matches (`matchIP`), else the first whose name
//!    it matches.
//! 3. with neither: the interface that owns the public IPv6
//!    (`node-public-ipv6`, else `--public-ipv6`) when one does, else the
//!    interface of the IPv6 default route (`GetDefaultV6GatewayInterface`).
//!
//! `--iface-can-reach` takes an IPv4 address in edgevx, which an IPv6-only
//! network has no route for: it is refused there, by name.
use std::net::{IpAddr, Ipv6Addr};

use regex::Regex;
use rtnetlink::Handle;

use super::iface::{IfaceError, Link, Wanted};
use crate::dataplane::routes;

/// The chosen underlay and its IPv6 address (flannel's `IfaceV6Addr`: the
/// default public IPv6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen6 {
    pub name: String,
    pub address: Ipv6Addr,
}

fn owner_of6(links: &[Link], ip: Ipv6Addr) -> Option<Chosen6> {
    links.iter().find(|l| l.ipv6.contains(&ip)).map(|l| Chosen6 { name: l.name.clone(), address: ip })
}

fn with_first_address6(l: &Link) -> Option<Chosen6> {
    l.ipv6.first().map(|a| Chosen6 { name: l.name.clone(), address: *a })
}

/// The explicit flags in flannel's order: every `--iface`, then every
/// `--iface-regex`. `None` when no flag matched.
pub fn by_flags6(links: &[Link], want: &Wanted) -> Result<Option<Chosen6>, IfaceError> {
    for value in want.ifaces {
        let found = match value.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => owner_of6(links, ip),
            // GetInterfaceByIP6 finds no interface for an IPv4 address
            Ok(IpAddr::V4(_)) => None,
            Err(_) => links.iter().find(|l| l.name == *value).and_then(with_first_address6),
        };
        if found.is_some() {
            return Ok(found);
        }
    }
    for r in want.regexes {
        let re = Regex::new(r).map_err(|e| IfaceError::BadRegex { regex: r.clone(), reason: e.to_string() })?;
        let by_address = links.iter().find_map(|l| {
            l.ipv6.iter().find(|a| re.is_match(&a.to_string())).map(|a| Chosen6 { name: l.name.clone(), address: *a })
        });
        let found = by_address.or_else(|| links.iter().find(|l| re.is_match(&l.name)).and_then(with_first_address6));
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

fn no_match6(links: &[Link], tried: String) -> IfaceError {
    let available = links
        .iter()
        .map(|l| format!("{}:{:?}", l.name, l.ipv6.iter().map(ToString::to_string).collect::<Vec<_>>()))
        .collect::<Vec<_>>()
        .join(", ");
    IfaceError::NoMatch6 { tried, available }
}

/// Chooses the underlay of an IPv6-only network (see the module doc);
/// `public_ipv6` is the public IPv6 in force (`node-public-ipv6`, else
/// `--public-ipv6`).
pub async fn choose6(handle: &Handle, want: &Wanted<'_>, public_ipv6: Option<Ipv6Addr>) -> Result<Chosen6, IfaceError> {
    if let Some(ip) = want.can_reach {
        return Err(IfaceError::CanReachIpv6Only(ip));
    }
    let links = super::iface::links(handle).await.map_err(IfaceError::Netlink)?;
    if !want.ifaces.is_empty() || !want.regexes.is_empty() {
        let mut tried: Vec<String> = want.ifaces.iter().map(|i| format!("--iface {i}")).collect();
        tried.extend(want.regexes.iter().map(|r| format!("--iface-regex {r}")));
        return by_flags6(&links, want)?.ok_or_else(|| no_match6(&links, tried.join(", ")));
    }
    if let Some(c) = public_ipv6.and_then(|ip| owner_of6(&links, ip)) {
        return Ok(c);
    }
    // as with IPv4, a public IPv6 no interface owns keeps the default route's interface
    let name = routes::default_route_iface::<ipnet::Ipv6Net>(handle)
        .await
        .map_err(IfaceError::Netlink)?
        .ok_or(IfaceError::NoDefaultRoute6)?;
    links
        .iter()
        .find(|l| l.name == name)
        .and_then(with_first_address6)
        .ok_or_else(|| no_match6(&links, format!("the IPv6 default route's {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn node() -> Vec<Link> {
        let link = |name: &str, index, ipv6: Vec<Ipv6Addr>| Link { name: name.into(), index, ipv4: vec![], ipv6 };
        vec![
            link("lo", 1, vec![]),
            link("eth0", 2, vec![a("fd00:198:18::1")]),
            link("eth1", 3, vec![a("fd00:198:19::1"), a("fd00:198:19::11")]),
            link("bond0", 4, vec![]),
        ]
    }

    fn chosen(name: &str, address: &str) -> Option<Chosen6> {
        Some(Chosen6 { name: name.into(), address: a(address) })
    }

    #[test]
    fn iface_by_name_or_ipv6_address_first_that_matches_wins() {
        let ifaces = ["nosuch0".to_string(), "bond0".into(), "198.18.0.1".into(), "eth1".into(), "eth0".into()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags6(&node(), &want).unwrap(), chosen("eth1", "fd00:198:19::1"));
        let ifaces = ["fd00:198:19::11".to_string()];
        let want = Wanted { ifaces: &ifaces, ..Default::default() };
        assert_eq!(by_flags6(&node(), &want).unwrap(), chosen("eth1", "fd00:198:19::11"));
        let ifaces = ["fd00:198:19::99".to_string()];
        assert_eq!(by_flags6(&node(), &Wanted { ifaces: &ifaces, ..Default::default() }).unwrap(), None);
    }

    #[test]
    fn regex_matches_ipv6_addresses_before_names() {
        let regexes = [r"eth0|^fd00:198:19:".to_string()];
        let want = Wanted { regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags6(&node(), &want).unwrap(), chosen("eth1", "fd00:198:19::1"));
        let regexes = ["^wlan".to_string(), "^eth".into()];
        let want = Wanted { regexes: &regexes, ..Default::default() };
        assert_eq!(by_flags6(&node(), &want).unwrap(), chosen("eth0", "fd00:198:18::1"));
        let bad = ["(".to_string()];
        assert!(matches!(
            by_flags6(&node(), &Wanted { regexes: &bad, ..Default::default() }),
            Err(IfaceError::BadRegex { .. })
        ));
    }

    #[test]
    fn the_public_ipv6_names_its_owner() {
        assert_eq!(owner_of6(&node(), a("fd00:198:19::11")), chosen("eth1", "fd00:198:19::11"));
        assert_eq!(owner_of6(&node(), a("2001:db8::1")), None);
        let e = no_match6(&node(), "--iface bond0".into()).to_string();
        assert!(e.contains("--iface bond0") && e.contains("eth1:[\"fd00:198:19::1\""), "{e}");
    }
}
