//! `cargo xtask release`: everything an operator installs, in one directory,
//! `target/dist/edgevx-<version>/`:
//!
//! - `edgevx-<version>-linux-<arch>.tar.gz` for amd64 and arm64: the static
//!   (musl) edgevx and edgevx-ipam, which run on any glibc or none (Debian
//!   11's 2.31 included), with the systemd unit, its env file, LICENSE,
//!   CHANGELOG.md and README.md, under one top directory of the same name;
//! - `edgevx-<version>.oci.tar`: the multi-arch image (one OCI index);
//! - `manifests/<overlay>.yaml`: each overlay rendered, the image pinned by
//!   the digest of that archive's index (`ghcr.io/edgevx/edgevx@sha256:…`),
//!   so a cluster runs exactly the bytes in the archive once it is pushed
//!   with its index kept (`skopeo copy --all`, `podman manifest push --all`);
//! - `SHA256SUMS` over every other file.
//!
//! The version is the workspace's (Cargo.toml), the one place it is written.
//! Before it returns, the directory is verified as an operator would: the
//! binaries static, the sums right, and every manifest's image the archive's
//! digest.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    deps::unpacked,
    exec,
    ship::image::{self, Arch, REPOSITORY, VERSION},
};

/// What is rendered into `manifests/<name>.yaml`, as `kubectl apply -k`
/// takes it: (directory under deploy/, name). The uninstall is released
/// with the overlays, pinned to the same image: it must run the release
/// that made the pins it removes.
pub const MANIFESTS: [(&str, &str); 5] = [
    ("overlays/kube", "kube"),
    ("overlays/etcd-tls", "etcd-tls"),
    ("overlays/openyurt", "openyurt"),
    ("overlays/before-1.30", "before-1.30"),
    ("uninstall", "uninstall"),
];

/// What a tarball holds beside the two binaries: (path in the repository, name in the tarball).
const FILES: [(&str, &str); 5] = [
    ("deploy/edgevx.service", "edgevx.service"),
    ("deploy/edgevx.env", "edgevx.env"),
    ("LICENSE", "LICENSE"),
    ("CHANGELOG.md", "CHANGELOG.md"),
    ("README.md", "README.md"),
];

/// `target/dist`: where tarballs and releases are written.
pub fn dist() -> PathBuf {
    exec::workspace_root().join("target/dist")
}

/// The name of a tarball's top directory (the tarball adds `.tar.gz`).
pub fn tarball_name(arch: Arch) -> String {
    format!("edgevx-{VERSION}-linux-{}", arch.oci())
}

/// The directory `cargo xtask release` writes.
pub fn release_dir() -> PathBuf {
    dist().join(format!("edgevx-{VERSION}"))
}

/// The tarball for `arch`, built from the static binaries; returns its path
/// (`target/dist/edgevx-<version>-linux-<arch>.tar.gz`).
pub fn tarball(arch: Arch) -> Result<PathBuf> {
    let (agent, ipam) = image::binaries(arch)?;
    let root = exec::workspace_root();
    let name = tarball_name(arch);
    let stage = dist().join(format!("stage-{}", std::process::id()));
    let top = stage.join(&name);
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&top).with_context(|| format!("cannot create {}", top.display()))?;
    let out = dist().join(format!("{name}.tar.gz"));
    let built = (|| -> Result<()> {
        for (from, to) in [(&agent, "edgevx"), (&ipam, "edgevx-ipam")] {
            fs::copy(from, top.join(to)).with_context(|| format!("cannot copy {}", from.display()))?;
            exec::run(Command::new("chmod").arg("0755").arg(top.join(to)))?;
        }
        for (from, to) in FILES {
            fs::copy(root.join(from), top.join(to)).with_context(|| format!("cannot copy {from}"))?;
            exec::run(Command::new("chmod").arg("0644").arg(top.join(to)))?;
        }
        // the same bytes for the same inputs: names sorted, owner root, one mtime
        let partial = stage.join("partial.tar.gz");
        exec::run(
            Command::new("tar")
                .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0"])
                // gzip without the name and time of the tar stream in its header
                .args(["--use-compress-program=gzip -n", "-cf"])
                .arg(&partial)
                .arg("-C")
                .arg(&stage)
                .arg(&name),
        )?;
        fs::rename(&partial, &out).with_context(|| format!("cannot write {}", out.display()))
    })();
    let _ = fs::remove_dir_all(&stage);
    built?;
    eprintln!("xtask: {}", out.display());
    Ok(out)
}

/// The digest of the OCI archive's image index: what a registry keeps when
/// the archive is pushed with its index, and what the manifests pin.
pub fn index_digest(archive: &Path) -> Result<String> {
    let text = exec::output(Command::new("tar").arg("-xOf").arg(archive).arg("index.json"))
        .with_context(|| format!("{} has no index.json", archive.display()))?;
    let index: serde_json::Value = serde_json::from_str(&text).context("index.json is not JSON")?;
    let manifests = index["manifests"].as_array().context("index.json has no manifests")?;
    ensure!(manifests.len() == 1, "index.json names {} images, one expected", manifests.len());
    let m = &manifests[0];
    ensure!(
        m["mediaType"] == "application/vnd.oci.image.index.v1+json",
        "the archive's image is a {}, not a multi-arch index",
        m["mediaType"]
    );
    let digest = m["digest"].as_str().context("no digest")?;
    ensure!(digest.starts_with("sha256:") && digest.len() == 71, "not a sha256 digest: {digest}");
    Ok(digest.to_string())
}

/// Renders deploy/`from` with the image pinned by `digest`: a kustomization
/// of its own beside the output, with `from` as its base and kustomize's
/// `images:` (what an operator writes to point the manifests at their own
/// registry, docs/src/installing/daemonset.md).
fn render(kubectl: &Path, (from, name): (&str, &str), digest: &str, work: &Path) -> Result<String> {
    let dir = work.join(name);
    fs::create_dir_all(&dir)?;
    // kubectl's kustomize v2.0.3 takes a base only as a relative path
    let root = exec::workspace_root();
    let depth = dir.strip_prefix(&root).context("the work directory is outside the workspace")?.components().count();
    let base = format!("{}deploy/{from}", "../".repeat(depth));
    fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nbases:\n  - {base}\nimages:\n  - name: {REPOSITORY}\n    digest: {digest}\n"
        ),
    )?;
    exec::output(Command::new(kubectl).arg("kustomize").arg(&dir))
        .with_context(|| format!("cannot render deploy/{from}"))
}

/// `cargo xtask release`: builds and writes [`release_dir`], then verifies it.
pub fn build() -> Result<PathBuf> {
    let out = release_dir();
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(out.join("manifests")).with_context(|| format!("cannot create {}", out.display()))?;
    for arch in [Arch::Amd64, Arch::Arm64] {
        let t = tarball(arch)?;
        let name = t.file_name().context("tarball name")?;
        fs::rename(&t, out.join(name)).with_context(|| format!("cannot move {}", t.display()))?;
    }
    let index = image::build_index()?;
    let archive = out.join(index.file_name().context("archive name")?);
    fs::copy(&index, &archive).with_context(|| format!("cannot copy {}", index.display()))?;
    let digest = index_digest(&archive)?;
    let kubectl = unpacked::ensure(&unpacked::KUBECTL)?;
    let work = dist().join(format!("render-{}", std::process::id()));
    let rendered = MANIFESTS.iter().try_for_each(|&m| {
        let text = render(&kubectl, m, &digest, &work)?;
        fs::write(out.join("manifests").join(format!("{}.yaml", m.1)), text).map_err(anyhow::Error::from)
    });
    let _ = fs::remove_dir_all(&work);
    rendered?;
    let mut files = listing(&out)?;
    files.retain(|f| f != "SHA256SUMS");
    let sums = exec::output(Command::new("sha256sum").args(&files).current_dir(&out))?;
    fs::write(out.join("SHA256SUMS"), sums)?;
    verify(&out)?;
    eprintln!("xtask: {} verified (image {REPOSITORY}@{digest})", out.display());
    Ok(out)
}

/// Every `app.kubernetes.io/version` label of a rendered manifest is
/// `version`, and there is one: deploy/ writes the version out (it cannot
/// come from Cargo.toml), so a release whose manifests were not bumped
/// stops here.
fn stale_version_labels(manifest: &str, version: &str) -> Result<()> {
    let labels: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("app.kubernetes.io/version:"))
        .map(|v| v.trim().trim_matches('"').trim_matches('\''))
        .collect();
    ensure!(!labels.is_empty(), "no app.kubernetes.io/version label");
    for v in labels {
        ensure!(v == version, "labelled app.kubernetes.io/version {v}, the release is {version}");
    }
    Ok(())
}

/// Whether a 64-bit little-endian ELF needs no dynamic loader: no
/// `PT_INTERP` program header (a static-pie binary still has `PT_DYNAMIC`,
/// which it relocates itself).
pub fn is_static(elf: &[u8]) -> Result<bool> {
    ensure!(elf.len() >= 64 && elf[..4] == *b"\x7fELF", "not an ELF file");
    ensure!(elf[4] == 2 && elf[5] == 1, "not a 64-bit little-endian ELF");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = usize::try_from(u64::from_le_bytes(elf[0x20..0x28].try_into()?))?;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    for i in 0..count {
        let at = phoff + i * size;
        let kind = elf.get(at..at + 4).context("program headers past the end")?;
        if u32::from_le_bytes(kind.try_into()?) == 3 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Every file under `dir`, relative to it, sorted.
fn listing(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir)?.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Checks a release directory as an operator would before installing it.
pub fn verify(dir: &Path) -> Result<()> {
    exec::run(Command::new("sha256sum").args(["--check", "--strict", "--quiet", "SHA256SUMS"]).current_dir(dir))
        .context("SHA256SUMS does not match")?;
    let summed = fs::read_to_string(dir.join("SHA256SUMS"))?;
    for f in listing(dir)? {
        ensure!(f == "SHA256SUMS" || summed.contains(&format!("  {f}\n")), "{f} is not in SHA256SUMS");
    }
    let archive = dir.join(format!("edgevx-{VERSION}.oci.tar"));
    let digest = index_digest(&archive)?;
    let pinned = format!("image: {REPOSITORY}@{digest}");
    for (_, o) in MANIFESTS {
        let text = fs::read_to_string(dir.join("manifests").join(format!("{o}.yaml")))?;
        let images: Vec<&str> = text.lines().map(str::trim).filter(|l| l.starts_with("image: ")).collect();
        let ours: Vec<&&str> = images.iter().filter(|l| l.contains(REPOSITORY)).collect();
        ensure!(!ours.is_empty(), "manifests/{o}.yaml runs no edgevx image");
        for l in ours {
            ensure!(*l == pinned, "manifests/{o}.yaml: {l}, want {pinned}");
        }
        stale_version_labels(&text, VERSION).with_context(|| format!("manifests/{o}.yaml"))?;
    }
    for arch in [Arch::Amd64, Arch::Arm64] {
        let name = tarball_name(arch);
        let work = dist().join(format!("verify-{}-{}", std::process::id(), arch.oci()));
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work)?;
        let checked = (|| -> Result<()> {
            exec::run(Command::new("tar").arg("-xzf").arg(dir.join(format!("{name}.tar.gz"))).arg("-C").arg(&work))?;
            for bin in ["edgevx", "edgevx-ipam"] {
                let path = work.join(&name).join(bin);
                let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
                ensure!(is_static(&bytes)?, "{name}/{bin} asks for a dynamic loader: it would need the host's libc");
            }
            for (_, f) in FILES {
                ensure!(work.join(&name).join(f).is_file(), "{name} lacks {f}");
            }
            Ok(())
        })();
        let _ = fs::remove_dir_all(&work);
        checked?;
    }
    if !dir.join("manifests").is_dir() {
        bail!("no manifests/");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_version_label_stops_the_release() {
        let m = |v: &str| format!("metadata:\n  labels:\n    app.kubernetes.io/version: {v}\n");
        assert!(stale_version_labels(&m("0.2.0"), "0.2.0").is_ok());
        assert!(stale_version_labels(&m("\"0.2.0\""), "0.2.0").is_ok());
        assert!(stale_version_labels(&format!("{}{}", m("0.2.0"), m("0.1.0")), "0.2.0").is_err());
        assert!(stale_version_labels("kind: DaemonSet\n", "0.2.0").is_err());
        // deploy/ as it is: the workspace's version everywhere
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base");
        for f in ["namespace.yaml", "rbac.yaml", "configmap.yaml", "daemonset.yaml"] {
            let text = fs::read_to_string(base.join(f)).unwrap();
            stale_version_labels(&text, VERSION).unwrap_or_else(|e| panic!("deploy/base/{f}: {e:#}"));
        }
    }

    #[test]
    fn a_binary_that_needs_a_loader_is_not_static() {
        // the xtask itself is a glibc binary: it asks for ld-linux
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!is_static(&me).unwrap());
        assert!(is_static(b"not an elf").is_err());
    }

    #[test]
    fn the_readme_installs_this_version() {
        // README.md's systemd section names the tarball by VERSION=: a version
        // bump that leaves it behind would install an older release
        let readme = fs::read_to_string(exec::workspace_root().join("README.md")).unwrap();
        let line = readme.lines().find(|l| l.starts_with("VERSION=")).expect("no VERSION= line in README.md");
        assert!(line.starts_with(&format!("VERSION={VERSION} ")), "README.md says {line:?}, the workspace {VERSION}");
    }
}
