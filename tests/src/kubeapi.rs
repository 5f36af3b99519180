//! A stand-in for kube-apiserver's Node API, for tests only (no real API
//! server can be installed here). It speaks the wire protocol a client
//! sees: list with resourceVersion, watch streams with ADDED / MODIFIED /
//! DELETED / BOOKMARK events, `410 Gone` (an ERROR event, reason Expired)
//! when told to, get, and strategic-merge patches on `nodes/<name>/status`,
//! which it records. The listener lives in a chosen network namespace, so
//! an agent inside that namespace reaches it on 127.0.0.1.
use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    path::Path,
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// A request the server received that changed something.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub user_agent: String,
    pub body: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    nodes: BTreeMap<String, Value>,
    /// (resourceVersion, watch event line)
    events: Vec<(u64, String)>,
    patches: Vec<Recorded>,
    user_agents: Vec<String>,
    gone_next_watch: bool,
    lists: u32,
    down: bool,
}

#[derive(Clone)]
pub struct KubeApi {
    state: Arc<(Mutex<State>, Condvar)>,
    pub port: u16,
}

fn with_rv(mut node: Value, rv: u64) -> Value {
    node["metadata"]["resourceVersion"] = json!(rv.to_string());
    node
}

impl KubeApi {
    /// Serves on 127.0.0.1 inside network namespace `netns`.
    pub fn start_in(netns: &str) -> Result<Self> {
        let state = Arc::new((Mutex::new(State { rv: 100, ..State::default() }), Condvar::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let path = format!("/var/run/netns/{netns}");
        let st = state.clone();
        thread::spawn(move || {
            let bound = (|| -> Result<TcpListener> {
                let f = File::open(&path).with_context(|| format!("cannot open {path}"))?;
                // SAFETY: setns on this thread only; the fd is valid.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns: {}", std::io::Error::last_os_error());
                }
                Ok(TcpListener::bind("127.0.0.1:0")?)
            })();
            let listener = match bound {
                Ok(l) => {
                    let _ = tx.send(l.local_addr().map(|a| a.port()).map_err(anyhow::Error::from));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            for conn in listener.incoming().flatten() {
                let st = st.clone();
                thread::spawn(move || {
                    let _ = serve(conn, st);
                });
            }
        });
        let port = rx.recv().context("server thread died")??;
        Ok(KubeApi { state, port })
    }

    pub fn kubeconfig(&self, path: &Path) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: http://127.0.0.1:{}\nusers:\n- name: mock\n  user: {{}}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\ncurrent-context: mock\n",
            self.port
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            f(&mut s);
        }
        cv.notify_all();
    }

    /// Adds or replaces a node (ADDED or MODIFIED).
    pub fn put_node(&self, node: Value) {
        self.change(|s| {
            let name = node["metadata"]["name"].as_str().unwrap_or_default().to_string();
            s.rv += 1;
            let obj = with_rv(node, s.rv);
            let kind = if s.nodes.contains_key(&name) { "MODIFIED" } else { "ADDED" };
            s.events.push((s.rv, json!({"type": kind, "object": obj}).to_string()));
            s.nodes.insert(name, obj);
        });
    }

    pub fn delete_node(&self, name: &str) {
        self.change(|s| {
            if let Some(obj) = s.nodes.remove(name) {
                s.rv += 1;
                let obj = with_rv(obj, s.rv);
                s.events.push((s.rv, json!({"type": "DELETED", "object": obj}).to_string()));
            }
        });
    }

    /// The next watch gets `410 Gone` (the client must list again).
    pub fn expire_watches(&self) {
        self.change(|s| s.gone_next_watch = true);
    }

    /// While down, every request is refused with 503.
    pub fn set_down(&self, down: bool) {
        self.change(|s| s.down = down);
    }

    pub fn patches(&self) -> Vec<Recorded> {
        self.state.0.lock().map(|s| s.patches.clone()).unwrap_or_default()
    }
    pub fn lists(&self) -> u32 {
        self.state.0.lock().map(|s| s.lists).unwrap_or(0)
    }
    pub fn user_agents(&self) -> Vec<String> {
        self.state.0.lock().map(|s| s.user_agents.clone()).unwrap_or_default()
    }
    pub fn node(&self, name: &str) -> Option<Value> {
        self.state.0.lock().ok().and_then(|s| s.nodes.get(name).cloned())
    }

    /// Waits until `f` holds for the recorded patches.
    pub fn wait_patches(&self, timeout: Duration, f: impl Fn(&[Recorded]) -> bool) -> Result<Vec<Recorded>> {
        let deadline = Instant::now() + crate::patience(timeout);
        loop {
            let p = self.patches();
            if f(&p) {
                return Ok(p);
            }
            if Instant::now() > deadline {
                bail!("patches never matched: {p:#?}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

fn respond(conn: &mut TcpStream, code: u16, body: &Value) -> Result<()> {
    let text = body.to_string();
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        410 => "Gone",
        _ => "Error",
    };
    write!(
        conn,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )?;
    Ok(())
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn query(target: &str) -> BTreeMap<String, String> {
    target
        .split_once('?')
        .map(|(_, q)| {
            q.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
        })
        .unwrap_or_default()
}

/// Applies a strategic merge patch the way the API does for Node status:
/// maps merge, `status.conditions` merge by `type`.
fn merge(node: &mut Value, patch: &Value) {
    if let Some(ann) = patch.pointer("/metadata/annotations").and_then(Value::as_object) {
        for (k, v) in ann {
            node["metadata"]["annotations"][k] = v.clone();
        }
    }
    if let Some(conds) = patch.pointer("/status/conditions").and_then(Value::as_array) {
        let mut have: Vec<Value> =
            node.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        for c in conds {
            have.retain(|h| h["type"] != c["type"]);
            have.push(c.clone());
        }
        node["status"]["conditions"] = json!(have);
    }
}

fn serve(mut conn: TcpStream, st: Arc<(Mutex<State>, Condvar)>) -> Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body)?;
        let path = target.split('?').next().unwrap_or("").to_string();
        let q = query(&target);
        let (m, cv) = &*st;
        {
            let mut s = m.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            s.user_agents.push(headers.get("user-agent").cloned().unwrap_or_default());
            if s.down {
                drop(s);
                respond(&mut conn, 503, &status(503, "ServiceUnavailable", "down for the test"))?;
                continue;
            }
        }
        match (method.as_str(), path.as_str()) {
            ("GET", "/api/v1/nodes") if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                let from: u64 = q.get("resourceVersion").and_then(|r| r.parse().ok()).unwrap_or(0);
                let timeout = q.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(290u64);
                write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                )?;
                let chunk = |conn: &mut TcpStream, line: &str| -> std::io::Result<()> {
                    let data = format!("{line}\n");
                    write!(conn, "{:x}\r\n{data}\r\n", data.len())?;
                    conn.flush()
                };
                let deadline = Instant::now() + Duration::from_secs(timeout);
                let mut sent = from;
                let mut guard = m.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if guard.gone_next_watch {
                    guard.gone_next_watch = false;
                    drop(guard);
                    chunk(
                        &mut conn,
                        &json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")})
                            .to_string(),
                    )?;
                    write!(conn, "0\r\n\r\n")?;
                    return Ok(());
                }
                let mut last_bookmark = Instant::now();
                loop {
                    let new: Vec<(u64, String)> = guard.events.iter().filter(|(rv, _)| *rv > sent).cloned().collect();
                    let rv = guard.rv;
                    let expire = guard.gone_next_watch;
                    let down = guard.down;
                    drop(guard);
                    for (rv, line) in &new {
                        chunk(&mut conn, line)?;
                        sent = *rv;
                    }
                    if expire || down || Instant::now() > deadline {
                        write!(conn, "0\r\n\r\n")?;
                        return Ok(());
                    }
                    if last_bookmark.elapsed() > Duration::from_millis(500) {
                        let bm = json!({"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}}});
                        chunk(&mut conn, &bm.to_string())?;
                        last_bookmark = Instant::now();
                    }
                    guard = m.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    guard =
                        cv.wait_timeout(guard, Duration::from_millis(200)).map_err(|_| anyhow::anyhow!("poisoned"))?.0;
                }
            }
            ("GET", "/api/v1/nodes") => {
                let list = {
                    let mut s = m.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    s.lists += 1;
                    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": s.rv.to_string()}, "items": s.nodes.values().cloned().collect::<Vec<_>>()})
                };
                respond(&mut conn, 200, &list)?;
            }
            ("GET", p) if p.starts_with("/api/v1/nodes/") => {
                let name = &p["/api/v1/nodes/".len()..];
                let node = m.lock().ok().and_then(|s| s.nodes.get(name).cloned());
                match node {
                    Some(n) => respond(&mut conn, 200, &n)?,
                    None => respond(&mut conn, 404, &status(404, "NotFound", &format!("nodes \"{name}\" not found")))?,
                }
            }
            ("PATCH", p) if p.starts_with("/api/v1/nodes/") && p.ends_with("/status") => {
                let name = p["/api/v1/nodes/".len()..p.len() - "/status".len()].to_string();
                let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let result = {
                    let mut s = m.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    s.patches.push(Recorded {
                        method: method.clone(),
                        path: p.to_string(),
                        content_type: headers.get("content-type").cloned().unwrap_or_default(),
                        user_agent: headers.get("user-agent").cloned().unwrap_or_default(),
                        body: patch.clone(),
                    });
                    match s.nodes.get(&name).cloned() {
                        Some(mut n) => {
                            merge(&mut n, &patch);
                            s.rv += 1;
                            let n = with_rv(n, s.rv);
                            let rv = s.rv;
                            s.events.push((rv, json!({"type": "MODIFIED", "object": n}).to_string()));
                            s.nodes.insert(name.clone(), n.clone());
                            Some(n)
                        }
                        None => None,
                    }
                };
                cv.notify_all();
                match result {
                    Some(n) => respond(&mut conn, 200, &n)?,
                    None => respond(&mut conn, 404, &status(404, "NotFound", "no such node"))?,
                }
            }
            _ => respond(&mut conn, 404, &status(404, "NotFound", &format!("{method} {path} is not served here")))?,
        }
    }
}
