//! Phase 3 of the pipeline: what every node costs on a named device, what it must hold in
//! memory, and what it costs to move tensors between devices.
//!
//! - [`hardware`]: device and link profiles from `cost-models/`, every number with its source;
//! - [`cluster`]: nodes of devices joined by links; transfer and all-reduce times;
//! - [`ops`]: FLOPs and bytes per operator, one rule per op family;
//! - [`model`]: the roofline that turns work into time, and the per-node cost table;
//! - [`memory`]: parameters, optimizer state and in-flight activations of a stage;
//! - [`calibrate`]: measured efficiencies in place of the defaults;
//! - [`measured`]: measured node times (`pipecut profile`) in place of the roofline.

pub mod calibrate;
pub mod cluster;
pub mod hardware;
pub mod measured;
pub mod memory;
pub mod model;
pub(crate) mod ops;
pub(crate) mod prefetch;

pub use cluster::{Cluster, ClusterLayout, DeviceId, LinkChoice, NodeLayout, MAX_DEVICES};
pub use hardware::{Catalog, HardwareSpec, LinkSpec, OpClass};
pub use measured::{Coverage, NodeTimes};
pub use memory::{Recompute, Schedule, StageMemory, ZeroSharding};
pub use model::{CostModel, Mode, NodeCost, Precision, UnknownOpCost};
pub use ops::OpWork;
