//! # pipecut
//!
//! pipecut makes model parallelism automatic: it reads an ONNX model, estimates what every
//! operator costs on the GPUs the user names, and cuts the graph into pipeline stages that keep
//! every GPU equally busy and inside its memory.
//!
//! The library is a pipeline of phases, one module each, in data-flow order:
//!
//! ```text
//! model.onnx ──load──▶ Graph ──shape──▶ typed Graph ──cost──▶ Costs ──partition──▶ Partition ──plan──▶ plan.json
//!    (onnx)            (graph)          (onnx::shape)
//! ```
//!
//! Built so far: [`onnx`] (loading, with external data never read) and [`onnx::shape`] (dtype and
//! shape inference with symbolic dims), over the [`graph`] IR.
//!
//! ```
//! use pipecut::onnx::shape::{DimBindings, ShapeInference};
//!
//! let mut model = pipecut::onnx::load_model("fixtures/models/gpt2_tiny.onnx")?;
//! let bindings = DimBindings::new().bind("batch", 8).bind("seq", 32);
//! ShapeInference::new(bindings).run(&mut model.graph)?;
//! let logits = model.graph.outputs()[0];
//! assert_eq!(model.graph.concrete_shape(logits)?, vec![8, 32, 512]);
//! # Ok::<(), pipecut::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
pub mod graph;
pub mod onnx;

pub use error::{Error, Result};
