//! Phase 4, partition: cut the typed, costed graph into convex, ordered pipeline stages that
//! minimise the bottleneck stage time within every device's memory, then the bytes crossing
//! between stages (DESIGN.md, "The partition problem").
//!
//! ```text
//! Graph + Cluster + CostSettings ──▶ PartitionProblem ──▶ solvers ──▶ Solution
//!                                     (problem.rs)          dp.rs: exact on a topological order
//!                                                           milp.rs: exact over all convex
//!                                                             partitions, under a deadline
//!                                                           coarsen.rs: super-nodes for the MILP
//!                                                           baselines.rs: the peers' methods
//! Solution ──▶ torch_split.rs: its stage boundaries at PyTorch module boundaries
//! ```
//!
//! [`Planner`] is the entry point: it builds the problem, picks the number of stages when asked
//! (`auto`), runs the solvers, explains infeasibility, and evaluates the baselines. This module
//! reads no files and prints nothing; the plan phase turns a [`Solution`] into JSON.

pub mod baselines;
pub mod bounds;
pub mod coarsen;
pub mod constraints;
pub(crate) mod cut_floors;
pub mod dp;
pub mod engine;
pub mod ideal_search;
pub mod layers;
pub mod milp;
pub mod names;
pub mod neighbours;
pub mod parallelism;
pub mod problem;
pub mod proof;
mod reach;
pub mod rivals;
pub mod tensor_parallel;
pub mod tensor_shard;
pub mod torch_split;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use baselines::Baseline;
pub use constraints::CutConstraints;
pub use milp::{MilpReport, MilpStop};
pub use problem::{
    CostSettings, Evaluation, PartitionProblem, Positions, StageDevice, StageFigures, StageId,
    MAX_TOTAL_SECS,
};
pub use proof::{OptimalityProof, ProofMethod};

use crate::schedule::{simulate, PipelineSchedule, StageFiguresSecs, StageTimes};
use crate::Error;
use pipecut_cost::{Cluster, DeviceId};
use pipecut_ir::graph::Graph;

/// How many pipeline stages to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageCount {
    /// Exactly this many, on the first devices of the pipeline order.
    Fixed(usize),
    /// The count (up to the devices given) with the best simulated throughput.
    Auto,
}

impl std::str::FromStr for StageCount {
    type Err = String;
    fn from_str(s: &str) -> Result<StageCount, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(StageCount::Auto);
        }
        match s.parse::<usize>() {
            Ok(0) => Err("the number of stages must be at least 1".into()),
            Ok(k) => Ok(StageCount::Fixed(k)),
            Err(_) => Err(format!("'{s}' is not a number of stages or 'auto'")),
        }
    }
}

/// Whether a solution is proven optimal, and if not, what happened instead.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SolveStatus {
    /// No convex, ordered partition has a smaller bottleneck.
    Optimal,
    /// A solver stopped at its time limit; the bottleneck is within `gap` (relative) of the
    /// optimum.
    TimeLimit {
        /// `(bottleneck − lower bound) / bottleneck`.
        gap: f64,
        /// What ended the search: the limit itself, its share of it, or a stop before it
        /// ([`MilpStop`]). Plans written before this field existed read as the limit.
        #[serde(default = "at_the_limit")]
        stop: MilpStop,
    },
    /// Not proven over all convex partitions; `reason` says why. The plan's gap to the lower
    /// bound still bounds the loss.
    Heuristic {
        /// What stopped the proof. Plans written before this field existed read as
        /// [`HeuristicReason::Unrecorded`].
        #[serde(default)]
        reason: HeuristicReason,
    },
    /// The node assignment was edited by hand and `pipecut check --rewrite` recomputed every
    /// figure from it: nothing is proven beyond the lower bound it records.
    HandEdited,
}

/// Why a [`SolveStatus::Heuristic`] plan is not proven optimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HeuristicReason {
    /// Only the DP ran (`--solver dp`): optimal among contiguous partitions of one topological
    /// order, not over all convex partitions.
    DpOnly,
    /// The MILP solved a coarsened graph (super-nodes, see coarsen.rs): optimal at most among
    /// plans that keep every super-node whole.
    Coarsened,
    /// The time limit left no room for the MILP after the DP and coarsening: it never started.
    MilpNotStarted,
    /// The time limit was spent before the DP finished (on a model so large that its costs
    /// took it): the plan is the DP's best when it stopped, or a split of the order into
    /// stages of equal compute.
    DpStopped,
    /// The MILP solver failed (e.g. a numerical error such as a singular basis); the best plan
    /// found before the failure stands.
    SolverError,
    /// The MILP stopped early without a proof for another reason.
    StoppedWithoutProof,
    /// The model is too large to build the MILP (more than [`milp::MAX_MODEL_CELLS`] node ×
    /// boundary cells) and no coarsened plan could start it: the DP's plan stands.
    TooLarge,
    /// The work budget (`--work-budget`) ran out before the ideal search proved the plan.
    WorkBudget,
    /// Under a work budget the MILP does not run, and the graph is too large for the ideal
    /// search (more than [`ideal_search::MAX_NODES`] nodes).
    TooLargeToSearch,
    /// `--select-by-running` ran the cost model's optimum and its nearest rivals (its boundary
    /// moves and the peers' own plans) on this machine, and a rival was faster beyond the
    /// rounds' noise: the plan is that rival
    /// (`summary.measured_selection` has the figures).
    SelectedByRunning,
    /// Written by a pipecut that did not record the reason.
    #[default]
    Unrecorded,
}

impl HeuristicReason {
    /// One phrase saying what happened, for the CLI's result line.
    pub fn describe(self) -> &'static str {
        match self {
            HeuristicReason::DpOnly => {
                "only the DP ran: optimal among cuts of one topological order"
            }
            HeuristicReason::Coarsened => {
                "the MILP solved a coarsened graph: optimal at most among plans keeping its super-nodes whole"
            }
            HeuristicReason::MilpNotStarted => {
                "the time limit left no room to start the MILP after the DP"
            }
            HeuristicReason::DpStopped => {
                "the time limit was spent before the DP finished: its best cut of one topological order so far"
            }
            HeuristicReason::SolverError => "the MILP solver failed; the DP's plan stands",
            HeuristicReason::StoppedWithoutProof => "the MILP stopped without a proof",
            HeuristicReason::TooLarge => "the model is too large for the MILP; the DP's plan stands",
            HeuristicReason::WorkBudget => {
                "the work budget ran out before the ideal search proved the plan"
            }
            HeuristicReason::TooLargeToSearch => {
                "under a work budget only the ideal search runs, and the graph is too large for it"
            }
            HeuristicReason::SelectedByRunning => {
                "a rival of the cost model's optimum, measured faster on this machine"
            }
            HeuristicReason::Unrecorded => "not proven optimal over all convex partitions",
        }
    }
}

/// The stop of a `time_limit` status written before the stop was recorded.
fn at_the_limit() -> MilpStop {
    MilpStop::Deadline
}

impl SolveStatus {
    /// What the status says, in words (the gap is the plan's, to its lower bound).
    pub fn describe(self, gap: f64) -> String {
        match self {
            SolveStatus::Optimal => "proven optimal".to_string(),
            SolveStatus::TimeLimit { gap, stop } => {
                format!("{}, within {:.2}% of optimal", stop.describe(), gap * 100.0)
            }
            SolveStatus::Heuristic { reason } => format!(
                "not proven optimal ({}); within {:.2}% of the lower bound",
                reason.describe(),
                gap * 100.0
            ),
            SolveStatus::HandEdited => format!(
                "edited by hand, figures recomputed, not proven optimal; within {:.2}% of the lower bound",
                gap * 100.0
            ),
        }
    }
}

/// The solver that produced a solution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SolverKind {
    /// The dynamic program over a topological order.
    Dp,
    /// The MILP over all convex partitions (possibly of a coarsened graph), started from the DP.
    Milp,
    /// The branch and bound over the graph's ideals (ideal_search.rs), started from the DP.
    IdealSearch,
}

/// Which solvers a [`Planner`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolverChoice {
    /// The DP only: always fast, exact when the graph is a chain.
    Dp,
    /// The DP, then the MILP from its plan until the time limit, whatever the graph.
    Milp,
    /// The DP, then the MILP when the DP's plan is not already proven optimal (the graph is not
    /// a chain and the plan is above the lower bound).
    #[default]
    Auto,
}

impl std::str::FromStr for SolverChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<SolverChoice, String> {
        match s.to_ascii_lowercase().as_str() {
            "dp" => Ok(SolverChoice::Dp),
            "milp" => Ok(SolverChoice::Milp),
            "auto" => Ok(SolverChoice::Auto),
            _ => Err(format!("'{s}' is not a solver (dp, milp or auto)")),
        }
    }
}

/// The partition request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionConfig {
    /// Number of stages.
    pub stages: StageCount,
    /// Devices in pipeline order; stage `k` runs on `devices[k]`. Empty: the cluster's order.
    pub devices: Vec<DeviceId>,
    /// Mode, schedule, micro-batches, memory headroom.
    pub settings: CostSettings,
    /// Wall-clock budget for the whole solve; the DP always finishes, the MILP stops at it.
    #[serde(serialize_with = "serialize_secs")]
    pub time_limit: Duration,
    /// Which solvers run.
    pub solver: SolverChoice,
    /// Work units instead of the wall clock (`--work-budget`): each searching solver (the
    /// granularity bound, the ideal search, the exact feasibility search) stops after this
    /// many units of its own work and the MILP, which has no such count, does not run, so the
    /// same inputs give the same plan on any machine. The time limit no longer applies.
    pub work_budget: Option<u64>,
    /// Tensors no cut may cross.
    pub cut_constraints: CutConstraints,
    /// The regex DeepSpeed's `type:` baseline is given (see [`baselines::DEFAULT_LAYER_TYPE`]).
    pub baseline_layer_type: String,
}

fn serialize_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            stages: StageCount::Auto,
            devices: Vec::new(),
            settings: CostSettings::default(),
            time_limit: Duration::from_secs(10),
            solver: SolverChoice::Auto,
            work_budget: None,
            cut_constraints: CutConstraints::default(),
            baseline_layer_type: baselines::DEFAULT_LAYER_TYPE.to_string(),
        }
    }
}

/// A baseline's outcome on the same costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineResult {
    /// Which method.
    pub baseline: Baseline,
    /// The release and method, e.g. `deepspeed 0.19 parameters` ([`Baseline::peer`]).
    pub peer: String,
    /// Its stage starts (positions in the order), when it could make the stages.
    pub starts: Option<Vec<usize>>,
    /// Its bottleneck.
    pub bottleneck_secs: Option<f64>,
    /// Whether every stage fits memory.
    pub fits: Option<bool>,
    /// Why it could not make the stages.
    pub error: Option<String>,
}

/// The lower bounds a solve proved, each on its own: the plan's lower bound is the largest (or
/// the bottleneck itself when proven optimal), and these say which proof gave it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LowerBounds {
    /// The average work per stage, or the slowest node ([`PartitionProblem::lower_bound_secs`]).
    pub average_work_secs: f64,
    /// The granularity bound (indivisible node times, bounds.rs), when it was computed in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity_secs: Option<f64>,
    /// The optimum of the MILP's LP relaxation (milp.rs), when it was solved in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lp_relaxation_secs: Option<f64>,
    /// The bound the MILP's branch and bound proved on the whole model, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_and_bound_secs: Option<f64>,
}

impl LowerBounds {
    /// The largest bound and the name of its proof.
    pub fn strongest(&self) -> (&'static str, f64) {
        let mut best = ("average work", self.average_work_secs);
        for (name, bound) in [
            ("granularity", self.granularity_secs),
            ("LP relaxation", self.lp_relaxation_secs),
            ("branch and bound", self.branch_and_bound_secs),
        ] {
            if let Some(bound) = bound.filter(|&b| b > best.1) {
                best = (name, bound);
            }
        }
        best
    }

    /// Every bound computed, in milliseconds, strongest first named: `granularity 23.928 ms;
    /// LP relaxation 22.5 ms, average work 22.216 ms`.
    pub fn describe(&self) -> String {
        let ms = |secs: f64| format!("{:.3} ms", secs * 1e3);
        let (name, bound) = self.strongest();
        let others: Vec<String> = [
            ("average work", Some(self.average_work_secs)),
            ("granularity", self.granularity_secs),
            ("LP relaxation", self.lp_relaxation_secs),
            ("branch and bound", self.branch_and_bound_secs),
        ]
        .into_iter()
        .filter(|&(other, _)| other != name)
        .filter_map(|(other, b)| b.map(|b| format!("{other} {}", ms(b))))
        .collect();
        match others.is_empty() {
            true => format!("{name} {}", ms(bound)),
            false => format!("{name} {}; {}", ms(bound), others.join(", ")),
        }
    }
}

/// One stage count tried by `auto`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageCountCandidate {
    /// Number of stages.
    pub stages: usize,
    /// Bottleneck of its best partition, when one fits.
    pub bottleneck_secs: Option<f64>,
    /// Simulated time of one step of all micro-batches.
    pub step_secs: Option<f64>,
    /// Fraction of device time idle in the step.
    pub bubble_fraction: Option<f64>,
}

/// A solved partition with its proof and comparisons.
#[derive(Debug, Clone)]
pub struct Solution {
    /// The problem that was solved (its stages are the chosen devices).
    pub problem: PartitionProblem,
    /// Stage of every position of `problem.order()`.
    pub stage_of: Vec<StageId>,
    /// Its figures.
    pub evaluation: Evaluation,
    /// Proof status.
    pub status: SolveStatus,
    /// A bottleneck no convex partition on these devices can beat.
    pub lower_bound_secs: f64,
    /// Each bound proved, and so which one gives `lower_bound_secs`.
    pub bounds: LowerBounds,
    /// What proves the plan optimal, when the status says it is (proof.rs).
    pub proof: Option<OptimalityProof>,
    /// Which solver found it.
    pub solver: SolverKind,
    /// Wall-clock time spent solving (not part of the plan's bytes unless asked for).
    pub solve_secs: f64,
    /// The peers' methods on the same costs.
    pub baselines: Vec<BaselineResult>,
    /// The layers the layer-based peers cut, and where they came from.
    pub baseline_layers: String,
    /// The regex the DeepSpeed `type:` baseline was given.
    pub baseline_layer_type: String,
    /// With `auto`, every stage count tried.
    pub candidates: Vec<StageCountCandidate>,
    /// What the MILP did, when it ran.
    pub milp: Option<milp::MilpReport>,
    /// The constraints every partition searched respected (the bound and status hold under them).
    pub cut_constraints: CutConstraints,
    /// The work budget the solve ran under, if any ([`PartitionConfig::work_budget`]).
    pub work_budget: Option<u64>,
}

impl Solution {
    /// `(bottleneck − lower bound) / bottleneck`.
    pub fn gap(&self) -> f64 {
        let b = self.evaluation.bottleneck_secs;
        if b > 0.0 {
            ((b - self.lower_bound_secs) / b).max(0.0)
        } else {
            0.0
        }
    }

    /// The best baseline bottleneck among those that fit, if any.
    pub fn best_baseline_secs(&self) -> Option<f64> {
        self.baselines
            .iter()
            .filter(|b| b.fits == Some(true))
            .filter_map(|b| b.bottleneck_secs)
            .min_by(f64::total_cmp)
    }

    /// Per-stage times for the schedule simulator (receives folded into the stage's own time,
    /// as the partition objective counts them).
    pub fn stage_times(&self) -> StageTimes {
        stage_times(&self.problem, &self.evaluation)
    }
}

/// The simulator's per-stage times from a partition's evaluation (also used by the cluster
/// search for every candidate it solves).
pub(crate) fn stage_times(problem: &PartitionProblem, evaluation: &Evaluation) -> StageTimes {
    let figures: Vec<StageFiguresSecs> = evaluation
        .stages
        .iter()
        .map(|s| StageFiguresSecs {
            compute_secs: s.compute_secs,
            receive_secs: s.receive_secs,
            gradient_receive_secs: s.gradient_receive_secs,
        })
        .collect();
    StageTimes::from_stage_figures(problem.settings().mode, &figures)
}

/// Where a solve stands, for a progress display: reported after each DP and after each slice of
/// the MILP's search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Seconds since the solve began.
    pub elapsed_secs: f64,
    /// Which solver reported.
    pub solver: SolverKind,
    /// Stages of the problem being solved.
    pub stages: usize,
    /// The best bottleneck found so far for these stages.
    pub best_secs: f64,
    /// A proven lower bound for these stages, when the solver has one (a coarsened MILP's bound
    /// is not the model's, so it reports none).
    pub bound_secs: Option<f64>,
}

impl Progress {
    /// `(best − bound) / best`, when there is a bound.
    pub fn gap(&self) -> Option<f64> {
        self.bound_secs.map(|b| relative_gap(self.best_secs, b))
    }
}

/// A progress callback; a newtype so that [`Planner`] stays `Debug` and `Clone`.
#[derive(Clone)]
struct ProgressSink(std::sync::Arc<dyn Fn(&Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// Plans pipelines: the library's entry point for partitioning.
///
/// ```
/// use pipecut_cost::{Catalog, Cluster};
/// use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
/// use pipecut_planner::partition::{Planner, StageCount};
///
/// let mut model = pipecut_ir::onnx::load_model("../../fixtures/models/gpt2_tiny.onnx")?;
/// ShapeInference::new(DimBindings::new().bind("batch", 8).bind("seq", 64)).run(&mut model.graph)?;
/// let cluster = Cluster::parse("1x4xL4", &Catalog::builtin())?;
/// let solution = Planner::new(&model.graph, &cluster)
///     .with_stages(StageCount::Fixed(2))
///     .solve()?;
/// for (k, stage) in solution.evaluation.stages.iter().enumerate() {
///     println!("stage {k}: {} nodes, {:.3} ms", stage.node_count, stage.stage_secs * 1e3);
/// }
/// assert!(solution.evaluation.bottleneck_secs >= solution.lower_bound_secs);
/// # Ok::<(), pipecut_ir::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Planner<'a> {
    graph: &'a Graph,
    cluster: &'a Cluster,
    config: PartitionConfig,
    node_secs: HashMap<String, f64>,
    tensor_parallel: Option<(
        tensor_parallel::TensorParallelBlocks,
        tensor_parallel::TensorParallelism,
    )>,
    progress: Option<ProgressSink>,
    started: Instant,
    /// A plan of the model's positions to start from ([`Self::with_start`]).
    start: Option<Vec<StageId>>,
    /// Under a work budget, the wall-clock guard that still stops the solve
    /// ([`Self::with_time_guard`]); `None`: the clock stops nothing.
    guard: Option<Duration>,
}

impl<'a> Planner<'a> {
    /// A planner for `graph` (shapes inferred, dims bound) on `cluster`, with default settings:
    /// `auto` stages, inference, 1 micro-batch, 10% memory headroom, 10 s limit.
    pub fn new(graph: &'a Graph, cluster: &'a Cluster) -> Planner<'a> {
        Planner {
            graph,
            cluster,
            config: PartitionConfig::default(),
            node_secs: HashMap::new(),
            tensor_parallel: None,
            progress: None,
            started: Instant::now(),
            start: None,
            guard: None,
        }
    }

    /// Under a work budget, keep `limit` (from the solve's start) as an outer guard, as
    /// `plan-cluster` does so that its whole command obeys `--time-limit`: each search still
    /// stops by its own count, and the clock only where the count would run past `limit`.
    pub fn with_time_guard(mut self, limit: Duration) -> Self {
        self.guard = Some(limit);
        self
    }

    /// Starts from `stage_of` (a stage for every position of the problem's order, as
    /// `plan-cluster`'s search partitioned the chosen configuration) instead of a balanced
    /// split: the DP's plan replaces it only when better, and it stands when the time limit
    /// leaves no room for the DP, so that a short limit still gives the plan the search costed.
    pub fn with_start(mut self, stage_of: Vec<StageId>) -> Self {
        self.start = Some(stage_of);
        self
    }

    /// The start of [`Self::with_start`] on `problem`, or its groups' (`grouped`).
    fn start_on(
        &self,
        problem: &PartitionProblem,
        grouped: Option<&coarsen::Coarsened>,
    ) -> Option<dp::OrderSolution> {
        let start = self.start.as_ref()?;
        let start = match grouped {
            Some(grouped) => grouped.restrict(start)?,
            None => start.clone(),
        };
        dp::OrderSolution::given(problem, start)
    }

    /// Calls `report` with where the solve stands after each DP and each slice of the MILP's
    /// search (from the solving thread; keep it quick).
    pub fn with_progress(mut self, report: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(ProgressSink(std::sync::Arc::new(report)));
        self
    }

    fn report(&self, solver: SolverKind, stages: usize, best_secs: f64, bound_secs: Option<f64>) {
        if let Some(sink) = &self.progress {
            (sink.0)(&Progress {
                elapsed_secs: self.started.elapsed().as_secs_f64(),
                solver,
                stages,
                best_secs,
                bound_secs,
            });
        }
    }

    /// Replaces the whole configuration.
    pub fn with_config(mut self, config: PartitionConfig) -> Self {
        self.config = config;
        self
    }

    /// Number of stages.
    pub fn with_stages(mut self, stages: StageCount) -> Self {
        self.config.stages = stages;
        self
    }

    /// Mode, schedule, micro-batches, headroom.
    pub fn with_settings(mut self, settings: CostSettings) -> Self {
        self.config.settings = settings;
        self
    }

    /// Devices in pipeline order.
    pub fn with_devices(mut self, devices: Vec<DeviceId>) -> Self {
        self.config.devices = devices;
        self
    }

    /// Which solvers run.
    pub fn with_solver(mut self, solver: SolverChoice) -> Self {
        self.config.solver = solver;
        self
    }

    /// Time budget of the whole solve (the MILP stops at it).
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.config.time_limit = limit;
        self
    }

    /// A work budget instead of the time limit ([`PartitionConfig::work_budget`]): the same
    /// plan on every machine.
    pub fn with_work_budget(mut self, units: Option<u64>) -> Self {
        self.config.work_budget = units;
        self
    }

    /// Measured per-node times (seconds per micro-batch, by node name) used instead of the cost
    /// model's estimates on every device; see [`PartitionProblem::override_node_secs`]. A name
    /// that is not a node of the graph makes [`Self::solve`] fail with
    /// [`Error::UnknownNode`]. Plans record the resulting stage times, not the overrides, so
    /// `pipecut check` re-estimates them with the cost model.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use pipecut_cost::{Catalog, Cluster};
    /// use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
    /// use pipecut_planner::partition::{Planner, StageCount};
    ///
    /// let mut model = pipecut_ir::onnx::load_model("../../fixtures/models/mlp.onnx")?;
    /// ShapeInference::new(DimBindings::new().bind("batch", 16)).run(&mut model.graph)?;
    /// // The framework measured every node at 1 ms.
    /// let measured: HashMap<String, f64> = model
    ///     .graph
    ///     .topological_order()
    ///     .iter()
    ///     .map(|&id| (model.graph.node(id).name.clone(), 1e-3))
    ///     .collect();
    /// let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin())?;
    /// let solution = Planner::new(&model.graph, &cluster)
    ///     .with_stages(StageCount::Fixed(2))
    ///     .with_node_secs(measured)
    ///     .solve()?;
    /// let compute: f64 = solution.evaluation.stages.iter().map(|s| s.compute_secs).sum();
    /// assert!((compute - model.graph.node_count() as f64 * 1e-3).abs() < 1e-9);
    ///
    /// let typo = HashMap::from([("/no/such/node".to_string(), 1e-3)]);
    /// let err = Planner::new(&model.graph, &cluster).with_node_secs(typo).solve().unwrap_err();
    /// assert!(matches!(err, pipecut_ir::Error::UnknownNode { .. }));
    /// # Ok::<(), pipecut_ir::Error>(())
    /// ```
    pub fn with_node_secs(mut self, secs_by_name: HashMap<String, f64>) -> Self {
        self.node_secs = secs_by_name;
        self
    }

    /// Every stage on a tensor-parallel group of `tp.degree` consecutive devices from its
    /// device, with what `blocks` splits split (see [`tensor_parallel`]).
    pub fn with_tensor_parallel(
        mut self,
        blocks: tensor_parallel::TensorParallelBlocks,
        tp: tensor_parallel::TensorParallelism,
    ) -> Self {
        self.tensor_parallel = (!tp.is_none()).then_some((blocks, tp));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &PartitionConfig {
        &self.config
    }

    fn devices(&self) -> Result<Vec<DeviceId>, Error> {
        if self.config.devices.is_empty() {
            return Ok(self.cluster.devices().map(|(id, _)| id).collect());
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.config.devices {
            if d.0 as usize >= self.cluster.device_count() {
                return Err(Error::PartitionConfig(format!(
                    "device {} is not in the cluster ({} devices)",
                    d.0,
                    self.cluster.device_count()
                )));
            }
            if !seen.insert(*d) {
                return Err(Error::PartitionConfig(format!(
                    "device {} is listed twice in the pipeline order",
                    d.0
                )));
            }
        }
        Ok(self.config.devices.clone())
    }

    /// Solves: the best partition, its status and lower bound, and the baselines.
    pub fn solve(&self) -> Result<Solution, Error> {
        let started = Instant::now();
        let planner = Planner {
            started,
            ..self.clone()
        };
        planner.solve_from(started)
    }

    fn solve_from(&self, started: Instant) -> Result<Solution, Error> {
        // Under a work budget the clock stops nothing: every search ends by its own count.
        let deadline = match (self.config.work_budget, self.guard) {
            (Some(_), guard) => started + guard.unwrap_or(UNLIMITED),
            (None, _) => started + self.config.time_limit,
        };
        self.config
            .settings
            .schedule
            .validate()
            .map_err(Error::PartitionConfig)?;
        let devices = self.devices()?;
        let nodes = self.graph.node_count();
        let (mut solution, candidates) = match self.config.stages {
            StageCount::Fixed(k) => {
                if k > devices.len() {
                    return Err(Error::PartitionConfig(format!(
                        "{k} stages need {k} devices, the cluster has {}",
                        devices.len()
                    )));
                }
                if k > nodes {
                    return Err(Error::PartitionConfig(format!(
                        "{k} stages cannot be made from {nodes} nodes"
                    )));
                }
                if k < 2 && !self.config.cut_constraints.pin.is_empty() {
                    return Err(Error::PartitionConfig(
                        "--pin-cut needs at least 2 stages".to_string(),
                    ));
                }
                let chunks = self.config.settings.schedule.chunk_devices(&devices[..k]);
                (self.solve_fixed(&chunks, deadline)?, Vec::new())
            }
            StageCount::Auto => self.solve_auto(&devices, deadline)?,
        };
        let mut candidates = candidates;
        // The DP's plan chose the count; the MILP may have improved it since. The chosen row
        // shows the final plan's figures, simulated as `pipecut show` simulates them, so the
        // table and `show` give one step time for one plan.
        let chosen = solution.problem.stage_count();
        if let Some(row) = candidates.iter_mut().find(|c| c.stages == chosen) {
            let simulation = simulate(
                &solution.stage_times(),
                self.config.settings.schedule.into(),
                self.config.settings.microbatches.max(1) as usize,
            )?;
            row.bottleneck_secs = Some(solution.evaluation.bottleneck_secs);
            row.step_secs = Some(simulation.step_secs);
            row.bubble_fraction = Some(simulation.bubble_fraction);
        }
        solution.candidates = candidates;
        solution.solve_secs = started.elapsed().as_secs_f64();
        Ok(solution)
    }

    fn problem(&self, devices: &[DeviceId]) -> Result<PartitionProblem, Error> {
        let mut problem =
            PartitionProblem::new(self.graph, self.cluster, devices, self.config.settings)?;
        problem.pin_cuts(&self.config.cut_constraints.pin)?;
        if !self.node_secs.is_empty() {
            problem.override_node_secs(&self.node_secs)?;
        }
        if let (Some((blocks, tp)), Some(&first)) = (&self.tensor_parallel, devices.first()) {
            blocks.shard_on(self.graph, &mut problem, self.cluster, *tp, first);
        }
        Ok(problem)
    }

    /// The DP, then (as configured) the MILP from the DP's plan until `deadline`, and the
    /// baselines on the model's own nodes (the peers know nothing of pipecut's constraints).
    fn solve_fixed(&self, devices: &[DeviceId], deadline: Instant) -> Result<Solution, Error> {
        let costing = Instant::now();
        let fine = self.problem(devices)?;
        let costs_took = costing.elapsed();
        // The peers' plans are comparisons: when the model's costs took a quarter of the limit
        // (the baselines take about half as long again: 1.9 s after 3.4 s on a million nodes),
        // they are skipped rather than delay pipecut's plan. Under a work budget the clock
        // decides nothing (its deadline is never near).
        // A limit already spent (zero: the command's loading took it) leaves none for them.
        let left = deadline.saturating_duration_since(Instant::now());
        let (baselines, baseline_layers) =
            match !left.is_zero() && left >= self.config.time_limit * 3 / 4 {
                true => evaluate_baselines(&fine, &self.config.baseline_layer_type),
                false => skipped_baselines(&self.config.baseline_layer_type),
            };
        // The constraints' groups, their quotient and the DP's first sweeps are linear passes
        // that took about as long as the costs on a million nodes (docs/benchmarks.md, "Limits
        // at any size"). With less time left than the costs took they are not begun: the order
        // is split into stages of equal compute where no joined pair is cut, and that plan
        // stands (`dp_stopped`). Pinned cuts need the groups' own check, so they always run.
        let short_of_time = (self.config.work_budget.is_none() || self.guard.is_some())
            && self.config.cut_constraints.pin.is_empty()
            && deadline.saturating_duration_since(Instant::now()) < costs_took;
        if short_of_time {
            let Some(may_start) = self
                .config
                .cut_constraints
                .stage_starts(self.graph, &fine)?
            else {
                let start = self.start_on(&fine, None);
                return Ok(Solution {
                    baselines,
                    baseline_layers,
                    ..self.solve_problem(fine, deadline, start)?
                });
            };
            let split = self
                .start_on(&fine, None)
                .or_else(|| dp::balanced_split_at(&fine, Some(&may_start)));
            if let Some(split) = split {
                // Nothing more begins: the deadline is now for the phases after the split.
                let now = Instant::now().min(deadline);
                return Ok(Solution {
                    baselines,
                    baseline_layers,
                    ..self.solve_problem(fine, now, Some(split))?
                });
            }
        }
        let Some(grouped) = self.config.cut_constraints.apply(self.graph, &fine)? else {
            let start = self.start_on(&fine, None);
            return Ok(Solution {
                baselines,
                baseline_layers,
                ..self.solve_problem(fine, deadline, start)?
            });
        };
        let start = self.start_on(&grouped.problem, Some(&grouped));
        // Solved on the groups the constraints join, then expanded: the quotient evaluates any
        // assignment exactly as the model does, so the figures, bound and status carry over.
        let coarsen::Coarsened {
            problem: groups,
            group_of,
        } = grouped;
        let mut solution = self.solve_problem(groups, deadline, start)?;
        let stage_of: Vec<StageId> = group_of
            .iter()
            .map(|&g| solution.stage_of[g as usize])
            .collect();
        let evaluation = fine.evaluate(&stage_of);
        solution.problem = fine;
        Ok(Solution {
            stage_of,
            evaluation,
            baselines,
            baseline_layers,
            ..solution
        })
    }

    /// Whether the MILP runs after the DP (and the ideal search): always when chosen, never
    /// for `--solver dp`, and for `auto` when the DP is not exact and no work budget is set.
    fn runs_milp(&self, dp_exact: bool) -> bool {
        match self.config.solver {
            SolverChoice::Dp => false,
            SolverChoice::Milp => true,
            // The MILP has no work count: under a budget the ideal search is the last word.
            SolverChoice::Auto => !dp_exact && self.config.work_budget.is_none(),
        }
    }

    /// The DP, then (as configured) the MILP from the DP's plan until `deadline`, on `problem`.
    /// `split`, when given, is the balanced split to start from (one that keeps the cut
    /// constraints, made when the time left could not cover their groups).
    fn solve_problem(
        &self,
        problem: PartitionProblem,
        deadline: Instant,
        split: Option<dp::OrderSolution>,
    ) -> Result<Solution, Error> {
        let dp_plan = self.dp_phase(&problem, deadline, split)?;
        let mut proved = self.prove_bounds(&problem, &dp_plan, deadline);
        let k = problem.stage_count();
        self.report(
            SolverKind::Dp,
            k,
            dp_plan.evaluation.bottleneck_secs,
            Some(proved.secs),
        );
        let at_bound =
            dp_plan.evaluation.bottleneck_secs <= proved.secs * (1.0 + dp::RELATIVE_TOLERANCE);
        // A chain has one topological order, so a DP that finished saw every convex partition.
        let dp_exact = at_bound || (dp_plan.complete && is_chain(&problem));
        let search = self.config.solver == SolverChoice::Auto && !dp_exact;
        let run_milp = self.runs_milp(dp_exact);
        // The search and the MILP at once on the graphs the search takes (the MILP stops
        // promptly there); one after the other on larger ones, where the search declines at once.
        let beside = search
            && run_milp
            && Instant::now() + dp_plan.secs * 2 < deadline
            && problem.node_count() <= ideal_search::MAX_NODES;
        let (stage_of, status, solver, milp) = if beside {
            self.search_beside_milp(&problem, &dp_plan, dp_exact, deadline, &mut proved)
        } else {
            self.search_then_milp(
                &problem,
                &dp_plan,
                search,
                run_milp,
                dp_exact,
                deadline,
                &mut proved,
            )
        };
        let status = dp_stopped_status(status, solver, dp_plan.complete);
        // The DP's own plan was evaluated already; a million nodes take a tenth of a second.
        let evaluation = match stage_of == dp_plan.incumbent {
            true => dp_plan.evaluation,
            false => problem.evaluate(&stage_of),
        };
        let (lower_bound_secs, proof) = match status == SolveStatus::Optimal {
            true => {
                let bottleneck = evaluation.bottleneck_secs;
                let proof = proof::proof_of(&problem, bottleneck, &proved.bounds);
                (bottleneck, Some(proof))
            }
            false => (proved.secs, None),
        };
        Ok(Solution {
            status,
            lower_bound_secs: lower_bound_secs.min(evaluation.bottleneck_secs),
            bounds: proved.bounds,
            proof,
            stage_of,
            evaluation,
            solver,
            solve_secs: 0.0,
            // Filled by `solve_fixed`, on the model's nodes rather than `problem`'s groups.
            baselines: Vec::new(),
            baseline_layers: String::new(),
            baseline_layer_type: self.config.baseline_layer_type.clone(),
            candidates: Vec::new(),
            milp,
            problem,
            cut_constraints: self.config.cut_constraints.clone(),
            work_budget: self.config.work_budget,
        })
    }

    /// The ideal search (when `search`) for its share of the time, then the MILP from its plan
    /// (when `run_milp` and there is time for it): the plan, status and solver to credit, and
    /// the MILP's report where it ran.
    #[allow(clippy::too_many_arguments)]
    fn search_then_milp(
        &self,
        problem: &PartitionProblem,
        dp_plan: &DpPlan,
        search: bool,
        run_milp: bool,
        dp_exact: bool,
        deadline: Instant,
        proved: &mut Proved,
    ) -> (Vec<StageId>, SolveStatus, SolverKind, Option<MilpReport>) {
        let searched = (search && Instant::now() < deadline)
            .then(|| self.search_ideals(problem, &dp_plan.incumbent, deadline));
        // Without the time of two more DPs left (the MILP's refinement needs one, and coarsening
        // a model too large to build costs about another), the MILP would only overrun the
        // limit: its thread, abandoned at the deadline, still coarsens a million nodes while the
        // plan is written (a 10 s limit overran by 16% so).
        let milp_has_time = Instant::now() + dp_plan.secs * 2 < deadline;
        let incumbent = &dp_plan.incumbent;
        if let Some((plan, end)) = &searched
            .as_ref()
            .filter(|(_, end)| *end == ideal_search::SearchEnd::Proven || !run_milp)
        {
            let (status, solver) =
                ideal_search_outcome(problem, plan, *end, incumbent, proved.secs);
            (plan.clone(), status, solver, None)
        } else if run_milp && !milp_has_time {
            // The MILP's start stands: the ideal search's plan when it beats the DP's.
            let (start, solver) = match searched {
                Some((plan, _)) if dp::better(problem, &plan, incumbent) => {
                    (plan, SolverKind::IdealSearch)
                }
                Some((plan, _)) => (plan, SolverKind::Dp),
                None => (incumbent.clone(), SolverKind::Dp),
            };
            (start, MILP_NOT_STARTED, solver, None)
        } else if run_milp {
            let start = searched.map_or(incumbent.clone(), |(plan, _)| plan);
            let (stage_of, status, solver, report) =
                self.milp_phase(problem, start, dp_plan, dp_exact, deadline, proved);
            (stage_of, status, solver, Some(report))
        } else {
            let status = if dp_exact {
                SolveStatus::Optimal
            } else {
                SolveStatus::Heuristic {
                    reason: HeuristicReason::DpOnly,
                }
            };
            (incumbent.clone(), status, SolverKind::Dp, None)
        }
    }

    /// The plan the searches start from: the DP's along the order (or `split`, the balanced
    /// split, when the deadline leaves no DP or the DP stopped short of it), or when no
    /// contiguous cut fits, the exact solver's first fitting plan; refused as infeasible when
    /// there is none.
    fn dp_phase(
        &self,
        problem: &PartitionProblem,
        deadline: Instant,
        split: Option<dp::OrderSolution>,
    ) -> Result<DpPlan, Error> {
        let budget = self.config.work_budget;
        let dp_started = Instant::now();
        // A plan before any search: past the deadline (the model's costs took it all) it
        // stands, and the DP runs only when it does not fit. Under a work budget the clock
        // decides nothing, so the DP always runs to its end.
        let balanced = split.or_else(|| dp::balanced_split(problem));
        let dp_deadline = budget.is_none().then_some(deadline);
        let past_deadline = dp_deadline.is_some_and(|d| Instant::now() >= d);
        let order = match balanced {
            // The split stands alone: comparing it with itself would cost two evaluations of
            // the whole model past the deadline.
            Some(split) if past_deadline => Some(split),
            balanced => match (dp::solve_until(problem, dp_deadline), balanced) {
                (Some(dp), Some(split))
                    if !dp.complete && dp::better(problem, &split.stage_of, &dp.stage_of) =>
                {
                    Some(split)
                }
                (Some(dp), _) => Some(dp),
                (None, split) => split,
            },
        };
        let complete = order.as_ref().is_some_and(|o| o.complete);
        let (incumbent, order_evaluation) = match order {
            Some(order) => (order.stage_of, Some(order.evaluation)),
            // No contiguous cut of the order fits: the exact solver decides over every convex
            // partition before "does not fit".
            None => {
                let fitting =
                    milp::fit_or_explain(problem, deadline, budget).map_err(|why| match why {
                        milp::NoFit::Proven(why) => {
                            Error::Infeasible(explain_infeasible(problem, self.cluster) + &why)
                        }
                        milp::NoFit::Undecided(why) => Error::MemoryUndecided(why),
                    })?;
                (fitting, None)
            }
        };
        let secs = dp_started.elapsed();
        let evaluation = order_evaluation.unwrap_or_else(|| problem.evaluate(&incumbent));
        Ok(DpPlan {
            incumbent,
            evaluation,
            complete,
            secs,
        })
    }

    /// The lower bounds proved before the searches: the average work, the granularity bound
    /// and, while the DP's plan is above them, the LP relaxation.
    fn prove_bounds(
        &self,
        problem: &PartitionProblem,
        dp_plan: &DpPlan,
        deadline: Instant,
    ) -> Proved {
        let budget = self.config.work_budget;
        // The bound's cut-node search may take a quarter of what is left (under a work budget
        // its own work count stops it, so the plan does not depend on the clock); past it the
        // average-work bound stands and the rest goes to the searches.
        let bound_deadline = match budget {
            Some(_) => deadline,
            None => Instant::now() + deadline.saturating_duration_since(Instant::now()) / 4,
        };
        let mut bounds = LowerBounds {
            average_work_secs: problem.lower_bound_secs(),
            granularity_secs: bounds::granularity_bound_secs(problem, bound_deadline, budget),
            ..LowerBounds::default()
        };
        let mut secs = bounds.strongest().1;
        // The LP relaxation counts what the granularity bound does not (communication, memory,
        // each stage's device), for an eighth of what is left. It has no work count, so under a
        // work budget it does not run: the plan must not depend on the clock.
        let gap_open = dp_plan.evaluation.bottleneck_secs > secs * (1.0 + dp::RELATIVE_TOLERANCE);
        if gap_open && budget.is_none() {
            let lp_deadline =
                Instant::now() + deadline.saturating_duration_since(Instant::now()) / 8;
            bounds.lp_relaxation_secs = milp::lp_relaxation_bound_secs(
                problem,
                dp_plan.evaluation.bottleneck_secs,
                lp_deadline,
            );
            secs = bounds.strongest().1;
        }
        Proved { bounds, secs }
    }

    /// The MILP from `start` (the ideal search's plan, or the DP's), with `dp_plan.secs` kept
    /// back for its refinement; a bound it proves joins `proved`. Gives its plan, status, the
    /// solver to credit and its report.
    fn milp_phase(
        &self,
        problem: &PartitionProblem,
        start: Vec<StageId>,
        dp_plan: &DpPlan,
        dp_exact: bool,
        deadline: Instant,
        proved: &mut Proved,
    ) -> (Vec<StageId>, SolveStatus, SolverKind, MilpReport) {
        let (stage_of, bound, report) =
            self.milp_within_deadline(problem, &start, deadline, dp_plan.secs);
        let status = milp_status_of(problem, &stage_of, bound, &report, dp_exact, proved);
        // Compared only when the MILP did not improve: a million-node plan takes a tenth of a
        // second to evaluate, and this compares two.
        let solver = if report.improved {
            SolverKind::Milp
        } else if dp::better(problem, &start, &dp_plan.incumbent) {
            SolverKind::IdealSearch
        } else {
            SolverKind::Dp
        };
        (stage_of, status, solver, report)
    }

    /// The MILP phase (coarsening, search, refinement) on a thread of its own, which aims at
    /// `deadline` less a grace of 2% of the limit and is waited for until `deadline` (the grace
    /// came after the deadline before, and overran every loaded run by it). microlp looks at
    /// its clock only between
    /// branch-and-bound nodes, so the root LP of a large (even coarsened) model can run far past
    /// any deadline: a 19,993-node stack at K = 64 took 17.8 s under a 10 s limit. Past the wait
    /// the DP's plan stands, reported as stopped at the time limit (its gap is to the proven
    /// lower bound), and the thread is left to end on its own: its search stops at its next
    /// clock check, holding at most one model of [`milp::MAX_MODEL_CELLS`] cells meanwhile.
    fn milp_within_deadline(
        &self,
        problem: &PartitionProblem,
        incumbent: &[StageId],
        deadline: Instant,
        refine_reserve: Duration,
    ) -> (Vec<StageId>, Option<f64>, MilpReport) {
        let thread = self.spawn_milp(problem, incumbent, deadline, refine_reserve, None);
        wait_for_milp(problem, incumbent, thread, deadline)
    }

    /// Starts [`Planner::milp_within_deadline`]'s thread, aiming at `deadline` less the grace.
    /// `beside`, for a run beside the ideal search: the MILP stops at its next slice once
    /// `beside.stop` is set, and gives `beside.proven_floor` its bound when it has proven its
    /// plan.
    fn spawn_milp(
        &self,
        problem: &PartitionProblem,
        incumbent: &[StageId],
        deadline: Instant,
        refine_reserve: Duration,
        beside: Option<&Beside>,
    ) -> MilpThread {
        let deadline = self.milp_deadline(deadline);
        let abandoned = Arc::new(AtomicBool::new(false));
        let (sender, receiver) = std::sync::mpsc::channel();
        let search = {
            let problem = problem.clone();
            let incumbent = incumbent.to_vec();
            let progress = self.progress.clone();
            let abandoned = Arc::clone(&abandoned);
            let beside = beside.cloned();
            let started = self.started;
            move || {
                if beside.as_ref().is_some_and(Beside::stopped_in_head_start) {
                    return;
                }
                let stages = problem.stage_count();
                // No progress once the Planner has moved on: its caller may be printing the plan.
                let report = |best_secs: f64, bound_secs: Option<f64>| match &progress {
                    Some(sink) if !abandoned.load(Ordering::Relaxed) => (sink.0)(&Progress {
                        elapsed_secs: started.elapsed().as_secs_f64(),
                        solver: SolverKind::Milp,
                        stages,
                        best_secs,
                        bound_secs,
                    }),
                    _ => {}
                };
                let found = match &beside {
                    Some(beside) => milp::solve_model_stoppable(
                        &problem,
                        &incumbent,
                        deadline,
                        refine_reserve,
                        &report,
                        Arc::clone(&beside.stop),
                    ),
                    None => milp::solve_model_reporting(
                        &problem,
                        &incumbent,
                        deadline,
                        refine_reserve,
                        &report,
                    ),
                };
                if let (Some(beside), true, Some(bound)) = (&beside, found.2.proven, found.1) {
                    beside.prove_floor(bound);
                }
                // The receiver is gone when the wait ended first: nothing to do then.
                let _ = sender.send(found);
            }
        };
        match std::thread::Builder::new()
            .name("pipecut-milp".into())
            .spawn(search)
        {
            Ok(_) => MilpThread::Running {
                answer: receiver,
                abandoned,
            },
            Err(error) => {
                MilpThread::NotStarted(format!("could not start the MILP's thread: {error}"))
            }
        }
    }

    /// What the MILP's thread aims at: `deadline` less a grace of 2% of the limit, so that its
    /// answer is in before the planner stops waiting at `deadline`.
    fn milp_deadline(&self, deadline: Instant) -> Instant {
        let grace = self.config.time_limit / 50;
        deadline.checked_sub(grace).unwrap_or(deadline)
    }

    /// The ideal search and the MILP at once, each from the DP's plan, the MILP on a thread of
    /// its own. On the K = 8 instances of `benches/exact_k8.sh` one of them often proves in a
    /// second what the other needs most of 10 s for, and one after the other gave the second
    /// only what the first left. The first proof stops the other: the search's stops the MILP
    /// at its next time slice, the MILP's stops the search at its next look at the clock. Gives
    /// the plan, status and solver to credit as [`Planner::search_then_milp`] does, and the
    /// MILP's report where the search did not prove its plan.
    fn search_beside_milp(
        &self,
        problem: &PartitionProblem,
        dp_plan: &DpPlan,
        dp_exact: bool,
        deadline: Instant,
        proved: &mut Proved,
    ) -> (Vec<StageId>, SolveStatus, SolverKind, Option<MilpReport>) {
        let incumbent = &dp_plan.incumbent;
        let beside = Beside::new();
        let thread = self.spawn_milp(problem, incumbent, deadline, dp_plan.secs, Some(&beside));
        // The search ends when the MILP's answer is due, so that its wait costs nothing.
        let search_deadline = self.milp_deadline(deadline);
        let run =
            ideal_search::solve_beside(problem, incumbent, search_deadline, &beside.proven_floor);
        // Proven by the search alone or by the MILP's bound, the plan is the one the search
        // proves alone, and the plan says nothing of the MILP: the same bytes whichever
        // finished first.
        if run.end == ideal_search::SearchEnd::Proven {
            beside.stop.store(true, Ordering::Relaxed);
            if let MilpThread::Running { abandoned, .. } = &thread {
                abandoned.store(true, Ordering::Relaxed);
            }
            // Not waited for: it ends at its next slice, or within its root LP's second.
            let plan = coarsen::refine(problem, &run.stage_of).unwrap_or(run.stage_of);
            let (status, solver) =
                ideal_search_outcome(problem, &plan, run.end, incumbent, proved.secs);
            return (plan, status, solver, None);
        }
        let (found, bound, report) = wait_for_milp(problem, incumbent, thread, deadline);
        beside.stop.store(true, Ordering::Relaxed);
        // The search's plan where it beats the MILP's (which started from the DP's, not it).
        let (stage_of, solver) = match dp::better(problem, &run.stage_of, &found) {
            true => (run.stage_of, SolverKind::IdealSearch),
            false if report.improved => (found, SolverKind::Milp),
            false => (found, SolverKind::Dp),
        };
        let status = milp_status_of(problem, &stage_of, bound, &report, dp_exact, proved);
        (stage_of, status, solver, Some(report))
    }

    /// The ideal search (ideal_search.rs) from `incumbent`, for [`IDEAL_SEARCH_SHARE`] of the
    /// time left (all of it under a work budget, where the MILP does not run): its best plan
    /// (refined for fewer bytes when proven) and how it ended.
    fn search_ideals(
        &self,
        problem: &PartitionProblem,
        incumbent: &[StageId],
        deadline: Instant,
    ) -> (Vec<StageId>, ideal_search::SearchEnd) {
        let now = Instant::now();
        let search_deadline = match self.config.work_budget {
            Some(_) => deadline,
            None => {
                now + deadline
                    .saturating_duration_since(now)
                    .mul_f64(IDEAL_SEARCH_SHARE)
            }
        };
        let run = ideal_search::solve(problem, incumbent, search_deadline, self.config.work_budget);
        let proven = run.end == ideal_search::SearchEnd::Proven;
        let mut plan = run.stage_of;
        if proven {
            // The search minimises only the bottleneck; the DP along the plan's order moves its
            // boundaries for fewer bytes at the same bottleneck.
            if let Some(refined) = coarsen::refine(problem, &plan) {
                plan = refined;
            }
        }
        (plan, run.end)
    }

    /// Tries every stage count up to the devices (and nodes), simulates each best partition
    /// under the schedule, and keeps the one with the shortest step (fewer stages on ties).
    /// Stops early, with the best so far, once `deadline` has passed.
    fn solve_auto(
        &self,
        devices: &[DeviceId],
        deadline: Instant,
    ) -> Result<(Solution, Vec<StageCountCandidate>), Error> {
        let max_stages = devices.len().min(self.graph.node_count()).max(1);
        let schedule: PipelineSchedule = self.config.settings.schedule.into();
        let microbatches = self.config.settings.microbatches.max(1) as usize;
        let mut candidates = Vec::new();
        let mut best: Option<(f64, PartitionProblem, dp::OrderSolution)> = None;
        let mut last_infeasible = None;
        for k in 1..=max_stages {
            // The time limit covers this sweep too: past it, the best stage count found so far
            // is solved (at least one count is always tried).
            if best.is_some() && Instant::now() >= deadline {
                break;
            }
            let fine = self.problem(&self.config.settings.schedule.chunk_devices(&devices[..k]))?;
            let problem = match self.config.cut_constraints.apply(self.graph, &fine)? {
                Some(grouped) => grouped.problem,
                None => fine,
            };
            let Some(order) = dp::solve(&problem) else {
                candidates.push(StageCountCandidate {
                    stages: k,
                    bottleneck_secs: None,
                    step_secs: None,
                    bubble_fraction: None,
                });
                last_infeasible = Some(problem);
                continue;
            };
            let evaluation = &order.evaluation;
            self.report(
                SolverKind::Dp,
                k,
                evaluation.bottleneck_secs,
                Some(problem.lower_bound_secs()),
            );
            let simulation = simulate(&stage_times(&problem, evaluation), schedule, microbatches)?;
            candidates.push(StageCountCandidate {
                stages: k,
                bottleneck_secs: Some(evaluation.bottleneck_secs),
                step_secs: Some(simulation.step_secs),
                bubble_fraction: Some(simulation.bubble_fraction),
            });
            let better = best.as_ref().is_none_or(|(step, _, _)| {
                simulation.step_secs < step * (1.0 - dp::RELATIVE_TOLERANCE)
            });
            if better {
                best = Some((simulation.step_secs, problem, order));
            }
        }
        let Some((_, problem, _)) = best else {
            // No contiguous cut fits at any count: the exact solver decides over every convex
            // partition at the largest count tried (the most memory), as for a fixed count,
            // and either plans it or names the smallest memory that would fit.
            let problem = last_infeasible.expect("at least one stage count was tried");
            let devices: Vec<DeviceId> = problem.stages().iter().map(|s| s.device).collect();
            return Ok((self.solve_fixed(&devices, deadline)?, candidates));
        };
        let devices = problem
            .stages()
            .iter()
            .map(|s| s.device)
            .collect::<Vec<_>>();
        Ok((self.solve_fixed(&devices, deadline)?, candidates))
    }
}

/// A MILP thread started by [`Planner::spawn_milp`], or why none started.
enum MilpThread {
    Running {
        answer: std::sync::mpsc::Receiver<(Vec<StageId>, Option<f64>, MilpReport)>,
        /// Set when the planner stops waiting: the thread then reports no more progress.
        abandoned: Arc<AtomicBool>,
    },
    NotStarted(String),
}

/// The flags between the ideal search and the MILP run beside it
/// ([`Planner::search_beside_milp`], and `check` proving a search's claim again in proof.rs).
#[derive(Clone)]
struct Beside {
    /// Set by the planner: the MILP stops at its next slice.
    stop: Arc<AtomicBool>,
    /// The MILP's bound (an `f64`'s bits, 0 until then), given when it has proven its plan: the
    /// search ends once its own bound is below it.
    proven_floor: Arc<AtomicU64>,
}

impl Beside {
    /// Neither stopped nor proven.
    fn new() -> Beside {
        Beside {
            stop: Arc::new(AtomicBool::new(false)),
            proven_floor: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Gives the search the bound of a plan the other solver proved (see `proven_floor`).
    fn prove_floor(&self, bound: f64) {
        self.proven_floor.store(bound.to_bits(), Ordering::Relaxed);
    }

    /// Waits out the search's head start ([`MILP_HEAD_START`]): whether the search was proven
    /// meanwhile, so that the MILP need not start.
    fn stopped_in_head_start(&self) -> bool {
        let started = Instant::now();
        while started.elapsed() < MILP_HEAD_START {
            if self.stop.load(Ordering::Relaxed) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.load(Ordering::Relaxed)
    }
}

/// How long the ideal search runs alone before the MILP starts beside it: most models are
/// proven by then (every fixture but llama_tiny at K = 8: 0.01–0.09 s for the whole command in
/// `benches/exact_k8.sh`), and a MILP begun runs its root LP (up to a second, [`milp`]'s
/// `STOPPABLE_ROOT`) whatever the search does.
const MILP_HEAD_START: Duration = Duration::from_millis(100);

/// The MILP's answer, waited for until `deadline`: its plan, a bound it proved and its report.
/// Past the wait (or with no thread) `incumbent` stands, reported as not answered.
fn wait_for_milp(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    thread: MilpThread,
    deadline: Instant,
) -> (Vec<StageId>, Option<f64>, MilpReport) {
    let report = MilpReport {
        nodes: problem.node_count(),
        coarsened: false,
        proven: false,
        stopped: None,
        improved: false,
        started: true,
        error: None,
        too_large: false,
    };
    let (answer, abandoned) = match thread {
        MilpThread::Running { answer, abandoned } => (answer, abandoned),
        MilpThread::NotStarted(error) => {
            let report = MilpReport {
                started: false,
                error: Some(error),
                ..report
            };
            return (incumbent.to_vec(), None, report);
        }
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    match answer.recv_timeout(wait) {
        Ok(found) => found,
        Err(_) => {
            abandoned.store(true, Ordering::Relaxed);
            let report = MilpReport {
                stopped: Some(MilpStop::NotAnswered),
                ..report
            };
            (incumbent.to_vec(), None, report)
        }
    }
}

/// The status of `stage_of` after the MILP: a bound it proved joins `proved`, and the plan is
/// optimal where it meets the strongest bound (or the DP was exact).
fn milp_status_of(
    problem: &PartitionProblem,
    stage_of: &[StageId],
    milp_bound: Option<f64>,
    report: &MilpReport,
    dp_exact: bool,
    proved: &mut Proved,
) -> SolveStatus {
    if let Some(bound) = milp_bound {
        proved.bounds.branch_and_bound_secs = Some(bound);
        proved.secs = proved.secs.max(bound);
    }
    let bottleneck = problem.evaluate(stage_of).bottleneck_secs;
    let meets_bound = bottleneck <= proved.secs * (1.0 + dp::RELATIVE_TOLERANCE);
    milp_status(
        report,
        meets_bound || dp_exact,
        relative_gap(bottleneck, proved.secs),
    )
}

/// The deadline under a work budget: far enough never to be reached, near enough that
/// `Instant` arithmetic cannot overflow.
const UNLIMITED: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The part of the time left that the ideal search gets before the MILP where they run one
/// after the other ([`Planner::search_then_milp`]: the MILP had no time to start beside it).
/// Measured when that was the only way, on the K = 8 instances of `benches/exact_k8.sh` at
/// 10 s: at 0.7 PP-OCRv4's recogniser on the mixed cluster in training was proven by the search
/// (about 5 s), and the MILP still proved two instances in the 3 s left to it.
const IDEAL_SEARCH_SHARE: f64 = 0.7;

/// The status of a plan the MILP would have improved on, had the time left let it begin.
const MILP_NOT_STARTED: SolveStatus = SolveStatus::Heuristic {
    reason: HeuristicReason::MilpNotStarted,
};

/// `status` of a plan `solver` found, when the DP did not run to its end (`dp_complete`):
/// the DP's plan, from a DP the deadline stopped (or never began), says so, rather than that
/// only the MILP was missing.
fn dp_stopped_status(status: SolveStatus, solver: SolverKind, dp_complete: bool) -> SolveStatus {
    match status {
        SolveStatus::Heuristic {
            reason: HeuristicReason::MilpNotStarted | HeuristicReason::DpOnly,
        } if !dp_complete && solver == SolverKind::Dp => SolveStatus::Heuristic {
            reason: HeuristicReason::DpStopped,
        },
        other => other,
    }
}

/// What the DP phase leaves for the searches after it.
struct DpPlan {
    /// The plan the searches start from.
    incumbent: Vec<StageId>,
    /// Its figures.
    evaluation: Evaluation,
    /// Whether the DP ran to its end (a DP the deadline stopped, or a balanced split, did not).
    complete: bool,
    /// What the DP took: the MILP keeps as much back for its refinement.
    secs: Duration,
}

/// The lower bounds proved so far, and the strongest of them.
struct Proved {
    bounds: LowerBounds,
    secs: f64,
}

/// The status of the ideal search's `plan` and the solver to credit: the search, when its plan
/// beats the DP's `incumbent`.
fn ideal_search_outcome(
    problem: &PartitionProblem,
    plan: &[StageId],
    end: ideal_search::SearchEnd,
    incumbent: &[StageId],
    lower_bound_secs: f64,
) -> (SolveStatus, SolverKind) {
    let solver = if dp::better(problem, plan, incumbent) {
        SolverKind::IdealSearch
    } else {
        SolverKind::Dp
    };
    let status = match end {
        ideal_search::SearchEnd::Proven => SolveStatus::Optimal,
        ideal_search::SearchEnd::WorkLimit => SolveStatus::Heuristic {
            reason: HeuristicReason::WorkBudget,
        },
        ideal_search::SearchEnd::Deadline => SolveStatus::TimeLimit {
            gap: relative_gap(problem.evaluate(plan).bottleneck_secs, lower_bound_secs),
            stop: MilpStop::Deadline,
        },
        ideal_search::SearchEnd::TooLarge => SolveStatus::Heuristic {
            reason: HeuristicReason::TooLargeToSearch,
        },
    };
    (status, solver)
}

/// The status of a plan the MILP worked on, saying what happened: proven, stopped by the limit,
/// never started, failed, or proven only over a coarsened graph. `proven_otherwise` is a proof
/// that needs no MILP (the plan meets the lower bound, or the graph is a chain).
fn milp_status(report: &milp::MilpReport, proven_otherwise: bool, gap: f64) -> SolveStatus {
    let reason = if proven_otherwise || (report.proven && !report.coarsened) {
        return SolveStatus::Optimal;
    } else if report.too_large {
        HeuristicReason::TooLarge
    } else if report.error.is_some() {
        HeuristicReason::SolverError
    } else if !report.started {
        HeuristicReason::MilpNotStarted
    } else if let Some(stop) = report.stopped {
        return SolveStatus::TimeLimit { gap, stop };
    } else if report.coarsened {
        HeuristicReason::Coarsened
    } else {
        HeuristicReason::StoppedWithoutProof
    };
    SolveStatus::Heuristic { reason }
}

/// `(bottleneck − bound) / bottleneck`, 0 for a zero bottleneck.
fn relative_gap(bottleneck_secs: f64, bound_secs: f64) -> f64 {
    if bottleneck_secs > 0.0 {
        ((bottleneck_secs - bound_secs) / bottleneck_secs).max(0.0)
    } else {
        0.0
    }
}

/// Whether the problem's topological order is its only one: every node feeds the next, so every
/// convex partition is contiguous in it.
pub(crate) fn is_chain(problem: &PartitionProblem) -> bool {
    let n = problem.node_count();
    let mut feeds_next = vec![false; n.saturating_sub(1)];
    for flow in problem.flows() {
        let p = flow.producer as usize;
        if p + 1 < n && flow.consumers.binary_search(&(flow.producer + 1)).is_ok() {
            feeds_next[p] = true;
        }
    }
    feeds_next.iter().all(|&f| f)
}

/// The peers' cuts of `problem`, evaluated on its costs, and a sentence saying which layers the
/// layer-based ones cut. `layer_type` is the DeepSpeed `type:` method's regex.
pub(crate) fn evaluate_baselines(
    problem: &PartitionProblem,
    layer_type: &str,
) -> (Vec<BaselineResult>, String) {
    let detected = layers::detect_layers(&problem.node_scopes());
    let results = Baseline::ALL
        .iter()
        .map(|&baseline| {
            let peer = baseline.peer(layer_type);
            match baseline.starts(problem, &detected.layers, layer_type) {
                Ok(starts) => {
                    let evaluation = problem.evaluate(&problem.contiguous_assignment(&starts));
                    BaselineResult {
                        baseline,
                        peer,
                        bottleneck_secs: Some(evaluation.bottleneck_secs),
                        fits: Some(evaluation.fits()),
                        starts: Some(starts),
                        error: None,
                    }
                }
                Err(error) => BaselineResult {
                    baseline,
                    peer,
                    starts: None,
                    bottleneck_secs: None,
                    fits: None,
                    error: Some(error),
                },
            }
        })
        .collect();
    (results, detected.description())
}

/// Why a peer's plan is missing when the model's costs took a quarter of the time limit.
pub const BASELINES_SKIPPED: &str =
    "not computed: the model's costs took a quarter of the time limit, which goes to pipecut's plan";

/// Every peer, not computed, for a solve whose costs took a quarter of the time limit.
fn skipped_baselines(layer_type: &str) -> (Vec<BaselineResult>, String) {
    let results = Baseline::ALL
        .iter()
        .map(|&baseline| BaselineResult {
            baseline,
            peer: baseline.peer(layer_type),
            starts: None,
            bottleneck_secs: None,
            fits: None,
            error: Some(BASELINES_SKIPPED.to_string()),
        })
        .collect();
    (
        results,
        "layers not detected (baselines skipped)".to_string(),
    )
}

/// Why nothing fits: the node that cannot fit even alone, or how many devices would be needed.
fn explain_infeasible(problem: &PartitionProblem, cluster: &Cluster) -> String {
    let k = problem.stage_count();
    let first = &problem.stages()[0];
    // A node alone on the most generous stage.
    let best_capacity = problem
        .stages()
        .iter()
        .map(|s| s.capacity_bytes)
        .max()
        .unwrap_or(0);
    let alone: Vec<(usize, u64)> = (0..problem.node_count())
        .map(|p| {
            let params: u64 = problem.node_params[p]
                .iter()
                .map(|&i| problem.params()[i as usize].footprint_bytes)
                .sum();
            (p, params + problem.activation_bytes(p))
        })
        .collect();
    if let Some(&(p, bytes)) = alone
        .iter()
        .max_by_key(|(p, b)| (*b, std::cmp::Reverse(*p)))
    {
        if bytes > best_capacity {
            return format!(
                "node '{}' alone needs {} but the largest stage may use {} ({} less headroom); no split can help: use a device with more memory{}",
                problem.node_names().name(p),
                pipecut_ir::onnx::inspect::human_bytes(bytes),
                pipecut_ir::onnx::inspect::human_bytes(best_capacity),
                pipecut_ir::onnx::inspect::human_bytes(first.memory_bytes),
                match problem.settings().mode {
                    pipecut_cost::Mode::Inference => " or a smaller micro-batch",
                    pipecut_cost::Mode::Training { .. } => ", a smaller micro-batch, or inference mode",
                },
            );
        }
    }
    let needed = devices_needed(problem, cluster);
    let total_params: u64 = problem.params().iter().map(|p| p.footprint_bytes).sum();
    let needed_text = match needed {
        Some(n) => format!(
            "about {n} devices of this kind ({}) would fit it",
            first.device_name
        ),
        None => "no number of such devices up to 4096 fits it".to_string(),
    };
    // Name what the parameter footprint holds in this mode: gradients and optimizer state
    // exist only in training.
    let what = match problem.settings().mode {
        pipecut_cost::Mode::Inference => "the weights alone need",
        pipecut_cost::Mode::Training { .. } => {
            "the parameters with their gradients and optimizer state alone need"
        }
    };
    format!(
        "{} on {} cannot hold it: {what} {} against {} per stage; {needed_text}",
        pipecut_ir::onnx::inspect::count_of(k, "stage"),
        first.device_name,
        pipecut_ir::onnx::inspect::human_bytes(total_params),
        pipecut_ir::onnx::inspect::human_bytes(first.capacity_bytes),
    )
}

/// The fewest stages on devices like the first stage's that fit memory, searched by doubling
/// then bisection over homogeneous clusters of that device.
fn devices_needed(problem: &PartitionProblem, cluster: &Cluster) -> Option<usize> {
    let device = cluster.device(problem.stages()[0].device).clone();
    let mut catalog = pipecut_cost::Catalog::builtin();
    let name = device.name.clone();
    if catalog.device(&name).is_err() {
        let text = serde_json::to_string(&device).ok()?;
        catalog.add_device_json(&text, "plan").ok()?;
    }
    let n = problem.node_count();
    let fits = |k: usize| -> bool {
        if k > n {
            return false;
        }
        let Ok(homogeneous) = Cluster::parse(&format!("1x{k}x{name}"), &catalog) else {
            return false;
        };
        let Ok(p) = PartitionProblem::new_like(problem, &homogeneous, k) else {
            return false;
        };
        dp::fits_memory(&p)
    };
    let mut high = problem.stage_count().max(1);
    while !fits(high) {
        high *= 2;
        if high > 4096 || high > n {
            return None;
        }
    }
    let mut low = high / 2;
    while high - low > 1 {
        let mid = (low + high) / 2;
        if fits(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pipecut_cost::Catalog;
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    /// llama_tiny (batch 2, seq 16) on an A100 and three L4s, in `stages` stages: a small
    /// problem the MILP and the ideal search both prove, for their unit tests.
    pub(crate) fn llama_mixed(stages: u32) -> PartitionProblem {
        let path = format!(
            "{}/../../fixtures/models/llama_tiny.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
            .run(&mut model.graph)
            .unwrap();
        let cluster = Cluster::from_device_list("A100-80GB,L4,L4,L4", &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..stages).map(DeviceId).collect();
        PartitionProblem::new(&model.graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    fn report(started: bool, proven: bool, timed_out: bool, error: Option<&str>) -> MilpReport {
        MilpReport {
            too_large: false,
            nodes: 10,
            coarsened: false,
            proven,
            stopped: timed_out.then_some(MilpStop::Deadline),
            improved: false,
            started,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn every_status_says_what_the_milp_did() {
        let status = |r: &MilpReport| milp_status(r, false, 0.05);
        // A solver error is not a time limit, even when the solver also ran out of time.
        let failed = report(true, false, true, Some("Singular matrix"));
        assert_eq!(
            status(&failed),
            SolveStatus::Heuristic {
                reason: HeuristicReason::SolverError
            }
        );
        // Coarsening used the whole budget: the MILP never began.
        let coarse_not_started = MilpReport {
            coarsened: true,
            ..report(false, false, true, None)
        };
        assert_eq!(
            status(&coarse_not_started),
            SolveStatus::Heuristic {
                reason: HeuristicReason::MilpNotStarted
            }
        );
        assert_eq!(
            status(&report(true, false, true, None)),
            SolveStatus::TimeLimit {
                gap: 0.05,
                stop: MilpStop::Deadline
            }
        );
        assert_eq!(
            status(&report(true, true, false, None)),
            SolveStatus::Optimal
        );
        let coarse_proven = MilpReport {
            coarsened: true,
            ..report(true, true, false, None)
        };
        assert_eq!(
            status(&coarse_proven),
            SolveStatus::Heuristic {
                reason: HeuristicReason::Coarsened
            }
        );
        // A proof without the MILP (a chain, or the plan meets the bound) stands.
        assert_eq!(milp_status(&failed, true, 0.0), SolveStatus::Optimal);
    }

    #[test]
    fn each_way_the_milp_stops_has_its_own_status_text() {
        // Issue 17, item 3: under load the MILP ended seconds early and said "time limit".
        let text = |stopped: Option<MilpStop>, error: Option<&str>| {
            let report = MilpReport {
                stopped,
                ..report(true, false, false, error)
            };
            milp_status(&report, false, 0.0123).describe(0.0123)
        };
        let cases = [
            (Some(MilpStop::Deadline), "the MILP stopped at the time limit, within 1.23% of optimal"),
            (Some(MilpStop::Share), "the MILP stopped at its share of the time limit (the rest kept for refining its plan), within 1.23% of optimal"),
            (Some(MilpStop::Paced), "the MILP stopped before the time limit: its last slice overran by more than was left (a loaded machine), within 1.23% of optimal"),
            (Some(MilpStop::RootUnfinished), "the MILP's root LP did not finish before the time limit (less the pacer's margin), within 1.23% of optimal"),
            (Some(MilpStop::NoRoomForWholeGraph), "the time limit left no room for the MILP on the whole graph after the coarsened one, within 1.23% of optimal"),
            (Some(MilpStop::NotAnswered), "the MILP had not answered by the time limit (its search aimed 2% before it); the plan before it stands, within 1.23% of optimal"),
            (None, "not proven optimal (the MILP stopped without a proof); within 1.23% of the lower bound"),
        ];
        for (stopped, expected) in cases {
            assert_eq!(text(stopped, None), expected, "{stopped:?}");
        }
        // A solver error says so, whatever else stopped the search.
        assert_eq!(
            text(Some(MilpStop::Deadline), Some("Singular matrix")),
            "not proven optimal (the MILP solver failed; the DP's plan stands); within 1.23% of the lower bound"
        );
        let not_started = MilpReport {
            started: false,
            ..report(false, false, true, None)
        };
        assert_eq!(
            milp_status(&not_started, false, 0.0123).describe(0.0123),
            "not proven optimal (the time limit left no room to start the MILP after the DP); within 1.23% of the lower bound"
        );
    }

    #[test]
    fn a_time_limit_status_from_before_its_stop_reads_as_the_limit() {
        let old: SolveStatus = serde_json::from_str(r#"{"kind":"time_limit","gap":0.01}"#).unwrap();
        let stop = MilpStop::Deadline;
        assert_eq!(old, SolveStatus::TimeLimit { gap: 0.01, stop });
        let paced = SolveStatus::TimeLimit {
            gap: 0.01,
            stop: MilpStop::Paced,
        };
        let json = serde_json::to_string(&paced).unwrap();
        assert_eq!(json, r#"{"kind":"time_limit","gap":0.01,"stop":"paced"}"#);
    }

    #[test]
    fn a_plan_from_before_the_reason_reads_as_unrecorded() {
        let old: SolveStatus = serde_json::from_str(r#"{"kind":"heuristic"}"#).unwrap();
        assert_eq!(
            old,
            SolveStatus::Heuristic {
                reason: HeuristicReason::Unrecorded
            }
        );
    }
}
