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
        .find(|c| c["command"][0] == "/usr/local/bin/edgevx-ipam" && c["args"][0] == "install")
        .context("no init container runs edgevx-ipam install")?;
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

/// The conflist goes to /etc/cni/net.d/ through `edgevx-ipam install-conf`,
/// from the ConfigMap's mount, renamed into place: run here as the init
/// container runs it, over a conflist already there.
#[test]
fn ipam_init_container_installs_the_conflist_by_rename() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let ds = manifest("base/daemonset.yaml")?;
    let spec = &ds["spec"]["template"]["spec"];
    let c = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "install-cni")
        .context("no init container install-cni")?;
    ensure!(c["image"] == spec["containers"][0]["image"], "install-cni must come from the agent's image");
    ensure!(c["command"] == serde_json::json!(["/usr/local/bin/edgevx-ipam"]), "{}", c["command"]);
    let args: Vec<&str> = c["args"].as_array().context("args")?.iter().filter_map(Value::as_str).collect();
    let [verb, src, dest] = args.as_slice() else { anyhow::bail!("install-cni args: {args:?}") };
    ensure!(*verb == "install-conf", "install-cni runs {verb}");
    ensure!(*src == "/etc/kube-flannel/cni-conf.json" && *dest == "/etc/cni/net.d/10-flannel.conflist", "{args:?}");
    let mounted = |path: &str| {
        c["volumeMounts"].as_array().into_iter().flatten().any(|m| {
            let at = m["mountPath"].as_str().unwrap_or_default().trim_end_matches('/');
            path.starts_with(&format!("{at}/"))
        })
    };
    ensure!(mounted(src) && mounted(dest), "install-cni does not mount {src} and {dest}");

    // the ConfigMap's key, installed over an older conflist in a directory of ours
    let cm = manifest("base/configmap.yaml")?;
    let dir = DataDir::new("ipamconf")?;
    let (from, to) = (dir.0.join("cni-conf.json"), dir.0.join("10-flannel.conflist"));
    fs::write(&from, cm["data"]["cni-conf.json"].as_str().context("cni-conf.json")?)?;
    fs::write(&to, "{\"name\":\"old\"}")?;
    let inode = fs::metadata(&to)?.ino();
    let out = std::process::Command::new(edgevx_ipam_bin()).arg(verb).arg(&from).arg(&to).output()?;
    ensure!(out.status.success(), "install-conf failed: {}", String::from_utf8_lossy(&out.stderr));
    ensure!(fs::read(&to)? == fs::read(&from)?, "the installed conflist differs");
    ensure!(fs::metadata(&to)?.ino() != inode, "the conflist was rewritten in place, not renamed over");
    let mut left: Vec<_> = fs::read_dir(&dir.0)?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
    left.sort();
    ensure!(left == ["10-flannel.conflist", "cni-conf.json"], "left behind: {left:?}");
    Ok(())
}

/// The command line a person meets: no CNI_COMMAND prints what the plugin
/// is (without waiting on stdin), `--help` is help everywhere, an unknown
/// flag is a usage error that names it, and CNI_COMMAND=VERSION answers.
#[test]
fn ipam_command_line_follows_the_cni_conventions() -> Result<()> {
    use std::process::{Command, Stdio};
    let dir = DataDir::new("ipamcli")?;
    // stdin: what is written, then closed; without it, a pipe no one writes to or
    // closes, so a plugin that read it would hang
    let run_with = |args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>| -> Result<std::process::Output> {
        let mut child = Command::new(edgevx_ipam_bin())
            .args(args)
            .env_remove("CNI_COMMAND")
            .envs(env.iter().copied())
            .current_dir(&dir.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut pipe = child.stdin.take();
        if let (Some(bytes), Some(mut p)) = (stdin, pipe.take()) {
            std::io::Write::write_all(&mut p, bytes)?;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while child.try_wait()?.is_none() {
            if std::time::Instant::now() > deadline {
                child.kill()?;
                anyhow::bail!("edgevx-ipam {args:?} {env:?} did not exit: it waits on stdin");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(child.wait_with_output()?)
    };
    let run = |args: &[&str], env: &[(&str, &str)]| run_with(args, env, None);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    let version = env!("CARGO_PKG_VERSION");
    for env in [&[][..], &[("CNI_COMMAND", "")][..]] {
        let out = run(&[], env)?;
        ensure!(out.status.code() == Some(0), "no CNI_COMMAND {env:?}: {out:?}");
        let err = text(&out.stderr);
        let mut lines = err.lines();
        ensure!(lines.next() == Some(&*format!("CNI edgevx-ipam plugin v{version}")), "{err}");
        let versions = lines.next().and_then(|l| l.strip_prefix("CNI protocol versions supported: "));
        ensure!(versions.is_some_and(|v| v.split(", ").any(|v| v == "1.1.0")), "{err}");
        ensure!(out.stdout.is_empty(), "about text on stdout: {}", text(&out.stdout));
    }
    // a runtime's VERSION: its cniVersion on stdin (SPEC.md, VERSION), answered in kind
    let out = run_with(&[], &[("CNI_COMMAND", "VERSION")], Some(br#"{"cniVersion":"1.0.0"}"#))?;
    let answer: Value = serde_json::from_slice(&out.stdout).with_context(|| text(&out.stdout))?;
    ensure!(out.status.success() && answer["cniVersion"] == "1.0.0", "{answer}");
    ensure!(answer["supportedVersions"].as_array().is_some_and(|v| v.contains(&Value::from("1.1.0"))), "{answer}");

    for args in [&["--help"][..], &["install", "--help"], &["install-conf", "-h"]] {
        let out = run(args, &[])?;
        ensure!(out.status.code() == Some(0), "{args:?}: {out:?}");
        ensure!(text(&out.stdout).contains("edgevx-ipam install DIR"), "{args:?}: {}", text(&out.stdout));
    }
    ensure!(!dir.0.join("--help").exists() && !dir.0.join("-h").exists(), "help was taken for a directory");
    let out = run(&["install", "--bogus"], &[])?;
    ensure!(out.status.code() == Some(2), "an unknown flag: {out:?}");
    ensure!(text(&out.stderr).contains("unknown flag --bogus"), "{}", text(&out.stderr));
    ensure!(!dir.0.join("--bogus").exists(), "the flag was taken for a directory");
    let out = run(&["install"], &[])?;
    ensure!(out.status.code() == Some(2), "install without a directory: {out:?}");
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
