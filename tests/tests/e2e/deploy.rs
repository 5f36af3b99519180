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
    let ds = docs("daemonset.yaml")?.remove(0);
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
    assert_eq!(sc["capabilities"]["add"], serde_json::json!(["BPF", "NET_ADMIN"]));
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let paths: BTreeSet<&str> =
        spec["volumes"].as_array().into_iter().flatten().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    for p in ["/sys/fs/bpf", "/var/lib/edgevx", "/run/flannel"] {
        assert!(paths.contains(p), "no hostPath {p}");
    }
    assert!(spec["volumes"].as_array().into_iter().flatten().any(|v| v["configMap"]["name"] == "edgevx-cfg"));
    let env = agent["env"].as_array().context("env")?;
    assert!(env.iter().any(|e| e["name"] == "NODE_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    Ok(())
}

#[test]
fn rbac_grants_only_what_flannels_kube_manager_needs() -> Result<()> {
    let role = docs("rbac.yaml")?.into_iter().find(|d| d["kind"] == "ClusterRole").context("no ClusterRole")?;
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
    let cm = docs("configmap.yaml")?.remove(0);
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
    Ok(())
}
