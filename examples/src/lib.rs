//! `devcomm-examples`: small programs a user copies from. Run one with
//! `cargo run --release -p devcomm-examples --example hello`.
#![warn(missing_docs)]
