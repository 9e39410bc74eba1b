//! # pipecut-cost
//!
//! The second phase of pipecut, over [`pipecut_ir`]'s typed graph: what every node costs on a
//! named device, what it must hold in memory, and what it costs to move tensors between
//! devices. It knows nothing of solvers or runtimes.
//!
//! - [`hardware`]: device and link profiles from `cost-models/`, every number with its source;
//! - [`cluster`]: nodes of devices joined by links; transfer and all-reduce times;
//! - [`ops`]: FLOPs and bytes per operator, one rule per op family;
//! - [`mode`]: inference or training, and training's recomputation and ZeRO sharding;
//! - [`model`]: the roofline that turns work into time, and the per-node cost table;
//! - [`kept`]: the activations a training engine keeps of a micro-batch (torch, Megatron, ONNX);
//! - [`memory`]: parameters, optimizer state and in-flight activations of a stage;
//! - [`order`]: the order each device runs a pipeline schedule's work in (what memory holds);
//! - [`measured`]: measured node times (`pipecut profile`) in place of the roofline.
//!
//! Measured efficiencies (`pipecut calibrate`) come from `pipecut_runtime::calibrate`, which
//! runs kernels.

#![warn(missing_docs)]

pub mod cluster;
pub mod hardware;
pub mod kept;
pub mod measured;
pub mod memory;
pub mod mode;
pub mod model;
pub(crate) mod ops;
pub mod order;
pub(crate) mod prefetch;

pub use cluster::{Cluster, ClusterLayout, DeviceId, LinkChoice, NodeLayout, MAX_DEVICES};
pub use hardware::{Catalog, HardwareSpec, LinkSpec, OpClass};
pub use kept::MemoryModel;
pub use measured::{Coverage, NodeTimes};
pub use memory::{Schedule, StageMemory};
pub use mode::{Mode, Recompute, ZeroSharding};
pub use model::{CostModel, NodeCost, Precision, UnknownOpCost};
pub use ops::OpWork;
pub use pipecut_ir::{Error, Result};
