//! Shared helpers of devcomm's integration tests.
#![warn(missing_docs)]

use devcomm::runtime::{Device, RuntimeSelection};

/// Opens device `ordinal` of the runtime chosen by `DEVCOMM_RUNTIME`
/// (auto by default: CUDA when a GPU is present, else emulated).
pub fn test_device(ordinal: usize) -> Device {
    let sel = RuntimeSelection::from_env().expect("DEVCOMM_RUNTIME");
    Device::open(sel, ordinal).expect("opening the test device")
}
