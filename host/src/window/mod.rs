//! Symmetric windows (`ncclCommWindowRegister`): a region of
//! [`SymmetricMemory`] registered collectively, after which every rank has
//! every LSA peer's region mapped into one flat address range (peer `i` at
//! `lsa_base + i * stride`), described to kernels by a [`WindowDesc`].
//!
//! Registration is collective over the communicator: the ranks allgather
//! (size, flags, offset, allocation size) and agree, find the LSA team
//! ([`crate::team`]), pass allocation file descriptors to their LSA peers
//! over Unix sockets (`SCM_RIGHTS`), and map them. Every step is bounded by
//! the communicator's op timeout; any rank's failure fails the call on every
//! rank with a typed error, and the communicator stays usable.
//!
//! ```no_run
//! use devcomm::comm::Communicator;
//! use devcomm::window::WindowFlags;
//! # fn main() -> devcomm::Result<()> {
//! let comm = Communicator::init_from_env()?;
//! let mem = comm.mem_alloc(1 << 20)?;
//! let win = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
//! win.write(comm.device().stream(), 0, &[comm.rank() as u32])?;
//! comm.bootstrap_barrier()?;
//! let peer = (comm.lsa_rank()? + 1) % comm.lsa_size()?;
//! let mut v = [0u32];
//! win.read_lsa(comm.device().stream(), peer, 0, &mut v)?; // the peer's copy, through the mapping
//! let desc = win.desc(); // pass to kernels: desc.lsa_ptr(offset, peer)
//! # let _ = desc;
//! win.deregister()?;
//! # Ok(()) }
//! ```

mod agree;
pub(crate) mod fd_passing;
pub(crate) mod lsa;
pub(crate) mod registry;

pub(crate) use agree::{agree, allgather_outcome, Reader};
pub(crate) use registry::CommExt;

pub use devcomm_device::comm::{SymPtr, WindowDesc};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::memory::{MemRegion, SymmetricMemory};
use crate::runtime::{AddressRange, ShareableAlloc, Stream};
use crate::team::Team;
use bytemuck::Pod;
use registry::Region;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Required alignment of a window's offset in its allocation.
pub const WINDOW_ALIGNMENT: usize = 4096;

bitflags::bitflags! {
    /// How a window is registered (recorded in [`WindowDesc::flags`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct WindowFlags: u32 {
        /// No promises: sizes may differ between ranks (the window's usable
        /// size is the smallest).
        const DEFAULT = 0;
        /// Every rank registers the same size (checked: otherwise
        /// [`Error::InvalidArgument`] on every rank); collectives may use it.
        const COLL_SYMMETRIC = 1;
        /// Device operations on the window keep their issue order (recorded for the device side).
        const STRICT_ORDERING = 2;
    }
}

/// The mapping and bookkeeping of one registered window, shared by the
/// [`Window`] and the device communicators that use it.
pub(crate) struct WindowShared {
    pub(crate) desc: WindowDesc,
    _range: AddressRange,
    _mem: Arc<ShareableAlloc>,
    user_ptr: u64,
    region: Region,
    regions: Arc<Mutex<Vec<Region>>>,
    table: Arc<Mutex<std::collections::HashMap<u32, (u64, u64)>>>,
    /// Number of live device communicators using the window.
    pub(crate) users: AtomicUsize,
    /// Identity of the communicator (address of its extension state).
    pub(crate) comm_key: usize,
    world_rank: u32,
}

impl WindowShared {
    /// The allocation behind the window (for exporting it to more peers).
    pub(crate) fn alloc(&self) -> &Arc<ShareableAlloc> {
        &self._mem
    }

    /// Offset of the window's first byte in its allocation.
    pub(crate) fn offset_in_alloc(&self) -> u64 {
        self.user_ptr - self._mem.addr()
    }
}

impl Drop for WindowShared {
    fn drop(&mut self) {
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        regions.retain(|r| *r != self.region);
        self.table.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.desc.id());
    }
}

/// A registered window, as seen from this rank (`ncclWindow_t`).
///
/// Dropping it releases this rank's mapping without talking to other ranks
/// (after any device communicator that uses it is gone);
/// [`Window::deregister`] is the collective release.
pub struct Window<'c> {
    comm: &'c Communicator,
    pub(crate) shared: Arc<WindowShared>,
}

impl fmt::Debug for Window<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window").field("desc", &self.shared.desc).field("user_ptr", &self.shared.user_ptr).finish()
    }
}

pub(crate) fn comm_key(comm: &Communicator) -> usize {
    Arc::as_ptr(&comm.ext) as usize
}

impl Communicator {
    /// Registers `buffer` (a whole [`SymmetricMemory`] or a
    /// [`SymmetricMemory::region`]) as a window (`ncclCommWindowRegister`).
    /// Collective: every rank calls it, in the same order as other
    /// registrations, with the same flags and the same offset.
    ///
    /// Errors (on every rank when any rank's input is bad):
    /// [`Error::InvalidArgument`] for an offset not a multiple of
    /// [`WINDOW_ALIGNMENT`], a zero length, a region past the allocation's
    /// end, memory of another device, differing flags or offsets between
    /// ranks, or differing sizes with [`WindowFlags::COLL_SYMMETRIC`];
    /// [`Error::InvalidUsage`] when the region overlaps one already
    /// registered on this communicator; [`Error::Timeout`] when the LSA peers
    /// do not exchange handles within the op timeout; [`Error::RemoteError`]
    /// when a peer fails.
    ///
    /// Registration maps the memory as it is: **a window does not start
    /// zeroed** (nor does its [`SymmetricMemory`], see
    /// [`SymmetricMemory::alloc`]; on the emulated runtime it reads as
    /// `0xCB` bytes). Initialise it before kernels read it, and have peers
    /// wait for that (e.g. [`Communicator::bootstrap_barrier`]).
    ///
    /// Kernels that put into the window through GIN need it declared with
    /// [`DevCommRequirements::use_window`](crate::dev_comm::DevCommRequirements::use_window)
    /// when their device communicator is created (what goes wrong without
    /// it is said there); LSA loads and stores need only the registration.
    #[doc(alias = "ncclCommWindowRegister")]
    pub fn register_window<'m>(&self, buffer: impl Into<MemRegion<'m>>, flags: WindowFlags) -> Result<Window<'_>> {
        let region = buffer.into();
        register(self, region.mem, region.offset, region.len, flags)
    }
}

fn local_checks(
    comm: &Communicator,
    mem: &SymmetricMemory,
    offset: usize,
    len: usize,
    flags: WindowFlags,
) -> Result<()> {
    if flags.bits() & !WindowFlags::all().bits() != 0 {
        return Err(Error::invalid_argument(format!("unknown window flags {:#x}", flags.bits())));
    }
    let (dev, mine) = (mem.device(), comm.device());
    if dev.kind() != mine.kind() || dev.ordinal() != mine.ordinal() {
        return Err(Error::invalid_argument(format!(
            "the memory lives on {} device {}, the communicator drives {} device {}",
            dev.kind(),
            dev.ordinal(),
            mine.kind(),
            mine.ordinal()
        )));
    }
    if len == 0 {
        return Err(Error::invalid_argument("a window must not be empty (length 0)"));
    }
    if offset % WINDOW_ALIGNMENT != 0 {
        return Err(Error::invalid_argument(format!("window offset {offset} is not a multiple of {WINDOW_ALIGNMENT}")));
    }
    if offset.checked_add(len).is_none_or(|end| end > mem.size()) {
        return Err(Error::invalid_argument(format!(
            "window of {len} bytes at offset {offset} exceeds the allocation of {} bytes",
            mem.size()
        )));
    }
    let regions = comm.ext.regions.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = regions.iter().find(|r| r.0 == mem.id && r.1 < offset + len && offset < r.2) {
        return Err(Error::invalid_usage(format!(
            "bytes {}..{} of this allocation are already registered as window {} on this communicator",
            r.1, r.2, r.3
        )));
    }
    Ok(())
}

/// The collective registration (also used for device communicators' resource windows).
pub(crate) fn register<'c>(
    comm: &'c Communicator,
    mem: &SymmetricMemory,
    offset: usize,
    len: usize,
    flags: WindowFlags,
) -> Result<Window<'c>> {
    let what = "register_window";
    let seq = comm.ext.reg_seq.fetch_add(1, Ordering::SeqCst);
    // Step 1: local checks, the topology's LSA size, peer access, and the
    // listener (bound now, so the proposal allgather doubles as the barrier
    // before peers connect).
    let mut listener = None;
    let proposal = (|| -> Result<Vec<u8>> {
        local_checks(comm, mem, offset, len, flags)?;
        let topo_lsa = comm.topology_lsa_size()?;
        let p2p = lsa::peer_access_ok(comm, topo_lsa)?;
        if topo_lsa > 1 {
            let name = fd_passing::socket_name(comm.unique_id().magic(), seq, comm.rank());
            listener = Some(fd_passing::bind(&name)?);
        }
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(&(topo_lsa as u32).to_le_bytes());
        b.push(p2p as u8);
        b.extend_from_slice(&(len as u64).to_le_bytes());
        b.extend_from_slice(&(offset as u64).to_le_bytes());
        b.extend_from_slice(&flags.bits().to_le_bytes());
        b.extend_from_slice(&(mem.allocated_size() as u64).to_le_bytes());
        b.extend_from_slice(&(mem.device().shareable_granularity()? as u64).to_le_bytes());
        Ok(b)
    })();
    let all = allgather_outcome(comm, what, proposal)?;

    // Step 2: agree (every rank reaches the same verdict from the same data).
    struct P {
        lsa: u32,
        p2p: bool,
        len: u64,
        offset: u64,
        flags: u32,
        alloc: u64,
        gran: u64,
    }
    let ps = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let mut rd = Reader::new(b, r);
            Ok(P {
                lsa: rd.u32()?,
                p2p: rd.u8()? != 0,
                len: rd.u64()?,
                offset: rd.u64()?,
                flags: rd.u32()?,
                alloc: rd.u64()?,
                gran: rd.u64()?,
            })
        })
        .collect::<Result<Vec<P>>>()?;
    let p0 = &ps[0];
    if let Some((r, p)) = ps.iter().enumerate().find(|(_, p)| p.lsa != p0.lsa) {
        return Err(Error::invalid_argument(format!(
            "{what}: ranks disagree on the LSA size (rank 0: {}, rank {r}: {}); set {} the same everywhere",
            p0.lsa,
            p.lsa,
            crate::team::LSA_SIZE_ENV
        )));
    }
    if let Some((r, p)) = ps.iter().enumerate().find(|(_, p)| p.flags != p0.flags) {
        return Err(Error::invalid_argument(format!(
            "{what}: rank 0 passed flags {:#x}, rank {r} passed {:#x}",
            p0.flags, p.flags
        )));
    }
    if let Some((r, p)) = ps.iter().enumerate().find(|(_, p)| p.offset != p0.offset) {
        return Err(Error::invalid_argument(format!(
            "{what}: every rank must register at the same offset in its allocation (rank 0: {}, rank {r}: {})",
            p0.offset, p.offset
        )));
    }
    if flags.contains(WindowFlags::COLL_SYMMETRIC) {
        if let Some((r, p)) = ps.iter().enumerate().find(|(_, p)| p.len != p0.len) {
            return Err(Error::invalid_argument(format!(
                "{what}: COLL_SYMMETRIC needs the same size on every rank (rank 0: {}, rank {r}: {})",
                p0.len, p.len
            )));
        }
    }
    let size = ps.iter().map(|p| p.len).min().unwrap_or(0);
    let mut lsa_size = p0.lsa as usize;
    if lsa_size > 1 && ps.iter().any(|p| !p.p2p) {
        if !comm.ext.p2p_fallback.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "some GPUs of an LSA team cannot access each other: falling back to an LSA size of 1 on every rank"
            );
        }
        lsa_size = 1;
    }
    if lsa_size > 1 && comm.ext.p2p_fallback.load(Ordering::SeqCst) {
        lsa_size = 1;
    }
    let lsa_rank = comm.rank() % lsa_size;
    let block = comm.rank() - lsa_rank..comm.rank() - lsa_rank + lsa_size;

    // Step 3: exchange handles and map; then agree that everyone mapped.
    let alloc_sizes: Vec<u64> = ps[block.clone()].iter().map(|p| p.alloc).collect();
    let grans: Vec<u64> = ps[block].iter().map(|p| p.gran).collect();
    let params = lsa::MapParams {
        seq,
        lsa_size,
        alloc_sizes: &alloc_sizes,
        granularities: &grans,
        listener: if lsa_size > 1 { listener.as_ref() } else { None },
    };
    let mapped = lsa::map_peers(comm, &mem.alloc, &params);
    drop(listener);
    let outcome = match &mapped {
        Ok(_) => Ok(()),
        Err(e) => Err(e.clone()),
    };
    agree(comm, what, outcome)?;
    let mapping = mapped?;

    let id = comm.ext.next_window_id.fetch_add(1, Ordering::SeqCst);
    // SAFETY: every LSA peer's window is mapped at `base + i * stride`
    // (`map_peers`), `size` bytes each, for as long as the Window (and the
    // device communicators that pin it) live; `id` is entered in the window
    // table below.
    let desc = unsafe {
        WindowDesc::from_raw_parts(
            mapping.range.base() + offset as u64,
            mapping.stride,
            size,
            lsa_rank as u32,
            lsa_size as u32,
            flags.bits(),
            id,
        )
    };
    let region = (mem.id, offset, offset + len, id);
    comm.ext.regions.lock().unwrap_or_else(|p| p.into_inner()).push(region);
    let user_ptr = mem.device_addr() + offset as u64;
    comm.ext.window_table.lock().unwrap_or_else(|p| p.into_inner()).insert(id, (user_ptr, size));
    tracing::debug!(rank = comm.rank(), ?desc, "window registered");
    Ok(Window {
        comm,
        shared: Arc::new(WindowShared {
            desc,
            _range: mapping.range,
            _mem: mem.alloc.clone(),
            user_ptr,
            region,
            regions: comm.ext.regions.clone(),
            table: comm.ext.window_table.clone(),
            users: AtomicUsize::new(0),
            comm_key: comm_key(comm),
            world_rank: comm.rank() as u32,
        }),
    })
}

impl<'c> Window<'c> {
    /// The descriptor kernels take (`lsa_ptr`, `local_ptr`, `peer_ptr`).
    /// For a kernel that uses GIN, take it from
    /// [`DevCommHandle::window`](crate::dev_comm::DevCommHandle::window)
    /// instead, which checks that the window was declared with
    /// [`DevCommRequirements::use_window`](crate::dev_comm::DevCommRequirements::use_window).
    pub fn desc(&self) -> WindowDesc {
        self.shared.desc
    }

    /// The window's identifier within its communicator.
    pub fn id(&self) -> u32 {
        self.shared.desc.id()
    }

    /// The registered buffer's own device address (in the original allocation).
    pub fn user_ptr(&self) -> u64 {
        self.shared.user_ptr
    }

    /// Usable bytes (the smallest registered size among the ranks).
    pub fn size(&self) -> usize {
        self.shared.desc.size() as usize
    }

    /// The communicator it is registered on.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// Device address of byte `offset` of LSA peer `lsa_rank`'s window, in
    /// this rank's mapping.
    ///
    /// Errors: [`Error::InvalidArgument`] for `offset >= size()` or `lsa_rank >= lsa_size`.
    pub fn lsa_pointer(&self, offset: usize, lsa_rank: usize) -> Result<u64> {
        let d = &self.shared.desc;
        if lsa_rank >= d.lsa_size() as usize {
            return Err(Error::invalid_argument(format!(
                "LSA rank {lsa_rank} is out of range for an LSA team of {}",
                d.lsa_size()
            )));
        }
        if offset as u64 >= d.size() {
            return Err(Error::invalid_argument(format!("offset {offset} is past the window's {} bytes", d.size())));
        }
        Ok(d.lsa_base() + lsa_rank as u64 * d.stride() + offset as u64)
    }

    /// Device address of byte `offset` of member `peer` of `team` (a team
    /// seen from this rank, e.g. from [`Communicator::teams`]).
    ///
    /// Errors: [`Error::InvalidArgument`] when `peer` is not a member of
    /// `team`, is not in this rank's LSA team, or `offset >= size()`.
    pub fn peer_pointer(&self, team: &Team, peer: usize, offset: usize) -> Result<u64> {
        let d = &self.shared.desc;
        if peer >= team.nranks as usize {
            return Err(Error::invalid_argument(format!("peer {peer} is out of range for a team of {}", team.nranks)));
        }
        let lsa = Team::lsa(d.lsa_size(), d.lsa_rank());
        match team.rank_to_team(&lsa, self.shared.world_rank, peer as u32) {
            Some(l) => self.lsa_pointer(offset, l as usize),
            None => Err(Error::invalid_argument(format!(
                "team member {peer} (world rank {}) is not in this rank's LSA team of {}: it cannot be loaded from \
                 or stored to directly",
                team.rank_to_world(self.shared.world_rank, peer as u32),
                d.lsa_size()
            ))),
        }
    }

    /// A typed symmetric pointer at byte `offset` (checked against the size).
    pub fn sym_ptr<T>(&self, offset: usize) -> Result<SymPtr<T>> {
        if offset as u64 >= self.shared.desc.size() {
            return Err(Error::invalid_argument(format!(
                "offset {offset} is past the window's {} bytes",
                self.shared.desc.size()
            )));
        }
        Ok(SymPtr::new(self.shared.desc, offset as u64))
    }

    fn span(&self, lsa_rank: usize, offset: usize, bytes: usize) -> Result<u64> {
        if offset.checked_add(bytes).is_none_or(|end| end as u64 > self.shared.desc.size()) {
            return Err(Error::invalid_argument(format!(
                "access of {bytes} bytes at offset {offset} is outside the window's {} bytes",
                self.shared.desc.size()
            )));
        }
        if bytes == 0 {
            // Only the rank is checked.
            return self.lsa_pointer(0, lsa_rank);
        }
        self.lsa_pointer(offset, lsa_rank)
    }

    /// Copies `data` to byte `offset` of LSA peer `lsa_rank`'s window
    /// (through the mapping) and waits.
    pub fn write_lsa<T: Pod>(&self, stream: &Stream, lsa_rank: usize, offset: usize, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let at = self.span(lsa_rank, offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        stream.write_raw(at, bytes)
    }

    /// Copies from byte `offset` of LSA peer `lsa_rank`'s window into `out` and waits.
    pub fn read_lsa<T: Pod>(&self, stream: &Stream, lsa_rank: usize, offset: usize, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let at = self.span(lsa_rank, offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        stream.read_raw(at, bytes)
    }

    /// Copies `data` to byte `offset` of this rank's own window and waits.
    pub fn write<T: Pod>(&self, stream: &Stream, offset: usize, data: &[T]) -> Result<()> {
        self.write_lsa(stream, self.shared.desc.lsa_rank() as usize, offset, data)
    }

    /// Copies from byte `offset` of this rank's own window into `out` and waits.
    pub fn read<T: Pod>(&self, stream: &Stream, offset: usize, out: &mut [T]) -> Result<()> {
        self.read_lsa(stream, self.shared.desc.lsa_rank() as usize, offset, out)
    }

    /// Collective release (`ncclCommWindowDeregister`): every rank calls it
    /// for the same window.
    ///
    /// Errors: [`Error::InvalidUsage`] (on every rank) when a live device
    /// communicator still uses the window on some rank; the handle is then
    /// released as by drop, and the mapping lives on until that device
    /// communicator is destroyed. [`Error::RemoteError`] / [`Error::Timeout`]
    /// when the ranks cannot agree.
    pub fn deregister(self) -> Result<()> {
        let users = self.shared.users.load(Ordering::SeqCst);
        let local = if users > 0 {
            Err(Error::invalid_usage(format!(
                "window {} is used by {users} live device communicator(s): destroy them first",
                self.shared.desc.id()
            )))
        } else {
            Ok(())
        };
        let r = agree(self.comm, "deregister_window", local);
        drop(self);
        r
    }
}
