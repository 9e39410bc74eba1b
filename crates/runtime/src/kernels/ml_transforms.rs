//! The `ai.onnx.ml` preprocessing ops converters put before a predictor — Normalizer, Scaler,
//! Imputer, OneHotEncoder, CategoryMapper, FeatureVectorizer — ZipMap after it, and the
//! `com.microsoft`
//! Tokenizer of skl2onnx's text pipelines. Semantics: onnx's reference
//! (`onnx/reference/ops/aionnxml`) and onnxruntime (`contrib_ops/cpu/tokenizer.cc`).

use std::collections::HashMap;
use std::sync::Arc;

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::values::{value_input, ValueCtx, ValueKernelTable};
use crate::tensor::{try_filled, HostTensor, TensorData};
use crate::value::Value;
use pipecut_ir::graph::{Attribute, DType};

const DOMAIN: &str = "ai.onnx.ml";

pub(super) fn register(t: &mut KernelTable) {
    t.add_in(DOMAIN, &["Normalizer"], normalizer);
    t.add_in(DOMAIN, &["Scaler"], scaler);
    t.add_in(DOMAIN, &["Imputer"], imputer);
    t.add_in(DOMAIN, &["OneHotEncoder"], one_hot_encoder);
    t.add_in(DOMAIN, &["CategoryMapper"], category_mapper);
    t.add_in(DOMAIN, &["FeatureVectorizer"], feature_vectorizer);
    t.add_in("com.microsoft", &["Tokenizer"], tokenizer);
}

/// The kernels on values: ZipMap, whose output is a sequence of maps.
pub(super) fn register_values(t: &mut ValueKernelTable) {
    t.add_in(DOMAIN, &["ZipMap"], zip_map);
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_ZipMap.html>: each row of `[N, C]` scores
/// becomes a map from the C class labels (`classlabels_int64s` or `classlabels_strings`).
fn zip_map(ctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>, String> {
    let x = value_input(inputs, 0)?.tensor()?;
    let ctx = &ctx.ctx;
    let keys = match ctx.ints("classlabels_int64s") {
        Some(ints) if !ints.is_empty() => HostTensor::i64(vec![ints.len()], ints),
        _ => {
            let texts = strings(ctx, "classlabels_strings");
            HostTensor::new(vec![texts.len()], TensorData::String(texts))?
        }
    };
    let classes = keys.len();
    let rows = match *x.shape() {
        [columns] if columns == classes => 1,
        [rows, columns] if columns == classes => rows,
        _ => {
            return Err(format!(
                "the input {:?} is not [N, {classes}] for {classes} labels",
                x.shape()
            ))
        }
    };
    let values = HostTensor::f32(vec![rows, classes], x.to_f32_vec());
    Ok(vec![Value::MapSequence {
        keys: Arc::new(keys),
        values: Arc::new(values),
    }])
}

fn floats(ctx: &Ctx, name: &str) -> Vec<f32> {
    match ctx.attr(name) {
        Some(Attribute::Floats(v)) => v.clone(),
        _ => Vec::new(),
    }
}

fn strings(ctx: &Ctx, name: &str) -> Vec<String> {
    match ctx.attr(name) {
        Some(Attribute::Strings(v)) => v.clone(),
        _ => Vec::new(),
    }
}

/// The length of the last axis (the row a per-row op works on); a scalar is one row of one.
fn row_length(x: &HostTensor) -> usize {
    x.shape().last().copied().unwrap_or(1)
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Normalizer.html>: each row divided by its
/// MAX, L1 or L2 norm (a zero norm by 1e-30, as the reference does), as floats.
fn normalizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let norm = ctx.string("norm", "MAX");
    let mut values = x.to_f32_vec();
    for row in values.chunks_mut(row_length(x).max(1)) {
        let divisor = match norm.as_str() {
            "MAX" => row.iter().fold(0.0_f32, |m, v| m.max(v.abs())),
            "L1" => row.iter().map(|v| v.abs()).sum(),
            "L2" => row.iter().map(|v| v * v).sum::<f32>().sqrt(),
            other => return Err(format!("norm '{other}' is not MAX, L1 or L2")),
        }
        .max(1e-30);
        row.iter_mut().for_each(|v| *v /= divisor);
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), values)])
}

/// The value for column `i` of a per-column list: one value serves every column.
fn per_column<T: Copy>(list: &[T], i: usize, name: &str) -> Result<T, String> {
    match list {
        [one] => Ok(*one),
        many => many
            .get(i)
            .copied()
            .ok_or_else(|| format!("'{name}' has {} values, none for column {i}", many.len())),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Scaler.html>: `(x − offset) · scale` per
/// column, as floats.
fn scaler(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let (offsets, scales) = (floats(ctx, "offset"), floats(ctx, "scale"));
    let width = row_length(x).max(1);
    let mut values = x.to_f32_vec();
    for (i, v) in values.iter_mut().enumerate() {
        let offset = if offsets.is_empty() {
            0.0
        } else {
            per_column(&offsets, i % width, "offset")?
        };
        let scale = if scales.is_empty() {
            1.0
        } else {
            per_column(&scales, i % width, "scale")?
        };
        *v = (*v - offset) * scale;
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), values)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Imputer.html>: the elements equal to
/// `replaced_value_*` (NaN: the NaNs) become their column's `imputed_value_*`.
fn imputer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let width = row_length(x).max(1);
    let imputed_floats = floats(ctx, "imputed_value_floats");
    if !imputed_floats.is_empty() {
        let replaced = ctx.float("replaced_value_float", 0.0);
        let mut values = x.to_f32_vec();
        for (i, v) in values.iter_mut().enumerate() {
            if *v == replaced || (replaced.is_nan() && v.is_nan()) {
                *v = per_column(&imputed_floats, i % width, "imputed_value_floats")?;
            }
        }
        return Ok(vec![HostTensor::f32(x.shape().to_vec(), values)]);
    }
    let imputed_ints = ctx.ints("imputed_value_int64s").unwrap_or_default();
    if imputed_ints.is_empty() {
        return Err("neither imputed_value_floats nor imputed_value_int64s is given".into());
    }
    let replaced = ctx.int("replaced_value_int64", 0);
    let mut values = x.to_i64_vec();
    for (i, v) in values.iter_mut().enumerate() {
        if *v == replaced {
            *v = per_column(&imputed_ints, i % width, "imputed_value_int64s")?;
        }
    }
    HostTensor::new(x.shape().to_vec(), TensorData::I64(values))?
        .cast(x.dtype())
        .map(|t| vec![t])
}

/// An input's elements as category keys: strings as they are, numbers as int64 (onnxruntime
/// casts floats to int64 for OneHotEncoder and CategoryMapper).
fn keys(x: &HostTensor) -> Result<Vec<Key>, String> {
    Ok(match x.dtype() {
        DType::String => x.as_strings()?.iter().cloned().map(Key::Text).collect(),
        _ => x.to_i64_vec().into_iter().map(Key::Int).collect(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Int(i64),
    Text(String),
}

/// `cats_int64s` or `cats_strings` as keys, in order.
fn categories(ctx: &Ctx) -> Vec<Key> {
    match ctx.ints("cats_int64s") {
        Some(ints) if !ints.is_empty() => ints.into_iter().map(Key::Int).collect(),
        _ => strings(ctx, "cats_strings")
            .into_iter()
            .map(Key::Text)
            .collect(),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_OneHotEncoder.html>: a trailing axis with a
/// 1 at the element's category; an unknown category is all zeros, or an error with `zeros=0`.
fn one_hot_encoder(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let categories = categories(ctx);
    if categories.is_empty() {
        return Err("neither cats_int64s nor cats_strings is given".into());
    }
    let position: HashMap<&Key, usize> =
        categories.iter().enumerate().map(|(i, k)| (k, i)).collect();
    let zeros_allowed = ctx.int("zeros", 1) != 0;
    let elements = keys(x)?;
    let total = elements
        .len()
        .checked_mul(categories.len())
        .ok_or("the output is too large")?;
    let mut out = try_filled(total, 0.0_f32)?;
    for (row, key) in out.chunks_exact_mut(categories.len()).zip(&elements) {
        match position.get(key) {
            Some(&i) => row[i] = 1.0,
            None if zeros_allowed => {}
            None => return Err(format!("{key:?} is not one of the categories (zeros=0)")),
        }
    }
    let mut shape = x.shape().to_vec();
    shape.push(categories.len());
    Ok(vec![HostTensor::f32(shape, out)])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_CategoryMapper.html>: strings to int64 and
/// int64 to strings through the pairs `cats_strings[i]` ↔ `cats_int64s[i]`; what has no pair
/// gets `default_int64` (−1) or `default_string` ("_Unused").
fn category_mapper(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let (ints, texts) = (
        ctx.ints("cats_int64s").unwrap_or_default(),
        strings(ctx, "cats_strings"),
    );
    if ints.len() != texts.len() {
        return Err(format!(
            "{} cats_int64s for {} cats_strings",
            ints.len(),
            texts.len()
        ));
    }
    let data = match x.dtype() {
        DType::String => {
            let map: HashMap<&str, i64> = texts
                .iter()
                .map(String::as_str)
                .zip(ints.iter().copied())
                .collect();
            let default = ctx.int("default_int64", -1);
            TensorData::I64(
                x.as_strings()?
                    .iter()
                    .map(|s| map.get(s.as_str()).copied().unwrap_or(default))
                    .collect(),
            )
        }
        DType::I64 => {
            let map: HashMap<i64, &String> = ints.iter().copied().zip(&texts).collect();
            let default = ctx.string("default_string", "_Unused");
            TensorData::String(
                x.to_i64_vec()
                    .iter()
                    .map(|i| map.get(i).map_or_else(|| default.clone(), |s| (*s).clone()))
                    .collect(),
            )
        }
        other => return Err(format!("the input must be strings or int64, not {other}")),
    };
    Ok(vec![HostTensor::new(x.shape().to_vec(), data)?])
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_FeatureVectorizer.html>: the inputs' rows
/// side by side, each input's row cut or zero-padded to its `inputdimensions` entry, as floats.
fn feature_vectorizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let widths = ctx
        .ints("inputdimensions")
        .ok_or("attribute 'inputdimensions' is missing")?;
    let widths: Vec<usize> = widths
        .iter()
        .map(|&w| usize::try_from(w).map_err(|_| format!("inputdimensions holds {w}")))
        .collect::<Result<_, _>>()?;
    if widths.len() != inputs.len() {
        return Err(format!(
            "{} inputdimensions for {} inputs",
            widths.len(),
            inputs.len()
        ));
    }
    let parts: Vec<&HostTensor> = (0..inputs.len())
        .map(|i| input(inputs, i))
        .collect::<Result<_, _>>()?;
    let rows = match parts.first().map(|p| p.shape()) {
        Some([_]) | None => 1,
        Some([rows, ..]) => *rows,
        Some([]) => 1,
    };
    let total_width: usize = widths.iter().sum();
    let mut out = try_filled(
        rows.checked_mul(total_width)
            .ok_or("the output is too large")?,
        0.0_f32,
    )?;
    let mut column = 0;
    for (part, &width) in parts.iter().zip(&widths) {
        let values = part.to_f32_vec();
        let stride = values.len().checked_div(rows).unwrap_or(0);
        for r in 0..rows {
            let source = &values[r * stride..(r + 1) * stride];
            let target = &mut out[r * total_width + column..][..width];
            target.iter_mut().zip(source).for_each(|(t, s)| *t = *s);
        }
        column += width;
    }
    Ok(vec![HostTensor::f32(vec![rows, total_width], out)])
}

/// onnxruntime's com.microsoft Tokenizer: each text split into tokens by the `tokenexp` regex
/// (its matches are the tokens) or at the `separators`; tokens shorter than `mincharnum`
/// characters are dropped; `mark` adds a start (0x02) and end (0x03) token; every text's tokens
/// are padded with `pad_value` to the longest, on a new last axis.
fn tokenizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let texts = x.as_strings()?;
    let min_chars = usize::try_from(ctx.int("mincharnum", 1)).map_err(|_| "mincharnum < 0")?;
    let mark = ctx.int("mark", 0) != 0;
    let pad = ctx.string("pad_value", "#");
    let split = Splitter::of(ctx)?;
    let mut tokenized: Vec<Vec<String>> = Vec::with_capacity(texts.len());
    for text in texts {
        let mut tokens: Vec<String> = split
            .tokens(text)
            .into_iter()
            .filter(|t| t.chars().count() >= min_chars)
            .collect();
        if mark {
            tokens.insert(0, "\u{2}".into());
            tokens.push("\u{3}".into());
        }
        tokenized.push(tokens);
    }
    let longest = tokenized.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::with_capacity(texts.len().saturating_mul(longest));
    for mut tokens in tokenized {
        tokens.resize(longest, pad.clone());
        out.extend(tokens);
    }
    let mut shape = x.shape().to_vec();
    shape.push(longest);
    Ok(vec![HostTensor::new(shape, TensorData::String(out))?])
}

/// How Tokenizer cuts a text.
enum Splitter {
    Pattern(regex::Regex),
    Separators(Vec<String>),
}

impl Splitter {
    fn of(ctx: &Ctx) -> Result<Splitter, String> {
        let pattern = ctx.string("tokenexp", "");
        if !pattern.is_empty() {
            return regex::Regex::new(&pattern)
                .map(Splitter::Pattern)
                .map_err(|e| format!("tokenexp '{pattern}' is not a regex pipecut reads: {e}"));
        }
        let separators = strings(ctx, "separators");
        if separators.is_empty() {
            return Err("neither tokenexp nor separators is given".into());
        }
        Ok(Splitter::Separators(separators))
    }

    fn tokens(&self, text: &str) -> Vec<String> {
        match self {
            Splitter::Pattern(regex) => regex
                .find_iter(text)
                .map(|m| m.as_str().to_string())
                .collect(),
            Splitter::Separators(separators) => {
                let mut pieces = vec![text.to_string()];
                for separator in separators.iter().filter(|s| !s.is_empty()) {
                    pieces = pieces
                        .iter()
                        .flat_map(|p| p.split(separator.as_str()).map(str::to_string))
                        .collect();
                }
                pieces.into_iter().filter(|p| !p.is_empty()).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run_in};
    use super::*;

    fn texts(shape: &[usize], values: &[&str]) -> HostTensor {
        let values = values.iter().map(|s| s.to_string()).collect();
        HostTensor::new(shape.to_vec(), TensorData::String(values)).unwrap()
    }

    fn words(values: &[&str]) -> Attribute {
        Attribute::Strings(values.iter().map(|s| s.to_string()).collect())
    }

    /// Expected values: onnx's ReferenceEvaluator (onnx 1.23).
    #[test]
    fn normalizer_divides_rows_by_their_norm() {
        let x = f(&[2, 2], &[1.0, 2.0, -3.0, 0.5]);
        let norm = |name: &str| {
            let attrs = vec![("norm", Attribute::String(name.into()))];
            run_in(DOMAIN, "Normalizer", attrs, &[&x])
                .unwrap()
                .remove(0)
        };
        let l1 = [0.333_333_34, 0.666_666_7, -0.857_142_87, 0.142_857_15];
        assert_close(&norm("L1"), &[2, 2], &l1);
        assert_close(&norm("MAX"), &[2, 2], &[0.5, 1.0, -1.0, 0.166_666_67]);
    }

    #[test]
    fn imputer_replaces_ints_per_column() {
        let attrs = vec![
            ("imputed_value_int64s", Attribute::Ints(vec![7, 8])),
            ("replaced_value_int64", Attribute::Int(-1)),
        ];
        let out = run_in(DOMAIN, "Imputer", attrs, &[&i(&[2, 2], &[-1, 2, 3, -1])]).unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![7, 2, 3, 8]);
    }

    #[test]
    fn category_mapper_maps_both_ways_with_defaults() {
        let attrs = || {
            vec![
                ("cats_int64s", Attribute::Ints(vec![1, 2])),
                ("cats_strings", words(&["a", "b"])),
            ]
        };
        let out = run_in(
            DOMAIN,
            "CategoryMapper",
            attrs(),
            &[&texts(&[3], &["b", "z", "a"])],
        );
        assert_eq!(out.unwrap()[0].to_i64_vec(), vec![2, -1, 1]);
        let out = run_in(DOMAIN, "CategoryMapper", attrs(), &[&i(&[2], &[1, 5])]).unwrap();
        assert_eq!(out[0].as_strings().unwrap(), ["a", "_Unused"]);
    }

    #[test]
    fn one_hot_encoder_refuses_unknown_categories_without_zeros() {
        let attrs = |zeros| {
            vec![
                ("cats_strings", words(&["x", "y"])),
                ("zeros", Attribute::Int(zeros)),
            ]
        };
        let x = texts(&[2], &["y", "q"]);
        let out = run_in(DOMAIN, "OneHotEncoder", attrs(1), &[&x]).unwrap();
        assert_close(&out[0], &[2, 2], &[0.0, 1.0, 0.0, 0.0]);
        let err = run_in(DOMAIN, "OneHotEncoder", attrs(0), &[&x]).unwrap_err();
        assert!(err.contains("is not one of the categories"), "{err}");
    }

    #[test]
    fn feature_vectorizer_pads_and_cuts_each_input() {
        let attrs = vec![("inputdimensions", Attribute::Ints(vec![3, 1]))];
        let a = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = i(&[2, 2], &[5, 6, 7, 8]);
        let out = run_in(DOMAIN, "FeatureVectorizer", attrs, &[&a, &b]).unwrap();
        assert_close(&out[0], &[2, 4], &[1.0, 2.0, 0.0, 5.0, 3.0, 4.0, 0.0, 7.0]);
    }

    #[test]
    fn tokenizer_splits_at_separators_marks_and_pads() {
        let attrs = vec![
            ("separators", words(&[" "])),
            ("mark", Attribute::Int(1)),
            ("mincharnum", Attribute::Int(2)),
            ("pad_value", Attribute::String("#".into())),
        ];
        let x = texts(&[2], &["ab c de", "fgh"]);
        let out = run_in("com.microsoft", "Tokenizer", attrs, &[&x]).unwrap();
        assert_eq!(out[0].shape(), [2, 4]);
        let expected = ["\u{2}", "ab", "de", "\u{3}", "\u{2}", "fgh", "\u{3}", "#"];
        assert_eq!(out[0].as_strings().unwrap(), expected);
    }
}
