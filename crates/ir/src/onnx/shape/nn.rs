//! Convolutions, pooling, normalisations and resizing: the spatial ops of CNN, audio and
//! detection models. Spatial arithmetic follows the ONNX operator docs
//! (<https://onnx.ai/onnx/operators/onnx__Conv.html>, `ConvTranspose`, `MaxPool`,
//! `AveragePool`, `Resize`); rules cover opsets 7–23.

use super::context::{normalize_axis, same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{format_shape, DType, Dim, Shape};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["Conv", "ConvInteger"], conv);
    r.add("", &["ConvTranspose"], conv_transpose);
    r.add("", &["MaxPool", "AveragePool", "LpPool"], pool);
    r.add(
        "",
        &["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"],
        global_pool,
    );
    r.add("", &["BatchNormalization"], batch_norm);
    r.add(
        "",
        &[
            "InstanceNormalization",
            "GroupNormalization",
            "RMSNormalization",
            "LpNormalization",
        ],
        unary_same,
    );
    r.add("", &["LayerNormalization"], layer_norm);
    r.add("", &["Resize", "Upsample"], resize);
    r.add("", &["DepthToSpace"], depth_to_space);
    r.add("", &["SpaceToDepth"], space_to_depth);
}

fn unary_same(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// Per-axis attributes of a sliding-window op over `spatial` axes.
struct Window {
    kernel: Vec<u64>,
    strides: Vec<u64>,
    dilations: Vec<u64>,
    /// Begin and end padding per axis; `None` for SAME_* auto padding.
    pads: Option<(Vec<u64>, Vec<u64>)>,
    same: bool,
}

fn non_negative(values: &[i64], what: &str) -> Result<Vec<u64>, String> {
    values
        .iter()
        .map(|&v| u64::try_from(v).map_err(|_| format!("{what} has negative value {v}")))
        .collect()
}

fn window(ctx: &OpCtx, kernel: Vec<u64>) -> Result<Window, String> {
    let n = kernel.len();
    let ones = vec![1i64; n];
    let strides = non_negative(ctx.ints_attr("strides")?.unwrap_or(&ones), "strides")?;
    let dilations = non_negative(ctx.ints_attr("dilations")?.unwrap_or(&ones), "dilations")?;
    if strides.len() != n || dilations.len() != n || strides.contains(&0) || dilations.contains(&0)
    {
        return Err(format!(
            "strides {strides:?} / dilations {dilations:?} do not fit a {n}-D kernel"
        ));
    }
    let auto_pad = ctx.string_attr("auto_pad")?.unwrap_or("NOTSET");
    let (pads, same) = match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => (None, true),
        "VALID" => (Some((vec![0; n], vec![0; n])), false),
        "NOTSET" | "" => {
            let zeros = vec![0i64; 2 * n];
            let pads = non_negative(ctx.ints_attr("pads")?.unwrap_or(&zeros), "pads")?;
            if pads.len() != 2 * n {
                return Err(format!("pads {pads:?} should have {} values", 2 * n));
            }
            (Some((pads[..n].to_vec(), pads[n..].to_vec())), false)
        }
        other => return Err(format!("unknown auto_pad '{other}'")),
    };
    Ok(Window {
        kernel,
        strides,
        dilations,
        pads,
        same,
    })
}

/// Output size of a window along one axis; `ceil` for pooling's `ceil_mode`.
fn window_out(
    ctx: &OpCtx,
    w: &Window,
    axis: usize,
    input: &Dim,
    ceil: bool,
    out_axis: usize,
) -> Result<Dim, String> {
    let (stride, dilation, k) = (w.strides[axis], w.dilations[axis], w.kernel[axis]);
    // Dilation and kernel come from the model: their product overflowed (a fuzzer finding).
    let span = dilation
        .checked_mul(k.max(1) - 1)
        .and_then(|s| s.checked_add(1))
        .ok_or_else(|| format!("a window of {k} dilated by {dilation} overflows 64 bits"))?;
    if w.same {
        return Ok(match input {
            Dim::Known(n) => Dim::Known(n.div_ceil(stride)),
            sym if stride == 1 => sym.clone(),
            _ => ctx.data_dependent_dim(0, out_axis),
        });
    }
    let (begin, end) = w
        .pads
        .as_ref()
        .map(|(b, e)| (b[axis], e[axis]))
        .unwrap_or((0, 0));
    match input {
        Dim::Known(n) => {
            let padded = n
                .checked_add(begin)
                .and_then(|p| p.checked_add(end))
                .ok_or_else(|| format!("input {n} padded by {begin}+{end} overflows 64 bits"))?;
            if padded < span {
                return Err(format!(
                    "window of {span} does not fit input {n} padded by {begin}+{end}"
                ));
            }
            let steps = padded - span;
            let mut out = if ceil {
                steps.div_ceil(stride)
            } else {
                steps / stride
            } + 1;
            // With ceil_mode the last window must start inside the input or its begin padding.
            if ceil && (out - 1) * stride >= n + begin {
                out -= 1;
            }
            Ok(Dim::Known(out))
        }
        sym if stride == 1
            && begin.checked_add(end).and_then(|p| p.checked_add(1)) == Some(span) =>
        {
            Ok(sym.clone())
        }
        _ => Ok(ctx.data_dependent_dim(0, out_axis)),
    }
}

fn kernel_from(ctx: &OpCtx, weight_spatial: Option<&[Dim]>) -> Result<Vec<u64>, String> {
    if let Some(k) = ctx.ints_attr("kernel_shape")? {
        return non_negative(k, "kernel_shape");
    }
    let spatial = weight_spatial.ok_or("attribute 'kernel_shape' is missing")?;
    spatial
        .iter()
        .map(|d| {
            d.known()
                .ok_or_else(|| "the weight's spatial dims are not known".to_string())
        })
        .collect()
}

/// Conv: `[N, C, D1…] * [M, C/group, k1…] → [N, M, O1…]`.
fn conv(ctx: &OpCtx) -> RuleResult {
    let out = conv_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    let dtype = if ctx.node.op_type == "ConvInteger" {
        DType::I32
    } else {
        ctx.dtype(0)?
    };
    Ok(vec![Inferred::new(dtype, out)])
}

/// The output shape of a convolution of `x` by weights `w` under the node's attributes (shared
/// with QLinearConv, whose weights are input 3).
pub(super) fn conv_shape(ctx: &OpCtx, x: &Shape, w: &Shape) -> Result<Shape, String> {
    if x.len() < 3 || w.len() != x.len() {
        return Err(format!(
            "input {} and weight {} do not form a convolution",
            format_shape(x),
            format_shape(w)
        ));
    }
    let group = ctx.int_attr_or("group", 1)?;
    if group < 1 {
        return Err(format!("group {group} must be at least 1"));
    }
    if let (Dim::Known(c), Dim::Known(wc)) = (&x[1], &w[1]) {
        // Checked: a corrupt weight shape times a large group must not overflow.
        if wc.checked_mul(group as u64) != Some(*c) {
            return Err(format!(
                "input has {c} channels but weight expects {wc} x group {group}"
            ));
        }
    }
    let win = window(ctx, kernel_from(ctx, Some(&w[2..]))?)?;
    if win.kernel.len() != x.len() - 2 {
        return Err(format!(
            "kernel_shape {:?} does not match input rank {}",
            win.kernel,
            x.len()
        ));
    }
    let mut out = vec![x[0].clone(), w[0].clone()];
    for (axis, d) in x[2..].iter().enumerate() {
        out.push(window_out(ctx, &win, axis, d, false, axis + 2)?);
    }
    Ok(out)
}

/// ConvTranspose: `[N, C, D…] * [C, M/group, k…] → [N, M, O…]`, with
/// `O = stride·(D−1) + output_padding + (k−1)·dilation + 1 − pads`, or `output_shape` given.
fn conv_transpose(ctx: &OpCtx) -> RuleResult {
    let (x, w) = (ctx.shape(0)?, ctx.shape(1)?);
    if x.len() < 3 || w.len() != x.len() {
        return Err(format!(
            "input {} and weight {} do not form a convolution",
            format_shape(x),
            format_shape(w)
        ));
    }
    let group = ctx.int_attr_or("group", 1)?.max(1) as u64;
    let channels = w[1]
        .checked_mul(&Dim::Known(group))
        .ok_or("channel count overflows")?;
    let n = x.len() - 2;
    let win = window(ctx, kernel_from(ctx, Some(&w[2..]))?)?;
    let mut out = vec![x[0].clone(), channels];
    if let Some(shape) = ctx.ints_attr("output_shape")? {
        let shape = non_negative(shape, "output_shape")?;
        let spatial = &shape[shape.len().saturating_sub(n)..];
        out.extend(spatial.iter().map(|&d| Dim::Known(d)));
        return Ok(vec![Inferred::new(ctx.dtype(0)?, out)]);
    }
    let zeros = vec![0i64; n];
    let output_padding = non_negative(
        ctx.ints_attr("output_padding")?.unwrap_or(&zeros),
        "output_padding",
    )?;
    for (axis, d) in x[2..].iter().enumerate() {
        let stride = win.strides[axis];
        let dim = match d {
            Dim::Known(v) if win.same => Dim::Known(
                v.checked_mul(stride)
                    .ok_or("the output size overflows 64 bits")?,
            ),
            Dim::Known(v) => {
                let (b, e) = win
                    .pads
                    .as_ref()
                    .map(|(b, e)| (b[axis], e[axis]))
                    .unwrap_or((0, 0));
                // Every term comes from the model: checked, so that a huge stride, kernel or
                // dilation is an error rather than a wrapped size.
                let full = stride
                    .checked_mul(v.saturating_sub(1))
                    .and_then(|f| f.checked_add(output_padding.get(axis).copied().unwrap_or(0)))
                    .and_then(|f| {
                        f.checked_add(
                            win.kernel[axis]
                                .saturating_sub(1)
                                .checked_mul(win.dilations[axis])?,
                        )
                    })
                    .and_then(|f| f.checked_add(1))
                    .ok_or("the output size overflows 64 bits")?;
                Dim::Known(
                    b.checked_add(e)
                        .and_then(|pads| full.checked_sub(pads))
                        .ok_or("padding exceeds the output size")?,
                )
            }
            _ => ctx.data_dependent_dim(0, axis + 2),
        };
        out.push(dim);
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// MaxPool / AveragePool / LpPool over the trailing spatial axes; MaxPool's optional second
/// output is int64 indices of the same shape.
pub(super) fn pool(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let win = window(ctx, kernel_from(ctx, None)?)?;
    if x.len() != win.kernel.len() + 2 {
        return Err(format!(
            "kernel_shape {:?} does not match input {}",
            win.kernel,
            format_shape(x)
        ));
    }
    let ceil = ctx.int_attr_or("ceil_mode", 0)? != 0;
    let mut out = x[..2].to_vec();
    for (axis, d) in x[2..].iter().enumerate() {
        out.push(window_out(ctx, &win, axis, d, ceil, axis + 2)?);
    }
    Ok(vec![
        Inferred::new(ctx.dtype(0)?, out.clone()),
        Inferred::new(DType::I64, out),
    ])
}

pub(super) fn global_pool(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    if x.len() < 2 {
        return Err(format!("input {} needs a channel axis", format_shape(x)));
    }
    let mut out = x[..2].to_vec();
    out.extend(std::iter::repeat_n(Dim::Known(1), x.len() - 2));
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// BatchNormalization: `Y` like `X`; training outputs (running mean/var, and before opset 14
/// saved mean/var) are per-channel vectors.
fn batch_norm(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let channels: Shape = x.get(1).cloned().into_iter().collect();
    let stat_type = ctx.opt_input(3).map(|i| i.dtype).unwrap_or(ctx.dtype(0)?);
    let mut outs = vec![Inferred::new(ctx.dtype(0)?, x.clone())];
    outs.extend((0..4).map(|_| Inferred::new(stat_type, channels.clone())));
    Ok(outs)
}

/// LayerNormalization (opset 17): `Y` like `X`; `Mean` and `InvStdDev` keep the axes before
/// `axis` and have size 1 on the normalised ones, in the `stash_type` (float32 by default).
fn layer_norm(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, x.len())?;
    let stash = DType::from_onnx(ctx.int_attr_or("stash_type", 1)? as i32).unwrap_or(DType::F32);
    let stats: Shape = x
        .iter()
        .enumerate()
        .map(|(i, d)| if i < axis { d.clone() } else { Dim::Known(1) })
        .collect();
    Ok(vec![
        Inferred::new(ctx.dtype(0)?, x.clone()),
        Inferred::new(stash, stats.clone()),
        Inferred::new(stash, stats),
    ])
}

/// Resize (opsets 10–19) and Upsample (7–9): output dims from `sizes`, else `floor(in·scale)`.
/// Resize with `sizes` and `keep_aspect_ratio_policy` `not_larger` (`not_smaller`): one scale
/// for every resized axis, the smallest (largest) of sizes / input, each size then
/// `⌊scale · input + 0.5⌋` (the reference's rounding half up).
fn keep_aspect_ratio(
    x: &[Dim],
    axes: &[usize],
    sizes: &[Dim],
    policy: &str,
    dtype: crate::graph::DType,
) -> RuleResult {
    let known = |d: &Dim| d.known().ok_or("keep_aspect_ratio_policy needs known dims");
    let mut ratios = Vec::with_capacity(axes.len());
    for &axis in axes {
        ratios.push(known(&sizes[axis])? as f64 / known(&x[axis])? as f64);
    }
    let scale = match policy {
        "not_larger" => ratios.iter().copied().fold(f64::INFINITY, f64::min),
        "not_smaller" => ratios.iter().copied().fold(0.0, f64::max),
        other => return Err(format!("unknown keep_aspect_ratio_policy '{other}'")),
    };
    let mut out = x.to_vec();
    for &axis in axes {
        out[axis] = Dim::Known((scale * known(&x[axis])? as f64 + 0.5) as u64);
    }
    Ok(vec![Inferred::new(dtype, out)])
}

fn resize(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let dtype = ctx.dtype(0)?;
    let rank = x.len();
    let axes: Vec<usize> = match ctx.ints_attr("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    // Opset 10's Resize and Upsample take scales as input 1; opset 11+ Resize as input 2 and
    // sizes as input 3; Upsample 7 as an attribute.
    let (scales_input, sizes_input) = if ctx.node.op_type == "Upsample" || ctx.opset < 11 {
        (1, None)
    } else {
        (2, Some(3))
    };
    if let Some(sizes) = sizes_input
        .and_then(|i| ctx.opt_input(i))
        .filter(|i| i.shape.iter().any(|d| *d != Dim::Known(0)))
    {
        let _ = sizes;
        let sizes = ctx
            .sym_ints(sizes_input.unwrap_or(3))
            .ok_or("'sizes' is computed at run time; its value must be known")?;
        if sizes.len() != axes.len() {
            return Err(format!(
                "'sizes' has {} values for {} axes",
                sizes.len(),
                axes.len()
            ));
        }
        let mut out = x.clone();
        for (i, &axis) in axes.iter().enumerate() {
            out[axis] = sizes[i].to_dim().ok_or("'sizes' has a negative value")?;
        }
        let policy = ctx
            .string_attr("keep_aspect_ratio_policy")?
            .unwrap_or("stretch");
        if policy != "stretch" {
            return keep_aspect_ratio(x, &axes, &out, policy, dtype);
        }
        return Ok(vec![Inferred::new(dtype, out)]);
    }
    let scales: Vec<f64> = match ctx.attr("scales") {
        Some(crate::graph::Attribute::Floats(f)) => f.iter().map(|&v| v as f64).collect(),
        _ => ctx
            .opt_input(scales_input)
            .and_then(|i| i.value)
            .and_then(|v| v.as_f64s())
            .ok_or("neither 'scales' nor 'sizes' has a value known at plan time")?,
    };
    if scales.len() != axes.len() {
        return Err(format!(
            "'scales' has {} values for {} axes",
            scales.len(),
            axes.len()
        ));
    }
    let mut out = x.clone();
    for (i, &axis) in axes.iter().enumerate() {
        let scale = scales[i];
        out[axis] = match &x[axis] {
            Dim::Known(n) => Dim::Known((*n as f64 * scale).floor() as u64),
            d if scale == 1.0 => d.clone(),
            d if scale.fract() == 0.0 && scale > 0.0 => d
                .checked_mul(&Dim::Known(scale as u64))
                .ok_or("size overflows")?,
            _ => ctx.data_dependent_dim(0, axis),
        };
    }
    Ok(vec![Inferred::new(dtype, out)])
}

fn block_size(ctx: &OpCtx) -> Result<u64, String> {
    let b = ctx
        .int_attr("blocksize")?
        .ok_or("attribute 'blocksize' is missing")?;
    u64::try_from(b)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("blocksize {b} must be positive"))
}

fn depth_to_space(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let b = Dim::Known(block_size(ctx)?);
    if x.len() != 4 {
        return Err(format!("input {} must be 4-D", format_shape(x)));
    }
    let b2 = b.checked_mul(&b).ok_or("blocksize overflows")?;
    let c = x[1]
        .exact_div(&b2)
        .ok_or("channels are not divisible by blocksize²")?;
    let out = vec![
        x[0].clone(),
        c,
        x[2].checked_mul(&b).ok_or("overflow")?,
        x[3].checked_mul(&b).ok_or("overflow")?,
    ];
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

fn space_to_depth(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let b = Dim::Known(block_size(ctx)?);
    if x.len() != 4 {
        return Err(format!("input {} must be 4-D", format_shape(x)));
    }
    let b2 = b.checked_mul(&b).ok_or("blocksize overflows")?;
    let h = x[2]
        .exact_div(&b)
        .ok_or("height is not divisible by blocksize")?;
    let w = x[3]
        .exact_div(&b)
        .ok_or("width is not divisible by blocksize")?;
    let out = vec![x[0].clone(), x[1].checked_mul(&b2).ok_or("overflow")?, h, w];
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}
