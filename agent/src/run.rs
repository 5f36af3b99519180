//! `edgevx run`: validate everything, then bring up the dataplane and keep
//! it equal to what the nodes file says until told to stop. Stopping leaves
//! the dataplane in place (pinned), so traffic never notices the agent.
use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use aya::programs::TcAttachType;
use edgevx_common::{
    maps::{DataplaneConfig, FLAG_FAST_DELIVERY},
    vxlan::ENCAP_OVERHEAD,
};
use ipnet::Ipv4Net;
use rtnetlink::Handle;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, error, info, warn};

use crate::{
    UsageError,
    annotations::AnnotationNames,
    cli::RunArgs,
    dataplane::{bpffs, device, loader, local_pods, maps::Maps, peers},
    netconf::NetConf,
    peer::{ClusterView, OwnNode},
    reconcile::{self, Reconciler},
    source::{Desired, LocalVtep, NodeReader, etcd, kube, nodes_file},
    state::{AgentRecord, StateDir},
    subnet_env, vtep_mac,
};

/// How often local pods are re-learned and failed peers retried.
const LEARN_EVERY: Duration = Duration::from_secs(1);
const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// Where desired state comes from.
enum Source {
    File(PathBuf),
    Kube(::kube::Client),
    Etcd(etcd::EtcdSettings),
}

impl Source {
    fn name(&self) -> &'static str {
        match self {
            Source::File(_) => "nodes file",
            Source::Kube(_) => "Kubernetes API",
            Source::Etcd(_) => "etcd",
        }
    }
}

/// Everything `run` needs, checked before the host is touched.
struct Checked {
    args: RunArgs,
    node: String,
    conf: NetConf,
    names: AnnotationNames,
    /// The underlay interface's name (`--iface`, or the default route's).
    iface: String,
    underlay: device::Underlay,
    source: Source,
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
    if args.net_conf.is_some() {
        return Err(usage(format!("--net-conf does not apply with etcd: the config is {}/config", args.etcd_prefix)));
    }
    if args.subnet_lease_renew_margin_secs >= args.subnet_lease_ttl {
        return Err(usage("--subnet-lease-renew-margin-secs must be below --subnet-lease-ttl".into()));
    }
    Ok(Source::Etcd(etcd::EtcdSettings {
        endpoints,
        prefix: args.etcd_prefix.trim_end_matches('/').to_string(),
        cafile: args.etcd_cafile.clone(),
        certfile: args.etcd_certfile.clone(),
        keyfile: args.etcd_keyfile.clone(),
        lease_ttl: Duration::from_secs(args.subnet_lease_ttl),
        renew_margin: Duration::from_secs(args.subnet_lease_renew_margin_secs),
    }))
}

async fn check(args: RunArgs, handle: &Handle) -> Result<Checked> {
    let node = args
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| usage("--node-name (or EDGEVX_NODE_NAME / NODE_NAME) is required".into()))?;
    let names = AnnotationNames::new(&args.kube_annotation_prefix)
        .map_err(|e| usage(format!("--kube-annotation-prefix: {e}")))?;
    let conf = match &args.net_conf {
        Some(p) => NetConf::load(p).map_err(|e| usage(format!("--net-conf: {e}")))?,
        None => NetConf::default(),
    };
    let iface = match &args.iface {
        Some(i) => i.clone(),
        None => device::default_route_iface(handle)
            .await?
            .ok_or_else(|| usage("no --iface and no IPv4 default route to take it from".into()))?,
    };
    let underlay = match device::link_by_name(handle, &iface).await {
        Ok(Some(_)) => device::underlay(handle, &iface).await?,
        Ok(None) => return Err(usage(format!("--iface {iface}: no such interface"))),
        Err(e) => return Err(e),
    };
    if args.public_ip.is_none() && underlay.ipv4.is_none() {
        return Err(usage(format!("--iface {iface} has no IPv4 address; give --public-ip")));
    }
    for (flag, dir) in [("--state-dir", &args.paths.state_dir), ("--bpffs", &args.paths.bpffs)] {
        if dir.exists() && !dir.is_dir() {
            return Err(usage(format!("{flag} {} is not a directory", dir.display())));
        }
    }
    let source = choose_source(&args).await?;
    Ok(Checked { args, node, conf, names, iface, underlay, source })
}

fn log_view(view: &ClusterView) {
    for r in &view.rejected {
        warn!(node = %r.node, "skipping malformed node: {}", r.reason);
    }
    for r in &view.ignored {
        debug!(node = %r.node, "not a peer: {}", r.reason);
    }
    if let Some(p) = &view.own_problem {
        error!("{p}; waiting for the nodes file to name this node with a pod CIDR");
    }
}

/// The dataplane once it is up.
struct Node {
    /// The loaded programs until they are attached: only after the maps
    /// hold every peer, so taking over from flanneld (or from an older
    /// edgevx) never sends a packet to an empty table.
    pending: Option<(aya::Ebpf, bpffs::PinDir)>,
    handle: Handle,
    maps: Maps,
    vtep_index: u32,
    own: OwnNode,
    record: AgentRecord,
}

async fn bring_up(c: &Checked, conf: &NetConf, own: OwnNode, state: &StateDir, handle: &Handle) -> Result<Node> {
    let (mac, _) = vtep_mac::choose(own.published_mac, state)?;
    let public_ip: Ipv4Addr = c.args.public_ip.or(own.node_public_ip).or(c.underlay.ipv4).context("no public IP")?;
    let mtu = c.conf.mtu.unwrap_or(c.underlay.mtu).saturating_sub(ENCAP_OVERHEAD as u32);
    bpffs::ensure_mounted(&c.args.paths.bpffs)?;
    let pins = bpffs::PinDir::new(&c.args.paths.bpffs);
    let ebpf = loader::load(&pins)?;

    let spec = device::VtepSpec {
        name: device::vtep_name(conf.vni),
        vni: conf.vni,
        port: conf.port,
        local: public_ip,
        underlay_index: c.underlay.index,
        mac,
        mtu,
    };
    let vtep_index = device::ensure_vtep(handle, &spec).await?;
    device::ensure_address(handle, vtep_index, own.subnet, conf.network).await?;

    let mut maps = Maps::open(&pins)?;
    let fast = !c.args.host_routing;
    maps.set_config(&DataplaneConfig {
        vni: conf.vni,
        local_ip: public_ip.octets(),
        vtep_mac: mac.0,
        port: conf.port,
        flags: if fast { FLAG_FAST_DELIVERY } else { 0 },
        vtep_ifindex: vtep_index,
        underlay_ifindex: c.underlay.index,
    })?;
    if !fast {
        maps.sync_local_pods(&Default::default())?;
    }

    subnet_env::write(&c.args.subnet_file, conf.network, own.subnet, mtu, false)
        .with_context(|| format!("cannot write {}", c.args.subnet_file.display()))?;
    let record = AgentRecord {
        node: c.node.clone(),
        iface: c.iface.clone(),
        vtep_device: spec.name.clone(),
        vtep_mac: mac,
        vni: conf.vni,
        port: conf.port,
        public_ip,
        subnet: own.subnet,
        network: conf.network,
        mtu,
        fast_delivery: fast,
        subnet_file: c.args.subnet_file.clone(),
        pid: std::process::id(),
    };
    state.save_agent(&record)?;
    info!(device = %spec.name, %mac, %public_ip, subnet = %own.subnet, mtu, fast_delivery = fast, "VTEP ready");
    Ok(Node { handle: handle.clone(), maps, vtep_index, own, record, pending: Some((ebpf, pins)) })
}

impl Node {
    /// Attaches (or swaps in) the programs, then drops what flanneld left on
    /// the VTEP: per-peer arp and fdb entries, now unused.
    async fn attach(&mut self) -> Result<()> {
        let Some((mut ebpf, pins)) = self.pending.take() else { return Ok(()) };
        loader::attach(&mut ebpf, &pins, loader::ENCAP, &self.record.vtep_device, TcAttachType::Egress)?;
        loader::attach(&mut ebpf, &pins, loader::DECAP, &self.record.iface, TcAttachType::Ingress)?;
        drop(ebpf); // the pinned links keep the programs; the pinned maps keep their state
        device::set_noarp(&self.handle, self.vtep_index).await?;
        match device::flush_static_neighbours(&self.handle, self.vtep_index).await? {
            0 => {}
            n => info!(entries = n, "removed arp/fdb entries left on the VTEP (adopted from flanneld)"),
        }
        let r = &self.record;
        info!(device = %r.vtep_device, iface = %r.iface, mac = %r.vtep_mac, public_ip = %r.public_ip, subnet = %r.subnet,
            fast_delivery = r.fast_delivery, "dataplane up");
        Ok(())
    }

    /// Brings peers in line with `view`; on the first pass also removes what
    /// an earlier run left that nobody accounts for.
    async fn reconcile(
        &mut self,
        rules_view: &ClusterView,
        reconciler: &mut Reconciler,
        state: &StateDir,
        collect: bool,
    ) {
        let programmed = reconciler.programmed().map(|p| (p.node.clone(), p.clone())).collect();
        let (accepted, rejected) = reconcile::select(self.own.subnet, &programmed, &rules_view.peers);
        for r in &rejected {
            warn!(node = %r.node, "skipping conflicting node: {}", r.reason);
        }
        let mut table = peers::Programmed { maps: &mut self.maps, handle: &self.handle, vtep_index: self.vtep_index };
        let changed = reconciler.apply(&mut table, &accepted).await;
        if collect {
            let keep: Vec<Ipv4Net> = reconciler.programmed().map(|p| p.subnet).collect();
            match peers::collect_stale_routes(&self.handle, self.vtep_index, &keep).await {
                Ok(gone) if !gone.is_empty() => info!(?gone, "removed stale routes"),
                Ok(_) => {}
                Err(e) => warn!("cannot collect stale routes: {e:#}"),
            }
            if let Err(e) = self.maps.retain_subnets(&keep) {
                warn!("cannot collect stale map entries: {e:#}");
            }
        }
        if changed || collect {
            if let Err(e) = state.save_peers(reconciler.programmed()) {
                error!("cannot save the peer list: {e:#}");
            }
        }
    }

    async fn learn_pods(&mut self) {
        if !self.record.fast_delivery {
            return;
        }
        match local_pods::discover(&self.handle, self.own.subnet).await {
            Ok(pods) => {
                if let Err(e) = self.maps.sync_local_pods(&pods) {
                    warn!("cannot update local pods: {e:#}");
                }
            }
            Err(e) => warn!("cannot learn local pods: {e:#}"),
        }
    }
}

/// How long a control-plane source gets to answer before the cached view
/// is used, so an offline node has its dataplane back within a second.
const CACHE_AFTER: Duration = Duration::from_millis(600);

/// Starts the chosen source; returns its tasks (aborted on exit).
fn start_source(
    c: &Checked,
    state: &StateDir,
    tx: mpsc::Sender<Desired>,
    local: watch::Receiver<Option<LocalVtep>>,
) -> Vec<JoinHandle<()>> {
    let reader = NodeReader { names: c.names.clone(), own_name: c.node.clone(), conf: c.conf.clone() };
    match &c.source {
        Source::File(path) => vec![nodes_file::watch(path.clone(), reader, tx)],
        Source::Kube(client) => vec![
            kube::watch_nodes(client.clone(), reader, tx),
            kube::publish(client.clone(), c.node.clone(), c.names.clone(), local),
        ],
        Source::Etcd(settings) => {
            let me = etcd::Identity4 {
                public_ip: c.args.public_ip.or(c.underlay.ipv4).unwrap_or(Ipv4Addr::UNSPECIFIED),
                state: state.clone(),
                subnet_file: c.args.subnet_file.clone(),
            };
            vec![etcd::run(settings.clone(), me, tx)]
        }
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    let c = check(args, &handle).await?;
    let state = StateDir(c.args.paths.state_dir.clone());

    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let (tx, mut rx) = mpsc::channel::<Desired>(8);
    let (local_tx, local_rx) = watch::channel::<Option<LocalVtep>>(None);
    let tasks = start_source(&c, &state, tx, local_rx);
    info!(source = c.source.name(), node = %c.node, "agent starting");

    // a control plane that does not answer at once: bring back the last good view
    let mut desired: Option<Desired> = None;
    let mut live = true;
    if !matches!(c.source, Source::File(_)) {
        match tokio::time::timeout(CACHE_AFTER, rx.recv()).await {
            Ok(Some(d)) => desired = Some(d),
            _ => match state.load_view() {
                Ok(Some(cached)) => {
                    warn!(
                        source = c.source.name(),
                        "control plane not reachable; restoring the dataplane from the cached view and retrying in the background"
                    );
                    desired = Some(cached);
                    live = false;
                }
                Ok(None) => {
                    warn!(source = c.source.name(), "control plane not reachable and no cached view; waiting for it")
                }
                Err(e) => warn!("cannot read the cached view: {e:#}"),
            },
        }
    }

    let mut node: Option<Node> = None;
    let mut reconciler = Reconciler::adopt(state.load_peers().unwrap_or_else(|e| {
        warn!("ignoring the saved peer list: {e:#}");
        Vec::new()
    }));
    let mut learn = tokio::time::interval(LEARN_EVERY);
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    let mut first_pass = true;
    let mut fresh = desired.is_some();
    loop {
        if !fresh {
            tokio::select! {
                Some(d) = rx.recv() => {
                    if !live {
                        info!(source = c.source.name(), "control plane reachable again; reconciling");
                    }
                    desired = Some(d);
                    live = true;
                }
                _ = learn.tick() => {
                    if let Some(n) = node.as_mut() { n.learn_pods().await; }
                    continue;
                }
                _ = resync.tick() => {}
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        fresh = false;
        let Some(d) = desired.as_ref() else { continue };
        if live {
            log_view(&d.view);
        }
        let Some(own) = d.view.own.clone() else {
            continue;
        };
        match node.as_mut() {
            None => match bring_up(&c, &d.conf, own, &state, &handle).await {
                Ok(n) => {
                    local_tx.send_replace(Some(LocalVtep {
                        mac: n.record.vtep_mac,
                        public_ip: n.record.public_ip,
                        vni: n.record.vni,
                        subnet: n.own.subnet,
                    }));
                    node = Some(n);
                }
                Err(e) => {
                    error!("cannot bring up the dataplane, retrying: {e:#}");
                    continue;
                }
            },
            Some(n) if n.own.subnet != own.subnet => {
                warn!(old = %n.own.subnet, new = %own.subnet, "own pod CIDR changed; re-addressing the VTEP");
                if let Err(e) = readdress(n, &c, &own, &state).await {
                    error!("cannot apply the new pod CIDR: {e:#}");
                    continue;
                }
                local_tx.send_replace(Some(LocalVtep {
                    mac: n.record.vtep_mac,
                    public_ip: n.record.public_ip,
                    vni: n.record.vni,
                    subnet: own.subnet,
                }));
            }
            Some(_) => {}
        }
        if let Some(n) = node.as_mut() {
            if d.conf.vni != n.record.vni || d.conf.port != n.record.port || d.conf.network != n.record.network {
                warn!("the network config changed (VNI, port or Network); restart the agent to apply it");
            }
            n.reconcile(&d.view, &mut reconciler, &state, first_pass).await;
            first_pass = false;
            if let Err(e) = n.attach().await {
                error!("cannot attach the programs, retrying: {e:#}");
            }
            if live && !matches!(c.source, Source::File(_)) {
                if let Err(e) = state.save_view(d) {
                    warn!("cannot cache the view: {e:#}");
                }
            }
        }
    }
    for t in tasks {
        t.abort();
    }
    info!("stopping; the dataplane stays in place (edgevx cleanup removes it)");
    Ok(())
}

async fn readdress(n: &mut Node, c: &Checked, own: &OwnNode, state: &StateDir) -> Result<()> {
    device::ensure_address(&n.handle, n.vtep_index, own.subnet, n.record.network).await?;
    subnet_env::write(&c.args.subnet_file, n.record.network, own.subnet, n.record.mtu, false)?;
    n.own = own.clone();
    n.record.subnet = own.subnet;
    state.save_agent(&n.record)
}
