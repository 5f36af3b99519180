//! Pods wired by the real `bridge` plugin with `edgevx-ipam` as its IPAM,
//! through the delegate config the flannel CNI plugin builds when its
//! conflist entry carries an `ipam` block (flannel-io/cni-plugin
//! flannel_linux.go `getDelegateIPAM`: the block is the base, `type`
//! defaults to host-local, `ranges` become subnet.env's subnet, `routes`
//! gain FLANNEL_NETWORK). The bridge finds `edgevx-ipam` on CNI_PATH:
//!
//! ```sh
//! ip netns exec NODE env CNI_COMMAND=ADD CNI_CONTAINERID=ID CNI_NETNS=/run/netns/POD CNI_IFNAME=eth0 \
//!   CNI_ARGS='IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0' \
//!   CNI_PATH=/path/to/edgevx-ipam-dir:/usr/lib/cni /usr/lib/cni/bridge < delegate.json
//! ```
use std::{
    io::Write,
    net::Ipv4Addr,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{
    cni::{Cidr, PLUGIN_DIR, SubnetEnv, flannel_delegate},
    ipam::{edgevx_ipam_bin, pod_args},
    netns::Netns,
};

/// The bridge delegate for a flannel conflist entry with `conflist_ipam`.
pub fn flannel_delegate_with_ipam(env: &SubnetEnv, conflist_ipam: &Value) -> Value {
    let mut delegate = flannel_delegate(env, Path::new(""));
    let mut ipam = conflist_ipam.clone();
    if ipam.get("type").is_none() {
        ipam["type"] = json!("host-local");
    }
    ipam["ranges"] = json!([[{"subnet": env.subnet.network().to_string()}]]);
    let mut routes = ipam.get("routes").and_then(Value::as_array).cloned().unwrap_or_default();
    routes.push(json!({"dst": env.network.network().to_string()}));
    ipam["routes"] = Value::Array(routes);
    delegate["ipam"] = ipam;
    delegate
}

/// CNI_PATH with edgevx-ipam's directory first.
fn cni_path() -> Result<String> {
    let bin = edgevx_ipam_bin();
    let dir = bin.parent().context("edgevx-ipam has no directory")?;
    Ok(format!("{}:{PLUGIN_DIR}", dir.display()))
}

/// The pods the offline-reboot tests run on one node: (namespace, name).
pub const NODE_PODS: [(&str, &str); 3] =
    [("default", "web-0"), ("default", "web-1"), ("kube-system", "coredns-7db6d8ff4d-x2x9q")];

/// [`NODE_PODS`] added on `node` with `config`, as the kubelet creates them
/// in sandbox generation `generation` (a reboot recreates them under new
/// sandbox IDs: the next generation).
pub fn add_node_pods(node: &Netns, config: &Value, generation: u32) -> Result<Vec<IpamPod>> {
    NODE_PODS
        .iter()
        .enumerate()
        .map(|(k, (ns, name))| {
            let netns = format!("{}q{k}g{generation}", node.name);
            IpamPod::add(node, &netns, &format!("sandbox-{generation}-{k}"), ns, name, config)
        })
        .collect()
}

/// A pod sandbox; DEL runs on drop unless the pod vanished (a reboot).
pub struct IpamPod {
    pub netns: Option<Netns>,
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub namespace: String,
    pub name: String,
    node: String,
    config: Value,
}

impl IpamPod {
    /// Sandbox `container_id` for pod `namespace/name` in namespace `netns_name` of `node`.
    pub fn add(
        node: &Netns,
        netns_name: &str,
        container_id: &str,
        namespace: &str,
        name: &str,
        config: &Value,
    ) -> Result<Self> {
        let netns = Netns::new(netns_name)?;
        let mut pod = IpamPod {
            netns: None,
            ip: Ipv4Addr::UNSPECIFIED,
            container_id: container_id.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            node: node.name.clone(),
            config: config.clone(),
        };
        pod.run("ADD", "lo", &json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}), &netns.name)?;
        let out = pod.run("ADD", "eth0", config, &netns.name)?;
        let result: Value = serde_json::from_slice(&out).context("bridge result is not JSON")?;
        let addr = result["ips"][0]["address"].as_str().with_context(|| format!("no address in {result}"))?;
        pod.ip = addr.parse::<Cidr>()?.addr;
        pod.netns = Some(netns);
        Ok(pod)
    }

    fn run(&self, command: &str, ifname: &str, config: &Value, netns: &str) -> Result<Vec<u8>> {
        let plugin = config["type"].as_str().context("config has no type")?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node])
            .arg(Path::new(PLUGIN_DIR).join(plugin))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &self.container_id)
            .env("CNI_NETNS", format!("/run/netns/{netns}"))
            .env("CNI_IFNAME", ifname)
            .env("CNI_ARGS", pod_args(&self.namespace, &self.name))
            .env("CNI_PATH", cni_path()?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {plugin}"))?;
        child.stdin.take().context("no stdin")?.write_all(&serde_json::to_vec(config)?)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "CNI {command} of {plugin} for {} ({}/{}) in {} failed: {}{}",
                self.container_id,
                self.namespace,
                self.name,
                self.node,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }

    /// The sandbox is gone with no DEL, as when its node loses power.
    pub fn vanish(mut self) {
        self.netns = None;
    }
}

impl Drop for IpamPod {
    fn drop(&mut self) {
        let Some(netns) = self.netns.take() else { return };
        let _ = self.run("DEL", "eth0", &self.config.clone(), &netns.name);
        let _ = self.run("DEL", "lo", &json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}), &netns.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_ipam_block_is_the_delegates_base() {
        let env = SubnetEnv::parse(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n",
        )
        .unwrap();
        let d = flannel_delegate_with_ipam(&env, &json!({"type": "edgevx-ipam", "dataDir": "/d", "retain": "1h"}));
        assert_eq!(d["type"], "bridge");
        assert_eq!(d["ipam"]["type"], "edgevx-ipam");
        assert_eq!(d["ipam"]["retain"], "1h");
        assert_eq!(d["ipam"]["dataDir"], "/d");
        assert_eq!(d["ipam"]["ranges"], json!([[{"subnet": "10.244.3.0/24"}]]));
        assert_eq!(d["ipam"]["routes"], json!([{"dst": "10.244.0.0/16"}]));
        assert_eq!(flannel_delegate_with_ipam(&env, &json!({}))["ipam"]["type"], "host-local");
    }
}
