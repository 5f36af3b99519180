//! The state dir: what must survive a reboot (the VTEP MAC) and what
//! `edgevx status` reads when the agent is gone.
//!
//! Every write is atomic (a temp file, fsync, rename, fsync of the
//! directory) and never follows a symlink: the agent runs as root, so a
//! link planted where a file or its temp file goes would redirect a root
//! write. Temp files are created with `O_CREAT|O_EXCL|O_NOFOLLOW` under
//! random names, in a directory owned by us (or root) that nobody else may
//! write; a symlink (or anything but a regular file) where a state file or
//! subnet.env should be is refused by name. The state dir is created 0700;
//! one we own with a looser mode (made by an older edgevx) is tightened to
//! 0700, one owned by another user is refused.
use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::gone::Gone;
use crate::{family::Family, mac::VtepMac, peer::Peer};

/// The saved MAC of `flannel.<VNI>`; code of one family takes [`mac_file`].
pub const MAC_FILE: &str = "vtep-mac";
/// Twin of [`MAC_FILE`] because each family's VTEP MAC is a file of its
/// own on disk, under a name state dirs of earlier releases hold and must
/// still load; code that lists every state file (cleanup, the owner
/// stamp) names both, code of one family takes [`mac_file`]. The MAC of
/// `flannel-v6.<VNI>` (dual-stack), kept apart from the IPv4 one as
/// flannel keeps `backend-v6-data` apart from `backend-data`.
pub const MAC6_FILE: &str = "vtep-mac6";
pub const PEERS_FILE: &str = "peers.json";
pub const AGENT_FILE: &str = "agent.json";

/// The mode of the state dir: only the agent reads what it saved.
pub const STATE_DIR_MODE: u32 = 0o700;
/// State files: the agent's alone.
pub const STATE_FILE_MODE: u32 = 0o600;

/// Why a state file (or subnet.env) was not read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{} is a symlink; refusing to follow it (remove it: edgevx writes a regular file there)", .0.display())]
    Symlink(PathBuf),
    #[error("{} is not a regular file; refusing to replace it", .0.display())]
    NotAFile(PathBuf),
    #[error("{} is a symlink, not a directory; refusing to write below it", .0.display())]
    SymlinkedDir(PathBuf),
    #[error("{} is not a directory", .0.display())]
    NotADir(PathBuf),
    #[error("{} belongs to uid {owner}, not to us or root; refusing to write in it", path.display())]
    ForeignDir { path: PathBuf, owner: u32 },
    #[error("{} is writable by group or others (mode {mode:o}); refusing to write in it", path.display())]
    OpenDir { path: PathBuf, mode: u32 },
    #[error("cannot {what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: io::Error },
}

/// The file the VTEP MAC of the family `N` is saved in: [`MAC_FILE`] or
/// [`MAC6_FILE`].
pub fn mac_file<N: Family>() -> &'static str {
    if N::IPV6 { MAC6_FILE } else { MAC_FILE }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateError + use<> {
    let path = path.to_path_buf();
    move |source| StateError::Io { what, path, source }
}

/// Refuses a symlink or a non-file at `path`; a missing file is fine.
pub fn check_target(path: &Path) -> Result<(), StateError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(StateError::Symlink(path.to_path_buf())),
        Ok(m) if !m.is_file() => Err(StateError::NotAFile(path.to_path_buf())),
        Ok(_) => Ok(()),
        Err(e) if e.is_gone() => Ok(()),
        Err(e) => Err(io_err("inspect", path)(e)),
    }
}

/// Checks that `dir` is a real directory, ours or root's, writable by
/// nobody else; so no one else can plant or swap a file in it.
pub fn check_dir(dir: &Path) -> Result<(), StateError> {
    let m = fs::symlink_metadata(dir).map_err(io_err("inspect", dir))?;
    if m.file_type().is_symlink() {
        return Err(StateError::SymlinkedDir(dir.to_path_buf()));
    }
    if !m.is_dir() {
        return Err(StateError::NotADir(dir.to_path_buf()));
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me && m.uid() != 0 {
        return Err(StateError::ForeignDir { path: dir.to_path_buf(), owner: m.uid() });
    }
    if m.mode() & 0o022 != 0 {
        return Err(StateError::OpenDir { path: dir.to_path_buf(), mode: m.mode() & 0o7777 });
    }
    Ok(())
}

/// Creates `dir` (and missing parents) with `mode` if it does not exist,
/// then checks it with [`check_dir`].
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<(), StateError> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.is_gone() => {
            DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(io_err("create", dir))?;
            // the umask may have taken bits away; this sets exactly `mode`
            fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", dir))?;
        }
        Err(e) => return Err(io_err("inspect", dir)(e)),
        Ok(_) => {}
    }
    check_dir(dir)
}

/// A name nobody can guess: `.<name>.<16 hex digits>.tmp`.
fn temp_name(name: &str) -> Result<String, StateError> {
    let mut b = [0u8; 8];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(io_err("read", Path::new("/dev/urandom")))?;
    Ok(format!(".{name}.{:016x}.tmp", u64::from_ne_bytes(b)))
}

/// Writes `data` to `path` (mode `mode`) so readers see the old or the new
/// file, never a part; never through a symlink (see the module doc). The
/// directory must exist and pass [`check_dir`].
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), StateError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    check_dir(dir)?;
    check_target(path)?;
    let tmp = dir.join(temp_name(&name)?);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true) // O_CREAT|O_EXCL
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let result = (|| {
        f.write_all(data).map_err(io_err("write", &tmp))?;
        // the umask may have taken bits away (subnet.env must stay readable)
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        // a link planted since the first look would be replaced, not followed;
        // this second look still names it rather than silently replacing it
        check_target(path)?;
        fs::rename(&tmp, path).map_err(io_err("rename a temp file over", path))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("fsync", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads `path` without following a symlink; `None` if it does not exist.
pub fn read_nofollow(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    // O_NONBLOCK: a FIFO planted there must not hang the open (no effect on a regular file)
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut f = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(StateError::Symlink(path.to_path_buf())),
        Err(e) => return Err(io_err("open", path)(e)),
    };
    if !f.metadata().map_err(io_err("inspect", path))?.is_file() {
        return Err(StateError::NotAFile(path.to_path_buf()));
    }
    let mut out = Vec::new();
    f.read_to_end(&mut out).map_err(io_err("read", path))?;
    Ok(Some(out))
}

/// What the running agent configured, for `edgevx status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentRecord {
    pub node: String,
    pub iface: String,
    /// The IPv4 VTEP; `None` in an IPv6-only network. Flattened, so the
    /// records of earlier versions load.
    #[serde(flatten)]
    pub v4: Option<Record4>,
    pub vni: u32,
    pub port: u16,
    /// The MTU in subnet.env: the IPv4 VTEP's, in an IPv6-only network the
    /// IPv6 VTEP's.
    pub mtu: u32,
    /// `--bypass-netfilter` (older records called it fast delivery).
    #[serde(alias = "fast_delivery")]
    pub bypass_netfilter: bool,
    /// The fast path: "on", or why not ("off (--fast-path=off)",
    /// "unavailable: ..."); empty in records of earlier versions.
    #[serde(default)]
    pub fast_path: String,
    /// `--ip-masq`: FLANNEL_IPMASQ=true and our masquerade chain.
    #[serde(default)]
    pub ip_masq: bool,
    /// How the programs are attached (records older than the fallback: TCX).
    #[serde(default)]
    pub attach: crate::dataplane::loader::AttachMode,
    /// The pod bridge the bridge program goes on.
    #[serde(default = "default_pod_bridge")]
    pub pod_bridge: String,
    pub subnet_file: PathBuf,
    pub pid: u32,
    /// The IPv6 VTEP of a dual-stack network.
    #[serde(default)]
    pub v6: Option<Record6>,
    /// `--xdp-judge` (records older than the XDP judge: auto).
    #[serde(default)]
    pub xdp_judge: crate::dataplane::xdp::XdpChoice,
}

/// What the IPv6 VTEP was set up with (in the agent record, for `edgevx
/// status` and cleanup). Twin of [`Record4`] because the record on disk
/// has two shapes that earlier releases wrote and must still load: the
/// IPv4 VTEP's fields flattened into the record under their first names,
/// the IPv6 VTEP an object of its own with its MTU. In memory, the agent
/// reads both through one view per family (`run/node/side.rs`, `Vtep`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record6 {
    pub device: String,
    pub mac: VtepMac,
    pub public_ip: Ipv6Addr,
    pub subnet: Ipv6Net,
    pub network: Ipv6Net,
    pub mtu: u32,
}

/// What the IPv4 VTEP (`flannel.<VNI>`) was set up with. A twin of
/// [`Record6`] for the files on disk: its fields are flattened into the
/// agent record under the names earlier versions wrote (`vtep_device`,
/// `vtep_mac`), so records from before dual-stack still load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record4 {
    pub vtep_device: String,
    pub vtep_mac: VtepMac,
    pub public_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub network: Ipv4Net,
}

fn default_pod_bridge() -> String {
    "cni0".into()
}

#[derive(Clone, Debug)]
pub struct StateDir(pub PathBuf);

impl StateDir {
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// What `edgevx run` checks before it changes anything: the state dir,
    /// if it exists, is a real directory that is ours (or root's). Nothing
    /// is created or changed here; [`StateDir::ensure`] does that later.
    pub fn check(&self) -> Result<(), StateError> {
        match fs::symlink_metadata(&self.0) {
            Err(e) if e.is_gone() => Ok(()),
            Err(e) => Err(io_err("inspect", &self.0)(e)),
            Ok(m) if m.file_type().is_symlink() => Err(StateError::SymlinkedDir(self.0.clone())),
            Ok(m) if !m.is_dir() => Err(StateError::NotADir(self.0.clone())),
            // SAFETY: geteuid cannot fail.
            Ok(m) if m.uid() != unsafe { libc::geteuid() } && m.uid() != 0 => {
                Err(StateError::ForeignDir { path: self.0.clone(), owner: m.uid() })
            }
            Ok(_) => Ok(()),
        }
    }

    /// Creates the state dir with mode 0700, or tightens one of ours that
    /// an older edgevx made with a looser mode (every file in it is opened
    /// without following links, so what may have been planted is refused).
    pub fn ensure(&self) -> Result<(), StateError> {
        self.check()?;
        if let Ok(m) = fs::symlink_metadata(&self.0)
            && m.mode() & 0o077 != 0
        {
            warn!(dir = %self.0.display(), mode = format!("{:o}", m.mode() & 0o7777), "tightening the state dir to 0700");
            fs::set_permissions(&self.0, fs::Permissions::from_mode(STATE_DIR_MODE))
                .map_err(io_err("chmod", &self.0))?;
        }
        ensure_dir(&self.0, STATE_DIR_MODE)
    }

    /// Writes state file `name` atomically, never through a symlink.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), StateError> {
        self.ensure()?;
        write_atomic(&self.path(name), data, STATE_FILE_MODE)
    }

    /// Reads state file `name`, refusing a symlink; `None` if it is missing.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        read_nofollow(&self.path(name))
    }

    /// The saved VTEP MAC. A damaged file is an error, not "no MAC": a
    /// silent new MAC is the outage edgevx exists to prevent.
    /// The saved MAC in `file` (a family's [`mac_file`]).
    pub fn load_mac(&self, file: &str) -> Result<Option<VtepMac>> {
        let path = self.path(file);
        let Some(bytes) = self.read(file)? else { return Ok(None) };
        String::from_utf8_lossy(&bytes)
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("saved VTEP MAC in {} is damaged", path.display()))
    }

    pub fn save_mac(&self, file: &str, mac: VtepMac) -> Result<()> {
        Ok(self.write(file, format!("{mac}\n").as_bytes())?)
    }

    /// The peer list for `status` (see `records.rs`: best effort).
    pub fn load_peers(&self) -> Result<Vec<Peer>> {
        self.load_record(PEERS_FILE).map(Option::unwrap_or_default)
    }

    /// `false` when neither the state dir nor /run took it (said once).
    pub fn save_peers<'a>(&self, peers: impl Iterator<Item = &'a Peer>) -> bool {
        let list: Vec<&Peer> = peers.collect();
        self.save_record(PEERS_FILE, &list)
    }

    /// The last bring-up's record, for `status`, cleanup and the next start.
    pub fn load_agent(&self) -> Result<Option<AgentRecord>> {
        self.load_record(AGENT_FILE)
    }

    /// `false` when neither the state dir nor /run took it (said once).
    pub fn save_agent(&self, rec: &AgentRecord) -> bool {
        self.save_record(AGENT_FILE, rec)
    }

    pub(crate) fn load_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Result<Option<T>> {
        let path = self.path(name);
        let Some(bytes) = self.read(name)? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).with_context(|| format!("{} is damaged", path.display()))
    }

    pub(crate) fn save_json<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        let mut data = serde_json::to_vec_pretty(value).context("cannot encode state")?;
        data.push(b'\n');
        Ok(self.write(name, &data)?)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    pub fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("edgevx-unit-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = temp_dir("atomic");
        ensure_dir(&d, 0o755).unwrap();
        let f = d.join("x");
        write_atomic(&f, b"one", 0o644).unwrap();
        write_atomic(&f, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(mode(&f), 0o644);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn temp_names_cannot_be_guessed() {
        let (a, b) = (temp_name("x").unwrap(), temp_name("x").unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with(".x.") && a.ends_with(".tmp") && a.len() == ".x.".len() + 16 + ".tmp".len(), "{a}");
    }

    #[test]
    fn a_symlink_where_a_file_goes_is_refused_and_its_target_untouched() {
        let d = temp_dir("link");
        let s = StateDir(d.clone());
        s.ensure().unwrap();
        let victim = d.join("victim");
        fs::write(&victim, "precious").unwrap();
        symlink(&victim, s.path(MAC_FILE)).unwrap();
        let e = s.save_mac(MAC_FILE, "02:00:00:00:00:01".parse().unwrap()).unwrap_err();
        let StateError::Symlink(p) = e.downcast_ref::<StateError>().unwrap() else { panic!("{e:#}") };
        assert_eq!(p, &s.path(MAC_FILE));
        assert!(e.to_string().contains(&s.path(MAC_FILE).display().to_string()), "{e}");
        let e = s.load_mac(MAC_FILE).unwrap_err();
        assert!(matches!(e.downcast_ref::<StateError>(), Some(StateError::Symlink(_))), "{e:#}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        // a dangling link, where the file would be created, is refused too
        symlink(d.join("nowhere"), s.path(PEERS_FILE)).unwrap();
        assert!(write_atomic(&s.path(PEERS_FILE), b"[]", 0o600).is_err());
        assert!(!d.join("nowhere").exists());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_directory_where_a_file_goes_is_refused() {
        let d = temp_dir("notfile");
        let s = StateDir(d.clone());
        fs::create_dir_all(s.path(AGENT_FILE)).unwrap();
        let e = write_atomic(&s.path(AGENT_FILE), b"{}", 0o600).unwrap_err();
        assert!(matches!(e, StateError::NotAFile(_)), "{e}");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn state_dir_is_created_0700_and_a_loose_one_of_ours_is_tightened() {
        let d = temp_dir("mode");
        let s = StateDir(d.join("state"));
        s.save_mac(MAC_FILE, "02:00:00:00:00:01".parse().unwrap()).unwrap();
        assert_eq!(mode(&s.0), 0o700);
        assert_eq!(mode(&s.path(MAC_FILE)), 0o600);
        fs::set_permissions(&s.0, fs::Permissions::from_mode(0o777)).unwrap();
        s.save_mac(MAC_FILE, "02:00:00:00:00:02".parse().unwrap()).unwrap();
        assert_eq!(mode(&s.0), 0o700);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_symlinked_state_dir_or_an_open_directory_is_refused() {
        let d = temp_dir("dirs");
        fs::create_dir_all(d.join("real")).unwrap();
        symlink(d.join("real"), d.join("state")).unwrap();
        let e = StateDir(d.join("state")).check().unwrap_err();
        assert!(matches!(e, StateError::SymlinkedDir(_)), "{e}");
        // subnet.env's directory is not ours to tighten: a world-writable one is refused
        let open = d.join("run-flannel");
        fs::create_dir_all(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = write_atomic(&open.join("subnet.env"), b"", 0o644).unwrap_err();
        assert!(matches!(e, StateError::OpenDir { .. }), "{e}");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_fifo_where_a_file_goes_is_refused_without_hanging() {
        let d = temp_dir("fifo");
        let s = StateDir(d.clone());
        s.ensure().unwrap();
        let c = std::ffi::CString::new(s.path(MAC_FILE).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = s.load_mac(MAC_FILE).unwrap_err();
        assert!(matches!(e.downcast_ref::<StateError>(), Some(StateError::NotAFile(_))), "{e:#}");
        assert!(matches!(check_target(&s.path(MAC_FILE)), Err(StateError::NotAFile(_))));
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn damaged_mac_file_is_an_error() {
        let d = temp_dir("mac");
        let s = StateDir(d.clone());
        assert_eq!(s.load_mac(MAC_FILE).unwrap(), None);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(MAC_FILE), "not a mac").unwrap();
        assert!(s.load_mac(MAC_FILE).is_err());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_ipv6_mac_has_its_own_file() {
        let d = temp_dir("mac6");
        let s = StateDir(d.clone());
        s.ensure().unwrap();
        let (a, b): (VtepMac, VtepMac) = ("02:00:00:00:00:04".parse().unwrap(), "02:00:00:00:00:06".parse().unwrap());
        s.save_mac(MAC_FILE, a).unwrap();
        assert_eq!(s.load_mac(MAC6_FILE).unwrap(), None);
        s.save_mac(MAC6_FILE, b).unwrap();
        assert_eq!((s.load_mac(MAC_FILE).unwrap(), s.load_mac(MAC6_FILE).unwrap()), (Some(a), Some(b)));
        assert_eq!(fs::read_to_string(d.join(MAC6_FILE)).unwrap(), "02:00:00:00:00:06\n");
        fs::write(d.join(MAC6_FILE), "not a mac").unwrap();
        let e = s.load_mac(MAC6_FILE).unwrap_err();
        assert!(format!("{e:#}").contains(MAC6_FILE), "{e:#}");
        // the names on disk: state dirs of earlier releases hold them
        assert_eq!((mac_file::<Ipv4Net>(), mac_file::<Ipv6Net>()), ("vtep-mac", "vtep-mac6"));
        fs::remove_dir_all(d).unwrap();
    }
}
