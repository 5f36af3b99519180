//! Sources of desired state: the nodes file, the Kubernetes API and etcd.
//! Each one sends complete [`Desired`] views to the run loop and nothing
//! else; none of them touches the dataplane. A source sends only what it
//! read in full, so an unreachable control plane never looks like "no peers".
pub mod etcd;
mod etcd_config;
pub mod etcd_settings;
pub mod etcd_tls;
pub mod flannel_rules;
pub mod kube;
pub mod leases;
pub mod node_error;
pub mod nodes_file;
pub mod peer_record;
pub mod subnet_range;

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    annotations::AnnotationNames,
    netconf::NetConf,
    peer::{ClusterView, Half},
};

/// One complete view from a source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    pub conf: NetConf,
    pub view: ClusterView,
}

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

/// Reads Node objects (from a file or the API) with flannel's rules.
#[derive(Clone)]
pub struct NodeReader {
    pub names: AnnotationNames,
    pub own_name: String,
    pub conf: NetConf,
}

impl NodeReader {
    pub fn desired(&self, nodes: &[Value]) -> Desired {
        let rules = flannel_rules::Rules {
            names: &self.names,
            own_name: &self.own_name,
            network: self.conf.ipv4.then_some(self.conf.network),
            network6: self.conf.ipv6.as_ref().map(|v6| v6.network),
        };
        Desired { conf: self.conf.clone(), view: rules.view(nodes) }
    }
}
