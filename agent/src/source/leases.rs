//! flannel's etcd layout, as pure functions: subnet keys, lease values, the
//! network config's subnet range, and subnet allocation.
//! (flannel pkg/subnet/subnet.go, pkg/subnet/config.go, pkg/lease/lease.go)
use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;
use serde_json::{Value, json};

use super::peer_record;
use crate::{
    mac::VtepMac,
    netconf::NetConf,
    peer::{Peer, Rejection},
};

/// `10.244.1.0/24` <-> `10.244.1.0-24`
pub fn subnet_key(net: Ipv4Net) -> String {
    format!("{}-{}", net.network(), net.prefix_len())
}

pub fn parse_subnet_key(key: &str) -> Option<Ipv4Net> {
    // dual-stack keys carry "&<v6>-<len>" after the IPv4 part
    let v4 = key.split('&').next()?;
    let (ip, len) = v4.rsplit_once('-')?;
    let net = Ipv4Net::new(ip.parse().ok()?, len.parse().ok()?).ok()?;
    (net.trunc() == net).then_some(net)
}

/// A lease value as flanneld writes it.
pub fn lease_value(public_ip: Ipv4Addr, vni: u32, mac: VtepMac) -> String {
    json!({
        "PublicIP": public_ip.to_string(),
        "PublicIPv6": null,
        "BackendType": "vxlan",
        "BackendData": {"VNI": vni, "VtepMAC": mac.to_string()},
    })
    .to_string()
}

/// What one lease says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub subnet: Ipv4Net,
    pub public_ip: Ipv4Addr,
    pub backend_type: String,
    pub vtep_mac: Option<VtepMac>,
}

pub fn parse_lease(key: &str, value: &str) -> Result<Lease, String> {
    let subnet = parse_subnet_key(key).ok_or_else(|| format!("key {key:?} is not <a.b.c.d>-<len>"))?;
    let v: Value = serde_json::from_str(value).map_err(|e| format!("lease is not JSON ({e})"))?;
    let ip = v.get("PublicIP").and_then(Value::as_str).ok_or("lease has no PublicIP")?;
    let public_ip: Ipv4Addr = ip.parse().map_err(|_| format!("bad PublicIP {ip:?}"))?;
    let backend_type = v.get("BackendType").and_then(Value::as_str).unwrap_or("").to_string();
    let vtep_mac = match v.pointer("/BackendData/VtepMAC") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.parse().map_err(|e| format!("bad VtepMAC: {e}"))?),
        Some(other) => return Err(format!("VtepMAC is not a string: {other}")),
    };
    Ok(Lease { subnet, public_ip, backend_type, vtep_mac })
}

/// Turns leases into peers with flannel's rules; `own` is skipped, and a
/// lease gets the same checks as a Node ([`peer_record::check`]), with
/// `own_ip` as this node's address.
pub fn peers(
    leases: &BTreeMap<String, String>,
    network: Ipv4Net,
    own: Option<Ipv4Net>,
    own_ip: Ipv4Addr,
) -> (Vec<Peer>, Vec<Rejection>, Vec<Rejection>) {
    let (mut peers, mut rejected, mut ignored) = (Vec::new(), Vec::new(), Vec::new());
    for (key, value) in leases {
        let reject = |reason: String| Rejection { node: key.clone(), reason };
        match parse_lease(key, value) {
            Err(reason) => rejected.push(reject(reason)),
            Ok(l) if Some(l.subnet) == own => {}
            Ok(l) if l.backend_type != "vxlan" => {
                ignored.push(reject(format!("backend type {:?} is not \"vxlan\"", l.backend_type)))
            }
            Ok(l) if peer_record::check(l.public_ip, l.subnet, network, &[own_ip]).is_err() => {
                if let Err(e) = peer_record::check(l.public_ip, l.subnet, network, &[own_ip]) {
                    rejected.push(reject(e.to_string()))
                }
            }
            Ok(Lease { vtep_mac: None, .. }) => rejected.push(reject("lease has no BackendData.VtepMAC".into())),
            Ok(Lease { subnet, public_ip, vtep_mac: Some(mac), .. }) => {
                let any_inner_source = lease_allows_any_inner_source(value);
                peers.push(Peer { node: key.clone(), subnet, public_ip, vtep_mac: mac, any_inner_source, v6: None })
            }
        }
    }
    (peers, rejected, ignored)
}

/// edgevx's field in a lease value (flanneld never writes it): `true` lets
/// the lease's VTEP send any inner source, for an external VTEP that
/// forwards client traffic without SNAT. Anything else is the default.
pub const ANY_INNER_SOURCE_FIELD: &str = "EdgevxAnyInnerSource";

fn lease_allows_any_inner_source(value: &str) -> bool {
    serde_json::from_str::<Value>(value).is_ok_and(|v| v.get(ANY_INNER_SOURCE_FIELD) == Some(&Value::Bool(true)))
}

/// The subnet range of a network config (flannel's CheckNetworkConfig defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubnetRange {
    pub len: u8,
    pub min: Ipv4Addr,
    pub max: Ipv4Addr,
}

pub fn subnet_range(config: &str, conf: &NetConf) -> Result<SubnetRange, String> {
    let v: Value = serde_json::from_str(config).map_err(|e| format!("network config is not JSON ({e})"))?;
    let net = conf.network;
    // 0 is flannel's "unset" (a Go uint's zero value), so it means the default
    let len = match v.get("SubnetLen") {
        None | Some(Value::Null) => 0,
        Some(l) => l
            .as_u64()
            .and_then(|l| u8::try_from(l).ok())
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("SubnetLen {l} is not a prefix length from 1 to 32 (or 0 for the default)"))?,
    };
    let len = match len {
        0 if net.prefix_len() <= 22 => 24,
        0 => net.prefix_len() + 2,
        l => l,
    };
    if len < net.prefix_len() || len > 30 {
        return Err(format!("SubnetLen {len} does not fit Network {net} (max 30)"));
    }
    let size = 1u32 << (32 - len);
    let first = u32::from(net.network());
    let count = 1u32 << (len - net.prefix_len());
    let addr = |key: &str, default: u32| -> Result<Ipv4Addr, String> {
        match v.get(key).and_then(Value::as_str) {
            None => Ok(Ipv4Addr::from(default)),
            Some(s) => {
                let a: Ipv4Addr = s.parse().map_err(|_| format!("{key} {s:?} is not an IPv4 address"))?;
                if u32::from(a) % size != 0 || !net.contains(&a) {
                    return Err(format!("{key} {a} is not a /{len} inside {net}"));
                }
                Ok(a)
            }
        }
    };
    let min = addr("SubnetMin", first + if count > 1 { size } else { 0 })?;
    let max = addr("SubnetMax", first + (count - 1) * size)?;
    Ok(SubnetRange { len, min, max })
}

/// Picks a free subnet: `previous` if it is free and in range, else the
/// first free of a random rotation of the range (flannel picks at random
/// among free subnets, so nodes starting together rarely collide).
pub fn allocate(range: SubnetRange, taken: &[Ipv4Net], previous: Option<Ipv4Net>, seed: u64) -> Option<Ipv4Net> {
    let free = |n: &Ipv4Net| !taken.iter().any(|t| t.contains(&n.network()) || n.contains(&t.network()));
    let in_range = |n: &Ipv4Net| n.prefix_len() == range.len && n.network() >= range.min && n.network() <= range.max;
    if let Some(p) = previous.filter(|p| in_range(p) && free(p)) {
        return Some(p);
    }
    let size = 1u32 << (32 - range.len);
    let count = (u32::from(range.max) - u32::from(range.min)) / size + 1;
    let start = (seed % count as u64) as u32;
    (0..count)
        .map(|i| Ipv4Addr::from(u32::from(range.min) + ((start + i) % count) * size))
        .filter_map(|a| Ipv4Net::new(a, range.len).ok())
        .find(free)
}

/// FLANNEL_SUBNET from a subnet.env (`10.244.5.1/24` -> `10.244.5.0/24`).
pub fn previous_subnet(subnet_env: &str) -> Option<Ipv4Net> {
    let line = subnet_env.lines().find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?;
    line.trim().parse::<Ipv4Net>().ok().map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(net: &str) -> NetConf {
        NetConf { network: net.parse().unwrap(), ..NetConf::default() }
    }

    #[test]
    fn keys_round_trip_like_flannel() {
        let n: Ipv4Net = "10.244.1.0/24".parse().unwrap();
        assert_eq!(subnet_key(n), "10.244.1.0-24");
        assert_eq!(parse_subnet_key("10.244.1.0-24"), Some(n));
        assert_eq!(parse_subnet_key("10.244.1.0-24&fd00:12:13::-56"), Some(n));
        assert_eq!(parse_subnet_key("10.244.1.5-24"), None);
        assert_eq!(parse_subnet_key("garbage"), None);
    }

    #[test]
    fn lease_value_matches_flannel_documentation() {
        let v = lease_value("192.168.64.3".parse().unwrap(), 1, "c6:d2:32:6f:8f:44".parse().unwrap());
        let want: Value = serde_json::from_str(r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&v).unwrap(), want);
        let l = parse_lease("10.244.3.0-24", &v).unwrap();
        assert_eq!(l.vtep_mac.unwrap().to_string(), "c6:d2:32:6f:8f:44");
    }

    #[test]
    fn only_the_leases_own_field_exempts_it_from_inner_source_binding() {
        let plain = lease_value("198.18.0.2".parse().unwrap(), 1, "02:00:00:00:00:02".parse().unwrap());
        let with = |field: Value| {
            let mut v: Value = serde_json::from_str(&plain).unwrap();
            v[ANY_INNER_SOURCE_FIELD] = field;
            v.to_string()
        };
        let leases = BTreeMap::from([
            ("10.244.2.0-24".to_string(), plain.clone()),
            ("10.244.3.0-24".to_string(), with(Value::Bool(true))),
            ("10.244.4.0-24".to_string(), with(Value::String("true".into()))),
        ]);
        let (peers, rejected, _) =
            peers(&leases, "10.244.0.0/16".parse().unwrap(), None, "198.18.0.1".parse().unwrap());
        assert!(rejected.is_empty(), "{rejected:?}");
        let exempt: Vec<bool> = peers.iter().map(|p| p.any_inner_source).collect();
        assert_eq!(exempt, [false, true, false]);
    }

    #[test]
    fn leases_become_peers_with_reasons_for_the_rest() {
        let good = lease_value("198.18.0.2".parse().unwrap(), 1, "02:00:00:00:00:02".parse().unwrap());
        let leases = BTreeMap::from([
            ("10.244.2.0-24".to_string(), good.clone()),
            ("10.244.1.0-24".to_string(), good.clone()),
            ("10.99.0.0-24".to_string(), good.clone()),
            ("10.244.4.0-24".to_string(), r#"{"PublicIP":"198.18.0.4","BackendType":"udp"}"#.to_string()),
            ("10.244.5.0-24".to_string(), "{".to_string()),
        ]);
        let (p, rejected, ignored) = peers(
            &leases,
            "10.244.0.0/16".parse().unwrap(),
            Some("10.244.1.0/24".parse().unwrap()),
            "198.18.0.1".parse().unwrap(),
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].node, "10.244.2.0-24");
        assert_eq!(rejected.len(), 2);
        assert_eq!(ignored.len(), 1);
    }

    #[test]
    fn leases_get_the_checks_nodes_get() {
        let mac: VtepMac = "02:00:00:00:00:02".parse().unwrap();
        let cases = [
            ("0.0.0.0", "not a unicast"),
            ("127.0.0.1", "loopback"),
            ("224.0.0.5", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("198.18.0.1", "own address"),
        ];
        let leases: BTreeMap<String, String> = cases
            .iter()
            .enumerate()
            .map(|(i, (ip, _))| (format!("10.244.{}.0-24", i + 10), lease_value(ip.parse().unwrap(), 1, mac)))
            .collect();
        let (p, rejected, _) = peers(&leases, "10.244.0.0/16".parse().unwrap(), None, "198.18.0.1".parse().unwrap());
        assert!(p.is_empty(), "{p:?}");
        for (i, (ip, reason)) in cases.iter().enumerate() {
            let key = format!("10.244.{}.0-24", i + 10);
            let r = rejected.iter().find(|r| r.node == key).unwrap_or_else(|| panic!("{ip} not rejected"));
            assert!(r.reason.contains(reason), "{ip}: {}", r.reason);
        }
    }

    #[test]
    fn subnet_len_outside_1_to_32_is_refused_not_truncated() {
        let net = conf("10.0.0.0/8");
        // 280 as u8 would be 24: a plausible length nobody asked for
        for bad in ["280", "33", "-1", "24.5", "\"24\""] {
            let e = subnet_range(&format!(r#"{{"SubnetLen":{bad}}}"#), &net).unwrap_err();
            assert!(e.contains("SubnetLen") && e.contains("1 to 32"), "{bad}: {e}");
        }
        assert_eq!(subnet_range(r#"{"SubnetLen":null}"#, &net).unwrap().len, 24);
        assert_eq!(subnet_range(r#"{"SubnetLen":0}"#, &net).unwrap().len, 24, "flannel's unset");
        assert_eq!(subnet_range(r#"{"SubnetLen":20}"#, &net).unwrap().len, 20);
        // in 1-32 but not within flannel's bounds: refused as before
        assert!(subnet_range(r#"{"SubnetLen":31}"#, &net).unwrap_err().contains("max 30"));
    }

    #[test]
    fn subnet_range_defaults_follow_flannel() {
        let r = subnet_range(r#"{"Network":"10.244.0.0/16"}"#, &conf("10.244.0.0/16")).unwrap();
        assert_eq!((r.len, r.min, r.max), (24, "10.244.1.0".parse().unwrap(), "10.244.255.0".parse().unwrap()));
        let r = subnet_range(r#"{"Network":"10.1.0.0/24"}"#, &conf("10.1.0.0/24")).unwrap();
        assert_eq!(r.len, 26);
        assert!(subnet_range(r#"{"SubnetMin":"10.244.1.7"}"#, &conf("10.244.0.0/16")).is_err());
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
        assert_eq!(
            previous_subnet("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.5.1/24\n"),
            Some("10.244.5.0/24".parse().unwrap())
        );
    }
}
