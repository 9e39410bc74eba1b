//! # pipecut-runtime
//!
//! Executing a model, whole or as a pipeline of stages, on host tensors; the CPU reference
//! kernels, the CUDA backend (feature `cuda`), and the profiler whose node times feed
//! `pipecut-cost`. It sits above the planner (it runs plans) and knows nothing of solvers.
//!
//! Executing a model, whole or as a pipeline of stages, on host tensors.
//!
//! ```text
//! plan.json ─┐
//! model.onnx ┴─▶ stage_specs ──▶ Executor::prepare (per stage) ──▶ run_pipeline: one thread per
//!                                                                   stage, micro-batches streamed
//! ```
//!
//! The [`Executor`] trait is what a backend implements: prepare a stage once, then run it on
//! named tensors as often as there are micro-batches. [`cpu::CpuExecutor`] is the reference
//! backend, always built; the pipeline driver ([`cpu::run_pipeline`]) is generic over the trait.
//! [`npy`] reads and writes inputs and outputs, [`weights`] loads parameters, memory-mapped.

#![warn(missing_docs)]

pub mod calibrate;
mod constant_steps;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
/// The CUDA backend: built with the `cuda` feature; without it, a stand-in whose constructor
/// answers [`crate::Error::CudaNotCompiled`].
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
mod fuse;
mod kernels;
pub mod narrow;
pub mod npy;
pub mod paired;
pub mod profile;
mod rank_group;
mod steps;
pub mod tensor;
pub mod tensor_parallel;
pub mod value;
pub mod weights;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

pub use cpu::{
    run_pipeline, run_pipeline_with, CpuExecutor, PipelineOptions, PipelineReport, StageTiming,
};
pub(crate) use kernels::sgemm;
pub use kernels::supported_ops;
pub use npy::{
    encode_npy, encode_npy_as, parse_npy, parse_npy_as, read_npy, read_npy_as, NpyArray,
};
pub use tensor::{held_bytes, runtime_dtype, HostTensor, TensorData};
pub use value::{Value, Values};
pub use weights::Weights;

use pipecut_ir::graph::{DType, Graph, NodeId, TensorId};
pub use pipecut_ir::{Error, Result};
use tensor::try_collect;

/// Tensors by name, shared cheaply between stages and micro-batches.
pub type Tensors = BTreeMap<String, Arc<HostTensor>>;

/// One stage of a pipeline: its nodes and the tensors that cross its boundaries.
///
/// Stages relay: everything a later stage or the caller needs passes through every stage in
/// between, so stage `k` talks only to stages `k − 1` and `k + 1`, as the plan's transfers assume.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSpec {
    /// Position in the pipeline.
    pub index: usize,
    /// Nodes, in topological order.
    pub nodes: Vec<NodeId>,
    /// Tensors the stage receives (graph inputs and earlier stages' results it or later stages need).
    pub receives: Vec<TensorId>,
    /// Tensors the stage hands on (for later stages, or the graph outputs after the last stage).
    pub sends: Vec<TensorId>,
}

/// A backend that runs stages of a model.
pub trait Executor: Sync {
    /// A stage made ready to run (kernels resolved, buffers planned, weights in place).
    /// Only `Send`: the pipeline gives each stage to one thread.
    type Stage: Send;

    /// Prepares a stage; refuses an op the backend has no kernel for, naming op and node.
    fn prepare(&self, spec: &StageSpec) -> Result<Self::Stage, Error>;

    /// Runs a prepared stage on its received tensors (by name), giving the tensors it sends.
    fn run(&self, stage: &Self::Stage, inputs: &Tensors) -> Result<Tensors, Error>;
}

/// An executor that can time each node of a stage (`pipecut profile`).
pub trait NodeTimer: Executor {
    /// The backend as the node-times file names it (`pipecut-cpu`, `pipecut-cuda`).
    const BACKEND: &'static str;

    /// Runs a stage like [`Executor::run`], calling `observe(node, seconds, output bytes)` after
    /// each node.
    fn run_observed(
        &self,
        stage: &Self::Stage,
        inputs: &Tensors,
        observe: &mut dyn FnMut(NodeId, f64, u64),
    ) -> Result<Tensors, Error>;
}

/// Boundary tensors of contiguous stages given as node lists in pipeline order (every node of
/// the graph on exactly one stage, stages convex and ordered, as [`pipecut_planner::plan::Plan::check`]
/// guarantees for a plan).
pub fn stage_specs(graph: &Graph, stages: &[Vec<NodeId>]) -> Result<Vec<StageSpec>, Error> {
    let position: HashMap<NodeId, usize> = graph
        .topological_order()
        .iter()
        .enumerate()
        .map(|(p, &n)| (n, p))
        .collect();
    let mut stage_of: HashMap<NodeId, usize> = HashMap::new();
    for (k, nodes) in stages.iter().enumerate() {
        for &n in nodes {
            if stage_of.insert(n, k).is_some() {
                return Err(Error::InvalidPlan(format!(
                    "node '{}' is on two stages",
                    graph.node(n).name
                )));
            }
        }
    }
    if let Some((id, _)) = graph.nodes().find(|(id, _)| !stage_of.contains_key(id)) {
        return Err(Error::InvalidPlan(format!(
            "node '{}' is on no stage",
            graph.node(id).name
        )));
    }
    let k_count = stages.len();
    // First stage that can see each tensor (graph inputs and weights: 0), last stage that reads it.
    let mut available_from: HashMap<TensorId, usize> = HashMap::new();
    let mut last_reader: HashMap<TensorId, usize> = HashMap::new();
    for (id, tensor) in graph.tensors() {
        let from = match tensor.producer() {
            Some(node) => stage_of[&node] + 1,
            None => 0,
        };
        available_from.insert(id, from);
        for reader in &tensor.consumers {
            let s = stage_of[reader];
            if s + 1 < from {
                return Err(Error::InvalidPlan(format!(
                    "tensor '{}' is read on stage {s} before it is made on stage {}",
                    tensor.name,
                    from - 1
                )));
            }
            let entry = last_reader.entry(id).or_insert(s);
            *entry = (*entry).max(s);
        }
    }
    let outputs: BTreeSet<TensorId> = graph.outputs().iter().copied().collect();
    // Tensor t crosses the boundary into stage k when it exists before k and stage k or later
    // reads it, or it is a graph output. Weights never cross: each stage reads its own.
    let crossing = |k: usize| -> Vec<TensorId> {
        let mut ids: Vec<TensorId> = graph
            .tensors()
            .filter(|(id, t)| {
                let is_weight = t.param().is_some();
                available_from[id] <= k
                    && (outputs.contains(id)
                        || (!is_weight && last_reader.get(id).is_some_and(|&r| r >= k)))
            })
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    };
    Ok((0..k_count)
        .map(|k| {
            let mut nodes = stages[k].clone();
            nodes.sort_by_key(|n| position[n]);
            StageSpec {
                index: k,
                nodes,
                receives: crossing(k),
                sends: crossing(k + 1),
            }
        })
        .collect())
}

/// The shape every graph input must have for a run of `microbatches` micro-batches: the bound
/// shape with axis 0 (the batch) multiplied by `microbatches`.
pub fn expected_input_shapes(
    graph: &Graph,
    microbatches: usize,
) -> Result<Vec<(String, DType, Vec<usize>)>, Error> {
    graph
        .inputs()
        .iter()
        .map(|&id| {
            let tensor = graph.tensor(id);
            // A map (DictVectorizer's input, say) has no .npy form; optional tensors and
            // sequences have theirs (`run --input`).
            if matches!(
                tensor.kind,
                pipecut_ir::graph::ValueKind::Map { .. }
                    | pipecut_ir::graph::ValueKind::MapSequence { .. }
            ) {
                return Err(Error::RunInput(format!(
                    "input '{}' is a {}: `run` takes tensors and sequences of them, not maps",
                    tensor.name, tensor.kind
                )));
            }
            let mut shape: Vec<usize> = graph
                .concrete_shape(id)?
                .into_iter()
                .map(|d| d as usize)
                .collect();
            if let Some(first) = shape.first_mut() {
                *first = first.checked_mul(microbatches).ok_or_else(|| {
                    Error::RunInput(format!(
                        "input '{}' would have {first} × {microbatches} rows: more than fit in memory",
                        tensor.name
                    ))
                })?;
            }
            let dtype = tensor.dtype.ok_or_else(|| Error::UnknownShape {
                tensor: tensor.name.clone(),
            })?;
            Ok((tensor.name.clone(), dtype, shape))
        })
        .collect()
}

/// Checks that `inputs` holds every graph input with the expected dtype and shape (see
/// [`expected_input_shapes`]) and nothing else.
pub fn check_inputs(graph: &Graph, inputs: &Tensors, microbatches: usize) -> Result<(), Error> {
    let expected = expected_input_shapes(graph, microbatches)?;
    for (name, dtype, shape) in &expected {
        let given = inputs.get(name).ok_or_else(|| {
            Error::RunInput(format!(
                "input '{name}' ({dtype} {shape:?}) is missing; pass --input {name}=FILE.npy"
            ))
        })?;
        if given.dtype() != runtime_dtype(*dtype) {
            return Err(Error::RunInput(format!(
                "input '{name}' must be {dtype}, got {}",
                given.dtype()
            )));
        }
        if given.shape() != shape.as_slice() {
            return Err(Error::RunInput(format!(
                "input '{name}' must have shape {shape:?}, got {:?}",
                given.shape()
            )));
        }
    }
    if let Some(extra) = inputs
        .keys()
        .find(|k| !expected.iter().any(|(n, ..)| n == *k))
    {
        let names: Vec<&str> = expected.iter().map(|(n, ..)| n.as_str()).collect();
        return Err(Error::RunInput(format!(
            "the model has no input '{extra}' (its inputs: {})",
            names.join(", ")
        )));
    }
    Ok(())
}

/// Seeded pseudo-random inputs of the expected shapes. Floats are uniform in [-1, 1). Integer
/// inputs that index a table (read by `Gather` as indices) are uniform over the table's rows; an
/// integer input named like a mask is all ones; other integers are 0 or 1.
pub fn seeded_inputs(graph: &Graph, microbatches: usize, seed: u64) -> Result<Tensors, Error> {
    let mut rng = SplitMix64(seed);
    let mut out = Tensors::new();
    for (name, dtype, shape) in expected_input_shapes(graph, microbatches)? {
        let n = kernels::checked_size(&shape).map_err(|detail| Error::InvalidDim {
            tensor: name.clone(),
            detail,
        })?;
        let id = graph.tensor_id(&name).expect("inputs are named tensors");
        let no_room =
            |detail: String| Error::RunInput(format!("input '{name}' {shape:?}: {detail}"));
        let data = match runtime_dtype(dtype) {
            DType::F32 => TensorData::F32(
                try_collect(n, (0..n).map(|_| rng.uniform() * 2.0 - 1.0)).map_err(no_room)?,
            ),
            DType::Bool => TensorData::Bool(
                try_collect(n, (0..n).map(|_| rng.next() & 1 == 1)).map_err(no_room)?,
            ),
            // Random text means nothing to the ops that read strings (a vocabulary, a pattern).
            DType::String => {
                return Err(Error::RunInput(format!(
                "input '{name}' is a string tensor, which is not generated: pass it as a .npy file"
            )))
            }
            int => {
                let rows = index_range(graph, id);
                let mask = name.to_lowercase().contains("mask");
                let values = (0..n).map(|_| if mask { 1 } else { (rng.next() % rows) as i64 });
                match int {
                    DType::I32 => {
                        TensorData::I32(try_collect(n, values.map(|v| v as i32)).map_err(no_room)?)
                    }
                    DType::U8 => {
                        TensorData::U8(try_collect(n, values.map(|v| v as u8)).map_err(no_room)?)
                    }
                    DType::I8 => {
                        TensorData::I8(try_collect(n, values.map(|v| v as i8)).map_err(no_room)?)
                    }
                    _ => TensorData::I64(try_collect(n, values).map_err(no_room)?),
                }
            }
        };
        let mut t = HostTensor::new(shape, data).map_err(Error::RunInput)?;
        if narrow::is_narrow_float(dtype) {
            // Values the input's format holds, as a file of that type would give.
            t = t.cast(dtype).map_err(Error::RunInput)?;
        }
        out.insert(name, Arc::new(t));
    }
    Ok(out)
}

/// Rows of the smallest table a tensor indexes through `Gather`, or 2 when it indexes none.
fn index_range(graph: &Graph, id: TensorId) -> u64 {
    graph
        .tensor(id)
        .consumers
        .iter()
        .map(|&n| graph.node(n))
        .filter(|node| node.op_type == "Gather" && node.inputs.get(1) == Some(&Some(id)))
        .filter_map(|node| {
            let data = node.inputs.first().copied().flatten()?;
            let axis = match node.attributes.get("axis") {
                Some(pipecut_ir::graph::Attribute::Int(a)) => *a,
                _ => 0,
            };
            let shape = graph.concrete_shape(data).ok()?;
            let axis = if axis < 0 {
                axis + shape.len() as i64
            } else {
                axis
            };
            shape.get(axis as usize).copied()
        })
        .filter(|&rows| rows > 0)
        .min()
        .unwrap_or(2)
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny, well-mixed generator; inputs only need to be
/// reproducible, not cryptographic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 bits, exact in f32.
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}
