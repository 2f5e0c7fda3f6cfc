//! Helpers for multi-rank tests: ranks are separate processes that re-run
//! this test binary with `--exact <child test> --include-ignored`. Child
//! tests are `#[ignore]`d (a plain run lists them as ignored, not passed) and
//! do nothing unless [`ROLE_ENV`] names them.
#![allow(dead_code)]

use devcomm::comm::Config;
use devcomm::launch::{spawn, LaunchOptions, LocalJob};
use devcomm::runtime::{Device, RuntimeSelection};
use std::process::ExitStatus;
use std::time::Duration;

/// Names the child test a spawned process should run.
pub const ROLE_ENV: &str = "DEVCOMM_TEST_ROLE";

/// The short timeout every multi-rank test uses.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Whether this process was spawned to run child test `name`.
pub fn is_child(name: &str) -> bool {
    let me = std::env::var(ROLE_ENV).is_ok_and(|v| v == name);
    if me {
        // The library's warnings (a refused driver call, a failed peer)
        // reach the rank's stderr, which the parent prints.
        let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).with_writer(std::io::stderr).try_init();
    }
    me
}

/// Launch options that run child test `child` in `n` processes (emulated
/// runtime, 5 s bootstrap and op timeouts).
pub fn child_job(child: &str, n: usize) -> LaunchOptions {
    let exe = std::env::current_exe().expect("current test binary");
    LaunchOptions::new(n, exe)
        .args([child, "--exact", "--include-ignored", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE_ENV, child)
        .env("DEVCOMM_RUNTIME", "emulated")
        .env("DEVCOMM_BOOTSTRAP_TIMEOUT_MS", TIMEOUT.as_millis().to_string())
        .env("DEVCOMM_OP_TIMEOUT_MS", TIMEOUT.as_millis().to_string())
        .timeout(Some(Duration::from_secs(30)))
}

/// Starts `opts`, waits, and returns the statuses.
pub fn run(opts: &LaunchOptions) -> Vec<ExitStatus> {
    let job: LocalJob = spawn(opts).expect("spawning ranks");
    job.wait().expect("waiting for ranks")
}

/// Runs child test `child` in `n` processes and asserts every one succeeded.
pub fn run_ranks(child: &str, n: usize) {
    let st = run(&child_job(child, n));
    for (r, s) in st.iter().enumerate() {
        assert!(s.success(), "{child}: rank {r} of {n} {}", devcomm::launch::describe(s));
    }
}

/// Emulated device `i`.
pub fn emu(i: usize) -> Device {
    Device::open(RuntimeSelection::Emulated, i).expect("emulated device")
}

/// A config with [`TIMEOUT`] and emulated device `i`.
pub fn cfg(i: usize) -> Config {
    Config::default().with_timeouts(TIMEOUT).with_device(emu(i))
}

/// The runtime the parent test runs on (`DEVCOMM_RUNTIME`, default emulated).
pub fn runtime() -> String {
    std::env::var("DEVCOMM_RUNTIME").unwrap_or_else(|_| "emulated".into())
}

/// Runs child test `child` in `n` processes on the parent's runtime, with
/// `env` added, and asserts every rank succeeded. On CUDA, ranks share the
/// GPUs there are (rank `r` on GPU `r % gpus`, their kernels time-sharing a
/// GPU), so every case runs on any machine with a GPU; none is skipped.
/// `DEVCOMM_TEST_RANKS_PER_GPU=k` caps the ranks per GPU: a case that needs
/// more fails saying so.
pub fn run_on_runtime(child: &str, n: usize, env: &[(&str, String)]) {
    run_on_runtime_within(child, n, env, RANKS_LIMIT);
}

/// How long [`run_on_runtime`]'s ranks may run before they are killed and
/// the test fails. The 8-rank emulated cases take ~50 s of it on a quiet
/// 2-core machine beside another test; 120 s was too little for a CI
/// machine running ~5x slower (session 32's CI: `coll_8_ranks` and
/// `coll_hierarchical_moves_fewer_gin_bytes_4_teams` killed at 120 s,
/// cases that passed here in 52 and 10 s). Only a hang costs the limit.
const RANKS_LIMIT: Duration = Duration::from_secs(300);

/// [`run_on_runtime`] with the ranks killed (and the test failed) after
/// `limit` instead of [`RANKS_LIMIT`].
pub fn run_on_runtime_within(child: &str, n: usize, env: &[(&str, String)], limit: Duration) {
    spawn_ranks(child, n, env, limit, true);
}

/// [`run_on_runtime`] for ranks that launch no kernel (the point-to-point
/// engine's: copies and host threads only): no JIT warm-up first, which
/// costs minutes on a fresh GPU machine (session 22 mistook it for a hang
/// of these tests under a short limit).
pub fn run_on_runtime_without_kernels(child: &str, n: usize, env: &[(&str, String)]) {
    spawn_ranks(child, n, env, RANKS_LIMIT, false);
}

fn spawn_ranks(child: &str, n: usize, env: &[(&str, String)], limit: Duration, kernels: bool) {
    let rt = runtime();
    if rt == "cuda" {
        let gpus = devcomm::runtime::device_count(RuntimeSelection::Cuda).map(|x| x.1).unwrap_or(0);
        assert!(gpus > 0, "{child}: DEVCOMM_RUNTIME=cuda but no CUDA device was found");
        if let Some(cap) = std::env::var("DEVCOMM_TEST_RANKS_PER_GPU").ok().and_then(|v| v.trim().parse::<usize>().ok())
        {
            assert!(
                n <= gpus * cap.max(1),
                "{child}: {n} ranks on {gpus} GPUs need {} per GPU, DEVCOMM_TEST_RANKS_PER_GPU allows {cap}",
                n.div_ceil(gpus)
            );
        }
    }
    if rt == "cuda" && kernels {
        warm_jit_cache();
    }
    let mut opts = child_job(child, n).env("DEVCOMM_RUNTIME", rt).timeout(Some(limit));
    for (k, v) in env {
        opts = opts.env(*k, v.clone());
    }
    let statuses = run(&opts);
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
}

/// On CUDA, once per test process: loads the library's and the test
/// kernels' PTX here, outside any rank's time limit, so that the driver's
/// JIT cache holds both before ranks start. On a fresh GPU machine the two
/// take 1.5–2.5 minutes to JIT (15 and 6 MB of PTX), and the first
/// multi-rank case ran out of its 120 s doing it (2 × H100, 2026-11-25:
/// `benches/results/2026-11-25-h100x2-route-hier.md`).
pub fn warm_jit_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let started = std::time::Instant::now();
        let dev = Device::open(RuntimeSelection::Cuda, 0).expect("CUDA device 0");
        dev.library().expect("loading the library's kernels (devcomm-kernels)");
        devcomm_tests::test_kernels(&dev);
        let took = started.elapsed();
        if took > Duration::from_secs(5) {
            eprintln!(
                "devcomm tests: PTX JIT of the library and test kernels took {took:.1?} (now in the driver's cache)"
            );
        }
    });
}
