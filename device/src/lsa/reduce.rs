//! Element-wise reductions over the LSA peers' copies of a window.

use crate::comm::WindowDesc;
use crate::coop::Coop;

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ReduceOp {
    /// `a + b`.
    Sum = 0,
    /// `a * b`.
    Prod = 1,
    /// `min(a, b)`.
    Min = 2,
    /// `max(a, b)`.
    Max = 3,
}

/// An element type that can be reduced.
pub trait Reducible: Copy {
    /// `op(self, other)`.
    fn combine(self, other: Self, op: ReduceOp) -> Self;
}

macro_rules! reducible_int {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            #[inline(always)]
            fn combine(self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self.wrapping_add(b),
                    ReduceOp::Prod => self.wrapping_mul(b),
                    ReduceOp::Min => if b < self { b } else { self },
                    ReduceOp::Max => if b > self { b } else { self },
                }
            }
        }
    )*};
}
reducible_int!(i8, u8, i32, u32, i64, u64);

macro_rules! reducible_float {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            #[inline(always)]
            fn combine(self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self + b,
                    ReduceOp::Prod => self * b,
                    // NaN-propagating, as NCCL's min/max on floats.
                    ReduceOp::Min => if self.is_nan() || b.is_nan() { Self::NAN } else if b < self { b } else { self },
                    ReduceOp::Max => if self.is_nan() || b.is_nan() { Self::NAN } else if b > self { b } else { self },
                }
            }
        }
    )*};
}
reducible_float!(f32, f64);

/// `dst[i] = op over LSA peers p (in LSA rank order) of window(p)[offset + i*size_of::<T>()]`
/// for `i < count`, spread over `coop`. Reading in the same peer order on
/// every rank makes floating-point results identical everywhere.
///
/// # Safety
/// The window holds `count` elements of `T` at `offset` (aligned for `T`) on
/// every peer, written and made visible (e.g. by an LSA barrier) before the
/// call; `dst` is valid for `count` elements; all threads of `coop` call
/// with the same arguments.
#[inline]
pub unsafe fn reduce<C: Coop, T: Reducible>(
    coop: &C,
    dst: *mut T,
    window: &WindowDesc,
    offset: u64,
    count: usize,
    op: ReduceOp,
) {
    let (t, n) = (coop.thread_rank() as usize, coop.size() as usize);
    let mut i = t;
    while i < count {
        let at = offset + (i * core::mem::size_of::<T>()) as u64;
        // SAFETY: the caller's contract: every peer's window holds `count`
        // aligned `T`s at `offset`, written and made visible before the call,
        // and `i < count`, so element `i` of peer 0 is in bounds and aligned;
        // no one writes it during the call.
        let mut acc = unsafe { crate::arch::load_volatile(window.lsa_ptr::<T>(at, 0)) };
        for p in 1..window.lsa_size {
            // SAFETY: as above, element `i` of peer `p < lsa_size`.
            acc = acc.combine(unsafe { crate::arch::load_volatile(window.lsa_ptr::<T>(at, p)) }, op);
        }
        // SAFETY: `i < count` and `dst` is valid for `count` elements (the
        // caller's contract); element `i` is this thread's alone (threads
        // take `i = t, t + n, ...` with distinct `t < n`).
        unsafe { crate::arch::store_volatile(dst.add(i), acc) };
        i += n;
    }
}
