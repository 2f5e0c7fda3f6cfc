//! `devcomm-run`: start N ranks of a program on this machine, torchrun-style.
//!
//! ```text
//! devcomm-run -n 4 [--timeout 60] [--no-prefix] [--no-kill] [--env K=V]... program [args...]
//! ```
//!
//! Every rank gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT` and `DEVCOMM_UNIQUE_ID` (a bootstrap root
//! hosted by `devcomm-run` itself). Output lines are prefixed with
//! `[rank R]`. If a rank fails, the others are killed and `devcomm-run`
//! exits with that rank's exit code (128 + signal when it was killed).

use clap::Parser;
use devcomm::launch::{describe, spawn, LaunchOptions};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set by SIGINT/SIGTERM/SIGHUP: kill every rank and exit.
static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// Start N ranks of a program on this machine (torchrun-style variables).
#[derive(Parser, Debug)]
#[command(name = "devcomm-run", version, about)]
struct Args {
    /// Number of ranks.
    #[arg(short = 'n', long = "nprocs", alias = "nproc-per-node", default_value_t = 1)]
    nprocs: usize,
    /// Kill the job after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Do not prefix output lines with `[rank R]`.
    #[arg(long)]
    no_prefix: bool,
    /// Keep the other ranks running when one fails.
    #[arg(long)]
    no_kill: bool,
    /// Extra environment variable for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("devcomm-run: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> devcomm::Result<ExitCode> {
    let (program, rest) =
        args.command.split_first().ok_or_else(|| devcomm::Error::invalid_argument("no program given"))?;
    let timeout = match args.timeout {
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => return Err(devcomm::Error::invalid_argument(format!("--timeout {s}: expected a positive number"))),
        None => None,
    };
    let mut opts = LaunchOptions::new(args.nprocs, program)
        .args(rest.iter().cloned())
        .kill_on_failure(!args.no_kill)
        .prefix_output(!args.no_prefix)
        .timeout(timeout);
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| devcomm::Error::invalid_argument(format!("--env {kv:?}: expected KEY=VALUE")))?;
        opts = opts.env(k, v);
    }
    let job = spawn(&opts)?;
    install_signal_handlers();
    let (statuses, first_failed) = job.wait_report_or_cancel(&CANCEL)?;
    if CANCEL.load(Ordering::SeqCst) {
        eprintln!("devcomm-run: interrupted; killed every rank");
        return Ok(ExitCode::from(130));
    }
    for (rank, s) in statuses.iter().enumerate() {
        if !s.success() {
            eprintln!("devcomm-run: rank {rank} {}", describe(s));
        }
    }
    let Some(first) = first_failed else {
        return Ok(ExitCode::SUCCESS);
    };
    let s = &statuses[first];
    eprintln!("devcomm-run: job failed: rank {first} {} first", describe(s));
    let code = match (s.code(), s.signal()) {
        (Some(c), _) => u8::try_from(c).ok().filter(|&c| c != 0).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    };
    Ok(ExitCode::from(code))
}
