//! Pipeline schedules and a discrete-event simulator: given each stage's forward (and backward)
//! time per micro-batch and the time to pass activations to the next stage, it gives the step
//! time, the bubble, and how many micro-batches each stage holds at its peak.
//!
//! Schedules: GPipe (all forwards, then all backwards; Huang et al. 2019), 1F1B (PipeDream-Flush;
//! Narayanan et al. 2019) and interleaved 1F1B with `v` model chunks per device (Narayanan et al.
//! 2021, Megatron-LM) and the zero-bubble ZB-H1 (Qi et al., ICLR'24), which splits each
//! backward into an input gradient and a weight gradient. Inference runs forwards only; the schedules then coincide.

mod simulate;
mod timeline;

pub(crate) use simulate::interleaved_chunk_in_flight;
pub use simulate::{
    check_microbatches, simulate, Op, OpKind, Simulation, StageFiguresSecs, StageTimes,
    MAX_MICROBATCHES, MAX_SIMULATED_OPS,
};
pub use timeline::timeline_svg;

use serde::Serialize;

/// A pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PipelineSchedule {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward in steady state.
    OneFOneB,
    /// 1F1B over `chunks` model chunks per device (virtual stages).
    Interleaved {
        /// Model chunks per device (≥ 2).
        chunks: usize,
    },
    /// ZB-H1 (Qi et al., ICLR'24): backwards split into input and weight gradients.
    ZeroBubble,
}

impl From<crate::cost::Schedule> for PipelineSchedule {
    fn from(schedule: crate::cost::Schedule) -> PipelineSchedule {
        match schedule {
            crate::cost::Schedule::GPipe => PipelineSchedule::GPipe,
            crate::cost::Schedule::OneFOneB => PipelineSchedule::OneFOneB,
            crate::cost::Schedule::Interleaved { chunks } => PipelineSchedule::Interleaved {
                chunks: chunks as usize,
            },
            crate::cost::Schedule::ZeroBubble => PipelineSchedule::ZeroBubble,
        }
    }
}
