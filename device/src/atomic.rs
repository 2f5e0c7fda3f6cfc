//! Memory-ordering primitives with an explicit scope, as inline PTX.
//!
//! Rust's own atomics lower `load(Acquire)`/`store(Release)` correctly on
//! `nvptx64`, but read-modify-write operations lose their ordering on the
//! nightly we build with, and Rust has no notion of *scope*. Every ordered or
//! scoped access devcomm makes goes through this module instead:
//!
//! | operation | PTX |
//! |---|---|
//! | [`load_relaxed`] / [`load_acquire`] | `ld.relaxed.<scope>` / `ld.acquire.<scope>` |
//! | [`store_relaxed`] / [`store_release`] | `st.relaxed.<scope>` / `st.release.<scope>` |
//! | [`store_pair_relaxed`] | `st.relaxed.<scope>.v2.u64` |
//! | [`fetch_add`], [`fetch_max`], [`exchange`], [`compare_exchange`] | `atom.<order>.<scope>.{add,max,exch,cas}` |
//! | [`red_add_relaxed`] / [`red_add_release`] | `red.relaxed.<scope>.add` / `red.release.<scope>.add` |
//! | [`fence_acq_rel`] / [`fence_sc`] | `fence.acq_rel.<scope>` / `fence.sc.<scope>` |
//!
//! Scopes follow the PTX memory model: [`Scope::Cta`] orders with threads of
//! the same block, [`Scope::Gpu`] with every thread of the GPU, [`Scope::Sys`]
//! with other GPUs (over NVLink) and the CPU. Use the narrowest scope that
//! contains every observer: a flag a peer GPU polls needs `Sys`.
//!
//! Addresses are generic (global or shared). On the host the same functions
//! use `core::sync::atomic` with the corresponding ordering. x86 is stronger
//! than the GPU; the emulator's strict mode (`DEVCOMM_EMU_STRICT=1`, see
//! [`crate::emu`]) makes up for it: every release here (a release or
//! acq_rel operation, a fence) publishes the calling thread's delayed plain
//! stores, every acquire orders its later loads for the race check, and
//! plain stores without a release stay invisible for a while. Scopes are
//! modelled there only for stores to other GPUs' memory: a CTA-scope
//! release publishes them to the block, a GPU- or system-scope one to
//! everyone.
//!
//! ```no_run
//! use devcomm_device::atomic::{self, Scope};
//! /// # Safety
//! /// `data` and `flag` are valid for the producer and the consumer.
//! unsafe fn producer(data: *mut u64, flag: *mut u32) {
//!     // SAFETY: the caller's contract. Data first, then the flag with release.
//!     unsafe {
//!         *data = 42;
//!         atomic::store_release(flag, 1u32, Scope::Sys);
//!     }
//! }
//! /// # Safety
//! /// As for `producer`.
//! unsafe fn consumer(data: *const u64, flag: *const u32) -> u64 {
//!     // SAFETY: the caller's contract. The acquire load orders the data read after it.
//!     unsafe {
//!         while atomic::load_acquire(flag, Scope::Sys) != 1 {}
//!         *data // 42
//!     }
//! }
//! ```

/// The set of threads an ordering applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Threads of the same block (CTA).
    Cta,
    /// All threads of the same GPU.
    Gpu,
    /// All threads of all GPUs and the host.
    Sys,
}

/// Ordering of a read-modify-write operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    /// No ordering beyond the operation's own atomicity.
    Relaxed,
    /// Later accesses stay after it.
    Acquire,
    /// Earlier accesses stay before it.
    Release,
    /// Both.
    AcqRel,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

/// A word that PTX can access atomically: `u32` or `u64`.
pub trait AtomicWord: Copy + sealed::Sealed {
    /// # Safety
    /// As for [`load_relaxed`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn ld_relaxed(p: *const Self, s: Scope) -> Self;
    /// # Safety
    /// As for [`load_acquire`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn ld_acquire(p: *const Self, s: Scope) -> Self;
    /// # Safety
    /// As for [`store_relaxed`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn st_relaxed(p: *mut Self, v: Self, s: Scope);
    /// # Safety
    /// As for [`store_release`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn st_release(p: *mut Self, v: Self, s: Scope);
    /// # Safety
    /// As for [`fetch_add`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn atom_add(p: *mut Self, v: Self, o: Order, s: Scope) -> Self;
    /// # Safety
    /// As for [`fetch_max`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn atom_max(p: *mut Self, v: Self, o: Order, s: Scope) -> Self;
    /// # Safety
    /// As for [`exchange`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn atom_exch(p: *mut Self, v: Self, o: Order, s: Scope) -> Self;
    /// # Safety
    /// As for [`compare_exchange`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn atom_cas(p: *mut Self, cmp: Self, new: Self, o: Order, s: Scope) -> Self;
    /// # Safety
    /// As for [`red_add_relaxed`]: `p` is valid and aligned; concurrent accesses are atomic.
    #[doc(hidden)]
    unsafe fn red_add(p: *mut Self, v: Self, release: bool, s: Scope);
}

/// Atomic load with no ordering, visible at `scope`.
///
/// # Safety
/// `p` is valid and aligned; concurrent writers use atomic operations.
#[inline(always)]
pub unsafe fn load_relaxed<T: AtomicWord>(p: *const T, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::ld_relaxed(p, scope) }
}

/// Atomic load with acquire ordering at `scope`.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn load_acquire<T: AtomicWord>(p: *const T, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::ld_acquire(p, scope) }
}

/// Atomic store with no ordering.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn store_relaxed<T: AtomicWord>(p: *mut T, v: T, scope: Scope) {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::st_relaxed(p, v, scope) }
}

/// Atomic store with release ordering at `scope`: every access of this
/// thread before it is visible to whoever acquires the stored value.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn store_release<T: AtomicWord>(p: *mut T, v: T, scope: Scope) {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::st_release(p, v, scope) }
}

/// `*p += v` atomically; returns the old value.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn fetch_add<T: AtomicWord>(p: *mut T, v: T, order: Order, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::atom_add(p, v, order, scope) }
}

/// `*p = max(*p, v)` atomically (unsigned); returns the old value.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn fetch_max<T: AtomicWord>(p: *mut T, v: T, order: Order, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::atom_max(p, v, order, scope) }
}

/// `*p = v` atomically; returns the old value.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn exchange<T: AtomicWord>(p: *mut T, v: T, order: Order, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::atom_exch(p, v, order, scope) }
}

/// If `*p == current`, sets it to `new`; returns the old value either way.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn compare_exchange<T: AtomicWord>(p: *mut T, current: T, new: T, order: Order, scope: Scope) -> T {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::atom_cas(p, current, new, order, scope) }
}

/// `*p += v` without returning the old value (`red`), relaxed.
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn red_add_relaxed<T: AtomicWord>(p: *mut T, v: T, scope: Scope) {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::red_add(p, v, false, scope) }
}

/// `*p += v` without returning the old value (`red`), with release ordering:
/// the cheapest way to publish "data written, then counter bumped".
///
/// # Safety
/// As for [`load_relaxed`].
#[inline(always)]
pub unsafe fn red_add_release<T: AtomicWord>(p: *mut T, v: T, scope: Scope) {
    // SAFETY: the caller upholds this function's contract (valid, aligned,
    // atomically accessed), which is the `AtomicWord` method's contract.
    unsafe { T::red_add(p, v, true, scope) }
}

/// Two relaxed 8-byte atomic stores at `scope` in one instruction
/// (`v[0]` at `p`, `v[1]` at `p + 8`): each word is single-copy atomic,
/// with no order between the two.
///
/// # Safety
/// `p` is valid for 16 bytes, 16-byte aligned, and every concurrent access
/// to either word is atomic.
#[inline(always)]
pub unsafe fn store_pair_relaxed(p: *mut u64, v: [u64; 2], scope: Scope) {
    // SAFETY: the caller upholds this function's contract (16 valid, 16-byte
    // aligned bytes, accessed atomically), which is `imp::store_pair_relaxed`'s.
    unsafe { imp::store_pair_relaxed(p, v, scope) }
}

/// Acquire-release fence at `scope`.
#[inline(always)]
pub fn fence_acq_rel(scope: Scope) {
    imp::fence(false, scope)
}

/// Sequentially consistent fence at `scope`.
#[inline(always)]
pub fn fence_sc(scope: Scope) {
    imp::fence(true, scope)
}

#[cfg(target_arch = "nvptx64")]
mod imp {
    //! Inline PTX. Safety of every block: the caller guarantees a valid,
    //! aligned generic address (the `unsafe fn` contracts above); each
    //! instruction touches exactly that word.
    use super::{AtomicWord, Order, Scope};
    use core::arch::asm;

    #[inline(always)]
    pub fn fence(sc: bool, s: Scope) {
        // SAFETY: fences take no operands and touch no memory; no preconditions.
        unsafe {
            match (sc, s) {
                (false, Scope::Cta) => asm!("fence.acq_rel.cta;", options(nostack)),
                (false, Scope::Gpu) => asm!("fence.acq_rel.gpu;", options(nostack)),
                (false, Scope::Sys) => asm!("fence.acq_rel.sys;", options(nostack)),
                (true, Scope::Cta) => asm!("fence.sc.cta;", options(nostack)),
                (true, Scope::Gpu) => asm!("fence.sc.gpu;", options(nostack)),
                (true, Scope::Sys) => asm!("fence.sc.sys;", options(nostack)),
            }
        }
    }

    // One arm per scope; `$ins` is the instruction up to the scope.
    macro_rules! by_scope {
        ($s:expr, |$sc:ident| $body:expr) => {
            match $s {
                Scope::Cta => {
                    macro_rules! $sc {
                        () => {
                            "cta"
                        };
                    }
                    $body
                }
                Scope::Gpu => {
                    macro_rules! $sc {
                        () => {
                            "gpu"
                        };
                    }
                    $body
                }
                Scope::Sys => {
                    macro_rules! $sc {
                        () => {
                            "sys"
                        };
                    }
                    $body
                }
            }
        };
    }

    macro_rules! by_order {
        ($o:expr, |$ord:ident| $body:expr) => {
            match $o {
                Order::Relaxed => {
                    macro_rules! $ord {
                        () => {
                            "relaxed"
                        };
                    }
                    $body
                }
                Order::Acquire => {
                    macro_rules! $ord {
                        () => {
                            "acquire"
                        };
                    }
                    $body
                }
                Order::Release => {
                    macro_rules! $ord {
                        () => {
                            "release"
                        };
                    }
                    $body
                }
                Order::AcqRel => {
                    macro_rules! $ord {
                        () => {
                            "acq_rel"
                        };
                    }
                    $body
                }
            }
        };
    }

    macro_rules! impl_word {
        ($t:ty, $ty:literal, $b:literal, $reg:ident) => {
            impl AtomicWord for $t {
                #[inline(always)]
                unsafe fn ld_relaxed(p: *const Self, s: Scope) -> Self {
                    let v: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_scope!(s, |sc| unsafe { asm!(concat!("ld.relaxed.", sc!(), ".", $ty, " {v}, [{p}];"), v = out($reg) v, p = in(reg64) p, options(nostack)) });
                    v
                }
                #[inline(always)]
                unsafe fn ld_acquire(p: *const Self, s: Scope) -> Self {
                    let v: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_scope!(s, |sc| unsafe { asm!(concat!("ld.acquire.", sc!(), ".", $ty, " {v}, [{p}];"), v = out($reg) v, p = in(reg64) p, options(nostack)) });
                    v
                }
                #[inline(always)]
                unsafe fn st_relaxed(p: *mut Self, v: Self, s: Scope) {
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_scope!(s, |sc| unsafe { asm!(concat!("st.relaxed.", sc!(), ".", $ty, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p, options(nostack)) });
                }
                #[inline(always)]
                unsafe fn st_release(p: *mut Self, v: Self, s: Scope) {
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_scope!(s, |sc| unsafe { asm!(concat!("st.release.", sc!(), ".", $ty, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p, options(nostack)) });
                }
                #[inline(always)]
                unsafe fn atom_add(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    let old: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_order!(o, |ord| by_scope!(s, |sc| unsafe { asm!(concat!("atom.", ord!(), ".", sc!(), ".add.", $ty, " {old}, [{p}], {v};"), old = out($reg) old, v = in($reg) v, p = in(reg64) p, options(nostack)) }));
                    old
                }
                #[inline(always)]
                unsafe fn atom_max(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    let old: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_order!(o, |ord| by_scope!(s, |sc| unsafe { asm!(concat!("atom.", ord!(), ".", sc!(), ".max.", $ty, " {old}, [{p}], {v};"), old = out($reg) old, v = in($reg) v, p = in(reg64) p, options(nostack)) }));
                    old
                }
                #[inline(always)]
                unsafe fn atom_exch(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    let old: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_order!(o, |ord| by_scope!(s, |sc| unsafe { asm!(concat!("atom.", ord!(), ".", sc!(), ".exch.", $b, " {old}, [{p}], {v};"), old = out($reg) old, v = in($reg) v, p = in(reg64) p, options(nostack)) }));
                    old
                }
                #[inline(always)]
                unsafe fn atom_cas(p: *mut Self, cmp: Self, new: Self, o: Order, s: Scope) -> Self {
                    let old: $t;
                    // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                    // aligned generic address of a `Self` that is only accessed atomically, and
                    // the instruction touches exactly that word.
                    by_order!(o, |ord| by_scope!(s, |sc| unsafe { asm!(concat!("atom.", ord!(), ".", sc!(), ".cas.", $b, " {old}, [{p}], {c}, {n};"), old = out($reg) old, c = in($reg) cmp, n = in($reg) new, p = in(reg64) p, options(nostack)) }));
                    old
                }
                #[inline(always)]
                unsafe fn red_add(p: *mut Self, v: Self, release: bool, s: Scope) {
                    if release {
                        // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                        // aligned generic address of a `Self` that is only accessed atomically, and
                        // the instruction touches exactly that word.
                        by_scope!(s, |sc| unsafe { asm!(concat!("red.release.", sc!(), ".add.", $ty, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p, options(nostack)) });
                    } else {
                        // SAFETY: the method's contract (as for `load_relaxed`): `p` is a valid,
                        // aligned generic address of a `Self` that is only accessed atomically, and
                        // the instruction touches exactly that word.
                        by_scope!(s, |sc| unsafe { asm!(concat!("red.relaxed.", sc!(), ".add.", $ty, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p, options(nostack)) });
                    }
                }
            }
        };
    }

    impl_word!(u32, "u32", "b32", reg32);
    impl_word!(u64, "u64", "b64", reg64);

    /// # Safety
    /// As for [`super::store_pair_relaxed`]: 16 valid bytes, 16-byte aligned, accessed atomically.
    #[inline(always)]
    pub unsafe fn store_pair_relaxed(p: *mut u64, v: [u64; 2], s: Scope) {
        // SAFETY: the caller's contract: `p` is valid for 16 bytes, 16-byte aligned
        // (as `.v2.u64` needs), and accessed atomically; the store writes only those bytes.
        by_scope!(s, |sc| unsafe {
            asm!(concat!("st.relaxed.", sc!(), ".v2.u64 [{p}], {{{a}, {b}}};"), a = in(reg64) v[0], b = in(reg64) v[1],
                 p = in(reg64) p, options(nostack))
        });
    }
}

#[cfg(not(target_arch = "nvptx64"))]
mod imp {
    //! Host equivalents through `core::sync::atomic`. Safety of every block:
    //! the caller guarantees a valid, aligned address whose concurrent
    //! accesses are atomic (the `unsafe fn` contracts above), which is what
    //! `Atomic*::from_ptr` requires. Each operation tells the strict
    //! emulator (when installed) about the access and its ordering:
    //! [`crate::emu::atomic_access`] first, then a release before the
    //! operation, an acquire after it.
    use super::{AtomicWord, Order, Scope};
    use crate::emu;
    use core::sync::atomic::{fence as cfence, AtomicU32, AtomicU64, Ordering};

    pub fn fence(sc: bool, s: Scope) {
        let cta = s == Scope::Cta;
        emu::order(false, true, cta);
        cfence(if sc { Ordering::SeqCst } else { Ordering::AcqRel });
        emu::order(true, false, cta);
    }

    /// # Safety
    /// As for [`super::store_pair_relaxed`]: 16 valid bytes, 16-byte aligned, accessed atomically.
    pub unsafe fn store_pair_relaxed(p: *mut u64, v: [u64; 2], _s: Scope) {
        emu::atomic_access(p as *const u8, 16);
        // SAFETY: the caller's contract (16 valid, aligned bytes, accessed atomically).
        unsafe {
            AtomicU64::from_ptr(p).store(v[0], Ordering::Relaxed);
            AtomicU64::from_ptr(p.add(1)).store(v[1], Ordering::Relaxed);
        }
    }

    fn rmw(o: Order) -> Ordering {
        match o {
            Order::Relaxed => Ordering::Relaxed,
            Order::Acquire => Ordering::Acquire,
            Order::Release => Ordering::Release,
            Order::AcqRel => Ordering::AcqRel,
        }
    }

    fn cas_failure(o: Order) -> Ordering {
        match o {
            Order::Relaxed | Order::Release => Ordering::Relaxed,
            Order::Acquire | Order::AcqRel => Ordering::Acquire,
        }
    }

    /// Runs atomic operation `f` on the word at `p` (at scope `s`) with the
    /// strict emulator's events around it.
    #[inline]
    fn ordered<T, R>(p: *const T, s: Scope, acquire: bool, release: bool, f: impl FnOnce() -> R) -> R {
        emu::atomic_access(p as *const u8, core::mem::size_of::<T>());
        if release {
            emu::order(false, true, s == Scope::Cta);
        }
        let r = f();
        if acquire {
            emu::order(true, false, s == Scope::Cta);
        }
        r
    }

    fn acquires(o: Order) -> bool {
        matches!(o, Order::Acquire | Order::AcqRel)
    }

    fn releases(o: Order) -> bool {
        matches!(o, Order::Release | Order::AcqRel)
    }

    macro_rules! impl_word {
        ($t:ty, $a:ty) => {
            impl AtomicWord for $t {
                unsafe fn ld_relaxed(p: *const Self, s: Scope) -> Self {
                    // SAFETY: the method's contract: `p` is valid, aligned for `Self` (so for
                    // its atomic type, of the same size and alignment on 64-bit hosts) and every
                    // concurrent access is atomic, which is what `from_ptr` requires.
                    ordered(p, s, false, false, || unsafe { <$a>::from_ptr(p as *mut $t) }.load(Ordering::Relaxed))
                }
                unsafe fn ld_acquire(p: *const Self, s: Scope) -> Self {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, true, false, || unsafe { <$a>::from_ptr(p as *mut $t) }.load(Ordering::Acquire))
                }
                unsafe fn st_relaxed(p: *mut Self, v: Self, s: Scope) {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, false, false, || unsafe { <$a>::from_ptr(p) }.store(v, Ordering::Relaxed))
                }
                unsafe fn st_release(p: *mut Self, v: Self, s: Scope) {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, false, true, || unsafe { <$a>::from_ptr(p) }.store(v, Ordering::Release))
                }
                unsafe fn atom_add(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, acquires(o), releases(o), || unsafe { <$a>::from_ptr(p) }.fetch_add(v, rmw(o)))
                }
                unsafe fn atom_max(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, acquires(o), releases(o), || unsafe { <$a>::from_ptr(p) }.fetch_max(v, rmw(o)))
                }
                unsafe fn atom_exch(p: *mut Self, v: Self, o: Order, s: Scope) -> Self {
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, acquires(o), releases(o), || unsafe { <$a>::from_ptr(p) }.swap(v, rmw(o)))
                }
                unsafe fn atom_cas(p: *mut Self, cmp: Self, new: Self, o: Order, s: Scope) -> Self {
                    ordered(p, s, acquires(o), releases(o), || {
                        // SAFETY: as for `ld_relaxed`.
                        match unsafe { <$a>::from_ptr(p) }.compare_exchange(cmp, new, rmw(o), cas_failure(o)) {
                            Ok(v) | Err(v) => v,
                        }
                    })
                }
                unsafe fn red_add(p: *mut Self, v: Self, release: bool, s: Scope) {
                    let o = if release { Ordering::Release } else { Ordering::Relaxed };
                    // SAFETY: as for `ld_relaxed`.
                    ordered(p, s, false, release, || unsafe { <$a>::from_ptr(p) }.fetch_add(v, o));
                }
            }
        };
    }
    impl_word!(u32, AtomicU32);
    impl_word!(u64, AtomicU64);
}
