//! What the host writes and the GPU reads: every `#[repr(C)]` structure and
//! code the two sides share, in one place (as NCCL's
//! `*_device_host_common.h`). The host crate (`devcomm`) and the GIN proxy
//! (`devcomm-gin`) use these definitions and declare no copies of their
//! own; the layout tests at the bottom of each module pin them.
//!
//! | module | what |
//! |---|---|
//! | here | [`DevComm`], [`WindowDesc`], [`AbortInfo`] |
//! | [`gin`] | [`gin::GinState`] and the proxy's rings: descriptors, slots, tails, the connection and backend codes |
//! | [`coll`] | [`coll::CollContext`], [`coll::CollArgs`]: the collectives' scratch, barriers and launch arguments |
//! | [`rma`] | [`rma::RmaWaitList`]: what the host's `wait_signal` hands its kernel |
//! | [`moe`] | [`moe::MoeContext`], [`moe::MoeArgs`], [`moe::MoeHtArgs`]: the MoE expert-parallel group's window layout and launch arguments |
//! | [`error`] | [`error::DeviceError`], the one table of error codes kernels report |
//!
//! Fields are private: the structures are made through `unsafe`
//! constructors whose contracts say what memory they promise, so that the
//! device API's safe functions can trust them.

pub mod coll;
pub mod error;
pub mod gin;
pub mod moe;
pub mod rma;

use crate::team::Team;

/// A registered symmetric window, as seen from one rank.
///
/// Made by the host crate (`devcomm::Window::desc`); its fields are private
/// so that safe code cannot point one at memory that is not a window (the
/// device API's safe functions rely on that), and readable through the
/// accessors.
#[doc(alias = "ncclWindow_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct WindowDesc {
    /// Address (in this process) where LSA peer 0's window is mapped.
    pub(crate) lsa_base: u64,
    /// Distance between consecutive LSA peers' mappings.
    pub(crate) stride: u64,
    /// Usable bytes of the window (the same on every rank).
    pub(crate) size: u64,
    /// The caller's index in the LSA team.
    pub(crate) lsa_rank: u32,
    /// Number of LSA peers mapped.
    pub(crate) lsa_size: u32,
    /// Registration flags (see `devcomm::WindowFlags`).
    pub(crate) flags: u32,
    /// Identifier of the window within its communicator.
    pub(crate) id: u32,
}

impl WindowDesc {
    /// No window: no peers mapped (every pointer it gives is null). What
    /// the ABI structures hold where an operand is not in a window.
    pub const NONE: WindowDesc =
        WindowDesc { lsa_base: 0, stride: 0, size: 0, lsa_rank: 0, lsa_size: 0, flags: 0, id: 0 };

    /// A window descriptor from its parts.
    ///
    /// # Safety
    /// For every `i < lsa_size`, `size` bytes at `lsa_base + i * stride` are
    /// memory the kernels given this descriptor may read and write (peer
    /// `i`'s window, mapped into this process) for as long as they run;
    /// `lsa_rank < lsa_size`; `id` names the window in its communicator's
    /// GIN window table when the window is used with GIN.
    #[allow(clippy::too_many_arguments)]
    pub const unsafe fn from_raw_parts(
        lsa_base: u64,
        stride: u64,
        size: u64,
        lsa_rank: u32,
        lsa_size: u32,
        flags: u32,
        id: u32,
    ) -> Self {
        WindowDesc { lsa_base, stride, size, lsa_rank, lsa_size, flags, id }
    }

    /// Address (in this process) where LSA peer 0's window is mapped.
    #[inline(always)]
    pub const fn lsa_base(&self) -> u64 {
        self.lsa_base
    }

    /// Distance between consecutive LSA peers' mappings.
    #[inline(always)]
    pub const fn stride(&self) -> u64 {
        self.stride
    }

    /// Usable bytes of the window (the same on every rank).
    #[inline(always)]
    pub const fn size(&self) -> u64 {
        self.size
    }

    /// The caller's index in the LSA team.
    #[inline(always)]
    pub const fn lsa_rank(&self) -> u32 {
        self.lsa_rank
    }

    /// Number of LSA peers mapped.
    #[inline(always)]
    pub const fn lsa_size(&self) -> u32 {
        self.lsa_size
    }

    /// Registration flags (see `devcomm::WindowFlags`).
    #[inline(always)]
    pub const fn flags(&self) -> u32 {
        self.flags
    }

    /// Identifier of the window within its communicator.
    #[inline(always)]
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// Address of byte `offset` of LSA peer `peer`'s window, or null if the
    /// peer or the offset is out of range.
    #[doc(alias = "ncclGetLsaPointer")]
    #[inline(always)]
    pub fn lsa_ptr<T>(&self, offset: u64, peer: u32) -> *mut T {
        if peer >= self.lsa_size || offset >= self.size {
            return core::ptr::null_mut();
        }
        (self.lsa_base + peer as u64 * self.stride + offset) as *mut T
    }

    /// Address of byte `offset` of the caller's own window (null if out of range).
    #[doc(alias = "ncclGetLocalPointer")]
    #[inline(always)]
    pub fn local_ptr<T>(&self, offset: u64) -> *mut T {
        self.lsa_ptr(offset, self.lsa_rank)
    }

    /// Address of byte `offset` of member `peer` of `team`, if that member is
    /// an LSA peer (null otherwise). `my_world_rank` and `lsa` come from the
    /// [`DevComm`].
    #[doc(alias = "ncclGetPeerPointer")]
    #[inline(always)]
    pub fn peer_ptr<T>(&self, team: &Team, lsa: &Team, my_world_rank: u32, offset: u64, peer: u32) -> *mut T {
        match team.rank_to_team(lsa, my_world_rank, peer) {
            Some(l) => self.lsa_ptr(offset, l),
            None => core::ptr::null_mut(),
        }
    }
}

/// Limits and state the device side needs for waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct AbortInfo {
    /// Host-mapped word the host sets non-zero on `abort()`; every spin loop reads it.
    pub(crate) flag: u64,
    /// Default wait timeout in nanoseconds (0 = wait forever, still abortable).
    pub(crate) timeout_ns: u64,
}

impl AbortInfo {
    /// Abort word `flag` (0: none) and default wait timeout `timeout_ns`
    /// (0: none).
    ///
    /// # Safety
    /// `flag` is 0 or the address of a 4-byte-aligned `u32` that stays
    /// readable from the device (host-mapped) while kernels use this.
    pub const unsafe fn new(flag: u64, timeout_ns: u64) -> Self {
        AbortInfo { flag, timeout_ns }
    }

    /// No abort word and no timeout: waits end only when they succeed.
    pub const fn none() -> Self {
        AbortInfo { flag: 0, timeout_ns: 0 }
    }

    /// The abort word's address (0: none).
    #[inline(always)]
    pub const fn flag(&self) -> u64 {
        self.flag
    }

    /// The default wait timeout in nanoseconds (0: none).
    #[inline(always)]
    pub const fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The same with another default timeout (0: none).
    #[inline(always)]
    pub const fn with_timeout_ns(mut self, timeout_ns: u64) -> Self {
        self.timeout_ns = timeout_ns;
        self
    }
}

/// The device communicator (`ncclDevComm`): one rank's view, passed to
/// kernels by value. Made by the host crate
/// (`devcomm::DevCommHandle::dev_comm`); its fields are private so that
/// safe code cannot make one that points at the wrong memory, and readable
/// through the accessors.
#[doc(alias = "ncclDevComm")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DevComm {
    /// World rank.
    pub(crate) rank: u32,
    /// World size.
    pub(crate) nranks: u32,
    /// Index in the LSA team.
    pub(crate) lsa_rank: u32,
    /// Size of the LSA team.
    pub(crate) lsa_size: u32,
    /// Number of LSA barriers the resources hold.
    pub(crate) lsa_barrier_count: u32,
    /// Reserved, zero.
    pub(crate) reserved0: u32,
    /// The resource window (barrier state and user-requested resource buffers).
    pub(crate) resources: WindowDesc,
    /// Offset of the LSA barrier inboxes in `resources`.
    pub(crate) lsa_barrier_offset: u64,
    /// Offset of this rank's private barrier epochs in `resources`.
    pub(crate) lsa_epoch_offset: u64,
    /// Abort flag and default timeout.
    pub(crate) abort: AbortInfo,
    /// GIN backend state (all zero without GIN).
    pub(crate) gin: gin::GinState,
}

impl DevComm {
    /// A device communicator without GIN (add it with [`DevComm::with_gin`]).
    /// The LSA rank and size are the resource window's.
    ///
    /// # Safety
    /// `rank < nranks`; `resources` is the communicator's resource window,
    /// which holds `lsa_barrier_count` LSA barriers' inboxes
    /// (`lsa_barrier_count * lsa_size` `u32`s) at `lsa_barrier_offset` and
    /// their epochs (`lsa_barrier_count` `u32`s) at `lsa_epoch_offset` on
    /// every LSA peer; `abort` as [`AbortInfo::new`] requires.
    pub const unsafe fn from_raw_parts(
        rank: u32,
        nranks: u32,
        resources: WindowDesc,
        lsa_barrier_count: u32,
        lsa_barrier_offset: u64,
        lsa_epoch_offset: u64,
        abort: AbortInfo,
    ) -> Self {
        DevComm {
            rank,
            nranks,
            lsa_rank: resources.lsa_rank,
            lsa_size: resources.lsa_size,
            lsa_barrier_count,
            reserved0: 0,
            resources,
            lsa_barrier_offset,
            lsa_epoch_offset,
            abort,
            gin: gin::GinState::NONE,
        }
    }

    /// The same with GIN state `gin`.
    ///
    /// # Safety
    /// `gin` describes the live GIN memory of this communicator (see
    /// [`gin::GinState::from_parts`]).
    pub const unsafe fn with_gin(mut self, gin: gin::GinState) -> Self {
        self.gin = gin;
        self
    }

    /// The same with another default wait timeout (0: none).
    #[inline(always)]
    pub const fn with_timeout_ns(mut self, timeout_ns: u64) -> Self {
        self.abort = self.abort.with_timeout_ns(timeout_ns);
        self
    }

    /// World rank.
    #[inline(always)]
    pub const fn rank(&self) -> u32 {
        self.rank
    }

    /// World size.
    #[inline(always)]
    pub const fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Index in the LSA team.
    #[inline(always)]
    pub const fn lsa_rank(&self) -> u32 {
        self.lsa_rank
    }

    /// Size of the LSA team.
    #[inline(always)]
    pub const fn lsa_size(&self) -> u32 {
        self.lsa_size
    }

    /// Number of LSA barriers.
    #[inline(always)]
    pub const fn lsa_barrier_count(&self) -> u32 {
        self.lsa_barrier_count
    }

    /// The resource window (barrier state and user-requested resource buffers).
    #[inline(always)]
    pub const fn resources(&self) -> WindowDesc {
        self.resources
    }

    /// Offset of the LSA barrier inboxes in the resource window.
    #[inline(always)]
    pub const fn lsa_barrier_offset(&self) -> u64 {
        self.lsa_barrier_offset
    }

    /// Offset of this rank's LSA barrier epochs in the resource window.
    #[inline(always)]
    pub const fn lsa_epoch_offset(&self) -> u64 {
        self.lsa_epoch_offset
    }

    /// Abort flag and default timeout.
    #[inline(always)]
    pub const fn abort(&self) -> AbortInfo {
        self.abort
    }

    /// GIN backend state (all zero without GIN).
    #[inline(always)]
    pub const fn gin(&self) -> &gin::GinState {
        &self.gin
    }

    /// The world team.
    #[doc(alias = "ncclTeamWorld")]
    #[inline(always)]
    pub const fn world(&self) -> Team {
        Team::world(self.nranks, self.rank)
    }

    /// The LSA team.
    #[doc(alias = "ncclTeamLsa")]
    #[inline(always)]
    pub const fn lsa(&self) -> Team {
        Team::lsa(self.lsa_size, self.lsa_rank)
    }

    /// The rail team.
    #[doc(alias = "ncclTeamRail")]
    #[inline(always)]
    pub const fn rail(&self) -> Team {
        Team::rail(self.nranks, self.lsa_size, self.rank)
    }
}

// SAFETY: all are #[repr(C)] plain data with the same layout on both targets
// (checked by the tests below).
unsafe impl crate::KernelParam for WindowDesc {}
// SAFETY: as above.
unsafe impl crate::KernelParam for DevComm {}
// SAFETY: as above.
unsafe impl crate::KernelParam for Team {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SymPtr;
    use crate::team::Team;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn window_desc_layout() {
        assert_eq!(size_of::<WindowDesc>(), 40);
        assert_eq!(align_of::<WindowDesc>(), 8);
        assert_eq!(offset_of!(WindowDesc, lsa_base), 0);
        assert_eq!(offset_of!(WindowDesc, stride), 8);
        assert_eq!(offset_of!(WindowDesc, size), 16);
        assert_eq!(offset_of!(WindowDesc, lsa_rank), 24);
        assert_eq!(offset_of!(WindowDesc, lsa_size), 28);
        assert_eq!(offset_of!(WindowDesc, flags), 32);
        assert_eq!(offset_of!(WindowDesc, id), 36);
    }

    #[test]
    fn sym_ptr_layout() {
        assert_eq!(size_of::<SymPtr<u64>>(), 48);
        assert_eq!(offset_of!(SymPtr<u64>, offset), 40);
    }

    #[test]
    fn dev_comm_layout() {
        assert_eq!(size_of::<DevComm>(), 96 + 88);
        assert_eq!(offset_of!(DevComm, gin), 96);
        assert_eq!(offset_of!(DevComm, rank), 0);
        assert_eq!(offset_of!(DevComm, nranks), 4);
        assert_eq!(offset_of!(DevComm, lsa_rank), 8);
        assert_eq!(offset_of!(DevComm, lsa_size), 12);
        assert_eq!(offset_of!(DevComm, lsa_barrier_count), 16);
        assert_eq!(offset_of!(DevComm, resources), 24);
        assert_eq!(offset_of!(DevComm, lsa_barrier_offset), 64);
        assert_eq!(offset_of!(DevComm, lsa_epoch_offset), 72);
        assert_eq!(offset_of!(DevComm, abort), 80);
        assert_eq!(size_of::<AbortInfo>(), 16);
    }

    #[test]
    fn team_layout() {
        assert_eq!(size_of::<Team>(), 12);
        assert_eq!(offset_of!(Team, stride), 8);
    }

    #[test]
    fn lsa_pointers_are_arithmetic_and_bounded() {
        let w = WindowDesc {
            lsa_base: 0x1000_0000,
            stride: 0x20_0000,
            size: 4096,
            lsa_rank: 1,
            lsa_size: 4,
            flags: 0,
            id: 3,
        };
        assert_eq!(w.lsa_ptr::<u8>(16, 2) as u64, 0x1000_0000 + 2 * 0x20_0000 + 16);
        assert_eq!(w.local_ptr::<u8>(0) as u64, 0x1020_0000);
        assert!(w.lsa_ptr::<u8>(4096, 0).is_null());
        assert!(w.lsa_ptr::<u8>(0, 4).is_null());
        let p = SymPtr::<u64>::new(w, 64).add(2);
        assert_eq!(p.lsa(3) as u64, 0x1000_0000 + 3 * 0x20_0000 + 80);
        let world = Team::world(8, 5);
        let lsa = Team::lsa(4, 1);
        assert_eq!(w.peer_ptr::<u8>(&world, &lsa, 5, 0, 6) as u64, w.lsa_ptr::<u8>(0, 2) as u64);
        assert!(w.peer_ptr::<u8>(&world, &lsa, 5, 0, 0).is_null());
    }
}
