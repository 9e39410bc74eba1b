//! pipecut embedded in another framework: no files, no CLI.
//!
//! ```text
//! cargo run --release -p pipecut-examples --example embed
//! ```
//!
//! 1. A model that arrives as bytes (from a framework's exporter, a network, a database) is
//!    loaded with `onnx::load_model_from_bytes` and planned; the plan comes back as Rust types
//!    and as the same JSON `pipecut partition --json` writes.
//! 2. A framework that has its own graph builds pipecut's IR with `Graph::builder`, supplies
//!    the per-node times it profiled (instead of pipecut's roofline estimates), and gets the
//!    stages and the PyTorch / DeepSpeed split points.

use std::collections::{BTreeMap, HashMap};

use pipecut::cost::{Catalog, Cluster};
use pipecut::graph::{DType, Dim, Graph, NodeSpec, Param, Storage};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::torch_split::{torch_split, TorchSplitOutcome, DEFAULT_SPLIT_TOLERANCE};
use pipecut::partition::{Planner, StageCount};
use pipecut::plan::{Plan, PlanContext, PlanOptions};

fn main() -> Result<(), pipecut::Error> {
    from_bytes()?;
    from_a_built_graph()?;
    Ok(())
}

/// A model as bytes → a plan as Rust types and JSON.
fn from_bytes() -> Result<(), pipecut::Error> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/models/gpt2_tiny.onnx"
    );
    let bytes = std::fs::read(path).map_err(|source| pipecut::Error::Io {
        path: path.into(),
        source,
    })?;
    let mut model = pipecut::onnx::load_model_from_bytes(&bytes, None)?;
    let dims = BTreeMap::from([("batch".to_string(), 8), ("seq".to_string(), 64)]);
    let mut bindings = DimBindings::new();
    for (name, value) in &dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings).run(&mut model.graph)?;

    let catalog = Catalog::builtin();
    let cluster = Cluster::parse("1x4xH100-SXM", &catalog)?;
    let stages = StageCount::Fixed(2);
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(stages)
        .solve()?;
    let plan = Plan::from_solution(
        &solution,
        PlanContext {
            model: model.digests(),
            model_file_name: "gpt2_tiny.onnx",
            graph: &model.graph,
            dims: &dims,
            cluster: &cluster,
            stages,
            time_limit_secs: 10.0,
            dtype_override: None,
        },
        PlanOptions::default(),
    );
    println!("gpt2_tiny from {} bytes:", bytes.len());
    for stage in &plan.stages {
        println!(
            "  stage {} on {}: {} nodes, {:.3} ms, first node {}",
            stage.stage,
            stage.device.name,
            stage.node_count,
            stage.stage_secs * 1e3,
            stage.first_node
        );
    }
    let json = plan.to_json();
    let again = Plan::from_json(&json)?;
    assert_eq!(again.stages.len(), 2);
    println!(
        "  plan JSON: {} bytes, schema {}",
        json.len(),
        plan.schema_version
    );
    Ok(())
}

/// A graph built in code, with measured node times → stages and split points.
fn from_a_built_graph() -> Result<(), pipecut::Error> {
    // Eight blocks of one MatMul and one Relu, scoped as PyTorch's exporter would scope
    // `net.blocks[i].fc` and `net.blocks[i].act`.
    let (blocks, rows, width) = (8, 256u64, 1024u64);
    let mut builder = Graph::builder("net");
    builder.opset("", 17);
    builder.input(
        "x",
        Some(DType::F16),
        Some(vec![Dim::Known(rows), Dim::Known(width)]),
    )?;
    let mut previous = "x".to_string();
    for i in 0..blocks {
        let weight = format!("net.blocks.{i}.fc.weight");
        let param = Param {
            bytes: width * width * 2,
            // The framework holds the weights; pipecut only needs their size.
            storage: Storage::Declared,
        };
        builder.parameter(&weight, DType::F16, &[width, width], param, None)?;
        let (fc, act) = (format!("h{i}"), format!("a{i}"));
        builder.node(NodeSpec::new(
            &format!("/net/blocks.{i}/fc/MatMul"),
            "MatMul",
            &[&previous, &weight],
            &[&fc],
        ))?;
        builder.node(NodeSpec::new(
            &format!("/net/blocks.{i}/act/Relu"),
            "Relu",
            &[&fc],
            &[&act],
        ))?;
        previous = act;
    }
    builder.output(&previous);
    let mut graph = builder.build()?;
    ShapeInference::new(DimBindings::new()).run(&mut graph)?;

    // The framework profiled its ops: the MatMuls of the last blocks are slower (say, a
    // different kernel), which the roofline cannot know.
    let mut measured = HashMap::new();
    for i in 0..blocks {
        let secs = if i < 6 { 1.0e-3 } else { 2.5e-3 };
        measured.insert(format!("/net/blocks.{i}/fc/MatMul"), secs);
        measured.insert(format!("/net/blocks.{i}/act/Relu"), 0.05e-3);
    }
    let cluster = Cluster::parse("1x4xH100-SXM", &Catalog::builtin())?;
    let solution = Planner::new(&graph, &cluster)
        .with_stages(StageCount::Fixed(3))
        .with_node_secs(measured.clone())
        .solve()?;
    println!("\nbuilt graph with measured times:");
    for (k, stage) in solution.evaluation.stages.iter().enumerate() {
        println!(
            "  stage {k}: {} nodes, {:.3} ms",
            stage.node_count,
            stage.stage_secs * 1e3
        );
    }
    match torch_split(
        &solution.problem,
        &solution.stage_of,
        DEFAULT_SPLIT_TOLERANCE,
    )? {
        TorchSplitOutcome::Split(split) => {
            print!("{}", split.split_spec_python());
            print!("{}", split.deepspeed_parts_python());
            println!(
                "  bottleneck at module boundaries {:+.2}% vs the plan",
                split.bottleneck_change * 100.0
            );
            // As JSON, for a framework that is not written in Rust.
            let json = serde_json::to_string(&split).map_err(|e| {
                pipecut::Error::PartitionConfig(format!("serialising the split: {e}"))
            })?;
            println!("  {} bytes of split JSON", json.len());
        }
        TorchSplitOutcome::NoModuleBoundaries { reason } => println!("  {reason}"),
    }

    // A typo in a node name is an error that names it, not a silent roofline fallback.
    measured.insert("/net/blocks.9/fc/MatMul".into(), 1e-3);
    let err = Planner::new(&graph, &cluster)
        .with_stages(StageCount::Fixed(3))
        .with_node_secs(measured)
        .solve()
        .unwrap_err();
    println!("  a wrong name: {err}");
    Ok(())
}
