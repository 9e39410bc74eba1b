//! The exact-solver instance set of issue 17: every committed fixture (`fixtures/models/*.onnx`,
//! without the 175B shape) and every real model in `fixtures/real/cache`, on four clusters
//! (`1x4xH100-SXM`, `A100-80GB,A100-80GB,L4,L4`, `1x8xH100-SXM`, four A100-80GB then four L4),
//! at K = 2, 3, 4, 8 stages (K ≤ the cluster's devices), in inference and training. One solve per
//! instance under the default 10 s limit, printing its status, time, lower bound and gap, then
//! how many were proven optimal within the limit.
//!
//! `cargo bench --bench exact` (an optimised build: solve times in the debug build are no
//! figure). Environment: `PIPECUT_EXACT_LIMIT_SECS` (default 10), `PIPECUT_EXACT_FILTER` (a
//! substring of the instance name `model/cluster/K/mode` to run only those).
//!
//! Not a criterion benchmark: each instance runs once, since an unproven one takes the whole
//! limit and the set has a few hundred instances.

use std::time::{Duration, Instant};

use pipecut::cost::{Catalog, Cluster, Mode};
use pipecut::graph::Graph;
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{CostSettings, PartitionConfig, Planner, SolveStatus, StageCount};

#[path = "../tests/common/mod.rs"]
mod common;

/// The clusters of the instance set, as `pipecut --cluster` spells them.
const CLUSTERS: [&str; 4] = [
    "1x4xH100-SXM",
    "A100-80GB,A100-80GB,L4,L4",
    "1x8xH100-SXM",
    "A100-80GB,A100-80GB,A100-80GB,A100-80GB,L4,L4,L4,L4",
];
const STAGES: [usize; 4] = [2, 3, 4, 8];

fn typed(path: &std::path::Path, dims: &[(String, u64)]) -> Graph {
    let mut bindings = DimBindings::new();
    for (dim, value) in dims {
        bindings = bindings.bind(dim, *value);
    }
    let mut model = pipecut::onnx::load_model(path).expect("model loads");
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .expect("shapes infer");
    model.graph
}

fn main() {
    let limit = Duration::from_secs_f64(
        std::env::var("PIPECUT_EXACT_LIMIT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10.0),
    );
    let filter = std::env::var("PIPECUT_EXACT_FILTER").unwrap_or_default();
    let catalog = Catalog::builtin();
    let mut models: Vec<(String, Graph)> = common::FIXTURES
        .iter()
        .map(|name| {
            let dims = common::fixture_reference(name).dims;
            (name.to_string(), typed(&common::fixture(name), &dims))
        })
        .collect();
    for (name, path) in common::real_models() {
        let dims = common::real_reference(&name).dims;
        models.push((name, typed(&path, &dims)));
    }

    let (mut total, mut proven, mut proven_in_limit) = (0, 0, 0);
    println!(
        "{:<48} {:>9} {:>12} {:>12} {:>8}  status",
        "instance", "secs", "bottleneck", "bound", "gap"
    );
    for (name, graph) in &models {
        for spec in CLUSTERS {
            let cluster = if spec.contains(',') {
                Cluster::from_device_list(spec, &catalog)
            } else {
                Cluster::parse(spec, &catalog)
            }
            .expect("cluster parses");
            let devices = cluster.device_count();
            let label = if spec.contains(',') {
                format!("{devices}xmixed")
            } else {
                spec.to_string()
            };
            for k in STAGES.into_iter().filter(|&k| k <= devices) {
                for (mode, mode_name) in [
                    (Mode::Inference, "inference"),
                    (Mode::training(), "training"),
                ] {
                    let instance = format!("{name}/{label}/K{k}/{mode_name}");
                    if !instance.contains(&filter) {
                        continue;
                    }
                    let config = PartitionConfig {
                        stages: StageCount::Fixed(k),
                        settings: CostSettings {
                            mode,
                            ..CostSettings::default()
                        },
                        time_limit: limit,
                        ..PartitionConfig::default()
                    };
                    let started = Instant::now();
                    let solved = Planner::new(graph, &cluster).with_config(config).solve();
                    let secs = started.elapsed().as_secs_f64();
                    total += 1;
                    match solved {
                        Ok(s) => {
                            let optimal = s.status == SolveStatus::Optimal;
                            proven += usize::from(optimal);
                            proven_in_limit += usize::from(optimal && secs <= limit.as_secs_f64());
                            println!(
                                "{instance:<48} {secs:>9.3} {:>9.4} ms {:>9.4} ms {:>7.3}%  {}",
                                s.evaluation.bottleneck_secs * 1e3,
                                s.lower_bound_secs * 1e3,
                                s.gap() * 100.0,
                                s.status.describe(s.gap()),
                            );
                        }
                        Err(e) => println!("{instance:<48} {secs:>9.3}  error: {e}"),
                    }
                }
            }
        }
    }
    println!(
        "proven optimal: {proven} of {total}; within the {:.0} s limit: {proven_in_limit} of {total}",
        limit.as_secs_f64()
    );
}
