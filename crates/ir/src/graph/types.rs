//! Element types and (possibly symbolic) shapes carried by every tensor of the IR.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// Element type of a tensor, named after ONNX `TensorProto.DataType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    String,
    Complex64,
    Complex128,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    U4,
    I4,
    /// 2-bit integers (opset 25), packed four to a byte.
    U2,
    I2,
    F4E2M1,
    /// OCP MX scale format: an 8-bit power of two (no sign, no mantissa), opset 24.
    F8E8M0,
}

impl DType {
    /// The dtype for an ONNX `TensorProto.DataType` code, `None` for UNDEFINED or unknown codes.
    pub fn from_onnx(code: i32) -> Option<DType> {
        use DType::*;
        Some(match code {
            1 => F32,
            2 => U8,
            3 => I8,
            4 => U16,
            5 => I16,
            6 => I32,
            7 => I64,
            8 => String,
            9 => Bool,
            10 => F16,
            11 => F64,
            12 => U32,
            13 => U64,
            14 => Complex64,
            15 => Complex128,
            16 => BF16,
            17 => F8E4M3FN,
            18 => F8E4M3FNUZ,
            19 => F8E5M2,
            20 => F8E5M2FNUZ,
            21 => U4,
            22 => I4,
            23 => F4E2M1,
            24 => F8E8M0,
            25 => U2,
            26 => I2,
            _ => return None,
        })
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        use DType::*;
        match self {
            F32 => 1,
            U8 => 2,
            I8 => 3,
            U16 => 4,
            I16 => 5,
            I32 => 6,
            I64 => 7,
            String => 8,
            Bool => 9,
            F16 => 10,
            F64 => 11,
            U32 => 12,
            U64 => 13,
            Complex64 => 14,
            Complex128 => 15,
            BF16 => 16,
            F8E4M3FN => 17,
            F8E4M3FNUZ => 18,
            F8E5M2 => 19,
            F8E5M2FNUZ => 20,
            U4 => 21,
            I4 => 22,
            F4E2M1 => 23,
            F8E8M0 => 24,
            U2 => 25,
            I2 => 26,
        }
    }

    /// Storage size of one element in bits. Strings have no fixed size; they count as one
    /// pointer (64 bits), which is what a runtime holds per element before the string data.
    pub fn size_bits(self) -> u64 {
        use DType::*;
        match self {
            U2 | I2 => 2,
            U4 | I4 | F4E2M1 => 4,
            Bool | I8 | U8 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => 8,
            F16 | BF16 | I16 | U16 => 16,
            F32 | I32 | U32 => 32,
            F64 | I64 | U64 | Complex64 | String => 64,
            Complex128 => 128,
        }
    }

    /// Bytes needed to store `elements` values of this type (sub-byte types packed), or `None`
    /// when that overflows `u64`.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        elements
            .checked_mul(self.size_bits())
            .map(|bits| bits.div_ceil(8))
    }

    /// Whether the type is a floating-point type (including the fp8/fp4 formats).
    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F16 | BF16 | F64 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F4E2M1 | F8E8M0
        )
    }

    /// The dtype [`DType::name`] calls `name` (as plans and export manifests write it).
    pub fn from_name(name: &str) -> Option<DType> {
        (0..=26)
            .filter_map(DType::from_onnx)
            .find(|d| d.name() == name)
    }

    /// The name used in plans and reports, numpy style (`float32`, `int64`, ...).
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "float32",
            F16 => "float16",
            BF16 => "bfloat16",
            F64 => "float64",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            U8 => "uint8",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
            Bool => "bool",
            String => "string",
            Complex64 => "complex64",
            Complex128 => "complex128",
            F8E4M3FN => "float8e4m3fn",
            F8E4M3FNUZ => "float8e4m3fnuz",
            F8E5M2 => "float8e5m2",
            F8E5M2FNUZ => "float8e5m2fnuz",
            U4 => "uint4",
            I4 => "int4",
            U2 => "uint2",
            I2 => "int2",
            F4E2M1 => "float4e2m1",
            F8E8M0 => "float8e8m0",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for DType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// A symbolic dimension: `coefficient × product of named symbols`, e.g. `4*batch*seq`.
///
/// Monomials are closed under the operations that reshapes perform (multiply, exact divide),
/// which is what lets `Reshape(x, [batch*seq, -1])` stay symbolic until the user binds the
/// names. Sums (`past + seq`) are not monomials; inference gives those a fresh symbol instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymDim {
    coefficient: u64,
    /// Sorted symbol names; repeated names are powers.
    symbols: Vec<Arc<str>>,
}

impl SymDim {
    /// A single named symbol.
    pub fn named(name: &str) -> SymDim {
        SymDim {
            coefficient: 1,
            symbols: vec![Arc::from(name)],
        }
    }

    /// The symbol names this dim is a product of, sorted.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.symbols.iter().map(|s| &**s)
    }

    /// The constant factor.
    pub fn coefficient(&self) -> u64 {
        self.coefficient
    }
}

impl fmt::Display for SymDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.coefficient != 1 {
            write!(f, "{}*", self.coefficient)?;
        }
        for (i, s) in self.symbols.iter().enumerate() {
            if i > 0 {
                f.write_str("*")?;
            }
            f.write_str(s)?;
        }
        Ok(())
    }
}

/// One dimension of a shape: a known size or a symbolic product of named sizes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A concrete size.
    Known(u64),
    /// A size that depends on names the user binds (`--dim batch=8`).
    Sym(SymDim),
}

impl Dim {
    /// A dim named by a single symbol.
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(SymDim::named(name))
    }

    /// The concrete size, if known.
    pub fn known(&self) -> Option<u64> {
        match self {
            Dim::Known(v) => Some(*v),
            Dim::Sym(_) => None,
        }
    }

    /// Product of two dims; `None` only when concrete sizes overflow `u64`.
    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        match (self, other) {
            (Dim::Known(a), Dim::Known(b)) => a.checked_mul(*b).map(Dim::Known),
            (Dim::Known(0), Dim::Sym(_)) | (Dim::Sym(_), Dim::Known(0)) => Some(Dim::Known(0)),
            (Dim::Known(k), Dim::Sym(s)) | (Dim::Sym(s), Dim::Known(k)) => Some(Dim::Sym(SymDim {
                coefficient: s.coefficient.checked_mul(*k)?,
                symbols: s.symbols.clone(),
            })),
            (Dim::Sym(a), Dim::Sym(b)) => {
                let mut symbols: Vec<Arc<str>> =
                    a.symbols.iter().chain(&b.symbols).cloned().collect();
                symbols.sort();
                Some(Dim::Sym(SymDim {
                    coefficient: a.coefficient.checked_mul(b.coefficient)?,
                    symbols,
                }))
            }
        }
    }

    /// Exact quotient `self / other`, or `None` when it is not a monomial (or divides by 0).
    pub fn exact_div(&self, other: &Dim) -> Option<Dim> {
        let (num_coeff, num_syms) = self.parts();
        let (den_coeff, den_syms) = other.parts();
        if den_coeff == 0 || num_coeff % den_coeff != 0 {
            return None;
        }
        let mut remaining = num_syms.to_vec();
        for s in den_syms {
            let pos = remaining.iter().position(|r| r == s)?;
            remaining.remove(pos);
        }
        let coefficient = num_coeff / den_coeff;
        Some(if remaining.is_empty() || coefficient == 0 {
            Dim::Known(coefficient)
        } else {
            Dim::Sym(SymDim {
                coefficient,
                symbols: remaining,
            })
        })
    }

    fn parts(&self) -> (u64, &[Arc<str>]) {
        match self {
            Dim::Known(v) => (*v, &[]),
            Dim::Sym(s) => (s.coefficient, &s.symbols),
        }
    }
}

impl From<u64> for Dim {
    fn from(v: u64) -> Dim {
        Dim::Known(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(v) => write!(f, "{v}"),
            Dim::Sym(s) => write!(f, "{s}"),
        }
    }
}

impl Serialize for Dim {
    /// Known dims serialise as numbers, symbolic ones as their expression string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Dim::Known(v) => serializer.serialize_u64(*v),
            Dim::Sym(s) => serializer.collect_str(s),
        }
    }
}

/// A tensor shape; rank 0 is a scalar.
pub type Shape = Vec<Dim>;

/// Product of all dims of a shape (`None` on overflow). A shape with a zero dim holds zero
/// elements however large its other dims (`[2^40, 2^40, 0]`), as onnx and numpy count it.
pub fn element_count(shape: &[Dim]) -> Option<Dim> {
    if shape.contains(&Dim::Known(0)) {
        return Some(Dim::Known(0));
    }
    shape
        .iter()
        .try_fold(Dim::Known(1), |acc, d| acc.checked_mul(d))
}

/// Product of concrete dims (`None` on overflow); 0 when any dim is 0, however large the
/// others are (`[4, 2^62, 0]` is an empty tensor, not an overflow).
pub fn checked_element_count(dims: &[u64]) -> Option<u64> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Formats a shape as `[batch, 16, 64]`.
pub fn format_shape(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_is_found_by_its_name() {
        let all: Vec<DType> = (0..64).filter_map(DType::from_onnx).collect();
        assert_eq!(all.len(), 26);
        for dtype in all {
            assert_eq!(DType::from_name(dtype.name()), Some(dtype), "{dtype:?}");
        }
        assert_eq!(DType::from_name("float"), None);
    }

    #[test]
    fn symbolic_products_divide_back() {
        let batch = Dim::sym("batch");
        let seq = Dim::sym("seq");
        let tokens = batch.checked_mul(&seq).unwrap();
        let flat = tokens.checked_mul(&Dim::Known(64)).unwrap();
        assert_eq!(flat.to_string(), "64*batch*seq");
        assert_eq!(flat.exact_div(&Dim::Known(64)).unwrap(), tokens);
        assert_eq!(flat.exact_div(&tokens).unwrap(), Dim::Known(64));
        assert_eq!(Dim::Known(6).exact_div(&Dim::Known(4)), None);
        assert_eq!(batch.exact_div(&seq), None);
    }

    #[test]
    fn sub_byte_types_pack() {
        assert_eq!(DType::I4.bytes_for(3), Some(2));
        assert_eq!(DType::F16.bytes_for(10), Some(20));
        assert_eq!(DType::F64.bytes_for(u64::MAX), None);
        for code in 1..=24 {
            assert_eq!(DType::from_onnx(code).unwrap().onnx_code(), code);
        }
    }
}
