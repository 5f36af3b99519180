//! Everything that touches the kernel: bpffs pins, the programs and their
//! maps, the VTEP device and its routes, and the local pod table.
pub mod bpffs;
pub mod clsact;
pub mod device;
pub mod drop_events;
pub mod fast_path;
pub mod features;
pub mod guard;
pub mod ipv4_table;
pub mod ipv6_table;
pub mod kfunc;
pub mod loaded;
pub mod loader;
pub mod local_pods;
pub mod maps;
pub mod order;
pub mod own_addrs;
pub mod refused;
pub mod routes;
pub mod vtep;
pub mod xdp;
