//! The bpffs directory the pins live in: `<bpffs>/v<SCHEMA_VERSION>/{maps,links,progs}`.
//! A new map layout bumps the version, so an upgrade never reuses a map it
//! cannot read. The bpffs itself belongs to the host (see [`NotBpffs`]).
use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use edgevx_common::SCHEMA_VERSION;

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Clone, Debug)]
pub struct PinDir {
    pub root: PathBuf,
}

impl PinDir {
    pub fn new(bpffs: &Path) -> Self {
        PinDir { root: bpffs.join(format!("v{SCHEMA_VERSION}")) }
    }
    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }
    pub fn link(&self, name: &str) -> PathBuf {
        self.root.join("links").join(name)
    }
    pub fn prog(&self, name: &str) -> PathBuf {
        self.root.join("progs").join(name)
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }
    /// Pin directories of other layout versions (`v<N>` beside ours).
    pub fn other_versions(&self) -> Vec<PathBuf> {
        let (Some(parent), Some(ours)) = (self.root.parent(), self.root.file_name()) else { return Vec::new() };
        let Ok(entries) = fs::read_dir(parent) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    n != ours && n.to_str().and_then(|n| n.strip_prefix('v')).is_some_and(|v| v.parse::<u32>().is_ok())
                })
            })
            .collect()
    }

    pub fn create(&self) -> Result<()> {
        for d in [self.maps(), self.root.join("links"), self.root.join("progs")] {
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        Ok(())
    }
}

pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0) && st.f_type as i64 == BPF_FS_MAGIC
}

/// `--bpffs` is not on a bpffs. edgevx never mounts one itself: that needs
/// CAP_SYS_ADMIN, and a mount made inside a container or a private mount
/// namespace would vanish with it, taking the pins along.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "--bpffs {}: {} is not a bpffs. The host must mount a bpffs there (systemd mounts /sys/fs/bpf at boot; \
     otherwise `mount -t bpf bpf /sys/fs/bpf`), and a container gets it as a hostPath",
    path.display(),
    found.display()
)]
pub struct NotBpffs {
    pub path: PathBuf,
    /// The directory that was checked: `path`, or its nearest existing parent.
    pub found: PathBuf,
}

/// Whether `path` lies on a bpffs: itself, or the nearest parent that
/// exists (the pin directories below a bpffs are created as needed).
pub fn on_bpffs(path: &Path) -> Result<(), NotBpffs> {
    let found = path.ancestors().find(|d| d.exists()).unwrap_or(path);
    if is_bpffs(found) { Ok(()) } else { Err(NotBpffs { path: path.to_path_buf(), found: found.to_path_buf() }) }
}

/// Makes sure `path` is on the host's bpffs and creates it there. It never
/// mounts one (see [`NotBpffs`]); `edgevx run` checks this before it
/// changes anything on the host, so this only fails if the mount went away.
pub fn ensure_dir_on_bpffs(path: &Path) -> Result<()> {
    on_bpffs(path)?;
    fs::create_dir_all(path).with_context(|| format!("cannot create {}", path.display()))
}
