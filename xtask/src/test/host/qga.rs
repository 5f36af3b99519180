//! The QEMU guest agent (`qemu-ga`, Debian's qemu-guest-agent in the
//! guest), spoken over the virtio-serial port QEMU exposes as a unix socket:
//! how the host runs commands in the guest and reads what they print.
//!
//! The protocol is QMP's: one JSON object a line each way. The guest's end
//! of the port outlives nothing: a reboot kills the agent, and what the host
//! wrote meanwhile may reach the next one. So before every command the
//! stream is brought in step with `guest-sync-delimited` (a 0xFF byte resets
//! the agent's parser; the answer carrying our fresh id ends everything
//! older), and only then is the command sent.
use std::{
    io::{ErrorKind, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

pub use base64::decode;

/// How long one attempt at getting in step waits for its answer.
const SYNC_ATTEMPT: Duration = Duration::from_secs(3);

/// A connection to the guest agent's socket.
pub struct GuestAgent {
    stream: UnixStream,
    /// Bytes read past the last full line.
    pending: Vec<u8>,
    next_id: u64,
}

/// What a command run in the guest left.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stdout and stderr, for messages.
    pub fn both(&self) -> String {
        match (self.stdout.trim(), self.stderr.trim()) {
            (o, "") => o.to_string(),
            ("", e) => e.to_string(),
            (o, e) => format!("{o}\n{e}"),
        }
    }
}

impl GuestAgent {
    /// Connects to QEMU's socket (QEMU creates it when it starts).
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Self> {
        let since = Instant::now();
        loop {
            match UnixStream::connect(socket) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(Duration::from_millis(250)))?;
                    return Ok(GuestAgent { stream, pending: Vec::new(), next_id: std::process::id().into() });
                }
                Err(e) if since.elapsed() > timeout => {
                    return Err(e).with_context(|| format!("cannot connect to {}", socket.display()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Gets in step with the agent: true once it answered, false if it did
    /// not within [`SYNC_ATTEMPT`] (not running yet, or rebooting).
    pub fn try_sync(&mut self) -> Result<bool> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = vec![0xFF];
        msg.extend(serde_json::to_vec(&json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}))?);
        msg.push(b'\n');
        self.stream.write_all(&msg).context("cannot write to the guest agent's socket (QEMU gone?)")?;
        let deadline = Instant::now() + SYNC_ATTEMPT;
        while let Some(line) = self.read_line(deadline)? {
            if line.get("return").and_then(Value::as_u64) == Some(id) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Gets in step, retrying until `timeout`.
    pub fn sync(&mut self, timeout: Duration) -> Result<()> {
        let since = Instant::now();
        while !self.try_sync()? {
            if since.elapsed() > timeout {
                bail!("the guest agent did not answer within {} s", timeout.as_secs());
            }
        }
        Ok(())
    }

    /// Sends one command, once in step, and returns its `return`.
    fn request(&mut self, command: Value, timeout: Duration) -> Result<Value> {
        self.sync(timeout)?;
        let mut msg = serde_json::to_vec(&command)?;
        msg.push(b'\n');
        self.stream.write_all(&msg).context("cannot write to the guest agent's socket")?;
        let deadline = Instant::now() + timeout;
        while let Some(line) = self.read_line(deadline)? {
            if let Some(r) = line.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = line.get("error") {
                bail!("the guest agent refused {}: {e}", command["execute"]);
            }
        }
        bail!("the guest agent did not answer {} within {} s", command["execute"], timeout.as_secs())
    }

    /// Starts `/bin/sh -c script` in the guest, `input` on its stdin;
    /// returns its pid there.
    pub fn spawn(&mut self, script: &str, input: Option<&[u8]>) -> Result<u64> {
        let mut args = json!({"path": "/bin/sh", "arg": ["-c", script], "capture-output": true});
        if let Some(input) = input {
            args["input-data"] = Value::String(base64::encode(input));
        }
        let r = self.request(json!({"execute": "guest-exec", "arguments": args}), Duration::from_secs(60))?;
        r["pid"].as_u64().context("guest-exec returned no pid")
    }

    /// Runs `/bin/sh -c script` in the guest and waits for it, at most `timeout`.
    pub fn exec(&mut self, script: &str, input: Option<&[u8]>, timeout: Duration) -> Result<Output> {
        let pid = self.spawn(script, input)?;
        let since = Instant::now();
        loop {
            let r = self
                .request(json!({"execute": "guest-exec-status", "arguments": {"pid": pid}}), Duration::from_secs(60))?;
            if r["exited"] == true {
                let text = |k: &str| -> Result<String> {
                    let data = r[k].as_str().map(base64::decode).transpose()?.unwrap_or_default();
                    Ok(String::from_utf8_lossy(&data).into_owned())
                };
                // no exit code: killed by a signal
                let code = r["exitcode"].as_i64().map_or(-1, |c| c as i32);
                return Ok(Output { code, stdout: text("out-data")?, stderr: text("err-data")? });
            }
            if since.elapsed() > timeout {
                bail!("`{script}` did not end within {} s in the guest", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The next JSON line, or `None` at `deadline`. Lines that are not JSON
    /// (the 0xFF the agent puts before a delimited answer) are cleaned of it.
    fn read_line(&mut self, deadline: Instant) -> Result<Option<Value>> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).filter(|&b| b != 0xFF && b != b'\n').collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice(&line) {
                    Ok(v) => return Ok(Some(v)),
                    Err(_) => continue,
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            let mut buf = [0u8; 65536];
            match self.stream.read(&mut buf) {
                Ok(0) => bail!("the guest agent's socket closed (QEMU exited)"),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("cannot read the guest agent's socket"),
            }
        }
    }
}

/// Standard base64 (RFC 4648, padded): what guest-exec's data fields carry.
mod base64 {
    use anyhow::{Result, bail};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(text.len() / 4 * 3);
        let (mut acc, mut bits) = (0u32, 0);
        for c in text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
            let Some(v) = ALPHABET.iter().position(|&a| a == c) else {
                bail!("not base64: {:?}", c as char);
            };
            acc = acc << 6 | v as u32;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn round_trips_and_matches_rfc_4648() {
            for (plain, coded) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
                assert_eq!(encode(plain.as_bytes()), coded);
                assert_eq!(decode(coded).unwrap(), plain.as_bytes());
            }
            let all: Vec<u8> = (0..=255).collect();
            assert_eq!(decode(&encode(&all)).unwrap(), all);
            assert!(decode("a*b").is_err());
        }
    }
}
