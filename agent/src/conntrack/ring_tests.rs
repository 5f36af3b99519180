//! [`RingEvents`] on a real ring buffer: a standalone BPF_MAP_TYPE_RINGBUF
//! and a five-instruction socket filter, run with BPF_PROG_TEST_RUN, that
//! writes one [`FlowEvent`](edgevx_common::fastpath::FlowEvent) per run as
//! the fast path program will. Root only, as the other kernel tests.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use aya::maps::{Map, MapData, RingBuf};
use edgevx_common::fastpath::FlowKey;

use super::promote::{FlowEvents, PromoteCounters, RingEvents};

const BPF_MAP_CREATE: u64 = 0;
const BPF_PROG_LOAD: u64 = 5;
const BPF_PROG_TEST_RUN: u64 = 10;
const BPF_MAP_TYPE_RINGBUF: u64 = 27;
const BPF_PROG_TYPE_SOCKET_FILTER: u64 = 1;
const BPF_FUNC_RINGBUF_OUTPUT: i32 = 130;

/// bpf(2) with an attribute block given as u64 words (little-endian
/// layout: the low half of a word is the earlier u32 field).
fn bpf(cmd: u64, attr: &mut [u64; 16]) -> Result<i64> {
    // SAFETY: attr is valid for its size, which is passed.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("bpf command {cmd}"));
    }
    Ok(rc)
}

fn fd(rc: i64) -> OwnedFd {
    // SAFETY: a fresh fd from bpf(2).
    unsafe { OwnedFd::from_raw_fd(rc as i32) }
}

/// One instruction: opcode, dst and src registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = dst | src << 4;
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    u64::from_le_bytes(b)
}

/// A socket filter that outputs the 16 bytes of `key` to ring `map`.
fn writer(map: &OwnedFd, key: &FlowKey) -> Result<OwnedFd> {
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&key.saddr);
    bytes[4..8].copy_from_slice(&key.daddr);
    bytes[8..10].copy_from_slice(&key.sport);
    bytes[10..12].copy_from_slice(&key.dport);
    bytes[12] = key.proto;
    let mut prog = Vec::new();
    for (i, w) in bytes.chunks(4).enumerate() {
        // *(u32 *)(r10 - 16 + 4i) = w
        prog.push(insn(0x62, 10, 0, -16 + 4 * i as i16, i32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    }
    prog.push(insn(0x18, 1, 1, 0, map.as_raw_fd())); // r1 = map (ld_imm64, pseudo map fd)
    prog.push(0);
    prog.push(insn(0xbf, 2, 10, 0, 0)); // r2 = r10
    prog.push(insn(0x07, 2, 0, 0, -16)); // r2 += -16
    prog.push(insn(0xb7, 3, 0, 0, 16)); // r3 = 16
    prog.push(insn(0xb7, 4, 0, 0, 0)); // r4 = 0
    prog.push(insn(0x85, 0, 0, 0, BPF_FUNC_RINGBUF_OUTPUT));
    prog.push(insn(0xb7, 0, 0, 0, 0)); // r0 = 0
    prog.push(insn(0x95, 0, 0, 0, 0)); // exit
    let license = c"GPL";
    let mut attr = [0u64; 16];
    attr[0] = BPF_PROG_TYPE_SOCKET_FILTER | (prog.len() as u64) << 32;
    attr[1] = prog.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    Ok(fd(bpf(BPF_PROG_LOAD, &mut attr).context("cannot load the test writer")?))
}

fn run_once(prog: &OwnedFd) -> Result<()> {
    let packet = [0u8; 64];
    let mut attr = [0u64; 16];
    attr[0] = prog.as_raw_fd() as u64;
    attr[1] = packet.len() as u64;
    attr[2] = packet.as_ptr() as u64;
    bpf(BPF_PROG_TEST_RUN, &mut attr).context("cannot run the test writer")?;
    Ok(())
}

#[test]
fn flow_events_are_read_from_a_real_ring_buffer_when_it_wakes() -> Result<()> {
    let mut attr = [0u64; 16];
    attr[1] = 4096 << 32; // key and value size 0, max_entries a page
    attr[0] = BPF_MAP_TYPE_RINGBUF;
    let map = fd(bpf(BPF_MAP_CREATE, &mut attr).context("cannot create a ring buffer")?);
    let key = FlowKey {
        saddr: [10, 244, 1, 2],
        daddr: [10, 244, 2, 2],
        sport: 40000u16.to_be_bytes(),
        dport: 80u16.to_be_bytes(),
        proto: 6,
        _pad: [0; 3],
    };
    let prog = writer(&map, &key)?;
    let ring = RingBuf::try_from(Map::from_map_data(MapData::from_fd(map)?)?)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut events = RingEvents::new(ring, Arc::new(PromoteCounters::default()))?;
        // two records before the first wait: one batch holds both
        run_once(&prog)?;
        run_once(&prog)?;
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), events.next_batch(&mut got)).await??;
        assert_eq!(got, vec![key, key]);
        // an empty ring waits, and wakes for the next record
        got.clear();
        let waiting = tokio::time::timeout(Duration::from_millis(200), events.next_batch(&mut got)).await;
        if waiting.is_ok() {
            bail!("a batch from an empty ring: {got:?}");
        }
        run_once(&prog)?;
        tokio::time::timeout(Duration::from_secs(5), events.next_batch(&mut got)).await??;
        assert_eq!(got, vec![key]);
        Ok(())
    })
}
