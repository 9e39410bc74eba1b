//! Ops that map each 1-D fibre along an axis to a new fibre: Hardmax and LpNormalization, plus
//! the registration of LpPool (computed in `pool_nd.rs`).
//!
//! Specs: <https://onnx.ai/onnx/operators/onnx__Hardmax.html> (opsets 1–13: before 13 the input
//! is coerced to 2-D at `axis`, default 1; from 13 the op runs along `axis`, default -1) and
//! <https://onnx.ai/onnx/operators/onnx__LpNormalization.html> (opsets 1–22, `p` 1 or 2, default
//! axis -1). Hardmax marks the first maximum, as onnxruntime and the reference do; a zero norm
//! divides to NaN as the reference does.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::normalize_axis;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Hardmax"], hardmax);
    t.add(&["LpNormalization"], lp_normalization);
    t.add(&["LpPool"], super::pool_nd::pool_nd);
}

/// Applies `f` to every fibre (gathered into a contiguous buffer) and scatters the result back.
fn map_fibres(
    values: &[f32],
    (outer, len, inner): (usize, usize, usize),
    f: impl Fn(&mut [f32]),
) -> Vec<f32> {
    let mut out = values.to_vec();
    let mut fibre = vec![0.0f32; len];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            for (k, slot) in fibre.iter_mut().enumerate() {
                *slot = values[base + k * inner];
            }
            f(&mut fibre);
            for (k, &v) in fibre.iter().enumerate() {
                out[base + k * inner] = v;
            }
        }
    }
    out
}

fn hardmax(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let legacy = ctx.opset < 13;
    let axis = normalize_axis(ctx.int("axis", if legacy { 1 } else { -1 }), x.rank())?;
    let out = map_fibres(
        x.as_f32()?,
        super::indexing::fibres(x.shape(), axis, legacy),
        |fibre| {
            let first_max = fibre
                .iter()
                .enumerate()
                .fold(None, |best: Option<(usize, f32)>, (k, &v)| match best {
                    Some((_, b)) if v <= b => best,
                    _ => Some((k, v)),
                })
                .map(|(k, _)| k);
            for (k, v) in fibre.iter_mut().enumerate() {
                *v = if Some(k) == first_max { 1.0 } else { 0.0 };
            }
        },
    );
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

fn lp_normalization(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", -1), x.rank())?;
    let p = ctx.int("p", 2);
    if p != 1 && p != 2 {
        return Err(format!("p must be 1 or 2, got {p}"));
    }
    let out = map_fibres(
        x.as_f32()?,
        super::indexing::fibres(x.shape(), axis, false),
        |fibre| {
            let norm = if p == 1 {
                fibre.iter().map(|v| v.abs() as f64).sum::<f64>()
            } else {
                fibre
                    .iter()
                    .map(|&v| (v as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            } as f32;
            // A zero fibre stays zero (onnx 1.23's reference), not 0/0.
            if norm == 0.0 {
                fibre.iter_mut().for_each(|v| *v = 0.0);
            } else {
                fibre.iter_mut().for_each(|v| *v /= norm);
            }
        },
    );
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run, run_opset};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn hardmax_marks_the_first_maximum_per_version() {
        let x = f(&[2, 3], &[1.0, 3.0, 3.0, 5.0, 0.0, 5.0]);
        assert_close(
            &run("Hardmax", vec![], &[&x])[0],
            &[2, 3],
            &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        );
        let by_column = run_opset("Hardmax", 13, vec![("axis", Attribute::Int(0))], &[&x]);
        assert_close(&by_column[0], &[2, 3], &[0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
        // Opset 11, axis 0: one fibre over the whole tensor.
        let legacy = run_opset("Hardmax", 11, vec![("axis", Attribute::Int(0))], &[&x]);
        assert_close(&legacy[0], &[2, 3], &[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn lp_normalization_l1_and_l2() {
        let x = f(&[1, 2], &[3.0, -4.0]);
        assert_close(
            &run("LpNormalization", vec![], &[&x])[0],
            &[1, 2],
            &[0.6, -0.8],
        );
        let l1 = run("LpNormalization", vec![("p", Attribute::Int(1))], &[&x]);
        assert_close(&l1[0], &[1, 2], &[3.0 / 7.0, -4.0 / 7.0]);
    }
}
