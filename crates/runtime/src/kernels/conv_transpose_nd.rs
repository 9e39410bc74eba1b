//! [ConvTranspose](https://onnx.ai/onnx/operators/onnx__ConvTranspose.html) (opsets 1–22) in any
//! number of spatial dims, with `auto_pad = SAME_UPPER/SAME_LOWER` and `output_shape`: the
//! cases the GEMM-based 1-D/2-D kernel in `conv.rs` leaves to this one. The output geometry is
//! the ONNX reference's (`op_conv_transpose.py`): an explicit `output_shape` without
//! `auto_pad` is the output's size with the given (or zero) pads, the pads a SAME mode derives
//! from it split with the odd unit at the end (UPPER) or the start (LOWER).
//!
//! # Complexity
//! O(N · C_in · M/group · Π input · Π kernel) multiply-adds, scattered directly.

use super::context::{input, optional, Ctx, KernelResult};
use super::indexing::checked_size;
use crate::tensor::{strides_of, try_zeros_f32, HostTensor};

/// The spatial geometry: kernel, strides, dilations, leading pads and output size per axis.
pub(crate) struct Geometry {
    pub(crate) kernel: Vec<usize>,
    pub(crate) strides: Vec<usize>,
    pub(crate) dilations: Vec<usize>,
    pub(crate) pad_begin: Vec<i64>,
    pub(crate) output: Vec<usize>,
}

fn positive(ctx: &Ctx, name: &str, n: usize) -> Result<Vec<usize>, String> {
    match ctx.ints(name) {
        Some(v) if v.len() >= n && v[..n].iter().all(|&d| d > 0) => {
            Ok(v[..n].iter().map(|&d| d as usize).collect())
        }
        Some(v) => Err(format!("'{name}' {v:?} needs {n} positive entries")),
        None => Ok(vec![1; n]),
    }
}

/// The output geometry of the node over spatial `input` sizes and `kernel` sizes, checked; the
/// CUDA backend's ConvTranspose takes the same.
pub(crate) fn geometry(ctx: &Ctx, input: &[usize], kernel: &[usize]) -> Result<Geometry, String> {
    let n = input.len();
    let strides = positive(ctx, "strides", n)?;
    let dilations = positive(ctx, "dilations", n)?;
    let output_padding = ctx.ints("output_padding").unwrap_or_else(|| vec![0; n]);
    if output_padding.len() < n {
        return Err(format!(
            "output_padding {output_padding:?} has fewer than {n} entries"
        ));
    }
    // The size with no padding at all: every input position's full kernel footprint. Kept
    // below 2^61 so that the positions computed from it cannot overflow.
    let overflow = || "the strides, dilations or sizes overflow".to_string();
    let full: Vec<i64> = (0..n)
        .map(|i| {
            let reach = (kernel[i] as i64 - 1).checked_mul(dilations[i] as i64)? + 1;
            let size = (input[i] as i64 - 1)
                .checked_mul(strides[i] as i64)?
                .checked_add(output_padding[i])?
                .checked_add(reach)?;
            (size.abs() < 1 << 61).then_some(size)
        })
        .collect::<Option<_>>()
        .ok_or_else(overflow)?;
    let auto_pad = ctx.string("auto_pad", "NOTSET");
    let same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    let pads = ctx.ints("pads");
    let requested = ctx
        .ints("output_shape")
        .map(|s| s[s.len().saturating_sub(n)..].to_vec());
    let (pad_begin, output): (Vec<i64>, Vec<i64>) = match (pads, same) {
        (None, true) => {
            let target = match requested {
                Some(t) => t,
                None => (0..n)
                    .map(|i| (input[i] as i64).checked_mul(strides[i] as i64))
                    .collect::<Option<_>>()
                    .ok_or_else(overflow)?,
            };
            let begin = (0..n)
                .map(|i| {
                    let total = full[i].checked_sub(*target.get(i)?)?;
                    Some(if auto_pad == "SAME_UPPER" {
                        total.div_euclid(2)
                    } else {
                        total - total.div_euclid(2)
                    })
                })
                .collect::<Option<_>>()
                .ok_or_else(overflow)?;
            (begin, target)
        }
        (pads, _) => {
            let pads = pads.unwrap_or_else(|| vec![0; 2 * n]);
            if pads.len() != 2 * n {
                return Err(format!("pads {pads:?} need {} entries", 2 * n));
            }
            let output = match requested {
                Some(t) => t,
                None => (0..n)
                    .map(|i| full[i].checked_sub(pads[i])?.checked_sub(pads[i + n]))
                    .collect::<Option<_>>()
                    .ok_or_else(overflow)?,
            };
            (pads[..n].to_vec(), output)
        }
    };
    if output.len() != n || output.iter().any(|&d| d < 0) {
        return Err(format!("the output size {output:?} is not {n} sizes ≥ 0"));
    }
    Ok(Geometry {
        kernel: kernel.to_vec(),
        strides,
        dilations,
        pad_begin,
        output: output.iter().map(|&d| d as usize).collect(),
    })
}

/// Calls `f(flat index, coordinates)` for every point of a box of `shape`, row-major.
fn for_each_point(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let total: usize = shape.iter().product();
    let mut point = vec![0usize; shape.len()];
    for flat in 0..total {
        f(flat, &point);
        for axis in (0..shape.len()).rev() {
            point[axis] += 1;
            if point[axis] < shape[axis] {
                break;
            }
            point[axis] = 0;
        }
    }
}

pub(super) fn conv_transpose_nd(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!(
            "input {xs:?} and weight {ws:?} must be [N, C, ...] alike"
        ));
    }
    let group = usize::try_from(ctx.int("group", 1))
        .ok()
        .filter(|&g| g > 0 && xs[1] % g == 0 && ws[0] == xs[1])
        .ok_or_else(|| format!("input {xs:?}, weight {ws:?} and group do not agree"))?;
    let (batch, channels, per_group_out) = (xs[0], xs[1], ws[1]);
    let (per_group_in, out_channels) = (channels / group, per_group_out * group);
    let spatial = &xs[2..];
    let geo = geometry(ctx, spatial, &ws[2..])?;
    let out_points = checked_size(&geo.output)?;
    let in_points = checked_size(spatial)?;
    let kernel_points = checked_size(&geo.kernel)?;
    let mut out = try_zeros_f32(&[checked_size(&[batch, out_channels, out_points])?])?;
    let out_strides = strides_of(&geo.output);
    // For each (input point, kernel point), the output point it lands on, if inside.
    let mut targets = vec![None; checked_size(&[in_points, kernel_points])?];
    for_each_point(spatial, |i, at| {
        for_each_point(&geo.kernel, |k, tap| {
            let mut flat = 0usize;
            for axis in 0..at.len() {
                let pos = (at[axis] * geo.strides[axis] + tap[axis] * geo.dilations[axis]) as i64;
                let pos = pos.saturating_sub(geo.pad_begin[axis]);
                if pos < 0 || pos >= geo.output[axis] as i64 {
                    return;
                }
                flat += pos as usize * out_strides[axis];
            }
            targets[i * kernel_points + k] = Some(flat);
        });
    });
    let (xv, wv) = (x.to_f32_vec(), w.to_f32_vec());
    for b in 0..batch {
        for c in 0..channels {
            let g = c / per_group_in;
            let xc = &xv[(b * channels + c) * in_points..][..in_points];
            for oc in 0..per_group_out {
                let m = g * per_group_out + oc;
                let wk = &wv[(c * per_group_out + oc) * kernel_points..][..kernel_points];
                let plane = &mut out[(b * out_channels + m) * out_points..][..out_points];
                for (i, &xi) in xc.iter().enumerate() {
                    for (k, &wi) in wk.iter().enumerate() {
                        if let Some(o) = targets[i * kernel_points + k] {
                            plane[o] += xi * wi;
                        }
                    }
                }
            }
        }
    }
    if let Some(bias) = optional(inputs, 2) {
        let bias = bias.to_f32_vec();
        if bias.len() != out_channels {
            return Err(format!(
                "bias has {} entries for {out_channels} channels",
                bias.len()
            ));
        }
        for (p, plane) in out.chunks_mut(out_points.max(1)).enumerate() {
            plane.iter_mut().for_each(|v| *v += bias[p % out_channels]);
        }
    }
    let mut shape = vec![batch, out_channels];
    shape.extend(&geo.output);
    Ok(vec![HostTensor::f32(shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn same_upper_gives_input_times_stride() {
        let x = f(&[1, 1, 2], &[1.0, 2.0]);
        let w = f(&[1, 1, 3], &[1.0, 1.0, 1.0]);
        let out = run(
            "ConvTranspose",
            vec![
                ("auto_pad", Attribute::String("SAME_UPPER".into())),
                ("strides", Attribute::Ints(vec![2])),
            ],
            &[&x, &w],
        );
        // Full output [1, 1, 3, 2, 2] (size 5), total padding 1: none at the start.
        assert_close(&out[0], &[1, 1, 4], &[1.0, 1.0, 3.0, 2.0]);
    }
}
