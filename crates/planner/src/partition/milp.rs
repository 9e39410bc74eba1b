//! The exact solver over all convex, ordered partitions: a mixed-integer linear program, modelled
//! with `good_lp` and solved by branch and bound, under a wall-clock deadline.
//!
//! The DP (dp.rs) is exact only among partitions that are contiguous in one topological order;
//! on a DAG with parallel branches a better convex partition may interleave the order. The MILP
//! searches them all, starts from the DP's plan (so it is never worse), and proves optimality
//! when it finishes before the deadline; otherwise it keeps the best plan found and a proven
//! lower bound, from which the caller reports the gap.
//!
//! # Formulation (positions `v`, stages `s = 0..K`, boundaries `b = 0..K−1`)
//! - `y[v][b] ∈ {0,1}`: node `v` is on a stage `≤ b`. Monotone: `y[v][b] ≤ y[v][b+1]`; the
//!   stage of `v` is `Σ_b (1 − y[v][b])`, and `x[v][s] = y[v][s] − y[v][s−1]` (with
//!   `y[v][−1] = 0`, `y[v][K−1] = 1`) says "`v` is on stage `s`".
//! - Convex and ordered: for every edge `u → v`, `y[v][b] ≤ y[u][b]` (if `v` is on a stage
//!   `≤ b`, so is `u`). Every stage is used: `Σ_v x[v][s] ≥ 1`.
//! - Cut tensors: `z[f][b] ∈ [0,1]` with `z[f][b] ≥ y[p][b] − y[c][b]` for the producer `p` and
//!   every consumer `c` of flow `f`: the flow crosses boundary `b` iff its producer is before it
//!   and some reader after it, which under relaying (problem.rs) is exactly when stage `b+1`
//!   receives it. `z` needs no integrality: it only appears with non-negative coefficients on
//!   the small side of `≤` constraints and in the minimised byte objective, so some optimum has
//!   it at its lower bound, which is 0 or 1 once `y` is integral.
//! - Parameters held: `h[w][s] ∈ [0,1]`, `h[w][s] ≥ x[u][s]` for every reader `u` of weight `w`
//!   (a weight shared by several nodes of a stage is counted once).
//! - Time: `Σ_v t_s(v)·x[v][s] + Σ_f (λ_s + bytes_f/β_s)·z[f][s−1]
//!   (+ in training Σ_f (λ_{s+1} + bytes_f/β_{s+1})·z[f][s]) ≤ T` for every stage, exactly
//!   [`PartitionProblem::evaluate`]'s model (λ latency, β bandwidth of the link into a stage).
//! - Memory: `Σ_w footprint_w·h[w][s] + m_s·(Σ_v a(v)·x[v][s] + Σ_f bytes_f·z[f][s−1]) ≤ M_s`,
//!   with `m_s` the micro-batches the schedule keeps in flight on stage `s`.
//! - Objective: minimise `T`, bounded below by [`PartitionProblem::lower_bound_secs`] and above
//!   by the incumbent's bottleneck. Then, with every stage time held at the optimum found, a
//!   second solve minimises the bytes crossing boundaries (`Σ bytes_f·z[f][b]`), the tie-break.
//!
//! Stage windows (`stage_windows`) fix `y` outside the stages a node can take in any plan no
//! slower than the incumbent, and with it every `z` and `h` whose terms are all fixed.
//!
//! Times are scaled by the incumbent's bottleneck and memory rows by the stage's capacity, so
//! every coefficient the solver sees is of order 1 (raw seconds are ~10⁻⁶, bytes ~10¹⁰).
//!
//! Every answer is decoded into a stage per node, checked with
//! [`PartitionProblem::check_assignment`] and re-evaluated with [`PartitionProblem::evaluate`];
//! the solver's own objective is never reported.
//!
//! # Backend
//! `good_lp` with `microlp` (pure Rust branch and bound over a dual simplex). Measured on the
//! project's 2-core machine from clean target directories, debug profile: `good_lp` + `microlp`
//! build in 11 s wall (12 CPU-seconds; 30 s while other builds ran). `good_lp` + `highs` compiles
//! HiGHS from C++ through cmake: 698 CPU-seconds (about 6 minutes of both cores, 40 minutes at low
//! priority beside other builds), and then needs libclang for its bindings, so every machine would
//! need cmake, a C++ compiler and libclang installed. `coin_cbc` needs the system Cbc library.
//! HiGHS is much faster on hard instances, but the MILP only sees problems of a few hundred free
//! binaries (coarsen.rs), CI has 2 cores, and a build without system packages works anywhere.
//! microlp honours a wall-clock limit (checked at every branch-and-bound node and every 1,000
//! simplex pivots, so the search runs in measured time slices), accepts the DP's plan as a warm start, reports its best
//! bound, and can resume a stopped search; the `microlp` crate is named directly only for that.
//!
//! # Complexity
//! `n·(K−1)` binaries, `(F + P)·K` continuous variables (`F` flows, `P` weights) and
//! `O(n·K + Σ readers·K)` rows; branch and bound is exponential in the worst case, hence the
//! deadline and coarsening.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use good_lp::solvers::microlp::microlp;
use good_lp::{
    variable, Constraint, Expression, ProblemVariables, SolverModel, Variable, WithInitialSolution,
    WithTimeLimit,
};

use super::dp::{better, RELATIVE_TOLERANCE};
use super::problem::{PartitionProblem, StageId};
use pipecut_cost::Mode;

/// What one MILP run found on one problem.
#[derive(Debug, Clone)]
pub struct MilpRun {
    /// Stage of every position: the best plan found, never worse than the incumbent.
    pub stage_of: Vec<StageId>,
    /// Whether the bottleneck is proven optimal over all convex partitions of this problem.
    pub proven: bool,
    /// A bottleneck no convex partition of this problem can beat, when the solver proved one
    /// (the lower bound of branch and bound at the deadline, or the optimum).
    pub bound_secs: Option<f64>,
    /// What stopped the search before it finished, when something did (not an error).
    pub stopped: Option<MilpStop>,
    /// The solver's error, when it failed rather than finished or ran out of time (microlp's
    /// "Singular matrix", for one): the best plan found before it stands, nothing is proven.
    pub error: Option<String>,
}

/// What stopped a MILP before it finished its search, each a different use of the clock: the
/// status and the CLI say which, so that a search that ended with seconds left is never
/// reported as stopped at the time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MilpStop {
    /// It searched until the time limit.
    Deadline,
    /// A coarsened search ran until its share of the limit: the rest was kept back for the
    /// refinement DP on the whole graph.
    Share,
    /// It stopped before its deadline: the solver looks at its clock only between
    /// branch-and-bound nodes, and its last slice overran by so much (a loaded machine) that
    /// the next would have carried it past the limit ([`Pacer`]).
    Paced,
    /// The root LP did not finish within its slice (an unfinished root leaves nothing to
    /// resume): the search never branched. Its slice is all the time left, so this is rare:
    /// the root stopped at the pacer's margin before the deadline.
    RootUnfinished,
    /// The time left after the coarsened search left no room to search the whole graph.
    NoRoomForWholeGraph,
    /// The planner stopped waiting for it at the time limit, its search having aimed 2% of the
    /// limit before it (a root LP looks at no clock): its plan, if any, was not used.
    NotAnswered,
}

impl MilpStop {
    /// What happened, in words, for the status line.
    pub fn describe(self) -> &'static str {
        match self {
            MilpStop::Deadline => "the MILP stopped at the time limit",
            MilpStop::Share => {
                "the MILP stopped at its share of the time limit (the rest kept for refining its plan)"
            }
            MilpStop::Paced => {
                "the MILP stopped before the time limit: its last slice overran by more than was left (a loaded machine)"
            }
            MilpStop::RootUnfinished => {
                "the MILP's root LP did not finish before the time limit (less the pacer's margin)"
            }
            MilpStop::NoRoomForWholeGraph => {
                "the time limit left no room for the MILP on the whole graph after the coarsened one"
            }
            MilpStop::NotAnswered => {
                "the MILP had not answered by the time limit (its search aimed 2% before it); the plan before it stands"
            }
        }
    }
}

/// `y[v][b]`: a binary variable, or a value fixed before solving (see [`stage_windows`]).
#[derive(Clone, Copy)]
enum Before {
    Fixed(bool),
    /// The variable and its index in the model (the solver's column).
    Free(Variable, usize),
}

impl Before {
    fn expr(self) -> Expression {
        match self {
            Before::Fixed(value) => Expression::from(f64::from(u8::from(value))),
            Before::Free(y, _) => Expression::from(y),
        }
    }
    fn is_fixed(self) -> bool {
        matches!(self, Before::Fixed(_))
    }
}

/// Variables of one model.
struct Model {
    vars: ProblemVariables,
    /// `y[v][b]`, `b < K − 1`.
    before: Vec<Vec<Before>>,
    /// `z[f][b]` (fixed where the windows decide it).
    crossing: Vec<Vec<Before>>,
    /// `h[w][s]` (None for a weight with one reader, whose `x` is used directly).
    held: Vec<Vec<Option<Before>>>,
    /// The scaled bottleneck `T`.
    bottleneck: Variable,
    constraints: Vec<Constraint>,
}

/// What the model minimises.
#[derive(Clone, Copy)]
enum Objective {
    /// The bottleneck `T` (scaled).
    Bottleneck,
    /// Bytes crossing boundaries, with every stage time at most this scaled bound.
    CutBytes { scaled_bound: f64 },
    /// The largest stage memory as a fraction of its capacity (the `T` column holds it, at most
    /// `upper`); no time rows. Exact feasibility: the optimum is ≤ 1 iff some plan fits.
    MemoryScale { upper: f64 },
}

/// `x[v][s]` as an expression of `y`.
fn on_stage(before: &[Before], stage: usize, stages: usize) -> Expression {
    let mut x = if stage + 1 < stages {
        before[stage].expr()
    } else {
        Expression::from(1.0)
    };
    if stage > 0 {
        x -= before[stage - 1].expr();
    }
    x
}

/// `x[v][s]` when the windows decide it.
fn on_stage_fixed(before: &[Before], stage: usize) -> Option<bool> {
    let at_or_before = match before.get(stage) {
        Some(Before::Fixed(value)) => *value,
        Some(Before::Free(..)) => return None,
        None => true,
    };
    let before_stage = match stage.checked_sub(1).map(|b| before[b]) {
        Some(Before::Fixed(value)) => value,
        Some(Before::Free(..)) => return None,
        None => false,
    };
    Some(at_or_before && !before_stage)
}

/// For every position, the stages it can take in a plan whose every stage computes for at most
/// `bound_secs`: node `v` and all its ancestors need `⌈time / bound⌉` stages before and
/// including `v`'s, and `v` with all its descendants as many from `v`'s on (times on the fastest
/// device kind, so the windows hold on any device order). Returns `(earliest, latest)` stages.
/// The times are those of `reach.rs`: exact, or on models too large for that, lower bounds
/// (wider windows, never excluding a plan within the bound).
///
/// # Complexity
/// O(n) memory; O(min(n·E/64, [`super::reach::EXACT_WORK_LIMIT`]) + n·K) time.
fn stage_windows(problem: &PartitionProblem, bound_secs: f64) -> Vec<(usize, usize)> {
    let n = problem.node_count();
    let k = problem.stage_count();
    let fastest: Vec<f64> = (0..n)
        .map(|v| {
            (0..k)
                .map(|s| problem.node_secs(s, v))
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let ancestors = super::reach::closure_sums(problem, &fastest, true);
    let descendants = super::reach::closure_sums(problem, &fastest, false);
    let stages_for = |secs: f64| -> usize {
        if bound_secs <= 0.0 {
            return 1;
        }
        // Slack for rounding: a window must never exclude a plan within the bound.
        ((secs / (bound_secs * (1.0 + 1e-9))).ceil() as usize).max(1)
    };
    (0..n)
        .map(|v| {
            let earliest = (stages_for(ancestors[v]) - 1).min(k - 1);
            let latest = k.saturating_sub(stages_for(descendants[v])).max(earliest);
            (earliest, latest)
        })
        .collect()
}

/// Whether `y` is binary (the MILP) or only in `[0, 1]` (its LP relaxation, a lower bound).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Integrality {
    Binary,
    Relaxed,
}

/// The MILP (or its relaxation) of `problem` for `objective`, stage times scaled by
/// `time_scale`, the bottleneck column at least `lower`, each position's stage within its
/// window. Variables are added, and rows pushed, in a fixed order: the solver's path depends
/// on it.
fn build(
    problem: &PartitionProblem,
    time_scale: f64,
    lower: f64,
    objective: Objective,
    windows: &[(usize, usize)],
    integrality: Integrality,
) -> Model {
    let mut vars = ProblemVariables::new();
    let before = before_variables(&mut vars, windows, problem.stage_count() - 1, integrality);
    let crossing = crossing_variables(&mut vars, problem, &before);
    let held = held_variables(&mut vars, problem, &before);
    let upper = match objective {
        Objective::Bottleneck => 1.0 + 4.0 * RELATIVE_TOLERANCE,
        Objective::CutBytes { scaled_bound } => scaled_bound,
        Objective::MemoryScale { upper } => upper,
    };
    let bottleneck = vars.add(variable().min(lower.min(upper)).max(upper));
    let mut model = Model {
        vars,
        before,
        crossing,
        held,
        bottleneck,
        constraints: Vec::new(),
    };
    model.add_order_rows(problem);
    model.add_flow_rows(problem);
    model.add_cover_rows(problem);
    let memory_only = matches!(objective, Objective::MemoryScale { .. });
    for s in 0..problem.stage_count() {
        if !memory_only {
            let time = model.stage_time(problem, s, time_scale);
            model.constraints.push(time.leq(model.bottleneck));
        }
        for memory in model.stage_memory(problem, s) {
            model.constraints.push(if memory_only {
                memory.leq(model.bottleneck)
            } else {
                memory.leq(1.0)
            });
        }
    }
    model
}

/// `y[v][b]` for every position and boundary: fixed outside the position's window, else a
/// variable (binary, or in `[0, 1]` for the relaxation).
fn before_variables(
    vars: &mut ProblemVariables,
    windows: &[(usize, usize)],
    boundaries: usize,
    integrality: Integrality,
) -> Vec<Vec<Before>> {
    windows
        .iter()
        .map(|&(earliest, latest)| {
            (0..boundaries)
                .map(|b| {
                    if b < earliest {
                        Before::Fixed(false)
                    } else if b >= latest {
                        Before::Fixed(true)
                    } else {
                        let index = vars.len();
                        let y = match integrality {
                            Integrality::Binary => variable().binary(),
                            Integrality::Relaxed => variable().min(0.0).max(1.0),
                        };
                        Before::Free(vars.add(y), index)
                    }
                })
                .collect()
        })
        .collect()
}

/// `z[f][b]`: whether flow `f` crosses boundary `b`. Where the windows fix every term of
/// `z ≥ y[p] − y[c]`, `z` is a constant: most flows of a long model cross only boundaries near
/// their nodes, so this keeps the LP small.
fn crossing_variables(
    vars: &mut ProblemVariables,
    problem: &PartitionProblem,
    before: &[Vec<Before>],
) -> Vec<Vec<Before>> {
    let boundaries = problem.stage_count() - 1;
    problem
        .flows()
        .iter()
        .map(|flow| {
            let producer = &before[flow.producer as usize];
            (0..boundaries)
                .map(|b| {
                    let consumers = flow.consumers.iter().map(|&c| before[c as usize][b]);
                    match producer[b] {
                        Before::Fixed(false) => Before::Fixed(false),
                        Before::Fixed(true)
                            if consumers.clone().any(|c| matches!(c, Before::Fixed(false))) =>
                        {
                            Before::Fixed(true)
                        }
                        _ if consumers.clone().all(|c| matches!(c, Before::Fixed(true))) => {
                            Before::Fixed(false)
                        }
                        _ => {
                            let index = vars.len();
                            Before::Free(vars.add(variable().min(0.0).max(1.0)), index)
                        }
                    }
                })
                .collect()
        })
        .collect()
}

/// `h[w][s]`: whether stage `s` holds weight `w` (None for a weight with one reader, whose
/// `x` is used directly), fixed where the windows decide its readers.
fn held_variables(
    vars: &mut ProblemVariables,
    problem: &PartitionProblem,
    before: &[Vec<Before>],
) -> Vec<Vec<Option<Before>>> {
    let k = problem.stage_count();
    problem
        .params()
        .iter()
        .map(|param| {
            (0..k)
                .map(|s| {
                    if param.uses.len() == 1 {
                        return None;
                    }
                    let readers = param
                        .uses
                        .iter()
                        .map(|&u| on_stage_fixed(&before[u as usize], s));
                    Some(if readers.clone().any(|x| x == Some(true)) {
                        Before::Fixed(true)
                    } else if readers.clone().all(|x| x == Some(false)) {
                        Before::Fixed(false)
                    } else {
                        let index = vars.len();
                        Before::Free(vars.add(variable().min(0.0).max(1.0)), index)
                    })
                })
                .collect()
        })
        .collect()
}

impl Model {
    /// Monotone stage index, and the pinned cuts.
    fn add_order_rows(&mut self, problem: &PartitionProblem) {
        let boundaries = problem.stage_count() - 1;
        let (before, constraints) = (&self.before, &mut self.constraints);
        // Monotone stage index and convexity.
        for row in before {
            for b in 1..boundaries {
                if !(row[b - 1].is_fixed() && row[b].is_fixed()) {
                    constraints.push(row[b - 1].expr().leq(row[b].expr()));
                }
            }
        }
        // Pinned cuts: a reader at a stage ≤ b has its producer at a stage ≤ b − 1, so the
        // producer is not on the last stage and no reader on the first.
        for flow in problem.flows().iter().filter(|f| f.pinned) {
            let producer = &before[flow.producer as usize];
            if boundaries > 0 {
                constraints.push(Expression::from(1.0).leq(producer[boundaries - 1].expr()));
            }
            for &consumer in &flow.consumers {
                let consumer = &before[consumer as usize];
                for b in 0..boundaries {
                    let earlier = match b {
                        0 => Expression::from(0.0),
                        _ => producer[b - 1].expr(),
                    };
                    constraints.push(consumer[b].expr().leq(earlier));
                }
            }
        }
    }

    /// Every reader at or after its producer's stage (convexity), and `z` at least the flow's
    /// crossing of each boundary.
    fn add_flow_rows(&mut self, problem: &PartitionProblem) {
        let boundaries = problem.stage_count() - 1;
        let (before, crossing, constraints) = (&self.before, &self.crossing, &mut self.constraints);
        for (f, flow) in problem.flows().iter().enumerate() {
            let producer = &before[flow.producer as usize];
            for &consumer in &flow.consumers {
                let consumer = &before[consumer as usize];
                for b in 0..boundaries {
                    if producer[b].is_fixed() && consumer[b].is_fixed() {
                        // Consistent by construction: a consumer's window is never before its
                        // producer's, and a fixed crossing was fixed to 1 above.
                        continue;
                    }
                    constraints.push(consumer[b].expr().leq(producer[b].expr()));
                    if !crossing[f][b].is_fixed() {
                        // z ≥ y[p] − y[c]
                        constraints.push(
                            (producer[b].expr() - consumer[b].expr()).leq(crossing[f][b].expr()),
                        );
                    }
                }
            }
        }
    }

    /// Every stage holds a node, and every weight a reader on a stage reads.
    fn add_cover_rows(&mut self, problem: &PartitionProblem) {
        let k = problem.stage_count();
        let (before, held, constraints) = (&self.before, &self.held, &mut self.constraints);
        for s in 0..k {
            let mut count = Expression::from(0.0);
            for row in before {
                count += on_stage(row, s, k);
            }
            constraints.push(count.geq(1.0));
        }
        for (param, held_on) in problem.params().iter().zip(held) {
            for (s, h) in held_on.iter().enumerate() {
                if let Some(h @ Before::Free(..)) = *h {
                    for &u in &param.uses {
                        constraints.push(on_stage(&before[u as usize], s, k).leq(h.expr()));
                    }
                }
            }
        }
    }

    /// Stage `s`'s time, scaled: its nodes' compute, the flows it receives, and in training the
    /// gradients it receives back across the next boundary.
    fn stage_time(&self, problem: &PartitionProblem, s: usize, time_scale: f64) -> Expression {
        let k = problem.stage_count();
        let training = matches!(problem.settings().mode, Mode::Training { .. });
        // Cost of receiving flow `f` across boundary `b` on the link into stage `b + 1`.
        let receive = |b: usize, bytes: u64| -> f64 {
            match problem.stages()[b + 1].link_in {
                Some((bandwidth, latency)) => latency + bytes as f64 / bandwidth,
                None => 0.0,
            }
        };
        let mut time = Expression::from(0.0);
        for (v, row) in self.before.iter().enumerate() {
            let secs = problem.node_secs(s, v);
            if secs != 0.0 {
                time.add_mul(secs * time_scale, on_stage(row, s, k));
            }
        }
        for (f, flow) in problem.flows().iter().enumerate() {
            if s > 0 {
                time.add_mul(
                    receive(s - 1, flow.bytes) * time_scale,
                    self.crossing[f][s - 1].expr(),
                );
            }
            if training && s + 1 < k {
                time.add_mul(
                    receive(s, flow.bytes) * time_scale,
                    self.crossing[f][s].expr(),
                );
            }
        }
        time
    }

    /// Stage `s`'s memory in units of its capacity, one row per moment at which it holds the
    /// most ([`PartitionProblem::peak_bytes`]): the weights it holds, and the received tensors,
    /// activations and weight-gradient inputs of the micro-batches it holds then.
    fn stage_memory(&self, problem: &PartitionProblem, s: usize) -> Vec<Expression> {
        let k = problem.stage_count();
        let before = &self.before;
        let stage = &problem.stages()[s];
        let capacity = stage.capacity_bytes.max(1) as f64;
        let mut params = Expression::from(0.0);
        for (w, param) in problem.params().iter().enumerate() {
            let footprint = param.footprint_bytes as f64 / capacity;
            match self.held[w][s] {
                Some(h) => params.add_mul(footprint, h.expr()),
                None => params.add_mul(footprint, on_stage(&before[param.uses[0] as usize], s, k)),
            }
        }
        stage
            .held
            .iter()
            .map(|held| {
                let mut memory = params.clone();
                for (v, row) in before.iter().enumerate() {
                    let bytes = held.bytes(
                        0,
                        problem.activation_bytes(v),
                        problem.weight_input_bytes(v),
                    );
                    if bytes != 0 {
                        memory.add_mul(bytes as f64 / capacity, on_stage(row, s, k));
                    }
                }
                if s > 0 {
                    for (f, flow) in problem.flows().iter().enumerate() {
                        memory.add_mul(
                            held.received as f64 * flow.bytes as f64 / capacity,
                            self.crossing[f][s - 1].expr(),
                        );
                    }
                }
                memory
            })
            .collect()
    }
}

/// The solver's variable values for a known assignment (the warm start).
fn hint(
    problem: &PartitionProblem,
    model: &Model,
    stage_of: &[StageId],
    scaled_bottleneck: f64,
) -> Vec<(Variable, f64)> {
    let k = problem.stage_count();
    let mut values = Vec::new();
    for (v, row) in model.before.iter().enumerate() {
        for (b, y) in row.iter().enumerate() {
            if let Before::Free(y, _) = y {
                values.push((*y, f64::from(u8::from(stage_of[v].index() <= b))));
            }
        }
    }
    for (f, flow) in problem.flows().iter().enumerate() {
        let from = stage_of[flow.producer as usize].index();
        let last = flow
            .consumers
            .iter()
            .map(|&c| stage_of[c as usize].index())
            .max()
            .unwrap_or(from);
        for (b, z) in model.crossing[f].iter().enumerate() {
            if let Before::Free(z, _) = z {
                values.push((*z, f64::from(u8::from(from <= b && b < last))));
            }
        }
    }
    for (w, param) in problem.params().iter().enumerate() {
        for s in 0..k {
            if let Some(Before::Free(h, _)) = model.held[w][s] {
                let used = param
                    .uses
                    .iter()
                    .any(|&u| stage_of[u as usize].index() == s);
                values.push((h, f64::from(u8::from(used))));
            }
        }
    }
    values.push((model.bottleneck, scaled_bottleneck));
    values
}

/// Stage of every position from the solver's `y` values.
fn decode(before: &[Vec<Before>], values: &[f64]) -> Vec<StageId> {
    before
        .iter()
        .map(|row| {
            let later = row
                .iter()
                .filter(|y| match **y {
                    Before::Fixed(v) => !v,
                    Before::Free(_, index) => values[index] < 0.5,
                })
                .count();
            StageId(later as u32)
        })
        .collect()
}

/// Outcome of one solver call.
struct Solved {
    stage_of: Option<Vec<StageId>>,
    proven: bool,
    bound: Option<f64>,
    stopped: Option<MilpStop>,
    error: Option<String>,
}

/// Hands out the solver's time in slices so that the deadline holds even though the solver
/// checks its clock only every thousand simplex pivots and at branch-and-bound nodes: each
/// slice's overshoot is measured, and the next slice ends early by 1.5 times the estimate.
/// Slices start at 50 ms and double, so a search that needs little time pays little for this.
struct Pacer {
    deadline: Instant,
    slice: Duration,
    overshoot: Duration,
    at_root: bool,
    /// Ends the search at its next slice when set ([`stoppable`]).
    stop: Option<Arc<AtomicBool>>,
}

thread_local! {
    /// The flag that ends this thread's MILP runs at their next slice: set only while
    /// [`solve_model_stoppable`] or [`solve_stoppable`] runs, on a MILP thread of the planner's
    /// or of `check`'s.
    static STOP: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// The longest slice of a run that may be stopped, so that a stop takes effect within about it.
const STOPPABLE_SLICE: Duration = Duration::from_millis(200);

/// The longest root LP of a run that may be stopped: the root looks at no flag, and the planner
/// does not wait for a stopped run, whose thread would otherwise run on for the whole root.
/// Roots that need more (bert_tiny at K = 8 on mixed devices needs more than 9 s) end the run
/// unproven, and the ideal search beside it goes on.
const STOPPABLE_ROOT: Duration = Duration::from_secs(1);

/// What the pacer keeps back before any overshoot is measured (1.5 times its first estimate):
/// a search that ends with no more than this left ended at its deadline.
const UNLOADED_MARGIN: Duration = Duration::from_millis(30);

impl Pacer {
    fn new(deadline: Instant) -> Pacer {
        Pacer {
            deadline,
            slice: Duration::from_millis(50),
            // Until a node slice is measured: a few node re-solves on a loaded debug build.
            // 1.5 times this is `UNLOADED_MARGIN`.
            overshoot: Duration::from_millis(20),
            at_root: true,
            stop: STOP.with(|stop| stop.borrow().clone()),
        }
    }

    /// The next slice, or why there is none: the deadline has come ([`MilpStop::Deadline`]),
    /// or what is left would be spent overshooting ([`MilpStop::Paced`]).
    fn next_slice(&mut self) -> Result<Duration, MilpStop> {
        let margin = self.overshoot.mul_f64(1.5);
        let left = self
            .deadline
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        if left < Duration::from_millis(1) {
            return Err(self.stop_reason());
        }
        if let Some(stop) = &self.stop {
            if stop.load(Ordering::Relaxed) {
                return Err(MilpStop::Deadline);
            }
            self.slice = self.slice.min(STOPPABLE_SLICE);
        }
        let slice = if self.at_root {
            // The root LP must finish inside the first slice for the search to go on (an
            // interrupted root leaves no state to resume), so it gets all that is left: with
            // half, a root that needed 60% of the time ended the search at 50%, seconds early
            // under load (issue 17), and the planner's wait bounds a root that overruns. A run
            // that may be stopped gets [`STOPPABLE_ROOT`] at most.
            match self.stop {
                Some(_) => left.min(STOPPABLE_ROOT),
                None => left,
            }
        } else {
            let slice = self.slice.min(left);
            self.slice = self.slice.saturating_mul(2);
            slice
        };
        Ok(slice)
    }

    /// Why the search ends now without a slice: at its deadline, or before it by more than
    /// an unloaded machine's margin ([`Pacer::new`]'s first estimate), which only a measured
    /// overshoot makes the pacer keep back.
    fn stop_reason(&self) -> MilpStop {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match left > UNLOADED_MARGIN {
            true => MilpStop::Paced,
            false => MilpStop::Deadline,
        }
    }

    /// Why the root LP ended at its slice without a solution: the slice reached the deadline
    /// (a time limit), or the pacer's margin before it.
    fn root_stop_reason(&self) -> MilpStop {
        match self.deadline.saturating_duration_since(Instant::now()) > UNLOADED_MARGIN {
            true => MilpStop::RootUnfinished,
            false => MilpStop::Deadline,
        }
    }

    fn observe(&mut self, asked: Duration, took: Duration) {
        if std::mem::take(&mut self.at_root) {
            // The first slice holds the root LP, one long stretch without a clock check that
            // does not come again: branch-and-bound nodes after it are short re-solves.
            return;
        }
        // The estimate follows the latest slice, but forgets a large one only by halves.
        self.overshoot = took.saturating_sub(asked).max(self.overshoot / 2);
    }
}

/// Called after each time slice of a run with the best plan so far (when the solver has one)
/// and the solver's bound on its objective (scaled as the model is).
type OnSlice<'a> = &'a dyn Fn(Option<&[StageId]>, Option<f64>);

fn run_model(
    model: Model,
    objective: Expression,
    hint: Vec<(Variable, f64)>,
    deadline: Instant,
    on_slice: OnSlice,
) -> Solved {
    let Model {
        vars,
        before,
        constraints,
        ..
    } = model;
    let not_run = |stopped: MilpStop| Solved {
        stage_of: None,
        proven: false,
        bound: None,
        stopped: Some(stopped),
        error: None,
    };
    let loaded = vars
        .minimise(objective)
        .using(microlp)
        .with_all(constraints)
        .with_initial_solution(hint);
    // The slices count from here: loading the model took part of the budget already.
    let mut pacer = Pacer::new(deadline);
    let first = match pacer.next_slice() {
        Ok(first) => first,
        Err(stop) => return not_run(stop),
    };
    let started = Instant::now();
    let solved = loaded.with_time_limit(first.as_secs_f64()).solve();
    pacer.observe(first, started.elapsed());
    // An error means the solver accepted no assignment before its limit (the warm start makes
    // that rare) or failed numerically: the incumbent stands, nothing is proven. Only the first
    // is a time limit; a numerical failure is reported as what it is.
    let solution = match solved {
        Ok(solution) => solution,
        Err(good_lp::ResolutionError::Other(message)) if message.starts_with("Time limit") => {
            return not_run(pacer.root_stop_reason())
        }
        Err(error) => {
            return Solved {
                stopped: None,
                error: Some(error.to_string()),
                ..not_run(MilpStop::Deadline)
            }
        }
    };
    let mut outcome = microlp::SolveOutcome::Solution(solution.into_inner());
    let values = |outcome: &microlp::SolveOutcome| -> Option<Vec<f64>> {
        outcome
            .solution()
            // Raw values: rounding asserts integrality, and decode only compares with ½.
            .map(|s| s.iter().map(|(var, _)| s.var_value_raw(var)).collect())
    };
    let mut last_values = values(&outcome);
    let mut stopped = None;
    while !outcome.is_optimal() {
        let slice = match pacer.next_slice() {
            Ok(slice) => slice,
            Err(stop) => {
                stopped = Some(stop);
                break;
            }
        };
        let mut options = outcome.last_resume_options();
        options.time_limit = Some(slice);
        let started = Instant::now();
        match outcome.resume_with(options) {
            Ok(next) => outcome = next,
            Err(error) => {
                return Solved {
                    stage_of: last_values.map(|v| decode(&before, &v)),
                    proven: false,
                    bound: None,
                    stopped: None,
                    error: Some(error.to_string()),
                }
            }
        }
        pacer.observe(slice, started.elapsed());
        last_values = values(&outcome).or(last_values);
        let plan = last_values.as_ref().map(|v| decode(&before, v));
        on_slice(plan.as_deref(), outcome.stats().best_bound);
    }
    let proven = outcome.is_optimal();
    Solved {
        stage_of: last_values.map(|v| decode(&before, &v)),
        proven,
        bound: outcome.stats().best_bound,
        stopped: stopped.filter(|_| !proven),
        error: None,
    }
}

/// Solves `problem` over all its convex, ordered partitions, starting from `incumbent` (a valid
/// assignment that fits, e.g. the DP's), until `deadline`.
pub fn solve(problem: &PartitionProblem, incumbent: &[StageId], deadline: Instant) -> MilpRun {
    solve_reporting(problem, incumbent, deadline, &|_, _| {})
}

/// [`solve`], calling `progress(best bottleneck, proven bound)` (seconds) as the search goes.
pub(crate) fn solve_reporting(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    progress: &dyn Fn(f64, Option<f64>),
) -> MilpRun {
    let k = problem.stage_count();
    let incumbent_secs = problem.evaluate(incumbent).bottleneck_secs;
    // The granularity bound (bounds.rs) is a tighter floor for `T` than the average work.
    let lower_bound = super::bounds::lower_bound_secs(problem, deadline, None);
    if k == 1 || incumbent_secs <= 0.0 {
        // One stage has one partition; a zero bottleneck cannot be beaten.
        return MilpRun {
            stage_of: incumbent.to_vec(),
            proven: true,
            bound_secs: Some(incumbent_secs),
            stopped: None,
            error: None,
        };
    }
    let time_scale = 1.0 / incumbent_secs;
    let mut best = incumbent.to_vec();
    // Phase 1: the bottleneck, unless the incumbent already meets the lower bound.
    let at_bound = incumbent_secs <= lower_bound * (1.0 + RELATIVE_TOLERANCE);
    if !at_bound {
        match minimise_bottleneck(
            problem,
            incumbent,
            incumbent_secs,
            lower_bound,
            deadline,
            progress,
        ) {
            ControlFlow::Continue(optimal) => best = optimal,
            ControlFlow::Break(unproven) => return unproven,
        }
    }
    // Phase 2, the tie-break: fewest bytes among plans whose every stage is within the optimum.
    minimise_cut_bytes(problem, best, time_scale, deadline)
}

/// Phase 1 of [`solve_reporting`]: the MILP of the bottleneck, started from `incumbent`, whose
/// bottleneck (`incumbent_secs`) scales the model's times. Continues with the best plan when
/// its bottleneck is proven optimal; breaks with the run's outcome when it is not.
fn minimise_bottleneck(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    incumbent_secs: f64,
    lower_bound: f64,
    deadline: Instant,
    progress: &dyn Fn(f64, Option<f64>),
) -> ControlFlow<MilpRun, Vec<StageId>> {
    let time_scale = 1.0 / incumbent_secs;
    let mut best = incumbent.to_vec();
    if deadline.saturating_duration_since(Instant::now()).is_zero() {
        return ControlFlow::Break(MilpRun {
            stage_of: best,
            proven: false,
            bound_secs: None,
            stopped: Some(MilpStop::Deadline),
            error: None,
        });
    }
    let scaled_lower = lower_bound * time_scale * (1.0 - RELATIVE_TOLERANCE);
    let windows = stage_windows(problem, incumbent_secs * (1.0 + 4.0 * RELATIVE_TOLERANCE));
    let model = build(
        problem,
        time_scale,
        scaled_lower,
        Objective::Bottleneck,
        &windows,
        Integrality::Binary,
    );
    let start = hint(problem, &model, incumbent, 1.0);
    let objective = Expression::from(model.bottleneck);
    let best_secs = std::cell::Cell::new(incumbent_secs);
    let on_slice = |plan: Option<&[StageId]>, bound: Option<f64>| {
        if let Some(plan) = plan {
            let evaluation = problem.evaluate(plan);
            if evaluation.fits() && evaluation.bottleneck_secs < best_secs.get() {
                best_secs.set(evaluation.bottleneck_secs);
            }
        }
        let bound = bound
            .map(|scaled| scaled / time_scale)
            .filter(|b| b.is_finite())
            .map(|b| b.max(lower_bound).min(best_secs.get()));
        progress(best_secs.get(), bound);
    };
    let first = run_model(model, objective, start, deadline, &on_slice);
    if let Some(found) = &first.stage_of {
        if better(problem, found, &best) {
            best = found.clone();
        }
    }
    if !first.proven {
        let best_secs = problem.evaluate(&best).bottleneck_secs;
        return ControlFlow::Break(MilpRun {
            bound_secs: first
                .bound
                .map(|scaled| scaled / time_scale)
                .filter(|b| b.is_finite())
                .map(|b| b.min(best_secs)),
            stage_of: best,
            proven: false,
            stopped: first.stopped,
            error: first.error,
        });
    }
    ControlFlow::Continue(best)
}

/// Phase 2 of [`solve_reporting`]: from `best`, whose bottleneck is proven optimal, the MILP
/// of the fewest bytes crossing among plans whose every stage is within that optimum.
fn minimise_cut_bytes(
    problem: &PartitionProblem,
    mut best: Vec<StageId>,
    time_scale: f64,
    deadline: Instant,
) -> MilpRun {
    let optimum_secs = problem.evaluate(&best).bottleneck_secs;
    let total_bytes: f64 = problem.flows().iter().map(|f| f.bytes as f64).sum();
    let left = deadline.saturating_duration_since(Instant::now());
    let mut stopped = None;
    let mut tie_break_error = None;
    if total_bytes > 0.0 && !left.is_zero() {
        let scaled_bound = optimum_secs * time_scale * (1.0 + RELATIVE_TOLERANCE);
        let windows = stage_windows(problem, optimum_secs * (1.0 + RELATIVE_TOLERANCE));
        let model = build(
            problem,
            time_scale,
            0.0,
            Objective::CutBytes { scaled_bound },
            &windows,
            Integrality::Binary,
        );
        let start = hint(problem, &model, &best, optimum_secs * time_scale);
        let mut objective = Expression::from(0.0);
        for (f, flow) in problem.flows().iter().enumerate() {
            for z in &model.crossing[f] {
                objective.add_mul(flow.bytes as f64 / total_bytes, z.expr());
            }
        }
        let second = run_model(model, objective, start, deadline, &|_, _| {});
        stopped = second.stopped;
        // The bottleneck is proven already; a failed tie-break only leaves bytes unminimised.
        tie_break_error = second.error;
        if let Some(found) = &second.stage_of {
            if better(problem, found, &best) {
                best = found.clone();
            }
        }
    } else if total_bytes > 0.0 {
        stopped = Some(MilpStop::Deadline);
    }
    let best_secs = problem.evaluate(&best).bottleneck_secs;
    MilpRun {
        bound_secs: Some(best_secs.min(optimum_secs)),
        stage_of: best,
        proven: true,
        stopped,
        error: tie_break_error,
    }
}

/// The solver's feasibility tolerance, relative to the scaled bottleneck (about 1): the LP's
/// optimum is lowered by it so that rounding never lifts the bound above the true optimum.
const LP_TOLERANCE: f64 = 1e-6;

/// The **LP-relaxation bound**: the optimum of the MILP's bottleneck model with every `y` in
/// `[0, 1]` instead of binary, windowed as the MILP is by `incumbent_secs` (a plan faster than
/// the incumbent lies inside the windows, so the relaxation's optimum is at most its
/// bottleneck; otherwise the incumbent is optimal and the bound, capped at it, still holds).
/// Unlike the granularity bound (bounds.rs) it counts communication, memory and the device
/// kinds of each stage, but it lets a node be split between stages. `None` when the model is
/// too large to build ([`MAX_MODEL_CELLS`]), the solver fails, or `deadline` passes first.
///
/// # Complexity
/// One LP of the MILP's size: `O(n·K)` columns and rows before the windows fix most of them;
/// the simplex is polynomial in practice, and microlp checks its clock every 1,000 pivots.
pub(crate) fn lp_relaxation_bound_secs(
    problem: &PartitionProblem,
    incumbent_secs: f64,
    deadline: Instant,
) -> Option<f64> {
    let left = deadline.saturating_duration_since(Instant::now());
    if problem.stage_count() < 2
        || incumbent_secs <= 0.0
        || !small_enough_to_build(problem)
        || left.is_zero()
    {
        return None;
    }
    let time_scale = 1.0 / incumbent_secs;
    let windows = stage_windows(problem, incumbent_secs * (1.0 + 4.0 * RELATIVE_TOLERANCE));
    let model = build(
        problem,
        time_scale,
        0.0,
        Objective::Bottleneck,
        &windows,
        Integrality::Relaxed,
    );
    let Model {
        vars,
        bottleneck,
        constraints,
        ..
    } = model;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return None;
    }
    let solution = vars
        .minimise(bottleneck)
        .using(microlp)
        .with_all(constraints)
        .with_time_limit(left.as_secs_f64())
        .solve()
        .ok()?;
    let scaled = good_lp::Solution::value(&solution, bottleneck);
    let bound = scaled * (1.0 - LP_TOLERANCE) / time_scale;
    bound
        .is_finite()
        .then_some(bound.clamp(0.0, incumbent_secs))
}

/// The largest stage memory of `stage_of` as a fraction of that stage's capacity.
fn memory_scale(problem: &PartitionProblem, stage_of: &[StageId]) -> f64 {
    problem
        .evaluate(stage_of)
        .stages
        .iter()
        .map(|s| s.peak_memory_bytes as f64 / s.capacity_bytes.max(1) as f64)
        .fold(0.0, f64::max)
}

/// A topological order that puts every node as late as possible: built from the end, each step
/// takes, among the nodes whose readers are all placed, the one latest in the problem's order.
///
/// # Complexity
/// O((n + E) log n).
fn as_late_as_possible(problem: &PartitionProblem) -> Vec<u32> {
    let n = problem.node_count();
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut unplaced_readers = vec![0usize; n];
    for flow in problem.flows() {
        for &c in &flow.consumers {
            preds[c as usize].push(flow.producer);
            unplaced_readers[flow.producer as usize] += 1;
        }
    }
    let mut ready: std::collections::BinaryHeap<u32> = (0..n as u32)
        .filter(|&v| unplaced_readers[v as usize] == 0)
        .collect();
    let mut reversed = Vec::with_capacity(n);
    while let Some(v) = ready.pop() {
        reversed.push(v);
        for &p in &preds[v as usize] {
            unplaced_readers[p as usize] -= 1;
            if unplaced_readers[p as usize] == 0 {
                ready.push(p);
            }
        }
    }
    reversed.reverse();
    reversed
}

/// What [`fit_memory`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum MemoryFit {
    /// A convex, ordered plan whose every stage fits its device.
    Fits(Vec<StageId>),
    /// Proven: no convex, ordered partition fits. Every stage would fit with `scale` times its
    /// capacity (the smallest such factor, > 1).
    TooSmall {
        /// The smallest factor of every stage's capacity at which some plan fits.
        scale: f64,
    },
    /// Not decided: the deadline passed, the solver failed, or a work limit was given (the
    /// MILP runs by wall clock only, so under a work limit it is not started, which keeps the
    /// answer the same on every machine). `at_least` is a proven lower bound on the factor.
    Undecided {
        /// A factor no plan beats, when the solver proved one.
        at_least: Option<f64>,
        /// Why it stopped.
        reason: String,
    },
}

impl MemoryFit {
    /// Whether it proves that nothing fits: the exact answer, or an unfinished search whose
    /// proven factor already exceeds 1 (the root LP of a far-too-small cluster proves that).
    pub fn proves_nothing_fits(&self) -> bool {
        match self {
            MemoryFit::Fits(_) => false,
            MemoryFit::TooSmall { .. } => true,
            MemoryFit::Undecided { at_least, .. } => {
                at_least.is_some_and(|scale| scale > 1.0 + RELATIVE_TOLERANCE)
            }
        }
    }

    /// The same answer with a fitting plan mapped by `f` (expanded from a quotient, say).
    pub fn map_plan(self, f: impl FnOnce(Vec<StageId>) -> Vec<StageId>) -> MemoryFit {
        match self {
            MemoryFit::Fits(plan) => MemoryFit::Fits(f(plan)),
            other => other,
        }
    }
}

/// Exact feasibility over **all** convex, ordered partitions, for when the DP (contiguous cuts
/// of one order) finds no plan within memory: minimises the largest stage memory as a fraction
/// of its capacity (no time rows, no stage windows: no bottleneck is known), started from an
/// equal split of the order. The optimum is at most 1 iff a plan fits; above 1 it names the
/// smallest memory that would.
///
/// # Complexity
/// `n·(K−1)` binaries, none fixed; branch and bound until `deadline`.
pub fn fit_memory(
    problem: &PartitionProblem,
    deadline: Instant,
    work_limit: Option<u64>,
) -> MemoryFit {
    let n = problem.node_count();
    let k = problem.stage_count();
    // The DP along the order that runs every node as late as possible: a node whose output is
    // read only at the end (the transpose of a tied embedding before the head) then moves to
    // the end instead of sending its output through every stage.
    let along = super::coarsen::reordered(problem, &as_late_as_possible(problem));
    if let Some(solved) = super::dp::solve(&along.problem) {
        let plan = along.expand(&solved.stage_of);
        if problem.check_assignment(&plan).is_ok() && problem.evaluate(&plan).fits() {
            return MemoryFit::Fits(plan);
        }
    }
    if work_limit.is_some() {
        return MemoryFit::Undecided {
            at_least: None,
            reason: "the memory search runs by wall clock only and a work limit was set".into(),
        };
    }
    // Coarse first: a plan of super-nodes that fits is a plan of the model that fits, and the
    // coarse model has a third of the binaries; only a proof that nothing fits needs them all.
    // A model too large to build is coarsened as far as the MILP can take (a plan found there
    // still fits), and never searched whole.
    let target = (n / 3).min(MAX_MODEL_CELLS / k.saturating_sub(1).max(1));
    let coarse = super::coarsen::coarsen(problem, target.max(k));
    if coarse.problem.node_count() < n && small_enough_to_build(&coarse.problem) {
        let half = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
        if let MemoryFit::Fits(plan) = memory_milp(&coarse.problem, half) {
            let plan = coarse.expand(&plan);
            if problem.check_assignment(&plan).is_ok() && problem.evaluate(&plan).fits() {
                return MemoryFit::Fits(plan);
            }
        }
    }
    if !small_enough_to_build(problem) {
        return MemoryFit::Undecided {
            at_least: None,
            reason: format!(
                "the model is too large for the exact solver ({n} nodes × {} boundaries)",
                k - 1
            ),
        };
    }
    memory_milp(problem, deadline)
}

/// The memory-scale MILP of [`fit_memory`] on `problem`, from an equal split of its order.
fn memory_milp(problem: &PartitionProblem, deadline: Instant) -> MemoryFit {
    let n = problem.node_count();
    let k = problem.stage_count();
    let starts: Vec<usize> = (0..k).map(|s| s * n / k).collect();
    let start = problem.contiguous_assignment(&starts);
    let start_scale = memory_scale(problem, &start);
    if start_scale <= 1.0 && problem.evaluate(&start).fits() {
        return MemoryFit::Fits(start);
    }
    let windows = vec![(0, k - 1); n];
    // A little above the start's factor, so that the start is inside the model's bounds.
    let upper = start_scale * (1.0 + 1e-6);
    // Floored at 1: any plan that fits is then optimal, so the search ends at the first one.
    let model = build(
        problem,
        1.0,
        1.0,
        Objective::MemoryScale { upper },
        &windows,
        Integrality::Binary,
    );
    let hint_values = hint(problem, &model, &start, start_scale);
    let objective = Expression::from(model.bottleneck);
    // Plans the solver passes on the way: the first that fits ends the search.
    let found = std::cell::RefCell::new(None);
    let on_slice = |plan: Option<&[StageId]>, _bound: Option<f64>| {
        if let Some(plan) = plan {
            if found.borrow().is_none()
                && problem.check_assignment(plan).is_ok()
                && problem.evaluate(plan).fits()
            {
                *found.borrow_mut() = Some(plan.to_vec());
            }
        }
    };
    let solved = run_model(model, objective, hint_values, deadline, &on_slice);
    let plan = solved.stage_of.clone().or_else(|| found.borrow().clone());
    if let Some(plan) = plan.filter(|p| problem.check_assignment(p).is_ok()) {
        if problem.evaluate(&plan).fits() {
            return MemoryFit::Fits(plan);
        }
        if solved.proven {
            // The solver's optimum, re-evaluated; the model counts exactly what evaluate does.
            return MemoryFit::TooSmall {
                scale: memory_scale(problem, &plan),
            };
        }
    }
    MemoryFit::Undecided {
        at_least: solved.bound.filter(|b| b.is_finite()),
        reason: match solved.error {
            Some(error) => format!("the solver failed: {error}"),
            None => "the time limit passed first".into(),
        },
    }
}

/// Why [`fit_or_explain`] has no plan: each with the end of the message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NoFit {
    /// The exact solver proved that no convex partition fits.
    Proven(String),
    /// It did not decide before the deadline or the work limit (or it failed).
    Undecided(String),
}

/// [`fit_memory`] for the Planner: a plan that fits, or the end of the message saying what the
/// exact solver proved (the smallest memory that would fit) or that it did not decide.
pub(crate) fn fit_or_explain(
    problem: &PartitionProblem,
    deadline: Instant,
    work_limit: Option<u64>,
) -> Result<Vec<StageId>, NoFit> {
    let stage = &problem.stages()[0];
    let needs = |scale: f64| {
        pipecut_ir::onnx::inspect::human_bytes((stage.capacity_bytes as f64 * scale).ceil() as u64)
    };
    // Every weight is held by some stage: more of them than all stages may hold together is
    // a proof without a search (GPT-3-175B on two L4s kept the solver busy to the limit).
    let weights: u64 = problem.params().iter().map(|p| p.footprint_bytes).sum();
    let capacity: u64 = problem.stages().iter().map(|s| s.capacity_bytes).sum();
    if weights > capacity {
        return Err(NoFit::Proven(format!(
            "; no convex partition fits either: the weights need {} against {} on all {} stages together",
            pipecut_ir::onnx::inspect::human_bytes(weights),
            pipecut_ir::onnx::inspect::human_bytes(capacity),
            problem.stage_count()
        )));
    }
    match fit_memory(problem, deadline, work_limit) {
        MemoryFit::Fits(plan) => Ok(plan),
        MemoryFit::TooSmall { scale } => Err(NoFit::Proven(format!(
            "; no convex partition fits either (proven by the exact solver): the smallest memory that fits is {:.6}× each stage's usable memory, {} on stage 0 ({}) against {}",
            scale,
            needs(scale),
            stage.device_name,
            pipecut_ir::onnx::inspect::human_bytes(stage.capacity_bytes),
        ))),
        MemoryFit::Undecided {
            at_least: Some(scale),
            ..
        } if scale > 1.0 + RELATIVE_TOLERANCE => Err(NoFit::Proven(format!(
            "; no convex partition fits either (proven by the exact solver's bound, its search unfinished): any plan needs at least {scale:.6}× each stage's usable memory, {} on stage 0 ({}) against {}",
            needs(scale),
            stage.device_name,
            pipecut_ir::onnx::inspect::human_bytes(stage.capacity_bytes),
        ))),
        MemoryFit::Undecided { at_least, reason } => Err(NoFit::Undecided(format!(
            "no contiguous cut of the order fits {} stages, and the exact solver did not decide whether another convex partition does ({reason}){}; {}",
            problem.stage_count(),
            at_least
                .map(|scale| format!(
                    "; its bound so far, {:.6}× each stage's usable memory, does not rule a plan out",
                    scale
                ))
                .unwrap_or_default(),
            match work_limit {
                Some(_) => "without --work-budget it decides by the clock",
                None => "a longer --time-limit may decide it",
            }
        ))),
    }
}

/// The MILP is given at most this many free binaries (those the stage windows leave open, at
/// most `nodes · (stages − 1)`); larger problems are coarsened first. Chosen from the fixtures' solve times with microlp (docs/algorithms.md):
/// around this size the root LP and a few hundred branch-and-bound nodes fit in a few seconds
/// of a 2-core machine, while a tenfold larger model rarely gets past its root.
pub const MAX_BINARIES: usize = 300;

/// The MILP is built only for problems of at most this many `node × boundary` cells: building
/// it allocates expressions for every cell whatever the stage windows fix (`build`), so its
/// memory and time grow as `n·K` before the first LP. Measured on a 100k-node transformer at
/// K = 64 (6.3M cells): 7 GB and about a minute of model building on the 2-core VM, against a
/// 1 s limit. 2²⁰ cells keep GPT-3-175B's shape at K = 64 (250k cells) and every fixture and
/// real model of the instance set whole; a 20k-node model at K = 64 is only solved coarsened.
pub const MAX_MODEL_CELLS: usize = 1 << 20;

/// Whether [`build`] may be run on `problem` (see [`MAX_MODEL_CELLS`]).
fn small_enough_to_build(problem: &PartitionProblem) -> bool {
    problem
        .node_count()
        .saturating_mul(problem.stage_count().saturating_sub(1))
        <= MAX_MODEL_CELLS
}

/// Binaries left free by the stage windows of plans no slower than `bound_secs`.
fn free_binaries(problem: &PartitionProblem, bound_secs: f64) -> usize {
    stage_windows(problem, bound_secs * (1.0 + 4.0 * RELATIVE_TOLERANCE))
        .iter()
        .map(|&(earliest, latest)| latest - earliest)
        .sum()
}

/// What the MILP stage of a plan did, for the status and the plan's notes.
#[derive(Debug, Clone, PartialEq)]
pub struct MilpReport {
    /// Nodes of the graph it solved: the model's, or the coarsened graph's super-nodes.
    pub nodes: usize,
    /// Whether it solved a coarsened graph.
    pub coarsened: bool,
    /// Whether it proved its plan optimal over the graph it solved.
    pub proven: bool,
    /// What stopped it before it finished, when something did (not an error).
    pub stopped: Option<MilpStop>,
    /// Whether its plan is better than the DP's (bottleneck, then bytes).
    pub improved: bool,
    /// Whether the solver began at all (false when coarsening left no time for it).
    pub started: bool,
    /// The solver's error, when it failed (see [`MilpRun::error`]).
    pub error: Option<String>,
    /// Whether it was not begun because the model is too large to build (more than
    /// [`MAX_MODEL_CELLS`] cells) and no coarsened plan could start it.
    pub too_large: bool,
}

/// The report of a MILP that was not begun because the model is too large to build.
fn too_large_to_start(problem: &PartitionProblem) -> MilpReport {
    MilpReport {
        nodes: problem.node_count(),
        coarsened: false,
        proven: false,
        stopped: None,
        improved: false,
        started: false,
        error: None,
        too_large: true,
    }
}

/// The MILP on the whole graph from `incumbent`, then the refinement DP when unproven.
fn solve_fine(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    refine_reserve: Duration,
    progress: &dyn Fn(f64, Option<f64>),
) -> (Vec<StageId>, Option<f64>, MilpReport) {
    let n = problem.node_count();
    let mut run = solve_reporting(problem, incumbent, deadline, progress);
    // The DP along the order of the MILP's plan moves its boundaries node by node; the model
    // is small here, so it runs unless the deadline is already half a DP behind.
    if !run.proven && Instant::now() <= deadline + refine_reserve / 2 {
        if let Some(refined) = super::coarsen::refine(problem, &run.stage_of) {
            run.stage_of = refined;
        }
    }
    let improved = better(problem, &run.stage_of, incumbent);
    let report = MilpReport {
        nodes: n,
        coarsened: false,
        proven: run.proven,
        stopped: run.stopped,
        improved,
        started: true,
        error: run.error,
        too_large: false,
    };
    (run.stage_of, run.bound_secs, report)
}

/// The MILP on the model, coarsened to [`MAX_BINARIES`] when larger, refined on the fine graph,
/// starting from `incumbent` (the DP's plan) and stopping at `deadline`. `refine_reserve` is kept
/// back from the deadline for the refinement DP. Returns the best plan (never worse than
/// `incumbent`), a lower bound valid for `problem` when one was proven beyond
/// [`PartitionProblem::lower_bound_secs`], and the report.
pub fn solve_model(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    refine_reserve: Duration,
) -> (Vec<StageId>, Option<f64>, MilpReport) {
    solve_model_reporting(problem, incumbent, deadline, refine_reserve, &|_, _| {})
}

/// [`solve_model_reporting`] that ends at its next time slice, as at its deadline, once `stop`
/// is set: the planner runs it beside the ideal search and stops it when the search has proven
/// its plan. Its slices are then at most [`STOPPABLE_SLICE`] long, its root LP's
/// [`STOPPABLE_ROOT`]. Coarsening and the lower bound computed first look at no flag, so it is
/// meant for models the ideal search takes (at most [`super::ideal_search::MAX_NODES`] nodes),
/// where both take milliseconds on the instance set.
pub(crate) fn solve_model_stoppable(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    refine_reserve: Duration,
    progress: &dyn Fn(f64, Option<f64>),
    stop: Arc<AtomicBool>,
) -> (Vec<StageId>, Option<f64>, MilpReport) {
    stoppable(stop, || {
        solve_model_reporting(problem, incumbent, deadline, refine_reserve, progress)
    })
}

/// [`solve`] that ends at its next time slice once `stop` is set, as
/// [`solve_model_stoppable`] does: `check` runs it beside the ideal search when it proves a
/// search's claim again.
pub(crate) fn solve_stoppable(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    stop: Arc<AtomicBool>,
) -> MilpRun {
    stoppable(stop, || solve(problem, incumbent, deadline))
}

/// Runs `run` with `stop` as this thread's [`STOP`] flag, cleared after.
fn stoppable<T>(stop: Arc<AtomicBool>, run: impl FnOnce() -> T) -> T {
    STOP.with(|slot| *slot.borrow_mut() = Some(stop));
    let found = run();
    STOP.with(|slot| *slot.borrow_mut() = None);
    found
}

/// [`solve_model`], calling `progress(best bottleneck, proven bound)` (seconds, for `problem`)
/// as the search goes; a coarsened search reports no bound (its bound is not the model's).
pub(crate) fn solve_model_reporting(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    refine_reserve: Duration,
    progress: &dyn Fn(f64, Option<f64>),
) -> (Vec<StageId>, Option<f64>, MilpReport) {
    let n = problem.node_count();
    let incumbent_secs = problem.evaluate(incumbent).bottleneck_secs;
    let free = free_binaries(problem, incumbent_secs);
    if free <= MAX_BINARIES && small_enough_to_build(problem) {
        return solve_fine(problem, incumbent, deadline, refine_reserve, progress);
    }
    // Fewer nodes leave proportionally fewer free binaries, about.
    let target = (n * MAX_BINARIES / free.max(1)).max(problem.stage_count());
    let Some(coarse) = coarsen_to_fit(problem, target, incumbent_secs, deadline) else {
        // Coarsening stops at the deadline: the MILP could not start after it, and the planner
        // may have stopped waiting for this thread and be writing the plan.
        let not_started = MilpReport {
            nodes: n,
            coarsened: true,
            proven: false,
            stopped: Some(MilpStop::Deadline),
            improved: false,
            started: false,
            error: None,
            too_large: false,
        };
        return (incumbent.to_vec(), None, not_started);
    };
    // The DP's plan usually splits some super-node; the DP on the coarse graph gives a start
    // that keeps them whole.
    let Some(start) = coarse
        .restrict(incumbent)
        .or_else(|| super::dp::solve(&coarse.problem).map(|s| s.stage_of))
    else {
        // No plan of super-nodes fits memory (the incumbent came from the exact feasibility
        // search and splits them): the whole graph is searched from the incumbent instead,
        // when it is small enough to build.
        if !small_enough_to_build(problem) {
            return (incumbent.to_vec(), None, too_large_to_start(problem));
        }
        return solve_fine(problem, incumbent, deadline, refine_reserve, progress);
    };
    let (mut best, mut report) = solve_coarse(
        problem,
        &coarse,
        &start,
        incumbent,
        deadline,
        refine_reserve,
        progress,
    );
    let room = |reserve: Duration| Instant::now() + reserve <= deadline;
    // Time left after the coarse search (it often proves its optimum within a second): the
    // whole graph from the refined plan, whose tighter bottleneck narrows the stage windows.
    // A proof there is a proof for the model; otherwise the coarse result stands.
    // A model too large to build is not searched whole: the coarse result stands, and its
    // status says so (coarsened, not a time limit), whatever the time left.
    if report.started && room(refine_reserve) && small_enough_to_build(problem) {
        let (fine, bound, fine_report) =
            solve_fine(problem, &best, deadline, refine_reserve, progress);
        if fine_report.proven || fine_report.stopped.is_some() {
            let improved = better(problem, &fine, incumbent);
            return (
                fine,
                bound,
                MilpReport {
                    improved,
                    ..fine_report
                },
            );
        }
        if better(problem, &fine, &best) {
            best = fine;
        }
    } else if report.started && small_enough_to_build(problem) {
        // The deadline left no room for the whole graph: that search was stopped by the time
        // limit too, as when it runs and is stopped (one status for both, whatever the load).
        report.stopped = Some(MilpStop::NoRoomForWholeGraph);
    }
    report.improved = better(problem, &best, incumbent);
    // A bound of the coarse problem bounds only plans that keep super-nodes whole.
    (best, None, report)
}

/// `problem` coarsened to about `target` super-nodes, then by quarters until the stage windows
/// of plans no slower than `incumbent_secs` leave at most [`MAX_BINARIES`] free and the model
/// is small enough to build (or no fewer super-nodes than stages are left); `None` when the
/// deadline comes first.
fn coarsen_to_fit(
    problem: &PartitionProblem,
    target: usize,
    incumbent_secs: f64,
    deadline: Instant,
) -> Option<super::coarsen::Coarsened> {
    let mut coarse = super::coarsen::coarsen_until(problem, target, Some(deadline))?;
    while (free_binaries(&coarse.problem, incumbent_secs) > MAX_BINARIES
        || !small_enough_to_build(&coarse.problem))
        && coarse.problem.node_count() > problem.stage_count()
    {
        let smaller = coarse.problem.node_count() * 3 / 4;
        let again = super::coarsen::coarsen_until(&coarse.problem, smaller, Some(deadline))?;
        coarse = super::coarsen::Coarsened {
            group_of: coarse
                .group_of
                .iter()
                .map(|&g| again.group_of[g as usize])
                .collect(),
            problem: again.problem,
        };
    }
    Some(coarse)
}

/// The MILP on the coarse problem from `start`, until the deadline less `refine_reserve`, then
/// the refinement DP on the fine graph: the best plan (never worse than `incumbent`) and the
/// report (its `improved` left for the caller). Coarsening and the start took time too:
/// without room for the refinement after it, the MILP is not begun.
fn solve_coarse(
    problem: &PartitionProblem,
    coarse: &super::coarsen::Coarsened,
    start: &[StageId],
    incumbent: &[StageId],
    deadline: Instant,
    refine_reserve: Duration,
    progress: &dyn Fn(f64, Option<f64>),
) -> (Vec<StageId>, MilpReport) {
    let mut best = incumbent.to_vec();
    let mut report = MilpReport {
        nodes: coarse.problem.node_count(),
        coarsened: true,
        proven: false,
        // Until the MILP runs: not begun for want of time.
        stopped: Some(MilpStop::Deadline),
        improved: false,
        started: false,
        error: None,
        too_large: false,
    };
    let room = |reserve: Duration| Instant::now() + reserve <= deadline;
    if !room(refine_reserve) {
        return (best, report);
    }
    let milp_deadline = deadline
        .checked_sub(refine_reserve)
        .unwrap_or(deadline)
        .max(Instant::now());
    let run = solve_reporting(&coarse.problem, start, milp_deadline, &|best, _| {
        progress(best, None)
    });
    report.started = true;
    report.proven = run.proven;
    // Its deadline was the limit less the refinement's reserve.
    report.stopped = match run.stopped {
        Some(MilpStop::Deadline) if !refine_reserve.is_zero() => Some(MilpStop::Share),
        other => other,
    };
    report.error = run.error;
    let found = coarse.expand(&run.stage_of);
    if better(problem, &found, &best) {
        best = found;
    }
    // Refine unless the MILP overran into more than half the reserve.
    if room(refine_reserve / 2) {
        if let Some(refined) = super::coarsen::refine(problem, &best) {
            best = refined;
        }
    }
    (best, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::CostSettings;
    use crate::partition::tests::llama_mixed;
    use pipecut_cost::{Catalog, Cluster, DeviceId};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    #[test]
    fn stage_windows_keep_every_plan_within_the_bound_and_fix_most_binaries() {
        let problem = llama_mixed(4);
        let plan = crate::partition::dp::solve(&problem).unwrap();
        let windows = stage_windows(&problem, plan.bottleneck_secs);
        for (v, &(earliest, latest)) in windows.iter().enumerate() {
            let stage = plan.stage_of[v].index();
            assert!(
                earliest <= stage && stage <= latest,
                "node {v}: {stage} outside {earliest}..={latest}"
            );
        }
        let free = free_binaries(&problem, plan.bottleneck_secs);
        let all = problem.node_count() * (problem.stage_count() - 1);
        assert!(free * 2 < all, "{free} of {all} binaries left free");
    }

    #[test]
    fn a_stoppable_run_takes_short_slices_and_ends_at_the_first_after_its_stop() {
        let stop = Arc::new(AtomicBool::new(false));
        let mut pacer = stoppable(Arc::clone(&stop), || {
            Pacer::new(Instant::now() + Duration::from_secs(60))
        });
        // The root gets at most a second: it cannot be resumed, nor stopped.
        let root = pacer.next_slice().unwrap();
        assert_eq!(root, STOPPABLE_ROOT);
        pacer.observe(root, Duration::from_millis(1));
        for _ in 0..8 {
            let slice = pacer.next_slice().unwrap();
            assert!(slice <= STOPPABLE_SLICE, "{slice:?}");
            pacer.observe(slice, slice);
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(pacer.next_slice(), Err(MilpStop::Deadline));
        // Outside `stoppable` a pacer has no flag.
        assert!(Pacer::new(Instant::now()).stop.is_none());
    }

    #[test]
    fn a_run_stopped_before_it_starts_keeps_its_incumbent_unproven() {
        let problem = llama_mixed(3);
        let plan = crate::partition::dp::solve(&problem).unwrap();
        let stop = Arc::new(AtomicBool::new(true));
        let far = Instant::now() + Duration::from_secs(600);
        let started = Instant::now();
        let (stage_of, _, report) = solve_model_stoppable(
            &problem,
            &plan.stage_of,
            far,
            Duration::ZERO,
            &|_, _| {},
            stop,
        );
        assert!(!report.proven);
        assert_eq!(stage_of, plan.stage_of);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
        STOP.with(|slot| assert!(slot.borrow().is_none()));
    }

    #[test]
    fn the_pacer_says_whether_it_stopped_at_the_deadline_or_before_it() {
        let now = Instant::now();
        let mut at_deadline = Pacer::new(now);
        assert_eq!(at_deadline.next_slice(), Err(MilpStop::Deadline));
        assert_eq!(at_deadline.root_stop_reason(), MilpStop::Deadline);
        // Two seconds left, but the last slice overran by two seconds (a loaded machine): the
        // next would end past the limit, so the search stops early and says so.
        let mut paced = Pacer::new(now + Duration::from_secs(2));
        paced.observe(Duration::from_millis(100), Duration::from_millis(100));
        paced.observe(Duration::from_millis(50), Duration::from_secs(2));
        assert_eq!(paced.next_slice(), Err(MilpStop::Paced));
        // A root LP that used its half of the time left ended before the deadline.
        let root = Pacer::new(now + Duration::from_secs(2));
        assert_eq!(root.root_stop_reason(), MilpStop::RootUnfinished);
    }

    #[test]
    fn the_milp_starts_from_and_never_loses_to_its_incumbent() {
        let problem = llama_mixed(3);
        let plan = crate::partition::dp::solve(&problem).unwrap();
        let run = solve(
            &problem,
            &plan.stage_of,
            Instant::now() + Duration::from_secs(60),
        );
        problem.check_assignment(&run.stage_of).unwrap();
        assert!(run.proven);
        let (milp, dp) = (
            problem.evaluate(&run.stage_of),
            problem.evaluate(&plan.stage_of),
        );
        assert!(milp.bottleneck_secs <= dp.bottleneck_secs * (1.0 + RELATIVE_TOLERANCE));
        // With no time at all, the incumbent comes back unproven.
        let none = solve(&problem, &plan.stage_of, Instant::now());
        assert_eq!(none.stage_of, plan.stage_of);
        assert!(!none.proven && none.stopped == Some(MilpStop::Deadline));
    }

    /// The smallest largest-stage memory factor over every convex, ordered assignment, and
    /// whether some assignment fits.
    fn brute_force_memory(p: &PartitionProblem) -> (f64, bool) {
        let (mut best, mut fits) = (f64::INFINITY, false);
        crate::partition::bounds::tests::for_each_assignment(p, |stage_of| {
            best = best.min(memory_scale(p, stage_of));
            fits |= p.evaluate(stage_of).fits();
        });
        (best, fits)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 60, ..Default::default() })]

        /// On random small DAGs with random activations, tensor sizes and capacities, exact
        /// feasibility agrees with enumeration: a plan that fits when one exists, else the
        /// smallest memory factor that would fit.
        #[test]
        fn exact_feasibility_agrees_with_brute_force(
            n in 3usize..7,
            stages in 2usize..4,
            activations in proptest::collection::vec(0u64..4_000, 7),
            bytes in proptest::collection::vec(0u64..4_000, 21),
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 21),
            capacity in 1_000u64..12_000,
            zero_bubble in proptest::prelude::any::<bool>(),
            weight_inputs in proptest::collection::vec(0u64..4_000, 7),
            microbatches in 1u32..6,
        ) {
            proptest::prop_assume!(stages <= n);
            let edges = crate::partition::bounds::tests::edges_from_bits(n, &edge_bits);
            let times = vec![1e-3; n];
            let mut p = if zero_bubble {
                crate::partition::bounds::tests::zero_bubble_dag(&times, &edges, stages, microbatches, &weight_inputs)
            } else {
                crate::partition::bounds::tests::dag(&times, &edges, stages)
            };
            p.activation_bytes = activations[..n].to_vec();
            for (flow, &b) in p.flows.iter_mut().zip(&bytes) {
                flow.bytes = b;
            }
            for stage in &mut p.stages {
                stage.capacity_bytes = capacity;
            }
            let (smallest, any_fits) = brute_force_memory(&p);
            let far = Instant::now() + Duration::from_secs(60);
            match fit_memory(&p, far, None) {
                MemoryFit::Fits(plan) => {
                    proptest::prop_assert!(any_fits, "found a fit enumeration did not");
                    proptest::prop_assert!(p.check_assignment(&plan).is_ok());
                    proptest::prop_assert!(p.evaluate(&plan).fits());
                }
                MemoryFit::TooSmall { scale } => {
                    proptest::prop_assert!(!any_fits, "missed a plan that fits");
                    proptest::prop_assert!(
                        (scale - smallest).abs() <= 1e-6 * smallest,
                        "scale {} smallest {}", scale, smallest
                    );
                }
                other => proptest::prop_assert!(false, "undecided: {:?}", other),
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 120, ..Default::default() })]

        /// On random small DAGs (zero-time nodes, tensors up to 1 GiB, both modes, one or two
        /// device kinds with per-node slowdowns, memory tight enough to bind) the LP-relaxation
        /// bound never exceeds the optimum over every convex, ordered partition that fits.
        #[test]
        fn the_lp_relaxation_bound_is_never_above_the_brute_force_optimum(
            n in 2usize..7,
            stages in 2usize..4,
            times in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just(0.0), 0.1f64..5.0], 6),
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 15),
            bytes in proptest::collection::vec(0u64..1 << 30, 15),
            activations in proptest::collection::vec(0u64..1 << 30, 6),
            training in proptest::prelude::any::<bool>(),
            mixed in proptest::prelude::any::<bool>(),
            slowdowns in proptest::collection::vec(1.0f64..4.0, 6),
            capacity in (1u64 << 30)..(4u64 << 30),
            zero_bubble in proptest::prelude::any::<bool>(),
            weight_inputs in proptest::collection::vec(0u64..1 << 30, 6),
        ) {
            proptest::prop_assume!(stages <= n);
            let edges = crate::partition::bounds::tests::edges_from_bits(n, &edge_bits);
            let settings = CostSettings {
                mode: if training { pipecut_cost::Mode::training() } else { pipecut_cost::Mode::Inference },
                // The test helper's switch to the mixed cluster.
                schedule: match (mixed, training && zero_bubble) {
                    (true, _) => pipecut_cost::Schedule::GPipe,
                    (false, true) => pipecut_cost::Schedule::ZeroBubble,
                    (false, false) => pipecut_cost::Schedule::OneFOneB,
                },
                microbatches: 4,
                ..CostSettings::default()
            };
            let mut p = crate::partition::bounds::tests::dag_in(&times[..n], &edges, stages, settings);
            p.weight_input_bytes = weight_inputs[..n].to_vec();
            for kind in p.node_secs.iter_mut().skip(1) {
                for (t, f) in kind.iter_mut().zip(&slowdowns) {
                    *t *= f;
                }
            }
            for (flow, &b) in p.flows.iter_mut().zip(&bytes) {
                flow.bytes = b;
            }
            p.activation_bytes = activations[..n].to_vec();
            for stage in &mut p.stages {
                stage.capacity_bytes = capacity;
            }
            let Some(incumbent) = crate::partition::dp::solve(&p) else {
                return Ok(());
            };
            let incumbent_secs = p.evaluate(&incumbent.stage_of).bottleneck_secs;
            let far = Instant::now() + Duration::from_secs(60);
            let bound = lp_relaxation_bound_secs(&p, incumbent_secs, far);
            let optimum = crate::partition::bounds::tests::brute_force_fitting_secs(&p);
            if incumbent_secs > 0.0 {
                proptest::prop_assert!(bound.is_some(), "the LP found no bound");
            }
            if let Some(bound) = bound {
                proptest::prop_assert!(
                    bound <= optimum * (1.0 + 1e-12),
                    "LP bound {} optimum {}", bound, optimum
                );
            }
        }
    }

    #[test]
    fn the_lp_relaxation_with_windows_rises_above_the_average_bound() {
        // 0 → 1 → 2 on two stages, 1 GiB tensors: the windows of plans no slower than the DP's
        // put node 0 on the first stage and node 2 on the second, so only node 1 is split; the
        // second stage then receives a whole tensor's worth across its fractions, and the LP's
        // optimum is the average (1.5 s) plus half a transfer.
        let mut p = crate::partition::bounds::tests::dag(&[1.0, 1.0, 1.0], &[(0, 1), (1, 2)], 2);
        for flow in &mut p.flows {
            flow.bytes = 1 << 30;
        }
        let incumbent = crate::partition::dp::solve(&p).unwrap();
        let incumbent_secs = p.evaluate(&incumbent.stage_of).bottleneck_secs;
        let far = Instant::now() + Duration::from_secs(60);
        let lp = lp_relaxation_bound_secs(&p, incumbent_secs, far).unwrap();
        let optimum = crate::partition::bounds::tests::brute_force_fitting_secs(&p);
        assert!(lp <= optimum * (1.0 + 1e-12), "{lp} {optimum}");
        assert!(lp > p.lower_bound_secs(), "{lp} {}", p.lower_bound_secs());
        // No time: no bound.
        assert_eq!(
            lp_relaxation_bound_secs(&p, incumbent_secs, Instant::now()),
            None
        );
    }

    #[test]
    fn a_work_limit_leaves_feasibility_undecided_on_every_machine() {
        let mut p = crate::partition::bounds::tests::dag(&[1e-3; 4], &[(0, 1), (1, 2), (2, 3)], 2);
        p.activation_bytes = vec![1_000; 4];
        for stage in &mut p.stages {
            stage.capacity_bytes = 10;
        }
        let far = Instant::now() + Duration::from_secs(60);
        assert!(matches!(
            fit_memory(&p, far, Some(1_000)),
            MemoryFit::Undecided { .. }
        ));
        assert!(matches!(
            fit_memory(&p, far, None),
            MemoryFit::TooSmall { .. }
        ));
    }

    /// microlp's root LP by model size, for the rule that does not start a MILP whose root
    /// cannot finish in the time left (docs/algorithms.md, "Limits at any size"): the model in
    /// `PIPECUT_ROOT_LP_MODEL` (a `fixtures/generate_stack.py` stack) at batch 1, seq 128 on
    /// 8x8xH100-SXM, K = 64, coarsened to each size, its LP relaxation (the root LP: the same
    /// rows and columns, every `y` continuous) timed. Prints a table; run by hand:
    /// `PIPECUT_ROOT_LP_MODEL=... cargo test --lib root_lp_seconds -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement on a generated model, run by hand"]
    fn root_lp_seconds_by_size() {
        let Ok(path) = std::env::var("PIPECUT_ROOT_LP_MODEL") else {
            return;
        };
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 1).bind("seq", 128))
            .run(&mut model.graph)
            .unwrap();
        let cluster = Cluster::parse("8x8xH100-SXM", &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..64).map(DeviceId).collect();
        let problem =
            PartitionProblem::new(&model.graph, &cluster, &devices, CostSettings::default())
                .unwrap();
        println!("| super-nodes | cells | free binaries | root LP s |");
        for target in [64, 128, 256, 512, 1024, 2048, 4096] {
            let coarse = crate::partition::coarsen::coarsen_until(&problem, target, None).unwrap();
            let plan = crate::partition::dp::solve(&coarse.problem).unwrap();
            let n = coarse.problem.node_count();
            let free = free_binaries(&coarse.problem, plan.bottleneck_secs);
            let far = Instant::now() + Duration::from_secs(600);
            let started = Instant::now();
            let bound = lp_relaxation_bound_secs(&coarse.problem, plan.bottleneck_secs, far);
            let secs = started.elapsed().as_secs_f64();
            println!("| {n} | {} | {free} | {secs:.3} |", n * 63);
            assert!(bound.is_some() || n * 63 > MAX_MODEL_CELLS);
            // The next size takes several times as long.
            if secs > 60.0 {
                break;
            }
        }
    }
}
