//! `devcomm-examples`: small programs a user copies from. Run one with
//! `cargo run --release -p devcomm-examples --example hello`.
//!
//! The README's code is compiled as this crate's doctests, so it stays true:
#![doc = include_str!("../../README.md")]
#![warn(missing_docs)]
