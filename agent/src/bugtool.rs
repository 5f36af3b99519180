//! `edgevx bugtool`: one .tar.gz an operator attaches to a bug report.
//! Every part is a command's output (or a file's tail) saved as a text file
//! with the command line on top; a part that cannot be had says why in its
//! file and the rest go on. What goes in is listed in [`parts`]; nothing
//! is read from the state dir but through `edgevx status`, so no etcd TLS
//! key or Kubernetes token can be picked up, and every file is checked for
//! key material before it is written ([`scrub`]).
//!
//! The archive is made by the host's `tar`: the workspace has no tar or
//! gzip crate, and adding two for this one command is not worth it when
//! every node has `tar` and `gzip`.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{
    VERSION_LINE,
    cli::BugtoolArgs,
    dataplane::{bpffs::PinDir, fast_path::Mode, features::Features},
};

/// One file of the archive: its name and how to fill it.
struct Part {
    name: String,
    what: What,
}

enum What {
    /// A command's stdout (and stderr, and its exit status when not 0).
    Run(Vec<String>),
    /// Text made here.
    Text(String),
}

fn cmd(name: &str, argv: &[&str]) -> Part {
    Part { name: name.to_string(), what: What::Run(argv.iter().map(|s| s.to_string()).collect()) }
}

fn has(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
}

/// The parts, given `status --json`'s answer (for the interfaces' names).
fn parts(args: &BugtoolArgs, status: &Value) -> Vec<Part> {
    let paths = [
        "--state-dir".to_string(),
        args.paths.state_dir.display().to_string(),
        "--bpffs".to_string(),
        args.paths.bpffs.display().to_string(),
    ];
    let exe = std::env::current_exe().map_or_else(|_| "edgevx".to_string(), |p| p.display().to_string());
    let mut status_cmd = vec![exe.as_str(), "status"];
    status_cmd.extend(paths.iter().map(String::as_str));
    let mut p = vec![
        Part { name: "version.txt".into(), what: What::Text(format!("edgevx {VERSION_LINE}\n")) },
        cmd("status.txt", &status_cmd),
        Part { name: "status.json".into(), what: What::Text(format!("{status:#}\n")) },
        cmd("uname.txt", &["uname", "-a"]),
        Part { name: "kernel-features.txt".into(), what: What::Text(format!("{:#?}\n", Features::probe(Mode::Auto))) },
        cmd("ip-d-link.txt", &["ip", "-d", "link", "show"]),
        cmd("ip-addr.txt", &["ip", "addr", "show"]),
        cmd("ip-route.txt", &["ip", "route", "show", "table", "all"]),
        cmd("ip6-route.txt", &["ip", "-6", "route", "show", "table", "all"]),
        cmd("ip-neigh.txt", &["ip", "neigh", "show"]),
    ];
    for tool in ["iptables-save", "ip6tables-save"] {
        if has(tool) {
            p.push(cmd(&format!("{tool}.txt"), &[tool]));
        }
    }
    if has("nft") {
        p.push(cmd("nft-list-ruleset.txt", &["nft", "list", "ruleset"]));
    }
    let ifaces = [&status["iface"], &status["vtep_device"], &status["vtep6"]["device"]];
    for iface in ifaces.into_iter().filter_map(Value::as_str) {
        for dir in ["ingress", "egress"] {
            p.push(cmd(&format!("tc-filter-{iface}-{dir}.txt"), &["tc", "filter", "show", "dev", iface, dir]));
        }
    }
    if has("bpftool") {
        p.push(cmd("bpftool-net.txt", &["bpftool", "net", "show"]));
        p.push(cmd("bpftool-prog.txt", &["bpftool", "prog", "show"]));
        // the pinned maps status reads, whole (status shows their sums)
        let pins = PinDir::new(&args.paths.bpffs);
        for name in edgevx_common::maps::ALL {
            let pin = pins.map(name);
            if pin.exists() && !name.ends_with("_EVENTS") {
                let pin = pin.display().to_string();
                p.push(cmd(&format!("maps/{name}.txt"), &["bpftool", "map", "dump", "pinned", &pin]));
            }
        }
    }
    p.push(log_part(args));
    p
}

fn log_part(args: &BugtoolArgs) -> Part {
    match &args.log {
        Some(file) => match fs::read(file) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(args.log_lines)..].join("\n");
                Part { name: "agent.log".into(), what: What::Text(tail + "\n") }
            }
            Err(e) => {
                Part { name: "agent.log".into(), what: What::Text(format!("cannot read {}: {e}\n", file.display())) }
            }
        },
        None if has("journalctl") => {
            let n = args.log_lines.to_string();
            cmd("agent.log", &["journalctl", "-u", "edgevx", "--no-pager", "-n", &n])
        }
        None => Part {
            name: "agent.log".into(),
            what: What::Text("no --log given and no journalctl here: the agent's log is not included\n".into()),
        },
    }
}

fn fill(what: &What) -> String {
    match what {
        What::Text(t) => t.clone(),
        What::Run(argv) => {
            let mut out = format!("$ {}\n", argv.join(" "));
            match Command::new(&argv[0]).args(&argv[1..]).output() {
                Ok(o) => {
                    out += &String::from_utf8_lossy(&o.stdout);
                    if !o.stderr.is_empty() {
                        out += &format!("--- stderr\n{}", String::from_utf8_lossy(&o.stderr));
                    }
                    if !o.status.success() {
                        out += &format!("--- {}\n", o.status);
                    }
                }
                Err(e) => out += &format!("cannot run {}: {e}\n", argv[0]),
            }
            out
        }
    }
}

/// Replaces every PEM block that holds a private key, and the value of any
/// line that names a token or password, with a note: whatever a command
/// printed, key material never reaches the archive.
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_key = false;
    for line in text.lines() {
        let upper = line.to_ascii_uppercase();
        if upper.contains("-----BEGIN") && upper.contains("PRIVATE KEY") {
            in_key = true;
            out += "[private key removed by edgevx bugtool]\n";
            continue;
        }
        if in_key {
            in_key = !(upper.contains("-----END") && upper.contains("PRIVATE KEY"));
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if ["token", "password", "secret"].iter().any(|w| lower.contains(w))
            && let Some(i) = line.find([':', '='])
        {
            out += &line[..=i];
            out += " [removed by edgevx bugtool]\n";
            continue;
        }
        out += line;
        out += "\n";
    }
    out
}

fn default_output() -> PathBuf {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "node".into(), |h| h.trim().to_string());
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    PathBuf::from(format!("edgevx-bugtool-{host}-{secs}.tar.gz"))
}

/// `edgevx status --json`'s answer, as the subcommand gives it (the same
/// binary: what an operator would run).
fn status_json(args: &BugtoolArgs) -> Value {
    let Ok(exe) = std::env::current_exe() else { return Value::Null };
    let out = Command::new(exe)
        .arg("status")
        .arg("--json")
        .arg("--state-dir")
        .arg(&args.paths.state_dir)
        .arg("--bpffs")
        .arg(&args.paths.bpffs)
        .output();
    match out {
        Ok(o) => serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|_| serde_json::json!({ "error": String::from_utf8_lossy(&o.stderr).trim().to_string() })),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// Writes the parts into `dir/<top>/` and archives them into `output`.
fn archive(dir: &Path, top: &str, parts: &[Part], output: &Path) -> Result<()> {
    for part in parts {
        let path = dir.join(top).join(&part.name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        fs::write(&path, scrub(&fill(&part.what))).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let out = Command::new("tar")
        .arg("-czf")
        .arg(output)
        .arg("-C")
        .arg(dir)
        .arg(top)
        .output()
        .context("cannot run tar (bugtool archives with the host's tar and gzip)")?;
    if !out.status.success() {
        bail!("tar failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

pub fn run(args: BugtoolArgs) -> Result<()> {
    let output = args.output.clone().unwrap_or_else(default_output);
    let output = if output.is_absolute() {
        output
    } else {
        std::env::current_dir().context("cannot read the current directory")?.join(output)
    };
    let top = output
        .file_name()
        .and_then(|n| n.to_str())
        .map_or("edgevx-bugtool", |n| n.trim_end_matches(".tar.gz").trim_end_matches(".tgz"))
        .to_string();
    let dir = std::env::temp_dir().join(format!("edgevx-bugtool-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let status = status_json(&args);
    let result = archive(&dir, &top, &parts(&args, &status), &output);
    let _ = fs::remove_dir_all(&dir);
    result?;
    eprintln!("edgevx bugtool: wrote {}", output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_keys_and_tokens_never_reach_the_archive() {
        let text = "a\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA\n-----END EC PRIVATE KEY-----\nb\n\
                    token: eyJhbGciOi\nETCD_PASSWORD=hunter2\n-----BEGIN CERTIFICATE-----\nMIIB\n";
        let s = scrub(text);
        assert!(!s.contains("MHcCAQEEIA") && !s.contains("eyJhbGciOi") && !s.contains("hunter2"), "{s}");
        assert!(s.contains("a\n[private key removed by edgevx bugtool]\nb\n"), "{s}");
        assert!(s.contains("token: [removed by edgevx bugtool]"), "{s}");
        // a certificate is public: it stays
        assert!(s.contains("MIIB"), "{s}");
    }
}
