//! Fused device steps for what transformer exporters write out node by node, found when a stage
//! is prepared: on the device a node costs its host time (5–9 µs on the H100 and H200 of
//! `docs/benchmarks.md`) whatever its size, and bert_tiny's and gpt2_tiny's small nodes left the
//! GPU waiting on the host.
//!
//! ```text
//! ReduceMean, Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div, Mul γ[, Add β]   ─▶ norm_rows_f32
//! Pow 2, ReduceMean, Add ε, Sqrt, Reciprocal + Mul | Div, Mul γ (RMS)   ─▶ norm_rows_f32
//! [Add bias,] Div √2, Erf, Add 1, Mul, Mul ½ (Gelu)                     ─▶ fused_gelu_f32
//! Sigmoid, Mul by its input (SiLU)[, Mul by a same-shaped gate]        ─▶ fused_silu_f32
//! MatMul by a weight, Add bias[, Add residual]     ─▶ bias_rows_f32 + one GEMM (beta 1)
//! MatMul of two activations, Div or Mul by a scalar (attention's scale) ─▶ one GEMM (alpha)
//! ```
//!
//! A fusion needs each intermediate tensor to be read only by the nodes it fuses, all in the
//! stage, and not to leave it (a stage's sends, the graph's outputs), so a stage boundary or a
//! second reader keeps the nodes apart; the constants (ε, the Gelu's, γ, β, biases, the
//! weight) must be parameters of the model. The fused step sits where its last node was, and
//! when a run's shapes do not fit its kernel (a scale that is not one per column, a residual
//! that broadcasts), it runs the nodes it replaced one by one instead.
//!
//! Numerics: the Gelu and the SiLU keep the nodes' operations in their order (the same bits as
//! unfused on the device); the norms compute `(x − mean) · rsqrt(var + ε)` where the nodes divide by a
//! square root (within 2 ulp), and a MatMul with a residual adds `product + (bias + residual)`
//! where the nodes add `(product + bias) + residual`; a scaled MatMul multiplies by `1 / d`
//! where the nodes divide by d (the same bits when d is a power of two). `PIPECUT_CUDA_FUSE=off` turns fusion
//! off, to compare on a GPU.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use cudarc::driver::PushKernelArg;

use super::gpu::{cuda_error, numel, Gpu};
use super::row_ops;
use super::value::{DeviceTensor, Value};
use crate::steps::Step;
use crate::{StageSpec, Weights};
use pipecut_ir::graph::{Attribute, Graph, Node, NodeId, TensorId};

/// Whether stages are prepared with fused steps (unless `PIPECUT_CUDA_FUSE=off`).
pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PIPECUT_CUDA_FUSE").map_or(true, |v| v != "off"))
}

/// What a fused step computes, from tensors of the graph.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fusion {
    /// Each row of `x` (its last axis) normalised by its mean and variance, or by its root mean
    /// square when `rms`, times `scale` plus `bias`.
    Norm {
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: f32,
        rms: bool,
    },
    /// `(t · (erf(t / div) + add)) · mul` with `t = x (+ bias)`; `constants` = `[div, add, mul]`.
    Gelu {
        x: TensorId,
        bias: Option<TensorId>,
        constants: [f32; 3],
    },
    /// `x · sigmoid(x)`, times `gate` (of x's shape) when there is one.
    Silu { x: TensorId, gate: Option<TensorId> },
    /// `a · b` times `alpha`.
    ScaledMatMul {
        a: TensorId,
        b: TensorId,
        alpha: f32,
    },
    /// `a · weight + bias (+ residual)`, the weight a [K, N] matrix.
    BiasedMatMul {
        a: TensorId,
        weight: TensorId,
        bias: TensorId,
        residual: Option<TensorId>,
    },
}

impl Fusion {
    /// The tensors it reads, in the order [`run`] takes them.
    pub(super) fn inputs(&self) -> Vec<TensorId> {
        let slots = match *self {
            Fusion::Norm { x, scale, bias, .. } => vec![Some(x), Some(scale), bias],
            Fusion::Gelu { x, bias, .. } => vec![Some(x), bias],
            Fusion::Silu { x, gate } => vec![Some(x), gate],
            Fusion::ScaledMatMul { a, b, .. } => vec![Some(a), Some(b)],
            Fusion::BiasedMatMul {
                a,
                weight,
                bias,
                residual,
            } => vec![Some(a), Some(weight), Some(bias), residual],
        };
        slots.into_iter().flatten().collect()
    }

    /// A name for `PIPECUT_CUDA_HOST_TIMES` and errors.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Fusion::Norm { rms: false, .. } => "fused LayerNorm",
            Fusion::Norm { rms: true, .. } => "fused RMSNorm",
            Fusion::Gelu { .. } => "fused Gelu",
            Fusion::Silu { .. } => "fused SiLU",
            Fusion::ScaledMatMul { .. } => "fused scaled MatMul",
            Fusion::BiasedMatMul { .. } => "fused MatMul+bias",
        }
    }
}

/// A fused step: what it computes, the tensor it makes, and the steps it replaces (run one by
/// one when a run's shapes do not fit the kernel).
#[derive(Debug)]
pub(super) struct Fused<K> {
    pub(super) fusion: Fusion,
    pub(super) output: TensorId,
    pub(super) steps: Vec<Step<K>>,
}

/// `steps` with every fusable run of nodes replaced by one fused step (see the module doc):
/// only steps whose kernel `is_tensor_kernel` are fused (not flow ops nor folds), and `fused`
/// makes the fused step's kernel, as `crate::fuse::fold_conv_chains` takes the fold's.
pub(super) fn fuse_steps<K>(
    graph: &Graph,
    weights: &Weights,
    spec: &StageSpec,
    steps: Vec<Step<K>>,
    is_tensor_kernel: impl Fn(&K) -> bool,
    fused: impl Fn(Arc<Fused<K>>) -> K,
) -> Vec<Step<K>> {
    let leaves: HashSet<TensorId> = spec.sends.iter().chain(graph.outputs()).copied().collect();
    let position: HashMap<NodeId, usize> =
        steps.iter().enumerate().map(|(i, s)| (s.node, i)).collect();
    let mut finder = Finder {
        graph,
        weights,
        leaves: &leaves,
        position: &position,
        claimed: HashSet::new(),
    };
    let groups = finder.find(&steps, is_tensor_kernel);
    assemble(steps, groups, &position, fused)
}

/// One fusion found: its nodes, what it computes and the tensor it makes.
struct Group {
    nodes: Vec<NodeId>,
    fusion: Fusion,
    output: TensorId,
}

/// Replaces each group's steps by one fused step at the place of its last node. A step in
/// between that was the last reader of a tensor the fused step reads leaves its release to the
/// fused step.
fn assemble<K>(
    mut steps: Vec<Step<K>>,
    groups: Vec<Group>,
    position: &HashMap<NodeId, usize>,
    fused: impl Fn(Arc<Fused<K>>) -> K,
) -> Vec<Step<K>> {
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    let mut last_of: Vec<usize> = Vec::new();
    let mut kept_alive: Vec<Vec<TensorId>> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for n in &group.nodes {
            group_of.insert(position[n], g);
        }
    }
    for (g, group) in groups.iter().enumerate() {
        let places = group.nodes.iter().map(|n| position[n]);
        let (first, last) = (places.clone().min().unwrap_or(0), places.max().unwrap_or(0));
        last_of.push(last);
        let reads = group.fusion.inputs();
        let mut moved = Vec::new();
        for (i, step) in steps.iter_mut().enumerate().take(last).skip(first + 1) {
            if group_of.get(&i) != Some(&g) {
                step.frees.retain(|t| {
                    let read = reads.contains(t);
                    if read {
                        moved.push(*t);
                    }
                    !read
                });
            }
        }
        kept_alive.push(moved);
    }
    let mut pending: Vec<Vec<Step<K>>> = groups.iter().map(|_| Vec::new()).collect();
    let mut groups: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.into_iter().enumerate() {
        let Some(&g) = group_of.get(&i) else {
            out.push(step);
            continue;
        };
        pending[g].push(step);
        if i != last_of[g] {
            continue;
        }
        let replaced = std::mem::take(&mut pending[g]);
        let Some(group) = groups[g].take() else {
            continue;
        };
        let Some(last) = replaced.last() else {
            continue;
        };
        let (node, opset) = (last.node, last.opset);
        let mut frees: Vec<TensorId> = replaced.iter().flat_map(|s| s.frees.clone()).collect();
        frees.append(&mut kept_alive[g]);
        out.push(Step {
            node,
            kernel: fused(Arc::new(Fused {
                fusion: group.fusion,
                output: group.output,
                steps: replaced,
            })),
            opset,
            output_dtypes: Vec::new(),
            input_dtypes: Vec::new(),
            frees,
        });
    }
    out
}

/// Looks for the patterns over a stage's steps; a node belongs to one fusion at most.
struct Finder<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    leaves: &'a HashSet<TensorId>,
    position: &'a HashMap<NodeId, usize>,
    claimed: HashSet<NodeId>,
}

impl Finder<'_> {
    /// Every fusion in the steps: the Gelus first (they take the bias Add a MatMul would).
    fn find<K>(&mut self, steps: &[Step<K>], is_tensor_kernel: impl Fn(&K) -> bool) -> Vec<Group> {
        let mut groups = Vec::new();
        type Pattern<'p> = fn(&Finder<'p>, NodeId) -> Option<Group>;
        let patterns: [Pattern; 6] = [
            Finder::gelu,
            Finder::silu,
            Finder::layer_norm,
            Finder::rms_norm,
            Finder::biased_matmul,
            Finder::scaled_matmul,
        ];
        for pattern in patterns {
            for step in steps {
                if !is_tensor_kernel(&step.kernel) || self.claimed.contains(&step.node) {
                    continue;
                }
                if let Some(group) = pattern(self, step.node) {
                    self.claimed.extend(group.nodes.iter().copied());
                    groups.push(group);
                }
            }
        }
        groups
    }

    fn node(&self, id: NodeId) -> &Node {
        self.graph.node(id)
    }

    /// Whether `id` is a node of the stage, free to fuse, of the default domain's `op`, with one
    /// output.
    fn is(&self, id: NodeId, op: &str) -> bool {
        let node = self.node(id);
        node.op_type == op
            && (node.domain.is_empty() || node.domain == "ai.onnx")
            && node.outputs.len() == 1
            && node.outputs[0].is_some()
            && self.position.contains_key(&id)
            && !self.claimed.contains(&id)
    }

    fn output(&self, id: NodeId) -> TensorId {
        self.node(id).outputs[0].expect("checked by `is`")
    }

    /// The nodes that read `tensor`, when it stays in the stage and all of them are in it.
    fn readers(&self, tensor: TensorId) -> Option<&[NodeId]> {
        let readers = &self.graph.tensor(tensor).consumers;
        let inside = readers.iter().all(|r| self.position.contains_key(r));
        (!self.leaves.contains(&tensor) && inside).then_some(readers.as_slice())
    }

    /// The one reader of `tensor` when it is an `op` (see [`Finder::readers`]).
    fn sole_reader(&self, tensor: TensorId, op: &str) -> Option<NodeId> {
        match self.readers(tensor)? {
            [reader] if self.is(*reader, op) => Some(*reader),
            _ => None,
        }
    }

    /// A two-input node's other input than `known` (which it reads once).
    fn other_input(&self, id: NodeId, known: TensorId) -> Option<TensorId> {
        match self.node(id).inputs.as_slice() {
            [Some(a), Some(b)] if *a == known && *b != known => Some(*b),
            [Some(a), Some(b)] if *b == known && *a != known => Some(*a),
            _ => None,
        }
    }

    /// The value of a one-element float parameter of rank 0 or 1 (a broadcast by it adds no
    /// axis to a tensor of rank 1 or more).
    fn scalar(&self, tensor: TensorId) -> Option<f32> {
        crate::fuse::single_value(self.graph, self.weights, tensor)
            .and_then(|(value, rank)| (rank <= 1).then_some(value))
    }

    /// Whether `tensor` is a float parameter of rank `rank`.
    fn float_param(&self, tensor: TensorId, rank: usize) -> bool {
        self.graph.tensor(tensor).param().is_some()
            && self
                .weights
                .get(tensor)
                .is_some_and(|w| w.as_f32().is_ok() && w.shape().len() == rank)
    }

    /// Whether `id` is a ReduceMean over the last axis of its input, keeping it.
    fn mean_of_rows(&self, id: NodeId) -> bool {
        let node = self.node(id);
        if !self.is(id, "ReduceMean") {
            return false;
        }
        if !matches!(
            node.attributes.get("keepdims"),
            None | Some(Attribute::Int(1))
        ) {
            return false;
        }
        let Some(Some(x)) = node.inputs.first() else {
            return false;
        };
        let rank = self.graph.tensor(*x).shape.as_ref().map(|s| s.len() as i64);
        let axes: Vec<i64> = match (node.attributes.get("axes"), node.inputs.get(1)) {
            (Some(Attribute::Ints(axes)), _) => axes.clone(),
            (None, Some(Some(axes))) if self.graph.tensor(*axes).param().is_some() => {
                match self.weights.get(*axes) {
                    Some(t) => t.to_i64_vec(),
                    None => return false,
                }
            }
            _ => return false,
        };
        matches!(axes.as_slice(), [-1]) || rank.is_some_and(|rank| axes == [rank - 1])
    }

    /// `Add(v, ε)` then `Sqrt` after the ReduceMean `mean` of squares: ε, the two nodes and the
    /// square root.
    fn epsilon_root(&self, mean: NodeId) -> Option<(f32, [NodeId; 2], TensorId)> {
        let add = self.sole_reader(self.output(mean), "Add")?;
        let epsilon = self.scalar(self.other_input(add, self.output(mean))?)?;
        let sqrt = self.sole_reader(self.output(add), "Sqrt")?;
        Some((epsilon, [add, sqrt], self.output(sqrt)))
    }

    /// `Mul(n, γ)` and an optional `Add(·, β)` after `n`, either operand order, γ and β rows:
    /// γ, β, the nodes and the output.
    fn scale_and_shift(
        &self,
        n: TensorId,
    ) -> Option<(TensorId, Option<TensorId>, Vec<NodeId>, TensorId)> {
        let mul = self.sole_reader(n, "Mul")?;
        let scale = self.other_input(mul, n)?;
        if !self.float_param(scale, 1) {
            return None;
        }
        let scaled = self.output(mul);
        if let Some(add) = self.sole_reader(scaled, "Add") {
            if let Some(bias) = self.other_input(add, scaled) {
                if self.float_param(bias, 1) {
                    return Some((scale, Some(bias), vec![mul, add], self.output(add)));
                }
            }
        }
        Some((scale, None, vec![mul], scaled))
    }

    /// Whether `id` is a `Pow(t, 2)`.
    fn squares(&self, id: NodeId, t: TensorId) -> bool {
        self.is(id, "Pow")
            && self.node(id).inputs.first() == Some(&Some(t))
            && self
                .other_input(id, t)
                .and_then(|e| self.scalar(e))
                .is_some_and(|e| e == 2.0)
    }

    /// ReduceMean, Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div, Mul γ and Add β, from the first
    /// ReduceMean.
    fn layer_norm(&self, first: NodeId) -> Option<Group> {
        if !self.mean_of_rows(first) {
            return None;
        }
        let x = self.node(first).inputs[0]?;
        let mean = self.output(first);
        let sub = self.sole_reader(mean, "Sub")?;
        if self.node(sub).inputs != [Some(x), Some(mean)] {
            return None;
        }
        let centred = self.output(sub);
        let (pow, div) = match self.readers(centred)? {
            [a, b] if self.squares(*a, centred) && self.is(*b, "Div") => (*a, *b),
            [a, b] if self.squares(*b, centred) && self.is(*a, "Div") => (*b, *a),
            _ => return None,
        };
        let second = self.sole_reader(self.output(pow), "ReduceMean")?;
        if !self.mean_of_rows(second) {
            return None;
        }
        let (epsilon, [add, sqrt], root) = self.epsilon_root(second)?;
        if self.sole_reader(root, "Div") != Some(div)
            || self.node(div).inputs != [Some(centred), Some(root)]
        {
            return None;
        }
        let (scale, bias, tail, output) = self.scale_and_shift(self.output(div))?;
        let mut nodes = vec![first, sub, pow, second, add, sqrt, div];
        nodes.extend(tail);
        Some(Group {
            nodes,
            fusion: Fusion::Norm {
                x,
                scale,
                bias,
                epsilon,
                rms: false,
            },
            output,
        })
    }

    /// Pow 2, ReduceMean, Add ε, Sqrt, then Reciprocal and Mul by x or a Div of x, and Mul γ,
    /// from the Pow.
    fn rms_norm(&self, pow: NodeId) -> Option<Group> {
        let x = self.node(pow).inputs.first().copied().flatten()?;
        if !self.squares(pow, x) {
            return None;
        }
        let mean = self.sole_reader(self.output(pow), "ReduceMean")?;
        if !self.mean_of_rows(mean) {
            return None;
        }
        let (epsilon, [add, sqrt], root) = self.epsilon_root(mean)?;
        let mut nodes = vec![pow, mean, add, sqrt];
        let normalised = if let Some(reciprocal) = self.sole_reader(root, "Reciprocal") {
            let inverse = self.output(reciprocal);
            let mul = self.sole_reader(inverse, "Mul")?;
            if self.other_input(mul, inverse) != Some(x) {
                return None;
            }
            nodes.extend([reciprocal, mul]);
            self.output(mul)
        } else {
            let div = self.sole_reader(root, "Div")?;
            if self.node(div).inputs != [Some(x), Some(root)] {
                return None;
            }
            nodes.push(div);
            self.output(div)
        };
        let (scale, bias, tail, output) = self.scale_and_shift(normalised)?;
        nodes.extend(tail);
        Some(Group {
            nodes,
            fusion: Fusion::Norm {
                x,
                scale,
                bias,
                epsilon,
                rms: true,
            },
            output,
        })
    }

    /// Div by a scalar, Erf, Add a scalar, Mul by the Div's input, Mul by a scalar, from the
    /// Div; with the Add of a bias row that made the Div's input, when it has no other reader.
    fn gelu(&self, div: NodeId) -> Option<Group> {
        if !self.is(div, "Div") {
            return None;
        }
        let t = self.node(div).inputs.first().copied().flatten()?;
        let divisor = self.scalar(self.node(div).inputs.get(1).copied().flatten()?)?;
        let erf = self.sole_reader(self.output(div), "Erf")?;
        let add = self.sole_reader(self.output(erf), "Add")?;
        let one = self.scalar(self.other_input(add, self.output(erf))?)?;
        let mul = self.sole_reader(self.output(add), "Mul")?;
        if self.other_input(mul, self.output(add)) != Some(t) {
            return None;
        }
        match self.readers(t)? {
            [a, b] if (*a, *b) == (div, mul) || (*a, *b) == (mul, div) => {}
            _ => return None,
        }
        let half = self.sole_reader(self.output(mul), "Mul")?;
        let factor = self.scalar(self.other_input(half, self.output(mul))?)?;
        let mut nodes = vec![div, erf, add, mul, half];
        let (mut x, mut bias) = (t, None);
        let producer = self.graph.tensor(t).producer();
        if let Some(bias_add) = producer.filter(|&p| self.is(p, "Add")) {
            let inputs = &self.node(bias_add).inputs;
            let (row, other) = match inputs.as_slice() {
                [Some(a), Some(b)] if self.float_param(*a, 1) => (*a, *b),
                [Some(a), Some(b)] if self.float_param(*b, 1) => (*b, *a),
                _ => (t, t),
            };
            if row != t && self.graph.tensor(other).param().is_none() {
                (x, bias) = (other, Some(row));
                nodes.insert(0, bias_add);
            }
        }
        Some(Group {
            nodes,
            fusion: Fusion::Gelu {
                x,
                bias,
                constants: [divisor, one, factor],
            },
            output: self.output(half),
        })
    }

    /// Sigmoid and a Mul of its input by it, from the Sigmoid; with the Mul of the product by
    /// another tensor that is not a parameter (a gate) when it is the product's one reader.
    fn silu(&self, sigmoid: NodeId) -> Option<Group> {
        if !self.is(sigmoid, "Sigmoid") {
            return None;
        }
        let x = self.node(sigmoid).inputs.first().copied().flatten()?;
        let mul = self.sole_reader(self.output(sigmoid), "Mul")?;
        if self.other_input(mul, self.output(sigmoid)) != Some(x) {
            return None;
        }
        let product = self.output(mul);
        let gated = self.sole_reader(product, "Mul").and_then(|gate_mul| {
            let gate = self.other_input(gate_mul, product)?;
            self.graph
                .tensor(gate)
                .param()
                .is_none()
                .then_some((gate_mul, gate))
        });
        let (nodes, gate, output) = match gated {
            Some((gate_mul, gate)) => (
                vec![sigmoid, mul, gate_mul],
                Some(gate),
                self.output(gate_mul),
            ),
            None => (vec![sigmoid, mul], None, product),
        };
        Some(Group {
            nodes,
            fusion: Fusion::Silu { x, gate },
            output,
        })
    }

    /// MatMul of two tensors that are not parameters, then a Div of the product by a scalar
    /// (alpha = 1 / d) or a Mul by one (alpha = the scalar), from the MatMul.
    fn scaled_matmul(&self, matmul: NodeId) -> Option<Group> {
        if !self.is(matmul, "MatMul") {
            return None;
        }
        let (a, b) = match self.node(matmul).inputs.as_slice() {
            [Some(a), Some(b)] => (*a, *b),
            _ => return None,
        };
        if self.graph.tensor(a).param().is_some() || self.graph.tensor(b).param().is_some() {
            return None;
        }
        let product = self.output(matmul);
        let readers = self.readers(product)?;
        let [scale] = readers else {
            return None;
        };
        let factor = self.scalar(self.other_input(*scale, product)?)?;
        let alpha = if self.is(*scale, "Div") && self.node(*scale).inputs[0] == Some(product) {
            1.0 / factor
        } else if self.is(*scale, "Mul") {
            factor
        } else {
            return None;
        };
        Some(Group {
            nodes: vec![matmul, *scale],
            fusion: Fusion::ScaledMatMul { a, b, alpha },
            output: self.output(*scale),
        })
    }

    /// MatMul by a [K, N] weight, Add of a bias row, and an Add of another tensor (a residual)
    /// when it is the sum's one reader.
    fn biased_matmul(&self, matmul: NodeId) -> Option<Group> {
        if !self.is(matmul, "MatMul") {
            return None;
        }
        let (a, weight) = match self.node(matmul).inputs.as_slice() {
            [Some(a), Some(w)] if self.float_param(*w, 2) && a != w => (*a, *w),
            _ => return None,
        };
        if self.graph.tensor(a).param().is_some() {
            return None;
        }
        let product = self.output(matmul);
        let add = self.sole_reader(product, "Add")?;
        let bias = self.other_input(add, product)?;
        if !self.float_param(bias, 1) {
            return None;
        }
        let mut group = Group {
            nodes: vec![matmul, add],
            fusion: Fusion::BiasedMatMul {
                a,
                weight,
                bias,
                residual: None,
            },
            output: self.output(add),
        };
        let sum = self.output(add);
        if let Some(second) = self.sole_reader(sum, "Add") {
            let other = self.other_input(second, sum);
            if let Some(r) = other.filter(|&r| self.graph.tensor(r).param().is_none()) {
                group.nodes.push(second);
                group.output = self.output(second);
                if let Fusion::BiasedMatMul { residual, .. } = &mut group.fusion {
                    *residual = Some(r);
                }
            }
        }
        Some(group)
    }
}

/// Runs a fused step on its inputs (in [`Fusion::inputs`]'s order, on the device), or answers
/// `None` when their shapes do not fit its kernel.
pub(super) fn run(
    gpu: &Gpu,
    fusion: &Fusion,
    inputs: &[DeviceTensor],
) -> Result<Option<DeviceTensor>, String> {
    if inputs
        .iter()
        .any(|t| t.mask || t.int.is_some() || t.data.is_empty() || t.shape.is_empty())
    {
        return Ok(None);
    }
    match *fusion {
        Fusion::Norm { epsilon, rms, .. } => norm(gpu, inputs, epsilon, rms),
        Fusion::Gelu { constants, .. } => gelu(gpu, inputs, constants),
        Fusion::Silu { .. } => silu(gpu, inputs),
        Fusion::BiasedMatMul { .. } => biased_matmul(gpu, inputs),
        Fusion::ScaledMatMul { alpha, .. } => {
            let args: Vec<Option<Value>> = inputs
                .iter()
                .map(|t| Some(Value::Device(t.clone())))
                .collect();
            let made = super::ops::scaled_matmul(gpu, &args, alpha)?;
            Ok(made.and_then(|values| match values.into_iter().next() {
                Some(Value::Device(t)) => Some(t),
                _ => None,
            }))
        }
    }
}

/// Columns of `x`'s rows (its last dimension), when `rows` holds that many values.
fn columns_of(x: &DeviceTensor, row: &DeviceTensor) -> Option<usize> {
    let cols = *x.shape.last()?;
    (cols > 0 && numel(&row.shape) == cols && row.data.len() == cols).then_some(cols)
}

fn norm(
    gpu: &Gpu,
    inputs: &[DeviceTensor],
    epsilon: f32,
    rms: bool,
) -> Result<Option<DeviceTensor>, String> {
    let (x, scale, bias) = (&inputs[0], &inputs[1], inputs.get(2));
    let fits = |row: &DeviceTensor| columns_of(x, row).is_some();
    if !fits(scale) || !bias.is_none_or(fits) {
        return Ok(None);
    }
    let rows = row_ops::normalize_rows(gpu, x, scale, bias, (epsilon, rms))?;
    Ok(Some(DeviceTensor::new(x.shape.clone(), rows.out)))
}

fn gelu(
    gpu: &Gpu,
    inputs: &[DeviceTensor],
    [div, add, mul]: [f32; 3],
) -> Result<Option<DeviceTensor>, String> {
    let x = &inputs[0];
    let (bias, cols) = match inputs.get(1) {
        Some(bias) => match columns_of(x, bias) {
            Some(cols) => (bias, cols),
            None => return Ok(None),
        },
        None => (x, 1),
    };
    let n = x.data.len();
    let mut out = gpu.alloc(n)?;
    let (count, cols, has_bias) = (n as i64, cols as i64, inputs.len() > 1);
    let has_bias = has_bias as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fused.gelu);
    launch
        .arg(&*x.data)
        .arg(&*bias.data)
        .arg(&mut out)
        .arg(&count)
        .arg(&cols)
        .arg(&has_bias)
        .arg(&div)
        .arg(&add)
        .arg(&mul);
    // SAFETY: argument types match `fused_gelu_f32`; x and the output hold n floats, the bias
    // (read only with has_bias) `cols`.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(Some(DeviceTensor::new(x.shape.clone(), out)))
}

fn silu(gpu: &Gpu, inputs: &[DeviceTensor]) -> Result<Option<DeviceTensor>, String> {
    let (x, gate) = (&inputs[0], inputs.get(1));
    if gate.is_some_and(|g| g.shape != x.shape) {
        return Ok(None);
    }
    let n = x.data.len();
    let mut out = gpu.alloc(n)?;
    let (count, has_gate) = (n as i64, gate.is_some() as i32);
    // Without a gate the kernel never reads it; x stands in.
    let gate_data = gate.map_or(&*x.data, |g| &*g.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fused.silu);
    launch
        .arg(&*x.data)
        .arg(gate_data)
        .arg(&mut out)
        .arg(&count)
        .arg(&has_gate);
    // SAFETY: argument types match `fused_silu_f32`; x, the gate (read only with has_other)
    // and the output hold n floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(Some(DeviceTensor::new(x.shape.clone(), out)))
}

fn biased_matmul(gpu: &Gpu, inputs: &[DeviceTensor]) -> Result<Option<DeviceTensor>, String> {
    let (a, weight, bias, residual) = (&inputs[0], &inputs[1], &inputs[2], inputs.get(3));
    let (Some(&k), [k2, n]) = (a.shape.last(), weight.shape.as_slice()) else {
        return Ok(None);
    };
    let (k2, n) = (*k2, *n);
    if a.shape.len() < 2 || k != k2 || k == 0 || columns_of(weight, bias).is_none() {
        return Ok(None);
    }
    let mut shape = a.shape.clone();
    *shape.last_mut().expect("rank checked") = n;
    if residual.is_some_and(|r| r.shape != shape) {
        return Ok(None);
    }
    let rows = numel(&a.shape) / k;
    let total = rows * n;
    let mut out = gpu.alloc(total)?;
    let (count, cols) = (total as i64, n as i64);
    let has_residual = residual.is_some() as i32;
    // Without a residual the kernel never reads it; the bias stands in.
    let residual_data = residual.map_or(&*bias.data, |r| &*r.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fused.bias_rows);
    launch
        .arg(&*bias.data)
        .arg(residual_data)
        .arg(&mut out)
        .arg(&count)
        .arg(&cols)
        .arg(&has_residual);
    // SAFETY: argument types match `bias_rows_f32`; the bias holds `cols` floats, the output
    // and the residual (read only with has_residual) `total`.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    gpu.gemm_views(
        (rows, n, k),
        (&*a.data, false, &*weight.data, false),
        &mut out,
        (1.0, 1.0),
        (1, 0, 0, total),
    )?;
    Ok(Some(DeviceTensor::new(shape, out)))
}
