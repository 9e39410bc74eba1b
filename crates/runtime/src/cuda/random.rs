//! [Bernoulli](https://onnx.ai/onnx/operators/onnx__Bernoulli.html) on the device, drawing what
//! the CPU kernel draws (`kernels/random.rs`): its generator is SplitMix64, whose draw `i` is a
//! function of the seed and `i` alone, so `bernoulli_f32` computes each element's draw in its
//! own thread and gives the CPU's very outputs, the `seed` attribute (else the node's name)
//! fixing them run to run. A boolean `dtype` makes a device mask (`masks.rs`: the same 0s and
//! 1s); an integer one is left to the CPU kernel (integer tensors live on the host).

use cudarc::driver::PushKernelArg;

use super::gpu::{cuda_error, Gpu};
use super::operands::{device, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{draw_seed, random_output_dtype, Ctx};
use crate::tensor::runtime_dtype;
use pipecut_ir::graph::DType;

pub(super) fn bernoulli(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(p) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let mask = match random_output_dtype(ctx, None).map(runtime_dtype) {
        Ok(DType::F32) => false,
        Ok(DType::Bool) => true,
        _ => return Ok(None),
    };
    let n = p.data.len();
    let mut out = gpu.alloc(n)?;
    let (count, seed) = (n as i64, draw_seed(ctx));
    let mut launch = gpu.stream.launch_builder(&gpu.functions.bernoulli);
    launch.arg(&*p.data).arg(&mut out).arg(&count).arg(&seed);
    // SAFETY: argument types match `bernoulli_f32`; both buffers hold n floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    if mask {
        one(DeviceTensor::mask(p.shape.clone(), out))
    } else {
        one(DeviceTensor::new(p.shape.clone(), out))
    }
}
