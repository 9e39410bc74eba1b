//! Pooling over any number of spatial axes: LpPool (every rank) and MaxPool / AveragePool over
//! three spatial axes, MaxPool with its `Indices` output or over integers (the 1-D and 2-D float
//! forms keep their faster path in `conv.rs`, which hands the others here).
//!
//! Specs: <https://onnx.ai/onnx/operators/onnx__LpPool.html> (opsets 2–22: `p`, dilations from
//! 18, `ceil_mode` from 18), <https://onnx.ai/onnx/operators/onnx__MaxPool.html> and
//! <https://onnx.ai/onnx/operators/onnx__AveragePool.html> (opsets 7–22). Output sizes follow the
//! specs' formulas, including the ceil-mode rule that drops a last window starting in the end
//! padding; `auto_pad` SAME_UPPER puts the odd padding at the end, SAME_LOWER at the start.

use super::context::{input, Ctx, KernelResult};
use super::indexing::checked_size;
use crate::tensor::{strides_of, HostTensor};

/// Window geometry along one spatial axis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axis {
    pub(crate) input: usize,
    pub(crate) kernel: usize,
    pub(crate) stride: usize,
    pub(crate) dilation: usize,
    pub(crate) pad_begin: usize,
    pub(crate) pad_end: usize,
    pub(crate) output: usize,
}

fn attr_list(ctx: &Ctx, name: &str, rank: usize, default: usize) -> Result<Vec<usize>, String> {
    match ctx.ints(name) {
        None => Ok(vec![default; rank]),
        Some(v) if v.len() == rank => v
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| format!("{name} has a negative entry {x}")))
            .collect(),
        Some(v) => Err(format!(
            "{name} has {} entries for {rank} spatial axes",
            v.len()
        )),
    }
}

/// The geometry of every spatial axis of `input` (`[N, C, spatial...]`); the CUDA backend's
/// pools share it.
pub(crate) fn geometry(ctx: &Ctx, spatial: &[usize]) -> Result<Vec<Axis>, String> {
    let rank = spatial.len();
    let kernel = attr_list(ctx, "kernel_shape", rank, 0)?;
    if ctx.ints("kernel_shape").is_none() || kernel.contains(&0) {
        return Err("kernel_shape is required and must be positive".into());
    }
    let stride = attr_list(ctx, "strides", rank, 1)?;
    let dilation = attr_list(ctx, "dilations", rank, 1)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err("strides and dilations must be positive".into());
    }
    let pads = attr_list(ctx, "pads", 2 * rank, 0)?;
    let ceil = ctx.int("ceil_mode", 0) != 0;
    let auto_pad = ctx.string("auto_pad", "NOTSET");
    (0..rank)
        .map(|i| {
            let extent = (kernel[i] - 1) * dilation[i] + 1;
            let (input, s) = (spatial[i], stride[i]);
            let (pad_begin, pad_end, output) = match auto_pad.as_str() {
                "SAME_UPPER" | "SAME_LOWER" => {
                    let output = input.div_ceil(s);
                    let total = ((output.saturating_sub(1)) * s + extent).saturating_sub(input);
                    let small = total / 2;
                    if auto_pad == "SAME_UPPER" {
                        (small, total - small, output)
                    } else {
                        (total - small, small, output)
                    }
                }
                "VALID" | "NOTSET" => {
                    let (pb, pe) = if auto_pad == "VALID" {
                        (0, 0)
                    } else {
                        (pads[i], pads[i + rank])
                    };
                    let padded = input + pb + pe;
                    if padded < extent {
                        return Err(format!(
                            "window of {extent} exceeds the padded input of {padded}"
                        ));
                    }
                    let span = padded - extent;
                    let mut output = if ceil { span.div_ceil(s) } else { span / s } + 1;
                    // A ceil-mode window must start inside the input or its begin padding.
                    if ceil && (output - 1) * s >= input + pb {
                        output -= 1;
                    }
                    (pb, pe, output)
                }
                other => return Err(format!("unknown auto_pad '{other}'")),
            };
            Ok(Axis {
                input,
                kernel: kernel[i],
                stride: s,
                dilation: dilation[i],
                pad_begin,
                pad_end,
                output,
            })
        })
        .collect()
}

/// Advances a row-major multi-index over `dims`; false when it wraps to all zeros.
fn next_index(index: &mut [usize], dims: impl Fn(usize) -> usize) -> bool {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < dims(d) {
            return true;
        }
        index[d] = 0;
    }
    false
}

/// MaxPool, AveragePool and LpPool over `[N, C, spatial...]` of any spatial rank.
pub(super) fn pool_nd(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(format!("expected [N, C, spatial...], got {:?}", x.shape()));
    }
    let op = ctx.node.op_type.as_str();
    let integer = !x.dtype().is_float();
    if integer && op != "MaxPool" {
        return Err(format!("{op} takes floats, got {}", x.dtype()));
    }
    let column_major = ctx.int("storage_order", 0) != 0;
    let spatial = &x.shape()[2..];
    let axes = geometry(ctx, spatial)?;
    let planes: usize = x.shape()[..2].iter().product();
    let plane_len: usize = spatial.iter().product();
    let strides = strides_of(spatial);
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(axes.iter().map(|a| a.output));
    let total = checked_size(&shape)?;
    let include_pad = ctx.int("count_include_pad", 0) != 0;
    let p = ctx.int("p", 2) as f32;
    // MaxPool over 8- to 32-bit integers is exact in f32 (|v| < 2^24 for those up to 16 bits;
    // int32 beyond that is refused below rather than rounded).
    let values = x.to_f32_vec();
    if integer && values.iter().any(|v| v.abs() >= (1u32 << 24) as f32) {
        return Err("integer MaxPool values beyond 2^24 in magnitude are not supported".into());
    }
    // Indices (MaxPool's second output) count in the whole input, row-major or, with
    // storage_order 1, column-major within each plane.
    let index_strides: Vec<usize> = if column_major {
        let mut s = vec![1usize; spatial.len()];
        for d in 1..spatial.len() {
            s[d] = s[d - 1] * spatial[d - 1];
        }
        s
    } else {
        strides.clone()
    };
    let rank = axes.len();
    let mut out = Vec::with_capacity(total);
    let mut indices = Vec::with_capacity(total);
    for (plane_index, plane) in values.chunks(plane_len.max(1)).take(planes).enumerate() {
        let mut position = vec![0usize; rank];
        loop {
            let (mut max, mut sum, mut count) = (f32::NEG_INFINITY, 0.0f32, 0usize);
            let mut argmax = 0usize;
            let mut tap = vec![0usize; rank];
            loop {
                let (mut offset, mut index_offset) = (0, 0);
                let (mut inside, mut in_padding) = (true, true);
                for (d, a) in axes.iter().enumerate() {
                    let coord = (position[d] * a.stride + tap[d] * a.dilation) as isize
                        - a.pad_begin as isize;
                    if coord < 0 || coord >= a.input as isize {
                        inside = false;
                        in_padding &= coord < (a.input + a.pad_end) as isize;
                    } else {
                        offset += coord as usize * strides[d];
                        index_offset += coord as usize * index_strides[d];
                    }
                }
                if inside {
                    let v = plane[offset];
                    if v > max {
                        (max, argmax) = (v, plane_index * plane_len + index_offset);
                    }
                    sum += if op == "LpPool" { v.abs().powf(p) } else { v };
                    count += 1;
                } else if include_pad && in_padding {
                    count += 1;
                }
                if !next_index(&mut tap, |d| axes[d].kernel) {
                    break;
                }
            }
            indices.push(argmax as i64);
            out.push(match op {
                "MaxPool" => max,
                "LpPool" => sum.powf(1.0 / p),
                _ if count == 0 => 0.0,
                _ => sum / count as f32,
            });
            if !next_index(&mut position, |d| axes[d].output) {
                break;
            }
        }
    }
    let pooled = HostTensor::f32(shape.clone(), out);
    let pooled = if integer {
        pooled.cast(x.dtype())?
    } else {
        pooled
    };
    Ok(vec![pooled, HostTensor::i64(shape, indices)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn lp_pool_and_3d_average_pool() {
        let x = f(&[1, 1, 4], &[3.0, 4.0, -6.0, 8.0]);
        let out = run(
            "LpPool",
            vec![
                ("kernel_shape", Attribute::Ints(vec![2])),
                ("strides", Attribute::Ints(vec![2])),
            ],
            &[&x],
        );
        assert_close(&out[0], &[1, 1, 2], &[5.0, 10.0]);
        let cube = f(&[1, 1, 2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let out = run(
            "AveragePool",
            vec![("kernel_shape", Attribute::Ints(vec![2, 2, 2]))],
            &[&cube],
        );
        assert_close(&out[0], &[1, 1, 1, 1, 1], &[4.5]);
        let out = run(
            "MaxPool",
            vec![
                ("kernel_shape", Attribute::Ints(vec![1, 1, 2])),
                ("pads", Attribute::Ints(vec![0, 0, 1, 0, 0, 0])),
            ],
            &[&cube],
        );
        assert_close(
            &out[0],
            &[1, 1, 2, 2, 2],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        );
    }
}
