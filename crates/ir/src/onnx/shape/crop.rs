//! CenterCropPad (opset 18): the input with the dims at `axes` (default all) set to the `shape`
//! input's values, cropped or zero-padded around the centre.

use super::context::{normalize_axis, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::Dim;

pub(super) fn register(r: &mut Registry) {
    r.add("", &["CenterCropPad"], center_crop_pad);
}

fn center_crop_pad(ctx: &OpCtx) -> RuleResult {
    let input = ctx.shape(0)?;
    let sizes = ctx
        .const_ints(1)
        .ok_or("the target shape (input 1) must be known at plan time")?;
    let axes: Vec<i64> = match ctx.ints_attr("axes")? {
        Some(axes) => axes.to_vec(),
        None => (0..input.len() as i64).collect(),
    };
    if axes.len() != sizes.len() {
        return Err(format!(
            "{} axes but {} target sizes",
            axes.len(),
            sizes.len()
        ));
    }
    let mut shape = input.clone();
    for (&axis, &size) in axes.iter().zip(&sizes) {
        if size < 0 {
            return Err(format!("target size {size} is below 0"));
        }
        shape[normalize_axis(axis, input.len())?] = Dim::Known(size as u64);
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}
