//! Floating-point functions that kernels use, on both targets.
//!
//! `core` has no `sqrt`, `exp`, `ln` or `mul_add` (they live in `std`, which
//! a kernel does not have), so kernels get them here. On `nvptx64` each is
//! one or two PTX instructions, as CUDA's intrinsics are; on the host (the
//! emulated runtime) each is a software version written with `core` alone,
//! exact where the PTX instruction is exact:
//!
//! | function | PTX (`nvptx64`) | accuracy on the GPU | host (emulated) |
//! |---|---|---|---|
//! | [`sqrt`], [`sqrt_f64`] | `sqrt.rn.f32` / `.f64` | correctly rounded | correctly rounded (integer square root), bit-identical |
//! | [`rsqrt`], [`rsqrt_f64`] | `rsqrt.approx.f32` / `.f64` | f32: about 2^-22.9 relative; f64: an estimate whose error PTX does not bound (for full precision write `1.0 / sqrt_f64(x)`) | `1 / sqrt(x)` computed in f64: within 1 ulp (f32), 1 ulp of each of two roundings (f64) |
//! | [`exp`] | `ex2.approx.f32` of `x * log2(e)` (as CUDA's `__expf`) | 2 ulp + about `|x| * 2^-24` relative | f64 series: within 1 ulp |
//! | [`log`] | `lg2.approx.f32` times `ln 2` (as CUDA's `__logf`) | about 2^-22 absolute near 1, 2 ulp elsewhere | f64 series: within 1 ulp |
//! | [`exp2`], [`log2`] | `ex2.approx.f32`, `lg2.approx.f32` | 2 ulp; 2^-22 absolute near 1 | f64 series: within 1 ulp |
//! | [`fma`], [`fma_f64`] | `fma.rn.f32` / `.f64` | correctly rounded, one rounding | correctly rounded (128-bit integer arithmetic), bit-identical |
//! | [`min`], [`max`], [`min_f64`], [`max_f64`] | `min.f32`, `max.f32`, ... | exact | exact (`core`'s `min`/`max`) |
//!
//! So `sqrt`, `fma`, `min` and `max` give the same bits on a GPU and on the
//! emulator; `rsqrt`, `exp`, `log`, `exp2` and `log2` are fast
//! approximations on the GPU and near-exact on the emulator: compare their
//! results with a tolerance. PTX has no `exp`/`log` for `f64` (CUDA's are
//! long software routines), so there are none here.
//!
//! Special values follow IEEE 754 (and PTX): `sqrt` of a negative number is
//! NaN, `sqrt(-0.0)` is `-0.0`, `log(0.0)` is `-inf`, `exp` overflows to
//! `inf`; `min`/`max` return the other operand when one is NaN.
//!
//! ```
//! use devcomm_device::math;
//! // 1 / ||v|| for a 3-vector, as an RMSNorm would.
//! let v = [3.0f32, 4.0, 12.0];
//! let ss = v.iter().fold(0.0, |acc, &x| math::fma(x, x, acc));
//! assert_eq!(math::sqrt(ss), 13.0);
//! assert!((math::rsqrt(ss) - 1.0 / 13.0).abs() < 1e-6);
//! ```

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// Square root, correctly rounded (`sqrt.rn.f32`).
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::sqrt_f32(x)
    }
}

/// Square root, correctly rounded (`sqrt.rn.f64`).
#[inline(always)]
pub fn sqrt_f64(x: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f64;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("sqrt.rn.f64 {r}, {x};", r = out(reg64) r, x = in(reg64) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::sqrt_f64(x)
    }
}

/// Reciprocal square root `1 / sqrt(x)`, approximate on the GPU
/// (`rsqrt.approx.f32`, about 2^-22.9 relative error).
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("rsqrt.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        (1.0 / soft::sqrt_f64(x as f64)) as f32
    }
}

/// Reciprocal square root `1 / sqrt(x)`, a fast estimate on the GPU
/// (`rsqrt.approx.f64`, whose error the PTX ISA does not bound: compare
/// with a tolerance, or write `1.0 / sqrt_f64(x)` for full precision).
#[inline(always)]
pub fn rsqrt_f64(x: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f64;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("rsqrt.approx.f64 {r}, {x};", r = out(reg64) r, x = in(reg64) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / soft::sqrt_f64(x)
    }
}

/// `2^x`, approximate on the GPU (`ex2.approx.f32`, 2 ulp).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("ex2.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::exp2_f32(x)
    }
}

/// `log2(x)`, approximate on the GPU (`lg2.approx.f32`).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe { asm!("lg2.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::log2_f32(x)
    }
}

/// `e^x`: `ex2.approx.f32` of `x * log2(e)` on the GPU (as CUDA's `__expf`).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        exp2(x * core::f32::consts::LOG2_E)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::exp_f32(x)
    }
}

/// Natural logarithm: `lg2.approx.f32` times `ln 2` on the GPU (as CUDA's
/// `__logf`).
#[inline(always)]
pub fn log(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        log2(x) * core::f32::consts::LN_2
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::log_f32(x)
    }
}

/// `a * b + c` with one rounding (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
                 c = in(reg32) c, options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::fma_f32(a, b, c)
    }
}

/// `a * b + c` with one rounding (`fma.rn.f64`).
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f64;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("fma.rn.f64 {r}, {a}, {b}, {c};", r = out(reg64) r, a = in(reg64) a, b = in(reg64) b,
                 c = in(reg64) c, options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        soft::fma_f64(a, b, c)
    }
}

/// The smaller of `a` and `b` (`min.f32`); the other one when one is NaN.
#[inline(always)]
pub fn min(a: f32, b: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("min.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
                 options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.min(b)
    }
}

/// The larger of `a` and `b` (`max.f32`); the other one when one is NaN.
#[inline(always)]
pub fn max(a: f32, b: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("max.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
                 options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.max(b)
    }
}

/// The smaller of `a` and `b` (`min.f64`); the other one when one is NaN.
#[inline(always)]
pub fn min_f64(a: f64, b: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f64;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("min.f64 {r}, {a}, {b};", r = out(reg64) r, a = in(reg64) a, b = in(reg64) b,
                 options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.min(b)
    }
}

/// The larger of `a` and `b` (`max.f64`); the other one when one is NaN.
#[inline(always)]
pub fn max_f64(a: f64, b: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f64;
        // SAFETY: an arithmetic instruction on registers: no memory access,
        // no precondition.
        unsafe {
            asm!("max.f64 {r}, {a}, {b};", r = out(reg64) r, a = in(reg64) a, b = in(reg64) b,
                 options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.max(b)
    }
}

/// The host's versions, with `core` alone (no `std`, no `libm`).
#[cfg(not(target_arch = "nvptx64"))]
mod soft {
    use core::f64::consts::{LN_2, LOG2_E, SQRT_2};

    /// A finite, nonzero float as `(-1)^neg × m × 2^e`, `m` normalised to
    /// `prec` bits (top bit set), subnormals included.
    #[derive(Clone, Copy, Debug)]
    struct Unpacked {
        neg: bool,
        m: u64,
        e: i32,
    }

    fn unpack_f64(x: f64) -> Unpacked {
        let bits = x.to_bits();
        let neg = bits >> 63 != 0;
        let ef = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1 << 52) - 1);
        if ef == 0 {
            let shift = frac.leading_zeros() as i32 - 11;
            Unpacked { neg, m: frac << shift, e: -1074 - shift }
        } else {
            Unpacked { neg, m: frac | 1 << 52, e: ef - 1075 }
        }
    }

    fn unpack_f32(x: f32) -> Unpacked {
        let bits = x.to_bits();
        let neg = bits >> 31 != 0;
        let ef = ((bits >> 23) & 0xff) as i32;
        let frac = (bits & ((1 << 23) - 1)) as u64;
        if ef == 0 {
            let shift = frac.leading_zeros() as i32 - 40;
            Unpacked { neg, m: frac << shift, e: -149 - shift }
        } else {
            Unpacked { neg, m: frac | 1 << 23, e: ef - 150 }
        }
    }

    /// Rounds `(m + sticky·ε) × 2^q` (ε: less than one unit of `m`'s last
    /// bit) to nearest-even with `prec` bits and a last bit of weight at
    /// least `2^qmin`. Returns the mantissa (fewer than `prec` bits only at
    /// `qmin`: a subnormal) and its last bit's exponent.
    fn round(m: u128, sticky: bool, q: i32, prec: i32, qmin: i32) -> (u64, i32) {
        let len = 128 - m.leading_zeros() as i32;
        let shift = (len - prec).max(qmin - q);
        if shift <= 0 {
            // Exact (a sticky remainder is below half a unit: rounds down).
            return ((m << -shift) as u64, q + shift);
        }
        if shift >= 128 {
            return (0, q + shift);
        }
        let mant = m >> shift;
        let rem = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let up = rem > half || (rem == half && (sticky || mant & 1 == 1));
        let (mut mant, mut q) = (mant + up as u128, q + shift);
        if mant >> prec != 0 {
            mant >>= 1;
            q += 1;
        }
        (mant as u64, q)
    }

    fn pack_f64(neg: bool, (mant, q): (u64, i32)) -> f64 {
        let sign = (neg as u64) << 63;
        if mant == 0 {
            return f64::from_bits(sign);
        }
        // Normal: mant has 53 bits and the biased exponent is q + 1075;
        // subnormal: q = -1074 and mant < 2^52 (bits = mant).
        if q + 1075 >= 2047 {
            return f64::from_bits(sign | 0x7ff << 52);
        }
        f64::from_bits(sign | ((((q + 1074) as u64) << 52) + mant))
    }

    fn pack_f32(neg: bool, (mant, q): (u64, i32)) -> f32 {
        let sign = (neg as u32) << 31;
        if mant == 0 {
            return f32::from_bits(sign);
        }
        if q + 150 >= 255 {
            return f32::from_bits(sign | 0xff << 23);
        }
        f32::from_bits(sign | ((((q + 149) as u32) << 23) + mant as u32))
    }

    /// `(floor(sqrt(n)), n - floor(sqrt(n))^2)`, digit by digit.
    fn isqrt(n: u128) -> (u128, u128) {
        let (mut x, mut r) = (n, 0u128);
        let mut bit = 1u128 << 126;
        while bit > n {
            bit >>= 2;
        }
        while bit != 0 {
            if x >= r + bit {
                x -= r + bit;
                r = (r >> 1) + bit;
            } else {
                r >>= 1;
            }
            bit >>= 2;
        }
        (r, x)
    }

    /// Square root of a finite positive `m × 2^e` (`m` < 2^54), rounded to
    /// `prec` bits.
    fn sqrt_core(u: Unpacked, prec: i32, qmin: i32) -> (u64, i32) {
        let (m, e) = if u.e & 1 != 0 { (u.m << 1, u.e - 1) } else { (u.m, u.e) };
        // 72 extra (even) bits: the root has at least 62 bits, far more than
        // 53 + a rounding bit, and never ties (a root is never exactly halfway).
        let (r, rem) = isqrt((m as u128) << 72);
        round(r, rem != 0, (e - 72) / 2, prec, qmin)
    }

    pub(super) fn sqrt_f64(x: f64) -> f64 {
        if x.is_nan() || x == 0.0 || x == f64::INFINITY {
            return x;
        }
        if x < 0.0 {
            return f64::NAN;
        }
        pack_f64(false, sqrt_core(unpack_f64(x), 53, -1074))
    }

    pub(super) fn sqrt_f32(x: f32) -> f32 {
        if x.is_nan() || x == 0.0 || x == f32::INFINITY {
            return x;
        }
        if x < 0.0 {
            return f32::NAN;
        }
        pack_f32(false, sqrt_core(unpack_f32(x), 24, -149))
    }

    /// The exact `a × b + c` of finite nonzero operands, as a sign, a
    /// 127-bit magnitude whose lowest bit is sticky, and an exponent.
    fn fma_core(a: Unpacked, b: Unpacked, c: Unpacked) -> (bool, u128, i32) {
        let p = a.m as u128 * b.m as u128;
        // Both terms with their top bit at bit 125: the sum fits in 127 bits.
        let ps = p.leading_zeros() as i32 - 2;
        let (pm, pe, pn) = (p << ps, a.e + b.e - ps, a.neg ^ b.neg);
        let cs = (c.m as u128).leading_zeros() as i32 - 2;
        let (cm, ce) = ((c.m as u128) << cs, c.e - cs);
        let ((big, be, bn), (small, se, sn)) =
            if pe >= ce { ((pm, pe, pn), (cm, ce, c.neg)) } else { ((cm, ce, c.neg), (pm, pe, pn)) };
        // Align the smaller-exponent term, keeping what falls off as a sticky
        // bit. Both terms have at least 19 zero bits at the bottom, so a shift
        // that loses bits is large enough that no cancellation reaches them.
        let d = (be - se) as u32;
        let small = match d {
            0 => small,
            1..=126 => (small >> d) | ((small & ((1u128 << d) - 1)) != 0) as u128,
            _ => (small != 0) as u128,
        };
        if bn == sn {
            (bn, big + small, be)
        } else if big >= small {
            (bn, big - small, be)
        } else {
            (sn, small - big, be)
        }
    }

    pub(super) fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
        if !a.is_finite() || !b.is_finite() || a == 0.0 || b == 0.0 {
            // The product is exact (zero, infinite or NaN): one rounding.
            return a * b + c;
        }
        if !c.is_finite() {
            return c;
        }
        if c == 0.0 {
            return a * b;
        }
        let (neg, m, q) = fma_core(unpack_f64(a), unpack_f64(b), unpack_f64(c));
        if m == 0 {
            return 0.0; // exact cancellation rounds to +0
        }
        pack_f64(neg, round(m, false, q, 53, -1074))
    }

    pub(super) fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
        if !a.is_finite() || !b.is_finite() || a == 0.0 || b == 0.0 {
            return a * b + c;
        }
        if !c.is_finite() {
            return c;
        }
        if c == 0.0 {
            // The product of two f32 is exact in f64: one rounding.
            return (a as f64 * b as f64) as f32;
        }
        let (neg, m, q) = fma_core(unpack_f32(a), unpack_f32(b), unpack_f32(c));
        if m == 0 {
            return 0.0;
        }
        pack_f32(neg, round(m, false, q, 24, -149))
    }

    /// `x` rounded to the nearest integer (halves away from zero), for `|x|`
    /// well inside `i32`.
    fn round_i32(x: f64) -> i32 {
        if x >= 0.0 {
            (x + 0.5) as i32
        } else {
            (x - 0.5) as i32
        }
    }

    /// `2^t` in f64 for `|t| < 300` (finite, normal results).
    fn exp2_f64(t: f64) -> f64 {
        let k = round_i32(t);
        let r = (t - k as f64) * LN_2; // |r| <= ln(2) / 2
                                       // e^r by its Taylor series to r^13 (relative error < 1e-16).
        let mut p = 1.0;
        let mut i = 13;
        while i > 0 {
            p = 1.0 + r * p / i as f64;
            i -= 1;
        }
        p * f64::from_bits(((k + 1023) as u64) << 52)
    }

    pub(super) fn exp2_f32(x: f32) -> f32 {
        if x.is_nan() {
            return x;
        }
        if x > 200.0 {
            return f32::INFINITY;
        }
        if x < -200.0 {
            return 0.0;
        }
        exp2_f64(x as f64) as f32
    }

    pub(super) fn exp_f32(x: f32) -> f32 {
        if x.is_nan() {
            return x;
        }
        if x > 140.0 {
            return f32::INFINITY;
        }
        if x < -140.0 {
            return 0.0;
        }
        exp2_f64(x as f64 * LOG2_E) as f32
    }

    /// `ln(x)` in f64 of a finite positive `x` of an f32 (normal in f64).
    fn ln_f64(x: f64) -> f64 {
        let bits = x.to_bits();
        let mut e = ((bits >> 52) & 0x7ff) as i32 - 1023;
        let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | 1023 << 52); // [1, 2)
        if m > SQRT_2 {
            m /= 2.0;
            e += 1;
        }
        // ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172.
        let s = (m - 1.0) / (m + 1.0);
        let s2 = s * s;
        let mut sum = 0.0;
        let mut k = 12;
        while k >= 0 {
            sum = 1.0 / (2 * k + 1) as f64 + s2 * sum;
            k -= 1;
        }
        e as f64 * LN_2 + 2.0 * s * sum
    }

    fn log_special(x: f32) -> Option<f32> {
        if x.is_nan() || x == f32::INFINITY {
            Some(x)
        } else if x == 0.0 {
            Some(f32::NEG_INFINITY)
        } else if x < 0.0 {
            Some(f32::NAN)
        } else {
            None
        }
    }

    pub(super) fn log_f32(x: f32) -> f32 {
        log_special(x).unwrap_or_else(|| ln_f64(x as f64) as f32)
    }

    pub(super) fn log2_f32(x: f32) -> f32 {
        log_special(x).unwrap_or_else(|| (ln_f64(x as f64) * LOG2_E) as f32)
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        /// Any finite f64 (random bits), biased towards interesting exponents.
        fn f64(&mut self) -> f64 {
            loop {
                let v = f64::from_bits(self.next());
                if v.is_finite() {
                    return v;
                }
            }
        }
        fn f32(&mut self) -> f32 {
            loop {
                let v = f32::from_bits(self.next() as u32);
                if v.is_finite() {
                    return v;
                }
            }
        }
        /// A finite f64 with exponent in `[-lim, lim]`.
        fn f64_near(&mut self, lim: i32) -> f64 {
            let e = (self.next() % (2 * lim as u64 + 1)) as i64 - lim as i64;
            let bits = (self.next() & ((1 << 52) - 1)) | (((e + 1023) as u64) << 52) | (self.next() & 1) << 63;
            f64::from_bits(bits)
        }
    }

    fn same32(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
    fn same64(a: f64, b: f64) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
    fn ulps32(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    const SPECIAL32: [f32; 12] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e-45,
        f32::MAX,
        0.5,
        2.0,
    ];

    #[test]
    fn sqrt_is_correctly_rounded() {
        let mut rng = Rng(1);
        let mut xs: Vec<f32> = SPECIAL32.to_vec();
        xs.extend((0..200_000).map(|_| rng.f32()));
        for x in xs {
            assert!(same32(sqrt(x), x.sqrt()), "sqrt({x:e}) = {:e}, std {:e}", sqrt(x), x.sqrt());
        }
        let mut xs: Vec<f64> =
            [0.0, -0.0, 1.0, -4.0, f64::INFINITY, f64::NAN, 5e-324, f64::MAX, f64::MIN_POSITIVE].to_vec();
        xs.extend((0..200_000).map(|_| rng.f64()));
        for x in xs {
            assert!(same64(sqrt_f64(x), x.sqrt()), "sqrt_f64({x:e}) = {:e}, std {:e}", sqrt_f64(x), x.sqrt());
        }
    }

    #[test]
    fn fma_is_correctly_rounded() {
        let mut rng = Rng(2);
        for i in 0..300_000 {
            let (a, b, c) = match i % 3 {
                0 => (rng.f64(), rng.f64(), rng.f64()),
                // Products and addends of similar size: cancellation.
                1 => (rng.f64_near(30), rng.f64_near(30), rng.f64_near(60)),
                // Subnormal results.
                _ => (rng.f64_near(540), rng.f64_near(540), rng.f64_near(1060) * 1e-16),
            };
            let want = a.mul_add(b, c);
            assert!(
                same64(fma_f64(a, b, c), want),
                "fma_f64({a:e}, {b:e}, {c:e}) = {:e}, std {want:e}",
                fma_f64(a, b, c)
            );
            let c2 = -(a * b); // near-exact cancellation
            assert!(same64(fma_f64(a, b, c2), a.mul_add(b, c2)), "fma_f64({a:e}, {b:e}, {c2:e})");
            let (x, y, z) = (a as f32, b as f32, c as f32);
            let want = x.mul_add(y, z);
            assert!(same32(fma(x, y, z), want), "fma({x:e}, {y:e}, {z:e}) = {:e}, std {want:e}", fma(x, y, z));
            let z2 = -(x * y);
            assert!(same32(fma(x, y, z2), x.mul_add(y, z2)), "fma({x:e}, {y:e}, {z2:e})");
        }
        for &a in &SPECIAL32 {
            for &b in &SPECIAL32 {
                for &c in &SPECIAL32 {
                    assert!(same32(fma(a, b, c), a.mul_add(b, c)), "fma({a:e}, {b:e}, {c:e})");
                    let (a, b, c) = (a as f64, b as f64, c as f64);
                    assert!(same64(fma_f64(a, b, c), a.mul_add(b, c)), "fma_f64({a:e}, {b:e}, {c:e})");
                }
            }
        }
    }

    #[test]
    fn exp_log_and_rsqrt_are_within_one_ulp() {
        let mut rng = Rng(3);
        for i in 0..200_000 {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let x = (u * 200.0 - 100.0) as f32;
            assert!(ulps32(exp(x), x.exp()) <= 1, "exp({x:e}) = {:e}, std {:e}", exp(x), x.exp());
            let t = (u * 300.0 - 150.0) as f32;
            assert!(ulps32(exp2(t), t.exp2()) <= 1, "exp2({t:e}) = {:e}, std {:e}", exp2(t), t.exp2());
            let p = if i % 2 == 0 { rng.f32().abs() } else { (u * 4.0) as f32 };
            if p > 0.0 {
                assert!(ulps32(log(p), p.ln()) <= 1, "log({p:e}) = {:e}, std {:e}", log(p), p.ln());
                assert!(ulps32(log2(p), p.log2()) <= 1, "log2({p:e}) = {:e}, std {:e}", log2(p), p.log2());
                assert!(ulps32(rsqrt(p), 1.0 / p.sqrt()) <= 1, "rsqrt({p:e})");
            }
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(log(1.0), 0.0);
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert!(log(-1.0).is_nan());
        assert_eq!(log(f32::INFINITY), f32::INFINITY);
        assert_eq!(log2(8.0), 3.0);
        assert_eq!(rsqrt_f64(4.0), 0.5);
    }

    #[test]
    fn min_and_max_ignore_a_nan() {
        assert_eq!(min(1.0, f32::NAN), 1.0);
        assert_eq!(max(f32::NAN, -2.0), -2.0);
        assert_eq!(min_f64(3.0, -4.0), -4.0);
        assert_eq!(max_f64(3.0, -4.0), 3.0);
    }
}
