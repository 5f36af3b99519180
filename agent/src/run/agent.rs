//! What the loop runs: the agent's state between events, and its jobs.
//! Each answers with the [`Asks`] for what should run next; the loop in
//! `mod.rs` only schedules them.
use std::{sync::Arc, time::Instant};

use anyhow::Result;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::{
    RETRY_AFTER, SETTLE,
    check::{Checked, Source},
    node::{Node, bring_up, readdress},
    schedule::{Asks, Job},
    warned::Warned,
};
use crate::{
    dataplane::device,
    events::kernel::KernelEvent,
    metrics::{
        LoopReport, Stage,
        startup::{Milestone, STARTUP_FILE},
    },
    peer::{ClusterView, Desired},
    source::LocalVtep,
    state::StateDir,
};

/// Where the view in force came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
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

/// The agent between events.
pub(super) struct Agent<'a> {
    c: &'a Checked,
    handle: rtnetlink::Handle,
    state: StateDir,
    report: Arc<LoopReport>,
    /// What this node publishes (the Kubernetes source writes it).
    local: watch::Sender<Option<LocalVtep>>,
    phase: Phase,
    desired: Option<Desired>,
    origin: Origin,
    /// Whether the view in force has been cached since it arrived.
    cached: bool,
    /// Whether a failure to cache the view has been said (once, until one is saved).
    cache_failure_said: bool,
    warned: Warned,
    /// Whether a pass has run, so restoring from the cache has been tried
    /// and the source may start.
    pub(super) restore_tried: bool,
}

impl<'a> Agent<'a> {
    /// The agent before its first pass; `restored` is the cached view it
    /// starts from, if any.
    pub(super) fn new(
        c: &'a Checked,
        handle: rtnetlink::Handle,
        state: StateDir,
        report: Arc<LoopReport>,
        local: watch::Sender<Option<LocalVtep>>,
        restored: Option<Desired>,
    ) -> Self {
        let origin = if restored.is_some() { Origin::Cache } else { Origin::Source };
        Agent {
            c,
            handle,
            state,
            report,
            local,
            phase: Phase::Down,
            restore_tried: restored.is_none(),
            cached: restored.is_some(),
            cache_failure_said: false,
            desired: restored,
            origin,
            warned: Warned::default(),
        }
    }

    /// A view from the source. An identical one (a heartbeat of an
    /// unrelated Node) does nothing at all.
    pub(super) fn on_view(&mut self, d: Desired) -> Asks {
        self.report.view_from_source();
        if self.origin == Origin::Cache {
            info!(source = self.c.source.name(), "control plane reachable again; reconciling");
            self.origin = Origin::Source;
        }
        if self.desired.as_ref() == Some(&d) {
            return Asks::nothing();
        }
        log_view(&d.view, &mut self.warned);
        self.desired = Some(d);
        self.cached = false;
        Asks::run(Job::Pass, std::time::Duration::ZERO)
    }

    /// A change in the kernel: which job it calls for, after the burst
    /// settles.
    pub(super) fn on_kernel(&mut self, ev: KernelEvent) -> Asks {
        let Phase::Up(n) = &mut self.phase else { return Asks::nothing() };
        // with DirectRouting, the underlay's routes are ours too, or say what is on-link
        let direct = self.desired.as_ref().is_some_and(|d| d.conf.direct_routing);
        // the IPv6 VTEP's routes, neighbours and fdb entries are ours too
        let ours = |oif: Option<u32>| oif.is_some_and(|i| n.is_vtep(i));
        let underlay = self.c.underlay.index;
        match ev {
            KernelEvent::Route { oif, .. } if ours(oif) || (direct && oif == Some(underlay)) => {
                n.forget_kernel();
                Asks::run(Job::Pass, SETTLE)
            }
            KernelEvent::Neighbour { index } if n.holds_entries(index) => {
                n.forget_kernel();
                Asks::run(Job::Pass, SETTLE)
            }
            KernelEvent::Link { index, .. } | KernelEvent::Address { index } if index == underlay => {
                Asks::run(Job::Check, SETTLE)
            }
            KernelEvent::Link { index, .. } if n.is_vtep(index) => Asks::run(Job::Check, SETTLE),
            KernelEvent::Link { .. } | KernelEvent::Neighbour { .. } => Asks::run(Job::Learn, SETTLE),
            _ => Asks::nothing(),
        }
    }

    /// The safety net: read the kernel back, whatever we think it holds.
    pub(super) fn resync(&mut self) -> Asks {
        if let Phase::Up(n) = &mut self.phase {
            n.forget_kernel();
        }
        Asks::everything()
    }

    /// Runs `job`. An error is one the agent cannot go on from.
    pub(super) async fn run(&mut self, job: Job) -> Result<Asks> {
        Ok(match job {
            Job::Check => self.check().await?,
            Job::Learn => {
                if let Phase::Up(n) = &mut self.phase {
                    n.learn_pods().await;
                }
                Asks::nothing()
            }
            Job::Pass => {
                self.restore_tried = true;
                self.pass().await
            }
        })
    }

    /// The underlay, the VTEP's MTU and MAC, and whether the VTEP and the
    /// programs are still there.
    async fn check(&mut self) -> Result<Asks> {
        let c = self.c;
        let underlay = match underlay_now(c, &self.handle).await {
            Ok(u) => u,
            Err(what) => anyhow::bail!(
                "the underlay {} changed: {what}; exiting so that the supervisor restarts edgevx on the new \
                 underlay (the dataplane stays in place meanwhile)",
                c.iface
            ),
        };
        let Phase::Up(n) = &mut self.phase else { return Ok(Asks::nothing()) };
        let mut asks = Asks::nothing();
        n.warn_off_underlay();
        if let Some(d) = &self.desired
            && let Err(e) = n.follow_mtu(&d.conf, underlay.mtu, &self.state).await
        {
            warn!("cannot bring the VTEP's MTU in line with the underlay's, retrying: {e:#}");
            asks = asks.and(Job::Check, RETRY_AFTER);
        }
        if let Err(e) = n.keep_macs().await {
            warn!("cannot put the VTEP's MAC back, retrying: {e:#}");
            asks = asks.and(Job::Check, RETRY_AFTER);
        }
        match n.intact().await {
            Ok(true) => asks = asks.with(keep_decap_first(n, &self.c.iface, &self.report).await),
            Ok(false) => {
                // someone deleted the VTEP or detached a program: build it all again
                warn!("the VTEP device or an attached program is gone; rebuilding the dataplane");
                self.report.rebuilding();
                self.phase = Phase::Down;
                asks = asks.and(Job::Pass, std::time::Duration::ZERO);
            }
            // EMFILE, ENOMEM: the agent's trouble, not the dataplane's, which stays
            Err(e) => {
                warn!("cannot check the VTEP device and the attached programs, leaving them as they are: {e:#}");
                asks = asks.and(Job::Check, RETRY_AFTER);
            }
        }
        Ok(asks)
    }

    /// The reconcile pass: the dataplane brought up or re-addressed as the
    /// view says, then the peers, the rules, the attach and the local pods.
    async fn pass(&mut self) -> Asks {
        let retry = Asks::run(Job::Pass, RETRY_AFTER);
        let pass = Instant::now();
        if let Err(asks) = self.come_up(pass).await {
            return asks;
        }
        if let Some(asks) = self.rebuild_if_families_changed() {
            return asks;
        }
        let (Some(d), Phase::Up(n)) = (self.desired.as_ref(), &mut self.phase) else { return Asks::nothing() };
        let conf_changed = d.conf.vni != n.record().vni
            || d.conf.port != n.record().port
            || n.record().v4.as_ref().is_some_and(|v4| v4.network != d.conf.network);
        if conf_changed && !self.cached {
            warn!("the network config changed (VNI, port or Network); restart the agent to apply it");
        }
        let (peers_ok, attached, mut asks) = sync_node(n, d, self.c, &self.state, &self.report, &mut self.warned).await;
        let report = &self.report;
        if let Some(t) = n.first_peer_at() {
            report.startup.reached(Milestone::FirstPeer, t);
        }
        if peers_ok && attached {
            report.startup.reached(Milestone::AllPeers, Instant::now());
        }
        report.pass_done(pass, peers_ok, attached);
        // off the path to forwarding: the figures for `edgevx status`
        if let Some(figures) = report.startup.take_changed() {
            // best effort (records.rs)
            self.state.save_record(STARTUP_FILE, &figures);
        }
        if !(peers_ok && attached) {
            asks = asks.with(retry);
        }
        self.cache_view();
        asks
    }

    /// The dataplane up as the view says: brought up when it is down,
    /// re-addressed when our pod CIDRs changed. `Err`: what to run instead
    /// of the rest of the pass (nothing to do, or a retry).
    async fn come_up(&mut self, pass: Instant) -> Result<(), Asks> {
        let (c, report) = (self.c, &self.report);
        let Some(d) = self.desired.as_ref() else { return Err(Asks::nothing()) };
        let Some(own) = d.view.own.clone() else { return Err(Asks::nothing()) };
        match &mut self.phase {
            Phase::Down => {
                let others = crate::vtep_mac::OthersMacs::of(&d.view.peers);
                match bring_up(c, &d.conf, own, &others, &self.state, &self.handle, &report.startup).await {
                    Ok(n) => {
                        self.local.send_replace(Some(n.local_vtep()));
                        self.phase = Phase::Up(Box::new(n));
                    }
                    Err(e) => {
                        // a program the verifier refuses: retried with a back-off, its log once per change
                        let after = e
                            .chain()
                            .find_map(|c| c.downcast_ref::<crate::dataplane::refused::Refused>())
                            .map_or(RETRY_AFTER, crate::dataplane::refused::Refused::retry_after);
                        error!(retry_in_secs = after.as_secs(), "cannot bring up the dataplane, retrying: {e:#}");
                        report.pass_failed(Stage::BringUp, pass);
                        return Err(Asks::run(Job::Pass, after));
                    }
                }
            }
            Phase::Up(n) if n.own().subnet != own.subnet || n.own().subnet6 != own.subnet6 => {
                warn!(old = ?n.own().subnet, new = ?own.subnet, old6 = ?n.own().subnet6, new6 = ?own.subnet6,
                    "own pod CIDR changed; re-addressing the VTEP");
                if let Err(e) = readdress(n, &own, &self.state).await {
                    error!("cannot apply the new pod CIDR: {e:#}");
                    report.pass_failed(Stage::Readdress, pass);
                    return Err(Asks::run(Job::Pass, RETRY_AFTER));
                }
                self.local.send_replace(Some(n.local_vtep()));
            }
            Phase::Up(_) => {}
        }
        Ok(())
    }

    /// A dual-stack node must publish both halves or flannel peers skip it
    /// whole: a change of `EnableIPv4`, `EnableIPv6` or `IPv6Network`
    /// rebuilds the dataplane now.
    fn rebuild_if_families_changed(&mut self) -> Option<Asks> {
        let (Some(d), Phase::Up(n)) = (self.desired.as_ref(), &self.phase) else { return None };
        let families_changed = d.conf.ipv6.as_ref().map(|v6| v6.network) != n.record().v6.as_ref().map(|v6| v6.network)
            || d.conf.ipv4 != n.record().v4.is_some();
        if !families_changed {
            return None;
        }
        warn!("EnableIPv4, EnableIPv6 or IPv6Network changed; rebuilding the dataplane to apply it");
        self.report.rebuilding();
        self.phase = Phase::Down;
        Some(Asks::run(Job::Pass, std::time::Duration::ZERO))
    }

    /// Caches the view in force once, when it came from the source (not a
    /// nodes file, which is its own cache).
    fn cache_view(&mut self) {
        let Some(d) = self.desired.as_ref() else { return };
        if self.cached || self.origin != Origin::Source || matches!(self.c.source, Source::File(_)) {
            return;
        }
        match self.state.save_view(d) {
            Ok(()) => {
                self.cached = true;
                self.cache_failure_said = false;
            }
            // a full or read-only state dir: forwarding goes on, an offline boot would start from an older view
            Err(e) if !self.cache_failure_said => {
                self.cache_failure_said = true;
                warn!("cannot cache the view (tried again with each view; said once): {e:#}");
            }
            Err(_) => {}
        }
    }
}

/// The peers of the view, the rules, the attach, the IPv6 side of a
/// dual-stack node and the local pods: returns whether every peer write
/// went through, whether the programs are attached, and what else to run.
async fn sync_node(
    n: &mut Node,
    d: &Desired,
    c: &Checked,
    state: &StateDir,
    report: &LoopReport,
    warned: &mut Warned,
) -> (bool, bool, Asks) {
    let mut asks = Asks::nothing();
    // the inner-source exemption is the operator's alone (`--any-inner-source`)
    let view = crate::exempt::Exemptions::new(&c.args.any_inner_source);
    let view = view.apply(&d.view);
    let peers_ok = n.reconcile(&view, d.conf.direct_routing, state, warned).await;
    report.set_peers(n.accepted().iter());
    n.enforce_rules();
    let first_attach = !n.attached();
    let attached = match n.attach().await {
        Ok(()) => {
            report.startup.reached(Milestone::Attached, Instant::now());
            if first_attach {
                // what the first pass held back until the programs were on
                asks = asks.and(Job::Pass, std::time::Duration::ZERO);
                // after decap, the authority: the XDP judge only drops early what TC drops
                n.attach_xdp_judge(state).await;
            }
            true
        }
        Err(e) => {
            error!("cannot attach the programs, retrying: {e:#}");
            false
        }
    };
    // the IPv6 kernel entries after the attach: the first IPv4 packet does not wait for them
    let peers_ok = n.reconcile_follower(d.conf.direct_routing).await && peers_ok;
    if attached {
        n.learn_pods().await;
    }
    (peers_ok, attached, asks)
}

/// Decap's place on the underlay's ingress, checked and restored: what ran
/// ahead of it is logged, named, and reported (`/readyz`, the metrics)
/// until a check finds decap first again.
async fn keep_decap_first(n: &mut Node, iface: &str, report: &LoopReport) -> Asks {
    match n.keep_decap_first().await {
        Ok(ahead) if ahead.is_empty() => {
            report.decap_checked(Vec::new());
            Asks::nothing()
        }
        Ok(ahead) => {
            let names: Vec<String> = ahead.iter().map(ToString::to_string).collect();
            warn!(
                iface,
                ahead = %names.join("; "),
                "found programs running ahead of edgevx's decap on the underlay's ingress: VXLAN they passed on \
                 skipped decap's judging (the VTEP dropped it, a peer's traffic with it); decap is put back first. \
                 Attach such programs after edgevx's (TCX: BPF_F_AFTER; clsact: a priority above 1)"
            );
            report.decap_checked(names);
            Asks::nothing()
        }
        Err(e) => {
            warn!("cannot check or restore edgevx's decap as the first program on {iface}'s ingress: {e:#}");
            Asks::run(Job::Check, RETRY_AFTER)
        }
    }
}

fn log_view(view: &ClusterView, warned: &mut Warned) {
    warned.malformed(&view.rejected);
    warned.partial(&view.partial);
    warned.self_exempt(&view.self_exempt);
    for r in &view.ignored {
        debug!(node = %r.node, "not a peer: {}", r.reason);
    }
    if let Some(p) = &view.own_problem {
        error!("{p}; waiting for the nodes file to name this node with a pod CIDR");
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
