//! scikit-learn models as skl2onnx 1.20 converts them (fixtures/sklearn), and XGBoost and
//! LightGBM models as onnxmltools 1.16 converts them (fixtures/onnxmltools), each written by
//! its generate.py with onnxruntime's outputs beside each model, through every phase of the CLI:
//! `inspect`, `partition --out`, `export`, and `run --input X=x.npy`, whose outputs must match
//! onnxruntime's. The classes cover every `ai.onnx.ml` op skl2onnx emits for them and the
//! `com.microsoft` Tokenizer of TfidfVectorizer.

mod common;

use std::path::{Path, PathBuf};

use common::pipecut_cli as pipecut;
use pipecut::runtime::{read_npy, TensorData};

/// Every converted model, with the dims its plan binds (the batch of 8 rows, and for the text
/// model the sizes that depend on its 4 texts).
const MODELS: &[(&str, &[&str])] = &[
    ("forest_regressor", &["X.0=8"]),
    ("gb_regressor", &["X.0=8"]),
    ("gradient_boosting", &["X.0=8"]),
    ("lgbm_binary", &["X.0=8"]),
    ("lgbm_multiclass", &["X.0=8"]),
    ("lgbm_regressor", &["X.0=8"]),
    ("gradient_boosting_binary", &["X.0=8"]),
    ("imputer", &["X.0=8"]),
    ("linear_regression", &["X.0=8"]),
    ("logreg", &["X.0=8"]),
    ("logreg_strings", &["X.0=8"]),
    ("normalizer_binarizer", &["X.0=8"]),
    ("one_hot", &["X.0=8"]),
    ("random_forest", &["X.0=8"]),
    ("scaler_logreg", &["X.0=8"]),
    ("svc", &["X.0=8"]),
    ("svc_linear_binary", &["X.0=8"]),
    ("svc_probability", &["X.0=8"]),
    ("svr", &["X.0=8"]),
    ("tfidf", &["X.0=4", "normalized.0=4", "tokenized.1=6"]),
    ("xgb_binary", &["X.0=8"]),
    ("xgb_multiclass", &["X.0=8"]),
    ("xgb_regressor", &["X.0=8"]),
];

/// onnxruntime's float outputs agree with pipecut's to this (f32 sums in another order).
const TOLERANCE: f32 = 1e-4;

/// The fixture's folder: fixtures/sklearn (skl2onnx's) or fixtures/onnxmltools.
fn fixture_dir(name: &str) -> PathBuf {
    let fixtures = common::root().join("fixtures");
    let onnxmltools = fixtures.join("onnxmltools").join(name);
    if onnxmltools.exists() {
        onnxmltools
    } else {
        fixtures.join("sklearn").join(name)
    }
}

fn model_path(name: &str) -> String {
    fixture_dir(name)
        .join("model.onnx")
        .to_str()
        .unwrap()
        .to_string()
}

/// `pipecut partition` of the model on one GPU, one micro-batch, the plan in `dir`.
fn partition(dir: &Path, name: &str, dims: &[&str]) -> String {
    let plan = dir.join(format!("{name}.plan.json"));
    common::partition_on_devices(&model_path(name), "A100-80GB", dims, &plan);
    plan.to_str().unwrap().to_string()
}

#[test]
fn every_converted_model_inspects_with_every_tensor_typed() {
    for (name, _) in MODELS {
        let model = model_path(name);
        let (code, out, err) = pipecut(&["inspect", &model]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(
            out.contains("shape inference: every tensor typed"),
            "{name}: {out}"
        );
    }
}

#[test]
fn zipmap_outputs_show_as_sequences_of_maps() {
    let (code, out, err) = pipecut(&["inspect", &model_path("logreg_strings")]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("output_probability"))
        .unwrap();
    assert!(line.contains("(sequence of maps from string)"), "{line}");
    assert!(line.contains("[3]"), "{line}");
}

#[test]
fn every_converted_model_partitions_and_exports_one_stage() {
    let dir = tempfile::tempdir().unwrap();
    for (name, dims) in MODELS {
        let plan = partition(dir.path(), name, dims);
        let out_dir = dir.path().join(format!("{name}.export"));
        let model = model_path(name);
        let (code, _, err) = pipecut(&[
            "export",
            &plan,
            &model,
            "--out-dir",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{name}: export failed: {err}");
        assert!(
            out_dir.join("stage_0.onnx").exists(),
            "{name}: no stage file"
        );
    }
}

/// The `.npy` files generate.py wrote from onnxruntime, but x.npy (the input).
fn expected_outputs(name: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir(name))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "npy") && !p.ends_with("x.npy"))
        .collect();
    files.sort();
    files
}

fn assert_same(name: &str, file: &Path, got: &TensorData, want: &TensorData) {
    match (got, want) {
        (TensorData::F32(g), TensorData::F32(w)) => {
            assert_eq!(g.len(), w.len(), "{name} {}", file.display());
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                let slack = TOLERANCE * (1.0 + b.abs());
                assert!(
                    (a - b).abs() <= slack,
                    "{name} {}[{i}]: {a} vs {b}",
                    file.display()
                );
            }
        }
        _ => assert_eq!(got, want, "{name} {}", file.display()),
    }
}

#[test]
fn every_converted_model_runs_as_onnxruntime_does() {
    let dir = tempfile::tempdir().unwrap();
    for (name, dims) in MODELS {
        let plan = partition(dir.path(), name, dims);
        let out_dir = dir.path().join(format!("{name}.out"));
        let input = format!("X={}", fixture_dir(name).join("x.npy").display());
        let model = model_path(name);
        let (code, _, err) = pipecut(&[
            "run",
            &plan,
            &model,
            "--input",
            &input,
            "--output-dir",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{name}: run failed: {err}");
        for want_file in expected_outputs(name) {
            let file_name = want_file.file_name().unwrap();
            let got = read_npy(&out_dir.join(file_name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = read_npy(&want_file).unwrap();
            assert_eq!(
                got.tensor.shape(),
                want.tensor.shape(),
                "{name} {}",
                want_file.display()
            );
            assert_same(name, &want_file, got.tensor.data(), want.tensor.data());
        }
    }
}

/// The models whose input is a map (given as `<input>.json`), with that input and the dims
/// their plans bind (CastMap's DENSE width is the map's size, known only from the data).
const MAP_MODELS: &[(&str, &str, &[&str])] = &[
    ("dict_vectorizer", "X", &[]),
    ("cast_map", "F", &["dense_float.1=4", "dense_int.1=4"]),
];

/// `pipecut run` of a map fixture with `--input NAME=FILE` for each `(NAME, FILE)`, outputs
/// in `out_dir`: the exit code and stderr.
fn run_fixture(
    dir: &Path,
    name: &str,
    inputs: &[(&str, PathBuf)],
    out_dir: &Path,
) -> (i32, String) {
    let dims = MAP_MODELS.iter().find(|m| m.0 == name).unwrap().2;
    let plan = partition(dir, name, dims);
    let model = model_path(name);
    let mut args = vec!["run".to_string(), plan, model];
    for (input, file) in inputs {
        args.extend(["--input".to_string(), format!("{input}={}", file.display())]);
    }
    args.extend([
        "--output-dir".to_string(),
        out_dir.to_str().unwrap().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = pipecut(&args);
    (code, err)
}

#[test]
fn map_inputs_run_from_json_as_onnxruntime_does() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, input, _) in MAP_MODELS {
        let (code, out, err) = pipecut(&["inspect", &model_path(name)]);
        assert_eq!(code, 0, "{name}: {err}");
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{input} ")))
            .unwrap();
        assert!(line.contains("(map from "), "{line}");
        let out_dir = dir.path().join(format!("{name}.out"));
        let file = fixture_dir(name).join(format!("{input}.json"));
        let (code, err) = run_fixture(dir.path(), name, &[(input, file)], &out_dir);
        assert_eq!(code, 0, "{name}: run failed: {err}");
        let expected = expected_outputs(name);
        assert!(!expected.is_empty(), "{name}: no onnxruntime outputs");
        for want_file in expected {
            let got = read_npy(&out_dir.join(want_file.file_name().unwrap()))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = read_npy(&want_file).unwrap();
            assert_eq!(
                got.tensor.shape(),
                want.tensor.shape(),
                "{}",
                want_file.display()
            );
            assert_eq!(got.stored, want.stored, "{}", want_file.display());
            assert_same(name, &want_file, got.tensor.data(), want.tensor.data());
        }
    }
}

/// Writes `text` as `file_name` in `dir`.
fn write_file(dir: &Path, file_name: &str, text: &str) -> PathBuf {
    let path = dir.join(file_name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn bad_map_inputs_are_refused_in_one_line_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    let many: String = (0..(1 << 20) + 1).map(|k| format!("\"{k}\":0,")).collect();
    let cases = [
        (
            "cast_map",
            write_file(dir.path(), "word.json", r#"{"1": 2.0, "a": 1.0}"#),
            "key 'a' is not an int64",
        ),
        (
            "cast_map",
            write_file(dir.path(), "twice.json", r#"{"1": 2.0, "1": 1.0}"#),
            "key '1' is given twice",
        ),
        (
            "cast_map",
            write_file(dir.path(), "same.json", r#"{"1": 2.0, "01": 1.0}"#),
            "key '1' appears twice",
        ),
        (
            "cast_map",
            write_file(dir.path(), "text.json", r#"{"1": "2.0"}"#),
            "key '1' holds \"2.0\"",
        ),
        (
            "cast_map",
            write_file(dir.path(), "list.json", "[1, 2]"),
            "a JSON object",
        ),
        (
            "cast_map",
            write_file(
                dir.path(),
                "many.json",
                &format!("{{{}}}", many.trim_end_matches(',')),
            ),
            "more than 1048576 entries",
        ),
        ("cast_map", big, "larger than 64 MiB"),
        (
            "cast_map",
            fixture_dir("logreg").join("x.npy"),
            "give it as a .json object",
        ),
        (
            "dict_vectorizer",
            write_file(dir.path(), "int.json", r#"{"a": "1"}"#),
            "key 'a' holds \"1\"",
        ),
    ];
    for (name, file, wanted) in cases {
        let input = if name == "cast_map" { "F" } else { "X" };
        let out_dir = dir.path().join("out");
        let (code, err) = run_fixture(dir.path(), name, &[(input, file.clone())], &out_dir);
        assert_ne!(code, 0, "{}: accepted", file.display());
        assert_eq!(err.trim().lines().count(), 1, "{}: {err}", file.display());
        assert!(err.contains(wanted), "{}: {err}", file.display());
        assert!(
            !out_dir.exists(),
            "a refused run wrote {}",
            out_dir.display()
        );
    }
}
