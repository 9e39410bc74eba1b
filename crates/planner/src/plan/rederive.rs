//! Re-deriving a plan's figures from its node assignment: the one transcription of an evaluated
//! assignment into plan stages (used when a plan is made, by `check` to audit it, and by
//! `check --rewrite` to repair a hand-edited one), and the field-by-field comparison that names
//! every figure a plan records wrongly.
//!
//! Comparing the recorded plan with the re-derived one as JSON values, rather than field by
//! field in code, means a figure added to the format later is audited without anyone
//! remembering to add it here.

use serde_json::Value;

use super::{
    PlanBaseline, PlanCandidate, PlanDevice, PlanStage, ReceivedTensor, SentTensor, StageNodes,
};
use crate::partition::{BaselineResult, Evaluation, PartitionProblem, StageId};

/// The plan stages of `stage_of` (a stage for every position of `problem.order()`), whose
/// figures are `evaluation`.
pub(crate) fn transcribe_stages(
    problem: &PartitionProblem,
    stage_of: &[StageId],
    evaluation: &Evaluation,
) -> Vec<PlanStage> {
    let k = problem.stage_count();
    let mut nodes_of: Vec<StageNodes> = vec![StageNodes::default(); k];
    for (p, s) in stage_of.iter().enumerate() {
        nodes_of[s.index()].push(problem.node_names().name(p));
    }
    let producer_stage = |position: u32| stage_of[position as usize].0;
    let mut stages = Vec::with_capacity(k);
    for (s, figures) in evaluation.stages.iter().enumerate() {
        let device = &problem.stages()[s];
        let received = figures
            .received_flows
            .iter()
            .map(|&f| {
                let flow = &problem.flows()[f as usize];
                ReceivedTensor {
                    tensor: problem.name(flow.name).to_string(),
                    from_stage: s as u32 - 1,
                    producer_stage: producer_stage(flow.producer),
                    bytes: flow.bytes,
                    transfer_secs: problem.receive_secs(s, 1, flow.bytes),
                }
            })
            .collect();
        let sent = evaluation
            .stages
            .get(s + 1)
            .map(|next| {
                next.received_flows
                    .iter()
                    .map(|&f| {
                        let flow = &problem.flows()[f as usize];
                        SentTensor {
                            tensor: problem.name(flow.name).to_string(),
                            to_stage: s as u32 + 1,
                            bytes: flow.bytes,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let nodes = std::mem::take(&mut nodes_of[s]);
        stages.push(PlanStage {
            stage: s as u32,
            device: PlanDevice {
                id: device.device.0,
                name: device.device_name.clone(),
            },
            node_count: nodes.len(),
            first_node: nodes.first().unwrap_or_default().to_string(),
            last_node: nodes.last().unwrap_or_default().to_string(),
            nodes,
            received,
            sent,
            param_bytes: figures.param_bytes,
            activation_bytes: figures.activation_bytes,
            weight_input_bytes: figures.weight_input_bytes,
            received_bytes: figures.received_bytes,
            in_flight_microbatches: figures.in_flight,
            peak_memory_bytes: figures.peak_memory_bytes,
            capacity_bytes: figures.capacity_bytes,
            device_memory_bytes: device.memory_bytes,
            compute_secs: figures.compute_secs,
            receive_secs: figures.receive_secs,
            gradient_receive_secs: figures.gradient_receive_secs,
            stage_secs: figures.stage_secs,
        });
    }
    stages
}

/// The baselines as a plan records them, each compared with a plan of `bottleneck_secs`.
pub(crate) fn plan_baselines(
    baselines: &[BaselineResult],
    bottleneck_secs: f64,
) -> Vec<PlanBaseline> {
    baselines
        .iter()
        .map(|b| PlanBaseline {
            method: b.baseline,
            peer: b.peer.clone(),
            bottleneck_secs: b.bottleneck_secs,
            fits: b.fits,
            plan_speedup: b
                .bottleneck_secs
                .filter(|_| bottleneck_secs > 0.0)
                .map(|x| x / bottleneck_secs),
            error: b.error.clone(),
        })
        .collect()
}

/// The row of a `--stages auto` table for the plan's own stage count, from its simulation.
pub(crate) fn chosen_candidate(
    stages: usize,
    bottleneck_secs: f64,
    step_secs: f64,
    bubble_fraction: f64,
) -> PlanCandidate {
    PlanCandidate {
        stages,
        bottleneck_secs: Some(bottleneck_secs),
        step_secs: Some(step_secs),
        bubble_fraction: Some(bubble_fraction),
    }
}

/// `(bottleneck − bound) / bottleneck`, 0 for a zero bottleneck (as a solution computes it).
pub(crate) fn relative_gap(bottleneck_secs: f64, bound_secs: f64) -> f64 {
    if bottleneck_secs > 0.0 {
        ((bottleneck_secs - bound_secs) / bottleneck_secs).max(0.0)
    } else {
        0.0
    }
}

/// One figure a plan records that differs from the re-derived one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mismatch {
    /// Where: `stage 2 received[0].bytes`, `summary cut_bytes`.
    pub field: String,
    /// The plan's value, as JSON.
    pub recorded: String,
    /// The re-derived value, as JSON.
    pub recomputed: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} in the plan but {} recomputed",
            self.field, self.recorded, self.recomputed
        )
    }
}

/// Every difference between `recorded` and `recomputed` (JSON of the same type), in document
/// order, named from `path`. Numbers agree within 1e-9 relative: the JSON round trip of an f64
/// is exact, only summation order could differ, far below this.
pub(crate) fn differences(path: &str, recorded: &Value, recomputed: &Value) -> Vec<Mismatch> {
    let mut found = Vec::new();
    diff_into(path, recorded, recomputed, &mut found);
    found
}

fn diff_into(path: &str, recorded: &Value, recomputed: &Value, found: &mut Vec<Mismatch>) {
    let mismatch = |found: &mut Vec<Mismatch>| {
        found.push(Mismatch {
            field: path.to_string(),
            recorded: brief(recorded),
            recomputed: brief(recomputed),
        })
    };
    match (recorded, recomputed) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            if (a - b).abs() > 1e-9 * b.abs().max(1e-30) || a.is_nan() != b.is_nan() {
                mismatch(found);
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            for (key, b_value) in b {
                let child = join(path, key);
                match a.get(key) {
                    Some(a_value) => diff_into(&child, a_value, b_value, found),
                    None => found.push(Mismatch {
                        field: child,
                        recorded: "absent".into(),
                        recomputed: brief(b_value),
                    }),
                }
            }
            for (key, a_value) in a {
                if !b.contains_key(key) {
                    found.push(Mismatch {
                        field: join(path, key),
                        recorded: brief(a_value),
                        recomputed: "absent".into(),
                    });
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (a_item, b_item)) in a.iter().zip(b).enumerate() {
                diff_into(&format!("{path}[{i}]"), a_item, b_item, found);
            }
        }
        (Value::Array(a), Value::Array(b)) => found.push(Mismatch {
            field: path.to_string(),
            recorded: format!("{} entries", a.len()),
            recomputed: format!("{} entries", b.len()),
        }),
        (a, b) if a == b => {}
        _ => mismatch(found),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.ends_with(' ') || path.is_empty() {
        format!("{path}{key}")
    } else {
        format!("{path}.{key}")
    }
}

/// A value short enough for a one-line message.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        let head: String = text.chars().take(77).collect();
        format!("{head}…")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_the_field_and_both_values() {
        let recorded = json!({"a": 1, "b": [{"c": "x"}, {"c": "y"}], "d": [1, 2], "e": 1.0});
        let recomputed = json!({"a": 2, "b": [{"c": "x"}, {"c": "z"}], "d": [1], "e": 1.0 + 1e-12});
        let found = differences("stage 3 ", &recorded, &recomputed);
        let text: Vec<String> = found.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            text,
            [
                "stage 3 a is 1 in the plan but 2 recomputed",
                "stage 3 b[1].c is \"y\" in the plan but \"z\" recomputed",
                "stage 3 d is 2 entries in the plan but 1 entries recomputed",
            ]
        );
    }

    #[test]
    fn identical_values_have_no_differences() {
        let value = json!({"a": [1, {"b": null}], "c": "x"});
        assert!(differences("", &value, &value).is_empty());
    }
}
