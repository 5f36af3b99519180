//! `edgevx-ipam install DIR`: puts this binary at `DIR/edgevx-ipam`, for the
//! DaemonSet's init container (the image is FROM scratch: no `cp`).
//!
//! The copy is written beside the target (O_EXCL|O_NOFOLLOW), fsynced and
//! renamed over it, so a runtime that runs the plugin meanwhile execs the
//! old binary or the new one, never a half-written file.
use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use thiserror::Error;

pub const NAME: &str = "edgevx-ipam";

#[derive(Debug, Error)]
#[error("cannot install {NAME} into {dir}: {what}: {source}")]
pub struct InstallError {
    dir: PathBuf,
    what: &'static str,
    source: io::Error,
}

pub fn install(dir: &Path) -> Result<PathBuf, InstallError> {
    let err = |what| move |source| InstallError { dir: dir.to_path_buf(), what, source };
    let target = dir.join(NAME);
    let tmp = dir.join(format!(".{NAME}.{}", std::process::id()));
    let mut from = File::open("/proc/self/exe").map_err(err("read /proc/self/exe"))?;
    let mut to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(err("create the temporary copy"))?;
    let copied = io::copy(&mut from, &mut to).and_then(|_| to.sync_all());
    drop(to);
    if let Err(e) = copied.and_then(|_| fs::rename(&tmp, &target)) {
        let _ = fs::remove_file(&tmp);
        return Err(err("write the copy")(e));
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(err("sync the directory"))?;
    Ok(target)
}
