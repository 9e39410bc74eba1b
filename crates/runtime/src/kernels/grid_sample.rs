//! GridSample: samples `X [N, C, D1..Dr]` at the normalised coordinates of `grid [N, O1..Or, r]`.
//!
//! Spec: <https://onnx.ai/onnx/operators/onnx__GridSample.html> (opset 16: 2-D, modes
//! `bilinear`/`nearest`/`bicubic`; opset 20: any rank, renamed `linear`/`nearest`/`cubic`).
//! `grid[..., 0]` indexes the last spatial axis (x = width), as in PyTorch. Coordinates are
//! denormalised per `align_corners`, then `border` clamps and `reflection` reflects them into
//! the sampling range; samples that fall outside read 0 (`zeros`) or the clamped / reflected
//! pixel. Nearest rounds half to even; cubic uses the spec's A = -0.75 and is 2-D only, as
//! onnxruntime's kernel is.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::checked_size;
use crate::tensor::{strides_of, HostTensor};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["GridSample"], grid_sample);
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// Reflects `x` into `[low, high]` (repeatedly, as a mirror pair would).
fn reflect(x: f32, low: f32, high: f32) -> f32 {
    let range = high - low;
    if range <= 0.0 {
        return low;
    }
    let (outside, from_low) = if x < low {
        (low - x, true)
    } else if x > high {
        (x - high, false)
    } else {
        return x;
    };
    let flips = (outside / range).floor();
    let rest = outside - flips * range;
    let even = flips as i64 % 2 == 0;
    match (from_low, even) {
        (true, true) | (false, false) => low + rest,
        _ => high - rest,
    }
}

struct Sampler<'a> {
    plane: &'a [f32],
    dims: &'a [usize],
    strides: Vec<usize>,
    padding: Padding,
    align_corners: bool,
}

impl Sampler<'_> {
    /// The sampling range of axis `d` for reflection.
    fn bounds(&self, d: usize) -> (f32, f32) {
        let n = self.dims[d] as f32;
        if self.align_corners {
            (0.0, n - 1.0)
        } else {
            (-0.5, n - 0.5)
        }
    }

    /// The pixel at integer coordinates, with the padding rule for ones outside.
    fn pixel(&self, coords: &[i64]) -> f32 {
        let mut offset = 0;
        for (d, &c) in coords.iter().enumerate() {
            let n = self.dims[d] as i64;
            let c = match self.padding {
                Padding::Zeros if !(0..n).contains(&c) => return 0.0,
                Padding::Zeros => c,
                Padding::Border => c.clamp(0, n - 1),
                Padding::Reflection => {
                    let (low, high) = self.bounds(d);
                    (reflect(c as f32, low, high) as i64).clamp(0, n - 1)
                }
            };
            offset += c as usize * self.strides[d];
        }
        self.plane[offset]
    }

    /// `coords` (one per axis) of the normalised point `g` (whose first component indexes the
    /// last axis), denormalised and clamped or reflected as the padding says.
    fn denormalise(&self, g: &[f32], coords: &mut [f32]) {
        let rank = coords.len();
        for d in 0..rank {
            let size = self.dims[d] as f32;
            let normalised = g[rank - 1 - d];
            let mut v = if self.align_corners {
                (normalised + 1.0) / 2.0 * (size - 1.0)
            } else {
                ((normalised + 1.0) * size - 1.0) / 2.0
            };
            match self.padding {
                Padding::Border => v = v.clamp(0.0, size - 1.0),
                Padding::Reflection => {
                    let (low, high) = self.bounds(d);
                    v = reflect(v, low, high);
                }
                Padding::Zeros => {}
            }
            coords[d] = v;
        }
    }

    /// The value at `coords` by `mode`; `corner` is scratch space of the rank's length.
    fn sample(&self, mode: Mode, coords: &[f32], corner: &mut [i64]) -> f32 {
        match mode {
            Mode::Nearest => {
                for (corner, coord) in corner.iter_mut().zip(coords) {
                    *corner = coord.round_ties_even() as i64;
                }
                self.pixel(corner)
            }
            Mode::Linear => self.linear(coords, corner),
            Mode::Cubic => self.cubic(coords),
        }
    }

    /// The weighted sum of the 2^rank pixels around `coords`.
    fn linear(&self, coords: &[f32], corner: &mut [i64]) -> f32 {
        let rank = coords.len();
        let mut sum = 0.0f32;
        for bits in 0..(1usize << rank) {
            let mut weight = 1.0f32;
            for d in 0..rank {
                let base = coords[d].floor();
                let t = coords[d] - base;
                let upper = bits >> d & 1 == 1;
                corner[d] = base as i64 + upper as i64;
                weight *= if upper { t } else { 1.0 - t };
            }
            if weight != 0.0 {
                sum += weight * self.pixel(corner);
            }
        }
        sum
    }

    /// The bicubic interpolation of the 4 × 4 pixels around `coords` (2-D only).
    fn cubic(&self, coords: &[f32]) -> f32 {
        let (y0, x0) = (coords[0].floor(), coords[1].floor());
        let (wy, wx) = (cubic_weights(coords[0] - y0), cubic_weights(coords[1] - x0));
        let mut sum = 0.0f32;
        for (i, wy) in wy.iter().enumerate() {
            for (j, wx) in wx.iter().enumerate() {
                let at = [y0 as i64 - 1 + i as i64, x0 as i64 - 1 + j as i64];
                sum += wy * wx * self.pixel(&at);
            }
        }
        sum
    }
}

fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

fn grid_sample(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, grid) = (input(inputs, 0)?, input(inputs, 1)?);
    let rank = x.rank().saturating_sub(2);
    if rank == 0 || grid.rank() != rank + 2 || grid.shape()[rank + 1] != rank {
        return Err(format!(
            "grid {:?} does not fit input {:?}",
            grid.shape(),
            x.shape()
        ));
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    if grid.shape()[0] != n {
        return Err(format!(
            "grid batch {} differs from input batch {n}",
            grid.shape()[0]
        ));
    }
    let mode = match ctx.string("mode", "linear").as_str() {
        "linear" | "bilinear" => Mode::Linear,
        "nearest" => Mode::Nearest,
        "cubic" | "bicubic" if rank == 2 => Mode::Cubic,
        "cubic" | "bicubic" => return Err("cubic mode is supported for 2-D inputs only".into()),
        other => return Err(format!("unknown mode '{other}'")),
    };
    let padding = match ctx.string("padding_mode", "zeros").as_str() {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return Err(format!("unknown padding_mode '{other}'")),
    };
    let align_corners = ctx.int("align_corners", 0) != 0;
    let dims = &x.shape()[2..];
    let out_spatial = &grid.shape()[1..=rank];
    let points: usize = out_spatial.iter().product();
    let mut shape = vec![n, c];
    shape.extend_from_slice(out_spatial);
    checked_size(&shape)?;
    let plane_len: usize = dims.iter().product();
    let (values, grid_values) = (x.as_f32()?, grid.as_f32()?);
    let mut out = Vec::with_capacity(n * c * points);
    let mut coords = vec![0.0f32; rank];
    let mut corner = vec![0i64; rank];
    for batch in 0..n {
        for channel in 0..c {
            let start = (batch * c + channel) * plane_len;
            let sampler = Sampler {
                plane: &values[start..start + plane_len],
                dims,
                strides: strides_of(dims),
                padding,
                align_corners,
            };
            for p in 0..points {
                let g = &grid_values[(batch * points + p) * rank..][..rank];
                sampler.denormalise(g, &mut coords);
                out.push(sampler.sample(mode, &coords, &mut corner));
            }
        }
    }
    Ok(vec![HostTensor::f32(shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn bilinear_samples_between_pixels_and_zeros_pad_outside() {
        let x = f(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        // Centre of the image, then a point half a pixel left of the image.
        let grid = f(&[1, 1, 2, 2], &[0.0, 0.0, -2.0, -0.5]);
        let out = run(
            "GridSample",
            vec![("align_corners", Attribute::Int(1))],
            &[&x, &grid],
        );
        // x = -0.5 (half outside), y = 0.25: 0.5 · (0.75 · 1 + 0.25 · 3).
        assert_close(&out[0], &[1, 1, 1, 2], &[2.5, 0.75]);
    }
}
