//! Driving IPAM plugins as a runtime (or the bridge plugin, delegating)
//! drives them: `edgevx-ipam` under test, and Debian's real `host-local`
//! as the reference. An IPAM plugin touches no namespace, so these calls
//! run directly:
//!
//! ```sh
//! CNI_COMMAND=ADD CNI_CONTAINERID=ID CNI_NETNS=/run/netns/x CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni \
//!   CNI_ARGS='IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod' edgevx-ipam < net.json
//! ```
use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{cni::PLUGIN_DIR, unique};

/// The `edgevx-ipam` under test (`EDGEVX_IPAM_BIN`, else target/release/edgevx-ipam).
pub fn edgevx_ipam_bin() -> PathBuf {
    std::env::var_os("EDGEVX_IPAM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/edgevx-ipam"))
}

/// edgevx-ipam's test hook: abort right after the named write.
pub const CRASH_ENV: &str = "EDGEVX_IPAM_CRASH_AT";

/// The network name both plugins use for the store's directory.
pub const NETWORK: &str = "cbr0";

/// A CNI version both plugins speak (Debian's host-local 1.1.1 stops at 1.0.0).
pub const SHARED_VERSION: &str = "1.0.0";

/// The arm64 edgevx-ipam (`cargo xtask image --arch arm64` builds it).
pub const ARM64_IPAM_ENV: &str = "EDGEVX_ARM64_IPAM_BIN";
/// Debian's arm64 packages unpacked (their loader, libraries and CNI plugins).
pub const ARM64_SYSROOT_ENV: &str = "EDGEVX_ARM64_SYSROOT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugin {
    EdgevxIpam,
    HostLocal,
    /// The arm64 builds of the two, run by qemu-user on this machine.
    EdgevxIpamArm64,
    HostLocalArm64,
}

impl Plugin {
    pub fn bin(self) -> PathBuf {
        match self {
            Plugin::EdgevxIpam => edgevx_ipam_bin(),
            Plugin::HostLocal => Path::new(PLUGIN_DIR).join("host-local"),
            Plugin::EdgevxIpamArm64 => std::env::var_os(ARM64_IPAM_ENV).map(PathBuf::from).unwrap_or_default(),
            Plugin::HostLocalArm64 => arm64_sysroot().join(PLUGIN_DIR.trim_start_matches('/')).join("host-local"),
        }
    }

    /// The plugin's name in a network config's `type`.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::EdgevxIpam | Plugin::EdgevxIpamArm64 => "edgevx-ipam",
            Plugin::HostLocal | Plugin::HostLocalArm64 => "host-local",
        }
    }

    /// How it is started: directly, or an arm64 build through
    /// `qemu-aarch64-static -L <Debian arm64 root>` (this kernel has no
    /// binfmt_misc entry that would do it implicitly).
    fn command(self) -> Result<Command> {
        let bin = self.bin();
        ensure!(
            bin.is_file(),
            "{} is missing (cargo xtask build or image --arch arm64; Debian's containernetworking-plugins)",
            bin.display()
        );
        Ok(match self {
            Plugin::EdgevxIpam | Plugin::HostLocal => Command::new(bin),
            Plugin::EdgevxIpamArm64 | Plugin::HostLocalArm64 => {
                let mut c = Command::new("qemu-aarch64-static");
                c.arg("-L").arg(arm64_sysroot()).arg(bin);
                c
            }
        })
    }
}

fn arm64_sysroot() -> PathBuf {
    std::env::var_os(ARM64_SYSROOT_ENV).map(PathBuf::from).unwrap_or_default()
}

/// A data directory (`ipam.dataDir`) removed on drop.
pub struct DataDir(pub PathBuf);

impl DataDir {
    pub fn new(tag: &str) -> Result<Self> {
        let p = std::env::temp_dir().join(unique(tag));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p)?;
        Ok(DataDir(p))
    }

    /// `<dataDir>/cbr0`, the store both plugins share.
    pub fn store(&self) -> PathBuf {
        self.0.join(NETWORK)
    }

    /// Every reservation file: address -> content.
    pub fn reservations(&self) -> Result<BTreeMap<IpAddr, String>> {
        let mut out = BTreeMap::new();
        for e in fs::read_dir(self.store())? {
            let e = e?;
            if let Some(ip) = e.file_name().to_str().and_then(|n| n.parse().ok()) {
                out.insert(ip, fs::read_to_string(e.path())?);
            }
        }
        Ok(out)
    }

    /// Every file under the store, path -> content (for before/after equality).
    pub fn snapshot(&self) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) -> Result<()> {
            for e in fs::read_dir(dir)? {
                let p = e?.path();
                if p.is_dir() {
                    walk(&p, out)?;
                } else {
                    out.insert(p.clone(), fs::read(&p)?);
                }
            }
            Ok(())
        }
        let mut out = BTreeMap::new();
        if self.store().exists() {
            walk(&self.store(), &mut out)?;
        }
        Ok(out)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The config a plugin gets: `ipam` with `ranges` and `dataDir`, plus `extra` ipam keys.
pub fn config(plugin: Plugin, version: &str, data: &DataDir, ranges: Value, extra: Value) -> Value {
    let mut ipam = json!({
        "type": plugin.name(),
        "ranges": ranges,
        "routes": [{"dst": "10.244.0.0/16"}],
        "dataDir": data.0,
    });
    if let (Some(ipam), Some(extra)) = (ipam.as_object_mut(), extra.as_object()) {
        ipam.extend(extra.clone());
    }
    json!({"cniVersion": version, "name": NETWORK, "type": "bridge", "ipam": ipam})
}

/// The one-range IPv4 set flannel hands over for node 1.
pub fn v4_ranges() -> Value {
    json!([[{"subnet": "10.244.1.0/24"}]])
}

/// CNI_ARGS as containerd sends them.
pub fn pod_args(namespace: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x")
}

/// What a plugin run printed, and whether it succeeded.
#[derive(Debug)]
pub struct Reply {
    pub ok: bool,
    pub stdout: Value,
    pub stderr: String,
}

impl Reply {
    /// The addresses of a successful ADD.
    pub fn ips(&self) -> Result<Vec<IpAddr>> {
        ensure!(self.ok, "the plugin failed: {} {}", self.stdout, self.stderr);
        let ips = self.stdout["ips"].as_array().with_context(|| format!("no ips in {}", self.stdout))?;
        ips.iter()
            .map(|ip| {
                let a = ip["address"].as_str().context("no address")?;
                let (addr, _) = a.split_once('/').context("address without prefix")?;
                addr.parse().with_context(|| format!("bad address {a}"))
            })
            .collect()
    }

    /// The CNI error code of a failed run.
    pub fn code(&self) -> Option<u64> {
        (!self.ok).then(|| self.stdout["code"].as_u64()).flatten()
    }
}

/// One invocation: the runtime's environment for `command`.
pub struct Call<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// CNI_ARGS; None leaves it unset.
    pub args: Option<String>,
    pub env: Vec<(&'a str, String)>,
    /// What the plugin runs through (e.g. `nsenter -t PID -m --`, for a
    /// store in a private mount namespace); empty: run directly.
    pub via: Vec<String>,
}

impl<'a> Call<'a> {
    pub fn new(command: &'a str, container_id: &'a str) -> Self {
        Call { command, container_id, ifname: "eth0", args: None, env: Vec::new(), via: Vec::new() }
    }

    pub fn pod(mut self, namespace: &str, name: &str) -> Self {
        self.args = Some(pod_args(namespace, name));
        self
    }

    /// CNI_IFNAME other than eth0 (a second interface, as Multus adds).
    pub fn ifname(mut self, ifname: &'a str) -> Self {
        self.ifname = ifname;
        self
    }

    pub fn run(&self, plugin: Plugin, config: &Value) -> Result<Reply> {
        self.run_raw(plugin, &serde_json::to_vec(config)?)
    }

    pub fn run_raw(&self, plugin: Plugin, stdin: &[u8]) -> Result<Reply> {
        let mut cmd = plugin.command()?;
        if let Some((first, rest)) = self.via.split_first() {
            let direct = cmd;
            cmd = Command::new(first);
            cmd.args(rest).arg(direct.get_program()).args(direct.get_args());
        }
        cmd.env_clear()
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_NETNS", format!("/run/netns/{}", self.container_id))
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_PATH", PLUGIN_DIR);
        if let Some(a) = &self.args {
            cmd.env("CNI_ARGS", a);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {}", plugin.bin().display()))?;
        child.stdin.take().context("no stdin")?.write_all(stdin)?;
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let stdout = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).with_context(|| format!("{plugin:?} printed no JSON: {text:?}"))?
        };
        Ok(Reply { ok: out.status.success(), stdout, stderr: String::from_utf8_lossy(&out.stderr).into_owned() })
    }
}

/// ADD for pod `namespace/name` as container `id`; its addresses.
pub fn add(plugin: Plugin, config: &Value, id: &str, namespace: &str, name: &str) -> Result<Vec<IpAddr>> {
    add_on(plugin, config, id, "eth0", namespace, name)
}

/// ADD of interface `ifname` of container `id`, for pod `namespace/name`.
pub fn add_on(
    plugin: Plugin,
    config: &Value,
    id: &str,
    ifname: &str,
    namespace: &str,
    name: &str,
) -> Result<Vec<IpAddr>> {
    let r = Call::new("ADD", id).ifname(ifname).pod(namespace, name).run(plugin, config)?;
    r.ips().with_context(|| format!("{plugin:?} ADD {id} {ifname} ({namespace}/{name})"))
}

/// DEL of container `id` (eth0), which must succeed.
pub fn del(plugin: Plugin, config: &Value, id: &str) -> Result<()> {
    del_on(plugin, config, id, "eth0")
}

/// DEL of interface `ifname` of container `id`, which must succeed.
pub fn del_on(plugin: Plugin, config: &Value, id: &str, ifname: &str) -> Result<()> {
    let r = Call::new("DEL", id).ifname(ifname).run(plugin, config)?;
    if !r.ok {
        bail!("{plugin:?} DEL {id} {ifname} failed: {} {}", r.stdout, r.stderr);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_carries_the_ipam_block() {
        let d = DataDir::new("cfg").unwrap();
        let c = config(Plugin::HostLocal, "1.0.0", &d, v4_ranges(), json!({"retain": "0s"}));
        assert_eq!(c["ipam"]["type"], "host-local");
        assert_eq!(c["ipam"]["retain"], "0s");
        assert_eq!(c["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
    }
}
