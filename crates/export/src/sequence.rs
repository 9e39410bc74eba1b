//! Sequence parallelism in a tensor-parallel rank file (Korthikanti et al. 2022, "Reducing
//! Activation Recomputation in Large Transformer Models", §4.2.2; Megatron-LM's
//! `--sequence-parallel`): between the split blocks, the normalizations, dropouts and residual
//! additions run on rank r's share of the sequence only.
//!
//! The rewrite runs on a rank file [`super::shard`] made, in its node order:
//!
//! - each `AllReduce` of a block's row linear or of an embedding becomes a `ReduceScatter` along
//!   the sequence axis (the second-to-last of a `[…, sequence, hidden]` activation): rank r gets
//!   positions `[r·S/t, (r+1)·S/t)` of the sum;
//! - a node that works position by position along that axis (element-wise ops, a
//!   `LayerNormalization` or a reduction over later axes only) reads the shares and makes a
//!   share; another input of it that holds the whole sequence is cut to the rank's positions by
//!   a local `Slice` (no communication), one that broadcasts along the axis is read as it is;
//! - any other reader of a share — a block's column linear, a Shape, a head, a block left whole —
//!   reads the whole tensor again, made by one `AllGather` along the axis (under the tensor's own
//!   name, so that those readers do not change), as is a graph output.
//!
//! Each tensor in shares is renamed `<name>.seq<t>`. A sequence the degree does not divide is
//! refused in one line rather than padded: padding positions would enter every normalization
//! and the attention of the next block.

use std::collections::{BTreeSet, HashMap};

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, ModelProto, NodeProto, TensorProto};

use super::collectives::{collective, ALL_GATHER, ALL_REDUCE, COLLECTIVE_DOMAIN, REDUCE_SCATTER};
use crate::Error;
use pipecut_ir::graph::Graph;
use pipecut_planner::partition::tensor_shard::ShardLayout;

/// Ops whose output at a position reads only their inputs at that position (after broadcast).
const ELEMENTWISE: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "Cast",
    "Clip",
    "Div",
    "Dropout",
    "Equal",
    "Erf",
    "Exp",
    "Gelu",
    "Greater",
    "HardSigmoid",
    "Identity",
    "LeakyRelu",
    "Less",
    "Log",
    "Max",
    "Min",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "Pow",
    "Reciprocal",
    "Relu",
    "Sigmoid",
    "Softplus",
    "Sqrt",
    "Sub",
    "Tanh",
    "Where",
];

/// Reductions that are position-wise when every reduced axis comes after the sequence axis.
const REDUCTIONS: &[&str] = &["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"];

/// Rewrites rank `rank` of `layout.degree` (`model`, made from `graph` by the sharding rewrite)
/// so that the regions between its blocks hold the rank's share of the sequence.
///
/// # Errors
/// [`Error::Export`] when an all-reduced activation has no sequence axis the degree divides.
pub fn split_sequence(
    model: &mut ModelProto,
    graph: &Graph,
    layout: &ShardLayout,
    rank: u64,
) -> Result<(), Error> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version);
    let Some(g) = model.graph.as_mut() else {
        return Err(Error::Export("the rank file has no graph".into()));
    };
    let mut rewrite = Rewrite {
        degree: layout.degree,
        rank,
        opset,
        shapes: graph
            .tensors()
            .filter_map(|(id, t)| Some((t.name.clone(), graph.concrete_shape(id).ok()?)))
            .collect(),
        constants: int_constants(g),
        whole_only: whole_only_nodes(graph, layout),
        split: HashMap::new(),
        gathered: BTreeSet::new(),
        local: HashMap::new(),
        nodes: Vec::with_capacity(g.node.len() * 2),
        initializers: Vec::new(),
    };
    for node in std::mem::take(&mut g.node) {
        rewrite.node(node)?;
    }
    for output in &g.output {
        if rewrite.split.contains_key(&output.name) {
            rewrite.gather(&output.name);
        }
    }
    g.node = rewrite.nodes;
    g.initializer.extend(rewrite.initializers);
    // Value infos of tensors that now exist only in shares would describe nothing.
    let made: BTreeSet<&str> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(String::as_str))
        .collect();
    g.value_info.retain(|v| made.contains(v.name.as_str()));
    Ok(())
}

/// The rewrite's state, in node order.
struct Rewrite {
    degree: u64,
    rank: u64,
    opset: i64,
    /// Whole shapes by tensor name (the graph's, for the dims the rank is made for).
    shapes: HashMap<String, Vec<u64>>,
    /// Int64 initializers and `Constant` outputs (a reduction's `axes` input).
    constants: HashMap<String, Vec<i64>>,
    /// Nodes of the split blocks and vocabulary splits: they always read whole tensors.
    whole_only: BTreeSet<String>,
    /// Tensors held in shares, by whole name: the split axis.
    split: HashMap<String, usize>,
    /// Split tensors whose whole was gathered back under its own name.
    gathered: BTreeSet<String>,
    /// Local slices of whole tensors, by (name, axis).
    local: HashMap<(String, usize), String>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
}

impl Rewrite {
    fn share_name(&self, name: &str) -> String {
        format!("{name}.seq{}", self.degree)
    }

    fn node(&mut self, mut node: NodeProto) -> Result<(), Error> {
        if node.domain == COLLECTIVE_DOMAIN && node.op_type == ALL_REDUCE {
            return self.scatter(node);
        }
        let reads_shares = node.input.iter().any(|i| self.split.contains_key(i));
        if !reads_shares {
            self.nodes.push(node);
            return Ok(());
        }
        match self.position_wise(&node) {
            Some((axis, plan)) => {
                for (slot, read) in plan.into_iter().enumerate() {
                    let input = node.input[slot].clone();
                    node.input[slot] = match read {
                        Read::AsIs => input,
                        Read::Share => self.share_name(&input),
                        Read::Local(at) => self.local_slice(&input, at),
                    };
                }
                let shape = self.output_shape(&node);
                for output in node.output.iter_mut().filter(|o| !o.is_empty()) {
                    if let Some(shape) = &shape {
                        self.shapes.entry(output.clone()).or_insert(shape.clone());
                    }
                    self.split.insert(output.clone(), axis);
                    *output = format!("{output}.seq{}", self.degree);
                }
                self.nodes.push(node);
            }
            None => {
                let shares: Vec<String> = node
                    .input
                    .iter()
                    .filter(|i| self.split.contains_key(*i))
                    .cloned()
                    .collect();
                for input in shares {
                    self.gather(&input);
                }
                self.nodes.push(node);
            }
        }
        Ok(())
    }

    /// An all-reduce made a reduce-scatter along the sequence axis of its output.
    fn scatter(&mut self, mut node: NodeProto) -> Result<(), Error> {
        let output = node.output[0].clone();
        let shape = self
            .shapes
            .get(&output)
            .or_else(|| {
                let partial = node.input[0].strip_suffix(".partial")?;
                self.shapes.get(partial)
            })
            .cloned()
            .ok_or_else(|| {
                Error::Export(format!(
                    "sequence parallelism: the shape of '{output}' is unknown"
                ))
            })?;
        let Some(axis) = shape.len().checked_sub(2) else {
            return Err(Error::Export(format!(
                "sequence parallelism: '{output}' ({shape:?}) has no sequence axis"
            )));
        };
        if !shape[axis].is_multiple_of(self.degree) {
            return Err(Error::Export(format!(
                "sequence parallelism: a sequence of {} positions (axis {axis} of '{output}') does not split {} ways; pick a length the degree divides",
                shape[axis], self.degree
            )));
        }
        node.op_type = REDUCE_SCATTER.into();
        node.name = node.name.replace(ALL_REDUCE, REDUCE_SCATTER);
        node.attribute.retain(|a| a.name != "axis");
        node.attribute.push(int_attribute("axis", axis as i64));
        self.shapes.insert(output.clone(), shape);
        self.split.insert(output.clone(), axis);
        node.output[0] = self.share_name(&output);
        self.nodes.push(node);
        Ok(())
    }

    /// Makes the whole of split tensor `name` under its own name, once.
    fn gather(&mut self, name: &str) {
        if !self.gathered.insert(name.to_string()) {
            return;
        }
        let axis = self.split[name];
        let node = collective(
            &format!("{name}/AllGather.seq"),
            ALL_GATHER,
            &self.share_name(name),
            name,
            self.degree,
            Some(axis as i64),
        );
        self.nodes.push(node);
    }

    /// The rank's positions of whole tensor `name` along `axis`, cut locally, once.
    fn local_slice(&mut self, name: &str, axis: usize) -> String {
        let key = (name.to_string(), axis);
        if let Some(sliced) = self.local.get(&key) {
            return sliced.clone();
        }
        let size = self.shapes[name][axis];
        let piece = (size / self.degree) as i64;
        let (start, end) = (self.rank as i64 * piece, (self.rank as i64 + 1) * piece);
        let sliced = format!("{name}.seq{}.axis{axis}", self.degree);
        let mut node = NodeProto::new();
        node.name = format!("{sliced}/Slice");
        node.op_type = "Slice".into();
        node.input.push(name.into());
        if self.opset < 10 {
            for (key, value) in [("starts", start), ("ends", end), ("axes", axis as i64)] {
                let mut attribute = AttributeProto::new();
                attribute.name = key.into();
                attribute.type_ = AttributeType::INTS.into();
                attribute.ints = vec![value];
                node.attribute.push(attribute);
            }
        } else {
            for (key, value) in [("starts", start), ("ends", end), ("axes", axis as i64)] {
                let constant = format!("{sliced}.{key}");
                let mut proto = TensorProto::new();
                proto.name = constant.clone();
                proto.dims = vec![1];
                proto.data_type = pipecut_ir::graph::DType::I64.onnx_code();
                proto.int64_data = vec![value];
                self.initializers.push(proto);
                node.input.push(constant);
            }
        }
        node.output.push(sliced.clone());
        self.nodes.push(node);
        self.local.insert(key, sliced.clone());
        sliced
    }

    /// When `node` can run on shares: the split axis of its outputs and how it reads each input.
    fn position_wise(&self, node: &NodeProto) -> Option<(usize, Vec<Read>)> {
        if self.whole_only.contains(&node.name)
            || !(node.domain.is_empty() || node.domain == "ai.onnx")
        {
            return None;
        }
        let op = node.op_type.as_str();
        if ELEMENTWISE.contains(&op) {
            return self.elementwise(node);
        }
        let data = node.input.first()?;
        let axis = *self.split.get(data)?;
        let rank = self.shapes.get(data)?.len();
        // Only the data input may be in shares; scales, biases and axes are whole.
        if node.input[1..].iter().any(|i| self.split.contains_key(i)) {
            return None;
        }
        let later = |a: i64| {
            let a = if a < 0 { a + rank as i64 } else { a };
            a > axis as i64 && a < rank as i64
        };
        let reads_after = match op {
            "LayerNormalization" | "SimplifiedLayerNormalization" => {
                later(int_attribute_of(node, "axis").unwrap_or(-1))
            }
            _ if REDUCTIONS.contains(&op) => {
                let axes = ints_attribute_of(node, "axes").or_else(|| {
                    let name = node.input.get(1).filter(|n| !n.is_empty())?;
                    self.constants.get(name).cloned()
                })?;
                !axes.is_empty() && axes.into_iter().all(later)
            }
            _ => false,
        };
        if !reads_after {
            return None;
        }
        let mut plan = vec![Read::AsIs; node.input.len()];
        plan[0] = Read::Share;
        Some((axis, plan))
    }

    /// An element-wise node on shares: the outputs split along the aligned axis; each whole
    /// input broadcast along it read as it is, one as long as the sequence cut locally.
    fn elementwise(&self, node: &NodeProto) -> Option<(usize, Vec<Read>)> {
        let shapes: Vec<Option<&Vec<u64>>> = node
            .input
            .iter()
            .map(|i| match i.is_empty() {
                true => None,
                false => self.shapes.get(i),
            })
            .collect();
        if node
            .input
            .iter()
            .zip(&shapes)
            .any(|(i, s)| !i.is_empty() && s.is_none())
        {
            return None;
        }
        let out_rank = shapes.iter().flatten().map(|s| s.len()).max()?;
        let mut axis = None;
        for (input, shape) in node.input.iter().zip(&shapes) {
            if let (Some(&a), Some(shape)) = (self.split.get(input), shape) {
                let aligned = a + out_rank - shape.len();
                if axis.is_some_and(|x| x != aligned) {
                    return None;
                }
                axis = Some(aligned);
            }
        }
        let axis = axis?;
        let mut length = None;
        for (input, shape) in node.input.iter().zip(&shapes) {
            if let (Some(&a), Some(shape)) = (self.split.get(input), shape) {
                length = Some(shape[a]);
            }
        }
        let length = length?;
        let mut plan = Vec::with_capacity(node.input.len());
        for (input, shape) in node.input.iter().zip(&shapes) {
            let read = match shape {
                None => Read::AsIs,
                Some(_) if self.split.contains_key(input) => Read::Share,
                Some(shape) => match (axis + shape.len()).checked_sub(out_rank) {
                    None => Read::AsIs,
                    Some(at) if shape[at] == 1 => Read::AsIs,
                    Some(at) if shape[at] == length => Read::Local(at),
                    Some(_) => return None,
                },
            };
            plan.push(read);
        }
        Some((axis, plan))
    }

    /// The whole shape of `node`'s first output: the graph's, or the broadcast of its inputs'.
    fn output_shape(&self, node: &NodeProto) -> Option<Vec<u64>> {
        if let Some(shape) = node.output.first().and_then(|o| self.shapes.get(o)) {
            return Some(shape.clone());
        }
        let shapes: Vec<&Vec<u64>> = node
            .input
            .iter()
            .filter_map(|i| self.shapes.get(i))
            .collect();
        let rank = shapes.iter().map(|s| s.len()).max()?;
        let mut out = vec![1u64; rank];
        for shape in shapes {
            for (d, &size) in shape.iter().enumerate() {
                let at = d + rank - shape.len();
                out[at] = out[at].max(size);
            }
        }
        Some(out)
    }
}

/// How a position-wise node reads an input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Read {
    /// Whole and broadcast along the split axis, or not a tensor the rewrite knows.
    AsIs,
    /// The rank's share of a split tensor.
    Share,
    /// A whole tensor as long as the sequence, cut to the rank's positions along this axis.
    Local(usize),
}

/// The nodes that read whole tensors whatever they are given: the split blocks' and the
/// vocabulary splits'.
fn whole_only_nodes(graph: &Graph, layout: &ShardLayout) -> BTreeSet<String> {
    let blocks = layout.split.iter().flat_map(|b| b.nodes.iter().copied());
    let vocab = layout.vocab.iter().flat_map(|v| [v.node, v.reader.0]);
    blocks
        .chain(vocab)
        .map(|id| graph.node(id).name.clone())
        .collect()
}

/// The int64 initializers and `Constant` outputs of `g`, by name (small ones: axes lists).
fn int_constants(g: &onnx_protobuf::GraphProto) -> HashMap<String, Vec<i64>> {
    let values = |t: &TensorProto| -> Option<Vec<i64>> {
        if t.data_type != pipecut_ir::graph::DType::I64.onnx_code() {
            return None;
        }
        match t.raw_data.is_empty() {
            true => Some(t.int64_data.clone()),
            false => Some(
                t.raw_data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .collect(),
            ),
        }
    };
    let mut constants: HashMap<String, Vec<i64>> = g
        .initializer
        .iter()
        .filter(|t| t.dims.iter().product::<i64>() <= 16)
        .filter_map(|t| Some((t.name.clone(), values(t)?)))
        .collect();
    for node in g.node.iter().filter(|n| n.op_type == "Constant") {
        let value = node.attribute.iter().find_map(|a| match a.name.as_str() {
            "value" => a.t.as_ref().and_then(values),
            "value_ints" => Some(a.ints.clone()),
            "value_int" => Some(vec![a.i]),
            _ => None,
        });
        if let (Some(value), Some(output)) = (value, node.output.first()) {
            constants.insert(output.clone(), value);
        }
    }
    constants
}

fn int_attribute(name: &str, value: i64) -> AttributeProto {
    let mut attribute = AttributeProto::new();
    attribute.name = name.into();
    attribute.type_ = AttributeType::INT.into();
    attribute.i = value;
    attribute
}

fn int_attribute_of(node: &NodeProto, name: &str) -> Option<i64> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.i)
}

fn ints_attribute_of(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    node.attribute
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.ints.clone())
}
