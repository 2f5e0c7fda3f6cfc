//! Kernel arguments copied once per CTA into the block's dynamic shared
//! memory, for the paths that hand them by reference to functions compiled
//! out of line.
//!
//! A kernel parameter whose address escapes into such a call is copied to
//! local memory at the kernel's entry, by every thread and on every path:
//! the collectives' 552-byte `CollArgs` cost an 8-byte graphed all-reduce
//! 2.1 µs of 5.5 on an H200, and a 2 MiB all-reduce on 128 CTAs about
//! 36 MB of local stores (`benches/results/2026-11-26-h200x2-one-barrier.md`;
//! `benches/gpu/entry_copy.py` lists the kernels that still copy). One
//! copy by the CTA's leader, read by every thread, costs one barrier.

use core::mem::{align_of, size_of};

use devcomm_device::arch::{dynamic_shared, dynamic_shared_size};
use devcomm_device::coop::{Coop, Cta};

/// `v`, copied by the CTA's leader to the start of the block's dynamic
/// shared memory; `None` (on every thread) when the launch gave the block
/// less than `size_of::<T>()` bytes of it (the host's launch sizes:
/// `coll::CONTEXT_SHARED_BYTES`, `moe::CONTEXT_SHARED_BYTES`).
///
/// # Safety
/// Every thread of the CTA calls it, with the same `v` (it synchronises the
/// CTA), and nothing else uses the start of the block's dynamic shared
/// memory while the returned reference lives.
#[inline(always)]
pub unsafe fn cta_copy<'c, T: Copy>(cta: &'c Cta, v: &T) -> Option<&'c T> {
    const { assert!(align_of::<T>() <= 16, "dynamic shared memory is 16-byte aligned") };
    if (dynamic_shared_size() as usize) < size_of::<T>() {
        return None;
    }
    let at = dynamic_shared::<T>();
    if cta.is_leader() {
        // SAFETY: the block's dynamic shared memory holds a `T` (checked
        // above), aligned for it (16-byte aligned, asserted above), written
        // by the leader alone before the barrier below.
        unsafe { at.write(*v) };
    }
    cta.sync();
    // SAFETY: initialised above and ordered before every thread's reads by
    // the barrier; the contract keeps other writers away while it lives,
    // and it lives no longer than the block (`'c`, the CTA's handle).
    Some(unsafe { &*at })
}
