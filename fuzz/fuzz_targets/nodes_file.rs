//! The nodes file (JSON or YAML NodeList) read with flannel's rules: never
//! a panic, every node accounted for once, and every peer one that the
//! checks shared with etcd leases accept.
#![no_main]
use edgevx::{
    annotations::{AnnotationNames, DEFAULT_PREFIX},
    netconf::NetConf,
    source::{NodeReader, nodes_file, peer_record},
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(nodes) = nodes_file::parse(text, "fuzz.json") else { return };
    let Ok(names) = AnnotationNames::new(DEFAULT_PREFIX) else { return };
    let reader = NodeReader { names, own_name: "node1".into(), conf: NetConf::default() };
    let d = reader.desired(&nodes);
    let v = &d.view;
    let own = nodes.iter().filter(|n| n.pointer("/metadata/name").and_then(Value::as_str) == Some("node1")).count();
    assert_eq!(v.peers.len() + v.rejected.len() + v.ignored.len() + own, nodes.len(), "a node lost or counted twice");
    assert_eq!(v.own.is_some(), v.own_problem.is_none());
    for p in &v.peers {
        assert!(peer_record::check(p.public_ip, p.subnet, d.conf.network, &[]).is_ok(), "{p:?}");
        assert_eq!(p.subnet.trunc(), p.subnet, "{p:?}");
    }
});
