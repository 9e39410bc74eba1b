//! One tensor-parallel rank of a model as a `ModelProto`: the model as it is, except that each
//! block of a [`ShardLayout`] reads rank r's slices of its weights (new initializers named
//! `<weight>.tp<t>`, the whole weight dropped when nothing else reads it), its Reshape / Expand
//! targets and Split sizes become constants for the split shapes, and the row linear's partial
//! output goes through an `ai.pipecut` `AllReduce` (attribute `group_size`) that sums it over
//! the group before the rest of the model (the row's bias Add included) reads it; a row Gemm's
//! own bias is moved after that sum, so that it is added once. See
//! `docs/export.md` for the custom domain.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto,
};

use super::collectives::{collective, ALL_GATHER, ALL_REDUCE, COLLECTIVE_DOMAIN};
use super::rank_data::{Cut, ExternalWeights, RankData};
use crate::Error;
use pipecut_ir::graph::{DType, Graph, TensorId};
use pipecut_planner::partition::tensor_parallel::{TensorParallelism, VocabRole};
use pipecut_planner::partition::tensor_shard::{AxisSplit, ShardLayout, SplitBlock, VocabSlice};
use pipecut_runtime::{HostTensor, TensorData, Weights};

/// Rank `rank` of `layout.degree` of the model `proto`, which `graph` (typed with the dims the
/// layout was made for) and `weights` were loaded from. A slice of a weight stored as external
/// data is read from its file (only the rank's bytes, [`super::rank_data`]) and written to
/// `data` when given, inline otherwise; `weights` need hold only the others.
///
/// # Errors
/// [`Error::Export`] when the file does not match the graph or a weight cannot be read.
pub fn shard_model(
    proto: &ModelProto,
    graph: &Graph,
    weights: &Weights,
    layout: &ShardLayout,
    rank: u64,
    mut data: Option<&mut RankData>,
) -> Result<ModelProto, Error> {
    let t = layout.degree;
    let mut model = proto.clone();
    let g = model
        .graph
        .as_mut()
        .ok_or_else(|| Error::Export("the model file has no graph".into()))?;
    let mut edits = RankEdits::new(graph, weights, t, rank, &g.node);
    for block in &layout.split {
        edits.split_block(block, &mut g.node, &model.opset_import, data.as_deref_mut())?;
    }
    for v in &layout.vocab {
        edits.split_vocab(v, &g.node, &model.opset_import, data.as_deref_mut())?;
    }
    edits.apply(g);
    if !layout.split.is_empty()
        && !model
            .opset_import
            .iter()
            .any(|o| o.domain == COLLECTIVE_DOMAIN)
    {
        let mut opset = OperatorSetIdProto::new();
        opset.domain = COLLECTIVE_DOMAIN.into();
        opset.version = 1;
        model.opset_import.push(opset);
    }
    let mut entry = StringStringEntryProto::new();
    entry.key = "pipecut_tensor_parallel".into();
    entry.value = format!("rank {rank} of {t}");
    model.metadata_props.push(entry);
    Ok(model)
}

/// The edits that make rank `rank` of `degree` from the model file, gathered before any is
/// applied: they name nodes by their positions in the file, which hold until [`Self::apply`]
/// inserts the collectives.
struct RankEdits<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    degree: u64,
    rank: u64,
    /// Each node's position in the file, by its first output (unique in a graph).
    position: HashMap<String, usize>,
    external: ExternalWeights,
    /// Node inputs to rename: (position, slot, new name).
    renamed: Vec<(usize, usize, String)>,
    /// New initializers: the rank's slices, the split shapes, the constants of inserted nodes.
    initializers: Vec<TensorProto>,
    /// Weights sliced, dropped whole when nothing else reads them.
    sliced: BTreeSet<TensorId>,
    /// Tensors whose shape the split changes, whose `value_info` is dropped.
    reshaped: BTreeSet<String>,
    /// Collectives by the output they complete (the producer writes `<output>.partial`): the
    /// collective first, then any node that completes the output after it.
    collectives: BTreeMap<String, Vec<NodeProto>>,
    /// Nodes to insert before a node, by its first output.
    before: BTreeMap<String, Vec<NodeProto>>,
}

impl<'a> RankEdits<'a> {
    fn new(
        graph: &'a Graph,
        weights: &'a Weights,
        degree: u64,
        rank: u64,
        nodes: &[NodeProto],
    ) -> Self {
        RankEdits {
            graph,
            weights,
            degree,
            rank,
            position: nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.output.first().map(|o| (o.clone(), i)))
                .collect(),
            external: ExternalWeights::default(),
            renamed: Vec::new(),
            initializers: Vec::new(),
            sliced: BTreeSet::new(),
            reshaped: BTreeSet::new(),
            collectives: BTreeMap::new(),
            before: BTreeMap::new(),
        }
    }

    /// The position of `node` in the file.
    fn node_position(&self, node: pipecut_ir::graph::NodeId) -> Result<usize, Error> {
        let graph = self.graph;
        let first = graph.node(node).outputs.first().copied().flatten();
        first
            .and_then(|o| self.position.get(&graph.tensor(o).name).copied())
            .ok_or_else(|| {
                Error::Export(format!(
                    "node '{}' is not in the model file",
                    graph.node(node).name
                ))
            })
    }

    /// A split block: its weights sliced, its shape inputs made constants for the split shapes,
    /// and its row linear's partial output summed by an `AllReduce` (a row Gemm's bias moved
    /// after the sum).
    fn split_block(
        &mut self,
        block: &SplitBlock,
        nodes: &mut [NodeProto],
        opsets: &[OperatorSetIdProto],
        mut data: Option<&mut RankData>,
    ) -> Result<(), Error> {
        let (graph, t, rank) = (self.graph, self.degree, self.rank);
        for w in &block.weights {
            let param = graph.tensor(w.param);
            let name = format!("{}.tp{t}", param.name);
            let cut = Cut {
                split: w.split,
                size: None,
                degree: t,
                rank,
                zero_row: false,
            };
            let slice_proto =
                match self
                    .external
                    .slice(graph, w.param, cut, &name, data.as_deref_mut())?
                {
                    Some(slice_proto) => slice_proto,
                    None => {
                        let whole = self.weights.get(w.param).ok_or_else(|| {
                            Error::Export(format!("weight '{}' has no data", param.name))
                        })?;
                        let slice = slice_tensor(whole, w.split, t, rank)
                            .map_err(|e| Error::Export(format!("slicing '{}': {e}", param.name)))?;
                        tensor_proto(&name, &slice, param.dtype)?
                    }
                };
            self.initializers.push(slice_proto);
            for &(node, slot) in &w.readers {
                let position = self.node_position(node)?;
                self.renamed.push((position, slot, name.clone()));
            }
            self.sliced.insert(w.param);
        }
        for s in &block.shapes {
            let node = graph.node(s.node);
            let name = format!("{}.tp{t}.input{}", node.name, s.slot);
            let values = HostTensor::new(vec![s.values.len()], TensorData::I64(s.values.clone()))
                .map_err(Error::Export)?;
            self.initializers
                .push(tensor_proto(&name, &values, Some(DType::I64))?);
            let position = self.node_position(s.node)?;
            self.renamed.push((position, s.slot, name));
        }
        self.reshaped.extend(
            block
                .tensors
                .keys()
                .map(|&id| graph.tensor(id).name.clone()),
        );
        let reduced = graph.tensor(block.reduced).name.clone();
        let name = format!("{}/AllReduce", graph.node(block.row).name);
        let partial = format!("{reduced}.partial");
        let position = self.node_position(block.row)?;
        let bias = row_gemm_bias(graph, block.row, &mut nodes[position], opsets)?;
        let after = match bias {
            None => vec![collective(&name, ALL_REDUCE, &partial, &reduced, t, None)],
            Some(bias) => {
                let summed = format!("{reduced}.summed");
                let mut after = vec![collective(&name, ALL_REDUCE, &partial, &summed, t, None)];
                after.extend(bias.after_sum(&graph.node(block.row).name, &summed, &reduced));
                self.initializers.extend(bias.constants);
                after
            }
        };
        self.collectives.insert(reduced.clone(), after);
        Ok(())
    }

    /// An embedding split by rows (ids outside the rank's rows read a zero row, and an
    /// `AllReduce` sums the ranks' rows) or a head split by columns (an `AllGather` joins the
    /// logits, the vocabulary's padding cut off again).
    fn split_vocab(
        &mut self,
        v: &VocabSlice,
        nodes: &[NodeProto],
        opsets: &[OperatorSetIdProto],
        data: Option<&mut RankData>,
    ) -> Result<(), Error> {
        let (graph, t, rank) = (self.graph, self.degree, self.rank);
        let param = graph.tensor(v.param);
        let suffix = match v.role {
            VocabRole::Embedding => "rows",
            VocabRole::Head => "columns",
        };
        let name = format!("{}.tp{t}.{suffix}", param.name);
        let cut = Cut {
            split: v.split(),
            size: Some(v.padded),
            degree: t,
            rank,
            zero_row: v.role == VocabRole::Embedding,
        };
        let slice_proto = match self.external.slice(graph, v.param, cut, &name, data)? {
            Some(slice_proto) => slice_proto,
            None => vocab_slice_inline(self.weights, graph, v, t, rank, &name)?,
        };
        self.initializers.push(slice_proto);
        match v.role {
            VocabRole::Embedding => self.sum_rows(v, nodes)?,
            VocabRole::Head => self.gather_logits(v, opsets)?,
        }
        let reader = self.node_position(v.reader.0)?;
        self.renamed.push((reader, v.reader.1, name));
        self.sliced.insert(v.param);
        Ok(())
    }

    /// An embedding's rank rows: ids outside them read the zero row, and an `AllReduce` sums
    /// the ranks' rows.
    fn sum_rows(&mut self, v: &VocabSlice, nodes: &[NodeProto]) -> Result<(), Error> {
        let (graph, t, rank) = (self.graph, self.degree, self.rank);
        let output = graph.tensor(v.output).name.clone();
        let partial = format!("{output}.partial");
        let node_name = graph.node(v.node).name.clone();
        let position = self.node_position(v.node)?;
        let ids = nodes[position].input[1].clone();
        let ids_type = graph
            .node(v.node)
            .inputs
            .get(1)
            .copied()
            .flatten()
            .and_then(|i| graph.tensor(i).dtype)
            .unwrap_or(DType::I64);
        let rows = v.padded / t;
        let (inserted, consts, row) =
            embedding_rows(&node_name, &ids, ids_type, rank * rows, rows, t)?;
        self.initializers.extend(consts);
        self.before.insert(output.clone(), inserted);
        self.renamed.push((position, 1, row));
        self.collectives.insert(
            output.clone(),
            vec![collective(
                &format!("{node_name}/AllReduce"),
                ALL_REDUCE,
                &partial,
                &output,
                t,
                None,
            )],
        );
        Ok(())
    }

    /// A head's rank columns of the logits, joined by an `AllGather` and the vocabulary's
    /// padding cut off again.
    fn gather_logits(
        &mut self,
        v: &VocabSlice,
        opsets: &[OperatorSetIdProto],
    ) -> Result<(), Error> {
        let (graph, t) = (self.graph, self.degree);
        let output = graph.tensor(v.output).name.clone();
        let partial = format!("{output}.partial");
        let node_name = graph.node(v.node).name.clone();
        let gather = |to: &str| {
            collective(
                &format!("{node_name}/AllGather"),
                ALL_GATHER,
                &partial,
                to,
                t,
                Some(-1),
            )
        };
        let after = if v.padded == v.vocab {
            vec![gather(&output)]
        } else {
            // The padding's logits are cut off again: the output is the model's own.
            let gathered = format!("{output}.gathered");
            let rank_of_output = graph.tensor(v.output).shape.as_ref().map_or(0, Vec::len);
            let (slice, consts) = drop_padding(
                &node_name,
                &gathered,
                &output,
                rank_of_output,
                v.vocab,
                ai_onnx_opset(opsets),
            )?;
            self.initializers.extend(consts);
            vec![gather(&gathered), slice]
        };
        self.collectives.insert(output.clone(), after);
        Ok(())
    }

    /// Applies the edits to the graph: inputs renamed, sliced weights nothing reads whole any
    /// more dropped, new initializers added, and the inserted nodes put in file order.
    fn apply(mut self, g: &mut GraphProto) {
        let graph = self.graph;
        for (position, slot, name) in std::mem::take(&mut self.renamed) {
            g.node[position].input[slot] = name;
        }
        // The sliced weights nothing reads whole any more are dropped.
        let still_read: BTreeSet<&str> = g
            .node
            .iter()
            .flat_map(|n| n.input.iter().map(String::as_str))
            .collect();
        let dropped: BTreeSet<String> = self
            .sliced
            .iter()
            .map(|&id| graph.tensor(id).name.clone())
            .filter(|name| !still_read.contains(name.as_str()))
            .collect();
        g.initializer.retain(|i| !dropped.contains(&i.name));
        g.input.retain(|i| !dropped.contains(&i.name));
        g.node.retain(|n| {
            !(n.op_type == "Constant" && n.output.len() == 1 && dropped.contains(&n.output[0]))
        });
        g.initializer.extend(std::mem::take(&mut self.initializers));
        g.value_info.retain(|v| !self.reshaped.contains(&v.name));
        // Each collective right after the node whose output it completes, in file order.
        let mut nodes = Vec::with_capacity(g.node.len() + 7 * self.collectives.len());
        for mut node in std::mem::take(&mut g.node) {
            let first = node.output.first().cloned().unwrap_or_default();
            if let Some(inserted) = self.before.remove(&first) {
                nodes.extend(inserted);
            }
            match self.collectives.remove(&first) {
                Some(after) => {
                    node.output[0] = after[0].input[0].clone();
                    nodes.push(node);
                    nodes.extend(after);
                }
                None => nodes.push(node),
            }
        }
        g.node = nodes;
    }
}

/// Rank `rank`'s share of a model as protobuf bytes; with `sequence_parallel`, the regions
/// between blocks hold the rank's share of the sequence ([`super::sequence`]).
///
/// # Errors
/// As [`shard_model`] and [`super::sequence::split_sequence`], and [`Error::Export`] when the
/// rank is too large for one protobuf.
pub fn shard_model_bytes(
    proto: &ModelProto,
    graph: &Graph,
    weights: &Weights,
    layout: &ShardLayout,
    rank: u64,
    sequence_parallel: bool,
    data: Option<&mut RankData>,
) -> Result<Vec<u8>, Error> {
    let mut model = shard_model(proto, graph, weights, layout, rank, data)?;
    if sequence_parallel && layout.degree > 1 {
        super::sequence::split_sequence(&mut model, graph, layout, rank)?;
    }
    model
        .write_to_bytes()
        .map_err(|e| Error::Export(format!("cannot encode rank {rank}: {e}")))
}

/// Rank `rank`'s slice of a vocabulary weight held in `weights`, padded to `v.padded` entries
/// when t does not divide V, with the embedding's zero row: ids outside the rank's rows read
/// it, so that the all-reduce of the ranks' rows gives every id its one row.
fn vocab_slice_inline(
    weights: &Weights,
    graph: &Graph,
    v: &pipecut_planner::partition::tensor_shard::VocabSlice,
    t: u64,
    rank: u64,
    name: &str,
) -> Result<TensorProto, Error> {
    let param = graph.tensor(v.param);
    let whole = weights
        .get(v.param)
        .ok_or_else(|| Error::Export(format!("weight '{}' has no data", param.name)))?;
    // Padded only when t does not divide V: a vocabulary table is the largest weight.
    let padded = match v.padded == v.vocab {
        true => Ok(std::borrow::Cow::Borrowed(&**whole)),
        false => pad_axis(whole, v.axis, v.padded).map(std::borrow::Cow::Owned),
    };
    let mut slice = padded
        .and_then(|padded| slice_tensor(&padded, v.split(), t, rank))
        .map_err(|e| Error::Export(format!("slicing '{}': {e}", param.name)))?;
    if v.role == VocabRole::Embedding {
        slice = append_zero_row(&slice).map_err(Error::Export)?;
    }
    tensor_proto(name, &slice, param.dtype)
}

/// A row-parallel Gemm's bias, moved after the all-reduce so that it is added once.
struct MovedBias {
    /// The bias tensor's name.
    bias: String,
    /// The Gemm's `beta`, when not 1.
    beta: Option<String>,
    /// Initializers the moved bias needs (`beta`, the zero left in an opset < 11 Gemm).
    constants: Vec<TensorProto>,
}

impl MovedBias {
    /// `Add(summed, beta · C)` writing `output`.
    fn after_sum(&self, row: &str, summed: &str, output: &str) -> Vec<NodeProto> {
        match &self.beta {
            None => vec![plain_node(
                &format!("{row}/AddBias"),
                "Add",
                &[summed, &self.bias],
                output,
            )],
            Some(beta) => {
                let scaled = format!("{output}.bias");
                vec![
                    plain_node(
                        &format!("{row}/ScaleBias"),
                        "Mul",
                        &[&self.bias, beta],
                        &scaled,
                    ),
                    plain_node(&format!("{row}/AddBias"), "Add", &[summed, &scaled], output),
                ]
            }
        }
    }
}

/// When the row linear `row` is a Gemm with a bias C: takes C out of the file's `node` (so that
/// each rank's partial product leaves it out; an opset-10 Gemm, which requires C, gets a zero)
/// and says how to add it after the sum.
fn row_gemm_bias(
    graph: &Graph,
    row: pipecut_ir::graph::NodeId,
    node: &mut NodeProto,
    opsets: &[OperatorSetIdProto],
) -> Result<Option<MovedBias>, Error> {
    let n = graph.node(row);
    if n.op_type != "Gemm" || node.input.get(2).is_none_or(String::is_empty) {
        return Ok(None);
    }
    let dtype = n
        .outputs
        .first()
        .copied()
        .flatten()
        .and_then(|o| graph.tensor(o).dtype)
        .unwrap_or(DType::F32);
    let scalar = |name: String, value: f32| -> Result<TensorProto, Error> {
        let held = HostTensor::new(vec![], TensorData::F32(vec![value])).map_err(Error::Export)?;
        tensor_proto(&name, &held, Some(dtype))
    };
    let mut constants = Vec::new();
    let beta = match n.attributes.get("beta") {
        Some(pipecut_ir::graph::Attribute::Float(b)) if *b != 1.0 => {
            let name = format!("{}.beta", n.name);
            constants.push(scalar(name.clone(), *b)?);
            Some(name)
        }
        _ => None,
    };
    let bias = node.input[2].clone();
    if ai_onnx_opset(opsets) < 11 {
        let zero = format!("{}.zero", n.name);
        constants.push(scalar(zero.clone(), 0.0)?);
        node.input[2] = zero;
    } else {
        node.input.truncate(2);
    }
    Ok(Some(MovedBias {
        bias,
        beta,
        constants,
    }))
}

fn plain_node(name: &str, op: &str, inputs: &[&str], output: &str) -> NodeProto {
    let mut node = NodeProto::new();
    node.name = name.into();
    node.op_type = op.into();
    node.input = inputs.iter().map(|i| i.to_string()).collect();
    node.output.push(output.into());
    node
}

/// The nodes that turn the token ids into rows of a rank's slice of an embedding table holding
/// rows `[first, first + rows)` plus a zero row at `rows`: `Where(first <= id < first + rows,
/// id − first, rows)`; with the constants they read and the name of the row indices.
fn embedding_rows(
    node: &str,
    ids: &str,
    ids_type: DType,
    first: u64,
    rows: u64,
    t: u64,
) -> Result<(Vec<NodeProto>, Vec<TensorProto>, String), Error> {
    let scalar = |name: String, value: u64| -> Result<TensorProto, Error> {
        let data = match ids_type {
            DType::I32 => TensorData::I32(vec![value as i32]),
            _ => TensorData::I64(vec![value as i64]),
        };
        let held = HostTensor::new(Vec::new(), data).map_err(Error::Export)?;
        tensor_proto(&name, &held, Some(held.dtype()))
    };
    let at = |what: &str| format!("{node}.tp{t}.{what}");
    let consts = vec![
        scalar(at("first"), first)?,
        scalar(at("end"), first + rows)?,
        scalar(at("zero_row"), rows)?,
    ];
    let nodes = vec![
        plain_node(&at("Less"), "Less", &[ids, &at("first")], &at("below")),
        plain_node(&at("Not"), "Not", &[&at("below")], &at("from_first")),
        plain_node(&at("Less_1"), "Less", &[ids, &at("end")], &at("before_end")),
        plain_node(
            &at("And"),
            "And",
            &[&at("from_first"), &at("before_end")],
            &at("held"),
        ),
        plain_node(&at("Sub"), "Sub", &[ids, &at("first")], &at("local")),
        plain_node(
            &at("Where"),
            "Where",
            &[&at("held"), &at("local"), &at("zero_row")],
            &at("row"),
        ),
    ];
    Ok((nodes, consts, at("row")))
}

/// The model's ai.onnx opset.
fn ai_onnx_opset(opsets: &[OperatorSetIdProto]) -> i64 {
    opsets
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version)
}

/// A Slice of the first `vocab` entries of the last axis of `input` (of rank `rank`) into
/// `output`, with the constants it reads (attributes before opset 10).
fn drop_padding(
    node: &str,
    input: &str,
    output: &str,
    rank: usize,
    vocab: u64,
    opset: i64,
) -> Result<(NodeProto, Vec<TensorProto>), Error> {
    let axis = rank.checked_sub(1).ok_or_else(|| {
        Error::Export(format!("the output of '{node}' has no known rank to unpad"))
    })? as i64;
    let name = format!("{node}/DropPadding");
    if opset < 10 {
        let mut slice = plain_node(&name, "Slice", &[input], output);
        for (key, value) in [("starts", 0), ("ends", vocab as i64), ("axes", axis)] {
            let mut attribute = AttributeProto::new();
            attribute.name = key.into();
            attribute.type_ = AttributeType::INTS.into();
            attribute.ints = vec![value];
            slice.attribute.push(attribute);
        }
        return Ok((slice, Vec::new()));
    }
    let at = |what: &str| format!("{node}.unpad.{what}");
    let consts = [("starts", 0), ("ends", vocab as i64), ("axes", axis)]
        .into_iter()
        .map(|(what, value)| {
            let held =
                HostTensor::new(vec![1], TensorData::I64(vec![value])).map_err(Error::Export)?;
            tensor_proto(&at(what), &held, Some(DType::I64))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let slice = plain_node(
        &name,
        "Slice",
        &[input, &at("starts"), &at("ends"), &at("axes")],
        output,
    );
    Ok((slice, consts))
}

/// `tensor` grown to `size` along `axis` with zeros (Megatron-LM's vocabulary padding).
fn pad_axis(tensor: &HostTensor, axis: usize, size: u64) -> Result<HostTensor, String> {
    let shape = tensor.shape().to_vec();
    let have = *shape.get(axis).ok_or("axis out of range")?;
    if have as u64 >= size {
        return Ok(tensor.clone());
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let values = tensor.as_f32()?;
    let grown = size as usize;
    let mut padded = vec![0.0f32; outer * grown * inner];
    for o in 0..outer {
        let from = &values[o * have * inner..(o + 1) * have * inner];
        padded[o * grown * inner..o * grown * inner + have * inner].copy_from_slice(from);
    }
    let mut out_shape = shape;
    out_shape[axis] = grown;
    HostTensor::new(out_shape, TensorData::F32(padded))
}

/// `table` with one more row of zeros.
fn append_zero_row(table: &HostTensor) -> Result<HostTensor, String> {
    let mut shape = table.shape().to_vec();
    let width: usize = shape[1..].iter().product();
    shape[0] += 1;
    let mut values = table.as_f32()?.to_vec();
    values.extend(std::iter::repeat_n(0.0, width));
    HostTensor::new(shape, TensorData::F32(values))
}

/// The elements of `whole` that rank `rank` of `degree` holds under `split`.
pub fn slice_tensor(
    whole: &HostTensor,
    split: AxisSplit,
    degree: u64,
    rank: u64,
) -> Result<HostTensor, String> {
    let shape = whole.shape().to_vec();
    let axis = split.axis;
    let size = *shape.get(axis).ok_or("axis out of range")? as u64;
    if split.groups == 0 || !size.is_multiple_of(split.groups * degree) {
        return Err(format!(
            "axis {axis} of size {size} does not split {degree} ways"
        ));
    }
    let ranges = split.ranges(size, degree, rank);
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let pick = |len: usize| -> Vec<usize> {
        let mut index = Vec::with_capacity(len / degree as usize);
        for o in 0..outer {
            for r in &ranges {
                for i in r.clone() {
                    let start = (o * shape[axis] + i as usize) * inner;
                    index.extend(start..start + inner);
                }
            }
        }
        index
    };
    let mut out_shape = shape.clone();
    out_shape[axis] /= degree as usize;
    let data = match whole.data() {
        TensorData::F32(v) => TensorData::F32(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::I64(v) => TensorData::I64(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::I32(v) => TensorData::I32(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::Bool(v) => TensorData::Bool(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::U8(v) => TensorData::U8(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::I8(v) => TensorData::I8(pick(v.len()).into_iter().map(|i| v[i]).collect()),
        TensorData::String(_) => return Err("a string tensor is not sliced".into()),
    };
    HostTensor::new(out_shape, data)
}

/// `tensor` as an initializer of element type `dtype` (the weight's own: the runtime holds
/// float32, int64, int32, bool, uint8 and int8 as they are).
fn tensor_proto(
    name: &str,
    tensor: &HostTensor,
    dtype: Option<DType>,
) -> Result<TensorProto, Error> {
    let mut proto = TensorProto::new();
    proto.name = name.into();
    proto.dims = tensor.shape().iter().map(|&d| d as i64).collect();
    let held = tensor.dtype();
    let written = dtype.unwrap_or(held);
    // The runtime holds half-precision weights as float32, exactly: written back, they are the
    // model's own bits.
    let raw: Vec<u8> = match (tensor.data(), written) {
        (TensorData::F32(v), DType::F16) => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        (TensorData::F32(v), DType::BF16) => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        (data, written) if written == held => match data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
            TensorData::U8(v) => v.clone(),
            TensorData::I8(v) => v.iter().map(|&b| b as u8).collect(),
            TensorData::String(_) => {
                return Err(Error::Export(format!("'{name}' is a string tensor")))
            }
        },
        _ => {
            return Err(Error::Export(format!(
                "'{name}' is {written:?} in the model but {held:?} in memory: its slices are not written"
            )))
        }
    };
    proto.data_type = written.onnx_code();
    proto.raw_data = raw;
    Ok(proto)
}

/// A model split for a tensor-parallel group: what each rank holds, and each rank's file.
#[derive(Debug, Clone)]
pub struct ShardedModel {
    /// The blocks split and those left whole.
    pub layout: ShardLayout,
    /// Rank r's model, protobuf bytes.
    pub ranks: Vec<Vec<u8>>,
}

/// Splits the model in `model_path` (loaded as `graph`, its dims bound and shapes inferred)
/// `tp.degree` ways, with sequence parallelism if `tp` asks for it.
///
/// # Errors
/// An unreadable model or weight, a model file that does not match the graph, or a sequence
/// the degree does not divide under sequence parallelism.
pub fn shard_file(
    model_path: &std::path::Path,
    graph: &Graph,
    tp: TensorParallelism,
) -> Result<ShardedModel, Error> {
    let degree = u64::from(tp.degree);
    let bytes = pipecut_ir::io::read_model_bytes(model_path)?;
    let proto = ModelProto::parse_from_bytes(&bytes).map_err(|e| Error::NotOnnx {
        origin: model_path.display().to_string(),
        detail: format!("protobuf decoding failed: {e}"),
    })?;
    let weights = Weights::load(model_path, graph)?;
    let blocks = pipecut_planner::partition::tensor_parallel::TensorParallelBlocks::find(graph);
    let layout = ShardLayout::new(graph, &blocks, degree);
    let ranks = (0..degree)
        .map(|rank| {
            shard_model_bytes(
                &proto,
                graph,
                &weights,
                &layout,
                rank,
                tp.sequence_parallel,
                None,
            )
        })
        .collect::<Result<_, _>>()?;
    Ok(ShardedModel { layout, ranks })
}

/// A pipeline's stages split for tensor parallelism: `ranks[stage][rank]` is that rank's model
/// file (bytes), external data resolved against the model's directory, and `data[stage][rank]`
/// the external data file of its weight slices, when it has one.
#[derive(Debug, Clone)]
pub struct ShardedStages {
    /// Per stage, the blocks split and those left whole.
    pub layouts: Vec<ShardLayout>,
    /// Per stage, per rank, the model bytes.
    pub ranks: Vec<Vec<Vec<u8>>>,
    /// Per stage, per rank, the slices' external data (named as the rank file's tensors name
    /// it, beside the rank file); `None` when every slice is inline.
    pub data: Vec<Vec<Option<RankData>>>,
}

/// Splits each stage of `stages` of the model in `model_path` (loaded as `graph`, its dims
/// bound and shapes inferred, its weights `weights`) `tp.degree` ways, with sequence
/// parallelism if `tp` asks for it, every rank in memory (see [`shard_stages_each`]).
///
/// # Errors
/// As [`shard_stages_each`].
pub fn shard_stages(
    model_path: &std::path::Path,
    graph: &Graph,
    weights: &Weights,
    stages: &[Vec<pipecut_ir::graph::NodeId>],
    tp: TensorParallelism,
    external_data: bool,
) -> Result<ShardedStages, Error> {
    let mut ranks: Vec<Vec<Vec<u8>>> = vec![Vec::new(); stages.len()];
    let mut data: Vec<Vec<Option<RankData>>> = vec![Vec::new(); stages.len()];
    let layouts = shard_stages_each(
        model_path,
        graph,
        weights,
        stages,
        tp,
        external_data,
        |stage, _, bytes, rank_data| {
            ranks[stage].push(bytes);
            data[stage].push(rank_data);
            Ok(())
        },
    )?;
    Ok(ShardedStages {
        layouts,
        ranks,
        data,
    })
}

/// [`shard_stages`] handing each rank to `emit(stage, rank, model bytes, external data)` as
/// soon as it is made, so that a writer holds one rank at a time. With `external_data`, the
/// slices of weights the model stores externally go to `stage_<k>.rank_<r>.data`
/// ([`rank_data_name`]), read from the model's data file a rank's bytes at a time; `weights`
/// then need not hold them ([`Weights::load_embedded`]). Gives each stage's layout.
///
/// # Errors
/// As [`crate::stage_models`], [`shard_model_bytes`] and `emit`.
pub fn shard_stages_each(
    model_path: &std::path::Path,
    graph: &Graph,
    weights: &Weights,
    stages: &[Vec<pipecut_ir::graph::NodeId>],
    tp: TensorParallelism,
    external_data: bool,
    mut emit: impl FnMut(usize, u64, Vec<u8>, Option<RankData>) -> Result<(), Error>,
) -> Result<Vec<ShardLayout>, Error> {
    let degree = u64::from(tp.degree);
    let blocks = pipecut_planner::partition::tensor_parallel::TensorParallelBlocks::find(graph);
    let whole = ShardLayout::new(graph, &blocks, degree);
    let files = super::stage_models(model_path, graph, stages)?;
    let mut layouts = Vec::with_capacity(stages.len());
    for (stage, (nodes, file)) in stages.iter().zip(files).enumerate() {
        let layout = whole.within(&nodes.iter().copied().collect());
        let proto = ModelProto::parse_from_bytes(&file)
            .map_err(|e| Error::Export(format!("cannot decode a stage: {e}")))?;
        for rank in 0..degree {
            let mut rank_data = external_data.then(|| RankData::new(rank_data_name(stage, rank)));
            let bytes = shard_model_bytes(
                &proto,
                graph,
                weights,
                &layout,
                rank,
                tp.sequence_parallel,
                rank_data.as_mut(),
            )?;
            emit(
                stage,
                rank,
                bytes,
                rank_data.filter(|d| !d.bytes.is_empty()),
            )?;
        }
        layouts.push(layout);
    }
    Ok(layouts)
}

/// The external data file of rank `rank` of stage `stage`: its file name, `.onnx` made `.data`.
pub fn rank_data_name(stage: usize, rank: u64) -> String {
    let file = super::rank_file_name(stage, rank as usize);
    format!("{}.data", file.strip_suffix(".onnx").unwrap_or(&file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_precision_weight_is_written_back_in_its_own_type() {
        let held = HostTensor::from_f16(
            vec![2],
            &[half::f16::from_f32(0.5), half::f16::from_f32(-3.25)],
        )
        .unwrap();
        let proto = tensor_proto("w", &held, Some(DType::F16)).unwrap();
        assert_eq!(proto.data_type, DType::F16.onnx_code());
        let values: Vec<f32> = proto
            .raw_data
            .chunks(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        assert_eq!(values, [0.5, -3.25]);
        // A type the runtime does not hold exactly is refused, not written wrong.
        assert!(tensor_proto("w", &held, Some(DType::F64)).is_err());
    }

    #[test]
    fn padded_logits_are_cut_back_by_a_slice_in_the_models_opset_form() {
        // Opset 9: starts, ends and axes are attributes.
        let (node, consts) = drop_padding("head", "g", "y", 3, 512, 9).unwrap();
        assert!(consts.is_empty());
        let ints: Vec<(String, Vec<i64>)> = node
            .attribute
            .iter()
            .map(|a| (a.name.clone(), a.ints.clone()))
            .collect();
        assert_eq!(
            ints,
            [
                ("starts".to_string(), vec![0]),
                ("ends".to_string(), vec![512]),
                ("axes".to_string(), vec![2])
            ]
        );
        // Opset 10 on: inputs.
        let (node, consts) = drop_padding("head", "g", "y", 3, 512, 13).unwrap();
        assert_eq!(node.input.len(), 4);
        assert_eq!(consts.len(), 3);
        assert!(drop_padding("head", "g", "y", 0, 512, 13).is_err());
        // Zeros past the vocabulary, along the axis asked for.
        let table = HostTensor::new(vec![2, 2], TensorData::F32(vec![1.0, 2.0, 3.0, 4.0])).unwrap();
        let wide = pad_axis(&table, 1, 3).unwrap();
        assert_eq!(wide.to_f32_vec(), [1.0, 2.0, 0.0, 3.0, 4.0, 0.0]);
        let tall = pad_axis(&table, 0, 3).unwrap();
        assert_eq!(tall.to_f32_vec(), [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]);
    }

    #[test]
    fn a_slice_keeps_every_run_of_a_fused_weight() {
        // 2 × 6: three parts of 2 columns, split 2 ways: rank 1 keeps column 1 of each part.
        let whole = HostTensor::new(
            vec![2, 6],
            TensorData::F32((0..12).map(|v| v as f32).collect()),
        )
        .unwrap();
        let slice = slice_tensor(&whole, AxisSplit { axis: 1, groups: 3 }, 2, 1).unwrap();
        assert_eq!(slice.shape(), [2, 3]);
        assert_eq!(slice.to_f32_vec(), [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]);
    }

    /// A uint8 weight (held as bytes) is sliced and written as the model's uint8: it was held
    /// as int64 and refused as "uint8 in the model but int64 in memory".
    #[test]
    fn a_uint8_weight_is_sliced_and_written_as_bytes() {
        let whole = HostTensor::new(vec![2, 2], TensorData::U8(vec![1, 2, 3, 255])).unwrap();
        let slice = slice_tensor(&whole, AxisSplit { axis: 1, groups: 1 }, 2, 1).unwrap();
        assert_eq!(slice.data(), &TensorData::U8(vec![2, 255]));
        let proto = tensor_proto("w", &slice, Some(DType::U8)).unwrap();
        assert_eq!(proto.raw_data, vec![2, 255]);
        assert_eq!(proto.data_type, DType::U8.onnx_code());
    }
}
