//! Planning on measured node times and on device profiles given as files (issue 16): `pipecut
//! profile`, `--profile`, onnxruntime traces, `--device-profile`, `pipecut catalog`.

mod common;

use std::path::Path;
use std::process::Command;

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

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

const GPT2: &str = "fixtures/models/gpt2_tiny.onnx";
const DIMS: [&str; 4] = ["--dim", "batch=2", "--dim", "seq=16"];

fn profile_gpt2(dir: &Path) -> String {
    let times = path(dir, "times.json");
    let mut args = vec![
        "profile",
        GPT2,
        "--threads",
        "1",
        "--repeats",
        "3",
        "--warmup",
        "1",
    ];
    args.extend(DIMS);
    args.extend(["--out", &times]);
    let (code, out, err) = pipecut(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("177 nodes on CPU-x86-64-AVX2-2C"), "{out}");
    times
}

#[test]
fn a_profile_measures_every_node_and_plans_check_and_run_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let times = profile_gpt2(dir.path());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&times).unwrap()).unwrap();
    assert_eq!(json["schema"], "pipecut-node-times-v1");
    assert_eq!(json["model"]["dims"]["seq"], 16);
    assert_eq!(json["measured_with"]["repeats"], 3);
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 177);
    for node in nodes {
        let (p10, median, p90) = (
            node["p10_secs"].as_f64().unwrap(),
            node["secs"].as_f64().unwrap(),
            node["p90_secs"].as_f64().unwrap(),
        );
        assert!(p10 <= median && median <= p90, "{node}");
    }

    let plan = path(dir.path(), "plan.json");
    let mut args = vec!["partition", GPT2, "--devices", "cpu,cpu", "--stages", "2"];
    args.extend(DIMS);
    args.extend(["--profile", &times, "--out", &plan]);
    let (code, out, err) = pipecut(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("177 of 177 nodes costed from times measured"),
        "{err}"
    );
    assert!(out.contains("peak fp32 of 2 CPUs"), "{out}");
    // The stage times are the measured nodes' sums: within the whole run's time.
    let plan_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let recorded = &plan_json["config"]["measured_node_times"][0];
    assert_eq!(recorded["device"], "CPU-x86-64-AVX2-2C");
    let stage_sum: f64 = plan_json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["compute_secs"].as_f64().unwrap())
        .sum();
    let node_sum: f64 = nodes.iter().map(|n| n["secs"].as_f64().unwrap()).sum();
    assert!(
        (stage_sum - node_sum).abs() < 1e-9 * node_sum.max(1.0),
        "{stage_sum} vs {node_sum}\n{out}"
    );

    // check and run need the same times: without them the figures are the roofline's.
    let (code, _, err) = pipecut(&["check", &plan, GPT2]);
    assert_ne!(code, 0);
    assert!(
        err.contains("pass the plan's node-times file with --profile"),
        "{err}"
    );
    let (code, out, err) = pipecut(&["check", &plan, GPT2, "--profile", &times]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("valid plan"), "{out}");
    let outputs = path(dir.path(), "out");
    let (code, _, err) = pipecut(&[
        "run",
        &plan,
        GPT2,
        "--profile",
        &times,
        "--microbatches",
        "2",
        "--output-dir",
        &outputs,
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_profile_at_other_dims_or_for_another_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let times = profile_gpt2(dir.path());
    let (code, _, err) = pipecut(&[
        "partition",
        GPT2,
        "--devices",
        "cpu,cpu",
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
        "--profile",
        &times,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("measured with batch=2") && err.contains("batch=4"),
        "{err}"
    );
    let mut args = vec![
        "partition",
        GPT2,
        "--cluster",
        "1x2xL4",
        "--profile",
        &times,
    ];
    args.extend(DIMS);
    let (code, _, err) = pipecut(&args);
    assert_eq!(code, 2);
    assert!(err.contains("not a device of this plan (L4)"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn onnxruntime_traces_plan_like_pipecuts_own_times() {
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(common::Need::Venv, "no .venv: run bash fixtures/pyenv.sh");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // onnxruntime's profiler, its optimizer off so that its nodes are the model's.
    let script = r#"
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions()
o.enable_profiling = True
o.profile_file_prefix = sys.argv[2]
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
o.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
feed = {i.name: np.random.rand(4, *i.shape[1:]).astype(np.float32) for i in s.get_inputs()}
for _ in range(5):
    s.run(None, feed)
print(s.end_profiling())
"#;
    let prefix = path(dir.path(), "ort");
    let out = Command::new(&python)
        .args(["-c", script, "fixtures/models/mlp.onnx", &prefix])
        .current_dir(common::root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let trace = if Path::new(&trace).is_absolute() {
        trace
    } else {
        common::root().join(trace).display().to_string()
    };
    let times = path(dir.path(), "times.json");
    let (code, out, err) = pipecut(&[
        "profile",
        "fixtures/models/mlp.onnx",
        "--dim",
        "batch=4",
        "--from-onnxruntime",
        &trace,
        "--device",
        "H100-SXM",
        "--out",
        &times,
    ]);
    let _ = std::fs::remove_file(&trace);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("onnxruntime:CPUExecutionProvider"), "{out}");
    let (code, _, err) = pipecut(&[
        "partition",
        "fixtures/models/mlp.onnx",
        "--cluster",
        "1x2xH100-SXM",
        "--dim",
        "batch=4",
        "--profile",
        &times,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("10 of 10 nodes costed from times measured on H100-SXM (onnxruntime"),
        "{err}"
    );
}

#[test]
fn device_profiles_are_files_a_plan_needs_again() {
    let dir = tempfile::tempdir().unwrap();
    // A user's own device: the cpu profile under another name, with more memory.
    let text = std::fs::read_to_string(common::root().join("cost-models/devices/cpu.json"))
        .unwrap()
        .replace("CPU-x86-64-AVX2-2C", "my-workstation")
        .replace("\"cpu\", ", "")
        .replace("8589934592", "68719476736");
    std::fs::create_dir(dir.path().join("devices")).unwrap();
    let device = path(dir.path(), "devices/my-workstation.json");
    std::fs::write(&device, text).unwrap();
    let plan = path(dir.path(), "plan.json");
    let list = format!("{device},{device}");
    let mut args = vec![
        "partition",
        GPT2,
        "--devices",
        &list,
        "--stages",
        "2",
        "--out",
        &plan,
    ];
    args.extend(DIMS);
    let (code, out, err) = pipecut(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("my-workstation"), "{out}");
    let (code, _, err) = pipecut(&["check", &plan, GPT2]);
    assert_ne!(code, 0);
    assert!(
        err.contains("'my-workstation'") && err.contains("--device-profile"),
        "{err}"
    );
    let (code, _, err) = pipecut(&["check", &plan, GPT2, "--device-profile", &device]);
    assert_eq!(code, 0, "{err}");
    // An edited profile is not the one the plan was made with.
    let edited = std::fs::read_to_string(&device)
        .unwrap()
        .replace("68719476736", "68719476737");
    std::fs::write(&device, edited).unwrap();
    let (code, _, err) = pipecut(&["check", &plan, GPT2, "--device-profile", &device]);
    assert_ne!(code, 0);
    assert!(err.contains("device:my-workstation"), "{err}");
    // Folders in PIPECUT_COST_MODELS join every command's catalog.
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(["catalog"])
        .env("PIPECUT_COST_MODELS", dir.path())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("my-workstation") && listing.contains("Host-Memory"),
        "{listing}"
    );
}

#[test]
fn short_names_two_profiles_share_are_refused_with_the_choices() {
    let (code, _, err) = pipecut(&[
        "partition",
        GPT2,
        "--cluster",
        "1x2xA100",
        "--dim",
        "batch=1",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("ambiguous") && err.contains("A100-SXM-40GB, A100-SXM-80GB"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn bench_plans_reports_what_the_selection_ran() {
    let (code, out, err) = pipecut(&[
        "bench-plans",
        GPT2,
        "--dim",
        "batch=2",
        "--dim",
        "seq=16",
        "--rounds",
        "1",
        "--microbatches",
        "2",
        "--select-by-running",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let candidates = report["selection"]["candidates"].as_array().unwrap();
    let origin = |c: &serde_json::Value| c["origin"].as_str().unwrap().to_string();
    assert!(
        origin(&candidates[0]).starts_with("cost model's optimum"),
        "{out}"
    );
    assert!(candidates.len() >= 2, "{out}");
    let chosen = candidates.iter().filter(|c| c["chosen"] == true).count();
    assert_eq!(chosen, 1, "{out}");
    // The peers' own plans run too, labelled with the peers' names: on the roofline, gpt2's
    // DeepSpeed and torchgpipe splits (all one plan) are predicted 9% slower than the optimum,
    // within the window.
    let peers: Vec<String> = candidates
        .iter()
        .map(origin)
        .filter(|o| o.starts_with("the plan of "))
        .collect();
    assert_eq!(peers.len(), 1, "{out}");
    assert!(
        peers[0].contains("torchgpipe 0.0.7 balance_by_time"),
        "{out}"
    );
    // A runoff, where there was one, is between the plan chosen first and another, and the
    // chosen plan is one of them.
    if let Some(runoff) = report["selection"].get("runoff") {
        let at = |key: &str| &candidates[runoff[key].as_u64().unwrap() as usize];
        assert!(at("incumbent")["chosen"] == true || at("challenger")["chosen"] == true);
    }
    // A peer's row runs the same stages as pipecut's exactly where the chosen candidate is
    // (also) that peer's plan, and says so.
    let chosen = candidates.iter().find(|c| c["chosen"] == true).unwrap();
    for row in &report["rows"].as_array().unwrap()[1..] {
        let plan = row["plan"].as_str().unwrap();
        if !plan.starts_with("pipecut") {
            assert_eq!(
                row["same_stages_as_pipecut"] == true,
                origin(chosen).contains(plan),
                "{plan}: {out}"
            );
        }
    }
    // The plan benchmarked first is the one the selection chose.
    let first = report["rows"][0]["plan"].as_str().unwrap();
    assert_eq!(
        candidates[0]["chosen"] == true,
        first == "pipecut",
        "{first}: {out}"
    );
}

#[test]
fn bench_plans_runs_the_optimisers_plan_and_the_baselines() {
    let (code, out, err) = pipecut(&[
        "bench-plans",
        GPT2,
        "--dim",
        "batch=2",
        "--dim",
        "seq=16",
        "--rounds",
        "1",
        "--microbatches",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        report.get("selection").is_none(),
        "no selection asked: {out}"
    );
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows[0]["plan"], "pipecut");
    assert_eq!(rows[0]["measured_ratio"], 1.0);
    assert_eq!(
        rows[0]["measured_ratio_range"],
        serde_json::json!([1.0, 1.0])
    );
    assert!(rows.len() >= 2, "{out}");
    // Each counted round's stage times, one per stage, all of them measured.
    for row in rows {
        let rounds = row["stage_secs_by_round"].as_array().unwrap();
        assert_eq!(rounds.len(), 1, "{out}");
        let stages = rounds[0].as_array().unwrap();
        assert_eq!(stages.len(), 2, "{out}");
        assert!(stages.iter().all(|s| s.as_f64().unwrap() > 0.0), "{out}");
    }
    // How busy the rest of the machine was: a count of cores on Linux, and `busy` agrees with it.
    if cfg!(target_os = "linux") {
        let others = report["other_cores"]
            .as_f64()
            .expect("Linux reports other_cores");
        assert!(others >= 0.0, "{out}");
        assert_eq!(report["busy"].as_bool(), Some(others > 0.25), "{out}");
    }
    for row in rows {
        for key in ["measured_shares", "predicted_shares"] {
            let shares: Vec<f64> = row[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(shares.len(), 2, "{row}");
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{row}");
        }
        let range: Vec<f64> = row["measured_ratio_range"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let median = row["measured_ratio"].as_f64().unwrap();
        assert!(range[0] <= median && median <= range[1], "{row}");
        // pipecut's predicted bottleneck is the smallest (it is proven optimal on these costs).
        assert!(
            row["predicted_ratio"].as_f64().unwrap() >= 1.0 - 1e-9,
            "{row}"
        );
    }
}

#[test]
fn plan_cluster_keeps_to_the_measured_micro_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    let times = profile_gpt2(dir.path());
    let (code, out, err) = pipecut(&[
        "plan-cluster",
        GPT2,
        "--cluster",
        "1x2xcpu",
        "--global-batch",
        "8",
        "--dim",
        "seq=16",
        "--profile",
        &times,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("micro-batch size at batch=2"), "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["model"]["dims"]["batch"], 2, "{out}");
    assert_eq!(
        plan["config"]["measured_node_times"][0]["device"],
        "CPU-x86-64-AVX2-2C"
    );
    let (code, _, err) = pipecut(&[
        "plan-cluster",
        GPT2,
        "--cluster",
        "1x2xcpu",
        "--global-batch",
        "8",
        "--dim",
        "seq=16",
        "--profile",
        &times,
        "--microbatch-sizes",
        "4",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("measured at batch=2"), "{err}");
}

/// mlp's node times with every Gemm at 1 ms and every other node at 1 µs: its five Gemms split
/// 3 | 2 or 2 | 3 with the same bottleneck, so the optimum has a rival to run against.
fn tied_mlp_times(dir: &Path) -> String {
    let measured = path(dir, "measured.json");
    let (code, _, err) = pipecut(&[
        "profile",
        "fixtures/models/mlp.onnx",
        "--dim",
        "batch=64",
        "--threads",
        "1",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        &measured,
    ]);
    assert_eq!(code, 0, "{err}");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&measured).unwrap()).unwrap();
    for node in json["nodes"].as_array_mut().unwrap() {
        let secs = if node["op"] == "Gemm" { 1e-3 } else { 1e-6 };
        for field in ["secs", "p10_secs", "p90_secs"] {
            node[field] = serde_json::json!(secs);
        }
    }
    let tied = path(dir, "tied.json");
    std::fs::write(&tied, serde_json::to_string(&json).unwrap()).unwrap();
    tied
}

#[test]
fn select_by_running_runs_the_optimum_and_its_rivals_and_check_audits_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let times = tied_mlp_times(dir.path());
    let plan = path(dir.path(), "plan.json");
    let (code, out, err) = pipecut(&[
        "partition",
        "fixtures/models/mlp.onnx",
        "--dim",
        "batch=64",
        "--devices",
        "cpu,cpu",
        "--stages",
        "2",
        "--profile",
        &times,
        "--select-by-running",
        "2",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("selected by running"), "{out}");
    let text = std::fs::read_to_string(&plan).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let selection = &json["summary"]["measured_selection"];
    let candidates = selection["candidates"].as_array().unwrap();
    assert!(candidates.len() >= 2, "{selection}");
    let origin = candidates[0]["origin"].as_str().unwrap();
    assert!(origin.starts_with("cost model's optimum"), "{origin}");
    assert_eq!(candidates.iter().filter(|c| c["chosen"] == true).count(), 1);
    // Each candidate is written as the plan with some nodes moved: none for the chosen one.
    for c in candidates {
        let moves = c["moved"].as_array().map_or(0, Vec::len);
        assert_eq!(moves == 0, c["chosen"] == true, "{c}");
    }
    let rival = &candidates[1];
    // The rival's prediction is a tie: both put three Gemms on one stage.
    let predicted = |c: &serde_json::Value| c["predicted_bottleneck_secs"].as_f64().unwrap();
    assert!((predicted(rival) / predicted(&candidates[0]) - 1.0).abs() < 0.01);
    let status = &json["summary"]["status"];
    if candidates[0]["chosen"] == true {
        assert_ne!(status["reason"], "selected_by_running", "{status}");
    } else {
        assert_eq!(status["reason"], "selected_by_running", "{status}");
    }
    let check = |plan: &str| {
        pipecut(&[
            "check",
            plan,
            "fixtures/models/mlp.onnx",
            "--profile",
            &times,
        ])
    };
    let (code, _, err) = check(&plan);
    assert_eq!(code, 0, "{err}");

    // A rival's prediction edited, or a status that hides the choice: refused.
    let edited = path(dir.path(), "edited.json");
    let mut wrong = json.clone();
    wrong["summary"]["measured_selection"]["candidates"][1]["predicted_bottleneck_secs"] =
        serde_json::json!(1.0);
    std::fs::write(&edited, serde_json::to_string(&wrong).unwrap()).unwrap();
    let (code, _, err) = check(&edited);
    assert_ne!(code, 0);
    assert!(err.contains("measured_selection"), "{err}");
    let mut wrong = json.clone();
    let optimum_chosen = candidates[0]["chosen"] == true;
    wrong["summary"]["status"] = if optimum_chosen {
        serde_json::json!({"kind": "heuristic", "reason": "selected_by_running"})
    } else {
        serde_json::json!({"kind": "heuristic", "reason": "dp_only"})
    };
    std::fs::write(&edited, serde_json::to_string(&wrong).unwrap()).unwrap();
    let (code, _, err) = check(&edited);
    assert_ne!(code, 0);
    assert!(err.contains("measured_selection"), "{err}");
    // A runoff that names a candidate the list does not have: refused.
    let mut wrong = json.clone();
    wrong["summary"]["measured_selection"]["runoff"] = serde_json::json!({
        "rounds": 4, "incumbent": 0, "challenger": 99,
        "measured_ratio": 0.98, "measured_ratio_range": [0.97, 0.99]
    });
    std::fs::write(&edited, serde_json::to_string(&wrong).unwrap()).unwrap();
    let (code, _, err) = check(&edited);
    assert_ne!(code, 0);
    assert!(err.contains("runoff"), "{err}");
}

#[test]
fn select_by_running_refuses_stages_it_cannot_run_here() {
    let (code, _, err) = pipecut(&[
        "partition",
        "fixtures/models/mlp.onnx",
        "--dim",
        "batch=64",
        "--cluster",
        "1x2xH100-SXM",
        "--stages",
        "2",
        "--select-by-running",
        "2",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--select-by-running") && err.contains("not a CPU"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
