//! How to use a whole cluster: pipeline depth K, data-parallel degree D (K·D ≤ GPUs), micro-batch
//! size b and count m (D·m·b = global batch), schedule, and where the stages sit.
//!
//! Every candidate is a partition problem for one replica (the exact DP of [`super::dp`]), the
//! schedule simulator for its step, and the data-parallel gradient all-reduce of each stage. The
//! search is a best-first branch and bound: a candidate's throughput can be bounded before it
//! is solved, because no K-stage pipeline beats `m · T / K` per step (T: one micro-batch's whole
//! compute on the fastest device) nor `T` (one micro-batch passes every stage in turn), and
//! because a stage must hold at least `1/K` of the weights. Candidates are solved in order of
//! their bound, and the search stops when no unsolved bound can enter the top list.
//!
//! **All-reduce model.** Each stage's gradients are summed over its D replicas by a ring
//! all-reduce over the slowest link the ring spans ([`Cluster::ring_all_reduce_secs`]), starting
//! when that stage's last backward ends. Stages finish at different times (in 1F1B the last
//! stage finishes first), so an all-reduce overlaps the other stages' remaining backwards but
//! not its own stage's compute: step = max over stages of (its last operation's end + its
//! all-reduce). Inference has no all-reduce: replicas only multiply throughput.
//!
//! **Placement.** With D > 1 and K > 1 two placements are costed: pipelines inside nodes
//! (replica r's stage s on device r·K + s: pipeline neighbours share a node's link, the rings
//! cross nodes) and replicas inside nodes (device s·D + r: rings stay inside a node, pipeline
//! hops cross nodes). Whichever the costs favour wins.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{dp, CostSettings, PartitionProblem};
use crate::cost::{Cluster, DeviceId, Mode, Schedule, UnknownOpCost};
use crate::graph::Graph;
use crate::onnx::shape::{DimBindings, ShapeInference};
use crate::schedule::{simulate, StageFiguresSecs, StageTimes};
use crate::Error;

/// Where replica r's stage s runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Device `r·K + s`: a replica's stages are neighbours in the device order.
    PipelineInsideNodes,
    /// Device `s·D + r`: a stage's replicas are neighbours in the device order.
    ReplicasInsideNodes,
}

impl Placement {
    /// The device of `replica`'s `stage` for K = `stages`, D = `replicas`.
    pub fn device(self, replica: usize, stage: usize, stages: usize, replicas: usize) -> DeviceId {
        let index = match self {
            Placement::PipelineInsideNodes => replica * stages + stage,
            Placement::ReplicasInsideNodes => stage * replicas + replica,
        };
        DeviceId(index as u32)
    }

    /// Devices of every replica, `[replica][stage]`.
    pub fn replicas(self, stages: usize, replicas: usize) -> Vec<Vec<DeviceId>> {
        (0..replicas)
            .map(|r| {
                (0..stages)
                    .map(|s| self.device(r, s, stages, replicas))
                    .collect()
            })
            .collect()
    }
}

/// What to search over.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// Samples per optimizer step (training) or per batch (inference), over all replicas.
    pub global_batch: u64,
    /// The symbolic dim that is the batch; it is bound to the micro-batch size.
    pub batch_dim: String,
    /// The model's other dims (sequence length, ...).
    pub bindings: DimBindings,
    /// Inference or training.
    pub mode: Mode,
    /// Schedules to try.
    pub schedules: Vec<Schedule>,
    /// Micro-batch sizes to try; `None`: every power of two that divides the global batch.
    pub microbatch_sizes: Option<Vec<u64>>,
    /// Fraction of each device's memory kept free.
    pub memory_headroom: f64,
    /// Cost of ops without a rule.
    pub unknown_ops: UnknownOpCost,
    /// Length of the ranked list of alternatives.
    pub top: usize,
}

impl SearchRequest {
    /// A request with pipecut's defaults: 1F1B and GPipe, 10 % headroom, the top 5.
    pub fn new(global_batch: u64, mode: Mode) -> SearchRequest {
        SearchRequest {
            global_batch,
            batch_dim: "batch".into(),
            bindings: DimBindings::new(),
            mode,
            schedules: vec![Schedule::OneFOneB, Schedule::GPipe],
            microbatch_sizes: None,
            memory_headroom: 0.10,
            unknown_ops: UnknownOpCost::Error,
            top: 5,
        }
    }
}

/// One way to use the cluster: the decision variables.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct ConfigurationKey {
    /// Pipeline stages K.
    pub stages: usize,
    /// Data-parallel replicas D.
    pub data_parallel: usize,
    /// Samples per micro-batch b.
    pub microbatch_size: u64,
    /// Micro-batches per step m = global batch / (D · b).
    pub microbatches: u64,
    /// The schedule.
    pub schedule: Schedule,
    /// Where the stages sit.
    pub placement: Placement,
}

/// A costed configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Configuration {
    /// The decision.
    pub key: ConfigurationKey,
    /// The slowest stage's time per micro-batch.
    pub bottleneck_secs: f64,
    /// The simulated pipeline step without the all-reduce.
    pub pipeline_secs: f64,
    /// All-reduce time of each stage (zero in inference or with D = 1).
    pub allreduce_secs: Vec<f64>,
    /// The step: pipeline plus the exposed part of the all-reduces.
    pub step_secs: f64,
    /// Global batch / step.
    pub samples_per_sec: f64,
    /// Idle share of the pipeline's devices during the pipeline step.
    pub bubble_fraction: f64,
    /// The fullest stage's memory.
    pub peak_memory_bytes: u64,
    /// What that stage may use.
    pub capacity_bytes: u64,
}

/// The search's answer.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    /// The best configuration.
    pub best: Configuration,
    /// The graph typed with the best micro-batch size.
    pub graph: Graph,
    /// Devices of every replica, `[replica][stage]`; replica 0 is the plan's stages.
    pub replicas: Vec<Vec<DeviceId>>,
    /// The best configurations, best first (the best included).
    pub ranked: Vec<Configuration>,
    /// Configurations in the space.
    pub candidates: usize,
    /// Solved with the DP and simulated.
    pub solved: usize,
    /// Discarded without solving: their memory bound exceeds a device.
    pub pruned_by_memory: usize,
    /// Solved but no partition fits memory.
    pub infeasible: usize,
    /// Wall time of the search.
    pub search_secs: f64,
}

/// One micro-batch size's typed graph and the bounds used for pruning.
struct Typed {
    graph: Graph,
    /// One micro-batch's compute over all nodes on the fastest device kind.
    total_secs: f64,
    /// Every weight's footprint (with gradients and optimizer state in training).
    footprint_bytes: u64,
}

/// Searches the configurations of `graph` (as loaded, before shape inference) on `cluster`.
pub fn search(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
) -> Result<SearchOutcome, Error> {
    let started = Instant::now();
    let gpus = cluster.device_count();
    let bad = |detail: String| Err(Error::PartitionConfig(detail));
    if request.global_batch == 0 {
        return bad("the global batch must be at least 1".into());
    }
    if request.schedules.is_empty() {
        return bad("no schedule to try".into());
    }
    let sizes = microbatch_sizes(request)?;
    let max_capacity = cluster
        .devices()
        .map(|(_, d)| capacity_bytes(d.memory_bytes.value as f64, request.memory_headroom))
        .max()
        .unwrap_or(0);

    let mut typed: BTreeMap<u64, Typed> = BTreeMap::new();
    let mut candidates: Vec<(f64, ConfigurationKey)> = Vec::new();
    let mut pruned_by_memory = 0;
    for &b in &sizes {
        let t = type_graph(graph, cluster, request, b)?;
        let nodes = t.graph.node_count();
        for d in 1..=gpus {
            if request.global_batch % (d as u64 * b) != 0 {
                continue;
            }
            let m = request.global_batch / (d as u64 * b);
            for k in 1..=(gpus / d).min(nodes) {
                if t.footprint_bytes.div_ceil(k as u64) > max_capacity {
                    pruned_by_memory += placements(k, d).len();
                    continue;
                }
                // Throughput bound: step ≥ max(m·T/K, T).
                let step_bound = (m as f64 * t.total_secs / k as f64).max(t.total_secs);
                let bound = request.global_batch as f64 / step_bound;
                // One stage has no schedule to choose.
                let schedules = if k == 1 {
                    &request.schedules[..1]
                } else {
                    &request.schedules[..]
                };
                for &schedule in schedules {
                    for &placement in placements(k, d) {
                        candidates.push((
                            bound,
                            ConfigurationKey {
                                stages: k,
                                data_parallel: d,
                                microbatch_size: b,
                                microbatches: m,
                                schedule,
                                placement,
                            },
                        ));
                    }
                }
            }
        }
        typed.insert(b, t);
    }
    let total_candidates = candidates.len() + pruned_by_memory;
    // Best bound first; equal bounds in a fixed order of their keys, so plans are deterministic.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let top = request.top.max(1);
    let mut ranked: Vec<Configuration> = Vec::new();
    let (mut solved, mut infeasible) = (0, 0);
    for (bound, key) in candidates {
        if ranked.len() >= top && bound < ranked[top - 1].samples_per_sec {
            break;
        }
        let t = &typed[&key.microbatch_size];
        solved += 1;
        match evaluate(&t.graph, cluster, request, key)? {
            Some(config) => {
                let at = ranked.partition_point(|c| better(c, &config));
                ranked.insert(at, config);
                ranked.truncate(top);
            }
            None => infeasible += 1,
        }
    }
    let Some(best) = ranked.first().cloned() else {
        return Err(Error::Infeasible(format!(
            "no configuration of {gpus} devices holds the model: every pipeline depth up to {} \
             runs out of memory for every micro-batch size tried ({sizes:?})",
            gpus
        )));
    };
    let k = best.key;
    Ok(SearchOutcome {
        graph: typed
            .remove(&k.microbatch_size)
            .expect("the best size was typed")
            .graph,
        replicas: k.placement.replicas(k.stages, k.data_parallel),
        best,
        ranked,
        candidates: total_candidates,
        solved,
        pruned_by_memory,
        infeasible,
        search_secs: started.elapsed().as_secs_f64(),
    })
}

/// Whether `a` ranks before `b`: more samples per second, then fewer GPUs, then the key order.
fn better(a: &Configuration, b: &Configuration) -> bool {
    let gpus = |c: &Configuration| c.key.stages * c.key.data_parallel;
    a.samples_per_sec
        .total_cmp(&b.samples_per_sec)
        .reverse()
        .then(gpus(a).cmp(&gpus(b)))
        .then(a.key.cmp(&b.key))
        .is_lt()
}

fn placements(stages: usize, replicas: usize) -> &'static [Placement] {
    if stages > 1 && replicas > 1 {
        &[
            Placement::PipelineInsideNodes,
            Placement::ReplicasInsideNodes,
        ]
    } else {
        &[Placement::PipelineInsideNodes]
    }
}

fn capacity_bytes(memory_bytes: f64, headroom: f64) -> u64 {
    (memory_bytes * (1.0 - headroom)) as u64
}

fn microbatch_sizes(request: &SearchRequest) -> Result<Vec<u64>, Error> {
    let sizes = match &request.microbatch_sizes {
        Some(sizes) => {
            if let Some(&b) = sizes
                .iter()
                .find(|&&b| b == 0 || request.global_batch % b != 0)
            {
                return Err(Error::PartitionConfig(format!(
                    "micro-batch size {b} does not divide the global batch {}",
                    request.global_batch
                )));
            }
            sizes.clone()
        }
        None => std::iter::successors(Some(1u64), |b| b.checked_mul(2))
            .take_while(|&b| b <= request.global_batch)
            .filter(|&b| request.global_batch % b == 0)
            .collect(),
    };
    let mut sizes = sizes;
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Err(Error::PartitionConfig("no micro-batch size to try".into()));
    }
    Ok(sizes)
}

fn settings(request: &SearchRequest, schedule: Schedule, microbatches: u64) -> CostSettings {
    CostSettings {
        mode: request.mode,
        schedule,
        microbatches: microbatches.min(u32::MAX as u64) as u32,
        memory_headroom: request.memory_headroom,
        unknown_ops: request.unknown_ops,
    }
}

/// Binds the batch dim to `b`, infers shapes, and measures the pruning bounds.
fn type_graph(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    b: u64,
) -> Result<Typed, Error> {
    let mut typed = graph.clone();
    let bindings = request.bindings.clone().bind(&request.batch_dim, b);
    ShapeInference::new(bindings).run(&mut typed)?;
    // The fastest kind: the one with the smallest whole-model time.
    let mut total_secs = f64::INFINITY;
    let mut footprint_bytes = 0;
    let mut kinds: Vec<&str> = Vec::new();
    for (id, spec) in cluster.devices() {
        if kinds.contains(&spec.name.as_str()) {
            continue;
        }
        kinds.push(&spec.name);
        let problem = PartitionProblem::new(
            &typed,
            cluster,
            &[id],
            settings(request, Schedule::OneFOneB, 1),
        )?;
        total_secs = total_secs.min(problem.lower_bound_secs());
        footprint_bytes = problem.params().iter().map(|p| p.footprint_bytes).sum();
    }
    Ok(Typed {
        graph: typed,
        total_secs,
        footprint_bytes,
    })
}

/// Costs one configuration on `graph` (typed with its micro-batch size): the DP's partition of
/// replica 0, the simulated step, and the all-reduces. `None` when no partition fits memory.
pub fn evaluate(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    key: ConfigurationKey,
) -> Result<Option<Configuration>, Error> {
    let ConfigurationKey {
        stages: k,
        data_parallel: d,
        microbatches: m,
        schedule,
        placement,
        ..
    } = key;
    if k * d > cluster.device_count() {
        return Err(Error::PartitionConfig(format!(
            "{k} stages × {d} replicas need {} devices, the cluster has {}",
            k * d,
            cluster.device_count()
        )));
    }
    let replicas = placement.replicas(k, d);
    let problem = PartitionProblem::new(graph, cluster, &replicas[0], settings(request, schedule, m))?;
    let Some(order) = dp::solve(&problem) else {
        return Ok(None);
    };
    let evaluation = problem.evaluate(&order.stage_of);
    let figures: Vec<StageFiguresSecs> = evaluation
        .stages
        .iter()
        .map(|s| StageFiguresSecs {
            compute_secs: s.compute_secs,
            receive_secs: s.receive_secs,
            gradient_receive_secs: s.gradient_receive_secs,
        })
        .collect();
    let simulation = simulate(
        &StageTimes::from_stage_figures(request.mode, &figures),
        schedule.into(),
        m as usize,
    )?;
    let mut last_end = vec![0.0f64; k];
    for op in &simulation.ops {
        last_end[op.stage] = last_end[op.stage].max(op.end_secs);
    }
    let allreduce_secs: Vec<f64> = match request.mode {
        Mode::Training { .. } if d > 1 => (0..k)
            .map(|s| {
                let ring: Vec<DeviceId> = replicas.iter().map(|r| r[s]).collect();
                cluster.ring_all_reduce_secs(&ring, gradient_bytes(graph, &problem, &order.stage_of, s))
            })
            .collect(),
        _ => vec![0.0; k],
    };
    let step_secs = last_end
        .iter()
        .zip(&allreduce_secs)
        .map(|(end, reduce)| end + reduce)
        .fold(simulation.step_secs, f64::max);
    let fullest = evaluation
        .stages
        .iter()
        .max_by(|a, b| {
            (a.peak_memory_bytes as f64 / a.capacity_bytes.max(1) as f64)
                .total_cmp(&(b.peak_memory_bytes as f64 / b.capacity_bytes.max(1) as f64))
        })
        .expect("at least one stage");
    Ok(Some(Configuration {
        key,
        bottleneck_secs: evaluation.bottleneck_secs,
        pipeline_secs: simulation.step_secs,
        allreduce_secs,
        step_secs,
        samples_per_sec: request.global_batch as f64 / step_secs,
        bubble_fraction: simulation.bubble_fraction,
        peak_memory_bytes: fullest.peak_memory_bytes,
        capacity_bytes: fullest.capacity_bytes,
    }))
}

/// Bytes of gradients stage `stage` all-reduces: its distinct weights, in their own dtype.
fn gradient_bytes(
    graph: &Graph,
    problem: &PartitionProblem,
    stage_of: &[super::StageId],
    stage: usize,
) -> u64 {
    problem
        .params()
        .iter()
        .filter(|p| p.uses.iter().any(|&u| stage_of[u as usize].index() == stage))
        .filter_map(|p| graph.tensor_id(&p.name))
        .filter_map(|t| graph.tensor(t).param().map(|param| param.bytes))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_put_neighbours_together() {
        // K = 2 stages, D = 4 replicas on 8 devices.
        let pipe = Placement::PipelineInsideNodes.replicas(2, 4);
        assert_eq!(pipe[1], vec![DeviceId(2), DeviceId(3)]);
        let reps = Placement::ReplicasInsideNodes.replicas(2, 4);
        assert_eq!(reps[1], vec![DeviceId(1), DeviceId(5)]);
        // Both use every device exactly once.
        for layout in [pipe, reps] {
            let mut all: Vec<u32> = layout.iter().flatten().map(|d| d.0).collect();
            all.sort_unstable();
            assert_eq!(all, (0..8).collect::<Vec<_>>());
        }
    }

    #[test]
    fn default_microbatch_sizes_are_the_powers_of_two_that_divide() {
        let request = SearchRequest::new(96, Mode::Inference);
        assert_eq!(
            microbatch_sizes(&request).unwrap(),
            vec![1, 2, 4, 8, 16, 32]
        );
        let mut request = SearchRequest::new(96, Mode::Inference);
        request.microbatch_sizes = Some(vec![5]);
        assert!(microbatch_sizes(&request).is_err());
    }
}
