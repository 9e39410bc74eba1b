//! Steps that read only weights, run once when the CPU backend prepares a stage or a subgraph,
//! as onnxruntime folds constants when a session starts. Exporters leave such chains in the
//! graph: silero-vad's LSTM reorders its gates with twelve Slices and four Concats of `W` and
//! `R`, and its STFT computes its pads from Constants through eight nodes, all on every call.
//! A streaming model that runs one short chunk per call paid for them more than for its maths.
//!
//! A step folds when its kernel is a tensor kernel, every input is a weight or a folded
//! step's output, it holds no subgraph, it draws no random numbers, and its outputs are not
//! much larger than its inputs (an Expand of a scalar to a large shape stays a step, so a
//! prepared stage does not hold more memory than a run would). A step whose kernel fails stays
//! a step too: it fails when the stage runs, as it did before. The folded steps' outputs that
//! the remaining steps read, or that the stage sends, are kept; the rest are dropped. Folding
//! runs the same kernel on the same inputs, so outputs are bit for bit those of an unfolded
//! run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::cpu::CpuKernel;
use super::kernels::{Ctx, Kernel};
use super::steps::Step;
use super::tensor::HostTensor;
use super::value::Value;
use super::{StageSpec, Weights};
use pipecut_ir::graph::{Graph, NodeId, TensorId};

/// Ops whose outputs are draws, not functions of their inputs.
const DRAWS: [&str; 6] = [
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
];

/// How much a folded step's outputs may exceed its inputs, in bytes.
const GROWTH_ALLOWANCE: usize = 64 * 1024;

/// What folding took out of a stage's steps.
#[derive(Debug, Default)]
pub(crate) struct ConstantSteps {
    /// The folded outputs the stage still reads or sends, to put in each run's values.
    pub values: Vec<(TensorId, Arc<HostTensor>)>,
    /// The folded nodes, in order, with the bytes of their outputs (`pipecut profile` reports
    /// them as taking no time).
    pub nodes: Vec<(NodeId, u64)>,
}

/// `steps` without the steps that read only weights (see the module doc), and what they made.
pub(crate) fn fold_constant_steps(
    graph: &Graph,
    weights: &Weights,
    spec: &StageSpec,
    steps: Vec<Step<CpuKernel>>,
) -> (Vec<Step<CpuKernel>>, ConstantSteps) {
    let mut made: HashMap<TensorId, Arc<HostTensor>> = HashMap::new();
    let mut folded = ConstantSteps::default();
    let mut kept = Vec::with_capacity(steps.len());
    for step in steps {
        let known = |id: &TensorId| made.get(id).or_else(|| weights.get(*id)).cloned();
        match run_if_constant(graph, &step, known) {
            Some(outputs) => {
                let bytes = (outputs.iter())
                    .map(|(_, t)| Value::Tensor(Arc::clone(t)).byte_len())
                    .sum();
                made.extend(outputs);
                folded.nodes.push((step.node, bytes));
            }
            None => kept.push(step),
        }
    }
    let still_read: HashSet<TensorId> = kept
        .iter()
        .flat_map(|step| {
            let node = graph.node(step.node);
            node.inputs.iter().flatten().chain(&node.captures).copied()
        })
        .chain(spec.sends.iter().copied())
        .collect();
    folded.values = made
        .into_iter()
        .filter(|(id, _)| still_read.contains(id))
        .collect();
    (kept, folded)
}

/// The outputs of `step`, by tensor, if it is foldable: `known` gives the value of a weight or
/// of an earlier folded step's output.
fn run_if_constant(
    graph: &Graph,
    step: &Step<CpuKernel>,
    known: impl Fn(&TensorId) -> Option<Arc<HostTensor>>,
) -> Option<Vec<(TensorId, Arc<HostTensor>)>> {
    let node = graph.node(step.node);
    let kernel: Kernel = match step.kernel {
        CpuKernel::Tensor(kernel) => kernel,
        _ => return None,
    };
    if node.has_subgraphs()
        || !node.captures.is_empty()
        || DRAWS.contains(&node.op_type.as_str())
        || node.inputs.iter().flatten().next().is_none()
    {
        return None;
    }
    let inputs: Vec<Option<Arc<HostTensor>>> = node
        .inputs
        .iter()
        .map(|slot| match slot {
            None => Some(None),
            Some(id) => known(id).map(Some),
        })
        .collect::<Option<_>>()?;
    let input_bytes: usize = inputs.iter().flatten().map(|t| t.data().byte_size()).sum();
    let ctx = Ctx {
        node,
        opset: step.opset,
        output_dtypes: &step.output_dtypes,
        input_dtypes: &step.input_dtypes,
    };
    let refs: Vec<Option<&HostTensor>> = inputs.iter().map(Option::as_deref).collect();
    let results = super::kernels::call(kernel, &ctx, &refs).ok()?;
    let output_bytes: usize = results.iter().map(|t| t.data().byte_size()).sum();
    let wanted = node
        .outputs
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |p| p + 1);
    if output_bytes > input_bytes.saturating_add(GROWTH_ALLOWANCE) || results.len() < wanted {
        return None;
    }
    Some(
        node.outputs
            .iter()
            .zip(results)
            .filter_map(|(slot, tensor)| slot.map(|id| (id, Arc::new(tensor))))
            .collect(),
    )
}
