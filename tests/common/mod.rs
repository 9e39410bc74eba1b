//! Shared helpers for the phase tests: fixture paths and the onnx reference shapes.

#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What a skipped test needed and did not find. `.ci/run` installs everything but a GPU, so
/// on CI only [`Need::Gpu`] and [`Need::Platform`] may skip (`.ci/skips` fails the run on any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The pinned onnx/onnxruntime venv (`bash fixtures/pyenv.sh`).
    Venv,
    /// The real third-party models (`bash fixtures/real/fetch.sh`).
    RealModels,
    /// Graphviz's `dot` (`apt-get install graphviz`, `brew install graphviz`).
    Graphviz,
    /// NVRTC from the venv (`bash fixtures/pyenv.sh`; no macOS wheel exists).
    Nvrtc,
    /// A C compiler, `nm`, or a platform the check is written for.
    Toolchain,
    /// A CUDA driver and device, or their absence.
    Gpu,
    /// Another operating system: the check is written for one that CI does not run.
    Platform,
    /// torch's `torchrun` (`.venv-python`, which `.ci/run` makes from python/requirements-test.txt).
    Torch,
}

impl Need {
    /// The word written into the skip record, and read by `.ci/skips`.
    pub fn name(self) -> &'static str {
        match self {
            Need::Venv => "venv",
            Need::RealModels => "real-models",
            Need::Graphviz => "graphviz",
            Need::Nvrtc => "nvrtc",
            Need::Toolchain => "toolchain",
            Need::Gpu => "gpu",
            Need::Platform => "platform",
            Need::Torch => "torch",
        }
    }
}

/// The one way a test skips: says why on the real stderr (libtest captures `eprintln!` of a
/// passing test, so the reason would otherwise show only with `--nocapture`) and appends a
/// line `binary<TAB>test<TAB>need<TAB>reason` to `target/tmp/skips/<binary>.tsv`, which
/// `.ci/skips` summarises (and on CI refuses) at the end of `.ci/run`.
pub fn skip(need: Need, reason: impl std::fmt::Display) {
    record_skip(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("skips"),
        need,
        &reason.to_string(),
    );
}

/// [`skip`] into `dir` (a test of the record itself writes into a temporary one).
pub fn record_skip(dir: &Path, need: Need, reason: &str) {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => stem,
        })
        .unwrap_or_else(|| "unknown".into());
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("unknown");
    let reason = reason.replace(['\t', '\n'], " ");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {binary}::{test} (needs {}): {reason}",
        need.name()
    );
    let record = std::fs::create_dir_all(dir).and_then(|()| {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{binary}.tsv")))?;
        writeln!(file, "{binary}\t{test}\t{}\t{reason}", need.name())
    });
    if let Err(e) = record {
        let _ = writeln!(
            std::io::stderr(),
            "cannot record the skip in {}: {e}",
            dir.display()
        );
    }
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
            skip(
                Need::RealModels,
                format!(
                    "real model {name}: {} is absent (run fixtures/real/fetch.sh)",
                    path.display()
                ),
            );
        }
    }
    present
}

/// The path of the real model `name` in the fetched cache; `None` (with the skip recorded by
/// [`real_models`], which says why) when it is absent.
pub fn real_model(name: &str) -> Option<PathBuf> {
    real_models()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, path)| path)
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

/// `layers` pre-norm-free transformer blocks of `rows × width` fp16 tensors, 11 nodes each:
/// three parallel projections joined, an output projection, a residual add, a two-layer MLP
/// and a second residual add. Scopes `/layers.N/` as an exporter writes them.
pub fn transformer(layers: usize, width: u64, rows: u64) -> pipecut::graph::Graph {
    use pipecut::graph::{DType, Dim, Graph, NodeSpec, Param, Storage};
    use pipecut::onnx::shape::ShapeInference;
    let mut b = Graph::builder("stack");
    b.opset("", 17);
    let shape = vec![Dim::Known(rows), Dim::Known(width)];
    b.input("x", Some(DType::F16), Some(shape)).unwrap();
    let mut x = "x".to_string();
    for layer in 0..layers {
        let scope = format!("/layers.{layer}");
        let mut node = |op: &str, name: &str, inputs: &[&str]| -> String {
            let out = format!("{scope}/{name}_out");
            b.node(NodeSpec::new(
                &format!("{scope}/{name}"),
                op,
                inputs,
                &[&out],
            ))
            .unwrap();
            out
        };
        let mut weights = Vec::new();
        for w in ["q", "k", "v", "o", "up", "down"] {
            weights.push(format!("layers.{layer}.{w}.weight"));
        }
        let q = node("MatMul", "q", &[&x, &weights[0]]);
        let k = node("MatMul", "k", &[&x, &weights[1]]);
        let v = node("MatMul", "v", &[&x, &weights[2]]);
        let qk = node("Add", "qk", &[&q, &k]);
        let attn = node("Add", "attn", &[&qk, &v]);
        let o = node("MatMul", "o", &[&attn, &weights[3]]);
        let x1 = node("Add", "residual_1", &[&x, &o]);
        let up = node("MatMul", "up", &[&x1, &weights[4]]);
        let act = node("Relu", "act", &[&up]);
        let down = node("MatMul", "down", &[&act, &weights[5]]);
        x = node("Add", "residual_2", &[&x1, &down]);
        for w in &weights {
            let param = Param {
                bytes: width * width * 2,
                storage: Storage::Embedded,
            };
            b.parameter(w, DType::F16, &[width, width], param, None)
                .unwrap();
        }
    }
    b.output(&x);
    let mut graph = b.build().unwrap();
    ShapeInference::new(Default::default())
        .run(&mut graph)
        .unwrap();
    graph
}

/// A graph input or output of element type `elem_type` (ONNX's code: 1 is float32) and fixed
/// `dims`, for models the tests write themselves.
pub fn tensor_value_info(
    name: &str,
    elem_type: i32,
    dims: &[i64],
) -> onnx_protobuf::ValueInfoProto {
    use onnx_protobuf::{tensor_shape_proto, type_proto, TensorShapeProto, TypeProto};
    onnx_protobuf::ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

/// A node of `op` from `inputs` to `output`, with one ints attribute where `ints` names it
/// (Transpose's `perm`), for models the tests write themselves.
pub fn onnx_node(
    op: &str,
    inputs: &[&str],
    output: &str,
    ints: Option<(&str, &[i64])>,
) -> onnx_protobuf::NodeProto {
    use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto};
    let attribute = ints.map(|(name, values)| AttributeProto {
        name: name.into(),
        type_: AttributeType::INTS.into(),
        ints: values.to_vec(),
        ..Default::default()
    });
    onnx_protobuf::NodeProto {
        name: format!("{op}_{output}"),
        op_type: op.into(),
        input: inputs.iter().map(|i| i.to_string()).collect(),
        output: vec![output.into()],
        attribute: attribute.into_iter().collect(),
        ..Default::default()
    }
}

/// The bytes of a model (IR 9, the default domain at `opset`) of `nodes` from `inputs` to
/// `outputs`.
pub fn onnx_model_bytes(
    opset: i64,
    inputs: Vec<onnx_protobuf::ValueInfoProto>,
    outputs: Vec<onnx_protobuf::ValueInfoProto>,
    nodes: Vec<onnx_protobuf::NodeProto>,
) -> Vec<u8> {
    use onnx_protobuf::Message;
    let graph = onnx_protobuf::GraphProto {
        name: "test".into(),
        input: inputs,
        output: outputs,
        node: nodes,
        ..Default::default()
    };
    let model = onnx_protobuf::ModelProto {
        ir_version: 9,
        opset_import: vec![onnx_protobuf::OperatorSetIdProto {
            version: opset,
            ..Default::default()
        }],
        graph: Some(graph).into(),
        ..Default::default()
    };
    model.write_to_bytes().unwrap()
}

/// Runs the built `pipecut` binary in the repository root: (exit code, stdout, stderr).
pub fn pipecut_cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("pipecut runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `pipecut partition MODEL --devices DEVICES` with one stage per device, one micro-batch and
/// `--dim` for each of `dims`, into `plan`; asserts it succeeds and wrote the plan.
pub fn partition_on_devices(model: &str, devices: &str, dims: &[&str], plan: &Path) {
    let stages = devices.split(',').count().to_string();
    let mut args = vec![
        "partition",
        model,
        "--devices",
        devices,
        "--stages",
        &stages,
    ];
    args.extend(["--microbatches", "1"]);
    for d in dims {
        args.extend(["--dim", d]);
    }
    args.extend(["--out", plan.to_str().unwrap()]);
    let (code, _, err) = pipecut_cli(&args);
    assert_eq!(code, 0, "{model}: partition failed: {err}");
    assert!(plan.exists(), "{model}: no plan written");
}
