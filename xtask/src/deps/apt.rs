//! apt with a configuration of its own under the cache dir: a source list,
//! list directory and archive cache (`-o Dir::Etc::sourcelist=…`), and an
//! architecture of its own when asked. The machine's apt configuration is
//! never changed: no `dpkg --add-architecture`, no source added.
//!
//! The archive's address is the one the machine's apt already uses (its
//! `/debian` and `/debian-security` URIs), so this works wherever the
//! machine's apt does. The kernel matrix takes its kernels this way, and
//! the arm64 image its programs and libraries.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::exec;

/// apt with a configuration of its own.
pub struct Apt {
    options: Vec<String>,
}

impl Apt {
    /// `sources` are apt source lines without `deb`, `{debian}` and
    /// `{security}` standing for the machine's archive URIs; `arch` the
    /// Debian architecture whose packages it lists (the machine's when
    /// `None`); `what` names them in messages.
    pub fn new(dir: &Path, sources: &[&str], arch: Option<&str>, what: &str) -> Result<Self> {
        let (debian, security) = machine_archives()?;
        let lists = dir.join("lists");
        let cache = dir.join("cache");
        for d in [lists.join("partial"), cache.join("archives/partial")] {
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let lines: Vec<String> = sources
            .iter()
            .map(|l| {
                format!("deb [signed-by={keyring}] {}", l.replace("{debian}", &debian).replace("{security}", &security))
            })
            .collect();
        let list = dir.join("sources.list");
        fs::write(&list, lines.join("\n") + "\n").with_context(|| format!("cannot write {}", list.display()))?;
        // the packages this apt knows are installed: none (it never installs)
        let status = dir.join("status");
        fs::write(&status, "").with_context(|| format!("cannot write {}", status.display()))?;
        let mut options = vec![
            format!("Dir::Etc::sourcelist={}", list.display()),
            "Dir::Etc::sourceparts=-".to_string(),
            format!("Dir::State::Lists={}", lists.display()),
            format!("Dir::State::status={}", status.display()),
            format!("Dir::Cache={}", cache.display()),
            "APT::Get::List-Cleanup=0".to_string(),
            // the cache is root's; apt's _apt user could not write it
            "APT::Sandbox::User=root".to_string(),
        ];
        if let Some(arch) = arch {
            options.push(format!("APT::Architecture={arch}"));
            options.push(format!("APT::Architectures={arch}"));
        }
        let apt = Apt { options: options.into_iter().flat_map(|o| ["-o".to_string(), o]).collect() };
        // a day-old list is fine; an empty one is fetched first
        let fresh = fs::read_dir(&lists).map(|d| d.count() > 2).unwrap_or(false)
            && fs::metadata(&list)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() < 86_400);
        if !fresh {
            exec::run(apt.get().args(["update", "-qq"]))
                .with_context(|| format!("cannot read Debian's package lists for {what}"))?;
        }
        Ok(apt)
    }

    fn get(&self) -> Command {
        let mut c = Command::new("apt-get");
        c.args(&self.options);
        c
    }

    /// `apt-cache ARGS` with this configuration; its output.
    pub fn cache(&self, args: &[&str]) -> Result<String> {
        exec::output(Command::new("apt-cache").args(&self.options).args(args))
    }

    /// Downloads `package`'s .deb into `into`; returns its path.
    pub fn download(&self, package: &str, into: &Path) -> Result<PathBuf> {
        fs::create_dir_all(into).with_context(|| format!("cannot create {}", into.display()))?;
        exec::run(self.get().args(["download", "-qq", package]).current_dir(into))
            .with_context(|| format!("cannot download {package}"))?;
        let name = package.split(':').next().unwrap_or(package);
        fs::read_dir(into)
            .with_context(|| format!("cannot list {}", into.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{name}_"))))
            .with_context(|| format!("apt-get download left no {name}_*.deb in {}", into.display()))
    }

    /// `packages` and every package they depend on (Depends and
    /// Pre-Depends, not Recommends), sorted; virtual packages are left out
    /// (a real package providing one is listed with it).
    pub fn closure(&self, packages: &[&str]) -> Result<Vec<String>> {
        let mut args = vec!["depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts"];
        args.extend(["--no-breaks", "--no-replaces", "--no-enhances"]);
        args.extend(packages);
        Ok(parse_closure(&self.cache(&args)?))
    }
}

/// The package names `apt-cache depends --recurse` prints at the start of
/// a line (the dependency lines below each are indented).
fn parse_closure(out: &str) -> Vec<String> {
    let names: BTreeSet<String> = out
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.is_empty() && !l.starts_with('<'))
        .map(|l| l.trim().to_string())
        .collect();
    names.into_iter().collect()
}

/// `dpkg-deb -x DEB INTO`.
pub fn unpack(deb: &Path, into: &Path) -> Result<()> {
    exec::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(into))
        .with_context(|| format!("cannot unpack {}", deb.display()))
}

/// The Debian archive and security archive URIs this machine's apt uses
/// (deb822 `.sources` files or one-line lists).
fn machine_archives() -> Result<(String, String)> {
    let uris = source_uris();
    let ends = |suffix: &str| uris.iter().find(|u| u.trim_end_matches('/').ends_with(suffix)).map(|u| u.to_string());
    match (ends("/debian"), ends("/debian-security")) {
        (Some(d), Some(s)) => Ok((d, s)),
        _ => bail!(
            "cannot find Debian's archive in this machine's apt sources (/etc/apt/sources.list{{,.d}}): \
             the kernel matrix and the arm64 image fetch Debian's packages from the archive apt already uses"
        ),
    }
}

/// Every http(s) URI in this machine's apt sources (`/etc/apt/sources.list`
/// and `sources.list.d`), comments left out, in their order.
pub fn source_uris() -> Vec<String> {
    let mut text = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    for entry in fs::read_dir("/etc/apt/sources.list.d").into_iter().flatten().flatten() {
        text.push('\n');
        text.push_str(&fs::read_to_string(entry.path()).unwrap_or_default());
    }
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split_whitespace())
        .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closure_is_the_real_packages_apt_cache_names() {
        let out = "iptables\n  Depends: libc6\n  Depends: <libxtables12>\n    libxtables12\nlibc6\n  \
                   Depends: libgcc-s1\n<awk>\nlibgcc-s1\n";
        assert_eq!(parse_closure(out), ["iptables", "libc6", "libgcc-s1"]);
    }
}
