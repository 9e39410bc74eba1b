//! Shape rules of the window generators (HannWindow, HammingWindow, BlackmanWindow, opset 17):
//! a 1-D tensor as long as the scalar `size` input, in `output_datatype` (default float).

use super::context::{Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{DType, Dim};

pub(super) fn register(r: &mut Registry) {
    r.add(
        "",
        &["HannWindow", "HammingWindow", "BlackmanWindow"],
        window,
    );
}

fn window(ctx: &OpCtx) -> RuleResult {
    let code = ctx.int_attr_or("output_datatype", 1)?;
    let dtype = DType::from_onnx(code as i32)
        .ok_or_else(|| format!("output_datatype {code} is not an ONNX type"))?;
    let len = match ctx.const_ints(0).as_deref() {
        Some([size]) if *size >= 0 => Dim::Known(*size as u64),
        Some([size]) => return Err(format!("size is {size}, below 0")),
        Some(_) => return Err("size must be a scalar".into()),
        None => ctx.data_dependent_dim(0, 0),
    };
    Ok(vec![Inferred::new(dtype, vec![len])])
}
