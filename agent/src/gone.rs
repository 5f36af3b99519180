//! "Already gone is fine": how each source of errors the agent removes
//! things through says that the thing is not there (a file or a pin, a
//! map entry, a pinned link, a tc filter, a route, a neighbour, an fdb
//! entry). A removal writes `gone::removed(result)` and names only what it
//! removes; a lookup writes `gone::absent(result)` and gets `None`.
use std::io;

use aya::{
    maps::MapError,
    programs::{links::LinkError, tc::TcError},
};

/// An error that can mean "not there".
pub trait Gone {
    /// Whether the error says the object was not there.
    fn is_gone(&self) -> bool;
}

impl Gone for io::Error {
    fn is_gone(&self) -> bool {
        self.kind() == io::ErrorKind::NotFound
    }
}

impl Gone for MapError {
    fn is_gone(&self) -> bool {
        match self {
            MapError::KeyNotFound => true,
            MapError::SyscallError(e) => e.io_error.is_gone(),
            _ => false,
        }
    }
}

impl Gone for LinkError {
    fn is_gone(&self) -> bool {
        matches!(self, LinkError::SyscallError(e) if e.io_error.is_gone())
    }
}

impl Gone for TcError {
    fn is_gone(&self) -> bool {
        matches!(self, TcError::IoError(e) if e.is_gone())
    }
}

/// What rtnetlink answers for a route (`ESRCH`), an fdb entry or a
/// neighbour (`ENOENT`) that is not there, or a device that is not
/// (`ENODEV`: whatever was on it went with it).
impl Gone for rtnetlink::Error {
    fn is_gone(&self) -> bool {
        matches!(self, rtnetlink::Error::NetlinkError(e) if [-libc::ENOENT, -libc::ESRCH, -libc::ENODEV].contains(&e.raw_code()))
    }
}

/// A removal whose object may already be gone: that is a success.
pub fn removed<E: Gone>(result: Result<(), E>) -> Result<(), E> {
    absent(result).map(drop)
}

/// A lookup or removal whose object may not be there: `Ok(None)` then.
pub fn absent<T, E: Gone>(result: Result<T, E>) -> Result<Option<T>, E> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_gone() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroI32;

    use aya::sys::SyscallError;
    use rtnetlink::packet_core::ErrorMessage;

    use super::*;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    fn netlink(errno: i32) -> rtnetlink::Error {
        let mut m = ErrorMessage::default();
        m.code = NonZeroI32::new(-errno);
        rtnetlink::Error::NetlinkError(m)
    }

    #[test]
    fn each_source_says_gone_for_its_not_there_and_only_for_it() {
        assert!(os(libc::ENOENT).is_gone());
        assert!(!os(libc::EACCES).is_gone());

        assert!(MapError::KeyNotFound.is_gone());
        let map = |errno| MapError::SyscallError(SyscallError { call: "bpf_map_delete_elem", io_error: os(errno) });
        assert!(map(libc::ENOENT).is_gone());
        assert!(!map(libc::EPERM).is_gone());
        assert!(!MapError::ElementNotFound.is_gone());

        let link = |errno| LinkError::SyscallError(SyscallError { call: "BPF_OBJ_GET", io_error: os(errno) });
        assert!(link(libc::ENOENT).is_gone());
        assert!(!link(libc::EINVAL).is_gone());

        assert!(TcError::IoError(os(libc::ENOENT)).is_gone());
        assert!(!TcError::IoError(os(libc::EBUSY)).is_gone());

        for errno in [libc::ENOENT, libc::ESRCH, libc::ENODEV] {
            assert!(netlink(errno).is_gone(), "{errno}");
        }
        assert!(!netlink(libc::EEXIST).is_gone());
        assert!(!rtnetlink::Error::RequestFailed.is_gone());
    }

    #[test]
    fn a_gone_object_is_a_success_and_any_other_error_stays_one() {
        assert!(removed::<io::Error>(Ok(())).is_ok());
        assert!(removed(Err(os(libc::ENOENT))).is_ok());
        assert_eq!(removed(Err(os(libc::EROFS))).unwrap_err().raw_os_error(), Some(libc::EROFS));
        assert_eq!(absent::<u8, io::Error>(Ok(7)).unwrap(), Some(7));
        assert_eq!(absent::<u8, _>(Err(netlink(libc::ESRCH))).unwrap(), None);
        assert!(absent::<u8, _>(Err(netlink(libc::EPERM))).is_err());
    }
}
