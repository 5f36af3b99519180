//! flannel's rules for reading Node objects (pkg/subnet/kube/kube.go,
//! pkg/backend/vxlan): which nodes are peers, and what each peer is. Each
//! family's half of a Node is read once for both (`node_half.rs`).
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::Value;

use super::{
    node_error::{NodeError, parse_ip},
    node_half::{NodeFamily, annotations, checked, half, pod_cidr, vtep_mac},
    peer_record::checked_half,
};
use crate::{
    annotations::{ANY_INNER_SOURCE, AnnotationNames},
    netconf::NetConf,
    peer::{ClusterView, Desired, OwnNode, Peer, Rejection},
};

/// Reads Node objects (from a file or the API) with flannel's rules.
#[derive(Clone)]
pub struct NodeReader {
    pub names: AnnotationNames,
    pub own_name: String,
    pub conf: NetConf,
}

impl NodeReader {
    pub fn desired(&self, nodes: &[Value]) -> Desired {
        let rules = Rules {
            names: &self.names,
            own_name: &self.own_name,
            network: self.conf.ipv4.then_some(self.conf.network),
            network6: self.conf.ipv6.as_ref().map(|v6| v6.network),
        };
        Desired { conf: self.conf.clone(), view: rules.view(nodes) }
    }
}

/// How to read a node list for one agent.
pub struct Rules<'a> {
    pub names: &'a AnnotationNames,
    pub own_name: &'a str,
    /// `Network`; `None` in an IPv6-only network (`EnableIPv4: false`),
    /// which ignores every IPv4 annotation and pod CIDR.
    pub network: Option<Ipv4Net>,
    /// `IPv6Network` when IPv6 is on; `None` ignores every IPv6 annotation
    /// and pod CIDR.
    pub network6: Option<Ipv6Net>,
}

enum Verdict {
    /// A peer, and why its IPv6 half was left out, if it was.
    Peer(Peer, Option<String>),
    Ignored(String),
}

/// This node's addresses as its own Node publishes them: no peer may claim one.
#[derive(Default)]
struct OwnIps {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
}

impl Rules<'_> {
    fn peer(&self, name: &str, node: &Value, own_ips: &OwnIps) -> Result<Verdict, NodeError> {
        let ann = annotations(node)?;
        let n = self.names;
        if ann.get(&n.subnet_manager) != Some("true") {
            return Ok(Verdict::Ignored(format!("{} is not \"true\"", n.subnet_manager)));
        }
        match ann.get(&n.backend_type) {
            Some("vxlan") => {}
            other => {
                return Ok(Verdict::Ignored(format!("backend type {other:?} is not \"vxlan\"")));
            }
        }
        // IPv6-only: flannel's nodeToLease reads no IPv4 annotation or pod CIDR
        let v4 = match self.network {
            Some(network) => Some(checked(half::<Ipv4Net>(n, &ann, node)?, network, &own_ips.v4)?),
            None => None,
        };
        // the exemption is the operator's (`--any-inner-source`), never the node's own
        let (any_inner_source, appeared) = (false, super::appeared::node_appeared(node));
        let Some(network6) = self.network6 else {
            return Ok(Verdict::Peer(Peer { node: name.to_string(), v4, any_inner_source, appeared, v6: None }, None));
        };
        let half6 = half::<Ipv6Net>(n, &ann, node)?;
        let (v6, partial) = match v4 {
            // dual-stack: flannel skips a node without its IPv6 half whole (nodeToLease,
            // handleSubnetEvents), so kernel flannel nodes never program its IPv4 half either;
            // a half that parses but no IPv6 VTEP can be is left out alone
            Some(_) => match checked_half(half6, network6, &own_ips.v6) {
                Ok(v6) => (Some(v6), None),
                Err(why) => (None, Some(format!("{}: {why}", Ipv6Net::PARTS))),
            },
            // IPv6-only: that half is the whole peer
            None => (Some(checked(half6, network6, &own_ips.v6)?), None),
        };
        Ok(Verdict::Peer(Peer { node: name.to_string(), v4, any_inner_source, appeared, v6 }, partial))
    }

    fn own(&self, node: &Value) -> Result<OwnNode, NodeError> {
        let ann = annotations(node)?;
        let mut own = OwnNode {
            subnet: None,
            published_mac: None,
            node_public_ip: None,
            subnet6: None,
            published_mac6: None,
            node_public_ipv6: None,
        };
        if let Some(network) = self.network {
            let subnet = pod_cidr::<Ipv4Net>(node)?;
            if !network.contains(&subnet) {
                return Err(NodeError::OutsideNetwork { subnet, network });
            }
            own.subnet = Some(subnet);
            own.published_mac = ann.get(&self.names.backend_data).and_then(|d| vtep_mac(Ipv4Net::BACKEND_DATA, d).ok());
            own.node_public_ip = match ann.get(&self.names.node_public_ip) {
                Some(ip) => Some(parse_ip::<Ipv4Net>("node-public-ip", ip)?),
                None => None,
            };
        }
        if let Some(network6) = self.network6 {
            let subnet6 = pod_cidr::<Ipv6Net>(node)?;
            if !network6.contains(&subnet6) {
                return Err(NodeError::Ipv6OutsideNetwork {
                    network: network6,
                    subnet: subnet6,
                    node: self.own_name.to_string(),
                });
            }
            own.subnet6 = Some(subnet6);
            own.published_mac6 =
                ann.get(&self.names.backend_v6_data).and_then(|d| vtep_mac(Ipv6Net::BACKEND_DATA, d).ok());
            own.node_public_ipv6 = match ann.get(&self.names.node_public_ipv6) {
                Some(ip) => Some(parse_ip::<Ipv6Net>("node-public-ipv6", ip)?),
                None => None,
            };
        }
        Ok(own)
    }

    /// The addresses our own Node publishes (public-ip, its overwrite,
    /// node-public-ip, and their IPv6 twins): no peer may claim one.
    fn own_ips(&self, nodes: &[Value]) -> OwnIps {
        let n = self.names;
        let own =
            nodes.iter().find(|node| node.pointer("/metadata/name").and_then(Value::as_str) == Some(self.own_name));
        let ann = own.and_then(|node| annotations(node).ok()).unwrap_or_default();
        OwnIps {
            v4: [&n.public_ip, &n.public_ip_overwrite, &n.node_public_ip]
                .into_iter()
                .filter_map(|key| ann.get(key)?.parse().ok())
                .collect(),
            v6: [&n.public_ipv6, &n.public_ipv6_overwrite, &n.node_public_ipv6]
                .into_iter()
                .filter_map(|key| ann.get(key)?.parse().ok())
                .collect(),
        }
    }

    /// Reads every node; one bad node never spoils the others.
    pub fn view(&self, nodes: &[Value]) -> ClusterView {
        let own_ips = self.own_ips(nodes);
        let mut view = ClusterView {
            own_problem: Some(format!("node {:?} is not in the node list", self.own_name)),
            ..ClusterView::default()
        };
        let mut own_seen = 0;
        for (i, node) in nodes.iter().enumerate() {
            let Some(name) = node.pointer("/metadata/name").and_then(Value::as_str) else {
                view.rejected.push(Rejection { node: format!("#{i}"), reason: "no metadata.name".into() });
                continue;
            };
            if name == self.own_name {
                own_seen += 1;
                if own_seen > 1 {
                    view.own = None;
                    view.own_problem = Some(format!("own node {name} is listed {own_seen} times"));
                    continue;
                }
                match self.own(node) {
                    Ok(own) => {
                        view.own = Some(own);
                        view.own_problem = None;
                    }
                    Err(reason) => view.own_problem = Some(format!("own node {name}: {reason}")),
                }
                continue;
            }
            if annotations(node).is_ok_and(|a| a.get(ANY_INNER_SOURCE).is_some()) {
                view.self_exempt.push(Rejection {
                    node: name.into(),
                    reason: format!(
                        "its own annotation {ANY_INNER_SOURCE} is ignored: a node cannot exempt itself from the \
                         inner-source check. If it is an external VTEP that forwards without SNAT, name it with \
                         --any-inner-source={name} (or its pod CIDR) on each edgevx node"
                    ),
                });
            }
            match self.peer(name, node, &own_ips) {
                Ok(Verdict::Peer(p, partial)) => {
                    if let Some(reason) = partial {
                        view.partial.push(Rejection { node: name.into(), reason });
                    }
                    view.peers.push(p)
                }
                Ok(Verdict::Ignored(reason)) => view.ignored.push(Rejection { node: name.into(), reason }),
                Err(reason) => view.rejected.push(Rejection { node: name.into(), reason: reason.to_string() }),
            }
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::annotations::DEFAULT_PREFIX;

    fn node(name: &str, cidr: &str, ip: &str, data: &str) -> Value {
        json!({
            "metadata": {"name": name, "annotations": {
                "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                "flannel.alpha.coreos.com/backend-type": "vxlan",
                "flannel.alpha.coreos.com/backend-data": data,
                "flannel.alpha.coreos.com/public-ip": ip,
            }},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}
        })
    }

    /// The view of node "me" in 10.244.0.0/16 and, with `ipv4` and `ipv6`
    /// as asked, fd00:10:244::/56.
    fn view_with(ipv4: bool, ipv6: bool, nodes: &[Value]) -> ClusterView {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        let network = ipv4.then(|| "10.244.0.0/16".parse().unwrap());
        let network6 = ipv6.then(|| "fd00:10:244::/56".parse().unwrap());
        Rules { names: &names, own_name: "me", network, network6 }.view(nodes)
    }

    fn view(nodes: &[Value]) -> ClusterView {
        view_with(true, false, nodes)
    }

    fn dual_stack_view(nodes: &[Value]) -> ClusterView {
        view_with(true, true, nodes)
    }

    const GOOD6: &str = r#"{"VNI":1,"VtepMAC":"ae:00:00:00:00:06"}"#;

    /// A dual-stack flannel node: node `n` has 10.244.<n>.0/24, fd00:10:244:<n>::/64
    /// and public addresses 198.18.0.<n>, fd00:198:18::<n>.
    fn dual_stack_node(name: &str, n: u8) -> Value {
        let mut v = node(name, &format!("10.244.{n}.0/24"), &format!("198.18.0.{n}"), GOOD);
        let a = &mut v["metadata"]["annotations"];
        a["flannel.alpha.coreos.com/backend-v6-data"] = json!(GOOD6);
        a["flannel.alpha.coreos.com/public-ipv6"] = json!(format!("fd00:198:18::{n}"));
        v["spec"] = json!({"podCIDR": format!("10.244.{n}.0/24"),
            "podCIDRs": [format!("10.244.{n}.0/24"), format!("fd00:10:244:{n}::/64")]});
        v
    }

    const GOOD: &str = r#"{"VNI":1,"VtepMAC":"9e:c9:07:f9:b3:8b"}"#;

    #[test]
    fn reads_a_flannel_peer_and_own_node() {
        let v =
            view(&[node("me", "10.244.1.0/24", "198.18.0.1", GOOD), node("b", "10.244.2.0/24", "198.18.0.2", GOOD)]);
        let own = v.own.unwrap();
        assert_eq!(own.subnet.unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(own.published_mac.unwrap().to_string(), "9e:c9:07:f9:b3:8b");
        assert_eq!(v.peers.len(), 1);
        assert_eq!(v.peers[0].v4.unwrap().public_ip, Ipv4Addr::new(198, 18, 0, 2));
        assert!(v.rejected.is_empty());
    }

    #[test]
    fn a_nodes_own_annotation_exempts_nothing_and_is_named() {
        let with = |value: &str| {
            let mut n = node("f5", "10.244.9.0/24", "198.18.0.9", GOOD);
            n["metadata"]["annotations"][ANY_INNER_SOURCE] = json!(value);
            n
        };
        let v = view(&[node("b", "10.244.2.0/24", "198.18.0.2", GOOD), with("true"), {
            let mut n = with("yes");
            n["metadata"]["name"] = json!("typo");
            n["spec"] = json!({"podCIDR": "10.244.8.0/24", "podCIDRs": ["10.244.8.0/24"]});
            n
        }]);
        let exempt: Vec<(&str, bool)> = v.peers.iter().map(|p| (p.node.as_str(), p.any_inner_source)).collect();
        assert_eq!(exempt, [("b", false), ("f5", false), ("typo", false)]);
        let named: Vec<&str> = v.self_exempt.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(named, ["f5", "typo"]);
        assert!(v.self_exempt[0].reason.contains("--any-inner-source=f5"), "{}", v.self_exempt[0].reason);
    }

    #[test]
    fn old_backend_data_without_vni_is_accepted() {
        let v = view(&[node("b", "10.244.2.0/24", "198.18.0.2", r#"{"VtepMAC":"9e:c9:07:f9:b3:8b"}"#)]);
        assert_eq!(v.peers.len(), 1);
    }

    #[test]
    fn overwrite_wins_over_public_ip() {
        let mut n = node("b", "10.244.2.0/24", "198.18.0.2", GOOD);
        n["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ip-overwrite"] = json!("198.18.5.5");
        assert_eq!(view(&[n]).peers[0].v4.unwrap().public_ip, Ipv4Addr::new(198, 18, 5, 5));
    }

    #[test]
    fn non_flannel_and_non_vxlan_nodes_are_ignored_not_rejected() {
        let mut a = node("a", "10.244.2.0/24", "198.18.0.2", GOOD);
        a["metadata"]["annotations"]["flannel.alpha.coreos.com/kube-subnet-manager"] = json!("false");
        let mut b = node("b", "10.244.3.0/24", "198.18.0.3", GOOD);
        b["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"] = json!("host-gw");
        let v = view(&[a, b]);
        assert!(v.peers.is_empty() && v.rejected.is_empty());
        assert_eq!(v.ignored.len(), 2);
    }

    #[test]
    fn malformed_nodes_are_rejected_with_their_reason() {
        let mut no_cidr = node("nocidr", "10.244.9.0/24", "198.18.0.9", GOOD);
        no_cidr["spec"] = json!({});
        let cases = vec![
            (node("badmac", "10.244.2.0/24", "198.18.0.2", r#"{"VtepMAC":"zz:00:00:00:00:01"}"#), "VtepMAC"),
            (node("badip", "10.244.3.0/24", "198.18.0.300", GOOD), "public-ip"),
            (node("garbage", "10.244.4.0/24", "198.18.0.4", "{not json"), "not JSON"),
            (no_cidr, "pod cidr not assigned"),
            (node("outside", "10.99.0.0/24", "198.18.0.5", GOOD), "outside the network"),
            (node("loopback", "10.244.8.0/24", "127.0.0.1", GOOD), "loopback"),
            (node("mcast", "10.244.10.0/24", "224.0.0.1", GOOD), "multicast"),
            (node("zero", "10.244.11.0/24", "0.0.0.0", GOOD), "not a unicast"),
            (node("bcast", "10.244.12.0/24", "255.255.255.255", GOOD), "broadcast"),
            (node("ours", "10.244.13.0/24", "198.18.0.1", GOOD), "this node's own address"),
            (node("badcidr", "10.244.6.0/33", "198.18.0.6", GOOD), "bad pod CIDR"),
        ];
        let nodes: Vec<Value> =
            cases.iter().map(|(n, _)| n.clone()).chain([node("ok", "10.244.7.0/24", "198.18.0.7", GOOD)]).collect();
        let v = view(&[nodes, vec![node("me", "10.244.1.0/24", "198.18.0.1", GOOD)]].concat());
        assert_eq!(v.peers.len(), 1, "the good node survives");
        for (n, reason) in &cases {
            let name = n["metadata"]["name"].as_str().unwrap();
            let r = v.rejected.iter().find(|r| r.node == name).unwrap_or_else(|| panic!("{name} not rejected"));
            assert!(r.reason.contains(reason), "{name}: {}", r.reason);
        }
    }

    #[test]
    fn missing_own_node_is_reported() {
        let v = view(&[node("b", "10.244.2.0/24", "198.18.0.2", GOOD)]);
        assert!(v.own.is_none());
        assert!(v.own_problem.unwrap().contains("\"me\""));
    }

    #[test]
    fn own_node_listed_twice_is_a_problem_not_a_pick() {
        let me = node("me", "10.244.1.0/24", "198.18.0.1", GOOD);
        let other_me = node("me", "10.244.9.0/24", "198.18.0.9", GOOD);
        for nodes in [vec![me.clone(), other_me.clone()], vec![other_me, me]] {
            let v = view(&nodes);
            assert!(v.own.is_none(), "{:?}", v.own);
            assert!(v.own_problem.unwrap().contains("listed 2 times"));
        }
    }

    #[test]
    fn dual_stack_reads_both_halves_of_peer_and_own_node() {
        let mut me = dual_stack_node("me", 1);
        me["metadata"]["annotations"]["flannel.alpha.coreos.com/node-public-ipv6"] = json!("fd00:198:18::a");
        let v = dual_stack_view(&[me, dual_stack_node("b", 2)]);
        let own = v.own.unwrap();
        assert_eq!(own.subnet6, Some("fd00:10:244:1::/64".parse().unwrap()));
        assert_eq!(own.published_mac6.unwrap().to_string(), "ae:00:00:00:00:06");
        assert_eq!(own.node_public_ipv6, Some("fd00:198:18::a".parse().unwrap()));
        assert!(v.rejected.is_empty(), "{:?}", v.rejected);
        let p6 = v.peers[0].v6.unwrap();
        assert_eq!(p6.subnet.to_string(), "fd00:10:244:2::/64");
        assert_eq!(p6.public_ip, "fd00:198:18::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p6.vtep_mac.to_string(), "ae:00:00:00:00:06");
    }

    #[test]
    fn ipv6_annotations_are_ignored_with_ipv6_off() {
        let v = view(&[dual_stack_node("me", 1), dual_stack_node("b", 2)]);
        let own = v.own.unwrap();
        assert_eq!((own.subnet6, own.published_mac6, own.node_public_ipv6), (None, None, None));
        assert_eq!(v.peers[0].v6, None);
        // and a node without them is a peer as before
        let v = view(&[node("b", "10.244.2.0/24", "198.18.0.2", GOOD)]);
        assert_eq!(v.peers.len(), 1);
    }

    #[test]
    fn ipv6_pod_cidr_comes_from_pod_cidr_when_the_list_is_empty() {
        let mut b = dual_stack_node("b", 2);
        b["spec"] = json!({"podCIDR": "fd00:10:244:2::/64", "podCIDRs": []});
        // the single field holds only the IPv6 one: no IPv4 pod CIDR, rejected for that
        let v = dual_stack_view(&[b]);
        assert!(v.rejected[0].reason.contains("no IPv4 pod CIDR"), "{:?}", v.rejected);
    }

    #[test]
    fn public_ipv6_overwrite_wins() {
        let mut b = dual_stack_node("b", 2);
        b["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ipv6-overwrite"] = json!("2001:db8::5");
        b["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ipv6"] = json!("garbage");
        assert_eq!(dual_stack_view(&[b]).peers[0].v6.unwrap().public_ip, "2001:db8::5".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn a_broken_ipv6_half_drops_the_node_and_an_unusable_one_only_the_half() {
        let without = |name: &str, n: u8, key: &str| {
            let mut v = dual_stack_node(name, n);
            v["metadata"]["annotations"].as_object_mut().unwrap().remove(key);
            v
        };
        let with = |name: &str, n: u8, key: &str, value: &str| {
            let mut v = dual_stack_node(name, n);
            v["metadata"]["annotations"][key] = json!(value);
            v
        };
        let mut v4_only = dual_stack_node("v4only", 12);
        v4_only["spec"] = json!({"podCIDR": "10.244.12.0/24", "podCIDRs": ["10.244.12.0/24"]});
        let mut hostbits = dual_stack_node("hostbits6", 14);
        hostbits["spec"]["podCIDRs"][1] = json!("fd00:10:244:14::1/64");
        let ip6 = "flannel.alpha.coreos.com/public-ipv6";
        let data6 = "flannel.alpha.coreos.com/backend-v6-data";
        // missing or not parsing: flannel's nodeToLease fails, so the node is skipped whole
        let whole = vec![
            (without("noip6", 3, ip6), "no flannel.alpha.coreos.com/public-ipv6 annotation"),
            (with("emptyip6", 4, ip6, ""), "bad public-ipv6"),
            (with("v4asv6", 5, ip6, "198.18.0.5"), "want an IPv6 address"),
            (without("nodata6", 11, data6), "no flannel.alpha.coreos.com/backend-v6-data annotation"),
            (with("badmac6", 15, data6, r#"{"VtepMAC":"zz"}"#), "backend-v6-data has a bad VtepMAC"),
            (with("nomac6", 16, data6, r#"{"VNI":1}"#), "backend-v6-data has no VtepMAC"),
            (v4_only, "missing IPv6 address on spec.podCIDRs"),
            (hostbits, "host bits"),
        ];
        // well formed, but no IPv6 VTEP can be it: flannel would program it; only the half goes
        let mut outside = dual_stack_node("outside6", 13);
        outside["spec"]["podCIDRs"][1] = json!("fd00:99::/64");
        let half = vec![
            (with("lo6", 6, ip6, "::1"), "loopback"),
            (with("ll6", 7, ip6, "fe80::7"), "link-local"),
            (with("mc6", 8, ip6, "ff02::1"), "multicast"),
            (with("zero6", 9, ip6, "::"), "unspecified"),
            (with("ours6", 10, ip6, "fd00:198:18::1"), "this node's own address"),
            (outside, "outside the network fd00:10:244::/56"),
        ];
        let nodes: Vec<Value> = whole
            .iter()
            .chain(&half)
            .map(|(n, _)| n.clone())
            .chain([dual_stack_node("me", 1), dual_stack_node("ok", 2)])
            .collect();
        let v = dual_stack_view(&nodes);
        let name = |n: &Value| n["metadata"]["name"].as_str().unwrap().to_string();
        let mut peers: Vec<(String, bool)> = v.peers.iter().map(|p| (p.node.clone(), p.v6.is_some())).collect();
        peers.sort();
        let mut want: Vec<(String, bool)> = half.iter().map(|(n, _)| (name(n), false)).collect();
        want.push(("ok".into(), true));
        want.sort();
        assert_eq!(peers, want, "the half cases keep their IPv4 half, nothing else is a peer");
        for (n, reason) in &whole {
            let r = v.rejected.iter().find(|r| r.node == name(n)).unwrap_or_else(|| panic!("{} not rejected", name(n)));
            assert!(r.reason.contains(reason), "{}: {}", name(n), r.reason);
        }
        assert_eq!(v.rejected.len(), whole.len(), "{:?}", v.rejected);
        for (n, reason) in &half {
            let r = v.partial.iter().find(|r| r.node == name(n)).unwrap_or_else(|| panic!("{} not partial", name(n)));
            assert!(r.reason.contains(reason) && r.reason.contains("IPv4 half kept"), "{}: {}", name(n), r.reason);
        }
        assert_eq!(v.partial.len(), half.len(), "{:?}", v.partial);
    }

    #[test]
    fn own_node_needs_an_ipv6_pod_cidr_inside_the_ipv6_network() {
        let mut me = dual_stack_node("me", 1);
        me["spec"]["podCIDRs"][1] = json!("fd00:99:1::/64");
        let problem = dual_stack_view(&[me]).own_problem.unwrap();
        assert_eq!(
            problem,
            "own node me: subnet \"fd00:10:244::/56\" specified in the flannel net config doesn't contain \
             \"fd00:99:1::/64\" IPv6 PodCIDR of the \"me\" node"
        );
        let mut me = dual_stack_node("me", 1);
        me["spec"] = json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]});
        assert!(dual_stack_view(&[me]).own_problem.unwrap().contains("missing IPv6 address"));
    }

    /// An IPv6-only flannel node, as flannel's AcquireLease leaves it: no
    /// IPv4 annotation, one IPv6 pod CIDR.
    fn ipv6_only_node(name: &str, n: u8) -> Value {
        json!({
            "metadata": {"name": name, "annotations": {
                "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                "flannel.alpha.coreos.com/backend-type": "vxlan",
                "flannel.alpha.coreos.com/backend-v6-data": GOOD6,
                "flannel.alpha.coreos.com/public-ipv6": format!("fd00:198:18::{n}"),
            }},
            "spec": {"podCIDR": format!("fd00:10:244:{n}::/64"), "podCIDRs": [format!("fd00:10:244:{n}::/64")]}
        })
    }

    fn ipv6_only_view(nodes: &[Value]) -> ClusterView {
        view_with(false, true, nodes)
    }

    #[test]
    fn ipv6_only_reads_no_ipv4_and_needs_the_ipv6_half() {
        let mut bad_ip = ipv6_only_node("badip", 4);
        bad_ip["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ipv6"] = json!("198.18.0.4");
        let mut link_local = ipv6_only_node("linklocal", 5);
        link_local["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ipv6"] = json!("fe80::5");
        let v = ipv6_only_view(&[
            ipv6_only_node("me", 1),
            ipv6_only_node("b", 2),
            // a dual-stack node is read by its IPv6 half
            dual_stack_node("c", 3),
            bad_ip,
            link_local,
            node("v4only", "10.244.6.0/24", "198.18.0.6", GOOD),
        ]);
        let own = v.own.as_ref().unwrap();
        assert_eq!((own.subnet, own.published_mac), (None, None));
        assert_eq!(own.subnet6.unwrap().to_string(), "fd00:10:244:1::/64");
        assert_eq!(own.published_mac6.unwrap().to_string(), "ae:00:00:00:00:06");
        let peers: Vec<(&str, bool, String)> =
            v.peers.iter().map(|p| (p.node.as_str(), p.v4.is_some(), p.v6.unwrap().subnet.to_string())).collect();
        assert_eq!(peers, [("b", false, "fd00:10:244:2::/64".into()), ("c", false, "fd00:10:244:3::/64".into())]);
        let reason = |n: &str| v.rejected.iter().find(|r| r.node == n).map(|r| r.reason.clone()).unwrap_or_default();
        assert!(reason("badip").contains("public-ipv6"), "{:?}", v.rejected);
        // without an IPv4 half, an unusable IPv6 half rejects the peer whole
        assert!(
            reason("linklocal").contains("link-local") && !reason("linklocal").contains("IPv4"),
            "{:?}",
            v.rejected
        );
        assert!(reason("v4only").contains("public-ipv6"), "{:?}", v.rejected);
        assert!(v.partial.is_empty(), "{:?}", v.partial);
        // our own node without an IPv6 pod CIDR
        let v = ipv6_only_view(&[node("me", "10.244.1.0/24", "198.18.0.1", GOOD)]);
        assert!(v.own.is_none() && v.own_problem.unwrap().contains("IPv6"));
    }
}
