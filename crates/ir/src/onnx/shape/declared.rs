//! Control flow typed from the model's declarations of its subgraphs' outputs: what the rules
//! of [`super::control`] fall back to where a body cannot be inferred (an op inside without a
//! shape rule), as pipecut typed control flow before it inferred bodies.

use super::context::{Inferred, OpCtx, RuleResult};
use crate::graph::{Attribute, Dim, Shape, Subgraph};

/// The subgraph attribute `name` of the node.
pub(super) fn subgraph<'a>(ctx: &OpCtx<'a>, name: &str) -> Result<&'a Subgraph, String> {
    match ctx.attr(name) {
        Some(Attribute::Graph(g)) => Ok(g),
        _ => Err(format!("attribute '{name}' (a subgraph) is missing")),
    }
}

/// The declared type of subgraph output `index`, or an error saying the model does not declare it.
fn declared(
    ctx: &OpCtx,
    graph: &Subgraph,
    index: usize,
    output: usize,
) -> Result<Inferred, String> {
    let (name, dtype, shape) = graph
        .outputs
        .get(index)
        .ok_or_else(|| format!("subgraph '{}' has no output {index}", graph.name))?;
    let dtype = dtype
        .ok_or_else(|| format!("subgraph output '{name}' does not declare its element type"))?;
    let shape = shape
        .clone()
        .ok_or_else(|| format!("subgraph output '{name}' does not declare its shape"))?;
    // Names of unnamed subgraph dims are local to the subgraph; make them the node's own.
    let shape = shape
        .into_iter()
        .enumerate()
        .map(|(axis, d)| match d {
            Dim::Sym(s) if s.symbols().any(|n| n.starts_with(name.as_str())) => {
                ctx.data_dependent_dim(output, axis)
            }
            d => d,
        })
        .collect();
    Ok(Inferred::new(dtype, shape))
}

/// If: both branches must produce the same types; where their dims differ the output dim
/// depends on the condition.
pub(super) fn if_declared(ctx: &OpCtx) -> RuleResult {
    let (then, other) = (subgraph(ctx, "then_branch")?, subgraph(ctx, "else_branch")?);
    (0..then.outputs.len())
        .map(|i| {
            let a = declared(ctx, then, i, i)?;
            let b = declared(ctx, other, i, i).ok();
            let shape: Shape = match b {
                Some(b) if b.shape.len() == a.shape.len() => a
                    .shape
                    .iter()
                    .zip(&b.shape)
                    .enumerate()
                    .map(|(axis, (x, y))| {
                        if x == y {
                            x.clone()
                        } else {
                            ctx.data_dependent_dim(i, axis)
                        }
                    })
                    .collect(),
                Some(_) => return Err(format!("branches of If give output {i} different ranks")),
                None => a.shape.clone(),
            };
            Ok(Inferred::new(a.dtype, shape))
        })
        .collect()
}

/// Loop: body outputs are (cond, carried…, scan…); node outputs are (carried…, scan…), where
/// scan outputs gain a leading iteration axis whose length depends on the run. A carried output
/// has the type of its initial value (input 2 + k), as onnxruntime's inference gives it: the
/// body's declared dims are local names (or absent) that a user could not bind.
pub(super) fn loop_declared(ctx: &OpCtx) -> RuleResult {
    let body = subgraph(ctx, "body")?;
    let carried = ctx.input_count().saturating_sub(2);
    (1..body.outputs.len())
        .map(|i| {
            let out = i - 1;
            if out < carried {
                if let Some(initial) = ctx.opt_input(2 + out) {
                    return Ok(Inferred::new(initial.dtype, initial.shape.clone()));
                }
            }
            let mut t = declared(ctx, body, i, out)?;
            if out >= carried {
                t.shape.insert(0, ctx.data_dependent_dim(out, 0));
            }
            Ok(t)
        })
        .collect()
}

/// Where a Scan node's inputs are: Scan-8 (opset 8) has an optional `sequence_lens` input
/// first and a batch axis 0 on every input and output; then the states, then the scanned inputs.
pub(super) struct ScanLayout {
    /// `num_scan_inputs`.
    pub scan_inputs: usize,
    /// Whether this is Scan-8, with its batch axis.
    pub batched: bool,
    /// The input position of the first state.
    pub first_state: usize,
    /// How many states.
    pub states: usize,
}

impl ScanLayout {
    pub fn of(ctx: &OpCtx) -> Result<ScanLayout, String> {
        let scan_inputs = ctx
            .int_attr("num_scan_inputs")?
            .ok_or("attribute 'num_scan_inputs' is missing")? as usize;
        let batched = ctx.opset < 9;
        let first_state = usize::from(batched);
        let states = ctx
            .input_count()
            .saturating_sub(scan_inputs)
            .saturating_sub(first_state);
        Ok(ScanLayout {
            scan_inputs,
            batched,
            first_state,
            states,
        })
    }
}

/// Scan: state outputs as declared; scan outputs gain the scanned axis, whose length is the
/// length of the first scanned input's scan axis (axis 0 by default). Scan-8 (opsets 8) has an
/// optional `sequence_lens` input first and a batch axis 0 on every input and output, which the
/// body does not see: states gain the batch axis, scan outputs the batch and scanned axes.
pub(super) fn scan_declared(ctx: &OpCtx) -> RuleResult {
    let body = subgraph(ctx, "body")?;
    let ScanLayout {
        batched,
        first_state,
        states,
        ..
    } = ScanLayout::of(ctx)?;
    let first_scanned_input = first_state + states;
    let scan_axis = usize::from(batched);
    let first_scanned = ctx
        .shape(first_scanned_input)
        .ok()
        .and_then(|s| s.get(scan_axis).cloned());
    let batch = ctx.shape(first_state).ok().and_then(|s| s.first().cloned());
    (0..body.outputs.len())
        .map(|i| {
            let mut t = declared(ctx, body, i, i)?;
            if i >= states {
                t.shape.insert(
                    0,
                    first_scanned
                        .clone()
                        .unwrap_or_else(|| ctx.data_dependent_dim(i, 0)),
                );
            }
            if batched {
                t.shape.insert(
                    0,
                    batch
                        .clone()
                        .unwrap_or_else(|| ctx.data_dependent_dim(i, 0)),
                );
            }
            Ok(t)
        })
        .collect()
}
