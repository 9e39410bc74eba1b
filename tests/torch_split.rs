//! PyTorch split points (`partition::torch_split`) and per-node time overrides, on the fixtures
//! whose node names follow PyTorch's ONNX exporter, on fetched real models, and through the CLI.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use pipecut::cost::{Catalog, Cluster};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::layers::find_layers_of_family;
use pipecut::partition::torch_split::{torch_split, TorchSplit, TorchSplitOutcome};
use pipecut::partition::{Planner, Solution, SolverChoice, StageCount};
use pipecut::Error;

mod common;

fn solve(path: &Path, dims: &[(String, u64)], stages: usize) -> Solution {
    let mut model = pipecut::onnx::load_model(path).unwrap();
    let mut bindings = DimBindings::new();
    for (name, value) in dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings).run(&mut model.graph).unwrap();
    let cluster = Cluster::parse("1x4xH100-SXM", &Catalog::builtin()).unwrap();
    Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(stages))
        .with_solver(SolverChoice::Dp)
        .solve()
        .unwrap()
}

/// Everything a split must satisfy, checked against the problem independently of how the
/// split was found.
fn check_split(solution: &Solution, split: &TorchSplit) {
    let problem = &solution.problem;
    let names = problem.node_scopes();
    assert_eq!(split.boundaries.len(), problem.stage_count() - 1);
    for (i, b) in split.boundaries.iter().enumerate() {
        assert_eq!(b.stage, i + 1);
        // A real block: its first node lies in the block's scope.
        assert!(
            names[b.position].starts_with(&format!("{}/", b.scope)),
            "node '{}' at the boundary is not in {}",
            names[b.position],
            b.scope
        );
        assert_eq!(b.module, format!("{}.{}", split.family, b.block_index));
        assert_eq!(split.layers[b.layer_index], b.module);
        assert!(b.block_index > 0, "a boundary follows another block");
    }
    for pair in split.boundaries.windows(2) {
        assert!(
            pair[0].position < pair[1].position,
            "{:?}",
            split.boundaries
        );
        assert!(pair[0].block_index < pair[1].block_index);
    }
    let parts = &split.deepspeed_parts;
    assert_eq!(parts.len(), problem.stage_count() + 1);
    assert_eq!(parts[0], 0);
    assert_eq!(*parts.last().unwrap(), split.layers.len());
    assert!(parts.windows(2).all(|w| w[0] < w[1]), "{parts:?}");

    // The stated figures are the evaluation of the stated boundaries.
    let mut starts = vec![0];
    starts.extend(split.boundaries.iter().map(|b| b.position));
    let evaluation = problem.evaluate(&problem.contiguous_assignment(&starts));
    assert_eq!(evaluation.bottleneck_secs, split.bottleneck_secs);
    assert_eq!(evaluation.fits(), split.fits);
    // The DP's plan is contiguous, so its bottleneck is the plan's.
    assert_eq!(
        split.plan_bottleneck_secs,
        solution.evaluation.bottleneck_secs
    );
    let change = (split.bottleneck_secs - split.plan_bottleneck_secs) / split.plan_bottleneck_secs;
    assert!((change - split.bottleneck_change).abs() < 1e-12);
    assert_eq!(
        split.within_tolerance,
        split.fits && change <= split.tolerance + 1e-12
    );

    let spec = split.split_spec_python();
    for b in &split.boundaries {
        assert!(spec.contains(&format!("\"{}\": SplitPoint.BEGINNING", b.module)));
    }
    let listed: Vec<String> = parts.iter().map(usize::to_string).collect();
    assert!(split
        .deepspeed_parts_python()
        .contains(&format!("parts = [{}]", listed.join(", "))));
}

fn split_of(solution: &Solution, tolerance: f64) -> TorchSplit {
    match torch_split(&solution.problem, &solution.stage_of, tolerance).unwrap() {
        TorchSplitOutcome::Split(split) => split,
        TorchSplitOutcome::NoModuleBoundaries { reason } => panic!("{reason}"),
    }
}

#[test]
fn exporter_named_fixtures_split_at_their_blocks_within_tolerance_or_at_the_best_blocks() {
    // (fixture, block family as `named_modules()` spells it, stages, within 5 %): stages up to
    // one per block boundary. mlp's blocks sit in an nn.Sequential, exported as
    // `/layers/layers.N`. Where a fixture has only two to four blocks, one block is a large share
    // of the model and no block boundary comes within 5 % of the plan; the split must then be the
    // best one at block boundaries.
    for (name, family, stages, within) in [
        ("gpt2_tiny", "transformer.h", 2, true),
        ("gpt2_tiny", "transformer.h", 3, false),
        ("llama_tiny", "model.layers", 2, false),
        ("bert_tiny", "bert.encoder.layer", 2, false),
        ("mlp", "layers", 4, true),
    ] {
        let reference = common::fixture_reference(name);
        let solution = solve(&common::fixture(name), &reference.dims, stages);
        let split = split_of(&solution, 0.05);
        eprintln!(
            "{name} ×{stages}: {:?} plan {:.6} ms → {:.6} ms ({:+.2}%){}",
            split
                .boundaries
                .iter()
                .map(|b| b.module.as_str())
                .collect::<Vec<_>>(),
            split.plan_bottleneck_secs * 1e3,
            split.bottleneck_secs * 1e3,
            split.bottleneck_change * 100.0,
            if split.searched { ", searched" } else { "" }
        );
        assert_eq!(split.family, family, "{name}");
        check_split(&solution, &split);
        if name == "gpt2_tiny" {
            // This fixture names its weights as the state dict does (`transformer.h.3.attn.
            // c_attn.weight`), which confirms the module names against PyTorch's own.
            for b in &split.boundaries {
                let prefix = format!("{}.", b.module);
                assert!(
                    solution
                        .problem
                        .params()
                        .iter()
                        .any(|p| solution.problem.name(p.name).starts_with(&prefix)),
                    "no weight of {name} is under {}",
                    b.module
                );
            }
        }
        let best = best_at_blocks(&solution, &split);
        assert_eq!(split.within_tolerance, within, "{name} ×{stages}");
        if split.within_tolerance {
            assert!(split.bottleneck_secs <= split.plan_bottleneck_secs * 1.05);
        } else {
            // Over the tolerance only when no choice of block boundaries is within it, and
            // then the best choice.
            assert_eq!(
                (!split.fits, split.bottleneck_secs),
                best,
                "{name} ×{stages}"
            );
            assert!(best.1 > split.plan_bottleneck_secs * 1.05);
        }
    }
}

/// The best (unfit, bottleneck) over every choice of stage starts among the block starts,
/// found by trying them all: an independent check of the search.
fn best_at_blocks(solution: &Solution, split: &TorchSplit) -> (bool, f64) {
    let problem = &solution.problem;
    let family_scope = split.boundaries[0]
        .scope
        .rsplit_once('.')
        .map(|(f, _)| f.to_string())
        .unwrap();
    let names: Vec<String> = (0..problem.node_count())
        .map(|p| problem.node_names().name(p).into_owned())
        .collect();
    let starts: Vec<usize> = find_layers_of_family(&names, &family_scope)
        .iter()
        .filter(|l| {
            l.name
                .strip_prefix(&format!("{family_scope}."))
                .is_some_and(|i| i != "0" && i.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|l| l.start)
        .collect();
    fn recurse(
        problem: &pipecut::partition::PartitionProblem,
        starts: &[usize],
        chosen: &mut Vec<usize>,
        from: usize,
        best: &mut (bool, f64),
    ) {
        if chosen.len() == problem.stage_count() {
            let e = problem.evaluate(&problem.contiguous_assignment(chosen));
            let rank = (!e.fits(), e.bottleneck_secs);
            // Fitting first, then the smaller bottleneck.
            if (rank.0, rank.1).partial_cmp(&(best.0, best.1)) == Some(std::cmp::Ordering::Less) {
                *best = rank;
            }
            return;
        }
        for i in from..starts.len() {
            chosen.push(starts[i]);
            recurse(problem, starts, chosen, i + 1, best);
            chosen.pop();
        }
    }
    let mut best = (true, f64::INFINITY);
    recurse(problem, &starts, &mut vec![0], 0, &mut best);
    best
}

#[test]
fn a_tight_tolerance_still_gives_the_best_module_boundaries_and_says_so() {
    let reference = common::fixture_reference("gpt2_tiny");
    let solution = solve(&common::fixture("gpt2_tiny"), &reference.dims, 3);
    let loose = split_of(&solution, 0.05);
    let exact = split_of(&solution, 0.0);
    check_split(&solution, &exact);
    // Asking for no increase can only keep or lower the bottleneck found.
    assert!(exact.bottleneck_secs <= loose.bottleneck_secs);
    assert_eq!(exact.within_tolerance, exact.bottleneck_change <= 0.0);
    let err = torch_split(&solution.problem, &solution.stage_of, f64::NAN).unwrap_err();
    assert!(err.to_string().contains("split tolerance"), "{err}");
}

#[test]
fn a_model_without_numbered_blocks_says_so() {
    let reference = common::fixture_reference("resnet_tiny");
    let solution = solve(&common::fixture("resnet_tiny"), &reference.dims, 2);
    match torch_split(&solution.problem, &solution.stage_of, 0.05).unwrap() {
        TorchSplitOutcome::NoModuleBoundaries { reason } => {
            assert!(reason.contains("no module boundaries found"), "{reason}")
        }
        TorchSplitOutcome::Split(split) => panic!("resnet_tiny has no block family: {split:?}"),
    }
}

#[test]
fn more_stages_than_block_boundaries_is_explained() {
    // llama_tiny has two decoder layers: one boundary between them, so three stages cannot
    // all start at a block.
    let reference = common::fixture_reference("llama_tiny");
    let solution = solve(&common::fixture("llama_tiny"), &reference.dims, 3);
    match torch_split(&solution.problem, &solution.stage_of, 0.05).unwrap() {
        TorchSplitOutcome::NoModuleBoundaries { reason } => {
            assert!(reason.contains("model.layers"), "{reason}");
            assert!(reason.contains("needs 2"), "{reason}");
        }
        TorchSplitOutcome::Split(split) => panic!("{split:?}"),
    }
}

#[test]
fn real_pytorch_exports_split_at_their_blocks() {
    for (name, path) in common::real_models() {
        let reference = common::real_reference(&name);
        let solution = solve(&path, &reference.dims, 2);
        match torch_split(&solution.problem, &solution.stage_of, 0.05).unwrap() {
            TorchSplitOutcome::Split(split) => {
                eprintln!(
                    "{name}: {} blocks of {}, {:?}, {:+.2}%",
                    split.block_count,
                    split.family,
                    split
                        .boundaries
                        .iter()
                        .map(|b| b.module.as_str())
                        .collect::<Vec<_>>(),
                    split.bottleneck_change * 100.0
                );
                check_split(&solution, &split);
            }
            TorchSplitOutcome::NoModuleBoundaries { reason } => {
                eprintln!("{name}: {reason}");
                assert!(reason.contains("no module boundaries"), "{reason}");
            }
        }
    }
}

#[test]
fn measured_node_times_drive_the_plan_and_typos_are_named() {
    let mut model = pipecut::onnx::load_model(common::fixture("mlp")).unwrap();
    let reference = common::fixture_reference("mlp");
    let mut bindings = DimBindings::new();
    for (name, value) in &reference.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings).run(&mut model.graph).unwrap();
    let cluster = Cluster::parse("1x2xH100-SXM", &Catalog::builtin()).unwrap();
    let order = model.graph.topological_order().to_vec();
    // A framework measured every node at 1 ms but the first at 100 ms: the first stage must
    // hold the first node alone, and the bottleneck is at least its time.
    let mut measured: HashMap<String, f64> = order
        .iter()
        .map(|&id| (model.graph.node(id).name.clone(), 1e-3))
        .collect();
    let first = model.graph.node(order[0]).name.clone();
    measured.insert(first, 0.1);
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(2))
        .with_node_secs(measured.clone())
        .solve()
        .unwrap();
    assert_eq!(solution.evaluation.stages[0].node_count, 1);
    assert!(solution.evaluation.bottleneck_secs >= 0.1);
    let rest = (order.len() - 1) as f64 * 1e-3;
    assert!((solution.evaluation.stages[1].compute_secs - rest).abs() < 1e-12);

    measured.insert("/layers/layers.99/MatMul".into(), 1e-3);
    let err = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(2))
        .with_node_secs(measured)
        .solve()
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownNode { name, count: 1 } if name == "/layers/layers.99/MatMul"),
        "{err}"
    );
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

#[test]
fn the_cli_emits_the_split_spec_after_the_table_and_in_json() {
    let base = [
        "partition",
        "fixtures/models/gpt2_tiny.onnx",
        "--dim",
        "batch=2",
        "--dim",
        "seq=16",
        "--cluster",
        "1x4xH100-SXM",
        "--stages",
        "3",
        "--emit",
        "torch-split-spec",
    ];
    let (code, stdout, stderr) = pipecut(&base);
    assert_eq!(code, 0, "{stderr}");
    let table = stdout.find("bottleneck").unwrap();
    let spec = stdout.find("split_spec = {").expect(&stdout);
    assert!(table < spec, "the split spec follows the table");
    assert_eq!(
        stdout.matches(": SplitPoint.BEGINNING,").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("\"transformer.h."), "{stdout}");
    assert!(stdout.contains("parts = [0, "), "{stdout}");

    let mut json_args = base.to_vec();
    json_args.push("--json");
    let (code, stdout, stderr) = pipecut(&json_args);
    assert_eq!(code, 0, "{stderr}");
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value["torch_split"]["outcome"], "split");
    assert_eq!(value["torch_split"]["family"], "transformer.h");
    assert_eq!(
        value["torch_split"]["boundaries"].as_array().unwrap().len(),
        2
    );
    assert_eq!(value["plan"]["stages"].as_array().unwrap().len(), 3);
    // The plan inside is the plan: it loads.
    pipecut::plan::Plan::from_json(&value["plan"].to_string()).unwrap();

    let (code, stdout, stderr) = pipecut(&[
        "partition",
        "fixtures/models/resnet_tiny.onnx",
        "--dim",
        "batch=2",
        "--cluster",
        "1x2xH100-SXM",
        "--stages",
        "2",
        "--emit",
        "torch-split-spec",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("no module boundaries found"), "{stdout}");

    // A tolerance without --emit would be silently ignored: refused.
    let without_emit: Vec<&str> = base[..base.len() - 2]
        .iter()
        .copied()
        .chain(["--split-tolerance", "0.1"])
        .collect();
    let (code, _, stderr) = pipecut(&without_emit);
    assert_ne!(code, 0);
    assert!(stderr.contains("--emit"), "{stderr}");

    let mut bad = base.to_vec();
    bad.push("--split-tolerance=-0.5");
    let (code, _, stderr) = pipecut(&bad);
    assert_ne!(code, 0);
    assert!(stderr.contains("split tolerance"), "{stderr}");
}

/// gpt2_tiny as torch's dynamo exporter would name it: nodes named after FX nodes
/// (`node_MatMul_17`), the module path only in `metadata_props` under
/// `pkg.torch.onnx.name_scopes`, written as dynamo writes it: the `repr()` of the cumulative
/// module paths, root `''` first and the node's own name last. (torch itself is not installed
/// here: its PyPI wheel pulls several GB of CUDA libraries.) With `keep_scopes` false the
/// metadata is left out, which leaves no module boundaries at all.
fn dynamo_style_gpt2(dir: &Path, keep_scopes: bool) -> std::path::PathBuf {
    use protobuf::Message;
    let bytes = std::fs::read(common::fixture("gpt2_tiny")).unwrap();
    let mut model = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap();
    let graph = model.graph.as_mut().unwrap();
    for (index, node) in graph.node.iter_mut().enumerate() {
        let mut segments: Vec<&str> = node.name.split('/').filter(|s| !s.is_empty()).collect();
        segments.pop(); // the op instance
        let mut cumulative = vec![String::new()];
        let mut path = String::new();
        for segment in segments {
            path = if path.is_empty() {
                segment.to_string()
            } else {
                format!("{path}.{segment}")
            };
            cumulative.push(path.clone());
        }
        let own_name = format!("{}_{index}", node.op_type.to_lowercase());
        cumulative.push(own_name.clone());
        let quoted: Vec<String> = cumulative.iter().map(|s| format!("'{s}'")).collect();
        node.name = format!("node_{own_name}");
        if keep_scopes {
            let mut entry = onnx_protobuf::StringStringEntryProto::new();
            entry.key = "pkg.torch.onnx.name_scopes".into();
            entry.value = format!("[{}]", quoted.join(", "));
            node.metadata_props.push(entry);
        }
    }
    let path = dir.join(if keep_scopes {
        "dynamo.onnx"
    } else {
        "bare.onnx"
    });
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

#[test]
fn dynamo_exports_split_at_the_module_scopes_in_their_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let reference = common::fixture_reference("gpt2_tiny");
    let named = split_of(
        &solve(&common::fixture("gpt2_tiny"), &reference.dims, 2),
        0.05,
    );
    let solution = solve(&dynamo_style_gpt2(dir.path(), true), &reference.dims, 2);
    assert!(solution.problem.node_names().name(0).starts_with("node_"));
    let split = split_of(&solution, 0.05);
    assert_eq!(split.family, "transformer.h");
    check_split(&solution, &split);
    let modules =
        |s: &TorchSplit| -> Vec<String> { s.boundaries.iter().map(|b| b.module.clone()).collect() };
    assert_eq!(modules(&split), modules(&named));

    let bare = solve(&dynamo_style_gpt2(dir.path(), false), &reference.dims, 2);
    assert!(matches!(
        torch_split(&bare.problem, &bare.stage_of, 0.05).unwrap(),
        TorchSplitOutcome::NoModuleBoundaries { .. }
    ));
}
