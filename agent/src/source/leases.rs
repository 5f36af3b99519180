//! flannel's etcd layout, as pure functions: subnet keys, lease values, and
//! the peers the leases make (flannel pkg/subnet/subnet.go,
//! pkg/lease/lease.go). The subnet range and allocation: subnet_range.rs.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;
use serde_json::Value;

use super::peer_record::{self, RecordProblem};
use crate::{
    family::Family,
    mac::{MacError, VtepMac},
    peer::{ClusterView, Half, Peer, Rejection},
};

/// flannel's `MakeSubnetKey`: `10.244.1.0/24` -> `10.244.1.0-24`, and in
/// dual-stack `10.244.1.0-24&fd00:10:244:1::-64` (the IPv6 part as Go's
/// `net.IP.String` writes it: lowercase, compressed).
pub fn subnet_key(net: Ipv4Net, net6: Option<Ipv6Net>) -> String {
    match net6 {
        None => format!("{}-{}", net.network(), net.prefix_len()),
        Some(n6) => format!("{}-{}&{}-{}", net.network(), net.prefix_len(), n6.network(), n6.prefix_len()),
    }
}

/// Both halves of a subnet key; `None` unless it is one flannel's
/// `subnetRegex` reads (the IPv6 part in lowercase hex) with no host bits.
pub fn parse_key(key: &str) -> Option<(Ipv4Net, Option<Ipv6Net>)> {
    let (v4, v6) = match key.split_once('&') {
        Some((v4, v6)) => (v4, Some(v6)),
        None => (key, None),
    };
    let (ip, len) = v4.rsplit_once('-')?;
    let net = Ipv4Net::new(ip.parse().ok()?, len.parse().ok()?).ok()?;
    if net.trunc() != net {
        return None;
    }
    let net6 = match v6 {
        None => None,
        Some(v6) => {
            let (ip, len) = v6.rsplit_once('-')?;
            if !ip.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b':') {
                return None;
            }
            let n6 = Ipv6Net::new(ip.parse().ok()?, len.parse().ok()?).ok()?;
            if n6.trunc() != n6 {
                return None;
            }
            Some(n6)
        }
    };
    Some((net, net6))
}

/// The IPv4 half of a subnet key.
pub fn parse_subnet_key(key: &str) -> Option<Ipv4Net> {
    parse_key(key).map(|(net, _)| net)
}

/// flannel's vxlan `BackendData` (and `BackendV6Data`).
#[derive(Serialize)]
struct BackendData {
    #[serde(rename = "VNI")]
    vni: u32,
    #[serde(rename = "VtepMAC")]
    vtep_mac: String,
}

/// `lease.LeaseAttrs` as Go's `json.Marshal` writes it: fields in declaration
/// order, `PublicIPv6` without omitempty, `BackendV6Data` with it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct LeaseAttrs {
    #[serde(rename = "PublicIP")]
    public_ip: String,
    #[serde(rename = "PublicIPv6")]
    public_ipv6: Option<String>,
    backend_type: &'static str,
    backend_data: BackendData,
    #[serde(rename = "BackendV6Data", skip_serializing_if = "Option::is_none")]
    backend_v6_data: Option<BackendData>,
}

/// A lease value as flanneld writes it; `v6` is our public IPv6 and the
/// MAC of our IPv6 VTEP in dual-stack.
pub fn lease_value(public_ip: Ipv4Addr, vni: u32, mac: VtepMac, v6: Option<(Ipv6Addr, VtepMac)>) -> String {
    let attrs = LeaseAttrs {
        public_ip: public_ip.to_string(),
        public_ipv6: v6.map(|(ip, _)| ip.to_string()),
        backend_type: "vxlan",
        backend_data: BackendData { vni, vtep_mac: mac.to_string() },
        backend_v6_data: v6.map(|(_, mac6)| BackendData { vni, vtep_mac: mac6.to_string() }),
    };
    // plain strings and numbers: serializing cannot fail
    serde_json::to_string(&attrs).unwrap_or_default()
}

/// What one lease says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub subnet: Ipv4Net,
    pub public_ip: Ipv4Addr,
    pub backend_type: String,
    pub vtep_mac: Option<VtepMac>,
    /// The IPv6 half, read only when asked for (dual-stack).
    pub v6: Option<LeaseHalf<Ipv6Net>>,
}

/// One family's half of a lease, each part as far as the lease has it
/// (a part is required only when the half is taken, [`Reader::peers`]): in
/// dual-stack the IPv6 half, the key's `&<v6>` part, `PublicIPv6` and
/// `BackendV6Data.VtepMAC`. The IPv4 half is not one: flannel's lease
/// carries it at the top (`PublicIP`, `BackendData`), and a lease without
/// it is no lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseHalf<N: Family> {
    pub subnet: N,
    pub public_ip: Option<N::Addr>,
    pub vtep_mac: Option<VtepMac>,
}

/// Why a lease is not a peer: the rejection's reason in the view.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("key {0:?} is not <a.b.c.d>-<len> or <a.b.c.d>-<len>&<ipv6>-<len>")]
    BadKey(String),
    #[error("lease is not JSON ({0})")]
    NotJson(serde_json::Error),
    #[error("lease has no PublicIP")]
    NoPublicIp,
    #[error("bad {0} {1:?}")]
    BadAddress(&'static str, String),
    #[error("{0} is not a string: {1}")]
    NotAString(&'static str, Value),
    #[error("bad {0}: {1}")]
    BadMac(&'static str, MacError),
    #[error("lease has no BackendData.VtepMAC")]
    NoVtepMac,
    #[error("lease has an IPv6 subnet but no {0}")]
    Ipv6HalfLacks(&'static str),
    /// flannel's own rule for its lease (`isSubnetConfigCompat`,
    /// pkg/subnet/etcd/local_manager.go): every lease is a `SubnetLen`
    /// block. A wider one would take a neighbour's addresses.
    #[error(
        "{what} {subnet} is a /{len}, but the network config's {field} is {want}: every lease is a /{want} \
         (a wider one would cover another node's subnet). Refused; delete the key or fix the subnet manager"
    )]
    PrefixLen { what: &'static str, subnet: ipnet::IpNet, len: u8, field: &'static str, want: u8 },
    #[error(transparent)]
    Record(#[from] RecordProblem),
}

/// The VtepMAC at `pointer`; `name` says which in errors.
fn mac_at(v: &Value, pointer: &str, name: &'static str) -> Result<Option<VtepMac>, LeaseError> {
    match v.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(m)) => m.parse().map(Some).map_err(|e| LeaseError::BadMac(name, e)),
        Some(other) => Err(LeaseError::NotAString(name, other.clone())),
    }
}

/// Reads a lease; with `ipv6` its IPv6 half too (a key without one gives
/// `v6: None`, as flannel's etcd registry handles each family apart).
pub fn parse_lease(key: &str, value: &str, ipv6: bool) -> Result<Lease, LeaseError> {
    let (subnet, subnet6) = parse_key(key).ok_or_else(|| LeaseError::BadKey(key.to_string()))?;
    let v: Value = serde_json::from_str(value).map_err(LeaseError::NotJson)?;
    let ip = v.get("PublicIP").and_then(Value::as_str).ok_or(LeaseError::NoPublicIp)?;
    let public_ip: Ipv4Addr = ip.parse().map_err(|_| LeaseError::BadAddress("PublicIP", ip.to_string()))?;
    let backend_type = v.get("BackendType").and_then(Value::as_str).unwrap_or("").to_string();
    let vtep_mac = mac_at(&v, "/BackendData/VtepMAC", "VtepMAC")?;
    let v6 = match subnet6.filter(|_| ipv6) {
        None => None,
        Some(subnet) => {
            let public_ip = match v.get("PublicIPv6") {
                None | Some(Value::Null) => None,
                Some(Value::String(ip)) => {
                    Some(ip.parse().map_err(|_| LeaseError::BadAddress("PublicIPv6", ip.to_string()))?)
                }
                Some(other) => return Err(LeaseError::NotAString("PublicIPv6", other.clone())),
            };
            Some(LeaseHalf {
                subnet,
                public_ip,
                vtep_mac: mac_at(&v, "/BackendV6Data/VtepMAC", "BackendV6Data.VtepMAC")?,
            })
        }
    };
    Ok(Lease { subnet, public_ip, backend_type, vtep_mac, v6 })
}

/// Who reads the leases: the network config and this node's own lease
/// and addresses (no other lease may claim them).
#[derive(Clone, Copy, Debug)]
pub struct Reader {
    pub network: Ipv4Net,
    /// `IPv6Network` in dual-stack.
    pub network6: Option<Ipv6Net>,
    /// Our own lease's IPv4 subnet, skipped.
    pub own: Option<Ipv4Net>,
    pub own_ip: Ipv4Addr,
    pub own_ip6: Option<Ipv6Addr>,
    /// `SubnetLen`: a lease of another length is refused.
    pub subnet_len: u8,
    /// `IPv6SubnetLen` (its default applied) in dual-stack.
    pub subnet_len6: Option<u8>,
}

impl Reader {
    /// Turns leases into peers with flannel's rules; `own` is skipped, and a
    /// lease gets the same checks as a Node ([`peer_record::check`]). In
    /// dual-stack a lease with an IPv6 subnet must have its IPv6 half whole
    /// and parsing, or it is rejected (flannel's `handleSubnetEvents` skips
    /// it before programming either family); a half that parses but no IPv6
    /// VTEP can be is left out alone ([`peer_record::checked_half`]), and
    /// a lease without one stays an IPv4 peer. A lease of a prefix length
    /// other than `SubnetLen` (`IPv6SubnetLen`) is rejected, named by its
    /// key. `created` gives each key's create revision: when it appeared.
    /// A lease asking to be exempt from the inner-source check
    /// ([`ANY_INNER_SOURCE_FIELD`]) is listed in `self_exempt` and is not.
    /// The view's `own` is unset.
    pub fn peers(&self, leases: &BTreeMap<String, String>, created: &BTreeMap<String, i64>) -> ClusterView {
        let mut view = ClusterView::default();
        for (key, value) in leases {
            if lease_asks_any_inner_source(value) {
                view.self_exempt.push(Rejection {
                    node: key.clone(),
                    reason: format!(
                        "its own field {ANY_INNER_SOURCE_FIELD} is ignored: a lease cannot exempt itself from the \
                         inner-source check. If it is an external VTEP that forwards without SNAT, name it with \
                         --any-inner-source=<its subnet> on each edgevx node"
                    ),
                });
            }
            let reject = |reason: String| Rejection { node: key.clone(), reason };
            match parse_lease(key, value, self.network6.is_some()) {
                Err(reason) => view.rejected.push(reject(reason.to_string())),
                Ok(l) if Some(l.subnet) == self.own => {}
                Ok(l) if l.backend_type != "vxlan" => {
                    view.ignored.push(reject(format!("backend type {:?} is not \"vxlan\"", l.backend_type)))
                }
                Ok(l) => match self.peer(key, l) {
                    Ok((mut p, partial)) => {
                        p.appeared = created.get(key).copied();
                        view.partial.extend(partial.map(reject));
                        view.peers.push(p)
                    }
                    Err(reason) => view.rejected.push(reject(reason.to_string())),
                },
            }
        }
        view
    }

    /// A lease's peer, and why its IPv6 half was left out, if it was.
    fn peer(&self, key: &str, l: Lease) -> Result<(Peer, Option<String>), LeaseError> {
        if l.subnet.prefix_len() != self.subnet_len {
            let (what, field, len) = ("subnet", "SubnetLen", l.subnet.prefix_len());
            return Err(LeaseError::PrefixLen { what, subnet: l.subnet.into(), len, field, want: self.subnet_len });
        }
        if let (Some(v6), Some(want)) = (l.v6, self.subnet_len6.filter(|_| self.network6.is_some()))
            && v6.subnet.prefix_len() != want
        {
            let (what, field, len) = ("IPv6 subnet", "IPv6SubnetLen", v6.subnet.prefix_len());
            return Err(LeaseError::PrefixLen { what, subnet: v6.subnet.into(), len, field, want });
        }
        peer_record::check(l.public_ip, l.subnet, self.network, &[self.own_ip])?;
        let vtep_mac = l.vtep_mac.ok_or(LeaseError::NoVtepMac)?;
        let (v6, partial) = match (l.v6, self.network6) {
            (Some(v6), Some(network6)) => {
                let public_ip = v6.public_ip.ok_or(LeaseError::Ipv6HalfLacks("PublicIPv6"))?;
                let mac = v6.vtep_mac.ok_or(LeaseError::Ipv6HalfLacks("BackendV6Data.VtepMAC"))?;
                let own6: Vec<Ipv6Addr> = self.own_ip6.into_iter().collect();
                match peer_record::checked_half(Half { subnet: v6.subnet, public_ip, vtep_mac: mac }, network6, &own6) {
                    Ok(v6) => (Some(v6), None),
                    Err(why) => (None, Some(why.to_string())),
                }
            }
            _ => (None, None),
        };
        // the exemption is the operator's (`--any-inner-source`), never the lease's own
        let v4 = Some(Half { subnet: l.subnet, public_ip: l.public_ip, vtep_mac });
        let peer = Peer { node: key.to_string(), v4, any_inner_source: false, appeared: None, v6 };
        Ok((peer, partial))
    }
}

/// edgevx's former field in a lease value (flanneld never writes it):
/// `true` once let the lease's VTEP send any inner source. A lease cannot
/// exempt itself: the field is ignored, with a warning, and the operator
/// names such a VTEP with `--any-inner-source`.
pub const ANY_INNER_SOURCE_FIELD: &str = "EdgevxAnyInnerSource";

fn lease_asks_any_inner_source(value: &str) -> bool {
    serde_json::from_str::<Value>(value).is_ok_and(|v| v.get(ANY_INNER_SOURCE_FIELD).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 198.18.0.1 / fd00:198:18::1 in 10.244.0.0/16, IPv4 only.
    fn reader(own: Option<&str>) -> Reader {
        Reader {
            network: "10.244.0.0/16".parse().unwrap(),
            network6: None,
            own: own.map(|o| o.parse().unwrap()),
            own_ip: "198.18.0.1".parse().unwrap(),
            own_ip6: None,
            subnet_len: 24,
            subnet_len6: None,
        }
    }

    /// The same node in dual-stack, fd00:10:244::/56.
    fn dual_stack_reader() -> Reader {
        Reader {
            network6: Some("fd00:10:244::/56".parse().unwrap()),
            own_ip6: Some("fd00:198:18::1".parse().unwrap()),
            subnet_len6: Some(64),
            ..reader(Some("10.244.1.0/24"))
        }
    }

    fn mac(last: u8) -> VtepMac {
        format!("02:00:00:00:00:{last:02x}").parse().unwrap()
    }

    #[test]
    fn keys_round_trip_like_flannel() {
        let n: Ipv4Net = "10.244.1.0/24".parse().unwrap();
        assert_eq!(subnet_key(n, None), "10.244.1.0-24");
        assert_eq!(parse_subnet_key("10.244.1.0-24"), Some(n));
        assert_eq!(parse_subnet_key("10.244.1.0-24&fd00:12:13::-56"), Some(n));
        assert_eq!(parse_subnet_key("10.244.1.5-24"), None);
        assert_eq!(parse_subnet_key("garbage"), None);
    }

    #[test]
    fn lease_value_matches_flannel_documentation() {
        let v = lease_value("192.168.64.3".parse().unwrap(), 1, "c6:d2:32:6f:8f:44".parse().unwrap(), None);
        let want: Value = serde_json::from_str(r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&v).unwrap(), want);
        let l = parse_lease("10.244.3.0-24", &v, false).unwrap();
        assert_eq!(l.vtep_mac.unwrap().to_string(), "c6:d2:32:6f:8f:44");
    }

    #[test]
    fn a_leases_own_field_exempts_nothing_and_is_named() {
        let plain = lease_value("198.18.0.2".parse().unwrap(), 1, "02:00:00:00:00:02".parse().unwrap(), None);
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
        let created = BTreeMap::from([("10.244.3.0-24".to_string(), 7)]);
        let ClusterView { peers, rejected, self_exempt, .. } = reader(None).peers(&leases, &created);
        assert!(rejected.is_empty(), "{rejected:?}");
        assert!(peers.iter().all(|p| !p.any_inner_source), "{peers:?}");
        assert_eq!(peers.iter().map(|p| p.appeared).collect::<Vec<_>>(), [None, Some(7), None]);
        let named: Vec<&str> = self_exempt.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(named, ["10.244.3.0-24", "10.244.4.0-24"]);
        assert!(self_exempt[0].reason.contains("--any-inner-source"), "{}", self_exempt[0].reason);
    }

    #[test]
    fn a_lease_of_another_prefix_length_than_subnet_len_is_refused_by_name() {
        let good = lease_value("198.18.0.2".parse().unwrap(), 1, "02:00:00:00:00:02".parse().unwrap(), None);
        let wide = lease_value("198.18.0.3".parse().unwrap(), 1, "02:00:00:00:00:03".parse().unwrap(), None);
        let leases = BTreeMap::from([
            ("10.244.2.0-23".to_string(), wide.clone()),
            ("10.244.2.0-24".to_string(), good.clone()),
            ("10.244.4.0-25".to_string(), wide),
        ]);
        let ClusterView { peers, rejected, .. } = reader(None).peers(&leases, &BTreeMap::new());
        assert_eq!(peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["10.244.2.0-24"]);
        let said: Vec<(&str, &str)> = rejected.iter().map(|r| (r.node.as_str(), r.reason.as_str())).collect();
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(said[0].0, "10.244.2.0-23");
        assert!(said[0].1.starts_with("subnet 10.244.2.0/23 is a /23, but the network config's SubnetLen is 24"));
        assert_eq!(said[1].0, "10.244.4.0-25");
        // the IPv6 half by IPv6SubnetLen
        let v6 = |ip: &str| lease_value("198.18.0.5".parse().unwrap(), 1, mac(5), Some((ip.parse().unwrap(), mac(6))));
        let leases = BTreeMap::from([
            ("10.244.5.0-24&fd00:10:244:4::-63".to_string(), v6("fd00:198:18::5")),
            ("10.244.6.0-24&fd00:10:244:6::-64".to_string(), v6("fd00:198:18::6")),
        ]);
        let ClusterView { peers, rejected, .. } = dual_stack_reader().peers(&leases, &BTreeMap::new());
        assert_eq!(peers.len(), 1);
        assert!(rejected[0].reason.contains("IPv6SubnetLen is 64"), "{rejected:?}");
    }

    #[test]
    fn leases_become_peers_with_reasons_for_the_rest() {
        let good = lease_value("198.18.0.2".parse().unwrap(), 1, "02:00:00:00:00:02".parse().unwrap(), None);
        let leases = BTreeMap::from([
            ("10.244.2.0-24".to_string(), good.clone()),
            ("10.244.1.0-24".to_string(), good.clone()),
            ("10.99.0.0-24".to_string(), good.clone()),
            ("10.244.4.0-24".to_string(), r#"{"PublicIP":"198.18.0.4","BackendType":"udp"}"#.to_string()),
            ("10.244.5.0-24".to_string(), "{".to_string()),
        ]);
        let ClusterView { peers: p, rejected, ignored, .. } =
            reader(Some("10.244.1.0/24")).peers(&leases, &BTreeMap::new());
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
            .map(|(i, (ip, _))| (format!("10.244.{}.0-24", i + 10), lease_value(ip.parse().unwrap(), 1, mac, None)))
            .collect();
        let ClusterView { peers: p, rejected, .. } = reader(None).peers(&leases, &BTreeMap::new());
        assert!(p.is_empty(), "{p:?}");
        for (i, (ip, reason)) in cases.iter().enumerate() {
            let key = format!("10.244.{}.0-24", i + 10);
            let r = rejected.iter().find(|r| r.node == key).unwrap_or_else(|| panic!("{ip} not rejected"));
            assert!(r.reason.contains(reason), "{ip}: {}", r.reason);
        }
    }

    #[test]
    fn dual_stack_keys_are_flannels_make_subnet_key() {
        let (n, n6): (Ipv4Net, Ipv6Net) = ("10.244.1.0/24".parse().unwrap(), "fd00:10:244:1::/64".parse().unwrap());
        assert_eq!(subnet_key(n, Some(n6)), "10.244.1.0-24&fd00:10:244:1::-64");
        assert_eq!(parse_key("10.244.1.0-24&fd00:10:244:1::-64"), Some((n, Some(n6))));
        assert_eq!(parse_key("10.244.1.0-24"), Some((n, None)));
        // flannel's subnetRegex takes lowercase hex only; no host bits, no junk
        for bad in [
            "10.244.1.0-24&FD00:10:244:1::-64",
            "10.244.1.0-24&fd00:10:244:1::1-64",
            "10.244.1.0-24&",
            "10.244.1.0-24&x-64",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
            assert_eq!(parse_subnet_key(bad), None, "{bad}");
        }
        let long: Ipv6Net = "2001:db8:0:0:0:1::/96".parse().unwrap();
        assert_eq!(subnet_key(n, Some(long)), "10.244.1.0-24&2001:db8::1:0:0-96", "RFC 5952, as Go prints it");
    }

    #[test]
    fn dual_stack_lease_value_is_flannels_json_byte_for_byte() {
        let v =
            lease_value("192.0.2.10".parse().unwrap(), 1, mac(0xa), Some(("2001:db8::10".parse().unwrap(), mac(0xb))));
        assert_eq!(
            v,
            r#"{"PublicIP":"192.0.2.10","PublicIPv6":"2001:db8::10","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:00:0a"},"BackendV6Data":{"VNI":1,"VtepMAC":"02:00:00:00:00:0b"}}"#
        );
        assert_eq!(
            lease_value("192.0.2.10".parse().unwrap(), 7, mac(0xa), None),
            r#"{"PublicIP":"192.0.2.10","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":7,"VtepMAC":"02:00:00:00:00:0a"}}"#
        );
        let l = parse_lease("10.244.3.0-24&fd00:10:244:3::-64", &v, true).unwrap();
        let want = LeaseHalf {
            subnet: "fd00:10:244:3::/64".parse().unwrap(),
            public_ip: Some("2001:db8::10".parse().unwrap()),
            vtep_mac: Some(mac(0xb)),
        };
        assert_eq!(l.v6, Some(want));
        assert_eq!(parse_lease("10.244.3.0-24&fd00:10:244:3::-64", &v, false).unwrap().v6, None, "IPv6 off");
    }

    #[test]
    fn dual_stack_leases_become_peers_per_family() {
        let v6 = |n: u8| Some((format!("fd00:198:18::{n}").parse().unwrap(), mac(0x60 + n)));
        let value = |n: u8, with6: bool| {
            lease_value(format!("198.18.0.{n}").parse().unwrap(), 1, mac(n), if with6 { v6(n) } else { None })
        };
        let leases = BTreeMap::from([
            ("10.244.2.0-24&fd00:10:244:2::-64".to_string(), value(2, true)),
            // an older, IPv4-only node: still an IPv4 peer, as in flannel's etcd mode
            ("10.244.3.0-24".to_string(), value(3, false)),
        ]);
        let ClusterView { peers: p, rejected, .. } = dual_stack_reader().peers(&leases, &BTreeMap::new());
        assert!(rejected.is_empty(), "{rejected:?}");
        assert_eq!(
            p[0].v6,
            Some(Half {
                subnet: "fd00:10:244:2::/64".parse().unwrap(),
                public_ip: "fd00:198:18::2".parse().unwrap(),
                vtep_mac: mac(0x62)
            })
        );
        assert_eq!((p[1].node.as_str(), p[1].v6), ("10.244.3.0-24", None));
        // with IPv6 off the IPv6 half is not read at all
        let p = reader(None).peers(&leases, &BTreeMap::new()).peers;
        assert!(p.iter().all(|p| p.v6.is_none()) && p.len() == 2);
    }

    #[test]
    fn a_broken_ipv6_half_rejects_the_lease_and_an_unusable_one_only_the_half() {
        let good =
            lease_value("198.18.0.2".parse().unwrap(), 1, mac(2), Some(("fd00:198:18::2".parse().unwrap(), mac(0x62))));
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut v: Value = serde_json::from_str(&good).unwrap();
            f(&mut v);
            v.to_string()
        };
        // missing or not parsing: rejected whole
        let whole = [
            ("10.244.2.0-24&fd00:10:244:2::-64", edit(&|v| v["PublicIPv6"] = Value::Null), "no PublicIPv6"),
            ("10.244.3.0-24&fd00:10:244:3::-64", edit(&|v| v["PublicIPv6"] = "nope".into()), "bad PublicIPv6"),
            (
                "10.244.4.0-24&fd00:10:244:4::-64",
                edit(&|v| {
                    v.as_object_mut().unwrap().remove("BackendV6Data");
                }),
                "no BackendV6Data.VtepMAC",
            ),
            (
                "10.244.5.0-24&fd00:10:244:5::-64",
                edit(&|v| v["BackendV6Data"]["VtepMAC"] = "zz".into()),
                "bad BackendV6Data.VtepMAC",
            ),
        ];
        // well formed, but no IPv6 VTEP can be it: an IPv4 peer, the half left out
        let half = [
            ("10.244.6.0-24&fd00:99:6::-64", good.clone(), "outside the network fd00:10:244::/56"),
            ("10.244.7.0-24&fd00:10:244:7::-64", edit(&|v| v["PublicIPv6"] = "fe80::7".into()), "link-local"),
            ("10.244.8.0-24&fd00:10:244:8::-64", edit(&|v| v["PublicIPv6"] = "fd00:198:18::1".into()), "own address"),
        ];
        let leases: BTreeMap<String, String> =
            whole.iter().chain(&half).map(|(k, v, _)| (k.to_string(), v.clone())).collect();
        let view = dual_stack_reader().peers(&leases, &BTreeMap::new());
        let peers: Vec<(&str, bool)> = view.peers.iter().map(|p| (p.node.as_str(), p.v6.is_some())).collect();
        assert_eq!(peers, half.iter().map(|(k, _, _)| (*k, false)).collect::<Vec<_>>());
        for (list, cases) in [(&view.rejected, &whole[..]), (&view.partial, &half[..])] {
            assert_eq!(list.len(), cases.len(), "{list:?}");
            for (key, _, reason) in cases {
                let r = list.iter().find(|r| r.node == *key).unwrap_or_else(|| panic!("{key} not listed"));
                assert!(r.reason.contains(reason), "{key}: {}", r.reason);
            }
        }
    }
}
