//! Lower bounds on the bottleneck of every convex, ordered partition, beyond
//! [`PartitionProblem::lower_bound_secs`] (the average work per stage or the slowest node).
//!
//! The **granularity bound** accounts for nodes being indivisible. A *cut node* is a node with
//! time that is comparable with every other node with time: each of them is its ancestor or its
//! descendant (zero-time nodes such as shapes and constants are ignored, since they change no
//! stage's compute; paths through them still count). In any convex, ordered partition the cut
//! nodes' stages never decrease along the order, every node with time between two consecutive
//! cut nodes lies on a stage between theirs, and the stage loads (compute on the fastest device
//! kind, communication ignored) are therefore those of a partition of one **chain**: the cut
//! nodes, indivisible, and between them *fluid* blocks that may be split anywhere. The smallest
//! bottleneck of that chain is a lower bound for the model; it is found by bisection over a
//! greedy feasibility test (each stage reaches as far as it can without splitting a cut node,
//! which is optimal for a chain).
//!
//! On a transformer the residual adds, layer norms and the large projections are cut nodes, so
//! the bound sees that a layer's big matrix products cannot be shared between two stages:
//! GPT-3-175B's shape at K = 64 (96 layers, so some stages hold two layers' worth) is where the
//! average-work bound is loose (docs/benchmarks.md).
//!
//! # Complexity
//! O(n + E) for a candidate filter, then O(E · c / 64 + n · c) for the `c` remaining candidates
//! (64 at a time as bit masks over one pass of the edges), O(n) memory, and
//! O(K · log c) per bisection step. Deadline checks between batches, and a work limit (edge
//! visits) that makes the answer the same on every machine: past either, the passes (light
//! thresholds) already finished give the bound, and with none the caller keeps the
//! average-work one.

use std::time::Instant;

use super::problem::PartitionProblem;

/// Bisection stops at this relative width; the bound returned is the infeasible end, lowered by
/// the same amount, so rounding never turns it into a value above the optimum.
const RELATIVE_PRECISION: f64 = 1e-9;

/// The best lower bound this module proves: the granularity bound when it could be computed
/// before `deadline` and within `work_limit`, else [`PartitionProblem::lower_bound_secs`].
pub fn lower_bound_secs(
    problem: &PartitionProblem,
    deadline: Instant,
    work_limit: Option<u64>,
) -> f64 {
    let average = problem.lower_bound_secs();
    granularity_bound_secs(problem, deadline, work_limit).map_or(average, |g| g.max(average))
}

/// Each position's time on its fastest device kind.
pub(crate) fn fastest_secs(problem: &PartitionProblem) -> Vec<f64> {
    // Over the stages' device kinds, each once: K stages of one kind are one table, and a
    // million nodes × 64 stages took a tenth of a second past the deadline.
    let mut kinds: Vec<usize> = problem.stages().iter().map(|s| s.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    (0..problem.node_count())
        .map(|v| {
            kinds
                .iter()
                .map(|&kind| problem.node_secs[kind][v])
                .fold(f64::INFINITY, f64::min)
        })
        .collect()
}

/// Nodes below these fractions of the slowest node's time are *light* in one pass each (the
/// largest bound wins). Any split is valid (module docs): a light node may be parallel to a
/// layer's matrix products (the shape arithmetic of a reshape, read by every layer) and would
/// otherwise leave no cut node at all; the thresholds span the tiny ops of shape arithmetic
/// (10⁻⁴ of a projection) up to element-wise ops (10⁻¹).
const LIGHT_FRACTIONS: [f64; 5] = [0.0, 1e-4, 1e-3, 1e-2, 1e-1];

/// The granularity bound (module docs): the largest over the passes that finished before the
/// deadline and within the work limit (edge visits, over all passes); `None` when none did.
pub fn granularity_bound_secs(
    problem: &PartitionProblem,
    deadline: Instant,
    work_limit: Option<u64>,
) -> Option<f64> {
    // Its first pass is linear but not free (a second on a million nodes): not begun late.
    if Instant::now() >= deadline {
        return None;
    }
    let fastest = fastest_secs(problem);
    let receive_secs = least_receive_secs(problem);
    let slowest = fastest.iter().copied().fold(0.0, f64::max);
    let mut work = 0;
    let mut best: Option<f64> = None;
    for fraction in LIGHT_FRACTIONS {
        // Each pass costs linear work before its first clock check: a million nodes take
        // about 0.2 s. Past the deadline the passes done so far stand.
        if Instant::now() >= deadline {
            break;
        }
        let light_below = slowest * fraction;
        let heavy: Vec<f64> = fastest
            .iter()
            .map(|&t| if t > light_below { t } else { 0.0 })
            .collect();
        let heavy = free_stray_ends(problem, heavy);
        // A pass the deadline or the work limit stopped proves nothing; the earlier ones stand
        // (the same work limit stops the same pass on every machine).
        let Some(cuts) = cut_nodes(problem, &heavy, deadline, work_limit, &mut work) else {
            break;
        };
        let floors = StageFloors {
            receive_secs: receive_secs.clone(),
            slowdown: least_slowdowns(problem, &fastest, &heavy),
        };
        let bound = chain_bound_secs(&fastest, &heavy, &cuts, &floors);
        best = Some(best.map_or(bound, |b: f64| b.max(bound)));
    }
    best
}

/// Per stage, the least time it spends receiving in any plan: when the graph is connected, every
/// boundary is crossed by at least one flow (the stages on either side are non-empty and some
/// edge joins them, forward since stages are ordered), so every stage but the first receives at
/// least one message of at least the smallest flow, and in training every stage but the last
/// receives at least one gradient. All zero for a graph in several pieces.
///
/// # Complexity
/// O(n + E α(n)).
pub(crate) fn least_receive_secs(problem: &PartitionProblem) -> Vec<f64> {
    let (n, k) = (problem.node_count(), problem.stage_count());
    let mut parent: Vec<u32> = (0..n as u32).collect();
    fn root(parent: &mut [u32], mut v: u32) -> u32 {
        while parent[v as usize] != v {
            parent[v as usize] = parent[parent[v as usize] as usize];
            v = parent[v as usize];
        }
        v
    }
    let mut pieces = n;
    for flow in problem.flows() {
        for &c in &flow.consumers {
            let (a, b) = (root(&mut parent, flow.producer), root(&mut parent, c));
            if a != b {
                parent[a as usize] = b;
                pieces -= 1;
            }
        }
    }
    let smallest = problem.flows().iter().map(|f| f.bytes).min();
    let (true, Some(bytes)) = (pieces == 1, smallest) else {
        return vec![0.0; k];
    };
    let training = matches!(problem.settings().mode, pipecut_cost::Mode::Training { .. });
    (0..k)
        .map(|s| {
            let forward = if s > 0 {
                problem.receive_secs(s, 1, bytes)
            } else {
                0.0
            };
            let gradient = if training && s + 1 < k {
                problem.receive_secs(s + 1, 1, bytes)
            } else {
                0.0
            };
            forward + gradient
        })
        .collect()
}

/// Successors and predecessors of every position, from the flows.
fn adjacency(problem: &PartitionProblem) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let n = problem.node_count();
    let mut succs = vec![Vec::new(); n];
    let mut preds = vec![Vec::new(); n];
    for flow in problem.flows() {
        for &c in &flow.consumers {
            succs[flow.producer as usize].push(c);
            preds[c as usize].push(flow.producer);
        }
    }
    (succs, preds)
}

/// `heavy` with the stray ends made light: a node with time but no ancestor with time that is
/// not the first such node (the tied embedding's transpose before a language model's head, a
/// mask computed from constants), and likewise a node with no descendant with time that is not
/// the last. Such a node is parallel to everything before (after) it and would leave no cut
/// node; as light time it may go on any stage, which keeps the bound valid.
///
/// # Complexity
/// O(n + E).
fn free_stray_ends(problem: &PartitionProblem, mut heavy: Vec<f64>) -> Vec<f64> {
    let n = problem.node_count();
    let (succs, preds) = adjacency(problem);
    let timed: Vec<bool> = heavy.iter().map(|&t| t > 0.0).collect();
    let mut has_timed_ancestor = vec![false; n];
    for v in 0..n {
        has_timed_ancestor[v] = preds[v]
            .iter()
            .any(|&p| timed[p as usize] || has_timed_ancestor[p as usize]);
    }
    let mut has_timed_descendant = vec![false; n];
    for v in (0..n).rev() {
        has_timed_descendant[v] = succs[v]
            .iter()
            .any(|&s| timed[s as usize] || has_timed_descendant[s as usize]);
    }
    let first = timed.iter().position(|&t| t);
    let last = timed.iter().rposition(|&t| t);
    for v in 0..n {
        let stray_source = !has_timed_ancestor[v] && Some(v) != first;
        let stray_sink = !has_timed_descendant[v] && Some(v) != last;
        if timed[v] && (stray_source || stray_sink) {
            heavy[v] = 0.0;
        }
    }
    heavy
}

/// Positions (ascending) of the nodes with time in `heavy` comparable with every other node with
/// time there. `work` counts edge visits across calls.
fn cut_nodes(
    problem: &PartitionProblem,
    heavy: &[f64],
    deadline: Instant,
    work_limit: Option<u64>,
    work: &mut u64,
) -> Option<Vec<usize>> {
    let n = problem.node_count();
    let (succs, preds) = adjacency(problem);
    let edges: u64 = succs.iter().map(|s| s.len() as u64).sum();
    let timed = |v: usize| heavy[v] > 0.0;
    let timed_count = (0..n).filter(|&v| timed(v)).count();

    // Filter: a cut node at position i needs every timed node before it to reach some timed node
    // at or after i, and every timed node after it to be reached from one at or before i.
    let mut furthest_reach = vec![0usize; n];
    for v in (0..n).rev() {
        let own = if timed(v) { v } else { 0 };
        furthest_reach[v] = succs[v]
            .iter()
            .map(|&s| furthest_reach[s as usize])
            .fold(own, usize::max);
    }
    let mut earliest_source = vec![usize::MAX; n];
    for v in 0..n {
        let own = if timed(v) { v } else { usize::MAX };
        earliest_source[v] = preds[v]
            .iter()
            .map(|&p| earliest_source[p as usize])
            .fold(own, usize::min);
    }
    let mut candidates = Vec::new();
    let mut least_reach_before = usize::MAX;
    let mut latest_source_after = vec![0usize; n + 1];
    for v in (0..n).rev() {
        let own = if timed(v) { earliest_source[v] } else { 0 };
        latest_source_after[v] = latest_source_after[v + 1].max(own);
    }
    for v in 0..n {
        if timed(v) && least_reach_before >= v && latest_source_after[v + 1] <= v {
            candidates.push(v);
        }
        if timed(v) {
            least_reach_before = least_reach_before.min(furthest_reach[v]);
        }
    }

    // Exact test, 64 candidates at a time: which candidates reach each node, and which each
    // node reaches.
    let mut cuts = Vec::new();
    let mut reached_from = vec![0u64; n];
    let mut reaches = vec![0u64; n];
    for batch in candidates.chunks(64) {
        *work += 2 * (edges + n as u64);
        if work_limit.is_some_and(|limit| *work > limit) || Instant::now() >= deadline {
            return None;
        }
        reached_from.fill(0);
        reaches.fill(0);
        for (bit, &c) in batch.iter().enumerate() {
            reached_from[c] |= 1 << bit;
            reaches[c] |= 1 << bit;
        }
        for v in 0..n {
            let mut mask = reached_from[v];
            for &p in &preds[v] {
                mask |= reached_from[p as usize];
            }
            reached_from[v] = mask;
        }
        for v in (0..n).rev() {
            let mut mask = reaches[v];
            for &s in &succs[v] {
                mask |= reaches[s as usize];
            }
            reaches[v] = mask;
        }
        let mut comparable = [0usize; 64];
        for v in (0..n).filter(|&v| timed(v)) {
            let mut mask = reached_from[v] | reaches[v];
            while mask != 0 {
                comparable[mask.trailing_zeros() as usize] += 1;
                mask &= mask - 1;
            }
        }
        cuts.extend(
            batch
                .iter()
                .enumerate()
                .filter(|&(bit, _)| comparable[bit] == timed_count)
                .map(|(_, &c)| c),
        );
    }
    Some(cuts)
}

/// Per stage, the least factor by which its device kind is slower than the fastest kind over
/// the `heavy` nodes: a stage's compute is at least this factor times the fastest-kind time of
/// the heavy nodes it holds. 1 on a homogeneous cluster. (Over all nodes it is often 1: a tiny
/// op costs its launch latency on every kind.)
pub(crate) fn least_slowdowns(
    problem: &PartitionProblem,
    fastest: &[f64],
    heavy: &[f64],
) -> Vec<f64> {
    (0..problem.stage_count())
        .map(|s| {
            (0..problem.node_count())
                .filter(|&v| heavy[v] > 0.0)
                .map(|v| problem.node_secs(s, v) / fastest[v])
                .fold(f64::INFINITY, f64::min)
        })
        .map(|factor| {
            if factor.is_finite() {
                factor.max(1.0)
            } else {
                1.0
            }
        })
        .collect()
}

/// What every stage must spend whatever it holds, and how much slower than the fastest kind its
/// device computes (see [`least_receive_secs`], [`least_slowdowns`]).
struct StageFloors {
    receive_secs: Vec<f64>,
    slowdown: Vec<f64>,
}

impl StageFloors {
    /// Fastest-kind compute stage `s` can hold within `bound`.
    fn capacity(&self, s: usize, bound: f64) -> f64 {
        (bound - self.receive_secs[s]).max(0.0) / self.slowdown[s]
    }

    /// Fastest-kind compute of any nodes stage `s` can hold within `bound` (each node is at
    /// least its fastest time on any kind).
    fn any_capacity(&self, s: usize, bound: f64) -> f64 {
        (bound - self.receive_secs[s]).max(0.0)
    }
}

/// The smallest bottleneck of the chain of `cuts` (indivisible) and fluid blocks between them,
/// the heavy nodes' time, with the light nodes' time (`fastest − heavy`) free to go on any stage,
/// on stages that each spend their floor receiving and compute the heavy nodes at their
/// slowdown, lowered by [`RELATIVE_PRECISION`] (a valid lower bound). Two necessary conditions:
/// the heavy chain fits the stages' heavy capacities, and all the time fits their plain ones. Greedy per stage in pipeline order is exact
/// for a chain: reaching further never hurts the stages after.
fn chain_bound_secs(fastest: &[f64], heavy: &[f64], cuts: &[usize], floors: &StageFloors) -> f64 {
    let stages = floors.slowdown.len();
    // Each cut node as an interval [start, end) of the heavy chain's work coordinate.
    let mut prefix = Vec::with_capacity(heavy.len() + 1);
    let mut sum = 0.0;
    prefix.push(0.0);
    for &t in heavy {
        sum += t;
        prefix.push(sum);
    }
    let heavy_total = sum;
    let total: f64 = fastest.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let intervals: Vec<(f64, f64)> = cuts.iter().map(|&c| (prefix[c], prefix[c + 1])).collect();
    let feasible = |bound: f64| -> bool {
        // All the time, light included, must fit (each node at its fastest time at least).
        let capacity: f64 = (0..stages).map(|s| floors.any_capacity(s, bound)).sum();
        if capacity < total {
            return false;
        }
        let mut reached = 0.0;
        for s in 0..stages {
            let mut end = reached + floors.capacity(s, bound);
            if end >= heavy_total {
                return true;
            }
            // The cut node whose interval holds `end` strictly inside ends the stage before it.
            let after = intervals.partition_point(|&(start, _)| start < end);
            if let Some(&(start, stop)) = after.checked_sub(1).map(|i| &intervals[i]) {
                if end < stop {
                    end = start;
                }
            }
            // A stage that cannot take the next cut node may still hold light or zero-time
            // nodes: it takes no heavy work and the next stage tries.
            reached = reached.max(end);
        }
        false
    };
    let slowest = floors.slowdown.iter().copied().fold(1.0, f64::max);
    let most_receive = floors.receive_secs.iter().copied().fold(0.0, f64::max);
    // One stage holding everything at the slowest kind fits any bound above this.
    let mut feasible_at = (total * slowest + most_receive) * (1.0 + 1e-6);
    if !feasible(feasible_at) {
        return 0.0;
    }
    let mut infeasible = 0.0;
    while feasible_at - infeasible > RELATIVE_PRECISION * feasible_at {
        let mid = 0.5 * (infeasible + feasible_at);
        if feasible(mid) {
            feasible_at = mid;
        } else {
            infeasible = mid;
        }
    }
    infeasible * (1.0 - RELATIVE_PRECISION)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::partition::problem::tests::chain;
    use crate::partition::problem::{CostSettings, Flow, StageId};
    use pipecut_cost::{Catalog, Cluster, DeviceId};
    use proptest::prelude::*;
    use std::time::Duration;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// A problem on `stages` H100s with the given node times and edges (producer < consumer),
    /// built over a chain's problem with its costs and flows replaced.
    pub(crate) fn dag(times: &[f64], edges: &[(u32, u32)], stages: usize) -> PartitionProblem {
        dag_in(times, edges, stages, CostSettings::default())
    }

    /// [`dag`] with the given settings (mode, schedule).
    pub(crate) fn dag_in(
        times: &[f64],
        edges: &[(u32, u32)],
        stages: usize,
        settings: CostSettings,
    ) -> PartitionProblem {
        let n = times.len();
        let graph = chain(n, 64, 8);
        // Homogeneous, or the first stage on an A100 and the rest on L4s (two device kinds).
        let cluster = if settings.schedule == pipecut_cost::Schedule::GPipe {
            let mut list = vec!["A100-80GB"; 1];
            list.extend(vec!["L4"; stages - 1]);
            Cluster::from_device_list(&list.join(","), &Catalog::builtin()).unwrap()
        } else {
            Cluster::parse(&format!("1x{stages}xH100-SXM"), &Catalog::builtin()).unwrap()
        };
        let devices: Vec<DeviceId> = (0..stages as u32).map(DeviceId).collect();
        let mut p = PartitionProblem::new(&graph, &cluster, &devices, settings).unwrap();
        for kind in &mut p.node_secs {
            kind.clear();
            kind.extend_from_slice(times);
        }
        p.params.clear();
        p.node_params = vec![Default::default(); n];
        let names: Vec<_> = edges
            .iter()
            .map(|&(u, v)| p.add_name(&format!("{u}->{v}")))
            .collect();
        p.flows = edges
            .iter()
            .zip(names)
            .map(|(&(u, v), name)| Flow {
                name,
                bytes: 0,
                producer: u,
                consumers: smallvec::smallvec![v],
                pinned: false,
            })
            .collect();
        p
    }

    /// `p` with one flow per producer, read by all its successors, of the given sizes.
    pub(crate) fn with_shared_flows(
        mut p: PartitionProblem,
        edges: &[(u32, u32)],
        bytes: &[u64],
    ) -> PartitionProblem {
        let n = p.node_count() as u32;
        let Some(template) = p.flows.first().cloned() else {
            return p;
        };
        p.flows = (0..n)
            .filter_map(|u| {
                let consumers: smallvec::SmallVec<_> =
                    edges.iter().filter(|e| e.0 == u).map(|e| e.1).collect();
                (!consumers.is_empty()).then(|| Flow {
                    producer: u,
                    consumers,
                    bytes: bytes[u as usize],
                    ..template.clone()
                })
            })
            .collect();
        p
    }

    /// [`dag`] in training under ZB-H1 with `microbatches` micro-batches, each node's weight
    /// gradient reading `weight_inputs` bytes: stages hold micro-batches past B, which makes
    /// the memory of every stage but the first the larger of two sums.
    pub(crate) fn zero_bubble_dag(
        times: &[f64],
        edges: &[(u32, u32)],
        stages: usize,
        microbatches: u32,
        weight_inputs: &[u64],
    ) -> PartitionProblem {
        let settings = CostSettings {
            mode: pipecut_cost::Mode::training(),
            schedule: pipecut_cost::Schedule::ZeroBubble,
            microbatches,
            ..CostSettings::default()
        };
        let mut p = dag_in(times, edges, stages, settings);
        p.weight_input_bytes = weight_inputs[..times.len()].to_vec();
        p
    }

    /// The smallest bottleneck over every convex, ordered assignment that fits memory (the
    /// brute-force optimum the exact solvers' tests compare with).
    pub(crate) fn brute_force_fitting_secs(p: &PartitionProblem) -> f64 {
        let mut best = f64::INFINITY;
        for_each_assignment(p, |stage_of| {
            let evaluation = p.evaluate(stage_of);
            if evaluation.fits() {
                best = best.min(evaluation.bottleneck_secs);
            }
        });
        best
    }

    /// Calls `visit` with every convex, ordered assignment of `p`'s nodes to its stages, found
    /// by enumerating all `K^n` assignments (for the brute-force checks of small problems).
    pub(crate) fn for_each_assignment(p: &PartitionProblem, mut visit: impl FnMut(&[StageId])) {
        let (n, k) = (p.node_count(), p.stage_count());
        let mut stage_of = vec![StageId(0); n];
        for code in 0..k.pow(n as u32) {
            let mut c = code;
            for s in stage_of.iter_mut() {
                *s = StageId((c % k) as u32);
                c /= k;
            }
            if p.check_assignment(&stage_of).is_ok() {
                visit(&stage_of);
            }
        }
    }

    /// The edges of a random DAG on `n` nodes: `u → v` for each pair `u < v` whose bit is set,
    /// bits taken in the order (0, 1), (0, 2), (1, 2), (0, 3), …
    pub(crate) fn edges_from_bits(n: usize, bits: &[bool]) -> Vec<(u32, u32)> {
        let pairs = (1..n as u32).flat_map(|v| (0..v).map(move |u| (u, v)));
        pairs
            .zip(bits)
            .filter(|(_, &b)| b)
            .map(|(e, _)| e)
            .collect()
    }

    /// The smallest bottleneck over every convex, ordered assignment (memory ignored).
    pub(crate) fn brute_force_secs(p: &PartitionProblem) -> f64 {
        let mut best = f64::INFINITY;
        for_each_assignment(p, |stage_of| {
            best = best.min(p.evaluate(stage_of).bottleneck_secs);
        });
        best
    }

    #[test]
    fn indivisible_nodes_raise_the_bound_above_the_average() {
        // Three equal nodes in a chain on two stages: one stage must take two of them.
        let p = dag(&[2.0, 2.0, 2.0], &[(0, 1), (1, 2)], 2);
        assert!((p.lower_bound_secs() - 3.0).abs() < 1e-12);
        let bound = lower_bound_secs(&p, far(), None);
        assert!((bound - 4.0).abs() < 1e-6, "{bound}");
        assert!(bound <= brute_force_secs(&p));
    }

    #[test]
    fn parallel_branches_are_fluid_and_only_comparable_nodes_cut() {
        // 0 → {1, 2} → 3: nodes 1 and 2 are parallel, so only 0 and 3 are cut nodes.
        let p = dag(&[1.0, 2.0, 2.0, 1.0], &[(0, 1), (0, 2), (1, 3), (2, 3)], 2);
        let fastest = fastest_secs(&p);
        assert_eq!(
            cut_nodes(&p, &fastest, far(), None, &mut 0),
            Some(vec![0, 3])
        );
        // Fluid middle: 6 / 2 = 3 of compute; the optimum ({0, 1} | {2, 3}) is 3 plus the
        // second stage's receive, part of which the bound counts (that stage must receive).
        let bound = lower_bound_secs(&p, far(), None);
        let optimum = brute_force_secs(&p);
        assert!(optimum > 3.0 && optimum < 3.0 + 1e-3, "{optimum}");
        assert!(bound > 3.0 && bound <= optimum, "{bound} {optimum}");
    }

    #[test]
    fn a_spent_work_limit_or_deadline_leaves_the_average_bound() {
        let p = dag(&[2.0, 2.0, 2.0], &[(0, 1), (1, 2)], 2);
        assert_eq!(granularity_bound_secs(&p, far(), Some(1)), None);
        assert_eq!(granularity_bound_secs(&p, Instant::now(), None), None);
        assert_eq!(lower_bound_secs(&p, far(), Some(1)), p.lower_bound_secs());
        // The same limit gives the same answer every time.
        let limit = Some(1_000);
        assert_eq!(
            granularity_bound_secs(&p, far(), limit),
            granularity_bound_secs(&p, far(), limit)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// On random small DAGs (some zero-time nodes, tensors up to 1 GiB, both modes, one or
        /// two device kinds with per-node slowdowns) the bound never exceeds the optimum over every convex, ordered partition.
        #[test]
        fn never_above_the_brute_force_optimum(
            n in 2usize..8,
            stages in 2usize..4,
            times in proptest::collection::vec(prop_oneof![Just(0.0), 0.1f64..5.0], 8),
            edge_bits in proptest::collection::vec(any::<bool>(), 28),
            bytes in proptest::collection::vec(0u64..1 << 30, 28),
            training in any::<bool>(),
            mixed in any::<bool>(),
            slowdowns in proptest::collection::vec(1.0f64..4.0, 8),
        ) {
            prop_assume!(stages <= n);
            let edges = edges_from_bits(n, &edge_bits);
            let settings = CostSettings {
                mode: if training { pipecut_cost::Mode::training() } else { pipecut_cost::Mode::Inference },
                // The test helper's switch to the mixed cluster.
                schedule: if mixed { pipecut_cost::Schedule::GPipe } else { pipecut_cost::Schedule::OneFOneB },
                ..CostSettings::default()
            };
            let mut p = dag_in(&times[..n], &edges, stages, settings);
            // Every kind after the first slower by a factor of its own per node.
            for kind in p.node_secs.iter_mut().skip(1) {
                for (t, f) in kind.iter_mut().zip(&slowdowns) {
                    *t *= f;
                }
            }
            for (flow, &b) in p.flows.iter_mut().zip(&bytes) {
                flow.bytes = b;
            }
            let bound = lower_bound_secs(&p, far(), None);
            let optimum = brute_force_secs(&p);
            prop_assert!(bound <= optimum * (1.0 + 1e-12), "bound {} optimum {}", bound, optimum);
        }
    }
}
