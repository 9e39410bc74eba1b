//! pipecut's own collective ops (domain `ai.pipecut`, see `docs/export.md`), which the
//! tensor-parallel rank files carry: an `AllReduce` keeps its input's type and shape.

use super::context::{same_shape, OpCtx, RuleResult};
use super::registry::Registry;

pub(super) fn register(r: &mut Registry) {
    r.add("ai.pipecut", &["AllReduce"], all_reduce);
}

fn all_reduce(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}
