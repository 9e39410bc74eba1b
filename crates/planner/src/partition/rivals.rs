//! The plans `--select-by-running` runs: the cost model's optimum, its boundary moves
//! ([`super::neighbours`]) and the peers' own plans, those predicted within a window of the
//! optimum, each once, each labelled with where it came from.
//!
//! A peer's plan is a plan worth running: where the optimum and a peer's split are near a tie
//! the profile cannot settle, the peer's split is the one the comparison is made against, and it
//! need not be a boundary move of the optimum. On ppocr_v4_rec torchgpipe's split moved less
//! than one 2% step from the optimum, so no move reached it, and it measured 1.2% faster
//! (docs/benchmarks.md). A plan that is both a move and a peer's (or the optimum and a peer's)
//! runs once, its label naming both.

use super::neighbours::{boundary_moves, Direction};
use super::problem::{PartitionProblem, StageId};
use super::BaselineResult;

/// Which plans qualify as rivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RivalWindow {
    /// A rival's predicted bottleneck may exceed the optimum's by at most this share.
    pub slack: f64,
    /// Each step of a boundary move carries at least this much more time.
    pub step_secs: f64,
    /// Steps each boundary moves, each way.
    pub steps: usize,
}

/// A plan to run, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Rival {
    /// `cost model's optimum`, `boundary 0 moved later across 2 node(s) from 'x'`, or
    /// `the plan of torchgpipe 0.0.7 balance_by_time`; `, also the plan of …` where peers chose
    /// the same.
    pub origin: String,
    /// Its assignment.
    pub stage_of: Vec<StageId>,
}

/// The optimum first, then each distinct boundary move and each distinct peer plan (from
/// `baselines`, those that made the stages) that `acceptable` accepts (the caller's cut
/// constraints and the problem's rules), that fits memory and whose predicted bottleneck is
/// within `window.slack` of the optimum's. A peer plan equal to the optimum or to a move is not
/// run again: that candidate's label names the peer.
pub fn rivals(
    problem: &PartitionProblem,
    optimum: &[StageId],
    baselines: &[BaselineResult],
    window: RivalWindow,
    acceptable: &dyn Fn(&[StageId]) -> bool,
) -> Vec<Rival> {
    let limit_secs = problem.evaluate(optimum).bottleneck_secs * (1.0 + window.slack);
    let qualifies = |stage_of: &[StageId]| {
        let evaluation = problem.evaluate(stage_of);
        evaluation.fits() && evaluation.bottleneck_secs <= limit_secs && acceptable(stage_of)
    };
    // Each candidate's own origin (none for a peer's plan alone) and the peers that chose it.
    let mut found: Vec<(Option<String>, Vec<StageId>, Vec<&str>)> = vec![(
        Some("cost model's optimum".into()),
        optimum.to_vec(),
        Vec::new(),
    )];
    for rival in boundary_moves(problem, optimum, window.step_secs, window.steps, acceptable) {
        if found.iter().any(|(_, s, _)| *s == rival.stage_of) || !qualifies(&rival.stage_of) {
            continue;
        }
        let way = match rival.direction {
            Direction::Earlier => "earlier",
            Direction::Later => "later",
        };
        let origin = format!(
            "boundary {} moved {way} across {} node(s) from '{}'",
            rival.boundary,
            rival.moved.len(),
            problem.node_names().name(rival.moved[0])
        );
        found.push((Some(origin), rival.stage_of, Vec::new()));
    }
    for baseline in baselines {
        let Some(starts) = &baseline.starts else {
            continue;
        };
        let stage_of = problem.contiguous_assignment(starts);
        if let Some((_, _, peers)) = found.iter_mut().find(|(_, s, _)| *s == stage_of) {
            peers.push(&baseline.peer);
        } else if qualifies(&stage_of) {
            found.push((None, stage_of, vec![&baseline.peer]));
        }
    }
    found
        .into_iter()
        .map(|(origin, stage_of, peers)| {
            let chosen_by = format!("the plan of {}", peers.join(", "));
            let origin = match origin {
                None => chosen_by,
                Some(origin) if peers.is_empty() => origin,
                Some(origin) => format!("{origin}, also {chosen_by}"),
            };
            Rival { origin, stage_of }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::tests::two_stage_chain;
    use crate::partition::Baseline;

    fn peer(baseline: Baseline, starts: Option<Vec<usize>>) -> BaselineResult {
        BaselineResult {
            baseline,
            peer: baseline.peer("t"),
            error: starts.is_none().then(|| "fails".to_string()),
            starts,
            bottleneck_secs: None,
            fits: None,
        }
    }

    /// Steps of `nodes` nodes' time each (every node of the chain costs the same), one each way.
    fn window(problem: &PartitionProblem, slack: f64, nodes: f64) -> RivalWindow {
        RivalWindow {
            slack,
            step_secs: nodes * problem.node_secs(0, 0),
            steps: 1,
        }
    }

    fn origins(rivals: &[Rival]) -> Vec<&str> {
        rivals.iter().map(|r| r.origin.as_str()).collect()
    }

    /// Ten equal nodes, cut after the fifth, and how much slower each other cut is predicted
    /// (the second stage also sends the output: a cut after the sixth is 7% slower, after the
    /// fourth 18%).
    fn ten_nodes() -> (PartitionProblem, Vec<StageId>, impl Fn(usize) -> f64) {
        let problem = two_stage_chain(10);
        let optimum = problem.contiguous_assignment(&[0, 5]);
        let secs = |p: &PartitionProblem, cut: usize| {
            p.evaluate(&p.contiguous_assignment(&[0, cut]))
                .bottleneck_secs
        };
        let ratios: Vec<f64> = (0..=10)
            .map(|cut| {
                if cut == 0 || cut == 10 {
                    f64::INFINITY
                } else {
                    secs(&problem, cut) / secs(&problem, 5)
                }
            })
            .collect();
        (problem, optimum, move |cut| ratios[cut])
    }

    #[test]
    fn a_peers_plan_within_the_window_runs_where_no_boundary_move_does() {
        let (problem, optimum, slower) = ten_nodes();
        assert!(slower(4) < 1.2 && slower(3) > 1.2 && slower(7) > 1.2);
        // Moves of two nodes each way (cuts after 3 and 7) and torchgpipe's cut after 4: with a
        // 10% window none qualifies...
        let torchgpipe = peer(Baseline::TorchGpipeByTime, Some(vec![0, 4]));
        let peers = std::slice::from_ref(&torchgpipe);
        let found = rivals(
            &problem,
            &optimum,
            peers,
            window(&problem, 0.1, 1.5),
            &|_| true,
        );
        assert_eq!(origins(&found), ["cost model's optimum"]);
        // ...with a 20% window the peer's plan is the only rival.
        let wide = window(&problem, 0.2, 1.5);
        let found = rivals(&problem, &optimum, peers, wide, &|_| true);
        assert_eq!(
            origins(&found),
            [
                "cost model's optimum",
                "the plan of torchgpipe 0.0.7 balance_by_time"
            ]
        );
        assert_eq!(found[1].stage_of, problem.contiguous_assignment(&[0, 4]));
        // A cut constraint that refuses the peer's plan refuses it here too.
        let no_cut_after_4 = |s: &[StageId]| s[3] == s[4];
        let found = rivals(&problem, &optimum, peers, wide, &no_cut_after_4);
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn a_peers_plan_that_is_the_optimum_or_a_move_runs_once_and_its_label_names_the_peer() {
        let (problem, optimum, slower) = ten_nodes();
        assert!(slower(4) < 1.3 && slower(6) < 1.3 && slower(1) > 1.3);
        let baselines = [
            peer(Baseline::DeepSpeedUniform, Some(vec![0, 5])),
            peer(Baseline::DeepSpeedParameters, Some(vec![0, 6])),
            peer(Baseline::TorchGpipeByTime, Some(vec![0, 6])),
            // Failed, and far outside the window: neither runs.
            peer(Baseline::DeepSpeedType, None),
            peer(Baseline::TorchEqualSize, Some(vec![0, 1])),
        ];
        let one_node = window(&problem, 0.3, 0.5);
        let found = rivals(&problem, &optimum, &baselines, one_node, &|_| true);
        assert_eq!(
            origins(&found),
            [
                "cost model's optimum, also the plan of deepspeed 0.19 uniform",
                "boundary 0 moved earlier across 1 node(s) from '/layers.4/MatMul'",
                "boundary 0 moved later across 1 node(s) from '/layers.5/MatMul', also the plan \
                 of deepspeed 0.19 parameters, torchgpipe 0.0.7 balance_by_time",
            ]
        );
        assert_eq!(found[2].stage_of, problem.contiguous_assignment(&[0, 6]));
    }

    #[test]
    fn peers_that_agree_on_a_plan_of_their_own_share_one_candidate() {
        let (problem, optimum, _) = ten_nodes();
        let baselines = [
            peer(Baseline::DeepSpeedUniform, Some(vec![0, 4])),
            peer(Baseline::TorchEqualSize, Some(vec![0, 4])),
        ];
        let no_moves = RivalWindow {
            steps: 0,
            ..window(&problem, 0.3, 0.5)
        };
        let found = rivals(&problem, &optimum, &baselines, no_moves, &|_| true);
        assert_eq!(
            origins(&found),
            [
                "cost model's optimum",
                "the plan of deepspeed 0.19 uniform, pippy 0.2 split_into_equal_size"
            ]
        );
    }
}
