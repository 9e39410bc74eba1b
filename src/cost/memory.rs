//! Memory: what a stage must hold. Parameters (and in training their gradients and optimizer
//! state), the activations of the micro-batches in flight under the pipeline schedule, received
//! tensors, and the largest temporary workspace.
//!
//! The partitioner calls [`stage_peak_bytes`] for every candidate stage, so the formula lives in
//! one place.

use serde::{Deserialize, Serialize};

use super::model::Mode;
use crate::graph::{Graph, TensorId};

/// Pipeline schedules whose activation memory the model knows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    Default,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019): every micro-batch's activations
    /// stay until its backward.
    GPipe,
    /// One-forward-one-backward (Narayanan et al. 2019, PipeDream-Flush): stage k of K starts
    /// backwards after K − k forwards, so it keeps at most K − k micro-batches.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Schedule, String> {
        match s.to_ascii_lowercase().as_str() {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" | "onefoneb" => Ok(Schedule::OneFOneB),
            other => Err(format!(
                "unknown schedule '{other}' (expected gpipe or 1f1b)"
            )),
        }
    }
}

/// Activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
/// Cost"; Megatron-LM's `--recompute-granularity full`): a stage keeps only the tensors it
/// received for each micro-batch in flight and runs the forward again before the backward, so
/// it holds one micro-batch's activations at a time for one more forward's compute. Selective
/// recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
/// Transformer Models", § 4.2; `--recompute-granularity selective`) drops only attention's
/// score tensors (the s × s products, their scaling, masking and softmax), the largest
/// activations for the least compute, and recomputes them before the backward.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation of every micro-batch in flight.
    #[default]
    None,
    /// Keep all but attention's score tensors; recompute those in the backward.
    Selective,
    /// Keep the stage's inputs; recompute the rest in the backward.
    Full,
}

impl Recompute {
    /// Whether this is no recomputation (serde's `skip_serializing_if`).
    pub fn is_none(&self) -> bool {
        *self == Recompute::None
    }

    /// Whole forward passes run again per backward (selective recomputation reruns only some
    /// nodes: the partition problem adds their time node by node).
    pub fn extra_forwards(self) -> f64 {
        match self {
            Recompute::None | Recompute::Selective => 0.0,
            Recompute::Full => 1.0,
        }
    }

    /// Micro-batches whose activations a stage holds when `in_flight` are in flight.
    pub fn activation_in_flight(self, in_flight: u64) -> u64 {
        match self {
            Recompute::None | Recompute::Selective => in_flight,
            Recompute::Full => in_flight.min(1),
        }
    }
}

impl std::str::FromStr for Recompute {
    type Err = String;
    fn from_str(s: &str) -> Result<Recompute, String> {
        match s {
            "none" => Ok(Recompute::None),
            "selective" => Ok(Recompute::Selective),
            "full" => Ok(Recompute::Full),
            other => Err(format!(
                "unknown recomputation '{other}' (expected none, selective or full)"
            )),
        }
    }
}

/// ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
/// Parameter Models"): stage 1 shards the optimizer state over the `group` data-parallel
/// replicas of a stage, stage 2 also the gradients, stage 3 also the weights. Stages 1 and 2
/// replace the gradient all-reduce by a reduce-scatter and an all-gather of the same volume;
/// stage 3 also all-gathers the weights before the forward and again before the backward,
/// 1.5 times the all-reduce's volume (the paper's 3Ψ against 2Ψ).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct ZeroSharding {
    /// 0 (none), 1, 2 or 3.
    pub stage: u8,
    /// Replicas the state is sharded over: the data-parallel degree.
    pub group: u32,
}

impl Default for ZeroSharding {
    fn default() -> Self {
        ZeroSharding::NONE
    }
}

impl ZeroSharding {
    /// No sharding.
    pub const NONE: ZeroSharding = ZeroSharding { stage: 0, group: 1 };

    /// Whether nothing is sharded (serde's `skip_serializing_if`).
    pub fn is_none(&self) -> bool {
        self.stage == 0 || self.group <= 1
    }

    /// The gradient synchronisation's volume as a multiple of a plain all-reduce's.
    pub fn communication_factor(self) -> f64 {
        if self.stage >= 3 && self.group > 1 {
            1.5
        } else {
            1.0
        }
    }

    /// Bytes one replica holds of a weight of `weight` bytes, its gradient of as many, and
    /// `optimizer` bytes of optimizer state.
    pub fn held_bytes(self, weight: u64, optimizer: u64) -> u64 {
        let g = u64::from(self.group.max(1));
        let shard = |bytes: u64| bytes.div_ceil(g);
        match self.stage {
            0 => weight + weight + optimizer,
            1 => weight + weight + shard(optimizer),
            2 => weight + shard(weight + optimizer),
            _ => shard(weight + weight + optimizer),
        }
    }
}

/// Micro-batches whose activations stage `stage` (0-based) of `stages` holds at its peak.
/// Inference keeps none for a backward pass: one micro-batch is being computed at a time.
pub fn in_flight_microbatches(
    mode: Mode,
    schedule: Schedule,
    stage: usize,
    stages: usize,
    microbatches: u32,
) -> u64 {
    let m = microbatches.max(1) as u64;
    match (mode, schedule) {
        (Mode::Inference, _) => 1,
        (Mode::Training { .. }, Schedule::GPipe) => m,
        (Mode::Training { .. }, Schedule::OneFOneB) => {
            (stages.saturating_sub(stage) as u64).clamp(1, m)
        }
    }
}

/// Bytes a parameter needs on its stage: the weight, plus in training its gradient (same type)
/// and the optimizer state per element, each divided over the data-parallel group as far as
/// the mode's ZeRO stage shards it.
pub fn param_footprint_bytes(graph: &Graph, param: TensorId, mode: Mode) -> u64 {
    let tensor = graph.tensor(param);
    let bytes = tensor.param().map_or(0, |p| p.bytes);
    match mode {
        Mode::Inference => bytes,
        Mode::Training {
            optimizer_bytes_per_param,
            zero,
            ..
        } => {
            let elements: u64 = tensor
                .shape
                .iter()
                .flatten()
                .filter_map(|d| d.known())
                .product();
            zero.held_bytes(bytes, (elements as f64 * optimizer_bytes_per_param) as u64)
        }
    }
}

/// What one stage holds, before the schedule multiplies the per-micro-batch part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StageMemory {
    /// Parameters with, in training, their gradients and optimizer state.
    pub param_footprint_bytes: u64,
    /// Activations the stage's nodes produce per micro-batch.
    pub activation_bytes: u64,
    /// Tensors received from earlier stages per micro-batch.
    pub received_bytes: u64,
    /// Largest temporary buffer of any node.
    pub workspace_bytes: u64,
}

/// Peak bytes of a stage: `params + in_flight · (activations + received) + workspace`.
pub fn stage_peak_bytes(memory: &StageMemory, in_flight: u64) -> u64 {
    memory
        .param_footprint_bytes
        .saturating_add(
            in_flight.saturating_mul(
                memory
                    .activation_bytes
                    .saturating_add(memory.received_bytes),
            ),
        )
        .saturating_add(memory.workspace_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_stage_memory_matches_a_hand_count() {
        // Stage 1 of 4 under 1F1B with 8 micro-batches keeps 4 − 1 = 3 in flight.
        let training = Mode::training();
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 1, 4, 8),
            3
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 3, 4, 8),
            1
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 0, 4, 2),
            2
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::GPipe, 3, 4, 8),
            8
        );
        assert_eq!(
            in_flight_microbatches(Mode::Inference, Schedule::GPipe, 0, 4, 8),
            1
        );
        // 1 GiB of fp16 weights: + 1 GiB gradients + 6 GiB Adam state (12 B per element).
        // Activations 100 MiB and received 10 MiB per micro-batch, 3 in flight, 50 MiB workspace.
        let mib = 1u64 << 20;
        let memory = StageMemory {
            param_footprint_bytes: 1024 * mib + 1024 * mib + 6 * 1024 * mib,
            activation_bytes: 100 * mib,
            received_bytes: 10 * mib,
            workspace_bytes: 50 * mib,
        };
        assert_eq!(stage_peak_bytes(&memory, 3), (8192 + 330 + 50) * mib);
    }

    #[test]
    fn zero_stages_shard_what_the_paper_says() {
        // ZeRO paper, Figure 1: Ψ = 7.5B parameters, fp16 weights and gradients (2Ψ bytes each),
        // K = 12 bytes of Adam state per parameter, N_d = 64: 120 GB baseline, 31.4 GB with
        // P_os, 16.6 GB with P_os+g, 1.9 GB with P_os+g+p.
        let psi = 7_500_000_000u64;
        let (weight, optimizer) = (2 * psi, 12 * psi);
        let held = |stage| ZeroSharding { stage, group: 64 }.held_bytes(weight, optimizer);
        let gb = |bytes: u64| bytes as f64 / 1e9;
        assert_eq!(gb(held(0)), 120.0);
        assert!((gb(held(1)) - 31.4).abs() < 0.05, "{}", gb(held(1)));
        assert!((gb(held(2)) - 16.6).abs() < 0.05, "{}", gb(held(2)));
        assert!((gb(held(3)) - 1.9).abs() < 0.05, "{}", gb(held(3)));
        // One replica shards nothing.
        let alone = ZeroSharding { stage: 3, group: 1 };
        assert_eq!(alone.held_bytes(weight, optimizer), held(0));
        assert!(alone.is_none() && ZeroSharding::NONE.is_none());
        assert_eq!(
            ZeroSharding { stage: 3, group: 8 }.communication_factor(),
            1.5
        );
        assert_eq!(
            ZeroSharding { stage: 2, group: 8 }.communication_factor(),
            1.0
        );
    }

    #[test]
    fn full_recomputation_keeps_one_micro_batch_of_activations_for_one_more_forward() {
        assert_eq!(Recompute::Full.activation_in_flight(7), 1);
        assert_eq!(Recompute::None.activation_in_flight(7), 7);
        let recomputed =
            Mode::training().with_memory_techniques(Recompute::Full, ZeroSharding::NONE);
        assert_eq!(Mode::training().backward_time_factor(), 2.0);
        assert_eq!(recomputed.backward_time_factor(), 3.0);
        assert_eq!(
            Mode::Inference.with_memory_techniques(Recompute::Full, ZeroSharding::NONE),
            Mode::Inference
        );
        assert_eq!("full".parse::<Recompute>(), Ok(Recompute::Full));
        assert_eq!("selective".parse::<Recompute>(), Ok(Recompute::Selective));
        // Selective recomputation keeps every micro-batch in flight, less its scores.
        assert_eq!(Recompute::Selective.activation_in_flight(7), 7);
        assert!(Recompute::None < Recompute::Selective && Recompute::Selective < Recompute::Full);
        assert!("some".parse::<Recompute>().is_err());
    }
}
