//! What proves a plan optimal, recorded with its [`super::SolveStatus::Optimal`] so that
//! `pipecut check` proves it again from the model, the cluster and the plan alone: a status
//! edited to "optimal" (with its bound and gap edited to match) then proves nothing, and a cut
//! constraint switched off after the solve changes the problem the proof was about.
//!
//! Each method is re-derived, never trusted: the bounds are recomputed (bounds.rs, the LP
//! relaxation of milp.rs), a chain is recognised again and its DP rerun, and a search's proof is
//! searched again from the plan itself (the ideal search and the MILP at once, as the planner
//! runs them), which is as cheap as a search can be: the plan is already the incumbent.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::dp::{self, RELATIVE_TOLERANCE};
use super::problem::{PartitionProblem, StageId};
use super::{bounds, ideal_search, is_chain, milp, Beside, LowerBounds};

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

/// The search's proof again, from `plan` as the incumbent: the ideal search and the MILP at
/// once, as the planner runs them ([`super::Planner::search_beside_milp`]), the first proof
/// ending the other; one after the other, the MILP got only what the search left, and a claim
/// the planner proved with the MILP's whole limit could not be proven again. A plan either
/// search beats is refuted; one neither beats nor proves by the deadline stands, with a note:
/// the original solve may have had a longer limit or a faster machine, and refusing an honest
/// plan for that would be wrong.
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
    // The MILP aims a little before the deadline, so that its answer is in by then.
    let grace = deadline.saturating_duration_since(started) / 50;
    let milp_deadline = deadline.checked_sub(grace).unwrap_or(deadline);
    let beside = Beside::new();
    let answer = spawn_milp(problem, plan, milp_deadline, &beside);
    let run = ideal_search::solve_beside(problem, plan, milp_deadline, &beside.proven_floor);
    let verdict = verdict(&run, answer, deadline, unbeaten, started);
    // Whatever the verdict, a MILP still running has nothing more to say.
    beside.stop.store(true, Ordering::Relaxed);
    verdict
}

/// [`search_again`]'s verdict on the search's `run` and the MILP's `answer`, waited for until
/// `deadline` unless the search proved the plan; `unbeaten` refutes a plan either finds that
/// beats the claim.
fn verdict(
    run: &ideal_search::SearchRun,
    answer: Option<Receiver<milp::MilpRun>>,
    deadline: Instant,
    unbeaten: impl Fn(&[StageId]) -> Result<(), String>,
    started: Instant,
) -> Reproof {
    unbeaten(&run.stage_of)?;
    // Proven by the search, or by the MILP's bound: the search's plan is then the optimum.
    if run.end == ideal_search::SearchEnd::Proven {
        return Ok(None);
    }
    let wait = deadline.saturating_duration_since(Instant::now());
    let milp = answer.and_then(|answer| answer.recv_timeout(wait).ok());
    if let Some(milp) = &milp {
        unbeaten(&milp.stage_of)?;
    }
    match milp.is_some_and(|milp| milp.proven) {
        true => Ok(None),
        false => Ok(Some(format!(
            "the optimal status was not proven again: neither the ideal search nor the MILP beside it finished within {:.0} s, and neither found a faster plan",
            started.elapsed().as_secs_f64().max(1.0)
        ))),
    }
}

/// The MILP from `plan` on a thread of its own, beside the ideal search: it starts after the
/// search's head start unless the search has proven the plan by then, stops at its next slice
/// once `beside.stop` is set, and gives `beside` its bound when it proves its plan. `None`
/// when no thread could be had (the search alone then decides). Its answer is not waited for
/// once the search has proven the plan.
fn spawn_milp(
    problem: &PartitionProblem,
    plan: &[StageId],
    deadline: Instant,
    beside: &Beside,
) -> Option<Receiver<milp::MilpRun>> {
    let (sender, answer) = std::sync::mpsc::channel();
    let (problem, plan, beside) = (problem.clone(), plan.to_vec(), beside.clone());
    let solve = move || {
        if beside.stopped_in_head_start() {
            return;
        }
        let run = milp::solve_stoppable(&problem, &plan, deadline, Arc::clone(&beside.stop));
        if let (true, Some(bound)) = (run.proven, run.bound_secs) {
            beside.prove_floor(bound);
        }
        // The receiver is gone when `check` stopped waiting: nothing to do then.
        let _ = sender.send(run);
    };
    std::thread::Builder::new()
        .name("pipecut-check-milp".into())
        .spawn(solve)
        .ok()
        .map(|_| answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama_tiny on an A100 and three L4s, in `stages` stages, with the DP's plan.
    fn llama(stages: u32) -> (PartitionProblem, Vec<StageId>) {
        let problem = crate::partition::tests::llama_mixed(stages);
        let plan = dp::solve(&problem).unwrap().stage_of;
        (problem, plan)
    }

    /// The MILP's answer `run`, as its thread would send it.
    fn answered(run: milp::MilpRun) -> Option<Receiver<milp::MilpRun>> {
        let (sender, answer) = std::sync::mpsc::channel();
        sender.send(run).unwrap();
        Some(answer)
    }

    fn milp_run(stage_of: &[StageId], proven: bool) -> milp::MilpRun {
        milp::MilpRun {
            stage_of: stage_of.to_vec(),
            proven,
            bound_secs: None,
            stopped: None,
            error: None,
        }
    }

    #[test]
    fn a_search_stopped_by_the_clock_leaves_the_verdict_to_the_milp_beside_it() {
        let (problem, plan) = llama(4);
        let bottleneck = problem.evaluate(&plan).bottleneck_secs;
        // Everything but the last node on the first stage: a worse plan than the DP's.
        let mut worse = vec![StageId(0); plan.len()];
        *worse.last_mut().unwrap() = StageId(3);
        assert!(problem.evaluate(&worse).bottleneck_secs > bottleneck * 1.01);
        let problem = &problem;
        let unbeaten = |claimed: f64| {
            move |found: &[StageId]| match meets(claimed, problem.evaluate(found).bottleneck_secs) {
                true => Ok(()),
                false => Err("beaten".to_string()),
            }
        };
        let stopped = |stage_of: &[StageId]| ideal_search::SearchRun {
            stage_of: stage_of.to_vec(),
            end: ideal_search::SearchEnd::Deadline,
            work: 0,
        };
        let now = Instant::now();
        let soon = now + Duration::from_secs(5);
        // The MILP proved the plan the search could not: proven again.
        let proven = answered(milp_run(&plan, true));
        assert_eq!(
            verdict(&stopped(&plan), proven, soon, unbeaten(bottleneck), now),
            Ok(None)
        );
        // The MILP found a better plan than the claim: refuted.
        let better = answered(milp_run(&plan, false));
        let claimed = problem.evaluate(&worse).bottleneck_secs;
        let refuted = verdict(&stopped(&worse), better, soon, unbeaten(claimed), now);
        assert_eq!(refuted, Err("beaten".to_string()));
        // Neither proved nor beat it: the claim stands, with a note.
        let unproven = answered(milp_run(&plan, false));
        let note = verdict(&stopped(&plan), unproven, soon, unbeaten(bottleneck), now);
        assert!(note.as_ref().is_ok_and(Option::is_some), "{note:?}");
        // No MILP thread, or none that answered by the deadline: the same note.
        let none = verdict(&stopped(&plan), None, soon, unbeaten(bottleneck), now);
        assert!(none.as_ref().is_ok_and(Option::is_some), "{none:?}");
        let (_silent, answer) = std::sync::mpsc::channel();
        let late = verdict(
            &stopped(&plan),
            Some(answer),
            now,
            unbeaten(bottleneck),
            now,
        );
        assert!(late.as_ref().is_ok_and(Option::is_some), "{late:?}");
    }

    #[test]
    fn a_searched_optimum_is_proven_again_and_a_worse_plan_relabelled_is_refuted() {
        let (problem, plan) = llama(4);
        let best = ideal_search::solve(&problem, &plan, Instant::now() + REPROVE_LIMIT, None);
        assert_eq!(best.end, ideal_search::SearchEnd::Proven);
        let deadline = Instant::now() + REPROVE_LIMIT;
        assert_eq!(search_again(&problem, &best.stage_of, deadline), Ok(None));
        let mut worse = vec![StageId(0); plan.len()];
        *worse.last_mut().unwrap() = StageId(3);
        let deadline = Instant::now() + REPROVE_LIMIT;
        let refuted = search_again(&problem, &worse, deadline).unwrap_err();
        assert!(refuted.contains("smaller bottleneck"), "{refuted}");
    }
}
