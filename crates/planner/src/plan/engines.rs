//! A plan in other engines' terms, as data: Megatron-LM's arguments and DeepSpeed's config.
//!
//! Both come out as JSON values (a list of argument strings, a `ds_config` object), never as
//! code: a module name from the model can only ever be a JSON string. A plan whose
//! configuration the engine cannot run is refused with the reason, rather than translated into
//! something the engine runs differently from the plan:
//!
//! The rules are [`Engine::refuses`]'s (crate::partition::engine), which `plan-cluster
//! --engine` searches by and `check` verifies; a plan made for another engine (pipecut's own,
//! by default) is refused here when they rule its configuration out.

use serde_json::{json, Value};

use pipecut_cost::{Mode, Recompute, Schedule};

use super::Plan;
use crate::partition::engine::Engine;
use crate::partition::parallelism::{ConfigurationKey, Placement};
use crate::partition::tensor_parallel::TensorParallelism;
use crate::partition::torch_split::TorchSplit;
use crate::Error;

/// The parallel configuration a plan chose, read once for both engines.
struct Configuration {
    /// The plan's stages: v·K under an interleaved schedule of v chunks per device.
    stages: usize,
    /// Pipeline devices K (Megatron's pipeline-model-parallel size).
    pipeline: usize,
    data_parallel: usize,
    tensor_parallel: u32,
    sequence_parallel: bool,
    microbatch_size: u64,
    microbatches: u64,
    global_batch: u64,
    recompute: Recompute,
    zero_stage: u8,
    schedule: Schedule,
}

impl Configuration {
    fn of(plan: &Plan) -> Configuration {
        let (recompute, zero_stage) = match plan.config.mode {
            Mode::Training {
                recompute, zero, ..
            } => (recompute, zero.stage),
            Mode::Inference => (Recompute::None, 0),
        };
        let microbatches = u64::from(plan.config.microbatches);
        let (data_parallel, microbatch_size, global_batch, tp) = match &plan.parallelism {
            Some(p) => (
                p.data_parallel,
                p.microbatch_size,
                p.global_batch,
                p.tensor_parallel,
            ),
            None => {
                let size = plan.model.dims.get("batch").copied().unwrap_or(1);
                (1, size, size * microbatches, Default::default())
            }
        };
        Configuration {
            stages: plan.stages.len(),
            pipeline: plan.stages.len() / plan.config.schedule.chunks().max(1),
            data_parallel,
            tensor_parallel: tp.degree.max(1),
            sequence_parallel: tp.sequence_parallel,
            microbatch_size,
            microbatches,
            global_batch,
            recompute,
            zero_stage,
            schedule: plan.config.schedule,
        }
    }

    /// Refuses the plan when `engine` does not run its configuration as planned
    /// ([`Engine::refuses`], the rules the search keeps to under `--engine`).
    fn refuse_unless_run_by(&self, engine: Engine, plan: &Plan) -> Result<(), Error> {
        let key = ConfigurationKey {
            stages: self.pipeline,
            data_parallel: self.data_parallel,
            microbatch_size: self.microbatch_size,
            microbatches: self.microbatches,
            schedule: self.schedule,
            placement: Placement::PipelineInsideNodes,
            recompute: self.recompute,
            zero_stage: self.zero_stage,
            tensor_parallel: TensorParallelism {
                degree: self.tensor_parallel,
                sequence_parallel: self.sequence_parallel,
            },
        };
        match engine.refuses(&key, matches!(plan.config.mode, Mode::Training { .. })) {
            Some(reason) => Err(refused(engine_name(engine), plan, reason)),
            None => Ok(()),
        }
    }

    fn world_size(&self) -> usize {
        self.pipeline * self.data_parallel * self.tensor_parallel as usize
    }
}

/// Megatron-LM's command-line arguments for the plan (`pretrain_gpt.py` and the like), with the
/// stage boundaries as `--pipeline-model-parallel-layout` when `split` places them on blocks.
///
/// `{"world_size": N, "args": ["--tensor-model-parallel-size", "2", ...], "notes": [...]}`;
/// Megatron derives the data-parallel size from the world size.
pub fn megatron_args(plan: &Plan, split: Option<&TorchSplit>) -> Result<Value, Error> {
    let c = Configuration::of(plan);
    refuse_training_only("Megatron-LM", plan)?;
    c.refuse_unless_run_by(Engine::Megatron, plan)?;
    let mut args: Vec<String> = Vec::new();
    let mut arg = |name: &str, value: Option<String>| {
        args.push(name.to_string());
        args.extend(value);
    };
    arg(
        "--tensor-model-parallel-size",
        Some(c.tensor_parallel.to_string()),
    );
    arg(
        "--pipeline-model-parallel-size",
        Some(c.pipeline.to_string()),
    );
    arg("--micro-batch-size", Some(c.microbatch_size.to_string()));
    arg("--global-batch-size", Some(c.global_batch.to_string()));
    if c.sequence_parallel {
        arg("--sequence-parallel", None);
    }
    let notes: Vec<&str> = Vec::new();
    // GPipe and zero-bubble in a pipeline are refused above; one stage has no schedule.
    if let Schedule::Interleaved { chunks } = c.schedule {
        arg(
            "--num-virtual-stages-per-pipeline-rank",
            Some(chunks.to_string()),
        );
    }
    match c.recompute {
        Recompute::None => {}
        Recompute::Selective => arg("--recompute-granularity", Some("selective".into())),
        Recompute::Full => {
            arg("--recompute-granularity", Some("full".into()));
            arg("--recompute-method", Some("uniform".into()));
            arg("--recompute-num-layers", Some("1".into()));
        }
    }
    match c.zero_stage {
        0 => {}
        1 => arg("--use-distributed-optimizer", None),
        // ZeRO-2, and ZeRO-3 in a pipeline, are refused above.
        _ => arg("--use-torch-fsdp2", None),
    }
    if let Some(layout) = split.and_then(|s| pipeline_layout(s, c.stages)) {
        arg("--pipeline-model-parallel-layout", Some(layout));
    }
    Ok(json!({ "world_size": c.world_size(), "args": args, "notes": notes }))
}

/// Megatron's `--pipeline-model-parallel-layout`: per stage, `E` for the embedding (the
/// prologue), one `t` per transformer block and `L` for the head and loss (the epilogue),
/// stages separated by `|`.
fn pipeline_layout(split: &TorchSplit, stages: usize) -> Option<String> {
    let parts = &split.deepspeed_parts;
    if stages < 2 || parts.len() != stages + 1 {
        return None;
    }
    let last = split.layers.len() - 1;
    let stage_text = |range: std::ops::Range<usize>| -> String {
        range
            .map(|layer| match layer {
                0 => 'E',
                l if l == last => 'L',
                _ => 't',
            })
            .collect()
    };
    let texts: Vec<String> = parts.windows(2).map(|w| stage_text(w[0]..w[1])).collect();
    Some(texts.join("|"))
}

/// DeepSpeed's `ds_config` for the plan and, with a pipeline, what its `PipelineModule` takes:
/// `{"ds_config": {...}, "pipeline_module": {"num_stages": K, "partition_method": "parts",
/// "parts": [...], "layers": [...]}}` (the layer names are those `parts` indexes).
pub fn deepspeed_config(plan: &Plan, split: Option<&TorchSplit>) -> Result<Value, Error> {
    let c = Configuration::of(plan);
    refuse_training_only("DeepSpeed", plan)?;
    c.refuse_unless_run_by(Engine::Deepspeed, plan)?;
    let mut ds_config = json!({
        "train_batch_size": c.global_batch,
        "train_micro_batch_size_per_gpu": c.microbatch_size,
        "gradient_accumulation_steps": c.microbatches,
        "zero_optimization": { "stage": c.zero_stage },
    });
    if c.recompute != Recompute::None {
        ds_config["activation_checkpointing"] = json!({
            "partition_activations": false,
            "contiguous_memory_optimization": false,
        });
    }
    let pipeline_module = if c.stages > 1 {
        let split = split.ok_or_else(|| {
            refused(
                "DeepSpeed",
                plan,
                "needs the stage boundaries on module boundaries, and the model has none",
            )
        })?;
        json!({
            "num_stages": c.stages,
            "partition_method": "parts",
            "parts": split.deepspeed_parts,
            "layers": split.layers,
            "activation_checkpoint_interval": u32::from(c.recompute != Recompute::None),
        })
    } else {
        Value::Null
    };
    Ok(json!({ "ds_config": ds_config, "pipeline_module": pipeline_module }))
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Megatron => "Megatron-LM",
        Engine::Deepspeed => "DeepSpeed",
        Engine::Torch => "torch",
        Engine::Pipecut => "pipecut",
    }
}

fn refuse_training_only(engine: &str, plan: &Plan) -> Result<(), Error> {
    match plan.config.mode {
        Mode::Training { .. } => Ok(()),
        Mode::Inference => Err(refused(
            engine,
            plan,
            "configures training: make the plan with --mode training",
        )),
    }
}

fn refused(engine: &str, plan: &Plan, reason: &str) -> Error {
    Error::InvalidPlan(format!(
        "{engine} cannot run the plan for '{}' as planned: it {reason}",
        plan.model.file_name
    ))
}
