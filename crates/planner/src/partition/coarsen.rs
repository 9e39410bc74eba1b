//! Coarsening: merge nodes into super-nodes so that the MILP stays small, and the quotient
//! problem on which it then runs.
//!
//! A real model has thousands of nodes; the MILP has `n·(K−1)` binaries. Coarsening contracts
//! groups of nodes into super-nodes whose time, activations and weights are the sums (weights
//! shared inside a group counted once); a tensor read only inside its group disappears. The
//! quotient [`PartitionProblem`] evaluates any assignment of super-nodes exactly as the fine
//! problem evaluates the expanded assignment, so a plan of the coarse problem is a plan of the
//! model with the same figures.
//!
//! **What optimality means after coarsening**: the MILP's proof covers the partitions that keep
//! every super-node whole, i.e. it is optimal *over the coarsened graph*, not over the model;
//! [`super::SolveStatus::Optimal`] is then claimed only when the plan also meets the model's
//! lower bound. [`refine`] recovers some of what the merging lost: it runs the exact DP on the
//! fine graph along a topological order in which the coarse plan's stages are contiguous, so
//! every stage boundary may move node by node, and the result is never worse than the plan it
//! starts from.
//!
//! Merges, in order, each keeping the contracted graph acyclic:
//! 1. a group whose only successor is one group, or that is the only predecessor of its
//!    successor, joins it when either is free (zero time, no weights: shape ops, casts, constants)
//!    or when both have one neighbour on that side (chains of single-in/single-out nodes);
//! 2. while above the target, neighbours in the current topological order of the groups merge,
//!    lightest pair first and inside one layer (layers.rs) before across layers. Two groups next
//!    to each other in a topological order have no path between them through a third, so the
//!    contraction is acyclic.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Instant;

use super::layers::find_layers;
use super::problem::{Flow, ParamUse, PartitionProblem, Positions, StageId};

/// A coarse problem and the map from the fine positions to its positions.
#[derive(Debug, Clone)]
pub struct Coarsened {
    /// The quotient problem.
    pub problem: PartitionProblem,
    /// Coarse position of every fine position.
    pub group_of: Vec<u32>,
}

impl Coarsened {
    /// The fine assignment of a coarse one.
    pub fn expand(&self, coarse: &[StageId]) -> Vec<StageId> {
        self.group_of.iter().map(|&g| coarse[g as usize]).collect()
    }

    /// The coarse assignment of a fine one that keeps every group whole (`None` otherwise).
    pub fn restrict(&self, fine: &[StageId]) -> Option<Vec<StageId>> {
        let mut coarse: Vec<Option<StageId>> = vec![None; self.problem.node_count()];
        for (p, &g) in self.group_of.iter().enumerate() {
            match coarse[g as usize] {
                None => coarse[g as usize] = Some(fine[p]),
                Some(s) if s == fine[p] => {}
                Some(_) => return None,
            }
        }
        coarse.into_iter().collect()
    }
}

/// The problem whose nodes are the groups `group_of` (one per fine position, `0..groups`),
/// listed in `order` (a topological order of the contracted graph, as group indices).
pub(crate) fn quotient(problem: &PartitionProblem, group_of: &[u32], order: &[u32]) -> Coarsened {
    let groups = order.len();
    let mut position_of_group = vec![0u32; groups];
    for (position, &g) in order.iter().enumerate() {
        position_of_group[g as usize] = position as u32;
    }
    let coarse_of: Vec<u32> = group_of
        .iter()
        .map(|&g| position_of_group[g as usize])
        .collect();
    let members = Members::new(&coarse_of, groups);
    let order_ids = (0..groups)
        .map(|g| problem.order[members.of(g)[0]])
        .collect();
    let node_names = problem
        .node_names
        .of_groups((0..groups).map(|g| (members.of(g)[0], members.of(g).len())));
    let node_secs = problem
        .node_secs
        .iter()
        .map(|secs| {
            (0..groups)
                .map(|g| members.of(g).iter().map(|&p| secs[p]).sum())
                .collect()
        })
        .collect();
    let summed = |bytes: &[u64]| -> Vec<u64> {
        (0..groups)
            .map(|g| members.of(g).iter().map(|&p| bytes[p]).sum())
            .collect()
    };
    let activation_bytes = summed(&problem.activation_bytes);
    let weight_input_bytes = summed(&problem.weight_input_bytes);
    let (params, node_params) = quotient_params(problem, &coarse_of, groups);
    Coarsened {
        problem: PartitionProblem {
            order: order_ids,
            node_names,
            stages: problem.stages.clone(),
            kind_names: problem.kind_names.clone(),
            node_secs,
            activation_bytes,
            weight_input_bytes,
            params,
            node_params,
            flows: quotient_flows(problem, &coarse_of),
            settings: problem.settings,
            forward_flops: problem.forward_flops,
        },
        group_of: coarse_of,
    }
}

/// The fine positions of each group, ascending, laid end to end (`starts[g]..starts[g + 1]`):
/// one allocation, not one per group.
struct Members {
    starts: Vec<usize>,
    members: Vec<usize>,
}

impl Members {
    /// The members of `groups` groups, `coarse_of` giving each fine position's group.
    fn new(coarse_of: &[u32], groups: usize) -> Members {
        let mut starts = vec![0usize; groups + 1];
        for &c in coarse_of {
            starts[c as usize + 1] += 1;
        }
        for g in 0..groups {
            starts[g + 1] += starts[g];
        }
        let mut members = vec![0usize; coarse_of.len()];
        let mut next = starts.clone();
        for (p, &c) in coarse_of.iter().enumerate() {
            members[next[c as usize]] = p;
            next[c as usize] += 1;
        }
        Members { starts, members }
    }

    /// The fine positions of group `g`, ascending.
    fn of(&self, g: usize) -> &[usize] {
        &self.members[self.starts[g]..self.starts[g + 1]]
    }
}

/// Every weight with the groups that read it, and each group's weights.
fn quotient_params(
    problem: &PartitionProblem,
    coarse_of: &[u32],
    groups: usize,
) -> (Vec<ParamUse>, Vec<Positions>) {
    let mut node_params = vec![Positions::new(); groups];
    let params: Vec<ParamUse> = problem
        .params
        .iter()
        .enumerate()
        .map(|(index, param)| {
            let mut uses: Positions = param.uses.iter().map(|&u| coarse_of[u as usize]).collect();
            uses.sort_unstable();
            uses.dedup();
            for &u in &uses {
                node_params[u as usize].push(index as u32);
            }
            ParamUse {
                name: param.name,
                footprint_bytes: param.footprint_bytes,
                elements: param.elements,
                uses,
                shards: param.shards,
            }
        })
        .collect();
    (params, node_params)
}

/// The flows between groups: a tensor read only inside its producer's group disappears.
fn quotient_flows(problem: &PartitionProblem, coarse_of: &[u32]) -> Vec<Flow> {
    problem
        .flows
        .iter()
        .filter_map(|flow| {
            let producer = coarse_of[flow.producer as usize];
            let mut consumers: Positions = flow
                .consumers
                .iter()
                .map(|&c| coarse_of[c as usize])
                .filter(|&c| c != producer)
                .collect();
            debug_assert!(
                !flow.pinned || consumers.len() == flow.consumers.len(),
                "a pinned tensor's producer and readers are never grouped"
            );
            consumers.sort_unstable();
            consumers.dedup();
            (!consumers.is_empty()).then_some(Flow {
                name: flow.name,
                bytes: flow.bytes,
                producer,
                consumers,
                pinned: flow.pinned,
            })
        })
        .collect()
}

/// Successor and predecessor sets of the fine graph, by position.
/// Successors and predecessors of every position, through the tensors that flow between nodes.
pub(crate) fn adjacency(problem: &PartitionProblem) -> (Vec<BTreeSet<u32>>, Vec<BTreeSet<u32>>) {
    let n = problem.node_count();
    let mut succ = vec![BTreeSet::new(); n];
    let mut pred = vec![BTreeSet::new(); n];
    for flow in problem.flows() {
        for &c in &flow.consumers {
            if c != flow.producer {
                succ[flow.producer as usize].insert(c);
                pred[c as usize].insert(flow.producer);
            }
        }
    }
    (succ, pred)
}

/// Union-find over positions with the contracted graph's adjacency at the roots.
struct Groups {
    parent: Vec<u32>,
    succ: Vec<BTreeSet<u32>>,
    pred: Vec<BTreeSet<u32>>,
    free: Vec<bool>,
    secs: Vec<f64>,
    /// Groups a pinned cut separates from each group (kept at the roots): never merged.
    pins: Vec<BTreeSet<u32>>,
    count: usize,
}

impl Groups {
    fn root(&mut self, mut p: u32) -> u32 {
        while self.parent[p as usize] != p {
            let grand = self.parent[self.parent[p as usize] as usize];
            self.parent[p as usize] = grand;
            p = grand;
        }
        p
    }

    /// Contracts `b` into `a` (roots), merging their neighbours.
    /// Whether a pinned cut separates groups `a` and `b` (roots).
    fn pinned_apart(&self, a: u32, b: u32) -> bool {
        self.pins[a as usize].contains(&b)
    }

    fn merge(&mut self, a: u32, b: u32) {
        let (a_idx, b_idx) = (a as usize, b as usize);
        self.parent[b_idx] = a;
        for partner in std::mem::take(&mut self.pins[b_idx]) {
            self.pins[partner as usize].remove(&b);
            self.pins[partner as usize].insert(a);
            self.pins[a_idx].insert(partner);
        }
        let succ_b = std::mem::take(&mut self.succ[b_idx]);
        let pred_b = std::mem::take(&mut self.pred[b_idx]);
        for &s in &succ_b {
            self.pred[s as usize].remove(&b);
            if s != a {
                self.pred[s as usize].insert(a);
                self.succ[a_idx].insert(s);
            }
        }
        for &p in &pred_b {
            self.succ[p as usize].remove(&b);
            if p != a {
                self.succ[p as usize].insert(a);
                self.pred[a_idx].insert(p);
            }
        }
        self.succ[a_idx].remove(&b);
        self.pred[a_idx].remove(&b);
        self.free[a_idx] = self.free[a_idx] && self.free[b_idx];
        self.secs[a_idx] += self.secs[b_idx];
        self.count -= 1;
    }

    /// Group roots in a topological order of the contracted graph, ties by smallest position.
    fn topological(&self) -> Vec<u32> {
        let n = self.parent.len();
        let mut indegree = vec![0usize; n];
        let mut ready = BinaryHeap::new();
        for (p, degree) in indegree.iter_mut().enumerate() {
            if self.parent[p] == p as u32 {
                *degree = self.pred[p].len();
                if *degree == 0 {
                    ready.push(std::cmp::Reverse(p as u32));
                }
            }
        }
        let mut order = Vec::with_capacity(self.count);
        while let Some(std::cmp::Reverse(g)) = ready.pop() {
            order.push(g);
            for &s in &self.succ[g as usize] {
                indegree[s as usize] -= 1;
                if indegree[s as usize] == 0 {
                    ready.push(std::cmp::Reverse(s));
                }
            }
        }
        debug_assert_eq!(
            order.len(),
            self.count,
            "contractions keep the graph acyclic"
        );
        order
    }
}

/// Coarsens `problem` to at most about `target` super-nodes (fewer when chains and free nodes
/// merge further). `target` of at least the problem's stage count.
///
/// # Complexity
/// O(n log n) for the structural merges and O(n log n) per round of neighbour merges, each round
/// removing up to half of the excess.
pub fn coarsen(problem: &PartitionProblem, target: usize) -> Coarsened {
    coarsen_until(problem, target, None).expect("no deadline to stop it")
}

/// [`coarsen`], given up (`None`) once `deadline` has passed: on a million nodes coarsening
/// takes about as long as a DP, and a MILP thread the planner stopped waiting for must not go
/// on with it while the plan is written. The clock is read every [`CLOCK_EVERY`] merges.
pub(crate) fn coarsen_until(
    problem: &PartitionProblem,
    target: usize,
    deadline: Option<Instant>,
) -> Option<Coarsened> {
    let passed = || deadline.is_some_and(|d| Instant::now() >= d);
    let target = target.max(problem.stage_count()).max(1);
    let mut groups = Groups::of_positions(problem);
    // 1. Structural merges, to a fixed point.
    groups.merge_structurally(target, &passed)?;
    // 2. Neighbours in a topological order, lightest first, inside layers first.
    groups.merge_neighbours(target, &layer_of(problem), &passed)?;
    let (group_of, count) = groups.group_of();
    let order: Vec<u32> = (0..count as u32).collect();
    if passed() {
        return None;
    }
    Some(quotient(problem, &group_of, &order))
}

/// The layer (layers.rs) of every position.
fn layer_of(problem: &PartitionProblem) -> Vec<usize> {
    let mut layer_of = vec![0usize; problem.node_count()];
    for (index, layer) in find_layers(&problem.node_scopes()).iter().enumerate() {
        for l in layer_of.iter_mut().take(layer.end).skip(layer.start) {
            *l = index;
        }
    }
    layer_of
}

impl Groups {
    /// Every position a group of its own: its largest time on any stage, whether it is free
    /// (no time, no weights), and the positions a pinned cut separates it from.
    fn of_positions(problem: &PartitionProblem) -> Groups {
        let n = problem.node_count();
        let (succ, pred) = adjacency(problem);
        let secs: Vec<f64> = (0..n)
            .map(|p| {
                (0..problem.stage_count())
                    .map(|s| problem.node_secs(s, p))
                    .fold(0.0, f64::max)
            })
            .collect();
        let free: Vec<bool> = (0..n)
            .map(|p| secs[p] == 0.0 && problem.node_params[p].is_empty())
            .collect();
        let mut pins = vec![BTreeSet::new(); n];
        for flow in problem.flows().iter().filter(|f| f.pinned) {
            for &c in &flow.consumers {
                pins[flow.producer as usize].insert(c);
                pins[c as usize].insert(flow.producer);
            }
        }
        Groups {
            parent: (0..n as u32).collect(),
            succ,
            pred,
            free,
            secs,
            pins,
            count: n,
        }
    }

    /// Merge 1, to a fixed point or `target` groups: a group with one successor joins it when
    /// either is free or it is that successor's only predecessor; a free group joins its only
    /// predecessor. `None` once `passed()`, read every [`CLOCK_EVERY`] positions.
    fn merge_structurally(&mut self, target: usize, passed: &dyn Fn() -> bool) -> Option<()> {
        let n = self.parent.len();
        let mut changed = true;
        while changed && self.count > target {
            changed = false;
            for p in 0..n as u32 {
                if (p as usize).is_multiple_of(CLOCK_EVERY) && passed() {
                    return None;
                }
                if self.parent[p as usize] != p {
                    continue;
                }
                let single_succ = (self.succ[p as usize].len() == 1)
                    .then(|| *self.succ[p as usize].first().expect("one successor"));
                if let Some(s) = single_succ {
                    let chain = self.pred[s as usize].len() == 1;
                    let mergeable = chain || self.free[p as usize] || self.free[s as usize];
                    if mergeable && !self.pinned_apart(p, s) {
                        self.merge(p, s);
                        changed = true;
                        continue;
                    }
                }
                let single_pred = (self.pred[p as usize].len() == 1)
                    .then(|| *self.pred[p as usize].first().expect("one predecessor"));
                if let Some(q) = single_pred {
                    if self.free[p as usize] && !self.pinned_apart(q, p) {
                        self.merge(q, p);
                        changed = true;
                    }
                }
            }
        }
        Some(())
    }

    /// Merge 2, down to `target` groups: neighbours in a topological order, lightest pair
    /// first and inside one layer (`layer_of`) before across, up to half the excess a round.
    /// Stops early when every neighbouring pair is pinned apart; `None` once `passed()`.
    fn merge_neighbours(
        &mut self,
        target: usize,
        layer_of: &[usize],
        passed: &dyn Fn() -> bool,
    ) -> Option<()> {
        while self.count > target {
            if passed() {
                return None;
            }
            let order = self.topological();
            let mut pairs: Vec<(bool, f64, usize)> = order
                .windows(2)
                .enumerate()
                .map(|(i, w)| {
                    let across = layer_of[w[0] as usize] != layer_of[w[1] as usize];
                    let secs = self.secs[w[0] as usize] + self.secs[w[1] as usize];
                    (across, secs, i)
                })
                .collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
            let excess = self.count - target;
            let budget = excess.div_ceil(2).max(1).min(excess);
            let mut taken = vec![false; order.len()];
            let mut merged = 0;
            for &(_, _, i) in &pairs {
                if merged == budget {
                    break;
                }
                if taken[i] || taken[i + 1] || self.pinned_apart(order[i], order[i + 1]) {
                    continue;
                }
                taken[i] = true;
                taken[i + 1] = true;
                self.merge(order[i], order[i + 1]);
                merged += 1;
            }
            if merged == 0 {
                // Every neighbouring pair is pinned apart: the graph cannot shrink further.
                break;
            }
        }
        Some(())
    }

    /// The group of every position, groups numbered in the contracted graph's topological
    /// order, and how many groups there are.
    fn group_of(&mut self) -> (Vec<u32>, usize) {
        let mut index_of_root: BTreeMap<u32, u32> = BTreeMap::new();
        let order_roots = self.topological();
        for (i, &r) in order_roots.iter().enumerate() {
            index_of_root.insert(r, i as u32);
        }
        let group_of = (0..self.parent.len() as u32)
            .map(|p| index_of_root[&self.root(p)])
            .collect();
        (group_of, order_roots.len())
    }
}

/// How many positions [`coarsen_until`] visits between two looks at the clock: a look costs
/// about 25 ns, a visit a few, so the clock adds about 1% while the deadline is seen within a
/// millisecond or so.
const CLOCK_EVERY: usize = 4096;

/// The fine problem with its positions listed in a new topological order: `order[i]` is the
/// fine position put at new position `i`. The returned map sends old positions to new ones.
pub(crate) fn reordered(problem: &PartitionProblem, order: &[u32]) -> Coarsened {
    let identity: Vec<u32> = (0..problem.node_count() as u32).collect();
    quotient(problem, &identity, order)
}

/// Runs the DP on the fine problem along a topological order in which `plan`'s stages are
/// contiguous (stage first, then the original position), so every boundary can move node by
/// node. Returns the refined assignment when it is better than `plan`.
pub fn refine(problem: &PartitionProblem, plan: &[StageId]) -> Option<Vec<StageId>> {
    let mut order: Vec<u32> = (0..problem.node_count() as u32).collect();
    order.sort_by_key(|&p| (plan[p as usize], p));
    let along = reordered(problem, &order);
    let solved = super::dp::solve(&along.problem)?;
    let refined = along.expand(&solved.stage_of);
    super::dp::better(problem, &refined, plan).then_some(refined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::CostSettings;
    use pipecut_cost::{Catalog, Cluster, DeviceId};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn fixture_problem(name: &str, stages: u32) -> PartitionProblem {
        let path = format!(
            "{}/../../fixtures/models/{name}.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
            .run(&mut model.graph)
            .unwrap();
        let cluster = Cluster::parse(&format!("1x{stages}xL4"), &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..stages).map(DeviceId).collect();
        PartitionProblem::new(&model.graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    #[test]
    fn coarse_plans_evaluate_like_their_expansion() {
        let fine = fixture_problem("gpt2_tiny", 3);
        let coarse = coarsen(&fine, 24);
        assert!(
            coarse.problem.node_count() <= 24,
            "{}",
            coarse.problem.node_count()
        );
        let total =
            |p: &PartitionProblem| (0..p.node_count()).map(|v| p.node_secs(0, v)).sum::<f64>();
        assert!((total(&fine) - total(&coarse.problem)).abs() <= 1e-12 * total(&fine));
        // Any contiguous coarse plan, expanded, is valid and evaluates the same.
        let m = coarse.problem.node_count();
        let coarse_plan = coarse.problem.contiguous_assignment(&[0, m / 3, 2 * m / 3]);
        coarse.problem.check_assignment(&coarse_plan).unwrap();
        let fine_plan = coarse.expand(&coarse_plan);
        fine.check_assignment(&fine_plan).unwrap();
        let (a, b) = (
            coarse.problem.evaluate(&coarse_plan),
            fine.evaluate(&fine_plan),
        );
        assert!((a.bottleneck_secs - b.bottleneck_secs).abs() <= 1e-12 * b.bottleneck_secs);
        assert_eq!(a.cut_bytes, b.cut_bytes);
        assert_eq!(coarse.restrict(&fine_plan), Some(coarse_plan));
    }

    #[test]
    fn coarsening_past_its_deadline_gives_up_and_before_it_changes_nothing() {
        // Issue 17: a MILP thread the planner stopped waiting for must not coarsen on.
        let fine = fixture_problem("gpt2_tiny", 3);
        let past = Instant::now();
        assert!(coarsen_until(&fine, 24, Some(past)).is_none());
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let timed = coarsen_until(&fine, 24, Some(far)).expect("an hour is enough");
        let free = coarsen(&fine, 24);
        assert_eq!(timed.group_of, free.group_of);
    }

    #[test]
    fn refining_a_coarse_plan_never_loses() {
        let fine = fixture_problem("llama_tiny", 4);
        let coarse = coarsen(&fine, 8);
        let solved = crate::partition::dp::solve(&coarse.problem).unwrap();
        let plan = coarse.expand(&solved.stage_of);
        let before = fine.evaluate(&plan).bottleneck_secs;
        if let Some(refined) = refine(&fine, &plan) {
            fine.check_assignment(&refined).unwrap();
            assert!(fine.evaluate(&refined).bottleneck_secs <= before);
        }
    }
}
