//! What the host hands the device-callable collectives: [`CollContext`]
//! (scratch memory and barriers, made once per communicator) and
//! [`CollArgs`] (one host-launched collective).

use super::{DevComm, WindowDesc};

/// The memory and barriers the collectives of [`crate::coll`] work with,
/// on one rank: a device communicator's LSA barriers `barrier_base..
/// barrier_base + parts` (one per [`Part`](crate::coll::Part)), and a
/// scratch window laid out as:
///
/// * LL slots at `ll_offset`: 2 parities × `lsa_size` sources × `2 *
///   ll_bytes` bytes (each 8 bytes of payload travel with two 4-byte flags
///   in 16 bytes), zeroed when made;
/// * staging at `stage_offset`: an input area and a result area of
///   `stage_bytes` bytes each (ordinary buffers are copied through them in
///   chunks).
///
/// Made by the host crate (`devcomm::coll::Collectives::context`), passed
/// to kernels by value.
#[doc(alias = "ncclDevComm")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollContext {
    pub(crate) comm: DevComm,
    pub(crate) scratch: WindowDesc,
    pub(crate) ll_offset: u64,
    pub(crate) ll_bytes: u64,
    pub(crate) stage_offset: u64,
    pub(crate) stage_bytes: u64,
    pub(crate) barrier_base: u32,
    pub(crate) parts: u32,
}

impl CollContext {
    /// A context from its parts.
    ///
    /// # Safety
    /// `comm` is live and has LSA barriers `barrier_base..barrier_base +
    /// parts`, used by nothing else while collectives run; `scratch` is a
    /// window of the same LSA team whose every rank's copy holds the layout
    /// above (`ll_offset + 4 * lsa_size * ll_bytes <= stage_offset`, the
    /// staging areas inside the window, offsets and sizes multiples of 16,
    /// the LL slots zeroed before first use), used by nothing else.
    #[allow(clippy::too_many_arguments)]
    pub const unsafe fn from_raw_parts(
        comm: DevComm,
        scratch: WindowDesc,
        ll_offset: u64,
        ll_bytes: u64,
        stage_offset: u64,
        stage_bytes: u64,
        barrier_base: u32,
        parts: u32,
    ) -> Self {
        CollContext { comm, scratch, ll_offset, ll_bytes, stage_offset, stage_bytes, barrier_base, parts }
    }

    /// The device communicator.
    #[inline(always)]
    pub const fn comm(&self) -> &DevComm {
        &self.comm
    }

    /// The scratch window.
    #[inline(always)]
    pub const fn scratch(&self) -> WindowDesc {
        self.scratch
    }

    /// Payload bytes one LL slot carries per source rank: the largest
    /// message (all_reduce input) the LL algorithm takes.
    #[inline(always)]
    pub const fn ll_bytes(&self) -> u64 {
        self.ll_bytes
    }

    /// Bytes of each staging area (input and result).
    #[inline(always)]
    pub const fn stage_bytes(&self) -> u64 {
        self.stage_bytes
    }

    /// How many parts (CTAs working on one collective) the context has
    /// barriers for.
    #[inline(always)]
    pub const fn parts(&self) -> u32 {
        self.parts
    }

    /// First LSA barrier index of the context.
    #[inline(always)]
    pub const fn barrier_base(&self) -> u32 {
        self.barrier_base
    }

    /// Offset of LL slot `[parity][src]` in the scratch window.
    #[inline(always)]
    pub const fn ll_slot_offset(&self, parity: u32, src: u32) -> u64 {
        self.ll_offset + ((parity as u64 & 1) * self.scratch.lsa_size as u64 + src as u64) * 2 * self.ll_bytes
    }

    /// Offset of the input staging area.
    #[inline(always)]
    pub const fn stage_in_offset(&self) -> u64 {
        self.stage_offset
    }

    /// Offset of the result staging area.
    #[inline(always)]
    pub const fn stage_out_offset(&self) -> u64 {
        self.stage_offset + self.stage_bytes
    }
}

// SAFETY: #[repr(C)] plain data (two ABI structs, u64s, u32s) with the same
// layout on both targets.
unsafe impl crate::KernelParam for CollContext {}

/// Where one operand of a host-launched collective lives: a local device
/// address, and, when the operand lies in a registered window, that window
/// and the offset (peers then read it in place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollBuffer {
    /// Local device address of element 0.
    pub ptr: u64,
    /// The window, when `in_window` is 1.
    pub window: WindowDesc,
    /// Byte offset of element 0 in `window`.
    pub offset: u64,
    /// 1: in `window` at `offset` (and `ptr` is that window's local address).
    pub in_window: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One host-launched collective: what the kernels of `devcomm-kernels`'
/// `coll` module take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollArgs {
    /// The context.
    pub ctx: CollContext,
    /// Input.
    pub src: CollBuffer,
    /// Output (`ptr` only; local).
    pub dst: CollBuffer,
    /// Elements per rank (see each collective).
    pub count: u64,
    /// `PreMulSum`'s scalar, as the element's bits (little-endian, low bytes).
    pub scalar: u64,
    /// When non-zero: the device address the scalar is read from instead.
    pub scalar_ptr: u64,
    /// Where the kernel reports a failure: one `u32` error code (0 stays
    /// when it succeeds), device memory.
    pub errors: u64,
    /// `RedOp` code.
    pub op: u32,
    /// Root rank (LSA rank) for rooted collectives.
    pub root: u32,
    /// `Algorithm` code.
    pub algorithm: u32,
    /// The collective's sequence number, non-zero, the same on every rank
    /// (the LL flag).
    pub seq: u32,
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for CollArgs {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts() {
        assert_eq!(size_of::<CollBuffer>(), 8 + 40 + 8 + 8);
        assert_eq!(size_of::<CollContext>(), size_of::<DevComm>() + 40 + 32 + 8);
        assert_eq!(size_of::<CollArgs>() % 8, 0);
    }
}
