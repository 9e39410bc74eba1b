//! The runtime's owned tensor: a shape and a typed, row-major buffer.
//!
//! Compute is fp32. Weights and inputs stored as fp16, bf16 or fp64 are widened to fp32 when they
//! are read ([`HostTensor::from_f16`], the `.npy` reader and the weight loader do it), so a model
//! exported in half precision runs with fp32 arithmetic; int64, int32 and bool carry indices,
//! shapes and masks exactly. uint8 and int8 (images, quantized tensors) stay one byte per
//! element, so a decoded image or a quantized activation costs what its data does, and so do
//! the sub-byte integers (uint4 and uint2 as uint8, int4 and int2 as int8, one value a byte); a
//! kernel with no byte path sees them widened to int64 (`kernels::call` does it at the kernel's
//! entry). The other narrow integer types (int16, uint16, uint32) widen to int64, the type ONNX
//! shape arithmetic uses. Strings (the text ops, `ai.onnx.ml` encoders)
//! are owned UTF-8 strings, one per element; only the CPU runtime holds them.

use std::fmt;

use pipecut_ir::graph::{ConstValue, DType, SymInt};

/// The runtime dtype a model dtype computes in (see the module doc): float types as float32
/// (float16, bfloat16, float8 and float4 values kept exactly), uint8 and int8 as themselves,
/// the sub-byte integers in a byte of their signedness, the other narrow integers as int64
/// (uint64 bit for bit).
pub fn runtime_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F32,
        narrow if super::narrow::is_narrow_float(narrow) => DType::F32,
        DType::I4 | DType::I2 => DType::I8,
        DType::U4 | DType::U2 => DType::U8,
        DType::I16 | DType::U16 | DType::U32 | DType::U64 => DType::I64,
        other => other,
    }
}

/// Bytes `elements` values of model dtype `dtype` take as the runtime holds them (in
/// [`runtime_dtype`]: an int16 tensor in 8 bytes an element, a float8 one in 4), which is also
/// what they take on the wire between ranks (a held tensor's `.npy`); `None` on overflow.
pub fn held_bytes(dtype: DType, elements: u64) -> Option<u64> {
    runtime_dtype(dtype).bytes_for(elements)
}

/// The elements of a [`HostTensor`].
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum TensorData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U8(Vec<u8>),
    I8(Vec<i8>),
}

impl TensorData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::Bool(v) => v.len(),
            TensorData::String(v) => v.len(),
            TensorData::U8(v) => v.len(),
            TensorData::I8(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
            TensorData::String(_) => DType::String,
            TensorData::U8(_) => DType::U8,
            TensorData::I8(_) => DType::I8,
        }
    }

    /// Bytes the elements take (strings: their UTF-8 bytes, not counting each `String`'s own
    /// header).
    pub fn byte_size(&self) -> usize {
        match self {
            TensorData::F32(v) => std::mem::size_of_val(v.as_slice()),
            TensorData::I64(v) => std::mem::size_of_val(v.as_slice()),
            TensorData::I32(v) => std::mem::size_of_val(v.as_slice()),
            TensorData::Bool(v) => v.len(),
            TensorData::String(v) => v.iter().map(String::len).sum(),
            TensorData::U8(v) => v.len(),
            TensorData::I8(v) => v.len(),
        }
    }

    /// Whether the elements are one-byte integers (uint8, int8), which only the kernels that
    /// take bytes see as such; the rest see them widened ([`HostTensor::widened`]).
    pub fn is_bytes(&self) -> bool {
        matches!(self, TensorData::U8(_) | TensorData::I8(_))
    }
}

/// An owned tensor in host memory, row-major.
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: TensorData,
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostTensor({} {:?})", self.dtype(), self.shape)
    }
}

/// Number of elements of a shape, or `None` when it overflows `usize`. A zero dim makes it 0
/// however large the others are (`[2^62, 4, 0]` is an empty tensor, not an overflow).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Row-major strides of a shape, in elements.
///
/// Saturating: a tensor with elements has strides below its element count, which fits in
/// memory; only a zero-element tensor can have a stride product that overflows (`[0, 2^62, 8]`),
/// and its strides never address anything.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
}

/// Reserves room for `len` elements of `T`, or says why it cannot: the one place the runtime
/// allocates a buffer whose size comes from a model or its inputs (a `ConstantOfShape` to 2^32
/// elements, a batch of 30 million micro-batches), so that running out of memory is an error
/// naming the size instead of an abort of the process (or of the program embedding pipecut).
pub(crate) fn try_with_capacity<T>(len: usize) -> Result<Vec<T>, String> {
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(len).map_err(|e| {
        let bytes = (len as u128) * std::mem::size_of::<T>() as u128;
        format!("cannot allocate {bytes} bytes for {len} elements ({e})")
    })?;
    Ok(buffer)
}

/// `len` copies of `value`, allocated fallibly (see [`try_with_capacity`]).
pub(crate) fn try_filled<T: Clone>(len: usize, value: T) -> Result<Vec<T>, String> {
    let mut buffer = try_with_capacity(len)?;
    buffer.resize(len, value);
    Ok(buffer)
}

/// A zeroed f32 buffer for an output of `dims`, allocated fallibly; refuses a product that
/// overflows (inputs with a zero dim can have huge others: `[2^40, 0] × [0, 2^40]`).
pub(crate) fn try_zeros_f32(dims: &[usize]) -> Result<Vec<f32>, String> {
    let len = checked_numel(dims)
        .ok_or_else(|| format!("an output of {dims:?} has more elements than fit in memory"))?;
    try_filled(len, 0.0)
}

/// Collects `len` items, allocated fallibly (see [`try_with_capacity`]); `items` yields `len`.
pub(crate) fn try_collect<T>(
    len: usize,
    items: impl IntoIterator<Item = T>,
) -> Result<Vec<T>, String> {
    let mut buffer = try_with_capacity(len)?;
    buffer.extend(items);
    Ok(buffer)
}

impl HostTensor {
    /// A tensor from a shape and data; refuses a data length that is not the shape's product.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<HostTensor, String> {
        let expected = checked_numel(&shape)
            .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
        if expected != data.len() {
            return Err(format!(
                "shape {shape:?} needs {expected} elements but {} were given",
                data.len()
            ));
        }
        Ok(HostTensor { shape, data })
    }

    /// A float tensor. Panics if the length does not match: for kernels whose output size is
    /// computed from the shape, where a mismatch is a bug, not bad input.
    pub(crate) fn f32(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
        debug_assert_eq!(checked_numel(&shape), Some(data.len()));
        HostTensor {
            shape,
            data: TensorData::F32(data),
        }
    }

    /// An int64 tensor (same contract as [`HostTensor::f32`]).
    pub(crate) fn i64(shape: Vec<usize>, data: Vec<i64>) -> HostTensor {
        debug_assert_eq!(checked_numel(&shape), Some(data.len()));
        HostTensor {
            shape,
            data: TensorData::I64(data),
        }
    }

    /// A tensor with the same shape contract, any data.
    pub(crate) fn with_data(shape: Vec<usize>, data: TensorData) -> HostTensor {
        debug_assert_eq!(checked_numel(&shape), Some(data.len()));
        HostTensor { shape, data }
    }

    /// A float tensor from fp16 values, widened to fp32.
    pub fn from_f16(shape: Vec<usize>, values: &[half::f16]) -> Result<HostTensor, String> {
        HostTensor::new(
            shape,
            TensorData::F32(values.iter().map(|v| v.to_f32()).collect()),
        )
    }

    /// A float tensor from bf16 values, widened to fp32.
    pub fn from_bf16(shape: Vec<usize>, values: &[half::bf16]) -> Result<HostTensor, String> {
        HostTensor::new(
            shape,
            TensorData::F32(values.iter().map(|v| v.to_f32()).collect()),
        )
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The elements.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// Consumes the tensor into its shape and data.
    pub fn into_parts(self) -> (Vec<usize>, TensorData) {
        (self.shape, self.data)
    }

    /// The float elements, or an error naming the actual type.
    pub fn as_f32(&self) -> Result<&[f32], String> {
        match &self.data {
            TensorData::F32(v) => Ok(v),
            other => Err(format!("expected a float32 tensor, got {}", other.dtype())),
        }
    }

    /// The same tensor with another shape of equal element count.
    pub fn reshaped(mut self, shape: Vec<usize>) -> Result<HostTensor, String> {
        if checked_numel(&shape) != Some(self.len()) {
            return Err(format!(
                "cannot view {} elements as shape {shape:?}",
                self.len()
            ));
        }
        self.shape = shape;
        Ok(self)
    }

    /// Every element as f32 (integers converted, booleans 0/1, strings parsed as `Cast` from
    /// string does: `"1e-3"`, `"inf"`, `"NaN"`; text that is no number gives NaN).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::F32(v) => v.clone(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f32).collect(),
            TensorData::String(v) => v
                .iter()
                .map(|s| s.trim().parse().unwrap_or(f32::NAN))
                .collect(),
            TensorData::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
            TensorData::I8(v) => v.iter().map(|&x| f32::from(x)).collect(),
        }
    }

    /// The elements as f32: borrowed from a float tensor, converted as [`Self::to_f32_vec`]
    /// from any other. A kernel that only reads its weights copies nothing this way.
    pub fn f32_cow(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.data {
            TensorData::F32(v) => std::borrow::Cow::Borrowed(v),
            _ => std::borrow::Cow::Owned(self.to_f32_vec()),
        }
    }

    /// Every element as i64 (floats truncated toward zero, as `Cast` does; strings parsed as
    /// integers, else as floats and truncated, text that is no number giving 0).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match &self.data {
            TensorData::F32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I64(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            TensorData::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            TensorData::String(v) => v
                .iter()
                .map(|s| {
                    let s = s.trim();
                    s.parse()
                        .unwrap_or_else(|_| s.parse::<f64>().map_or(0, |x| x as i64))
                })
                .collect(),
        }
    }

    /// The strings of a string tensor, or an error naming the actual type.
    pub fn as_strings(&self) -> Result<&[String], String> {
        match &self.data {
            TensorData::String(v) => Ok(v),
            other => Err(format!("expected a string tensor, got {}", other.dtype())),
        }
    }

    /// Every element as text, for `Cast` to string: numbers as Rust prints them (shortest
    /// form that reads back the same), booleans as `true`/`false`.
    fn to_string_vec(&self) -> Vec<String> {
        match &self.data {
            TensorData::F32(v) => v.iter().map(f32::to_string).collect(),
            TensorData::I64(v) => v.iter().map(i64::to_string).collect(),
            TensorData::I32(v) => v.iter().map(i32::to_string).collect(),
            TensorData::Bool(v) => v.iter().map(bool::to_string).collect(),
            TensorData::String(v) => v.clone(),
            TensorData::U8(v) => v.iter().map(u8::to_string).collect(),
            TensorData::I8(v) => v.iter().map(i8::to_string).collect(),
        }
    }

    /// The tensor as a kernel without a byte path sees it: uint8 and int8 widened to int64
    /// (exact), anything else borrowed as it is.
    pub(crate) fn widened(&self) -> Result<std::borrow::Cow<'_, HostTensor>, String> {
        use std::borrow::Cow;
        let wide = match &self.data {
            TensorData::U8(v) => try_collect(v.len(), v.iter().map(|&x| i64::from(x)))?,
            TensorData::I8(v) => try_collect(v.len(), v.iter().map(|&x| i64::from(x)))?,
            _ => return Ok(Cow::Borrowed(self)),
        };
        Ok(Cow::Owned(HostTensor::i64(self.shape.clone(), wide)))
    }

    /// The contents as a plan-time value, for a sample input given to shape inference
    /// ([`pipecut_ir::onnx::shape::ShapeInference::with_input_values`]): floats as floats, integers
    /// and booleans as integers.
    pub fn to_const_value(&self) -> ConstValue {
        match &self.data {
            TensorData::F32(v) => ConstValue::Floats(v.iter().map(|&x| f64::from(x)).collect()),
            TensorData::String(v) => ConstValue::Strings(v.clone()),
            _ => ConstValue::Ints(self.to_i64_vec().into_iter().map(SymInt::Lit).collect()),
        }
    }

    /// The tensor converted to `dtype` with ONNX `Cast` semantics. Float targets other than
    /// float32 compute as float32 (see the module doc); narrow integer targets as int64.
    pub fn cast(&self, dtype: DType) -> Result<HostTensor, String> {
        self.cast_saturating(dtype, true)
    }

    /// [`Self::cast`] with ONNX Cast's `saturate` for float8 targets: a narrow float target
    /// rounds each value to one the format holds (kept as f32), int4/uint4 wrap (kept as i64);
    /// see [`super::narrow`].
    pub fn cast_saturating(&self, dtype: DType, saturate: bool) -> Result<HostTensor, String> {
        use super::narrow::{
            float_to_narrow_int, is_narrow_float, narrow_int, round_float, wrap_int,
        };
        let data = match dtype {
            DType::F32 | DType::F64 => TensorData::F32(self.to_f32_vec()),
            narrow if is_narrow_float(narrow) => TensorData::F32(
                self.to_f32_vec()
                    .into_iter()
                    .map(|x| round_float(narrow, x, saturate))
                    .collect(),
            ),
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                let (bits, signed) = narrow_int(dtype).expect("a narrow integer type");
                let wrapped: Vec<i64> = match &self.data {
                    TensorData::F32(v) => v
                        .iter()
                        .map(|&x| float_to_narrow_int(x, bits, signed))
                        .collect(),
                    _ => self
                        .to_i64_vec()
                        .into_iter()
                        .map(|x| wrap_int(x, bits, signed))
                        .collect(),
                };
                // Wrapped into the type's range just above: the byte holds it exactly.
                match signed {
                    true => TensorData::I8(wrapped.into_iter().map(|x| x as i8).collect()),
                    false => TensorData::U8(wrapped.into_iter().map(|x| x as u8).collect()),
                }
            }
            // Float to integer truncates toward zero, then wraps to the width as C does
            // (numpy and onnxruntime agree for values in range; out of range is undefined).
            DType::U8 => TensorData::U8(self.to_i64_vec().into_iter().map(|x| x as u8).collect()),
            DType::I8 => TensorData::I8(self.to_i64_vec().into_iter().map(|x| x as i8).collect()),
            DType::I64 | DType::I16 | DType::U16 | DType::U32 => TensorData::I64(self.to_i64_vec()),
            // Kept in int64 storage bit for bit: a float above i64::MAX keeps its bits.
            DType::U64 => TensorData::I64(match &self.data {
                TensorData::F32(v) => v.iter().map(|&x| x as u64 as i64).collect(),
                _ => self.to_i64_vec(),
            }),
            DType::I32 => {
                TensorData::I32(self.to_i64_vec().into_iter().map(|x| x as i32).collect())
            }
            DType::Bool => TensorData::Bool(match &self.data {
                TensorData::F32(v) => v.iter().map(|&x| x != 0.0).collect(),
                TensorData::Bool(v) => v.clone(),
                _ => self.to_i64_vec().into_iter().map(|x| x != 0).collect(),
            }),
            DType::String => TensorData::String(self.to_string_vec()),
            other => {
                return Err(format!(
                    "cannot cast to {other}: the CPU runtime has no such type"
                ))
            }
        };
        Ok(HostTensor {
            shape: self.shape.clone(),
            data,
        })
    }

    /// Rows `start..start + count` along axis 0 (a micro-batch of a batch).
    pub fn slice_axis0(&self, start: usize, count: usize) -> Result<HostTensor, String> {
        let rows = *self
            .shape
            .first()
            .ok_or("a scalar has no axis 0 to split")?;
        if start.checked_add(count).is_none_or(|end| end > rows) {
            return Err(format!(
                "rows {start}..{} are outside axis 0 of size {rows}",
                start.saturating_add(count)
            ));
        }
        let row = self.shape[1..].iter().product::<usize>();
        let range = start * row..(start + count) * row;
        let len = range.len();
        let data = match &self.data {
            TensorData::F32(v) => TensorData::F32(try_collect(len, v[range].iter().copied())?),
            TensorData::I64(v) => TensorData::I64(try_collect(len, v[range].iter().copied())?),
            TensorData::I32(v) => TensorData::I32(try_collect(len, v[range].iter().copied())?),
            TensorData::Bool(v) => TensorData::Bool(try_collect(len, v[range].iter().copied())?),
            TensorData::String(v) => {
                TensorData::String(try_collect(len, v[range].iter().cloned())?)
            }
            TensorData::U8(v) => TensorData::U8(try_collect(len, v[range].iter().copied())?),
            TensorData::I8(v) => TensorData::I8(try_collect(len, v[range].iter().copied())?),
        };
        let mut shape = self.shape.clone();
        shape[0] = count;
        Ok(HostTensor { shape, data })
    }

    /// Joins tensors of one dtype along axis 0 (micro-batch outputs back into a batch).
    pub fn concat_axis0(parts: &[&HostTensor]) -> Result<HostTensor, String> {
        let first = parts.first().ok_or("nothing to concatenate")?;
        if first.rank() == 0 {
            return Err("a scalar has no axis 0 to join along".into());
        }
        let mut rows = 0;
        for p in parts {
            if p.dtype() != first.dtype() || p.shape[1..] != first.shape[1..] {
                return Err(format!(
                    "cannot join {} {:?} with {} {:?} along axis 0",
                    first.dtype(),
                    first.shape,
                    p.dtype(),
                    p.shape
                ));
            }
            rows = usize::checked_add(rows, p.shape[0])
                .ok_or("the joined tensor has more rows than fit in memory")?;
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        macro_rules! join {
            ($variant:ident) => {{
                let mut out = try_with_capacity(parts.iter().map(|p| p.len()).sum())?;
                for p in parts {
                    if let TensorData::$variant(v) = &p.data {
                        out.extend_from_slice(v);
                    }
                }
                TensorData::$variant(out)
            }};
        }
        let data = match first.data {
            TensorData::F32(_) => join!(F32),
            TensorData::I64(_) => join!(I64),
            TensorData::I32(_) => join!(I32),
            TensorData::Bool(_) => join!(Bool),
            TensorData::String(_) => join!(String),
            TensorData::U8(_) => join!(U8),
            TensorData::I8(_) => join!(I8),
        };
        Ok(HostTensor { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`held_bytes`] counts (the wire bound between ranks) is what a tensor cast to each
    /// numeric dtype really holds, so the bound and the runtime cannot disagree.
    #[test]
    fn held_bytes_are_what_a_cast_tensor_holds() {
        let three = HostTensor::f32(vec![3], vec![0.5, -2.0, 7.0]);
        let mut checked = 0;
        // Strings hold their UTF-8, whatever their count.
        let numeric = (0..64)
            .filter_map(DType::from_onnx)
            .filter(|&d| d != DType::String);
        for dtype in numeric {
            let Ok(cast) = three.cast(dtype) else {
                continue; // complex numbers: not held
            };
            assert_eq!(
                held_bytes(dtype, 3),
                Some(cast.data().byte_size() as u64),
                "{dtype}"
            );
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} dtypes cast");
        assert_eq!(held_bytes(DType::I16, 3), Some(24));
        assert_eq!(held_bytes(DType::F8E4M3FN, 3), Some(12));
    }

    #[test]
    fn new_refuses_a_length_that_does_not_match_the_shape() {
        let err = HostTensor::new(vec![2, 3], TensorData::F32(vec![0.0; 5])).unwrap_err();
        assert!(err.contains("needs 6 elements"), "{err}");
    }

    #[test]
    fn split_and_join_along_axis0_round_trip() {
        let t = HostTensor::i64(vec![3, 2], vec![1, 2, 3, 4, 5, 6]);
        let a = t.slice_axis0(0, 1).unwrap();
        let b = t.slice_axis0(1, 2).unwrap();
        assert_eq!(b.to_i64_vec(), vec![3, 4, 5, 6]);
        assert_eq!(HostTensor::concat_axis0(&[&a, &b]).unwrap(), t);
        assert!(t.slice_axis0(2, 2).is_err());
    }

    #[test]
    fn cast_follows_onnx_semantics() {
        let t = HostTensor::f32(vec![3], vec![-1.7, 0.0, 2.9]);
        assert_eq!(t.cast(DType::I64).unwrap().to_i64_vec(), vec![-1, 0, 2]);
        assert_eq!(
            t.cast(DType::Bool).unwrap().data(),
            &TensorData::Bool(vec![true, false, true])
        );
        let h = HostTensor::from_f16(vec![2], &[half::f16::from_f32(0.5), half::f16::ONE]).unwrap();
        assert_eq!(h.as_f32().unwrap(), &[0.5, 1.0]);
    }
}
