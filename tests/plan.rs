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
    let first = twice.stages[1].nodes[0].to_string();
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

/// A three-stage gpt2_tiny plan, its path and the model.
fn gpt2_plan(dir: &Path) -> (Plan, &'static str) {
    let model = "fixtures/models/gpt2_tiny.onnx";
    let text = partition_to(
        &dir.join("plan.json"),
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
    (Plan::from_json(&text).unwrap(), model)
}

#[test]
fn check_rederives_every_figure_and_names_field_stage_and_both_values() {
    let dir = tempfile::tempdir().unwrap();
    let (good, model) = gpt2_plan(dir.path());
    let check = |plan: &Plan, file: &str| {
        let path = dir.path().join(file);
        std::fs::write(&path, plan.to_json()).unwrap();
        let (code, _, stderr) = pipecut(&["check", path.to_str().unwrap(), model]);
        assert_eq!(code, 1, "{file}: an altered plan is refused: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    // The audit's alterations (issue 17) and the stale figures of issue 21, one at a time.
    type Edit = fn(&mut Plan);
    let edits: [(&str, Edit, &str); 10] = [
        (
            "cut_bytes",
            |p| p.summary.cut_bytes += 4,
            "summary cut_bytes",
        ),
        (
            "activation",
            |p| p.stages[1].activation_bytes += 1,
            "stage 1 activation_bytes",
        ),
        (
            "capacity",
            |p| p.stages[2].capacity_bytes *= 2,
            "stage 2 capacity_bytes",
        ),
        (
            "in_flight",
            |p| p.stages[0].in_flight_microbatches += 1,
            "stage 0 in_flight_microbatches",
        ),
        (
            "node_count",
            |p| p.stages[1].node_count += 1,
            "stage 1 node_count",
        ),
        (
            "received",
            |p| p.stages[1].received.clear(),
            "stage 1 received",
        ),
        (
            "sent",
            |p| p.stages[0].sent.pop().map(drop).unwrap(),
            "stage 0 sent",
        ),
        (
            "first_node",
            |p| p.stages[2].first_node = "x".into(),
            "stage 2 first_node",
        ),
        ("gap", |p| p.summary.gap += 0.01, "summary gap"),
        (
            "speedup",
            |p| p.summary.baselines[0].plan_speedup = Some(9.0),
            "summary baselines[0].plan_speedup",
        ),
    ];
    for (file, edit, field) in edits {
        let mut plan = good.clone();
        edit(&mut plan);
        let err = check(&plan, &format!("{file}.json"));
        assert!(err.contains(field), "{file}: {err}");
        assert!(
            err.contains("in the plan but"),
            "{file}: both values named: {err}"
        );
        assert!(err.contains("--rewrite"), "{file}: {err}");
    }
    // A status forced to optimal on a plan whose bottleneck is above its bound.
    let mut forced = good.clone();
    if forced.summary.status == pipecut::partition::SolveStatus::Optimal {
        // Already optimal: a bound below the bottleneck leaves nothing that proves it.
        forced.summary.lower_bound_secs *= 0.9;
        forced.summary.gap = (forced.summary.bottleneck_secs - forced.summary.lower_bound_secs)
            / forced.summary.bottleneck_secs;
    }
    forced.summary.status = pipecut::partition::SolveStatus::Optimal;
    let err = check(&forced, "forced.json");
    assert!(err.contains("optimal"), "{err}");
    // The recorded proofs are claims too: an LP bound above the bottleneck, and a lower bound
    // that no recorded proof reaches.
    let recorded = good.summary.bounds.expect("a new plan records its bounds");
    let mut lifted = good.clone();
    lifted.summary.bounds = Some(pipecut::partition::LowerBounds {
        lp_relaxation_secs: Some(good.summary.bottleneck_secs * 1.5),
        ..recorded
    });
    let err = check(&lifted, "lifted_lp.json");
    assert!(err.contains("bounds.lp_relaxation_secs"), "{err}");
    if good.summary.status != pipecut::partition::SolveStatus::Optimal {
        let mut unproved = good.clone();
        unproved.summary.bounds = Some(pipecut::partition::LowerBounds {
            average_work_secs: recorded.average_work_secs,
            ..Default::default()
        });
        if unproved.summary.lower_bound_secs > recorded.average_work_secs * (1.0 + 1e-6) {
            let err = check(&unproved, "unproved.json");
            assert!(err.contains("above every bound the plan records"), "{err}");
        }
    }
}

#[test]
fn check_rewrite_recomputes_a_hand_moved_node_in_one_command() {
    let dir = tempfile::tempdir().unwrap();
    let (good, model) = gpt2_plan(dir.path());
    // Move the last node of stage 0 to the front of stage 1, as a user edits the JSON: only the
    // node lists change, every figure is now stale.
    let mut moved = good.clone();
    let node = moved.stages[0].nodes.pop().unwrap();
    moved.stages[1].nodes.insert(0, node.clone());
    let path = dir.path().join("moved.json");
    std::fs::write(&path, moved.to_json()).unwrap();
    let (code, _, stderr) = pipecut(&["check", path.to_str().unwrap(), model]);
    assert_eq!(code, 1, "stale figures are refused: {stderr}");
    assert!(
        stderr.contains("stage 0 ") && stderr.contains("in the plan but"),
        "{stderr}"
    );

    let out = dir.path().join("rewritten.json");
    let (code, stdout, stderr) = pipecut(&[
        "check",
        path.to_str().unwrap(),
        model,
        "--rewrite",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("hand_edited"), "{stdout}");
    let rewritten = Plan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        rewritten.summary.status,
        pipecut::partition::SolveStatus::HandEdited
    );
    assert_eq!(
        rewritten.stages[0].node_count,
        good.stages[0].node_count - 1
    );
    assert_eq!(
        rewritten.stages[1].node_count,
        good.stages[1].node_count + 1
    );
    assert!(rewritten.stages[1].nodes.contains(&node));
    assert_eq!(
        rewritten.stages[0].last_node,
        *good.stages[0].nodes.iter().rev().nth(1).unwrap()
    );
    for stage in &rewritten.stages {
        assert_eq!(stage.first_node, stage.nodes[0]);
        assert_eq!(stage.last_node, *stage.nodes.last().unwrap());
    }
    assert!(rewritten.summary.lower_bound_secs <= rewritten.summary.bottleneck_secs);
    // The rewritten plan checks as it is.
    let (code, stdout, stderr) = pipecut(&["check", out.to_str().unwrap(), model]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid plan"), "{stdout}");
    // Claiming optimal for the hand-moved plan is refused when its figures cannot prove it.
    let mut claimed = rewritten.clone();
    claimed.summary.status = pipecut::partition::SolveStatus::Optimal;
    if claimed.summary.gap == 0.0 {
        claimed.summary.lower_bound_secs = claimed.summary.bottleneck_secs;
    }
    let claimed_path = dir.path().join("claimed.json");
    std::fs::write(&claimed_path, claimed.to_json()).unwrap();
    let (code, _, stderr) = pipecut(&["check", claimed_path.to_str().unwrap(), model]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("optimal"), "{stderr}");
    // A plan that already checks is left as it is.
    let good_path = dir.path().join("plan.json");
    let (code, stdout, stderr) =
        pipecut(&["check", good_path.to_str().unwrap(), model, "--rewrite"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("already matches"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&good_path).unwrap(), good.to_json());
}

#[test]
fn dtype_override_costs_at_that_precision_and_the_plan_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let args = [
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
        "--cluster",
        "1x2xA100-80GB",
        "--stages",
        "2",
    ];
    let fp32 = Plan::from_json(&partition_to(&dir.path().join("fp32.json"), model, &args)).unwrap();
    let mut with_bf16 = args.to_vec();
    with_bf16.extend(["--dtype", "bf16"]);
    let bf16_path = dir.path().join("bf16.json");
    let bf16 = Plan::from_json(&partition_to(&bf16_path, model, &with_bf16)).unwrap();
    assert_eq!(
        bf16.config.dtype_override,
        Some(pipecut::cost::Precision::Bf16)
    );
    assert_eq!(fp32.config.dtype_override, None);
    // The exporter wrote fp32: at bf16 the weights and activations take half the bytes.
    // (Activations are summed over every node whatever the cut, and the few integer tensors
    // keep their size; parameters read by two stages count twice, so they are compared through
    // `cost`.)
    let activations = |p: &Plan| p.stages.iter().map(|s| s.activation_bytes).sum::<u64>();
    let (half, full) = (activations(&bf16) as f64, activations(&fp32) as f64);
    assert!(
        half * 2.0 >= full && half * 2.0 <= full * 1.01,
        "{half} vs {full}"
    );
    let total_params = |extra: &[&str]| -> u64 {
        let mut cost = vec![
            "cost", model, "--device", "L4", "--dim", "batch=2", "--dim", "seq=8",
        ];
        cost.extend_from_slice(extra);
        cost.push("--json");
        let (code, out, err) = pipecut(&cost);
        assert_eq!(code, 0, "{err}");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        report["total_param_bytes"].as_u64().unwrap()
    };
    // Float weights halve; the integer initialisers (shapes, indices) keep their few bytes.
    let (half, full) = (total_params(&["--dtype", "bf16"]), total_params(&[]));
    assert!(
        half * 2 >= full && (half as f64) < full as f64 * 0.51,
        "{half} vs {full}"
    );
    assert_eq!(total_params(&["--dtype", "fp32"]), total_params(&[]));
    // check re-derives the figures at the recorded precision, and refuses them at another.
    let (code, _, stderr) = pipecut(&["check", bf16_path.to_str().unwrap(), model]);
    assert_eq!(code, 0, "{stderr}");
    let mut dropped = bf16.clone();
    dropped.config.dtype_override = None;
    let dropped_path = dir.path().join("dropped.json");
    std::fs::write(&dropped_path, dropped.to_json()).unwrap();
    let (code, _, stderr) = pipecut(&["check", dropped_path.to_str().unwrap(), model]);
    assert_eq!(code, 1, "{stderr}");
    // Anything but the three precisions is refused by name.
    let (code, _, stderr) =
        pipecut(&["partition", model, "--dtype", "int8", "--cluster", "1x2xL4"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("bf16"), "{stderr}");
}

/// mlp.onnx with one change made by `edit`, written into `dir` as `name`.
fn edited_mlp(dir: &Path, name: &str, edit: impl FnOnce(&mut onnx_protobuf::GraphProto)) -> String {
    use onnx_protobuf::Message;
    let bytes = std::fs::read(common::fixture("mlp")).unwrap();
    let mut proto = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap();
    edit(proto.graph.as_mut().expect("mlp has a graph"));
    let path = dir.join(name);
    std::fs::write(&path, proto.write_to_bytes().unwrap()).unwrap();
    path.display().to_string()
}

/// Issue 21: a plan holds for the graph, not the file. A fine-tuned copy (same graph, other
/// weights) is accepted by `check`, `export` and `run` with a note; a copy whose graph changed
/// is refused with the name of the file the plan was made for and the advice to re-plan.
#[test]
fn a_plan_holds_for_other_weights_of_the_same_graph_and_refuses_another_graph() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let text = partition_to(
        &plan,
        "fixtures/models/mlp.onnx",
        &[
            "--cluster",
            "1x2xH100-SXM",
            "--stages",
            "2",
            "--dim",
            "batch=8",
        ],
    );
    let recorded = Plan::from_json(&text).unwrap();
    assert_eq!(recorded.schema_version, pipecut::plan::SCHEMA_VERSION);
    let plan = plan.to_str().unwrap();

    let tuned = edited_mlp(dir.path(), "mlp_tuned.onnx", |graph| {
        let weight = graph
            .initializer
            .iter_mut()
            .find(|t| t.raw_data.len() >= 4)
            .expect("mlp has a raw-data initializer");
        weight.raw_data[0] ^= 0x40;
    });
    let note = "note: the weights differ from those of 'mlp.onnx', which the plan was made for";
    let (code, stdout, stderr) = pipecut(&["check", plan, &tuned]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid plan"), "{stdout}");
    assert!(stderr.contains(note), "{stderr}");
    let stages = dir.path().join("stages");
    let (code, _, stderr) = pipecut(&[
        "export",
        plan,
        &tuned,
        "--out-dir",
        stages.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr.matches(note).count(), 1, "{stderr}");
    // The same file gives no note.
    let (code, _, stderr) = pipecut(&["check", plan, "fixtures/models/mlp.onnx"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("note:"), "{stderr}");

    let renamed = edited_mlp(dir.path(), "mlp_renamed.onnx", |graph| {
        graph.node[0].name.push_str("_renamed");
    });
    let (code, _, stderr) = pipecut(&["check", plan, &renamed]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("it was made for another graph: its model file was 'mlp.onnx'")
            && stderr.contains("make a new plan for this model with `pipecut partition`"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

/// The tensors a plan's stages receive.
fn cut_tensors(plan: &Plan) -> Vec<String> {
    plan.stages
        .iter()
        .flat_map(|s| s.received.iter().map(|r| r.tensor.clone()))
        .collect()
}

/// Issue 21: cut constraints. By default no cut falls between a MatMul and its bias Add
/// (`--cut-anywhere` allows it); `--forbid-cut` keeps a tensor on one stage; the plan records
/// the constraints and `check` refuses a plan edited across them, and claims are audited on
/// the constrained problem (a constrained optimum is not "beaten" by an unconstrained DP plan).
#[test]
fn cut_constraints_are_kept_recorded_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let gpt2 = "fixtures/models/gpt2_tiny.onnx";
    let args = [
        "--cluster",
        "1x4xH100-SXM",
        "--stages",
        "4",
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
    ];
    let free_path = dir.path().join("free.json");
    let mut free_args = args.to_vec();
    free_args.push("--cut-anywhere");
    let free = Plan::from_json(&partition_to(&free_path, gpt2, &free_args)).unwrap();
    // Which projection it cuts is a tie between optima (k_proj or q_proj of h.2): any MatMul
    // output received by a stage is a cut between a MatMul and its bias Add.
    assert!(
        cut_tensors(&free)
            .iter()
            .any(|t| t.ends_with("_proj/MatMul_output_0")),
        "the unconstrained optimum cuts a MatMul from its bias here: {:?}",
        cut_tensors(&free)
    );

    let kept_path = dir.path().join("kept.json");
    let kept = Plan::from_json(&partition_to(&kept_path, gpt2, &args)).unwrap();
    assert!(kept.config.cut_constraints.bias_with_matmul);
    assert!(
        cut_tensors(&kept)
            .iter()
            .all(|t| !t.ends_with("MatMul_output_0")),
        "{:?}",
        cut_tensors(&kept)
    );
    let (code, _, err) = pipecut(&["check", kept_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 0, "{err}");

    // Forbid a tensor the default plan cuts.
    let forbidden = cut_tensors(&kept)
        .into_iter()
        .find(|t| t.contains("ln_1"))
        .expect("the plan cuts after a LayerNorm");
    let forbid_path = dir.path().join("forbid.json");
    let mut forbid_args = args.to_vec();
    forbid_args.extend(["--forbid-cut", forbidden.as_str()]);
    let text = partition_to(&forbid_path, gpt2, &forbid_args);
    let forbid = Plan::from_json(&text).unwrap();
    assert_eq!(
        forbid.config.cut_constraints.forbid,
        vec![forbidden.clone()]
    );
    assert!(!cut_tensors(&forbid).contains(&forbidden));
    let (code, _, err) = pipecut(&["check", forbid_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 0, "{err}");

    // Module boundaries only: every stage starts at a layer (`h.N`, the embeddings or the head).
    let layers_path = dir.path().join("layers.json");
    let mut layer_args = args.to_vec();
    layer_args.push("--cut-between-layers");
    let layers = Plan::from_json(&partition_to(&layers_path, gpt2, &layer_args)).unwrap();
    assert!(layers.config.cut_constraints.between_layers_only);
    for stage in &layers.stages[1..] {
        assert!(
            stage.first_node.ends_with("ln_1/LayerNormalization")
                || stage.first_node.contains("ln_f"),
            "stage {} starts inside a layer at {}",
            stage.stage,
            stage.first_node
        );
    }
    let (code, _, err) = pipecut(&["check", layers_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 0, "{err}");

    // A pinned cut: the tensor crosses a boundary in the plan; written by hand into a plan
    // that keeps it inside a stage, `check` refuses it.
    let pinned_tensor = "/transformer/h.1/mlp/act/Mul_1_output_0";
    assert!(!cut_tensors(&kept).iter().any(|t| t == pinned_tensor));
    let pin_path = dir.path().join("pin.json");
    let mut pin_args = args.to_vec();
    pin_args.extend(["--pin-cut", pinned_tensor]);
    let pinned = Plan::from_json(&partition_to(&pin_path, gpt2, &pin_args)).unwrap();
    assert_eq!(
        pinned.config.cut_constraints.pin,
        vec![pinned_tensor.to_string()]
    );
    assert!(cut_tensors(&pinned).iter().any(|t| t == pinned_tensor));
    let (code, _, err) = pipecut(&["check", pin_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 0, "{err}");
    let mut edited: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept_path).unwrap()).unwrap();
    edited["config"]["cut_constraints"]["pin"] = serde_json::json!([pinned_tensor]);
    let edited_path = dir.path().join("pin_edited.json");
    std::fs::write(&edited_path, edited.to_string()).unwrap();
    let (code, _, err) = pipecut(&["check", edited_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("but a cut is pinned there (--pin-cut)"),
        "{err}"
    );

    // The default plan with the constraint written in by hand: `check` names the cut.
    let mut edited: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept_path).unwrap()).unwrap();
    edited["config"]["cut_constraints"]["forbid"] = serde_json::json!([forbidden]);
    let edited_path = dir.path().join("edited.json");
    std::fs::write(&edited_path, edited.to_string()).unwrap();
    let (code, _, err) = pipecut(&["check", edited_path.to_str().unwrap(), gpt2]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("tensor '{forbidden}' crosses from stage"))
            && err.contains("config.cut_constraints"),
        "{err}"
    );

    let (code, _, err) = pipecut(&[
        "partition",
        gpt2,
        "--stages",
        "2",
        "--cluster",
        "1x2xH100-SXM",
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
        "--forbid-cut",
        "nope",
        "--out",
        dir.path().join("x.json").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--forbid-cut 'nope': the model has no tensor of that name"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The audit's forged claims (issue 38): a heuristic plan relabelled "optimal" with its bound and
/// gap edited to match, under every proof a forger could name, and an optimal plan whose cut
/// constraint was switched off. Each is refused naming what fails; the honest plans pass.
#[test]
fn check_refuses_a_relabelled_optimum_and_a_switched_off_constraint() {
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let args = [
        "--cluster",
        "1x4xH100-SXM",
        "--stages",
        "4",
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
    ];
    let solve = |solver: &str| {
        let path = dir.path().join(format!("{solver}.json"));
        let mut with_solver = args.to_vec();
        with_solver.extend(["--solver", solver]);
        let text = partition_to(&path, model, &with_solver);
        (
            path,
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        )
    };
    let check = |plan: &serde_json::Value, file: &str| {
        let path = dir.path().join(file);
        std::fs::write(&path, serde_json::to_string_pretty(plan).unwrap()).unwrap();
        let (code, _, stderr) = pipecut(&["check", path.to_str().unwrap(), model]);
        assert!(!stderr.contains("panicked"), "{stderr}");
        (code, stderr)
    };
    let (dp_path, heuristic) = solve("dp");
    let (auto_path, optimal) = solve("auto");
    assert_eq!(heuristic["summary"]["status"]["kind"], "heuristic");
    assert_eq!(optimal["summary"]["status"]["kind"], "optimal");
    let faster = optimal["summary"]["bottleneck_secs"].as_f64().unwrap();
    assert!(faster < heuristic["summary"]["bottleneck_secs"].as_f64().unwrap());
    assert!(heuristic["summary"].get("proof").is_none());
    let proof = optimal["summary"]["proof"].clone();
    for honest in [&dp_path, &auto_path] {
        let (code, _, err) = pipecut(&["check", honest.to_str().unwrap(), model]);
        assert_eq!(code, 0, "{err}");
    }

    // Relabelled: status optimal, the bound raised to the bottleneck and the gap zeroed.
    let mut forged = heuristic.clone();
    let summary = &mut forged["summary"];
    summary["status"] = serde_json::json!({"kind": "optimal"});
    summary["lower_bound_secs"] = summary["bottleneck_secs"].clone();
    summary["gap"] = serde_json::json!(0.0);
    let (code, err) = check(&forged, "forged.json");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("records no proof (summary.proof)"), "{err}");
    let named = [
        ("meets_bound", "the bound re-derived is"),
        ("meets_lp_relaxation", "the LP relaxation re-derived is"),
        ("chain", "the graph is not a chain"),
        (
            "search",
            "a search from the plan finds one with a smaller bottleneck",
        ),
    ];
    for (method, why) in named {
        forged["summary"]["proof"] = serde_json::json!({
            "method": method,
            "positions": proof["positions"],
        });
        let (code, err) = check(&forged, &format!("forged_{method}.json"));
        assert_eq!(code, 1, "{method}: {err}");
        assert!(err.contains("the status says optimal"), "{method}: {err}");
        assert!(err.contains(why), "{method}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }

    // Switched off: the MatMul-with-bias constraint the optimum was proven under. The proof was
    // about the constrained problem; with its size edited to match, the search finds the
    // unconstrained optimum faster than the plan.
    let mut unconstrained = optimal.clone();
    unconstrained["config"]["cut_constraints"]["bias_with_matmul"] = serde_json::json!(false);
    let (code, err) = check(&unconstrained, "switched_off.json");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("a cut constraint was changed"), "{err}");
    let nodes = optimal["model"]["nodes"].clone();
    unconstrained["summary"]["proof"]["positions"] = nodes;
    let (code, err) = check(&unconstrained, "switched_off_resized.json");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("smaller bottleneck"), "{err}");

    // A proof beside a status that is not optimal claims nothing it may keep.
    let mut stray = heuristic.clone();
    stray["summary"]["proof"] = proof;
    let (code, err) = check(&stray, "stray_proof.json");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("summary.proof"), "{err}");
}

/// A float32 graph input `[batch, 6]`, its first dim symbolic.
fn batch_by_six(name: &str) -> onnx_protobuf::ValueInfoProto {
    use onnx_protobuf::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    let mut input = common::tensor_value_info(name, 1, &[0, 6]);
    if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) =
        input.type_.as_mut().and_then(|t| t.value.as_mut())
    {
        t.shape.as_mut().unwrap().dim[0] = Dimension {
            value: Some(DimValue::DimParam("batch".into())),
            ..Default::default()
        };
    }
    input
}

/// Writes an opset-18 model of `ops` (op type, inputs, output; the last output is the model's
/// `y`) over `inputs` to `dir/name`.
fn write_model(
    dir: &Path,
    name: &str,
    ops: &[(&str, &[&str], &str)],
    inputs: Vec<onnx_protobuf::ValueInfoProto>,
) -> String {
    use onnx_protobuf::{Message, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
    let node = |&(op, inputs, output): &(&str, &[&str], &str)| NodeProto {
        name: format!("{op}_{output}"),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let graph = onnx_protobuf::GraphProto {
        name: name.into(),
        node: ops.iter().map(node).collect(),
        input: inputs,
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
    let path = dir.join(name);
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path.to_str().unwrap().to_string()
}

/// A model whose Reshape target is a graph input `r`: `x [batch, 6]` → Relu → Reshape(·, r) →
/// Neg → Sigmoid.
fn reshape_by_input_model(dir: &Path) -> String {
    let ops: [(&str, &[&str], &str); 4] = [
        ("Relu", &["x"], "a"),
        ("Reshape", &["a", "r"], "b"),
        ("Neg", &["b"], "c"),
        ("Sigmoid", &["c"], "y"),
    ];
    let r = common::tensor_value_info("r", 7, &[2]);
    write_model(
        dir,
        "reshape_by_input.onnx",
        &ops,
        vec![batch_by_six("x"), r],
    )
}

fn write_npy(path: &Path, tensor: pipecut::runtime::HostTensor) -> String {
    std::fs::write(path, pipecut::runtime::encode_npy(&tensor)).unwrap();
    path.to_str().unwrap().to_string()
}

/// Issue 36: a plan made with `--value` records the value, and `check`, `export` and `run` use
/// it without being told again; a value given again must be the plan's, in one line.
#[test]
fn a_plan_made_with_a_sample_value_is_checked_exported_and_run_without_it() {
    use pipecut::runtime::{HostTensor, TensorData};
    let dir = tempfile::tempdir().unwrap();
    let model = reshape_by_input_model(dir.path());
    let model = model.as_str();
    let r = write_npy(
        &dir.path().join("r.npy"),
        HostTensor::new(vec![2], TensorData::I64(vec![4, 3])).unwrap(),
    );
    let other_r = write_npy(
        &dir.path().join("r2.npy"),
        HostTensor::new(vec![2], TensorData::I64(vec![3, 4])).unwrap(),
    );
    let x: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) / 7.0).collect();
    let x = write_npy(
        &dir.path().join("x.npy"),
        HostTensor::new(vec![4, 6], TensorData::F32(x)).unwrap(),
    );
    let plan_path = dir.path().join("plan.json");
    let value_arg = format!("r={r}");
    let text = partition_to(
        &plan_path,
        model,
        &[
            "--dim",
            "batch=2",
            "--value",
            &value_arg,
            "--stages",
            "2",
            "--microbatches",
            "2",
            "--cluster",
            "1x2xH100-SXM",
        ],
    );
    let plan = Plan::from_json(&text).unwrap();
    let recorded = &plan.model.values["r"];
    assert_eq!(recorded.data, pipecut::plan::ValueData::Ints(vec![4, 3]));
    assert_eq!(recorded.sha256, recorded.digest());
    let plan_arg = plan_path.to_str().unwrap();

    let (code, out, err) = pipecut(&["check", plan_arg, model]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("valid plan"), "{out}");
    let stages = dir.path().join("stages");
    let stages_arg = stages.to_str().unwrap();
    let (code, _, err) = pipecut(&["export", plan_arg, model, "--out-dir", stages_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(stages.join("stage_1.onnx").exists());
    let out_dir = dir.path().join("out");
    let input_arg = format!("x={x}");
    let (code, _, err) = pipecut(&[
        "run",
        plan_arg,
        model,
        "--input",
        &input_arg,
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let y = pipecut::runtime::read_npy(&out_dir.join("y.npy")).unwrap();
    assert_eq!(y.tensor.shape(), &[8, 3], "two micro-batches of [4, 3]");

    // A value given again must be the plan's, and said in one line.
    let other_arg = format!("r={other_r}");
    let (code, _, err) = pipecut(&[
        "export",
        plan_arg,
        model,
        "--out-dir",
        stages_arg,
        "--value",
        &other_arg,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--value r is not the value the plan was made with"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, _, err) = pipecut(&[
        "run",
        plan_arg,
        model,
        "--input",
        &input_arg,
        "--input",
        &other_arg,
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("input 'r' is not the sample value the plan was made with"),
        "{err}"
    );

    // A hand-edited value no longer matches its digest.
    let edited = text.replacen("          4,\n", "          5,\n", 1);
    assert_ne!(edited, text);
    let edited_path = dir.path().join("edited.json");
    std::fs::write(&edited_path, edited).unwrap();
    let (code, _, err) = pipecut(&["check", edited_path.to_str().unwrap(), model]);
    assert_ne!(code, 0);
    assert!(err.contains("the value was edited"), "{err}");
    let renamed = text.replacen("\"r\": {", "\"q\": {", 1);
    assert_ne!(renamed, text);
    std::fs::write(&edited_path, renamed).unwrap();
    let (code, _, err) = pipecut(&["check", edited_path.to_str().unwrap(), model]);
    assert_ne!(code, 0);
    assert!(
        err.contains("the plan records a sample value for 'q', which is not an input"),
        "{err}"
    );

    // The outputs are onnxruntime's, micro-batch by micro-batch.
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(
            common::Need::Venv,
            "comparing with onnxruntime: .venv/bin/python is absent (bash fixtures/pyenv.sh)",
        );
        return;
    }
    let script = "import sys, numpy as np, onnxruntime as ort\n\
        m, x, r, y = sys.argv[1:]\n\
        s = ort.InferenceSession(m, providers=['CPUExecutionProvider'])\n\
        x, r = np.load(x), np.load(r)\n\
        ref = np.concatenate([s.run(None, {'x': x[i:i + 2], 'r': r})[0] for i in (0, 2)])\n\
        got = np.load(y)\n\
        assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)\n\
        assert np.allclose(got, ref, atol=1e-6), (got, ref)\n";
    let status = Command::new(&python)
        .args(["-c", script, model, &x, &r])
        .arg(out_dir.join("y.npy"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "pipecut's outputs differ from onnxruntime's"
    );
}

/// Issue 36: `export` types a model whose shapes need sizes at the plan's dims without `--dim`
/// (a Squeeze without axes squeezes only dims known to be 1), and says so.
#[test]
fn export_uses_the_plans_dims_where_the_model_needs_them() {
    let dir = tempfile::tempdir().unwrap();
    let ops: [(&str, &[&str], &str); 3] = [
        ("Relu", &["x"], "a"),
        ("Squeeze", &["a"], "b"),
        ("Neg", &["b"], "y"),
    ];
    let model = write_model(dir.path(), "squeeze.onnx", &ops, vec![batch_by_six("x")]);
    let plan = dir.path().join("plan.json");
    partition_to(
        &plan,
        &model,
        &["--dim", "batch=1", "--stages", "2", "--cluster", "1x2xL4"],
    );
    let stages = dir.path().join("stages");
    let (code, _, err) = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        &model,
        "--out-dir",
        stages.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("note: the stage files are typed at the plan's dims (batch=1)")
            && err.contains("Squeeze without axes needs concrete dims"),
        "{err}"
    );
    assert!(stages.join("stage_1.onnx").exists());
}

/// A plan whose figures are not all finite is refused before it is written: JSON would say
/// `null`, which `check` refuses.
#[test]
fn a_plan_with_a_non_finite_figure_is_refused_before_writing() {
    let text =
        std::fs::read_to_string(common::root().join("tests/malformed/plans/valid.json")).unwrap();
    let mut plan = pipecut::plan::Plan::from_json(&text).unwrap();
    plan.ensure_finite().unwrap();
    plan.stages[1].compute_secs = f64::INFINITY;
    let err = plan.ensure_finite().unwrap_err().to_string();
    assert!(
        err.contains("stages[1].compute_secs came out as inf"),
        "{err}"
    );
    plan.stages[1].compute_secs = 0.0;
    plan.summary.bottleneck_secs = f64::NAN;
    let err = plan.ensure_finite().unwrap_err().to_string();
    assert!(
        err.contains("summary.bottleneck_secs came out as NaN"),
        "{err}"
    );
}

/// mlp.onnx with three more elementwise nodes after each hidden layer's Relu (Sigmoid, Tanh,
/// Abs, the last keeping the Relu's output name): every hidden tensor is `[batch, 128]` fp32,
/// and a layer keeps five of them for its backward but its weight gradient reads two.
fn mlp_with_elementwise_tails(dir: &Path) -> String {
    edited_mlp(dir, "mlp_tails.onnx", |graph| {
        let mut nodes = Vec::new();
        for mut node in std::mem::take(&mut graph.node) {
            if node.op_type != "Relu" {
                nodes.push(node);
                continue;
            }
            let out = node.output[0].clone();
            node.output[0] = format!("{out}_relu");
            nodes.push(node);
            let mut prev = format!("{out}_relu");
            for (i, op) in ["Sigmoid", "Tanh", "Abs"].into_iter().enumerate() {
                let next = if i == 2 {
                    out.clone()
                } else {
                    format!("{out}_{op}")
                };
                nodes.push(onnx_protobuf::NodeProto {
                    name: format!("{out}/{op}"),
                    op_type: op.into(),
                    input: vec![prev],
                    output: vec![next.clone()],
                    ..Default::default()
                });
                prev = next;
            }
        }
        graph.node = nodes;
    })
}

/// Issue 38: under ZB-H1, stage d of K holds K − d micro-batches before their B (all their
/// activations) and d past B, which keep only their received tensors and what W reads (a
/// weight node's node-made inputs and its outputs' gradients); just after a B, K − d − 1 and
/// d + 1. The peaks `partition` prints equal that count by hand on a chain whose every tensor
/// size is known. At the smallest memory where some cut fits by it, the charge of K whole
/// micro-batches on every stage (pipecut's before) fits no cut, and `partition` finds the
/// plan; `check` accepts it and refuses the last stage's peak or weight bytes edited down.
#[test]
fn zero_bubble_charges_one_f_one_b_counts_and_weight_inputs_past_b() {
    let dir = tempfile::tempdir().unwrap();
    let model = mlp_with_elementwise_tails(dir.path());
    let batch = 64u64;
    let hidden = 128 * batch * 4;
    // The chain in order, each node's output bytes, what its weight gradient reads (layers.0
    // reads the graph input, free as every graph input is) and its weight elements.
    let mut chain: Vec<(String, u64, u64, u64)> = Vec::new();
    for layer in [0, 2, 4, 6] {
        let fan_in = if layer == 0 { 64 } else { 128 };
        let reads = if layer == 0 { hidden } else { 2 * hidden };
        chain.push((format!("layers.{layer}"), hidden, reads, 128 * fan_in + 128));
        for _ in 0..4 {
            chain.push((format!("after layers.{layer}"), hidden, 0, 0));
        }
    }
    let head = 10 * batch * 4;
    chain.push(("head".into(), head, hidden + head, 10 * 128 + 10));
    chain.push(("softmax".into(), head, 0, 0));
    let sum = |range: std::ops::Range<usize>, field: fn(&(String, u64, u64, u64)) -> u64| {
        chain[range].iter().map(field).sum::<u64>()
    };
    let args = |headroom: &str| {
        vec![
            "--cluster",
            "1x2xH100-SXM",
            "--stages",
            "2",
            "--dim",
            "batch=64",
            "--mode",
            "training",
            "--schedule",
            "zero-bubble",
            "--microbatches",
            "8",
            "--memory-headroom",
            headroom,
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let partition = |name: &str, headroom: &str| {
        let path = dir.path().join(name);
        let args = args(headroom);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = partition_to(&path, &model, &args);
        (path, Plan::from_json(&text).unwrap())
    };
    let (_, roomy) = partition("roomy.json", "0.1");
    // Footprint bytes per weight element (weight, gradient, optimizer state), from the plan.
    let elements: u64 = chain
        .iter()
        .filter(|c| {
            roomy.stages[0]
                .nodes
                .iter()
                .any(|n| n.contains(&format!("/{}/", c.0)))
        })
        .map(|c| c.3)
        .sum();
    assert!(elements > 0 && roomy.stages[0].param_bytes % elements == 0);
    let per_element = roomy.stages[0].param_bytes / elements;

    // Stage 1 from chain position `cut`: (new peaks, old peaks) by hand. K = 2, m = 8: stage
    // 0 at (2 before B, 0 past) or (1, 1); stage 1 at (1, 1) or (0, 2).
    let n = chain.len();
    let by_hand = |cut: usize| {
        let stage = |range: std::ops::Range<usize>, received: u64, d: u64| {
            let params = sum(range.clone(), |c| c.3) * per_element;
            let (a, w) = (sum(range.clone(), |c| c.1), sum(range, |c| c.2));
            let moment =
                |before: u64, past: u64| (before + past) * received + before * a + past * w;
            let new = params + moment(2 - d, d).max(moment(1 - d, d + 1));
            (new, params + 2 * (a + received), w)
        };
        [stage(0..cut, 0, 0), stage(cut..n, chain[cut - 1].1, 1)]
    };
    let smallest = |pick: fn(&(u64, u64, u64)) -> u64| {
        (1..n)
            .map(|cut| by_hand(cut).iter().map(pick).max().unwrap())
            .min()
            .unwrap()
    };
    let (new_fit, old_fit) = (smallest(|s| s.0), smallest(|s| s.1));
    assert!(old_fit > new_fit + 4096, "old {old_fit} new {new_fit}");

    // Squeezed to just above the new charge's smallest fit: the old charge fits no cut there.
    let memory = roomy.stages[0].device_memory_bytes as f64;
    let headroom = format!("{:.17}", 1.0 - (new_fit + 1024) as f64 / memory);
    let (path, plan) = partition("tight.json", &headroom);
    let capacity = plan.stages[0].capacity_bytes;
    assert!(capacity >= new_fit && capacity < old_fit, "{capacity}");
    let cut = plan.stages[0].node_count;
    let expected = by_hand(cut);
    for (s, stage) in plan.stages.iter().enumerate() {
        let (new, old, weight_inputs) = expected[s];
        assert_eq!(stage.weight_input_bytes, weight_inputs, "stage {s}");
        assert_eq!(stage.in_flight_microbatches, 2 - s as u64, "stage {s}");
        assert_eq!(stage.peak_memory_bytes, new, "stage {s}");
        assert!(new <= capacity, "stage {s}");
        if s == 1 {
            assert!(old > capacity, "the old charge would have refused this cut");
        }
    }
    let (code, _, stderr) = pipecut(&["check", path.to_str().unwrap(), &model]);
    assert_eq!(code, 0, "{stderr}");

    for field in ["peak_memory_bytes", "weight_input_bytes"] {
        let mut edited: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let value = edited["stages"][1][field].as_u64().unwrap();
        edited["stages"][1][field] = serde_json::json!(value - 1);
        let forged = dir.path().join(format!("forged_{field}.json"));
        std::fs::write(&forged, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
        let (code, _, stderr) = pipecut(&["check", forged.to_str().unwrap(), &model]);
        assert_eq!(code, 1, "{field}: {stderr}");
        assert!(stderr.contains(field), "{field}: {stderr}");
    }
}
