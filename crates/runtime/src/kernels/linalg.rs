//! Det (<https://onnx.ai/onnx/operators/onnx__Det.html>): the determinant of each trailing
//! `M × M` matrix, by LU decomposition with partial pivoting in f64.

use super::context::{input, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Det"], det);
}

fn det(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let shape = x.shape();
    let rank = shape.len();
    if rank < 2 || shape[rank - 1] != shape[rank - 2] {
        return Err(format!("Det needs [*, M, M], got {shape:?}"));
    }
    let m = shape[rank - 1];
    let values = x.to_f32_vec();
    let dets = values
        .chunks(m * m)
        .map(|matrix| determinant(matrix, m) as f32)
        .collect::<Vec<_>>();
    let dets = if m == 0 {
        vec![1.0; shape[..rank - 2].iter().product()]
    } else {
        dets
    };
    Ok(vec![HostTensor::f32(shape[..rank - 2].to_vec(), dets)])
}

/// The determinant of the row-major `m × m` matrix.
fn determinant(matrix: &[f32], m: usize) -> f64 {
    let mut a: Vec<f64> = matrix.iter().map(|&v| f64::from(v)).collect();
    let mut det = 1.0;
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&r, &s| a[r * m + col].abs().total_cmp(&a[s * m + col].abs()))
            .expect("col < m");
        if a[pivot * m + col] == 0.0 {
            return 0.0;
        }
        if pivot != col {
            for k in 0..m {
                a.swap(pivot * m + k, col * m + k);
            }
            det = -det;
        }
        let p = a[col * m + col];
        det *= p;
        for row in col + 1..m {
            let factor = a[row * m + col] / p;
            for k in col..m {
                a[row * m + k] -= factor * a[col * m + k];
            }
        }
    }
    det
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};

    #[test]
    fn determinants_of_a_batch_with_a_row_swap_and_a_singular_matrix() {
        // [[0, 1], [1, 0]] needs a swap: −1; [[1, 2], [2, 4]] is singular; [[2, 0], [0, 3]]: 6.
        let x = f(
            &[3, 2, 2],
            &[0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 4.0, 2.0, 0.0, 0.0, 3.0],
        );
        let out = run("Det", vec![], &[&x]);
        assert_close(&out[0], &[3], &[-1.0, 0.0, 6.0]);
        let x = f(&[3, 3], &[2.0, -3.0, 1.0, 2.0, 0.0, -1.0, 1.0, 4.0, 5.0]);
        assert_close(&run("Det", vec![], &[&x])[0], &[], &[49.0]);
    }
}
