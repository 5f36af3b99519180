//! The conntrack-verified fast path (issue 32) against kube-proxy's rules:
//! it must carry established pod-to-pod TCP without ever making conntrack
//! call a packet INVALID (kube-proxy drops those), and a fast path that
//! skips the liberal step must be caught by the same test.
//!
//! The fast path must be on wherever the kernel offers the conntrack
//! kfuncs (6.0+ with BTF, conntrack built in or its module loaded: see
//! [`edgevx_tests::ct_kfuncs`]); elsewhere the agent says it is
//! unavailable and the test checks that it carried nothing.
//!
//! NAT flows ([`nat`]), policy changes on established flows ([`policy`]),
//! entries' lifetimes ([`lifetime`]) and window tracking under loss
//! ([`window`]) have their own files.
mod lifetime;
mod nat;
mod policy;
mod window;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    ct_kfuncs,
    kube_proxy::Mode,
    netns::Netns,
    real_node::{NodeKind, RealCluster},
};

use crate::{MIB, testpeer};

pub(crate) const FAST: NodeKind = NodeKind::Edgevx(&["--fast-path=auto"]);
/// With `--ip-masq`, as kube-flannel.yml runs flanneld: without it
/// (FLANNEL_IPMASQ=false) the CNI bridge plugin masquerades pod-to-pod
/// traffic on the client's node, and that node's half of every flow it
/// starts is NAT, which the fast path never takes.
pub(crate) const FAST_IP_MASQ: NodeKind = NodeKind::Edgevx(&["--fast-path=auto", "--ip-masq"]);
const FAST_WITHOUT_LIBERAL: NodeKind = NodeKind::Edgevx(&["--fast-path=auto", "--fast-path-test-ignore-liberal"]);

/// Packets KUBE-FORWARD's `--ctstate INVALID -j DROP` dropped on `node`.
pub(crate) fn invalid_drops(node: &Netns) -> Result<u64> {
    let out = node.run(&["iptables", "-w", "-t", "filter", "-L", "KUBE-FORWARD", "-v", "-x", "-n"])?;
    let line = out
        .lines()
        .find(|l| l.contains("INVALID") && l.contains("DROP"))
        .with_context(|| format!("no INVALID drop in KUBE-FORWARD:\n{out}"))?;
    line.split_whitespace().next().and_then(|p| p.parse().ok()).with_context(|| format!("no packet count in {line:?}"))
}

/// Conntrack's own `invalid` count on `node`, summed over CPUs
/// (/proc/net/stat/nf_conntrack, hex columns).
pub(crate) fn ct_invalid(node: &Netns) -> Result<u64> {
    let out = node.run(&["cat", "/proc/net/stat/nf_conntrack"])?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().context("empty nf_conntrack stats")?.split_whitespace().collect();
    let col = header.iter().position(|h| *h == "invalid").context("no invalid column")?;
    let mut sum = 0;
    for l in lines {
        let v = l.split_whitespace().nth(col).context("short stats line")?;
        sum += u64::from_str_radix(v, 16).with_context(|| format!("bad stats value {v}"))?;
    }
    Ok(sum)
}

/// Node `i`'s fast-path counters, for a failure's message.
pub(crate) fn fast_path_counters(rc: &RealCluster, i: u8) -> String {
    let Some(Ok(status)) = rc.agents[usize::from(i) - 1].as_ref().map(|a| a.status()) else {
        return String::from("(no status)");
    };
    let counters = status["counters"].as_object().cloned().unwrap_or_default();
    counters.iter().filter(|(k, _)| k.starts_with("fast_path")).map(|(k, v)| format!("{k}={v} ")).collect()
}

/// Whether node `i`'s fast path is on; an error where the kernel offers the
/// conntrack kfuncs (built in, or its module loaded) and the agent still
/// says it is off: then the probe or the load is wrong, not the kernel.
pub(crate) fn fast_path_on(rc: &RealCluster, i: u8) -> Result<bool> {
    let status = rc.agents[usize::from(i) - 1].as_ref().context("an edgevx node")?.status()?;
    let on = status["fast_path"].as_str() == Some("on");
    ensure!(
        on || !ct_kfuncs::offered(),
        "node{i}: the kernel offers the conntrack kfuncs, yet the fast path is {}",
        status["fast_path"]
    );
    Ok(on)
}

/// A 64 MiB TCP transfer each way between the nodes' pods, with
/// `nf_conntrack_tcp_be_liberal=0` (the default) and kube-proxy's INVALID
/// drop on both nodes; a transfer not done within a minute failed (a
/// healthy one takes seconds, even under TCG).
fn transfer_both_ways(rc: &RealCluster) -> Result<()> {
    let peer = testpeer();
    for n in [1u8, 2] {
        let (a, b) = (rc.pod(n, 0), rc.pod(3 - n, 0));
        peer.tcp_transfer_within(&a.netns, &b.netns, b.ip, 64 * MIB, 60)?;
    }
    Ok(())
}

#[test]
fn tcp_under_kube_proxys_invalid_drop_takes_the_fast_path_and_nothing_turns_invalid() -> Result<()> {
    invalid_drop_case(Mode::Iptables)
}

/// kube-proxy's nftables mode drops `ct state invalid` in its own table
/// (no counter there: conntrack's own `invalid` count says it).
#[test]
fn tcp_under_kube_proxys_nftables_invalid_drop_takes_the_fast_path_and_nothing_turns_invalid() -> Result<()> {
    invalid_drop_case(Mode::Nftables)
}

fn invalid_drop_case(mode: Mode) -> Result<()> {
    // with --ip-masq no pod-to-pod flow is NAT, so both sides of each
    // node's fast path carry its flows (the client's data and the server's
    // ACKs); without it the client's node masquerades (nat.rs)
    let rc = RealCluster::start(&[FAST_IP_MASQ, FAST_IP_MASQ], 1)?;
    rc.kube_proxy(mode, &[])?;
    for i in [1, 2] {
        let liberal = rc.node(i).ns.run(&["cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"])?;
        ensure!(liberal.trim() == "0", "node{i}: the test needs strict tracking, found be_liberal={liberal}");
    }
    let on = fast_path_on(&rc, 1)? && fast_path_on(&rc, 2)?;
    let drops = |i: u8| match mode {
        Mode::Iptables => invalid_drops(&rc.node(i).ns),
        Mode::Nftables => Ok(0),
    };
    let before: Vec<(u64, u64)> =
        [1, 2].iter().map(|&i| Ok((drops(i)?, ct_invalid(&rc.node(i).ns)?))).collect::<Result<_>>()?;
    transfer_both_ways(&rc)?;
    for i in [1u8, 2] {
        let (drops, invalid) = (drops(i)?, ct_invalid(&rc.node(i).ns)?);
        ensure!(drops == before[usize::from(i) - 1].0, "node{i}: kube-proxy's INVALID drop rose to {drops}");
        ensure!(invalid == before[usize::from(i) - 1].1, "node{i}: conntrack's invalid count rose to {invalid}");
    }
    for i in [1u8, 2] {
        let share = Share::read(&rc, i)?;
        let counters = || format!("\nnode1: {}\nnode2: {}", fast_path_counters(&rc, 1), fast_path_counters(&rc, 2));
        if !on {
            ensure!(
                share.carried_nothing(),
                "node{i}: the fast path is not on here but carried {share:?}{}",
                counters()
            );
            continue;
        }
        // each node received a 64 MiB transfer and sent one; both sides
        // must have carried some of it
        ensure!(
            share.received_bytes > 0 && share.sent_bytes > 0,
            "node{i}: one side of the fast path carried nothing: {share:?}{}",
            counters()
        );
        share.check(i).with_context(counters)?;
    }
    Ok(())
}

/// What node `i`'s fast path carried and what it left to the stack, in
/// packets (GRO super-packets on the receive side, GSO ones on the send
/// side), both sides together: the reasons are counted once per judged
/// packet whichever side judged it.
#[derive(Debug)]
struct Share {
    received_bytes: u64,
    sent_bytes: u64,
    fast_packets: u64,
    /// Packets of established flows that waited for the agent to make
    /// their flow liberal.
    waiting: u64,
    /// Packets the stack took for any other reason (the handshake, SYN,
    /// FIN and RST, a new ruleset, no entry, no keeper, NAT ...).
    stack_otherwise: u64,
}

impl Share {
    /// From one status read; every `fast_path_stack_*` reason but the
    /// promotion's counts as "otherwise", a reason added later included.
    fn read(rc: &RealCluster, i: u8) -> Result<Share> {
        let status = rc.agents[usize::from(i) - 1].as_ref().context("an edgevx node")?.status()?;
        let counters = status["counters"].as_object().context("no counters in the status")?;
        let c = |name: &str| counters.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
        let stack_otherwise = counters
            .iter()
            .filter(|(k, _)| k.starts_with("fast_path_stack_") && *k != "fast_path_stack_not_liberal")
            .filter_map(|(_, v)| v.as_u64())
            .sum();
        Ok(Share {
            received_bytes: c("fast_path_bytes"),
            sent_bytes: c("fast_path_sent_bytes"),
            fast_packets: c("fast_path_packets") + c("fast_path_sent_packets"),
            waiting: c("fast_path_stack_not_liberal"),
            stack_otherwise,
        })
    }

    fn carried_nothing(&self) -> bool {
        self.received_bytes == 0 && self.sent_bytes == 0 && self.fast_packets == 0
    }

    /// Most packets took the fast path, and, once a flow was liberal, all
    /// but a tenth did. How many packets waited for the promotion is not a
    /// share: it is how long the agent took beside the flow, counted in
    /// the flow's packets (a TCG guest with both its CPUs busy moving the
    /// transfer ran the agent late enough for 19% of one side's bytes to
    /// pass the stack meanwhile, where a native run leaves a handful).
    fn check(&self, i: u8) -> Result<()> {
        ensure!(
            self.fast_packets > self.waiting + self.stack_otherwise,
            "node{i}: fewer than half of the packets took the fast path: {self:?}"
        );
        ensure!(
            self.stack_otherwise * 10 <= self.fast_packets + self.stack_otherwise,
            "node{i}: more than a tenth of the packets not waiting for the promotion took the stack: {self:?}"
        );
        Ok(())
    }
}

/// The negative control: the same test with the liberal step skipped must
/// see conntrack call fast-pathed flows' stack-side packets INVALID (and
/// kube-proxy drop them), or the test above proves nothing.
#[test]
fn a_fast_path_without_the_liberal_step_is_caught_by_kube_proxys_invalid_drop() -> Result<()> {
    let rc = RealCluster::start(&[FAST_WITHOUT_LIBERAL, FAST_WITHOUT_LIBERAL], 1)?;
    if !(fast_path_on(&rc, 1)? && fast_path_on(&rc, 2)?) {
        eprintln!("the fast path is unavailable on this kernel: nothing to control");
        return Ok(());
    }
    rc.kube_proxy(Mode::Iptables, &[])?;
    let before = invalid_drops(&rc.node(1).ns)? + invalid_drops(&rc.node(2).ns)?;
    // the transfer may stall: a failure is as good a sign as the drops
    let transfer = transfer_both_ways(&rc);
    let after = invalid_drops(&rc.node(1).ns)? + invalid_drops(&rc.node(2).ns)?;
    ensure!(
        after > before || transfer.is_err(),
        "skipping the liberal step went unnoticed: no INVALID drop ({before} -> {after}) and the transfers finished"
    );
    Ok(())
}
