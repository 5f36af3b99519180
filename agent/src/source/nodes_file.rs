//! The nodes file: a Kubernetes NodeList as `kubectl get nodes -o json|yaml`
//! prints it. Re-read when inotify says its directory changed (editors that
//! replace the file, `kubectl`-style atomic renames and ConfigMap `..data`
//! swaps all show up there), with a slow stat as a safety net. A file that
//! does not parse as a whole is reported and the last good list stays in
//! force.
use std::{
    fmt,
    fs::File,
    io::BufReader,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::flannel_rules::NodeReader;
use crate::{events::file::DirWatch, metrics::Watching, peer::Desired};

/// The safety net behind inotify (e.g. a file on a filesystem without it).
const STAT_EVERY: Duration = Duration::from_secs(10);
/// Edits arrive as bursts of events; one read after the burst settles.
const SETTLE: Duration = Duration::from_millis(20);
/// YAML is parsed from memory; JSON is streamed item by item, without a limit.
pub const MAX_YAML_BYTES: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum NodesFileError {
    #[error("nodes file {path} does not parse as JSON or YAML: {reason}")]
    Syntax { path: String, reason: String },
    #[error("nodes file {path}: {reason}")]
    Shape { path: String, reason: String },
    #[error(
        "nodes file {path} is YAML of {size} bytes; YAML is limited to {MAX_YAML_BYTES} bytes (write it as JSON, \
         `kubectl get nodes -o json`, which is read as a stream without a limit)"
    )]
    TooBig { path: String, size: u64 },
    #[error("cannot read nodes file {path}: {reason}")]
    Read { path: String, reason: String },
}

/// An object with only `keep` of its fields (each as a [`Value`]); the rest
/// are skipped as they are read, without being built.
struct Fields(&'static [&'static str]);

impl<'de> de::DeserializeSeed<'de> for Fields {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Fields {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.0.contains(&key.as_str()) {
                let v = match key.as_str() {
                    "metadata" => map.next_value_seed(Fields(&["name", "annotations", "creationTimestamp"]))?,
                    "spec" => map.next_value_seed(Fields(&["podCIDR", "podCIDRs"]))?,
                    _ => map.next_value::<Value>()?,
                };
                out.insert(key, v);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Value::Object(out))
    }
    // anything but an object is of no use to flannel's rules (a node that is
    // not an object is rejected there by its missing name)
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// What flannel's rules read from a Node: its name, annotations and pod
/// CIDRs, and its creationTimestamp (when it appeared: it settles a pod
/// CIDR claimed twice, see `reconcile::select`). The status with its image list, most of a Node's size, is never
/// built.
const NODE_FIELDS: Fields = Fields(&["metadata", "spec"]);

/// `items`, slimmed one by one as they are read.
struct Items(Option<Vec<Value>>);

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Items;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"items\" as a list")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(node) = seq.next_element_seed(NODE_FIELDS)? {
                    out.push(node);
                }
                Ok(Items(Some(out)))
            }
        }
        d.deserialize_any(V)
    }
}

/// The top level of a NodeList: `kind` and `items`, the rest skipped.
struct List {
    kind: Option<Value>,
    items: Option<Items>,
}

impl<'de> Deserialize<'de> for List {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = List;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a NodeList object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<List, A::Error> {
                let mut list = List { kind: None, items: None };
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "kind" => list.kind = Some(map.next_value()?),
                        "items" => list.items = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(list)
            }
        }
        d.deserialize_map(V)
    }
}

fn check(list: List, path: &str) -> Result<Vec<Value>, NodesFileError> {
    let shape = |reason: &str| NodesFileError::Shape { path: path.into(), reason: reason.into() };
    let kind = list.kind.as_ref().and_then(Value::as_str).ok_or_else(|| shape("no \"kind\" (want NodeList)"))?;
    if kind != "NodeList" && kind != "List" {
        return Err(shape(&format!("kind is {kind:?}, want NodeList")));
    }
    Ok(list.items.and_then(|i| i.0).unwrap_or_default())
}

fn syntax(path: &str, e: impl fmt::Display) -> NodesFileError {
    let reason = e.to_string();
    if reason.contains("\"items\" as a list") {
        return NodesFileError::Shape { path: path.into(), reason: "\"items\" is not a list".into() };
    }
    NodesFileError::Syntax { path: path.into(), reason }
}

/// Parses a NodeList (kind `NodeList` or `List`) into its items, each cut
/// down to the fields flannel's rules read.
pub fn parse(text: &str, path: &str) -> Result<Vec<Value>, NodesFileError> {
    let list: List = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| syntax(path, e))?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| syntax(path, e))?
    };
    check(list, path)
}

/// Reads and parses the file at `path`: JSON as a stream (memory stays near
/// the size of the slimmed nodes), YAML from memory up to [`MAX_YAML_BYTES`].
pub fn read(path: &Path) -> Result<Vec<Value>, NodesFileError> {
    let name = path.display().to_string();
    let io = |e: std::io::Error| NodesFileError::Read { path: name.clone(), reason: e.to_string() };
    let mut file = BufReader::new(File::open(path).map_err(io)?);
    let first = {
        use std::io::BufRead;
        let buf = file.fill_buf().map_err(io)?;
        buf.iter().copied().find(|b| !b.is_ascii_whitespace())
    };
    if first == Some(b'{') {
        let list: List = serde_json::from_reader(file).map_err(|e| syntax(&name, e))?;
        return check(list, &name);
    }
    let size = file.get_ref().metadata().map_err(io)?.len();
    if size > MAX_YAML_BYTES {
        return Err(NodesFileError::TooBig { path: name, size });
    }
    let text = std::io::read_to_string(file).map_err(io)?;
    parse(&text, &name)
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { ino: m.ino(), len: m.len(), mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128 })
}

/// Sends the desired view now and after every change that parses.
pub fn watch(
    path: PathBuf,
    reader: NodeReader,
    tx: mpsc::Sender<Desired>,
    watching: Watching,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut dir = match DirWatch::new(&path) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!("{e:#}; checking {} every {}s instead", path.display(), STAT_EVERY.as_secs());
                None
            }
        };
        let mut last: Option<Stamp> = None;
        let mut first = true;
        loop {
            let now = stamp(&path);
            if first || now != last {
                first = false;
                last = now;
                match read(&path) {
                    Ok(nodes) => {
                        watching.on();
                        info!(path = %path.display(), nodes = nodes.len(), "nodes file loaded");
                        let t = std::time::Instant::now();
                        let desired = reader.desired(&nodes);
                        drop(nodes);
                        tracing::debug!(ms = t.elapsed().as_millis() as u64, "nodes read with flannel's rules");
                        if tx.send(desired).await.is_err() {
                            return;
                        }
                    }
                    // a file that could not be read (EMFILE, EIO) is read again at the next
                    // check, even unchanged; one that says something wrong waits for a change
                    Err(e @ NodesFileError::Read { .. }) => {
                        watching.off();
                        error!("{e}; keeping the last good node list, reading it again in {}s", STAT_EVERY.as_secs());
                        last = None;
                    }
                    Err(e) => error!("{e}; keeping the last good node list"),
                }
            }
            match dir.as_mut() {
                Some(w) => {
                    if tokio::time::timeout(STAT_EVERY, w.changed()).await.is_ok() {
                        tokio::time::sleep(SETTLE).await;
                        w.drain();
                    }
                }
                None => tokio::time::sleep(STAT_EVERY).await,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_keep_only_what_flannels_rules_read() {
        let json = r#"{"kind":"NodeList","items":[{"apiVersion":"v1","metadata":{"name":"a","labels":{"x":"y"},
            "annotations":{"k":"v"}},"spec":{"podCIDR":"10.0.0.0/24","taints":[]},"status":{"images":[{"names":["i"]}]}},
            "garbage", 3]}"#;
        let nodes = parse(json, "f").unwrap();
        assert_eq!(
            nodes,
            vec![
                serde_json::json!({"metadata":{"name":"a","annotations":{"k":"v"}},"spec":{"podCIDR":"10.0.0.0/24"}}),
                Value::Null,
                Value::Null
            ]
        );
    }

    #[test]
    fn json_and_yaml_node_lists_parse_the_same() {
        let json = r#"{"apiVersion":"v1","kind":"List","items":[{"metadata":{"name":"a"}}]}"#;
        let yaml = "apiVersion: v1\nkind: NodeList\nitems:\n- metadata:\n    name: a\n";
        assert_eq!(parse(json, "f").unwrap(), parse(yaml, "f").unwrap());
    }

    #[test]
    fn broken_files_are_errors_naming_the_file() {
        for (text, want) in [
            ("{\"kind\":\"NodeList\",\"items\":[", "does not parse"),
            ("kind: NodeList\nitems: [\n", "does not parse"),
            ("kind: Pod\n", "want NodeList"),
            ("items: []\n", "no \"kind\""),
            ("kind: NodeList\nitems: 3\n", "not a list"),
        ] {
            let e = parse(text, "/etc/nodes.yaml").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("/etc/nodes.yaml"), "{text}: {e}");
        }
    }
}
