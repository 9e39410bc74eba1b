//! Object-detection ops: [NonMaxSuppression](https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html)
//! (opsets 10–11), whose output length depends on the scores, so shape inference leaves it a
//! symbol unless bound. The algorithm is the ONNX reference's (`op_non_max_suppression.py`,
//! itself onnxruntime's): per batch and class, boxes above the score threshold are taken in
//! order of falling score (the lower index first among equals), each kept unless its IoU with a
//! box already kept exceeds the threshold, up to `max_output_boxes_per_class`.

use super::{input, optional, Ctx, KernelResult, KernelTable};
use crate::runtime::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["NonMaxSuppression"], non_max_suppression);
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
