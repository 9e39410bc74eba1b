//! `pipecut bench-plans MODEL`: the optimiser's plan and every baseline's, run for real on the
//! CPU runtime, side by side.
//!
//! The plans run in paired rounds, one pinned core per stage, the cores rotated from round to
//! round ([`run_paired_rounds`], whose doc says why); matrix products run on the stage's thread
//! alone (`MATMUL_NUM_THREADS=1`). The figure compared is each round's ratio of measured
//! bottlenecks, the slowest stage's thread CPU time; its median over the rounds is reported,
//! beside the ratio of wall times. Stage shares are each stage's CPU time over the stages'
//! total, measured against the plan's predicted stage times. With `--select-by-running` the
//! optimiser's plan is the one `partition --select-by-running` would write (`select.rs`).
//! The report says how busy
//! the rest of the machine was meanwhile (`other_load`): figures from a busy machine are not
//! worth publishing.

use std::collections::BTreeMap;
use std::process::ExitCode;

use crate::cost::measured::percentiles;
use crate::cost::{Catalog, Cluster};
use crate::graph::NodeId;
use crate::partition::{CostSettings, PartitionConfig, Planner, StageCount, StageId};
use crate::plan::MeasuredSelection;
use crate::runtime::paired::run_paired_rounds;
use crate::runtime::{seeded_inputs, stage_specs, CpuExecutor, Executor, Weights};
use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::other_load::{LoadProbe, BUSY_CORES};
use super::{print_stdout, ModelArgs};

#[derive(Debug, Args)]
pub struct BenchPlansArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    #[command(flatten)]
    select: super::select::SelectArgs,
    /// Pipeline stages, one CPU core each.
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Micro-batches per run (the batch dim bound with --dim is one micro-batch).
    #[arg(long, default_value_t = 16)]
    microbatches: usize,
    /// Paired rounds: each runs every plan once, the stages' cores rotated from round to
    /// round (a multiple of --stages gives every core the same share).
    #[arg(long, default_value_t = 6)]
    rounds: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// One plan's stages and predictions.
struct Candidate {
    name: String,
    stages: Vec<Vec<NodeId>>,
    predicted_stage_secs: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Row {
    plan: String,
    /// Whether its stages are pipecut's (a peer that chose the same split, or the plan the
    /// selection took from that peer): its measured ratio is then a tie by construction, and
    /// only the rounds' noise moves it from 1.
    same_stages_as_pipecut: bool,
    /// Median over the rounds of one run's wall time.
    wall_secs: f64,
    /// Median over rounds of (this plan's bottleneck / pipecut's), the bottleneck being the
    /// slowest stage's CPU time: above 1, pipecut is faster.
    measured_ratio: f64,
    /// The smallest and largest of those per-round ratios.
    measured_ratio_range: [f64; 2],
    /// Median over rounds of (this plan's wall time / pipecut's).
    wall_ratio: f64,
    /// The slowest stage's CPU time per micro-batch (median over rounds).
    bottleneck_secs: f64,
    /// This plan's predicted bottleneck over pipecut's.
    predicted_ratio: f64,
    /// Each stage's share of the stages' CPU time, measured (medians over rounds).
    measured_shares: Vec<f64>,
    /// Each stage's share of the predicted stage times.
    predicted_shares: Vec<f64>,
    /// Per counted round, each stage's CPU time per micro-batch; entry i is round i + 1, which
    /// pinned stage k to core k + i + 1 (modulo the stages): what a difference between the
    /// cores looks like.
    stage_secs_by_round: Vec<Vec<f64>>,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    stages: usize,
    microbatches: usize,
    rounds: usize,
    pinned: bool,
    /// Cores other processes kept busy on average during the rounds (absent where the
    /// platform does not say).
    other_cores: Option<f64>,
    /// Whether that exceeded a quarter of a core: the figures are then not trustworthy.
    busy: bool,
    rows: Vec<Row>,
    /// With `--select-by-running`: the plans the selection ran and what each measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    selection: Option<MeasuredSelection>,
}

pub fn run(args: BenchPlansArgs) -> anyhow::Result<ExitCode> {
    if args.stages == 0 || args.rounds == 0 || args.microbatches == 0 {
        anyhow::bail!("--stages, --rounds and --microbatches must be at least 1");
    }
    // One core per stage: the matrix kernels read this at their first product, below.
    std::env::set_var("MATMUL_NUM_THREADS", "1");
    let path = &args.model.model;
    let mut model = args
        .model
        .type_bound(super::load_model(path, super::Weights::Read)?)?;
    let cluster = Cluster::parse(&format!("1x{}xcpu", args.stages), &Catalog::builtin())?;
    let dims: BTreeMap<String, u64> = args.model.dims()?;
    args.measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &dims,
        &super::measured::device_names(&cluster),
    )?;
    let (candidates, selection) = candidates(
        &model.graph,
        path,
        &cluster,
        (args.stages, args.microbatches),
        args.select.select_by_running,
    )?;
    let graph = &model.graph;
    let weights = Weights::load(path, graph)
        .with_context(|| format!("cannot read the weights of '{}'", path.display()))?;
    let executor = CpuExecutor::new(graph, &weights);
    let mut prepared = candidates
        .iter()
        .map(|c| {
            stage_specs(graph, &c.stages)?
                .iter()
                .map(|s| executor.prepare(s))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let inputs = seeded_inputs(graph, args.microbatches, 0)?;
    let probe = LoadProbe::start();
    let runs = run_paired_rounds(
        &executor,
        &mut prepared,
        &inputs,
        args.microbatches,
        args.rounds,
        |round| eprint!("\rround {round} of {} ", args.rounds),
    )?;
    eprintln!();
    let other_cores = probe.and_then(LoadProbe::finish);
    let rows = rows(
        &candidates,
        &runs.wall_secs,
        &runs.stage_cpu_secs,
        args.microbatches,
    );
    let report = Report {
        model: super::model_file_name(path),
        stages: args.stages,
        microbatches: args.microbatches,
        rounds: args.rounds,
        pinned: cfg!(target_os = "linux"),
        other_cores,
        busy: other_cores.is_some_and(|c| c > BUSY_CORES),
        rows,
        selection,
    };
    if args.json {
        print_stdout(&(serde_json::to_string_pretty(&report)? + "\n"))?;
    } else {
        print_stdout(&table(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The optimiser's plan (chosen by running its rivals with `select_rounds`), the cost model's
/// optimum where that is another, then each baseline that could make the stages; and what the
/// selection measured.
fn candidates(
    graph: &crate::graph::Graph,
    model_path: &std::path::Path,
    cluster: &Cluster,
    (stages, microbatches): (usize, usize),
    select_rounds: Option<u32>,
) -> anyhow::Result<(Vec<Candidate>, Option<MeasuredSelection>)> {
    let config = PartitionConfig {
        stages: StageCount::Fixed(stages),
        settings: CostSettings {
            microbatches: microbatches.try_into().context("too many micro-batches")?,
            ..CostSettings::default()
        },
        ..PartitionConfig::default()
    };
    let mut solution = Planner::new(graph, cluster).with_config(config).solve()?;
    let optimum = solution.stage_of.clone();
    let selection = match select_rounds {
        Some(rounds) => super::select::select(graph, model_path, cluster, &mut solution, rounds)?,
        None => None,
    };
    let problem = &solution.problem;
    let candidate = |name: &str, stage_of: &[StageId]| Candidate {
        name: name.to_string(),
        stages: super::select::stage_nodes(problem, stage_of),
        predicted_stage_secs: problem
            .evaluate(stage_of)
            .stages
            .iter()
            .map(|s| s.stage_secs)
            .collect(),
    };
    let mut out = vec![candidate("pipecut", &solution.stage_of)];
    if solution.stage_of != optimum {
        out[0].name = "pipecut (selected by running)".into();
        out.push(candidate("pipecut (cost model's optimum)", &optimum));
    }
    for baseline in &solution.baselines {
        if let Some(starts) = &baseline.starts {
            out.push(candidate(
                &baseline.peer,
                &problem.contiguous_assignment(starts),
            ));
        }
    }
    Ok((out, selection))
}

fn shares(values: &[f64]) -> Vec<f64> {
    let total: f64 = values.iter().sum();
    values
        .iter()
        .map(|v| if total > 0.0 { v / total } else { 0.0 })
        .collect()
}

fn rows(
    candidates: &[Candidate],
    walls: &[Vec<f64>],
    cpu: &[Vec<Vec<f64>>],
    microbatches: usize,
) -> Vec<Row> {
    let bottleneck = |c: &Candidate| c.predicted_stage_secs.iter().copied().fold(0.0, f64::max);
    candidates
        .iter()
        .enumerate()
        .map(|(c, candidate)| {
            let wall_ratios: Vec<f64> = walls[c]
                .iter()
                .zip(&walls[0])
                .map(|(w, ours)| w / ours)
                .collect();
            let slowest = |c: usize| -> Vec<f64> {
                cpu[c]
                    .iter()
                    .map(|r| r.iter().copied().fold(0.0, f64::max))
                    .collect()
            };
            let ratios: Vec<f64> = slowest(c)
                .iter()
                .zip(&slowest(0))
                .map(|(b, ours)| b / ours)
                .collect();
            let k = candidate.stages.len();
            let stage_medians: Vec<f64> = (0..k)
                .map(|s| percentiles(&cpu[c].iter().map(|r| r[s]).collect::<Vec<_>>()).0)
                .collect();
            Row {
                plan: candidate.name.clone(),
                same_stages_as_pipecut: c > 0 && candidate.stages == candidates[0].stages,
                wall_secs: percentiles(&walls[c]).0,
                measured_ratio: percentiles(&ratios).0,
                measured_ratio_range: [
                    ratios.iter().copied().fold(f64::INFINITY, f64::min),
                    ratios.iter().copied().fold(0.0, f64::max),
                ],
                wall_ratio: percentiles(&wall_ratios).0,
                bottleneck_secs: percentiles(&slowest(c)).0 / microbatches as f64,
                predicted_ratio: bottleneck(candidate) / bottleneck(&candidates[0]),
                measured_shares: shares(&stage_medians),
                predicted_shares: shares(&candidate.predicted_stage_secs),
                stage_secs_by_round: cpu[c]
                    .iter()
                    .map(|r| r.iter().map(|s| s / microbatches as f64).collect())
                    .collect(),
            }
        })
        .collect()
}

fn table(report: &Report) -> String {
    let mut out = format!(
        "{}: {} stages, one {} core each, {} micro-batches, {} paired rounds\n\n",
        report.model,
        report.stages,
        if report.pinned {
            "pinned"
        } else {
            "(unpinned)"
        },
        report.microbatches,
        report.rounds
    );
    out += &format!(
        "{:<34} {:>13} {:>9} {:>13} {:>9} {:>9}  {:<12} {:<12} {:>5}\n",
        "plan",
        "bottleneck ms",
        "measured",
        "rounds",
        "wall",
        "predicted",
        "measured %",
        "predicted %",
        "Δ pts"
    );
    for row in &report.rows {
        let pct = |v: &[f64]| {
            v.iter()
                .map(|s| format!("{:.1}", s * 100.0))
                .collect::<Vec<_>>()
                .join("/")
        };
        let worst = row
            .measured_shares
            .iter()
            .zip(&row.predicted_shares)
            .map(|(m, p)| (m - p).abs() * 100.0)
            .fold(0.0, f64::max);
        out += &format!(
            "{:<34} {:>13.3} {:>8.3}× {:>13} {:>8.3}× {:>8.3}×  {:<12} {:<12} {:>5.1}\n",
            match row.same_stages_as_pipecut {
                true => format!("{} (= pipecut)", row.plan),
                false => row.plan.clone(),
            },
            row.bottleneck_secs * 1e3,
            row.measured_ratio,
            format!(
                "{:.3}–{:.3}",
                row.measured_ratio_range[0], row.measured_ratio_range[1]
            ),
            row.wall_ratio,
            row.predicted_ratio,
            pct(&row.measured_shares),
            pct(&row.predicted_shares),
            worst
        );
    }
    out += "\nbottleneck: the slowest stage's CPU time per micro-batch; measured, wall, predicted: each plan's bottleneck (CPU time, wall time of the run, plan) over pipecut's, above 1 pipecut is faster; rounds: the smallest and largest measured ratio of one round; (= pipecut): the same stages as pipecut's plan, a tie whatever the rounds say; shares: each stage's CPU time over the stages' total; Δ pts: the largest gap between a measured and a predicted share\n";
    out += &match report.other_cores {
        Some(cores) if report.busy => format!(
            "\nthe machine was busy: other processes kept {cores:.2} cores busy on average during the rounds; these figures are not trustworthy\n"
        ),
        Some(cores) => format!(
            "\nother processes kept {cores:.2} cores busy on average during the rounds\n"
        ),
        None => "\nhow busy the rest of the machine was is unknown on this platform\n".into(),
    };
    if let Some(selection) = &report.selection {
        out += &format!("\n{}", super::select::selection_text(selection));
    }
    out
}
