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
use serde_json::Value;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
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
    source::{flannel_rules::Rules, nodes_file},
    state::{AgentRecord, StateDir},
    subnet_env, vtep_mac,
};

/// How often local pods are re-learned and failed peers retried.
const LEARN_EVERY: Duration = Duration::from_secs(1);
const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// Everything `run` needs, checked before the host is touched.
struct Checked {
    args: RunArgs,
    node: String,
    conf: NetConf,
    names: AnnotationNames,
    underlay: device::Underlay,
}

async fn check(args: RunArgs, handle: &Handle) -> Result<Checked> {
    let usage = |m: String| anyhow::Error::new(UsageError(m));
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
    if !args.nodes_file.is_file() {
        return Err(usage(format!(
            "--nodes-file {}: no such file",
            args.nodes_file.display()
        )));
    }
    std::fs::File::open(&args.nodes_file)
        .map_err(|e| usage(format!("--nodes-file {}: {e}", args.nodes_file.display())))?;
    let underlay = match device::link_by_name(handle, &args.iface).await {
        Ok(Some(_)) => device::underlay(handle, &args.iface).await?,
        Ok(None) => return Err(usage(format!("--iface {}: no such interface", args.iface))),
        Err(e) => return Err(e),
    };
    if args.public_ip.is_none() && underlay.ipv4.is_none() {
        return Err(usage(format!(
            "--iface {} has no IPv4 address; give --public-ip",
            args.iface
        )));
    }
    for (flag, dir) in [
        ("--state-dir", &args.paths.state_dir),
        ("--bpffs", &args.paths.bpffs),
    ] {
        if dir.exists() && !dir.is_dir() {
            return Err(usage(format!(
                "{flag} {} is not a directory",
                dir.display()
            )));
        }
    }
    Ok(Checked {
        args,
        node,
        conf,
        names,
        underlay,
    })
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
    handle: Handle,
    maps: Maps,
    vtep_index: u32,
    own: OwnNode,
    record: AgentRecord,
}

async fn bring_up(c: &Checked, own: OwnNode, state: &StateDir, handle: &Handle) -> Result<Node> {
    let (mac, _) = vtep_mac::choose(own.published_mac, state)?;
    let public_ip: Ipv4Addr = c
        .args
        .public_ip
        .or(own.node_public_ip)
        .or(c.underlay.ipv4)
        .context("no public IP")?;
    let mtu = c
        .conf
        .mtu
        .unwrap_or(c.underlay.mtu)
        .saturating_sub(ENCAP_OVERHEAD as u32);
    bpffs::ensure_mounted(&c.args.paths.bpffs)?;
    let pins = bpffs::PinDir::new(&c.args.paths.bpffs);
    let mut ebpf = loader::load(&pins)?;

    let spec = device::VtepSpec {
        name: device::vtep_name(c.conf.vni),
        vni: c.conf.vni,
        port: c.conf.port,
        local: public_ip,
        underlay_index: c.underlay.index,
        mac,
        mtu,
    };
    let vtep_index = device::ensure_vtep(handle, &spec).await?;
    device::ensure_address(handle, vtep_index, own.subnet, c.conf.network).await?;

    let mut maps = Maps::open(&pins)?;
    let fast = !c.args.host_routing;
    maps.set_config(&DataplaneConfig {
        vni: c.conf.vni,
        local_ip: public_ip.octets(),
        vtep_mac: mac.0,
        port: c.conf.port,
        flags: if fast { FLAG_FAST_DELIVERY } else { 0 },
        vtep_ifindex: vtep_index,
        underlay_ifindex: c.underlay.index,
    })?;
    if !fast {
        maps.sync_local_pods(&Default::default())?;
    }
    loader::attach(
        &mut ebpf,
        &pins,
        loader::ENCAP,
        &spec.name,
        TcAttachType::Egress,
    )?;
    loader::attach(
        &mut ebpf,
        &pins,
        loader::DECAP,
        &c.args.iface,
        TcAttachType::Ingress,
    )?;
    drop(ebpf); // the pinned links keep the programs; the pinned maps keep their state

    subnet_env::write(&c.args.subnet_file, c.conf.network, own.subnet, mtu, false)
        .with_context(|| format!("cannot write {}", c.args.subnet_file.display()))?;
    let record = AgentRecord {
        node: c.node.clone(),
        iface: c.args.iface.clone(),
        vtep_device: spec.name.clone(),
        vtep_mac: mac,
        vni: c.conf.vni,
        port: c.conf.port,
        public_ip,
        subnet: own.subnet,
        network: c.conf.network,
        mtu,
        fast_delivery: fast,
        subnet_file: c.args.subnet_file.clone(),
        pid: std::process::id(),
    };
    state.save_agent(&record)?;
    info!(device = %spec.name, %mac, %public_ip, subnet = %own.subnet, mtu, fast_delivery = fast, "dataplane up");
    Ok(Node {
        handle: handle.clone(),
        maps,
        vtep_index,
        own,
        record,
    })
}

impl Node {
    /// Brings peers in line with `view`; on the first pass also removes what
    /// an earlier run left that nobody accounts for.
    async fn reconcile(
        &mut self,
        rules_view: &ClusterView,
        reconciler: &mut Reconciler,
        state: &StateDir,
        collect: bool,
    ) {
        let programmed = reconciler
            .programmed()
            .map(|p| (p.node.clone(), p.clone()))
            .collect();
        let (accepted, rejected) =
            reconcile::select(self.own.subnet, &programmed, &rules_view.peers);
        for r in &rejected {
            warn!(node = %r.node, "skipping conflicting node: {}", r.reason);
        }
        let mut table = peers::Programmed {
            maps: &mut self.maps,
            handle: &self.handle,
            vtep_index: self.vtep_index,
        };
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

pub async fn run(args: RunArgs) -> Result<()> {
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    let c = check(args, &handle).await?;
    let state = StateDir(c.args.paths.state_dir.clone());
    let rules = Rules {
        names: &c.names,
        own_name: &c.node,
        network: c.conf.network,
    };

    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let (tx, mut rx) = mpsc::channel::<Vec<Value>>(4);
    let watcher = nodes_file::watch(PathBuf::from(&c.args.nodes_file), tx);

    let mut view = ClusterView::default();
    let mut node: Option<Node> = None;
    let mut reconciler = Reconciler::adopt(state.load_peers().unwrap_or_else(|e| {
        warn!("ignoring the saved peer list: {e:#}");
        Vec::new()
    }));
    let mut learn = tokio::time::interval(LEARN_EVERY);
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    let mut first_pass = true;
    loop {
        tokio::select! {
            Some(nodes) = rx.recv() => {
                view = rules.view(&nodes);
                log_view(&view);
            }
            _ = learn.tick() => {
                if let Some(n) = node.as_mut() { n.learn_pods().await; }
                continue;
            }
            _ = resync.tick() => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        let Some(own) = view.own.clone() else {
            continue;
        };
        match node.as_mut() {
            None => match bring_up(&c, own, &state, &handle).await {
                Ok(n) => node = Some(n),
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
            }
            Some(_) => {}
        }
        if let Some(n) = node.as_mut() {
            n.reconcile(&view, &mut reconciler, &state, first_pass)
                .await;
            first_pass = false;
        }
    }
    watcher.abort();
    info!("stopping; the dataplane stays in place (edgevx cleanup removes it)");
    Ok(())
}

async fn readdress(n: &mut Node, c: &Checked, own: &OwnNode, state: &StateDir) -> Result<()> {
    device::ensure_address(&n.handle, n.vtep_index, own.subnet, c.conf.network).await?;
    subnet_env::write(
        &c.args.subnet_file,
        c.conf.network,
        own.subnet,
        n.record.mtu,
        false,
    )?;
    n.own = own.clone();
    n.record.subnet = own.subnet;
    state.save_agent(&n.record)
}
