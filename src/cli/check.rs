//! `pipecut check plan.json MODEL`: is this plan valid for this model?

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use pipecut::cost::Catalog;
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::onnx::Model;
use pipecut::plan::Plan;

use super::print_stdout;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for.
    model: PathBuf,
    /// Print the result as JSON (`{"valid": true, "stages", "nodes", "bottleneck_secs"}`).
    #[arg(long)]
    json: bool,
}

/// Reads a plan file.
pub(crate) fn read_plan(path: &Path) -> anyhow::Result<Plan> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read plan '{}'", path.display()))?;
    Plan::from_json(&text).with_context(|| format!("'{}'", path.display()))
}

/// Loads the model a plan was made for, with the dims bound as the plan records them.
pub(crate) fn load_for_plan(plan: &Plan, path: &Path) -> anyhow::Result<Model> {
    let mut model = super::load_model(path, super::Weights::NotRead)?;
    let mut bindings = DimBindings::new();
    for (name, value) in &plan.model.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", path.display()))?;
    Ok(model)
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let plan = read_plan(&args.plan)?;
    let model = load_for_plan(&plan, &args.model)?;
    let report = plan
        .check(&model.sha256, &model.graph, &Catalog::builtin())
        .with_context(|| format!("'{}'", args.plan.display()))?;
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["valid"] = serde_json::Value::Bool(true);
        print_stdout(&format!("{value}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
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
