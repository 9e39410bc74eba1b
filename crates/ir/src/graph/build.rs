//! Building a [`Graph`] by names, the way ONNX describes one: tensors are created when first
//! mentioned and linked to their producer when the producing node or input is declared.

use std::collections::BTreeMap;

use petgraph::stable_graph::StableDiGraph;

use super::{
    validate, Attribute, Attributes, DType, Graph, NameIndex, Node, NodeId, Param, Shape, Tensor,
    TensorId, TensorOrigin,
};
use crate::graph::ConstValue;
use crate::Error;

/// A node to add through [`GraphBuilder::node`]. Empty input/output names mark omitted optional
/// slots, as in ONNX.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec {
    /// Node name; must be unique within the graph.
    pub name: String,
    /// Operator type.
    pub op_type: String,
    /// Operator domain (`""` for the default ONNX domain).
    pub domain: String,
    /// Input tensor names by position.
    pub inputs: Vec<String>,
    /// Output tensor names by position.
    pub outputs: Vec<String>,
    /// Attributes.
    pub attributes: Attributes,
    /// Outer-scope tensors read by the node's subgraphs.
    pub captures: Vec<String>,
    /// The module scope recorded beside the name (see [`Node::module_scope`]).
    pub module_scope: Option<String>,
}

impl NodeSpec {
    /// A node with the given name, op type and tensor names in the default domain.
    pub fn new(name: &str, op_type: &str, inputs: &[&str], outputs: &[&str]) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            op_type: op_type.to_string(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            ..NodeSpec::default()
        }
    }

    /// Adds an attribute.
    pub fn attr(mut self, name: &str, value: Attribute) -> NodeSpec {
        self.attributes.insert(name.to_string(), value);
        self
    }
}

/// Builds a [`Graph`]; [`GraphBuilder::build`] validates it.
#[derive(Debug)]
pub struct GraphBuilder {
    name: String,
    dag: StableDiGraph<Node, TensorId>,
    /// Tensors as named so far, in the order the graph keeps them.
    tensors: Vec<Tensor>,
    /// Whether `tensors[i]` has a producer yet (its `origin` is only a placeholder until then).
    /// Apart from the tensors so that [`GraphBuilder::build`] finishes them in place: moving a
    /// million tensors into a new vector was a tenth of a million-node model's load.
    produced: Vec<bool>,
    /// Tensors by their name in `tensors`.
    tensor_by_name: NameIndex,
    /// Nodes by their name in `dag`.
    node_names: NameIndex,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    opsets: BTreeMap<String, i64>,
}

impl GraphBuilder {
    pub(super) fn new(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            name: name.into(),
            dag: StableDiGraph::new(),
            tensors: Vec::new(),
            produced: Vec::new(),
            tensor_by_name: NameIndex::default(),
            node_names: NameIndex::default(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            opsets: BTreeMap::new(),
        }
    }

    /// Declares the opset version of a domain (`""` or `"ai.onnx"` for the default domain).
    pub fn opset(&mut self, domain: &str, version: i64) -> &mut Self {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        self.opsets.insert(domain.to_string(), version);
        self
    }

    /// Makes room for `nodes` more nodes and `tensors` more tensors, so that the name tables
    /// of a large model are not rehashed as they grow.
    pub fn reserve(&mut self, nodes: usize, tensors: usize) -> &mut Self {
        self.dag.reserve_nodes(nodes);
        let dag = &self.dag;
        self.node_names.reserve(nodes, |id| node_name(dag, id));
        self.tensors.reserve(tensors);
        self.produced.reserve(tensors);
        let named = &self.tensors;
        self.tensor_by_name
            .reserve(tensors, |id| tensor_name(named, id));
        self
    }

    /// The tensor named `name`, created when first named. Takes a `String` to keep it (a
    /// node's outputs are new names) or a `&str` to copy it.
    fn intern(&mut self, name: impl AsRef<str> + Into<String>) -> TensorId {
        if let Some(id) = self.tensor_id(name.as_ref()) {
            return id;
        }
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            name: name.into(),
            kind: super::ValueKind::Tensor,
            dtype: None,
            shape: None,
            origin: TensorOrigin::GraphInput,
            value: None,
            consumers: Vec::new(),
        });
        self.produced.push(false);
        let named = &self.tensors;
        self.tensor_by_name
            .insert_new(id.0, |id| tensor_name(named, id));
        id
    }

    fn tensor_id(&self, name: &str) -> Option<TensorId> {
        let named = &self.tensors;
        self.tensor_by_name
            .get(name, |id| tensor_name(named, id))
            .map(TensorId)
    }

    /// Records `origin` as the producer of `name`; `who` names it in the error when the tensor
    /// has one already (a closure: formatting a node's name for every output was a string per
    /// tensor on the way to no error).
    fn set_origin(
        &mut self,
        name: impl AsRef<str> + Into<String>,
        origin: TensorOrigin,
        who: impl FnOnce(&StableDiGraph<Node, TensorId>) -> String,
    ) -> Result<TensorId, Error> {
        let id = self.intern(name);
        if self.produced[id.index()] {
            let first = match &self.tensors[id.index()].origin {
                TensorOrigin::GraphInput => "graph input".to_string(),
                TensorOrigin::Parameter(_) => "initializer".to_string(),
                TensorOrigin::Node { node, .. } => {
                    format!("node '{}'", self.dag[node.0].name)
                }
            };
            return Err(Error::DuplicateProducer {
                tensor: self.tensors[id.index()].name.clone(),
                first,
                second: who(&self.dag),
            });
        }
        self.produced[id.index()] = true;
        self.tensors[id.index()].origin = origin;
        Ok(id)
    }

    /// Says what kind of value an input or output is (a sequence, an optional); tensors need not.
    pub fn kind(&mut self, name: &str, kind: super::ValueKind) {
        let id = self.intern(name);
        self.tensors[id.index()].kind = kind;
    }

    /// Declares a graph input with its type. Dims may be symbolic.
    pub fn input(
        &mut self,
        name: &str,
        dtype: Option<DType>,
        shape: Option<Shape>,
    ) -> Result<TensorId, Error> {
        let id = self.set_origin(name, TensorOrigin::GraphInput, |_| "graph input".into())?;
        let tensor = &mut self.tensors[id.index()];
        tensor.dtype = dtype;
        tensor.shape = shape;
        self.inputs.push(id);
        Ok(id)
    }

    /// Declares a parameter (weight) with concrete dims, its storage, and optionally its value.
    pub fn parameter(
        &mut self,
        name: &str,
        dtype: DType,
        dims: &[u64],
        param: Param,
        value: Option<ConstValue>,
    ) -> Result<TensorId, Error> {
        let id = self.set_origin(name, TensorOrigin::Parameter(param), |_| {
            "initializer".into()
        })?;
        let tensor = &mut self.tensors[id.index()];
        tensor.dtype = Some(dtype);
        tensor.shape = Some(dims.iter().map(|&d| d.into()).collect());
        tensor.value = value;
        Ok(id)
    }

    /// Whether a node with this name has been added.
    pub fn has_node(&self, name: &str) -> bool {
        let dag = &self.dag;
        self.node_names.get(name, |id| node_name(dag, id)).is_some()
    }

    /// Whether a tensor with this name has a producer (input, parameter or node) already.
    pub fn is_defined(&self, name: &str) -> bool {
        self.tensor_id(name)
            .is_some_and(|id| self.produced[id.index()])
    }

    /// Adds a node. Its input tensors may be produced by nodes added later.
    pub fn node(&mut self, mut spec: NodeSpec) -> Result<NodeId, Error> {
        let inputs = std::mem::take(&mut spec.inputs);
        self.node_reading(spec, inputs)
    }

    /// [`GraphBuilder::node`] with the input names apart from the spec (whose `inputs` are
    /// ignored): the loader lends them from the decoded model, since an input names a tensor
    /// the builder mostly has already, and a copy of the name would only be freed again.
    pub(crate) fn node_reading<S: AsRef<str> + Into<String>>(
        &mut self,
        spec: NodeSpec,
        inputs: impl IntoIterator<Item = S>,
    ) -> Result<NodeId, Error> {
        // The spec's strings move into the graph: copying them was an allocation and a free
        // per name, millions of each for a million-node model.
        let NodeSpec {
            name,
            op_type,
            domain,
            outputs,
            attributes,
            captures,
            module_scope,
            ..
        } = spec;
        let dag = &self.dag;
        if let Some(existing) = self.node_names.get(&name, |id| node_name(dag, id)) {
            return Err(Error::InvalidGraph(format!(
                "two nodes are named '{name}' (nodes #{existing} and #{})",
                self.dag.node_count()
            )));
        }
        let node_id = NodeId(self.dag.add_node(Node {
            name,
            op_type,
            domain: if domain == "ai.onnx" {
                String::new()
            } else {
                domain
            },
            attributes,
            inputs: Vec::new(),
            outputs: Vec::new(),
            captures: Vec::new(),
            module_scope,
        }));
        let inputs: Vec<Option<TensorId>> = inputs
            .into_iter()
            .map(|n| (!n.as_ref().is_empty()).then(|| self.intern(n)))
            .collect();
        let captures: Vec<TensorId> = captures.into_iter().map(|n| self.intern(n)).collect();
        let mut output_ids = Vec::with_capacity(outputs.len());
        for (index, out) in outputs.into_iter().enumerate() {
            if out.is_empty() {
                output_ids.push(None);
                continue;
            }
            let origin = TensorOrigin::Node {
                node: node_id,
                output: index,
            };
            let who =
                |dag: &StableDiGraph<Node, TensorId>| format!("node '{}'", dag[node_id.0].name);
            output_ids.push(Some(self.set_origin(out, origin, who)?));
        }
        let dag = &self.dag;
        self.node_names
            .insert_new(node_id.index() as u32, |id| node_name(dag, id));
        let node = &mut self.dag[node_id.0];
        node.inputs = inputs;
        node.outputs = output_ids;
        node.captures = captures;
        Ok(node_id)
    }

    /// Marks a tensor as a graph output.
    pub fn output(&mut self, name: &str) -> TensorId {
        let id = self.intern(name);
        self.outputs.push(id);
        id
    }

    /// Sets the declared type of a tensor (e.g. from an ONNX graph output's type).
    pub fn declare_type(&mut self, name: &str, dtype: Option<DType>, shape: Option<Shape>) {
        let id = self.intern(name);
        let tensor = &mut self.tensors[id.index()];
        tensor.dtype = tensor.dtype.or(dtype);
        if tensor.shape.is_none() {
            tensor.shape = shape;
        }
    }

    /// Links producers to consumers and validates the graph: it must be non-empty, every tensor
    /// read must have a producer, and there must be no cycle.
    pub fn build(self) -> Result<Graph, Error> {
        if self.dag.node_count() == 0 {
            return Err(Error::EmptyGraph { graph: self.name });
        }
        self.build_subgraph()
    }

    /// Builds the body of a subgraph, which, unlike a model's graph, may have no nodes at all
    /// (an `If` branch that returns a constant or an outer tensor).
    pub fn build_subgraph(self) -> Result<Graph, Error> {
        let GraphBuilder {
            name,
            mut dag,
            mut tensors,
            produced,
            tensor_by_name,
            inputs,
            outputs,
            opsets,
            ..
        } = self;
        if let Some(position) = produced.iter().position(|&produced| !produced) {
            let reader = dag.node_indices().find(|&id| {
                let node = &dag[id];
                node.inputs
                    .iter()
                    .flatten()
                    .chain(&node.captures)
                    .any(|t| t.index() == position)
            });
            let reader = match reader {
                Some(id) => format!("node '{}'", dag[id].name),
                None => "the graph outputs".to_string(),
            };
            return Err(Error::MissingProducer {
                tensor: std::mem::take(&mut tensors[position].name),
                reader,
            });
        }
        let node_ids: Vec<NodeId> = dag.node_indices().map(NodeId).collect();
        // At most one edge per read: reserved, so that a million edges are not moved as the
        // vector doubles.
        let reads = node_ids.iter().map(|&id| {
            let node = &dag[id.0];
            node.inputs.len() + node.captures.len()
        });
        dag.reserve_edges(reads.sum());
        // One buffer for every node's reads: a vector per node was a million allocations.
        let mut read: Vec<TensorId> = Vec::new();
        for &consumer in &node_ids {
            let node = &dag[consumer.0];
            read.clear();
            read.extend(node.inputs.iter().flatten().chain(&node.captures));
            read.sort();
            read.dedup();
            for &tensor_id in &read {
                let tensor = &mut tensors[tensor_id.index()];
                tensor.consumers.push(consumer);
                if let TensorOrigin::Node { node: producer, .. } = tensor.origin {
                    dag.add_edge(producer.0, consumer.0, tensor_id);
                }
            }
        }
        let topological_order = validate::topological_order(&dag)?;
        Ok(Graph {
            name,
            dag,
            tensors,
            tensor_by_name,
            inputs,
            outputs,
            opsets,
            topological_order,
            measured_secs: BTreeMap::new(),
        })
    }
}

/// The name of node `id` of `dag`, for the builder's node index.
fn node_name(dag: &StableDiGraph<Node, TensorId>, id: u32) -> &str {
    &dag[petgraph::stable_graph::NodeIndex::new(id as usize)].name
}

/// The name of tensor `id`, for the builder's tensor index.
fn tensor_name(tensors: &[Tensor], id: u32) -> &str {
    &tensors[id as usize].name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Dim;

    fn chain() -> GraphBuilder {
        let mut b = Graph::builder("chain");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![Dim::sym("batch"), Dim::Known(4)]),
        )
        .unwrap();
        b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"]))
            .unwrap();
        b.node(NodeSpec::new("neg", "Neg", &["y"], &["z"])).unwrap();
        b.output("z");
        b
    }

    #[test]
    fn builds_edges_between_producers_and_consumers() {
        let g = chain().build().unwrap();
        assert_eq!(g.node_count(), 2);
        assert_eq!(g.edge_count(), 1);
        let names: Vec<_> = g.nodes().map(|(_, n)| n.name.as_str()).collect();
        assert_eq!(names, ["relu", "neg"]);
        let y = g.tensor_id("y").unwrap();
        assert_eq!(g.tensor(y).consumers.len(), 1);
    }

    #[test]
    fn lent_input_names_build_the_same_node() {
        let mut b = Graph::builder("lent");
        b.input("x", Some(DType::F32), Some(vec![])).unwrap();
        let spec = NodeSpec::new("add", "Add", &["ignored"], &["y"]);
        b.node_reading(spec, ["x", "", "x"]).unwrap();
        b.output("y");
        let g = b.build().unwrap();
        let (_, add) = g.nodes().next().unwrap();
        let x = g.tensor_id("x").unwrap();
        assert_eq!(add.inputs, [Some(x), None, Some(x)]);
        assert!(g.tensor_id("ignored").is_none());
        assert_eq!(g.tensor(x).consumers.len(), 1);
    }

    #[test]
    fn nodes_declared_out_of_order_are_sorted() {
        let mut b = Graph::builder("reversed");
        b.input("x", Some(DType::F32), Some(vec![])).unwrap();
        b.node(NodeSpec::new("second", "Neg", &["y"], &["z"]))
            .unwrap();
        b.node(NodeSpec::new("first", "Neg", &["x"], &["y"]))
            .unwrap();
        b.output("z");
        let g = b.build().unwrap();
        let names: Vec<_> = g.nodes().map(|(_, n)| n.name.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
    }

    #[test]
    fn missing_producer_names_tensor_and_reader() {
        let mut b = chain();
        b.node(NodeSpec::new("add", "Add", &["z", "ghost"], &["w"]))
            .unwrap();
        let err = b.build().unwrap_err().to_string();
        assert!(err.contains("'ghost'") && err.contains("'add'"), "{err}");
    }

    #[test]
    fn duplicate_producer_is_refused() {
        let mut b = chain();
        let err = b
            .node(NodeSpec::new("again", "Relu", &["x"], &["y"]))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("'y'") && msg.contains("'relu'") && msg.contains("'again'"),
            "{msg}"
        );
    }

    #[test]
    fn empty_graph_is_refused() {
        let b = Graph::builder("nothing");
        assert!(matches!(b.build(), Err(Error::EmptyGraph { .. })));
    }

    #[test]
    fn cycle_names_its_nodes() {
        let mut b = Graph::builder("loop");
        b.input("x", Some(DType::F32), Some(vec![])).unwrap();
        b.node(NodeSpec::new("a", "Add", &["x", "c"], &["b"]))
            .unwrap();
        b.node(NodeSpec::new("b", "Neg", &["b"], &["c"])).unwrap();
        b.output("c");
        let msg = b.build().unwrap_err().to_string();
        assert!(
            msg.contains("cycle") && msg.contains("'a'") && msg.contains("'b'"),
            "{msg}"
        );
    }
}
