//! Traffic endpoints run inside pod namespaces by the tests: a TCP stream
//! whose SHA-256 both ends print, and numbered UDP datagrams checked byte
//! for byte on arrival.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    process::ExitCode,
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};

/// Deterministic bytes (xorshift64), so the receiver can check content.
struct Pattern(u64);
impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let b = self.0.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn datagram(seq: u32, size: usize) -> Vec<u8> {
    let mut d = vec![0u8; size];
    d[..4].copy_from_slice(&seq.to_be_bytes());
    Pattern(0x9e37_79b9_7f4a_7c15 ^ seq as u64).fill(&mut d[4..]);
    d
}

fn run(args: &[String]) -> Result<(), String> {
    let arg = |i: usize| args.get(i).cloned().ok_or_else(|| format!("missing argument {i}"));
    let num = |i: usize| -> Result<u64, String> { arg(i)?.parse().map_err(|e| format!("argument {i}: {e}")) };
    match arg(0)?.as_str() {
        "tcp-recv" => {
            // "::" takes IPv4 too (bindv6only is 0); "0.0.0.0" where IPv6 is off
            let port = num(1)? as u16;
            let l = TcpListener::bind(("::", port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
                .map_err(|e| e.to_string())?;
            ready();
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            let (mut h, mut n, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 16]);
            loop {
                let r = s.read(&mut buf).map_err(|e| e.to_string())?;
                if r == 0 {
                    break;
                }
                h.update(&buf[..r]);
                n += r as u64;
            }
            println!("{n} {}", hex(&h.finalize()));
        }
        "tcp-send" => {
            let (ip, port, total) = (arg(1)?, num(2)? as u16, num(3)?);
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut s = loop {
                match TcpStream::connect((ip.as_str(), port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            let (mut h, mut p, mut buf, mut left) = (Sha256::new(), Pattern(42), vec![0u8; 1 << 16], total);
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                p.fill(&mut buf[..n]);
                s.write_all(&buf[..n]).map_err(|e| e.to_string())?;
                h.update(&buf[..n]);
                left -= n as u64;
            }
            s.shutdown(std::net::Shutdown::Write).map_err(|e| e.to_string())?;
            let _ = s.read(&mut buf);
            println!("{total} {}", hex(&h.finalize()));
        }
        "udp-recv" => {
            let (port, count, size, ms) = (num(1)? as u16, num(2)?, num(3)? as usize, num(4)?);
            let s = UdpSocket::bind(("::", port))
                .or_else(|_| UdpSocket::bind(("0.0.0.0", port)))
                .map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_millis(ms))).map_err(|e| e.to_string())?;
            // the whole burst fits in the socket: a receiver the scheduler
            // holds back a few ms (a loaded 2-core CI machine) must not turn
            // into loss that a test would blame on the dataplane
            big_receive_buffer(&s, count as usize * (size + 1024))?;
            ready();
            let (mut good, mut bad, mut buf) = (0u64, 0u64, vec![0u8; 65536]);
            while good + bad < count {
                match s.recv(&mut buf) {
                    Ok(n) if n == size && n >= 4 => {
                        let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
                        if buf[..n] == datagram(seq, size)[..] { good += 1 } else { bad += 1 }
                    }
                    Ok(_) => bad += 1,
                    Err(_) => break,
                }
            }
            println!("{good} {bad}");
        }
        "udp-send" => {
            let (ip, port, count, size) = (arg(1)?, num(2)? as u16, num(3)?, num(4)? as usize);
            let any = if ip.contains(':') { "[::]:0" } else { "0.0.0.0:0" };
            let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
            for seq in 0..count {
                s.send_to(&datagram(seq as u32, size), (ip.as_str(), port)).map_err(|e| e.to_string())?;
                if seq % 16 == 15 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            println!("{count}");
        }
        other => return Err(format!("unknown mode {other}")),
    }
    Ok(())
}

/// SO_RCVBUFFORCE (root; past net.core.rmem_max) to at least `bytes`.
fn big_receive_buffer(s: &UdpSocket, bytes: usize) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let want = libc::c_int::try_from(bytes.max(1 << 20)).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket and a c_int option value of the stated size
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&want as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!("SO_RCVBUFFORCE {want}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testpeer: {e}");
            ExitCode::FAILURE
        }
    }
}
