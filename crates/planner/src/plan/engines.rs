//! A plan in other engines' terms, as data: Megatron-LM's arguments and DeepSpeed's config.
//!
//! Both come out as JSON values (a list of argument strings, a `ds_config` object), never as
//! code: a module name from the model can only ever be a JSON string. A plan whose
//! configuration the engine cannot run is refused with the reason, rather than translated into
//! something the engine runs differently from the plan:
//!
//! * Megatron-LM runs its pipeline with 1F1B or the interleaved schedule; its distributed
//!   optimizer shards optimizer state and gradients over the data-parallel group (ZeRO-1/2);
//!   its FSDP2 path ("not currently working with Pipeline Parallel", `--use-torch-fsdp2`'s
//!   help in `megatron/training/arguments.py`) is ZeRO-3 without a pipeline.
//! * DeepSpeed's pipeline engine (`PipelineModule`) takes ZeRO stage 0 or 1 only and runs its
//!   own 1F1B-like schedule; without a pipeline every ZeRO stage applies.

use serde_json::{json, Value};

use pipecut_cost::{Mode, Recompute, Schedule};

use super::Plan;
use crate::partition::torch_split::TorchSplit;
use crate::Error;

/// The parallel configuration a plan chose, read once for both engines.
struct Configuration {
    stages: usize,
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

    fn world_size(&self) -> usize {
        self.stages * self.data_parallel * self.tensor_parallel as usize
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
    let mut args: Vec<String> = Vec::new();
    let mut arg = |name: &str, value: Option<String>| {
        args.push(name.to_string());
        args.extend(value);
    };
    arg(
        "--tensor-model-parallel-size",
        Some(c.tensor_parallel.to_string()),
    );
    arg("--pipeline-model-parallel-size", Some(c.stages.to_string()));
    arg("--micro-batch-size", Some(c.microbatch_size.to_string()));
    arg("--global-batch-size", Some(c.global_batch.to_string()));
    if c.sequence_parallel {
        arg("--sequence-parallel", None);
    }
    let mut notes: Vec<&str> = Vec::new();
    match c.schedule {
        Schedule::OneFOneB => {}
        // 1F1B has GPipe's bubble, so the same step time, and keeps fewer micro-batches.
        Schedule::GPipe => notes.push(
            "planned with GPipe; Megatron-LM runs 1F1B, with the same step time and less memory",
        ),
        Schedule::Interleaved { chunks } => arg(
            "--num-virtual-stages-per-pipeline-rank",
            Some(chunks.to_string()),
        ),
        Schedule::ZeroBubble => {
            return Err(refused(
                "Megatron-LM",
                plan,
                "runs 1F1B or the interleaved schedule",
            ))
        }
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
    match (c.zero_stage, c.stages) {
        (0, _) => {}
        (1 | 2, _) => arg("--use-distributed-optimizer", None),
        (_, 1) => arg("--use-torch-fsdp2", None),
        _ => {
            return Err(refused(
                "Megatron-LM",
                plan,
                "runs ZeRO-3 (FSDP2) only without a pipeline",
            ))
        }
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
    if c.tensor_parallel > 1 {
        return Err(refused(
            "DeepSpeed",
            plan,
            "takes tensor parallelism from Megatron's layers, not from its config (use --emit megatron-args)",
        ));
    }
    if c.stages > 1 && c.zero_stage > 1 {
        return Err(refused(
            "DeepSpeed",
            plan,
            "runs its pipeline engine with ZeRO stage 0 or 1 only",
        ));
    }
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
