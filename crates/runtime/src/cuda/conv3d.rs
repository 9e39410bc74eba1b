//! 3-D [Conv](https://onnx.ai/onnx/operators/onnx__Conv.html) and
//! [ConvTranspose](https://onnx.ai/onnx/operators/onnx__ConvTranspose.html) (inputs
//! `[n, c, d, h, w]`) on the device: `conv3d_f32`, a thread per output value (the 1-D and 2-D
//! ones stay on `window_ops.rs`'s im2col and GEMM). Conv's geometry follows ONNX's rules for
//! pads and `auto_pad`; ConvTranspose's is the CPU kernel's own (`conv_transpose_geometry`:
//! output padding, `output_shape`, SAME padding). Anything else is left to the CPU kernel.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{conv_transpose_geometry, Ctx};

/// The geometry, laid out as `struct Window3d` in `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Window3d {
    n: i64,
    c: i64,
    m: i64,
    groups: i64,
    input: [i64; 3],
    output: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    pad: [i64; 3],
    dilation: [i64; 3],
}

// SAFETY: `Window3d` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for Window3d {}

/// Three positive entries of attribute `name` (1 each when absent); `None` otherwise.
fn three(ctx: &Ctx, name: &str) -> Option<[i64; 3]> {
    match ctx.ints(name) {
        None => Some([1; 3]),
        Some(v) if v.len() == 3 && v.iter().all(|&s| s > 0) => Some([v[0], v[1], v[2]]),
        Some(_) => None,
    }
}

/// Conv's leading pads and output sizes, by `auto_pad` or the explicit pads.
fn conv_geometry(ctx: &Ctx, g: &Window3d) -> Option<([i64; 3], [i64; 3])> {
    let (mut pad, mut output) = ([0i64; 3], [0i64; 3]);
    let auto_pad = ctx.string("auto_pad", "NOTSET");
    let pads = ctx.ints("pads").unwrap_or_else(|| vec![0; 6]);
    if pads.len() != 6 {
        return None;
    }
    for a in 0..3 {
        let reach = (g.kernel[a] - 1) * g.dilation[a] + 1;
        let (begin, end) = match auto_pad.as_str() {
            "NOTSET" => (pads[a], pads[a + 3]),
            "VALID" => (0, 0),
            "SAME_UPPER" | "SAME_LOWER" => {
                let out = (g.input[a] + g.stride[a] - 1) / g.stride[a];
                let total = ((out - 1) * g.stride[a] + reach - g.input[a]).max(0);
                if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            }
            _ => return None,
        };
        let span = g.input[a] + begin + end - reach;
        if span < 0 || begin < 0 || end < 0 {
            return None;
        }
        pad[a] = begin;
        output[a] = span / g.stride[a] + 1;
    }
    Some((pad, output))
}

/// Conv or ConvTranspose over a 5-D input.
pub(super) fn conv3d(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(w)) = (device(gpu, args, 0)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let bias = match args.get(2) {
        Some(Some(_)) => match device(gpu, args, 2)? {
            Some(b) => Some(b),
            None => return Ok(None),
        },
        _ => None,
    };
    let (&[n, c, d, h, wd], &[w0, w1, kd, kh, kw]) = (x.shape.as_slice(), w.shape.as_slice())
    else {
        return Ok(None);
    };
    let transposed = ctx.node.op_type == "ConvTranspose";
    let groups = ctx.int("group", 1);
    let Some(groups) = usize::try_from(groups).ok().filter(|&g| g > 0) else {
        return Ok(None);
    };
    // Conv weights are [m, c/groups, k…]; ConvTranspose's [c, m/groups, k…].
    let (m, agrees) = if transposed {
        (w1 * groups, w0 == c && c % groups == 0)
    } else {
        (w0, w1 * groups == c && w0 % groups == 0)
    };
    let kernel_attr = ctx.ints("kernel_shape");
    let kernel_agrees = kernel_attr.is_none_or(|k| k == [kd as i64, kh as i64, kw as i64]);
    if !agrees || !kernel_agrees || bias.as_ref().is_some_and(|b| numel(&b.shape) != m) {
        return Ok(None);
    }
    let (Some(stride), Some(dilation)) = (three(ctx, "strides"), three(ctx, "dilations")) else {
        return Ok(None);
    };
    let i = |v: usize| v as i64;
    let mut g = Window3d {
        n: i(n),
        c: i(c),
        m: i(m),
        groups: i(groups),
        input: [i(d), i(h), i(wd)],
        kernel: [i(kd), i(kh), i(kw)],
        stride,
        dilation,
        ..Window3d::default()
    };
    if transposed {
        let Ok(geo) = conv_transpose_geometry(ctx, &[d, h, wd], &[kd, kh, kw]) else {
            return Ok(None);
        };
        if geo
            .strides
            .iter()
            .zip(&stride)
            .any(|(&a, &b)| a as i64 != b)
        {
            return Ok(None);
        }
        for a in 0..3 {
            g.pad[a] = geo.pad_begin[a];
            g.output[a] = i(geo.output[a]);
        }
    } else {
        let Some((pad, output)) = conv_geometry(ctx, &g) else {
            return Ok(None);
        };
        (g.pad, g.output) = (pad, output);
    }
    let shape = vec![
        n,
        m,
        g.output[0] as usize,
        g.output[1] as usize,
        g.output[2] as usize,
    ];
    let total = numel(&shape);
    if total == 0 {
        return Ok(None);
    }
    let mut out = gpu.alloc(total)?;
    let (transposed, has_bias) = (transposed as i32, bias.is_some() as i32);
    // Without a bias the kernel never reads its bias argument; the weights stand in.
    let bias_data = bias.as_ref().map_or(&*w.data, |b| &*b.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.conv3d);
    launch
        .arg(&*x.data)
        .arg(&*w.data)
        .arg(bias_data)
        .arg(&mut out)
        .arg(&g)
        .arg(&transposed)
        .arg(&has_bias);
    // SAFETY: argument types match `conv3d_f32`; every input index it reads is checked against
    // the input volume, and the weights hold the taps of every channel pair the groups make.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}
