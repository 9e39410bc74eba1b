//! How to use a whole cluster: pipeline depth K, tensor-parallel degree t, data-parallel degree
//! D (K·t·D ≤ GPUs), micro-batch size b and count m (D·m·b = global batch), schedule,
//! recomputation, ZeRO stage, and where the stages sit.
//!
//! Every candidate is a partition problem for one GPU of one replica (the exact DP of
//! [`super::dp`], on the costs [`super::tensor_parallel`] gives a GPU of a t-GPU group), the
//! schedule simulator for its step, and the data-parallel gradient all-reduce of each stage.
//! The search is a branch and bound: a candidate's throughput can be bounded before it is
//! solved, because no K-stage pipeline beats `m · T / K` per step (T: one micro-batch's whole
//! compute on one GPU of a group of the fastest device, with the group's collectives) nor `T`
//! (one micro-batch passes every stage in turn), and because a stage must hold at least `1/K`
//! of the weights (one GPU's share of the split ones). Candidates are solved most promising
//! first ([`solve_priority`]) and skipped when their bound does not beat the best solved one;
//! when every candidate is solved or skipped, the choice is the best configuration of the
//! space (up to the pruning of depths in [`stage_counts`]); the listed alternatives are the
//! best of those solved on the way.
//!
//! **Tensor parallelism.** A group of t GPUs (t divides every node's GPU count, so a group
//! never spans nodes) runs each stage: group g is devices g·t … g·t + t − 1, and the placements
//! below place groups where they place single GPUs. Its all-reduces use the node's link.
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

use super::engine::Engine;

/// `plan-cluster`'s default work budget, in configurations costed (DP runs and feasibility
/// sweeps). GPT-3-175B on 1,024 H100 at batch 1,536 needs 367 for a complete search
/// (docs/benchmarks.md); the budget leaves room for a space twice that size while keeping a
/// model of that size within about 10 s of one core's time.
pub const DEFAULT_SEARCH_BUDGET: u64 = 800;

/// What stopped a search before it was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SearchLimit {
    /// The work budget (configurations costed) was spent.
    WorkBudget,
    /// The wall-clock time limit passed.
    TimeLimit,
}

impl SearchLimit {
    /// The limit in words, for messages and tables.
    pub fn name(self) -> &'static str {
        match self {
            SearchLimit::WorkBudget => "work budget",
            SearchLimit::TimeLimit => "time limit",
        }
    }
}

use serde::{Deserialize, Serialize};

use super::constraints::JoinedGroups;
use super::tensor_parallel::{TensorParallelBlocks, TensorParallelism};
use super::{dp, CostSettings, CutConstraints, Evaluation, PartitionProblem, StageId};
use crate::schedule::{check_microbatches, simulate};
use crate::Error;
use pipecut_cost::{Cluster, DeviceId, Mode, Recompute, Schedule, UnknownOpCost, ZeroSharding};
use pipecut_ir::graph::Graph;
use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

/// Where replica r's stage s runs: the tensor-parallel group of that index (one device when
/// the group has one), whose devices are consecutive inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// Try every pipeline depth up to the device count, not only the usual ones (see
    /// [`stage_counts`]).
    pub all_stage_counts: bool,
    /// Wall-clock budget, the outer guard; the search returns its best so far when it runs
    /// out.
    pub time_limit: std::time::Duration,
    /// Configurations the search may cost (a DP run or feasibility sweep each, see
    /// [`DEFAULT_SEARCH_BUDGET`]); the search returns its best so far when they are spent.
    /// A count, not a clock: the same request gives the same answer on a loaded machine as on
    /// an idle one. `None`: only the time limit stops it.
    pub work_budget: Option<u64>,
    /// The engine the plan is for: only the configurations it runs are searched.
    pub engine: Engine,
    /// Recomputation choices tried in training (default: none and full).
    pub recompute: Vec<Recompute>,
    /// ZeRO stages tried in training with D > 1 (default: 0–3).
    pub zero_stages: Vec<u8>,
    /// The precision every floating-point tensor is costed at instead of the file's
    /// (`--dtype`), applied to each typed graph; `None`: the file's own dtypes.
    pub dtype_override: Option<pipecut_ir::graph::DType>,
    /// Tensor-parallel degrees to try; `None`: 1 and every degree that divides each node's
    /// GPU count and splits at least one block of the model.
    pub tensor_parallel: Option<Vec<u32>>,
    /// Whether tensor-parallel groups also split the rest of the model along the sequence.
    pub sequence_parallel: bool,
    /// Pipeline depths to try; `None`: [`stage_counts`].
    pub stage_counts: Option<Vec<usize>>,
    /// Data-parallel degrees to try; `None`: every one the devices allow.
    pub data_parallel: Option<Vec<usize>>,
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
            all_stage_counts: false,
            time_limit: std::time::Duration::from_secs(10),
            work_budget: None,
            engine: Engine::Pipecut,
            recompute: vec![Recompute::None, Recompute::Full],
            zero_stages: vec![0, 1, 2, 3],
            dtype_override: None,
            tensor_parallel: None,
            sequence_parallel: false,
            stage_counts: None,
            data_parallel: None,
        }
    }
}

/// One way to use the cluster: the decision variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// Activation recomputation (training).
    #[serde(default)]
    pub recompute: Recompute,
    /// ZeRO stage, 0–3, over the D replicas of each stage (training).
    #[serde(default)]
    pub zero_stage: u8,
    /// Tensor parallelism: each stage of each replica on a group of this many GPUs.
    #[serde(default, skip_serializing_if = "TensorParallelism::is_none")]
    pub tensor_parallel: TensorParallelism,
}

impl ConfigurationKey {
    /// GPUs of a tensor-parallel group.
    pub fn tensor_degree(&self) -> usize {
        self.tensor_parallel.degree.max(1) as usize
    }

    /// GPUs the configuration uses: K · D · t.
    pub fn gpus(&self) -> usize {
        self.stages * self.data_parallel * self.tensor_degree()
    }

    /// The first device of every replica's stage groups, `[replica][stage]`: group `g` is
    /// devices `g·t .. (g+1)·t`, inside one node when t divides the node's GPU count.
    pub fn replicas(&self) -> Vec<Vec<DeviceId>> {
        let t = self.tensor_degree() as u32;
        self.placement
            .replicas(self.stages, self.data_parallel)
            .into_iter()
            .map(|r| r.into_iter().map(|g| DeviceId(g.0 * t)).collect())
            .collect()
    }

    /// Every device the configuration uses, each group's devices in order.
    pub fn devices(&self) -> Vec<DeviceId> {
        let t = self.tensor_degree() as u32;
        self.replicas()
            .into_iter()
            .flatten()
            .flat_map(|first| (0..t).map(move |rank| DeviceId(first.0 + rank)))
            .collect()
    }

    /// The cost mode of this configuration: the request's, with its recomputation and its
    /// ZeRO stage over its D replicas.
    pub fn mode(&self, request_mode: Mode) -> Mode {
        request_mode.with_memory_techniques(
            self.recompute,
            ZeroSharding {
                stage: self.zero_stage,
                group: self.data_parallel.min(u32::MAX as usize) as u32,
            },
        )
    }
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
    /// All-reduce time of each pipeline device (zero in inference or with D = 1).
    pub allreduce_secs: Vec<f64>,
    /// The step: pipeline plus the exposed part of the all-reduces.
    pub step_secs: f64,
    /// Global batch / step.
    pub samples_per_sec: f64,
    /// Idle share of the pipeline's devices during the pipeline step.
    pub bubble_fraction: f64,
    /// The fullest stage's memory (under interleaving, the fullest device's: its chunks'
    /// sum).
    pub peak_memory_bytes: u64,
    /// What that stage (device) may use.
    pub capacity_bytes: u64,
}

/// The search's answer.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    /// The best configuration.
    pub best: Configuration,
    /// Its partition as the search costed it (a stage for every position of replica 0's
    /// problem), when the search kept it: the final partition starts from it.
    pub best_plan: Option<Vec<StageId>>,
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
    /// Did not fit memory: solved, or known from a smaller configuration that did not fit.
    pub infeasible: usize,
    /// Whether the search ran to its end; `false` when it stopped at the time limit with the
    /// best configurations found so far.
    pub complete: bool,
    /// Configurations costed with their equivalent twin instead of solved: the other
    /// placement, when tensor-parallel groups fill whole alike nodes.
    pub twinned: usize,
    /// Configurations ruled out by one feasibility sweep of the DP instead of solving: no
    /// partition has a slowest stage fast enough to beat the best found.
    pub cannot_beat: usize,
    /// Configurations the time limit left unsolved whose bound still beat the best found:
    /// what a complete search would have had to solve more (zero when complete).
    pub unresolved: usize,
    /// What stopped the search before it was complete; `None` when it is.
    pub stopped_by: Option<SearchLimit>,
    /// Configurations costed (the work budget's unit).
    pub work_done: u64,
    /// Wall time of the search.
    pub search_secs: f64,
}

/// One micro-batch size's typed graph, what tensor parallelism can split in it, and the bounds
/// used for pruning under each tensor-parallel layout tried.
struct Typed {
    graph: Graph,
    blocks: TensorParallelBlocks,
    bounds: BTreeMap<TensorParallelism, Bounds>,
    /// Per tensor-parallel degree above 1, the groups that keep each split block on one stage
    /// (see [`CutConstraints::tensor_parallel`]); `None` when the degree splits nothing.
    joined: BTreeMap<u32, Option<JoinedGroups>>,
}

/// What one GPU of a stage group does at least, under one tensor-parallel layout.
struct Bounds {
    /// One micro-batch's compute over all nodes on the fastest device kind (split nodes at
    /// 1/t with their collectives on the fastest intra-node link), under each recomputation
    /// mode searched: a recomputed forward (and its collectives) is work every pipeline does.
    total_secs: BTreeMap<Recompute, f64>,
    /// Every weight's footprint (with gradients and optimizer state in training), one GPU's
    /// share of the split ones.
    footprint_bytes: u64,
    /// Every weight's bytes alone, one GPU's share of the split ones.
    weight_bytes: u64,
    /// Every node's activations per micro-batch, one GPU's share of the split ones.
    activation_bytes: u64,
    /// The part of those that selective recomputation drops (attention's scores).
    score_activation_bytes: u64,
    /// The weight with the largest footprint: (its bytes, its footprint), one GPU's share if
    /// split. Whichever stage reads it holds it whole: no cut divides a weight.
    largest_param: (u64, u64),
}

impl Bounds {
    /// The whole model's weight footprint on one replica under `mode`'s ZeRO sharding: a
    /// lower bound of what K stages hold together (per-weight rounding only adds).
    fn footprint_under(&self, mode: Mode) -> u64 {
        held_under(self.weight_bytes, self.footprint_bytes, mode)
    }

    /// A lower bound of the fullest stage's (or, interleaved, device's) peak bytes under
    /// `key`, whatever the partition, by the memory model of [`PartitionProblem::evaluate`]:
    /// stage s holds its weights P_s (together at least the model's P) and a_s micro-batches
    /// of its activations A_s (together exactly the model's A), a_s being the schedule's
    /// in-flight count under the recomputation mode; received tensors only add. For any
    /// weights λ_s ≥ 0 summing to 1, max_s (P_s + a_s·A_s) ≥ Σ λ_s (P_s + a_s·A_s): uniform λ
    /// gives (P + min a · A)/K, λ_s ∝ 1/a_s gives (P / max a + A)/H with H = Σ 1/a_s. The
    /// stage that reads the largest weight holds at least that weight's footprint.
    ///
    /// # Complexity
    /// O(K) for K stages.
    fn peak_lower_bound(&self, key: &ConfigurationKey, mode: Mode) -> u64 {
        let k = key.stages.max(1);
        let weights = self.footprint_under(mode) as f64;
        let (activations, recompute) = match mode {
            Mode::Training { recompute, .. } => {
                let kept = match recompute {
                    Recompute::Selective => self
                        .activation_bytes
                        .saturating_sub(self.score_activation_bytes),
                    _ => self.activation_bytes,
                };
                (kept as f64, recompute)
            }
            Mode::Inference => (self.activation_bytes as f64, Recompute::None),
        };
        let in_flight: Vec<f64> = (0..k)
            .map(|s| {
                // A device's interleaved chunks each hold at least one micro-batch: counted
                // as one stage holding one.
                let count = match key.schedule {
                    Schedule::Interleaved { .. } => 1,
                    schedule => pipecut_cost::memory::in_flight_microbatches(
                        mode,
                        schedule,
                        s,
                        k,
                        key.microbatches.min(u32::MAX as u64) as u32,
                    ),
                };
                recompute.activation_in_flight(count).max(1) as f64
            })
            .collect();
        let fewest = in_flight.iter().copied().fold(f64::INFINITY, f64::min);
        let most = in_flight.iter().copied().fold(0.0, f64::max);
        let harmonic: f64 = in_flight.iter().map(|a| 1.0 / a).sum();
        let uniform = (weights + fewest * activations) / k as f64;
        let weighted = (weights / most + activations) / harmonic;
        let (weight, footprint) = self.largest_param;
        let largest = held_under(weight, footprint, mode) as f64;
        // Rounded down, and a relative hair below, so that float error never overstates.
        (uniform.max(weighted).max(largest) * (1.0 - 1e-9)) as u64
    }
}

impl Bounds {
    /// An upper bound of `key`'s samples per second, whatever its partition: the global batch
    /// over [`step_lower_bound`] under the recomputation mode's own costs (its extra forward
    /// is work every pipeline does).
    fn samples_per_sec_bound(
        &self,
        key: &ConfigurationKey,
        request: &SearchRequest,
        cluster: &Cluster,
    ) -> f64 {
        let mode = request
            .mode
            .with_memory_techniques(key.recompute, ZeroSharding::NONE);
        let recompute = match mode {
            Mode::Inference => Recompute::None,
            Mode::Training { recompute, .. } => recompute,
        };
        let total_secs = self.total_secs[&recompute];
        let pipeline =
            step_lower_bound(mode, key.schedule, total_secs, key.stages, key.microbatches);
        request.global_batch as f64
            / pipeline.max(self.allreduce_step_bound(key, request, cluster, total_secs))
    }

    /// No data-parallel step is shorter than this: each pipeline device's gradient all-reduce
    /// starts after its last operation ([`StepFigures`]), which ends no earlier than its m
    /// micro-batches of compute c_d, so step ≥ max_d (m·c_d + AR(W_d)) ≥ (m·T + β·W)/K + α for
    /// a ring all-reduce costing at least α + β·bytes (Σ c_d ≥ T, and the stages' gradients
    /// cover every weight: Σ W_d ≥ W). α and β take the fastest link a ring of D groups of t
    /// can use: the network when D·t GPUs cannot share one node. Zero in inference or for
    /// one replica.
    fn allreduce_step_bound(
        &self,
        key: &ConfigurationKey,
        request: &SearchRequest,
        cluster: &Cluster,
        total_secs: f64,
    ) -> f64 {
        let d = key.data_parallel;
        let Mode::Training { .. } = request.mode else {
            return 0.0;
        };
        if d < 2 {
            return 0.0;
        }
        let (bandwidth, latency) = fastest_ring_link(cluster, d * key.tensor_degree());
        let zero = ZeroSharding {
            stage: key.zero_stage,
            group: d.min(u32::MAX as usize) as u32,
        };
        let steps = 2.0 * (d as f64 - 1.0);
        let per_byte = steps / d as f64 / bandwidth * zero.communication_factor();
        let fixed = steps * latency * zero.communication_factor();
        let k = key.stages.max(1) as f64;
        let m = key.microbatches as f64;
        ((m * total_secs + per_byte * self.weight_bytes as f64) / k + fixed) * (1.0 - 1e-9)
    }
}

/// The fastest bandwidth and least latency any ring over `gpus` GPUs, one per tensor-parallel
/// group, can have: across the network when no node holds that many GPUs (a ring that leaves
/// a node crosses it at least once, and a ring runs at its slowest link), else the fastest of
/// every link.
fn fastest_ring_link(cluster: &Cluster, gpus: usize) -> (f64, f64) {
    let intra: Vec<(f64, f64)> = cluster
        .nodes()
        .iter()
        .map(|n| {
            n.intra_node_link
                .as_ref()
                .map_or((f64::INFINITY, 0.0), |l| {
                    (
                        l.bandwidth_bytes_per_sec_per_direction.value,
                        l.latency_secs.value,
                    )
                })
        })
        .collect();
    let net = cluster.inter_node_link().map(|l| {
        (
            l.bandwidth_bytes_per_sec_per_direction.value,
            l.latency_secs.value,
        )
    });
    let largest_node = cluster
        .nodes()
        .iter()
        .map(|n| n.devices.len())
        .max()
        .unwrap_or(0);
    let links: Vec<(f64, f64)> = match net {
        Some(net) if gpus > largest_node => vec![net],
        _ => intra.into_iter().chain(net).collect(),
    };
    let bandwidth = links.iter().map(|l| l.0).fold(0.0, f64::max);
    let latency = links.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
    (bandwidth, if latency.is_finite() { latency } else { 0.0 })
}

/// Bytes one replica holds of weights of `weight` bytes whose footprint without sharding is
/// `footprint` (weights, gradients and optimizer state in training), under `mode`'s ZeRO.
fn held_under(weight: u64, footprint: u64, mode: Mode) -> u64 {
    match mode {
        Mode::Inference => footprint,
        Mode::Training { zero, .. } => {
            let optimizer = footprint.saturating_sub(2 * weight);
            zero.held_bytes(weight, optimizer)
        }
    }
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
    check_request(request)?;
    let sizes = microbatch_sizes(request)?;
    let depths = match &request.stage_counts {
        Some(depths) => depths.clone(),
        None => stage_counts(graph, gpus, request.all_stage_counts),
    };
    if depths.contains(&0)
        || request
            .data_parallel
            .as_ref()
            .is_some_and(|d| d.contains(&0))
    {
        return bad("pipeline and data-parallel degrees start at 1".into());
    }
    let mut space = Space::enumerate(graph, cluster, request, &sizes, &depths, started)?;
    if let (true, Some(fewest)) = (space.candidates.is_empty(), space.fewest_over_limit) {
        // Every configuration was skipped for its micro-batch count: say so, not "infeasible".
        check_microbatches(fewest)?;
    }
    if let (true, 0, Some(reason)) = (
        space.candidates.is_empty(),
        space.pruned_by_memory,
        space.engine_refused,
    ) {
        return bad(format!(
            "{} runs none of the configurations asked for: it {reason}",
            request.engine
        ));
    }
    let total_candidates = space.candidates.len() + space.pruned_by_memory + space.twinned;
    order_for_solving(&mut space.candidates);
    let ranking = Ranking::solve(cluster, request, &space, started)?;
    let complete = space.complete && ranking.complete;
    let stopped_by = match (space.complete, ranking.stopped_by) {
        (_, Some(limit)) => Some(limit),
        (false, None) => Some(SearchLimit::TimeLimit),
        (true, None) => None,
    };
    let work_done = ranking.work_done;
    let Ranking {
        ranked,
        solved,
        infeasible,
        unresolved,
        cannot_beat,
        best_plan,
        ..
    } = ranking;
    let Some(best) = ranked.first().cloned() else {
        if let Some(limit) = stopped_by {
            let (what, option) = match limit {
                SearchLimit::WorkBudget => (
                    format!(
                        "work budget of {} configurations",
                        request.work_budget.unwrap_or(0)
                    ),
                    "--search-budget",
                ),
                SearchLimit::TimeLimit => (
                    format!("time limit of {:.1} s", request.time_limit.as_secs_f64()),
                    "--time-limit",
                ),
            };
            return Err(Error::PartitionConfig(format!(
                "the search found no configuration that fits memory within its {what} ({solved} \
                 solved, {infeasible} did not fit): raise {option}"
            )));
        }
        return Err(Error::Infeasible(format!(
            "no configuration of {gpus} devices holds the model: every pipeline depth tried \
             ({} from {} to {}) runs out of memory for every micro-batch size tried ({sizes:?}) \
             at this global batch, with the recomputation, ZeRO stages and tensor-parallel \
             degrees tried; a smaller global batch means fewer micro-batches in flight",
            depths.len(),
            depths.first().copied().unwrap_or(0),
            depths.last().copied().unwrap_or(0),
        )));
    };
    let k = best.key;
    Ok(SearchOutcome {
        graph: space
            .typed
            .remove(&k.microbatch_size)
            .expect("the best size was typed")
            .graph,
        replicas: k.replicas(),
        best,
        best_plan,
        ranked,
        candidates: total_candidates,
        solved,
        pruned_by_memory: space.pruned_by_memory,
        infeasible,
        complete,
        unresolved,
        twinned: space.twinned,
        cannot_beat,
        stopped_by,
        work_done,
        search_secs: started.elapsed().as_secs_f64(),
    })
}

/// Refuses a request with nothing to search or a choice no configuration can take.
fn check_request(request: &SearchRequest) -> Result<(), Error> {
    let bad = |detail: String| Err(Error::PartitionConfig(detail));
    if request.global_batch == 0 {
        return bad("the global batch must be at least 1".into());
    }
    if request.schedules.is_empty() {
        return bad("no schedule to try".into());
    }
    if let Some(message) = request.schedules.iter().find_map(|s| s.validate().err()) {
        return bad(message);
    }
    if request.recompute.is_empty() || request.zero_stages.is_empty() {
        return bad("no recomputation choice or ZeRO stage to try".into());
    }
    if let Some(stage) = request.zero_stages.iter().find(|&&z| z > 3) {
        return bad(format!("ZeRO has stages 0 to 3, not {stage}"));
    }
    Ok(())
}

/// The configurations a search may solve, before any is: every micro-batch size typed, and
/// every configuration the memory bound leaves with its throughput bound.
struct Space {
    /// Each micro-batch size's typed graph.
    typed: BTreeMap<u64, Typed>,
    /// (throughput bound, key) of every configuration left to solve.
    candidates: Vec<(f64, ConfigurationKey)>,
    /// Configurations the memory bound discarded.
    pruned_by_memory: usize,
    /// Configurations costed with their placement twin instead of queued.
    twinned: usize,
    /// The fewest micro-batches per step among configurations skipped for having more than
    /// the simulator runs (see [`check_microbatches`]).
    fewest_over_limit: Option<u64>,
    /// Whether every micro-batch size was typed before the time limit.
    complete: bool,
    /// Why the target engine refused a configuration, the first such reason.
    engine_refused: Option<&'static str>,
}

impl Space {
    /// Types the graph for each micro-batch size in `sizes` (until the time limit, counted
    /// from `started`) and queues every (b, D, m, tensor-parallel layout) at each depth of
    /// `depths` that fits the cluster.
    fn enumerate(
        graph: &Graph,
        cluster: &Cluster,
        request: &SearchRequest,
        sizes: &[u64],
        depths: &[usize],
        started: Instant,
    ) -> Result<Space, Error> {
        let gpus = cluster.device_count();
        let max_capacity = largest_capacity(cluster, request);
        let mut space = Space {
            typed: BTreeMap::new(),
            candidates: Vec::new(),
            pruned_by_memory: 0,
            twinned: 0,
            fewest_over_limit: None,
            complete: true,
            engine_refused: None,
        };
        for &b in sizes {
            // Typing the graph is the costly part of this loop: the time limit covers it too.
            if !space.typed.is_empty() && started.elapsed() >= request.time_limit {
                space.complete = false;
                break;
            }
            // Even spread over every device, this size needs too many micro-batches: skip it
            // before typing the graph for it.
            let fewest = request.global_batch / (gpus.max(1) as u64 * b);
            if check_microbatches(fewest).is_err() {
                space.note_over_limit(fewest);
                continue;
            }
            let t = type_graph(graph, cluster, request, b)?;
            let nodes = t.graph.node_count();
            for (&layout, bounds) in &t.bounds {
                let group = layout.degree.max(1) as usize;
                for d in (1..=gpus / group).filter(|d| {
                    request
                        .data_parallel
                        .as_ref()
                        .is_none_or(|wanted| wanted.contains(d))
                }) {
                    if !request.global_batch.is_multiple_of(d as u64 * b) {
                        continue;
                    }
                    let m = request.global_batch / (d as u64 * b);
                    if check_microbatches(m).is_err() {
                        space.note_over_limit(m);
                        continue;
                    }
                    let shapes = Shapes {
                        microbatch_size: b,
                        data_parallel: d,
                        microbatches: m,
                        tensor_parallel: layout,
                    };
                    for &k in depths
                        .iter()
                        .filter(|&&k| k * d * group <= gpus && k <= nodes)
                    {
                        space.pruned_by_memory += shapes.push_candidates(
                            k,
                            (bounds, cluster),
                            request,
                            max_capacity,
                            (&mut space.candidates, &mut space.twinned),
                            &mut space.engine_refused,
                        );
                    }
                }
            }
            space.typed.insert(b, t);
        }
        Ok(space)
    }

    /// Notes a configuration skipped for needing `microbatches` per step.
    fn note_over_limit(&mut self, microbatches: u64) {
        self.fewest_over_limit = Some(
            self.fewest_over_limit
                .map_or(microbatches, |f| f.min(microbatches)),
        );
    }
}

/// Most promising first (see [`solve_priority`]); equal priorities in a fixed order of their
/// keys, so plans are deterministic, the most memory-saving technique first: when it does
/// not fit, the others are ruled out unsolved. The ranking does not depend on this order
/// (ties go by key), nor does the proof: every candidate is either solved or has a bound
/// no better than the best solved.
fn order_for_solving(candidates: &mut [(f64, ConfigurationKey)]) {
    let savings = |k: &ConfigurationKey| std::cmp::Reverse((k.recompute, k.zero_stage));
    candidates.sort_by(|a, b| {
        let shape = |k: &ConfigurationKey| ConfigurationKey {
            recompute: Recompute::None,
            zero_stage: 0,
            ..*k
        };
        solve_priority(b.0, &b.1)
            .total_cmp(&solve_priority(a.0, &a.1))
            .then(shape(&a.1).cmp(&shape(&b.1)))
            .then(savings(&a.1).cmp(&savings(&b.1)))
    });
}

/// The best configurations solving found, and what became of the rest.
struct Ranking {
    /// The best configurations, best first, at most the request's `top`.
    ranked: Vec<Configuration>,
    solved: usize,
    infeasible: usize,
    unresolved: usize,
    cannot_beat: usize,
    /// Whether every candidate was solved or ruled out before the time limit.
    complete: bool,
    /// The limit that stopped it, when one did.
    stopped_by: Option<SearchLimit>,
    /// Configurations costed.
    work_done: u64,
    /// Configurations no contiguous cut of the DP's order fits: not proven not to fit.
    dp_rejected: Vec<ConfigurationKey>,
    /// The best configuration's partition, as it was costed.
    best_plan: Option<Vec<StageId>>,
}

impl Ranking {
    /// Solves the candidates of `space` in order, skipping those whose bound cannot beat the
    /// best so far, until the time limit (counted from `started`).
    fn solve(
        cluster: &Cluster,
        request: &SearchRequest,
        space: &Space,
        started: Instant,
    ) -> Result<Ranking, Error> {
        let candidates = &space.candidates;
        let top = request.top.max(1);
        let mut ranking = Ranking {
            ranked: Vec::new(),
            solved: 0,
            infeasible: 0,
            unresolved: 0,
            cannot_beat: 0,
            complete: true,
            stopped_by: None,
            work_done: 0,
            dp_rejected: Vec::new(),
            best_plan: None,
        };
        let mut out_of_memory = MemoryMemo::default();
        let mut pipelines = SolvedPipelines::default();
        let mut longest = std::time::Duration::ZERO;
        for (at, &(bound, key)) in candidates.iter().enumerate() {
            let best = ranking.ranked.first().map(|best| best.samples_per_sec);
            // It cannot beat the best: once every candidate is solved or skipped so, the best
            // is proven best over the space (the alternatives are the best of those solved on
            // the way).
            if best.is_some_and(|best| bound <= best) {
                continue;
            }
            // The clock is checked between configurations: the next one, and after the search
            // the chosen configuration's own partition (costs and DP, about one configuration's
            // work), must fit in what is left, so the longest configuration so far is kept
            // twice in reserve.
            let limit = match request.work_budget {
                Some(budget) if ranking.work_done >= budget => Some(SearchLimit::WorkBudget),
                _ if started.elapsed() + 2 * longest >= request.time_limit => {
                    Some(SearchLimit::TimeLimit)
                }
                _ => None,
            };
            if let Some(limit) = limit {
                ranking.complete = false;
                ranking.stopped_by = Some(limit);
                let best = best.unwrap_or(0.0);
                ranking.unresolved = candidates[at..].iter().filter(|c| c.0 > best).count();
                break;
            }
            let kinds = kinds_of(cluster, &key.replicas()[0]);
            if out_of_memory.rules_out(&key, request.mode, &kinds) {
                ranking.infeasible += 1;
                continue;
            }
            let t = &space.typed[&key.microbatch_size];
            let joined = t
                .joined
                .get(&key.tensor_parallel.degree)
                .and_then(Option::as_ref);
            ranking.work_done += 1;
            let costing = Instant::now();
            let evaluated = evaluate_with(
                &t.graph,
                (&t.blocks, joined),
                cluster,
                request,
                (key, best),
                &mut pipelines,
            )?;
            longest = longest.max(costing.elapsed());
            match evaluated {
                Evaluated::CannotBeat => ranking.cannot_beat += 1,
                Evaluated::Costed(config) => {
                    ranking.solved += 1;
                    for config in placement_twin(cluster, &config).into_iter().chain([config]) {
                        let at = ranking.ranked.partition_point(|c| better(c, &config));
                        ranking.ranked.insert(at, config);
                    }
                    ranking.ranked.truncate(top);
                }
                Evaluated::DoesNotFit => {
                    ranking.solved += 1;
                    ranking.infeasible += 1;
                    ranking.dp_rejected.push(key);
                    out_of_memory.record(&key, request.mode, kinds);
                }
            }
        }
        if ranking.ranked.is_empty() {
            ranking.decide_memory(cluster, request, space, started, &mut pipelines)?;
        }
        if let Some(best) = ranking.ranked.first() {
            let t = &space.typed[&best.key.microbatch_size];
            let problem = pipeline_problem(&t.graph, &t.blocks, cluster, request, best.key)?;
            ranking.best_plan = pipelines
                .solved
                .remove(&pipeline_entry(&problem, best.key))
                .flatten()
                .map(|(stage_of, _)| stage_of);
        }
        Ok(ranking)
    }

    /// When no configuration's DP found a plan that fits: the exact solver (milp.rs's
    /// [`super::milp::fit_memory`]) over every convex partition of each configuration the DP
    /// rejected, in the search's order, until one fits or the time limit. Before it, "no
    /// configuration holds the model" was said of configurations only one topological order
    /// had been tried for. Errs with [`Error::MemoryUndecided`] when some configuration is
    /// left undecided and none fits.
    fn decide_memory(
        &mut self,
        cluster: &Cluster,
        request: &SearchRequest,
        space: &Space,
        started: Instant,
        pipelines: &mut SolvedPipelines,
    ) -> Result<(), Error> {
        let deadline = started + request.time_limit;
        let mut undecided = 0;
        for (at, &key) in self.dp_rejected.iter().enumerate() {
            if Instant::now() >= deadline {
                undecided += self.dp_rejected.len() - at;
                break;
            }
            let t = &space.typed[&key.microbatch_size];
            let joined = t
                .joined
                .get(&key.tensor_parallel.degree)
                .and_then(Option::as_ref);
            let problem = pipeline_problem(&t.graph, &t.blocks, cluster, request, key)?;
            let fit = match joined {
                None => super::milp::fit_memory(&problem, deadline, None),
                Some(groups) if groups.len() < problem.stage_count() => continue,
                Some(groups) => {
                    let grouped = groups.quotient(&problem)?;
                    super::milp::fit_memory(&grouped.problem, deadline, None)
                        .map_plan(|plan| grouped.expand(&plan))
                }
            };
            let plan = match fit {
                super::milp::MemoryFit::Fits(plan) => plan,
                proof if proof.proves_nothing_fits() => continue,
                _ => {
                    undecided += 1;
                    continue;
                }
            };
            let evaluation = problem.evaluate(&plan);
            pipelines
                .solved
                .insert(pipeline_entry(&problem, key), Some((plan, evaluation)));
            let joined = (&t.blocks, joined);
            if let Evaluated::Costed(config) =
                evaluate_with(&t.graph, joined, cluster, request, (key, None), pipelines)?
            {
                self.infeasible -= 1;
                let at = self.ranked.partition_point(|c| better(c, &config));
                self.ranked.insert(at, config);
                self.ranked.truncate(request.top.max(1));
            }
        }
        if self.ranked.is_empty() && undecided > 0 {
            return Err(Error::MemoryUndecided(format!(
                "no configuration's contiguous cuts fit, and the exact solver did not decide within the time limit of {:.1} s whether {undecided} of them fit with other convex partitions; a longer --time-limit may decide it",
                request.time_limit.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// Whether the search rules `key` out for memory before solving it: a lower bound of its
/// fullest stage's peak ([`Bounds::peak_lower_bound`]) over the largest device's capacity.
/// `graph` is as loaded, before shape inference. Public so that tests can check the bound
/// against solving: no configuration it rules out fits.
pub fn ruled_out_by_memory(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    key: ConfigurationKey,
) -> Result<bool, Error> {
    let typed = type_graph(graph, cluster, request, key.microbatch_size)?;
    let bounds = typed.bounds.get(&key.tensor_parallel).ok_or_else(|| {
        Error::PartitionConfig(format!(
            "tensor-parallel degree {} is not searched for this model and cluster",
            key.tensor_parallel.degree
        ))
    })?;
    Ok(bounds.peak_lower_bound(&key, key.mode(request.mode)) > largest_capacity(cluster, request))
}

/// The search's upper bound of `key`'s samples per second before solving it
/// ([`step_lower_bound`]): no partition of `key` is faster. `graph` is as loaded, before shape
/// inference. Public so that tests can check the bound against solving.
pub fn throughput_bound(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    key: ConfigurationKey,
) -> Result<f64, Error> {
    let typed = type_graph(graph, cluster, request, key.microbatch_size)?;
    let bounds = typed.bounds.get(&key.tensor_parallel).ok_or_else(|| {
        Error::PartitionConfig(format!(
            "tensor-parallel degree {} is not searched for this model and cluster",
            key.tensor_parallel.degree
        ))
    })?;
    Ok(bounds.samples_per_sec_bound(&key, request, cluster))
}

/// What the largest device may use: the memory bound's yardstick, which holds for every
/// placement on a cluster of mixed devices.
fn largest_capacity(cluster: &Cluster, request: &SearchRequest) -> u64 {
    cluster
        .devices()
        .map(|(_, d)| capacity_bytes(d.memory_bytes.value as f64, request.memory_headroom))
        .max()
        .unwrap_or(0)
}

/// One (b, D, m, tensor-parallel layout) of the search, before its depths and techniques.
struct Shapes {
    microbatch_size: u64,
    data_parallel: usize,
    microbatches: u64,
    tensor_parallel: TensorParallelism,
}

impl Shapes {
    /// Queues this shape at depth `k` under every schedule, placement, recomputation and ZeRO
    /// stage the request allows, with its throughput bound; returns how many configurations
    /// the memory bound discarded instead.
    fn push_candidates(
        &self,
        k: usize,
        (bounds, cluster): (&Bounds, &Cluster),
        request: &SearchRequest,
        max_capacity: u64,
        (candidates, twinned): (&mut Vec<(f64, ConfigurationKey)>, &mut usize),
        refused: &mut Option<&'static str>,
    ) -> usize {
        let training = matches!(request.mode, Mode::Training { .. });
        let d = self.data_parallel;
        // Memory techniques exist for training; ZeRO needs replicas to shard over.
        let recomputes: &[Recompute] = if training {
            &request.recompute
        } else {
            &[Recompute::None]
        };
        let zero_stages: &[u8] = if training && d > 1 {
            &request.zero_stages
        } else {
            &[0]
        };
        // One stage has no schedule to choose, nor has inference (forwards only: the
        // schedules coincide).
        let schedules = if k == 1 || matches!(request.mode, Mode::Inference) {
            &request.schedules[..1]
        } else {
            &request.schedules[..]
        };
        let mut pruned = 0;
        for (&recompute, &zero_stage) in recomputes
            .iter()
            .flat_map(|r| zero_stages.iter().map(move |z| (r, z)))
        {
            let key = |schedule, placement| ConfigurationKey {
                stages: k,
                data_parallel: d,
                microbatch_size: self.microbatch_size,
                microbatches: self.microbatches,
                schedule,
                placement,
                recompute,
                zero_stage,
                tensor_parallel: self.tensor_parallel,
            };
            for &schedule in schedules {
                // Megatron's interleaved order needs whole rounds of K micro-batches.
                if schedule.chunks() > 1 && !self.microbatches.is_multiple_of(k as u64) {
                    continue;
                }
                let probe = key(schedule, placements(k, d)[0]);
                // Only what the target engine runs is searched.
                if let Some(reason) = request.engine.refuses(&probe, training) {
                    refused.get_or_insert(reason);
                    continue;
                }
                if bounds.peak_lower_bound(&probe, probe.mode(request.mode)) > max_capacity {
                    pruned += placements(k, d).len();
                    continue;
                }
                // The twin of an equivalent placement is costed with it, not queued.
                let twins = placements_coincide(cluster, self.tensor_parallel);
                for &placement in placements(k, d) {
                    if twins && placement == Placement::ReplicasInsideNodes {
                        *twinned += 1;
                        continue;
                    }
                    let key = key(schedule, placement);
                    candidates.push((bounds.samples_per_sec_bound(&key, request, cluster), key));
                }
            }
        }
        pruned
    }
}

/// Configurations known not to fit. A stage's memory grows with the micro-batch size (its
/// activations) and with the micro-batch count (the schedule's in-flight count never falls as
/// m grows), and does not depend on which devices of the same kinds hold the stages. It falls
/// with recomputation and with a higher ZeRO stage or a larger group to shard over. So when
/// (K, kinds, schedule, b, m, technique) does not fit, no (K, kinds, schedule, b' ≥ b, m' ≥ m)
/// with a technique that saves no more does: it is skipped without solving.
type MemoryClass = (usize, Schedule, TensorParallelism, Vec<String>);

/// A configuration that did not fit, by what its memory grows and falls with.
#[derive(Debug, Clone, Copy)]
struct OutOfMemory {
    microbatch_size: u64,
    in_flight: u64,
    recompute: Recompute,
    zero_stage: u8,
    data_parallel: usize,
}

impl OutOfMemory {
    /// Whether `other` needs at least the memory this one needed (so cannot fit either).
    fn rules_out(&self, other: &OutOfMemory) -> bool {
        // Sharding over a group saves at least as much as sharding at a lower stage or over
        // a smaller group; no sharding saves nothing whatever the group.
        let shards_no_more = other.zero_stage == 0
            || (other.zero_stage <= self.zero_stage && other.data_parallel <= self.data_parallel);
        other.microbatch_size >= self.microbatch_size
            && other.in_flight >= self.in_flight
            && other.recompute <= self.recompute
            && shards_no_more
    }
}

#[derive(Default)]
struct MemoryMemo {
    /// (K, in-flight schedule class, device kinds) → the configurations that did not fit.
    infeasible: BTreeMap<MemoryClass, Vec<OutOfMemory>>,
}

impl MemoryMemo {
    /// What decides the in-flight counts ([`pipecut_cost::in_flight_microbatches`]): nothing in
    /// inference (one micro-batch), m under GPipe, min(m, K) under 1F1B.
    fn in_flight_class(key: &ConfigurationKey, mode: Mode) -> (Schedule, u64) {
        match (mode, key.schedule) {
            (Mode::Inference, _) => (Schedule::OneFOneB, 1),
            (_, Schedule::GPipe) => (Schedule::GPipe, key.microbatches),
            (_, Schedule::OneFOneB) => {
                (Schedule::OneFOneB, key.microbatches.min(key.stages as u64))
            }
            (_, Schedule::ZeroBubble) => (
                Schedule::ZeroBubble,
                key.microbatches.min(key.stages as u64),
            ),
            // A chunk's count never falls as m grows (the warm-up only lengthens).
            (_, Schedule::Interleaved { .. }) => (key.schedule, key.microbatches),
        }
    }

    fn entry(key: &ConfigurationKey, mode: Mode, kinds: Vec<String>) -> (MemoryClass, OutOfMemory) {
        let (schedule, in_flight) = Self::in_flight_class(key, mode);
        let zero_stage = if key.data_parallel > 1 {
            key.zero_stage
        } else {
            0
        };
        (
            (key.stages, schedule, key.tensor_parallel, kinds),
            OutOfMemory {
                microbatch_size: key.microbatch_size,
                in_flight,
                recompute: key.recompute,
                zero_stage,
                data_parallel: key.data_parallel,
            },
        )
    }

    fn rules_out(&self, key: &ConfigurationKey, mode: Mode, kinds: &[String]) -> bool {
        let (class, this) = Self::entry(key, mode, kinds.to_vec());
        self.infeasible
            .get(&class)
            .is_some_and(|known| known.iter().any(|k| k.rules_out(&this)))
    }

    fn record(&mut self, key: &ConfigurationKey, mode: Mode, kinds: Vec<String>) {
        let (class, this) = Self::entry(key, mode, kinds);
        self.infeasible.entry(class).or_default().push(this);
    }
}

/// The device kinds of a pipeline, in stage order.
fn kinds_of(cluster: &Cluster, devices: &[DeviceId]) -> Vec<String> {
    devices
        .iter()
        .map(|&d| cluster.device(d).name.clone())
        .collect()
}

/// The pipeline depths tried: every depth up to 16, the powers of two, and the divisors of the
/// model's layer count and their doublings (with and without the embedding and head layers that
/// [`super::layers::find_layers`] counts), which are the depths that cut between whole layers.
/// Depths beyond twice the layer count are left out (stages would split inside layers while the
/// bubble keeps growing), and so is a depth like 341 on 1,023 GPUs, which cannot balance whole
/// layers: trying every depth up to a thousand GPUs costs minutes. `all` tries every depth.
pub fn stage_counts(graph: &Graph, gpus: usize, all: bool) -> Vec<usize> {
    let limit = gpus.min(graph.node_count()).max(1);
    if all {
        return (1..=limit).collect();
    }
    let names: Vec<String> = graph
        .topological_order()
        .iter()
        .map(|&id| graph.node(id).name.clone())
        .collect();
    let layers = super::layers::find_layers(&names).len();
    let mut depths: Vec<usize> = (1..=16).collect();
    depths.extend(
        std::iter::successors(Some(1usize), |k| k.checked_mul(2)).take_while(|&k| k <= limit),
    );
    for count in [layers, layers.saturating_sub(2)]
        .into_iter()
        .filter(|&c| c > 0)
    {
        for k in (1..=count).filter(|k| count % k == 0) {
            depths.extend(
                std::iter::successors(Some(k), |k| k.checked_mul(2)).take_while(|&k| k <= limit),
            );
        }
    }
    // Deeper than two stages per layer, stages split inside layers: the bubble grows with K
    // while the stage time stops falling (layers are the unit of balanced work).
    let deepest = if layers > 1 {
        (2 * layers).max(16)
    } else {
        limit
    };
    depths.retain(|&k| k <= limit.min(deepest));
    depths.sort_unstable();
    depths.dedup();
    depths
}

/// No K-stage pipeline of m micro-batches takes less than this per step, T being one
/// micro-batch's compute on the fastest device (forward and backward in training) and F its
/// forward part. The stage s* with the largest time t* does m micro-batches of work, so
/// step ≥ m·t* ≥ m·T/K. Each stage runs its forwards in micro-batch order, and micro-batch m
/// still has to pass every other stage's forward and every backward after its turn on s*,
/// while micro-batch 1 had to reach s* first: step ≥ T + (m − 1)·f* ≥ T + (m − 1)·F/K, with
/// f* the largest stage forward (F = T in inference).
///
/// Under interleaving a device's forwards are of different chunks, out of micro-batch order,
/// so only the work bound and `T` (one micro-batch through every chunk) hold. Under
/// zero-bubble the chain is `T` less the weight gradients, which leave it.
fn step_lower_bound(
    mode: Mode,
    schedule: Schedule,
    total_secs: f64,
    stages: usize,
    microbatches: u64,
) -> f64 {
    let k = stages as f64;
    let m = microbatches as f64;
    let forward_secs = match mode {
        Mode::Inference => total_secs,
        Mode::Training { .. } => total_secs / (1.0 + mode.backward_time_factor()),
    };
    // Zero-bubble's weight gradients (half of each backward) leave the chain: the last
    // micro-batch's W passes run side by side on their devices.
    let chain_secs = match (mode, schedule) {
        (Mode::Training { .. }, Schedule::ZeroBubble) => {
            total_secs - (total_secs - forward_secs) / 2.0
        }
        _ => total_secs,
    };
    let work = (m * total_secs / k).max(chain_secs);
    if schedule.chunks() > 1 && matches!(mode, Mode::Training { .. }) {
        return work;
    }
    // What must run before a stage's first operation, as a share of the stages before it:
    // their forwards and (after its last backward) their backwards, or only the forwards
    // under zero-bubble, whose last operation on a stage may be a W that nothing waits for.
    let prefix_share = match (mode, schedule) {
        (Mode::Training { .. }, Schedule::ZeroBubble) => forward_secs / total_secs,
        _ => 1.0,
    };
    work.max(chain_secs + (m - 1.0) * forward_secs / k)
        .max(prefix_bound(total_secs, prefix_share, stages, m))
}

/// No K-stage pipeline of m micro-batches with T of work per micro-batch takes less than
/// `α·T / (1 − (1 − α/m)^K)`. Stage j, with c_j of work per micro-batch, starts only after
/// micro-batch 1 has passed the stages before it and is busy m·c_j, and in training the last
/// micro-batch's backward must pass those stages again after it: step ≥ m·c_j + α·Σ_{s<j} c_s
/// for every j, α = 1 (α = F/T when only the forwards are certain, as under zero-bubble).
/// Were all these below L, induction on j gives Σ_{s<j} c_s < L·(1 − r^j)/α with
/// r = 1 − α/m, so T ≤ Σ c_s < L·(1 − r^K)/α: the bound is that L. Against the work bound
/// m·T/K it adds up to about half the bubble of a balanced pipeline (6.49 T against 6 T and
/// 1F1B's 6.94 T at K = 16, m = 96).
fn prefix_bound(total_secs: f64, share: f64, stages: usize, microbatches: f64) -> f64 {
    if share <= 0.0 || microbatches < 1.0 {
        return 0.0;
    }
    let ratio = 1.0 - share / microbatches;
    let reached = 1.0 - ratio.powi(stages.min(i32::MAX as usize) as i32);
    if reached <= 0.0 {
        return 0.0;
    }
    share * total_secs / reached * (1.0 - 1e-9)
}

/// The order candidates are solved in: the throughput bound scaled by the share of a step a
/// balanced pipeline is busy, m / (m + K − 1). The bound alone cannot tell a deep pipeline with
/// few micro-batches (a large bubble) from a shallow one with many, so many configurations tie
/// on it; solving the likelier ones first finds a good configuration early, and then the bound
/// skips the rest. Only the order depends on this estimate, never what is proven.
/// The bubble's K − 1 slots shrink to (K − 1)/v under interleaving and to about a third under
/// zero-bubble (the papers' figures for equal stage times).
fn solve_priority(bound: f64, key: &ConfigurationKey) -> f64 {
    let m = key.microbatches as f64;
    let slots = (key.stages as f64 - 1.0)
        * match key.schedule {
            Schedule::Interleaved { chunks } => 1.0 / chunks.max(1) as f64,
            Schedule::ZeroBubble => 1.0 / 3.0,
            Schedule::GPipe | Schedule::OneFOneB => 1.0,
        };
    bound * m / (m + slots)
}

/// Whether `a` ranks before `b`: more samples per second, then fewer GPUs, then the key order.
fn better(a: &Configuration, b: &Configuration) -> bool {
    let gpus = |c: &Configuration| c.key.gpus();
    a.samples_per_sec
        .total_cmp(&b.samples_per_sec)
        .reverse()
        .then(gpus(a).cmp(&gpus(b)))
        .then(a.key.cmp(&b.key))
        .is_lt()
}

/// Whether both placements cost the same for groups of `tp`: when each group fills a whole
/// node and every node is alike (device kind, count and link), any two groups talk over the
/// network under either placement, so the two place replica 0 on alike nodes and every ring
/// on alike links. The search then solves one and ranks its twin with the same figures.
fn placements_coincide(cluster: &Cluster, tp: TensorParallelism) -> bool {
    let t = tp.degree.max(1) as usize;
    let nodes = cluster.nodes();
    let Some(first) = nodes.first() else {
        return false;
    };
    let alike = |n: &pipecut_cost::cluster::ClusterNode| {
        n.devices.len() == t
            && n.devices.iter().all(|d| d.name == first.devices[0].name)
            && n.intra_node_link.as_ref().map(|l| &l.name)
                == first.intra_node_link.as_ref().map(|l| &l.name)
    };
    nodes.iter().all(alike)
}

/// `config` with the other placement, when the two coincide ([`placements_coincide`]).
fn placement_twin(cluster: &Cluster, config: &Configuration) -> Option<Configuration> {
    let key = config.key;
    let twins = key.stages > 1
        && key.data_parallel > 1
        && placements_coincide(cluster, key.tensor_parallel);
    twins.then(|| Configuration {
        key: ConfigurationKey {
            placement: Placement::ReplicasInsideNodes,
            ..key
        },
        ..config.clone()
    })
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
                .find(|&&b| b == 0 || !request.global_batch.is_multiple_of(b))
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
            .filter(|&b| request.global_batch.is_multiple_of(b))
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

fn settings(
    mode: Mode,
    request: &SearchRequest,
    schedule: Schedule,
    microbatches: u64,
) -> CostSettings {
    CostSettings {
        mode,
        schedule,
        microbatches: microbatches.min(u32::MAX as u64) as u32,
        memory_headroom: request.memory_headroom,
        unknown_ops: request.unknown_ops,
    }
}

/// Binds the batch dim to `b`, infers shapes, finds what tensor parallelism splits, and
/// measures the pruning bounds of every tensor-parallel layout tried.
fn type_graph(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    b: u64,
) -> Result<Typed, Error> {
    let mut typed = graph.clone();
    let bindings = request.bindings.clone().bind(&request.batch_dim, b);
    ShapeInference::new(bindings).run(&mut typed)?;
    if let Some(dtype) = request.dtype_override {
        typed.override_float_dtype(dtype);
    }
    let blocks = TensorParallelBlocks::find(&typed);
    let layouts = tensor_layouts(request, cluster, &blocks)?;
    let mut bounds: BTreeMap<TensorParallelism, Bounds> = BTreeMap::new();
    let mut kinds: Vec<&str> = Vec::new();
    let mut joined = BTreeMap::new();
    for (id, spec) in cluster.devices() {
        if kinds.contains(&spec.name.as_str()) {
            continue;
        }
        kinds.push(&spec.name);
        let whole = PartitionProblem::new(
            &typed,
            cluster,
            &[id],
            settings(request.mode, request, Schedule::OneFOneB, 1),
        )?;
        for layout in layouts.iter().filter(|l| !l.is_none()) {
            if let std::collections::btree_map::Entry::Vacant(slot) = joined.entry(layout.degree) {
                slot.insert(CutConstraints::tensor_parallel(layout.degree).groups(&typed, &whole)?);
            }
        }
        // Each recomputation mode's whole model, for its compute.
        let recomputes: Vec<(Recompute, PartitionProblem)> = match request.mode {
            Mode::Inference => vec![(Recompute::None, whole.clone())],
            Mode::Training { .. } => request
                .recompute
                .iter()
                .map(|&r| {
                    let mode = request.mode.with_memory_techniques(r, ZeroSharding::NONE);
                    let settings = settings(mode, request, Schedule::OneFOneB, 1);
                    Ok((r, PartitionProblem::new(&typed, cluster, &[id], settings)?))
                })
                .collect::<Result<_, Error>>()?,
        };
        for &layout in &layouts {
            let measured = Bounds::measure(
                &typed,
                &blocks,
                cluster,
                (&whole, recomputes.as_slice()),
                layout,
            );
            match bounds.entry(layout) {
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(measured);
                }
                // Another device kind: the fastest kind's time, the first kind's memory.
                std::collections::btree_map::Entry::Occupied(mut entry) => {
                    for (recompute, secs) in measured.total_secs {
                        let least = entry.get_mut().total_secs.entry(recompute).or_insert(secs);
                        *least = least.min(secs);
                    }
                }
            }
        }
    }
    Ok(Typed {
        graph: typed,
        blocks,
        bounds,
        joined,
    })
}

impl Bounds {
    /// The bounds of `layout` on one device kind: `whole` is the model on one device of it,
    /// `recomputes` the same under each recomputation mode searched (for their compute).
    fn measure(
        typed: &Graph,
        blocks: &TensorParallelBlocks,
        cluster: &Cluster,
        (whole, recomputes): (&PartitionProblem, &[(Recompute, PartitionProblem)]),
        layout: TensorParallelism,
    ) -> Bounds {
        // The fastest kind (the smallest whole-model time) on the fastest group link.
        let mut total_secs: BTreeMap<Recompute, f64> = BTreeMap::new();
        for (recompute, problem) in recomputes {
            for first in group_firsts(cluster) {
                let mut problem = problem.clone();
                blocks.shard_on(typed, &mut problem, cluster, layout, first);
                let secs = total_secs.entry(*recompute).or_insert(f64::INFINITY);
                *secs = secs.min(problem.lower_bound_secs());
            }
        }
        let mut split = whole.clone();
        if let Some(&first) = group_firsts(cluster).last() {
            blocks.shard_on(typed, &mut split, cluster, layout, first);
        }
        let footprint_bytes = split.params().iter().map(|p| p.footprint_bytes).sum();
        let weight_bytes = split
            .params()
            .iter()
            .filter_map(|p| {
                let tensor = typed.tensor(typed.tensor_id(split.name(p.name))?);
                Some(tensor.param()?.bytes.div_ceil(u64::from(p.shards)))
            })
            .sum();
        let activation_bytes = (0..split.node_count())
            .map(|p| split.activation_bytes(p))
            .sum();
        let position: BTreeMap<_, usize> = split
            .order()
            .iter()
            .enumerate()
            .map(|(p, &id)| (id, p))
            .collect();
        let score_activation_bytes = super::tensor_parallel::attention_score_nodes(typed)
            .iter()
            .filter_map(|id| position.get(id))
            .map(|&p| split.activation_bytes(p))
            .sum();
        let largest_param = split
            .params()
            .iter()
            .max_by_key(|p| p.footprint_bytes)
            .and_then(|p| {
                let tensor = typed.tensor(typed.tensor_id(split.name(p.name))?);
                let weight = tensor.param()?.bytes.div_ceil(u64::from(p.shards.max(1)));
                Some((weight, p.footprint_bytes))
            })
            .unwrap_or((0, 0));
        Bounds {
            total_secs,
            footprint_bytes,
            weight_bytes,
            activation_bytes,
            score_activation_bytes,
            largest_param,
        }
    }
}

/// The first device of each node whose intra-node link no earlier node has: where the
/// tensor-parallel groups of every link kind can start.
fn group_firsts(cluster: &Cluster) -> Vec<DeviceId> {
    let mut seen: Vec<Option<&str>> = Vec::new();
    let mut first = 0u32;
    let mut firsts = Vec::new();
    for node in cluster.nodes() {
        let link = node.intra_node_link.as_ref().map(|l| l.name.as_str());
        if !seen.contains(&link) {
            seen.push(link);
            firsts.push(DeviceId(first));
        }
        first += node.devices.len() as u32;
    }
    firsts
}

/// The tensor-parallel layouts to try: the requested degrees, or 1 and every degree that
/// divides each node's GPU count and splits at least one block of the model.
fn tensor_layouts(
    request: &SearchRequest,
    cluster: &Cluster,
    blocks: &TensorParallelBlocks,
) -> Result<Vec<TensorParallelism>, Error> {
    let node_sizes: Vec<u32> = cluster
        .nodes()
        .iter()
        .map(|n| n.devices.len() as u32)
        .collect();
    let smallest = node_sizes.iter().copied().min().unwrap_or(1);
    let fits_nodes = |t: u32| node_sizes.iter().all(|&n| n % t == 0);
    let degrees: Vec<u32> = match &request.tensor_parallel {
        Some(degrees) => {
            if let Some(&t) = degrees.iter().find(|&&t| t == 0 || !fits_nodes(t)) {
                return Err(Error::PartitionConfig(format!(
                    "a tensor-parallel group of {t} GPUs must sit inside one node: the degree \
                     must divide every node's GPU count ({node_sizes:?})"
                )));
            }
            degrees.clone()
        }
        None => std::iter::once(1)
            .chain(
                blocks
                    .degrees(u64::from(smallest))
                    .into_iter()
                    .map(|t| t as u32)
                    .filter(|&t| fits_nodes(t)),
            )
            .collect(),
    };
    let mut layouts: Vec<TensorParallelism> = degrees
        .into_iter()
        .map(|degree| TensorParallelism {
            degree,
            sequence_parallel: request.sequence_parallel && degree > 1,
        })
        .collect();
    layouts.sort();
    layouts.dedup();
    Ok(layouts)
}

/// Costs one configuration on `graph` (typed with its micro-batch size): the DP's partition of
/// replica 0, the simulated step, and the all-reduces. `None` when no partition fits memory.
pub fn evaluate(
    graph: &Graph,
    cluster: &Cluster,
    request: &SearchRequest,
    key: ConfigurationKey,
) -> Result<Option<Configuration>, Error> {
    let blocks = match key.tensor_parallel.is_none() {
        true => TensorParallelBlocks::default(),
        false => TensorParallelBlocks::find(graph),
    };
    let joined = match key.tensor_parallel.is_none() {
        true => None,
        false => {
            let problem = PartitionProblem::new(
                graph,
                cluster,
                &[DeviceId(0)],
                settings(request.mode, request, Schedule::OneFOneB, 1),
            )?;
            CutConstraints::tensor_parallel(key.tensor_parallel.degree).groups(graph, &problem)?
        }
    };
    let evaluated = evaluate_with(
        graph,
        (&blocks, joined.as_ref()),
        cluster,
        request,
        (key, None),
        &mut SolvedPipelines::default(),
    )?;
    Ok(match evaluated {
        Evaluated::Costed(config) => Some(config),
        Evaluated::DoesNotFit | Evaluated::CannotBeat => None,
    })
}

/// What costing one configuration found.
enum Evaluated {
    /// Its DP partition, simulated.
    Costed(Configuration),
    /// No partition fits memory.
    DoesNotFit,
    /// No partition's slowest stage is fast enough for its m micro-batches to beat the
    /// throughput it was asked to beat (the pipeline step is at least m times the slowest
    /// stage's time: that stage runs each micro-batch's forward and backward in turn).
    CannotBeat,
}

/// DP results by everything the DP sees: the micro-batch size, and per stage its device kind,
/// memory, in-flight count and incoming link. Different D, m or placements often give the same
/// pipeline (replica 0 on devices 0..K for every D, the same in-flight counts for every m ≥ K
/// under 1F1B), which is then solved once.
/// A stage as the DP sees it: device kind, capacity, in-flight count, incoming link (bits of the
/// bandwidth and latency).
type StageSignature = (String, u64, Vec<pipecut_cost::memory::Held>, u64, u64);

/// The DP's assignment and its figures.
type SolvedPipeline = (Vec<StageId>, Evaluation);

/// What of a configuration's memory techniques changes its pipeline's costs: recomputation,
/// and a ZeRO stage with the group it shards over (none without replicas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Technique(Recompute, u8, usize);

impl Technique {
    fn of(key: &ConfigurationKey) -> Technique {
        match key.zero_stage {
            _ if key.data_parallel <= 1 => Technique(key.recompute, 0, 0),
            0 => Technique(key.recompute, 0, 0),
            stage => Technique(key.recompute, stage, key.data_parallel),
        }
    }
}

#[derive(Default)]
struct SolvedPipelines {
    solved: BTreeMap<PipelineEntry, Option<SolvedPipeline>>,
}

/// What makes two configurations' pipelines the same problem: micro-batch size, technique,
/// tensor-parallel layout and every stage as the DP sees it.
type PipelineEntry = (u64, Technique, TensorParallelism, Vec<StageSignature>);

impl SolvedPipelines {
    fn signature(problem: &PartitionProblem) -> Vec<StageSignature> {
        problem
            .stages()
            .iter()
            .map(|s| {
                let (bandwidth, latency) = s.link_in.unwrap_or((0.0, 0.0));
                (
                    s.device_name.clone(),
                    s.capacity_bytes,
                    // The moments it holds the most at, not the in-flight count alone: 1F1B
                    // and ZB-H1 hold as many micro-batches before B, but ZB-H1 more after it.
                    s.held.clone(),
                    bandwidth.to_bits(),
                    latency.to_bits(),
                )
            })
            .collect()
    }
}

/// [`evaluate`] with what tensor parallelism splits in `graph` and the groups that keep each
/// split block on one stage already found.
fn evaluate_with(
    graph: &Graph,
    (blocks, joined): (&TensorParallelBlocks, Option<&JoinedGroups>),
    cluster: &Cluster,
    request: &SearchRequest,
    (key, to_beat): (ConfigurationKey, Option<f64>),
    cache: &mut SolvedPipelines,
) -> Result<Evaluated, Error> {
    let ConfigurationKey {
        stages: k,
        data_parallel: d,
        microbatches: m,
        schedule,
        ..
    } = key;
    if key.gpus() > cluster.device_count() {
        return Err(Error::PartitionConfig(format!(
            "{k} stages × {d} replicas × {} tensor-parallel GPUs need {} devices, the cluster has {}",
            key.tensor_degree(),
            key.gpus(),
            cluster.device_count()
        )));
    }
    let replicas = key.replicas();
    let problem = pipeline_problem(graph, blocks, cluster, request, key)?;
    // Beating `best` samples/s needs a step under global batch / best, so a slowest stage
    // under that over m: when no partition has one, the DP need not run.
    let bound = to_beat.map(|best| request.global_batch as f64 / best / m as f64);
    let solved = match cache.solved.entry(pipeline_entry(&problem, key)) {
        std::collections::btree_map::Entry::Occupied(known) => known.get().clone(),
        std::collections::btree_map::Entry::Vacant(slot) => {
            match solve_keeping_blocks(&problem, joined, bound) {
                dp::Within::Slower => return Ok(Evaluated::CannotBeat),
                dp::Within::DoesNotFit => slot.insert(None).clone(),
                dp::Within::Solved(solved) => slot.insert(Some(solved)).clone(),
            }
        }
    };
    let Some((stage_of, evaluation)) = solved.clone() else {
        return Ok(Evaluated::DoesNotFit);
    };
    let simulation = simulate(
        &super::stage_times(&problem, &evaluation),
        schedule.into(),
        m as usize,
    )?;
    let step = StepFigures::new(
        graph,
        cluster,
        (&problem, &stage_of),
        &replicas,
        &simulation,
        request.global_batch,
    );
    let (peak_memory_bytes, capacity_bytes) = fullest_device(&evaluation, replicas[0].len());
    Ok(Evaluated::Costed(Configuration {
        key,
        bottleneck_secs: evaluation.bottleneck_secs,
        pipeline_secs: step.pipeline_secs,
        allreduce_secs: step.allreduce_secs,
        step_secs: step.step_secs,
        samples_per_sec: step.samples_per_sec,
        bubble_fraction: step.bubble_fraction,
        peak_memory_bytes,
        capacity_bytes,
    }))
}

/// The partition problem of `key`'s first replica: its stages on their devices, each
/// tensor-parallel block costed split.
fn pipeline_problem(
    graph: &Graph,
    blocks: &TensorParallelBlocks,
    cluster: &Cluster,
    request: &SearchRequest,
    key: ConfigurationKey,
) -> Result<PartitionProblem, Error> {
    let replicas = key.replicas();
    let schedule = key.schedule;
    let mut problem = PartitionProblem::new(
        graph,
        cluster,
        &schedule.chunk_devices(&replicas[0]),
        settings(key.mode(request.mode), request, schedule, key.microbatches),
    )?;
    blocks.shard_on(
        graph,
        &mut problem,
        cluster,
        key.tensor_parallel,
        replicas[0][0],
    );
    Ok(problem)
}

/// The key under which [`SolvedPipelines`] keeps the partition of `problem`, made for `key`.
fn pipeline_entry(problem: &PartitionProblem, key: ConfigurationKey) -> PipelineEntry {
    (
        key.microbatch_size,
        Technique::of(&key),
        key.tensor_parallel,
        SolvedPipelines::signature(problem),
    )
}

/// The (peak, capacity) bytes of the pipeline device whose memory is fullest, of `devices`:
/// under interleaving a device holds its chunks together.
fn fullest_device(evaluation: &Evaluation, devices: usize) -> (u64, u64) {
    let devices = devices.max(1);
    (0..devices)
        .map(|d| {
            let chunks = evaluation.stages.iter().skip(d).step_by(devices);
            chunks.fold((0u64, 0u64), |(peak, capacity), stage| {
                (
                    peak.saturating_add(stage.peak_memory_bytes),
                    capacity.saturating_add(stage.capacity_bytes),
                )
            })
        })
        .max_by(|a, b| {
            (a.0 as f64 / a.1.max(1) as f64).total_cmp(&(b.0 as f64 / b.1.max(1) as f64))
        })
        .expect("at least one device")
}

/// The DP's partition of `problem` and its figures, each group of `joined` (the split blocks
/// of a tensor-parallel layout) on one stage: solved on the quotient whose nodes are the
/// groups, which evaluates any assignment as the model does, then expanded. With a `bound`,
/// only when some partition has every stage time at most it ([`dp::solve_within`]);
/// `DoesNotFit` also when there are fewer groups than stages.
fn solve_keeping_blocks(
    problem: &PartitionProblem,
    joined: Option<&JoinedGroups>,
    bound: Option<f64>,
) -> dp::Within<SolvedPipeline> {
    let solve = |problem: &PartitionProblem| match bound {
        Some(bound) => dp::solve_within(problem, bound),
        None => dp::solve(problem).map_or(dp::Within::DoesNotFit, dp::Within::Solved),
    };
    let stage_of = match joined {
        None => match solve(problem) {
            dp::Within::Solved(solution) => solution.stage_of,
            dp::Within::Slower => return dp::Within::Slower,
            dp::Within::DoesNotFit => return dp::Within::DoesNotFit,
        },
        Some(groups) if groups.len() < problem.stage_count() => return dp::Within::DoesNotFit,
        Some(groups) => {
            let Ok(grouped) = groups.quotient(problem) else {
                return dp::Within::DoesNotFit;
            };
            match solve(&grouped.problem) {
                dp::Within::Solved(solution) => grouped.expand(&solution.stage_of),
                dp::Within::Slower => return dp::Within::Slower,
                dp::Within::DoesNotFit => return dp::Within::DoesNotFit,
            }
        }
    };
    let evaluation = problem.evaluate(&stage_of);
    dp::Within::Solved((stage_of, evaluation))
}

/// A data-parallel step's figures: the pipeline's simulated step, then each stage's gradient
/// all-reduce over its replicas once that stage's last operation ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepFigures {
    /// Gradient all-reduce time of each stage over its replicas (zero in inference or for one
    /// replica).
    pub allreduce_secs: Vec<f64>,
    /// The simulated pipeline step without the all-reduces.
    pub pipeline_secs: f64,
    /// The latest of the pipeline step and each stage's last operation plus its all-reduce.
    pub step_secs: f64,
    /// `global_batch / step_secs`.
    pub samples_per_sec: f64,
    /// Idle share of the pipeline's devices during the pipeline step.
    pub bubble_fraction: f64,
}

impl StepFigures {
    /// The figures of replicas `replicas` (`[replica][stage]`) of the partition `stage_of` of
    /// `problem`, whose schedule `simulation` simulated (the problem's settings give the mode).
    pub(crate) fn new(
        graph: &Graph,
        cluster: &Cluster,
        (problem, stage_of): (&PartitionProblem, &[StageId]),
        replicas: &[Vec<DeviceId>],
        simulation: &crate::schedule::Simulation,
        global_batch: u64,
    ) -> StepFigures {
        // Per pipeline device: under interleaving a device's chunks share its all-reduce,
        // which starts when the device's last operation ends.
        let k = replicas
            .first()
            .map_or(problem.stage_count(), Vec::len)
            .max(1);
        let mut last_end = vec![0.0f64; k];
        for op in &simulation.ops {
            last_end[op.device] = last_end[op.device].max(op.end_secs);
        }
        let allreduce_secs: Vec<f64> = match problem.settings().mode {
            Mode::Training { zero, .. } if replicas.len() > 1 => (0..k)
                .map(|d| {
                    let ring: Vec<DeviceId> = replicas.iter().map(|r| r[d]).collect();
                    let bytes = (d..problem.stage_count())
                        .step_by(k)
                        .map(|s| gradient_bytes(graph, problem, stage_of, s))
                        .sum();
                    cluster.ring_all_reduce_secs(&ring, bytes) * zero.communication_factor()
                })
                .collect(),
            _ => vec![0.0; k],
        };
        let step_secs = last_end
            .iter()
            .zip(&allreduce_secs)
            .map(|(end, reduce)| end + reduce)
            .fold(simulation.step_secs, f64::max);
        StepFigures {
            allreduce_secs,
            pipeline_secs: simulation.step_secs,
            step_secs,
            samples_per_sec: global_batch as f64 / step_secs,
            bubble_fraction: simulation.bubble_fraction,
        }
    }
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
        .filter(|p| {
            p.uses
                .iter()
                .any(|&u| stage_of[u as usize].index() == stage)
        })
        .filter_map(|p| {
            let param = graph
                .tensor(graph.tensor_id(problem.name(p.name))?)
                .param()?;
            Some(param.bytes.div_ceil(u64::from(p.shards.max(1))))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_memory_configuration_rules_out_only_those_needing_no_less() {
        let failed = OutOfMemory {
            microbatch_size: 2,
            in_flight: 4,
            recompute: Recompute::Full,
            zero_stage: 2,
            data_parallel: 8,
        };
        let like = |f: fn(&mut OutOfMemory)| {
            let mut other = failed;
            f(&mut other);
            failed.rules_out(&other)
        };
        assert!(like(|_| {}));
        assert!(like(|o| o.microbatch_size = 4));
        assert!(like(|o| o.in_flight = 8));
        assert!(like(|o| o.recompute = Recompute::None));
        assert!(like(|o| o.zero_stage = 1));
        assert!(like(|o| o.data_parallel = 4));
        assert!(like(|o| {
            o.zero_stage = 0;
            o.data_parallel = 64;
        }));
        // Needing less: a smaller micro-batch or in-flight count, more sharding.
        assert!(!like(|o| o.microbatch_size = 1));
        assert!(!like(|o| o.in_flight = 2));
        assert!(!like(|o| o.zero_stage = 3));
        assert!(!like(|o| o.data_parallel = 16));
        let plain = OutOfMemory {
            recompute: Recompute::None,
            ..failed
        };
        assert!(!plain.rules_out(&failed), "recomputation saves memory");
    }

    #[test]
    fn the_prefix_bound_is_tight_for_its_geometric_stages_and_below_a_balanced_pipeline() {
        // K = 16, m = 96, T = 1: about 6.49, between the work bound 6 and a balanced 1F1B's
        // (m + K − 1)/K = 6.94.
        let bound = prefix_bound(1.0, 1.0, 16, 96.0);
        assert!((6.48..6.49).contains(&bound), "{bound}");
        // The stages it is built from, c_j = L/m · (1 − 1/m)^j scaled to sum to T, give every
        // stage's m·c_j + Σ_{s<j} c_s equal to the bound: it cannot be raised.
        let (k, m) = (5usize, 7.0);
        let bound = prefix_bound(1.0, 1.0, k, m);
        let stages: Vec<f64> = (0..k)
            .map(|j| bound / m * (1.0 - 1.0 / m).powi(j as i32))
            .collect();
        assert!((stages.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        for j in 0..k {
            let reach = m * stages[j] + stages[..j].iter().sum::<f64>();
            assert!((reach - bound).abs() < 1e-6, "{j}: {reach} vs {bound}");
        }
        // One stage: m·T; no micro-batches: nothing.
        assert!((prefix_bound(2.0, 1.0, 1, 8.0) - 16.0).abs() < 1e-6);
        assert_eq!(prefix_bound(1.0, 1.0, 4, 0.0), 0.0);
    }

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
