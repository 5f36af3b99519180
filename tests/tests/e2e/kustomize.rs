//! deploy/'s kustomize base and overlays, rendered by `kubectl kustomize`
//! as `kubectl apply -k` renders them, and checked for what each promises
//! (deploy/base/kustomization.yaml and deploy/overlays/*/kustomization.yaml).
//!
//! The renderer is `$EDGEVX_KUBECTL kustomize`: `cargo xtask test` sets it to
//! Debian's kubectl (kustomize v2.0.3), the same on every machine. With
//! `EDGEVX_KUBECTL_NEW` naming a second kubectl (say one with kustomize v5),
//! every render is also made with that one and must be the same objects.
//! No cluster and no network: `kubectl kustomize` only reads the files.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

const NAMESPACE: &str = "kube-edgevx";
const OVERLAYS: [&str; 4] = ["overlays/kube", "overlays/etcd-tls", "overlays/openyurt", "overlays/before-1.30"];
/// The overlays that choose a source (the others change something else).
const MODES: [&str; 3] = ["overlays/kube", "overlays/etcd-tls", "overlays/openyurt"];
const BEFORE_1_30: &str = "overlays/before-1.30";
/// Kubernetes' recommended labels (kubernetes.io, "Recommended Labels").
const RECOMMENDED_LABELS: [&str; 6] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
];
const CLUSTER_SCOPED: [&str; 3] = ["Namespace", "ClusterRole", "ClusterRoleBinding"];

fn deploy(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(dir)
}

/// kubectl: `EDGEVX_KUBECTL` (set by `cargo xtask test`, from Debian's
/// kubernetes-client). Never one from PATH: what it renders depends on its
/// kustomize, and the test must render the same everywhere.
fn kubectl() -> Result<PathBuf> {
    match std::env::var_os("EDGEVX_KUBECTL") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => bail!(
            "EDGEVX_KUBECTL is not set: run the tests with `cargo xtask test` (it fetches Debian's kubectl), \
             or set EDGEVX_KUBECTL to that kubectl"
        ),
    }
}

fn parse(text: &str, what: &str) -> Result<Vec<Value>> {
    let docs: Result<Vec<Value>> = serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).with_context(|| format!("{what}: not YAML")))
        .collect();
    Ok(docs?.into_iter().filter(|d| !d.is_null()).collect())
}

fn render_with(kubectl: &Path, dir: &Path) -> Result<Vec<Value>> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("cannot run {}", kubectl.display()))?;
    ensure!(
        out.status.success(),
        "`{} kustomize {}` failed:\n{}",
        kubectl.display(),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8(out.stdout).context("kustomize wrote non-UTF-8")?, &format!("{} rendered", dir.display()))
}

/// The objects `kubectl kustomize <dir>` renders, in its order, the same
/// with both kubectls.
fn render_path(dir: &Path) -> Result<Vec<Value>> {
    let objects = render_with(&kubectl()?, dir)?;
    if let Some(new) = std::env::var_os("EDGEVX_KUBECTL_NEW").filter(|p| !p.is_empty()) {
        let again = render_with(Path::new(&new), dir)?;
        ensure!(
            again == objects,
            "{}: {} renders other objects than EDGEVX_KUBECTL does",
            dir.display(),
            Path::new(&new).display()
        );
    }
    Ok(objects)
}

/// The objects `kubectl kustomize deploy/<dir>` renders, in its order.
pub(crate) fn render(dir: &str) -> Result<Vec<Value>> {
    render_path(&deploy(dir))
}

/// The documents of a manifest file in deploy/, as written.
fn file(name: &str) -> Result<Vec<Value>> {
    let path = deploy(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text, name)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name}"))
}

fn daemonset(objects: &[Value]) -> Result<&Value> {
    find(objects, "DaemonSet", "edgevx")
}

fn pod_spec(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]
}

/// The agent's container.
fn agent(ds: &Value) -> Result<&Value> {
    list(&pod_spec(ds)["containers"]).into_iter().find(|c| c["name"] == "edgevx").context("no container edgevx")
}

fn list(v: &Value) -> Vec<&Value> {
    v.as_array().into_iter().flatten().collect()
}

fn args(c: &Value) -> Vec<&str> {
    list(&c["args"]).into_iter().filter_map(Value::as_str).collect()
}

/// A flag's value in `--flag=value` or `--flag value` form.
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(name) {
        Some(v) if v.starts_with('=') => Some(&v[1..]),
        Some("") => Some(args.get(i + 1).copied().unwrap_or("")),
        _ => None,
    })
}

fn has_flag(args: &[&str], name: &str) -> bool {
    args.iter().any(|a| *a == name || a.starts_with(&format!("{name}=")))
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    list(&c["env"]).into_iter().find(|e| e["name"] == name)
}

/// Whether the tolerations let the pod onto (and keep it on) a node with this
/// taint, by the scheduler's rules: an empty key with Exists matches every
/// key, an empty effect every effect; a NoExecute taint must be tolerated
/// without tolerationSeconds, or the pod is evicted once they run out.
fn tolerates(tolerations: &[&Value], key: &str, value: &str, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        let exists = t["operator"] == "Exists";
        let key_ok = match t["key"].as_str().unwrap_or("") {
            "" => exists,
            k => k == key,
        };
        let value_ok = exists || t["value"].as_str().unwrap_or("") == value;
        let effect_ok = matches!(t["effect"].as_str(), None | Some("")) || t["effect"] == effect;
        let forever = effect != "NoExecute" || t["tolerationSeconds"].is_null();
        key_ok && value_ok && effect_ok && forever
    })
}

/// The agent in the Kubernetes subnet manager's mode: no other source, and
/// net-conf.json from the ConfigMap.
fn assert_kube_mode(dir: &str, agent: &Value) -> Result<()> {
    let a = args(agent);
    for f in ["--etcd-endpoints", "--nodes-file"] {
        ensure!(!has_flag(&a, f), "deploy/{dir}: the agent gets {f}");
    }
    for v in ["EDGEVX_ETCD_ENDPOINTS", "EDGEVX_NODES_FILE"] {
        ensure!(env(agent, v).is_none(), "deploy/{dir}: the agent gets {v}");
    }
    ensure!(
        env(agent, "EDGEVX_NET_CONF").is_some_and(|e| e["value"] == "/etc/kube-flannel/net-conf.json"),
        "deploy/{dir}: EDGEVX_NET_CONF is not the ConfigMap's net-conf.json"
    );
    Ok(())
}

#[test]
fn the_base_renders_its_manifests_unchanged() -> Result<()> {
    // so `kubectl apply -k deploy/base` and `kubectl apply -f deploy/base` install the same objects
    let rendered = render("base")?;
    let mut written = Vec::new();
    for entry in std::fs::read_dir(deploy("base"))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            written.extend(file(&format!("base/{name}"))?);
        }
    }
    let key = |o: &Value| serde_json::to_string(o).unwrap_or_default();
    let (mut rendered_keys, mut written_keys): (Vec<String>, Vec<String>) =
        (rendered.iter().map(key).collect(), written.iter().map(key).collect());
    rendered_keys.sort();
    written_keys.sort();
    ensure!(rendered_keys == written_keys, "kustomize deploy/base is not the manifests in deploy/base");
    Ok(())
}

#[test]
fn every_overlay_keeps_the_bases_objects_namespace_security_context_and_pinned_images() -> Result<()> {
    let base = render("base")?;
    let base_ds = file("base/daemonset.yaml")?.into_iter().next().context("deploy/base/daemonset.yaml is empty")?;
    let base_spec = pod_spec(&base_ds);
    let ids = |objects: &[Value]| -> BTreeSet<(String, String)> {
        objects.iter().map(|o| (o["kind"].to_string(), o["metadata"]["name"].to_string())).collect()
    };
    let images = |spec: &Value| -> Vec<(String, String)> {
        list(&spec["initContainers"])
            .into_iter()
            .chain(list(&spec["containers"]))
            .map(|c| (c["name"].to_string(), c["image"].as_str().unwrap_or_default().to_string()))
            .collect()
    };
    let want_images = images(base_spec);
    for (_, image) in &want_images {
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        ensure!(!tag.is_empty() && tag != "latest" && !tag.contains('/'), "base image {image} is not pinned");
    }
    for dir in OVERLAYS {
        let objects = render(dir)?;
        ensure!(ids(&objects) == ids(&base), "deploy/{dir} renders other objects than the base");
        for o in &objects {
            let (kind, ns) = (o["kind"].as_str().unwrap_or_default(), &o["metadata"]["namespace"]);
            match CLUSTER_SCOPED.contains(&kind) {
                true => ensure!(ns.is_null(), "deploy/{dir}: {kind} is cluster-scoped"),
                false => ensure!(ns == NAMESPACE, "deploy/{dir}: {kind} {} not in {NAMESPACE}", o["metadata"]["name"]),
            }
        }
        let binding = find(&objects, "ClusterRoleBinding", "edgevx")?;
        ensure!(binding["subjects"][0]["namespace"] == NAMESPACE, "deploy/{dir}: the binding's subject moved");
        let ds = daemonset(&objects)?;
        let spec = pod_spec(ds);
        ensure!(images(spec) == want_images, "deploy/{dir}: the images are not the base's pinned ones");
        for field in ["hostNetwork", "securityContext", "serviceAccountName", "priorityClassName", "affinity"] {
            ensure!(spec[field] == base_spec[field], "deploy/{dir}: the pod's {field} is not the base's");
        }
        let (ours, theirs) = (agent(ds)?, agent(&base_ds)?);
        // before-1.30 states the same AppArmor profile by the annotation (its own test below)
        let mut want_sc = theirs["securityContext"].clone();
        if dir == BEFORE_1_30
            && let Some(sc) = want_sc.as_object_mut()
        {
            sc.remove("appArmorProfile");
        }
        ensure!(
            ours["securityContext"] == want_sc,
            "deploy/{dir}: the agent's securityContext is not the base's:\n{}",
            ours["securityContext"]
        );
        ensure!(ours["securityContext"]["privileged"] == false, "deploy/{dir}: privileged");
        ensure!(
            ours["securityContext"]["capabilities"] == json!({"add": ["BPF", "NET_ADMIN", "PERFMON"], "drop": ["ALL"]}),
            "deploy/{dir}: capabilities"
        );
        // what the agent must keep in every mode: its host directories, its settings
        // (but net-conf.json, which etcd mode takes from etcd) and its probes
        for m in list(&theirs["volumeMounts"]) {
            ensure!(list(&ours["volumeMounts"]).contains(&m), "deploy/{dir}: mount {} lost", m["name"]);
        }
        for e in list(&theirs["env"]) {
            if dir == "overlays/etcd-tls" && e["name"] == "EDGEVX_NET_CONF" {
                continue;
            }
            ensure!(list(&ours["env"]).contains(&e), "deploy/{dir}: the base's {} lost or changed", e["name"]);
        }
        for probe in ["readinessProbe", "livenessProbe"] {
            ensure!(ours[probe] == theirs[probe], "deploy/{dir}: {probe} is not the base's");
        }
    }
    Ok(())
}

#[test]
fn the_kube_overlay_is_the_base_on_the_kubernetes_subnet_manager() -> Result<()> {
    let (base, kube) = (render("base")?, render("overlays/kube")?);
    ensure!(kube == base, "deploy/overlays/kube is no longer the base as it is");
    let ds = daemonset(&kube)?;
    let agent = agent(ds)?;
    // the agent picks the Kubernetes source itself: KUBERNETES_SERVICE_HOST is set in a pod
    assert_kube_mode("overlays/kube", agent)?;
    let cfg = list(&pod_spec(ds)["volumes"])
        .into_iter()
        .find(|v| v["configMap"]["name"] == "edgevx-cfg")
        .context("no edgevx-cfg volume")?;
    ensure!(
        list(&agent["volumeMounts"]).iter().any(|m| m["name"] == cfg["name"] && m["mountPath"] == "/etc/kube-flannel/"),
        "the ConfigMap is not mounted where EDGEVX_NET_CONF points"
    );
    Ok(())
}

#[test]
fn the_etcd_tls_overlay_gives_the_agent_etcd_over_tls_from_a_read_only_secret() -> Result<()> {
    let dir = "overlays/etcd-tls";
    let objects = render(dir)?;
    let ds = daemonset(&objects)?;
    let agent = agent(ds)?;
    let a = args(agent);
    ensure!(a.first() == Some(&"run"), "the agent's args do not start with `run`: {a:?}");
    let endpoints = flag(&a, "--etcd-endpoints").context("no --etcd-endpoints")?;
    ensure!(
        !endpoints.is_empty() && endpoints.split(',').all(|e| e.trim().starts_with("https://")),
        "--etcd-endpoints {endpoints}: TLS needs https:// endpoints"
    );
    // not the Kubernetes source, and no net-conf (the agent exits 2 on --net-conf with etcd)
    for f in ["--kube", "--kube-subnet-mgr", "--nodes-file", "--net-conf", "--net-config-path"] {
        ensure!(!has_flag(&a, f), "the agent gets {f}: {a:?}");
    }
    for v in ["EDGEVX_KUBE", "EDGEVX_NODES_FILE", "EDGEVX_NET_CONF", "EDGEVX_ETCD_ENDPOINTS"] {
        ensure!(env(agent, v).is_none(), "the agent gets {v}");
    }
    // the Secret, mounted read-only, holds each file a flag names, under its key
    let secret = list(&pod_spec(ds)["volumes"])
        .into_iter()
        .find(|v| v["secret"]["secretName"] == "edgevx-etcd-tls")
        .context("no volume from the Secret edgevx-etcd-tls")?;
    let mount = list(&agent["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == secret["name"])
        .context("the edgevx-etcd-tls volume is not mounted in the agent")?;
    ensure!(mount["readOnly"] == true, "the TLS Secret is mounted writable");
    let mode = secret["secret"]["defaultMode"].as_u64().context("no defaultMode on the TLS Secret")?;
    ensure!(mode & 0o077 == 0, "the TLS key is readable beyond its owner: mode {mode:o}");
    let at = mount["mountPath"].as_str().context("mountPath")?.trim_end_matches('/');
    ensure!(secret["secret"]["items"].is_null(), "items would rename the Secret's keys");
    for (f, key) in [("--etcd-cafile", "ca.crt"), ("--etcd-certfile", "tls.crt"), ("--etcd-keyfile", "tls.key")] {
        let path = flag(&a, f).with_context(|| format!("no {f}"))?;
        ensure!(path == format!("{at}/{key}"), "{f} {path} is not the Secret's {key} (mounted at {at})");
    }
    // the base's other mounts are not shadowed by the Secret
    for m in list(&agent["volumeMounts"]).into_iter().filter(|m| m["name"] != secret["name"]) {
        let p = m["mountPath"].as_str().unwrap_or_default().trim_end_matches('/');
        ensure!(!p.starts_with(&format!("{at}/")) && p != at, "{p} is inside the Secret's mount");
    }
    Ok(())
}

#[test]
fn the_openyurt_overlay_runs_on_edge_workers_through_their_taints_and_in_yurthubs_cache() -> Result<()> {
    let dir = "overlays/openyurt";
    let objects = render(dir)?;
    let ds = daemonset(&objects)?;
    let spec = pod_spec(ds);
    ensure!(
        spec["nodeSelector"] == json!({"openyurt.io/is-edge-worker": "true"}),
        "nodeSelector: {}",
        spec["nodeSelector"]
    );
    let tolerations = list(&spec["tolerations"]);
    // yurt-manager's delegatelease controller taints an edge node whose heartbeat only
    // yurt-coordinator still relays; cut off from the cloud, the node is unreachable
    // and not ready, and the agent must stay for as long as that lasts
    for (key, value, effect) in [
        ("node.openyurt.io/unschedulable", "true", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "", "NoExecute"),
        ("node.kubernetes.io/not-ready", "", "NoExecute"),
        ("node.kubernetes.io/unreachable", "", "NoSchedule"),
        ("node.kubernetes.io/network-unavailable", "", "NoSchedule"),
    ] {
        ensure!(tolerates(&tolerations, key, value, effect), "no toleration for {key}:{effect}: {tolerations:?}");
    }
    let agent = agent(ds)?;
    assert_kube_mode(dir, agent)?;
    // YurtHub caches by the user agent's product, the part before the "/"
    let ua = env(agent, "EDGEVX_USER_AGENT").and_then(|e| e["value"].as_str()).context("no EDGEVX_USER_AGENT")?;
    ensure!(ua.split('/').next() == Some("flanneld"), "user agent {ua}: YurtHub does not cache it by default");
    Ok(())
}

#[test]
fn every_flag_and_variable_the_overlays_give_the_agent_is_one_edgevx_run_has() -> Result<()> {
    let out = Command::new(edgevx_tests::edgevx_bin()).args(["run", "--help"]).output()?;
    ensure!(out.status.success(), "edgevx run --help failed");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for dir in std::iter::once("base").chain(OVERLAYS) {
        let objects = render(dir)?;
        let agent = agent(daemonset(&objects)?)?;
        let a = args(agent);
        ensure!(a.first() == Some(&"run"), "deploy/{dir}: the agent's args do not start with `run`");
        for f in a.iter().filter(|f| f.starts_with("--")) {
            let name = f.split('=').next().unwrap_or_default();
            ensure!(help.contains(&format!("{name} ")), "deploy/{dir}: {name} is not a flag of edgevx run");
        }
        for e in list(&agent["env"]) {
            let name = e["name"].as_str().unwrap_or_default();
            if name.starts_with("EDGEVX_") {
                ensure!(help.contains(&format!("env: {name}=")), "deploy/{dir}: {name} is not a flag's variable");
            }
        }
    }
    Ok(())
}

/// Whether every `matchLabels`-style pair in `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels[k] == *v))
}

#[test]
fn the_monitoring_directory_scrapes_the_base_daemonsets_pods_in_their_namespace() -> Result<()> {
    let base = render("base")?;
    let ds = daemonset(&base)?;
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    let ports: Vec<&str> = list(&agent(ds)?["ports"]).into_iter().filter_map(|p| p["name"].as_str()).collect();
    let objects = render("monitoring")?;
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    ensure!(
        kinds == BTreeSet::from(["PodMonitor", "PrometheusRule", "Service"]),
        "deploy/monitoring renders {kinds:?}"
    );
    for o in &objects {
        // not kube-flannel: migration step 4 deletes it, and what is in it
        ensure!(
            o["metadata"]["namespace"] == NAMESPACE,
            "deploy/monitoring: {} {} is not in {NAMESPACE}",
            o["kind"],
            o["metadata"]["name"]
        );
    }

    let svc = find(&objects, "Service", "edgevx-metrics")?;
    ensure!(svc["spec"]["clusterIP"] == "None", "the metrics Service is not headless");
    ensure!(selects(&svc["spec"]["selector"], pod_labels), "the metrics Service does not select the agent's pods");
    for p in list(&svc["spec"]["ports"]) {
        let target = p["targetPort"].as_str().context("the metrics Service's targetPort is not a port name")?;
        ensure!(ports.contains(&target), "the metrics Service targets {target}, not a port of the agent's: {ports:?}");
    }

    let pm = find(&objects, "PodMonitor", "edgevx")?;
    ensure!(
        selects(&pm["spec"]["selector"]["matchLabels"], pod_labels),
        "the PodMonitor does not select the agent's pods"
    );
    let endpoints = list(&pm["spec"]["podMetricsEndpoints"]);
    ensure!(!endpoints.is_empty(), "the PodMonitor scrapes nothing");
    for e in endpoints {
        let port = e["port"].as_str().unwrap_or_default();
        ensure!(ports.contains(&port), "the PodMonitor scrapes port {port:?}, not one of the agent's: {ports:?}");
        ensure!(e["path"] == "/metrics", "the PodMonitor scrapes {}", e["path"]);
    }
    // the job the rules match (up{job="edgevx"}): the pods' label named by jobLabel
    let job_label = pm["spec"]["jobLabel"].as_str().context("the PodMonitor has no jobLabel")?;
    ensure!(pod_labels[job_label] == "edgevx", "the pods' {job_label} label is not \"edgevx\", the rules' job");

    let rule = find(&objects, "PrometheusRule", "edgevx")?;
    let text = serde_json::to_string(&rule["spec"])?;
    ensure!(!text.contains("$("), "an unsubstituted $(...) in the rendered rules");
    ensure!(text.contains(r#"up{job=\"edgevx\"}"#), "the rules do not read the PodMonitor's job");
    // kube-state-metrics' DaemonSet series for this DaemonSet, wherever the rules read them
    let ksm = format!(
        r#"{{namespace=\"{}\", daemonset=\"{}\"}}"#,
        ds["metadata"]["namespace"].as_str().unwrap_or_default(),
        ds["metadata"]["name"].as_str().unwrap_or_default()
    );
    ensure!(
        text.matches("kube_daemonset_").count() == text.matches(&ksm).count(),
        "a kube_daemonset_ series not {ksm}"
    );
    ensure!(text.contains("kube_daemonset_"), "the rules read no kube-state-metrics DaemonSet status");
    Ok(())
}

/// The AppArmor profile as the pre-1.30 annotation spells it
/// (container.apparmor.security.beta.kubernetes.io/<container>).
fn apparmor_annotation(profile: &Value) -> Result<String> {
    Ok(match profile["type"].as_str() {
        Some("RuntimeDefault") => "runtime/default".into(),
        Some("Unconfined") => "unconfined".into(),
        Some("Localhost") => format!("localhost/{}", profile["localhostProfile"].as_str().context("localhostProfile")?),
        _ => bail!("not an AppArmor profile: {profile}"),
    })
}

/// A kustomization of the test's own under target/ (kustomize v2.0.3 takes
/// a base only by a relative path), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    /// `mode`'s overlay as its base, with deploy/overlays/before-1.30's
    /// patch copied in: what that overlay's comment tells an operator to write.
    fn before_1_30_over(mode: &str) -> Result<Scratch> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = root.join("target").join(format!("kustomize-{}-{}", std::process::id(), mode.replace('/', "-")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let scratch = Scratch(dir);
        std::fs::copy(
            deploy(&format!("{BEFORE_1_30}/apparmor-annotation.yaml")),
            scratch.0.join("apparmor-annotation.yaml"),
        )?;
        std::fs::write(
            scratch.0.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nbases:\n  - ../../deploy/{mode}\n\
                 patchesStrategicMerge:\n  - apparmor-annotation.yaml\n"
            ),
        )?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn before_1_30_states_the_bases_apparmor_profile_by_the_annotation_over_every_mode() -> Result<()> {
    let base_ds = file("base/daemonset.yaml")?.into_iter().next().context("deploy/base/daemonset.yaml is empty")?;
    let profile = &agent(&base_ds)?["securityContext"]["appArmorProfile"];
    let want = apparmor_annotation(profile)?;
    let key = "container.apparmor.security.beta.kubernetes.io/edgevx";
    let the_overlay = render(BEFORE_1_30)?;
    let mut renders = vec![("overlays/kube".to_string(), the_overlay)];
    for mode in MODES {
        let scratch = Scratch::before_1_30_over(mode)?;
        renders.push((mode.to_string(), render_path(&scratch.0)?));
    }
    for (mode, objects) in renders {
        let text = serde_json::to_string(&objects)?;
        // below 1.30 the API server refuses the field wherever it is
        ensure!(!text.contains("appArmorProfile"), "{mode} before 1.30: appArmorProfile is still there");
        let ds = daemonset(&objects)?;
        let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
        ensure!(annotations[key] == want.as_str(), "{mode} before 1.30: {key} is {}, want {want}", annotations[key]);
        // and nothing else changes: put the field back, take the annotation out
        let mut back = objects.clone();
        for o in back.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
            let template = &mut o["spec"]["template"];
            if let Some(a) = template["metadata"].as_object_mut() {
                a.remove("annotations");
            }
            for c in template["spec"]["containers"].as_array_mut().into_iter().flatten() {
                if c["name"] == "edgevx" {
                    c["securityContext"]["appArmorProfile"] = profile.clone();
                }
            }
        }
        ensure!(back == render(&mode)?, "{mode} before 1.30 changes more than the AppArmor profile's form");
    }
    Ok(())
}

#[test]
fn every_object_and_the_pod_carry_the_recommended_labels_with_this_release() -> Result<()> {
    // the workspace version (Cargo.toml): a release with a stale label fails here
    let version = env!("CARGO_PKG_VERSION");
    for dir in ["base", "uninstall"].into_iter().chain(OVERLAYS) {
        let objects = render(dir)?;
        // the agent's, or the uninstall's (its only object)
        let ds =
            objects.iter().find(|o| o["kind"] == "DaemonSet").with_context(|| format!("deploy/{dir}: no DaemonSet"))?;
        let labelled = objects.iter().map(|o| (o["kind"].to_string(), &o["metadata"]["labels"]));
        let template = ("the DaemonSet's pod template".to_string(), &ds["spec"]["template"]["metadata"]["labels"]);
        for (what, labels) in labelled.chain(std::iter::once(template)) {
            for l in RECOMMENDED_LABELS {
                let v = labels[l].as_str().unwrap_or_default();
                ensure!(!v.is_empty(), "deploy/{dir}: {what} has no label {l}");
            }
            ensure!(
                labels["app.kubernetes.io/version"] == version,
                "deploy/{dir}: {what} is labelled version {}, the workspace is {version}",
                labels["app.kubernetes.io/version"]
            );
        }
        // immutable: a label that changes between releases there fails the next apply
        let selector = ds["spec"]["selector"]["matchLabels"].as_object().context("no matchLabels")?;
        ensure!(!selector.contains_key("app.kubernetes.io/version"), "deploy/{dir}: the selector holds the version");
        ensure!(ds["spec"]["selector"]["matchExpressions"].is_null(), "deploy/{dir}: matchExpressions in the selector");
        for (k, v) in selector {
            ensure!(ds["spec"]["template"]["metadata"]["labels"][k] == *v, "deploy/{dir}: the pods lack {k}={v}");
        }
    }
    // the selector is the one earlier releases applied
    let ds = file("base/daemonset.yaml")?.into_iter().next().context("empty daemonset.yaml")?;
    ensure!(ds["spec"]["selector"] == json!({"matchLabels": {"app": "edgevx"}}), "the selector changed");
    Ok(())
}
