//! Convolutions and pooling over 1-D and 2-D spatial inputs (`[N, C, L]` runs as `[N, C, 1, L]`;
//! pooling over more spatial axes runs in `pool_nd.rs`).
//!
//! Specs: <https://onnx.ai/onnx/operators/> (Conv, ConvTranspose, MaxPool, AveragePool,
//! GlobalAveragePool, GlobalMaxPool), opsets 7 to 23: strides, dilations, explicit pads and
//! `auto_pad`, groups, `ceil_mode`, `count_include_pad`. Convolution is im2col followed by one
//! sgemm per image and group (a 1×1, stride-1, unpadded convolution skips im2col); transposed
//! convolution is one sgemm followed by col2im.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::matmul::{sgemm, sgemm_rows};
use super::tap_product::{padded_columns, TapWeights};
use crate::tensor::try_zeros_f32;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Conv"], conv);
    t.add(&["ConvTranspose"], conv_transpose);
    t.add(&["MaxPool", "AveragePool"], pool);
    t.add(&["GlobalAveragePool", "GlobalMaxPool"], global_pool);
}

/// Spatial geometry of a window op, in 2-D (the CUDA backend's window ops read it too).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) kernel: [usize; 2],
    pub(crate) stride: [usize; 2],
    pub(crate) dilation: [usize; 2],
    /// begin, end per axis
    pub(crate) pad: [[usize; 2]; 2],
}

/// `[N, C, H, W]` of an input of rank 3 or 4, and whether it was 1-D.
fn nchw(x: &HostTensor) -> Result<([usize; 4], bool), String> {
    nchw_of(x.shape())
}

/// [`nchw`] of a shape.
pub(crate) fn nchw_of(shape: &[usize]) -> Result<([usize; 4], bool), String> {
    match *shape {
        [n, c, l] => Ok(([n, c, 1, l], true)),
        [n, c, h, w] => Ok(([n, c, h, w], false)),
        _ => Err(format!(
            "only 1-D and 2-D spatial inputs are supported, got shape {shape:?}"
        )),
    }
}

/// Reads a per-axis attribute given for 1 or 2 spatial axes, as 2-D values.
pub(crate) fn spatial(
    ctx: &Ctx,
    name: &str,
    one_d: bool,
    default: usize,
) -> Result<[usize; 2], String> {
    let Some(v) = ctx.ints(name) else {
        return Ok([default; 2]);
    };
    let v: Vec<usize> = v
        .iter()
        .map(|&x| usize::try_from(x).map_err(|_| format!("{name} has a negative entry {x}")))
        .collect::<Result<_, _>>()?;
    match (one_d, v.as_slice()) {
        (true, [a]) => Ok([1, *a]),
        (false, [a, b]) => Ok([*a, *b]),
        _ => Err(format!(
            "{name} has {} entries for a {}-D input",
            v.len(),
            if one_d { 1 } else { 2 }
        )),
    }
}

pub(crate) fn window(
    ctx: &Ctx,
    one_d: bool,
    kernel: [usize; 2],
    in_hw: [usize; 2],
) -> Result<Window, String> {
    let stride = spatial(ctx, "strides", one_d, 1)?;
    let dilation = spatial(ctx, "dilations", one_d, 1)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err("strides and dilations must be positive".into());
    }
    let mut pad = [[0usize; 2]; 2];
    match ctx.string("auto_pad", "NOTSET").as_str() {
        "NOTSET" => {
            if let Some(p) = ctx.ints("pads") {
                let p: Vec<usize> = p
                    .iter()
                    .map(|&x| usize::try_from(x).map_err(|_| format!("negative pad {x}")))
                    .collect::<Result<_, _>>()?;
                match (one_d, p.as_slice()) {
                    (true, [b, e]) => pad[1] = [*b, *e],
                    (false, [hb, wb, he, we]) => pad = [[*hb, *he], [*wb, *we]],
                    _ => return Err(format!("pads has {} entries", p.len())),
                }
            }
        }
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for axis in 0..2 {
                // Attributes of the model: saturating, so that a huge kernel, dilation or
                // stride gives a huge pad that `Window::output` then refuses, not a wrapped one.
                let extent = kernel[axis]
                    .saturating_sub(1)
                    .saturating_mul(dilation[axis])
                    .saturating_add(1);
                let out = in_hw[axis].div_ceil(stride[axis]);
                let total = ((out.max(1) - 1).saturating_mul(stride[axis]))
                    .saturating_add(extent)
                    .saturating_sub(in_hw[axis]);
                let small = total / 2;
                pad[axis] = if mode == "SAME_UPPER" {
                    [small, total - small]
                } else {
                    [total - small, small]
                };
            }
        }
        other => return Err(format!("auto_pad '{other}' is not supported")),
    }
    Ok(Window {
        kernel,
        stride,
        dilation,
        pad,
    })
}

impl Window {
    /// The output plane of the window over an `in_hw` input (`ceil`: ceil_mode).
    pub(crate) fn output(&self, in_hw: [usize; 2], ceil: bool) -> Result<[usize; 2], String> {
        let mut out = [0; 2];
        for axis in 0..2 {
            // Pads, kernel and dilation are attributes of the model: checked, not wrapped.
            let overflow = || {
                format!(
                    "the window of axis {axis} overflows: pads {:?}, kernel {}, dilation {}",
                    self.pad[axis], self.kernel[axis], self.dilation[axis]
                )
            };
            let padded = in_hw[axis]
                .checked_add(self.pad[axis][0])
                .and_then(|p| p.checked_add(self.pad[axis][1]))
                .ok_or_else(overflow)?;
            let extent = self.kernel[axis]
                .saturating_sub(1)
                .checked_mul(self.dilation[axis])
                .and_then(|e| e.checked_add(1))
                .ok_or_else(overflow)?;
            if padded < extent {
                return Err(format!(
                    "the window ({extent}) is larger than the padded input ({padded})"
                ));
            }
            let span = padded - extent;
            let mut o = if ceil {
                span.div_ceil(self.stride[axis])
            } else {
                span / self.stride[axis]
            } + 1;
            // With ceil_mode the last window must start inside the input or its begin padding.
            if ceil && (o - 1) * self.stride[axis] >= in_hw[axis] + self.pad[axis][0] {
                o -= 1;
            }
            out[axis] = o;
        }
        Ok(out)
    }
}

/// The `group` attribute of a convolution of `c` input channels by a weight of `weight`'s shape
/// (M × C/group × kernel): at least 1, and dividing both channel counts as the weight says.
pub(crate) fn conv_group(ctx: &Ctx, c: usize, weight: &[usize]) -> Result<usize, String> {
    let group = usize::try_from(ctx.int("group", 1))
        .ok()
        .filter(|g| *g > 0)
        .ok_or("bad group")?;
    let (m, cg) = (weight[0], weight[1]);
    if c != cg * group || m % group != 0 {
        return Err(format!(
            "input has {c} channels, weight {weight:?} with group {group}"
        ));
    }
    Ok(group)
}

pub(super) fn conv(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    conv_then(ctx, inputs, &Epilogue::default())
}

/// What a convolution applies to each output before writing it: the nodes after it that
/// `runtime::fuse` folded in when the stage was prepared, in their own kernels' arithmetic, so
/// that the outputs are bitwise those of the nodes run one by one (a stage boundary that
/// keeps a fold from happening changes nothing).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Epilogue {
    /// A BatchNormalization's `[mean, factor, shift]` per output channel, applied as its
    /// kernel does: `(v − mean) · factor + shift`, factor = scale / √(var + ε).
    pub(crate) norm: Option<Vec<[f32; 3]>>,
    /// A Mul, then an Add, of scalars after it (`v · scale + shift`, two roundings, as the two
    /// nodes): `[scale, shift]`, PP-LCNet's learnable affine.
    pub(crate) affine: Option<[f32; 2]>,
    /// A Relu after it (`f32::max(v, 0)`, as the Relu kernel: NaN gives 0).
    pub(crate) relu: bool,
    /// A hard-swish written out after it, `v · clip(v + add, lo, hi) / div` (Add, Clip, Mul,
    /// Div of scalars, as the PaddleOCR exports have it): `[add, lo, hi, div]`, applied in
    /// those kernels' order (Clip: max, then min).
    pub(crate) hard_swish: Option<[f32; 4]>,
}

impl Epilogue {
    fn is_identity(&self) -> bool {
        self.norm.is_none() && self.affine.is_none() && !self.relu && self.hard_swish.is_none()
    }

    /// The map of output channel `channel`.
    fn channel(&self, channel: usize) -> ChannelMap {
        ChannelMap {
            norm: self.norm.as_ref().map(|n| n[channel]),
            affine: self.affine,
            relu: self.relu,
            hard_swish: self.hard_swish,
        }
    }
}

/// [`Epilogue`] for one output channel.
#[derive(Debug, Clone, Copy)]
struct ChannelMap {
    norm: Option<[f32; 3]>,
    affine: Option<[f32; 2]>,
    relu: bool,
    hard_swish: Option<[f32; 4]>,
}

impl ChannelMap {
    #[inline(always)]
    fn apply(self, v: f32) -> f32 {
        let v = match self.norm {
            Some([mean, factor, shift]) => (v - mean) * factor + shift,
            None => v,
        };
        let v = match self.affine {
            Some([scale, shift]) => v * scale + shift,
            None => v,
        };
        let v = match self.hard_swish {
            Some([add, lo, hi, div]) => v * (v + add).max(lo).min(hi) / div,
            None => v,
        };
        if self.relu {
            v.max(0.0)
        } else {
            v
        }
    }
}

/// Conv of `inputs` (X, W, optional B), then `epilogue` on each output: the tap-row path
/// applies it as it writes the output, the others in one more pass.
pub(crate) fn conv_then(
    ctx: &Ctx,
    inputs: &[Option<&HostTensor>],
    epilogue: &Epilogue,
) -> KernelResult {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let ([n, c, h, wd], one_d) = nchw(x)?;
    let (w4, _) = nchw(w)?;
    let [m, cg, kh, kw] = w4;
    let group = conv_group(ctx, c, w.shape())?;
    let win = window(ctx, one_d, [kh, kw], [h, wd])?;
    let [oh, ow] = win.output([h, wd], false)?;
    let (xv, wv) = (x.as_f32()?, w.as_f32()?);
    let bias = optional(inputs, 2).map(|b| b.to_f32_vec());
    if bias.as_ref().is_some_and(|b| b.len() != m) {
        return Err(format!(
            "bias has {} entries for {m} output channels",
            bias.map_or(0, |b| b.len())
        ));
    }
    if epilogue.norm.as_ref().is_some_and(|norm| norm.len() != m) {
        return Err(format!("the normalisation folded in has not {m} channels"));
    }
    let geometry = ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, m / group],
        out_hw: [oh, ow],
    };
    let mut out = match PhasePlanes::fit(&geometry, &win) {
        Some(planes) if planes.suits_tap_rows(&geometry, &win) => {
            let out = conv_tap_rows(xv, wv, bias.as_deref(), &geometry, &win, &planes, epilogue)?;
            let shape = if one_d {
                vec![n, m, ow]
            } else {
                vec![n, m, oh, ow]
            };
            return Ok(vec![HostTensor::f32(shape, out)]);
        }
        _ => convolve(xv, wv, bias.as_deref(), &geometry, &win)?,
    };
    if !epilogue.is_identity() {
        for (p, plane) in out.chunks_mut((oh * ow).max(1)).enumerate() {
            let map = epilogue.channel(p % m);
            plane.iter_mut().for_each(|v| *v = map.apply(*v));
        }
    }
    let shape = if one_d {
        vec![n, m, ow]
    } else {
        vec![n, m, oh, ow]
    };
    Ok(vec![HostTensor::f32(shape, out)])
}

/// The convolutions the tap-row path leaves: depthwise ones directly, small images several to
/// one product, the rest through im2col tiles or phase-plane columns and a matrix product.
fn convolve(
    xv: &[f32],
    wv: &[f32],
    bias: Option<&[f32]>,
    geometry: &ConvGeometry,
    win: &Window,
) -> Result<Vec<f32>, String> {
    let ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, mg],
        out_hw: [oh, ow],
    } = *geometry;
    let m = mg * group;
    let [kh, kw] = win.kernel;
    let rows = cg * kh * kw;
    let cols = oh * ow;
    if rows == 0 {
        // No input channel or an empty kernel: each output is its channel's bias (or 0), with
        // no product to tile (the tiles would be empty).
        let mut out = try_zeros_f32(&[n, m, cols])?;
        if let Some(bias) = bias {
            for (p, plane) in out.chunks_mut(cols.max(1)).enumerate() {
                plane.fill(bias[p % m]);
            }
        }
        return Ok(out);
    }
    if cg == 1 && mg == 1 {
        return depthwise(xv, wv, bias, [n, c], [h, wd], win, [oh, ow]);
    }
    if (1..=FEW_POSITIONS).contains(&cols) {
        return conv_few_positions(xv, wv, bias, geometry, win);
    }
    let pointwise = kh == 1 && kw == 1 && win.stride == [1, 1] && win.pad == [[0, 0], [0, 0]];
    if !pointwise {
        if let Some(planes) = PhasePlanes::fit(geometry, win) {
            return conv_shifted_rows(xv, wv, bias, geometry, win, &planes);
        }
    }
    let images_per_product = if n > 1 && 2 * rows * cols <= IM2COL_TILE_FLOATS {
        (IM2COL_TILE_FLOATS / (rows * cols).max(1)).min(n)
    } else {
        1
    };
    if images_per_product > 1 {
        return conv_image_batches(xv, wv, bias, geometry, win, images_per_product);
    }
    let mut out = try_zeros_f32(&[n, m, cols])?;
    // Output rows per im2col tile: the tile's column matrix stays in cache for its product.
    let tile_rows = if pointwise {
        oh
    } else {
        (IM2COL_TILE_FLOATS / (rows * ow).max(1)).clamp(1, oh.max(1))
    };
    let mut col = if pointwise {
        Vec::new()
    } else {
        vec![0.0f32; rows * tile_rows * ow]
    };
    for b in 0..n {
        for g in 0..group {
            let x_group = &xv[(b * c + g * cg) * h * wd..(b * c + (g + 1) * cg) * h * wd];
            let o = &mut out[(b * m + g * mg) * cols..(b * m + (g + 1) * mg) * cols];
            if let Some(bias) = bias {
                for (j, row) in o.chunks_mut(cols).enumerate() {
                    row.fill(bias[g * mg + j]);
                }
            }
            let wg = &wv[g * mg * rows..(g + 1) * mg * rows];
            for y0 in (0..oh).step_by(tile_rows.max(1)) {
                let y1 = (y0 + tile_rows).min(oh);
                let tile_cols = (y1 - y0) * ow;
                let col_ref: &[f32] = if pointwise {
                    x_group
                } else {
                    im2col(
                        x_group,
                        cg,
                        [h, wd],
                        win,
                        [y0, y1],
                        ow,
                        (&mut col, tile_cols),
                    );
                    &col[..rows * tile_cols]
                };
                sgemm_rows(
                    mg,
                    rows,
                    tile_cols,
                    1.0,
                    wg,
                    (rows, 1),
                    col_ref,
                    (tile_cols, 1),
                    1.0,
                    &mut o[y0 * ow..],
                    cols,
                );
            }
        }
    }
    Ok(out)
}

/// Output positions per image up to which a convolution is one dot product per output
/// ([`conv_few_positions`]).
const FEW_POSITIONS: usize = 4;

/// A convolution with at most [`FEW_POSITIONS`] output positions per image (a streaming audio
/// model's chunk: silero-vad's front end and encoder give 1 to 4 frames):
/// each output is its channel's bias plus the dot product of the channel's weights with the
/// position's patch (`matmul::row_dots`), the patches of several images in one product. gemm packed all the weights on every call for a
/// product 1 to 4 columns wide, which cost more than the product. Chosen by positions per
/// image, not by batch, so a micro-batch's outputs are the whole batch's bit for bit.
fn conv_few_positions(
    xv: &[f32],
    wv: &[f32],
    bias: Option<&[f32]>,
    geometry: &ConvGeometry,
    win: &Window,
) -> Result<Vec<f32>, String> {
    let ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, mg],
        out_hw: [oh, ow],
    } = *geometry;
    let [kh, kw] = win.kernel;
    let (rows, cols, m) = (cg * kh * kw, oh * ow, mg * group);
    let mut out = try_zeros_f32(&[n, m, cols])?;
    // Images per product: their patches stay in cache while every channel's weights pass.
    let images = (IM2COL_TILE_FLOATS / (rows * cols)).clamp(1, n.max(1));
    let mut patches = vec![0.0f32; images * cols * rows];
    let mut product = vec![0.0f32; mg * images * cols];
    for g in 0..group {
        let wg = &wv[g * mg * rows..(g + 1) * mg * rows];
        for first in (0..n).step_by(images) {
            let batch = first..(first + images).min(n);
            let width = batch.len() * cols;
            for (k, b) in batch.clone().enumerate() {
                let x_group = &xv[(b * c + g * cg) * h * wd..(b * c + (g + 1) * cg) * h * wd];
                let image_patches = &mut patches[k * cols * rows..(k + 1) * cols * rows];
                fill_patches(x_group, [cg, h, wd], win, [oh, ow], image_patches);
            }
            let product = &mut product[..mg * width];
            super::matmul::row_dots(wg, &patches[..width * rows], rows, product);
            for (k, b) in batch.enumerate() {
                for (j, values) in product.chunks_exact(width).enumerate() {
                    let channel = g * mg + j;
                    let add = bias.map_or(0.0, |bias| bias[channel]);
                    let dst = &mut out[(b * m + channel) * cols..][..cols];
                    for (d, &v) in dst.iter_mut().zip(&values[k * cols..(k + 1) * cols]) {
                        *d = v + add;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Each output position's patch of one image and group, as one contiguous row of `patches`
/// (channel, tap row, tap column), zero where a tap falls in the padding. Read straight from
/// the input: im2col's column matrix, made for a wide product, split each input row into its
/// stride's phases first, most of a one-chunk convolution's time at silero-vad's stride 128.
fn fill_patches(
    x: &[f32],
    [channels, h, w]: [usize; 3],
    win: &Window,
    [oh, ow]: [usize; 2],
    patches: &mut [f32],
) {
    let [kh, kw] = win.kernel;
    let rows = channels * kh * kw;
    for (p, patch) in patches.chunks_exact_mut(rows).take(oh * ow).enumerate() {
        let (y, xo) = (p / ow, p % ow);
        for (tap_row, taps) in patch.chunks_exact_mut(kw).enumerate() {
            let (channel, i) = (tap_row / kh, tap_row % kh);
            let iy = (y * win.stride[0] + i * win.dilation[0]).checked_sub(win.pad[0][0]);
            let Some(iy) = iy.filter(|&iy| iy < h) else {
                taps.fill(0.0);
                continue;
            };
            let row = &x[(channel * h + iy) * w..(channel * h + iy + 1) * w];
            let left = xo * win.stride[1];
            for (j, tap) in taps.iter_mut().enumerate() {
                let ix = (left + j * win.dilation[1]).checked_sub(win.pad[1][0]);
                *tap = ix.and_then(|ix| row.get(ix)).copied().unwrap_or(0.0);
            }
        }
    }
}

/// The size of one im2col tile, in floats (256 KiB): the column matrix of a whole image (14 MiB
/// for a 3×3 convolution of 96 channels at 64×64) made the product memory-bound, packing and
/// zeroing as much as it multiplied; a tile this size stays in a core's L2 cache while the
/// product reads it.
const IM2COL_TILE_FLOATS: usize = 64 * 1024;

/// The sizes of a grouped convolution: batch, input channels, input plane, (groups, input
/// channels per group, output channels per group), output plane.
struct ConvGeometry {
    n: usize,
    c: usize,
    hw: [usize; 2],
    groups: [usize; 3],
    out_hw: [usize; 2],
}

/// A convolution of small images, several images per product: their column matrices side by
/// side make one product `images` times wider, whose rows are then copied to each image's
/// output (with the bias). One product per 32 × 32 image left the matrix kernel too little work
/// per call on the small CNNs.
fn conv_image_batches(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    geometry: &ConvGeometry,
    win: &Window,
    images: usize,
) -> Result<Vec<f32>, String> {
    let ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, mg],
        out_hw: [oh, ow],
    } = *geometry;
    let [kh, kw] = win.kernel;
    let (rows, cols, m) = (cg * kh * kw, oh * ow, mg * group);
    let mut out = try_zeros_f32(&[n, m, cols])?;
    let mut col = vec![0.0f32; rows * images * cols];
    let mut product = vec![0.0f32; mg * images * cols];
    for g in 0..group {
        let wg = &w[g * mg * rows..(g + 1) * mg * rows];
        for first in (0..n).step_by(images) {
            let batch = first..(first + images).min(n);
            let width = batch.len() * cols;
            for (k, b) in batch.clone().enumerate() {
                let x_group = &x[(b * c + g * cg) * h * wd..(b * c + (g + 1) * cg) * h * wd];
                im2col(
                    x_group,
                    cg,
                    [h, wd],
                    win,
                    [0, oh],
                    ow,
                    (&mut col[k * cols..], width),
                );
            }
            multiply_columns(wg, &col, &mut product, [mg, rows, width]);
            for (k, b) in batch.enumerate() {
                for j in 0..mg {
                    let channel = g * mg + j;
                    let add = bias.map_or(0.0, |bias| bias[channel]);
                    let src = &product[j * width + k * cols..][..cols];
                    let dst = &mut out[(b * m + channel) * cols..][..cols];
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = v + add;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// `product` = a group's weights (`mg` × `rows`) times the first `width` columns of a column
/// tile (`rows` × `width`), both convolution paths' one matrix product.
fn multiply_columns(wg: &[f32], col: &[f32], product: &mut [f32], [mg, rows, width]: [usize; 3]) {
    sgemm(
        mg,
        rows,
        width,
        1.0,
        wg,
        (rows, 1),
        &col[..rows * width],
        (width, 1),
        0.0,
        &mut product[..mg * width],
    );
}

/// The input of one image and group laid out so that every tap of a convolution reads one
/// contiguous run: padded, then split into its `stride` phases per axis (padded rows ≡ p mod
/// s_y, columns ≡ q mod s_x), each phase a plane of `height` × `width`. Output position
/// (y, x) under tap (i, j) reads phase ((i·d_y) mod s_y, (j·d_x) mod s_x) at row
/// y + (i·d_y) div s_y and column x + (j·d_x) div s_x, so the tap's values for output rows
/// y0..y1 are one slice of that phase, `width` columns per output row of which the first `ow`
/// are real and the rest (the padding's width) are computed and dropped.
struct PhasePlanes {
    height: usize,
    width: usize,
}

impl PhasePlanes {
    /// The layout for a convolution, or None where the dropped columns would be more than a
    /// third of the work (a kernel nearly as wide as the input), which im2col does better. On
    /// small images (8 × 8 at pad 2) a third is still cheaper than im2col's 8-float copies.
    fn fit(geometry: &ConvGeometry, win: &Window) -> Option<PhasePlanes> {
        PhasePlanes::fit_window(geometry.hw, win, geometry.out_hw)
    }

    /// [`PhasePlanes::fit`] for any window op over `[h, w]` planes with an `out_hw` output
    /// whose windows all end inside the padded input (no ceil-mode overhang).
    fn fit_window([h, w]: [usize; 2], win: &Window, [oh, ow]: [usize; 2]) -> Option<PhasePlanes> {
        let padded = [
            h + win.pad[0][0] + win.pad[0][1],
            w + win.pad[1][0] + win.pad[1][1],
        ];
        let inside = |axis: usize, out: usize| {
            (out.max(1) - 1) * win.stride[axis]
                + win.kernel[axis].saturating_sub(1) * win.dilation[axis]
                < padded[axis]
        };
        let height = padded[0].div_ceil(win.stride[0]);
        let width = padded[1].div_ceil(win.stride[1]);
        (oh > 0 && ow > 0 && 2 * width <= 3 * ow && inside(0, oh) && inside(1, ow))
            .then_some(PhasePlanes { height, width })
    }

    /// Whether [`conv_tap_rows`] should run the convolution: a dense one (a depthwise one runs
    /// directly, and a tile of 8 channels would mostly multiply zero weights under fewer than 4
    /// per group), not a plain 1×1 one (multiplied as its input lies), on images large enough
    /// that the columns computed and dropped (the padding's, and the last block's, which is
    /// rounded up to 16) are at most half as many as the kept ones: below that (resnet_tiny's
    /// 4 × 4 images) several images go to one product of compact columns instead.
    fn suits_tap_rows(&self, geometry: &ConvGeometry, win: &Window) -> bool {
        let [_, cg, mg] = geometry.groups;
        let [oh, ow] = geometry.out_hw;
        let pointwise = win.kernel == [1, 1] && win.stride == [1, 1] && win.pad == [[0, 0], [0, 0]];
        let computed = padded_columns(oh * self.width);
        !pointwise && cg > 1 && mg >= 4 && 2 * computed <= 3 * oh * ow
    }

    /// Where each tap's row of the column matrix starts in the planes of `channels` channels
    /// (row r = (channel, i, j) in the weights' order), for output row 0: output (y, x) of the
    /// row is `y · width + x` further on.
    fn tap_offsets(&self, channels: usize, win: &Window) -> Vec<usize> {
        let [kh, kw] = win.kernel;
        let [sy, sx] = win.stride;
        let mut offsets = Vec::with_capacity(channels * kh * kw);
        for ch in 0..channels {
            for i in 0..kh {
                let (phase_y, down) = ((i * win.dilation[0]) % sy, (i * win.dilation[0]) / sy);
                for j in 0..kw {
                    let (phase_x, right) = ((j * win.dilation[1]) % sx, (j * win.dilation[1]) / sx);
                    let plane = (phase_y * sx + phase_x) * self.height * self.width;
                    offsets.push(ch * self.channel_len(win) + plane + down * self.width + right);
                }
            }
        }
        offsets
    }

    /// Floats of one channel's phases.
    fn channel_len(&self, win: &Window) -> usize {
        win.stride[0] * win.stride[1] * self.height * self.width
    }

    /// Writes `channels` input planes of `[h, w]` into `planes` (whose padding stays zero: every
    /// image writes the same positions).
    fn fill(
        &self,
        x: &[f32],
        channels: usize,
        [h, w]: [usize; 2],
        win: &Window,
        planes: &mut [f32],
    ) {
        let [sy, sx] = win.stride;
        let [pad_top, pad_left] = [win.pad[0][0], win.pad[1][0]];
        // Per column phase: the first input column it holds, and where that lands in the
        // phase (worked out once: a division per row and phase was a third of the copy's time).
        let column_phases: Vec<[usize; 3]> = (0..sx)
            .map(|phase_x| {
                let first = (phase_x + sx - pad_left % sx) % sx;
                [phase_x, first, (first + pad_left) / sx]
            })
            .filter(|&[_, first, _]| first < w)
            .collect();
        let channel_len = self.channel_len(win);
        for ch in 0..channels {
            let phases = &mut planes[ch * channel_len..][..channel_len];
            let (mut phase_y, mut row) = (pad_top % sy, pad_top / sy);
            for source_row in x[ch * h * w..(ch + 1) * h * w].chunks(w.max(1)) {
                for &[phase_x, first, column] in &column_phases {
                    let plane = (phase_y * sx + phase_x) * self.height * self.width;
                    let dst = &mut phases[plane + row * self.width + column..];
                    if sx == 1 {
                        dst[..w].copy_from_slice(source_row);
                    } else {
                        every_nth(&source_row[first..], sx, dst);
                    }
                }
                phase_y += 1;
                if phase_y == sy {
                    (phase_y, row) = (0, row + 1);
                }
            }
        }
    }

    /// Copies tap rows for output rows `y0..y1` into `col` (row r = (channel, i, j) at
    /// `r · col_row_stride`): `(y1 − y0 − 1) · width + ow` floats each, one slice copy.
    #[allow(clippy::too_many_arguments)]
    fn columns(
        &self,
        planes: &[f32],
        channels: usize,
        win: &Window,
        [y0, y1]: [usize; 2],
        ow: usize,
        (col, col_row_stride): (&mut [f32], usize),
    ) {
        let [kh, kw] = win.kernel;
        let [sy, sx] = win.stride;
        let len = (y1 - y0 - 1) * self.width + ow;
        let mut r = 0;
        for ch in 0..channels {
            let phases = &planes[ch * self.channel_len(win)..];
            for i in 0..kh {
                let (phase_y, down) = ((i * win.dilation[0]) % sy, (i * win.dilation[0]) / sy);
                for j in 0..kw {
                    let (phase_x, right) = ((j * win.dilation[1]) % sx, (j * win.dilation[1]) / sx);
                    let plane = (phase_y * sx + phase_x) * self.height * self.width;
                    let start = plane + (y0 + down) * self.width + right;
                    col[r * col_row_stride..][..len].copy_from_slice(&phases[start..start + len]);
                    r += 1;
                }
            }
        }
    }
}

/// Copies `row[0]`, `row[stride]`, `row[2 · stride]`, … to the start of `dst` (as many as
/// both hold). Stride 2, the usual one, in pairs the compiler vectorises as a shuffle.
fn every_nth(row: &[f32], stride: usize, dst: &mut [f32]) {
    if stride == 2 {
        let pairs = row.chunks_exact(2);
        let odd_tail = pairs.remainder().first().copied();
        let count = pairs.len().min(dst.len());
        for (d, pair) in dst.iter_mut().zip(pairs) {
            *d = pair[0];
        }
        if let (Some(v), Some(d)) = (odd_tail, dst.get_mut(count)) {
            *d = v;
        }
    } else {
        for (d, every) in dst.iter_mut().zip(row.chunks(stride)) {
            *d = every[0];
        }
    }
}

/// A convolution through [`PhasePlanes`]: per image and group the input is padded and split
/// into phases once, then each tap's column-matrix row is one slice copy (im2col copied one
/// output row at a time, between zero-filled edges: 40% of a small CNN's time). Small images
/// go several to one product, large ones a tile of output rows at a time, as in im2col.
fn conv_shifted_rows(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    geometry: &ConvGeometry,
    win: &Window,
    planes: &PhasePlanes,
) -> Result<Vec<f32>, String> {
    let ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, mg],
        out_hw: [oh, ow],
    } = *geometry;
    let [kh, kw] = win.kernel;
    let (rows, m) = (cg * kh * kw, mg * group);
    // Columns per image: every output row `planes.width` wide (the last one's tail unused).
    let image_cols = oh * planes.width;
    let (images, tile_rows) = if n > 1 && 2 * rows * image_cols <= IM2COL_TILE_FLOATS {
        ((IM2COL_TILE_FLOATS / (rows * image_cols).max(1)).min(n), oh)
    } else {
        let tile_rows = IM2COL_TILE_FLOATS / (rows * planes.width).max(1);
        (1, tile_rows.clamp(1, oh.max(1)))
    };
    let segment = tile_rows * planes.width;
    let mut out = try_zeros_f32(&[n, m, oh * ow])?;
    let mut phases = vec![0.0f32; cg * planes.channel_len(win)];
    let mut col = vec![0.0f32; rows * images * segment];
    let mut product = vec![0.0f32; mg * images * segment];
    for g in 0..group {
        let wg = &w[g * mg * rows..(g + 1) * mg * rows];
        for first in (0..n).step_by(images) {
            let batch = first..(first + images).min(n);
            let width = batch.len() * segment;
            for y0 in (0..oh).step_by(tile_rows) {
                let y1 = (y0 + tile_rows).min(oh);
                for (k, b) in batch.clone().enumerate() {
                    if y0 == 0 {
                        let x_group = &x[(b * c + g * cg) * h * wd..][..cg * h * wd];
                        planes.fill(x_group, cg, [h, wd], win, &mut phases);
                    }
                    let tile = (&mut col[k * segment..], width);
                    planes.columns(&phases, cg, win, [y0, y1], ow, tile);
                }
                multiply_columns(wg, &col, &mut product, [mg, rows, width]);
                for (k, b) in batch.clone().enumerate() {
                    for j in 0..mg {
                        let channel = g * mg + j;
                        let add = bias.map_or(0.0, |bias| bias[channel]);
                        let plane = &mut out[(b * m + channel) * oh * ow..][..oh * ow];
                        let src = &product[j * width + k * segment..][..segment];
                        for (y, dst) in (y0..y1).zip(plane[y0 * ow..].chunks_mut(ow)) {
                            let row = &src[(y - y0) * planes.width..][..ow];
                            for (d, &v) in dst.iter_mut().zip(row) {
                                *d = v + add;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A convolution through [`PhasePlanes`] without a column matrix: per image and group the
/// input is padded and split into phases, and [`TapWeights::multiply`] reads each tap's row in
/// place (see `tap_product`); the product's rows, `planes.width` columns per output row, are
/// then written out without the padding's columns, with the bias and `epilogue`.
fn conv_tap_rows(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    geometry: &ConvGeometry,
    win: &Window,
    planes: &PhasePlanes,
    epilogue: &Epilogue,
) -> Result<Vec<f32>, String> {
    let ConvGeometry {
        n,
        c,
        hw: [h, wd],
        groups: [group, cg, mg],
        out_hw: [oh, ow],
    } = *geometry;
    let [kh, kw] = win.kernel;
    let (taps, m) = (cg * kh * kw, mg * group);
    let columns = oh * planes.width;
    let padded = padded_columns(columns);
    let offsets = planes.tap_offsets(cg, win);
    // The last block of columns reads past the last channel's planes: zeros, dropped.
    let reach = offsets.iter().max().map_or(0, |&o| o + padded);
    let mut phases = vec![0.0f32; (cg * planes.channel_len(win)).max(reach)];
    let mut product = vec![0.0f32; mg * padded];
    let mut out = try_zeros_f32(&[n, m, oh * ow])?;
    for g in 0..group {
        let weights = TapWeights::pack(&w[g * mg * taps..][..mg * taps], mg, taps);
        for b in 0..n {
            let x_group = &x[(b * c + g * cg) * h * wd..][..cg * h * wd];
            planes.fill(x_group, cg, [h, wd], win, &mut phases);
            weights.multiply(&phases, &offsets, columns, &mut product, padded);
            for (j, source) in product.chunks(padded).enumerate() {
                let channel = g * mg + j;
                let add = bias.map_or(0.0, |bias| bias[channel]);
                let map = epilogue.channel(channel);
                let plane = &mut out[(b * m + channel) * oh * ow..][..oh * ow];
                for (dst, row) in plane.chunks_mut(ow).zip(source.chunks(planes.width)) {
                    for (d, &v) in dst.iter_mut().zip(row) {
                        *d = map.apply(v + add);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A depthwise convolution (one input and one output channel per group), directly: each tap of
/// the kernel adds a shifted row of the input to a row of the output. Through im2col it would be
/// one 1 × taps GEMM per channel on a column matrix `taps` times the plane's size, which is where
/// mobile networks' 5×5 depthwise layers spent most of their time.
fn depthwise(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    [n, c]: [usize; 2],
    [h, wd]: [usize; 2],
    win: &Window,
    [oh, ow]: [usize; 2],
) -> Result<Vec<f32>, String> {
    let [kh, kw] = win.kernel;
    let mut out = try_zeros_f32(&[n, c, oh * ow])?;
    let mut phases = ColumnPhases::new([h, wd], win.stride[1]);
    let tap_columns: Vec<TapColumns> = (0..kw).map(|j| phases.tap(win, j, ow)).collect();
    for (plane_index, o) in out.chunks_mut(oh * ow).enumerate() {
        let ch = plane_index % c;
        o.fill(bias.map_or(0.0, |b| b[ch]));
        let plane = phases.split(&x[plane_index * h * wd..(plane_index + 1) * h * wd]);
        let taps = &w[ch * kh * kw..(ch + 1) * kh * kw];
        for i in 0..kh {
            for j in 0..kw {
                let weight = taps[i * kw + j];
                let tap = &tap_columns[j];
                for y in 0..oh {
                    let Some(src) = tap.source(plane, win, [y, i]) else {
                        continue;
                    };
                    for (d, &v) in o[y * ow..][tap.first..tap.end].iter_mut().zip(src) {
                        *d += weight * v;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The input rows of a plane split into their column phases for a window op of column stride
/// s (row `(phase, iy)` holds columns ≡ phase mod s), so that each tap of the window reads a
/// contiguous run of one phase: a vectorised slice loop, where gathering every s-th element
/// took most of a strided depthwise convolution's or max pool's time. At stride 1 the plane
/// is used as it is.
struct ColumnPhases {
    hw: [usize; 2],
    stride: usize,
    width: usize,
    rows: Vec<f32>,
}

/// Where tap column j of a window reads: phase `phase` shifted by `shift` columns, for the
/// output columns `first..end` that fall inside the input.
struct TapColumns {
    phase: usize,
    shift: isize,
    first: usize,
    end: usize,
    row_len: usize,
    height: usize,
}

impl ColumnPhases {
    fn new([h, w]: [usize; 2], stride: usize) -> ColumnPhases {
        let width = w.div_ceil(stride);
        let rows = if stride > 1 {
            vec![0.0; stride * h * width]
        } else {
            Vec::new()
        };
        ColumnPhases {
            hw: [h, w],
            stride,
            width,
            rows,
        }
    }

    /// The plane as the taps read it: its phases, or itself at stride 1.
    fn split<'a>(&'a mut self, plane: &'a [f32]) -> &'a [f32] {
        let ([h, w], s) = (self.hw, self.stride);
        if s == 1 {
            return plane;
        }
        for (iy, row) in plane.chunks(w.max(1)).enumerate() {
            for phase in 0..s.min(w) {
                let dst = &mut self.rows[(phase * h + iy) * self.width..][..self.width];
                every_nth(&row[phase..], s, dst);
            }
        }
        &self.rows
    }

    fn tap(&self, win: &Window, j: usize, ow: usize) -> TapColumns {
        let (s, w) = (self.stride, self.hw[1]);
        let offset = (j * win.dilation[1]) as isize - win.pad[1][0] as isize;
        let phase = offset.rem_euclid(s as isize) as usize;
        let shift = offset.div_euclid(s as isize);
        let columns = w.saturating_sub(phase).div_ceil(s);
        let first = (-shift).clamp(0, ow as isize) as usize;
        let end = (columns as isize - shift).clamp(first as isize, ow as isize) as usize;
        let row_len = if s > 1 { self.width } else { w };
        TapColumns {
            phase,
            shift,
            first,
            end,
            row_len,
            height: self.hw[0],
        }
    }
}

impl TapColumns {
    /// The input values output row y's columns `first..end` read under tap row i, or None
    /// where that input row is padding.
    fn source<'a>(&self, plane: &'a [f32], win: &Window, [y, i]: [usize; 2]) -> Option<&'a [f32]> {
        let h = self.height;
        let iy = (y * win.stride[0] + i * win.dilation[0]) as isize - win.pad[0][0] as isize;
        if iy < 0 || iy >= h as isize || self.first >= self.end {
            return None;
        }
        let row = &plane[(self.phase * h + iy as usize) * self.row_len..][..self.row_len];
        let start = (self.first as isize + self.shift) as usize;
        Some(&row[start..start + (self.end - self.first)])
    }
}

/// Lays out the input patches of output rows `y0..y1` as the columns of a `channels · kh · kw`
/// × `(y1 − y0) · ow` matrix whose rows start `col_row_stride` apart in `col`: row
/// (channel, i, j) holds tap (i, j) of each of those output positions, zero where it falls in
/// the padding. Each row segment is one slice copy at stride 1
/// (a gather otherwise) between zeroed edges.
fn im2col(
    x: &[f32],
    channels: usize,
    [h, w]: [usize; 2],
    win: &Window,
    [y0, y1]: [usize; 2],
    ow: usize,
    (col, col_row_stride): (&mut [f32], usize),
) {
    let [kh, kw] = win.kernel;
    let tile_cols = (y1 - y0) * ow;
    let stride = win.stride[1];
    // At a column stride s, each input row is split into its s phases (columns ≡ q mod s), so
    // that every tap reads a contiguous run of one phase: a slice copy, where gathering every
    // s-th element one by one took half of a strided CNN's time.
    let phase_width = w.div_ceil(stride);
    let mut phased = if stride > 1 {
        vec![0.0f32; stride * h * phase_width]
    } else {
        Vec::new()
    };
    let [pad_top, dilation_y] = [win.pad[0][0] as isize, win.dilation[0] as isize];
    let (sy, y0i, y1i) = (win.stride[0] as isize, y0 as isize, y1 as isize);
    let rows_read = ((y0i * sy - pad_top).max(0) as usize)
        ..(((y1i - 1) * sy + (kh as isize - 1) * dilation_y - pad_top + 1).clamp(0, h as isize)
            as usize);
    let mut r = 0;
    for ch in 0..channels {
        let plane = &x[ch * h * w..(ch + 1) * h * w];
        if stride > 1 {
            for iy in rows_read.clone() {
                let source_row = &plane[iy * w..(iy + 1) * w];
                for phase in 0..stride {
                    let at = (phase * h + iy) * phase_width;
                    let phase_row = &mut phased[at..at + phase_width];
                    for (d, &v) in phase_row
                        .iter_mut()
                        .zip(source_row.iter().skip(phase).step_by(stride))
                    {
                        *d = v;
                    }
                }
            }
        }
        for i in 0..kh {
            for j in 0..kw {
                let row = &mut col[r * col_row_stride..r * col_row_stride + tile_cols];
                let offset = (j * win.dilation[1]) as isize - win.pad[1][0] as isize;
                // Output column xo reads column xo + shift of phase `phase`.
                let phase = offset.rem_euclid(stride as isize) as usize;
                let shift = offset.div_euclid(stride as isize);
                let (source, width) = if stride > 1 {
                    let phase_columns = w.saturating_sub(phase).div_ceil(stride);
                    (
                        &phased[phase * h * phase_width..],
                        (phase_width, phase_columns),
                    )
                } else {
                    (plane, (w, w))
                };
                let (row_len, columns) = width;
                let first = (-shift).clamp(0, ow as isize) as usize;
                let end = (columns as isize - shift).clamp(first as isize, ow as isize) as usize;
                for (y, dst) in (y0..y1).zip(row.chunks_mut(ow)) {
                    let iy = (y * win.stride[0]) as isize + i as isize * dilation_y - pad_top;
                    if iy < 0 || iy >= h as isize {
                        dst.fill(0.0);
                        continue;
                    }
                    dst[..first].fill(0.0);
                    dst[end..].fill(0.0);
                    // A tap dilated past either edge (DeepLabV3's rate-36 branch on a small
                    // map) reads nothing: its start would lie outside the row.
                    if end > first {
                        let src = &source[iy as usize * row_len..(iy as usize + 1) * row_len];
                        let start = (first as isize + shift) as usize;
                        dst[first..end].copy_from_slice(&src[start..start + (end - first)]);
                    }
                }
                r += 1;
            }
        }
    }
}

fn conv_transpose(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let auto_pad = ctx.string("auto_pad", "NOTSET");
    if x.rank() > 4 || ctx.ints("output_shape").is_some() || auto_pad.starts_with("SAME") {
        return super::conv_transpose_nd::conv_transpose_nd(ctx, inputs);
    }
    let ([n, c, h, wd], one_d) = nchw(x)?;
    let ([wc, mg, kh, kw], _) = nchw(w)?;
    let group = usize::try_from(ctx.int("group", 1))
        .ok()
        .filter(|g| *g > 0)
        .ok_or("bad group")?;
    if wc != c || c % group != 0 {
        return Err(format!(
            "input has {c} channels, weight {:?} with group {group}",
            w.shape()
        ));
    }
    if auto_pad != "NOTSET" && auto_pad != "VALID" {
        return Err(format!(
            "ConvTranspose auto_pad '{auto_pad}' is not supported"
        ));
    }
    let win = window(ctx, one_d, [kh, kw], [h, wd])?;
    let out_pad = spatial(ctx, "output_padding", one_d, 0)?;
    let full = |axis: usize, input: usize| {
        win.stride[axis] * (input - 1)
            + out_pad[axis]
            + (win.kernel[axis] - 1) * win.dilation[axis]
            + 1
    };
    let [oh, ow] = {
        let mut o = [0; 2];
        for axis in 0..2 {
            o[axis] = full(axis, [h, wd][axis])
                .checked_sub(win.pad[axis][0] + win.pad[axis][1])
                .ok_or("pads exceed the output")?;
        }
        o
    };
    let m = mg * group;
    let cg = c / group;
    let rows = mg * kh * kw;
    let (xv, wv) = (x.as_f32()?, w.as_f32()?);
    let mut out = try_zeros_f32(&[n, m, oh, ow])?;
    if let Some(b) = optional(inputs, 2) {
        let bias = b.to_f32_vec();
        if bias.len() != m {
            return Err(format!(
                "bias has {} entries for {m} output channels",
                bias.len()
            ));
        }
        for (i, plane) in out.chunks_mut(oh * ow).enumerate() {
            plane.fill(bias[i % m]);
        }
    }
    let mut col = vec![0.0f32; rows * h * wd];
    for b in 0..n {
        for g in 0..group {
            let xg = &xv[(b * c + g * cg) * h * wd..(b * c + (g + 1) * cg) * h * wd];
            let wg = &wv[g * cg * rows..(g + 1) * cg * rows];
            // col[rows, H·W] = W_gᵀ · X_g
            sgemm(
                rows,
                cg,
                h * wd,
                1.0,
                wg,
                (1, rows),
                xg,
                (h * wd, 1),
                0.0,
                &mut col,
            );
            let o = &mut out[(b * m + g * mg) * oh * ow..(b * m + (g + 1) * mg) * oh * ow];
            add_columns(&col, o, &win, ([kh, kw], [h, wd], [oh, ow]));
        }
    }
    let shape = if one_d {
        vec![n, m, ow]
    } else {
        vec![n, m, oh, ow]
    };
    Ok(vec![HostTensor::f32(shape, out)])
}

/// col2im for a transposed convolution: adds each entry of `col [mg·kh·kw, h·w]` into the
/// output pixel of `out [mg, oh, ow]` it lands on (entries that land in the padding drop).
fn add_columns(
    col: &[f32],
    out: &mut [f32],
    win: &Window,
    ([kh, kw], [h, wd], [oh, ow]): ([usize; 2], [usize; 2], [usize; 2]),
) {
    let rows = col.len() / (h * wd).max(1);
    for r in 0..rows {
        let (ch, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        for y in 0..h {
            let oy = (y * win.stride[0] + i * win.dilation[0]) as isize - win.pad[0][0] as isize;
            if oy < 0 || oy >= oh as isize {
                continue;
            }
            for xx in 0..wd {
                let ox =
                    (xx * win.stride[1] + j * win.dilation[1]) as isize - win.pad[1][0] as isize;
                if ox >= 0 && ox < ow as isize {
                    out[(ch * oh + oy as usize) * ow + ox as usize] +=
                        col[r * h * wd + y * wd + xx];
                }
            }
        }
    }
}

fn pool(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let wants_indices = matches!(ctx.node.outputs.get(1), Some(Some(_)));
    if x.rank() > 4 || wants_indices || !x.dtype().is_float() {
        return super::pool_nd::pool_nd(ctx, inputs);
    }
    let ([n, c, h, w], one_d) = nchw(x)?;
    let kernel = spatial(ctx, "kernel_shape", one_d, 0)?;
    if kernel.contains(&0) {
        return Err("kernel_shape is required".into());
    }
    let win = window(ctx, one_d, kernel, [h, w])?;
    let [oh, ow] = win.output([h, w], ctx.int("ceil_mode", 0) != 0)?;
    let max = ctx.node.op_type == "MaxPool";
    let include_pad = ctx.int("count_include_pad", 0) != 0;
    let xv = x.as_f32()?;
    if max {
        let out = match PhasePlanes::fit_window([h, w], &win, [oh, ow]) {
            Some(layout) => max_pool_planes(xv, [n * c, h, w], &win, [oh, ow], &layout)?,
            None => max_pool(xv, [n * c, h, w], &win, [oh, ow])?,
        };
        let shape = if one_d {
            vec![n, c, ow]
        } else {
            vec![n, c, oh, ow]
        };
        return Ok(vec![HostTensor::f32(shape, out)]);
    }
    let order = SumOrder::of(&win, [h, w]);
    let mut out = Vec::with_capacity(n * c * oh * ow);
    for plane in xv.chunks(h * w).take(n * c) {
        for y in 0..oh {
            for xo in 0..ow {
                let (sum, count) = window_sum(plane, [h, w], &win, [y, xo], order);
                let count = if include_pad {
                    padded_count(&win, [h, w], [y, xo])
                } else {
                    count
                };
                out.push(if count == 0 { 0.0 } else { sum / count as f32 });
            }
        }
    }
    let shape = if one_d {
        vec![n, c, ow]
    } else {
        vec![n, c, oh, ow]
    };
    Ok(vec![HostTensor::f32(shape, out)])
}

/// The order in which onnxruntime's MLAS (`mlas/lib/pooling.cpp`) sums an average pool's
/// window. The float result's last bit depends on it, and in a quantized model the
/// requantization after the pool can turn that bit into a whole step, so the CPU runtime sums
/// as onnxruntime does (issue 36: `fixtures/ortquant/ops_static_qdq`).
#[derive(Clone, Copy, PartialEq)]
enum SumOrder {
    /// The window is the whole plane (stride 1, no padding): four running sums over
    /// consecutive elements (lane k takes every element at k mod 4), added as
    /// `(s0 + s2) + (s1 + s3)`, then the leftover elements one by one (`MlasPoolGlobalKernel`).
    Lanes,
    /// Each column of the window summed down its rows, then the columns summed left to right
    /// (`MlasPool2DVectorKernel`: horizontal stride ≤ 2, kernel ≤ 32, a row that fits its
    /// buffer).
    ColumnsFirst,
    /// Row by row, left to right (`MlasPool2DKernel`, and windows with dilation, which MLAS
    /// does not take).
    RowMajor,
}

impl SumOrder {
    /// MLAS's choice for `win` over `[h, w]` planes.
    fn of(win: &Window, [h, w]: [usize; 2]) -> SumOrder {
        /// MLAS's reduction buffer (2,048 floats) less the 3 it over-reads.
        const ROW_BUFFER: usize = 2048 - 3;
        let no_pad = win.pad.iter().flatten().all(|&p| p == 0);
        if win.dilation != [1, 1] {
            SumOrder::RowMajor
        } else if win.kernel == [h, w] && win.stride == [1, 1] && no_pad {
            SumOrder::Lanes
        } else if win.stride[1] <= 2
            && win.kernel.iter().all(|&k| k <= 32)
            && w + win.pad[1][0] + win.pad[1][1] <= ROW_BUFFER
        {
            SumOrder::ColumnsFirst
        } else {
            SumOrder::RowMajor
        }
    }
}

/// The sum of output `[y, x]`'s window over the real (unpadded) elements of `plane`, in
/// `order`, and how many elements it took.
fn window_sum(
    plane: &[f32],
    [h, w]: [usize; 2],
    win: &Window,
    [y, x]: [usize; 2],
    order: SumOrder,
) -> (f32, usize) {
    let taps = |axis: usize, at: usize, size: usize| {
        (0..win.kernel[axis]).filter_map(move |i| {
            (at * win.stride[axis] + i * win.dilation[axis])
                .checked_sub(win.pad[axis][0])
                .filter(|&p| p < size)
        })
    };
    let (rows, columns) = (taps(0, y, h), taps(1, x, w));
    let count = rows.clone().count() * columns.clone().count();
    let sum = match order {
        SumOrder::Lanes => lane_sum(plane),
        SumOrder::ColumnsFirst => columns
            .map(|j| {
                rows.clone()
                    .map(|i| plane[i * w + j])
                    .reduce(|a, b| a + b)
                    .unwrap_or(0.0)
            })
            .fold(0.0, |a, b| a + b),
        SumOrder::RowMajor => rows
            .flat_map(|i| columns.clone().map(move |j| plane[i * w + j]))
            .fold(0.0, |a, b| a + b),
    };
    (sum, count)
}

/// [`SumOrder::Lanes`] over all of `values`.
fn lane_sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 4];
    let whole = values.len() / 4 * 4;
    for chunk in values[..whole].chunks_exact(4) {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    let reduced = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    values[whole..].iter().fold(reduced, |a, &b| a + b)
}

/// The divisor of `count_include_pad`: the window's taps inside the input or its padding (not
/// the part of a ceil-mode window that hangs past the end padding).
fn padded_count(win: &Window, [h, w]: [usize; 2], [y, x]: [usize; 2]) -> usize {
    let within = |axis: usize, at: usize, size: usize| {
        (0..win.kernel[axis])
            .filter(|&i| {
                at * win.stride[axis] + i * win.dilation[axis]
                    < size + win.pad[axis][0] + win.pad[axis][1]
            })
            .count()
    };
    within(0, y, h) * within(1, x, w)
}

/// Max pooling through [`PhasePlanes`]: each plane is padded with −inf and split into its
/// stride phases, so that each tap of the window, for all output rows at once, is one slice
/// (`width` columns per output row, the padding's dropped at the end): nine long loops per
/// plane of a 3×3 pool instead of nine per output row, whose per-row overhead on 16-float rows
/// made resnet_tiny's one MaxPool a seventh of its time.
fn max_pool_planes(
    x: &[f32],
    [planes, h, w]: [usize; 3],
    win: &Window,
    [oh, ow]: [usize; 2],
    layout: &PhasePlanes,
) -> Result<Vec<f32>, String> {
    let offsets = layout.tap_offsets(1, win);
    let len = (oh - 1) * layout.width + ow;
    // Only real positions are written per plane: the padding stays −inf.
    let mut phases = vec![f32::NEG_INFINITY; layout.channel_len(win)];
    let mut row_max = vec![f32::NEG_INFINITY; len];
    let mut out = try_zeros_f32(&[planes, oh * ow])?;
    for (plane, o) in x.chunks(h * w).zip(out.chunks_mut(oh * ow)) {
        layout.fill(plane, 1, [h, w], win, &mut phases);
        row_max.fill(f32::NEG_INFINITY);
        for &offset in &offsets {
            for (m, &v) in row_max.iter_mut().zip(&phases[offset..offset + len]) {
                *m = m.max(v);
            }
        }
        for (dst, src) in o.chunks_mut(ow).zip(row_max.chunks(layout.width)) {
            dst.copy_from_slice(&src[..ow]);
        }
    }
    Ok(out)
}

/// Max pooling of `planes` planes tap by tap, as [`depthwise`] convolves: each tap of the
/// window takes the maximum of an output row and a shifted input row (taps in the padding are
/// skipped; a window wholly in the padding gives −inf, as the per-window loop did).
fn max_pool(
    x: &[f32],
    [planes, h, w]: [usize; 3],
    win: &Window,
    [oh, ow]: [usize; 2],
) -> Result<Vec<f32>, String> {
    let mut out = crate::tensor::try_filled(planes * oh * ow, f32::NEG_INFINITY)?;
    let mut phases = ColumnPhases::new([h, w], win.stride[1]);
    let tap_columns: Vec<TapColumns> = (0..win.kernel[1]).map(|j| phases.tap(win, j, ow)).collect();
    for (plane, o) in x.chunks(h * w).zip(out.chunks_mut((oh * ow).max(1))) {
        let plane = phases.split(plane);
        for i in 0..win.kernel[0] {
            for tap in &tap_columns {
                for y in 0..oh {
                    let Some(src) = tap.source(plane, win, [y, i]) else {
                        continue;
                    };
                    for (d, &v) in o[y * ow..][tap.first..tap.end].iter_mut().zip(src) {
                        *d = d.max(v);
                    }
                }
            }
        }
    }
    Ok(out)
}

fn global_pool(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(format!("expected [N, C, spatial...], got {:?}", x.shape()));
    }
    let nc: usize = x.shape()[..2].iter().product();
    let spatial: usize = x.shape()[2..].iter().product();
    let max = ctx.node.op_type == "GlobalMaxPool";
    let out = x
        .as_f32()?
        .chunks(spatial.max(1))
        .take(nc)
        .map(|plane| {
            if max {
                plane.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            } else {
                // Summed as onnxruntime's MLAS sums a global pool (see `SumOrder::Lanes`).
                lane_sum(plane) / spatial as f32
            }
        })
        .collect();
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Ok(vec![HostTensor::f32(shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn windows_overflowing_usize_are_errors() {
        // Pads of i64::MAX on both sides of an axis overflow the padded size: an error, not a
        // wrapped size (shape inference refuses these first; the kernel must not rely on it).
        let node = super::super::test_util::node(
            "Conv",
            vec![
                ("dilations", Attribute::Ints(vec![i64::MAX, 1])),
                ("pads", Attribute::Ints(vec![i64::MAX, 0, i64::MAX, 0])),
            ],
        );
        let ctx = super::super::Ctx {
            node: &node,
            opset: 17,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let x = f(&[1, 1, 3, 3], &[1.0; 9]);
        let w = f(&[1, 1, 2, 2], &[1.0; 4]);
        let err = super::conv(&ctx, &[Some(&x), Some(&w)]).unwrap_err();
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn depthwise_matches_the_definition_with_strides_dilations_and_pads() {
        // 2 images × 3 channels of 7×9, group 3, 3×3 taps, stride [2, 3], dilation [2, 1],
        // pads [1, 2, 0, 1] (top, left, bottom, right), bias: against the sum as ONNX defines it.
        let (n, c, h, w) = (2usize, 3usize, 7usize, 9usize);
        let xs: Vec<f32> = (0..n * c * h * w)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let ws: Vec<f32> = (0..c * 9)
            .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let bias = [0.5f32, -1.0, 2.0];
        let x = f(&[n, c, h, w], &xs);
        let k = f(&[c, 1, 3, 3], &ws);
        let b = f(&[c], &bias);
        let (stride, dilation, pad) = ([2usize, 3], [2usize, 1], [1usize, 2, 0, 1]);
        let out = run(
            "Conv",
            vec![
                ("group", Attribute::Int(c as i64)),
                ("strides", Attribute::Ints(vec![2, 3])),
                ("dilations", Attribute::Ints(vec![2, 1])),
                ("pads", Attribute::Ints(vec![1, 2, 0, 1])),
            ],
            &[&x, &k, &b],
        );
        let oh = (h + pad[0] + pad[2] - (dilation[0] * 2 + 1)) / stride[0] + 1;
        let ow = (w + pad[1] + pad[3] - (dilation[1] * 2 + 1)) / stride[1] + 1;
        let mut want = Vec::new();
        for img in 0..n {
            for ch in 0..c {
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut sum = bias[ch];
                        for i in 0..3 {
                            for j in 0..3 {
                                let iy =
                                    (y * stride[0] + i * dilation[0]) as isize - pad[0] as isize;
                                let ix =
                                    (xo * stride[1] + j * dilation[1]) as isize - pad[1] as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                    let at = ((img * c + ch) * h + iy as usize) * w + ix as usize;
                                    sum += ws[ch * 9 + i * 3 + j] * xs[at];
                                }
                            }
                        }
                        want.push(sum);
                    }
                }
            }
        }
        assert_close(&out[0], &[n, c, oh, ow], &want);
    }

    #[test]
    fn strided_dilated_padded_grouped_conv_matches_the_definition() {
        // Through the phase planes: 2 images × 4 channels of 11×13, 6 output channels in 2
        // groups, 3×2 taps, stride [2, 3], dilation [2, 1], pads [1, 2, 2, 0] (top, left,
        // bottom, right), bias; and a large image (200 × 40) whose output rows go in tiles.
        let check = |[n, c, h, w]: [usize; 4], m: usize, group: usize, strides: [usize; 2]| {
            let (cg, mg, kh, kw) = (c / group, m / group, 3usize, 2usize);
            let (dilation, pad) = ([2usize, 1], [1usize, 2, 2, 0]);
            let xs: Vec<f32> = (0..n * c * h * w)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
                .collect();
            let ws: Vec<f32> = (0..m * cg * kh * kw)
                .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let bias: Vec<f32> = (0..m).map(|i| i as f32 - 2.0).collect();
            let out = run(
                "Conv",
                vec![
                    ("group", Attribute::Int(group as i64)),
                    (
                        "strides",
                        Attribute::Ints(strides.map(|s| s as i64).to_vec()),
                    ),
                    ("dilations", Attribute::Ints(vec![2, 1])),
                    ("pads", Attribute::Ints(vec![1, 2, 2, 0])),
                ],
                &[
                    &f(&[n, c, h, w], &xs),
                    &f(&[m, cg, kh, kw], &ws),
                    &f(&[m], &bias),
                ],
            );
            let oh = (h + pad[0] + pad[2] - (dilation[0] * (kh - 1) + 1)) / strides[0] + 1;
            let ow = (w + pad[1] + pad[3] - (dilation[1] * (kw - 1) + 1)) / strides[1] + 1;
            let mut want = Vec::new();
            for img in 0..n {
                for oc in 0..m {
                    let g = oc / mg;
                    for y in 0..oh {
                        for xo in 0..ow {
                            let mut sum = bias[oc];
                            for ci in 0..cg {
                                for i in 0..kh {
                                    for j in 0..kw {
                                        let iy = (y * strides[0] + i * dilation[0]) as isize
                                            - pad[0] as isize;
                                        let ix = (xo * strides[1] + j * dilation[1]) as isize
                                            - pad[1] as isize;
                                        if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= w
                                        {
                                            continue;
                                        }
                                        let channel = g * cg + ci;
                                        let at = ((img * c + channel) * h + iy as usize) * w
                                            + ix as usize;
                                        sum += ws[((oc * cg + ci) * kh + i) * kw + j] * xs[at];
                                    }
                                }
                            }
                            want.push(sum);
                        }
                    }
                }
            }
            assert_close(&out[0], &[n, m, oh, ow], &want);
        };
        check([2, 4, 11, 13], 6, 2, [2, 3]);
        check([1, 4, 200, 40], 6, 2, [1, 1]);
        check([3, 2, 9, 7], 4, 1, [2, 2]);
    }

    /// A convolution as ONNX defines it: `[n, c, h, w]` input, `m` output channels in `group`
    /// groups, `kernel` taps, `strides`, `dilations`, pads (top, left, bottom, right), a bias.
    struct Defined {
        nchw: [usize; 4],
        m: usize,
        group: usize,
        kernel: [usize; 2],
        strides: [usize; 2],
        dilations: [usize; 2],
        pads: [usize; 4],
    }

    impl Defined {
        fn attributes(&self) -> Vec<(&'static str, Attribute)> {
            let ints = |v: &[usize]| Attribute::Ints(v.iter().map(|&x| x as i64).collect());
            vec![
                ("group", Attribute::Int(self.group as i64)),
                ("strides", ints(&self.strides)),
                ("dilations", ints(&self.dilations)),
                ("pads", ints(&self.pads)),
            ]
        }

        fn output_hw(&self) -> [usize; 2] {
            let [_, _, h, w] = self.nchw;
            let out = |axis: usize, size: usize| {
                let padded = size + self.pads[axis] + self.pads[axis + 2];
                (padded - (self.dilations[axis] * (self.kernel[axis] - 1) + 1)) / self.strides[axis]
                    + 1
            };
            [out(0, h), out(1, w)]
        }

        /// The sums of the definition, one loop per index.
        fn reference(&self, xs: &[f32], ws: &[f32], bias: &[f32]) -> Vec<f32> {
            let [n, c, h, w] = self.nchw;
            let [kh, kw] = self.kernel;
            let (cg, mg) = (c / self.group, self.m / self.group);
            let [oh, ow] = self.output_hw();
            let mut want = Vec::new();
            for img in 0..n {
                for oc in 0..self.m {
                    for y in 0..oh {
                        for xo in 0..ow {
                            let mut sum = bias[oc];
                            for ci in 0..cg {
                                for i in 0..kh {
                                    for j in 0..kw {
                                        let iy = (y * self.strides[0] + i * self.dilations[0])
                                            as isize
                                            - self.pads[0] as isize;
                                        let ix = (xo * self.strides[1] + j * self.dilations[1])
                                            as isize
                                            - self.pads[1] as isize;
                                        if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= w
                                        {
                                            continue;
                                        }
                                        let channel = (oc / mg) * cg + ci;
                                        let at = ((img * c + channel) * h + iy as usize) * w
                                            + ix as usize;
                                        sum += ws[((oc * cg + ci) * kh + i) * kw + j] * xs[at];
                                    }
                                }
                            }
                            want.push(sum);
                        }
                    }
                }
            }
            want
        }

        /// Runs the Conv kernel on a made-up input, alone and with a Relu epilogue, and
        /// compares it with [`Defined::reference`].
        fn assert_kernel_matches(&self) {
            let case = self;
            let [n, c, h, w] = case.nchw;
            let (cg, [kh, kw]) = (c / case.group, case.kernel);
            let xs: Vec<f32> = (0..n * c * h * w)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
                .collect();
            let ws: Vec<f32> = (0..case.m * cg * kh * kw)
                .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let bias: Vec<f32> = (0..case.m).map(|i| i as f32 / 3.0 - 2.0).collect();
            let inputs = [
                f(&[n, c, h, w], &xs),
                f(&[case.m, cg, kh, kw], &ws),
                f(&[case.m], &bias),
            ];
            let want = case.reference(&xs, &ws, &bias);
            let [oh, ow] = case.output_hw();
            let out = run(
                "Conv",
                case.attributes(),
                &[&inputs[0], &inputs[1], &inputs[2]],
            );
            assert_close(&out[0], &[n, case.m, oh, ow], &want);
            let node = super::super::test_util::node("Conv", case.attributes());
            let ctx = super::super::Ctx {
                node: &node,
                opset: 17,
                output_dtypes: &[],
                input_dtypes: &[],
            };
            let refs = [Some(&inputs[0]), Some(&inputs[1]), Some(&inputs[2])];
            let epilogue = super::Epilogue {
                relu: true,
                ..Default::default()
            };
            let relu = super::conv_then(&ctx, &refs, &epilogue).unwrap();
            let want_relu: Vec<f32> = want.iter().map(|v| v.max(0.0)).collect();
            assert_close(&relu[0], &[n, case.m, oh, ow], &want_relu);
        }

        /// Whether the kernel runs it through the tap rows (what the test means to cover).
        fn takes_tap_rows(&self) -> bool {
            let [n, c, h, w] = self.nchw;
            let geometry = super::ConvGeometry {
                n,
                c,
                hw: [h, w],
                groups: [self.group, c / self.group, self.m / self.group],
                out_hw: self.output_hw(),
            };
            let win = super::Window {
                kernel: self.kernel,
                stride: self.strides,
                dilation: self.dilations,
                pad: [[self.pads[0], self.pads[2]], [self.pads[1], self.pads[3]]],
            };
            super::PhasePlanes::fit(&geometry, &win)
                .is_some_and(|planes| planes.suits_tap_rows(&geometry, &win))
        }
    }

    #[test]
    fn tap_rows_match_the_definition_on_odd_shapes() {
        // Output channels that fill no whole tile (13, 5 per group), few input channels,
        // strides 2 and mixed, dilation 2, asymmetric pads, groups; with and without a Relu.
        let cases = [
            Defined {
                nchw: [2, 3, 20, 22],
                m: 13,
                group: 1,
                kernel: [7, 7],
                strides: [2, 2],
                dilations: [1, 1],
                pads: [3, 3, 3, 3],
            },
            Defined {
                nchw: [1, 6, 17, 19],
                m: 10,
                group: 2,
                kernel: [3, 3],
                strides: [1, 1],
                dilations: [2, 2],
                pads: [2, 2, 2, 2],
            },
            Defined {
                nchw: [3, 5, 15, 26],
                m: 9,
                group: 1,
                kernel: [3, 2],
                strides: [2, 1],
                dilations: [1, 2],
                pads: [1, 0, 2, 1],
            },
            Defined {
                nchw: [2, 4, 16, 16],
                m: 8,
                group: 1,
                kernel: [1, 1],
                strides: [2, 2],
                dilations: [1, 1],
                pads: [0, 0, 0, 0],
            },
        ];
        for case in &cases {
            assert!(case.takes_tap_rows(), "{:?}", case.nchw);
            case.assert_kernel_matches();
        }
    }

    /// A dilated window wider than the input (DeepLabV3's atrous branches at rates 12 to 36 on
    /// a small map): most taps fall in the padding, and onnxruntime runs it. The kernel used to
    /// index before a row's start ("range start index 18446744073709551615").
    #[test]
    fn dilations_wider_than_the_input_read_only_the_padding() {
        let cases = [
            ([1, 3, 3, 3], 1, [18, 18], [1, 1], [18, 18, 18, 18]),
            ([2, 8, 8, 8], 1, [36, 36], [1, 1], [36, 36, 36, 36]),
            ([1, 3, 6, 6], 1, [9, 3], [2, 2], [9, 3, 9, 3]),
            ([1, 4, 4, 4], 4, [12, 12], [1, 1], [12, 12, 12, 12]),
            ([1, 3, 9, 9], 1, [4, 4], [1, 1], [8, 0, 0, 8]),
            ([1, 4, 33, 40], 1, [40, 48], [1, 1], [40, 48, 40, 48]),
        ];
        for (nchw, group, dilations, strides, pads) in cases {
            let case = Defined {
                nchw,
                m: 4,
                group,
                kernel: [3, 3],
                strides,
                dilations,
                pads,
            };
            case.assert_kernel_matches();
        }
    }

    #[test]
    fn max_pool_through_phase_planes_matches_the_definition() {
        // Odd planes, a 3×2 window at strides [2, 3], dilation [1, 2], asymmetric pads, and a
        // ceil-mode case whose last window hangs past the padding (the row-by-row path).
        let (n, c, h, w) = (2usize, 3usize, 9usize, 11usize);
        let xs: Vec<f32> = (0..n * c * h * w)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let x = f(&[n, c, h, w], &xs);
        let check = |strides: [usize; 2], dilations: [usize; 2], pads: [usize; 4], ceil: bool| {
            let (kh, kw) = (3usize, 2usize);
            let out = run(
                "MaxPool",
                vec![
                    ("kernel_shape", Attribute::Ints(vec![kh as i64, kw as i64])),
                    (
                        "strides",
                        Attribute::Ints(strides.map(|v| v as i64).to_vec()),
                    ),
                    (
                        "dilations",
                        Attribute::Ints(dilations.map(|v| v as i64).to_vec()),
                    ),
                    ("pads", Attribute::Ints(pads.map(|v| v as i64).to_vec())),
                    ("ceil_mode", Attribute::Int(i64::from(ceil))),
                ],
                &[&x],
            );
            let size = |axis: usize, len: usize, k: usize| {
                let span = len + pads[axis] + pads[axis + 2] - (dilations[axis] * (k - 1) + 1);
                let mut o = if ceil {
                    span.div_ceil(strides[axis])
                } else {
                    span / strides[axis]
                } + 1;
                if ceil && (o - 1) * strides[axis] >= len + pads[axis] {
                    o -= 1;
                }
                o
            };
            let (oh, ow) = (size(0, h, kh), size(1, w, kw));
            let mut want = Vec::new();
            for plane in xs.chunks(h * w) {
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut best = f32::NEG_INFINITY;
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy =
                                    (y * strides[0] + i * dilations[0]) as isize - pads[0] as isize;
                                let ix = (xo * strides[1] + j * dilations[1]) as isize
                                    - pads[1] as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                    best = best.max(plane[iy as usize * w + ix as usize]);
                                }
                            }
                        }
                        want.push(best);
                    }
                }
            }
            assert_close(&out[0], &[n, c, oh, ow], &want);
        };
        check([2, 2], [1, 1], [1, 1, 1, 1], false);
        check([2, 3], [1, 2], [1, 0, 2, 1], false);
        check([1, 1], [2, 1], [0, 1, 0, 0], false);
        check([2, 2], [1, 1], [0, 0, 0, 0], true);
    }

    #[test]
    fn few_output_positions_match_the_definition_and_each_image_alone_bit_for_bit() {
        // A 1-D front end's shape in small (a 16-tap filter bank at stride 8 over 40 samples:
        // 4 frames), and a grouped 3×3 convolution with a 2×2 output.
        let cases = [
            Defined {
                nchw: [4, 1, 1, 40],
                m: 6,
                group: 1,
                kernel: [1, 16],
                strides: [1, 8],
                dilations: [1, 1],
                pads: [0; 4],
            },
            Defined {
                nchw: [3, 4, 4, 4],
                m: 6,
                group: 2,
                kernel: [3, 3],
                strides: [2, 2],
                dilations: [1, 1],
                pads: [1, 1, 0, 0],
            },
            Defined {
                nchw: [2, 3, 5, 4],
                m: 4,
                group: 1,
                kernel: [3, 3],
                strides: [2, 1],
                dilations: [1, 2],
                pads: [1, 1, 1, 0],
            },
        ];
        for case in cases {
            assert!(case.output_hw().iter().product::<usize>() <= super::FEW_POSITIONS);
            case.assert_kernel_matches();
            let [n, c, h, w] = case.nchw;
            let (cg, [kh, kw]) = (c / case.group, case.kernel);
            let xs: Vec<f32> = (0..n * c * h * w)
                .map(|i| (i % 13) as f32 / 3.0 - 2.0)
                .collect();
            let ws = f(&[case.m, cg, kh, kw], &vec![0.3; case.m * cg * kh * kw]);
            let all = run("Conv", case.attributes(), &[&f(&case.nchw, &xs), &ws]);
            // A micro-batch of one image gives the whole batch's bits for that image.
            let mut one_by_one = Vec::new();
            for image in xs.chunks(c * h * w) {
                let alone = run("Conv", case.attributes(), &[&f(&[1, c, h, w], image), &ws]);
                one_by_one.extend(alone[0].to_f32_vec());
            }
            assert_eq!(all[0].to_f32_vec(), one_by_one);
        }
    }

    #[test]
    fn several_images_per_product_match_one_image_at_a_time() {
        // Three 2-channel 5×4 images, 4 output channels in 2 groups, 3×3 taps, pad 1, bias:
        // small enough that the batched path takes all three images in one product.
        let values = |count: usize, scale: f32| -> Vec<f32> {
            (0..count)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * scale)
                .collect()
        };
        let x = values(3 * 2 * 5 * 4, 0.25);
        let w = f(&[4, 1, 3, 3], &values(36, 0.5));
        let b = f(&[4], &[0.5, -1.0, 2.0, 0.0]);
        let attrs = || {
            vec![
                ("pads", Attribute::Ints(vec![1, 1, 1, 1])),
                ("group", Attribute::Int(2)),
            ]
        };
        let all = run("Conv", attrs(), &[&f(&[3, 2, 5, 4], &x), &w, &b]);
        let mut one_by_one = Vec::new();
        for image in x.chunks(2 * 5 * 4) {
            let out = run("Conv", attrs(), &[&f(&[1, 2, 5, 4], image), &w, &b]);
            one_by_one.extend(out[0].to_f32_vec());
        }
        assert_close(&all[0], &[3, 4, 5, 4], &one_by_one);
    }

    #[test]
    fn conv_with_padding_stride_and_bias() {
        // 1×1×3×3 input, 1×1×2×2 kernel of ones, pad 1, stride 2.
        let x = f(
            &[1, 1, 3, 3],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        );
        let w = f(&[1, 1, 2, 2], &[1.0; 4]);
        let b = f(&[1], &[0.5]);
        let out = run(
            "Conv",
            vec![
                ("pads", Attribute::Ints(vec![1, 1, 1, 1])),
                ("strides", Attribute::Ints(vec![2, 2])),
            ],
            &[&x, &w, &b],
        );
        assert_close(&out[0], &[1, 1, 2, 2], &[1.5, 5.5, 11.5, 28.5]);
    }

    #[test]
    fn grouped_pointwise_and_1d_conv() {
        let x = f(&[1, 2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let w = f(&[2, 1, 1, 1], &[10.0, -1.0]);
        let out = run("Conv", vec![("group", Attribute::Int(2))], &[&x, &w]);
        assert_close(&out[0], &[1, 2, 1, 2], &[10.0, 20.0, -3.0, -4.0]);
        let x = f(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let w = f(&[1, 1, 2], &[1.0, -1.0]);
        assert_close(
            &run("Conv", vec![], &[&x, &w])[0],
            &[1, 1, 3],
            &[-1.0, -1.0, -1.0],
        );
    }

    #[test]
    fn conv_transpose_doubles_resolution() {
        let x = f(&[1, 1, 1, 2], &[1.0, 2.0]);
        let w = f(&[1, 1, 1, 2], &[1.0, 10.0]);
        let out = run(
            "ConvTranspose",
            vec![("strides", Attribute::Ints(vec![1, 2]))],
            &[&x, &w],
        );
        assert_close(&out[0], &[1, 1, 1, 4], &[1.0, 10.0, 2.0, 20.0]);
    }

    #[test]
    fn pools() {
        let x = f(
            &[1, 1, 3, 3],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        );
        let k = ("kernel_shape", Attribute::Ints(vec![2, 2]));
        assert_close(
            &run("MaxPool", vec![k.clone()], &[&x])[0],
            &[1, 1, 2, 2],
            &[5.0, 6.0, 8.0, 9.0],
        );
        let out = run(
            "AveragePool",
            vec![
                k.clone(),
                ("strides", Attribute::Ints(vec![2, 2])),
                ("ceil_mode", Attribute::Int(1)),
            ],
            &[&x],
        );
        assert_close(&out[0], &[1, 1, 2, 2], &[3.0, 4.5, 7.5, 9.0]);
        assert_close(
            &run("GlobalAveragePool", vec![], &[&x])[0],
            &[1, 1, 1, 1],
            &[5.0],
        );
        assert_close(
            &run("GlobalMaxPool", vec![], &[&x])[0],
            &[1, 1, 1, 1],
            &[9.0],
        );
    }
}
