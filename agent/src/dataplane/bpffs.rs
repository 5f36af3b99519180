//! The bpffs directory the pins live in: `<bpffs>/v<SCHEMA_VERSION>/{maps,links,progs}`.
//! A new map layout bumps the version, so an upgrade never reuses a map it
//! cannot read. The bpffs itself belongs to the host (see [`NotBpffs`]).
use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use crate::gone;
use anyhow::{Context, Result};
use edgevx_common::SCHEMA_VERSION;

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The one bpffs layout: `<bpffs>/v<layout version>/` holding `links/`,
/// `progs/` and `maps/`, each pin named after its program or map. Every
/// other place (cleanup, retiring an older layout, status) reads it from
/// here.
#[derive(Clone, Debug)]
pub struct PinDir {
    pub root: PathBuf,
}

impl PinDir {
    /// Our layout version's directory under `bpffs`.
    pub fn new(bpffs: &Path) -> Self {
        PinDir { root: bpffs.join(format!("v{SCHEMA_VERSION}")) }
    }
    /// Another version's directory (`<bpffs>/v<N>`), read with the same layout.
    pub fn at(root: &Path) -> Self {
        PinDir { root: root.to_path_buf() }
    }
    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }
    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }
    pub fn progs(&self) -> PathBuf {
        self.root.join("progs")
    }
    pub fn link(&self, name: &str) -> PathBuf {
        self.links().join(name)
    }
    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs().join(name)
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }
    /// Removes the layout's directories once they are empty (a directory
    /// with a pin left in it stays, and says so to whoever looks).
    pub fn remove_empty_dirs(&self) {
        for dir in [self.links(), self.progs(), self.maps(), self.root.clone()] {
            let _ = fs::remove_dir(&dir);
        }
    }
    /// The layout versions pinned beside ours (`v<N>` directories), with their paths.
    fn versions(&self) -> Vec<(u32, PathBuf)> {
        let Some(parent) = self.root.parent() else { return Vec::new() };
        let Ok(entries) = fs::read_dir(parent) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.strip_prefix('v')?.parse::<u32>().ok()?;
                Some((v, e.path()))
            })
            .collect()
    }

    /// Pin directories of OLDER layout versions: the only ones an upgraded
    /// agent retires. A newer version's pins belong to a newer agent.
    pub fn other_versions(&self) -> Vec<PathBuf> {
        self.versions().into_iter().filter(|(v, _)| *v < SCHEMA_VERSION).map(|(_, p)| p).collect()
    }

    /// Pin directories of NEWER layout versions, newest first: a newer
    /// edgevx ran (or runs) here, and this one must not touch its dataplane.
    pub fn newer_versions(&self) -> Vec<(u32, PathBuf)> {
        let mut newer: Vec<_> = self.versions().into_iter().filter(|(v, _)| *v > SCHEMA_VERSION).collect();
        newer.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
        newer
    }

    pub fn create(&self) -> Result<()> {
        for d in [self.maps(), self.links(), self.progs()] {
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

/// A newer edgevx's pins under `--bpffs`: this (older) agent would tear
/// down or fight its dataplane, so `edgevx run` exits 2 before touching
/// anything.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "{} holds the pins of map layout v{found}, newer than this edgevx's v{ours}: a newer edgevx runs (or ran) on \
     this node. Refusing to start, so as not to tear down its dataplane; run the newer edgevx, or remove its \
     dataplane first with that version's `edgevx cleanup`",
    path.display()
)]
pub struct NewerVersion {
    pub path: PathBuf,
    pub found: u32,
    pub ours: u32,
}

/// Refuses to go on when a newer layout version is pinned beside ours.
pub fn no_newer_version(bpffs: &Path) -> Result<(), NewerVersion> {
    match PinDir::new(bpffs).newer_versions().into_iter().next() {
        Some((found, path)) => Err(NewerVersion { path, found, ours: SCHEMA_VERSION }),
        None => Ok(()),
    }
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

/// Removes a pin; one that is already gone is fine.
pub fn remove_pin(path: &Path) -> Result<()> {
    gone::removed(fs::remove_file(path)).with_context(|| format!("cannot remove pin {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_older_versions_are_others_to_retire_and_newer_ones_stop_us() {
        let d = std::env::temp_dir().join(format!("edgevx-unit-pins-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let pins = PinDir::new(&d);
        pins.create().unwrap();
        let (older, newer) = (d.join(format!("v{}", SCHEMA_VERSION - 1)), d.join(format!("v{}", SCHEMA_VERSION + 1)));
        for p in [&older, &newer, &d.join("vx"), &d.join("other")] {
            fs::create_dir_all(p).unwrap();
        }
        assert_eq!(pins.other_versions(), vec![older]);
        assert_eq!(pins.newer_versions(), vec![(SCHEMA_VERSION + 1, newer.clone())]);
        let e = no_newer_version(&d).unwrap_err();
        assert_eq!((e.found, e.ours), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        assert!(e.to_string().contains(&newer.display().to_string()), "{e}");
        fs::remove_dir_all(&newer).unwrap();
        assert!(no_newer_version(&d).is_ok());
        fs::remove_dir_all(d).unwrap();
    }
}
