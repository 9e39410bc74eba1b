//! Planning needs no weight bytes: a model whose external-data files are absent (the GPT-3
//! fixture before anything created its 349 GB placeholder, weights kept on another machine)
//! loads with a warning for inspect/cost/partition/check, and only export and run refuse it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .current_dir(common::root())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The GPT-3 fixture's protobuf alone, in a directory without its weights file.
fn gpt3_without_weights(dir: &Path) -> PathBuf {
    let model = dir.join("model.onnx");
    std::fs::copy(
        common::root().join("fixtures/models/gpt3_175b/model.onnx"),
        &model,
    )
    .unwrap();
    model
}

#[test]
fn gpt3_loads_for_planning_without_its_weights_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = gpt3_without_weights(dir.path());
    let model = pipecut::onnx::load_model(&path).unwrap();
    assert!(
        model.missing_external_data.len() > 90,
        "every layer's weights are missing: {}",
        model.missing_external_data.len()
    );
    let error = model.require_external_data().unwrap_err().to_string();
    assert!(error.contains("gpt3_175b.weights"), "{error}");

    let (code, out, err) = pipecut(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty(), "{err}");
    assert_eq!(
        err.matches("warning: ").count(),
        1,
        "one warning per missing file: {err}"
    );
    assert!(
        err.contains("gpt3_175b.weights' does not exist") && err.contains("planning needs only"),
        "{err}"
    );
}

#[test]
fn gpt3_partitions_without_its_weights_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = gpt3_without_weights(dir.path());
    let plan = dir.path().join("plan.json");
    let (code, _, err) = pipecut(&[
        "partition",
        path.to_str().unwrap(),
        "--cluster",
        "2x8xH100-SXM",
        "--dim",
        "batch=1",
        "--dim",
        "seq=2048",
        "--solver",
        "dp",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning: "), "{err}");
    let (code, _, err) = pipecut(&["check", plan.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // Exporting reads the weights: refused, naming the file.
    let (code, _, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        path.to_str().unwrap(),
        "--out-dir",
        dir.path().join("stages").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("gpt3_175b.weights': no such file"), "{err}");
    assert!(!dir.path().join("stages").exists());
}

#[test]
fn a_location_outside_the_model_directory_is_still_refused() {
    // Absence is tolerated only after the location passed the containment checks.
    for (file, error) in [
        (
            "external_traversal.onnx",
            "the path leaves the model's directory",
        ),
        (
            "external_absolute.onnx",
            "the path leaves the model's directory",
        ),
    ] {
        let path = format!("tests/malformed/{file}");
        let (code, _, err) = pipecut(&["inspect", &path]);
        assert_eq!(code, 2, "{file}: {err}");
        assert!(err.contains(error), "{file}: {err}");
    }
}
