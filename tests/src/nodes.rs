//! Node lists as `kubectl get nodes -o json` prints them, with flannel's
//! annotations, for the agents' `--nodes-file`.
use std::{fs, path::Path};

use anyhow::Result;
use serde_json::{Value, json};

use crate::topo::{node_name, subnet, underlay_ip};

const P: &str = "flannel.alpha.coreos.com";

/// A node as flanneld (or edgevx) publishes it.
pub fn flannel_node(i: u8, mac: Option<&str>) -> Value {
    let mut ann = json!({
        format!("{P}/kube-subnet-manager"): "true",
        format!("{P}/backend-type"): "vxlan",
        format!("{P}/public-ip"): underlay_ip(i).to_string(),
    });
    if let Some(mac) = mac {
        ann[format!("{P}/backend-data")] = json!(format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name(i), "annotations": ann},
        "spec": {"podCIDR": subnet(i), "podCIDRs": [subnet(i)]},
    })
}

pub fn node_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
}

/// Writes the list the way an editor saving a file would (temp + rename).
pub fn write(path: &Path, list: &Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(list)?)?;
    fs::rename(&tmp, path)?;
    Ok(())
}
