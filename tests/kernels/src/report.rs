//! Error words shared by the test and benchmark kernels: the first error
//! code wins `errors[0]`, every error counts in `errors[1]`.

use devcomm_device::atomic::{self, Order, Scope};

/// Records a non-zero `code` in the two-word error buffer `errors`.
///
/// # Safety
/// `errors` points to two `u32`s in memory the kernel can write.
#[inline(always)]
pub(crate) unsafe fn report(errors: *mut u32, code: u32) {
    if code != 0 {
        atomic::compare_exchange(errors, 0, code, Order::Relaxed, Scope::Gpu);
        atomic::red_add_relaxed(errors.add(1), 1u32, Scope::Gpu);
    }
}

/// `r`'s value, or `None` after reporting its error code in `errors`.
///
/// # Safety
/// As for [`report`].
#[inline(always)]
pub(crate) unsafe fn check<T>(errors: *mut u32, r: Result<T, devcomm_device::gin::GinError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            report(errors, e.code());
            None
        }
    }
}

/// The memory order a kernel argument names: 0 relaxed, 1 acquire, 2 release, 3 acq_rel.
#[inline(always)]
pub(crate) fn order_of(order: u32) -> Order {
    match order {
        1 => Order::Acquire,
        2 => Order::Release,
        3 => Order::AcqRel,
        _ => Order::Relaxed,
    }
}
