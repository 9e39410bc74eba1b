//! Element-wise ops with numpy broadcasting: arithmetic, comparison, logic, `Where`, unary math
//! and `Cast`.
//!
//! Specs: <https://onnx.ai/onnx/operators/> (Add, Sub, Mul, Div, Pow, Mod, Max, Min, Sum, Mean,
//! Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor, Not, Where, Neg, Abs, Sqrt,
//! Reciprocal, Exp, Log, Erf, Ceil, Floor, Round, trigonometric and hyperbolic functions, Sign, IsNaN,
//! IsInf, Identity, Dropout (inference), Cast, CastLike),
//! opsets 7 to 23. Mixed integer widths (which arise because the runtime widens narrow integers)
//! compute in int64; any float operand makes the op compute in float32.

use std::borrow::Cow;

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::zip_broadcast;
use crate::narrow::{round_e8m0, E8M0Rounding};
use crate::tensor::{try_collect, HostTensor, TensorData};
use pipecut_ir::graph::DType;

pub(super) fn register(t: &mut KernelTable) {
    t.add(
        &[
            "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean",
        ],
        arithmetic,
    );
    t.add(
        &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"],
        compare,
    );
    t.add(&["And", "Or", "Xor"], logic);
    t.add(&["Not"], not);
    t.add(&["Where"], where_op);
    t.add(
        &[
            "Neg",
            "Abs",
            "Sqrt",
            "Reciprocal",
            "Exp",
            "Log",
            "Erf",
            "Ceil",
            "Floor",
            "Round",
            "Sin",
            "Cos",
            "Sign",
            "Tan",
            "Atan",
            "Asin",
            "Acos",
            "Sinh",
            "Cosh",
            "Asinh",
            "Acosh",
            "Atanh",
        ],
        unary,
    );
    t.add(&["IsNaN"], is_nan);
    t.add(&["IsInf"], is_inf);
    // Dropout at inference is the identity (its optional mask output is all true).
    t.add(&["Identity", "Dropout"], identity);
    t.add(&["Cast"], cast);
    t.add(&["BitCast"], bit_cast);
    t.add(&["CastLike"], cast_like);
}

/// Converts both operands to a common type: float32 if either is float, else int64 when the
/// integer widths differ, else unchanged.
fn promote<'t>(
    a: &'t HostTensor,
    b: &'t HostTensor,
) -> Result<(Cow<'t, HostTensor>, Cow<'t, HostTensor>), String> {
    if a.dtype() == b.dtype() {
        return Ok((Cow::Borrowed(a), Cow::Borrowed(b)));
    }
    if a.dtype() == DType::String || b.dtype() == DType::String {
        return Err(format!("cannot combine {} with {}", a.dtype(), b.dtype()));
    }
    let target = if a.dtype() == DType::F32 || b.dtype() == DType::F32 {
        DType::F32
    } else {
        DType::I64
    };
    Ok((Cow::Owned(a.cast(target)?), Cow::Owned(b.cast(target)?)))
}

fn binary_arith(op: &str, a: &HostTensor, b: &HostTensor) -> Result<HostTensor, String> {
    let (a, b) = if a.dtype() == b.dtype() {
        (Cow::Borrowed(a), Cow::Borrowed(b))
    } else if op == "Pow" && a.dtype() == DType::F32 {
        // Pow allows an exponent of another type.
        (Cow::Borrowed(a), Cow::Owned(b.cast(DType::F32)?))
    } else if op == "Pow" {
        // An integer base keeps its type: the power in floating point, truncated (what
        // onnxruntime's std::pow then cast gives).
        let power = binary_arith(op, &a.cast(DType::F32)?, b)?;
        let truncated: Vec<f32> = power.to_f32_vec().iter().map(|v| v.trunc()).collect();
        return HostTensor::f32(power.shape().to_vec(), truncated).cast(a.dtype());
    } else {
        promote(a, b)?
    };
    let (sa, sb) = (a.shape(), b.shape());
    macro_rules! int_op {
        ($x:expr, $y:expr, $ty:ty, $variant:ident) => {{
            let f: fn($ty, $ty) -> Result<$ty, ()> = match op {
                "Add" | "Sum" | "Mean" => |x, y| Ok(x.wrapping_add(y)),
                "Sub" => |x, y| Ok(x.wrapping_sub(y)),
                "Mul" => |x, y| Ok(x.wrapping_mul(y)),
                "Div" => |x, y| x.checked_div(y).ok_or(()),
                // Mod with fmod=0 takes the divisor's sign (Python semantics).
                "Mod" => |x, y| {
                    x.checked_rem(y)
                        .map(|r| {
                            if r != 0 && ((r < 0) != (y < 0)) {
                                r + y
                            } else {
                                r
                            }
                        })
                        .ok_or(())
                },
                "FMod" => |x, y| x.checked_rem(y).ok_or(()),
                "Max" => |x, y| Ok(x.max(y)),
                "Min" => |x, y| Ok(x.min(y)),
                "Pow" => |x, y| Ok((x as f64).powf(y as f64) as $ty),
                _ => return Err(format!("{op} is not an arithmetic op")),
            };
            let (shape, data) = zip_broadcast($x, sa, $y, sb, f)?;
            let data: Result<Vec<$ty>, ()> = data.into_iter().collect();
            let data = data.map_err(|()| format!("{op}: integer division by zero"))?;
            HostTensor::with_data(shape, TensorData::$variant(data))
        }};
    }
    Ok(match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => {
            // One zip per op with its closure, not a function pointer: the closure inlines
            // into the loop, which the compiler then vectorises (a call per element does not).
            macro_rules! f32_op {
                ($f:expr) => {{
                    let (shape, data) = zip_broadcast(x, sa, y, sb, $f)?;
                    HostTensor::f32(shape, data)
                }};
            }
            match op {
                "Add" | "Sum" | "Mean" => f32_op!(|x: f32, y: f32| x + y),
                "Sub" => f32_op!(|x: f32, y: f32| x - y),
                "Mul" => f32_op!(|x: f32, y: f32| x * y),
                "Div" => f32_op!(|x: f32, y: f32| x / y),
                "Pow" => f32_op!(pow),
                "FMod" => f32_op!(|x: f32, y: f32| x % y),
                // fmod = 0 on floats (onnx 1.23's reference: numpy's mod) takes the divisor's
                // sign, as on integers.
                "Mod" => f32_op!(|x: f32, y: f32| {
                    let r = x % y;
                    if r != 0.0 && (r < 0.0) != (y < 0.0) {
                        r + y
                    } else {
                        r
                    }
                }),
                // NaN propagates, as onnxruntime does.
                "Max" => f32_op!(|x: f32, y: f32| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else {
                        x.max(y)
                    }
                }),
                "Min" => f32_op!(|x: f32, y: f32| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else {
                        x.min(y)
                    }
                }),
                _ => return Err(format!("{op} is not an arithmetic op")),
            }
        }
        (TensorData::I64(x), TensorData::I64(y)) => int_op!(x, y, i64, I64),
        (TensorData::I32(x), TensorData::I32(y)) => int_op!(x, y, i32, I32),
        _ => {
            return Err(format!(
                "{op} does not accept {} and {}",
                a.dtype(),
                b.dtype()
            ))
        }
    })
}

/// `x^y` with the special cases that matter for exported models exact: `x²` and `√x` are what
/// `Pow(x, 2)` and `Pow(x, 0.5)` mean in layer norms and variance computations.
fn pow(x: f32, y: f32) -> f32 {
    if y == 2.0 {
        x * x
    } else if y == 1.0 {
        x
    } else if y == 0.5 {
        x.sqrt()
    } else if y == 3.0 {
        x * x * x
    } else {
        x.powf(y)
    }
}

fn arithmetic(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let op = match ctx.node.op_type.as_str() {
        // fmod = 1: C's fmod, the remainder taking the dividend's sign (integers too).
        "Mod" if ctx.int("fmod", 0) != 0 => "FMod",
        op => op,
    };
    let mut acc = input(inputs, 0)?.clone();
    let count = inputs.len();
    for i in 1..count {
        acc = binary_arith(op, &acc, input(inputs, i)?)?;
    }
    if op == "Mean" && count > 1 {
        let scale = HostTensor::f32(vec![], vec![1.0 / count as f32]);
        acc = binary_arith("Mul", &acc, &scale)?;
    }
    Ok(vec![acc])
}

fn compare(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = promote(input(inputs, 0)?, input(inputs, 1)?)?;
    let op = ctx.node.op_type.as_str();
    macro_rules! cmp {
        ($x:expr, $y:expr) => {{
            match op {
                "Equal" => zip_broadcast($x, a.shape(), $y, b.shape(), |p, q| p == q)?,
                "Less" => zip_broadcast($x, a.shape(), $y, b.shape(), |p, q| p < q)?,
                "Greater" => zip_broadcast($x, a.shape(), $y, b.shape(), |p, q| p > q)?,
                "LessOrEqual" => zip_broadcast($x, a.shape(), $y, b.shape(), |p, q| p <= q)?,
                _ => zip_broadcast($x, a.shape(), $y, b.shape(), |p, q| p >= q)?,
            }
        }};
    }
    let (shape, data) = match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => cmp!(x, y),
        (TensorData::I64(x), TensorData::I64(y)) => cmp!(x, y),
        (TensorData::I32(x), TensorData::I32(y)) => cmp!(x, y),
        (TensorData::Bool(x), TensorData::Bool(y)) => cmp!(x, y),
        // Equal compares strings since opset 19; the order comparisons take numbers only.
        (TensorData::String(x), TensorData::String(y)) if op == "Equal" => {
            let x: Vec<&str> = x.iter().map(String::as_str).collect();
            let y: Vec<&str> = y.iter().map(String::as_str).collect();
            zip_broadcast(&x, a.shape(), &y, b.shape(), |p, q| p == q)?
        }
        _ => {
            return Err(format!(
                "{op} cannot compare {} with {}",
                a.dtype(),
                b.dtype()
            ))
        }
    };
    Ok(vec![HostTensor::with_data(shape, TensorData::Bool(data))])
}

fn bools(t: &HostTensor) -> Result<&[bool], String> {
    match t.data() {
        TensorData::Bool(v) => Ok(v),
        _ => Err(format!("expected a bool tensor, got {}", t.dtype())),
    }
}

fn logic(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let f: fn(bool, bool) -> bool = match ctx.node.op_type.as_str() {
        "And" => |x, y| x && y,
        "Or" => |x, y| x || y,
        _ => |x, y| x ^ y,
    };
    let (shape, data) = zip_broadcast(bools(a)?, a.shape(), bools(b)?, b.shape(), f)?;
    Ok(vec![HostTensor::with_data(shape, TensorData::Bool(data))])
}

fn not(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let data = bools(a)?.iter().map(|x| !x).collect();
    Ok(vec![HostTensor::with_data(
        a.shape().to_vec(),
        TensorData::Bool(data),
    )])
}

fn where_op(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let cond = input(inputs, 0)?;
    let (x, y) = promote(input(inputs, 1)?, input(inputs, 2)?)?;
    let c = bools(cond)?;
    let shape = super::indexing::broadcast_shapes(&[cond.shape(), x.shape(), y.shape()])?;
    let total = crate::tensor::checked_numel(&shape)
        .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
    let shapes = [cond.shape(), x.shape(), y.shape()];
    macro_rules! pick {
        ($a:expr, $b:expr, $variant:ident) => {{
            let mut out = crate::tensor::try_with_capacity(total)?;
            super::indexing::for_each_broadcast_row(
                shapes,
                &shape,
                |[ic, ix, iy], [sc, sx, sy], len| {
                    // Contiguous rows (a branch a scalar) as slice zips, which vectorise.
                    let pick =
                        |c: bool, a: &_, b: &_| if c { Clone::clone(a) } else { Clone::clone(b) };
                    let conds = &c[ic..];
                    match (sc, sx, sy) {
                        (1, 1, 1) => out.extend(
                            conds[..len]
                                .iter()
                                .zip(&$a[ix..ix + len])
                                .zip(&$b[iy..iy + len])
                                .map(|((&c, a), b)| pick(c, a, b)),
                        ),
                        (1, 1, 0) => out.extend(
                            conds[..len]
                                .iter()
                                .zip(&$a[ix..ix + len])
                                .map(|(&c, a)| pick(c, a, &$b[iy])),
                        ),
                        (1, 0, 1) => out.extend(
                            conds[..len]
                                .iter()
                                .zip(&$b[iy..iy + len])
                                .map(|(&c, b)| pick(c, &$a[ix], b)),
                        ),
                        _ => out.extend(
                            (0..len)
                                .map(|k| pick(conds[k * sc], &$a[ix + k * sx], &$b[iy + k * sy])),
                        ),
                    }
                },
            );
            TensorData::$variant(out)
        }};
    }
    let data = match (x.data(), y.data()) {
        (TensorData::F32(a), TensorData::F32(b)) => pick!(a, b, F32),
        (TensorData::I64(a), TensorData::I64(b)) => pick!(a, b, I64),
        (TensorData::I32(a), TensorData::I32(b)) => pick!(a, b, I32),
        (TensorData::Bool(a), TensorData::Bool(b)) => pick!(a, b, Bool),
        (TensorData::String(a), TensorData::String(b)) => pick!(a, b, String),
        (TensorData::U8(a), TensorData::U8(b)) => pick!(a, b, U8),
        (TensorData::I8(a), TensorData::I8(b)) => pick!(a, b, I8),
        _ => return Err("Where: branches of different types".into()),
    };
    Ok(vec![HostTensor::with_data(shape, data)])
}

fn unary(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let op = ctx.node.op_type.as_str();
    match a.data() {
        TensorData::F32(v) => {
            use super::fast_math::{self, map};
            // A closure per op (not one function pointer) so that the simple ones vectorise.
            let out = match op {
                "Neg" => map(v, |x| -x),
                "Abs" => map(v, f32::abs),
                "Sqrt" => map(v, f32::sqrt),
                "Reciprocal" => map(v, |x| 1.0 / x),
                "Exp" => map(v, fast_math::exp),
                "Log" => map(v, f32::ln),
                "Erf" => map(v, fast_math::erf),
                "Ceil" => map(v, f32::ceil),
                "Floor" => map(v, f32::floor),
                // Round half to even, as ONNX specifies.
                "Round" => map(v, f32::round_ties_even),
                "Sin" => map(v, f32::sin),
                "Cos" => map(v, f32::cos),
                "Tan" => map(v, f32::tan),
                "Atan" => map(v, f32::atan),
                "Asin" => map(v, f32::asin),
                "Acos" => map(v, f32::acos),
                "Sinh" => map(v, f32::sinh),
                "Cosh" => map(v, f32::cosh),
                "Asinh" => map(v, f32::asinh),
                "Acosh" => map(v, f32::acosh),
                "Atanh" => map(v, f32::atanh),
                _ => map(v, |x| {
                    if x > 0.0 {
                        1.0
                    } else if x < 0.0 {
                        -1.0
                    } else {
                        x
                    }
                }),
            };
            Ok(vec![HostTensor::f32(a.shape().to_vec(), out)])
        }
        TensorData::I64(_) | TensorData::I32(_) | TensorData::U8(_) | TensorData::I8(_) => {
            let v = a.to_i64_vec();
            let out: Vec<i64> = match op {
                "Neg" => v.iter().map(|x| x.wrapping_neg()).collect(),
                "Abs" => v.iter().map(|x| x.wrapping_abs()).collect(),
                "Sign" => v.iter().map(|x| x.signum()).collect(),
                "Ceil" | "Floor" | "Round" => v,
                _ => return Err(format!("{op} does not accept {}", a.dtype())),
            };
            HostTensor::i64(a.shape().to_vec(), out)
                .cast(a.dtype())
                .map(|t| vec![t])
        }
        TensorData::Bool(_) | TensorData::String(_) => {
            Err(format!("{op} does not accept {}", a.dtype()))
        }
    }
}

fn is_nan(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let data = a.as_f32()?.iter().map(|x| x.is_nan()).collect();
    Ok(vec![HostTensor::with_data(
        a.shape().to_vec(),
        TensorData::Bool(data),
    )])
}

fn is_inf(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let (pos, neg) = (
        ctx.int("detect_positive", 1) != 0,
        ctx.int("detect_negative", 1) != 0,
    );
    let data = a
        .as_f32()?
        .iter()
        .map(|x| x.is_infinite() && ((pos && *x > 0.0) || (neg && *x < 0.0)))
        .collect();
    Ok(vec![HostTensor::with_data(
        a.shape().to_vec(),
        TensorData::Bool(data),
    )])
}

fn identity(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?.clone();
    if ctx.node.op_type == "Dropout" {
        let mask = TensorData::Bool(vec![true; x.len()]);
        let mask = HostTensor::with_data(x.shape().to_vec(), mask);
        return Ok(vec![x, mask]);
    }
    Ok(vec![x])
}

fn cast(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let code = ctx.int("to", 0) as i32;
    let to = DType::from_onnx(code).ok_or_else(|| format!("unknown target type {code}"))?;
    let saturate = ctx.int("saturate", 1) != 0;
    let x = input(inputs, 0)?;
    if to == DType::F8E8M0 {
        let rounding = E8M0Rounding::parse(&ctx.string("round_mode", "up"))?;
        let values = x.to_f32_vec();
        let rounded = values
            .into_iter()
            .map(|v| round_e8m0(v, saturate, rounding));
        return Ok(vec![HostTensor::f32(
            x.shape().to_vec(),
            try_collect(x.len(), rounded)?,
        )]);
    }
    Ok(vec![x.cast_saturating(to, saturate)?])
}

/// BitCast (opset 26, <https://onnx.ai/onnx/operators/onnx__BitCast.html>): each element's bits,
/// in the type the graph declares for the input (the runtime holds float16 and float64 as f32,
/// narrow integers as int64), read as `to`. float64 bits survive only where the value fits f32.
fn bit_cast(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let code = ctx.int("to", 0) as i32;
    let to = DType::from_onnx(code).ok_or_else(|| format!("unknown target type {code}"))?;
    let x = input(inputs, 0)?;
    let from = ctx
        .input_dtypes
        .first()
        .copied()
        .flatten()
        .unwrap_or(x.dtype());
    let bits = element_bits(x, from)?;
    let data = from_bits(&bits, to)?;
    Ok(vec![HostTensor::with_data(x.shape().to_vec(), data)])
}

/// The bits of each element as `dtype` stores it, in the low bits of a u64.
fn element_bits(x: &HostTensor, dtype: DType) -> Result<Vec<u64>, String> {
    let floats = || x.to_f32_vec().into_iter();
    Ok(match dtype {
        DType::F32 => floats().map(|v| u64::from(v.to_bits())).collect(),
        DType::F16 => floats()
            .map(|v| u64::from(half::f16::from_f32(v).to_bits()))
            .collect(),
        DType::BF16 => floats()
            .map(|v| u64::from(half::bf16::from_f32(v).to_bits()))
            .collect(),
        DType::F64 => floats().map(|v| f64::from(v).to_bits()).collect(),
        DType::Bool
        | DType::I8
        | DType::U8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::U64 => {
            let mask = u64::MAX >> (64 - dtype.size_bits());
            x.to_i64_vec()
                .into_iter()
                .map(|v| v as u64 & mask)
                .collect()
        }
        other => {
            return Err(format!(
                "BitCast from {other} is not supported by the CPU runtime"
            ))
        }
    })
}

/// Elements of `dtype` from their bits, as the runtime holds that type.
fn from_bits(bits: &[u64], dtype: DType) -> Result<TensorData, String> {
    let width = dtype.size_bits() as u32;
    let signed = |b: u64| ((b << (64 - width)) as i64) >> (64 - width);
    Ok(match dtype {
        DType::F32 => TensorData::F32(bits.iter().map(|&b| f32::from_bits(b as u32)).collect()),
        DType::F16 => TensorData::F32(
            bits.iter()
                .map(|&b| half::f16::from_bits(b as u16).to_f32())
                .collect(),
        ),
        DType::BF16 => TensorData::F32(
            bits.iter()
                .map(|&b| half::bf16::from_bits(b as u16).to_f32())
                .collect(),
        ),
        DType::F64 => TensorData::F32(bits.iter().map(|&b| f64::from_bits(b) as f32).collect()),
        DType::Bool => TensorData::Bool(bits.iter().map(|&b| b != 0).collect()),
        DType::I32 => TensorData::I32(bits.iter().map(|&b| signed(b) as i32).collect()),
        DType::I8 => TensorData::I8(bits.iter().map(|&b| b as i8).collect()),
        DType::U8 => TensorData::U8(bits.iter().map(|&b| b as u8).collect()),
        DType::I16 | DType::I64 => TensorData::I64(bits.iter().map(|&b| signed(b)).collect()),
        DType::U16 | DType::U32 | DType::U64 => {
            TensorData::I64(bits.iter().map(|&b| b as i64).collect())
        }
        other => {
            return Err(format!(
                "BitCast to {other} is not supported by the CPU runtime"
            ))
        }
    })
}

/// CastLike casts to the declared type of its second input, which the graph knows even where
/// the runtime keeps it wider (a float8 tensor held as f32): the node's declared output type.
fn cast_like(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let to = match ctx.output_dtypes.first().copied().flatten() {
        Some(declared) => declared,
        None => input(inputs, 1)?.dtype(),
    };
    let saturate = ctx.int("saturate", 1) != 0;
    Ok(vec![input(inputs, 0)?.cast_saturating(to, saturate)?])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};
    use crate::tensor::TensorData;
    use pipecut_ir::graph::Attribute;

    #[test]
    fn add_broadcasts_rows_and_columns() {
        let out = run(
            "Add",
            vec![],
            &[&f(&[2, 1], &[1.0, 2.0]), &f(&[3], &[10.0, 20.0, 30.0])],
        );
        assert_close(&out[0], &[2, 3], &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    }

    #[test]
    fn integer_arithmetic_is_exact_and_division_by_zero_is_an_error() {
        let out = run("Mul", vec![], &[&i(&[2], &[3, -4]), &i(&[], &[5])]);
        assert_eq!(out[0].to_i64_vec(), vec![15, -20]);
        let out = run("Mod", vec![], &[&i(&[2], &[-7, 7]), &i(&[], &[3])]);
        assert_eq!(out[0].to_i64_vec(), vec![2, 1]);
        let node = super::super::test_util::node("Div", vec![]);
        let ctx = super::Ctx {
            node: &node,
            opset: 17,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let (a, b) = (i(&[1], &[1]), i(&[1], &[0]));
        assert!(super::arithmetic(&ctx, &[Some(&a), Some(&b)])
            .unwrap_err()
            .contains("by zero"));
    }

    #[test]
    fn pow_sqrt_erf_and_mean() {
        let out = run(
            "Pow",
            vec![],
            &[&f(&[3], &[-2.0, 3.0, 0.5]), &f(&[], &[2.0])],
        );
        assert_close(&out[0], &[3], &[4.0, 9.0, 0.25]);
        let out = run("Erf", vec![], &[&f(&[3], &[0.0, 0.5, -1.0])]);
        assert_close(&out[0], &[3], &[0.0, 0.520_499_9, -0.842_700_8]);
        let out = run(
            "Mean",
            vec![],
            &[&f(&[2], &[1.0, 2.0]), &f(&[2], &[3.0, 6.0])],
        );
        assert_close(&out[0], &[2], &[2.0, 4.0]);
    }

    #[test]
    fn integer_pow_keeps_its_type_and_fmod_keeps_the_dividends_sign() {
        let out = run("Pow", vec![], &[&i(&[2], &[3, 2]), &f(&[], &[2.5])]);
        // 3^2.5 = 15.59 and 2^2.5 = 5.66, truncated.
        assert_eq!(out[0].to_i64_vec(), vec![15, 5]);
        assert_eq!(out[0].dtype(), pipecut_ir::graph::DType::I64);
        let fmod = vec![("fmod", Attribute::Int(1))];
        let out = run("Mod", fmod, &[&i(&[2], &[-7, 7]), &i(&[], &[3])]);
        assert_eq!(out[0].to_i64_vec(), vec![-1, 1]);
    }

    #[test]
    fn where_selects_with_broadcast_condition() {
        let cond =
            crate::tensor::HostTensor::with_data(vec![2, 1], TensorData::Bool(vec![true, false]));
        let out = run(
            "Where",
            vec![],
            &[&cond, &f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), &f(&[], &[-1.0])],
        );
        assert_close(&out[0], &[2, 2], &[1.0, 2.0, -1.0, -1.0]);
    }

    #[test]
    fn compare_and_cast() {
        let out = run("Less", vec![], &[&i(&[3], &[1, 5, 3]), &i(&[], &[3])]);
        assert_eq!(out[0].data(), &TensorData::Bool(vec![true, false, false]));
        let out = run("Cast", vec![("to", Attribute::Int(1))], &[&out[0]]);
        assert_close(&out[0], &[3], &[1.0, 0.0, 0.0]);
        let out = run("Round", vec![], &[&f(&[4], &[0.5, 1.5, 2.5, -0.5])]);
        assert_close(&out[0], &[4], &[0.0, 2.0, 2.0, -0.0]);
    }

    #[test]
    fn strings_compare_select_and_cast() {
        let text = |shape: &[usize], v: &[&str]| {
            crate::HostTensor::new(
                shape.to_vec(),
                TensorData::String(v.iter().map(|s| s.to_string()).collect()),
            )
            .unwrap()
        };
        let out = run(
            "Equal",
            vec![],
            &[
                &text(&[2, 2], &["a", "b", "c", "a"]),
                &text(&[2], &["a", "b"]),
            ],
        );
        assert_eq!(
            out[0].data(),
            &TensorData::Bool(vec![true, true, false, false])
        );
        let condition =
            crate::HostTensor::new(vec![2], TensorData::Bool(vec![true, false])).unwrap();
        let out = run(
            "Where",
            vec![],
            &[&condition, &text(&[2], &["a", "b"]), &text(&[], &["z"])],
        );
        assert_eq!(out[0], text(&[2], &["a", "z"]));
        let parsed = run(
            "Cast",
            vec![("to", Attribute::Int(1))],
            &[&text(&[3], &["1.5", " -2", "inf"])],
        );
        assert_eq!(parsed[0].as_f32().unwrap(), &[1.5, -2.0, f32::INFINITY]);
        let printed = run("Cast", vec![("to", Attribute::Int(8))], &[&parsed[0]]);
        assert_eq!(printed[0], text(&[3], &["1.5", "-2", "inf"]));
    }
}
