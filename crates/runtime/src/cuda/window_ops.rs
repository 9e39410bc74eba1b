//! The CNN ops on the device: Conv, ConvTranspose, MaxPool, AveragePool, LpPool,
//! GlobalAveragePool, GlobalMaxPool and inference BatchNormalization. Conv, ConvTranspose and
//! the 1-D and 2-D pools share the window geometry of the CPU runtime's `kernels/conv.rs`
//! (3-D convolutions are left to the CPU); 3-D pools and LpPool share `kernels/pool_nd.rs`'s.
//!
//! A convolution with several input channels per group is im2col (`im2col_f32`) followed by one
//! strided-batched cuBLAS GEMM per group over a chunk of images, the bias written into the
//! output first; a 1×1 convolution with stride 1 and no padding multiplies the input itself.
//! One input channel per group (depthwise) runs `conv_direct_f32`, a thread per output value:
//! im2col would leave a GEMM of one row per channel.

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::epilogue::DeviceEpilogue;
use super::gpu::{broadcast_strides, cuda_error, numel, Gpu};
use super::operands::{device, extra_outputs, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{
    conv_group, conv_transpose_geometry, nchw_of, pool_geometry, spatial, window, Ctx, Window,
};
use crate::tensor::HostTensor;

/// `struct Window2d` of `kernels.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Window2d {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    m: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    dh: i64,
    dw: i64,
    ph: i64,
    pw: i64,
    ph1: i64,
    pw1: i64,
    groups: i64,
}

// SAFETY: `Window2d` is `repr(C)` plain data matching the CUDA struct.
unsafe impl DeviceRepr for Window2d {}

impl Window2d {
    /// Input `[n, c, h, w]`, `m` output channels over an `[oh, ow]` plane, the window, groups.
    fn new(nchw: [usize; 4], (m, out): (usize, [usize; 2]), win: &Window, groups: usize) -> Self {
        let i = |v: usize| v as i64;
        let [n, c, h, w] = nchw;
        Window2d {
            n: i(n),
            c: i(c),
            h: i(h),
            w: i(w),
            m: i(m),
            oh: i(out[0]),
            ow: i(out[1]),
            kh: i(win.kernel[0]),
            kw: i(win.kernel[1]),
            sh: i(win.stride[0]),
            sw: i(win.stride[1]),
            dh: i(win.dilation[0]),
            dw: i(win.dilation[1]),
            ph: i(win.pad[0][0]),
            pw: i(win.pad[1][0]),
            ph1: i(win.pad[0][1]),
            pw1: i(win.pad[1][1]),
            groups: i(groups),
        }
    }
}

/// The output shape of a window op: `[n, channels, oh, ow]`, or `[n, channels, ow]` for 1-D.
fn window_output_shape(n: usize, channels: usize, [oh, ow]: [usize; 2], one_d: bool) -> Vec<usize> {
    if one_d {
        vec![n, channels, ow]
    } else {
        vec![n, channels, oh, ow]
    }
}

/// Floats of im2col columns made at once (256 MiB): the images of a batch are convolved in
/// chunks that fit.
const COLUMN_FLOATS: usize = 64 << 20;

pub(super) fn conv(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    conv_then(gpu, ctx, args, &DeviceEpilogue::default())
}

/// A 1-D or 2-D Conv with `epilogue` (`conv_fold.rs`) applied to its output.
pub(super) fn conv_then(
    gpu: &Gpu,
    ctx: &Ctx,
    args: &[Option<Value>],
    epilogue: &DeviceEpilogue,
) -> OpResult {
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
    if x.shape.len() != w.shape.len() || !(3..=4).contains(&x.shape.len()) {
        return Ok(None);
    }
    let ([n, c, h, wd], one_d) = nchw_of(&x.shape)?;
    let ([m, cg, kh, kw], _) = nchw_of(&w.shape)?;
    let group = conv_group(ctx, c, &w.shape)?;
    if let Some(b) = &bias {
        if numel(&b.shape) != m {
            return Err(format!(
                "bias has {} entries for {m} output channels",
                numel(&b.shape)
            ));
        }
    }
    let win = window(ctx, one_d, [kh, kw], [h, wd])?;
    let out_hw = win.output([h, wd], false)?;
    let geometry = Window2d::new([n, c, h, wd], (m, out_hw), &win, group);
    let shape = window_output_shape(n, m, out_hw, one_d);
    if cg == 1 {
        let out = conv_direct(gpu, (&x, &w, bias.as_ref()), &geometry, epilogue)?;
        return one(DeviceTensor::new(shape, out));
    }
    if epilogue.is_identity() {
        let out = conv_gemm(gpu, &x, &w, bias.as_ref(), &geometry, &win)?;
        return one(DeviceTensor::new(shape, out));
    }
    // The epilogue's launch adds the bias too.
    let mut out = DeviceTensor::new(shape, conv_gemm(gpu, &x, &w, None, &geometry, &win)?);
    epilogue.apply(gpu, &mut out, bias.as_ref())?;
    one(out)
}

/// A depthwise convolution, `epilogue` applied as each value is written.
fn conv_direct(
    gpu: &Gpu,
    (x, w, bias): (&DeviceTensor, &DeviceTensor, Option<&DeviceTensor>),
    g: &Window2d,
    epilogue: &DeviceEpilogue,
) -> Result<cudarc::driver::CudaSlice<f32>, String> {
    let total = (g.n * g.m * g.oh * g.ow) as usize;
    let mut out = gpu.alloc(total)?;
    let norm = epilogue.norm_pointer(gpu, g.m as usize, &w.data)?;
    let has_bias = bias.is_some() as i32;
    // Without a bias the kernel never reads its bias argument; the weights stand in.
    let bias_data = bias.map_or(&*w.data, |b| &*b.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.conv_direct);
    launch
        .arg(&*x.data)
        .arg(&*w.data)
        .arg(bias_data)
        .arg(&mut out)
        .arg(g)
        .arg(&has_bias)
        .arg(&norm)
        .arg(&epilogue.params);
    // SAFETY: argument types match `conv_direct_f32`; the geometry is the operands' own (the
    // window fits the padded input, checked by `Window::output`); `norm` holds 3 values per
    // output channel (checked) or is not read.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    Ok(out)
}

/// im2col and a GEMM per group, over chunks of images whose columns fit [`COLUMN_FLOATS`].
fn conv_gemm(
    gpu: &Gpu,
    x: &DeviceTensor,
    w: &DeviceTensor,
    bias: Option<&DeviceTensor>,
    g: &Window2d,
    win: &Window,
) -> Result<cudarc::driver::CudaSlice<f32>, String> {
    let [n, c, h, wd, m, groups] = [g.n, g.c, g.h, g.w, g.m, g.groups].map(|v| v as usize);
    let (cg, mg) = (c / groups, m / groups);
    let rows = cg * win.kernel[0] * win.kernel[1];
    let cols = (g.oh * g.ow) as usize;
    let pointwise = win.kernel == [1, 1] && win.stride == [1, 1] && win.pad == [[0, 0], [0, 0]];
    // The bias, broadcast over the output, is where the products accumulate.
    let (mut out, beta) = match bias {
        Some(b) => {
            let shape = [n, m, cols];
            let strides = broadcast_strides(&[m, 1], &shape);
            (gpu.gather_strided(&b.data, &shape, &strides, 0)?, 1.0)
        }
        None => (gpu.alloc(n * m * cols)?, 0.0),
    };
    let image_columns = groups * rows * cols;
    let chunk = (COLUMN_FLOATS / image_columns.max(1)).clamp(1, n);
    let mut columns = if pointwise {
        None
    } else {
        Some(gpu.alloc(chunk * image_columns)?)
    };
    for first in (0..n).step_by(chunk) {
        let images = chunk.min(n - first);
        if let Some(col) = columns.as_mut() {
            let (first64, images64) = (first as i64, images as i64);
            let mut launch = gpu.stream.launch_builder(&gpu.functions.im2col);
            launch
                .arg(&*x.data)
                .arg(&mut *col)
                .arg(g)
                .arg(&first64)
                .arg(&images64);
            // SAFETY: argument types match `im2col_f32`; `col` holds `chunk` images' columns
            // and `first + images <= n`.
            unsafe { launch.launch(Gpu::grid(images * image_columns)) }
                .map_err(cuda_error("launch"))?;
        }
        for group in 0..groups {
            // A pointwise convolution's columns are the input itself: image b, group g is
            // x[b, g·cg.., :], laid out as im2col would.
            let b_offset = group * rows * cols;
            let source = match columns.as_ref() {
                Some(col) => col.slice(b_offset..),
                None => x.data.slice(first * c * h * wd + b_offset..),
            };
            let weights = w.data.slice(group * mg * rows..(group + 1) * mg * rows);
            let mut target = out.slice_mut((first * m + group * mg) * cols..);
            gpu.conv_gemm_views(
                (mg, cols, rows),
                (&weights, false, &source, false),
                &mut target,
                (1.0, beta),
                (images, 0, image_columns, m * cols),
            )?;
        }
    }
    Ok(out)
}

/// ConvTranspose's window over `[n, c, h, w]` (h = kh = 1 in 1-D): the output size and leading
/// pads of the CPU's `kernels/conv_transpose_nd.rs` (explicit pads, `output_shape`, SAME
/// padding; a leading pad may be negative, which the kernel's bounds checks take).
fn conv_transpose_window(
    [n, c, h, w]: [usize; 4],
    (m, groups): (usize, usize),
    [kh, kw]: [usize; 2],
    one_d: bool,
    ctx: &Ctx,
) -> Result<Window2d, String> {
    let (spatial_in, kernel) = if one_d {
        (vec![w], vec![kw])
    } else {
        (vec![h, w], vec![kh, kw])
    };
    let geo = conv_transpose_geometry(ctx, &spatial_in, &kernel)?;
    // The position in the CPU geometry's per-axis lists of axis 0 (h) or 1 (w); none for h in
    // 1-D, whose height is 1 with a one-tap kernel.
    let index = |axis: usize| {
        if one_d {
            axis.checked_sub(1)
        } else {
            Some(axis)
        }
    };
    let pick = |v: &[usize], axis: usize| index(axis).map_or(1, |k| v[k]) as i64;
    let pad = |axis: usize| index(axis).map_or(0, |k| geo.pad_begin[k]);
    let i = |v: usize| v as i64;
    Ok(Window2d {
        n: i(n),
        c: i(c),
        h: i(h),
        w: i(w),
        m: i(m),
        oh: pick(&geo.output, 0),
        ow: pick(&geo.output, 1),
        kh: i(kh),
        kw: i(kw),
        sh: pick(&geo.strides, 0),
        sw: pick(&geo.strides, 1),
        dh: pick(&geo.dilations, 0),
        dw: pick(&geo.dilations, 1),
        ph: pad(0),
        pw: pad(1),
        // End pads only bound pooling windows; the transposed convolution's output size is
        // already the geometry's.
        ph1: 0,
        pw1: 0,
        groups: i(groups),
    })
}

/// ConvTranspose over 1-D and 2-D inputs (3-D is left to the CPU kernel).
pub(super) fn conv_transpose(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
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
    if x.shape.len() != w.shape.len() || !(3..=4).contains(&x.shape.len()) {
        return Ok(None);
    }
    let ([n, c, h, wd], one_d) = nchw_of(&x.shape)?;
    let ([wc, mg, kh, kw], _) = nchw_of(&w.shape)?;
    let group = usize::try_from(ctx.int("group", 1))
        .ok()
        .filter(|g| *g > 0)
        .ok_or("bad group")?;
    if wc != c || c % group != 0 {
        return Err(format!(
            "input has {c} channels, weight {:?} with group {group}",
            w.shape
        ));
    }
    let m = mg * group;
    if bias.as_ref().is_some_and(|b| numel(&b.shape) != m) {
        return Err(format!("bias does not have {m} entries"));
    }
    let geometry = conv_transpose_window([n, c, h, wd], (m, group), [kh, kw], one_d, ctx)?;
    let out_hw = [geometry.oh as usize, geometry.ow as usize];
    let total = n * m * out_hw[0] * out_hw[1];
    let mut out = gpu.alloc(total)?;
    let has_bias = bias.is_some() as i32;
    // Without a bias the kernel never reads its bias argument; the weights stand in.
    let bias_data = bias.as_ref().map_or(&*w.data, |b| &*b.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.conv_transpose);
    launch
        .arg(&*x.data)
        .arg(&*w.data)
        .arg(bias_data)
        .arg(&mut out)
        .arg(&geometry)
        .arg(&has_bias);
    // SAFETY: argument types match `conv_transpose_f32`; every input index it reads is checked
    // against the input plane.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(
        window_output_shape(n, m, out_hw, one_d),
        out,
    ))
}

pub(super) fn pool(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.len() == 5 || ctx.node.op_type == "LpPool" || extra_outputs(ctx) {
        return pool_nd(gpu, ctx, &x);
    }
    if !(3..=4).contains(&x.shape.len()) {
        return Ok(None);
    }
    let ([n, c, h, w], one_d) = nchw_of(&x.shape)?;
    let kernel = spatial(ctx, "kernel_shape", one_d, 0)?;
    if kernel.contains(&0) {
        return Err("kernel_shape is required".into());
    }
    let win = window(ctx, one_d, kernel, [h, w])?;
    let out_hw = win.output([h, w], ctx.int("ceil_mode", 0) != 0)?;
    let geometry = Window2d::new([n, c, h, w], (c, out_hw), &win, 1);
    let total = n * c * out_hw[0] * out_hw[1];
    let mut out = gpu.alloc(total)?;
    let is_max = (ctx.node.op_type == "MaxPool") as i32;
    let include_pad = (ctx.int("count_include_pad", 0) != 0) as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.pool);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&geometry)
        .arg(&is_max)
        .arg(&include_pad);
    // SAFETY: argument types match `pool_f32`; the geometry is the input's own.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(
        window_output_shape(n, c, out_hw, one_d),
        out,
    ))
}

/// `struct PoolNd` of `kernels.cu`: three spatial axes, fewer padded in front with size 1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PoolNd {
    planes: i64,
    input: [i64; 3],
    output: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    dilation: [i64; 3],
    pad_begin: [i64; 3],
    pad_end: [i64; 3],
}

// SAFETY: `PoolNd` is `repr(C)` plain data matching the CUDA struct.
unsafe impl DeviceRepr for PoolNd {}

/// MaxPool and AveragePool over three spatial axes, and LpPool over one to three: the window
/// geometry of the CPU's `kernels/pool_nd.rs` (its output sizes, `auto_pad` and ceil-mode
/// rules), one thread per output value.
fn pool_nd(gpu: &Gpu, ctx: &Ctx, x: &DeviceTensor) -> OpResult {
    let rank = x.shape.len();
    if !(3..=5).contains(&rank) {
        return Ok(None);
    }
    let axes = pool_geometry(ctx, &x.shape[2..])?;
    let pad = 5 - rank;
    let i = |v: usize| v as i64;
    let mut g = PoolNd {
        planes: i(x.shape[0] * x.shape[1]),
        input: [1; 3],
        output: [1; 3],
        kernel: [1; 3],
        stride: [1; 3],
        dilation: [1; 3],
        pad_begin: [0; 3],
        pad_end: [0; 3],
    };
    for (d, a) in axes.iter().enumerate() {
        let at = pad + d;
        g.input[at] = i(a.input);
        g.output[at] = i(a.output);
        g.kernel[at] = i(a.kernel);
        g.stride[at] = i(a.stride);
        g.dilation[at] = i(a.dilation);
        g.pad_begin[at] = i(a.pad_begin);
        g.pad_end[at] = i(a.pad_end);
    }
    let mut shape = x.shape[..2].to_vec();
    shape.extend(axes.iter().map(|a| a.output));
    let total = numel(&shape);
    let mut out = gpu.alloc(total)?;
    let kind: i32 = match ctx.node.op_type.as_str() {
        "AveragePool" => 0,
        "MaxPool" => 1,
        _ => 2,
    };
    let include_pad = (ctx.int("count_include_pad", 0) != 0) as i32;
    let p = ctx.int("p", 2) as f32;
    // MaxPool's Indices, when the node asks for them (a stand-in of one index otherwise).
    let with_indices = kind == 1 && extra_outputs(ctx);
    let index_count = if with_indices { total } else { 1 };
    // SAFETY: the kernel writes every index when `with_indices`, and none otherwise.
    let mut indices =
        unsafe { gpu.stream.alloc::<i64>(index_count) }.map_err(cuda_error("allocation"))?;
    let (flag, column_major) = (
        with_indices as i32,
        (ctx.int("storage_order", 0) != 0) as i32,
    );
    let mut launch = gpu.stream.launch_builder(&gpu.functions.pool_nd);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&g)
        .arg(&kind)
        .arg(&include_pad)
        .arg(&p)
        .arg(&mut indices)
        .arg(&flag)
        .arg(&column_major);
    // SAFETY: argument types match `pool_nd_f32`; every input coordinate it reads is checked
    // against the plane, and `indices` holds an index per output when they are written.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    let mut results = vec![Value::Device(DeviceTensor::new(shape.clone(), out))];
    if with_indices {
        // Indices are integers, which live on the host.
        let values = gpu
            .stream
            .clone_dtoh(&indices)
            .map_err(cuda_error("device-to-host copy"))?;
        results.push(Value::host(Arc::new(HostTensor::i64(shape, values))));
    }
    Ok(Some(results))
}

/// GlobalAveragePool and GlobalMaxPool: a reduction of each channel's plane (a row).
pub(super) fn global_pool(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.len() < 3 {
        return Ok(None);
    }
    let (planes, plane) = (numel(&x.shape[..2]), numel(&x.shape[2..]));
    let mut out = gpu.alloc(planes)?;
    // Codes of `reduce_rows_f32`: 1 mean, 2 max.
    let code = if ctx.node.op_type == "GlobalMaxPool" {
        2
    } else {
        1
    };
    gpu.reduce_rows(&x.data, &mut out, (planes, plane), code)?;
    let mut shape = x.shape[..2].to_vec();
    shape.resize(x.shape.len(), 1);
    one(DeviceTensor::new(shape, out))
}

/// Inference BatchNormalization (the statistics given, no extra outputs).
pub(super) fn batch_norm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.len() < 2 {
        return Ok(None);
    }
    let channels = x.shape[1];
    let mut stats = Vec::with_capacity(4);
    for i in 1..5 {
        match device(gpu, args, i)? {
            Some(s) if numel(&s.shape) == channels => stats.push(s),
            // A missing, non-float or mis-sized statistic: the CPU kernel says what is wrong.
            _ => return Ok(None),
        }
    }
    let n = numel(&x.shape);
    let inner = numel(&x.shape[2..]);
    let mut out = gpu.alloc(n)?;
    let (n64, c64, inner64) = (n as i64, channels as i64, inner as i64);
    let epsilon = ctx.float("epsilon", 1e-5);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.batch_norm);
    launch
        .arg(&*x.data)
        .arg(&*stats[0].data)
        .arg(&*stats[1].data)
        .arg(&*stats[2].data)
        .arg(&*stats[3].data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&c64)
        .arg(&inner64)
        .arg(&epsilon);
    // SAFETY: argument types match `batch_norm_f32`; each statistic holds `channels` floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}
