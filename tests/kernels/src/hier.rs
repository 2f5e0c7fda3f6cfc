//! The device-callable hierarchical all-reduce and all-gather
//! ([`devcomm_device::coll::hier`]) as a user's kernel calls them: one call by every CTA of the grid (CTA `b` is part `b`), arguments
//! as the host collectives' kernels take them.

use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{self, CollArgs, CollError, Element, Input, Part, RedOp};
use devcomm_device::comm::SymPtr;
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::kernel;

/// The input, operator and scalar `args` describe.
#[inline(always)]
fn decode<T: Element>(args: &CollArgs) -> Result<(Input<T>, RedOp, T), CollError> {
    let src = if args.src.in_window != 0 {
        Input::Window(SymPtr::new(args.src.window, args.src.offset))
    } else {
        Input::Local(args.src.ptr as *const T)
    };
    let op = RedOp::from_code(args.op).ok_or(CollError::BadArgument)?;
    let bytes = args.scalar.to_le_bytes();
    // SAFETY: `size_of::<T>() <= 8`: the scalar's low bytes; every bit
    // pattern is a `T`.
    let scalar = unsafe { (bytes.as_ptr() as *const T).read_unaligned() };
    Ok((src, op, scalar))
}

macro_rules! world_all_reduce_kernels {
    ($($t:ty => $name:ident;)*) => {$(
        kernel! {
            /// `coll::hier::all_reduce` of `args.count` elements over the
            /// world; the first failure's code goes to `args.errors`.
            ///
            /// # Safety
            /// `args` as the host collectives make them (context from
            /// `Collectives::context`, buffers of `count` elements, a fresh
            /// `seq`); every rank launches the same co-resident grid.
            pub unsafe fn $name(args: CollArgs) {
                let cta = Cta::new();
                let r = decode::<$t>(&args).and_then(|(src, op, scalar)| {
                    coll::hier::all_reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut $t,
                        args.count as usize, op, scalar, args.seq)
                });
                if let Err(e) = r {
                    if cta.is_leader() {
                        atomic::compare_exchange(args.errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
                    }
                }
            }
        }
    )*};
}

world_all_reduce_kernels! {
    i8 => world_all_reduce_i8;
    u64 => world_all_reduce_u64;
    coll::F16 => world_all_reduce_f16;
    coll::Bf16 => world_all_reduce_bf16;
    f32 => world_all_reduce_f32;
    f64 => world_all_reduce_f64;
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
        let src = if args.src.in_window != 0 {
            Input::Window(SymPtr::new(args.src.window, args.src.offset))
        } else {
            Input::Local(args.src.ptr as *const u8)
        };
        let r = coll::hier::all_gather(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut u8, args.count as usize);
        if let Err(e) = r {
            if cta.is_leader() {
                atomic::compare_exchange(args.errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
            }
        }
    }
}
