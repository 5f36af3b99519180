//! The bpffs directory the pins live in: `<bpffs>/v<SCHEMA_VERSION>/{maps,links,progs}`.
//! A new map layout bumps the version, so an upgrade never reuses a map it
//! cannot read.
use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
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

/// Makes sure `path` (or a parent) is a bpffs; mounts one at `path` if not.
pub fn ensure_mounted(path: &Path) -> Result<()> {
    let mut p = Some(path);
    while let Some(dir) = p {
        if dir.exists() {
            if is_bpffs(dir) {
                return Ok(());
            }
            break;
        }
        p = dir.parent();
    }
    fs::create_dir_all(path).with_context(|| format!("cannot create {}", path.display()))?;
    let target = CString::new(path.as_os_str().as_encoded_bytes()).context("bpffs path has a NUL byte")?;
    let fstype = c"bpf";
    // SAFETY: plain mount(2) with valid C strings.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        bail!("cannot mount bpffs at {}: {}", path.display(), std::io::Error::last_os_error());
    }
    Ok(())
}
