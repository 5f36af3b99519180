//! How to reach etcd (`--etcd-*`): what the etcd source and its TLS
//! options both read, so neither imports the other for it.
use std::{path::PathBuf, time::Duration};

#[derive(Clone, Debug)]
pub struct EtcdSettings {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub cafile: Option<PathBuf>,
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    /// etcd authentication (`--etcd-username`, `--etcd-password`).
    pub user: Option<(String, String)>,
    pub lease_ttl: Duration,
    pub renew_margin: Duration,
}
