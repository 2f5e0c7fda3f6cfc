//! The datatypes collectives move and reduce, and how they accumulate.
//!
//! | [`DataType`] | Rust type | accumulates in | NCCL |
//! |---|---|---|---|
//! | `I8`, `U8` | `i8`, `u8` | itself (wrapping) | `ncclInt8`, `ncclUint8` |
//! | `I32`, `U32`, `I64`, `U64` | `i32`, `u32`, `i64`, `u64` | itself (wrapping) | `ncclInt32`, ... |
//! | `F16` | [`F16`] (host: `half::f16`, same bits) | `f32` | `ncclFloat16` |
//! | `Bf16` | [`Bf16`] (host: `half::bf16`) | `f32` | `ncclBfloat16` |
//! | `F32`, `F64` | `f32`, `f64` | itself | `ncclFloat32`, `ncclFloat64` |
//! | `Fp8E4M3`, `Fp8E5M2` | [`Fp8E4M3`], [`Fp8E5M2`] | `f32` | `ncclFloat8e4m3`, `ncclFloat8e5m2` |
//!
//! The narrow floats are rounded once, when the result is stored: round to
//! nearest even; fp8 saturates to its largest finite value (as PTX's
//! `cvt.rn.satfinite`), NaN stays NaN. The conversions are the same integer
//! code on both targets (the host tests check `F16` and `Bf16` against the
//! `half` crate bit for bit).

/// A collective's datatype, numbered as NCCL's `ncclDataType_t`.
#[doc(alias = "ncclDataType_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DataType {
    /// `i8` (`ncclInt8`).
    I8 = 0,
    /// `u8` (`ncclUint8`).
    U8 = 1,
    /// `i32` (`ncclInt32`).
    I32 = 2,
    /// `u32` (`ncclUint32`).
    U32 = 3,
    /// `i64` (`ncclInt64`).
    I64 = 4,
    /// `u64` (`ncclUint64`).
    U64 = 5,
    /// IEEE half precision (`ncclFloat16`).
    F16 = 6,
    /// `f32` (`ncclFloat32`).
    F32 = 7,
    /// `f64` (`ncclFloat64`).
    F64 = 8,
    /// bfloat16 (`ncclBfloat16`).
    Bf16 = 9,
    /// 8-bit float, 4 exponent and 3 mantissa bits (`ncclFloat8e4m3`).
    Fp8E4M3 = 10,
    /// 8-bit float, 5 exponent and 2 mantissa bits (`ncclFloat8e5m2`).
    Fp8E5M2 = 11,
}

impl DataType {
    /// Every datatype, in NCCL's order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16 | DataType::Fp8E4M3 | DataType::Fp8E5M2
        )
    }

    /// The datatype with this code, if any.
    pub const fn from_code(code: u32) -> Option<DataType> {
        if (code as usize) < Self::ALL.len() {
            Some(Self::ALL[code as usize])
        } else {
            None
        }
    }
}

/// What a reduction computes with: `f32`/`f64` for floats, the integer
/// itself (wrapping) for integers.
pub trait Accumulator: Copy {
    /// `a + b` (wrapping for integers).
    fn add(self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(self, b: Self) -> Self;
    /// The smaller (floats: NaN if either is NaN, as NCCL).
    fn minimum(self, b: Self) -> Self;
    /// The larger (floats: NaN if either is NaN).
    fn maximum(self, b: Self) -> Self;
    /// `self / n` (integers: truncating division, as NCCL's `ncclAvg`).
    fn div_u32(self, n: u32) -> Self;
    /// `x` converted (floats: rounded; integers: truncated toward zero).
    fn from_f64(x: f64) -> Self;
}

macro_rules! int_acc {
    ($($t:ty),*) => {$(
        impl Accumulator for $t {
            #[inline(always)]
            fn add(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)]
            fn mul(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)]
            fn minimum(self, b: Self) -> Self { if b < self { b } else { self } }
            #[inline(always)]
            fn maximum(self, b: Self) -> Self { if b > self { b } else { self } }
            #[inline(always)]
            fn div_u32(self, n: u32) -> Self { self / (n as $t) }
            #[inline(always)]
            fn from_f64(x: f64) -> Self { x as $t }
        }
    )*};
}
int_acc!(i8, u8, i32, u32, i64, u64);

macro_rules! float_acc {
    ($($t:ty),*) => {$(
        impl Accumulator for $t {
            #[inline(always)]
            fn add(self, b: Self) -> Self { self + b }
            #[inline(always)]
            fn mul(self, b: Self) -> Self { self * b }
            #[inline(always)]
            fn minimum(self, b: Self) -> Self {
                if self.is_nan() || b.is_nan() { Self::NAN } else if b < self { b } else { self }
            }
            #[inline(always)]
            fn maximum(self, b: Self) -> Self {
                if self.is_nan() || b.is_nan() { Self::NAN } else if b > self { b } else { self }
            }
            #[inline(always)]
            fn div_u32(self, n: u32) -> Self { self / n as $t }
            #[inline(always)]
            fn from_f64(x: f64) -> Self { x as $t }
        }
    )*};
}
float_acc!(f32, f64);

/// An element type of a collective.
///
/// # Safety
/// `Self` is plain data of `DTYPE.size()` bytes, alignment at most its
/// size, every bit pattern valid (collectives read peers' bytes as `Self`).
pub unsafe trait Element: Copy + PartialEq + core::fmt::Debug + 'static {
    /// Its datatype code.
    const DTYPE: DataType;
    /// What it accumulates in.
    type Acc: Accumulator;
    /// Widened for accumulating.
    fn to_acc(self) -> Self::Acc;
    /// Narrowed back (rounded for the narrow floats).
    fn from_acc(a: Self::Acc) -> Self;
    /// The element's bits, in the low `8 * size` bits.
    fn to_bits64(self) -> u64;
    /// The element with these bits (the low `8 * size`; the rest ignored).
    fn from_bits64(bits: u64) -> Self;
}

macro_rules! plain_element {
    ($($t:ty => $d:ident as $u:ty),*) => {$(
        // SAFETY: a primitive: every bit pattern valid, size = alignment =
        // `DataType::$d.size()`.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            type Acc = $t;
            #[inline(always)]
            fn to_acc(self) -> $t { self }
            #[inline(always)]
            fn from_acc(a: $t) -> $t { a }
            #[inline(always)]
            fn to_bits64(self) -> u64 { self as $u as u64 }
            #[inline(always)]
            fn from_bits64(bits: u64) -> Self { bits as $u as $t }
        }
    )*};
}
plain_element!(i8 => I8 as u8, u8 => U8 as u8, i32 => I32 as u32, u32 => U32 as u32, i64 => I64 as u64, u64 => U64 as u64);

macro_rules! float_element {
    ($($t:ty => $d:ident as $u:ty),*) => {$(
        // SAFETY: a primitive: every bit pattern valid, size = alignment =
        // `DataType::$d.size()`.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            type Acc = $t;
            #[inline(always)]
            fn to_acc(self) -> $t { self }
            #[inline(always)]
            fn from_acc(a: $t) -> $t { a }
            #[inline(always)]
            fn to_bits64(self) -> u64 { self.to_bits() as u64 }
            #[inline(always)]
            fn from_bits64(bits: u64) -> Self { <$t>::from_bits(bits as $u) }
        }
    )*};
}
float_element!(f32 => F32 as u32, f64 => F64 as u64);

/// IEEE 754 half precision, as bits (the host's `half::f16` has the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, as bits (the host's `half::bf16` has the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// 8-bit float with 4 exponent bits (bias 7) and 3 mantissa bits: no
/// infinities, NaN is `0x7f`/`0xff`, largest finite 448 (OCP FP8 E4M3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Fp8E4M3(pub u8);

/// 8-bit float with 5 exponent bits (bias 15) and 2 mantissa bits:
/// infinities `0x7c`/`0xfc`, largest finite 57344 (OCP FP8 E5M2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Fp8E5M2(pub u8);

/// Round-to-nearest-even right shift of `m` by `shift` (0 < shift < 32).
#[inline(always)]
const fn shr_rne(m: u32, shift: u32) -> u32 {
    if shift >= 32 {
        return 0;
    }
    let r = m >> shift;
    let rem = m & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    if rem > half || (rem == half && r & 1 == 1) {
        r + 1
    } else {
        r
    }
}

/// `x` as a small float with `e` exponent bits (bias `bias`) and `m`
/// mantissa bits, rounded to nearest even; a magnitude past `max_finite`
/// (the largest finite code) saturates to it (`satfinite`); NaN gives
/// `nan`. Returns the code without the sign bit, and the sign bit.
#[inline(always)]
const fn f32_to_small(x: f32, m: u32, bias: i32, max_finite: u32, nan: u32) -> (u32, u32) {
    let bits = x.to_bits();
    let sign = bits >> 31;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return (if mant != 0 { nan } else { max_finite }, sign);
    }
    let e = exp - 127 + bias;
    let code = if e >= 1 {
        // Normal: the carry of the rounding may step into the exponent.
        (((e as u32) << m) | (mant >> (23 - m))) + {
            let shift = 23 - m;
            let rem = mant & ((1 << shift) - 1);
            let half = 1 << (shift - 1);
            let odd = (mant >> shift) & 1;
            (rem > half || (rem == half && odd == 1)) as u32
        }
    } else if exp == 0 {
        0 // f32 subnormals are far below every small float's smallest subnormal
    } else {
        // Subnormal in the small format: value = m_full * 2^(exp - 150),
        // code = value / 2^(1 - bias - m).
        let shift = (23 - m as i32 + 1 - e) as u32;
        shr_rne(mant | 0x80_0000, shift)
    };
    (if code > max_finite { max_finite } else { code }, sign)
}

/// The small float's code (no sign bit) as `f32`: `m` mantissa bits,
/// `bias`; exponent field `all_ones` is handled by the caller.
#[inline(always)]
fn small_to_f32(code: u32, m: u32, bias: i32) -> f32 {
    let exp = (code >> m) as i32;
    let mant = code & ((1 << m) - 1);
    if exp == 0 {
        // Subnormal: mant * 2^(1 - bias - m); exact in f32.
        mant as f32 * f32::from_bits(((127 + 1 - bias - m as i32) as u32) << 23)
    } else {
        f32::from_bits((((exp - bias + 127) as u32) << 23) | (mant << (23 - m)))
    }
}

impl Fp8E4M3 {
    /// The value as `f32` (exact).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        let code = (self.0 & 0x7f) as u32;
        let v = if code == 0x7f { f32::NAN } else { small_to_f32(code, 3, 7) };
        if self.0 & 0x80 != 0 {
            -v
        } else {
            v
        }
    }
    /// `x` rounded to nearest even, saturating at ±448, NaN to NaN.
    #[inline(always)]
    pub const fn from_f32(x: f32) -> Self {
        let (code, sign) = f32_to_small(x, 3, 7, 0x7e, 0x7f);
        Fp8E4M3(((sign << 7) | code) as u8)
    }
}

impl Fp8E5M2 {
    /// The value as `f32` (exact).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        let code = (self.0 & 0x7f) as u32;
        let v = if code >= 0x7c {
            if code == 0x7c {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else {
            small_to_f32(code, 2, 15)
        };
        if self.0 & 0x80 != 0 {
            -v
        } else {
            v
        }
    }
    /// `x` rounded to nearest even, saturating at ±57344 (infinities
    /// too), NaN to NaN.
    #[inline(always)]
    pub const fn from_f32(x: f32) -> Self {
        let (code, sign) = f32_to_small(x, 2, 15, 0x7b, 0x7f);
        Fp8E5M2(((sign << 7) | code) as u8)
    }
}

impl Bf16 {
    /// The value as `f32` (exact).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    /// `x` rounded to nearest even (NaN stays NaN, quieted).
    #[inline(always)]
    pub const fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        if bits & 0x7fff_ffff > 0x7f80_0000 {
            return Bf16(((bits >> 16) | 0x40) as u16);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }
}

impl F16 {
    /// The value as `f32` (exact).
    ///
    /// On a GPU the hardware conversion (`cvt.f32.f16`), its 16-bit operand
    /// kept inside the `asm` block: the block takes and gives 32-bit
    /// registers only (a 16-bit inline-asm register once gave wrong low
    /// bytes on an H100, `0x3c66` read back as `0x3c01`). The integer
    /// version, [`F16::to_f32_soft`], made every f16 vector a long integer
    /// sequence and kept LLVM from inlining the f16 MoE combines' loops
    /// (`tests/runtime.rs` checks the two agree on every code).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let bits: u32;
            // SAFETY: register-only conversion instructions, no memory.
            unsafe {
                core::arch::asm!(
                    "{{ .reg .b16 h; .reg .f32 f; cvt.u16.u32 h, {x}; cvt.f32.f16 f, h; mov.b32 {y}, f; }}",
                    x = in(reg32) self.0 as u32, y = out(reg32) bits, options(pure, nomem, nostack)
                );
            }
            f32::from_bits(bits)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.to_f32_soft()
        }
    }

    /// `x` rounded to nearest even (overflow to infinity, NaN to NaN).
    ///
    /// On a GPU `cvt.rn.f16.f32`, with 32-bit operands as in
    /// [`F16::to_f32`] (a NaN comes back as the hardware's canonical NaN,
    /// where [`F16::from_f32_soft`] keeps the payload's top bits).
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            let bits: u32;
            // SAFETY: register-only conversion instructions, no memory.
            unsafe {
                core::arch::asm!(
                    "{{ .reg .b16 h; .reg .f32 f; mov.b32 f, {x}; cvt.rn.f16.f32 h, f; cvt.u32.u16 {y}, h; }}",
                    x = in(reg32) x.to_bits(), y = out(reg32) bits, options(pure, nomem, nostack)
                );
            }
            F16(bits as u16)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            Self::from_f32_soft(x)
        }
    }

    /// [`F16::to_f32`] in integer arithmetic (what the host runs).
    #[inline(always)]
    pub fn to_f32_soft(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h >> 15) << 31;
        let code = h & 0x7fff;
        if code >= 0x7c00 {
            return f32::from_bits(sign | 0x7f80_0000 | ((code & 0x3ff) << 13));
        }
        let v = small_to_f32(code, 10, 15);
        f32::from_bits(sign | v.to_bits())
    }

    /// [`F16::from_f32`] in integer arithmetic (what the host runs).
    #[inline(always)]
    pub const fn from_f32_soft(x: f32) -> Self {
        let bits = x.to_bits();
        let sign = (bits >> 16) & 0x8000;
        if bits & 0x7fff_ffff > 0x7f80_0000 {
            return F16((sign | 0x7e00 | ((bits >> 13) & 0x3ff)) as u16);
        }
        // Infinity for overflow: no saturation for f16 (largest code + 1).
        let (code, _) = f32_to_small(x, 10, 15, 0x7c00, 0x7e00);
        F16((sign | code) as u16)
    }
}

macro_rules! narrow_float_element {
    ($($t:ident => $d:ident as $u:ty),*) => {$(
        // SAFETY: `#[repr(transparent)]` over an integer of the datatype's
        // size; every bit pattern is a value (NaNs included).
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            type Acc = f32;
            #[inline(always)]
            fn to_acc(self) -> f32 { self.to_f32() }
            #[inline(always)]
            fn from_acc(a: f32) -> Self { $t::from_f32(a) }
            #[inline(always)]
            fn to_bits64(self) -> u64 { self.0 as u64 }
            #[inline(always)]
            fn from_bits64(bits: u64) -> Self { $t(bits as $u) }
        }
    )*};
}
narrow_float_element!(F16 => F16 as u16, Bf16 => Bf16 as u16, Fp8E4M3 => Fp8E4M3 as u8, Fp8E5M2 => Fp8E5M2 as u8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_e4m3_round_trips_every_code_and_rounds_to_nearest_even() {
        for b in 0..=255u8 {
            let v = Fp8E4M3(b).to_f32();
            if v.is_nan() {
                assert_eq!(Fp8E4M3::from_f32(v).0 & 0x7f, 0x7f);
            } else {
                assert_eq!(Fp8E4M3::from_f32(v).0, if b == 0x80 { 0x80 } else { b }, "code {b:#x} = {v}");
            }
        }
        assert_eq!(Fp8E4M3::from_f32(448.0).0, 0x7e);
        assert_eq!(Fp8E4M3::from_f32(1e9).0, 0x7e);
        assert_eq!(Fp8E4M3::from_f32(f32::INFINITY).0, 0x7e);
        assert_eq!(Fp8E4M3::from_f32(-1e9).0, 0xfe);
        // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): to even.
        assert_eq!(Fp8E4M3::from_f32(1.0625).0, 0x38);
        assert_eq!(Fp8E4M3::from_f32(1.1875).0, 0x3a);
        // Smallest subnormal 2^-9; half of it rounds to even (zero).
        assert_eq!(Fp8E4M3::from_f32(2f32.powi(-9)).0, 1);
        assert_eq!(Fp8E4M3::from_f32(2f32.powi(-10)).0, 0);
        assert_eq!(Fp8E4M3::from_f32(1.5 * 2f32.powi(-10)).0, 1);
    }

    #[test]
    fn fp8_e5m2_round_trips_every_code() {
        for b in 0..=255u8 {
            let v = Fp8E5M2(b).to_f32();
            if v.is_nan() {
                assert!(Fp8E5M2::from_f32(v).to_f32().is_nan());
            } else if v.is_infinite() {
                assert_eq!(Fp8E5M2::from_f32(v).0, (b & 0x80) | 0x7b);
            } else {
                assert_eq!(Fp8E5M2::from_f32(v).0, if b == 0x80 { 0x80 } else { b }, "code {b:#x} = {v}");
            }
        }
        assert_eq!(Fp8E5M2::from_f32(57344.0).0, 0x7b);
        assert_eq!(Fp8E5M2::from_f32(1e9).0, 0x7b);
        assert_eq!(Fp8E5M2::from_f32(2f32.powi(-16)).0, 1);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f80_8000)).0, 0x3f80); // tie, even
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f81_8000)).0, 0x3f82); // tie, to even
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f80_8001)).0, 0x3f81);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        for b in (0..=u16::MAX).step_by(7) {
            let v = Bf16(b).to_f32();
            if !v.is_nan() {
                assert_eq!(Bf16::from_f32(v).0, b);
            }
        }
    }

    #[test]
    fn f16_round_trips_every_code() {
        for b in 0..=u16::MAX {
            let v = F16(b).to_f32_soft();
            if v.is_nan() {
                assert!(F16::from_f32_soft(v).to_f32_soft().is_nan());
            } else {
                assert_eq!(F16::from_f32_soft(v).0, b, "code {b:#x} = {v}");
            }
        }
        assert_eq!(F16::from_f32_soft(65520.0).0, 0x7c00); // rounds up to infinity
        assert_eq!(F16::from_f32_soft(65519.0).0, 0x7bff);
        assert_eq!(F16::from_f32_soft(2f32.powi(-25)).0, 0); // tie to even
        assert_eq!(F16::from_f32_soft(1.5 * 2f32.powi(-25)).0, 1);
    }
}
