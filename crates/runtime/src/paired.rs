//! Plans run side by side on the CPU runtime in paired rounds: what `pipecut bench-plans`
//! reports and `pipecut partition --select-by-running` chooses by.
//!
//! One core per stage: each stage's thread is pinned to its own core, so stage k's time is what
//! its nodes cost and not what it won from a neighbour. Every round runs every plan once, in a
//! rotated order, so that a slow spell of the machine falls on all plans alike; the figure to
//! compare is each round's ratio of bottlenecks, the slowest stage's thread CPU time (the
//! scheduler's account, which a busy machine inflates less than wall time). Round r pins stage
//! k to core k + r (modulo the stages): the cores of a virtual machine are not equally fast, and
//! a fixed assignment would credit a plan for where its heaviest stage happened to land. Round
//! 0 warms caches and thread pools for every plan alike and is not counted.

use super::cpu::{run_pipeline_with, PipelineOptions};
use super::{Executor, Tensors};
use crate::Error;
use pipecut_cost::measured::percentiles;

/// What paired rounds measured, by plan, then counted round.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedRuns {
    /// Wall time of each run.
    pub wall_secs: Vec<Vec<f64>>,
    /// Each stage's thread CPU time over each run.
    pub stage_cpu_secs: Vec<Vec<Vec<f64>>>,
}

/// Runs each plan's prepared stages `rounds` times (after one uncounted round), `microbatches`
/// micro-batches of `inputs` a run, calling `after_round` with each round's number.
pub fn run_paired_rounds<E: Executor>(
    executor: &E,
    plans: &mut [Vec<E::Stage>],
    inputs: &Tensors,
    microbatches: usize,
    rounds: usize,
    mut after_round: impl FnMut(usize),
) -> Result<PairedRuns, Error> {
    let stages = plans.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut runs = PairedRuns {
        wall_secs: vec![Vec::new(); plans.len()],
        stage_cpu_secs: vec![Vec::new(); plans.len()],
    };
    for round in 0..=rounds {
        let options = PipelineOptions {
            pin_stages_to_cores: true,
            first_core: round % stages,
        };
        for offset in 0..plans.len() {
            let plan = (round + offset) % plans.len();
            let report =
                run_pipeline_with(executor, &mut plans[plan], inputs, microbatches, options)?;
            if round > 0 {
                runs.wall_secs[plan].push(report.wall_secs);
                runs.stage_cpu_secs[plan].push(report.stages.iter().map(|s| s.cpu_secs).collect());
            }
        }
        after_round(round);
    }
    Ok(runs)
}

impl PairedRuns {
    /// Each counted round's slowest stage CPU time of `plan`.
    pub fn bottlenecks(&self, plan: usize) -> Vec<f64> {
        self.stage_cpu_secs[plan]
            .iter()
            .map(|round| round.iter().copied().fold(0.0, f64::max))
            .collect()
    }

    /// Each counted round's bottleneck of `plan` over that of `reference`: below 1, `plan` was
    /// faster in that round.
    pub fn ratios(&self, plan: usize, reference: usize) -> Vec<f64> {
        self.bottlenecks(plan)
            .iter()
            .zip(self.bottlenecks(reference))
            .map(|(ours, theirs)| ours / theirs)
            .collect()
    }

    /// Whether `plan` beat `reference` by at least `margin` in the median round and in so many
    /// rounds that a tie would do as well with a chance of 5% at most (a one-sided sign test:
    /// all of 6 rounds, 9 of 10, 15 of 20): a difference the rounds agree on beyond what a noisy
    /// round or two would make.
    pub fn clearly_beats(&self, plan: usize, reference: usize, margin: f64) -> bool {
        let ratios = self.ratios(plan, reference);
        let wins = ratios.iter().filter(|&&r| r < 1.0).count();
        !ratios.is_empty()
            && wins >= sign_test_wins(ratios.len())
            && percentiles(&ratios).0 <= 1.0 - margin
    }

    /// The plan that beat `reference` clearly ([`Self::clearly_beats`]), the fastest median
    /// if several did.
    pub fn clear_winner_over(&self, reference: usize, margin: f64) -> Option<usize> {
        (0..self.stage_cpu_secs.len())
            .filter(|&p| p != reference && self.clearly_beats(p, reference, margin))
            .map(|p| (p, percentiles(&self.ratios(p, reference)).0))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p)
    }

    /// The plan to keep, given each plan's predicted bottleneck (`predicted`, plan 0 the one
    /// the others must clearly beat to replace): of plan 0 and the plans that clearly beat it,
    /// those that none of them clearly beats are measured ties, and the one predicted fastest
    /// of those is kept (the earlier on equal predictions). A tie decided by the fastest median
    /// would flip from run to run with the noise; the prediction does not. Where clear wins go
    /// round in a circle, which rounds paired on the same machine all but rule out, the fastest
    /// clear winner over plan 0.
    pub fn choose(&self, predicted: &[f64], margin: f64) -> usize {
        let plans = 0..self.stage_cpu_secs.len();
        let eligible: Vec<usize> = plans
            .filter(|&p| p == 0 || self.clearly_beats(p, 0, margin))
            .collect();
        eligible
            .iter()
            .copied()
            .filter(|&p| !eligible.iter().any(|&q| self.clearly_beats(q, p, margin)))
            .min_by(|&a, &b| predicted[a].total_cmp(&predicted[b]).then(a.cmp(&b)))
            .or_else(|| self.clear_winner_over(0, margin))
            .unwrap_or(0)
    }

    /// The plan other than `kept` with the fastest median round against it, where that median
    /// is faster than `kept`: the one a second, paired round between the two should settle.
    pub fn closest_challenger(&self, kept: usize) -> Option<usize> {
        (0..self.stage_cpu_secs.len())
            .filter(|&p| p != kept)
            .map(|p| (p, percentiles(&self.ratios(p, kept)).0))
            .filter(|&(_, median)| median < 1.0)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p)
    }
}

/// The fewest wins in `rounds` paired rounds that a plan no faster than its rival reaches with
/// a chance of at most 5% (each round a fair coin): `rounds + 1`, never, below 5 rounds.
pub fn sign_test_wins(rounds: usize) -> usize {
    let total = 2f64.powi(rounds as i32);
    let mut tail = 0.0;
    let mut choose = 1.0; // C(rounds, k), from k = rounds down
    for k in (0..=rounds).rev() {
        tail += choose / total;
        if tail > 0.05 {
            return k + 1;
        }
        choose = choose * k as f64 / (rounds - k + 1) as f64;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(bottlenecks: &[&[f64]]) -> PairedRuns {
        PairedRuns {
            wall_secs: bottlenecks.iter().map(|b| b.to_vec()).collect(),
            // Two stages a round; the second is the bottleneck.
            stage_cpu_secs: bottlenecks
                .iter()
                .map(|b| b.iter().map(|&s| vec![s / 2.0, s]).collect())
                .collect(),
        }
    }

    #[test]
    fn the_sign_test_asks_for_all_of_six_rounds_nine_of_ten_and_fifteen_of_twenty() {
        assert_eq!(sign_test_wins(4), 5);
        assert_eq!(sign_test_wins(5), 5);
        assert_eq!(sign_test_wins(6), 6);
        assert_eq!(sign_test_wins(8), 7);
        assert_eq!(sign_test_wins(10), 9);
        assert_eq!(sign_test_wins(20), 15);
    }

    #[test]
    fn a_winner_beats_the_reference_in_enough_rounds_and_by_the_margin_in_the_median() {
        let r = runs(&[
            &[1.0; 6],
            // Faster in the median, slower in one of six rounds: a tie could do that.
            &[0.90, 0.92, 1.01, 0.90, 0.91, 0.93],
            // Faster in every round by 3–5%.
            &[0.95, 0.97, 0.96, 0.95, 0.96, 0.97],
            // Faster in every round, by less than the margin.
            &[0.995, 0.999, 0.992, 0.995, 0.999, 0.992],
        ]);
        assert_eq!(r.ratios(2, 0), vec![0.95, 0.97, 0.96, 0.95, 0.96, 0.97]);
        assert_eq!(r.clear_winner_over(0, 0.01), Some(2));
        assert_eq!(r.clear_winner_over(0, 0.05), None);
        // Against plan 2, nothing wins enough rounds.
        assert_eq!(r.clear_winner_over(2, 0.0), None);
        // Over ten rounds one lost round is allowed: nine wins of ten.
        let ten = runs(&[
            &[1.0; 10],
            &[0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 1.01],
        ]);
        assert_eq!(ten.clear_winner_over(0, 0.01), Some(1));
    }

    #[test]
    fn measured_ties_keep_the_plan_predicted_faster() {
        let r = runs(&[
            &[1.0; 6],
            // Both beat plan 0 by 3–5% in every round, and each beats the other in some.
            &[0.95, 0.97, 0.96, 0.95, 0.96, 0.97],
            &[0.96, 0.96, 0.95, 0.96, 0.95, 0.96],
            // Beats plan 0 in 5 rounds of 6: not clearly.
            &[0.90, 0.90, 0.90, 0.90, 0.90, 1.01],
        ]);
        assert!(r.clearly_beats(1, 0, 0.01) && r.clearly_beats(2, 0, 0.01));
        assert!(!r.clearly_beats(1, 2, 0.01) && !r.clearly_beats(2, 1, 0.01));
        // The fastest median alone would take plan 2 or plan 1 as the noise falls.
        assert_eq!(r.choose(&[1.0, 1.02, 1.01, 1.0], 0.01), 2);
        assert_eq!(r.choose(&[1.0, 1.01, 1.02, 1.0], 0.01), 1);
        // Equal predictions: the earlier.
        assert_eq!(r.choose(&[1.0, 1.01, 1.01, 1.0], 0.01), 1);
        // Nothing beats plan 0 clearly: plan 0 stays, whatever the predictions.
        let tie = runs(&[&[1.0; 6], &[0.99, 1.01, 0.98, 1.0, 1.02, 0.97]]);
        assert_eq!(tie.choose(&[1.0, 0.5], 0.01), 0);
    }

    #[test]
    fn a_plan_that_clearly_beats_another_winner_is_kept_over_it() {
        let r = runs(&[
            &[1.0; 6],
            &[0.97, 0.97, 0.97, 0.97, 0.97, 0.97],
            // 5% faster than plan 1 in every round.
            &[0.92, 0.92, 0.92, 0.92, 0.92, 0.92],
        ]);
        assert_eq!(r.choose(&[1.0, 1.01, 1.05], 0.01), 2);
        assert_eq!(r.closest_challenger(2), None);
        assert_eq!(r.closest_challenger(0), Some(2));
        assert_eq!(r.closest_challenger(1), Some(2));
    }
}
