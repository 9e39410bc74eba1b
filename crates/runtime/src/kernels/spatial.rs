//! Spatial rearrangements, after the ONNX reference implementations:
//! [MaxUnpool](https://onnx.ai/onnx/operators/onnx__MaxUnpool.html) (opsets 9–22),
//! [Col2Im](https://onnx.ai/onnx/operators/onnx__Col2Im.html) (18, any number of spatial dims),
//! [AffineGrid](https://onnx.ai/onnx/operators/onnx__AffineGrid.html) (20, 2-D and 3-D) and
//! [DeformConv](https://onnx.ai/onnx/operators/onnx__DeformConv.html) (19–22, 2-D).

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::checked_size;
use crate::tensor::{strides_of, try_zeros_f32, HostTensor};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["MaxUnpool"], max_unpool);
    t.add(&["Col2Im"], col2im);
    t.add(&["AffineGrid"], affine_grid);
    t.add(&["DeformConv"], deform_conv);
}

/// An ints attribute with `n` entries, `default` when absent.
fn per_axis(ctx: &Ctx, name: &str, n: usize, default: i64) -> Result<Vec<i64>, String> {
    match ctx.ints(name) {
        Some(v) if v.len() >= n => Ok(v),
        Some(v) => Err(format!("'{name}' {v:?} has fewer than {n} entries")),
        None => Ok(vec![default; n]),
    }
}

/// Sizes from an int64 tensor, refusing negative entries.
fn sizes(t: &HostTensor, what: &str) -> Result<Vec<usize>, String> {
    t.to_i64_vec()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("{what} has a negative entry {d}")))
        .collect()
}

/// MaxUnpool: scatters each input value to the flat position its index names in the tensor of
/// the unpooled size `(in − 1)·stride − pads + kernel`, then places that tensor at the origin of
/// an `output_shape` one when given (zeros elsewhere).
fn max_unpool(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, indices) = (input(inputs, 0)?, input(inputs, 1)?);
    let (targets, out_shape) = max_unpool_targets(ctx, x.shape(), indices, optional(inputs, 2))?;
    let mut out = try_zeros_f32(&out_shape)?;
    for (&value, &flat) in x.to_f32_vec().iter().zip(&targets) {
        out[flat] = value;
    }
    Ok(vec![HostTensor::f32(out_shape, out)])
}

/// Where MaxUnpool writes each input value (flat positions in the output, checked) and the
/// output's shape (`output_shape` when given). The CUDA backend scatters by these.
pub(crate) fn max_unpool_targets(
    ctx: &Ctx,
    x_shape: &[usize],
    indices: &HostTensor,
    output_shape: Option<&HostTensor>,
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let axes = x_shape
        .len()
        .checked_sub(2)
        .ok_or("the input must be [N, C, ...]")?;
    let kernel = ctx
        .ints("kernel_shape")
        .ok_or("'kernel_shape' is required")?;
    let (strides, pads) = (
        per_axis(ctx, "strides", axes, 1)?,
        per_axis(ctx, "pads", 2 * axes, 0)?,
    );
    let mut unpooled = x_shape[..2].to_vec();
    for a in 0..axes {
        let k = kernel.get(a).copied().ok_or("kernel_shape is too short")?;
        let size = (x_shape[a + 2] as i64 - 1)
            .checked_mul(strides[a])
            .and_then(|v| {
                v.checked_sub(pads[a])?
                    .checked_sub(pads[a + axes])?
                    .checked_add(k)
            })
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| format!("unpooled axis {a} is negative or overflows"))?;
        unpooled.push(size);
    }
    let out_shape = match output_shape {
        Some(shape) => sizes(shape, "output_shape")?,
        None => unpooled.clone(),
    };
    if out_shape.len() != unpooled.len() || out_shape.iter().zip(&unpooled).any(|(o, u)| o < u) {
        return Err(format!(
            "output_shape {out_shape:?} is smaller than the unpooled {unpooled:?}"
        ));
    }
    checked_size(&out_shape)?;
    let (from, to) = (strides_of(&unpooled), strides_of(&out_shape));
    let total = checked_size(&unpooled)?;
    let mut targets = Vec::with_capacity(indices.len());
    for &at in indices.to_i64_vec().iter().take(x_shape.iter().product()) {
        let at = usize::try_from(at)
            .ok()
            .filter(|&i| i < total)
            .ok_or_else(|| format!("index {at} is outside the unpooled {unpooled:?}"))?;
        let flat: usize = from
            .iter()
            .zip(&unpooled)
            .zip(&to)
            .map(|((&f, &d), &t)| (at / f) % d * t)
            .sum();
        targets.push(flat);
    }
    Ok((targets, out_shape))
}

/// Where Col2Im puts each column entry, from the node and its input's shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Col2Im {
    pub(crate) batch: usize,
    pub(crate) channels: usize,
    /// Π block: a channel's rows of the input.
    pub(crate) block_size: usize,
    /// L: the columns.
    pub(crate) length: usize,
    pub(crate) image: Vec<usize>,
    /// Per entry `k · L + l` (block offset k, column l), its position in the image, `None`
    /// when it falls in the padding.
    pub(crate) targets: Vec<Option<usize>>,
}

/// The Col2Im of an input of `shape` `[N, C·Π block, L]` into `image` by `block`, with the
/// node's dilations, pads and strides.
pub(crate) fn col2im_geometry(
    ctx: &Ctx,
    shape: &[usize],
    image: Vec<usize>,
    block: &[usize],
) -> Result<Col2Im, String> {
    let n = image.len();
    let (dilations, pads, strides) = (
        per_axis(ctx, "dilations", n, 1)?,
        per_axis(ctx, "pads", 2 * n, 0)?,
        per_axis(ctx, "strides", n, 1)?,
    );
    let block_size = checked_size(block)?;
    let [batch, rows, length] = *shape else {
        return Err(format!("the input {shape:?} is not [N, C·Π block, L]"));
    };
    if block.len() != n
        || block_size == 0
        || rows % block_size != 0
        || strides.iter().any(|&s| s <= 0)
    {
        return Err(format!(
            "{rows} rows do not divide into blocks {block:?}, or a stride is not positive"
        ));
    }
    let blocks: Vec<usize> = (0..n)
        .map(|i| {
            let reach = dilations[i].checked_mul(block[i] as i64 - 1)?;
            let padded = (image[i] as i64)
                .checked_add(pads[i])?
                .checked_add(pads[i + n])?;
            let span = padded.checked_sub(reach)?.checked_sub(1)?;
            Some((span.div_euclid(strides[i]) + 1).max(0) as usize)
        })
        .collect::<Option<_>>()
        .ok_or("the pads, dilations or image size overflow")?;
    if blocks.iter().product::<usize>() != length {
        return Err(format!(
            "{length} columns, but the image holds {blocks:?} blocks"
        ));
    }
    let (image_strides, block_strides, grid_strides) =
        (strides_of(&image), strides_of(block), strides_of(&blocks));
    let mut targets = Vec::with_capacity(checked_size(&[block_size, length])?);
    for k in 0..block_size {
        for l in 0..length {
            let mut flat = 0usize;
            let inside = (0..n).all(|i| {
                let tap = (k / block_strides[i] % block[i]) as i64;
                let cell = (l / grid_strides[i] % blocks[i]) as i64;
                let pos = (cell.saturating_mul(strides[i]))
                    .saturating_sub(pads[i])
                    .saturating_add(tap.saturating_mul(dilations[i]));
                flat += pos.max(0) as usize * image_strides[i];
                (0..image[i] as i64).contains(&pos)
            });
            targets.push(inside.then_some(flat));
        }
    }
    Ok(Col2Im {
        batch,
        channels: rows / block_size,
        block_size,
        length,
        image,
        targets,
    })
}

/// Col2Im: sums the columns `[N, C·Π block, L]` back into images `[N, C, image…]`, each column
/// entry landing at `block position · stride − pad_begin + kernel offset · dilation`.
fn col2im(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let image = sizes(input(inputs, 1)?, "image_shape")?;
    let block = sizes(input(inputs, 2)?, "block_shape")?;
    let Col2Im {
        batch,
        channels,
        block_size,
        length,
        image,
        targets,
    } = col2im_geometry(ctx, x.shape(), image, &block)?;
    let rows = channels * block_size;
    let image_size = checked_size(&image)?;
    let mut out = try_zeros_f32(&[checked_size(&[batch, channels, image_size])?])?;
    let xv = x.to_f32_vec();
    for (entry, target) in targets.iter().enumerate() {
        let Some(flat) = *target else {
            continue;
        };
        let (k, l) = (entry / length, entry % length);
        for b in 0..batch {
            for c in 0..channels {
                out[(b * channels + c) * image_size + flat] +=
                    xv[(b * rows + c * block_size + k) * length + l];
            }
        }
    }
    let mut shape = vec![batch, channels];
    shape.extend(&image);
    Ok(vec![HostTensor::f32(shape, out)])
}

/// The normalised coordinates of `size` points along an axis: from −1 to 1 through the pixel
/// centres, or through the corner pixels with `align_corners`.
fn grid_axis(size: usize, align_corners: bool) -> Vec<f32> {
    (0..size)
        .map(|i| match (align_corners, size) {
            (true, 1) => -1.0,
            (true, _) => -1.0 + 2.0 * i as f32 / (size - 1) as f32,
            (false, _) => -1.0 + (2 * i + 1) as f32 / size as f32,
        })
        .collect()
}

/// The points of an AffineGrid over `spatial` (`[H, W]` or `[D, H, W]`) in row-major order,
/// each as its normalised coordinates `(x, y[, z])` (`x` along the last axis) followed by 1:
/// `[points, dims + 1]`, which the CUDA AffineGrid multiplies by each θᵀ.
pub(crate) fn affine_grid_points(
    spatial: &[usize],
    align_corners: bool,
) -> Result<Vec<f32>, String> {
    let dims = spatial.len();
    let axes: Vec<Vec<f32>> = spatial
        .iter()
        .map(|&s| grid_axis(s, align_corners))
        .collect();
    let points = checked_size(spatial)?;
    let steps = strides_of(spatial);
    let mut out = try_zeros_f32(&[checked_size(&[points, dims + 1])?])?;
    for (p, point) in out.chunks_exact_mut(dims + 1).enumerate() {
        for (slot, a) in point.iter_mut().zip((0..dims).rev()) {
            *slot = axes[a][p / steps[a] % spatial[a]];
        }
        point[dims] = 1.0;
    }
    Ok(out)
}

/// AffineGrid: each output point is `theta[n] · (x, y[, z], 1)` of its normalised coordinates,
/// `x` along the last axis.
fn affine_grid(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let theta = input(inputs, 0)?;
    let size = sizes(input(inputs, 1)?, "size")?;
    let dims = size.len().checked_sub(2).filter(|d| *d == 2 || *d == 3);
    let Some(dims) = dims else {
        return Err(format!(
            "size {size:?} must be [N, C, H, W] or [N, C, D, H, W]"
        ));
    };
    let batch = size[0];
    if theta.shape() != [batch, dims, dims + 1] {
        return Err(format!(
            "theta {:?} is not [{batch}, {dims}, {}]",
            theta.shape(),
            dims + 1
        ));
    }
    let align = ctx.int("align_corners", 0) != 0;
    let spatial = &size[2..];
    let points = checked_size(spatial)?;
    let homogeneous = affine_grid_points(spatial, align)?;
    let tv = theta.to_f32_vec();
    let mut out = try_zeros_f32(&[checked_size(&[batch, points, dims])?])?;
    for b in 0..batch {
        let t = &tv[b * dims * (dims + 1)..][..dims * (dims + 1)];
        for p in 0..points {
            let coords = &homogeneous[p * (dims + 1)..][..dims];
            for r in 0..dims {
                let row = &t[r * (dims + 1)..][..dims + 1];
                let v: f32 = coords.iter().zip(row).map(|(c, w)| c * w).sum::<f32>() + row[dims];
                out[(b * points + p) * dims + r] = v;
            }
        }
    }
    let mut shape = vec![batch];
    shape.extend(spatial);
    shape.push(dims);
    Ok(vec![HostTensor::f32(shape, out)])
}

/// Bilinear sample of a plane at fractional `(y, x)`, zero outside (GridSample with
/// `align_corners = 1` and zero padding, which the ONNX reference's DeformConv calls).
fn bilinear(plane: &[f32], height: usize, width: usize, y: f32, x: f32) -> f32 {
    let (y0, x0) = (y.floor(), x.floor());
    let (dy, dx) = (y - y0, x - x0);
    let mut sum = 0.0;
    for (oy, wy) in [(0.0, 1.0 - dy), (1.0, dy)] {
        for (ox, wx) in [(0.0, 1.0 - dx), (1.0, dx)] {
            let (yy, xx) = (y0 + oy, x0 + ox);
            if yy >= 0.0 && xx >= 0.0 && (yy as usize) < height && (xx as usize) < width {
                sum += wy * wx * plane[yy as usize * width + xx as usize];
            }
        }
    }
    sum
}

/// DeformConv (2-D): Conv whose every kernel tap samples the input bilinearly at its position
/// moved by a learned offset, scaled by the optional mask.
fn deform_conv(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, w, offset) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let ([n, ic, ih, iw], [oc, icg, kh, kw]) = match (x.shape(), w.shape()) {
        (&[a, b, c, d], &[e, f, g, h]) => ([a, b, c, d], [e, f, g, h]),
        _ => {
            return Err(format!(
                "only 2-D DeformConv is supported, got input {:?}",
                x.shape()
            ))
        }
    };
    let group = ctx.int("group", 1).max(1) as usize;
    let offset_group = ctx.int("offset_group", 1).max(1) as usize;
    if ic != icg * group || oc % group != 0 || ic % offset_group != 0 {
        return Err(format!(
            "input {:?}, weight {:?}, group {group} and offset_group {offset_group} do not agree",
            x.shape(),
            w.shape()
        ));
    }
    let (&[_, offset_rows, oh, ow], taps) = (offset.shape(), kh * kw) else {
        return Err(format!(
            "offset {:?} is not [N, 2·groups·kernel, H, W]",
            offset.shape()
        ));
    };
    if offset_rows != 2 * offset_group * taps {
        return Err(format!(
            "offset has {offset_rows} rows, expected {}",
            2 * offset_group * taps
        ));
    }
    let (dilations, pads, strides) = (
        per_axis(ctx, "dilations", 2, 1)?,
        per_axis(ctx, "pads", 4, 0)?,
        per_axis(ctx, "strides", 2, 1)?,
    );
    let (xv, wv, ov) = (x.to_f32_vec(), w.to_f32_vec(), offset.to_f32_vec());
    let mask = optional(inputs, 4).map(|m| m.to_f32_vec());
    let bias = optional(inputs, 3).map(|b| b.to_f32_vec());
    let (ocg, icpog) = (oc / group, ic / offset_group);
    let out_points = oh * ow;
    let mut out = try_zeros_f32(&[checked_size(&[n, oc, out_points])?])?;
    for b in 0..n {
        for c in 0..ic {
            let og = c / icpog;
            let plane = &xv[(b * ic + c) * ih * iw..][..ih * iw];
            // The sampled (and masked) input under every tap at every output point.
            let mut sampled = vec![0f32; taps * out_points];
            for t in 0..taps {
                let (ki, kj) = (t / kw, t % kw);
                for p in 0..out_points {
                    let (i, j) = (p / ow, p % ow);
                    let at = |row: usize| {
                        ov[((b * offset_group + og) * 2 * taps + row) * out_points + p]
                    };
                    // Saturating: a position past the plane samples zeros either way.
                    let base = |o: usize, k: usize, a: usize| {
                        (o as i64)
                            .saturating_mul(strides[a])
                            .saturating_sub(pads[a])
                            .saturating_add((k as i64).saturating_mul(dilations[a]))
                            as f32
                    };
                    let y = base(i, ki, 0) + at(2 * t);
                    let xx = base(j, kj, 1) + at(2 * t + 1);
                    let m = mask.as_ref().map_or(1.0, |m| {
                        m[((b * offset_group + og) * taps + t) * out_points + p]
                    });
                    sampled[t * out_points + p] = bilinear(plane, ih, iw, y, xx) * m;
                }
            }
            let g = c / icg;
            for o in g * ocg..(g + 1) * ocg {
                let weights = &wv[(o * icg + c % icg) * taps..][..taps];
                let target = &mut out[(b * oc + o) * out_points..][..out_points];
                for (t, &wt) in weights.iter().enumerate() {
                    for (acc, &s) in target
                        .iter_mut()
                        .zip(&sampled[t * out_points..][..out_points])
                    {
                        *acc += wt * s;
                    }
                }
            }
        }
    }
    if let Some(bias) = bias {
        for (p, plane) in out.chunks_mut(out_points.max(1)).enumerate() {
            plane.iter_mut().for_each(|v| *v += bias[p % oc]);
        }
    }
    Ok(vec![HostTensor::f32(vec![n, oc, oh, ow], out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn max_unpool_places_values_at_their_indices() {
        let x = f(&[1, 1, 1, 2], &[5.0, 7.0]);
        let idx = i(&[1, 1, 1, 2], &[1, 2]);
        let k = ("kernel_shape", Attribute::Ints(vec![2, 2]));
        let s = ("strides", Attribute::Ints(vec![2, 2]));
        let out = run("MaxUnpool", vec![k, s], &[&x, &idx]);
        assert_close(
            &out[0],
            &[1, 1, 2, 4],
            &[0.0, 5.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        );
    }

    #[test]
    fn col2im_sums_overlapping_columns() {
        // One channel, 1×2 blocks over a 1×3 image: two columns overlap in the middle.
        let x = f(&[1, 2, 2], &[1.0, 2.0, 10.0, 20.0]);
        let out = run(
            "Col2Im",
            vec![],
            &[&x, &i(&[2], &[1, 3]), &i(&[2], &[1, 2])],
        );
        assert_close(&out[0], &[1, 1, 1, 3], &[1.0, 12.0, 20.0]);
    }

    #[test]
    fn identity_affine_grid_is_the_normalised_grid() {
        let theta = f(&[1, 2, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let out = run("AffineGrid", vec![], &[&theta, &i(&[4], &[1, 1, 1, 2])]);
        assert_close(&out[0], &[1, 1, 2, 2], &[-0.5, 0.0, 0.5, 0.0]);
    }
}
