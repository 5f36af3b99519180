//! `edgevx run`: validate everything, then bring up the dataplane and keep
//! it equal to what its source says until told to stop. Stopping leaves
//! the dataplane in place (pinned), so traffic never notices the agent.
use std::{
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, error, info, warn};

use crate::{
    cli::RunArgs,
    dataplane::bpffs::PinDir,
    metrics::{self, LoopReport, Stage},
    peer::ClusterView,
    reconcile::Reconciler,
    source::{Desired, LocalVtep, NodeReader, etcd, kube, nodes_file},
    state::StateDir,
};

mod check;
mod kernel;
mod node;

use check::{Checked, Source, check};
use node::{Node, bring_up, readdress};

/// How often local pods are re-learned and failed peers retried.
const LEARN_EVERY: Duration = Duration::from_secs(1);
const RESYNC_EVERY: Duration = Duration::from_secs(30);

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
            let me = etcd::LocalNode {
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
    // still before anything on the host changes: a port in use exits 2
    let endpoint = metrics::bind(c.args.metrics_addr)?;
    let report = Arc::new(LoopReport::new(c.source.name()));
    metrics::serve(endpoint, report.clone(), PinDir::new(&c.args.paths.bpffs))?;
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
            Ok(Some(d)) => {
                report.view_from_source();
                desired = Some(d);
            }
            _ => match state.load_view() {
                Ok(Some(cached)) => {
                    report.view_from_cache(&state);
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
    // whether `desired` arrived since the last pass: only a new view is logged and cached
    let mut new_view = fresh;
    loop {
        report.tick();
        if !fresh {
            tokio::select! {
                Some(d) = rx.recv() => {
                    if !live {
                        info!(source = c.source.name(), "control plane reachable again; reconciling");
                    }
                    report.view_from_source();
                    desired = Some(d);
                    live = true;
                    new_view = true;
                }
                _ = learn.tick() => {
                    let Some(n) = node.as_mut() else { continue };
                    if n.intact().await {
                        n.learn_pods().await;
                        continue;
                    }
                    // someone deleted the VTEP or detached a program: build it all again
                    warn!("the VTEP device or an attached program is gone; rebuilding the dataplane");
                    report.rebuilding();
                    node = None;
                    reconciler.distrust();
                    first_pass = true;
                }
                _ = resync.tick() => {}
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        fresh = false;
        let Some(d) = desired.as_ref() else { continue };
        // kept until a pass completes, so a failed bring-up still caches the view later
        let announce = new_view;
        if live && announce {
            log_view(&d.view);
        }
        let Some(own) = d.view.own.clone() else {
            continue;
        };
        let pass = Instant::now();
        match node.as_mut() {
            None => match bring_up(&c, &d.conf, own, &state, &handle).await {
                Ok(n) => {
                    local_tx.send_replace(Some(n.local_vtep()));
                    node = Some(n);
                }
                Err(e) => {
                    error!("cannot bring up the dataplane, retrying: {e:#}");
                    report.pass_failed(Stage::BringUp, pass);
                    continue;
                }
            },
            Some(n) if n.own.subnet != own.subnet => {
                warn!(old = %n.own.subnet, new = %own.subnet, "own pod CIDR changed; re-addressing the VTEP");
                if let Err(e) = readdress(n, &c, &own, &state).await {
                    error!("cannot apply the new pod CIDR: {e:#}");
                    report.pass_failed(Stage::Readdress, pass);
                    continue;
                }
                local_tx.send_replace(Some(n.local_vtep()));
            }
            Some(_) => {}
        }
        if let Some(n) = node.as_mut() {
            let conf_changed =
                d.conf.vni != n.record.vni || d.conf.port != n.record.port || d.conf.network != n.record.network;
            if announce && conf_changed {
                warn!("the network config changed (VNI, port or Network); restart the agent to apply it");
            }
            let peers_ok = n.reconcile(&d.view, &mut reconciler, &state, first_pass).await;
            report.set_peers(reconciler.programmed());
            n.enforce_rules();
            first_pass = false;
            let attached = match n.attach().await {
                Ok(()) => true,
                Err(e) => {
                    error!("cannot attach the programs, retrying: {e:#}");
                    false
                }
            };
            report.pass_done(pass, peers_ok, attached);
            if announce && live && !matches!(c.source, Source::File(_)) {
                if let Err(e) = state.save_view(d) {
                    warn!("cannot cache the view: {e:#}");
                }
            }
            new_view = false;
        }
    }
    for t in tasks {
        t.abort();
    }
    info!("stopping; the dataplane stays in place (edgevx cleanup removes it)");
    Ok(())
}
