//! CenterCropPad (<https://onnx.ai/onnx/operators/onnx__CenterCropPad.html>, opset 18): each
//! dim at `axes` becomes its target size, cropped symmetrically where it shrinks (the extra
//! element on the end side when the difference is odd) and zero-padded symmetrically where it
//! grows (the extra element on the end side), as the ONNX reference does.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::normalize_axis;
use crate::tensor::{strides_of, HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["CenterCropPad"], center_crop_pad);
}

fn center_crop_pad(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let sizes = input(inputs, 1)?.to_i64_vec();
    let rank = x.shape().len();
    let axes: Vec<i64> = ctx
        .ints("axes")
        .unwrap_or_else(|| (0..rank as i64).collect());
    if axes.len() != sizes.len() {
        return Err(format!(
            "{} axes but {} target sizes",
            axes.len(),
            sizes.len()
        ));
    }
    let mut out_shape = x.shape().to_vec();
    for (&axis, &size) in axes.iter().zip(&sizes) {
        let size = usize::try_from(size).map_err(|_| format!("target size {size} is below 0"))?;
        out_shape[normalize_axis(axis, rank)?] = size;
    }
    // Per axis: where output index 0 reads in the input (negative: padding first).
    let offset: Vec<i64> = x
        .shape()
        .iter()
        .zip(&out_shape)
        .map(|(&input, &output)| {
            if output <= input {
                ((input - output) / 2) as i64
            } else {
                -(((output - input) / 2) as i64)
            }
        })
        .collect();
    let in_strides = strides_of(x.shape());
    let total = super::indexing::checked_size(&out_shape)?;
    let source = |flat: usize| -> Option<usize> {
        let mut rest = flat;
        let mut at = 0;
        for axis in (0..rank).rev() {
            let index = (rest % out_shape[axis]) as i64 + offset[axis];
            rest /= out_shape[axis];
            if index < 0 || index >= x.shape()[axis] as i64 {
                return None;
            }
            at += index as usize * in_strides[axis];
        }
        Some(at)
    };
    let data = match x.data() {
        TensorData::F32(v) => TensorData::F32(
            (0..total)
                .map(|o| source(o).map_or(0.0, |i| v[i]))
                .collect(),
        ),
        TensorData::I64(v) => {
            TensorData::I64((0..total).map(|o| source(o).map_or(0, |i| v[i])).collect())
        }
        TensorData::I32(v) => {
            TensorData::I32((0..total).map(|o| source(o).map_or(0, |i| v[i])).collect())
        }
        TensorData::Bool(v) => TensorData::Bool(
            (0..total)
                .map(|o| source(o).is_some_and(|i| v[i]))
                .collect(),
        ),
        TensorData::U8(v) => {
            TensorData::U8((0..total).map(|o| source(o).map_or(0, |i| v[i])).collect())
        }
        TensorData::I8(v) => {
            TensorData::I8((0..total).map(|o| source(o).map_or(0, |i| v[i])).collect())
        }
        // Padding strings are empty, as numbers pad with zero.
        TensorData::String(v) => TensorData::String(
            (0..total)
                .map(|o| source(o).map_or_else(String::new, |i| v[i].clone()))
                .collect(),
        ),
    };
    Ok(vec![HostTensor::with_data(out_shape, data)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};

    #[test]
    fn crops_and_pads_around_the_centre() {
        let x = f(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_close(
            &run("CenterCropPad", vec![], &[&x, &i(&[1], &[3])])[0],
            &[3],
            &[2.0, 3.0, 4.0],
        );
        // Growing by 3: one zero before, two after.
        let x = f(&[2], &[1.0, 2.0]);
        assert_close(
            &run("CenterCropPad", vec![], &[&x, &i(&[1], &[5])])[0],
            &[5],
            &[0.0, 1.0, 2.0, 0.0, 0.0],
        );
    }
}
