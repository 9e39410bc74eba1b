//! A stage as a list of steps: each node resolved to its kernel, with the tensors to free after
//! it. The CPU and CUDA backends plan their stages so (each with its own kernel type), and the
//! folds of `fuse.rs` rewrite the list.

use std::collections::{HashMap, HashSet};

use super::kernels::Kernel;
use super::StageSpec;
use crate::Error;
use pipecut_ir::graph::{DType, Graph, Node, NodeId, TensorId};

/// One node ready to run, with its kernel of type `K`.
#[derive(Debug)]
pub(crate) struct Step<K = Kernel> {
    pub node: NodeId,
    /// The CPU kernel (the CUDA backend's fallback for nodes its device ops leave).
    pub kernel: K,
    pub opset: i64,
    /// The inferred element type of each output slot (see [`crate::kernels::Ctx::output_dtypes`]).
    pub output_dtypes: Vec<Option<DType>>,
    /// The inferred element type of each input slot (see [`crate::kernels::Ctx::input_dtypes`]).
    pub input_dtypes: Vec<Option<DType>>,
    /// Tensors whose last reader in the stage is this node (and that the stage does not send).
    pub frees: Vec<TensorId>,
}

/// Resolves every node of a stage to its kernel of type `K` (`resolve`) and works out when each
/// intermediate tensor can be freed; refuses an op without a kernel, naming op and node.
pub(crate) fn plan_steps_with<K>(
    graph: &Graph,
    spec: &StageSpec,
    resolve: impl Fn(&Node) -> Option<K>,
) -> Result<Vec<Step<K>>, Error> {
    let sends: HashSet<TensorId> = spec.sends.iter().copied().collect();
    let mut last_use: HashMap<TensorId, usize> = HashMap::new();
    for (i, &n) in spec.nodes.iter().enumerate() {
        let node = graph.node(n);
        // A subgraph reads the outer tensors it captures when its node runs.
        for t in node.inputs.iter().flatten().chain(&node.captures) {
            last_use.insert(*t, i);
        }
    }
    let mut frees: Vec<Vec<TensorId>> = vec![Vec::new(); spec.nodes.len()];
    for (t, i) in last_use {
        if !sends.contains(&t) && graph.tensor(t).param().is_none() {
            frees[i].push(t);
        }
    }
    spec.nodes
        .iter()
        .zip(frees)
        .map(|(&n, frees)| {
            let node = graph.node(n);
            let domain = if node.domain.is_empty() {
                "ai.onnx"
            } else {
                &node.domain
            };
            let kernel = resolve(node).ok_or_else(|| Error::NoKernel {
                op: node.op_type.clone(),
                domain: domain.to_string(),
                node: node.name.clone(),
            })?;
            Ok(Step {
                node: n,
                kernel,
                opset: graph.opset(&node.domain).unwrap_or(0),
                output_dtypes: node
                    .outputs
                    .iter()
                    .map(|slot| slot.and_then(|id| graph.tensor(id).dtype))
                    .collect(),
                input_dtypes: node
                    .inputs
                    .iter()
                    .map(|slot| slot.and_then(|id| graph.tensor(id).dtype))
                    .collect(),
                frees,
            })
        })
        .collect()
}

/// Puts a step's results in the slots of its outputs (the CPU's values or the CUDA backend's);
/// an output slot the kernel gave nothing for is an error.
pub(crate) fn store_outputs<V>(
    env: &mut HashMap<TensorId, V>,
    output_slots: &[Option<TensorId>],
    results: Vec<V>,
) -> Result<(), String> {
    let mut results = results.into_iter();
    for (position, slot) in output_slots.iter().enumerate() {
        let value = results.next();
        if let Some(id) = slot {
            let value = value.ok_or_else(|| format!("the kernel gives no output {position}"))?;
            env.insert(*id, value);
        }
    }
    Ok(())
}
