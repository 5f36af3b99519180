//! Per-flow liberal TCP tracking through ctnetlink, and reading back the
//! fields the fast path judges an entry by.
//!
//! `IPCTNL_MSG_CT_NEW` without `NLM_F_CREATE`/`NLM_F_EXCL` updates the
//! entry found by `CTA_TUPLE_ORIG`; that lookup is `nf_conntrack_find_get`
//! on the tuple given, which finds an entry by either of its directions'
//! tuples (net/netfilter/nf_conntrack_netlink.c, ctnetlink_new_conntrack).
//! So the packet's own tuple is sent whichever direction it is, and the
//! flags below name the entry's directions, not the packet's.
//!
//! `nlattr_to_tcp` (nf_conntrack_proto_tcp.c) applies each direction's
//! `nf_ct_tcp_flags` as `seen.flags = seen.flags & !mask | flags & mask`,
//! so one request sets `BE_LIBERAL` and clears `MAXACK_SET` on both sides:
//! - `BE_LIBERAL`: window tracking can no longer turn the flow INVALID
//!   while the stack misses the packets the fast path delivers.
//! - `MAXACK_SET` cleared, as the flowtable does when it hands a flow back
//!   (nf_flow_table_core.c, flow_offload_fixup_tcp): otherwise an RST is
//!   judged against a `td_maxack` the bypass left stale and conntrack
//!   keeps the entry ESTABLISHED (fast-path.md F4). The stack sets it
//!   again from the next ACK it sees, with a current value; clearing it
//!   only skips the "RST before max ack" check until then.
use anyhow::{Context, Result, bail};
use edgevx_common::fastpath::{CtFields, FlowKey, IP_CT_TCP_FLAG_BE_LIBERAL, IPPROTO_TCP};

use super::netlink::{Answer, CtNetlink, NLM_F_ACK, NLM_F_REQUEST, Request, attr};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;

// include/uapi/linux/netfilter/nfnetlink_conntrack.h
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_MARK: u16 = 8;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;

/// include/uapi/linux/netfilter/nf_conntrack_tcp.h
pub const IP_CT_TCP_FLAG_MAXACK_SET: u8 = 0x20;

/// `struct nf_ct_tcp_flags { flags, mask }` for both directions.
const LIBERAL: [u8; 2] = [IP_CT_TCP_FLAG_BE_LIBERAL, IP_CT_TCP_FLAG_BE_LIBERAL | IP_CT_TCP_FLAG_MAXACK_SET];

/// What became of a liberal request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Both directions are tracked liberally now.
    Done,
    /// No such entry (it ended, or was flushed): nothing to do.
    Gone,
}

fn request(ty: u16, key: &FlowKey) -> Request {
    let mut r = Request::new(NFNL_SUBSYS_CTNETLINK << 8 | ty, NLM_F_REQUEST | NLM_F_ACK, libc::AF_INET as u8);
    r.begin(CTA_TUPLE_ORIG);
    r.begin(CTA_TUPLE_IP).put(CTA_IP_V4_SRC, &key.saddr).put(CTA_IP_V4_DST, &key.daddr).end();
    r.begin(CTA_TUPLE_PROTO)
        .put(CTA_PROTO_NUM, &[key.proto])
        .put(CTA_PROTO_SRC_PORT, &key.sport)
        .put(CTA_PROTO_DST_PORT, &key.dport)
        .end();
    r.end();
    r
}

fn describe(key: &FlowKey) -> String {
    let port = |p: [u8; 2]| u16::from_be_bytes(p);
    format!(
        "{}:{} -> {}:{} proto {}",
        std::net::Ipv4Addr::from(key.saddr),
        port(key.sport),
        std::net::Ipv4Addr::from(key.daddr),
        port(key.dport),
        key.proto
    )
}

/// Tracks the TCP flow `key` (either direction's tuple) liberally in both
/// directions, in the socket's network namespace.
pub fn make_liberal(sock: &CtNetlink, key: &FlowKey) -> Result<Outcome> {
    if key.proto != IPPROTO_TCP {
        bail!("{}: only TCP entries have window tracking to relax", describe(key));
    }
    let mut r = request(IPCTNL_MSG_CT_NEW, key);
    r.begin(CTA_PROTOINFO).begin(CTA_PROTOINFO_TCP);
    r.put(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &LIBERAL).put(CTA_PROTOINFO_TCP_FLAGS_REPLY, &LIBERAL);
    r.end().end();
    match sock.request(r).with_context(|| format!("cannot make {} liberal", describe(key)))? {
        Answer::Ok(_) => Ok(Outcome::Done),
        Answer::Errno(libc::ENOENT) => Ok(Outcome::Gone),
        Answer::Errno(e) => Err(std::io::Error::from_raw_os_error(e))
            .with_context(|| format!("conntrack refused to make {} liberal", describe(key))),
    }
}

/// The entry of flow `key` (either direction's tuple) as the fast path
/// judges it, or `None` if there is none.
pub fn fields(sock: &CtNetlink, key: &FlowKey) -> Result<Option<CtFields>> {
    let answer = sock
        .request(request(IPCTNL_MSG_CT_GET, key))
        .with_context(|| format!("cannot read the conntrack entry of {}", describe(key)))?;
    let msgs = match answer {
        Answer::Ok(m) => m,
        Answer::Errno(libc::ENOENT) => return Ok(None),
        Answer::Errno(e) => {
            return Err(std::io::Error::from_raw_os_error(e))
                .with_context(|| format!("conntrack refused to show the entry of {}", describe(key)));
        }
    };
    let Some(entry) = msgs.first() else { bail!("conntrack acked a lookup of {} but sent no entry", describe(key)) };
    Ok(Some(decode(entry)))
}

/// `seen[ORIGINAL].flags` and `seen[REPLY].flags` of flow `key`'s entry.
pub fn tcp_flags(sock: &CtNetlink, key: &FlowKey) -> Result<Option<[u8; 2]>> {
    Ok(fields(sock, key)?.map(|f| f.seen_flags))
}

fn be32(b: Option<&[u8]>) -> u32 {
    b.and_then(|b| b.get(..4)).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// An entry's attributes (as ctnetlink_fill_info writes them) to the fields.
fn decode(entry: &[u8]) -> CtFields {
    let tcp = attr(entry, CTA_PROTOINFO).and_then(|p| attr(p, CTA_PROTOINFO_TCP)).unwrap_or_default();
    let flags = |ty| attr(tcp, ty).and_then(|f| f.first().copied()).unwrap_or(0);
    CtFields {
        status: be32(attr(entry, CTA_STATUS)),
        mark: be32(attr(entry, CTA_MARK)),
        tcp_state: attr(tcp, CTA_PROTOINFO_TCP_STATE).and_then(|s| s.first().copied()).unwrap_or(0),
        seen_flags: [flags(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL), flags(CTA_PROTOINFO_TCP_FLAGS_REPLY)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_decodes_to_the_judged_fields() {
        let mut r = Request::new(0, 0, 2);
        r.put(CTA_STATUS, &0x18eu32.to_be_bytes()).put(CTA_MARK, &7u32.to_be_bytes());
        r.begin(CTA_PROTOINFO).begin(CTA_PROTOINFO_TCP);
        r.put(CTA_PROTOINFO_TCP_STATE, &[3]).put(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &[0x28, 0]);
        r.put(CTA_PROTOINFO_TCP_FLAGS_REPLY, &[0x0a, 0]).end().end();
        let msg = r.finish(1);
        let f = decode(&msg[20..]);
        assert_eq!((f.status, f.mark, f.tcp_state, f.seen_flags), (0x18e, 7, 3, [0x28, 0x0a]));
        // a UDP entry has no protoinfo: zeros, not an error
        assert_eq!(decode(&[]).seen_flags, [0, 0]);
    }
}
