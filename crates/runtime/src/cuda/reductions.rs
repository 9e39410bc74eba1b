//! Reductions whose axes are not the trailing ones (issue 19, item 6): over axis 0 of a
//! `[1000, 3]` tensor, or over middle axes. (Trailing axes are contiguous rows, which
//! `reduce_rows_f32` takes a block each.)
//!
//! A thread per output (`reduce_f32`) is right when there are outputs enough to fill the GPU:
//! each thread's serial loop is short next to the others running beside it, and consecutive
//! threads read consecutive addresses when the kept axes are trailing. With few outputs it
//! leaves the GPU idle while a handful of threads each read a long run (a reduction to 3 values
//! of 1,000 each reads 1,000 values in turn on 3 threads), so below [`FEW_OUTPUTS`] outputs
//! of at least [`WARP`] values each, `reduce_blocks_f32` gives each output a block whose
//! threads share its values and combine them in shared memory.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gpu::{cuda_error, Dims, Gpu};

/// Outputs below which a thread per output leaves a large GPU mostly idle: an H100 keeps
/// 132 SMs × 2,048 = 270,336 threads resident, so 16,384 threads fill at most 6 % of it, while
/// 16,384 blocks are still only ~16 waves of 256-thread blocks at 8 blocks per SM.
const FEW_OUTPUTS: usize = 16_384;
/// Reduced values per output below which a block would idle most of its threads (one warp).
const WARP: usize = 32;
/// Most threads per output's block (`block_reduce` wants a power of two).
const MAX_THREADS: usize = 256;
/// Blocks beyond this loop over the outputs.
const MAX_BLOCKS: usize = 65_535;

/// Reduces `x` into `out` (`n_out` outputs of `count` values, placed by `kept` and walked by
/// `reduced`, the Dims of `reduce_f32`) with a code of `reduce_rows_f32`: a block per output
/// when they are few and long, else a thread per output.
pub(super) fn reduce_strided(
    gpu: &Gpu,
    (x, out): (&CudaSlice<f32>, &mut CudaSlice<f32>),
    (kept, reduced): (Dims, Dims),
    (n_out, count): (usize, usize),
    code: i32,
) -> Result<(), String> {
    let a_block_each = n_out < FEW_OUTPUTS && count >= WARP;
    let (function, config) = if a_block_each {
        let threads = count.next_power_of_two().min(MAX_THREADS) as u32;
        let config = LaunchConfig {
            grid_dim: (n_out.clamp(1, MAX_BLOCKS) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: threads * 4,
        };
        (&gpu.functions.reduce_blocks, config)
    } else {
        (&gpu.functions.reduce, Gpu::grid(n_out))
    };
    let (n64, c64) = (n_out as i64, count as i64);
    let mut launch = gpu.stream.launch_builder(function);
    launch
        .arg(x)
        .arg(out)
        .arg(&n64)
        .arg(&kept)
        .arg(&reduced)
        .arg(&c64)
        .arg(&code);
    // SAFETY: argument types match `reduce_f32` and `reduce_blocks_f32` (the same list); the
    // strides are the input's own, `out` holds n_out floats, and a block's shared memory is one
    // float per thread.
    unsafe { launch.launch(config) }.map_err(cuda_error("launch"))?;
    Ok(())
}
