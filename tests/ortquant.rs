//! Models quantized by onnxruntime's own quantizer (fixtures/ortquant, written by its
//! generate.py with onnxruntime's outputs): `quantize_dynamic` (DynamicQuantizeLSTM forward,
//! reverse and bidirectional, QAttention with and without a past state,
//! MatMulInteger / ConvInteger, and DynamicQuantizeMatMul and MatMulIntegerToFloat as
//! onnxruntime's optimizer saves them)
//! and `quantize_static` in the QOperator (QGemm, QLinearAdd, QLinearConcat, ...) and QDQ
//! formats, through the CLI: `inspect`, `partition --out`, `export`, and `run`.

mod common;

use std::path::{Path, PathBuf};

use common::pipecut_cli as pipecut;
use pipecut::runtime::read_npy;

/// Every quantized model, with the dims its plan binds (x.npy's).
const MODELS: &[(&str, &[&str])] = &[
    ("attn_dynamic", &["batch=2", "seq=4"]),
    ("attn_past_dynamic", &["batch=2", "seq=2", "past=3"]),
    ("cnn_dynamic", &["batch=2"]),
    ("cnn_static_qdq", &["batch=2"]),
    ("cnn_static_qoperator", &["batch=2"]),
    ("lstm_dynamic", &["batch=2", "seq=5"]),
    ("lstm_bidirectional_dynamic", &["batch=3", "seq=4"]),
    ("lstm_reverse_dynamic", &["batch=3", "seq=4"]),
    ("mlp_dynamic", &["batch=2"]),
    ("mlp_dynamic_optimized", &["batch=2"]),
    ("mlp_static_qdq", &["batch=2"]),
    ("mlp_static_qoperator", &["batch=2"]),
    ("ops_dynamic", &["batch=2"]),
    ("ops_static_qdq", &["batch=2"]),
    ("ops_static_qoperator", &["batch=2"]),
    ("shared_dynamic", &["batch=3"]),
    ("shared_dynamic_optimized", &["batch=3"]),
];

/// Every model runs on the CPU runtime; how far its output may be from onnxruntime's, relative
/// to `1 + |expected|`. The QOperator and QDQ models must match exactly; the others match to
/// float rounding (measured: ≤ 4.8e-6). ops_static_qdq matches since AveragePool sums its
/// window in the order onnxruntime's MLAS does (before, its last bit moved 4 of 128 values
/// across a QuantizeLinear boundary, and Mul and Softmax made that 0.063 on 2 outputs); its
/// reference is onnxruntime running the QDQ graph as written (fixtures/ortquant/generate.py).
const RUNS: &[(&str, f32)] = &[
    ("attn_dynamic", 1e-4),
    ("attn_past_dynamic", 1e-4),
    ("cnn_dynamic", 1e-4),
    ("cnn_static_qdq", 0.0),
    ("cnn_static_qoperator", 0.0),
    ("lstm_dynamic", 1e-4),
    ("lstm_bidirectional_dynamic", 1e-4),
    ("lstm_reverse_dynamic", 1e-4),
    ("mlp_dynamic", 1e-4),
    ("mlp_dynamic_optimized", 1e-4),
    ("mlp_static_qdq", 0.0),
    ("mlp_static_qoperator", 0.0),
    ("ops_dynamic", 1e-4),
    ("ops_static_qdq", 0.0),
    ("ops_static_qoperator", 0.0),
    ("shared_dynamic", 1e-4),
    ("shared_dynamic_optimized", 1e-4),
];

fn model_path(name: &str) -> String {
    let path = common::root()
        .join("fixtures/ortquant")
        .join(name)
        .join("model.onnx");
    path.to_str().unwrap().to_string()
}

fn dims_of(name: &str) -> &'static [&'static str] {
    MODELS.iter().find(|(n, _)| *n == name).unwrap().1
}

/// `pipecut partition` on `devices` (one stage per device), one micro-batch.
fn partition(dir: &Path, name: &str, devices: &str) -> PathBuf {
    let plan = dir.join(format!("{name}.{devices}.plan.json"));
    common::partition_on_devices(&model_path(name), devices, dims_of(name), &plan);
    plan
}

#[test]
fn every_quantized_model_inspects_partitions_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    for (name, _) in MODELS {
        let model = model_path(name);
        let (code, out, err) = pipecut(&["inspect", &model]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(
            out.contains("shape inference: every tensor typed"),
            "{name}: {out}"
        );
        let plan = partition(dir.path(), name, "A100-80GB");
        let out_dir = dir.path().join(format!("{name}.export"));
        let args = [
            "export",
            plan.to_str().unwrap(),
            &model,
            "--out-dir",
            out_dir.to_str().unwrap(),
        ];
        let (code, _, err) = pipecut(&args);
        assert_eq!(code, 0, "{name}: export failed: {err}");
        assert!(out_dir.join("stage_0.onnx").exists(), "{name}");
    }
}

/// The inputs (x, and the past state of a model that continues one) and outputs (y, and the
/// present state) generate.py wrote for `name`.
const INPUTS: [&str; 2] = ["x", "past"];
const OUTPUTS: [&str; 2] = ["y", "present"];

/// Runs the plan of `name` on `devices` and compares its outputs with onnxruntime's.
fn run_and_compare(dir: &Path, name: &str, devices: &str, tolerance: f32) {
    let plan = partition(dir, name, devices);
    let fixture = common::root().join("fixtures/ortquant").join(name);
    let out_dir = dir.join(format!("{name}.{devices}.out"));
    let model = model_path(name);
    let mut args = vec!["run".to_string(), plan.display().to_string(), model];
    for input in INPUTS {
        let file = fixture.join(format!("{input}.npy"));
        if file.exists() {
            args.extend(["--input".to_string(), format!("{input}={}", file.display())]);
        }
    }
    args.extend(["--output-dir".to_string(), out_dir.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = pipecut(&args);
    assert_eq!(code, 0, "{name} on {devices}: run failed: {err}");
    for output in OUTPUTS {
        let want_file = fixture.join(format!("{output}.npy"));
        if !want_file.exists() {
            continue;
        }
        let got = read_npy(&out_dir.join(format!("{output}.npy")))
            .unwrap()
            .tensor;
        let want = read_npy(&want_file).unwrap().tensor;
        assert_eq!(got.shape(), want.shape(), "{name} {output}");
        let (got, want) = (got.to_f32_vec(), want.to_f32_vec());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let slack = tolerance * (1.0 + b.abs());
            assert!(
                (a - b).abs() <= slack,
                "{name} on {devices} {output}[{i}]: {a} vs {b}"
            );
        }
    }
}

#[test]
fn quantized_models_run_as_onnxruntime_does() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, tolerance) in RUNS {
        run_and_compare(dir.path(), name, "A100-80GB", tolerance);
    }
}

#[test]
fn quantized_models_cut_in_two_stages_run_as_onnxruntime_does() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "cnn_static_qoperator",
        "mlp_static_qoperator",
        "attn_dynamic",
    ] {
        run_and_compare(dir.path(), name, "A100-80GB,A100-80GB", 1e-4);
    }
}
