//! Why a Node is not read as a peer (or as this node): the reason a
//! rejection carries in the view and in `edgevx status`. The words are
//! flannel's where flannel has them.
use std::net::IpAddr;

use ipnet::{Ipv4Net, Ipv6Net};

use super::peer_record::RecordProblem;
use crate::{family::Family, mac::MacError};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("annotation {0} is not a string")]
    AnnotationNotAString(String),
    #[error("metadata.annotations is not a map")]
    AnnotationsNotAMap,
    #[error("no {0} annotation")]
    NoAnnotation(String),
    #[error("no {0} annotation (IPv6 is on)")]
    NoIpv6Annotation(String),
    #[error("pod cidr not assigned (spec.podCIDR and spec.podCIDRs are empty)")]
    PodCidrNotAssigned,
    #[error("bad pod CIDR {0:?}")]
    BadPodCidr(String),
    #[error("pod CIDR {0} has host bits set")]
    PodCidrHostBits(String),
    #[error("no IPv4 pod CIDR in {0:?}")]
    NoIpv4PodCidr(Vec<String>),
    #[error("missing IPv6 address on spec.podCIDRs (IPv6 is on), has {0:?}")]
    NoIpv6PodCidr(Vec<String>),
    #[error("bad IPv6 pod CIDR {0:?}")]
    BadIpv6PodCidr(String),
    #[error("IPv6 pod CIDR {0} has host bits set")]
    Ipv6PodCidrHostBits(String),
    /// `what` names the annotation: `backend-data` or `backend-v6-data`.
    #[error("{what} VtepMAC is not a string: {data}")]
    MacNotAString { what: &'static str, data: String },
    #[error("{what} is not JSON ({error}): {data:?}")]
    BackendDataNotJson { what: &'static str, error: String, data: String },
    #[error("{what} has no VtepMAC: {data}")]
    NoMac { what: &'static str, data: String },
    #[error("{what} has a bad VtepMAC: {error}")]
    BadMac { what: &'static str, error: MacError },
    #[error("bad {what} {text:?} (want an {family} address)")]
    BadAddress { what: &'static str, text: String, family: &'static str },
    /// A peer record the checks refuse; `parts` names the annotation and
    /// pod CIDR it came from.
    #[error("{parts}: {problem}")]
    Record { parts: &'static str, problem: RecordProblem },
    #[error("pod CIDR {subnet} is outside the network {network}")]
    OutsideNetwork { subnet: Ipv4Net, network: Ipv4Net },
    /// flannel's AcquireLease words it so.
    #[error(
        "subnet {:?} specified in the flannel net config doesn't contain {:?} IPv6 PodCIDR of the {node:?} node",
        network.to_string(),
        subnet.to_string()
    )]
    Ipv6OutsideNetwork { network: Ipv6Net, subnet: Ipv6Net, node: String },
}

/// The address of the family `N` in `text`; `what` names the annotation.
pub(super) fn parse_ip<N: Family>(what: &'static str, text: &str) -> Result<N::Addr, NodeError> {
    let family = N::NAME;
    text.parse::<IpAddr>().ok().and_then(N::of).ok_or_else(|| NodeError::BadAddress {
        what,
        text: text.to_string(),
        family,
    })
}
