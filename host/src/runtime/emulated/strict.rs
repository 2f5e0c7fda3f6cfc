//! The strict emulator: weak memory, random scheduling and data-race reports
//! (`DEVCOMM_EMU_STRICT`, see the runtime's module docs and docs/design.md).
//!
//! * **Memory.** Every emulated GPU thread has a store buffer of 16-byte
//!   lines. The device crate's plain stores ([`devcomm_device::emu::EmuMemHooks`])
//!   land there, not in memory; the thread's own loads through the same
//!   paths see them (store-to-load forwarding). The buffer drains to memory
//!   at a release of the thread (a fence, a release or acq_rel atomic, a
//!   barrier it joins), before an atomic access of the thread to the same
//!   bytes, and otherwise late: each line has a random deadline up to
//!   [`DRAIN_MAX`] after its first store, met at the thread's next spin
//!   after it (or by any spinning thread of the process once the thread
//!   has ended, at the latest when its kernel ends); a random line drains
//!   now and then (1 store in [`STORE_FLUSH_ONE_IN`]), and a line whose
//!   slot a new line takes (the buffer holds [`SLOTS`] lines). So another
//!   thread, block, GPU or the GIN proxy sees a plain store late unless a
//!   release publishes it, as on a GPU. A release at block scope (a barrier,
//!   a CTA-scope fence or release) lands the thread's lines of local memory
//!   but moves its lines of peer memory (another device's, mapped here:
//!   [`add_peer_range`]) to its block's lines ([`BLOCK_SLOTS`]), which the
//!   block's threads see through these paths and which land at the next
//!   GPU- or system-scope release of any of them (cumulativity), at their
//!   deadlines, or when the kernel ends. Local memory is published to
//!   everyone by a block-scope release, since a block-mate may read it with
//!   plain loads the hooks cannot see.
//! * **Races.** For every 8-byte word accessed through those paths, a
//!   process-wide shadow keeps its last write and last read: the thread,
//!   the source location, and the sequence number of the first release of
//!   that thread after the access (pending until then). An access of
//!   another thread conflicts with it (write–write, write–read, read–write)
//!   unless that release came before the accessing thread's last acquire
//!   (an acquire atomic, a fence, a barrier, the start of its kernel): a
//!   necessary condition of happens-before, so every reported race is a
//!   real one, and races whose ordering exists only through a release that
//!   the reader never acquired are caught. Only accesses of one process are
//!   compared (ranks in other processes have shadows of their own).
//! * **Schedule.** Blocks start in a random order, in waves of random size
//!   unless the launch asks for co-residency; a block's threads are resumed
//!   in a random rotation; the emulated streams' copies (the GIN proxy's
//!   data path among them) start after a random delay of up to
//!   [`COPY_DELAY_MAX`].
//!
//! Every random choice comes from one seed ([`SEED_ENV`], else the clock),
//! printed when the first strict launch starts and named in every strict
//! launch failure; the OS's interleaving of blocks and processes stays
//! outside its reach.

use devcomm_device::Dim3;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `1` (or `all`): every part of the strict mode; or a comma-separated list
/// of `memory`, `schedule`, `races`; `0` or unset: off.
pub(crate) const STRICT_ENV: &str = "DEVCOMM_EMU_STRICT";
/// A `u64` (decimal or `0x` hex) that fixes the strict mode's random choices.
pub(crate) const SEED_ENV: &str = "DEVCOMM_EMU_SEED";

/// Longest time a plain store stays in its thread's store buffer without a
/// release (each line draws its deadline up to this).
pub(crate) const DRAIN_MAX: Duration = Duration::from_millis(2);
/// A store drains one random line of the buffer once in this many stores.
pub(crate) const STORE_FLUSH_ONE_IN: u64 = 64;
/// Longest random delay before an emulated stream copy or stream write.
pub(crate) const COPY_DELAY_MAX: Duration = Duration::from_micros(300);

/// Which parts of the strict mode are on, and the seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Strict {
    pub(crate) memory: bool,
    pub(crate) schedule: bool,
    pub(crate) races: bool,
    pub(crate) seed: u64,
}

impl Strict {
    /// Whether the memory hooks are needed (store buffers or race checks).
    pub(crate) fn hooks(&self) -> bool {
        self.memory || self.races
    }

    fn any(&self) -> bool {
        self.memory || self.schedule || self.races
    }

    fn parts(&self) -> String {
        let parts: Vec<&str> = [(self.memory, "memory"), (self.schedule, "schedule"), (self.races, "races")]
            .iter()
            .filter(|p| p.0)
            .map(|p| p.1)
            .collect();
        parts.join(", ")
    }
}

/// Parses [`STRICT_ENV`] and [`SEED_ENV`]'s values.
pub(crate) fn parse(strict: Option<&str>, seed: Option<&str>) -> Result<Strict, String> {
    let mut s = Strict::default();
    match strict.map(str::trim) {
        None | Some("") | Some("0") | Some("off") => {}
        Some("1") | Some("all") | Some("on") => {
            (s.memory, s.schedule, s.races) = (true, true, true);
        }
        Some(list) => {
            for part in list.split(',').map(str::trim) {
                match part {
                    "memory" => s.memory = true,
                    "schedule" => s.schedule = true,
                    "races" => s.races = true,
                    other => {
                        return Err(format!(
                            "{STRICT_ENV}={list}: unknown part `{other}` (use 1, or a list of memory, schedule, races)"
                        ))
                    }
                }
            }
        }
    }
    s.seed = match seed.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => {
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse::<u64>(),
            };
            parsed.map_err(|e| format!("{SEED_ENV}={v}: {e}"))?
        }
        None => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            mix(t, std::process::id() as u64)
        }
    };
    Ok(s)
}

fn settings() -> &'static Result<Strict, String> {
    static C: OnceLock<Result<Strict, String>> = OnceLock::new();
    C.get_or_init(|| {
        let strict = std::env::var(STRICT_ENV).ok();
        let seed = std::env::var(SEED_ENV).ok();
        parse(strict.as_deref(), seed.as_deref())
    })
}

/// The process's strict-mode settings (read once; off when malformed, which
/// [`check_config`] reports when an emulated device is opened).
pub(crate) fn config() -> &'static Strict {
    static OFF: Strict = Strict { memory: false, schedule: false, races: false, seed: 0 };
    settings().as_ref().unwrap_or(&OFF)
}

/// A malformed [`STRICT_ENV`] or [`SEED_ENV`], as an error.
pub(crate) fn check_config() -> crate::error::Result<()> {
    settings().as_ref().map(|_| ()).map_err(|e| crate::error::Error::invalid_argument(e.clone()))
}

/// Prints the settings and seed once, when the first strict launch starts.
pub(crate) fn announce() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let c = config();
    if c.any() {
        ONCE.call_once(|| {
            eprintln!(
                "devcomm: strict emulator ({}), seed {:#x} (repeat its choices with {SEED_ENV}={:#x})",
                c.parts(),
                c.seed,
                c.seed
            )
        });
    }
}

/// What a strict launch failure appends to its message.
pub(crate) fn seed_note() -> String {
    let c = config();
    format!(" [strict emulator ({}), {SEED_ENV}={:#x}]", c.parts(), c.seed)
}

/// SplitMix64's finaliser of `a` and `b`.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0, 0)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True once in `n` calls on average.
    pub(crate) fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    pub(crate) fn duration(&mut self, max: Duration) -> Duration {
        Duration::from_nanos(self.below(max.as_nanos() as u64 + 1))
    }
}

/// The strict mode's clock of ordering events: every release and acquire
/// takes the next number.
static SEQ: AtomicU64 = AtomicU64::new(1);

/// The next number of the strict mode's clock of ordering events.
pub(crate) fn tick() -> u64 {
    SEQ.fetch_add(1, Ordering::SeqCst) + 1
}

/// A release stamp not yet made.
const PENDING: u64 = u64::MAX;

/// One launch's description, for race reports.
struct LaunchInfo {
    name: &'static str,
    grid: Dim3,
    block: Dim3,
}

fn launches() -> &'static Mutex<HashMap<u32, LaunchInfo>> {
    static L: OnceLock<Mutex<HashMap<u32, LaunchInfo>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// Start sequence numbers of the launches running now (for the shadow's
/// garbage collection).
fn active() -> &'static Mutex<Vec<u64>> {
    static A: OnceLock<Mutex<Vec<u64>>> = OnceLock::new();
    A.get_or_init(Default::default)
}

/// A launch as the strict mode sees it.
pub(crate) struct StrictLaunch {
    pub(crate) id: u32,
    /// Sequence number at its start: its threads' first acquire.
    pub(crate) start: u64,
    pub(crate) rng_seed: u64,
}

/// Registers a launch that starts now.
pub(crate) fn start_launch(name: &'static str, grid: Dim3, block: Dim3) -> StrictLaunch {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed) as u32;
    let start = tick();
    if config().races {
        launches().lock().unwrap_or_else(|p| p.into_inner()).insert(id, LaunchInfo { name, grid, block });
    }
    active().lock().unwrap_or_else(|p| p.into_inner()).push(start);
    StrictLaunch { id, start, rng_seed: mix(config().seed, id as u64) }
}

/// What an ended thread leaves behind until its kernel ends.
pub(crate) struct Exited {
    tid: u64,
    written: Vec<u64>,
    read: Vec<u64>,
}

/// Ends a launch: waits until its ended threads' stores are due, drains
/// them, and stamps every access of its threads with one release.
pub(crate) fn end_launch(l: &StrictLaunch, exited: Vec<Exited>) {
    drain_launch(l.id);
    if config().races {
        let r = tick();
        for e in &exited {
            shadow().stamp(&e.written, e.tid, r, true);
            shadow().stamp(&e.read, e.tid, r, false);
        }
    }
    let mut a = active().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = a.iter().position(|&s| s == l.start) {
        a.swap_remove(i);
    }
}

/// `"kernel K (launch n) block (x,y,z) thread (x,y,z)"` for thread id `tid`.
fn describe(tid: u64) -> String {
    let (launch, linear) = ((tid >> 32) as u32, tid as u32 as u64);
    let l = launches().lock().unwrap_or_else(|p| p.into_inner());
    match l.get(&launch) {
        Some(info) => {
            let per_block = info.block.volume().max(1);
            let (b, t) = (index_of(linear / per_block, info.grid), index_of(linear % per_block, info.block));
            format!(
                "kernel {} (launch {launch}) block ({},{},{}) thread ({},{},{})",
                info.name, b.x, b.y, b.z, t.x, t.y, t.z
            )
        }
        None => format!("launch {launch} thread {linear}"),
    }
}

fn index_of(linear: u64, dims: Dim3) -> Dim3 {
    let (x, y) = (dims.x.max(1) as u64, dims.y.max(1) as u64);
    Dim3::new((linear % x) as u32, ((linear / x) % y) as u32, (linear / (x * y)) as u32)
}

/// A thread's id: its launch and its linear index in the grid.
pub(crate) fn thread_id(launch: u32, block_linear: u64, block: Dim3, thread_linear: u64) -> u64 {
    ((launch as u64) << 32) | ((block_linear * block.volume() + thread_linear) & 0xFFFF_FFFF)
}

// ---------------------------------------------------------------------------
// Plain memory accesses.

/// Reads `len` bytes at `src` into `dst` as one access where it is an
/// aligned 1, 2, 4, 8 or 16 bytes (single-copy atomic as on the GPU), else
/// byte by byte.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes.
pub(crate) unsafe fn mem_read(src: *const u8, dst: *mut u8, len: usize) {
    let aligned = (src as usize) % len.max(1) == 0;
    // SAFETY: the caller's contract, for every arm; a typed read only where
    // `src` is aligned for it, and `dst` is written unaligned.
    unsafe {
        match len {
            1 => dst.write(src.read_volatile()),
            2 if aligned => (dst as *mut u16).write_unaligned((src as *const u16).read_volatile()),
            4 if aligned => (dst as *mut u32).write_unaligned((src as *const u32).read_volatile()),
            8 if aligned => (dst as *mut u64).write_unaligned((src as *const u64).read_volatile()),
            16 if aligned => (dst as *mut [u64; 2]).write_unaligned((src as *const [u64; 2]).read_volatile()),
            _ => {
                for i in 0..len {
                    dst.add(i).write(src.add(i).read_volatile());
                }
            }
        }
    }
}

/// Writes `len` bytes from `src` to `dst`, as [`mem_read`] reads.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes.
pub(crate) unsafe fn mem_write(dst: *mut u8, src: *const u8, len: usize) {
    let aligned = (dst as usize) % len.max(1) == 0;
    // SAFETY: the caller's contract, for every arm; a typed write only where
    // `dst` is aligned for it, and `src` is read unaligned.
    unsafe {
        match len {
            1 => dst.write_volatile(src.read()),
            2 if aligned => (dst as *mut u16).write_volatile((src as *const u16).read_unaligned()),
            4 if aligned => (dst as *mut u32).write_volatile((src as *const u32).read_unaligned()),
            8 if aligned => (dst as *mut u64).write_volatile((src as *const u64).read_unaligned()),
            16 if aligned => (dst as *mut [u64; 2]).write_volatile((src as *const [u64; 2]).read_unaligned()),
            _ => {
                for i in 0..len {
                    dst.add(i).write_volatile(src.add(i).read());
                }
            }
        }
    }
}

/// Nanoseconds since the process's first use of the strict mode's clock.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Pending bytes of one 16-byte aligned line of a store buffer.
#[derive(Clone, Copy)]
pub(crate) struct Line {
    bytes: [MaybeUninit<u8>; 16],
    /// Bit `i`: byte `i` is pending.
    mask: u16,
    /// When it drains at the latest without a release ([`now_ns`]'s clock).
    due: u64,
}

impl Line {
    const EMPTY: Line = Line { bytes: [MaybeUninit::uninit(); 16], mask: 0, due: 0 };

    /// Merges the pending bytes of `newer` over these.
    fn merge(&mut self, newer: &Line) {
        for off in 0..16 {
            if newer.mask & (1 << off) != 0 {
                self.bytes[off] = newer.bytes[off];
            }
        }
        self.mask |= newer.mask;
        self.due = self.due.min(newer.due);
    }

    /// Writes the pending bytes to the line at `addr`, in the largest
    /// aligned pieces they fill (so an aligned store of 1–16 bytes lands
    /// whole, as it would have without the buffer).
    ///
    /// # Safety
    /// The pending bytes of the line at `addr` are valid for writes.
    unsafe fn write_to(&self, addr: usize) {
        let mut off = 0usize;
        while off < 16 {
            if self.mask & (1 << off) == 0 {
                off += 1;
                continue;
            }
            let mut size = 16;
            while size > 1 {
                let bits = ((1u32 << size) - 1) as u16;
                if off % size == 0 && (self.mask >> off) & bits == bits {
                    break;
                }
                size /= 2;
            }
            // SAFETY: bytes `off..off + size` are pending (their mask bits
            // are set), so valid for writes by the caller's contract, and
            // initialised in `bytes` (a store set them with the bits).
            unsafe { mem_write((addr + off) as *mut u8, self.bytes.as_ptr().add(off) as *const u8, size) };
            off += size;
        }
    }
}

/// A store buffer: a fixed number of 16-byte lines, each in the slot its
/// address hashes to. It never writes memory itself: what it gives back
/// (a line pushed out of its slot, lines taken) the caller lands.
pub(crate) struct StoreBuffer {
    slots: Box<[(usize, Line)]>,
    count: usize,
}

/// Lines of a thread's store buffer.
pub(crate) const SLOTS: usize = 64;
/// Lines of a block's buffer of lines released to the block only.
pub(crate) const BLOCK_SLOTS: usize = 256;

impl StoreBuffer {
    pub(crate) fn new(slots: usize) -> StoreBuffer {
        StoreBuffer { slots: vec![(0, Line::EMPTY); slots.max(1)].into_boxed_slice(), count: 0 }
    }

    fn index(&self, line: usize) -> usize {
        (mix(line as u64, 1) as usize) % self.slots.len()
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn get(&self, line: usize) -> Option<&Line> {
        let (a, l) = &self.slots[self.index(line)];
        (*a == line && l.mask != 0).then_some(l)
    }

    /// Takes out the pending line at `line`, if any.
    fn remove(&mut self, line: usize) -> Option<Line> {
        let i = self.index(line);
        if self.slots[i].0 == line {
            self.take_slot(i).map(|x| x.1)
        } else {
            None
        }
    }

    /// Takes out the pending line of slot `i`, if any.
    fn take_slot(&mut self, i: usize) -> Option<(usize, Line)> {
        let (a, l) = &mut self.slots[i];
        if l.mask == 0 {
            return None;
        }
        let out = (*a, *l);
        l.mask = 0;
        self.count -= 1;
        Some(out)
    }

    /// The pending line at `line`, made empty with deadline `due()` if
    /// absent; and the line that it pushed out of its slot, if any.
    fn entry(&mut self, line: usize, due: impl FnOnce() -> u64) -> (&mut Line, Option<(usize, Line)>) {
        let i = self.index(line);
        let (a, l) = &mut self.slots[i];
        let mut out = None;
        if *a != line || l.mask == 0 {
            if l.mask != 0 {
                out = Some((*a, *l));
            } else {
                self.count += 1;
            }
            *a = line;
            *l = Line { due: due(), ..Line::EMPTY };
        }
        (l, out)
    }

    /// Takes out the lines for which `f(address, line)` holds.
    fn take_where(&mut self, mut f: impl FnMut(usize, &Line) -> bool) -> Vec<(usize, Line)> {
        let mut out = Vec::new();
        if self.count == 0 {
            return out;
        }
        for i in 0..self.slots.len() {
            if self.slots[i].1.mask != 0 && f(self.slots[i].0, &self.slots[i].1) {
                out.extend(self.take_slot(i));
            }
        }
        out
    }

    /// Patches the bytes of `addr..addr + len`, read into `dst`, with
    /// the pending bytes of these lines.
    ///
    /// # Safety
    /// `dst` is valid for writes of `len` bytes.
    unsafe fn forward(&self, addr: usize, dst: *mut u8, len: usize) {
        if self.count == 0 {
            return;
        }
        let mut line = addr & !15;
        while line < addr + len {
            if let Some(l) = self.get(line) {
                for off in 0..16 {
                    let a = line + off;
                    if l.mask & (1 << off) != 0 && a >= addr && a < addr + len {
                        // SAFETY: `a - addr < len`: inside `dst` (the caller's
                        // contract); the pending byte was set by a store.
                        unsafe { dst.add(a - addr).write(l.bytes[off].assume_init()) };
                    }
                }
            }
            line += 16;
        }
    }
}

/// Lands `line` at `addr` in memory.
///
/// # Safety
/// A pending line of an emulated thread of a running launch: its bytes
/// were valid for writes when stored and stay so until the launch ends.
unsafe fn land(addr: usize, line: &Line) {
    // SAFETY: the caller's contract.
    unsafe { line.write_to(addr) };
}

/// Memory of the emulator's peers: other devices' memory mapped here (LSA
/// windows of other ranks). A barrier publishes a thread's stores there to
/// its block only ([`ThreadMem::release_cta`]).
fn peers() -> &'static std::sync::RwLock<Vec<std::ops::Range<usize>>> {
    static P: OnceLock<std::sync::RwLock<Vec<std::ops::Range<usize>>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

static PEER_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Records that `range` maps another device's memory.
pub(crate) fn add_peer_range(range: std::ops::Range<usize>) {
    let mut p = peers().write().unwrap_or_else(|e| e.into_inner());
    p.push(range);
    PEER_RANGES.store(p.len(), Ordering::Relaxed);
}

/// Forgets a range [`add_peer_range`] recorded.
pub(crate) fn remove_peer_range(range: &std::ops::Range<usize>) {
    let mut p = peers().write().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = p.iter().position(|r| r == range) {
        p.swap_remove(i);
    }
    PEER_RANGES.store(p.len(), Ordering::Relaxed);
}

fn is_peer(addr: usize) -> bool {
    PEER_RANGES.load(Ordering::Relaxed) != 0
        && peers().read().unwrap_or_else(|e| e.into_inner()).iter().any(|r| r.contains(&addr))
}

/// A block ended: the lines its threads released to it alone land at their
/// deadlines, at the latest when launch `launch` ends.
pub(crate) fn block_ended(launch: u32, lines: &mut StoreBuffer) {
    let lines = lines.take_where(|_, _| true);
    if !lines.is_empty() {
        let mut p = pending().lock().unwrap_or_else(|e| e.into_inner());
        p.push(PendingLines { launch, lines });
        PENDING_COUNT.store(p.len(), Ordering::Relaxed);
    }
}

/// The pending lines of an ended thread, drained when due.
struct PendingLines {
    launch: u32,
    lines: Vec<(usize, Line)>,
}

fn pending() -> &'static Mutex<Vec<PendingLines>> {
    static P: OnceLock<Mutex<Vec<PendingLines>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Drains the ended threads' lines that are due (any launch); cheap when none wait.
pub(crate) fn drain_due() {
    if PENDING_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = now_ns();
    let mut due = Vec::new();
    {
        let mut p = pending().lock().unwrap_or_else(|e| e.into_inner());
        for t in p.iter_mut() {
            t.lines.retain(|&(addr, line)| {
                let keep = line.due > now;
                if !keep {
                    due.push((addr, line));
                }
                keep
            });
        }
        p.retain(|t| !t.lines.is_empty());
        PENDING_COUNT.store(p.len(), Ordering::Relaxed);
    }
    flush_lines(due);
}

/// Waits until launch `launch`'s ended threads' lines are due, and drains them.
fn drain_launch(launch: u32) {
    let mine: Vec<(usize, Line)> = {
        let mut p = pending().lock().unwrap_or_else(|e| e.into_inner());
        let (mine, keep): (Vec<_>, Vec<_>) = p.drain(..).partition(|x| x.launch == launch);
        *p = keep;
        PENDING_COUNT.store(p.len(), Ordering::Relaxed);
        mine.into_iter().flat_map(|t| t.lines).collect()
    };
    if let Some(last) = mine.iter().map(|x| x.1.due).max() {
        let now = now_ns();
        if last > now {
            std::thread::sleep(Duration::from_nanos(last - now));
        }
    }
    flush_lines(mine);
}

fn flush_lines(lines: Vec<(usize, Line)>) {
    for (addr, line) in lines {
        // SAFETY: the lines of a launch's threads address device memory its
        // kernel was given, valid until the launch ends (it drains them
        // before ending); shared-memory lines were written when their thread
        // ended, stack addresses are never buffered.
        unsafe { line.write_to(addr) };
    }
}

// ---------------------------------------------------------------------------
// The shadow of accessed words.

#[derive(Clone, Copy)]
struct Access {
    tid: u64,
    /// The first release of `tid` after the access ([`PENDING`] until then).
    rel: u64,
    /// The bytes of the word it touched (bit `i`: byte `i`).
    bytes: u8,
    site: &'static Location<'static>,
}

#[derive(Clone, Copy, Default)]
struct Word {
    write: Option<Access>,
    read: Option<Access>,
}

/// The shadow is a set-associative table: [`BUCKETS`] buckets of [`WAYS`]
/// words, each bucket behind a lock. A word pushed out of it forgets its
/// accesses (a race with them goes unnoticed; none is ever invented).
const BUCKETS: usize = 1 << 14;
const WAYS: usize = 8;

#[derive(Clone, Copy, Default)]
struct Entry {
    /// The word's key (0: empty).
    key: u64,
    word: Word,
}

impl Entry {
    /// How much the entry is still worth keeping: pending accesses most,
    /// then the latest release stamp.
    fn worth(&self) -> u64 {
        if self.key == 0 {
            return 0;
        }
        let rel = |a: &Option<Access>| a.map_or(0, |a| a.rel);
        rel(&self.word.write).max(rel(&self.word.read))
    }
}

struct Shadow {
    buckets: Vec<Mutex<[Entry; WAYS]>>,
}

fn shadow() -> &'static Shadow {
    static S: OnceLock<Shadow> = OnceLock::new();
    S.get_or_init(|| Shadow { buckets: (0..BUCKETS).map(|_| Mutex::new([Entry::default(); WAYS])).collect() })
}

/// An access that conflicts with an earlier one.
struct Conflict {
    earlier: Access,
    earlier_write: bool,
}

type Bucket<'a> = std::sync::MutexGuard<'a, [Entry; WAYS]>;

impl Shadow {
    /// The bucket of word `key` (the two words of a 16-byte line share one,
    /// so a vector access takes one lock).
    fn index(key: u64) -> usize {
        (mix(key >> 1, 0) as usize) % BUCKETS
    }

    fn lock(&self, index: usize) -> Bucket<'_> {
        self.buckets[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock of `key`'s bucket, reusing `held` when it is that one.
    fn hold<'a>(&'a self, held: &mut Option<(usize, Bucket<'a>)>, key: u64) {
        let i = Self::index(key);
        if held.as_ref().map(|h| h.0) != Some(i) {
            *held = None;
            *held = Some((i, self.lock(i)));
        }
    }

    /// Records an access of thread `me` (last acquire `acq`) to bytes
    /// `bytes` of word `key`, whose bucket `b` is; returns a conflict with an
    /// unordered earlier access to some of those bytes, and whether the
    /// access is newly pending for `me` (to be stamped at its next release).
    fn access(
        b: &mut [Entry; WAYS],
        key: u64,
        me: u64,
        acq: u64,
        write: bool,
        bytes: u8,
        site: &'static Location<'static>,
    ) -> (Option<Conflict>, bool) {
        let i = match b.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => {
                // Replace the entry least worth keeping.
                let (i, _) = b.iter().enumerate().min_by_key(|(_, e)| e.worth()).unwrap_or((0, &b[0]));
                b[i] = Entry { key, word: Word::default() };
                i
            }
        };
        let w = &mut b[i].word;
        let unordered = |a: &Option<Access>| a.filter(|a| a.tid != me && a.rel > acq && a.bytes & bytes != 0);
        let conflict = match unordered(&w.write) {
            Some(a) => Some(Conflict { earlier: a, earlier_write: true }),
            None if write => unordered(&w.read).map(|a| Conflict { earlier: a, earlier_write: false }),
            None => None,
        };
        let slot = if write { &mut w.write } else { &mut w.read };
        let newly = !slot.is_some_and(|a| a.tid == me && a.rel == PENDING);
        // Bytes this thread touched before, still pending, stay in the mask.
        let bytes = match slot {
            Some(a) if !newly => a.bytes | bytes,
            _ => bytes,
        };
        *slot = Some(Access { tid: me, rel: PENDING, bytes, site });
        (conflict, newly)
    }

    /// Stamps `me`'s pending accesses of `keys` with release `r`.
    fn stamp(&self, keys: &[u64], me: u64, r: u64, write: bool) {
        let mut held = None;
        for &key in keys {
            self.hold(&mut held, key);
            let Some((_, b)) = held.as_mut() else { continue };
            if let Some(e) = b.iter_mut().find(|e| e.key == key) {
                let slot = if write { &mut e.word.write } else { &mut e.word.read };
                if let Some(a) = slot.as_mut().filter(|a| a.tid == me && a.rel == PENDING) {
                    a.rel = r;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// One emulated GPU thread.

/// The strict mode's state of one emulated GPU thread.
pub(crate) struct ThreadMem {
    tid: u64,
    cfg: Strict,
    rng: Rng,
    /// Sequence number of the thread's last acquire.
    acq: u64,
    /// The store buffer.
    lines: StoreBuffer,
    /// Shadow keys of words written / read since the last release.
    written: Vec<u64>,
    read: Vec<u64>,
    /// The thread's own stack (never buffered nor checked).
    stack: std::ops::Range<usize>,
    /// The block's shared memory, and the tag its shadow keys carry (its
    /// addresses are reused by later blocks).
    smem: std::ops::Range<usize>,
    smem_tag: u64,
    /// The first race this thread found, until the runtime reports it.
    pub(crate) race: Option<String>,
    raced: bool,
}

/// The shadow key of the word holding byte `addr`.
fn key_of(addr: usize, smem: &std::ops::Range<usize>, tag: u64) -> u64 {
    let word = (addr >> 3) as u64;
    if smem.contains(&addr) {
        word ^ (tag << 44)
    } else {
        word
    }
}

impl ThreadMem {
    pub(crate) fn new(
        tid: u64,
        launch: &StrictLaunch,
        stack: std::ops::Range<usize>,
        smem: std::ops::Range<usize>,
        smem_tag: u64,
    ) -> ThreadMem {
        ThreadMem {
            tid,
            cfg: *config(),
            rng: Rng::new(mix(launch.rng_seed, tid)),
            acq: launch.start,
            lines: StoreBuffer::new(SLOTS),
            written: Vec::new(),
            read: Vec::new(),
            stack,
            smem,
            smem_tag: smem_tag & 0xF_FFFF,
            race: None,
            raced: false,
        }
    }

    /// Checks and records an access of `len` bytes at `addr`.
    fn check(&mut self, addr: usize, len: usize, write: bool, site: &'static Location<'static>) {
        if !self.cfg.races || len == 0 {
            return;
        }
        let (first, last) = (addr & !7, (addr + len - 1) & !7);
        let mut a = first;
        let mut held = None;
        while a <= last {
            let key = key_of(a, &self.smem, self.smem_tag);
            // The bytes of this word inside `addr..addr + len`.
            let lo = addr.max(a) - a;
            let hi = (addr + len).min(a + 8) - a;
            let bytes = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u8;
            shadow().hold(&mut held, key);
            let Some((_, b)) = held.as_mut() else { break };
            let (conflict, newly) = Shadow::access(b, key, self.tid, self.acq, write, bytes, site);
            if newly {
                if write {
                    self.written.push(key);
                } else {
                    self.read.push(key);
                }
            }
            if let (Some(c), false) = (conflict, self.raced) {
                self.raced = true;
                let (this, earlier) =
                    (if write { "write" } else { "read" }, if c.earlier_write { "write" } else { "read" });
                self.race = Some(format!(
                    "data race on the 8-byte word at {a:#x} (bytes {bytes:#010b}): {this} by {} at {} is not ordered after the {earlier} by {} at {} (no release of that thread after its {earlier} was acquired before this {this})",
                    describe(self.tid),
                    site,
                    describe(c.earlier.tid),
                    c.earlier.site,
                ));
            }
            a += 8;
        }
    }

    /// Lands this thread's line `l` at `addr`, after the block's older
    /// line there (what a sibling released to the block before).
    fn land_own(addr: usize, l: &Line, block: &mut StoreBuffer) {
        if let Some(older) = block.remove(addr) {
            // SAFETY: a pending line of a thread of this block, whose launch runs.
            unsafe { land(addr, &older) };
        }
        // SAFETY: a pending line of this thread, whose launch runs.
        unsafe { land(addr, l) };
    }

    /// A plain store of `len` bytes from `src` to `dst`; `block`: the
    /// lines the thread's block holds.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes, until
    /// the store drains (the launch's end at the latest).
    pub(crate) unsafe fn store(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        site: &'static Location<'static>,
        block: &mut StoreBuffer,
    ) {
        let addr = dst as usize;
        if self.stack.contains(&addr) || len == 0 {
            // SAFETY: the caller's contract.
            unsafe { mem_write(dst, src, len) };
            return;
        }
        self.check(addr, len, true, site);
        if !self.cfg.memory {
            // SAFETY: the caller's contract.
            unsafe { mem_write(dst, src, len) };
            return;
        }
        let mut i = 0;
        while i < len {
            let a = addr + i;
            let (line, off) = (a & !15, a & 15);
            let n = (16 - off).min(len - i);
            let rng = &mut self.rng;
            let (l, out) = self.lines.entry(line, || now_ns() + rng.below(DRAIN_MAX.as_nanos() as u64 + 1));
            // SAFETY: `src` is valid for `len` bytes (the caller's contract)
            // and `i + n <= len`; `off + n <= 16` stays in the line's bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.add(i), l.bytes.as_mut_ptr().add(off) as *mut u8, n) };
            l.mask |= (((1u32 << n) - 1) << off) as u16;
            if let Some((a, l)) = out {
                Self::land_own(a, &l, block);
            }
            i += n;
        }
        if self.rng.one_in(STORE_FLUSH_ONE_IN) {
            let i = self.rng.below(SLOTS as u64) as usize;
            if let Some((a, l)) = self.lines.take_slot(i) {
                Self::land_own(a, &l, block);
            }
        }
    }

    /// A plain load of `len` bytes at `src` into `dst`: memory, then what
    /// the block holds, then this thread's own pending bytes.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes.
    pub(crate) unsafe fn load(
        &mut self,
        src: *const u8,
        dst: *mut u8,
        len: usize,
        site: &'static Location<'static>,
        block: &StoreBuffer,
    ) {
        let addr = src as usize;
        // SAFETY: the caller's contract.
        unsafe { mem_read(src, dst, len) };
        if self.stack.contains(&addr) || len == 0 {
            return;
        }
        self.check(addr, len, false, site);
        // SAFETY: the caller's contract: `dst` holds `len` bytes.
        unsafe {
            block.forward(addr, dst, len);
            self.lines.forward(addr, dst, len);
        }
    }

    /// Stamps the accesses since the last release with a new release.
    fn stamp(&mut self) {
        if self.cfg.races && !(self.written.is_empty() && self.read.is_empty()) {
            let r = tick();
            shadow().stamp(&self.written, self.tid, r, true);
            shadow().stamp(&self.read, self.tid, r, false);
            self.written.clear();
            self.read.clear();
        }
    }

    /// A release at GPU or system scope: the thread's lines and those its
    /// block holds (which it has seen through a barrier: cumulativity) land.
    pub(crate) fn release(&mut self, block: &mut StoreBuffer) {
        for (a, l) in self.lines.take_where(|_, _| true) {
            Self::land_own(a, &l, block);
        }
        for (a, l) in block.take_where(|_, _| true) {
            // SAFETY: a pending line of a thread of this block, whose launch runs.
            unsafe { land(a, &l) };
        }
        self.stamp();
    }

    /// A release to the block only (a barrier it joins, a CTA-scope fence or
    /// release): its lines of peer memory move to the block's lines —
    /// visible to the block's threads through these paths, to everyone
    /// else only after a wider release of one of them — and the others land
    /// (a block-mate may read them with plain loads the hooks do not see).
    pub(crate) fn release_cta(&mut self, block: &mut StoreBuffer) {
        for (a, l) in self.lines.take_where(|_, _| true) {
            if is_peer(a) {
                let (b, out) = block.entry(a, || l.due);
                b.merge(&l);
                if let Some((oa, ol)) = out {
                    // SAFETY: a pending line of a thread of this block, whose launch runs.
                    unsafe { land(oa, &ol) };
                }
            } else {
                Self::land_own(a, &l, block);
            }
        }
        self.stamp();
    }

    /// An acquire.
    pub(crate) fn acquire(&mut self) {
        if self.cfg.races {
            self.acq = tick();
        }
    }

    /// The acquire of leaving a barrier that opened at `seq` (when its last
    /// thread arrived: what others did after that is not ordered before).
    pub(crate) fn acquire_at(&mut self, seq: u64) {
        self.acq = self.acq.max(seq);
    }

    /// An atomic access of `len` bytes at `addr` follows: the pending
    /// stores to those lines (the block's, then this thread's) go first.
    pub(crate) fn atomic(&mut self, addr: usize, len: usize, block: &mut StoreBuffer) {
        if self.lines.is_empty() && block.is_empty() {
            return;
        }
        let mut line = addr & !15;
        while line < addr + len.max(1) {
            if let Some(l) = self.lines.remove(line) {
                Self::land_own(line, &l, block);
            } else if let Some(l) = block.remove(line) {
                // SAFETY: a pending line of a thread of this block, whose launch runs.
                unsafe { land(line, &l) };
            }
            line += 16;
        }
    }

    /// A spin of the thread: its lines, and its block's, past their
    /// deadline drain.
    pub(crate) fn spin(&mut self, block: &mut StoreBuffer) {
        let now = now_ns();
        for (a, l) in self.lines.take_where(|_, l| l.due <= now) {
            Self::land_own(a, &l, block);
        }
        for (a, l) in block.take_where(|_, l| l.due <= now) {
            // SAFETY: a pending line of a thread of this block, whose launch runs.
            unsafe { land(a, &l) };
        }
    }

    /// The thread ended: its shared-memory stores land now (the block's
    /// shared memory goes away with it), the others at their deadlines
    /// (after the block's older lines at the same addresses, which land
    /// now); its accesses are stamped when the launch ends.
    pub(crate) fn exit(mut self, launch: u32, block: &mut StoreBuffer) -> Exited {
        let smem = self.smem.clone();
        for (a, l) in self.lines.take_where(|a, _| smem.contains(&a)) {
            Self::land_own(a, &l, block);
        }
        if !self.lines.is_empty() {
            let lines = self.lines.take_where(|_, _| true);
            for (a, _) in &lines {
                if let Some(older) = block.remove(*a) {
                    // SAFETY: a pending line of a thread of this block, whose launch runs.
                    unsafe { land(*a, &older) };
                }
            }
            let mut p = pending().lock().unwrap_or_else(|e| e.into_inner());
            p.push(PendingLines { launch, lines });
            PENDING_COUNT.store(p.len(), Ordering::Relaxed);
        }
        Exited { tid: self.tid, written: std::mem::take(&mut self.written), read: std::mem::take(&mut self.read) }
    }
}

/// A random delay before an emulated stream copy (schedule part on).
pub(crate) fn copy_delay() {
    if !config().schedule {
        return;
    }
    static RNG: OnceLock<Mutex<Rng>> = OnceLock::new();
    let d = RNG
        .get_or_init(|| Mutex::new(Rng::new(mix(config().seed, 0xC0DE))))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .duration(COPY_DELAY_MAX);
    std::thread::sleep(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        let all = parse(Some("1"), Some("42")).unwrap();
        assert!(all.memory && all.schedule && all.races);
        assert_eq!(all.seed, 42);
        let some = parse(Some("memory, races"), Some("0x10")).unwrap();
        assert!(some.memory && !some.schedule && some.races);
        assert_eq!(some.seed, 16);
        let off = parse(None, None).unwrap();
        assert!(!off.any());
        assert!(parse(Some("0"), None).is_ok_and(|s| !s.any()));
        assert!(parse(Some("memroy"), None).unwrap_err().contains("memroy"));
        assert!(parse(Some("1"), Some("x")).is_err());
    }

    #[test]
    fn lines_land_in_whole_aligned_pieces() {
        let mut mem = [0u8; 32];
        let base = (mem.as_mut_ptr() as usize + 15) & !15;
        let mut line = Line::EMPTY;
        for (i, b) in line.bytes.iter_mut().enumerate() {
            *b = MaybeUninit::new(i as u8 + 1);
        }
        line.mask = 0b0000_0000_1111_0110; // bytes 1, 2 and 4..8
                                           // SAFETY: `base..base + 16` lies inside `mem`.
        unsafe { line.write_to(base) };
        let off = base - mem.as_ptr() as usize;
        assert_eq!(&mem[off..off + 9], &[0, 2, 3, 0, 5, 6, 7, 8, 0]);
    }

    #[test]
    fn the_shadow_orders_accesses_by_release_then_acquire() {
        let site = Location::caller();
        let sh = shadow();
        let key = 0x5EED_0000_0001u64;
        let (a, b) = ((u32::MAX as u64) << 32 | 1, (u32::MAX as u64) << 32 | 2);
        let access = |tid, acq, write, bytes| {
            let mut g = sh.lock(Shadow::index(key));
            let (c, newly) = Shadow::access(&mut g, key, tid, acq, write, bytes, site);
            (c.map(|c| (c.earlier.tid, c.earlier_write)), newly)
        };
        assert_eq!(access(a, 0, true, 0xFF), (None, true));
        assert_eq!(access(a, 0, true, 0x0F), (None, false), "already pending for a");
        // b reads what a wrote before a released anything: a race.
        assert_eq!(access(b, 0, false, 0x01), (Some((a, true)), true));
        sh.stamp(&[key], a, 10, true);
        // After a's release, an acquire of b before it is still too early ...
        assert_eq!(access(b, 9, false, 0x01).0, Some((a, true)));
        // ... one after it orders the write before b's reads.
        assert_eq!(access(b, 11, false, 0x01).0, None);
        // a writing again conflicts with b's pending read of the same byte,
        // not with one of other bytes.
        assert_eq!(access(a, 20, true, 0x02).0, None);
        assert_eq!(access(a, 20, true, 0x01).0, Some((b, false)));
    }

    #[test]
    fn rng_is_repeatable_and_shuffles() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!((0..8).map(|_| a.next()).collect::<Vec<_>>(), (0..8).map(|_| b.next()).collect::<Vec<_>>());
        let mut v: Vec<u32> = (0..50).collect();
        a.shuffle(&mut v);
        assert_ne!(v, (0..50).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }
}
