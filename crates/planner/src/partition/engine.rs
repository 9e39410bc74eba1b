//! The engines a cluster plan is made for, and which parallel configurations each runs as
//! pipecut costs them: the search considers only those (`plan-cluster --engine`), the plan
//! records the engine, and `check` refuses a configuration its engine cannot run.
//!
//! * **pipecut**: its own runtime and export run every configuration the search costs.
//! * **torch** (torch.distributed.pipelining with FSDP2 and DTensor tensor parallelism, as
//!   torchtitan composes them): every schedule of `torch.distributed.pipelining`; data
//!   parallelism as DDP (ZeRO-0) or FSDP2, which shards gradients with the optimizer state:
//!   `reshard_after_forward=False` is ZeRO-2, `True` ZeRO-3. Inside a pipeline ZeRO-3 is
//!   charged its weights kept gathered for the step (torchtitan's setting for pipelines; see
//!   [`pipecut_cost::ZeroSharding::held_in_pipeline`]), not gathered per micro-batch. FSDP2
//!   has no stage that shards the optimizer state alone, so no ZeRO-1.
//! * **megatron** (Megatron-LM): 1F1B or the interleaved schedule (no GPipe, no zero-bubble);
//!   its distributed optimizer shards the optimizer state only (ZeRO-1; each rank keeps whole
//!   gradients); its FSDP2 path is ZeRO-3 without a pipeline ("not currently working with
//!   Pipeline Parallel", `--use-torch-fsdp2` in `megatron/training/arguments.py`).
//! * **deepspeed** (DeepSpeed's `PipelineModule`): its own 1F1B-like schedule, ZeRO stage 0 or 1
//!   in a pipeline (every stage without one), no tensor parallelism (that comes from Megatron's
//!   layers), and activation checkpointing of whole layers (full recomputation, not selective).

use serde::{Deserialize, Serialize};

use pipecut_cost::{Recompute, Schedule};

use super::parallelism::ConfigurationKey;

/// Which engine runs the plan.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// pipecut's own runtime and per-stage export: every configuration.
    #[default]
    Pipecut,
    /// torch.distributed.pipelining with FSDP2 and tensor parallelism.
    Torch,
    /// Megatron-LM.
    Megatron,
    /// DeepSpeed's pipeline engine.
    Deepspeed,
}

impl Engine {
    /// The name `--engine` takes and prints.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Pipecut => "pipecut",
            Engine::Torch => "torch",
            Engine::Megatron => "megatron",
            Engine::Deepspeed => "deepspeed",
        }
    }

    /// Whether this is pipecut's own (serde's `skip_serializing_if`).
    pub fn is_pipecut(&self) -> bool {
        *self == Engine::Pipecut
    }

    /// Why this engine cannot run `key` as pipecut costs it, `None` when it can. `training`:
    /// the ZeRO stage and recomputation matter only in training.
    pub fn refuses(self, key: &ConfigurationKey, training: bool) -> Option<&'static str> {
        let pipeline = key.stages > 1;
        let zero = if training && key.data_parallel > 1 {
            key.zero_stage
        } else {
            0
        };
        let recompute = if training {
            key.recompute
        } else {
            Recompute::None
        };
        match self {
            Engine::Pipecut => None,
            Engine::Torch if zero == 1 => {
                Some("shards data-parallel state with FSDP2, which has no ZeRO-1 (DDP is ZeRO-0, FSDP2 ZeRO-2 or 3)")
            }
            Engine::Torch => None,
            Engine::Megatron => match key.schedule {
                Schedule::GPipe if pipeline => Some("runs 1F1B or the interleaved schedule, not GPipe"),
                Schedule::ZeroBubble if pipeline => {
                    Some("runs 1F1B or the interleaved schedule, not zero-bubble")
                }
                _ if zero == 2 => Some("shards the optimizer state alone with its distributed optimizer (ZeRO-1), not the gradients (ZeRO-2)"),
                _ if zero == 3 && pipeline => Some("runs ZeRO-3 (FSDP2) only without a pipeline"),
                _ => None,
            },
            Engine::Deepspeed if key.tensor_parallel.degree > 1 => Some(
                "takes tensor parallelism from Megatron's layers, not from its config (use --engine megatron)",
            ),
            Engine::Deepspeed if pipeline && !matches!(key.schedule, Schedule::OneFOneB) => {
                Some("runs its pipeline engine with its own 1F1B schedule")
            }
            Engine::Deepspeed if pipeline && zero > 1 => {
                Some("runs its pipeline engine with ZeRO stage 0 or 1 only")
            }
            Engine::Deepspeed if recompute == Recompute::Selective => {
                Some("checkpoints whole layers (full recomputation), not selected ops")
            }
            Engine::Deepspeed => None,
        }
    }
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Engine, String> {
        match s {
            "pipecut" => Ok(Engine::Pipecut),
            "torch" => Ok(Engine::Torch),
            "megatron" => Ok(Engine::Megatron),
            "deepspeed" => Ok(Engine::Deepspeed),
            other => Err(format!(
                "unknown engine '{other}' (expected pipecut, torch, megatron or deepspeed)"
            )),
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::parallelism::Placement;

    fn key(stages: usize, schedule: Schedule, zero_stage: u8, tp: u32) -> ConfigurationKey {
        ConfigurationKey {
            stages,
            data_parallel: 4,
            microbatch_size: 1,
            microbatches: 8,
            schedule,
            placement: Placement::PipelineInsideNodes,
            recompute: Recompute::None,
            zero_stage,
            tensor_parallel: crate::partition::tensor_parallel::TensorParallelism {
                degree: tp,
                sequence_parallel: false,
            },
        }
    }

    #[test]
    fn each_engine_refuses_what_it_does_not_run() {
        let b = Schedule::OneFOneB;
        assert!(Engine::Pipecut
            .refuses(&key(8, Schedule::ZeroBubble, 3, 8), true)
            .is_none());
        assert!(Engine::Torch.refuses(&key(8, b, 3, 8), true).is_none());
        assert!(Engine::Torch.refuses(&key(8, b, 1, 8), true).is_some());
        assert!(Engine::Megatron.refuses(&key(8, b, 1, 8), true).is_none());
        assert!(Engine::Megatron.refuses(&key(8, b, 2, 8), true).is_some());
        assert!(Engine::Megatron.refuses(&key(8, b, 3, 8), true).is_some());
        assert!(Engine::Megatron.refuses(&key(1, b, 3, 8), true).is_none());
        assert!(Engine::Megatron
            .refuses(&key(8, Schedule::GPipe, 0, 8), true)
            .is_some());
        assert!(Engine::Megatron
            .refuses(&key(8, Schedule::ZeroBubble, 0, 1), true)
            .is_some());
        assert!(Engine::Deepspeed.refuses(&key(8, b, 1, 1), true).is_none());
        assert!(Engine::Deepspeed.refuses(&key(8, b, 2, 1), true).is_some());
        assert!(Engine::Deepspeed.refuses(&key(1, b, 3, 1), true).is_none());
        assert!(Engine::Deepspeed.refuses(&key(8, b, 0, 2), true).is_some());
        // ZeRO does not exist in inference: nothing to refuse for it there.
        assert!(Engine::Megatron.refuses(&key(8, b, 2, 8), false).is_none());
    }
}
