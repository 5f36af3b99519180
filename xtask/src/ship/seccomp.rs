//! `cargo xtask seccomp`: deploy/seccomp/edgevx.json, the seccomp profile the
//! DaemonSet states (`Localhost`), generated from the container runtime's
//! own default and checked by `cargo xtask test`.
//!
//! The runtime's default (Debian's containers-common,
//! /usr/share/containers/seccomp.json, the one podman applies) allows `bpf()`
//! only to containers that hold CAP_SYS_ADMIN, so with the DaemonSet's two
//! capabilities edgevx cannot create a map (EPERM). The profile is that
//! default, changed in one place: `bpf()` is allowed for exactly the commands
//! in [`BPF_COMMANDS`], whatever the capabilities (the kernel still demands
//! CAP_BPF or CAP_NET_ADMIN per command). Any other `bpf()` command gets the
//! default's answer for what it does not list, ENOSYS.
use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{deps::packages, exec};

/// The runtime's default profile the edgevx profile starts from.
pub const BASE: &str = "/usr/share/containers/seccomp.json";

/// The `bpf()` commands edgevx issues (numbers from include/uapi/linux/bpf.h).
/// Measured with `strace -f -e trace=bpf` across runs, restarts after kill -9,
/// a layout upgrade, the clsact fallback, `status` and `cleanup`; aya's feature
/// probes at load are among them (BTF_LOAD, PROG_LOAD, LINK_CREATE), and
/// aya freezes the read-only data map that carries the programs' load-time
/// constants (MAP_FREEZE).
pub const BPF_COMMANDS: &[(&str, u32)] = &[
    ("BPF_MAP_CREATE", 0),
    ("BPF_MAP_LOOKUP_ELEM", 1),
    ("BPF_MAP_UPDATE_ELEM", 2),
    ("BPF_MAP_DELETE_ELEM", 3),
    ("BPF_MAP_GET_NEXT_KEY", 4),
    ("BPF_PROG_LOAD", 5),
    ("BPF_OBJ_PIN", 6),
    ("BPF_OBJ_GET", 7),
    ("BPF_OBJ_GET_INFO_BY_FD", 15),
    // the TCX chain's programs, in order: the agent's decap-first check and
    // `edgevx status` (without it, status in the pod read "NOT attached")
    ("BPF_PROG_QUERY", 16),
    ("BPF_BTF_LOAD", 18),
    ("BPF_MAP_FREEZE", 22),
    ("BPF_LINK_CREATE", 28),
    ("BPF_LINK_UPDATE", 29),
];

/// The profile's place in the repository; the DaemonSet names its file name
/// as `localhostProfile`, relative to the kubelet's seccomp directory.
pub fn path() -> PathBuf {
    exec::workspace_root().join("deploy/seccomp/edgevx.json")
}

/// `cargo xtask seccomp`: writes the profile from the installed default.
pub fn write() -> Result<()> {
    packages::ensure_image()?;
    let text = generate()?;
    let path = path();
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("xtask: wrote {} from {BASE}", path.display());
    Ok(())
}

/// Fails, naming the file, when the profile in deploy/ is not what
/// [`generate`] makes from the installed default.
pub fn check() -> Result<()> {
    let path = path();
    let committed = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if committed != generate()? {
        bail!(
            "{} is not {BASE} plus edgevx's bpf() commands (edited by hand, or the runtime's default changed): \
             run `cargo xtask seccomp` and review the difference",
            path.display()
        );
    }
    Ok(())
}

/// The profile: the installed default, with `bpf()` opened for [`BPF_COMMANDS`].
pub fn generate() -> Result<String> {
    let text =
        fs::read_to_string(BASE).with_context(|| format!("missing: {BASE} (Debian package {})", BASE_PACKAGE))?;
    let base: Value = serde_json::from_str(&text).with_context(|| format!("{BASE} is not JSON"))?;
    let profile = extend(base)?;
    let mut out = serde_json::to_string_pretty(&profile).context("cannot print the profile")?;
    out.push('\n');
    Ok(out)
}

const BASE_PACKAGE: &str = "golang-github-containers-common";

fn extend(mut profile: Value) -> Result<Value> {
    let syscalls = profile["syscalls"].as_array_mut().with_context(|| format!("{BASE} has no \"syscalls\" list"))?;
    // A rule that names bpf() without conditions would decide every call:
    // libseccomp lets an unconditional rule win over conditional ones. So
    // bpf() leaves the default's deny rule (errno EPERM unless CAP_SYS_ADMIN);
    // the default's allow for CAP_SYS_ADMIN stays as it is.
    let mut denied = false;
    for rule in syscalls.iter_mut() {
        let unconditional = rule["args"].as_array().is_none_or(|a| a.is_empty());
        let allows = rule["action"] == "SCMP_ACT_ALLOW";
        if let Some(names) = rule["names"].as_array_mut()
            && unconditional
            && !allows
            && names.iter().any(|n| n == "bpf")
        {
            names.retain(|n| n != "bpf");
            denied = true;
        }
    }
    if !denied {
        bail!("{BASE} has no rule that denies bpf(): it is not the default this profile was made for; review it");
    }
    syscalls.retain(|r| r["names"].as_array().is_none_or(|n| !n.is_empty()));
    for (name, cmd) in BPF_COMMANDS {
        // the command is an int: compare its low 32 bits only
        syscalls.push(json!({
            "names": ["bpf"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": 0xffff_ffffu32, "valueTwo": cmd, "op": "SCMP_CMP_MASKED_EQ"}],
            "comment": format!("edgevx: {name}"),
            "includes": {},
            "excludes": {},
        }));
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": []},
                {"names": ["bpf", "setns"], "action": "SCMP_ACT_ALLOW", "args": [],
                 "includes": {"caps": ["CAP_SYS_ADMIN"]}},
                {"names": ["bpf", "setns"], "action": "SCMP_ACT_ERRNO", "args": [],
                 "excludes": {"caps": ["CAP_SYS_ADMIN"]}, "errnoRet": 1},
                {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "args": []},
            ]
        })
    }

    #[test]
    fn bpf_leaves_the_deny_rules_and_gets_one_allow_per_command() -> Result<()> {
        let p = extend(base())?;
        let rules = p["syscalls"].as_array().context("syscalls")?;
        assert_eq!(rules[1]["names"], json!(["bpf", "setns"]), "the CAP_SYS_ADMIN allow is kept");
        assert_eq!(rules[2]["names"], json!(["setns"]));
        assert!(rules.iter().all(|r| r["names"] != json!([])), "an emptied rule is dropped");
        let bpf: Vec<&Value> = rules[3..].iter().collect();
        assert_eq!(bpf.len(), BPF_COMMANDS.len());
        assert!(bpf.iter().all(|r| r["names"] == json!(["bpf"]) && r["action"] == "SCMP_ACT_ALLOW"));
        assert_eq!(
            bpf[0]["args"][0],
            json!({"index": 0, "value": 4294967295u32, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"})
        );
        Ok(())
    }

    #[test]
    fn a_default_without_a_bpf_deny_is_refused() {
        let mut b = base();
        b["syscalls"] = json!([{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": []}]);
        assert!(extend(b).is_err());
    }
}
