//! What the DaemonSet's init containers put on the node, without `cp` (the
//! image is FROM scratch):
//!
//! - `edgevx-ipam install DIR`: this binary, at `DIR/edgevx-ipam`;
//! - `edgevx-ipam install-conf SRC DEST`: the CNI conflist, from the
//!   ConfigMap to `/etc/cni/net.d/` (flannel's `install-conf`, flannel#2466).
//!
//! Either is written beside its target under a name no one reads
//! (O_EXCL|O_NOFOLLOW), fsynced and renamed over the target, so a runtime
//! that runs the plugin or loads the conflist meanwhile gets the old file
//! or the new one, never a half-written one. `cp -f` truncates the target
//! and writes it in place: containerd watches /etc/cni/net.d and may load
//! the conflist between the two.
use std::{
    fs::{self, File, OpenOptions, Permissions},
    io,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use thiserror::Error;

pub const NAME: &str = "edgevx-ipam";

#[derive(Debug, Error)]
#[error("cannot install {target}: {what}: {source}")]
pub struct InstallError {
    target: PathBuf,
    what: &'static str,
    source: io::Error,
}

/// Copies this binary to `dir/edgevx-ipam`, mode 0755.
pub fn install(dir: &Path) -> Result<PathBuf, InstallError> {
    let target = dir.join(NAME);
    let mut from = File::open("/proc/self/exe").map_err(err(&target, "read /proc/self/exe"))?;
    replace(&mut from, &target, 0o755)?;
    Ok(target)
}

/// Copies the conflist `src` to `dest`, keeping `src`'s permission bits
/// (as flannel's install-conf does; a ConfigMap's file is 0644). A file
/// that is not JSON is refused, so a broken edit of the ConfigMap leaves
/// the node's working conflist in place.
pub fn install_conf(src: &Path, dest: &Path) -> Result<(), InstallError> {
    let e = |what| err(dest, what);
    let text = fs::read(src).map_err(e("read the source"))?;
    let mode = fs::metadata(src).map_err(e("stat the source"))?.permissions().mode() & 0o777;
    if let Err(j) = serde_json::from_slice::<serde_json::Value>(&text) {
        let not_json = io::Error::new(io::ErrorKind::InvalidData, format!("{} is not JSON: {j}", src.display()));
        return Err(e("check the source")(not_json));
    }
    replace(&mut text.as_slice(), dest, mode)
}

fn err(target: &Path, what: &'static str) -> impl FnOnce(io::Error) -> InstallError {
    let target = target.to_path_buf();
    move |source| InstallError { target, what, source }
}

/// Where the copy is written before the rename: hidden, in the target's
/// directory (rename(2) does not cross file systems), and ending in the
/// pid, never in `.conf`, `.conflist` or `.json`, the names libcni loads.
fn temporary(target: &Path) -> PathBuf {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}.{}", std::process::id()))
}

/// Writes `from` next to `target`, then renames it over `target`.
fn replace(from: &mut impl io::Read, target: &Path, mode: u32) -> Result<(), InstallError> {
    let e = |what| err(target, what);
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = temporary(target);
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
    };
    let mut to = match create() {
        // an init container is pid 1 (or close) at every start: a copy a
        // killed earlier run left has our name
        Err(x) if x.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(&tmp).map_err(e("remove a stale temporary copy"))?;
            create()
        }
        other => other,
    }
    .map_err(e("create the temporary copy"))?;
    // the mode exactly, whatever the umask
    let written = to
        .set_permissions(Permissions::from_mode(mode))
        .and_then(|_| io::copy(from, &mut to))
        .and_then(|_| to.sync_all());
    drop(to);
    if let Err(x) = written.and_then(|_| fs::rename(&tmp, target)) {
        let _ = fs::remove_file(&tmp);
        return Err(e("write the copy")(x));
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(e("sync the directory"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{
        os::unix::fs::MetadataExt,
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
    };

    use super::*;

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("edgevx-ipam-install-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    /// A conflist of `len` bytes, every byte of it `fill` but the JSON around.
    fn conflist(fill: char, len: usize) -> Vec<u8> {
        let pad: String = std::iter::repeat_n(fill, len.saturating_sub(16)).collect();
        format!("{{\"name\":\"{pad}\"}}").into_bytes()
    }

    #[test]
    fn a_reader_sees_the_old_conflist_or_the_new_one_never_a_part() {
        // big enough that a copy in place is caught half-written
        let d = Dir::new("reader");
        let (a, b) = (d.0.join("a.json"), d.0.join("b.json"));
        let (ca, cb) = (conflist('a', 1 << 18), conflist('b', 1 << 17));
        fs::write(&a, &ca).unwrap();
        fs::write(&b, &cb).unwrap();
        let dest = d.0.join("10-flannel.conflist");
        install_conf(&a, &dest).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dest, stop, ca, cb) = (dest.clone(), stop.clone(), ca.clone(), cb.clone());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let got = fs::read(&dest).unwrap();
                    assert!(got == ca || got == cb, "a reader saw {} bytes, neither conflist", got.len());
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..100 {
            install_conf(if i % 2 == 0 { &b } else { &a }, &dest).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join().expect("the reader saw a partial conflist");
        assert!(reads > 0);
    }

    #[test]
    fn the_conflist_is_renamed_into_place_with_the_sources_mode_and_no_copy_left() {
        let d = Dir::new("rename");
        let src = d.0.join("cni-conf.json");
        fs::write(&src, conflist('x', 100)).unwrap();
        fs::set_permissions(&src, Permissions::from_mode(0o640)).unwrap();
        let dest = d.0.join("10-flannel.conflist");
        fs::write(&dest, b"old").unwrap();
        fs::set_permissions(&dest, Permissions::from_mode(0o600)).unwrap();
        let before = fs::metadata(&dest).unwrap().ino();
        // a copy a killed run of the same pid left: replaced, not an error
        fs::write(temporary(&dest), b"half").unwrap();
        install_conf(&src, &dest).unwrap();
        let after = fs::metadata(&dest).unwrap();
        // cp -f would have kept the inode (and 0600)
        assert_ne!(after.ino(), before, "written in place, not renamed");
        assert_eq!(after.permissions().mode() & 0o777, 0o640);
        assert_eq!(fs::read(&dest).unwrap(), fs::read(&src).unwrap());
        assert_eq!(names(&d.0), ["10-flannel.conflist", "cni-conf.json"]);
    }

    #[test]
    fn a_source_that_is_not_json_leaves_the_conflist_alone() {
        let d = Dir::new("notjson");
        let (src, dest) = (d.0.join("cni-conf.json"), d.0.join("10-flannel.conflist"));
        fs::write(&src, b"{\"name\": ").unwrap();
        fs::write(&dest, b"{}").unwrap();
        let e = install_conf(&src, &dest).unwrap_err();
        assert!(e.to_string().contains("is not JSON"), "{e}");
        assert_eq!(fs::read(&dest).unwrap(), b"{}");
        assert_eq!(names(&d.0), ["10-flannel.conflist", "cni-conf.json"]);
    }

    #[test]
    fn the_temporary_name_is_hidden_and_never_one_libcni_loads() {
        let t = temporary(Path::new("/etc/cni/net.d/10-flannel.conflist"));
        assert_eq!(t.parent(), Some(Path::new("/etc/cni/net.d")));
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with('.'), "{name}");
        for ext in [".conf", ".conflist", ".json"] {
            assert!(!name.ends_with(ext), "{name}");
        }
    }

    #[test]
    fn the_binary_is_installed_executable() {
        let d = Dir::new("binary");
        let at = install(&d.0).unwrap();
        assert_eq!(fs::metadata(&at).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read(&at).unwrap(), fs::read("/proc/self/exe").unwrap());
        assert_eq!(names(&d.0), [NAME]);
    }
}
