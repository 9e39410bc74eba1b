//! Resize (opsets 10–19) and Upsample (7–9), <https://onnx.ai/onnx/operators/onnx__Resize.html>.
//!
//! Separable, as the ONNX reference computes it: along each resized axis every output index
//! maps to a source coordinate (the coordinate transformation mode), whose neighbours are
//! weighted by the mode's coefficients (nearest, linear, cubic with `cubic_coeff_a`, the
//! antialiasing variants when downsampling), indices beyond the edges reading the edge value
//! (or dropped, the rest renormalised, with `exclude_outside`); `tf_crop_and_resize` gives
//! `extrapolation_value` for coordinates outside the input. Output sizes come from `sizes`
//! (with `keep_aspect_ratio_policy`) or `scales`, on the axes of the `axes` attribute (all by
//! default). Computed in f64, stored as f32.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::{checked_size, normalize_axis};
use crate::tensor::{strides_of, HostTensor};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Resize", "Upsample"], resize);
}

/// The (input index, weight) pairs one output index reads along one axis; `None` for a
/// coordinate outside the input (tf_crop_and_resize's extrapolation).
type Taps = Option<Vec<(usize, f64)>>;

/// The request, normalised to every axis of the input.
struct Request {
    out_shape: Vec<usize>,
    scales: Vec<f64>,
    /// `[start, end]` of the region of interest per axis (tf_crop_and_resize).
    roi: Vec<(f64, f64)>,
    /// Axes that are resized (the others are copied).
    resized: Vec<bool>,
}

fn resize(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.is_empty() {
        return Err(format!("cannot resize an empty tensor {:?}", x.shape()));
    }
    let (request, taps) = request_and_taps(ctx, inputs, x.shape())?;
    let rank = x.shape().len();
    if let Some(picks) = single_picks(&taps).filter(|_| rank > 0) {
        let out = pick(&x.to_f32_vec(), x.shape(), &request.out_shape, &picks);
        return Ok(vec![HostTensor::f32(request.out_shape, out)]);
    }
    let extrapolation = ctx.float("extrapolation_value", 0.0);
    let mut shape = x.shape().to_vec();
    let mut values: Vec<f64> = x.to_f32_vec().into_iter().map(f64::from).collect();
    for axis in (0..rank).filter(|&a| request.resized[a] && !is_identity(&taps[a], x.shape()[a])) {
        values = resize_axis(&values, &shape, axis, &taps[axis]);
        shape[axis] = request.out_shape[axis];
    }
    let mut out: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
    if taps.iter().flatten().any(Option::is_none) {
        fill_outside(&mut out, &request.out_shape, &taps, extrapolation);
    }
    Ok(vec![HostTensor::f32(request.out_shape, out)])
}

/// A Resize as the CUDA backend runs it: the output shape and, per axis that changes, its
/// (input index, weight) taps for each output index, to be applied one axis after another.
/// `None` when an output coordinate falls outside the input (tf_crop_and_resize's
/// extrapolation), which is left to the CPU kernel. `inputs[0]` is not read, only `shape`.
#[cfg(feature = "cuda")]
pub(crate) fn resize_plan(
    ctx: &Ctx,
    inputs: &[Option<&HostTensor>],
    shape: &[usize],
) -> Result<Option<ResizePlan>, String> {
    let (request, taps) = request_and_taps(ctx, inputs, shape)?;
    let mut axes = Vec::new();
    for (axis, axis_taps) in taps.into_iter().enumerate() {
        if !request.resized[axis] || is_identity(&axis_taps, shape[axis]) {
            continue;
        }
        let Some(axis_taps) = axis_taps.into_iter().collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        axes.push((axis, axis_taps));
    }
    Ok(Some((request.out_shape, axes)))
}

/// The output shape, and per resized axis its taps for each output index.
#[cfg(feature = "cuda")]
pub(crate) type ResizePlan = (Vec<usize>, Vec<(usize, Vec<Vec<(usize, f64)>>)>);

/// The request of a Resize on `shape` and the taps of every output index on every axis.
fn request_and_taps(
    ctx: &Ctx,
    inputs: &[Option<&HostTensor>],
    shape: &[usize],
) -> Result<(Request, Vec<Vec<Taps>>), String> {
    let request = request(ctx, inputs, shape)?;
    checked_size(&request.out_shape)?;
    let legacy = ctx.node.op_type == "Upsample" || ctx.opset < 11;
    // Upsample and Resize-10 map output i to input i / scale and take the floor.
    let (coord_default, nearest_default) = if legacy {
        ("asymmetric", "floor")
    } else {
        ("half_pixel", "round_prefer_floor")
    };
    let method = Method {
        mode: ctx.string("mode", "nearest"),
        nearest_mode: ctx.string("nearest_mode", nearest_default),
        cubic_a: f64::from(ctx.float("cubic_coeff_a", -0.75)),
        antialias: ctx.int("antialias", 0) != 0,
        exclude_outside: ctx.int("exclude_outside", 0) != 0,
        coordinates: ctx.string("coordinate_transformation_mode", coord_default),
    };
    let taps: Vec<Vec<Taps>> = (0..shape.len())
        .map(|axis| {
            (0..request.out_shape[axis])
                .map(|o| match request.resized[axis] {
                    true => method.taps(o, axis, shape[axis], &request),
                    false => Ok(Some(vec![(o, 1.0)])),
                })
                .collect::<Result<_, _>>()
        })
        .collect::<Result<_, String>>()?;
    Ok((request, taps))
}

/// Resizes one axis of `values` (of `shape`): each output index along it is the weighted sum of
/// the input rows its taps name. One axis at a time is the separable form of the reference's
/// product of per-axis weights, and costs Σ taps per axis instead of Π taps per element. Taps
/// of weight 0 are skipped, so that a nearest pick of a finite value next to an infinite one
/// stays finite; an index outside the input (`None`) gives 0 here and
/// [`fill_outside`] its value.
fn resize_axis(values: &[f64], shape: &[usize], axis: usize, taps: &[Taps]) -> Vec<f64> {
    let inner: usize = shape[axis + 1..].iter().product();
    let width = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let mut out = vec![0.0f64; outer * taps.len() * inner];
    for (source, target) in values
        .chunks(width * inner)
        .zip(out.chunks_mut(taps.len() * inner))
    {
        for (row, index_taps) in target.chunks_mut(inner).zip(taps) {
            for &(i, weight) in index_taps.iter().flatten().filter(|tap| tap.1 != 0.0) {
                let from = &source[i * inner..(i + 1) * inner];
                for (o, &v) in row.iter_mut().zip(from) {
                    *o += weight * v;
                }
            }
        }
    }
    out
}

/// Per axis, the one input index each output index copies, when every output reads exactly
/// one input element with weight 1 (nearest, or linear at integer coordinates); `None` when
/// some output is a weighted sum or lies outside the input.
fn single_picks(taps: &[Vec<Taps>]) -> Option<Vec<Vec<usize>>> {
    taps.iter()
        .map(|axis| {
            axis.iter()
                .map(|t| {
                    let mut nonzero = t.as_ref()?.iter().filter(|tap| tap.1 != 0.0);
                    match (nonzero.next(), nonzero.next()) {
                        (Some(&(i, 1.0)), None) => Some(i),
                        _ => None,
                    }
                })
                .collect()
        })
        .collect()
}

/// Nearest resizing as a gather: output element (o₀, …, oₙ) is input element
/// (picks₀[o₀], …, picksₙ[oₙ]). The weighted sums of [`resize_axis`] give the same values, but
/// through f64 copies of every intermediate, 50× slower on a detector's 2× upsampling.
fn pick(x: &[f32], shape: &[usize], out_shape: &[usize], picks: &[Vec<usize>]) -> Vec<f32> {
    let rank = shape.len();
    let strides = strides_of(shape);
    let last = picks[rank - 1].as_slice();
    let row_len = out_shape[rank - 1];
    let rows: usize = out_shape[..rank - 1].iter().product();
    let mut out = Vec::with_capacity(rows * row_len);
    let mut index = vec![0usize; rank - 1];
    for _ in 0..rows {
        let base: usize = (0..rank - 1).map(|a| picks[a][index[a]] * strides[a]).sum();
        let source = &x[base..base + shape[rank - 1]];
        out.extend(last.iter().map(|&i| source[i]));
        // The next row: odometer over the outer axes, last fastest.
        for a in (0..rank - 1).rev() {
            index[a] += 1;
            if index[a] < out_shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}

/// Whether `taps` copy an axis of `width` unchanged (an axis "resized" by a scale of 1).
fn is_identity(taps: &[Taps], width: usize) -> bool {
    taps.len() == width
        && taps.iter().enumerate().all(|(o, t)| {
            t.as_ref().is_some_and(|t| {
                let mut nonzero = t.iter().filter(|tap| tap.1 != 0.0);
                nonzero.next() == Some(&(o, 1.0)) && nonzero.next().is_none()
            })
        })
}

/// Sets every element that some axis maps outside the input (tf_crop_and_resize) to
/// `extrapolation_value`.
fn fill_outside(out: &mut [f32], shape: &[usize], taps: &[Vec<Taps>], extrapolation: f32) {
    let strides = strides_of(shape);
    for (at, value) in out.iter_mut().enumerate() {
        let outside =
            (0..shape.len()).any(|axis| taps[axis][at / strides[axis] % shape[axis]].is_none());
        if outside {
            *value = extrapolation;
        }
    }
}

/// Output shape, scales and region of interest on every axis, from `sizes` or `scales` on the
/// `axes` attribute's axes.
fn request(ctx: &Ctx, inputs: &[Option<&HostTensor>], shape: &[usize]) -> Result<Request, String> {
    let rank = shape.len();
    let legacy = ctx.node.op_type == "Upsample" || ctx.opset < 11;
    let nonempty = |i: usize| optional(inputs, i).filter(|t| !t.is_empty());
    let (scales_given, sizes_given, roi_given) = if legacy {
        // Upsample 7 has its scales as an attribute, 9 and Resize 10 as input 1.
        let scales = match ctx.attr("scales") {
            Some(pipecut_ir::graph::Attribute::Floats(f)) => Some(f.clone()),
            _ => nonempty(1).map(HostTensor::to_f32_vec),
        };
        (scales, None, None)
    } else {
        (
            nonempty(2).map(HostTensor::to_f32_vec),
            nonempty(3).map(HostTensor::to_i64_vec),
            nonempty(1).map(HostTensor::to_f32_vec),
        )
    };
    let axes: Vec<usize> = match ctx.ints("axes") {
        Some(axes) => axes
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    let mut resized = vec![false; rank];
    for &axis in &axes {
        resized[axis] = true;
    }
    let mut roi = vec![(0.0, 1.0); rank];
    if let Some(values) = roi_given {
        if values.len() != 2 * axes.len() {
            return Err(format!(
                "roi has {} values for {} axes",
                values.len(),
                axes.len()
            ));
        }
        for (k, &axis) in axes.iter().enumerate() {
            roi[axis] = (f64::from(values[k]), f64::from(values[k + axes.len()]));
        }
    }
    let mut out_shape = shape.to_vec();
    let mut scales = vec![1.0; rank];
    match (sizes_given, scales_given) {
        (Some(sizes), _) => from_sizes(ctx, &sizes, &axes, shape, (&mut out_shape, &mut scales))?,
        (None, Some(given)) => from_scales(&given, &axes, shape, (&mut out_shape, &mut scales))?,
        (None, None) => return Err("Resize needs scales or sizes".into()),
    }
    Ok(Request {
        out_shape,
        scales,
        roi,
        resized,
    })
}

/// The output size and scale of each of `axes` from `sizes`, under the
/// `keep_aspect_ratio_policy`.
fn from_sizes(
    ctx: &Ctx,
    sizes: &[i64],
    axes: &[usize],
    shape: &[usize],
    (out_shape, scales): (&mut [usize], &mut [f64]),
) -> Result<(), String> {
    if sizes.len() != axes.len() {
        return Err(format!(
            "sizes has {} values for {} axes",
            sizes.len(),
            axes.len()
        ));
    }
    for (k, &axis) in axes.iter().enumerate() {
        let size = usize::try_from(sizes[k])
            .map_err(|_| format!("sizes has a negative entry {}", sizes[k]))?;
        out_shape[axis] = size;
        scales[axis] = size as f64 / shape[axis] as f64;
    }
    let policy = ctx.string("keep_aspect_ratio_policy", "stretch");
    let pick = match policy.as_str() {
        "stretch" => None,
        "not_larger" => Some(f64::min as fn(f64, f64) -> f64),
        "not_smaller" => Some(f64::max as fn(f64, f64) -> f64),
        other => return Err(format!("unknown keep_aspect_ratio_policy '{other}'")),
    };
    if let Some(pick) = pick {
        let scale = axes.iter().map(|&a| scales[a]).reduce(pick).unwrap_or(1.0);
        for &axis in axes {
            scales[axis] = scale;
            // Rounded half up, as the reference does.
            out_shape[axis] = (scale * shape[axis] as f64 + 0.5) as usize;
        }
    }
    Ok(())
}

/// The output size and scale of each of `axes` from the `given` scales.
fn from_scales(
    given: &[f32],
    axes: &[usize],
    shape: &[usize],
    (out_shape, scales): (&mut [usize], &mut [f64]),
) -> Result<(), String> {
    if given.len() != axes.len() {
        return Err(format!(
            "scales has {} values for {} axes",
            given.len(),
            axes.len()
        ));
    }
    for (k, &axis) in axes.iter().enumerate() {
        let scale = f64::from(given[k]);
        if !(scale > 0.0 && scale.is_finite()) {
            return Err(format!("scale {scale} is not positive"));
        }
        scales[axis] = scale;
        out_shape[axis] = (scale * shape[axis] as f64) as usize;
    }
    Ok(())
}

/// How a resized axis maps and weights its source elements.
struct Method {
    mode: String,
    nearest_mode: String,
    cubic_a: f64,
    antialias: bool,
    exclude_outside: bool,
    coordinates: String,
}

impl Method {
    /// The (input index, weight) pairs of output index `o` on `axis` (of input size `width`),
    /// or `None` for a coordinate outside the input under tf_crop_and_resize.
    fn taps(&self, o: usize, axis: usize, width: usize, request: &Request) -> Result<Taps, String> {
        let Some(x) = self.source(o, axis, width, request)? else {
            return Ok(None);
        };
        let floor = x.floor();
        // In (0, 1]: the reference prefers the left neighbour.
        let ratio = if x == floor { 1.0 } else { x - floor };
        let mut coeffs = self.coefficients(ratio, request.scales[axis])?;
        let n = coeffs.len();
        let neighbours = nearest_indices(x, n, width);
        if self.exclude_outside {
            for (c, &i) in coeffs.iter_mut().zip(&neighbours) {
                if i < 0 || i >= width as i64 {
                    *c = 0.0;
                }
            }
            let sum: f64 = coeffs.iter().sum();
            if sum != 0.0 {
                coeffs.iter_mut().for_each(|c| *c /= sum);
            }
        }
        let last = width as i64 - 1;
        Ok(Some(
            neighbours
                .iter()
                .zip(coeffs)
                .map(|(&i, c)| (i.clamp(0, last) as usize, c))
                .collect(),
        ))
    }

    /// The source coordinate of output index `o`.
    fn source(
        &self,
        o: usize,
        axis: usize,
        width: usize,
        request: &Request,
    ) -> Result<Option<f64>, String> {
        let (o, input) = (o as f64, width as f64);
        let scale = request.scales[axis];
        let output = scale * input;
        let output_int = request.out_shape[axis] as f64;
        Ok(Some(match self.coordinates.as_str() {
            "align_corners" if output == 1.0 => 0.0,
            "align_corners" => o * (input - 1.0) / (output - 1.0),
            "asymmetric" => o / scale,
            "tf_crop_and_resize" => {
                let (start, end) = request.roi[axis];
                let x = if output == 1.0 {
                    (end - start) * (input - 1.0) / 2.0
                } else {
                    o * (end - start) * (input - 1.0) / (output - 1.0)
                } + start * (input - 1.0);
                if x < 0.0 || x > input - 1.0 {
                    return Ok(None);
                }
                x
            }
            "pytorch_half_pixel" if output == 1.0 => -0.5,
            "pytorch_half_pixel" | "half_pixel" => (o + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let adjustment = output_int / output;
                let offset = input / 2.0 * (1.0 - adjustment);
                offset + (o + 0.5) / scale - 0.5
            }
            other => return Err(format!("unknown coordinate_transformation_mode '{other}'")),
        }))
    }

    /// The weights of the neighbours of a coordinate `ratio` past its left neighbour.
    fn coefficients(&self, ratio: f64, scale: f64) -> Result<Vec<f64>, String> {
        Ok(match (self.mode.as_str(), self.antialias) {
            ("nearest", _) => {
                let right = match self.nearest_mode.as_str() {
                    _ if ratio == 1.0 => true,
                    "round_prefer_floor" => ratio > 0.5,
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => false,
                    "ceil" => true,
                    other => return Err(format!("unknown nearest_mode '{other}'")),
                };
                vec![f64::from(u8::from(!right)), f64::from(u8::from(right))]
            }
            ("linear", false) => vec![1.0 - ratio, ratio],
            ("linear", true) => {
                let scale = scale.min(1.0);
                let start = (-1.0 / scale).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                normalised(
                    (start..start + footprint)
                        .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0)),
                )
            }
            ("cubic", false) => {
                let a = self.cubic_a;
                let (r, s) = (ratio, 1.0 - ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
                    ((a * (s + 1.0) - 5.0 * a) * (s + 1.0) + 8.0 * a) * (s + 1.0) - 4.0 * a,
                ]
            }
            ("cubic", true) => {
                let scale = scale.min(1.0);
                let start = (-2.0 / scale).floor() as i64 + 1;
                let end = 2 - start;
                normalised(
                    (start..end).map(|i| cubic_kernel(scale * (i as f64 - ratio), self.cubic_a)),
                )
            }
            (other, _) => return Err(format!("Resize mode '{other}' is not supported")),
        })
    }
}

/// Keys' cubic convolution kernel with parameter `a`.
fn cubic_kernel(x: f64, a: f64) -> f64 {
    let x = x.abs();
    let (x2, x3) = (x * x, x * x * x);
    if x <= 1.0 {
        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
    } else if x < 2.0 {
        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

fn normalised(weights: impl Iterator<Item = f64>) -> Vec<f64> {
    let weights: Vec<f64> = weights.collect();
    let sum: f64 = weights.iter().sum();
    weights.into_iter().map(|w| w / sum).collect()
}

/// The `n` indices nearest to `x` among those of the input padded by `⌈n/2⌉` on each side
/// (ties to the smaller index), ascending: they may lie outside `0..width`.
fn nearest_indices(x: f64, n: usize, width: usize) -> Vec<i64> {
    let pad = n.div_ceil(2) as i64;
    let centre = x.floor() as i64;
    let mut candidates: Vec<i64> = (centre - n as i64..=centre + n as i64 + 1)
        .filter(|&i| i >= -pad && i < width as i64 + pad)
        .collect();
    candidates.sort_by(|&a, &b| {
        (x - a as f64)
            .abs()
            .total_cmp(&(x - b as f64).abs())
            .then(a.cmp(&b))
    });
    candidates.truncate(n);
    candidates.sort_unstable();
    candidates
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};
    use super::{nearest_indices, pick, resize_axis, single_picks, Taps};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn the_nearest_gather_equals_the_weighted_sums() {
        // A 2 × 3 × 4 input, every axis resized by a different nearest mapping (up, down, and
        // one that repeats and skips), computed both ways.
        let shape = [2usize, 3, 4];
        let x: Vec<f32> = (0..24).map(|v| v as f32 * 0.5 - 3.0).collect();
        let maps: [Vec<usize>; 3] = [vec![1, 0, 0, 1], vec![2, 0], vec![0, 0, 1, 3, 3, 2, 1]];
        let taps: Vec<Vec<Taps>> = maps
            .iter()
            .map(|m| m.iter().map(|&i| Some(vec![(i, 1.0), (0, 0.0)])).collect())
            .collect();
        let out_shape: Vec<usize> = maps.iter().map(Vec::len).collect();
        let picks = single_picks(&taps).expect("one weight-1 tap per output");
        let gathered = pick(&x, &shape, &out_shape, &picks);
        let mut values: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let mut current = shape.to_vec();
        for axis in 0..3 {
            values = resize_axis(&values, &current, axis, &taps[axis]);
            current[axis] = out_shape[axis];
        }
        let summed: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
        assert_eq!(gathered, summed);
        // A weighted tap or an outside index is no single pick.
        assert!(single_picks(&[vec![Some(vec![(0, 0.5), (1, 0.5)])]]).is_none());
        assert!(single_picks(&[vec![None]]).is_none());
    }

    #[test]
    fn neighbours_prefer_the_left_as_the_reference_does() {
        // The reference's own examples (`_get_neighbor_idxes`), on a wide input.
        assert_eq!(nearest_indices(4.0, 2, 10), vec![3, 4]);
        assert_eq!(nearest_indices(4.5, 3, 10), vec![3, 4, 5]);
        assert_eq!(nearest_indices(4.6, 3, 10), vec![4, 5, 6]);
        assert_eq!(nearest_indices(0.2, 4, 10), vec![-1, 0, 1, 2]);
    }

    #[test]
    fn nearest_linear_and_cubic_upsampling() {
        let x = f(&[1, 2], &[1.0, 2.0]);
        let empty = f(&[0], &[]);
        let scales = f(&[2], &[1.0, 2.0]);
        let r = run("Resize", vec![], &[&x, &empty, &scales]);
        assert_close(&r[0], &[1, 4], &[1.0, 1.0, 2.0, 2.0]);
        let linear = vec![("mode", Attribute::String("linear".into()))];
        let r = run("Resize", linear, &[&x, &empty, &scales]);
        assert_close(&r[0], &[1, 4], &[1.0, 1.25, 1.75, 2.0]);
        // Cubic on a constant is the constant (the coefficients sum to 1).
        let c = f(&[1, 3], &[5.0, 5.0, 5.0]);
        let cubic = vec![("mode", Attribute::String("cubic".into()))];
        let r = run("Resize", cubic, &[&c, &empty, &f(&[2], &[1.0, 2.0])]);
        assert_close(&r[0], &[1, 6], &[5.0; 6]);
        // `axes` with sizes: only the last axis is resized.
        let axes = vec![("axes", Attribute::Ints(vec![1]))];
        let r = run("Resize", axes, &[&x, &empty, &empty, &i(&[1], &[4])]);
        assert_close(&r[0], &[1, 4], &[1.0, 1.0, 2.0, 2.0]);
    }
}
