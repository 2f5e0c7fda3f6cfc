//! What the host's stream-ordered one-sided operations (`devcomm::rma`,
//! NCCL's `ncclPutSignal` / `ncclSignal` / `ncclWaitSignal`) hand their
//! kernels: the list of signals one `wait_signal` launch waits for.
//!
//! The other arguments of those kernels are plain values (a `DevComm`, window
//! descriptors, offsets, ids) passed one by one.

/// Most entries one wait kernel takes ([`RmaWaitList`]); the host splits
/// longer lists into several launches on the same stream.
pub const RMA_WAIT_MAX: usize = 8;

/// One signal to wait for: GIN signal `signal` (the id of the sending peer's
/// per-peer signal word) to reach its shadow plus `count`, watching the rings
/// of GIN context `context` for failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RmaWaitEntry {
    /// GIN signal id (below the device communicator's `signal_count`).
    pub signal: u32,
    /// GIN context whose failed rings end the wait.
    pub context: u32,
    /// How many more signal operations to wait for (added to the shadow).
    pub count: u64,
}

/// Up to [`RMA_WAIT_MAX`] waits for one kernel launch: `entries[..len]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RmaWaitList {
    /// The waits, the first `len` used.
    pub entries: [RmaWaitEntry; RMA_WAIT_MAX],
    /// Entries used.
    pub len: u32,
    /// Unused (alignment).
    pub reserved: u32,
}

// SAFETY: #[repr(C)] plain integers, the same layout on both targets (test below).
unsafe impl crate::KernelParam for RmaWaitList {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts() {
        assert_eq!(size_of::<RmaWaitEntry>(), 16);
        assert_eq!(offset_of!(RmaWaitEntry, count), 8);
        assert_eq!(size_of::<RmaWaitList>(), 16 * RMA_WAIT_MAX + 8);
        assert_eq!(offset_of!(RmaWaitList, len), 16 * RMA_WAIT_MAX);
    }
}
