//! Per-op conformance: ONNX backend node cases of the pinned onnx package, and cases built with
//! `onnx.helper` whose references come from onnxruntime (com.microsoft fused ops, the dynamic
//! quantizer's output), run through load → shape inference (declared output shapes erased by
//! `fixtures/node_cases.py`) → the CPU runtime, against the reference outputs.
//!
//! Each test names its ops; every case the script writes for them must pass, except those in
//! [`EXPECTED_FAILURES`], which must fail (so a fixed case cannot hide behind a stale entry).
//! The cases are generated into `target/tmp` (git-ignored) by the pinned venv; without it (run
//! `bash fixtures/pyenv.sh`) the tests print why and skip. The full suite over every op is
//! another test's business; these stay per-op and small.
//!
//! Tolerance: |actual − expected| ≤ 1e-4 + 1e-4·|expected| for floats (the references are
//! float32 numpy or onnxruntime results; the kernels sum in another order), exact for integers.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::runtime::{read_npy_as, CpuExecutor, HostTensor, Tensors, Weights};
use serde_json::Value;

const ATOL: f32 = 1e-4;
const RTOL: f32 = 1e-4;

/// Cases of the tested ops that fail today, with the reason. Each must fail. (onnx 1.19.1's
/// QLinearMatMul int8 references wrapped where the spec saturates; 1.23.2's saturate, and none
/// fails.)
const EXPECTED_FAILURES: &[(&str, &str)] = &[];

fn python() -> Option<PathBuf> {
    let python = common::root().join(".venv/bin/python");
    if python.exists() {
        Some(python)
    } else {
        eprintln!(
            "skipping the node cases: {} is absent (run bash fixtures/pyenv.sh)",
            python.display()
        );
        None
    }
}

/// Writes the cases of `ops` into a fresh directory and returns their names and the directory.
fn generate(group: &str, ops: &[&str]) -> Option<(PathBuf, Vec<String>)> {
    let python = python()?;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("node_cases")
        .join(group);
    let _ = std::fs::remove_dir_all(&dir);
    let output = Command::new(python)
        .arg(common::root().join("fixtures/node_cases.py"))
        .arg(&dir)
        .args(ops)
        .output()
        .expect("python starts");
    assert!(
        output.status.success(),
        "node_cases.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(!names.is_empty(), "no case written for {ops:?}");
    Some((dir, names))
}

/// Runs one case through every phase; `Err` says which phase failed and how.
fn run_case(case_dir: &Path) -> Result<(), String> {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(case_dir.join("manifest.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    // ml_dtypes saves float8, float4 and int4 as raw bytes: read as the model declares them.
    let read = |section: &str,
                graph: &pipecut::graph::Graph|
     -> Result<BTreeMap<String, HostTensor>, String> {
        manifest[section]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, file)| {
                let path = case_dir.join(file.as_str().unwrap());
                let declared = graph.tensor_id(name).and_then(|id| graph.tensor(id).dtype);
                let array = read_npy_as(&path, declared).map_err(|e| format!("reference: {e}"))?;
                Ok((name.clone(), array.tensor))
            })
            .collect()
    };
    let model_path = case_dir.join("model.onnx");
    let mut model = pipecut::onnx::load_model(&model_path).map_err(|e| format!("load: {e}"))?;
    let mut bindings = DimBindings::new();
    for (name, size) in manifest["dims"].as_object().unwrap() {
        bindings = bindings.bind(name, size.as_u64().unwrap());
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .map_err(|e| format!("shape: {e}"))?;
    let graph = &model.graph;
    let expected = read("outputs", graph)?;
    for &id in graph.outputs() {
        let name = &graph.tensor(id).name;
        let want = &expected[name];
        let inferred = graph
            .concrete_shape(id)
            .map_err(|e| format!("shape of '{name}': {e}"))?;
        let want_shape: Vec<u64> = want.shape().iter().map(|&d| d as u64).collect();
        if inferred != want_shape {
            return Err(format!(
                "shape: '{name}' inferred {inferred:?}, reference {want_shape:?}"
            ));
        }
    }
    let weights = Weights::load(&model_path, graph).map_err(|e| format!("weights: {e}"))?;
    let inputs: Tensors = read("inputs", graph)?
        .into_iter()
        .map(|(k, v)| (k, Arc::new(v)))
        .collect();
    let actual = CpuExecutor::new(graph, &weights)
        .run_model(&inputs)
        .map_err(|e| format!("run: {e}"))?;
    for (name, want) in &expected {
        let got = actual
            .get(name)
            .ok_or_else(|| format!("run: no output '{name}'"))?;
        compare(name, got, want)?;
    }
    Ok(())
}

fn compare(name: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "run: '{name}' is {:?} {} but the reference is {:?} {}",
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    if want.dtype().is_float() {
        let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let same_nan = a.is_nan() && b.is_nan();
            let within = (a - b).abs() <= ATOL + RTOL * b.abs();
            if !same_nan && !within {
                return Err(format!("run: '{name}' element {i} is {a}, reference {b}"));
            }
        }
    } else if got.to_i64_vec() != want.to_i64_vec() {
        return Err(format!(
            "run: '{name}' is {:?}, reference {:?}",
            got.to_i64_vec(),
            want.to_i64_vec()
        ));
    }
    Ok(())
}

/// Generates the cases of `ops`, runs them all, and checks them against [`EXPECTED_FAILURES`].
fn check_ops(group: &str, ops: &[&str]) {
    let Some((dir, names)) = generate(group, ops) else {
        return;
    };
    let expected_failures: BTreeMap<&str, &str> = EXPECTED_FAILURES.iter().copied().collect();
    let mut problems = Vec::new();
    for name in &names {
        let result = run_case(&dir.join(name));
        match (&result, expected_failures.get(name.as_str())) {
            (Ok(()), None) => eprintln!("pass {name}"),
            (Err(e), Some(reason)) => eprintln!("expected failure {name} ({reason}): {e}"),
            (Err(e), None) => problems.push(format!("{name} fails: {e}")),
            (Ok(()), Some(_)) => {
                problems.push(format!("{name} passes: remove it from EXPECTED_FAILURES"))
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn gather_and_scatter_cases_pass() {
    check_ops(
        "gather_scatter",
        &[
            "GatherND",
            "ScatterND",
            "ScatterElements",
            "GatherElements",
            "Scatter",
        ],
    );
}

#[test]
fn microsoft_fused_op_cases_match_onnxruntime() {
    check_ops(
        "microsoft",
        &[
            "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization",
            "BiasGelu",
            "FastGelu",
            "QuickGelu",
            "Gelu",
            "com.microsoft:Attention",
            "com.microsoft:RotaryEmbedding",
            "com.microsoft:MatMulNBits",
        ],
    );
}

#[test]
fn quantization_cases_pass() {
    check_ops(
        "quantization",
        &[
            "QuantizeLinear",
            "DequantizeLinear",
            "DynamicQuantizeLinear",
            "MatMulInteger",
            "ConvInteger",
            "QLinearMatMul",
            "QLinearConv",
            "quantize_dynamic",
        ],
    );
}

#[test]
fn hardmax_lp_bitwise_and_pooling_cases_pass() {
    check_ops(
        "axis_bitwise_pool",
        &[
            "Hardmax",
            "LpNormalization",
            "LpPool",
            "BitwiseAnd",
            "BitwiseOr",
            "BitwiseXor",
            "BitwiseNot",
            "BitShift",
            "MaxPool",
            "AveragePool",
        ],
    );
}

#[test]
fn grid_sample_cases_pass() {
    check_ops("grid_sample", &["GridSample"]);
}
