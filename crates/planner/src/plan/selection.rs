//! `summary.measured_selection`: the plans `partition --select-by-running` ran, what each
//! measured, and which one the plan is (schema version 8).
//!
//! Every candidate is written as the plan's own assignment with some nodes on other stages, so
//! `check` re-derives each candidate's predicted bottleneck; the measured figures are a record
//! of one run on one machine, which nothing can re-derive.

use serde::{Deserialize, Serialize};

use crate::partition::{HeuristicReason, PartitionProblem, SolveStatus, StageId};
use crate::Error;

/// The candidates run and the one chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MeasuredSelection {
    /// Counted paired rounds (after one warm-up round).
    pub rounds: u32,
    /// Micro-batches each run streamed.
    pub microbatches: u32,
    /// What chose: `"cpu runtime, one pinned core per stage"`.
    pub measured_on: String,
    /// The cost model's optimum first, then its rivals: its boundary moves, then the peers'
    /// plans.
    pub candidates: Vec<SelectionCandidate>,
    /// Where the rounds left a candidate measured faster than the one they chose without a
    /// clear win, the second paired rounds between the two that settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runoff: Option<Runoff>,
}

/// A second set of paired rounds between the candidate the first rounds chose and the one
/// measured fastest against it; the challenger replaces it only by a clear win.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Runoff {
    /// Counted paired rounds (after one warm-up round).
    pub rounds: u32,
    /// The candidate the first rounds chose (its index in `candidates`).
    pub incumbent: u32,
    /// The candidate measured fastest against it.
    pub challenger: u32,
    /// Median over these rounds of the challenger's bottleneck over the incumbent's (below 1:
    /// faster).
    pub measured_ratio: f64,
    /// The smallest and largest per-round ratio.
    pub measured_ratio_range: [f64; 2],
}

/// One plan that was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SelectionCandidate {
    /// How it came about, e.g. `cost model's optimum`, `boundary 0 moved earlier across 2
    /// node(s) from 'x'`, `the plan of torchgpipe 0.0.7 balance_by_time`; `, also the plan of
    /// …` where peers' plans are the same.
    pub origin: String,
    /// Whether the plan is this candidate.
    pub chosen: bool,
    /// Nodes on another stage than in the plan (empty for the chosen candidate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<MovedNode>,
    /// Its bottleneck on the cost model.
    pub predicted_bottleneck_secs: f64,
    /// Its slowest stage's CPU time per micro-batch, median over the rounds.
    pub measured_bottleneck_secs: f64,
    /// Median over the rounds of its bottleneck over the cost model optimum's (below 1:
    /// faster), and the smallest and largest round's.
    pub measured_ratio: f64,
    /// The smallest and largest per-round ratio.
    pub measured_ratio_range: [f64; 2],
}

/// A node on another stage in a candidate than in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MovedNode {
    /// Its name.
    pub node: String,
    /// Its stage in the candidate.
    pub stage: u32,
}

impl MeasuredSelection {
    /// Re-derives each candidate's predicted bottleneck on `problem` from `assignment` (the
    /// plan's), and checks that the plan is the one candidate marked chosen and that the status
    /// says so when that is not the cost model's optimum.
    pub(crate) fn rederive(
        &mut self,
        problem: &PartitionProblem,
        assignment: &[StageId],
    ) -> Result<(), Error> {
        let bad = |detail: String| Err(Error::InvalidPlan(format!("measured_selection: {detail}")));
        let position: std::collections::HashMap<&str, usize> = problem
            .node_names()
            .singles()
            .map(|(p, n)| (n, p))
            .collect();
        if self.candidates.iter().filter(|c| c.chosen).count() != 1 {
            return bad("exactly one candidate must be chosen".into());
        }
        if let Some(runoff) = &self.runoff {
            let pair = [runoff.incumbent, runoff.challenger];
            let chosen = |i: u32| self.candidates.get(i as usize).map(|c| c.chosen);
            if pair.iter().any(|&i| chosen(i).is_none()) || pair[0] == pair[1] {
                return bad("the runoff names candidates that are not two of the list".into());
            }
            if pair.iter().all(|&i| chosen(i) == Some(false)) {
                return bad("the runoff's winner is not the chosen candidate".into());
            }
        }
        for (i, candidate) in self.candidates.iter_mut().enumerate() {
            if candidate.chosen && !candidate.moved.is_empty() {
                return bad(format!("candidate {i} is chosen but moves nodes"));
            }
            let mut stage_of = assignment.to_vec();
            for moved in &candidate.moved {
                let Some(&p) = position.get(moved.node.as_str()) else {
                    return bad(format!("candidate {i} moves '{}', not a node", moved.node));
                };
                stage_of[p] = StageId(moved.stage);
            }
            problem
                .check_assignment(&stage_of)
                .or_else(|e| bad(format!("candidate {i}: {e}")))?;
            candidate.predicted_bottleneck_secs = problem.evaluate(&stage_of).bottleneck_secs;
        }
        Ok(())
    }

    /// The cost model's optimum's predicted bottleneck where a rival was chosen, else 0: the
    /// lower bound a plan chosen by running keeps from the optimum's proof.
    pub(crate) fn proven_optimum_secs(&self) -> f64 {
        match self.candidates.first() {
            Some(optimum) if !optimum.chosen => optimum.predicted_bottleneck_secs,
            _ => 0.0,
        }
    }

    /// Whether `status` fits the choice: a plan other than the cost model's optimum is not
    /// proven optimal on it, and says why.
    pub(crate) fn check_status(&self, status: SolveStatus) -> Result<(), Error> {
        let optimum_chosen = self.candidates.first().is_some_and(|c| c.chosen);
        let says_selected = status
            == SolveStatus::Heuristic {
                reason: HeuristicReason::SelectedByRunning,
            };
        if optimum_chosen == says_selected {
            return Err(Error::InvalidPlan(format!(
                "measured_selection: the {} was chosen but the status is {status:?}",
                if optimum_chosen {
                    "cost model's optimum"
                } else {
                    "rival of the cost model's optimum"
                }
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::problem::tests::chain;
    use crate::partition::CostSettings;
    use pipecut_cost::{Catalog, Cluster, DeviceId};

    fn candidate(chosen: bool, moved: &[usize]) -> SelectionCandidate {
        SelectionCandidate {
            origin: "a plan".into(),
            chosen,
            moved: moved
                .iter()
                .map(|&i| MovedNode {
                    node: format!("/layers.{i}/MatMul"),
                    stage: 1,
                })
                .collect(),
            predicted_bottleneck_secs: 0.0,
            measured_bottleneck_secs: 1.0,
            measured_ratio: 1.0,
            measured_ratio_range: [1.0, 1.0],
        }
    }

    #[test]
    fn a_runoff_must_be_between_two_candidates_one_of_them_the_plan() {
        let graph = chain(4, 64, 8);
        let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
        let devices: Vec<DeviceId> = (0..2).map(DeviceId).collect();
        let problem =
            PartitionProblem::new(&graph, &cluster, &devices, CostSettings::default()).unwrap();
        let plan = problem.contiguous_assignment(&[0, 3]);
        let runoff = |incumbent, challenger| Runoff {
            rounds: 4,
            incumbent,
            challenger,
            measured_ratio: 0.98,
            measured_ratio_range: [0.97, 0.99],
        };
        let mut selection = MeasuredSelection {
            rounds: 2,
            microbatches: 2,
            measured_on: "test".into(),
            candidates: vec![
                candidate(true, &[]),
                candidate(false, &[2]),
                candidate(false, &[1, 2]),
            ],
            runoff: Some(runoff(0, 1)),
        };
        selection.rederive(&problem, &plan).unwrap();
        // Each candidate's prediction comes from the plan with its nodes moved.
        let moved_one = problem.contiguous_assignment(&[0, 2]);
        assert_eq!(
            selection.candidates[1].predicted_bottleneck_secs,
            problem.evaluate(&moved_one).bottleneck_secs
        );
        for (bad, why) in [
            (runoff(1, 2), "winner"),
            (runoff(0, 3), "not two"),
            (runoff(1, 1), "not two"),
        ] {
            selection.runoff = Some(bad);
            let err = selection.rederive(&problem, &plan).unwrap_err().to_string();
            assert!(err.contains("runoff") && err.contains(why), "{err}");
        }
    }
}
