//! The Kubernetes source, flannel's kube subnet manager: Nodes are listed
//! and watched (kube-runtime's watcher, which re-lists after `410 Gone`),
//! read with flannel's rules, and our own annotations are published through
//! a strategic-merge patch on the Node's `status` subresource, as flanneld
//! publishes them.
use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{LocalVtep, flannel_rules::NodeReader};
use crate::{annotations::AnnotationNames, metrics::Watching, peer::Desired};

/// A client from `kubeconfig`, else the in-cluster service account.
/// `user_agent` matters behind OpenYurt's YurtHub, which caches responses
/// only for the user agents on its cache list.
pub async fn client(kubeconfig: Option<&Path>, user_agent: &str) -> Result<Client> {
    let mut config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(p).with_context(|| format!("cannot read kubeconfig {}", p.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {} is unusable", p.display()))?
        }
        None => Config::incluster().context("no --kubeconfig and no in-cluster service account")?,
    };
    let ua = http::HeaderValue::from_str(user_agent)
        .with_context(|| format!("user agent {user_agent:?} is not a valid header"))?;
    config.headers.push((http::header::USER_AGENT, ua));
    Client::try_from(config).context("cannot build the Kubernetes client")
}

fn node_json(node: &Node) -> Option<(String, Value)> {
    let name = node.metadata.name.clone()?;
    serde_json::to_value(node).ok().map(|v| (name, v))
}

/// Lists and watches Nodes; sends a complete view after the initial list
/// and after every change. Errors are retried by the watcher with backoff;
/// nothing is sent while the API is unreachable. `watching` is on from the
/// first full list, off after an error until the watch delivers again.
pub fn watch_nodes(
    client: Client,
    reader: NodeReader,
    tx: mpsc::Sender<Desired>,
    watching: Watching,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client);
        let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
        let mut nodes: BTreeMap<String, Value> = BTreeMap::new();
        let mut listing: BTreeMap<String, Value> = BTreeMap::new();
        let mut synced = false;
        while let Some(event) = stream.next().await {
            let send = match event {
                Ok(watcher::Event::Init) => {
                    listing.clear();
                    false
                }
                Ok(watcher::Event::InitApply(n)) => {
                    listing.extend(node_json(&n));
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    nodes = std::mem::take(&mut listing);
                    if !synced {
                        info!(nodes = nodes.len(), "Kubernetes node list synced");
                    }
                    synced = true;
                    watching.on();
                    true
                }
                Ok(watcher::Event::Apply(n)) => {
                    nodes.extend(node_json(&n));
                    if synced {
                        watching.on();
                    }
                    synced
                }
                Ok(watcher::Event::Delete(n)) => {
                    if let Some(name) = &n.metadata.name {
                        nodes.remove(name);
                    }
                    if synced {
                        watching.on();
                    }
                    synced
                }
                Err(e) => {
                    warn!("Kubernetes node watch failed, retrying: {e}");
                    watching.off();
                    false
                }
            };
            if send {
                let list: Vec<Value> = nodes.values().cloned().collect();
                if tx.send(reader.desired(&list)).await.is_err() {
                    return;
                }
            }
        }
    })
}

/// flannel's vxlan backend data, byte for byte as Go's `json.Marshal` of
/// `vxlanLeaseAttrs` writes it: `VNI` first, the MAC lowercase.
pub fn backend_data(vni: u32, mac: crate::mac::VtepMac) -> String {
    format!("{{\"VNI\":{vni},\"VtepMAC\":\"{mac}\"}}")
}

/// The annotations flanneld publishes for a vxlan node; in dual-stack also
/// `backend-v6-data` and `public-ipv6`, in the same patch, since kernel
/// flannel nodes skip a node whose IPv6 half is missing. IPv6-only
/// publishes only those two, as flannel's `AcquireLease` does (its IPv4
/// backend data is `null` there).
pub fn wanted_annotations(
    names: &AnnotationNames,
    local: &LocalVtep,
    current: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    // public-ip(v6)-overwrite is what flanneld publishes instead of its own address
    let overwrite = |key: &String| current.get(key).filter(|o| !o.is_empty()).cloned();
    let mut want = BTreeMap::from([
        (names.subnet_manager.clone(), "true".to_string()),
        (names.backend_type.clone(), "vxlan".to_string()),
    ]);
    if let Some(v4) = &local.v4 {
        let public_ip = overwrite(&names.public_ip_overwrite).unwrap_or_else(|| v4.public_ip.to_string());
        want.insert(names.backend_data.clone(), backend_data(local.vni, v4.vtep_mac));
        want.insert(names.public_ip.clone(), public_ip);
    }
    if let Some(v6) = &local.v6 {
        let public_ipv6 = overwrite(&names.public_ipv6_overwrite).unwrap_or_else(|| v6.public_ip.to_string());
        want.insert(names.backend_v6_data.clone(), backend_data(local.vni, v6.vtep_mac));
        want.insert(names.public_ipv6.clone(), public_ipv6);
    }
    want
}

/// Whether publishing also clears the Node's NetworkUnavailable condition:
/// flanneld's `--set-node-network-unavailable` (true by default) with the
/// kube subnet manager; never in etcd mode, where etcd is the subnet manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkCondition {
    Clear,
    Leave,
}

impl From<bool> for NetworkCondition {
    /// flanneld's `--set-node-network-unavailable` value.
    fn from(set: bool) -> Self {
        if set { NetworkCondition::Clear } else { NetworkCondition::Leave }
    }
}

async fn publish_once(
    api: &Api<Node>,
    node: &str,
    names: &AnnotationNames,
    local: &LocalVtep,
    condition: NetworkCondition,
) -> Result<()> {
    let current = api.get(node).await.with_context(|| format!("cannot get node {node}"))?;
    let have = current.metadata.annotations.clone().unwrap_or_default();
    let want = wanted_annotations(names, local, &have);
    let missing: BTreeMap<&String, &String> = want.iter().filter(|(k, v)| have.get(*k) != Some(*v)).collect();
    if !missing.is_empty() {
        let patch = json!({"metadata": {"annotations": missing}});
        api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("cannot patch node {node} annotations"))?;
        info!(node, "published VTEP annotations");
    } else {
        info!(node, "VTEP annotations already up to date");
    }
    let unavailable = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
        .map(|c| c.status.as_str());
    if condition == NetworkCondition::Clear && unavailable != Some("False") {
        let now = Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{
            "type": "NetworkUnavailable",
            "status": "False",
            "reason": "FlannelIsUp",
            "message": "Flannel is running on this node (edgevx)",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }]}});
        api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("cannot set NetworkUnavailable=False on {node}"))?;
    }
    Ok(())
}

/// Publishes our annotations whenever the local VTEP changes, and clears
/// NetworkUnavailable or not (`condition`; in etcd mode
/// [`NetworkCondition::Leave`], for F5 CIS and whatever else reads flannel's
/// annotations). Patches only what differs; retries with backoff (1 s
/// doubling to 30 s) until the API accepts it, so an offline node publishes
/// when the API returns.
pub fn publish(
    client: Client,
    node: String,
    names: AnnotationNames,
    mut local: watch::Receiver<Option<LocalVtep>>,
    condition: NetworkCondition,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client);
        loop {
            let Some(vtep) = local.borrow_and_update().clone() else {
                if local.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let mut delays = super::retry::delays(Duration::from_secs(1), Duration::from_secs(30));
            loop {
                match publish_once(&api, &node, &names, &vtep, condition).await {
                    Ok(()) => break,
                    Err(e) => {
                        let backoff = delays.next().unwrap_or(Duration::from_secs(30));
                        warn!("publishing node annotations failed, retrying in {backoff:?}: {e:#}");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            r = local.changed() => { if r.is_err() { return; } break; }
                        }
                    }
                }
            }
            if local.has_changed().unwrap_or(false) {
                continue;
            }
            if local.changed().await.is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::DEFAULT_PREFIX;

    fn v4() -> crate::peer::Half<ipnet::Ipv4Net> {
        crate::peer::Half {
            vtep_mac: "02:aa:00:00:00:01".parse().unwrap(),
            public_ip: "198.18.0.1".parse().unwrap(),
            subnet: "10.244.1.0/24".parse().unwrap(),
        }
    }

    fn v6() -> crate::peer::Half<ipnet::Ipv6Net> {
        crate::peer::Half {
            vtep_mac: "02:BB:00:00:00:0A".parse().unwrap(),
            public_ip: "FD00:198:18:0:0::1".parse().unwrap(),
            subnet: "fd00:10:244:1::/64".parse().unwrap(),
        }
    }

    #[test]
    fn ipv6_only_publishes_no_ipv4_annotation() {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        let local = LocalVtep { vni: 1, v4: None, v6: Some(v6()) };
        // a stale IPv4 pair from an earlier run is left as it is, as flannel leaves it
        let current = BTreeMap::from([(names.public_ip.clone(), "198.18.0.1".to_string())]);
        let want = wanted_annotations(&names, &local, &current);
        let keys: Vec<&str> = want.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "flannel.alpha.coreos.com/backend-type",
                "flannel.alpha.coreos.com/backend-v6-data",
                "flannel.alpha.coreos.com/kube-subnet-manager",
                "flannel.alpha.coreos.com/public-ipv6",
            ]
        );
        assert_eq!(want["flannel.alpha.coreos.com/backend-v6-data"], r#"{"VNI":1,"VtepMAC":"02:bb:00:00:00:0a"}"#);
    }

    #[test]
    fn publishes_flannel_annotations_and_honours_overwrite() {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        let local = LocalVtep { vni: 1, v4: Some(v4()), v6: None };
        let want = wanted_annotations(&names, &local, &BTreeMap::new());
        assert_eq!(want["flannel.alpha.coreos.com/backend-data"], r#"{"VNI":1,"VtepMAC":"02:aa:00:00:00:01"}"#);
        assert_eq!(want["flannel.alpha.coreos.com/public-ip"], "198.18.0.1");
        assert_eq!(want["flannel.alpha.coreos.com/kube-subnet-manager"], "true");
        assert_eq!(want["flannel.alpha.coreos.com/backend-type"], "vxlan");
        let current =
            BTreeMap::from([("flannel.alpha.coreos.com/public-ip-overwrite".to_string(), "203.0.113.9".to_string())]);
        assert_eq!(wanted_annotations(&names, &local, &current)["flannel.alpha.coreos.com/public-ip"], "203.0.113.9");
    }

    #[test]
    fn dual_stack_publishes_flannels_v6_annotations() {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        let local = LocalVtep { vni: 4096, v4: Some(v4()), v6: Some(v6()) };
        let want = wanted_annotations(&names, &local, &BTreeMap::new());
        assert_eq!(want.len(), 6);
        assert_eq!(want["flannel.alpha.coreos.com/backend-v6-data"], r#"{"VNI":4096,"VtepMAC":"02:bb:00:00:00:0a"}"#);
        assert_eq!(want["flannel.alpha.coreos.com/public-ipv6"], "fd00:198:18::1", "RFC 5952, as Go prints it");
        assert_eq!(want["flannel.alpha.coreos.com/backend-data"], r#"{"VNI":4096,"VtepMAC":"02:aa:00:00:00:01"}"#);
        let current = BTreeMap::from([
            ("flannel.alpha.coreos.com/public-ipv6-overwrite".to_string(), "2001:db8::9".to_string()),
            ("flannel.alpha.coreos.com/public-ip-overwrite".to_string(), String::new()),
        ]);
        let want = wanted_annotations(&names, &local, &current);
        assert_eq!(want["flannel.alpha.coreos.com/public-ipv6"], "2001:db8::9");
        assert_eq!(want["flannel.alpha.coreos.com/public-ip"], "198.18.0.1", "an empty overwrite is no overwrite");
    }

    #[test]
    fn without_v6_the_v6_annotations_are_left_alone() {
        let names = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        let local = LocalVtep { vni: 1, v4: Some(v4()), v6: None };
        let current = BTreeMap::from([(names.public_ipv6.clone(), "fd00::1".to_string())]);
        let want = wanted_annotations(&names, &local, &current);
        assert!(!want.contains_key(&names.public_ipv6) && !want.contains_key(&names.backend_v6_data));
    }
}
