//! Elementwise ops: unary activations, broadcasting arithmetic and comparisons, `Where`, casts
//! and quantisation. Output shapes follow the inputs (with numpy broadcasting,
//! <https://onnx.ai/onnx/repo-docs/Broadcasting.html>); small integer values are folded so that
//! shape arithmetic (`Mul(batch, seq)`) stays known. Rules cover opsets 7–23.

use super::context::{broadcast, fold_broadcast, same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{ConstValue, DType, Dim, SymInt};

// Reads better whole: one flat table from op names to rules (rustfmt sets each name on a line
// of its own), read top to bottom like the spec's operator list.
pub(super) fn register(r: &mut Registry) {
    // https://onnx.ai/onnx/operators/ — each of these keeps the input's type and shape.
    r.add(
        "",
        &[
            "Acos",
            "Acosh",
            "Asin",
            "Asinh",
            "Atan",
            "Atanh",
            "Cos",
            "Cosh",
            "Sin",
            "Sinh",
            "Tan",
            "Tanh",
            "Elu",
            "Erf",
            "Exp",
            "Gelu",
            "HardSigmoid",
            "HardSwish",
            "LeakyRelu",
            "Log",
            "Mish",
            "Round",
            "Selu",
            "Sigmoid",
            "Sign",
            "Softplus",
            "Softsign",
            "ThresholdedRelu",
            "Celu",
            "Shrink",
            "Softmax",
            "LogSoftmax",
            "Hardmax",
            "LRN",
            "CumSum",
            "CumProd",
            // SwiGLU (opset 28): A and B of one shape, the output A's.
            "SwiGLU",
            "BitwiseNot",
            "MeanVarianceNormalization",
            "Trilu",
            "Clip",
            "ReverseSequence",
            "Swish",
        ],
        unary,
    );
    r.add(
        "",
        &[
            "Identity",
            "Relu",
            "Neg",
            "Abs",
            "Sqrt",
            "Floor",
            "Ceil",
            "Reciprocal",
        ],
        unary_folding,
    );
    r.add("", &["Dropout"], dropout);
    r.add("", &["Not"], not);
    r.add("", &["IsNaN", "IsInf"], to_bool);
    r.add("", &["Cast"], cast);
    r.add("", &["CastLike"], cast_like);
    r.add("", &["BitCast"], bit_cast);
    r.add(
        "",
        &[
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Mod",
            "Min",
            "Max",
            "Sum",
            "Mean",
            "BitwiseAnd",
            "BitwiseOr",
            "BitwiseXor",
            "BitShift",
            "PRelu",
        ],
        arithmetic,
    );
    r.add(
        "",
        &[
            "Equal",
            "Less",
            "Greater",
            "LessOrEqual",
            "GreaterOrEqual",
            "And",
            "Or",
            "Xor",
        ],
        comparison,
    );
    r.add("", &["Where"], where_);
    r.add("", &["QuantizeLinear", "DynamicQuantizeLinear"], quantize);
    r.add("", &["DequantizeLinear"], dequantize);
}

fn unary(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

fn unary_folding(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    if ctx.node.op_type == "Identity" && !input.kind.is_tensor() {
        let shape = input.known_shape().cloned();
        return Ok(vec![Inferred::of_kind(input.kind, input.dtype, shape)]);
    }
    let value = input
        .value
        .and_then(|v| match (ctx.node.op_type.as_str(), v) {
            ("Identity", v) => Some(v.clone()),
            ("Neg", ConstValue::Ints(v)) => v
                .iter()
                .map(|x| x.lit().and_then(i64::checked_neg).map(SymInt::Lit))
                .collect::<Option<_>>()
                .map(ConstValue::Ints),
            // A Range expanded to a Loop computes its trip count as Relu(Ceil(...)).
            ("Relu", ConstValue::Ints(v)) => v
                .iter()
                .map(|x| x.lit().map(|i| SymInt::Lit(i.max(0))))
                .collect::<Option<_>>()
                .map(ConstValue::Ints),
            ("Abs", ConstValue::Ints(v)) => v
                .iter()
                .map(|x| match x {
                    SymInt::Lit(i) => i.checked_abs().map(SymInt::Lit),
                    sym => Some(sym.clone()),
                })
                .collect::<Option<_>>()
                .map(ConstValue::Ints),
            (op, ConstValue::Floats(v)) => {
                let f: fn(f64) -> f64 = match op {
                    "Neg" => |x| -x,
                    "Abs" => f64::abs,
                    "Sqrt" => f64::sqrt,
                    "Floor" => f64::floor,
                    "Ceil" => f64::ceil,
                    "Relu" => |x: f64| if x > 0.0 { x } else { 0.0 },
                    "Reciprocal" => |x| 1.0 / x,
                    _ => return None,
                };
                Some(ConstValue::Floats(v.iter().map(|&x| f(x)).collect()))
            }
            _ => None,
        });
    Ok(vec![
        Inferred::new(input.dtype, input.shape.clone()).with_value(value)
    ])
}

/// Dropout: `output` like the input, optional `mask` of bools (opset 12+; earlier masks were
/// the input's type, but no exported model reads a mask).
fn dropout(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    Ok(vec![
        Inferred::new(input.dtype, input.shape.clone()).with_value(input.value.cloned()),
        Inferred::new(DType::Bool, input.shape.clone()),
    ])
}

fn not(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let value = match input.value {
        Some(ConstValue::Ints(v)) => v
            .iter()
            .map(|x| x.lit().map(|b| SymInt::Lit((b == 0) as i64)))
            .collect::<Option<_>>()
            .map(ConstValue::Ints),
        _ => None,
    };
    Ok(vec![
        Inferred::new(DType::Bool, input.shape.clone()).with_value(value)
    ])
}

fn to_bool(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, DType::Bool)
}

/// Converts a known value to the representation of `to` (integers truncate toward zero); casts
/// to or from strings are not folded.
fn convert_value(value: Option<&ConstValue>, to: DType) -> Option<ConstValue> {
    let value = value?;
    if to == DType::String || matches!(value, ConstValue::Strings(_)) {
        return None;
    }
    if to == DType::Bool {
        return Some(ConstValue::Ints(match value {
            ConstValue::Ints(v) => v
                .iter()
                .map(|x| x.lit().map(|i| SymInt::Lit((i != 0) as i64)))
                .collect::<Option<_>>()?,
            ConstValue::Floats(v) => v.iter().map(|&x| SymInt::Lit((x != 0.0) as i64)).collect(),
            ConstValue::Strings(_) => return None,
        }));
    }
    if to.is_float() {
        return value.as_f64s().map(ConstValue::Floats);
    }
    match value {
        ConstValue::Ints(v) => Some(ConstValue::Ints(v.clone())),
        ConstValue::Floats(v) => Some(ConstValue::Ints(
            v.iter().map(|&x| SymInt::Lit(x as i64)).collect(),
        )),
        ConstValue::Strings(_) => None,
    }
}

fn cast(ctx: &OpCtx) -> RuleResult {
    let to = ctx.int_attr("to")?.ok_or("attribute 'to' is missing")?;
    let to =
        DType::from_onnx(to as i32).ok_or_else(|| format!("'to' names unknown data type {to}"))?;
    let input = ctx.input(0)?;
    Ok(vec![
        Inferred::new(to, input.shape.clone()).with_value(convert_value(input.value, to))
    ])
}

/// BitCast (opset 26, <https://onnx.ai/onnx/operators/onnx__BitCast.html>): the input's bits
/// read as `to`, which must be exactly as wide (and neither a string).
fn bit_cast(ctx: &OpCtx) -> RuleResult {
    let to = ctx.int_attr("to")?.ok_or("attribute 'to' is missing")?;
    let to =
        DType::from_onnx(to as i32).ok_or_else(|| format!("'to' names unknown data type {to}"))?;
    let input = ctx.input(0)?;
    let from = ctx.dtype(0)?;
    if from == DType::String || to == DType::String {
        return Err("BitCast does not take or give strings".into());
    }
    if from.size_bits() != to.size_bits() {
        return Err(format!(
            "BitCast from {from} ({} bits) to {to} ({} bits): the widths must be equal",
            from.size_bits(),
            to.size_bits()
        ));
    }
    Ok(vec![Inferred::new(to, input.shape.clone())])
}

fn cast_like(ctx: &OpCtx) -> RuleResult {
    let to = ctx.dtype(1)?;
    let input = ctx.input(0)?;
    Ok(vec![
        Inferred::new(to, input.shape.clone()).with_value(convert_value(input.value, to))
    ])
}

fn int_op(op: &str, a: &SymInt, b: &SymInt) -> Option<SymInt> {
    use SymInt::{Lit, Sym};
    let as_dim = |d: Dim| -> SymInt { SymInt::from(&d) };
    match (op, a, b) {
        ("Add" | "Sum", Lit(x), Lit(y)) => x.checked_add(*y).map(Lit),
        ("Add" | "Sum", s @ Sym(_), Lit(0)) | ("Add" | "Sum", Lit(0), s @ Sym(_)) => {
            Some(s.clone())
        }
        ("Sub", Lit(x), Lit(y)) => x.checked_sub(*y).map(Lit),
        ("Sub", s @ Sym(_), Lit(0)) => Some(s.clone()),
        ("Sub", Sym(x), Sym(y)) if x == y => Some(Lit(0)),
        ("Mul", Lit(x), Lit(y)) => x.checked_mul(*y).map(Lit),
        ("Mul", _, _) => a.to_dim()?.checked_mul(&b.to_dim()?).map(as_dim),
        // ONNX integer Div truncates toward zero, as C does.
        ("Div", Lit(x), Lit(y)) => x.checked_div(*y).map(Lit),
        ("Div", _, _) => a.to_dim()?.exact_div(&b.to_dim()?).map(as_dim),
        ("Mod", Lit(x), Lit(y)) if *y != 0 => Some(Lit(x.rem_euclid(*y))),
        ("Min", Lit(x), Lit(y)) => Some(Lit(*x.min(y))),
        ("Max", Lit(x), Lit(y)) => Some(Lit(*x.max(y))),
        ("Pow", Lit(x), Lit(y)) => u32::try_from(*y)
            .ok()
            .and_then(|e| x.checked_pow(e))
            .map(Lit),
        _ => None,
    }
}

fn float_op(op: &str, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        "Add" | "Sum" => a + b,
        "Sub" => a - b,
        "Mul" => a * b,
        "Div" => a / b,
        "Pow" => a.powf(b),
        "Min" => a.min(b),
        "Max" => a.max(b),
        _ => return None,
    })
}

/// Folds a variadic op left to right over broadcast values.
fn fold_values(
    ctx: &OpCtx,
    out_shape: &crate::graph::Shape,
    f_int: impl Fn(&SymInt, &SymInt) -> Option<SymInt>,
    f_float: impl Fn(f64, f64) -> Option<f64>,
) -> Option<ConstValue> {
    let inputs: Vec<_> = (0..ctx.input_count())
        .map(|i| ctx.opt_input(i))
        .collect::<Option<_>>()?;
    let values: Vec<&ConstValue> = inputs.iter().map(|i| i.value).collect::<Option<_>>()?;
    if values.iter().all(|v| matches!(v, ConstValue::Ints(_))) {
        let ints: Vec<(&crate::graph::Shape, &[SymInt])> = inputs
            .iter()
            .zip(&values)
            .map(|(i, v)| match v {
                ConstValue::Ints(x) => (i.shape, x.as_slice()),
                ConstValue::Floats(_) | ConstValue::Strings(_) => {
                    unreachable!("checked all are Ints")
                }
            })
            .collect();
        let folded = fold_broadcast(&ints, out_shape, |args| {
            let mut acc = args[0].clone();
            for x in &args[1..] {
                acc = f_int(&acc, x)?;
            }
            Some(acc)
        })?;
        return Some(ConstValue::Ints(folded));
    }
    let floats: Vec<Vec<f64>> = values.iter().map(|v| v.as_f64s()).collect::<Option<_>>()?;
    let pairs: Vec<(&crate::graph::Shape, &[f64])> = inputs
        .iter()
        .zip(&floats)
        .map(|(i, v)| (i.shape, v.as_slice()))
        .collect();
    fold_broadcast(&pairs, out_shape, |args| {
        let mut acc = *args[0];
        for x in &args[1..] {
            acc = f_float(acc, **x)?;
        }
        Some(acc)
    })
    .map(ConstValue::Floats)
}

fn input_shapes<'a>(ctx: &'a OpCtx) -> Result<Vec<&'a crate::graph::Shape>, String> {
    (0..ctx.input_count()).map(|i| ctx.shape(i)).collect()
}

fn arithmetic(ctx: &OpCtx) -> RuleResult {
    let op = ctx.node.op_type.as_str();
    let shapes = input_shapes(ctx)?;
    if shapes.is_empty() {
        return Err("the op needs at least one input".into());
    }
    let shape = broadcast(&shapes, ctx, 0)?;
    let dtype = ctx.dtype(0)?;
    let value = match op {
        "Mean" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "BitShift" | "PRelu" => None,
        _ => fold_values(
            ctx,
            &shape,
            |a, b| int_op(op, a, b),
            |a, b| float_op(op, a, b),
        ),
    };
    Ok(vec![Inferred::new(dtype, shape).with_value(value)])
}

fn comparison(ctx: &OpCtx) -> RuleResult {
    let op = ctx.node.op_type.as_str();
    let shapes = input_shapes(ctx)?;
    if shapes.len() != 2 {
        return Err(format!("{op} takes 2 inputs, got {}", shapes.len()));
    }
    let shape = broadcast(&shapes, ctx, 0)?;
    let truth = |b: bool| b as i64;
    let value = fold_values(
        ctx,
        &shape,
        |a, b| {
            let r = match (op, a, b) {
                ("Equal", x, y) if x == y => 1,
                ("Equal", SymInt::Lit(x), SymInt::Lit(y)) => truth(x == y),
                ("Less", SymInt::Lit(x), SymInt::Lit(y)) => truth(x < y),
                ("Greater", SymInt::Lit(x), SymInt::Lit(y)) => truth(x > y),
                ("LessOrEqual", SymInt::Lit(x), SymInt::Lit(y)) => truth(x <= y),
                ("GreaterOrEqual", SymInt::Lit(x), SymInt::Lit(y)) => truth(x >= y),
                ("And", SymInt::Lit(x), SymInt::Lit(y)) => truth(*x != 0 && *y != 0),
                ("Or", SymInt::Lit(x), SymInt::Lit(y)) => truth(*x != 0 || *y != 0),
                ("Xor", SymInt::Lit(x), SymInt::Lit(y)) => truth((*x != 0) != (*y != 0)),
                _ => return None,
            };
            Some(SymInt::Lit(r))
        },
        |a, b| {
            let r = match op {
                "Equal" => a == b,
                "Less" => a < b,
                "Greater" => a > b,
                "LessOrEqual" => a <= b,
                "GreaterOrEqual" => a >= b,
                _ => return None,
            };
            Some(r as i64 as f64)
        },
    );
    // Comparisons of floats fold to 0.0/1.0; bools are stored as integers.
    let value = value.map(|v| match v {
        ConstValue::Floats(f) => {
            ConstValue::Ints(f.into_iter().map(|x| SymInt::Lit(x as i64)).collect())
        }
        ints => ints,
    });
    Ok(vec![Inferred::new(DType::Bool, shape).with_value(value)])
}

fn where_(ctx: &OpCtx) -> RuleResult {
    let shapes = input_shapes(ctx)?;
    if shapes.len() != 3 {
        return Err(format!("Where takes 3 inputs, got {}", shapes.len()));
    }
    let shape = broadcast(&shapes, ctx, 0)?;
    let dtype = ctx.dtype(1)?;
    let value = (|| {
        let cond = ctx.sym_ints(0)?;
        let (x, y) = (ctx.input(1).ok()?, ctx.input(2).ok()?);
        match (x.value?, y.value?) {
            (ConstValue::Ints(xv), ConstValue::Ints(yv)) => fold_broadcast(
                &[
                    (shapes[0], cond),
                    (shapes[1], xv.as_slice()),
                    (shapes[2], yv.as_slice()),
                ],
                &shape,
                |args| match args[0] {
                    SymInt::Lit(0) => Some(args[2].clone()),
                    SymInt::Lit(_) => Some(args[1].clone()),
                    SymInt::Sym(_) => None,
                },
            )
            .map(ConstValue::Ints),
            (xv, yv) => {
                let (xf, yf) = (xv.as_f64s()?, yv.as_f64s()?);
                let c: Vec<f64> = cond
                    .iter()
                    .map(|c| c.lit().map(|v| v as f64))
                    .collect::<Option<_>>()?;
                fold_broadcast(
                    &[
                        (shapes[0], c.as_slice()),
                        (shapes[1], xf.as_slice()),
                        (shapes[2], yf.as_slice()),
                    ],
                    &shape,
                    |a| Some(if *a[0] != 0.0 { *a[1] } else { *a[2] }),
                )
                .map(ConstValue::Floats)
            }
        }
    })();
    Ok(vec![Inferred::new(dtype, shape).with_value(value)])
}

/// QuantizeLinear: the output takes the zero point's type (uint8 when absent, or
/// `output_dtype` from opset 21). DynamicQuantizeLinear adds scalar scale and zero point.
fn quantize(ctx: &OpCtx) -> RuleResult {
    let shape = ctx.shape(0)?.clone();
    if ctx.node.op_type == "DynamicQuantizeLinear" {
        return Ok(vec![
            Inferred::new(DType::U8, shape),
            Inferred::new(DType::F32, vec![]),
            Inferred::new(DType::U8, vec![]),
        ]);
    }
    let dtype = match (ctx.opt_input(2), ctx.int_attr("output_dtype")?) {
        (Some(zp), _) => zp.dtype,
        (None, Some(code)) if code != 0 => {
            DType::from_onnx(code as i32).ok_or("unknown output_dtype")?
        }
        _ => DType::U8,
    };
    Ok(vec![Inferred::new(dtype, shape)])
}

fn dequantize(ctx: &OpCtx) -> RuleResult {
    let dtype = match ctx.int_attr("output_dtype")? {
        Some(code) if code != 0 => DType::from_onnx(code as i32).ok_or("unknown output_dtype")?,
        _ => ctx.dtype(1)?,
    };
    same_shape(ctx, dtype)
}
