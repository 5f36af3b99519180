//! Against the running kernel, in namespaces of their own (the unit tests
//! run as root): real TCP connections, real conntrack entries.
use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use edgevx_common::fastpath::{
    FlowKey, IP_CT_TCP_FLAG_BE_LIBERAL, IPPROTO_TCP, IPS_MUST, TCP_CONNTRACK_ESTABLISHED, Verdict, judge,
};

use super::{
    CtNetlink, Outcome, fields,
    liberal::IP_CT_TCP_FLAG_MAXACK_SET,
    make_liberal,
    promote::{FlowEvents, PromoteCounters, Promoter, run},
    tcp_flags,
};
use crate::testns::{TestNs, link};

fn key(from: SocketAddrV4, to: SocketAddrV4) -> FlowKey {
    FlowKey {
        saddr: from.ip().octets(),
        daddr: to.ip().octets(),
        sport: from.port().to_be_bytes(),
        dport: to.port().to_be_bytes(),
        proto: IPPROTO_TCP,
        _pad: [0; 3],
    }
}

fn reverse(k: &FlowKey) -> FlowKey {
    FlowKey { saddr: k.daddr, daddr: k.saddr, sport: k.dport, dport: k.sport, ..*k }
}

fn v4(a: std::net::SocketAddr) -> Result<SocketAddrV4> {
    match a {
        std::net::SocketAddr::V4(a) => Ok(a),
        other => bail!("{other} is not IPv4"),
    }
}

/// A TCP connection from `client` (in its namespace) to `server_ip` in
/// `server`, with a byte sent each way so that conntrack has it
/// established and assured; the key is the client's direction.
fn connect(client: &TestNs, server: &TestNs, server_ip: Ipv4Addr) -> Result<(TcpStream, TcpStream, FlowKey)> {
    let listener = server.enter(move || TcpListener::bind((server_ip, 0)))??;
    let to = v4(listener.local_addr()?)?;
    let mut c = client.enter(move || TcpStream::connect(to))??;
    let (mut s, _) = listener.accept()?;
    let mut b = [0u8; 1];
    c.write_all(b"x")?;
    s.read_exact(&mut b)?;
    s.write_all(b"y")?;
    c.read_exact(&mut b)?;
    let k = key(v4(c.local_addr()?)?, to);
    Ok((c, s, k))
}

fn ct_socket(ns: &TestNs) -> Result<CtNetlink> {
    ns.enter(CtNetlink::open)?
}

#[test]
fn liberal_is_set_on_both_directions_whichever_tuple_names_the_flow() -> Result<()> {
    let (c, s) = (TestNs::new("ctc")?, TestNs::new("cts")?);
    link(&c, "c0", "10.244.1.2/24", &s, "s0", "10.244.1.1/24")?;
    // a conntrack match makes the server's namespace track connections
    s.exec(&["iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"])?;
    let (_c1, _s1, orig) = connect(&c, &s, Ipv4Addr::new(10, 244, 1, 1))?;
    let sock = ct_socket(&s)?;

    let before = fields(&sock, &orig)?.context("the connection has no conntrack entry")?;
    assert_eq!(before.status & IPS_MUST, IPS_MUST, "{before:?}");
    assert_eq!(before.tcp_state, TCP_CONNTRACK_ESTABLISHED);
    assert_eq!(judge(IPPROTO_TCP, &before, false), Verdict::NotLiberal, "{before:?}");
    assert_ne!(before.seen_flags[0] & IP_CT_TCP_FLAG_MAXACK_SET, 0, "both sides acked data: {before:?}");

    // the reply direction's tuple finds the same entry
    assert_eq!(make_liberal(&sock, &reverse(&orig))?, Outcome::Done);
    let after = tcp_flags(&sock, &orig)?.context("the entry went away")?;
    for (dir, f) in after.iter().enumerate() {
        assert_ne!(f & IP_CT_TCP_FLAG_BE_LIBERAL, 0, "direction {dir}: {after:?}");
        assert_eq!(f & IP_CT_TCP_FLAG_MAXACK_SET, 0, "direction {dir}: {after:?}");
        // everything else is left as it was
        assert_eq!(f & !0x28, before.seen_flags[dir] & !0x28, "direction {dir}");
    }
    let now = fields(&sock, &reverse(&orig))?.context("the entry went away")?;
    assert_eq!(judge(IPPROTO_TCP, &now, false), Verdict::Fast, "{now:?}");

    // the original direction's tuple works as well, on a second connection
    let (_c2, _s2, orig2) = connect(&c, &s, Ipv4Addr::new(10, 244, 1, 1))?;
    assert_eq!(make_liberal(&sock, &orig2)?, Outcome::Done);
    assert_eq!(
        tcp_flags(&sock, &orig2)?.map(|f| f[0] & f[1] & IP_CT_TCP_FLAG_BE_LIBERAL),
        Some(IP_CT_TCP_FLAG_BE_LIBERAL)
    );

    // a flow conntrack does not know is gone, not an error
    let unknown = FlowKey { sport: [0, 1], ..orig };
    assert_eq!(make_liberal(&sock, &unknown)?, Outcome::Gone);
    assert!(fields(&sock, &unknown)?.is_none());
    // UDP has no window tracking to relax
    assert!(make_liberal(&sock, &FlowKey { proto: 17, ..orig }).is_err());
    Ok(())
}

/// Reports from a list, then the end (an error, which ends the loop).
struct Listed(Vec<Vec<FlowKey>>);

impl FlowEvents for Listed {
    async fn next_batch(&mut self, out: &mut Vec<FlowKey>) -> Result<()> {
        if self.0.is_empty() {
            bail!("no more reports");
        }
        out.extend(self.0.remove(0));
        Ok(())
    }
}

#[test]
fn promotion_asks_once_per_flow_and_counts_what_became_of_it() -> Result<()> {
    let (c, s) = (TestNs::new("prc")?, TestNs::new("prs")?);
    link(&c, "c0", "10.244.1.2/24", &s, "s0", "10.244.1.1/24")?;
    s.exec(&["iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED", "-j", "ACCEPT"])?;
    let (_c, _s, flow) = connect(&c, &s, Ipv4Addr::new(10, 244, 1, 1))?;
    let gone = FlowKey { sport: [0, 1], ..flow };
    let counters = Arc::new(PromoteCounters::default());
    let promoter = Promoter::new(ct_socket(&s)?, counters.clone());
    // the program reports the flow from both sides, more than once
    let reports = Listed(vec![vec![flow, reverse(&flow)], vec![flow, gone], vec![FlowKey { proto: 17, ..flow }]]);
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let end = rt.block_on(run(reports, promoter));
    assert!(end.is_err(), "the loop ends only with its source");
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (n(&counters.done), n(&counters.repeats), n(&counters.gone), n(&counters.errors)),
        (1, 2, 1, 1),
        "{counters:?}"
    );
    let sock = ct_socket(&s)?;
    assert_eq!(
        tcp_flags(&sock, &flow)?.map(|f| f[0] & f[1] & IP_CT_TCP_FLAG_BE_LIBERAL),
        Some(IP_CT_TCP_FLAG_BE_LIBERAL)
    );
    Ok(())
}

// --- crafting a segment conntrack's window tracking refuses ---

fn fd(domain: i32, ty: i32, proto: i32) -> Result<OwnedFd> {
    // SAFETY: socket(2); the fd is owned at once.
    let raw = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot open a test socket");
    }
    // SAFETY: a fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// An AF_PACKET socket seeing the packets of its namespace, sent ones too
/// (only ETH_P_ALL sockets see those).
fn sniffer() -> Result<OwnedFd> {
    let s = fd(libc::AF_PACKET, libc::SOCK_DGRAM, (libc::ETH_P_ALL as u16).to_be() as i32)?;
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    // SAFETY: a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    Ok(s)
}

/// The next data segment of flow `k` the sniffer sees: the sequence number
/// after it and its acknowledgement number.
fn next_data_segment(sniff: &OwnedFd, k: &FlowKey) -> Result<(u32, u32)> {
    let mut buf = [0u8; 2048];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(sniff.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("saw no segment of the flow");
        }
        let p = &buf[..n as usize];
        if p.len() < 20 || p[0] >> 4 != 4 {
            continue;
        }
        let ihl = (p[0] & 0xf) as usize * 4;
        if p.len() < ihl + 20 || p[9] != IPPROTO_TCP || p[12..16] != k.saddr || p[ihl..ihl + 2] != k.sport {
            continue;
        }
        let t = &p[ihl..];
        let doff = (t[12] >> 4) as usize * 4;
        let len = u16::from_be_bytes([p[2], p[3]]) as usize - ihl - doff;
        if len == 0 {
            continue;
        }
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
        let ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
        return Ok((seq.wrapping_add(len as u32), ack));
    }
}

fn fold(mut sum: u32, b: &[u8]) -> u32 {
    for c in b.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    sum
}

/// An ACK|PSH segment of flow `k` with 4 bytes of data: 44 bytes in all,
/// a length no segment of the real connection has (it uses timestamps).
fn segment(k: &FlowKey, seq: u32, ack: u32) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 44, 0, 0, 0x40, 0, 64, IPPROTO_TCP, 0, 0];
    ip.extend_from_slice(&k.saddr);
    ip.extend_from_slice(&k.daddr);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&k.sport);
    tcp.extend_from_slice(&k.dport);
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.extend_from_slice(&[0x50, 0x18, 0x01, 0xf6, 0, 0, 0, 0]);
    tcp.extend_from_slice(b"evx!");
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&k.saddr);
    pseudo[4..8].copy_from_slice(&k.daddr);
    pseudo[9] = IPPROTO_TCP;
    pseudo[10..12].copy_from_slice(&(tcp.len() as u16).to_be_bytes());
    let mut sum = fold(fold(0, &pseudo), &tcp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ip.extend(tcp);
    ip
}

fn send_raw(pkt: &[u8], to: [u8; 4]) -> Result<()> {
    let s = fd(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW)?;
    // SAFETY: a zeroed sockaddr_in is valid.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as u16;
    sa.sin_addr.s_addr = u32::from_ne_bytes(to);
    // SAFETY: pkt and sa are valid for the lengths given.
    let n = unsafe {
        libc::sendto(
            s.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot send the crafted segment");
    }
    Ok(())
}

/// The packet counters of FORWARD's rules, in order.
fn forward_counters(ns: &TestNs) -> Result<Vec<u64>> {
    let out = ns.exec(&["iptables", "-L", "FORWARD", "-n", "-v", "-x"])?;
    out.lines().skip(2).map(|l| l.split_whitespace().next().unwrap_or("").parse().context(l.to_string())).collect()
}

/// Waits (bounded) until the counting rule saw one more crafted segment.
fn crafted_seen(ns: &TestNs, before: &[u64]) -> Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = forward_counters(ns)?;
        if now[0] > before[0] {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("the crafted segment never reached the router: {now:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_liberal_entry_lets_an_out_of_window_segment_through_kube_proxys_invalid_drop() -> Result<()> {
    let (a, m, b) = (TestNs::new("liba")?, TestNs::new("libm")?, TestNs::new("libb")?);
    link(&a, "a0", "10.244.1.2/24", &m, "ma", "10.244.1.1/24")?;
    link(&m, "mb", "10.244.2.1/24", &b, "b0", "10.244.2.2/24")?;
    a.ip(&["route", "add", "default", "via", "10.244.1.1"])?;
    b.ip(&["route", "add", "default", "via", "10.244.2.1"])?;
    m.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    let crafted = ["-i", "ma", "-m", "length", "--length", "44"];
    let fwd = |rule: &[&str]| m.exec(&[&["iptables", "-A", "FORWARD"][..], rule].concat());
    fwd(&crafted)?; // counts the crafted segments
    fwd(&["-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"])?; // kube-proxy's
    fwd(&[&crafted[..], &["-m", "conntrack", "--ctstate", "ESTABLISHED", "-j", "ACCEPT"][..]].concat())?;
    m.exec(&["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=0"])?;

    let sniff = a.enter(sniffer)??;
    let (mut c, _s, k) = connect(&a, &b, Ipv4Addr::new(10, 244, 2, 2))?;
    c.write_all(b"z")?;
    let (next, ack) = next_data_segment(&sniff, &k)?;
    // far past any window the receiver can have offered (at most 2^30)
    let pkt = segment(&k, next.wrapping_add(0x7000_0000), ack);
    let send = |pkt: Vec<u8>| a.enter(move || send_raw(&pkt, [10, 244, 2, 2]));

    let c0 = forward_counters(&m)?;
    send(pkt.clone())??;
    let c1 = crafted_seen(&m, &c0)?;
    assert_eq!((c1[1] - c0[1], c1[2] - c0[2]), (1, 0), "strict tracking: INVALID, dropped ({c0:?} -> {c1:?})");

    let sock = ct_socket(&m)?;
    assert_eq!(make_liberal(&sock, &k)?, Outcome::Done);
    send(pkt)??;
    let c2 = crafted_seen(&m, &c1)?;
    assert_eq!((c2[1] - c1[1], c2[2] - c1[2]), (0, 1), "liberal: ESTABLISHED, forwarded ({c1:?} -> {c2:?})");
    Ok(())
}
