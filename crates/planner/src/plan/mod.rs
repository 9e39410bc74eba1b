//! Phase 5, plan: the versioned JSON document a partition becomes, and its validation.
//!
//! A plan records everything needed to reproduce and audit it: the model's sha256, the cluster
//! layout, the sha256 of every hardware profile used, the configuration, and per stage its
//! device, nodes, the tensors it receives and sends, its memory and its times; then the
//! bottleneck, the lower bound, the proof status and the baselines. The format is documented in
//! `docs/plan-schema.md` and `docs/plan.schema.json`.
//!
//! Plans are deterministic byte for byte: the same model, cluster and configuration give the
//! same file. The solver's wall-clock time is the one figure that varies between runs, so it is
//! written only when asked for ([`PlanOptions::record_solve_time`]).
//!
//! This phase decides nothing: [`Plan::from_solution`] transcribes a [`Solution`], and
//! [`Plan::check`] recomputes a plan's figures with the partition phase's own evaluation.

mod dot;
pub mod engines;
mod identity;
mod rederive;
mod selection;
mod shards;
mod stage_nodes;
mod values;

pub use dot::plan_dot;
pub use identity::ModelMatch;
pub use pipecut_ir::onnx::sha256_hex;
pub use selection::{MeasuredSelection, MovedNode, Runoff, SelectionCandidate};
pub use shards::{PlanRank, PlanStageShards, WeightSliceEntry, WholeBlock};
pub use stage_nodes::StageNodes;
pub use values::{PlanValue, ValueData};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::partition::engine::Engine;
use crate::partition::parallelism::{Placement, SearchLimit, SearchOutcome, StepFigures};
use crate::partition::tensor_parallel::TensorParallelism;
use crate::partition::{
    Baseline, CostSettings, CutConstraints, Evaluation, LowerBounds, OptimalityProof,
    PartitionProblem, Solution, SolveStatus, SolverKind, StageCount, StageId,
};
use crate::schedule::{simulate, Simulation, StageFiguresSecs, StageTimes};
use crate::Error;
use pipecut_cost::{
    Catalog, Cluster, ClusterLayout, DeviceId, Mode, Precision, Recompute, Schedule, UnknownOpCost,
};
use pipecut_ir::graph::Graph;
use pipecut_ir::onnx::Digests;

/// The plan format version this build writes. It reads every version up to this one (version 2
/// added the optional `parallelism` section; a version-1 plan is a version-2 plan without it;
/// version 3 names the model by its graph and weights digests, see [`identity`]; version 4 names
/// each baseline's peer release, the layers they cut and the `type:` regex; version 5 records
/// tensor parallelism; version 6 lists, under tensor parallelism, each stage's ranks with their
/// GPUs and weight slices, see [`shards`]; version 7 adds the interleaved and zero-bubble
/// schedules, an interleaved plan listing v·K stages whose stage c·K + d is on device d;
/// version 8 records the plans `--select-by-running` measured and its optional runoff, see
/// [`selection`], and keeps
/// tensor-parallel blocks whole through a cut constraint; version 9 records the sample values
/// of shape inputs the plan was made with, see [`values`], and what proves an "optimal"
/// status, `summary.proof`); version 10 records the memory model activations were counted by
/// (`config.mode.memory_model`, see [`pipecut_cost::MemoryModel`]) and refuses newer ones;
/// version 11 records the engine a cluster search planned for (`parallelism.engine`, see
/// [`Engine`]) and the limit that stopped an incomplete search (`parallelism.stopped_by`);
/// version 12 records, under the zero-bubble schedule, what each stage keeps from a
/// micro-batch's B to its W (`stages[].weight_input_bytes`), which its peak now charges.
pub const SCHEMA_VERSION: u32 = 12;

/// A pipeline plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Format version, [`SCHEMA_VERSION`] when written by this build.
    pub schema_version: u32,
    /// The program that wrote it, e.g. `pipecut 0.1.0`.
    pub generator: String,
    /// The model it cuts.
    pub model: ModelIdentity,
    /// The cluster it runs on.
    pub cluster: ClusterIdentity,
    /// sha256 of each hardware profile used (canonical JSON of the device or link profile).
    pub cost_model: BTreeMap<String, String>,
    /// The request.
    pub config: PlanConfig,
    /// The stages, in pipeline order.
    pub stages: Vec<PlanStage>,
    /// The result and its proof.
    pub summary: PlanSummary,
    /// Data parallelism around the pipeline, for plans made by `pipecut plan-cluster`: the
    /// replicas of the stages and where they sit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<PlanParallelism>,
}

/// How the cluster is used around the pipeline: D replicas of the K stages, each replica fed
/// `global_batch / D` samples per step in micro-batches of `dims[batch]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanParallelism {
    /// Samples per step over all replicas.
    pub global_batch: u64,
    /// Data-parallel replicas D.
    pub data_parallel: usize,
    /// Samples per micro-batch.
    pub microbatch_size: u64,
    /// Where the stages sit.
    pub placement: Placement,
    /// Device of every replica's stages, `[replica][stage]`; replica 0 is `stages[].device`.
    /// Under tensor parallelism, the first device of the stage's group.
    pub replicas: Vec<Vec<u32>>,
    /// Tensor parallelism: each stage on a group of `degree` consecutive devices from the one
    /// listed, its stage figures those of one GPU of the group. Absent: one GPU per stage.
    #[serde(default, skip_serializing_if = "TensorParallelism::is_none")]
    pub tensor_parallel: TensorParallelism,
    /// Under tensor parallelism, per stage: each rank's GPUs and the weight slices it holds
    /// (absent in plans before version 6, and without tensor parallelism).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<PlanStageShards>,
    /// Gradient all-reduce time of each stage over its replicas (zero in inference).
    pub allreduce_secs: Vec<f64>,
    /// The simulated pipeline step without the all-reduces.
    pub pipeline_secs: f64,
    /// The step: each stage's last operation plus its all-reduce, the latest of them.
    pub step_secs: f64,
    /// `global_batch / step_secs`.
    pub samples_per_sec: f64,
    /// Idle share of the pipeline's devices during the pipeline step.
    pub bubble_fraction: f64,
    /// The best configurations found, best first (this plan's first).
    pub alternatives: Vec<PlanAlternative>,
    /// Configurations in the search space.
    pub candidates: usize,
    /// Configurations solved; the others were bounded out or could not fit.
    pub solved: usize,
    /// The engine the search planned for, which runs the chosen configuration (absent:
    /// pipecut's own runtime; version 11).
    #[serde(default, skip_serializing_if = "Engine::is_pipecut")]
    pub engine: Engine,
    /// The limit that stopped the search before it proved its choice best over the space
    /// (absent: the search was complete, in plans of version 11 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<SearchLimit>,
}

fn is_zero_bytes(bytes: &u64) -> bool {
    *bytes == 0
}

fn is_zero(stage: &u8) -> bool {
    *stage == 0
}

/// One configuration the search ranked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanAlternative {
    /// Pipeline stages K.
    pub stages: usize,
    /// Data-parallel replicas D.
    pub data_parallel: usize,
    /// Samples per micro-batch.
    pub microbatch_size: u64,
    /// Micro-batches per step.
    pub microbatches: u64,
    /// Schedule.
    pub schedule: Schedule,
    /// Placement.
    pub placement: Placement,
    /// Activation recomputation.
    #[serde(default, skip_serializing_if = "Recompute::is_none")]
    pub recompute: Recompute,
    /// ZeRO stage over the replicas (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_stage: u8,
    /// Tensor parallelism (absent: none).
    #[serde(default, skip_serializing_if = "TensorParallelism::is_none")]
    pub tensor_parallel: TensorParallelism,
    /// Step time.
    pub step_secs: f64,
    /// Throughput.
    pub samples_per_sec: f64,
    /// Pipeline bubble.
    pub bubble_fraction: f64,
    /// The fullest stage's memory.
    pub peak_memory_bytes: u64,
}

/// Which model a plan is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelIdentity {
    /// File name of the model (without directory, so plans do not depend on where it lies).
    pub file_name: String,
    /// sha256 of the model file (the protobuf; external data files are not read). Recorded for
    /// people reading the plan; a version-3 plan is matched by the two digests below.
    pub sha256: String,
    /// sha256 of what the plan depends on: the graph without initializer bytes
    /// ([`pipecut_ir::onnx::graph_sha256`]). A model file with this graph digest takes the plan,
    /// whatever its weights (a fine-tuned copy of the same export). Absent in version-2 plans,
    /// which are matched by the whole file's sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_sha256: Option<String>,
    /// sha256 of the weights the plan was made with ([`pipecut_ir::onnx::weights_sha256`]); other
    /// weights are accepted and reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_sha256: Option<String>,
    /// Graph name.
    pub graph: String,
    /// Number of nodes.
    pub nodes: usize,
    /// Symbolic dims bound for costing (the micro-batch size is the batch dim's value).
    pub dims: BTreeMap<String, u64>,
    /// The sample values of graph inputs the plan was made with (`--value`), by input name:
    /// the plan holds for these values only. Absent: none (and in plans before version 9).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, PlanValue>,
}

/// The cluster a plan is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterIdentity {
    /// As the user gave it (`1x4xH100-SXM`, a device list, or a file name).
    pub description: String,
    /// The layout with every link named.
    pub layout: ClusterLayout,
}

/// The request that produced a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// `"auto"` or the number asked for.
    pub stages_requested: String,
    /// Micro-batches per step.
    pub microbatches: u32,
    /// Pipeline schedule.
    pub schedule: Schedule,
    /// Inference or training (with the training parameters).
    pub mode: Mode,
    /// Fraction of each device's memory kept free.
    pub memory_headroom: f64,
    /// Time budget for searching solvers.
    pub time_limit_secs: f64,
    /// The work budget that replaced the time limit (`--work-budget`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_budget: Option<u64>,
    /// How ops without a cost rule were costed.
    pub unknown_op_cost: UnknownOpCost,
    /// The precision every floating-point tensor was costed at (`--dtype`), when it overrode
    /// the model file's; absent: the file's own dtypes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype_override: Option<Precision>,
    /// Tensors no cut may cross (`--forbid-cut`, and a MatMul kept with its bias Add unless
    /// `--cut-anywhere`); the status and lower bound hold over the partitions that respect
    /// them. Absent in plans from before them: no constraint.
    #[serde(default = "CutConstraints::none")]
    pub cut_constraints: CutConstraints,
    /// Measured node times the stages were costed with (`--profile`), by device; absent: the
    /// roofline alone. `check` and `run` need the same files again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured_node_times: Vec<MeasuredTimesUse>,
    /// The regex the DeepSpeed `type:` baseline was given (`--baseline-layer-type`). Absent in
    /// plans from before version 4: the default.
    #[serde(default = "default_layer_type")]
    pub baseline_layer_type: String,
}

/// Measured node times a plan was costed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MeasuredTimesUse {
    /// The device whose stages used them.
    pub device: String,
    /// sha256 of the node-times file.
    pub sha256: String,
}

/// The measured node times `graph` carries, as a plan records them.
fn measured_uses(graph: &Graph) -> Vec<MeasuredTimesUse> {
    graph
        .measured_sources()
        .map(|(device, sha256)| MeasuredTimesUse {
            device: device.to_string(),
            sha256: sha256.to_string(),
        })
        .collect()
}

fn default_layer_type() -> String {
    crate::partition::baselines::DEFAULT_LAYER_TYPE.to_string()
}

/// A device of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanDevice {
    /// Index in the cluster's node-major device order.
    pub id: u32,
    /// Profile name.
    pub name: String,
}

/// A tensor crossing into a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ReceivedTensor {
    /// Tensor name.
    pub tensor: String,
    /// The stage it arrives from (always the previous one: stages relay).
    pub from_stage: u32,
    /// The stage whose node produced it.
    pub producer_stage: u32,
    /// Bytes per micro-batch.
    pub bytes: u64,
    /// Latency plus bytes over the link's bandwidth.
    pub transfer_secs: f64,
}

/// A tensor leaving a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SentTensor {
    /// Tensor name.
    pub tensor: String,
    /// The stage it goes to (always the next one).
    pub to_stage: u32,
    /// Bytes per micro-batch.
    pub bytes: u64,
}

/// One stage of a plan. Times are per micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanStage {
    /// Position in the pipeline.
    pub stage: u32,
    /// Its device.
    pub device: PlanDevice,
    /// Number of nodes.
    pub node_count: usize,
    /// First node in topological order.
    pub first_node: String,
    /// Last node in topological order.
    pub last_node: String,
    /// Every node, in topological order.
    pub nodes: StageNodes,
    /// Tensors received from the previous stage.
    pub received: Vec<ReceivedTensor>,
    /// Tensors sent to the next stage.
    pub sent: Vec<SentTensor>,
    /// Parameters held (with gradients and optimizer state in training).
    pub param_bytes: u64,
    /// Activations its nodes make per micro-batch.
    pub activation_bytes: u64,
    /// Under the zero-bubble schedule, what its weight gradients read per micro-batch (the
    /// weight-reading nodes' other inputs and output gradients), kept from a micro-batch's
    /// input-gradient pass B to its weight-gradient pass W; absent under other schedules.
    #[serde(default, skip_serializing_if = "is_zero_bytes")]
    pub weight_input_bytes: u64,
    /// Bytes received per micro-batch.
    pub received_bytes: u64,
    /// Micro-batches in flight at the stage's peak under the schedule (under zero-bubble,
    /// those whose B is pending: K − d on stage d, as under 1F1B).
    pub in_flight_microbatches: u64,
    /// `params + in_flight · (activations + received)` (one micro-batch's activations under
    /// full recomputation); under zero-bubble, stage d of K also holds d micro-batches past B
    /// (their received tensors and weight inputs), or, just after a B, K − d − 1 before and
    /// d + 1 past: the larger (docs/cost-model.md).
    pub peak_memory_bytes: u64,
    /// Memory the stage may use (device memory less headroom).
    pub capacity_bytes: u64,
    /// Device memory.
    pub device_memory_bytes: u64,
    /// Compute time (forward, plus backward in training).
    pub compute_secs: f64,
    /// Time receiving tensors.
    pub receive_secs: f64,
    /// Time receiving gradients (training).
    pub gradient_receive_secs: f64,
    /// `compute + receive + gradient receive`.
    pub stage_secs: f64,
}

/// A baseline's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanBaseline {
    /// Which method.
    pub method: Baseline,
    /// The release and method it reproduces, e.g. `deepspeed 0.19 parameters`. Absent in plans
    /// from before version 4.
    #[serde(default)]
    pub peer: String,
    /// Its bottleneck, when it could make the stages.
    pub bottleneck_secs: Option<f64>,
    /// Whether every stage of it fits memory.
    pub fits: Option<bool>,
    /// Its bottleneck divided by the plan's: how much faster the plan is.
    pub plan_speedup: Option<f64>,
    /// Why it could not make the stages.
    pub error: Option<String>,
}

/// A stage count tried by `--stages auto`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanCandidate {
    /// Stages.
    pub stages: usize,
    /// Its bottleneck, when it fits.
    pub bottleneck_secs: Option<f64>,
    /// Simulated step time for all micro-batches.
    pub step_secs: Option<f64>,
    /// Idle fraction of the step.
    pub bubble_fraction: Option<f64>,
}

/// The result and its proof.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanSummary {
    /// The slowest stage's time per micro-batch.
    pub bottleneck_secs: f64,
    /// No convex partition on these devices has a smaller bottleneck.
    pub lower_bound_secs: f64,
    /// `(bottleneck − lower bound) / bottleneck`.
    pub gap: f64,
    /// Proof status.
    pub status: SolveStatus,
    /// The solver that found it.
    pub solver: SolverKind,
    /// Bytes crossing all boundaries per micro-batch.
    pub cut_bytes: u64,
    /// Steady-state throughput, micro-batches per second (1 / bottleneck).
    pub microbatches_per_sec: f64,
    /// The peers' methods on the same costs.
    pub baselines: Vec<PlanBaseline>,
    /// The layers the layer-based peers cut and where they came from, e.g. `14 layers: the 12
    /// blocks of /transformer/h, one layer before and one after them`. Absent in plans from
    /// before version 4.
    #[serde(default)]
    pub baseline_layers: String,
    /// With `--stages auto`, every count tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_count_candidates: Vec<PlanCandidate>,
    /// Each lower bound the solve proved (average work, granularity, LP relaxation, branch and
    /// bound), so that the plan says which proof gives `lower_bound_secs`. Absent in plans from
    /// before it was recorded and in hand-edited ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<LowerBounds>,
    /// What proves an optimal status, which `check` proves again (absent with any other status,
    /// and in plans from before version 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<OptimalityProof>,
    /// Solver wall-clock time, only when asked for (it varies between runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solve_secs: Option<f64>,
    /// With `--select-by-running`: the plans run on this machine and which one this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_selection: Option<MeasuredSelection>,
}

/// Choices about what a plan records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Write the solver's wall-clock time (makes the plan differ between runs).
    pub record_solve_time: bool,
}

/// What [`Plan::check`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// Stages.
    pub stages: usize,
    /// Nodes assigned.
    pub nodes: usize,
    /// The recomputed bottleneck.
    pub bottleneck_secs: f64,
    /// Said of a claim check could neither prove again nor refute within its limit (an optimal
    /// status whose search did not finish again and found no faster plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// sha256 of every device and link profile the cluster uses, by name.
fn profile_hashes(cluster: &Cluster) -> BTreeMap<String, String> {
    let mut hashes = BTreeMap::new();
    for node in cluster.nodes() {
        for device in &node.devices {
            // A cluster has few kinds of device but may have thousands of devices: hash each
            // kind once.
            let key = format!("device:{}", device.name);
            hashes.entry(key).or_insert_with(|| {
                sha256_hex(&serde_json::to_vec(device).expect("profiles serialize"))
            });
        }
        if let Some(link) = &node.intra_node_link {
            let json = serde_json::to_vec(link).expect("profiles serialize");
            hashes.insert(format!("link:{}", link.name), sha256_hex(&json));
        }
    }
    if let Some(link) = cluster.inter_node_link() {
        let json = serde_json::to_vec(link).expect("profiles serialize");
        hashes.insert(format!("link:{}", link.name), sha256_hex(&json));
    }
    hashes
}

fn stages_requested(stages: StageCount) -> String {
    match stages {
        StageCount::Auto => "auto".into(),
        StageCount::Fixed(k) => k.to_string(),
    }
}

/// The replicas must be copies of the stages: replica 0 on the stages' devices, every replica on
/// devices of the same kinds, no device used twice, the global batch split evenly.
/// Under interleaving the replicas list the K pipeline devices, the devices of the first K of
/// the v·K stages.
fn check_parallelism(
    parallelism: &PlanParallelism,
    stages: &[PlanStage],
    cluster: &Cluster,
    (mode, schedule): (Mode, Schedule),
) -> Result<(), Error> {
    let bad = |detail: String| Err(Error::InvalidPlan(detail));
    let stages = &stages[..stages.len() / schedule.chunks().max(1)];
    let p = parallelism;
    if let Mode::Training { zero, .. } = mode {
        if zero.stage > 3 {
            return bad(format!("ZeRO has stages 0 to 3, not {}", zero.stage));
        }
        if zero.stage > 0 && zero.group as usize != p.data_parallel {
            return bad(format!(
                "the mode shards ZeRO state over {} replicas, the plan has {}",
                zero.group, p.data_parallel
            ));
        }
    }
    if p.replicas.len() != p.data_parallel || p.data_parallel == 0 {
        return bad(format!(
            "parallelism lists {} replicas for a data-parallel degree of {}",
            p.replicas.len(),
            p.data_parallel
        ));
    }
    // Both numbers come from the plan file: a product that overflows is refused like zero.
    let per_replica = (p.data_parallel as u64)
        .checked_mul(p.microbatch_size)
        .unwrap_or(0);
    if per_replica == 0 || !p.global_batch.is_multiple_of(per_replica) {
        return bad(format!(
            "a global batch of {} does not split into {} replicas of micro-batches of {}",
            p.global_batch, p.data_parallel, p.microbatch_size
        ));
    }
    let mut used = std::collections::BTreeSet::new();
    for (r, replica) in p.replicas.iter().enumerate() {
        if replica.len() != stages.len() {
            return bad(format!(
                "replica {r} has {} stages, the plan {}",
                replica.len(),
                stages.len()
            ));
        }
        for (s, (&device, stage)) in replica.iter().zip(stages).enumerate() {
            if device as usize >= cluster.device_count() {
                return bad(format!(
                    "replica {r} puts stage {s} on device {device}, the cluster has {}",
                    cluster.device_count()
                ));
            }
            if r == 0 && device != stage.device.id {
                return bad(format!(
                    "replica 0 puts stage {s} on device {device}, the stage is on {}",
                    stage.device.id
                ));
            }
            let kind = &cluster.device(DeviceId(device)).name;
            if *kind != stage.device.name {
                return bad(format!(
                    "replica {r} puts stage {s} on a {kind}, the stage was planned for a {}",
                    stage.device.name
                ));
            }
            let group = p.tensor_parallel.degree.max(1);
            let last = DeviceId(device.saturating_add(group - 1));
            if cluster.node_of(last) != cluster.node_of(DeviceId(device)) {
                return bad(format!(
                    "replica {r} puts stage {s} on the {group} devices from {device}, which are not \
                     inside one node of the cluster ({} devices; a tensor-parallel group sits in one node)",
                    cluster.device_count()
                ));
            }
            for member in device..device + group {
                if !used.insert(member) {
                    return bad(format!("device {member} is used by two replicas or stages"));
                }
            }
        }
    }
    if p.allreduce_secs.len() != stages.len() {
        return bad(format!(
            "parallelism has {} all-reduce times for {} stages",
            p.allreduce_secs.len(),
            stages.len()
        ));
    }
    check_engine(p, stages.len(), (mode, schedule))
}

/// The engine the plan names must run its configuration as planned.
fn check_engine(
    p: &PlanParallelism,
    stages: usize,
    (mode, schedule): (Mode, Schedule),
) -> Result<(), Error> {
    let (recompute, zero_stage) = match mode {
        Mode::Training {
            recompute, zero, ..
        } => (recompute, zero.stage),
        Mode::Inference => (Recompute::None, 0),
    };
    let key = crate::partition::parallelism::ConfigurationKey {
        stages,
        data_parallel: p.data_parallel,
        microbatch_size: p.microbatch_size,
        microbatches: p.global_batch / (p.data_parallel as u64 * p.microbatch_size).max(1),
        schedule,
        placement: p.placement,
        recompute,
        zero_stage,
        tensor_parallel: p.tensor_parallel,
    };
    match p
        .engine
        .refuses(&key, matches!(mode, Mode::Training { .. }))
    {
        Some(reason) => Err(Error::InvalidPlan(format!(
            "parallelism.engine is {}, which cannot run this configuration as planned: it {reason}",
            p.engine
        ))),
        None => Ok(()),
    }
}

/// Inputs to [`Plan::from_solution`] that the solution does not carry.
#[derive(Debug, Clone, Copy)]
pub struct PlanContext<'a> {
    /// The model file's digests (see [`pipecut_ir::onnx::Model::digests`]).
    pub model: Digests<'a>,
    /// The model file's name.
    pub model_file_name: &'a str,
    /// The graph that was partitioned.
    pub graph: &'a Graph,
    /// The dims bound for costing.
    pub dims: &'a BTreeMap<String, u64>,
    /// The cluster.
    pub cluster: &'a Cluster,
    /// The stage count asked for.
    pub stages: StageCount,
    /// The time limit given to the solvers.
    pub time_limit_secs: f64,
    /// The precision override the graph was costed with (`--dtype`), if any.
    pub dtype_override: Option<Precision>,
}

impl Plan {
    /// Transcribes a solution.
    pub fn from_solution(solution: &Solution, context: PlanContext, options: PlanOptions) -> Plan {
        let problem = &solution.problem;
        let eval = &solution.evaluation;
        let settings = problem.settings();
        let stages = rederive::transcribe_stages(problem, &solution.stage_of, eval);
        let bottleneck = eval.bottleneck_secs;
        let baselines = rederive::plan_baselines(&solution.baselines, bottleneck);
        Plan {
            schema_version: SCHEMA_VERSION,
            generator: format!("pipecut {}", env!("CARGO_PKG_VERSION")),
            model: ModelIdentity {
                file_name: context.model_file_name.to_string(),
                sha256: context.model.sha256.to_string(),
                graph_sha256: Some(context.model.graph_sha256.to_string()),
                weights_sha256: Some(context.model.weights_sha256.to_string()),
                graph: context.graph.name().to_string(),
                nodes: context.graph.node_count(),
                dims: context.dims.clone(),
                values: BTreeMap::new(),
            },
            cluster: ClusterIdentity {
                description: context.cluster.description().to_string(),
                layout: context.cluster.layout(),
            },
            cost_model: profile_hashes(context.cluster),
            config: PlanConfig {
                stages_requested: stages_requested(context.stages),
                microbatches: settings.microbatches,
                schedule: settings.schedule,
                mode: settings.mode,
                memory_headroom: settings.memory_headroom,
                time_limit_secs: context.time_limit_secs,
                work_budget: solution.work_budget,
                unknown_op_cost: settings.unknown_ops,
                dtype_override: context.dtype_override,
                cut_constraints: solution.cut_constraints.clone(),
                measured_node_times: measured_uses(context.graph),
                baseline_layer_type: solution.baseline_layer_type.clone(),
            },
            stages,
            summary: PlanSummary {
                bottleneck_secs: bottleneck,
                lower_bound_secs: solution.lower_bound_secs,
                bounds: Some(solution.bounds),
                // A rival chosen by running (select.rs) is not the optimum its proof was about.
                proof: solution
                    .proof
                    .filter(|_| solution.status == SolveStatus::Optimal),
                gap: solution.gap(),
                status: solution.status,
                solver: solution.solver,
                cut_bytes: eval.cut_bytes,
                microbatches_per_sec: if bottleneck > 0.0 {
                    1.0 / bottleneck
                } else {
                    0.0
                },
                baselines,
                baseline_layers: solution.baseline_layers.clone(),
                stage_count_candidates: solution
                    .candidates
                    .iter()
                    .map(|c| PlanCandidate {
                        stages: c.stages,
                        bottleneck_secs: c.bottleneck_secs,
                        step_secs: c.step_secs,
                        bubble_fraction: c.bubble_fraction,
                    })
                    .collect(),
                solve_secs: options.record_solve_time.then_some(solution.solve_secs),
                measured_selection: None,
            },
            parallelism: None,
        }
    }

    /// Records the sample values of shape inputs (`--value`) the partitioned graph was typed
    /// with: the plan holds for them only, and `check`, `export` and `run` type with them.
    pub fn with_values(mut self, values: BTreeMap<String, PlanValue>) -> Plan {
        self.model.values = values;
        self
    }

    /// Adds the data parallelism a cluster search chose; `self` must be the plan of its replica
    /// 0 (the search's best configuration, solved on `outcome.replicas[0]`).
    pub fn with_parallelism(
        mut self,
        outcome: &SearchOutcome,
        global_batch: u64,
        engine: Engine,
    ) -> Plan {
        let best = &outcome.best;
        self.parallelism = Some(PlanParallelism {
            global_batch,
            data_parallel: best.key.data_parallel,
            microbatch_size: best.key.microbatch_size,
            placement: best.key.placement,
            tensor_parallel: best.key.tensor_parallel,
            shards: Vec::new(),
            replicas: outcome
                .replicas
                .iter()
                .map(|r| r.iter().map(|d| d.0).collect())
                .collect(),
            allreduce_secs: best.allreduce_secs.clone(),
            pipeline_secs: best.pipeline_secs,
            step_secs: best.step_secs,
            samples_per_sec: best.samples_per_sec,
            bubble_fraction: best.bubble_fraction,
            alternatives: outcome
                .ranked
                .iter()
                .map(|c| PlanAlternative {
                    stages: c.key.stages,
                    data_parallel: c.key.data_parallel,
                    microbatch_size: c.key.microbatch_size,
                    microbatches: c.key.microbatches,
                    schedule: c.key.schedule,
                    placement: c.key.placement,
                    recompute: c.key.recompute,
                    zero_stage: c.key.zero_stage,
                    tensor_parallel: c.key.tensor_parallel,
                    step_secs: c.step_secs,
                    samples_per_sec: c.samples_per_sec,
                    bubble_fraction: c.bubble_fraction,
                    peak_memory_bytes: c.peak_memory_bytes,
                })
                .collect(),
            candidates: outcome.candidates,
            solved: outcome.solved,
            engine,
            stopped_by: outcome.stopped_by,
        });
        self
    }

    /// Lists, under tensor parallelism, each stage's ranks with their GPUs and weight slices,
    /// derived from `graph` (typed with the plan's dims).
    ///
    /// # Errors
    /// [`Error::InvalidPlan`] when a stage names a node the graph lacks.
    pub fn with_tensor_parallel_shards(mut self, graph: &Graph) -> Result<Plan, Error> {
        let stages: Vec<Vec<String>> = self.stages.iter().map(|s| s.nodes.to_vec()).collect();
        if let Some(p) = self.parallelism.as_mut() {
            p.shards = match p.tensor_parallel.is_none() {
                true => Vec::new(),
                false => shards::tensor_parallel_shards(
                    graph,
                    &stages,
                    &p.replicas,
                    p.tensor_parallel.degree,
                )?,
            };
        }
        Ok(self)
    }

    /// The plan as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("plans serialize");
        text.push('\n');
        text
    }

    /// Refuses a plan with a figure that is not a finite number: JSON would write it as `null`,
    /// which `check` then refuses. Called before any plan is written or returned, so that an
    /// input the loaders let through yields an error, never such a plan.
    pub fn ensure_finite(&self) -> Result<(), Error> {
        let summary = &self.summary;
        let mut figures: Vec<(String, f64)> = vec![
            ("summary.bottleneck_secs".into(), summary.bottleneck_secs),
            ("summary.lower_bound_secs".into(), summary.lower_bound_secs),
            ("summary.gap".into(), summary.gap),
            (
                "summary.microbatches_per_sec".into(),
                summary.microbatches_per_sec,
            ),
        ];
        for stage in &self.stages {
            let at = |field: &str| format!("stages[{}].{field}", stage.stage);
            figures.extend([
                (at("compute_secs"), stage.compute_secs),
                (at("receive_secs"), stage.receive_secs),
                (at("gradient_receive_secs"), stage.gradient_receive_secs),
                (at("stage_secs"), stage.stage_secs),
            ]);
            for received in &stage.received {
                figures.push((at("received.transfer_secs"), received.transfer_secs));
            }
        }
        if let Some(p) = &self.parallelism {
            figures.extend([
                ("parallelism.pipeline_secs".into(), p.pipeline_secs),
                ("parallelism.step_secs".into(), p.step_secs),
                ("parallelism.samples_per_sec".into(), p.samples_per_sec),
                ("parallelism.bubble_fraction".into(), p.bubble_fraction),
            ]);
            for (s, secs) in p.allreduce_secs.iter().enumerate() {
                figures.push((format!("parallelism.allreduce_secs[{s}]"), *secs));
            }
        }
        match figures.into_iter().find(|(_, value)| !value.is_finite()) {
            Some((field, value)) => Err(Error::InvalidPlan(format!(
                "the plan's {field} came out as {value}: refusing to write it (are the node times or device profiles in the right units?)"
            ))),
            None => Ok(()),
        }
    }

    /// [`Self::to_json`]'s bytes, written to `out` as they are made: a million-node plan is
    /// 46 MB, which then never exists whole in memory.
    pub fn write_json(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        // serde_json writes a few bytes at a time: into a buffer of a known type, not through
        // `dyn Write` each time (six times slower on a million node names).
        use std::io::Write;
        let mut buffered = std::io::BufWriter::with_capacity(1 << 16, out);
        serde_json::to_writer_pretty(&mut buffered, self)?;
        buffered.write_all(b"\n")?;
        buffered.flush()
    }

    /// The JSON Schema (draft 2020-12) of the plan document, generated from these types so that
    /// it cannot drift from what [`Plan::to_json`] writes; `docs/plan.schema.json` holds a copy.
    /// Behind the feature `schema`, which the command turns on: an embedder that only plans
    /// compiles no schema generator.
    #[cfg(feature = "schema")]
    pub fn json_schema() -> String {
        let schema = schemars::schema_for!(Plan);
        let mut text = serde_json::to_string_pretty(&schema).expect("schemas serialize");
        text.push('\n');
        text
    }

    /// Parses a plan, refusing versions this build does not know.
    pub fn from_json(text: &str) -> Result<Plan, Error> {
        // Read the version first, so that a future plan is refused for its version, not for
        // the fields this build does not know.
        // Only the fields the version rules need, every other value skipped: a `Value` of the
        // whole document took several times the memory of the plan it then became.
        #[derive(serde::Deserialize)]
        struct Head {
            schema_version: Option<serde_json::Value>,
            parallelism: Option<serde::de::IgnoredAny>,
            model: Option<HeadModel>,
        }
        #[derive(serde::Deserialize)]
        struct HeadModel {
            graph_sha256: Option<serde::de::IgnoredAny>,
            weights_sha256: Option<serde::de::IgnoredAny>,
        }
        let head: Head = serde_json::from_str(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => Error::InvalidPlan(e.to_string()),
            _ => Error::InvalidPlan(format!("not JSON: {e}")),
        })?;
        match head.schema_version.as_ref().and_then(|v| v.as_u64()) {
            None => {
                return Err(Error::InvalidPlan(
                    "no schema_version: this is not a pipecut plan".into(),
                ))
            }
            Some(v) if v > SCHEMA_VERSION as u64 => {
                return Err(Error::InvalidPlan(format!(
                    "schema_version {v} is newer than this pipecut understands ({SCHEMA_VERSION}); upgrade pipecut"
                )))
            }
            Some(0) => {
                return Err(Error::InvalidPlan("schema_version 0 does not exist".into()));
            }
            Some(1) if head.parallelism.is_some() => {
                return Err(Error::InvalidPlan(
                    "a schema_version 1 plan has no parallelism section (it came with version 2)"
                        .into(),
                ));
            }
            Some(version) if version >= 3 => {
                let model = head.model.as_ref();
                for (field, present) in [
                    ("graph_sha256", model.is_some_and(|m| m.graph_sha256.is_some())),
                    ("weights_sha256", model.is_some_and(|m| m.weights_sha256.is_some())),
                ] {
                    if !present {
                        return Err(Error::InvalidPlan(format!(
                            "a schema_version {version} plan names its model by model.{field}, which this one lacks"
                        )));
                    }
                }
            }
            Some(_) => {}
        }
        let mut plan: Plan =
            serde_json::from_str(text).map_err(|e| Error::InvalidPlan(e.to_string()))?;
        for (name, value) in &mut plan.model.values {
            value.validate(name)?;
            value.type_empty_data();
        }
        Ok(plan)
    }

    /// The cost settings the plan was made with.
    pub fn settings(&self) -> CostSettings {
        CostSettings {
            mode: self.config.mode,
            schedule: self.config.schedule,
            microbatches: self.config.microbatches,
            memory_headroom: self.config.memory_headroom,
            unknown_ops: self.config.unknown_op_cost,
        }
    }

    /// The per-stage forward/backward times the schedule simulator runs, from the recorded
    /// stage figures.
    pub fn stage_times(&self) -> StageTimes {
        let figures: Vec<StageFiguresSecs> = self
            .stages
            .iter()
            .map(|s| StageFiguresSecs {
                compute_secs: s.compute_secs,
                receive_secs: s.receive_secs,
                gradient_receive_secs: s.gradient_receive_secs,
            })
            .collect();
        StageTimes::from_stage_figures(self.config.mode, &figures)
    }

    /// Simulates one step of the plan under its schedule and micro-batch count.
    pub fn simulate(&self) -> Result<Simulation, Error> {
        simulate(
            &self.stage_times(),
            self.config.schedule.into(),
            self.config.microbatches as usize,
        )
    }

    /// Rebuilds the plan's cluster from its layout.
    pub fn cluster(&self, catalog: &Catalog) -> Result<Cluster, Error> {
        Cluster::from_layout(
            &self.cluster.layout,
            catalog,
            self.cluster.description.clone(),
        )
        .map_err(|e| match e {
            Error::UnknownHardware { kind, name, .. } => Error::InvalidPlan(format!(
                "it was made with the {kind} profile '{name}', which is not built in: pass its file with --device-profile FILE (or put it in a PIPECUT_COST_MODELS folder)"
            )),
            e => e,
        })
    }

    /// Stage of every node of `graph`, by name, with the plan's problem. Refuses a node assigned
    /// twice, a node on no stage, or a name the graph does not have.
    pub fn problem_and_assignment(
        &self,
        graph: &Graph,
        cluster: &Cluster,
    ) -> Result<(PartitionProblem, Vec<StageId>), Error> {
        let devices = self.stage_devices(cluster)?;
        // Before sharding: the tensor-parallel groups must be devices of the cluster.
        self.check_parallelism_section(cluster)?;
        let mut problem = PartitionProblem::new(graph, cluster, &devices, self.settings())?;
        let tensor_parallel = self.parallelism.as_ref().map(|p| p.tensor_parallel);
        if let (Some(tp), Some(&first)) = (tensor_parallel, devices.first()) {
            crate::partition::tensor_parallel::TensorParallelBlocks::find(graph).shard_on(
                graph,
                &mut problem,
                cluster,
                tp,
                first,
            );
        }
        problem
            .pin_cuts(&self.config.cut_constraints.pin)
            .map_err(|e| Error::InvalidPlan(format!("config.cut_constraints: {e}")))?;
        let assignment = self.assignment(&problem)?;
        problem.check_assignment(&assignment)?;
        Ok((problem, assignment))
    }

    /// The device of every stage, refusing stages out of order, devices the cluster does not
    /// have or names differently, and a pipeline that does not place its stages as the
    /// schedule does (one stage per device, or under interleaving its chunks in turn).
    fn stage_devices(&self, cluster: &Cluster) -> Result<Vec<DeviceId>, Error> {
        let bad = |detail: String| Err(Error::InvalidPlan(detail));
        if self.stages.is_empty() {
            return bad("it has no stages".into());
        }
        for (s, stage) in self.stages.iter().enumerate() {
            if stage.stage as usize != s {
                return bad(format!(
                    "stage {} is listed at position {s}; stages must be listed in order",
                    stage.stage
                ));
            }
        }
        let devices: Vec<DeviceId> = self.stages.iter().map(|s| DeviceId(s.device.id)).collect();
        self.config
            .schedule
            .validate()
            .map_err(Error::InvalidPlan)?;
        let chunks = self.config.schedule.chunks();
        if !devices.len().is_multiple_of(chunks) {
            return bad(format!(
                "{} stages cannot be {chunks} chunks on each device of an interleaved pipeline",
                devices.len()
            ));
        }
        for (s, stage) in self.stages.iter().enumerate() {
            let id = stage.device.id as usize;
            if id >= cluster.device_count() {
                return bad(format!(
                    "stage {s} is on device {id}, the cluster has {}",
                    cluster.device_count()
                ));
            }
            let actual = &cluster.device(DeviceId(stage.device.id)).name;
            if *actual != stage.device.name {
                return bad(format!(
                    "stage {s} names device {id} '{}' but the cluster's device {id} is '{actual}'",
                    stage.device.name
                ));
            }
            // Under interleaving stage c·K + d is chunk c of device d: the first K stages are
            // on K different devices, and each later one on its chunk's device.
            let pipeline = devices.len() / chunks;
            if s >= pipeline && devices[s] != devices[s % pipeline] {
                return bad(format!(
                    "stage {s} is chunk {} of the device of stage {}, device {}, but is on device {id}",
                    s / pipeline,
                    s % pipeline,
                    devices[s % pipeline].0
                ));
            }
            if s < pipeline && devices[..s].contains(&devices[s]) {
                return bad(format!("device {id} hosts two stages"));
            }
        }
        Ok(devices)
    }

    /// The stage of every position of `problem`, from the node names each stage lists.
    fn assignment(&self, problem: &PartitionProblem) -> Result<Vec<StageId>, Error> {
        let bad = |detail: String| Err(Error::InvalidPlan(detail));
        let position: BTreeMap<&str, usize> = problem
            .node_names()
            .singles()
            .map(|(p, n)| (n, p))
            .collect();
        let mut stage_of: Vec<Option<StageId>> = vec![None; problem.node_count()];
        for stage in &self.stages {
            for name in stage.nodes.iter() {
                let Some(&p) = position.get(name) else {
                    return bad(format!(
                        "stage {} lists node '{name}', which the model does not have",
                        stage.stage
                    ));
                };
                if let Some(other) = stage_of[p] {
                    return bad(format!(
                        "node '{name}' is assigned twice (stages {} and {})",
                        other.0, stage.stage
                    ));
                }
                stage_of[p] = Some(StageId(stage.stage));
            }
        }
        let mut assignment = Vec::with_capacity(stage_of.len());
        for (p, s) in stage_of.into_iter().enumerate() {
            match s {
                Some(s) => assignment.push(s),
                None => {
                    return bad(format!(
                        "node '{}' is on no stage",
                        problem.node_names().name(p)
                    ))
                }
            }
        }
        Ok(assignment)
    }

    /// The plan with every figure re-derived from its node assignment on `graph`: the stages
    /// (counts, first and last node, node order, sent and received lists, memory, times), the
    /// summary's bottleneck, bytes, throughput, gap and baselines, and the `--stages auto` row of
    /// its own stage count. The status, lower bound and solver are left as recorded: they are
    /// claims about how the plan was found, audited by [`Self::check`].
    fn rederive(
        &self,
        model: Digests,
        graph: &Graph,
        catalog: &Catalog,
    ) -> Result<Rederived, Error> {
        self.model_match(model)?;
        let cluster = self.cluster(catalog)?;
        self.check_costed_alike(&cluster, graph)?;
        let (problem, assignment) = self.problem_and_assignment(graph, &cluster)?;
        let constraints = &self.config.cut_constraints;
        let in_plan = |e: Error| Error::InvalidPlan(format!("config.cut_constraints: {e}"));
        if let Some(broken) = constraints
            .violation(graph, &problem, &assignment)
            .map_err(in_plan)?
        {
            return Err(Error::InvalidPlan(format!(
                "{broken}; drop the tensor from config.cut_constraints to allow that cut"
            )));
        }
        let eval = problem.evaluate(&assignment);
        for (s, actual) in eval.stages.iter().enumerate() {
            if !actual.fits() {
                return Err(Error::InvalidPlan(format!(
                    "stage {s} needs {} of memory but may use {}",
                    pipecut_ir::onnx::inspect::human_bytes(actual.peak_memory_bytes),
                    pipecut_ir::onnx::inspect::human_bytes(actual.capacity_bytes)
                )));
            }
        }
        let mut plan = self.clone();
        plan.model.nodes = graph.node_count();
        plan.model.graph = graph.name().to_string();
        plan.stages = rederive::transcribe_stages(&problem, &assignment, &eval);
        plan.rederive_summary(&problem, &assignment, &eval)?;
        plan.rederive_chosen_candidate(eval.bottleneck_secs)?;
        if plan.parallelism.is_some() {
            // Plans from before version 6 do not list the shards; they check without them.
            let with_shards = self.schema_version >= 6;
            plan =
                plan.rederive_parallelism(graph, &cluster, (&problem, &assignment), with_shards)?;
        }
        // The status and bound are claims over the partitions the constraints allow: audited
        // on the problem the solvers saw.
        let nodes = assignment.len();
        let (problem, assignment) = match constraints.apply(graph, &problem).map_err(in_plan)? {
            Some(grouped) => match grouped.restrict(&assignment) {
                Some(groups_assignment) => (grouped.problem, groups_assignment),
                None => {
                    return Err(Error::InvalidPlan(
                        "a stage boundary splits nodes that config.cut_constraints join".into(),
                    ))
                }
            },
            None => (problem, assignment),
        };
        Ok(Rederived {
            plan,
            problem,
            assignment,
            nodes,
        })
    }

    /// Refuses a check costed otherwise than the plan: other hardware profiles, or other
    /// measured node times (or none where the plan had some).
    fn check_costed_alike(&self, cluster: &Cluster, graph: &Graph) -> Result<(), Error> {
        let bad = |detail: String| Err(Error::InvalidPlan(detail));
        let hashes = profile_hashes(cluster);
        if hashes != self.cost_model {
            let changed: Vec<&String> = hashes
                .iter()
                .filter(|(name, hash)| self.cost_model.get(*name) != Some(*hash))
                .map(|(name, _)| name)
                .collect();
            return bad(format!(
                "the hardware profiles differ from the plan's ({}); re-plan with this catalog",
                changed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let in_use = measured_uses(graph);
        if in_use != self.config.measured_node_times {
            let name = |uses: &[MeasuredTimesUse]| match uses {
                [] => "the roofline alone".to_string(),
                uses => uses
                    .iter()
                    .map(|u| format!("node times for '{}' (sha256 {:.12}…)", u.device, u.sha256))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            return bad(format!(
                "the plan was costed with {}, this check with {}; pass the plan's node-times file with --profile",
                name(&self.config.measured_node_times),
                name(&in_use)
            ));
        }
        Ok(())
    }

    /// Refuses a parallelism section that does not match the stages, the cluster and the mode,
    /// or a mode that shards ZeRO state over replicas the plan does not have.
    fn check_parallelism_section(&self, cluster: &Cluster) -> Result<(), Error> {
        let degree = self
            .parallelism
            .as_ref()
            .map_or(1, |p| p.tensor_parallel.degree);
        let kept_whole = self.config.cut_constraints.tensor_parallel_blocks;
        if degree >= 2 && kept_whole != degree {
            // The costs charge a split block 1/t of its time and the export splits only blocks
            // a stage holds whole: without the constraint the plan promises what no GPU runs.
            return Err(Error::InvalidPlan(format!(
                "config.cut_constraints.tensor_parallel_blocks is {kept_whole} but the stages are split {degree} ways: each block split {degree} ways must stay on one stage"
            )));
        }
        match (&self.parallelism, self.config.mode) {
            (Some(parallelism), mode) => check_parallelism(
                parallelism,
                &self.stages,
                cluster,
                (mode, self.config.schedule),
            ),
            (None, Mode::Training { zero, .. }) if !zero.is_none() => Err(Error::InvalidPlan(format!(
                "the mode shards ZeRO state over {} replicas, but the plan has no parallelism section",
                zero.group
            ))),
            (None, _) => Ok(()),
        }
    }

    /// The summary's figures re-derived from the assignment's evaluation `eval`: bottleneck,
    /// bytes, throughput, gap, the measured selection and the baselines.
    fn rederive_summary(
        &mut self,
        problem: &PartitionProblem,
        assignment: &[StageId],
        eval: &Evaluation,
    ) -> Result<(), Error> {
        let bottleneck = eval.bottleneck_secs;
        let summary = &mut self.summary;
        summary.bottleneck_secs = bottleneck;
        summary.cut_bytes = eval.cut_bytes;
        summary.microbatches_per_sec = if bottleneck > 0.0 {
            1.0 / bottleneck
        } else {
            0.0
        };
        summary.gap = rederive::relative_gap(bottleneck, summary.lower_bound_secs);
        if let Some(selection) = &mut summary.measured_selection {
            selection.rederive(problem, assignment)?;
        }
        // Baselines the solve skipped for time stay skipped: re-deriving them would take the
        // time the limit denied them, and a skipped comparison claims nothing.
        let skipped = !summary.baselines.is_empty()
            && summary
                .baselines
                .iter()
                .all(|b| b.error.as_deref() == Some(crate::partition::BASELINES_SKIPPED));
        if !skipped {
            let (baselines, baseline_layers) =
                crate::partition::evaluate_baselines(problem, &self.config.baseline_layer_type);
            summary.baselines = rederive::plan_baselines(&baselines, bottleneck);
            summary.baseline_layers = baseline_layers;
        }
        Ok(())
    }

    /// The `--stages auto` row of the plan's own stage count, simulated again (the plan's
    /// stages already re-derived).
    fn rederive_chosen_candidate(&mut self, bottleneck: f64) -> Result<(), Error> {
        let k = self.stages.len();
        if self
            .summary
            .stage_count_candidates
            .iter()
            .any(|c| c.stages == k)
        {
            let simulation = self.simulate()?;
            let row = rederive::chosen_candidate(
                k,
                bottleneck,
                simulation.step_secs,
                simulation.bubble_fraction,
            );
            for candidate in &mut self.summary.stage_count_candidates {
                if candidate.stages == k {
                    *candidate = row.clone();
                }
            }
        }
        Ok(())
    }

    /// The parallelism section's step figures re-derived (the plan's stages already
    /// re-derived), and its tensor-parallel shards when `with_shards`.
    fn rederive_parallelism(
        mut self,
        graph: &Graph,
        cluster: &Cluster,
        (problem, assignment): (&PartitionProblem, &[StageId]),
        with_shards: bool,
    ) -> Result<Plan, Error> {
        let Some(parallelism) = &self.parallelism else {
            return Ok(self);
        };
        let replicas: Vec<Vec<DeviceId>> = parallelism
            .replicas
            .iter()
            .map(|r| r.iter().map(|&d| DeviceId(d)).collect())
            .collect();
        let step = StepFigures::new(
            graph,
            cluster,
            (problem, assignment),
            &replicas,
            &self.simulate()?,
            parallelism.global_batch,
        );
        if with_shards {
            self = self.with_tensor_parallel_shards(graph)?;
        }
        let parallelism = self.parallelism.as_mut().expect("checked above");
        parallelism.allreduce_secs = step.allreduce_secs;
        parallelism.pipeline_secs = step.pipeline_secs;
        parallelism.step_secs = step.step_secs;
        parallelism.samples_per_sec = step.samples_per_sec;
        parallelism.bubble_fraction = step.bubble_fraction;
        Ok(self)
    }

    /// Every figure the plan records that differs from `rederived`, each naming the field (with
    /// its stage) and both values.
    fn mismatches(&self, rederived: &Plan) -> Vec<rederive::Mismatch> {
        let mut found =
            rederive::differences("model ", &json(&self.model), &json(&rederived.model));
        for (recorded, recomputed) in self.stages.iter().zip(&rederived.stages) {
            found.extend(rederive::differences(
                &format!("stage {} ", recorded.stage),
                &json(recorded),
                &json(recomputed),
            ));
        }
        found.extend(rederive::differences(
            "summary ",
            &json(&self.summary),
            &json(&rederived.summary),
        ));
        if let (Some(recorded), Some(recomputed)) = (&self.parallelism, &rederived.parallelism) {
            found.extend(rederive::differences(
                "parallelism ",
                &json(recorded),
                &json(recomputed),
            ));
        }
        found
    }

    /// Whether the status and lower bound the plan records are claims its own figures support:
    /// a bound no plan found beats, "optimal" only at a bottleneck equal to that bound, a time
    /// limit's gap equal to the summary's.
    /// `Ok(Some(note))`: every claim holds but the optimal status was neither proven again nor
    /// refuted within the limit (see [`Self::check_proof`]).
    fn check_claims(&self, rederived: &Rederived) -> Result<Option<String>, Error> {
        let problem = &rederived.problem;
        let bad = |detail: String| Err(Error::InvalidPlan(detail));
        let summary = &self.summary;
        let bottleneck = summary.bottleneck_secs;
        let bound = summary.lower_bound_secs;
        match &summary.measured_selection {
            Some(selection) => selection.check_status(summary.status)?,
            None if summary.status
                == (SolveStatus::Heuristic {
                    reason: crate::partition::HeuristicReason::SelectedByRunning,
                }) =>
            {
                return bad(
                    "the status says selected by running but the plan records no measured_selection"
                        .into(),
                )
            }
            None => {}
        }
        let above = |a: f64, b: f64| a > b * (1.0 + 1e-9);
        if above(bound, bottleneck) {
            return bad(format!(
                "the lower bound {bound} s exceeds the bottleneck {bottleneck} s"
            ));
        }
        // A bound above the problem's own needs a proof the plan does not carry; the DP's plan
        // is a cheap witness against a false one (and against a false "optimal").
        let claims_more =
            above(bound, problem.lower_bound_secs()) || summary.status == SolveStatus::Optimal;
        if claims_more {
            if let Some(dp) = crate::partition::dp::solve(problem) {
                if above(bottleneck, dp.bottleneck_secs) && summary.status == SolveStatus::Optimal {
                    return bad(format!(
                        "the status says optimal but the DP finds a plan with a smaller bottleneck ({} s < {bottleneck} s); `pipecut check --rewrite` records it as hand-edited",
                        dp.bottleneck_secs
                    ));
                }
                if above(bound, dp.bottleneck_secs) {
                    return bad(format!(
                        "the lower bound {bound} s is above the bottleneck {} s of a plan the DP finds: the bound is false",
                        dp.bottleneck_secs
                    ));
                }
            }
        }
        if let Some(bounds) = &summary.bounds {
            // Each recorded proof is a claim too: none may exceed the plan's own bottleneck, and
            // the lower bound needs one of them (or a proof of optimality) behind it.
            let recorded = [
                ("average_work_secs", Some(bounds.average_work_secs)),
                ("granularity_secs", bounds.granularity_secs),
                ("lp_relaxation_secs", bounds.lp_relaxation_secs),
                ("branch_and_bound_secs", bounds.branch_and_bound_secs),
            ];
            for (field, value) in recorded {
                if let Some(value) = value.filter(|&v| above(v, bottleneck)) {
                    return bad(format!(
                        "summary bounds.{field} {value} s exceeds the bottleneck {bottleneck} s"
                    ));
                }
            }
            check_rederivable_bounds(bounds, problem)?;
            let mut strongest = bounds.strongest().1;
            // A rival chosen by running keeps the proof that the cost model's optimum (its
            // first candidate, whose prediction check re-derived) is optimal: its bound.
            if let Some(selection) = &summary.measured_selection {
                strongest = strongest.max(selection.proven_optimum_secs());
            }
            if summary.status != SolveStatus::Optimal && above(bound, strongest) {
                return bad(format!(
                    "the lower bound {bound} s is above every bound the plan records (at most {strongest} s)"
                ));
            }
        }
        let note = self.check_proof(rederived)?;
        let verdict = match summary.status {
            SolveStatus::Optimal if above(bottleneck, bound) => bad(format!(
                "the status says optimal but the plan's bottleneck {bottleneck} s is above its lower bound {bound} s (gap {:.4}%): nothing it records proves it optimal; `pipecut check --rewrite` records it as hand-edited",
                summary.gap * 100.0
            )),
            SolveStatus::TimeLimit { gap, .. } if (gap - summary.gap).abs() > 1e-9 => bad(format!(
                "the status records a gap of {gap} but the summary's is {}",
                summary.gap
            )),
            _ => Ok(None),
        };
        verdict.map(|_: Option<String>| note)
    }

    /// Proves an optimal status again by the proof the plan records (partition/proof.rs), and
    /// refuses a proof recorded with any other status or missing from a plan that has the field.
    /// The search gets as long as the solve had (`config.time_limit_secs`), at most
    /// `REPROVE_LIMIT`.
    fn check_proof(&self, rederived: &Rederived) -> Result<Option<String>, Error> {
        let summary = &self.summary;
        let refuse = |why: &str| {
            Err(Error::InvalidPlan(format!(
                "the status says optimal but {why}; `pipecut check --rewrite` records it as hand-edited"
            )))
        };
        match (summary.status, summary.proof) {
            (SolveStatus::Optimal, None) if self.schema_version >= 9 => {
                refuse("the plan records no proof (summary.proof)")
            }
            (SolveStatus::Optimal, proof) => {
                let limit = std::time::Duration::from_secs_f64(
                    self.config.time_limit_secs.clamp(1.0, 86_400.0),
                );
                crate::partition::proof::reprove(
                    &rederived.problem,
                    &rederived.assignment,
                    proof,
                    limit,
                )
                .or_else(|why| refuse(&why))
            }
            (status, Some(_)) => Err(Error::InvalidPlan(format!(
                "summary.proof proves an optimum but the status is {}",
                status.describe(summary.gap)
            ))),
            (_, None) => Ok(None),
        }
    }

    /// Validates the plan against the model (its sha256) and its typed `graph` (dims bound as in
    /// the plan): same model and hardware profiles, every node on exactly one stage, convex
    /// ordered stages, memory within capacity, every recorded figure equal to the one re-derived
    /// from the node assignment, and a status and lower bound its figures support. The first
    /// wrong figure is named with its stage and both values.
    pub fn check(
        &self,
        model: Digests,
        graph: &Graph,
        catalog: &Catalog,
    ) -> Result<CheckReport, Error> {
        let rederived = self.rederive(model, graph, catalog)?;
        let mismatches = self.mismatches(&rederived.plan);
        if let Some(first) = mismatches.first() {
            let more = match mismatches.len() - 1 {
                0 => String::new(),
                1 => " (and 1 more figure differs)".to_string(),
                n => format!(" (and {n} more figures differ)"),
            };
            return Err(Error::InvalidPlan(format!(
                "{first}{more}; `pipecut check --rewrite` recomputes every figure from the node assignment"
            )));
        }
        let note = self.check_claims(&rederived)?;
        Ok(CheckReport {
            stages: self.stages.len(),
            nodes: rederived.nodes,
            bottleneck_secs: rederived.plan.summary.bottleneck_secs,
            note,
        })
    }

    /// The plan with every figure recomputed from its node assignment (which nodes each stage
    /// lists), for a plan edited by hand: move a node between stages, then rewrite. A plan whose
    /// figures and claims already check comes back unchanged; any other gets the status
    /// [`SolveStatus::HandEdited`], its recorded lower bound when the re-derived figures still
    /// support it (else the problem's own bound), and no solve time. Refuses what
    /// [`Self::check`] refuses about the assignment itself: another model, a node missing or on
    /// two stages, stages that are not convex and ordered, a stage over its memory.
    pub fn rewrite(&self, model: Digests, graph: &Graph, catalog: &Catalog) -> Result<Plan, Error> {
        let rederived = self.rederive(model, graph, catalog)?;
        if self.mismatches(&rederived.plan).is_empty() && self.check_claims(&rederived).is_ok() {
            return Ok(self.clone());
        }
        let mut plan = rederived.plan.clone();
        plan.summary.status = SolveStatus::HandEdited;
        plan.summary.proof = None;
        plan.summary.solve_secs = None;
        if plan.check_claims(&rederived).is_err() {
            let average = rederived.problem.lower_bound_secs();
            plan.summary.lower_bound_secs = average.min(plan.summary.bottleneck_secs);
            plan.summary.bounds = Some(LowerBounds {
                average_work_secs: plan.summary.lower_bound_secs,
                ..LowerBounds::default()
            });
        }
        plan.summary.gap =
            rederive::relative_gap(plan.summary.bottleneck_secs, plan.summary.lower_bound_secs);
        Ok(plan)
    }
}

/// Refuses recorded average-work and granularity bounds above the ones re-derived on `problem`
/// (the model under the plan's cut constraints): a constraint switched off after the solve
/// lowers them. The granularity bound is re-derived to its end, so a solve that stopped it
/// early recorded at most as much.
fn check_rederivable_bounds(bounds: &LowerBounds, problem: &PartitionProblem) -> Result<(), Error> {
    let above = |a: f64, b: f64| a > b * (1.0 + 1e-9);
    let average = problem.lower_bound_secs();
    let granularity = || {
        let deadline = std::time::Instant::now() + crate::partition::proof::REPROVE_LIMIT;
        crate::partition::bounds::granularity_bound_secs(problem, deadline, None)
    };
    let recomputed = [
        (
            "average_work_secs",
            Some(bounds.average_work_secs),
            Some(average),
        ),
        (
            "granularity_secs",
            bounds.granularity_secs,
            bounds.granularity_secs.and_then(|_| granularity()),
        ),
    ];
    for (field, recorded, rederived) in recomputed {
        if let (Some(recorded), Some(rederived)) = (recorded, rederived) {
            if above(recorded, rederived) {
                return Err(Error::InvalidPlan(format!(
                    "summary bounds.{field} {recorded} s is above the {rederived} s re-derived from the model under config.cut_constraints (was a constraint changed after the solve?)"
                )));
            }
        }
    }
    Ok(())
}

/// A plan part as a JSON value, to compare with its re-derived self.
fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("plans serialize")
}

/// A plan's figures re-derived from its node assignment, with the problem they came from.
struct Rederived {
    plan: Plan,
    /// The problem the plan's claims are about: the model's, or its quotient under the plan's
    /// cut constraints.
    problem: PartitionProblem,
    /// The plan's assignment of `problem`'s positions.
    assignment: Vec<StageId>,
    nodes: usize,
}

impl Plan {
    /// The nodes of each stage, as ids of `graph`, for a plan made for the model whose protobuf
    /// has sha256 `model_sha256`. Refuses a plan made for another model and node names the graph
    /// does not have; that the stages are a partition and convex is for the consumer to check
    /// ([`pipecut_ir::onnx::export::export_stages`] does).
    pub fn stage_nodes(
        &self,
        model: Digests,
        graph: &Graph,
    ) -> Result<Vec<Vec<pipecut_ir::graph::NodeId>>, Error> {
        self.model_match(model)?;
        let by_name: BTreeMap<&str, pipecut_ir::graph::NodeId> =
            graph.nodes().map(|(id, n)| (n.name.as_str(), id)).collect();
        self.stages
            .iter()
            .map(|stage| {
                stage
                    .nodes
                    .iter()
                    .map(|name| {
                        by_name.get(name).copied().ok_or_else(|| {
                            Error::InvalidPlan(format!(
                                "stage {} lists node '{name}', which the model does not have",
                                stage.stage
                            ))
                        })
                    })
                    .collect()
            })
            .collect()
    }
}
