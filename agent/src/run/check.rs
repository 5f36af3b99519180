//! Everything `edgevx run` checks before it touches the host (the flags,
//! the net-conf, the kernel and the bpffs, the state files and the pins of
//! other versions), and the choice of source. [`check`] refuses what the
//! operator must change (exit code 2); [`settle`] then waits out what the
//! host fixes by itself: an interface, address or default route not there
//! yet, a bpffs not mounted yet ([`NotYet`]).
use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::warn;

use super::kernel::{self, KernelFacts};

use crate::{
    UsageError,
    annotations::AnnotationNames,
    cache::VIEW_FILE,
    cli::RunArgs,
    dataplane::{bpffs, device},
    netconf::NetConf,
    source::{etcd_settings::EtcdSettings, kube},
    state::{self, AGENT_FILE, MAC_FILE, MAC6_FILE, PEERS_FILE, StateDir},
};

/// Where desired state comes from.
#[derive(Clone)]
pub(super) enum Source {
    File(PathBuf),
    Kube(::kube::Client),
    Etcd(EtcdSettings),
}

impl Source {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Source::File(_) => "nodes file",
            Source::Kube(_) => "Kubernetes API",
            Source::Etcd(_) => "etcd",
        }
    }
}

/// What [`check`] found right, before the host's state is looked at:
/// everything of [`Checked`] but the underlay.
pub(super) struct Pending {
    args: RunArgs,
    node: String,
    conf: NetConf,
    names: AnnotationNames,
    source: Source,
    etcd_annotations: Option<::kube::Client>,
    /// `node-public-ip` and `node-public-ipv6`, as flanneld reads them first.
    stored: (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>),
    /// The last bring-up's record: its public IP chooses the underlay when
    /// nothing else can (no flag, no default route).
    recorded: Option<crate::state::AgentRecord>,
    /// This node, and whose the state dir is (another node's is not read).
    me: crate::owner::Owner,
    verdict: crate::owner::Verdict,
}

impl Pending {
    pub(super) fn source_name(&self) -> &'static str {
        self.source.name()
    }
    pub(super) fn args(&self) -> &RunArgs {
        &self.args
    }
    /// This node, and whose the state dir is.
    pub(super) fn owner(&self) -> (&crate::owner::Owner, &crate::owner::Verdict) {
        (&self.me, &self.verdict)
    }
    pub(super) fn node(&self) -> &str {
        &self.node
    }
}

/// A host state that fixes itself and is waited for: the message says what
/// is missing and which flag or record would choose otherwise.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct NotYet(pub(super) String);

/// Everything `run` needs, checked before the host is touched.
pub(super) struct Checked {
    pub(super) args: RunArgs,
    pub(super) node: String,
    pub(super) conf: NetConf,
    pub(super) names: AnnotationNames,
    /// The underlay interface's name (`--iface`, or the default route's).
    pub(super) iface: String,
    pub(super) underlay: device::Underlay,
    pub(super) source: Source,
    /// In etcd mode with Kubernetes credentials: where to publish flannel's
    /// annotations on our Node (F5 CIS reads them).
    pub(super) etcd_annotations: Option<::kube::Client>,
}

fn usage(m: String) -> anyhow::Error {
    anyhow::Error::new(UsageError(m))
}

fn existing_file(flag: &str, p: &Option<PathBuf>) -> Result<()> {
    match p {
        Some(p) if !p.is_file() => Err(usage(format!("{flag} {}: no such file", p.display()))),
        _ => Ok(()),
    }
}

async fn choose_source(args: &RunArgs) -> Result<Source> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kube = args.kube || (in_cluster && args.nodes_file.is_none() && args.etcd_endpoints.is_none());
    let chosen = [args.nodes_file.is_some(), kube, args.etcd_endpoints.is_some()].iter().filter(|b| **b).count();
    if chosen != 1 {
        return Err(usage("give exactly one source: --nodes-file, --kube or --etcd-endpoints".into()));
    }
    if let Some(path) = &args.nodes_file {
        if !path.is_file() {
            return Err(usage(format!("--nodes-file {}: no such file", path.display())));
        }
        std::fs::File::open(path).map_err(|e| usage(format!("--nodes-file {}: {e}", path.display())))?;
        return Ok(Source::File(path.clone()));
    }
    if kube {
        existing_file("--kubeconfig", &args.kubeconfig)?;
        let client =
            kube::client(args.kubeconfig.as_deref(), &args.user_agent).await.map_err(|e| usage(format!("{e:#}")))?;
        return Ok(Source::Kube(client));
    }
    let endpoints: Vec<String> = args
        .etcd_endpoints
        .iter()
        .flat_map(|e| e.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    if endpoints.is_empty() {
        return Err(usage("--etcd-endpoints is empty".into()));
    }
    for (flag, f) in [
        ("--etcd-cafile", &args.etcd_cafile),
        ("--etcd-certfile", &args.etcd_certfile),
        ("--etcd-keyfile", &args.etcd_keyfile),
    ] {
        existing_file(flag, f)?;
    }
    if args.etcd_certfile.is_some() != args.etcd_keyfile.is_some() {
        return Err(usage("--etcd-certfile and --etcd-keyfile go together".into()));
    }
    // the etcd client would refuse this at every connection attempt, in the background, forever
    let tls_flag = [
        ("--etcd-cafile", &args.etcd_cafile),
        ("--etcd-certfile", &args.etcd_certfile),
        ("--etcd-keyfile", &args.etcd_keyfile),
    ]
    .into_iter()
    .find_map(|(flag, f)| f.as_ref().map(|_| flag));
    if let (Some(flag), Some(plain)) = (tls_flag, endpoints.iter().find(|e| e.starts_with("http://"))) {
        return Err(usage(format!(
            "{flag} asks for TLS, but the etcd endpoint {plain} is plain http://: use https:// endpoints"
        )));
    }
    if args.net_conf.is_some() {
        return Err(usage(format!("--net-conf does not apply with etcd: the config is {}/config", args.etcd_prefix)));
    }
    if args.subnet_lease_renew_margin_secs >= args.subnet_lease_ttl {
        return Err(usage("--subnet-lease-renew-margin-secs must be below --subnet-lease-ttl".into()));
    }
    Ok(Source::Etcd(EtcdSettings {
        endpoints,
        prefix: args.etcd_prefix.trim_end_matches('/').to_string(),
        cafile: args.etcd_cafile.clone(),
        certfile: args.etcd_certfile.clone(),
        keyfile: args.etcd_keyfile.clone(),
        user: args.etcd_username.clone().zip(args.etcd_password.clone()),
        lease_ttl: Duration::from_secs(args.subnet_lease_ttl),
        renew_margin: Duration::from_secs(args.subnet_lease_renew_margin_secs),
    }))
}

/// The files `run` will write: none may be a symlink (a root write would
/// follow it), and their directories must be ours. Checked again at every
/// write; here so a planted link stops the agent before it changes anything.
fn check_files(args: &RunArgs) -> Result<()> {
    let state = StateDir(args.paths.state_dir.clone());
    let refuse = |e: state::StateError| usage(e.to_string());
    state.check().map_err(refuse)?;
    for name in [MAC_FILE, MAC6_FILE, PEERS_FILE, AGENT_FILE, VIEW_FILE, crate::owner::OWNER_FILE] {
        state::check_target(&state.path(name)).map_err(refuse)?;
    }
    let subnet_file = &args.subnet_file;
    state::check_target(subnet_file).map_err(|e| usage(format!("--subnet-file: {e}")))?;
    if let Some(dir) = subnet_file.parent().filter(|d| d.exists()) {
        state::check_dir(dir).map_err(|e| usage(format!("--subnet-file: {e}")))?;
    }
    Ok(())
}

pub(super) async fn check(args: RunArgs, state: &StateDir) -> Result<Pending> {
    let node = args
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| usage("--node-name (or EDGEVX_NODE_NAME / NODE_NAME) is required".into()))?;
    let names = AnnotationNames::new(&args.kube_annotation_prefix)
        .map_err(|e| usage(format!("--kube-annotation-prefix: {e}")))?;
    let source = choose_source(&args).await?;
    let etcd_annotations = match &source {
        Source::Etcd(_) if args.kubeconfig.is_some() || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            existing_file("--kubeconfig", &args.kubeconfig)?;
            let client = kube::client(args.kubeconfig.as_deref(), &args.user_agent)
                .await
                .map_err(|e| usage(format!("publishing annotations in etcd mode: {e:#}")))?;
            Some(client)
        }
        _ => None,
    };
    let conf = match &args.net_conf {
        Some(p) => NetConf::load(p).map_err(|e| usage(format!("--net-conf: {e}")))?,
        None => NetConf::default(),
    };
    crate::netfilter::check_backend(conf.nftables).map_err(|e| usage(format!("--net-conf: {e:#}")))?;
    let want = wanted(&args);
    if conf.ipv4 { super::iface::validate::<Ipv4Net>(&want) } else { super::iface::validate::<Ipv6Net>(&want) }
        .map_err(|e| usage(e.to_string()))?;
    if args.host_routing && args.bypass_netfilter {
        return Err(usage("--host-routing and --bypass-netfilter contradict each other".into()));
    }
    // always: the rule that drops broadcast and multicast VXLAN is written with it
    crate::netfilter::check_binary().map_err(|e| {
        usage(format!(
            "edgevx needs iptables, whatever the flags: it drops broadcast and multicast VXLAN with it, and \
             writes --ip-masq's and the forward rules (--iptables-forward-rules) with it: {e:#}"
        ))
    })?;
    for (flag, dir) in [("--state-dir", &args.paths.state_dir), ("--bpffs", &args.paths.bpffs)] {
        if dir.exists() && !dir.is_dir() {
            return Err(usage(format!("{flag} {} is not a directory", dir.display())));
        }
    }
    check_files(&args)?;
    // a newer edgevx's dataplane is here: leave it alone, whatever else is wrong
    // (again in settle(), for a bpffs the host mounts later)
    bpffs::no_newer_version(&args.paths.bpffs).map_err(|e| usage(e.to_string()))?;
    // last, so a mistyped flag is reported as such on any host
    let facts = KernelFacts::of_this_host(&args.paths.bpffs);
    if facts.version.is_none() {
        warn!("cannot read the kernel version; assuming it has what edgevx needs ({} or later)", kernel::minimum());
    }
    let refused: Vec<String> =
        kernel::check(&facts).iter().filter(|m| !m.fixes_itself()).map(ToString::to_string).collect();
    if !refused.is_empty() {
        return Err(usage(refused.join("\n")));
    }
    // another node's state dir (a copied image) is not read: run() moves it aside
    let me = crate::owner::Owner::this_host(&node);
    let verdict = crate::owner::examine(state, &me);
    let own_state = verdict.usable().then_some(state);
    let stored = stored_public_ip(&source, &node, &names, own_state).await;
    let recorded = match own_state.map(StateDir::load_agent).transpose() {
        Ok(r) => r.flatten(),
        Err(e) => {
            warn!("cannot read the record of the last bring-up, so it cannot choose the underlay: {e:#}");
            None
        }
    };
    Ok(Pending { args, node, conf, names, source, etcd_annotations, stored, recorded, me, verdict })
}

fn wanted(args: &RunArgs) -> super::iface::Wanted<'_> {
    super::iface::Wanted { ifaces: &args.iface, regexes: &args.iface_regex, can_reach: args.iface_can_reach }
}

/// The host's part of the checks, tried again until it holds: the bpffs
/// mounted, then the underlay chosen by flanneld's rules (or, with no flag
/// and no default route, the interface of the last bring-up's public IP).
/// `Err` is a usage error (exit 2); `Ok(Err)` a host state to wait for.
pub(super) async fn settle(p: &Pending, handle: &Handle) -> Result<std::result::Result<Checked, NotYet>> {
    if let Err(e) = bpffs::on_bpffs(&p.args.paths.bpffs) {
        return Ok(Err(NotYet(format!("{e}; waiting for the host to mount one"))));
    }
    // a bpffs mounted since check(): a newer edgevx's dataplane may be on it
    bpffs::no_newer_version(&p.args.paths.bpffs).map_err(|e| usage(e.to_string()))?;
    let recorded = p.recorded.as_ref();
    let want = wanted(&p.args);
    let (stored, stored6) = p.stored;
    // the address selection settled on stands in for --public-ip(v6); node-public-ip(v6) still beats it.
    // With IPv4 on, IPv4 chooses; an IPv6-only network chooses by flannel's IPv6 stack rules
    let chosen = if p.conf.ipv4 {
        let rec = recorded.and_then(<Ipv4Net as super::iface::ChoosingFamily>::recorded);
        let chosen = super::iface::choose::<Ipv4Net>(handle, &want, stored.or(p.args.public_ip), rec).await;
        chosen.map(|c| (c.name, std::net::IpAddr::V4(c.address)))
    } else {
        let rec = recorded.and_then(<Ipv6Net as super::iface::ChoosingFamily>::recorded);
        let chosen = super::iface::choose::<Ipv6Net>(handle, &want, stored6.or(p.args.public_ipv6), rec).await;
        chosen.map(|c| (c.name, std::net::IpAddr::V6(c.address)))
    };
    let (iface, address) = match chosen {
        Ok(c) => c,
        Err(e) if e.fixes_itself() => return Ok(Err(NotYet(format!("{e}; waiting for it")))),
        Err(e) => return Err(usage(e.to_string())),
    };
    let underlay = match device::underlay(handle, &iface).await {
        Ok(u) => u,
        Err(e) => return Ok(Err(NotYet(format!("the underlay {iface}: {e:#}; waiting for it")))),
    };
    let mut args = p.args.clone();
    match address {
        std::net::IpAddr::V4(a) => args.public_ip = args.public_ip.or(Some(a)),
        std::net::IpAddr::V6(a) => args.public_ipv6 = args.public_ipv6.or(Some(a)),
    }
    Ok(Ok(Checked {
        args,
        node: p.node.clone(),
        conf: p.conf.clone(),
        names: p.names.clone(),
        iface,
        underlay,
        source: p.source.clone(),
        etcd_annotations: p.etcd_annotations.clone(),
    }))
}

/// This Node's `node-public-ip` and `node-public-ipv6` annotations as
/// flanneld reads them before it picks the interface (flannel
/// `GetStoredPublicIP`: the kube subnet manager reads the Node, the etcd one
/// has none). The nodes file is read like the API; an API that does not
/// answer in time gives the cached view's.
async fn stored_public_ip(
    source: &Source,
    node: &str,
    names: &crate::annotations::AnnotationNames,
    state: Option<&crate::state::StateDir>,
) -> (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>) {
    let annotated = |n: &serde_json::Value| {
        let a = &n["metadata"]["annotations"];
        (
            a[names.node_public_ip.as_str()].as_str().and_then(|s| s.parse().ok()),
            a[names.node_public_ipv6.as_str()].as_str().and_then(|s| s.parse().ok()),
        )
    };
    match source {
        Source::Etcd(_) => (None, None),
        Source::File(path) => {
            let Ok(nodes) = crate::source::nodes_file::read(path) else { return (None, None) };
            nodes.iter().find(|n| n["metadata"]["name"] == node).map(annotated).unwrap_or_default()
        }
        Source::Kube(client) => {
            let api: ::kube::Api<k8s_openapi::api::core::v1::Node> = ::kube::Api::all(client.clone());
            match tokio::time::timeout(std::time::Duration::from_secs(2), api.get(node)).await {
                Ok(Ok(n)) => serde_json::to_value(&n).ok().as_ref().map(annotated).unwrap_or_default(),
                _ => match state.and_then(|s| s.load_view().ok().flatten()).and_then(|d| d.view.own) {
                    Some(o) => (o.node_public_ip, o.node_public_ipv6),
                    None => (None, None),
                },
            }
        }
    }
}
