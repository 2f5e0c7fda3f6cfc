//! Reduction operators: NCCL's `ncclRedOp_t`, and what one reduction of a
//! collective computes per element.

use super::element::{Accumulator, Element};

/// A reduction operator, numbered as NCCL's `ncclRedOp_t` (NCCL makes
/// pre-multiplied sums with `ncclRedOpCreatePreMulSum`; here it is an
/// operator of its own with its scalar beside it).
#[doc(alias = "ncclRedOp_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RedOp {
    /// Sum (`ncclSum`; wrapping for integers).
    Sum = 0,
    /// Product (`ncclProd`; wrapping for integers).
    Prod = 1,
    /// Maximum (`ncclMax`; NaN if any input is NaN).
    Max = 2,
    /// Minimum (`ncclMin`; NaN if any input is NaN).
    Min = 3,
    /// Average (`ncclAvg`): floats sum `x / n` (each input scaled by
    /// `1/n` first), integers divide the (wrapping) sum by `n`.
    Avg = 4,
    /// `sum(scalar * x)` (`ncclRedOpCreatePreMulSum`), the scalar given
    /// as a value or read from device memory.
    #[doc(alias = "ncclRedOpCreatePreMulSum")]
    PreMulSum = 5,
}

impl RedOp {
    /// Every operator.
    pub const ALL: [RedOp; 6] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg, RedOp::PreMulSum];

    /// The operator with this code, if any.
    pub const fn from_code(code: u32) -> Option<RedOp> {
        // A match, not an index into `ALL`: indexing compiled to a table in
        // global memory, one load at every collective kernel's start.
        match code {
            0 => Some(RedOp::Sum),
            1 => Some(RedOp::Prod),
            2 => Some(RedOp::Max),
            3 => Some(RedOp::Min),
            4 => Some(RedOp::Avg),
            5 => Some(RedOp::PreMulSum),
            _ => None,
        }
    }
}

/// The combining step of a [`Reduction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    Sum,
    Prod,
    Max,
    Min,
}

/// One reduction as the device computes it: `finish(step(..step(first(x0), x1).., xn-1))`,
/// over the inputs in rank order (so every rank that reduces the same
/// inputs gets the same bits).
#[derive(Clone, Copy, Debug)]
pub struct Reduction<T: Element> {
    combine: Combine,
    /// Each input is multiplied by this first (`PreMulSum`; `Avg` of floats).
    pre: Option<T::Acc>,
    /// The result is divided by this (`Avg` of integers), 0: not.
    post_div: u32,
}

impl<T: Element> Reduction<T> {
    /// `op` over `nranks` inputs; `scalar` is `PreMulSum`'s factor (ignored
    /// by the other operators).
    #[inline(always)]
    pub fn new(op: RedOp, scalar: T, nranks: u32) -> Self {
        let plain = |combine| Reduction { combine, pre: None, post_div: 0 };
        match op {
            RedOp::Sum => plain(Combine::Sum),
            RedOp::Prod => plain(Combine::Prod),
            RedOp::Max => plain(Combine::Max),
            RedOp::Min => plain(Combine::Min),
            RedOp::PreMulSum => Reduction { combine: Combine::Sum, pre: Some(scalar.to_acc()), post_div: 0 },
            RedOp::Avg if T::DTYPE.is_float() => {
                Reduction { combine: Combine::Sum, pre: Some(T::Acc::from_f64(1.0 / nranks as f64)), post_div: 0 }
            }
            RedOp::Avg => Reduction { combine: Combine::Sum, pre: None, post_div: nranks },
        }
    }

    /// The first input, ready to combine.
    #[inline(always)]
    pub fn first(&self, x: T) -> T::Acc {
        match self.pre {
            Some(s) => x.to_acc().mul(s),
            None => x.to_acc(),
        }
    }

    /// `acc` combined with the next input.
    #[inline(always)]
    pub fn step(&self, acc: T::Acc, x: T) -> T::Acc {
        let x = self.first(x);
        match self.combine {
            Combine::Sum => acc.add(x),
            Combine::Prod => acc.mul(x),
            Combine::Max => acc.maximum(x),
            Combine::Min => acc.minimum(x),
        }
    }

    /// The result.
    #[inline(always)]
    pub fn finish(&self, acc: T::Acc) -> T {
        // Floats never divide at the end (`Avg` scales each input first):
        // the constant test keeps the division out of their loops.
        T::from_acc(if !T::DTYPE.is_float() && self.post_div != 0 { acc.div_u32(self.post_div) } else { acc })
    }

    /// Which [`Reducer`] computes this reduction with the least work per
    /// element (a loop calls it before the loop, not per element).
    #[inline(always)]
    pub(crate) fn kind(&self) -> ReducerKind {
        match (self.combine, self.pre.is_some(), self.post_div) {
            (Combine::Sum, false, 0) => ReducerKind::Sum,
            _ => ReducerKind::Any,
        }
    }
}

/// What a reducing loop computes per element, chosen once per call: the
/// run-time [`Reduction`] checks its operator and scalar per element (the
/// host kernels' PTX had a jump table and, before the float test in
/// [`Reduction::finish`], an `f32` division in every element's path;
/// host-launched 128 MiB all-reduces took 990 µs where a benchmark kernel
/// with a constant `Sum` took 520 µs per call:
/// `benches/results/2026-11-23-h200x2-collectives.md`). The plain sum, the
/// common case, gets a loop of its own.
pub(crate) trait Reducer<T: Element>: Copy {
    /// The first input, ready to combine.
    fn first(&self, x: T) -> T::Acc;
    /// `acc` combined with the next input.
    fn step(&self, acc: T::Acc, x: T) -> T::Acc;
    /// The result.
    fn finish(&self, acc: T::Acc) -> T;
}

/// The [`Reducer`] a [`Reduction`] can be computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReducerKind {
    /// A plain sum: [`SumOf`].
    Sum,
    /// The [`Reduction`] itself.
    Any,
}

impl<T: Element> Reducer<T> for Reduction<T> {
    #[inline(always)]
    fn first(&self, x: T) -> T::Acc {
        Reduction::first(self, x)
    }
    #[inline(always)]
    fn step(&self, acc: T::Acc, x: T) -> T::Acc {
        Reduction::step(self, acc, x)
    }
    #[inline(always)]
    fn finish(&self, acc: T::Acc) -> T {
        Reduction::finish(self, acc)
    }
}

/// A plain sum ([`ReducerKind::Sum`]): the same results as the
/// [`Reduction`] it stands for, with nothing checked per element.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SumOf<T>(core::marker::PhantomData<T>);

impl<T> SumOf<T> {
    /// The plain sum.
    #[inline(always)]
    pub(crate) const fn new() -> Self {
        SumOf(core::marker::PhantomData)
    }
}

impl<T: Element> Reducer<T> for SumOf<T> {
    #[inline(always)]
    fn first(&self, x: T) -> T::Acc {
        x.to_acc()
    }
    #[inline(always)]
    fn step(&self, acc: T::Acc, x: T) -> T::Acc {
        acc.add(x.to_acc())
    }
    #[inline(always)]
    fn finish(&self, acc: T::Acc) -> T {
        T::from_acc(acc)
    }
}
