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
use crate::cost::measured::percentiles;
use crate::Error;

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

    /// The plan that beat `reference` in every round and by at least `margin` in the median
    /// round (the fastest such median), if any: a difference the rounds agree on and noise
    /// of that size would not make.
    pub fn clear_winner_over(&self, reference: usize, margin: f64) -> Option<usize> {
        (0..self.stage_cpu_secs.len())
            .filter(|&p| p != reference)
            .map(|p| (p, self.ratios(p, reference)))
            .filter(|(_, r)| !r.is_empty() && r.iter().all(|&x| x < 1.0))
            .map(|(p, r)| (p, percentiles(&r).0))
            .filter(|&(_, m)| m <= 1.0 - margin)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p)
    }
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
    fn a_winner_beats_the_reference_in_every_round_and_by_the_margin_in_the_median() {
        let r = runs(&[
            &[1.0, 1.0, 1.0],
            // Faster in the median, slower in one round: noise, not a winner.
            &[0.90, 0.92, 1.01],
            // Faster in every round by 3–5%.
            &[0.95, 0.97, 0.96],
            // Faster in every round, by less than the margin.
            &[0.995, 0.999, 0.992],
        ]);
        assert_eq!(r.ratios(2, 0), vec![0.95, 0.97, 0.96]);
        assert_eq!(r.clear_winner_over(0, 0.01), Some(2));
        assert_eq!(r.clear_winner_over(0, 0.05), None);
        // Against plan 2, nothing wins every round.
        assert_eq!(r.clear_winner_over(2, 0.0), None);
    }
}
