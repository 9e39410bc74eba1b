//! [Det](https://onnx.ai/onnx/operators/onnx__Det.html) on the device (opsets 11–22): the
//! determinant of each trailing `M × M` matrix by LU decomposition with partial pivoting in
//! f64, the CPU kernel's algorithm (`kernels/linalg.rs`) step for step: the same pivot rows,
//! swaps and eliminations, so singular matrices give 0 and the signs agree.
//!
//! `det_f32` runs one block per matrix in a scratch copy of doubles: thread 0 picks each
//! column's pivot, the block swaps the rows and eliminates below it in parallel.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, one, OpResult};
use super::value::{DeviceTensor, Value};

/// Most threads a matrix's block gets; a smaller matrix gets a power of two near its size.
const MAX_THREADS: usize = 256;
/// Blocks beyond this loop over the matrices (the grid's x limit is far higher; more blocks
/// than a GPU holds at once only queue).
const MAX_BLOCKS: usize = 65_535;

pub(super) fn det(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    // A non-square input is the CPU kernel's error to report.
    if rank < 2 || x.shape[rank - 1] != x.shape[rank - 2] {
        return Ok(None);
    }
    let m = x.shape[rank - 1];
    let batch = &x.shape[..rank - 2];
    let count = numel(batch);
    // SAFETY: `det_f32` writes every double of a matrix's scratch before reading it.
    let mut scratch =
        unsafe { gpu.stream.alloc::<f64>(count * m * m) }.map_err(cuda_error("allocation"))?;
    let mut out = gpu.alloc(count)?;
    let threads = (m * m).next_power_of_two().clamp(32, MAX_THREADS) as u32;
    let config = LaunchConfig {
        grid_dim: (count.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        // The determinant so far and the pivot row.
        shared_mem_bytes: 2 * 8,
    };
    let (count, m) = (count as i64, m as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.det);
    launch
        .arg(&*x.data)
        .arg(&mut scratch)
        .arg(&mut out)
        .arg(&count)
        .arg(&m);
    // SAFETY: argument types match `det_f32`; `x` and the scratch hold count · m · m values,
    // `out` count; shared memory is the two doubles the kernel uses.
    unsafe { launch.launch(config) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(batch.to_vec(), out))
}
