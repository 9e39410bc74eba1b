//! Ops that place input elements (or constants) at computed output positions: DepthToSpace and
//! SpaceToDepth (<https://onnx.ai/onnx/operators/onnx__DepthToSpace.html>, DCR and CRD modes),
//! ReverseSequence, EyeLike and OneHot. Every dtype: the data moves through [`take`].

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::{checked_size, normalize_axis, take};
use crate::tensor::{strides_of, HostTensor, TensorData};
use pipecut_ir::graph::DType;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["DepthToSpace"], depth_to_space);
    t.add(&["SpaceToDepth"], space_to_depth);
    t.add(&["ReverseSequence"], reverse_sequence);
    t.add(&["EyeLike"], eye_like);
    t.add(&["OneHot"], one_hot);
}

/// `[N, C, H, W]` and the block size, checked.
fn image(ctx: &Ctx, x: &HostTensor) -> Result<([usize; 4], usize), String> {
    let b = usize::try_from(ctx.int("blocksize", 0))
        .ok()
        .filter(|&b| b > 0)
        .ok_or("blocksize must be at least 1")?;
    match *x.shape() {
        [n, c, h, w] => Ok(([n, c, h, w], b)),
        _ => Err(format!("expected [N, C, H, W], got {:?}", x.shape())),
    }
}

fn depth_to_space(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let ([n, c, h, w], b) = image(ctx, x)?;
    if c % (b * b) != 0 {
        return Err(format!(
            "{c} channels do not divide by blocksize² = {}",
            b * b
        ));
    }
    let co = c / (b * b);
    let crd = ctx.string("mode", "DCR") == "CRD";
    let out_shape = vec![n, co, h * b, w * b];
    let mut offsets = Vec::with_capacity(checked_size(&out_shape)?);
    for ni in 0..n {
        for ci in 0..co {
            for y in 0..h * b {
                for xo in 0..w * b {
                    let (i, j) = (y % b, xo % b);
                    let channel = if crd {
                        ci * b * b + i * b + j
                    } else {
                        (i * b + j) * co + ci
                    };
                    offsets.push(((ni * c + channel) * h + y / b) * w + xo / b);
                }
            }
        }
    }
    Ok(vec![HostTensor::with_data(
        out_shape,
        take(x.data(), &offsets)?,
    )])
}

fn space_to_depth(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let ([n, c, h, w], b) = image(ctx, x)?;
    if h % b != 0 || w % b != 0 {
        return Err(format!("{h} × {w} does not divide by blocksize {b}"));
    }
    let (ho, wo) = (h / b, w / b);
    let out_shape = vec![n, c * b * b, ho, wo];
    // DCR (the default) puts the block offset outermost in the output channel, CRD (opset 25)
    // the input channel.
    let crd = match ctx.string("mode", "DCR").as_str() {
        "DCR" => false,
        "CRD" => true,
        other => return Err(format!("unknown mode '{other}' (DCR or CRD)")),
    };
    let mut offsets = Vec::with_capacity(checked_size(&out_shape)?);
    for ni in 0..n {
        for channel in 0..c * b * b {
            let (block, ci) = if crd {
                (channel % (b * b), channel / (b * b))
            } else {
                (channel / c, channel % c)
            };
            let (i, j) = (block / b, block % b);
            for y in 0..ho {
                for xo in 0..wo {
                    offsets.push(((ni * c + ci) * h + y * b + i) * w + xo * b + j);
                }
            }
        }
    }
    Ok(vec![HostTensor::with_data(
        out_shape,
        take(x.data(), &offsets)?,
    )])
}

/// Reverses the first `sequence_lens[b]` elements along `time_axis` of each batch entry.
fn reverse_sequence(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let lens = input(inputs, 1)?.to_i64_vec();
    let shape = x.shape();
    let time = normalize_axis(ctx.int("time_axis", 0), shape.len())?;
    let batch = normalize_axis(ctx.int("batch_axis", 1), shape.len())?;
    if time == batch || shape.len() < 2 {
        return Err("time_axis and batch_axis must be two different axes".into());
    }
    if lens.len() != shape[batch] {
        return Err(format!(
            "sequence_lens has {} entries for a batch of {}",
            lens.len(),
            shape[batch]
        ));
    }
    let strides = strides_of(shape);
    let total = x.len();
    let offsets: Vec<usize> = (0..total)
        .map(|flat| {
            let t = (flat / strides[time]) % shape[time];
            let b = (flat / strides[batch]) % shape[batch];
            let len = lens[b].clamp(0, shape[time] as i64) as usize;
            if t < len {
                flat - t * strides[time] + (len - 1 - t) * strides[time]
            } else {
                flat
            }
        })
        .collect();
    Ok(vec![HostTensor::with_data(
        shape.to_vec(),
        take(x.data(), &offsets)?,
    )])
}

/// Ones on the diagonal `k` (above the main one for k > 0) of a 2-D tensor shaped like the
/// input, in `dtype` (the input's by default).
fn eye_like(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let &[rows, cols] = x.shape() else {
        return Err(format!("EyeLike needs a 2-D input, got {:?}", x.shape()));
    };
    let k = ctx.int("k", 0);
    let on = |r: usize, c: usize| c as i64 - r as i64 == k;
    let dtype = match ctx.attr("dtype") {
        Some(_) => DType::from_onnx(ctx.int("dtype", 1) as i32).ok_or("unknown dtype")?,
        None => ctx
            .output_dtypes
            .first()
            .copied()
            .flatten()
            .unwrap_or(x.dtype()),
    };
    let ones: Vec<f32> = (0..rows * cols)
        .map(|i| f32::from(u8::from(on(i / cols, i % cols))))
        .collect();
    Ok(vec![HostTensor::f32(vec![rows, cols], ones).cast(dtype)?])
}

/// `values[1]` where the index matches the position along the new `axis` of size `depth`,
/// `values[0]` elsewhere; negative indices count from the end, others out of range match
/// nothing.
fn one_hot(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let indices = input(inputs, 0)?;
    let depth = match input(inputs, 1)?.to_f32_vec()[..] {
        [d] if d >= 1.0 => d as usize,
        _ => return Err("depth must be a scalar of at least 1".into()),
    };
    let values = input(inputs, 2)?;
    if values.len() != 2 {
        return Err(format!(
            "values must hold [off, on], got {} values",
            values.len()
        ));
    }
    let rank = indices.rank() + 1;
    let axis = normalize_axis(ctx.int("axis", -1), rank)?;
    let mut shape = indices.shape().to_vec();
    shape.insert(axis, depth);
    let inner: usize = indices.shape()[axis..].iter().product();
    let index = indices.to_f32_vec();
    let total = checked_size(&shape)?;
    let offsets: Vec<usize> = (0..total)
        .map(|flat| {
            let (o, rest) = (flat / (depth * inner), flat % (depth * inner));
            let (d, i) = (rest / inner, rest % inner);
            let mut hot = index[o * inner + i] as i64;
            if hot < 0 {
                hot += depth as i64;
            }
            usize::from(hot == d as i64)
        })
        .collect();
    let data: TensorData = take(values.data(), &offsets)?;
    Ok(vec![HostTensor::with_data(shape, data)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn depth_to_space_inverts_space_to_depth_in_dcr_mode() {
        let x = f(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let block = || vec![("blocksize", Attribute::Int(2))];
        let packed = run("SpaceToDepth", block(), &[&x]);
        assert_close(&packed[0], &[1, 4, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
        let unpacked = run("DepthToSpace", block(), &[&packed[0]]);
        assert_close(&unpacked[0], &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn one_hot_eye_like_and_reverse_sequence() {
        let hot = run(
            "OneHot",
            vec![],
            &[&i(&[2], &[1, -1]), &i(&[], &[3]), &f(&[2], &[0.0, 5.0])],
        );
        assert_close(&hot[0], &[2, 3], &[0.0, 5.0, 0.0, 0.0, 0.0, 5.0]);
        let eye = run(
            "EyeLike",
            vec![("k", Attribute::Int(1))],
            &[&f(&[2, 3], &[0.0; 6])],
        );
        assert_close(&eye[0], &[2, 3], &[0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        // [time 3, batch 2]: batch 0 reverses 3 steps, batch 1 two.
        let x = f(&[3, 2], &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        let r = run("ReverseSequence", vec![], &[&x, &i(&[2], &[3, 2])]);
        assert_close(&r[0], &[3, 2], &[3.0, 20.0, 2.0, 10.0, 1.0, 30.0]);
    }
}
