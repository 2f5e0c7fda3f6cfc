//! What the host hands a kernel, and typed pointers into windows.
//!
//! [`DevComm`], [`WindowDesc`] and [`AbortInfo`] are defined with the rest of
//! what the host and the device share, in [`crate::abi`]; they are
//! re-exported here, where kernels look for them. [`SymPtr`] is the
//! device-side convenience on top.
//!
//! Address arithmetic: every rank maps the windows of all its LSA peers into
//! one reserved range, peer `i` at `lsa_base + i * stride`. An LSA pointer is
//! therefore `lsa_base + peer * stride + offset`, no table lookup.

pub use crate::abi::{AbortInfo, DevComm, WindowDesc};

/// A typed pointer into a window: the same `offset` on every rank.
#[doc(alias = "ncclSymPtr")]
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SymPtr<T> {
    /// The window.
    pub window: WindowDesc,
    /// Byte offset of element 0 in the window.
    pub offset: u64,
    _t: core::marker::PhantomData<*mut T>,
}

impl<T> Clone for SymPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SymPtr<T> {}

impl<T> SymPtr<T> {
    /// Element 0 at byte `offset` of `window`.
    #[inline(always)]
    pub const fn new(window: WindowDesc, offset: u64) -> Self {
        SymPtr { window, offset, _t: core::marker::PhantomData }
    }

    /// The pointer `n` elements further.
    #[inline(always)]
    pub const fn add(self, n: u64) -> Self {
        SymPtr::new(self.window, self.offset + n * core::mem::size_of::<T>() as u64)
    }

    /// The caller's copy.
    #[inline(always)]
    pub fn local(&self) -> *mut T {
        self.window.local_ptr(self.offset)
    }

    /// LSA peer `peer`'s copy.
    #[inline(always)]
    pub fn lsa(&self, peer: u32) -> *mut T {
        self.window.lsa_ptr(self.offset, peer)
    }
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets
// (checked in `crate::abi`'s tests).
unsafe impl<T: 'static> crate::KernelParam for SymPtr<T> {}
