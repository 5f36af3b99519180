//! A flood generator that builds no skb at the sender: BPF_PROG_RUN of a
//! two-instruction XDP program (`return XDP_TX`) with
//! `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18). The kernel turns each copy
//! of the template into an `xdp_frame` and sends it out of
//! `ingress_ifindex` through `ndo_xdp_xmit`; for a veth that puts it
//! straight on the peer's receive ring (the peer needs NAPI: an XDP
//! program, or GRO on). This is how `xdp-trafficgen` injects, for the IPv4
//! template it does not have (its UDP mode is IPv6 only).
//!
//! Raw bpf(2): aya loads programs from ELF objects only, and this one is
//! two instructions.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 2;
const XDP_TX: i32 = 3;

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<i64> {
    // SAFETY: the kernel reads and writes at most attr.len() bytes of the attr we own.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(rc) }
}

fn put32(a: &mut [u8], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The generator: its program loaded, the template and target fixed.
pub struct Flood {
    prog: OwnedFd,
    frame: Vec<u8>,
    /// `struct xdp_md`: data 0, data_end the frame's length, ingress_ifindex.
    ctx: [u8; 24],
}

impl Flood {
    /// Sends `frame` out of `ifindex` (in the calling thread's netns).
    pub fn new(ifindex: u32, frame: Vec<u8>) -> Result<Self> {
        // r0 = XDP_TX; exit
        let mut insns = [0u8; 16];
        insns[0] = 0xb7;
        insns[4..8].copy_from_slice(&XDP_TX.to_ne_bytes());
        insns[8] = 0x95;
        let license = c"GPL";
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_PROG_TYPE_XDP);
        put32(&mut attr, 4, 2);
        put64(&mut attr, 8, insns.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        let fd = bpf(BPF_PROG_LOAD, &mut attr).context("cannot load the generator's XDP program")?;
        // SAFETY: the kernel just returned this descriptor; nobody else owns it.
        let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut ctx = [0u8; 24];
        put32(&mut ctx, 4, frame.len() as u32);
        put32(&mut ctx, 12, ifindex);
        Ok(Flood { prog, frame, ctx })
    }

    /// Sends `count` copies, `batch` per kernel batch; returns how long it took.
    pub fn send(&self, count: u32, batch: u32) -> Result<Duration> {
        let mut attr = [0u8; 80];
        put32(&mut attr, 0, self.prog.as_raw_fd() as u32);
        put32(&mut attr, 8, self.frame.len() as u32);
        put64(&mut attr, 16, self.frame.as_ptr() as u64);
        put32(&mut attr, 32, count);
        put32(&mut attr, 40, self.ctx.len() as u32);
        put64(&mut attr, 48, self.ctx.as_ptr() as u64);
        put32(&mut attr, 64, BPF_F_TEST_XDP_LIVE_FRAMES);
        put32(&mut attr, 72, batch);
        let t = Instant::now();
        bpf(BPF_PROG_TEST_RUN, &mut attr)
            .context("BPF_PROG_RUN with live frames failed (Linux 5.18 or later; the target needs NAPI)")?;
        Ok(t.elapsed())
    }

    /// Floods for `run` at about `pps` frames per second (0: as fast as it goes).
    /// Returns the frames handed to the kernel.
    pub fn flood_for(&self, run: Duration, pps: u64) -> Result<u64> {
        const CHUNK: u32 = 4096;
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < run {
            self.send(CHUNK, 64)?;
            sent += CHUNK as u64;
            if pps > 0 {
                let due = Duration::from_secs_f64(sent as f64 / pps as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        Ok(sent)
    }
}

/// The ifindex of `name` in the calling thread's netns.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: a NUL-terminated string we own.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => bail!("no interface {name}: {}", std::io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_to(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it; 0 is this thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// An IPv4 VXLAN frame from `src` to `dst` (port 8472, VNI 1) carrying a
/// 64-byte inner frame, to Ethernet `dst_mac`: a stranger's spoofed VXLAN.
pub fn vxlan4(dst_mac: [u8; 6], src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut inner = vec![0x02, 0xaa, 0, 0, 0, 1, 0x02, 0xbb, 0, 0, 0, 2, 0x08, 0x00];
    inner.extend([0x45, 0, 0, 50, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 244, 2, 2, 10, 244, 1, 2]);
    inner.resize(64, 0x5a);
    let mut udp = vec![0x9c, 0x40, 0x21, 0x18];
    udp.extend(((8 + 8 + inner.len()) as u16).to_be_bytes());
    udp.extend([0, 0, 0x08, 0, 0, 0, 0, 0, 1, 0]);
    udp.extend(inner);
    let mut ip = vec![0x45, 0];
    ip.extend(((20 + udp.len()) as u16).to_be_bytes());
    ip.extend([0, 0, 0, 0, 64, 17, 0, 0]);
    ip.extend(src);
    ip.extend(dst);
    let mut sum: u32 = ip.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let mut f = dst_mac.to_vec();
    f.extend([0x02, 0x66, 0, 0, 0, 0x66, 0x08, 0x00]);
    f.extend(ip);
    f.extend(udp);
    f
}
