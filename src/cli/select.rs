//! `--select-by-running ROUNDS` (`partition`, `bench-plans`): run the cost model's optimum and
//! its nearest rivals on this machine, and keep a rival that is measured faster.
//!
//! Per-node times add up to stage times only as far as a node costs the same in every context;
//! where plans differ by less than that context (a convolution 6% slower after a layer that
//! streams 25 MB through the cache, docs/benchmarks.md), the cost model cannot choose and a run
//! can. The rivals ([`rivals`]) are the optimum with one stage boundary moved across the nodes
//! beside it by up to [`MOVE_STEPS`] steps, and the peers' own plans, among those the model
//! predicts within [`RIVAL_SLACK`] of it. A rival replaces the optimum only when it was faster
//! by [`WIN_MARGIN`] in the median paired round and in enough rounds to pass a sign test
//! ([`PairedRuns::clearly_beats`]), so noise keeps the proven plan; of the plans that beat it
//! so and do not clearly lose to one another, the one predicted fastest is kept
//! ([`PairedRuns::choose`]), so that measured ties do not flip from run to run. Where another
//! candidate was measured faster than the one kept, only not clearly, the two run again
//! ([`RUNOFF_ROUNDS`] times the rounds, paired) and the challenger is kept only by a clear win
//! there. The plan then says so in its status and records every candidate's figures
//! (`summary.measured_selection`).

use std::path::Path;

use crate::cost::measured::percentiles;
use crate::cost::{Cluster, Mode};
use crate::graph::{Graph, NodeId};
use crate::partition::rivals::{rivals, RivalWindow};
use crate::partition::{HeuristicReason, PartitionProblem, Solution, SolveStatus, StageId};
use crate::plan::{MeasuredSelection, MovedNode, Runoff, SelectionCandidate};
use crate::runtime::paired::{run_paired_rounds, PairedRuns};
use crate::runtime::{seeded_inputs, stage_specs, CpuExecutor, Executor, Weights};
use anyhow::Context;
use clap::Args;

/// Rivals predicted slower than the optimum by more than this are not run. The profile's
/// ratios between two plans were off by up to 8.5% on magika (a rival predicted 2–6% slower
/// measured 1–6% faster, docs/benchmarks.md), so 5% missed it in some runs.
pub const RIVAL_SLACK: f64 = 0.10;
/// Each step of a move carries at least this share of the bottleneck, so that it changes what a
/// stage does.
pub const MIN_MOVED_SHARE: f64 = 0.02;
/// How many steps each boundary moves, each way: one step missed mlp's faster split two nodes
/// away (docs/benchmarks.md); rivals predicted beyond [`RIVAL_SLACK`] are dropped anyway.
pub const MOVE_STEPS: usize = 3;
/// A rival must beat the optimum by this much in the median round.
pub const WIN_MARGIN: f64 = 0.01;
/// The runoff between the chosen plan and the one measured fastest against it runs this many
/// times the selection's rounds: two plans instead of all, so it costs 2 × this over the
/// candidates' count of the first rounds, and the sign test over more rounds asks for a
/// smaller share of wins (15 of 20 against 9 of 10), so a 1–2% difference can pass it.
pub const RUNOFF_ROUNDS: u32 = 2;

#[derive(Debug, Args, Default)]
pub struct SelectArgs {
    /// Run the cost model's optimum and its nearest rivals (each stage boundary moved across
    /// the nodes beside it, either way, by up to three steps that each carry another 2% of the
    /// bottleneck, and the peers' own plans; those predicted within 10% of it) on this
    /// machine's CPU runtime, one pinned core per stage, in this many paired rounds, and keep a
    /// rival faster by 1% in the median round and in enough rounds to pass a one-sided sign
    /// test at 5% (all of 6, 9 of 10, 15 of 20); of such rivals that tie, the one predicted
    /// faster. A candidate measured faster than the one kept, but not clearly, runs against it
    /// again for twice the rounds and replaces it only by a clear win there.
    /// Needs the model's weights, CPU stages and no more stages than cores.
    #[arg(long, value_name = "ROUNDS", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub select_by_running: Option<u32>,
}

/// Runs the candidates of `solution` (solved on `graph` of the model at `model_path`, over
/// `cluster`) for `rounds` paired rounds and makes `solution` the plan the rule keeps (the
/// module's doc).
/// Returns what was measured, or `None` when the optimum has no rival to run against.
pub fn select(
    graph: &Graph,
    model_path: &Path,
    cluster: &Cluster,
    solution: &mut Solution,
    rounds: u32,
) -> anyhow::Result<Option<MeasuredSelection>> {
    runnable_here(&solution.problem, cluster)?;
    let candidates = candidates(graph, solution);
    if candidates.len() < 2 {
        eprintln!(
            "note: --select-by-running: no rival of the optimum within {:.0}% of its bottleneck; nothing to run",
            RIVAL_SLACK * 100.0
        );
        return Ok(None);
    }
    let microbatches = solution.problem.settings().microbatches as usize;
    let prepared = prepare(graph, model_path, &solution.problem, &candidates)?;
    let all: Vec<usize> = (0..candidates.len()).collect();
    let runs = run_candidates(&prepared, &all, rounds)?;
    let problem = &solution.problem;
    let predicted: Vec<f64> = candidates
        .iter()
        .map(|(_, stage_of)| problem.evaluate(stage_of).bottleneck_secs)
        .collect();
    let first_choice = runs.choose(&predicted, WIN_MARGIN);
    let (winner, runoff) = settle_by_runoff(&prepared, &runs, first_choice, rounds)?;
    let chosen = candidates[winner].1.clone();
    let selection = MeasuredSelection {
        rounds,
        microbatches: microbatches as u32,
        measured_on: "cpu runtime, one pinned core per stage".into(),
        candidates: candidates
            .iter()
            .enumerate()
            .map(|(i, (origin, stage_of))| {
                let ratios = runs.ratios(i, 0);
                SelectionCandidate {
                    origin: origin.clone(),
                    chosen: i == winner,
                    moved: moved_from(problem, &chosen, stage_of),
                    predicted_bottleneck_secs: predicted[i],
                    measured_bottleneck_secs: percentiles(&runs.bottlenecks(i)).0
                        / microbatches as f64,
                    measured_ratio: percentiles(&ratios).0,
                    measured_ratio_range: range(&ratios),
                }
            })
            .collect(),
        runoff,
    };
    if winner != 0 {
        solution.evaluation = solution.problem.evaluate(&chosen);
        solution.stage_of = chosen;
        solution.status = SolveStatus::Heuristic {
            reason: HeuristicReason::SelectedByRunning,
        };
    }
    Ok(Some(selection))
}

/// Refuses what the CPU runtime cannot measure as the plan would run.
fn runnable_here(problem: &PartitionProblem, cluster: &Cluster) -> anyhow::Result<()> {
    let refuse = |why: String| {
        anyhow::bail!("--select-by-running runs the plans on this machine's CPU runtime, one core per stage: {why}")
    };
    if let Some(stage) = problem
        .stages()
        .iter()
        .find(|s| cluster.device(s.device).kind != "cpu")
    {
        return refuse(format!(
            "the stages are on '{}', not a CPU (plan with --devices cpu,cpu or --cluster 1xKxcpu, or a calibrated CPU profile)",
            stage.device_name
        ));
    }
    if matches!(problem.settings().mode, Mode::Training { .. }) {
        return refuse("the runtime runs inference, and this plan is for training".into());
    }
    if problem.settings().schedule.chunks() > 1 {
        return refuse("an interleaved schedule puts several stages on one core".into());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if problem.stage_count() > cores {
        return refuse(format!(
            "{} stages but {cores} cores",
            problem.stage_count()
        ));
    }
    Ok(())
}

/// The optimum, then each distinct rival within [`RIVAL_SLACK`] that fits and keeps the cut
/// constraints (its boundary moves and the peers' own plans), each with where it came from.
fn candidates(graph: &Graph, solution: &Solution) -> Vec<(String, Vec<StageId>)> {
    let problem = &solution.problem;
    let keeps_constraints = |stage_of: &[StageId]| {
        problem.check_assignment(stage_of).is_ok()
            && matches!(
                solution.cut_constraints.violation(graph, problem, stage_of),
                Ok(None)
            )
    };
    let window = RivalWindow {
        slack: RIVAL_SLACK,
        step_secs: MIN_MOVED_SHARE * solution.evaluation.bottleneck_secs,
        steps: MOVE_STEPS,
    };
    rivals(
        problem,
        &solution.stage_of,
        &solution.baselines,
        window,
        &keeps_constraints,
    )
    .into_iter()
    .map(|r| (r.origin, r.stage_of))
    .collect()
}

/// Where a candidate's median round against `kept` was faster, only not clearly, runs the two
/// again for [`RUNOFF_ROUNDS`] times `rounds` and keeps the challenger only by a clear win
/// there. Returns the plan kept and the runoff, where one ran.
fn settle_by_runoff(
    prepared: &Prepared,
    runs: &PairedRuns,
    kept: usize,
    rounds: u32,
) -> anyhow::Result<(usize, Option<Runoff>)> {
    let Some(challenger) = runs.closest_challenger(kept) else {
        return Ok((kept, None));
    };
    let rounds = rounds * RUNOFF_ROUNDS;
    let second = run_candidates(prepared, &[kept, challenger], rounds)?;
    let ratios = second.ratios(1, 0);
    let runoff = Runoff {
        rounds,
        incumbent: kept as u32,
        challenger: challenger as u32,
        measured_ratio: percentiles(&ratios).0,
        measured_ratio_range: range(&ratios),
    };
    let winner = match second.clearly_beats(1, 0, WIN_MARGIN) {
        true => challenger,
        false => kept,
    };
    Ok((winner, Some(runoff)))
}

/// The smallest and largest of `ratios`.
fn range(ratios: &[f64]) -> [f64; 2] {
    [
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    ]
}

/// What the paired rounds run: the model's weights, its inputs and each candidate's stages.
struct Prepared<'g> {
    graph: &'g Graph,
    weights: Weights,
    specs: Vec<Vec<crate::runtime::StageSpec>>,
    inputs: crate::runtime::Tensors,
    microbatches: usize,
}

fn prepare<'g>(
    graph: &'g Graph,
    model_path: &Path,
    problem: &PartitionProblem,
    candidates: &[(String, Vec<StageId>)],
) -> anyhow::Result<Prepared<'g>> {
    // One core per stage: the matrix kernels read this at their first product.
    std::env::set_var("MATMUL_NUM_THREADS", "1");
    let weights = Weights::load(model_path, graph).with_context(|| {
        format!(
            "--select-by-running needs the weights of '{}'",
            model_path.display()
        )
    })?;
    let specs = candidates
        .iter()
        .map(|(_, stage_of)| stage_specs(graph, &stage_nodes(problem, stage_of)))
        .collect::<Result<Vec<_>, _>>()?;
    let microbatches = problem.settings().microbatches as usize;
    let inputs = seeded_inputs(graph, microbatches, 0)?;
    Ok(Prepared {
        graph,
        weights,
        specs,
        inputs,
        microbatches,
    })
}

/// `plans` (some of the prepared candidates, by their index) run in paired rounds, one pinned
/// core per stage.
fn run_candidates(prepared: &Prepared, plans: &[usize], rounds: u32) -> anyhow::Result<PairedRuns> {
    let executor = CpuExecutor::new(prepared.graph, &prepared.weights);
    let mut stages = plans
        .iter()
        .map(|&p| {
            prepared.specs[p]
                .iter()
                .map(|s| executor.prepare(s))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!(
        "--select-by-running: {} plans, {rounds} paired rounds",
        plans.len()
    );
    let runs = run_paired_rounds(
        &executor,
        &mut stages,
        &prepared.inputs,
        prepared.microbatches,
        rounds as usize,
        |round| eprint!("\rround {round} of {rounds} "),
    )?;
    eprintln!();
    Ok(runs)
}

/// The nodes of each stage, in the problem's order.
pub fn stage_nodes(problem: &PartitionProblem, stage_of: &[StageId]) -> Vec<Vec<NodeId>> {
    let mut nodes = vec![Vec::new(); problem.stage_count()];
    for (p, s) in stage_of.iter().enumerate() {
        nodes[s.index()].push(problem.order()[p]);
    }
    nodes
}

/// The nodes `candidate` puts on another stage than `plan`, with their stage in `candidate`.
fn moved_from(
    problem: &PartitionProblem,
    plan: &[StageId],
    candidate: &[StageId],
) -> Vec<MovedNode> {
    plan.iter()
        .zip(candidate)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(p, (_, b))| MovedNode {
            node: problem.node_names().name(p).into_owned(),
            stage: b.0,
        })
        .collect()
}

/// The candidates and their figures, one line each, for the table.
pub fn selection_text(selection: &MeasuredSelection) -> String {
    let mut out = format!(
        "selected by running {} plans on the {} ({} paired rounds of {} micro-batches):\n",
        selection.candidates.len(),
        selection.measured_on,
        selection.rounds,
        selection.microbatches
    );
    for (i, c) in selection.candidates.iter().enumerate() {
        out += &format!(
            "  {} #{i} predicted {:>9.3} ms  measured {:>9.3} ms  {:.3}× the optimum (rounds {:.3}–{:.3})  {}\n",
            if c.chosen { "*" } else { " " },
            c.predicted_bottleneck_secs * 1e3,
            c.measured_bottleneck_secs * 1e3,
            c.measured_ratio,
            c.measured_ratio_range[0],
            c.measured_ratio_range[1],
            c.origin,
        );
    }
    if let Some(r) = &selection.runoff {
        out += &format!(
            "  runoff, {} paired rounds: #{} measured {:.3}× #{} (rounds {:.3}–{:.3}); {}\n",
            r.rounds,
            r.challenger,
            r.measured_ratio,
            r.incumbent,
            r.measured_ratio_range[0],
            r.measured_ratio_range[1],
            if selection.candidates[r.challenger as usize].chosen {
                "a clear win: the challenger is kept"
            } else {
                "no clear win: the plan chosen first is kept"
            },
        );
    }
    out
}
