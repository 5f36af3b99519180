//! The watcher against the running kernel, in a namespace of its own.
use std::{
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::ruleset::{POLL, RulesetChanged, spawn};
use crate::testns::TestNs;

/// Waits (bounded) for an event, then for the rest of its burst; the
/// flags of all of them.
fn next_change(rx: &Receiver<RulesetChanged>) -> Result<RulesetChanged> {
    let mut ev = match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(ev) => ev,
        Err(e) => bail!("no event for the change: {e}"),
    };
    // a change seen twice (its events, then the next poll) is merged here
    let settle = Instant::now() + POLL * 2;
    while let Ok(more) = rx.recv_timeout(settle.saturating_duration_since(Instant::now())) {
        ev.nftables |= more.nftables;
        ev.legacy |= more.legacy;
        ev.sysctls |= more.sysctls;
    }
    Ok(ev)
}

fn only(nftables: bool, legacy: bool, sysctls: bool) -> RulesetChanged {
    RulesetChanged { nftables, legacy, sysctls }
}

#[test]
fn each_kind_of_change_is_an_event_and_nothing_else_is() -> Result<()> {
    let ns = TestNs::new("rs")?;
    let (tx, rx) = channel();
    let (started_tx, started_rx) = channel::<()>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = ns.spawn_in(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            let (etx, mut erx) = tokio::sync::mpsc::channel(16);
            let task = spawn(etx)?;
            let _ = started_tx.send(());
            let mut stop = stop_rx;
            loop {
                tokio::select! {
                    Some(ev) = erx.recv() => { let _ = tx.send(ev); }
                    _ = &mut stop => break,
                }
            }
            task.abort();
            Ok(())
        })
    })?;
    if started_rx.recv().is_err() {
        return match watcher.join() {
            Ok(r) => r?.context("the watcher ended before it started"),
            Err(p) => std::panic::resume_unwind(p),
        };
    }

    ns.exec(&["nft", "add", "table", "inet", "t"])?;
    assert_eq!(next_change(&rx)?, only(true, false, false), "nft add table");
    ns.exec(&["iptables-nft", "-A", "FORWARD", "-j", "ACCEPT"])?;
    assert_eq!(next_change(&rx)?, only(true, false, false), "iptables-nft -A");
    ns.exec(&["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_established=4321"])?;
    assert_eq!(next_change(&rx)?, only(false, false, true), "a conntrack timeout");
    if ns.exec(&["iptables-legacy", "-V"]).is_ok() {
        ns.exec(&["iptables-legacy", "-A", "FORWARD", "-s", "10.244.0.0/16", "-j", "ACCEPT"])?;
        assert_eq!(next_change(&rx)?, only(false, true, false), "iptables-legacy -A");
        // the same size, the same number of rules: only the rule's bytes differ
        ns.exec(&["iptables-legacy", "-R", "FORWARD", "1", "-s", "10.244.0.0/16", "-j", "DROP"])?;
        assert_eq!(next_change(&rx)?, only(false, true, false), "iptables-legacy -R");
        ns.exec(&["iptables-legacy", "-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"])?;
        assert_eq!(next_change(&rx)?, only(false, true, false), "iptables-legacy -A OUTPUT");
        // traffic moves the rules' counters, and zeroing them swaps in a
        // table with the same rules: neither is a change
        ns.exec(&["ping", "-c", "8", "-i", "0.2", "-q", "127.0.0.1"])?;
        ns.exec(&["iptables-legacy", "-Z"])?;
    } else {
        eprintln!("no iptables-legacy here: the legacy part is not tested");
    }

    match rx.recv_timeout(Duration::from_secs(2)) {
        Err(RecvTimeoutError::Timeout) => {}
        other => bail!("an event with nothing changed: {other:?}"),
    }
    let _ = stop_tx.send(());
    match watcher.join() {
        Ok(r) => r?,
        Err(p) => std::panic::resume_unwind(p),
    }
}
