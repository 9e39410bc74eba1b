//! Limits at any size (issue 17, item 4): a transformer-shaped model far beyond the MILP's size
//! plans within bounded memory and says what ran. Not timed (the wall times and the limit's
//! overshoot are measured by `benches/scale.sh`, docs/benchmarks.md); the memory bound is
//! generous (about 2.5 times the 95 MiB the test needs, graph included, in a debug build) and
//! still below any one of the quadratic tables it replaced.
//!
//! One test in this binary, so that the process's peak resident memory is this test's.

use std::time::Duration;

use pipecut::cost::{Catalog, Cluster};
use pipecut::partition::{HeuristicReason, Planner, SolveStatus, SolverChoice, StageCount};

mod common;

/// The process's peak resident memory so far (`VmHWM`), in bytes, where Linux reports it.
fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn a_fifty_thousand_node_model_plans_in_bounded_memory_and_says_what_ran() {
    let Some(before) = peak_resident_bytes() else {
        common::skip(common::Need::Platform, "no /proc/self/status VmHWM here");
        return;
    };
    let graph = common::transformer(5_000, 64, 16);
    assert_eq!(graph.node_count(), 55_000);
    let cluster = Cluster::parse("8x8xH100-SXM", &Catalog::builtin()).unwrap();
    let solution = Planner::new(&graph, &cluster)
        .with_stages(StageCount::Fixed(64))
        .with_solver(SolverChoice::Milp)
        .with_time_limit(Duration::from_secs(1))
        .solve()
        .unwrap();
    let grown = peak_resident_bytes().unwrap().saturating_sub(before);
    eprintln!("peak resident memory grew by {} MiB", grown >> 20);
    // Before: ancestor and descendant bit sets of 55,000² bits (378 MB each) and a MILP built
    // over 55,000 × 63 cells (several GB, as the 100k-node model's 7 GB showed).
    assert!(grown < 1 << 30, "peak memory grew by {} MiB", grown >> 20);
    assert_eq!(solution.stage_of.len(), graph.node_count());
    assert!(solution.evaluation.fits());
    // The whole graph is too large for the MILP: it ran on super-nodes, or not at all, and the
    // status says which; it never claims a proof over the model it did not search.
    match &solution.milp {
        Some(report) => {
            assert!(
                report.coarsened || report.too_large || !report.started,
                "{report:?}"
            );
            if solution.status == SolveStatus::Optimal {
                // Only the lower bound can prove it.
                let bound = solution.lower_bound_secs * (1.0 + 1e-9);
                assert!(solution.evaluation.bottleneck_secs <= bound);
            }
        }
        // No MILP: no time was left for it, or (on a slow debug build) not even for the DP.
        None => assert!(
            matches!(
                solution.status,
                SolveStatus::Heuristic {
                    reason: HeuristicReason::MilpNotStarted | HeuristicReason::DpStopped
                }
            ),
            "{:?}",
            solution.status
        ),
    }
}
