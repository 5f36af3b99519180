//! A real etcd (Debian's etcd-server) for the tests, listening on the
//! underlay inside the switch namespace (198.18.0.254:2379), so every node
//! namespace reaches it and a node can be cut off from it with a firewall rule.
//! Plain HTTP, or TLS with client-certificate auth ([`Etcd::start_tls`]).
use std::{
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{netns::Netns, pki::Pki, topo::Cluster};

pub const ADDR: &str = "198.18.0.254";
pub const ENDPOINT: &str = "http://198.18.0.254:2379";
/// The endpoint of an etcd started with [`Etcd::start_tls`].
pub const TLS_ENDPOINT: &str = "https://198.18.0.254:2379";
pub const PREFIX: &str = "/coreos.com/network";

/// What a TLS etcd and its etcdctl are given.
struct Tls {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

pub struct Etcd {
    ns: String,
    dir: PathBuf,
    child: Option<Child>,
    tls: Option<Tls>,
}

impl Etcd {
    pub fn start(c: &Cluster) -> Result<Self> {
        Self::start_with(c, None)
    }

    /// An etcd on [`TLS_ENDPOINT`] that requires a client certificate
    /// signed by `pki.ca` (`--client-cert-auth`).
    pub fn start_tls(c: &Cluster, pki: &Pki) -> Result<Self> {
        Self::start_with(
            c,
            Some(Tls {
                ca: pki.ca.clone(),
                server: (pki.server.cert.clone(), pki.server.key.clone()),
                client: (pki.client.cert.clone(), pki.client.key.clone()),
            }),
        )
    }

    fn start_with(c: &Cluster, tls: Option<Tls>) -> Result<Self> {
        if !c.switch.ip(&["addr", "show", "dev", "br0"])?.contains(ADDR) {
            c.switch.ip(&["addr", "add", &format!("{ADDR}/24"), "dev", "br0"])?;
        }
        let mut e = Etcd { ns: c.switch.name.clone(), dir: c.dir.join("etcd"), child: None, tls };
        e.resume()?;
        Ok(e)
    }

    fn endpoint(&self) -> &'static str {
        if self.tls.is_some() { TLS_ENDPOINT } else { ENDPOINT }
    }

    fn netns(&self) -> Netns {
        // a non-owning handle: Netns deletes on drop, so forget it after use
        Netns { name: self.ns.clone() }
    }

    /// Starts (again) on the same data dir and waits until it answers.
    pub fn resume(&mut self) -> Result<()> {
        let ns = self.netns();
        let log = std::fs::File::create(self.dir.with_extension("log"))?;
        let mut cmd = ns.cmd("etcd");
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file").arg(&t.server.0).arg("--key-file").arg(&t.server.1);
            cmd.arg("--client-cert-auth").arg("--trusted-ca-file").arg(&t.ca);
        }
        let endpoint = self.endpoint();
        let child = cmd
            .args(["--name", "test", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", endpoint, "--advertise-client-urls", endpoint])
            .args([
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
            ])
            .args(["--initial-cluster", "test=http://127.0.0.1:2380"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        std::mem::forget(ns);
        self.child = Some(child.context("cannot start etcd (is etcd-server installed?)")?);
        let deadline = Instant::now() + crate::patience(Duration::from_secs(15));
        while Instant::now() < deadline {
            if self.ctl(&["endpoint", "health"]).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "etcd did not become healthy: {}",
            std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
        )
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `etcdctl ARGS` against this server (v3 API).
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let ns = self.netns();
        let mut cmd = ns.cmd("etcdctl");
        cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoint()));
        if let Some(t) = &self.tls {
            cmd.arg("--cacert").arg(&t.ca).arg("--cert").arg(&t.client.0).arg("--key").arg(&t.client.1);
        }
        let out = cmd.args(args).output();
        std::mem::forget(ns);
        let out = out?;
        if !out.status.success() {
            bail!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        self.ctl(&["put", key, value]).map(|_| ())
    }

    /// Puts every `(key, value)` in one transaction (`etcdctl txn`): the
    /// keys share one create revision, so etcd cannot say which came first.
    pub fn put_in_one_txn(&self, kvs: &[(&str, &str)]) -> Result<()> {
        use std::io::Write;
        let ns = self.netns();
        let mut cmd = ns.cmd("etcdctl");
        cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoint()));
        if let Some(t) = &self.tls {
            cmd.arg("--cacert").arg(&t.ca).arg("--cert").arg(&t.client.0).arg("--key").arg(&t.client.1);
        }
        let child = cmd.arg("txn").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        std::mem::forget(ns);
        let mut child = child.context("cannot start etcdctl txn")?;
        // no compares, then the success ops (values quoted), then no failure ops:
        let mut input = String::from("\n");
        for (k, v) in kvs {
            input.push_str(&format!("put {k} {}\n", serde_json::to_string(v)?));
        }
        // each section ends with an empty line; a missing one is "Error: EOF"
        input.push_str("\n\n");
        child.stdin.take().context("etcdctl txn stdin")?.write_all(input.as_bytes())?;
        let out = child.wait_with_output()?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !said.starts_with("SUCCESS") {
            bail!("etcdctl txn {kvs:?}: {said}{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Each key under `prefix` with its create revision.
    pub fn create_revisions(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let out = self.ctl(&["get", "--prefix", prefix, "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("etcdctl get -w json")?;
        let mut all = Vec::new();
        for kv in v["kvs"].as_array().into_iter().flatten() {
            let key = kv["key"].as_str().context("key")?;
            let key = String::from_utf8(base64_decode(key)?)?;
            all.push((key, kv["create_revision"].as_i64().context("create_revision")?));
        }
        Ok(all)
    }

    /// Keys under `prefix` with their values.
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let out = self.ctl(&["get", "--prefix", prefix])?;
        let lines: Vec<&str> = out.lines().collect();
        Ok(lines.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].to_string(), c[1].to_string())).collect())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// etcdctl's JSON gives keys in standard base64.
fn base64_decode(s: &str) -> Result<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).with_context(|| format!("not base64: {s:?}"))? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}
