//! `pipecut plan-cluster MODEL --cluster 4x8xH100-SXM --global-batch 512`: pipeline depth,
//! data-parallel degree, micro-batching, schedule and placement for a whole cluster.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::cost::{Recompute, Schedule};
use crate::onnx::inspect::human_bytes;
use crate::partition::engine::Engine;
use crate::partition::parallelism::{search, Placement, SearchOutcome, SearchRequest};
use crate::partition::tensor_parallel::{TensorParallelBlocks, TensorParallelism};
use crate::partition::{CostSettings, PartitionConfig, Planner, SolverChoice, StageCount};
use crate::plan::{Plan, PlanContext, PlanOptions};
use anyhow::Context;
use clap::Args;

use super::cost::{ModeArg, UnknownOpArg};
use super::partition::{parse_duration, parse_schedule, ClusterArgs, EmitArg};
use super::{print_stdout, write_atomically, ModelArgs};
use crate::partition::torch_split::DEFAULT_SPLIT_TOLERANCE;

#[derive(Debug, Args)]
pub struct PlanClusterArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    /// Samples per step over all replicas (per optimizer step in training).
    #[arg(long)]
    global_batch: u64,
    /// The model's batch dim, bound to each candidate micro-batch size (do not bind it with --dim).
    #[arg(long, default_value = "batch")]
    batch_dim: String,
    /// Inference (forward only) or training (forward, backward, optimizer state, all-reduce).
    #[arg(long, value_enum, default_value = "inference")]
    mode: ModeArg,
    /// Schedules to try (repeatable): gpipe, 1f1b, interleaved[:v], zero-bubble; default both
    /// GPipe and 1F1B.
    #[arg(long, value_parser = parse_schedule)]
    schedule: Vec<Schedule>,
    /// Micro-batch sizes to try, e.g. 1,2,4; default every power of two dividing the global batch.
    #[arg(long, value_delimiter = ',')]
    microbatch_sizes: Option<Vec<u64>>,
    /// Fraction of each device's memory kept free for the runtime.
    #[arg(long, default_value_t = 0.10)]
    memory_headroom: f64,
    /// How to cost ops without a rule: refuse (error), as free (zero), or as a copy (bytes).
    #[arg(long, value_enum, default_value = "error")]
    unknown_op_cost: UnknownOpArg,
    /// Cost every floating-point tensor at this precision instead of the file's (exporters
    /// usually write fp32; training runs bf16 or fp16): memory, transfers, all-reduces and the
    /// tensor-core peak follow it. The plan records it.
    #[arg(long, value_enum, value_name = "bf16|fp16|fp32")]
    dtype: Option<super::DtypeArg>,
    /// Activation recomputation choices to search, in training (default: none,full).
    #[arg(long, value_delimiter = ',', value_name = "none|selective|full")]
    recompute: Vec<Recompute>,
    /// In training, whose way of keeping activations the memory follows (torch, megatron or
    /// onnx; default: the --emit target's engine, else onnx), as `partition --memory-model`.
    #[arg(long, value_name = "torch|megatron|onnx")]
    memory_model: Option<crate::cost::MemoryModel>,
    /// ZeRO stages to search, in training with several replicas (default: 0,1,2,3).
    #[arg(long, value_delimiter = ',', value_name = "0|1|2|3")]
    zero: Vec<u8>,
    /// Tensor-parallel degrees to search, e.g. 1,8 (each must divide every node's GPU count);
    /// default 1 and every such degree that splits a block of the model.
    #[arg(long, value_delimiter = ',', value_name = "T")]
    tp: Option<Vec<u32>>,
    /// Pipeline depths to search, e.g. 16; default 1–16, powers of two and divisors of the
    /// layer count (see --all-stage-counts).
    #[arg(long, value_delimiter = ',', value_name = "K")]
    pp: Option<Vec<usize>>,
    /// Data-parallel degrees to search, e.g. 12; default every degree the devices allow.
    #[arg(long, value_delimiter = ',', value_name = "D")]
    dp: Option<Vec<usize>>,
    /// Tensor-parallel groups also split the normalizations, dropouts and residual additions
    /// along the sequence (Korthikanti et al. 2022).
    #[arg(long)]
    sequence_parallel: bool,
    /// How many of the best configurations to list.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Try every pipeline depth, not only 1–16, powers of two and divisors of the layer count.
    #[arg(long)]
    all_stage_counts: bool,
    /// Wall-clock guard for the whole command (e.g. 10s), counted from its start: loading, the
    /// search, then the chosen configuration's partition in what the search left. The search
    /// itself stops first at its work budget (--search-budget), which gives the same answer on
    /// a loaded machine as on an idle one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    time_limit: Duration,
    /// Configurations the search may cost (a DP run or feasibility sweep each) before it stops
    /// with its best so far; the plan says which limit stopped it, if one did.
    #[arg(long, value_name = "CONFIGURATIONS", default_value_t = crate::partition::parallelism::DEFAULT_SEARCH_BUDGET)]
    search_budget: u64,
    /// The engine that will run the plan: only the configurations it runs are searched
    /// (pipecut: every one; torch: pipelining with DDP or FSDP2 and tensor parallelism;
    /// megatron: 1F1B or interleaved, distributed optimizer; deepspeed: its pipeline engine
    /// with ZeRO 0 or 1, no tensor parallelism). Default: the --emit target's engine, else
    /// pipecut. The plan records it and `check` verifies the configuration against it.
    #[arg(long, value_name = "pipecut|torch|megatron|deepspeed")]
    engine: Option<crate::partition::engine::Engine>,
    /// The regex DeepSpeed's `partition_method="type:REGEX"` baseline is given for the chosen
    /// configuration's baselines, as `pipecut partition --baseline-layer-type` takes it.
    #[arg(long, value_name = "REGEX", default_value = crate::partition::baselines::DEFAULT_LAYER_TYPE, value_parser = super::partition::parse_layer_type)]
    baseline_layer_type: String,
    /// Stop the chosen configuration's own searches (its partition's bounds) after this many
    /// units of their own work (see `pipecut partition --work-budget`); the time limit stays
    /// their guard.
    #[arg(long, value_name = "UNITS", default_value_t = FINAL_WORK_BUDGET)]
    work_budget: u64,
    /// Write the chosen configuration's plan JSON (with its replicas) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the plan JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also give the chosen plan in another tool's terms, as `partition --emit` does
    /// (torch-split-spec: torch.distributed.pipelining's `split_spec` and DeepSpeed's `parts`;
    /// megatron-args; deepspeed-config; with --json: `{"plan": …, KEY: …}`).
    #[arg(long, value_enum)]
    emit: Option<EmitArg>,
    /// How much moving the stage boundaries to module boundaries may raise the bottleneck, as a
    /// fraction (0.05 = 5 %).
    #[arg(long, default_value_t = DEFAULT_SPLIT_TOLERANCE, value_name = "FRACTION", requires = "emit")]
    split_tolerance: f64,
}

/// The chosen configuration's partition's default work budget: `partition --work-budget`'s
/// units, enough for the granularity bound of GPT-3-175B's stages.
const FINAL_WORK_BUDGET: u64 = 1_000_000;

pub fn run(args: PlanClusterArgs) -> anyhow::Result<ExitCode> {
    // --time-limit covers the whole command from here: loading, the search, the final partition.
    let started = Instant::now();
    let path = &args.model.model;
    if let Some(out) = &args.out {
        super::check_output(out, &[path])?;
    }
    let mut model = super::load_model(path, super::Weights::NotRead)?;
    let catalog = args.cluster.catalog()?;
    let cluster = args.cluster.build(&catalog)?;
    let bindings = args.model.bindings()?;
    let mut request = search_request(&args, &bindings)?;
    // The search binds the batch dim per candidate; every other dim must be bound here.
    super::require_bound_dims(&model.graph, &bindings, Some(&args.batch_dim))
        .with_context(|| format!("'{}'", path.display()))?;
    let dtype_override = args.dtype.map(crate::cost::Precision::from);
    request.dtype_override = dtype_override.map(|p| p.dtype());
    let dims: BTreeMap<String, u64> = bindings.iter().map(|(k, v)| (k.to_string(), v)).collect();
    let applied = args.measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &dims,
        &super::measured::device_names(&cluster),
    )?;
    keep_measured_batch_size(&args, &applied, &mut request)?;

    let display = super::progress::Display::start(&format!(
        "searching configurations of {}",
        crate::onnx::inspect::count_of(cluster.device_count(), "device")
    ));
    request.time_limit = args.time_limit.saturating_sub(started.elapsed());
    let searched = search(&model.graph, &cluster, &request);
    display.finish();
    let outcome = searched.with_context(|| format!("'{}'", path.display()))?;

    let best = outcome.best.key;
    let solution = chosen_partition(&args, &outcome, &cluster, &request, started)
        .with_context(|| format!("'{}'", path.display()))?;
    let mut dims: BTreeMap<String, u64> =
        bindings.iter().map(|(k, v)| (k.to_string(), v)).collect();
    dims.insert(args.batch_dim.clone(), best.microbatch_size);
    let file_name = super::model_file_name(path);
    let plan = Plan::from_solution(
        &solution,
        PlanContext {
            model: model.digests(),
            model_file_name: &file_name,
            graph: &outcome.graph,
            dims: &dims,
            cluster: &cluster,
            stages: StageCount::Fixed(best.stages),
            time_limit_secs: args.time_limit.as_secs_f64(),
            dtype_override,
        },
        PlanOptions::default(),
    )
    .with_parallelism(&outcome, args.global_batch, request.engine)
    .with_tensor_parallel_shards(&outcome.graph)
    .with_context(|| format!("'{}'", path.display()))?;
    plan.ensure_finite()?;
    let json = plan.to_json();
    if let Some(out) = &args.out {
        write_atomically(out, json.as_bytes(), &[&args.model.model])?;
    }
    let emitted = super::partition::emitted(args.emit, &plan, &solution, args.split_tolerance)?;
    if args.json {
        super::partition::print_json(&json, emitted.as_ref())?;
    } else {
        print_stdout(&table(&plan, &outcome, args.search_budget))?;
        if let Some(emitted) = &emitted {
            print_stdout(super::partition::emitted_text(emitted))?;
        }
        // The whole step, over every replica: D × m micro-batches of b samples on D × K GPUs.
        let best = &outcome.best;
        print_stdout(&super::efficiency::efficiency_line(
            &super::efficiency::StepWork {
                graph: &outcome.graph,
                mode: request.mode,
                unknown_ops: request.unknown_ops,
                microbatches: (best.key.data_parallel as u64 * best.key.microbatches) as f64,
                microbatch_size: best.key.microbatch_size,
                sequence: super::efficiency::sequence_dim(&plan.model.dims),
                step_secs: best.step_secs,
                forward_flops: None,
                cluster: &cluster,
                devices: best.key.devices(),
            },
        )?)?;
        if let Some(out) = &args.out {
            print_stdout(&format!("wrote {}\n", out.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What to search, from the arguments (`bindings`: the `--dim`s, which may not bind the batch
/// dim the search chooses); the precision is added by the caller.
fn search_request(
    args: &PlanClusterArgs,
    bindings: &crate::onnx::shape::DimBindings,
) -> anyhow::Result<SearchRequest> {
    if bindings.iter().any(|(name, _)| name == args.batch_dim) {
        anyhow::bail!(
            "--dim {}=… binds the batch dim, which plan-cluster chooses: drop it, or name \
             another batch dim with --batch-dim",
            args.batch_dim
        );
    }
    super::partition::refuse_memory_model_in_inference(args.memory_model, args.mode)?;
    let engine = engine(args.engine, args.emit);
    let mode = crate::cost::Mode::from(args.mode)
        .with_memory_model(args.memory_model.unwrap_or(engine_memory_model(engine)));
    let mut request = SearchRequest::new(args.global_batch, mode);
    request.engine = engine;
    request.work_budget = Some(args.search_budget);
    request.batch_dim = args.batch_dim.clone();
    request.bindings = bindings.clone();
    if !args.schedule.is_empty() {
        request.schedules = args.schedule.clone();
        request.schedules.sort();
        request.schedules.dedup();
    }
    request.microbatch_sizes = args.microbatch_sizes.clone();
    request.memory_headroom = args.memory_headroom;
    request.unknown_ops = args.unknown_op_cost.into();
    request.top = args.top;
    request.all_stage_counts = args.all_stage_counts;
    request.tensor_parallel = args.tp.clone();
    request.stage_counts = args.pp.clone();
    request.data_parallel = args.dp.clone();
    request.sequence_parallel = args.sequence_parallel;
    request.time_limit = args.time_limit;
    let techniques =
        args.recompute.iter().any(|r| !r.is_none()) || args.zero.iter().any(|&z| z > 0);
    if techniques && matches!(args.mode, ModeArg::Inference) {
        anyhow::bail!(
            "--recompute and --zero apply to training (add --mode training): inference keeps no \
             gradients, optimizer state or activations for a backward"
        );
    }
    if !args.recompute.is_empty() {
        request.recompute = args.recompute.clone();
        request.recompute.sort();
        request.recompute.dedup();
    }
    if !args.zero.is_empty() {
        request.zero_stages = args.zero.clone();
        request.zero_stages.sort();
        request.zero_stages.dedup();
    }
    Ok(request)
}

/// The engine of `--engine`, or the one `--emit` targets (torch for torch-split-spec), else
/// pipecut's own runtime.
fn engine(asked: Option<Engine>, emit: Option<EmitArg>) -> Engine {
    asked.unwrap_or(match emit {
        Some(EmitArg::TorchSplitSpec) => Engine::Torch,
        Some(EmitArg::MegatronArgs) => Engine::Megatron,
        Some(EmitArg::DeepspeedConfig) => Engine::Deepspeed,
        None => Engine::Pipecut,
    })
}

/// How the engine keeps activations, `--memory-model`'s default: torch's for torch and
/// DeepSpeed (which runs torch modules), Megatron's for Megatron, the ONNX graph's for
/// pipecut's own runtime.
fn engine_memory_model(engine: Engine) -> crate::cost::MemoryModel {
    use crate::cost::MemoryModel;
    match engine {
        Engine::Torch | Engine::Deepspeed => MemoryModel::Torch,
        Engine::Megatron => MemoryModel::Megatron,
        Engine::Pipecut => MemoryModel::Onnx,
    }
}

/// Node times hold at the micro-batch size they were measured at: with `--profile`
/// (`applied`), the search keeps to it, and refuses times measured at several sizes or a size
/// `--microbatch-sizes` leaves out.
fn keep_measured_batch_size(
    args: &PlanClusterArgs,
    applied: &[crate::cost::NodeTimes],
    request: &mut SearchRequest,
) -> anyhow::Result<()> {
    let Some(times) = applied.first() else {
        return Ok(());
    };
    let measured = times.model.dims.get(&args.batch_dim).copied();
    let Some(size) = measured.filter(|_| {
        applied
            .iter()
            .all(|t| t.model.dims.get(&args.batch_dim).copied() == measured)
    }) else {
        anyhow::bail!(
            "--profile: the node times must all be measured at one micro-batch size (profile with --dim {}=N)",
            args.batch_dim
        );
    };
    if request
        .microbatch_sizes
        .as_ref()
        .is_some_and(|sizes| !sizes.contains(&size))
    {
        anyhow::bail!("--profile: the node times were measured at {}={size}, which --microbatch-sizes leaves out", args.batch_dim);
    }
    eprintln!(
        "note: planning on measured times keeps the micro-batch size at {}={size}, the size they were measured at",
        args.batch_dim
    );
    request.microbatch_sizes = Some(vec![size]);
    Ok(())
}

/// The chosen configuration's partition of replica 0's devices, with its proof and baselines,
/// for the plan, in what is left of the time limit counted from `started`: it starts from the
/// search's own partition, which stands when no time is left for the DP.
fn chosen_partition(
    args: &PlanClusterArgs,
    outcome: &SearchOutcome,
    cluster: &crate::cost::Cluster,
    request: &SearchRequest,
    started: Instant,
) -> Result<crate::partition::Solution, crate::Error> {
    let best = outcome.best.key;
    let left = args.time_limit.saturating_sub(started.elapsed());
    let mut planner = Planner::new(&outcome.graph, cluster).with_time_guard(left);
    if let Some(plan) = &outcome.best_plan {
        planner = planner.with_start(plan.clone());
    }
    planner
        .with_tensor_parallel(
            TensorParallelBlocks::find(&outcome.graph),
            best.tensor_parallel,
        )
        .with_config(PartitionConfig {
            stages: StageCount::Fixed(best.stages),
            devices: outcome.replicas[0].clone(),
            settings: CostSettings {
                mode: best.mode(request.mode),
                schedule: best.schedule,
                microbatches: best.microbatches.min(u32::MAX as u64) as u32,
                memory_headroom: request.memory_headroom,
                unknown_ops: request.unknown_ops,
            },
            // The DP: the search costed every configuration with its partition, so the plan's
            // stages are the ones its step, all-reduce and throughput figures describe.
            solver: SolverChoice::Dp,
            time_limit: left,
            // A count, as the search's: the partition's bounds stop by their own work, not
            // at a share of the clock (the LP relaxation, which has no count, does not run),
            // and the time limit stays the guard.
            work_budget: Some(args.work_budget),
            // The search keeps each block that splits at the chosen degree on one stage (what
            // it costs split is what the export splits); the plan keeps the stages it costed.
            cut_constraints: crate::partition::CutConstraints::tensor_parallel(
                best.tensor_parallel.degree,
            ),
            baseline_layer_type: args.baseline_layer_type.clone(),
        })
        .solve()
}

fn schedule_name(schedule: Schedule) -> String {
    schedule.to_string()
}

fn placement_name(placement: Placement, stages: usize, replicas: usize) -> &'static str {
    match placement {
        _ if stages == 1 || replicas == 1 => "-",
        Placement::PipelineInsideNodes => "pipelines in nodes",
        Placement::ReplicasInsideNodes => "replicas in nodes",
    }
}

/// Recomputation and ZeRO stage, as a table cell and a phrase: `-` for neither.
fn memory_name(recompute: Recompute, zero_stage: u8) -> String {
    match (recompute, zero_stage) {
        (Recompute::None, 0) => "-".to_string(),
        (Recompute::Full, 0) => "recompute".to_string(),
        (Recompute::Selective, 0) => "selective recompute".to_string(),
        (Recompute::Selective, z) => format!("ZeRO-{z}+selective"),
        (Recompute::None, z) => format!("ZeRO-{z}"),
        (Recompute::Full, z) => format!("ZeRO-{z}+recompute"),
    }
}

/// The tensor-parallel degree as a table cell: `8`, `8+SP` with sequence parallelism, `-` for
/// none.
fn tensor_name(tp: TensorParallelism) -> String {
    match (tp.degree, tp.sequence_parallel) {
        (0 | 1, _) => "-".to_string(),
        (t, false) => t.to_string(),
        (t, true) => format!("{t}+SP"),
    }
}

/// The chosen configuration, every configuration ranked, how the step and the search went,
/// then the chosen pipeline's own table.
fn table(plan: &Plan, outcome: &SearchOutcome, budget: u64) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    heading(&mut out, plan, outcome);
    ranked_rows(&mut out, outcome);
    search_lines(&mut out, outcome, budget);
    let _ = writeln!(out, "\nthe chosen pipeline (replica 0):");
    out.push_str(&super::partition::table(plan, None));
    out
}

/// The table's first line: the chosen configuration in words.
fn heading(out: &mut String, plan: &Plan, outcome: &SearchOutcome) {
    let k = outcome.best.key;
    let _ = writeln!(
        out,
        "{} on {} ({} devices), global batch {}: {} × {}{}, micro-batches of {} × {}, {}{}",
        plan.model.file_name,
        plan.cluster.description,
        outcome_devices(plan),
        plan.parallelism.as_ref().map_or(0, |p| p.global_batch),
        crate::onnx::inspect::count_of(k.stages, "stage"),
        crate::onnx::inspect::count_of(k.data_parallel, "replica"),
        match tensor_name(k.tensor_parallel).as_str() {
            "-" => String::new(),
            name => format!(" × tensor-parallel {name}"),
        },
        k.microbatch_size,
        k.microbatches,
        schedule_name(k.schedule),
        match placement_name(k.placement, k.stages, k.data_parallel) {
            "-" => String::new(),
            name => format!(", {name}"),
        } + &match memory_name(k.recompute, k.zero_stage).as_str() {
            "-" => String::new(),
            name => format!(", {name}"),
        }
    );
}

/// One row per configuration kept, best first and marked.
fn ranked_rows(out: &mut String, outcome: &SearchOutcome) {
    let _ = writeln!(
        out,
        "\n{:>4} {:>5} {:>5} {:>6} {:>6}  {:<8} {:<18} {:<17} {:>12} {:>9} {:>7} {:>11}",
        "K",
        "D",
        "TP",
        "b",
        "m",
        "schedule",
        "placement",
        "memory saving",
        "samples/s",
        "step ms",
        "bubble",
        "memory/GPU"
    );
    for (i, c) in outcome.ranked.iter().enumerate() {
        let key = c.key;
        let _ = writeln!(
            out,
            "{:>4} {:>5} {:>5} {:>6} {:>6}  {:<8} {:<18} {:<17} {:>12.1} {:>9.3} {:>6.1}% {:>11}{}",
            key.stages,
            key.data_parallel,
            tensor_name(key.tensor_parallel),
            key.microbatch_size,
            key.microbatches,
            schedule_name(key.schedule),
            placement_name(key.placement, key.stages, key.data_parallel),
            memory_name(key.recompute, key.zero_stage),
            c.samples_per_sec,
            c.step_secs * 1e3,
            c.bubble_fraction * 100.0,
            human_bytes(c.peak_memory_bytes),
            if i == 0 { " ◀" } else { "" }
        );
    }
}

/// The chosen step's make-up, and what the search did.
fn search_lines(out: &mut String, outcome: &SearchOutcome, budget: u64) {
    let best = &outcome.best;
    let reduce = best.allreduce_secs.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "\nstep {:.3} ms = pipeline {:.3} ms + exposed all-reduce {:.3} ms (largest stage all-reduce {:.3} ms)",
        best.step_secs * 1e3,
        best.pipeline_secs * 1e3,
        (best.step_secs - best.pipeline_secs) * 1e3,
        reduce * 1e3
    );
    match outcome.stopped_by {
        Some(limit) => {
            let _ = writeln!(
                out,
                "the {} stopped the search with {} configurations left whose bound beats the choice: these are the best found so far",
                limit.name(),
                outcome.unresolved
            );
        }
        None => {
            let _ = writeln!(
                out,
                "the search is complete: no configuration of the space beats the choice"
            );
        }
    }
    let _ = writeln!(
        out,
        "searched {} configurations: {} solved, {} costed with an equivalent placement, {} bounded out ({} of them by a DP feasibility sweep), {} ruled out by memory, {} infeasible; {} of the work budget's {} spent; {:.2} s",
        outcome.candidates,
        outcome.solved,
        outcome.twinned,
        outcome
            .candidates
            .saturating_sub(
                outcome.solved + outcome.twinned + outcome.pruned_by_memory + outcome.unresolved,
            ),
        outcome.cannot_beat,
        outcome.pruned_by_memory,
        outcome.infeasible,
        outcome.work_done,
        budget,
        outcome.search_secs
    );
}

fn outcome_devices(plan: &Plan) -> usize {
    plan.cluster
        .layout
        .nodes
        .iter()
        .map(|n| n.devices.len())
        .sum()
}
