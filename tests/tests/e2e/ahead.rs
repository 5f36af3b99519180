//! Issue 33, finding 6: a program attached ahead of edgevx's decap on the
//! underlay's ingress that ends the chain (a TCX program returning
//! `TC_ACT_OK`, a clsact filter added in front of ours at priority 1, as
//! observability tools are written every day) hands a peer's VXLAN to the
//! kernel's socket unjudged. Each test attaches such a program for real,
//! the minimal `r0 = 0; exit` loaded with bpf(2), while a peer's address
//! sends VXLAN with a forged inner source, and checks:
//! - no forged frame reaches the pod: the kernel decapsulated it (flannel.1
//!   counted it) and the VTEP guard dropped it, decap having never seen it;
//! - `edgevx status` (read from the kernel) names the program ahead;
//! - the agent's next check logs it, reports it on `/readyz` and in the
//!   metrics, puts decap back first, and the peer's traffic recovers;
//! - decap judges again: the same forged frame is refused by it.
//!
//! In both attach modes: TCX from Linux 6.6, the clsact fallback forced with
//! `--tc-attach clsact` (the only mode before 6.6).
//!
//! And finding 7's third: `dataplane_attached` follows the kernel, not the
//! pins: a TCX link detached in the kernel, its pin left, is not attached.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, wait_status},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::wait_reachable,
    unique,
};

use crate::{
    features,
    injection::SEND,
    metrics::{get, until},
};

const M1: &str = "02:11:00:00:00:01";
const M2: &str = "02:22:00:00:00:02";
/// The attacker's address on the underlay; it spoofs node 2's.
const ATTACKER: &str = "198.18.0.66";
const PEER: &str = "198.18.0.2";
/// A client's address, in no peer's pod CIDR: a forged inner source.
const CLIENT: &str = "203.0.113.7";
const FOREIGN_NAME: &str = "observe";

/// bpf(2) from inside a node, with ctypes: `load PIN` loads `r0 = 0; exit`
/// as a sched_cls program named `observe` and pins it; `tcx PIN IFACE`
/// does the same and links it to IFACE's TCX ingress with BPF_F_BEFORE
/// (ahead of every program there), pinning the link; `detach PIN` detaches
/// the link pinned at PIN in the kernel (BPF_LINK_DETACH), leaving the pin.
const BPF: &str = r#"
import ctypes, os, resource, socket, struct, sys
# before 5.11 a program is charged to RLIMIT_MEMLOCK, per user: the agent's
# maps use root's up, and the load fails with EPERM; raised as far as allowed
hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
for limits in ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), (hard, hard)):
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, limits)
        break
    except (ValueError, OSError):
        pass
libc = ctypes.CDLL(None, use_errno=True)
NR = {'x86_64': 321, 'aarch64': 280}[os.uname().machine]
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(NR, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, 'bpf(%d): %s' % (cmd, os.strerror(e)))
    return r
def path(p):
    b = ctypes.create_string_buffer(p.encode())
    return b, ctypes.addressof(b)
def load():
    insns = struct.pack('<BBhi', 0xb7, 0, 0, 0) + struct.pack('<BBhi', 0x95, 0, 0, 0)
    ins = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b'GPL')
    attr = struct.pack('<IIQQIIQII16s', 3, 2, ctypes.addressof(ins), ctypes.addressof(lic), 0, 0, 0, 0, 0, b'observe')
    return bpf(5, attr)
def pin(fd, p):
    b, a = path(p)
    bpf(6, struct.pack('<QII', a, fd, 0))
mode, p = sys.argv[1], sys.argv[2]
if mode == 'load':
    pin(load(), p)
elif mode == 'tcx':
    prog = load()
    link = bpf(28, struct.pack('<IIIIIIQ', prog, socket.if_nametoindex(sys.argv[3]), 46, 1 << 3, 0, 0, 0))
    pin(link, p)
elif mode == 'detach':
    b, a = path(p)
    link = bpf(7, struct.pack('<QII', a, 0, 0))
    bpf(34, struct.pack('<I', link))
"#;

struct Setup {
    c: Cluster,
    a1: Agent,
    _a2: Agent,
    attacker: Netns,
    attach: &'static str,
}

fn setup(attach: &'static str) -> Result<Setup> {
    let mut c = Cluster::new(2)?;
    let nodes = c.dir.join("nodes.yaml");
    write(&nodes, &node_list(vec![flannel_node(1, Some(M1)), flannel_node(2, Some(M2))]))?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    // reverse-path filtering would drop the client source whatever edgevx does
    for key in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"] {
        c.host(1).ns.sysctl(key, "0")?;
    }
    let extra = ["--tc-attach", attach, "--metrics-addr", "127.0.0.1:9117"];
    let a1 = Agent::start(c.host(1), &nodes, &extra)?;
    let a2 = Agent::start(c.host(2), &nodes, &extra[..2])?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    let attacker = Netns::new(&unique("atk"))?;
    c.plug(&attacker, "swatk")?;
    attacker.ip(&["addr", "add", &format!("{ATTACKER}/24"), "dev", "eth0"])?;
    attacker.ip(&["link", "set", "eth0", "up"])?;
    Ok(Setup { c, a1, _a2: a2, attacker, attach })
}

impl Setup {
    fn node1(&self) -> &Netns {
        &self.c.host(1).ns
    }

    fn bpf(&self, args: &[&str]) -> Result<()> {
        let mut cmd = vec!["python3", "-c", BPF];
        cmd.extend_from_slice(args);
        self.node1().run(&cmd).map(|_| ())
    }

    /// Attaches `r0 = 0; exit` ahead of decap on node 1's underlay: a TCX
    /// link with BPF_F_BEFORE, or a clsact filter at decap's priority 1,
    /// added after it (so run before it). Its pin, under the node's bpffs.
    fn attach_foreign(&self) -> Result<String> {
        let pin = self.c.host(1).bpffs_dir().join(unique("foreign"));
        let pin = pin.to_str().context("pin path")?.to_string();
        if self.attach == "tcx" {
            self.bpf(&["tcx", &pin, "eth0"])?;
        } else {
            self.bpf(&["load", &pin])?;
            let tc = ["tc", "filter", "add", "dev", "eth0", "ingress", "protocol", "all", "prio", "1", "handle", "1"];
            let mut cmd = tc.to_vec();
            cmd.extend(["bpf", "da", "pinned", &pin]);
            self.node1().run(&cmd)?;
        }
        Ok(pin)
    }

    fn counter(&self, name: &str) -> Result<u64> {
        Ok(self.a1.status()?["counters"][name].as_u64().unwrap_or(0))
    }

    /// UDP datagrams pod 1's stack saw for a port nobody listens on.
    fn pod_no_ports(&self) -> Result<u64> {
        let snmp = self.c.host(1).pod.run(&["cat", "/proc/net/snmp"])?;
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let (names, values) = (udp.next().context("Udp header")?, udp.next().context("Udp values")?);
        let at = names.split_whitespace().position(|n| n == "NoPorts").context("NoPorts")?;
        Ok(values.split_whitespace().nth(at).context("NoPorts value")?.parse()?)
    }

    /// Frames the kernel's VXLAN receive handed to flannel.1 (counted
    /// before its ingress hook; decap's own deliveries are not counted).
    fn vtep_rx(&self) -> Result<u64> {
        let n = self.node1().run(&["cat", "/sys/class/net/flannel.1/statistics/rx_packets"])?;
        n.trim().parse().with_context(|| format!("rx_packets {n:?}"))
    }

    /// A frame from node 2's address with a client's inner source, to pod 1.
    fn send_forged(&self) -> Result<()> {
        let pod = pod_ip(1).to_string();
        self.attacker.run(&["python3", "-c", SEND, PEER, "198.18.0.1", "raw", CLIENT, &pod, M1, "eth0"]).map(|_| ())
    }
}

/// The whole story in one attach mode.
fn program_ahead_of_decap(attach: &'static str) -> Result<()> {
    let mut s = setup(attach)?;
    // the agent cannot react while the program is put in: the window, held open
    s.a1.pause();
    let pin = s.attach_foreign()?;
    // edgevx status reads the kernel: decap is attached, but not first, and the program is named
    let st = s.a1.status()?;
    assert_eq!(st["dataplane_attached"], true, "{st:#}");
    assert_eq!(st["decap_first"], false, "{st:#}");
    let ahead = st["ahead_of_decap"].to_string();
    match attach {
        "tcx" => ensure!(ahead.contains(FOREIGN_NAME), "the TCX program is not named: {ahead}"),
        _ => ensure!(ahead.contains("pref 1 handle 0x1 bpf"), "the filter is not named: {ahead}"),
    }

    // a forged inner source from a peer's address: the kernel decapsulates
    // it (decap never saw it), and the VTEP guard drops it before the pod
    let (seen, rx, spoofed) = (s.pod_no_ports()?, s.vtep_rx()?, s.counter("drop_spoofed_source")?);
    for _ in 0..5 {
        s.send_forged()?;
    }
    let reached = until("the kernel's VXLAN receive to take the forged frames", Duration::from_secs(10), || {
        Ok((s.vtep_rx()? >= rx + 5).then_some(()))
    });
    reached.context("the frames never reached flannel.1: nothing was bypassed, the test proves nothing")?;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.pod_no_ports()?, seen, "a forged inner source reached the pod past the program ahead of decap");
    assert_eq!(s.counter("drop_spoofed_source")?, spoofed, "decap saw them after all: nothing was ahead of it");

    // the agent's next check: logged, reported, and decap put back first
    s.a1.resume();
    let named = until("/readyz to name the program ahead of decap", Duration::from_secs(30), || {
        let r = get(s.node1(), "/readyz")?;
        Ok((r.status == 503 && r.body.contains("ahead of edgevx's decap")).then_some(r.body))
    })?;
    let metrics = get(s.node1(), "/metrics")?.body;
    // unless the next check came already (10 s later): the counter stays either way
    assert!(metrics.contains("edgevx_decap_displaced_total 1"), "{metrics}");
    s.a1.wait_log("found programs running ahead of edgevx's decap", Duration::from_secs(5))?;
    let log = s.a1.log_text();
    match attach {
        "tcx" => {
            assert!(named.contains(FOREIGN_NAME), "/readyz: {named}");
            assert!(log.contains(&format!("name {FOREIGN_NAME}")), "the log does not name it");
        }
        _ => assert!(named.contains("pref 1 handle 0x1 bpf"), "/readyz: {named}"),
    }
    let st = wait_status(&s.a1, Duration::from_secs(30), "decap first again", |v| v["decap_first"] == true)?;
    assert_eq!(st["ahead_of_decap"].as_array().map(Vec::len), Some(0), "{st:#}");
    // the peer's traffic is judged by decap again, and flows
    wait_reachable(&s.c.host(1).pod, pod_ip(2), 20)?;
    let seen = s.pod_no_ports()?;
    s.send_forged()?;
    until("decap to refuse the forged frame", Duration::from_secs(10), || {
        Ok((s.counter("drop_spoofed_source")? > spoofed).then_some(()))
    })?;
    assert_eq!(s.pod_no_ports()?, seen, "a forged inner source reached the pod");
    // and the next check finds decap first: ready again, the metric says so
    until("/readyz to be 200 again", Duration::from_secs(30), || {
        Ok((get(s.node1(), "/readyz")?.status == 200).then_some(()))
    })?;
    let metrics = get(s.node1(), "/metrics")?.body;
    assert!(metrics.contains("edgevx_decap_first 1"), "{metrics}");
    // the foreign program stays, behind decap: put first again by its owner, the story repeats
    let _ = std::fs::remove_file(pin);
    Ok(())
}

#[test]
fn a_tcx_program_ahead_of_decap_lets_no_forged_inner_source_in_and_is_reported() -> Result<()> {
    if !features::attach_modes().contains(&"tcx") {
        eprintln!("skipped: this kernel has no TCX (Linux 6.6); the clsact test covers it");
        return Ok(());
    }
    program_ahead_of_decap("tcx")
}

#[test]
fn a_clsact_filter_ahead_of_decap_lets_no_forged_inner_source_in_and_is_reported() -> Result<()> {
    program_ahead_of_decap("clsact")
}

/// `dataplane_attached` is the kernel's answer: a TCX link detached in the
/// kernel (its pin left in place, as BPF_LINK_DETACH leaves it) is not
/// attached, and the agent's next check rebuilds it.
#[test]
fn status_says_not_attached_for_a_pinned_link_the_kernel_detached() -> Result<()> {
    if !features::attach_modes().contains(&"tcx") {
        eprintln!("skipped: this kernel has no TCX (Linux 6.6)");
        return Ok(());
    }
    let s = setup("tcx")?;
    assert_eq!(s.a1.status()?["dataplane_attached"], true);
    s.a1.pause();
    let pins = s.c.host(1).bpffs_dir();
    let link = std::fs::read_dir(&pins)?
        .flatten()
        .map(|e| e.path().join("links").join("edgevx_decap"))
        .find(|p| p.exists())
        .context("no pinned decap link")?;
    s.bpf(&["detach", link.to_str().context("pin path")?])?;
    ensure!(link.exists(), "the pin went with the link: the test proves nothing");
    let st = s.a1.status()?;
    s.a1.resume();
    assert_eq!(st["dataplane_attached"], false, "the pin is there, the kernel has no link: {st:#}");
    assert_eq!(st["decap_first"], serde_json::Value::Null, "{st:#}");
    wait_status(&s.a1, Duration::from_secs(30), "the dataplane rebuilt", |v| v["dataplane_attached"] == true)?;
    wait_reachable(&s.c.host(1).pod, pod_ip(2), 20)?;
    Ok(())
}
