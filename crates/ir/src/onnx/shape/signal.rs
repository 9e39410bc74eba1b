//! Shape rules of the signal ops: the window generators (HannWindow, HammingWindow,
//! BlackmanWindow, opset 17), a 1-D tensor as long as the scalar `size` input, in
//! `output_datatype` (default float); [DFT](https://onnx.ai/onnx/operators/onnx__DFT.html)
//! (17–20), [STFT](https://onnx.ai/onnx/operators/onnx__STFT.html) (17) and
//! [MelWeightMatrix](https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html) (17).

use super::context::{normalize_axis, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{format_shape, DType, Dim};

pub(super) fn register(r: &mut Registry) {
    r.add(
        "",
        &["HannWindow", "HammingWindow", "BlackmanWindow"],
        window,
    );
    r.add("", &["DFT"], dft);
    r.add("", &["STFT"], stft);
    r.add("", &["MelWeightMatrix"], mel_weight_matrix);
}

/// A scalar integer input: its value, `None` when absent, a symbol when unknown.
fn scalar_dim(ctx: &OpCtx, input: usize, output_axis: usize) -> Result<Option<Dim>, String> {
    if ctx.opt_input(input).is_none() {
        return Ok(None);
    }
    match ctx.const_ints(input).as_deref() {
        Some([v]) if *v >= 0 => Ok(Some(Dim::Known(*v as u64))),
        Some(v) => Err(format!("input {input} must be a scalar ≥ 0, got {v:?}")),
        None => Ok(Some(ctx.data_dependent_dim(0, output_axis))),
    }
}

/// `n/2 + 1` bins of a one-sided transform of length `n`.
fn bins(length: Dim, onesided: bool, ctx: &OpCtx, axis: usize) -> Dim {
    match (onesided, length.known()) {
        (false, _) => length,
        (true, Some(n)) => Dim::Known(n / 2 + 1),
        (true, None) => ctx.data_dependent_dim(0, axis),
    }
}

/// DFT: the input with the last axis 2 (complex) and the transformed axis `dft_length` long
/// (default: unchanged), `dft_length/2 + 1` when `onesided`. An `inverse` and `onesided` DFT
/// is numpy's `irfft` (the reference of onnx 1.23): `length/2 + 1` bins in, a real signal of
/// `dft_length` samples out (default `2·(bins − 1)`), last axis 1. The axis is an attribute
/// (default 1) before opset 20 and input 2 (default −2) from it.
fn dft(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if !matches!(x.last().and_then(Dim::known), Some(1 | 2)) || x.len() < 2 {
        return Err(format!("the input {} must end in 1 or 2", format_shape(x)));
    }
    let axis = if ctx.opset >= 20 {
        match ctx.opt_input(2) {
            None => -2,
            Some(_) => match ctx.const_ints(2).as_deref() {
                Some([a]) => *a,
                _ => return Err("axis (input 2) must be a known scalar".into()),
            },
        }
    } else {
        ctx.int_attr_or("axis", 1)?
    };
    let axis = normalize_axis(axis, x.len())?;
    if axis == x.len() - 1 {
        return Err("the transformed axis cannot be the last one".into());
    }
    let onesided = ctx.int_attr_or("onesided", 0)? != 0;
    let inverse = ctx.int_attr_or("inverse", 0)? != 0;
    let mut out = x.clone();
    if inverse && onesided {
        out[axis] = match (scalar_dim(ctx, 1, axis)?, x[axis].known()) {
            (Some(length), _) => length,
            (None, Some(bins)) => Dim::Known(2 * bins.saturating_sub(1)),
            (None, None) => ctx.data_dependent_dim(0, axis),
        };
        *out.last_mut().unwrap() = Dim::Known(1);
        return Ok(vec![Inferred::new(ctx.dtype(0)?, out)]);
    }
    let length = scalar_dim(ctx, 1, axis)?.unwrap_or_else(|| x[axis].clone());
    out[axis] = bins(length, onesided, ctx, axis);
    *out.last_mut().unwrap() = Dim::Known(2);
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// STFT: `[batch, frames, bins, 2]`, `frames = 1 + (length − frame_length) / frame_step`, the
/// frame length from input 3, else the window's length. The signal is `[batch, length, 1 or 2]`
/// by the spec, or a real `[batch, length]`, which onnxruntime and `onnx.checker` accept and
/// onnx-asr's feature extractors write (docs/conformance.md).
fn stft(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if x.len() != 3 && x.len() != 2 {
        return Err(format!(
            "the signal {} is not [batch, length, 1 or 2] (nor a real [batch, length])",
            format_shape(x)
        ));
    }
    let frame = match scalar_dim(ctx, 3, 2)? {
        Some(f) => f,
        None => match ctx.opt_input(2) {
            Some(w) => w.shape.first().cloned().ok_or("the window must be 1-D")?,
            None => x[1].clone(),
        },
    };
    let step = ctx.const_ints(1);
    let frames = match (x[1].known(), frame.known(), step.as_deref()) {
        (Some(n), Some(f), Some([s])) if *s > 0 && f <= n && f > 0 => {
            Dim::Known(1 + (n - f) / *s as u64)
        }
        (_, _, Some([s])) if *s <= 0 => return Err(format!("frame_step {s} is not positive")),
        _ => ctx.data_dependent_dim(0, 1),
    };
    let bins = bins(frame, ctx.int_attr_or("onesided", 1)? != 0, ctx, 2);
    Ok(vec![Inferred::new(
        ctx.dtype(0)?,
        vec![x[0].clone(), frames, bins, Dim::Known(2)],
    )])
}

/// MelWeightMatrix: `[dft_length/2 + 1, num_mel_bins]` in `output_datatype` (default float).
fn mel_weight_matrix(ctx: &OpCtx) -> RuleResult {
    let code = ctx.int_attr_or("output_datatype", 1)?;
    let dtype = DType::from_onnx(code as i32)
        .ok_or_else(|| format!("output_datatype {code} is not an ONNX type"))?;
    let mel_bins = scalar_dim(ctx, 0, 1)?.ok_or("num_mel_bins is required")?;
    let spectrogram = match scalar_dim(ctx, 1, 0)?.ok_or("dft_length is required")? {
        Dim::Known(n) => Dim::Known(n / 2 + 1),
        symbol => symbol,
    };
    Ok(vec![Inferred::new(dtype, vec![spectrogram, mel_bins])])
}

fn window(ctx: &OpCtx) -> RuleResult {
    let code = ctx.int_attr_or("output_datatype", 1)?;
    let dtype = DType::from_onnx(code as i32)
        .ok_or_else(|| format!("output_datatype {code} is not an ONNX type"))?;
    let len = match ctx.const_ints(0).as_deref() {
        Some([size]) if *size >= 0 => Dim::Known(*size as u64),
        Some([size]) => return Err(format!("size is {size}, below 0")),
        Some(_) => return Err("size must be a scalar".into()),
        None => ctx.data_dependent_dim(0, 0),
    };
    Ok(vec![Inferred::new(dtype, vec![len])])
}
