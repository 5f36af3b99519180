//! What the run loop reports about itself: a heartbeat, how ready the
//! dataplane is, its reconcile passes, where its view came from, and the
//! peers it programmed (for the per-peer labels). The loop writes here with
//! a few atomic stores per pass; the HTTP thread only reads.
use std::{
    net::Ipv4Addr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
};

use crate::{cache::VIEW_FILE, peer::Peer, state::StateDir};

/// How far the dataplane is from serving traffic (`/readyz`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// No view names this node with a pod CIDR yet, or the first bring-up
    /// (device, maps, subnet.env) has not succeeded.
    Starting,
    /// Brought up and reconciled, but attaching the programs failed; retried.
    NotAttached,
    /// subnet.env is written, the programs are attached and a reconcile
    /// pass has completed since the last bring-up.
    Ready,
    /// The VTEP device or an attached program vanished; the dataplane is
    /// being built again.
    Rebuilding,
}

impl Readiness {
    /// What `/readyz` says (also when it is 200).
    pub fn reason(self) -> &'static str {
        match self {
            Readiness::Starting => "starting: waiting for this node's pod CIDR and the first bring-up",
            Readiness::NotAttached => "the programs are not attached yet",
            Readiness::Ready => "ready",
            Readiness::Rebuilding => "the dataplane was found broken and is being rebuilt",
        }
    }
}

/// The step of a pass that failed (`edgevx_reconcile_errors_total{stage}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The device, maps, firewall rules or subnet.env could not be set up.
    BringUp,
    /// A new own pod CIDR could not be applied.
    Readdress,
    /// A peer could not be programmed or removed, or stale state collected.
    Peers,
    /// The programs could not be attached.
    Attach,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::BringUp, Stage::Readdress, Stage::Peers, Stage::Attach];

    pub fn label(self) -> &'static str {
        match self {
            Stage::BringUp => "bring_up",
            Stage::Readdress => "readdress",
            Stage::Peers => "peers",
            Stage::Attach => "attach",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
}

/// A programmed peer, as the metrics label it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerKey {
    pub node: String,
    pub public_ip: Ipv4Addr,
}

/// The reconcile counters; registered into every scrape (shared handles).
#[derive(Clone, Debug)]
pub struct PassMetrics {
    /// Times a check found a program ahead of decap and put decap back first.
    pub decap_displaced: Counter,
    pub passes: Counter,
    pub errors: Family<StageLabels, Counter>,
    pub duration: Histogram,
    pub rebuilds: Counter,
}

/// Whether the source is in touch with the control plane now
/// (`edgevx_source_watching`): it has read it in full and its watch is
/// open. A quiet watch sends nothing (etcd leases change once a day), so
/// the view's age alone cannot tell a quiet source from a lost one; this
/// can. The source sets it, a scrape reads it.
#[derive(Clone, Debug, Default)]
pub struct Watching(Arc<AtomicBool>);

impl Watching {
    /// The source read the control plane in full and watches it.
    pub fn on(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The watch failed or ended: the source reconnects or lists again.
    pub fn off(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub struct LoopReport {
    /// The source's name, as the logs say it (`nodes file`, `etcd`, ...).
    pub source: &'static str,
    started: Instant,
    /// Milliseconds from `started` to the loop's last tick.
    last_tick_ms: AtomicU64,
    readiness: Mutex<Readiness>,
    /// What the agent waits for before its first bring-up (a host state
    /// that fixes itself: no default route yet, no bpffs yet), if anything.
    waiting: Mutex<Option<String>>,
    connected: AtomicBool,
    /// Set by the source (see [`Watching`]).
    pub watching: Watching,
    /// When the view in use arrived from the source (a cached view: when it was cached).
    view_at: Mutex<Option<SystemTime>>,
    peers: Mutex<Vec<PeerKey>>,
    /// What the last check found running ahead of decap on the underlay's
    /// ingress (empty: decap was first), as `Foreign` renders it.
    ahead_of_decap: Mutex<Vec<String>>,
    /// Whether a check has looked at decap's place since the dataplane came up.
    decap_checked: AtomicBool,
    pub pass: PassMetrics,
    /// The first bring-up's milestones (restore first).
    pub startup: super::startup::Startup,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // the data is plain values: a panic elsewhere cannot leave it half-written
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LoopReport {
    pub fn new(source: &'static str) -> Self {
        let errors = Family::<StageLabels, Counter>::default();
        for s in Stage::ALL {
            // every stage shows up at 0, so a rate() has a series to start from
            let _ = errors.get_or_create(&StageLabels { stage: s.label() });
        }
        LoopReport {
            source,
            started: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            readiness: Mutex::new(Readiness::Starting),
            waiting: Mutex::new(None),
            connected: AtomicBool::new(false),
            watching: Watching::default(),
            view_at: Mutex::new(None),
            peers: Mutex::new(Vec::new()),
            ahead_of_decap: Mutex::new(Vec::new()),
            decap_checked: AtomicBool::new(false),
            pass: PassMetrics {
                decap_displaced: Counter::default(),
                passes: Counter::default(),
                errors,
                // 1 ms .. about 16 s
                duration: Histogram::new(exponential_buckets(0.001, 4.0, 8)),
                rebuilds: Counter::default(),
            },
            startup: Default::default(),
        }
    }

    /// The loop is alive: called once per iteration (at least once a second).
    pub fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    /// How long ago the loop last ticked.
    pub fn since_tick(&self) -> Duration {
        let last = Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn readiness(&self) -> Readiness {
        *lock(&self.readiness)
    }

    /// The agent waits for the host (`Some`: what for), or no longer does.
    pub fn waiting_for(&self, what: Option<String>) {
        *lock(&self.waiting) = what;
    }

    /// What the agent waits for, if anything (`/readyz` says it).
    pub fn waiting(&self) -> Option<String> {
        lock(&self.waiting).clone()
    }

    /// The dataplane was found broken; it is rebuilt from the next pass on.
    pub fn rebuilding(&self) {
        self.pass.rebuilds.inc();
        *lock(&self.readiness) = Readiness::Rebuilding;
    }

    /// A pass that stopped at `stage` (the view is retried later).
    pub fn pass_failed(&self, stage: Stage, started: Instant) {
        self.pass.passes.inc();
        self.pass.errors.get_or_create(&StageLabels { stage: stage.label() }).inc();
        self.pass.duration.observe(started.elapsed().as_secs_f64());
    }

    /// A pass that reconciled the peers (`peers_ok`: all of them as desired)
    /// and then attached the programs, or failed to (`attached`).
    pub fn pass_done(&self, started: Instant, peers_ok: bool, attached: bool) {
        self.pass.passes.inc();
        if !peers_ok {
            self.pass.errors.get_or_create(&StageLabels { stage: Stage::Peers.label() }).inc();
        }
        if !attached {
            self.pass.errors.get_or_create(&StageLabels { stage: Stage::Attach.label() }).inc();
        }
        self.pass.duration.observe(started.elapsed().as_secs_f64());
        let mut r = lock(&self.readiness);
        *r = match (*r, attached) {
            (_, true) => Readiness::Ready,
            // a rebuild that cannot attach is still a rebuild
            (Readiness::Rebuilding, false) => Readiness::Rebuilding,
            (_, false) => Readiness::NotAttached,
        };
    }

    /// A complete view arrived from the source just now.
    pub fn view_from_source(&self) {
        self.connected.store(true, Ordering::Relaxed);
        *lock(&self.view_at) = Some(SystemTime::now());
    }

    /// The source did not answer; the cached view in `state` is used.
    pub fn view_from_cache(&self, state: &StateDir) {
        let at = std::fs::metadata(state.path(VIEW_FILE)).and_then(|m| m.modified()).unwrap_or(SystemTime::now());
        self.connected.store(false, Ordering::Relaxed);
        *lock(&self.view_at) = Some(at);
    }

    /// Whether the view in use came from the source (not the cache).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// When the view in use arrived (a cached view: when it was cached).
    pub fn view_at(&self) -> Option<SystemTime> {
        *lock(&self.view_at)
    }

    /// Age of the view in use, if there is one.
    pub fn view_age(&self) -> Option<Duration> {
        lock(&self.view_at).map(|at| SystemTime::now().duration_since(at).unwrap_or_default())
    }

    /// The peers now programmed (after a pass), by their IPv4 halves: the
    /// programs count per IPv4 peer (the kernel carries IPv6).
    pub fn set_peers<'a>(&self, peers: impl Iterator<Item = &'a Peer>) {
        let list = peers.filter_map(|p| Some(PeerKey { node: p.node.clone(), public_ip: p.v4?.public_ip })).collect();
        *lock(&self.peers) = list;
    }

    pub fn peers(&self) -> Vec<PeerKey> {
        lock(&self.peers).clone()
    }

    /// What a check found ahead of decap (empty: it was first). Anything
    /// there was put back behind it, or the check says why not.
    pub fn decap_checked(&self, ahead: Vec<String>) {
        if !ahead.is_empty() {
            self.pass.decap_displaced.inc();
        }
        self.decap_checked.store(true, Ordering::Relaxed);
        *lock(&self.ahead_of_decap) = ahead;
    }

    /// What the last check found ahead of decap.
    pub fn ahead_of_decap(&self) -> Vec<String> {
        lock(&self.ahead_of_decap).clone()
    }

    /// Whether decap was first at the last check (`None`: not checked yet).
    pub fn decap_first(&self) -> Option<bool> {
        self.decap_checked.load(Ordering::Relaxed).then(|| lock(&self.ahead_of_decap).is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_an_attached_pass_and_again_after_a_rebuild() {
        let r = LoopReport::new("nodes file");
        assert_eq!(r.readiness(), Readiness::Starting);
        r.pass_failed(Stage::BringUp, Instant::now());
        assert_eq!(r.readiness(), Readiness::Starting);
        r.pass_done(Instant::now(), true, false);
        assert_eq!(r.readiness(), Readiness::NotAttached);
        r.pass_done(Instant::now(), true, true);
        assert_eq!(r.readiness(), Readiness::Ready);
        r.rebuilding();
        assert_eq!(r.readiness(), Readiness::Rebuilding);
        r.pass_failed(Stage::BringUp, Instant::now());
        r.pass_done(Instant::now(), false, false);
        assert_eq!(r.readiness(), Readiness::Rebuilding, "still rebuilding until attached");
        r.pass_done(Instant::now(), false, true);
        assert_eq!(r.readiness(), Readiness::Ready, "a failed peer does not make the node unready");
        assert_eq!(r.pass.passes.get(), 6);
        assert_eq!(r.pass.rebuilds.get(), 1);
        let errors = |s: Stage| r.pass.errors.get_or_create(&StageLabels { stage: s.label() }).get();
        assert_eq!((errors(Stage::BringUp), errors(Stage::Peers), errors(Stage::Attach)), (2, 2, 2));
        assert_eq!(errors(Stage::Readdress), 0);
    }

    #[test]
    fn a_program_ahead_of_decap_is_reported_until_a_check_finds_decap_first() {
        let r = LoopReport::new("nodes file");
        assert_eq!(r.decap_first(), None, "not checked yet");
        r.decap_checked(Vec::new());
        assert_eq!(r.decap_first(), Some(true));
        r.decap_checked(vec!["id 42 name observe".into()]);
        assert_eq!(r.decap_first(), Some(false));
        assert_eq!(r.ahead_of_decap(), vec!["id 42 name observe".to_string()]);
        assert_eq!(r.pass.decap_displaced.get(), 1);
        r.decap_checked(Vec::new());
        assert_eq!(r.decap_first(), Some(true));
        assert_eq!(r.pass.decap_displaced.get(), 1, "counted once per finding");
    }

    #[test]
    fn the_view_age_counts_from_the_cache_file() {
        let dir = std::env::temp_dir().join(format!("edgevx-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = StateDir(dir.clone());
        let r = LoopReport::new("etcd");
        assert_eq!(r.view_age(), None);
        std::fs::write(state.path(VIEW_FILE), b"{}").unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options().write(true).open(state.path(VIEW_FILE)).unwrap().set_modified(old).unwrap();
        r.view_from_cache(&state);
        assert!(!r.connected());
        assert!(r.view_age().unwrap() >= Duration::from_secs(3600));
        r.view_from_source();
        assert!(r.connected());
        assert!(r.view_age().unwrap() < Duration::from_secs(60));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn watching_is_what_the_source_last_said_through_any_handle() {
        let r = LoopReport::new("etcd");
        assert!(!r.watching.get(), "not watching before the source has read anything");
        let source = r.watching.clone();
        source.on();
        assert!(r.watching.get());
        source.off();
        assert!(!r.watching.get(), "a lost watch shows, whatever the view's age");
        r.view_from_source();
        assert!(!r.watching.get(), "a view does not say the watch is open");
    }

    #[test]
    fn tick_age_grows_until_the_next_tick() {
        let r = LoopReport::new("etcd");
        r.tick();
        assert!(r.since_tick() < Duration::from_secs(5));
    }
}
