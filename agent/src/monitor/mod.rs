//! `edgevx monitor`: the programs' drop events, one line each, read from
//! the pinned ring buffer (common/src/monitor.rs has the event, the watch
//! and the rate limit). Reads pins only, so it works with the agent
//! running or stopped; while it runs it renews the watch, without which the
//! programs write nothing.
//!
//! The ring has one reader position: two monitors at once share the
//! events between them.
mod show;

use std::{collections::HashMap, io::Write, net::IpAddr, path::Path, time::Duration};

use anyhow::{Context, Result, bail};
use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use edgevx_common::monitor::{
    DropEvent, EVENTS_PER_SEC, MON_BUDGET, MON_EVENTS, MON_WATCH, MonitorBudget, MonitorWatch, RENEW_MS, WATCH_MS,
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

pub use self::show::{Names, json, line, rfc3339};
use crate::{
    cli::{MonitorArgs, MonitorType},
    dataplane::bpffs::PinDir,
    state::StateDir,
};

/// The monitor's watch and budget, opened from their pins.
pub struct Pins {
    watch: Array<MapData, MonitorWatch>,
    budget: PerCpuArray<MapData, MonitorBudget>,
}

impl Pins {
    /// Opens the pins under `bpffs` (and the ring buffer of events),
    /// saying what is wrong when they are not there.
    pub fn open(bpffs: &Path) -> Result<(Pins, RingBuf<MapData>)> {
        let pins = PinDir::new(bpffs);
        if !pins.maps().is_dir() {
            bail!(
                "no edgevx dataplane is pinned under {}: is edgevx running here? (--bpffs {})",
                pins.root.display(),
                bpffs.display()
            );
        }
        if !pins.map(MON_EVENTS).exists() {
            bail!(
                "the dataplane pinned under {} has no drop events: an older edgevx loaded it (restart the agent with \
                 this version)",
                pins.root.display()
            );
        }
        let open = |name: &str| -> Result<MapData> {
            let path = pins.map(name);
            MapData::from_pin(&path).with_context(|| format!("cannot open {} (run as root)", path.display()))
        };
        let pins = Pins {
            watch: Array::try_from(Map::Array(open(MON_WATCH)?)).context("the monitor's watch map is not an array")?,
            budget: PerCpuArray::try_from(Map::PerCpuArray(open(MON_BUDGET)?))
                .context("the monitor's budget map is not a per-CPU array")?,
        };
        let events = RingBuf::try_from(Map::RingBuf(open(MON_EVENTS)?))
            .context("the monitor's event map is not a ring buffer")?;
        Ok((pins, events))
    }

    /// Tells the programs to write events for the next [`WATCH_MS`].
    pub fn watch(&mut self) -> Result<()> {
        let until_ns = monotonic_ns().saturating_add(WATCH_MS * 1_000_000);
        self.watch.set(0, &MonitorWatch { until_ns }, 0).context("cannot renew the watch")
    }

    /// Tells the programs to stop writing events now (a monitor that
    /// ends; one killed without a word stops them within [`WATCH_MS`]).
    pub fn unwatch(&mut self) -> Result<()> {
        self.watch.set(0, &MonitorWatch { until_ns: 0 }, 0).context("cannot end the watch")
    }

    /// Every CPU's budget counts, summed.
    pub fn losses(&self) -> Result<Losses> {
        let per_cpu = self.budget.get(&0, 0).context("cannot read the monitor's budget")?;
        Ok(per_cpu.iter().fold(Losses::default(), |a, b| Losses {
            sent: a.sent + b.sent,
            rate: a.rate + b.lost_rate,
            ring: a.ring + b.lost_ring,
        }))
    }
}

/// Events written and lost, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Losses {
    pub sent: u64,
    pub rate: u64,
    pub ring: u64,
}

impl std::ops::Sub for Losses {
    type Output = Losses;
    fn sub(self, o: Losses) -> Losses {
        Losses {
            sent: self.sent.saturating_sub(o.sent),
            rate: self.rate.saturating_sub(o.rate),
            ring: self.ring.saturating_sub(o.ring),
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC, which `bpf_ktime_get_ns` reads.
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The peers the agent last programmed, by public IP (best effort: a
/// monitor without names still shows addresses).
fn peer_names(state_dir: &Path) -> HashMap<IpAddr, String> {
    let peers = StateDir(state_dir.to_path_buf()).load_peers().unwrap_or_else(|e| {
        eprintln!("edgevx monitor: peers are shown without node names: {e:#}");
        Vec::new()
    });
    let mut names = HashMap::new();
    for p in peers {
        if let Some(v4) = &p.v4 {
            names.insert(IpAddr::V4(v4.public_ip), p.node.clone());
        }
        if let Some(v6) = &p.v6 {
            names.insert(IpAddr::V6(v6.public_ip), p.node.clone());
        }
    }
    names
}

fn iface_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname needs.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the name is NUL-terminated within buf.
    Some(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

pub async fn run(args: MonitorArgs) -> Result<()> {
    let MonitorType::Drop = args.r#type;
    let (mut pins, events) = Pins::open(&args.paths.bpffs)?;
    let mut names = Names { ifaces: HashMap::new(), peers: peer_names(&args.paths.state_dir) };
    let start = pins.losses()?;
    // events a monitor before us left in the ring are not this one's
    let started_ns = monotonic_ns();
    pins.watch()?;
    eprintln!("edgevx monitor: showing drops (at most {EVENTS_PER_SEC} a second per CPU); Ctrl-C to stop");
    // event times are CLOCK_MONOTONIC; shown as wall-clock time
    let wall_offset = clock_ns(libc::CLOCK_REALTIME).wrapping_sub(monotonic_ns());
    // SAFETY: the RingBuf owns its map's fd, open and the same until it is dropped.
    let mut ring = unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }
        .map_err(std::io::Error::from)
        .context("cannot poll the monitor's ring buffer")?;
    let mut renew = tokio::time::interval(Duration::from_millis(RENEW_MS));
    let mut term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut shown = 0u64;
    let mut closed = false;
    let stdout = std::io::stdout();
    while !closed {
        tokio::select! {
            _ = renew.tick() => pins.watch()?,
            r = tokio::signal::ctrl_c() => { r.context("cannot catch SIGINT")?; break }
            _ = term.recv() => break,
            guard = ring.readable_mut() => {
                let mut guard = guard.context("cannot wait on the monitor's ring buffer")?;
                let mut out = stdout.lock();
                while let Some(record) = guard.get_inner_mut().next() {
                    let Some(ev) = DropEvent::from_bytes(&record) else { continue };
                    drop(record);
                    if ev.ts_ns < started_ns {
                        continue;
                    }
                    shown += 1;
                    let ifindex = ev.ifindex;
                    if let std::collections::hash_map::Entry::Vacant(e) = names.ifaces.entry(ifindex)
                        && let Some(n) = iface_name(ifindex)
                    {
                        e.insert(n);
                    }
                    let time = rfc3339(ev.ts_ns.wrapping_add(wall_offset));
                    let text = if args.json { json(&time, &ev, &names).to_string() } else { line(&time, &ev, &names) };
                    // a closed pipe (`| head`) ends the monitor
                    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
                        closed = true;
                        break;
                    }
                }
                guard.clear_ready();
            }
        }
    }
    pins.unwatch()?;
    if closed {
        return Ok(());
    }
    let lost = pins.losses()? - start;
    eprintln!(
        "edgevx monitor: {shown} events shown; lost {} to the rate limit ({EVENTS_PER_SEC} a second per CPU) and {} \
         to a full ring",
        lost.rate, lost.ring
    );
    Ok(())
}
