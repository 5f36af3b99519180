//! The HTTP endpoint (`--metrics-addr`). An address the host cannot give
//! yet (not configured yet, or its port held by another process) never
//! stops the dataplane: it is bound again every few seconds, with a warning,
//! until it can be. It is served from a thread of its own with its own
//! runtime: the agent's runtime has one
//! thread, and a slow scrape, or a client that never finishes its request,
//! must not hold up the run loop (nor a stuck loop hang the probes, which
//! must be able to say the loop is stuck).
//!
//! Whatever other clients do, a probe is answered: connections are
//! accepted as fast as they come, each new one read before the next is
//! accepted (a probe sends its request with its handshake, so it is
//! answered then), and at [`MAX_CONNECTIONS`] the oldest open connection is
//! closed to make room. Idle or slow clients (a request head sent a byte
//! at a time) are also closed after [`HEADER_TIMEOUT`] by themselves. So
//! a flood holds at most [`MAX_CONNECTIONS`] descriptors, and to crowd a
//! probe out it must open that many connections in the moment between the
//! probe's handshake and its request. The kernel's queue of handshakes not
//! yet accepted is [`BACKLOG`] long, so a burst of reconnects does not make
//! it drop a probe's.
use std::{
    collections::VecDeque,
    convert::Infallible,
    net::{SocketAddr, TcpListener},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::{debug, info, warn};

use super::{exposition, probe, report::LoopReport, snapshot::Snapshot};
use crate::dataplane::bpffs::PinDir;

/// A connection gets this long to send its request and take the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// ... and this long to send its request's head: the kubelet and
/// Prometheus send it with the handshake.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections open at once. A newcomer beyond it closes the oldest: a
/// flood of idle connections costs the agent at most this many descriptors
/// (or a quarter of its open-files limit, if lower), never the ones its
/// state files and BPF objects need, and never keeps a probe waiting.
pub const MAX_CONNECTIONS: usize = 256;
/// A full endpoint is logged again this often.
const FULL_WARN_EVERY: Duration = Duration::from_secs(30);

/// A bind that failed is tried again this often.
const BIND_RETRY: Duration = Duration::from_secs(2);
/// A bind that keeps failing is logged again this often.
const BIND_WARN_EVERY: Duration = Duration::from_secs(30);

/// Handshakes the kernel completes before the endpoint accepts them (capped
/// by `net.core.somaxconn`). std's 128 overflows under a burst of
/// reconnects, and the kernel then drops a probe's handshake: its SYN is
/// sent again after a second, longer than the readiness probe's timeout.
const BACKLOG: libc::c_int = 4096;

/// Binds `addr` (non-blocking), naming the flag in the error. `[::]` is
/// every address of both families, IPV6_V6ONLY off whatever
/// `net.ipv6.bindv6only` says: an IPv6-only node's kubelet probes its IPv6
/// address, a dual-stack or IPv4 node's its IPv4 one. On a kernel without
/// IPv6 (`ipv6.disable=1`), `[::]` is `0.0.0.0`, with a warning.
fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let flag = |what: &str| format!("--metrics-addr {addr}: {what}");
    let socket = match listener_socket(addr) {
        Err(e) => match ipv4_instead(addr, &e) {
            Some(v4) => {
                warn!("--metrics-addr {addr}: this kernel has no IPv6 ({e}); serving IPv4 only, on {v4}");
                listener_socket(v4)
            }
            None => Err(e),
        },
        bound => bound,
    }
    .with_context(|| flag("cannot listen"))?;
    socket.listen(BACKLOG).with_context(|| flag("cannot listen"))?;
    socket.set_nonblocking(true).with_context(|| flag("cannot make the listener non-blocking"))?;
    Ok(socket.into())
}

/// A bound socket: SO_REUSEADDR as std's TcpListener sets it (a restarted
/// agent binds while the old connections sit in TIME_WAIT), and dual-stack
/// on the IPv6 wildcard.
fn listener_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// `0.0.0.0:PORT`, where `[::]:PORT` failed because the kernel has no
/// IPv6 at all: socket(2) says EAFNOSUPPORT. (With IPv6 only switched off,
/// `disable_ipv6`, the socket is made and serves IPv4 through mapped
/// addresses.)
fn ipv4_instead(addr: SocketAddr, e: &std::io::Error) -> Option<SocketAddr> {
    let wildcard6 = addr.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);
    (wildcard6 && e.raw_os_error() == Some(libc::EAFNOSUPPORT))
        .then(|| SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port()))
}

/// Binds `addr` as soon as the host lets it: an address not on the host
/// yet, or a port another process holds, is tried again every
/// [`BIND_RETRY`], with a warning at once and every [`BIND_WARN_EVERY`].
async fn bind_when_possible(addr: SocketAddr) -> TcpListener {
    let mut warned: Option<std::time::Instant> = None;
    loop {
        match bind(addr) {
            Ok(l) => {
                if warned.is_some() {
                    info!(%addr, "the metrics address can be bound now");
                }
                return l;
            }
            Err(e) if warned.is_none_or(|at| at.elapsed() >= BIND_WARN_EVERY) => {
                warn!(
                    "{e:#}; the dataplane does not wait for it, and the probes answer once it can be bound (tried \
                     again every {}s)",
                    BIND_RETRY.as_secs()
                );
                warned = Some(std::time::Instant::now());
            }
            Err(_) => {}
        }
        tokio::time::sleep(BIND_RETRY).await;
    }
}

/// What the thread needs to answer a request.
struct Scrape {
    report: Arc<LoopReport>,
    pins: PinDir,
}

const TEXT: &str = "text/plain; charset=utf-8";

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn verdict(v: probe::Verdict) -> Response<Full<Bytes>> {
    let status = if v.ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    reply(status, TEXT, v.text)
}

impl Scrape {
    fn metrics(&self) -> Response<Full<Bytes>> {
        let snapshot = match Snapshot::read(&self.pins, &self.report.peers()) {
            Ok(s) => Some(s),
            Err(e) => {
                // normal before the first bring-up; the loop's metrics still go out
                debug!("scrape without dataplane counters: {e:#}");
                None
            }
        };
        match exposition::render(&self.report, snapshot.as_ref()) {
            Ok(text) => reply(StatusCode::OK, exposition::CONTENT_TYPE, text),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("cannot encode the metrics: {e}\n")),
        }
    }

    fn answer(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        if method != Method::GET && method != Method::HEAD {
            return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
        }
        match path {
            "/healthz" => verdict(probe::liveness(self.report.since_tick())),
            "/readyz" => verdict(probe::readiness(
                self.report.readiness(),
                self.report.waiting().as_deref(),
                &self.report.ahead_of_decap(),
            )),
            "/metrics" => self.metrics(),
            _ => reply(StatusCode::NOT_FOUND, TEXT, "try /healthz, /readyz or /metrics\n".into()),
        }
    }
}

/// [`MAX_CONNECTIONS`], or a quarter of the open-files limit if lower.
fn connection_cap() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return MAX_CONNECTIONS;
    }
    usize::try_from(limit.rlim_cur / 4).unwrap_or(usize::MAX).clamp(8, MAX_CONNECTIONS)
}

/// The connections open, oldest first; closes the oldest when there are
/// `cap` of them.
struct Open {
    cap: usize,
    tasks: VecDeque<tokio::task::AbortHandle>,
    warned: Option<std::time::Instant>,
}

impl Open {
    /// Makes room for one more.
    fn room(&mut self) {
        if self.tasks.len() < self.cap {
            return;
        }
        self.tasks.retain(|t| !t.is_finished());
        let mut closed = 0;
        while self.tasks.len() >= self.cap {
            let Some(oldest) = self.tasks.pop_front() else { break };
            oldest.abort();
            closed += 1;
        }
        if closed > 0 && self.warned.is_none_or(|at| at.elapsed() >= FULL_WARN_EVERY) {
            warn!(
                cap = self.cap,
                "the metrics endpoint has {} connections open: closing the oldest for each new one (idle or slow \
                 clients, or a flood)",
                self.cap
            );
            self.warned = Some(std::time::Instant::now());
        }
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, scrape: Arc<Scrape>) {
    let service = service_fn(move |req: Request<Incoming>| {
        let response = scrape.answer(req.method(), req.uri().path());
        async move { Ok::<_, Infallible>(response) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!("metrics connection failed: {e}"),
        Err(_) => debug!("metrics connection timed out"),
    }
}

async fn accept_loop(listener: TcpListener, scrape: Arc<Scrape>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!("cannot serve the metrics endpoint: {e}");
            return;
        }
    };
    let mut open = Open { cap: connection_cap(), tasks: VecDeque::new(), warned: None };
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // e.g. out of file descriptors: wait instead of spinning
                warn!("metrics endpoint cannot accept: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        open.room();
        let task = tokio::spawn(serve_connection(stream, scrape.clone()));
        open.tasks.push_back(task.abort_handle());
        // the new connection is read (and a probe answered) before the next is accepted
        tokio::task::yield_now().await;
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` from a thread of
/// its own, for as long as the process lives, once the address can be bound.
pub fn serve(addr: SocketAddr, report: Arc<LoopReport>, pins: PinDir) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the metrics endpoint's runtime")?;
    let scrape = Arc::new(Scrape { report, pins });
    std::thread::Builder::new()
        .name("edgevx-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = bind_when_possible(addr).await;
                let bound = listener.local_addr().unwrap_or(addr);
                info!(addr = %bound, "serving /healthz, /readyz and /metrics");
                accept_loop(listener, scrape).await;
            })
        })
        .context("cannot start the metrics endpoint's thread")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_names_the_flag_and_is_bound_once_free() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = bind(addr).err().unwrap();
        assert!(e.to_string().contains("--metrics-addr"), "{e:#}");
        // an address this host does not have
        let e = bind("192.0.2.1:9117".parse().unwrap()).err().unwrap();
        assert!(e.to_string().contains("--metrics-addr 192.0.2.1:9117"), "{e:#}");
        // freed while waited for: bound at the next try
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let bound = rt.block_on(async {
            let waiting = tokio::spawn(bind_when_possible(addr));
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!waiting.is_finished(), "bound while the port was taken");
            drop(taken);
            waiting.await.unwrap()
        });
        assert_eq!(bound.local_addr().unwrap(), addr);
    }

    #[test]
    fn the_ipv6_wildcard_serves_both_families() {
        // port 0: any free one, the same for both families on one socket
        let l = bind("[::]:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        for to in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            std::net::TcpStream::connect(&to).unwrap_or_else(|e| panic!("{to}: {e}"));
        }
        // 0.0.0.0 stays what it says
        let l = bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(std::net::TcpStream::connect(format!("[::1]:{port}")).is_err());
    }

    #[test]
    fn only_a_kernel_without_ipv6_turns_the_ipv6_wildcard_into_ipv4s() {
        let no_af = std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT);
        let in_use = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        assert_eq!(ipv4_instead("[::]:9117".parse().unwrap(), &no_af), Some("0.0.0.0:9117".parse().unwrap()));
        assert_eq!(ipv4_instead("[::]:9117".parse().unwrap(), &in_use), None);
        assert_eq!(ipv4_instead("[fd00::1]:9117".parse().unwrap(), &no_af), None);
        assert_eq!(ipv4_instead("127.0.0.1:9117".parse().unwrap(), &no_af), None);
    }

    fn scrape(report: LoopReport) -> Scrape {
        Scrape { report: Arc::new(report), pins: PinDir::new(std::path::Path::new("/nonexistent/edgevx")) }
    }

    #[test]
    fn a_probe_is_answered_past_a_full_endpoint() {
        use std::io::{Read, Write};
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let s = Arc::new(scrape(LoopReport::new("nodes file")));
        s.report.tick();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        std::thread::spawn(move || rt.block_on(accept_loop(listener, s)));
        // more idle connections than the cap, and one sending its head a byte at a time
        let idle: Vec<_> = (0..connection_cap() + 40).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"G").unwrap();
        // below CONNECTION_TIMEOUT: answered by making room, not by waiting for the idle ones to time out
        let bound = Some(Duration::from_secs(5));
        for _ in 0..3 {
            let mut probe = std::net::TcpStream::connect(addr).unwrap();
            probe.set_read_timeout(bound).unwrap();
            probe.write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n").unwrap();
            let mut text = String::new();
            probe.read_to_string(&mut text).unwrap();
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        }
        // the oldest were closed to make room
        let mut first = &idle[0];
        first.set_read_timeout(bound).unwrap();
        assert_eq!(first.read(&mut [0; 16]).unwrap_or(0), 0, "the oldest idle connection is still open");
    }

    #[test]
    fn routes() {
        let s = scrape(LoopReport::new("nodes file"));
        s.report.tick();
        assert_eq!(s.answer(&Method::GET, "/healthz").status(), StatusCode::OK);
        assert_eq!(s.answer(&Method::GET, "/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        s.report.pass_done(std::time::Instant::now(), true, true);
        assert_eq!(s.answer(&Method::GET, "/readyz").status(), StatusCode::OK);
        let m = s.answer(&Method::GET, "/metrics");
        assert_eq!(m.status(), StatusCode::OK);
        assert_eq!(m.headers()[CONTENT_TYPE], exposition::CONTENT_TYPE);
        assert_eq!(s.answer(&Method::GET, "/").status(), StatusCode::NOT_FOUND);
        assert_eq!(s.answer(&Method::POST, "/metrics").status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}
