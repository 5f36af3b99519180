//! The conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c), declared as
//! plain foreign functions.
//!
//! rustc (1.99) emits no BTF for a foreign function, so the object has no
//! `.ksyms` entry for these and aya cannot resolve them itself: each call is
//! left as a call to an undefined symbol, which the agent rewrites into a
//! kfunc call (BTF id of the running kernel) before loading, or poisons when
//! the kernel lacks the kfunc (agent/src/dataplane/kfunc.rs). Every call is
//! behind [`crate::fastpath`]'s `FP_CT_KFUNCS`, a load-time constant, so a
//! poisoned call is dead code the verifier never walks.
use aya_ebpf::bindings::__sk_buff;

/// `struct nf_conn`, only ever handled by pointer; its fields are read at
/// offsets the agent takes from the kernel's BTF.
#[repr(C)]
pub struct NfConn {
    _opaque: [u8; 0],
}

/// The IPv4 arm of `struct bpf_sock_tuple` (network byte order).
#[repr(C)]
pub struct SockTupleV4 {
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
}

/// `struct bpf_ct_opts` as 5.18 to 6.9 define it (12 bytes); 6.10 grew it
/// to 16 for zones and still takes 12, meaning the default zone.
#[repr(C)]
pub struct CtOpts {
    pub netns_id: i32,
    pub error: i32,
    pub l4proto: u8,
    pub dir: u8,
    pub reserved: [u8; 2],
}

pub const CT_OPTS_SIZE: u32 = 12;
/// `BPF_F_CURRENT_NETNS`: the skb's own network namespace.
pub const CURRENT_NETNS: i32 = -1;

unsafe extern "C" {
    pub fn bpf_skb_ct_lookup(
        skb: *mut __sk_buff,
        tuple: *mut SockTupleV4,
        tuple_size: u32,
        opts: *mut CtOpts,
        opts_size: u32,
    ) -> *mut NfConn;
    pub fn bpf_ct_release(ct: *mut NfConn);
    pub fn bpf_ct_change_timeout(ct: *mut NfConn, timeout_ms: u32) -> i32;
}
