//! The range an etcd node's subnet lease is taken from, and the taking:
//! flannel's `CheckNetworkConfig` defaults and checks for the IPv4
//! `SubnetLen`/`SubnetMin`/`SubnetMax` and their IPv6 twins, and its
//! `allocateSubnet`, which takes both families' subnets the same way.
//!
//! The checks are two functions, named by the keys they read:
//! [`subnet_range`] (`SubnetLen`, `SubnetMin`, `SubnetMax`) and
//! [`ipv6_subnet_range`] (`IPv6SubnetLen`, `IPv6SubnetMin`,
//! `IPv6SubnetMax`). They are not one generic function because flannel
//! keeps the two families' rules apart, with different defaults, bounds
//! and messages, and the IPv4 keys are read from the raw JSON (a
//! `SubnetLen` outside 1 to 32 is refused, not truncated). What both
//! families do the same way ([`SubnetRange::fits`], [`allocate`],
//! [`previous_subnet`]) is written once over the family.
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::Value;

use crate::{
    family::Family,
    netconf::{Ipv6Conf, NetConf},
};

/// A network config whose subnet range cannot be used; the IPv6 ones are
/// flannel's messages word for word.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    #[error("network config is not JSON ({0})")]
    NotJson(serde_json::Error),
    #[error("SubnetLen {0} is not a prefix length from 1 to 32 (or 0 for the default)")]
    SubnetLenNotAPrefix(Value),
    #[error("SubnetLen {len} does not fit Network {net} (max 30)")]
    SubnetLenDoesNotFit { len: u8, net: Ipv4Net },
    #[error("{key} {text:?} is not an IPv4 address")]
    NotAnAddress { key: &'static str, text: String },
    #[error("{key} {addr} is not a /{len} inside {net}")]
    NotASubnet { key: &'static str, addr: Ipv4Addr, len: u8, net: Ipv4Net },
    #[error("SubnetLen must be less than /127")]
    Ipv6SubnetLenTooLong,
    #[error("network must be able to accommodate at least four subnets")]
    Ipv6FewerThanFourSubnets,
    #[error("IPv6Network is too small. Minimum useful network prefix is /124")]
    Ipv6NetworkTooSmall,
    #[error("{0} is not in the range of the IPv6Network")]
    Ipv6OutsideNetwork(&'static str),
    #[error("{0} is not on a SubnetLen boundary: {1}")]
    Ipv6Unaligned(&'static str, Ipv6Addr),
}

/// The subnet range of a network config, one family's (flannel's
/// `CheckNetworkConfig` defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubnetRange<N: Family> {
    pub len: u8,
    pub min: N::Addr,
    pub max: N::Addr,
}

impl<N: Family> SubnetRange<N> {
    /// flannel's `isSubnetConfigCompat` and `isIPv6SubnetConfigCompat`: our
    /// old subnet may stay.
    pub fn fits(&self, net: N) -> bool {
        net.prefix_length() == self.len && net.network_addr() >= self.min && net.network_addr() <= self.max
    }
}

/// The IPv4 subnet range of a network config, from `SubnetLen`,
/// `SubnetMin` and `SubnetMax` with flannel's `CheckNetworkConfig`
/// defaults; [`ipv6_subnet_range`] reads the IPv6 keys by flannel's other
/// rules (see the module doc).
pub fn subnet_range(config: &str, conf: &NetConf) -> Result<SubnetRange<Ipv4Net>, RangeError> {
    let v: Value = serde_json::from_str(config).map_err(RangeError::NotJson)?;
    let net = conf.network;
    // 0 is flannel's "unset" (a Go uint's zero value), so it means the default
    let len = match v.get("SubnetLen") {
        None | Some(Value::Null) => 0,
        Some(l) => l
            .as_u64()
            .and_then(|l| u8::try_from(l).ok())
            .filter(|l| *l <= 32)
            .ok_or_else(|| RangeError::SubnetLenNotAPrefix(l.clone()))?,
    };
    let len = match len {
        0 if net.prefix_len() <= 22 => 24,
        0 => net.prefix_len() + 2,
        l => l,
    };
    if len < net.prefix_len() || len > 30 {
        return Err(RangeError::SubnetLenDoesNotFit { len, net });
    }
    let size = 1u32 << (32 - len);
    let first = u32::from(net.network());
    let count = 1u32 << (len - net.prefix_len());
    let addr = |key: &'static str, default: u32| -> Result<Ipv4Addr, RangeError> {
        match v.get(key).and_then(Value::as_str) {
            None => Ok(Ipv4Addr::from(default)),
            Some(s) => {
                let a: Ipv4Addr = s.parse().map_err(|_| RangeError::NotAnAddress { key, text: s.to_string() })?;
                if a.is_unspecified() {
                    return Ok(Ipv4Addr::from(default)); // flannel's "unset" (ip.IP4(0))
                }
                if u32::from(a) % size != 0 || !net.contains(&a) {
                    return Err(RangeError::NotASubnet { key, addr: a, len, net });
                }
                Ok(a)
            }
        }
    };
    let min = addr("SubnetMin", first + if count > 1 { size } else { 0 })?;
    let max = addr("SubnetMax", first + (count - 1) * size)?;
    Ok(SubnetRange { len, min, max })
}

/// The IPv6 subnet range of a dual-stack network config, from
/// `IPv6SubnetLen`, `IPv6SubnetMin` and `IPv6SubnetMax` (as `Ipv6Conf`
/// holds them), with flannel's `CheckNetworkConfig` defaults and its error
/// messages word for word.
pub fn ipv6_subnet_range(v6: &Ipv6Conf) -> Result<SubnetRange<Ipv6Net>, RangeError> {
    let net = v6.network;
    let len = match v6.subnet_len {
        Some(l) if l > 126 => return Err(RangeError::Ipv6SubnetLenTooLong),
        Some(l) if l < net.prefix_len() + 2 => {
            return Err(RangeError::Ipv6FewerThanFourSubnets);
        }
        Some(l) => l,
        None if net.prefix_len() > 124 => {
            return Err(RangeError::Ipv6NetworkTooSmall);
        }
        None if net.prefix_len() <= 62 => 64,
        None => net.prefix_len() + 2,
    };
    let size = 1u128 << (128 - len);
    let first = u128::from(net.network());
    let last = u128::from(net.broadcast());
    let min = match v6.subnet_min {
        None => Ipv6Addr::from(first + size),
        Some(a) if !net.contains(&a) => return Err(RangeError::Ipv6OutsideNetwork("IPv6SubnetMin")),
        Some(a) => a,
    };
    let max = match v6.subnet_max {
        // the next network's address minus one subnet
        None => Ipv6Addr::from(last - size + 1),
        Some(a) if !net.contains(&a) => return Err(RangeError::Ipv6OutsideNetwork("IPv6SubnetMax")),
        Some(a) => a,
    };
    if u128::from(min) % size != 0 {
        return Err(RangeError::Ipv6Unaligned("IPv6SubnetMin", min));
    }
    if u128::from(max) % size != 0 {
        return Err(RangeError::Ipv6Unaligned("IPv6SubnetMax", max));
    }
    Ok(SubnetRange { len, min, max })
}

/// Picks a free subnet as flannel's `allocateSubnet` does: `previous` if
/// it fits and is free, else one at random (by `seed`) among the first 100
/// free subnets from the range's start.
pub fn allocate<N: Family>(range: SubnetRange<N>, taken: &[N], previous: Option<N>, seed: u64) -> Option<N> {
    let free = |n: &N| !taken.iter().any(|t| t.covers(n) || n.covers(t));
    if let Some(p) = previous.filter(|p| range.fits(*p) && free(p)) {
        return Some(p);
    }
    let size = 1u128 << (N::BITS - range.len);
    let (min, max) = (N::bits(range.min), N::bits(range.max));
    let mut candidates = Vec::new();
    let mut at = Some(min);
    while let Some(a) = at.filter(|a| *a <= max && candidates.len() < 100) {
        let Some(n) = N::with_len(N::from_bits(a), range.len) else { break };
        let overlap = taken.iter().find(|t| t.covers(&n) || n.covers(t));
        if overlap.is_none() {
            candidates.push(n);
        }
        // past this candidate, or past a bigger taken subnet in one step: a
        // lease key with a short prefix must not make this walk 2^64 steps
        let last = overlap.map_or(0, |t| t.last_bits()).max(a + (size - 1));
        at = last.checked_add(1);
    }
    candidates.get((seed % candidates.len().max(1) as u64) as usize).copied()
}

/// Our subnet of the family from a subnet.env: `FLANNEL_SUBNET`
/// (`10.244.5.1/24` -> `10.244.5.0/24`) or `FLANNEL_IPV6_SUBNET`
/// (`fd00:10:244:5::1/64` -> `fd00:10:244:5::/64`), masked as Go's
/// `net.ParseCIDR` does.
pub fn previous_subnet<N: Family>(subnet_env: &str) -> Option<N> {
    let key = if N::IPV6 { "FLANNEL_IPV6_SUBNET=" } else { "FLANNEL_SUBNET=" };
    let line = subnet_env.lines().find_map(|l| l.strip_prefix(key))?;
    let net = line.trim().parse::<ipnet::IpNet>().ok()?.trunc();
    N::with_len(N::of(net.network())?, net.prefix_len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(net: &str) -> NetConf {
        NetConf { network: net.parse().unwrap(), ..NetConf::default() }
    }

    #[test]
    fn subnet_len_outside_1_to_32_is_refused_not_truncated() {
        let net = conf("10.0.0.0/8");
        // 280 as u8 would be 24: a plausible length nobody asked for
        for bad in ["280", "33", "-1", "24.5", "\"24\""] {
            let e = subnet_range(&format!(r#"{{"SubnetLen":{bad}}}"#), &net).unwrap_err().to_string();
            assert!(e.contains("SubnetLen") && e.contains("1 to 32"), "{bad}: {e}");
        }
        assert_eq!(subnet_range(r#"{"SubnetLen":null}"#, &net).unwrap().len, 24);
        assert_eq!(subnet_range(r#"{"SubnetLen":0}"#, &net).unwrap().len, 24, "flannel's unset");
        assert_eq!(subnet_range(r#"{"SubnetLen":20}"#, &net).unwrap().len, 20);
        // in 1-32 but not within flannel's bounds: refused as before
        assert!(subnet_range(r#"{"SubnetLen":31}"#, &net).unwrap_err().to_string().contains("max 30"));
    }

    #[test]
    fn subnet_range_defaults_follow_flannel() {
        let r = subnet_range(r#"{"Network":"10.244.0.0/16"}"#, &conf("10.244.0.0/16")).unwrap();
        assert_eq!((r.len, r.min, r.max), (24, "10.244.1.0".parse().unwrap(), "10.244.255.0".parse().unwrap()));
        let r = subnet_range(r#"{"Network":"10.1.0.0/24"}"#, &conf("10.1.0.0/24")).unwrap();
        assert_eq!(r.len, 26);
        assert!(subnet_range(r#"{"SubnetMin":"10.244.1.7"}"#, &conf("10.244.0.0/16")).is_err());
        // 0.0.0.0 is flannel's "unset": the defaults
        assert_eq!(
            subnet_range(r#"{"SubnetMin":"0.0.0.0","SubnetMax":"0.0.0.0"}"#, &conf("10.244.0.0/16")).ok(),
            subnet_range("{}", &conf("10.244.0.0/16")).ok()
        );
    }

    #[test]
    fn allocation_prefers_previous_then_any_free() {
        let r = subnet_range("{}", &conf("10.244.0.0/22")).unwrap(); // /24s: .1, .2, .3 usable
        let taken: Vec<Ipv4Net> = vec!["10.244.1.0/24".parse().unwrap()];
        let prev: Ipv4Net = "10.244.3.0/24".parse().unwrap();
        assert_eq!(allocate(r, &taken, Some(prev), 0), Some(prev));
        assert_eq!(
            allocate(r, &taken, Some("10.244.1.0/24".parse().unwrap()), 0),
            Some("10.244.2.0/24".parse().unwrap())
        );
        let full: Vec<Ipv4Net> =
            ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(allocate(r, &full, None, 7), None);
        // as flannel: one of the first 100 free from SubnetMin, by the seed
        let r = subnet_range("{}", &conf("10.244.0.0/16")).unwrap();
        assert_eq!(allocate(r, &taken, None, 0), Some("10.244.2.0/24".parse().unwrap()));
        assert_eq!(allocate(r, &taken, None, 150), Some("10.244.52.0/24".parse().unwrap()), "150 % 100 = 50");
        assert_eq!(
            previous_subnet::<Ipv4Net>("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.5.1/24\n"),
            Some("10.244.5.0/24".parse().unwrap())
        );
    }

    fn ipv6_range(conf: &str) -> Result<SubnetRange<Ipv6Net>, RangeError> {
        let c = NetConf::parse(conf, "x").unwrap();
        ipv6_subnet_range(&c.ipv6.unwrap())
    }

    #[test]
    fn ipv6_subnet_range_follows_flannels_check_network_config() {
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}"#).unwrap();
        assert_eq!(
            (r.len, r.min.to_string(), r.max.to_string()),
            (64, "fd00:10:244:1::".into(), "fd00:10:244:ff::".into())
        );
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"fd00:10:244::/62"}"#).unwrap();
        assert_eq!(r.len, 64, "/62 still gets /64s");
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"fd00:10:244::/63"}"#).unwrap();
        assert_eq!(r.len, 65, "beyond /62: prefix + 2");
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"fd00::/124"}"#).unwrap();
        assert_eq!((r.len, r.min.to_string(), r.max.to_string()), (126, "fd00::4".into(), "fd00::c".into()));
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"::/0"}"#).unwrap();
        assert_eq!(r.max.to_string(), "ffff:ffff:ffff:ffff::", "no overflow at /0");
        let errors = [
            (r#""IPv6Network":"fd00::/125""#, "IPv6Network is too small. Minimum useful network prefix is /124"),
            (r#""IPv6Network":"fd00::/56","IPv6SubnetLen":127"#, "SubnetLen must be less than /127"),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetLen":57"#,
                "network must be able to accommodate at least four subnets",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMin":"fd01::""#,
                "IPv6SubnetMin is not in the range of the IPv6Network",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMax":"fd01::""#,
                "IPv6SubnetMax is not in the range of the IPv6Network",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMin":"fd00:0:0:1::1""#,
                "IPv6SubnetMin is not on a SubnetLen boundary: fd00:0:0:1::1",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMax":"fd00:0:0:2:8000::""#,
                "IPv6SubnetMax is not on a SubnetLen boundary: fd00:0:0:2:8000::",
            ),
        ];
        for (keys, want) in errors {
            let got = ipv6_range(&format!(r#"{{"EnableIPv6":true,{keys}}}"#)).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{keys}");
        }
        let r = ipv6_range(
            r#"{"EnableIPv6":true,"IPv6Network":"fd00::/56","IPv6SubnetLen":60,"IPv6SubnetMin":"fd00:0:0:20::"}"#,
        )
        .unwrap();
        assert_eq!((r.len, r.min.to_string(), r.max.to_string()), (60, "fd00:0:0:20::".into(), "fd00:0:0:f0::".into()));
    }

    #[test]
    fn ipv6_allocation_prefers_previous_then_a_free_one_of_the_first_100() {
        let r = ipv6_range(r#"{"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}"#).unwrap();
        let net = |s: &str| -> Ipv6Net { s.parse().unwrap() };
        let taken = vec![net("fd00:10:244:1::/64"), net("fd00:10:244:3::/64")];
        assert_eq!(allocate(r, &taken, Some(net("fd00:10:244:9::/64")), 0), Some(net("fd00:10:244:9::/64")));
        // taken, outside the range or of another length: not reused
        for bad in ["fd00:10:244:3::/64", "fd00:10:244::/64", "fd00:10:244:9::/80", "fd00:99::/64"] {
            let n = allocate(r, &taken, Some(net(bad)), 0).unwrap();
            assert!(r.fits(n) && !taken.contains(&n) && n != net(bad), "{bad} -> {n}");
        }
        assert_eq!(allocate(r, &taken, None, 0), Some(net("fd00:10:244:2::/64")));
        assert_eq!(allocate(r, &taken, None, 1), Some(net("fd00:10:244:4::/64")));
        // a wide lease covers many subnets
        let all: Vec<Ipv6Net> = vec![net("fd00:10:244::/56")];
        assert_eq!(allocate(r, &all, None, 3), None);
        // one taken subnet covering 2^48 candidates is skipped in one step
        // (walked one by one, this would not end)
        let wide = SubnetRange::<Ipv6Net> {
            len: 64,
            min: "fd00::".parse().unwrap(),
            max: "fd00:ffff:ffff:ffff::".parse().unwrap(),
        };
        assert_eq!(allocate(wide, &[net("fd00::/16")], None, 0), None);
        assert_eq!(allocate(wide, &[net("fd00::/17")], None, 0), Some(net("fd00:8000::/64")));
        assert_eq!(
            previous_subnet::<Ipv6Net>("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_IPV6_SUBNET=fd00:10:244:5::1/64\n"),
            Some(net("fd00:10:244:5::/64"))
        );
        assert_eq!(previous_subnet::<Ipv6Net>("FLANNEL_SUBNET=10.244.5.1/24\n"), None);
    }
}
