//! Phase 1 of the pipeline: reading ONNX models into the graph IR, and (in [`shape`]) inferring
//! the dtype and shape of every tensor.
//!
//! The model file is memory-mapped and decoded once. Weights stored as external data are never
//! read: the loader records their file, offset and length and checks only the file's metadata,
//! so a model with hundreds of gigabytes of weights loads in the time its protobuf takes.

pub mod image_stream;
pub mod inspect;
mod load;
mod model;
pub mod opset;
mod scopes;
pub mod shape;
pub mod tensor;

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::Error;

pub use load::{graph_sha256, sha256_hex, weights_sha256};
pub use model::{Digests, MissingExternalData, Model};
pub use opset::{NEWEST_KNOWN_OPSET, SUPPORTED_DEFAULT_OPSETS};

/// Loads an ONNX model from a file; external data is resolved against the file's directory.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model, Error> {
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // Only a regular file: a directory would fail to map with "No such device", a FIFO with no
    // writer would block forever, and a pipe cannot be mapped at all.
    let file: File = crate::io::open_regular(path).map_err(|detail| Error::Input {
        what: "model".into(),
        path: path.to_path_buf(),
        detail: if detail.contains("not a regular file") {
            format!("{detail}; save the model to a file first")
        } else {
            detail
        },
    })?;
    let len = file.metadata().map_err(io)?.len();
    let origin = path.display().to_string();
    let base_dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
        .to_path_buf()
    });
    if len == 0 {
        return load::decode_model(&[], &origin, base_dir);
    }
    // SAFETY: the map is read-only and lives only for this call. If another process truncates
    // the file meanwhile, reads fault, as they would for any reader of a file being replaced;
    // mapping avoids holding a second copy of a multi-gigabyte protobuf in memory.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    load::decode_model(&map, &origin, base_dir)
}

/// Loads an ONNX model from bytes (for embedding). External data, if the model has any, is
/// resolved against `external_data_dir`; without one such a model is refused.
pub fn load_model_from_bytes(
    bytes: &[u8],
    external_data_dir: Option<&Path>,
) -> Result<Model, Error> {
    load::decode_model(bytes, "<bytes>", external_data_dir.map(Path::to_path_buf))
}
