//! Ordering and cycle checks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::NodeIndexable;
use petgraph::Direction;

use super::{Node, NodeId, TensorId};
use crate::Error;

/// Kahn's algorithm with a min-heap on node index, so that ties follow the model's node order
/// and the same graph always gives the same order.
///
/// # Complexity
/// O((V + E) log V).
pub(super) fn topological_order(dag: &StableDiGraph<Node, TensorId>) -> Result<Vec<NodeId>, Error> {
    let bound = dag.node_bound();
    let mut in_degree = vec![0usize; bound];
    for edge in dag.edge_indices() {
        let (_, to) = dag
            .edge_endpoints(edge)
            .expect("edge index from this graph");
        in_degree[to.index()] += 1;
    }
    let mut ready: BinaryHeap<Reverse<NodeIndex>> = dag
        .node_indices()
        .filter(|n| in_degree[n.index()] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(dag.node_count());
    while let Some(Reverse(n)) = ready.pop() {
        order.push(NodeId(n));
        for next in dag.neighbors_directed(n, Direction::Outgoing) {
            // Parallel edges (two tensors between the same pair) each count once in in_degree
            // and are each visited here, so the counts stay in step.
            in_degree[next.index()] -= 1;
            if in_degree[next.index()] == 0 {
                ready.push(Reverse(next));
            }
        }
    }
    if order.len() == dag.node_count() {
        return Ok(order);
    }
    Err(Error::Cycle {
        nodes: find_cycle(dag, &in_degree),
    })
}

/// Names the nodes of one cycle among those Kahn's algorithm could not order: every such node
/// has an unordered predecessor, so walking predecessors must revisit a node.
fn find_cycle(dag: &StableDiGraph<Node, TensorId>, in_degree: &[usize]) -> Vec<String> {
    let Some(start) = dag.node_indices().find(|n| in_degree[n.index()] > 0) else {
        return Vec::new();
    };
    let mut path = vec![start];
    let mut current = start;
    loop {
        let Some(prev) = dag
            .neighbors_directed(current, Direction::Incoming)
            .filter(|p| in_degree[p.index()] > 0)
            .min()
        else {
            return path.iter().map(|n| dag[*n].name.clone()).collect();
        };
        if let Some(pos) = path.iter().position(|&p| p == prev) {
            let mut cycle: Vec<String> = path[pos..]
                .iter()
                .rev()
                .map(|n| dag[*n].name.clone())
                .collect();
            // Start the report at the smallest name so the message is stable.
            let min = (0..cycle.len()).min_by_key(|&i| &cycle[i]).unwrap_or(0);
            cycle.rotate_left(min);
            return cycle;
        }
        path.push(prev);
        current = prev;
    }
}
