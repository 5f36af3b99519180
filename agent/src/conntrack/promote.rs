//! Liberal promotion: the fast path reports, through the ring buffer
//! [`FP_EVENTS`](edgevx_common::fastpath::FP_EVENTS), TCP flows it would
//! take but for window tracking; this loop makes each liberal through
//! ctnetlink. A flow (either direction) is asked about at most once per
//! [`REPEAT_AFTER`], however often the program reports it.
use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use edgevx_common::fastpath::{FlowEvent, FlowKey};
use tokio::{
    io::{Interest, unix::AsyncFd},
    task::JoinHandle,
};
use tracing::{debug, warn};

use super::{CtNetlink, Outcome, make_liberal};

/// A flow is sent to conntrack again only after this long.
pub const REPEAT_AFTER: Duration = Duration::from_secs(1);
/// Past this many remembered flows, the expired ones are forgotten; if
/// none is, all are (a repeat request is harmless, an unbounded map not).
const REMEMBER: usize = 16384;
/// Records taken from the ring buffer before they are acted on.
const BATCH: usize = 256;
/// Failures are logged at most this often (each is counted).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the loop did, for the metrics.
#[derive(Debug, Default)]
pub struct PromoteCounters {
    /// Flows made liberal.
    pub done: AtomicU64,
    /// Flows whose entry was gone by then.
    pub gone: AtomicU64,
    /// Requests conntrack refused or that could not be sent.
    pub errors: AtomicU64,
    /// Reports dropped as repeats within [`REPEAT_AFTER`].
    pub repeats: AtomicU64,
    /// Ring buffer records too short to be a [`FlowEvent`].
    pub malformed: AtomicU64,
}

/// Where reported flows come from: the ring buffer, or a test's fake.
pub trait FlowEvents {
    /// Waits for at least one report and appends what is there to `out`.
    fn next_batch(&mut self, out: &mut Vec<FlowKey>) -> impl Future<Output = Result<()>> + Send;
}

/// The flows the fast path program reports in its ring buffer.
pub struct RingEvents {
    ring: AsyncFd<RingBuf<MapData>>,
    counters: Arc<PromoteCounters>,
}

impl RingEvents {
    pub fn new(ring: RingBuf<MapData>, counters: Arc<PromoteCounters>) -> Result<Self> {
        // SAFETY: the RingBuf owns its map's fd, open and the same until it is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(std::io::Error::from)
            .context("cannot poll the fast path's event ring buffer")?;
        Ok(RingEvents { ring, counters })
    }
}

/// A ring buffer record as the program writes it.
pub fn decode(record: &[u8]) -> Option<FlowKey> {
    const _: () = assert!(size_of::<FlowEvent>() == 16);
    let r = record.get(..size_of::<FlowEvent>())?;
    Some(FlowKey {
        saddr: [r[0], r[1], r[2], r[3]],
        daddr: [r[4], r[5], r[6], r[7]],
        sport: [r[8], r[9]],
        dport: [r[10], r[11]],
        proto: r[12],
        _pad: [0; 3],
    })
}

impl FlowEvents for RingEvents {
    async fn next_batch(&mut self, out: &mut Vec<FlowKey>) -> Result<()> {
        loop {
            let mut guard = self.ring.readable_mut().await.context("cannot wait on the event ring buffer")?;
            let ring = guard.get_inner_mut();
            let mut drained = false;
            while out.len() < BATCH {
                let Some(record) = ring.next() else {
                    drained = true;
                    break;
                };
                match decode(&record) {
                    Some(key) => out.push(key),
                    None => _ = self.counters.malformed.fetch_add(1, Ordering::Relaxed),
                }
            }
            // readiness is edge-like: cleared only once the ring is empty
            if drained {
                guard.clear_ready();
            }
            if !out.is_empty() {
                return Ok(());
            }
        }
    }
}

/// A flow's two directions as one key.
fn canonical(k: &FlowKey) -> FlowKey {
    let reverse = FlowKey { saddr: k.daddr, daddr: k.saddr, sport: k.dport, dport: k.sport, ..*k };
    if (k.saddr, k.sport) <= (k.daddr, k.dport) { *k } else { reverse }
}

/// Which flows were asked about lately.
#[derive(Debug, Default)]
pub struct Dedup {
    asked: HashMap<FlowKey, Instant>,
}

impl Dedup {
    /// Whether flow `key` may be asked about at `now` (and records it).
    pub fn admit(&mut self, key: &FlowKey, now: Instant) -> bool {
        let key = canonical(key);
        if let Some(t) = self.asked.get(&key)
            && now.saturating_duration_since(*t) < REPEAT_AFTER
        {
            return false;
        }
        if self.asked.len() >= REMEMBER {
            self.asked.retain(|_, t| now.saturating_duration_since(*t) < REPEAT_AFTER);
            if self.asked.len() >= REMEMBER {
                self.asked.clear();
            }
        }
        self.asked.insert(key, now);
        true
    }
}

/// One report: deduplicated, sent, counted.
pub struct Promoter {
    sock: CtNetlink,
    dedup: Dedup,
    counters: Arc<PromoteCounters>,
    warned: Option<Instant>,
}

impl Promoter {
    pub fn new(sock: CtNetlink, counters: Arc<PromoteCounters>) -> Self {
        Promoter { sock, dedup: Dedup::default(), counters, warned: None }
    }

    pub fn handle(&mut self, key: &FlowKey, now: Instant) {
        let c = &self.counters;
        if !self.dedup.admit(key, now) {
            c.repeats.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match make_liberal(&self.sock, key) {
            Ok(Outcome::Done) => _ = c.done.fetch_add(1, Ordering::Relaxed),
            Ok(Outcome::Gone) => _ = c.gone.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                if self.warned.is_none_or(|t| now.saturating_duration_since(t) >= WARN_EVERY) {
                    self.warned = Some(now);
                    warn!("fast path: {e:#} (the flow stays on the host stack)");
                } else {
                    debug!("fast path: {e:#}");
                }
            }
        }
    }
}

/// Acts on reports until the source fails.
pub async fn run(mut events: impl FlowEvents, mut promoter: Promoter) -> Result<()> {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        batch.clear();
        events.next_batch(&mut batch).await?;
        let now = Instant::now();
        for key in &batch {
            promoter.handle(key, now);
        }
    }
}

/// Starts the loop on the fast path's ring buffer; `sock` must have been
/// opened in the namespace whose conntrack the program looks up.
pub fn spawn(ring: RingBuf<MapData>, sock: CtNetlink, counters: Arc<PromoteCounters>) -> Result<JoinHandle<()>> {
    let events = RingEvents::new(ring, counters.clone())?;
    let promoter = Promoter::new(sock, counters);
    Ok(tokio::spawn(async move {
        if let Err(e) = run(events, promoter).await {
            warn!("fast path: liberal promotion stopped: {e:#}");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sport: u16) -> FlowKey {
        FlowKey {
            saddr: [10, 244, 1, 2],
            daddr: [10, 244, 2, 2],
            sport: sport.to_be_bytes(),
            dport: 80u16.to_be_bytes(),
            proto: 6,
            _pad: [0; 3],
        }
    }

    fn reverse(k: &FlowKey) -> FlowKey {
        FlowKey { saddr: k.daddr, daddr: k.saddr, sport: k.dport, dport: k.sport, ..*k }
    }

    #[test]
    fn a_flow_is_admitted_once_a_second_in_either_direction() {
        let mut d = Dedup::default();
        let t0 = Instant::now();
        assert!(d.admit(&key(1000), t0));
        assert!(!d.admit(&key(1000), t0 + Duration::from_millis(500)));
        assert!(
            !d.admit(&reverse(&key(1000)), t0 + Duration::from_millis(900)),
            "the reply direction is the same flow"
        );
        assert!(d.admit(&key(1001), t0), "another flow is not held back");
        assert!(d.admit(&reverse(&key(1000)), t0 + REPEAT_AFTER));
    }

    #[test]
    fn the_memory_stays_bounded() {
        let mut d = Dedup::default();
        let t0 = Instant::now();
        for p in 0..REMEMBER as u16 {
            assert!(d.admit(&key(p), t0));
        }
        // all still fresh: forgotten wholesale rather than growing
        assert!(d.admit(&key(u16::MAX), t0));
        assert!(d.asked.len() <= REMEMBER);
        assert!(d.admit(&key(0), t0), "forgotten, so asked again (harmless)");
    }

    #[test]
    fn records_decode_and_short_ones_do_not() {
        let k = key(4242);
        let mut rec = Vec::new();
        rec.extend_from_slice(&k.saddr);
        rec.extend_from_slice(&k.daddr);
        rec.extend_from_slice(&k.sport);
        rec.extend_from_slice(&k.dport);
        rec.extend_from_slice(&[6, 0xff, 0xff, 0xff]);
        assert_eq!(decode(&rec), Some(k), "padding is not part of the key");
        assert_eq!(decode(&rec[..15]), None);
    }
}
