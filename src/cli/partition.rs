//! `pipecut partition MODEL --cluster 1x4xH100-SXM [--stages K|auto] ... --out plan.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cost::{Catalog, Cluster, LinkChoice, Schedule};
use crate::onnx::inspect::{count_of, human_bytes};
use crate::partition::torch_split::{torch_split, TorchSplitOutcome, DEFAULT_SPLIT_TOLERANCE};
use crate::partition::{
    CostSettings, CutConstraints, HeuristicReason, PartitionConfig, Planner, SolveStatus,
    SolverChoice, SolverKind, StageCount,
};
use crate::plan::engines;
use crate::plan::{Plan, PlanContext, PlanOptions};
use anyhow::Context;
use clap::{Args, ValueEnum};

use super::cost::{ModeArg, UnknownOpArg};
use super::{print_stdout, write_atomically, ModelArgs};

/// Where the devices come from: exactly one of the three.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ClusterSource {
    /// Cluster shorthand NODESxGPUSxDEVICE, e.g. 2x8xH100-SXM (NVLink inside a node, the
    /// matching InfiniBand between nodes).
    #[arg(long)]
    cluster: Option<String>,
    /// Devices of one machine in pipeline order, e.g. A100-80GB,A100-80GB,L4,L4.
    #[arg(long)]
    devices: Option<String>,
    /// A cluster JSON file (see docs/cost-model.md).
    #[arg(long)]
    cluster_file: Option<PathBuf>,
}

/// The cluster options shared by the commands that plan.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    source: ClusterSource,
    /// Override the link inside each machine (a name from cost-models/links).
    #[arg(long, value_name = "LINK")]
    intra_link: Option<String>,
    /// Override the network between machines.
    #[arg(long, value_name = "LINK")]
    inter_link: Option<String>,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
}

impl ClusterArgs {
    /// The profiles the cluster may name: built-in, user folders, `--device-profile` files and
    /// `.json` files named as devices.
    pub fn catalog(&self) -> anyhow::Result<Catalog> {
        let specs: Vec<&str> = [&self.source.cluster, &self.source.devices]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        self.profiles.catalog(&specs)
    }

    pub fn build(&self, catalog: &Catalog) -> anyhow::Result<Cluster> {
        // The shorthands are built with the links named, so that devices without a default
        // link (the CPU) can share a node when one is given.
        let links = LinkChoice {
            intra: self.intra_link.as_deref(),
            inter: self.inter_link.as_deref(),
        };
        let cluster = match (
            &self.source.cluster,
            &self.source.devices,
            &self.source.cluster_file,
        ) {
            (Some(spec), _, _) => return Ok(Cluster::parse_linked(spec, catalog, links)?),
            (_, Some(list), _) => {
                return Ok(Cluster::from_device_list_linked(list, catalog, links)?)
            }
            (_, _, Some(path)) => Cluster::from_file(path, catalog)?,
            _ => anyhow::bail!("give one of --cluster, --devices or --cluster-file"),
        };
        let mut cluster = cluster;
        if let Some(link) = links.intra {
            cluster = cluster.with_intra_node_link(link, catalog)?;
        }
        if let Some(link) = links.inter {
            cluster = cluster.with_inter_node_link(link, catalog)?;
        }
        Ok(cluster)
    }
}

/// `--schedule gpipe|1f1b|interleaved[:v]|zero-bubble`.
pub fn parse_schedule(text: &str) -> Result<Schedule, String> {
    text.parse()
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SolverArg {
    Dp,
    Milp,
    Auto,
}

impl From<SolverArg> for SolverChoice {
    fn from(s: SolverArg) -> SolverChoice {
        match s {
            SolverArg::Dp => SolverChoice::Dp,
            SolverArg::Milp => SolverChoice::Milp,
            SolverArg::Auto => SolverChoice::Auto,
        }
    }
}

/// Parses a duration: a plain number of seconds, or numbers with units `h`, `m`, `s`, `ms`,
/// alone or combined largest first (`10s`, `500ms`, `2m`, `1h`, `1m30s`, `1.5h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let refuse = || {
        format!("'{text}' is not a duration between 0 and 24 h (e.g. 10s, 500ms, 2m, 1h, 1m30s)")
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(refuse());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return within_a_day(secs).ok_or_else(refuse);
    }
    // Units in the order they may appear; `ms` before `m` so that "500ms" is not "500m" + "s".
    const UNITS: [(&str, f64); 4] = [("h", 3600.0), ("ms", 1e-3), ("m", 60.0), ("s", 1.0)];
    let mut rest = t;
    let mut total = 0.0;
    let mut last_rank = None;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(refuse)?;
        let number: f64 = rest[..digits].parse().map_err(|_| refuse())?;
        let after = &rest[digits..];
        let (rank, (unit, scale)) = UNITS
            .iter()
            .enumerate()
            .find(|(_, (unit, _))| after.starts_with(unit))
            .ok_or_else(refuse)?;
        // Each unit once, largest first: "30s1m" is more likely a typo than a duration.
        let order = [0, 3, 1, 2][rank];
        if last_rank.is_some_and(|last| order <= last) {
            return Err(refuse());
        }
        last_rank = Some(order);
        total += number * scale;
        rest = &after[unit.len()..];
    }
    within_a_day(total).ok_or_else(refuse)
}

/// `secs` as a duration when it is between 0 and 24 h.
fn within_a_day(secs: f64) -> Option<Duration> {
    (secs.is_finite() && (0.0..=86_400.0).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    #[command(flatten)]
    select: super::select::SelectArgs,
    /// Number of pipeline stages, or `auto` for the count with the best simulated throughput.
    #[arg(long, default_value = "auto")]
    stages: StageCount,
    /// Micro-batches per step, at most 65,536 (the micro-batch size is the batch dim bound with
    /// --dim).
    #[arg(long, default_value_t = 8)]
    microbatches: u32,
    /// Pipeline schedule: gpipe, 1f1b, interleaved[:v] (v chunks per device, default 2; the
    /// stages are v·K chunks, chunk c·K + d on device d) or zero-bubble (ZB-H1).
    #[arg(long, default_value = "1f1b", value_parser = parse_schedule)]
    schedule: Schedule,
    /// Inference (forward only) or training (forward, backward, optimizer state).
    #[arg(long, value_enum, default_value = "inference")]
    mode: ModeArg,
    /// In training, recompute each micro-batch's activations in the backward (full) instead of
    /// keeping them (none): a stage keeps one micro-batch's activations and runs one more
    /// forward; or recompute only attention's score tensors (selective). (`plan-cluster` also
    /// searches ZeRO stages over its replicas.)
    #[arg(long, default_value = "none", value_name = "none|selective|full")]
    recompute: crate::cost::Recompute,
    /// In training, whose way of keeping activations the memory follows: torch (eager autograd,
    /// attention through SDPA), megatron (its fused kernels, dropout 0.1) or onnx (every
    /// intermediate of the graph, as pipecut's own runtime keeps them). Default: the --emit
    /// target's engine (torch-split-spec and deepspeed-config: torch; megatron-args:
    /// megatron), else onnx. The plan records it; `check` re-derives with it.
    #[arg(long, value_name = "torch|megatron|onnx")]
    memory_model: Option<crate::cost::MemoryModel>,
    /// Fraction of each device's memory kept free for the runtime.
    #[arg(long, default_value_t = 0.10)]
    memory_headroom: f64,
    /// Wall-clock budget for the whole command (e.g. 10s, 500ms, 2m, 1h, 1m30s), counted from
    /// its start: loading the model and inferring its shapes (the output prints their time:
    /// seconds for a million-node model), the solve, the plan's figures and its output; the
    /// MILP stops at it with its best plan and gap. When loading alone spends it, the plan is
    /// the quickest one: a balanced split of one order. A plan stopped by the limit depends on
    /// the machine's speed; a finished one is the same on every run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    time_limit: Duration,
    /// Stop each search after this many units of its own work (ideal-search nodes, bound edge
    /// visits) instead of at the time limit, for the same plan on every machine; the MILP, which
    /// has no such count, does not run.
    #[arg(long, value_name = "UNITS")]
    work_budget: Option<u64>,
    /// dp: the exact DP over one topological order (fast); milp: the DP, then the MILP over all
    /// convex partitions; auto: the MILP only where the DP's plan is not proven optimal.
    #[arg(long, value_enum, default_value = "auto")]
    solver: SolverArg,
    /// Keep this tensor's producer and readers on one stage (repeatable): no cut crosses it,
    /// and everything on a path between them stays with them.
    #[arg(long = "forbid-cut", value_name = "TENSOR")]
    forbid_cut: Vec<String>,
    /// Allow cuts between a MatMul and the Add of its bias (kept together by default: the cut
    /// sends the same bytes as one after the Add and splits one linear layer).
    #[arg(long)]
    cut_anywhere: bool,
    /// Cut only at module boundaries: between the repeated layers pipecut detects (the
    /// `layer` column of `pipecut inspect`), never inside one.
    #[arg(long)]
    cut_between_layers: bool,
    /// Put a stage boundary on this tensor (repeatable): its producer and every reader on
    /// different stages.
    #[arg(long = "pin-cut", value_name = "TENSOR")]
    pin_cut: Vec<String>,
    /// Keep every reader of a shared (tied) weight on one stage, with everything between them,
    /// instead of a copy of it on each stage that reads it.
    #[arg(long)]
    keep_tied_weights: bool,
    /// How to cost ops without a rule: refuse (error), as free (zero), or as a copy (bytes).
    #[arg(long, value_enum, default_value = "error")]
    unknown_op_cost: UnknownOpArg,
    /// Cost every floating-point tensor at this precision instead of the file's (exporters
    /// usually write fp32; training and serving run bf16 or fp16): memory, transfers and the
    /// tensor-core peak follow it. The plan records it.
    #[arg(long, value_enum, value_name = "bf16|fp16|fp32")]
    dtype: Option<super::DtypeArg>,
    /// The regex DeepSpeed's `partition_method="type:REGEX"` baseline is given, matched (as
    /// DeepSpeed does: lowercased, case-insensitive, anywhere in the name) against the layer
    /// names the baselines table reports (`/model/layers.3`, `prologue`). The default picks
    /// the numbered blocks, as Megatron-DeepSpeed's `type:transformer` picks its transformer
    /// layers.
    #[arg(long, value_name = "REGEX", default_value = crate::partition::baselines::DEFAULT_LAYER_TYPE, value_parser = parse_layer_type)]
    baseline_layer_type: String,
    /// Write the plan JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the plan JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Record the solver's wall-clock time in the plan (the plan then differs between runs).
    #[arg(long)]
    record_solve_time: bool,
    /// Also print the plan in another tool's terms. torch-split-spec: the `split_spec` of
    /// torch.distributed.pipelining and DeepSpeed's layer `parts`, with the stage boundaries
    /// moved to module boundaries; megatron-args, deepspeed-config: those engines' settings
    /// for a training plan (with --json: `{"plan": …, "torch_split" | "megatron" |
    /// "deepspeed": …}`).
    #[arg(long, value_enum)]
    emit: Option<EmitArg>,
    /// How much moving the stage boundaries to module boundaries may raise the bottleneck, as a
    /// fraction (0.05 = 5 %).
    #[arg(long, default_value_t = DEFAULT_SPLIT_TOLERANCE, value_name = "FRACTION", requires = "emit")]
    split_tolerance: f64,
}

/// What `--emit` adds to the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmitArg {
    /// torch.distributed.pipelining `split_spec` and DeepSpeed `parts`.
    TorchSplitSpec,
    /// Megatron-LM's arguments: parallel sizes, batch, recomputation, distributed optimizer,
    /// and the stages as `--pipeline-model-parallel-layout` (training plans).
    MegatronArgs,
    /// DeepSpeed's `ds_config` and its `PipelineModule`'s `parts` (training plans).
    DeepspeedConfig,
}

/// The memory model of `--memory-model`, or the one of the engine `--emit` targets: torch's
/// for torch.distributed and DeepSpeed (which run torch modules), Megatron's for its
/// arguments, and with no target the ONNX graph's, which pipecut's own runtime executes.
pub(super) fn memory_model(
    asked: Option<crate::cost::MemoryModel>,
    emit: Option<EmitArg>,
) -> crate::cost::MemoryModel {
    use crate::cost::MemoryModel;
    asked.unwrap_or(match emit {
        Some(EmitArg::TorchSplitSpec | EmitArg::DeepspeedConfig) => MemoryModel::Torch,
        Some(EmitArg::MegatronArgs) => MemoryModel::Megatron,
        None => MemoryModel::Onnx,
    })
}

/// `--memory-model` counts what a backward keeps: refused in inference, like `--recompute`.
pub(super) fn refuse_memory_model_in_inference(
    asked: Option<crate::cost::MemoryModel>,
    mode: super::cost::ModeArg,
) -> anyhow::Result<()> {
    if asked.is_some() && matches!(mode, super::cost::ModeArg::Inference) {
        anyhow::bail!("--memory-model applies to training (add --mode training): inference keeps no activations for a backward");
    }
    Ok(())
}

/// What `--emit` adds: the plan in another tool's terms, as JSON (under `key` beside the plan
/// with --json) and as text for the table.
pub(super) struct Emitted {
    key: &'static str,
    value: serde_json::Value,
    text: String,
}

/// Builds what `--emit` asks for, from the plan and the solution it was made from.
pub(super) fn emitted(
    emit: Option<EmitArg>,
    plan: &Plan,
    solution: &crate::partition::Solution,
    tolerance: f64,
) -> anyhow::Result<Option<Emitted>> {
    let Some(emit) = emit else {
        return Ok(None);
    };
    let split = torch_split(&solution.problem, &solution.stage_of, tolerance)?;
    let placed = match &split {
        TorchSplitOutcome::Split(split) => Some(split),
        TorchSplitOutcome::NoModuleBoundaries { .. } => None,
    };
    Ok(Some(match emit {
        EmitArg::TorchSplitSpec => Emitted {
            key: "torch_split",
            value: serde_json::to_value(&split)?,
            text: torch_split_text(&split),
        },
        EmitArg::MegatronArgs => {
            let value = engines::megatron_args(plan, placed)?;
            let words: Vec<String> = value["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .map(shell_word)
                .collect();
            let notes: Vec<&str> = value["notes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect();
            let mut text = format!(
                "\nMegatron-LM arguments (world size {}):\n{}\n",
                value["world_size"],
                words.join(" ")
            );
            for note in notes {
                text.push_str(&format!("note: {note}\n"));
            }
            Emitted {
                key: "megatron",
                value,
                text,
            }
        }
        EmitArg::DeepspeedConfig => {
            let value = engines::deepspeed_config(plan, placed)?;
            let text = format!("\nDeepSpeed:\n{}\n", serde_json::to_string_pretty(&value)?);
            Emitted {
                key: "deepspeed",
                value,
                text,
            }
        }
    }))
}

/// One shell word: as it is when it holds only characters no shell interprets, else in single
/// quotes (a `'` inside closed, escaped and reopened), so pasting the line runs no code.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=,:+".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

pub fn run(args: PartitionArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    if !args.recompute.is_none() && matches!(args.mode, super::cost::ModeArg::Inference) {
        anyhow::bail!("--recompute applies to training (add --mode training): inference keeps no activations for a backward");
    }
    refuse_memory_model_in_inference(args.memory_model, args.mode)?;
    if let Some(out) = &args.out {
        super::check_output(out, &[&args.model.model])?;
    }
    // The arguments before the model: a bad cluster is named without loading anything.
    let catalog = args.cluster.catalog()?;
    let cluster = args.cluster.build(&catalog)?;
    // --time-limit covers the whole command, loading and shape inference included, as
    // plan-cluster's does (docs/algorithms.md, "Limits at any size"); loading is timed apart
    // for the output and for what writing the plan will take.
    let loading = std::time::Instant::now();
    let mut model = args.model.load_bound(super::Weights::NotRead)?;
    let load_secs = loading.elapsed().as_secs_f64();
    let dtype_override = args.dtype.map(crate::cost::Precision::from);
    if let Some(precision) = dtype_override {
        model.graph.override_float_dtype(precision.dtype());
    }
    let dims: BTreeMap<String, u64> = args.model.dims()?;
    let values = args.model.sample_values(&model.graph)?;
    args.measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &dims,
        &super::measured::device_names(&cluster),
    )?;
    let left = args.time_limit.saturating_sub(started.elapsed());
    let config = partition_config(&args, model.graph.node_count(), load_secs, left);
    let mut solution = solve(&model.graph, &cluster, config)
        .with_context(|| format!("'{}'", args.model.model.display()))?;
    let selection = match args.select.select_by_running {
        Some(rounds) => super::select::select(
            &model.graph,
            &args.model.model,
            &cluster,
            &mut solution,
            rounds,
        )?,
        None => None,
    };
    let file_name = super::model_file_name(&args.model.model);
    let mut plan = Plan::from_solution(
        &solution,
        PlanContext {
            model: model.digests(),
            model_file_name: &file_name,
            graph: &model.graph,
            dims: &dims,
            cluster: &cluster,
            stages: args.stages,
            time_limit_secs: args.time_limit.as_secs_f64(),
            dtype_override,
        },
        PlanOptions {
            record_solve_time: args.record_solve_time,
        },
    )
    .with_values(values);
    plan.summary.measured_selection = selection;
    plan.ensure_finite()?;
    // The text is made whole only to be printed; a file gets it as it is made.
    let json = args.json.then(|| plan.to_json());
    if let Some(out) = &args.out {
        match &json {
            Some(json) => write_atomically(out, json.as_bytes(), &[&args.model.model])?,
            None => super::write_atomically_with(out, &[&args.model.model], |file| {
                plan.write_json(file)
            })?,
        }
    }
    let emitted = emitted(args.emit, &plan, &solution, args.split_tolerance)?;
    if let Some(json) = &json {
        print_json(json, emitted.as_ref())?;
    } else {
        print_text(
            &args,
            &plan,
            &solution,
            &model.graph,
            &cluster,
            load_secs,
            emitted.as_ref(),
        )?;
    }
    // The process ends here and the OS takes the memory back at once; freeing a large model's
    // strings and vectors one by one took over half a second at 100k nodes, after the plan.
    std::mem::forget((model, solution, plan));
    Ok(ExitCode::SUCCESS)
}

/// The partitioner's settings from the arguments; the solve gets `solve_share` of what is
/// `left` of the time limit.
fn partition_config(
    args: &PartitionArgs,
    nodes: usize,
    load_secs: f64,
    left: std::time::Duration,
) -> PartitionConfig {
    PartitionConfig {
        stages: args.stages,
        devices: Vec::new(),
        settings: CostSettings {
            mode: crate::cost::Mode::from(args.mode)
                .with_memory_techniques(args.recompute, crate::cost::ZeroSharding::NONE)
                .with_memory_model(memory_model(args.memory_model, args.emit)),
            schedule: args.schedule,
            microbatches: args.microbatches,
            memory_headroom: args.memory_headroom,
            unknown_ops: args.unknown_op_cost.into(),
        },
        time_limit: solve_share(left, nodes, load_secs),
        solver: args.solver.into(),
        work_budget: args.work_budget,
        cut_constraints: CutConstraints {
            forbid: args.forbid_cut.clone(),
            bias_with_matmul: !args.cut_anywhere,
            between_layers_only: args.cut_between_layers,
            tied_weights_together: args.keep_tied_weights,
            pin: args.pin_cut.clone(),
            tensor_parallel_blocks: 0,
        },
        baseline_layer_type: args.baseline_layer_type.clone(),
    }
}

/// Runs the planner, its progress on stderr.
fn solve(
    graph: &crate::graph::Graph,
    cluster: &Cluster,
    config: PartitionConfig,
) -> Result<crate::partition::Solution, crate::Error> {
    let display = super::progress::Display::start(&format!(
        "partitioning {} over {}",
        count_of(graph.node_count(), "node"),
        count_of(cluster.device_count(), "device")
    ));
    let reporter = std::sync::Arc::clone(&display);
    let solved = Planner::new(graph, cluster)
        .with_config(config)
        .with_progress(move |progress| reporter.report(progress))
        .solve();
    display.finish();
    solved
}

/// The readable output: the table, the load time, the MFU line, the MILP's line, the measured
/// selection, the PyTorch split points, the file written.
fn print_text(
    args: &PartitionArgs,
    plan: &Plan,
    solution: &crate::partition::Solution,
    graph: &crate::graph::Graph,
    cluster: &Cluster,
    load_secs: f64,
    emitted: Option<&Emitted>,
) -> anyhow::Result<()> {
    print_stdout(&table(plan, Some(solution.solve_secs)))?;
    print_stdout(&load_line(load_secs, args.time_limit))?;
    let simulation = plan.simulate()?;
    let batch = plan.model.dims.get("batch").copied().unwrap_or(1);
    print_stdout(&super::efficiency::efficiency_line(
        &super::efficiency::StepWork {
            graph,
            mode: plan.config.mode,
            unknown_ops: plan.config.unknown_op_cost,
            microbatches: plan.config.microbatches as f64,
            microbatch_size: batch,
            sequence: super::efficiency::sequence_dim(&plan.model.dims),
            step_secs: simulation.step_secs,
            forward_flops: solution.problem.forward_flops(),
            cluster,
            devices: plan
                .stages
                .iter()
                .map(|s| crate::cost::DeviceId(s.device.id))
                .collect(),
        },
    )?)?;
    if let Some(report) = &solution.milp {
        print_stdout(&milp_line(report))?;
    }
    if let Some(selection) = &plan.summary.measured_selection {
        print_stdout(&super::select::selection_text(selection))?;
    }
    if let Some(emitted) = emitted {
        print_stdout(&emitted.text)?;
    }
    if let Some(out) = &args.out {
        print_stdout(&format!("wrote {}\n", out.display()))?;
    }
    Ok(())
}

/// How long loading took, against `--time-limit`, which covers it: a load that spent the whole
/// limit says so (the status line then says what the plan is), where "within the limit" read as
/// if it had fitted.
fn load_line(load_secs: f64, time_limit: Duration) -> String {
    let limit = time_limit.as_secs_f64();
    match load_secs < limit {
        true => format!(
            "loaded and typed in {load_secs:.3} s of the {limit} s --time-limit (it covers the whole command)\n"
        ),
        false => format!(
            "loaded and typed in {load_secs:.3} s, past the {limit} s --time-limit (it covers the whole command): the solve began with no time left\n"
        ),
    }
}

/// What writing the plan costs per node after the solve (its figures, the schedule's
/// simulation, the MFU line (from the FLOPs the solve counted), the JSON, the table, the
/// exit): 0.7 µs on the 2-core VM when quiet, measured on the 100k- and 1M-node stacks of `benches/scale.sh`
/// (docs/benchmarks.md). The least kept back from the solve.
const OUTPUT_SECS_PER_NODE: f64 = 1e-6;

/// The same cost as a fraction of the time the model took to load and type, in this run: both
/// are linear passes over the nodes that allocate as they go, so a busy machine slows them
/// alike, and the load just measured says how busy the machine is now. A fixed rate per node
/// could not: under a load average of 7 on 2 cores writing took 3 µs a node at 20k and 100k
/// nodes, four times the quiet rate (docs/benchmarks.md, "Limits at any size"). Measured
/// after the solve on the 20k- and 100k-node stacks of `benches/scale.sh`: 0.19–0.24 of the
/// load's time in eight runs at load averages of 3.5–5.8.
const OUTPUT_SECS_PER_LOAD_SEC: f64 = 0.25;

/// The part of `limit` the solve gets: the rest is kept for writing the plan of `nodes` nodes,
/// whose loading and typing took `load_secs`, at most half of it.
fn solve_share(limit: std::time::Duration, nodes: usize, load_secs: f64) -> std::time::Duration {
    let output = (nodes as f64 * OUTPUT_SECS_PER_NODE).max(load_secs * OUTPUT_SECS_PER_LOAD_SEC);
    limit - std::time::Duration::from_secs_f64(output).min(limit / 2)
}

/// What the MILP did, in one line.
fn milp_line(report: &crate::partition::MilpReport) -> String {
    let graph = if report.coarsened {
        format!("a coarsened graph of {} super-nodes", report.nodes)
    } else {
        format!("all {} nodes", report.nodes)
    };
    let outcome = match (&report.error, report.started, report.proven, report.stopped) {
        _ if report.too_large => format!(
            "not built: the model is too large for the MILP (more than {} node × boundary cells)",
            crate::partition::milp::MAX_MODEL_CELLS
        ),
        (Some(error), _, _, _) => format!("the solver failed ({error})"),
        (None, false, _, _) => "never started: the time limit left no room after coarsening".into(),
        (None, true, true, _) if report.coarsened => "optimal over the coarsened graph".into(),
        (None, true, true, _) => "proven optimal".into(),
        (None, true, false, Some(stop)) => stop.describe().into(),
        (None, true, false, None) => "stopped without a proof".into(),
    };
    let improved = if report.improved {
        "improved on the DP's plan"
    } else {
        "kept the DP's plan"
    };
    format!("MILP on {graph}: {outcome}; {improved}\n")
}

/// The split points for PyTorch and DeepSpeed, or why there are none.
/// Prints the plan JSON, or with `--emit` `{"plan": …, KEY: …}` (`torch_split`, `megatron`,
/// `deepspeed`).
pub(super) fn print_json(json: &str, emitted: Option<&Emitted>) -> anyhow::Result<()> {
    match emitted {
        Some(emitted) => {
            let plan_value: serde_json::Value = serde_json::from_str(json)?;
            let mut both = serde_json::Map::new();
            both.insert("plan".to_string(), plan_value);
            both.insert(emitted.key.to_string(), emitted.value.clone());
            print_stdout(&format!("{}\n", serde_json::to_string_pretty(&both)?))?;
        }
        None => print_stdout(json)?,
    }
    Ok(())
}

/// The text of `emitted` for the table.
pub(super) fn emitted_text(emitted: &Emitted) -> &str {
    &emitted.text
}

fn torch_split_text(outcome: &TorchSplitOutcome) -> String {
    use std::fmt::Write;
    let split = match outcome {
        TorchSplitOutcome::Split(split) => split,
        TorchSplitOutcome::NoModuleBoundaries { reason } => {
            return format!("\nPyTorch split points: {reason}\n");
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nPyTorch split points ({} blocks of {}):",
        split.block_count, split.family
    );
    for b in &split.boundaries {
        let _ = writeln!(
            out,
            "  stage {} begins at {} (position {}; the plan cut at {})",
            b.stage, b.module, b.position, b.plan_position
        );
    }
    let tolerance = format!("{:.1}%", split.tolerance * 100.0);
    let verdict = match (split.within_tolerance, split.fits, split.searched) {
        (true, _, false) => format!("within the {tolerance} tolerance"),
        (true, _, true) => format!(
            "within the {tolerance} tolerance (the nearest boundaries were not; these were searched)"
        ),
        (false, true, _) => format!(
            "EXCEEDS the {tolerance} tolerance: the blocks are too coarse for this plan (these \
             are the best block boundaries found)"
        ),
        (false, false, _) => "does NOT fit memory at any block boundaries found".to_string(),
    };
    let _ = writeln!(
        out,
        "bottleneck {} ms at module boundaries vs {} ms for the plan ({:+.2}%), {verdict}\n",
        ms(split.bottleneck_secs),
        ms(split.plan_bottleneck_secs),
        split.bottleneck_change * 100.0,
    );
    out.push_str(&split.split_spec_python());
    out.push('\n');
    out.push_str(&split.deepspeed_parts_python());
    out
}

/// A `--baseline-layer-type` that compiles as a regex.
pub(super) fn parse_layer_type(text: &str) -> Result<String, String> {
    crate::partition::baselines::check_layer_type(text).map(|()| text.to_string())
}

/// How much faster the plan is than a baseline (its bottleneck over the plan's), with a tie
/// said as one: "1.00× faster" reads as a rounding of a loss or a win.
fn speedup_text(speedup: f64) -> String {
    if (speedup - 1.0).abs() < 0.005 {
        "tie (within 0.5%)".to_string()
    } else if speedup > 1.0 {
        format!("{speedup:.2}× faster")
    } else {
        format!("{:.2}× slower", 1.0 / speedup)
    }
}

fn ms(secs: f64) -> String {
    format!("{:.3}", secs * 1e3)
}

/// The readable summary: one row per stage, then the proof and the baselines.
pub fn table(plan: &Plan, solve_secs: Option<f64>) -> String {
    let mut out = String::new();
    heading(&mut out, plan);
    stage_rows(&mut out, plan);
    proof_lines(&mut out, plan, solve_secs);
    stage_count_rows(&mut out, plan);
    baseline_rows(&mut out, plan);
    out
}

/// The table's first line: model, cluster, stages, mode, micro-batches and schedule.
fn heading(out: &mut String, plan: &Plan) {
    use std::fmt::Write;
    let c = &plan.config;
    let _ = writeln!(
        out,
        "{} ({}) on {}: {}, {}, {}, {} schedule",
        plan.model.file_name,
        count_of(plan.model.nodes, "node"),
        plan.cluster.description,
        match c.schedule.chunks() {
            1 => count_of(plan.stages.len(), "stage"),
            v => format!(
                "{} ({v} chunks on each of {})",
                count_of(plan.stages.len(), "stage"),
                count_of(plan.stages.len() / v, "device")
            ),
        },
        match c.mode {
            crate::cost::Mode::Inference => "inference mode".to_string(),
            // Which engine's activations the memory counts: the figures depend on it.
            crate::cost::Mode::Training { memory_model, .. } => {
                format!("training mode, {} memory model", memory_model.name())
            }
        },
        count_of(c.microbatches as usize, "micro-batch"),
        c.schedule
    );
}

/// One row per stage, the bottleneck stage marked.
fn stage_rows(out: &mut String, plan: &Plan) {
    use std::fmt::Write;
    // As wide as the longest device name, so that A100-SXM-80GB does not push its row over.
    let device_width = plan
        .stages
        .iter()
        .map(|s| s.device.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(12);
    let _ = writeln!(
        out,
        "\n{:>5}  {:<device_width$} {:>6}  {:<28} {:<28} {:>10} {:>21} {:>11} {:>9} {:>10}",
        "stage",
        "device",
        "nodes",
        "first node",
        "last node",
        "params",
        "memory / capacity",
        "compute ms",
        "comm ms",
        "stage ms"
    );
    let clip = |s: &str| super::shorten_name(s, 28);
    for s in &plan.stages {
        let memory = format!(
            "{} / {}",
            human_bytes(s.peak_memory_bytes),
            human_bytes(s.capacity_bytes)
        );
        let marker = if (s.stage_secs - plan.summary.bottleneck_secs).abs()
            <= 1e-12 * plan.summary.bottleneck_secs
        {
            " ◀"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{:>5}  {:<device_width$} {:>6}  {:<28} {:<28} {:>10} {:>21} {:>11} {:>9} {:>10}{marker}",
            s.stage,
            s.device.name,
            s.node_count,
            clip(&s.first_node),
            clip(&s.last_node),
            human_bytes(s.param_bytes),
            memory,
            ms(s.compute_secs),
            ms(s.receive_secs + s.gradient_receive_secs),
            ms(s.stage_secs)
        );
    }
}

/// The bottleneck against its lower bound and what is proven, the bytes crossing, and which
/// solver found the plan.
fn proof_lines(out: &mut String, plan: &Plan, solve_secs: Option<f64>) {
    use std::fmt::Write;
    let summary = &plan.summary;
    let status = summary.status.describe(summary.gap);
    let _ = writeln!(
        out,
        "\nbottleneck {} ms per micro-batch ({:.1} micro-batches/s), lower bound {} ms: {status}",
        ms(summary.bottleneck_secs),
        summary.microbatches_per_sec,
        ms(summary.lower_bound_secs),
    );
    if let Some(bounds) = &summary.bounds {
        let _ = writeln!(out, "lower bounds proved: {}", bounds.describe());
    }
    let _ = writeln!(
        out,
        "{} cross between stages per micro-batch; {}{}",
        human_bytes(summary.cut_bytes),
        found_by(summary.solver, summary.status),
        solve_secs.map_or(String::new(), |secs| format!(" (solved in {secs:.3} s)"))
    );
}

/// Which solver found the plan, and which did not improve on it.
fn found_by(solver: SolverKind, status: SolveStatus) -> &'static str {
    match (solver, status) {
        (_, SolveStatus::HandEdited) => "plan edited by hand",
        (SolverKind::Milp, _) => "plan found by the MILP (improving on the DP's)",
        (SolverKind::IdealSearch, _) => "plan found by the ideal search (improving on the DP's)",
        (
            SolverKind::Dp,
            SolveStatus::Heuristic {
                reason: HeuristicReason::DpOnly,
            },
        ) => "plan found by the DP",
        (SolverKind::Dp, SolveStatus::Optimal) => "plan found by the DP",
        (
            SolverKind::Dp,
            SolveStatus::Heuristic {
                reason: HeuristicReason::WorkBudget | HeuristicReason::TooLargeToSearch,
            },
        ) => "plan found by the DP; the ideal search did not improve on it",
        (SolverKind::Dp, _) => "plan found by the DP; the MILP did not improve on it",
    }
}

/// Under `--stages auto`, every stage count tried, the chosen one marked.
fn stage_count_rows(out: &mut String, plan: &Plan) {
    use std::fmt::Write;
    let summary = &plan.summary;
    if summary.stage_count_candidates.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nstages  bottleneck ms  step ms  bubble");
    for cand in &summary.stage_count_candidates {
        match (cand.bottleneck_secs, cand.step_secs, cand.bubble_fraction) {
            (Some(b), Some(step), Some(bubble)) => {
                let chosen = if cand.stages == plan.stages.len() {
                    " ◀"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "{:>6}  {:>13} {:>8}  {:>5.1}%{chosen}",
                    cand.stages,
                    ms(b),
                    ms(step),
                    bubble * 100.0
                );
            }
            _ => {
                let _ = writeln!(out, "{:>6}  does not fit", cand.stages);
            }
        }
    }
}

/// The peers' methods on the same problem, and how the plan compares with each.
fn baseline_rows(out: &mut String, plan: &Plan) {
    use std::fmt::Write;
    let summary = &plan.summary;
    // Plans from before schema version 4 do not name the release; this build's is the one
    // that re-derives them.
    let peers: Vec<String> = summary
        .baselines
        .iter()
        .map(|b| match b.peer.is_empty() {
            true => b.method.peer(&plan.config.baseline_layer_type),
            false => b.peer.clone(),
        })
        .collect();
    let width = peers.iter().map(|p| p.chars().count()).fold(30, usize::max);
    if !summary.baseline_layers.is_empty() {
        let _ = writeln!(
            out,
            "\nDeepSpeed and torchgpipe cut {}",
            summary.baseline_layers
        );
    } else {
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "{:<width$} bottleneck ms  fits  pipecut is",
        "baseline"
    );
    for (b, label) in summary.baselines.iter().zip(&peers) {
        match (b.bottleneck_secs, b.fits, b.plan_speedup) {
            (Some(secs), Some(fits), Some(speedup)) => {
                let _ = writeln!(
                    out,
                    "{label:<width$} {:>13} {:>5}  {}",
                    ms(secs),
                    if fits { "yes" } else { "no" },
                    speedup_text(speedup)
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "{label:<width$} fails: {}",
                    b.error.as_deref().unwrap_or("no result")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_of_a_large_plan_is_kept_out_of_the_solves_share_of_the_limit() {
        use std::time::Duration;
        let second = Duration::from_secs(1);
        // 1 µs a node at least: nothing to keep for a small model, 0.1 s of a second for 100k
        // nodes that loaded at once.
        assert_eq!(solve_share(second, 0, 0.0), second);
        let share = solve_share(second, 100_000, 0.0).as_secs_f64();
        assert!((share - 0.9).abs() < 1e-6, "{share}");
        // A model slow to load on a busy machine is slow to write too: more is kept.
        let busy = solve_share(second, 100_000, 1.0).as_secs_f64();
        let expected = 1.0 - OUTPUT_SECS_PER_LOAD_SEC;
        assert!((busy - expected).abs() < 1e-6, "{busy}");
        // Never more than half the limit, whatever the model.
        assert_eq!(
            solve_share(second, 10_000_000, 0.0),
            Duration::from_millis(500)
        );
        assert_eq!(solve_share(second, 1_000, 60.0), Duration::from_millis(500));
    }

    #[test]
    fn a_tie_with_a_baseline_is_said_as_one() {
        assert_eq!(speedup_text(1.002), "tie (within 0.5%)");
        assert_eq!(speedup_text(0.998), "tie (within 0.5%)");
        assert_eq!(speedup_text(1.71), "1.71× faster");
        assert_eq!(speedup_text(0.5), "2.00× slower");
    }

    #[test]
    fn durations_take_every_unit_the_message_names() {
        let secs = |t: &str| parse_duration(t).map(|d| d.as_secs_f64());
        assert_eq!(secs("10"), Ok(10.0));
        assert_eq!(secs("10s"), Ok(10.0));
        assert_eq!(secs("500ms"), Ok(0.5));
        assert_eq!(secs("2m"), Ok(120.0));
        assert_eq!(secs("1h"), Ok(3600.0));
        assert_eq!(secs("1.5h"), Ok(5400.0));
        assert_eq!(secs("1m30s"), Ok(90.0));
        assert_eq!(secs("1h2m3s4ms"), Ok(3723.004));
        for bad in ["", "h", "1x", "30s1m", "1s1s", "25h", "-5s", "1h-1m", "NaN"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("1h"), "{bad}: {err}");
        }
    }
}
