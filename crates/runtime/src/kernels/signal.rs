//! The window generators of opset 17 (<https://onnx.ai/onnx/operators/onnx__HannWindow.html>
//! and its siblings): `size` samples of a cosine sum over a period `N` of `size` (periodic, the
//! default) or `size − 1` (symmetric), computed in f64 and stored as f32.

use std::f64::consts::PI;

use super::context::{input, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["HannWindow"], |ctx, inputs| {
        window(ctx, inputs, &[0.5, 0.5])
    });
    // ONNX's Hamming coefficients: α = 25/46, β = 1 − α.
    t.add(&["HammingWindow"], |ctx, inputs| {
        window(ctx, inputs, &[25.0 / 46.0, 21.0 / 46.0])
    });
    t.add(&["BlackmanWindow"], |ctx, inputs| {
        window(ctx, inputs, &[0.42, 0.5, 0.08])
    });
}

/// `w[n] = a₀ − a₁·cos(2πn/N) + a₂·cos(4πn/N)`, the signs alternating.
fn window(ctx: &Ctx, inputs: &[Option<&HostTensor>], coefficients: &[f64]) -> KernelResult {
    let size = match input(inputs, 0)?.to_i64_vec()[..] {
        [size] if size >= 0 => size as usize,
        [size] => return Err(format!("size is {size}, below 0")),
        _ => return Err("size must be a scalar".into()),
    };
    let periodic = ctx.int("periodic", 1) != 0;
    let period = if periodic {
        size
    } else {
        size.saturating_sub(1)
    } as f64;
    let values = (0..size)
        .map(|n| {
            let phase = 2.0 * PI * n as f64 / period;
            let mut sign = 1.0;
            let mut sum = 0.0;
            for (k, a) in coefficients.iter().enumerate() {
                sum += sign * a * (k as f64 * phase).cos();
                sign = -sign;
            }
            sum as f32
        })
        .collect();
    Ok(vec![HostTensor::f32(vec![size], values)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn hann_is_zero_at_the_ends_of_a_symmetric_window_and_one_in_the_middle() {
        let out = run(
            "HannWindow",
            vec![("periodic", Attribute::Int(0))],
            &[&i(&[], &[5])],
        );
        assert_close(&out[0], &[5], &[0.0, 0.5, 1.0, 0.5, 0.0]);
        // Periodic: the window of size 4 is the symmetric one of size 5 without its last
        // sample.
        let out = run("HannWindow", vec![], &[&i(&[], &[4])]);
        assert_close(&out[0], &[4], &[0.0, 0.5, 1.0, 0.5]);
        let out = run(
            "BlackmanWindow",
            vec![("periodic", Attribute::Int(0))],
            &[&i(&[], &[3])],
        );
        // 0.42 − 0.5 + 0.08 = 0 at the ends, 0.42 + 0.5 + 0.08 = 1 in the middle.
        assert_close(&out[0], &[3], &[0.0, 1.0, 0.0]);
        let out = run(
            "HammingWindow",
            vec![("periodic", Attribute::Int(0))],
            &[&i(&[], &[3])],
        );
        assert_close(&out[0], &[3], &[4.0 / 46.0, 1.0, 4.0 / 46.0]);
    }
}
