//! Removing edgevx as docs/src/installing/daemonset.md says: the agent's
//! DaemonSet deleted (its programs stay pinned, and `edgevx status` says so
//! from the kernel, also as textfile metrics), then deploy/uninstall's
//! cleanup container, run from the image exactly as its DaemonSet states
//! it. Afterwards nothing of edgevx may be left in the node's kernel: no
//! pin, no program on the underlay's hooks, no VTEP, no firewall chain.
use std::{fs, path::Path};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::image::{AgentPod, Podman, Seccomp, archive, cluster};

/// Every file under `dir`, recursively (the bpffs keeps pins as files).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// `edgevx <args>` from the image with the agent container's privileges
/// and mounts (a debug pod on the node, once the agent is gone): its exit
/// code and output.
fn edgevx_in_image(
    podman: &Podman,
    pod: &AgentPod,
    ns: &edgevx_tests::netns::Netns,
    args: &[&str],
) -> Result<(i32, String)> {
    let mut run = vec!["run".to_string(), "--rm".into()];
    run.extend(podman.command(pod, ns, Some(args)));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = podman.output(&run)?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

#[test]
fn the_uninstall_daemonset_leaves_nothing_of_edgevx_in_the_nodes_kernel() -> Result<()> {
    let podman = Podman::new()?;
    let (c, nodes_dir) = cluster()?;
    let (n1, host1) = (&c.host(1).ns, c.host(1));
    let agent_pod = AgentPod::for_node(host1, &nodes_dir, Seccomp::AsStated)?;
    podman.load(&archive()?, &agent_pod.image)?;
    let agent = podman.start(&agent_pod, n1)?;
    agent.wait_log("dataplane up")?;
    let (code, out) = edgevx_in_image(&podman, &agent_pod, n1, &["status", "--json"])?;
    ensure!(code == 0, "status with the agent running exited {code}:\n{out}");
    // the running agent's release and control plane, from its lock record
    let running: Value = serde_json::from_str(&out).with_context(|| format!("status is not JSON: {out}"))?;
    assert_eq!(running["state"], "forwarding", "{out}");
    assert_eq!(running["agent_version"], running["version"], "{out}");
    let source = &running["source"];
    assert_eq!((source["name"].as_str(), source["watching"].as_bool()), (Some("nodes file"), Some(true)), "{out}");
    assert!(source["view_age_seconds"].is_u64(), "{out}");

    // `kubectl delete` of the agent's DaemonSet alone: the pinned programs stay and run
    agent.stop()?;
    let (code, out) = edgevx_in_image(&podman, &agent_pod, n1, &["status", "--json"])?;
    let status: Value = serde_json::from_str(&out).with_context(|| format!("status is not JSON: {out}"))?;
    assert_eq!(code, 3, "status of programs with no agent:\n{out}");
    assert_eq!((status["state"].as_str(), status["agent_running"].as_bool()), (Some("unmanaged"), Some(false)));
    assert_eq!(status["status_schema"], 1, "{out}");
    assert!(status["pinned"].as_array().is_some_and(|p| !p.is_empty()), "nothing pinned listed:\n{out}");
    let (code, metrics) = edgevx_in_image(&podman, &agent_pod, n1, &["status", "--prometheus"])?;
    assert_eq!(code, 3, "{metrics}");
    for line in ["edgevx_node_state{state=\"unmanaged\"} 1", "edgevx_node_agent_running 0"] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in:\n{metrics}");
    }
    // edgevx's directory on the node's bpffs (the DaemonSet's EDGEVX_BPFFS): the
    // bpffs root also holds the kernel's own progs.debug and maps.debug
    let ours = host1.bpffs_dir().join("edgevx");
    let pins_before = files_under(&ours);
    ensure!(!pins_before.is_empty(), "the agent pinned nothing: the test would prove nothing");

    // deploy/uninstall: its cleanup container, as the kubelet runs it on the node
    let cleanup =
        AgentPod::from_manifest("uninstall/daemonset.yaml", "initContainers", "cleanup", host1, Seccomp::AsStated)?;
    assert_eq!(cleanup.image, agent_pod.image, "the uninstall must run the agent's release");
    let mut run = vec!["run".to_string(), "--rm".into()];
    run.extend(podman.command(&cleanup, n1, None));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = podman.output(&run)?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "the uninstall's cleanup failed:\n{log}");
    assert!(log.contains("nothing of edgevx is pinned any more"), "{log}");

    // nothing left, as the kernel says
    let left = files_under(&ours);
    assert!(left.is_empty(), "pins left in the node's bpffs: {left:?}");
    let xdp_tc = n1.run(&["bpftool", "net", "show"])?;
    assert!(!xdp_tc.contains("edgevx"), "programs still attached in the node:\n{xdp_tc}");
    let tc = n1.run(&["tc", "filter", "show", "dev", "eth0", "ingress"])?;
    assert!(!tc.contains("edgevx"), "a clsact filter is left on eth0:\n{tc}");
    assert!(n1.ip(&["link", "show", "flannel.1"]).is_err(), "flannel.1 is still there");
    for (table, save) in [("iptables", "iptables-save"), ("ip6tables", "ip6tables-save")] {
        let rules = n1.run(&[save])?;
        assert!(!rules.contains("EDGEVX"), "{table}: edgevx's chains are left:\n{rules}");
    }
    let (code, out) = edgevx_in_image(&podman, &agent_pod, n1, &["status", "--json"])?;
    assert_eq!(code, 1, "status after the uninstall: nothing forwards, nothing is pinned:\n{out}");
    // a second run finds nothing to do and still ends clean
    let out = podman.output(&run)?;
    ensure!(out.status.success(), "a second cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// deploy/uninstall, rendered by kubectl 1.20's kustomize (and a current
/// one's when EDGEVX_KUBECTL_NEW names it), runs `edgevx cleanup` as the
/// agent runs: its image, privileges, pin and state directories, host
/// mounts and nodes; nothing else runs with privileges.
#[test]
fn the_uninstall_runs_cleanup_where_and_as_the_agent_runs() -> Result<()> {
    let objects = crate::kustomize::render("uninstall")?;
    let base = crate::kustomize::render("base")?;
    let ds_of = |objects: &[Value]| -> Result<Value> {
        objects.iter().find(|o| o["kind"] == "DaemonSet").cloned().context("no DaemonSet rendered")
    };
    let (ds, agent_ds) = (ds_of(&objects)?, ds_of(&base)?);
    assert_eq!(objects.len(), 1, "deploy/uninstall renders only its DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], agent_ds["metadata"]["namespace"]);
    let (spec, agent_spec) = (&ds["spec"]["template"]["spec"], &agent_ds["spec"]["template"]["spec"]);
    assert_eq!(spec["affinity"], agent_spec["affinity"], "not the agent's nodes");
    assert_eq!(spec["tolerations"], agent_spec["tolerations"]);
    assert_eq!(spec["hostNetwork"], true);
    let [cleanup] = spec["initContainers"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        anyhow::bail!("want one init container: {}", spec["initContainers"]);
    };
    let agent = &agent_spec["containers"][0];
    assert_eq!(cleanup["image"], agent["image"]);
    assert_eq!(cleanup["securityContext"], agent["securityContext"], "cleanup must run as the agent does");
    assert_eq!(cleanup["args"], serde_json::json!(["cleanup"]));
    let env = |c: &Value, name: &str| {
        c["env"].as_array().into_iter().flatten().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    for name in ["EDGEVX_BPFFS", "EDGEVX_STATE_DIR"] {
        assert_eq!(env(cleanup, name), env(agent, name), "{name}");
    }
    let host_mounts = crate::deploy::host_mounts;
    let (ours, theirs) = (host_mounts(spec, cleanup), host_mounts(agent_spec, agent));
    assert!(ours.is_subset(&theirs), "{ours:?} not all in the agent's {theirs:?}");
    for p in ["/sys/fs/bpf", "/var/lib/edgevx", "/run/flannel", "/run/xtables.lock", "/run/edgevx/netns"] {
        assert!(ours.iter().any(|(h, _)| h == p), "cleanup lacks {p}");
    }
    // the container that keeps the pod has no privilege at all
    for c in spec["containers"].as_array().into_iter().flatten() {
        assert_eq!(c["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]), "{c}");
        assert!(c["securityContext"]["capabilities"]["add"].is_null(), "{c}");
        assert!(c["volumeMounts"].is_null(), "{c}");
    }
    Ok(())
}
