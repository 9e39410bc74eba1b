//! Phase test: per-stage ONNX export. Every fixture and every fetched real model is cut into
//! K = 2, 3, 4 contiguous stages of its topological order; each stage file must pass
//! `onnx.checker` (full check) and the chained stages must reproduce the whole model's outputs
//! and boundary tensors bit for bit under onnxruntime (`fixtures/check_stages.py`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use pipecut::graph::NodeId;
use pipecut::onnx::export::{export_stages, Manifest, TensorDestination, TensorSource};
use pipecut::onnx::shape::{DimBindings, ShapeInference};

/// The pinned venv's python, or `None` (with the reason printed) when it has not been created.
fn python() -> Option<PathBuf> {
    let python = common::root().join(".venv/bin/python");
    if python.exists() {
        Some(python)
    } else {
        common::skip(
            common::Need::Venv,
            format!(
                "the onnx/onnxruntime checks: {} is absent (run bash fixtures/pyenv.sh)",
                python.display()
            ),
        );
        None
    }
}

/// `k` stages of (nearly) equal node counts, contiguous in the topological order.
fn contiguous_stages(order: &[NodeId], k: usize) -> Vec<Vec<NodeId>> {
    (0..k)
        .map(|s| order[s * order.len() / k..(s + 1) * order.len() / k].to_vec())
        .collect()
}

/// An output directory on the repository's filesystem (external data is copied there).
fn out_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("export-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Checks what the manifest promises without running anything: every node on one stage, every
/// input routed from a model input or an earlier stage's output that lists it, every model
/// output sent by exactly the stage the manifest names.
fn check_manifest(manifest: &Manifest, node_count: usize, k: usize, out: &Path) {
    assert_eq!(manifest.stages.len(), k);
    let nodes: usize = manifest.stages.iter().map(|s| s.nodes).sum();
    assert_eq!(nodes, node_count);
    let model_inputs: BTreeSet<&str> = manifest.inputs.iter().map(|t| t.tensor.as_str()).collect();
    let mut sent: BTreeMap<&str, (usize, &[TensorDestination])> = BTreeMap::new();
    for stage in &manifest.stages {
        assert!(out.join(&stage.file).exists());
        assert!(stage.file_bytes > 0 && !stage.outputs.is_empty());
        for input in &stage.inputs {
            let name = input.tensor.tensor.as_str();
            match input.from {
                TensorSource::ModelInput => assert!(model_inputs.contains(name), "{name}"),
                TensorSource::Stage { stage: from } => {
                    assert!(from < stage.stage, "{name} flows backwards");
                    let (producer, to) = sent[name];
                    assert_eq!(producer, from, "{name}");
                    assert!(to.contains(&TensorDestination::Stage { stage: stage.stage }));
                }
            }
        }
        for output in &stage.outputs {
            let name = output.tensor.tensor.as_str();
            assert!(
                sent.insert(name, (stage.stage, &output.to)).is_none(),
                "{name} is made twice"
            );
        }
    }
    for output in &manifest.outputs {
        if let TensorSource::Stage { stage } = output.from {
            let (producer, to) = sent[output.tensor.as_str()];
            assert_eq!(producer, stage);
            assert!(to.contains(&TensorDestination::ModelOutput));
        }
    }
}

/// Runs `fixtures/check_stages.py`; returns its JSON summary or the reason it failed.
fn check_stages(
    python: &Path,
    model: &Path,
    out: &Path,
    dims: &[(String, u64)],
    check_only: bool,
) -> Result<serde_json::Value, String> {
    let mut command = Command::new(python);
    command
        .arg(common::root().join("fixtures/check_stages.py"))
        .arg(model)
        .arg(out);
    for (name, value) in dims {
        command.arg("--dim").arg(format!("{name}={value}"));
    }
    if check_only {
        command.arg("--check-only");
    }
    let result = command.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&result.stdout);
    if !result.status.success() {
        return Err(format!(
            "{}\n{}",
            stdout,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    serde_json::from_str(&stdout).map_err(|e| format!("{e}: {stdout}"))
}

/// Exports `model` at K = 2, 3, 4 and checks each export; returns the failures.
fn export_and_check(
    name: &str,
    model: &Path,
    dims: &[(String, u64)],
    python: Option<&Path>,
    run_onnxruntime: bool,
) -> Vec<String> {
    let mut loaded = pipecut::onnx::load_model(model).unwrap();
    // No bindings: the stage boundaries keep the model's symbolic dims, as `pipecut export` does
    // by default.
    ShapeInference::new(DimBindings::new())
        .run(&mut loaded.graph)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let graph = &loaded.graph;
    let mut failures = Vec::new();
    for k in 2..=4 {
        let out = out_dir(name);
        let stages = contiguous_stages(graph.topological_order(), k);
        let manifest = match export_stages(model, graph, &stages, out.path()) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name} K={k}: export failed: {e}"));
                continue;
            }
        };
        check_manifest(&manifest, graph.node_count(), k, out.path());
        let written = std::fs::read_to_string(out.path().join("manifest.json")).unwrap();
        assert_eq!(Manifest::from_json(&written).unwrap(), manifest);
        let Some(python) = python else { continue };
        match check_stages(python, model, out.path(), dims, !run_onnxruntime) {
            Ok(summary) => {
                assert_eq!(summary["ok"], true, "{summary}");
                if run_onnxruntime {
                    let compared = summary["compared"].as_u64().unwrap();
                    assert_eq!(summary["equal"].as_u64(), Some(compared), "{summary}");
                    // The model outputs and at least one boundary tensor.
                    assert!(compared > summary["model_outputs"].as_u64().unwrap());
                }
                eprintln!(
                    "{name} K={k}: checker {}, compared {}, equal {}",
                    summary["checker"], summary["compared"], summary["equal"]
                );
            }
            Err(e) => failures.push(format!("{name} K={k}: {e}")),
        }
    }
    failures
}

#[test]
fn fixture_stages_reproduce_the_whole_model() {
    let python = python();
    let mut failures = Vec::new();
    for name in common::FIXTURES {
        let dims = common::fixture_reference(name).dims;
        failures.extend(export_and_check(
            name,
            &common::fixture(name),
            &dims,
            python.as_deref(),
            true,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn real_model_stages_reproduce_the_whole_model() {
    let python = python();
    let mut failures = Vec::new();
    for (name, path) in common::real_models() {
        let dims = common::real_reference(&name).dims;
        failures.extend(export_and_check(
            &name,
            &path,
            &dims,
            python.as_deref(),
            true,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gpt3_stages_reference_the_external_weights() {
    // The weights are a 349 GB sparse placeholder of zeros (see fixtures/README.md): the stage
    // files are exported and checked by onnx.checker, which verifies that every external data
    // file they name exists; onnxruntime would have to load all of it, so it is not run.
    eprintln!("gpt3_175b: onnxruntime not run (its weights are a 349 GB sparse placeholder)");
    let path = common::gpt3_with_placeholder_weights();
    let python = python();
    let failures = export_and_check("gpt3_175b", &path, &[], python.as_deref(), false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let mut model = pipecut::onnx::load_model(&path).unwrap();
    ShapeInference::new(DimBindings::new())
        .run(&mut model.graph)
        .unwrap();
    let out = out_dir("gpt3_175b");
    let stages = contiguous_stages(model.graph.topological_order(), 2);
    let manifest = export_stages(&path, &model.graph, &stages, out.path()).unwrap();
    assert_eq!(manifest.external_data.len(), 1);
    let placed = out.path().join(&manifest.external_data[0].location);
    let original = path.with_file_name(&manifest.external_data[0].location);
    // A copy, not a link (onnx >= 1.20 refuses hard links, and editing the output must not
    // edit the original): the same length, another file, and the holes kept (349 GB of zeros
    // take no disk).
    assert_eq!(
        std::fs::metadata(&placed).unwrap().len(),
        std::fs::metadata(&original).unwrap().len()
    );
    assert!(!pipecut::io::same_file(&placed, &original));
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(&placed).unwrap().blocks() * 512;
        assert!(on_disk < 1 << 30, "the copy takes {on_disk} bytes of disk");
    }
    // The stage files stay small: the weights are not embedded.
    for stage in &manifest.stages {
        assert!(stage.file_bytes < 2_000_000, "{}", stage.file_bytes);
    }
}

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A 3-stage plan for gpt2_tiny, written by `pipecut partition`.
fn gpt2_plan(dir: &Path) -> PathBuf {
    let plan = dir.join("plan.json");
    let (code, _, err) = pipecut(&[
        "partition",
        "fixtures/models/gpt2_tiny.onnx",
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
        "--devices",
        "L4,L4,L4,L4",
        "--stages",
        "3",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    plan
}

#[test]
fn cli_exports_a_plan() {
    let dir = out_dir("cli");
    let plan = gpt2_plan(dir.path());
    let out = dir.path().join("stages");
    let (code, table, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        "fixtures/models/gpt2_tiny.onnx",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("stage_2.onnx") && table.contains("initializers"),
        "{table}"
    );
    let (code, json, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        "fixtures/models/gpt2_tiny.onnx",
        "--out-dir",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let manifest = Manifest::from_json(&json).unwrap();
    // The stages are the plan's, node for node.
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    for (stage, planned) in manifest
        .stages
        .iter()
        .zip(plan["stages"].as_array().unwrap())
    {
        assert_eq!(stage.nodes as u64, planned["node_count"].as_u64().unwrap());
        assert_eq!(stage.first_node, planned["first_node"].as_str().unwrap());
        assert_eq!(stage.last_node, planned["last_node"].as_str().unwrap());
    }
    if let Some(python) = python() {
        let dims = common::fixture_reference("gpt2_tiny").dims;
        let summary =
            check_stages(&python, &common::fixture("gpt2_tiny"), &out, &dims, false).unwrap();
        assert_eq!(summary["ok"], true, "{summary}");
    }
}

#[test]
fn cli_refuses_a_plan_for_another_model() {
    let dir = out_dir("cli-sha");
    let plan = gpt2_plan(dir.path());
    let out = dir.path().join("stages");
    let (code, _, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        "fixtures/models/llama_tiny.onnx",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    // An invalid plan for this model: exit 1 (2 is for unreadable input).
    assert_eq!(code, 1);
    assert!(
        err.contains("it was made for another graph: its model file was 'gpt2_tiny.onnx'")
            && err.contains("graph sha256"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written for a refused plan");
}

#[test]
fn cli_reports_an_unwritable_out_dir() {
    let dir = out_dir("cli-unwritable");
    let plan = gpt2_plan(dir.path());
    // A directory cannot be made under a regular file, whoever runs the test (root included).
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let (code, _, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        "fixtures/models/gpt2_tiny.onnx",
        "--out-dir",
        file.join("stages").to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot write to output directory"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn stages_that_are_not_a_partition_or_not_convex_are_refused() {
    let path = common::fixture("mlp");
    let model = pipecut::onnx::load_model(&path).unwrap();
    let order = model.graph.topological_order().to_vec();
    let out = out_dir("bad-stages");
    let half = order.len() / 2;
    let cases: Vec<(Vec<Vec<NodeId>>, &str)> = vec![
        (vec![order[..half].to_vec()], "is on no stage"),
        (
            vec![order[..half + 1].to_vec(), order[half..].to_vec()],
            "is on stages 0 and 1",
        ),
        (
            vec![order[half..].to_vec(), order[..half].to_vec()],
            "not convex and ordered",
        ),
        (vec![order.clone(), Vec::new()], "stage 1 has no nodes"),
        // Valid stages, but the graph was never typed: the boundary cannot be declared.
        (contiguous_stages(&order, 2), "run shape inference"),
    ];
    for (stages, expected) in cases {
        let err = export_stages(&path, &model.graph, &stages, out.path()).unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
    }
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[test]
fn a_failed_export_leaves_the_earlier_export_as_it_was() {
    let path = common::fixture("mlp");
    let mut model = pipecut::onnx::load_model(&path).unwrap();
    ShapeInference::new(DimBindings::new())
        .run(&mut model.graph)
        .unwrap();
    let stages = contiguous_stages(model.graph.topological_order(), 2);
    let out = out_dir("failed");
    export_stages(&path, &model.graph, &stages, out.path()).unwrap();
    // Make stage_1.onnx impossible to write: a non-empty directory of that name.
    let blocker = out.path().join("stage_1.onnx");
    std::fs::remove_file(&blocker).unwrap();
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("keep"), b"").unwrap();
    let manifest_before = std::fs::read(out.path().join("manifest.json")).unwrap();
    let stage_0_before = std::fs::read(out.path().join("stage_0.onnx")).unwrap();
    let err = export_stages(&path, &model.graph, &stages, out.path()).unwrap_err();
    assert!(
        matches!(err, pipecut::Error::Output { .. }) && err.to_string().contains("stage_1.onnx"),
        "{err}"
    );
    let left: BTreeSet<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // Nothing was replaced and no temporary is left: the earlier export stands as it was.
    let expected = ["manifest.json", "stage_0.onnx", "stage_1.onnx"];
    assert_eq!(left, expected.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        std::fs::read(out.path().join("manifest.json")).unwrap(),
        manifest_before
    );
    assert_eq!(
        std::fs::read(out.path().join("stage_0.onnx")).unwrap(),
        stage_0_before
    );
}

#[test]
fn bound_dims_make_the_boundaries_concrete() {
    let path = common::fixture("gpt2_tiny");
    let reference = common::fixture_reference("gpt2_tiny");
    let mut model = pipecut::onnx::load_model(&path).unwrap();
    let mut bindings = DimBindings::new();
    for (name, value) in &reference.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings).run(&mut model.graph).unwrap();
    let out = out_dir("bound");
    let stages = contiguous_stages(model.graph.topological_order(), 3);
    let manifest = export_stages(&path, &model.graph, &stages, out.path()).unwrap();
    let boundary = manifest.stages[1]
        .inputs
        .iter()
        .find(|i| matches!(i.from, TensorSource::Stage { .. }))
        .expect("stage 1 receives a tensor from stage 0");
    let shape = boundary.tensor.shape.as_ref().unwrap();
    assert!(
        shape
            .iter()
            .all(|d| matches!(d, pipecut::onnx::export::ManifestDim::Known(_))),
        "{shape:?}"
    );
    if let Some(python) = python() {
        let summary = check_stages(&python, &path, out.path(), &reference.dims, false).unwrap();
        assert_eq!(summary["ok"], true, "{summary}");
    }
}

/// A second export into a folder that an export holds is refused at once, in one line, and
/// writes nothing there: two concurrent exports into one folder both exited 0, each with a
/// manifest naming the other's files.
#[test]
fn an_export_into_a_folder_another_export_holds_is_refused() {
    let dir = out_dir("locked");
    let plan = gpt2_plan(dir.path());
    let out = dir.path().join("stages");
    // This test process stands for the first export: it holds the folder's lock.
    let lock = pipecut::onnx::export::lock_out_dir(&out).unwrap();
    let export = |out: &Path| {
        pipecut(&[
            "export",
            plan.to_str().unwrap(),
            "fixtures/models/gpt2_tiny.onnx",
            "--out-dir",
            out.to_str().unwrap(),
        ])
    };
    let (code, _, err) = export(&out);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("another pipecut export is writing into it"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(written, [pipecut::onnx::export::LOCK_FILE], "{written:?}");
    drop(lock);
    let (code, _, err) = export(&out);
    assert_eq!(
        code, 0,
        "once the first export is done the folder is free: {err}"
    );
}

/// A chain of `layers` MatMuls of `width` × `width` f32 weights, embedded in the protobuf.
fn matmul_chain(layers: usize, width: usize) -> Vec<u8> {
    use onnx_protobuf::tensor_proto::DataType;
    use onnx_protobuf::type_proto::{Tensor, Value};
    use onnx_protobuf::{
        GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let value_info = |name: &str| {
        let mut shape = TensorShapeProto::new();
        for size in [1, width as i64] {
            let mut dim = onnx_protobuf::tensor_shape_proto::Dimension::new();
            dim.set_dim_value(size);
            shape.dim.push(dim);
        }
        let mut tensor = Tensor::new();
        tensor.elem_type = DataType::FLOAT as i32;
        tensor.shape = Some(shape).into();
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        info.type_ = Some(TypeProto {
            value: Some(Value::TensorType(tensor)),
            ..Default::default()
        })
        .into();
        info
    };
    let mut graph = GraphProto::new();
    graph.name = "chain".into();
    graph.input.push(value_info("x"));
    let mut input = "x".to_string();
    for layer in 0..layers {
        let mut weight = TensorProto::new();
        weight.name = format!("w{layer}");
        weight.data_type = DataType::FLOAT as i32;
        weight.dims = vec![width as i64, width as i64];
        weight.raw_data = vec![0x3c; width * width * 4];
        graph.initializer.push(weight);
        let mut node = NodeProto::new();
        node.name = format!("matmul{layer}");
        node.op_type = "MatMul".into();
        node.input = vec![input.clone(), format!("w{layer}")];
        input = format!("h{layer}");
        node.output = vec![input.clone()];
        graph.node.push(node);
    }
    graph.output.push(value_info(&input));
    let mut opset = OperatorSetIdProto::new();
    opset.version = 17;
    let mut model = ModelProto::new();
    model.ir_version = 8;
    model.opset_import.push(opset);
    model.graph = Some(graph).into();
    model.write_to_bytes().unwrap()
}

/// A model truncated while `export` reads it is an error naming the change, never a signal:
/// the model was mapped, and the first page past the new end killed the export with SIGBUS
/// (8 of 8 tries). The truncation comes at several moments of the export; each run must end
/// with an exit code (0 if the export had read everything before), and at least one must see
/// the truncation.
#[cfg(unix)]
#[test]
fn a_model_truncated_during_export_is_an_error_not_a_signal() {
    use std::os::unix::process::ExitStatusExt;
    let dir = out_dir("truncated");
    let bytes = matmul_chain(4, 2048);
    let model = dir.path().join("chain.onnx");
    std::fs::write(&model, &bytes).unwrap();
    let plan = dir.path().join("plan.json");
    let (code, _, err) = pipecut(&[
        "partition",
        model.to_str().unwrap(),
        "--cluster",
        "1x2xH100-SXM",
        "--stages",
        "2",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let mut saw_truncation = false;
    for delay_ms in [0u64, 100, 300, 800, 1500] {
        std::fs::write(&model, &bytes).unwrap();
        let out = dir.path().join(format!("out{delay_ms}"));
        let child = Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .args(["export", plan.to_str().unwrap(), model.to_str().unwrap()])
            .arg("--out-dir")
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&model)
            .unwrap()
            .set_len(1000)
            .unwrap();
        let result = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&result.stderr);
        assert_eq!(
            result.status.signal(),
            None,
            "truncated after {delay_ms} ms: killed by a signal\n{err}"
        );
        if !result.status.success() {
            saw_truncation = true;
            assert!(!err.contains("panicked"), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
    }
    assert!(saw_truncation, "no export saw its model truncated");
}
