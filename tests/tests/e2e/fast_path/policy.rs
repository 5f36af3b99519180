//! Policy on fast-pathed flows: a rule the ruleset gains applies to
//! established flows as it would without edgevx, within a second, and a
//! conntrack flush mid-flow stops nothing. Long-lived flows from node1's
//! pod to node2's stream both ways while the rules change.
//! The nodes run with `--ip-masq` (see [`FAST_IP_MASQ`]).
use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    flows::{Flows, Spec},
    kube_proxy::Mode,
    real_node::RealCluster,
};

use super::{FAST_IP_MASQ as FAST, fast_path_counters, fast_path_on};

/// How soon a new rule must apply to an established flow.
const BOUND: Duration = Duration::from_secs(1);
/// How long a flow is watched for a byte that should not come.
const WATCH: Duration = Duration::from_secs(2);
/// A liveness bound: flows that should move do so well within it.
const MOVES: Duration = Duration::from_secs(30);

/// Two connections between node1's pod and node2's, streaming both ways,
/// on the fast path where it is on (node1's `fast_path_packets` grew).
fn flows_on_the_fast_path(rc: &RealCluster, on: bool) -> Result<Flows> {
    let (a, b) = (rc.pod(1, 0), rc.pod(2, 0));
    let flows =
        Flows::start(&[Spec { client: &a.netns, server: &b.netns, ip: b.ip.into(), port: 7300, connections: 2 }])?;
    flows.wait_all_moved(&vec![0; flows.ways().len()], MOVES)?;
    if on {
        wait_fast_since(rc, 0)?;
    }
    Ok(flows)
}

/// Waits until node1's fast path has carried more than `since` packets.
fn wait_fast_since(rc: &RealCluster, since: u64) -> Result<()> {
    let deadline = Instant::now() + edgevx_tests::patience(MOVES);
    while rc.counter(1, "fast_path_packets")? <= since {
        ensure!(
            Instant::now() < deadline,
            "the fast path took none of the flows\n{}\n{}",
            fast_path_counters(rc, 1),
            rc.report()
        );
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The packets `iptables -L FORWARD` counts for its first rule on `rc`'s node1.
fn first_forward_rule_packets(rc: &RealCluster) -> Result<u64> {
    let out = rc.node(1).ns.run(&["iptables", "-w", "-L", "FORWARD", "1", "-v", "-x", "-n"])?;
    out.split_whitespace().next().and_then(|p| p.parse().ok()).with_context(|| format!("no count in {out:?}"))
}

/// Inserts (`-I`, first in line) or deletes (`-D`) node1's FORWARD rule
/// that drops what node2's pod sends node1's.
fn drop_rule(rc: &RealCluster, op: &str) -> Result<()> {
    let (a, b) = (rc.pod(1, 0).ip.to_string(), rc.pod(2, 0).ip.to_string());
    let first: &[&str] = if op == "-I" { &["1"] } else { &[] };
    rc.node(1)
        .ns
        .run(&[&["iptables", "-w", op, "FORWARD"][..], first, &["-s", &b, "-d", &a, "-j", "DROP"]].concat())?;
    Ok(())
}

/// Inserts the [`drop_rule`] and checks that within
/// [`BOUND`] no byte reaches node1's pod any more (watched for [`WATCH`]),
/// and that the rule itself dropped packets. Returns every way's bytes at
/// the end, and how long after the insertion the last byte arrived.
fn a_drop_rule_stops_the_flows_into_node1(rc: &RealCluster, flows: &Flows) -> Result<(Vec<u64>, Duration)> {
    let (a, b) = (rc.pod(1, 0).ip, rc.pod(2, 0).ip);
    // what node2's pod sends node1's: the ways into node1's pod
    let ways = flows.ways();
    let into_a: Vec<usize> = (0..ways.len()).filter(|&i| ways[i].ends_with("(server to client)")).collect();
    drop_rule(rc, "-I")?;
    let inserted = Instant::now();
    thread::sleep(edgevx_tests::patience(BOUND));
    let at_bound = flows.bytes();
    thread::sleep(WATCH);
    let (later, last) = (flows.bytes(), flows.last_reads());
    let moved: Vec<String> = into_a
        .iter()
        .filter(|&&i| later[i] > at_bound[i])
        .map(|&i| format!("{}: {} bytes", ways[i], later[i] - at_bound[i]))
        .collect();
    ensure!(
        moved.is_empty(),
        "{BOUND:?} after a DROP rule for {b} -> {a} was inserted, data still reached {a}: {moved:?}\n{}",
        fast_path_counters(rc, 1)
    );
    let dropped = first_forward_rule_packets(rc)?;
    ensure!(dropped > 0, "the DROP rule counted no packet: the flows stopped some other way");
    let stopped = into_a.iter().map(|&i| last[i].saturating_duration_since(inserted)).max().unwrap_or_default();
    Ok((later, stopped))
}

#[test]
fn a_drop_rule_stops_a_fast_pathed_flow_within_a_second() -> Result<()> {
    let rc = RealCluster::start(&[FAST, FAST], 1)?;
    rc.kube_proxy(Mode::Iptables, &[])?;
    let on = fast_path_on(&rc, 1)?;
    let flows = flows_on_the_fast_path(&rc, on)?;
    let (later, stopped) = a_drop_rule_stops_the_flows_into_node1(&rc, &flows)?;
    eprintln!("the flows into node1's pod stopped {} ms after the rule was inserted", stopped.as_millis());

    // the rule goes: every way moves again, nothing was reset or lost
    drop_rule(&rc, "-D")?;
    flows.wait_all_moved(&later, MOVES).context("after the DROP rule went")?;
    flows.stop()?;
    Ok(())
}

#[test]
fn a_conntrack_flush_mid_flow_stops_no_fast_pathed_flow() -> Result<()> {
    let rc = RealCluster::start(&[FAST, FAST], 1)?;
    rc.kube_proxy(Mode::Iptables, &[])?;
    let on = fast_path_on(&rc, 1)?;
    let flows = flows_on_the_fast_path(&rc, on)?;
    for i in [1, 2] {
        rc.node(i).ns.run(&["conntrack", "-F"])?;
    }
    let since = flows.bytes();
    flows.wait_all_moved(&since, MOVES).context("after conntrack -F")?;
    if on {
        // the stack tracks the flows again, and the fast path takes them again
        wait_fast_since(&rc, rc.counter(1, "fast_path_packets")?).context("after conntrack -F")?;
    }
    flows.stop()?;
    Ok(())
}

/// Fails closed: with node1's agent killed, its lease runs out within
/// [`edgevx_common::fastpath::LEASE_MS`], and a DROP rule inserted while
/// nobody watches the ruleset still stops the flows.
#[test]
fn a_drop_rule_inserted_while_the_agent_is_down_still_stops_the_flows() -> Result<()> {
    let mut rc = RealCluster::start(&[FAST, FAST], 1)?;
    rc.kube_proxy(Mode::Iptables, &[])?;
    let on = fast_path_on(&rc, 1)?;
    let flows = flows_on_the_fast_path(&rc, on)?;
    rc.agents[0].as_mut().context("node1 is an edgevx node")?.kill9();
    // past the lease: every packet takes the stack (the pinned programs stay)
    thread::sleep(Duration::from_millis(edgevx_common::fastpath::LEASE_MS) + BOUND);
    let since = flows.bytes();
    flows.wait_all_moved(&since, MOVES).context("with node1's agent down")?;
    a_drop_rule_stops_the_flows_into_node1(&rc, &flows).context("with node1's agent down")?;
    Ok(())
}
