//! The element-wise fast path, chosen on the host: when every operand of a binary op, a
//! comparison or a Where on a device mask is the output's shape, one element, or a row the
//! output repeats (its shape, leading 1s aside, is the output's trailing dims), and the output
//! holds fewer than 2³¹ elements (a Where's condition on the host too), the `*_flat_f32` kernels read operand k at `i`, 0 or
//! `i mod len_k` with 32-bit indices, where the general kernels divide a 64-bit index by every
//! dimension of the output. Anything else (a broadcast in the middle, a bigger output) takes
//! the general kernels. `PIPECUT_CUDA_FLAT=off` turns the fast path off, to compare the two.

use std::sync::OnceLock;

use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::value::DeviceTensor;

/// Largest output the 32-bit kernels take: below 2³¹, `i` plus a grid's stride cannot wrap.
const MAX_ELEMENTS: usize = (1 << 31) - 1;

/// Whether the fast path is on (it is unless `PIPECUT_CUDA_FLAT=off`).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PIPECUT_CUDA_FLAT").map_or(true, |v| v != "off"))
}

/// The output's element count and each operand's, when every operand is read flat at `i`, 0
/// or `i mod len` (see the module's note); `None` sends the op to the general kernel.
pub(super) fn lens(out: &[usize], operands: &[&[usize]]) -> Option<(u32, Vec<u32>)> {
    let n = numel(out);
    if !enabled() || n == 0 || n > MAX_ELEMENTS {
        return None;
    }
    let lens = operands
        .iter()
        .map(|shape| {
            let leading_ones = shape.iter().take_while(|&&d| d == 1).count();
            let core = &shape[leading_ones..];
            let repeats = core.len() <= out.len() && core == &out[out.len() - core.len()..];
            repeats.then(|| numel(core) as u32)
        })
        .collect::<Option<Vec<u32>>>()?;
    Some((n as u32, lens))
}

/// `function` (`binary_flat_f32` or `mask_binary_flat_f32`) with `code` over `a` and `b` into
/// a new buffer of `shape`, or `None` when the operands need the general kernel.
pub(super) fn pair(
    gpu: &Gpu,
    function: &CudaFunction,
    (a, b): (&DeviceTensor, &DeviceTensor),
    shape: &[usize],
    code: i32,
) -> Result<Option<CudaSlice<f32>>, String> {
    let Some((n, lens)) = lens(shape, &[&a.shape, &b.shape]) else {
        return Ok(None);
    };
    let mut out = gpu.alloc(n as usize)?;
    let mut launch = gpu.stream.launch_builder(function);
    launch
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n)
        .arg(&lens[0])
        .arg(&lens[1])
        .arg(&code);
    // SAFETY: argument types match both kernels; each operand holds its `len` elements, and
    // `lens` read it at `i` (len n), 0 or `i mod len`, all below its length.
    unsafe { launch.launch(Gpu::grid(n as usize)) }.map_err(cuda_error("launch"))?;
    Ok(Some(out))
}

/// A Where's condition: a device mask, or bytes uploaded from a host boolean tensor.
pub(super) enum Condition<'c> {
    Mask(&'c DeviceTensor),
    Flags(&'c CudaSlice<u8>, &'c [usize]),
}

/// `cond ? a : b` into a new buffer of `shape` (`where_mask_flat_f32` or `where_flat_f32`), or
/// `None` when the operands need the general kernel.
pub(super) fn choose(
    gpu: &Gpu,
    cond: Condition,
    (a, b): (&DeviceTensor, &DeviceTensor),
    shape: &[usize],
) -> Result<Option<CudaSlice<f32>>, String> {
    let cond_shape = match cond {
        Condition::Mask(mask) => &mask.shape[..],
        Condition::Flags(_, shape) => shape,
    };
    let Some((n, lens)) = lens(shape, &[cond_shape, &a.shape, &b.shape]) else {
        return Ok(None);
    };
    let mut out = gpu.alloc(n as usize)?;
    let flat = &gpu.functions.flat;
    let mut launch = match cond {
        Condition::Mask(mask) => {
            let mut launch = gpu.stream.launch_builder(&flat.where_mask);
            launch.arg(&*mask.data);
            launch
        }
        Condition::Flags(flags, _) => {
            let mut launch = gpu.stream.launch_builder(&flat.where_flags);
            launch.arg(flags);
            launch
        }
    };
    launch
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n)
        .arg(&lens[0])
        .arg(&lens[1])
        .arg(&lens[2]);
    // SAFETY: argument types match `where_mask_flat_f32` (a float condition) and
    // `where_flat_f32` (a byte condition); reads stay inside each operand as in `pair`.
    unsafe { launch.launch(Gpu::grid(n as usize)) }.map_err(cuda_error("launch"))?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_read_flat_are_same_shaped_scalars_or_trailing_rows() {
        let out = [3, 5, 7];
        assert_eq!(lens(&out, &[&[3, 5, 7], &[7]]), Some((105, vec![105, 7])));
        assert_eq!(lens(&out, &[&[1, 5, 7], &[]]), Some((105, vec![35, 1])));
        assert_eq!(lens(&out, &[&[1, 1, 1], &[1]]), Some((105, vec![1, 1])));
        // A broadcast in the middle or at the end is not a repeated row.
        assert_eq!(lens(&out, &[&[3, 5, 7], &[5, 1]]), None);
        assert_eq!(lens(&out, &[&[3, 1, 7], &[3, 5, 7]]), None);
        assert_eq!(lens(&[0, 7], &[&[0, 7], &[7]]), None);
        assert_eq!(lens(&[1 << 16, 1 << 15], &[&[1 << 15]]), None);
    }
}
