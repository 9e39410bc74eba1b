//! Phase 2 of the pipeline: the graph IR that every later phase works on.
//!
//! A [`Graph`] is a newtype over petgraph's [`StableDiGraph`]: nodes are operators, and each edge
//! `u → v` carries the [`TensorId`] of a tensor that `u` produces and `v` reads. A tensor read by
//! several nodes is one entry in the tensor table and one edge per consumer, so its dtype and shape
//! are stored once. Graph inputs and parameters (initializers) have no producer node; they are
//! tensors without in-edges and are listed through [`Graph::inputs`] and [`Tensor::origin`].
//!
//! [`NodeId`]s are stable: they stay valid for the life of the graph, because the IR never removes
//! nodes after [`GraphBuilder::build`].

mod attributes;
mod build;
mod kind;
mod names;
mod types;
mod validate;
mod value;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

pub use attributes::Attributes;
pub use build::{GraphBuilder, NodeSpec};
pub use kind::ValueKind;
pub use types::{checked_element_count, element_count, format_shape, DType, Dim, Shape, SymDim};
pub use value::{ConstValue, SymInt, MAX_TRACKED_ELEMENTS};

use names::NameIndex;

use crate::Error;

/// Identifies a node of a [`Graph`]; stable for the graph's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) NodeIndex);

impl NodeId {
    /// The position of the node in the order it was added (the model file's order for ONNX).
    pub fn index(self) -> usize {
        self.0.index()
    }

    /// The node at position `index` of that order (the inverse of [`NodeId::index`]), for a
    /// reader that walks the model file beside the graph; whether the graph has it is the
    /// caller's to check.
    pub fn from_index(index: usize) -> NodeId {
        NodeId(NodeIndex::new(index))
    }
}

/// Identifies a tensor of a [`Graph`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub(crate) u32);

impl TensorId {
    /// Position in the graph's tensor table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// An operator attribute, decoded from the model.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Attribute {
    Int(i64),
    Float(f32),
    String(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<String>),
    /// A tensor literal (`Constant.value`, `ConstantOfShape.value`).
    Tensor(TensorLiteral),
    /// A subgraph (`If.then_branch`, `Loop.body`, `Scan.body`, `SequenceMap.body`).
    Graph(Subgraph),
    Graphs(Vec<Subgraph>),
    /// A type (`Optional.type`): kind, element type and shape where stated.
    Type(ValueKind, Option<DType>, Option<Shape>),
    /// A kind the planner does not look inside (sparse tensors, lists of types).
    Other(&'static str),
}

/// A tensor stored inside an attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorLiteral {
    /// Element type.
    pub dtype: DType,
    /// Concrete dimensions.
    pub dims: Vec<u64>,
    /// The contents when small enough to track (see [`MAX_TRACKED_ELEMENTS`]).
    pub value: Option<ConstValue>,
}

/// A subgraph (`If` branches, `Loop`/`Scan`/`SequenceMap` bodies): its declared outputs, and the
/// body itself as a graph, which shape inference types from the node's inputs and the CPU
/// runtime runs.
#[derive(Debug, Clone)]
pub struct Subgraph {
    /// The subgraph's name.
    pub name: String,
    /// Number of nodes inside (counted recursively).
    pub node_count: usize,
    /// Declared outputs: name, element type and shape where the model states them.
    pub outputs: Vec<(String, Option<DType>, Option<Shape>)>,
    /// The body. Its first [`Subgraph::formal_inputs`] inputs are the subgraph's own (declared
    /// in the model); the inputs after them stand for the enclosing scopes' tensors it reads,
    /// which the node lists as its captures.
    pub body: Arc<Graph>,
    /// How many of the body's inputs are the subgraph's declared inputs.
    pub formal_inputs: usize,
}

impl PartialEq for Subgraph {
    /// Subgraphs compare by what the model declares of them; bodies built from the same
    /// declaration are the same.
    fn eq(&self, other: &Subgraph) -> bool {
        self.name == other.name
            && self.node_count == other.node_count
            && self.outputs == other.outputs
            && self.formal_inputs == other.formal_inputs
    }
}

/// An operator of the graph.
#[derive(Debug, Clone)]
pub struct Node {
    /// Unique node name (the model's name, made unique and non-empty by the loader).
    pub name: String,
    /// Operator type, e.g. `MatMul`.
    pub op_type: String,
    /// Operator domain; `""` is the default ONNX domain.
    pub domain: String,
    /// Attributes by name.
    pub attributes: Attributes,
    /// Inputs by position; `None` marks an omitted optional input.
    pub inputs: Vec<Option<TensorId>>,
    /// Outputs by position; `None` marks an omitted optional output.
    pub outputs: Vec<Option<TensorId>>,
    /// Outer-scope tensors that the node's subgraphs read (If/Loop/Scan); they are edges too.
    pub captures: Vec<TensorId>,
    /// The module scope path the exporter recorded outside the name (torch dynamo's
    /// `pkg.torch.onnx.name_scopes`), written like TorchScript's names
    /// (`/model/layers.0/mlp/linear_3`); `None` when the model records none and the name
    /// carries the scope, if any.
    pub module_scope: Option<String>,
}

impl Node {
    /// Where the node sits in the exporter's module tree: its recorded scope, else its name.
    pub fn scope(&self) -> &str {
        self.module_scope.as_deref().unwrap_or(&self.name)
    }
}

impl Node {
    /// Whether the node carries subgraphs (a control-flow node: one node of the graph, whose
    /// bodies are typed, costed and run as graphs of their own).
    pub fn has_subgraphs(&self) -> bool {
        self.attributes
            .values()
            .any(|a| matches!(a, Attribute::Graph(_) | Attribute::Graphs(_)))
    }
}

/// Where a tensor comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorOrigin {
    /// Supplied by the caller at run time.
    GraphInput,
    /// A weight stored with the model.
    Parameter(Param),
    /// Computed by a node.
    Node {
        /// The producing node.
        node: NodeId,
        /// Which of its outputs.
        output: usize,
    },
}

/// A parameter (initializer): its size and where its bytes live. The planner never reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Bytes the weight occupies in memory.
    pub bytes: u64,
    /// Where the bytes are stored.
    pub storage: Storage,
}

/// Storage of a parameter's bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// Inside the model protobuf.
    Embedded,
    /// In an external data file, resolved against the model's directory.
    External {
        /// The external file.
        path: PathBuf,
        /// Byte offset in the file.
        offset: u64,
        /// Byte length in the file.
        length: u64,
    },
    /// Built programmatically without bytes (e.g. a graph described by another framework).
    Declared,
}

/// A tensor: one value flowing along the edges of the graph.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// The tensor's name in the model.
    pub name: String,
    /// What the value is: a tensor, or a sequence or optional whose `dtype` and `shape` are
    /// those of its elements.
    pub kind: ValueKind,
    /// Element type, once known.
    pub dtype: Option<DType>,
    /// Shape, once known. For a sequence: the shape every element has (a symbol where they
    /// differ), `None` while not even the elements' rank is known.
    pub shape: Option<Shape>,
    /// Where the tensor comes from.
    pub origin: TensorOrigin,
    /// Contents known at plan time (small shape-computing tensors only).
    pub value: Option<ConstValue>,
    /// Nodes that read the tensor, in node order, each once.
    pub consumers: Vec<NodeId>,
}

impl Tensor {
    /// The parameter description, if the tensor is a weight.
    pub fn param(&self) -> Option<&Param> {
        match &self.origin {
            TensorOrigin::Parameter(p) => Some(p),
            _ => None,
        }
    }

    /// The producing node, if any.
    pub fn producer(&self) -> Option<NodeId> {
        match self.origin {
            TensorOrigin::Node { node, .. } => Some(node),
            _ => None,
        }
    }
}

/// The dataflow graph of a model.
#[derive(Debug, Clone)]
pub struct Graph {
    name: String,
    dag: StableDiGraph<Node, TensorId>,
    tensors: Vec<Tensor>,
    tensor_by_name: NameIndex,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    opsets: BTreeMap<String, i64>,
    topological_order: Vec<NodeId>,
    /// Measured seconds per node, per device name (`--profile`): the cost model uses them in
    /// place of its roofline on stages of that device.
    measured_secs: BTreeMap<String, (String, HashMap<NodeId, f64>)>,
}

impl Graph {
    /// Starts building a graph programmatically (the ONNX loader uses the same builder): for a
    /// framework that has its own graph and wants a plan without writing ONNX. Tensors are
    /// named as in ONNX; weights need only their size ([`Storage::Declared`]); node names
    /// scoped as PyTorch's exporter scopes them (`/net/blocks.0/fc/MatMul`) let the plan be
    /// expressed as PyTorch split points (`pipecut_planner::partition::torch_split`).
    ///
    /// ```
    /// use pipecut_ir::graph::{DType, Dim, Graph, NodeSpec, Param, Storage};
    /// use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
    ///
    /// let mut b = Graph::builder("net");
    /// b.opset("", 17);
    /// b.input("x", Some(DType::F16), Some(vec![Dim::Known(32), Dim::Known(64)]))?;
    /// let param = Param { bytes: 64 * 64 * 2, storage: Storage::Declared };
    /// b.parameter("net.fc.weight", DType::F16, &[64, 64], param, None)?;
    /// b.node(NodeSpec::new("/net/fc/MatMul", "MatMul", &["x", "net.fc.weight"], &["h"]))?;
    /// b.node(NodeSpec::new("/net/act/Relu", "Relu", &["h"], &["y"]))?;
    /// b.output("y");
    /// let mut graph = b.build()?;
    /// ShapeInference::new(DimBindings::new()).run(&mut graph)?;
    /// assert_eq!(graph.node_count(), 2);
    /// assert_eq!(graph.concrete_shape(graph.outputs()[0])?, vec![32, 64]);
    /// # Ok::<(), pipecut_ir::Error>(())
    /// ```
    pub fn builder(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder::new(name)
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.dag.node_count()
    }

    /// Number of edges (one per producer/consumer pair per tensor).
    pub fn edge_count(&self) -> usize {
        self.dag.edge_count()
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.dag[id.0]
    }

    /// Nodes in a deterministic topological order (ties broken by the model's node order).
    pub fn topological_order(&self) -> &[NodeId] {
        &self.topological_order
    }

    /// Records measured per-node times for stages on `device` (replacing earlier ones for it);
    /// `source` names the measurement (its file's sha256), so that a plan made on it can be
    /// checked against the same times.
    pub fn set_measured_secs(&mut self, device: &str, source: &str, secs: HashMap<NodeId, f64>) {
        self.measured_secs
            .insert(device.to_string(), (source.to_string(), secs));
    }

    /// The measured time of `node` on `device`, when a profile gave one.
    pub fn measured_secs(&self, device: &str, node: NodeId) -> Option<f64> {
        self.measured_secs.get(device)?.1.get(&node).copied()
    }

    /// The measurements in use: `(device, source)` pairs.
    pub fn measured_sources(&self) -> impl Iterator<Item = (&str, &str)> {
        self.measured_secs
            .iter()
            .map(|(device, (source, _))| (device.as_str(), source.as_str()))
    }

    /// All nodes with their ids, in topological order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.topological_order.iter().map(|&id| (id, self.node(id)))
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub(crate) fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.dag[id.0]
    }

    pub(crate) fn tensor_mut(&mut self, id: TensorId) -> &mut Tensor {
        &mut self.tensors[id.index()]
    }

    /// All tensors with their ids, in the order they were first named.
    pub fn tensors(&self) -> impl Iterator<Item = (TensorId, &Tensor)> {
        self.tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (TensorId(i as u32), t))
    }

    /// Costs the model as if every floating-point tensor (fp32, fp16, bf16) were `dtype`: the
    /// precision override of `--dtype`, since exporters usually write fp32 while training and
    /// serving run in bf16 or fp16. Parameter bytes scale with the element size (exactly: the
    /// sizes are 16 or 32 bits); fp64 and integer tensors are left alone. Only for costing: the
    /// stored weights are not converted.
    pub fn override_float_dtype(&mut self, dtype: DType) {
        let is_float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
        if !is_float(dtype) {
            return;
        }
        for tensor in &mut self.tensors {
            let Some(old) = tensor.dtype.filter(|&d| is_float(d)) else {
                continue;
            };
            if let TensorOrigin::Parameter(param) = &mut tensor.origin {
                param.bytes = param.bytes.saturating_mul(dtype.size_bits()) / old.size_bits();
            }
            tensor.dtype = Some(dtype);
        }
    }

    /// Looks a tensor up by name.
    pub fn tensor_id(&self, name: &str) -> Option<TensorId> {
        let tensors = &self.tensors;
        self.tensor_by_name
            .get(name, |id| tensors[id as usize].name.as_str())
            .map(TensorId)
    }

    /// Graph inputs supplied at run time (parameters excluded), in model order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Graph outputs, in model order.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Opset version per domain (`""` is the default ONNX domain).
    pub fn opsets(&self) -> &BTreeMap<String, i64> {
        &self.opsets
    }

    /// The opset version imported for a domain (`"ai.onnx"` and `""` are the same domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        self.opsets.get(domain).copied()
    }

    /// Parameters (weights) in the graph: tensor ids whose origin is [`TensorOrigin::Parameter`].
    pub fn parameters(&self) -> impl Iterator<Item = (TensorId, &Tensor)> {
        self.tensors().filter(|(_, t)| t.param().is_some())
    }

    /// Edges as (producer, consumer, tensor), in a deterministic order.
    pub fn edges(&self) -> impl Iterator<Item = (NodeId, NodeId, TensorId)> + '_ {
        self.topological_order.iter().flat_map(move |&id| {
            let mut out: Vec<_> = self
                .dag
                .edges_directed(id.0, Direction::Outgoing)
                .map(|e| (id, NodeId(e.target()), *e.weight()))
                .collect();
            out.sort_by_key(|&(_, to, t)| (to, t));
            out
        })
    }

    /// The concrete shape of a tensor, or an error naming the first unbound dim and the tensor.
    pub fn concrete_shape(&self, id: TensorId) -> Result<Vec<u64>, Error> {
        let tensor = self.tensor(id);
        let shape = tensor.shape.as_ref().ok_or_else(|| Error::UnknownShape {
            tensor: tensor.name.clone(),
        })?;
        shape
            .iter()
            .map(|d| match d {
                Dim::Known(v) => Ok(*v),
                Dim::Sym(s) => Err(Error::UnboundDim {
                    dim: s.to_string(),
                    tensor: tensor.name.clone(),
                }),
            })
            .collect()
    }

    /// The underlying petgraph graph, for algorithms that want it directly.
    pub fn petgraph(&self) -> &StableDiGraph<Node, TensorId> {
        &self.dag
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph '{}': {} nodes, {} tensors",
            self.name,
            self.node_count(),
            self.tensors.len()
        )
    }
}
