//! Folds the CPU backend does when it prepares a stage: a BatchNormalization with constant
//! statistics that only reads a Conv's output, a Mul and an Add of scalars after it, and a
//! Relu or a written-out hard-swish (Add, Clip, Mul, Div of scalars) after the result, run as the convolution writes its output (onnxruntime fuses the same chains, for the same reason:
//! on resnet_tiny the separate BatchNormalization and Relu passes read and wrote every
//! activation twice more, for a tenth of the model's time).
//!
//! The folded nodes keep their own arithmetic (`kernels::Epilogue`): the statistics are not
//! folded into the Conv's weights, which would round differently, so a run's outputs do not
//! depend on whether a stage boundary kept a fold from happening. A fold needs the
//! BatchNormalization's scale, bias, mean and variance to be parameters of the model, in
//! inference mode (no `training_mode`, `spatial` 1), and each intermediate tensor to have that
//! one reader in the stage and not to leave it. The folded step makes the last node's output;
//! the nodes folded into it report no time of their own to `pipecut profile` (the Conv's time
//! covers them).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::kernels::Epilogue;
use super::steps::Step;
use super::{StageSpec, Weights};
use pipecut_ir::graph::{Attribute, Graph, Node, NodeId, TensorId};

/// A Conv step with the nodes after it folded in.
#[derive(Debug)]
pub(crate) struct FoldedConv {
    /// What the folded nodes do to each output.
    pub epilogue: Epilogue,
    /// Where the step's output goes: the output slot of the last folded node.
    pub output: [Option<TensorId>; 1],
    /// The nodes the step runs besides the Conv, in order.
    pub folded: Vec<NodeId>,
}

/// `steps` with every foldable Conv chain run as one step (see the module doc), whose kernel
/// `folded` makes of the fold: the CPU backend's and the CUDA backend's steps differ.
pub(super) fn fold_conv_chains<K>(
    graph: &Graph,
    weights: &Weights,
    spec: &StageSpec,
    steps: Vec<Step<K>>,
    folded: impl Fn(Arc<FoldedConv>) -> K,
) -> Vec<Step<K>> {
    let leaves: HashSet<TensorId> = spec.sends.iter().chain(graph.outputs()).copied().collect();
    let position: HashMap<NodeId, usize> =
        steps.iter().enumerate().map(|(i, s)| (s.node, i)).collect();
    let chains = Chains {
        graph,
        weights,
        leaves: &leaves,
        position: &position,
    };
    let mut folds: HashMap<usize, FoldedConv> = HashMap::new();
    let mut absorbed: HashSet<usize> = HashSet::new();
    for (i, step) in steps.iter().enumerate() {
        if let Some(fold) = chains.fold_from(step.node, i) {
            absorbed.extend(fold.folded.iter().map(|n| position[n]));
            folds.insert(i, fold);
        }
    }
    let mut frees_of_absorbed: HashMap<usize, Vec<TensorId>> = HashMap::new();
    for (&i, fold) in &folds {
        let frees = fold
            .folded
            .iter()
            .flat_map(|n| steps[position[n]].frees.iter().copied())
            .collect();
        frees_of_absorbed.insert(i, frees);
    }
    steps
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !absorbed.contains(i))
        .map(|(i, mut step)| {
            if let Some(fold) = folds.remove(&i) {
                step.kernel = folded(Arc::new(fold));
                step.frees
                    .extend(frees_of_absorbed.remove(&i).unwrap_or_default());
            }
            step
        })
        .collect()
}

/// What a fold looks at: the graph, its weights, the tensors that leave the stage and each
/// node's step.
struct Chains<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    leaves: &'a HashSet<TensorId>,
    position: &'a HashMap<NodeId, usize>,
}

impl Chains<'_> {
    /// The fold starting at the node of step `at`, if it is a Conv with something to fold.
    fn fold_from(&self, conv_id: NodeId, at: usize) -> Option<FoldedConv> {
        let conv = self.graph.node(conv_id);
        if !is_default_op(conv, "Conv") || conv.outputs.len() != 1 {
            return None;
        }
        let weight = self.graph.tensor(conv.inputs.get(1).copied().flatten()?);
        let channels = usize::try_from(weight.shape.as_ref()?.first()?.known()?).ok()?;
        let mut fold = FoldedConv {
            epilogue: Epilogue::default(),
            output: [conv.outputs[0]],
            folded: Vec::new(),
        };
        let mut last = at;
        if let Some((norm_id, norm)) = self.sole_reader(fold.output[0]?, last) {
            if let Some(per_channel) = self.batch_norm_statistics(norm, channels) {
                fold.epilogue.norm = Some(per_channel);
                fold.output = [norm.outputs[0]];
                fold.folded.push(norm_id);
                last = self.position[&norm_id];
            }
        }
        if let Some((nodes, constants, output)) = self.scalar_affine(fold.output[0]?, last) {
            fold.epilogue.affine = Some(constants);
            fold.output = [Some(output)];
            fold.folded.extend(nodes);
            last = self.position[&nodes[1]];
        }
        if let Some((relu_id, relu)) = self.sole_reader(fold.output[0]?, last) {
            if is_default_op(relu, "Relu") && relu.outputs.len() == 1 {
                fold.epilogue.relu = true;
                fold.output = [relu.outputs[0]];
                fold.folded.push(relu_id);
            }
        } else if let Some((nodes, constants, output)) = self.hard_swish(fold.output[0]?, last) {
            fold.epilogue.hard_swish = Some(constants);
            fold.output = [Some(output)];
            fold.folded.extend(nodes);
        }
        (!fold.folded.is_empty()).then_some(fold)
    }

    /// The hard-swish `t · clip(t + add, lo, hi) / div` written out as Add, Clip, Mul and Div
    /// of scalar parameters after step `after` (t read by the Add and the Mul only, each
    /// intermediate by the next node only): the four nodes, `[add, lo, hi, div]` and the Div's
    /// output.
    fn hard_swish(&self, t: TensorId, after: usize) -> Option<([NodeId; 4], [f32; 4], TensorId)> {
        let readers = &self.graph.tensor(t).consumers;
        if self.leaves.contains(&t) || readers.len() != 2 {
            return None;
        }
        let node = |op: &str| {
            readers
                .iter()
                .map(|&id| (id, self.graph.node(id)))
                .find(|(_, n)| is_default_op(n, op) && n.inputs.len() == 2 && n.outputs.len() == 1)
        };
        let ((add_id, add), (mul_id, mul)) = (node("Add")?, node("Mul")?);
        let other = |n: &Node, known: TensorId| match n.inputs.as_slice() {
            [Some(a), Some(b)] if *a == known => Some(*b),
            [Some(a), Some(b)] if *b == known => Some(*a),
            _ => None,
        };
        let shift = self.scalar(other(add, t)?)?;
        let (clip_id, clip) = self.sole_reader(add.outputs[0]?, self.position[&add_id])?;
        if !is_default_op(clip, "Clip") || clip.outputs.len() != 1 {
            return None;
        }
        let [lo, hi] = self.clip_bounds(clip)?;
        let clipped = clip.outputs[0]?;
        if other(mul, t)? != clipped || self.graph.tensor(clipped).consumers != [mul_id] {
            return None;
        }
        let (div_id, div) = self.sole_reader(mul.outputs[0]?, self.position[&mul_id])?;
        if !is_default_op(div, "Div") || div.inputs.len() != 2 || div.outputs.len() != 1 {
            return None;
        }
        let divisor = self.scalar(div.inputs[1]?)?;
        let later = |id: NodeId| self.position.get(&id).is_some_and(|&p| p > after);
        (later(add_id) && later(mul_id) && !self.leaves.contains(&clipped)).then_some((
            [add_id, clip_id, mul_id, div_id],
            [shift, lo, hi, divisor],
            div.outputs[0]?,
        ))
    }

    /// A Mul by a scalar parameter alone reading `t` after step `after`, then an Add of one
    /// alone reading the product: the two nodes, `[scale, shift]` and the Add's output.
    fn scalar_affine(
        &self,
        t: TensorId,
        after: usize,
    ) -> Option<([NodeId; 2], [f32; 2], TensorId)> {
        let operand = |n: &Node, known: TensorId| match n.inputs.as_slice() {
            [Some(a), Some(b)] if *a == known && b != a => self.scalar(*b),
            [Some(a), Some(b)] if *b == known && b != a => self.scalar(*a),
            _ => None,
        };
        let (mul_id, mul) = self.sole_reader_anywhere(t, after)?;
        if !is_default_op(mul, "Mul") || mul.outputs.len() != 1 {
            return None;
        }
        let scale = operand(mul, t)?;
        let product = mul.outputs[0]?;
        let (add_id, add) = self.sole_reader_anywhere(product, self.position[&mul_id])?;
        if !is_default_op(add, "Add") || add.outputs.len() != 1 {
            return None;
        }
        let shift = operand(add, product)?;
        Some(([mul_id, add_id], [scale, shift], add.outputs[0]?))
    }

    /// [`Chains::sole_reader`] where `tensor` may be either input of the reader.
    fn sole_reader_anywhere(&self, tensor: TensorId, after: usize) -> Option<(NodeId, &Node)> {
        let readers = &self.graph.tensor(tensor).consumers;
        if self.leaves.contains(&tensor) || readers.len() != 1 {
            return None;
        }
        let node = self.graph.node(readers[0]);
        let later = self.position.get(&readers[0]).is_some_and(|&p| p > after);
        later.then_some((readers[0], node))
    }

    /// The bounds of a Clip whose bounds are scalar parameters (inputs from opset 11,
    /// attributes before), ±inf where absent.
    fn clip_bounds(&self, clip: &Node) -> Option<[f32; 2]> {
        if self.graph.opset(&clip.domain).unwrap_or(0) < 11 {
            let bound = |name: &str, default: f32| match clip.attributes.get(name) {
                None => Some(default),
                Some(Attribute::Float(v)) => Some(*v),
                Some(_) => None,
            };
            return Some([
                bound("min", f32::NEG_INFINITY)?,
                bound("max", f32::INFINITY)?,
            ]);
        }
        let bound = |i: usize, default: f32| match clip.inputs.get(i).copied().flatten() {
            None => Some(default),
            Some(t) => self.scalar(t),
        };
        Some([bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?])
    }

    /// The value of a one-element f32 parameter.
    fn scalar(&self, tensor: TensorId) -> Option<f32> {
        single_value(self.graph, self.weights, tensor).map(|(value, _)| value)
    }

    /// The one node of the stage, after step `after`, that reads `tensor`, where `tensor` does
    /// not leave the stage.
    fn sole_reader(&self, tensor: TensorId, after: usize) -> Option<(NodeId, &Node)> {
        let readers = &self.graph.tensor(tensor).consumers;
        if self.leaves.contains(&tensor) || readers.len() != 1 {
            return None;
        }
        let reader = readers[0];
        let node = self.graph.node(reader);
        let reads_once = node.inputs.iter().filter(|t| **t == Some(tensor)).count() == 1;
        let later = self.position.get(&reader).is_some_and(|&p| p > after);
        (reads_once && later && node.inputs.first() == Some(&Some(tensor)))
            .then_some((reader, node))
    }

    /// `[mean, factor, shift]` per channel of `norm`, a BatchNormalization in inference mode
    /// over `channels` channels whose statistics are parameters, factor = scale / √(var + ε)
    /// computed as its kernel computes it.
    fn batch_norm_statistics(&self, norm: &Node, channels: usize) -> Option<Vec<[f32; 3]>> {
        // Absent, or the inference-mode value.
        let inference = |name: &str, value: i64| match norm.attributes.get(name) {
            None => true,
            Some(Attribute::Int(v)) => *v == value,
            Some(_) => false,
        };
        if !is_default_op(norm, "BatchNormalization")
            || norm.inputs.len() != 5
            || norm.outputs.iter().skip(1).any(Option::is_some)
            || !inference("training_mode", 0)
            || !inference("spatial", 1)
        {
            return None;
        }
        let per_channel = |i: usize| -> Option<Vec<f32>> {
            let tensor = norm.inputs[i]?;
            self.graph.tensor(tensor).param()?;
            let values = self.weights.get(tensor)?.as_f32().ok()?;
            (values.len() == channels).then(|| values.to_vec())
        };
        let [scale, shift, mean, var] = [1, 2, 3, 4].map(per_channel);
        let (scale, shift, mean, var) = (scale?, shift?, mean?, var?);
        let epsilon = match norm.attributes.get("epsilon") {
            Some(Attribute::Float(e)) => *e,
            Some(Attribute::Int(e)) => *e as f32,
            None => 1e-5,
            Some(_) => return None,
        };
        Some(
            (0..channels)
                .map(|m| [mean[m], scale[m] / (var[m] + epsilon).sqrt(), shift[m]])
                .collect(),
        )
    }
}

/// Whether `node` is the standard ONNX op `op`.
fn is_default_op(node: &Node, op: &str) -> bool {
    node.op_type == op && (node.domain.is_empty() || node.domain == "ai.onnx")
}

/// The value and rank of `tensor` when it is an f32 parameter of one element: the scalar a
/// fold or a fusion takes into its kernel (here and in the CUDA backend's `fuse.rs`).
pub(crate) fn single_value(
    graph: &Graph,
    weights: &Weights,
    tensor: TensorId,
) -> Option<(f32, usize)> {
    graph.tensor(tensor).param()?;
    let weight = weights.get(tensor)?;
    match weight.as_f32().ok()? {
        [v] => Some((*v, weight.shape().len())),
        _ => None,
    }
}
