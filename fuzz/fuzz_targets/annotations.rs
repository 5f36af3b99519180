//! Annotation names from `--kube-annotation-prefix` (flannel's derivation)
//! and a Node's annotation values under them: the first line of the input
//! is the prefix, the rest the annotations as JSON.
#![no_main]
use edgevx::{
    annotations::AnnotationNames,
    netconf::{Ipv6Conf, NetConf},
    source::{flannel_rules::NodeReader, peer_record},
};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (prefix, annotations) = text.split_once('\n').unwrap_or((text, "{}"));
    let Ok(names) = AnnotationNames::new(prefix) else { return };
    for name in [
        &names.subnet_manager,
        &names.backend_type,
        &names.backend_data,
        &names.public_ip,
        &names.public_ip_overwrite,
        &names.node_public_ip,
        &names.backend_v6_data,
        &names.public_ipv6,
        &names.public_ipv6_overwrite,
        &names.node_public_ipv6,
    ] {
        // a valid Kubernetes annotation key: one '/', lowercase DNS prefix
        assert_eq!(name.matches('/').count(), 1, "{name}");
        assert!(name.starts_with(prefix.trim_end_matches(['/', '-'])), "{name} from {prefix:?}");
    }
    let Ok(ann) = serde_json::from_str::<Value>(annotations) else { return };
    let node = |name: &str| {
        json!({"metadata": {"name": name, "annotations": ann},
            "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24", "fd00:10:244:2::/64"]}})
    };
    let dual =
        NetConf { ipv6: Some(Ipv6Conf::new("fd00:10:244::/56".parse().unwrap_or_default())), ..NetConf::default() };
    let v6_only = NetConf { ipv4: false, ..dual.clone() };
    for conf in [NetConf::default(), dual, v6_only] {
        let reader = NodeReader { names: names.clone(), own_name: "me".into(), conf };
        let d = reader.desired(&[node("me"), node("peer")]);
        assert_eq!(d.view.peers.len() + d.view.rejected.len() + d.view.ignored.len(), 1);
        assert!(d.view.partial.iter().all(|r| d.view.peers.iter().any(|p| p.node == r.node && p.v6.is_none())));
        assert_eq!(
            d.view.own.as_ref().is_some_and(|o| o.subnet6.is_some()),
            d.conf.ipv6.is_some() && d.view.own.is_some()
        );
        assert_eq!(d.view.own.as_ref().is_some_and(|o| o.subnet.is_some()), d.conf.ipv4 && d.view.own.is_some());
        for p in &d.view.peers {
            match p.v4 {
                Some(v4) => {
                    assert!(d.conf.ipv4, "an IPv4 half in an IPv6-only network: {p:?}");
                    assert!(peer_record::check(v4.public_ip, v4.subnet, d.conf.network, &[]).is_ok(), "{p:?}");
                }
                // IPv6-only: the IPv6 half is the whole peer
                None => assert!(!d.conf.ipv4 && p.v6.is_some(), "{p:?}"),
            }
            match (&p.v6, &d.conf.ipv6) {
                (Some(v6), Some(c6)) => {
                    assert!(peer_record::check(v6.public_ip, v6.subnet, c6.network, &[]).is_ok(), "{p:?}")
                }
                (None, None) => {}
                // dual-stack: a peer without its IPv6 half is one `partial` names
                (None, Some(_)) if d.view.partial.iter().any(|r| r.node == p.node) => {}
                _ => panic!("the IPv6 half does not follow EnableIPv6: {p:?}"),
            }
        }
    }
});
