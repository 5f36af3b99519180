//! What `edgevx-ipam` reads from outside, as a library: the network config
//! on stdin (`config`), its ranges (`range`) and the CNI wire types it
//! answers with (`wire`). The plugin itself is `src/main.rs`; the library
//! exists so the fuzz targets (`fuzz/`) can reach the parser.
pub mod config;
pub mod range;
pub mod wire;
