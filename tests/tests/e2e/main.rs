//! Privileged end-to-end tests (root; run by `cargo xtask test` with
//! `--test-threads=1`). Each test builds its own namespaces and removes
//! them on drop, also when it fails.
mod admission_policy;
mod ahead;
mod arm64;
mod capacity;
mod cli;
mod conflicts;
mod conflicts_judge;
mod deploy;
mod direct_routing;
mod direct_routing_v6;
mod dual_stack;
mod edgevx_pair;
mod env;
mod etcd;
mod etcd_annotations;
mod etcd_tls;
mod exhaustion;
mod fast_path;
mod features;
mod firewall;
mod flanneld_cli;
mod iface;
mod image;
mod injection;
mod interop;
mod ipam;
mod ipam_damage;
mod ipam_deploy;
mod ipam_image;
mod ipam_reboot;
mod ipv6_only;
mod kernel;
mod kube;
mod kustomize;
mod metrics;
mod migration;
mod monitor;
mod monitoring;
mod mtu;
mod nodes_file;
mod offline;
mod offline_boot;
mod outage;
mod own_lease;
mod privileges;
mod probe_flood;
mod prog_fuzz;
mod prog_test_run;
mod prog_test_run_fast_send;
mod prog_test_run_monitor;
mod prog_test_run_v6;
mod prog_test_run_vtep_guard;
mod prog_test_run_xdp;
mod real_node;
mod reconcile;
mod restart;
mod rollback;
mod squatter;
mod state_fs;
mod state_identity;
mod state_safety;
mod status_truth;
pub mod underlay_v6;
mod uninstall;
mod upgrade;
mod xdp_judge;

use edgevx_tests::traffic::Peer;

pub use edgevx_tests::scenario::KERNEL_MAC;

pub fn testpeer() -> Peer {
    Peer::new(env!("CARGO_BIN_EXE_edgevx-testpeer"))
}

pub const MIB: u64 = 1 << 20;
