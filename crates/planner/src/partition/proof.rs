//! What proves a plan optimal, recorded with its [`super::SolveStatus::Optimal`] so that
//! `pipecut check` proves it again from the model, the cluster and the plan alone: a status
//! edited to "optimal" (with its bound and gap edited to match) then proves nothing, and a cut
//! constraint switched off after the solve changes the problem the proof was about.
//!
//! Each method is re-derived, never trusted: the bounds are recomputed (bounds.rs, the LP
//! relaxation of milp.rs), a chain is recognised again and its DP rerun, and a search's proof is
//! searched again from the plan itself (the ideal search, then the MILP where the graph is too
//! large for it), which is as cheap as a search can be: the plan is already the incumbent.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::dp::{self, RELATIVE_TOLERANCE};
use super::problem::{PartitionProblem, StageId};
use super::{bounds, ideal_search, is_chain, milp, LowerBounds};

/// How long `check` may search to prove a recorded optimum again before it refuses the claim
/// as one it cannot verify. A search from the optimum itself only has to exhaust the space
/// below it, which took well under a second on every fixture.
pub const REPROVE_LIMIT: Duration = Duration::from_secs(60);

/// The proof of an optimal plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OptimalityProof {
    /// Which argument proves it.
    pub method: ProofMethod,
    /// Positions of the problem the proof is about: the model's nodes, or the groups its cut
    /// constraints join (the claim holds over the partitions those constraints allow).
    pub positions: usize,
}

/// Which argument proves a plan optimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProofMethod {
    /// The bottleneck meets the average-work or the granularity bound (bounds.rs).
    MeetsBound,
    /// The bottleneck meets the optimum of the MILP's LP relaxation, windowed at the bottleneck.
    MeetsLpRelaxation,
    /// The graph is a chain, so the DP's cuts of its only order are every convex partition.
    Chain,
    /// An exhaustive search (the ideal search, or the MILP's branch and bound) found no better
    /// plan.
    Search,
}

impl ProofMethod {
    /// The argument in words, for messages.
    fn describe(self) -> &'static str {
        match self {
            ProofMethod::MeetsBound => "meeting the average-work or granularity bound",
            ProofMethod::MeetsLpRelaxation => "meeting the LP relaxation's bound",
            ProofMethod::Chain => "the graph being a chain",
            ProofMethod::Search => "an exhaustive search",
        }
    }
}

/// Whether `secs` is at most `bound` within the solvers' tolerance.
fn meets(secs: f64, bound: f64) -> bool {
    secs <= bound * (1.0 + RELATIVE_TOLERANCE)
}

/// The proof of a plan the planner proved optimal on `problem`, with bottleneck `bottleneck` and
/// the bounds it proved: the cheapest argument that holds, the search last.
pub(crate) fn proof_of(
    problem: &PartitionProblem,
    bottleneck: f64,
    proved: &LowerBounds,
) -> OptimalityProof {
    let combinatorial = proved
        .granularity_secs
        .unwrap_or(0.0)
        .max(proved.average_work_secs);
    let method = if meets(bottleneck, combinatorial) {
        ProofMethod::MeetsBound
    } else if proved
        .lp_relaxation_secs
        .is_some_and(|lp| meets(bottleneck, lp))
    {
        ProofMethod::MeetsLpRelaxation
    } else if is_chain(problem) {
        ProofMethod::Chain
    } else {
        ProofMethod::Search
    };
    OptimalityProof {
        method,
        positions: problem.node_count(),
    }
}

/// What proving a claim again gave: `Ok(None)` proven; `Ok(Some(note))` neither proven nor
/// refuted within the limit (a search that did not finish and found no faster plan), the note
/// saying so; `Err(why)` refuted, in one phrase.
pub(crate) type Reproof = Result<Option<String>, String>;

/// Proves again that `plan` (an assignment of `problem`'s positions) is optimal by `proof`
/// within `limit`. `None` for `proof`: a plan from before proofs were recorded, proven by
/// whichever argument holds.
pub(crate) fn reprove(
    problem: &PartitionProblem,
    plan: &[StageId],
    proof: Option<OptimalityProof>,
    limit: std::time::Duration,
) -> Reproof {
    let deadline = Instant::now() + limit.min(REPROVE_LIMIT);
    let Some(proof) = proof else {
        let methods = [
            ProofMethod::MeetsBound,
            ProofMethod::MeetsLpRelaxation,
            ProofMethod::Chain,
            ProofMethod::Search,
        ];
        let mut why = String::new();
        for method in methods {
            match reprove_by(problem, plan, method, deadline) {
                Ok(note) => return Ok(note),
                Err(reason) => why = reason,
            }
        }
        return Err(why);
    };
    if proof.positions != problem.node_count() {
        return Err(format!(
            "its proof (summary.proof) was made over {} positions but the model under the plan's config.cut_constraints has {}: a cut constraint was changed after the solve",
            proof.positions,
            problem.node_count()
        ));
    }
    reprove_by(problem, plan, proof.method, deadline)
        .map_err(|why| format!("its proof by {} fails: {why}", proof.method.describe()))
}

fn reprove_by(
    problem: &PartitionProblem,
    plan: &[StageId],
    method: ProofMethod,
    deadline: Instant,
) -> Reproof {
    let bottleneck = problem.evaluate(plan).bottleneck_secs;
    let ms = |secs: f64| format!("{:.6} ms", secs * 1e3);
    match method {
        ProofMethod::MeetsBound => {
            let average = problem.lower_bound_secs();
            let bound = bounds::granularity_bound_secs(problem, deadline, None)
                .map_or(average, |g| g.max(average));
            match meets(bottleneck, bound) {
                true => Ok(None),
                false => Err(format!(
                    "the bound re-derived is {}, below the bottleneck {}",
                    ms(bound),
                    ms(bottleneck)
                )),
            }
        }
        ProofMethod::MeetsLpRelaxation => {
            match milp::lp_relaxation_bound_secs(problem, bottleneck, deadline) {
                Some(lp) if meets(bottleneck, lp) => Ok(None),
                Some(lp) => Err(format!(
                    "the LP relaxation re-derived is {}, below the bottleneck {}",
                    ms(lp),
                    ms(bottleneck)
                )),
                None => Err("the LP relaxation could not be solved again".into()),
            }
        }
        ProofMethod::Chain if !is_chain(problem) => Err("the graph is not a chain".into()),
        ProofMethod::Chain => match dp::solve(problem) {
            Some(best) if meets(bottleneck, best.evaluation.bottleneck_secs) => Ok(None),
            Some(best) => Err(format!(
                "the DP over the chain finds a bottleneck of {}, below {}",
                ms(best.evaluation.bottleneck_secs),
                ms(bottleneck)
            )),
            None => Err("the DP finds no plan that fits".into()),
        },
        ProofMethod::Search => search_again(problem, plan, deadline),
    }
}

/// The search's proof again, from `plan` as the incumbent: the ideal search, then the MILP when
/// the graph is too large for it or it did not finish. A plan either search beats is refuted; one
/// neither beats nor proves by the deadline stands, with a note: the original solve may have had
/// a longer limit or a faster machine, and refusing an honest plan for that would be wrong.
fn search_again(problem: &PartitionProblem, plan: &[StageId], deadline: Instant) -> Reproof {
    let bottleneck = problem.evaluate(plan).bottleneck_secs;
    // Both searches return the incumbent or a better plan, each evaluated again here.
    let unbeaten = |found: &[StageId]| {
        let secs = problem.evaluate(found).bottleneck_secs;
        match meets(bottleneck, secs) {
            true => Ok(()),
            false => Err(format!(
                "a search from the plan finds one with a smaller bottleneck ({:.6} ms < {:.6} ms)",
                secs * 1e3,
                bottleneck * 1e3
            )),
        }
    };
    let started = Instant::now();
    let run = ideal_search::solve(problem, plan, deadline, None);
    unbeaten(&run.stage_of)?;
    if run.end == ideal_search::SearchEnd::Proven {
        return Ok(None);
    }
    let milp = milp::solve(problem, plan, deadline);
    unbeaten(&milp.stage_of)?;
    match milp.proven {
        true => Ok(None),
        false => Ok(Some(format!(
            "the optimal status was not proven again: neither the ideal search nor the MILP finished within {:.0} s, and neither found a faster plan",
            started.elapsed().as_secs_f64().max(1.0)
        ))),
    }
}
