//! The element types of the host collectives.

use bytemuck::Pod;
pub use devcomm_device::coll::{DataType, Fp8E4M3, Fp8E5M2};

mod sealed {
    pub trait Sealed {}
}

/// An element type the collectives take: NCCL's `ncclDataType_t` set.
///
/// | Rust | [`DataType`] |
/// |---|---|
/// | `i8`, `u8`, `i32`, `u32`, `i64`, `u64` | `I8` ... `U64` |
/// | `half::f16`, `f32`, `f64`, `half::bf16` | `F16`, `F32`, `F64`, `Bf16` |
/// | [`Fp8E4M3`], [`Fp8E5M2`] | `Fp8E4M3`, `Fp8E5M2` |
///
/// `to_f64`/`from_f64` convert exactly where they can (for references in
/// tests and checks); `from_f64` rounds to nearest even (the narrow floats
/// through `f32`, as the device does; fp8 saturating).
pub trait CollType: Pod + PartialEq + std::fmt::Debug + Send + Sync + sealed::Sealed {
    /// Its datatype.
    const DTYPE: DataType;
    /// The value as `f64` (integers wider than 53 bits may round).
    fn to_f64(self) -> f64;
    /// `x` converted (integers: truncated toward zero, saturating).
    fn from_f64(x: f64) -> Self;
}

macro_rules! prim {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl CollType for $t {
            const DTYPE: DataType = DataType::$d;
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(x: f64) -> Self { x as $t }
        }
    )*};
}
prim!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

impl sealed::Sealed for half::f16 {}
impl CollType for half::f16 {
    const DTYPE: DataType = DataType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f32(x as f32)
    }
}

impl sealed::Sealed for half::bf16 {}
impl CollType for half::bf16 {
    const DTYPE: DataType = DataType::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f32(x as f32)
    }
}

impl sealed::Sealed for Fp8E4M3 {}
impl CollType for Fp8E4M3 {
    const DTYPE: DataType = DataType::Fp8E4M3;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(x: f64) -> Self {
        Fp8E4M3::from_f32(x as f32)
    }
}

impl sealed::Sealed for Fp8E5M2 {}
impl CollType for Fp8E5M2 {
    const DTYPE: DataType = DataType::Fp8E5M2;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(x: f64) -> Self {
        Fp8E5M2::from_f32(x as f32)
    }
}

#[cfg(test)]
mod tests {
    use devcomm_device::coll::{Bf16, F16};

    #[test]
    fn device_f16_and_bf16_agree_with_half_bit_for_bit() {
        for b in 0..=u16::MAX {
            let h = half::f16::from_bits(b);
            let d = F16(b).to_f32_soft();
            assert!(h.to_f32().to_bits() == d.to_bits() || (h.is_nan() && d.is_nan()), "f16 {b:#x}");
            let g = half::bf16::from_bits(b);
            assert!(g.to_f32().to_bits() == Bf16(b).to_f32().to_bits() || g.is_nan(), "bf16 {b:#x}");
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_nan() {
                continue;
            }
            assert_eq!(half::f16::from_f32(f).to_bits(), F16::from_f32_soft(f).0, "f16 of {f:e} ({x:#x})");
            assert_eq!(half::bf16::from_f32(f).to_bits(), Bf16::from_f32(f).0, "bf16 of {f:e} ({x:#x})");
        }
    }
}
