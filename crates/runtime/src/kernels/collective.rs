//! `ai.pipecut` `AllReduce` (the sum of a tensor over the ranks of a tensor-parallel group) and
//! `AllGather` (their tensors concatenated along an axis) and `ReduceScatter` (the sum, each rank
//! keeping its piece of an axis),
//! each rank a thread of [`crate::tensor_parallel`] or a process of a distributed run; the group
//! the running rank belongs to is found in `rank_group.rs`.

use super::context::{Ctx, KernelResult, KernelTable};
use crate::rank_group;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add_in("ai.pipecut", &["AllReduce"], all_reduce);
    t.add_in("ai.pipecut", &["AllGather"], all_gather);
    t.add_in("ai.pipecut", &["ReduceScatter"], reduce_scatter);
}

fn all_reduce(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, group_size) = input_and_group(ctx, inputs)?;
    Ok(vec![rank_group::all_reduce(x, group_size)?])
}

fn all_gather(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, group_size) = input_and_group(ctx, inputs)?;
    Ok(vec![rank_group::all_gather(x, group_size, axis(ctx))?])
}

fn reduce_scatter(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, group_size) = input_and_group(ctx, inputs)?;
    Ok(vec![rank_group::reduce_scatter(x, group_size, axis(ctx))?])
}

/// The `axis` attribute, −1 when absent.
fn axis(ctx: &Ctx) -> i64 {
    match ctx.node.attributes.get("axis") {
        Some(pipecut_ir::graph::Attribute::Int(a)) => *a,
        _ => -1,
    }
}

fn input_and_group<'a>(
    ctx: &Ctx,
    inputs: &[Option<&'a HostTensor>],
) -> Result<(&'a HostTensor, usize), String> {
    let op = &ctx.node.op_type;
    let x = inputs
        .first()
        .copied()
        .flatten()
        .ok_or_else(|| format!("{op} needs its input"))?;
    match ctx.node.attributes.get("group_size") {
        Some(pipecut_ir::graph::Attribute::Int(n)) if *n >= 1 => Ok((x, *n as usize)),
        _ => Err(format!("{op} needs a group_size attribute of at least 1")),
    }
}
