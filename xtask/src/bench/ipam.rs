//! `cargo xtask bench --ipam`: 1,000 ADD/DEL cycles of `edgevx-ipam` and
//! of Debian's real `host-local` in the same run, each plugin run as a
//! runtime runs it (one process per call), on its own store. Prints the
//! time per cycle and the ratio; asserts nothing.
//!
//! Two workloads, interleaved in blocks of 100 cycles so drift on the
//! machine hits both plugins alike:
//! - **restarts**: one pod whose sandbox is recreated again and again (a
//!   crash loop); edgevx-ipam hands it its address back each time;
//! - **churn**: a new pod name every cycle (a Deployment rolling), so
//!   edgevx-ipam's retained records pile up to 1,000 and every ADD reads them.
use std::time::{Duration, Instant};

use anyhow::Result;
use edgevx_tests::ipam::{Call, DataDir, Plugin, SHARED_VERSION, config};
use serde_json::json;

use crate::{build, deps::packages};

const CYCLES: u32 = 1000;
const BLOCK: u32 = 100;

#[derive(Clone, Copy)]
enum Workload {
    Restarts,
    Churn,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Restarts => "restarts (one pod, a new sandbox each cycle)",
            Workload::Churn => "churn (a new pod name each cycle)",
        }
    }

    fn pod(self, k: u32) -> String {
        match self {
            Workload::Restarts => "web-0".into(),
            Workload::Churn => format!("web-{k}"),
        }
    }
}

/// `cycles` ADD+DEL pairs from cycle `from`; the time they took.
fn cycles(plugin: Plugin, cfg: &serde_json::Value, w: Workload, from: u32, n: u32) -> Result<Duration> {
    let start = Instant::now();
    for k in from..from + n {
        let id = format!("bench{k}");
        Call::new("ADD", &id).pod("default", &w.pod(k)).run(plugin, cfg)?.ips()?;
        let del = Call::new("DEL", &id).run(plugin, cfg)?;
        anyhow::ensure!(del.ok, "{plugin:?} DEL {id}: {} {}", del.stdout, del.stderr);
    }
    Ok(start.elapsed())
}

pub fn run() -> Result<()> {
    packages::ensure()?;
    build::ipam()?;
    let ranges = json!([[{"subnet": "10.244.0.0/16"}]]);
    println!("{} ADD/DEL cycles per plugin and workload, one process per call", CYCLES);
    println!("{:<48} {:>14} {:>14} {:>8}", "workload", "host-local", "edgevx-ipam", "ratio");
    for w in [Workload::Restarts, Workload::Churn] {
        let (hl_dir, evx_dir) = (DataDir::new("benchhl")?, DataDir::new("benchevx")?);
        let hl = config(Plugin::HostLocal, SHARED_VERSION, &hl_dir, ranges.clone(), json!({}));
        let evx = config(Plugin::EdgevxIpam, SHARED_VERSION, &evx_dir, ranges.clone(), json!({}));
        let (mut t_hl, mut t_evx) = (Duration::ZERO, Duration::ZERO);
        for block in (0..CYCLES).step_by(BLOCK as usize) {
            t_hl += cycles(Plugin::HostLocal, &hl, w, block, BLOCK)?;
            t_evx += cycles(Plugin::EdgevxIpam, &evx, w, block, BLOCK)?;
        }
        let per = |t: Duration| t.as_secs_f64() * 1e6 / f64::from(CYCLES);
        println!(
            "{:<48} {:>11.0} us {:>11.0} us {:>7.2}x",
            w.name(),
            per(t_hl),
            per(t_evx),
            t_evx.as_secs_f64() / t_hl.as_secs_f64()
        );
    }
    println!("ratio = edgevx-ipam time / host-local time per cycle (below 1: edgevx-ipam is faster)");
    Ok(())
}
