//! edgevx: an eBPF VXLAN dataplane that stands in for flanneld's vxlan
//! backend, node by node, and keeps its VTEP MAC across reboots.
//!
//! A library as well as the `edgevx` binary so that the fuzz targets and
//! benches can drive the parsers and the reconciler directly.
pub mod annotations;
pub mod bugtool;
pub mod cache;
pub mod cleanup;
pub mod cli;
pub mod cli_flanneld;
#[cfg(test)]
mod cli_reference;
pub mod conntrack;
pub mod dataplane;
pub mod events;
pub mod exempt;
pub mod family;
pub mod gone;
pub mod mac;
pub mod metrics;
pub mod monitor;
pub mod netconf;
pub mod netfilter;
pub mod owner;
pub mod peer;
pub mod reconcile;
pub mod records;
pub mod run;
pub mod source;
pub mod state;
pub mod status;
pub mod subnet_env;
#[cfg(test)]
mod testns;
pub mod vtep_mac;

/// The release (the workspace's version, Cargo.toml: the one place it is written).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit this binary was built from (build-support/commit.rs).
pub const COMMIT: &str = env!("EDGEVX_COMMIT");
/// What `edgevx --version` prints after the name.
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("EDGEVX_COMMIT"), ")");

/// A bad flag or config value: exit code 2, before the host is changed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// An exit code whose reason was already printed (`edgevx status`'s
/// verdict): `main` exits with it and prints nothing more.
#[derive(Debug, thiserror::Error)]
#[error("exit {0}")]
pub struct SilentExit(pub u8);
