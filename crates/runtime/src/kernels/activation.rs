//! Activations and softmax.
//!
//! Specs: <https://onnx.ai/onnx/operators/> (Relu, Sigmoid, Tanh, LeakyRelu, Elu, Selu, Celu, Swish, ThresholdedRelu, Shrink,
//! SwiGLU (opset 28), HardSigmoid, HardSwish, Softplus, Softsign, Mish, Gelu (opset 20), Clip (attributes before
//! opset 11, inputs after), PRelu, Softmax and LogSoftmax (2-D coercion before opset 13, one axis
//! after)), opsets 7 to 23.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::fast_math;
use super::indexing::{normalize_axis, zip_broadcast};
use crate::tensor::{HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(
        &[
            "Relu",
            "Sigmoid",
            "Tanh",
            "LeakyRelu",
            "Elu",
            "Selu",
            "HardSigmoid",
            "HardSwish",
            "Softplus",
            "Softsign",
            "Mish",
            "Gelu",
            "Celu",
            "Swish",
            "ThresholdedRelu",
            "Shrink",
        ],
        pointwise,
    );
    t.add(&["SwiGLU"], swiglu);
    t.add(&["Clip"], clip);
    t.add(&["PRelu"], prelu);
    t.add(&["Softmax", "LogSoftmax"], softmax);
}

/// SwiGLU (opset 28, <https://onnx.ai/onnx/operators/onnx__SwiGLU.html>): Swish_alpha(A) · B
/// with Swish_alpha(a) = a · sigmoid(alpha · a); A and B of one shape (no broadcasting).
fn swiglu(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (gate, linear) = (input(inputs, 0)?, input(inputs, 1)?);
    if gate.shape() != linear.shape() {
        return Err(format!(
            "SwiGLU needs A and B of one shape, not {:?} and {:?}",
            gate.shape(),
            linear.shape()
        ));
    }
    let alpha = ctx.float("alpha", 1.0);
    let out = gate
        .as_f32()?
        .iter()
        .zip(linear.as_f32()?)
        .map(|(&a, &b)| a * fast_math::sigmoid(alpha * a) * b)
        .collect();
    Ok(vec![HostTensor::f32(gate.shape().to_vec(), out)])
}

fn pointwise(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let v = a.as_f32()?;
    let op = ctx.node.op_type.as_str();
    let out: Vec<f32> = match op {
        "Relu" => fast_math::map(v, |x| x.max(0.0)),
        "Sigmoid" => fast_math::map(v, fast_math::sigmoid),
        "Tanh" => fast_math::map(v, fast_math::tanh),
        "LeakyRelu" => {
            let alpha = ctx.float("alpha", 0.01);
            v.iter()
                .map(|&x| if x < 0.0 { alpha * x } else { x })
                .collect()
        }
        "Elu" => {
            let alpha = ctx.float("alpha", 1.0);
            v.iter()
                .map(|&x| if x < 0.0 { alpha * (x.exp() - 1.0) } else { x })
                .collect()
        }
        "Selu" => {
            let alpha = ctx.float("alpha", 1.673_263_2);
            let gamma = ctx.float("gamma", 1.050_701);
            v.iter()
                .map(|&x| gamma * if x <= 0.0 { alpha * (x.exp() - 1.0) } else { x })
                .collect()
        }
        "HardSigmoid" => {
            let alpha = ctx.float("alpha", 0.2);
            let beta = ctx.float("beta", 0.5);
            fast_math::map(v, |x| (alpha * x + beta).clamp(0.0, 1.0))
        }
        "HardSwish" => fast_math::map(v, |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
        "Softplus" => v
            .iter()
            .map(|&x| if x > 20.0 { x } else { x.exp().ln_1p() })
            .collect(),
        "Softsign" => v.iter().map(|&x| x / (1.0 + x.abs())).collect(),
        "Mish" => v.iter().map(|&x| x * x.exp().ln_1p().tanh()).collect(),
        "Celu" => {
            let alpha = ctx.float("alpha", 1.0);
            v.iter()
                .map(|&x| x.max(0.0) + (alpha * ((x / alpha).exp() - 1.0)).min(0.0))
                .collect()
        }
        "Swish" => {
            let alpha = ctx.float("alpha", 1.0);
            fast_math::map(v, |x| x * fast_math::sigmoid(alpha * x))
        }
        "ThresholdedRelu" => {
            let alpha = ctx.float("alpha", 1.0);
            v.iter().map(|&x| if x > alpha { x } else { 0.0 }).collect()
        }
        "Shrink" => {
            let (bias, lambd) = (ctx.float("bias", 0.0), ctx.float("lambd", 0.5));
            v.iter()
                .map(|&x| {
                    if x < -lambd {
                        x + bias
                    } else if x > lambd {
                        x - bias
                    } else {
                        0.0
                    }
                })
                .collect()
        }
        _ => {
            // Gelu: exact (erf) or the tanh approximation.
            if ctx.string("approximate", "none") == "tanh" {
                let c = (2.0f32 / std::f32::consts::PI).sqrt();
                fast_math::map(v, |x| {
                    0.5 * x * (1.0 + fast_math::tanh(c * (x + 0.044_715 * x * x * x)))
                })
            } else {
                fast_math::map(v, |x| {
                    0.5 * x * (1.0 + fast_math::erf(x * std::f32::consts::FRAC_1_SQRT_2))
                })
            }
        }
    };
    Ok(vec![HostTensor::f32(a.shape().to_vec(), out)])
}

fn clip(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let bound = |i: usize, attr: &str, default: f32| -> Result<f32, String> {
        if ctx.opset < 11 {
            return Ok(ctx.float(attr, default));
        }
        match optional(inputs, i) {
            Some(t) if t.len() == 1 => Ok(t.to_f32_vec()[0]),
            Some(t) => Err(format!(
                "Clip bound must be a scalar, got shape {:?}",
                t.shape()
            )),
            None => Ok(default),
        }
    };
    let lo = bound(1, "min", f32::NEG_INFINITY)?;
    let hi = bound(2, "max", f32::INFINITY)?;
    match a.data() {
        TensorData::F32(v) => Ok(vec![HostTensor::f32(
            a.shape().to_vec(),
            // max then min, as onnxruntime does, so lo > hi gives hi.
            fast_math::map(v, |x| x.max(lo).min(hi)),
        )]),
        TensorData::I64(_) | TensorData::I32(_) | TensorData::U8(_) | TensorData::I8(_) => {
            let (lo, hi) = (
                lo.max(i64::MIN as f32) as i64,
                hi.min(i64::MAX as f32) as i64,
            );
            let out = a
                .to_i64_vec()
                .into_iter()
                .map(|x| x.max(lo).min(hi))
                .collect();
            HostTensor::i64(a.shape().to_vec(), out)
                .cast(a.dtype())
                .map(|t| vec![t])
        }
        TensorData::Bool(_) | TensorData::String(_) => {
            Err(format!("Clip does not accept {}", a.dtype()))
        }
    }
}

fn prelu(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, slope) = (input(inputs, 0)?, input(inputs, 1)?);
    let (shape, data) = zip_broadcast(
        x.as_f32()?,
        x.shape(),
        slope.as_f32()?,
        slope.shape(),
        |x, s| {
            if x < 0.0 {
                s * x
            } else {
                x
            }
        },
    )?;
    Ok(vec![HostTensor::f32(shape, data)])
}

fn softmax(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = input(inputs, 0)?;
    let v = a.as_f32()?;
    let shape = a.shape();
    let rank = shape.len().max(1);
    let legacy = ctx.opset < 13;
    let axis = normalize_axis(ctx.int("axis", if legacy { 1 } else { -1 }), rank)?;
    // Before opset 13 the input is coerced to 2-D at `axis`.
    let (outer, n, inner) = super::indexing::fibres(shape, axis, legacy);
    let log = ctx.node.op_type == "LogSoftmax";
    let mut out = v.to_vec();
    if inner == 1 {
        for row in out.chunks_mut(n.max(1)) {
            softmax_row(row, log);
        }
    } else {
        // Over a non-last axis: gather each strided row, as the last-axis case lays it out.
        let mut row = vec![0.0f32; n];
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| o * n * inner + k * inner + i;
                for (k, r) in row.iter_mut().enumerate() {
                    *r = v[at(k)];
                }
                softmax_row(&mut row, log);
                for (k, r) in row.iter().enumerate() {
                    out[at(k)] = *r;
                }
            }
        }
    }
    Ok(vec![HostTensor::f32(shape.to_vec(), out)])
}

/// Softmax (or its logarithm) of one contiguous row, in place: `e^(x − max) / Σ`, the maximum
/// subtracted so that no exponential overflows.
fn softmax_row(row: &mut [f32], log: bool) {
    let max = fast_math::max(row);
    if log {
        let mut shifted = row.to_vec();
        let log_sum = fast_math::exp_shifted_in_place(&mut shifted, max).ln();
        row.iter_mut().for_each(|x| *x = *x - max - log_sum);
    } else {
        let scale = 1.0 / fast_math::exp_shifted_in_place(row, max);
        row.iter_mut().for_each(|x| *x *= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run, run_opset};
    use pipecut_ir::graph::Attribute;

    /// An empty tensor whose other dims multiply past `usize` (`[4, 2^62, 0]`) has no rows to
    /// normalise: Softmax panicked on the product of the dims before the axis.
    #[test]
    fn softmax_family_of_an_empty_tensor_with_a_huge_dim_is_empty() {
        let shape = [4, 1usize << 62, 0];
        let x = f(&shape, &[]);
        for op in ["Softmax", "LogSoftmax", "Hardmax"] {
            for opset in [11, 17] {
                for axis in [-1, 0, 1, 2] {
                    let out = run_opset(op, opset, vec![("axis", Attribute::Int(axis))], &[&x]);
                    assert_eq!(out[0].shape(), shape, "{op} opset {opset} axis {axis}");
                    assert!(out[0].as_f32().unwrap().is_empty());
                }
            }
        }
    }

    #[test]
    fn softmax_over_last_axis_and_legacy_coercion() {
        let x = f(&[2, 2], &[0.0, (2.0f32).ln(), 1.0, 1.0]);
        let out = run("Softmax", vec![], &[&x]);
        assert_close(&out[0], &[2, 2], &[1.0 / 3.0, 2.0 / 3.0, 0.5, 0.5]);
        // opset 11, axis 0: the whole tensor is one row.
        let out = run_opset(
            "Softmax",
            11,
            vec![("axis", Attribute::Int(0))],
            &[&f(&[2], &[0.0, 0.0])],
        );
        assert_close(&out[0], &[2], &[0.5, 0.5]);
        let out = run("Softmax", vec![("axis", Attribute::Int(0))], &[&x]);
        let e = 1.0f32.exp();
        assert_close(
            &out[0],
            &[2, 2],
            &[
                1.0 / (1.0 + e),
                2.0 / (2.0 + e),
                e / (1.0 + e),
                e / (2.0 + e),
            ],
        );
    }

    #[test]
    fn activations_match_their_formulas() {
        let x = f(&[3], &[-1.0, 0.0, 2.0]);
        assert_close(&run("Relu", vec![], &[&x])[0], &[3], &[0.0, 0.0, 2.0]);
        assert_close(
            &run("Sigmoid", vec![], &[&x])[0],
            &[3],
            &[0.268_941_4, 0.5, 0.880_797],
        );
        assert_close(
            &run("HardSigmoid", vec![], &[&x])[0],
            &[3],
            &[0.3, 0.5, 0.9],
        );
        assert_close(
            &run("Gelu", vec![], &[&x])[0],
            &[3],
            &[-0.158_655_3, 0.0, 1.954_5],
        );
        let lo = f(&[], &[-0.5]);
        let hi = f(&[], &[1.0]);
        assert_close(
            &run("Clip", vec![], &[&x, &lo, &hi])[0],
            &[3],
            &[-0.5, 0.0, 1.0],
        );
        let out = run_opset(
            "Clip",
            6,
            vec![
                ("min", Attribute::Float(0.0)),
                ("max", Attribute::Float(6.0)),
            ],
            &[&x],
        );
        assert_close(&out[0], &[3], &[0.0, 0.0, 2.0]);
    }
}
