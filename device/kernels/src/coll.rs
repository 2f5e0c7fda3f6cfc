//! The kernels behind `devcomm`'s host collectives: each is one call of a
//! device-callable collective of [`devcomm_device::coll`], by every CTA of
//! the grid (CTA `b` is [`Part`] `b`), with its arguments in one
//! [`CollArgs`]. Reducing collectives have one kernel per datatype
//! (`all_reduce_f32`, ...); the others move bytes (`all_gather`, ...).

use core::mem::size_of;
use devcomm_device::arch;
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{
    self, Algorithm, CollArgs, CollBuffer, CollContext, CollError, CollStage, Element, Input, P2pArgs, P2pKind, P2pOp,
    Part, RedOp, Reduction, MAX_GROUP_OPS,
};
use devcomm_device::comm::SymPtr;
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::kernel;

use crate::shared::cta_copy;

const _: () = assert!(core::mem::size_of::<CollContext>() as u32 <= coll::CONTEXT_SHARED_BYTES);

/// The input `b` describes.
#[inline(always)]
fn input<T>(b: &CollBuffer) -> Input<T> {
    if b.in_window != 0 {
        Input::Window(SymPtr::new(b.window, b.offset))
    } else {
        Input::Local(b.ptr as *const T)
    }
}

/// Records the coop's error in `args.errors` (the first one a CTA reports
/// stays; every thread of the coop has the same result, the leader writes).
///
/// # Safety
/// `args.errors` is a valid `u32` of device memory, accessed atomically.
#[inline(always)]
unsafe fn report(cta: &Cta, args: &CollArgs, r: Result<(), CollError>) {
    // SAFETY: the contract.
    unsafe { report_to(cta, args.errors, r) }
}

/// [`report`] into the error word at `errors`.
///
/// # Safety
/// `errors` is a valid `u32` of device memory, accessed atomically.
#[inline(always)]
unsafe fn report_to(cta: &Cta, errors: u64, r: Result<(), CollError>) {
    if let Err(e) = r {
        if cta.is_leader() {
            // SAFETY: the contract: a valid device `u32`, accessed atomically.
            unsafe {
                atomic::compare_exchange(errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
            }
        }
    }
}

/// The context for the paths that hand it by reference to functions
/// compiled out of line (every path but LL): one copy per CTA in the
/// block's dynamic shared memory ([`crate::shared`]), which the host
/// launches these kernels with ([`coll::CONTEXT_SHARED_BYTES`]). A launch
/// without it is refused (`BadArgument`) on every thread.
///
/// # Safety
/// Every thread of the CTA calls it (it synchronises the CTA), before any
/// other use of the block's dynamic shared memory.
#[inline(always)]
unsafe fn shared_context<'c>(cta: &'c Cta, ctx: &CollContext) -> Result<&'c CollContext, CollError> {
    // SAFETY: the contract; the collectives use no shared memory.
    unsafe { cta_copy(cta, ctx) }.ok_or(CollError::BadArgument)
}

/// Entry `i < MAX_GROUP_OPS` of the `p2p_group` kernel's `args.ops`.
///
/// On a GPU it is read from the kernel's parameter space with `ld.param`
/// at a computed address (PTX allows it): indexing the parameter with a
/// run-time index in Rust makes LLVM copy all 2.4 KiB of parameters to
/// every thread's local memory first.
#[inline(always)]
fn op_at(args: &P2pArgs, i: usize) -> P2pOp {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = args;
        let at = core::mem::offset_of!(P2pArgs, ops) + i.min(MAX_GROUP_OPS - 1) * core::mem::size_of::<P2pOp>();
        let (ptr, bytes, first_seq, peer_kind): (u64, u64, u64, u64);
        // SAFETY: `p2p_group_param_0` is this kernel's one parameter (a
        // `P2pArgs`: the kernel calls this helper only); `at + 32` lies
        // inside it (`i` clamped below `MAX_GROUP_OPS`), 8-byte aligned
        // (`#[repr(C)]`, `ops` at a multiple of 8, entries of 32 bytes).
        unsafe {
            core::arch::asm!(
                "{{ .reg .b64 %base;",
                "mov.b64 %base, p2p_group_param_0;",
                "add.s64 %base, %base, {at};",
                "ld.param.b64 {ptr}, [%base];",
                "ld.param.b64 {bytes}, [%base+8];",
                "ld.param.b64 {seq}, [%base+16];",
                "ld.param.b64 {pk}, [%base+24]; }}",
                at = in(reg64) at as u64,
                ptr = out(reg64) ptr,
                bytes = out(reg64) bytes,
                seq = out(reg64) first_seq,
                pk = out(reg64) peer_kind,
                options(pure, readonly, nostack),
            );
        }
        P2pOp { ptr, bytes, first_seq, peer: peer_kind as u32, kind: (peer_kind >> 32) as u32 }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        args.ops[i]
    }
}

/// Whether entries `a` and `b` belong to the same task (same peer and kind).
#[inline(always)]
fn same_task(a: P2pOp, b: P2pOp) -> bool {
    a.peer == b.peer && a.kind == b.kind
}

/// The reduction `args` asks for, over the LSA team's ranks.
///
/// # Safety
/// `args.scalar_ptr` is 0 or a valid `T` of device memory.
#[inline(always)]
unsafe fn reduction<T: Element>(args: &CollArgs) -> Result<Reduction<T>, CollError> {
    // SAFETY: the contract.
    unsafe { reduction_over(args, args.ctx.scratch().lsa_size()) }
}

/// The reduction `args` asks for, over `nranks` inputs (`Avg`'s divisor).
///
/// # Safety
/// As for [`reduction`].
#[inline(always)]
unsafe fn reduction_over<T: Element>(args: &CollArgs, nranks: u32) -> Result<Reduction<T>, CollError> {
    let op = RedOp::from_code(args.op).ok_or(CollError::BadArgument)?;
    let scalar = if args.scalar_ptr != 0 {
        // SAFETY: the contract.
        unsafe { (args.scalar_ptr as *const T).read_volatile() }
    } else {
        let bytes = args.scalar.to_le_bytes();
        // SAFETY: `size_of::<T>() <= 8`: the low bytes of the scalar;
        // every bit pattern is a `T`.
        unsafe { (bytes.as_ptr() as *const T).read_unaligned() }
    };
    Ok(Reduction::new(op, scalar, nranks))
}

macro_rules! reducing_kernels {
    ($($t:ty, $dtype:ident => $all_reduce:ident, $pushed:ident, $reduce:ident, $reduce_scatter:ident;)*) => {$(
        kernel! {
            /// `ncclAllReduce` of `args.count` elements (see [`coll::all_reduce`]).
            ///
            /// # Safety
            /// `args` made by the host collectives: live context, buffers
            /// of the sizes the collective needs, the same call on every rank.
            pub unsafe fn $all_reduce(args: CollArgs) {
                let cta = Cta::new();
                args.ctx.stamp(&cta, Part::block(), CollStage::Start);
                let bytes = args.count.saturating_mul(size_of::<$t>() as u64);
                let r = match (reduction::<$t>(&args), Algorithm::from_code(args.algorithm)) {
                    (Ok(red), Some(algorithm)) => match algorithm.resolve(bytes, &args.ctx) {
                        Algorithm::Ll => coll::all_reduce(
                            &cta, &args.ctx, Part::block(), input::<$t>(&args.src), args.dst.ptr as *mut $t,
                            args.count as usize, &red, Algorithm::Ll, args.seq,
                        ),
                        // SAFETY: every thread of the CTA takes this arm.
                        algorithm => unsafe { shared_context(&cta, &args.ctx) }.and_then(|ctx| {
                            coll::all_reduce(
                                &cta, ctx, Part::block(), input::<$t>(&args.src), args.dst.ptr as *mut $t,
                                args.count as usize, &red, algorithm, args.seq,
                            )
                        }),
                    },
                    _ => Err(CollError::BadArgument),
                };
                report(&cta, &args, r);
                args.ctx.stamp(&cta, Part::block(), CollStage::Done);
            }

            /// `ncclAllReduce` of `args.count` elements by the pushed
            /// one-shot, from a local input (see [`coll::all_reduce_pushed`]):
            /// what the host launches when it resolves an all-reduce of a
            /// local input to [`Algorithm::OneShot`]. Everything is compiled
            /// in (no call), the arguments read straight from the parameter.
            ///
            /// # Safety
            /// As for the all-reduce kernel; `args.src.ptr` local device
            /// memory.
            pub unsafe fn $pushed(args: CollArgs) {
                let cta = Cta::new();
                args.ctx.stamp(&cta, Part::block(), CollStage::Start);
                // SAFETY: the kernel's contract; `reduction` reads the same
                // arguments on every rank.
                let r = unsafe {
                    coll::all_reduce_pushed_by(
                        &cta, &args.ctx, Part::block(), args.src.ptr as *const $t, args.dst.ptr as *mut $t,
                        args.count as usize, || reduction::<$t>(&args),
                    )
                };
                report(&cta, &args, r);
                args.ctx.stamp(&cta, Part::block(), CollStage::Done);
            }

            /// `ncclReduce` to `args.root` (see [`coll::reduce`]).
            ///
            /// # Safety
            /// As for the all-reduce kernel.
            pub unsafe fn $reduce(args: CollArgs) {
                let cta = Cta::new();
                let bytes = args.count.saturating_mul(size_of::<$t>() as u64);
                let r = match (reduction::<$t>(&args), Algorithm::from_code(args.algorithm)) {
                    (Ok(red), Some(algorithm)) => match algorithm.resolve_rooted(bytes, &args.ctx, Part::block().count) {
                        Algorithm::Ll => coll::reduce(
                            &cta, &args.ctx, Part::block(), input::<$t>(&args.src), args.dst.ptr as *mut $t,
                            args.count as usize, &red, args.root, Algorithm::Ll,
                        ),
                        // SAFETY: every thread of the CTA takes this arm.
                        algorithm => unsafe { shared_context(&cta, &args.ctx) }.and_then(|ctx| {
                            coll::reduce(
                                &cta, ctx, Part::block(), input::<$t>(&args.src), args.dst.ptr as *mut $t,
                                args.count as usize, &red, args.root, algorithm,
                            )
                        }),
                    },
                    (Err(e), _) => Err(e),
                    (_, None) => Err(CollError::BadArgument),
                };
                report(&cta, &args, r);
            }

            /// `ncclReduceScatter` of `args.count` elements per rank (see
            /// [`coll::reduce_scatter`]).
            ///
            /// # Safety
            /// As for the all-reduce kernel.
            pub unsafe fn $reduce_scatter(args: CollArgs) {
                let cta = Cta::new();
                // SAFETY: every thread of the CTA calls `shared_context`.
                let r = match (reduction::<$t>(&args), unsafe { shared_context(&cta, &args.ctx) }) {
                    (Ok(red), Ok(ctx)) => coll::reduce_scatter(
                        &cta, ctx, Part::block(), input::<$t>(&args.src), args.dst.ptr as *mut $t,
                        args.count as usize, &red,
                    ),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                report(&cta, &args, r);
            }
        }
    )*};
}

/// The reducing collectives' element types: each type, its
/// `devcomm::coll::DataType` variant and its four kernels (all-reduce,
/// pushed all-reduce, reduce, reduce-scatter), handed to the macro `$then`.
/// One list that this crate's `reducing_kernels!` and the host's launch
/// (`devcomm::coll`) both expand, so a type is added in one place.
#[macro_export]
macro_rules! with_reducing_types {
    ($then:ident) => {
        $then! {
            i8, I8 => all_reduce_i8, all_reduce_pushed_i8, reduce_i8, reduce_scatter_i8;
            u8, U8 => all_reduce_u8, all_reduce_pushed_u8, reduce_u8, reduce_scatter_u8;
            i32, I32 => all_reduce_i32, all_reduce_pushed_i32, reduce_i32, reduce_scatter_i32;
            u32, U32 => all_reduce_u32, all_reduce_pushed_u32, reduce_u32, reduce_scatter_u32;
            i64, I64 => all_reduce_i64, all_reduce_pushed_i64, reduce_i64, reduce_scatter_i64;
            u64, U64 => all_reduce_u64, all_reduce_pushed_u64, reduce_u64, reduce_scatter_u64;
            ::devcomm_device::coll::F16, F16 => all_reduce_f16, all_reduce_pushed_f16, reduce_f16, reduce_scatter_f16;
            f32, F32 => all_reduce_f32, all_reduce_pushed_f32, reduce_f32, reduce_scatter_f32;
            f64, F64 => all_reduce_f64, all_reduce_pushed_f64, reduce_f64, reduce_scatter_f64;
            ::devcomm_device::coll::Bf16, Bf16 => all_reduce_bf16, all_reduce_pushed_bf16, reduce_bf16, reduce_scatter_bf16;
            ::devcomm_device::coll::Fp8E4M3, Fp8E4M3 =>
                all_reduce_fp8e4m3, all_reduce_pushed_fp8e4m3, reduce_fp8e4m3, reduce_scatter_fp8e4m3;
            ::devcomm_device::coll::Fp8E5M2, Fp8E5M2 =>
                all_reduce_fp8e5m2, all_reduce_pushed_fp8e5m2, reduce_fp8e5m2, reduce_scatter_fp8e5m2;
        }
    };
}

with_reducing_types!(reducing_kernels);

macro_rules! local_reduce_kernels {
    ($($t:ty => $name:ident;)*) => {$(
        kernel! {
            /// `dst[i] = op over b < args.root of src[b * args.count + i]`
            /// for `i < args.count`, by the whole grid: the local reduction
            /// of received blocks behind the collectives over several LSA
            /// teams (see [`coll::reduce_blocks`]); `PreMulSum`'s scalar as
            /// for the other kernels; `Avg` divides by `args.seq` inputs when
            /// it is not 0 (the hierarchical collectives: the blocks are
            /// partial results of `args.seq / args.root` ranks each), else
            /// by the `args.root` blocks.
            ///
            /// # Safety
            /// `args.src.ptr` holds `args.root` blocks of `args.count`
            /// elements, `args.dst.ptr` `args.count` (or is block 0).
            pub unsafe fn $name(args: CollArgs) {
                let cta = Cta::new();
                let inputs = if args.seq != 0 { args.seq } else { args.root };
                let r = reduction_over::<$t>(&args, inputs).map(|red| {
                    let (t, nt) = (arch::global_thread_x() as usize, arch::grid_threads_x() as usize);
                    coll::reduce_blocks(
                        t, nt, args.src.ptr as *const $t, args.root, args.count as usize,
                        args.dst.ptr as *mut $t, args.count as usize, &red,
                    );
                });
                report(&cta, &args, r);
            }
        }
    )*};
}

local_reduce_kernels! {
    i8 => reduce_local_i8;
    u8 => reduce_local_u8;
    i32 => reduce_local_i32;
    u32 => reduce_local_u32;
    i64 => reduce_local_i64;
    u64 => reduce_local_u64;
    coll::F16 => reduce_local_f16;
    f32 => reduce_local_f32;
    f64 => reduce_local_f64;
    coll::Bf16 => reduce_local_bf16;
    coll::Fp8E4M3 => reduce_local_fp8e4m3;
    coll::Fp8E5M2 => reduce_local_fp8e5m2;
}

kernel! {
    /// `ncclAllGather` of `args.count` bytes per rank (see [`coll::all_gather`]).
    ///
    /// # Safety
    /// As for the all-reduce kernels.
    pub unsafe fn all_gather(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::all_gather(&cta, &args.ctx, Part::block(), input::<u8>(&args.src), args.dst.ptr as *mut u8, args.count as usize);
        report(&cta, &args, r);
    }

    /// `ncclBroadcast` of `args.count` bytes from `args.root` (see [`coll::broadcast`]).
    ///
    /// # Safety
    /// As for the all-reduce kernels.
    pub unsafe fn broadcast(args: CollArgs) {
        let cta = Cta::new();
        let r = match Algorithm::from_code(args.algorithm) {
            Some(algorithm) => coll::broadcast(&cta, &args.ctx, Part::block(), input::<u8>(&args.src), args.dst.ptr as *mut u8, args.count as usize, args.root, algorithm),
            None => Err(CollError::BadArgument),
        };
        report(&cta, &args, r);
    }

    /// `ncclGather` of `args.count` bytes per rank to `args.root` (see [`coll::gather`]).
    ///
    /// # Safety
    /// As for the all-reduce kernels.
    pub unsafe fn gather(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::gather(&cta, &args.ctx, Part::block(), input::<u8>(&args.src), args.dst.ptr as *mut u8, args.count as usize, args.root);
        report(&cta, &args, r);
    }

    /// `ncclScatter` of `args.count` bytes per rank from `args.root` (see [`coll::scatter`]).
    ///
    /// # Safety
    /// As for the all-reduce kernels.
    pub unsafe fn scatter(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::scatter(&cta, &args.ctx, Part::block(), input::<u8>(&args.src), args.dst.ptr as *mut u8, args.count as usize, args.root);
        report(&cta, &args, r);
    }

    /// `ncclAllToAll` of `args.count` bytes per pair of ranks (see [`coll::all_to_all`]).
    ///
    /// # Safety
    /// As for the all-reduce kernels.
    pub unsafe fn all_to_all(args: CollArgs) {
        let cta = Cta::new();
        let r = coll::all_to_all(&cta, &args.ctx, Part::block(), input::<u8>(&args.src), args.dst.ptr as *mut u8, args.count as usize);
        report(&cta, &args, r);
    }
}

kernel! {
    /// A group of sends and receives, one launch (`ncclGroupStart`,
    /// `ncclSend`/`ncclRecv`…, `ncclGroupEnd`): CTA `b` does part `b %
    /// ctas_per_task` of every operation of task `b / ctas_per_task`, in
    /// order (see [`P2pArgs`], [`coll::send`]).
    ///
    /// # Safety
    /// `args` made by the host collectives: live context with channels,
    /// buffers of the operations' sizes, sequence numbers that match the
    /// peers' operations; launched co-resident with `ctas_per_task` CTAs
    /// per task.
    pub unsafe fn p2p_group(args: P2pArgs) {
        // The context in shared memory: references into the parameter
        // itself (the GIN paths take some) would make LLVM copy all of it,
        // operations included, to local memory, and a copy by value in
        // each thread costs 376 bytes of local stores a thread.
        let cta = Cta::new();
        let ctx = match shared_context(&cta, &args.ctx) {
            Ok(ctx) => ctx,
            Err(e) => return report_to(&cta, args.errors, Err(e)),
        };
        let k = args.ctas_per_task.max(1);
        let (task, part) = (arch::block_idx().x / k, Part { index: arch::block_idx().x % k, count: k });
        let n = (args.n_ops as usize).min(MAX_GROUP_OPS);
        // The first entry of task `task`.
        let (mut i, mut t) = (0, 0);
        while i < n && t < task {
            let first = op_at(&args, i);
            while i < n && same_task(op_at(&args, i), first) {
                i += 1;
            }
            t += 1;
        }
        let first = if i < n { op_at(&args, i) } else { P2pOp::NONE };
        let mut r = Ok(());
        while i < n && r.is_ok() {
            let op = op_at(&args, i);
            if !same_task(op, first) {
                break;
            }
            r = if op.kind == P2pKind::Send as u32 {
                coll::send(&cta, ctx, part, &op)
            } else {
                coll::recv(&cta, ctx, part, &op)
            };
            i += 1;
        }
        report_to(&cta, args.errors, r);
    }
}
