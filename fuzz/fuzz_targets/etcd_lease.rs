//! etcd lease records (`<prefix>/subnets/<a.b.c.d>-<len>` = flannel's JSON):
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
    if let Some(net) = leases::parse_subnet_key(key) {
        assert_eq!(leases::parse_subnet_key(&leases::subnet_key(net)), Some(net));
    }
    let Ok(lease) = leases::parse_lease(key, value) else { return };
    if let Some(mac) = lease.vtep_mac {
        let again = leases::parse_lease(key, &leases::lease_value(lease.public_ip, 1, mac));
        assert_eq!(again.map(|l| (l.subnet, l.public_ip, l.vtep_mac)), Ok((lease.subnet, lease.public_ip, Some(mac))));
    }
    let own_ip = "198.18.0.1".parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
    let network = NetConf::default().network;
    let all = BTreeMap::from([(key.to_string(), value.to_string())]);
    let (peers, rejected, ignored) = leases::peers(&all, network, None, own_ip);
    assert_eq!(peers.len() + rejected.len() + ignored.len(), 1);
    for p in &peers {
        assert!(peer_record::check(p.public_ip, p.subnet, network, &[own_ip]).is_ok(), "{p:?}");
    }
});
