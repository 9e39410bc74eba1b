//! The summed time of every node's ancestors and of its descendants (each including the node),
//! in memory linear in the graph: the MILP's stage windows (`milp.rs`) ask how many stages must
//! lie before and after a node at a given bottleneck.
//!
//! Exact sums need the transitive closure. A bit set of ancestors per node is `n²/64` words
//! (1.25 GB at 100k nodes, before coarsening), so the closure is computed 64 sources at a
//! time instead: one word per node holds which of the 64 are its ancestors, one pass over the
//! nodes after them fills it, and the weights of the set bits are added (a full word adds the
//! 64 weights' precomputed sum). That is `O(n)` memory and `O((n + E) · n / 64)` time, the
//! same time as the bit sets, so it runs only while that work fits [`EXACT_WORK_LIMIT`];
//! beyond it each node gets the time of its heaviest path instead (`O(n + E)`), a lower bound
//! on its ancestors' time. A lower bound only widens a window (fewer stages are known to come
//! before the node), so no plan within the bottleneck is excluded either way; the windows of
//! a model that large only size the coarsening, since the MILP then runs on super-nodes.
//!
//! The limit is counted in work, not time, so every machine computes the same windows.

use super::problem::PartitionProblem;

/// Word operations (a node's word in one 64-source pass, or one edge in it) allowed for the
/// exact sums in each direction: about 0.1 s of one core. Covers about 58k nodes of a
/// transformer (1.5 edges per node), so every committed fixture and real model, GPT-3-175B's
/// shape and its 480-layer stack (19,706 nodes) keep exact windows.
pub const EXACT_WORK_LIMIT: u64 = 1 << 26;

/// Edges as compressed rows: `targets[starts[v]..starts[v + 1]]` are `v`'s neighbours.
struct Adjacency {
    starts: Vec<usize>,
    targets: Vec<u32>,
}

impl Adjacency {
    /// Predecessors (`forward`) or successors of every position, from the flows.
    fn new(problem: &PartitionProblem, forward: bool) -> Adjacency {
        let n = problem.node_count();
        let edges = || {
            problem.flows().iter().flat_map(move |flow| {
                flow.consumers.iter().map(move |&c| match forward {
                    true => (c, flow.producer),
                    false => (flow.producer, c),
                })
            })
        };
        let mut starts = vec![0usize; n + 1];
        for (from, _) in edges() {
            starts[from as usize + 1] += 1;
        }
        for v in 0..n {
            starts[v + 1] += starts[v];
        }
        let mut next = starts.clone();
        let mut targets = vec![0u32; starts[n]];
        for (from, to) in edges() {
            targets[next[from as usize]] = to;
            next[from as usize] += 1;
        }
        Adjacency { starts, targets }
    }

    fn of(&self, v: usize) -> &[u32] {
        &self.targets[self.starts[v]..self.starts[v + 1]]
    }

    fn edge_count(&self) -> usize {
        self.targets.len()
    }
}

/// For every position `v`, a lower bound on `Σ weights[u]` over the ancestors `u` of `v`
/// (`forward`) or its descendants, `v` included: exact when the closure's work fits
/// [`EXACT_WORK_LIMIT`], else the heaviest path through `v` from a source (to a sink).
/// Weights must be non-negative. Positions are a topological order of `problem`.
///
/// # Complexity
/// `O(n)` memory; `O(min((n + E) · n / 64, EXACT_WORK_LIMIT) + n + E)` time.
pub(crate) fn closure_sums(problem: &PartitionProblem, weights: &[f64], forward: bool) -> Vec<f64> {
    let adjacency = Adjacency::new(problem, forward);
    if exact_work(weights.len(), adjacency.edge_count()) <= EXACT_WORK_LIMIT {
        exact_sums(&adjacency, weights, forward)
    } else {
        heaviest_paths(&adjacency, weights, forward)
    }
}

/// Word operations of the exact sums: each 64-source pass visits the nodes and edges after
/// (before) its sources, half of them on average.
fn exact_work(n: usize, edges: usize) -> u64 {
    let passes = n.div_ceil(64) as u64;
    passes * (n as u64 + edges as u64).div_ceil(2)
}

/// Position `i` of a pass in processing order: ascending for ancestors, descending for
/// descendants (their sources come after them).
fn position(n: usize, i: usize, forward: bool) -> usize {
    if forward {
        i
    } else {
        n - 1 - i
    }
}

fn exact_sums(adjacency: &Adjacency, weights: &[f64], forward: bool) -> Vec<f64> {
    let n = weights.len();
    let mut sums = vec![0.0; n];
    let mut bits = vec![0u64; n];
    for first in (0..n).step_by(64) {
        // Sources are the 64 nodes at ranks `first..first + 64` of the processing order; nodes
        // of lower rank reach none of them.
        let count = (n - first).min(64);
        let source_weight = |b: usize| weights[position(n, first + b, forward)];
        let full: u64 = if count == 64 { !0 } else { (1 << count) - 1 };
        let full_sum: f64 = (0..count).map(source_weight).sum();
        for rank in first..n {
            let v = position(n, rank, forward);
            let mut word = if rank < first + count {
                1 << (rank - first)
            } else {
                0
            };
            for &u in adjacency.of(v) {
                let u = u as usize;
                let u_rank = if forward { u } else { n - 1 - u };
                if u_rank >= first {
                    word |= bits[u];
                }
            }
            bits[v] = word;
            sums[v] += match word {
                0 => 0.0,
                w if w == full => full_sum,
                mut w => {
                    let mut sum = 0.0;
                    while w != 0 {
                        sum += source_weight(w.trailing_zeros() as usize);
                        w &= w - 1;
                    }
                    sum
                }
            };
        }
    }
    sums
}

fn heaviest_paths(adjacency: &Adjacency, weights: &[f64], forward: bool) -> Vec<f64> {
    let n = weights.len();
    let mut sums = vec![0.0; n];
    for rank in 0..n {
        let v = position(n, rank, forward);
        let before = adjacency
            .of(v)
            .iter()
            .map(|&u| sums[u as usize])
            .fold(0.0, f64::max);
        sums[v] = before + weights[v];
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::CostSettings;
    use pipecut_cost::{Catalog, Cluster};
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn problem(name: &str) -> PartitionProblem {
        let mut model =
            pipecut_ir::onnx::load_model(format!("../../fixtures/models/{name}.onnx")).unwrap();
        let bindings = match name {
            "resnet_tiny" => DimBindings::new().bind("batch", 2),
            _ => DimBindings::new().bind("batch", 2).bind("seq", 16),
        };
        ShapeInference::new(bindings).run(&mut model.graph).unwrap();
        let cluster = Cluster::parse("1x4xL4", &Catalog::builtin()).unwrap();
        let devices: Vec<_> = cluster.devices().map(|(id, _)| id).collect();
        PartitionProblem::new(&model.graph, &cluster, &devices, CostSettings::default()).unwrap()
    }

    /// The closure by depth-first search from every node: quadratic, for the test only.
    fn brute_force(problem: &PartitionProblem, weights: &[f64], forward: bool) -> Vec<f64> {
        let adjacency = Adjacency::new(problem, forward);
        (0..weights.len())
            .map(|v| {
                let mut seen = vec![false; weights.len()];
                let mut stack = vec![v];
                seen[v] = true;
                let mut sum = 0.0;
                while let Some(u) = stack.pop() {
                    sum += weights[u];
                    for &w in adjacency.of(u) {
                        if !std::mem::replace(&mut seen[w as usize], true) {
                            stack.push(w as usize);
                        }
                    }
                }
                sum
            })
            .collect()
    }

    #[test]
    fn exact_sums_are_the_closure_and_heaviest_paths_bound_them_from_below() {
        for name in ["gpt2_tiny", "llama_tiny", "resnet_tiny"] {
            let p = problem(name);
            // Distinct weights per node, so that a missed or doubled ancestor shows.
            let weights: Vec<f64> = (0..p.node_count())
                .map(|v| 1.0 + (v * 7919 % 101) as f64)
                .collect();
            for forward in [true, false] {
                let adjacency = Adjacency::new(&p, forward);
                let expected = brute_force(&p, &weights, forward);
                let exact = exact_sums(&adjacency, &weights, forward);
                let paths = heaviest_paths(&adjacency, &weights, forward);
                for v in 0..p.node_count() {
                    assert!(
                        (exact[v] - expected[v]).abs() <= 1e-9 * expected[v],
                        "{name} node {v}: {} != {}",
                        exact[v],
                        expected[v]
                    );
                    assert!(paths[v] <= expected[v] * (1.0 + 1e-12));
                    assert!(paths[v] >= weights[v]);
                }
                // Branches exist, so the path bound is strictly below somewhere.
                assert!((0..p.node_count()).any(|v| paths[v] < expected[v] - 0.5));
            }
        }
    }

    #[test]
    fn the_exact_closure_runs_only_within_its_work_limit() {
        // GPT-3-175B's shape (3,962 nodes) and a 20k-node stack are exact; 100k nodes are not.
        assert!(exact_work(3_962, 6_000) <= EXACT_WORK_LIMIT);
        assert!(exact_work(19_706, 30_000) <= EXACT_WORK_LIMIT);
        assert!(exact_work(100_000, 150_000) > EXACT_WORK_LIMIT);
    }
}
