//! The `pipecut` binary, run as a user runs it.

mod common;

use std::process::Command;

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn inspect_prints_the_summary() {
    let (code, out, err) = pipecut(&[
        "inspect",
        "fixtures/models/gpt2_tiny.onnx",
        "--dim",
        "batch=8",
        "--dim",
        "seq=32",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("logits") && out.contains("[8, 32, 512]"),
        "{out}"
    );
    assert!(
        out.contains("MatMul") && out.contains("every tensor typed"),
        "{out}"
    );
}

#[test]
fn inspect_json_is_machine_readable() {
    let (code, out, err) = pipecut(&["inspect", "fixtures/models/resnet_tiny.onnx", "--json"]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(json["op_histogram"]["Conv"].as_u64().unwrap() > 5);
    assert_eq!(json["symbolic_dims"][0], "batch");
    assert_eq!(json["outputs"][0]["shape"][0], "batch");
}

#[test]
fn bad_input_exits_2_with_one_line_and_no_panic() {
    let load = include_str!("load.rs");
    // The same corpus and expectations as the library test.
    for line in load
        .lines()
        .filter(|l| l.trim_start().starts_with("(\"") && l.contains(".onnx\""))
    {
        let file = line.split('"').nth(1).unwrap();
        let expected = line.split('"').nth(3).unwrap().replace("\\'", "'");
        let (code, _, err) = pipecut(&["inspect", &format!("tests/malformed/{file}")]);
        assert_eq!(code, 2, "{file}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("stack backtrace"),
            "{file}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(&expected),
            "{file}: expected '{expected}' in {err}"
        );
    }
}

#[test]
fn bad_arguments_are_explained() {
    let (code, _, err) = pipecut(&["inspect", "fixtures/models/mlp.onnx", "--dim", "batch"]);
    assert_eq!(code, 2);
    assert!(err.contains("NAME=VALUE"), "{err}");
    let (code, _, err) = pipecut(&["inspect", "fixtures/models/mlp.onnx", "--dim", "seqq=4"]);
    assert_eq!(code, 2);
    assert!(err.contains("'seqq'") && err.contains("batch"), "{err}");
    let (code, _, err) = pipecut(&["inspect", "does/not/exist.onnx"]);
    assert_eq!(code, 2);
    assert!(err.contains("does/not/exist.onnx"), "{err}");
}

#[test]
fn cost_prints_the_table_and_json() {
    let (code, out, err) = pipecut(&[
        "cost",
        "fixtures/models/resnet_tiny.onnx",
        "--device",
        "A100-80GB",
        "--dim",
        "batch=4",
        "--top",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Conv") && out.contains("total on A100-SXM-80GB (inference)"),
        "{out}"
    );
    let (code, out, err) = pipecut(&[
        "cost",
        "fixtures/models/mlp.onnx",
        "--device",
        "H100-SXM",
        "--dim",
        "batch=4",
        "--mode",
        "training",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["nodes"].as_array().unwrap().len(), 10);
    assert_eq!(json["mode"]["mode"], "training");
    let (code, _, err) = pipecut(&[
        "cost",
        "fixtures/models/mlp.onnx",
        "--device",
        "H900",
        "--dim",
        "batch=4",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown device 'H900'") && err.contains("H100-SXM"),
        "{err}"
    );
}

#[test]
fn calibrate_writes_a_profile_that_cost_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.json");
    let out_str = out.to_str().unwrap();
    let (code, stdout, err) = pipecut(&[
        "calibrate",
        "--device",
        "cpu",
        "--out",
        out_str,
        "--quick",
        "--budget-ms",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("efficiency matmul"), "{stdout}");
    let (code, stdout, err) = pipecut(&[
        "cost",
        "fixtures/models/mlp.onnx",
        "--device",
        out_str,
        "--dim",
        "batch=2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("CPU-x86-64-AVX2-2C-calibrated"), "{stdout}");
    let (code, _, err) = pipecut(&["calibrate", "--device", "H100-SXM", "--out", out_str]);
    assert_eq!(code, 2);
    assert!(err.contains("only CPU"), "{err}");
}

#[test]
fn completions_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = pipecut(&["completions", shell]);
        assert_eq!(code, 0, "{err}");
        for sub in [
            "inspect",
            "partition",
            "plan-cluster",
            "export",
            "run",
            "show",
            "check",
        ] {
            assert!(out.contains(sub), "{shell} completions lack {sub}");
        }
    }
}

#[test]
fn exit_codes_tell_infeasible_from_bad_input() {
    // The 175B-shaped model cannot fit two L4s: understood, no answer → 1.
    let gpt3 = common::gpt3_with_placeholder_weights();
    let (code, _, err) = pipecut(&[
        "partition",
        gpt3.to_str().unwrap(),
        "--dim",
        "batch=1",
        "--dim",
        "seq=2048",
        "--devices",
        "L4,L4",
        "--stages",
        "2",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not fit"), "{err}");
    // A file that is not there → 2.
    let (code, _, err) = pipecut(&["inspect", "fixtures/models/absent.onnx"]);
    assert_eq!(code, 2, "{err}");
    // An unknown device → 2.
    let (code, _, err) = pipecut(&[
        "partition",
        "fixtures/models/mlp.onnx",
        "--dim",
        "batch=2",
        "--devices",
        "NoSuchGPU",
    ]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn partition_reports_tokens_per_second_and_mfu_from_the_simulated_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let model_path = "fixtures/models/gpt2_tiny.onnx";
    let (code, stdout, stderr) = pipecut(&[
        "partition",
        model_path,
        "--cluster",
        "1x3xL4",
        "--stages",
        "3",
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("throughput "))
        .unwrap_or_else(|| panic!("no throughput line: {stdout}"));
    let number_before = |unit: &str| -> f64 {
        let head = line.split(unit).next().unwrap();
        let word = head.trim_end().rsplit(' ').next().unwrap();
        word.replace(',', "").trim_end_matches('%').parse().unwrap()
    };
    // The same figures from the plan and the cost model, independently of the CLI's code.
    let plan = pipecut::plan::Plan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let step = plan.simulate().unwrap().step_secs;
    let samples_per_sec = plan.config.microbatches as f64 * 4.0 / step;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b + 1.0;
    assert!(
        close(number_before(" samples/s"), samples_per_sec),
        "{line}"
    );
    assert!(
        close(number_before(" tokens/s"), samples_per_sec * 16.0),
        "{line}"
    );
    let mut model = pipecut::onnx::load_model(common::root().join(model_path)).unwrap();
    pipecut::onnx::shape::ShapeInference::new(
        pipecut::onnx::shape::DimBindings::new()
            .bind("batch", 4)
            .bind("seq", 16),
    )
    .run(&mut model.graph)
    .unwrap();
    let catalog = pipecut::cost::Catalog::builtin();
    let l4 = catalog.device("L4").unwrap();
    let flops = pipecut::cost::CostModel::new(l4)
        .model_flops(&model.graph)
        .unwrap();
    assert!(flops > 0.0);
    let mfu = plan.config.microbatches as f64 * flops
        / (step * 3.0 * l4.peak_flops(pipecut::graph::DType::F32));
    let printed = number_before("% (model FLOPs");
    assert!(
        (printed - mfu * 100.0).abs() <= 0.05 * mfu * 100.0,
        "{line}: expected {}%",
        mfu * 100.0
    );
}

/// Issue 15 item 1: a model importing an opset newer than pipecut knows loads, and the CLI warns
/// on stderr naming the ops whose semantics it assumed.
#[test]
fn a_newer_opset_loads_with_a_warning_naming_the_assumed_ops() {
    use onnx_protobuf::Message;
    let bytes = std::fs::read(common::fixture("mlp")).unwrap();
    let mut proto = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap();
    for import in &mut proto.opset_import {
        if import.domain.is_empty() || import.domain == "ai.onnx" {
            import.version = 30;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp_opset30.onnx");
    std::fs::write(&path, proto.write_to_bytes().unwrap()).unwrap();
    let (code, out, err) = pipecut(&["inspect", path.to_str().unwrap(), "--dim", "batch=2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Gemm"), "{out}");
    assert!(
        err.contains("warning:") && err.contains("opset 30") && err.contains("Gemm, Relu, Softmax"),
        "{err}"
    );
}

/// Issue 15 item 2: a graph input that carries a shape (ReduceSum's axes) is resolved by a sample
/// value given at plan time (`--value axes=FILE.npy`); without it, inspect names the input.
#[test]
fn a_sample_value_resolves_a_shape_input() {
    use onnx_protobuf::{
        AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
        ValueInfoProto,
    };
    let value_info = common::tensor_value_info;
    let graph = GraphProto {
        name: "reduce".into(),
        node: vec![NodeProto {
            name: "sum".into(),
            op_type: "ReduceSum".into(),
            input: vec!["x".into(), "axes".into()],
            output: vec!["y".into()],
            attribute: vec![AttributeProto {
                name: "keepdims".into(),
                i: 0,
                type_: onnx_protobuf::attribute_proto::AttributeType::INT.into(),
                ..Default::default()
            }],
            ..Default::default()
        }],
        input: vec![value_info("x", 1, &[2, 3, 4]), value_info("axes", 7, &[1])],
        output: vec![ValueInfoProto {
            name: "y".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            version: 18,
            ..Default::default()
        }],
        graph: Some(graph).into(),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reduce.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    let axes =
        pipecut::runtime::HostTensor::new(vec![1], pipecut::runtime::TensorData::I64(vec![1]))
            .unwrap();
    let axes_path = dir.path().join("axes.npy");
    std::fs::write(&axes_path, pipecut::runtime::encode_npy(&axes)).unwrap();
    let model_arg = path.to_str().unwrap();
    let (_, out, err) = pipecut(&["inspect", model_arg]);
    assert!(format!("{out}{err}").contains("'axes'"), "{out}{err}");
    let value = format!("axes={}", axes_path.display());
    let (code, out, err) = pipecut(&["inspect", model_arg, "--value", &value, "--json"]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let outputs = report["outputs"]
        .as_array()
        .expect("inspect --json lists outputs");
    let y = outputs.iter().find(|o| o["name"] == "y").expect("output y");
    assert_eq!(y["shape"], serde_json::json!([2, 4]), "{out}");
    let (code, _, err) = pipecut(&[
        "partition",
        model_arg,
        "--value",
        &value,
        "--stages",
        "1",
        "--cluster",
        "1x1xH100-SXM",
    ]);
    assert_eq!(code, 0, "{err}");
}

/// The DeepSpeed `type:` baseline's regex: named in the table and the plan, used again by
/// `check` (which re-derives the baselines from the plan's config), and refused in one line when
/// it does not compile.
#[test]
fn the_type_baselines_regex_is_recorded_checked_and_validated() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let model_path = "fixtures/models/gpt2_tiny.onnx";
    let args = |regex: &'static str| {
        vec![
            "partition",
            model_path,
            "--cluster",
            "1x3xL4",
            "--stages",
            "3",
            "--dim",
            "batch=4",
            "--dim",
            "seq=16",
            "--baseline-layer-type",
            regex,
        ]
    };
    let mut with_out = args(r"H\.[01]$");
    with_out.extend(["--out", out.to_str().unwrap()]);
    let (code, stdout, stderr) = pipecut(&with_out);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("deepspeed 0.19 type:H\\.[01]$"), "{stdout}");
    assert!(
        stdout.contains("DeepSpeed and torchgpipe cut 6 layers: the 4 blocks of /transformer/h"),
        "{stdout}"
    );
    let plan = pipecut::plan::Plan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(plan.config.baseline_layer_type, r"H\.[01]$");
    let (code, _, stderr) = pipecut(&["check", out.to_str().unwrap(), model_path]);
    assert_eq!(code, 0, "{stderr}");

    let (code, stdout, stderr) = pipecut(&args("(unclosed"));
    assert_eq!(code, 2, "{stdout}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.ends_with("not a regex (found open group without closing ')')"),
        "{stderr}"
    );

    // plan-cluster gives the chosen configuration's baselines the same regex.
    let clustered = dir.path().join("cluster.json");
    let cluster_args = |regex: &'static str| {
        vec![
            "plan-cluster",
            model_path,
            "--cluster",
            "1x3xL4",
            "--global-batch",
            "8",
            "--dim",
            "seq=16",
            "--baseline-layer-type",
            regex,
            "--out",
            clustered.to_str().unwrap(),
        ]
    };
    let (code, _, stderr) = pipecut(&cluster_args(r"H\.[01]$"));
    assert_eq!(code, 0, "{stderr}");
    let plan =
        pipecut::plan::Plan::from_json(&std::fs::read_to_string(&clustered).unwrap()).unwrap();
    assert_eq!(plan.config.baseline_layer_type, r"H\.[01]$");
    let (code, _, stderr) = pipecut(&cluster_args("(unclosed"));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("not a regex (found open group without closing ')')"),
        "{stderr}"
    );
}
