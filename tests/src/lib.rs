//! Shared helpers of devcomm's integration tests (and of its benchmarks,
//! which launch the same test kernels).
#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use devcomm::runtime::{Device, Module, RuntimeKind, RuntimeSelection};

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

/// What `build.rs` wrote: a marker line (`// devcomm-embedded-ptx(devcomm-test-kernels)
/// sha256:<hash of the rest>`, by which `cargo xtask bundle` checks binaries),
/// then the committed PTX of `devcomm-test-kernels`.
static EMBEDDED: &str = include_str!(concat!(env!("OUT_DIR"), "/devcomm_test_kernels.ptx"));

/// The PTX of the test kernels (`devcomm-test-kernels`, in `tests/kernels`),
/// embedded at build time.
pub fn test_kernels_ptx() -> &'static str {
    EMBEDDED.split_once('\n').map_or("", |(_, ptx)| ptx)
}

/// The test kernels' module on `dev`, to launch them with
/// `Stream::launch_in::<K>(&test_kernels(&dev), ..)`: loaded with
/// `Device::load_module` at the first call for the device (every kernel of
/// it at once, unless `DEVCOMM_NO_PRELOAD` is set), the same module at every
/// later call in this process.
///
/// Errors: those of `Device::load_module`.
pub fn try_test_kernels(dev: &Device) -> devcomm::Result<Module> {
    // One device object per (runtime, ordinal) per process: the key names it.
    static MODULES: OnceLock<Mutex<HashMap<(RuntimeKind, usize), Module>>> = OnceLock::new();
    let mut modules = MODULES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let key = (dev.kind(), dev.ordinal());
    if let Some(m) = modules.get(&key) {
        return Ok(m.clone());
    }
    let m = dev.load_module(test_kernels_ptx())?;
    modules.insert(key, m.clone());
    Ok(m)
}

/// [`try_test_kernels`], panicking when the module does not load.
pub fn test_kernels(dev: &Device) -> Module {
    try_test_kernels(dev).expect("loading the test kernels' module (devcomm-test-kernels)")
}
