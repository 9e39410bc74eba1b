//! What is being costed: inference or training, and training's memory techniques
//! (activation recomputation, ZeRO sharding). The roofline ([`crate::model`]) reads the
//! backward's share of the time from it, the memory formula ([`crate::memory`]) what a stage
//! holds.

use serde::{Deserialize, Serialize};

use crate::kept::MemoryModel;

/// Inference or training, with the training-only parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// Forward passes only.
    Inference,
    /// Forward and backward passes, with gradients and optimizer state.
    Training {
        /// Backward FLOPs as a multiple of forward FLOPs. 2.0: the backward pass of a linear
        /// layer computes two products (input and weight gradients) for the forward's one
        /// (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", C ≈ 6N per token).
        backward_factor: f64,
        /// Optimizer state per parameter element, bytes. 12.0: Adam in mixed precision keeps an
        /// fp32 master copy plus fp32 first and second moments (Rajbhandari et al. 2020, ZeRO).
        optimizer_bytes_per_param: f64,
        /// Activation recomputation: what a stage keeps of each micro-batch in flight, and the
        /// forward it runs again before each backward. Absent in older plans: none.
        #[serde(default, skip_serializing_if = "Recompute::is_none")]
        recompute: Recompute,
        /// ZeRO sharding of optimizer state, gradients and weights over the data-parallel
        /// group. Absent in older plans: none.
        #[serde(default, skip_serializing_if = "ZeroSharding::is_none")]
        zero: ZeroSharding,
        /// Which engine's way of keeping activations the memory is counted by. Absent in older
        /// plans, and written only when not `onnx`: every exported intermediate.
        #[serde(default, skip_serializing_if = "MemoryModel::is_onnx")]
        memory_model: MemoryModel,
    },
}

impl Mode {
    /// Training with the defaults above, no recomputation and no sharding.
    pub fn training() -> Mode {
        Mode::Training {
            backward_factor: 2.0,
            optimizer_bytes_per_param: 12.0,
            recompute: Recompute::None,
            zero: ZeroSharding::NONE,
            memory_model: MemoryModel::Onnx,
        }
    }

    /// Backward-pass time as a multiple of the forward's: the backward FLOPs, plus one forward
    /// again under full recomputation (Chen et al. 2016). Model FLOPs (MFU) leave it out.
    pub fn backward_time_factor(self) -> f64 {
        match self {
            Mode::Inference => 0.0,
            Mode::Training {
                backward_factor,
                recompute,
                ..
            } => backward_factor + recompute.extra_forwards(),
        }
    }

    /// This mode with `recompute` and `zero` (training only; inference is returned as is).
    pub fn with_memory_techniques(self, recompute: Recompute, zero: ZeroSharding) -> Mode {
        match self {
            Mode::Inference => Mode::Inference,
            Mode::Training {
                backward_factor,
                optimizer_bytes_per_param,
                memory_model,
                ..
            } => Mode::Training {
                backward_factor,
                optimizer_bytes_per_param,
                recompute,
                zero,
                memory_model,
            },
        }
    }

    /// This mode counting activations as `memory_model`'s engine keeps them (training only).
    pub fn with_memory_model(self, memory_model: MemoryModel) -> Mode {
        match self {
            Mode::Inference => Mode::Inference,
            Mode::Training {
                backward_factor,
                optimizer_bytes_per_param,
                recompute,
                zero,
                ..
            } => Mode::Training {
                backward_factor,
                optimizer_bytes_per_param,
                recompute,
                zero,
                memory_model,
            },
        }
    }

    /// The memory model activations are counted by: the training one, `onnx` in inference
    /// (a forward alone keeps nothing for a backward; every output is counted as before).
    pub fn memory_model(self) -> MemoryModel {
        match self {
            Mode::Inference => MemoryModel::Onnx,
            Mode::Training { memory_model, .. } => memory_model,
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
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

    /// The sharding whose [`Self::held_bytes`] a stage of a pipeline of `stages` holds.
    /// ZeRO-3 gathers a layer's weights before its forward and its backward; a pipeline stage
    /// runs m of each per step, and gathering them each time (FSDP2's default inside
    /// torch.distributed.pipelining) would move 2m times the weights where the step is charged
    /// 1.5 all-reduces. What the step is charged is what keeping the weights gathered for the
    /// whole step costs (torchtitan's pipeline + FSDP2 sets `reshard_after_forward=False`):
    /// whole weights, gradients and optimizer state sharded, ZeRO-2's footprint.
    pub fn held_in_pipeline(self, stages: usize) -> ZeroSharding {
        match self.stage {
            3 if stages > 1 => ZeroSharding { stage: 2, ..self },
            _ => self,
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // Inside a pipeline ZeRO-3 keeps the weights gathered: ZeRO-2's footprint.
        let zero3 = ZeroSharding {
            stage: 3,
            group: 64,
        };
        assert_eq!(
            zero3.held_in_pipeline(8).held_bytes(weight, optimizer),
            held(2)
        );
        assert_eq!(zero3.held_in_pipeline(1), zero3);
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
