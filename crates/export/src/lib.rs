//! # pipecut-export
//!
//! One runnable ONNX file per pipeline stage, and the manifest that chains them.
//!
//! [`export_stages`] cuts the model along a list of stages (node lists, as a plan assigns them)
//! and writes into the output directory:
//!
//! - `stage_0.onnx … stage_{K-1}.onnx`: each a valid ONNX model holding the stage's nodes
//!   copied verbatim from the original protobuf (names, attributes, subgraphs), the original
//!   opset imports, model metadata and local functions, the `value_info` of the tensors it
//!   makes, and only the weights its nodes read. `Constant` nodes travel with the weights: a
//!   stage that reads a constant holds its own copy of the `Constant` node, as it would an
//!   initializer, so constants are never sent between stages.
//! - `manifest.json` ([`Manifest`]): per stage, its inputs and where each comes from (a model
//!   input or stage j's output), and its outputs and where each goes (later stages and/or model
//!   outputs).
//!
//! The pipeline, in data-flow order: [`routes`] checks that the stages are a partition of the
//! nodes, convex and ordered, and routes every tensor that crosses a boundary; [`stage`] builds
//! each stage's `ModelProto`; [`manifest`] describes the result; [`files`] writes it.
//!
//! A tensor that several later stages read is an output of the stage that makes it, sent to
//! each of them: it is computed once, never recomputed. Stage inputs and outputs keep the
//! types the model declares (graph inputs, graph outputs, `value_info`); a boundary tensor the
//! model does not declare is typed from the graph's inferred dtype and shape, with symbolic
//! dims written as `dim_param`s.
//!
//! # External data
//!
//! Initializers stored as external data stay external: the stage files keep their `location`,
//! `offset` and `length` entries verbatim, so they resolve against the output directory, and
//! every referenced data file is copied there ([`Placement`]; the filesystem shares extents
//! where it can), never linked: a link would make editing the output edit the original, and
//! onnx >= 1.20 refuses hard-linked data. Each location is checked again as the loader checks it,
//! on the bytes being exported, and must stay inside the output directory. Each stage reads only
//! its own ranges of the shared file.
//!
//! # Files
//!
//! Every file is first written completely to an exclusive temporary in the output directory
//! (never following a link; as readable as the model, no more); only when all are written are
//! they renamed into place, the manifest last, so its presence means the export is complete. An
//! export that fails leaves the directory as it was, an earlier complete export included.
//! Temporaries of a killed export are removed by the next one. No output may be the model. Stage files of an earlier export with more
//! stages (`stage_5.onnx` after a 4-stage export) are left alone: the manifest lists the files
//! that belong to it.
//!
//! ```
//! use pipecut_export::export_stages;
//! use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
//!
//! let path = std::path::Path::new("../../fixtures/models/mlp.onnx");
//! let mut model = pipecut_ir::onnx::load_model(path)?;
//! ShapeInference::new(DimBindings::new()).run(&mut model.graph)?;
//! // Two stages: the first half of the topological order, then the rest.
//! let order = model.graph.topological_order();
//! let stages = vec![order[..order.len() / 2].to_vec(), order[order.len() / 2..].to_vec()];
//! let out_dir = std::env::temp_dir().join(format!("pipecut-doc-export-{}", std::process::id()));
//! let manifest = export_stages(path, &model.graph, &stages, &out_dir)?;
//! assert_eq!(manifest.stages.len(), 2);
//! assert!(out_dir.join("stage_1.onnx").exists() && out_dir.join("manifest.json").exists());
//! # std::fs::remove_dir_all(&out_dir).ok();
//! # Ok::<(), pipecut_ir::Error>(())
//! ```

#![warn(missing_docs)]

pub mod collectives;
mod files;
mod manifest;
pub mod rank_data;
mod routes;
pub mod sequence;
pub mod shard;
mod stage;

use std::fs::File;
use std::path::Path;

use onnx_protobuf::{Message, ModelProto};

pub use files::{write_atomically, Placement};
pub use manifest::{rank_file_name, stage_file_name};
pub use manifest::{
    ExternalDataFile, Manifest, ManifestDim, ManifestModel, ManifestStage, ManifestTensor,
    ModelOutput, StageInput, StageOutput, TensorDestination, TensorSource, MANIFEST_VERSION,
};

use manifest::StageFigures;
use pipecut_ir::graph::{Graph, NodeId};
use pipecut_ir::io::{OutputMode, Staged};
use pipecut_ir::onnx::tensor::ExternalFiles;
pub use pipecut_ir::{Error, Result};
use routes::Routes;
use stage::{build_stage, ProtoIndex};

/// File name of the manifest in the output directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Writes one ONNX file per stage and `manifest.json` into `out_dir` (created if missing).
///
/// `model_path` is the file `graph` was loaded from; `graph` should have been through shape
/// inference, which types the boundary tensors the model does not declare. `stages` lists the
/// nodes of each stage; they must be a partition of the graph's nodes, and convex and ordered
/// (no tensor flows from a later stage to an earlier one).
///
/// # Errors
/// [`Error::NotAPartition`], [`Error::NonConvexStages`], [`Error::OutDir`], [`Error::Output`] and [`Error::Write`]
/// for unwritable output, [`Error::Io`]/[`Error::NotOnnx`] for an unreadable model, and
/// [`Error::Export`] for a model file that does not match the graph.
///
/// Two exports into one folder at once would mix their files: hold [`lock_out_dir`] around
/// this call (and whatever else writes into `out_dir`), as `pipecut export` does.
pub fn export_stages(
    model_path: &Path,
    graph: &Graph,
    stages: &[Vec<NodeId>],
    out_dir: &Path,
) -> Result<Manifest, Error> {
    export_from(model_path, None, graph, stages, out_dir)
}

/// [`export_stages`] from a model file that must still be the one `graph` was loaded from: the
/// bytes the export reads must have `sha256` (the loaded model's
/// [`pipecut_ir::onnx::Digests::sha256`]), else nothing is written and the error says the model
/// changed during the export.
pub fn export_stages_checked(
    model_path: &Path,
    sha256: &str,
    graph: &Graph,
    stages: &[Vec<NodeId>],
    out_dir: &Path,
) -> Result<Manifest, Error> {
    export_from(model_path, Some(sha256), graph, stages, out_dir)
}

fn export_from(
    model_path: &Path,
    expected_sha256: Option<&str>,
    graph: &Graph,
    stages: &[Vec<NodeId>],
    out_dir: &Path,
) -> Result<Manifest, Error> {
    let routes = Routes::new(graph, stages)?;
    // Read, not mapped: a model truncated meanwhile is an error, not a SIGBUS.
    let bytes = pipecut_ir::io::read_model_bytes(model_path)?;
    let sha256 = pipecut_ir::onnx::sha256_hex(&bytes);
    if let Some(expected) = expected_sha256.filter(|&e| e != sha256) {
        return Err(Error::Export(format!(
            "'{}' changed while it was exported (sha256 {} when loaded, {} now); export again",
            model_path.display(),
            &expected[..expected.len().min(12)],
            &sha256[..12]
        )));
    }
    if bytes.is_empty() {
        return Err(Error::NotOnnx {
            origin: model_path.display().to_string(),
            detail: "the file is empty".into(),
        });
    }
    let proto = ModelProto::parse_from_bytes(&bytes).map_err(|e| Error::NotOnnx {
        origin: model_path.display().to_string(),
        detail: format!("protobuf decoding failed: {e}"),
    })?;
    let index = ProtoIndex::new(&proto, graph)?;
    let model = ManifestModel {
        file_name: model_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        sha256,
        graph: graph.name().to_string(),
    };
    files::prepare_out_dir(out_dir)?;
    pipecut_ir::io::remove_stale_temporaries(out_dir);
    let staged = stage_all(model_path, graph, &routes, &index, model, out_dir)?;
    staged.commit(out_dir)
}

/// Name of the lock file [`lock_out_dir`] keeps in an export folder. It stays after the export
/// (an empty file): removing it would let a third export lock a new file while a second still
/// holds the old one.
pub const LOCK_FILE: &str = ".pipecut-export.lock";

/// An export folder held for one export; dropping it lets the next one in.
#[derive(Debug)]
pub struct OutDirLock {
    _file: File,
}

/// Creates `out_dir` if missing and takes its export lock without waiting: a second export into
/// the same folder is refused at once, naming the folder, rather than mixing its files with the
/// first's (both exited 0, each with a manifest naming the other's files). The lock is an
/// advisory `flock`-style lock on [`LOCK_FILE`], released when the process ends, however it ends.
///
/// # Errors
/// [`Error::OutDir`] for a folder that cannot be created, or that another export holds.
pub fn lock_out_dir(out_dir: &Path) -> Result<OutDirLock, Error> {
    files::prepare_out_dir(out_dir)?;
    let fail = |detail: String| Error::OutDir {
        path: out_dir.to_path_buf(),
        detail,
    };
    let path = out_dir.join(LOCK_FILE);
    // Never follow a link planted at the lock's name, nor open a FIFO there.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(fail(format!("'{LOCK_FILE}' there is not a regular file")));
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| fail(format!("cannot create its lock file {LOCK_FILE}: {e}")))?;
    match file.try_lock() {
        Ok(()) => Ok(OutDirLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(fail(
            "another pipecut export is writing into it; wait for it to finish, or export elsewhere"
                .into(),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(fail(format!("cannot lock {LOCK_FILE}: {e}"))),
    }
}

/// Each stage of `stages` as a model file's bytes, built in memory as [`export_stages`] builds
/// them (external data stays where the model's is: load them against the model's directory).
///
/// # Errors
/// As [`export_stages`], less the output directory's.
pub fn stage_models(
    model_path: &Path,
    graph: &Graph,
    stages: &[Vec<NodeId>],
) -> Result<Vec<Vec<u8>>, Error> {
    let routes = Routes::new(graph, stages)?;
    let bytes = pipecut_ir::io::read_model_bytes(model_path)?;
    let proto = ModelProto::parse_from_bytes(&bytes).map_err(|e| Error::NotOnnx {
        origin: model_path.display().to_string(),
        detail: format!("protobuf decoding failed: {e}"),
    })?;
    let index = ProtoIndex::new(&proto, graph)?;
    let model_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut external = ExternalFiles::new(Some(model_dir.to_path_buf()));
    (0..routes.stages.len())
        .map(|stage| Ok(build_stage(&index, graph, &routes, stage, &mut external)?.bytes))
        .collect()
}

/// Every file of an export, complete under temporary names in the output directory.
struct StagedExport {
    stages: Vec<Staged>,
    external: Vec<Staged>,
    manifest_bytes: Vec<u8>,
    manifest: Manifest,
    mode: OutputMode,
}

impl StagedExport {
    /// Renames every file into place, the manifest last. An earlier manifest is taken away
    /// first, so that a directory whose renames stop midway never looks complete.
    fn commit(self, out_dir: &Path) -> Result<Manifest, Error> {
        let manifest_path = out_dir.join(MANIFEST_FILE);
        match std::fs::remove_file(&manifest_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::Write {
                    path: manifest_path,
                    source: e,
                })
            }
            _ => {}
        }
        for file in self.stages.into_iter().chain(self.external) {
            file.commit()?;
        }
        files::stage_bytes(&manifest_path, &self.manifest_bytes, self.mode)?.commit()?;
        Ok(self.manifest)
    }
}

/// Builds every stage, copies the external data it reads and makes the manifest, all into
/// temporaries: dropping the result on an error removes them and leaves the directory as it was.
fn stage_all(
    model_path: &Path,
    graph: &Graph,
    routes: &Routes,
    index: &ProtoIndex<'_>,
    model: ManifestModel,
    out_dir: &Path,
) -> Result<StagedExport, Error> {
    let mode = OutputMode::like(model_path);
    let model_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut external = ExternalFiles::new(Some(model_dir.to_path_buf()));
    let mut figures = Vec::with_capacity(routes.stages.len());
    let mut stages = Vec::with_capacity(routes.stages.len());
    let mut locations = std::collections::BTreeMap::new();
    for stage in 0..routes.stages.len() {
        let built = build_stage(index, graph, routes, stage, &mut external)?;
        let path = out_dir.join(stage_file_name(stage));
        pipecut_ir::io::check_output(&path, &[model_path])?;
        stages.push(files::stage_bytes(&path, &built.bytes, mode)?);
        figures.push(StageFigures {
            constant_nodes: built.constant_nodes,
            file_bytes: built.bytes.len() as u64,
            sha256: pipecut_ir::onnx::sha256_hex(&built.bytes),
        });
        locations.extend(built.external_locations);
    }
    pipecut_ir::io::check_output(&out_dir.join(MANIFEST_FILE), &[model_path])?;
    let mut copies = Vec::new();
    let mut external_data = Vec::with_capacity(locations.len());
    for (location, source) in locations {
        let placement = match files::stage_external(&source, out_dir, &location, mode)? {
            Some(copy) => {
                copies.push(copy);
                Placement::Copy
            }
            None => Placement::AlreadyThere,
        };
        external_data.push(ExternalDataFile {
            location,
            placement,
        });
    }
    let manifest = Manifest::new(graph, routes, model, &figures, external_data);
    Ok(StagedExport {
        stages,
        external: copies,
        manifest_bytes: manifest.to_json().into_bytes(),
        manifest,
        mode,
    })
}
