//! Step 3 of the export: `manifest.json`, the routing table a runtime follows to chain the
//! stage files.

use serde::{Deserialize, Serialize};

use super::files::Placement;
use super::routes::{Destination, Routes, Source};
use crate::Error;
use pipecut_ir::graph::{Dim, Graph, TensorId};

/// The manifest format version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// What an export wrote: per stage its file, what it receives and from where, what it sends and
/// to where. Serialized as `manifest.json` beside the stage files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Format version, [`MANIFEST_VERSION`].
    pub manifest_version: u32,
    /// The program that wrote it, e.g. `pipecut 0.1.0`.
    pub generator: String,
    /// The model the stages were cut from.
    pub model: ManifestModel,
    /// The model's graph inputs, in model order.
    pub inputs: Vec<ManifestTensor>,
    /// The model's graph outputs, in model order, each with where it comes from.
    pub outputs: Vec<ModelOutput>,
    /// External data files the stage files reference, placed in the output directory.
    pub external_data: Vec<ExternalDataFile>,
    /// The stages, in pipeline order.
    pub stages: Vec<ManifestStage>,
}

/// Which model the stages come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestModel {
    /// File name of the model.
    pub file_name: String,
    /// sha256 of the model's protobuf bytes (the same digest plans record).
    pub sha256: String,
    /// Graph name.
    pub graph: String,
}

/// A tensor's name and, where known, its element type and shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestTensor {
    /// Tensor name.
    pub tensor: String,
    /// Element type (`float32`, `int64`, ...).
    pub dtype: Option<String>,
    /// Dims: numbers, or symbolic expressions such as `batch` or `4*batch*seq`.
    pub shape: Option<Vec<ManifestDim>>,
}

/// One dimension in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ManifestDim {
    /// A concrete size.
    Known(u64),
    /// A symbolic size.
    Symbolic(String),
}

/// Where a tensor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TensorSource {
    /// A graph input of the model.
    ModelInput,
    /// An output of an earlier stage.
    Stage {
        /// That stage's index.
        stage: usize,
    },
}

/// Where a stage output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TensorDestination {
    /// An input of a later stage.
    Stage {
        /// That stage's index.
        stage: usize,
    },
    /// A graph output of the model.
    ModelOutput,
}

/// A model output and the stage that sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOutput {
    /// Tensor name.
    pub tensor: String,
    /// The stage that sends it, or the model input it passes through.
    pub from: TensorSource,
}

/// An external data file in the output directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalDataFile {
    /// The `location` the stage files name, relative to the output directory.
    pub location: String,
    /// How it got there.
    pub placement: Placement,
}

/// A stage input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageInput {
    /// The tensor.
    #[serde(flatten)]
    pub tensor: ManifestTensor,
    /// Where it comes from.
    pub from: TensorSource,
}

/// A stage output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageOutput {
    /// The tensor.
    #[serde(flatten)]
    pub tensor: ManifestTensor,
    /// Every place it goes (empty only for the output kept so that a stage whose results nobody
    /// reads is still a runnable model).
    pub to: Vec<TensorDestination>,
}

/// One stage file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestStage {
    /// Position in the pipeline.
    pub stage: usize,
    /// File name in the output directory (`stage_<k>.onnx`).
    pub file: String,
    /// Operator nodes (as the graph counts them; `Constant` nodes are weights there).
    pub nodes: usize,
    /// `Constant` nodes copied into the stage for the weights its nodes read.
    pub constant_nodes: usize,
    /// Weights held: initializers, sparse initializers and `Constant` outputs.
    pub parameters: usize,
    /// Bytes of those weights.
    pub parameter_bytes: u64,
    /// Size of the stage file (external data not included).
    pub file_bytes: u64,
    /// sha256 of the stage file (external data not included): a rank that loads the stage
    /// checks its file against it, and ranks compare the manifest's digest, so a job's ranks
    /// agree on every stage's file while each hashes only its own. Absent from manifests
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// First node in topological order.
    pub first_node: String,
    /// Last node in topological order.
    pub last_node: String,
    /// Graph inputs of the stage file, in its order.
    pub inputs: Vec<StageInput>,
    /// Graph outputs of the stage file, in its order.
    pub outputs: Vec<StageOutput>,
}

/// Per-stage figures that only writing the stage reveals.
pub(crate) struct StageFigures {
    pub constant_nodes: usize,
    pub file_bytes: u64,
    pub sha256: String,
}

impl Manifest {
    /// Assembles the manifest of an export.
    pub(crate) fn new(
        graph: &Graph,
        routes: &Routes,
        model: ManifestModel,
        figures: &[StageFigures],
        external_data: Vec<ExternalDataFile>,
    ) -> Manifest {
        let stages = routes
            .stages
            .iter()
            .zip(figures)
            .enumerate()
            .map(|(s, (stage, figures))| ManifestStage {
                stage: s,
                file: stage_file_name(s),
                nodes: stage.nodes.len(),
                constant_nodes: figures.constant_nodes,
                parameters: stage.parameters.len(),
                parameter_bytes: stage
                    .parameters
                    .iter()
                    .filter_map(|&t| graph.tensor(t).param())
                    .map(|p| p.bytes)
                    .sum(),
                file_bytes: figures.file_bytes,
                sha256: Some(figures.sha256.clone()),
                first_node: node_name(graph, stage.nodes.first()),
                last_node: node_name(graph, stage.nodes.last()),
                inputs: stage
                    .inputs
                    .iter()
                    .map(|&(t, source)| StageInput {
                        tensor: describe(graph, t),
                        from: source.into(),
                    })
                    .collect(),
                outputs: stage
                    .outputs
                    .iter()
                    .map(|(t, destinations)| StageOutput {
                        tensor: describe(graph, *t),
                        to: destinations.iter().map(|&d| d.into()).collect(),
                    })
                    .collect(),
            })
            .collect();
        Manifest {
            manifest_version: MANIFEST_VERSION,
            generator: format!("pipecut {}", env!("CARGO_PKG_VERSION")),
            model,
            inputs: graph.inputs().iter().map(|&t| describe(graph, t)).collect(),
            outputs: routes
                .model_outputs
                .iter()
                .map(|&(t, source)| ModelOutput {
                    tensor: graph.tensor(t).name.clone(),
                    from: source.into(),
                })
                .collect(),
            external_data,
            stages,
        }
    }

    /// The manifest as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("manifests serialize");
        text.push('\n');
        text
    }

    /// Parses a manifest, refusing versions this build does not know.
    pub fn from_json(text: &str) -> Result<Manifest, Error> {
        let manifest: Manifest = serde_json::from_str(text)
            .map_err(|e| Error::Export(format!("not a stage manifest: {e}")))?;
        if manifest.manifest_version != MANIFEST_VERSION {
            return Err(Error::Export(format!(
                "manifest_version {} is not the version this pipecut reads ({MANIFEST_VERSION})",
                manifest.manifest_version
            )));
        }
        Ok(manifest)
    }
}

/// The file name of stage `stage`.
/// The file name of stage `stage` in an export directory.
pub fn stage_file_name(stage: usize) -> String {
    format!("stage_{stage}.onnx")
}

/// File name of tensor-parallel rank `rank` of stage `stage`, beside the stage's own file.
pub fn rank_file_name(stage: usize, rank: usize) -> String {
    format!("stage_{stage}.rank_{rank}.onnx")
}

fn node_name(graph: &Graph, node: Option<&pipecut_ir::graph::NodeId>) -> String {
    node.map(|&n| graph.node(n).name.clone())
        .unwrap_or_default()
}

fn describe(graph: &Graph, id: TensorId) -> ManifestTensor {
    let tensor = graph.tensor(id);
    ManifestTensor {
        tensor: tensor.name.clone(),
        dtype: tensor.dtype.map(|d| d.name().to_string()),
        shape: tensor.shape.as_ref().map(|shape| {
            shape
                .iter()
                .map(|d| match d {
                    Dim::Known(v) => ManifestDim::Known(*v),
                    Dim::Sym(s) => ManifestDim::Symbolic(s.to_string()),
                })
                .collect()
        }),
    }
}

impl From<Source> for TensorSource {
    fn from(source: Source) -> TensorSource {
        match source {
            Source::ModelInput => TensorSource::ModelInput,
            Source::Stage(stage) => TensorSource::Stage { stage },
        }
    }
}

impl From<Destination> for TensorDestination {
    fn from(destination: Destination) -> TensorDestination {
        match destination {
            Destination::Stage(stage) => TensorDestination::Stage { stage },
            Destination::ModelOutput => TensorDestination::ModelOutput,
        }
    }
}
