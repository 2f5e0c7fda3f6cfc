//! Shared helpers of devcomm's integration tests.
#![warn(missing_docs)]

use devcomm::runtime::{Device, RuntimeSelection};

/// Opens device `ordinal` of the runtime chosen by `DEVCOMM_RUNTIME`, the
/// emulated one when it is unset — as the multi-rank tests do
/// (`tests/common`), so that a plain `cargo test` runs every test on the
/// same runtime, GPU or not (`DEVCOMM_RUNTIME=cuda` for the GPUs).
pub fn test_device(ordinal: usize) -> Device {
    let sel = match std::env::var_os(RuntimeSelection::ENV) {
        Some(_) => RuntimeSelection::from_env().expect("DEVCOMM_RUNTIME"),
        None => RuntimeSelection::Emulated,
    };
    Device::open(sel, ordinal).expect("opening the test device")
}
