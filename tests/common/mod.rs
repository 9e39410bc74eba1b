//! Shared helpers for the phase tests: fixture paths and the onnx reference shapes.

#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The committed synthetic fixtures, by name.
pub const FIXTURES: [&str; 5] = ["mlp", "gpt2_tiny", "bert_tiny", "resnet_tiny", "llama_tiny"];

pub fn fixture(name: &str) -> PathBuf {
    root().join("fixtures/models").join(format!("{name}.onnx"))
}

/// Real third-party models in the fetched cache, as (name, path). Prints why when none are
/// there: `fixtures/real/fetch.sh` (run by `.ci/run`) fills the cache when PyPI is reachable.
pub fn real_models() -> Vec<(String, PathBuf)> {
    let refs = root().join("fixtures/reference/real");
    let mut models: Vec<(String, PathBuf)> = std::fs::read_dir(&refs)
        .expect("fixtures/reference/real exists")
        .filter_map(|e| {
            let name = e.ok()?.path().file_stem()?.to_string_lossy().into_owned();
            Some((
                name.clone(),
                root()
                    .join("fixtures/real/cache")
                    .join(format!("{name}.onnx")),
            ))
        })
        .collect();
    models.sort();
    let present: Vec<_> = models.iter().filter(|(_, p)| p.exists()).cloned().collect();
    for (name, path) in &models {
        if !path.exists() {
            eprintln!(
                "skipping real model {name}: {} is absent (run fixtures/real/fetch.sh)",
                path.display()
            );
        }
    }
    present
}

/// The reference written by `fixtures/reference_shapes.py` from `onnx.shape_inference`.
pub struct Reference {
    pub dims: Vec<(String, u64)>,
    pub json: Value,
}

pub fn reference(path: &Path) -> Reference {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: Value = serde_json::from_str(&text).unwrap();
    let dims = json["dims"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    Reference { dims, json }
}

pub fn fixture_reference(name: &str) -> Reference {
    reference(
        &root()
            .join("fixtures/reference")
            .join(format!("{name}.json")),
    )
}

pub fn real_reference(name: &str) -> Reference {
    reference(
        &root()
            .join("fixtures/reference/real")
            .join(format!("{name}.json")),
    )
}

/// Writes the GPT-3 placeholder weights as a sparse file, so that the external-data checks
/// (which read only metadata) pass without 349 GB of disk.
pub fn gpt3_with_placeholder_weights() -> PathBuf {
    let dir = root().join("fixtures/models/gpt3_175b");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("placeholder.json")).unwrap())
            .unwrap();
    let weights = dir.join(meta["location"].as_str().unwrap());
    let total = meta["total_bytes"].as_u64().unwrap();
    if std::fs::metadata(&weights).map(|m| m.len()).ok() != Some(total) {
        File::create(&weights).unwrap().set_len(total).unwrap();
    }
    dir.join("model.onnx")
}

/// One case of the malformed corpus (`tests/malformed/cases.json`): a file under
/// `tests/malformed/` or a command line, and a fragment of the error it must give.
#[derive(Debug, Clone)]
pub struct MalformedCase {
    pub file: Option<String>,
    pub args: Option<Vec<String>>,
    pub error: String,
}

pub fn malformed_cases() -> Vec<MalformedCase> {
    let path = root().join("tests/malformed/cases.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["cases"]
        .as_array()
        .expect("cases.json has a 'cases' list")
        .iter()
        .map(|case| MalformedCase {
            file: case["file"].as_str().map(str::to_string),
            args: case["args"].as_array().map(|args| {
                args.iter()
                    .map(|a| a.as_str().expect("args are strings").to_string())
                    .collect()
            }),
            error: case["error"]
                .as_str()
                .expect("every case names its error")
                .to_string(),
        })
        .collect()
}
