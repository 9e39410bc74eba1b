//! The loss ops of ai.onnx:
//! [NegativeLogLikelihoodLoss](https://onnx.ai/onnx/operators/onnx__NegativeLogLikelihoodLoss.html)
//! and [SoftmaxCrossEntropyLoss](https://onnx.ai/onnx/operators/onnx__SoftmaxCrossEntropyLoss.html),
//! opsets 12 to 22.
//!
//! Per position (n, d) with class t = target[n, d]: loss −x[n, t, d] (x the log-softmax over
//! axis 1 for SoftmaxCrossEntropyLoss), times the weight w = weight[t] (1 without weights);
//! positions whose target is `ignore_index` have loss and weight 0. `mean` is Σ w·loss / Σ w, the
//! ONNX reference's weighted mean; `sum` and `none` as named. Sums accumulate in f64.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["NegativeLogLikelihoodLoss"], |ctx, inputs| {
        loss(ctx, inputs, false)
    });
    t.add(&["SoftmaxCrossEntropyLoss"], |ctx, inputs| {
        loss(ctx, inputs, true)
    });
}

/// Log-softmax over axis 1 of `[N, C, D]` scores.
fn log_softmax(x: &[f32], n: usize, c: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for i in 0..n {
        for k in 0..d {
            let at = |class: usize| (i * c + class) * d + k;
            let max = (0..c).map(|j| x[at(j)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = (0..c).map(|j| f64::from((x[at(j)] - max).exp())).sum();
            let log_sum = sum.ln() as f32;
            for j in 0..c {
                out[at(j)] = x[at(j)] - max - log_sum;
            }
        }
    }
    out
}

fn loss(ctx: &Ctx, inputs: &[Option<&HostTensor>], softmax: bool) -> KernelResult {
    let scores = input(inputs, 0)?;
    let target = input(inputs, 1)?;
    let shape = scores.shape();
    if shape.len() < 2 || target.shape().len() + 1 != shape.len() {
        return Err(format!(
            "scores {shape:?} and target {:?} do not match",
            target.shape()
        ));
    }
    let (n, c) = (shape[0], shape[1]);
    let d: usize = shape[2..].iter().product();
    let x = scores.to_f32_vec();
    let log_prob = if softmax { log_softmax(&x, n, c, d) } else { x };
    let targets = target.to_i64_vec();
    let weights = optional(inputs, 2).map(|w| w.to_f32_vec());
    let ignore = ctx.attr("ignore_index").map(|_| ctx.int("ignore_index", 0));
    let mut losses = vec![0.0f32; n * d];
    let (mut weighted_sum, mut weight_sum) = (0.0f64, 0.0f64);
    for i in 0..n {
        for k in 0..d {
            let t = targets[i * d + k];
            if Some(t) == ignore {
                continue;
            }
            let class = usize::try_from(t)
                .ok()
                .filter(|&class| class < c)
                .ok_or_else(|| format!("target {t} is not a class of 0..{c}"))?;
            let w = match &weights {
                Some(w) => *w
                    .get(class)
                    .ok_or("weight is shorter than the class count")?,
                None => 1.0,
            };
            let value = -log_prob[(i * c + class) * d + k] * w;
            losses[i * d + k] = value;
            weighted_sum += f64::from(value);
            weight_sum += f64::from(w);
        }
    }
    let loss = match ctx.string("reduction", "mean").as_str() {
        "none" => HostTensor::f32(target.shape().to_vec(), losses),
        "sum" => HostTensor::f32(Vec::new(), vec![weighted_sum as f32]),
        "mean" => HostTensor::f32(Vec::new(), vec![(weighted_sum / weight_sum) as f32]),
        other => return Err(format!("reduction '{other}' is none of none, mean, sum")),
    };
    Ok(vec![loss, HostTensor::f32(shape.to_vec(), log_prob)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::run;
    use crate::tensor::{HostTensor, TensorData};
    use pipecut_ir::graph::Attribute;

    /// Two samples, the second ignored: the weighted mean is the first sample's loss alone.
    #[test]
    fn ignored_targets_leave_the_mean() {
        let x = HostTensor::f32(vec![2, 2], vec![-0.5, -2.0, -1.0, -3.0]);
        let target = HostTensor::new(vec![2], TensorData::I64(vec![0, 1])).unwrap();
        let out = run(
            "NegativeLogLikelihoodLoss",
            vec![("ignore_index", Attribute::Int(1))],
            &[&x, &target],
        );
        assert_eq!(out[0].to_f32_vec(), vec![0.5]);
        let out = run("NegativeLogLikelihoodLoss", vec![], &[&x, &target]);
        assert_eq!(out[0].to_f32_vec(), vec![1.75]);
    }
}
