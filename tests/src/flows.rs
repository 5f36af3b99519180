//! Long-lived TCP flows between pods, across an upgrade or a restart
//! (Cilium's conn-disrupt practice): each connection streams both ways at
//! once, in numbered records every reader checks, and every reader notes
//! its errors (a reset, an early end, a record out of order) and each
//! stall: a gap between two reads that returned data.
//!
//! The sockets are made inside the pods' namespaces on short-lived
//! threads (setns(2) moves only the calling thread); a socket stays in the
//! namespace it was made in, so the readers and writers run anywhere.
use std::{
    io::{self, ErrorKind, Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::netns::{Netns, in_netns};

/// One record: its sequence number (8 bytes, big endian), then bytes
/// derived from it, so a reader knows a lost, repeated or garbled record.
const RECORD: usize = 1024;
/// Records written at a time, then a pause: a steady trickle, so a gap
/// between reads is the path's, not the sender's (about 400 KB/s a way).
const BURST: usize = 4;
const PAUSE: Duration = Duration::from_millis(10);
/// How often a blocked reader or writer looks at the stop flag.
const TICK: Duration = Duration::from_millis(200);
/// Gaps between reads shorter than this are not kept: the sender pauses
/// [`PAUSE`] between bursts, so shorter gaps are the flow's own rhythm.
pub const NOTICED_GAP: Duration = Duration::from_millis(20);

/// Connections from pods in `client` to a server in `server` at `ip:port`.
pub struct Spec<'a> {
    pub client: &'a Netns,
    pub server: &'a Netns,
    pub ip: IpAddr,
    pub port: u16,
    pub connections: usize,
}

/// What one reader saw: one direction of one connection.
struct Way {
    name: String,
    bytes: AtomicU64,
    /// Since the flows started, when this reader last got data.
    last_read: Mutex<Instant>,
    /// Gaps of at least [`NOTICED_GAP`]: (when the gap ended, how long).
    gaps: Mutex<Vec<(Instant, Duration)>>,
    errors: Mutex<Vec<String>>,
}

impl Way {
    fn new(name: String) -> Self {
        Way {
            name,
            bytes: AtomicU64::new(0),
            last_read: Mutex::new(Instant::now()),
            gaps: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
        }
    }

    fn error(&self, e: impl std::fmt::Display) {
        lock(&self.errors).push(e.to_string());
    }

    fn got(&self, n: usize) {
        let now = Instant::now();
        let gap = now - std::mem::replace(&mut *lock(&self.last_read), now);
        if gap >= NOTICED_GAP {
            lock(&self.gaps).push((now, gap));
        }
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A lock whose holder panicked still holds good numbers.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running flows; [`Flows::stop`] ends them and reports.
pub struct Flows {
    ways: Vec<Arc<Way>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    streams: Vec<TcpStream>,
}

/// The longest stall in a window and whose it was.
#[derive(Debug, Clone)]
pub struct Stall {
    pub longest: Duration,
    pub way: String,
}

impl Flows {
    /// Opens every connection of `specs` and starts streaming both ways.
    pub fn start(specs: &[Spec]) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut flows = Flows { ways: Vec::new(), stop, threads: Vec::new(), streams: Vec::new() };
        for spec in specs {
            let pairs = connect(spec)
                .with_context(|| format!("cannot open the flows {} -> {}:{}", spec.client.name, spec.ip, spec.port))?;
            for (k, (client, server)) in pairs.into_iter().enumerate() {
                let label = format!("{} -> {}:{} #{k}", spec.client.name, spec.ip, spec.port);
                flows.stream(client, server, &label)?;
            }
        }
        Ok(flows)
    }

    /// Both ways of one connection: a writer and a reader at each end.
    fn stream(&mut self, client: TcpStream, server: TcpStream, label: &str) -> Result<()> {
        for (from, to, way) in [(&client, &server, "client to server"), (&server, &client, "server to client")] {
            let w = Arc::new(Way::new(format!("{label} ({way})")));
            let (writer, reader) = (from.try_clone()?, to.try_clone()?);
            for s in [&writer, &reader] {
                s.set_read_timeout(Some(TICK))?;
                s.set_write_timeout(Some(TICK))?;
            }
            let (stop, way) = (self.stop.clone(), w.clone());
            self.threads.push(thread::spawn(move || write_records(writer, &stop, &way)));
            let (stop, way) = (self.stop.clone(), w.clone());
            self.threads.push(thread::spawn(move || read_records(reader, &stop, &way)));
            self.ways.push(w);
        }
        self.streams.extend([client, server]);
        Ok(())
    }

    /// Bytes each way has read so far, in [`Flows::ways`] order.
    pub fn bytes(&self) -> Vec<u64> {
        self.ways.iter().map(|w| w.bytes.load(Ordering::Relaxed)).collect()
    }

    /// The name of every way, one per direction of each connection.
    pub fn ways(&self) -> Vec<String> {
        self.ways.iter().map(|w| w.name.clone()).collect()
    }

    /// When each way last read data, in [`Flows::ways`] order.
    pub fn last_reads(&self) -> Vec<Instant> {
        self.ways.iter().map(|w| *lock(&w.last_read)).collect()
    }

    /// Every error a reader or writer met so far, named by its way.
    pub fn errors(&self) -> Vec<String> {
        self.ways
            .iter()
            .flat_map(|w| lock(&w.errors).iter().map(|e| format!("{}: {e}", w.name)).collect::<Vec<_>>())
            .collect()
    }

    /// Waits until every way has read more than `since` (from
    /// [`Flows::bytes`]) within `bound` (a liveness bound, stretched by
    /// [`crate::patience`]); fails naming the ways that did not move.
    pub fn wait_all_moved(&self, since: &[u64], bound: Duration) -> Result<()> {
        let bound = crate::patience(bound);
        let deadline = Instant::now() + bound;
        loop {
            let stuck: Vec<String> = self
                .ways
                .iter()
                .zip(since)
                .filter(|(w, s)| w.bytes.load(Ordering::Relaxed) <= **s)
                .map(|(w, _)| w.name.clone())
                .collect();
            if stuck.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} of {} ways moved no data within {bound:?}: {}",
                    stuck.len(),
                    self.ways.len(),
                    stuck.join(", ")
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The longest gap between two reads of any way that ended in
    /// `from..=to`, or that is still open at `to`; gaps under
    /// [`NOTICED_GAP`] read as zero.
    pub fn longest_stall(&self, from: Instant, to: Instant) -> Stall {
        let mut worst = Stall { longest: Duration::ZERO, way: String::new() };
        for w in &self.ways {
            let open = to.saturating_duration_since(*lock(&w.last_read));
            let closed = lock(&w.gaps).iter().filter(|(end, _)| *end > from && *end <= to).map(|(_, gap)| *gap).max();
            let longest = closed.unwrap_or_default().max(if open >= NOTICED_GAP { open } else { Duration::ZERO });
            if longest > worst.longest {
                worst = Stall { longest, way: w.name.clone() };
            }
        }
        worst
    }

    /// Stops the writers, lets the readers drain to the end of each way,
    /// and fails with every error any way met.
    pub fn stop(mut self) -> Result<u64> {
        self.finish()?;
        let errors = self.errors();
        if !errors.is_empty() {
            bail!("{} errors on the flows:\n  {}", errors.len(), errors.join("\n  "));
        }
        Ok(self.bytes().iter().sum())
    }

    fn finish(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut panicked = 0;
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                panicked += 1;
            }
        }
        if panicked > 0 {
            return Err(anyhow!("{panicked} flow threads panicked"));
        }
        Ok(())
    }
}

impl Drop for Flows {
    fn drop(&mut self) {
        // a failed test: end everything, do not wait for a drain
        self.stop.store(true, Ordering::Relaxed);
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = self.finish();
    }
}

/// Opens `spec.connections` connections: (client end, server end) each.
fn connect(spec: &Spec) -> Result<Vec<(TcpStream, TcpStream)>> {
    let addr = SocketAddr::new(spec.ip, spec.port);
    let listener = in_netns(spec.server, move || {
        TcpListener::bind(SocketAddr::new(unspecified(addr.ip()), addr.port())).context("bind")
    })?;
    let n = spec.connections;
    let clients = in_netns(spec.client, move || {
        (0..n)
            .map(|_| {
                TcpStream::connect_timeout(&addr, Duration::from_secs(10)).with_context(|| format!("connect {addr}"))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    // the listen queue holds them in the order their handshakes completed,
    // which under load need not be the order of the connects (a SYN
    // retransmitted): each accepted connection is matched by its port
    let mut accepted = Vec::new();
    for _ in 0..n {
        accepted.push(listener.accept().context("accept")?);
    }
    let mut pairs = Vec::new();
    for client in clients {
        let local = client.local_addr()?;
        let at = accepted
            .iter()
            .position(|(_, peer)| peer.port() == local.port())
            .with_context(|| format!("no accepted connection from {local} among {accepted:?}"))?;
        let (server, _) = accepted.swap_remove(at);
        pairs.push((client, server));
    }
    Ok(pairs)
}

fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// Record `seq`: its number, then bytes derived from it (xorshift64).
fn record(seq: u64, buf: &mut [u8; RECORD]) {
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf[8..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Whether `e` is a timeout of the socket's own (a tick, not a failure).
fn ticked(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

/// Writes records until told to stop, then ends its way (FIN).
fn write_records(mut s: TcpStream, stop: &AtomicBool, way: &Way) {
    let mut buf = [0u8; RECORD];
    let mut seq = 0u64;
    'outer: while !stop.load(Ordering::Relaxed) {
        for _ in 0..BURST {
            record(seq, &mut buf);
            let mut done = 0;
            while done < RECORD {
                match s.write(&buf[done..]) {
                    Ok(0) => {
                        way.error("the socket took no more bytes (write returned 0)");
                        return;
                    }
                    Ok(n) => done += n,
                    // blocked: the path is down or slow; the reader counts the stall
                    Err(e) if ticked(&e) => {
                        if stop.load(Ordering::Relaxed) && done == 0 {
                            break 'outer;
                        }
                    }
                    Err(e) => {
                        way.error(format!("write of record {seq}: {e}"));
                        return;
                    }
                }
            }
            seq += 1;
        }
        thread::sleep(PAUSE);
    }
    if let Err(e) = s.shutdown(Shutdown::Write) {
        way.error(format!("shutdown after record {seq}: {e}"));
    }
}

/// Reads and checks records until the writer's end; an end before the
/// stop, or any error, is recorded.
fn read_records(mut s: TcpStream, stop: &AtomicBool, way: &Way) {
    let (mut buf, mut want) = ([0u8; RECORD], [0u8; RECORD]);
    let (mut have, mut seq) = (0usize, 0u64);
    // after the stop, the writer's FIN comes within a few ticks
    let mut drain: Option<Instant> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            let since = *drain.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(20) {
                way.error(format!("no end of the stream within 20 s of the stop (after record {seq})"));
                return;
            }
        }
        match s.read(&mut buf[have..]) {
            Ok(0) => {
                if !stop.load(Ordering::Relaxed) {
                    way.error(format!("the stream ended before the stop, after record {seq}"));
                } else if have != 0 {
                    way.error(format!("the stream ended inside record {seq}"));
                }
                return;
            }
            Ok(n) => {
                way.got(n);
                have += n;
                if have == RECORD {
                    record(seq, &mut want);
                    if buf != want {
                        let got = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
                        way.error(format!("record {seq} is wrong (it says {got})"));
                        return;
                    }
                    (have, seq) = (0, seq + 1);
                }
            }
            Err(e) if ticked(&e) => {}
            Err(e) => {
                way.error(format!("read after record {seq}: {e}"));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_differ_by_sequence_number() {
        let (mut a, mut b) = ([0u8; RECORD], [0u8; RECORD]);
        record(7, &mut a);
        record(8, &mut b);
        assert_eq!(u64::from_be_bytes(a[..8].try_into().unwrap()), 7);
        assert_ne!(a[8..], b[8..]);
        let mut again = [0u8; RECORD];
        record(7, &mut again);
        assert_eq!(a, again);
    }
}
