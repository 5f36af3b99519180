//! Reading one file of the store without trusting it.
//!
//! Any name in the store may hold something neither plugin wrote: a stray
//! file, a record cut short by a crash or a full disk, a FIFO, a directory,
//! a symbolic link. One such entry must cost at most its own address, never
//! the ADD or DEL of every other pod on the node (the plugin runs under the
//! store's lock, so one that fails or hangs stops them all). So the callers
//! skip an entry this module cannot read, say so on stderr with [`warn`],
//! and leave it exactly where it is: never rewritten, never removed, for an
//! operator to look at (it may be the only copy of something).
//!
//! Only a regular file is opened, with `O_NONBLOCK|O_NOFOLLOW`, and checked
//! again with fstat once open: opening a FIFO blocks until a writer comes
//! (host-local itself hangs on one, with the lock held), and a link may
//! point anywhere. At most [`MAX_LEN`] bytes are read: everything either
//! plugin writes is far shorter.
use std::{
    fmt::Display,
    fs::{self, File, FileType, OpenOptions},
    io::{self, Read},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::Path,
};

use thiserror::Error;

/// A pod record is under 1 KiB; a reservation under 100 bytes.
pub const MAX_LEN: u64 = 64 * 1024;

/// Why an entry cannot be read.
#[derive(Debug, Error)]
pub enum Unreadable {
    #[error("a {0}, not a regular file")]
    NotAFile(&'static str),
    #[error("longer than {MAX_LEN} bytes")]
    TooLong,
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn kind(t: FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symbolic link"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// The content of the regular file at `path`; None if there is no such
/// name (a concurrent host-local released it between readdir and read).
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, Unreadable> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
        Ok(m) if !m.file_type().is_file() => return Err(Unreadable::NotAFile(kind(m.file_type()))),
        Ok(_) => {}
    }
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // swapped for a link since the lstat
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Unreadable::NotAFile("symbolic link")),
        r => r?,
    };
    let t = file.metadata()?.file_type();
    if !t.is_file() {
        return Err(Unreadable::NotAFile(kind(t)));
    }
    read_capped(file)
}

fn read_capped(file: File) -> Result<Option<Vec<u8>>, Unreadable> {
    let mut bytes = Vec::new();
    file.take(MAX_LEN + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_LEN {
        return Err(Unreadable::TooLong);
    }
    Ok(Some(bytes))
}

/// The line an operator finds in the runtime's log: the entry, why it was
/// skipped, and what that means for its address.
pub fn warn(path: &Path, why: impl Display, outcome: impl Display) {
    eprintln!("edgevx-ipam: warning: skipped store entry {}: {why}; {outcome}", path.display());
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, os::unix::ffi::OsStrExt, path::PathBuf};

    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("edgevx-ipam-entry-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn only_a_short_regular_file_is_read() {
        let dir = tmp("kinds");
        fs::write(dir.join("file"), "c1\r\neth0").unwrap();
        assert_eq!(read(&dir.join("file")).unwrap().as_deref(), Some(&b"c1\r\neth0"[..]));
        assert!(read(&dir.join("absent")).unwrap().is_none());
        fs::create_dir(dir.join("dir")).unwrap();
        assert!(matches!(read(&dir.join("dir")), Err(Unreadable::NotAFile("directory"))));
        std::os::unix::fs::symlink(dir.join("file"), dir.join("link")).unwrap();
        assert!(matches!(read(&dir.join("link")), Err(Unreadable::NotAFile("symbolic link"))));
        fs::write(dir.join("long"), vec![b'x'; MAX_LEN as usize + 1]).unwrap();
        assert!(matches!(read(&dir.join("long")), Err(Unreadable::TooLong)));
        fs::write(dir.join("max"), vec![b'x'; MAX_LEN as usize]).unwrap();
        assert!(read(&dir.join("max")).is_ok());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tmp("fifo");
        let fifo = dir.join("10.0.0.9");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // with no writer, a blocking open would never return
        assert!(matches!(read(&fifo), Err(Unreadable::NotAFile("FIFO"))));
        let _ = fs::remove_dir_all(dir);
    }
}
