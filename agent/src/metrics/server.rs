//! The HTTP endpoint (`--metrics-addr`). An address the host cannot give
//! yet (not configured yet, or its port held by another process) never
//! stops the dataplane: it is bound again every few seconds, with a warning,
//! until it can be. It is served from a thread of its own with its own
//! runtime: the agent's runtime has one
//! thread, and a slow scrape, or a client that never finishes its request,
//! must not hold up the run loop (nor a stuck loop hang the probes, which
//! must be able to say the loop is stuck).
use std::{
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
use hyper_util::rt::TokioIo;
use tracing::{debug, info, warn};

use super::{exposition, probe, report::LoopReport, snapshot::Snapshot};
use crate::dataplane::bpffs::PinDir;

/// A connection gets this long to send its request and take the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once. Beyond it the endpoint stops accepting, and
/// newcomers wait in the kernel's backlog (then are dropped by it): a flood
/// of idle connections costs the agent at most this many descriptors, never
/// the ones its state files and BPF objects need. A scrape and the probes
/// need one each.
pub const MAX_CONNECTIONS: usize = 64;

/// A bind that failed is tried again this often.
const BIND_RETRY: Duration = Duration::from_secs(2);
/// A bind that keeps failing is logged again this often.
const BIND_WARN_EVERY: Duration = Duration::from_secs(30);

/// Binds `addr` (non-blocking), naming the flag in the error.
fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listener = TcpListener::bind(addr).with_context(|| format!("--metrics-addr {addr}: cannot listen"))?;
    listener.set_nonblocking(true).with_context(|| format!("cannot make the listener on {addr} non-blocking"))?;
    Ok(listener)
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

async fn accept_loop(listener: TcpListener, scrape: Arc<Scrape>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!("cannot serve the metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // e.g. out of file descriptors: wait instead of spinning
                warn!("metrics endpoint cannot accept: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<Incoming>| {
                let response = scrape.answer(req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = http1::Builder::new().keep_alive(false).serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("metrics connection failed: {e}"),
                Err(_) => debug!("metrics connection timed out"),
            }
        });
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

    fn scrape(report: LoopReport) -> Scrape {
        Scrape { report: Arc::new(report), pins: PinDir::new(std::path::Path::new("/nonexistent/edgevx")) }
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
