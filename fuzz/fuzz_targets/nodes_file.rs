//! The nodes file (JSON or YAML NodeList) read with flannel's rules: never
//! a panic, every node accounted for once, and every peer one that the
//! checks shared with etcd leases accept.
#![no_main]
use edgevx::{
    annotations::{AnnotationNames, DEFAULT_PREFIX},
    netconf::{Ipv6Conf, NetConf},
    source::{flannel_rules::NodeReader, nodes_file, peer_record},
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(nodes) = nodes_file::parse(text, "fuzz.json") else { return };
    let Ok(names) = AnnotationNames::new(DEFAULT_PREFIX) else { return };
    let dual =
        NetConf { ipv6: Some(Ipv6Conf::new("fd00:10:244::/56".parse().unwrap_or_default())), ..NetConf::default() };
    let v6_only = NetConf { ipv4: false, ..dual.clone() };
    for conf in [NetConf::default(), dual, v6_only] {
        let reader = NodeReader { names: names.clone(), own_name: "node1".into(), conf };
        let d = reader.desired(&nodes);
        let v = &d.view;
        let own = nodes.iter().filter(|n| n.pointer("/metadata/name").and_then(Value::as_str) == Some("node1")).count();
        assert_eq!(
            v.peers.len() + v.rejected.len() + v.ignored.len() + own,
            nodes.len(),
            "a node lost or counted twice"
        );
        assert_eq!(v.own.is_some(), v.own_problem.is_none());
        // dual-stack: each peer without its IPv6 half has its entry in `partial`
        // (counted, not matched by name: a list may name a node twice)
        let halves = v.peers.iter().filter(|p| p.v6.is_none()).count();
        assert_eq!(if d.conf.ipv6.is_some() { halves } else { 0 }, v.partial.len(), "{v:?}");
        assert!(v.partial.iter().all(|r| v.peers.iter().any(|p| p.node == r.node && p.v6.is_none())), "{v:?}");
        for p in &v.peers {
            match p.v4 {
                Some(v4) => {
                    assert!(d.conf.ipv4, "an IPv4 half in an IPv6-only network: {p:?}");
                    assert!(peer_record::check(v4.public_ip, v4.subnet, d.conf.network, &[]).is_ok(), "{p:?}");
                    assert_eq!(v4.subnet.trunc(), v4.subnet, "{p:?}");
                }
                None => assert!(!d.conf.ipv4 && p.v6.is_some(), "a peer without an IPv4 half: {p:?}"),
            }
            assert!(p.v6.is_none() || d.conf.ipv6.is_some(), "an IPv6 half with IPv6 off: {p:?}");
            if let (Some(v6), Some(c6)) = (&p.v6, &d.conf.ipv6) {
                assert!(peer_record::check(v6.public_ip, v6.subnet, c6.network, &[]).is_ok(), "{p:?}");
                assert_eq!(v6.subnet.trunc(), v6.subnet, "{p:?}");
            }
        }
    }
});
