//! Phase 1 of the pipeline: reading ONNX models into the graph IR, and (in [`shape`]) inferring
//! the dtype and shape of every tensor.
//!
//! The model file is read whole and decoded once, the main graph's nodes one at a time as the
//! graph is built (`load.rs`). Weights stored as external data are never read: the loader
//! records their file, offset and length and checks only the file's metadata, so a model with
//! hundreds of gigabytes of weights loads in the time its protobuf takes.

pub mod image_stream;
pub mod inspect;
mod load;
mod model;
pub mod opset;
pub mod proto;
mod scopes;
pub mod shape;
pub mod tensor;

use std::path::Path;

use crate::Error;

pub use load::{digests_in_place, graph_sha256, sha256_hex, weights_sha256};
pub use model::{Digests, MissingExternalData, Model};
pub use opset::{NEWEST_KNOWN_OPSET, SUPPORTED_DEFAULT_OPSETS};

/// Loads an ONNX model from a file; external data is resolved against the file's directory.
/// The file is read whole, not mapped (see [`crate::io::read_model_bytes`]): a model truncated
/// while it loads is an error, never a `SIGBUS`.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model, Error> {
    let path = path.as_ref();
    // Only a regular file: a directory cannot be read whole, a FIFO with no writer would block
    // forever.
    let bytes = crate::io::read_model_bytes(path).map_err(|e| match e {
        Error::Input { what, path, detail } if detail.contains("not a regular file") => {
            Error::Input {
                what,
                path,
                detail: format!("{detail}; save the model to a file first"),
            }
        }
        e => e,
    })?;
    let base_dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
        .to_path_buf()
    });
    load::decode_model(&bytes, &path.display().to_string(), base_dir)
}

/// Loads an ONNX model from bytes (for embedding). External data, if the model has any, is
/// resolved against `external_data_dir`; without one such a model is refused.
pub fn load_model_from_bytes(
    bytes: &[u8],
    external_data_dir: Option<&Path>,
) -> Result<Model, Error> {
    load::decode_model(bytes, "<bytes>", external_data_dir.map(Path::to_path_buf))
}
