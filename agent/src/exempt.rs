//! The inner-source exemption, from this node's operator only
//! (`--any-inner-source`): the peers named there may send VXLAN with any
//! inner source, not only addresses of their pod CIDR. For an external
//! VTEP that forwards client traffic without SNAT (an F5 BIG-IP).
//!
//! A node's own entry never exempts it (the annotation
//! `edgevx.io/any-inner-source`, the lease field `EdgevxAnyInnerSource`):
//! any node that may write its own Node or lease could then send as any
//! pod of the cluster. The sources list such entries, and the agent warns
//! once per node.
use std::{borrow::Cow, collections::BTreeSet, str::FromStr};

use ipnet::IpNet;

use crate::peer::{ClusterView, Peer};

/// One `--any-inner-source` entry: a node name, or a pod CIDR (IPv4 or
/// IPv6; in etcd mode a lease's subnet, whose key is its name there).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exempt {
    Node(String),
    PodCidr(IpNet),
}

impl FromStr for Exempt {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.contains('/') {
            let net: IpNet = s.parse().map_err(|_| format!("{s:?} is neither a node name nor a pod CIDR"))?;
            if net.trunc() != net {
                return Err(format!("pod CIDR {s} has host bits set (did you mean {}?)", net.trunc()));
            }
            return Ok(Exempt::PodCidr(net));
        }
        // a Kubernetes node name (a DNS subdomain), or an etcd lease key (10.5.2.0-24)
        let name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '&' | ':');
        if s.is_empty() || s.len() > 253 || !s.chars().all(name_char) {
            return Err(format!("{s:?} is neither a node name nor a pod CIDR"));
        }
        Ok(Exempt::Node(s.to_string()))
    }
}

/// What `--any-inner-source` names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exemptions {
    nodes: BTreeSet<String>,
    cidrs: BTreeSet<IpNet>,
}

impl Exemptions {
    pub fn new(list: &[Exempt]) -> Self {
        let mut e = Exemptions::default();
        for x in list {
            match x {
                Exempt::Node(n) => e.nodes.insert(n.clone()),
                Exempt::PodCidr(c) => e.cidrs.insert(*c),
            };
        }
        e
    }

    /// Whether the operator named `p`: by its node name, or by one of its
    /// pod CIDRs exactly (a CIDR inside a named one is not named: another
    /// node could claim it).
    pub fn covers(&self, p: &Peer) -> bool {
        self.nodes.contains(&p.node)
            || p.v4.is_some_and(|h| self.cidrs.contains(&IpNet::V4(h.subnet)))
            || p.v6.is_some_and(|h| self.cidrs.contains(&IpNet::V6(h.subnet)))
    }

    /// `view` with the named peers exempt and every other peer not,
    /// whatever the source said; borrowed when that changes nothing.
    pub fn apply<'a>(&self, view: &'a ClusterView) -> Cow<'a, ClusterView> {
        if view.peers.iter().all(|p| p.any_inner_source == self.covers(p)) {
            return Cow::Borrowed(view);
        }
        let mut out = view.clone();
        for p in &mut out.peers {
            p.any_inner_source = self.covers(p);
        }
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, subnet: &str) -> Peer {
        Peer::v4(name, subnet.parse().unwrap(), "198.18.0.9".parse().unwrap(), "02:00:00:00:00:09".parse().unwrap())
    }

    #[test]
    fn only_what_the_operator_names_is_exempt() {
        let list: Vec<Exempt> =
            ["f5", "10.244.9.0/24", "10.5.3.0-24"].iter().map(|s| s.parse().unwrap()).collect::<Vec<_>>();
        let e = Exemptions::new(&list);
        let mut asked = peer("self-set", "10.244.7.0/24");
        asked.any_inner_source = true; // as an older cache may hold it
        let view = ClusterView {
            peers: vec![
                peer("f5", "10.244.8.0/24"),
                peer("by-cidr", "10.244.9.0/24"),
                peer("inside", "10.244.9.0/25"),
                peer("10.5.3.0-24", "10.5.3.0/24"),
                asked,
            ],
            ..ClusterView::default()
        };
        let out = e.apply(&view);
        let exempt: Vec<(&str, bool)> = out.peers.iter().map(|p| (p.node.as_str(), p.any_inner_source)).collect();
        assert_eq!(
            exempt,
            [("f5", true), ("by-cidr", true), ("inside", false), ("10.5.3.0-24", true), ("self-set", false)]
        );
        assert!(matches!(Exemptions::default().apply(&ClusterView::default()), Cow::Borrowed(_)));
    }

    #[test]
    fn bad_entries_are_refused_with_the_text() {
        for bad in ["", "10.244.9.1/24", "Upper", "a b", "10.244.9.0/33"] {
            let e = bad.parse::<Exempt>().unwrap_err();
            assert!(e.contains(bad.trim()) || bad.is_empty(), "{bad}: {e}");
        }
        assert_eq!("fd00:10:244:9::/64".parse::<Exempt>(), Ok(Exempt::PodCidr("fd00:10:244:9::/64".parse().unwrap())));
    }
}
