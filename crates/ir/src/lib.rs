//! # pipecut-ir
//!
//! The first phase of pipecut: an ONNX model read into the graph IR, and every tensor's dtype
//! and shape inferred with the symbolic dims and sample values the user binds.
//!
//! ```text
//! model.onnx ──load──▶ Graph ──shape──▶ typed Graph        (then pipecut-cost, pipecut-planner)
//!            (onnx)    (graph)  (onnx::shape)
//! ```
//!
//! It knows nothing of costs, stages or runtimes, and depends on no kernel, BLAS or GPU
//! binding; the image codecs ImageDecoder's header needs are behind feature `image`.
//!
//! ```
//! use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
//!
//! let mut model = pipecut_ir::onnx::load_model("../../fixtures/models/gpt2_tiny.onnx")?;
//! let bindings = DimBindings::new().bind("batch", 8).bind("seq", 32);
//! ShapeInference::new(bindings).run(&mut model.graph)?;
//! let logits = model.graph.outputs()[0];
//! assert_eq!(model.graph.concrete_shape(logits)?, vec![8, 32, 512]);
//! # Ok::<(), pipecut_ir::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
pub mod graph;
pub mod io;
pub mod onnx;

pub use error::{Error, Result};
