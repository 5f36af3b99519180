//! Sources of desired state. Each turns what it reads into Kubernetes Node
//! objects (as JSON); `flannel_rules` turns those into a `ClusterView`.
//! Sources never touch the dataplane.
pub mod flannel_rules;
pub mod nodes_file;
