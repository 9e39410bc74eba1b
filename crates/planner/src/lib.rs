//! # pipecut-planner
//!
//! The third phase of pipecut: given a typed graph ([`pipecut_ir`]) and its costs
//! ([`pipecut_cost`]), choose the parallel plan and prove what can be proven about it.
//!
//! ```text
//! typed Graph + Costs ──partition──▶ Solution ──plan──▶ Plan (plan.json, `check`)
//!                      (partition, schedule)           (plan)
//! ```
//!
//! - [`partition`]: the problem, the DP, the MILP, coarsening, bounds and proofs, the peers'
//!   methods as baselines, and the cluster search over pipeline × tensor × data parallelism,
//!   ZeRO, recomputation and schedule;
//! - [`schedule`]: GPipe, 1F1B, interleaved and zero-bubble schedules simulated in time;
//! - [`plan`]: the versioned plan JSON, the re-derivation `check` runs, the DOT picture.
//!
//! It reads no files and prints nothing, and depends on no runtime, kernel, codec, BLAS or GPU
//! binding: an embedder plans with this crate, `pipecut-ir` and `pipecut-cost` alone.
//!
//! ```
//! use std::collections::BTreeMap;
//! use pipecut_cost::{Catalog, Cluster};
//! use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
//! use pipecut_planner::partition::{Planner, StageCount};
//! use pipecut_planner::plan::{Plan, PlanContext, PlanOptions};
//!
//! let bytes = std::fs::read("../../fixtures/models/gpt2_tiny.onnx").expect("the fixture");
//! let mut model = pipecut_ir::onnx::load_model_from_bytes(&bytes, None)?;
//! let dims = BTreeMap::from([("batch".to_string(), 8), ("seq".to_string(), 64)]);
//! ShapeInference::new(DimBindings::new().bind("batch", 8).bind("seq", 64)).run(&mut model.graph)?;
//! let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin())?;
//! let stages = StageCount::Fixed(2);
//! let solution = Planner::new(&model.graph, &cluster).with_stages(stages).solve()?;
//! let context = PlanContext {
//!     model: model.digests(),
//!     model_file_name: "gpt2_tiny.onnx",
//!     graph: &model.graph,
//!     dims: &dims,
//!     cluster: &cluster,
//!     stages,
//!     time_limit_secs: 10.0,
//!     dtype_override: None,
//! };
//! let plan = Plan::from_solution(&solution, context, PlanOptions::default());
//! assert_eq!(plan.stages.len(), 2);
//! let json = plan.to_json();
//! assert_eq!(Plan::from_json(&json)?.stages.len(), 2);
//! # Ok::<(), pipecut_planner::Error>(())
//! ```

#![warn(missing_docs)]

pub mod partition;
pub mod plan;
pub mod schedule;

pub use pipecut_ir::{Error, Result};
