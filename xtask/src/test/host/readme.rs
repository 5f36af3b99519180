//! README.md's install instructions for a systemd host, read as an operator
//! reads them: the ```sh block after each marker comment, its lines taken
//! as they are. The Debian 11 test runs exactly these in the guest.
use anyhow::{Context, Result, bail, ensure};

/// The marker before the block that installs the release tarball.
pub const INSTALL: &str = "<!-- install-systemd:";
/// The marker before the block that enables and starts the unit.
pub const ENABLE: &str = "<!-- enable-systemd:";

/// The lines of the ```sh block that follows `marker` in `readme`.
pub fn block(readme: &str, marker: &str) -> Result<String> {
    let mut lines = readme.lines().skip_while(|l| !l.trim_start().starts_with(marker));
    lines.next().with_context(|| format!("README.md has no `{marker} ... -->` line"))?;
    let fence = lines.find(|l| !l.trim().is_empty()).unwrap_or_default();
    if fence.trim() != "```sh" {
        bail!("README.md: the line after `{marker}` is {fence:?}, not a ```sh block");
    }
    let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
    ensure!(!body.is_empty(), "README.md: the ```sh block after `{marker}` is empty");
    Ok(body.join("\n") + "\n")
}

/// The `VERSION=` the install block sets.
pub fn version(install: &str) -> Result<String> {
    install
        .split_whitespace()
        .find_map(|w| w.strip_prefix("VERSION="))
        .map(str::to_string)
        .context("README.md's install block sets no VERSION=")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocks_are_the_lines_after_each_marker_as_they_are() {
        let readme = "text\n<!-- install-systemd: x -->\n```sh\nVERSION=1.2.3 ARCH=amd64    # or ARCH=arm64\n\
                      tar -xzf a.tgz\n```\n\n<!-- enable-systemd: y -->\n\n```sh\nsystemctl enable --now edgevx\n```\n";
        let install = block(readme, INSTALL).unwrap();
        assert_eq!(install, "VERSION=1.2.3 ARCH=amd64    # or ARCH=arm64\ntar -xzf a.tgz\n");
        assert_eq!(version(&install).unwrap(), "1.2.3");
        assert_eq!(block(readme, ENABLE).unwrap(), "systemctl enable --now edgevx\n");
        assert!(block("no marker\n", INSTALL).is_err());
        assert!(block("<!-- install-systemd: -->\n```\nls\n```\n", INSTALL).is_err(), "not a sh block");
    }

    /// The README a user reads installs the version this workspace builds.
    #[test]
    fn the_readme_installs_this_version() {
        let readme = std::fs::read_to_string(crate::exec::workspace_root().join("README.md")).unwrap();
        let install = block(&readme, INSTALL).unwrap();
        assert_eq!(version(&install).unwrap(), crate::ship::image::VERSION, "README.md's VERSION= in:\n{install}");
        assert!(block(&readme, ENABLE).unwrap().contains("edgevx"));
    }
}
