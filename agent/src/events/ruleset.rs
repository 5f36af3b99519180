//! "The ruleset may have changed" for the fast path's epoch (fast-path.md
//! §B.4 step 5), in this network namespace:
//! - nftables, which iptables-nft and kube-proxy's nftables mode also
//!   write: every committed transaction is announced on the netlink group
//!   `NFNLGRP_NFTABLES` (ending in `NFT_MSG_NEWGEN`), so it is seen at once;
//! - legacy iptables: no event exists, so a signature of the tables is
//!   compared every [`POLL`] ([`super::xtables`]);
//! - the conntrack sysctls the fast path reads, compared at the same pace.
//!
//! Changes that arrive together (a transaction's messages, a restore of
//! many tables) are one event: it goes out once nothing more came for
//! [`QUIET`], and at most [`MAX_DELAY`] after the first.
use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use anyhow::{Context, Result};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, MissedTickBehavior, sleep_until},
};
use tracing::{debug, warn};

use super::xtables::Xtables;
use crate::conntrack::sysctls::{CtSysctls, read_ct_sysctls};

/// How often legacy tables and the sysctls are compared.
pub const POLL: Duration = Duration::from_millis(500);
pub const QUIET: Duration = Duration::from_millis(10);
pub const MAX_DELAY: Duration = Duration::from_millis(100);
/// include/uapi/linux/netfilter/nfnetlink.h, `enum nfnetlink_groups`.
const NFNLGRP_NFTABLES: u32 = 7;
/// Room for a large transaction's notifications (one message per rule);
/// an overrun is reported as a change all the same.
const RCVBUF: i32 = 8 << 20;

/// What changed since the last event (several may have).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RulesetChanged {
    /// An nftables transaction was committed (or the socket overran).
    pub nftables: bool,
    /// A legacy iptables table changed, appeared or went away.
    pub legacy: bool,
    /// A conntrack sysctl the fast path reads changed ([`read_ct_sysctls`]).
    pub sysctls: bool,
}

fn sockopt(fd: &OwnedFd, level: i32, opt: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt with an int of the size given.
    let rc =
        unsafe { libc::setsockopt(fd.as_raw_fd(), level, opt, (&value as *const i32).cast(), size_of::<i32>() as u32) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// A non-blocking NETLINK_NETFILTER socket in the nftables group.
fn nftables_socket() -> Result<OwnedFd> {
    let flags = libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: socket(2) with constant arguments; owned at once.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, flags, libc::NETLINK_NETFILTER) };
    if raw < 0 {
        return Err(io::Error::last_os_error()).context("cannot open a NETLINK_NETFILTER socket");
    }
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // bound (to a port id the kernel picks): an unbound socket got no notifications
    // SAFETY: a zeroed sockaddr_nl is valid.
    let mut me: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    me.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: `me` is valid for the length given.
    let rc = unsafe {
        libc::bind(fd.as_raw_fd(), (&me as *const libc::sockaddr_nl).cast(), size_of::<libc::sockaddr_nl>() as u32)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error()).context("cannot bind the NETLINK_NETFILTER socket");
    }
    // beyond rmem_max needs CAP_NET_ADMIN, which the agent has; else the most allowed
    if sockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF).is_err() {
        let _ = sockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF);
    }
    sockopt(&fd, libc::SOL_NETLINK, libc::NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTABLES as i32)
        .context("cannot subscribe to nftables changes (NFNLGRP_NFTABLES)")?;
    Ok(fd)
}

/// Reads all that is queued; whether anything (or an overrun) was.
fn drain(fd: &OwnedFd) -> io::Result<bool> {
    let mut buf = [0u8; 16384];
    let mut any = false;
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            any = true;
            continue;
        }
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            _ if n == 0 => Ok(any),
            Some(libc::EAGAIN) => Ok(any),
            // notifications were lost: they were changes all the same
            Some(libc::ENOBUFS) => Ok(true),
            Some(libc::EINTR) => continue,
            _ => Err(e),
        };
    }
}

/// What is compared every [`POLL`].
struct Polled {
    xtables: Xtables,
    legacy: Option<u64>,
    sysctls: Option<CtSysctls>,
}

impl Polled {
    fn legacy_now(&self) -> Option<u64> {
        // an unreadable table counts as no signature: a change both ways
        self.xtables.signature().unwrap_or_else(|e| {
            debug!("legacy iptables: {e:#}");
            None
        })
    }

    fn check(&mut self, ev: &mut RulesetChanged) {
        let legacy = self.legacy_now();
        if legacy != self.legacy {
            self.legacy = legacy;
            ev.legacy = true;
        }
        let sysctls = read_ct_sysctls().ok();
        if sysctls != self.sysctls {
            self.sysctls = sysctls;
            ev.sysctls = true;
        }
    }
}

/// Starts watching the namespace of the calling thread (the task must run
/// on threads of the same namespace, as all of the agent's do: the legacy
/// table list and the sysctls are read where it runs). No event is sent
/// for the state at start; the caller starts from a fresh epoch.
pub fn spawn(tx: mpsc::Sender<RulesetChanged>) -> Result<JoinHandle<()>> {
    let nft = nftables_socket()?;
    // SAFETY: the OwnedFd stays open and the same while the AsyncFd owns it.
    let nft = unsafe { AsyncFd::register_with_interest(nft, Interest::READABLE) }
        .map_err(io::Error::from)
        .context("cannot poll the nftables socket")?;
    let mut polled = Polled { xtables: Xtables::open()?, legacy: None, sysctls: read_ct_sysctls().ok() };
    polled.legacy = polled.legacy_now();
    Ok(tokio::spawn(async move {
        if let Err(e) = watch(nft, polled, tx).await {
            warn!("fast path: ruleset watch stopped: {e:#}");
        }
    }))
}

async fn watch(nft: AsyncFd<OwnedFd>, mut polled: Polled, tx: mpsc::Sender<RulesetChanged>) -> Result<()> {
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut pending = RulesetChanged::default();
    // (first change, last change) of the pending event
    let mut since: Option<(Instant, Instant)> = None;
    loop {
        let due = since.map(|(first, last)| (last + QUIET).min(first + MAX_DELAY));
        let mut changed = RulesetChanged::default();
        tokio::select! {
            ready = nft.readable() => {
                let mut guard = ready.context("cannot wait on the nftables socket")?;
                changed.nftables = drain(guard.get_ref().get_ref()).context("cannot read nftables notifications")?;
                // read to EAGAIN; a message after that keeps its own readiness
                guard.clear_ready();
            }
            _ = poll.tick() => polled.check(&mut changed),
            _ = async { if let Some(t) = due { sleep_until(t).await } else { std::future::pending().await } } => {
                since = None;
                // a full channel already holds an event that follows this change
                if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(std::mem::take(&mut pending)) {
                    return Ok(());
                }
                continue;
            }
        }
        if changed != RulesetChanged::default() {
            pending.nftables |= changed.nftables;
            pending.legacy |= changed.legacy;
            pending.sysctls |= changed.sysctls;
            let now = Instant::now();
            since = Some((since.map_or(now, |(first, _)| first), now));
        }
    }
}
