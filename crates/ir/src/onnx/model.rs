//! What loading a model gives: its graph and the facts about its file that plans record
//! ([`Model`]), and the external-data files it names but that are absent.

use crate::graph::Graph;
use crate::Error;

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
    /// sha256 of what planning reads from the graph (see [`graph_sha256`](crate::onnx::graph_sha256)): a plan holds
    /// for any file with the same graph digest, whatever its weights.
    pub graph_sha256: String,
    /// sha256 of the weights as the file holds them (see [`weights_sha256`](crate::onnx::weights_sha256)).
    pub weights_sha256: String,
    /// What the loader had to assume, one sentence each (an opset newer than pipecut knows, an
    /// op version whose additions pipecut does not apply; see [`opset`](crate::onnx::opset)). The CLI prints them.
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
