//! The raw `__sk_buff` behind a TC context, for the helpers aya-ebpf does
//! not wrap (bpf_check_mtu, bpf_get_hash_recalc, bpf_skb_change_tail) and
//! the fields it has no accessor for (mark, gso_size, gso_segs).
use aya_ebpf::{EbpfContext, bindings::__sk_buff, programs::TcContext};

#[inline(always)]
pub fn raw(ctx: &TcContext) -> *mut __sk_buff {
    ctx.as_ptr().cast()
}
