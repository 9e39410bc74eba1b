//! pipecut's own collective ops (domain `ai.pipecut`, see `docs/export.md`), which the
//! tensor-parallel rank files carry: an `AllReduce` keeps its input's type and shape, an
//! `AllGather` multiplies its axis by the group size, a `ReduceScatter` divides it.

use super::context::{normalize_axis, same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::Dim;

pub(super) fn register(r: &mut Registry) {
    r.add("ai.pipecut", &["AllReduce"], all_reduce);
    r.add("ai.pipecut", &["AllGather"], all_gather);
    r.add("ai.pipecut", &["ReduceScatter"], reduce_scatter);
}

fn all_reduce(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// `AllGather`: the input with its `axis` (default −1) `group_size` times longer.
fn all_gather(ctx: &OpCtx) -> RuleResult {
    let mut shape = ctx.shape(0)?.clone();
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, shape.len())?;
    let group = ctx.int_attr_or("group_size", 1)?;
    if group < 1 {
        return Err("group_size must be at least 1".into());
    }
    shape[axis] = shape[axis]
        .checked_mul(&Dim::Known(group as u64))
        .ok_or("the gathered axis overflows")?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

/// `ReduceScatter`: the input with its `axis` (default −1) `group_size` times shorter, which
/// it must divide; a symbolic length (a sequence bound only at run time) gets a fresh symbol,
/// as the kernel checks the division when the length is known.
fn reduce_scatter(ctx: &OpCtx) -> RuleResult {
    let mut shape = ctx.shape(0)?.clone();
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, shape.len())?;
    let group = ctx.int_attr_or("group_size", 1)?;
    if group < 1 {
        return Err("group_size must be at least 1".into());
    }
    shape[axis] = match (
        &shape[axis],
        shape[axis].exact_div(&Dim::Known(group as u64)),
    ) {
        (_, Some(piece)) => piece,
        (Dim::Sym(_), None) => ctx.data_dependent_dim(0, axis),
        (Dim::Known(size), None) => {
            return Err(format!(
                "axis {axis} of size {size} does not split {group} ways"
            ))
        }
    };
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}
