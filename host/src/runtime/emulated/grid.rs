//! Running one kernel launch on CPU threads.
//!
//! Every GPU thread of a block is an OS thread, so a block barrier is a real
//! barrier and threads of a block really interleave. Blocks run in waves of at
//! most `DEVCOMM_EMU_MAX_THREADS` threads (default 4096): a grid that fits is
//! fully co-resident, like a grid of at most one block per SM on a GPU.
//!
//! Intrinsics find their thread's place through a thread-local [`ThreadCtx`]
//! set here and read by the hooks installed in `devcomm_device::emu`.
//!
//! Failure: a `trap`, or a panic inside the kernel's host form, poisons the
//! thread's block barrier and raises the launch's abort flag; threads waiting
//! at a barrier or spinning (`spin_backoff`) then unwind out of the kernel, and
//! the launch returns [`Error::CudaError`] (what a GPU fault gives too) naming the kernel, block and thread.

use super::super::LaunchConfig;
use crate::error::{Error, Result};
use devcomm_device::emu::{EmuHooks, Geometry};
use devcomm_device::{Dim3, KernelArgs};
use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::Instant;

const DEFAULT_MAX_THREADS: u64 = 4096;
const THREAD_STACK_BYTES: usize = 512 * 1024;

/// Unwind payload that takes a thread out of a failed launch quietly.
struct LaunchAborted;

/// A launch to run: the kernel's host form and its arguments.
pub(crate) struct GridJob<A> {
    pub(crate) func: unsafe fn(A),
    pub(crate) args: A,
    pub(crate) cfg: LaunchConfig,
    pub(crate) name: &'static str,
}

/// Moves a [`GridJob`] to the stream's worker thread and on to the CPU
/// threads of the grid.
pub(crate) struct SendJob<A>(pub(crate) GridJob<A>);

// SAFETY: a job's arguments are device pointers and plain values. Sharing
// them among the grid's threads is exactly what a GPU launch does; that the
// memory behind them stays valid and is accessed race-free is the contract of
// the (unsafe) launch, vouched for by its caller.
unsafe impl<A> Send for SendJob<A> {}
// SAFETY: as above.
unsafe impl<A> Sync for SendJob<A> {}

/// A barrier that can be poisoned: waiters then unwind instead of hanging.
struct BlockBarrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    parties: u32,
}

struct BarrierState {
    arrived: u32,
    generation: u64,
    poisoned: bool,
}

impl BlockBarrier {
    fn new(parties: u32) -> Self {
        BlockBarrier {
            state: Mutex::new(BarrierState { arrived: 0, generation: 0, poisoned: false }),
            cv: Condvar::new(),
            parties,
        }
    }

    fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.poisoned {
            drop(s);
            resume_unwind(Box::new(LaunchAborted));
        }
        s.arrived += 1;
        if s.arrived == self.parties {
            s.arrived = 0;
            s.generation = s.generation.wrapping_add(1);
            self.cv.notify_all();
            return;
        }
        let gen = s.generation;
        while s.generation == gen && !s.poisoned {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.generation == gen {
            drop(s);
            resume_unwind(Box::new(LaunchAborted));
        }
    }

    fn poison(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.poisoned = true;
        self.cv.notify_all();
    }
}

struct BlockState {
    barrier: BlockBarrier,
    /// Warp and named barriers, made on first use: key (kind, warp or id,
    /// lane mask or thread count).
    sub_barriers: Mutex<HashMap<(u8, u32, u32), Arc<BlockBarrier>>>,
    poisoned: AtomicBool,
    // u128 elements: 16-byte alignment, like CUDA's dynamic shared memory.
    shared: Box<[std::cell::UnsafeCell<u128>]>,
    shared_bytes: u32,
}

// SAFETY: the shared array is accessed by the block's threads through raw
// pointers, as GPU shared memory is; synchronisation is the kernel's job.
unsafe impl Sync for BlockState {}

const WARP_BARRIER: u8 = 0;
const NAMED_BARRIER: u8 = 1;

impl BlockState {
    fn new(threads: u32, shared_words: usize, shared_bytes: u32) -> Self {
        BlockState {
            barrier: BlockBarrier::new(threads),
            sub_barriers: Mutex::new(HashMap::new()),
            poisoned: AtomicBool::new(false),
            shared: (0..shared_words).map(|_| std::cell::UnsafeCell::new(0)).collect(),
            shared_bytes,
        }
    }

    fn sub_barrier(&self, kind: u8, id: u32, set: u32, parties: u32) -> Arc<BlockBarrier> {
        let mut map = self.sub_barriers.lock().unwrap_or_else(|p| p.into_inner());
        let b = map.entry((kind, id, set)).or_insert_with(|| Arc::new(BlockBarrier::new(parties.max(1))));
        if self.poisoned.load(Ordering::SeqCst) {
            b.poison();
        }
        b.clone()
    }

    fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        self.barrier.poison();
        let map = self.sub_barriers.lock().unwrap_or_else(|p| p.into_inner());
        for b in map.values() {
            b.poison();
        }
    }
}

struct LaunchState {
    aborted: AtomicBool,
    error: Mutex<Option<String>>,
}

impl LaunchState {
    fn fail(&self, msg: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(msg);
        }
        self.aborted.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy)]
struct ThreadCtx {
    geometry: Geometry,
    block: *const BlockState,
    launch: *const LaunchState,
}

thread_local! {
    static CURRENT: Cell<Option<ThreadCtx>> = const { Cell::new(None) };
}

fn current() -> ThreadCtx {
    match CURRENT.with(|c| c.get()) {
        Some(c) => c,
        None => panic!("devcomm: a device intrinsic was called outside an emulated kernel launch"),
    }
}

fn with_block<R>(f: impl FnOnce(&BlockState) -> R) -> R {
    // SAFETY: the pointer is set for the duration of the kernel call on this
    // thread and the block state outlives every thread of the block.
    f(unsafe { &*current().block })
}

fn with_launch<R>(f: impl FnOnce(&LaunchState) -> R) -> R {
    // SAFETY: as in `with_block`.
    f(unsafe { &*current().launch })
}

fn hook_geometry() -> Geometry {
    current().geometry
}

fn hook_sync_threads() {
    with_block(|b| b.barrier.wait());
}

fn hook_sync_warp(mask: u32) {
    let g = current().geometry;
    let b = g.block_dim;
    let rank = g.thread_idx.x + b.x * (g.thread_idx.y + b.y * g.thread_idx.z);
    let warp = rank / 32;
    // Lanes past the end of the block do not exist: a partial last warp's
    // full mask means its existing lanes.
    let threads = b.x * b.y * b.z;
    let lanes_here = (threads - warp * 32).min(32);
    let existing = if lanes_here == 32 { u32::MAX } else { (1u32 << lanes_here) - 1 };
    let lanes = mask & existing;
    // One barrier per (warp, lane set): tiles of a warp that sync at the
    // same time must not share one, or arrivals of different tiles mix.
    with_block(|bs| bs.sub_barrier(WARP_BARRIER, warp, lanes, lanes.count_ones())).wait();
}

fn hook_named_barrier(id: u32, nthreads: u32) {
    with_block(|bs| bs.sub_barrier(NAMED_BARRIER, id, nthreads, nthreads)).wait();
}

fn hook_dynamic_shared() -> (*mut u8, u32) {
    with_block(|b| (b.shared.as_ptr() as *mut u8, b.shared_bytes))
}

fn hook_global_timer_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn hook_yield() {
    if with_launch(|l| l.aborted.load(Ordering::Relaxed)) {
        resume_unwind(Box::new(LaunchAborted));
    }
    std::thread::yield_now();
}

fn hook_trap() -> ! {
    let g = current().geometry;
    with_launch(|l| {
        l.fail(format!(
            "trap in block ({},{},{}) thread ({},{},{})",
            g.block_idx.x, g.block_idx.y, g.block_idx.z, g.thread_idx.x, g.thread_idx.y, g.thread_idx.z
        ))
    });
    with_block(|b| b.poison());
    resume_unwind(Box::new(LaunchAborted))
}

static HOOKS: EmuHooks = EmuHooks {
    geometry: hook_geometry,
    sync_threads: hook_sync_threads,
    sync_warp: hook_sync_warp,
    named_barrier: hook_named_barrier,
    dynamic_shared: hook_dynamic_shared,
    global_timer_ns: hook_global_timer_ns,
    yield_now: hook_yield,
    trap: hook_trap,
};

/// Installs the hooks (idempotent).
pub(crate) fn install_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| devcomm_device::emu::install(&HOOKS));
}

fn max_resident_threads() -> u64 {
    std::env::var("DEVCOMM_EMU_MAX_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_MAX_THREADS)
}

fn index_of(linear: u64, dims: Dim3) -> Dim3 {
    let x = (linear % dims.x as u64) as u32;
    let y = ((linear / dims.x as u64) % dims.y as u64) as u32;
    let z = (linear / (dims.x as u64 * dims.y as u64)) as u32;
    Dim3::new(x, y, z)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

impl<A: KernelArgs> SendJob<A> {
    /// Runs the whole grid and returns when every thread has finished.
    ///
    /// # Safety
    /// As for the launch this job came from.
    pub(crate) unsafe fn run(&self) -> Result<()> {
        install_hooks();
        let job = &self.0;
        let cfg = job.cfg;
        let threads_per_block = cfg.block.volume();
        let blocks = cfg.grid.volume();
        let blocks_per_wave = (max_resident_threads() / threads_per_block).max(1);
        let launch = LaunchState { aborted: AtomicBool::new(false), error: Mutex::new(None) };
        let shared_words = (cfg.shared_mem_bytes as usize).div_ceil(16);

        let mut first = 0u64;
        while first < blocks && !launch.aborted.load(Ordering::SeqCst) {
            let last = (first + blocks_per_wave).min(blocks);
            let states: Vec<BlockState> = (first..last)
                .map(|_| BlockState::new(threads_per_block as u32, shared_words, cfg.shared_mem_bytes))
                .collect();
            let spawned = std::thread::scope(|scope| -> Result<()> {
                for (i, state) in states.iter().enumerate() {
                    let block_idx = index_of(first + i as u64, cfg.grid);
                    for t in 0..threads_per_block {
                        let ctx = ThreadCtx {
                            geometry: Geometry {
                                thread_idx: index_of(t, cfg.block),
                                block_idx,
                                block_dim: cfg.block,
                                grid_dim: cfg.grid,
                            },
                            block: state as *const BlockState,
                            launch: &launch as *const LaunchState,
                        };
                        let ctx = SendCtx(ctx);
                        let this = &*self;
                        let launch_ref = &launch;
                        let spawn = std::thread::Builder::new()
                            .name(format!("emu-b{}t{}", first + i as u64, t))
                            .stack_size(THREAD_STACK_BYTES)
                            .spawn_scoped(scope, move || {
                                let ctx = ctx;
                                CURRENT.with(|c| c.set(Some(ctx.0)));
                                let r = catch_unwind(AssertUnwindSafe(|| {
                                    // SAFETY: the caller of `run` vouched for the arguments.
                                    unsafe { (this.0.func)(this.0.args) }
                                }));
                                CURRENT.with(|c| c.set(None));
                                if let Err(p) = r {
                                    if !p.is::<LaunchAborted>() {
                                        let g = ctx.0.geometry;
                                        launch_ref.fail(format!(
                                            "panic in block ({},{},{}) thread ({},{},{}): {}",
                                            g.block_idx.x,
                                            g.block_idx.y,
                                            g.block_idx.z,
                                            g.thread_idx.x,
                                            g.thread_idx.y,
                                            g.thread_idx.z,
                                            panic_message(&*p)
                                        ));
                                    }
                                    // SAFETY: the block state outlives the scope.
                                    unsafe { &*ctx.0.block }.poison();
                                }
                            });
                        if let Err(e) = spawn {
                            launch.fail(format!("could not start an emulated GPU thread: {e}"));
                            for s in &states {
                                s.poison();
                            }
                            return Err(Error::SystemError(format!(
                                "{}: could not start an emulated GPU thread: {e}",
                                job.name
                            )));
                        }
                    }
                }
                Ok(())
            });
            spawned?;
            first = last;
        }
        let err = launch.error.lock().map(|e| e.clone()).unwrap_or(None);
        match err {
            None => Ok(()),
            Some(msg) => Err(Error::CudaError(format!("emulated kernel {} failed: {msg}", job.name))),
        }
    }
}

#[derive(Clone, Copy)]
struct SendCtx(ThreadCtx);
// SAFETY: the pointers in the context point to state that outlives the
// scoped thread it is handed to.
unsafe impl Send for SendCtx {}
