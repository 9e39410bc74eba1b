//! `pipecut check plan.json MODEL`: is this plan valid for this model?

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use pipecut::cost::Catalog;
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::plan::Plan;

use super::print_stdout;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for.
    model: PathBuf,
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("cannot read plan '{}'", args.plan.display()))?;
    let plan = Plan::from_json(&text).with_context(|| format!("'{}'", args.plan.display()))?;
    let mut model = pipecut::onnx::load_model(&args.model)
        .with_context(|| format!("cannot load '{}'", args.model.display()))?;
    // The plan records the dims it was costed with; bind the same ones.
    let mut bindings = DimBindings::new();
    for (name, value) in &plan.model.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", args.model.display()))?;
    let report = plan
        .check(&model.sha256, &model.graph, &Catalog::builtin())
        .with_context(|| format!("'{}'", args.plan.display()))?;
    print_stdout(&format!(
        "{}: valid plan for {} — {} nodes on {} stages, every stage within memory, figures recomputed (bottleneck {:.3} ms)\n",
        args.plan.display(),
        args.model.display(),
        report.nodes,
        report.stages,
        report.bottleneck_secs * 1e3
    ))?;
    Ok(ExitCode::SUCCESS)
}
