//! The desired-state model every source produces: our own node and its peers.
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::{family::Family, mac::VtepMac, netconf::NetConf};

/// A remote node: its IPv4 VTEP, its IPv6 VTEP, or both (dual-stack).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub node: String,
    /// The peer's IPv4 half (`public-ip`, `backend-data`, the IPv4 pod
    /// CIDR); `None` only in an IPv6-only network (`EnableIPv4: false`).
    /// Flattened, so the peer lists and views of earlier versions load.
    #[serde(flatten)]
    pub v4: Option<Half<Ipv4Net>>,
    /// The peer may send any inner source, not only addresses of `subnet`:
    /// an external VTEP that forwards client traffic without SNAT (an F5
    /// BIG-IP). Set only by this node's operator (`--any-inner-source`,
    /// [`crate::exempt`]), never by the peer's own entry: a source always
    /// gives `false`.
    #[serde(default)]
    pub any_inner_source: bool,
    /// When the peer's entry appeared, as its source orders them: the
    /// Node's `metadata.creationTimestamp` (Unix seconds, set by the API
    /// server) or the etcd key's create revision; `None` when the source
    /// does not say (a nodes file without timestamps, a cache of an
    /// earlier version). Settles a pod CIDR or a name claimed twice: the
    /// first entry keeps it ([`crate::reconcile::select`]). Compared only
    /// within one source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appeared: Option<i64>,
    /// The peer's IPv6 half when IPv6 is on (`EnableIPv6`): carried by its
    /// own `flannel-v6.<VNI>` device, with its own MAC.
    #[serde(default)]
    pub v6: Option<Half<Ipv6Net>>,
}

/// One family's VTEP of a node and the pod subnet behind it: a peer's
/// (`public-ip(v6)`, `backend(-v6)-data`, the pod CIDR; in etcd, `PublicIP`
/// or `PublicIPv6`, `BackendData` or `BackendV6Data` and the key's subnet
/// parts), or our own as the dataplane programs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Half<N: Family> {
    pub subnet: N,
    pub public_ip: N::Addr,
    pub vtep_mac: VtepMac,
}

/// A family a peer can have a half of.
pub trait PeerHalf: Family {
    /// `peer`'s half of this family.
    fn of_peer(peer: &Peer) -> Option<&Half<Self>>;
}

impl PeerHalf for Ipv4Net {
    fn of_peer(peer: &Peer) -> Option<&Half<Self>> {
        peer.v4.as_ref()
    }
}

impl PeerHalf for Ipv6Net {
    fn of_peer(peer: &Peer) -> Option<&Half<Self>> {
        peer.v6.as_ref()
    }
}

impl Peer {
    /// The peer's half of the family `N`.
    pub fn half<N: PeerHalf>(&self) -> Option<&Half<N>> {
        N::of_peer(self)
    }
}

/// What the cluster says about this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnNode {
    /// Our IPv4 pod CIDR (`None` in an IPv6-only network).
    pub subnet: Option<Ipv4Net>,
    /// The VtepMAC in our own `backend-data`, if it parses.
    pub published_mac: Option<VtepMac>,
    /// `node-public-ip`: the address to use as our VTEP source.
    pub node_public_ip: Option<Ipv4Addr>,
    /// Dual-stack: our IPv6 pod CIDR (`None` when IPv6 is off).
    #[serde(default)]
    pub subnet6: Option<Ipv6Net>,
    /// The VtepMAC in our own `backend-v6-data`, if it parses.
    #[serde(default)]
    pub published_mac6: Option<VtepMac>,
    /// `node-public-ipv6`; in etcd mode the `PublicIPv6` our lease
    /// publishes, so the IPv6 VTEP sends from it.
    #[serde(default)]
    pub node_public_ipv6: Option<Ipv6Addr>,
}

/// A node that was not turned into a peer, and why; logged by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub node: String,
    pub reason: String,
}

/// One complete view from a source: the network config and the peers read
/// with it (from Nodes, or etcd leases). A source sends only what it read
/// in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    pub conf: NetConf,
    pub view: ClusterView,
}

/// One interpretation of a whole node list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// `None` while our own node is missing or unusable.
    pub own: Option<OwnNode>,
    /// Why `own` is `None`.
    pub own_problem: Option<String>,
    pub peers: Vec<Peer>,
    /// Malformed nodes (warned about).
    pub rejected: Vec<Rejection>,
    /// Nodes flannel's rules say to skip, e.g. not vxlan (logged at debug).
    pub ignored: Vec<Rejection>,
    /// Peers taken without their IPv6 half, and why (warned about): the
    /// half is well formed but no IPv6 VTEP can be it. flannel programs
    /// such a half; edgevx keeps only the peer's IPv4 half.
    #[serde(default)]
    pub partial: Vec<Rejection>,
    /// Nodes whose own entry asks to be exempt from the inner-source check
    /// (the annotation `edgevx.io/any-inner-source`, the lease field
    /// `EdgevxAnyInnerSource`), which is ignored: warned about once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub self_exempt: Vec<Rejection>,
}

impl Peer {
    /// An IPv4 peer (no IPv6 half).
    pub fn v4(node: &str, subnet: Ipv4Net, public_ip: Ipv4Addr, vtep_mac: VtepMac) -> Self {
        Peer {
            node: node.to_string(),
            v4: Some(Half { subnet, public_ip, vtep_mac }),
            any_inner_source: false,
            appeared: None,
            v6: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_saved_before_ipv6_only_still_load() {
        let old = r#"{"node":"a","subnet":"10.244.2.0/24","public_ip":"198.18.0.2","vtep_mac":"02:00:00:00:00:02"}"#;
        let p: Peer = serde_json::from_str(old).unwrap();
        let mac = "02:00:00:00:00:02".parse().unwrap();
        assert_eq!(p, Peer::v4("a", "10.244.2.0/24".parse().unwrap(), "198.18.0.2".parse().unwrap(), mac));
        assert_eq!(serde_json::from_str::<Peer>(&serde_json::to_string(&p).unwrap()).unwrap(), p);
        let v6_only = Peer { v4: None, ..p };
        let text = serde_json::to_string(&v6_only).unwrap();
        assert!(!text.contains("subnet"), "{text}");
        assert_eq!(serde_json::from_str::<Peer>(&text).unwrap(), v6_only);
    }
}
