//! Object-detection ops, after the ONNX reference (itself onnxruntime's):
//!
//! - [NonMaxSuppression](https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html)
//!   (opsets 10–11), whose output length depends on the scores, so shape inference leaves it a
//!   symbol unless bound: per batch and class, boxes above the score threshold are taken in
//!   order of falling score (the lower index first among equals), each kept unless its IoU with
//!   a box already kept exceeds the threshold, up to `max_output_boxes_per_class`;
//! - [RoiAlign](https://onnx.ai/onnx/operators/onnx__RoiAlign.html) (opsets 10–22): each region
//!   pooled to `output_height × output_width` bins by averaging (or, in `max` mode, taking the
//!   largest weighted corner of) bilinear samples on a `sampling_ratio` grid per bin.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["NonMaxSuppression"], non_max_suppression);
    t.add(&["RoiAlign"], roi_align);
}

/// A box as its x and y extents, `(min, max)` each.
#[derive(Clone, Copy)]
struct Extent {
    x: (f32, f32),
    y: (f32, f32),
}

impl Extent {
    /// Reads `[y1, x1, y2, x2]` (corners in either order) or, with `center_point_box`,
    /// `[x_center, y_center, width, height]`.
    fn read(b: &[f32], center_point_box: bool) -> Extent {
        let ordered = |a: f32, b: f32| if a >= b { (b, a) } else { (a, b) };
        if center_point_box {
            let (w, h) = (b[2] / 2.0, b[3] / 2.0);
            Extent {
                x: (b[0] - w, b[0] + w),
                y: (b[1] - h, b[1] + h),
            }
        } else {
            Extent {
                x: ordered(b[1], b[3]),
                y: ordered(b[0], b[2]),
            }
        }
    }

    fn area(&self) -> f32 {
        (self.x.1 - self.x.0) * (self.y.1 - self.y.0)
    }

    /// Whether the intersection over union exceeds `threshold`; boxes with no area never do.
    fn overlaps(&self, other: &Extent, threshold: f32) -> bool {
        let x = (self.x.0.max(other.x.0), self.x.1.min(other.x.1));
        let y = (self.y.0.max(other.y.0), self.y.1.min(other.y.1));
        if x.1 <= x.0 || y.1 <= y.0 {
            return false;
        }
        let intersection = (x.1 - x.0) * (y.1 - y.0);
        let (a, b) = (self.area(), other.area());
        let union = a + b - intersection;
        if intersection <= 0.0 || a <= 0.0 || b <= 0.0 || union <= 0.0 {
            return false;
        }
        intersection / union > threshold
    }
}

/// The first element of an optional scalar input.
fn scalar(inputs: &[Option<&HostTensor>], i: usize) -> Option<f32> {
    optional(inputs, i).and_then(|t| t.to_f32_vec().first().copied())
}

fn non_max_suppression(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (boxes, scores) = (input(inputs, 0)?, input(inputs, 1)?);
    let (bs, ss) = (boxes.shape(), scores.shape());
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(format!(
            "boxes {bs:?} must be [batches, boxes, 4] and scores {ss:?} [batches, classes, boxes]"
        ));
    }
    let (batches, classes, count) = (ss[0], ss[1], ss[2]);
    let max_per_class = optional(inputs, 2)
        .and_then(|t| t.to_i64_vec().first().copied())
        .unwrap_or(0)
        .max(0) as usize;
    let iou_threshold = scalar(inputs, 3).unwrap_or(0.0);
    let score_threshold = scalar(inputs, 4);
    let center_point_box = ctx.int("center_point_box", 0) != 0;
    let (boxes, scores) = (boxes.to_f32_vec(), scores.to_f32_vec());
    let mut selected: Vec<i64> = Vec::new();
    for batch in 0..batches {
        let extents: Vec<Extent> = (0..count)
            .map(|b| Extent::read(&boxes[(batch * count + b) * 4..][..4], center_point_box))
            .collect();
        for class in 0..classes {
            let class_scores = &scores[(batch * classes + class) * count..][..count];
            let mut candidates: Vec<usize> = (0..count)
                .filter(|&b| score_threshold.is_none_or(|t| class_scores[b] > t))
                .collect();
            candidates
                .sort_by(|&a, &b| class_scores[b].total_cmp(&class_scores[a]).then(a.cmp(&b)));
            let mut kept: Vec<usize> = Vec::new();
            for b in candidates {
                if kept.len() >= max_per_class {
                    break;
                }
                if kept
                    .iter()
                    .all(|&k| !extents[b].overlaps(&extents[k], iou_threshold))
                {
                    kept.push(b);
                    selected.extend([batch as i64, class as i64, b as i64]);
                }
            }
        }
    }
    Ok(vec![HostTensor::i64(vec![selected.len() / 3, 3], selected)])
}

/// The four corners of a bilinear sample at `(y, x)` in an `height × width` plane, as flat
/// positions and weights; no weight outside the `[-1, size]` margin (the reference's rules).
fn sample_corners(y: f32, x: f32, height: usize, width: usize) -> [(usize, f32); 4] {
    if y < -1.0 || y > height as f32 || x < -1.0 || x > width as f32 {
        return [(0, 0.0); 4];
    }
    let clamp = |v: f32, size: usize| -> (usize, usize, f32) {
        let v = v.max(0.0);
        let low = v as usize;
        if low >= size - 1 {
            (size - 1, size - 1, 0.0)
        } else {
            (low, low + 1, v - low as f32)
        }
    };
    let (y0, y1, ly) = clamp(y, height);
    let (x0, x1, lx) = clamp(x, width);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    [
        (y0 * width + x0, hy * hx),
        (y0 * width + x1, hy * lx),
        (y1 * width + x0, ly * hx),
        (y1 * width + x1, ly * lx),
    ]
}

fn roi_align(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, rois, batch_of) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let [batches, channels, height, width] = *x.shape() else {
        return Err(format!("the input {:?} is not [N, C, H, W]", x.shape()));
    };
    let count = batch_of.len();
    if rois.shape() != [count, 4] || height == 0 || width == 0 {
        return Err(format!("rois {:?} are not [{count}, 4]", rois.shape()));
    }
    let (out_h, out_w) = (
        ctx.int("output_height", 1).max(1) as usize,
        ctx.int("output_width", 1).max(1) as usize,
    );
    let sampling = ctx.int("sampling_ratio", 0);
    let scale = ctx.float("spatial_scale", 1.0);
    let default_mode = if ctx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel = ctx.string("coordinate_transformation_mode", default_mode) == "half_pixel";
    let max_mode = ctx.string("mode", "avg") == "max";
    let (xv, rv, bv) = (x.to_f32_vec(), rois.to_f32_vec(), batch_of.to_i64_vec());
    let mut out = Vec::with_capacity(super::indexing::checked_size(&[
        count, channels, out_h, out_w,
    ])?);
    for r in 0..count {
        let b = usize::try_from(bv[r])
            .ok()
            .filter(|&b| b < batches)
            .ok_or_else(|| format!("roi {r} names batch {}", bv[r]))?;
        let offset = if half_pixel { 0.5 } else { 0.0 };
        let [x0, y0, x1, y1] = [0, 1, 2, 3].map(|i| rv[r * 4 + i] * scale - offset);
        let (mut roi_w, mut roi_h) = (x1 - x0, y1 - y0);
        if !half_pixel {
            roi_w = roi_w.max(1.0);
            roi_h = roi_h.max(1.0);
        }
        let (bin_h, bin_w) = (roi_h / out_h as f32, roi_w / out_w as f32);
        let grid = |extent: f32, bins: usize| {
            if sampling > 0 {
                sampling as usize
            } else {
                (extent / bins as f32).ceil() as usize
            }
        };
        let (grid_h, grid_w) = (grid(roi_h, out_h), grid(roi_w, out_w));
        let samples = (grid_h * grid_w).max(1) as f32;
        // The samples of every bin, shared by all channels.
        let mut corners = Vec::with_capacity(super::indexing::checked_size(&[
            out_h, out_w, grid_h, grid_w,
        ])?);
        for ph in 0..out_h {
            for pw in 0..out_w {
                for iy in 0..grid_h {
                    let y = y0 + ph as f32 * bin_h + (iy as f32 + 0.5) * bin_h / grid_h as f32;
                    for ix in 0..grid_w {
                        let xx = x0 + pw as f32 * bin_w + (ix as f32 + 0.5) * bin_w / grid_w as f32;
                        corners.push(sample_corners(y, xx, height, width));
                    }
                }
            }
        }
        let per_bin = grid_h * grid_w;
        for c in 0..channels {
            let plane = &xv[(b * channels + c) * height * width..][..height * width];
            for bin in 0..out_h * out_w {
                let taps = &corners[bin * per_bin..][..per_bin];
                let value = if max_mode {
                    taps.iter()
                        .map(|t| {
                            t.iter()
                                .map(|&(p, w)| w * plane[p])
                                .fold(f32::NEG_INFINITY, f32::max)
                        })
                        .fold(None, |best: Option<f32>, v| {
                            Some(best.map_or(v, |b| b.max(v)))
                        })
                        .unwrap_or(0.0)
                } else {
                    taps.iter()
                        .map(|t| t.iter().map(|&(p, w)| w * plane[p]).sum::<f32>())
                        .sum::<f32>()
                        / samples
                };
                out.push(value);
            }
        }
    }
    Ok(vec![HostTensor::f32(
        vec![count, channels, out_h, out_w],
        out,
    )])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f, i, run};

    #[test]
    fn overlapping_boxes_keep_the_higher_score() {
        let boxes = f(
            &[1, 3, 4],
            &[0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 10.0, 1.0, 11.0],
        );
        let scores = f(&[1, 1, 3], &[0.9, 0.95, 0.5]);
        let out = run(
            "NonMaxSuppression",
            vec![],
            &[&boxes, &scores, &i(&[1], &[3]), &f(&[1], &[0.5])],
        );
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(out[0].to_i64_vec(), vec![0, 0, 1, 0, 0, 2]);
    }
}
