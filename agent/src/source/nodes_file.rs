//! The nodes file: a Kubernetes NodeList as `kubectl get nodes -o json|yaml`
//! prints it. Polled for changes; a file that does not parse as a whole is
//! reported and the last good list stays in force.
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;
use tokio::sync::mpsc;

use super::{Desired, NodeReader};
use tracing::{error, info};

/// How often the file's metadata is checked; edits reach the maps well within 2 s.
const POLL: Duration = Duration::from_millis(400);

#[derive(Debug, thiserror::Error)]
pub enum NodesFileError {
    #[error("nodes file {path} does not parse as JSON or YAML: {reason}")]
    Syntax { path: String, reason: String },
    #[error("nodes file {path}: {reason}")]
    Shape { path: String, reason: String },
}

/// Parses a NodeList (kind `NodeList` or `List`) into its items.
pub fn parse(text: &str, path: &str) -> Result<Vec<Value>, NodesFileError> {
    let trimmed = text.trim_start();
    let doc: Value = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| NodesFileError::Syntax { path: path.into(), reason: e.to_string() })?
    } else {
        serde_yaml_ng::from_str(text)
            .map_err(|e| NodesFileError::Syntax { path: path.into(), reason: e.to_string() })?
    };
    let shape = |reason: &str| NodesFileError::Shape { path: path.into(), reason: reason.into() };
    let kind = doc.get("kind").and_then(Value::as_str).ok_or_else(|| shape("no \"kind\" (want NodeList)"))?;
    if kind != "NodeList" && kind != "List" {
        return Err(shape(&format!("kind is {kind:?}, want NodeList")));
    }
    match doc.get("items") {
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(Value::Null) | None => Ok(Vec::new()),
        Some(_) => Err(shape("\"items\" is not a list")),
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
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
pub fn watch(path: PathBuf, reader: NodeReader, tx: mpsc::Sender<Desired>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Option<Stamp> = None;
        let mut first = true;
        let mut last_text: Option<String> = None;
        loop {
            let now = stamp(&path);
            if first || now != last {
                first = false;
                last = now;
                match std::fs::read_to_string(&path) {
                    Ok(text) if Some(&text) == last_text.as_ref() => {}
                    Ok(text) => match parse(&text, &path.display().to_string()) {
                        Ok(nodes) => {
                            info!(path = %path.display(), nodes = nodes.len(), "nodes file loaded");
                            last_text = Some(text);
                            if tx.send(reader.desired(&nodes)).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => error!("{e}; keeping the last good node list"),
                    },
                    Err(e) => error!("cannot read nodes file {}: {e}; keeping the last good node list", path.display()),
                }
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
