//! The CPU reference runtime against onnxruntime: every fixture whole and split into pipelines
//! of 1 to 4 stages (equal contiguous splits of the topological order, and the DP partitioner's
//! stages), with 1, 2 and 4 micro-batches. References: `fixtures/reference_outputs.py`.
//!
//! Tolerances: |actual − expected| ≤ atol + rtol·|expected|, with atol 1e-5 and rtol 1e-4 for the
//! fixtures. Both runtimes compute in fp32 but sum in different orders (blocked sgemm against
//! MLAS, f64 statistics against f32 ones), which leaves errors of a few ulp per op; the largest
//! fixture error measured is 4.8e-7 (bert_tiny's hidden state), so the bound leaves a 20× margin
//! while still catching any real mistake (a wrong axis, a missed mask or a bad broadcast moves
//! outputs by 1e-2 or more). Real models: see [`REAL_ATOL`].
//! Pipelined runs must equal the whole-model run exactly: stages run the same kernels on the
//! same rows, and splitting the batch changes no reduction order.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pipecut::cost::{Catalog, Cluster};
use pipecut::graph::{Graph, NodeId};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::onnx::Model;
use pipecut::partition::{Planner, StageCount};
use pipecut::runtime::{
    read_npy, run_pipeline, stage_specs, CpuExecutor, Executor, HostTensor, Tensors, Weights,
};
use serde_json::Value;

const ATOL: f32 = 1e-5;
/// Real exporters' graphs are deeper (PP-OCRv4 rec: 38 convolutions, 13 matmuls, then a
/// softmax over 6625 classes, max error 3.3e-5 on this machine); atol 1e-4 keeps a 3× margin.
const REAL_ATOL: f32 = 1e-4;
const RTOL: f32 = 1e-4;

struct Case {
    model: Model,
    weights: Weights,
    inputs: Tensors,
    expected: BTreeMap<String, HostTensor>,
}

fn load_case(reference_dir: &Path) -> Case {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(reference_dir.join("manifest.json")).expect("manifest"),
    )
    .expect("manifest is JSON");
    let model_path = common::root().join(manifest["model"].as_str().expect("model"));
    let mut model = pipecut::onnx::load_model(&model_path).expect("model loads");
    assert_eq!(
        model.sha256,
        manifest["model_sha256"].as_str().unwrap(),
        "{} changed since its reference was written; rerun fixtures/reference_outputs.py",
        model_path.display()
    );
    let mut bindings = DimBindings::new();
    for (name, value) in manifest["dims"].as_object().unwrap() {
        bindings = bindings.bind(name, value.as_u64().unwrap());
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .expect("shapes");
    let weights = Weights::load(&model_path, &model.graph).expect("weights load");
    let read = |section: &str| -> BTreeMap<String, HostTensor> {
        manifest[section]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, file)| {
                let path = reference_dir.join(file.as_str().unwrap());
                (name.clone(), read_npy(&path).expect("reference npy").tensor)
            })
            .collect()
    };
    let inputs = read("inputs")
        .into_iter()
        .map(|(k, v)| (k, Arc::new(v)))
        .collect();
    Case {
        model,
        weights,
        inputs,
        expected: read("outputs"),
    }
}

fn fixture_case(name: &str) -> Case {
    load_case(&common::root().join("fixtures/reference/outputs").join(name))
}

/// Asserts every output within `atol + rtol·|expected|`, printing the largest absolute error.
fn assert_matches(
    what: &str,
    actual: &Tensors,
    expected: &BTreeMap<String, HostTensor>,
    atol: f32,
    rtol: f32,
) {
    assert_eq!(
        actual.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{what}: output names"
    );
    for (name, want) in expected {
        let got = &actual[name];
        assert_eq!(got.shape(), want.shape(), "{what}: shape of '{name}'");
        assert_eq!(got.dtype(), want.dtype(), "{what}: dtype of '{name}'");
        let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
        let max_abs = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{what}: '{name}' max |error| {max_abs:.2e}");
        let mut worst = (0.0f32, 0usize);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let excess = (a - b).abs() - (atol + rtol * b.abs());
            if excess > worst.0 || excess.is_nan() {
                worst = (
                    if excess.is_nan() {
                        f32::INFINITY
                    } else {
                        excess
                    },
                    i,
                );
            }
        }
        assert!(
            worst.0 <= 0.0,
            "{what}: '{name}' element {} is {} but onnxruntime gives {} (atol {atol}, rtol {rtol})",
            worst.1,
            g[worst.1],
            w[worst.1]
        );
    }
}

fn equal_split(graph: &Graph, k: usize) -> Vec<Vec<NodeId>> {
    let order = graph.topological_order();
    let starts = pipecut::partition::baselines::partition_uniform(order.len(), k);
    (0..k)
        .map(|s| {
            let end = starts.get(s + 1).copied().unwrap_or(order.len());
            order[starts[s]..end].to_vec()
        })
        .collect()
}

fn run_stages(case: &Case, stages: &[Vec<NodeId>], microbatches: usize) -> Tensors {
    let graph = &case.model.graph;
    let executor = CpuExecutor::new(graph, &case.weights);
    let specs = stage_specs(graph, stages).expect("stage specs");
    let mut prepared: Vec<_> = specs
        .iter()
        .map(|s| executor.prepare(s).expect("prepare"))
        .collect();
    let report =
        run_pipeline(&executor, &mut prepared, &case.inputs, microbatches).expect("pipeline runs");
    assert_eq!(report.stages.len(), stages.len());
    let efficiency = report.efficiency();
    assert!(
        efficiency > 0.0 && efficiency <= 1.0 + 1e-9,
        "efficiency {efficiency}"
    );
    report.outputs
}

#[test]
fn every_fixture_matches_onnxruntime_whole() {
    for name in common::FIXTURES {
        let case = fixture_case(name);
        let executor = CpuExecutor::new(&case.model.graph, &case.weights);
        let out = executor
            .run_model(&case.inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_matches(name, &out, &case.expected, ATOL, RTOL);
    }
}

#[test]
fn pipelines_of_one_to_four_equal_stages_reproduce_the_whole_model() {
    for name in common::FIXTURES {
        let case = fixture_case(name);
        let executor = CpuExecutor::new(&case.model.graph, &case.weights);
        let whole = executor.run_model(&case.inputs).unwrap();
        for k in 1..=4 {
            for microbatches in [1, 2, 4] {
                let out = run_stages(&case, &equal_split(&case.model.graph, k), microbatches);
                let what = format!("{name} K={k} M={microbatches}");
                assert_matches(&what, &out, &case.expected, ATOL, RTOL);
                for (tensor, value) in &whole {
                    assert_eq!(
                        out[tensor], *value,
                        "{what}: '{tensor}' differs from the whole-model run"
                    );
                }
            }
        }
    }
}

#[test]
fn the_partitioners_stages_reproduce_onnxruntime() {
    let catalog = Catalog::builtin();
    let cluster = Cluster::from_device_list("L4,L4,L4,L4", &catalog).unwrap();
    for name in ["gpt2_tiny", "bert_tiny", "llama_tiny", "resnet_tiny"] {
        let case = fixture_case(name);
        let graph = &case.model.graph;
        let solution = Planner::new(graph, &cluster)
            .with_stages(StageCount::Fixed(4))
            .solve()
            .expect("partition");
        let mut stages = vec![Vec::new(); solution.problem.stage_count()];
        for (&node, stage) in solution.problem.order().iter().zip(&solution.stage_of) {
            stages[stage.index()].push(node);
        }
        let out = run_stages(&case, &stages, 2);
        assert_matches(&format!("{name} DP"), &out, &case.expected, ATOL, RTOL);
    }
}

#[test]
fn real_models_match_onnxruntime() {
    let dir = common::root().join("fixtures/reference/outputs/real");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("real references")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    for name in names {
        let model = common::root()
            .join("fixtures/real/cache")
            .join(format!("{name}.onnx"));
        if !model.exists() {
            common::skip(
                common::Need::RealModels,
                format!(
                    "real model {name}: {} is absent (run fixtures/real/fetch.sh)",
                    model.display()
                ),
            );
            continue;
        }
        let case = load_case(&dir.join(&name));
        let executor = CpuExecutor::new(&case.model.graph, &case.weights);
        let out = executor
            .run_model(&case.inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_matches(&name, &out, &case.expected, REAL_ATOL, RTOL);
        let split = run_stages(&case, &equal_split(&case.model.graph, 3), 1);
        assert_matches(
            &format!("{name} K=3"),
            &split,
            &case.expected,
            REAL_ATOL,
            RTOL,
        );
    }
}

#[test]
fn bad_inputs_are_refused_with_clear_errors() {
    let case = fixture_case("gpt2_tiny");
    let graph = &case.model.graph;
    let executor = CpuExecutor::new(graph, &case.weights);

    let err = pipecut::runtime::check_inputs(graph, &Tensors::new(), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("input 'input_ids'") && err.contains("missing"),
        "{err}"
    );

    let mut wrong_shape = case.inputs.clone();
    wrong_shape.insert(
        "input_ids".into(),
        Arc::new(
            HostTensor::new(vec![4, 8], pipecut::runtime::TensorData::I64(vec![0; 32])).unwrap(),
        ),
    );
    let err = pipecut::runtime::check_inputs(graph, &wrong_shape, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must have shape [4, 16]"), "{err}");

    let mut wrong_type = case.inputs.clone();
    wrong_type.insert(
        "input_ids".into(),
        Arc::new(
            case.inputs["input_ids"]
                .cast(pipecut::graph::DType::F32)
                .unwrap(),
        ),
    );
    let err = pipecut::runtime::check_inputs(graph, &wrong_type, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be int64, got float32"), "{err}");

    // A stage run without a tensor it receives names the tensor.
    let err = executor.run_model(&Tensors::new()).unwrap_err().to_string();
    assert!(err.contains("needs tensor 'input_ids'"), "{err}");

    // Out-of-range token ids fail in the kernel with the node named, not a panic.
    let mut bad_ids = case.inputs.clone();
    bad_ids.insert(
        "input_ids".into(),
        Arc::new(
            HostTensor::new(
                vec![4, 16],
                pipecut::runtime::TensorData::I64(vec![1 << 40; 64]),
            )
            .unwrap(),
        ),
    );
    let err = executor.run_model(&bad_ids).unwrap_err().to_string();
    assert!(
        err.contains("running node") && err.contains("out of range"),
        "{err}"
    );

    // More micro-batches than rows.
    let err = run_pipeline(&executor, &mut [], &case.inputs, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fewer than the 8 micro-batches"), "{err}");
}

// ---- `pipecut run` through the binary ----

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("pipecut runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn partition(dir: &Path, model: &str, dims: &[&str]) -> PathBuf {
    let plan = dir.join("plan.json");
    let mut args = vec![
        "partition",
        model,
        "--devices",
        "L4,L4",
        "--stages",
        "2",
        "--microbatches",
        "4",
    ];
    for d in dims {
        args.extend(["--dim", d]);
    }
    args.extend(["--out", plan.to_str().unwrap()]);
    let (code, _, err) = pipecut(&args);
    assert_eq!(code, 0, "{err}");
    plan
}

#[test]
fn run_with_reference_inputs_writes_onnxruntimes_outputs() {
    let dir = tempfile::tempdir().unwrap();
    // The reference binds batch 4 = 4 micro-batches of 1.
    let plan = partition(
        dir.path(),
        "fixtures/models/bert_tiny.onnx",
        &["batch=1", "seq=16"],
    );
    let reference = common::root().join("fixtures/reference/outputs/bert_tiny");
    let out_dir = dir.path().join("out");
    let inputs: Vec<String> = ["input_ids", "attention_mask", "token_type_ids"]
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{n}={}", reference.join(format!("input_{i}.npy")).display()))
        .collect();
    let mut args = vec![
        "run",
        plan.to_str().unwrap(),
        "fixtures/models/bert_tiny.onnx",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--json",
    ];
    for i in &inputs {
        args.extend(["--input", i.as_str()]);
    }
    let (code, out, err) = pipecut(&args);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["microbatches"], 4);
    assert_eq!(report["stages"].as_array().unwrap().len(), 2);
    let measured = report["measured_efficiency"].as_f64().unwrap();
    let predicted = report["predicted_efficiency"].as_f64().unwrap();
    assert!(measured > 0.0 && measured <= 1.0, "{measured}");
    assert!(predicted > 0.0 && predicted <= 1.0, "{predicted}");
    for (i, name) in ["last_hidden_state", "pooler_output"].iter().enumerate() {
        let got = read_npy(&out_dir.join(format!("{name}.npy")))
            .unwrap()
            .tensor;
        let want = read_npy(&reference.join(format!("output_{i}.npy")))
            .unwrap()
            .tensor;
        let mut actual = Tensors::new();
        actual.insert(name.to_string(), Arc::new(got));
        let mut expected = BTreeMap::new();
        expected.insert(name.to_string(), want);
        assert_matches(name, &actual, &expected, ATOL, RTOL);
    }
}

#[test]
fn run_refuses_bad_plans_and_inputs_without_writing_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let plan = partition(
        dir.path(),
        "fixtures/models/gpt2_tiny.onnx",
        &["batch=1", "seq=16"],
    );
    let plan = plan.to_str().unwrap();
    let out_dir = dir.path().join("out");
    let out = out_dir.to_str().unwrap();
    let npy = |name: &str, tensor: &HostTensor| {
        let path = dir.path().join(name);
        std::fs::write(&path, pipecut::runtime::encode_npy(tensor)).unwrap();
        path.display().to_string()
    };
    let ids = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, pipecut::runtime::TensorData::I64(vec![1; n])).unwrap()
    };
    let good = npy("good.npy", &ids(vec![4, 16]));
    let wrong_shape = npy("shape.npy", &ids(vec![4, 8]));
    let wrong_type = npy(
        "type.npy",
        &ids(vec![4, 16]).cast(pipecut::graph::DType::F32).unwrap(),
    );
    let corrupt = dir.path().join("corrupt.npy");
    let mut bytes = pipecut::runtime::encode_npy(&ids(vec![4, 16]));
    bytes.truncate(bytes.len() - 10);
    std::fs::write(&corrupt, bytes).unwrap();
    let corrupt = corrupt.display().to_string();

    // (arguments, message, exit code): a plan for another model is an invalid plan (1), the
    // rest bad input (2).
    let cases: Vec<(Vec<String>, &str, i32)> = vec![
        (
            vec!["fixtures/models/bert_tiny.onnx".into()],
            "it was made for another graph",
            1,
        ),
        (
            vec![
                "fixtures/models/gpt2_tiny.onnx".into(),
                "--input".into(),
                format!("input_ids={wrong_shape}"),
            ],
            "must have shape [4, 16]",
            2,
        ),
        (
            vec![
                "fixtures/models/gpt2_tiny.onnx".into(),
                "--input".into(),
                format!("input_ids={wrong_type}"),
            ],
            "must be int64",
            2,
        ),
        (
            vec![
                "fixtures/models/gpt2_tiny.onnx".into(),
                "--input".into(),
                format!("input_ids={corrupt}"),
            ],
            "truncated",
            2,
        ),
        (
            vec![
                "fixtures/models/gpt2_tiny.onnx".into(),
                "--input".into(),
                format!("tokens={good}"),
            ],
            "no input 'tokens'",
            2,
        ),
        (
            vec![
                "fixtures/models/gpt2_tiny.onnx".into(),
                "--microbatches".into(),
                "0".into(),
            ],
            "at least 1",
            2,
        ),
    ];
    for (extra, expected, exit) in cases {
        let mut args = vec!["run", plan];
        args.extend(extra.iter().map(String::as_str));
        args.extend(["--output-dir", out]);
        let (code, _, err) = pipecut(&args);
        assert_eq!(code, exit, "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: '{err}' should mention '{expected}'"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out_dir.exists(), "{args:?} left output files");
    }
    // The good input runs (4 micro-batches of the plan's batch 1).
    let (code, text, err) = pipecut(&[
        "run",
        plan,
        "fixtures/models/gpt2_tiny.onnx",
        "--input",
        &format!("input_ids={good}"),
        "--output-dir",
        out,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("pipeline efficiency: measured"), "{text}");
    let logits = read_npy(&out_dir.join("logits.npy")).unwrap();
    assert_eq!(logits.tensor.shape(), &[4, 16, 512]);
    let leftovers: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        1,
        "only logits.npy, no temporary files: {leftovers:?}"
    );
}

#[test]
fn weights_in_external_data_files_are_read_and_checked() {
    use onnx_protobuf::tensor_proto::DataLocation;
    use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
    use onnx_protobuf::type_proto::{self, Tensor as TensorType};
    use onnx_protobuf::{
        GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
        TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let value_info = |name: &str| ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(TensorType {
                elem_type: 1,
                shape: Some(TensorShapeProto {
                    dim: vec![Dimension {
                        value: Some(dimension::Value::DimValue(2)),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    };
    let entry = |k: &str, v: &str| StringStringEntryProto {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    };
    // y = (x + w) * s, with w in w.bin at offset 4 and s stored inline as fp16.
    let w = TensorProto {
        name: "w".into(),
        data_type: 1,
        dims: vec![2],
        data_location: DataLocation::EXTERNAL.into(),
        external_data: vec![
            entry("location", "w.bin"),
            entry("offset", "4"),
            entry("length", "8"),
        ],
        ..Default::default()
    };
    let s = TensorProto {
        name: "s".into(),
        data_type: 10,
        dims: vec![2],
        raw_data: [half::f16::from_f32(2.0), half::f16::from_f32(-0.5)]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect(),
        ..Default::default()
    };
    let node = |name: &str, op: &str, inputs: [&str; 2], output: &str| NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let graph = GraphProto {
        name: "g".into(),
        node: vec![
            node("add", "Add", ["x", "w"], "t"),
            node("mul", "Mul", ["t", "s_f32"], "y"),
            {
                let mut cast = node("cast", "Cast", ["s", ""], "s_f32");
                cast.input.truncate(1);
                cast.attribute = vec![onnx_protobuf::AttributeProto {
                    name: "to".into(),
                    type_: onnx_protobuf::attribute_proto::AttributeType::INT.into(),
                    i: 1,
                    ..Default::default()
                }];
                cast
            },
        ],
        initializer: vec![w, s],
        input: vec![value_info("x")],
        output: vec![value_info("y")],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
            ..Default::default()
        }],
        graph: Some(graph).into(),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.onnx");
    std::fs::write(&model_path, bytes).unwrap();
    let w_bytes: Vec<u8> = [0.0f32, 1.0, 10.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("w.bin"), &w_bytes).unwrap();

    let mut model = pipecut::onnx::load_model(&model_path).unwrap();
    ShapeInference::new(DimBindings::new())
        .run(&mut model.graph)
        .unwrap();
    let weights = Weights::load(&model_path, &model.graph).unwrap();
    let mut inputs = Tensors::new();
    inputs.insert(
        "x".into(),
        Arc::new(
            HostTensor::new(vec![2], pipecut::runtime::TensorData::F32(vec![1.0, 2.0])).unwrap(),
        ),
    );
    let out = CpuExecutor::new(&model.graph, &weights)
        .run_model(&inputs)
        .unwrap();
    assert_eq!(out["y"].as_f32().unwrap(), &[4.0, -6.0]);

    // The file shrank after the model was loaded: the weight loader refuses the reference.
    std::fs::write(dir.path().join("w.bin"), &w_bytes[..8]).unwrap();
    let err = Weights::load(&model_path, &model.graph)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("initializer 'w'") && err.contains("needs bytes 4..12"),
        "{err}"
    );
}

/// A text model: `code = LabelEncoder(x + "!")`, `y = Cast(RegexFullMatch(x + "!"))`, with the
/// string input `x [batch]` and a string initializer, as ONNX bytes.
fn text_model() -> Vec<u8> {
    use onnx_protobuf::attribute_proto::AttributeType;
    use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
    use onnx_protobuf::type_proto::{self, Tensor as TensorType};
    use onnx_protobuf::{
        AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
        TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let value_info = |name: &str, elem_type: i32| ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(TensorType {
                elem_type,
                shape: Some(TensorShapeProto {
                    dim: vec![Dimension {
                        value: Some(dimension::Value::DimParam("batch".into())),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    };
    let attribute = |name: &str, kind: AttributeType| AttributeProto {
        name: name.into(),
        type_: kind.into(),
        ..Default::default()
    };
    let node = |op: &str, domain: &str, inputs: &[&str], output: &str| NodeProto {
        name: format!("{op}_0"),
        op_type: op.into(),
        domain: domain.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let mut encoder = node("LabelEncoder", "ai.onnx.ml", &["c"], "code");
    encoder.attribute = vec![
        AttributeProto {
            strings: vec![b"cat!".to_vec(), b"ok!".to_vec()],
            ..attribute("keys_strings", AttributeType::STRINGS)
        },
        AttributeProto {
            ints: vec![1, 2],
            ..attribute("values_int64s", AttributeType::INTS)
        },
        AttributeProto {
            i: 0,
            ..attribute("default_int64", AttributeType::INT)
        },
    ];
    let mut regex = node("RegexFullMatch", "", &["c"], "m");
    regex.attribute = vec![AttributeProto {
        s: b"[a-z]+!".to_vec(),
        ..attribute("pattern", AttributeType::STRING)
    }];
    let mut cast = node("Cast", "", &["m"], "y");
    cast.attribute = vec![AttributeProto {
        i: 1,
        ..attribute("to", AttributeType::INT)
    }];
    let suffix = TensorProto {
        name: "suffix".into(),
        data_type: 8,
        string_data: vec![b"!".to_vec()],
        ..Default::default()
    };
    let graph = GraphProto {
        name: "text".into(),
        node: vec![
            node("StringConcat", "", &["x", "suffix"], "c"),
            encoder,
            regex,
            cast,
        ],
        initializer: vec![suffix],
        input: vec![value_info("x", 8)],
        output: vec![value_info("y", 1), value_info("code", 7)],
        ..Default::default()
    };
    let opset = |domain: &str, version| OperatorSetIdProto {
        domain: domain.into(),
        version,
        ..Default::default()
    };
    ModelProto {
        ir_version: 9,
        opset_import: vec![opset("", 20), opset("ai.onnx.ml", 4)],
        graph: Some(graph).into(),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap()
}

#[test]
fn string_tensors_cross_stages_micro_batches_and_export() {
    let bytes = text_model();
    let mut model = pipecut::onnx::load_model_from_bytes(&bytes, None).unwrap();
    let mut bindings = DimBindings::new();
    bindings.parse_arg("batch=2").unwrap();
    ShapeInference::new(bindings).run(&mut model.graph).unwrap();
    let weights = Weights::from_model_bytes(&bytes, &model.graph).unwrap();
    let text = pipecut::runtime::TensorData::String(
        ["the", "cat", "dog1", "ok"].map(String::from).to_vec(),
    );
    let mut inputs = Tensors::new();
    inputs.insert(
        "x".into(),
        Arc::new(HostTensor::new(vec![4], text).unwrap()),
    );
    let case = Case {
        model,
        weights,
        inputs,
        expected: BTreeMap::new(),
    };
    // The string `c` is the boundary of both cuts; two micro-batches of two strings each.
    let stages = equal_split(&case.model.graph, 2);
    let outputs = run_stages(&case, &stages, 2);
    // onnxruntime 1.23.2 (the pinned one) on the same model and input gives these.
    assert_eq!(outputs["y"].as_f32().unwrap(), &[1.0, 1.0, 0.0, 1.0]);
    assert_eq!(outputs["code"].to_i64_vec(), vec![0, 1, 0, 2]);

    // Exported stages declare the string boundary as an ONNX string tensor.
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("text.onnx");
    std::fs::write(&model_path, &bytes).unwrap();
    pipecut::onnx::export::export_stages(&model_path, &case.model.graph, &stages, dir.path())
        .unwrap();
    let second = pipecut::onnx::load_model(dir.path().join("stage_1.onnx")).unwrap();
    let boundary = second.graph.inputs()[0];
    assert_eq!(
        second.graph.tensor(boundary).dtype,
        Some(pipecut::graph::DType::String)
    );
}

/// The venv's Python with onnx, numpy and onnxruntime, or `None` (said as a skip).
fn venv_python(what: &str) -> Option<PathBuf> {
    let python = common::root().join(".venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    common::skip(
        common::Need::Venv,
        format!(
            "{what}: {} is absent (bash fixtures/pyenv.sh)",
            python.display()
        ),
    );
    None
}

/// Runs a Python `script` in `dir` with the venv; it writes the model and its reference files.
fn python_in(python: &Path, dir: &Path, script: &str) {
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
/// Plans `model` (in `dir`, beside its input `x.npy` and onnxruntime's output `want.npy`) in 2
/// stages on two L4s and runs it through the CLI; its output `name` must match onnxruntime's.
/// Returns that output's shape.
fn two_stage_run_matches_onnxruntime(dir: &Path, model: &str, name: &str) -> Vec<usize> {
    let plan = dir.join("plan.json");
    let plan = plan.to_str().unwrap();
    let (code, _, err) = pipecut(&[
        "partition",
        model,
        "--cluster",
        "1x2xL4",
        "--stages",
        "2",
        "--microbatches",
        "1",
        "--out",
        plan,
    ]);
    assert_eq!(code, 0, "{err}");
    let out_dir = dir.join("out");
    let input = format!("x={}", dir.join("x.npy").display());
    let (code, _, err) = pipecut(&[
        "run",
        plan,
        model,
        "--input",
        &input,
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let got = read_npy(&out_dir.join(format!("{name}.npy")))
        .unwrap()
        .tensor;
    let shape = got.shape().to_vec();
    let want = read_npy(&dir.join("want.npy")).unwrap().tensor;
    let actual = Tensors::from([(name.to_string(), Arc::new(got))]);
    let expected = BTreeMap::from([(name.to_string(), want)]);
    assert_matches(name, &actual, &expected, ATOL, RTOL);
    shape
}

/// Issue 36: DeepLabV3's atrous branches dilate a 3×3 Conv by up to 36 over an 8×8 map, so
/// that most taps read only padding. onnxruntime runs it; `pipecut run` panicked in the kernel.
#[test]
fn a_conv_dilated_past_its_input_runs_as_onnxruntime_does() {
    let Some(python) = venv_python("the dilated Conv against onnxruntime") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    python_in(
        &python,
        dir.path(),
        "import numpy as np, onnx, onnxruntime as ort\n\
         from onnx import helper as h, TensorProto as T, numpy_helper as nh\n\
         rng = np.random.default_rng(0)\n\
         w = nh.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32), 'w')\n\
         nodes = [h.make_node('Conv', ['x', 'w'], ['c'], name='atrous', kernel_shape=[3, 3],\n\
                              dilations=[36, 36], pads=[36, 36, 36, 36]),\n\
                  h.make_node('Relu', ['c'], ['y'], name='relu')]\n\
         g = h.make_graph(nodes, 'aspp', [h.make_tensor_value_info('x', T.FLOAT, [2, 8, 8, 8])],\n\
                          [h.make_tensor_value_info('y', T.FLOAT, None)], initializer=[w])\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)]); m.ir_version = 8\n\
         onnx.save(m, 'atrous.onnx')\n\
         x = rng.standard_normal((2, 8, 8, 8)).astype(np.float32); np.save('x.npy', x)\n\
         s = ort.InferenceSession('atrous.onnx', providers=['CPUExecutionProvider'])\n\
         np.save('want.npy', s.run(None, {'x': x})[0])\n",
    );
    let model = dir.path().join("atrous.onnx");
    let model = model.to_str().unwrap();
    two_stage_run_matches_onnxruntime(dir.path(), model, "y");
}

/// Issue 36: every ONNX tensor dtype goes in and out of `pipecut run` as `.npy` files as numpy
/// and ml_dtypes save them (uint64, float16/64, bfloat16, the four float8 formats, int4/uint4,
/// int16, uint32, strings), over a stage boundary, and every output keeps its declared dtype
/// (uint8 and int8 were written as int64) with onnxruntime's values: `fixtures/dtype_cases.py`.
/// A pickled object array is refused in one line.
#[test]
fn every_onnx_dtype_goes_in_and_out_of_run_as_npy() {
    let Some(python) = venv_python("the .npy dtypes against onnxruntime") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = common::root().join("fixtures/dtype_cases.py");
    let script = script.to_str().unwrap();
    let cases_dir = dir.path().to_str().unwrap();
    python_in(
        &python,
        dir.path(),
        &format!("import runpy, sys; sys.argv = ['x', 'gen', {cases_dir:?}]; runpy.run_path({script:?}, run_name='__main__')"),
    );
    let cases: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cases.json")).unwrap())
            .unwrap();
    assert!(cases.len() >= 13, "{cases:?}");
    for case in &cases {
        let model = dir.path().join(format!("{case}.onnx"));
        let model = model.to_str().unwrap();
        let plan = dir.path().join(format!("{case}.json"));
        let stages = if case == "string" { "1" } else { "2" };
        let (code, _, err) = pipecut(&[
            "partition",
            model,
            "--cluster",
            "1x2xL4",
            "--stages",
            stages,
            "--microbatches",
            "1",
            "--out",
            plan.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{case}: {err}");
        let input = format!("x={}", dir.path().join(format!("{case}_x.npy")).display());
        let out_dir = dir.path().join(format!("out_{case}"));
        let (code, _, err) = pipecut(&[
            "run",
            plan.to_str().unwrap(),
            model,
            "--input",
            &input,
            "--output-dir",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{case}: {err}");
    }
    let out = std::process::Command::new(&python)
        .args([script, "check", cases_dir])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("\"failures\": []"), "{report}");

    let pickled = format!("x={}", dir.path().join("string_pickle.npy").display());
    let (code, _, err) = pipecut(&[
        "run",
        dir.path().join("string.json").to_str().unwrap(),
        dir.path().join("string.onnx").to_str().unwrap(),
        "--input",
        &pickled,
        "--output-dir",
        dir.path().join("out_pickle").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pickles are not read") && err.contains("np.array(values, dtype=str)"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Issue 36: STFT of a real `[batch, length]` signal (onnx-asr's feature extractors), which
/// onnxruntime and `onnx.checker` accept where the spec asks for `[batch, length, 1]`: typed,
/// planned over two stages and run as onnxruntime runs it.
#[test]
fn an_stft_of_a_two_dimensional_signal_runs_as_onnxruntime_does() {
    let Some(python) = venv_python("the 2-D STFT against onnxruntime") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    python_in(
        &python,
        dir.path(),
        "import numpy as np, onnx, onnxruntime as ort\n\
         from onnx import helper as h, TensorProto as T\n\
         nodes = [h.make_node('HannWindow', ['size'], ['window'], name='hann'),\n\
                  h.make_node('STFT', ['x', 'step', 'window'], ['spec'], name='stft'),\n\
                  h.make_node('ReduceSumSquare', ['spec', 'axes'], ['y'], keepdims=0, name='power')]\n\
         inits = [h.make_tensor('size', T.INT64, [], [16]), h.make_tensor('step', T.INT64, [], [4]),\n\
                  h.make_tensor('axes', T.INT64, [1], [-1])]\n\
         g = h.make_graph(nodes, 'features', [h.make_tensor_value_info('x', T.FLOAT, [2, 64])],\n\
                          [h.make_tensor_value_info('y', T.FLOAT, ['b', 'f', 'k'])], initializer=inits)\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 18)]); m.ir_version = 8\n\
         onnx.checker.check_model(m); onnx.save(m, 'stft.onnx')\n\
         x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)\n\
         np.save('x.npy', x)\n\
         s = ort.InferenceSession('stft.onnx', providers=['CPUExecutionProvider'])\n\
         np.save('want.npy', s.run(None, {'x': x})[0])\n",
    );
    let model = dir.path().join("stft.onnx");
    let model = model.to_str().unwrap();
    let shape = two_stage_run_matches_onnxruntime(dir.path(), model, "y");
    assert_eq!(shape, [2, 13, 9], "{shape:?}");
}

/// Issue 36: shape inputs computed from constants alone are folded, as TorchScript's detection
/// exports compute Resize sizes and Pad pads (Constant → ReduceMin → Mul → Floor → Cast →
/// Concat); the model is typed, planned and run as onnxruntime runs it.
#[test]
fn shape_inputs_computed_from_constants_are_folded() {
    let Some(python) = venv_python("the folded shape subgraph against onnxruntime") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    python_in(
        &python,
        dir.path(),
        "import numpy as np, onnx, onnxruntime as ort\n\
         from onnx import helper as h, TensorProto as T\n\
         scales = h.make_tensor('scales', T.FLOAT, [2, 2], [1.5, 2.5, 3.5, 0.75])\n\
         nodes = [h.make_node('Constant', [], ['c'], value=scales, name='c'),\n\
                  h.make_node('ReduceMin', ['c'], ['m'], axes=[1], keepdims=0, name='rmin'),\n\
                  h.make_node('ReduceMax', ['m'], ['top'], keepdims=1, name='rmax'),\n\
                  h.make_node('Mul', ['top', 'k'], ['mk'], name='mul'),\n\
                  h.make_node('Floor', ['mk'], ['f'], name='floor'),\n\
                  h.make_node('Cast', ['f'], ['side'], to=T.INT64, name='cast'),\n\
                  h.make_node('Concat', ['nc', 'side', 'side'], ['sizes'], axis=0, name='cat'),\n\
                  h.make_node('Resize', ['x', '', '', 'sizes'], ['y'], mode='nearest', name='resize'),\n\
                  h.make_node('Concat', ['zeros', 'side', 'side'], ['pads'], axis=0, name='cat2'),\n\
                  h.make_node('Pad', ['y', 'pads'], ['z'], name='pad')]\n\
         inits = [h.make_tensor('k', T.FLOAT, [], [4.0]), h.make_tensor('nc', T.INT64, [2], [1, 3]),\n\
                  h.make_tensor('zeros', T.INT64, [6], [0] * 6)]\n\
         g = h.make_graph(nodes, 'fold', [h.make_tensor_value_info('x', T.FLOAT, [1, 3, 4, 4])],\n\
                          [h.make_tensor_value_info('z', T.FLOAT, None)], initializer=inits)\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 13)]); m.ir_version = 7\n\
         onnx.save(m, 'fold.onnx')\n\
         x = np.random.default_rng(2).standard_normal((1, 3, 4, 4)).astype(np.float32)\n\
         np.save('x.npy', x)\n\
         s = ort.InferenceSession('fold.onnx', providers=['CPUExecutionProvider'])\n\
         np.save('want.npy', s.run(None, {'x': x})[0])\n",
    );
    let model = dir.path().join("fold.onnx");
    let model = model.to_str().unwrap();
    let (code, out, err) = pipecut(&["inspect", model, "--json"]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let z = &report["outputs"][0];
    // min over rows: [1.5, 0.75], max 1.5, × 4 = 6: sizes [1, 3, 6, 6], then 6 more on each side.
    assert_eq!(z["shape"], serde_json::json!([1, 3, 12, 12]), "{out}");
    two_stage_run_matches_onnxruntime(dir.path(), model, "z");
}

/// Issue 36: a model that takes and gives sequences runs through `pipecut run` whole, a
/// sequence input as a directory of `0.npy`, `1.npy`, … and a sequence output written the same
/// way, equal to onnxruntime's; a file where a sequence belongs, and a plan run in several
/// micro-batches, are refused in one line without writing outputs.
#[test]
fn sequences_go_in_and_out_of_run_as_directories_of_npy_files() {
    let Some(python) = venv_python("sequence inputs and outputs against onnxruntime") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    python_in(
        &python,
        dir.path(),
        "import os, numpy as np, onnx, onnxruntime as ort\n\
         from onnx import helper as h, TensorProto as T\n\
         seq = h.make_tensor_sequence_value_info\n\
         nodes = [h.make_node('SequenceInsert', ['s', 'x'], ['t']),\n\
                  h.make_node('ConcatFromSequence', ['t'], ['y'], axis=0)]\n\
         g = h.make_graph(nodes, 'seq', [seq('s', T.FLOAT, [2, 3]),\n\
                          h.make_tensor_value_info('x', T.FLOAT, [2, 3])],\n\
                          [seq('t', T.FLOAT, None), h.make_tensor_value_info('y', T.FLOAT, None)])\n\
         m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)]); m.ir_version = 8\n\
         onnx.save(m, 'seq.onnx')\n\
         rng = np.random.default_rng(0)\n\
         s = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]\n\
         x = rng.standard_normal((2, 3)).astype(np.float32)\n\
         os.mkdir('s'); [np.save(f's/{i}.npy', e) for i, e in enumerate(s)]; np.save('x.npy', x)\n\
         t, y = ort.InferenceSession('seq.onnx', providers=['CPUExecutionProvider']).run(None, {'s': s, 'x': x})\n\
         [np.save(f'want_t{i}.npy', e) for i, e in enumerate(t)]; np.save('want_y.npy', y)\n",
    );
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (model, plan) = (path("seq.onnx"), path("plan.json"));
    let (code, _, err) = pipecut(&[
        "partition",
        &model,
        "--cluster",
        "1x1xL4",
        "--stages",
        "1",
        "--microbatches",
        "1",
        // The sequence's length is not known at plan time: the concatenation's rows are bound.
        "--dim",
        "y.0=6",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    let (s, x, out) = (
        format!("s={}", path("s")),
        format!("x={}", path("x.npy")),
        path("out"),
    );
    let (code, _, err) = pipecut(&[
        "run",
        &plan,
        &model,
        "--input",
        &s,
        "--input",
        &x,
        "--output-dir",
        &out,
    ]);
    assert_eq!(code, 0, "{err}");
    let read = |file: PathBuf| read_npy(&file).unwrap().tensor;
    let out = dir.path().join("out");
    for i in 0..3 {
        let want = read(dir.path().join(format!("want_t{i}.npy")));
        assert_eq!(read(out.join("t").join(format!("{i}.npy"))), want, "t[{i}]");
    }
    assert!(!out.join("t").join("3.npy").exists());
    assert_eq!(read(out.join("y.npy")), read(dir.path().join("want_y.npy")));

    let refusals = [
        (
            format!("s={}", path("x.npy")),
            "1",
            "is a sequence: give a directory",
        ),
        (s.clone(), "2", "run whole on the CPU backend only"),
    ];
    for (sequence, microbatches, says) in refusals {
        let fresh = path("refused");
        let (code, _, err) = pipecut(&[
            "run",
            &plan,
            &model,
            "--input",
            &sequence,
            "--input",
            &x,
            "--microbatches",
            microbatches,
            "--output-dir",
            &fresh,
        ]);
        assert_ne!(code, 0, "{sequence} {microbatches}");
        assert!(err.contains(says), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!dir.path().join("refused").exists());
    }
}
