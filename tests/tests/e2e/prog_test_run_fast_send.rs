//! The fast path's send side (ebpf/src/fastpath_send.rs) on the pod
//! guard, with BPF_PROG_TEST_RUN in a namespace of its own whose conntrack
//! holds one established entry (made with `conntrack -I`, as the stack
//! would have made it): a local pod's TCP segment of that flow leaves the
//! pod guard for `flannel.<VNI>`'s egress with its TTL one lower and a mark,
//! and the encap there makes of it byte for byte what it makes of the same
//! segment routed through the stack, but only once the encap recorded the
//! flow under the current ruleset; everything else passes untouched, each
//! with its reason counted.
use anyhow::{Context, Result, ensure};
use aya::maps::{Array, HashMap};
use edgevx_common::{
    counters::Counter,
    fastpath::{FP_CONFIG, FP_ON, FP_SEEN, FP_TEST_IGNORE_LIBERAL, FastPathConfig, FlowKey, Seen},
    maps::{self as names, DataplaneConfig, MARK_FAST_SENT},
};
use edgevx_tests::{
    ct_kfuncs,
    netns::{Netns, in_netns},
    unique,
};

use crate::prog_test_run::{
    HOST_MAC, Loaded, NEXT, OUR_MAC, POD_MAC, TC_ACT_REDIRECT, checksum, eth, ipv4, load, run_counted,
};
use crate::prog_test_run_vtep_guard::run_marked;

const POD: [u8; 4] = [10, 244, 1, 2];
const REMOTE_POD: [u8; 4] = [10, 244, 2, 2];
const SPORT: u16 = 40000;
const DPORT: u16 = 5201;
const TCP_ACK: u8 = 0x10;
const TCP_SYN: u8 = 0x02;

/// A TCP segment of the flow from the local pod, `flags` set, 100 bytes of data.
fn segment(dport: u16, flags: u8, ttl: u8) -> Vec<u8> {
    let mut tcp = Vec::new();
    tcp.extend(SPORT.to_be_bytes());
    tcp.extend(dport.to_be_bytes());
    tcp.extend(1000u32.to_be_bytes());
    tcp.extend(2000u32.to_be_bytes());
    tcp.extend([0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    tcp.extend([0x42; 100]);
    let mut ip = ipv4(POD, REMOTE_POD, 6, &tcp, 0);
    ip[8] = ttl;
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c);
    ip
}

/// As the pod sends it: from its MAC to the bridge's, its gateway.
fn from_pod(ip: &[u8]) -> Vec<u8> {
    eth(HOST_MAC, POD_MAC, 0x0800, ip)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn set_config(l: &mut Loaded, flags: u32, epoch: u32, lease_ns: u64) -> Result<()> {
    let mut cfg: Array<_, FastPathConfig> = Array::try_from(l.ebpf.map_mut(FP_CONFIG).context("fp config")?)?;
    let value = FastPathConfig {
        flags,
        epoch,
        tcp_established: 432_000,
        tcp_unacknowledged: 300,
        udp_stream: 120,
        _pad: 0,
        lease_until_ns: monotonic_ns() + lease_ns,
    };
    cfg.set(0, &value, 0)?;
    Ok(())
}

fn seen_epoch(l: &Loaded, key: &FlowKey) -> Result<Option<u32>> {
    let seen: HashMap<_, FlowKey, Seen> = HashMap::try_from(l.ebpf.map(FP_SEEN).context("fp seen")?)?;
    Ok(seen.get(key, 0).ok().map(|s| s.epoch))
}

fn key() -> FlowKey {
    FlowKey {
        saddr: POD,
        daddr: REMOTE_POD,
        sport: SPORT.to_be_bytes(),
        dport: DPORT.to_be_bytes(),
        proto: 6,
        _pad: [0; 3],
    }
}

/// `frame` came out of the pod guard untouched, and `counter` alone moved, by one.
fn passes(l: &Loaded, what: &str, frame: &[u8], counter: Option<Counter>) -> Result<()> {
    let o = run_counted(l, "edgevx_pod_guard", frame)?;
    ensure!(o.verdict == NEXT && o.out == frame, "{what}: the pod guard changed it or acted ({})", o.verdict);
    let want: Vec<(Counter, u64)> = counter.into_iter().map(|c| (c, 1)).collect();
    ensure!(o.moved == want, "{what}: counted {:?}, not {want:?}", o.moved);
    Ok(())
}

/// The routes the stack would take, as a flannel node has them: the peer's
/// subnet via `flannel.1`, forwarding on; and a part of that subnet routed
/// elsewhere (as DirectRouting routes a peer on the underlay's subnet).
fn node_routes(ns: &Netns) -> Result<u32> {
    ns.batch(&[
        "link add flannel.1 type vxlan id 1 local 198.18.0.1 dstport 8472 nolearning".into(),
        "link set flannel.1 up".into(),
        "addr add 10.244.1.0/32 dev flannel.1".into(),
        "route add 10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink".into(),
        "link add evxd0 type veth peer name evxd1".into(),
        "link set evxd0 up".into(),
        "link set evxd1 up".into(),
        "addr add 198.19.0.1/24 dev evxd0".into(),
        "route add 10.244.2.128/25 via 198.19.0.2 dev evxd0".into(),
    ])?;
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    let index = ns.run(&["cat", "/sys/class/net/flannel.1/ifindex"])?;
    index.trim().parse().with_context(|| format!("flannel.1's ifindex: {index:?}"))
}

/// The VTEP in the config is `flannel.1` at `vtep_ifindex`.
fn set_vtep(l: &mut Loaded, vtep_ifindex: u32) -> Result<()> {
    let mut cfg: Array<_, DataplaneConfig> = Array::try_from(l.ebpf.map_mut(names::CONFIG).context("config")?)?;
    let mut value = cfg.get(&0, 0)?;
    value.vtep_ifindex = vtep_ifindex;
    cfg.set(0, &value, 0)?;
    Ok(())
}

#[test]
fn a_pods_established_flow_leaves_the_pod_guard_encapsulated_as_the_stack_would_send_it() -> Result<()> {
    let ns = Netns::new(&unique("fps"))?;
    let vtep = node_routes(&ns)?;
    in_netns(&ns, move || send_side(vtep))
}

fn send_side(vtep: u32) -> Result<()> {
    ct_kfuncs::like_a_node()?;
    let mut l = load(0)?;
    set_vtep(&mut l, vtep)?;
    let offered = ct_kfuncs::offered();
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 7, 60_000_000_000)?;
    let stack_frame = eth(OUR_MAC, OUR_MAC, 0x0800, &segment(DPORT, TCP_ACK, 62));
    let pods_frame = from_pod(&segment(DPORT, TCP_ACK, 63));
    if !offered {
        // no kfuncs (before 6.0): the send side is dead code, whatever the config says
        l.run(l.encap, &stack_frame)?;
        return passes(&l, "without the conntrack kfuncs", &pods_frame, None);
    }
    // the kernel's entry, as the stack makes it for an answered connection
    let port = |p: u16| p.to_string();
    let out = std::process::Command::new("conntrack")
        .args(["-I", "-p", "tcp", "-s", "10.244.1.2", "-d", "10.244.2.2", "--sport", &port(SPORT)])
        .args(["--dport", &port(DPORT), "--state", "ESTABLISHED", "-u", "SEEN_REPLY,ASSURED", "-t", "300"])
        .args(["-r", "10.244.2.2", "-q", "10.244.1.2", "--reply-port-src", &port(DPORT)])
        .args(["--reply-port-dst", &port(SPORT)])
        .output()
        .context("cannot run conntrack")?;
    ensure!(out.status.success(), "conntrack -I: {}", String::from_utf8_lossy(&out.stderr));

    // the stack has not carried the flow under this ruleset yet
    passes(&l, "before the encap recorded the flow", &pods_frame, Some(Counter::FastPathStackNewRuleset))?;
    ensure!(seen_epoch(&l, &key())?.is_none(), "the pod guard recorded the flow itself");
    // the stack's path: routed into flannel.1, encapsulated, recorded
    let (rc, stack_out) = l.run(l.encap, &stack_frame)?;
    ensure!(rc == TC_ACT_REDIRECT, "the encap did not send the routed segment: {rc}");
    ensure!(seen_epoch(&l, &key())? == Some(7), "the encap did not record the flow");

    let sent = l.counter(Counter::FastPathSentPackets)?;
    let (rc, fast_frame, mark) = run_marked(&l, "edgevx_pod_guard", &pods_frame, 0)?;
    ensure!(rc == TC_ACT_REDIRECT, "the established flow was not sent from the pod guard: {rc}");
    ensure!(mark & MARK_FAST_SENT != 0, "the fast-sent frame carries no mark for the encap: {mark:#x}");
    ensure!(l.counter(Counter::FastPathSentPackets)? == sent + 1, "fast_path_sent_packets did not count it");
    ensure!(
        l.counter(Counter::FastPathSentBytes)? >= (pods_frame.len() - 14) as u64,
        "fast_path_sent_bytes did not count it"
    );
    let inner_ip = &fast_frame[14..34];
    ensure!(inner_ip[8] == 62 && checksum(inner_ip) == [0, 0], "the TTL was not lowered with its checksum");
    ensure!(fast_frame[34..] == pods_frame[34..], "the fast path changed more than the TTL");
    // the encap on flannel.1's egress wraps it as it wraps the stack's, clears
    // the mark, and records nothing: only the stack's packets prove a flow (a
    // record here, after the epoch moved, would skip the new ruleset)
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 9, 60_000_000_000)?;
    let tx = l.counter(Counter::TxPackets)?;
    let (rc, fast_out, mark) = run_marked(&l, l.encap, &fast_frame, MARK_FAST_SENT)?;
    ensure!(rc == TC_ACT_REDIRECT && mark == 0, "the encap did not send it clean: rc {rc}, mark {mark:#x}");
    ensure!(seen_epoch(&l, &key())? == Some(7), "the encap recorded a fast-sent packet as the stack's proof");
    ensure!(l.counter(Counter::TxPackets)? == tx + 1, "tx_packets did not count it");
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 7, 60_000_000_000)?;
    // the same bytes as the stack's path from the outer IP header on (the
    // outer Ethernet header is redirect_neigh's to write), but for the
    // outer IP ID, one later, and the header checksum with it
    ensure!(fast_out.len() == stack_out.len(), "{} bytes against the stack's {}", fast_out.len(), stack_out.len());
    let masked = |f: &[u8]| {
        let mut f = f[14..].to_vec();
        f[4..6].copy_from_slice(&[0, 0]);
        f[10..12].copy_from_slice(&[0, 0]);
        f
    };
    ensure!(masked(&fast_out) == masked(&stack_out), "the fast path's frame differs from the stack's");
    ensure!(checksum(&fast_out[14..34]) == [0, 0], "the outer IP header checksum is wrong");

    // what stays with the stack, each counted
    passes(&l, "a SYN", &from_pod(&segment(DPORT, TCP_SYN, 63)), Some(Counter::FastPathStackTcpFlags))?;
    passes(&l, "a TTL about to expire", &from_pod(&segment(DPORT, TCP_ACK, 1)), Some(Counter::FastPathStackOther))?;
    passes(&l, "another pod's MAC", &eth(HOST_MAC, OUR_MAC, 0x0800, &segment(DPORT, TCP_ACK, 63)), None)?;
    passes(&l, "not to the gateway", &eth(POD_MAC, POD_MAC, 0x0800, &segment(DPORT, TCP_ACK, 63)), None)?;
    // a destination the kernel routes elsewhere (not into flannel.1), whatever the peer map says
    let mut elsewhere = segment(DPORT, TCP_ACK, 63);
    elsewhere[16..20].copy_from_slice(&[10, 244, 2, 200]);
    elsewhere[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&elsewhere[..20]);
    elsewhere[10..12].copy_from_slice(&c);
    passes(&l, "routed elsewhere", &from_pod(&elsewhere), Some(Counter::FastPathStackOther))?;
    // a flow the stack carried but conntrack does not know (its entry gone: `conntrack -D`)
    l.run(l.encap, &eth(OUR_MAC, OUR_MAC, 0x0800, &segment(DPORT + 1, TCP_ACK, 62)))?;
    passes(&l, "no entry", &from_pod(&segment(DPORT + 1, TCP_ACK, 63)), Some(Counter::FastPathStackNoEntry))?;
    // a new ruleset (the epoch moved): back to the stack until it carries the flow again
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 8, 60_000_000_000)?;
    passes(&l, "a new ruleset", &pods_frame, Some(Counter::FastPathStackNewRuleset))?;
    // the keeper's lease ran out
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 7, 0)?;
    passes(&l, "no keeper", &pods_frame, Some(Counter::FastPathStackNoKeeper))?;
    // the fast path off
    set_config(&mut l, FP_TEST_IGNORE_LIBERAL, 7, 60_000_000_000)?;
    passes(&l, "the fast path off", &pods_frame, None)?;
    // and on again: the flow goes on as before
    set_config(&mut l, FP_ON | FP_TEST_IGNORE_LIBERAL, 7, 60_000_000_000)?;
    ensure!(l.run("edgevx_pod_guard", &pods_frame)?.0 == TC_ACT_REDIRECT, "the flow did not come back");
    // a route change moves no epoch: the FIB says where the packet goes. A
    // route for the peer's pod on the underlay (as DirectRouting adds one)
    // sends the recorded flow back to the stack at once
    let out = std::process::Command::new("ip")
        .args(["route", "add", "10.244.2.2/32", "via", "198.19.0.2", "dev", "evxd0"])
        .output()
        .context("cannot run ip")?;
    ensure!(out.status.success(), "ip route add: {}", String::from_utf8_lossy(&out.stderr));
    passes(&l, "a recorded flow now routed elsewhere", &pods_frame, Some(Counter::FastPathStackOther))?;
    Ok(())
}
