//! Phase 1 of the pipeline: reading ONNX models into the graph IR, and (in [`shape`]) inferring
//! the dtype and shape of every tensor.
//!
//! The model file is memory-mapped and decoded once. Weights stored as external data are never
//! read: the loader records their file, offset and length and checks only the file's metadata,
//! so a model with hundreds of gigabytes of weights loads in the time its protobuf takes.

pub mod image_stream;
pub mod inspect;
mod load;
pub mod opset;
mod scopes;
pub mod shape;
pub mod tensor;

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::graph::Graph;
use crate::Error;

pub use load::{graph_sha256, sha256_hex, weights_sha256};
pub use opset::{NEWEST_KNOWN_OPSET, SUPPORTED_DEFAULT_OPSETS};

/// A loaded model: its graph and the facts about the file that plans record.
#[derive(Debug, Clone)]
pub struct Model {
    /// The graph IR.
    pub graph: Graph,
    /// The ONNX IR version of the file.
    pub ir_version: i64,
    /// `producer_name producer_version` as written by the exporter.
    pub producer: String,
    /// Size of the protobuf file in bytes.
    pub file_bytes: u64,
    /// sha256 of the protobuf bytes (hex), which plans record to refuse a different model.
    pub sha256: String,
    /// sha256 of what planning reads from the graph (see [`graph_sha256`]): a plan holds
    /// for any file with the same graph digest, whatever its weights.
    pub graph_sha256: String,
    /// sha256 of the weights as the file holds them (see [`weights_sha256`]).
    pub weights_sha256: String,
    /// What the loader had to assume, one sentence each (an opset newer than pipecut knows, an
    /// op version whose additions pipecut does not apply; see [`opset`]). The CLI prints them.
    pub warnings: Vec<String>,
    /// External-data files that do not exist. Planning (shapes, costs, partitions) needs no
    /// weight bytes, so a model whose weights are elsewhere still plans; whatever reads the
    /// bytes (export, run) calls [`Model::require_external_data`] first.
    pub missing_external_data: Vec<MissingExternalData>,
}

/// The three digests of a model file that plans record and check against, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests<'a> {
    /// sha256 of the whole protobuf file.
    pub sha256: &'a str,
    /// sha256 of the graph without initializer bytes.
    pub graph_sha256: &'a str,
    /// sha256 of the initializers' bytes (or external-data references).
    pub weights_sha256: &'a str,
}

impl Model {
    /// The digests plans record and check against.
    pub fn digests(&self) -> Digests<'_> {
        Digests {
            sha256: &self.sha256,
            graph_sha256: &self.graph_sha256,
            weights_sha256: &self.weights_sha256,
        }
    }
}

/// An initializer whose external-data file is absent. Its location passed the loader's
/// checks (relative, inside the model's directory), so only its existence is in question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingExternalData {
    /// Initializer name.
    pub tensor: String,
    /// The location as written in the model.
    pub location: String,
    /// Where the file was looked for.
    pub path: std::path::PathBuf,
}

impl std::fmt::Display for MissingExternalData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "initializer '{}' has its weights in '{}', which does not exist",
            self.tensor,
            self.path.display()
        )
    }
}

impl Model {
    /// Refuses a model whose external-data files are absent, naming the first and how many
    /// others: for the commands that read weight bytes (export, run).
    pub fn require_external_data(&self) -> Result<(), Error> {
        let Some(first) = self.missing_external_data.first() else {
            return Ok(());
        };
        let files: std::collections::BTreeSet<_> =
            self.missing_external_data.iter().map(|m| &m.path).collect();
        Err(Error::ExternalData {
            tensor: first.tensor.clone(),
            location: first.location.clone(),
            detail: format!(
                "cannot open '{}': no such file ({} initializer(s) in {} missing file(s) need it; \
                 planning works without them, exporting and running need the weights)",
                first.path.display(),
                self.missing_external_data.len(),
                files.len()
            ),
        })
    }
}

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
