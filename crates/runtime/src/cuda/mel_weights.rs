//! [MelWeightMatrix](https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html) (opset 17) on
//! the device, with the CPU kernel's semantics (`kernels/spectral.rs`): its scalar inputs are
//! read on the host, which computes the `num_mel_bins + 2` filter edges with the CPU kernel's
//! own function; `mel_weights_f32` fills the `[dft_length/2 + 1, num_mel_bins]` matrix, a
//! thread per weight, with the CPU kernel's f64 ratios. Edges outside the spectrogram, which
//! the CPU kernel refuses, are left to it so its error is the one reported.

use cudarc::driver::PushKernelArg;

use super::gpu::{cuda_error, Gpu};
use super::operands::{host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{checked_size, mel_filter_edges, mel_inputs};
use crate::tensor::HostTensor;

pub(super) fn mel_weight_matrix(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let mut scalars: Vec<std::sync::Arc<HostTensor>> = Vec::with_capacity(5);
    for i in 0..5 {
        match host(gpu, args, i)? {
            Some(t) => scalars.push(t),
            None => return Ok(None),
        }
    }
    let refs: Vec<Option<&HostTensor>> = scalars.iter().map(|t| Some(&**t)).collect();
    let Ok((mel_bins, dft_length, sample_rate, lower, upper)) = mel_inputs(&refs) else {
        return Ok(None);
    };
    let (mel, bins) = (mel_bins as usize, dft_length as usize / 2 + 1);
    let Ok(count) = checked_size(&[bins, mel]) else {
        return Ok(None);
    };
    let edges = mel_filter_edges(mel, dft_length, sample_rate, lower, upper);
    if count == 0 || !edges_fit(&edges, bins as i64) {
        return Ok(None);
    }
    let edges = gpu.upload(&edges)?;
    let mut out = gpu.alloc(count)?;
    let (bins64, mel64) = (bins as i64, mel as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.mel_weights);
    launch.arg(&edges).arg(&mut out).arg(&bins64).arg(&mel64);
    // SAFETY: argument types match `mel_weights_f32`; `edges` holds mel + 2 values and `out`
    // bins · mel floats, each written once.
    unsafe { launch.launch(Gpu::grid(count)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(vec![bins, mel], out))
}

/// Whether every spectrogram bin the CPU kernel writes for these edges is inside `0..bins`: per
/// filter its centre, the rising side `left..=center` and the falling side `center..right`.
fn edges_fit(edges: &[i64], bins: i64) -> bool {
    let inside = |j: i64| (0..bins).contains(&j);
    edges.windows(3).all(|w| {
        let (left, center, right) = (w[0], w[1], w[2]);
        let rising = left >= center || (inside(left) && inside(center));
        let falling = right <= center || (inside(center) && inside(right - 1));
        let centre = left != center || inside(center);
        rising && falling && centre
    })
}
