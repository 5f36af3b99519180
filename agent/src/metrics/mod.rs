//! Probes and metrics (`--metrics-addr`): `/healthz` (the run loop ticks),
//! `/readyz` (subnet.env written, programs attached, first pass done) and
//! `/metrics` (the programs' counters, the loop's passes, the source).
//!
//! - `report`: what the run loop writes (heartbeat, readiness, passes, view);
//! - `probe`: the answers to `/healthz` and `/readyz`;
//! - `families`: which metric family and labels each BPF counter becomes;
//! - `snapshot`: reading the pinned maps at scrape time;
//! - `exposition`: the Prometheus (OpenMetrics) text;
//! - `server`: binding the address (as soon as the host lets it) and serving it off the run loop's thread;
//! - `startup`: the time from process start to each step of the first bring-up.
mod exposition;
mod probe;
mod report;
mod series;
mod server;
mod snapshot;
pub mod startup;

pub use report::{LoopReport, Readiness, Stage, Watching};
pub use server::serve;
