//! Spatial rearrangements that the conv and pooling rules of `nn.rs` do not cover:
//! [MaxUnpool](https://onnx.ai/onnx/operators/onnx__MaxUnpool.html) (opsets 9–22),
//! [Col2Im](https://onnx.ai/onnx/operators/onnx__Col2Im.html) (18),
//! [AffineGrid](https://onnx.ai/onnx/operators/onnx__AffineGrid.html) (20) and
//! [DeformConv](https://onnx.ai/onnx/operators/onnx__DeformConv.html) (19–22).

use super::context::{Inferred, OpCtx, RuleResult};
use super::movement::shape_from_value;
use super::registry::Registry;
use crate::graph::{format_shape, Dim, Shape};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["MaxUnpool"], max_unpool);
    r.add("", &["Col2Im"], col2im);
    r.add("", &["AffineGrid"], affine_grid);
    r.add("", &["DeformConv"], deform_conv);
}

/// An ints attribute with one entry per spatial axis, `default` when absent.
fn per_axis(ctx: &OpCtx, name: &str, axes: usize, default: i64) -> Result<Vec<i64>, String> {
    match ctx.ints_attr(name)? {
        Some(v) if v.len() >= axes => Ok(v.to_vec()),
        Some(v) => Err(format!("'{name}' {v:?} has fewer than {axes} entries")),
        None => Ok(vec![default; axes]),
    }
}

/// A spatial size from a formula over a known input size (`None` where the formula
/// overflows); symbolic input sizes stay a symbol.
fn spatial_dim(
    ctx: &OpCtx,
    input: &Dim,
    axis: usize,
    size: impl Fn(i64) -> Option<i64>,
) -> Result<Dim, String> {
    let Some(n) = input.known() else {
        return Ok(ctx.data_dependent_dim(0, axis + 2));
    };
    match i64::try_from(n).ok().and_then(size) {
        Some(out) if out >= 0 => Ok(Dim::Known(out as u64)),
        Some(out) => Err(format!("spatial axis {axis} would have size {out}")),
        None => Err(format!("spatial axis {axis}'s size overflows 64 bits")),
    }
}

/// MaxUnpool: `output_shape` (input 2) when given, else per spatial axis
/// `(in − 1)·stride − pad_begin − pad_end + kernel`.
fn max_unpool(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if ctx.opt_input(2).is_some() {
        return Ok(vec![Inferred::new(
            ctx.dtype(0)?,
            shape_from_value(ctx, 2)?,
        )]);
    }
    let axes = x
        .len()
        .checked_sub(2)
        .ok_or("the input must be [N, C, ...]")?;
    let kernel = ctx
        .ints_attr("kernel_shape")?
        .ok_or("'kernel_shape' is required")?;
    let strides = per_axis(ctx, "strides", axes, 1)?;
    let pads = per_axis(ctx, "pads", 2 * axes, 0)?;
    let mut out = x[..2].to_vec();
    for a in 0..axes {
        let k = *kernel.get(a).ok_or("kernel_shape has too few entries")?;
        out.push(spatial_dim(ctx, &x[a + 2], a, |n| {
            (n - 1)
                .checked_mul(strides[a])?
                .checked_sub(pads[a])?
                .checked_sub(pads[a + axes])?
                .checked_add(k)
        })?);
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// Col2Im: `[N, C, image_shape…]` from `[N, C·Π block_shape, L]`.
fn col2im(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if x.len() != 3 {
        return Err(format!(
            "the input {} is not [N, C·Π block, L]",
            format_shape(x)
        ));
    }
    let block = ctx
        .const_ints(2)
        .ok_or("block_shape (input 2) must be known to infer the channel count")?;
    let block_size = block.iter().try_fold(1u64, |acc, &b| {
        u64::try_from(b)
            .ok()
            .filter(|&b| b > 0)
            .and_then(|b| acc.checked_mul(b))
    });
    let channels = block_size
        .and_then(|b| x[1].exact_div(&Dim::Known(b)))
        .ok_or_else(|| {
            format!(
                "{} channels do not divide by the block {block:?}",
                format_shape(&x[1..2])
            )
        })?;
    let mut out: Shape = vec![x[0].clone(), channels];
    out.extend(shape_from_value(ctx, 1)?);
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// AffineGrid: `[N, H, W, 2]` for a 2-D `size` `[N, C, H, W]`, `[N, D, H, W, 3]` for a 3-D one.
fn affine_grid(ctx: &OpCtx) -> RuleResult {
    let theta = ctx.shape(0)?;
    let size = shape_from_value(ctx, 1)?;
    if !(size.len() == 4 || size.len() == 5) || theta.is_empty() {
        return Err(format!(
            "size {} must be [N, C, H, W] or [N, C, D, H, W]",
            format_shape(&size)
        ));
    }
    let mut out = vec![theta[0].clone()];
    out.extend(size[2..].iter().cloned());
    out.push(Dim::Known(size.len() as u64 - 2));
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// DeformConv: Conv's output, `[N, M, out…]` with
/// `out = (in + pads − dilation·(kernel − 1) − 1) / stride + 1` per spatial axis.
fn deform_conv(ctx: &OpCtx) -> RuleResult {
    let (x, w) = (ctx.shape(0)?, ctx.shape(1)?);
    let axes = x
        .len()
        .checked_sub(2)
        .ok_or("the input must be [N, C, ...]")?;
    if w.len() != x.len() {
        return Err(format!(
            "weight {} does not match input {}",
            format_shape(w),
            format_shape(x)
        ));
    }
    let kernel: Vec<i64> = match ctx.ints_attr("kernel_shape")? {
        Some(k) => k.to_vec(),
        None => w[2..]
            .iter()
            .map(|d| {
                d.known()
                    .map(|k| k as i64)
                    .ok_or("the kernel size is not known")
            })
            .collect::<Result<_, _>>()?,
    };
    let strides = per_axis(ctx, "strides", axes, 1)?;
    if strides.iter().any(|&s| s <= 0) {
        return Err(format!("strides {strides:?} must be positive"));
    }
    let dilations = per_axis(ctx, "dilations", axes, 1)?;
    let pads = per_axis(ctx, "pads", 2 * axes, 0)?;
    let mut out = vec![x[0].clone(), w[0].clone()];
    for a in 0..axes {
        let k = *kernel.get(a).ok_or("kernel_shape has too few entries")?;
        out.push(spatial_dim(ctx, &x[a + 2], a, |n| {
            let span = dilations[a].checked_mul(k.checked_sub(1)?)?;
            let padded = n.checked_add(pads[a])?.checked_add(pads[a + axes])?;
            Some(
                padded
                    .checked_sub(span)?
                    .checked_sub(1)?
                    .div_euclid(strides[a])
                    + 1,
            )
        })?);
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}
