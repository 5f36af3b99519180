//! Address ranges as host-local reads them (plugins/ipam/host-local/backend/
//! allocator/range.go `Canonicalize`, range_set.go): the subnet must be a
//! network address leaving at least two addresses; the gateway defaults to
//! the network's first address; the range runs from network+1 to the last
//! address (minus the broadcast for IPv4); the iterator skips the gateway.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RangeError {
    #[error("{0:?} is not an address prefix")]
    BadSubnet(String),
    #[error("{0:?} is not an IP address")]
    BadAddress(String),
    #[error("network {0} has host bits set (the network address is {1})")]
    HostBits(String, String),
    #[error("network {0} is too small to allocate from")]
    TooSmall(String),
    #[error("{what} {ip} is outside subnet {subnet}")]
    Outside { what: &'static str, ip: IpAddr, subnet: String },
    #[error("rangeStart {0} is after rangeEnd {1}")]
    Reversed(IpAddr, IpAddr),
    #[error("a range set mixes IPv4 and IPv6 ({0})")]
    MixedFamilies(String),
    #[error("range sets overlap: {0} and {1}")]
    Overlap(String, String),
}

/// Addresses of one family as integers, so ranges can be walked.
fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(v4: bool, n: u128) -> IpAddr {
    if v4 { IpAddr::V4(Ipv4Addr::from(n as u32)) } else { IpAddr::V6(Ipv6Addr::from(n)) }
}

/// One `{subnet, rangeStart, rangeEnd, gateway}`, canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub network: IpAddr,
    pub prefix: u8,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// Canonicalizes a range as host-local does.
    pub fn new(
        subnet: &str,
        start: Option<&str>,
        end: Option<&str>,
        gateway: Option<&str>,
    ) -> Result<Self, RangeError> {
        let bad = || RangeError::BadSubnet(subnet.to_string());
        let (addr, len) = subnet.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(bad());
        }
        if prefix > bits - 2 {
            return Err(RangeError::TooSmall(subnet.to_string()));
        }
        let v4 = addr.is_ipv4();
        let host_mask: u128 = if bits - prefix == 128 { u128::MAX } else { (1u128 << (bits - prefix)) - 1 };
        let net = to_u128(addr) & !host_mask;
        if net != to_u128(addr) {
            return Err(RangeError::HostBits(subnet.to_string(), from_u128(v4, net).to_string()));
        }
        let last = net | host_mask;
        let parse = |s: Option<&str>, what: &'static str, default: u128| -> Result<u128, RangeError> {
            let Some(s) = s else { return Ok(default) };
            let ip: IpAddr = s.parse().map_err(|_| RangeError::BadAddress(s.to_string()))?;
            let n = to_u128(ip);
            if ip.is_ipv4() != v4 || n & !host_mask != net {
                return Err(RangeError::Outside { what, ip, subnet: subnet.to_string() });
            }
            Ok(n)
        };
        let gateway = parse(gateway, "gateway", net + 1)?;
        let start = parse(start, "rangeStart", net + 1)?;
        let end = parse(end, "rangeEnd", if v4 { last - 1 } else { last })?;
        if start > end {
            return Err(RangeError::Reversed(from_u128(v4, start), from_u128(v4, end)));
        }
        Ok(Range {
            network: from_u128(v4, net),
            prefix,
            start: from_u128(v4, start),
            end: from_u128(v4, end),
            gateway: from_u128(v4, gateway),
        })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.network.is_ipv4() && to_u128(self.start) <= to_u128(ip) && to_u128(ip) <= to_u128(self.end)
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.network.is_ipv4() == other.network.is_ipv4()
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// The ranges one address is taken from; ADD gives one address per set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

impl RangeSet {
    pub fn new(ranges: Vec<Range>) -> Result<Self, RangeError> {
        let set = RangeSet(ranges);
        if set.0.iter().any(|r| r.network.is_ipv4() != set.0[0].network.is_ipv4()) {
            return Err(RangeError::MixedFamilies(set.to_string()));
        }
        for (i, a) in set.0.iter().enumerate() {
            if let Some(b) = set.0[i + 1..].iter().find(|b| a.overlaps(b)) {
                return Err(RangeError::Overlap(a.to_string(), b.to_string()));
            }
        }
        Ok(set)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|r| r.contains(ip))
    }

    /// The range holding `ip`, for its prefix and gateway.
    pub fn range_of(&self, ip: IpAddr) -> Option<&Range> {
        self.0.iter().find(|r| r.contains(ip))
    }

    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.0.iter().any(|a| other.0.iter().any(|b| a.overlaps(b)))
    }

    /// Every allocatable address once, round-robin as host-local's
    /// `RangeIter`: from the address after `last` when `last` is in the
    /// set, else from the first range's start.
    pub fn walk(&self, last: Option<IpAddr>) -> impl Iterator<Item = IpAddr> + '_ {
        let (first_range, first) = last
            .and_then(|l| self.0.iter().position(|r| r.contains(l)).map(|i| (i, to_u128(l))))
            .map(|(i, l)| {
                let r = &self.0[i];
                if l >= to_u128(r.end) {
                    let next = (i + 1) % self.0.len();
                    (next, to_u128(self.0[next].start))
                } else {
                    (i, l + 1)
                }
            })
            .unwrap_or((0, to_u128(self.0[0].start)));
        let n = self.0.len();
        // the ranges in walking order, the first one split at the start point
        let head = (first_range, first, to_u128(self.0[first_range].end));
        let middle = (1..n).map(move |k| {
            let r = &self.0[(first_range + k) % n];
            ((first_range + k) % n, to_u128(r.start), to_u128(r.end))
        });
        let tail = (first > to_u128(self.0[first_range].start))
            .then(|| (first_range, to_u128(self.0[first_range].start), first - 1));
        std::iter::once(head).chain(middle).chain(tail).flat_map(move |(i, from, to)| {
            let r = &self.0[i];
            let v4 = r.network.is_ipv4();
            (from..=to).map(move |x| from_u128(v4, x)).filter(move |ip| *ip != r.gateway)
        })
    }
}

impl std::fmt::Display for RangeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|r| r.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_are_host_locals() {
        let r = Range::new("10.244.1.0/24", None, None, None).unwrap();
        assert_eq!((r.start, r.end, r.gateway), (ip("10.244.1.1"), ip("10.244.1.254"), ip("10.244.1.1")));
        let r6 = Range::new("fd00:1::/120", None, None, None).unwrap();
        assert_eq!((r6.start, r6.end), (ip("fd00:1::1"), ip("fd00:1::ff")));
    }

    #[test]
    fn bad_subnets_are_refused_by_name() {
        assert_eq!(
            Range::new("10.244.1.1/24", None, None, None),
            Err(RangeError::HostBits("10.244.1.1/24".into(), "10.244.1.0".into()))
        );
        assert_eq!(Range::new("10.0.0.0/31", None, None, None), Err(RangeError::TooSmall("10.0.0.0/31".into())));
        assert!(matches!(Range::new("10.0.0.0", None, None, None), Err(RangeError::BadSubnet(_))));
        assert!(matches!(Range::new("10.0.0.0/24", Some("10.0.1.5"), None, None), Err(RangeError::Outside { .. })));
        assert!(matches!(
            Range::new("10.0.0.0/24", Some("10.0.0.9"), Some("10.0.0.5"), None),
            Err(RangeError::Reversed(..))
        ));
    }

    #[test]
    fn walk_skips_the_gateway_and_wraps_after_last() {
        let r = Range::new("10.0.0.0/29", None, None, None).unwrap();
        let set = RangeSet::new(vec![r]).unwrap();
        let all: Vec<IpAddr> = set.walk(None).collect();
        assert_eq!(all, ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"].map(ip));
        let from4: Vec<IpAddr> = set.walk(Some(ip("10.0.0.4"))).collect();
        assert_eq!(from4, ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"].map(ip));
        let from_end: Vec<IpAddr> = set.walk(Some(ip("10.0.0.6"))).collect();
        assert_eq!(from_end[0], ip("10.0.0.2"));
        assert_eq!(set.walk(Some(ip("192.168.0.1"))).next(), Some(ip("10.0.0.2")));
    }

    #[test]
    fn walk_crosses_ranges_of_a_set() {
        let a = Range::new("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.11"), None).unwrap();
        let b = Range::new("10.0.1.0/24", Some("10.0.1.10"), Some("10.0.1.11"), None).unwrap();
        let set = RangeSet::new(vec![a, b]).unwrap();
        let w: Vec<IpAddr> = set.walk(Some(ip("10.0.0.11"))).collect();
        assert_eq!(w, ["10.0.1.10", "10.0.1.11", "10.0.0.10", "10.0.0.11"].map(ip));
    }

    #[test]
    fn sets_refuse_overlaps_and_mixed_families() {
        let a = Range::new("10.0.0.0/24", None, None, None).unwrap();
        let b = Range::new("10.0.0.0/25", None, None, None).unwrap();
        assert!(matches!(RangeSet::new(vec![a.clone(), b]), Err(RangeError::Overlap(..))));
        let v6 = Range::new("fd00::/64", None, None, None).unwrap();
        assert!(matches!(RangeSet::new(vec![a, v6]), Err(RangeError::MixedFamilies(_))));
    }
}
