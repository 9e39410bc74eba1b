//! The roofline: from a node's work to its time on a device, and the per-node cost table.

use serde::{Deserialize, Serialize};

use super::hardware::{HardwareSpec, OpClass};
use super::mode::Mode;
use super::ops::{rule_for, CostCtx, OpWork};
use crate::Error;
use pipecut_ir::graph::{Attribute, Graph, Node, NodeId, Subgraph};

/// What to do with an op the cost model has no rule for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UnknownOpCost {
    /// Refuse, naming the op (the default: a silent guess would skew the plan).
    #[default]
    Error,
    /// Cost it as free.
    Zero,
    /// Cost it as a copy of its inputs and outputs.
    Bytes,
}

/// The cost of one node on one device, for one micro-batch.
#[derive(Debug, Clone, Serialize)]
pub struct NodeCost {
    /// Node name.
    pub node: String,
    /// Operator type.
    pub op: String,
    /// Op class used for its efficiency.
    pub class: OpClass,
    /// FLOPs of the forward pass.
    pub flops: f64,
    /// Bytes moved by the forward pass.
    pub bytes_moved: f64,
    /// Time on the device (forward, plus backward in training).
    pub time_secs: f64,
    /// Parameter bytes the node reads.
    pub param_bytes: u64,
    /// Bytes of its outputs.
    pub output_bytes: u64,
    /// Whether the cost is a guess: the op had no rule and was costed by the fallback, or it is
    /// control flow whose trip count was not known at plan time and was assumed to be 1.
    pub fallback: bool,
    /// Whether `time_secs` comes from a measurement (`--profile`), not the roofline.
    pub measured: bool,
}

/// The precision a model is costed at when `--dtype` overrides the file's (see
/// [`pipecut_ir::graph::Graph::override_float_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    Fp16,
    /// IEEE single precision.
    Fp32,
}

impl Precision {
    /// The element type.
    pub fn dtype(self) -> pipecut_ir::graph::DType {
        match self {
            Precision::Bf16 => pipecut_ir::graph::DType::BF16,
            Precision::Fp16 => pipecut_ir::graph::DType::F16,
            Precision::Fp32 => pipecut_ir::graph::DType::F32,
        }
    }
}

/// Costs nodes on one device with the roofline model.
#[derive(Debug, Clone)]
pub struct CostModel<'a> {
    device: &'a HardwareSpec,
    unknown_ops: UnknownOpCost,
    mode: Mode,
}

impl<'a> CostModel<'a> {
    /// Costs on `device`, inference, unknown ops refused.
    pub fn new(device: &'a HardwareSpec) -> CostModel<'a> {
        CostModel {
            device,
            unknown_ops: UnknownOpCost::Error,
            mode: Mode::Inference,
        }
    }

    /// What to do with ops without a rule.
    pub fn with_unknown_ops(mut self, policy: UnknownOpCost) -> Self {
        self.unknown_ops = policy;
        self
    }

    /// Inference or training.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The device.
    pub fn device(&self) -> &HardwareSpec {
        self.device
    }

    /// Time of some work on the device: the slower of compute and memory traffic at the class's
    /// achievable fraction of peak, plus kernel launches.
    ///
    /// Compute-bound classes (matmul, conv) use their efficiency against the dtype's tensor
    /// peak and the streaming (elementwise) efficiency for their memory traffic; memory-bound
    /// classes use their own efficiency for traffic and the fp32 vector peak for their maths.
    pub fn time_secs(&self, work: &OpWork) -> f64 {
        let d = self.device;
        let bandwidth = d.memory_bandwidth_bytes_per_sec.value;
        let (peak, compute_eff, memory_eff) = match work.class {
            OpClass::Matmul | OpClass::Conv => (
                d.peak_flops(work.dtype),
                d.efficiency.of(work.class),
                d.efficiency.of(OpClass::Elementwise),
            ),
            class => (
                d.vector_flops(),
                d.efficiency.of(class),
                d.efficiency.of(class),
            ),
        };
        let compute = work.flops / (peak * compute_eff);
        let memory = work.bytes / (bandwidth * memory_eff);
        compute.max(memory) + work.launches as f64 * d.kernel_launch_overhead_secs.value
    }

    /// The work of one node: by its op's rule, zero when every output is known at plan time
    /// (a runtime folds such nodes), or the fallback for unknown ops.
    pub fn work(&self, graph: &Graph, id: NodeId) -> Result<(OpWork, bool), Error> {
        let node = graph.node(id);
        if node.has_subgraphs() && (node.domain.is_empty() || node.domain == "ai.onnx") {
            // A body whose types inference could not find cannot be costed: as an unknown op.
            return match (self.control_flow_work(graph, node), self.unknown_ops) {
                (Ok(work), _) => Ok(work),
                (Err(e), UnknownOpCost::Error) => Err(e),
                (Err(_), UnknownOpCost::Zero) => Ok((OpWork::NONE, true)),
                (Err(_), UnknownOpCost::Bytes) => Ok((ctx_bytes(graph, id), true)),
            };
        }
        let ctx = CostCtx::new(graph, node)?;
        let folded = node
            .outputs
            .iter()
            .flatten()
            .all(|&t| graph.tensor(t).value.is_some());
        if folded {
            return Ok((OpWork::NONE, false));
        }
        let fail = |detail: String| Error::Cost {
            node: node.name.clone(),
            op: node.op_type.clone(),
            detail,
        };
        match rule_for(&node.domain, &node.op_type) {
            Some(rule) => Ok((rule(&ctx).map_err(fail)?, false)),
            None => match self.unknown_ops {
                UnknownOpCost::Error => Err(Error::NoCostRule {
                    op: node.op_type.clone(),
                    domain: if node.domain.is_empty() {
                        "ai.onnx".into()
                    } else {
                        node.domain.clone()
                    },
                    node: node.name.clone(),
                }),
                UnknownOpCost::Zero => Ok((OpWork::NONE, true)),
                UnknownOpCost::Bytes => Ok((ctx_bytes(graph, id), true)),
            },
        }
    }

    /// The cost of one node.
    pub fn node_cost(&self, graph: &Graph, id: NodeId) -> Result<NodeCost, Error> {
        let timed = self.timed_work(graph, id)?;
        let (work, fallback, measured, time_secs) = timed;
        let node = graph.node(id);
        let param_bytes = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|&t| graph.tensor(t).param())
            .map(|p| p.bytes)
            .sum();
        let output_bytes = node
            .outputs
            .iter()
            .flatten()
            .map(|&t| tensor_bytes(graph, t))
            .sum::<Result<u64, Error>>()?;
        Ok(NodeCost {
            node: node.name.clone(),
            op: node.op_type.clone(),
            class: work.class,
            flops: work.flops,
            bytes_moved: work.bytes,
            time_secs,
            param_bytes,
            output_bytes,
            fallback,
            measured: measured.is_some(),
        })
    }

    /// The node's time on the device ([`NodeCost::time_secs`]) without the rest of its
    /// [`NodeCost`]: no names copied, for the partition problem's million-node tables. Fails
    /// where [`Self::node_cost`] fails.
    pub fn node_time_secs(&self, graph: &Graph, id: NodeId) -> Result<f64, Error> {
        let (_, _, _, time_secs) = self.timed_work(graph, id)?;
        for &t in graph.node(id).outputs.iter().flatten() {
            tensor_bytes(graph, t)?;
        }
        Ok(time_secs)
    }

    /// [`Self::node_time_secs`] and the node's forward FLOPs as [`Self::model_flops`] counts
    /// them, `None` where only a measured time stands (no rule gave its work): one costing
    /// serves the plan and the MFU line.
    pub fn node_time_and_flops(
        &self,
        graph: &Graph,
        id: NodeId,
    ) -> Result<(f64, Option<f64>), Error> {
        let (work, _, measured, time_secs) = self.timed_work(graph, id)?;
        for &t in graph.node(id).outputs.iter().flatten() {
            tensor_bytes(graph, t)?;
        }
        let ruled = measured.is_none() || self.work(graph, id).is_ok();
        Ok((time_secs, ruled.then_some(work.flops)))
    }

    /// The node's work, whether it is a fallback guess, its measured time if any, and its time.
    fn timed_work(
        &self,
        graph: &Graph,
        id: NodeId,
    ) -> Result<(OpWork, bool, Option<f64>, f64), Error> {
        let measured = graph.measured_secs(&self.device.name, id);
        let (work, fallback) = match (self.work(graph, id), measured) {
            (Ok(work), _) => work,
            // A measured op needs no rule for its time; its FLOPs stay unknown (zero).
            (Err(_), Some(_)) => (OpWork::NONE, false),
            (Err(error), None) => return Err(error),
        };
        let forward = measured.unwrap_or_else(|| self.time_secs(&work));
        let time_secs = match self.mode {
            Mode::Inference => forward,
            // Launch overhead is paid again by the backward kernels; compute scales by the factor.
            Mode::Training { .. } => forward * (1.0 + self.mode.backward_time_factor()),
        };
        Ok((work, fallback, measured, time_secs))
    }

    /// Costs every node, in topological order.
    pub fn node_costs(&self, graph: &Graph) -> Result<Vec<(NodeId, NodeCost)>, Error> {
        graph
            .topological_order()
            .iter()
            .map(|&id| Ok((id, self.node_cost(graph, id)?)))
            .collect()
    }

    /// FLOPs of one pass of `graph` (dims bound) in this mode: the forward FLOPs of every node,
    /// times `1 + backward_factor` in training (the backward pass computes about twice the
    /// forward's FLOPs). The numerator of MFU; independent of the device.
    pub fn model_flops(&self, graph: &Graph) -> Result<f64, Error> {
        let flops = per_node_on_threads(graph, graph.topological_order(), |id| {
            self.work(graph, id).map(|(work, _)| work.flops)
        })?;
        // Summed in the order, as one pass would.
        Ok(self.pass_flops(flops.iter().sum()))
    }

    /// The FLOPs of one pass in this mode whose forward takes `forward` FLOPs.
    pub fn pass_flops(&self, forward: f64) -> f64 {
        match self.mode {
            Mode::Inference => forward,
            Mode::Training {
                backward_factor, ..
            } => forward * (1.0 + backward_factor),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// Below this many nodes a per-node pass runs on one thread: starting threads costs more.
const NODES_PER_THREAD: usize = 16_384;

/// `per_node` of every node of `order`, in order, the order split between the machine's cores
/// (at most 8): costing is the largest phase a solve cannot skip (about 3 s for a million
/// nodes on one core, all before any plan exists), and `plan-cluster`'s MFU line costs the
/// model again after it (`partition` reuses the solve's FLOPs). Each part runs as the whole would, and the first error in the order is the one
/// returned, so the result does not depend on the number of threads.
pub fn per_node_on_threads<T: Send>(
    graph: &Graph,
    order: &[NodeId],
    per_node: impl Fn(NodeId) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let per_thread = order.len().div_ceil(threads).max(NODES_PER_THREAD);
    per_node_in_parts(graph, order, per_thread, per_node)
}

/// [`per_node_on_threads`] with `order` cut into parts of `per_thread` nodes, one thread each.
/// Each part asks for the slots and then the shapes of the nodes it costs a little ahead of
/// costing them ([`super::prefetch`]).
pub fn per_node_in_parts<T: Send>(
    graph: &Graph,
    order: &[NodeId],
    per_thread: usize,
    per_node: impl Fn(NodeId) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    use super::prefetch::{node_shapes, node_slots, AHEAD};
    let run = |part: &[NodeId]| -> Result<Vec<T>, Error> {
        let ahead = |i: usize| part.get(i).map(|&id| graph.node(id));
        part.iter()
            .enumerate()
            .map(|(i, &id)| {
                if let Some(node) = ahead(i + 2 * AHEAD) {
                    node_slots(node);
                }
                if let Some(node) = ahead(i + AHEAD) {
                    node_shapes(graph, node);
                }
                per_node(id)
            })
            .collect()
    };
    if order.len() <= per_thread {
        return run(order);
    }
    std::thread::scope(|scope| {
        let parts: Vec<_> = order
            .chunks(per_thread)
            .map(|part| scope.spawn(move || run(part)))
            .collect();
        let mut all = Vec::with_capacity(order.len());
        for part in parts {
            match part.join() {
                Ok(values) => all.extend(values?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(all)
    })
}

impl CostModel<'_> {
    /// The work of all of a subgraph body's nodes, once.
    fn body_work(&self, node: &Node, sub: &Subgraph) -> Result<(OpWork, bool), Error> {
        let body = &*sub.body;
        let mut total = OpWork::NONE;
        let mut costliest = 0.0;
        let mut assumed = false;
        for &id in body.topological_order() {
            let (work, fallback) = self.work(body, id).map_err(|e| Error::Cost {
                node: node.name.clone(),
                op: node.op_type.clone(),
                detail: format!(
                    "its subgraph '{}' cannot be costed ({e}); pass --unknown-op-cost \
                     zero|bytes to cost the node anyway",
                    sub.name
                ),
            })?;
            assumed |= fallback;
            let time = self.time_secs(&work);
            if time > costliest {
                costliest = time;
                total.class = work.class;
                total.dtype = work.dtype;
            }
            total.flops += work.flops;
            total.bytes += work.bytes;
            total.launches += work.launches;
        }
        Ok((total, assumed))
    }

    /// Control flow, from its bodies: If, the branch the condition picks, else the costlier
    /// branch; Loop, the body times the trip count; Scan, the body times the scanned length;
    /// SequenceMap, the body once per element. A trip count or length not known at plan time
    /// is assumed to be 1, and the node is flagged as estimated (`fallback`).
    fn control_flow_work(&self, graph: &Graph, node: &Node) -> Result<(OpWork, bool), Error> {
        let sub = |name: &str| match node.attributes.get(name) {
            Some(Attribute::Graph(g)) => Ok(g),
            _ => Err(Error::Cost {
                node: node.name.clone(),
                op: node.op_type.clone(),
                detail: format!("attribute '{name}' (a subgraph) is missing"),
            }),
        };
        let input_value = |i: usize| -> Option<i64> {
            let id = node.inputs.get(i).copied().flatten()?;
            match graph.tensor(id).value.as_ref()?.as_i64s()?.as_slice() {
                [v] => Some(*v),
                _ => None,
            }
        };
        let ((work, assumed), iterations) = match node.op_type.as_str() {
            "If" => match input_value(0) {
                Some(0) => (self.body_work(node, sub("else_branch")?)?, Some(1)),
                Some(_) => (self.body_work(node, sub("then_branch")?)?, Some(1)),
                None => {
                    let then = self.body_work(node, sub("then_branch")?)?;
                    let other = self.body_work(node, sub("else_branch")?)?;
                    let costlier = if self.time_secs(&then.0) >= self.time_secs(&other.0) {
                        then
                    } else {
                        other
                    };
                    (costlier, Some(1))
                }
            },
            "Loop" => (self.body_work(node, sub("body")?)?, input_value(0)),
            "Scan" => (
                self.body_work(node, sub("body")?)?,
                scan_length(graph, node),
            ),
            _ => (self.body_work(node, sub("body")?)?, None),
        };
        let n = iterations.unwrap_or(1).max(0) as f64;
        Ok((
            OpWork {
                flops: work.flops * n,
                bytes: work.bytes * n,
                launches: (work.launches as f64 * n).min(u32::MAX as f64) as u32,
                ..work
            },
            assumed || iterations.is_none(),
        ))
    }
}

/// How many times a Scan runs its body: the first scanned input's scan axis (times the batch
/// for Scan-8, whose inputs have a batch axis 0 and an optional first input).
fn scan_length(graph: &Graph, node: &Node) -> Option<i64> {
    let scanned = match node.attributes.get("num_scan_inputs") {
        Some(Attribute::Int(n)) => usize::try_from(*n).ok()?,
        _ => return None,
    };
    let first = node.inputs.len().checked_sub(scanned)?;
    let shape = graph
        .concrete_shape(node.inputs.get(first).copied().flatten()?)
        .ok()?;
    let batched = graph.opset("").unwrap_or(0) < 9;
    let axis = match node.attributes.get("scan_input_axes") {
        Some(Attribute::Ints(axes)) if !batched => *axes.first()?,
        _ => 0,
    };
    let axis = if axis < 0 {
        axis + shape.len() as i64
    } else {
        axis
    } as usize;
    let length = *shape.get(axis + usize::from(batched))?;
    let batch = if batched { *shape.first()? } else { 1 };
    i64::try_from(length.checked_mul(batch)?).ok()
}

/// Bytes of a tensor with a concrete shape (a sequence or optional: see
/// [`super::ops::sized_shape`]).
pub fn tensor_bytes(graph: &Graph, id: pipecut_ir::graph::TensorId) -> Result<u64, Error> {
    // Counted without collecting the shape: a million tensors' `Vec`s were a sixth of building
    // the problem (docs/benchmarks.md).
    let elements = super::ops::sized_elements(graph, id)?;
    let tensor = graph.tensor(id);
    let dtype = tensor.dtype.ok_or_else(|| Error::UnknownShape {
        tensor: tensor.name.clone(),
    })?;
    let overflow = || Error::InvalidDim {
        tensor: tensor.name.clone(),
        detail: "its size overflows 64 bits".into(),
    };
    dtype
        .bytes_for(elements.ok_or_else(overflow)?)
        .ok_or_else(overflow)
}

/// The `--unknown-op-cost bytes` fallback: a copy of everything the node reads and writes.
fn ctx_bytes(graph: &Graph, id: NodeId) -> OpWork {
    let node = graph.node(id);
    let total: u64 = node
        .inputs
        .iter()
        .chain(&node.outputs)
        .flatten()
        .filter_map(|&t| tensor_bytes(graph, t).ok())
        .sum();
    OpWork {
        flops: 0.0,
        bytes: total as f64,
        class: OpClass::DataMovement,
        dtype: pipecut_ir::graph::DType::F32,
        launches: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Catalog;
    use pipecut_ir::graph::{Attribute, DType, Dim, Graph, NodeSpec, Param, Storage};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn typed(mut b: pipecut_ir::graph::GraphBuilder) -> Graph {
        b.opset("", 17);
        let mut g = b.build().unwrap();
        ShapeInference::new(DimBindings::new()).run(&mut g).unwrap();
        g
    }

    #[test]
    fn fp16_gemm_4096_on_h100_matches_its_profile() {
        let catalog = Catalog::builtin();
        let h100 = catalog.device("H100-SXM").unwrap();
        let n = 4096u64;
        let mut b = Graph::builder("gemm");
        b.input(
            "a",
            Some(DType::F16),
            Some(vec![Dim::Known(n), Dim::Known(n)]),
        )
        .unwrap();
        let w = Param {
            bytes: 2 * n * n,
            storage: Storage::Declared,
        };
        b.parameter("w", DType::F16, &[n, n], w, None).unwrap();
        b.node(NodeSpec::new("mm", "MatMul", &["a", "w"], &["c"]))
            .unwrap();
        b.output("c");
        let g = typed(b);
        let cost = CostModel::new(h100)
            .node_cost(&g, g.topological_order()[0])
            .unwrap();
        // 2·4096³ FLOPs at 989.5 TFLOP/s × 0.7, plus one 5 µs launch: ≈ 203.4 µs.
        let expected = 2.0 * (n as f64).powi(3) / (9.895e14 * 0.7) + 5e-6;
        assert!(
            (cost.time_secs - expected).abs() / expected < 1e-9,
            "{} vs {expected}",
            cost.time_secs
        );
        assert_eq!(cost.flops, 2.0 * (n as f64).powi(3));
        assert_eq!(cost.param_bytes, 2 * n * n);
    }

    #[test]
    fn conv_flops_match_the_textbook_formula() {
        let catalog = Catalog::builtin();
        let mut b = Graph::builder("conv");
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![
                Dim::Known(1),
                Dim::Known(64),
                Dim::Known(56),
                Dim::Known(56),
            ]),
        )
        .unwrap();
        b.parameter(
            "w",
            DType::F32,
            &[128, 64, 3, 3],
            Param {
                bytes: 4 * 128 * 64 * 9,
                storage: Storage::Declared,
            },
            None,
        )
        .unwrap();
        b.node(
            NodeSpec::new("conv", "Conv", &["x", "w"], &["y"])
                .attr("pads", Attribute::Ints(vec![1, 1, 1, 1])),
        )
        .unwrap();
        b.output("y");
        let g = typed(b);
        let cost = CostModel::new(catalog.device("A100-80GB").unwrap())
            .node_cost(&g, g.topological_order()[0])
            .unwrap();
        // FLOPs = 2 · H_out · W_out · C_out · C_in · k_h · k_w.
        assert_eq!(cost.flops, 2.0 * 56.0 * 56.0 * 128.0 * 64.0 * 9.0);
        assert_eq!(cost.output_bytes, 4 * 128 * 56 * 56);
    }

    #[test]
    fn training_costs_forward_plus_backward() {
        let catalog = Catalog::builtin();
        let mut b = Graph::builder("relu");
        b.input("x", Some(DType::F32), Some(vec![Dim::Known(1 << 20)]))
            .unwrap();
        b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"]))
            .unwrap();
        b.output("y");
        let g = typed(b);
        let l4 = catalog.device("L4").unwrap();
        let id = g.topological_order()[0];
        let inference = CostModel::new(l4).node_cost(&g, id).unwrap().time_secs;
        let training = CostModel::new(l4)
            .with_mode(Mode::training())
            .node_cost(&g, id)
            .unwrap()
            .time_secs;
        assert!((training / inference - 3.0).abs() < 1e-12);
    }

    #[test]
    fn unknown_ops_need_an_explicit_fallback() {
        let catalog = Catalog::builtin();
        let mut b = Graph::builder("if");
        b.input("x", Some(DType::F32), Some(vec![Dim::Known(4)]))
            .unwrap();
        b.node(NodeSpec::new("mystery", "Frobnicate", &["x"], &["y"]))
            .unwrap();
        // Typed by its declaration alone (shape inference would refuse the op): the cost
        // model then meets an op it has no rule for.
        b.declare_type("y", Some(DType::F32), Some(vec![Dim::Known(4)]));
        b.output("y");
        b.opset("", 17);
        let g = b.build().unwrap();
        let id = g.topological_order()[0];
        let device = catalog.device("cpu").unwrap();
        let msg = CostModel::new(device)
            .node_cost(&g, id)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("Frobnicate") && msg.contains("--unknown-op-cost"),
            "{msg}"
        );
        let zero = CostModel::new(device)
            .with_unknown_ops(UnknownOpCost::Zero)
            .node_cost(&g, id)
            .unwrap();
        assert!(zero.fallback && zero.time_secs == 0.0);
        let bytes = CostModel::new(device)
            .with_unknown_ops(UnknownOpCost::Bytes)
            .node_cost(&g, id)
            .unwrap();
        assert!(bytes.fallback && bytes.time_secs > 0.0);
    }
}
