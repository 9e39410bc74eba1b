//! Memory: what a stage must hold. Parameters (and in training their gradients and optimizer
//! state), the activations of the micro-batches in flight under the pipeline schedule, received
//! tensors, and the largest temporary workspace.
//!
//! The partitioner calls [`stage_peak_bytes`] for every candidate stage, so the formula lives in
//! one place.

use serde::{Deserialize, Serialize};

use super::model::Mode;
use crate::graph::{Graph, TensorId};

/// Pipeline schedules whose activation memory the model knows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    Default,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019): every micro-batch's activations
    /// stay until its backward.
    GPipe,
    /// One-forward-one-backward (Narayanan et al. 2019, PipeDream-Flush): stage k of K starts
    /// backwards after K − k forwards, so it keeps at most K − k micro-batches.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Schedule, String> {
        match s.to_ascii_lowercase().as_str() {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" | "onefoneb" => Ok(Schedule::OneFOneB),
            other => Err(format!(
                "unknown schedule '{other}' (expected gpipe or 1f1b)"
            )),
        }
    }
}

/// Micro-batches whose activations stage `stage` (0-based) of `stages` holds at its peak.
/// Inference keeps none for a backward pass: one micro-batch is being computed at a time.
pub fn in_flight_microbatches(
    mode: Mode,
    schedule: Schedule,
    stage: usize,
    stages: usize,
    microbatches: u32,
) -> u64 {
    let m = microbatches.max(1) as u64;
    match (mode, schedule) {
        (Mode::Inference, _) => 1,
        (Mode::Training { .. }, Schedule::GPipe) => m,
        (Mode::Training { .. }, Schedule::OneFOneB) => {
            (stages.saturating_sub(stage) as u64).clamp(1, m)
        }
    }
}

/// Bytes a parameter needs on its stage: the weight, plus in training its gradient (same type)
/// and the optimizer state per element.
pub fn param_footprint_bytes(graph: &Graph, param: TensorId, mode: Mode) -> u64 {
    let tensor = graph.tensor(param);
    let bytes = tensor.param().map_or(0, |p| p.bytes);
    match mode {
        Mode::Inference => bytes,
        Mode::Training {
            optimizer_bytes_per_param,
            ..
        } => {
            let elements: u64 = tensor
                .shape
                .iter()
                .flatten()
                .filter_map(|d| d.known())
                .product();
            bytes + bytes + (elements as f64 * optimizer_bytes_per_param) as u64
        }
    }
}

/// What one stage holds, before the schedule multiplies the per-micro-batch part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StageMemory {
    /// Parameters with, in training, their gradients and optimizer state.
    pub param_footprint_bytes: u64,
    /// Activations the stage's nodes produce per micro-batch.
    pub activation_bytes: u64,
    /// Tensors received from earlier stages per micro-batch.
    pub received_bytes: u64,
    /// Largest temporary buffer of any node.
    pub workspace_bytes: u64,
}

/// Peak bytes of a stage: `params + in_flight · (activations + received) + workspace`.
pub fn stage_peak_bytes(memory: &StageMemory, in_flight: u64) -> u64 {
    memory
        .param_footprint_bytes
        .saturating_add(
            in_flight.saturating_mul(
                memory
                    .activation_bytes
                    .saturating_add(memory.received_bytes),
            ),
        )
        .saturating_add(memory.workspace_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_stage_memory_matches_a_hand_count() {
        // Stage 1 of 4 under 1F1B with 8 micro-batches keeps 4 − 1 = 3 in flight.
        let training = Mode::training();
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 1, 4, 8),
            3
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 3, 4, 8),
            1
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::OneFOneB, 0, 4, 2),
            2
        );
        assert_eq!(
            in_flight_microbatches(training, Schedule::GPipe, 3, 4, 8),
            8
        );
        assert_eq!(
            in_flight_microbatches(Mode::Inference, Schedule::GPipe, 0, 4, 8),
            1
        );
        // 1 GiB of fp16 weights: + 1 GiB gradients + 6 GiB Adam state (12 B per element).
        // Activations 100 MiB and received 10 MiB per micro-batch, 3 in flight, 50 MiB workspace.
        let mib = 1u64 << 20;
        let memory = StageMemory {
            param_footprint_bytes: 1024 * mib + 1024 * mib + 6 * 1024 * mib,
            activation_bytes: 100 * mib,
            received_bytes: 10 * mib,
            workspace_bytes: 50 * mib,
        };
        assert_eq!(stage_peak_bytes(&memory, 3), (8192 + 330 + 50) * mib);
    }
}
