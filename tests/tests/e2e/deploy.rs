//! The manifests in deploy/ say what the README and the issue promise.
use std::{collections::BTreeSet, path::PathBuf, process::Command};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

fn deploy(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(name)
}

fn docs(name: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(deploy(name))?;
    serde_yaml_ng::Deserializer::from_str(&text).map(|d| Value::deserialize(d).context(name.to_string())).collect()
}

#[test]
fn daemonset_is_hostnetwork_unprivileged_pinned_and_minimal() -> Result<()> {
    let ds = docs("base/daemonset.yaml")?.remove(0);
    assert_eq!(ds["kind"], "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let all: Vec<&Value> =
        spec["containers"].as_array().into_iter().chain(spec["initContainers"].as_array()).flatten().collect();
    for c in &all {
        let image = c["image"].as_str().unwrap_or_default();
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        assert!(!tag.is_empty() && tag != "latest" && !tag.contains('/'), "image {image} is not pinned to a version");
    }
    let agent = &spec["containers"][0];
    let sc = &agent["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["add"], serde_json::json!(["BPF", "NET_ADMIN", "PERFMON"]));
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let paths: BTreeSet<&str> =
        spec["volumes"].as_array().into_iter().flatten().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    for p in ["/sys/fs/bpf", "/var/lib/edgevx", "/run/flannel", "/run/edgevx/netns"] {
        assert!(paths.contains(p), "no hostPath {p}");
    }
    assert!(spec["volumes"].as_array().into_iter().flatten().any(|v| v["configMap"]["name"] == "edgevx-cfg"));
    let env = agent["env"].as_array().context("env")?;
    assert!(env.iter().any(|e| e["name"] == "NODE_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    Ok(())
}

/// Every manifest in deploy/ and deploy/base/ (the kustomize base), as
/// (file, document).
fn all_manifests() -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for dir in ["", "base"] {
        for entry in std::fs::read_dir(deploy(dir))? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if path.extension().is_some_and(|e| e == "yaml") && name != "kustomization.yaml" {
                let name = if dir.is_empty() { name } else { format!("{dir}/{name}") };
                out.extend(docs(&name)?.into_iter().map(|d| (name.clone(), d)));
            }
        }
    }
    Ok(out)
}

#[test]
fn everything_lives_in_edgevxs_own_namespace() -> Result<()> {
    // deleting kube-flannel's manifest deletes its namespace and all in it
    let all = all_manifests()?;
    let ns = all.iter().find(|(_, d)| d["kind"] == "Namespace").context("no Namespace in deploy/")?;
    assert_eq!((ns.0.as_str(), &ns.1["metadata"]["name"]), ("base/namespace.yaml", &Value::from("kube-edgevx")));
    let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
    let mut namespaced = 0;
    for (file, d) in &all {
        let kind = d["kind"].as_str().unwrap_or_default();
        if cluster_scoped.contains(&kind) {
            assert!(d["metadata"]["namespace"].is_null(), "{file}: {kind} is cluster-scoped");
        } else {
            assert_eq!(d["metadata"]["namespace"], "kube-edgevx", "{file}: {kind} {}", d["metadata"]["name"]);
            namespaced += 1;
        }
    }
    assert!(namespaced >= 3, "the DaemonSet, ServiceAccount and ConfigMap: {namespaced}");
    let binding = all.iter().find(|(_, d)| d["kind"] == "ClusterRoleBinding").context("no ClusterRoleBinding")?;
    assert_eq!(binding.1["subjects"][0]["namespace"], "kube-edgevx");
    Ok(())
}

#[test]
fn the_bpffs_is_the_hosts_and_apparmor_allows_pinning_in_it() -> Result<()> {
    let ds = docs("base/daemonset.yaml")?.remove(0);
    let spec = &ds["spec"]["template"]["spec"];
    let agent = &spec["containers"][0];
    // the profile is stated, not left to the runtime
    let profile = agent["securityContext"]["appArmorProfile"]["type"].as_str().context("no appArmorProfile")?;
    let volume = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["hostPath"]["path"] == "/sys/fs/bpf")
        .context("no hostPath /sys/fs/bpf")?;
    let mount = agent["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == volume["name"])
        .context("the bpffs volume is not mounted")?;
    let mount_path = mount["mountPath"].as_str().context("mountPath")?;
    // the runtime's default profile denies writes below /sys/fs (but cgroup)
    if profile == "RuntimeDefault" {
        assert!(!mount_path.starts_with("/sys/"), "RuntimeDefault denies pinning below {mount_path}");
    }
    let bpffs = agent["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "EDGEVX_BPFFS")
        .and_then(|e| e["value"].as_str())
        .context("no EDGEVX_BPFFS")?;
    assert!(bpffs.starts_with(&format!("{}/", mount_path.trim_end_matches('/'))), "{bpffs} not under {mount_path}");
    assert_eq!(mount["mountPropagation"], "HostToContainer");
    Ok(())
}

#[test]
fn the_rollback_pod_in_migration_md_runs_cleanup_as_the_daemonset_runs_the_agent() -> Result<()> {
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/migrating.md"))?;
    let mut pods = Vec::new();
    for block in text.split("```yaml\n").skip(1).filter_map(|b| b.split("```").next()) {
        for d in serde_yaml_ng::Deserializer::from_str(block) {
            let d = Value::deserialize(d)?;
            if d["kind"] == "Pod" {
                pods.push(d);
            }
        }
    }
    let [pod] = pods.as_slice() else { anyhow::bail!("want one Pod in migrating.md, found {}", pods.len()) };
    let ds = docs("base/daemonset.yaml")?.remove(0);
    let (ds_spec, spec) = (&ds["spec"]["template"]["spec"], &pod["spec"]);
    let (agent, cleanup) = (&ds_spec["containers"][0], &spec["containers"][0]);
    assert_eq!(pod["metadata"]["namespace"], ds["metadata"]["namespace"]);
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(cleanup["image"], agent["image"]);
    assert_eq!(cleanup["securityContext"], agent["securityContext"], "the cleanup pod must run as the agent does");
    assert_eq!(spec["securityContext"], ds_spec["securityContext"]);
    let args: Vec<&str> = cleanup["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert_eq!(args, ["cleanup", "--keep-vtep"]);
    // the same host directories at the same places, and the same --bpffs and --state-dir
    let env = |c: &Value, name: &str| {
        c["env"].as_array().into_iter().flatten().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    for name in ["EDGEVX_BPFFS", "EDGEVX_STATE_DIR"] {
        assert_eq!(env(cleanup, name), env(agent, name), "{name}");
    }
    let (ours, theirs) = (host_mounts(spec, cleanup), host_mounts(ds_spec, agent));
    assert!(ours.is_subset(&theirs), "{ours:?} not all in the DaemonSet's {theirs:?}");
    for p in ["/sys/fs/bpf", "/var/lib/edgevx", "/run/xtables.lock", "/run/edgevx/netns"] {
        assert!(ours.iter().any(|(h, _)| h == p), "the cleanup pod lacks {p}");
    }
    Ok(())
}

#[test]
fn rbac_grants_only_what_flannels_kube_manager_needs() -> Result<()> {
    let role = docs("base/rbac.yaml")?.into_iter().find(|d| d["kind"] == "ClusterRole").context("no ClusterRole")?;
    let rules: Vec<(String, String)> = role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| {
            let res: Vec<String> =
                r["resources"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
            let verbs: Vec<String> =
                r["verbs"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
            res.into_iter().flat_map(move |x| verbs.clone().into_iter().map(move |v| (x.clone(), v)))
        })
        .collect();
    let mut got = rules.clone();
    got.sort();
    let want: Vec<(String, String)> =
        [("nodes", "get"), ("nodes", "list"), ("nodes", "watch"), ("nodes/status", "patch")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    assert_eq!(got, want);
    Ok(())
}

#[test]
fn configmap_is_flannel_compatible() -> Result<()> {
    let cm = docs("base/configmap.yaml")?.remove(0);
    let net: Value = serde_json::from_str(cm["data"]["net-conf.json"].as_str().context("net-conf.json")?)?;
    assert_eq!(net["Network"], "10.244.0.0/16");
    assert_eq!(net["Backend"]["Type"], "vxlan");
    let cni: Value = serde_json::from_str(cm["data"]["cni-conf.json"].as_str().context("cni-conf.json")?)?;
    assert_eq!(cni["plugins"][0]["type"], "flannel");
    Ok(())
}

#[test]
fn systemd_settings_name_real_flags() -> Result<()> {
    let help = Command::new(edgevx_tests::edgevx_bin()).args(["run", "--help"]).output()?;
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let env = std::fs::read_to_string(deploy("edgevx.env"))?;
    for line in env.lines().map(|l| l.trim_start_matches("# ").trim()) {
        if let Some((var, _)) = line.split_once('=').filter(|(v, _)| v.starts_with("EDGEVX_")) {
            assert!(help.contains(&format!("env: {var}")), "{var} in edgevx.env is not a flag's variable");
        }
    }
    let unit = std::fs::read_to_string(deploy("edgevx.service"))?;
    assert!(unit.contains("ExecStart=/usr/local/bin/edgevx run"));
    assert!(unit.contains("EnvironmentFile=/etc/edgevx/edgevx.env"));
    // the host's bpffs, never one mounted inside the unit's private mount namespace
    let setting = |key: &str| unit.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_default();
    assert_eq!(setting("CapabilityBoundingSet"), "CAP_BPF CAP_NET_ADMIN CAP_PERFMON");
    assert_eq!(setting("AmbientCapabilities"), "CAP_BPF CAP_NET_ADMIN CAP_PERFMON");
    assert!(setting("After").contains("sys-fs-bpf.mount"));
    assert!(setting("ReadWritePaths").split(' ').any(|p| p == "/sys/fs/bpf"));
    assert_eq!(setting("RestartPreventExitStatus"), "2", "a usage error must not restart forever");
    Ok(())
}

/// Container `c`'s hostPath mounts in pod `spec`: (host path, mount path).
pub(crate) fn host_mounts(spec: &Value, c: &Value) -> BTreeSet<(String, String)> {
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let v = volumes.iter().find(|v| v["name"] == m["name"])?;
            Some((v["hostPath"]["path"].as_str()?.to_string(), m["mountPath"].as_str()?.to_string()))
        })
        .collect()
}
