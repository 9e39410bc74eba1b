//! The narrow number formats the CPU runtime keeps in wider storage: float8 (the four OCP/Graphcore
//! variants of ONNX), float4 E2M1, bfloat16, float16 (values kept as f32) and int4/uint4 (kept
//! as i64). A cast to one of them rounds the value to one the format can hold, so everything
//! computed from it sees what a runtime storing the format would.
//!
//! The rules are those of the `ml_dtypes` package that the ONNX reference implementation casts
//! with: round to nearest, ties to even; float8 with `saturate` clamps to the largest finite
//! value (infinities included), without it a value beyond that range becomes NaN (infinity for
//! E5M2, which has one); the FNUZ formats have no negative zero; float4 E2M1 always saturates
//! and has no NaN (a NaN becomes negative zero, as in `ml_dtypes`);
//! int4 and uint4 truncate towards zero and wrap modulo 16, NaN and infinities giving 0.
//! float8 E8M0 (the MX scale type) holds only powers of two, 2^-127 to 2^127, and NaN; a cast
//! to it keeps the f32 exponent and rounds by Cast's `round_mode` (`up` by default).

use pipecut_ir::graph::DType;

/// A floating-point format narrower than f32, by its bit layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MiniFloat {
    pub(crate) mantissa_bits: i32,
    /// Exponent bias: the smallest normal exponent is `1 − bias`.
    pub(crate) bias: i32,
    /// Largest finite value.
    pub(crate) max: f64,
    /// Has an infinity (E5M2 only among the float8 formats).
    pub(crate) has_infinity: bool,
    /// No negative zero (the FNUZ formats).
    pub(crate) unsigned_zero: bool,
    /// Out-of-range values clamp whatever `saturate` says (float4 E2M1).
    pub(crate) always_saturates: bool,
}

/// The layout [`round_float`] rounds `dtype` to, for the CUDA backend's kernel that rounds the
/// same way (`round_float_f32`): the float8 and float4 formats, and float16 and bfloat16 (which
/// [`round_float`] leaves to the `half` crate, and which the same rule gives, as a test here
/// checks); `None` for f32, f64 and E8M0 (not a layout of this kind).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn layout(dtype: DType) -> Option<MiniFloat> {
    let ieee = |mantissa_bits, bias, max| MiniFloat {
        mantissa_bits,
        bias,
        max,
        has_infinity: true,
        unsigned_zero: false,
        always_saturates: false,
    };
    match dtype {
        DType::F16 => Some(ieee(10, 15, 65504.0)),
        DType::BF16 => Some(ieee(7, 127, f64::from(half::bf16::MAX.to_f32()))),
        other => MiniFloat::of(other),
    }
}

impl MiniFloat {
    fn of(dtype: DType) -> Option<MiniFloat> {
        let format = |mantissa_bits, bias, max, has_infinity, unsigned_zero| MiniFloat {
            mantissa_bits,
            bias,
            max,
            has_infinity,
            unsigned_zero,
            always_saturates: false,
        };
        Some(match dtype {
            DType::F8E4M3FN => format(3, 7, 448.0, false, false),
            DType::F8E4M3FNUZ => format(3, 8, 240.0, false, true),
            DType::F8E5M2 => format(2, 15, 57344.0, true, false),
            DType::F8E5M2FNUZ => format(2, 16, 57344.0, false, true),
            DType::F4E2M1 => MiniFloat {
                always_saturates: true,
                ..format(1, 1, 6.0, false, false)
            },
            _ => return None,
        })
    }

    /// `x` rounded to this format, as f32 (exact: every value of these formats is an f32).
    pub(crate) fn round(self, x: f32, saturate: bool) -> f32 {
        let saturate = saturate || self.always_saturates;
        if x.is_nan() {
            // float4 E2M1 has no NaN: ml_dtypes (and so the ONNX reference) gives the pattern
            // 0b1000, negative zero.
            return if self.always_saturates {
                -0.0
            } else {
                f32::NAN
            };
        }
        let negative = x.is_sign_negative();
        let signed = |magnitude: f64| {
            let value = if negative { -magnitude } else { magnitude };
            if value == 0.0 && self.unsigned_zero {
                0.0
            } else {
                value as f32
            }
        };
        let magnitude = f64::from(x).abs();
        if magnitude.is_infinite() {
            return match (saturate, self.has_infinity) {
                (true, _) => signed(self.max),
                (false, true) => signed(f64::INFINITY),
                (false, false) => f32::NAN,
            };
        }
        if magnitude == 0.0 {
            return signed(0.0);
        }
        // The spacing of representable values at this magnitude: 2^(e − mantissa bits) for
        // the binade 2^e, with subnormals spaced as the smallest normal binade.
        let exponent = ((magnitude.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let spacing = exponent.max(1 - self.bias) - self.mantissa_bits;
        let quantum = 2f64.powi(spacing);
        let rounded = (magnitude / quantum).round_ties_even() * quantum;
        if rounded > self.max {
            return match (saturate, self.has_infinity) {
                (true, _) => signed(self.max),
                (false, true) => signed(f64::INFINITY),
                (false, false) => f32::NAN,
            };
        }
        signed(rounded)
    }
}

/// `x` as the float format `dtype` would hold it (f16, bf16, float8, float4; f32 and f64 as
/// is), with float8's `saturate` (ONNX Cast's attribute, default on).
pub fn round_float(dtype: DType, x: f32, saturate: bool) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F8E8M0 => round_e8m0(x, saturate, E8M0Rounding::Up),
        other => MiniFloat::of(other).map_or(x, |format| format.round(x, saturate)),
    }
}

/// Whether [`round_float`] changes values of `dtype` (it is a float narrower than f32).
pub fn is_narrow_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F8E8M0) || MiniFloat::of(dtype).is_some()
}

/// How a cast to float8 E8M0 picks a power of two (Cast's `round_mode`, opset 24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E8M0Rounding {
    /// The next power of two at or above the magnitude (the default).
    Up,
    /// The power of two at or below it (the exponent as is).
    Down,
    /// The nearer of the two, ties to the even exponent.
    Nearest,
}

impl E8M0Rounding {
    /// The mode a `round_mode` attribute names.
    pub fn parse(name: &str) -> Result<E8M0Rounding, String> {
        match name {
            "up" => Ok(E8M0Rounding::Up),
            "down" => Ok(E8M0Rounding::Down),
            "nearest" => Ok(E8M0Rounding::Nearest),
            other => Err(format!(
                "round_mode '{other}' is not one of up, down, nearest"
            )),
        }
    }
}

/// `x` as float8 E8M0 holds it, as f32: 2^(e − 127) for the 8-bit exponent `e` that the f32
/// exponent of `|x|` rounds to (the sign is dropped; zero and subnormals have exponent 0, so they
/// become 2^-127), NaN for NaN, infinities and a rounding past 2^127 without `saturate`. This is
/// `onnx.numpy_helper.to_float8e8m0`, the ONNX reference's cast.
pub fn round_e8m0(x: f32, saturate: bool, rounding: E8M0Rounding) -> f32 {
    const NAN_EXPONENT: u32 = 0xff;
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    if exponent == NAN_EXPONENT {
        return f32::NAN;
    }
    let mantissa = bits & 0x7f_ffff;
    let round_up = match rounding {
        E8M0Rounding::Up => mantissa != 0,
        E8M0Rounding::Down => false,
        // The reference rounds a tie up except from exponent 0 (its `lsb` is `exponent > 0`).
        E8M0Rounding::Nearest => {
            let half = 0x40_0000;
            mantissa > half || (mantissa == half && exponent > 0)
        }
    };
    let exponent = match (round_up, exponent == NAN_EXPONENT - 1, saturate) {
        (true, true, true) => exponent,
        (true, _, _) => exponent + 1,
        (false, _, _) => exponent,
    };
    if exponent == NAN_EXPONENT {
        return f32::NAN;
    }
    2f32.powi(exponent as i32 - 127)
}

/// A float cast to a `bits`-wide integer (int4/uint4, int2/uint2; `signed` or not): truncated
/// towards zero, wrapped modulo 2^bits as [`wrap_int`] does (ml_dtypes' rule, the reference's);
/// NaN and infinities give 0.
pub fn float_to_narrow_int(x: f32, bits: u32, signed: bool) -> i64 {
    if !x.is_finite() {
        return 0;
    }
    let modulus = (1i64 << bits) as f32;
    wrap_int(x.trunc().rem_euclid(modulus) as i64, bits, signed)
}

/// An integer cast to a `bits`-wide integer type (`signed` or not): wrapped modulo 2^bits.
pub fn wrap_int(x: i64, bits: u32, signed: bool) -> i64 {
    let modulus = 1i64 << bits;
    let low = x.rem_euclid(modulus);
    if signed && low >= modulus / 2 {
        low - modulus
    } else {
        low
    }
}

/// The width and signedness of the sub-byte integer types, `None` for any other.
pub fn narrow_int(dtype: DType) -> Option<(u32, bool)> {
    match dtype {
        DType::I4 => Some((4, true)),
        DType::U4 => Some((4, false)),
        DType::I2 => Some((2, true)),
        DType::U2 => Some((2, false)),
        _ => None,
    }
}

/// The value one byte holds in a one-byte float format as `ml_dtypes` stores it (float8, float4
/// E2M1 in the low four bits, float8 E8M0), `None` for any other dtype: the `.npy` files
/// ml_dtypes writes hold these bytes.
pub fn byte_to_float(dtype: DType, byte: u8) -> Option<f32> {
    if dtype == DType::F8E8M0 {
        return Some(match byte {
            0xff => f32::NAN,
            e => 2f32.powi(i32::from(e) - 127),
        });
    }
    let format = MiniFloat::of(dtype)?;
    let width = if dtype == DType::F4E2M1 { 4 } else { 8 };
    let bits = u32::from(byte) & ((1 << width) - 1);
    let exponent_bits = width - 1 - format.mantissa_bits;
    let sign_bit = 1 << (width - 1);
    let magnitude_bits = bits & (sign_bit - 1);
    let exponent = (magnitude_bits >> format.mantissa_bits) as i32;
    let mantissa = f64::from(magnitude_bits & ((1 << format.mantissa_bits) - 1));
    let top_exponent = (1 << exponent_bits) - 1;
    let nan = match dtype {
        DType::F8E4M3FN => magnitude_bits == 0x7f,
        DType::F8E5M2 => exponent == top_exponent && mantissa != 0.0,
        DType::F8E4M3FNUZ | DType::F8E5M2FNUZ => bits == 0x80,
        _ => false,
    };
    if nan {
        return Some(f32::NAN);
    }
    let fraction = mantissa / f64::from(1u32 << format.mantissa_bits);
    let magnitude = match exponent {
        0 => fraction * 2f64.powi(1 - format.bias),
        e if e == top_exponent && format.has_infinity => f64::INFINITY,
        e => (1.0 + fraction) * 2f64.powi(e - format.bias),
    };
    let negative = bits & sign_bit != 0;
    Some(if negative { -magnitude } else { magnitude } as f32)
}

/// Encodes values of a one-byte float format as `ml_dtypes` stores them; the inverse of
/// [`byte_to_float`]. Values come from tensors of the format, so they are its own; any other is
/// rounded to it first, without saturating (an infinity stays one where the format has it).
pub(crate) struct ByteEncoder {
    dtype: DType,
    by_bits: std::collections::HashMap<u32, u8>,
    nan: u8,
}

impl ByteEncoder {
    /// The encoder of `dtype`, `None` when it is not a one-byte float format.
    pub(crate) fn new(dtype: DType) -> Option<ByteEncoder> {
        let patterns = if dtype == DType::F4E2M1 { 16 } else { 256 };
        let mut by_bits = std::collections::HashMap::new();
        let mut nan = None;
        for byte in 0..patterns {
            let byte = byte as u8;
            let value = byte_to_float(dtype, byte)?;
            if value.is_nan() {
                nan.get_or_insert(byte);
            } else {
                // FNUZ's 0x80 is NaN, so each value has one pattern; the first wins otherwise.
                by_bits.entry(value.to_bits()).or_insert(byte);
            }
        }
        Some(ByteEncoder {
            dtype,
            by_bits,
            nan: nan.unwrap_or(0x08),
        })
    }

    /// The byte of `x` rounded to the format.
    pub(crate) fn encode(&self, x: f32) -> u8 {
        if let Some(&byte) = self.by_bits.get(&x.to_bits()) {
            return byte;
        }
        let rounded = round_float(self.dtype, x, false);
        if rounded.is_nan() {
            return self.nan;
        }
        let zero = || self.by_bits.get(&0.0f32.to_bits()).copied().unwrap_or(0);
        self.by_bits
            .get(&rounded.to_bits())
            .copied()
            .unwrap_or_else(zero)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout rule the device kernel follows gives what `half` gives for float16 and
    /// bfloat16, over f32 bit patterns spread across the whole range (subnormals, the overflow
    /// edge, infinities and NaN included) and near every binade's halfway points.
    #[test]
    fn layout_rounding_matches_half_for_float16_and_bfloat16() {
        let mut patterns: Vec<u32> = (0..=u32::MAX).step_by(65_521).collect();
        for exponent in 0..255u32 {
            for low in [
                0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0x17fff, 0x18000,
            ] {
                patterns.push((exponent << 23) | low);
                patterns.push((exponent << 23) | 0x7f_0000 | low);
            }
        }
        patterns.extend([65504f32, 65519.0, 65520.0, 3.4e38, f32::MAX].map(f32::to_bits));
        for dtype in [DType::F16, DType::BF16] {
            let format = layout(dtype).unwrap();
            for &bits in &patterns {
                for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                    let (want, got) = (round_float(dtype, x, false), format.round(x, false));
                    assert!(
                        want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                        "{dtype:?} of {x:e}: half gives {want:e}, the layout rule {got:e}"
                    );
                }
            }
        }
    }

    /// Every value of an 8-bit format, decoded from its bit pattern by the format's definition
    /// (independently of the rounding code), with NaN patterns left out.
    fn values(dtype: DType) -> Vec<f32> {
        let (exponent_bits, mantissa_bits, bias) = match dtype {
            DType::F8E4M3FN => (4, 3, 7),
            DType::F8E4M3FNUZ => (4, 3, 8),
            DType::F8E5M2 => (5, 2, 15),
            DType::F8E5M2FNUZ => (5, 2, 16),
            _ => unreachable!(),
        };
        let mut out = Vec::new();
        for bits in 0u32..256 {
            let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
            let e = ((bits >> mantissa_bits) & ((1 << exponent_bits) - 1)) as i32;
            let m = (bits & ((1 << mantissa_bits) - 1)) as f64;
            let fraction = m / f64::from(1u32 << mantissa_bits);
            let nan = match dtype {
                DType::F8E4M3FN => bits & 0x7f == 0x7f,
                DType::F8E5M2 => e == 31,
                _ => bits == 0x80,
            };
            if nan {
                continue;
            }
            let magnitude = if e == 0 {
                fraction * 2f64.powi(1 - bias)
            } else {
                (1.0 + fraction) * 2f64.powi(e - bias)
            };
            out.push((sign * magnitude) as f32);
        }
        out.sort_by(f32::total_cmp);
        out.dedup();
        out
    }

    #[test]
    fn every_float8_value_round_trips_and_midpoints_go_to_even() {
        for dtype in [
            DType::F8E4M3FN,
            DType::F8E4M3FNUZ,
            DType::F8E5M2,
            DType::F8E5M2FNUZ,
        ] {
            let all = values(dtype);
            for &v in &all {
                assert_eq!(
                    round_float(dtype, v, false).to_bits(),
                    v.to_bits(),
                    "{dtype:?} {v}"
                );
            }
            let positive: Vec<f32> = all.iter().copied().filter(|&v| v > 0.0).collect();
            for pair in positive.windows(2) {
                let mid = (pair[0] + pair[1]) / 2.0;
                let got = round_float(dtype, mid, true);
                // Ties to even: the neighbour whose last mantissa bit is 0.
                assert!(got == pair[0] || got == pair[1], "{dtype:?} {mid} -> {got}");
                let just_above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(
                    round_float(dtype, just_above, true),
                    pair[1],
                    "{dtype:?} {just_above}"
                );
            }
            let max = *positive.last().unwrap();
            assert_eq!(round_float(dtype, f32::INFINITY, true), max);
            assert_eq!(round_float(dtype, 1e9, true), max);
            assert_eq!(round_float(dtype, -1e9, true), -max);
        }
        // Beyond the range without saturation: NaN, or infinity where the format has one.
        assert!(round_float(DType::F8E4M3FN, 500.0, false).is_nan());
        assert_eq!(round_float(DType::F8E5M2, 1e9, false), f32::INFINITY);
        assert!(round_float(DType::F8E5M2FNUZ, f32::NEG_INFINITY, false).is_nan());
        // ml_dtypes' figures (the ONNX reference's casts): 300 → 288 and 320.
        assert_eq!(round_float(DType::F8E4M3FN, 300.0, false), 288.0);
        assert_eq!(round_float(DType::F8E5M2, 300.0, false), 320.0);
        assert_eq!(round_float(DType::F8E4M3FNUZ, -0.0, true).to_bits(), 0);
        assert_eq!(
            round_float(DType::F8E4M3FN, -0.0, true).to_bits(),
            (-0.0f32).to_bits()
        );
    }

    #[test]
    fn float4_saturates_and_4bit_integers_wrap_as_ml_dtypes_does() {
        let cast = |x| round_float(DType::F4E2M1, x, false);
        let got: Vec<f32> = [-9.7, -2.5, 0.5, 1.5, 2.5, 6.6, f32::INFINITY]
            .into_iter()
            .map(cast)
            .collect();
        assert_eq!(got, vec![-6.0, -2.0, 0.5, 1.5, 2.0, 6.0, 6.0]);
        assert_eq!(cast(f32::NAN).to_bits(), (-0.0f32).to_bits());
        // ml_dtypes: [-9.7, 8.5, 15.5, 300, NaN] as int4 → [7, -8, -1, -4, 0]; as uint4 the
        // same modulo 16, and -2.5 → 14.
        let int4: Vec<i64> = [-9.7, 8.5, 15.5, 300.0, f32::NAN]
            .into_iter()
            .map(|x| float_to_narrow_int(x, 4, true))
            .collect();
        assert_eq!(int4, vec![7, -8, -1, -4, 0]);
        assert_eq!(float_to_narrow_int(-2.5, 4, false), 14);
        assert_eq!(wrap_int(-9, 4, false), 7);
        // ml_dtypes: [-9.7, 8.5, 15.5, 300, -2.5, 3] as int2 → [-1, 0, -1, 0, -2, -1]; as uint2
        // [3, 0, 3, 0, 2, 3].
        let int2 = |signed| -> Vec<i64> {
            [-9.7, 8.5, 15.5, 300.0, -2.5, 3.0]
                .into_iter()
                .map(|x| float_to_narrow_int(x, 2, signed))
                .collect()
        };
        assert_eq!(int2(true), vec![-1, 0, -1, 0, -2, -1]);
        assert_eq!(int2(false), vec![3, 0, 3, 0, 2, 3]);
        assert_eq!(wrap_int(5, 2, true), 1);
        assert_eq!(round_float(DType::BF16, 0.8191054, true), 0.8203125);
    }

    #[test]
    fn e8m0_keeps_a_power_of_two_rounded_as_cast_says() {
        let up = |x| round_e8m0(x, true, E8M0Rounding::Up);
        // onnx's test_cast_e8m0_FLOAT_to_FLOAT8E8M0 reference.
        let got: Vec<f32> = [0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0]
            .into_iter()
            .map(up)
            .collect();
        let want = [2f32.powi(-127), 0.125, 0.25, 0.5, 2.0, 2.0, 4.0, 8.0];
        assert_eq!(got, want);
        assert_eq!(up(-3.0), 4.0);
        assert!(up(f32::INFINITY).is_nan());
        assert_eq!(up(f32::MAX), 2f32.powi(127));
        assert!(round_e8m0(f32::MAX, false, E8M0Rounding::Up).is_nan());
        assert_eq!(round_e8m0(3.0, true, E8M0Rounding::Down), 2.0);
        assert_eq!(round_e8m0(2.9, true, E8M0Rounding::Nearest), 2.0);
        assert_eq!(round_e8m0(3.1, true, E8M0Rounding::Nearest), 4.0);
        assert_eq!(E8M0Rounding::parse("nearest"), Ok(E8M0Rounding::Nearest));
        assert!(E8M0Rounding::parse("sideways").is_err());
    }

    #[test]
    fn every_byte_of_a_one_byte_float_decodes_and_encodes_back() {
        for dtype in [
            DType::F8E4M3FN,
            DType::F8E4M3FNUZ,
            DType::F8E5M2,
            DType::F8E5M2FNUZ,
            DType::F4E2M1,
            DType::F8E8M0,
        ] {
            let encoder = ByteEncoder::new(dtype).unwrap();
            let patterns = if dtype == DType::F4E2M1 { 16 } else { 256 };
            for byte in 0..patterns {
                let value = byte_to_float(dtype, byte as u8).unwrap();
                if value.is_nan() {
                    assert!(byte_to_float(dtype, encoder.encode(value))
                        .unwrap()
                        .is_nan());
                    continue;
                }
                assert_eq!(encoder.encode(value), byte as u8, "{dtype:?} {value}");
            }
        }
        // As ml_dtypes stores them (np.array([448, -0.0]).astype(float8_e4m3fn).view(uint8)).
        assert_eq!(byte_to_float(DType::F8E4M3FN, 126), Some(448.0));
        assert_eq!(byte_to_float(DType::F4E2M1, 15), Some(-6.0));
        assert_eq!(byte_to_float(DType::F8E8M0, 127), Some(1.0));
        assert_eq!(byte_to_float(DType::F8E5M2, 0x7c), Some(f32::INFINITY));
    }
}
