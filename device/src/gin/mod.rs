//! GIN: GPU-initiated operations on peers the GPU cannot load/store.
//!
//! A kernel issues puts, inline puts and signals through a [`Gin`] handle;
//! the device communicator's backend carries them out. With the proxy
//! backend each operation becomes a [`GinDescriptor`] in a ring per
//! (context, peer) that a CPU progress thread drains ([`crate::abi::gin`] has the
//! protocol). The contract, as NCCL's:
//!
//! * operations on one context to one peer complete in order, so a signal
//!   seen by the peer implies every earlier put's data is visible;
//! * [`Gin::flush`] returns once the sources of every operation posted on the
//!   context so far have been read (they may be reused);
//! * counters count local completions ([`LocalAction::CounterInc`]);
//! * waits compare with rolling arithmetic and end on the abort flag or a
//!   timeout with an error, never by hanging.
//!
//! ```no_run
//! use devcomm_device::comm::{DevComm, WindowDesc};
//! use devcomm_device::coop::Cta;
//! use devcomm_device::gin::{Gin, GinError, LocalAction, RemoteAction};
//! /// # Safety
//! /// `win` is a window of `comm`'s communicator registered for GIN.
//! unsafe fn send(comm: &DevComm, win: &WindowDesc, dst_off: u64, src_off: u64, expected: u64) -> Result<(), GinError> {
//!     let (cta, gin, world) = (Cta::new(), Gin::new(comm, 0)?, comm.world());
//!     if comm.rank() == 0 {
//!         // put 1 MiB to rank 3 and bump its signal 0 once it has landed
//!         let signal = RemoteAction::SignalInc { signal: 0, strong: true };
//!         // SAFETY: the caller's contract.
//!         unsafe { gin.put(&cta, &world, 3, win, dst_off, win, src_off, 1 << 20, signal, LocalAction::None) }?;
//!         unsafe { gin.flush(&cta) }?; // the source may be reused
//!     } else if comm.rank() == 3 {
//!         gin.wait_signal(&cta, 0, expected)?;
//!     }
//!     Ok(())
//! }
//! ```

mod barrier;
pub mod proxy;

pub use crate::abi::gin::{GinBackend, GinConnection, GinState};

pub use barrier::{GinBarrierSession, GinBarrierTeam};

use crate::abi::gin::{self as abi, GinDescriptor, GinOp, LocalActionKind, RemoteActionKind};
use crate::atomic::{self, Order, Scope};
use crate::comm::{DevComm, SymPtr, WindowDesc};
use crate::coop::Coop;
use crate::team::Team;
use crate::wait::{self, Deadline, WaitError};
pub use proxy::QueueError;

/// Puts of at most this many bytes are posted inline (as a put-value of the
/// source's bytes, read by the posting thread).
pub const INLINE_PUT_BYTES: u64 = 8;

/// How many failed polls of a signal or counter pass between two looks at
/// the context's ring error words (one PCIe read per peer), in waits.
pub const RING_CHECK_EVERY: u32 = 16 * crate::wait::CHECK_EVERY;

/// The `bytes` (1..=8) bytes at `p` as a little-endian u64: one load where
/// they are one aligned 8-, 4-, 2- or 1-byte word, else byte by byte.
///
/// # Safety
/// `p..p + bytes` is readable.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
unsafe fn read_small(p: *const u8, bytes: u64) -> u64 {
    let aligned = (p as u64) % bytes == 0;
    // SAFETY: the caller's contract: `p..p + bytes` is readable. The 8-, 4-
    // and 2-byte reads happen only when `bytes` is that size and `p` is
    // aligned to it; otherwise each byte `p + i`, `i < bytes`, is read alone.
    unsafe {
        match bytes {
            8 if aligned => crate::arch::load_weak(p as *const u64),
            4 if aligned => crate::arch::load_weak(p as *const u32) as u64,
            2 if aligned => crate::arch::load_weak(p as *const u16) as u64,
            _ => {
                let mut v = 0u64;
                for i in 0..bytes {
                    v |= (crate::arch::load_weak(p.add(i as usize)) as u64) << (8 * i);
                }
                v
            }
        }
    }
}

/// What happens at the destination after the data has landed.
#[doc(alias = "ncclGin_SignalAdd")]
#[doc(alias = "ncclGin_SignalInc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAction {
    /// Nothing.
    None,
    /// `signal += 1` on the peer. `strong`: also ordered after every earlier
    /// operation on this context to this peer (weak: after its own put only).
    SignalInc {
        /// Signal id.
        signal: u32,
        /// Strong ordering.
        strong: bool,
    },
    /// `signal += value` on the peer.
    SignalAdd {
        /// Signal id.
        signal: u32,
        /// Increment.
        value: u64,
        /// Strong ordering.
        strong: bool,
    },
}

/// What happens locally once the source has been read.
#[doc(alias = "ncclGin_CounterInc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAction {
    /// Nothing.
    None,
    /// `counter += 1` on the caller.
    CounterInc {
        /// Counter id.
        counter: u32,
    },
}

/// Why a GIN call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GinError {
    /// The device communicator has no GIN backend.
    NoGin,
    /// Context id not below `contexts`.
    ContextOutOfRange,
    /// Peer index not below the team's size.
    PeerNotInTeam,
    /// The peer is not reachable with this connection type (rail: only the rail team).
    PeerNotConnected,
    /// Signal id out of range.
    SignalOutOfRange,
    /// Counter id out of range.
    CounterOutOfRange,
    /// Offset + bytes past a window's end.
    OutOfWindow,
    /// `put_value` of a type wider than 8 bytes.
    ValueTooWide,
    /// Barrier index out of range.
    BarrierOutOfRange,
    /// The ring failed or a wait gave up.
    Queue(QueueError),
}

impl From<QueueError> for GinError {
    fn from(e: QueueError) -> Self {
        GinError::Queue(e)
    }
}

impl From<WaitError> for GinError {
    fn from(e: WaitError) -> Self {
        GinError::Queue(QueueError::Wait(e))
    }
}

impl GinError {
    /// The non-zero code of [`crate::error::DeviceError`] for an error word
    /// the host reads: wait errors keep [`WaitError::code`] (1 timeout,
    /// 2 aborted), a failed ring is 3, the others are 32 + n.
    pub const fn code(self) -> u32 {
        use crate::error::DeviceError as D;
        (match self {
            GinError::Queue(QueueError::Wait(WaitError::Timeout)) => D::Timeout,
            GinError::Queue(QueueError::Wait(WaitError::Aborted)) => D::Aborted,
            GinError::Queue(QueueError::RingFailed) => D::RingFailed,
            GinError::NoGin => D::NoGin,
            GinError::ContextOutOfRange => D::ContextOutOfRange,
            GinError::PeerNotInTeam => D::PeerNotInTeam,
            GinError::PeerNotConnected => D::PeerNotConnected,
            GinError::SignalOutOfRange => D::SignalOutOfRange,
            GinError::CounterOutOfRange => D::CounterOutOfRange,
            GinError::OutOfWindow => D::OutOfWindow,
            GinError::ValueTooWide => D::ValueTooWide,
            GinError::BarrierOutOfRange => D::GinBarrierOutOfRange,
        }) as u32
    }
}

/// A kernel's handle on one GIN context of a device communicator.
#[doc(alias = "ncclGin")]
#[derive(Clone, Copy)]
pub struct Gin<'a> {
    comm: &'a DevComm,
    context: u32,
    /// The puts' sources are already released at system scope (see
    /// [`Gin::with_given_release`]).
    source_released: bool,
}

impl<'a> Gin<'a> {
    /// Context `context` of `comm`'s GIN backend.
    pub fn new(comm: &'a DevComm, context: u32) -> Result<Self, GinError> {
        if comm.gin.backend == GinBackend::None as u32 {
            return Err(GinError::NoGin);
        }
        if context >= comm.gin.contexts {
            return Err(GinError::ContextOutOfRange);
        }
        Ok(Gin { comm, context, source_released: false })
    }

    /// This handle, for puts whose source the caller has already released
    /// at `scope` (NCCL's `givenRelease`). A put must make its source
    /// visible to the agent that reads it (the proxy's copy engine or NIC)
    /// before that agent can see the request; by default every put pays a
    /// system-scope fence for this (about 2.5 µs for the posting thread on
    /// an H200). With `Scope::Sys` the puts skip it: for sources written by
    /// an earlier kernel or by the host, or after the caller's own
    /// `fence_acq_rel(Scope::Sys)` covering many puts. Narrower scopes
    /// change nothing (the proxy reads from outside the GPU).
    ///
    /// ```no_run
    /// # use devcomm_device::{atomic::Scope, comm::{DevComm, WindowDesc}, coop::ThreadCoop};
    /// # use devcomm_device::gin::{Gin, GinError, LocalAction, RemoteAction};
    /// # unsafe fn f(comm: &DevComm, win: &WindowDesc, peer: u32, n: u64, chunk: u64) -> Result<(), GinError> {
    /// // The window's data was filled before this kernel started: no fence per put.
    /// let gin = Gin::new(comm, 0)?.with_given_release(Scope::Sys);
    /// for i in 0..n {
    ///     // SAFETY: `win` belongs to `comm`'s communicator (the caller's contract).
    ///     unsafe {
    ///         gin.put(&ThreadCoop, &comm.world(), peer, win, i * chunk, win, i * chunk, chunk,
    ///                 RemoteAction::None, LocalAction::None)
    ///     }?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_given_release(self, scope: Scope) -> Self {
        Gin { source_released: scope == Scope::Sys, ..self }
    }

    /// The device communicator.
    pub fn comm(&self) -> &'a DevComm {
        self.comm
    }

    fn state(&self) -> &GinState {
        &self.comm.gin
    }

    /// World rank of member `peer` of `team`, checked against the connection type.
    fn world_peer(&self, team: &Team, peer: u32) -> Result<u32, GinError> {
        if peer >= team.nranks {
            return Err(GinError::PeerNotInTeam);
        }
        let c = self.comm;
        let w = team.rank_to_world(c.rank, peer);
        if w >= c.nranks {
            return Err(GinError::PeerNotInTeam);
        }
        self.connected(w)
    }

    /// World rank `w` (below `nranks`), checked against the connection
    /// type: a rail connection reaches the rail team only.
    pub(crate) fn connected(&self, w: u32) -> Result<u32, GinError> {
        let c = self.comm;
        if self.state().connection == GinConnection::Rail as u32 && !c.rail().contains_world(c.rank, w) {
            return Err(GinError::PeerNotConnected);
        }
        Ok(w)
    }

    fn check_signal(&self, id: u32) -> Result<(), GinError> {
        if id < self.state().signal_count {
            Ok(())
        } else {
            Err(GinError::SignalOutOfRange)
        }
    }

    fn check_counter(&self, id: u32) -> Result<(), GinError> {
        if id < self.state().counter_count {
            Ok(())
        } else {
            Err(GinError::CounterOutOfRange)
        }
    }

    /// Fills the remote- and local-action fields of `d`, checking ids.
    fn actions(&self, d: &mut GinDescriptor, remote: RemoteAction, local: LocalAction) -> Result<(), GinError> {
        self.actions_unchecked(d, remote, local, self.state().signal_count)
    }

    fn actions_unchecked(
        &self,
        d: &mut GinDescriptor,
        remote: RemoteAction,
        local: LocalAction,
        signal_limit: u32,
    ) -> Result<(), GinError> {
        match remote {
            RemoteAction::None => d.remote_action = RemoteActionKind::None as u8,
            RemoteAction::SignalInc { signal, strong } | RemoteAction::SignalAdd { signal, strong, .. } => {
                if signal >= signal_limit {
                    return Err(GinError::SignalOutOfRange);
                }
                d.signal = signal;
                d.flags = if strong { abi::FLAG_STRONG } else { 0 };
                (d.remote_action, d.value) = match remote {
                    RemoteAction::SignalAdd { value, .. } => (RemoteActionKind::SignalAdd as u8, value),
                    _ => (RemoteActionKind::SignalInc as u8, 1),
                };
            }
        }
        match local {
            LocalAction::None => d.local_action = LocalActionKind::None as u8,
            LocalAction::CounterInc { counter } => {
                self.check_counter(counter)?;
                d.local_action = LocalActionKind::CounterInc as u8;
                d.counter = counter;
            }
        }
        Ok(())
    }

    /// The backend seam: every operation reaches its backend here (and
    /// every flush in [`Gin::flush_peer`]). Only the proxy exists today; a
    /// GDAKI or GPI backend adds its arm (the host never makes a device
    /// communicator with a backend this crate cannot drive).
    fn post(&self, world_peer: u32, d: &GinDescriptor) -> Result<(), GinError> {
        match self.backend() {
            GinBackend::Proxy => {
                let ring = self.state().ring_index(self.context, world_peer, self.comm.nranks);
                // Only a put's proxy reads memory the caller wrote (its source);
                // a get writes this rank's memory and reads the peer's.
                let release = d.op == GinOp::Put as u8 && !self.source_released;
                // SAFETY: a `DevComm`'s `GinState` is set only through the unsafe
                // `DevComm::with_gin` and `GinState::from_parts`, whose contracts
                // make the GIN memory live and served by a proxy. The ring index is
                // `context * nranks + world_peer < contexts * nranks`: `Gin::new`
                // checked `context < contexts`, and every caller passes a
                // `world_peer < nranks` (checked by `world_peer`, or
                // `signal_internal`'s contract). `abort` is the same communicator's.
                unsafe { proxy::post(self.state(), &self.comm.abort, ring, d, release) }?;
                Ok(())
            }
            GinBackend::None | GinBackend::Gdaki | GinBackend::Gpi => Err(GinError::NoGin),
        }
    }

    /// Waits until every operation posted on this context to world rank
    /// `world_peer` has had its source read (see [`Gin::post`]).
    fn flush_peer(&self, world_peer: u32) -> Result<(), GinError> {
        match self.backend() {
            GinBackend::Proxy => {
                let ring = self.state().ring_index(self.context, world_peer, self.comm.nranks);
                // SAFETY: as in `post`: the GinState's memory is live (its
                // constructors' contracts) and `world_peer < nranks` (`flush`
                // passes peers below `nranks`), so the ring index is in range.
                unsafe { proxy::flush_ring(self.state(), &self.comm.abort, ring) }.map_err(GinError::from)
            }
            GinBackend::None | GinBackend::Gdaki | GinBackend::Gpi => Err(GinError::NoGin),
        }
    }

    fn backend(&self) -> GinBackend {
        match self.state().backend {
            b if b == GinBackend::Proxy as u32 => GinBackend::Proxy,
            b if b == GinBackend::Gdaki as u32 => GinBackend::Gdaki,
            b if b == GinBackend::Gpi as u32 => GinBackend::Gpi,
            _ => GinBackend::None,
        }
    }

    /// Puts `bytes` from `src` (offset `src_offset`) into member `peer` of
    /// `team`'s `dst` window (offset `dst_offset`), then applies `remote` at
    /// the peer and `local` here. Every thread of `coop` calls it; the coop is
    /// joined first (so all its writes to the source are included), its
    /// leader posts the operation, and every thread gets the result.
    /// Puts of at most [`INLINE_PUT_BYTES`] are read by the leader at once
    /// and travel inside the descriptor. Larger ones fence at system scope
    /// before posting, so the proxy reads what the coop wrote, unless the
    /// handle says the source is already released
    /// ([`Gin::with_given_release`]).
    ///
    /// # Safety
    /// The windows belong to this device communicator's communicator.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn put<C: Coop>(
        &self,
        coop: &C,
        team: &Team,
        peer: u32,
        dst: &WindowDesc,
        dst_offset: u64,
        src: &WindowDesc,
        src_offset: u64,
        bytes: u64,
        remote: RemoteAction,
        local: LocalAction,
    ) -> Result<(), GinError> {
        coop.sync();
        let r = if coop.is_leader() {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.put_leader(team, peer, dst, dst_offset, src, src_offset, bytes, remote, local) }
        } else {
            Ok(())
        };
        coop.agree(r)
    }

    /// The world rank of member `peer` of `team` and the descriptor of a
    /// `bytes`-byte transfer (`op`: put or get) between `src` at
    /// `src_offset` and `dst` at `dst_offset`, both ranges checked against
    /// their windows.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn transfer(
        &self,
        op: GinOp,
        team: &Team,
        peer: u32,
        dst: &WindowDesc,
        dst_offset: u64,
        src: &WindowDesc,
        src_offset: u64,
        bytes: u64,
    ) -> Result<(u32, GinDescriptor), GinError> {
        let w = self.world_peer(team, peer)?;
        let end = |off: u64, win: &WindowDesc| off.checked_add(bytes).is_some_and(|e| e <= win.size);
        if !end(dst_offset, dst) || !end(src_offset, src) {
            return Err(GinError::OutOfWindow);
        }
        let d = GinDescriptor {
            op: op as u8,
            peer: w,
            src_window: src.id,
            dst_window: dst.id,
            src_offset,
            dst_offset,
            bytes,
            ..Default::default()
        };
        Ok((w, d))
    }

    /// The part of [`Gin::put`] the coop's leader does.
    ///
    /// # Safety
    /// As for [`Gin::put`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    unsafe fn put_leader(
        &self,
        team: &Team,
        peer: u32,
        dst: &WindowDesc,
        dst_offset: u64,
        src: &WindowDesc,
        src_offset: u64,
        bytes: u64,
        remote: RemoteAction,
        local: LocalAction,
    ) -> Result<(), GinError> {
        let (w, mut d) = self.transfer(GinOp::Put, team, peer, dst, dst_offset, src, src_offset, bytes)?;
        if bytes != 0 && bytes <= INLINE_PUT_BYTES {
            // Small puts travel inline: this thread reads the source now (a
            // put's source may be read any time before the put is locally
            // complete), which spares the proxy a copy and the post a
            // system-scope fence. The payload rides in `src_offset`.
            // SAFETY: `src_offset + bytes <= src.size` (checked above), so
            // the bytes are inside this rank's own window.
            d.src_offset = unsafe { read_small(src.local_ptr::<u8>(src_offset), bytes) };
            d.src_window = 0;
            d.op = GinOp::PutValue as u8;
        }
        self.actions(&mut d, remote, local)?;
        self.post(w, &d)
    }

    /// [`Gin::put`] with typed symmetric pointers: `count` elements.
    ///
    /// # Safety
    /// As for [`Gin::put`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn put_sym<T, C: Coop>(
        &self,
        coop: &C,
        team: &Team,
        peer: u32,
        dst: SymPtr<T>,
        src: SymPtr<T>,
        count: u64,
        remote: RemoteAction,
        local: LocalAction,
    ) -> Result<(), GinError> {
        let bytes = count * core::mem::size_of::<T>() as u64;
        // SAFETY: the caller's contract is `put`'s (the symmetric pointers'
        // windows belong to this communicator); `put` checks the offsets and
        // `bytes` against the windows' sizes itself.
        unsafe { self.put(coop, team, peer, &dst.window, dst.offset, &src.window, src.offset, bytes, remote, local) }
    }

    /// Reads `bytes` from member `peer` of `team`'s `src` window (offset
    /// `src_offset`) into this rank's `dst` window (offset `dst_offset`),
    /// then applies `local` here once the data has landed. Every thread of
    /// `coop` calls it; its leader posts the request, every thread gets the
    /// result. The get is complete — the bytes visible to this rank's
    /// kernels — once a [`Gin::flush`] of this context returns after it, or
    /// once `local`'s counter has counted it ([`Gin::wait_counter`]); a
    /// get is not ordered with other operations (a later put to `peer` may
    /// land there before this get reads). NCCL 2.30 has `get` for its GDAKI
    /// backend only; devcomm's proxy carries it on every transport: copy engine,
    /// TCP, and verbs (RDMA read; tested against a model NIC only).
    ///
    /// The destination range must not be written by anyone until the get is
    /// complete, and stores this kernel made to it earlier must have been
    /// released at system scope (the proxy's copy lands beside them). A get
    /// from this rank itself may not overlap its destination.
    ///
    /// # Safety
    /// The windows belong to this device communicator's communicator (the
    /// source declared with `use_window` for same-host peers).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn get<C: Coop>(
        &self,
        coop: &C,
        team: &Team,
        peer: u32,
        dst: &WindowDesc,
        dst_offset: u64,
        src: &WindowDesc,
        src_offset: u64,
        bytes: u64,
        local: LocalAction,
    ) -> Result<(), GinError> {
        let r = if coop.is_leader() {
            (|| {
                let (w, mut d) = self.transfer(GinOp::Get, team, peer, dst, dst_offset, src, src_offset, bytes)?;
                self.actions(&mut d, RemoteAction::None, local)?;
                self.post(w, &d)
            })()
        } else {
            Ok(())
        };
        coop.agree(r)
    }

    /// Writes `value` (at most 8 bytes) into member `peer` of `team`'s `dst`
    /// window at `dst_offset`, then applies `remote`/`local`. One thread calls it.
    ///
    /// # Safety
    /// As for [`Gin::put`].
    #[doc(alias = "putValue")]
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn put_value<T: Copy>(
        &self,
        team: &Team,
        peer: u32,
        dst: &WindowDesc,
        dst_offset: u64,
        value: T,
        remote: RemoteAction,
        local: LocalAction,
    ) -> Result<(), GinError> {
        let size = core::mem::size_of::<T>();
        if size > 8 {
            return Err(GinError::ValueTooWide);
        }
        let w = self.world_peer(team, peer)?;
        if dst_offset.checked_add(size as u64).is_none_or(|e| e > dst.size) {
            return Err(GinError::OutOfWindow);
        }
        let mut raw = 0u64;
        // SAFETY: `size <= 8` bytes of a `Copy` value into a u64.
        unsafe {
            core::ptr::copy_nonoverlapping(&value as *const T as *const u8, &mut raw as *mut u64 as *mut u8, size)
        };
        // The payload rides in `src_offset`, which an inline put does not use.
        let mut d = GinDescriptor {
            op: GinOp::PutValue as u8,
            peer: w,
            dst_window: dst.id,
            dst_offset,
            src_offset: raw,
            bytes: size as u64,
            ..Default::default()
        };
        self.actions(&mut d, remote, local)?;
        self.post(w, &d)
    }

    /// Applies `action` at member `peer` of `team`, after every earlier
    /// operation of this context to that peer. One thread calls it.
    ///
    /// # Safety
    /// As for [`Gin::put`].
    #[inline]
    pub unsafe fn signal(&self, team: &Team, peer: u32, action: RemoteAction) -> Result<(), GinError> {
        let w = self.world_peer(team, peer)?;
        let mut d = GinDescriptor { op: GinOp::Signal as u8, peer: w, ..Default::default() };
        self.actions(&mut d, action, LocalAction::None)?;
        self.post(w, &d)
    }

    /// Signal with an id past the user's range (GIN barriers).
    ///
    /// # Safety
    /// As for [`Gin::put`]; `world_peer < nranks` and `signal` is below
    /// [`GinState::total_signals`](crate::abi::gin::GinState::total_signals).
    pub(crate) unsafe fn signal_internal(&self, world_peer: u32, signal: u32) -> Result<(), GinError> {
        let mut d = GinDescriptor { op: GinOp::Signal as u8, peer: world_peer, ..Default::default() };
        let remote = RemoteAction::SignalInc { signal, strong: true };
        self.actions_unchecked(&mut d, remote, LocalAction::None, self.state().total_signals())?;
        self.post(world_peer, &d)
    }

    /// Waits until the sources of every operation posted on this context so
    /// far have been read (they may be overwritten), then joins the coop.
    ///
    /// # Safety
    /// As for [`Gin::put`].
    #[inline]
    pub unsafe fn flush<C: Coop>(&self, coop: &C) -> Result<(), GinError> {
        let mut r = Ok(());
        let n = self.comm.nranks;
        let mut peer = coop.thread_rank();
        while peer < n && r.is_ok() {
            r = self.flush_peer(peer);
            peer += coop.size();
        }
        coop.agree(r)
    }

    /// Signal `id`'s word (checked by the caller).
    pub(crate) fn signal_word(&self, id: u32) -> *const u64 {
        self.signal_ptr(id)
    }

    fn signal_ptr(&self, id: u32) -> *mut u64 {
        (self.state().signals as *mut u64).wrapping_add(id as usize)
    }

    fn counter_ptr(&self, id: u32) -> *mut u64 {
        (self.state().counters as *mut u64).wrapping_add(id as usize)
    }

    /// Current value of signal `id` (acquire, system scope).
    #[doc(alias = "readSignal")]
    pub fn read_signal(&self, id: u32) -> Result<u64, GinError> {
        self.check_signal(id)?;
        // SAFETY: `id < signal_count` (checked above); a `DevComm`'s `GinState` comes from
        // `GinState::from_parts`, whose contract makes `signals` this rank's live
        // array of `total_signals() >= signal_count` aligned u64s, which the
        // proxy and kernels access only atomically.
        Ok(unsafe { atomic::load_acquire(self.signal_ptr(id), Scope::Sys) })
    }

    pub(crate) fn wait_signal_any(&self, id: u32, least: u64) -> Result<u64, GinError> {
        // SAFETY: the callers check `id`: below `signal_count` (`wait_signal`)
        // or below `total_signals()` (GIN barriers' internal signals), and
        // `GinState::from_parts`'s contract makes `signals` this rank's live
        // array of `total_signals()` aligned u64s, accessed only atomically.
        unsafe { self.wait_word(self.signal_ptr(id), least) }
    }

    /// Waits until the `u64` at `p` has reached `least` (rolling), ending
    /// with the abort flag, the timeout, or — checked every
    /// [`RING_CHECK_EVERY`] misses — [`QueueError::RingFailed`] once the
    /// proxy has failed a ring of this context: a signal or a completion
    /// that depends on a dead peer or a broken transport never comes, and
    /// saying so beats a timeout.
    ///
    /// # Safety
    /// `p` is valid, aligned, and written only atomically.
    unsafe fn wait_word(&self, p: *const u64, least: u64) -> Result<u64, GinError> {
        let mut deadline = Deadline::new(&self.comm.abort);
        let mut misses = 0u32;
        loop {
            // SAFETY: the caller's contract.
            if let Some(v) = unsafe { wait::poll_after(p, Scope::Sys, misses, |v| wait::rolling_ge_u64(v, least)) } {
                return Ok(v);
            }
            misses = misses.wrapping_add(1);
            if misses % RING_CHECK_EVERY == 0 && self.any_ring_failed() {
                return Err(GinError::Queue(QueueError::RingFailed));
            }
            deadline.poll()?;
        }
    }

    /// Whether the proxy marked any ring of this context failed.
    pub(crate) fn any_ring_failed(&self) -> bool {
        let n = self.comm.nranks;
        (0..n).any(|peer| {
            let ring = self.state().ring_index(self.context, peer, n);
            // SAFETY: `peer < nranks` and `context < contexts` (`Gin::new`),
            // so the ring exists in the live GIN memory of `GinState`'s contract.
            unsafe { proxy::ring_failed(self.state(), ring) }
        })
    }

    /// Waits (the coop's leader polls) until signal `id` has reached `least`
    /// (rolling), then joins the coop. Returns the value seen (to the leader;
    /// the others get `least`); an error reaches every thread of the coop:
    /// a timeout, the abort flag, or a ring of this context that the proxy
    /// failed (a dead peer: `GinError::Queue(QueueError::RingFailed)`).
    #[doc(alias = "waitSignal")]
    pub fn wait_signal<C: Coop>(&self, coop: &C, id: u32, least: u64) -> Result<u64, GinError> {
        self.check_signal(id)?;
        let r = if coop.is_leader() { self.wait_signal_any(id, least) } else { Ok(least) };
        coop.agree(r)
    }

    /// Address of signal `id`'s shadow (device memory, the caller's own).
    #[doc(alias = "getSignalShadowPtr")]
    pub fn signal_shadow(&self, id: u32) -> Result<*mut u64, GinError> {
        self.check_signal(id)?;
        Ok((self.state().shadows as *mut u64).wrapping_add(id as usize))
    }

    /// Adds `delta` to signal `id`'s shadow; returns the new shadow.
    #[doc(alias = "increaseSignalShadow")]
    pub fn increase_signal_shadow(&self, id: u32, delta: u64) -> Result<u64, GinError> {
        let p = self.signal_shadow(id)?;
        // SAFETY: `p` is shadow `id` with `id < signal_count` (checked by
        // `signal_shadow`); `GinState::from_parts`'s contract makes `shadows`
        // this rank's live device array of one aligned u64 per signal,
        // accessed only atomically.
        Ok(unsafe { atomic::fetch_add(p, delta, Order::Relaxed, Scope::Gpu) }.wrapping_add(delta))
    }

    /// Waits until signal `id` has reached its shadow.
    #[doc(alias = "waitSignalMeetShadow")]
    pub fn wait_signal_meet_shadow<C: Coop>(&self, coop: &C, id: u32) -> Result<u64, GinError> {
        let p = self.signal_shadow(id)?;
        // SAFETY: as in `increase_signal_shadow`: a checked shadow of this rank.
        let target = unsafe { atomic::load_relaxed(p, Scope::Gpu) };
        self.wait_signal(coop, id, target)
    }

    /// Waits until signal `id` has reached its shadow plus `least_delta`,
    /// then moves the shadow to the value observed (`ncclGin::waitSignalFollowShadow`):
    /// the usual "expect at least `least_delta` more signals" step. Returns,
    /// to every thread of the coop, the shadow before and how far it moved
    /// (at least `least_delta`); an error reaches every thread.
    #[doc(alias = "waitSignalFollowShadow")]
    pub fn wait_signal_follow_shadow<C: Coop>(
        &self,
        coop: &C,
        id: u32,
        least_delta: u64,
    ) -> Result<(u64, u64), GinError> {
        let p = self.signal_shadow(id)?;
        // SAFETY: as in `increase_signal_shadow`: `p` is this rank's shadow of a
        // checked signal id, live aligned device memory accessed only atomically.
        let before = unsafe { atomic::load_relaxed(p, Scope::Gpu) };
        coop.sync(); // every thread has read `before` before the leader moves it
        let r = if coop.is_leader() {
            self.wait_signal_any(id, before.wrapping_add(least_delta)).map(|seen| {
                // SAFETY: as above.
                unsafe { atomic::store_relaxed(p, seen, Scope::Gpu) };
            })
        } else {
            Ok(())
        };
        coop.agree(r)?;
        // SAFETY: as above; the leader's store is ordered before by `agree`'s barrier.
        let after = unsafe { atomic::load_relaxed(p, Scope::Gpu) };
        Ok((before, after.wrapping_sub(before)))
    }

    /// Sets signal `id` and its shadow to 0. Only when no operation that
    /// signals it is in flight.
    #[doc(alias = "resetSignal")]
    pub fn reset_signal(&self, id: u32) -> Result<(), GinError> {
        let shadow = self.signal_shadow(id)?;
        // SAFETY: `signal_shadow` checked `id < signal_count`; the signal and
        // its shadow are then live aligned u64s of this rank's arrays
        // (`GinState::from_parts`'s contract), accessed only atomically.
        unsafe {
            atomic::store_relaxed(self.signal_ptr(id), 0, Scope::Sys);
            atomic::store_relaxed(shadow, 0, Scope::Gpu);
        }
        Ok(())
    }

    /// Current value of counter `id`.
    #[doc(alias = "readCounter")]
    pub fn read_counter(&self, id: u32) -> Result<u64, GinError> {
        self.check_counter(id)?;
        // SAFETY: `id < counter_count` (checked above); `GinState::from_parts`'s
        // contract makes `counters` this rank's live array of `counter_count`
        // aligned u64s, accessed only atomically.
        Ok(unsafe { atomic::load_acquire(self.counter_ptr(id), Scope::Sys) })
    }

    /// Waits (the leader polls) until counter `id` has reached `least`, then
    /// joins the coop; an error reaches every thread of the coop.
    #[doc(alias = "waitCounter")]
    pub fn wait_counter<C: Coop>(&self, coop: &C, id: u32, least: u64) -> Result<u64, GinError> {
        self.check_counter(id)?;
        let r = if coop.is_leader() {
            // SAFETY: id checked (`check_counter`); `GinState::from_parts`'s
            // contract makes `counters` this rank's live array of
            // `counter_count` aligned u64s, accessed only atomically.
            unsafe { self.wait_word(self.counter_ptr(id), least) }
        } else {
            Ok(least)
        };
        coop.agree(r)
    }

    /// Sets counter `id` to 0 (only when no operation that counts on it is in flight).
    #[doc(alias = "resetCounter")]
    pub fn reset_counter(&self, id: u32) -> Result<(), GinError> {
        self.check_counter(id)?;
        // SAFETY: `id < counter_count` (checked above); `GinState::from_parts`'s
        // contract makes `counters` this rank's live array of `counter_count`
        // aligned u64s, accessed only atomically.
        unsafe { atomic::store_relaxed(self.counter_ptr(id), 0, Scope::Sys) };
        Ok(())
    }
}
