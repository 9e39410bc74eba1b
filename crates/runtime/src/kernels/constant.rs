//! [Constant](https://onnx.ai/onnx/operators/onnx__Constant.html), opsets 1–24, for the one
//! case where it stays a node: a graph of Constant nodes alone (the loader otherwise turns each
//! into a parameter). The value comes from the attribute the loader decoded, which holds the
//! contents of tensors up to [`pipecut_ir::graph::MAX_TRACKED_ELEMENTS`] elements.

use super::context::{Ctx, KernelResult, KernelTable};
use crate::tensor::runtime_dtype;
use crate::tensor::HostTensor;
use pipecut_ir::graph::{Attribute, ConstValue};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Constant"], constant);
}

fn constant(ctx: &Ctx, _: &[Option<&HostTensor>]) -> KernelResult {
    let (name, attr) = ctx
        .node
        .attributes
        .iter()
        .next()
        .ok_or("Constant has no value attribute")?;
    let tensor = match attr {
        Attribute::Tensor(t) => {
            let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
            let from = match &t.value {
                Some(ConstValue::Floats(v)) => {
                    HostTensor::f32(dims, v.iter().map(|&x| x as f32).collect())
                }
                Some(ConstValue::Ints(v)) => {
                    let ints = ConstValue::Ints(v.clone())
                        .as_i64s()
                        .ok_or("symbolic value")?;
                    HostTensor::i64(dims, ints)
                }
                Some(ConstValue::Strings(v)) => {
                    HostTensor::new(dims, crate::tensor::TensorData::String(v.clone()))?
                }
                None => {
                    return Err(format!(
                        "'{name}' holds more than {} elements, more than a node keeps",
                        pipecut_ir::graph::MAX_TRACKED_ELEMENTS
                    ))
                }
            };
            from.cast(runtime_dtype(t.dtype))?
        }
        Attribute::Float(x) => HostTensor::f32(vec![], vec![*x]),
        Attribute::Floats(v) => HostTensor::f32(vec![v.len()], v.clone()),
        Attribute::Int(x) => HostTensor::i64(vec![], vec![*x]),
        Attribute::Ints(v) => HostTensor::i64(vec![v.len()], v.clone()),
        _ => return Err(format!("Constant's '{name}' is not a numeric value")),
    };
    Ok(vec![tensor])
}
