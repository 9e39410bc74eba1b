//! Matrix products: `MatMul` (numpy semantics: 1-D promotion, broadcast batch dims) and `Gemm`.
//!
//! Specs: <https://onnx.ai/onnx/operators/onnx__MatMul.html>,
//! <https://onnx.ai/onnx/operators/onnx__Gemm.html>, opsets 7 to 23.
//!
//! The inner product is the `gemm` crate's (faer's kernels): BLIS-style packing with
//! microkernels for SSE, AVX2/FMA and AVX-512 picked at run time, and arbitrary row and column
//! strides, so transposed operands (`Gemm` with `transA`/`transB`, `MatMul` against a transposed
//! view) need no copy. It replaced `matrixmultiply`, 1.2–1.8× slower on the products the
//! benchmark models make (docs/benchmarks.md, "Matrix products through the gemm crate").

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::{broadcast_offsets, broadcast_shapes};
use crate::tensor::try_zeros_f32;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["MatMul"], matmul);
    t.add(&["Gemm"], gemm);
}

/// `c = alpha · a · b + beta · c` for row-major-with-strides operands, `c` row-major m × n.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    beta: f32,
    c: &mut [f32],
) {
    sgemm_rows(m, k, n, alpha, a, a_strides, b, b_strides, beta, c, n);
}

/// [`sgemm`] into an m × n block of a wider row-major matrix: row `i` of the block starts at
/// `c[i · c_row_stride]` (a convolution writes a tile of output columns this way).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_rows(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    c_row_stride: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        k == 0 || (m - 1) * rsa + (k - 1) * csa < a.len(),
        "A is too short"
    );
    assert!(
        k == 0 || (k - 1) * rsb + (n - 1) * csb < b.len(),
        "B is too short"
    );
    assert!(
        n <= c_row_stride && c.len() >= (m - 1) * c_row_stride + n,
        "C is too short"
    );
    if k == 0 {
        // No terms: gemm would leave `c` as it was, ONNX wants beta · c.
        for row in c.chunks_mut(c_row_stride).take(m) {
            for v in &mut row[..n] {
                *v = if beta == 0.0 { 0.0 } else { beta * *v };
            }
        }
        return;
    }
    // SAFETY: the asserts above bound every index gemm reads from `a` and `b` and writes to `c`
    // (m rows of n at stride `c_row_stride`); the slices outlive the call and `c` is not aliased.
    // gemm's `alpha` scales the destination and its `beta` the product; with `read_dst` false
    // the destination is only written (a `c` of garbage with beta 0 stays out of the result).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_row_stride as isize,
            beta != 0.0,
            a.as_ptr(),
            csa as isize,
            rsa as isize,
            b.as_ptr(),
            csb as isize,
            rsb as isize,
            beta,
            alpha,
            false,
            false,
            false,
            product_parallelism(),
        );
    }
}

/// `out[i·n + j] = a_i · b_j` for the rows `a_i` of `a` and `b_j` of `b`, each `k` long (`out` is
/// m × n): one dot product per element. gemm packs a whole operand on every call, which cost a
/// streaming model (silero-vad: convolutions over one chunk's 1 to 4 positions, an LSTM step of
/// batch 1 against `R`) more than its arithmetic. Each element is a function of its two rows
/// alone, so a row's result does not depend on how many rows come with it: a micro-batch gives
/// the bits the whole batch gives, as the pipelines' tests require. The callers choose this
/// path on what splitting the batch leaves alone (an LSTM's `R`, a convolution's positions per
/// image), never on the number of rows.
pub(crate) fn row_dots(a: &[f32], b: &[f32], k: usize, out: &mut [f32]) {
    use super::fast_math::{dot, dots_2x2};
    let k = k.max(1);
    let (m, n) = (a.len() / k, b.len() / k);
    fn row(matrix: &[f32], i: usize, k: usize) -> &[f32] {
        &matrix[i * k..(i + 1) * k]
    }
    // Two rows of `a` by two of `b` at a time: each row loaded once for two products.
    for i in (0..m).step_by(2) {
        for j in (0..n).step_by(2) {
            if i + 1 < m && j + 1 < n {
                let [v00, v01, v10, v11] = dots_2x2(
                    [row(a, i, k), row(a, i + 1, k)],
                    [row(b, j, k), row(b, j + 1, k)],
                );
                out[i * n + j] = v00;
                out[i * n + j + 1] = v01;
                out[(i + 1) * n + j] = v10;
                out[(i + 1) * n + j + 1] = v11;
                continue;
            }
            for ii in i..(i + 2).min(m) {
                for jj in j..(j + 2).min(n) {
                    out[ii * n + jj] = dot(row(a, ii, k), row(b, jj, k));
                }
            }
        }
    }
}

/// How many threads one product may use: `MATMUL_NUM_THREADS` (the variable `pipecut profile
/// --threads` and the stage benchmarks set, the name matrixmultiply read before), else every
/// core. Read once: a product in the middle of a run does not change its threading.
fn product_parallelism() -> gemm::Parallelism {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        std::env::var("MATMUL_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
    });
    if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

fn matmul(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let MatmulLayout {
        m,
        k,
        n,
        a_index,
        b_index,
        out_shape,
    } = matmul_layout(a.shape(), b.shape())?;
    let mut out = try_zeros_f32(&[a_index.len(), m, n])?;
    // A stack of A matrices times one B (activations times a weight) is one product with the
    // stack's rows as M: B is packed once, and the kernel sees one tall matrix, not many short.
    let one_b = b_index.iter().all(|&ib| ib == b_index[0]);
    let a_in_order = a_index.iter().enumerate().all(|(p, &ia)| p == ia);
    if one_b && a_in_order && a_index.len() > 1 {
        let ib = b_index[0];
        let rows = a_index.len() * m;
        sgemm(
            rows,
            k,
            n,
            1.0,
            &av[..rows * k],
            (k, 1),
            &bv[ib * k * n..(ib + 1) * k * n],
            (n, 1),
            0.0,
            &mut out,
        );
        return Ok(vec![HostTensor::f32(out_shape, out)]);
    }
    for (p, (&ia, &ib)) in a_index.iter().zip(&b_index).enumerate() {
        sgemm(
            m,
            k,
            n,
            1.0,
            &av[ia * m * k..(ia + 1) * m * k],
            (k, 1),
            &bv[ib * k * n..(ib + 1) * k * n],
            (n, 1),
            0.0,
            &mut out[p * m * n..(p + 1) * m * n],
        );
    }
    Ok(vec![HostTensor::f32(out_shape, out)])
}

/// How a MatMul-like op (MatMul, MatMulInteger, QLinearMatMul) pairs its operands, as numpy
/// does: 1-D operands promoted to matrices, batch dims broadcast; `a_index`/`b_index` give each
/// output matrix's A and B matrix, and `out_shape` drops the dims the promotion added.
pub(super) struct MatmulLayout {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_index: Vec<usize>,
    pub b_index: Vec<usize>,
    pub out_shape: Vec<usize>,
}

pub(super) fn matmul_layout(a: &[usize], b: &[usize]) -> Result<MatmulLayout, String> {
    if a.is_empty() || b.is_empty() {
        return Err("scalars cannot be multiplied as matrices".into());
    }
    let a_shape: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b_shape: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let (k2, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
    if k != k2 {
        return Err(format!("inner dims differ: {a:?} × {b:?}"));
    }
    let a_batch = &a_shape[..a_shape.len() - 2];
    let b_batch = &b_shape[..b_shape.len() - 2];
    let mut out_shape = broadcast_shapes(&[a_batch, b_batch])?;
    let a_index = broadcast_offsets(a_batch, &out_shape)?;
    let b_index = broadcast_offsets(b_batch, &out_shape)?;
    if a.len() > 1 {
        out_shape.push(m);
    }
    if b.len() > 1 {
        out_shape.push(n);
    }
    super::indexing::checked_size(&out_shape)?;
    Ok(MatmulLayout {
        m,
        k,
        n,
        a_index,
        b_index,
        out_shape,
    })
}

fn gemm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return Err(format!(
            "Gemm needs 2-D operands, got {:?} and {:?}",
            a.shape(),
            b.shape()
        ));
    }
    let trans_a = ctx.int("transA", 0) != 0;
    let trans_b = ctx.int("transB", 0) != 0;
    let alpha = ctx.float("alpha", 1.0);
    let beta = ctx.float("beta", 1.0);
    let (m, k) = if trans_a {
        (a.shape()[1], a.shape()[0])
    } else {
        (a.shape()[0], a.shape()[1])
    };
    let (k2, n) = if trans_b {
        (b.shape()[1], b.shape()[0])
    } else {
        (b.shape()[0], b.shape()[1])
    };
    if k != k2 {
        return Err(format!(
            "inner dims differ: {:?} × {:?}",
            a.shape(),
            b.shape()
        ));
    }
    let a_strides = if trans_a { (1, m) } else { (k, 1) };
    let b_strides = if trans_b { (1, k) } else { (n, 1) };
    let mut out = try_zeros_f32(&[m, n])?;
    let mut c_beta = 0.0;
    if let Some(c) = optional(inputs, 2) {
        if broadcast_shapes(&[c.shape(), &[m, n]])? != [m, n] {
            return Err(format!(
                "C of shape {:?} does not broadcast to [{m}, {n}]",
                c.shape()
            ));
        }
        let cv = c.to_f32_vec();
        let bias_row = matches!(c.shape(), [len] | [1, len] if *len == n);
        if bias_row && n > 0 {
            // A bias row (`[n]` or `[1, n]`), the usual C: copied row by row.
            for row in out.chunks_mut(n) {
                row.copy_from_slice(&cv);
            }
        } else {
            let offsets = broadcast_offsets(c.shape(), &[m, n])?;
            for (o, &i) in out.iter_mut().zip(&offsets) {
                *o = cv[i];
            }
        }
        c_beta = beta;
    }
    sgemm(
        m,
        k,
        n,
        alpha,
        a.as_f32()?,
        a_strides,
        b.as_f32()?,
        b_strides,
        c_beta,
        &mut out,
    );
    Ok(vec![HostTensor::f32(vec![m, n], out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn matmul_batches_and_promotes_vectors() {
        let a = f(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f(&[2, 2], &[1.0, 0.0, 1.0, 1.0]);
        assert_close(
            &run("MatMul", vec![], &[&a, &b])[0],
            &[2, 1, 2],
            &[3.0, 2.0, 7.0, 4.0],
        );
        let v = f(&[2], &[1.0, -1.0]);
        assert_close(&run("MatMul", vec![], &[&b, &v])[0], &[2], &[1.0, 0.0]);
        assert_close(&run("MatMul", vec![], &[&v, &b])[0], &[2], &[0.0, -1.0]);
    }

    #[test]
    fn gemm_transposes_scales_and_adds_bias() {
        let a = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]); // A^T is 3×2
        let b = f(&[2, 2], &[1.0, 0.0, 1.0, 1.0]); // B^T = [[1,1],[0,1]]
        let c = f(&[2], &[10.0, 20.0]);
        let out = run(
            "Gemm",
            vec![
                ("transA", Attribute::Int(1)),
                ("transB", Attribute::Int(1)),
                ("alpha", Attribute::Float(2.0)),
                ("beta", Attribute::Float(0.5)),
            ],
            &[&a, &b, &c],
        );
        // A^T·B^T = [[1,5],[2,7],[3,9]]; ·2 + 0.5·[10, 20]
        assert_close(&out[0], &[3, 2], &[7.0, 20.0, 9.0, 24.0, 11.0, 28.0]);
    }
}
