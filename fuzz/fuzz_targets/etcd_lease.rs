//! etcd lease records (`<prefix>/subnets/<a.b.c.d>-<len>[&<ipv6>-<len>]` =
//! flannel's JSON):
//! the input is the key, a newline, then the value. Never a panic; what
//! parses round-trips through the value flanneld writes, and a peer made
//! from it passes the checks Nodes get.
#![no_main]
use std::collections::BTreeMap;

use edgevx::{
    netconf::NetConf,
    source::{leases, peer_record},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (key, value) = text.split_once('\n').unwrap_or((text, ""));
    if let Some((net, net6)) = leases::parse_key(key) {
        assert_eq!(leases::parse_key(&leases::subnet_key(net, net6)), Some((net, net6)));
        assert_eq!(leases::parse_subnet_key(key), Some(net));
    }
    let Ok(lease) = leases::parse_lease(key, value, true) else { return };
    if let Some(mac) = lease.vtep_mac {
        let v6 = lease.v6.and_then(|v6| Some((v6.public_ip?, v6.vtep_mac?)));
        let again = leases::parse_lease(key, &leases::lease_value(lease.public_ip, 1, mac, v6), true);
        let pick = |l: leases::Lease| (l.subnet, l.public_ip, l.vtep_mac, l.v6.filter(|_| v6.is_some()));
        match again {
            Ok(again) => assert_eq!(pick(again), pick(lease.clone())),
            Err(e) => panic!("a lease written from a read one does not read back: {e}"),
        }
    }
    let own_ip = "198.18.0.1".parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
    let own_ip6 = "fd00:198:18::1".parse().ok();
    let network = NetConf::default().network;
    let all = BTreeMap::from([(key.to_string(), value.to_string())]);
    for network6 in [None, "fd00::/8".parse().ok()] {
        // the key's own lengths: a lease of another length than SubnetLen is refused before the rest is read
        let (subnet_len, subnet_len6) = (lease.subnet.prefix_len(), lease.v6.map(|v6| v6.subnet.prefix_len()));
        let reader = leases::Reader { network, network6, own: None, own_ip, own_ip6, subnet_len, subnet_len6 };
        let view = reader.peers(&all, &BTreeMap::new());
        assert_eq!(view.peers.len() + view.rejected.len() + view.ignored.len(), 1);
        assert!(view.partial.iter().all(|r| view.peers.iter().any(|p| p.node == r.node && p.v6.is_none())));
        for p in &view.peers {
            let v4 = p.v4.expect("etcd leases always have an IPv4 half");
            assert!(peer_record::check(v4.public_ip, v4.subnet, network, &[own_ip]).is_ok(), "{p:?}");
            match (p.v6, network6) {
                (Some(v6), Some(n6)) => {
                    let own6: Vec<_> = own_ip6.into_iter().collect();
                    assert!(peer_record::check(v6.public_ip, v6.subnet, n6, &own6).is_ok(), "{p:?}");
                }
                (Some(_), None) => panic!("an IPv6 half with IPv6 off: {p:?}"),
                (None, _) => {}
            }
        }
    }
});
