//! Memory: what a stage must hold. Parameters (and in training their gradients and optimizer
//! state), the activations of the micro-batches in flight under the pipeline schedule, received
//! tensors, and the largest temporary workspace.
//!
//! The partitioner calls [`stage_peak_bytes`] for every candidate stage, so the formula lives in
//! one place.

use serde::{Deserialize, Serialize};

use crate::mode::Mode;
use pipecut_ir::graph::{Graph, TensorId};

/// Pipeline schedules whose activation memory the model knows.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): each device runs `chunks`
    /// non-adjacent model chunks (virtual stages), chunk c of device d being stage c·K + d of
    /// v·K. The bubble shrinks to (K − 1)/(v·m) of the step at more in-flight activations
    /// (the first device holds (1 + (K − 1)/(v·K))·K stages' worth) and v times the
    /// point-to-point messages. The micro-batch count must be a multiple of K.
    Interleaved {
        /// Model chunks per device, v ≥ 2.
        chunks: u32,
    },
    /// ZB-H1 (Qi et al., "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024, § 2.1): each
    /// backward split into the input gradient B, which the previous stage waits for, and the
    /// weight gradient W, which fills the bubble; about a third of 1F1B's bubble, every
    /// device holding at most K micro-batches (1F1B's first-stage peak).
    #[serde(rename = "zero-bubble")]
    ZeroBubble,
}

impl Schedule {
    /// Model chunks per device: v for interleaved 1F1B, 1 otherwise.
    pub fn chunks(self) -> usize {
        match self {
            Schedule::Interleaved { chunks } => chunks.max(1) as usize,
            _ => 1,
        }
    }

    /// Refuses what the command line refuses but a JSON file or a C caller can still say: an
    /// interleaved schedule of fewer than 2 or more than 64 chunks per device (64: a chunk
    /// per layer of the deepest published models' stages, and a bound on the stages it makes).
    pub fn validate(self) -> Result<(), String> {
        match self {
            Schedule::Interleaved { chunks } if !(2..=64).contains(&chunks) => Err(format!(
                "an interleaved schedule needs 2 to 64 chunks per device, not {chunks}"
            )),
            _ => Ok(()),
        }
    }

    /// The device of each stage when `devices` are the pipeline's K devices: the devices
    /// themselves, or under interleaving v rounds of them (stage c·K + d on device d).
    pub fn chunk_devices<T: Copy>(self, devices: &[T]) -> Vec<T> {
        (0..self.chunks())
            .flat_map(|_| devices.iter().copied())
            .collect()
    }

    /// The name `--schedule` takes and prints: `gpipe`, `1f1b`, `interleaved:v`,
    /// `zero-bubble`.
    pub fn name(self) -> String {
        match self {
            Schedule::GPipe => "gpipe".into(),
            Schedule::OneFOneB => "1f1b".into(),
            Schedule::Interleaved { chunks } => format!("interleaved:{chunks}"),
            Schedule::ZeroBubble => "zero-bubble".into(),
        }
    }
}

impl std::fmt::Display for Schedule {
    /// As tables print it: `GPipe`, `1F1B`, `interleaved 1F1B ×v`, `zero-bubble (ZB-H1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::GPipe => write!(f, "GPipe"),
            Schedule::OneFOneB => write!(f, "1F1B"),
            Schedule::Interleaved { chunks } => write!(f, "interleaved 1F1B ×{chunks}"),
            Schedule::ZeroBubble => write!(f, "zero-bubble (ZB-H1)"),
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Schedule, String> {
        let lower = s.to_ascii_lowercase();
        let (name, chunks) = match lower.split_once(':') {
            Some((name, chunks)) => (name, Some(chunks)),
            None => (lower.as_str(), None),
        };
        match (name, chunks) {
            ("gpipe", None) => Ok(Schedule::GPipe),
            ("1f1b" | "onefoneb", None) => Ok(Schedule::OneFOneB),
            ("zero-bubble" | "zb" | "zb-h1", None) => Ok(Schedule::ZeroBubble),
            // Megatron's examples use 2 chunks per device when none is given.
            ("interleaved", None) => Ok(Schedule::Interleaved { chunks: 2 }),
            ("interleaved", Some(chunks)) => match chunks.parse::<u32>() {
                Ok(chunks) if Schedule::Interleaved { chunks }.validate().is_ok() => {
                    Ok(Schedule::Interleaved { chunks })
                }
                _ => Err(format!(
                    "interleaved:{chunks}: the chunks per device must be a number from 2 to 64"
                )),
            },
            _ => Err(format!(
                "unknown schedule '{s}' (expected gpipe, 1f1b, interleaved[:v] or zero-bubble)"
            )),
        }
    }
}

/// Micro-batches whose activations stage `stage` (0-based) of `stages` holds at its peak.
/// Inference keeps none for a backward pass: one micro-batch is being computed at a time.
/// Under interleaving a stage is a chunk (stage c·K + d is chunk c of device d), and its count
/// is that chunk's own peak in Megatron's order.
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
        // Micro-batches whose B is pending, as under 1F1B; those past B keep only what W
        // reads ([`held_at_peaks`]).
        (Mode::Training { .. }, Schedule::ZeroBubble) => {
            (stages.saturating_sub(stage) as u64).clamp(1, m)
        }
        (Mode::Training { .. }, Schedule::Interleaved { chunks }) => {
            let chunks = chunks.max(1) as usize;
            let devices = (stages / chunks).max(1);
            crate::order::interleaved_chunk_in_flight(
                devices,
                chunks,
                stage % devices,
                stage / devices,
                m as usize,
            )
            .max(1)
        }
    }
}

/// How many micro-batches' worth of each per-micro-batch part a stage holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Held {
    /// Micro-batches whose received tensors it keeps.
    pub received: u64,
    /// Micro-batches whose activations it keeps.
    pub activations: u64,
    /// Micro-batches past their input-gradient pass B whose weight-gradient pass W is
    /// pending (zero-bubble only): each keeps what W reads, the weight-reading nodes'
    /// activation inputs and output gradients.
    pub weight_inputs: u64,
}

impl Held {
    /// Bytes held, given one micro-batch's received tensors, activations and W inputs.
    pub fn bytes(self, received: u64, activations: u64, weight_inputs: u64) -> u64 {
        self.received
            .saturating_mul(received)
            .saturating_add(self.activations.saturating_mul(activations))
            .saturating_add(self.weight_inputs.saturating_mul(weight_inputs))
    }
}

/// The moments at which stage `stage` of `stages` holds the most: its peak is the largest of
/// their bytes. One moment for every schedule but ZB-H1, whose device d holds at one moment
/// K − d micro-batches before B and d past B, and at the next K − d − 1 before and d + 1
/// past ([`crate::order::zero_bubble_held`]); which is more depends on the stage's bytes.
/// A micro-batch past B keeps its received tensors too (torch's pipeline stage holds a
/// micro-batch's inputs until its W; under full recomputation W may need them again). Under
/// full recomputation one micro-batch's activations exist at a time, as for the other
/// schedules.
pub fn held_at_peaks(
    mode: Mode,
    schedule: Schedule,
    stage: usize,
    stages: usize,
    microbatches: u32,
) -> Vec<Held> {
    let recompute = match mode {
        Mode::Training { recompute, .. } => recompute,
        Mode::Inference => crate::Recompute::None,
    };
    let held = |full: u64, weight_inputs: u64| Held {
        received: full + weight_inputs,
        activations: recompute.activation_in_flight(full),
        weight_inputs,
    };
    match (mode, schedule) {
        (Mode::Training { .. }, Schedule::ZeroBubble) => crate::order::zero_bubble_held(
            stages.max(1),
            stage.min(stages.max(1) - 1),
            microbatches.max(1) as usize,
        )
        .into_iter()
        .map(|(full, pending)| held(full, pending))
        .collect(),
        _ => vec![held(
            in_flight_microbatches(mode, schedule, stage, stages, microbatches),
            0,
        )],
    }
}

/// Bytes a parameter needs on its stage: the weight, plus in training its gradient (same type)
/// and the optimizer state per element, each divided over the data-parallel group as far as
/// the mode's ZeRO stage shards it.
pub fn param_footprint_bytes(graph: &Graph, param: TensorId, mode: Mode) -> u64 {
    let tensor = graph.tensor(param);
    let bytes = tensor.param().map_or(0, |p| p.bytes);
    match mode {
        Mode::Inference => bytes,
        Mode::Training {
            optimizer_bytes_per_param,
            zero,
            ..
        } => {
            let elements: u64 = tensor
                .shape
                .iter()
                .flatten()
                .filter_map(|d| d.known())
                .product();
            zero.held_bytes(bytes, (elements as f64 * optimizer_bytes_per_param) as u64)
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

    #[test]
    fn schedules_parse_print_and_serialize() {
        for (text, schedule) in [
            ("gpipe", Schedule::GPipe),
            ("1f1b", Schedule::OneFOneB),
            ("interleaved", Schedule::Interleaved { chunks: 2 }),
            ("interleaved:4", Schedule::Interleaved { chunks: 4 }),
            ("zero-bubble", Schedule::ZeroBubble),
        ] {
            let parsed: Schedule = text.parse().unwrap();
            assert_eq!(parsed, schedule);
            assert_eq!(parsed.name().parse::<Schedule>(), Ok(schedule));
            let json = serde_json::to_string(&schedule).unwrap();
            assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), schedule);
        }
        // Plans written before the new schedules read as before.
        assert_eq!(
            serde_json::to_string(&Schedule::OneFOneB).unwrap(),
            "\"1f1b\""
        );
        assert_eq!(
            serde_json::to_string(&Schedule::ZeroBubble).unwrap(),
            "\"zero-bubble\""
        );
        for bad in [
            "interleaved:1",
            "interleaved:x",
            "interleaved:",
            "gpipe:2",
            "zb2",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad}");
        }
        assert_eq!(
            Schedule::Interleaved { chunks: 2 }.chunk_devices(&[5, 6, 7]),
            vec![5, 6, 7, 5, 6, 7]
        );
        assert_eq!(Schedule::ZeroBubble.chunk_devices(&[5, 6]), vec![5, 6]);
        assert!(Schedule::Interleaved { chunks: 0 }.validate().is_err());
        assert!(Schedule::Interleaved {
            chunks: 4_000_000_000
        }
        .validate()
        .is_err());
    }
}
