//! Plans one stage boundary away from a plan: what `--select-by-running` measures against it.
//!
//! Per-node times add up to a stage's time only as far as a node costs the same wherever it
//! runs. It does not quite: a convolution that follows a layer streaming 25 MB through the cache
//! ran ~6% slower than the same convolution at the start of a stage (magika,
//! docs/benchmarks.md). No sum of per-node times can tell two plans apart when the difference
//! is that context, so the plans worth running are the model's optimum and its nearest rivals:
//! each boundary moved across the nodes beside it, in either direction, by a few steps that each
//! carry a noticeable share of the bottleneck (Alpa profiles candidate stages for the same
//! reason). One step is not always enough: on mlp a peer's split two nodes from the optimum ran
//! ~2% faster than it, and the one-node rival slower (docs/benchmarks.md).

use super::problem::{PartitionProblem, StageId};

/// Which way a boundary moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The last nodes of the earlier stage move to the later one.
    Earlier,
    /// The first nodes of the later stage move to the earlier one.
    Later,
}

/// A plan one boundary away from another.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundaryMove {
    /// The boundary between stage `boundary` and stage `boundary + 1`.
    pub boundary: usize,
    /// Which way it moved.
    pub direction: Direction,
    /// Positions (of the problem's order) that changed stage, nearest the boundary first.
    pub moved: Vec<usize>,
    /// The whole assignment after the move.
    pub stage_of: Vec<StageId>,
}

/// For each boundary of `stage_of` and each direction, up to `steps` moves across it, each the
/// smallest that takes at least `step_secs` more (on the stage the nodes leave) than the move
/// before it and that `acceptable` accepts (the caller's cut constraints); a move that would
/// empty a stage is not made. Moves keep the stages convex and ordered: nodes move in an order
/// that sorts positions by stage, so the last node of a stage has no reader on it, and the first
/// of a stage no producer.
pub fn boundary_moves(
    problem: &PartitionProblem,
    stage_of: &[StageId],
    step_secs: f64,
    steps: usize,
    acceptable: &dyn Fn(&[StageId]) -> bool,
) -> Vec<BoundaryMove> {
    let mut by_stage: Vec<Vec<usize>> = vec![Vec::new(); problem.stage_count()];
    for (p, s) in stage_of.iter().enumerate() {
        by_stage[s.index()].push(p);
    }
    let mut moves = Vec::new();
    for boundary in 0..problem.stage_count().saturating_sub(1) {
        for direction in [Direction::Earlier, Direction::Later] {
            let (from, to) = match direction {
                Direction::Earlier => (boundary, boundary + 1),
                Direction::Later => (boundary + 1, boundary),
            };
            // Nearest the boundary first: the earlier stage's end, the later stage's start.
            let nearest: Vec<usize> = match direction {
                Direction::Earlier => by_stage[from].iter().rev().copied().collect(),
                Direction::Later => by_stage[from].clone(),
            };
            let mut candidate = stage_of.to_vec();
            let mut moved_secs = 0.0;
            let mut next_step_secs = step_secs;
            let mut made = 0;
            // Leave the stage at least one node.
            for (count, &p) in nearest.iter().enumerate().take(nearest.len() - 1) {
                if made == steps {
                    break;
                }
                candidate[p] = StageId(to as u32);
                moved_secs += problem.node_secs(from, p);
                if moved_secs >= next_step_secs && acceptable(&candidate) {
                    moves.push(BoundaryMove {
                        boundary,
                        direction,
                        moved: nearest[..=count].to_vec(),
                        stage_of: candidate.clone(),
                    });
                    made += 1;
                    next_step_secs = moved_secs + step_secs;
                }
            }
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::tests::two_stage_chain;

    #[test]
    fn each_boundary_moves_both_ways_by_the_fewest_nodes_that_carry_the_time_asked() {
        let problem = two_stage_chain(6);
        let stage_of = problem.contiguous_assignment(&[0, 3]);
        let one = problem.node_secs(0, 2);
        // Every node of the chain costs the same: asking for 1.5 nodes' time moves two.
        let moves = boundary_moves(&problem, &stage_of, 1.5 * one, 1, &|_| true);
        assert_eq!(moves.len(), 2);
        assert_eq!(moves[0].direction, Direction::Earlier);
        assert_eq!(moves[0].moved, vec![2, 1]);
        assert_eq!(moves[0].stage_of, problem.contiguous_assignment(&[0, 1]));
        assert_eq!(moves[1].direction, Direction::Later);
        assert_eq!(moves[1].moved, vec![3, 4]);
        assert_eq!(moves[1].stage_of, problem.contiguous_assignment(&[0, 5]));
        for m in &moves {
            problem.check_assignment(&m.stage_of).unwrap();
        }
    }

    #[test]
    fn a_move_that_would_empty_a_stage_or_that_the_constraints_refuse_is_not_made() {
        let problem = two_stage_chain(4);
        let stage_of = problem.contiguous_assignment(&[0, 1]);
        let one = problem.node_secs(0, 0);
        // Stage 0 has one node: it cannot give it away.
        let moves = boundary_moves(&problem, &stage_of, 0.5 * one, 1, &|_| true);
        assert_eq!(
            moves.iter().map(|m| m.direction).collect::<Vec<_>>(),
            [Direction::Later]
        );
        // A constraint refusing a cut after position 1 makes the move take two nodes.
        let refuse = |s: &[StageId]| s[1] == s[2];
        let moves = boundary_moves(&problem, &stage_of, 0.5 * one, 1, &refuse);
        assert_eq!(moves[0].moved, vec![1, 2]);
    }

    #[test]
    fn later_steps_each_carry_another_step_of_time_beyond_the_move_before() {
        let problem = two_stage_chain(10);
        let stage_of = problem.contiguous_assignment(&[0, 5]);
        let one = problem.node_secs(0, 2);
        let moved = |moves: &[BoundaryMove], direction| -> Vec<Vec<usize>> {
            moves
                .iter()
                .filter(|m| m.direction == direction)
                .map(|m| m.moved.clone())
                .collect()
        };
        // Steps of 1.5 nodes' time: two nodes, then two more (a third carries only one more),
        // and each stage keeps a node, so a third step does not fit in five.
        let moves = boundary_moves(&problem, &stage_of, 1.5 * one, 3, &|_| true);
        assert_eq!(
            moved(&moves, Direction::Earlier),
            [vec![4, 3], vec![4, 3, 2, 1]]
        );
        assert_eq!(
            moved(&moves, Direction::Later),
            [vec![5, 6], vec![5, 6, 7, 8]]
        );
        for m in &moves {
            problem.check_assignment(&m.stage_of).unwrap();
        }
        // Asked for one step, only the nearest move each way.
        let moves = boundary_moves(&problem, &stage_of, 1.5 * one, 1, &|_| true);
        assert_eq!(moved(&moves, Direction::Later), [vec![5, 6]]);
    }
}
