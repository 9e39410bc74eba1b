//! Tensor (intra-operator) parallelism: which parts of a model can be split over the t GPUs of
//! a tensor-parallel group the way Megatron-LM splits a transformer (Shoeybi et al. 2019,
//! "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism"),
//! found from the graph's structure, never from node names; and what a pipeline stage costs
//! when its shardable parts run split t ways.
//!
//! **Blocks.** A *linear* is a MatMul or Gemm whose second operand is a weight (a parameter,
//! possibly through a Transpose or Cast). A block is one or more *column-parallel* linears
//! whose outputs flow, through nodes that work on every column independently, into exactly one
//! *row-parallel* linear: the MLP (`MatMul → activation → MatMul`, or LLaMA's gate and up
//! projections into the down projection) and attention (the Q, K and V projections through the
//! heads into the output projection). Each GPU holds 1/t of the columns of the column weights
//! and the matching rows of the row weight, computes its share of everything between without
//! talking to the others, and the row linear's partial outputs are summed by one all-reduce.
//! A walk forward from a column linear that meets a normalization (LayerNormalization or the
//! ReduceMean of a decomposed one) or a graph output is not a block: normalizing needs the whole
//! hidden vector. The block's largest degree is the greatest common divisor of the column
//! widths, the row linear's input width and the head counts, which are read from the Reshape
//! that splits a projection's width into (heads, head size).
//!
//! **Vocabulary.** An embedding (a Gather of rows of a weight by the graph's input ids) is
//! split by rows, its partial outputs summed by an all-reduce; a language-model head (a linear
//! whose output is a graph output) is split by output columns, and its input gradient summed in
//! training (or its logits gathered in inference). A vocabulary that t does not divide is padded
//! to a multiple of t, as Megatron-LM pads it.
//!
//! **Costs at degree t** ([`TensorParallelBlocks::shard`]): a sharded node takes 1/t of its
//! time and keeps 1/t of its outputs (the row linear and the embedding keep their whole, summed
//! outputs); a weight that only sharded nodes read is held 1/t per GPU with its gradient and
//! optimizer state; the rest of the model runs whole on every GPU of the group. Each block
//! all-reduces its output once per forward and its input gradient once per backward, twice in
//! training (Megatron's `f` and `g`), plus once more per recomputed forward, over the ring of
//! the group's intra-node link. Sequence parallelism (Korthikanti et al. 2022, "Reducing
//! Activation Recomputation in Large Transformer Models") replaces each all-reduce by a
//! reduce-scatter and an all-gather of the same volume and splits the rest of the model (the
//! normalizations, dropouts and residual additions) along the sequence, so that it too takes 1/t
//! of its time and activation memory. Tensors sent between stages travel 1/t per GPU (the
//! scatter/gather of Narayanan et al. 2021, § 4.1).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::PartitionProblem;
use pipecut_cost::Mode;
use pipecut_ir::graph::{Graph, NodeId, TensorId, TensorOrigin};

/// Nodes a walk forward from a column linear may visit before it gives up: a transformer
/// block's attention has about 40 nodes between its projections (LLaMA's rotary embedding and
/// grouped heads included); ten times that is no block.
const MAX_BLOCK_NODES: usize = 400;

/// What a block computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Its region has a Softmax: attention heads.
    Attention,
    /// An MLP (or any other column-then-row pair).
    Mlp,
}

/// A column-parallel then row-parallel group of linears and the nodes between them.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardableBlock {
    /// Attention or MLP.
    pub kind: BlockKind,
    /// The column-parallel linears, in topological order.
    pub columns: Vec<NodeId>,
    /// The row-parallel linear.
    pub row: NodeId,
    /// Every node that runs split: the columns, the nodes between, the row, and the nodes
    /// that only prepare their weights (a tied weight's Transpose).
    pub nodes: Vec<NodeId>,
    /// Attention heads (the fewest of the block's Reshapes: the key/value heads of grouped
    /// attention); `None` for an MLP.
    pub heads: Option<u64>,
    /// The largest degree that splits every width and head count evenly; every divisor of it
    /// does too.
    pub widest_degree: u64,
    /// The row linear's output: what the all-reduce sums.
    pub reduced: TensorId,
}

impl ShardableBlock {
    /// Whether degree `t` splits this block evenly.
    pub fn splits_at(&self, t: u64) -> bool {
        t >= 1 && self.widest_degree.is_multiple_of(t)
    }
}

/// Where a vocabulary-sized weight sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VocabRole {
    /// A Gather of rows by the input ids.
    Embedding,
    /// A linear whose output is a graph output (logits).
    Head,
}

/// An embedding or head split by its vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct VocabShard {
    /// Embedding or head.
    pub role: VocabRole,
    /// The Gather or the linear, and the nodes that only prepare its weight.
    pub nodes: Vec<NodeId>,
    /// Rows of the table (columns of the head).
    pub vocab: u64,
    /// The embedding's output (all-reduced in the forward), the head's input (all-reduced in
    /// the backward) or, in inference, the head's output (gathered).
    pub collective: TensorId,
}

/// Everything tensor parallelism can split in one model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TensorParallelBlocks {
    /// Column-then-row blocks, in topological order of their row linears.
    pub blocks: Vec<ShardableBlock>,
    /// Embeddings and heads.
    pub vocab: Vec<VocabShard>,
}

/// A linear: a MatMul or Gemm by a weight.
#[derive(Debug, Clone)]
struct Linear {
    /// The activation operand.
    input: TensorId,
    /// Width of its input (rows of the weight as applied).
    in_width: u64,
    /// Width of its output.
    out_width: u64,
    /// Nodes between the parameter and the linear (a Transpose of a tied weight).
    weight_nodes: Vec<NodeId>,
}

/// The parameter behind `tensor`, directly or through Transpose, Cast or Identity nodes, with
/// those nodes.
fn weight_behind(graph: &Graph, tensor: TensorId) -> Option<(TensorId, Vec<NodeId>)> {
    let mut nodes = Vec::new();
    let mut current = tensor;
    // Four hops: a weight is at most cast and transposed on its way, never computed.
    for _ in 0..4 {
        match &graph.tensor(current).origin {
            TensorOrigin::Parameter(_) => return Some((current, nodes)),
            TensorOrigin::Node { node, .. } => {
                let n = graph.node(*node);
                if !matches!(n.op_type.as_str(), "Transpose" | "Cast" | "Identity") {
                    return None;
                }
                nodes.push(*node);
                current = n.inputs.first().copied().flatten()?;
            }
            TensorOrigin::GraphInput => return None,
        }
    }
    None
}

fn known_shape(graph: &Graph, tensor: TensorId) -> Option<Vec<u64>> {
    graph
        .tensor(tensor)
        .shape
        .as_ref()?
        .iter()
        .map(|d| d.known())
        .collect()
}

/// `node` as a linear, if it is one.
fn linear(graph: &Graph, node: NodeId) -> Option<Linear> {
    let n = graph.node(node);
    let input = n.inputs.first().copied().flatten()?;
    let weight = n.inputs.get(1).copied().flatten()?;
    if weight_behind(graph, input).is_some() {
        return None;
    }
    let (_, weight_nodes) = weight_behind(graph, weight)?;
    let shape = known_shape(graph, weight)?;
    let [rows, cols] = shape[..] else {
        return None;
    };
    let (in_width, out_width) = match n.op_type.as_str() {
        "MatMul" => (rows, cols),
        "Gemm" => {
            let transposed = |name: &str| {
                matches!(
                    n.attributes.get(name),
                    Some(pipecut_ir::graph::Attribute::Int(1))
                )
            };
            if transposed("transA") {
                return None;
            }
            if transposed("transB") {
                (cols, rows)
            } else {
                (rows, cols)
            }
        }
        _ => return None,
    };
    Some(Linear {
        input,
        in_width,
        out_width,
        weight_nodes,
    })
}

/// Ops that need every column of the hidden vector: a split cannot pass through them.
fn mixes_columns(op_type: &str) -> bool {
    matches!(
        op_type,
        "LayerNormalization"
            | "SimplifiedLayerNormalization"
            | "SkipLayerNormalization"
            | "SkipSimplifiedLayerNormalization"
            | "RMSNormalization"
            | "BatchNormalization"
            | "InstanceNormalization"
            | "GroupNormalization"
            | "ReduceMean"
    )
}

/// Ops that read only a tensor's shape: their outputs are the same on every GPU.
fn reads_shape_only(op_type: &str) -> bool {
    matches!(op_type, "Shape" | "Size")
}

/// The walk forward from column linear `column`: the nodes it passes and the row linear where
/// it ends, or `None` when it is no column of a block.
fn walk_to_row(
    graph: &Graph,
    column: NodeId,
    linears: &BTreeMap<NodeId, Linear>,
    graph_outputs: &BTreeSet<TensorId>,
) -> Option<(BTreeSet<NodeId>, NodeId)> {
    let mut region = BTreeSet::new();
    let mut row = None;
    let mut frontier = vec![column];
    while let Some(node) = frontier.pop() {
        for output in graph.node(node).outputs.iter().flatten() {
            if graph_outputs.contains(output) {
                return None;
            }
            for &consumer in &graph.tensor(*output).consumers {
                match linears.get(&consumer) {
                    Some(l) if l.input == *output => {
                        if row.is_some_and(|r| r != consumer) {
                            return None;
                        }
                        row = Some(consumer);
                        continue;
                    }
                    _ => {}
                }
                let op = graph.node(consumer).op_type.as_str();
                if reads_shape_only(op) {
                    continue;
                }
                if mixes_columns(op) || linears.contains_key(&consumer) {
                    return None;
                }
                if region.insert(consumer) {
                    if region.len() > MAX_BLOCK_NODES {
                        return None;
                    }
                    frontier.push(consumer);
                }
            }
        }
    }
    Some((region, row?))
}

/// Head count of a Reshape that splits a width into (heads, head size): the second-to-last dim
/// of its output when the last two multiply to its input's last dim.
fn heads_of_reshape(graph: &Graph, node: NodeId) -> Option<u64> {
    let n = graph.node(node);
    if n.op_type != "Reshape" {
        return None;
    }
    let input = known_shape(graph, n.inputs.first().copied().flatten()?)?;
    let output = known_shape(graph, n.outputs.first().copied().flatten()?)?;
    let width = *input.last()?;
    let [.., heads, head_size] = output[..] else {
        return None;
    };
    (output.len() == input.len() + 1 && heads > 1 && heads * head_size == width).then_some(heads)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl TensorParallelBlocks {
    /// Finds the blocks, embeddings and heads of `graph` (shapes inferred).
    ///
    /// # Complexity
    /// One forward walk per linear, each bounded by [`MAX_BLOCK_NODES`]: O(L · B) for L
    /// linears, linear in the model's size.
    pub fn find(graph: &Graph) -> TensorParallelBlocks {
        let order = graph.topological_order();
        let position: BTreeMap<NodeId, usize> =
            order.iter().enumerate().map(|(p, &n)| (n, p)).collect();
        let linears: BTreeMap<NodeId, Linear> = order
            .iter()
            .filter_map(|&n| linear(graph, n).map(|l| (n, l)))
            .collect();
        let graph_outputs: BTreeSet<TensorId> = graph.outputs().iter().copied().collect();

        let mut by_row: BTreeMap<NodeId, (Vec<NodeId>, BTreeSet<NodeId>)> = BTreeMap::new();
        for &column in linears.keys() {
            if let Some((region, row)) = walk_to_row(graph, column, &linears, &graph_outputs) {
                let entry = by_row.entry(row).or_default();
                entry.0.push(column);
                entry.1.extend(region);
            }
        }
        let mut blocks: Vec<ShardableBlock> = by_row
            .into_iter()
            .filter_map(|(row, (columns, region))| {
                block(graph, &linears, &position, row, columns, region)
            })
            .collect();
        blocks.sort_by_key(|b| position[&b.row]);
        // In a chain of linears with nothing between that needs whole rows (a plain MLP), each
        // linear is the row of one pair and a column of the next; Megatron alternates column
        // and row, so in graph order a block that shares a node with an earlier one is no block.
        let mut taken: BTreeSet<NodeId> = BTreeSet::new();
        blocks.retain(|b| {
            let free = b.nodes.iter().all(|n| !taken.contains(n));
            if free {
                taken.extend(b.nodes.iter().copied());
            }
            free
        });

        let in_blocks: BTreeSet<NodeId> = blocks
            .iter()
            .flat_map(|b| b.nodes.iter().copied())
            .collect();
        let mut vocab = embeddings(graph);
        for (&node, l) in &linears {
            let output = graph.node(node).outputs.first().copied().flatten();
            if in_blocks.contains(&node) || !output.is_some_and(|o| graph_outputs.contains(&o)) {
                continue;
            }
            let mut nodes = vec![node];
            nodes.extend(&l.weight_nodes);
            vocab.push(VocabShard {
                role: VocabRole::Head,
                nodes,
                vocab: l.out_width,
                collective: l.input,
            });
        }
        vocab.sort_by_key(|v| position[&v.nodes[0]]);
        TensorParallelBlocks { blocks, vocab }
    }

    /// The node sets that run split on a group of `t`, each named by its row linear (a block)
    /// or its Gather or linear (an embedding or head): the blocks that split at `t` and the
    /// vocabulary shards. Each must lie inside one pipeline stage for the costs of
    /// [`TensorParallelBlocks::shard`] to be what the sharded export runs: a stage splits only
    /// the blocks it holds whole.
    pub fn split_regions(&self, t: u64) -> Vec<(NodeId, &[NodeId])> {
        if t < 2 {
            return Vec::new();
        }
        self.blocks
            .iter()
            .filter(|b| b.splits_at(t))
            .map(|b| (b.row, &b.nodes[..]))
            .chain(self.vocab.iter().map(|v| (v.nodes[0], &v.nodes[..])))
            .collect()
    }

    /// The degrees up to `limit` at which at least one block splits.
    pub fn degrees(&self, limit: u64) -> Vec<u64> {
        (2..=limit)
            .filter(|&t| self.blocks.iter().any(|b| b.splits_at(t)))
            .collect()
    }
}

/// Builds the block ending in `row`, checking that every width and head count divides.
fn block(
    graph: &Graph,
    linears: &BTreeMap<NodeId, Linear>,
    position: &BTreeMap<NodeId, usize>,
    row: NodeId,
    mut columns: Vec<NodeId>,
    region: BTreeSet<NodeId>,
) -> Option<ShardableBlock> {
    columns.sort_by_key(|c| position[c]);
    let row_linear = &linears[&row];
    let mut widest = row_linear.in_width;
    for c in &columns {
        widest = gcd(widest, linears[c].out_width);
    }
    let heads = region
        .iter()
        .filter_map(|&n| heads_of_reshape(graph, n))
        .min();
    let is_attention = region.iter().any(|&n| graph.node(n).op_type == "Softmax");
    if let Some(h) = heads {
        widest = gcd(widest, h);
    }
    if widest < 2 {
        return None;
    }
    let mut nodes: BTreeSet<NodeId> = region;
    for n in columns.iter().chain([&row]) {
        nodes.insert(*n);
        nodes.extend(&linears[n].weight_nodes);
    }
    let mut nodes: Vec<NodeId> = nodes.into_iter().collect();
    nodes.sort_by_key(|n| position[n]);
    Some(ShardableBlock {
        kind: if is_attention {
            BlockKind::Attention
        } else {
            BlockKind::Mlp
        },
        columns,
        row,
        nodes,
        heads: if is_attention { heads } else { None },
        widest_degree: widest,
        reduced: graph.node(row).outputs.first().copied().flatten()?,
    })
}

/// Gathers of a 2-D weight's rows by a graph input (the token ids).
fn embeddings(graph: &Graph) -> Vec<VocabShard> {
    let inputs: BTreeSet<TensorId> = graph.inputs().iter().copied().collect();
    graph
        .nodes()
        .filter_map(|(id, n)| {
            let table = n.inputs.first().copied().flatten()?;
            let indices = n.inputs.get(1).copied().flatten()?;
            let output = n.outputs.first().copied().flatten()?;
            let axis = match n.attributes.get("axis") {
                Some(pipecut_ir::graph::Attribute::Int(a)) => *a,
                _ => 0,
            };
            let by_ids = n.op_type == "Gather" && axis == 0 && inputs.contains(&indices);
            graph.tensor(table).param().filter(|_| by_ids)?;
            let [rows, _] = known_shape(graph, table)?[..] else {
                return None;
            };
            Some(VocabShard {
                role: VocabRole::Embedding,
                nodes: vec![id],
                vocab: rows,
                collective: output,
            })
        })
        .collect()
}

/// Attention's score nodes, which selective recomputation drops and recomputes: in each
/// attention block, the first product of two activations (Q·Kᵀ) and every node after it up to,
/// not including, the next such product (the scores times V).
pub(crate) fn attention_score_nodes(graph: &Graph) -> Vec<NodeId> {
    let mut scores = Vec::new();
    for block in TensorParallelBlocks::find(graph).blocks {
        if block.kind != BlockKind::Attention {
            continue;
        }
        let region: BTreeSet<NodeId> = block.nodes.iter().copied().collect();
        let is_product = |n: NodeId| {
            graph.node(n).op_type == "MatMul" && linear(graph, n).is_none() && region.contains(&n)
        };
        // `nodes` is in topological order.
        let Some(&first) = block.nodes.iter().find(|&&n| is_product(n)) else {
            continue;
        };
        let mut seen = BTreeSet::from([first]);
        let mut frontier = vec![first];
        while let Some(node) = frontier.pop() {
            for output in graph.node(node).outputs.iter().flatten() {
                for &consumer in &graph.tensor(*output).consumers {
                    if region.contains(&consumer) && !is_product(consumer) && seen.insert(consumer)
                    {
                        frontier.push(consumer);
                    }
                }
            }
        }
        scores.extend(seen);
    }
    scores
}

/// A tensor-parallel layout of a stage: the degree t and whether the rest of the model is
/// split along the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TensorParallelism {
    /// GPUs of a group, inside one node.
    pub degree: u32,
    /// Sequence parallelism (Korthikanti et al. 2022) for the nodes outside the blocks.
    pub sequence_parallel: bool,
}

impl Default for TensorParallelism {
    fn default() -> Self {
        TensorParallelism::NONE
    }
}

impl TensorParallelism {
    /// One GPU per stage: nothing split.
    pub const NONE: TensorParallelism = TensorParallelism {
        degree: 1,
        sequence_parallel: false,
    };

    /// Whether nothing is split (serde's `skip_serializing_if`).
    pub fn is_none(&self) -> bool {
        self.degree <= 1
    }
}

/// Each node's kernel-launch time per device kind of `problem` (forward and, in training,
/// backward launches): `[kind][position]`, zero where the cost model has no rule.
fn launch_secs(
    graph: &Graph,
    problem: &PartitionProblem,
    cluster: &pipecut_cost::Cluster,
) -> Vec<Vec<f64>> {
    let mode = problem.settings.mode;
    (0..problem.node_secs.len())
        .map(|kind| {
            let Some(stage) = problem.stages.iter().find(|s| s.kind == kind) else {
                return vec![0.0; problem.order.len()];
            };
            let spec = cluster.device(stage.device);
            let model = pipecut_cost::CostModel::new(spec).with_mode(mode);
            let launch =
                spec.kernel_launch_overhead_secs.value * (1.0 + mode.backward_time_factor());
            problem
                .order
                .iter()
                .map(|&id| {
                    model
                        .work(graph, id)
                        .map_or(0.0, |(work, _)| work.launches as f64 * launch)
                })
                .collect()
        })
        .collect()
}

/// One GPU's share of what a split node's weight gradient reads (kept from B to W under
/// ZB-H1): a tensor that lives split (made by a split node whose output is not summed back)
/// counts 1/t, any other whole. A split node's partial sums and a sequence-parallel block's
/// gathered input are whole-sized on every GPU, so they count whole.
fn shard_weight_inputs(
    graph: &Graph,
    problem: &mut PartitionProblem,
    position: &BTreeMap<NodeId, usize>,
    (sharded, whole_output): (&[bool], &BTreeSet<usize>),
    t: u64,
) {
    if problem.weight_input_bytes.iter().all(|&b| b == 0) {
        return;
    }
    let lives_split = |p: usize| sharded[p] && !whole_output.contains(&p);
    let derived = super::problem::weight_derived(graph, &problem.order);
    for p in (0..problem.order.len()).filter(|&p| sharded[p]) {
        if problem.weight_input_bytes[p] == 0 {
            continue;
        }
        let share = super::problem::node_weight_inputs(
            graph,
            problem.order[p],
            &derived,
            |tensor, output| {
                let bytes = pipecut_cost::model::tensor_bytes(graph, tensor)?;
                let split = match graph.tensor(tensor).origin {
                    _ if output => lives_split(p),
                    TensorOrigin::Node { node, .. } => {
                        position.get(&node).is_some_and(|&q| lives_split(q))
                    }
                    _ => false,
                };
                Ok(if split { bytes.div_ceil(t) } else { bytes })
            },
        );
        // Sized once already when the problem was built; whole is the safe side regardless.
        if let Ok(share) = share {
            problem.weight_input_bytes[p] = share.min(problem.weight_input_bytes[p]);
        }
    }
}

/// How many all-reduces of a block's output a micro-batch costs: one per forward (Megatron's
/// `g`), one per backward (`f`), and one per forward run again under recomputation.
fn block_collectives(mode: Mode) -> f64 {
    match mode {
        Mode::Inference => 1.0,
        Mode::Training { recompute, .. } => 2.0 + recompute.extra_forwards(),
    }
}

impl TensorParallelBlocks {
    /// Rewrites `problem` (built from `graph` for one GPU per stage) into the problem of one GPU
    /// of a tensor-parallel group of `tp.degree` (see the module doc for the model).
    /// `all_reduce_secs` gives the group's ring all-reduce time for a number of bytes;
    /// `launch_secs[kind][position]` the part of a node's time that splitting does not shorten
    /// (its kernel launches), empty where none is known.
    pub fn shard(
        &self,
        graph: &Graph,
        problem: &mut PartitionProblem,
        tp: TensorParallelism,
        all_reduce_secs: &dyn Fn(u64) -> f64,
        launch_secs: &[Vec<f64>],
    ) {
        let t = u64::from(tp.degree.max(1));
        if t == 1 {
            return;
        }
        // Each GPU launches every kernel of a split node; the rest of its time splits.
        let split = |kind: usize, p: usize, secs: f64| {
            let launch = launch_secs.get(kind).map_or(0.0, |l| l[p]).min(secs);
            launch + (secs - launch) / t as f64
        };
        let position: BTreeMap<NodeId, usize> = problem
            .order
            .iter()
            .enumerate()
            .map(|(p, &n)| (n, p))
            .collect();
        let tensor_bytes = |id: TensorId| pipecut_cost::model::tensor_bytes(graph, id).unwrap_or(0);
        let mode = problem.settings.mode;
        let mut sharded = vec![false; problem.order.len()];
        // (position, seconds of collectives) added to the node that waits for them.
        let mut collectives: Vec<(usize, f64)> = Vec::new();
        // Nodes whose output is summed back to its whole size.
        let mut whole_output: BTreeSet<usize> = BTreeSet::new();
        for block in self.blocks.iter().filter(|b| b.splits_at(t)) {
            for n in &block.nodes {
                sharded[position[n]] = true;
            }
            let row = position[&block.row];
            whole_output.insert(row);
            collectives.push((
                row,
                block_collectives(mode) * all_reduce_secs(tensor_bytes(block.reduced)),
            ));
        }
        for shard in &self.vocab {
            for n in &shard.nodes {
                sharded[position[n]] = true;
            }
            let at = position[&shard.nodes[0]];
            let bytes = tensor_bytes(shard.collective);
            let secs = match (shard.role, mode) {
                // Forward sums, run again under recomputation; ids have no gradient.
                (VocabRole::Embedding, Mode::Inference) => all_reduce_secs(bytes),
                (VocabRole::Embedding, Mode::Training { recompute, .. }) => {
                    (1.0 + recompute.extra_forwards()) * all_reduce_secs(bytes)
                }
                // Logits gathered: an all-gather moves half an all-reduce's volume.
                (VocabRole::Head, Mode::Inference) => {
                    let logits = graph.node(shard.nodes[0]).outputs[0].map_or(0, tensor_bytes);
                    all_reduce_secs(logits) / 2.0
                }
                // The head's input gradient is summed; the loss works on the split logits.
                (VocabRole::Head, Mode::Training { .. }) => all_reduce_secs(bytes),
            };
            if shard.role == VocabRole::Embedding {
                whole_output.insert(at);
            }
            collectives.push((at, secs));
        }

        for (p, &is_split) in sharded.iter().enumerate() {
            if !(is_split || tp.sequence_parallel) {
                continue;
            }
            for (kind, secs) in problem.node_secs.iter_mut().enumerate() {
                secs[p] = split(kind, p, secs[p]);
            }
            if !whole_output.contains(&p) || tp.sequence_parallel {
                problem.activation_bytes[p] = problem.activation_bytes[p].div_ceil(t);
            }
        }
        shard_weight_inputs(graph, problem, &position, (&sharded, &whole_output), t);
        for (p, secs) in collectives {
            for kind in &mut problem.node_secs {
                kind[p] += secs;
            }
        }
        for param in &mut problem.params {
            if param.uses.iter().all(|&u| sharded[u as usize]) {
                param.footprint_bytes = param.footprint_bytes.div_ceil(t);
                param.elements = param.elements.div_ceil(t);
                param.shards = tp.degree;
            }
        }
        for flow in &mut problem.flows {
            flow.bytes = flow.bytes.div_ceil(t);
        }
    }

    /// [`TensorParallelBlocks::shard`] for the group of `tp.degree` consecutive devices from
    /// `first`, its collectives as ring all-reduces over them.
    pub fn shard_on(
        &self,
        graph: &Graph,
        problem: &mut PartitionProblem,
        cluster: &pipecut_cost::Cluster,
        tp: TensorParallelism,
        first: pipecut_cost::DeviceId,
    ) {
        let group: Vec<pipecut_cost::DeviceId> = (0..tp.degree.max(1))
            .map(|rank| pipecut_cost::DeviceId(first.0 + rank))
            .collect();
        if tp.is_none() {
            return;
        }
        let launch_secs = launch_secs(graph, problem, cluster);
        self.shard(
            graph,
            problem,
            tp,
            &|bytes| cluster.ring_all_reduce_secs(&group, bytes),
            &launch_secs,
        );
    }

    /// The weights a GPU of a group of `t` holds 1/t of: those only split nodes read.
    pub fn split_params(&self, graph: &Graph, t: u64) -> BTreeSet<TensorId> {
        let split: BTreeSet<NodeId> = self
            .blocks
            .iter()
            .filter(|b| b.splits_at(t))
            .flat_map(|b| b.nodes.iter().copied())
            .chain(self.vocab.iter().flat_map(|v| v.nodes.iter().copied()))
            .collect();
        graph
            .parameters()
            .filter(|(_, p)| {
                !p.consumers.is_empty() && p.consumers.iter().all(|c| split.contains(c))
            })
            .map(|(id, _)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_cost::{MemoryModel, Recompute};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn typed(name: &str) -> Graph {
        let path = format!(
            "{}/../../fixtures/models/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        if name.starts_with("gpt3_175b/") {
            write_placeholder_weights();
        }
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
            .run(&mut model.graph)
            .unwrap();
        model.graph
    }

    /// The 175B shape's weights as the sparse file its placeholder describes (as
    /// `tests/common` writes it): planning reads only their size.
    fn write_placeholder_weights() {
        let dir = format!(
            "{}/../../fixtures/models/gpt3_175b",
            env!("CARGO_MANIFEST_DIR")
        );
        let meta: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{dir}/placeholder.json")).unwrap(),
        )
        .unwrap();
        let weights = format!("{dir}/{}", meta["location"].as_str().unwrap());
        let total = meta["total_bytes"].as_u64().unwrap();
        if std::fs::metadata(&weights).map(|m| m.len()).ok() != Some(total) {
            std::fs::File::create(&weights)
                .unwrap()
                .set_len(total)
                .unwrap();
        }
    }

    /// The 175B shape's problem at s = 2048, b = 1 on one GPU of a tensor-parallel group, and
    /// the positions of layer 40's nodes.
    fn gpt3_problem(
        graph: &Graph,
        mode: Mode,
        tp: TensorParallelism,
    ) -> (PartitionProblem, Vec<usize>) {
        let cluster =
            pipecut_cost::Cluster::parse("1x8xH100-SXM", &pipecut_cost::Catalog::builtin())
                .unwrap();
        let settings = crate::partition::CostSettings {
            mode,
            ..Default::default()
        };
        let mut problem =
            PartitionProblem::new(graph, &cluster, &[pipecut_cost::DeviceId(0)], settings).unwrap();
        TensorParallelBlocks::find(graph).shard_on(
            graph,
            &mut problem,
            &cluster,
            tp,
            pipecut_cost::DeviceId(0),
        );
        let layer = (0..problem.order.len())
            .filter(|&p| {
                graph
                    .node(problem.order[p])
                    .name
                    .starts_with("/transformer/h.40/")
            })
            .collect();
        (problem, layer)
    }

    #[test]
    fn megatron_memory_model_agrees_with_korthikanti_on_the_175b_layers() {
        write_placeholder_weights();
        let path = format!(
            "{}/../../fixtures/models/gpt3_175b/model.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 1).bind("seq", 2048))
            .run(&mut model.graph)
            .unwrap();
        let graph = model.graph;
        // Korthikanti et al. 2022, § 4.1 and Table 2, in bytes per layer (16-bit).
        let (s, b, h, a) = (2048.0, 1.0, 12288.0, 96.0);
        let sbh = s * b * h;
        let formula = |t: f64, sequence_parallel: bool, recompute: Recompute| {
            let scores = 5.0 * a * s / h;
            match (recompute, sequence_parallel) {
                (Recompute::None, false) => sbh * (10.0 + 24.0 / t + scores / t),
                (Recompute::None, true) => sbh * (34.0 + scores) / t,
                (Recompute::Selective, false) => sbh * (10.0 + 24.0 / t),
                (Recompute::Selective, true) => sbh * 34.0 / t,
                (Recompute::Full, _) => unreachable!("compared on the stage's inputs below"),
            }
        };
        let mode = |recompute, memory_model| {
            Mode::training()
                .with_memory_techniques(recompute, pipecut_cost::ZeroSharding::NONE)
                .with_memory_model(memory_model)
        };
        for (degree, sequence_parallel) in [(1, false), (8, false), (8, true)] {
            let tp = TensorParallelism {
                degree,
                sequence_parallel,
            };
            let t = f64::from(degree);
            for recompute in [Recompute::None, Recompute::Selective] {
                let (problem, layer) =
                    gpt3_problem(&graph, mode(recompute, MemoryModel::Megatron), tp);
                let charged: u64 = layer.iter().map(|&p| problem.activation_bytes[p]).sum();
                let charged = charged as f64;
                let expected = formula(t, sequence_parallel, recompute);
                eprintln!(
                    "megatron t={degree} sp={sequence_parallel} {recompute:?}: {:.2} sbh, formula {:.2} sbh",
                    charged / sbh,
                    expected / sbh
                );
                assert!(
                    (charged / expected - 1.0).abs() < 0.10,
                    "t={degree} sp={sequence_parallel} {recompute:?}: {charged} against {expected}"
                );
            }
            // Full recomputation keeps, per micro-batch in flight, what crosses into a stage:
            // for a stage that starts at layer 40, the residual stream 2sbh (and the causal
            // mask, s² bytes). pipecut splits it over the group as the p2p send does, so only
            // sequence parallelism's layout (or t = 1) is Korthikanti's 2sbh/t.
            if degree == 1 || sequence_parallel {
                let (problem, layer) =
                    gpt3_problem(&graph, mode(Recompute::Full, MemoryModel::Megatron), tp);
                let start = layer[0] as u32;
                let checkpoint: u64 = problem
                    .flows
                    .iter()
                    .filter(|f| f.producer < start && f.consumers.iter().any(|&c| c >= start))
                    .map(|f| f.bytes)
                    .sum();
                let expected = 2.0 * sbh / t;
                eprintln!(
                    "full t={degree}: {:.3} sbh per micro-batch",
                    checkpoint as f64 / sbh
                );
                assert!((checkpoint as f64 / expected - 1.0).abs() < 0.10);
            }
        }
        // Torch with SDPA keeps no scores: about selective's figure without recomputation
        // (36 sbh: Q, K, V and the attention output kept, no dropout). The ONNX graph as
        // exported keeps every intermediate, far above both.
        let tp = TensorParallelism::default();
        let sum = |model| {
            let (problem, layer) = gpt3_problem(&graph, mode(Recompute::None, model), tp);
            layer
                .iter()
                .map(|&p| problem.activation_bytes[p])
                .sum::<u64>() as f64
                / sbh
        };
        let (torch, onnx) = (sum(MemoryModel::Torch), sum(MemoryModel::Onnx));
        eprintln!("torch {torch:.2} sbh, onnx {onnx:.2} sbh");
        assert!((torch / 34.0 - 1.0).abs() < 0.10, "{torch}");
        assert!(onnx > 1.5 * (34.0 + 5.0 * a * s / h), "{onnx}");
    }

    fn kinds(blocks: &TensorParallelBlocks) -> Vec<BlockKind> {
        blocks.blocks.iter().map(|b| b.kind).collect()
    }

    #[test]
    fn gpt2_has_an_attention_and_an_mlp_block_per_layer_and_a_tied_vocabulary() {
        let graph = typed("gpt2_tiny.onnx");
        let found = TensorParallelBlocks::find(&graph);
        // 4 layers of attention then MLP.
        assert_eq!(
            kinds(&found),
            [BlockKind::Attention, BlockKind::Mlp].repeat(4)
        );
        let attention = &found.blocks[0];
        assert_eq!(attention.columns.len(), 3, "Q, K and V");
        assert!(attention
            .nodes
            .iter()
            .any(|&n| graph.node(n).op_type == "Softmax"));
        let heads = attention.heads.unwrap();
        assert!(heads > 1 && 64 % heads == 0, "{heads}");
        assert_eq!(attention.widest_degree, heads);
        // The MLP: 64 → 128 → 64.
        assert_eq!(found.blocks[1].columns.len(), 1);
        assert_eq!(found.blocks[1].widest_degree, 128);
        assert_eq!(found.blocks[1].heads, None);
        // The token embedding (not the position embedding, indexed by a Range) and the head.
        let roles: Vec<(VocabRole, u64)> = found.vocab.iter().map(|v| (v.role, v.vocab)).collect();
        assert_eq!(roles, [(VocabRole::Embedding, 512), (VocabRole::Head, 512)]);
        // No normalization is ever split.
        for block in &found.blocks {
            assert!(block
                .nodes
                .iter()
                .all(|&n| !mixes_columns(&graph.node(n).op_type)));
        }
    }

    #[test]
    fn a_chain_of_gemm_linears_alternates_column_and_row() {
        // mlp: five Gemms with a Relu between each: (0, 2) and (4, 6) are blocks; 2 → 4 and
        // 6 → head would make a linear both the row of one block and a column of the next.
        let path = format!(
            "{}/../../fixtures/models/mlp.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2))
            .run(&mut model.graph)
            .unwrap();
        let graph = model.graph;
        let found = TensorParallelBlocks::find(&graph);
        let name = |n: NodeId| graph.node(n).name.clone();
        let pairs: Vec<(Vec<String>, String)> = found
            .blocks
            .iter()
            .map(|b| (b.columns.iter().map(|&c| name(c)).collect(), name(b.row)))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    vec!["/layers/layers.0/Gemm".to_string()],
                    "/layers/layers.2/Gemm".to_string()
                ),
                (
                    vec!["/layers/layers.4/Gemm".to_string()],
                    "/layers/layers.6/Gemm".to_string()
                ),
            ]
        );
    }

    #[test]
    fn llama_blocks_follow_grouped_heads_and_the_gated_mlp() {
        let graph = typed("llama_tiny.onnx");
        let found = TensorParallelBlocks::find(&graph);
        assert_eq!(
            kinds(&found),
            [BlockKind::Attention, BlockKind::Mlp].repeat(2)
        );
        let attention = &found.blocks[0];
        // 4 query heads and 2 key/value heads of 16: the key/value heads bound the degree.
        assert_eq!(attention.heads, Some(2));
        assert_eq!(attention.widest_degree, 2);
        assert!(attention.splits_at(2) && !attention.splits_at(4));
        // gate and up projections into down.
        assert_eq!(found.blocks[1].columns.len(), 2);
        assert_eq!(found.blocks[1].widest_degree, 128);
        assert_eq!(found.degrees(8), vec![2, 4, 8]);
    }

    #[test]
    fn bert_blocks_stop_at_its_post_normalization() {
        let graph = typed("bert_tiny.onnx");
        let found = TensorParallelBlocks::find(&graph);
        let attention = found
            .blocks
            .iter()
            .filter(|b| b.kind == BlockKind::Attention)
            .count();
        assert!(attention >= 2, "{:?}", kinds(&found));
        for block in &found.blocks {
            for &n in &block.nodes {
                assert!(!mixes_columns(&graph.node(n).op_type));
            }
        }
    }

    #[test]
    fn gpt3_175b_splits_eight_ways_in_every_layer() {
        let graph = typed("gpt3_175b/model.onnx");
        let found = TensorParallelBlocks::find(&graph);
        assert_eq!(found.blocks.len(), 2 * 96);
        let attention = &found.blocks[0];
        assert_eq!(attention.heads, Some(96));
        assert_eq!(attention.widest_degree, 96);
        assert!(found.blocks.iter().all(|b| b.splits_at(8)));
        let vocab: Vec<u64> = found.vocab.iter().map(|v| v.vocab).collect();
        assert_eq!(vocab, [50257, 50257]);
        // Split at 8, a GPU holds an eighth of the blocks' weights: 174.6B of 175B parameters
        // are in the blocks and the vocabulary.
        let split = found.split_params(&graph, 8);
        let elements = |ids: &mut dyn Iterator<Item = TensorId>| -> u64 {
            ids.map(|id| known_shape(&graph, id).unwrap().iter().product::<u64>())
                .sum()
        };
        let total = elements(&mut graph.parameters().map(|(id, _)| id));
        let in_split = elements(&mut split.iter().copied());
        assert!(
            in_split as f64 / total as f64 > 0.998,
            "{in_split} of {total}"
        );
    }

    fn gpt2_problem(graph: &Graph, mode: Mode) -> PartitionProblem {
        let cluster =
            pipecut_cost::Cluster::parse("1x4xA100-80GB", &pipecut_cost::Catalog::builtin())
                .unwrap();
        let settings = crate::partition::CostSettings {
            mode,
            ..Default::default()
        };
        PartitionProblem::new(graph, &cluster, &[pipecut_cost::DeviceId(0)], settings).unwrap()
    }

    #[test]
    fn a_split_stage_does_its_share_and_pays_its_collectives() {
        let graph = typed("gpt2_tiny.onnx");
        let found = TensorParallelBlocks::find(&graph);
        let tp = TensorParallelism {
            degree: 2,
            sequence_parallel: false,
        };
        let split: BTreeSet<usize> = {
            let problem = gpt2_problem(&graph, Mode::Inference);
            let nodes: BTreeSet<NodeId> = found
                .blocks
                .iter()
                .flat_map(|b| b.nodes.iter().copied())
                .chain(found.vocab.iter().flat_map(|v| v.nodes.iter().copied()))
                .collect();
            (0..problem.order.len())
                .filter(|&p| nodes.contains(&problem.order[p]))
                .collect()
        };
        // Collectives at one second each: 8 blocks and the embedding all-reduce once in
        // inference, the head gathers its logits (half an all-reduce); in training the blocks
        // all-reduce twice and the head once.
        for (mode, collective_secs) in [(Mode::Inference, 9.5), (Mode::training(), 18.0)] {
            let whole = gpt2_problem(&graph, mode);
            let mut problem = whole.clone();
            found.shard(&graph, &mut problem, tp, &|_| 1.0, &[]);
            let expected: f64 = (0..whole.order.len())
                .map(|p| match split.contains(&p) {
                    true => whole.node_secs[0][p] / 2.0,
                    false => whole.node_secs[0][p],
                })
                .sum::<f64>()
                + collective_secs;
            let total: f64 = problem.node_secs[0].iter().sum();
            assert!(
                (total - expected).abs() < 1e-9,
                "{mode:?}: {total} vs {expected}"
            );
            // Every weight but the normalizations' and the position embedding's is halved.
            for (before, after) in whole.params.iter().zip(&problem.params) {
                let only_split = before.uses.iter().all(|u| split.contains(&(*u as usize)));
                let expected = match only_split {
                    true => before.footprint_bytes.div_ceil(2),
                    false => before.footprint_bytes,
                };
                assert_eq!(
                    after.footprint_bytes,
                    expected,
                    "{}",
                    whole.name(before.name)
                );
            }
            let halved: Vec<&str> = problem
                .params
                .iter()
                .filter(|p| p.shards == 2)
                .map(|p| problem.name(p.name))
                .collect();
            for name in [
                "transformer.wte.weight",
                "transformer.h.0.attn.q_proj.weight",
                "transformer.h.0.attn.q_proj.bias",
                "transformer.h.0.attn.out_proj.weight",
                "transformer.h.3.mlp.c_fc.weight",
            ] {
                assert!(halved.contains(&name), "{name} in {halved:?}");
            }
            // The row linear's bias is added after the sum: whole.
            assert!(!halved.contains(&"transformer.h.0.attn.out_proj.bias"));
        }
        // Sequence parallelism splits the rest too: only the launches and collectives remain
        // whole.
        let whole = gpt2_problem(&graph, Mode::Inference);
        let mut problem = whole.clone();
        let sequence = TensorParallelism {
            sequence_parallel: true,
            ..tp
        };
        found.shard(&graph, &mut problem, sequence, &|_| 0.0, &[]);
        let total: f64 = problem.node_secs[0].iter().sum();
        let before: f64 = whole.node_secs[0].iter().sum();
        assert!((total - before / 2.0).abs() < 1e-12);
    }

    /// Under ZB-H1 a linear keeps from B to W its activation input and its output's gradient:
    /// the whole input and half the output of a column linear at t = 2, half the input and the
    /// whole summed output of a row linear, the whole input and half the logits of the tied
    /// head (which reads its weight through a Transpose, itself keeping nothing).
    #[test]
    fn zero_bubble_weight_inputs_split_as_the_tensors_they_read() {
        let graph = typed("gpt2_tiny.onnx");
        let found = TensorParallelBlocks::find(&graph);
        let cluster =
            pipecut_cost::Cluster::parse("1x4xA100-80GB", &pipecut_cost::Catalog::builtin())
                .unwrap();
        let settings = crate::partition::CostSettings {
            mode: Mode::training(),
            schedule: pipecut_cost::Schedule::ZeroBubble,
            microbatches: 4,
            ..Default::default()
        };
        let whole = PartitionProblem::new(&graph, &cluster, &[pipecut_cost::DeviceId(0)], settings)
            .unwrap();
        let mut split = whole.clone();
        let tp = TensorParallelism {
            degree: 2,
            sequence_parallel: false,
        };
        found.shard(&graph, &mut split, tp, &|_| 1.0, &[]);
        let at = |id: NodeId| whole.order.iter().position(|&n| n == id).unwrap();
        let bytes = |t: TensorId| pipecut_cost::model::tensor_bytes(&graph, t).unwrap();
        // (input, output) of a linear: its one input that is no weight and its output.
        let operands = |id: NodeId| {
            let node = graph.node(id);
            let input = node.inputs[0].unwrap();
            (bytes(input), bytes(node.outputs[0].unwrap()))
        };
        let mut checked = 0;
        for block in &found.blocks {
            for &column in &block.columns {
                let (x, y) = operands(column);
                assert_eq!(whole.weight_input_bytes[at(column)], x + y);
                assert_eq!(split.weight_input_bytes[at(column)], x + y.div_ceil(2));
                checked += 1;
            }
            let (x, y) = operands(block.row);
            assert_eq!(whole.weight_input_bytes[at(block.row)], x + y);
            assert_eq!(split.weight_input_bytes[at(block.row)], x.div_ceil(2) + y);
            checked += 1;
        }
        let head = found
            .vocab
            .iter()
            .find(|v| v.role == VocabRole::Head)
            .expect("gpt2 has a head");
        let linear = head.nodes[0];
        let (x, y) = operands(linear);
        assert_eq!(whole.weight_input_bytes[at(linear)], x + y);
        assert_eq!(split.weight_input_bytes[at(linear)], x + y.div_ceil(2));
        for &prepares in &head.nodes[1..] {
            assert_eq!(whole.weight_input_bytes[at(prepares)], 0);
        }
        assert!(
            head.nodes.len() > 1,
            "the head reads its weight through a Transpose"
        );
        assert_eq!(
            checked,
            4 * 6,
            "four layers of Q, K, V, out and the two MLP linears"
        );
    }

    #[test]
    fn selective_recomputation_drops_the_scores_and_runs_their_forward_again() {
        let graph = typed("gpt2_tiny.onnx");
        let scores = attention_score_nodes(&graph);
        let ops: Vec<&str> = scores
            .iter()
            .map(|&n| graph.node(n).op_type.as_str())
            .collect();
        // Per layer: Q·Kᵀ, its scaling, the causal mask, the softmax; 4 layers.
        assert_eq!(ops.len(), 16, "{ops:?}");
        assert_eq!(ops.iter().filter(|&&o| o == "Softmax").count(), 4);
        assert_eq!(ops.iter().filter(|&&o| o == "MatMul").count(), 4);
        let kept = gpt2_problem(&graph, Mode::training());
        let selective = gpt2_problem(
            &graph,
            Mode::training().with_memory_techniques(
                pipecut_cost::Recompute::Selective,
                pipecut_cost::ZeroSharding::NONE,
            ),
        );
        for p in 0..kept.order.len() {
            let (secs, bytes) = (kept.node_secs[0][p], kept.activation_bytes[p]);
            if scores.contains(&kept.order[p]) {
                // Forward + backward (3 forwards' time) plus one forward again.
                assert!((selective.node_secs[0][p] - secs * 4.0 / 3.0).abs() < 1e-15);
                assert_eq!(selective.activation_bytes[p], 0);
                assert!(bytes > 0);
            } else {
                assert_eq!(selective.node_secs[0][p], secs);
                assert_eq!(selective.activation_bytes[p], bytes);
            }
        }
    }
}
