//! A summary of a loaded, shape-inferred model: what `pipecut inspect` prints.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use super::model::Model;
use super::shape::InferenceReport;
use crate::graph::{format_shape, Dim, TensorId};

/// One graph input or output.
#[derive(Debug, Clone, Serialize)]
pub struct TensorSummary {
    /// Tensor name.
    pub name: String,
    /// Element type, if known.
    pub dtype: Option<String>,
    /// Shape, if known; symbolic dims as strings. For a sequence or optional, its elements'
    /// shape; for a map or sequence of maps, `[entries]`.
    pub shape: Option<Vec<Dim>>,
    /// What the value is when it is not a tensor (`sequence`, `sequence of maps from int64`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Parameter totals for one element type.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ParamTotals {
    /// Number of parameter tensors.
    pub tensors: usize,
    /// Number of elements.
    pub elements: u64,
    /// Bytes in memory.
    pub bytes: u64,
}

/// What `pipecut inspect` reports about a model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    /// Graph name.
    pub graph: String,
    /// ONNX IR version.
    pub ir_version: i64,
    /// Exporter that wrote the file.
    pub producer: String,
    /// Protobuf file size.
    pub file_bytes: u64,
    /// Opset per domain (`ai.onnx` for the default).
    pub opsets: BTreeMap<String, i64>,
    /// Operator nodes (Constant nodes are counted as parameters, not here).
    pub nodes: usize,
    /// Producer→consumer edges.
    pub edges: usize,
    /// Tensors of any kind.
    pub tensors: usize,
    /// Node count per op type (`domain:op` outside the default domain).
    pub op_histogram: BTreeMap<String, usize>,
    /// Parameters by element type.
    pub parameters: BTreeMap<String, ParamTotals>,
    /// Bytes of parameters stored in external data files.
    pub external_parameter_bytes: u64,
    /// Graph inputs.
    pub inputs: Vec<TensorSummary>,
    /// Graph outputs.
    pub outputs: Vec<TensorSummary>,
    /// Symbolic dims of the inputs as loaded (what `--dim` can bind).
    pub symbolic_dims: BTreeSet<String>,
    /// Bindings applied.
    pub bound_dims: BTreeMap<String, u64>,
    /// What shape inference reported.
    pub inference: InferenceReport,
}

impl ModelSummary {
    /// Summarises `model` after inference. `symbolic_dims` are the input symbols as loaded.
    pub fn new(
        model: &Model,
        symbolic_dims: BTreeSet<String>,
        bound_dims: BTreeMap<String, u64>,
        inference: InferenceReport,
    ) -> ModelSummary {
        let graph = &model.graph;
        let mut op_histogram = BTreeMap::new();
        for (_, node) in graph.nodes() {
            let key = if node.domain.is_empty() {
                node.op_type.clone()
            } else {
                format!("{}:{}", node.domain, node.op_type)
            };
            *op_histogram.entry(key).or_insert(0) += 1;
        }
        let mut parameters: BTreeMap<String, ParamTotals> = BTreeMap::new();
        let mut external_parameter_bytes = 0;
        for (_, tensor) in graph.parameters() {
            let param = tensor.param().expect("parameters() yields parameters");
            let dtype = tensor
                .dtype
                .map_or("unknown".to_string(), |d| d.to_string());
            let totals = parameters.entry(dtype).or_default();
            totals.tensors += 1;
            totals.bytes += param.bytes;
            totals.elements += tensor
                .shape
                .iter()
                .flatten()
                .map(|d| d.known().unwrap_or(0))
                .product::<u64>();
            if matches!(param.storage, crate::graph::Storage::External { .. }) {
                external_parameter_bytes += param.bytes;
            }
        }
        let describe = |ids: &[TensorId]| {
            ids.iter()
                .map(|&id| {
                    let t = graph.tensor(id);
                    TensorSummary {
                        name: t.name.clone(),
                        dtype: t.dtype.map(|d| d.to_string()),
                        shape: t.shape.clone(),
                        kind: (!t.kind.is_tensor()).then(|| t.kind.to_string()),
                    }
                })
                .collect()
        };
        ModelSummary {
            graph: graph.name().to_string(),
            ir_version: model.ir_version,
            producer: model.producer.clone(),
            file_bytes: model.file_bytes,
            opsets: graph
                .opsets()
                .iter()
                .map(|(d, v)| {
                    (
                        if d.is_empty() {
                            "ai.onnx".to_string()
                        } else {
                            d.clone()
                        },
                        *v,
                    )
                })
                .collect(),
            nodes: graph.node_count(),
            edges: graph.edge_count(),
            tensors: graph.tensors().count(),
            op_histogram,
            parameters,
            external_parameter_bytes,
            inputs: describe(graph.inputs()),
            outputs: describe(graph.outputs()),
            symbolic_dims,
            bound_dims,
            inference,
        }
    }
}

/// Formats a byte count with a binary unit (`1.5 GiB`).
/// `n` and the noun, plural unless `n` is 1: "1 stage", "3 stages", "8 micro-batches".
pub fn count_of(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else if ["ch", "sh", "s", "x"].iter().any(|end| noun.ends_with(end)) {
        format!("{n} {noun}es")
    } else {
        format!("{n} {noun}s")
    }
}

/// Bytes in binary units (KiB, MiB, GiB: the one unit family every pipecut output uses).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

fn tensor_line(f: &mut fmt::Formatter<'_>, t: &TensorSummary) -> fmt::Result {
    let dtype = t.dtype.as_deref().unwrap_or("?");
    let shape = t
        .shape
        .as_deref()
        .map_or("(unknown shape)".to_string(), format_shape);
    match &t.kind {
        Some(kind) => writeln!(f, "  {:<40} {:<8} {} ({kind})", t.name, dtype, shape),
        None => writeln!(f, "  {:<40} {:<8} {}", t.name, dtype, shape),
    }
}

impl fmt::Display for ModelSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_model(f)?;
        self.write_parameters(f)?;
        self.write_interface(f)?;
        self.write_ops(f)?;
        self.write_inference(f)
    }
}

impl ModelSummary {
    /// The model's name, producer and size, its opsets and the graph's size.
    fn write_model(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "model     {} (IR {}, {}, {})",
            self.graph,
            self.ir_version,
            if self.producer.is_empty() {
                "unknown producer"
            } else {
                &self.producer
            },
            human_bytes(self.file_bytes)
        )?;
        let opsets: Vec<String> = self
            .opsets
            .iter()
            .map(|(d, v)| format!("{d} {v}"))
            .collect();
        writeln!(f, "opsets    {}", opsets.join(", "))?;
        writeln!(
            f,
            "graph     {} nodes, {} edges, {} tensors",
            self.nodes, self.edges, self.tensors
        )
    }

    /// The parameters' total, then by dtype.
    fn write_parameters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.parameters.values().map(|p| p.bytes).sum();
        writeln!(
            f,
            "params    {} in {} tensors ({} external)",
            human_bytes(total),
            self.parameters.values().map(|p| p.tensors).sum::<usize>(),
            human_bytes(self.external_parameter_bytes)
        )?;
        for (dtype, p) in &self.parameters {
            writeln!(
                f,
                "  {dtype:<10} {:>6} tensors {:>16} elements {:>12}",
                p.tensors,
                p.elements,
                human_bytes(p.bytes)
            )?;
        }
        Ok(())
    }

    /// The inputs and outputs, and the symbolic dims: bound, and still unbound.
    fn write_interface(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "inputs")?;
        for t in &self.inputs {
            tensor_line(f, t)?;
        }
        writeln!(f, "outputs")?;
        for t in &self.outputs {
            tensor_line(f, t)?;
        }
        let symbols: Vec<&str> = self.symbolic_dims.iter().map(String::as_str).collect();
        writeln!(
            f,
            "symbolic dims  {}",
            if symbols.is_empty() {
                "(none)".to_string()
            } else {
                symbols.join(", ")
            }
        )?;
        if !self.bound_dims.is_empty() {
            let bound: Vec<String> = self
                .bound_dims
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            writeln!(f, "bound          {}", bound.join(", "))?;
        }
        if !self.inference.unbound_symbols.is_empty() {
            let unbound: Vec<&str> = self
                .inference
                .unbound_symbols
                .iter()
                .map(String::as_str)
                .collect();
            writeln!(
                f,
                "unbound        {} (bind with --dim NAME=N)",
                unbound.join(", ")
            )?;
        }
        Ok(())
    }

    /// The op types, most frequent first.
    fn write_ops(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ops ({} types)", self.op_histogram.len())?;
        let mut ops: Vec<(&String, &usize)> = self.op_histogram.iter().collect();
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (op, count) in ops {
            writeln!(f, "  {op:<32} {count:>6}")?;
        }
        Ok(())
    }

    /// What shape inference could not handle.
    fn write_inference(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.inference.failures.is_empty() {
            return writeln!(f, "shape inference: every tensor typed");
        }
        writeln!(
            f,
            "shape inference could not handle {} node(s) ({} more skipped downstream):",
            self.inference.failures.len(),
            self.inference.skipped_nodes
        )?;
        for failure in &self.inference.failures {
            writeln!(f, "  {failure}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::count_of;

    #[test]
    fn counts_are_singular_for_one() {
        assert_eq!(count_of(1, "stage"), "1 stage");
        assert_eq!(count_of(3, "stage"), "3 stages");
        assert_eq!(count_of(0, "node"), "0 nodes");
        assert_eq!(count_of(1, "micro-batch"), "1 micro-batch");
        assert_eq!(count_of(8, "micro-batch"), "8 micro-batches");
    }
}
