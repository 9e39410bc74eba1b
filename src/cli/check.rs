//! `pipecut check plan.json MODEL`: is this plan valid for this model?

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::onnx::Model;
use pipecut::plan::Plan;

use super::measured::MeasuredArgs;
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
    /// Recompute every figure of a hand-edited plan from its node assignment (the `nodes` each
    /// stage lists) and write the corrected plan, with the status `hand_edited`. Move a node
    /// between stages in the JSON, then run this once. Writes over PLAN unless --out is given.
    #[arg(long)]
    rewrite: bool,
    /// With --rewrite: write the corrected plan here instead of over PLAN.
    #[arg(long, requires = "rewrite", value_name = "PATH")]
    out: Option<PathBuf>,
    #[command(flatten)]
    measured: MeasuredArgs,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
}

/// Reads a plan file.
pub(crate) fn read_plan(path: &Path) -> anyhow::Result<Plan> {
    let text = pipecut::io::read_json_text(path, "plan")?;
    Plan::from_json(&text).with_context(|| format!("'{}'", path.display()))
}

/// Loads the model a plan was made for, with the dims bound as the plan records them.
pub(crate) fn load_for_plan(
    plan: &Plan,
    plan_path: &Path,
    path: &Path,
    measured: &MeasuredArgs,
) -> anyhow::Result<Model> {
    let model = super::load_model(path, super::Weights::NotRead)?;
    super::match_plan_model(plan, &model, plan_path)?;
    type_for_plan(plan, model, path, measured)
}

/// Types a loaded model (`path` names it in errors) with the dims the plan records. The caller
/// has matched it to the plan ([`super::match_plan_model`]): another graph may lack the dims.
pub(crate) fn type_for_plan(
    plan: &Plan,
    mut model: Model,
    path: &Path,
    measured: &MeasuredArgs,
) -> anyhow::Result<Model> {
    let mut bindings = DimBindings::new();
    for (name, value) in &plan.model.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .with_context(|| format!("'{}'", path.display()))?;
    if let Some(precision) = plan.config.dtype_override {
        model.graph.override_float_dtype(precision.dtype());
    }
    let devices = super::measured::plan_devices(plan);
    measured.apply(
        &mut model.graph,
        &model.graph_sha256,
        &plan.model.dims,
        &devices,
    )?;
    Ok(model)
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let plan = read_plan(&args.plan)?;
    let model = load_for_plan(&plan, &args.plan, &args.model, &args.measured)?;
    if args.rewrite {
        return rewrite(&args, &plan, &model);
    }
    let report = plan
        .check(model.digests(), &model.graph, &args.profiles.catalog(&[])?)
        .with_context(|| format!("'{}'", args.plan.display()))?;
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["valid"] = serde_json::Value::Bool(true);
        print_stdout(&format!("{value}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    print_stdout(&format!(
        "{}: valid plan for {} — {} on {}, every stage within memory, figures recomputed (bottleneck {:.3} ms)\n",
        args.plan.display(),
        args.model.display(),
        pipecut::onnx::inspect::count_of(report.nodes, "node"),
        pipecut::onnx::inspect::count_of(report.stages, "stage"),
        report.bottleneck_secs * 1e3
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `check --rewrite`: the plan with its figures recomputed, written where asked, then checked.
fn rewrite(args: &CheckArgs, plan: &Plan, model: &Model) -> anyhow::Result<ExitCode> {
    let catalog = args.profiles.catalog(&[])?;
    let rewritten = plan
        .rewrite(model.digests(), &model.graph, &catalog)
        .with_context(|| format!("cannot rewrite '{}'", args.plan.display()))?;
    // The rewritten plan must pass the check it was made for; anything else is a bug here.
    let report = rewritten
        .check(model.digests(), &model.graph, &catalog)
        .with_context(|| format!("the rewritten '{}' does not check", args.plan.display()))?;
    let out = args.out.as_ref().unwrap_or(&args.plan);
    let unchanged = rewritten == *plan;
    if !unchanged || args.out.is_some() {
        // Rewriting in place is the point; only the model must never be replaced.
        super::write_atomically(out, rewritten.to_json().as_bytes(), &[&args.model])?;
    }
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["valid"] = serde_json::Value::Bool(true);
        value["rewritten"] = serde_json::Value::Bool(!unchanged);
        value["out"] = serde_json::Value::String(out.display().to_string());
        print_stdout(&format!("{value}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = if unchanged {
        format!(
            "{}: every figure already matches its node assignment; {} unchanged\n",
            args.plan.display(),
            if args.out.is_some() { "copied" } else { "left" }
        )
    } else {
        format!(
            "wrote {}: every figure recomputed from the node assignment ({} on {}, bottleneck {:.3} ms); status hand_edited: not proven optimal, within {:.2}% of the lower bound\n",
            out.display(),
            pipecut::onnx::inspect::count_of(report.nodes, "node"),
            pipecut::onnx::inspect::count_of(report.stages, "stage"),
            report.bottleneck_secs * 1e3,
            rewritten.summary.gap * 100.0
        )
    };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
