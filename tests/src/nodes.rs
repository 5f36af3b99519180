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

/// A net-conf whose Network holds tens of thousands of /24 node subnets.
pub const WIDE_NET_CONF: &str = r#"{"Network":"10.0.0.0/8","Backend":{"Type":"vxlan"}}"#;

/// `n` synthetic flannel peers for scale runs: subnet 10.<1+k/256>.<k%256>.0/24
/// (clear of the test nodes' 10.244.x.0/24), public IP 198.19.<k/256>.<k%256>,
/// a distinct VtepMAC each. Up to 60,000.
pub fn synthetic_peers(n: u32, first: u32) -> Vec<Value> {
    (first..first + n)
        .map(|k| {
            let (hi, lo) = (k / 256, k % 256);
            let mac = format!("02:5c:{:02x}:{:02x}:{:02x}:01", (k >> 16) & 0xff, hi & 0xff, lo);
            json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": format!("scale-{k}"), "annotations": {
                    format!("{P}/kube-subnet-manager"): "true",
                    format!("{P}/backend-type"): "vxlan",
                    format!("{P}/public-ip"): format!("198.19.{hi}.{lo}"),
                    format!("{P}/backend-data"): format!("{{\"VNI\":1,\"VtepMAC\":\"{mac}\"}}"),
                }},
                "spec": {"podCIDR": format!("10.{}.{lo}.0/24", 1 + hi), "podCIDRs": [format!("10.{}.{lo}.0/24", 1 + hi)]},
            })
        })
        .collect()
}

/// A dual-stack net-conf whose Networks hold tens of thousands of node
/// subnets of each family (for [`synthetic_peers_dual`]).
pub const WIDE_NET_CONF_DUAL: &str =
    r#"{"Network":"10.0.0.0/8","EnableIPv6":true,"IPv6Network":"fd00:10::/32","Backend":{"Type":"vxlan"}}"#;

/// [`synthetic_peers`] with an IPv6 half each: subnet
/// fd00:10:<1+k/256>:<k%256>::/64 (clear of the test nodes'), public IPv6
/// fd00:198:19::<k>, the same VtepMAC for both VTEPs.
pub fn synthetic_peers_dual(n: u32, first: u32) -> Vec<Value> {
    synthetic_peers(n, first)
        .into_iter()
        .zip(first..)
        .map(|(mut node, k)| {
            let (hi, lo) = (k / 256, k % 256);
            let v6 = format!("fd00:10:{:x}:{lo:x}::/64", 1 + hi);
            let ann = &mut node["metadata"]["annotations"];
            let data = ann[format!("{P}/backend-data")].clone();
            ann[format!("{P}/backend-v6-data")] = data;
            ann[format!("{P}/public-ipv6")] = json!(format!("fd00:198:19::{k:x}"));
            let v4 = node["spec"]["podCIDR"].clone();
            node["spec"]["podCIDRs"] = json!([v4, v6]);
            node
        })
        .collect()
}
