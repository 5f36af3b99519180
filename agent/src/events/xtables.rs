//! A signature of the legacy (x_tables) IPv4 tables, which change without
//! any event: iptables-legacy swaps a whole table in with one setsockopt.
//! For each table the namespace has, `IPT_SO_GET_INFO` (hooks, entry
//! count, size) and a hash of `IPT_SO_GET_ENTRIES` with the per-rule
//! counters zeroed, so that traffic does not count as a change but a
//! same-sized edit (`-j ACCEPT` to `-j DROP`, another address) does.
//!
//! Not seen: a change undone before the next look (the ruleset is then
//! the same), ip6tables (the fast path is IPv4), arptables and ebtables.
use std::{
    hash::{DefaultHasher, Hasher},
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{Context, Result, bail};

/// Lists the legacy IPv4 tables of the calling thread's namespace. Only
/// these are asked about: asking for another would instantiate it.
const NAMES: &str = "/proc/thread-self/net/ip_tables_names";
// include/uapi/linux/netfilter_ipv4/ip_tables.h
const IPT_SO_GET_INFO: i32 = 64;
const IPT_SO_GET_ENTRIES: i32 = 65;
const TABLE_NAME_LEN: usize = 32;
/// `struct ipt_getinfo`: name, valid_hooks, hook_entry[5], underflow[5],
/// num_entries, size.
const GETINFO_LEN: usize = TABLE_NAME_LEN + 4 * (1 + 5 + 5 + 2);
/// `sizeof(struct ipt_get_entries)`: name, size, padded to the 8-byte
/// alignment of the `ipt_entry` array that follows (its u64 counters).
const GET_ENTRIES_HDR: usize = 40;
/// In `struct ipt_entry`: `next_offset` (u16) and the `xt_counters`.
const NEXT_OFFSET_AT: usize = 90;
const COUNTERS: std::ops::Range<usize> = 96..112;

/// A socket to ask x_tables with, in the namespace it was opened in.
pub struct Xtables {
    fd: OwnedFd,
}

impl Xtables {
    pub fn open() -> Result<Self> {
        // SAFETY: socket(2) with constant arguments; owned at once.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
        if raw < 0 {
            return Err(io::Error::last_os_error()).context("cannot open a raw socket to read the iptables tables");
        }
        // SAFETY: a fresh fd.
        Ok(Xtables { fd: unsafe { OwnedFd::from_raw_fd(raw) } })
    }

    fn get(&self, opt: i32, buf: &mut [u8]) -> io::Result<()> {
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: buf is valid for len bytes.
        let rc =
            unsafe { libc::getsockopt(self.fd.as_raw_fd(), libc::IPPROTO_IP, opt, buf.as_mut_ptr().cast(), &mut len) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    fn table(&self, name: &str, h: &mut DefaultHasher) -> Result<()> {
        let mut info = [0u8; GETINFO_LEN];
        let n = name.len().min(TABLE_NAME_LEN - 1);
        info[..n].copy_from_slice(&name.as_bytes()[..n]);
        // the table may be swapped between the two calls (EAGAIN): ask again
        for _ in 0..3 {
            self.get(IPT_SO_GET_INFO, &mut info).with_context(|| format!("cannot read iptables table {name}"))?;
            let size = u32::from_ne_bytes([info[80], info[81], info[82], info[83]]) as usize;
            let mut entries = vec![0u8; GET_ENTRIES_HDR + size];
            entries[..TABLE_NAME_LEN].copy_from_slice(&info[..TABLE_NAME_LEN]);
            entries[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(size as u32).to_ne_bytes());
            match self.get(IPT_SO_GET_ENTRIES, &mut entries) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot read iptables table {name}'s rules")),
                Ok(()) => {}
            }
            zero_counters(&mut entries[GET_ENTRIES_HDR..]);
            h.write(&info);
            h.write(&entries[GET_ENTRIES_HDR..]);
            return Ok(());
        }
        bail!("iptables table {name} kept changing while it was read")
    }

    /// The signature now: `None` when the namespace has no legacy table.
    pub fn signature(&self) -> Result<Option<u64>> {
        let names = std::fs::read_to_string(NAMES).with_context(|| format!("cannot read {NAMES}"))?;
        let mut names: Vec<&str> = names.split_whitespace().collect();
        if names.is_empty() {
            return Ok(None);
        }
        names.sort_unstable();
        let mut h = DefaultHasher::new();
        for name in names {
            h.write(name.as_bytes());
            self.table(name, &mut h)?;
        }
        Ok(Some(h.finish()))
    }
}

/// Zeroes each rule's packet and byte counters, walking `next_offset`.
fn zero_counters(entries: &mut [u8]) {
    let mut at = 0;
    while at + COUNTERS.end <= entries.len() {
        entries[at + COUNTERS.start..at + COUNTERS.end].fill(0);
        let next = u16::from_ne_bytes([entries[at + NEXT_OFFSET_AT], entries[at + NEXT_OFFSET_AT + 1]]) as usize;
        if next == 0 {
            break;
        }
        at += next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_counters_of_each_rule_are_zeroed() {
        let mut e = vec![0xabu8; 112 + 120];
        e[NEXT_OFFSET_AT..NEXT_OFFSET_AT + 2].copy_from_slice(&112u16.to_ne_bytes());
        e[112 + NEXT_OFFSET_AT..112 + NEXT_OFFSET_AT + 2].copy_from_slice(&120u16.to_ne_bytes());
        zero_counters(&mut e);
        assert!(e[96..112].iter().all(|b| *b == 0));
        assert!(e[112 + 96..112 + 112].iter().all(|b| *b == 0));
        assert_eq!(e[95], 0xab);
        assert_eq!(e[112 + 112], 0xab, "a rule's matches and target are kept");
    }
}
