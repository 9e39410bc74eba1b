//! Bitwise integer ops: BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot (opset 18) and BitShift
//! (opset 11), specs at <https://onnx.ai/onnx/operators/>.
//!
//! Narrow integers live widened in int64 (see [`crate::tensor`]), so a result is brought
//! back into the output type's range here: BitwiseNot of uint8 `0` is `255`, not `-1`, and a left
//! shift of a uint16 drops the bits shifted past bit 15. The type comes from shape inference
//! ([`Ctx::output_dtypes`]); unsigned 64-bit data has no runtime storage and is refused at load.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::zip_broadcast;
use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::DType;

pub(super) fn register(t: &mut KernelTable) {
    t.add(
        &["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift"],
        binary,
    );
    t.add(&["BitwiseNot"], not);
}

/// Wraps an int64 result into the two's-complement range of `dtype`.
fn wrap(value: i64, dtype: Option<DType>) -> i64 {
    match dtype {
        Some(DType::U8) => value as u8 as i64,
        Some(DType::I8) => value as i8 as i64,
        Some(DType::U16) => value as u16 as i64,
        Some(DType::I16) => value as i16 as i64,
        Some(DType::U32) => value as u32 as i64,
        Some(DType::I32) => value as i32 as i64,
        _ => value,
    }
}

fn output_tensor(shape: Vec<usize>, values: Vec<i64>, like: &HostTensor) -> HostTensor {
    let data = match like.data() {
        TensorData::I32(_) => TensorData::I32(values.into_iter().map(|v| v as i32).collect()),
        _ => TensorData::I64(values),
    };
    HostTensor::with_data(shape, data)
}

fn binary(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    if a.dtype().is_float() || b.dtype().is_float() || a.dtype() == DType::Bool {
        return Err(format!("bitwise ops take integers, got {}", a.dtype()));
    }
    let dtype = ctx.output_dtypes.first().copied().flatten();
    let bits = match dtype {
        Some(DType::U8 | DType::I8) => 8,
        Some(DType::U16 | DType::I16) => 16,
        Some(DType::U32 | DType::I32) => 32,
        _ => 64,
    };
    let signed = matches!(
        dtype,
        Some(DType::I8 | DType::I16 | DType::I32 | DType::I64)
    );
    let op = ctx.node.op_type.as_str();
    let left = ctx.string("direction", "") == "LEFT";
    if op == "BitShift" && !left && ctx.string("direction", "") != "RIGHT" {
        return Err("BitShift needs direction LEFT or RIGHT".into());
    }
    let (av, bv) = (a.to_i64_vec(), b.to_i64_vec());
    let (shape, values) = zip_broadcast(&av, a.shape(), &bv, b.shape(), |x, y| match op {
        "BitwiseAnd" => x & y,
        "BitwiseOr" => x | y,
        "BitwiseXor" => x ^ y,
        // A shift by a negative count or by the width or more clears every bit, except that a
        // right shift of a negative signed value keeps its sign bits (onnx 1.23's reference).
        _ if !(0..bits).contains(&y) => {
            if signed && !left && x < 0 {
                -1
            } else {
                0
            }
        }
        _ if left => wrap(((x as u64) << y) as i64, dtype),
        // Signed values shift arithmetically (they are sign-extended in int64).
        _ if signed => x >> y,
        _ => ((x as u64) >> y) as i64,
    })?;
    Ok(vec![output_tensor(shape, values, a)])
}

fn not(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.dtype().is_float() || x.dtype() == DType::Bool {
        return Err(format!("BitwiseNot takes integers, got {}", x.dtype()));
    }
    let dtype = ctx.output_dtypes.first().copied().flatten();
    let values = x.to_i64_vec().iter().map(|&v| wrap(!v, dtype)).collect();
    Ok(vec![output_tensor(x.shape().to_vec(), values, x)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{i, node};
    use super::super::{lookup, Ctx};
    use pipecut_ir::graph::{Attribute, DType};

    #[test]
    fn results_stay_in_the_narrow_type() {
        let n = node("BitwiseNot", vec![]);
        let dtypes = [Some(DType::U8)];
        let ctx = Ctx {
            node: &n,
            opset: 18,
            output_dtypes: &dtypes,
            input_dtypes: &[],
        };
        let x = i(&[2], &[0, 5]);
        let out = lookup("", "BitwiseNot").unwrap()(&ctx, &[Some(&x)]).unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![255, 250]);
        let n = node(
            "BitShift",
            vec![("direction", Attribute::String("LEFT".into()))],
        );
        let ctx = Ctx {
            node: &n,
            opset: 11,
            output_dtypes: &dtypes,
            input_dtypes: &[],
        };
        let shifts = i(&[2], &[1, 8]);
        let out =
            lookup("", "BitShift").unwrap()(&ctx, &[Some(&i(&[2], &[200, 1])), Some(&shifts)])
                .unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![144, 0]);
    }
}
