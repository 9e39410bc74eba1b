//! Normalisations (inference semantics).
//!
//! Specs: <https://onnx.ai/onnx/operators/> (BatchNormalization, LayerNormalization (opset 17),
//! InstanceNormalization, RMSNormalization (opset 23)), opsets 7 to 23. Statistics accumulate in f64: layer norms over a few
//! hundred features then match onnxruntime to well under the tolerance the tests state.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::fast_math;
use super::indexing::normalize_axis;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["BatchNormalization"], batch_norm);
    t.add(&["LayerNormalization"], layer_norm);
    t.add(&["InstanceNormalization"], instance_norm);
    t.add(&["RMSNormalization"], rms_norm);
}

fn per_channel(t: &HostTensor, channels: usize, what: &str) -> Result<Vec<f32>, String> {
    let v = t.to_f32_vec();
    if v.len() != channels {
        return Err(format!(
            "{what} has {} entries for {channels} channels",
            v.len()
        ));
    }
    Ok(v)
}

fn batch_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(format!("expected [N, C, ...], got {:?}", x.shape()));
    }
    let c = x.shape()[1];
    let scale = per_channel(input(inputs, 1)?, c, "scale")?;
    let bias = per_channel(input(inputs, 2)?, c, "B")?;
    let mean = per_channel(input(inputs, 3)?, c, "mean")?;
    let var = per_channel(input(inputs, 4)?, c, "var")?;
    let eps = ctx.float("epsilon", 1e-5);
    let spatial: usize = x.shape()[2..].iter().product();
    let xv = x.as_f32()?;
    if ctx.int("training_mode", 0) != 0 {
        return batch_norm_training(ctx, xv, x.shape(), [&scale, &bias, &mean, &var], eps);
    }
    let factor: Vec<f32> = (0..c).map(|i| scale[i] / (var[i] + eps).sqrt()).collect();
    let mut out = Vec::with_capacity(xv.len());
    for (p, plane) in xv.chunks(spatial.max(1)).enumerate() {
        let ch = p % c;
        let (m, f, b) = (mean[ch], factor[ch], bias[ch]);
        fast_math::extend_zip(&mut out, plane, 1, &[()], 0, plane.len(), |v, ()| {
            (v - m) * f + b
        });
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

/// BatchNormalization with `training_mode = 1` (opsets 14–15): normalises with the batch's
/// own mean and (population) variance per channel, and also returns the running statistics
/// updated with them, `running · momentum + batch · (1 − momentum)`, as the ONNX reference does.
fn batch_norm_training(
    ctx: &Ctx,
    xv: &[f32],
    shape: &[usize],
    [scale, bias, running_mean, running_var]: [&[f32]; 4],
    eps: f32,
) -> KernelResult {
    let c = shape[1];
    let spatial: usize = shape[2..].iter().product();
    let per_channel = (xv.len() / c.max(1)) as f64;
    let mut sums = vec![0f64; c];
    for (p, plane) in xv.chunks(spatial.max(1)).enumerate() {
        sums[p % c] += plane.iter().map(|&v| v as f64).sum::<f64>();
    }
    let means: Vec<f64> = sums.iter().map(|s| s / per_channel).collect();
    let mut squares = vec![0f64; c];
    for (p, plane) in xv.chunks(spatial.max(1)).enumerate() {
        let m = means[p % c];
        squares[p % c] += plane.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>();
    }
    let vars: Vec<f64> = squares.iter().map(|s| s / per_channel).collect();
    let mut out = Vec::with_capacity(xv.len());
    for (p, plane) in xv.chunks(spatial.max(1)).enumerate() {
        let ch = p % c;
        let factor = scale[ch] as f64 / (vars[ch] + eps as f64).sqrt();
        out.extend(
            plane
                .iter()
                .map(|&v| ((v as f64 - means[ch]) * factor + bias[ch] as f64) as f32),
        );
    }
    let momentum = ctx.float("momentum", 0.9) as f64;
    let running = |old: &[f32], batch: &[f64]| -> HostTensor {
        let updated = old
            .iter()
            .zip(batch)
            .map(|(&o, &b)| (o as f64 * momentum + b * (1.0 - momentum)) as f32)
            .collect();
        HostTensor::f32(vec![c], updated)
    };
    Ok(vec![
        HostTensor::f32(shape.to_vec(), out),
        running(running_mean, &means),
        running(running_var, &vars),
    ])
}

fn layer_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", -1), x.rank())?;
    let eps = ctx.float("epsilon", 1e-5) as f64;
    let inner: usize = x.shape()[axis..].iter().product();
    let outer: usize = x.shape()[..axis].iter().product();
    let scale = input(inputs, 1)?;
    let bias = optional(inputs, 2);
    // Scale and bias broadcast over the normalised dims; the common case is exactly those dims.
    let expand = |t: &HostTensor| -> Result<Vec<f32>, String> {
        if super::indexing::broadcast_shapes(&[t.shape(), &x.shape()[axis..]])? != x.shape()[axis..]
        {
            return Err(format!(
                "scale/bias {:?} do not broadcast to {:?}",
                t.shape(),
                &x.shape()[axis..]
            ));
        }
        let offsets = super::indexing::broadcast_offsets(t.shape(), &x.shape()[axis..])?;
        let v = t.to_f32_vec();
        Ok(offsets.iter().map(|&i| v[i]).collect())
    };
    let gamma = expand(scale)?;
    let beta = bias.map(expand).transpose()?;
    let xv = x.as_f32()?;
    let mut out = Vec::with_capacity(xv.len());
    let mut means = Vec::with_capacity(outer);
    let mut inv_stds = Vec::with_capacity(outer);
    let beta = beta.unwrap_or_else(|| vec![0.0; gamma.len()]);
    // Row by row over `outer`, not by chunks of the data: rows of no element still have their
    // statistics (a [3, 0] input has three).
    for r in 0..outer {
        let row = &xv[r * inner..(r + 1) * inner];
        let (mean, var) = moments(row);
        let inv_std = 1.0 / (var + eps).sqrt();
        let (mean_f32, inv_std_f32) = (mean as f32, inv_std as f32);
        out.extend(
            row.iter()
                .zip(&gamma)
                .zip(&beta)
                .map(|((&v, &g), &b)| (v - mean_f32) * inv_std_f32 * g + b),
        );
        means.push(mean_f32);
        inv_stds.push(inv_std_f32);
    }
    let mut stat_shape = x.shape()[..axis].to_vec();
    stat_shape.extend(std::iter::repeat_n(1, x.rank() - axis));
    Ok(vec![
        HostTensor::f32(x.shape().to_vec(), out),
        HostTensor::f32(stat_shape.clone(), means),
        HostTensor::f32(stat_shape, inv_stds),
    ])
}

/// Mean and (population) variance of a row, in f64.
fn moments(row: &[f32]) -> (f64, f64) {
    let n = row.len().max(1) as f64;
    let mean = fast_math::sum_f64(row, f64::from) / n;
    let var = fast_math::sum_f64(row, |v| (f64::from(v) - mean).powi(2)) / n;
    (mean, var)
}

fn rms_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", -1), x.rank())?;
    let eps = ctx.float("epsilon", 1e-5) as f64;
    let inner: usize = x.shape()[axis..].iter().product();
    let scale = input(inputs, 1)?;
    if super::indexing::broadcast_shapes(&[scale.shape(), &x.shape()[axis..]])? != x.shape()[axis..]
    {
        return Err(format!(
            "scale {:?} does not broadcast to {:?}",
            scale.shape(),
            &x.shape()[axis..]
        ));
    }
    let offsets = super::indexing::broadcast_offsets(scale.shape(), &x.shape()[axis..])?;
    let gamma: Vec<f32> = {
        let v = scale.to_f32_vec();
        offsets.iter().map(|&i| v[i]).collect()
    };
    let mut out = Vec::with_capacity(x.len());
    for row in x.as_f32()?.chunks(inner.max(1)) {
        let mean_square = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (mean_square + eps).sqrt();
        out.extend(
            row.iter()
                .zip(&gamma)
                .map(|(&v, &g)| (v as f64 * inv) as f32 * g),
        );
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

fn instance_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(format!("expected [N, C, spatial...], got {:?}", x.shape()));
    }
    let c = x.shape()[1];
    let scale = per_channel(input(inputs, 1)?, c, "scale")?;
    let bias = per_channel(input(inputs, 2)?, c, "B")?;
    let eps = ctx.float("epsilon", 1e-5) as f64;
    let spatial: usize = x.shape()[2..].iter().product();
    let mut out = Vec::with_capacity(x.len());
    for (p, plane) in x.as_f32()?.chunks(spatial.max(1)).enumerate() {
        let ch = p % c;
        let mean = plane.iter().map(|&v| v as f64).sum::<f64>() / spatial as f64;
        let var = plane
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / spatial as f64;
        let inv = 1.0 / (var + eps).sqrt();
        out.extend(
            plane
                .iter()
                .map(|&v| ((v as f64 - mean) * inv) as f32 * scale[ch] + bias[ch]),
        );
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn layer_norm_normalises_rows() {
        let x = f(&[2, 2], &[1.0, 3.0, -1.0, -1.0]);
        let out = run(
            "LayerNormalization",
            vec![("epsilon", Attribute::Float(1e-12))],
            &[&x, &f(&[2], &[1.0, 2.0]), &f(&[2], &[0.0, 1.0])],
        );
        assert_close(&out[0], &[2, 2], &[-1.0, 3.0, 0.0, 1.0]);
        assert_close(&out[1], &[2, 1], &[2.0, -1.0]);
        let out = run(
            "RMSNormalization",
            vec![("epsilon", Attribute::Float(0.0))],
            &[&f(&[1, 2], &[3.0, -4.0]), &f(&[2], &[1.0, 2.0])],
        );
        let rms = (12.5f32).sqrt();
        assert_close(&out[0], &[1, 2], &[3.0 / rms, -8.0 / rms]);
    }

    #[test]
    fn batch_and_instance_norm() {
        let x = f(&[1, 2, 1, 2], &[1.0, 3.0, 10.0, 20.0]);
        let one = f(&[2], &[1.0, 2.0]);
        let zero = f(&[2], &[0.0, 1.0]);
        let out = run(
            "BatchNormalization",
            vec![("epsilon", Attribute::Float(0.0))],
            &[
                &x,
                &one,
                &zero,
                &f(&[2], &[1.0, 10.0]),
                &f(&[2], &[4.0, 25.0]),
            ],
        );
        assert_close(&out[0], &[1, 2, 1, 2], &[0.0, 1.0, 1.0, 5.0]);
        let out = run(
            "InstanceNormalization",
            vec![("epsilon", Attribute::Float(0.0))],
            &[&x, &one, &zero],
        );
        assert_close(&out[0], &[1, 2, 1, 2], &[-1.0, 1.0, -1.0, 3.0]);
    }
}
