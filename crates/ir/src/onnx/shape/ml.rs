//! Shape rules of the `ai.onnx.ml` domain, every op of ml opsets 1–5 (deprecated ones included,
//! since skl2onnx and onnxmltools still emit them), and of the `com.microsoft` Tokenizer that
//! skl2onnx's TfidfVectorizer writes. Each rule follows the op's page
//! (<https://onnx.ai/onnx/operators/#ai-onnx-ml>) and, where the spec leaves a shape open (score
//! widths, 1-D inputs), what onnxruntime returns.

use super::context::{concrete, same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{Attribute, DType, Dim, Shape, ValueKind};

const ML: &str = "ai.onnx.ml";

pub(super) fn register(r: &mut Registry) {
    r.add(ML, &["LabelEncoder"], label_encoder);
    r.add(ML, &["TreeEnsemble"], tree_ensemble);
    r.add(ML, &["Binarizer"], binarizer);
    r.add(ML, &["ArrayFeatureExtractor"], array_feature_extractor);
    r.add(ML, &["Normalizer", "Scaler"], rows_as_floats);
    r.add(ML, &["Imputer"], imputer);
    r.add(ML, &["CategoryMapper"], category_mapper);
    r.add(ML, &["CastMap"], cast_map);
    r.add(ML, &["DictVectorizer"], dict_vectorizer);
    r.add(ML, &["FeatureVectorizer"], feature_vectorizer);
    r.add(ML, &["OneHotEncoder"], one_hot_encoder);
    r.add(ML, &["LinearRegressor"], linear_regressor);
    r.add(ML, &["TreeEnsembleRegressor"], tree_ensemble_regressor);
    r.add(ML, &["SVMRegressor"], svm_regressor);
    r.add(ML, &["LinearClassifier"], linear_classifier);
    r.add(ML, &["TreeEnsembleClassifier"], tree_ensemble_classifier);
    r.add(ML, &["SVMClassifier"], svm_classifier);
    r.add(ML, &["ZipMap"], zip_map);
    r.add("com.microsoft", &["Tokenizer"], tokenizer);
}

/// Whether an `ai.onnx.ml` op takes a map or a sequence of maps (other ops take tensors).
pub(super) fn takes_maps(domain: &str, op: &str) -> bool {
    domain == ML && matches!(op, "CastMap" | "DictVectorizer")
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
    let targets = ctx
        .int_attr("n_targets")?
        .ok_or("attribute 'n_targets' is missing")?;
    let targets = u64::try_from(targets).map_err(|_| format!("n_targets is {targets}"))?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, rows_by(ctx, targets)?)])
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
    let picked = concrete(ctx.shape(1)?)
        .map(|dims| Dim::Known(dims.iter().product()))
        .unwrap_or_else(|| ctx.data_dependent_dim(0, data.shape.len().max(2) - 1));
    let shape = match data.shape.as_slice() {
        [] => return Err("the data must have at least one axis".into()),
        [_] => vec![Dim::Known(1), picked],
        [leading @ .., _] => leading.iter().cloned().chain([picked]).collect(),
    };
    Ok(vec![Inferred::new(data.dtype, shape)])
}

/// The rows of a `[N, F]` (or `[F]`, one row) input: the `N` every model op keeps.
fn rows(ctx: &OpCtx) -> Result<Dim, String> {
    match ctx.shape(0)?.as_slice() {
        [_] => Ok(Dim::Known(1)),
        [rows, _] => Ok(rows.clone()),
        other => Err(format!(
            "the input must be [N, F] or [F], not rank {}",
            other.len()
        )),
    }
}

/// `[N, width]` for the input's `N`.
fn rows_by(ctx: &OpCtx, width: u64) -> Result<Shape, String> {
    Ok(vec![rows(ctx)?, Dim::Known(width)])
}

/// Normalizer (<https://onnx.ai/onnx/operators/onnx_aionnxml_Normalizer.html>) and Scaler
/// (`…_Scaler.html`): the input's shape, as floats whatever the input type.
fn rows_as_floats(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, DType::F32)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Imputer.html>: the input's shape and type
/// (floats or int64, as `imputed_value_floats` / `imputed_value_int64s` say).
fn imputer(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_CategoryMapper.html>: strings become int64
/// and int64 become strings, shape kept.
fn category_mapper(ctx: &OpCtx) -> RuleResult {
    match ctx.dtype(0)? {
        DType::String => same_shape(ctx, DType::I64),
        DType::I64 => same_shape(ctx, DType::String),
        other => Err(format!("the input must be strings or int64, not {other}")),
    }
}

/// The map a CastMap or DictVectorizer reads: its key and value dtypes.
fn map_input(ctx: &OpCtx) -> Result<(ValueKind, DType), String> {
    let input = ctx.input(0)?;
    match input.kind {
        ValueKind::Map { .. } | ValueKind::MapSequence { .. } => Ok((input.kind, input.dtype)),
        other => Err(format!("the input must be a map, not a {other}")),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_CastMap.html>: a map from int64 to `[1, W]`
/// in `cast_to`'s type; `W` is `max_map` for the SPARSE form, else the map's size.
fn cast_map(ctx: &OpCtx) -> RuleResult {
    map_input(ctx)?;
    let dtype = match ctx.string_attr("cast_to")?.unwrap_or("TO_FLOAT") {
        "TO_FLOAT" => DType::F32,
        "TO_STRING" => DType::String,
        "TO_INT64" => DType::I64,
        other => return Err(format!("cast_to is '{other}'")),
    };
    let width = match ctx.string_attr("map_form")?.unwrap_or("DENSE") {
        "SPARSE" => Dim::Known(ctx.int_attr_or("max_map", 1)?.max(0) as u64),
        _ => ctx.data_dependent_dim(0, 1),
    };
    Ok(vec![Inferred::new(dtype, vec![Dim::Known(1), width])])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_DictVectorizer.html>: a map gives `[1, V]`, a
/// sequence of maps `[N, V]`, for the V words of the vocabulary, in the map's value type.
fn dict_vectorizer(ctx: &OpCtx) -> RuleResult {
    let (kind, dtype) = map_input(ctx)?;
    let words = match (ctx.attr("int64_vocabulary"), ctx.attr("string_vocabulary")) {
        (Some(Attribute::Ints(v)), _) => v.len(),
        (_, Some(Attribute::Strings(v))) => v.len(),
        _ => return Err("no int64_vocabulary or string_vocabulary is given".into()),
    };
    let rows = match kind {
        ValueKind::Map { .. } => Dim::Known(1),
        _ => ctx.data_dependent_dim(0, 0),
    };
    Ok(vec![Inferred::new(
        dtype,
        vec![rows, Dim::Known(words as u64)],
    )])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_FeatureVectorizer.html>: the inputs' columns
/// side by side, `[N, Σ inputdimensions]`, as floats.
fn feature_vectorizer(ctx: &OpCtx) -> RuleResult {
    let widths = ctx
        .ints_attr("inputdimensions")?
        .ok_or("attribute 'inputdimensions' is missing")?;
    if widths.len() != ctx.input_count() {
        return Err(format!(
            "inputdimensions has {} entries for {} inputs",
            widths.len(),
            ctx.input_count()
        ));
    }
    let total: i64 = widths.iter().map(|&w| w.max(0)).sum();
    Ok(vec![Inferred::new(DType::F32, rows_by(ctx, total as u64)?)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_OneHotEncoder.html>: a trailing axis of one
/// column per category, as floats.
fn one_hot_encoder(ctx: &OpCtx) -> RuleResult {
    let categories = match (ctx.attr("cats_int64s"), ctx.attr("cats_strings")) {
        (Some(Attribute::Ints(v)), _) => v.len(),
        (_, Some(Attribute::Strings(v))) => v.len(),
        _ => return Err("no cats_int64s or cats_strings is given".into()),
    };
    let mut shape = ctx.shape(0)?.clone();
    shape.push(Dim::Known(categories as u64));
    Ok(vec![Inferred::new(DType::F32, shape)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LinearRegressor.html>: `[N, targets]` floats.
fn linear_regressor(ctx: &OpCtx) -> RuleResult {
    let targets = ctx.int_attr_or("targets", 1)?;
    let targets = u64::try_from(targets).map_err(|_| format!("targets is {targets}"))?;
    Ok(vec![Inferred::new(DType::F32, rows_by(ctx, targets)?)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsembleRegressor.html>: `[N, n_targets]`
/// floats.
fn tree_ensemble_regressor(ctx: &OpCtx) -> RuleResult {
    let targets = ctx.int_attr_or("n_targets", 1)?;
    let targets = u64::try_from(targets).map_err(|_| format!("n_targets is {targets}"))?;
    Ok(vec![Inferred::new(DType::F32, rows_by(ctx, targets)?)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_SVMRegressor.html>: `[N, 1]` floats.
fn svm_regressor(ctx: &OpCtx) -> RuleResult {
    Ok(vec![Inferred::new(DType::F32, rows_by(ctx, 1)?)])
}

/// A classifier's labels: `classlabels_ints`/`_int64s` give int64, `classlabels_strings`
/// strings; with how many classes there are.
fn class_labels(ctx: &OpCtx) -> Result<(DType, usize), String> {
    let ints = ctx
        .attr("classlabels_ints")
        .or_else(|| ctx.attr("classlabels_int64s"));
    match (ints, ctx.attr("classlabels_strings")) {
        (Some(Attribute::Ints(v)), _) => Ok((DType::I64, v.len())),
        (_, Some(Attribute::Strings(v))) => Ok((DType::String, v.len())),
        _ => Err("no classlabels_ints/int64s or classlabels_strings is given".into()),
    }
}

/// A classifier's two outputs: the label `[N]` and the scores `[N, width]` floats.
fn label_and_scores(ctx: &OpCtx, label: DType, width: usize) -> RuleResult {
    let rows = rows(ctx)?;
    Ok(vec![
        Inferred::new(label, vec![rows.clone()]),
        Inferred::new(DType::F32, vec![rows, Dim::Known(width as u64)]),
    ])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LinearClassifier.html>: one score per
/// coefficient row (one per intercept); a single row for two classes scores both (`-s, s`),
/// as the reference and onnxruntime do.
fn linear_classifier(ctx: &OpCtx) -> RuleResult {
    let (label, classes) = class_labels(ctx)?;
    let score_rows = match ctx.attr("intercepts") {
        Some(Attribute::Floats(v)) => v.len(),
        _ => classes,
    };
    let width = if score_rows == 1 && classes == 2 {
        2
    } else {
        score_rows
    };
    label_and_scores(ctx, label, width)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsembleClassifier.html>: one score per
/// class (two for a binary model whose leaves score one class, as onnxruntime writes them).
fn tree_ensemble_classifier(ctx: &OpCtx) -> RuleResult {
    let (label, classes) = class_labels(ctx)?;
    label_and_scores(ctx, label, classes.max(2))
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_SVMClassifier.html>: with probabilities
/// (`prob_a`) or a linear SVM, one score per class; a kernel SVM without them scores each pair
/// of classes (`C(C-1)/2`), two for a binary one (onnxruntime's `svmclassifier.cc`).
fn svm_classifier(ctx: &OpCtx) -> RuleResult {
    let (label, classes) = class_labels(ctx)?;
    let has_vectors =
        matches!(ctx.attr("vectors_per_class"), Some(Attribute::Ints(v)) if !v.is_empty());
    let has_probabilities =
        matches!(ctx.attr("prob_a"), Some(Attribute::Floats(v)) if !v.is_empty());
    let width = if has_vectors && !has_probabilities && classes > 2 {
        classes * (classes - 1) / 2
    } else {
        classes.max(2)
    };
    label_and_scores(ctx, label, width)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_ZipMap.html>: `[N, C]` scores become N maps
/// from the C class labels to floats.
fn zip_map(ctx: &OpCtx) -> RuleResult {
    let key = match (
        ctx.attr("classlabels_int64s"),
        ctx.attr("classlabels_strings"),
    ) {
        (Some(Attribute::Ints(_)), _) => DType::I64,
        (_, Some(Attribute::Strings(_))) => DType::String,
        _ => return Err("no classlabels_int64s or classlabels_strings is given".into()),
    };
    let entries = match ctx.shape(0)?.as_slice() {
        [_, entries] => entries.clone(),
        other => {
            return Err(format!(
                "the input must be [N, C], not rank {}",
                other.len()
            ))
        }
    };
    Ok(vec![Inferred::of_kind(
        ValueKind::MapSequence { key },
        DType::F32,
        Some(vec![entries]),
    )])
}

/// onnxruntime's com.microsoft Tokenizer
/// (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.Tokenizer>):
/// strings `[N]` or `[N, C]` gain a trailing axis of tokens, as long as the longest text's
/// tokens (known only when it runs).
fn tokenizer(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    if input.dtype != DType::String {
        return Err(format!("the input must be strings, not {}", input.dtype));
    }
    let mut shape = input.shape.clone();
    if !(1..=2).contains(&shape.len()) {
        return Err(format!(
            "the input must be [N] or [N, C], not rank {}",
            shape.len()
        ));
    }
    shape.push(ctx.data_dependent_dim(0, shape.len()));
    Ok(vec![Inferred::new(DType::String, shape)])
}
