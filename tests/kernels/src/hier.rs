//! The device-callable hierarchical collectives
//! ([`devcomm_device::coll::hier`]: all-reduce, reduce-scatter, reduce,
//! all-gather, broadcast) as a user's kernel calls them: one call by every
//! CTA of the grid (CTA `b` is part `b`), arguments as the host
//! collectives' kernels take them.

use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{self, CollArgs, CollError, Element, Input, Part, RedOp};
use devcomm_device::comm::SymPtr;
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::kernel;

/// The input `args.src` describes.
#[inline(always)]
fn input<T>(args: &CollArgs) -> Input<T> {
    if args.src.in_window != 0 {
        Input::Window(SymPtr::new(args.src.window, args.src.offset))
    } else {
        Input::Local(args.src.ptr as *const T)
    }
}

/// The input, operator and scalar `args` describe.
#[inline(always)]
fn decode<T: Element>(args: &CollArgs) -> Result<(Input<T>, RedOp, T), CollError> {
    let src = input(args);
    let op = RedOp::from_code(args.op).ok_or(CollError::BadArgument)?;
    let bytes = args.scalar.to_le_bytes();
    // SAFETY: `size_of::<T>() <= 8`: the scalar's low bytes; every bit
    // pattern is a `T`.
    let scalar = unsafe { (bytes.as_ptr() as *const T).read_unaligned() };
    Ok((src, op, scalar))
}

/// Records `r`'s error, if any, in the `u32` at `args.errors` (the first
/// one wins; every thread of the CTA sees the same result).
///
/// # Safety
/// `args.errors` points to a `u32` the kernel can write.
#[inline(always)]
unsafe fn record(cta: &Cta, args: &CollArgs, r: Result<(), CollError>) {
    if let Err(e) = r {
        if cta.is_leader() {
            atomic::compare_exchange(args.errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
        }
    }
}

macro_rules! world_reducing_kernels {
    ($($t:ty => $all_reduce:ident, $reduce_scatter:ident, $reduce:ident;)*) => {$(
        kernel! {
            /// `coll::hier::all_reduce` of `args.count` elements over the
            /// world; the first failure's code goes to `args.errors`.
            ///
            /// # Safety
            /// `args` as the host collectives make them (context from
            /// `Collectives::context`, buffers of `count` elements, a fresh
            /// `seq`); every rank launches the same co-resident grid.
            pub unsafe fn $all_reduce(args: CollArgs) {
                let cta = Cta::new();
                let r = decode::<$t>(&args).and_then(|(src, op, scalar)| {
                    coll::hier::all_reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut $t,
                        args.count as usize, op, scalar, args.seq)
                });
                record(&cta, &args, r);
            }
        }
        kernel! {
            /// `coll::hier::reduce_scatter` of `args.count` elements per
            /// rank over the world; the first failure's code goes to
            /// `args.errors`.
            ///
            /// # Safety
            /// As for the all-reduce kernels, `args.src` holding `nranks *
            /// count` elements.
            pub unsafe fn $reduce_scatter(args: CollArgs) {
                let cta = Cta::new();
                let r = decode::<$t>(&args).and_then(|(src, op, scalar)| {
                    coll::hier::reduce_scatter(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut $t,
                        args.count as usize, op, scalar)
                });
                record(&cta, &args, r);
            }
        }
        kernel! {
            /// `coll::hier::reduce` of `args.count` elements to world rank
            /// `args.root`; the first failure's code goes to `args.errors`.
            ///
            /// # Safety
            /// As for the all-reduce kernels; `args.dst` holds `count`
            /// elements on every rank whose LSA rank is the root's.
            pub unsafe fn $reduce(args: CollArgs) {
                let cta = Cta::new();
                let r = decode::<$t>(&args).and_then(|(src, op, scalar)| {
                    coll::hier::reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut $t,
                        args.count as usize, op, scalar, args.root)
                });
                record(&cta, &args, r);
            }
        }
    )*};
}

world_reducing_kernels! {
    i8 => world_all_reduce_i8, world_reduce_scatter_i8, world_reduce_i8;
    u64 => world_all_reduce_u64, world_reduce_scatter_u64, world_reduce_u64;
    coll::F16 => world_all_reduce_f16, world_reduce_scatter_f16, world_reduce_f16;
    coll::Bf16 => world_all_reduce_bf16, world_reduce_scatter_bf16, world_reduce_bf16;
    f32 => world_all_reduce_f32, world_reduce_scatter_f32, world_reduce_f32;
    f64 => world_all_reduce_f64, world_reduce_scatter_f64, world_reduce_f64;
}

kernel! {
    /// `coll::hier::all_gather` of `args.count` bytes per rank over the
    /// world; the first failure's code goes to `args.errors`.
    ///
    /// # Safety
    /// As for the all-reduce kernels, `args.dst` holding `nranks * count`
    /// bytes.
    pub unsafe fn world_all_gather_u8(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::hier::all_gather(&cta, &args.ctx, Part::block(), input(&args), args.dst.ptr as *mut u8,
            args.count as usize);
        record(&cta, &args, r);
    }
}

kernel! {
    /// `coll::hier::broadcast` of `args.count` bytes from world rank
    /// `args.root`; the first failure's code goes to `args.errors`.
    ///
    /// # Safety
    /// As for the all-reduce kernels, `args.src` holding `count` bytes on
    /// the root.
    pub unsafe fn world_broadcast_u8(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::hier::broadcast(&cta, &args.ctx, Part::block(), input(&args), args.dst.ptr as *mut u8,
            args.count as usize, args.root);
        record(&cta, &args, r);
    }
}
