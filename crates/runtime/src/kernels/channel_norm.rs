//! Normalisations over groups of channels or chosen axes: GroupNormalization (opsets 18 and 21:
//! scale and bias per group, then per channel), LRN (a window across channels) and
//! MeanVarianceNormalization (over `axes`, default `[0, 2, 3]`, dividing by `√variance + 1e-9`
//! as the op's function body does). Statistics in f64.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::normalize_axis;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["GroupNormalization"], group_norm);
    t.add(&["LRN"], lrn);
    t.add(&["MeanVarianceNormalization"], mean_variance_norm);
}

fn group_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(format!("expected [N, C, ...], got {:?}", x.shape()));
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let groups = usize::try_from(ctx.int("num_groups", 0))
        .ok()
        .filter(|&g| g > 0 && c % g == 0)
        .ok_or_else(|| format!("num_groups must divide the {c} channels"))?;
    let (scale, bias) = (
        input(inputs, 1)?.to_f32_vec(),
        input(inputs, 2)?.to_f32_vec(),
    );
    // Opset 18 gives one scale per group, 21 one per channel.
    let per_channel = scale.len() == c;
    if !(per_channel || scale.len() == groups) || bias.len() != scale.len() {
        return Err(format!(
            "scale and bias must have {groups} (per group) or {c} (per channel) entries"
        ));
    }
    let eps = f64::from(ctx.float("epsilon", 1e-5));
    let spatial: usize = x.shape()[2..].iter().product();
    let span = c / groups * spatial;
    let xv = x.to_f32_vec();
    let mut out = vec![0.0f32; xv.len()];
    for block in 0..n * groups {
        let values = &xv[block * span..(block + 1) * span];
        let (mean, var) = moments(values.iter().copied());
        let inv = 1.0 / (var + eps).sqrt();
        let group = block % groups;
        for (k, &v) in values.iter().enumerate() {
            let channel = group * (c / groups) + k / spatial.max(1);
            let at = if per_channel { channel } else { group };
            out[block * span + k] = ((f64::from(v) - mean) * inv) as f32 * scale[at] + bias[at];
        }
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

/// Mean and (population) variance.
fn moments(values: impl Iterator<Item = f32> + Clone) -> (f64, f64) {
    let count = values.clone().count().max(1) as f64;
    let mean = values.clone().map(f64::from).sum::<f64>() / count;
    let var = values.map(|v| (f64::from(v) - mean).powi(2)).sum::<f64>() / count;
    (mean, var)
}

/// `y = x / (bias + α/size · Σ x²)^β`, the sum over the `size` channels centred on each
/// (`⌊(size − 1)/2⌋` before, `⌈(size − 1)/2⌉` after).
fn lrn(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(format!("expected [N, C, ...], got {:?}", x.shape()));
    }
    let size = usize::try_from(ctx.int("size", 0))
        .ok()
        .filter(|&s| s > 0)
        .ok_or("size must be at least 1")?;
    let (alpha, beta, bias) = (
        f64::from(ctx.float("alpha", 1e-4)),
        f64::from(ctx.float("beta", 0.75)),
        f64::from(ctx.float("bias", 1.0)),
    );
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let spatial: usize = x.shape()[2..].iter().product();
    let xv = x.to_f32_vec();
    let before = (size - 1) / 2;
    let after = (size - 1) - before;
    let mut out = vec![0.0f32; xv.len()];
    for ni in 0..n {
        for ci in 0..c {
            let lo = ci.saturating_sub(before);
            let hi = (ci + after).min(c - 1);
            for s in 0..spatial {
                let at = |ch: usize| (ni * c + ch) * spatial + s;
                let square_sum: f64 = (lo..=hi).map(|ch| f64::from(xv[at(ch)]).powi(2)).sum();
                let denominator = (bias + alpha / size as f64 * square_sum).powf(beta);
                out[at(ci)] = (f64::from(xv[at(ci)]) / denominator) as f32;
            }
        }
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

fn mean_variance_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let axes: Vec<usize> = ctx
        .ints("axes")
        .unwrap_or_else(|| vec![0, 2, 3])
        .iter()
        .map(|&a| normalize_axis(a, rank))
        .collect::<Result<_, _>>()?;
    let shape = x.shape();
    let strides: Vec<usize> = (0..rank).map(|d| shape[d + 1..].iter().product()).collect();
    // Elements sharing the coordinates off `axes` form one set.
    let key = |flat: usize| -> usize {
        (0..rank)
            .filter(|d| !axes.contains(d))
            .fold(0, |k, d| k * shape[d] + (flat / strides[d]) % shape[d])
    };
    let sets: usize = (0..rank)
        .filter(|d| !axes.contains(d))
        .map(|d| shape[d])
        .product();
    let xv = x.to_f32_vec();
    let mut sum = vec![0.0f64; sets];
    let mut count = vec![0usize; sets];
    for (flat, &v) in xv.iter().enumerate() {
        sum[key(flat)] += f64::from(v);
        count[key(flat)] += 1;
    }
    let mean: Vec<f64> = sum
        .iter()
        .zip(&count)
        .map(|(s, &c)| s / c.max(1) as f64)
        .collect();
    let mut squares = vec![0.0f64; sets];
    for (flat, &v) in xv.iter().enumerate() {
        squares[key(flat)] += (f64::from(v) - mean[key(flat)]).powi(2);
    }
    let out = xv
        .iter()
        .enumerate()
        .map(|(flat, &v)| {
            let k = key(flat);
            let std = (squares[k] / count[k].max(1) as f64).sqrt();
            ((f64::from(v) - mean[k]) / (std + 1e-9)) as f32
        })
        .collect();
    Ok(vec![HostTensor::f32(shape.to_vec(), out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn group_norm_normalises_each_group() {
        // One sample, 2 channels in 1 group, 2 values each: mean 2.5, variance 1.25.
        let x = f(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let groups = vec![
            ("num_groups", Attribute::Int(1)),
            ("epsilon", Attribute::Float(0.0)),
        ];
        let out = run(
            "GroupNormalization",
            groups,
            &[&x, &f(&[1], &[1.0]), &f(&[1], &[0.0])],
        );
        let s = 1.25f32.sqrt();
        assert_close(&out[0], &[1, 2, 2], &[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]);
    }

    #[test]
    fn lrn_of_one_channel_with_size_one() {
        // y = x / (1 + 1e-4 · x²)^0.75.
        let x = f(&[1, 1, 1], &[2.0]);
        let out = run("LRN", vec![("size", Attribute::Int(1))], &[&x]);
        assert_close(&out[0], &[1, 1, 1], &[2.0 / (1.0f32 + 4e-4).powf(0.75)]);
    }
}
