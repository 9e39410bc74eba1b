//! The random generators: [Bernoulli](https://onnx.ai/onnx/operators/onnx__Bernoulli.html)
//! (opsets 15–22), [RandomUniform](https://onnx.ai/onnx/operators/onnx__RandomUniform.html) and
//! [RandomNormal](https://onnx.ai/onnx/operators/onnx__RandomNormal.html) (1–22, the `shape`
//! attribute), and their `…Like` forms (1–22, the input's shape). The element type is the
//! `dtype` attribute, else the input's (the `…Like` ops, Bernoulli), else float.

use super::context::{Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{DType, Dim};

pub(super) fn register(r: &mut Registry) {
    r.add(
        "",
        &["Bernoulli", "RandomUniformLike", "RandomNormalLike"],
        like_input,
    );
    r.add("", &["RandomUniform", "RandomNormal"], from_shape_attribute);
}

/// The `dtype` attribute, when present.
fn dtype_attr(ctx: &OpCtx) -> Result<Option<DType>, String> {
    match ctx.int_attr("dtype")? {
        Some(code) => DType::from_onnx(code as i32)
            .map(Some)
            .ok_or_else(|| format!("dtype {code} is not an ONNX type")),
        None => Ok(None),
    }
}

fn like_input(ctx: &OpCtx) -> RuleResult {
    let dtype = dtype_attr(ctx)?.unwrap_or(ctx.dtype(0)?);
    Ok(vec![Inferred::new(dtype, ctx.shape(0)?.clone())])
}

fn from_shape_attribute(ctx: &OpCtx) -> RuleResult {
    let shape = ctx
        .ints_attr("shape")?
        .ok_or("attribute 'shape' is required")?;
    let shape = shape
        .iter()
        .map(|&d| {
            u64::try_from(d)
                .map(Dim::Known)
                .map_err(|_| format!("shape {shape:?} has a negative dim"))
        })
        .collect::<Result<_, _>>()?;
    Ok(vec![Inferred::new(
        dtype_attr(ctx)?.unwrap_or(DType::F32),
        shape,
    )])
}
