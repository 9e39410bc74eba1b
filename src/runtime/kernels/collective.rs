//! `ai.pipecut` `AllReduce`: the sum of a tensor over the ranks of a tensor-parallel group,
//! each rank a thread of [`crate::runtime::tensor_parallel`]; the group the running thread
//! belongs to is found there.

use super::{Ctx, KernelResult, KernelTable};
use crate::runtime::tensor::HostTensor;
use crate::runtime::tensor_parallel;

pub(super) fn register(t: &mut KernelTable) {
    t.add_in("ai.pipecut", &["AllReduce"], all_reduce);
}

fn all_reduce(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = inputs
        .first()
        .copied()
        .flatten()
        .ok_or("AllReduce needs its input")?;
    let group_size = match ctx.node.attributes.get("group_size") {
        Some(crate::graph::Attribute::Int(n)) if *n >= 1 => *n as usize,
        _ => return Err("AllReduce needs a group_size attribute of at least 1".into()),
    };
    Ok(vec![tensor_parallel::all_reduce(x, group_size)?])
}
