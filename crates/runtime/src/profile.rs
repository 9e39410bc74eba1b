//! `pipecut profile`: every node's time on the CPU or CUDA runtime, for planning on measurements.
//!
//! The whole model runs as one stage, `warmup` times unmeasured and then `repeats` times with
//! each kernel call timed; a node's figure is the median of its repeats (a busy machine slows
//! some runs, rarely the middle one), and the spread of the whole-model times says whether the
//! machine was quiet enough to trust them ([`pipecut_cost::measured::NOISY_SPREAD`]).
//!
//! Timing the kernel call alone leaves out what the stage pays around it (gathering arguments,
//! freeing dead tensors: a few µs per node); the stage's time is the sum of its nodes'.

use std::collections::HashMap;
use std::time::Instant;

use super::{stage_specs, CpuExecutor, NodeTimer, Tensors};
use crate::Error;
use pipecut_cost::measured::{
    MeasuredModel, MeasuredNode, Measurement, NodeTimes, NODE_TIMES_SCHEMA,
};
use pipecut_ir::graph::{Graph, NodeId};

/// How many runs to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRuns {
    /// Unmeasured runs first.
    pub warmup: usize,
    /// Measured runs (at least 1).
    pub repeats: usize,
}

/// What the model is, for the file: the device name the times stand for, its graph digest and
/// the dims bound.
#[derive(Debug, Clone)]
pub struct ProfileSubject {
    /// Catalog device name the times are for.
    pub device: String,
    /// The model's graph digest.
    pub model: MeasuredModel,
    /// Threads the matrix products may use.
    pub threads: Option<usize>,
}

/// Measures every node of `executor`'s graph on `inputs`.
pub fn profile_cpu(
    executor: &CpuExecutor<'_>,
    graph: &Graph,
    inputs: &Tensors,
    runs: ProfileRuns,
    subject: ProfileSubject,
) -> Result<NodeTimes, Error> {
    profile(executor, graph, inputs, runs, subject)
}

/// Measures every node of `executor`'s graph on `inputs`, on whichever backend it is.
pub fn profile<E: NodeTimer>(
    executor: &E,
    graph: &Graph,
    inputs: &Tensors,
    runs: ProfileRuns,
    subject: ProfileSubject,
) -> Result<NodeTimes, Error> {
    if runs.repeats == 0 {
        return Err(Error::RunInput("--repeats must be at least 1".into()));
    }
    let order = graph.topological_order().to_vec();
    let spec = stage_specs(graph, std::slice::from_ref(&order))?.remove(0);
    let stage = executor.prepare(&spec)?;
    for _ in 0..runs.warmup {
        executor.run(&stage, inputs)?;
    }
    let mut samples: HashMap<NodeId, Vec<f64>> = HashMap::new();
    let mut bytes: HashMap<NodeId, u64> = HashMap::new();
    let mut totals = Vec::with_capacity(runs.repeats);
    for _ in 0..runs.repeats {
        let began = Instant::now();
        executor.run_observed(&stage, inputs, &mut |node, secs, out| {
            samples.entry(node).or_default().push(secs);
            bytes.insert(node, out);
        })?;
        totals.push(began.elapsed().as_secs_f64());
    }
    let nodes = order
        .iter()
        .filter_map(|id| {
            let node = graph.node(*id);
            let times = samples.get(id)?;
            Some(MeasuredNode::from_samples(
                &node.name,
                &node.op_type,
                times,
                bytes.get(id).copied(),
            ))
        })
        .collect();
    Ok(NodeTimes {
        schema: NODE_TIMES_SCHEMA.into(),
        device: subject.device,
        measured_with: Measurement::from_totals(E::BACKEND, subject.threads, runs.warmup, &totals),
        model: subject.model,
        nodes,
    })
}
