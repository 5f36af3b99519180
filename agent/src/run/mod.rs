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
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, watch},
    task::JoinHandle,
    time::sleep_until,
};
use tracing::{info, warn};

use crate::{
    cli::RunArgs,
    dataplane::bpffs::PinDir,
    metrics::{self, LoopReport, Watching},
    peer::Desired,
    source::{LocalVtep, etcd, flannel_rules::NodeReader, kube, nodes_file},
    state::StateDir,
};

mod agent;
mod check;
pub mod config;
mod fast_path;
mod iface;
mod kernel;
pub mod lock;
pub mod netns_lock;
mod node;
mod notify;
mod schedule;
mod vtep_plan;
mod wait_host;
mod warned;

use agent::Agent;
use check::{Checked, Source, check};
use schedule::{Asks, Due, JOBS, Job};

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

/// Starts the chosen source; returns its tasks (aborted on exit).
fn start_source(
    c: &Checked,
    state: &StateDir,
    tx: mpsc::Sender<Desired>,
    local: watch::Receiver<Option<LocalVtep>>,
    watching: Watching,
) -> Vec<JoinHandle<()>> {
    let reader = NodeReader { names: c.names.clone(), own_name: c.node.clone(), conf: c.conf.clone() };
    match &c.source {
        Source::File(path) => vec![nodes_file::watch(path.clone(), reader, tx, watching)],
        Source::Kube(client) => vec![
            kube::watch_nodes(client.clone(), reader, tx, watching),
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
            let mut tasks = vec![etcd::run(settings.clone(), me, tx, watching)];
            if let Some(client) = &c.etcd_annotations {
                let (node, names) = (c.node.clone(), c.names.clone());
                tasks.push(kube::publish(client.clone(), node, names, local, kube::NetworkCondition::Leave));
            }
            tasks
        }
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    // one agent per node, whatever its directories: refused first, naming the other
    let netns = Arc::new(netns_lock::acquire("this edgevx", netns_lock::Role::Run, &args.paths.state_dir)?);
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    let state = StateDir(args.paths.state_dir.clone());
    // what the operator must change exits 2 here; the host's state is waited for below
    let pending = check(args, &state).await?;
    let (me, verdict) = pending.owner();
    let (me, verdict) = (me.clone(), verdict.clone());
    let _lock = agent_lock(&state)?;
    // another node's state dir (a copied image) is moved aside before anything reads it
    let state = crate::owner::settle(state, &me, verdict);
    let report = Arc::new(LoopReport::new(pending.source_name()));
    // the probes answer while the agent waits for the host (503, saying what for)
    metrics::serve(pending.args().metrics_addr, report.clone(), PinDir::new(&pending.args().paths.bpffs))?;
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut notifier = notify::Notifier::new(netns.clone());
    let waited = wait_host::wait_for_host(&pending, &handle, &report, &notifier, (&mut term, &mut int)).await?;
    let Some(c) = waited else {
        notifier.stopping();
        info!("stopping before the first bring-up; the dataplane was not brought up");
        return Ok(());
    };
    notifier.bringing_up();
    run_until_stopped(&c, handle, &state, &report, &mut notifier, (&mut term, &mut int)).await
}

/// Takes the agent lock on the state dir: a second agent is refused,
/// naming the first; the lock file is created only if there is none yet.
fn agent_lock(state: &StateDir) -> Result<lock::AgentLock> {
    // one agent per node: a second one is refused here, naming the first
    let early = lock::acquire_existing(&state.0)?;
    // the first thing that touches the host (the checks only read)
    match early {
        Some(l) => Ok(l),
        None => lock::acquire(&state.0),
    }
}

/// Runs the agent until SIGTERM or SIGINT: the dataplane restored from the
/// cached view first, if there is one, then the source started, and each
/// job run when it is due. Then stops the source; the dataplane stays.
async fn run_until_stopped(
    c: &Checked,
    handle: rtnetlink::Handle,
    state: &StateDir,
    report: &Arc<LoopReport>,
    notifier: &mut notify::Notifier,
    stop: (&mut Signal, &mut Signal),
) -> Result<()> {
    let (term, int) = stop;
    let mut kernel = crate::events::kernel::subscribe()?;

    let (tx, mut rx) = mpsc::channel::<Desired>(8);
    let (local_tx, local_rx) = watch::channel::<Option<LocalVtep>>(None);
    info!(source = c.source.name(), node = %c.node, "agent starting");
    let restored = cached_view(c, state, report);
    let mut due = Due::default();
    if restored.is_some() {
        due.ask(Asks::run(Job::Pass, Duration::ZERO), Instant::now());
    }
    let mut agent = Agent::new(c, handle, state.clone(), report.clone(), local_tx, restored);
    // the source starts once the restore has been tried, or now without one
    let mut waiting = Some((tx, local_rx));
    let mut tasks = Vec::new();

    let mut resync = tokio::time::interval(RESYNC_EVERY);
    resync.tick().await;
    // the loop's heartbeat for /healthz: it ticks at least this often
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    loop {
        if let Some((tx, local_rx)) = waiting.take_if(|_| agent.restore_tried) {
            tasks = start_source(c, state, tx, local_rx, report.watching.clone());
        }
        report.tick();
        let next = due.next();
        let asks = tokio::select! {
            Some(d) = rx.recv() => agent.on_view(d),
            Some(ev) = kernel.recv() => agent.on_kernel(ev),
            _ = until(next) => Asks::nothing(),
            _ = heartbeat.tick() => Asks::nothing(),
            _ = resync.tick() => agent.resync(),
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        run_due(&mut agent, &mut due, asks).await?;
        notifier.ready_if(report);
    }
    notifier.stopping();
    for t in tasks {
        t.abort();
    }
    info!("stopping; the dataplane stays in place (edgevx cleanup removes it)");
    Ok(())
}

/// The cached view to bring the dataplane back from before the control
/// plane is asked anything, if there is one; none for the nodes file.
fn cached_view(c: &Checked, state: &StateDir, report: &LoopReport) -> Option<Desired> {
    // restore first: with a cached view, the dataplane comes back from it
    // before the control plane is asked anything, so a node that starts cut
    // off (or slow to reach it) forwards at once; the source's view is then
    // reconciled against the kernel like any other, quietly when it agrees
    if matches!(c.source, Source::File(_)) {
        return None;
    }
    match state.load_view() {
        Ok(Some(cached)) => {
            report.view_from_cache(state);
            info!(
                source = c.source.name(),
                "restoring the dataplane from the cached view first; asking the control plane meanwhile"
            );
            Some(cached)
        }
        Ok(None) => {
            info!(source = c.source.name(), "no cached view; waiting for the control plane");
            None
        }
        Err(e) => {
            warn!("cannot read the cached view, so waiting for the control plane: {e:#}");
            None
        }
    }
}

/// Sleeps until `at`, or for ever when no job is due.
async fn until(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(t.into()).await,
        None => std::future::pending::<()>().await,
    }
}

/// Takes what the loop's wake-up `asks` for, then runs each job due now,
/// in [`JOBS`]' order, taking what each one asks for in turn.
async fn run_due(agent: &mut Agent<'_>, due: &mut Due, asks: Asks) -> Result<()> {
    let now = Instant::now();
    due.ask(asks, now);
    for job in JOBS {
        if due.take(job, now) {
            due.ask(agent.run(job).await?, now);
        }
    }
    Ok(())
}
