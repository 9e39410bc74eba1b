//! Phase 4, partition: the MILP against brute force on random small DAGs, against the DP, on a
//! chain, under a time limit, and twice for determinism (under a work budget).

use std::time::{Duration, Instant};

use pipecut::cost::{Catalog, Cluster, DeviceId, Mode};
use pipecut::graph::{DType, Dim, Graph, NodeSpec, Param, Storage};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{
    dp, milp, CostSettings, PartitionProblem, Planner, SolveStatus, SolverChoice, StageCount,
    StageId,
};
use proptest::prelude::*;

mod common;

/// One node of a random DAG: its op and the earlier nodes it reads (indices; none: the input).
#[derive(Debug, Clone)]
enum RandomNode {
    /// MatMul of an earlier tensor by its own weight, or by the weight of an earlier MatMul.
    MatMul {
        input: usize,
        shared_weight_of: Option<usize>,
    },
    /// Elementwise Add of two earlier tensors.
    Add(usize, usize),
    /// Relu of an earlier tensor.
    Relu(usize),
}

/// Builds the DAG: tensor `t{i}` is node `i`'s output, `x` the input; all are `rows × width`.
fn build_dag(nodes: &[RandomNode], rows: u64, width: u64) -> Graph {
    let mut b = Graph::builder("random");
    b.opset("", 17);
    b.input(
        "x",
        Some(DType::F16),
        Some(vec![Dim::Known(rows), Dim::Known(width)]),
    )
    .unwrap();
    let tensor = |i: usize| {
        if i == 0 {
            "x".to_string()
        } else {
            format!("t{}", i - 1)
        }
    };
    let mut weight_of: Vec<Option<String>> = Vec::new();
    let mut read = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let out = format!("t{i}");
        let name = format!("/n{i}");
        let mut weight = None;
        match node {
            RandomNode::MatMul {
                input,
                shared_weight_of,
            } => {
                let shared = shared_weight_of.and_then(|j| weight_of.get(j).cloned().flatten());
                let w = shared.unwrap_or_else(|| {
                    let w = format!("w{i}");
                    let param = Param {
                        bytes: width * width * 2,
                        storage: Storage::Embedded,
                    };
                    b.parameter(&w, DType::F16, &[width, width], param, None)
                        .unwrap();
                    w
                });
                b.node(NodeSpec::new(
                    &name,
                    "MatMul",
                    &[&tensor(*input), &w],
                    &[&out],
                ))
                .unwrap();
                weight = Some(w);
                mark(&mut read, *input);
            }
            RandomNode::Add(a, c) => {
                b.node(NodeSpec::new(
                    &name,
                    "Add",
                    &[&tensor(*a), &tensor(*c)],
                    &[&out],
                ))
                .unwrap();
                mark(&mut read, *a);
                mark(&mut read, *c);
            }
            RandomNode::Relu(a) => {
                b.node(NodeSpec::new(&name, "Relu", &[&tensor(*a)], &[&out]))
                    .unwrap();
                mark(&mut read, *a);
            }
        }
        weight_of.push(weight);
    }
    // Every tensor nobody reads is a graph output, so no node is dead.
    for (i, was_read) in read.iter().enumerate() {
        if !was_read {
            b.output(&format!("t{i}"));
        }
    }
    let mut g = b.build().unwrap();
    ShapeInference::new(Default::default()).run(&mut g).unwrap();
    g
}

/// Records that node `input − 1` (input index space: 0 is `x`) is read.
fn mark(read: &mut [bool], input: usize) {
    if input > 0 {
        read[input - 1] = true;
    }
}

fn random_node(index: usize) -> impl Strategy<Value = RandomNode> {
    // Inputs index 0 (x) ..= index (node index − 1's output).
    let earlier = 0..=index;
    prop_oneof![
        3 => (earlier.clone(), proptest::option::weighted(0.3, 0..index.max(1)))
            .prop_map(|(input, shared_weight_of)| RandomNode::MatMul { input, shared_weight_of }),
        1 => (earlier.clone(), earlier.clone()).prop_map(|(a, c)| RandomNode::Add(a, c)),
        1 => earlier.prop_map(RandomNode::Relu),
    ]
}

fn random_dag(max_nodes: usize) -> impl Strategy<Value = Vec<RandomNode>> {
    (3..=max_nodes).prop_flat_map(|n| (0..n).map(random_node).collect::<Vec<_>>())
}

/// The problem on the devices of `devices` (a device list) with `capacity_fraction` of what one
/// stage holding the whole model would need as each stage's memory (below 1 makes memory bind).
fn problem_on(
    graph: &Graph,
    devices: &str,
    training: bool,
    capacity_fraction: f64,
) -> PartitionProblem {
    let cluster = Cluster::from_device_list(devices, &Catalog::builtin()).unwrap();
    let ids: Vec<DeviceId> = (0..cluster.device_count() as u32).map(DeviceId).collect();
    let mut settings = CostSettings {
        mode: if training {
            Mode::training()
        } else {
            Mode::Inference
        },
        microbatches: 2,
        ..CostSettings::default()
    };
    let unconstrained = PartitionProblem::new(graph, &cluster, &ids, settings).unwrap();
    // What one stage holding the whole model would need.
    let everything = unconstrained.evaluate(&vec![StageId(0); unconstrained.node_count()]);
    let whole_model = everything.stages[0].peak_memory_bytes;
    let smallest_memory = unconstrained
        .stages()
        .iter()
        .map(|s| s.memory_bytes)
        .min()
        .unwrap();
    let capacity = (whole_model as f64 * capacity_fraction).max(1.0);
    settings.memory_headroom = (1.0 - capacity / smallest_memory as f64).clamp(0.0, 0.999_999_9);
    PartitionProblem::new(graph, &cluster, &ids, settings).unwrap()
}

/// Best (bottleneck, bytes) over every convex, ordered assignment that fits, by enumeration.
fn brute_force(problem: &PartitionProblem) -> Option<(f64, u64)> {
    let n = problem.node_count();
    let k = problem.stage_count();
    let mut assignment = vec![StageId(0); n];
    let mut fitting: Vec<(f64, u64)> = Vec::new();
    let total = k.pow(n as u32);
    for code in 0..total {
        let mut rest = code;
        for slot in assignment.iter_mut() {
            *slot = StageId((rest % k) as u32);
            rest /= k;
        }
        if problem.check_assignment(&assignment).is_err() {
            continue;
        }
        let eval = problem.evaluate(&assignment);
        if eval.fits() {
            fitting.push((eval.bottleneck_secs, eval.cut_bytes));
        }
    }
    let best = fitting.iter().map(|f| f.0).min_by(f64::total_cmp)?;
    let bytes = fitting
        .iter()
        .filter(|f| f.0 <= best * (1.0 + 1e-9))
        .map(|f| f.1)
        .min()?;
    Some((best, bytes))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// On DAGs of at most 9 nodes (3⁹ assignments to enumerate), the MILP's plan is as good as
    /// the best of all convex, ordered assignments, proven, and never worse than the DP's.
    #[test]
    fn milp_equals_brute_force_and_never_loses_to_the_dp(
        nodes in random_dag(9),
        rows in prop::sample::select(vec![8u64, 64, 512]),
        width in prop::sample::select(vec![64u64, 256]),
        devices in prop::sample::select(vec!["L4,L4", "H100-SXM,H100-SXM,H100-SXM", "A100-80GB,L4,L4"]),
        training in any::<bool>(),
        capacity_fraction in prop::sample::select(vec![0.5, 0.75, 4.0]),
    ) {
        let graph = build_dag(&nodes, rows, width);
        let problem = problem_on(&graph, devices, training, capacity_fraction);
        prop_assume!(problem.node_count() >= problem.stage_count());
        let brute = brute_force(&problem);
        let dp_plan = dp::solve(&problem);
        let Some(dp_plan) = dp_plan else {
            // The DP finds nothing only where no contiguous plan fits; the MILP needs a start.
            return Ok(());
        };
        let (best_secs, best_bytes) = brute.expect("the DP's plan fits, so brute force finds one");
        let deadline = Instant::now() + Duration::from_secs(60);
        let run = milp::solve(&problem, &dp_plan.stage_of, deadline);
        prop_assert!(run.proven, "a 9-node MILP is proven within a minute");
        problem.check_assignment(&run.stage_of).unwrap();
        let eval = problem.evaluate(&run.stage_of);
        prop_assert!(eval.fits());
        prop_assert!(
            (eval.bottleneck_secs - best_secs).abs() <= 1e-7 * best_secs,
            "milp {} brute force {}", eval.bottleneck_secs, best_secs
        );
        prop_assert_eq!(eval.cut_bytes, best_bytes, "tie-break bytes");
        let dp_eval = problem.evaluate(&dp_plan.stage_of);
        prop_assert!(eval.bottleneck_secs <= dp_eval.bottleneck_secs * (1.0 + 1e-9));
    }
}

/// A chain of `n` MatMuls of `width`-wide fp16 weights.
fn chain(n: usize, width: u64, rows: u64) -> Graph {
    let nodes: Vec<RandomNode> = (0..n)
        .map(|i| RandomNode::MatMul {
            input: i,
            shared_weight_of: None,
        })
        .collect();
    build_dag(&nodes, rows, width)
}

#[test]
fn on_a_chain_the_dp_and_the_milp_are_both_optimal_and_agree() {
    // Uneven: 7 equal layers on 3 stages cannot meet the average-work lower bound, so
    // optimality comes from the chain's single topological order (DP) and the MILP's proof.
    let graph = chain(7, 512, 256);
    let cluster = Cluster::parse("1x3xH100-SXM", &Catalog::builtin()).unwrap();
    let solve = |solver| {
        Planner::new(&graph, &cluster)
            .with_stages(StageCount::Fixed(3))
            .with_solver(solver)
            .with_time_limit(Duration::from_secs(60))
            .solve()
            .unwrap()
    };
    let by_dp = solve(SolverChoice::Dp);
    let by_milp = solve(SolverChoice::Milp);
    assert_eq!(by_dp.status, SolveStatus::Optimal);
    assert_eq!(by_milp.status, SolveStatus::Optimal);
    let report = by_milp.milp.as_ref().expect("the MILP ran");
    assert!(
        report.proven && !report.coarsened && report.stopped.is_none(),
        "{report:?}"
    );
    assert!(by_dp.evaluation.bottleneck_secs > by_dp.problem.lower_bound_secs() * 1.01);
    let (a, b) = (&by_dp.evaluation, &by_milp.evaluation);
    assert!((a.bottleneck_secs - b.bottleneck_secs).abs() <= 1e-9 * a.bottleneck_secs);
    assert_eq!(a.cut_bytes, b.cut_bytes);
    // Auto does not run the MILP on a chain: the DP is exact there.
    let by_auto = solve(SolverChoice::Auto);
    assert_eq!(by_auto.status, SolveStatus::Optimal);
    assert!(by_auto.milp.is_none());
}

/// `width` identical MatMuls side by side, all read by one Sum: `stages · m + 1` equal items to
/// share among the stages, so no plan meets the average-work bound and the LP relaxation cannot
/// tell the many symmetric assignments apart.
fn wide_fan(branches: usize) -> Graph {
    let mut b = Graph::builder("fan");
    b.opset("", 17);
    b.input(
        "x",
        Some(DType::F16),
        Some(vec![Dim::Known(256), Dim::Known(512)]),
    )
    .unwrap();
    let mut outs = Vec::new();
    for i in 0..branches {
        let w = format!("w{i}");
        let param = Param {
            bytes: 512 * 512 * 2,
            storage: Storage::Embedded,
        };
        b.parameter(&w, DType::F16, &[512, 512], param, None)
            .unwrap();
        let out = format!("h{i}");
        b.node(NodeSpec::new(
            &format!("/b{i}/MatMul"),
            "MatMul",
            &["x", &w],
            &[&out],
        ))
        .unwrap();
        outs.push(out);
    }
    let refs: Vec<&str> = outs.iter().map(String::as_str).collect();
    b.node(NodeSpec::new("/sum", "Sum", &refs, &["y"])).unwrap();
    b.output("y");
    let mut g = b.build().unwrap();
    ShapeInference::new(Default::default()).run(&mut g).unwrap();
    g
}

/// 8 stages × 3 + 1 equal branches.
const WIDE_FAN_BRANCHES: usize = 17;

#[test]
fn a_hard_milp_stops_at_its_time_limit_with_the_best_plan_and_its_gap() {
    // Issue 8: a 2 s limit is honoured (under 2.5 s wall, measured on the whole solve, on a
    // loaded 2-core machine) and the answer carries its gap.
    let graph = wide_fan(WIDE_FAN_BRANCHES);
    let cluster = Cluster::parse("1x8xH100-SXM", &Catalog::builtin()).unwrap();
    let planner = Planner::new(&graph, &cluster)
        .with_stages(StageCount::Fixed(8))
        .with_solver(SolverChoice::Milp)
        .with_time_limit(Duration::from_secs(2));
    let started = Instant::now();
    let solution = planner.solve().unwrap();
    let wall = started.elapsed();
    eprintln!(
        "hard MILP: {:.3} s wall, status {:?}",
        wall.as_secs_f64(),
        solution.status
    );
    assert!(wall < Duration::from_millis(2500), "took {wall:?}");
    let SolveStatus::TimeLimit { gap, .. } = solution.status else {
        panic!("expected the time limit, got {:?}", solution.status);
    };
    let report = solution.milp.as_ref().unwrap();
    assert!(report.stopped.is_some() && !report.proven, "{report:?}");
    // The gap is the plan's distance to a proven lower bound.
    let bottleneck = solution.evaluation.bottleneck_secs;
    assert!(gap > 0.0 && gap < 1.0, "gap {gap}");
    assert!((gap - (bottleneck - solution.lower_bound_secs) / bottleneck).abs() < 1e-12);
    assert!(solution.lower_bound_secs >= solution.problem.lower_bound_secs());
    // The best plan found is valid and no worse than the DP's.
    solution
        .problem
        .check_assignment(&solution.stage_of)
        .unwrap();
    let dp_plan = dp::solve(&solution.problem).unwrap();
    assert!(bottleneck <= dp_plan.bottleneck_secs * (1.0 + 1e-9));
}

#[test]
fn plans_are_the_same_on_every_run() {
    let nodes = vec![
        RandomNode::MatMul {
            input: 0,
            shared_weight_of: None,
        },
        RandomNode::MatMul {
            input: 0,
            shared_weight_of: None,
        },
        RandomNode::Relu(1),
        RandomNode::MatMul {
            input: 2,
            shared_weight_of: Some(0),
        },
        RandomNode::Add(3, 4),
        RandomNode::MatMul {
            input: 5,
            shared_weight_of: None,
        },
        RandomNode::MatMul {
            input: 3,
            shared_weight_of: None,
        },
        RandomNode::Add(6, 7),
    ];
    let graph = build_dag(&nodes, 512, 256);
    let cluster = Cluster::from_device_list("A100-80GB,L4,L4", &Catalog::builtin()).unwrap();
    // A work budget, not a wall-clock limit: the same answer however loaded the machine is.
    let solve = || {
        Planner::new(&graph, &cluster)
            .with_stages(StageCount::Fixed(3))
            .with_work_budget(Some(1_000_000))
            .solve()
            .unwrap()
    };
    let (first, second) = (solve(), solve());
    assert_eq!(first.status, SolveStatus::Optimal);
    assert_eq!(first.stage_of, second.stage_of);
    assert_eq!(first.evaluation, second.evaluation);
    assert_eq!(first.status, second.status);
}

fn pipecut_partition(extra: &[&str]) -> (std::process::Output, Duration) {
    let model = format!(
        "{}/fixtures/models/gpt2_tiny.onnx",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut args = vec![
        "partition",
        model.as_str(),
        "--dim",
        "batch=2",
        "--dim",
        "seq=16",
        "--cluster",
        "1x8xL4",
        "--json",
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(&args)
        .output()
        .unwrap();
    (output, started.elapsed())
}

#[test]
fn the_cli_plans_the_same_bytes_twice_under_a_work_budget() {
    let args = ["--stages", "3", "--work-budget", "1000000"];
    let (first, _) = pipecut_partition(&args);
    let (second, _) = pipecut_partition(&args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.stdout, second.stdout);
    let plan: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(
        plan["summary"]["status"]["kind"], "optimal",
        "{}",
        plan["summary"]
    );
    assert_eq!(plan["config"]["work_budget"], 1_000_000);
}

#[test]
fn a_work_budget_too_small_to_prove_says_so_and_gives_the_same_plan() {
    // Eight stages of gpt2_tiny are not proven in 100 units: the status names the budget, and
    // the plan is the same bytes on every run (no clock decides anything).
    let args = ["--stages", "8", "--work-budget", "100"];
    let (first, _) = pipecut_partition(&args);
    let (second, _) = pipecut_partition(&args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.stdout, second.stdout);
    let plan: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let status = &plan["summary"]["status"];
    assert_eq!(status["kind"], "heuristic", "{status}");
    assert_eq!(status["reason"], "work_budget", "{status}");
}

#[test]
fn the_cli_honours_the_time_limit() {
    // 6 stages of gpt2_tiny are usually not proven within a second in a debug build; the
    // process, loading included, ends soon after the limit with the best plan and its gap. A
    // faster build or machine may finish the proof in time, which honours the limit too.
    let (output, wall) =
        pipecut_partition(&["--stages", "6", "--solver", "milp", "--time-limit", "1s"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(wall < Duration::from_millis(2500), "took {wall:?}");
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let status = &plan["summary"]["status"];
    match status["kind"].as_str() {
        Some("time_limit") => assert!(status["gap"].as_f64().unwrap() > 0.0, "{status}"),
        Some("optimal") => {}
        _ => panic!("unexpected status {status}"),
    }
    let (dp_only, _) = pipecut_partition(&["--stages", "6", "--solver", "dp"]);
    let dp_plan: serde_json::Value = serde_json::from_slice(&dp_only.stdout).unwrap();
    let bottleneck = |p: &serde_json::Value| p["summary"]["bottleneck_secs"].as_f64().unwrap();
    assert!(bottleneck(&plan) <= bottleneck(&dp_plan) * (1.0 + 1e-9));
}

#[test]
fn the_175b_shaped_model_is_coarsened_for_the_milp_within_the_time_limit() {
    let path = common::gpt3_with_placeholder_weights();
    let mut model = pipecut::onnx::load_model(&path).unwrap();
    ShapeInference::new(
        pipecut::onnx::shape::DimBindings::new()
            .bind("batch", 1)
            .bind("seq", 2048),
    )
    .run(&mut model.graph)
    .unwrap();
    let cluster = Cluster::parse("2x8xH100-SXM", &Catalog::builtin()).unwrap();
    // The DP always finishes (about 1 s here in a debug build) and the MILP gets the rest.
    let limit = Duration::from_secs(5);
    let started = Instant::now();
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(16))
        .with_solver(SolverChoice::Milp)
        .with_time_limit(limit)
        .solve()
        .unwrap();
    let wall = started.elapsed();
    eprintln!(
        "175B-shaped MILP: {:.3} s wall, status {:?}",
        wall.as_secs_f64(),
        solution.status
    );
    // The baselines and the final evaluation come after the deadline.
    assert!(wall < limit + Duration::from_millis(1500), "took {wall:?}");
    let report = solution.milp.as_ref().unwrap();
    // The coarsened search comes first; when it ends with time left (a fast machine, or a root
    // LP given all of its slice), the rest goes to the whole graph, whose report stands then.
    assert!(report.started, "{report:?}");
    if report.coarsened {
        assert!(report.nodes < model.graph.node_count() / 2, "{report:?}");
    } else {
        assert!(report.proven || report.stopped.is_some(), "{report:?}");
    }
    solution
        .problem
        .check_assignment(&solution.stage_of)
        .unwrap();
    let dp_plan = dp::solve(&solution.problem).unwrap();
    assert!(solution.evaluation.bottleneck_secs <= dp_plan.bottleneck_secs * (1.0 + 1e-9));
    // A coarse proof is no proof for the model.
    if solution.status == SolveStatus::Optimal {
        assert!(
            solution.evaluation.bottleneck_secs
                <= solution.problem.lower_bound_secs() * (1.0 + 1e-9)
        );
    }
}

#[test]
fn a_milp_solver_error_is_reported_as_one_not_as_the_time_limit() {
    // microlp fails with "Singular matrix" within a millisecond on this real model (issue 17):
    // the status must say the solver failed, not that the 60 s limit was reached.
    let model = common::root().join("fixtures/real/cache/ppocr_mobile_v2_cls.onnx");
    if !model.exists() {
        eprintln!(
            "skipping the solver-error status check: {} is absent (run fixtures/real/fetch.sh)",
            model.display()
        );
        return;
    }
    let run = |json: bool| {
        let mut args = vec![
            "partition",
            model.to_str().unwrap(),
            "--cluster",
            "1x4xH100-SXM",
            "--mode",
            "training",
            "--stages",
            "3",
            "--time-limit",
            "60s",
            "--dim",
            "x.0=1",
            "--dim",
            "x.2=48",
            "--dim",
            "x.3=192",
        ];
        if json {
            args.push("--json");
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plan: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let status = &plan["summary"]["status"];
    let table = run(false);
    assert!(!table.contains("time limit"), "{table}");
    // Since the granularity bound floors `T` (bounds.rs) microlp no longer fails here and
    // proves the optimum; where it still fails the status must say so.
    if status["kind"] == "optimal" {
        assert!(table.contains("proven optimal"), "{table}");
    } else {
        assert_eq!(status["kind"], "heuristic", "{status}");
        assert_eq!(status["reason"], "solver_error", "{status}");
        assert!(table.contains("the MILP solver failed"), "{table}");
        assert!(table.contains("Singular matrix"), "{table}");
    }
}

#[test]
fn the_auto_table_and_show_give_one_step_time_for_one_plan() {
    // With --stages auto the count is chosen on the DP's plans, then the MILP improves the
    // chosen one: the table's row for it must be the final plan's simulated step, the figure
    // `pipecut show` (Plan::simulate) gives.
    let mut model = pipecut::onnx::load_model(common::fixture("llama_tiny")).unwrap();
    ShapeInference::new(DimBindings::new().bind("batch", 2).bind("seq", 16))
        .run(&mut model.graph)
        .unwrap();
    let cluster = Cluster::from_device_list("A100-80GB,L4,L4,L4", &Catalog::builtin()).unwrap();
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Auto)
        .with_settings(CostSettings {
            microbatches: 8,
            ..CostSettings::default()
        })
        .with_solver(SolverChoice::Milp)
        .with_time_limit(Duration::from_secs(60))
        .solve()
        .unwrap();
    // The MILP improved the DP's plan here, so the DP's row would differ from the final plan.
    assert_eq!(solution.solver, pipecut::partition::SolverKind::Milp);
    let k = solution.problem.stage_count();
    let row = solution
        .candidates
        .iter()
        .find(|c| c.stages == k)
        .expect("the chosen count has a row");
    let simulated = pipecut::schedule::simulate(
        &solution.stage_times(),
        solution.problem.settings().schedule.into(),
        solution.problem.settings().microbatches as usize,
    )
    .unwrap();
    assert_eq!(row.step_secs, Some(simulated.step_secs));
    assert_eq!(row.bubble_fraction, Some(simulated.bubble_fraction));
    assert_eq!(
        row.bottleneck_secs,
        Some(solution.evaluation.bottleneck_secs)
    );
}

#[test]
fn a_piped_solve_prints_progress_lines_with_elapsed_time_and_gap() {
    // stderr is a pipe here: plain lines, one a second, naming the solver, best, bound and gap.
    // Seven stages: with microlp optimised in test builds six are proven within the first
    // second, before any progress line.
    let (output, _) =
        pipecut_partition(&["--stages", "7", "--solver", "milp", "--time-limit", "3s"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pipecut: "))
        .collect();
    assert!(!lines.is_empty(), "no progress lines: {stderr}");
    for line in &lines {
        assert!(line.contains(" s — "), "no elapsed time: {line}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("gap ") && l.contains("bound ")),
        "no gap reported: {stderr}"
    );
    // The plan itself still goes to stdout alone.
    serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("stdout is the plan");
}
