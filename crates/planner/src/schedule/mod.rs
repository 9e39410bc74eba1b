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

pub use pipecut_cost::order::{OpKind, PipelineSchedule};
pub use simulate::{
    check_microbatches, simulate, Op, Simulation, StageFiguresSecs, StageTimes, MAX_MICROBATCHES,
    MAX_SIMULATED_OPS,
};
pub use timeline::timeline_svg;
