//! Partition solve time of the DP and of the MILP (DP start, coarsening, refinement) on the
//! committed fixtures and the GPT-3-175B-shaped model, with the quality of each plan printed
//! once: bottleneck against the lower bound and against the best of the peers' baselines.
//!
//! `cargo bench --bench partition`
//!
//! The MILP runs with a 2 s limit (issue 8's), so where it cannot prove its plan its time is the
//! limit; the printed status says which.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use pipecut::cost::{Catalog, Cluster};
use pipecut::graph::Graph;
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{Planner, Solution, SolverChoice, StageCount};

#[path = "../tests/common/mod.rs"]
mod common;

const MILP_LIMIT: Duration = Duration::from_secs(2);

fn typed(path: &std::path::Path, bindings: &DimBindings) -> Graph {
    let mut model = pipecut::onnx::load_model(path).expect("fixture loads");
    ShapeInference::new(bindings.clone())
        .run(&mut model.graph)
        .expect("shapes infer");
    model.graph
}

fn solve(graph: &Graph, cluster: &Cluster, stages: usize, solver: SolverChoice) -> Solution {
    Planner::new(graph, cluster)
        .with_stages(StageCount::Fixed(stages))
        .with_solver(solver)
        .with_time_limit(MILP_LIMIT)
        .solve()
        .expect("the fixture fits")
}

fn describe(name: &str, solver: &str, s: &Solution) {
    let status = s.status.describe(s.gap());
    let bottleneck = s.evaluation.bottleneck_secs;
    let baseline = s
        .best_baseline_secs()
        .map(|b| format!("{:.3} ms ({:.3}×)", b * 1e3, b / bottleneck))
        .unwrap_or_else(|| "none fits".into());
    let milp = s
        .milp
        .as_ref()
        .map(|r| {
            format!(
                "; MILP on {} {}nodes",
                r.nodes,
                if r.coarsened { "super-" } else { "" }
            )
        })
        .unwrap_or_default();
    eprintln!(
        "{name:<12} {solver:<4} {:>2} stages: bottleneck {:.4} ms, lower bound {:.4} ms (+{:.2}%), best baseline {baseline}, {status}, {:.3} s{milp}",
        s.problem.stage_count(),
        bottleneck * 1e3,
        s.lower_bound_secs * 1e3,
        (bottleneck / s.problem.lower_bound_secs() - 1.0) * 100.0,
        s.solve_secs,
    );
}

fn bench_partition(c: &mut Criterion) {
    let mut cases: Vec<(String, Graph, Cluster, usize)> = Vec::new();
    let catalog = Catalog::builtin();
    for name in common::FIXTURES {
        let mut bindings = DimBindings::new();
        for (dim, value) in &common::fixture_reference(name).dims {
            bindings = bindings.bind(dim, *value);
        }
        let graph = typed(&common::fixture(name), &bindings);
        let cluster = Cluster::parse("1x4xL4", &catalog).unwrap();
        cases.push((name.to_string(), graph, cluster, 4));
    }
    let gpt3 = typed(
        &common::gpt3_with_placeholder_weights(),
        &DimBindings::new().bind("batch", 1).bind("seq", 2048),
    );
    cases.push((
        "gpt3_175b".into(),
        gpt3,
        Cluster::parse("2x8xH100-SXM", &catalog).unwrap(),
        16,
    ));

    let mut group = c.benchmark_group("partition");
    group.sample_size(10);
    for (name, graph, cluster, stages) in &cases {
        for (label, solver) in [("dp", SolverChoice::Dp), ("milp", SolverChoice::Milp)] {
            describe(name, label, &solve(graph, cluster, *stages, solver));
            group.bench_function(format!("{name}/{label}"), |b| {
                b.iter(|| solve(graph, cluster, *stages, solver))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_partition);
criterion_main!(benches);
