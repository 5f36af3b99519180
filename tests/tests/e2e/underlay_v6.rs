//! The IPv6 underlay's protection against real IPv6 VXLAN: a kernel
//! `flannel-v6.1` device made by hand as flannel makes it (`local` our
//! public IPv6, `nolearning`, checksums on), the socket-lookup guard
//! attached to its namespace and decap (with its IPv6 judge) to its
//! underlay, and an attacker sending from a stranger's address, as a peer
//! through a second interface, and as a peer with a forged inner source.
//! The peer's own frame is the control: it does reach the device, passed
//! on unmodified by the judge.
use std::{fs::File, os::fd::AsRawFd};

use anyhow::{Context, Result, anyhow, bail};
use aya::programs::{SchedClassifier, TcAttachType};
use edgevx_tests::{netns::Netns, unique};

use crate::{
    prog_test_run::Loaded,
    prog_test_run_v6::{PEER_IP6, STRANGER_IP6, load6, set_underlay},
};
use edgevx_common::counters::Counter;

const NODE: &str = "fd00:198:18::1";
const NODE_2ND: &str = "fd00:198:19::1";
const ATTACKER_2ND: &str = "fd00:198:19::66";
const DEVICE: &str = "flannel-v6.1";
const DEVICE_MAC: &str = "02:aa:00:00:00:61";

/// In the peer's IPv6 pod subnet (fd00:10:244:2::/64 in `load6`).
const PEER_POD6: &str = "fd00:10:244:2::2";

/// Sends one VXLAN datagram (VNI 1) from `src` to `dst`:8472 through a
/// plain UDP socket, leaving by `link` (`SO_BINDTODEVICE`), holding an
/// inner IPv6/UDP packet from `inner_src` to the device's MAC; with a last
/// argument `dstopts`, behind a destination options header (PadN).
pub const SEND: &str = r#"
import socket, struct, sys
src, dst, mac, link, inner_src = sys.argv[1:6]
ext = sys.argv[6] if len(sys.argv) > 6 else ''
a6 = lambda a: socket.inet_pton(socket.AF_INET6, a)
udp = struct.pack('!HHHH', 40000, 9999, 12, 0) + b'evx!'
inner = struct.pack('!IHBB', 0x60000000, len(udp), 17, 64) + a6(inner_src) + a6('fd00:10:244:1::2') + udp
frame = bytes.fromhex(mac.replace(':', '')) + bytes.fromhex('02bbccddeeff') + b'\x86\xdd' + inner
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, link.encode())
if ext == 'dstopts': s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
s.bind((src, 0))
s.sendto(struct.pack('!II', 0x08000000, 1 << 8) + frame, (dst, 8472))
"#;

/// Polls `done` until it holds (true) or a generous bound passes (false).
fn wait_for(done: impl Fn() -> Result<bool>) -> Result<bool> {
    for _ in 0..250 {
        if done()? {
            return Ok(true);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(false)
}

/// Frames the kernel's vxlan device received (counted by `vxlan_rcv`).
fn device_rx(node: &Netns) -> Result<u64> {
    let v = node.run(&["cat", &format!("/sys/class/net/{DEVICE}/statistics/rx_packets")])?;
    v.trim().parse().with_context(|| format!("rx_packets of {DEVICE}: {v:?}"))
}

#[test]
fn ipv6_vxlan_reaches_a_kernel_flannel_v6_device_only_from_a_peer_on_the_underlay() -> Result<()> {
    let (node, attacker) = node_and_attacker()?;
    let send_ext = |src: &str, dst: &str, link: &str, inner_src: &str, ext: &str| {
        attacker.run(&["python3", "-c", SEND, src, dst, DEVICE_MAC, link, inner_src, ext]).map(|_| ())
    };
    let send_from = |src: &str, dst: &str, link: &str, inner_src: &str| send_ext(src, dst, link, inner_src, "");
    let send = |src: &str, dst: &str, link: &str| send_from(src, dst, link, PEER_POD6);

    // without the guard the kernel device takes a stranger's VXLAN
    let rx = device_rx(&node)?;
    send(STRANGER_IP6, NODE, "eth0")?;
    assert!(wait_for(|| Ok(device_rx(&node)? > rx))?, "the device never received the unguarded frame");
    let rx = device_rx(&node)?;

    let mut l = guarded(&node)?;

    let cases = [
        ("a stranger on the underlay", STRANGER_IP6, NODE, "eth0", Counter::DropUnknownPeerSocket),
        ("the peer through the second link", PEER_IP6, NODE_2ND, "eth1", Counter::DropVxlanOffUnderlay),
    ];
    for (what, src, dst, link, counter) in cases {
        let before = l.counter(counter)?;
        send(src, dst, link)?;
        // once the refusal is counted the datagram is gone: it cannot reach the device later
        assert!(wait_for(|| Ok(l.counter(counter)? > before))?, "{what}: {counter:?} did not move");
        assert_eq!(l.counter(counter)?, before + 1, "{what}");
        assert_eq!(device_rx(&node)?, rx, "{what}: the device received it");
    }
    // multicast is delivered without a socket lookup: the guard never sees
    // it, so decap's judge on the underlay must (and a firewall rule off it)
    let decap: &mut SchedClassifier = l.ebpf.program_mut("edgevx_decap").context("decap")?.try_into()?;
    // (loaded with the other classifiers by `load6`)
    attach_in(&node, decap, "eth0")?;
    let judged = [
        ("a stranger to all nodes", STRANGER_IP6, "ff02::1%eth0", PEER_POD6, Counter::DropUnknownPeer),
        ("a stranger to our public IPv6", STRANGER_IP6, NODE, PEER_POD6, Counter::DropUnknownPeer),
        ("the peer with a client's inner source", PEER_IP6, NODE, "2001:db8::7", Counter::DropSpoofedSource),
        (
            "the peer with a client's inner source, to all nodes",
            PEER_IP6,
            "ff02::1%eth0",
            "2001:db8::7",
            Counter::DropSpoofedSource,
        ),
    ];
    for (what, src, dst, inner_src, counter) in judged {
        let before = l.counter(counter)?;
        send_from(src, dst, "eth0", inner_src)?;
        assert!(wait_for(|| Ok(l.counter(counter)? > before))?, "{what}: {counter:?} did not move");
        assert_eq!(l.counter(counter)?, before + 1, "{what}");
        assert_eq!(device_rx(&node)?, rx, "{what}: the device received it");
    }
    // behind a destination options header the kernel still hands it to the
    // socket, and the guard passes a peer: the judge walks the header
    let (what, counter) = ("the peer with a client's inner source behind options", Counter::DropSpoofedSource);
    {
        let before = l.counter(counter)?;
        send_ext(PEER_IP6, NODE, "eth0", "2001:db8::7", "dstopts")?;
        assert!(wait_for(|| Ok(l.counter(counter)? > before))?, "{what}: {counter:?} did not move");
        assert_eq!(l.counter(counter)?, before + 1, "{what}");
        assert_eq!(device_rx(&node)?, rx, "{what}: the device received it");
    }

    // the peer on the underlay gets through both, unmodified (behind options
    // too), and is refused nowhere
    let refusals = [Counter::DropUnknownPeerSocket, Counter::DropVxlanOffUnderlay, Counter::DropUnknownPeer];
    let counts = |l: &crate::prog_test_run::Loaded| refusals.iter().map(|c| l.counter(*c)).collect::<Result<Vec<_>>>();
    let (refused, passed) = (counts(&l)?, l.counter(Counter::RxHostPackets)?);
    send(PEER_IP6, NODE, "eth0")?;
    send_ext(PEER_IP6, NODE, "eth0", PEER_POD6, "dstopts")?;
    assert!(wait_for(|| Ok(device_rx(&node)? >= rx + 2))?, "the peer's frames did not reach the device");
    assert_eq!(device_rx(&node)?, rx + 2, "only the peer's frames arrived");
    assert_eq!(l.counter(Counter::RxHostPackets)?, passed + 2, "the judge passed them");
    assert_eq!(counts(&l)?, refused);
    Ok(())
}

/// A node with a kernel `flannel-v6.1` and an attacker, joined by two
/// links: `eth0` the underlay, `eth1` a second link between the same two
/// hosts. The attacker holds the peer's address too, to send as it.
fn node_and_attacker() -> Result<(Netns, Netns)> {
    let node = Netns::new(&unique("g6n"))?;
    let attacker = Netns::new(&unique("g6a"))?;
    // no duplicate address detection on the links made below: a tentative
    // link-local address would leave neighbour discovery on eth1 (whose
    // sender holds no global address there) to a race with the test
    for ns in [&node, &attacker] {
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
    }
    for link in ["eth0", "eth1"] {
        node.ip(&["link", "add", link, "type", "veth", "peer", "name", link, "netns", &attacker.name])?;
    }
    for (ns, addrs) in
        [(&node, [(NODE, "eth0"), (NODE_2ND, "eth1")]), (&attacker, [(STRANGER_IP6, "eth0"), (ATTACKER_2ND, "eth1")])]
    {
        for (addr, link) in addrs {
            ns.ip(&["-6", "addr", "add", &format!("{addr}/64"), "dev", link, "nodad"])?;
            ns.ip(&["link", "set", link, "up"])?;
        }
    }
    attacker.ip(&["-6", "addr", "add", &format!("{PEER_IP6}/64"), "dev", "eth0", "nodad"])?;
    #[rustfmt::skip]
    node.ip(&[
        "link", "add", DEVICE, "address", DEVICE_MAC, "type", "vxlan", "id", "1", "local", NODE, "dev", "eth0",
        "dstport", "8472", "nolearning",
    ])?;
    node.ip(&["link", "set", DEVICE, "up"])?;
    Ok((node, attacker))
}

/// Sends one raw Ethernet frame out of `link`: what [`SEND`] sends from
/// `src` to `dst` (its UDP checksum filled in, as flannel-v6's socket
/// wants it), behind a VLAN tag (VID 0, priority 5) of each TPID in
/// `tpids` (hex, comma-separated, outermost first), to `dst_mac`.
pub const SEND_TAGGED: &str = r#"
import socket, struct, sys
src, dst, mac, link, inner_src, tpids, dst_mac = sys.argv[1:8]
a6 = lambda a: socket.inet_pton(socket.AF_INET6, a)
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
udp = struct.pack('!HHHH', 40000, 9999, 12, 0) + b'evx!'
inner = struct.pack('!IHBB', 0x60000000, len(udp), 17, 64) + a6(inner_src) + a6('fd00:10:244:1::2') + udp
frame = bytes.fromhex(mac.replace(':', '')) + bytes.fromhex('02bbccddeeff') + b'\x86\xdd' + inner
vxlan = struct.pack('!II', 0x08000000, 1 << 8) + frame
n = 8 + len(vxlan)
c = csum(a6(src) + a6(dst) + struct.pack('!IxxxB', n, 17) + struct.pack('!HHHH', 40000, 8472, n, 0) + vxlan) or 0xffff
outer = struct.pack('!IHBB', 0x60000000, n, 17, 64) + a6(src) + a6(dst) + struct.pack('!HHHH', 40000, 8472, n, c) + vxlan
smac = open('/sys/class/net/%s/address' % link).read().strip()
tags = b''.join(struct.pack('!HH', int(t, 16), 5 << 13) for t in tpids.split(','))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((link, 0))
s.send(bytes.fromhex(dst_mac.replace(':', '') + smac.replace(':', '')) + tags + b'\x86\xdd' + outer)
"#;

/// IPv6 VXLAN behind VLAN tags, spoofed as the peer with a client's inner
/// source: the kernel moves the first tag into skb metadata before TC and
/// strips the rest after it, then hands the datagram to flannel-v6's
/// socket, whose guard sees only the (spoofed) peer's address. Two tags or
/// more are refused as tagged VXLAN; behind a single tag decap judges the
/// frame as usual, and the peer's own frame arrives.
#[test]
fn ipv6_vxlan_behind_vlan_tags_never_reaches_a_kernel_flannel_v6_device() -> Result<()> {
    let (node, attacker) = node_and_attacker()?;
    let mut l = guarded(&node)?;
    let decap: &mut SchedClassifier = l.ebpf.program_mut("edgevx_decap").context("decap")?.try_into()?;
    attach_in(&node, decap, "eth0")?;
    let node_mac = node.run(&["cat", "/sys/class/net/eth0/address"])?;
    let send = |tpids: &str, inner_src: &str| {
        let args = [PEER_IP6, NODE, DEVICE_MAC, "eth0", inner_src, tpids, node_mac.trim()];
        attacker.run(&[&["python3", "-c", SEND_TAGGED][..], &args].concat()).map(|_| ())
    };

    let rx = device_rx(&node)?;
    let cases = [
        ("8100,8100", "2001:db8::7", Counter::DropVxlanTagged),
        ("88a8,8100", "2001:db8::7", Counter::DropVxlanTagged),
        ("88a8,8100", PEER_POD6, Counter::DropVxlanTagged),
        ("8100", "2001:db8::7", Counter::DropSpoofedSource),
        ("88a8", "2001:db8::7", Counter::DropSpoofedSource),
    ];
    for (tpids, inner_src, counter) in cases {
        let what = format!("an inner source {inner_src} behind {tpids}");
        let before = l.counter(counter)?;
        send(tpids, inner_src)?;
        // once the refusal is counted the datagram is gone: it cannot reach the device later
        let settled = wait_for(|| Ok(l.counter(counter)? > before || device_rx(&node)? > rx))?;
        assert_eq!(device_rx(&node)?, rx, "{what}: the device received it");
        assert!(settled, "{what}: {counter:?} did not move");
        assert_eq!(l.counter(counter)?, before + 1, "{what}");
    }
    // the peer's own frame behind one tag: judged, passed, received
    let passed = l.counter(Counter::RxHostPackets)?;
    send("8100", PEER_POD6)?;
    assert!(wait_for(|| Ok(device_rx(&node)? > rx))?, "the peer's frame behind one tag did not reach the device");
    assert_eq!(l.counter(Counter::RxHostPackets)?, passed + 1, "the judge passed it");
    Ok(())
}

/// Attaches `prog` to `link`'s ingress inside `ns`: from a thread that
/// entered it (setns(2) moves only the calling thread; the link stays).
fn attach_in(ns: &Netns, prog: &mut SchedClassifier, link: &str) -> Result<()> {
    let path = format!("/run/netns/{}", ns.name);
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(&path).with_context(|| format!("cannot open {path}"))?;
            // SAFETY: plain setns(2) on a namespace fd that stays open for the call.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns into {path}: {}", std::io::Error::last_os_error());
            }
            let c_link = std::ffi::CString::new(link).context("link name")?;
            prog.attach(&c_link, TcAttachType::Ingress)
                .with_context(|| format!("cannot attach to {link} in {path}"))?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow!("the attaching thread panicked"))?
    })
}

/// The IPv6 fixture's programs, the socket-lookup guard attached to `node`'s
/// namespace with `node`'s eth0 as the underlay.
fn guarded(node: &Netns) -> Result<Loaded> {
    let mut l = load6(0)?;
    let underlay = node.run(&["cat", "/sys/class/net/eth0/ifindex"])?;
    set_underlay(&mut l, underlay.trim().parse().with_context(|| format!("ifindex {underlay:?}"))?)?;
    let guard: &mut aya::programs::SkLookup = l.ebpf.program_mut("edgevx_guard").context("guard")?.try_into()?;
    guard.load()?;
    let netns = File::open(format!("/run/netns/{}", node.name)).context("the node's namespace")?;
    guard.attach(&netns).context("cannot attach the guard to the node's namespace")?;
    Ok(l)
}
