//! Issue 33, finding 6, with BPF_PROG_TEST_RUN: decap marks what it judged
//! for our VTEP (`MARK_JUDGED` in `skb->mark`), and the VTEP guard on
//! `flannel.<VNI>`'s ingress lets only marked frames by, clearing the bit.
//! A frame that skipped decap (a program ahead of it ended the chain)
//! carries no mark and is dropped there. The context goes in and comes
//! back as `struct __sk_buff`, whose `mark` is at byte 8.
use anyhow::Result;
use aya::{TestRun, TestRunOptions, programs::SchedClassifier};
use edgevx_common::maps::{FLAG_BYPASS_NETFILTER, FLAG_REQUIRE_JUDGED, MARK_JUDGED};

use crate::prog_test_run::{
    HOST_MAC, Loaded, NEXT, OUR_MAC, PEER_IP, PEER_MAC, POD_MAC, STRANGER_IP, TC_ACT_REDIRECT, TC_ACT_SHOT, eth, ipv4,
    load, vxlan_frame,
};

/// kube-proxy's masquerade bit: a bit of someone else's that must survive.
const KUBE_MARK_MASQ: u32 = 0x4000;
/// `offsetof(struct __sk_buff, mark)`.
const MARK_AT: usize = 8;

/// Runs `prog` on `input` with `skb->mark` = `mark`: its verdict, the
/// packet it leaves and the mark it leaves.
pub(crate) fn run_marked(l: &Loaded, prog: &str, input: &[u8], mark: u32) -> Result<(u32, Vec<u8>, u32)> {
    // the VTEP guard may be the one program loaded by hand (a module's kfuncs)
    let p: &SchedClassifier = l.ebpf.classifier_ref(prog)?;
    let mut ctx_in = [0u8; MARK_AT + 4];
    ctx_in[MARK_AT..].copy_from_slice(&mark.to_ne_bytes());
    // room for the whole __sk_buff of any kernel: a smaller buffer is refused (ENOSPC)
    let mut ctx_out = [0u8; 512];
    let mut out = vec![0u8; input.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        ctx_in: Some(&ctx_in),
        ctx_out: Some(&mut ctx_out),
        ..Default::default()
    };
    let r = p.test_run(opts)?;
    out.truncate(r.data_size_out as usize);
    let m = u32::from_ne_bytes([ctx_out[MARK_AT], ctx_out[MARK_AT + 1], ctx_out[MARK_AT + 2], ctx_out[MARK_AT + 3]]);
    Ok((r.return_value, out, m))
}

/// A peer's pod to ours, as decap hands it to flannel.1.
fn inner() -> Vec<u8> {
    ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0, 0, 0, 0, 0, 1, 0, 1], 0)
}

#[test]
fn the_vtep_guard_drops_what_decap_did_not_judge_and_clears_the_mark_of_what_it_did() -> Result<()> {
    let l = load(FLAG_REQUIRE_JUDGED)?;
    let frame = eth(OUR_MAC, PEER_MAC, 0x0800, &inner());
    // judged: passes unchanged, our bit cleared, someone else's kept
    let (rc, out, mark) = run_marked(&l, "edgevx_vtep_guard", &frame, MARK_JUDGED | KUBE_MARK_MASQ)?;
    assert_eq!((rc, &out, mark), (NEXT, &frame, KUBE_MARK_MASQ));
    // not judged (decap never saw it): dropped, whatever other bits it carries
    assert_eq!(run_marked(&l, "edgevx_vtep_guard", &frame, 0)?.0, TC_ACT_SHOT);
    assert_eq!(run_marked(&l, "edgevx_vtep_guard", &frame, KUBE_MARK_MASQ)?.0, TC_ACT_SHOT);
    // not IPv4 either: nothing unjudged reaches the VTEP
    let arp = eth(OUR_MAC, PEER_MAC, 0x0806, &[0; 28]);
    assert_eq!(run_marked(&l, "edgevx_vtep_guard", &arp, 0)?.0, TC_ACT_SHOT);
    Ok(())
}

#[test]
fn the_vtep_guard_lets_everything_by_when_the_config_does_not_ask_for_judged_frames() -> Result<()> {
    // an older agent's config (a downgrade): its decap does not mark
    let l = load(0)?;
    let frame = eth(OUR_MAC, PEER_MAC, 0x0800, &inner());
    assert_eq!(run_marked(&l, "edgevx_vtep_guard", &frame, 0)?, (NEXT, frame.clone(), 0));
    let (rc, out, mark) = run_marked(&l, "edgevx_vtep_guard", &frame, MARK_JUDGED)?;
    assert_eq!((rc, out, mark), (NEXT, frame, 0), "a mark is cleared all the same");
    Ok(())
}

#[test]
fn decap_marks_what_it_judged_for_our_vtep_and_nothing_else() -> Result<()> {
    let l = load(FLAG_REQUIRE_JUDGED)?;
    let inner = inner();
    let frame = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
    // a learned pod: stripped and redirected to flannel.1's ingress, marked
    let (rc, out, mark) = run_marked(&l, "edgevx_decap", &frame, KUBE_MARK_MASQ)?;
    assert_eq!((rc, out), (TC_ACT_REDIRECT, eth(OUR_MAC, PEER_MAC, 0x0800, &inner)));
    assert_eq!(mark, MARK_JUDGED | KUBE_MARK_MASQ);
    // the host itself: left to the kernel's VXLAN receive, unchanged but marked
    let host_bound = vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([10, 244, 2, 2], [10, 244, 1, 0], 1, &[0; 8], 0));
    assert_eq!(run_marked(&l, "edgevx_decap", &host_bound, 0)?, (NEXT, host_bound, MARK_JUDGED));
    // refused: dropped, never marked
    let spoofed = vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([10, 244, 9, 9], [10, 244, 1, 2], 1, &[0; 8], 0));
    assert_eq!(run_marked(&l, "edgevx_decap", &spoofed, 0)?.0, TC_ACT_SHOT);
    assert_eq!(run_marked(&l, "edgevx_decap", &vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner), 0)?.0, TC_ACT_SHOT);
    // another VNI is another device's: passed on, not marked
    let other_vni = vxlan_frame(PEER_IP, 2, OUR_MAC, &inner);
    assert_eq!(run_marked(&l, "edgevx_decap", &other_vni, 0)?, (NEXT, other_vni, 0));
    // not VXLAN: untouched, not marked
    let plain = eth(OUR_MAC, PEER_MAC, 0x0800, &inner);
    assert_eq!(run_marked(&l, "edgevx_decap", &plain, 0)?, (NEXT, plain, 0));
    Ok(())
}

#[test]
fn decap_leaves_no_mark_on_what_it_sends_straight_into_a_pod() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER | FLAG_REQUIRE_JUDGED)?;
    let inner = inner();
    let (rc, out, mark) = run_marked(&l, "edgevx_decap", &vxlan_frame(PEER_IP, 1, OUR_MAC, &inner), 0)?;
    // --bypass-netfilter: the pod's namespace, past the VTEP, must not get the bit
    assert_eq!((rc, out, mark), (TC_ACT_REDIRECT, eth(POD_MAC, HOST_MAC, 0x0800, &inner), 0));
    Ok(())
}
