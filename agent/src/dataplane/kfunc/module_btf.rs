//! An fd to a loaded kernel module's BTF object (`nf_conntrack`), for
//! `BPF_PROG_LOAD`'s `fd_array`: a kfunc call into a module names the
//! module's BTF by its index there. aya 0.16 walks no BTF objects, so this
//! asks bpf(2) directly: every BTF id in turn (`BPF_BTF_GET_NEXT_ID`), an fd
//! to each (`BPF_BTF_GET_FD_BY_ID`), and its name (`BPF_OBJ_GET_INFO_BY_FD`).
//! `bpftool btf list` shows the same objects.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result, bail};

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
const BPF_BTF_GET_NEXT_ID: libc::c_long = 23;

/// `struct bpf_btf_info` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
    name: u64,
    name_len: u32,
    kernel_btf: u32,
}

/// bpf(2) with `attr` (large enough for every command used here).
fn bpf(cmd: libc::c_long, attr: &mut [u32; 8]) -> std::io::Result<libc::c_long> {
    // SAFETY: the kernel reads and writes at most size_of_val(attr) bytes of attr.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(rc) }
}

/// An fd to the BTF object of kernel module `module` (loaded, with BTF).
pub fn fd_of(module: &str) -> Result<OwnedFd> {
    let mut id = 0u32;
    loop {
        let mut attr = [0u32; 8];
        attr[0] = id; // start_id; the next id comes back in next_id
        match bpf(BPF_BTF_GET_NEXT_ID, &mut attr) {
            Ok(_) => id = attr[1],
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                bail!("the kernel has no BTF object named {module} (is the module loaded?)")
            }
            Err(e) => return Err(e).context("BPF_BTF_GET_NEXT_ID"),
        }
        let mut attr = [0u32; 8];
        attr[0] = id;
        let fd = match bpf(BPF_BTF_GET_FD_BY_ID, &mut attr) {
            // SAFETY: a new fd the kernel just gave us.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(i32::try_from(fd)?) },
            // unloaded between the two calls (a BPF program's BTF, say)
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e).with_context(|| format!("BPF_BTF_GET_FD_BY_ID {id}")),
        };
        if name_of(&fd).with_context(|| format!("cannot read BTF object {id}"))?.as_deref() == Some(module) {
            return Ok(fd);
        }
    }
}

/// The name of a kernel BTF object (`vmlinux`, a module's); `None` for a
/// program's BTF.
fn name_of(fd: &OwnedFd) -> Result<Option<String>> {
    let mut name = [0u8; 64];
    let mut info = BtfInfo { name: name.as_mut_ptr() as u64, name_len: name.len() as u32, ..Default::default() };
    let info_ptr = &raw mut info as u64;
    // union bpf_attr.info: bpf_fd, info_len, info (u64)
    let mut attr = [0u32; 8];
    attr[0] = u32::try_from(fd.as_raw_fd())?;
    attr[1] = std::mem::size_of::<BtfInfo>() as u32;
    attr[2] = info_ptr as u32;
    attr[3] = (info_ptr >> 32) as u32;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).context("BPF_OBJ_GET_INFO_BY_FD")?;
    if info.kernel_btf == 0 {
        return Ok(None);
    }
    let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    Ok(Some(String::from_utf8_lossy(&name[..len]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs CAP_SYS_ADMIN (the e2e tests run as root; a plain `cargo test`
    /// may not): vmlinux's own BTF object is always there to be found.
    #[test]
    fn vmlinux_is_found_and_a_missing_module_is_named() {
        match fd_of("vmlinux") {
            Ok(fd) => assert_eq!(name_of(&fd).unwrap().as_deref(), Some("vmlinux")),
            Err(e) if format!("{e:#}").contains("Operation not permitted") => return,
            Err(e) => panic!("vmlinux's BTF object: {e:#}"),
        }
        let e = fd_of("no_such_module_edgevx").unwrap_err();
        assert!(format!("{e:#}").contains("no BTF object named no_such_module_edgevx"), "{e:#}");
    }
}
