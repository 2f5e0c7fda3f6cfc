//! `devcomm-examples`: small programs a user copies from. Run one with
//! `cargo run --release -p devcomm-examples --example hello`.
//!
//! The README's code is compiled as this crate's doctests, so it stays true:
#![doc = include_str!("../../README.md")]
#![warn(missing_docs)]

use devcomm::env::LaunchEnv;
use devcomm::launch::LaunchOptions;
use devcomm::runtime::{device_count, RuntimeKind, RuntimeSelection};
use devcomm::{Error, Result};
use std::process::ExitCode;

/// The examples' own kernels (`examples/kernels`) as PTX, embedded by
/// `build.rs`; load it with `Device::load_module` and launch its kernels
/// with `Stream::launch_in`.
pub static EXAMPLE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/devcomm_example_kernels.ptx"));

/// The `main` of an example: under a launcher (`devcomm-run`, torchrun,
/// Slurm, Open MPI) it runs `rank_main` as this process's rank; started
/// plainly, it starts `nranks(runtime, devices)` copies of itself as the
/// ranks (on the GPUs when there are any, else on the emulated runtime) and
/// says which runtime it used. Errors end the program with a message and a
/// failure status.
pub fn main_with_ranks(
    name: &str,
    nranks: impl Fn(RuntimeKind, usize) -> usize,
    rank_main: impl FnOnce() -> Result<()>,
) -> ExitCode {
    let run = || match LaunchEnv::from_env() {
        // No launcher variables: start the ranks ourselves, as devcomm-run would.
        Err(Error::InvalidUsage(_)) => {
            let (kind, devices) = device_count(RuntimeSelection::from_env()?)?;
            let n = nranks(kind, devices);
            println!("{name}: {n} ranks on the {kind} runtime ({devices} device(s) found)");
            let exe = std::env::current_exe().map_err(|e| Error::system("locating this program", e))?;
            let opts = LaunchOptions::new(n, exe)
                .args(std::env::args_os().skip(1))
                .env(RuntimeSelection::ENV, kind.to_string());
            devcomm::launch::spawn(&opts)?.wait_success()
        }
        Err(e) => Err(e),
        Ok(_) => rank_main(),
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
