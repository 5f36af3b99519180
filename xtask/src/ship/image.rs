//! `cargo xtask image [--arch amd64|arm64|all]`: the OCI image deploy/base/daemonset.yaml runs.
//!
//! The image is built FROM scratch with buildah (vfs storage driver, chroot
//! isolation), in a store of its own under `target/image/` that is removed
//! afterwards, so nothing outside `target/` changes. It holds exactly what [`contents`] lists, and
//! is written as an OCI archive, `target/image/edgevx-<version>-<arch>.oci.tar`,
//! whose image is named [`name`]: the name deploy/base/daemonset.yaml pins.
use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    build,
    deps::{packages, sysroot, toolchain},
    exec,
};

/// Where the image is pushed; deploy/base/daemonset.yaml names `<REPOSITORY>:<VERSION>`.
pub const REPOSITORY: &str = "ghcr.io/edgevx/edgevx";
/// The workspace version: the image's tag and its `org.opencontainers.image.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The image's name, as the archive and the DaemonSet carry it.
pub fn name() -> String {
    format!("{REPOSITORY}:{VERSION}")
}

/// The CPU architectures an image can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// This machine's architecture, if an image can be built for it.
    pub fn host() -> Result<Self> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Arch::Amd64),
            "aarch64" => Ok(Arch::Arm64),
            other => bail!("no image architecture for this machine's {other}"),
        }
    }

    /// The OCI (and Debian) name.
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target of the static agent.
    fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-musl",
            Arch::Arm64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The Debian multiarch directory name (`/usr/lib/<this>/`).
    fn multiarch(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// The dynamic loader Debian's programs name (PT_INTERP).
    fn loader(self) -> &'static str {
        match self {
            Arch::Amd64 => "/lib64/ld-linux-x86-64.so.2",
            Arch::Arm64 => "/lib/ld-linux-aarch64.so.1",
        }
    }

    /// qemu-user for this architecture (Debian's qemu-user-static).
    pub fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-x86_64-static",
            Arch::Arm64 => "qemu-aarch64-static",
        }
    }

    /// The environment of the static (musl) build of the agent and
    /// edgevx-ipam: the C compiler for ring and psm and, across
    /// architectures, the linker. Natively Debian's `musl-gcc`
    /// (musl-tools); for arm64 on x86_64 Debian's `aarch64-linux-gnu-gcc`,
    /// which compiles ring and links the static musl binary (rustc brings
    /// musl's crt and libc for the target itself).
    pub fn musl_env(self) -> Result<Vec<(&'static str, &'static str)>> {
        Ok(match (self, Arch::host()?) {
            (Arch::Amd64, Arch::Amd64) => vec![("CC_x86_64_unknown_linux_musl", "musl-gcc")],
            (Arch::Arm64, Arch::Arm64) => vec![("CC_aarch64_unknown_linux_musl", "musl-gcc")],
            (Arch::Arm64, Arch::Amd64) => vec![
                ("CC_aarch64_unknown_linux_musl", "aarch64-linux-gnu-gcc"),
                ("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER", "aarch64-linux-gnu-gcc"),
            ],
            (Arch::Amd64, Arch::Arm64) => bail!("building the amd64 image on an arm64 machine is not supported"),
        })
    }
}

/// Where the image's Debian programs and libraries come from: this
/// machine's own root for its own architecture, Debian's packages of the
/// other unpacked into the cache ([`sysroot`]) for another.
struct Origin {
    arch: Arch,
    root: PathBuf,
    native: bool,
}

impl Origin {
    fn of(arch: Arch) -> Result<Self> {
        if arch == Arch::host()? {
            Ok(Origin { arch, root: PathBuf::from("/"), native: true })
        } else {
            packages::ensure_cross()?;
            Ok(Origin { arch, root: sysroot::ensure(arch.oci())?, native: false })
        }
    }

    /// `path` (absolute, as on a node) in this origin.
    fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The shared libraries and the loader that `program` (a path as on a
    /// node) needs, found in `root`: ldd natively; the program's own
    /// loader's `--list` under qemu-user for another architecture.
    fn libraries(&self, root: &Path, program: &str) -> Result<Vec<PathBuf>> {
        let out = if self.native && root == Path::new("/") {
            exec::output(Command::new("ldd").arg(program))
        } else {
            let loader = root.join(self.arch.loader().trim_start_matches('/'));
            exec::output(Command::new(self.arch.qemu()).arg("-L").arg(root).arg(loader).arg("--list").arg(program))
        };
        let libs = parse_ldd(&out.with_context(|| format!("listing the libraries of {program}"))?)
            .with_context(|| format!("the libraries of {program} in {}", root.display()))?;
        // the loader, listed for a shared object, is named as it was started: under `root`
        Ok(libs.into_iter().map(|p| p.strip_prefix(root).map_or(p.clone(), |rel| Path::new("/").join(rel))).collect())
    }
}

/// Where a thing in the image comes from.
enum Source {
    /// The static (musl) edgevx built for the image's architecture.
    Agent,
    /// The static (musl) edgevx-ipam, which the DaemonSet's init container
    /// copies to the node's CNI plugin directory.
    Ipam,
    /// A dynamically linked program of the host's, with the shared libraries
    /// and the loader that `ldd` names for it.
    Program(String),
    /// Every shared object in a directory of the host's (loaded with dlopen,
    /// which ldd cannot see), with the libraries ldd names for each.
    Plugins(String),
    /// A plain file of the host's.
    File(String),
    /// A symbolic link to this target.
    Link(&'static str),
}

/// One entry of the image, and the reason it is there.
struct Item {
    from: Source,
    to: String,
    why: &'static str,
}

/// Everything the image holds, in one place. Nothing else goes in, except
/// the shared libraries and the loader ldd names for the programs here.
fn contents(arch: Arch) -> Vec<Item> {
    let xtables = format!("/usr/lib/{}/xtables", arch.multiarch());
    vec![
        Item { from: Source::Agent, to: "/usr/local/bin/edgevx".into(), why: "the agent, statically linked (musl)" },
        Item {
            from: Source::Ipam,
            to: "/usr/local/bin/edgevx-ipam".into(),
            why: "the CNI IPAM plugin (musl), installed on the node by the DaemonSet's init container",
        },
        Item {
            from: Source::Program("/usr/sbin/xtables-nft-multi".into()),
            to: "/usr/sbin/xtables-nft-multi".into(),
            why: "iptables (nf_tables backend): the agent runs `iptables` for its --ip-masq and forward rules",
        },
        Item {
            from: Source::Link("xtables-nft-multi"),
            to: "/usr/sbin/iptables".into(),
            why: "the name the agent runs; xtables-nft-multi acts as the program its argv[0] names",
        },
        Item {
            from: Source::Link("xtables-nft-multi"),
            to: "/usr/sbin/ip6tables".into(),
            why: "the name the agent runs for the IPv6 rules of a dual-stack network (EnableIPv6)",
        },
        Item {
            from: Source::Link("xtables-nft-multi"),
            to: "/usr/sbin/iptables-restore".into(),
            why: "the agent writes its chains as one atomic `iptables-restore --noflush` batch per table",
        },
        Item {
            from: Source::Link("xtables-nft-multi"),
            to: "/usr/sbin/ip6tables-restore".into(),
            why: "the same for the IPv6 chains of a dual-stack network",
        },
        Item {
            from: Source::Plugins(xtables.clone()),
            to: xtables,
            why: "iptables' matches and targets (-m mark, -m comment, MASQUERADE), and every one that other \
                  components' rules use: iptables-nft decodes all the rules of a chain it checks, and the agent \
                  checks its jumps in POSTROUTING and FORWARD, which kube-proxy, CNI plugins and Docker share",
        },
        Item {
            from: Source::Program("/usr/sbin/nft".into()),
            to: "/usr/sbin/nft".into(),
            why: "`nft list table ip kube-proxy`: how the agent finds kube-proxy's nftables mode (the \
                  --bypass-netfilter warning)",
        },
        Item {
            from: Source::File("/etc/protocols".into()),
            to: "/etc/protocols".into(),
            why: "iptables reads protocol names and numbers there (`-p tcp` in other components' rules)",
        },
    ]
}

/// The image's configuration, beside its contents.
const PATH_ENV: &str = "PATH=/usr/local/bin:/usr/sbin:/usr/bin";
const ENTRYPOINT: &str = r#"["/usr/local/bin/edgevx"]"#;
const CMD: &str = r#"["run"]"#;

/// The image's directory: `target/image`.
pub fn dir() -> PathBuf {
    exec::workspace_root().join("target/image")
}

/// The archive `cargo xtask image --arch <arch>` writes.
pub fn archive(arch: Arch) -> PathBuf {
    dir().join(format!("edgevx-{VERSION}-{}.oci.tar", arch.oci()))
}

/// `cargo xtask image`: builds the archive for `arch`; returns its path.
pub fn build(arch: Arch) -> Result<PathBuf> {
    packages::ensure_image()?;
    let origin = Origin::of(arch)?;
    let (agent, ipam) = binaries(arch)?;

    // the work directories are this run's own, so two builds do not collide
    let dir = dir();
    let work = dir.join(format!("work-{}", std::process::id()));
    let rootfs = work.join(format!("rootfs-{}", arch.oci()));
    let archive = archive(arch);
    let partial = work.join("image.oci.tar");
    let built = stage(&origin, &agent, &ipam, &rootfs).and_then(|staged| {
        if !origin.native {
            check_foreign(&origin, &rootfs)?;
        }
        commit(&origin, &rootfs, &work.join("buildah"), &partial)?;
        fs::rename(&partial, &archive).with_context(|| format!("cannot write {}", archive.display()))?;
        Ok(staged)
    });
    remove_work_dir(&work);
    let staged = built?;
    let listing = dir.join(format!("edgevx-{VERSION}-{}.contents.txt", arch.oci()));
    fs::write(&listing, staged.iter().map(Staged::line).collect::<String>())
        .with_context(|| format!("cannot write {}", listing.display()))?;
    let files: u64 = staged.iter().map(|s| s.size).sum();
    let size = fs::metadata(&archive).with_context(|| format!("cannot read {}", archive.display()))?.len();
    eprintln!(
        "xtask: {} ({}): {} entries, {:.1} MiB of files, archive {:.1} MiB\nxtask: contents listed in {}",
        archive.display(),
        name(),
        staged.len(),
        mib(files),
        mib(size),
        listing.display()
    );
    Ok(archive)
}

/// What `--arch` takes: one architecture, or every one in one index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Platforms {
    Amd64,
    Arm64,
    /// Both images and one OCI index over them.
    All,
}

/// `cargo xtask image --arch …`; the archive written.
pub fn build_for(platforms: Platforms) -> Result<PathBuf> {
    match platforms {
        Platforms::Amd64 => build(Arch::Amd64),
        Platforms::Arm64 => build(Arch::Arm64),
        Platforms::All => build_index(),
    }
}

/// The multi-architecture archive `--arch all` writes.
pub fn index_archive() -> PathBuf {
    dir().join(format!("edgevx-{VERSION}.oci.tar"))
}

/// Every architecture's image, then one OCI image index over them under
/// the one tag [`name`], as kube-flannel publishes its multi-arch image: a
/// runtime picks the manifest for its node's architecture.
pub fn build_index() -> Result<PathBuf> {
    let archives = [Arch::Amd64, Arch::Arm64].into_iter().map(build).collect::<Result<Vec<_>>>()?;
    let work = dir().join(format!("work-{}", std::process::id()));
    let b = Buildah { store: work.join("buildah") };
    let list = format!("edgevx-index-{}", std::process::id());
    let index = index_archive();
    let partial = work.join("index.oci.tar");
    let result = (|| -> Result<()> {
        exec::output(b.cmd().args(["manifest", "create", &list]))?;
        for archive in &archives {
            exec::output(b.cmd().args(["manifest", "add", &list]).arg(format!("oci-archive:{}", archive.display())))?;
        }
        exec::output(b.cmd().args(["manifest", "push", "--quiet", "--all", "--format", "oci", &list]).arg(format!(
            "oci-archive:{}:{}",
            partial.display(),
            name()
        )))?;
        fs::rename(&partial, &index).with_context(|| format!("cannot write {}", index.display()))
    })();
    let _ = b.cmd().args(["rm", "--all"]).output();
    remove_work_dir(&work);
    result.context("buildah manifest")?;
    eprintln!("xtask: {} ({}): one index over {}", index.display(), name(), archives.len());
    Ok(index)
}

/// `rustup target add`, when the (default) toolchain lacks `target`.
fn ensure_rust_target(target: &str) -> Result<()> {
    let installed = exec::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    eprintln!("xtask: installing the Rust target {target}");
    exec::run(Command::new("rustup").args(["target", "add", target]))
        .with_context(|| format!("missing: the Rust target {target}, and rustup could not add it"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// The static (musl) agent and edgevx-ipam for `arch`.
pub fn binaries(arch: Arch) -> Result<(PathBuf, PathBuf)> {
    let tools = toolchain::ensure()?;
    ensure_rust_target(arch.rust_target())?;
    let env = arch.musl_env()?;
    let agent = build::agent_static(&tools, arch.rust_target(), &env)?;
    let ipam = build::ipam_static(arch.rust_target(), &env)?;
    Ok((agent, ipam))
}

/// Another architecture's image cannot be run here (`buildah run` would
/// need binfmt_misc, which this kernel lacks), so before it is written:
/// its static binaries run under qemu-user, and each Debian program's own
/// loader resolves every library it needs inside the image's root (a
/// missing one fails here, not on a node). qemu-user passes no netfilter
/// netlink through, so iptables and nft themselves run only on an arm64
/// kernel.
fn check_foreign(origin: &Origin, rootfs: &Path) -> Result<()> {
    // edgevx's --version; edgevx-ipam's CNI VERSION command, as a runtime asks it
    for (program, env) in [("/usr/local/bin/edgevx", None), ("/usr/local/bin/edgevx-ipam", Some("VERSION"))] {
        let mut run = Command::new(origin.arch.qemu());
        run.arg(rootfs.join(&program[1..])).stdin(std::process::Stdio::null());
        match env {
            Some(command) => run.env("CNI_COMMAND", command),
            None => run.arg("--version"),
        };
        let out =
            exec::output(&mut run).with_context(|| format!("{program} does not run under {}", origin.arch.qemu()))?;
        eprintln!("xtask: in the image, under {}: {program}: {}", origin.arch.qemu(), out.trim());
    }
    for program in ["/usr/sbin/iptables", "/usr/sbin/ip6tables", "/usr/sbin/iptables-restore", "/usr/sbin/nft"] {
        let libs = origin.libraries(rootfs, program)?;
        eprintln!("xtask: in the image: {program} finds its {} libraries", libs.len());
    }
    Ok(())
}

/// One file (or link) put into the root filesystem.
struct Staged {
    path: String,
    size: u64,
    why: String,
}

impl Staged {
    fn line(&self) -> String {
        format!("{}\t{}\t{}\n", self.path, self.size, self.why)
    }
}

/// Builds the image's root filesystem in `rootfs` from [`contents`].
fn stage(origin: &Origin, agent: &Path, ipam: &Path, rootfs: &Path) -> Result<Vec<Staged>> {
    fs::create_dir_all(rootfs).with_context(|| format!("cannot create {}", rootfs.display()))?;
    let mut staged = Vec::new();
    // libraries ldd names: path in the image -> which program needed it first
    let mut libraries: BTreeSet<PathBuf> = BTreeSet::new();
    for item in contents(origin.arch) {
        match &item.from {
            Source::Agent => staged.push(put(agent, rootfs, &item.to, item.why)?),
            Source::Ipam => staged.push(put(ipam, rootfs, &item.to, item.why)?),
            Source::Program(from) | Source::File(from) => {
                if matches!(item.from, Source::Program(_)) {
                    libraries.extend(origin.libraries(&origin.root, from)?);
                }
                staged.push(put(&origin.path(from), rootfs, &item.to, item.why)?);
            }
            Source::Plugins(dir) => {
                let from = origin.path(dir);
                let entries = fs::read_dir(&from).with_context(|| format!("cannot list {}", from.display()))?;
                let mut objects: Vec<PathBuf> = entries
                    .map(|e| e.map(|e| e.path()))
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("cannot list {}", from.display()))?;
                objects.retain(|p| p.extension().is_some_and(|e| e == "so"));
                objects.sort();
                if objects.is_empty() {
                    bail!("missing: shared objects in {} (Debian package iptables)", from.display());
                }
                for object in &objects {
                    let to = Path::new(&item.to).join(object.file_name().context("no file name")?);
                    libraries.extend(origin.libraries(&origin.root, &to.to_string_lossy())?);
                    staged.push(put(object, rootfs, &to.to_string_lossy(), item.why)?);
                }
            }
            Source::Link(target) => {
                let at = inside(rootfs, &item.to)?;
                symlink(target, &at).with_context(|| format!("cannot link {}", at.display()))?;
                staged.push(Staged { path: format!("{} -> {target}", item.to), size: 0, why: item.why.into() });
            }
        }
    }
    for lib in libraries {
        let path = lib.to_string_lossy().into_owned();
        let why = "a shared library (or the loader) that the loader names for the above";
        staged.push(put(&origin.path(&path), rootfs, &path, why)?);
    }
    Ok(staged)
}

/// Copies `from` (following links) to `to` inside `rootfs`, keeping its mode.
fn put(from: &Path, rootfs: &Path, to: &str, why: &str) -> Result<Staged> {
    let at = inside(rootfs, to)?;
    fs::copy(from, &at).with_context(|| format!("missing: {} (for {to})", from.display()))?;
    let meta = fs::metadata(from).with_context(|| format!("cannot read {}", from.display()))?;
    fs::set_permissions(&at, meta.permissions()).with_context(|| format!("cannot set the mode of {}", at.display()))?;
    Ok(Staged { path: to.to_string(), size: meta.len(), why: why.to_string() })
}

/// `rootfs` + absolute `path`, with its parent directories created.
fn inside(rootfs: &Path, path: &str) -> Result<PathBuf> {
    let rel = path.strip_prefix('/').with_context(|| format!("{path} is not absolute"))?;
    let at = rootfs.join(rel);
    if let Some(parent) = at.parent() {
        fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    Ok(at)
}

/// The libraries in `ldd` (or `ld.so --list`) output, as paths on a node
/// (the loader at the path the program asks for, not where qemu-user
/// found it).
fn parse_ldd(out: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // libxtables.so.12 => /lib/x86_64-linux-gnu/libxtables.so.12 (0x...)
        // /lib64/ld-linux-x86-64.so.2 (0x...)
        // linux-vdso.so.1 (0x...)
        // /lib/ld-linux-aarch64.so.1 => /cache/sysroot/lib/ld-linux-aarch64.so.1 (0x...)  (qemu-user -L)
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let (name, rest) = (name.trim(), rest.trim());
                if rest.starts_with("not found") {
                    bail!("{name} is not found");
                }
                if name.starts_with('/') { name } else { rest.split_whitespace().next().unwrap_or_default() }
            }
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// buildah in a store of its own under target/image (vfs, chroot isolation).
struct Buildah {
    store: PathBuf,
}

impl Buildah {
    fn cmd(&self) -> Command {
        let mut c = Command::new("buildah");
        c.arg("--root")
            .arg(self.store.join("root"))
            .arg("--runroot")
            .arg(self.store.join("run"))
            .args(["--storage-driver", "vfs"])
            .env("BUILDAH_ISOLATION", "chroot");
        c
    }
}

/// `FROM scratch`, the root filesystem, the configuration, then the archive.
fn commit(origin: &Origin, rootfs: &Path, store: &Path, archive: &Path) -> Result<()> {
    let arch = origin.arch;
    let b = Buildah { store: store.to_path_buf() };
    let working = format!("edgevx-image-{}", std::process::id());
    let image = name();
    let result = (|| -> Result<()> {
        exec::output(b.cmd().args(["from", "--name", &working, "scratch"]))?;
        let mut src = rootfs.as_os_str().to_owned();
        src.push("/");
        exec::output(b.cmd().args(["copy", &working]).arg(&src).arg("/"))?;
        let version_label = format!("org.opencontainers.image.version={VERSION}");
        exec::output(
            b.cmd()
                .args(["config", "--os", "linux", "--arch", arch.oci()])
                .args(["--entrypoint", ENTRYPOINT, "--cmd", CMD, "--env", PATH_ENV])
                .args(["--label", "org.opencontainers.image.title=edgevx", "--label", &version_label])
                .args(["--created-by", "cargo xtask image"])
                .arg(&working),
        )?;
        let mut commit = b.cmd();
        commit.args(["commit", "--quiet", "--format", "oci", "--identity-label=false", "--rm"]);
        if let Ok(epoch) = std::env::var("SOURCE_DATE_EPOCH") {
            commit.args(["--timestamp", &epoch]);
        }
        exec::output(commit.arg(&working).arg(&image))?;
        // A program that cannot find its libraries fails here, not on a node.
        // In a container of its own: `buildah run` leaves mount points behind.
        // (Another architecture's were checked before: check_foreign.)
        if origin.native {
            let check = format!("{working}-check");
            exec::output(b.cmd().args(["from", "--name", &check, &image]))?;
            for program in [
                "/usr/local/bin/edgevx",
                "/usr/sbin/iptables",
                "/usr/sbin/ip6tables",
                "/usr/sbin/iptables-restore",
                "/usr/sbin/nft",
            ] {
                let out =
                    exec::output(b.cmd().args(["run", "--isolation", "chroot", &check, "--", program, "--version"]))
                        .with_context(|| format!("{program} does not run in the image"))?;
                eprintln!("xtask: in the image: {}", out.trim());
            }
        }
        exec::output(
            b.cmd().args(["push", "--quiet", &image]).arg(format!("oci-archive:{}:{image}", archive.display())),
        )?;
        Ok(())
    })();
    // the store holds nothing the archive does not; it goes with the work directory
    let _ = b.cmd().args(["rm", "--all"]).output();
    result.context("buildah")
}

/// Removes a work directory, after detaching anything buildah left mounted
/// below it: removing files through a mount would remove the mounted ones.
fn remove_work_dir(dir: &Path) {
    let mounted_below = || -> Vec<String> {
        let prefix = format!("{}/", dir.display());
        fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|at| at.starts_with(&prefix))
            .map(str::to_string)
            .collect()
    };
    for at in mounted_below().iter().rev() {
        let _ = Command::new("umount").args(["--lazy", at]).output();
    }
    let left = mounted_below();
    if !left.is_empty() {
        eprintln!("xtask: left {} in place: still mounted below it: {}", dir.display(), left.join(", "));
        return;
    }
    if let Err(e) = fs::remove_dir_all(dir) {
        eprintln!("xtask: cannot remove {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_the_loader_but_not_the_vdso() -> Result<()> {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibmnl.so.0 => /lib/x86_64-linux-gnu/libmnl.so.0 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out)?,
            vec![PathBuf::from("/lib/x86_64-linux-gnu/libmnl.so.0"), PathBuf::from("/lib64/ld-linux-x86-64.so.2")]
        );
        Ok(())
    }

    #[test]
    fn the_arm64_loaders_list_under_qemu_gives_paths_as_on_a_node() -> Result<()> {
        // `ld-linux-aarch64.so.1 --list` under `qemu-aarch64-static -L ROOT`: the
        // loader is found under ROOT, and named by the path the program asks for
        let out = "\t (0x0000005502850000)\n\tlibc.so.6 => /lib/aarch64-linux-gnu/libc.so.6 (0x1)\n\
                   \t/lib/ld-linux-aarch64.so.1 => /cache/root/lib/ld-linux-aarch64.so.1 (0x2)\n";
        assert_eq!(
            parse_ldd(out)?,
            vec![PathBuf::from("/lib/aarch64-linux-gnu/libc.so.6"), PathBuf::from("/lib/ld-linux-aarch64.so.1")]
        );
        Ok(())
    }

    #[test]
    fn a_library_ldd_cannot_find_is_an_error_naming_it() {
        let err = parse_ldd("\tlibgone.so.1 => not found\n").err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("libgone.so.1 is not found"));
    }
}
