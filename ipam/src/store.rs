//! host-local's on-disk store, shared with it (plugins/ipam/host-local/
//! backend/disk/backend.go, lock.go), in `<dataDir>/<network>/`:
//! - one file per reserved address, named by the address, holding
//!   `<containerID>\r\n<ifname>` (or only the container ID, as host-local
//!   before v0.8.0 and the OpenYurt patch wrote it): [`crate::holder`];
//! - `last_reserved_ip.<range set index>`, where the round-robin resumes;
//! - `lock`, taken with `flock(LOCK_EX)` around every change.
//!
//! What this plugin adds lives under `.edgevx/` ([`crate::identity`]).
//! host-local walks the whole tree (`filepath.Walk`) when it releases, but
//! only deletes files whose trimmed content equals a container ID or
//! `<containerID>\r\n<ifname>`, and only returns files named like an
//! address: JSON records never match either.
//!
//! Every file is read through [`crate::entry`]: one that cannot be read
//! is skipped with a warning and never removed; a reservation's address
//! stays taken, a `last_reserved_ip.*` is only a hint and restarts the walk.
//!
//! Unlike host-local every write here is durable. A command stages its
//! writes (each a temporary file made with `O_EXCL|O_NOFOLLOW`) and
//! [`Store::commit`] fsyncs them, links (a new reservation: fails if the
//! address is taken) or renames (a replacement) each into place, and
//! fsyncs the directories. A failed command commits nothing. The fsyncs
//! are the price: about 4 ms each on the test VM's disk, 4 per ADD and 3
//! per DEL, which host-local (none) does not pay.
use std::{
    cell::RefCell,
    collections::BTreeMap,
    fs::{self, File, OpenOptions},
    io::{self, Write},
    net::IpAddr,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use thiserror::Error;

use crate::{
    entry,
    holder::{Holder, holder_content},
    wire::{CniError, Code},
};

pub const LOCK_FILE: &str = "lock";
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// This plugin's own subdirectory.
pub const OWN_DIR: &str = ".edgevx";
const TMP_DIR: &str = ".edgevx/tmp";
/// The pod records (identity.rs), relative to the store's directory.
pub const PODS_DIR: &str = ".edgevx/pods";

/// Test hook: `EDGEVX_IPAM_CRASH_AT=<step>` aborts the process right after
/// that write, as a power cut would, so tests can show the store it leaves.
pub const CRASH_ENV: &str = "EDGEVX_IPAM_CRASH_AT";

pub fn crash_point(step: &str) {
    if std::env::var(CRASH_ENV).is_ok_and(|s| s == step) {
        eprintln!("edgevx-ipam: {CRASH_ENV}={step}: aborting");
        std::process::abort();
    }
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("corrupt store file {path}: {why}")]
    Corrupt { path: PathBuf, why: String },
}

impl From<StoreError> for CniError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io { .. } => CniError::new(Code::Io, "cannot use the IPAM store", e.to_string()),
            StoreError::Corrupt { .. } => CniError::new(Code::CorruptStore, "corrupt IPAM store", e.to_string()),
        }
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// The store of one network, locked for as long as it lives.
pub struct Store {
    dir: PathBuf,
    _lock: Option<File>,
    /// Changes staged by the command, made durable together by [`Store::commit`].
    pending: RefCell<Vec<Pending>>,
}

impl Store {
    /// Opens (creating) `dir` and takes the lock host-local takes.
    pub fn open_locked(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        // std's file lock is flock(2) on Linux (LOCK_EX, waiting): the lock
        // earlier releases took with libc, so old and new plugins exclude each other
        if let Err(source) = lock.lock() {
            return Err(StoreError::Io { path: lock_path, source });
        }
        let store = Store { dir: dir.to_path_buf(), _lock: Some(lock), pending: RefCell::new(Vec::new()) };
        for sub in [OWN_DIR, TMP_DIR, PODS_DIR] {
            let p = dir.join(sub);
            if !p.is_dir() {
                fs::create_dir_all(&p).map_err(io_at(&p))?;
                sync_dir(p.parent().unwrap_or(dir))?;
            }
        }
        // anything left here is a write a crash cut short: never linked, so never a reservation
        let tmp = dir.join(TMP_DIR);
        for entry in fs::read_dir(&tmp).map_err(io_at(&tmp))? {
            let entry = entry.map_err(io_at(&tmp))?;
            let _ = fs::remove_file(entry.path());
        }
        Ok(store)
    }

    /// Opens `dir` to read it only (STATUS), without the lock.
    pub fn open_read_only(dir: &Path) -> Store {
        Store { dir: dir.to_path_buf(), _lock: None, pending: RefCell::new(Vec::new()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every file named like an address, and who holds it. One that
    /// cannot be read is [`Holder::Unreadable`] (taken), with a warning.
    pub fn reservations(&self) -> Result<BTreeMap<IpAddr, Holder>, StoreError> {
        let mut out = BTreeMap::new();
        let entries = match fs::read_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            r => r.map_err(io_at(&self.dir))?,
        };
        for entry in entries {
            let entry = entry.map_err(io_at(&self.dir))?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse::<IpAddr>().ok()) else { continue };
            let path = entry.path();
            match entry::read(&path) {
                Ok(Some(bytes)) => {
                    out.insert(ip, Holder::parse(&String::from_utf8_lossy(&bytes)));
                }
                // released between readdir and read
                Ok(None) => {}
                Err(why) => {
                    entry::warn(&path, why, format_args!("{ip} stays reserved, for nobody, until it is removed"));
                    out.insert(ip, Holder::Unreadable);
                }
            }
        }
        Ok(out)
    }

    /// Names in the store's directory that are not host-local's or ours.
    pub fn other_names(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_at(&self.dir))? {
            let name = entry.map_err(io_at(&self.dir))?.file_name().to_string_lossy().into_owned();
            if name.parse::<IpAddr>().is_err()
                && name != LOCK_FILE
                && name != OWN_DIR
                && !name.starts_with(LAST_RESERVED_PREFIX)
            {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// Whether `ip` has a file (host-local's O_EXCL test, asked first).
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        fs::symlink_metadata(self.dir.join(ip.to_string())).is_ok()
    }

    /// Stages the reservation of `ip` for the attachment. At commit the
    /// file is linked into place, which fails rather than replace a file
    /// that a writer ignoring the lock made in between.
    pub fn reserve(&self, ip: IpAddr, container_id: &str, ifname: &str, step: &'static str) -> Result<(), StoreError> {
        let content = holder_content(container_id, ifname);
        self.stage(&self.dir, &ip.to_string(), content.as_bytes(), Apply::Link, step)
    }

    /// Stages handing `ip`'s file to another attachment.
    pub fn reassign(&self, ip: IpAddr, container_id: &str, ifname: &str, step: &'static str) -> Result<(), StoreError> {
        let content = holder_content(container_id, ifname);
        self.stage(&self.dir, &ip.to_string(), content.as_bytes(), Apply::Rename, step)
    }

    /// Stages the removal of `ip`'s file.
    pub fn release(&self, ip: IpAddr, step: &'static str) {
        self.stage_removal(&self.dir, &ip.to_string(), step);
    }

    /// `last_reserved_ip.<index>`, where round-robin resumes. Empty or
    /// NUL-filled (host-local's unsynced write after a power cut) counts as
    /// absent. Anything else that is not an address is skipped with a
    /// warning and the walk starts over, as host-local does: the file is
    /// only a hint, and one bad hint must not stop every ADD.
    pub fn last_reserved(&self, index: usize) -> Option<IpAddr> {
        let path = self.dir.join(format!("{LAST_RESERVED_PREFIX}{index}"));
        let text = match entry::read(&path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return None,
            Err(why) => {
                entry::warn(&path, why, "round-robin starts at the range's start; the file is left as it is");
                return None;
            }
        };
        let text = String::from_utf8_lossy(&text);
        let t = text.trim();
        if t.is_empty() || t.chars().all(|c| c == '\0') {
            return None;
        }
        t.parse()
            .map_err(|_| {
                entry::warn(
                    &path,
                    format_args!("{t:?} is not an IP address"),
                    "round-robin starts at the range's start; the next reservation rewrites it, as host-local does",
                )
            })
            .ok()
    }

    /// Stages `last_reserved_ip.<index>`, unless that name is something
    /// other than a file: a rename would silently replace a FIFO, and fail
    /// on a directory, failing the ADD.
    pub fn set_last_reserved(&self, index: usize, ip: IpAddr, step: &'static str) -> Result<(), StoreError> {
        let name = format!("{LAST_RESERVED_PREFIX}{index}");
        let path = self.dir.join(&name);
        if fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_file()) {
            entry::warn(&path, "not a regular file", "round-robin is not recorded; the entry is left as it is");
            return Ok(());
        }
        self.stage(&self.dir, &name, ip.to_string().as_bytes(), Apply::Rename, step)
    }

    /// Stages writing `name` in `sub` (relative to the store).
    pub fn write_own(&self, sub: &str, name: &str, content: &[u8], step: &'static str) -> Result<(), StoreError> {
        self.stage(&self.dir.join(sub), name, content, Apply::Rename, step)
    }

    /// Stages writing `name` in `sub` where the command succeeds without
    /// it (a full disk must not fail a DEL: removing needs no space): a
    /// failure to stage, sync or place it is said on stderr, never
    /// returned. Every subset of a commit is a sound store (see
    /// [`Store::commit`]), so the rest goes ahead.
    pub fn write_own_if_possible(&self, sub: &str, name: &str, content: &[u8], step: &'static str) {
        let dir = self.dir.join(sub);
        match self.stage(&dir, name, content, Apply::Rename, step) {
            Ok(()) => {
                if let Some(p) = self.pending.borrow_mut().last_mut() {
                    p.optional = true;
                }
            }
            Err(e) => optional_failed(&dir.join(name), &e),
        }
    }

    pub fn remove_own(&self, sub: &str, name: &str, step: &'static str) {
        self.stage_removal(&self.dir.join(sub), name, step);
    }

    pub fn remove_name(&self, name: &str, step: &'static str) {
        self.stage_removal(&self.dir, name, step);
    }

    /// The content goes to a fresh temporary file (O_EXCL|O_NOFOLLOW) in
    /// the store's tmp dir, to be placed at commit.
    fn stage(
        &self,
        dir: &Path,
        name: &str,
        content: &[u8],
        apply: Apply,
        step: &'static str,
    ) -> Result<(), StoreError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tmp = self.dir.join(TMP_DIR).join(format!(
            "{name}.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io_at(&tmp))?;
        if let Err(e) = f.write_all(content) {
            // a full disk: nothing is staged, and nothing is left behind
            let _ = fs::remove_file(&tmp);
            return Err(io_at(&tmp)(e));
        }
        self.pending.borrow_mut().push(Pending {
            tmp: Some((f, tmp)),
            target: dir.join(name),
            apply,
            step,
            optional: false,
        });
        Ok(())
    }

    fn stage_removal(&self, dir: &Path, name: &str, step: &'static str) {
        self.pending.borrow_mut().push(Pending {
            tmp: None,
            target: dir.join(name),
            apply: Apply::Remove,
            step,
            optional: false,
        });
    }

    /// Makes every staged change durable, in the order staged:
    /// 1. every temporary file is fsynced (the first sync commits the
    ///    filesystem's journal, the others find little left to do);
    /// 2. each change is applied: link, rename or unlink;
    /// 3. each directory changed is fsynced, once.
    ///
    /// A crash before 3 leaves any subset of the changes; each subset is a
    /// store both plugins read with no address held twice, since only the
    /// reservation files (placed with link, under the lock) decide who
    /// holds an address; a record without its reservation is retained, a
    /// reservation without its record is host-local's kind.
    pub fn commit(&self) -> Result<(), StoreError> {
        let mut pending = std::mem::take(&mut *self.pending.borrow_mut());
        let mut synced = Vec::with_capacity(pending.len());
        for p in pending.drain(..) {
            if let Some((f, path)) = &p.tmp
                && let Err(e) = f.sync_all()
            {
                if !p.optional {
                    return Err(io_at(path)(e));
                }
                optional_failed(&p.target, &io_at(path)(e));
                let _ = fs::remove_file(path);
                continue;
            }
            synced.push(p);
        }
        let mut dirs: Vec<&Path> = Vec::new();
        let mut first_error = None;
        for p in &synced {
            if let Err(e) = p.apply() {
                if p.optional {
                    optional_failed(&p.target, &e);
                    continue;
                }
                // apply the rest: each change stands alone (see above), and GC must free what it can
                first_error.get_or_insert(e);
                continue;
            }
            crash_point(p.step);
            let dir = p.target.parent().unwrap_or(&self.dir);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            sync_dir(dir)?;
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // staged but never committed (the command failed): nothing was placed
        for p in self.pending.get_mut().drain(..) {
            if let Some((_, tmp)) = p.tmp {
                let _ = fs::remove_file(tmp);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Apply {
    /// Create the name; fails if it exists.
    Link,
    /// Create or replace the name.
    Rename,
    Remove,
}

/// One staged change.
struct Pending {
    tmp: Option<(File, PathBuf)>,
    target: PathBuf,
    apply: Apply,
    /// The crash hook's name for the moment right after this change.
    step: &'static str,
    /// The command succeeds without it ([`Store::write_own_if_possible`]).
    optional: bool,
}

fn optional_failed(target: &Path, e: &StoreError) {
    eprintln!("edgevx-ipam: warning: cannot write {} ({e}); going on without it", target.display());
}

impl Pending {
    fn apply(&self) -> Result<(), StoreError> {
        let at = io_at(&self.target);
        match (&self.tmp, self.apply) {
            (Some((_, tmp)), Apply::Link) => {
                let linked = fs::hard_link(tmp, &self.target).map_err(at);
                let _ = fs::remove_file(tmp);
                linked
            }
            (Some((_, tmp)), Apply::Rename) => fs::rename(tmp, &self.target).map_err(at),
            (_, Apply::Remove) => match fs::remove_file(&self.target) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(e)),
                _ => Ok(()),
            },
            (None, _) => Ok(()),
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_at(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_store(tag: &str) -> (PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("edgevx-ipam-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = Store::open_locked(&dir).unwrap();
        (dir, s)
    }

    #[test]
    fn reserve_is_exclusive_and_in_host_locals_format() {
        let (dir, s) = tmp_store("excl");
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        s.reserve(ip, "c1", "eth0", "t").unwrap();
        assert!(s.reservations().unwrap().is_empty(), "nothing is placed before commit");
        s.commit().unwrap();
        assert!(s.is_taken(ip));
        s.reserve(ip, "c2", "eth0", "t").unwrap();
        assert!(s.commit().is_err(), "a link never replaces a reservation");
        assert_eq!(fs::read_to_string(dir.join("10.0.0.2")).unwrap(), "c1\r\neth0");
        s.reassign(ip, "c3", "eth0", "t").unwrap();
        s.commit().unwrap();
        assert!(s.reservations().unwrap()[&ip].is("c3", "eth0"));
        s.release(ip, "t");
        s.release(ip, "t");
        s.commit().unwrap();
        assert!(s.reservations().unwrap().is_empty());
        assert_eq!(fs::read_dir(dir.join(TMP_DIR)).unwrap().count(), 0, "no temporary file is left");
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn last_reserved_skips_what_it_cannot_read() {
        let (dir, s) = tmp_store("last");
        assert_eq!(s.last_reserved(0), None);
        s.set_last_reserved(0, "10.0.0.9".parse().unwrap(), "t").unwrap();
        s.commit().unwrap();
        assert_eq!(s.last_reserved(0), Some("10.0.0.9".parse().unwrap()));
        fs::write(dir.join("last_reserved_ip.1"), "").unwrap();
        assert_eq!(s.last_reserved(1), None);
        fs::write(dir.join("last_reserved_ip.2"), "banana").unwrap();
        assert_eq!(s.last_reserved(2), None, "a garbled hint restarts the walk");
        s.set_last_reserved(2, "10.0.0.3".parse().unwrap(), "t").unwrap();
        s.commit().unwrap();
        assert_eq!(s.last_reserved(2), Some("10.0.0.3".parse().unwrap()), "and the next reservation rewrites it");
        fs::create_dir(dir.join("last_reserved_ip.3")).unwrap();
        assert_eq!(s.last_reserved(3), None);
        s.set_last_reserved(3, "10.0.0.4".parse().unwrap(), "t").unwrap();
        s.commit().unwrap();
        assert!(dir.join("last_reserved_ip.3").is_dir(), "a directory is left alone and does not fail the commit");
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unreadable_reservation_is_taken_by_nobody() {
        let (dir, s) = tmp_store("unreadable");
        fs::create_dir(dir.join("10.0.0.4")).unwrap();
        fs::write(dir.join("10.0.0.5"), "c5\r\neth0").unwrap();
        fs::write(dir.join("stray"), "x").unwrap();
        let r = s.reservations().unwrap();
        assert_eq!(r.get(&"10.0.0.4".parse().unwrap()), Some(&Holder::Unreadable));
        assert!(r[&"10.0.0.5".parse().unwrap()].is("c5", "eth0"));
        assert_eq!(r.len(), 2, "{r:?}");
        let _ = fs::remove_dir_all(dir);
    }
}
