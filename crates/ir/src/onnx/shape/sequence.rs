//! Sequences and optionals (<https://onnx.ai/onnx/operators/onnx__SequenceInsert.html>,
//! `SplitToSequence`, `Optional`, ...). A sequence's type is its elements' dtype and the shape
//! they share: a dim the elements disagree on is a fresh symbol, and elements of different
//! ranks (or an empty sequence) leave the shape unknown.

use super::context::{normalize_axis, Inferred, Input, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{Attribute, ConstValue, DType, Dim, Shape, SymInt, ValueKind};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["SequenceEmpty"], sequence_empty);
    r.add("", &["SequenceConstruct"], sequence_construct);
    r.add("", &["SequenceInsert"], sequence_insert);
    r.add("", &["SequenceErase"], sequence_erase);
    r.add("", &["SequenceAt"], sequence_at);
    r.add("", &["SequenceLength"], sequence_length);
    r.add("", &["SplitToSequence"], split_to_sequence);
    r.add("", &["ConcatFromSequence"], concat_from_sequence);
    r.add("", &["Optional"], optional);
    r.add("", &["OptionalHasElement"], optional_has_element);
    r.add("", &["OptionalGetElement"], optional_get_element);
}

/// Whether an op takes sequences or optionals as inputs; other ops take tensors only.
pub(super) fn takes_values(domain: &str, op: &str) -> bool {
    domain.is_empty()
        && (op.starts_with("Sequence")
            || op.starts_with("Optional")
            || matches!(
                op,
                "ConcatFromSequence" | "Identity" | "If" | "Loop" | "Scan" | "SequenceMap"
            ))
}

/// The shape elements of both shapes fit: equal dims stay, differing dims become fresh symbols
/// named after the node's output; different ranks (or an unknown side) give `None`.
pub(super) fn merge_shapes(
    ctx: &OpCtx,
    output: usize,
    a: Option<&Shape>,
    b: Option<&Shape>,
) -> Option<Shape> {
    let (a, b) = (a?, b?);
    (a.len() == b.len()).then(|| {
        a.iter()
            .zip(b)
            .enumerate()
            .map(|(axis, (x, y))| {
                if x == y {
                    x.clone()
                } else {
                    ctx.data_dependent_dim(output, axis)
                }
            })
            .collect()
    })
}

fn expect_kind(input: &Input, want: ValueKind, i: usize) -> Result<(), String> {
    if input.kind == want {
        Ok(())
    } else {
        Err(format!(
            "input {i} ('{}') is a {}, not a {want}",
            input.name, input.kind
        ))
    }
}

fn sequence_empty(ctx: &OpCtx) -> RuleResult {
    let dtype = match ctx.int_attr("dtype")? {
        Some(code) => {
            DType::from_onnx(code as i32).ok_or_else(|| format!("unknown dtype code {code}"))?
        }
        None => DType::F32,
    };
    Ok(vec![Inferred::of_kind(ValueKind::Sequence, dtype, None)])
}

fn sequence_construct(ctx: &OpCtx) -> RuleResult {
    let first = ctx.input(0)?;
    let mut shape = first.known_shape().cloned();
    for i in 1..ctx.input_count() {
        let next = ctx.input(i)?;
        if next.dtype != first.dtype {
            return Err(format!(
                "input {i} is {} but input 0 is {}",
                next.dtype, first.dtype
            ));
        }
        shape = merge_shapes(ctx, 0, shape.as_ref(), next.known_shape());
    }
    Ok(vec![Inferred::of_kind(
        ValueKind::Sequence,
        first.dtype,
        shape,
    )])
}

fn sequence_insert(ctx: &OpCtx) -> RuleResult {
    let (sequence, tensor) = (ctx.input(0)?, ctx.input(1)?);
    expect_kind(sequence, ValueKind::Sequence, 0)?;
    if sequence.dtype != tensor.dtype {
        return Err(format!(
            "inserting a {} tensor into a sequence of {}",
            tensor.dtype, sequence.dtype
        ));
    }
    let shape = merge_shapes(ctx, 0, sequence.known_shape(), tensor.known_shape());
    Ok(vec![Inferred::of_kind(
        ValueKind::Sequence,
        sequence.dtype,
        shape,
    )])
}

fn sequence_erase(ctx: &OpCtx) -> RuleResult {
    let sequence = ctx.input(0)?;
    expect_kind(sequence, ValueKind::Sequence, 0)?;
    Ok(vec![Inferred::of_kind(
        ValueKind::Sequence,
        sequence.dtype,
        sequence.known_shape().cloned(),
    )])
}

fn sequence_at(ctx: &OpCtx) -> RuleResult {
    let sequence = ctx.input(0)?;
    expect_kind(sequence, ValueKind::Sequence, 0)?;
    let shape = sequence.known_shape().ok_or_else(|| {
        format!(
            "the shape of the elements of sequence '{}' is not known",
            sequence.name
        )
    })?;
    Ok(vec![Inferred::new(sequence.dtype, shape.clone())])
}

fn sequence_length(ctx: &OpCtx) -> RuleResult {
    expect_kind(ctx.input(0)?, ValueKind::Sequence, 0)?;
    Ok(vec![Inferred::new(DType::I64, vec![])])
}

/// SplitToSequence: `split` a scalar (chunks of that size, the last one smaller), a list of
/// sizes, or absent (chunks of 1, the axis dropped unless `keepdims`).
fn split_to_sequence(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", 0)?, input.shape.len())?;
    let mut shape = input.shape.clone();
    let chunk = match ctx.opt_input(1) {
        None => {
            if ctx.int_attr_or("keepdims", 1)? == 0 {
                shape.remove(axis);
                return Ok(vec![Inferred::of_kind(
                    ValueKind::Sequence,
                    input.dtype,
                    Some(shape),
                )]);
            }
            Some(1)
        }
        Some(split) => match split.value.and_then(ConstValue::as_i64s) {
            Some(sizes) if split.shape.is_empty() => match (sizes.first(), &shape[axis]) {
                (Some(&c), Dim::Known(n)) if c > 0 && n % c as u64 == 0 => Some(c as u64),
                _ => None,
            },
            Some(sizes) if sizes.windows(2).all(|w| w[0] == w[1]) => {
                sizes.first().map(|&c| c as u64)
            }
            _ => None,
        },
    };
    shape[axis] = match chunk {
        Some(c) => Dim::Known(c),
        None => ctx.data_dependent_dim(0, axis),
    };
    Ok(vec![Inferred::of_kind(
        ValueKind::Sequence,
        input.dtype,
        Some(shape),
    )])
}

/// ConcatFromSequence: the concatenated axis (or the new one) has the sequence's length,
/// which depends on the run.
fn concat_from_sequence(ctx: &OpCtx) -> RuleResult {
    let sequence = ctx.input(0)?;
    expect_kind(sequence, ValueKind::Sequence, 0)?;
    let element = sequence.known_shape().ok_or_else(|| {
        format!(
            "the shape of the elements of sequence '{}' is not known",
            sequence.name
        )
    })?;
    let new_axis = ctx.int_attr_or("new_axis", 0)? != 0;
    let rank = element.len() + usize::from(new_axis);
    let axis = normalize_axis(
        ctx.int_attr("axis")?.ok_or("attribute 'axis' is missing")?,
        rank,
    )?;
    let mut shape = element.clone();
    if new_axis {
        shape.insert(axis, ctx.data_dependent_dim(0, axis));
    } else {
        shape[axis] = ctx.data_dependent_dim(0, axis);
    }
    Ok(vec![Inferred::new(sequence.dtype, shape)])
}

/// Optional: wraps its input, or, without one, is an empty optional of the `type` attribute.
fn optional(ctx: &OpCtx) -> RuleResult {
    if let Some(input) = ctx.opt_input(0) {
        return Ok(vec![Inferred::of_kind(
            input.kind.optional(),
            input.dtype,
            input.known_shape().cloned(),
        )]);
    }
    match ctx.attr("type") {
        Some(Attribute::Type(kind, Some(dtype), shape)) => Ok(vec![Inferred::of_kind(
            kind.optional(),
            *dtype,
            shape.clone(),
        )]),
        _ => {
            Err("an Optional without an input needs a 'type' attribute with an element type".into())
        }
    }
}

/// OptionalHasElement: known at plan time when there is no input (false) or a plain tensor or
/// sequence (true).
fn optional_has_element(ctx: &OpCtx) -> RuleResult {
    let known = match ctx.opt_input(0) {
        None => Some(false),
        Some(input) if input.kind.is_tensor() || input.kind == ValueKind::Sequence => Some(true),
        Some(_) => None,
    };
    let value = known.map(|b| ConstValue::Ints(vec![SymInt::Lit(i64::from(b))]));
    Ok(vec![Inferred::new(DType::Bool, vec![]).with_value(value)])
}

fn optional_get_element(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let kind = input.kind.unwrap_optional();
    let shape = input.known_shape().cloned();
    if kind.is_tensor() && shape.is_none() {
        return Err(format!(
            "the shape of the tensor optional '{}' holds is not known",
            input.name
        ));
    }
    Ok(vec![Inferred::of_kind(kind, input.dtype, shape)
        .with_value(
            input.value.cloned().filter(|_| kind.is_tensor()),
        )])
}
