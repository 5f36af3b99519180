//! The image `cargo xtask image` builds, run the way deploy/base/daemonset.yaml
//! runs it. podman takes everything from the DaemonSet's agent container:
//! its image name, command and args, its environment, its securityContext
//! (capabilities, privilege escalation, seccomp and AppArmor, mapped to
//! podman's options; a setting the DaemonSet leaves out is the runtime's
//! default, as on a node) and its mounts, each hostPath being the test
//! node's own directory. The container shares the node's network namespace
//! (hostNetwork). A DaemonSet setting this file cannot map fails the test,
//! naming it.
//!
//! The image is the archive in `EDGEVX_IMAGE_ARCHIVE` (set by `cargo xtask
//! test`, which builds it), else `target/image/edgevx-<version>-<arch>.oci.tar`.
//! podman keeps its images and containers in a directory of the test's own,
//! removed at the end, so the machine's container storage is never touched.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    kube_proxy::{KubeProxy, Mode, Proto, Service},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, pod_ip},
    traffic::{BackgroundPing, ping, wait_reachable},
    unique,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{KERNEL_MAC, MIB, testpeer};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The YAML documents of a file in deploy/.
fn deploy_docs(name: &str) -> Result<Vec<Value>> {
    let path = repo("deploy").join(name);
    let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).with_context(|| format!("{} is not YAML", path.display())))
        .collect()
}

/// The image archive under test.
pub(crate) fn archive() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("EDGEVX_IMAGE_ARCHIVE") {
        return Ok(PathBuf::from(path));
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no image architecture for {other}"),
    };
    let path = repo(&format!("target/image/edgevx-{}-{arch}.oci.tar", env!("CARGO_PKG_VERSION")));
    ensure!(path.is_file(), "no image: set EDGEVX_IMAGE_ARCHIVE or run `cargo xtask image` (no {})", path.display());
    Ok(path)
}

/// Which seccomp profile a run uses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seccomp {
    /// What the DaemonSet states.
    AsStated,
    /// The runtime's own default, as if the DaemonSet stated nothing.
    RuntimeDefault,
}

/// The DaemonSet's agent container, as podman arguments for one test node.
pub(crate) struct AgentPod {
    pub(crate) image: String,
    /// `podman run` options: security, environment, mounts, entrypoint.
    options: Vec<String>,
    /// The arguments after the image (the container's `args`).
    args: Vec<String>,
}

impl AgentPod {
    /// Maps the DaemonSet onto `host`. `nodes_dir` holds the nodes file the
    /// test gives the agent in place of the Kubernetes API.
    pub(crate) fn for_node(host: &Host, nodes_dir: &Path, seccomp: Seccomp) -> Result<Self> {
        let mut pod = Self::from_manifest("base/daemonset.yaml", "containers", "edgevx", host, seccomp)?;
        // Test-only: the nodes file stands in for the API server the kubelet
        // points the agent at (KUBERNETES_SERVICE_HOST), and the test node has
        // no default route for the agent to find its interface by.
        pod.options.push(format!("--volume={}:/etc/edgevx-test:ro", nodes_dir.display()));
        pod.options.push("--env=EDGEVX_NODES_FILE=/etc/edgevx-test/nodes.json".into());
        pod.options.push("--env=EDGEVX_IFACE=eth0".into());
        Ok(pod)
    }

    /// The container `name` of the DaemonSet in deploy/`file`, from its
    /// pod's `list` (`containers` or `initContainers`), mapped onto `host`.
    pub(crate) fn from_manifest(file: &str, list: &str, name: &str, host: &Host, seccomp: Seccomp) -> Result<Self> {
        let ds = deploy_docs(file)?
            .into_iter()
            .find(|d| d["kind"] == "DaemonSet")
            .with_context(|| format!("deploy/{file} has no DaemonSet"))?;
        let pod = &ds["spec"]["template"];
        let spec = &pod["spec"];
        ensure!(spec["hostNetwork"] == true, "deploy/{file} is not hostNetwork: the test's --network would lie");
        let c = spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .with_context(|| format!("deploy/{file} has no {list} entry named {name}"))?;
        let image = c["image"].as_str().with_context(|| format!("{name} names no image"))?.to_string();
        let mut options = security_options(pod, c, seccomp)?;
        options.extend(env_options(c, host)?);
        options.extend(mount_options(spec, c, host)?);
        // Kubernetes' command replaces the image's entrypoint, its args the image's cmd
        if let Some(command) = c["command"].as_array() {
            options.push(format!("--entrypoint={}", serde_json::to_string(command)?));
        }
        let args = strings(&c["args"])?;
        Ok(AgentPod { image, options, args })
    }
}

fn strings(v: &Value) -> Result<Vec<String>> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().map(str::to_string).with_context(|| format!("{s} is not a string")))
        .collect()
}

/// The container's securityContext (and the pod's, for the profiles) as
/// podman options. Every key must be mapped here, or the test fails.
fn security_options(pod: &Value, c: &Value, seccomp: Seccomp) -> Result<Vec<String>> {
    let sc = &c["securityContext"];
    let pod_sc = &pod["spec"]["securityContext"];
    let mut opts = Vec::new();
    for (key, value) in sc.as_object().into_iter().flatten() {
        match (key.as_str(), value) {
            ("privileged", Value::Bool(false)) | ("allowPrivilegeEscalation", Value::Bool(true)) => {}
            ("privileged", Value::Bool(true)) => opts.push("--privileged".into()),
            ("allowPrivilegeEscalation", Value::Bool(false)) => opts.push("--security-opt=no-new-privileges".into()),
            ("readOnlyRootFilesystem", Value::Bool(ro)) => {
                if *ro {
                    opts.push("--read-only".into());
                }
            }
            ("capabilities", caps) => {
                for (k, flag) in [("drop", "--cap-drop"), ("add", "--cap-add")] {
                    let list = strings(&caps[k])?;
                    if !list.is_empty() {
                        opts.push(format!("{flag}={}", list.join(",")));
                    }
                }
            }
            ("seccompProfile" | "appArmorProfile", _) => {}
            (key, value) => bail!("securityContext.{key}: {value} has no podman mapping in tests/tests/e2e/image.rs"),
        }
    }
    if let Some(keys) = pod_sc.as_object().map(|o| o.keys().filter(|k| !k.ends_with("Profile")).collect::<Vec<_>>()) {
        ensure!(
            keys.is_empty(),
            "the pod's securityContext {keys:?} has no podman mapping in tests/tests/e2e/image.rs"
        );
    }
    if let Some(annotations) = pod["metadata"]["annotations"].as_object() {
        let old = annotations.keys().find(|k| k.contains("apparmor") || k.contains("seccomp"));
        ensure!(old.is_none(), "annotation {old:?} has no podman mapping in tests/tests/e2e/image.rs");
    }
    // the container's profile wins over the pod's; neither means the runtime's default
    let profile = |key: &str| if sc[key].is_null() { &pod_sc[key] } else { &sc[key] };
    let seccomp_profile = profile("seccompProfile");
    match (seccomp, seccomp_profile["type"].as_str()) {
        (Seccomp::RuntimeDefault, _) | (_, None | Some("RuntimeDefault")) => {}
        (Seccomp::AsStated, Some("Unconfined")) => opts.push("--security-opt=seccomp=unconfined".into()),
        (Seccomp::AsStated, Some("Localhost")) => {
            // what the node holds at /var/lib/kubelet/seccomp/<localhostProfile>
            let name = seccomp_profile["localhostProfile"].as_str().context("a Localhost profile names no file")?;
            let file = repo("deploy/seccomp").join(name);
            ensure!(file.is_file(), "the DaemonSet's seccomp profile {name} is not in deploy/seccomp/");
            opts.push(format!("--security-opt=seccomp={}", file.display()));
        }
        (_, Some(other)) => bail!("seccompProfile type {other} has no podman mapping"),
    }
    let apparmor = profile("appArmorProfile");
    match apparmor["type"].as_str() {
        None | Some("RuntimeDefault") => {}
        Some("Unconfined") => opts.push("--security-opt=apparmor=unconfined".into()),
        Some("Localhost") => {
            let name = apparmor["localhostProfile"].as_str().context("a Localhost AppArmor profile names none")?;
            opts.push(format!("--security-opt=apparmor={name}"));
        }
        Some(other) => bail!("appArmorProfile type {other} has no podman mapping"),
    }
    Ok(opts)
}

/// The container's environment; fieldRefs resolved as the kubelet would.
fn env_options(c: &Value, host: &Host) -> Result<Vec<String>> {
    let mut opts = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().context("an env entry without a name")?;
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => host.name(),
                _ => bail!("env {name}: {} has no mapping in tests/tests/e2e/image.rs", e["valueFrom"]),
            }
        };
        opts.push(format!("--env={name}={value}"));
    }
    Ok(opts)
}

/// Where a hostPath of the DaemonSet is on a test node.
fn node_path(host: &Host, host_path: &str) -> Result<PathBuf> {
    Ok(match host_path {
        // the node's bpffs, mounted by the test as a host mounts /sys/fs/bpf
        "/sys/fs/bpf" => host.bpffs_dir(),
        "/var/lib/edgevx" => host.state_dir(),
        "/run/flannel" => host.dir.join("run-flannel"),
        "/run/xtables.lock" => host.dir.join("xtables.lock"),
        // the host's own: an `edgevx cleanup` or agent run in the node by `ip netns
        // exec` must see the container's lock, as on a real node
        "/run/edgevx/netns" => PathBuf::from("/run/edgevx/netns"),
        other => bail!("hostPath {other} has no test-node path in tests/tests/e2e/image.rs"),
    })
}

/// The container's volumeMounts as podman `--volume`s.
fn mount_options(spec: &Value, c: &Value, host: &Host) -> Result<Vec<String>> {
    let volumes: BTreeMap<&str, &Value> =
        spec["volumes"].as_array().into_iter().flatten().filter_map(|v| v["name"].as_str().map(|n| (n, v))).collect();
    let mut opts = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().context("a volumeMount without a name")?;
        let target = m["mountPath"].as_str().with_context(|| format!("volumeMount {name} has no mountPath"))?;
        ensure!(m["subPath"].is_null(), "volumeMount {name}: subPath has no mapping here");
        let volume = volumes.get(name).with_context(|| format!("volumeMount {name} names no volume"))?;
        let source = if let Some(hp) = volume["hostPath"].as_object() {
            let path = hp.get("path").and_then(Value::as_str).context("a hostPath without a path")?;
            let at = node_path(host, path)?;
            match hp.get("type").and_then(Value::as_str).unwrap_or("") {
                "DirectoryOrCreate" => fs::create_dir_all(&at)?,
                "FileOrCreate" if !at.exists() => drop(fs::File::create(&at)?),
                "Directory" => ensure!(at.is_dir(), "hostPath {path} must be a directory: {}", at.display()),
                "FileOrCreate" | "" => {}
                other => bail!("hostPath type {other} has no mapping here"),
            }
            at
        } else if let Some(cm) = volume["configMap"]["name"].as_str() {
            config_map_dir(cm, host)?
        } else {
            bail!("volume {name} is neither a hostPath nor a configMap: no mapping here");
        };
        let mut flags = vec![if m["readOnly"] == true { "ro" } else { "rw" }];
        flags.push(match m["mountPropagation"].as_str() {
            None | Some("None") => "rprivate",
            Some("HostToContainer") => "rslave",
            Some("Bidirectional") => "rshared",
            Some(other) => bail!("mountPropagation {other} has no mapping here"),
        });
        opts.push(format!("--volume={}:{target}:{}", source.display(), flags.join(",")));
    }
    Ok(opts)
}

/// A configMap from deploy/, as the kubelet mounts it: one file per key.
fn config_map_dir(name: &str, host: &Host) -> Result<PathBuf> {
    let cm = deploy_docs("base/configmap.yaml")?
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
        .with_context(|| format!("deploy/base/configmap.yaml has no ConfigMap {name}"))?;
    let dir = host.dir.join(format!("configmap-{name}"));
    fs::create_dir_all(&dir)?;
    for (key, value) in cm["data"].as_object().into_iter().flatten() {
        fs::write(dir.join(key), value.as_str().with_context(|| format!("{name}/{key} is not a string"))?)?;
    }
    Ok(dir)
}

/// podman with the options that work on this machine
/// (measured: crun fails on this kind of machine), its storage in a directory of its own.
pub(crate) struct Podman {
    dir: PathBuf,
}

impl Podman {
    pub(crate) fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("podman"));
        fs::create_dir_all(&dir)?;
        Ok(Podman { dir })
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .args(["--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager=cgroupfs"])
            .args(["--events-backend=file"]);
        c
    }

    pub(crate) fn output(&self, args: &[&str]) -> Result<Output> {
        self.cmd().args(args).output().with_context(|| format!("cannot run podman {args:?}"))
    }

    pub(crate) fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        ensure!(out.status.success(), "podman {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Loads the archive; its image must be the one the DaemonSet names.
    pub(crate) fn load(&self, archive: &Path, want: &str) -> Result<()> {
        self.run(&["load", "--quiet", "--input", &archive.to_string_lossy()])?;
        ensure!(
            self.output(&["image", "exists", want])?.status.success(),
            "{} does not hold {want}, the image deploy/base/daemonset.yaml names: {}",
            archive.display(),
            self.run(&["images", "--format", "{{.Repository}}:{{.Tag}}"])?.trim()
        );
        Ok(())
    }

    /// `podman run` of the agent pod in `node`'s network namespace, with
    /// `args` in place of the container's args if given.
    pub(crate) fn command(&self, pod: &AgentPod, node: &Netns, args: Option<&[&str]>) -> Vec<String> {
        let mut all: Vec<String> = vec![format!("--network=ns:/run/netns/{}", node.name)];
        // not the DaemonSet's: podman cannot raise these limits here (platform.md)
        all.extend(["--ulimit=nofile=1024:1024".into(), "--ulimit=nproc=1024:1024".into()]);
        all.extend(pod.options.iter().cloned());
        all.push(pod.image.clone());
        match args {
            Some(args) => all.extend(args.iter().map(|s| s.to_string())),
            None => all.extend(pod.args.iter().cloned()),
        }
        all
    }

    /// Starts the agent pod detached.
    pub(crate) fn start(&self, pod: &AgentPod, node: &Netns) -> Result<Container<'_>> {
        let name = unique("agent");
        let mut args = vec!["run".to_string(), "--detach".into(), format!("--name={name}")];
        args.extend(self.command(pod, node, None));
        eprintln!("podman {}", args.join(" "));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args)?;
        Ok(Container { podman: self, name })
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.output(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.output(&["rmi", "--all", "--force"]);
        // anything podman left mounted under its directory goes before the directory
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = self.dir.to_string_lossy().into_owned();
        for at in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|p| p.starts_with(&prefix)) {
            let _ = Command::new("umount").arg("-l").arg(at).output();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A container of the agent pod, removed on drop.
pub(crate) struct Container<'a> {
    podman: &'a Podman,
    name: String,
}

impl Container<'_> {
    fn logs(&self) -> String {
        self.podman
            .output(&["logs", &self.name])
            .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
            .unwrap_or_default()
    }

    fn state(&self) -> Result<(String, i64)> {
        let out = self.podman.run(&["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", &self.name])?;
        let (status, code) = out.trim().split_once(' ').with_context(|| format!("podman inspect said {out:?}"))?;
        Ok((status.to_string(), code.parse()?))
    }

    /// Waits until the log holds `needle`; fails at once if the container exits.
    pub(crate) fn wait_log(&self, needle: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.logs().contains(needle) {
                return Ok(());
            }
            let (status, code) = self.state()?;
            ensure!(status == "running", "the container is {status} ({code}) before {needle:?}:\n{}", self.logs());
            ensure!(Instant::now() < deadline, "no {needle:?} in the container's log after 30 s:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's /proc/<pid>/status, as the host sees it.
    fn proc_status(&self) -> Result<String> {
        let pid = self.podman.run(&["inspect", "--format", "{{.State.Pid}}", &self.name])?;
        Ok(fs::read_to_string(format!("/proc/{}/status", pid.trim()))?)
    }

    fn proc_limits(&self) -> Result<String> {
        let pid = self.podman.run(&["inspect", "--format", "{{.State.Pid}}", &self.name])?;
        Ok(fs::read_to_string(format!("/proc/{}/limits", pid.trim()))?)
    }

    /// What the agent's maps and programs would charge to RLIMIT_MEMLOCK on
    /// a kernel before 5.11: the `memlock` of each one it holds, once per id.
    fn bpf_memlock(&self) -> Result<u64> {
        let pid = self.podman.run(&["inspect", "--format", "{{.State.Pid}}", &self.name])?;
        let mut seen = BTreeMap::new();
        for entry in fs::read_dir(format!("/proc/{}/fdinfo", pid.trim()))? {
            let info = fs::read_to_string(entry?.path()).unwrap_or_default();
            let id = info.lines().find(|l| l.starts_with("map_id:") || l.starts_with("prog_id:"));
            let bytes = field(&info, "memlock:").parse::<u64>().ok();
            if let (Some(id), Some(bytes)) = (id, bytes) {
                seen.insert(id.split_whitespace().collect::<Vec<_>>().join(" "), bytes);
            }
        }
        Ok(seen.values().sum())
    }

    /// `edgevx status --json` inside the container, as `kubectl exec` runs it.
    fn status(&self) -> Result<Value> {
        let out = self.podman.output(&["exec", &self.name, "/usr/local/bin/edgevx", "status", "--json"])?;
        edgevx_tests::agent::status_document(&out)
    }

    /// SIGTERM, as the kubelet stops a pod, then removal.
    pub(crate) fn stop(self) -> Result<()> {
        self.podman.run(&["stop", "--time", "10", &self.name])?;
        Ok(())
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.podman.output(&["rm", "--force", "--time", "0", &self.name]);
    }
}

/// The field of /proc/<pid>/status named `key`.
fn field<'s>(status: &'s str, key: &str) -> &'s str {
    status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or("")
}

/// Two nodes: node 1 for the containerised agent (its bpffs mounted, a nodes
/// file naming both), node 2 a kernel flannel node, configured once the
/// agent's MAC is known.
pub(crate) fn cluster() -> Result<(Cluster, PathBuf)> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes_dir = c.dir.join("nodes");
    fs::create_dir_all(&nodes_dir)?;
    write(&nodes_dir.join("nodes.json"), &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    Ok((c, nodes_dir))
}

#[test]
fn the_image_runs_as_the_daemonset_runs_it_and_pods_talk_to_a_kernel_flannel_node() -> Result<()> {
    run_as_the_daemonset(&[], "adopted pinned link")
}

/// The same through the clsact fallback of kernels without TCX (forced
/// here), which most edge nodes take, under the same seccomp profile.
#[test]
fn the_image_runs_as_the_daemonset_runs_it_with_clsact_filters() -> Result<()> {
    run_as_the_daemonset(&["--env=EDGEVX_TC_ATTACH=clsact"], "replaced the clsact filter in place")
}

/// The pod with `extra` podman options; `adopted` is what a replacement pod
/// logs when it takes over the running dataplane.
fn run_as_the_daemonset(extra: &[&str], adopted: &str) -> Result<()> {
    let podman = Podman::new()?;
    let (c, nodes_dir) = cluster()?;
    let (n1, host1, host2) = (&c.host(1).ns, c.host(1), c.host(2));
    let mut pod = AgentPod::for_node(host1, &nodes_dir, Seccomp::AsStated)?;
    pod.options.extend(extra.iter().map(|s| s.to_string()));
    podman.load(&archive()?, &pod.image)?;
    // kube-proxy's rules share POSTROUTING and FORWARD with edgevx's jumps:
    // the image's iptables must read them (its extensions) to check its own
    let service = Service {
        cluster_ip: "10.96.0.10".parse()?,
        port: 53,
        proto: Proto::Udp,
        node_port: Some(30053),
        backend: (pod_ip(1), 53),
    };
    KubeProxy::install(n1, Mode::Iptables, &[service])?;

    let agent = podman.start(&pod, n1)?;
    agent.wait_log("dataplane up")?;
    // the DaemonSet's privileges, as the kernel sees them
    let proc = agent.proc_status()?;
    // CAP_NET_ADMIN is bit 12, CAP_PERFMON bit 38, CAP_BPF bit 39
    for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(field(&proc, key), "000000c000001000", "{key} of the containerised agent");
    }
    assert_eq!(field(&proc, "NoNewPrivs:"), "1", "allowPrivilegeEscalation: false");
    assert_eq!(field(&proc, "Seccomp:"), "2", "no seccomp filter on the agent");
    let memlock = agent.proc_limits()?.lines().find(|l| l.starts_with("Max locked memory")).unwrap_or("").to_string();
    eprintln!("the containerised agent's RLIMIT_MEMLOCK: {memlock}");
    eprintln!("its maps and programs would charge {} KiB to it before Linux 5.11", agent.bpf_memlock()? / 1024);

    let status = agent.status()?;
    let mac = status["vtep_mac"].as_str().context("status has no vtep_mac")?.to_string();
    host2.kernel_vtep(KERNEL_MAC)?;
    host2.kernel_add_peer(1, &mac)?;
    let (p1, p2) = (&host1.pod, &host2.pod);
    wait_reachable(p1, pod_ip(2), 20)?;
    wait_reachable(p2, pod_ip(1), 20)?;
    assert_eq!(ping(p1, pod_ip(2), 10, "0.05")?, (10, 10), "ICMP containerised edgevx -> kernel");
    assert_eq!(ping(p2, pod_ip(1), 10, "0.05")?, (10, 10), "ICMP kernel -> containerised edgevx");
    testpeer().tcp_transfer(p1, p2, pod_ip(2), 16 * MIB)?;
    testpeer().tcp_transfer(p2, p1, pod_ip(1), 16 * MIB)?;

    // the firewall rules, written by the image's iptables (EDGEVX_IP_MASQ in the DaemonSet)
    let ipt = |table: &str, chain: &str| n1.run(&["iptables", "-t", table, "-S", chain]);
    let masq = ipt("nat", "EDGEVX-POSTRTG")?;
    assert!(masq.contains("-j MASQUERADE --random-fully"), "no masquerade rules:\n{masq}");
    assert!(ipt("nat", "POSTROUTING")?.contains("-j EDGEVX-POSTRTG"), "no jump to EDGEVX-POSTRTG");
    assert!(ipt("filter", "EDGEVX-FWD")?.contains("-s 10.244.0.0/16 -j ACCEPT"));
    assert!(ipt("nat", "POSTROUTING")?.contains("KUBE-POSTROUTING"), "kube-proxy's jump is gone");
    let subnet_env = fs::read_to_string(host1.dir.join("run-flannel/subnet.env"))?;
    assert!(
        subnet_env.contains("FLANNEL_SUBNET=10.244.1.") && subnet_env.contains("FLANNEL_IPMASQ=true"),
        "{subnet_env}"
    );
    // nft runs in the image too (the agent's look for kube-proxy's nftables table)
    podman.run(&["exec", &agent.name, "/usr/sbin/nft", "list", "tables"])?;

    // A new pod takes over from the pins in the host's bpffs without loss.
    let pingers = [(p2, pod_ip(1)), (p1, pod_ip(2))]
        .into_iter()
        .map(|(from, to)| BackgroundPing::start(from, to, 300, "0.01"))
        .collect::<Result<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(500));
    agent.stop()?;
    let agent = podman.start(&pod, n1)?;
    agent.wait_log("dataplane up")?;
    assert!(agent.logs().contains(adopted), "the new pod did not take over in place:\n{}", agent.logs());
    for p in pingers {
        p.expect_no_loss().context("across the pod's replacement")?;
    }
    assert_eq!(agent.status()?["vtep_mac"], mac.as_str(), "the MAC changed across the pod's replacement");

    // `edgevx cleanup` from the image, with the same privileges, takes it all away
    agent.stop()?;
    let mut run = vec!["run".to_string(), "--rm".into()];
    run.extend(podman.command(&pod, n1, Some(&["cleanup"])));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = podman.output(&run)?;
    ensure!(out.status.success(), "cleanup in the image failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(n1.ip(&["link", "show", "flannel.1"]).is_err(), "flannel.1 is still there after cleanup");
    let nat = n1.run(&["iptables", "-t", "nat", "-S"])?;
    assert!(!nat.contains("EDGEVX"), "edgevx's chains are still there after cleanup:\n{nat}");
    Ok(())
}

/// Why the DaemonSet states a profile: under the runtime's default, the same
/// pod cannot create its maps (the agent keeps retrying, never ready). This
/// fails if the runtime's default ever lets bpf() through with CAP_BPF: the
/// profile may then no longer be needed.
#[test]
fn under_the_runtimes_default_seccomp_profile_the_agent_cannot_create_its_maps() -> Result<()> {
    let podman = Podman::new()?;
    let (c, nodes_dir) = cluster()?;
    let pod = AgentPod::for_node(c.host(1), &nodes_dir, Seccomp::RuntimeDefault)?;
    podman.load(&archive()?, &pod.image)?;
    let agent = podman.start(&pod, &c.host(1).ns)?;
    let denied = "failed to create map";
    // aya's own feature probes (target `aya::…`) warn first; the line that
    // matters is the agent's, for one of its own maps.
    let agents_line = |logs: &str| logs.lines().find(|l| l.contains(denied) && !l.contains("aya::")).map(str::to_owned);
    let deadline = Instant::now() + Duration::from_secs(30);
    while agents_line(&agent.logs()).is_none() && agent.state()?.0 == "running" {
        ensure!(Instant::now() < deadline, "no {denied:?} from the agent after 30 s:\n{}", agent.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = agent.logs();
    assert!(!logs.contains("dataplane up"), "the agent ran under the runtime's default seccomp profile:\n{logs}");
    let line = agents_line(&logs).with_context(|| format!("the agent failed otherwise:\n{logs}"))?;
    assert!(line.contains("Operation not permitted"), "map creation failed, but not with EPERM: {line}");
    Ok(())
}
