//! A NETLINK_NETFILTER socket for ctnetlink requests, and the few bytes of
//! netlink framing they need: a request is one `nlmsghdr` + `nfgenmsg` +
//! attributes, the answer the kernel's data messages and its ack or errno.
//! Hand-written: two requests and one reply shape do not justify a crate
//! (see `mod.rs`).
use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Mutex,
    time::Duration,
};

use anyhow::{Context, Result, bail};

const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const NLA_HDRLEN: usize = 4;
pub const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
/// A lost answer must not hang the caller; the kernel answers a ctnetlink
/// request while the request is being sent, so this is never waited out
/// in practice.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One netfilter netlink request under construction.
pub struct Request {
    buf: Vec<u8>,
    open: Vec<usize>,
}

impl Request {
    /// `nlmsg_type` is `subsystem << 8 | message`; `family` the nfgenmsg's.
    pub fn new(nlmsg_type: u16, flags: u16, family: u8) -> Self {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&nlmsg_type.to_ne_bytes());
        buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        // nfgenmsg: family, version NFNETLINK_V0, res_id 0 (big-endian)
        buf.extend_from_slice(&[family, 0, 0, 0]);
        Request { buf, open: Vec::new() }
    }

    pub fn put(&mut self, ty: u16, data: &[u8]) -> &mut Self {
        let len = NLA_HDRLEN + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// Opens a nested attribute; [`Request::end`] closes the innermost.
    pub fn begin(&mut self, ty: u16) -> &mut Self {
        self.open.push(self.buf.len());
        self.put(ty | NLA_F_NESTED, &[])
    }

    pub fn end(&mut self) -> &mut Self {
        if let Some(at) = self.open.pop() {
            let len = (self.buf.len() - at) as u16;
            self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    pub(super) fn finish(mut self, seq: u32) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end();
        }
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// The attributes in `buf`, as (type without flags, payload); stops at the
/// first one that does not fit (a truncated answer yields what it holds).
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > buf.len() {
            return None;
        }
        let data = &buf[NLA_HDRLEN..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((ty, data))
    })
}

/// The first attribute of type `ty` in `buf`.
pub fn attr(buf: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(buf).find(|(t, _)| *t == ty).map(|(_, d)| d)
}

/// What the kernel answered a request with.
#[derive(Debug)]
pub enum Answer {
    /// It acked; the data messages (their attributes, after the nfgenmsg)
    /// that came before the ack.
    Ok(Vec<Vec<u8>>),
    /// It refused with this errno (positive: `libc::ENOENT`, ...).
    Errno(i32),
}

/// A NETLINK_NETFILTER socket in the network namespace of the thread that
/// opened it; requests on it are one at a time (a lock inside).
pub struct CtNetlink {
    fd: Mutex<(OwnedFd, u32)>,
}

impl CtNetlink {
    pub fn open() -> Result<Self> {
        // SAFETY: socket(2) with constant arguments; the fd is owned at once.
        let raw =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
        if raw < 0 {
            return Err(io::Error::last_os_error()).context("cannot open a NETLINK_NETFILTER socket");
        }
        // SAFETY: raw is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval { tv_sec: ANSWER_TIMEOUT.as_secs() as _, tv_usec: 0 };
        // SAFETY: setsockopt with a valid timeval of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error()).context("cannot set a receive timeout on the netfilter socket");
        }
        Ok(CtNetlink { fd: Mutex::new((fd, 0)) })
    }

    /// Sends `req` and collects the answer to it (messages of earlier,
    /// timed-out requests are skipped by their sequence number).
    pub fn request(&self, req: Request) -> Result<Answer> {
        let mut guard = self.fd.lock().unwrap_or_else(|p| p.into_inner());
        guard.1 = guard.1.wrapping_add(1);
        let seq = guard.1;
        let fd = guard.0.as_raw_fd();
        let msg = req.finish(seq);
        // SAFETY: a zeroed sockaddr_nl is valid; nl_pid 0 is the kernel.
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: msg and `to` are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error()).context("cannot send a ctnetlink request");
        }
        let mut data = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error()).context("no answer to a ctnetlink request");
            }
            if let Some(answer) = take(&buf[..n as usize], seq, &mut data)? {
                return Ok(answer);
            }
        }
    }
}

/// Reads one datagram's messages for `seq`: data into `data`; the ack or
/// error ends the answer.
fn take(mut dgram: &[u8], seq: u32, data: &mut Vec<Vec<u8>>) -> Result<Option<Answer>> {
    while dgram.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([dgram[0], dgram[1], dgram[2], dgram[3]]) as usize;
        if len < NLMSG_HDRLEN || len > dgram.len() {
            bail!("the kernel sent a malformed netlink message ({len} bytes of {})", dgram.len());
        }
        let ty = u16::from_ne_bytes([dgram[4], dgram[5]]);
        let their_seq = u32::from_ne_bytes([dgram[8], dgram[9], dgram[10], dgram[11]]);
        let body = &dgram[NLMSG_HDRLEN..len];
        dgram = &dgram[align(len).min(dgram.len())..];
        if their_seq != seq {
            continue;
        }
        match ty {
            NLMSG_ERROR => {
                let errno = body.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                return match errno {
                    Some(0) => Ok(Some(Answer::Ok(std::mem::take(data)))),
                    Some(e) => Ok(Some(Answer::Errno(-e))),
                    None => bail!("the kernel sent a netlink error message without its errno"),
                };
            }
            NLMSG_DONE => return Ok(Some(Answer::Ok(std::mem::take(data)))),
            _ => data.push(body.get(NFGENMSG_LEN..).unwrap_or_default().to_vec()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_are_sized_and_read_back() {
        let mut r = Request::new(0x100, NLM_F_REQUEST, 2);
        r.begin(1).put(1, &[10, 0, 0, 1]).begin(2).put(1, &[6]).end().end().put(3, &[1, 2, 3, 4]);
        let msg = r.finish(7);
        assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize, msg.len());
        let top: Vec<_> = attrs(&msg[NLMSG_HDRLEN + NFGENMSG_LEN..]).collect();
        assert_eq!(top.len(), 2);
        assert_eq!(top[1], (3, &[1u8, 2, 3, 4][..]));
        let inner = top[0].1;
        assert_eq!(attr(inner, 1), Some(&[10u8, 0, 0, 1][..]));
        assert_eq!(attr(attr(inner, 2).unwrap(), 1), Some(&[6u8][..]), "a u8 is padded to four bytes");
    }

    #[test]
    fn a_truncated_attribute_ends_the_walk() {
        let buf = [8u8, 0, 1, 0, 1, 2, 3, 4, 12, 0, 2, 0, 9];
        assert_eq!(attrs(&buf).count(), 1);
    }

    fn nlmsg(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(body);
        m.resize(align(m.len()), 0);
        m
    }

    #[test]
    fn answers_are_matched_by_sequence_and_errors_are_positive() {
        let mut data = Vec::new();
        let mut d = nlmsg(0x101, 5, &[2, 0, 0, 0, 0xaa]);
        d.extend(nlmsg(NLMSG_ERROR, 4, &(-1i32).to_ne_bytes())); // a stale answer
        assert!(take(&d, 5, &mut data).unwrap().is_none());
        assert_eq!(data, vec![vec![0xaa]]);
        let err = nlmsg(NLMSG_ERROR, 5, &(-libc::ENOENT).to_ne_bytes());
        assert!(matches!(take(&err, 5, &mut data).unwrap(), Some(Answer::Errno(libc::ENOENT))));
        let ack = nlmsg(NLMSG_ERROR, 6, &0i32.to_ne_bytes());
        assert!(matches!(take(&ack, 6, &mut Vec::new()).unwrap(), Some(Answer::Ok(v)) if v.is_empty()));
        assert!(take(&nlmsg(0, 1, &[])[..10], 1, &mut data).unwrap().is_none());
    }
}
