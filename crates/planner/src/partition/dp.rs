//! The exact solver over a fixed topological order: every stage is a contiguous segment of the
//! order, and among such partitions it finds one with the smallest bottleneck, then the fewest
//! bytes crossing boundaries.
//!
//! Contiguous segments of a topological order are always convex and ordered, so the answer is a
//! valid plan; it is optimal for this order (not necessarily over all convex partitions of the
//! DAG, which the MILP decides).
//!
//! # Method
//! 1. Memory does not depend on the bottleneck, so for every stage `k` and start `i` the furthest
//!    end `reach_k(i)` that still fits is computed once. Parameters shared by several nodes count
//!    once per stage, so a segment's parameter bytes are a count of *distinct* weights in a
//!    range; a Fenwick tree answers it offline, activating each weight use when the segment start
//!    passes its previous use.
//! 2. For a candidate bottleneck `B`, a sweep decides whether `K` segments can cover the order
//!    with every stage time `≤ B`: segment `[i, j)` on stage `k` takes
//!    `C_k(j) − C_k(i) + R_k(i) + G_k(j)` (prefix compute, receive at its start, in training the
//!    gradients received at its end). For each end `j` the best start is the reachable `i` with
//!    the largest `C_k(i) − R_k(i)` whose memory reach covers `j`, kept in a heap.
//!    Each stage sweeps only a window of the order: from its first reachable start to the last
//!    end some start can afford, without ends whose remaining nodes cannot fit in the remaining
//!    stages at `B`. Near the optimum a window is a few stages wide.
//! 3. Bisection on `B` between the lower bound and a feasible value, until the bracket is within
//!    [`RELATIVE_TOLERANCE`]; the bracket is first closed from below with steps growing from
//!    0.1 % of the lower bound, where the optimum usually lies and probes are cheapest. The
//!    infeasible end of the bracket is a proven lower bound for this order.
//! 4. At the feasible `B`, a second DP over the same transitions minimises the bytes crossing
//!    boundaries, with a segment tree over starts ranked by `C_k(i) − R_k(i)`.
//!
//! # Complexity
//! O(K · n · log² n) for the memory reaches, O(K · n · log n) per bisection step and for the
//! tie-break in the worst case (windows as wide as the order), with about 40 steps; near the
//! optimum a step costs O(K · w · log n) for windows of w positions. GPT-3-175B's 3,949 nodes
//! in 98 training stages solve in 54 ms (0.73 s with whole-order sweeps).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::problem::{Evaluation, PartitionProblem, StageId};
use pipecut_cost::Mode;

/// Bisection stops when the bracket is this small relative to the bottleneck: far below the
/// precision of any cost model, and reached in about 50 steps from a factor-of-10⁶ bracket.
pub const RELATIVE_TOLERANCE: f64 = 1e-9;

/// Whether `candidate` is strictly better than `best` by the DP's two objectives: a smaller
/// bottleneck beyond [`RELATIVE_TOLERANCE`], or the same bottleneck with fewer bytes crossing.
/// Every solver that improves on an incumbent (MILP, coarsening's refinement) asks this.
pub(crate) fn better(problem: &PartitionProblem, candidate: &[StageId], best: &[StageId]) -> bool {
    if problem.check_assignment(candidate).is_err() {
        return false;
    }
    let c = problem.evaluate(candidate);
    if !c.fits() {
        return false;
    }
    let b = problem.evaluate(best);
    if !b.fits() {
        return true;
    }
    c.bottleneck_secs < b.bottleneck_secs * (1.0 - RELATIVE_TOLERANCE)
        || (c.bottleneck_secs <= b.bottleneck_secs * (1.0 + RELATIVE_TOLERANCE)
            && c.cut_bytes < b.cut_bytes)
}

/// A partition into contiguous segments of the order.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderSolution {
    /// Start position of each stage; stage `s` ends where stage `s + 1` starts.
    pub starts: Vec<usize>,
    /// Stage of every position.
    pub stage_of: Vec<StageId>,
    /// Its bottleneck.
    pub bottleneck_secs: f64,
    /// Its figures: evaluated once here, not again by each caller (a million nodes take a
    /// tenth of a second).
    pub evaluation: Evaluation,
    /// A bottleneck no contiguous partition of this order can beat (proven by infeasibility).
    pub order_lower_bound_secs: f64,
    /// Whether the bisection closed, so the plan is optimal for the order; false when a
    /// deadline stopped it ([`solve_until`]) or the plan is [`balanced_split`]'s.
    pub complete: bool,
}

/// Per-stage tables shared by the feasibility sweep and the tie-break.
struct Tables {
    /// Prefix compute time per stage kind: `prefix[kind][i]` = time of positions `< i`.
    prefix: Vec<Vec<f64>>,
    /// Prefix of every node's time on its fastest kind (for the remaining-work test).
    fastest_prefix: Vec<f64>,
    /// Flows and bytes live across each boundary `i` (produced before `i`, read at or after).
    cross_count: Vec<usize>,
    cross_bytes: Vec<u64>,
    /// `reach_by_key[reach_key[k]][i]`: the furthest end of a stage-`k` segment starting at
    /// `i` that fits memory (`i` itself when none does), see [`Tables::reach`]. Stages with the
    /// same capacity and in-flight counts share one row, and positions are `u32`, so that a
    /// million-node model at K = 64 keeps 4 MB per distinct row, not 8 MB per stage.
    reach_by_key: Vec<Vec<u32>>,
    reach_key: Vec<usize>,
    training: bool,
}

impl Tables {
    fn new(problem: &PartitionProblem) -> Tables {
        let n = problem.node_count();
        let prefix = problem
            .node_secs
            .iter()
            .map(|secs| {
                let mut p = Vec::with_capacity(n + 1);
                p.push(0.0);
                let mut sum = 0.0;
                for &s in secs {
                    sum += s;
                    p.push(sum);
                }
                p
            })
            .collect();
        let mut count_delta = vec![0i64; n + 2];
        let mut bytes_delta = vec![0i128; n + 2];
        for flow in problem.flows() {
            let last = *flow.consumers.last().expect("flows have readers") as usize;
            let first_boundary = flow.producer as usize + 1;
            if last < first_boundary {
                continue;
            }
            count_delta[first_boundary] += 1;
            count_delta[last + 1] -= 1;
            bytes_delta[first_boundary] += flow.bytes as i128;
            bytes_delta[last + 1] -= flow.bytes as i128;
        }
        let (mut count, mut bytes) = (0i64, 0i128);
        let mut cross_count = Vec::with_capacity(n + 1);
        let mut cross_bytes = Vec::with_capacity(n + 1);
        for i in 0..=n {
            count += count_delta[i];
            bytes += bytes_delta[i];
            cross_count.push(count as usize);
            cross_bytes.push(bytes as u64);
        }
        let mut fastest_prefix = Vec::with_capacity(n + 1);
        fastest_prefix.push(0.0);
        let mut sum = 0.0;
        for p in 0..n {
            sum += problem
                .node_secs
                .iter()
                .map(|secs| secs[p])
                .fold(f64::INFINITY, f64::min);
            fastest_prefix.push(sum);
        }
        let mut tables = Tables {
            prefix,
            fastest_prefix,
            cross_count,
            cross_bytes,
            reach_by_key: Vec::new(),
            reach_key: Vec::new(),
            training: matches!(problem.settings().mode, Mode::Training { .. }),
        };
        (tables.reach_by_key, tables.reach_key) = memory_reaches(problem, &tables);
        tables
    }

    /// The furthest end of a stage's segment starting at `i` that fits its memory.
    fn reach(&self, stage: usize, i: usize) -> usize {
        self.reach_by_key[self.reach_key[stage]][i] as usize
    }

    fn compute(&self, problem: &PartitionProblem, stage: usize, i: usize, j: usize) -> f64 {
        let kind = problem.stages()[stage].kind;
        self.prefix[kind][j] - self.prefix[kind][i]
    }

    /// Receive time at the start `i` of stage `k`.
    fn receive(&self, problem: &PartitionProblem, stage: usize, i: usize) -> f64 {
        if stage == 0 {
            return 0.0;
        }
        problem.receive_secs(stage, self.cross_count[i], self.cross_bytes[i])
    }

    /// Gradient receive time at the end `j` of stage `k` (training only).
    fn gradient_receive(&self, problem: &PartitionProblem, stage: usize, j: usize) -> f64 {
        if !self.training || stage + 1 >= problem.stage_count() || j >= problem.node_count() {
            return 0.0;
        }
        problem.receive_secs(stage + 1, self.cross_count[j], self.cross_bytes[j])
    }

    /// `C_k(i) − R_k(i)`: a start with a larger key leaves more room for the segment.
    fn start_key(&self, problem: &PartitionProblem, stage: usize, i: usize) -> f64 {
        self.prefix[problem.stages()[stage].kind][i] - self.receive(problem, stage, i)
    }

    /// Whether the nodes from `j` on can be covered by `stages_after` further non-empty stages
    /// of at most `bound` each: a necessary condition (communication ignored, every node on its
    /// fastest kind), with a relative slack so rounding never rejects a feasible end.
    fn can_finish(&self, j: usize, stages_after: usize, bound: f64, n: usize) -> bool {
        if stages_after == 0 {
            return j == n;
        }
        if n - j < stages_after {
            return false;
        }
        let rest = self.fastest_prefix[n] - self.fastest_prefix[j];
        let budget = stages_after as f64 * bound;
        rest <= budget + 1e-9 * (budget + self.fastest_prefix[n])
    }

    /// `C_k(j) + G_k(j)`: what an end costs.
    fn end_key(&self, problem: &PartitionProblem, stage: usize, j: usize) -> f64 {
        self.prefix[problem.stages()[stage].kind][j] + self.gradient_receive(problem, stage, j)
    }
}

/// Fenwick tree over positions holding byte counts.
struct Fenwick(Vec<u64>);

impl Fenwick {
    fn add(&mut self, position: usize, bytes: u64) {
        let mut i = position + 1;
        while i < self.0.len() {
            self.0[i] += bytes;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum of positions `< end`.
    fn prefix(&self, end: usize) -> u64 {
        let (mut i, mut sum) = (end, 0u64);
        while i > 0 {
            sum += self.0[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }
}

/// For every distinct stage memory (capacity and in-flight counts) and start, the furthest end
/// that fits, and the row of each stage.
fn memory_reaches(problem: &PartitionProblem, tables: &Tables) -> (Vec<Vec<u32>>, Vec<usize>) {
    let n = problem.node_count();
    let (mut activation_prefix, mut weight_input_prefix) = (vec![0u64; n + 1], vec![0u64; n + 1]);
    for p in 0..n {
        activation_prefix[p + 1] = activation_prefix[p] + problem.activation_bytes(p);
        weight_input_prefix[p + 1] = weight_input_prefix[p] + problem.weight_input_bytes(p);
    }
    // Each use of a weight counts for segments starting after its previous use.
    let mut activations_at: Vec<Vec<(usize, u64)>> = vec![Vec::new(); n + 1];
    for param in problem.params() {
        let mut previous: Option<u32> = None;
        for &u in &param.uses {
            let from = previous.map_or(0, |q| q as usize + 1);
            activations_at[from].push((u as usize, param.footprint_bytes));
            previous = Some(u);
        }
    }
    // Stages with the same capacity and peak moments share their reach; the stage with a key's
    // first index stands for it.
    let key_of = |s: usize| {
        let stage = &problem.stages()[s];
        (stage.capacity_bytes, stage.held.clone())
    };
    let mut keys: Vec<(u64, Vec<pipecut_cost::memory::Held>)> =
        (0..problem.stage_count()).map(key_of).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut by_key = Vec::with_capacity(keys.len());
    for (capacity, held) in &keys {
        let representative = (0..problem.stage_count())
            .find(|&s| {
                problem.stages()[s].capacity_bytes == *capacity && problem.stages()[s].held == *held
            })
            .expect("every key comes from a stage");
        let mut tree = Fenwick(vec![0; n + 1]);
        let mut reach = vec![0u32; n + 1];
        let mut previous_reach = 0;
        for i in 0..=n {
            for &(u, bytes) in &activations_at[i] {
                tree.add(u, bytes);
            }
            if i == n {
                reach[i] = n as u32;
                continue;
            }
            let base = tree.prefix(i);
            let fits = |j: usize| {
                problem.peak_bytes(
                    representative,
                    tree.prefix(j) - base,
                    tables.cross_bytes[i],
                    activation_prefix[j] - activation_prefix[i],
                    weight_input_prefix[j] - weight_input_prefix[i],
                ) <= *capacity
            };
            let lo = furthest_fitting_end(fits, i, n, previous_reach);
            reach[i] = lo as u32;
            previous_reach = lo;
        }
        by_key.push(reach);
    }
    // Pinned cuts cap every stage's reach alike: a segment may not hold a pinned tensor's
    // producer with one of its readers.
    let pin_reach = problem.pin_reach();
    for reach in &mut by_key {
        for (r, &cap) in reach.iter_mut().zip(&pin_reach) {
            *r = (*r).min(cap as u32);
        }
    }
    let key_of_stage = (0..problem.stage_count())
        .map(|s| {
            keys.binary_search(&key_of(s))
                .expect("every stage's key was collected")
        })
        .collect();
    (by_key, key_of_stage)
}

/// The furthest end `j` in `i..=n` with `fits(j)`, `i` when none after it does; `fits` must
/// hold on a prefix of the ends (memory grows with the end). Neighbouring starts reach about as
/// far: the search gallops from `previous_reach` to bracket this one (a few probes instead of
/// log n), then bisects the bracket.
fn furthest_fitting_end(
    fits: impl Fn(usize) -> bool,
    i: usize,
    n: usize,
    previous_reach: usize,
) -> usize {
    let guess = i.max(previous_reach);
    let (mut lo, mut hi) = if fits(guess) {
        let (mut lo, mut step) = (guess, 1);
        while lo < n && fits((lo + step).min(n)) {
            lo = (lo + step).min(n);
            step *= 2;
        }
        (lo, (lo + step).min(n))
    } else if guess == i {
        // Not even an empty segment fits (memory only grows with the end).
        (i, i)
    } else {
        // The reach is below `guess`: gallop down until an end fits or `i` is met.
        let (mut hi, mut step) = (guess - 1, 1);
        loop {
            let probe = hi.saturating_sub(step).max(i);
            if probe == i {
                break (i, hi);
            }
            if fits(probe) {
                break (probe, hi);
            }
            hi = probe - 1;
            step *= 2;
        }
    };
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// A heap entry ordered by its key; ties by position so that runs are deterministic.
#[derive(PartialEq)]
struct Start {
    key: f64,
    position: usize,
    reach: usize,
}
impl Eq for Start {}
impl PartialOrd for Start {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Start {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .total_cmp(&other.key)
            .then_with(|| other.position.cmp(&self.position))
    }
}

/// Whether `K` segments with every stage time `≤ bound` can cover the order.
///
/// Only a window of positions is swept per stage: ends before the first reachable start are
/// unreachable, the sweep stops once no start can afford a further end, and an end is dropped
/// when the nodes after it cannot fit in the remaining stages at `bound` (even each on its
/// fastest device kind). Near the optimum the window is a few stages wide instead of the whole
/// order, which is what makes the bisection cheap on long orders with many stages.
fn feasible(problem: &PartitionProblem, tables: &Tables, bound: f64) -> bool {
    if bound == f64::INFINITY {
        return fits_at_all(problem, tables);
    }
    let n = problem.node_count();
    let k = problem.stage_count();
    let mut reachable = vec![false; n + 1];
    let mut next = vec![false; n + 1];
    reachable[0] = true;
    // Smallest and largest reachable position.
    let (mut first, mut last) = (0usize, 0usize);
    let mut heap = BinaryHeap::new();
    for stage in 0..k {
        let kind = problem.stages()[stage].kind;
        let stages_after = k - 1 - stage;
        let (mut next_first, mut next_last) = (usize::MAX, 0usize);
        // The largest key ever pushed: an end whose compute alone exceeds it by more than the
        // bound is out of reach of every start (receives and gradient receives only add).
        let mut best_key = f64::NEG_INFINITY;
        heap.clear();
        for (j, reachable_end) in next.iter_mut().enumerate().skip(first + 1) {
            let i = j - 1;
            if i <= last && reachable[i] && tables.reach(stage, i) >= j {
                let key = tables.start_key(problem, stage, i);
                best_key = best_key.max(key);
                heap.push(Start {
                    key,
                    position: i,
                    reach: tables.reach(stage, i),
                });
            }
            while heap.peek().is_some_and(|top| top.reach < j) {
                heap.pop();
            }
            if i >= last && (heap.is_empty() || tables.prefix[kind][j] - bound > best_key) {
                break;
            }
            // Between reachable starts the heap may be empty (memory reaches leave gaps).
            let Some(top) = heap.peek() else {
                continue;
            };
            if top.key >= tables.end_key(problem, stage, j) - bound
                && tables.can_finish(j, stages_after, bound, n)
            {
                *reachable_end = true;
                next_first = next_first.min(j);
                next_last = j;
            }
        }
        reachable[first..=last].fill(false);
        std::mem::swap(&mut reachable, &mut next);
        if next_first == usize::MAX {
            return false;
        }
        (first, last) = (next_first, next_last);
    }
    reachable[n]
}

/// Whether `K` non-empty segments that fit memory cover the order, whatever their times: an end
/// is reachable when some reachable start before it reaches it, so a running maximum of the
/// reaches replaces the heap.
fn fits_at_all(problem: &PartitionProblem, tables: &Tables) -> bool {
    let n = problem.node_count();
    let mut reachable = vec![false; n + 1];
    reachable[0] = true;
    for stage in 0..problem.stage_count() {
        let mut next = vec![false; n + 1];
        let mut furthest = 0;
        for j in 1..=n {
            if reachable[j - 1] {
                furthest = furthest.max(tables.reach(stage, j - 1));
            }
            next[j] = furthest >= j;
        }
        reachable = next;
    }
    reachable[n]
}

/// Segment tree of (comm bytes, start) minima over starts ranked by key.
struct MinTree {
    size: usize,
    cells: Vec<(u64, usize)>,
}

const EMPTY: (u64, usize) = (u64::MAX, usize::MAX);

impl MinTree {
    fn new(n: usize) -> MinTree {
        let size = n.next_power_of_two().max(1);
        MinTree {
            size,
            cells: vec![EMPTY; 2 * size],
        }
    }
    fn set(&mut self, rank: usize, value: (u64, usize)) {
        let mut i = rank + self.size;
        self.cells[i] = value;
        while i > 1 {
            i /= 2;
            self.cells[i] = self.cells[2 * i].min(self.cells[2 * i + 1]);
        }
    }
    /// Minimum over ranks `>= from`.
    fn suffix_min(&self, from: usize) -> (u64, usize) {
        let (mut lo, mut hi) = (from + self.size, 2 * self.size);
        let mut best = EMPTY;
        while lo < hi {
            if lo & 1 == 1 {
                best = best.min(self.cells[lo]);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                best = best.min(self.cells[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
        best
    }
}

/// Among partitions with every stage time `≤ bound`, one with the fewest boundary bytes.
///
/// The same transitions as [`feasible`], swept over the same windows (positions outside them
/// belong to no complete partition, so dropping them changes no choice).
fn fewest_bytes(problem: &PartitionProblem, tables: &Tables, bound: f64) -> Option<Vec<usize>> {
    let n = problem.node_count();
    let k = problem.stage_count();
    // best[i]: fewest bytes to cover [0, i) with the stages so far; parent[s][j]: start of stage s
    // in the best cover of [0, j) by stages 0..=s.
    let mut best = vec![u64::MAX; n + 1];
    let mut next = vec![u64::MAX; n + 1];
    best[0] = 0;
    let (mut first, mut last) = (0usize, 0usize);
    let mut parent = vec![vec![u32::MAX; n + 1]; k];
    for (stage, parent) in parent.iter_mut().enumerate() {
        let kind = problem.stages()[stage].kind;
        let stages_after = k - 1 - stage;
        // The window's starts ranked by key (ties by position), and in the order they expire.
        let starts: Vec<usize> = (first..=last).filter(|&i| best[i] != u64::MAX).collect();
        let keys: Vec<f64> = starts
            .iter()
            .map(|&i| tables.start_key(problem, stage, i))
            .collect();
        let best_key = keys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut ranked: Vec<usize> = (0..starts.len()).collect();
        ranked.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]).then(starts[a].cmp(&starts[b])));
        let ranked_keys: Vec<f64> = ranked.iter().map(|&r| keys[r]).collect();
        let mut rank_of = vec![0usize; starts.len()];
        for (rank, &r) in ranked.iter().enumerate() {
            rank_of[r] = rank;
        }
        let mut expiring: Vec<usize> = (0..starts.len()).collect();
        expiring.sort_by_key(|&r| (tables.reach(stage, starts[r]), starts[r]));
        let (mut entered, mut expired, mut live) = (0usize, 0usize, 0usize);
        let mut tree = MinTree::new(starts.len());
        let (mut next_first, mut next_last) = (usize::MAX, 0usize);
        for j in first + 1..=n {
            let i = j - 1;
            if entered < starts.len() && starts[entered] == i {
                if tables.reach(stage, i) >= j {
                    let entering = if stage == 0 { 0 } else { tables.cross_bytes[i] };
                    tree.set(rank_of[entered], (best[i].saturating_add(entering), i));
                    live += 1;
                }
                entered += 1;
            }
            while expired < starts.len() && tables.reach(stage, starts[expiring[expired]]) < j {
                let r = expiring[expired];
                if tree.cells[rank_of[r] + tree.size] != EMPTY {
                    tree.set(rank_of[r], EMPTY);
                    live -= 1;
                }
                expired += 1;
            }
            if i >= last && (live == 0 || tables.prefix[kind][j] - bound > best_key) {
                break;
            }
            if !tables.can_finish(j, stages_after, bound, n) {
                continue;
            }
            // Starts whose key is at least the end's key minus the bound.
            let threshold = tables.end_key(problem, stage, j) - bound;
            let from = ranked_keys.partition_point(|&key| key < threshold);
            let (bytes, start) = tree.suffix_min(from);
            if bytes != u64::MAX {
                next[j] = bytes;
                parent[j] = start as u32;
                next_first = next_first.min(j);
                next_last = j;
            }
        }
        best[first..=last].fill(u64::MAX);
        std::mem::swap(&mut best, &mut next);
        if next_first == usize::MAX {
            return None;
        }
        (first, last) = (next_first, next_last);
    }
    if best[n] == u64::MAX {
        return None;
    }
    let mut starts = vec![0usize; k];
    let mut end = n;
    for stage in (0..k).rev() {
        let start = parent[stage][end] as usize;
        starts[stage] = start;
        end = start;
    }
    Some(starts)
}

/// Whether any contiguous partition of the order fits memory, whatever its time.
pub fn fits_memory(problem: &PartitionProblem) -> bool {
    problem.node_count() >= problem.stage_count()
        && feasible(problem, &Tables::new(problem), f64::INFINITY)
}

/// A split of the order into stages of about equal compute (on the fastest device kind, by
/// cumulative time), every stage at least one node: the plan that exists before any search, so
/// that a time limit spent on the model's costs still returns one. `None` when it does not fit
/// memory (or there are fewer nodes than stages); the DP is needed then.
///
/// # Complexity
/// O(n·K) for the times, O(n + E) to evaluate the split.
pub fn balanced_split(problem: &PartitionProblem) -> Option<OrderSolution> {
    balanced_split_at(problem, None)
}

/// [`balanced_split`] whose stages start only where `may_start[v]` holds (when given): a
/// position where no pair the cut constraints join is split, so that a model too large for
/// the constraints' groups within the time limit still gets a plan that keeps them. `None`
/// also when too few positions may start a stage.
pub fn balanced_split_at(
    problem: &PartitionProblem,
    may_start: Option<&[bool]>,
) -> Option<OrderSolution> {
    let n = problem.node_count();
    let k = problem.stage_count();
    if n < k || k == 0 {
        return None;
    }
    let allowed = |v: usize| may_start.is_none_or(|m| m[v]);
    // How many positions after `v` may start a stage (`n - 1 - v` when all may).
    let mut starts_after = vec![0u32; n];
    for v in (0..n.saturating_sub(1)).rev() {
        starts_after[v] = starts_after[v + 1] + u32::from(allowed(v + 1));
    }
    let fastest = super::bounds::fastest_secs(problem);
    let total: f64 = fastest.iter().sum();
    let mut starts = Vec::with_capacity(k);
    starts.push(0);
    let mut done = 0.0;
    for (v, secs) in fastest.iter().enumerate() {
        let stage = starts.len();
        // Leave a place to start each stage still to come.
        if stage < k && v > starts[stage - 1] && allowed(v) {
            let must_start = (starts_after[v] as usize) < k - stage;
            if must_start || done >= total * stage as f64 / k as f64 {
                starts.push(v);
            }
        }
        done += secs;
    }
    if starts.len() < k {
        return None;
    }
    let stage_of = problem.contiguous_assignment(&starts);
    let evaluation = problem.evaluate(&stage_of);
    evaluation.fits().then(|| OrderSolution {
        starts,
        stage_of,
        bottleneck_secs: evaluation.bottleneck_secs,
        order_lower_bound_secs: problem.lower_bound_secs().min(evaluation.bottleneck_secs),
        evaluation,
        complete: false,
    })
}

impl OrderSolution {
    /// A plan made elsewhere (`plan-cluster`'s search), as a start for the Planner: it stands
    /// when the time left allows no DP, and the DP's replaces it only when better. `None` when
    /// it does not fit. It proves nothing about the order (`complete` is false).
    pub(crate) fn given(problem: &PartitionProblem, stage_of: Vec<StageId>) -> Option<Self> {
        problem.check_assignment(&stage_of).ok()?;
        let evaluation = problem.evaluate(&stage_of);
        let starts = (0..problem.stage_count())
            .filter_map(|s| stage_of.iter().position(|&x| x.index() == s))
            .collect();
        evaluation.fits().then_some(OrderSolution {
            starts,
            stage_of,
            bottleneck_secs: evaluation.bottleneck_secs,
            order_lower_bound_secs: 0.0,
            evaluation,
            complete: false,
        })
    }
}

/// Solves the problem exactly over its topological order. `None` when no contiguous partition
/// into the problem's stages fits memory (or there are fewer nodes than stages).
pub fn solve(problem: &PartitionProblem) -> Option<OrderSolution> {
    solve_until(problem, None)
}

/// What [`solve_within`] found (`T`: the plan, [`OrderSolution`] here).
pub(crate) enum Within<T = OrderSolution> {
    /// No contiguous partition fits memory.
    DoesNotFit,
    /// Some fit, but none has every stage time at most the bound.
    Slower,
    /// [`solve`]'s plan: some partition is within the bound.
    Solved(T),
}

/// [`solve`] when some partition of the order (as the DP partitions: contiguous segments, each
/// within its stage's memory) has every stage time at most `bound`: one or two sweeps of the
/// DP's bisection rule a problem out for a search without solving it, on the tables the solve
/// then reuses.
pub(crate) fn solve_within(problem: &PartitionProblem, bound: f64) -> Within {
    if problem.node_count() < problem.stage_count() {
        return Within::DoesNotFit;
    }
    let tables = Tables::new(problem);
    if !feasible(problem, &tables, bound) {
        return match feasible(problem, &tables, f64::INFINITY) {
            true => Within::Slower,
            false => Within::DoesNotFit,
        };
    }
    match solve_on(problem, &tables, None) {
        Some(solution) => Within::Solved(solution),
        None => Within::DoesNotFit,
    }
}

/// [`solve`], whose bisection stops at `deadline` (when given) with the best feasible bound
/// found so far: the plan is then that bound's, `complete` is false, and the bracket's low end
/// is still a proven bound for the order. The memory reaches and the first feasibility sweeps
/// run whatever the deadline (without them there is no plan).
pub fn solve_until(problem: &PartitionProblem, deadline: Option<Instant>) -> Option<OrderSolution> {
    let n = problem.node_count();
    let k = problem.stage_count();
    if n < k {
        return None;
    }
    solve_on(problem, &Tables::new(problem), deadline)
}

/// [`solve_until`] on the problem's tables.
fn solve_on(
    problem: &PartitionProblem,
    tables: &Tables,
    deadline: Option<Instant>,
) -> Option<OrderSolution> {
    let (n, k) = (problem.node_count(), problem.stage_count());
    if !feasible(problem, tables, f64::INFINITY) {
        return None;
    }
    // Any segment's time is below its stage's whole-order compute plus the largest receives.
    let mut high: f64 = 0.0;
    for stage in 0..k {
        let worst_receive = (0..=n)
            .map(|i| tables.receive(problem, stage, i) + tables.gradient_receive(problem, stage, i))
            .fold(0.0, f64::max);
        high = high.max(tables.compute(problem, stage, 0, n) + worst_receive);
    }
    high = high.max(f64::MIN_POSITIVE) * (1.0 + 4.0 * RELATIVE_TOLERANCE);
    let mut low = problem.lower_bound_secs() * (1.0 - RELATIVE_TOLERANCE);
    // Whether a probe has set `high`: until one does it is the loose bound above.
    let mut tightened = false;
    if feasible(problem, tables, low) {
        // Only possible when every time is zero.
        high = low.max(0.0);
        low = 0.0;
        tightened = true;
    }
    // The optimum is usually within a few percent of the lower bound, and probes near it are
    // cheap (narrow windows), so the bracket is first closed from below with growing steps.
    let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut complete = true;
    let floor = low;
    let mut step = 1e-3;
    while floor > 0.0 && floor * (1.0 + step) < high {
        if past_deadline() {
            complete = false;
            break;
        }
        let probe = floor * (1.0 + step);
        if feasible(problem, tables, probe) {
            high = probe;
            tightened = true;
            break;
        }
        low = probe;
        step *= 8.0;
    }
    while complete && high - low > RELATIVE_TOLERANCE * high {
        if past_deadline() {
            complete = false;
            break;
        }
        let mid = 0.5 * (low + high);
        if feasible(problem, tables, mid) {
            high = mid;
            tightened = true;
        } else {
            low = mid;
        }
    }
    // Stopped before any probe fitted: covering the order within the loose bound would sweep
    // the whole order for every stage (13 s at a million nodes, far past a 1 s deadline), so
    // the balanced split stands instead when it fits.
    if !complete && !tightened {
        if let Some(mut split) = balanced_split(problem) {
            split.order_lower_bound_secs = low.min(split.bottleneck_secs);
            return Some(split);
        }
    }
    let starts = fewest_bytes(problem, tables, high)?;
    let stage_of = problem.contiguous_assignment(&starts);
    let evaluation = problem.evaluate(&stage_of);
    let bottleneck_secs = evaluation.bottleneck_secs;
    Some(OrderSolution {
        starts,
        stage_of,
        bottleneck_secs,
        order_lower_bound_secs: low.min(bottleneck_secs),
        evaluation,
        complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::tests::chain;
    use crate::partition::problem::CostSettings;
    use pipecut_cost::{Catalog, Cluster, DeviceId};

    fn problem(
        graph: &pipecut_ir::graph::Graph,
        spec: &str,
        settings: CostSettings,
    ) -> PartitionProblem {
        let cluster = Cluster::parse(spec, &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..cluster.device_count() as u32).map(DeviceId).collect();
        PartitionProblem::new(graph, &cluster, &devices, settings).unwrap()
    }

    /// Every contiguous partition, by enumeration of the K − 1 cut positions.
    fn brute_force(problem: &PartitionProblem) -> Option<(f64, u64)> {
        let n = problem.node_count();
        let k = problem.stage_count();
        let mut best: Option<(f64, u64)> = None;
        let mut starts = vec![0usize; k];
        fn recurse(
            problem: &PartitionProblem,
            starts: &mut Vec<usize>,
            s: usize,
            n: usize,
            best: &mut Option<(f64, u64)>,
        ) {
            if s == starts.len() {
                let stage_of = problem.contiguous_assignment(starts);
                let eval = problem.evaluate(&stage_of);
                if eval.fits() {
                    let candidate = (eval.bottleneck_secs, eval.cut_bytes);
                    let better = match *best {
                        None => true,
                        Some((b, c)) => {
                            candidate.0 < b * (1.0 - 1e-12)
                                || (candidate.0 <= b * (1.0 + 1e-12) && candidate.1 < c)
                        }
                    };
                    if better {
                        *best = Some(candidate);
                    }
                }
                return;
            }
            for start in starts[s - 1] + 1..=n - (starts.len() - s) {
                starts[s] = start;
                recurse(problem, starts, s + 1, n, best);
            }
        }
        if k == 1 {
            let eval = problem.evaluate(&problem.contiguous_assignment(&[0]));
            return eval
                .fits()
                .then_some((eval.bottleneck_secs, eval.cut_bytes));
        }
        recurse(problem, &mut starts, 1, n, &mut best);
        best
    }

    #[test]
    fn a_chain_is_cut_into_equal_parts() {
        let graph = chain(8, 1024, 512);
        let p = problem(&graph, "1x4xH100-SXM", CostSettings::default());
        let solution = solve(&p).unwrap();
        assert_eq!(solution.starts, vec![0, 2, 4, 6]);
        assert!(solution.order_lower_bound_secs <= solution.bottleneck_secs);
        assert!(
            solution.bottleneck_secs - solution.order_lower_bound_secs
                <= 2.0 * RELATIVE_TOLERANCE * solution.bottleneck_secs
        );
    }

    #[test]
    fn a_spent_deadline_stops_the_bisection_with_a_valid_plan() {
        let graph = chain(40, 1024, 512);
        let p = problem(&graph, "1x4xH100-SXM", CostSettings::default());
        let exact = solve(&p).unwrap();
        assert!(exact.complete);
        let stopped = solve_until(&p, Some(Instant::now())).unwrap();
        assert!(!stopped.complete);
        p.check_assignment(&stopped.stage_of).unwrap();
        assert!(stopped.bottleneck_secs >= exact.bottleneck_secs);
        assert!(stopped.order_lower_bound_secs <= exact.bottleneck_secs);
        // The balanced split of equal nodes is the equal cut, and it never claims completeness.
        let split = balanced_split(&p).unwrap();
        assert!(!split.complete);
        assert_eq!(split.starts, vec![0, 10, 20, 30]);
        p.check_assignment(&split.stage_of).unwrap();
        // Stopped before any probe fitted, the DP does not cover the order within its loose
        // first bound (a sweep of the whole order per stage): the balanced split stands.
        assert_eq!(stopped.starts, split.starts);
        assert!(stopped.order_lower_bound_secs <= split.bottleneck_secs);
    }

    #[test]
    fn equals_brute_force_on_small_fixtures_in_both_modes() {
        let mut compared = 0;
        for (name, dims) in [
            ("mlp", vec![("batch", 4)]),
            ("resnet_tiny", vec![("batch", 2)]),
        ] {
            let path = format!(
                "{}/../../fixtures/models/{name}.onnx",
                env!("CARGO_MANIFEST_DIR")
            );
            let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
            let mut bindings = pipecut_ir::onnx::shape::DimBindings::new();
            for (d, v) in dims {
                bindings = bindings.bind(d, v);
            }
            pipecut_ir::onnx::shape::ShapeInference::new(bindings)
                .run(&mut model.graph)
                .unwrap();
            for settings in [
                CostSettings::default(),
                CostSettings {
                    mode: Mode::training(),
                    microbatches: 4,
                    ..CostSettings::default()
                },
                CostSettings {
                    mode: Mode::training(),
                    schedule: pipecut_cost::Schedule::ZeroBubble,
                    microbatches: 4,
                    ..CostSettings::default()
                },
            ] {
                for spec in ["1x2xH100-SXM", "1x3xL4", "A100-80GB,L4,L4"] {
                    let p = if spec.contains(',') {
                        let cluster = Cluster::from_device_list(spec, &Catalog::builtin()).unwrap();
                        let devices: Vec<DeviceId> = (0..3).map(DeviceId).collect();
                        PartitionProblem::new(&model.graph, &cluster, &devices, settings).unwrap()
                    } else {
                        problem(&model.graph, spec, settings)
                    };
                    let solved = solve(&p).map(|s| {
                        let eval = p.evaluate(&s.stage_of);
                        (eval.bottleneck_secs, eval.cut_bytes)
                    });
                    let brute = brute_force(&p);
                    match (solved, brute) {
                        (Some((b, c)), Some((bb, bc))) => {
                            assert!(
                                (b - bb).abs() <= 1e-8 * bb,
                                "{name} {spec}: dp {b} brute {bb}"
                            );
                            assert_eq!(c, bc, "{name} {spec}: tie-break bytes");
                            compared += 1;
                        }
                        (None, None) => {}
                        other => panic!("{name} {spec}: dp and brute force disagree: {other:?}"),
                    }
                }
            }
        }
        assert_eq!(compared, 18, "every case has a feasible partition");
    }

    /// Under ZB-H1 a stage's memory is the larger of two sums (before and after a B). At every
    /// capacity where some contiguous partition stops fitting, the DP's furthest-fitting ends
    /// still find the brute-force optimum, or agree that nothing fits; with weight-gradient
    /// inputs as the model has them and eight times larger (the moment after B then peaks).
    #[test]
    fn equals_brute_force_under_zero_bubble_memory_at_every_binding_capacity() {
        let path = format!(
            "{}/../../fixtures/models/mlp.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        pipecut_ir::onnx::shape::ShapeInference::new(
            pipecut_ir::onnx::shape::DimBindings::new().bind("batch", 256),
        )
        .run(&mut model.graph)
        .unwrap();
        let settings = CostSettings {
            mode: Mode::training(),
            schedule: pipecut_cost::Schedule::ZeroBubble,
            microbatches: 4,
            ..CostSettings::default()
        };
        let p = problem(&model.graph, "1x3xH100-SXM", settings);
        assert!(p.weight_input_bytes.iter().any(|&b| b > 0));
        let n = p.node_count();
        let (mut compared, mut after_b_peaks) = (0, 0);
        for scale in [1u64, 8] {
            let mut scaled = p.clone();
            scaled
                .weight_input_bytes
                .iter_mut()
                .for_each(|b| *b *= scale);
            let mut capacities = Vec::new();
            for i in 1..n - 1 {
                for j in i + 1..n {
                    let eval = scaled.evaluate(&scaled.contiguous_assignment(&[0, i, j]));
                    capacities.extend(eval.stages.iter().map(|s| s.peak_memory_bytes));
                    let last = &eval.stages[2];
                    let held = |h: usize| {
                        scaled.stages()[2].held[h].bytes(
                            last.received_bytes,
                            last.activation_bytes,
                            last.weight_input_bytes,
                        )
                    };
                    after_b_peaks += usize::from(held(1) > held(0));
                }
            }
            capacities.sort_unstable();
            capacities.dedup();
            for &capacity in &capacities {
                for at in [capacity - 1, capacity] {
                    scaled.stages.iter_mut().for_each(|s| s.capacity_bytes = at);
                    let solved = solve(&scaled).map(|s| {
                        let eval = scaled.evaluate(&s.stage_of);
                        assert!(eval.fits());
                        (eval.bottleneck_secs, eval.cut_bytes)
                    });
                    match (solved, brute_force(&scaled)) {
                        (Some((b, c)), Some((bb, bc))) => {
                            assert!((b - bb).abs() <= 1e-8 * bb, "at {at}: dp {b} brute {bb}");
                            assert_eq!(c, bc, "at {at}: tie-break bytes");
                            compared += 1;
                        }
                        (None, None) => {}
                        other => panic!("at {at}: dp and brute force disagree: {other:?}"),
                    }
                }
            }
        }
        assert!(compared > 20, "{compared}");
        assert!(after_b_peaks > 0, "no partition peaks after a B");
    }

    /// The sweeps without windows: every position, every start, O(K · n²).
    fn reference_fewest_bytes(p: &PartitionProblem, t: &Tables, bound: f64) -> Option<Vec<usize>> {
        let (n, k) = (p.node_count(), p.stage_count());
        let mut best = vec![u64::MAX; n + 1];
        best[0] = 0;
        let mut parent = vec![vec![usize::MAX; n + 1]; k];
        for (stage, parent) in parent.iter_mut().enumerate() {
            let mut next = vec![u64::MAX; n + 1];
            for j in 1..=n {
                let mut choice = EMPTY;
                for (i, &cover) in best.iter().enumerate().take(j) {
                    let fits_time = t.start_key(p, stage, i) >= t.end_key(p, stage, j) - bound;
                    if cover != u64::MAX && t.reach(stage, i) >= j && fits_time {
                        let entering = if stage == 0 { 0 } else { t.cross_bytes[i] };
                        choice = choice.min((cover.saturating_add(entering), i));
                    }
                }
                (next[j], parent[j]) = choice;
            }
            best = next;
        }
        (best[n] != u64::MAX).then(|| {
            let mut starts = vec![0; k];
            let mut end = n;
            for stage in (0..k).rev() {
                starts[stage] = parent[stage][end];
                end = starts[stage];
            }
            starts
        })
    }

    #[test]
    fn windowed_sweeps_agree_with_full_sweeps_at_every_bound() {
        let mut compared = 0;
        for (name, dims) in [
            ("mlp", &[("batch", 2)][..]),
            ("gpt2_tiny", &[("batch", 2), ("seq", 16)]),
            ("resnet_tiny", &[("batch", 2)]),
        ] {
            let path = format!(
                "{}/../../fixtures/models/{name}.onnx",
                env!("CARGO_MANIFEST_DIR")
            );
            let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
            let mut bindings = pipecut_ir::onnx::shape::DimBindings::new();
            for &(dim, value) in dims {
                bindings = bindings.bind(dim, value);
            }
            pipecut_ir::onnx::shape::ShapeInference::new(bindings)
                .run(&mut model.graph)
                .unwrap();
            let n = model.graph.node_count();
            for stages in [2, 5, 8].into_iter().filter(|&k| k <= n) {
                for mode in [Mode::Inference, Mode::training()] {
                    let settings = CostSettings {
                        mode,
                        microbatches: 4,
                        ..CostSettings::default()
                    };
                    let p = problem(&model.graph, &format!("1x{stages}xL4"), settings);
                    let t = Tables::new(&p);
                    let optimum = solve(&p).expect("fits").bottleneck_secs;
                    for factor in [
                        0.5,
                        0.999,
                        1.0,
                        1.0 + 1e-9,
                        1.001,
                        1.05,
                        1.5,
                        4.0,
                        f64::INFINITY,
                    ] {
                        let bound = optimum * factor;
                        let reference = reference_fewest_bytes(&p, &t, bound);
                        assert_eq!(
                            feasible(&p, &t, bound),
                            reference.is_some(),
                            "{name} K={stages} {mode:?} at {factor} × optimum"
                        );
                        assert_eq!(
                            fewest_bytes(&p, &t, bound),
                            reference,
                            "{name} K={stages} {mode:?} at {factor} × optimum"
                        );
                        compared += 1;
                    }
                    assert!(
                        !feasible(&p, &t, optimum * 0.999),
                        "{name}: below the optimum"
                    );
                }
            }
        }
        assert_eq!(compared, 3 * 3 * 2 * 9);
    }

    #[test]
    fn memory_limits_force_more_even_splits_and_infeasibility_is_reported() {
        // 8 layers of 8192² fp16 = 128 MiB each on 2 L4s (24 GB): fits. Make it not fit by
        // asking for training with huge optimizer state per parameter.
        let graph = chain(8, 8192, 16);
        let settings = CostSettings {
            mode: Mode::Training {
                backward_factor: 2.0,
                optimizer_bytes_per_param: 3000.0,
                recompute: Default::default(),
                zero: Default::default(),
                memory_model: Default::default(),
            },
            ..CostSettings::default()
        };
        let p = problem(&graph, "1x2xL4", settings);
        assert!(solve(&p).is_none());
    }
}
