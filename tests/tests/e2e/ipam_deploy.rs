//! What deploy/ ships for edgevx-ipam: the ConfigMap's conflist hands the
//! flannel CNI plugin an `ipam` block naming it, and the DaemonSet's init
//! container installs it beside the flannel plugin. Both are run, not only read;
//! so is the OpenYurt-style route (the binary named `host-local`).
use std::{fs, path::PathBuf};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    cni::SubnetEnv,
    ipam::{Call, DataDir, Plugin, edgevx_ipam_bin},
    ipam_pod::flannel_delegate_with_ipam,
};
use serde::Deserialize;
use serde_json::Value;

fn manifest(name: &str) -> Result<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(name);
    let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let first = serde_yaml_ng::Deserializer::from_str(&text).next().context("empty manifest")?;
    Value::deserialize(first).context(name.to_string())
}

#[test]
fn ipam_conflist_delegates_to_edgevx_ipam() -> Result<()> {
    let cm = manifest("base/configmap.yaml")?;
    let conflist: Value = serde_json::from_str(cm["data"]["cni-conf.json"].as_str().context("cni-conf.json")?)?;
    let flannel = &conflist["plugins"][0];
    ensure!(flannel["type"] == "flannel" && flannel["ipam"]["type"] == "edgevx-ipam", "{flannel}");
    // what the flannel plugin hands the bridge on a node, then the bridge to edgevx-ipam
    let env = SubnetEnv::parse(
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    )?;
    let data = DataDir::new("ipamdeploy")?;
    let mut ipam = flannel["ipam"].clone();
    ipam["dataDir"] = Value::String(data.0.to_string_lossy().into_owned()); // the node's /var/lib/cni/networks
    let mut delegate = flannel_delegate_with_ipam(&env, &ipam);
    delegate["cniVersion"] = conflist["cniVersion"].clone();
    let r = Call::new("ADD", "c1").pod("default", "web-0").run(Plugin::EdgevxIpam, &delegate)?;
    let ips = r.ips()?;
    ensure!(ips.len() == 1 && ips[0].to_string().starts_with("10.244.7."), "got {ips:?}");
    ensure!(r.stdout["routes"][0]["dst"] == "10.244.0.0/16", "{}", r.stdout);
    Ok(())
}

#[test]
fn ipam_init_container_installs_the_plugin() -> Result<()> {
    let ds = manifest("base/daemonset.yaml")?;
    let spec = &ds["spec"]["template"]["spec"];
    let init = spec["initContainers"].as_array().context("initContainers")?;
    let c = init
        .iter()
        .find(|c| c["command"][0] == "/usr/local/bin/edgevx-ipam")
        .context("no init container runs edgevx-ipam")?;
    ensure!(c["image"] == spec["containers"][0]["image"], "the plugin must come from the agent's own image");
    ensure!(c["args"] == serde_json::json!(["install", "/opt/cni/bin"]), "{}", c["args"]);
    let mount = c["volumeMounts"].as_array().into_iter().flatten().find(|m| m["mountPath"] == "/opt/cni/bin");
    let volume = mount.and_then(|m| {
        spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == m["name"])
            .map(|v| &v["hostPath"]["path"])
    });
    ensure!(volume == Some(&Value::from("/opt/cni/bin")), "/opt/cni/bin is not the node's: {volume:?}");

    // the same command, into a directory of ours: it copies itself, and the copy answers
    let dir = DataDir::new("ipaminstall")?;
    let out = std::process::Command::new(edgevx_ipam_bin()).arg("install").arg(&dir.0).output()?;
    ensure!(out.status.success(), "install failed: {}", String::from_utf8_lossy(&out.stderr));
    let installed = dir.0.join("edgevx-ipam");
    ensure!(fs::read(&installed)? == fs::read(edgevx_ipam_bin())?, "the installed copy differs");
    let version = std::process::Command::new(&installed).env("CNI_COMMAND", "VERSION").output()?;
    ensure!(String::from_utf8_lossy(&version.stdout).contains("supportedVersions"), "{version:?}");
    Ok(())
}

/// The OpenYurt-style route: the binary installed under the name
/// `host-local`, which the flannel plugin's delegate runs by default.
#[test]
fn ipam_installed_as_host_local_keeps_addresses() -> Result<()> {
    let dir = DataDir::new("ipamashl")?;
    let out = std::process::Command::new(edgevx_ipam_bin()).arg("install").arg(&dir.0).output()?;
    ensure!(out.status.success(), "install failed: {}", String::from_utf8_lossy(&out.stderr));
    let as_host_local = dir.0.join("host-local");
    fs::rename(dir.0.join("edgevx-ipam"), &as_host_local)?;
    // a conflist without an ipam block: the flannel plugin's delegate names host-local
    let env = SubnetEnv::parse(
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    )?;
    let data = DataDir::new("ipamashldata")?;
    let ipam = serde_json::json!({"dataDir": data.0});
    let delegate = flannel_delegate_with_ipam(&env, &ipam);
    ensure!(delegate["ipam"]["type"] == "host-local");
    let add = |id: &str| -> Result<Value> {
        let mut child = std::process::Command::new(&as_host_local)
            .env_clear()
            .envs([
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", id),
                ("CNI_NETNS", "/run/netns/x"),
                ("CNI_IFNAME", "eth0"),
            ])
            .env("CNI_ARGS", edgevx_tests::ipam::pod_args("default", "web-0"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, &serde_json::to_vec(&delegate)?)?;
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "ADD {id}: {}", String::from_utf8_lossy(&out.stdout));
        Ok(serde_json::from_slice::<Value>(&out.stdout)?["ips"][0]["address"].clone())
    };
    let first = add("sandbox-1")?;
    // a reboot: no DEL
    ensure!(add("sandbox-2")? == first, "web-0 lost {first} under the name host-local");
    Ok(())
}
