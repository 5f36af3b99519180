//! Pods wired by the real CNI plugins (Debian's containernetworking-plugins:
//! `bridge`, `host-local`, `loopback` in /usr/lib/cni), driven the way the
//! flannel CNI plugin drives them.
//!
//! The flannel plugin itself is not packaged here. Its work is a small,
//! documented translation, reproduced by [`flannel_delegate`]: it reads
//! subnet.env and hands the `bridge` plugin a delegate config (upstream:
//! flannel-io/cni-plugin, `flannel.go` `loadFlannelSubnetEnv` and
//! `flannel_linux.go` `doCmdAdd` / `getDelegateIPAM`). The plugins run inside
//! the node's namespace, as the container runtime runs them on the node:
//!
//! ```sh
//! ip netns exec NODE env CNI_COMMAND=ADD CNI_CONTAINERID=ID CNI_NETNS=/run/netns/POD \
//!     CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni /usr/lib/cni/bridge < delegate.json
//! ```
use std::{
    fmt, fs,
    io::Write,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    str::FromStr,
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::netns::Netns;

/// Where Debian's containernetworking-plugins puts the plugins (`CNI_PATH`).
pub const PLUGIN_DIR: &str = "/usr/lib/cni";

/// The network name of kube-flannel's `cni-conf.json`.
pub const NETWORK_NAME: &str = "cbr0";

/// An IPv4 prefix as written in subnet.env (`10.244.1.1/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    /// The prefix with its host bits cleared (what Go's `net.ParseCIDR` returns).
    pub fn network(self) -> Cidr {
        let mask = if self.len == 0 { 0 } else { u32::MAX << (32 - u32::from(self.len)) };
        Cidr { addr: Ipv4Addr::from(u32::from(self.addr) & mask), len: self.len }
    }

    pub fn contains(self, ip: Ipv4Addr) -> bool {
        Cidr { addr: ip, len: self.len }.network() == self.network()
    }
}

impl FromStr for Cidr {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (addr, len) = s.split_once('/').with_context(|| format!("{s:?} is not a prefix"))?;
        let len: u8 = len.parse().with_context(|| format!("bad prefix length in {s:?}"))?;
        ensure!(len <= 32, "bad prefix length in {s:?}");
        Ok(Cidr { addr: addr.parse().with_context(|| format!("bad address in {s:?}"))?, len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// `/run/flannel/subnet.env`, the four keys the flannel CNI plugin requires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetEnv {
    pub network: Cidr,
    /// As written: the subnet's first host address (`10.244.1.1/24`).
    pub subnet: Cidr,
    pub mtu: u32,
    /// True when the network daemon masquerades itself; the CNI plugin then
    /// asks `bridge` not to.
    pub ip_masq: bool,
}

impl SubnetEnv {
    /// Parses the file as the flannel plugin does: `KEY=VALUE` lines, unknown
    /// keys ignored, all four keys required.
    pub fn parse(text: &str) -> Result<Self> {
        let (mut network, mut subnet, mut mtu, mut ip_masq) = (None, None, None, None);
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            match key {
                "FLANNEL_NETWORK" => network = Some(value.parse()?),
                "FLANNEL_SUBNET" => subnet = Some(value.parse()?),
                "FLANNEL_MTU" => mtu = Some(value.parse().with_context(|| format!("FLANNEL_MTU={value}"))?),
                "FLANNEL_IPMASQ" => ip_masq = Some(value == "true"),
                _ => {}
            }
        }
        match (network, subnet, mtu, ip_masq) {
            (Some(network), Some(subnet), Some(mtu), Some(ip_masq)) => Ok(SubnetEnv { network, subnet, mtu, ip_masq }),
            _ => bail!("subnet.env lacks one of FLANNEL_NETWORK, FLANNEL_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ:\n{text}"),
        }
    }

    pub fn read(path: &Path) -> Result<Self> {
        Self::parse(&fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?)
    }

    /// The file as flanneld writes it.
    pub fn render(&self) -> String {
        format!(
            "FLANNEL_NETWORK={}\nFLANNEL_SUBNET={}\nFLANNEL_MTU={}\nFLANNEL_IPMASQ={}\n",
            self.network, self.subnet, self.mtu, self.ip_masq
        )
    }
}

/// The config the flannel CNI plugin passes to `bridge` for kube-flannel's
/// `cni-conf.json` (`{"type": "flannel", "delegate": {"hairpinMode": true,
/// "isDefaultGateway": true}}`), following `doCmdAdd`:
/// - `ipMasq` is the opposite of FLANNEL_IPMASQ ("if flannel is not doing
///   ipmasq, we should"), `mtu` is FLANNEL_MTU, `isGateway` is true for
///   `bridge`;
/// - `ipam` is host-local with one range, FLANNEL_SUBNET parsed as a network
///   (host bits cleared), and a route to FLANNEL_NETWORK;
/// - `bridge` is left to the plugin's default name, `cni0`.
///
/// `dataDir` keeps host-local's leases under the test's own directory.
pub fn flannel_delegate(env: &SubnetEnv, ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "isDefaultGateway": true,
        "hairpinMode": true,
        "ipMasq": !env.ip_masq,
        "mtu": env.mtu,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": env.subnet.network().to_string()}]],
            "routes": [{"dst": env.network.network().to_string()}],
            "dataDir": ipam_dir,
        },
    })
}

/// What the runtime hands the loopback plugin for every sandbox.
fn loopback_config() -> Value {
    json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"})
}

/// One plugin invocation inside the node's namespace (names of namespaces).
struct Invocation<'a> {
    node: &'a str,
    container_id: &'a str,
    pod: &'a str,
    ifname: &'a str,
}

impl Invocation<'_> {
    /// Runs `config.type` with `command` (ADD or DEL); returns its stdout.
    fn run(&self, command: &str, config: &Value) -> Result<Vec<u8>> {
        let plugin = config["type"].as_str().context("config has no type")?;
        let bin = PathBuf::from(PLUGIN_DIR).join(plugin);
        ensure!(bin.exists(), "{} is missing: install Debian's containernetworking-plugins", bin.display());
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.node])
            .arg(&bin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_NETNS", format!("/run/netns/{}", self.pod))
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_PATH", PLUGIN_DIR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {plugin}"))?;
        child.stdin.take().context("no stdin")?.write_all(&serde_json::to_vec(config)?)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            // a failing plugin prints a CNI error object on stdout
            bail!(
                "CNI {command} of {plugin} for {} in {} failed ({}): {}{}",
                self.container_id,
                self.node,
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }
}

/// A pod sandbox whose network the real plugins made; CNI DEL runs and the
/// namespace is removed on drop.
pub struct CniPod {
    pub netns: Netns,
    pub ip: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub container_id: String,
    node: String,
    config: Value,
}

impl CniPod {
    /// Creates namespace `name` and runs ADD for `lo` (loopback) and `eth0`
    /// (bridge with the flannel delegate config for `env`) in `node`.
    pub fn add(node: &Netns, name: &str, env: &SubnetEnv, ipam_dir: &Path) -> Result<Self> {
        let netns = Netns::new(name)?;
        let config = flannel_delegate(env, ipam_dir);
        let container_id = format!("{name}-sandbox");
        let lo = Invocation { node: &node.name, container_id: &container_id, pod: &netns.name, ifname: "lo" };
        lo.run("ADD", &loopback_config())?;
        let eth0 = Invocation { ifname: "eth0", ..lo };
        let result: Value = serde_json::from_slice(&eth0.run("ADD", &config)?).context("bridge result is not JSON")?;
        let (ip, gateway) = pod_address(&result)?;
        Ok(CniPod { netns, ip, gateway, container_id, node: node.name.clone(), config })
    }
}

/// The pod's IPv4 address and gateway from a CNI 1.0 result.
fn pod_address(result: &Value) -> Result<(Ipv4Addr, Ipv4Addr)> {
    let first = result["ips"].as_array().and_then(|ips| ips.first()).with_context(|| format!("no ips in {result}"))?;
    let addr: Cidr = first["address"].as_str().context("ips[0] has no address")?.parse()?;
    let gateway = first["gateway"].as_str().context("ips[0] has no gateway")?.parse()?;
    Ok((addr.addr, gateway))
}

impl Drop for CniPod {
    fn drop(&mut self) {
        // best effort: the node may be gone already, and then so is everything DEL would remove
        let del =
            Invocation { node: &self.node, container_id: &self.container_id, pod: &self.netns.name, ifname: "eth0" };
        let _ = del.run("DEL", &self.config);
        let _ = Invocation { ifname: "lo", ..del }.run("DEL", &loopback_config());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLANNELD: &str =
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

    #[test]
    fn subnet_env_round_trips() {
        let env = SubnetEnv::parse(FLANNELD).unwrap();
        assert_eq!(env.subnet.to_string(), "10.244.3.1/24");
        assert_eq!(env.subnet.network().to_string(), "10.244.3.0/24");
        assert!(env.ip_masq);
        assert_eq!(env.render(), FLANNELD);
        assert!(SubnetEnv::parse("FLANNEL_NETWORK=10.244.0.0/16\n").is_err());
    }

    #[test]
    fn delegate_is_what_the_flannel_plugin_builds() {
        let env = SubnetEnv::parse(FLANNELD).unwrap();
        let d = flannel_delegate(&env, Path::new("/tmp/ipam"));
        assert_eq!(d["type"], "bridge");
        assert_eq!(d["ipMasq"], false, "flannel masquerades, so bridge must not");
        assert_eq!(d["isGateway"], true);
        assert_eq!(d["mtu"], 1450);
        assert_eq!(d["ipam"]["ranges"][0][0]["subnet"], "10.244.3.0/24");
        assert_eq!(d["ipam"]["routes"][0]["dst"], "10.244.0.0/16");
        let no_masq = SubnetEnv { ip_masq: false, ..env };
        assert_eq!(flannel_delegate(&no_masq, Path::new("/x"))["ipMasq"], true);
    }

    #[test]
    fn result_gives_the_pod_address() {
        let r = json!({"cniVersion": "1.0.0", "ips": [{"interface": 2, "address": "10.244.3.2/24", "gateway": "10.244.3.1"}]});
        assert_eq!(pod_address(&r).unwrap(), (Ipv4Addr::new(10, 244, 3, 2), Ipv4Addr::new(10, 244, 3, 1)));
        assert!(pod_address(&json!({"ips": []})).is_err());
    }
}
