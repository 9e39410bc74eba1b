//! Control flow and optionals on the CUDA backend: `If`, `Loop` and `Scan` run their subgraphs
//! with the CUDA executor itself (the executor supplies [`RunBody`]), after the CPU kernels of
//! `kernels/control.rs` and `kernels/sequence.rs`.
//!
//! ```text
//! condition, trip count ── read on the host (one small download when a device op made them)
//! body                  ── the stage's own executor: device tensors in, device tensors out,
//!                          its nodes falling back to the host one by one, counted as any node
//! carried values        ── handed from one iteration to the next where they are
//! scan inputs / outputs ── sliced / stacked on the device (`gather_strided_f32`,
//!                          `copy_block_f32`); host tensors by the CPU's rules
//! ```

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::gpu::{contiguous_strides, cuda_error, numel, Gpu};
use super::value::{DeviceTensor, Value};
use crate::kernels::{empty_scan_output, narrow, normalize_axis, stack_host, Ctx};
use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::{Attribute, Subgraph};

type Result<T> = std::result::Result<T, String>;

/// Runs a subgraph on its declared inputs, giving its outputs where the body left them.
pub(super) type RunBody<'a> = dyn Fn(&Subgraph, &[Value]) -> Result<Vec<Value>> + 'a;

/// The ops the CUDA executor runs itself rather than through a tensor kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    If,
    Loop,
    Scan,
    Optional,
    OptionalHasElement,
    OptionalGetElement,
}

impl Flow {
    /// The flow op a node is, if it is one (default domain only).
    pub(super) fn of(domain: &str, op_type: &str) -> Option<Flow> {
        if !(domain.is_empty() || domain == "ai.onnx") {
            return None;
        }
        Some(match op_type {
            "If" => Flow::If,
            "Loop" => Flow::Loop,
            "Scan" => Flow::Scan,
            "Optional" => Flow::Optional,
            "OptionalHasElement" => Flow::OptionalHasElement,
            "OptionalGetElement" => Flow::OptionalGetElement,
            _ => return None,
        })
    }

    /// Runs the node: `args` by position (`None` for an omitted input).
    pub(super) fn run(
        self,
        gpu: &Gpu,
        ctx: &Ctx,
        args: &[Option<Value>],
        run_body: &RunBody,
    ) -> Result<Vec<Value>> {
        match self {
            Flow::If => if_(gpu, ctx, args, run_body),
            Flow::Loop => loop_(gpu, ctx, args, run_body),
            Flow::Scan => scan(gpu, ctx, args, run_body),
            Flow::Optional => Ok(vec![Value::Optional(
                args.first().cloned().flatten().map(Box::new),
            )]),
            Flow::OptionalHasElement => {
                let has = !matches!(
                    args.first().map(Option::as_ref),
                    None | Some(None) | Some(Some(Value::Optional(None)))
                );
                let flag = HostTensor::with_data(vec![], TensorData::Bool(vec![has]));
                Ok(vec![Value::host(Arc::new(flag))])
            }
            Flow::OptionalGetElement => match args.first().cloned().flatten() {
                Some(Value::Optional(Some(inner))) => Ok(vec![*inner]),
                Some(Value::Optional(None)) => Err("the optional is empty".into()),
                Some(plain) => Ok(vec![plain]),
                None => Err("input 0 is missing".into()),
            },
        }
    }
}

fn subgraph<'a>(ctx: &Ctx<'a>, name: &str) -> Result<&'a Subgraph> {
    match ctx.node.attributes.get(name) {
        Some(Attribute::Graph(g)) => Ok(g),
        _ => Err(format!("attribute '{name}' (a subgraph) is missing")),
    }
}

/// The truth of a one-element tensor, read on the host (a device condition is downloaded:
/// one element).
fn truth(gpu: &Gpu, value: &Value) -> Result<bool> {
    match value.to_host(gpu.stream)?.to_i64_vec().as_slice() {
        [v] => Ok(*v != 0),
        other => Err(format!(
            "a condition must hold one element, it holds {}",
            other.len()
        )),
    }
}

fn if_(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], run_body: &RunBody) -> Result<Vec<Value>> {
    let cond = args
        .first()
        .cloned()
        .flatten()
        .ok_or("input 0 is missing")?;
    let branch = if truth(gpu, &cond)? {
        "then_branch"
    } else {
        "else_branch"
    };
    run_body(subgraph(ctx, branch)?, &[])
}

/// Loop: runs while the condition holds (absent: always; the body's then ignored) and fewer
/// than `M` iterations ran (absent: no limit). Carried values go from one iteration to the next
/// where the body left them; scan outputs are stacked at the end (on the device when every
/// iteration left its part there).
fn loop_(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], run_body: &RunBody) -> Result<Vec<Value>> {
    let body = subgraph(ctx, "body")?;
    let trip_count = match args.first().cloned().flatten() {
        Some(m) => match m.to_host(gpu.stream)?.to_i64_vec().as_slice() {
            [m] => Some(*m),
            _ => return Err("the trip count must hold one element".into()),
        },
        None => None,
    };
    let cond_given = args.get(1).cloned().flatten();
    let mut cond = cond_given
        .as_ref()
        .map(|c| truth(gpu, c))
        .transpose()?
        .unwrap_or(true);
    let mut carried: Vec<Value> = args
        .iter()
        .skip(2)
        .map(|v| {
            v.clone()
                .ok_or_else(|| "a loop-carried input is missing".to_string())
        })
        .collect::<Result<_>>()?;
    let scan_count = body.body.outputs().len().saturating_sub(1 + carried.len());
    let mut scans: Vec<Vec<Value>> = vec![Vec::new(); scan_count];
    let mut iteration = 0i64;
    while cond && trip_count.is_none_or(|m| iteration < m) {
        let mut formals = vec![
            Value::host(Arc::new(HostTensor::i64(vec![], vec![iteration]))),
            Value::host(Arc::new(HostTensor::with_data(
                vec![],
                TensorData::Bool(vec![cond]),
            ))),
        ];
        formals.extend(carried.iter().cloned());
        let mut outputs = run_body(body, &formals)?.into_iter();
        let cond_out = outputs.next().ok_or("the body gives no condition")?;
        if cond_given.is_some() {
            cond = truth(gpu, &cond_out)?;
        }
        for slot in carried.iter_mut() {
            *slot = outputs.next().ok_or("the body gives too few outputs")?;
        }
        for scan in scans.iter_mut() {
            scan.push(outputs.next().ok_or("the body gives too few outputs")?);
        }
        iteration += 1;
    }
    let mut results = carried;
    for (k, parts) in scans.iter().enumerate() {
        let stacked = if parts.is_empty() {
            let dtype = ctx.output_dtypes.get(results.len() + k).copied().flatten();
            Value::host(Arc::new(empty_scan_output(dtype)))
        } else {
            stack(gpu, parts, 0)?
        };
        results.push(stacked);
    }
    Ok(results)
}

/// Scan (opset 9 on): states carried through the iterations, scanned inputs sliced along their
/// scan axes (in their directions), scan outputs stacked along theirs. Scan-8 has a batch axis
/// 0 on every input and output, scanned one batch entry at a time.
fn scan(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], run_body: &RunBody) -> Result<Vec<Value>> {
    let required = |slots: &[Option<Value>]| -> Result<Vec<Value>> {
        slots
            .iter()
            .map(|v| {
                v.clone()
                    .ok_or_else(|| "a Scan input is missing".to_string())
            })
            .collect()
    };
    if ctx.opset >= 9 {
        return scan_once(gpu, ctx, &required(args)?, run_body);
    }
    if args.first().is_some_and(Option::is_some) {
        return Err("Scan-8 with sequence_lens is not supported".into());
    }
    let values = required(args.get(1..).unwrap_or_default())?;
    let batch = values
        .first()
        .map_or(0, |v| v.shape().first().copied().unwrap_or(0));
    let mut per_output: Vec<Vec<Value>> = Vec::new();
    for b in 0..batch {
        let entry: Vec<Value> = values
            .iter()
            .map(|v| select(gpu, v, 0, b))
            .collect::<Result<_>>()?;
        let outputs = scan_once(gpu, ctx, &entry, run_body)?;
        per_output.resize(outputs.len(), Vec::new());
        for (k, out) in outputs.into_iter().enumerate() {
            per_output[k].push(out);
        }
    }
    per_output
        .iter()
        .map(|parts| stack(gpu, parts, 0))
        .collect()
}

/// One Scan over `values` (states, then scanned inputs): the final states, then the scan
/// outputs.
fn scan_once(gpu: &Gpu, ctx: &Ctx, values: &[Value], run_body: &RunBody) -> Result<Vec<Value>> {
    let body = subgraph(ctx, "body")?;
    let scan_inputs = usize::try_from(ctx.int("num_scan_inputs", 0))
        .map_err(|_| "num_scan_inputs is negative")?;
    let states = values
        .len()
        .checked_sub(scan_inputs)
        .ok_or("fewer inputs than num_scan_inputs")?;
    let input_axes = ctx.ints("scan_input_axes").unwrap_or_default();
    let input_reverse = ctx.ints("scan_input_directions").unwrap_or_default();
    let output_axes = ctx.ints("scan_output_axes").unwrap_or_default();
    let output_reverse = ctx.ints("scan_output_directions").unwrap_or_default();
    let scanned: Vec<(&Value, usize, bool)> = values[states..]
        .iter()
        .enumerate()
        .map(|(j, v)| {
            let axis = normalize_axis(input_axes.get(j).copied().unwrap_or(0), v.shape().len())?;
            Ok((v, axis, input_reverse.get(j) == Some(&1)))
        })
        .collect::<Result<_>>()?;
    let length = scanned.first().map_or(0, |(v, axis, _)| v.shape()[*axis]);
    if let Some((v, axis, _)) = scanned.iter().find(|(v, a, _)| v.shape()[*a] != length) {
        return Err(format!(
            "scanned inputs have different lengths ({} and {length})",
            v.shape()[*axis]
        ));
    }
    let mut carried: Vec<Value> = values[..states].to_vec();
    let scan_count = body.body.outputs().len().saturating_sub(states);
    let mut outputs: Vec<Vec<Value>> = vec![Vec::new(); scan_count];
    for step in 0..length {
        let mut formals = carried.clone();
        for &(v, axis, reverse) in &scanned {
            let index = if reverse { length - 1 - step } else { step };
            formals.push(select(gpu, v, axis, index)?);
        }
        let mut results = run_body(body, &formals)?.into_iter();
        for slot in carried.iter_mut() {
            *slot = results.next().ok_or("the body gives too few outputs")?;
        }
        for out in outputs.iter_mut() {
            out.push(results.next().ok_or("the body gives too few outputs")?);
        }
    }
    let mut finals = carried;
    for (k, mut parts) in outputs.into_iter().enumerate() {
        if output_reverse.get(k) == Some(&1) {
            parts.reverse();
        }
        finals.push(match parts.first() {
            None => Value::host(Arc::new(empty_scan_output(None))),
            Some(first) => {
                let rank = first.shape().len() + 1;
                let axis = normalize_axis(output_axes.get(k).copied().unwrap_or(0), rank)?;
                stack(gpu, &parts, axis)?
            }
        });
    }
    Ok(finals)
}

/// Entry `index` of `axis` of a tensor, that axis dropped: a strided copy on the device for a
/// device tensor, the CPU's slice for a host one.
fn select(gpu: &Gpu, value: &Value, axis: usize, index: usize) -> Result<Value> {
    match value {
        Value::Device(t) => {
            let strides = contiguous_strides(&t.shape);
            let mut shape = t.shape.clone();
            let mut out_strides = strides.clone();
            shape.remove(axis);
            out_strides.remove(axis);
            let base = index as i64 * strides[axis];
            let data = gpu.gather_strided(&t.data, &shape, &out_strides, base)?;
            Ok(Value::Device(DeviceTensor {
                mask: t.mask,
                int: t.int,
                ..DeviceTensor::new(shape, data)
            }))
        }
        Value::Host(t, _) => {
            let slice = narrow(t, axis, index, 1)?;
            let mut shape = slice.shape().to_vec();
            shape.remove(axis);
            Ok(Value::host(Arc::new(slice.reshaped(shape)?)))
        }
        Value::Optional(_) => Err("a scanned input is an optional, not a tensor".into()),
    }
}

/// Equally shaped tensors stacked on a new `axis`: on the device when every part is a device
/// tensor of one kind (float or mask), each part copied into its columns of the result
/// (`copy_block_f32`); else on the host, as the CPU runtime stacks.
fn stack(gpu: &Gpu, parts: &[Value], axis: usize) -> Result<Value> {
    let device: Option<Vec<&DeviceTensor>> = parts
        .iter()
        .map(|p| match p {
            Value::Device(t) => Some(t),
            _ => None,
        })
        .collect();
    let Some(device) = device.filter(|d| !d.is_empty()) else {
        let host: Vec<Arc<HostTensor>> = parts
            .iter()
            .map(|p| p.to_host(gpu.stream))
            .collect::<Result<_>>()?;
        return Ok(Value::host(Arc::new(stack_host(&host, axis)?)));
    };
    let first = device[0];
    if let Some(other) = device
        .iter()
        .find(|t| t.shape != first.shape || t.mask != first.mask || t.int != first.int)
    {
        return Err(format!(
            "stacked parts differ: {:?} and {:?}",
            first.shape, other.shape
        ));
    }
    if axis > first.shape.len() {
        return Err(format!(
            "axis {axis} is past the parts' rank {}",
            first.shape.len()
        ));
    }
    let mut shape = first.shape.clone();
    shape.insert(axis, device.len());
    let outer = numel(&first.shape[..axis]);
    let in_inner = numel(&first.shape[axis..]);
    let out_inner = in_inner * device.len();
    let mut out = gpu.alloc(numel(&shape))?;
    for (k, part) in device.iter().enumerate() {
        let (o, i, oi, offset) = (
            outer as i64,
            in_inner as i64,
            out_inner as i64,
            (k * in_inner) as i64,
        );
        let mut launch = gpu.stream.launch_builder(&gpu.functions.copy_block);
        launch
            .arg(&*part.data)
            .arg(&mut out)
            .arg(&o)
            .arg(&i)
            .arg(&oi)
            .arg(&offset);
        // SAFETY: argument types match `copy_block_f32`; part k fills columns
        // k·in_inner..(k+1)·in_inner of each of the `outer` rows of `out`.
        unsafe { launch.launch(Gpu::grid(outer * in_inner)) }.map_err(cuda_error("launch"))?;
    }
    Ok(Value::Device(DeviceTensor {
        mask: first.mask,
        int: first.int,
        ..DeviceTensor::new(shape, out)
    }))
}
