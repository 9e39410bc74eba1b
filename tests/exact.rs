//! The exact side of partitioning at issue 17's scale: lower bounds that prove a plan's gap on
//! the 175B-shaped model, and exact feasibility when no contiguous plan fits memory.

use pipecut::cost::{Catalog, Cluster};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{Planner, SolverChoice, StageCount};

mod common;

/// GPT-3-175B's shape on 64 H100s: 96 layers on 64 stages, so some stage holds two layers'
/// large products. The average-work bound (22.22 ms) left the DP's 24.27 ms plan "within
/// 8.48%"; the granularity bound (indivisible cut nodes) proves it within 2%.
#[test]
fn the_granularity_bound_proves_the_175b_plan_at_64_stages_within_two_percent() {
    let path = common::gpt3_with_placeholder_weights();
    let mut model = pipecut::onnx::load_model(&path).unwrap();
    ShapeInference::new(DimBindings::new().bind("batch", 1).bind("seq", 2048))
        .run(&mut model.graph)
        .unwrap();
    let cluster = Cluster::parse("8x8xH100-SXM", &Catalog::builtin()).unwrap();
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(64))
        .with_solver(SolverChoice::Dp)
        .solve()
        .unwrap();
    let average = solution.problem.lower_bound_secs();
    eprintln!(
        "175B K=64: plan {:.3} ms, average bound {:.3} ms, bound {:.3} ms, gap {:.2}%",
        solution.evaluation.bottleneck_secs * 1e3,
        average * 1e3,
        solution.lower_bound_secs * 1e3,
        solution.gap() * 100.0
    );
    assert!(solution.lower_bound_secs > average * 1.05);
    assert!(solution.gap() < 0.02, "gap {}", solution.gap());
}

/// Issue 17's memory-tight point: no contiguous cut of the DP's order fits, but a convex plan
/// does; the exact feasibility search finds it, and `check` accepts it. At a headroom where
/// nothing fits, the error names the smallest memory that would.
#[test]
fn a_convex_plan_that_fits_is_found_where_no_contiguous_cut_does() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let model = common::fixture("gpt2_tiny");
    let partition = |stages: &str, headroom: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .arg("partition")
            .arg(&model)
            .args([
                "--cluster",
                "1x4xH100-SXM",
                "--mode",
                "training",
                "--stages",
                stages,
            ])
            .args(["--dim", "batch=8", "--dim", "seq=64", "--solver", "dp"])
            .args(["--time-limit", "60s", "--memory-headroom", headroom])
            .arg("--out")
            .arg(&plan)
            .output()
            .unwrap()
    };
    let solved = partition("4", "0.9998099207938139");
    let stderr = String::from_utf8_lossy(&solved.stderr);
    assert!(solved.status.success(), "{stderr}");
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .arg("check")
        .arg(&plan)
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );

    // `--stages auto` too: no count's contiguous cuts fit, so the exact solver decides at the
    // largest count, as for a fixed one.
    let auto = partition("auto", "0.9998099207938139");
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{stderr}");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(written["stages"].as_array().unwrap().len(), 4);

    // Far below what any plan needs; two stages keep the proof quick in a debug build.
    let refused = partition("2", "0.99995");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("no convex partition fits either (proven by the exact solver): the smallest memory that fits is"),
        "{stderr}"
    );
}

/// Issue 38's false "does not fit": at issue 17's memory-tight point a plan fits (`check`
/// accepts it), yet `plan-cluster` said "no configuration of 4 devices holds the model" with
/// exit code 1, having tried only the DP's contiguous cuts; and `partition` under a work
/// budget, where the exact memory search cannot run, said "does not fit" without deciding.
/// Now `plan-cluster` decides exactly and plans it, and an undecided answer exits 3 saying so.
#[test]
fn a_tight_point_is_planned_or_left_undecided_never_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let model = common::fixture("gpt2_tiny");
    let headroom = "0.9998099207938139";
    let pipecut = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let model_arg = model.to_str().unwrap();
    let plan_arg = plan.to_str().unwrap();
    let (code, stderr) = pipecut(&[
        "plan-cluster",
        model_arg,
        "--cluster",
        "1x4xH100-SXM",
        "--mode",
        "training",
        "--dim",
        "seq=64",
        "--global-batch",
        "64",
        "--microbatch-sizes",
        "8",
        "--tp",
        "1",
        "--pp",
        "4",
        "--dp",
        "1",
        "--recompute",
        "none",
        "--schedule",
        "1f1b",
        "--memory-headroom",
        headroom,
        "--time-limit",
        "60s",
        "--out",
        plan_arg,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = pipecut(&["check", plan_arg, model_arg]);
    assert_eq!(code, Some(0), "{stderr}");

    let (code, stderr) = pipecut(&[
        "partition",
        model_arg,
        "--cluster",
        "1x4xH100-SXM",
        "--mode",
        "training",
        "--stages",
        "4",
        "--dim",
        "batch=8",
        "--dim",
        "seq=64",
        "--work-budget",
        "100000",
        "--memory-headroom",
        headroom,
    ]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the memory decision is not finished"),
        "{stderr}"
    );
    assert!(!stderr.contains("does not fit:"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// Issue 38 item 7, through the commands: PP-OCRv4's detector on four A100s then four L4s at
/// K = 8 (an instance of `benches/exact_k8.sh`) is proven optimal by the ideal search within a
/// work budget, and `check` proves it again. Before the search's receive floors by minimum
/// cut and its look-ahead past the stage being filled, 20,000,000 units left it unproven,
/// 12.57% above its bound; it now needs about 1,200,000 in training.
#[test]
fn the_ideal_search_proves_ppocr_det_on_a_mixed_cluster_at_eight_stages() {
    let Some(model) = common::real_model("ppocr_v4_det") else {
        return; // the skip says why
    };
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let (model, plan_arg) = (model.to_str().unwrap(), plan.to_str().unwrap());
    for mode in ["inference", "training"] {
        let (code, stdout, stderr) = common::pipecut_cli(&[
            "partition",
            model,
            "--dim",
            "p2o.DynamicDimension.0=1",
            "--dim",
            "p2o.DynamicDimension.1=64",
            "--dim",
            "p2o.DynamicDimension.2=256",
            "--devices",
            "A100-80GB,A100-80GB,A100-80GB,A100-80GB,L4,L4,L4,L4",
            "--stages",
            "8",
            "--mode",
            mode,
            "--work-budget",
            "3000000",
            "--out",
            plan_arg,
        ]);
        assert_eq!(code, 0, "{mode}: {stderr}");
        assert!(stdout.contains(": proven optimal"), "{mode}: {stdout}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
        assert_eq!(json["summary"]["proof"]["method"], "search", "{mode}");
        let (code, _, stderr) = common::pipecut_cli(&["check", plan_arg, model]);
        assert_eq!(code, 0, "{mode}: {stderr}");
    }
}
