//! Shape rules of the `ai.onnx.ml` ops the ONNX node cases cover: LabelEncoder (opsets 1–4),
//! TreeEnsemble (opset 5), Binarizer and ArrayFeatureExtractor (opset 1).

use super::context::{same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{Attribute, DType, Dim};

pub(super) fn register(r: &mut Registry) {
    r.add("ai.onnx.ml", &["LabelEncoder"], label_encoder);
    r.add("ai.onnx.ml", &["TreeEnsemble"], tree_ensemble);
    r.add("ai.onnx.ml", &["Binarizer"], binarizer);
    r.add(
        "ai.onnx.ml",
        &["ArrayFeatureExtractor"],
        array_feature_extractor,
    );
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LabelEncoder.html>: the input's shape, in the
/// type of the values (`values_int64s`, `values_floats`, `values_strings` or `values_tensor`).
fn label_encoder(ctx: &OpCtx) -> RuleResult {
    let dtype = match (
        ctx.attr("values_int64s"),
        ctx.attr("values_floats"),
        ctx.attr("values_strings"),
        ctx.attr("values_tensor"),
    ) {
        (Some(_), ..) => DType::I64,
        (_, Some(_), ..) => DType::F32,
        (_, _, Some(_), _) => DType::String,
        (.., Some(Attribute::Tensor(t))) => t.dtype,
        _ => return Err("no values_* attribute gives the encoded values".into()),
    };
    same_shape(ctx, dtype)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsemble.html>: `[N, F]` → `[N,
/// n_targets]` in the input's type.
fn tree_ensemble(ctx: &OpCtx) -> RuleResult {
    let x = ctx.input(0)?;
    let targets = ctx
        .int_attr("n_targets")?
        .ok_or("attribute 'n_targets' is missing")?;
    let targets = u64::try_from(targets).map_err(|_| format!("n_targets is {targets}"))?;
    match x.shape.as_slice() {
        [rows, _] => Ok(vec![Inferred::new(
            x.dtype,
            vec![rows.clone(), Dim::Known(targets)],
        )]),
        other => Err(format!(
            "the input must be [N, F], not rank {}",
            other.len()
        )),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Binarizer.html>: elementwise, same type.
fn binarizer(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html>: the last axis
/// of the data indexed by every index, `[..., K]` for K indices; 1-D data gives `[1, K]` (what
/// onnxruntime and the ONNX reference do).
fn array_feature_extractor(ctx: &OpCtx) -> RuleResult {
    let data = ctx.input(0)?;
    let picked = super::context::concrete(ctx.shape(1)?)
        .map(|dims| Dim::Known(dims.iter().product()))
        .unwrap_or_else(|| ctx.data_dependent_dim(0, data.shape.len().max(2) - 1));
    let shape = match data.shape.as_slice() {
        [] => return Err("the data must have at least one axis".into()),
        [_] => vec![Dim::Known(1), picked],
        [leading @ .., _] => leading.iter().cloned().chain([picked]).collect(),
    };
    Ok(vec![Inferred::new(data.dtype, shape)])
}
