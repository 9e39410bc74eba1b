//! The plan document: its committed schema, its exact bytes, and `partition` → `check` through the
//! binary.

mod common;

use std::path::Path;
use std::process::Command;

use pipecut::plan::Plan;

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("the pipecut binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn partition_to(out: &Path, model: &str, extra: &[&str]) -> String {
    let out_arg = out.to_str().unwrap();
    let mut args = vec!["partition", model, "--out", out_arg];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = pipecut(&args);
    assert_eq!(code, 0, "partition failed: {stderr}");
    assert!(stdout.contains("wrote"), "{stdout}");
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn committed_schema_is_the_generated_one() {
    let committed = std::fs::read_to_string(common::root().join("docs/plan.schema.json")).unwrap();
    assert!(
        committed == Plan::json_schema(),
        "docs/plan.schema.json is stale: regenerate it with `cargo run -- schema > docs/plan.schema.json`"
    );
}

#[test]
fn schema_names_every_field_a_plan_has() {
    // Every key of a real plan appears in the schema's properties: the schema describes what is
    // written, not a subset of it.
    let dir = tempfile::tempdir().unwrap();
    let plan: serde_json::Value = serde_json::from_str(&partition_to(
        &dir.path().join("plan.json"),
        "fixtures/models/gpt2_tiny.onnx",
        &["--dim", "batch=4", "--dim", "seq=16", "--cluster", "1x4xL4"],
    ))
    .unwrap();
    let schema = Plan::json_schema();
    let mut keys = Vec::new();
    collect_keys(&plan, "", &mut keys);
    assert!(keys.len() > 40, "{keys:?}");
    for key in keys {
        assert!(
            schema.contains(&format!("\"{key}\"")),
            "the plan has a field '{key}' the schema does not name"
        );
    }
}

fn collect_keys(value: &serde_json::Value, parent: &str, keys: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                // The keys of these maps are names (profiles, dims), not fields.
                if !matches!(parent, "cost_model" | "dims") {
                    keys.push(key.clone());
                }
                collect_keys(child, key, keys);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_keys(v, parent, keys)),
        _ => {}
    }
}

#[test]
fn mlp_plan() {
    // The exact bytes of a small plan: a change to the format or to the numbers shows up here
    // (review it, then `cargo insta accept` or INSTA_UPDATE=always).
    let dir = tempfile::tempdir().unwrap();
    let text = partition_to(
        &dir.path().join("plan.json"),
        "fixtures/models/mlp.onnx",
        &[
            "--dim",
            "batch=8",
            "--devices",
            "A100-80GB,L4",
            "--stages",
            "2",
        ],
    );
    insta::assert_snapshot!(text);
}

#[test]
fn partition_then_check_round_trips_on_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    for name in common::FIXTURES {
        let model = format!("fixtures/models/{name}.onnx");
        let path = dir.path().join(format!("{name}.json"));
        let mut args = vec!["--dim", "batch=4", "--cluster", "1x4xL4", "--stages", "3"];
        if !matches!(name, "mlp" | "resnet_tiny") {
            args.extend(["--dim", "seq=16"]);
        }
        let text = partition_to(&path, &model, &args);
        let plan = Plan::from_json(&text).unwrap();
        assert_eq!(plan.stages.len(), 3, "{name}");
        assert_eq!(
            plan.stages.iter().map(|s| s.node_count).sum::<usize>(),
            plan.model.nodes,
            "{name}: every node on one stage"
        );
        assert_eq!(plan.to_json(), text, "{name}: the plan round-trips exactly");
        let (code, stdout, stderr) = pipecut(&["check", path.to_str().unwrap(), &model]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert!(stdout.contains("valid plan"), "{stdout}");
    }
}

#[test]
fn check_names_what_an_edited_plan_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let text = partition_to(
        &dir.path().join("plan.json"),
        model,
        &[
            "--dim",
            "batch=4",
            "--dim",
            "seq=16",
            "--cluster",
            "1x3xL4",
            "--stages",
            "3",
        ],
    );
    let good = Plan::from_json(&text).unwrap();

    let check = |plan: &Plan, file: &str| {
        let path = dir.path().join(file);
        std::fs::write(&path, plan.to_json()).unwrap();
        let (code, _, stderr) = pipecut(&["check", path.to_str().unwrap(), model]);
        assert_eq!(code, 1, "{file}: an invalid plan exits with 1: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };

    // The last node of stage 0 moved to stage 2: its consumers in stage 1 now read backwards.
    let mut backwards = good.clone();
    let moved = backwards.stages[0].nodes.pop().unwrap();
    backwards.stages[0].node_count -= 1;
    backwards.stages[2].nodes.push(moved);
    backwards.stages[2].node_count += 1;
    let err = check(&backwards, "backwards.json");
    assert!(err.contains("stage"), "{err}");

    // A node on two stages.
    let mut twice = good.clone();
    let first = twice.stages[1].nodes[0].clone();
    twice.stages[0].nodes.push(first.clone());
    let err = check(&twice, "twice.json");
    assert!(err.contains(&first), "{err}");

    // A figure edited by hand.
    let mut edited = good.clone();
    edited.stages[1].compute_secs *= 0.5;
    let err = check(&edited, "edited.json");
    assert!(err.contains("compute_secs"), "{err}");
}

#[test]
fn same_request_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
        "--cluster",
        "1x4xL4",
        "--stages",
        "auto",
    ];
    let a = partition_to(
        &dir.path().join("a.json"),
        "fixtures/models/bert_tiny.onnx",
        &args,
    );
    let b = partition_to(
        &dir.path().join("b.json"),
        "fixtures/models/bert_tiny.onnx",
        &args,
    );
    assert_eq!(a, b);
}

#[test]
fn check_speaks_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    partition_to(
        &path,
        "fixtures/models/mlp.onnx",
        &["--dim", "batch=2", "--devices", "L4,L4", "--stages", "2"],
    );
    let (code, out, err) = pipecut(&[
        "check",
        path.to_str().unwrap(),
        "fixtures/models/mlp.onnx",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["valid"], true);
    assert_eq!(report["stages"], 2);
    assert_eq!(report["nodes"], 10);
}
