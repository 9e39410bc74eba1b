//! Exact branch and bound over the **ideals** of the DAG (its downward-closed node sets),
//! stage by stage: a convex, ordered partition into `K` stages is exactly a chain of ideals
//! `∅ = P_0 ⊊ P_1 ⊊ … ⊊ P_K = V`, stage `k` holding `P_{k+1} \ P_k`. Run by the Planner before
//! the MILP (docs/algorithms.md, "The ideal search").
//!
//! Everything a stage costs is a function of the two ideals around it: its compute is the sum
//! over `P_{k+1} \ P_k`; what it receives (relay: every flow made before it and read at or
//! after it) depends on `P_k` alone, its gradients on `P_{k+1}` alone; its memory is that of its
//! own nodes, weights and receipts. So the search is a depth-first walk over ideals: at stage
//! `k`, from the prefix `P_k`, every ideal `Q ⊋ P_k` whose stage fits the bound `B` (compute and
//! memory are pruned node by node, both grow with `Q`), then stage `k + 1` from `Q`. Each ideal
//! is enumerated once: positions in topological order, each node either joins `Q` (when all its
//! predecessors are in) or is left out (and with it, all its descendants).
//!
//! **Proof.** `B` starts just below the incumbent (the DP's plan), `B = U·(1 − 10⁻⁹)`. A plan
//! found within `B` becomes the incumbent and the search restarts below it; when the walk from
//! the empty prefix finds nothing, no plan beats the incumbent by more than the DP's relative
//! tolerance: it is optimal over all convex, ordered partitions.
//!
//! **Pruning**, each valid for every plan within `B`:
//! - *stage windows*: with `cap_s = (B − receive floor_s) / slowdown_s` the fastest-kind compute
//!   stage `s` can hold (bounds.rs's floors), node `v` needs its ancestors' fastest time
//!   `≤ Σ_{j ≤ s} cap_j` to be on stage `s` and its descendants' `≤ Σ_{j ≥ s} cap_j`; nodes past
//!   their latest stage must be in the prefix, nodes before their earliest must not;
//! - *receive floors by minimum cut*: stage `j` receives at least the cheapest open flows over
//!   the ideals the windows allow at its boundary (cut_floors.rs); the floors narrow the windows,
//!   which force more, for a few rounds;
//! - *remaining work*: what is not yet placed must fit in the capacities of the stages left (in
//!   fastest-kind time, in their own kinds, and for the nodes each window forces by each stage);
//! - *look-ahead*: while a stage fills, each node left out is followed by the same tests for
//!   the next stage, with what the stage can still take and what the next stage will surely
//!   receive (docs/algorithms.md, "The ideal search");
//! - *failed prefixes*: a prefix `(k, P_k)` from which the walk found nothing at bound `B`
//!   finds nothing at any bound `≤ B` either; it is remembered with its bound (exactly, as its
//!   bits between the first position it lacks and the last it holds).
//!
//! **The lattice** (lattice.rs). The walk enumerates a stage's ideals again from every prefix
//! it reaches. After its first [`FIRST_WALK_UNITS`], a dynamic programme over each stage's
//! region of ideals decides whether any plan is within a bound in one sweep, memory and pinned
//! cuts aside; it settles the search, or hands it back to the walk (`Search::run`).
//!
//! Every plan found is re-evaluated by [`PartitionProblem::evaluate`]; the search's own sums
//! decide only what to prune.
//!
//! # Complexity
//! Exponential in the worst case (the number of ideals of the windows), hence the deadline and
//! the work limit (one unit per node decision and per stage entered, so the same limit gives the
//! same answer on every machine). `O(n²/64)` memory and time for the ancestor and descendant sets
//! before the search, so graphs above [`MAX_NODES`] are not searched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::dp::RELATIVE_TOLERANCE;
use super::problem::{PartitionProblem, StageId};

mod lattice;

/// Largest graph searched: the ancestor and descendant sets take `n²/64` words each (4.5 MB at
/// this size), and a wider graph has too many ideals for the search to finish in seconds.
pub const MAX_NODES: usize = 6_000;

/// Failed prefixes remembered at most (each a few words): about a gigabyte at worst beyond this,
/// so later failures are simply not remembered (the search stays exact, only slower).
const MAX_FAILED: usize = 4_000_000;

/// Rounds of windows and receive floors by minimum cut (each only narrows the windows; two or
/// three usually settle them).
const FLOOR_ROUNDS: usize = 4;

/// Work units the walk has before the lattice is built (a fifth of a second or so): enough
/// for most of issue 17's instances, which the walk settles in fewer.
const FIRST_WALK_UNITS: u64 = 1 << 20;

/// Work units between two reads of the clock.
const CLOCK_EVERY: u64 = 1 << 12;

/// Slack on the window tests: sums in another order must never exclude a plan within the bound.
const WINDOW_SLACK: f64 = 1e-9;

/// How an ideal search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchEnd {
    /// Every plan was searched: the plan returned is optimal.
    Proven,
    /// The deadline stopped it.
    Deadline,
    /// The work limit stopped it (the same on every machine).
    WorkLimit,
    /// The graph has more than [`MAX_NODES`] nodes: not searched.
    TooLarge,
}

/// The outcome of [`solve`].
#[derive(Debug, Clone)]
pub struct SearchRun {
    /// The best plan: the incumbent or a better one the search found.
    pub stage_of: Vec<StageId>,
    /// Why it stopped.
    pub end: SearchEnd,
    /// Work units spent (node decisions and stages entered).
    pub work: u64,
}

/// The best plan over all convex, ordered partitions, starting from `incumbent` (a valid plan
/// that fits memory), stopping at `deadline` or after `work_limit` units.
pub fn solve(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    work_limit: Option<u64>,
) -> SearchRun {
    solve_walking_first(
        problem,
        incumbent,
        deadline,
        work_limit,
        None,
        FIRST_WALK_UNITS,
    )
}

/// [`solve`] beside a solver that may prove a lower bound meanwhile: `proven_floor` holds it (an
/// `f64`'s bits, 0 until then). The search ends, proven, at its next look at the clock once its
/// bound is below that floor. It ends with the plan it would have proven alone: until then it
/// walks as alone, and after it would only have found nothing.
pub fn solve_beside(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    proven_floor: &AtomicU64,
) -> SearchRun {
    solve_walking_first(
        problem,
        incumbent,
        deadline,
        None,
        Some(proven_floor),
        FIRST_WALK_UNITS,
    )
}

/// [`solve`] with the walk's first units before the lattice is built given (0: the lattice
/// first, as the tests run it).
fn solve_walking_first(
    problem: &PartitionProblem,
    incumbent: &[StageId],
    deadline: Instant,
    work_limit: Option<u64>,
    proven_floor: Option<&AtomicU64>,
    first_walk_units: u64,
) -> SearchRun {
    if problem.node_count() > MAX_NODES || problem.stage_count() < 2 {
        let end = if problem.stage_count() < 2 {
            SearchEnd::Proven
        } else {
            SearchEnd::TooLarge
        };
        return SearchRun {
            stage_of: incumbent.to_vec(),
            end,
            work: 0,
        };
    }
    let shape = Shape::new(problem);
    let run = || {
        let mut search = Search::new(problem, &shape, incumbent, deadline, work_limit);
        search.proven_floor = proven_floor;
        let end = search.run(first_walk_units);
        SearchRun {
            stage_of: search.best,
            end,
            work: search.work,
        }
    };
    // The walk recurses once per node decided along a path (up to every node), deeper than the
    // 2 MiB a caller's thread may have: it runs on a thread with room for it.
    let stack_bytes = STACK_BYTES_PER_NODE * problem.node_count() + (1 << 20);
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("ideal-search".into())
            .stack_size(stack_bytes)
            .spawn_scoped(scope, run)
        {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: the caller's own, which is enough for most graphs.
            Err(_) => run(),
        }
    })
}

/// Stack for one level of the walk's recursion, with a wide margin over the frames of
/// `extend`, `close_stage` and `enter_stage` in a debug build.
const STACK_BYTES_PER_NODE: usize = 2048;

/// What the search needs of the graph, computed once.
struct Shape {
    preds: Vec<Vec<u32>>,
    /// Each node's distinct successors (the nodes whose `preds` list it).
    succs: Vec<Vec<u32>>,
    flows_out: Vec<Vec<u32>>,
    flows_in: Vec<Vec<u32>>,
    /// Producers of the pinned tensors each node reads: they must be on an earlier stage.
    pinned_producers: Vec<Vec<u32>>,
    pinned_flows: Vec<u32>,
    fastest: Vec<f64>,
    ancestors_secs: Vec<f64>,
    descendants_secs: Vec<f64>,
    /// Per stage `s`, an index into `ancestors_on_kinds`: each node's ancestors' time, each at
    /// the fastest of the device kinds of stages `0..=s` (exact when those share one kind).
    prefix_kinds: Vec<usize>,
    ancestors_on_kinds: Vec<Vec<f64>>,
    /// Per stage `s`, an index into `descendants_on_kinds`: the same over stages `s..K`.
    suffix_kinds: Vec<usize>,
    descendants_on_kinds: Vec<Vec<f64>>,
    /// Per entry of `suffix_kinds`, each node's time at the fastest kind of those stages, and
    /// the sum over all nodes.
    suffix_secs: Vec<Vec<f64>>,
    suffix_total: Vec<f64>,
    /// Per stage `k < K − 1`, the most a node's time on stages `k + 1..K` (their fastest kind)
    /// exceeds its time on stage `k`, as a factor.
    next_suffix_ratio: Vec<f64>,
    total_fastest: f64,
    /// The last stage's compute of every node, and of the whole graph.
    total_last_secs: f64,
    total_activation: u64,
    total_weight_inputs: u64,
    /// Weights read by some node: the last stage holds those not wholly in the prefix.
    total_param_bytes: u64,
    receive_floor: Vec<f64>,
    slowdown: Vec<f64>,
}

impl Shape {
    fn new(problem: &PartitionProblem) -> Shape {
        let (n, k) = (problem.node_count(), problem.stage_count());
        let mut preds = vec![Vec::new(); n];
        let mut flows_out = vec![Vec::new(); n];
        let mut flows_in = vec![Vec::new(); n];
        let mut pinned_producers = vec![Vec::new(); n];
        let mut pinned_flows = Vec::new();
        for (index, flow) in problem.flows().iter().enumerate() {
            flows_out[flow.producer as usize].push(index as u32);
            if flow.pinned {
                pinned_flows.push(index as u32);
            }
            for &c in &flow.consumers {
                preds[c as usize].push(flow.producer);
                flows_in[c as usize].push(index as u32);
                if flow.pinned {
                    pinned_producers[c as usize].push(flow.producer);
                }
            }
        }
        for list in &mut preds {
            list.sort_unstable();
            list.dedup();
        }
        let mut succs = vec![Vec::new(); n];
        for (v, list) in preds.iter().enumerate() {
            for &p in list {
                succs[p as usize].push(v as u32);
            }
        }
        let fastest = super::bounds::fastest_secs(problem);
        // The fastest time over the device kinds of each run of stages that starts at the first
        // stage (prefixes) or ends at the last (suffixes), once per distinct set of kinds.
        let kinds_of = |stages: &mut dyn Iterator<Item = usize>| -> (Vec<usize>, Vec<Vec<f64>>) {
            let (mut index, mut weights) = (Vec::new(), Vec::new());
            let mut seen: Vec<usize> = Vec::new();
            let mut least = vec![f64::INFINITY; n];
            for s in stages {
                let kind = problem.stages()[s].kind;
                if !seen.contains(&kind) {
                    seen.push(kind);
                    for (v, t) in least.iter_mut().enumerate() {
                        *t = t.min(problem.node_secs(s, v));
                    }
                    weights.push(least.clone());
                }
                index.push(weights.len() - 1);
            }
            (index, weights)
        };
        let (prefix_kinds, prefix_weights) = kinds_of(&mut (0..k));
        let (mut suffix_kinds, suffix_weights) = kinds_of(&mut (0..k).rev());
        suffix_kinds.reverse();
        let mut ancestor_weights = vec![fastest.clone()];
        ancestor_weights.extend(prefix_weights);
        let mut descendant_weights = vec![fastest.clone()];
        descendant_weights.extend(suffix_weights.iter().cloned());
        let next_suffix_ratio = (0..k - 1)
            .map(|s| {
                let later = &suffix_weights[suffix_kinds[s + 1]];
                (0..n)
                    .map(|v| match (later[v], problem.node_secs(s, v)) {
                        (l, _) if l <= 0.0 => 0.0,
                        (l, t) if t > 0.0 => l / t,
                        _ => f64::INFINITY,
                    })
                    .fold(0.0, f64::max)
            })
            .collect();
        let (mut ancestors_on_kinds, mut descendants_on_kinds) =
            closure_secs(&preds, &succs, &ancestor_weights, &descendant_weights);
        let ancestors_secs = ancestors_on_kinds.remove(0);
        let descendants_secs = descendants_on_kinds.remove(0);
        Shape {
            total_fastest: fastest.iter().sum(),
            total_last_secs: (0..n).map(|v| problem.node_secs(k - 1, v)).sum(),
            total_activation: (0..n).map(|v| problem.activation_bytes(v)).sum(),
            total_weight_inputs: (0..n).map(|v| problem.weight_input_bytes(v)).sum(),
            total_param_bytes: problem
                .params()
                .iter()
                .filter(|p| !p.uses.is_empty())
                .map(|p| p.footprint_bytes)
                .sum(),
            receive_floor: super::bounds::least_receive_secs(problem),
            slowdown: super::bounds::least_slowdowns(problem, &fastest, &fastest),
            preds,
            succs,
            flows_out,
            flows_in,
            pinned_producers,
            pinned_flows,
            fastest,
            ancestors_secs,
            descendants_secs,
            prefix_kinds,
            ancestors_on_kinds,
            suffix_kinds,
            descendants_on_kinds,
            suffix_total: suffix_weights.iter().map(|w| w.iter().sum()).collect(),
            suffix_secs: suffix_weights,
            next_suffix_ratio,
        }
    }
}

/// Each node's times (one vector per entry of `ancestor_weights`) summed over its ancestors
/// (itself included), and likewise over its descendants, from bit sets built in topological
/// order.
///
/// # Complexity
/// O(n²/64 + E·n/64 + n²·w/64) time for `w` weight vectors, O(n²/64) memory.
fn closure_secs(
    preds: &[Vec<u32>],
    succs: &[Vec<u32>],
    ancestor_weights: &[Vec<f64>],
    descendant_weights: &[Vec<f64>],
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let n = preds.len();
    let words = n.div_ceil(64);
    let sum_over = |linked: &[Vec<u32>], forward: bool, weights: &[Vec<f64>]| -> Vec<Vec<f64>> {
        let mut sets = vec![0u64; n * words];
        let positions: Box<dyn Iterator<Item = usize>> = if forward {
            Box::new(0..n)
        } else {
            Box::new((0..n).rev())
        };
        let mut secs = vec![vec![0.0; n]; weights.len()];
        for v in positions {
            let mut set = vec![0u64; words];
            set[v / 64] |= 1 << (v % 64);
            for &u in &linked[v] {
                let from = &sets[u as usize * words..(u as usize + 1) * words];
                for (w, bits) in set.iter_mut().zip(from) {
                    *w |= bits;
                }
            }
            for (weight, sums) in weights.iter().zip(secs.iter_mut()) {
                let mut sum = 0.0;
                for (w, &bits) in set.iter().enumerate() {
                    let mut bits = bits;
                    while bits != 0 {
                        sum += weight[w * 64 + bits.trailing_zeros() as usize];
                        bits &= bits - 1;
                    }
                }
                sums[v] = sum;
            }
            sets[v * words..(v + 1) * words].copy_from_slice(&set);
        }
        secs
    };
    (
        sum_over(preds, true, ancestor_weights),
        sum_over(succs, false, descendant_weights),
    )
}

enum Outcome {
    /// Nothing within the bound below this point.
    Exhausted,
    /// A plan within the bound was found; the bound is now lower and the search restarts.
    Found,
    Stopped(SearchEnd),
}

/// The prefix's figures [`Search::leave`] restores by copy.
#[derive(Clone)]
struct Saved {
    first_missing: usize,
    last_held: usize,
    prefix_fastest: f64,
    prefix_last_secs: f64,
    prefix_suffix_secs: smallvec::SmallVec<[f64; 4]>,
    /// The one entry of `prefix_by_latest` that placing a node changes (its latest stage then:
    /// a bound found deeper moves the windows before the walk comes back), and its value.
    latest_entry: (usize, f64),
}

/// A figure per stage, inline up to 16 stages.
type PerStage = smallvec::SmallVec<[f64; 16]>;

/// What [`Search::mark_joinable`] found could still join the stage being filled: its time on
/// the fastest kind, on the later stages' kinds, and on the fastest kind by latest stage.
struct Joinable {
    fastest: f64,
    on_kinds: f64,
    by_latest: PerStage,
}

/// The stage being filled: what it has so far, and what its prefix `P_k` fixed.
#[derive(Clone, Copy)]
struct StageFill {
    stage: usize,
    receive_secs: f64,
    received_bytes: u64,
    compute_secs: f64,
    activation_bytes: u64,
    weight_input_bytes: u64,
    param_bytes: u64,
    nodes: usize,
    /// Positions from here on have their earliest stage after this one.
    end: usize,
}

struct Search<'a> {
    problem: &'a PartitionProblem,
    shape: &'a Shape,
    best: Vec<StageId>,
    bound: f64,
    earliest: Vec<usize>,
    latest: Vec<usize>,
    /// `1 +` the last position whose earliest stage is at most `k`, per `k`.
    region_end: Vec<usize>,
    /// Fastest-kind compute stages `k..K` can hold within the bound, per `k`.
    capacity_from: Vec<f64>,
    /// Time stages `k..K` have for compute within the bound after their floors, per `k`.
    room_from: Vec<f64>,
    /// Fastest-kind compute each stage can hold within the bound after its floor.
    capacity: Vec<f64>,
    /// Per stage `j`, the fastest-kind time of the nodes whose latest stage is `j`.
    total_by_latest: Vec<f64>,
    /// Each stage's receive floor at the bound (forward and, in training, gradient).
    floor: Vec<f64>,
    /// Per boundary `j`, the least forward receive of stage `j` (cut_floors.rs).
    boundary_floor: Vec<f64>,
    /// Whether the windows at the bound leave any plan at all.
    windows_feasible: bool,
    // The prefix: every node placed so far (stages up to the one being filled).
    in_prefix: Vec<bool>,
    /// Per node, how many of its predecessors are in the prefix ([`Self::may_join`] compares
    /// it with their number instead of reading them all at every position the walk passes).
    preds_in: Vec<u32>,
    bits: Vec<u64>,
    stage_of: Vec<u32>,
    first_missing: usize,
    last_held: usize,
    prefix_nodes: usize,
    prefix_fastest: f64,
    prefix_last_secs: f64,
    /// The prefix's time in each of `Shape::suffix_secs`.
    prefix_suffix_secs: smallvec::SmallVec<[f64; 4]>,
    /// The prefix's fastest-kind time by latest stage (as the windows were when its nodes were
    /// placed: a new bound restarts the walk from the empty prefix).
    prefix_by_latest: PerStage,
    prefix_activation: u64,
    prefix_weight_inputs: u64,
    readers_in: Vec<u32>,
    /// The open flows (made in the prefix, some reader outside: each a message), their bytes,
    /// and each flow's index in the list.
    open_flows: Vec<u32>,
    open_bytes: u64,
    open_slot: Vec<u32>,
    param_readers_in: Vec<u32>,
    closed_param_bytes: u64,
    stage_param_readers: Vec<Vec<u32>>,
    /// foldhash, not SipHash: SipHash was 1.7% of the samples of a 30 s paraphrase-MiniLM
    /// run at K = 8 (perf, MILP included), a few percent of the search's own.
    failed: HashMap<Vec<u64>, f64, foldhash::fast::FixedState>,
    /// Scratch for [`Self::may_still_hold_enough`]: whether each position could still join.
    joinable: Vec<bool>,
    work: u64,
    work_limit: Option<u64>,
    /// Where the walk pauses for the lattice ([`Search::run`]), and whether it did.
    pause_at: Option<u64>,
    paused: bool,
    deadline: Instant,
    /// A lower bound proven by another solver meanwhile ([`solve_beside`]).
    proven_floor: Option<&'a AtomicU64>,
}

impl<'a> Search<'a> {
    fn new(
        problem: &'a PartitionProblem,
        shape: &'a Shape,
        incumbent: &[StageId],
        deadline: Instant,
        work_limit: Option<u64>,
    ) -> Search<'a> {
        let (n, k) = (problem.node_count(), problem.stage_count());
        let mut search = Search {
            problem,
            shape,
            best: incumbent.to_vec(),
            bound: 0.0,
            earliest: vec![0; n],
            latest: vec![k - 1; n],
            region_end: vec![n; k],
            capacity_from: vec![0.0; k + 1],
            room_from: vec![0.0; k + 1],
            capacity: vec![0.0; k],
            total_by_latest: vec![0.0; k],
            floor: vec![0.0; k],
            boundary_floor: vec![0.0; k],
            windows_feasible: true,
            in_prefix: vec![false; n],
            preds_in: vec![0; n],
            bits: vec![0; n.div_ceil(64)],
            stage_of: vec![0; n],
            first_missing: 0,
            last_held: 0,
            prefix_nodes: 0,
            prefix_fastest: 0.0,
            prefix_last_secs: 0.0,
            prefix_suffix_secs: smallvec::smallvec![0.0; shape.suffix_secs.len()],
            prefix_by_latest: smallvec::smallvec![0.0; k],
            prefix_activation: 0,
            prefix_weight_inputs: 0,
            readers_in: vec![0; problem.flows().len()],
            open_flows: Vec::new(),
            open_bytes: 0,
            open_slot: vec![u32::MAX; problem.flows().len()],
            param_readers_in: vec![0; problem.params().len()],
            closed_param_bytes: 0,
            stage_param_readers: vec![vec![0; problem.params().len()]; k],
            failed: HashMap::default(),
            joinable: vec![false; n],
            work: 0,
            work_limit,
            pause_at: None,
            paused: false,
            deadline,
            proven_floor: None,
        };
        let incumbent_secs = problem.evaluate(incumbent).bottleneck_secs;
        search.set_bound(incumbent_secs * (1.0 - RELATIVE_TOLERANCE));
        search
    }

    /// Lowers the bound and recomputes the windows for it: first from the floors of
    /// bounds.rs, then again from the least each boundary can cost within the windows (the
    /// cheapest ideal they allow there, cut_floors.rs), until the floors stop rising.
    fn set_bound(&mut self, bound: f64) {
        self.bound = bound;
        self.boundary_floor.fill(0.0);
        let mut floor = self.shape.receive_floor.clone();
        for _ in 0..FLOOR_ROUNDS {
            self.set_windows(&floor);
            if !self.windows_feasible {
                return;
            }
            let raised = self.cut_receive_floors();
            let mut rose = false;
            for (f, raised) in floor.iter_mut().zip(raised) {
                if raised > *f {
                    *f = raised;
                    rose = true;
                }
            }
            if !rose {
                return;
            }
        }
        self.set_windows(&floor);
    }

    /// The windows, the capacities and the regions at the current bound for these per-stage
    /// receive floors.
    fn set_windows(&mut self, floor: &[f64]) {
        let (n, k) = (self.problem.node_count(), self.problem.stage_count());
        let capacity: Vec<f64> = (0..k)
            .map(|s| (self.bound - floor[s]).max(0.0) / self.shape.slowdown[s])
            .collect();
        let room: Vec<f64> = (0..k).map(|s| (self.bound - floor[s]).max(0.0)).collect();
        self.floor = floor.to_vec();
        let (mut before, mut room_before) = (vec![0.0; k], vec![0.0; k]);
        let (mut sum, mut room_sum) = (0.0, 0.0);
        for s in 0..k {
            sum += capacity[s];
            room_sum += room[s];
            before[s] = sum * (1.0 + WINDOW_SLACK);
            room_before[s] = room_sum * (1.0 + WINDOW_SLACK);
        }
        self.capacity_from = vec![0.0; k + 1];
        self.room_from = vec![0.0; k + 1];
        for s in (0..k).rev() {
            self.capacity_from[s] = self.capacity_from[s + 1] + capacity[s];
            self.room_from[s] = self.room_from[s + 1] + room[s];
        }
        let room_from = self.room_from.clone();
        let shape = self.shape;
        self.windows_feasible = true;
        self.region_end = vec![0; k];
        for v in 0..n {
            // Two necessary conditions: in fastest-kind time against the slowed-down
            // capacities, and in the stages' own kinds' time against their plain room.
            let earliest = (0..k).find(|&s| {
                shape.ancestors_secs[v] <= before[s]
                    && shape.ancestors_on_kinds[shape.prefix_kinds[s]][v] <= room_before[s]
            });
            let latest = (0..k).rev().find(|&s| {
                shape.descendants_secs[v] <= self.capacity_from[s] * (1.0 + WINDOW_SLACK)
                    && shape.descendants_on_kinds[shape.suffix_kinds[s]][v]
                        <= room_from[s] * (1.0 + WINDOW_SLACK)
            });
            match (earliest, latest) {
                (Some(e), Some(l)) if e <= l => {
                    self.earliest[v] = e;
                    self.latest[v] = l;
                    self.region_end[e] = v + 1;
                }
                _ => self.windows_feasible = false,
            }
        }
        for s in 1..k {
            self.region_end[s] = self.region_end[s].max(self.region_end[s - 1]);
        }
        self.capacity = capacity;
        self.total_by_latest.fill(0.0);
        for v in 0..n {
            self.total_by_latest[self.latest[v]] += shape.fastest[v];
        }
    }

    /// Per stage, the least receive time (and in training gradient receive) of every plan within
    /// the windows: at each boundary the cheapest ideal the windows allow (cut_floors.rs).
    /// Also raises [`Self::boundary_floor`] to the cuts found.
    fn cut_receive_floors(&mut self) -> Vec<f64> {
        let k = self.problem.stage_count();
        let cuts = super::cut_floors::boundary_floors(
            self.problem,
            &self.earliest,
            &self.latest,
            self.deadline,
        );
        for (kept, cut) in self.boundary_floor.iter_mut().zip(&cuts) {
            *kept = kept.max(*cut);
        }
        (0..k)
            .map(|j| {
                let gradient = if self.training() && j + 1 < k {
                    cuts[j + 1]
                } else {
                    0.0
                };
                cuts[j] + gradient
            })
            .collect()
    }

    /// The walk for its first units ([`FIRST_WALK_UNITS`]), the lattice (lattice.rs), then the
    /// walk to the end: the walk alone settles most instances sooner than the lattice is built,
    /// and the lattice settles in seconds the ones whose walk would take minutes.
    fn run(&mut self, first_walk_units: u64) -> SearchEnd {
        if let Some(end) = self.walk(Some(self.work + first_walk_units)) {
            return end;
        }
        if let Some(end) = self.settle_by_lattice() {
            return end;
        }
        self.walk(None)
            .expect("a walk without a pause ends with the search")
    }

    /// Walks from the empty prefix until it finds no plan within the bound, restarting below
    /// each plan found; `None` when it paused at `pause_at` units.
    fn walk(&mut self, pause_at: Option<u64>) -> Option<SearchEnd> {
        self.pause_at = pause_at;
        let end = loop {
            match self.root() {
                Outcome::Exhausted => break SearchEnd::Proven,
                Outcome::Stopped(end) => break end,
                Outcome::Found => continue,
            }
        };
        let paused = std::mem::take(&mut self.paused);
        self.pause_at = None;
        (!paused).then_some(end)
    }

    fn tick(&mut self) -> Option<SearchEnd> {
        self.work += 1;
        if self.work_limit.is_some_and(|limit| self.work > limit) {
            return Some(SearchEnd::WorkLimit);
        }
        if self.pause_at.is_some_and(|at| self.work >= at) {
            self.paused = true;
            return Some(SearchEnd::WorkLimit);
        }
        if self.work.is_multiple_of(CLOCK_EVERY) {
            if Instant::now() >= self.deadline {
                return Some(SearchEnd::Deadline);
            }
            if self.below_proven_floor() {
                return Some(SearchEnd::Proven);
            }
        }
        None
    }

    /// Whether the bound is below a floor proven meanwhile: no plan is left to find.
    fn below_proven_floor(&self) -> bool {
        self.proven_floor.is_some_and(|floor| {
            let floor = f64::from_bits(floor.load(Ordering::Relaxed));
            floor > 0.0 && self.bound < floor
        })
    }

    /// Settles the search by the dynamic programme over the regions' ideals (lattice.rs): it
    /// halves the interval between a bound no plan is within and the search's bound, adopting
    /// each better plan a sweep finds, until no plan is within the search's bound. `None` hands
    /// over to the walk: regions too large, or a plan found that does not fit memory or the
    /// pinned cuts.
    fn settle_by_lattice(&mut self) -> Option<SearchEnd> {
        if !self.windows_feasible {
            return Some(SearchEnd::Proven);
        }
        let lattice = match self.build_lattice() {
            Ok(lattice) => lattice,
            Err(lattice::NotBuilt::TooLarge) => return None,
            Err(lattice::NotBuilt::Stopped(end)) => return Some(end),
        };
        // No plan is within `none_within` (the lower bound every plan meets, to start). Probes
        // alternate between the search's bound, which proves the incumbent optimal when no plan
        // is within it (the walk's plan often is), and the middle of the interval, which finds
        // a much better plan when there is one.
        let mut none_within = self.problem.lower_bound_secs() * (1.0 - RELATIVE_TOLERANCE);
        let mut at_bound = true;
        loop {
            let bound = self.bound;
            let probe = if at_bound || bound - none_within <= bound * RELATIVE_TOLERANCE {
                bound
            } else {
                0.5 * (none_within + bound)
            };
            at_bound = !at_bound;
            let plan = match lattice.sweep(probe, || self.tick()) {
                Err(end) => return Some(end),
                Ok(None) if probe == bound => return Some(SearchEnd::Proven),
                Ok(None) => {
                    none_within = probe;
                    continue;
                }
                Ok(Some(plan)) => plan,
            };
            if !self.adopt(plan) {
                return None;
            }
            if !self.windows_feasible {
                return Some(SearchEnd::Proven);
            }
        }
    }

    /// Takes `plan` as the incumbent when it is valid, fits and is better, and lowers the bound
    /// below it; `false` when it is not a plan that fits.
    fn adopt(&mut self, plan: Vec<StageId>) -> bool {
        let problem = self.problem;
        if problem.check_assignment(&plan).is_err() {
            return false;
        }
        let evaluation = problem.evaluate(&plan);
        if !evaluation.fits() {
            return false;
        }
        if evaluation.bottleneck_secs < problem.evaluate(&self.best).bottleneck_secs {
            self.best = plan;
        }
        let next = (evaluation.bottleneck_secs * (1.0 - RELATIVE_TOLERANCE))
            .min(self.bound * (1.0 - RELATIVE_TOLERANCE));
        self.set_bound(next);
        true
    }

    fn root(&mut self) -> Outcome {
        if !self.windows_feasible {
            return Outcome::Exhausted;
        }
        self.enter_stage(0)
    }

    /// The prefix as a key: the stage, the first word it does not fill, and its words from there
    /// to its last node (all words before are full, all after are empty).
    fn key(&self, stage: usize) -> Vec<u64> {
        let low = self.first_missing / 64;
        let high = if self.prefix_nodes == 0 {
            low
        } else {
            (self.last_held / 64).max(low)
        };
        let mut key = Vec::with_capacity(high - low + 2);
        key.push(((stage as u64) << 32) | low as u64);
        key.extend_from_slice(&self.bits[low..=high.min(self.bits.len() - 1)]);
        key
    }

    fn enter_stage(&mut self, stage: usize) -> Outcome {
        if let Some(end) = self.tick() {
            return Outcome::Stopped(end);
        }
        let k = self.problem.stage_count();
        if stage == k - 1 {
            return self.last_stage();
        }
        if self.prefix_nodes == self.problem.node_count() {
            // Nothing left for this stage and the ones after it.
            return Outcome::Exhausted;
        }
        let receive_secs = self
            .problem
            .receive_secs(stage, self.open_flows.len(), self.open_bytes);
        if !self.rest_fits(stage, receive_secs) {
            return Outcome::Exhausted;
        }
        let key = self.key(stage);
        if self.failed.get(&key).is_some_and(|&at| at >= self.bound) {
            return Outcome::Exhausted;
        }
        let fill = StageFill {
            stage,
            receive_secs,
            received_bytes: self.open_bytes,
            compute_secs: 0.0,
            activation_bytes: 0,
            weight_input_bytes: 0,
            param_bytes: 0,
            nodes: 0,
            end: self.region_end[stage],
        };
        let outcome = if receive_secs > self.bound {
            Outcome::Exhausted
        } else {
            self.extend(fill, self.first_missing)
        };
        if matches!(outcome, Outcome::Exhausted) && self.failed.len() < MAX_FAILED {
            let at = self.bound;
            let entry = self.failed.entry(key).or_insert(at);
            *entry = entry.max(at);
        }
        outcome
    }

    /// Decides the positions from `position` on: each node that may join the stage joins it
    /// (first) or stays out.
    fn extend(&mut self, fill: StageFill, mut position: usize) -> Outcome {
        if let Some(end) = self.tick() {
            return Outcome::Stopped(end);
        }
        let stage = fill.stage;
        let v = loop {
            if position >= fill.end {
                return self.close_stage(&fill);
            }
            let v = position;
            if !self.in_prefix[v] {
                if self.may_join(v, stage) {
                    break v;
                }
                if self.latest[v] <= stage {
                    return Outcome::Exhausted;
                }
            }
            position += 1;
        };
        let saved = self.saved(v);
        if let Some(joined) = self.join(&fill, v) {
            let outcome = self.extend(joined, v + 1);
            self.leave(v, stage, saved);
            if !matches!(outcome, Outcome::Exhausted) {
                return outcome;
            }
        }
        if self.latest[v] <= stage || !self.may_still_hold_enough(&fill, v + 1) {
            return Outcome::Exhausted;
        }
        self.extend(fill, v + 1)
    }

    /// Whether what is left fits stage `stage` after what it receives, and the stages after it:
    /// in the later stages' own kinds against their room, and stage by stage in fastest-kind
    /// time for the nodes each window forces by then (whose last group is everything left).
    fn rest_fits(&self, stage: usize, receive_secs: f64) -> bool {
        let room = (self.bound - receive_secs).max(0.0);
        self.remaining_on_kinds(stage) <= (room + self.room_from[stage + 1]) * (1.0 + WINDOW_SLACK)
            && self.latest_groups_fit(stage, room / self.shape.slowdown[stage], &[])
    }

    /// Whether the stage, deciding positions from `from` on, can still end so that the stages
    /// after it hold the rest. Two things are known before the stage closes:
    /// - what it may still add: at most the time of the undecided nodes of its region that
    ///   could still join (see [`Self::mark_joinable`]), and at most its room left;
    /// - what the next stage will surely receive: every open flow with a reader that can no
    ///   longer join. In training this stage receives those flows' gradients too.
    ///
    /// Leaving a node out keeps its descendants out, so after a few such choices the stage can
    /// no longer end well, and the walk stops there instead of enumerating every smaller ideal,
    /// each rejected only when the next stage begins.
    fn may_still_hold_enough(&mut self, fill: &StageFill, from: usize) -> bool {
        let (problem, shape) = (self.problem, self.shape);
        let (stage, next) = (fill.stage, fill.stage + 1);
        let next_kinds = shape.suffix_kinds[next];
        let joinable = self.mark_joinable(fill, from, next_kinds);
        let (messages, bytes) = self.surely_open(fill, from);
        let next_receive = problem.receive_secs(next, messages, bytes);
        let gradient = if self.training() { next_receive } else { 0.0 };
        let room = self.bound - fill.receive_secs - fill.compute_secs - gradient;
        if room < 0.0 {
            // Already too slow with the gradients it will surely receive.
            return false;
        }
        // The next stage with what it surely receives in place of its floor.
        let next_gradient_floor = if self.training() && next + 1 < problem.stage_count() {
            self.boundary_floor[next + 1]
        } else {
            0.0
        };
        let next_room =
            (self.bound - self.floor[next].max(next_receive + next_gradient_floor)).max(0.0);
        let next_capacity = next_room / shape.slowdown[next];
        // In fastest-kind time, then in the later stages' own kinds (exact where they share
        // one, as four L4s after four A100s do, where slowed-down fastest time is loose).
        let may_add = joinable.fastest.min(room / shape.slowdown[stage]);
        let remaining = shape.total_fastest - self.prefix_fastest;
        let may_add_on_kinds = joinable.on_kinds.min(room * shape.next_suffix_ratio[stage]);
        remaining - may_add <= (next_capacity + self.capacity_from[next + 1]) * (1.0 + WINDOW_SLACK)
            && self.remaining_on_kinds(next) - may_add_on_kinds
                <= (next_room + self.room_from[next + 1]) * (1.0 + WINDOW_SLACK)
            && self.latest_groups_fit(next, next_capacity, &joinable.by_latest)
    }

    /// Marks in `self.joinable` the positions from `from` to the stage's region end that could
    /// still join it (not placed, in their window, every predecessor placed or itself able to
    /// join), and sums their times (`kinds` indexes `Shape::suffix_secs`).
    fn mark_joinable(&mut self, fill: &StageFill, from: usize, kinds: usize) -> Joinable {
        let shape = self.shape;
        let mut sums = Joinable {
            fastest: 0.0,
            on_kinds: 0.0,
            by_latest: smallvec::smallvec![0.0; self.problem.stage_count()],
        };
        for u in from..fill.end {
            let joinable = !self.in_prefix[u]
                && self.earliest[u] <= fill.stage
                && shape.preds[u].iter().all(|&p| {
                    let p = p as usize;
                    self.in_prefix[p] || (p >= from && self.joinable[p])
                });
            self.joinable[u] = joinable;
            if joinable {
                sums.fastest += shape.fastest[u];
                sums.on_kinds += shape.suffix_secs[kinds][u];
                sums.by_latest[self.latest[u]] += shape.fastest[u];
            }
        }
        sums
    }

    /// The messages and bytes of the open flows that stay open whatever the stage still takes:
    /// some reader is outside the prefix and cannot join (left out before `from`, past the
    /// region, or not joinable as [`Self::mark_joinable`] found).
    fn surely_open(&self, fill: &StageFill, from: usize) -> (usize, u64) {
        let flows = self.problem.flows();
        self.open_flows
            .iter()
            .map(|&f| &flows[f as usize])
            .filter(|flow| {
                flow.consumers.iter().any(|&r| {
                    let r = r as usize;
                    !self.in_prefix[r] && (r < from || r >= fill.end || !self.joinable[r])
                })
            })
            .fold((0, 0), |(messages, bytes), flow| {
                (messages + 1, bytes + flow.bytes)
            })
    }

    /// Whether the nodes left for stages `first..K` fit the stages their windows allow: the
    /// nodes whose latest stage is `j` or earlier all go on stages up to `j`, so for every `j`
    /// their fastest-kind time must fit in `first_capacity` (stage `first`'s) plus the
    /// capacities of stages `first + 1..=j`. The nodes left are those outside the prefix less
    /// `joinable` (by latest stage: they may still join the stage being filled; empty for none).
    fn latest_groups_fit(&self, first: usize, first_capacity: f64, joinable: &[f64]) -> bool {
        let k = self.problem.stage_count();
        let pending = |j: usize| {
            self.total_by_latest[j] - self.prefix_by_latest[j] - joinable.get(j).unwrap_or(&0.0)
        };
        let (mut need, mut room) = (0.0, 0.0);
        for j in 0..k {
            need += pending(j);
            if j >= first {
                room += if j == first {
                    first_capacity
                } else {
                    self.capacity[j]
                };
                if need > room * (1.0 + WINDOW_SLACK) {
                    return false;
                }
            }
        }
        true
    }

    /// The time of the nodes not in the prefix, each at the fastest device kind of stages
    /// `stage..K`.
    fn remaining_on_kinds(&self, stage: usize) -> f64 {
        let kinds = self.shape.suffix_kinds[stage];
        self.shape.suffix_total[kinds] - self.prefix_suffix_secs[kinds]
    }

    /// Whether `v` may join stage `stage` now: within its window, all its predecessors placed,
    /// and every pinned tensor it reads made on an earlier stage.
    fn may_join(&self, v: usize, stage: usize) -> bool {
        self.earliest[v] <= stage
            && self.preds_in[v] as usize == self.shape.preds[v].len()
            && self.shape.pinned_producers[v]
                .iter()
                .all(|&p| (self.stage_of[p as usize] as usize) < stage)
    }

    /// Adds `v` to the stage when its compute and memory stay within bounds; returns the stage
    /// with it.
    fn join(&mut self, fill: &StageFill, v: usize) -> Option<StageFill> {
        let stage = fill.stage;
        let compute_secs = fill.compute_secs + self.problem.node_secs(stage, v);
        if compute_secs + fill.receive_secs > self.bound {
            return None;
        }
        let params = self.problem.params();
        let new_param_bytes: u64 = self.problem.node_params[v]
            .iter()
            .filter(|&&p| self.stage_param_readers[stage][p as usize] == 0)
            .map(|&p| params[p as usize].footprint_bytes)
            .sum();
        let joined = StageFill {
            compute_secs,
            activation_bytes: fill.activation_bytes + self.problem.activation_bytes(v),
            weight_input_bytes: fill.weight_input_bytes + self.problem.weight_input_bytes(v),
            param_bytes: fill.param_bytes + new_param_bytes,
            nodes: fill.nodes + 1,
            ..*fill
        };
        if !self.fits(stage, &joined) {
            return None;
        }
        self.place(v, stage);
        Some(joined)
    }

    fn fits(&self, stage: usize, fill: &StageFill) -> bool {
        let peak = self.problem.peak_bytes(
            stage,
            fill.param_bytes,
            fill.received_bytes,
            fill.activation_bytes,
            fill.weight_input_bytes,
        );
        peak <= self.problem.stages()[stage].capacity_bytes
    }

    fn place(&mut self, v: usize, stage: usize) {
        let (problem, shape) = (self.problem, self.shape);
        self.in_prefix[v] = true;
        for &s in &shape.succs[v] {
            self.preds_in[s as usize] += 1;
        }
        self.bits[v / 64] |= 1 << (v % 64);
        self.stage_of[v] = stage as u32;
        self.prefix_nodes += 1;
        self.prefix_fastest += shape.fastest[v];
        for (sum, secs) in self.prefix_suffix_secs.iter_mut().zip(&shape.suffix_secs) {
            *sum += secs[v];
        }
        self.prefix_by_latest[self.latest[v]] += shape.fastest[v];
        self.prefix_last_secs += problem.node_secs(problem.stage_count() - 1, v);
        self.prefix_activation += problem.activation_bytes(v);
        self.prefix_weight_inputs += problem.weight_input_bytes(v);
        for &f in &shape.flows_out[v] {
            self.open_bytes += problem.flows()[f as usize].bytes;
            self.open(f);
        }
        for &f in &shape.flows_in[v] {
            let flow = &problem.flows()[f as usize];
            self.readers_in[f as usize] += 1;
            if self.readers_in[f as usize] as usize == flow.consumers.len() {
                self.open_bytes -= flow.bytes;
                self.close(f);
            }
        }
        for &p in &problem.node_params[v] {
            self.stage_param_readers[stage][p as usize] += 1;
            self.param_readers_in[p as usize] += 1;
            let param = &problem.params()[p as usize];
            if self.param_readers_in[p as usize] as usize == param.uses.len() {
                self.closed_param_bytes += param.footprint_bytes;
            }
        }
        while self.first_missing < self.in_prefix.len() && self.in_prefix[self.first_missing] {
            self.first_missing += 1;
        }
        self.last_held = self.last_held.max(v);
    }

    fn open(&mut self, flow: u32) {
        self.open_slot[flow as usize] = self.open_flows.len() as u32;
        self.open_flows.push(flow);
    }

    fn close(&mut self, flow: u32) {
        let slot = self.open_slot[flow as usize] as usize;
        self.open_flows.swap_remove(slot);
        if let Some(&moved) = self.open_flows.get(slot) {
            self.open_slot[moved as usize] = slot as u32;
        }
        self.open_slot[flow as usize] = u32::MAX;
    }

    /// What [`Self::leave`] restores as it was rather than by subtraction (times would drift).
    fn saved(&self, v: usize) -> Saved {
        Saved {
            first_missing: self.first_missing,
            last_held: self.last_held,
            prefix_fastest: self.prefix_fastest,
            prefix_last_secs: self.prefix_last_secs,
            prefix_suffix_secs: self.prefix_suffix_secs.clone(),
            latest_entry: (self.latest[v], self.prefix_by_latest[self.latest[v]]),
        }
    }

    /// Undoes [`Self::place`] for the last node placed, `v`.
    fn leave(&mut self, v: usize, stage: usize, saved: Saved) {
        let problem = self.problem;
        self.in_prefix[v] = false;
        for &s in &self.shape.succs[v] {
            self.preds_in[s as usize] -= 1;
        }
        self.bits[v / 64] &= !(1 << (v % 64));
        self.prefix_nodes -= 1;
        self.first_missing = saved.first_missing;
        self.last_held = saved.last_held;
        self.prefix_fastest = saved.prefix_fastest;
        self.prefix_suffix_secs = saved.prefix_suffix_secs;
        let (latest, sum) = saved.latest_entry;
        self.prefix_by_latest[latest] = sum;
        self.prefix_last_secs = saved.prefix_last_secs;
        self.prefix_activation -= problem.activation_bytes(v);
        self.prefix_weight_inputs -= problem.weight_input_bytes(v);
        for &f in &self.shape.flows_out[v] {
            self.open_bytes -= problem.flows()[f as usize].bytes;
            self.close(f);
        }
        for &f in &self.shape.flows_in[v] {
            let flow = &problem.flows()[f as usize];
            if self.readers_in[f as usize] as usize == flow.consumers.len() {
                self.open_bytes += flow.bytes;
                self.open(f);
            }
            self.readers_in[f as usize] -= 1;
        }
        for &p in &problem.node_params[v] {
            let param = &problem.params()[p as usize];
            if self.param_readers_in[p as usize] as usize == param.uses.len() {
                self.closed_param_bytes -= param.footprint_bytes;
            }
            self.stage_param_readers[stage][p as usize] -= 1;
            self.param_readers_in[p as usize] -= 1;
        }
    }

    /// The stage is complete: it must hold a node and, with the gradients of what it sends,
    /// stay within the bound; then the next stage.
    fn close_stage(&mut self, fill: &StageFill) -> Outcome {
        if fill.nodes == 0 {
            return Outcome::Exhausted;
        }
        let stage = fill.stage;
        let gradient_secs = if self.training() {
            self.problem
                .receive_secs(stage + 1, self.open_flows.len(), self.open_bytes)
        } else {
            0.0
        };
        if fill.compute_secs + fill.receive_secs + gradient_secs > self.bound {
            return Outcome::Exhausted;
        }
        self.enter_stage(stage + 1)
    }

    fn training(&self) -> bool {
        matches!(
            self.problem.settings().mode,
            pipecut_cost::Mode::Training { .. }
        )
    }

    /// The last stage takes every node left: checks it, and records the plan when it is better.
    fn last_stage(&mut self) -> Outcome {
        let (problem, shape) = (self.problem, self.shape);
        let (n, k) = (problem.node_count(), problem.stage_count());
        let stage = k - 1;
        if self.prefix_nodes == n {
            return Outcome::Exhausted;
        }
        let receive_secs = problem.receive_secs(stage, self.open_flows.len(), self.open_bytes);
        let compute_secs = shape.total_last_secs - self.prefix_last_secs;
        if compute_secs + receive_secs > self.bound {
            return Outcome::Exhausted;
        }
        let fill = StageFill {
            stage,
            receive_secs,
            received_bytes: self.open_bytes,
            compute_secs,
            activation_bytes: shape.total_activation - self.prefix_activation,
            weight_input_bytes: shape.total_weight_inputs - self.prefix_weight_inputs,
            param_bytes: shape.total_param_bytes - self.closed_param_bytes,
            nodes: n - self.prefix_nodes,
            end: n,
        };
        let pinned_inside = shape
            .pinned_flows
            .iter()
            .any(|&f| !self.in_prefix[problem.flows()[f as usize].producer as usize]);
        if pinned_inside || !self.fits(stage, &fill) {
            return Outcome::Exhausted;
        }
        let plan: Vec<StageId> = (0..n)
            .map(|v| {
                if self.in_prefix[v] {
                    StageId(self.stage_of[v])
                } else {
                    StageId(stage as u32)
                }
            })
            .collect();
        if problem.check_assignment(&plan).is_err() {
            // Never expected (the walk builds only valid plans); not a plan, so not counted.
            return Outcome::Exhausted;
        }
        let evaluation = problem.evaluate(&plan);
        if !evaluation.fits() {
            return Outcome::Exhausted;
        }
        if evaluation.bottleneck_secs < problem.evaluate(&self.best).bottleneck_secs {
            self.best = plan;
        }
        // Below the new incumbent, or (should the evaluation disagree with the search's sums by
        // rounding) below the current bound, so that the search always moves on.
        let next = (evaluation.bottleneck_secs * (1.0 - RELATIVE_TOLERANCE))
            .min(self.bound * (1.0 - RELATIVE_TOLERANCE));
        self.set_bound(next);
        Outcome::Found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::bounds::tests::{brute_force_secs, dag};
    use std::time::Duration;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[test]
    fn finds_the_interleaved_optimum_a_topological_order_misses() {
        // 0 → {1, 2} → 3 with 1 slow and 2 fast: the best 2-stage cut puts 0 and 1 together
        // and 2 with 3 whatever the DP's order.
        let p = dag(&[1.0, 3.0, 2.0, 2.0], &[(0, 1), (0, 2), (1, 3), (2, 3)], 2);
        let start = p.contiguous_assignment(&[0, 1]);
        let run = solve(&p, &start, far(), None);
        assert_eq!(run.end, SearchEnd::Proven);
        let found = p.evaluate(&run.stage_of).bottleneck_secs;
        assert!(
            (found - brute_force_secs(&p)).abs() <= 1e-9 * found,
            "{found}"
        );
    }

    #[test]
    fn a_work_limit_stops_the_search_at_the_same_point_on_every_machine() {
        // A binary tree of 20 nodes (wide: many ideals) on 4 stages.
        let times: Vec<f64> = (0..20).map(|v| 1.0 + (v % 5) as f64).collect();
        let edges: Vec<(u32, u32)> = (1..20u32).map(|v| ((v - 1) / 2, v)).collect();
        let p = dag(&times, &edges, 4);
        let start = crate::partition::dp::solve(&p).unwrap().stage_of;
        let unlimited = solve(&p, &start, far(), None);
        assert_eq!(unlimited.end, SearchEnd::Proven);
        assert!(unlimited.work > 10, "{}", unlimited.work);
        let a = solve(&p, &start, far(), Some(10));
        let b = solve(&p, &start, far(), Some(10));
        assert_eq!(a.end, SearchEnd::WorkLimit);
        assert_eq!(a.stage_of, b.stage_of);
        assert_eq!(a.work, b.work);
    }

    #[test]
    fn a_floor_proven_beside_the_search_ends_it_with_the_plan_it_proves_alone() {
        // A binary tree of 22 nodes on 4 stages, from a start worse than the optimum.
        let n = 22;
        let times: Vec<f64> = (0..n).map(|v| 1.0 + (v % 7) as f64).collect();
        let edges: Vec<(u32, u32)> = (1..n).map(|v| ((v - 1) / 2, v)).collect();
        let p = dag(&times, &edges, 4);
        let start = p.contiguous_assignment(&[0, 1, 2]);
        let alone = solve(&p, &start, far(), None);
        assert_eq!(alone.end, SearchEnd::Proven);
        let optimum = p.evaluate(&alone.stage_of).bottleneck_secs;
        assert!(optimum < p.evaluate(&start).bottleneck_secs);
        // No floor, a floor too low to end anything and the optimum itself: the same plan, and
        // the optimum as floor ends the search no later than the search alone.
        for floor in [0.0, optimum * 0.5, optimum] {
            let proven_floor = AtomicU64::new(f64::to_bits(floor));
            let beside = solve_beside(&p, &start, far(), &proven_floor);
            assert_eq!(beside.end, SearchEnd::Proven, "floor {floor}");
            assert_eq!(beside.stage_of, alone.stage_of, "floor {floor}");
            assert!(beside.work <= alone.work, "floor {floor}");
        }
        // From the optimum, the search alone still has to prove it; with the optimum proven
        // elsewhere it ends at its first look at the clock.
        let from_optimum = solve(&p, &alone.stage_of, far(), None);
        assert!(from_optimum.work > CLOCK_EVERY, "{}", from_optimum.work);
        let proven_floor = AtomicU64::new(f64::to_bits(optimum));
        let beside = solve_beside(&p, &alone.stage_of, far(), &proven_floor);
        assert_eq!(beside.end, SearchEnd::Proven);
        assert_eq!(beside.stage_of, alone.stage_of);
        assert_eq!(beside.work, CLOCK_EVERY);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

        /// With memory binding (random activations, tensor sizes and capacities), the search's
        /// node-by-node memory pruning never loses the best plan that fits.
        #[test]
        fn memory_pruning_keeps_the_best_plan_that_fits(
            n in 3usize..7,
            stages in 2usize..4,
            times in proptest::collection::vec(0.1f64..4.0, 7),
            activations in proptest::collection::vec(0u64..4_000, 7),
            bytes in proptest::collection::vec(0u64..4_000, 21),
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 21),
            capacity in 2_000u64..12_000,
            zero_bubble in proptest::prelude::any::<bool>(),
            weight_inputs in proptest::collection::vec(0u64..4_000, 7),
            microbatches in 1u32..6,
        ) {
            proptest::prop_assume!(stages <= n);
            let edges = crate::partition::bounds::tests::edges_from_bits(n, &edge_bits);
            let mut p = if zero_bubble {
                crate::partition::bounds::tests::zero_bubble_dag(&times[..n], &edges, stages, microbatches, &weight_inputs)
            } else {
                dag(&times[..n], &edges, stages)
            };
            p.activation_bytes = activations[..n].to_vec();
            for (flow, &b) in p.flows.iter_mut().zip(&bytes) {
                flow.bytes = b;
            }
            for stage in &mut p.stages {
                stage.capacity_bytes = capacity;
            }
            let Some(start) = crate::partition::dp::solve(&p) else {
                // No contiguous plan fits: the search needs a fitting start.
                return Ok(());
            };
            let optimum = crate::partition::bounds::tests::brute_force_fitting_secs(&p);
            // The walk first, and the lattice first (whose plans may not fit: the walk then
            // takes over).
            for first_walk_units in [FIRST_WALK_UNITS, 0] {
                let run = solve_walking_first(&p, &start.stage_of, far(), None, None, first_walk_units);
                proptest::prop_assert_eq!(run.end, SearchEnd::Proven);
                let found = p.evaluate(&run.stage_of);
                proptest::prop_assert!(found.fits());
                proptest::prop_assert!(
                    found.bottleneck_secs <= optimum * (1.0 + 2e-9),
                    "found {} optimum {}", found.bottleneck_secs, optimum
                );
            }
        }

        /// On random small DAGs (random times and flows, one device kind or an A100 then L4s
        /// with random per-node slowdowns, both modes) the search proves the optimum that
        /// enumerating every convex assignment finds.
        #[test]
        fn the_search_proves_the_brute_force_optimum(
            n in 2usize..8,
            stages in 2usize..4,
            times in proptest::collection::vec(0.0f64..4.0, 8),
            bytes in proptest::collection::vec(0u64..400_000_000, 28),
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 28),
            training in proptest::prelude::any::<bool>(),
            mixed in proptest::prelude::any::<bool>(),
            slowdown in proptest::collection::vec(0.5f64..3.0, 8),
            shared_flows in proptest::prelude::any::<bool>(),
        ) {
            proptest::prop_assume!(stages <= n);
            let edges = crate::partition::bounds::tests::edges_from_bits(n, &edge_bits);
            let settings = crate::partition::problem::CostSettings {
                mode: if training {
                    pipecut_cost::Mode::training()
                } else {
                    pipecut_cost::Mode::Inference
                },
                // GPipe makes the helper's cluster an A100 then L4s: two device kinds.
                schedule: if mixed {
                    pipecut_cost::Schedule::GPipe
                } else {
                    crate::partition::problem::CostSettings::default().schedule
                },
                ..Default::default()
            };
            let mut p = crate::partition::bounds::tests::dag_in(&times[..n], &edges, stages, settings);
            let first_kind = p.stages[0].kind;
            for (kind, secs) in p.node_secs.iter_mut().enumerate() {
                if kind != first_kind {
                    for (t, f) in secs.iter_mut().zip(&slowdown) {
                        *t *= f;
                    }
                }
            }
            if shared_flows {
                // One tensor per producer, read by all its successors: one message however
                // many of them are on later stages.
                p = crate::partition::bounds::tests::with_shared_flows(p, &edges, &bytes);
            } else {
                for (flow, &b) in p.flows.iter_mut().zip(&bytes) {
                    flow.bytes = b;
                }
            }
            let start = p.contiguous_assignment(&(0..stages).collect::<Vec<_>>());
            let run = solve(&p, &start, far(), None);
            proptest::prop_assert_eq!(run.end, SearchEnd::Proven);
            proptest::prop_assert!(p.check_assignment(&run.stage_of).is_ok());
            let found = p.evaluate(&run.stage_of).bottleneck_secs;
            let optimum = brute_force_secs(&p);
            proptest::prop_assert!(
                found <= optimum * (1.0 + 2e-9),
                "found {} optimum {}", found, optimum
            );
            // The lattice alone settles it too: memory is not binding here, so it never hands
            // over to the walk.
            let shape = Shape::new(&p);
            let mut search = Search::new(&p, &shape, &start, far(), None);
            proptest::prop_assert_eq!(search.settle_by_lattice(), Some(SearchEnd::Proven));
            proptest::prop_assert!(p.check_assignment(&search.best).is_ok());
            let settled = p.evaluate(&search.best).bottleneck_secs;
            proptest::prop_assert!(
                settled <= optimum * (1.0 + 2e-9),
                "settled {} optimum {}", settled, optimum
            );
        }
    }
}
