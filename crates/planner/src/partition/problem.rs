//! The partition problem in numbers: every node's time on every stage's device, the bytes every
//! tensor carries across a stage boundary, and what each stage must hold in memory.
//!
//! Solvers see only this table, never the graph: positions `0..n` index the graph's
//! topological order, stages `0..k` index the devices in pipeline order. [`PartitionProblem::evaluate`]
//! is the one place where a stage's time and memory are computed; the DP, the MILP, the
//! baselines, the plan and `pipecut check` all call it, so their figures cannot disagree.
//!
//! # Communication model
//! Stages relay: a tensor made in stage `a` and read in stage `c > a + 1` passes through every
//! stage between (as GPipe and torch pipelining do for sequential pipelines). So stage `k`
//! receives, from stage `k − 1`, exactly the tensors live across its first boundary, and holds
//! them in memory while it works. In training the gradients of those tensors flow back, so stage
//! `k` also receives the gradients of what it sent. Each tensor is one message: latency plus
//! bytes over the link's per-direction bandwidth. Graph inputs come from the host and are free;
//! graph outputs go to the host from the stage that makes them.

use std::collections::HashMap;

use serde::Serialize;

use super::names::{NameId, NameTable, NodeNames};
use crate::Error;
use pipecut_cost::cluster::DeviceId;
use pipecut_cost::memory::{
    held_at_peaks, in_flight_microbatches, param_footprint_bytes, Held, Schedule,
};
use pipecut_cost::model::{per_node_on_threads, tensor_bytes};
use pipecut_cost::{Cluster, CostModel, Mode, UnknownOpCost};
use pipecut_ir::graph::{Graph, NodeId, TensorId, TensorOrigin};

pub use pipecut_cost::measured::MAX_TOTAL_SECS;

/// Identifies a pipeline stage: its position in the pipeline, 0-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StageId(pub u32);

impl StageId {
    /// The stage's position as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What the cost model needs besides the graph and the devices.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostSettings {
    /// Inference or training.
    pub mode: Mode,
    /// Pipeline schedule, which decides how many micro-batches' activations a stage keeps.
    pub schedule: Schedule,
    /// Micro-batches per step.
    pub microbatches: u32,
    /// Fraction of each device's memory kept free for the runtime (CUDA context, library
    /// workspaces, fragmentation).
    pub memory_headroom: f64,
    /// What to do with ops the cost model has no rule for.
    #[serde(skip)]
    pub unknown_ops: UnknownOpCost,
}

impl Default for CostSettings {
    fn default() -> Self {
        CostSettings {
            mode: Mode::Inference,
            schedule: Schedule::OneFOneB,
            microbatches: 1,
            // 10%: about 1 GiB of an 80 GB GPU for the CUDA context and cuBLAS/cuDNN workspaces,
            // the rest for allocator fragmentation (PyTorch's caching allocator commonly loses
            // 5–10% to it).
            memory_headroom: 0.10,
            unknown_ops: UnknownOpCost::Error,
        }
    }
}

/// The device of one stage and what it brings to the problem.
#[derive(Debug, Clone, Serialize)]
pub struct StageDevice {
    /// The device in the cluster.
    pub device: DeviceId,
    /// Its profile name.
    pub device_name: String,
    /// Index of its device kind in the problem's per-kind time tables.
    #[serde(skip)]
    pub kind: usize,
    /// Memory the device has.
    pub memory_bytes: u64,
    /// Memory the stage may use: the device's, less the headroom.
    pub capacity_bytes: u64,
    /// Micro-batches whose activations the stage keeps at its peak under the schedule (under
    /// ZB-H1, those whose input-gradient pass is pending).
    pub in_flight: u64,
    /// The moments at which it holds the most ([`held_at_peaks`]): its peak is the largest.
    pub held: Vec<Held>,
    /// Bandwidth (bytes/s) and latency (s) of the link from the previous stage, if any.
    #[serde(skip)]
    pub link_in: Option<(f64, f64)>,
}

/// Positions of a few nodes (a tensor's readers, a node's weights), up to four kept inline:
/// most tensors of a model have one or two readers, and a vector each was a million
/// allocations at a million nodes.
pub type Positions = smallvec::SmallVec<[u32; 4]>;

/// A tensor that a node makes and other nodes read: what may cross a boundary.
#[derive(Debug, Clone)]
pub struct Flow {
    /// Tensor name ([`PartitionProblem::name`]).
    pub name: NameId,
    /// Bytes per micro-batch.
    pub bytes: u64,
    /// Position of its producer.
    pub producer: u32,
    /// Positions of its consumers, ascending, each once.
    pub consumers: Positions,
    /// Whether a stage boundary must lie between its producer and every consumer
    /// (`--pin-cut`, see [`PartitionProblem::pin_cuts`]).
    pub pinned: bool,
}

/// A weight with the positions of the nodes that read it.
#[derive(Debug, Clone)]
pub struct ParamUse {
    /// Tensor name ([`PartitionProblem::name`]).
    pub name: NameId,
    /// Bytes it needs on a stage (with gradient and optimizer state in training).
    pub footprint_bytes: u64,
    /// Number of elements (`numel()`): what the peers that balance parameters count.
    pub elements: u64,
    /// Positions of its readers, ascending, each once.
    pub uses: Positions,
    /// GPUs of a tensor-parallel group it is split over (1: held whole); its footprint and
    /// elements are one GPU's share.
    pub shards: u32,
}

/// The partition problem for a fixed number of stages on fixed devices.
#[derive(Debug, Clone)]
pub struct PartitionProblem {
    pub(crate) order: Vec<NodeId>,
    /// Each node's name and module scope ([`pipecut_ir::graph::Node::scope`]: what layers are found
    /// from), and the text of the tensors' names.
    pub(crate) node_names: NodeNames,
    pub(crate) stages: Vec<StageDevice>,
    pub(crate) kind_names: Vec<String>,
    /// Node time per device kind: `node_secs[kind][position]`.
    pub(crate) node_secs: Vec<Vec<f64>>,
    /// Bytes of each node's outputs per micro-batch (its activations).
    pub(crate) activation_bytes: Vec<u64>,
    /// What each node's weight gradient reads per micro-batch, which a zero-bubble stage keeps
    /// from a micro-batch's B to its W ([`node_weight_inputs`]); 0 for nodes that read no
    /// weight, and everywhere under the other schedules.
    pub(crate) weight_input_bytes: Vec<u64>,
    pub(crate) params: Vec<ParamUse>,
    /// Params each node reads: indices into `params`.
    pub(crate) node_params: Vec<Positions>,
    pub(crate) flows: Vec<Flow>,
    pub(crate) settings: CostSettings,
    /// The forward FLOPs of one micro-batch through the model, summed in the order while the
    /// first device kind was costed (the MFU line's numerator needs no second costing); `None`
    /// where a measured time stood in for a node no rule costs.
    pub(crate) forward_flops: Option<f64>,
}

/// Time and memory of one stage of an assignment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageFigures {
    /// Nodes on the stage.
    pub node_count: usize,
    /// Compute time of its nodes (forward, plus backward in training), per micro-batch.
    pub compute_secs: f64,
    /// Time to receive the tensors crossing into the stage.
    pub receive_secs: f64,
    /// In training, time to receive the gradients of the tensors it sent.
    pub gradient_receive_secs: f64,
    /// `compute + receive + gradient receive`: the stage's time per micro-batch.
    pub stage_secs: f64,
    /// Parameters it holds (with gradients and optimizer state in training).
    pub param_bytes: u64,
    /// Activations its nodes make per micro-batch.
    pub activation_bytes: u64,
    /// What its weight gradients read per micro-batch (kept from B to W under ZB-H1).
    pub weight_input_bytes: u64,
    /// Bytes it receives per micro-batch.
    pub received_bytes: u64,
    /// Micro-batches in flight at its peak.
    pub in_flight: u64,
    /// `params + max over the stage's peak moments of (received micro-batches · received +
    /// activation micro-batches · activations + W-pending micro-batches · weight inputs)`
    /// ([`PartitionProblem::peak_bytes`]).
    pub peak_memory_bytes: u64,
    /// Memory it may use.
    pub capacity_bytes: u64,
    /// Flows it receives (indices into the problem's flows).
    #[serde(skip)]
    pub received_flows: Vec<u32>,
}

impl StageFigures {
    /// Whether the stage fits its device.
    pub fn fits(&self) -> bool {
        self.peak_memory_bytes <= self.capacity_bytes
    }
}

/// The figures of a whole assignment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Per stage.
    pub stages: Vec<StageFigures>,
    /// The slowest stage's time.
    pub bottleneck_secs: f64,
    /// Bytes crossing all boundaries per micro-batch (the tie-break objective).
    pub cut_bytes: u64,
}

impl Evaluation {
    /// Whether every stage fits its device.
    pub fn fits(&self) -> bool {
        self.stages.iter().all(StageFigures::fits)
    }
}

/// What one stage may use of a device of `memory_bytes`: the memory less the headroom, and
/// under interleaving a 1/v share of it. Each of a device's v chunks is then a stage of its
/// own, and the DP and the MILP, which cost stages one at a time, keep the device's sum within
/// its capacity. The share is conservative (a device whose chunks are unequal may fit where
/// this refuses), and chunks of balanced layers are nearly equal.
fn chunk_capacity_bytes(memory_bytes: u64, settings: &CostSettings) -> u64 {
    let capacity = (memory_bytes as f64 * (1.0 - settings.memory_headroom)) as u64;
    capacity / settings.schedule.chunks() as u64
}

/// Refuses a pipeline [`PartitionProblem::new`] cannot cost: no stage, a headroom outside
/// `[0, 1)`, no micro-batch or more than the simulator runs, a device not in the cluster.
fn check_pipeline(
    cluster: &Cluster,
    devices: &[DeviceId],
    settings: &CostSettings,
) -> Result<(), Error> {
    if devices.is_empty() {
        return Err(Error::PartitionConfig(
            "a pipeline needs at least one stage".into(),
        ));
    }
    if !(0.0..1.0).contains(&settings.memory_headroom) {
        return Err(Error::PartitionConfig(format!(
            "memory headroom must be in [0, 1), got {}",
            settings.memory_headroom
        )));
    }
    if settings.microbatches == 0 {
        return Err(Error::PartitionConfig(
            "the number of micro-batches must be at least 1".into(),
        ));
    }
    crate::schedule::check_microbatches(settings.microbatches.into())?;
    if let Some(device) = devices
        .iter()
        .find(|d| d.0 as usize >= cluster.device_count())
    {
        return Err(Error::PartitionConfig(format!(
            "device {} is not in the cluster ({} devices)",
            device.0,
            cluster.device_count()
        )));
    }
    Ok(())
}

/// The stages of a problem, and the node times of each device kind among them.
struct StageTables {
    kind_names: Vec<String>,
    /// Per device kind, each position's time.
    node_secs: Vec<Vec<f64>>,
    /// The model's forward FLOPs, from the first kind's costs.
    forward_flops: Option<f64>,
    stages: Vec<StageDevice>,
}

impl StageTables {
    /// One time table per device kind, not per device: a 1,024-GPU cluster has few kinds.
    /// `first_timed` is the first device's kind, costed already (time and FLOPs per position).
    fn new(
        graph: &Graph,
        order: &[NodeId],
        cluster: &Cluster,
        devices: &[DeviceId],
        settings: &CostSettings,
        first_timed: Vec<(f64, Option<f64>)>,
    ) -> Result<StageTables, Error> {
        let mut first_timed = Some(first_timed);
        let mut tables = StageTables {
            kind_names: Vec::new(),
            node_secs: Vec::new(),
            forward_flops: None,
            stages: Vec::with_capacity(devices.len()),
        };
        for (k, &device) in devices.iter().enumerate() {
            let spec = cluster.device(device);
            let kind = match tables.kind_names.iter().position(|n| *n == spec.name) {
                Some(kind) => kind,
                None => {
                    let secs = match first_timed.take() {
                        Some(timed) => {
                            // Summed in the order, as `CostModel::model_flops` sums them.
                            tables.forward_flops = timed.iter().map(|&(_, flops)| flops).sum();
                            timed.into_iter().map(|(secs, _)| secs).collect()
                        }
                        None => {
                            let model = CostModel::new(spec)
                                .with_mode(settings.mode)
                                .with_unknown_ops(settings.unknown_ops);
                            per_node_on_threads(graph, order, |id| model.node_time_secs(graph, id))?
                        }
                    };
                    tables.kind_names.push(spec.name.clone());
                    tables.node_secs.push(secs);
                    tables.kind_names.len() - 1
                }
            };
            let memory_bytes = spec.memory_bytes.value;
            let capacity_bytes = chunk_capacity_bytes(memory_bytes, settings);
            let link_in = match k {
                0 => None,
                _ => Some(
                    cluster
                        .link_between(devices[k - 1], device)
                        .unwrap_or((f64::INFINITY, 0.0)),
                ),
            };
            tables.stages.push(StageDevice {
                device,
                device_name: spec.name.clone(),
                kind,
                memory_bytes,
                capacity_bytes,
                in_flight: in_flight_microbatches(
                    settings.mode,
                    settings.schedule,
                    k,
                    devices.len(),
                    settings.microbatches,
                ),
                held: held_at_peaks(
                    settings.mode,
                    settings.schedule,
                    k,
                    devices.len(),
                    settings.microbatches,
                ),
                link_in,
            });
        }
        Ok(tables)
    }
}

impl PartitionProblem {
    /// Builds the problem for `graph` (shapes inferred, dims bound) on `devices` of `cluster`,
    /// one stage per device, in pipeline order. Under interleaving a device appears once per
    /// chunk ([`Schedule::chunk_devices`]).
    pub fn new(
        graph: &Graph,
        cluster: &Cluster,
        devices: &[DeviceId],
        settings: CostSettings,
    ) -> Result<PartitionProblem, Error> {
        check_pipeline(cluster, devices, &settings)?;
        let order = graph.topological_order().to_vec();
        // Indexed by node index (the order nodes were added in), not a map: a million lookups.
        let mut position_of_index =
            vec![u32::MAX; order.iter().map(|id| id.index() + 1).max().unwrap_or(0)];
        for (p, &id) in order.iter().enumerate() {
            position_of_index[id.index()] = p as u32;
        }

        // Weights held as a stage of this pipeline holds them (ZeRO-3 keeps them gathered).
        let footprint_mode = match settings.mode {
            Mode::Training {
                recompute, zero, ..
            } => settings
                .mode
                .with_memory_techniques(recompute, zero.held_in_pipeline(devices.len())),
            Mode::Inference => Mode::Inference,
        };
        // The first device kind is costed on the other cores while this thread reads the names
        // and tensors: two linear passes over a million nodes side by side.
        let first_model = CostModel::new(cluster.device(devices[0]))
            .with_mode(settings.mode)
            .with_unknown_ops(settings.unknown_ops);
        let (first_timed, tensors) = std::thread::scope(|scope| {
            let costing = scope.spawn(|| {
                per_node_on_threads(graph, &order, |id| {
                    first_model.node_time_and_flops(graph, id)
                })
            });
            let tensors = TensorTables::new(graph, &order, &position_of_index, footprint_mode);
            match costing.join() {
                Ok(timed) => (timed, tensors),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        // The costs' error first, as when they were computed first.
        let first_timed = first_timed?;
        let TensorTables {
            table,
            names,
            scopes,
            mut activation_bytes,
            node_params,
            params,
            flows,
        } = tensors?;
        let StageTables {
            kind_names,
            mut node_secs,
            forward_flops,
            stages,
        } = StageTables::new(graph, &order, cluster, devices, &settings, first_timed)?;
        let memory_model = settings.mode.memory_model();
        let selective = matches!(
            settings.mode,
            Mode::Training {
                recompute: pipecut_cost::Recompute::Selective,
                ..
            }
        );
        let scores: std::collections::BTreeSet<NodeId> = if selective || !memory_model.is_onnx() {
            super::tensor_parallel::attention_score_nodes(graph)
                .into_iter()
                .collect()
        } else {
            Default::default()
        };
        if !memory_model.is_onnx() {
            // The engine keeps less than every output: its charges replace the outputs'.
            activation_bytes.iter_mut().for_each(|bytes| *bytes = 0);
            for (id, bytes) in pipecut_cost::kept::engine_kept_bytes(graph, memory_model, &scores)?
            {
                activation_bytes[position_of_index[id.index()] as usize] += bytes;
            }
        }
        if selective {
            // Attention's score tensors are not kept; the backward runs their nodes' forward
            // again (a node's time is its forward times 1 + the backward factor).
            let rerun = 1.0 + 1.0 / (1.0 + settings.mode.backward_time_factor());
            for &id in &scores {
                let p = position_of_index[id.index()] as usize;
                activation_bytes[p] = 0;
                for secs in &mut node_secs {
                    secs[p] *= rerun;
                }
            }
        }
        // Only ZB-H1 keeps anything from B to W: other schedules need not size the inputs.
        let weight_input_bytes = match (settings.mode, settings.schedule) {
            (Mode::Training { .. }, Schedule::ZeroBubble) => weight_gradient_inputs(graph, &order)?,
            _ => vec![0; order.len()],
        };
        let node_names = NodeNames {
            table: std::sync::Arc::new(table),
            names,
            scopes,
            merged: Vec::new(),
        };
        Ok(PartitionProblem {
            order,
            node_names,
            stages,
            kind_names,
            node_secs,
            activation_bytes,
            weight_input_bytes,
            params,
            node_params,
            flows,
            settings,
            forward_flops,
        })
    }

    /// The same nodes and costs on the first `stages` devices of a homogeneous `cluster` whose
    /// device kind this problem already has times for (used to say how many devices would fit).
    pub(crate) fn new_like(
        &self,
        cluster: &Cluster,
        stages: usize,
    ) -> Result<PartitionProblem, Error> {
        let devices: Vec<DeviceId> = cluster.devices().map(|(id, _)| id).take(stages).collect();
        let mut like = self.clone();
        like.stages.clear();
        for (k, &device) in devices.iter().enumerate() {
            let spec = cluster.device(device);
            let kind = self
                .kind_names
                .iter()
                .position(|n| *n == spec.name)
                .ok_or_else(|| Error::PartitionConfig(format!("no costs for {}", spec.name)))?;
            let memory_bytes = spec.memory_bytes.value;
            like.stages.push(StageDevice {
                device,
                device_name: spec.name.clone(),
                kind,
                memory_bytes,
                capacity_bytes: chunk_capacity_bytes(memory_bytes, &self.settings),
                in_flight: in_flight_microbatches(
                    self.settings.mode,
                    self.settings.schedule,
                    k,
                    devices.len(),
                    self.settings.microbatches,
                ),
                held: held_at_peaks(
                    self.settings.mode,
                    self.settings.schedule,
                    k,
                    devices.len(),
                    self.settings.microbatches,
                ),
                link_in: (k > 0).then(|| {
                    cluster
                        .link_between(devices[k - 1], device)
                        .unwrap_or((f64::INFINITY, 0.0))
                }),
            });
        }
        Ok(like)
    }

    /// Replaces the cost model's time of the named nodes with measured ones, on every device
    /// kind: for a framework that profiled its own ops. Each value is the node's seconds per
    /// micro-batch as a stage counts it (forward, plus backward in training); nodes not named
    /// keep the roofline estimate.
    ///
    /// Errors with [`Error::UnknownNode`] when a name is not a node of the graph, and with
    /// [`Error::PartitionConfig`] for a negative or non-finite time, or times whose sum is over
    /// [`MAX_TOTAL_SECS`]; the problem is unchanged on error.
    pub fn override_node_secs(&mut self, secs_by_name: &HashMap<String, f64>) -> Result<(), Error> {
        let position: HashMap<&str, usize> =
            self.node_names.singles().map(|(p, n)| (n, p)).collect();
        let mut unknown: Vec<&str> = secs_by_name
            .keys()
            .map(String::as_str)
            .filter(|n| !position.contains_key(n))
            .collect();
        unknown.sort_unstable();
        if let Some(first) = unknown.first() {
            return Err(Error::UnknownNode {
                name: first.to_string(),
                count: unknown.len(),
            });
        }
        let mut updates: Vec<(usize, f64)> = Vec::with_capacity(secs_by_name.len());
        for (name, &secs) in secs_by_name {
            if !secs.is_finite() || secs < 0.0 {
                return Err(Error::PartitionConfig(format!(
                    "the time of node '{name}' must be a finite number of seconds ≥ 0, got {secs}"
                )));
            }
            updates.push((position[name.as_str()], secs));
        }
        // Finite times can still sum to infinity (4 × 1e308): then every stage time, the
        // bottleneck and the plan's figures would be infinite or NaN, which JSON cannot hold.
        // A stage sums a subset of one kind's nodes, so a finite whole-model total per kind
        // keeps every sum the solvers and the plan form finite.
        for table in &self.node_secs {
            let mut total = table.clone();
            for &(p, secs) in &updates {
                total[p] = secs;
            }
            let total: f64 = total.iter().sum();
            if !total.is_finite() || total > MAX_TOTAL_SECS {
                return Err(Error::PartitionConfig(format!(
                    "the node times sum to {total} s per micro-batch, beyond the {MAX_TOTAL_SECS:e} s \
                     pipecut can add up (are they in seconds?)"
                )));
            }
        }
        for table in &mut self.node_secs {
            for &(p, secs) in &updates {
                table[p] = secs;
            }
        }
        Ok(())
    }

    /// Nodes, in the topological order the positions index.
    pub fn order(&self) -> &[NodeId] {
        &self.order
    }

    /// Node names and module scopes by position: the recorded scope path where the exporter
    /// wrote one (torch dynamo), else the name (TorchScript writes scopes into names).
    pub fn node_names(&self) -> &NodeNames {
        &self.node_names
    }

    /// Node module scopes in topological order (what layers are found from).
    pub fn node_scopes(&self) -> Vec<&str> {
        self.node_names.scopes()
    }

    /// The text of a tensor's name ([`Flow::name`], [`ParamUse::name`]).
    pub fn name(&self, id: NameId) -> &str {
        self.node_names.table.get(id)
    }

    /// Adds a name to the problem's table (tests that build flows of their own).
    #[cfg(test)]
    pub(crate) fn add_name(&mut self, name: &str) -> NameId {
        std::sync::Arc::make_mut(&mut self.node_names.table).push(name)
    }

    /// The forward FLOPs of one micro-batch, as [`pipecut_cost::CostModel::model_flops`]
    /// counts them before its mode's backward, where every node's work is known.
    pub fn forward_flops(&self) -> Option<f64> {
        self.forward_flops
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.order.len()
    }

    /// Number of stages.
    pub fn stage_count(&self) -> usize {
        self.stages.len()
    }

    /// The stages' devices.
    pub fn stages(&self) -> &[StageDevice] {
        &self.stages
    }

    /// The cost settings.
    pub fn settings(&self) -> &CostSettings {
        &self.settings
    }

    /// Tensors that may cross boundaries.
    pub fn flows(&self) -> &[Flow] {
        &self.flows
    }

    /// Weights and their readers.
    pub fn params(&self) -> &[ParamUse] {
        &self.params
    }

    /// Time of the node at `position` on the device of `stage`.
    pub fn node_secs(&self, stage: usize, position: usize) -> f64 {
        self.node_secs[self.stages[stage].kind][position]
    }

    /// Peak bytes of stage `stage` holding weights of `params` bytes, and per micro-batch
    /// `received`, `activations` and `weight_inputs` bytes: the weights plus the most it holds
    /// at any of its peak moments ([`StageDevice::held`]). `evaluate` (and so `check`), the
    /// DP and the ideal search cost a stage's memory here; the MILP has a row per moment.
    pub fn peak_bytes(
        &self,
        stage: usize,
        params: u64,
        received: u64,
        activations: u64,
        weight_inputs: u64,
    ) -> u64 {
        let most = self.stages[stage]
            .held
            .iter()
            .map(|h| h.bytes(received, activations, weight_inputs))
            .max()
            .unwrap_or(0);
        params.saturating_add(most)
    }

    /// Pins cuts: each named tensor must cross a stage boundary between its producer and every
    /// reader. Refuses a name that is no tensor flowing between nodes.
    pub fn pin_cuts(&mut self, tensors: &[String]) -> Result<(), Error> {
        for name in tensors {
            let table = &self.node_names.table;
            let flow = self
                .flows
                .iter_mut()
                .find(|f| table.get(f.name) == name)
                .ok_or_else(|| {
                    Error::PartitionConfig(format!(
                        "--pin-cut '{name}': no tensor of that name flows from one node to another"
                    ))
                })?;
            flow.pinned = true;
        }
        Ok(())
    }

    /// The largest end of a segment starting at each position that keeps every pinned tensor's
    /// readers out of its producer's segment: `min` of the first reader of the pinned tensors
    /// made at or after the start (`n` where none). Contiguous segments of the order honour
    /// the pins exactly when each segment `[i, j)` has `j ≤ pin_reach[i]`.
    pub(crate) fn pin_reach(&self) -> Vec<usize> {
        let n = self.node_count();
        let mut first_reader = vec![n; n + 1];
        for flow in self.flows.iter().filter(|f| f.pinned) {
            let reader = flow.consumers.first().map_or(n, |&c| c as usize);
            let at = &mut first_reader[flow.producer as usize];
            *at = (*at).min(reader);
        }
        for i in (0..n).rev() {
            first_reader[i] = first_reader[i].min(first_reader[i + 1]);
        }
        first_reader
    }

    /// Activation bytes of the node at `position`, per micro-batch.
    pub fn activation_bytes(&self, position: usize) -> u64 {
        self.activation_bytes[position]
    }

    /// What the weight gradient of the node at `position` reads per micro-batch, kept from a
    /// micro-batch's B to its W under ZB-H1 (0 under the other schedules, which keep nothing
    /// apart).
    pub fn weight_input_bytes(&self, position: usize) -> u64 {
        self.weight_input_bytes[position]
    }

    /// Time to receive `bytes` in `messages` tensors over the link into `stage`.
    pub fn receive_secs(&self, stage: usize, messages: usize, bytes: u64) -> f64 {
        match self.stages[stage].link_in {
            None => 0.0,
            Some((bandwidth, latency)) if messages > 0 => {
                messages as f64 * latency + bytes as f64 / bandwidth
            }
            Some(_) => 0.0,
        }
    }

    /// The lower bound of DESIGN.md, valid for every convex assignment: no stage can be faster
    /// than the average work per stage nor than the slowest single node (each node on its
    /// fastest device kind; communication ignored).
    pub fn lower_bound_secs(&self) -> f64 {
        let fastest: Vec<f64> = (0..self.node_count())
            .map(|p| {
                self.node_secs
                    .iter()
                    .map(|secs| secs[p])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let total: f64 = fastest.iter().sum();
        let largest = fastest.iter().copied().fold(0.0, f64::max);
        (total / self.stage_count() as f64).max(largest)
    }

    /// Checks that `stage_of` (one stage per position) is a valid assignment: every stage used,
    /// every stage index in range, every edge going to the same or a later stage.
    pub fn check_assignment(&self, stage_of: &[StageId]) -> Result<(), Error> {
        let bad = |detail: String| Err(Error::InvalidPlan(detail));
        if stage_of.len() != self.node_count() {
            return bad(format!(
                "{} nodes assigned, the model has {}",
                stage_of.len(),
                self.node_count()
            ));
        }
        let mut used = vec![false; self.stage_count()];
        for (p, s) in stage_of.iter().enumerate() {
            match used.get_mut(s.index()) {
                Some(u) => *u = true,
                None => {
                    return bad(format!(
                        "node '{}' is on stage {} but there are {} stages",
                        self.node_names.name(p),
                        s.0,
                        self.stage_count()
                    ))
                }
            }
        }
        if let Some(empty) = used.iter().position(|u| !u) {
            return bad(format!("stage {empty} has no nodes"));
        }
        for flow in &self.flows {
            let from = stage_of[flow.producer as usize];
            for &c in &flow.consumers {
                let to = stage_of[c as usize];
                if flow.pinned && to == from {
                    return bad(format!(
                        "tensor '{}' stays on stage {} from node '{}' to node '{}', but a cut is pinned there (--pin-cut)",
                        self.name(flow.name), from.0, self.node_names.name(flow.producer as usize),
                        self.node_names.name(c as usize)
                    ));
                }
                if to < from {
                    return bad(format!(
                        "tensor '{}' goes backwards from node '{}' on stage {} to node '{}' on stage {}: stages must be convex and ordered",
                        self.name(flow.name), self.node_names.name(flow.producer as usize), from.0,
                        self.node_names.name(c as usize), to.0
                    ));
                }
            }
        }
        Ok(())
    }

    /// Time and memory of every stage of a valid assignment (see [`Self::check_assignment`]).
    ///
    /// # Complexity
    /// O(n + Σ flows' consumers + Σ params' uses).
    pub fn evaluate(&self, stage_of: &[StageId]) -> Evaluation {
        let k = self.stage_count();
        let mut stages: Vec<StageFigures> = self
            .stages
            .iter()
            .map(|s| StageFigures {
                node_count: 0,
                compute_secs: 0.0,
                receive_secs: 0.0,
                gradient_receive_secs: 0.0,
                stage_secs: 0.0,
                param_bytes: 0,
                activation_bytes: 0,
                weight_input_bytes: 0,
                received_bytes: 0,
                in_flight: s.in_flight,
                peak_memory_bytes: 0,
                capacity_bytes: s.capacity_bytes,
                received_flows: Vec::new(),
            })
            .collect();
        for (p, s) in stage_of.iter().enumerate() {
            let stage = &mut stages[s.index()];
            stage.node_count += 1;
            stage.compute_secs += self.node_secs(s.index(), p);
            stage.activation_bytes += self.activation_bytes[p];
            stage.weight_input_bytes += self.weight_input_bytes[p];
        }
        for param in &self.params {
            let mut holders: Vec<usize> = param
                .uses
                .iter()
                .map(|&u| stage_of[u as usize].index())
                .collect();
            holders.sort_unstable();
            holders.dedup();
            for h in holders {
                stages[h].param_bytes += param.footprint_bytes;
            }
        }
        // Relay: a flow is received by every stage after its producer's, up to its last reader's.
        let mut messages = vec![0usize; k];
        for (index, flow) in self.flows.iter().enumerate() {
            let from = stage_of[flow.producer as usize].index();
            let last = flow
                .consumers
                .iter()
                .map(|&c| stage_of[c as usize].index())
                .max()
                .unwrap_or(from);
            for stage in stages.iter_mut().take(last + 1).skip(from + 1) {
                stage.received_bytes += flow.bytes;
                stage.received_flows.push(index as u32);
            }
            for m in messages.iter_mut().take(last + 1).skip(from + 1) {
                *m += 1;
            }
        }
        let training = matches!(self.settings.mode, Mode::Training { .. });
        for s in 0..k {
            stages[s].receive_secs = self.receive_secs(s, messages[s], stages[s].received_bytes);
        }
        for s in 0..k {
            if training && s + 1 < k {
                stages[s].gradient_receive_secs =
                    self.receive_secs(s + 1, messages[s + 1], stages[s + 1].received_bytes);
            }
            let peak_memory_bytes = self.peak_bytes(
                s,
                stages[s].param_bytes,
                stages[s].received_bytes,
                stages[s].activation_bytes,
                stages[s].weight_input_bytes,
            );
            let stage = &mut stages[s];
            stage.stage_secs =
                stage.compute_secs + stage.receive_secs + stage.gradient_receive_secs;
            stage.peak_memory_bytes = peak_memory_bytes;
        }
        let bottleneck_secs = stages.iter().map(|s| s.stage_secs).fold(0.0, f64::max);
        let cut_bytes = stages.iter().map(|s| s.received_bytes).sum();
        Evaluation {
            stages,
            bottleneck_secs,
            cut_bytes,
        }
    }

    /// The assignment of contiguous segments of the order: stage `s` takes positions
    /// `starts[s]..starts[s + 1]` (with `starts[0] = 0` and an implicit end at `n`).
    pub fn contiguous_assignment(&self, starts: &[usize]) -> Vec<StageId> {
        let mut stage_of = Vec::with_capacity(self.node_count());
        for (s, &start) in starts.iter().enumerate() {
            let end = starts.get(s + 1).copied().unwrap_or(self.node_count());
            stage_of.extend(std::iter::repeat_n(StageId(s as u32), end - start));
        }
        stage_of
    }
}

/// Per position, what the weight gradient of a node that reads a weight needs once its input
/// gradient is done ([`node_weight_inputs`]); 0 for the other nodes.
fn weight_gradient_inputs(graph: &Graph, order: &[NodeId]) -> Result<Vec<u64>, Error> {
    let derived = weight_derived(graph, order);
    let mut bytes = vec![0u64; order.len()];
    for (p, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let reads_weight = node
            .inputs
            .iter()
            .flatten()
            .chain(&node.captures)
            .any(|&t| derived[t.index()]);
        if reads_weight && !node.outputs.iter().flatten().all(|&t| derived[t.index()]) {
            bytes[p] = node_weight_inputs(graph, id, &derived, |t, _| tensor_bytes(graph, t))?;
        }
    }
    Ok(bytes)
}

/// Per tensor index, whether it is a weight or made from weights alone (a tied weight's
/// Transpose, a Cast to the compute type, constants aside): a linear reading it reads a weight,
/// whose gradient W computes, and W keeps nothing per micro-batch for it.
pub(crate) fn weight_derived(graph: &Graph, order: &[NodeId]) -> Vec<bool> {
    let mut derived = vec![
        false;
        graph
            .tensors()
            .map(|(t, _)| t.index() + 1)
            .max()
            .unwrap_or(0)
    ];
    for (t, tensor) in graph.tensors() {
        derived[t.index()] = matches!(tensor.origin, TensorOrigin::Parameter(_));
    }
    for &id in order {
        let node = graph.node(id);
        let inputs: Vec<_> = node.inputs.iter().flatten().chain(&node.captures).collect();
        // Constants (made by nodes that read nothing) neither make nor break it.
        let constant = |t: &TensorId| match graph.tensor(*t).origin {
            TensorOrigin::Node { node, .. } => graph.node(node).inputs.iter().all(Option::is_none),
            _ => false,
        };
        let from_weights = inputs.iter().any(|t| derived[t.index()])
            && inputs.iter().all(|t| derived[t.index()] || constant(t));
        if from_weights {
            for &t in node.outputs.iter().flatten() {
                derived[t.index()] = true;
            }
        }
    }
    derived
}

/// What the weight gradient of node `id` reads, with `size(tensor, is_output)` the bytes of
/// each: its inputs made by nodes from activations (dW = f(inputs, dY), as for MatMul, Gemm,
/// Conv or a norm's scale; weights and what is made from them alone are held anyway, and graph
/// inputs come from the host, free here as in every other charge) and its outputs' gradients,
/// each the size of its output. Each input counts once per node; one read by several nodes
/// counts at each, which can only overstate.
pub(crate) fn node_weight_inputs(
    graph: &Graph,
    id: NodeId,
    derived: &[bool],
    size: impl Fn(TensorId, bool) -> Result<u64, Error>,
) -> Result<u64, Error> {
    let node = graph.node(id);
    let mut read: Vec<TensorId> = node
        .inputs
        .iter()
        .flatten()
        .chain(&node.captures)
        .copied()
        .filter(|&t| {
            !derived[t.index()] && matches!(graph.tensor(t).origin, TensorOrigin::Node { .. })
        })
        .collect();
    read.sort_unstable();
    read.dedup();
    let mut bytes = 0u64;
    for t in read {
        bytes = bytes.saturating_add(size(t, false)?);
    }
    for &t in node.outputs.iter().flatten() {
        bytes = bytes.saturating_add(size(t, true)?);
    }
    Ok(bytes)
}

/// The problem's names and tensors, read from the graph in one pass: each position's name and
/// scope, its activation bytes, the weights and the flows between positions.
struct TensorTables {
    table: NameTable,
    names: Vec<NameId>,
    scopes: Vec<NameId>,
    activation_bytes: Vec<u64>,
    node_params: Vec<Positions>,
    params: Vec<ParamUse>,
    flows: Vec<Flow>,
}

impl TensorTables {
    fn new(
        graph: &Graph,
        order: &[NodeId],
        position_of_index: &[u32],
        mode: Mode,
    ) -> Result<TensorTables, Error> {
        let position = |id: &NodeId| position_of_index[id.index()];
        // Every name in one buffer: a node's scope is its name unless the exporter recorded one.
        // Room for 64 bytes a name, so that the text is never moved as it grows (pages never
        // written are never touched).
        let most = order.len() * 2 + graph.tensors().size_hint().0;
        let mut table = NameTable::with_capacity(most, most * 64);
        let mut names = Vec::with_capacity(order.len());
        let mut scopes = Vec::with_capacity(order.len());
        for &id in order {
            let node = graph.node(id);
            let name = table.push(&node.name);
            names.push(name);
            scopes.push(match &node.module_scope {
                Some(scope) => table.push(scope),
                None => name,
            });
        }
        let mut activation_bytes = vec![0u64; order.len()];
        let mut node_params = vec![Positions::new(); order.len()];
        let mut params = Vec::new();
        let mut flows = Vec::with_capacity(graph.tensors().size_hint().0);
        for (tensor_id, tensor) in graph.tensors() {
            let mut consumers: Positions = tensor.consumers.iter().map(position).collect();
            consumers.sort_unstable();
            consumers.dedup();
            match &tensor.origin {
                TensorOrigin::GraphInput => {}
                TensorOrigin::Parameter(_) => {
                    if consumers.is_empty() {
                        continue;
                    }
                    let index = params.len() as u32;
                    for &c in &consumers {
                        node_params[c as usize].push(index);
                    }
                    params.push(ParamUse {
                        name: table.push(&tensor.name),
                        footprint_bytes: param_footprint_bytes(graph, tensor_id, mode),
                        elements: tensor
                            .shape
                            .iter()
                            .flatten()
                            .filter_map(|d| d.known())
                            .product(),
                        uses: consumers,
                        shards: 1,
                    });
                }
                TensorOrigin::Node { node, .. } => {
                    let producer = position(node);
                    let bytes = tensor_bytes(graph, tensor_id)?;
                    activation_bytes[producer as usize] += bytes;
                    if !consumers.is_empty() {
                        flows.push(Flow {
                            name: table.push(&tensor.name),
                            bytes,
                            producer,
                            consumers,
                            pinned: false,
                        });
                    }
                }
            }
        }
        Ok(TensorTables {
            table,
            names,
            scopes,
            activation_bytes,
            node_params,
            params,
            flows,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pipecut_cost::Catalog;
    use pipecut_ir::graph::{DType, Dim, NodeSpec, Param, Storage};

    /// The problem of a chain of `n` 64-wide MatMuls (batch 8) on two H100s.
    pub(crate) fn two_stage_chain(n: usize) -> PartitionProblem {
        let graph = chain(n, 64, 8);
        let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..2).map(DeviceId).collect();
        PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    /// A chain of `n` MatMuls with `width`-wide fp16 weights, batch `rows`.
    pub(crate) fn chain(n: usize, width: u64, rows: u64) -> Graph {
        let mut b = Graph::builder("chain");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F16),
            Some(vec![Dim::Known(rows), Dim::Known(width)]),
        )
        .unwrap();
        let mut prev = "x".to_string();
        for i in 0..n {
            let w = format!("w{i}");
            let param = Param {
                bytes: width * width * 2,
                storage: Storage::Declared,
            };
            b.parameter(&w, DType::F16, &[width, width], param, None)
                .unwrap();
            let out = format!("h{i}");
            let name = format!("/layers.{i}/MatMul");
            b.node(NodeSpec::new(&name, "MatMul", &[&prev, &w], &[&out]))
                .unwrap();
            prev = out;
        }
        b.output(&prev);
        let mut g = b.build().unwrap();
        pipecut_ir::onnx::shape::ShapeInference::new(Default::default())
            .run(&mut g)
            .unwrap();
        g
    }

    #[test]
    fn costing_in_parts_on_threads_gives_the_times_of_one_pass() {
        use pipecut_cost::model::per_node_in_parts;
        let graph = chain(23, 256, 64);
        let cluster = Cluster::parse("1x1xH100-SXM", &Catalog::builtin()).unwrap();
        let model = CostModel::new(cluster.device(DeviceId(0)));
        let order = graph.topological_order().to_vec();
        let time = |id| model.node_time_secs(&graph, id);
        let whole = per_node_in_parts(&graph, &order, order.len(), time).unwrap();
        let one_by_one: Vec<f64> = order
            .iter()
            .map(|&id| model.node_cost(&graph, id).unwrap().time_secs)
            .collect();
        assert_eq!(whole, one_by_one);
        for per_thread in [1, 4, 7, 22] {
            let parts = per_node_in_parts(&graph, &order, per_thread, time).unwrap();
            assert_eq!(parts, whole, "{per_thread} nodes a thread");
        }
    }

    #[test]
    fn the_problem_counts_the_model_flops_the_mfu_line_would_count_again() {
        // Two device kinds: the FLOPs come from the first one's costing and match a separate
        // pass (`model_flops`, device-independent) bit for bit, in both modes.
        let graph = chain(9, 256, 64);
        let cluster = Cluster::from_device_list("A100-80GB,L4", &Catalog::builtin()).unwrap();
        let devices = [DeviceId(0), DeviceId(1)];
        for mode in [Mode::Inference, Mode::training()] {
            let settings = CostSettings {
                mode,
                ..CostSettings::default()
            };
            let problem = PartitionProblem::new(&graph, &cluster, &devices, settings).unwrap();
            let model = CostModel::new(cluster.device(DeviceId(1))).with_mode(mode);
            let forward = problem.forward_flops().expect("every node has a rule");
            assert!(forward > 0.0);
            assert_eq!(
                model.pass_flops(forward),
                model.model_flops(&graph).unwrap()
            );
        }
    }

    #[test]
    fn a_balanced_chain_splits_its_time_evenly() {
        let graph = chain(8, 1024, 512);
        let cluster = Cluster::parse("1x4xH100-SXM", &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..4).map(DeviceId).collect();
        let problem =
            PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap();
        let stage_of = problem.contiguous_assignment(&[0, 2, 4, 6]);
        problem.check_assignment(&stage_of).unwrap();
        let eval = problem.evaluate(&stage_of);
        let compute = eval.stages[0].compute_secs;
        for stage in &eval.stages {
            assert!((stage.compute_secs - compute).abs() < 1e-12);
        }
        // Each boundary carries one 512×1024 fp16 activation.
        assert_eq!(eval.stages[1].received_bytes, 512 * 1024 * 2);
        assert_eq!(eval.cut_bytes, 3 * 512 * 1024 * 2);
        assert_eq!(eval.stages[0].param_bytes, 2 * 1024 * 1024 * 2);
        let (bandwidth, latency) = problem.stages[1].link_in.unwrap();
        let receive = latency + (512.0 * 1024.0 * 2.0) / bandwidth;
        assert!((eval.stages[1].receive_secs - receive).abs() < 1e-15);
        assert!((eval.bottleneck_secs - (compute + receive)).abs() < 1e-15);
        assert!(problem.lower_bound_secs() <= eval.bottleneck_secs);
    }

    #[test]
    fn measured_node_times_replace_the_roofline_and_unknown_names_are_refused() {
        let graph = chain(4, 64, 8);
        let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
        let devices = [DeviceId(0), DeviceId(1)];
        let mut problem =
            PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap();
        let before = problem.node_secs(0, 1);
        let measured = HashMap::from([("/layers.2/MatMul".to_string(), 0.25)]);
        problem.override_node_secs(&measured).unwrap();
        assert_eq!(problem.node_secs(0, 2), 0.25);
        assert_eq!(problem.node_secs(1, 2), 0.25);
        assert_eq!(problem.node_secs(0, 1), before);
        let eval = problem.evaluate(&problem.contiguous_assignment(&[0, 2]));
        assert!(eval.bottleneck_secs >= 0.25);

        let typo = HashMap::from([
            ("/layers.9/MatMul".to_string(), 0.1),
            ("/layers.0/MatMul".to_string(), 0.1),
        ]);
        let err = problem.override_node_secs(&typo).unwrap_err();
        assert!(err.to_string().contains("'/layers.9/MatMul'"), "{err}");
        assert_eq!(problem.node_secs(0, 0), before, "unchanged on error");
        let negative = HashMap::from([("/layers.0/MatMul".to_string(), -1.0)]);
        let err = problem.override_node_secs(&negative).unwrap_err();
        assert!(err.to_string().contains("≥ 0"), "{err}");
        // Each finite, but their sum is not: refused, and the problem unchanged.
        let huge: HashMap<String, f64> = (0..4)
            .map(|p| (problem.node_names.name(p).into_owned(), 1e308))
            .collect();
        let err = problem.override_node_secs(&huge).unwrap_err();
        assert!(err.to_string().contains("sum to inf"), "{err}");
        assert_eq!(problem.node_secs(0, 0), before, "unchanged on error");
    }

    #[test]
    fn backward_edges_and_empty_stages_are_refused() {
        let graph = chain(4, 64, 8);
        let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
        let problem = PartitionProblem::new(
            &graph,
            &cluster,
            &[DeviceId(0), DeviceId(1)],
            CostSettings::default(),
        )
        .unwrap();
        let s = |v: &[u32]| v.iter().map(|&x| StageId(x)).collect::<Vec<_>>();
        let err = problem.check_assignment(&s(&[0, 1, 0, 1])).unwrap_err();
        assert!(err.to_string().contains("convex"), "{err}");
        let err = problem.check_assignment(&s(&[0, 0, 0, 0])).unwrap_err();
        assert!(err.to_string().contains("stage 1 has no nodes"), "{err}");
        let err = problem.check_assignment(&s(&[0, 0, 2, 1])).unwrap_err();
        assert!(err.to_string().contains("2 stages"), "{err}");
    }
}
