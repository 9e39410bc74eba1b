//! Ops whose output size depends on the values of their inputs: [NonZero](https://onnx.ai/onnx/operators/onnx__NonZero.html)
//! (opsets 9–13), [Compress](https://onnx.ai/onnx/operators/onnx__Compress.html) (9–11),
//! [Unique](https://onnx.ai/onnx/operators/onnx__Unique.html) (11),
//! [NonMaxSuppression](https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html) (10–11) and
//! [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html) (20).
//!
//! When inference knows the values that decide the size (a constant, a folded value, a sample
//! value given at plan time) the size is exact; otherwise it is a fresh symbol named
//! `<output>.<axis>`, which `--dim` binds like an input's symbol. Outputs that share a size
//! (Unique's four) share one symbol, so one binding covers them all.

use super::context::{normalize_axis, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{element_count, ConstValue, DType, Dim, SymInt};
use crate::onnx::image_stream::{self, PixelFormat};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["NonZero"], non_zero);
    r.add("", &["Compress"], compress);
    r.add("", &["Unique"], unique);
    r.add("", &["NonMaxSuppression"], non_max_suppression);
    r.add("", &["ImageDecoder"], image_decoder);
}

/// [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html) (20): uint8
/// `[height, width, channels]`, the channels from `pixel_format` (RGB and BGR 3, Grayscale 1).
/// When the encoded bytes are known at plan time (a constant, an initializer, a sample value;
/// up to [`crate::graph::MAX_TRACKED_ELEMENTS`] bytes) and their header reads, the height and
/// width are the header's; otherwise they are two symbols that `--dim` binds. A stream whose
/// header does not read (corrupt, or a codec this build leaves out) is not refused here, as
/// onnx's shape inference does not refuse it: the run reports it.
fn image_decoder(ctx: &OpCtx) -> RuleResult {
    let encoded = ctx.input(0)?;
    let pixel_format = PixelFormat::parse(ctx.string_attr("pixel_format")?)?;
    let channels = Dim::Known(pixel_format.channels() as u64);
    let header = encoded
        .value
        .and_then(ConstValue::as_i64s)
        .map(|bytes| bytes.iter().map(|&b| b as u8).collect::<Vec<u8>>())
        .and_then(|bytes| image_stream::dimensions(&bytes).ok());
    let (height, width) = match header {
        Some((height, width)) => (Dim::Known(height.into()), Dim::Known(width.into())),
        None => (ctx.data_dependent_dim(0, 0), ctx.data_dependent_dim(0, 1)),
    };
    Ok(vec![Inferred::new(
        DType::U8,
        vec![height, width, channels],
    )])
}

/// Whether each element of a known value is non-zero; `None` if any element is symbolic.
fn truthy(value: &ConstValue) -> Option<Vec<bool>> {
    Some(value.as_f64s()?.iter().map(|&x| x != 0.0).collect())
}

/// NonZero: `[rank, count]`; with a known input, the count and the coordinates themselves.
fn non_zero(ctx: &OpCtx) -> RuleResult {
    let x = ctx.input(0)?;
    let rank = x.shape.len();
    let known = x.value.and_then(truthy);
    let Some((flags, dims)) = known.zip(super::context::concrete(x.shape)) else {
        return Ok(vec![Inferred::new(
            DType::I64,
            vec![Dim::Known(rank as u64), ctx.data_dependent_dim(0, 1)],
        )]);
    };
    let hits: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
    let strides = super::context::strides(&dims);
    let mut coords = Vec::with_capacity(rank * hits.len());
    for (&stride, &dim) in strides.iter().zip(&dims) {
        coords.extend(
            hits.iter()
                .map(|&i| SymInt::Lit(((i as u64 / stride) % dim) as i64)),
        );
    }
    Ok(vec![Inferred::new(
        DType::I64,
        vec![Dim::Known(rank as u64), Dim::Known(hits.len() as u64)],
    )
    .with_value(Some(ConstValue::Ints(coords)))])
}

/// Compress: the input with the `axis` dim (or, without `axis`, the flattened input) cut to the
/// number of true conditions within its length.
fn compress(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let (mut out, axis) = match ctx.int_attr("axis")? {
        Some(axis) => (x.clone(), normalize_axis(axis, x.len())?),
        None => (vec![Dim::Known(0)], 0),
    };
    let length = match ctx.int_attr("axis")? {
        Some(_) => x[axis].known(),
        None => super::context::concrete(x).map(|d| d.iter().product()),
    };
    let condition = ctx.input(1)?.value.and_then(truthy);
    out[axis] = match (condition, length) {
        (Some(flags), Some(length)) => Dim::Known(
            flags
                .iter()
                .take(length as usize)
                .filter(|&&flag| flag)
                .count() as u64,
        ),
        _ => ctx.data_dependent_dim(0, axis),
    };
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// Unique: `Y` is the input with the `axis` dim (or, without `axis`, the flattened input) cut
/// to the number of distinct slices; `indices` and `counts` have that length too, and
/// `inverse_indices` the axis's (or the flattened input's) length.
fn unique(ctx: &OpCtx) -> RuleResult {
    let x = ctx.input(0)?;
    let axis = match ctx.int_attr("axis")? {
        Some(axis) => Some(normalize_axis(axis, x.shape.len())?),
        None => None,
    };
    let (mut y, slices) = match axis {
        Some(axis) => (x.shape.clone(), x.shape[axis].clone()),
        None => (
            vec![Dim::Known(0)],
            element_count(x.shape).ok_or("the input's element count overflows")?,
        ),
    };
    let distinct = x
        .value
        .and_then(ConstValue::as_f64s)
        .zip(super::context::concrete(x.shape))
        .map(|(values, dims)| distinct_slices(&values, &dims, axis));
    let at = axis.unwrap_or(0);
    y[at] = match distinct {
        Some(n) => Dim::Known(n),
        None => ctx.data_dependent_dim(0, at),
    };
    let count = y[at].clone();
    Ok(vec![
        Inferred::new(x.dtype, y),
        Inferred::new(DType::I64, vec![count.clone()]),
        Inferred::new(DType::I64, vec![slices]),
        Inferred::new(DType::I64, vec![count]),
    ])
}

/// The number of distinct slices along `axis` (distinct elements without one).
/// Elements compare by value (`-0.0` equals `0.0`, as in numpy).
fn distinct_slices(values: &[f64], dims: &[u64], axis: Option<usize>) -> u64 {
    let Some(axis) = axis else {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        return sorted.len() as u64;
    };
    let (n, inner) = (dims[axis], dims[axis + 1..].iter().product::<u64>());
    let outer = dims[..axis].iter().product::<u64>();
    let mut slices: Vec<Vec<u64>> = (0..n)
        .map(|k| {
            (0..outer)
                .flat_map(|o| (0..inner).map(move |i| (o * n + k) * inner + i))
                .map(|at| (values[at as usize] + 0.0).to_bits())
                .collect()
        })
        .collect();
    slices.sort();
    slices.dedup();
    slices.len() as u64
}

/// NonMaxSuppression: `[selected, 3]`, the count depending on the boxes' scores and overlaps.
fn non_max_suppression(ctx: &OpCtx) -> RuleResult {
    Ok(vec![Inferred::new(
        DType::I64,
        vec![ctx.data_dependent_dim(0, 0), Dim::Known(3)],
    )])
}
