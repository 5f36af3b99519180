//! Pod-to-pod traffic checks: ping, a TCP transfer verified by digest, and
//! UDP datagrams verified byte for byte (the `edgevx-testpeer` binary).
use std::{
    io::{BufRead, BufReader},
    net::IpAddr,
    path::PathBuf,
    process::{Child, Stdio},
};

use anyhow::{Context, Result, bail, ensure};

use crate::netns::Netns;

/// Ping counts: (transmitted, received).
pub fn ping(from: &Netns, to: impl Into<IpAddr>, count: u32, interval: &str) -> Result<(u32, u32)> {
    let to: IpAddr = to.into();
    let out =
        from.output(&["ping", "-n", "-q", "-c", &count.to_string(), "-i", interval, "-W", "1", &to.to_string()])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("transmitted")).with_context(|| format!("no ping summary: {text}"))?;
    let nums: Vec<u32> = line.split(',').filter_map(|p| p.split_whitespace().next()?.parse().ok()).collect();
    ensure!(nums.len() >= 2, "cannot read ping summary {line:?}");
    Ok((nums[0], nums[1]))
}

/// Waits until `to` answers a ping from `from` (up to `tries` seconds).
pub fn wait_reachable(from: &Netns, to: impl Into<IpAddr>, tries: u32) -> Result<()> {
    let to: IpAddr = to.into();
    let tries = crate::patience(std::time::Duration::from_secs(tries.into())).as_secs() as u32;
    for _ in 0..tries {
        if ping(from, to, 1, "0.2")?.1 == 1 {
            return Ok(());
        }
    }
    bail!("{to} is not reachable from {} after {tries} tries", from.name)
}

/// A ping running in the background across some event (a restart, an
/// upgrade, an outage), checked for loss when it ends.
pub struct BackgroundPing {
    child: Child,
    count: u32,
}

impl BackgroundPing {
    pub fn start(from: &Netns, to: impl Into<IpAddr>, count: u32, interval: &str) -> Result<Self> {
        let to: IpAddr = to.into();
        let child = from
            .cmd("ping")
            .args(["-n", "-q", "-c", &count.to_string(), "-i", interval, "-W", "1", &to.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start ping")?;
        Ok(BackgroundPing { child, count })
    }

    /// Waits for the last ping; returns how many of them got no reply.
    pub fn lost(self) -> Result<u32> {
        let out = self.child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line =
            text.lines().find(|l| l.contains("transmitted")).with_context(|| format!("no ping summary: {text}"))?;
        let nums: Vec<u32> = line.split(',').filter_map(|p| p.split_whitespace().next()?.parse().ok()).collect();
        ensure!(nums.len() >= 2 && nums[0] == self.count, "cannot read ping summary {line:?}");
        Ok(nums[0] - nums[1])
    }

    /// Waits for the last ping; fails with ping's summary if any reply was lost.
    pub fn expect_no_loss(self) -> Result<()> {
        let out = self.child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!("{0} packets transmitted, {0} received", self.count);
        ensure!(text.contains(&want), "pings were lost: {}", text.trim());
        Ok(())
    }
}

pub struct Peer {
    pub bin: PathBuf,
}

struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Peer {
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Peer { bin: bin.into() }
    }

    fn bin(&self) -> &str {
        self.bin.to_str().unwrap_or("edgevx-testpeer")
    }

    /// Starts a receiver and waits for its "ready".
    fn listen(&self, ns: &Netns, args: &[&str]) -> Result<(Reaped, BufReader<std::process::ChildStdout>)> {
        let mut child =
            ns.cmd(self.bin()).args(args).stdout(Stdio::piped()).spawn().context("cannot start receiver")?;
        let mut out = BufReader::new(child.stdout.take().context("no stdout")?);
        let child = Reaped(child);
        let mut line = String::new();
        out.read_line(&mut line)?;
        ensure!(line.trim() == "ready", "receiver did not start: {line:?}");
        Ok((child, out))
    }

    /// Sends `bytes` over TCP from `from` to `to_ip` (in `to`); both ends'
    /// SHA-256 must match.
    pub fn tcp_transfer(&self, from: &Netns, to: &Netns, to_ip: impl Into<IpAddr>, bytes: u64) -> Result<String> {
        self.transfer(from, to, to_ip.into(), bytes, None)
    }

    /// [`Self::tcp_transfer`], given up (an error) when the sender has not
    /// finished within `secs` (a stalled flow would otherwise retransmit
    /// for many minutes).
    pub fn tcp_transfer_within(
        &self,
        from: &Netns,
        to: &Netns,
        to_ip: impl Into<IpAddr>,
        bytes: u64,
        secs: u32,
    ) -> Result<String> {
        self.transfer(from, to, to_ip.into(), bytes, Some(secs))
    }

    fn transfer(&self, from: &Netns, to: &Netns, to_ip: IpAddr, bytes: u64, within: Option<u32>) -> Result<String> {
        let (mut rx, mut out) = self.listen(to, &["tcp-recv", "5201"])?;
        let (ip, n) = (to_ip.to_string(), bytes.to_string());
        let send = [self.bin(), "tcp-send", &ip, "5201", &n];
        let sent = match within {
            // the bound grows with the run's patience: a matrix guest under TCG is slower
            Some(secs) => {
                let secs = crate::patience(std::time::Duration::from_secs(secs.into())).as_secs().to_string();
                from.run(&[&["timeout", &secs][..], &send].concat())?
            }
            None => from.run(&send)?,
        };
        let mut got = String::new();
        out.read_line(&mut got)?;
        let _ = rx.0.wait();
        ensure!(sent.trim() == got.trim(), "TCP digest mismatch: sent {} received {}", sent.trim(), got.trim());
        ensure!(got.starts_with(&format!("{bytes} ")), "received {got:?}, want {bytes} bytes");
        Ok(got.trim().to_string())
    }

    /// Sends `count` datagrams of `size` bytes; returns how many arrived intact.
    pub fn udp_datagrams(
        &self,
        from: &Netns,
        to: &Netns,
        to_ip: impl Into<IpAddr>,
        count: u32,
        size: u32,
    ) -> Result<u32> {
        let to_ip: IpAddr = to_ip.into();
        let (c, s) = (count.to_string(), size.to_string());
        // the receiver gives up after this long without a datagram; the
        // first comes only once the sender's process has started, which under
        // TCG (a matrix guest) takes seconds, so it is waited for patiently
        let idle = crate::patience(std::time::Duration::from_secs(2)).as_millis().to_string();
        let (mut rx, mut out) = self.listen(to, &["udp-recv", "5202", &c, &s, &idle])?;
        from.run(&[self.bin(), "udp-send", &to_ip.to_string(), "5202", &c, &s])?;
        let mut got = String::new();
        out.read_line(&mut got)?;
        let _ = rx.0.wait();
        let mut it = got.split_whitespace().map(|n| n.parse::<u32>());
        let (Some(Ok(good)), Some(Ok(bad))) = (it.next(), it.next()) else { bail!("udp receiver said {got:?}") };
        ensure!(bad == 0, "{bad} datagrams arrived corrupted");
        Ok(good)
    }
}
