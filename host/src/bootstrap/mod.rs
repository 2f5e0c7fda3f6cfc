//! The TCP bootstrap: how ranks find each other.
//!
//! A [`UniqueId`] names a *root* (a TCP listener plus threads, started in the
//! process that calls [`UniqueId::new`], or by [`Root::spawn`] at a chosen
//! address) and carries a random magic. Every rank connects to the root and
//! sends `Hello{magic, nranks, rank, info}`; the root checks it (wrong magic,
//! wrong size, rank out of range, rank taken: refused with a typed error;
//! garbage: connection dropped) and keeps serving the good ranks. Once all
//! ranks joined, the root hands everyone everybody's info and becomes the hub
//! of the host-side collectives (allgather, broadcast, barrier), abort and
//! finalize. A rank whose connection drops before it finalized is reported to
//! every other rank, whose pending and later operations then fail with
//! [`Error::RemoteError`](crate::Error::RemoteError) instead of hanging.
//!
//! Most users go through [`crate::comm::Communicator`]; this module is the
//! transport underneath.

mod client;
mod root;
mod unique_id;
pub mod wire;

pub use client::{BootstrapClient, JoinParams};
pub use root::Root;
pub use unique_id::{UniqueId, BOOTSTRAP_ADDR_ENV, UNIQUE_ID_BYTES};

pub(crate) use unique_id::{parse_host_port, random_magic};

/// 64-bit FNV-1a of `bytes`, starting from `seed` (stable across builds and hosts).
pub(crate) fn fnv1a64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
