//! Window tracking under loss, with the flow pushed off the fast path and
//! back again and again: strict tracking (`be_liberal=0`) and kube-proxy's
//! INVALID drop on both nodes, 1% of the VXLAN datagrams between the nodes
//! dropped by the switch, and node1's ruleset changed every two seconds
//! while a large transfer runs from node2's pod to node1's. Nothing may
//! turn INVALID, and the transfer must finish byte for byte.
//!
//! netem is not in this machine's kernel (no modules), so the loss is an
//! nftables rule on the switch's bridge (`numgen random`); reordering is
//! not emulated here.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{kube_proxy::Mode, real_node::RealCluster};

use super::{FAST_IP_MASQ, ct_invalid, fast_path_counters, fast_path_on, invalid_drops};
use crate::{MIB, testpeer};

const BYTES: u64 = 2048 * MIB;
const LOSS_PERCENT: u32 = 1;
const BUMP_EVERY: Duration = Duration::from_secs(2);

#[test]
fn window_tracking_holds_under_loss_and_repeated_ruleset_changes() -> Result<()> {
    let rc = RealCluster::start(&[FAST_IP_MASQ, FAST_IP_MASQ], 1)?;
    rc.kube_proxy(Mode::Iptables, &[])?;
    let on = fast_path_on(&rc, 1)?;
    let loss = format!(
        "table bridge edgevx_test_loss {{\n\tchain forward {{\n\t\ttype filter hook forward priority 0; policy accept;\n\t\tudp dport 8472 numgen random mod 100 < {LOSS_PERCENT} counter drop\n\t}}\n}}\n"
    );
    edgevx_tests::kube_proxy::feed(&rc.cluster.switch, &["nft", "-f", "-"], &loss)?;
    let before: Vec<(u64, u64)> = [1, 2]
        .iter()
        .map(|&i| Ok((invalid_drops(&rc.node(i).ns)?, ct_invalid(&rc.node(i).ns)?)))
        .collect::<Result<_>>()?;
    let new_ruleset = rc.counter(1, "fast_path_stack_new_ruleset")?;

    // node1's ruleset changes every two seconds during the transfer
    let stop = Arc::new(AtomicBool::new(false));
    let bumper = {
        let (stop, node) = (stop.clone(), rc.node(1).ns.name.clone());
        thread::spawn(move || -> Result<u32> {
            let mut bumps = 0;
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(BUMP_EVERY);
                edgevx_tests::sh(&["ip", "netns", "exec", &node, "nft", "add", "table", "ip", "edgevx_test_bump"])?;
                edgevx_tests::sh(&["ip", "netns", "exec", &node, "nft", "delete", "table", "ip", "edgevx_test_bump"])?;
                bumps += 1;
            }
            Ok(bumps)
        })
    };
    let (a, b) = (rc.pod(1, 0), rc.pod(2, 0));
    let transfer = testpeer().tcp_transfer_within(&b.netns, &a.netns, a.ip, BYTES, 600);
    stop.store(true, Ordering::Relaxed);
    let bumps = bumper.join().map_err(|_| anyhow::anyhow!("the bumper panicked"))??;
    transfer.with_context(|| format!("{} MiB under {LOSS_PERCENT}% loss", BYTES / MIB))?;

    let dropped = rc.cluster.switch.run(&["nft", "list", "table", "bridge", "edgevx_test_loss"])?;
    ensure!(!dropped.contains("packets 0 "), "the switch dropped nothing: {dropped}");
    for i in [1u8, 2] {
        let (drops, invalid) = (invalid_drops(&rc.node(i).ns)?, ct_invalid(&rc.node(i).ns)?);
        let (d0, i0) = before[usize::from(i) - 1];
        ensure!(
            drops == d0,
            "node{i}: kube-proxy's INVALID drop rose from {d0} to {drops}\n{}",
            fast_path_counters(&rc, i)
        );
        ensure!(
            invalid == i0,
            "node{i}: conntrack's invalid count rose from {i0} to {invalid}\n{}",
            fast_path_counters(&rc, i)
        );
    }
    if on {
        let pushed = rc.counter(1, "fast_path_stack_new_ruleset")? - new_ruleset;
        ensure!(bumps >= 2 && pushed > 0, "{bumps} ruleset changes pushed {pushed} packets back to the stack");
        let fast = rc.counter(1, "fast_path_bytes")?;
        ensure!(fast >= BYTES / 2, "the fast path carried {fast} bytes of {BYTES}\n{}", fast_path_counters(&rc, 1));
    }
    eprintln!("{bumps} ruleset changes; {}", fast_path_counters(&rc, 1));
    Ok(())
}
