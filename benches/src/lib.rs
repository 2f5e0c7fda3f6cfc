//! `devcomm-benches`: benchmarks that print nccl-tests-style tables next to
//! NCCL (or the hardware's own engines) measured in the same run; results go
//! to `benches/results/`. This library holds what the benchmark programs in
//! `src/bin` share.
#![warn(missing_docs)]

pub mod nccl;

use devcomm::env::LaunchEnv;
use devcomm::launch::LaunchOptions;
use devcomm::{Error, Result};
use std::process::ExitCode;

/// A benchmark program's `main`: under a launcher (`devcomm-run`, torchrun,
/// ...) runs `bench(quick)` as this rank; started by hand, starts `nranks`
/// ranks of itself. `--quick` on the command line asks for small sizes.
pub fn bench_main(name: &str, nranks: usize, bench: impl FnOnce(bool) -> Result<()>) -> ExitCode {
    init_logging();
    let quick = std::env::args().any(|a| a == "--quick");
    let r = match LaunchEnv::from_env() {
        Err(Error::InvalidUsage(_)) => (|| {
            let exe = std::env::current_exe().map_err(|e| Error::system("locating this program", e))?;
            devcomm::launch::spawn(&LaunchOptions::new(nranks, exe).args(std::env::args_os().skip(1)))?.wait_success()
        })(),
        Err(e) => Err(e),
        Ok(_) => bench(quick),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints devcomm's `tracing` events to stderr at the level `DEVCOMM_LOG`
/// names (`error`, `warn` — the default —, `info`, `debug`, `trace`), so a
/// benchmark log shows why a fast path was left (e.g. a refused driver call).
pub fn init_logging() {
    let level = match std::env::var("DEVCOMM_LOG").unwrap_or_default().trim().to_ascii_lowercase().as_str() {
        "error" => tracing::Level::ERROR,
        "info" => tracing::Level::INFO,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::WARN,
    };
    let _ = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).try_init();
}

/// The median of `v` (upper median for even lengths); `NaN` when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
