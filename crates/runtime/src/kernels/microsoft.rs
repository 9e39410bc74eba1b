//! onnxruntime's `com.microsoft` fused ops that its transformer optimizer writes into BERT, GPT-2
//! and T5-style models: SkipLayerNormalization, SkipSimplifiedLayerNormalization, BiasGelu,
//! FastGelu, Gelu, QuickGelu and BiasAdd.
//!
//! Spec: <https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md> (all at
//! version 1 of the domain). Where the document is silent the semantics are onnxruntime's CPU
//! kernels', which the tests in `tests/node_cases.rs` compare against. BiasAdd has only a CUDA
//! kernel in onnxruntime; ours follows the document (`input + bias + skip`). Statistics
//! accumulate in f64, as the standard normalisations here do.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::fast_math;
use super::indexing::zip_broadcast;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    const MS: &str = "com.microsoft";
    t.add_in(MS, &["SkipLayerNormalization"], skip_layer_norm);
    t.add_in(MS, &["SkipSimplifiedLayerNormalization"], skip_layer_norm);
    t.add_in(
        MS,
        &["BiasGelu", "FastGelu", "Gelu", "QuickGelu"],
        gelu_family,
    );
    t.add_in(MS, &["BiasAdd"], bias_add);
}

/// `a + b` with numpy broadcasting, in f32.
fn add(a: &HostTensor, b: &HostTensor) -> Result<HostTensor, String> {
    let (shape, data) =
        zip_broadcast(a.as_f32()?, a.shape(), b.as_f32()?, b.shape(), |x, y| x + y)?;
    if shape != a.shape() {
        return Err(format!(
            "{:?} does not broadcast into the input's shape {:?}",
            b.shape(),
            a.shape()
        ));
    }
    Ok(HostTensor::f32(shape, data))
}

/// The hidden size (last dim) of `x`, checked against a 1-D parameter `what`.
fn check_hidden(x: &HostTensor, param: &HostTensor, what: &str) -> Result<(), String> {
    let hidden = x.shape().last().copied().unwrap_or(1);
    if param.len() != hidden {
        return Err(format!(
            "{what} has {} elements but the hidden size is {hidden}",
            param.len()
        ));
    }
    Ok(())
}

/// SkipLayerNormalization (`input, skip, gamma, beta?, bias?`) and its simplified (RMS) form
/// (`input, skip, gamma, bias?`): `sum = input + skip + bias` normalised over the last axis.
/// Outputs: `output`, `mean`, `inv_std_var` (`[..., 1]`), `input_skip_bias_sum`. The simplified
/// form defines no mean: a node that asks for it is refused rather than given a made-up value.
fn skip_layer_norm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let simplified = ctx.node.op_type == "SkipSimplifiedLayerNormalization";
    let (x, skip, gamma) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let (beta, bias) = if simplified {
        (None, optional(inputs, 3))
    } else {
        (optional(inputs, 3), optional(inputs, 4))
    };
    if simplified && matches!(ctx.node.outputs.get(1), Some(Some(_))) {
        return Err("SkipSimplifiedLayerNormalization has no mean output to give".into());
    }
    let Some(&hidden) = x.shape().last() else {
        return Err("input must have rank ≥ 1".into());
    };
    check_hidden(x, gamma, "gamma")?;
    let mut sum = add(x, skip)?;
    if let Some(bias) = bias {
        check_hidden(x, bias, "bias")?;
        sum = add(&sum, bias)?;
    }
    let gamma = gamma.as_f32()?;
    let beta = match beta {
        Some(b) => {
            check_hidden(x, b, "beta")?;
            Some(b.as_f32()?)
        }
        None => None,
    };
    let eps = ctx.float("epsilon", 1e-12) as f64;
    let values = sum.as_f32()?;
    // One row per index of the leading dims, also where rows hold nothing (hidden = 0): each
    // has its statistics, so their count is bounded as an output's.
    let rows = super::indexing::checked_size(&x.shape()[..x.rank() - 1])?;
    if values.len() != rows * hidden {
        return Err(format!(
            "the sum has {} values for {rows} rows of {hidden}",
            values.len()
        ));
    }
    let mut out = Vec::with_capacity(values.len());
    let (mut means, mut inv_stds) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for r in 0..rows {
        let row = &values[r * hidden..(r + 1) * hidden];
        let n = row.len() as f64;
        let mean = if simplified {
            0.0
        } else {
            row.iter().map(|&v| v as f64).sum::<f64>() / n
        };
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let inv_std = 1.0 / (var + eps).sqrt();
        out.extend(row.iter().enumerate().map(|(k, &v)| {
            let normalised = ((v as f64 - mean) * inv_std) as f32 * gamma[k];
            normalised + beta.map_or(0.0, |b| b[k])
        }));
        means.push(mean as f32);
        inv_stds.push(inv_std as f32);
    }
    let mut stats_shape = x.shape().to_vec();
    *stats_shape.last_mut().expect("rank ≥ 1") = 1;
    Ok(vec![
        HostTensor::f32(x.shape().to_vec(), out),
        HostTensor::f32(stats_shape.clone(), means),
        HostTensor::f32(stats_shape, inv_stds),
        sum,
    ])
}

/// The Gelu family: `BiasGelu(x, bias)` and `Gelu(x)` are exact (erf) Gelu of `x (+ bias)`,
/// `FastGelu(x, bias?)` its tanh approximation, `QuickGelu(x)` is `x·sigmoid(alpha·x)` with
/// `alpha` 1.702 by default.
fn gelu_family(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let biased;
    let x = match (ctx.node.op_type.as_str(), optional(inputs, 1)) {
        ("BiasGelu" | "FastGelu", Some(bias)) => {
            biased = add(x, bias)?;
            &biased
        }
        ("BiasGelu", None) => return Err("BiasGelu needs its bias input".into()),
        _ => x,
    };
    let values = x.as_f32()?;
    let out: Vec<f32> = match ctx.node.op_type.as_str() {
        "FastGelu" => {
            let c = (2.0f32 / std::f32::consts::PI).sqrt();
            fast_math::map(values, |v| {
                0.5 * v * (1.0 + fast_math::tanh(c * (v + 0.044_715 * v * v * v)))
            })
        }
        "QuickGelu" => {
            let alpha = ctx.float("alpha", 1.702);
            fast_math::map(values, |v| v * fast_math::sigmoid(alpha * v))
        }
        _ => fast_math::map(values, |v| {
            0.5 * v * (1.0 + fast_math::erf(v * std::f32::consts::FRAC_1_SQRT_2))
        }),
    };
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

/// BiasAdd: `input + bias + skip` (input and skip `[N, S, C]`, bias `[C]`).
fn bias_add(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, bias, skip) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    check_hidden(x, bias, "bias")?;
    Ok(vec![add(&add(x, bias)?, skip)?])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, node};
    use super::super::{lookup, Ctx};

    fn run_ms(op: &str, inputs: &[&crate::tensor::HostTensor]) -> Vec<super::HostTensor> {
        let n = node(op, vec![]);
        let ctx = Ctx {
            node: &n,
            opset: 1,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let inputs: Vec<_> = inputs.iter().map(|t| Some(*t)).collect();
        lookup("com.microsoft", op).expect("registered")(&ctx, &inputs).expect("runs")
    }

    #[test]
    fn bias_add_adds_both() {
        let x = f(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = run_ms("BiasAdd", &[&x, &f(&[2], &[10.0, 20.0]), &x]);
        assert_close(&out[0], &[1, 2, 2], &[12.0, 24.0, 16.0, 28.0]);
    }

    #[test]
    fn skip_layer_norm_normalises_the_sum() {
        let x = f(&[1, 2], &[1.0, 2.0]);
        let skip = f(&[1, 2], &[1.0, 4.0]);
        let out = run_ms(
            "SkipLayerNormalization",
            &[&x, &skip, &f(&[2], &[1.0, 2.0]), &f(&[2], &[0.5, 0.5])],
        );
        // sum = [2, 6]: mean 4, std 2 (eps 1e-12) → [-1, 1]·gamma + beta.
        assert_close(&out[0], &[1, 2], &[-0.5, 2.5]);
        assert_close(&out[1], &[1, 1], &[4.0]);
        assert_close(&out[3], &[1, 2], &[2.0, 6.0]);
        let wrong_gamma = f(&[3], &[1.0; 3]);
        let n = node("SkipLayerNormalization", vec![]);
        let ctx = Ctx {
            node: &n,
            opset: 1,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let err = lookup("com.microsoft", "SkipLayerNormalization").unwrap()(
            &ctx,
            &[Some(&x), Some(&skip), Some(&wrong_gamma)],
        )
        .unwrap_err();
        assert!(err.contains("gamma has 3 elements"), "{err}");
    }
}
