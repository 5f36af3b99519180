//! One family's half of a Node as flannel's `nodeToLease` reads it
//! (pkg/subnet/kube/kube.go): the VtepMAC in its backend data, its public
//! IP (or that annotation's overwrite) and its pod CIDR. One reading for
//! both families; what differs, the annotations and the words of the
//! errors, is [`NodeFamily`]'s data. The Node's annotations, which
//! `flannel_rules.rs` also reads its rules from, are borrowed here.
use std::str::FromStr;

use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::Value;

use super::{
    node_error::{NodeError, parse_ip},
    peer_record,
};
use crate::{annotations::AnnotationNames, family::Family, mac::VtepMac, peer::Half};

/// A Node's annotations, borrowed: a node list of 10,000 Nodes is read
/// without copying a single annotation.
#[derive(Default)]
pub(super) struct Annotations<'a>(Option<&'a serde_json::Map<String, Value>>);

impl<'a> Annotations<'a> {
    pub(super) fn get(&self, key: &str) -> Option<&'a str> {
        self.0?.get(key).and_then(Value::as_str)
    }
}

pub(super) fn annotations(node: &Value) -> Result<Annotations<'_>, NodeError> {
    match node.pointer("/metadata/annotations") {
        None | Some(Value::Null) => Ok(Annotations(None)),
        Some(Value::Object(map)) => {
            if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                return Err(NodeError::AnnotationNotAString(k.clone()));
            }
            Ok(Annotations(Some(map)))
        }
        Some(_) => Err(NodeError::AnnotationsNotAMap),
    }
}

/// A family as a Node carries it: which annotations hold its half, and
/// how a half that is missing or does not parse is reported.
pub(super) trait NodeFamily: Family + FromStr {
    /// The half's annotations after flannel's prefix, as the errors name
    /// them: `backend-data`, `public-ip`, `public-ip-overwrite`, and for
    /// IPv6 `backend-v6-data`, `public-ipv6`, `public-ipv6-overwrite`.
    const BACKEND_DATA: &'static str;
    const PUBLIC_IP: &'static str;
    const PUBLIC_IP_OVERWRITE: &'static str;
    /// The same three under the configured prefix.
    fn backend_data_key(names: &AnnotationNames) -> &str;
    fn public_ip_key(names: &AnnotationNames) -> &str;
    fn public_ip_overwrite_key(names: &AnnotationNames) -> &str;
    /// Which part is read first, so which one a node lacking both is
    /// rejected for: IPv4 the backend data, as edgevx has always reported
    /// it; IPv6 the public IP, in flannel's `nodeToLease` order.
    const BACKEND_DATA_FIRST: bool;
    /// What a refused record names as its source, in a rejection's reason.
    const PARTS: &'static str;
    /// A missing annotation. The IPv6 one says that IPv6 is on: with it
    /// off, a node without the annotation is read as before.
    fn no_annotation(key: &str) -> NodeError;
    /// No pod CIDR of the family among `texts`. IPv4 calls an empty list
    /// unassigned, in edgevx's words; IPv6 reports either in flannel's.
    fn no_pod_cidr(texts: &[&str]) -> NodeError;
    fn bad_pod_cidr(text: &str) -> NodeError;
    fn pod_cidr_host_bits(text: &str) -> NodeError;
}

fn owned(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| t.to_string()).collect()
}

impl NodeFamily for Ipv4Net {
    const BACKEND_DATA: &'static str = "backend-data";
    const PUBLIC_IP: &'static str = "public-ip";
    const PUBLIC_IP_OVERWRITE: &'static str = "public-ip-overwrite";
    fn backend_data_key(names: &AnnotationNames) -> &str {
        &names.backend_data
    }
    fn public_ip_key(names: &AnnotationNames) -> &str {
        &names.public_ip
    }
    fn public_ip_overwrite_key(names: &AnnotationNames) -> &str {
        &names.public_ip_overwrite
    }
    const BACKEND_DATA_FIRST: bool = true;
    const PARTS: &'static str = "public-ip annotation or pod CIDR";
    fn no_annotation(key: &str) -> NodeError {
        NodeError::NoAnnotation(key.to_string())
    }
    fn no_pod_cidr(texts: &[&str]) -> NodeError {
        if texts.is_empty() { NodeError::PodCidrNotAssigned } else { NodeError::NoIpv4PodCidr(owned(texts)) }
    }
    fn bad_pod_cidr(text: &str) -> NodeError {
        NodeError::BadPodCidr(text.to_string())
    }
    fn pod_cidr_host_bits(text: &str) -> NodeError {
        NodeError::PodCidrHostBits(text.to_string())
    }
}

impl NodeFamily for Ipv6Net {
    const BACKEND_DATA: &'static str = "backend-v6-data";
    const PUBLIC_IP: &'static str = "public-ipv6";
    const PUBLIC_IP_OVERWRITE: &'static str = "public-ipv6-overwrite";
    fn backend_data_key(names: &AnnotationNames) -> &str {
        &names.backend_v6_data
    }
    fn public_ip_key(names: &AnnotationNames) -> &str {
        &names.public_ipv6
    }
    fn public_ip_overwrite_key(names: &AnnotationNames) -> &str {
        &names.public_ipv6_overwrite
    }
    const BACKEND_DATA_FIRST: bool = false;
    const PARTS: &'static str = "public-ipv6 annotation or IPv6 pod CIDR";
    fn no_annotation(key: &str) -> NodeError {
        NodeError::NoIpv6Annotation(key.to_string())
    }
    fn no_pod_cidr(texts: &[&str]) -> NodeError {
        NodeError::NoIpv6PodCidr(owned(texts))
    }
    fn bad_pod_cidr(text: &str) -> NodeError {
        NodeError::BadIpv6PodCidr(text.to_string())
    }
    fn pod_cidr_host_bits(text: &str) -> NodeError {
        NodeError::Ipv6PodCidrHostBits(text.to_string())
    }
}

/// `spec.podCIDRs`, else `spec.podCIDR` (flannel reads the single field
/// only when the list is empty).
fn pod_cidr_texts(node: &Value) -> Vec<&str> {
    let mut texts: Vec<&str> = Vec::new();
    if let Some(list) = node.pointer("/spec/podCIDRs").and_then(Value::as_array) {
        texts.extend(list.iter().filter_map(Value::as_str));
    }
    if texts.is_empty()
        && let Some(one) = node.pointer("/spec/podCIDR").and_then(Value::as_str)
    {
        texts.push(one);
    }
    texts
}

/// The first pod CIDR of the family `N`, as flannel's `nodeToLease` picks
/// it: an IPv6 one has a colon, an IPv4 one none.
pub(super) fn pod_cidr<N: NodeFamily>(node: &Value) -> Result<N, NodeError> {
    let texts = pod_cidr_texts(node);
    let text = texts.iter().find(|t| t.contains(':') == N::IPV6).ok_or_else(|| N::no_pod_cidr(&texts))?;
    let net: N = text.parse().map_err(|_| N::bad_pod_cidr(text))?;
    // host bits set: the prefix's own address differs
    if N::with_len(net.network_addr(), net.prefix_length()) != Some(net) {
        return Err(N::pod_cidr_host_bits(text));
    }
    Ok(net)
}

/// The VtepMAC of flannel's vxlan backend data; `what` names the
/// annotation (`backend-data` or `backend-v6-data`).
pub(super) fn vtep_mac(what: &'static str, backend_data: &str) -> Result<VtepMac, NodeError> {
    /// The part of flannel's vxlan backend data we read (`VNI` is not used).
    #[derive(serde::Deserialize)]
    struct BackendData<'a> {
        #[serde(rename = "VtepMAC", borrow, default)]
        vtep_mac: Option<std::borrow::Cow<'a, str>>,
    }
    let data = backend_data.to_string();
    let parsed: BackendData = serde_json::from_str(backend_data).map_err(|e| {
        if e.is_data() && e.to_string().contains("VtepMAC") {
            NodeError::MacNotAString { what, data: data.clone() }
        } else {
            NodeError::BackendDataNotJson { what, error: e.to_string(), data: data.clone() }
        }
    })?;
    let mac = parsed.vtep_mac.ok_or_else(|| NodeError::NoMac { what, data: data.clone() })?;
    mac.parse().map_err(|error| NodeError::BadMac { what, error })
}

/// A peer's half of the family `N`, not yet checked ([`checked`]): every
/// part is required and must parse, or flannel's `nodeToLease` fails.
pub(super) fn half<N: NodeFamily>(
    names: &AnnotationNames,
    ann: &Annotations,
    node: &Value,
) -> Result<Half<N>, NodeError> {
    let mac = || {
        let key = N::backend_data_key(names);
        let data = ann.get(key).ok_or_else(|| N::no_annotation(key))?;
        vtep_mac(N::BACKEND_DATA, data)
    };
    // public-ip-overwrite is what the node's own agent publishes as public-ip
    let ip = || match (ann.get(N::public_ip_overwrite_key(names)), ann.get(N::public_ip_key(names))) {
        (Some(o), _) if !o.is_empty() => parse_ip::<N>(N::PUBLIC_IP_OVERWRITE, o),
        (_, Some(p)) => parse_ip::<N>(N::PUBLIC_IP, p),
        (_, None) => Err(N::no_annotation(N::public_ip_key(names))),
    };
    let (vtep_mac, public_ip) = if N::BACKEND_DATA_FIRST {
        let vtep_mac = mac()?;
        (vtep_mac, ip()?)
    } else {
        let public_ip = ip()?;
        (mac()?, public_ip)
    };
    Ok(Half { subnet: pod_cidr::<N>(node)?, public_ip, vtep_mac })
}

/// `half` if the checks every peer record gets pass
/// ([`peer_record::check`]), else why not, naming the annotation and pod
/// CIDR it came from.
pub(super) fn checked<N: NodeFamily>(half: Half<N>, network: N, own: &[N::Addr]) -> Result<Half<N>, NodeError> {
    peer_record::check(half.public_ip, half.subnet, network, own)
        .map(|()| half)
        .map_err(|problem| NodeError::Record { parts: N::PARTS, problem })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_family_takes_its_first_pod_cidr_with_its_own_errors() {
        let node = |cidrs: Value| json!({"spec": {"podCIDRs": cidrs}});
        let both = node(json!(["10.244.1.0/24", "fd00:10:244:1::/64"]));
        assert_eq!(pod_cidr::<Ipv4Net>(&both).unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(pod_cidr::<Ipv6Net>(&both).unwrap().to_string(), "fd00:10:244:1::/64");
        let v4 = |n: &Value| pod_cidr::<Ipv4Net>(n).unwrap_err().to_string();
        let v6 = |n: &Value| pod_cidr::<Ipv6Net>(n).unwrap_err().to_string();
        assert!(v4(&node(json!([]))).starts_with("pod cidr not assigned"));
        assert!(v6(&node(json!([]))).starts_with("missing IPv6 address on spec.podCIDRs"));
        assert!(v4(&node(json!(["fd00::/64"]))).starts_with("no IPv4 pod CIDR"));
        assert!(v6(&node(json!(["10.244.1.0/24"]))).starts_with("missing IPv6 address"));
        assert_eq!(v4(&node(json!(["10.244.1.1/24"]))), "pod CIDR 10.244.1.1/24 has host bits set");
        assert_eq!(v6(&node(json!(["fd00::1/64"]))), "IPv6 pod CIDR fd00::1/64 has host bits set");
        assert_eq!(v4(&node(json!(["10.244.1.0/33"]))), "bad pod CIDR \"10.244.1.0/33\"");
        assert_eq!(v6(&node(json!(["fd00::/129"]))), "bad IPv6 pod CIDR \"fd00::/129\"");
    }

    #[test]
    fn a_half_lacking_both_annotations_is_refused_for_the_one_its_family_reads_first() {
        let names = AnnotationNames::new(crate::annotations::DEFAULT_PREFIX).unwrap();
        let node = json!({"metadata": {"annotations": {}}, "spec": {"podCIDRs": ["10.244.1.0/24", "fd00::/64"]}});
        let ann = annotations(&node).unwrap();
        let said = half::<Ipv4Net>(&names, &ann, &node).unwrap_err().to_string();
        assert_eq!(said, "no flannel.alpha.coreos.com/backend-data annotation");
        let said = half::<Ipv6Net>(&names, &ann, &node).unwrap_err().to_string();
        assert_eq!(said, "no flannel.alpha.coreos.com/public-ipv6 annotation (IPv6 is on)");
    }
}
