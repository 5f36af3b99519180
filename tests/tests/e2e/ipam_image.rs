//! The image `cargo xtask image` builds carries edgevx-ipam, and the
//! DaemonSet's init container, run by podman from that image as the kubelet
//! runs it, installs a plugin that works on the node. The image is the
//! archive in `EDGEVX_IMAGE_ARCHIVE` (set by `cargo xtask test`), else
//! `target/image/edgevx-<version>-<arch>.oci.tar`. podman keeps its storage
//! in a directory of the test's own.
use std::{
    fs,
    io::Write,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    ipam::{DataDir, Plugin, pod_args, v4_ranges},
    unique,
};
use serde::Deserialize;
use serde_json::{Value, json};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn archive() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("EDGEVX_IMAGE_ARCHIVE") {
        return Ok(PathBuf::from(path));
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no image architecture for {other}"),
    };
    let path = repo(&format!("target/image/edgevx-{}-{arch}.oci.tar", env!("CARGO_PKG_VERSION")));
    ensure!(path.is_file(), "no image: set EDGEVX_IMAGE_ARCHIVE or run `cargo xtask image` (no {})", path.display());
    Ok(path)
}

/// podman with this machine's working options (platform.md), storage of its own.
struct Podman(PathBuf);

impl Podman {
    fn output(&self, args: &[&str]) -> Result<Output> {
        Command::new("podman")
            .arg("--root")
            .arg(self.0.join("root"))
            .arg("--runroot")
            .arg(self.0.join("run"))
            .arg("--tmpdir")
            .arg(self.0.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--runtime",
                "runc",
                "--cgroup-manager=cgroupfs",
                "--events-backend=file",
            ])
            .args(args)
            .output()
            .with_context(|| format!("cannot run podman {args:?}"))
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        ensure!(out.status.success(), "podman {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.output(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.output(&["rmi", "--all", "--force"]);
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = self.0.to_string_lossy().into_owned();
        for at in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|p| p.starts_with(&prefix)) {
            let _ = Command::new("umount").arg("-l").arg(at).output();
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn ipam_image_init_container_installs_a_working_plugin() -> Result<()> {
    let text = fs::read_to_string(repo("deploy/base/daemonset.yaml"))?;
    let ds = Value::deserialize(serde_yaml_ng::Deserializer::from_str(&text).next().context("empty daemonset.yaml")?)?;
    let init = ds["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["command"][0] == "/usr/local/bin/edgevx-ipam" && c["args"][0] == "install")
        .context("no init container runs edgevx-ipam install")?;
    let image = init["image"].as_str().context("no image")?;
    let args: Vec<&str> = init["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    ensure!(args.last() == Some(&"/opt/cni/bin"), "the init container installs into {args:?}");

    let podman = Podman(std::env::temp_dir().join(unique("ipampodman")));
    fs::create_dir_all(&podman.0)?;
    podman.run(&["load", "--quiet", "--input", &archive()?.to_string_lossy()])?;
    let node_bin = DataDir::new("ipamnodebin")?; // the node's /opt/cni/bin
    let volume = format!("--volume={}:/opt/cni/bin", node_bin.0.display());
    let entrypoint = format!("--entrypoint={}", serde_json::to_string(&init["command"])?);
    let mut run = vec!["run", "--rm", "--network=none", "--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"];
    run.extend([volume.as_str(), entrypoint.as_str(), image]);
    run.extend(args.iter().copied());
    podman.run(&run)?;

    // the node runs the installed plugin: a static binary needs nothing of the image
    let installed = node_bin.0.join("edgevx-ipam");
    ensure!(installed.is_file(), "nothing at {}", installed.display());
    let data = DataDir::new("ipamimgdata")?;
    let config = edgevx_tests::ipam::config(Plugin::EdgevxIpam, "1.1.0", &data, v4_ranges(), json!({}));
    let mut child = Command::new(&installed)
        .env_clear()
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/c1"),
            ("CNI_IFNAME", "eth0"),
        ])
        .env("CNI_ARGS", pod_args("default", "web-0"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(&serde_json::to_vec(&config)?)?;
    let out = child.wait_with_output()?;
    let result: Value = serde_json::from_slice(&out.stdout).context("no CNI result")?;
    ensure!(out.status.success() && result["ips"][0]["address"] == "10.244.1.2/24", "{result}");
    Ok(())
}
