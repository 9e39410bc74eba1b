//! What one rank of a tensor-parallel group holds: for each block of
//! [`super::tensor_parallel::TensorParallelBlocks`] that splits at degree t, which axis of each
//! tensor between its column and row linears is split, which slices of which weights a rank
//! keeps, and which shape constants change — or why the block stays whole (replicated).
//!
//! The split is propagated **backward from the row linear's input**: rank r holds rows
//! `[r·K/t, (r+1)·K/t)` of the row weight, so it needs those columns of the row's input, and each
//! node between asks of its inputs exactly what it needs to make its share of its output
//! (elementwise ops the same axis, broadcast operands too unless broadcast along it, Transpose
//! the permuted axis, Reshape the axis that starts at the same flat offset, a Split along the
//! split axis a share of each part, the product of two activations its batch axis). The walk
//! ends at the column linears, whose weight columns follow, and at weights read on the way
//! (biases, scales), which are sliced the same way. An axis is described as `groups` equal runs,
//! each cut in t pieces, rank r keeping piece r of every run: one run for a plain column weight,
//! three for a fused QKV weight split into its parts.
//!
//! Anything the walk does not understand — an op it has no rule for, a slice across the split
//! axis, an activation from outside the block that would have to be split, a shape unknown at
//! plan time — leaves the block replicated on every rank, with the reason: a wrong graph is never
//! made. Shapes are those of the bound dims (the micro-batch), since a Reshape's target is
//! rewritten as a constant.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::tensor_parallel::{ShardableBlock, TensorParallelBlocks, VocabRole, VocabShard};
use pipecut_ir::graph::{Attribute, Graph, NodeId, TensorId, TensorOrigin};

/// How a tensor is split over the ranks: along `axis`, seen as `groups` equal runs, each cut
/// into t pieces; rank r holds piece r of every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisSplit {
    /// The split axis.
    pub axis: usize,
    /// Equal runs along the axis, each split separately (3 for a fused QKV projection).
    pub groups: u64,
}

impl AxisSplit {
    /// The index ranges along an axis of `size` that rank `rank` of `degree` holds, in order.
    pub fn ranges(&self, size: u64, degree: u64, rank: u64) -> Vec<Range<u64>> {
        let run = size / self.groups;
        let piece = run / degree;
        (0..self.groups)
            .map(|g| {
                let start = g * run + rank * piece;
                start..start + piece
            })
            .collect()
    }

    /// Whether an axis of `size` splits evenly.
    fn divides(&self, size: u64, degree: u64) -> bool {
        self.groups > 0 && size.is_multiple_of(self.groups * degree)
    }
}

/// A weight a rank holds a slice of, and the nodes (with input slot) that read the slice.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightSlice {
    /// The parameter.
    pub param: TensorId,
    /// How it is split.
    pub split: AxisSplit,
    /// `(node, input slot)` reading the slice instead of the whole weight.
    pub readers: Vec<(NodeId, usize)>,
}

/// A shape-carrying input (a Reshape's or Expand's target, a Split's sizes) replaced by a
/// constant for the split shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeConstant {
    /// The node.
    pub node: NodeId,
    /// Its input slot.
    pub slot: usize,
    /// The new value (int64).
    pub values: Vec<i64>,
}

/// A block every rank runs its share of.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitBlock {
    /// Every node of the block (columns, the nodes between, the row).
    pub nodes: Vec<NodeId>,
    /// The row linear.
    pub row: NodeId,
    /// The row linear's output, all-reduced.
    pub reduced: TensorId,
    /// The weights sliced.
    pub weights: Vec<WeightSlice>,
    /// The shape inputs rewritten.
    pub shapes: Vec<ShapeConstant>,
    /// The split of every tensor between the columns and the row.
    pub tensors: BTreeMap<TensorId, AxisSplit>,
}

/// A block left whole on every rank, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicatedBlock {
    /// The row linear.
    pub row: NodeId,
    /// Why it is not split.
    pub reason: String,
}

/// What each rank of a group of `degree` holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardLayout {
    /// The group size t.
    pub degree: u64,
    /// Blocks split t ways.
    pub split: Vec<SplitBlock>,
    /// Blocks left whole.
    pub replicated: Vec<ReplicatedBlock>,
    /// Embeddings split by rows and language-model heads split by columns.
    pub vocab: Vec<VocabSlice>,
}

/// An embedding or head split by its vocabulary: rank r holds entries `[r·V/t, (r+1)·V/t)`.
#[derive(Debug, Clone, PartialEq)]
pub struct VocabSlice {
    /// Embedding (a Gather of rows, summed by an all-reduce: a rank contributes zeros for ids
    /// outside its rows) or head (a MatMul whose logits columns are gathered).
    pub role: VocabRole,
    /// The Gather or MatMul.
    pub node: NodeId,
    /// The weight, and the node and slot that read it (the head's Transpose of a tied table).
    pub param: TensorId,
    /// The reader of the weight.
    pub reader: (NodeId, usize),
    /// The weight's vocabulary axis.
    pub axis: usize,
    /// Vocabulary size V.
    pub vocab: u64,
    /// V padded to a multiple of t, as Megatron-LM pads it: each rank holds `padded / t`
    /// entries, the last ranks' past V zeros.
    pub padded: u64,
    /// The output the collective completes.
    pub output: TensorId,
}

impl VocabSlice {
    /// The weight's split (of the padded weight).
    pub fn split(&self) -> AxisSplit {
        AxisSplit {
            axis: self.axis,
            groups: 1,
        }
    }

    /// The entries of the model's own V that rank `rank` of `degree` holds (empty for a rank
    /// that holds only padding).
    pub fn held(&self, degree: u64, rank: u64) -> Range<u64> {
        let per_rank = self.padded / degree;
        let start = (rank * per_rank).min(self.vocab);
        start..((rank + 1) * per_rank).min(self.vocab)
    }
}

impl ShardLayout {
    /// The layout of `graph` (shapes inferred with every dim bound) split `degree` ways.
    pub fn new(graph: &Graph, blocks: &TensorParallelBlocks, degree: u64) -> ShardLayout {
        let mut layout = ShardLayout {
            degree,
            split: Vec::new(),
            replicated: Vec::new(),
            vocab: blocks
                .vocab
                .iter()
                .filter_map(|v| vocab_slice(graph, v, degree))
                .collect(),
        };
        let mut sliced: BTreeSet<TensorId> = BTreeSet::new();
        for block in &blocks.blocks {
            let outcome = if block.splits_at(degree) {
                Walk::new(graph, block, degree).run()
            } else {
                Err(format!(
                    "its widths and heads do not split {degree} ways (widest degree {})",
                    block.widest_degree
                ))
            };
            // Two blocks slicing one weight (tied) would each need their own slice of it.
            let outcome =
                outcome.and_then(
                    |b| match b.weights.iter().find(|w| sliced.contains(&w.param)) {
                        Some(w) => Err(format!(
                            "weight '{}' is sliced by another block too",
                            graph.tensor(w.param).name
                        )),
                        None => Ok(b),
                    },
                );
            match outcome {
                Ok(split) => {
                    sliced.extend(split.weights.iter().map(|w| w.param));
                    layout.split.push(split);
                }
                Err(reason) => layout.replicated.push(ReplicatedBlock {
                    row: block.row,
                    reason,
                }),
            }
        }
        layout
    }
}

impl ShardLayout {
    /// The blocks that lie wholly inside `stage` (its nodes); a block cut between two stages
    /// stays whole, and so do the blocks of other stages, which this one does not run.
    pub fn within(&self, stage: &BTreeSet<NodeId>) -> ShardLayout {
        let mut layout = ShardLayout {
            degree: self.degree,
            split: Vec::new(),
            replicated: Vec::new(),
            vocab: self
                .vocab
                .iter()
                .filter(|v| stage.contains(&v.node) && stage.contains(&v.reader.0))
                .cloned()
                .collect(),
        };
        for block in &self.split {
            let inside = block.nodes.iter().filter(|n| stage.contains(n)).count();
            if inside == block.nodes.len() {
                layout.split.push(block.clone());
            } else if inside > 0 {
                layout.replicated.push(ReplicatedBlock {
                    row: block.row,
                    reason: "it is cut between two pipeline stages".into(),
                });
            }
        }
        layout.replicated.extend(
            self.replicated
                .iter()
                .filter(|b| stage.contains(&b.row))
                .cloned(),
        );
        layout
    }
}

/// `shard` as a vocabulary split at `degree`, when it is one this rewrite makes: an embedding
/// reading its table directly, a MatMul head reading its weight directly or through one
/// Transpose that nothing else reads. A vocabulary `degree` does not divide is padded.
fn vocab_slice(graph: &Graph, shard: &VocabShard, degree: u64) -> Option<VocabSlice> {
    if degree < 2 {
        return None;
    }
    let node = shard.nodes[0];
    let n = graph.node(node);
    let output = n.outputs.first().copied().flatten()?;
    let weight = n
        .inputs
        .get(if shard.role == VocabRole::Embedding {
            0
        } else {
            1
        })?
        .to_owned()?;
    let is_param = |t: TensorId| graph.tensor(t).param().is_some();
    let (param, reader, axis) = match shard.role {
        VocabRole::Embedding => (weight, (node, 0), 0),
        VocabRole::Head if n.op_type != "MatMul" => return None,
        VocabRole::Head if is_param(weight) => (weight, (node, 1), 1),
        VocabRole::Head => {
            let transpose = graph.tensor(weight).producer()?;
            let t = graph.node(transpose);
            let perm = ints_attr(graph, transpose, "perm").unwrap_or_else(|| vec![1, 0]);
            let source = t.inputs.first().copied().flatten()?;
            let single_reader = graph.tensor(weight).consumers == [node];
            if t.op_type != "Transpose" || perm != [1, 0] || !is_param(source) || !single_reader {
                return None;
            }
            (source, (transpose, 0), 0)
        }
    };
    let shape = shape_of(graph, param).ok()?;
    (shape.len() == 2 && shape[axis] == shard.vocab).then_some(VocabSlice {
        role: shard.role,
        node,
        param,
        reader,
        axis,
        vocab: shard.vocab,
        padded: shard.vocab.div_ceil(degree) * degree,
        output,
    })
}

/// What a node needs of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Whole,
    Split(AxisSplit),
}

/// The backward walk over one block.
struct Walk<'a> {
    graph: &'a Graph,
    block: &'a ShardableBlock,
    degree: u64,
    /// Nodes between the columns and the row.
    region: BTreeSet<NodeId>,
    tensors: BTreeMap<TensorId, AxisSplit>,
    weights: BTreeMap<TensorId, WeightSlice>,
    shapes: Vec<ShapeConstant>,
    visited: BTreeSet<NodeId>,
    pending: Vec<TensorId>,
}

type Outcome<T> = Result<T, String>;

/// Why `node` cannot be split: its op is not understood on a split axis.
fn not_understood(graph: &Graph, node: NodeId) -> String {
    let n = graph.node(node);
    format!(
        "'{}' ({}) is not understood on a split axis",
        n.name, n.op_type
    )
}

fn shape_of(graph: &Graph, tensor: TensorId) -> Outcome<Vec<u64>> {
    let t = graph.tensor(tensor);
    t.shape
        .as_ref()
        .and_then(|s| s.iter().map(|d| d.known()).collect::<Option<Vec<u64>>>())
        .ok_or_else(|| format!("the shape of '{}' is not known at plan time", t.name))
}

fn int_attr(graph: &Graph, node: NodeId, name: &str) -> Option<i64> {
    match graph.node(node).attributes.get(name) {
        Some(Attribute::Int(v)) => Some(*v),
        _ => None,
    }
}

fn ints_attr(graph: &Graph, node: NodeId, name: &str) -> Option<Vec<i64>> {
    match graph.node(node).attributes.get(name) {
        Some(Attribute::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

/// A Gemm's `transA` / `transB`: whether that operand is read transposed.
pub(crate) fn gemm_flag(graph: &Graph, node: NodeId, name: &str) -> bool {
    int_attr(graph, node, name).unwrap_or(0) != 0
}

fn normalize(axis: i64, rank: usize) -> Outcome<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64)
        .contains(&a)
        .then_some(a as usize)
        .ok_or_else(|| format!("axis {axis} out of range for rank {rank}"))
}

/// Ops that work on every element independently (broadcasting their operands).
fn elementwise(op: &str) -> bool {
    matches!(
        op,
        "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Pow"
            | "Where"
            | "Neg"
            | "Erf"
            | "Sigmoid"
            | "Tanh"
            | "Relu"
            | "Gelu"
            | "FastGelu"
            | "Exp"
            | "Log"
            | "Sqrt"
            | "Reciprocal"
            | "Abs"
            | "Cast"
            | "Identity"
            | "Max"
            | "Min"
            | "Sin"
            | "Cos"
            | "HardSigmoid"
            | "LeakyRelu"
            | "Elu"
            | "Selu"
            | "Softplus"
            | "Clip"
            | "Equal"
            | "Less"
            | "Greater"
            | "Not"
            | "And"
            | "Or"
            | "IsNaN"
    )
}

impl<'a> Walk<'a> {
    fn new(graph: &'a Graph, block: &'a ShardableBlock, degree: u64) -> Walk<'a> {
        let mut region: BTreeSet<NodeId> = block.nodes.iter().copied().collect();
        region.remove(&block.row);
        for c in &block.columns {
            region.remove(c);
        }
        // Nodes that only prepare a weight (a tied weight's Transpose) are not between.
        region.retain(|&n| {
            graph.node(n).inputs.iter().flatten().any(|&t| {
                graph
                    .tensor(t)
                    .producer()
                    .is_some_and(|p| block.columns.contains(&p) || block.nodes.contains(&p))
            })
        });
        Walk {
            graph,
            block,
            degree,
            region,
            tensors: BTreeMap::new(),
            weights: BTreeMap::new(),
            shapes: Vec::new(),
            visited: BTreeSet::new(),
            pending: Vec::new(),
        }
    }

    fn run(mut self) -> Outcome<SplitBlock> {
        let graph = self.graph;
        let row = graph.node(self.block.row);
        let input = row.inputs[0].ok_or("the row linear has no input")?;
        let rank = shape_of(graph, input)?.len();
        // Rank r holds a share of the inner (reduced) axis: the input's last axis and the
        // weight's first (a Gemm's transposed operands swap them; its bias, added once after
        // the all-reduce, stays whole).
        let (input_axis, weight_axis) = match row.op_type.as_str() {
            "MatMul" => (rank - 1, 0),
            "Gemm" => (
                usize::from(!gemm_flag(graph, self.block.row, "transA")),
                usize::from(gemm_flag(graph, self.block.row, "transB")),
            ),
            op => return Err(format!("its row linear is a {op} (not a MatMul or Gemm)")),
        };
        let split = AxisSplit {
            axis: input_axis,
            groups: 1,
        };
        self.require(input, split)?;
        self.slice_weight(self.block.row, 1, weight_axis, split)?;
        while let Some(tensor) = self.pending.pop() {
            self.backward(tensor)?;
        }
        if let Some(&n) = self.region.iter().find(|n| !self.visited.contains(n)) {
            return Err(format!(
                "'{}' ({}) does not lead to the row linear",
                graph.node(n).name,
                graph.node(n).op_type
            ));
        }
        Ok(SplitBlock {
            nodes: self.block.nodes.clone(),
            row: self.block.row,
            reduced: self.block.reduced,
            weights: self.weights.into_values().collect(),
            shapes: self.shapes,
            tensors: self.tensors,
        })
    }

    /// Records that rank r needs its share of `tensor`; refuses two different splits.
    fn require(&mut self, tensor: TensorId, split: AxisSplit) -> Outcome<()> {
        let size = shape_of(self.graph, tensor)?[split.axis];
        if !split.divides(size, self.degree) {
            return Err(format!(
                "axis {} of '{}' ({size}) does not split {} ways",
                split.axis,
                self.graph.tensor(tensor).name,
                self.degree
            ));
        }
        match self.tensors.get(&tensor) {
            Some(s) if *s == split => Ok(()),
            Some(s) => Err(format!(
                "'{}' would be split two ways ({s:?} and {split:?})",
                self.graph.tensor(tensor).name
            )),
            None => {
                self.tensors.insert(tensor, split);
                self.pending.push(tensor);
                Ok(())
            }
        }
    }

    /// Rank r reads its slice of the weight at `node`'s input `slot`, split along `axis`.
    fn slice_weight(
        &mut self,
        node: NodeId,
        slot: usize,
        axis: usize,
        split: AxisSplit,
    ) -> Outcome<()> {
        let graph = self.graph;
        let param = graph.node(node).inputs.get(slot).copied().flatten();
        let param = param.ok_or("a linear without its weight")?;
        let tensor = graph.tensor(param);
        if tensor.param().is_none() {
            return Err(format!(
                "'{}' reads its weight through another node",
                graph.node(node).name
            ));
        }
        let split = AxisSplit { axis, ..split };
        let size = shape_of(graph, param)?[axis];
        if !split.divides(size, self.degree) {
            return Err(format!(
                "weight '{}' does not split {} ways",
                tensor.name, self.degree
            ));
        }
        let entry = self.weights.entry(param).or_insert(WeightSlice {
            param,
            split,
            readers: Vec::new(),
        });
        if entry.split != split {
            return Err(format!("weight '{}' would be split two ways", tensor.name));
        }
        entry.readers.push((node, slot));
        Ok(())
    }

    /// Derives what the producer of `tensor` needs of its inputs.
    fn backward(&mut self, tensor: TensorId) -> Outcome<()> {
        let graph = self.graph;
        let split = self.tensors[&tensor];
        let TensorOrigin::Node { node, output } = graph.tensor(tensor).origin else {
            return Err(format!(
                "'{}' comes from outside the block",
                graph.tensor(tensor).name
            ));
        };
        if self.block.columns.contains(&node) {
            return self.column(node, split);
        }
        if !self.region.contains(&node) {
            return Err(format!(
                "'{}' comes from outside the block",
                graph.tensor(tensor).name
            ));
        }
        self.visited.insert(node);
        let needs = self.needs(node, output, split)?;
        for (slot, need) in needs {
            self.give(node, slot, need)?;
        }
        Ok(())
    }

    /// A column linear whose output rank r holds `split` of: its weight's columns.
    fn column(&mut self, node: NodeId, split: AxisSplit) -> Outcome<()> {
        let graph = self.graph;
        let n = graph.node(node);
        let out_rank = shape_of(graph, n.outputs[0].ok_or("no output")?)?.len();
        if split.axis != out_rank - 1 {
            return Err(format!(
                "the column linear '{}' would be split along its rows",
                n.name
            ));
        }
        match n.op_type.as_str() {
            "MatMul" => self.slice_weight(node, 1, 1, split),
            "Gemm" => {
                let b_axis = usize::from(!gemm_flag(graph, node, "transB"));
                self.slice_weight(node, 1, b_axis, split)?;
                self.gemm_bias(node, split)
            }
            _ => Err(format!(
                "its column linear '{}' is a {} (not a MatMul or Gemm)",
                n.name, n.op_type
            )),
        }
    }

    /// A column Gemm's bias C, broadcast to its [M, N] output: sliced along N unless it is
    /// broadcast along it (a scalar, [M, 1]).
    fn gemm_bias(&mut self, node: NodeId, split: AxisSplit) -> Outcome<()> {
        let graph = self.graph;
        let Some(bias) = graph.node(node).inputs.get(2).copied().flatten() else {
            return Ok(());
        };
        let out = shape_of(graph, graph.node(node).outputs[0].ok_or("no output")?)?;
        match self.broadcast(bias, &out, split)? {
            Need::Whole => Ok(()),
            Need::Split(s) if graph.tensor(bias).param().is_some() => {
                self.slice_weight(node, 2, s.axis, s)
            }
            Need::Split(_) => Err(format!(
                "the bias of '{}' is computed, not a weight",
                graph.node(node).name
            )),
        }
    }

    /// Passes a need to input `slot` of `node`.
    fn give(&mut self, node: NodeId, slot: usize, need: Need) -> Outcome<()> {
        let graph = self.graph;
        let Some(input) = graph.node(node).inputs.get(slot).copied().flatten() else {
            return Ok(());
        };
        let from_block = graph
            .tensor(input)
            .producer()
            .is_some_and(|p| self.region.contains(&p) || self.block.columns.contains(&p));
        match (need, from_block) {
            (Need::Whole, false) => Ok(()),
            (Need::Whole, true) => Err(format!(
                "'{}' ({}) needs the whole of '{}'",
                graph.node(node).name,
                graph.node(node).op_type,
                graph.tensor(input).name
            )),
            (Need::Split(split), true) => self.require(input, split),
            (Need::Split(split), false) if graph.tensor(input).param().is_some() => {
                self.slice_weight(node, slot, split.axis, split)
            }
            (Need::Split(_), false) => Err(format!(
                "'{}' from outside the block would have to be split",
                graph.tensor(input).name
            )),
        }
    }

    /// What `node` needs of each input slot to make rank r's share `split` of output `output`:
    /// one rule per op family, the larger ones in methods of their own.
    fn needs(
        &mut self,
        node: NodeId,
        output: usize,
        split: AxisSplit,
    ) -> Outcome<Vec<(usize, Need)>> {
        let graph = self.graph;
        let n = graph.node(node);
        let out = shape_of(graph, n.outputs[output].ok_or("no output")?)?;
        let a = split.axis;
        let op = n.op_type.as_str();
        if elementwise(op) || matches!(op, "Softmax" | "LogSoftmax") {
            return self.elementwise_needs(node, &out, split);
        }
        match op {
            "Transpose" => {
                let perm = ints_attr(graph, node, "perm")
                    .unwrap_or_else(|| (0..out.len() as i64).rev().collect());
                let axis = normalize(perm[a], out.len())?;
                Ok(vec![(0, Need::Split(AxisSplit { axis, ..split }))])
            }
            "Reshape" => {
                let input = shape_of(graph, n.inputs[0].ok_or("no input")?)?;
                let axis =
                    reshape_axis(&input, &out, a).ok_or_else(|| not_understood(graph, node))?;
                self.constant(node, 1, &out, split)?;
                Ok(vec![
                    (0, Need::Split(AxisSplit { axis, ..split })),
                    (1, Need::Whole),
                ])
            }
            "Expand" => {
                let input = n.inputs[0].ok_or("no input")?;
                let need = self.broadcast(input, &out, split)?;
                self.constant(node, 1, &out, split)?;
                Ok(vec![(0, need), (1, Need::Whole)])
            }
            "Unsqueeze" | "Squeeze" => self.squeeze_needs(node, &out, split),
            "Split" => self.split_needs(node, &out, split),
            "Slice" => self.slice_needs(node, &out, split),
            "Concat" => {
                let axis = normalize(int_attr(graph, node, "axis").unwrap_or(0), out.len())?;
                if axis == a {
                    return Err(format!("'{}' concatenates along the split axis", n.name));
                }
                Ok((0..n.inputs.len())
                    .map(|s| (s, Need::Split(split)))
                    .collect())
            }
            "MatMul" => self.product(node, &out, split),
            _ => Err(not_understood(graph, node)),
        }
    }

    /// An element-wise op (or a softmax along another axis): each operand as it broadcasts.
    fn elementwise_needs(
        &mut self,
        node: NodeId,
        out: &[u64],
        split: AxisSplit,
    ) -> Outcome<Vec<(usize, Need)>> {
        let graph = self.graph;
        let n = graph.node(node);
        if matches!(n.op_type.as_str(), "Softmax" | "LogSoftmax") {
            let axis = normalize(int_attr(graph, node, "axis").unwrap_or(-1), out.len())?;
            if axis == split.axis {
                return Err(format!("'{}' normalizes along the split axis", n.name));
            }
        }
        let mut needs = Vec::new();
        for (slot, input) in n.inputs.iter().enumerate() {
            let Some(input) = input else { continue };
            needs.push((slot, self.broadcast(*input, out, split)?));
        }
        Ok(needs)
    }

    /// Unsqueeze or Squeeze: the split axis where it is in the input, its axes whole.
    fn squeeze_needs(
        &mut self,
        node: NodeId,
        out: &[u64],
        split: AxisSplit,
    ) -> Outcome<Vec<(usize, Need)>> {
        let graph = self.graph;
        let n = graph.node(node);
        let a = split.axis;
        let input = shape_of(graph, n.inputs[0].ok_or("no input")?)?;
        let axes = self.axes(node)?;
        let axis = if n.op_type == "Unsqueeze" {
            let axes: Vec<usize> = axes
                .iter()
                .map(|&x| normalize(x, out.len()))
                .collect::<Outcome<_>>()?;
            if axes.contains(&a) {
                return Err(not_understood(graph, node));
            }
            a - axes.iter().filter(|&&x| x < a).count()
        } else {
            let axes: Vec<usize> = match axes.is_empty() {
                true => (0..input.len()).filter(|&i| input[i] == 1).collect(),
                false => axes
                    .iter()
                    .map(|&x| normalize(x, input.len()))
                    .collect::<Outcome<_>>()?,
            };
            (0..input.len())
                .filter(|i| !axes.contains(i))
                .nth(a)
                .ok_or_else(|| not_understood(graph, node))?
        };
        Ok(vec![
            (0, Need::Split(AxisSplit { axis, ..split })),
            (1, Need::Whole),
        ])
    }

    /// Split: along another axis, its input split alike; along the split axis, each part
    /// split, so the input holds a share of every part (its sizes made constants).
    fn split_needs(
        &mut self,
        node: NodeId,
        out: &[u64],
        split: AxisSplit,
    ) -> Outcome<Vec<(usize, Need)>> {
        let graph = self.graph;
        let n = graph.node(node);
        let a = split.axis;
        let axis = normalize(int_attr(graph, node, "axis").unwrap_or(0), out.len())?;
        if axis != a {
            return Ok(vec![(0, Need::Split(split)), (1, Need::Whole)]);
        }
        // Each part split: the input holds a share of every part.
        let parts = n.outputs.len() as u64;
        if ints_attr(graph, node, "split").is_some() {
            return Err(format!("'{}' gives its sizes as an attribute", n.name));
        }
        let input = shape_of(graph, n.inputs[0].ok_or("no input")?)?;
        if input[a] != out[a] * parts {
            return Err(format!("'{}' splits into unequal parts", n.name));
        }
        if n.inputs.get(1).copied().flatten().is_some() {
            let piece = (out[a] / self.degree) as i64;
            self.shapes.push(ShapeConstant {
                node,
                slot: 1,
                values: vec![piece; parts as usize],
            });
        }
        let groups = split.groups * parts;
        Ok(vec![
            (0, Need::Split(AxisSplit { axis, groups })),
            (1, Need::Whole),
        ])
    }

    /// Slice: its input split alike, unless it cuts along the split axis.
    fn slice_needs(
        &mut self,
        node: NodeId,
        out: &[u64],
        split: AxisSplit,
    ) -> Outcome<Vec<(usize, Need)>> {
        let graph = self.graph;
        let n = graph.node(node);
        let a = split.axis;
        let input = shape_of(graph, n.inputs[0].ok_or("no input")?)?;
        let axes = match n.inputs.get(3).copied().flatten() {
            Some(t) => self.values(t)?,
            None => (0..input.len() as i64).collect(),
        };
        for (i, &x) in axes.iter().enumerate() {
            if normalize(x, input.len())? == a {
                let starts = self.values(n.inputs[1].ok_or("no starts")?)?;
                if starts[i] != 0 || out[a] != input[a] {
                    return Err(format!("'{}' slices along the split axis", n.name));
                }
            }
        }
        Ok(vec![(0, Need::Split(split))])
    }

    /// What an operand broadcast to `out` needs: the same axis, or all of it where it is
    /// broadcast along the split axis.
    fn broadcast(&self, input: TensorId, out: &[u64], split: AxisSplit) -> Outcome<Need> {
        let shape = shape_of(self.graph, input)?;
        let offset = out.len() as i64 - shape.len() as i64;
        let axis = split.axis as i64 - offset;
        if axis < 0 || shape[axis as usize] == 1 {
            return Ok(Need::Whole);
        }
        if shape[axis as usize] != out[split.axis] {
            return Err(format!(
                "'{}' broadcasts unevenly",
                self.graph.tensor(input).name
            ));
        }
        Ok(Need::Split(AxisSplit {
            axis: axis as usize,
            ..split
        }))
    }

    /// The product of two activations: the split axis a batch axis (the heads), the rows of
    /// the first or the columns of the second.
    fn product(&self, node: NodeId, out: &[u64], split: AxisSplit) -> Outcome<Vec<(usize, Need)>> {
        let n = self.graph.node(node);
        let (a_in, b_in) = (
            n.inputs[0].ok_or("no input")?,
            n.inputs[1].ok_or("no input")?,
        );
        let (ra, rb) = (
            shape_of(self.graph, a_in)?.len(),
            shape_of(self.graph, b_in)?.len(),
        );
        if ra < 2 || rb < 2 {
            return Err(format!("'{}' multiplies a vector", n.name));
        }
        let ro = out.len();
        if split.axis + 2 < ro {
            // Batch axes broadcast as elementwise ops do, the matrix axes aside.
            let batch = &out[..ro - 2];
            let side = |t: TensorId, r: usize| -> Outcome<Need> {
                let shape = shape_of(self.graph, t)?;
                let offset = batch.len() as i64 - (r as i64 - 2);
                let axis = split.axis as i64 - offset;
                if axis < 0 || shape[axis as usize] == 1 {
                    return Ok(Need::Whole);
                }
                Ok(Need::Split(AxisSplit {
                    axis: axis as usize,
                    ..split
                }))
            };
            Ok(vec![(0, side(a_in, ra)?), (1, side(b_in, rb)?)])
        } else if split.axis + 2 == ro {
            Ok(vec![
                (
                    0,
                    Need::Split(AxisSplit {
                        axis: ra - 2,
                        ..split
                    }),
                ),
                (1, Need::Whole),
            ])
        } else {
            Ok(vec![
                (0, Need::Whole),
                (
                    1,
                    Need::Split(AxisSplit {
                        axis: rb - 1,
                        ..split
                    }),
                ),
            ])
        }
    }

    /// Replaces `node`'s shape input at `slot` by `out` with the split axis cut t ways.
    fn constant(
        &mut self,
        node: NodeId,
        slot: usize,
        out: &[u64],
        split: AxisSplit,
    ) -> Outcome<()> {
        let mut values: Vec<i64> = out.iter().map(|&d| d as i64).collect();
        values[split.axis] /= self.degree as i64;
        self.shapes.push(ShapeConstant { node, slot, values });
        Ok(())
    }

    /// A Squeeze's or Unsqueeze's axes (input from opset 13, attribute before).
    fn axes(&self, node: NodeId) -> Outcome<Vec<i64>> {
        match self.graph.node(node).inputs.get(1).copied().flatten() {
            Some(t) => self.values(t),
            None => Ok(ints_attr(self.graph, node, "axes").unwrap_or_default()),
        }
    }

    /// The values of a tensor known at plan time.
    fn values(&self, tensor: TensorId) -> Outcome<Vec<i64>> {
        let t = self.graph.tensor(tensor);
        t.value
            .as_ref()
            .and_then(|v| v.as_i64s())
            .ok_or_else(|| format!("the value of '{}' is not known at plan time", t.name))
    }
}

/// The input axis of a Reshape that holds output axis `axis`: the one that starts at the same
/// flat offset and is the same axis, the merge of it and the axes after it (width → heads ×
/// head size), or the leading factor of it (heads × head size → width; key/value heads ×
/// repeats → heads). A piece of the output axis is then a piece of that input axis.
fn reshape_axis(input: &[u64], out: &[u64], axis: usize) -> Option<usize> {
    let before: u64 = out[..axis].iter().product();
    let size = out[axis];
    let mut prefix = 1u64;
    for (i, &d) in input.iter().enumerate() {
        if prefix == before && d != 1 {
            let merges_output =
                (axis + 1..=out.len()).any(|end| out[axis..end].iter().product::<u64>() == d);
            let leads_output =
                (i + 1..=input.len()).any(|end| input[i..end].iter().product::<u64>() == size);
            return (merges_output || leads_output).then_some(i);
        }
        prefix *= d;
        if prefix > before {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn typed(name: &str) -> Graph {
        let path = format!(
            "{}/../../fixtures/models/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
            .run(&mut model.graph)
            .unwrap();
        model.graph
    }

    #[test]
    fn a_fused_weight_split_part_by_part_is_a_union_of_ranges() {
        let qkv = AxisSplit { axis: 1, groups: 3 };
        assert_eq!(qkv.ranges(192, 2, 1), vec![32..64, 96..128, 160..192]);
        let plain = AxisSplit { axis: 0, groups: 1 };
        assert_eq!(plain.ranges(128, 4, 2), vec![64..96]);
    }

    #[test]
    fn reshapes_map_a_head_split_to_the_axis_that_holds_it() {
        // width → (heads, head size), and back.
        assert_eq!(reshape_axis(&[2, 16, 64], &[2, 16, 4, 16], 2), Some(2));
        assert_eq!(reshape_axis(&[2, 16, 4, 16], &[2, 16, 64], 2), Some(2));
        // (key/value heads, repeats) → heads.
        assert_eq!(
            reshape_axis(&[2, 2, 2, 16, 16], &[2, 4, 16, 16], 1),
            Some(1)
        );
        // A reshape that scatters the axis: not a split of any input axis.
        assert_eq!(reshape_axis(&[2, 16, 64], &[2, 64, 16], 1), None);
    }

    #[test]
    fn a_block_the_degree_does_not_divide_stays_whole_with_its_reason() {
        let graph = typed("llama_tiny.onnx");
        let blocks = TensorParallelBlocks::find(&graph);
        let layout = ShardLayout::new(&graph, &blocks, 4);
        assert_eq!(layout.split.len(), 2, "the two MLPs");
        assert_eq!(layout.replicated.len(), 2, "the two attentions");
        for whole in &layout.replicated {
            assert!(
                whole.reason.contains("do not split 4 ways"),
                "{}",
                whole.reason
            );
        }
        // At 2 the attention splits: its grouped key/value heads and its rotary halves too.
        let layout = ShardLayout::new(&graph, &blocks, 2);
        assert!(layout.replicated.is_empty(), "{:?}", layout.replicated);
        let attention = &layout.split[0];
        let k_proj = attention
            .weights
            .iter()
            .find(|w| graph.tensor(w.param).name.contains("k_proj"))
            .unwrap();
        assert_eq!(k_proj.split, AxisSplit { axis: 1, groups: 1 });
    }

    #[test]
    fn a_block_cut_between_stages_stays_whole() {
        let graph = typed("gpt2_tiny.onnx");
        let blocks = TensorParallelBlocks::find(&graph);
        let layout = ShardLayout::new(&graph, &blocks, 2);
        let first = &layout.split[0];
        // A stage holding the block's columns but not its row.
        let stage: BTreeSet<NodeId> = first
            .nodes
            .iter()
            .copied()
            .filter(|&n| n != first.row)
            .collect();
        let within = layout.within(&stage);
        assert!(within.split.is_empty());
        assert_eq!(within.replicated.len(), 1);
        assert!(within.replicated[0]
            .reason
            .contains("cut between two pipeline stages"));
    }
}
