//! Control flow: `If`, `Loop`, `Scan` and `SequenceMap` run their subgraphs with the CPU
//! executor itself ([`ValueCtx::run_body`]), after the ONNX specification and reference
//! implementation (`onnx/reference/ops/op_if.py`, `op_loop.py`, `op_scan.py`,
//! `op_sequence_map.py`).

use std::sync::Arc;

use super::indexing::normalize_axis;
use super::movement::{concat_along, narrow};
use super::values::{value_input, ValueCtx, ValueKernelTable};
use crate::tensor::{HostTensor, TensorData};
use crate::value::Value;
use pipecut_ir::graph::{Attribute, DType, Subgraph};

type Result<T> = std::result::Result<T, String>;

pub(super) fn register(t: &mut ValueKernelTable) {
    t.add(&["If"], if_);
    t.add(&["Loop"], loop_);
    t.add(&["Scan"], scan);
    t.add(&["SequenceMap"], sequence_map);
}

fn subgraph<'a>(vctx: &ValueCtx<'a>, name: &str) -> Result<&'a Subgraph> {
    match vctx.ctx.node.attributes.get(name) {
        Some(Attribute::Graph(g)) => Ok(g),
        _ => Err(format!("attribute '{name}' (a subgraph) is missing")),
    }
}

/// The truth of a one-element tensor.
fn truth(value: &Value) -> Result<bool> {
    match value.tensor()?.to_i64_vec().as_slice() {
        [v] => Ok(*v != 0),
        other => Err(format!(
            "a condition must hold one element, it holds {}",
            other.len()
        )),
    }
}

fn tensor_value(t: HostTensor) -> Value {
    Value::Tensor(Arc::new(t))
}

/// Stacks equally shaped tensors on a new `axis`.
pub(crate) fn stack(parts: &[Arc<HostTensor>], axis: usize) -> Result<HostTensor> {
    let expanded: Vec<HostTensor> = parts
        .iter()
        .map(|p| {
            let mut shape = p.shape().to_vec();
            shape.insert(axis.min(shape.len()), 1);
            (**p).clone().reshaped(shape)
        })
        .collect::<Result<_>>()?;
    let refs: Vec<&HostTensor> = expanded.iter().collect();
    concat_along(&refs, axis)
}

/// An empty scan output (no iteration ran): nothing tells its element shape, so `[0]`.
pub(crate) fn empty_of(dtype: Option<DType>) -> HostTensor {
    let data = match dtype.map(crate::tensor::runtime_dtype) {
        Some(DType::I64) => TensorData::I64(Vec::new()),
        Some(DType::I32) => TensorData::I32(Vec::new()),
        Some(DType::Bool) => TensorData::Bool(Vec::new()),
        Some(DType::U8) => TensorData::U8(Vec::new()),
        Some(DType::I8) => TensorData::I8(Vec::new()),
        _ => TensorData::F32(Vec::new()),
    };
    HostTensor::with_data(vec![0], data)
}

fn if_(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let branch = if truth(value_input(inputs, 0)?)? {
        "then_branch"
    } else {
        "else_branch"
    };
    (vctx.run_body)(subgraph(vctx, branch)?, &[])
}

/// Loop: runs while the condition holds (absent: always; the body's then ignored) and fewer
/// than `M` iterations ran (absent: no limit). Scan outputs stack the body's per iteration.
fn loop_(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let body = subgraph(vctx, "body")?;
    let trip_count = match inputs.first().copied().flatten() {
        Some(m) => match m.tensor()?.to_i64_vec().as_slice() {
            [m] => Some(*m),
            _ => return Err("the trip count must hold one element".into()),
        },
        None => None,
    };
    let cond_given = inputs.get(1).copied().flatten();
    let mut cond = cond_given.map(truth).transpose()?.unwrap_or(true);
    let mut carried: Vec<Value> = inputs
        .iter()
        .skip(2)
        .map(|v| {
            v.cloned()
                .ok_or_else(|| "a loop-carried input is missing".to_string())
        })
        .collect::<Result<_>>()?;
    let scan_count = body.body.outputs().len().saturating_sub(1 + carried.len());
    let mut scans: Vec<Vec<Arc<HostTensor>>> = vec![Vec::new(); scan_count];
    let mut iteration = 0i64;
    while cond && trip_count.is_none_or(|m| iteration < m) {
        let mut formals = vec![
            tensor_value(HostTensor::i64(vec![], vec![iteration])),
            tensor_value(HostTensor::with_data(vec![], TensorData::Bool(vec![cond]))),
        ];
        formals.extend(carried.iter().cloned());
        let mut outputs = (vctx.run_body)(body, &formals)?.into_iter();
        let cond_out = outputs.next().ok_or("the body gives no condition")?;
        if cond_given.is_some() {
            cond = truth(&cond_out)?;
        }
        for slot in carried.iter_mut() {
            *slot = outputs.next().ok_or("the body gives too few outputs")?;
        }
        for scan in scans.iter_mut() {
            let out = outputs.next().ok_or("the body gives too few outputs")?;
            scan.push(Arc::clone(out.tensor()?));
        }
        iteration += 1;
    }
    let dtypes = vctx.ctx.output_dtypes;
    let mut results = carried;
    for (k, scan) in scans.iter().enumerate() {
        let stacked = if scan.is_empty() {
            empty_of(dtypes.get(results.len() + k).copied().flatten())
        } else {
            stack(scan, 0)?
        };
        results.push(tensor_value(stacked));
    }
    Ok(results)
}

/// Scan (opset 9 on): states carried through the iterations, scanned inputs sliced along their
/// scan axes (in their directions), scan outputs stacked along theirs. Scan-8 has a batch axis
/// 0 on every input and output, scanned one batch entry at a time.
fn scan(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    if vctx.ctx.opset >= 9 {
        let tensors: Vec<Arc<HostTensor>> = inputs
            .iter()
            .map(|v| v.ok_or("a Scan input is missing")?.tensor().cloned())
            .collect::<Result<_>>()?;
        return Ok(scan_once(vctx, &tensors)?
            .into_iter()
            .map(tensor_value)
            .collect());
    }
    if inputs.first().copied().flatten().is_some() {
        return Err("Scan-8 with sequence_lens is not supported".into());
    }
    let tensors: Vec<Arc<HostTensor>> = inputs[1..]
        .iter()
        .map(|v| v.ok_or("a Scan input is missing")?.tensor().cloned())
        .collect::<Result<_>>()?;
    let batch = tensors
        .first()
        .map_or(0, |t| t.shape().first().copied().unwrap_or(0));
    let mut per_output: Vec<Vec<Arc<HostTensor>>> = Vec::new();
    for b in 0..batch {
        let entry: Vec<Arc<HostTensor>> = tensors
            .iter()
            .map(|t| {
                let slice = narrow(t, 0, b, 1)?;
                let shape = slice.shape()[1..].to_vec();
                slice.reshaped(shape).map(Arc::new)
            })
            .collect::<Result<_>>()?;
        let outputs = scan_once(vctx, &entry)?;
        per_output.resize(outputs.len(), Vec::new());
        for (k, out) in outputs.into_iter().enumerate() {
            per_output[k].push(Arc::new(out));
        }
    }
    per_output
        .iter()
        .map(|parts| stack(parts, 0).map(tensor_value))
        .collect()
}

/// One Scan over `tensors` (states, then scanned inputs): the final states, then the scan
/// outputs.
fn scan_once(vctx: &ValueCtx, tensors: &[Arc<HostTensor>]) -> Result<Vec<HostTensor>> {
    let ctx = &vctx.ctx;
    let body = subgraph(vctx, "body")?;
    let scan_inputs = usize::try_from(ctx.int("num_scan_inputs", 0))
        .map_err(|_| "num_scan_inputs is negative")?;
    let states = tensors
        .len()
        .checked_sub(scan_inputs)
        .ok_or("fewer inputs than num_scan_inputs")?;
    let input_axes = ctx.ints("scan_input_axes").unwrap_or_default();
    let input_reverse = ctx.ints("scan_input_directions").unwrap_or_default();
    let output_axes = ctx.ints("scan_output_axes").unwrap_or_default();
    let output_reverse = ctx.ints("scan_output_directions").unwrap_or_default();
    let scanned: Vec<(&HostTensor, usize, bool)> = tensors[states..]
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let axis = normalize_axis(input_axes.get(j).copied().unwrap_or(0), t.rank())?;
            Ok((&**t, axis, input_reverse.get(j) == Some(&1)))
        })
        .collect::<Result<_>>()?;
    let length = scanned.first().map_or(0, |(t, axis, _)| t.shape()[*axis]);
    let mut carried: Vec<Value> = tensors[..states]
        .iter()
        .map(|t| Value::Tensor(Arc::clone(t)))
        .collect();
    let scan_count = body.body.outputs().len().saturating_sub(states);
    let mut outputs: Vec<Vec<Arc<HostTensor>>> = vec![Vec::new(); scan_count];
    for step in 0..length {
        let mut formals = carried.clone();
        for &(t, axis, reverse) in &scanned {
            if t.shape()[axis] != length {
                return Err(format!(
                    "scanned inputs have different lengths ({} and {length})",
                    t.shape()[axis]
                ));
            }
            let index = if reverse { length - 1 - step } else { step };
            let slice = narrow(t, axis, index, 1)?;
            let mut shape = slice.shape().to_vec();
            shape.remove(axis);
            formals.push(tensor_value(slice.reshaped(shape)?));
        }
        let mut results = (vctx.run_body)(body, &formals)?.into_iter();
        for slot in carried.iter_mut() {
            *slot = results.next().ok_or("the body gives too few outputs")?;
        }
        for out in outputs.iter_mut() {
            let value = results.next().ok_or("the body gives too few outputs")?;
            out.push(Arc::clone(value.tensor()?));
        }
    }
    let mut finals: Vec<HostTensor> = carried
        .iter()
        .map(|v| v.tensor().map(|t| (**t).clone()))
        .collect::<Result<_>>()?;
    for (k, mut parts) in outputs.into_iter().enumerate() {
        if output_reverse.get(k) == Some(&1) {
            parts.reverse();
        }
        let rank = parts.first().map_or(0, |p| p.rank()) + 1;
        let axis = normalize_axis(output_axes.get(k).copied().unwrap_or(0), rank)?;
        finals.push(if parts.is_empty() {
            empty_of(None)
        } else {
            stack(&parts, axis)?
        });
    }
    Ok(finals)
}

/// SequenceMap: the body once per element of the first input; sequence inputs give their
/// element at that position, tensor inputs themselves; each output collects a sequence.
fn sequence_map(vctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let body = subgraph(vctx, "body")?;
    let length = value_input(inputs, 0)?.sequence()?.len();
    let mut sequences: Vec<Vec<Arc<HostTensor>>> = vec![Vec::new(); body.body.outputs().len()];
    for i in 0..length {
        let formals: Vec<Value> = inputs
            .iter()
            .map(|v| match v.ok_or("a SequenceMap input is missing")? {
                Value::Sequence(s) => s
                    .get(i)
                    .map(|t| Value::Tensor(Arc::clone(t)))
                    .ok_or_else(|| format!("a sequence input has fewer than {length} elements")),
                other => Ok(other.clone()),
            })
            .collect::<Result<_>>()?;
        for (k, out) in (vctx.run_body)(body, &formals)?.into_iter().enumerate() {
            sequences[k].push(Arc::clone(out.tensor()?));
        }
    }
    Ok(sequences.into_iter().map(Value::Sequence).collect())
}
