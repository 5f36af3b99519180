//! `edgevx run`: validate everything, then bring up the dataplane and keep
//! it equal to what its source says until told to stop. Stopping leaves
//! the dataplane in place (pinned), so traffic never notices the agent.
use std::{
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
    task::JoinHandle,
    time::sleep_until,
};
use tracing::{debug, error, info, warn};

use crate::{
    cli::RunArgs,
    dataplane::bpffs::PinDir,
    metrics::{
        self, LoopReport, Stage,
        startup::{Milestone, STARTUP_FILE},
    },
    peer::ClusterView,
    source::{Desired, LocalVtep, NodeReader, etcd, kube, nodes_file},
    state::StateDir,
};

mod check;
pub mod config;
mod iface;
mod iface6;
mod keep_mac;
mod kernel;
pub mod lock;
mod mtu;
pub mod netns_lock;
mod node;
pub mod node6;
mod off_underlay;
mod warned;

use check::{Checked, Source, check};
use node::{Node, bring_up, readdress};
use warned::Warned;

use crate::{dataplane::device, events::kernel::KernelEvent};

/// The safety net behind the events: the dataplane is read back and
/// repaired, the VTEP and the underlay re-checked, this often.
const RESYNC_EVERY: Duration = Duration::from_secs(10);
/// How often the loop wakes when nothing happens (the liveness probe's tick).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A failed pass is retried this soon.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Kernel events come in bursts (a pod's veth, addresses, neighbours):
/// one pass after the burst settles.
const SETTLE: Duration = Duration::from_millis(30);

fn log_view(view: &ClusterView, warned: &mut Warned) {
    warned.malformed(&view.rejected);
    warned.partial(&view.partial);
    for r in &view.ignored {
        debug!(node = %r.node, "not a peer: {}", r.reason);
    }
    if let Some(p) = &view.own_problem {
        error!("{p}; waiting for the nodes file to name this node with a pod CIDR");
    }
}

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
            kube::publish(
                client.clone(),
                c.node.clone(),
                c.names.clone(),
                local,
                c.args.set_node_network_unavailable.into(),
            ),
        ],
        Source::Etcd(settings) => {
            let me = etcd::LocalNode {
                public_ip: config::public_ip::<Ipv4Net>(c.args.public_ip, None, &c.underlay)
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
                // used only if etcd's config turns IPv6 on
                public_ipv6: config::public_ip::<Ipv6Net>(c.args.public_ipv6, None, &c.underlay),
                iface: c.iface.clone(),
                state: state.clone(),
                subnet_file: c.args.subnet_file.clone(),
            };
            let mut tasks = vec![etcd::run(settings.clone(), me, tx)];
            if let Some(client) = &c.etcd_annotations {
                let (node, names) = (c.node.clone(), c.names.clone());
                tasks.push(kube::publish(client.clone(), node, names, local, kube::NetworkCondition::Leave));
            }
            tasks
        }
    }
}

/// Where the view in force came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The source sent it (the control plane is reachable).
    Source,
    /// The cached last good view, restored while the source is unreachable.
    Cache,
}

/// The state of the dataplane.
enum Phase {
    /// Nothing is set up yet: no usable view, or bring-up failed (retried).
    Down,
    /// The VTEP, the maps and the programs are up.
    Up(Box<Node>),
}

/// What is due, and when; the loop sleeps until the earliest.
#[derive(Default)]
struct Due {
    pass: Option<Instant>,
    learn: Option<Instant>,
    check: Option<Instant>,
}

impl Due {
    fn soon(slot: &mut Option<Instant>, after: Duration) {
        let at = Instant::now() + after;
        if slot.is_none_or(|t| at < t) {
            *slot = Some(at);
        }
    }

    fn next(&self) -> Option<Instant> {
        [self.pass, self.learn, self.check].into_iter().flatten().min()
    }
}

/// How the underlay differs from what the dataplane was built on, in a
/// way that needs a restart (its MTU is followed in place).
#[derive(Debug, thiserror::Error)]
enum UnderlayChanged {
    #[error("{0:#}")]
    Unreadable(anyhow::Error),
    #[error("it was re-created (ifindex {was} -> {now})")]
    Recreated { was: u32, now: u32 },
    #[error("its address changed ({} -> {})", shown(.was), shown(.now))]
    Readdressed { was: Option<std::net::Ipv4Addr>, now: Option<std::net::Ipv4Addr> },
}

fn shown(a: &Option<std::net::Ipv4Addr>) -> String {
    a.map_or_else(|| "none".into(), |a| a.to_string())
}

/// The underlay now, or how it changed.
async fn underlay_now(
    c: &Checked,
    handle: &rtnetlink::Handle,
) -> std::result::Result<device::Underlay, UnderlayChanged> {
    let was = &c.underlay;
    match device::underlay(handle, &c.iface).await {
        Err(e) => Err(UnderlayChanged::Unreadable(e)),
        Ok(now) if now.index != was.index => Err(UnderlayChanged::Recreated { was: was.index, now: now.index }),
        Ok(now) if now.ipv4 != was.ipv4 => Err(UnderlayChanged::Readdressed { was: was.ipv4, now: now.ipv4 }),
        Ok(now) => Ok(now),
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    // one agent per node, whatever its directories: refused first, naming the other
    let _netns = netns_lock::acquire("this edgevx")?;
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    let c = check(args, &handle).await?;
    // one agent per node: a second one is refused here, naming the first
    let early = lock::acquire_existing(&c.args.paths.state_dir)?;
    // still before anything on the host changes: a port in use exits 2
    let endpoint = metrics::bind(c.args.metrics_addr)?;
    // the first thing that touches the host (the checks and the bind only read)
    let _lock = match early {
        Some(l) => l,
        None => lock::acquire(&c.args.paths.state_dir)?,
    };
    let report = Arc::new(LoopReport::new(c.source.name()));
    metrics::serve(endpoint, report.clone(), PinDir::new(&c.args.paths.bpffs))?;
    let state = StateDir(c.args.paths.state_dir.clone());
    let mut kernel = crate::events::kernel::subscribe()?;

    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let (tx, mut rx) = mpsc::channel::<Desired>(8);
    let (local_tx, local_rx) = watch::channel::<Option<LocalVtep>>(None);
    info!(source = c.source.name(), node = %c.node, "agent starting");

    // restore first: with a cached view, the dataplane comes back from it
    // before the control plane is asked anything, so a node that starts cut
    // off (or slow to reach it) forwards at once; the source's view is then
    // reconciled against the kernel like any other, quietly when it agrees
    let mut desired: Option<Desired> = None;
    let mut origin = Origin::Source;
    let mut warned = Warned::default();
    let mut due = Due::default();
    if !matches!(c.source, Source::File(_)) {
        match state.load_view() {
            Ok(Some(cached)) => {
                report.view_from_cache(&state);
                info!(
                    source = c.source.name(),
                    "restoring the dataplane from the cached view first; asking the control plane meanwhile"
                );
                desired = Some(cached);
                origin = Origin::Cache;
                due.pass = Some(Instant::now());
            }
            Ok(None) => info!(source = c.source.name(), "no cached view; waiting for the control plane"),
            Err(e) => warn!("cannot read the cached view, so waiting for the control plane: {e:#}"),
        }
    }
    // the source starts once the restore has been tried, or now without one
    let mut waiting = Some((tx, local_rx));
    let mut tasks = Vec::new();
    let mut restore_tried = desired.is_none();

    let mut phase = Phase::Down;
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    resync.tick().await;
    // the loop's heartbeat for /healthz: it ticks at least this often
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    // whether the view in force has been cached since it arrived
    let mut cached = origin == Origin::Cache;
    loop {
        if let Some((tx, local_rx)) = waiting.take_if(|_| restore_tried) {
            tasks = start_source(&c, &state, tx, local_rx);
        }
        report.tick();
        let next = due.next();
        tokio::select! {
            Some(d) = rx.recv() => {
                report.view_from_source();
                if origin == Origin::Cache {
                    info!(source = c.source.name(), "control plane reachable again; reconciling");
                    origin = Origin::Source;
                }
                // an identical view (a heartbeat of an unrelated Node) does nothing at all
                if desired.as_ref() != Some(&d) {
                    log_view(&d.view, &mut warned);
                    desired = Some(d);
                    cached = false;
                    due.pass = Some(Instant::now());
                }
            }
            Some(ev) = kernel.recv() => {
                let Phase::Up(n) = &mut phase else { continue };
                // with DirectRouting, the underlay's routes are ours too, or say what is on-link
                let direct = desired.as_ref().is_some_and(|d| d.conf.direct_routing);
                // the IPv6 VTEP's routes, neighbours and fdb entries are ours too
                let vtep6 = n.v6.as_ref().map(|s| s.index);
                let ours = |oif: Option<u32>| oif.is_some() && (oif == n.vtep_index || oif == vtep6);
                match ev {
                    KernelEvent::Route { oif, .. }
                        if ours(oif) || (direct && oif == Some(c.underlay.index)) =>
                    {
                        n.observed = None;
                        Due::soon(&mut due.pass, SETTLE)
                    }
                    KernelEvent::Neighbour { index } if Some(index) == vtep6 => {
                        n.observed = None;
                        Due::soon(&mut due.pass, SETTLE)
                    }
                    KernelEvent::Link { index, .. } | KernelEvent::Address { index }
                        if index == c.underlay.index => Due::soon(&mut due.check, SETTLE),
                    KernelEvent::Link { index, .. } if Some(index) == n.vtep_index || Some(index) == vtep6 => {
                        Due::soon(&mut due.check, SETTLE)
                    }
                    KernelEvent::Link { .. } | KernelEvent::Neighbour { .. } => Due::soon(&mut due.learn, SETTLE),
                    _ => {}
                }
            }
            _ = async { if let Some(t) = next { sleep_until(t.into()).await } else { std::future::pending::<()>().await } } => {}
            _ = heartbeat.tick() => {}
            _ = resync.tick() => {
                // the safety net: read the kernel back, whatever we think it holds
                if let Phase::Up(n) = &mut phase {
                    n.observed = None;
                }
                due.pass = Some(Instant::now());
                due.check = Some(Instant::now());
                due.learn = Some(Instant::now());
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        let now = Instant::now();
        let ripe = |slot: &mut Option<Instant>| {
            let r = slot.is_some_and(|t| t <= now);
            if r {
                *slot = None;
            }
            r
        };
        if ripe(&mut due.check) {
            let underlay = match underlay_now(&c, &handle).await {
                Ok(u) => u,
                Err(what) => anyhow::bail!(
                    "the underlay {} changed: {what}; exiting so that the supervisor restarts edgevx on the new \
                     underlay (the dataplane stays in place meanwhile)",
                    c.iface
                ),
            };
            if let Phase::Up(n) = &mut phase {
                n.warn_off_underlay();
            }
            if let (Phase::Up(n), Some(d)) = (&mut phase, &desired) {
                if let Err(e) = n.follow_mtu(&d.conf, underlay.mtu, &state).await {
                    warn!("cannot bring the VTEP's MTU in line with the underlay's, retrying: {e:#}");
                    Due::soon(&mut due.check, RETRY_AFTER);
                }
            }
            if let Phase::Up(n) = &phase {
                if let Err(e) = n.keep_macs().await {
                    warn!("cannot put the VTEP's MAC back, retrying: {e:#}");
                    Due::soon(&mut due.check, RETRY_AFTER);
                }
            }
            if let Phase::Up(n) = &phase {
                match n.intact().await {
                    Ok(true) => {}
                    Ok(false) => {
                        // someone deleted the VTEP or detached a program: build it all again
                        warn!("the VTEP device or an attached program is gone; rebuilding the dataplane");
                        report.rebuilding();
                        phase = Phase::Down;
                        due.pass = Some(now);
                    }
                    // EMFILE, ENOMEM: the agent's trouble, not the dataplane's, which stays
                    Err(e) => {
                        warn!(
                            "cannot check the VTEP device and the attached programs, leaving them as they are: {e:#}"
                        );
                        Due::soon(&mut due.check, RETRY_AFTER);
                    }
                }
            }
        }
        if ripe(&mut due.learn) {
            if let Phase::Up(n) = &mut phase {
                n.learn_pods().await;
            }
        }
        if !ripe(&mut due.pass) {
            continue;
        }
        restore_tried = true;
        let Some(d) = desired.as_ref() else { continue };
        let Some(own) = d.view.own.clone() else {
            continue;
        };
        let pass = Instant::now();
        match &mut phase {
            Phase::Down => match bring_up(&c, &d.conf, own, &state, &handle, &report.startup).await {
                Ok(n) => {
                    local_tx.send_replace(Some(n.local_vtep()));
                    phase = Phase::Up(Box::new(n));
                }
                Err(e) => {
                    error!("cannot bring up the dataplane, retrying: {e:#}");
                    report.pass_failed(Stage::BringUp, pass);
                    Due::soon(&mut due.pass, RETRY_AFTER);
                    continue;
                }
            },
            Phase::Up(n) if n.own.subnet != own.subnet || n.own.subnet6 != own.subnet6 => {
                warn!(old = ?n.own.subnet, new = ?own.subnet, old6 = ?n.own.subnet6, new6 = ?own.subnet6,
                    "own pod CIDR changed; re-addressing the VTEP");
                if let Err(e) = readdress(n, &own, &state).await {
                    error!("cannot apply the new pod CIDR: {e:#}");
                    report.pass_failed(Stage::Readdress, pass);
                    Due::soon(&mut due.pass, RETRY_AFTER);
                    continue;
                }
                local_tx.send_replace(Some(n.local_vtep()));
            }
            Phase::Up(_) => {}
        }
        let Phase::Up(n) = &mut phase else { continue };
        let families_changed = d.conf.ipv6.as_ref().map(|v6| v6.network) != n.record.v6.as_ref().map(|v6| v6.network)
            || d.conf.ipv4 != n.record.v4.is_some();
        if families_changed {
            // a dual-stack node must publish both halves or flannel peers skip it whole: apply it now
            warn!("EnableIPv4, EnableIPv6 or IPv6Network changed; rebuilding the dataplane to apply it");
            report.rebuilding();
            phase = Phase::Down;
            Due::soon(&mut due.pass, Duration::ZERO);
            continue;
        }
        let conf_changed = d.conf.vni != n.record.vni
            || d.conf.port != n.record.port
            || n.record.v4.as_ref().is_some_and(|v4| v4.network != d.conf.network);
        if conf_changed && !cached {
            warn!("the network config changed (VNI, port or Network); restart the agent to apply it");
        }
        let peers_ok = n.reconcile(&d.view, d.conf.direct_routing, &state, &mut warned).await;
        report.set_peers(n.accepted.iter());
        n.enforce_rules();
        let first_attach = n.pending.is_some();
        let attached = match n.attach().await {
            Ok(()) => {
                report.startup.reached(Milestone::Attached, Instant::now());
                if first_attach {
                    // what the first pass held back until the programs were on
                    Due::soon(&mut due.pass, Duration::ZERO);
                }
                true
            }
            Err(e) => {
                error!("cannot attach the programs, retrying: {e:#}");
                false
            }
        };
        // the IPv6 kernel entries after the attach: the first IPv4 packet does not wait for them
        let peers_ok = n.reconcile6(d.conf.direct_routing).await && peers_ok;
        if attached {
            n.learn_pods().await;
        }
        if let Some(t) = n.first_peer_at {
            report.startup.reached(Milestone::FirstPeer, t);
        }
        if peers_ok && attached {
            report.startup.reached(Milestone::AllPeers, Instant::now());
        }
        report.pass_done(pass, peers_ok, attached);
        // off the path to forwarding: the figures for `edgevx status`
        if let Some(figures) = report.startup.take_changed() {
            if let Err(e) = state.save_json(STARTUP_FILE, &figures) {
                warn!("cannot save {STARTUP_FILE} (for edgevx status): {e:#}");
            }
        }
        if !(peers_ok && attached) {
            Due::soon(&mut due.pass, RETRY_AFTER);
        }
        if !cached && origin == Origin::Source && !matches!(c.source, Source::File(_)) {
            match state.save_view(d) {
                Ok(()) => cached = true,
                Err(e) => warn!("cannot cache the view: {e:#}"),
            }
        }
    }
    for t in tasks {
        t.abort();
    }
    info!("stopping; the dataplane stays in place (edgevx cleanup removes it)");
    Ok(())
}
