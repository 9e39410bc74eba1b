//! # pipecut
//!
//! pipecut makes model parallelism automatic: it reads an ONNX model, estimates what every
//! operator costs on the GPUs the user names, and cuts the graph into pipeline stages that keep
//! every GPU equally busy and inside its memory.
//!
//! This crate is the facade over the workspace's crates, one per phase, in data-flow order
//! (`docs/architecture.md`), under the module paths the library has always had:
//!
//! ```text
//! model.onnx ──load──▶ Graph ──shape──▶ typed Graph ──cost──▶ Costs ──partition──▶ Plan ──▶ plan.json
//!   pipecut-ir: [`onnx`], [`graph`]      pipecut-cost: [`cost`]  pipecut-planner: [`partition`], [`schedule`], [`plan`]
//! Plan ──▶ pipecut-export: [`onnx::export`]   pipecut-runtime: [`runtime`]   pipecut-distributed: [`runtime::distributed`]
//! ```
//!
//! [`onnx::export`] writes one runnable ONNX file per stage and a `manifest.json` that routes the
//! tensors between them (`pipecut export plan.json model.onnx --out-dir stages/`).
//!
//! [`ffi`] is the C ABI (`include/pipecut.h`): one call from model bytes and a JSON request to
//! the plan JSON, for Python (`ctypes`), C and C++ callers (`docs/embedding.md`).
//!
//! An embedder that only plans depends on `pipecut-planner` (with `pipecut-ir` and
//! `pipecut-cost`) and compiles no kernel, codec, BLAS or GPU binding.
//!
//! ```
//! use pipecut::onnx::shape::{DimBindings, ShapeInference};
//!
//! let mut model = pipecut::onnx::load_model("fixtures/models/gpt2_tiny.onnx")?;
//! let bindings = DimBindings::new().bind("batch", 8).bind("seq", 32);
//! ShapeInference::new(bindings).run(&mut model.graph)?;
//! let logits = model.graph.outputs()[0];
//! assert_eq!(model.graph.concrete_shape(logits)?, vec![8, 32, 512]);
//!
//! let catalog = pipecut::cost::Catalog::builtin();
//! let h100 = catalog.device("H100-SXM")?;
//! let costs = pipecut::cost::CostModel::new(h100).node_costs(&model.graph)?;
//! let total_secs: f64 = costs.iter().map(|(_, c)| c.time_secs).sum();
//! assert!(total_secs > 0.0);
//! # Ok::<(), pipecut::Error>(())
//! ```

//! ## Embedding
//!
//! pipecut is a library first; the CLI only parses arguments and prints. A framework can hand
//! it a model as bytes ([`onnx::load_model_from_bytes`]) or build the graph in code
//! ([`graph::Graph::builder`]), give it the node times it profiled instead of the roofline
//! ([`partition::Planner::with_node_secs`]), and take the plan back as Rust types
//! ([`partition::Solution`], [`plan::Plan`]) or JSON ([`plan::Plan::to_json`]), or as PyTorch
//! and DeepSpeed split points ([`partition::torch_split`]). `examples/embed.rs` runs all of it
//! (`cargo run --release -p pipecut-examples --example embed`).
//!
//! ```
//! use std::collections::BTreeMap;
//! use pipecut::cost::{Catalog, Cluster};
//! use pipecut::onnx::shape::{DimBindings, ShapeInference};
//! use pipecut::partition::{Planner, StageCount};
//! use pipecut::plan::{Plan, PlanContext, PlanOptions};
//!
//! let bytes = std::fs::read("fixtures/models/gpt2_tiny.onnx").expect("the fixture");
//! let mut model = pipecut::onnx::load_model_from_bytes(&bytes, None)?;
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
//! # Ok::<(), pipecut::Error>(())
//! ```

#![warn(missing_docs)]

pub mod ffi;

/// The `pipecut` command's subcommands: parsing, printing and exit codes. `src/main.rs` and the
/// Python package (`crates/python`) both run them, so a Python call and the command it mirrors
/// share one implementation. Not a stable Rust API: embed through the phase crates instead.
#[doc(hidden)]
pub mod cli;

pub use pipecut_ir::{graph, io, Error, Result};
pub use pipecut_planner::{partition, plan, schedule};

/// Loading ONNX models and inferring shapes ([`pipecut_ir::onnx`]), and the per-stage export
/// ([`pipecut_export`]).
pub mod onnx {
    pub use pipecut_export as export;
    pub use pipecut_ir::onnx::*;
}

/// Device and link profiles, op costs, memory and transfers ([`pipecut_cost`]), and measured
/// efficiencies ([`pipecut_runtime::calibrate`], which runs kernels).
pub mod cost {
    pub use pipecut_cost::*;
    pub use pipecut_runtime::calibrate;
}

/// Executing models and plans ([`pipecut_runtime`]), and across processes
/// ([`pipecut_distributed`]).
pub mod runtime {
    pub use pipecut_distributed as distributed;
    pub use pipecut_runtime::*;
}
