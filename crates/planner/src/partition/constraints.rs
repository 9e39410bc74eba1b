//! Cut constraints: tensors no stage boundary may cross.
//!
//! A user knows things the cost model does not: a tensor that must stay on one GPU (a fused
//! kernel will read it, a framework cannot send it), or that a bias Add belongs with its MatMul
//! (a cut between them sends the same bytes as a cut after the Add, and splits what every
//! framework runs as one linear layer). Each constraint joins the producer of a tensor with its
//! consumers; since stages are convex, everything on a path between them joins too. The solvers
//! then work on the quotient problem whose nodes are those groups ([`super::coarsen::quotient`]),
//! so every solver, bound and proof holds over exactly the partitions that respect the
//! constraints, and the plan records them so that `check` audits the same problem.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use serde::{Deserialize, Serialize};

use super::coarsen::{quotient, Coarsened};
use super::names::NameId;
use super::problem::{PartitionProblem, StageId};
use crate::Error;
use pipecut_ir::graph::{Graph, NodeId};

/// Which tensors a plan may not cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CutConstraints {
    /// Tensors whose producer and consumers share a stage (`--forbid-cut NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbid: Vec<String>,
    /// Keep each MatMul with the Add that adds a weight (its bias) to its only output
    /// (on unless `--cut-anywhere`).
    #[serde(default)]
    pub bias_with_matmul: bool,
    /// Cut only between layers (module boundaries, `--cut-between-layers`): each run of the
    /// repeated blocks [`super::layers::find_layers`] detects, and each run of nodes outside
    /// them, stays on one stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub between_layers_only: bool,
    /// Keep every reader of a shared weight on one stage (`--keep-tied-weights`), instead of
    /// holding a copy on each stage that reads it (the default, as Megatron does for a tied
    /// embedding and LM head, whose gradients it then sums).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tied_weights_together: bool,
    /// Tensors a stage boundary must cross (`--pin-cut NAME`): the opposite constraint, which
    /// the solvers enforce directly ([`PartitionProblem::pin_cuts`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pin: Vec<String>,
    /// Keep each tensor-parallel block that splits at this degree, and each vocabulary shard,
    /// on one stage (0 or 1: no such constraint). `plan-cluster` sets it to the chosen degree:
    /// the costs charge a split block's nodes 1/t of their time, and the sharded export splits
    /// only the blocks a stage holds whole, so a cut inside one would make the plan promise
    /// what no GPU runs ([`super::tensor_parallel::TensorParallelBlocks::split_regions`]).
    #[serde(default, skip_serializing_if = "is_unsplit")]
    pub tensor_parallel_blocks: u32,
}

fn is_unsplit(degree: &u32) -> bool {
    *degree < 2
}

/// Why two positions must share a stage.
#[derive(Debug, Clone)]
enum Joined {
    /// The tensor flows from one to the other.
    Tensor(NameId),
    /// Both are in this layer.
    Layer(String),
    /// Both read this weight.
    Weight(NameId),
    /// Both run split in this tensor-parallel block (named by its row linear).
    Block(String),
}

impl Default for CutConstraints {
    fn default() -> Self {
        CutConstraints {
            forbid: Vec::new(),
            bias_with_matmul: true,
            between_layers_only: false,
            tied_weights_together: false,
            pin: Vec::new(),
            tensor_parallel_blocks: 0,
        }
    }
}

impl CutConstraints {
    /// No constraint: any convex partition.
    pub fn none() -> CutConstraints {
        CutConstraints {
            forbid: Vec::new(),
            bias_with_matmul: false,
            between_layers_only: false,
            tied_weights_together: false,
            pin: Vec::new(),
            tensor_parallel_blocks: 0,
        }
    }

    /// Only the tensor-parallel blocks that split at `degree` kept whole: what `plan-cluster`
    /// partitions under.
    pub fn tensor_parallel(degree: u32) -> CutConstraints {
        CutConstraints {
            tensor_parallel_blocks: degree,
            ..CutConstraints::none()
        }
    }

    /// The quotient of `problem` whose nodes are the groups the constraints join, or `None`
    /// when they join nothing. `graph` is the graph `problem` was built from.
    pub fn apply(
        &self,
        graph: &Graph,
        problem: &PartitionProblem,
    ) -> Result<Option<Coarsened>, Error> {
        let Some(groups) = self.groups(graph, problem)? else {
            return Ok(None);
        };
        groups.quotient(problem).map(Some)
    }

    /// The groups the constraints join in `problem`, or `None` when they join nothing: the
    /// same for every problem built from `graph` (positions and flows do not depend on the
    /// devices or costs), so a search applies them to each problem without finding them again.
    pub(crate) fn groups(
        &self,
        graph: &Graph,
        problem: &PartitionProblem,
    ) -> Result<Option<JoinedGroups>, Error> {
        let pairs = self.joined_pairs(graph, problem)?;
        if pairs.is_empty() {
            return Ok(None);
        }
        let (group_of, order) = convex_groups(problem, &pairs);
        Ok(Some(JoinedGroups { group_of, order }))
    }

    /// Where a stage may start in `problem`'s order so that a contiguous split keeps every
    /// pair the constraints join on one stage (no pair spans the start), or `None` when they
    /// join nothing. One pass over the pairs, without their groups: what a solve short of time
    /// cuts the order at (the groups' closure over paths adds nothing for contiguous stages).
    pub(crate) fn stage_starts(
        &self,
        graph: &Graph,
        problem: &PartitionProblem,
    ) -> Result<Option<Vec<bool>>, Error> {
        let pairs = self.joined_pairs(graph, problem)?;
        if pairs.is_empty() {
            return Ok(None);
        }
        // Spans covering each position: a pair (a, b) forbids starts at min + 1 ..= max.
        let n = problem.node_count();
        let mut opened = vec![0i32; n + 1];
        for &(a, b, _) in &pairs {
            let (lo, hi) = (a.min(b) as usize, a.max(b) as usize);
            if lo < hi {
                opened[lo + 1] += 1;
                opened[hi + 1] -= 1;
            }
        }
        let mut covering = 0;
        Ok(Some(
            opened[..n]
                .iter()
                .map(|&d| {
                    covering += d;
                    covering == 0
                })
                .collect(),
        ))
    }

    /// The first constraint `stage_of` breaks, as a sentence, for `check`.
    pub fn violation(
        &self,
        graph: &Graph,
        problem: &PartitionProblem,
        stage_of: &[StageId],
    ) -> Result<Option<String>, Error> {
        for (a, b, why) in self.joined_pairs(graph, problem)? {
            let (sa, sb) = (stage_of[a as usize], stage_of[b as usize]);
            if sa != sb {
                let what = match why {
                    Joined::Tensor(name) => format!(
                        "tensor '{}' crosses from stage {} to stage {}",
                        problem.name(name),
                        sa.0,
                        sb.0
                    ),
                    Joined::Layer(name) => format!(
                        "layer '{name}' is split between stages {} and {}",
                        sa.0.min(sb.0),
                        sa.0.max(sb.0)
                    ),
                    Joined::Weight(name) => format!(
                        "weight '{}' is read on stages {} and {}",
                        problem.name(name),
                        sa.0.min(sb.0),
                        sa.0.max(sb.0)
                    ),
                    Joined::Block(name) => format!(
                        "the tensor-parallel block of '{name}' is split between stages {} and {}",
                        sa.0.min(sb.0),
                        sa.0.max(sb.0)
                    ),
                };
                return Ok(Some(format!(
                    "{what}, but the plan's cut constraints keep it on one stage"
                )));
            }
        }
        Ok(None)
    }

    /// Pairs of positions that must share a stage, with the tensor that joins them.
    fn joined_pairs(
        &self,
        graph: &Graph,
        problem: &PartitionProblem,
    ) -> Result<Vec<(u32, u32, Joined)>, Error> {
        let mut pairs = Vec::new();
        for name in &self.forbid {
            let Some(flow) = problem
                .flows()
                .iter()
                .find(|f| problem.name(f.name) == name)
            else {
                return Err(Error::PartitionConfig(match graph.tensor_id(name) {
                    None => format!("--forbid-cut '{name}': the model has no tensor of that name"),
                    Some(_) => format!(
                        "--forbid-cut '{name}': no node reads it from another node, so no cut can cross it"
                    ),
                }));
            };
            for &c in &flow.consumers {
                pairs.push((flow.producer, c, Joined::Tensor(flow.name)));
            }
        }
        if self.bias_with_matmul {
            for flow in problem.flows() {
                if let Some(add) = bias_add(graph, problem, flow) {
                    pairs.push((flow.producer, add, Joined::Tensor(flow.name)));
                }
            }
        }
        if self.tied_weights_together {
            for param in problem.params() {
                for &reader in param.uses.iter().skip(1) {
                    let joined = Joined::Weight(param.name);
                    pairs.push((param.uses[0], reader, joined));
                }
            }
        }
        if self.tensor_parallel_blocks > 1 {
            let blocks = super::tensor_parallel::TensorParallelBlocks::find(graph);
            let position: std::collections::HashMap<NodeId, u32> = problem
                .order()
                .iter()
                .enumerate()
                .map(|(p, &id)| (id, p as u32))
                .collect();
            for (name, nodes) in blocks.split_regions(u64::from(self.tensor_parallel_blocks)) {
                let positions: Vec<u32> = nodes
                    .iter()
                    .filter_map(|n| position.get(n).copied())
                    .collect();
                for &p in positions.iter().skip(1) {
                    let joined = Joined::Block(graph.node(name).name.clone());
                    pairs.push((positions[0], p, joined));
                }
            }
        }
        if self.between_layers_only {
            for layer in super::layers::find_layers(&problem.node_scopes()) {
                for p in layer.start + 1..layer.end {
                    let joined = Joined::Layer(layer.name.clone());
                    pairs.push((layer.start as u32, p as u32, joined));
                }
            }
        }
        Ok(pairs)
    }
}

/// Positions joined into groups by cut constraints: each position's group, and the groups in a
/// topological order.
#[derive(Debug, Clone)]
pub(crate) struct JoinedGroups {
    group_of: Vec<u32>,
    order: Vec<u32>,
}

impl JoinedGroups {
    /// The quotient of `problem` (built from the graph the groups were found in) whose nodes
    /// are the groups; an error when a pinned tensor falls inside a group, or when there are
    /// fewer groups than stages.
    pub(crate) fn quotient(&self, problem: &PartitionProblem) -> Result<Coarsened, Error> {
        let (group_of, order) = (&self.group_of, &self.order);
        for flow in problem.flows().iter().filter(|f| f.pinned) {
            let group = group_of[flow.producer as usize];
            if flow
                .consumers
                .iter()
                .any(|&c| group_of[c as usize] == group)
            {
                return Err(Error::PartitionConfig(format!(
                    "--pin-cut '{}': the other cut constraints keep its producer and a reader on one stage",
                    problem.name(flow.name)
                )));
            }
        }
        if order.len() < problem.stage_count() {
            return Err(Error::PartitionConfig(format!(
                "the cut constraints leave {} group(s) of nodes that must each stay on one stage, fewer than the {} stages asked for",
                order.len(),
                problem.stage_count()
            )));
        }
        Ok(quotient(problem, group_of, order))
    }

    /// How many groups there are: the most stages a partition under them can have.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

/// The position of the Add that adds a weight to `flow`, when `flow` is a MatMul's output
/// read by that Add alone.
fn bias_add(graph: &Graph, problem: &PartitionProblem, flow: &super::problem::Flow) -> Option<u32> {
    let [consumer] = flow.consumers[..] else {
        return None;
    };
    let producer = graph.node(problem.order()[flow.producer as usize]);
    let add = graph.node(problem.order()[consumer as usize]);
    let is_bias = producer.op_type == "MatMul"
        && add.op_type == "Add"
        && add
            .inputs
            .iter()
            .flatten()
            .any(|&t| graph.tensor(t).param().is_some());
    is_bias.then_some(consumer)
}

/// Groups of positions (one group index per position, and the groups in a topological order)
/// that join every pair and are convex: a position on a path between two members of a group
/// belongs to it, and the contracted graph has no cycle.
fn convex_groups(problem: &PartitionProblem, pairs: &[(u32, u32, Joined)]) -> (Vec<u32>, Vec<u32>) {
    let n = problem.node_count();
    let edges: Vec<(u32, u32)> = problem
        .flows()
        .iter()
        .flat_map(|flow| flow.consumers.iter().map(|&c| (flow.producer, c)))
        .filter(|(a, b)| a != b)
        .collect();
    let succ = Adjacency::new(n, edges.iter().copied());
    let pred = Adjacency::new(n, edges.iter().map(|&(a, b)| (b, a)));
    let mut sets = UnionFind::new(n);
    for (a, b, _) in pairs {
        sets.union(*a, *b);
    }
    loop {
        let mut changed = close_over_paths(&mut sets, &succ, &pred);
        match group_order(&mut sets, &succ) {
            Ok(order) if !changed => {
                let mut index_of_root = vec![u32::MAX; n];
                for (i, &root) in order.iter().enumerate() {
                    index_of_root[root as usize] = i as u32;
                }
                let group_of = (0..n as u32)
                    .map(|p| index_of_root[sets.root(p) as usize])
                    .collect();
                let order = (0..order.len() as u32).collect();
                return (group_of, order);
            }
            Ok(_) => {}
            Err(cycle) => {
                // Two groups that reach each other must share a stage: join them and close again.
                for pair in cycle.windows(2) {
                    sets.union(pair[0], pair[1]);
                }
                changed = true;
            }
        }
        debug_assert!(changed);
    }
}

/// Adds to every group of several positions the positions on paths between its members.
/// Returns whether any group grew.
fn close_over_paths(sets: &mut UnionFind, succ: &Adjacency, pred: &Adjacency) -> bool {
    let n = succ.len();
    // The members of every group, ascending, in one table: a group's members follow its
    // root's entry (roots are their group's smallest position).
    let roots: Vec<u32> = (0..n as u32).map(|p| sets.root(p)).collect();
    let groups = Adjacency::new(n, (0..n as u32).map(|p| (roots[p as usize], p)));
    let mut grew = false;
    for root in 0..n {
        let group = groups.of(root as u32);
        // Positions follow a topological order, so paths between members stay inside their
        // span; a span of members only (a MatMul and the Add next to it) has nothing to add.
        let (Some(&lo), Some(&hi)) = (group.first(), group.last()) else {
            continue;
        };
        if (hi - lo) as usize + 1 == group.len() {
            continue;
        }
        let below = reach(group, succ, |p| p <= hi);
        let above = reach(group, pred, |p| p >= lo);
        for p in below.intersection(&above) {
            if sets.root(*p) != sets.root(group[0]) {
                sets.union(*p, group[0]);
                grew = true;
            }
        }
    }
    grew
}

/// Positions reachable from `from` along `edges`, staying where `within` holds.
fn reach(from: &[u32], edges: &Adjacency, within: impl Fn(u32) -> bool) -> BTreeSet<u32> {
    let mut seen: BTreeSet<u32> = from.iter().copied().collect();
    let mut stack: Vec<u32> = from.to_vec();
    while let Some(p) = stack.pop() {
        for &q in edges.of(p) {
            if within(q) && seen.insert(q) {
                stack.push(q);
            }
        }
    }
    seen
}

/// The group roots in a topological order of the contracted graph (smallest root first among
/// the ready ones, so the order is deterministic), or the roots of a cycle.
fn group_order(sets: &mut UnionFind, succ: &Adjacency) -> Result<Vec<u32>, Vec<u32>> {
    let n = succ.len();
    let roots: Vec<u32> = (0..n as u32).map(|p| sets.root(p)).collect();
    let group_succ = Adjacency::new(
        n,
        (0..n as u32)
            .flat_map(|p| succ.of(p).iter().map(move |&q| (p, q)))
            .map(|(p, q)| (roots[p as usize], roots[q as usize]))
            .filter(|(a, b)| a != b),
    );
    let mut indegree = vec![0usize; n];
    for a in 0..n as u32 {
        for &b in group_succ.of(a) {
            indegree[b as usize] += 1;
        }
    }
    let is_root: Vec<bool> = (0..n).map(|p| roots[p] == p as u32).collect();
    let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32)
        .filter(|&p| is_root[p as usize] && indegree[p as usize] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::new();
    while let Some(Reverse(g)) = ready.pop() {
        order.push(g);
        for &s in group_succ.of(g) {
            indegree[s as usize] -= 1;
            if indegree[s as usize] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    let groups = is_root.iter().filter(|&&r| r).count();
    if order.len() == groups {
        return Ok(order);
    }
    // Every group left has a predecessor left: walk back until a group repeats.
    let left: Vec<bool> = (0..n).map(|p| is_root[p] && indegree[p] > 0).collect();
    let mut group_pred: Vec<Vec<u32>> = vec![Vec::new(); n];
    for a in 0..n as u32 {
        for &b in group_succ.of(a) {
            if left[a as usize] {
                group_pred[b as usize].push(a);
            }
        }
    }
    let start = (0..n as u32)
        .find(|&p| left[p as usize])
        .expect("a group is left");
    let mut walk = vec![start];
    let mut seen = BTreeSet::from([start]);
    loop {
        let here = *walk.last().expect("the walk is not empty");
        let back = group_pred[here as usize][0];
        if !seen.insert(back) {
            let from = walk
                .iter()
                .position(|&g| g == back)
                .expect("seen on this walk");
            return Err(walk[from..].to_vec());
        }
        walk.push(back);
    }
}

/// Each position's neighbours, ascending and each once, in one table (compressed rows): a
/// million positions' sets in two allocations instead of a tree each.
struct Adjacency {
    /// `targets[starts[p]..starts[p + 1]]` are `p`'s neighbours.
    starts: Vec<u32>,
    targets: Vec<u32>,
}

impl Adjacency {
    /// The table of `edges` (`(from, to)` positions below `n`, repeats allowed).
    /// Placed by counting (each edge into its row), then each short row sorted and its
    /// repeats dropped: sorting all the edges at once was a tenth of a million-node solve.
    fn new(n: usize, edges: impl Iterator<Item = (u32, u32)>) -> Adjacency {
        let edges: Vec<(u32, u32)> = edges.collect();
        let mut next = vec![0u32; n + 1];
        for &(from, _) in &edges {
            next[from as usize + 1] += 1;
        }
        for p in 0..n {
            next[p + 1] += next[p];
        }
        let mut targets = vec![0u32; edges.len()];
        for &(from, to) in &edges {
            targets[next[from as usize] as usize] = to;
            next[from as usize] += 1;
        }
        drop(edges);
        // Each row sorted and deduplicated, moved down over the repeats of the rows before.
        let mut starts = vec![0u32; n + 1];
        let (mut row_start, mut kept) = (0usize, 0usize);
        for p in 0..n {
            let row_end = next[p] as usize;
            targets[row_start..row_end].sort_unstable();
            let mut last = None;
            for i in row_start..row_end {
                let to = targets[i];
                if last != Some(to) {
                    targets[kept] = to;
                    kept += 1;
                    last = Some(to);
                }
            }
            starts[p + 1] = kept as u32;
            row_start = row_end;
        }
        targets.truncate(kept);
        Adjacency { starts, targets }
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    fn of(&self, p: u32) -> &[u32] {
        &self.targets[self.starts[p as usize] as usize..self.starts[p as usize + 1] as usize]
    }
}

/// Disjoint sets of positions, the smallest position of each set its root.
struct UnionFind {
    parent: Vec<u32>,
}

impl UnionFind {
    fn new(n: usize) -> UnionFind {
        UnionFind {
            parent: (0..n as u32).collect(),
        }
    }

    fn root(&mut self, mut p: u32) -> u32 {
        while self.parent[p as usize] != p {
            let grand = self.parent[self.parent[p as usize] as usize];
            self.parent[p as usize] = grand;
            p = grand;
        }
        p
    }

    fn union(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.root(a), self.root(b));
        let (keep, join) = (ra.min(rb), ra.max(rb));
        self.parent[join as usize] = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::CostSettings;
    use pipecut_cost::{Catalog, Cluster, DeviceId};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn gpt2(stages: u32) -> (Graph, PartitionProblem) {
        let path = format!(
            "{}/../../fixtures/models/gpt2_tiny.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut model = pipecut_ir::onnx::load_model(&path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
            .run(&mut model.graph)
            .unwrap();
        let cluster = Cluster::parse(&format!("1x{stages}xL4"), &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..stages).map(DeviceId).collect();
        let problem =
            PartitionProblem::new(&model.graph, &cluster, &devices, CostSettings::default())
                .unwrap();
        (model.graph, problem)
    }

    fn position(problem: &PartitionProblem, tensor: &str) -> (u32, Vec<u32>) {
        let flow = problem
            .flows()
            .iter()
            .find(|f| problem.name(f.name) == tensor)
            .unwrap();
        (flow.producer, flow.consumers.to_vec())
    }

    #[test]
    fn every_split_block_stays_on_one_stage_and_check_names_a_cut_one() {
        let (graph, problem) = gpt2(3);
        let keep = CutConstraints::tensor_parallel(2);
        let grouped = keep
            .apply(&graph, &problem)
            .unwrap()
            .expect("gpt2 splits at 2");
        let blocks = crate::partition::tensor_parallel::TensorParallelBlocks::find(&graph);
        let regions = blocks.split_regions(2);
        // 4 layers × (attention, MLP), the embedding and the head.
        assert_eq!(regions.len(), 10);
        let position: std::collections::HashMap<NodeId, usize> = problem
            .order()
            .iter()
            .enumerate()
            .map(|(p, &id)| (id, p))
            .collect();
        for (_, nodes) in &regions {
            let group = grouped.group_of[position[&nodes[0]]];
            assert!(nodes.iter().all(|n| grouped.group_of[position[n]] == group));
        }
        // Solved on the quotient, no block is cut; the unconstrained DP cuts one at 3 stages.
        let solved = crate::partition::dp::solve(&grouped.problem).unwrap();
        let fine = grouped.expand(&solved.stage_of);
        assert_eq!(keep.violation(&graph, &problem, &fine).unwrap(), None);
        let free = crate::partition::dp::solve(&problem).unwrap().stage_of;
        let broken = keep.violation(&graph, &problem, &free).unwrap().unwrap();
        assert!(broken.contains("tensor-parallel block"), "{broken}");
        // Degree 1 splits nothing, so joins nothing.
        assert!(CutConstraints::tensor_parallel(1)
            .apply(&graph, &problem)
            .unwrap()
            .is_none());
    }

    #[test]
    fn every_linear_layer_keeps_its_bias_add() {
        let (graph, problem) = gpt2(2);
        let grouped = CutConstraints::default()
            .apply(&graph, &problem)
            .unwrap()
            .expect("gpt2 has biased MatMuls");
        // gpt2_tiny: 4 layers × (q, k, v, out, fc, proj) biased MatMuls = 24 pairs.
        assert_eq!(problem.node_count() - grouped.problem.node_count(), 24);
        let (matmul, adds) = position(&problem, "/transformer/h.2/attn/k_proj/MatMul_output_0");
        assert_eq!(
            grouped.group_of[matmul as usize],
            grouped.group_of[adds[0] as usize]
        );
        assert!(CutConstraints::none()
            .apply(&graph, &problem)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_split_short_of_time_starts_no_stage_inside_a_joined_pair() {
        let (graph, problem) = gpt2(8);
        let constraints = CutConstraints::default();
        let may_start = constraints
            .stage_starts(&graph, &problem)
            .unwrap()
            .expect("gpt2 has biased MatMuls");
        let (matmul, adds) = position(&problem, "/transformer/h.2/attn/k_proj/MatMul_output_0");
        assert!(matmul < adds[0]);
        assert!((matmul + 1..=adds[0]).all(|p| !may_start[p as usize]));
        assert!(may_start[matmul as usize]);
        let split = crate::partition::dp::balanced_split_at(&problem, Some(&may_start))
            .expect("gpt2_tiny fits 8 L4s");
        assert!(split.starts.iter().skip(1).all(|&v| may_start[v]));
        assert_eq!(split.starts.len(), 8);
        problem.check_assignment(&split.stage_of).unwrap();
        assert_eq!(
            constraints
                .violation(&graph, &problem, &split.stage_of)
                .unwrap(),
            None
        );
        // Where every position may start a stage it is the balanced split itself.
        let all = vec![true; problem.node_count()];
        let free = crate::partition::dp::balanced_split_at(&problem, Some(&all)).unwrap();
        let plain = crate::partition::dp::balanced_split(&problem).unwrap();
        assert_eq!(free.starts, plain.starts);
        assert!(CutConstraints::none()
            .stage_starts(&graph, &problem)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_forbidden_tensor_joins_everything_on_its_paths_and_no_plan_cuts_it() {
        let (graph, problem) = gpt2(3);
        // The residual stream into layer 1: read by ln_1 and by the residual Add at the end
        // of the attention block, so the whole attention block joins it.
        let tensor = "/transformer/h.0/Add_1_output_0";
        let constraints = CutConstraints {
            forbid: vec![tensor.to_string()],
            ..CutConstraints::none()
        };
        let grouped = constraints.apply(&graph, &problem).unwrap().unwrap();
        let (producer, consumers) = position(&problem, tensor);
        let last = *consumers.last().unwrap();
        let group = grouped.group_of[producer as usize];
        for &p in &consumers {
            assert_eq!(
                grouped.group_of[p as usize], group,
                "reader at position {p}"
            );
        }
        // Every node of layer 1's attention block lies on a path from the tensor to the
        // residual Add that reads it, so it joins too.
        let members = (producer..=last)
            .filter(|&p| grouped.group_of[p as usize] == group)
            .count();
        let attention = (producer as usize..=last as usize)
            .filter(|&p| {
                problem
                    .node_names()
                    .name(p)
                    .starts_with("/transformer/h.1/attn/")
            })
            .count();
        assert!(
            attention > 10 && members > attention,
            "{members} members, {attention} in attention"
        );
        // The quotient is a valid problem: its DP plan expands to a plan that keeps the tensor.
        let solved = crate::partition::dp::solve(&grouped.problem).unwrap();
        let fine = grouped.expand(&solved.stage_of);
        problem.check_assignment(&fine).unwrap();
        assert_eq!(
            constraints.violation(&graph, &problem, &fine).unwrap(),
            None
        );
        // A plan that cuts it is named.
        let mut cutting = fine.clone();
        let last_stage = StageId(problem.stage_count() as u32 - 1);
        cutting[producer as usize] = if fine[producer as usize] == last_stage {
            StageId(0)
        } else {
            last_stage
        };
        let broken = constraints
            .violation(&graph, &problem, &cutting)
            .unwrap()
            .unwrap();
        assert!(broken.contains(tensor), "{broken}");
    }

    #[test]
    fn between_layers_only_every_cut_falls_at_a_layer_boundary() {
        let (graph, problem) = gpt2(3);
        let constraints = CutConstraints {
            between_layers_only: true,
            ..CutConstraints::none()
        };
        let grouped = constraints.apply(&graph, &problem).unwrap().unwrap();
        let layers = super::super::layers::find_layers(&problem.node_scopes());
        assert!(layers.len() >= 4, "{layers:?}");
        // Each layer is one group, so the quotient has at most one node per layer.
        assert!(grouped.problem.node_count() <= layers.len());
        let solved = crate::partition::dp::solve(&grouped.problem).unwrap();
        let fine = grouped.expand(&solved.stage_of);
        let starts: Vec<usize> = layers.iter().map(|l| l.start).collect();
        for p in 1..fine.len() {
            if fine[p] != fine[p - 1] {
                assert!(starts.contains(&p), "a cut inside a layer at position {p}");
            }
        }
        assert_eq!(
            constraints.violation(&graph, &problem, &fine).unwrap(),
            None
        );
        // Moving a layer's last node to the next stage is named.
        let layer = layers
            .iter()
            .find(|l| l.end - l.start >= 2 && l.end < fine.len())
            .unwrap();
        let mut split = fine.clone();
        let last = StageId(problem.stage_count() as u32 - 1);
        split[layer.start] = if fine[layer.start] == last {
            StageId(0)
        } else {
            last
        };
        let broken = constraints
            .violation(&graph, &problem, &split)
            .unwrap()
            .unwrap();
        assert!(
            broken.contains(&format!("layer '{}' is split", layer.name)),
            "{broken}"
        );
    }

    #[test]
    fn a_pinned_cut_is_kept_by_the_dp_the_milp_and_coarsening() {
        let (graph, mut problem) = gpt2(3);
        let tensor = "/transformer/h.1/mlp/act/Mul_1_output_0";
        let unpinned = crate::partition::dp::solve(&problem).unwrap();
        let (producer, readers) = position(&problem, tensor);
        assert_eq!(
            unpinned.stage_of[producer as usize], unpinned.stage_of[readers[0] as usize],
            "the free optimum does not cut here, so the pin changes the plan"
        );
        problem.pin_cuts(&[tensor.to_string()]).unwrap();
        let crosses = |stage_of: &[StageId]| {
            readers
                .iter()
                .all(|&r| stage_of[producer as usize] < stage_of[r as usize])
        };
        let dp = crate::partition::dp::solve(&problem).unwrap();
        assert!(crosses(&dp.stage_of));
        problem.check_assignment(&dp.stage_of).unwrap();
        let refused = problem.check_assignment(&unpinned.stage_of).unwrap_err();
        assert!(
            refused.to_string().contains("a cut is pinned there"),
            "{refused}"
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let milp = crate::partition::milp::solve(&problem, &dp.stage_of, deadline);
        assert!(crosses(&milp.stage_of));
        let coarse = crate::partition::coarsen::coarsen(&problem, 4);
        assert_ne!(
            coarse.group_of[producer as usize],
            coarse.group_of[readers[0] as usize]
        );
        // Keeping the same tensor on one stage contradicts the pin.
        let conflict = CutConstraints {
            forbid: vec![tensor.to_string()],
            ..CutConstraints::none()
        };
        let error = conflict.apply(&graph, &problem).unwrap_err().to_string();
        assert!(
            error.contains("the other cut constraints keep its producer"),
            "{error}"
        );
        assert!(problem.pin_cuts(&["nope".to_string()]).is_err());
    }

    #[test]
    fn tied_weights_keep_their_readers_together_or_say_why_not() {
        let (graph, problem) = gpt2(4);
        let tied = CutConstraints {
            tied_weights_together: true,
            ..CutConstraints::none()
        };
        let grouped = tied.apply(&graph, &problem).unwrap().unwrap();
        // gpt2_tiny reads the token embedding in its Gather and in the LM head's Transpose.
        let shared = problem
            .params()
            .iter()
            .find(|p| p.uses.len() > 1 && problem.name(p.name).contains("wte"))
            .expect("a tied embedding");
        let groups: Vec<u32> = shared
            .uses
            .iter()
            .map(|&u| grouped.group_of[u as usize])
            .collect();
        assert!(groups.windows(2).all(|w| w[0] == w[1]), "{groups:?}");
        let solved = crate::partition::dp::solve(&grouped.problem).unwrap();
        let fine = grouped.expand(&solved.stage_of);
        assert_eq!(tied.violation(&graph, &problem, &fine).unwrap(), None);
        let mut split = fine.clone();
        let reader = *shared.uses.last().unwrap() as usize;
        split[reader] = StageId((fine[reader].0 + 1) % problem.stage_count() as u32);
        let broken = tied.violation(&graph, &problem, &split).unwrap().unwrap();
        assert!(broken.contains(&format!(
            "weight '{}' is read on stages",
            problem.name(shared.name)
        )));
        // Joining everything leaves fewer groups than stages: said, not "does not fit".
        let everything = CutConstraints {
            forbid: vec!["/transformer/Slice_output_0".to_string()],
            between_layers_only: true,
            ..tied
        };
        match everything.apply(&graph, &problem) {
            Err(e) => assert!(e.to_string().contains("fewer than the 4 stages"), "{e}"),
            Ok(grouped) => assert!(grouped.unwrap().problem.node_count() >= 4),
        }
    }

    #[test]
    fn unknown_and_uncuttable_tensors_are_refused_by_name() {
        let (graph, problem) = gpt2(2);
        let refuse = |name: &str| {
            CutConstraints {
                forbid: vec![name.to_string()],
                ..CutConstraints::none()
            }
            .apply(&graph, &problem)
            .unwrap_err()
            .to_string()
        };
        assert!(refuse("no_such_tensor").contains("the model has no tensor of that name"));
        let weight = graph.parameters().next().unwrap().1.name.clone();
        assert!(refuse(&weight).contains("no node reads it from another node"));
    }
}
