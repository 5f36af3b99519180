//! flannel's rules for reading Node objects (pkg/subnet/kube/kube.go,
//! pkg/backend/vxlan): which nodes are peers, and what each peer is.
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::Value;

use crate::{
    annotations::{ANY_INNER_SOURCE, AnnotationNames},
    mac::VtepMac,
    peer::{ClusterView, OwnNode, Peer, Rejection},
};

/// How to read a node list for one agent.
pub struct Rules<'a> {
    pub names: &'a AnnotationNames,
    pub own_name: &'a str,
    pub network: Ipv4Net,
}

enum Verdict {
    Peer(Peer),
    Ignored(String),
}

/// A Node's annotations, borrowed: a node list of 10,000 Nodes is read
/// without copying a single annotation.
#[derive(Default)]
struct Annotations<'a>(Option<&'a serde_json::Map<String, Value>>);

impl<'a> Annotations<'a> {
    fn get(&self, key: &str) -> Option<&'a str> {
        self.0?.get(key).and_then(Value::as_str)
    }
}

fn annotations(node: &Value) -> Result<Annotations<'_>, String> {
    match node.pointer("/metadata/annotations") {
        None | Some(Value::Null) => Ok(Annotations(None)),
        Some(Value::Object(map)) => {
            if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                return Err(format!("annotation {k} is not a string"));
            }
            Ok(Annotations(Some(map)))
        }
        Some(_) => Err("metadata.annotations is not a map".into()),
    }
}

/// The first IPv4 pod CIDR: `spec.podCIDRs`, else `spec.podCIDR`.
fn pod_cidr(node: &Value) -> Result<Ipv4Net, String> {
    let mut texts: Vec<&str> = Vec::new();
    if let Some(list) = node.pointer("/spec/podCIDRs").and_then(Value::as_array) {
        texts.extend(list.iter().filter_map(Value::as_str));
    }
    if texts.is_empty() {
        if let Some(one) = node.pointer("/spec/podCIDR").and_then(Value::as_str) {
            texts.push(one);
        }
    }
    if texts.is_empty() {
        return Err("pod cidr not assigned (spec.podCIDR and spec.podCIDRs are empty)".into());
    }
    for text in &texts {
        if text.contains(':') {
            continue; // IPv6 half of a dual-stack node
        }
        let net: Ipv4Net = text.parse().map_err(|_| format!("bad pod CIDR {text:?}"))?;
        if net.trunc() != net {
            return Err(format!("pod CIDR {text} has host bits set"));
        }
        return Ok(net);
    }
    Err(format!("no IPv4 pod CIDR in {texts:?}"))
}

fn vtep_mac(backend_data: &str) -> Result<VtepMac, String> {
    /// The part of flannel's vxlan backend data we read (`VNI` is not used).
    #[derive(serde::Deserialize)]
    struct BackendData<'a> {
        #[serde(rename = "VtepMAC", borrow, default)]
        vtep_mac: Option<std::borrow::Cow<'a, str>>,
    }
    let data: BackendData = serde_json::from_str(backend_data).map_err(|e| {
        if e.is_data() && e.to_string().contains("VtepMAC") {
            format!("backend-data VtepMAC is not a string: {backend_data}")
        } else {
            format!("backend-data is not JSON ({e}): {backend_data:?}")
        }
    })?;
    let mac = data.vtep_mac.ok_or_else(|| format!("backend-data has no VtepMAC: {backend_data}"))?;
    mac.parse().map_err(|e| format!("backend-data has a bad VtepMAC: {e}"))
}

fn parse_ip(what: &str, text: &str) -> Result<Ipv4Addr, String> {
    text.parse().map_err(|_| format!("bad {what} {text:?} (want an IPv4 address)"))
}

impl Rules<'_> {
    fn peer(&self, name: &str, node: &Value, own_ips: &[Ipv4Addr]) -> Result<Verdict, String> {
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
        let data = ann.get(&n.backend_data).ok_or_else(|| format!("no {} annotation", n.backend_data))?;
        let vtep_mac = vtep_mac(data)?;
        // public-ip-overwrite is what the node's own agent publishes as public-ip
        let public_ip = match (ann.get(&n.public_ip_overwrite), ann.get(&n.public_ip)) {
            (Some(o), _) if !o.is_empty() => parse_ip("public-ip-overwrite", o)?,
            (_, Some(p)) => parse_ip("public-ip", p)?,
            (_, None) => return Err(format!("no {} annotation", n.public_ip)),
        };
        let subnet = pod_cidr(node)?;
        super::peer_record::check(public_ip, subnet, self.network, own_ips)
            .map_err(|e| format!("public-ip annotation or pod CIDR: {e}"))?;
        let any_inner_source = ann.get(ANY_INNER_SOURCE) == Some("true");
        Ok(Verdict::Peer(Peer { node: name.to_string(), subnet, public_ip, vtep_mac, any_inner_source, v6: None }))
    }

    fn own(&self, node: &Value) -> Result<OwnNode, String> {
        let ann = annotations(node)?;
        let subnet = pod_cidr(node)?;
        if !self.network.contains(&subnet) {
            return Err(format!("pod CIDR {subnet} is outside the network {}", self.network));
        }
        let published_mac = ann.get(&self.names.backend_data).and_then(|d| vtep_mac(d).ok());
        let node_public_ip = match ann.get(&self.names.node_public_ip) {
            Some(ip) => Some(parse_ip("node-public-ip", ip)?),
            None => None,
        };
        Ok(OwnNode {
            subnet,
            published_mac,
            node_public_ip,
            subnet6: None,
            published_mac6: None,
            node_public_ipv6: None,
        })
    }

    /// The addresses our own Node publishes (public-ip, its overwrite,
    /// node-public-ip): no peer may claim one.
    fn own_ips(&self, nodes: &[Value]) -> Vec<Ipv4Addr> {
        let n = self.names;
        let own =
            nodes.iter().find(|node| node.pointer("/metadata/name").and_then(Value::as_str) == Some(self.own_name));
        let ann = own.and_then(|node| annotations(node).ok()).unwrap_or_default();
        [&n.public_ip, &n.public_ip_overwrite, &n.node_public_ip]
            .into_iter()
            .filter_map(|key| ann.get(key)?.parse().ok())
            .collect()
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
            match self.peer(name, node, &own_ips) {
                Ok(Verdict::Peer(p)) => view.peers.push(p),
                Ok(Verdict::Ignored(reason)) => view.ignored.push(Rejection { node: name.into(), reason }),
                Err(reason) => view.rejected.push(Rejection { node: name.into(), reason }),
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

    fn view(nodes: &[Value]) -> ClusterView {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        Rules { names: &names, own_name: "me", network: "10.244.0.0/16".parse().unwrap() }.view(nodes)
    }

    const GOOD: &str = r#"{"VNI":1,"VtepMAC":"9e:c9:07:f9:b3:8b"}"#;

    #[test]
    fn reads_a_flannel_peer_and_own_node() {
        let v =
            view(&[node("me", "10.244.1.0/24", "198.18.0.1", GOOD), node("b", "10.244.2.0/24", "198.18.0.2", GOOD)]);
        let own = v.own.unwrap();
        assert_eq!(own.subnet.to_string(), "10.244.1.0/24");
        assert_eq!(own.published_mac.unwrap().to_string(), "9e:c9:07:f9:b3:8b");
        assert_eq!(v.peers.len(), 1);
        assert_eq!(v.peers[0].public_ip, Ipv4Addr::new(198, 18, 0, 2));
        assert!(v.rejected.is_empty());
    }

    #[test]
    fn only_the_nodes_own_annotation_exempts_it_from_inner_source_binding() {
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
        assert_eq!(exempt, [("b", false), ("f5", true), ("typo", false)]);
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
        assert_eq!(view(&[n]).peers[0].public_ip, Ipv4Addr::new(198, 18, 5, 5));
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
}
