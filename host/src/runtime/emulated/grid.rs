//! Running one kernel launch on CPU threads.
//!
//! * Each **block** runs on one OS thread (from [`super::pool`]); the blocks
//!   of a wave run concurrently. A wave holds as many blocks as fit in
//!   `DEVCOMM_EMU_MAX_THREADS` GPU threads (default 16384, at least one
//!   block), so a grid that fits is fully co-resident, as a grid of at most
//!   one block per SM is on a GPU. (Each thread has a stack mapping of its
//!   own: the bound keeps a process well inside the kernel's map limit.)
//! * Each **GPU thread** of a block is a stackful coroutine (corosensei). A
//!   small scheduler resumes them in turn; a thread suspends at every
//!   barrier (`sync_threads`, `sync_warp`, named barriers) and at every
//!   `spin_backoff`, so a block with hundreds of threads costs no OS context
//!   switches. Thread switches happen only at those points, which is what
//!   makes plain emulated runs deterministic per block.
//! * In strict mode ([`super::strict`], `DEVCOMM_EMU_STRICT=1`) blocks start
//!   in a random order and, unless the launch asks for co-residency
//!   ([`LaunchConfig::co_resident`]), in waves of random size; a block's
//!   threads are resumed in a random rotation; every thread's plain stores
//!   through the device crate wait in a store buffer until a release, and
//!   its accesses are checked for data races. A barrier is a release on
//!   arrival and an acquire on leaving; a spin may drain the buffer.
//! * Intrinsics find their thread through the thread-local [`ThreadCtx`] the
//!   scheduler sets before resuming a coroutine.
//!
//! Failures: a `trap` or a panic in the kernel's host form, or a barrier that
//! can never complete (threads waiting at different barriers), ends the
//! launch with [`Error::CudaError`] naming the kernel and the thread; the
//! other threads of the block are unwound, other blocks stop at their next
//! spin or barrier.

use super::super::LaunchConfig;
use super::pool;
use super::strict::{self, Exited, StoreBuffer, StrictLaunch, ThreadMem};
use crate::error::{Error, Result};
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use devcomm_device::emu::{EmuBarrier, EmuHooks, EmuMemHooks, Geometry};
use devcomm_device::{Dim3, KernelArgs};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Instant;

const DEFAULT_MAX_THREADS: u64 = 16384;
/// Stack of each emulated GPU thread.
const STACK_BYTES: usize = 128 * 1024;

/// Unwind payload that takes a thread out of a failed launch quietly.
struct LaunchAborted;

/// A launch to run: the kernel's host form and its arguments.
pub(crate) struct GridJob<A> {
    pub(crate) func: unsafe fn(A),
    pub(crate) args: A,
    pub(crate) cfg: LaunchConfig,
    pub(crate) name: &'static str,
}

/// Moves a [`GridJob`] to the stream's worker thread and on to the blocks.
pub(crate) struct SendJob<A>(pub(crate) GridJob<A>);

// SAFETY: a job's arguments are device pointers and plain values. Sharing
// them among the grid's threads is exactly what a GPU launch does; that the
// memory behind them stays valid and is accessed race-free is the contract of
// the (unsafe) launch, vouched for by its caller.
unsafe impl<A> Send for SendJob<A> {}
// SAFETY: as above.
unsafe impl<A> Sync for SendJob<A> {}

/// What a suspended GPU thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum BarrierKey {
    /// `bar.sync 0`: every live thread of the block.
    Block,
    /// `bar.warp.sync mask` in warp `warp`: the live lanes of `mask`.
    Warp { warp: u32, mask: u32 },
    /// `bar.sync id, n`: `n` threads.
    Named { id: u32, threads: u32 },
}

/// Why a coroutine suspended.
#[derive(Clone, Copy, Debug)]
enum Suspend {
    Barrier(BarrierKey),
    Spin,
}

type ThreadYielder = Yielder<(), Suspend>;

/// State shared by the threads of one block (lives on the block's OS thread).
struct BlockState {
    shared: Box<[std::cell::UnsafeCell<u128>]>,
    shared_bytes: u32,
    poisoned: Cell<bool>,
    /// One word per thread for [`hook_warp_exchange`].
    exchange: Box<[Cell<u64>]>,
    /// One word per thread for [`hook_barrier_max`], 0 between uses.
    reduce: Box<[Cell<u32>]>,
    /// Strict mode: stores its threads released to the block only.
    cta_lines: RefCell<StoreBuffer>,
}

struct LaunchState {
    aborted: AtomicBool,
    error: Mutex<Option<String>>,
    /// The launch as the strict mode sees it (`None` when it is off).
    strict: Option<StrictLaunch>,
    /// What its ended threads leave for the launch's end (strict mode).
    exited: Mutex<Vec<Exited>>,
    /// Races reported so far.
    races: AtomicUsize,
}

/// Races printed per launch (the first fails it).
const RACES_PRINTED: usize = 4;

impl LaunchState {
    fn fail(&self, msg: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(msg);
        }
        self.aborted.store(true, Ordering::SeqCst);
    }

    fn race(&self, msg: String) {
        if self.races.fetch_add(1, Ordering::Relaxed) < RACES_PRINTED {
            eprintln!("devcomm: {msg}");
        }
        self.fail(msg);
    }
}

/// One GPU thread's identity, plus where to suspend it.
struct Slot {
    geometry: Geometry,
    yielder: Cell<*const ThreadYielder>,
    /// Its strict-mode state (`None` when the memory hooks are off).
    mem: RefCell<Option<ThreadMem>>,
    /// Strict mode: the clock when the barrier it last waited at opened.
    opened_at: Cell<u64>,
}

#[derive(Clone, Copy)]
struct ThreadCtx {
    slot: *const Slot,
    block: *const BlockState,
    launch: *const LaunchState,
}

thread_local! {
    static CURRENT: Cell<Option<ThreadCtx>> = const { Cell::new(None) };
    static STACKS: RefCell<Vec<DefaultStack>> = const { RefCell::new(Vec::new()) };
}

fn current() -> ThreadCtx {
    match CURRENT.with(|c| c.get()) {
        Some(c) => c,
        None => panic!("devcomm: a device intrinsic was called outside an emulated kernel launch"),
    }
}

// The accessors below hand out `&'static` references to the calling emulated
// thread's slot, block and launch states: the scheduler sets CURRENT to
// pointers into the block's own frame before resuming a thread and clears it
// after; the slot, block and launch states outlive every coroutine of the
// block, and the references never leave the coroutine.
fn slot() -> &'static Slot {
    // SAFETY: `current()` is set (it panics otherwise), so `slot` points at
    // the running thread's slot, alive for the whole of its coroutine (see above).
    unsafe { &*current().slot }
}

fn block() -> &'static BlockState {
    // SAFETY: as for `slot`: the running block's state, alive while any of
    // its coroutines runs.
    unsafe { &*current().block }
}

fn launch() -> &'static LaunchState {
    // SAFETY: as for `slot`: the launch's state, alive until every block of
    // the launch has finished.
    unsafe { &*current().launch }
}

fn suspend(why: Suspend) {
    suspend_ordered(why, false)
}

/// Suspends the calling thread; `ordered`: at a barrier with memory
/// ordering among its threads (`bar.sync`, `bar.red`, `bar.warp.sync`; not
/// `shfl`, `match` or `redux`), which in strict mode is a release on
/// arrival and an acquire on leaving.
fn suspend_ordered(why: Suspend, ordered: bool) {
    let y = slot().yielder.get();
    if y.is_null() {
        panic!("devcomm: emulated thread has no scheduler");
    }
    match why {
        // A barrier orders memory among the block's threads only.
        Suspend::Barrier(_) if ordered => {
            with_mem(|m, b| m.release_cta(b));
        }
        Suspend::Barrier(_) => {}
        Suspend::Spin => {
            with_mem(|m, b| m.spin(b));
            strict::drain_due();
        }
    }
    // SAFETY: set by the coroutine itself when it started; valid while it runs.
    unsafe { &*y }.suspend(why);
    if block().poisoned.get() || launch().aborted.load(Ordering::Relaxed) {
        resume_unwind(Box::new(LaunchAborted));
    }
    if ordered {
        let at = slot().opened_at.get();
        with_mem(|m, _| m.acquire_at(at));
    }
}

/// Runs `f` on the calling emulated thread's strict-mode state and its
/// block's lines, then reports the race it found, if any; `None` outside an
/// emulated kernel or with the memory hooks off.
fn with_mem<R>(f: impl FnOnce(&mut ThreadMem, &mut StoreBuffer) -> R) -> Option<R> {
    let ctx = CURRENT.with(|c| c.get())?;
    // SAFETY: CURRENT points at the running thread's slot, block and launch,
    // alive while its coroutine runs (see `slot`).
    let (slot, block, launch) = unsafe { (&*ctx.slot, &*ctx.block, &*ctx.launch) };
    let mut guard = slot.mem.try_borrow_mut().ok()?;
    let m = guard.as_mut()?;
    let mut lines = block.cta_lines.try_borrow_mut().ok()?;
    let r = f(m, &mut lines);
    if let Some(msg) = m.race.take() {
        launch.race(format!("{msg}{}", strict::seed_note()));
    }
    Some(r)
}

/// # Safety
/// As for [`EmuMemHooks::store`].
unsafe fn hook_mem_store(dst: *mut u8, src: *const u8, len: usize, site: &'static Location<'static>) {
    // SAFETY: the hook's contract is `ThreadMem::store`'s (the kernel's
    // memory stays valid until the launch ends, which drains the buffer).
    if with_mem(|m, b| unsafe { m.store(dst, src, len, site, b) }).is_none() {
        // SAFETY: the hook's contract (outside a strict kernel: a plain store).
        unsafe { strict::mem_write(dst, src, len) };
    }
}

/// # Safety
/// As for [`EmuMemHooks::load`].
unsafe fn hook_mem_load(src: *const u8, dst: *mut u8, len: usize, site: &'static Location<'static>) {
    // SAFETY: the hook's contract is `ThreadMem::load`'s.
    if with_mem(|m, b| unsafe { m.load(src, dst, len, site, b) }).is_none() {
        // SAFETY: the hook's contract (outside a strict kernel: a plain load).
        unsafe { strict::mem_read(src, dst, len) };
    }
}

fn hook_mem_order(acquire: bool, release: bool, cta: bool) {
    with_mem(|m, b| {
        if release && cta {
            m.release_cta(b);
        } else if release {
            m.release(b);
        }
        if acquire {
            m.acquire();
        }
    });
}

fn hook_mem_atomic(addr: *const u8, len: usize) {
    with_mem(|m, b| m.atomic(addr as usize, len, b));
}

static MEM_HOOKS: EmuMemHooks =
    EmuMemHooks { store: hook_mem_store, load: hook_mem_load, order: hook_mem_order, atomic: hook_mem_atomic };

fn linear_thread(g: &Geometry) -> u32 {
    g.thread_idx.x + g.block_dim.x * (g.thread_idx.y + g.block_dim.y * g.thread_idx.z)
}

fn hook_geometry() -> Geometry {
    slot().geometry
}

fn hook_sync_threads() {
    suspend_ordered(Suspend::Barrier(BarrierKey::Block), true);
}

fn hook_sync_warp(mask: u32) {
    let me = linear_thread(&slot().geometry);
    let (warp, lane) = (me / 32, me % 32);
    // A barrier of the caller alone orders nothing with anyone.
    let alone = mask == 1 << lane;
    suspend_ordered(Suspend::Barrier(BarrierKey::Warp { warp, mask }), !alone);
}

fn hook_warp_exchange(mask: u32, value: u64) -> [u64; 32] {
    let me = linear_thread(&slot().geometry);
    let (warp, lane) = (me / 32, me % 32);
    if mask & (1 << lane) == 0 {
        launch().fail(format!("warp exchange by lane {lane} outside its mask {mask:#x}"));
        block().poisoned.set(true);
        resume_unwind(Box::new(LaunchAborted));
    }
    let words = &block().exchange;
    words[me as usize].set(value);
    // Everyone has written, then everyone reads before anyone writes again.
    suspend(Suspend::Barrier(BarrierKey::Warp { warp, mask }));
    let mut out = [0u64; 32];
    for (l, v) in out.iter_mut().enumerate() {
        let t = (warp * 32) as usize + l;
        if mask & (1 << l) != 0 && t < words.len() {
            *v = words[t].get();
        }
    }
    suspend(Suspend::Barrier(BarrierKey::Warp { warp, mask }));
    out
}

fn hook_barrier_max(barrier: EmuBarrier, value: u32) -> u32 {
    let g = slot().geometry;
    let me = linear_thread(&g);
    let nthreads = g.block_dim.x * g.block_dim.y * g.block_dim.z;
    let (key, first, count, mask) = match barrier {
        EmuBarrier::Block => (BarrierKey::Block, 0, nthreads, u32::MAX),
        EmuBarrier::Warp { mask } => (BarrierKey::Warp { warp: me / 32, mask }, me / 32 * 32, 32, mask),
        EmuBarrier::Named { id, threads, first } => (BarrierKey::Named { id, threads }, first, threads, u32::MAX),
    };
    if me < first || me >= first + count || mask & (1 << ((me - first) % 32)) == 0 {
        launch().fail(format!("thread {me} joined a reducing barrier it is not part of ({barrier:?})"));
        block().poisoned.set(true);
        resume_unwind(Box::new(LaunchAborted));
    }
    let words = &block().reduce;
    words[me as usize].set(value);
    // Everyone has written; everyone reads; then each clears its own word
    // (threads that left the kernel keep 0 and count as 0). `bar.red`
    // orders memory like `bar.sync`; a warp's `redux.sync` does not.
    let ordered = !matches!(barrier, EmuBarrier::Warp { .. });
    suspend_ordered(Suspend::Barrier(key), ordered);
    let max = (first..(first + count).min(words.len() as u32))
        .filter(|t| mask & (1 << ((t - first) % 32)) != 0)
        .map(|t| words[t as usize].get())
        .max()
        .unwrap_or(0);
    suspend(Suspend::Barrier(key));
    words[me as usize].set(0);
    max
}

fn hook_named_barrier(id: u32, threads: u32) {
    suspend_ordered(Suspend::Barrier(BarrierKey::Named { id, threads }), true);
}

fn hook_dynamic_shared() -> (*mut u8, u32) {
    let b = block();
    (b.shared.as_ptr() as *mut u8, b.shared_bytes)
}

fn hook_global_timer_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn hook_yield() {
    suspend(Suspend::Spin);
}

fn hook_trap() -> ! {
    let g = slot().geometry;
    launch().fail(format!(
        "trap in block ({},{},{}) thread ({},{},{})",
        g.block_idx.x, g.block_idx.y, g.block_idx.z, g.thread_idx.x, g.thread_idx.y, g.thread_idx.z
    ));
    block().poisoned.set(true);
    resume_unwind(Box::new(LaunchAborted))
}

static HOOKS: EmuHooks = EmuHooks {
    geometry: hook_geometry,
    sync_threads: hook_sync_threads,
    sync_warp: hook_sync_warp,
    warp_exchange: hook_warp_exchange,
    named_barrier: hook_named_barrier,
    barrier_max: hook_barrier_max,
    dynamic_shared: hook_dynamic_shared,
    global_timer_ns: hook_global_timer_ns,
    yield_now: hook_yield,
    trap: hook_trap,
};

/// Installs the hooks (idempotent).
pub(crate) fn install_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        devcomm_device::emu::install(&HOOKS);
        if strict::config().hooks() {
            devcomm_device::emu::install_memory(&MEM_HOOKS);
        }
    });
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

fn describe(g: &Geometry) -> String {
    format!(
        "block ({},{},{}) thread ({},{},{})",
        g.block_idx.x, g.block_idx.y, g.block_idx.z, g.thread_idx.x, g.thread_idx.y, g.thread_idx.z
    )
}

/// Whether a co-resident launch fits at once: an error (as a cooperative
/// launch too large on a GPU) when it does not.
pub(crate) fn check_co_resident(cfg: &LaunchConfig, name: &str) -> Result<()> {
    let max_threads = max_resident_threads();
    let (blocks, per_block) = (cfg.grid.volume(), cfg.block.volume());
    if blocks > (max_threads / per_block).max(1) {
        return Err(Error::CudaError(format!(
            "emulated kernel {name}: a co-resident launch of {blocks} blocks of {per_block} threads does not fit \
             the emulator's {max_threads} resident threads (DEVCOMM_EMU_MAX_THREADS), as a cooperative launch \
             too large fails on a GPU"
        )));
    }
    Ok(())
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
        let blocks = cfg.grid.volume();
        let mut per_wave = (max_resident_threads() / cfg.block.volume()).max(1);
        if cfg.co_resident {
            check_co_resident(&cfg, job.name)?;
            per_wave = blocks;
        }
        let sc = strict::config();
        let strict = (sc.hooks() || sc.schedule).then(|| {
            strict::announce();
            strict::start_launch(job.name, cfg.grid, cfg.block)
        });
        let mut rng = strict::Rng::new(strict.as_ref().map_or(0, |s| s.rng_seed));
        // The blocks in the order they start (strict: random).
        let order: Option<Vec<u64>> = sc.schedule.then(|| {
            let mut v: Vec<u64> = (0..blocks).collect();
            rng.shuffle(&mut v);
            v
        });
        let launch = LaunchState {
            aborted: AtomicBool::new(false),
            error: Mutex::new(None),
            strict,
            exited: Mutex::new(Vec::new()),
            races: AtomicUsize::new(0),
        };

        let mut first = 0u64;
        while first < blocks && !launch.aborted.load(Ordering::SeqCst) {
            // Strict: a random part of what is left is resident at a time
            // (between one block and all that fit), unless the launch asked
            // for all of it.
            let wave =
                if sc.schedule && !cfg.co_resident { 1 + rng.below(per_wave.min(blocks - first)) } else { per_wave };
            let last = (first + wave).min(blocks);
            let tasks: Vec<Box<dyn FnOnce() + Send>> = (first..last)
                .map(|i| {
                    let b = order.as_ref().map_or(i, |o| o[i as usize]);
                    let task = BlockTask { job: self as *const SendJob<A>, launch: &launch, block: b };
                    // SAFETY: `run_batch` returns only after every task has
                    // finished, so the job and launch state outlive it.
                    Box::new(move || unsafe { task.run() }) as Box<dyn FnOnce() + Send>
                })
                .collect();
            if let Err(e) = pool::pool().run_batch(tasks) {
                launch.fail(e.to_string());
            }
            first = last;
        }
        if let Some(s) = &launch.strict {
            let exited = std::mem::take(&mut *launch.exited.lock().unwrap_or_else(|p| p.into_inner()));
            strict::end_launch(s, exited);
        }
        let err = launch.error.lock().map(|e| e.clone()).unwrap_or(None);
        match err {
            None => Ok(()),
            Some(msg) => {
                let note = if launch.strict.is_some() && !msg.contains(strict::SEED_ENV) {
                    strict::seed_note()
                } else {
                    String::new()
                };
                Err(Error::CudaError(format!("emulated kernel {} failed: {msg}{note}", job.name)))
            }
        }
    }
}

/// One block of a launch, run on one OS thread.
struct BlockTask<A> {
    job: *const SendJob<A>,
    launch: *const LaunchState,
    block: u64,
}

// SAFETY: the pointers reach state that outlives the task (see `run`), and
// the job's arguments are shareable by the launch's contract (`SendJob`).
unsafe impl<A> Send for BlockTask<A> {}

type ThreadCoroutine = Coroutine<(), Suspend, (), DefaultStack>;

impl<A: KernelArgs> BlockTask<A> {
    /// # Safety
    /// The job and launch states must outlive the call.
    unsafe fn run(self) {
        // SAFETY: per this function's contract.
        let (job, launch) = unsafe { (&(*self.job).0, &*self.launch) };
        let cfg = job.cfg;
        let nthreads = cfg.block.volume() as usize;
        let block = BlockState {
            shared: (0..(cfg.shared_mem_bytes as usize).div_ceil(16)).map(|_| std::cell::UnsafeCell::new(0)).collect(),
            shared_bytes: cfg.shared_mem_bytes,
            poisoned: Cell::new(false),
            exchange: (0..nthreads).map(|_| Cell::new(0)).collect(),
            reduce: (0..nthreads).map(|_| Cell::new(0)).collect(),
            cta_lines: RefCell::new(StoreBuffer::new(if launch.strict.is_some() { strict::BLOCK_SLOTS } else { 1 })),
        };
        let block_idx = index_of(self.block, cfg.grid);
        let slots: Vec<Slot> = (0..nthreads as u64)
            .map(|t| Slot {
                geometry: Geometry {
                    thread_idx: index_of(t, cfg.block),
                    block_idx,
                    block_dim: cfg.block,
                    grid_dim: cfg.grid,
                },
                yielder: Cell::new(std::ptr::null()),
                mem: RefCell::new(None),
                opened_at: Cell::new(0),
            })
            .collect();
        // Strict mode: the tag of this block's shared memory in the race
        // shadow (a later block may get the same addresses).
        static BLOCK_TAG: AtomicU64 = AtomicU64::new(1);
        let smem_tag = BLOCK_TAG.fetch_add(1, Ordering::Relaxed);
        let smem = {
            let base = block.shared.as_ptr() as usize;
            base..base + block.shared.len() * 16
        };
        let strict_mem = launch.strict.as_ref().filter(|_| strict::config().hooks());

        let mut threads: Vec<Option<ThreadCoroutine>> = Vec::with_capacity(nthreads);
        for (t, slot) in slots.iter().enumerate() {
            let stack =
                match STACKS.with(|s| s.borrow_mut().pop()).map(Ok).unwrap_or_else(|| DefaultStack::new(STACK_BYTES)) {
                    Ok(s) => s,
                    Err(e) => {
                        launch.fail(format!("could not allocate an emulated thread stack: {e}"));
                        return;
                    }
                };
            if let Some(sl) = strict_mem {
                use corosensei::stack::Stack;
                let stack_range = stack.limit().get()..stack.base().get();
                let tid = strict::thread_id(sl.id, self.block, cfg.block, t as u64);
                *slot.mem.borrow_mut() = Some(ThreadMem::new(tid, sl, stack_range, smem.clone(), smem_tag));
            }
            let slot_ptr = slot as *const Slot as usize;
            let job_ptr = job as *const GridJob<A> as usize;
            let launch_ptr = launch as *const LaunchState as usize;
            let block_ptr = &block as *const BlockState as usize;
            threads.push(Some(Coroutine::with_stack(stack, move |y: &ThreadYielder, ()| {
                // SAFETY: the slot, job, launch and block outlive the coroutine
                // (the block frame owns the slots and the block state; see
                // `run`'s contract).
                let (slot, job, launch, block_ref) = unsafe {
                    (
                        &*(slot_ptr as *const Slot),
                        &*(job_ptr as *const GridJob<A>),
                        &*(launch_ptr as *const LaunchState),
                        &*(block_ptr as *const BlockState),
                    )
                };
                slot.yielder.set(y as *const ThreadYielder);
                // SAFETY: the launch's caller vouched for the arguments.
                let r = catch_unwind(AssertUnwindSafe(|| unsafe { (job.func)(job.args) }));
                if let Err(p) = r {
                    if !p.is::<LaunchAborted>() {
                        launch.fail(format!("panic in {}: {}", describe(&slot.geometry), panic_message(&*p)));
                    }
                }
                // Strict mode: the thread's stores drain later, its accesses
                // are stamped at the launch's end.
                let mem = slot.mem.borrow_mut().take();
                if let (Some(m), Some(sl)) = (mem, &launch.strict) {
                    let e = m.exit(sl.id, &mut block_ref.cta_lines.borrow_mut());
                    launch.exited.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                }
            })));
        }

        let mut sched =
            Scheduler { waiting: vec![None; nthreads], live: nthreads, arrived: HashMap::new(), named: HashMap::new() };
        let rotate = launch.strict.is_some() && strict::config().schedule;
        let mut rng = strict::Rng::new(launch.strict.as_ref().map_or(0, |s| strict::mix(s.rng_seed, !self.block)));
        loop {
            let mut progressed = false;
            let mut runnable = 0;
            // Strict: each round starts at a random thread.
            let start = if rotate { rng.below(nthreads as u64) as usize } else { 0 };
            for i in (start..nthreads).chain(0..start) {
                if sched.waiting[i].is_some() {
                    continue;
                }
                let Some(co) = threads[i].as_mut() else { continue };
                runnable += 1;
                CURRENT.with(|c| c.set(Some(ThreadCtx { slot: &slots[i], block: &block, launch })));
                let r = co.resume(());
                CURRENT.with(|c| c.set(None));
                match r {
                    CoroutineResult::Yield(Suspend::Spin) => {}
                    CoroutineResult::Yield(Suspend::Barrier(key)) => {
                        progressed = true;
                        if let Some(other) = sched.conflict(key) {
                            launch.fail(format!(
                                "{} waits at {key:?}, and other threads of its block used {other:?} since its last block barrier: one named barrier with two thread counts may overlap on a GPU, which is undefined (an illegal instruction on H100); put a block barrier between phases that split the warps differently",
                                describe(&slots[i].geometry)
                            ));
                            block.poisoned.set(true);
                        }
                        sched.wait(i, key);
                    }
                    CoroutineResult::Return(()) => {
                        progressed = true;
                        if let Some(co) = threads[i].take() {
                            let stack = co.into_stack();
                            STACKS.with(|s| s.borrow_mut().push(stack));
                        }
                        sched.live -= 1;
                    }
                }
                sched.release_complete(&slots, &threads, strict_mem.is_some());
            }
            if sched.live == 0 {
                break;
            }
            if launch.aborted.load(Ordering::Relaxed) && !block.poisoned.get() {
                block.poisoned.set(true);
            }
            if block.poisoned.get() {
                // Wake everyone: each unwinds at its next suspension point.
                sched.waiting.iter_mut().for_each(|w| *w = None);
                sched.arrived.clear();
            } else if runnable == 0 {
                let waits: Vec<String> = sched
                    .waiting
                    .iter()
                    .enumerate()
                    .filter_map(|(i, w)| w.map(|k| format!("{} at {k:?}", describe(&slots[i].geometry))))
                    .take(4)
                    .collect();
                launch.fail(format!(
                    "barrier deadlock: {} threads wait at barriers that can never complete (e.g. {})",
                    sched.live,
                    waits.join("; ")
                ));
                block.poisoned.set(true);
            } else if !progressed {
                // Only spinning threads: let other blocks and processes run.
                std::thread::yield_now();
            }
        }
        // Strict mode: what the threads released to the block alone lands
        // later (at the launch's end at the latest).
        if let Some(sl) = &launch.strict {
            strict::block_ended(sl.id, &mut block.cta_lines.borrow_mut());
        }
    }
}

/// Which threads of a block wait at which barrier.
struct Scheduler {
    waiting: Vec<Option<BarrierKey>>,
    live: usize,
    arrived: HashMap<BarrierKey, usize>,
    /// Named barrier id -> the thread count it was last used with, since
    /// the last block barrier opened ([`Scheduler::conflict`]).
    named: HashMap<u32, u32>,
}

impl Scheduler {
    /// For a named barrier: the same id used with another thread count
    /// since the block's last `bar.sync 0` (None for other keys). Without
    /// a block barrier between them, the two uses may overlap on a GPU,
    /// however they happened to run here.
    fn conflict(&mut self, key: BarrierKey) -> Option<BarrierKey> {
        let BarrierKey::Named { id, threads } = key else { return None };
        match self.named.insert(id, threads) {
            Some(n) if n != threads => Some(BarrierKey::Named { id, threads: n }),
            _ => None,
        }
    }

    fn wait(&mut self, thread: usize, key: BarrierKey) {
        self.waiting[thread] = Some(key);
        *self.arrived.entry(key).or_insert(0) += 1;
    }

    /// Threads a barrier needs before it opens. Exited threads count as
    /// arrived (as on current GPUs, where a thread that returned does not
    /// hold a barrier up).
    fn needed(&self, key: BarrierKey, slots: &[Slot], threads: &[Option<ThreadCoroutine>]) -> usize {
        match key {
            BarrierKey::Block => self.live,
            BarrierKey::Warp { warp, mask } => (0..32u32)
                .filter(|l| mask & (1 << l) != 0)
                .map(|l| (warp * 32 + l) as usize)
                .filter(|&t| t < slots.len() && threads[t].is_some())
                .count(),
            BarrierKey::Named { threads: n, .. } => n as usize,
        }
    }

    /// Opens the barriers every thread has arrived at; `stamp`: note the
    /// strict mode's clock in the released threads' slots.
    fn release_complete(&mut self, slots: &[Slot], threads: &[Option<ThreadCoroutine>], stamp: bool) {
        let keys: Vec<BarrierKey> = self.arrived.keys().copied().collect();
        for key in keys {
            let have = self.arrived.get(&key).copied().unwrap_or(0);
            if have > 0 && have >= self.needed(key, slots, threads) {
                self.arrived.remove(&key);
                if key == BarrierKey::Block {
                    self.named.clear();
                }
                let now = if stamp { strict::tick() } else { 0 };
                for (i, w) in self.waiting.iter_mut().enumerate() {
                    if *w == Some(key) {
                        *w = None;
                        slots[i].opened_at.set(now);
                    }
                }
            }
        }
    }
}
