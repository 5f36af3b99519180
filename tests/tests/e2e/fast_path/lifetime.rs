//! A fast-pathed flow's conntrack entry lives as the stack would keep it:
//! the fast path refreshes its timeout, so a stream the stack no longer
//! sees keeps its entry past the node's timeout; and RST, which always
//! takes the stack, closes entries, so connections reset by the
//! thousand leave no ESTABLISHED entries behind.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{netns::in_netns, real_node::RealCluster};

use super::{FAST_IP_MASQ, fast_path_counters, fast_path_on};

/// The node's UDP timeouts in the timeout test (the kernel's defaults are
/// 30 s unreplied and 120 s for a stream).
const UDP_TIMEOUT: u32 = 10;
/// How long the stream runs one way after it is assured: well past
/// [`UDP_TIMEOUT`].
const ONE_WAY: Duration = Duration::from_secs(25);
const UDP_PORT: u16 = 9400;

/// node1's conntrack entries of `proto` to `port`, one line each.
fn entries(rc: &RealCluster, node: u8, proto: &str, port: u16) -> Result<Vec<String>> {
    let out = rc.node(node).ns.output(&["conntrack", "-L", "-p", proto, "--dport", &port.to_string()])?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
}

#[test]
fn a_fast_pathed_udp_stream_keeps_its_entry_past_the_stacks_timeout() -> Result<()> {
    let rc = RealCluster::start(&[FAST_IP_MASQ, FAST_IP_MASQ], 1)?;
    for i in [1, 2] {
        for key in ["nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"] {
            rc.node(i).ns.sysctl(&format!("net.netfilter.{key}"), &UDP_TIMEOUT.to_string())?;
        }
    }
    let on = fast_path_on(&rc, 1)?;
    let (a, b) = (rc.pod(1, 0), rc.pod(2, 0));
    let to = SocketAddr::new(a.ip.into(), UDP_PORT);
    let server = in_netns(&a.netns, move || UdpSocket::bind(("0.0.0.0", UDP_PORT)).context("bind"))?;
    let client = in_netns(&b.netns, move || UdpSocket::bind(("0.0.0.0", UDP_PORT + 1)).context("bind"))?;
    server.set_read_timeout(Some(Duration::from_millis(200)))?;

    // both ways for 3 s: conntrack assures a UDP stream still active after two
    let start = Instant::now();
    let mut got = 0u64;
    let mut buf = [0u8; 64];
    while start.elapsed() < Duration::from_secs(3) {
        client.send_to(b"ping", to)?;
        if let Ok((_, from)) = server.recv_from(&mut buf) {
            server.send_to(b"pong", from)?;
            got += 1;
        }
        thread::sleep(Duration::from_millis(50));
    }
    ensure!(got > 0, "no datagram from {} reached {}", b.ip, a.ip);
    let assured = entries(&rc, 1, "udp", UDP_PORT)?;
    ensure!(assured.iter().any(|l| l.contains("ASSURED")), "node1 did not assure the stream: {assured:?}");

    // then one way only: node1's stack sees none of it while the fast path carries it
    let before = (rc.counter(1, "fast_path_packets")?, rc.counter(1, "fast_path_stack_no_entry")?);
    let one_way = Instant::now();
    let mut received = 0u64;
    while one_way.elapsed() < ONE_WAY {
        client.send_to(b"data", to)?;
        if server.recv_from(&mut buf).is_ok() {
            received += 1;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let after = (rc.counter(1, "fast_path_packets")?, rc.counter(1, "fast_path_stack_no_entry")?);
    let now = entries(&rc, 1, "udp", UDP_PORT)?;
    ensure!(received > 0, "the one-way stream did not arrive");
    ensure!(
        now.iter().any(|l| l.contains("ASSURED")),
        "{ONE_WAY:?} of a one-way stream with a {UDP_TIMEOUT} s timeout: node1's entry is gone or new: {now:?}\n{}",
        fast_path_counters(&rc, 1)
    );
    if on {
        ensure!(after.0 > before.0, "the fast path carried none of the stream\n{}", fast_path_counters(&rc, 1));
        ensure!(
            after.1 == before.1,
            "the entry expired under the fast path ({} packets found none)\n{}",
            after.1 - before.1,
            fast_path_counters(&rc, 1)
        );
    }
    Ok(())
}

const RST_PORT: u16 = 9500;
const CONNECTIONS: usize = 1000;
const PAYLOAD: usize = 4096;

/// Closes `s` with a RST: SO_LINGER on with a zero timeout, then close.
fn reset(s: TcpStream) -> Result<()> {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on an open socket with a correctly sized value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    ensure!(rc == 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(s);
    Ok(())
}

#[test]
fn a_thousand_reset_connections_leave_no_established_entries() -> Result<()> {
    let rc = RealCluster::start(&[FAST_IP_MASQ, FAST_IP_MASQ], 1)?;
    let (a, b) = (rc.pod(1, 0), rc.pod(2, 0));
    let listener = in_netns(&a.netns, move || TcpListener::bind(("0.0.0.0", RST_PORT)).context("bind"))?;
    // the server echoes what each connection sends, then waits for its RST
    let server = thread::spawn(move || -> Result<()> {
        for _ in 0..CONNECTIONS {
            let (mut s, _) = listener.accept().context("accept")?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut buf = vec![0u8; PAYLOAD];
            s.read_exact(&mut buf).context("read")?;
            s.write_all(&buf).context("write")?;
            let _ = s.read(&mut buf);
        }
        Ok(())
    });
    let to = SocketAddr::new(a.ip.into(), RST_PORT);
    let clients = in_netns(&b.netns, move || {
        (0..CONNECTIONS)
            .map(|k| {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10))
                    .with_context(|| format!("connect #{k}"))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                let mut buf = vec![k as u8; PAYLOAD];
                s.write_all(&buf)?;
                s.read_exact(&mut buf).with_context(|| format!("echo #{k}"))?;
                reset(s)
            })
            .collect::<Result<Vec<()>>>()
    });
    clients?;
    server.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))??;
    for i in [1, 2] {
        let established: Vec<String> =
            entries(&rc, i, "tcp", RST_PORT)?.into_iter().filter(|l| l.contains("ESTABLISHED")).collect();
        ensure!(
            established.is_empty(),
            "node{i}: {} of {CONNECTIONS} reset connections are still ESTABLISHED, e.g. {:?}\n{}",
            established.len(),
            established.first(),
            fast_path_counters(&rc, i)
        );
    }
    Ok(())
}
