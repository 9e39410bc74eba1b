//! Shape and dtype inference, with symbolic dims and constant propagation through the small
//! tensors that compute shapes (`Shape → Gather → Unsqueeze → Concat → Reshape`).
//!
//! Op knowledge lives in one file per op family, each registering its rules in the
//! [`registry`] through the one list of [`families`]; the context a rule sees is [`context`]'s,
//! and this module holds the driver. Arrows run one way: the driver reads the families' list
//! and the families read `context` and `registry`, never the driver (control flow infers its
//! bodies through the hook the driver puts in the context). A rule either
//! returns the outputs' types or an error in words; an op without a rule is an error naming the
//! op, its node and opset, never a guess.

mod attention;
mod collective;
mod context;
mod control;
mod crop;
mod data_dependent;
mod declared;
mod elementwise;
mod families;
mod linalg;
mod loss;
mod microsoft;
mod ml;
mod movement;
mod ms_quant;
mod nn;
mod quant;
mod random;
mod recurrent;
mod reduce;
mod registry;
mod sequence;
mod signal;
mod spatial;
mod state_space;
pub mod strings;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::graph::{element_count, ConstValue, Dim, Graph, SymDim, TensorId, MAX_TRACKED_ELEMENTS};
use crate::Error;

pub(crate) use context::{Inferred, OpCtx};
pub use families::supported_ops;

/// Values the user binds to symbolic dims (`--dim batch=8`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DimBindings(BTreeMap<String, u64>);

impl DimBindings {
    /// No bindings.
    pub fn new() -> DimBindings {
        DimBindings::default()
    }

    /// Binds `name` to `value`.
    pub fn bind(mut self, name: &str, value: u64) -> DimBindings {
        self.0.insert(name.to_string(), value);
        self
    }

    /// Parses `NAME=VALUE` as given on the command line.
    pub fn parse_arg(&mut self, arg: &str) -> Result<(), Error> {
        let (name, value) = arg
            .split_once('=')
            .ok_or_else(|| Error::DimBinding(format!("'{arg}' is not NAME=VALUE")))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(Error::DimBinding(format!("'{arg}' has no dim name")));
        }
        let value: u64 = value.trim().parse().map_err(|_| {
            Error::DimBinding(format!(
                "value of '{name}' must be a positive integer, got '{value}'"
            ))
        })?;
        // A zero dim makes every tensor that uses it empty: nothing to cost or run, and the
        // plan's throughput figures divide by it.
        if value == 0 {
            return Err(Error::DimBinding(format!(
                "'{arg}': a dim must be at least 1 ('{name}' = 0 makes its tensors empty)"
            )));
        }
        // A second binding of the same name is a typo or a leftover, not an override: taking the
        // last silently plans for a shape the user may not have meant.
        if let Some(&earlier) = self.0.get(name) {
            return Err(Error::DimBinding(format!(
                "'{name}' is bound twice ('{name}={earlier}' and '{name}={value}'); give it once"
            )));
        }
        self.0.insert(name.to_string(), value);
        Ok(())
    }

    /// The bound names and values.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Replaces bound symbols in a dim; `None` if the bound product overflows.
    fn substitute(&self, dim: &Dim) -> Option<Dim> {
        let Dim::Sym(sym) = dim else {
            return Some(dim.clone());
        };
        let mut result = Dim::Known(sym.coefficient());
        for name in sym.symbols() {
            let factor = match self.0.get(name) {
                Some(&v) => Dim::Known(v),
                None => Dim::Sym(SymDim::named(name)),
            };
            result = result.checked_mul(&factor)?;
        }
        Some(result)
    }
}

/// What inference did, for reports: symbols still unbound and, in lenient mode, what failed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InferenceReport {
    /// Symbolic dims of the graph inputs that no binding covers (`--dim NAME=N` binds them).
    pub unbound_symbols: BTreeSet<String>,
    /// Tensors whose shape still has a symbol that inference introduced for a size that depends
    /// on data or on unbound dims (named `<tensor>.<axis>`).
    pub tensors_with_derived_dims: usize,
    /// Ops without a shape rule, as `domain:op` (`ai.onnx` for the default domain) with counts.
    pub unsupported_ops: BTreeMap<String, usize>,
    /// Every node whose inference failed, with the reason (lenient mode only).
    pub failures: Vec<String>,
    /// Nodes not inferred because an input's shape was unknown (lenient mode only).
    pub skipped_nodes: usize,
}

/// Infers the dtype and shape of every tensor of a graph.
///
/// ```
/// use pipecut_ir::graph::{DType, Dim, Graph, NodeSpec};
/// use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
///
/// let mut b = Graph::builder("g");
/// b.opset("", 17);
/// b.input("x", Some(DType::F32), Some(vec![Dim::sym("batch"), Dim::Known(8)])).unwrap();
/// b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"])).unwrap();
/// b.output("y");
/// let mut graph = b.build().unwrap();
/// ShapeInference::new(DimBindings::new().bind("batch", 4)).run(&mut graph).unwrap();
/// let y = graph.tensor_id("y").unwrap();
/// assert_eq!(graph.concrete_shape(y).unwrap(), vec![4, 8]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ShapeInference {
    bindings: DimBindings,
    lenient: bool,
    input_values: BTreeMap<String, ConstValue>,
}

impl ShapeInference {
    /// Inference with these bindings; stops at the first node it cannot infer.
    pub fn new(bindings: DimBindings) -> ShapeInference {
        ShapeInference {
            bindings,
            lenient: false,
            input_values: BTreeMap::new(),
        }
    }

    /// Sample values of graph inputs, known at plan time: a graph input that carries a shape
    /// (Reduce axes, Slice starts, Split sizes, Reshape's shape, Resize sizes) then resolves the
    /// shapes it decides, as a constant would, instead of being refused. The plan holds for
    /// these values only. Each value must match its input's bound shape and hold at most
    /// [`MAX_TRACKED_ELEMENTS`] elements.
    pub fn with_input_values(mut self, values: BTreeMap<String, ConstValue>) -> ShapeInference {
        self.input_values = values;
        self
    }

    /// Keep going past nodes that fail and report them (for `inspect`) instead of stopping.
    pub fn lenient(mut self, lenient: bool) -> ShapeInference {
        self.lenient = lenient;
        self
    }

    /// Runs inference over the graph in topological order, filling every tensor's dtype,
    /// shape and (for small tensors) value.
    ///
    /// # Complexity
    /// O(V + E) rule calls; constant folding is bounded by [`MAX_TRACKED_ELEMENTS`] per tensor.
    pub fn run(&self, graph: &mut Graph) -> Result<InferenceReport, Error> {
        let mut known_symbols = self.bind_inputs(graph)?;
        let mut report = InferenceReport::default();
        let order = graph.topological_order().to_vec();
        let mut unknown: BTreeSet<TensorId> = BTreeSet::new();
        for node_id in order {
            let node = graph.node(node_id);
            let missing_input = node.inputs.iter().flatten().find(|&&t| {
                let t = graph.tensor(t);
                // A sequence's or optional's elements may have a shape not even the rank of
                // which is known; the rules of the ops that take them say when that matters.
                t.dtype.is_none() || (t.shape.is_none() && t.kind.is_tensor())
            });
            if let Some(&missing) = missing_input {
                if self.lenient && unknown.contains(&missing) {
                    report.skipped_nodes += 1;
                    unknown.extend(node.outputs.iter().flatten());
                    continue;
                }
                let err = Error::UnknownShape {
                    tensor: graph.tensor(missing).name.clone(),
                };
                if !self.lenient {
                    return Err(err);
                }
                report
                    .failures
                    .push(format!("node '{}' ({}): {err}", node.name, node.op_type));
                unknown.extend(node.outputs.iter().flatten());
                continue;
            }
            match infer_node(graph, node_id) {
                Ok(mut outputs) => {
                    // Subgraph-declared shapes name the outer symbols (`batch`) directly;
                    // bind them like the inputs'.
                    for out in &mut outputs {
                        known_symbols.extend(symbols_of_shape(&out.shape));
                        for dim in &mut out.shape {
                            if let Some(bound) = self.bindings.substitute(dim) {
                                *dim = bound;
                            }
                        }
                    }
                    store_outputs(graph, node_id, outputs)?;
                    store_typed_bodies(graph, node_id);
                }
                Err(err) if self.lenient => {
                    if let Error::UnsupportedOp { op, domain, .. } = &err {
                        *report
                            .unsupported_ops
                            .entry(format!("{domain}:{op}"))
                            .or_default() += 1;
                    }
                    report.failures.push(err.to_string());
                    unknown.extend(graph.node(node_id).outputs.iter().flatten());
                }
                Err(err) => return Err(err),
            }
        }
        self.check_bindings_named(&known_symbols)?;
        let symbols_of = symbols_of_shape;
        for &id in graph.inputs() {
            report
                .unbound_symbols
                .extend(symbols_of(graph.tensor(id).shape.as_deref().unwrap_or(&[])));
        }
        report.tensors_with_derived_dims = graph
            .tensors()
            .filter(|(_, t)| {
                symbols_of(t.shape.as_deref().unwrap_or(&[]))
                    .iter()
                    .any(|s| !report.unbound_symbols.contains(s))
            })
            .count();
        Ok(report)
    }

    /// Checks every binding names a symbol of the inputs or one that inference introduced for
    /// a size that depends on data (`--dim selected_indices.0=N`, which the unbound-dim error
    /// asks for): a name that is neither is a typo, not a binding to ignore.
    fn check_bindings_named(&self, known_symbols: &BTreeSet<String>) -> Result<(), Error> {
        for (name, _) in self.bindings.iter() {
            if !known_symbols.contains(name) {
                let known: Vec<_> = known_symbols.iter().cloned().collect();
                return Err(Error::DimBinding(format!(
                    "the model has no symbolic dim '{name}'; its symbolic dims are: {}",
                    if known.is_empty() {
                        "(none)".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }

    /// Substitutes the bindings into the inputs' shapes and refuses inputs whose size
    /// overflows; returns the inputs' symbols.
    fn bind_inputs(&self, graph: &mut Graph) -> Result<BTreeSet<String>, Error> {
        let inputs = graph.inputs().to_vec();
        let mut known_symbols = BTreeSet::new();
        for &id in &inputs {
            known_symbols.extend(symbols_of_shape(
                graph.tensor(id).shape.as_deref().unwrap_or(&[]),
            ));
        }
        for id in inputs {
            let tensor = graph.tensor_mut(id);
            let Some(shape) = tensor.shape.as_mut() else {
                continue;
            };
            for dim in shape.iter_mut() {
                *dim = self
                    .bindings
                    .substitute(dim)
                    .ok_or_else(|| Error::InvalidDim {
                        tensor: tensor.name.clone(),
                        detail: "a bound dimension overflows 64 bits".into(),
                    })?;
            }
            check_size(&tensor.name, shape, tensor.dtype)?;
        }
        self.set_input_values(graph)?;
        Ok(known_symbols)
    }

    /// Attaches [`ShapeInference::with_input_values`] to their inputs, checking each fits.
    fn set_input_values(&self, graph: &mut Graph) -> Result<(), Error> {
        for (name, value) in &self.input_values {
            let bad = |detail: String| Error::InvalidDim {
                tensor: name.clone(),
                detail,
            };
            let id = graph
                .tensor_id(name)
                .filter(|id| graph.inputs().contains(id))
                .ok_or_else(|| {
                    bad("a value was given for it, but it is not a graph input".into())
                })?;
            if value.len() as u64 > MAX_TRACKED_ELEMENTS {
                return Err(bad(format!(
                    "its value has {} elements; plan-time values hold at most {MAX_TRACKED_ELEMENTS}",
                    value.len()
                )));
            }
            let tensor = graph.tensor_mut(id);
            let shape = tensor.shape.as_deref().unwrap_or(&[]);
            match element_count(shape) {
                Some(Dim::Known(n)) if n == value.len() as u64 => {}
                _ => {
                    return Err(bad(format!(
                        "its value has {} elements but its shape is {}",
                        value.len(),
                        crate::graph::format_shape(shape)
                    )))
                }
            }
            tensor.value = Some(value.clone());
        }
        Ok(())
    }
}

/// The symbol names a shape's dims use.
fn symbols_of_shape(shape: &[Dim]) -> BTreeSet<String> {
    shape
        .iter()
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(s.symbols().map(str::to_string).collect::<Vec<_>>()),
            Dim::Known(_) => None,
        })
        .flatten()
        .collect()
}

/// Refuses shapes whose element or byte count overflows `u64`: no machine holds such a tensor
/// and every later size computation would wrap.
fn check_size(name: &str, shape: &[Dim], dtype: Option<crate::graph::DType>) -> Result<(), Error> {
    let overflow = || Error::InvalidDim {
        tensor: name.to_string(),
        detail: format!(
            "{} holds more elements than fit in 64 bits",
            crate::graph::format_shape(shape)
        ),
    };
    let count = element_count(shape).ok_or_else(overflow)?;
    if let (Dim::Known(n), Some(dtype)) = (count, dtype) {
        dtype.bytes_for(n).ok_or_else(overflow)?;
    }
    Ok(())
}

fn infer_node(graph: &Graph, node_id: crate::graph::NodeId) -> Result<Vec<Inferred>, Error> {
    let node = graph.node(node_id);
    let domain = registry::canonical_domain(&node.domain);
    let opset = graph.opset(domain).unwrap_or(0);
    let display_domain = if domain.is_empty() { "ai.onnx" } else { domain };
    let value_input = node
        .inputs
        .iter()
        .flatten()
        .map(|&t| graph.tensor(t))
        .find(|t| !t.kind.is_tensor());
    if let Some(input) = value_input.filter(|_| {
        !sequence::takes_values(domain, &node.op_type) && !ml::takes_maps(domain, &node.op_type)
    }) {
        return Err(Error::ShapeInference {
            node: node.name.clone(),
            op: node.op_type.clone(),
            detail: format!(
                "input '{}' is a {}; the op takes tensors",
                input.name, input.kind
            ),
        });
    }
    let rule = families::registry()
        .lookup(domain, &node.op_type)
        .ok_or_else(|| Error::UnsupportedOp {
            op: node.op_type.clone(),
            domain: display_domain.to_string(),
            opset,
            node: node.name.clone(),
        })?;
    let ctx = OpCtx::new(graph, node, opset, infer_body);
    rule(&ctx).map_err(|detail| Error::ShapeInference {
        node: node.name.clone(),
        op: node.op_type.clone(),
        detail,
    })
}

/// Inference over a control-flow node's body, for its rule ([`OpCtx::infer_subgraph`]): no
/// bindings, as the body's inputs come typed from the node's.
fn infer_body(body: &mut Graph) -> Result<(), Error> {
    ShapeInference::new(DimBindings::new()).run(body).map(drop)
}

/// Replaces a control-flow node's subgraphs by the bodies its rule typed, so that costing and
/// running them see their tensors' types.
fn store_typed_bodies(graph: &mut Graph, node_id: crate::graph::NodeId) {
    let node = graph.node(node_id);
    if !node.has_subgraphs() || !registry::canonical_domain(&node.domain).is_empty() {
        return;
    }
    let ctx = OpCtx::new(graph, node, graph.opset("").unwrap_or(0), infer_body);
    let bodies = control::typed_bodies(&ctx);
    let node = graph.node_mut(node_id);
    for (name, body) in bodies {
        if let Some(crate::graph::Attribute::Graph(sub)) = node.attributes.get_mut(name) {
            sub.body = std::sync::Arc::new(body);
        }
    }
}

fn store_outputs(
    graph: &mut Graph,
    node_id: crate::graph::NodeId,
    outputs: Vec<Inferred>,
) -> Result<(), Error> {
    let node = graph.node(node_id);
    if outputs.len()
        < node
            .outputs
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |p| p + 1)
    {
        return Err(Error::ShapeInference {
            node: node.name.clone(),
            op: node.op_type.clone(),
            detail: format!(
                "the node has {} outputs but the op defines {}",
                node.outputs.len(),
                outputs.len()
            ),
        });
    }
    // The slots by index, not a copy of them: a copy, and the node's name and op copied for an
    // error that never came, were three allocations per node of a million-node graph.
    for (index, inferred) in outputs.into_iter().enumerate() {
        let Some(Some(id)) = graph.node(node_id).outputs.get(index).copied() else {
            continue;
        };
        if !inferred.shape_known {
            let tensor = graph.tensor_mut(id);
            tensor.kind = inferred.kind;
            tensor.dtype = Some(inferred.dtype);
            tensor.shape = None;
            tensor.value = None;
            continue;
        }
        check_size(
            &graph.tensor(id).name,
            &inferred.shape,
            Some(inferred.dtype),
        )?;
        let tracked = matches!(element_count(&inferred.shape), Some(Dim::Known(n)) if n <= MAX_TRACKED_ELEMENTS);
        let tensor = graph.tensor_mut(id);
        tensor.kind = inferred.kind;
        tensor.dtype = Some(inferred.dtype);
        tensor.value = inferred.value.filter(|v| {
            inferred.kind.is_tensor()
                && tracked
                && Some(Dim::Known(v.len() as u64)) == element_count(&inferred.shape)
        });
        tensor.shape = Some(inferred.shape);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
