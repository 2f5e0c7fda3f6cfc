//! The emulator's strict mode (`DEVCOMM_EMU_STRICT=1`) against purpose-written
//! wrong kernels (`devcomm_test_user_kernels::strict`), each beside its
//! correct version:
//!
//! | case | the bug | ranks |
//! |---|---|---|
//! | `lsa_signal` | LSA stores to a peer, then a relaxed signal (no fence) | 2 processes |
//! | `lsa_cta_signal` | a block's LSA stores, a barrier, then the leader's relaxed signal | 2 processes |
//! | `flag_acquire` | a flag polled with relaxed loads, then the data read | 1 (two blocks) |
//! | `reuse_barrier` | a shared buffer rewritten without a barrier | 1 (one block) |
//! | `gin_given_release` | a put's freshly staged source declared released | 2 processes, GIN proxy |
//! | `gin_reuse_flush` | a put's source overwritten before `flush` | 2 processes, GIN proxy |
//! | `grid_wait` | blocks that wait for each other, without a co-resident launch | 1 (eight blocks) |
//!
//! Every case runs as child processes, on the runtime `DEVCOMM_RUNTIME`
//! names (default emulated). A child exits 0 when every value it read was
//! right, [`WRONG_DATA`] when some were not, [`RACE`] when the launch failed
//! with a data-race report naming both sites in the kernel source,
//! [`DEVICE_ERROR`] when a device wait ended in an error (a hang ended by
//! the device timeout), anything else on an unexpected failure.
//!
//! What is asserted:
//!
//! * **Emulated** (the children run with `DEVCOMM_EMU_STRICT=1`, whatever
//!   the parent has): the correct versions pass; every wrong version fails
//!   — wrong data or a device timeout on some rank, and for the two
//!   single-process cases a race report (the race check compares the
//!   accesses of one process).
//! * **CUDA** (`DEVCOMM_RUNTIME=cuda`, the GPU machine): the correct
//!   versions pass. A GPU cannot be made to reorder, so a wrong version
//!   may pass by chance: it runs [`GPU_ROUNDS`] rounds (`STRICT_ROUNDS`
//!   overrides), and the test prints to stderr, past the harness's
//!   capture, whether the bug showed (`strict_emulator: <case>: bug showed`
//!   / `bug did not show`), and asserts only that nothing else went wrong
//!   (no crash, no unexpected error).

mod common;

use common::{child_job, is_child, run, runtime};
use devcomm::comm::Communicator;
use devcomm::gin::GinConnectionType;
use devcomm::runtime::{LaunchConfig, Module};
use devcomm::{DevCommRequirements, Device, WindowFlags};
use devcomm_test_user_kernels::strict::{self as k, OUT_WORDS};
use std::io::Write;
use std::process::ExitStatus;
use std::time::Duration;

static USER_KERNELS_PTX: &str = include_str!("user-kernels/ptx/user_kernels.sm_90.ptx");

/// Exit codes of a child (see the module docs).
const WRONG_DATA: i32 = 3;
const RACE: i32 = 4;
const DEVICE_ERROR: i32 = 5;
const OTHER_LAUNCH_ERROR: i32 = 6;

/// Rounds of a case on the emulator, and of a wrong version on a GPU.
const EMU_ROUNDS: u32 = 16;
const GPU_ROUNDS: u32 = 2000;

fn rounds() -> u32 {
    std::env::var("STRICT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(if runtime() == "cuda" {
        GPU_ROUNDS
    } else {
        EMU_ROUNDS
    })
}

fn correct() -> u32 {
    std::env::var("STRICT_CORRECT").map_or(1, |v| (v == "1") as u32)
}

/// The child's verdict from the kernel's `out` words or its launch error.
fn verdict(what: &str, rank: usize, result: Result<Vec<u64>, devcomm::Error>) -> i32 {
    match result {
        Ok(out) if out[2] != 0 => {
            eprintln!("{what} rank {rank}: device error code {} (wrong values so far: {})", out[2], out[0]);
            DEVICE_ERROR
        }
        Ok(out) if out[0] != 0 => {
            eprintln!("{what} rank {rank}: {} wrong values, first in round {}", out[0], out[1]);
            WRONG_DATA
        }
        Ok(_) => 0,
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{what} rank {rank}: launch failed: {msg}");
            // A race report names both accesses' sites in the kernels' source.
            if msg.contains("data race") && msg.matches("user-kernels/src/strict.rs:").count() >= 2 {
                RACE
            } else {
                OTHER_LAUNCH_ERROR
            }
        }
    }
}

/// The kernel's `out` words after the stream synchronised, or its error.
fn out_words(stream: &devcomm::runtime::Stream, out: &devcomm::DeviceBuffer<u64>) -> Result<Vec<u64>, devcomm::Error> {
    stream.synchronize()?;
    stream.read_vec(out)
}

fn module(dev: &Device) -> Module {
    dev.load_module(USER_KERNELS_PTX).expect("loading the user kernels' module")
}

/// Runs child `child` in `ranks` processes, the correct or the wrong
/// version, on the parent's runtime (strict on the emulator).
fn run_case(child: &str, ranks: usize, correct: bool, env: &[(&str, &str)]) -> Vec<ExitStatus> {
    let rt = runtime();
    let mut opts = child_job(child, ranks)
        .env("DEVCOMM_RUNTIME", rt.clone())
        .env("STRICT_CORRECT", if correct { "1" } else { "0" })
        .env("STRICT_ROUNDS", rounds().to_string())
        .env("DEVCOMM_OP_TIMEOUT_MS", "10000")
        .kill_on_failure(false)
        .timeout(Some(Duration::from_secs(120)));
    if rt != "cuda" {
        opts = opts.env("DEVCOMM_EMU_STRICT", "1");
    }
    for (key, v) in env {
        opts = opts.env(*key, *v);
    }
    run(&opts)
}

/// Runs both versions of a case and asserts what the module docs say.
/// `race_expected`: on the emulator the wrong version must fail with a race report.
fn case(name: &str, child: &str, ranks: usize, env: &[(&str, &str)], race_expected: bool) {
    let good = run_case(child, ranks, true, env);
    assert!(good.iter().all(|s| s.success()), "{name}: the correct version failed: {good:?}");
    let bad = run_case(child, ranks, false, env);
    let codes: Vec<Option<i32>> = bad.iter().map(|s| s.code()).collect();
    let showed = codes.iter().any(|c| matches!(c, Some(WRONG_DATA | RACE | DEVICE_ERROR)));
    let unexpected = codes.iter().any(|c| !matches!(c, Some(0 | WRONG_DATA | RACE | DEVICE_ERROR)));
    if runtime() == "cuda" {
        // Straight to stderr, past the harness's capture: the observation is
        // the point of the GPU run.
        let _ = writeln!(
            std::io::stderr(),
            "strict_emulator: {name}: bug {} on the GPU in {} rounds (exit codes {codes:?})",
            if showed { "showed" } else { "did not show" },
            rounds()
        );
        assert!(!unexpected, "{name}: the wrong version failed in an unexpected way: {bad:?}");
    } else {
        assert!(!unexpected, "{name}: the wrong version failed in an unexpected way: {bad:?}");
        assert!(showed, "{name}: the strict emulator passed the wrong version: {bad:?}");
        if race_expected {
            assert!(codes.contains(&Some(RACE)), "{name}: no race report: {bad:?}");
        }
    }
}

// ---- LSA: data, then a relaxed signal ----

/// `u64` words each thread sends per round, and the threads.
const LSA_WORDS_PER_THREAD: u32 = 4;
const LSA_THREADS: u32 = 32;

fn child_lsa_body(comm: &Communicator) {
    let me = comm.rank();
    let dev = comm.device().clone();
    let stream = dev.new_stream().unwrap();
    let sig_off = (LSA_WORDS_PER_THREAD * LSA_THREADS * 8) as u64;
    let bytes = (sig_off + 128) as usize;
    let mem = comm.mem_alloc(bytes).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    window.write(&stream, 0, &vec![0u8; bytes]).unwrap();
    let module = module(&dev);
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    comm.bootstrap_barrier().unwrap();
    let args = (handle.dev_comm(), window.desc(), sig_off, LSA_WORDS_PER_THREAD, rounds(), correct(), out.as_mut_ptr());
    // SAFETY: the window holds the data words and both signal words (zeroed
    // above, on every rank before the barrier); one block; `out` is 4 zeroed
    // words that live until `out_words` has synchronised.
    let launched =
        unsafe { stream.launch_in::<k::strict_lsa_signal>(&module, LaunchConfig::new(1, LSA_THREADS), args) };
    let code = verdict("lsa_signal", me, launched.and_then(|()| out_words(&stream, &out)));
    comm.bootstrap_barrier().unwrap();
    std::process::exit(code);
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_strict_lsa() {
    if !is_child("child_strict_lsa") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_lsa_body(&comm);
}

/// Stores to an LSA peer published by a relaxed signal: the peer reads
/// stale data (strict emulator); with a release signal it does not.
#[test]
fn lsa_data_then_a_relaxed_signal() {
    case("lsa_signal", "child_strict_lsa", 2, &[], false);
}

// ---- LSA: a block's data, a barrier, then the leader's relaxed signal ----

const CTA_WORDS: u32 = 1024;
const CTA_THREADS: u32 = 128;

fn child_lsa_cta_body(comm: &Communicator) {
    let me = comm.rank();
    let dev = comm.device().clone();
    let stream = dev.new_stream().unwrap();
    let (src_off, sig_off) = ((CTA_WORDS * 8) as u64, (2 * CTA_WORDS * 8) as u64);
    let bytes = (sig_off + 128) as usize;
    let mem = comm.mem_alloc(bytes).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    window.write(&stream, 0, &vec![0u8; bytes]).unwrap();
    let module = module(&dev);
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    comm.bootstrap_barrier().unwrap();
    let args = (handle.dev_comm(), window.desc(), src_off, sig_off, CTA_WORDS, rounds(), correct(), out.as_mut_ptr());
    // SAFETY: the window holds the data, the source and both signal words
    // (zeroed above, on every rank before the barrier); one block; `out` is
    // 4 zeroed words that live until `out_words` has synchronised.
    let launched =
        unsafe { stream.launch_in::<k::strict_lsa_cta_signal>(&module, LaunchConfig::new(1, CTA_THREADS), args) };
    let code = verdict("lsa_cta_signal", me, launched.and_then(|()| out_words(&stream, &out)));
    comm.bootstrap_barrier().unwrap();
    std::process::exit(code);
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_strict_lsa_cta() {
    if !is_child("child_strict_lsa_cta") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_lsa_cta_body(&comm);
}

/// A block's stores to an LSA peer, a barrier, then the leader's relaxed
/// signal: the barrier orders them for the block only, so the peer reads
/// stale data (strict emulator: a barrier keeps stores to peer memory
/// among the block until a wider release); with a release signal it does not.
#[test]
fn lsa_block_data_a_barrier_then_a_relaxed_signal() {
    case("lsa_cta_signal", "child_strict_lsa_cta", 2, &[], false);
}

// ---- Two blocks: a flag read without acquire ----

const FLAG_THREADS: u32 = 32;

#[test]
#[ignore = "a process of a test: its parent runs it"]
fn child_strict_flag() {
    if !is_child("child_strict_flag") {
        return;
    }
    let dev = devcomm_tests::test_device(0);
    let stream = dev.stream();
    let module = module(&dev);
    let data = dev.alloc_from(&vec![0u64; 2 * FLAG_THREADS as usize]).unwrap();
    let words = dev.alloc_from(&[0u64; 2]).unwrap();
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    // SAFETY: `words` holds the flag and the ack (zero), `data` two words per
    // thread (device allocations are 256-byte aligned); two co-resident
    // blocks; everything lives until `out_words` has synchronised.
    let launched = unsafe {
        let (flag, ack) = (words.as_mut_ptr(), words.as_mut_ptr().add(1));
        stream.launch_in::<k::strict_flag_acquire>(
            &module,
            LaunchConfig::new(2, FLAG_THREADS).co_resident(),
            (data.as_mut_ptr(), flag, ack, rounds(), 10_000_000_000u64, correct(), out.as_mut_ptr()),
        )
    };
    std::process::exit(verdict("flag_acquire", 0, launched.and_then(|()| out_words(stream, &out))));
}

/// A flag polled with relaxed loads, then the data read: a race report
/// (strict emulator); with acquire loads, none.
#[test]
fn a_flag_read_without_acquire() {
    case("flag_acquire", "child_strict_flag", 1, &[], true);
}

// ---- One block: a buffer reused without a barrier ----

#[test]
#[ignore = "a process of a test: its parent runs it"]
fn child_strict_reuse() {
    if !is_child("child_strict_reuse") {
        return;
    }
    let threads: u32 = if runtime() == "cuda" { 256 } else { 64 };
    let dev = devcomm_tests::test_device(0);
    let stream = dev.stream();
    let module = module(&dev);
    let stage = dev.alloc_from(&vec![0u64; threads as usize]).unwrap();
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    // SAFETY: `stage` holds a word per thread; one block; both live until
    // `out_words` has synchronised.
    let launched = unsafe {
        stream.launch_in::<k::strict_reuse_barrier>(
            &module,
            LaunchConfig::new(1, threads),
            (stage.as_mut_ptr(), rounds(), correct(), out.as_mut_ptr()),
        )
    };
    std::process::exit(verdict("reuse_barrier", 0, launched.and_then(|()| out_words(stream, &out))));
}

/// A buffer rewritten while a neighbour may still read it: a race report
/// (strict emulator); with the barrier, none.
#[test]
fn a_buffer_reused_without_a_barrier() {
    case("reuse_barrier", "child_strict_reuse", 1, &[], true);
}

// ---- GIN: a source not published, a source reused before flush ----

/// `u64`s each thread puts per round, and the threads.
const GIN_CHUNK: u32 = 8;
const GIN_THREADS: u32 = 32;

fn child_gin_body(comm: &Communicator) {
    let me = comm.rank();
    let dev = comm.device().clone();
    let stream = dev.new_stream().unwrap();
    let area = (GIN_CHUNK * GIN_THREADS * 8) as u64;
    let (stage_off, recv_off) = (0u64, area.next_multiple_of(4096));
    let bytes = (recv_off + area) as usize;
    let mem = comm.mem_alloc(bytes).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 2;
    req.gin_queue_depth = 4 * GIN_THREADS;
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    window.write(&stream, 0, &vec![0u8; bytes]).unwrap();
    let module = module(&dev);
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    comm.bootstrap_barrier().unwrap();
    let kernel = std::env::var("STRICT_GIN").unwrap_or_default();
    let args =
        (handle.dev_comm(), window.desc(), stage_off, recv_off, GIN_CHUNK, rounds(), correct(), out.as_mut_ptr());
    let cfg = LaunchConfig::new(1, GIN_THREADS);
    // SAFETY: the window holds both areas on every rank; GIN has two signals
    // (fresh: zero) and a queue of 4 x threads; one block; `out` is 4 zeroed
    // words; all live until `out_words` has synchronised.
    let launched = unsafe {
        match kernel.as_str() {
            "given_release" => stream.launch_in::<k::strict_gin_given_release>(&module, cfg, args),
            "reuse_flush" => stream.launch_in::<k::strict_gin_reuse_flush>(&module, cfg, args),
            other => panic!("STRICT_GIN={other}: not a GIN case"),
        }
    };
    let code = verdict(&kernel, me, launched.and_then(|()| out_words(&stream, &out)));
    if code != 0 {
        eprintln!("rank {me}: proxy state {:?}", handle.gin_error());
    }
    comm.bootstrap_barrier().unwrap();
    std::process::exit(code);
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_strict_gin() {
    if !is_child("child_strict_gin") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_gin_body(&comm);
}

/// A put whose source the threads just wrote, declared released: the proxy
/// copies stale bytes (strict emulator); with the put's own fence, it does not.
#[test]
fn gin_put_of_a_source_declared_released_without_a_fence() {
    case(
        "gin_given_release",
        "child_strict_gin",
        2,
        &[("DEVCOMM_LSA_SIZE", "1"), ("STRICT_GIN", "given_release")],
        false,
    );
}

/// A put's source overwritten before `flush`: the proxy may send the new
/// bytes (the strict emulator delays its copies); flushing first, it does not.
#[test]
fn gin_source_overwritten_before_flush() {
    case("gin_reuse_flush", "child_strict_gin", 2, &[("DEVCOMM_LSA_SIZE", "1"), ("STRICT_GIN", "reuse_flush")], false);
}

// ---- Blocks that wait for each other without a co-resident launch ----

const GRID_BLOCKS: u32 = 8;

#[test]
#[ignore = "a process of a test: its parent runs it"]
fn child_strict_grid() {
    if !is_child("child_strict_grid") {
        return;
    }
    let dev = devcomm_tests::test_device(0);
    let stream = dev.stream();
    let module = module(&dev);
    let arrived = dev.alloc_from(&[0u64]).unwrap();
    let out = dev.alloc_from(&[0u64; OUT_WORDS]).unwrap();
    let mut cfg = LaunchConfig::new(GRID_BLOCKS, 32);
    if correct() != 0 {
        cfg = cfg.co_resident();
    }
    // Launches of a sequence on one counter, until one fails.
    let mut result = Ok(vec![0; OUT_WORDS]);
    for i in 0..rounds() {
        // SAFETY: `arrived` is one zeroed word counting the sequence, `out`
        // 4 zeroed words; both live until `out_words` has synchronised.
        let launched = unsafe {
            stream.launch_in::<k::strict_grid_wait>(
                &module,
                cfg,
                (arrived.as_mut_ptr(), i, 300_000_000u64, out.as_mut_ptr()),
            )
        };
        result = launched.and_then(|()| out_words(stream, &out));
        if !matches!(&result, Ok(o) if o[2] == 0) {
            break;
        }
    }
    std::process::exit(verdict("grid_wait", 0, result));
}

/// Eight blocks that wait for each other: without a co-resident launch the
/// strict emulator runs part of the grid first and the waits time out; a
/// co-resident launch passes.
#[test]
fn blocks_that_wait_for_each_other_without_a_co_resident_launch() {
    case("grid_wait", "child_strict_grid", 1, &[], false);
}
