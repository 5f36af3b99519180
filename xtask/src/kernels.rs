//! The kernel matrix's kernels: Debian's own generic builds, fetched from
//! Debian's archive and cached, so a test on "5.10" runs on exactly the
//! kernel a Debian 11 edge node boots.
//!
//! apt fetches them with a source list, list directory and archive cache of
//! its own under the cache dir (`-o Dir::Etc::sourcelist=…`), so the
//! machine's own apt configuration is never changed. The archive's address
//! is the one the machine's apt already uses (its `/debian` and
//! `/debian-security` URIs), so this works wherever the machine's apt does.
//!
//! The *generic* flavour (`-amd64-unsigned`) is taken, not `-cloud-amd64`:
//! virtme-ng shares the root filesystem over 9p, which the cloud flavour
//! does not build.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{exec, toolchain};

/// One kernel of the matrix.
pub struct Spec {
    /// The name `--kernel` takes.
    pub name: &'static str,
    /// Where a fleet meets it.
    pub distro: &'static str,
    /// Source lines for apt, `{debian}` and `{security}` standing for the
    /// machine's archive URIs.
    sources: &'static [&'static str],
    /// The package name before the ABI number (`linux-image-5.10.0-46-amd64-unsigned`).
    prefix: &'static str,
    /// The package name after it.
    suffix: &'static str,
}

pub const MATRIX: &[Spec] = &[
    Spec {
        name: "5.10",
        distro: "Debian 11 (bullseye)",
        sources: &["{debian} bullseye main", "{security} bullseye-security main"],
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
    },
    Spec {
        name: "6.1",
        distro: "Debian 12 (bookworm)",
        sources: &["{debian} bookworm main", "{security} bookworm-security main"],
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64-unsigned",
    },
    Spec {
        name: "6.12",
        distro: "Debian 12 backports (bookworm-backports), Debian 13",
        sources: &["{debian} bookworm-backports main"],
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64-unsigned",
    },
];

pub fn spec(name: &str) -> Result<&'static Spec> {
    MATRIX.iter().find(|s| s.name == name).with_context(|| {
        format!(
            "unknown kernel {name:?}: the matrix has {}",
            MATRIX.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        )
    })
}

/// A fetched kernel: its image and its modules' tree (virtme-ng links the
/// guest's `/lib/modules/<release>` to it).
pub struct Fetched {
    pub package: String,
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The newest package of `spec` in Debian's archive, downloaded and
/// unpacked once into the cache; later runs reuse it.
pub fn fetch(spec: &Spec) -> Result<Fetched> {
    let root = toolchain::cache_root()?.join("kernels");
    let apt = Apt::new(&root.join(format!("apt-{}", spec.name)), spec)?;
    let package = apt.newest(spec)?;
    let unpacked = root.join(&package);
    if let Some(found) = unpacked_kernel(&unpacked, &package)? {
        return Ok(found);
    }
    eprintln!("xtask: fetching {package} ({})", spec.distro);
    let debs = root.join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
    apt.download(&package, &debs)?;
    let deb = fs::read_dir(&debs)
        .with_context(|| format!("cannot list {}", debs.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{package}_"))))
        .with_context(|| format!("apt-get download left no {package}_*.deb in {}", debs.display()))?;
    let partial = root.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    exec::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))
        .with_context(|| format!("cannot unpack {}", deb.display()))?;
    let release = release_of(&partial)?;
    // modules.dep for the guest's modprobe (the package's postinst would run this)
    exec::run(Command::new("depmod").arg("-b").arg(&partial).arg(&release))
        .with_context(|| format!("depmod failed for {release}"))?;
    fs::rename(&partial, &unpacked).with_context(|| format!("cannot move {} into place", partial.display()))?;
    let _ = fs::remove_file(&deb);
    unpacked_kernel(&unpacked, &package)?.with_context(|| format!("{} holds no kernel image", unpacked.display()))
}

fn unpacked_kernel(dir: &Path, package: &str) -> Result<Option<Fetched>> {
    if !dir.join("lib/modules").is_dir() {
        return Ok(None);
    }
    let release = release_of(dir)?;
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    Ok(vmlinuz.is_file().then(|| Fetched { package: package.to_string(), release, vmlinuz }))
}

/// The one release under `<dir>/lib/modules`.
fn release_of(dir: &Path) -> Result<String> {
    let modules = dir.join("lib/modules");
    let mut releases: Vec<String> = fs::read_dir(&modules)
        .with_context(|| format!("cannot list {}", modules.display()))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    match releases.len() {
        1 => Ok(releases.remove(0)),
        n => bail!("{} holds {n} kernel releases, expected one", modules.display()),
    }
}

/// apt with a configuration of its own under `dir`.
struct Apt {
    options: Vec<String>,
}

impl Apt {
    fn new(dir: &Path, spec: &Spec) -> Result<Self> {
        let (debian, security) = machine_archives()?;
        let lists = dir.join("lists");
        let cache = dir.join("cache");
        for d in [lists.join("partial"), cache.join("archives/partial")] {
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let lines: Vec<String> = spec
            .sources
            .iter()
            .map(|l| {
                format!("deb [signed-by={keyring}] {}", l.replace("{debian}", &debian).replace("{security}", &security))
            })
            .collect();
        let list = dir.join("sources.list");
        fs::write(&list, lines.join("\n") + "\n").with_context(|| format!("cannot write {}", list.display()))?;
        let options = [
            format!("Dir::Etc::sourcelist={}", list.display()),
            "Dir::Etc::sourceparts=-".to_string(),
            format!("Dir::State::Lists={}", lists.display()),
            format!("Dir::Cache={}", cache.display()),
            "APT::Get::List-Cleanup=0".to_string(),
            // the cache is root's; apt's _apt user could not write it
            "APT::Sandbox::User=root".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect();
        let apt = Apt { options };
        // a day-old list is fine; an empty one is fetched first
        let fresh = fs::read_dir(&lists).map(|d| d.count() > 2).unwrap_or(false)
            && fs::metadata(&list)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() < 86_400);
        if !fresh {
            exec::run(Command::new("apt-get").args(&apt.options).args(["update", "-qq"]))
                .with_context(|| format!("cannot read Debian's package lists for {}", spec.distro))?;
        }
        Ok(apt)
    }

    /// The package of `spec` with the highest ABI number.
    fn newest(&self, spec: &Spec) -> Result<String> {
        let pattern = format!("^{}[0-9.]+{}$", regex_escape(spec.prefix), regex_escape(spec.suffix));
        let found =
            exec::output(Command::new("apt-cache").args(&self.options).args(["search", "--names-only", &pattern]))?;
        found
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| name.strip_prefix(spec.prefix).and_then(|r| r.strip_suffix(spec.suffix)).is_some())
            .max_by_key(|name| abi(name, spec))
            .map(str::to_string)
            .with_context(|| {
                format!("Debian's archive lists no {}<abi>{} for {}", spec.prefix, spec.suffix, spec.distro)
            })
    }

    fn download(&self, package: &str, into: &Path) -> Result<()> {
        exec::run(Command::new("apt-get").args(&self.options).args(["download", "-qq", package]).current_dir(into))
            .with_context(|| format!("cannot download {package}"))
    }
}

/// The numbers between the prefix and the suffix, for ordering.
fn abi(name: &str, spec: &Spec) -> Vec<u32> {
    let middle = name.strip_prefix(spec.prefix).and_then(|r| r.strip_suffix(spec.suffix)).unwrap_or("");
    middle.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

fn regex_escape(s: &str) -> String {
    s.chars().flat_map(|c| if ".+*?^$[](){}|\\".contains(c) { vec!['\\', c] } else { vec![c] }).collect()
}

/// The Debian archive and security archive URIs this machine's apt uses
/// (deb822 `.sources` files or one-line lists).
fn machine_archives() -> Result<(String, String)> {
    let mut text = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    for entry in fs::read_dir("/etc/apt/sources.list.d").into_iter().flatten().flatten() {
        text.push('\n');
        text.push_str(&fs::read_to_string(entry.path()).unwrap_or_default());
    }
    let uris: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split_whitespace())
        .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
        .collect();
    let ends = |suffix: &str| uris.iter().find(|u| u.trim_end_matches('/').ends_with(suffix)).map(|u| u.to_string());
    match (ends("/debian"), ends("/debian-security")) {
        (Some(d), Some(s)) => Ok((d, s)),
        _ => bail!(
            "cannot find Debian's archive in this machine's apt sources (/etc/apt/sources.list{{,.d}}): \
             the kernel matrix fetches Debian's kernels from the archive apt already uses"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_abi_wins() {
        let s = spec("5.10").unwrap();
        assert!(abi("linux-image-5.10.0-46-amd64-unsigned", s) > abi("linux-image-5.10.0-9-amd64-unsigned", s));
        let s = spec("6.12").unwrap();
        assert_eq!(abi("linux-image-6.12.95+deb12-amd64-unsigned", s), vec![95]);
    }

    #[test]
    fn unknown_kernel_names_the_matrix() {
        let e = spec("4.19").err().unwrap().to_string();
        assert!(e.contains("5.10, 6.1, 6.12"), "{e}");
    }
}
