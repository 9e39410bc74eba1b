//! `pipecut partition MODEL --cluster 1x4xH100-SXM [--stages K|auto] ... --out plan.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use pipecut::cost::{Catalog, Cluster, Schedule};
use pipecut::onnx::inspect::human_bytes;
use pipecut::partition::torch_split::{torch_split, TorchSplitOutcome, DEFAULT_SPLIT_TOLERANCE};
use pipecut::partition::{CostSettings, PartitionConfig, Planner, SolverChoice, StageCount};
use pipecut::plan::{Plan, PlanContext, PlanOptions};

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
}

impl ClusterArgs {
    pub fn build(&self, catalog: &Catalog) -> anyhow::Result<Cluster> {
        let mut cluster = match (
            &self.source.cluster,
            &self.source.devices,
            &self.source.cluster_file,
        ) {
            (Some(spec), _, _) => Cluster::parse(spec, catalog)?,
            (_, Some(list), _) => Cluster::from_device_list(list, catalog)?,
            (_, _, Some(path)) => Cluster::from_file(path, catalog)?,
            _ => anyhow::bail!("give one of --cluster, --devices or --cluster-file"),
        };
        if let Some(link) = &self.intra_link {
            cluster = cluster.with_intra_node_link(link, catalog)?;
        }
        if let Some(link) = &self.inter_link {
            cluster = cluster.with_inter_node_link(link, catalog)?;
        }
        Ok(cluster)
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScheduleArg {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

impl From<ScheduleArg> for Schedule {
    fn from(s: ScheduleArg) -> Schedule {
        match s {
            ScheduleArg::Gpipe => Schedule::GPipe,
            ScheduleArg::OneFOneB => Schedule::OneFOneB,
        }
    }
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

/// Parses `10s`, `500ms`, `2m` or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale <= 86_400.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!(
            "'{text}' is not a duration between 0 and 24 h (e.g. 10s, 500ms, 2m)"
        )),
    }
}

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Number of pipeline stages, or `auto` for the count with the best simulated throughput.
    #[arg(long, default_value = "auto")]
    stages: StageCount,
    /// Micro-batches per step (the micro-batch size is the batch dim bound with --dim).
    #[arg(long, default_value_t = 8)]
    microbatches: u32,
    /// Pipeline schedule (decides activation memory in training).
    #[arg(long, value_enum, default_value = "1f1b")]
    schedule: ScheduleArg,
    /// Inference (forward only) or training (forward, backward, optimizer state).
    #[arg(long, value_enum, default_value = "inference")]
    mode: ModeArg,
    /// Fraction of each device's memory kept free for the runtime.
    #[arg(long, default_value_t = 0.10)]
    memory_headroom: f64,
    /// Time budget for the whole solve (e.g. 10s, 500ms): the MILP stops at it with its best
    /// plan and gap. A plan stopped by the limit depends on the machine's speed; a finished one
    /// is the same on every run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    time_limit: Duration,
    /// dp: the exact DP over one topological order (fast); milp: the DP, then the MILP over all
    /// convex partitions; auto: the MILP only where the DP's plan is not proven optimal.
    #[arg(long, value_enum, default_value = "auto")]
    solver: SolverArg,
    /// How to cost ops without a rule: refuse (error), as free (zero), or as a copy (bytes).
    #[arg(long, value_enum, default_value = "error")]
    unknown_op_cost: UnknownOpArg,
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
    /// moved to module boundaries (with --json: `{"plan": …, "torch_split": …}`).
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
}

pub fn run(args: PartitionArgs) -> anyhow::Result<ExitCode> {
    let model = args.model.load_typed(super::Weights::NotRead)?;
    let catalog = Catalog::builtin();
    let cluster = args.cluster.build(&catalog)?;
    let config = PartitionConfig {
        stages: args.stages,
        devices: Vec::new(),
        settings: CostSettings {
            mode: args.mode.into(),
            schedule: args.schedule.into(),
            microbatches: args.microbatches,
            memory_headroom: args.memory_headroom,
            unknown_ops: args.unknown_op_cost.into(),
        },
        time_limit: args.time_limit,
        solver: args.solver.into(),
    };
    let spinner = super::spinner(&format!(
        "partitioning {} nodes over {} devices",
        model.graph.node_count(),
        cluster.device_count()
    ));
    let solved = Planner::new(&model.graph, &cluster)
        .with_config(config)
        .solve();
    spinner.finish_and_clear();
    let solution = solved.with_context(|| format!("'{}'", args.model.model.display()))?;
    let dims: BTreeMap<String, u64> = args
        .model
        .bindings()?
        .iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let file_name = super::model_file_name(&args.model.model);
    let plan = Plan::from_solution(
        &solution,
        PlanContext {
            model_sha256: &model.sha256,
            model_file_name: &file_name,
            graph: &model.graph,
            dims: &dims,
            cluster: &cluster,
            stages: args.stages,
            time_limit_secs: args.time_limit.as_secs_f64(),
        },
        PlanOptions {
            record_solve_time: args.record_solve_time,
        },
    );
    let json = plan.to_json();
    if let Some(out) = &args.out {
        write_atomically(out, json.as_bytes())?;
    }
    let split = match args.emit {
        Some(EmitArg::TorchSplitSpec) => Some(torch_split(
            &solution.problem,
            &solution.stage_of,
            args.split_tolerance,
        )?),
        None => None,
    };
    if args.json {
        match &split {
            Some(split) => {
                let plan_value: serde_json::Value = serde_json::from_str(&json)?;
                let both = serde_json::json!({ "plan": plan_value, "torch_split": split });
                print_stdout(&format!("{}\n", serde_json::to_string_pretty(&both)?))?;
            }
            None => print_stdout(&json)?,
        }
    } else {
        print_stdout(&table(&plan, Some(solution.solve_secs)))?;
        if let Some(report) = &solution.milp {
            print_stdout(&milp_line(report))?;
        }
        if let Some(split) = &split {
            print_stdout(&torch_split_text(split))?;
        }
        if let Some(out) = &args.out {
            print_stdout(&format!("wrote {}\n", out.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What the MILP did, in one line.
fn milp_line(report: &pipecut::partition::MilpReport) -> String {
    let graph = if report.coarsened {
        format!("a coarsened graph of {} super-nodes", report.nodes)
    } else {
        format!("all {} nodes", report.nodes)
    };
    let outcome = match (report.proven, report.timed_out) {
        (true, _) if report.coarsened => "optimal over the coarsened graph",
        (true, _) => "proven optimal",
        (false, true) => "stopped at the time limit",
        (false, false) => "stopped without a proof",
    };
    let improved = if report.improved {
        "improved on the DP's plan"
    } else {
        "kept the DP's plan"
    };
    format!("MILP on {graph}: {outcome}; {improved}\n")
}

/// The split points for PyTorch and DeepSpeed, or why there are none.
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

fn ms(secs: f64) -> String {
    format!("{:.3}", secs * 1e3)
}

/// The readable summary: one row per stage, then the proof and the baselines.
pub fn table(plan: &Plan, solve_secs: Option<f64>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let c = &plan.config;
    let _ = writeln!(
        out,
        "{} ({} nodes) on {}: {} stages, {} mode, {} micro-batches, {} schedule",
        plan.model.file_name,
        plan.model.nodes,
        plan.cluster.description,
        plan.stages.len(),
        match c.mode {
            pipecut::cost::Mode::Inference => "inference",
            pipecut::cost::Mode::Training { .. } => "training",
        },
        c.microbatches,
        match c.schedule {
            Schedule::GPipe => "GPipe",
            Schedule::OneFOneB => "1F1B",
        }
    );
    let _ = writeln!(
        out,
        "\n{:>5}  {:<12} {:>6}  {:<28} {:<28} {:>10} {:>21} {:>11} {:>9} {:>10}",
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
    let clip = |s: &str| {
        if s.chars().count() > 28 {
            let tail: String = s
                .chars()
                .rev()
                .take(27)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!("…{tail}")
        } else {
            s.to_string()
        }
    };
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
            "{:>5}  {:<12} {:>6}  {:<28} {:<28} {:>10} {:>21} {:>11} {:>9} {:>10}{marker}",
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
    let summary = &plan.summary;
    let status = match summary.status {
        pipecut::partition::SolveStatus::Optimal => "proven optimal".to_string(),
        pipecut::partition::SolveStatus::TimeLimit { gap } => {
            format!("time limit reached, within {:.2}% of optimal", gap * 100.0)
        }
        pipecut::partition::SolveStatus::Heuristic => format!(
            "not proven optimal over all convex partitions; within {:.2}% of the lower bound",
            summary.gap * 100.0
        ),
    };
    let _ = writeln!(
        out,
        "\nbottleneck {} ms per micro-batch ({:.1} micro-batches/s), lower bound {} ms: {status}",
        ms(summary.bottleneck_secs),
        summary.microbatches_per_sec,
        ms(summary.lower_bound_secs),
    );
    let _ = writeln!(
        out,
        "{} cross between stages per micro-batch; solved by {}{}",
        human_bytes(summary.cut_bytes),
        serde_json::to_value(summary.solver)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        solve_secs.map_or(String::new(), |secs| format!(" in {secs:.3} s"))
    );
    if !summary.stage_count_candidates.is_empty() {
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
    let _ = writeln!(
        out,
        "\nbaseline                       bottleneck ms  fits  pipecut is"
    );
    for b in &summary.baselines {
        let label = b.method.label();
        match (b.bottleneck_secs, b.fits, b.plan_speedup) {
            (Some(secs), Some(fits), Some(speedup)) => {
                let _ = writeln!(
                    out,
                    "{label:<30} {:>13} {:>5}  {speedup:.2}× faster",
                    ms(secs),
                    if fits { "yes" } else { "no" }
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "{label:<30} not applicable: {}",
                    b.error.as_deref().unwrap_or("no result")
                );
            }
        }
    }
    out
}
