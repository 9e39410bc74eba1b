//! Sequences and optionals, after the ONNX reference implementation
//! (`onnx/reference/ops/op_sequence_*.py`, `op_split_to_sequence.py`, `op_optional_*.py`).

use std::sync::Arc;

use super::indexing::{normalize_axis, MAX_ELEMENTS};
use super::movement::{concat_along, narrow};
use super::values::{value_input, ValueCtx, ValueKernelTable};
use crate::tensor::{HostTensor, TensorData};
use crate::value::Value;

type Result<T> = std::result::Result<T, String>;

pub(super) fn register(t: &mut ValueKernelTable) {
    t.add(&["SequenceEmpty"], sequence_empty);
    t.add(&["SequenceConstruct"], sequence_construct);
    t.add(&["SequenceInsert"], sequence_insert);
    t.add(&["SequenceErase"], sequence_erase);
    t.add(&["SequenceAt"], sequence_at);
    t.add(&["SequenceLength"], sequence_length);
    t.add(&["SplitToSequence"], split_to_sequence);
    t.add(&["ConcatFromSequence"], concat_from_sequence);
    t.add(&["Optional"], optional);
    t.add(&["OptionalHasElement"], optional_has_element);
    t.add(&["OptionalGetElement"], optional_get_element);
    t.add(&["Identity"], identity);
}

fn scalar_i64(value: i64) -> Value {
    Value::Tensor(Arc::new(HostTensor::i64(vec![], vec![value])))
}

/// A position input (`SequenceAt`, `SequenceInsert`, `SequenceErase`): one integer, negative
/// counting from the end, within `0..=len` (`0..len` unless `end_allowed`).
fn position(value: &Value, len: usize, end_allowed: bool) -> Result<usize> {
    let position = match value.tensor()?.to_i64_vec().as_slice() {
        [p] => *p,
        other => return Err(format!("the position must be one integer, got {other:?}")),
    };
    let signed = len as i64;
    let resolved = if position < 0 {
        position + signed
    } else {
        position
    };
    let limit = if end_allowed { signed } else { signed - 1 };
    if resolved < 0 || resolved > limit {
        return Err(format!(
            "position {position} is outside a sequence of {len} elements"
        ));
    }
    Ok(resolved as usize)
}

fn sequence_empty(_: &ValueCtx, _: &[Option<&Value>]) -> Result<Vec<Value>> {
    Ok(vec![Value::Sequence(Vec::new())])
}

fn sequence_construct(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let elements = inputs
        .iter()
        .flatten()
        .map(|v| v.tensor().cloned())
        .collect::<Result<_>>()?;
    Ok(vec![Value::Sequence(elements)])
}

fn sequence_insert(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let mut elements = value_input(inputs, 0)?.sequence()?.to_vec();
    let tensor = value_input(inputs, 1)?.tensor()?;
    let at = match inputs.get(2).copied().flatten() {
        Some(p) => position(p, elements.len(), true)?,
        None => elements.len(),
    };
    elements.insert(at, Arc::clone(tensor));
    Ok(vec![Value::Sequence(elements)])
}

fn sequence_erase(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let mut elements = value_input(inputs, 0)?.sequence()?.to_vec();
    if elements.is_empty() {
        return Err("erasing from an empty sequence".into());
    }
    let at = match inputs.get(1).copied().flatten() {
        Some(p) => position(p, elements.len(), false)?,
        None => elements.len() - 1,
    };
    elements.remove(at);
    Ok(vec![Value::Sequence(elements)])
}

fn sequence_at(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let elements = value_input(inputs, 0)?.sequence()?;
    let at = position(value_input(inputs, 1)?, elements.len(), false)?;
    Ok(vec![Value::Tensor(Arc::clone(&elements[at]))])
}

fn sequence_length(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let len = value_input(inputs, 0)?.sequence()?.len();
    Ok(vec![scalar_i64(len as i64)])
}

/// SplitToSequence: chunks of `split` (a scalar: equal chunks, the last smaller; a list: those
/// sizes), or without it pieces of 1, squeezed unless `keepdims`.
fn split_to_sequence(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let ctx = &vctx.ctx;
    let x = value_input(inputs, 0)?.tensor()?;
    let axis = normalize_axis(ctx.int("axis", 0), x.rank())?;
    let n = x.shape()[axis];
    let split = inputs
        .get(1)
        .copied()
        .flatten()
        .map(Value::tensor)
        .transpose()?;
    let sizes: Vec<usize> = match split {
        None => vec![1; n],
        Some(s) if s.rank() == 0 => {
            let chunk = usize::try_from(s.to_i64_vec()[0])
                .ok()
                .filter(|&c| c > 0)
                .ok_or("the split size must be positive")?;
            (0..n.div_ceil(chunk))
                .map(|i| chunk.min(n - i * chunk))
                .collect()
        }
        Some(s) => s
            .to_i64_vec()
            .iter()
            .map(|&v| usize::try_from(v).map_err(|_| format!("negative split size {v}")))
            .collect::<Result<_>>()?,
    };
    if sizes.iter().sum::<usize>() != n {
        return Err(format!("split sizes {sizes:?} do not add up to {n}"));
    }
    let squeeze = split.is_none() && ctx.int("keepdims", 1) == 0;
    let mut start = 0;
    let mut elements = Vec::with_capacity(sizes.len());
    for len in sizes {
        let mut part = narrow(x, axis, start, len)?;
        start += len;
        if squeeze {
            let mut shape = part.shape().to_vec();
            shape.remove(axis);
            part = part.reshaped(shape)?;
        }
        elements.push(Arc::new(part));
    }
    Ok(vec![Value::Sequence(elements)])
}

/// ConcatFromSequence: the elements joined along `axis`, or stacked on a new one.
fn concat_from_sequence(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let ctx = &vctx.ctx;
    let elements = value_input(inputs, 0)?.sequence()?;
    let first = elements.first().ok_or("concatenating an empty sequence")?;
    let new_axis = ctx.int("new_axis", 0) != 0;
    let rank = first.rank() + usize::from(new_axis);
    let axis = normalize_axis(ctx.int("axis", 0), rank)?;
    let parts: Vec<HostTensor> = elements
        .iter()
        .map(|e| {
            let mut shape = e.shape().to_vec();
            if new_axis {
                shape.insert(axis, 1);
            }
            (**e).clone().reshaped(shape)
        })
        .collect::<Result<_>>()?;
    let total: usize = parts.iter().map(HostTensor::len).sum();
    if total > MAX_ELEMENTS {
        return Err(format!("the concatenation would hold {total} elements"));
    }
    let refs: Vec<&HostTensor> = parts.iter().collect();
    Ok(vec![Value::Tensor(Arc::new(concat_along(&refs, axis)?))])
}

fn optional(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let inner = inputs.first().copied().flatten().cloned().map(Box::new);
    Ok(vec![Value::Optional(inner)])
}

/// OptionalHasElement: false for an absent input or an empty optional, true otherwise (opset 18
/// takes plain tensors and sequences too).
fn optional_has_element(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let has = match inputs.first().copied().flatten() {
        None | Some(Value::Optional(None)) => false,
        Some(_) => true,
    };
    Ok(vec![Value::Tensor(Arc::new(HostTensor::with_data(
        vec![],
        TensorData::Bool(vec![has]),
    )))])
}

fn optional_get_element(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    match value_input(inputs, 0)? {
        Value::Optional(Some(inner)) => Ok(vec![(**inner).clone()]),
        Value::Optional(None) => Err("the optional is empty".into()),
        plain => Ok(vec![plain.clone()]),
    }
}

/// Identity of a sequence or optional (tensors take the tensor kernel).
fn identity(_: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    Ok(vec![value_input(inputs, 0)?.clone()])
}
