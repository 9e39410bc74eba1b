//! The least a stage boundary can cost, by minimum cut: what stage `j` receives is the set of
//! flows *open* at the ideal `P_j` before it (made inside, some reader outside), so the cheapest
//! ideal that the stage windows allow at boundary `j` (every node whose latest stage is before
//! `j` inside, every node whose earliest stage is `j` or later outside) bounds its receive from
//! below in every plan within those windows.
//!
//! That cheapest ideal is a minimum s–t cut (the source side is the ideal):
//! - a flow `f` costs `c_f = λ + bytes_f/β` (one message on stage `j`'s link): an edge
//!   `producer → f` of capacity `c_f`, and `f → reader` unbounded for each reader, so `f` may
//!   stay on the source side for free only when all its readers are inside;
//! - an ideal is downward closed: `reader → producer` unbounded (a reader inside keeps its
//!   producer inside);
//! - the windows: `source → v` unbounded for the nodes forced inside, `v → sink` for those forced
//!   outside.
//!
//! On a transformer every ideal that splits a layer holds the residual stream open, so the
//! floor is that tensor's transfer, where bounds.rs's floor (one message of the smallest flow,
//! valid for any ideal) is a shape tensor's latency: the windows of the ideal search narrow by
//! the difference on every stage.
//!
//! Capacities are integers (bytes, with the latency as `⌊λ·β⌋` bytes), so the cut is exact and
//! the floor, divided by `β`, never above the true least receive.
//!
//! # Complexity
//! One maximum flow (Dinic's, petgraph) per boundary on `n + F + 2` vertices and
//! `F + 2·R + n` edges for `F` flows read `R` times: `O(V²·E)` at worst, far less on these
//! near-chains.

use std::time::Instant;

use petgraph::algo::dinics;
use petgraph::graph::{DiGraph, NodeIndex};

use super::problem::PartitionProblem;

/// Per boundary `j` in `1..K`, the least receive time of stage `j` over the ideals whose
/// members include every node with `latest[v] < j` and exclude every node with
/// `earliest[v] >= j`; entry 0 is 0 (the first stage receives nothing). Zero where the windows
/// force no node on one side (the empty ideal is then allowed; bounds.rs covers that case), and
/// for the boundaries not reached by `deadline` (each floor is valid alone).
pub(crate) fn boundary_floors(
    problem: &PartitionProblem,
    earliest: &[usize],
    latest: &[usize],
    deadline: Instant,
) -> Vec<f64> {
    let k = problem.stage_count();
    let mut floors = vec![0.0; k];
    for (j, floor) in floors.iter_mut().enumerate().skip(1) {
        if Instant::now() >= deadline {
            break;
        }
        *floor = boundary_floor(problem, j, |v| latest[v] < j, |v| earliest[v] >= j);
    }
    floors
}

/// The least receive time of stage `j` over the ideals that hold every node `inside` accepts and
/// no node `outside` accepts (module docs).
fn boundary_floor(
    problem: &PartitionProblem,
    j: usize,
    inside: impl Fn(usize) -> bool,
    outside: impl Fn(usize) -> bool,
) -> f64 {
    let Some((bandwidth, latency)) = problem.stages()[j].link_in else {
        return 0.0;
    };
    if !(bandwidth.is_finite() && bandwidth > 0.0) {
        return 0.0;
    }
    let n = problem.node_count();
    let (forced_in, forced_out): (Vec<usize>, Vec<usize>) = (
        (0..n).filter(|&v| inside(v)).collect(),
        (0..n).filter(|&v| outside(v)).collect(),
    );
    if forced_in.is_empty() || forced_out.is_empty() {
        return 0.0;
    }
    // `⌊λ·β⌋` bytes for the latency: rounding down keeps the floor a lower bound.
    let latency_bytes = (latency * bandwidth).floor().max(0.0) as u64;
    let cost = |bytes: u64| latency_bytes.saturating_add(bytes);
    let flows = problem.flows();
    // Larger than any cut of finite edges, so never cut.
    let unbounded = flows
        .iter()
        .fold(1u64, |sum, f| sum.saturating_add(cost(f.bytes)))
        .min(u64::MAX / 4);
    let mut network: DiGraph<(), u64> =
        DiGraph::with_capacity(n + flows.len() + 2, 2 * n + 3 * flows.len());
    let nodes: Vec<NodeIndex> = (0..n).map(|_| network.add_node(())).collect();
    let (source, sink) = (network.add_node(()), network.add_node(()));
    for flow in flows {
        let open = network.add_node(());
        let producer = nodes[flow.producer as usize];
        network.add_edge(producer, open, cost(flow.bytes));
        for &reader in &flow.consumers {
            let reader = nodes[reader as usize];
            network.add_edge(open, reader, unbounded);
            network.add_edge(reader, producer, unbounded);
        }
    }
    for v in forced_in {
        network.add_edge(source, nodes[v], unbounded);
    }
    for v in forced_out {
        network.add_edge(nodes[v], sink, unbounded);
    }
    let (cut, _) = dinics(&network, source, sink);
    if cut >= unbounded {
        // The windows admit no ideal at this boundary; the caller's window test says so too.
        return 0.0;
    }
    cut as f64 / bandwidth * (1.0 - ROUNDING)
}

/// Lowers every floor by this relative amount: the integer cut is exact, but dividing it by the
/// bandwidth may round a hair above `messages·λ + bytes/β` computed the search's way.
const ROUNDING: f64 = 1e-12;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::bounds::tests::{dag, edges_from_bits, with_shared_flows};

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    /// The least receive of stage 1 over every ideal the forced sets allow, by enumeration.
    fn brute_force_floor(p: &PartitionProblem, inside: &[bool], outside: &[bool]) -> Option<f64> {
        let n = p.node_count();
        (0u32..1 << n)
            .filter(|set| {
                let member = |v: usize| set >> v & 1 == 1;
                (0..n).all(|v| (!inside[v] || member(v)) && (!outside[v] || !member(v)))
                    && p.flows.iter().all(|f| {
                        f.consumers
                            .iter()
                            .all(|&c| !member(c as usize) || member(f.producer as usize))
                    })
            })
            .map(|set| {
                let open: Vec<u64> = p
                    .flows
                    .iter()
                    .filter(|f| {
                        set >> f.producer & 1 == 1 && f.consumers.iter().any(|&c| set >> c & 1 == 0)
                    })
                    .map(|f| f.bytes)
                    .collect();
                p.receive_secs(1, open.len(), open.iter().sum())
            })
            .reduce(f64::min)
    }

    #[test]
    fn a_split_layer_pays_for_its_residual_stream() {
        // 0 → 1 → 2 → 3 with 0's output read by 1 and 2 (a residual).
        let edges = [(0, 1), (0, 2), (1, 2), (2, 3)];
        let p = with_shared_flows(
            dag(&[1.0; 4], &edges, 2),
            &edges,
            &[1_000_000, 5_000_000, 9_000_000, 0],
        );
        let exact = |open: &[u64]| p.receive_secs(1, open.len(), open.iter().sum());
        // Node 0 inside, node 3 outside: the cut after 0 (its output alone) is the cheapest.
        let floors = boundary_floors(&p, &[0, 1, 1, 1], &[0, 1, 1, 1], far());
        assert!(
            floors[1] <= exact(&[1_000_000]) && floors[1] >= exact(&[1_000_000]) * (1.0 - 1e-9)
        );
        // Nodes 0 and 1 inside: the residual and 1's output (6 MB) beat 2's output (9 MB).
        let floors = boundary_floors(&p, &[0, 0, 1, 1], &[0, 0, 1, 1], far());
        let least = exact(&[1_000_000, 5_000_000]);
        assert!(
            floors[1] <= least && floors[1] >= least * (1.0 - 1e-9),
            "{floors:?} {least}"
        );
        // Nothing forced outside: the ideal may be everything, and the floor says nothing.
        assert_eq!(boundary_floors(&p, &[0; 4], &[0, 1, 1, 1], far())[1], 0.0);
    }

    proptest::proptest! {
        /// On random small DAGs with random forced sets, the floor is the least receive over the
        /// allowed ideals (never above it, and within rounding of it).
        #[test]
        fn the_floor_is_the_cheapest_allowed_ideal(
            n in 2usize..8,
            edge_bits in proptest::collection::vec(proptest::prelude::any::<bool>(), 28),
            bytes in proptest::collection::vec(0u64..400_000_000, 8),
            earliest in proptest::collection::vec(0usize..2, 8),
            latest in proptest::collection::vec(0usize..2, 8),
        ) {
            let edges = edges_from_bits(n, &edge_bits);
            proptest::prop_assume!(!edges.is_empty());
            let p = with_shared_flows(dag(&vec![1.0; n], &edges, 2), &edges, &bytes);
            let inside: Vec<bool> = (0..n).map(|v| latest[v] < 1).collect();
            let outside: Vec<bool> = (0..n).map(|v| earliest[v] >= 1).collect();
            let floor = boundary_floors(&p, &earliest[..n], &latest[..n], far())[1];
            let forced_both = inside.iter().any(|&b| b) && outside.iter().any(|&b| b);
            match brute_force_floor(&p, &inside, &outside) {
                Some(least) if forced_both => proptest::prop_assert!(
                    floor <= least && floor >= least * (1.0 - 1e-9) - 1e-12,
                    "floor {} least {}", floor, least
                ),
                _ => proptest::prop_assert_eq!(floor, 0.0),
            }
        }
    }
}
