//! The HTTP endpoint (`--metrics-addr`). It is bound before the host is
//! changed, so a port in use is a usage error, and it is served from a
//! thread of its own with its own runtime: the agent's runtime has one
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
use crate::{UsageError, dataplane::bpffs::PinDir};

/// A connection gets this long to send its request and take the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once. Beyond it the endpoint stops accepting, and
/// newcomers wait in the kernel's backlog (then are dropped by it): a flood
/// of idle connections costs the agent at most this many descriptors, never
/// the ones its state files and BPF objects need. A scrape and the probes
/// need one each.
pub const MAX_CONNECTIONS: usize = 64;

/// The bound, not yet served, endpoint.
pub struct Endpoint {
    listener: TcpListener,
    pub addr: SocketAddr,
}

/// Binds `addr`; a failure (port in use, an address this host does not
/// have) is a usage error naming the flag.
pub fn bind(addr: SocketAddr) -> Result<Endpoint> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| anyhow::Error::new(UsageError(format!("--metrics-addr {addr}: cannot listen: {e}"))))?;
    listener.set_nonblocking(true).with_context(|| format!("cannot make the listener on {addr} non-blocking"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    Ok(Endpoint { listener, addr })
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
            "/readyz" => verdict(probe::readiness(self.report.readiness())),
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

/// Serves `/healthz`, `/readyz` and `/metrics` on `endpoint` from a thread
/// of its own, for as long as the process lives.
pub fn serve(endpoint: Endpoint, report: Arc<LoopReport>, pins: PinDir) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the metrics endpoint's runtime")?;
    let Endpoint { listener, addr } = endpoint;
    let scrape = Arc::new(Scrape { report, pins });
    std::thread::Builder::new()
        .name("edgevx-metrics".into())
        .spawn(move || runtime.block_on(accept_loop(listener, scrape)))
        .context("cannot start the metrics endpoint's thread")?;
    info!(%addr, "serving /healthz, /readyz and /metrics");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_is_a_usage_error_naming_the_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = bind(addr).err().unwrap();
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
        assert!(e.to_string().contains("--metrics-addr"), "{e:#}");
        // an address this host does not have
        let e = bind("192.0.2.1:9117".parse().unwrap()).err().unwrap();
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
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
