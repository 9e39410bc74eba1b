//! Phase 6, export: one runnable ONNX file per pipeline stage, and the manifest that chains them.
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
//! every referenced data file is made reachable there without copying its bytes: a hard link
//! when the output directory is on the same filesystem, else a symbolic link to the original's
//! absolute path, and only when neither can be made, a copy ([`Placement`]). Each stage reads
//! only its own ranges of the shared file.
//!
//! # Files
//!
//! Every file is written under a temporary name and renamed into place, so no half-written
//! file is ever left under a final name. A manifest from an earlier export is removed first and
//! the new one is written last, so its presence means the export is complete. On an error, the
//! files this export already wrote are removed. Stage files of an earlier export with more
//! stages (`stage_5.onnx` after a 4-stage export) are left alone: the manifest lists the files
//! that belong to it.
//!
//! ```
//! use pipecut::onnx::export::export_stages;
//! use pipecut::onnx::shape::{DimBindings, ShapeInference};
//!
//! let path = std::path::Path::new("fixtures/models/mlp.onnx");
//! let mut model = pipecut::onnx::load_model(path)?;
//! ShapeInference::new(DimBindings::new()).run(&mut model.graph)?;
//! // Two stages: the first half of the topological order, then the rest.
//! let order = model.graph.topological_order();
//! let stages = vec![order[..order.len() / 2].to_vec(), order[order.len() / 2..].to_vec()];
//! let out_dir = std::env::temp_dir().join(format!("pipecut-doc-export-{}", std::process::id()));
//! let manifest = export_stages(path, &model.graph, &stages, &out_dir)?;
//! assert_eq!(manifest.stages.len(), 2);
//! assert!(out_dir.join("stage_1.onnx").exists() && out_dir.join("manifest.json").exists());
//! # std::fs::remove_dir_all(&out_dir).ok();
//! # Ok::<(), pipecut::Error>(())
//! ```

mod files;
mod manifest;
mod routes;
mod stage;

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use onnx_protobuf::{Message, ModelProto};

pub use files::{write_atomically, Placement};
pub use manifest::{
    ExternalDataFile, Manifest, ManifestDim, ManifestModel, ManifestStage, ManifestTensor,
    ModelOutput, StageInput, StageOutput, TensorDestination, TensorSource, MANIFEST_VERSION,
};

use crate::graph::{Graph, NodeId};
use crate::Error;
use manifest::{stage_file_name, StageFigures};
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
/// [`Error::NotAPartition`], [`Error::NonConvexStages`], [`Error::OutDir`] and [`Error::Write`]
/// for unwritable output, [`Error::Io`]/[`Error::NotOnnx`] for an unreadable model, and
/// [`Error::Export`] for a model file that does not match the graph.
pub fn export_stages(
    model_path: &Path,
    graph: &Graph,
    stages: &[Vec<NodeId>],
    out_dir: &Path,
) -> Result<Manifest, Error> {
    let routes = Routes::new(graph, stages)?;
    let map = map_model(model_path)?;
    let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
    if bytes.is_empty() {
        return Err(Error::NotOnnx {
            origin: model_path.display().to_string(),
            detail: "the file is empty".into(),
        });
    }
    let proto = ModelProto::parse_from_bytes(bytes).map_err(|e| Error::NotOnnx {
        origin: model_path.display().to_string(),
        detail: format!("protobuf decoding failed: {e}"),
    })?;
    let index = ProtoIndex::new(&proto, graph)?;
    let model = ManifestModel {
        file_name: model_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        sha256: crate::plan::sha256_hex(bytes),
        graph: graph.name().to_string(),
    };
    files::prepare_out_dir(out_dir)?;

    let mut written: Vec<PathBuf> = Vec::new();
    let result = write_all(
        model_path,
        graph,
        &routes,
        &index,
        model,
        out_dir,
        &mut written,
    );
    if result.is_err() {
        for path in &written {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

/// Builds and writes every stage, places the external data, then writes the manifest; records
/// each file it creates in `written` so that the caller can take them back on an error.
fn write_all(
    model_path: &Path,
    graph: &Graph,
    routes: &Routes,
    index: &ProtoIndex<'_>,
    model: ManifestModel,
    out_dir: &Path,
    written: &mut Vec<PathBuf>,
) -> Result<Manifest, Error> {
    // A manifest left by an earlier export would describe files this one is replacing: take it
    // away first, so that a directory whose export fails midway never looks complete.
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
    let mut figures = Vec::with_capacity(routes.stages.len());
    let mut locations = std::collections::BTreeSet::new();
    for stage in 0..routes.stages.len() {
        let built = build_stage(index, graph, routes, stage)?;
        let path = out_dir.join(stage_file_name(stage));
        write_atomically(&path, &built.bytes)?;
        written.push(path);
        figures.push(StageFigures {
            constant_nodes: built.constant_nodes,
            file_bytes: built.bytes.len() as u64,
        });
        locations.extend(built.external_locations);
    }
    let model_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut external_data = Vec::with_capacity(locations.len());
    for location in locations {
        let target = out_dir.join(&location);
        let placement = files::place_external(&model_dir.join(&location), &target)?;
        if placement != Placement::AlreadyThere {
            written.push(target);
        }
        external_data.push(ExternalDataFile {
            location,
            placement,
        });
    }
    let manifest = Manifest::new(graph, routes, model, &figures, external_data);
    write_atomically(&manifest_path, manifest.to_json().as_bytes())?;
    Ok(manifest)
}

/// Maps the model file read-only (`None` for an empty file, which mapping refuses).
fn map_model(path: &Path) -> Result<Option<Mmap>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: read-only map that lives only for the export, as in `load_model`: a concurrent
    // truncation makes reads fault as it would for any reader; mapping avoids a second copy of
    // a large protobuf in memory.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Some(map))
}
