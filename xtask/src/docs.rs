//! `cargo xtask docs`: the book under docs/, built with mdBook into
//! target/book, and checked:
//!
//! - the flag reference (docs/src/reference/flags.md) is written from the
//!   binary's clap definition (the agent's unit test, blessed);
//! - every link in the built book, and every relative link in the
//!   repository's Markdown files, reaches a file that exists and, with a
//!   `#fragment`, a heading that exists;
//! - no document names a path outside the repository.
//!
//! mdBook is the Rust ecosystem's book tool; it has no Debian package, so
//! it is built from crates.io once (without its server and watcher) into
//! the tools cache.
use std::{
    collections::BTreeSet,
    fs,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{deps::toolchain, exec};

const MDBOOK_VERSION: &str = "0.5.4";

/// `cargo xtask docs`: the book in target/book; fails on a broken link or
/// an outside path.
pub fn build(check: bool) -> Result<PathBuf> {
    let root = exec::workspace_root();
    // the flag reference, from the binary's own definition (release: the
    // unit tests of `cargo xtask test` are built so, and are reused). With
    // `--check` (CI) it is not rewritten: the unit test already failed if it
    // is stale.
    if !check {
        write_flag_reference(&root)?;
    }
    let mut problems = outside_paths(&root)?;
    problems.extend(markdown_links(&root)?);
    let mdbook = ensure_mdbook()?;
    let out = root.join("target/book");
    let built = Command::new(&mdbook)
        .arg("build")
        .arg(root.join("docs"))
        .arg("--dest-dir")
        .arg(&out)
        .output()
        .context("cannot run mdbook")?;
    let log = String::from_utf8_lossy(&built.stderr);
    if !built.status.success() {
        bail!("mdbook build failed:\n{log}");
    }
    // mdBook's warnings (an unclosed HTML tag, a missing file) are problems too
    problems.extend(log.lines().filter(|l| l.contains("WARN")).map(|l| format!("mdbook: {}", l.trim())));
    problems.extend(html_links(&out)?);
    if !problems.is_empty() {
        bail!("the documentation has {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "));
    }
    eprintln!("xtask: the book is in {}", out.join("index.html").display());
    Ok(out)
}

fn write_flag_reference(root: &Path) -> Result<()> {
    exec::run(
        Command::new("cargo")
            .args(["test", "--release", "--locked", "-p", "edgevx", "--lib", "cli_reference", "--", "--quiet"])
            .current_dir(root)
            .env("EDGEVX_BLESS", "1"),
    )
    .context("writing docs/src/reference/flags.md")
}

fn ensure_mdbook() -> Result<PathBuf> {
    let dir = toolchain::cache_root()?.join(format!("mdbook-{MDBOOK_VERSION}"));
    let bin = dir.join("bin/mdbook");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("xtask: building mdBook {MDBOOK_VERSION} from crates.io (once)");
    exec::run(
        Command::new("cargo")
            .args(["install", "--locked", "--quiet", "mdbook", "--version", MDBOOK_VERSION])
            .args(["--no-default-features", "--features", "search", "--root"])
            .arg(&dir),
    )
    .context("cannot build mdBook")?;
    Ok(bin)
}

/// The repository's Markdown files: README.md, docs/src and deploy/.
fn markdown_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = vec![root.join("README.md")];
    for dir in ["docs/src", "deploy"] {
        walk(&root.join(dir), &mut |p| {
            if p.extension().is_some_and(|e| e == "md") {
                files.push(p.to_path_buf());
            }
        })?;
    }
    Ok(files)
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, f)?;
        } else {
            f(&path);
        }
    }
    Ok(())
}

/// Paths no reader has: this machine's shared tree, the workspace's own
/// absolute path.
fn outside_paths(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let own = root.display().to_string();
    for file in markdown_files(root)? {
        let text = fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            for bad in ["../shared/", "shared/docs/", "shared/reference/", own.as_str()] {
                if line.contains(bad) {
                    problems.push(format!("{}:{}: names {bad}, outside the repository", rel(root, &file), n + 1));
                }
            }
        }
    }
    Ok(problems)
}

/// `[text](target)` links in Markdown: relative ones must reach a file in
/// the repository, and a `#fragment` a heading of that file.
fn markdown_links(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in markdown_files(root)? {
        let text = fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let dest =
                if path.is_empty() { file.clone() } else { normalize(&file.parent().unwrap_or(root).join(path)) };
            let shown = format!("{}: link {target}", rel(root, &file));
            if !dest.starts_with(root) {
                problems.push(format!("{shown} leaves the repository"));
            } else if !dest.exists() {
                problems.push(format!("{shown}: no such file"));
            } else if !fragment.is_empty() && dest.extension().is_some_and(|e| e == "md") {
                let heads = anchors(&fs::read_to_string(&dest).unwrap_or_default());
                if !heads.contains(fragment) {
                    problems.push(format!("{shown}: {} has no heading #{fragment}", rel(root, &dest)));
                }
            }
        }
    }
    Ok(problems)
}

/// The targets of inline Markdown links, outside code blocks and spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // code spans hold examples, not links
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() {
                targets.push(target.to_string());
            }
            rest = &after[end..];
        }
    }
    targets
}

/// The anchors mdBook and GitHub give a file's headings: lower case,
/// spaces to `-`, other punctuation but `-` and `_` dropped.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        out.insert(slug(heading));
    }
    out
}

fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Every `href` and `src` of the built book that stays inside it must
/// reach a file, and a `#fragment` an `id` in that file.
fn html_links(out: &Path) -> Result<Vec<String>> {
    let mut pages = Vec::new();
    walk(out, &mut |p| {
        if p.extension().is_some_and(|e| e == "html") {
            pages.push(p.to_path_buf());
        }
    })?;
    let mut problems = Vec::new();
    for page in &pages {
        let html = fs::read_to_string(page).with_context(|| format!("cannot read {}", page.display()))?;
        for target in attributes(&html, "href=\"").into_iter().chain(attributes(&html, "src=\"")) {
            // absolute paths are the site's root (404.html's), which depends on where it is served
            if target.contains("://") || target.starts_with(['/', '{']) || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() { page.clone() } else { normalize(&page.parent().unwrap_or(out).join(path)) };
            let shown = format!("book {}: link {target}", rel(out, page));
            if !dest.starts_with(out) || !dest.exists() {
                problems.push(format!("{shown}: no such page in the book"));
            } else if !fragment.is_empty() && dest.extension().is_some_and(|e| e == "html") {
                let ids = attributes(&fs::read_to_string(&dest).unwrap_or_default(), "id=\"");
                if !ids.iter().any(|id| id == fragment) {
                    problems.push(format!("{shown}: {} has no #{fragment}", rel(out, &dest)));
                }
            }
        }
    }
    Ok(problems)
}

fn attributes(html: &str, start: &str) -> Vec<String> {
    html.split(start).skip(1).filter_map(|rest| rest.split_once('"').map(|(v, _)| v.replace("&amp;", "&"))).collect()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_become_the_anchors_mdbook_gives_them() {
        let a = anchors("# Kernel matrix\n```\n# not a heading\n```\n## Edge nodes behind OpenYurt's YurtHub\n");
        assert_eq!(a.into_iter().collect::<Vec<_>>(), ["edge-nodes-behind-openyurts-yurthub", "kernel-matrix"]);
        assert_eq!(slug("Dual-stack (`EnableIPv6`)"), "dual-stack-enableipv6");
    }

    #[test]
    fn links_in_code_are_not_links() {
        let t = "see [a](x.md#y) and `[b](z.md)`\n```\n[c](w.md)\n```\n[d](https://e/f) [g](h.md \"t\")";
        assert_eq!(link_targets(t), ["x.md#y", "https://e/f", "h.md"]);
    }

    #[test]
    fn parent_components_fold() {
        assert_eq!(normalize(Path::new("/r/docs/src/a/../b.md")), PathBuf::from("/r/docs/src/b.md"));
    }
}
