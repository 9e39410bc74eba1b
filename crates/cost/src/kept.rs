//! Activations as the training engine keeps them for the backward pass.
//!
//! An ONNX export spells every intermediate out: Q·Kᵀ, its scaling, masking and softmax, the
//! five tensors of an Erf GELU, the Reshape and Transpose copies. An engine keeps far fewer: an
//! autograd op saves only what its gradient reads (a MatMul its inputs, a LayerNorm its input, a
//! Softmax its output, an add nothing), views share their base's storage, and fused pointwise
//! kernels (Megatron's bias-GELU, `torch.compile`) keep only the input of the function they
//! compute. [`MemoryModel`] names the engine; [`engine_kept_bytes`] counts what it keeps, each
//! storage once, charged to the node that makes it.
//!
//! For a GPT block this gives Korthikanti et al. 2022 ("Reducing Activation Recomputation in
//! Large Transformer Models", § 4.1 and Table 2) under [`MemoryModel::Megatron`]:
//! sbh(34 + 5as/h) bytes per layer in 16-bit types, tensor-parallel splits applied by the
//! planner as for every other activation.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Error;
use pipecut_ir::graph::{Graph, NodeId, TensorId, TensorOrigin};

/// Which engine's way of keeping activations the memory model follows.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum MemoryModel {
    /// The ONNX graph as exported, run by pipecut's own runtime: every node output of a
    /// micro-batch is kept until its backward. The default where no other engine is named,
    /// and what plans before this field were made with.
    #[default]
    Onnx,
    /// PyTorch eager autograd with `scaled_dot_product_attention` (flash or memory-efficient):
    /// no score tensor is kept, attention saves Q, K, V, its output and the softmax's
    /// log-sum-exp; other ops save what their autograd formula reads, pointwise functions
    /// such as GELU their input.
    Torch,
    /// Megatron-LM with its fused kernels and its defaults: the fused scale-mask-softmax keeps
    /// only the softmax output, bias-GELU its input, and dropout of 0.1 on the attention
    /// probabilities (`--attention-dropout`) and on each block's output (`--hidden-dropout`)
    /// keeps a one-byte mask, the probabilities' dropout also its output.
    Megatron,
}

impl MemoryModel {
    /// The name `--memory-model` takes and prints.
    pub fn name(self) -> &'static str {
        match self {
            MemoryModel::Onnx => "onnx",
            MemoryModel::Torch => "torch",
            MemoryModel::Megatron => "megatron",
        }
    }

    /// Whether this is the ONNX model (serde's `skip_serializing_if`: plans made before the
    /// field read as before).
    pub fn is_onnx(&self) -> bool {
        *self == MemoryModel::Onnx
    }
}

impl std::str::FromStr for MemoryModel {
    type Err = String;
    fn from_str(s: &str) -> Result<MemoryModel, String> {
        match s {
            "onnx" => Ok(MemoryModel::Onnx),
            "torch" => Ok(MemoryModel::Torch),
            "megatron" => Ok(MemoryModel::Megatron),
            other => Err(format!(
                "unknown memory model '{other}' (expected torch, megatron or onnx)"
            )),
        }
    }
}

/// Ops whose output is a view of their first input in torch (no copy), unless a reshape must
/// copy a strided (transposed) input.
const VIEW_OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Identity",
];

/// Pointwise ops: a chain of them over one tensor is one fused function of it.
const POINTWISE_OPS: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Neg",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Relu",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Gelu",
    "FastGelu",
    "Cast",
    "Where",
    "Abs",
    "Clip",
    "LeakyRelu",
    "Elu",
    "Softplus",
    "HardSigmoid",
    "HardSwish",
];

/// Ops whose gradient reads none of their tensors (shape and layout moves, sums, concatenation).
const SAVES_NOTHING: &[&str] = &[
    "Add",
    "Sub",
    "Neg",
    "Cast",
    "Concat",
    "Split",
    "Slice",
    "Shape",
    "Size",
    "Expand",
    "ReduceMean",
    "ReduceSum",
    "Constant",
    "ConstantOfShape",
    "Range",
    "Pad",
    "Dropout",
];

/// Normalizations: their backward reads their input and the per-row statistics of
/// [`row_statistics_bytes`].
const NORMALIZATIONS: &[&str] = &[
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "BatchNormalization",
    "GroupNormalization",
    "InstanceNormalization",
];

/// Bytes of a dropout mask element: torch's `native_dropout` keeps a bool mask.
const DROPOUT_MASK_BYTES_PER_ELEMENT: u64 = 1;

/// Where each activation's bytes live and which fused function it is part of.
struct Layout {
    /// The tensor that owns the storage a tensor is read from (itself, or a view's base).
    owner: BTreeMap<TensorId, TensorId>,
    /// Tensors read through a transposed (strided) view: a reshape of them copies.
    strided: BTreeSet<TensorId>,
    /// The one tensor a pointwise chain is a function of (itself where it is not one).
    source: BTreeMap<TensorId, TensorId>,
}

/// Bytes `model` keeps of one micro-batch's activations, as (node, bytes) charges: each kept
/// storage at the node that makes it, dropout masks and attention statistics at the node they
/// belong to. `attention_scores` are the nodes from each Q·Kᵀ up to the product with V
/// (what selective recomputation drops). [`MemoryModel::Onnx`] gives every node its outputs.
///
/// # Complexity
/// O(n log n) for n tensors.
pub fn engine_kept_bytes(
    graph: &Graph,
    model: MemoryModel,
    attention_scores: &BTreeSet<NodeId>,
) -> Result<Vec<(NodeId, u64)>, Error> {
    let mut charges = Vec::new();
    if model == MemoryModel::Onnx {
        for &id in graph.topological_order() {
            for &t in graph.node(id).outputs.iter().flatten() {
                charges.push((id, crate::model::tensor_bytes(graph, t)?));
            }
        }
        return Ok(charges);
    }
    let layout = Layout::new(graph, model, attention_scores);
    let mut kept: BTreeSet<TensorId> = BTreeSet::new();
    for &id in graph.topological_order() {
        let node = graph.node(id);
        let in_scores = attention_scores.contains(&id);
        if model == MemoryModel::Torch && in_scores {
            // SDPA keeps no score tensor, only its operands: Q and K here, V below.
            if node.op_type == "MatMul" {
                kept.extend(activation_inputs(graph, id).map(|t| layout.owner_of(t)));
            }
            continue;
        }
        let reads_scores = node.inputs.iter().flatten().any(|&t| {
            graph
                .tensor(t)
                .producer()
                .is_some_and(|p| attention_scores.contains(&p))
        });
        if model == MemoryModel::Torch && reads_scores && node.op_type == "MatMul" {
            charges.extend(sdpa_output(
                graph,
                id,
                attention_scores,
                &layout,
                &mut kept,
            )?);
            continue;
        }
        if let Some(bytes) = row_statistics_bytes(graph, id)? {
            charges.push((id, bytes));
        }
        for t in saved_by(graph, id, &layout) {
            kept.insert(layout.owner_of(t));
        }
        if model == MemoryModel::Megatron {
            charges.extend(dropout_bytes(graph, id, in_scores, &layout)?);
        }
    }
    for t in kept {
        if let Some(producer) = graph.tensor(t).producer() {
            charges.push((producer, crate::model::tensor_bytes(graph, t)?));
        }
    }
    Ok(charges)
}

/// A tensor computed at run time: not a weight, an input, a value known while planning or a
/// view of one of those (a tied head's transposed embedding is the embedding).
fn is_activation(graph: &Graph, t: TensorId) -> bool {
    let tensor = graph.tensor(t);
    match tensor.origin {
        TensorOrigin::Node { node, .. } if tensor.value.is_none() => {
            let node = graph.node(node);
            match node.inputs.first().copied().flatten() {
                Some(base) if VIEW_OPS.contains(&node.op_type.as_str()) => {
                    is_activation(graph, base)
                }
                _ => true,
            }
        }
        _ => false,
    }
}

fn activation_inputs(graph: &Graph, id: NodeId) -> impl Iterator<Item = TensorId> + '_ {
    graph
        .node(id)
        .inputs
        .iter()
        .flatten()
        .copied()
        .filter(move |&t| is_activation(graph, t))
}

impl Layout {
    /// The layout of every tensor. SDPA writes its output head-interleaved, (b, s, heads, d),
    /// so under the torch model merging the heads back is a view, not a copy.
    fn new(graph: &Graph, model: MemoryModel, attention_scores: &BTreeSet<NodeId>) -> Layout {
        let mut layout = Layout {
            owner: BTreeMap::new(),
            strided: BTreeSet::new(),
            source: BTreeMap::new(),
        };
        let attention_output = |id: NodeId| {
            model == MemoryModel::Torch
                && graph.node(id).op_type == "MatMul"
                && graph.node(id).inputs.iter().flatten().any(|&t| {
                    graph
                        .tensor(t)
                        .producer()
                        .is_some_and(|p| attention_scores.contains(&p))
                })
        };
        for &id in graph.topological_order() {
            let node = graph.node(id);
            let op = node.op_type.as_str();
            let first = node.inputs.first().copied().flatten();
            for &out in node.outputs.iter().flatten() {
                let base = first.filter(|&t| VIEW_OPS.contains(&op) && is_activation(graph, t));
                match base {
                    // torch's reshape of a transposed tensor copies it; other views share.
                    Some(base) if op != "Transpose" && layout.strided.contains(&base) => {}
                    Some(base) => {
                        let owner = layout.owner_of(base);
                        layout.owner.insert(out, owner);
                        let head_interleaved =
                            graph.tensor(owner).producer().is_some_and(attention_output);
                        if (op == "Transpose" && !head_interleaved)
                            || layout.strided.contains(&base)
                        {
                            layout.strided.insert(out);
                        }
                    }
                    None => {}
                }
                let source = layout.pointwise_source(graph, id).unwrap_or(out);
                layout.source.insert(out, source);
            }
        }
        layout
    }

    fn owner_of(&self, t: TensorId) -> TensorId {
        self.owner.get(&t).copied().unwrap_or(t)
    }

    fn source_of(&self, t: TensorId) -> TensorId {
        self.source.get(&t).copied().unwrap_or(t)
    }

    /// The one tensor a pointwise node is a function of, if all its activation operands (a
    /// `Where`'s condition aside) come from it.
    fn pointwise_source(&self, graph: &Graph, id: NodeId) -> Option<TensorId> {
        let node = graph.node(id);
        if !POINTWISE_OPS.contains(&node.op_type.as_str()) {
            return None;
        }
        let skip = usize::from(node.op_type == "Where");
        let mut sources = node
            .inputs
            .iter()
            .skip(skip)
            .flatten()
            .filter(|&&t| is_activation(graph, t))
            .map(|&t| self.source_of(t));
        let first = sources.next()?;
        sources.all(|s| s == first).then_some(first)
    }
}

/// The tensors node `id`'s backward reads, by its op's autograd formula.
fn saved_by(graph: &Graph, id: NodeId, layout: &Layout) -> Vec<TensorId> {
    let node = graph.node(id);
    let op = node.op_type.as_str();
    let input = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .filter(|&t| is_activation(graph, t))
    };
    if NORMALIZATIONS.contains(&op) {
        return input(0).into_iter().collect();
    }
    match op {
        "Softmax" | "LogSoftmax" => {
            return node.outputs.iter().flatten().take(1).copied().collect()
        }
        "Where" => return input(0).into_iter().collect(),
        "Gather" | "GatherElements" | "GatherND" => return input(1).into_iter().collect(),
        _ => {}
    }
    if VIEW_OPS.contains(&op) {
        return Vec::new();
    }
    let Some(&out) = node.outputs.iter().flatten().next() else {
        return Vec::new();
    };
    let fused_source = layout.pointwise_source(graph, id);
    match fused_source {
        // Linear in its one activation: the gradient needs no tensor (a bias's needs none).
        Some(_) if is_linear_pointwise(graph, id) => Vec::new(),
        // A fused function of one tensor recomputes its inside from that tensor.
        Some(source) if source != out => vec![source],
        _ if SAVES_NOTHING.contains(&op) => Vec::new(),
        // Anything else (products, convolutions, unknown ops) keeps its activation inputs.
        _ => activation_inputs(graph, id).collect(),
    }
}

/// The fp32 statistics a normalization keeps per row of its input: a LayerNorm its mean and
/// inverse deviation (8 bytes), an RMS norm its inverse root mean square (4 bytes).
fn row_statistics_bytes(graph: &Graph, id: NodeId) -> Result<Option<u64>, Error> {
    let node = graph.node(id);
    let per_row = match node.op_type.as_str() {
        "LayerNormalization" => 8,
        "SimplifiedLayerNormalization" | "RMSNormalization" => 4,
        _ => return Ok(None),
    };
    let Some(input) = node.inputs.first().copied().flatten() else {
        return Ok(None);
    };
    let shape = graph.concrete_shape(input)?;
    Ok(Some(shape.iter().rev().skip(1).product::<u64>() * per_row))
}

/// Whether a pointwise node is linear in its activation operand: sums, negation, casts, and
/// products or quotients by a value known while planning (not a weight, whose gradient would
/// read the activation).
fn is_linear_pointwise(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let known = |t: &TensorId| graph.tensor(*t).value.is_some();
    match node.op_type.as_str() {
        "Add" | "Sub" | "Neg" | "Cast" | "Where" => true,
        "Mul" => node.inputs.iter().flatten().any(known),
        "Div" => node
            .inputs
            .get(1)
            .copied()
            .flatten()
            .is_some_and(|t| known(&t)),
        _ => false,
    }
}

/// Torch's SDPA in place of the product of the scores with V: it keeps V, its output and the
/// log-sum-exp of each score row (fp32).
fn sdpa_output(
    graph: &Graph,
    id: NodeId,
    attention_scores: &BTreeSet<NodeId>,
    layout: &Layout,
    kept: &mut BTreeSet<TensorId>,
) -> Result<Vec<(NodeId, u64)>, Error> {
    let node = graph.node(id);
    let mut charges = Vec::new();
    for t in activation_inputs(graph, id) {
        let from_scores = graph
            .tensor(t)
            .producer()
            .is_some_and(|p| attention_scores.contains(&p));
        match from_scores {
            true => {
                // One fp32 statistic per score row: the scores' elements over the row length.
                let shape = graph.concrete_shape(t)?;
                let rows: u64 = shape.iter().rev().skip(1).product();
                charges.push((id, rows * 4));
            }
            false => {
                kept.insert(layout.owner_of(t));
            }
        }
    }
    if let Some(&out) = node.outputs.iter().flatten().next() {
        kept.insert(out);
    }
    Ok(charges)
}

/// Megatron's dropout: a mask and the dropped probabilities after each attention softmax, a
/// mask after each block's output (the residual add of a linear layer's result).
fn dropout_bytes(
    graph: &Graph,
    id: NodeId,
    in_scores: bool,
    layout: &Layout,
) -> Result<Vec<(NodeId, u64)>, Error> {
    let node = graph.node(id);
    let Some(&out) = node.outputs.iter().flatten().next() else {
        return Ok(Vec::new());
    };
    let elements = || -> Result<u64, Error> { Ok(graph.concrete_shape(out)?.iter().product()) };
    let attention_dropout = in_scores && node.op_type == "Softmax";
    let hidden_dropout = node.op_type == "Add" && is_residual_add(graph, id, layout);
    if attention_dropout {
        let element_bytes = graph
            .tensor(out)
            .dtype
            .and_then(|d| d.bytes_for(1))
            .unwrap_or(2);
        return Ok(vec![(
            id,
            elements()? * (DROPOUT_MASK_BYTES_PER_ELEMENT + element_bytes),
        )]);
    }
    if hidden_dropout {
        return Ok(vec![(id, elements()? * DROPOUT_MASK_BYTES_PER_ELEMENT)]);
    }
    Ok(Vec::new())
}

/// An add of two different activations, one of them a linear layer's output (through its bias
/// add): a block's output joining the residual stream.
fn is_residual_add(graph: &Graph, id: NodeId, layout: &Layout) -> bool {
    let operands: Vec<TensorId> = activation_inputs(graph, id).collect();
    operands.len() == 2
        && layout.source_of(operands[0]) != layout.source_of(operands[1])
        && operands.iter().any(|&t| is_linear_output(graph, t))
}

fn is_linear_output(graph: &Graph, t: TensorId) -> bool {
    let Some(producer) = graph.tensor(t).producer() else {
        return false;
    };
    let node = graph.node(producer);
    let has_weight = node
        .inputs
        .iter()
        .flatten()
        .any(|&i| graph.tensor(i).param().is_some());
    match node.op_type.as_str() {
        "MatMul" | "Gemm" => has_weight,
        "Add" if has_weight => {
            activation_inputs(graph, producer).any(|i| is_linear_output(graph, i))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_ir::graph::{ConstValue, DType, Dim, NodeSpec, Param, Storage, SymInt};

    /// x[8, 64] → MatMul W1 → a → GELU as exported (x/√2, Erf, +1, a·…, ·0.5) → g → MatMul W2
    /// → Transpose → Reshape → y, fp32.
    fn gelu_mlp() -> Graph {
        let mut b = Graph::builder("mlp");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![Dim::Known(8), Dim::Known(64)]),
        )
        .unwrap();
        let weight = Param {
            bytes: 64 * 64 * 4,
            storage: Storage::Declared,
        };
        for w in ["w1", "w2"] {
            b.parameter(w, DType::F32, &[64, 64], weight.clone(), None)
                .unwrap();
        }
        for (name, value) in [("root2", 2f64.sqrt()), ("one", 1.0), ("half", 0.5)] {
            let param = Param {
                bytes: 4,
                storage: Storage::Declared,
            };
            let value = Some(ConstValue::Floats(vec![value]));
            b.parameter(name, DType::F32, &[], param, value).unwrap();
        }
        b.parameter(
            "shape",
            DType::I64,
            &[2],
            Param {
                bytes: 16,
                storage: Storage::Declared,
            },
            Some(ConstValue::Ints(vec![SymInt::Lit(8), SymInt::Lit(64)])),
        )
        .unwrap();
        for (op, inputs, output) in [
            ("MatMul", &["x", "w1"][..], "a"),
            ("Div", &["a", "root2"], "d"),
            ("Erf", &["d"], "e"),
            ("Add", &["e", "one"], "p"),
            ("Mul", &["a", "p"], "m"),
            ("Mul", &["m", "half"], "g"),
            ("MatMul", &["g", "w2"], "o"),
            ("Transpose", &["o"], "t"),
            ("Reshape", &["t", "shape"], "y"),
        ] {
            b.node(NodeSpec::new(&format!("/{output}"), op, inputs, &[output]))
                .unwrap();
        }
        b.output("y");
        let mut graph = b.build().unwrap();
        pipecut_ir::onnx::shape::ShapeInference::new(Default::default())
            .run(&mut graph)
            .unwrap();
        graph
    }

    fn total(graph: &Graph, model: MemoryModel) -> u64 {
        engine_kept_bytes(graph, model, &BTreeSet::new())
            .unwrap()
            .iter()
            .map(|(_, bytes)| bytes)
            .sum()
    }

    #[test]
    fn an_exported_gelu_keeps_its_input_and_views_keep_nothing() {
        let graph = gelu_mlp();
        let tensor = 8 * 64 * 4;
        // The GELU's input a (the function's one source) and its output g (the second
        // MatMul's input); the GELU's insides, o, and o's views are read by no backward.
        assert_eq!(total(&graph, MemoryModel::Torch), 2 * tensor);
        assert_eq!(total(&graph, MemoryModel::Megatron), 2 * tensor);
        // The graph as exported keeps all nine outputs.
        assert_eq!(total(&graph, MemoryModel::Onnx), 9 * tensor);
    }

    #[test]
    fn memory_models_parse_print_and_default_to_onnx() {
        for model in [MemoryModel::Onnx, MemoryModel::Torch, MemoryModel::Megatron] {
            assert_eq!(model.name().parse::<MemoryModel>(), Ok(model));
            let json = serde_json::to_string(&model).unwrap();
            assert_eq!(json, format!("\"{}\"", model.name()));
        }
        assert_eq!(MemoryModel::default(), MemoryModel::Onnx);
        let err = "jax".parse::<MemoryModel>().unwrap_err();
        assert!(
            err.contains("'jax'") && err.contains("torch, megatron or onnx"),
            "{err}"
        );
    }
}
