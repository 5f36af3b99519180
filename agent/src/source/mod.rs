//! Sources of desired state: the nodes file, the Kubernetes API and etcd.
//! Each one sends complete [`Desired`](crate::peer::Desired) views to the
//! run loop and nothing else; none of them touches the dataplane. A source
//! sends only what it read in full, so an unreachable control plane never
//! looks like "no peers".
mod appeared;
pub mod etcd;
mod etcd_config;
pub mod etcd_settings;
pub mod etcd_tls;
pub mod flannel_rules;
pub mod kube;
pub mod leases;
pub mod node_error;
mod node_half;
pub mod nodes_file;
mod own_lease;
pub mod peer_record;
mod retry;
pub mod subnet_range;

use ipnet::{Ipv4Net, Ipv6Net};

use crate::peer::Half;

/// What this node publishes about itself once its VTEP is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalVtep {
    pub vni: u32,
    /// `flannel.<VNI>` (published as `backend-data` and `public-ip`);
    /// `None` in an IPv6-only network.
    pub v4: Option<Half<Ipv4Net>>,
    /// `flannel-v6.<VNI>` when IPv6 is on (published as `backend-v6-data`
    /// and `public-ipv6`).
    pub v6: Option<Half<Ipv6Net>>,
}
